"""Values from outside (a manifest, a lock, an index page, a URL, a flag) checked before any use.

Every digest that ends up in a file system path goes through :func:`sha256_hex` first; each failure
is one line naming where the value came from. Hand-written: these are our own formats' rules (a
sha256 in hex), which no library knows.
"""

from __future__ import annotations

import re

from vllm_bundle.errors import InvalidValueError, redact_urls

__all__ = ["SHA256_HEX", "InvalidValueError", "sha256_hex"]

SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def sha256_hex(value: object, where: str) -> str:
    """``value`` if it is a sha256 in 64 lowercase hex digits. A digest names files in the download
    cache, so anything else (``../x``, an absolute path, a number) is refused before it reaches the disk."""
    if isinstance(value, str) and SHA256_HEX.fullmatch(value):
        return value
    shown = redact_urls(str(value))
    raise InvalidValueError(
        f"{where} is not a sha256 (64 lowercase hex digits): {shown[:80]!r}",
        "the file was damaged or tampered with; fetch it again from its publisher",
    )
