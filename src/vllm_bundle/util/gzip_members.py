"""An archive's gzip members, compressed in parallel and written in order (release/archive.py writes the
release archive with them; install/delta.py compresses a tree it assembled again to check it against the
release's parts), and a sink that keeps only the parts' sha256.

Each member is compressed by libdeflate from an empty dictionary (no file name, mtime 0), so members
compress in parallel (``COMPRESSION_WORKERS`` threads; libdeflate lets go of the GIL) and their bytes
depend only on their content and the level: the same tree gives the same bytes on any machine with the
same libdeflate (release.json records its version: ``archive.archiver``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import deflate

#: How many threads compress: the archive's members, whose bytes do not depend on it, and an image layer's
#: one gzip stream (oci/layout.py), whose bytes do (zlib-ng's threaded writer carries each worker's deflate
#: state from block to block), so it is fixed, not taken from the machine: a 2-core laptop and a 64-core
#: runner write the same bytes.
COMPRESSION_WORKERS = 8


def compressor() -> dict[str, str]:
    """What compresses each member (release.json's ``archive.archiver`` holds it and more): libdeflate's
    output may differ between versions of it, so members are the same bytes only under the same one."""
    return {"library": "libdeflate", "deflate": importlib.metadata.version("deflate"), "members": "chunked"}


class Sink(Protocol):
    """Where an archive's bytes go: its part files (release/archive.py ``PartWriter``), or only their
    hashes (:class:`PartDigests`)."""

    total: int

    def write(self, data: bytes) -> int: ...


def _pack(data: bytes, chunks: Sequence[tuple[int, int]], level: int) -> tuple[bytes, list[str]]:
    """One member: ``data`` as a gzip member of its own (libdeflate: no name, mtime 0), and the sha256 of
    each chunk (inner offset, size) it holds. Run by a worker thread; libdeflate and hashlib let go of the
    GIL."""
    view = memoryview(data)  # slices without copies
    digests = [hashlib.sha256(view[start : start + size]).hexdigest() for start, size in chunks]
    return bytes(deflate.gzip_compress(data, level)), digests


class Members:
    """Gzip members compressed by worker threads and written to ``out`` in the order they were given,
    with at most two per worker waiting (memory stays flat in the archive's size)."""

    def __init__(self, out: Sink, level: int) -> None:
        self._out, self._level = out, level
        self._pool = ThreadPoolExecutor(COMPRESSION_WORKERS, thread_name_prefix="archive")
        self._waiting: deque[tuple[int, Future[tuple[bytes, list[str]]]]] = deque()
        self.spans: list[tuple[int, int, int]] = []  # per member written: offset, compressed, uncompressed size
        self.digests: list[list[str]] = []  # per member written: its chunks' sha256
        self.given = 0

    def add(self, data: bytes, chunks: Sequence[tuple[int, int]] = ()) -> None:
        self._waiting.append((len(data), self._pool.submit(_pack, data, chunks, self._level)))
        self.given += 1
        while len(self._waiting) > 2 * COMPRESSION_WORKERS:
            self._write_oldest()

    def _write_oldest(self) -> None:
        size, future = self._waiting.popleft()
        member, digests = future.result()
        self.spans.append((self._out.total, len(member), size))
        self.digests.append(digests)
        self._out.write(member)

    def finish(self) -> None:
        while self._waiting:
            self._write_oldest()
        self._pool.shutdown()

    def abandon(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class PartDigests:
    """An archive's bytes hashed, not kept: cut where a release's parts are cut (``sizes``), each part's
    sha256 and the whole's."""

    sizes: Sequence[int]
    parts: list[str] = field(default_factory=list)  # the sha256 of each part once it is whole
    whole: hashlib._Hash = field(default_factory=hashlib.sha256)
    total: int = 0
    _hash: hashlib._Hash = field(default_factory=hashlib.sha256)
    _written: int = 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            whole_parts = len(self.parts) < len(self.sizes)
            piece = view[: self.sizes[len(self.parts)] - self._written] if whole_parts else view
            self._hash.update(piece)
            self.whole.update(piece)
            self._written += len(piece)
            self.total += len(piece)
            view = view[len(piece) :]
            if whole_parts and self._written == self.sizes[len(self.parts)]:
                self.parts.append(self._hash.hexdigest())
                self._hash, self._written = hashlib.sha256(), 0
        return len(data)

    def finish(self) -> list[str]:
        """Each part's sha256; an archive that ends inside a part, or goes on after the last, gets one
        more (of what came since the last whole part): it cannot be the release's."""
        if self._written:
            self.parts.append(self._hash.hexdigest())
            self._hash, self._written = hashlib.sha256(), 0
        return self.parts
