"""The download cache: content-addressed by sha256, shared safely between concurrent builds.

Layout under the cache root::

    blobs/sha256/ab/ab12...   verified bytes, named by their hash (written only after verification)
    partial/ab12....part      an interrupted download, resumed by the next fetch
    partial/ab12....meta      the URL and HTTP validator (ETag) the partial came from
    locks/ab12....lock        held while one process downloads that blob
"""

from __future__ import annotations

import os
from pathlib import Path

from filelock import FileLock
from platformdirs import user_cache_dir

CACHE_ENV = "VLLM_BUNDLE_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$VLLM_BUNDLE_CACHE_DIR``, else the user cache dir (``~/.cache/vllm-bundle`` on Linux)."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path(user_cache_dir("vllm-bundle", appauthor=False))


class Cache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def blob(self, sha256: str) -> Path:
        return self.root / "blobs" / "sha256" / sha256[:2] / sha256

    def partial(self, sha256: str) -> Path:
        return self.root / "partial" / f"{sha256}.part"

    def partial_meta(self, sha256: str) -> Path:
        return self.root / "partial" / f"{sha256}.meta"

    def lock(self, sha256: str) -> FileLock:
        path = self.root / "locks" / f"{sha256}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(path)

    def has(self, sha256: str, size: int | None) -> bool:
        """A blob is present when its file exists with the pinned size (bytes were hashed on entry)."""
        path = self.blob(sha256)
        try:
            actual = path.stat().st_size
        except FileNotFoundError:
            return False
        return size is None or actual == size

    def commit(self, partial: Path, sha256: str) -> Path:
        """Move verified bytes into place atomically (fsync first, so a crash cannot leave a torn blob)."""
        final = self.blob(sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("rb") as handle:
            os.fsync(handle.fileno())
        partial.replace(final)
        self.partial_meta(sha256).unlink(missing_ok=True)
        return final

    def discard_partial(self, sha256: str) -> None:
        self.partial(sha256).unlink(missing_ok=True)
        self.partial_meta(sha256).unlink(missing_ok=True)
