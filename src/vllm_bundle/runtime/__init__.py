"""Code that ships inside every bundle, as ``site-packages/_vllm_bundle_runtime`` (the root stage copies
these files verbatim), and runs under the bundle's own Python when ``bin/vllm-server`` starts.

Standard library only, and no import from the rest of ``vllm_bundle``: the bundle has neither. The
build tool imports the same modules (``vllm-bundle doctor`` reads the GPU through :mod:`.amdgpu`), so
one reading of the host serves both.
"""

#: The package name inside a bundle's site-packages.
PACKAGE = "_vllm_bundle_runtime"
