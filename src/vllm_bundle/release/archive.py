"""The release archive: one deterministic gzip tarball of the bundle root, written straight into
parts of at most ``part_size`` bytes, and at most 99 of them (two-digit names): a part size the tree
alone shows too small is refused before any part is written, any other before part 100 is opened, and
the parts written so far are removed. Beside it, a table of contents (TOC) that says where each file's
chunks are, so an update can fetch only the chunks it does not have (#34).

Determinism: the tar stream of :mod:`vllm_bundle.util.tarstream` (sorted entries, one fixed mtime, modes
from the exec bit, hard links by inode, PAX headers). Its sha256 before compression (``tar_sha256``) is
what an update checks the tree it assembled against (install/delta.py).

Chunked gzip: the tar stream is written as a series of independent gzip members (RFC 1952 2.2: gzip and
GNU tar read them as one stream). Each regular file's data is cut into content-defined chunks (FastCDC,
about 64 KiB); a member ends at the first chunk end at or after :data:`MEMBER_SIZE` uncompressed bytes,
and before a file at least that large. Each member is compressed alone by libdeflate
(:mod:`vllm_bundle.util.gzip_members`), so their bytes depend only on their content: the same tree gives
the same bytes on any machine. (A single deflate stream was #34's "today"; members at 256 KiB with libdeflate are 2.6 %
smaller than it at level 6 on a real site-packages, and faster.)
The TOC (``ChunkedTar.toc``) says where each file's chunks are: its format is :mod:`vllm_bundle.toc`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import signal
import stat
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

from fastcdc.fastcdc_cy import fastcdc_cy  # type: ignore[import-untyped]
from zlib_ng import zlib_ng as zlib_ng_core

from vllm_bundle.errors import ArchiveError
from vllm_bundle.manifests import DEFAULT_LEVEL, DEFAULT_PART_SIZE, MAX_PARTS, part_name
from vllm_bundle.toc import Member, WrittenChunk, WrittenEntry, document, written_entry
from vllm_bundle.util.gzip_members import Members, compressor
from vllm_bundle.util.tarstream import end_of_archive, header, padding, tar_entry, tree_entries

#: Deflate's greatest compression ratio (zlib's FAQ, "the limit is 1032:1"): an archive is never
#: smaller than its tar stream divided by it, so a part size too small for 99 parts is known up front.
DEFLATE_MAX_RATIO = 1032
#: FastCDC's chunk sizes, part of the archive format (they decide where members end): the unit an update
#: re-uses. About 64 KiB: between vLLM 0.32.0's and 0.33.0's real wheels 25 % of such chunks are new (#34).
CHUNK_MIN, CHUNK_AVG, CHUNK_MAX = 16 << 10, 64 << 10, 256 << 10
CHUNK_WINDOW = 4 << 20  # how much of a file is read at a time to be chunked
#: Uncompressed bytes after which a member ends (at the next chunk end), and the size from which a file
#: starts a member of its own: the unit an update fetches. Each member starts from an empty dictionary: on
#: a real site-packages (429 MB, zlib-ng), one member per chunk made the archive 3.8 % larger than one gzip
#: stream, members of 256 KiB 1.2 %; with libdeflate, members of 256 KiB are 2.6 % smaller than that stream.
MEMBER_SIZE = 256 << 10


def archiver() -> dict[str, str | int]:
    """What writes the archive's bytes: gzip output may differ between versions of libdeflate (the
    ``deflate`` package carries it), and chunks are where FastCDC cuts them, so release.json records both,
    and the release stage is redone when they change."""
    return {
        **compressor(),
        "fastcdc": importlib.metadata.version("fastcdc"),
        "chunk": f"{CHUNK_MIN}/{CHUNK_AVG}/{CHUNK_MAX}",
        "member_size": MEMBER_SIZE,
    }


@dataclass
class Part:
    path: Path
    size: int
    sha256: str


@dataclass
class PartWriter:
    """A write-only stream that cuts what it is given into numbered part files."""

    directory: Path
    stem: str  # "<tag>-x64"
    part_size: int
    parts: list[Part] = field(default_factory=list)
    whole: hashlib._Hash = field(default_factory=hashlib.sha256)
    total: int = 0
    _handle: BinaryIO | None = None
    _hash: hashlib._Hash | None = None
    _written: int = 0

    def __post_init__(self) -> None:
        # A part size below one byte never fills a part: write() would open empty parts forever.
        if isinstance(self.part_size, bool) or not isinstance(self.part_size, int) or self.part_size < 1:
            raise ArchiveError(
                f"part size {self.part_size!r} is not a whole number of bytes above 0", "pass --part-size N"
            )

    def _open_next(self) -> None:
        self._close_current()
        path = self.directory / f".{self.stem}.part{len(self.parts) + 1:02d}.tmp"
        self._handle, self._hash, self._written = path.open("wb"), hashlib.sha256(), 0
        self.parts.append(Part(path, 0, ""))

    def _close_current(self) -> None:
        if self._handle is not None and self._hash is not None:
            self._handle.close()
            self.parts[-1].size, self.parts[-1].sha256 = self._written, self._hash.hexdigest()
            self._handle = None

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self._handle is None or self._written == self.part_size:
                if len(self.parts) >= MAX_PARTS:  # checked before part 100 is opened, not after the last
                    raise ArchiveError(
                        f"the archive needs more than {MAX_PARTS} parts of {self.part_size} bytes; "
                        f"part names allow {MAX_PARTS}",
                        f"raise --part-size: {MAX_PARTS} parts held {self.total} bytes and the archive went on",
                    )
                self._open_next()
            assert self._handle is not None and self._hash is not None
            chunk = view[: self.part_size - self._written]
            self._handle.write(chunk)
            self._hash.update(chunk)
            self.whole.update(chunk)
            self._written += len(chunk)
            self.total += len(chunk)
            view = view[len(chunk) :]
        return len(data)

    def flush(self) -> None:
        if self._handle is not None:
            self._handle.flush()

    def finish(self) -> list[Part]:
        """Close and give the parts their final names ``<stem>.partNN-of-MM.tar.gz``."""
        self._close_current()
        count = len(self.parts)
        for number, part in enumerate(self.parts, start=1):
            final = self.directory / part_name(self.stem, number, count)
            part.path.replace(final)
            part.path = final
        return self.parts

    def discard(self) -> None:
        if self._handle is not None:
            self._handle.close()
        for part in self.parts:
            part.path.unlink(missing_ok=True)


def least_archive_size(root: Path) -> int:
    """No more bytes than the archive of ``root`` has: its tar stream holds a 512-byte header per
    entry, each inode's data once (a second name is a hard link) and 1024 bytes of end, and deflate
    shrinks that at most :data:`DEFLATE_MAX_RATIO` times."""
    stream, seen = 1024, set()
    for _, path in tree_entries(root):
        info = path.lstat()
        stream += 512
        if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            stream += info.st_size
    return stream // DEFLATE_MAX_RATIO


@contextmanager
def interrupt_between_reads() -> Iterator[threading.Event]:
    """Ctrl-C sets a flag instead of raising wherever the main thread is: inside zlib-ng's threaded writer
    (an image layer), closing it would deadlock; inside a wait on the archive's workers, they would run
    on. The loop raises KeyboardInterrupt at its next read of a source file, where the writer is idle, and
    what was written so far is discarded."""
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


class InterruptibleReader:
    """A source file for tarfile that raises KeyboardInterrupt at a read once Ctrl-C was pressed."""

    def __init__(self, handle: BinaryIO, interrupted: threading.Event) -> None:
        self._handle, self._interrupted = handle, interrupted

    def read(self, size: int = -1) -> bytes:
        if self._interrupted.is_set():
            raise KeyboardInterrupt
        return self._handle.read(size)


def add_entry(tar: tarfile.TarFile, info: tarfile.TarInfo, path: Path, interrupted: threading.Event) -> None:
    """Write one entry through tarfile (an image layer's), a regular file's bytes streamed from ``path``,
    stopping between reads on ^C."""
    if info.isreg():
        with path.open("rb") as handle:
            tar.addfile(info, InterruptibleReader(handle, interrupted))
    else:
        tar.addfile(info)


def _changed(path: Path) -> ArchiveError:
    return ArchiveError(f"{path} changed while it was archived", "do not change the tree while a release is made")


def file_chunks(path: Path, size: int, interrupted: threading.Event) -> Iterator[bytes]:
    """``path``'s ``size`` bytes in FastCDC's chunks, read a window at a time (memory stays flat in the
    file's size). FastCDC decides a cut from the chunk's start and at most :data:`CHUNK_MAX` bytes after
    it, so a chunk found with that much of the window after its start (or the file's end inside the
    window) is the chunk the whole file would give; the rest is chunked again with the next window.
    KeyboardInterrupt between windows once Ctrl-C was pressed."""
    buffer, left = b"", size
    with path.open("rb") as handle:
        if size <= CHUNK_MIN:  # FastCDC never cuts before CHUNK_MIN: the file is one chunk
            data = handle.read(size + 1)
            if len(data) != size:
                raise _changed(path)
            yield from [data] if data else []
            return
        while left or buffer:
            if interrupted.is_set():
                raise KeyboardInterrupt
            data = handle.read(min(left, CHUNK_WINDOW))
            if len(data) != min(left, CHUNK_WINDOW) or (len(data) == left and handle.read(1)):
                raise _changed(path)
            buffer, left = buffer + data, left - len(data)
            used = 0
            for chunk in fastcdc_cy(buffer, CHUNK_MIN, CHUNK_AVG, CHUNK_MAX):
                if left and chunk.offset + CHUNK_MAX > len(buffer):
                    break
                used = chunk.offset + chunk.length
                yield buffer[chunk.offset : used]
            buffer = buffer[used:]


class ChunkedTar:
    """The tar stream of the archive, cut into members (see the module's docstring), and its TOC. What the
    TOC needs is kept as tuples (a real bundle has about 100,000 files and as many chunks) and made into
    its JSON entries one at a time at the end."""

    def __init__(self, members: Members) -> None:
        self._members = members
        self._pending = bytearray()  # the member being filled
        self._chunks: list[tuple[int, int]] = []  # its chunks: inner offset, size
        self._offset = 0  # bytes of the tar stream so far
        self.stream = hashlib.sha256()  # of the tar stream so far
        self._entries: list[WrittenEntry] = []
        self._chunk_rows: list[WrittenChunk] = []  # in the order of the archive

    def _cut(self) -> None:
        if self._pending:
            self._members.add(bytes(self._pending), self._chunks)
            self._pending, self._chunks = bytearray(), []

    def _append(self, data: bytes) -> None:
        self._pending += data
        self.stream.update(data)
        self._offset += len(data)

    def add(self, info: tarfile.TarInfo, path: Path, interrupted: threading.Event) -> None:
        """One entry: its header, and a regular file's data in chunks, then the padding to a block."""
        if info.isreg() and info.size >= MEMBER_SIZE:
            self._cut()
        self._append(header(info))
        first = len(self._chunk_rows)
        if info.isreg():
            self._add_data(path, info.size, interrupted)
            self._append(padding(info.size))
        self._entries.append(written_entry(info, first, len(self._chunk_rows) - first))
        if len(self._pending) >= MEMBER_SIZE:
            self._cut()

    def _add_data(self, path: Path, size: int, interrupted: threading.Event) -> None:
        """The file's chunks; a member ends between two chunks once it holds MEMBER_SIZE bytes."""
        at = 0
        for data in file_chunks(path, size, interrupted):
            if at and len(self._pending) >= MEMBER_SIZE:
                self._cut()
            self._chunk_rows.append(WrittenChunk(self._members.given, len(self._pending), at, len(data)))
            self._chunks.append((len(self._pending), len(data)))
            self._append(data)
            at += len(data)

    def close(self) -> None:
        """The end-of-archive blocks and the padding to a whole record, as tarfile writes them."""
        self._append(end_of_archive(self._offset))
        self._cut()

    def toc(self) -> bytes:
        """The TOC's bytes (:func:`vllm_bundle.toc.document`, once every member is written: their offsets
        and chunk digests are known then), compressed as it is made (zlib-ng's gzip at level 9: mtime 0,
        no name; its version is pinned exactly)."""
        digests = [digest for member in self._members.digests for digest in member]  # in chunk order
        members = [Member(*span) for span in self._members.spans]
        compressor = zlib_ng_core.compressobj(9, zlib_ng_core.DEFLATED, 31)
        out = [compressor.compress(piece) for piece in document(self._entries, self._chunk_rows, digests, members)]
        out.append(compressor.flush())
        return b"".join(out)


class Archive(NamedTuple):
    parts: list[Part]
    size: int  # of the whole archive
    sha256: str  # of the whole archive
    toc: bytes  # ChunkedTar.toc's bytes
    tar_sha256: str  # of the tar stream the archive inflates to (util/tarstream.py stream_sha256)


def write_archive(
    root: Path,
    out_dir: Path,
    stem: str,
    *,
    part_size: int = DEFAULT_PART_SIZE,
    level: int = DEFAULT_LEVEL,
) -> Archive:
    """Archive ``root`` into parts in ``out_dir``; returns the parts, the whole archive's size and sha256,
    its TOC and its tar stream's sha256."""
    if out_dir.resolve().is_relative_to(root.resolve()):
        raise ArchiveError(
            f"the archive's folder {out_dir} is inside the tree it archives, {root} (it would hold its own parts, "
            "and the next archive this release)",
            "pass a --bundles-dir outside the build directory's target folders",
        )
    writer = PartWriter(out_dir, stem, part_size)
    least = least_archive_size(root)
    if least > MAX_PARTS * part_size:  # known before a part is written (--part-size 1 wrote 883,688 of them)
        raise ArchiveError(
            f"--part-size {part_size} is too small for {root}: its archive is at least {least} bytes (deflate "
            f"shrinks at most {DEFLATE_MAX_RATIO}:1), more than {MAX_PARTS} parts of {part_size} bytes",
            f"pass --part-size of at least {-(-least // MAX_PARTS)}; the default is {DEFAULT_PART_SIZE}",
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    seen: dict[tuple[int, int], str] = {}
    members = Members(writer, level)
    tar = ChunkedTar(members)
    try:
        with interrupt_between_reads() as interrupted:
            for name, path in tree_entries(root):
                if interrupted.is_set():
                    raise KeyboardInterrupt
                tar.add(tar_entry(name, path, root, seen), path, interrupted)
            tar.close()
            members.finish()
        parts = writer.finish()
    except BaseException:
        members.abandon()
        writer.discard()
        raise
    return Archive(parts, writer.total, writer.whole.hexdigest(), tar.toc(), tar.stream.hexdigest())
