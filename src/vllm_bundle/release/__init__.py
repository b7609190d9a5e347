"""Step 4, the release assets of a finished tree: versioned tarball parts (``archive``), checksums,
manifests and the pin manifest (``assets``), and the SBOM (``sbom``)."""
