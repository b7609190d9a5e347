"""The release archive: one deterministic gzip tarball of the bundle root, written straight into
parts of at most ``part_size`` bytes, and at most 99 of them (two-digit names): a part size the tree
alone shows too small is refused before any part is written, any other before part 100 is opened, and
the parts written so far are removed.

Determinism: entries ``./...`` in sorted order; mtime clamped to the source date; uid/gid 0 with empty
owner names; modes 0755/0644 from the owner's exec bit (directories 0755); symlinks kept (they must
stay inside the tree); a second name of an inode is recorded as a hard link to the first name in
sorted order; the gzip header has no file name and mtime 0. Compression runs in parallel with
zlib-ng's threaded gzip writer; its output is a function of its worker count (each worker's deflate
state carries over from block to block), so the count is fixed (``COMPRESSION_WORKERS``), not taken
from the machine: a 2-core laptop and a 64-core runner write the same bytes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import posixpath
import signal
import stat
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from zlib_ng import gzip_ng_threaded
from zlib_ng import zlib_ng as zlib_ng_core

from vllm_bundle.errors import ArchiveError
from vllm_bundle.manifests import DEFAULT_LEVEL, DEFAULT_PART_SIZE, MAX_PARTS, part_name
from vllm_bundle.util.tarstream import StreamTar

#: Part of the archive format: changing it changes every archive's bytes. Eight workers saturate
#: the single-threaded tar writer that feeds them; on fewer cores they cost nothing measurable.
COMPRESSION_WORKERS = 8
#: Deflate's greatest compression ratio (zlib's FAQ, "the limit is 1032:1"): an archive is never
#: smaller than its tar stream divided by it, so a part size too small for 99 parts is known up front.
DEFLATE_MAX_RATIO = 1032


def archiver() -> dict[str, str | int]:
    """What writes the archive's bytes: gzip output differs between zlib-ng versions (zlib-ng#1751),
    so release.json records them, and the release stage is redone when they change."""
    return {
        "library": "zlib-ng",
        "zlib-ng": str(zlib_ng_core.ZLIBNG_VERSION),
        "python-zlib-ng": importlib.metadata.version("zlib-ng"),
        "workers": COMPRESSION_WORKERS,
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


def tree_entries(root: Path) -> Iterator[tuple[str, Path]]:
    """``(archive name, path)`` for the root and everything under it, sorted by archive name."""
    names = [("./", root)]
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(dirpath, name)
            names.append(("./" + path.relative_to(root).as_posix(), path))
    yield from sorted(names, key=lambda item: item[0])


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


def tar_entry(name: str, path: Path, root: Path, source_date: int, seen: dict[tuple[int, int], str]) -> tarfile.TarInfo:
    stat = path.lstat()
    info = tarfile.TarInfo(name.rstrip("/") if name != "./" else ".")
    info.mtime, info.uid, info.gid, info.uname, info.gname = source_date, 0, 0, "", ""
    if path.is_symlink():
        target = str(path.readlink())
        inside = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        if target.startswith("/") or inside == ".." or inside.startswith("../"):
            raise ArchiveError(
                f"{path.relative_to(root)} is a symlink leaving the bundle (-> {target})",
                "make it relative and inside the tree",
            )
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    elif path.is_dir():
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif path.is_file():
        info.mode = 0o755 if stat.st_mode & 0o100 else 0o644
        key = (stat.st_dev, stat.st_ino)
        if stat.st_nlink > 1 and key in seen:
            info.type, info.linkname = tarfile.LNKTYPE, seen[key]
        else:
            seen[key] = info.name
            info.size = stat.st_size
    else:
        raise ArchiveError(
            f"{path.relative_to(root)} is neither a file, a directory nor a symlink", "remove it from the bundle"
        )
    return info


@contextmanager
def interrupt_between_reads() -> Iterator[threading.Event]:
    """Ctrl-C sets a flag instead of raising wherever the main thread is: interrupted inside zlib-ng's
    threaded writer, closing it deadlocks. The archive loop raises KeyboardInterrupt at its next read
    of a source file, where the writer is idle, and the parts written so far are discarded."""
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
    """Write one entry, a regular file's bytes streamed from ``path``, stopping between reads on ^C."""
    if info.isreg():
        with path.open("rb") as handle:
            tar.addfile(info, InterruptibleReader(handle, interrupted))
    else:
        tar.addfile(info)


def write_archive(
    root: Path,
    out_dir: Path,
    stem: str,
    source_date: int,
    *,
    part_size: int = DEFAULT_PART_SIZE,
    level: int = DEFAULT_LEVEL,
) -> tuple[list[Part], int, str]:
    """Archive ``root`` into parts in ``out_dir``; returns (parts, whole size, whole sha256)."""
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
    try:
        with (
            interrupt_between_reads() as interrupted,
            gzip_ng_threaded.open(writer, "wb", compresslevel=level, threads=COMPRESSION_WORKERS) as gz,  # type: ignore[no-untyped-call]
            StreamTar.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name, path in tree_entries(root):
                if interrupted.is_set():
                    raise KeyboardInterrupt
                add_entry(tar, tar_entry(name, path, root, source_date, seen), path, interrupted)
        parts = writer.finish()
    except BaseException:
        writer.discard()
        raise
    return parts, writer.total, writer.whole.hexdigest()
