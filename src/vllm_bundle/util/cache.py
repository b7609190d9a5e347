"""The download cache: content-addressed by sha256, shared safely between concurrent builds.

Layout under the cache root::

    blobs/sha256/ab/ab12...   verified bytes, named by their hash (written only after verification)
    partial/ab12....part      an interrupted download, resumed by the next fetch
    partial/ab12....meta      the URL and HTTP validator (ETag) the partial came from
    locks/ab12....lock        held while one process downloads that blob

Every key is checked to be a sha256 in hex before it names a file (a digest from a manifest could
otherwise be ``../../somewhere``), and an entry that is a symbolic link is refused (a cache restored
from elsewhere could point one at a user's file, which a download would then write through).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock
from platformdirs import user_cache_dir

from vllm_bundle.errors import CorruptCacheError
from vllm_bundle.util.validate import sha256_hex

CACHE_ENV = "VLLM_BUNDLE_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$VLLM_BUNDLE_CACHE_DIR``, else the user cache dir (``~/.cache/vllm-bundle`` on Linux)."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path(user_cache_dir("vllm-bundle", appauthor=False))


def open_for_writing(path: Path, *, append: bool = False, buffering: int = -1) -> BinaryIO:
    """A cache file opened for writing without following a symbolic link at its name (``O_NOFOLLOW``:
    a link planted there fails with ELOOP instead of sending our bytes to the file it points at)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        raise CorruptCacheError(
            f"the download cache entry {path} is a symbolic link; the cache does not write through links",
            "remove it (or the whole cache) and run again",
        ) from None
    return os.fdopen(fd, "ab" if append else "wb", buffering=buffering)


class Cache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _entry(self, sha256: str, *parts: str) -> Path:
        """The cache path ``parts`` under the root, for a key checked to be a digest; refused when the
        entry or a folder of the cache on the way to it is a symbolic link."""
        sha256_hex(sha256, "a download cache key")
        path = self.root.joinpath(*parts)
        for item in (path, *path.parents):
            if item == self.root:
                break
            if item.is_symlink():
                raise CorruptCacheError(
                    f"the download cache entry {item} is a symbolic link; the cache does not write through links",
                    "remove it (or the whole cache) and run again",
                )
        return path

    def blob(self, sha256: str) -> Path:
        return self._entry(sha256, "blobs", "sha256", sha256[:2], sha256)

    def partial(self, sha256: str) -> Path:
        return self._entry(sha256, "partial", f"{sha256}.part")

    def partial_meta(self, sha256: str) -> Path:
        return self._entry(sha256, "partial", f"{sha256}.meta")

    def lock(self, sha256: str) -> FileLock:
        path = self._entry(sha256, "locks", f"{sha256}.lock")
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
