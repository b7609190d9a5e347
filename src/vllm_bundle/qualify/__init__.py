"""Step 5, proof that a bundle is fit to ship: static tier 0 (``tier0``), the GPU tiers on a hardware
runner (``gpu``), and byte-identical rebuilds (``repro``)."""
