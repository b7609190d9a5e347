"""The download cache: content-addressed by sha256, shared safely between concurrent builds.

Layout under the cache root::

    blobs/sha256/ab/ab12...   verified bytes, named by their hash (written only after verification)
    partial/ab12....part      an interrupted download, resumed by the next fetch
    partial/ab12....meta      the URL and HTTP validator (ETag) the partial came from
    locks/ab12....lock        held while one process downloads that blob
    lock-xxxxxxxx/            a running lock's scratch and uv's cache, removed when that lock ends

Every key is checked to be a sha256 in hex before it names a file (a digest from a manifest could
otherwise be ``../../somewhere``), and an entry that is a symbolic link is refused (a cache restored
from elsewhere could point one at a user's file, which a download would then write through).

Bytes enter the cache through :class:`Cache` only: :meth:`Cache.open_partial` (and the partial's meta
file), :meth:`Cache.commit` once they are verified, or :meth:`Cache.store` for small bytes at once; a
full disk on the way removes the partial file (:meth:`Cache.disk_full`). Only the fetcher resumes a
partial file or reports progress.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock

from vllm_bundle.errors import CorruptCacheError
from vllm_bundle.util.fsutil import raising_disk_full
from vllm_bundle.util.validate import sha256_hex


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

    def chunk(self, sha256: str) -> Path:
        """A chunk a delta install fetched and checked (install/delta.py), under its sha256."""
        return self._entry(sha256, "chunks", sha256[:2], sha256)

    def rootfs(self, sha256: str) -> Path:
        """An image's root file system, unpacked by the builder stage (tree/builder.py), under the sha256 of
        the image's manifest: one for every build that uses that image."""
        return self._entry(sha256, "rootfs", sha256)

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

    def open_partial(self, key: str, *, append: bool = False, buffering: int = -1) -> BinaryIO:
        """The partial file of ``key`` opened for writing (its folder made, never through a link): where
        bytes wait until they are verified and committed."""
        path = self.partial(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return open_for_writing(path, append=append, buffering=buffering)

    def write_partial_meta(self, key: str, meta: Mapping[str, object]) -> None:
        """What the partial file of ``key`` came from (the URL and its validator), for a resume."""
        path = self.partial_meta(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open_for_writing(path) as handle:
            handle.write(json.dumps(meta).encode())

    def commit(self, key: str, sha256: str | None = None) -> Path:
        """Move the verified partial file of ``key`` into place as the blob ``sha256`` (by default ``key``),
        atomically (fsync first, so a crash cannot leave a torn blob)."""
        partial, final = self.partial(key), self.blob(sha256 or key)
        final.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("rb") as handle:
            os.fsync(handle.fileno())
        partial.replace(final)
        self.partial_meta(key).unlink(missing_ok=True)
        return final

    def store(self, data: bytes, what: str) -> Path:
        """Small bytes (a manifest) in the cache under their own sha256, written unless present."""
        sha256 = hashlib.sha256(data).hexdigest()
        with self.lock(sha256):
            if not self.has(sha256, len(data)):
                with self.disk_full(sha256, what):
                    with self.open_partial(sha256) as handle:
                        handle.write(data)
                    self.commit(sha256)
        return self.blob(sha256)

    def disk_full(self, key: str, what: str) -> AbstractContextManager[None]:
        """A full disk while writing ``key`` (``what``, in the message) removes its partial file and is one line."""
        return raising_disk_full(
            f"disk full while downloading {what} into {self.root}; the partial file was removed",
            "free some space or point --cache-dir / $VLLM_BUNDLE_CACHE_DIR at a larger disk",
            cleanup=lambda: self.discard_partial(key),
        )

    def discard_partial(self, sha256: str) -> None:
        self.partial(sha256).unlink(missing_ok=True)
        self.partial_meta(sha256).unlink(missing_ok=True)
