"""Safe extraction: the one function that unpacks every tarball the tool opens (python-build-standalone's
CPython, vLLM's source release, a release's parts, the lock step's requirement files).

tarfile's ``data`` filter is not enough: it checks names *before* a top directory is stripped, and its
``realpath()`` check can be outrun by links whose expansion overflows PATH_MAX (CVE-2025-4517, fixed in
Python 3.11.13/3.12.11 only). So the checks here look at the archive alone, by name, and hold whatever
the interpreter's patch level:

- every entry's final name (after the top directory is stripped) is relative, without ``..``, and
  never passes through a symlink of the archive;
- only regular files, directories, symlinks and hard links; device nodes, FIFOs, setuid and setgid
  entries are refused, not silently fixed;
- a hard link names a regular file extracted before it;
- a symlink is relative and, followed component by component from its own directory, stays inside
  the destination and never passes through another symlink (the last component may be one: it is
  checked the same way), so what it points to on disk is what its text says.

Files and directories are written first and symlinks last, so nothing is ever written through a link.
Written by hand because no maintained library extracts with these guarantees (tarfile's filters are
the standard library's own attempt; see above).
"""

from __future__ import annotations

import os
import posixpath
import stat
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, runtime_checkable

from vllm_bundle.errors import UnsafeArchiveError
from vllm_bundle.util.fsutil import raising_disk_full

CHUNK = 1 << 20


class Entries(Protocol):
    """What safe extraction reads: a tar archive (``tarfile.TarFile``), or anything that gives entries as
    tar entries and each file's bytes (a delta install's table of contents, install/delta.py)."""

    def __iter__(self) -> Iterator[tarfile.TarInfo]: ...

    def extractfile(self, member: tarfile.TarInfo) -> FileData | None: ...


class FileData(Protocol):
    """A file's bytes, read until ``b""``."""

    def read(self, size: int = -1, /) -> bytes: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, kind: Any, value: Any, traceback: Any, /) -> Any: ...


@runtime_checkable
class Linkable(Protocol):
    """A file's bytes that may already be on disk as the entry needs them (a delta install's file that
    did not change since the previous install, install/delta.py): ``link_into`` makes ``path`` a hard link
    to it and says True, or leaves nothing at ``path`` and says False (the bytes are then read)."""

    def link_into(self, path: Path, member: tarfile.TarInfo) -> bool: ...


class EntryRefused(Exception):
    """Why one entry is refused (turned by :func:`unpack_error` into an UnsafeArchiveError naming the
    archive); util/layers.py refuses an image layer's entries with it too."""

    def __init__(self, why: str, entry: str | None = None) -> None:
        super().__init__(why)
        self.entry = entry


#: What unpacking an archive can raise that :func:`unpack_error` turns into one line.
UNPACK_ERRORS = (EntryRefused, OSError, tarfile.TarError, EOFError, ValueError)


def unpack_error(
    err: Exception, verb: str, source: str, member: tarfile.TarInfo | None, kind: str = "archive"
) -> UnsafeArchiveError:
    """The one-line error for ``err`` (one of :data:`UNPACK_ERRORS`), raised while ``verb``-ing
    ``source`` (an archive, or an image's layer: ``kind``) at entry ``member`` (None once past the entries)."""
    if isinstance(err, EntryRefused):
        name = err.entry or (member.name if member is not None else None)
        entry = f"entry {name!r}" if name else "an entry"
        return UnsafeArchiveError(
            f"refusing to {verb} {source}: {entry} {err}", f"this {kind} is not what the tool expects: do not use it"
        )
    if isinstance(err, OSError):
        return UnsafeArchiveError(f"cannot {verb} {source}: {err.strerror or err}", "fetch it again")
    return UnsafeArchiveError(f"cannot {verb} {source}: {err}", "it is damaged: fetch it again")


def relative_parts(name: str) -> list[str]:
    """``name``'s components without ``.``; refused when absolute or holding ``..``."""
    if name.startswith("/"):
        raise EntryRefused("has an absolute path")
    parts = [part for part in PurePosixPath(name).parts if part != "."]
    if ".." in parts:
        raise EntryRefused("has a '..' component")
    return parts


def _final_name(member: tarfile.TarInfo, top: str | None) -> str | None:
    """The entry's path inside the destination ("" for the destination itself), or None to skip it."""
    if member.name.startswith("\\"):
        raise EntryRefused("has an absolute path")
    parts = relative_parts(member.name)
    if top is not None:
        if not parts or parts[0] != top:
            raise EntryRefused(f"is outside the {top}/ directory")
        parts = parts[1:]
    return "/".join(parts)


def _check_kind(member: tarfile.TarInfo) -> None:
    if member.ischr() or member.isblk():
        raise EntryRefused("is a device node")
    if member.isfifo():
        raise EntryRefused("is a FIFO")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise EntryRefused("is not a file, directory or link")
    if member.mode & stat.S_ISUID:
        raise EntryRefused("is setuid")
    if member.mode & stat.S_ISGID:
        raise EntryRefused("is setgid")


def _walk_link(name: str, linkname: str, symlinks: dict[str, str]) -> None:
    """Follow a symlink's text from its directory: it must stay inside and never cross another link."""
    if linkname.startswith("/"):
        raise EntryRefused(f"is a symlink to an absolute path (-> {linkname})")
    stack = [part for part in posixpath.dirname(name).split("/") if part]
    pieces = [part for part in linkname.split("/") if part and part != "."]
    for index, piece in enumerate(pieces):
        if piece == "..":
            if not stack:
                raise EntryRefused(f"is a symlink leaving the tree (-> {linkname})")
            stack.pop()
            continue
        stack.append(piece)
        if "/".join(stack) in symlinks and index < len(pieces) - 1:
            raise EntryRefused(f"is a symlink through another symlink (-> {linkname})")


class _Extraction:
    """The state of one extraction: what was written, and the symlinks still to make."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.kinds: dict[str, str] = {"": "dir"}  # final name -> "file" | "dir" | "link"
        self.symlinks: dict[str, str] = {}

    def _parent_ok(self, name: str) -> None:
        parent = posixpath.dirname(name)
        while parent:
            kind = self.kinds.get(parent)
            if kind not in (None, "dir"):
                raise EntryRefused(f"is inside {parent}, which is not a directory")
            parent = posixpath.dirname(parent)

    def add(self, archive: Entries, member: tarfile.TarInfo, name: str, top: str | None) -> None:
        if name in self.kinds and not (member.isdir() and self.kinds[name] == "dir"):
            raise EntryRefused("appears twice")
        self._parent_ok(name)
        path = self.dest / name
        if member.isdir():
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.chmod(member.mode & 0o777 | 0o700)
            self.kinds[name] = "dir"
        elif member.issym():
            self.kinds[name] = "link"
            self.symlinks[name] = member.linkname
        elif member.islnk():
            self._hard_link(member, name, top)
        else:
            self._write_file(archive, member, path)
            self.kinds[name] = "file"

    def _hard_link(self, member: tarfile.TarInfo, name: str, top: str | None) -> None:
        try:
            target = _final_name(tarfile.TarInfo(member.linkname), top)
        except EntryRefused:
            target = None
        if not target or self.kinds.get(target) != "file":
            raise EntryRefused(f"is a hard link leaving the files extracted before it (-> {member.linkname})")
        (self.dest / name).parent.mkdir(parents=True, exist_ok=True)
        os.link(self.dest / target, self.dest / name)
        self.kinds[name] = "file"

    def _write_file(self, archive: Entries, member: tarfile.TarInfo, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        source = archive.extractfile(member)
        assert source is not None
        if isinstance(source, Linkable) and source.link_into(path, member):
            with source:  # its bytes, mode and time are the entry's, checked; never chmod-ed: another tree's too
                return
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        with source, os.fdopen(os.open(path, flags, 0o600), "wb") as out:
            while chunk := source.read(CHUNK):
                out.write(chunk)
        path.chmod(member.mode & 0o777)
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)

    def finish(self) -> None:
        """Check every symlink against the complete set, then make them (never written through)."""
        for name, linkname in self.symlinks.items():
            try:
                self._parent_ok(name)
                _walk_link(name, linkname, self.symlinks)
            except EntryRefused as why:
                raise EntryRefused(str(why), entry=name) from None
        for name, linkname in sorted(self.symlinks.items()):
            (self.dest / name).parent.mkdir(parents=True, exist_ok=True)  # a tar need not list directories
            (self.dest / name).symlink_to(linkname)


def symlink_problems(root: Path) -> list[str]:
    """Every symlink under ``root`` that an archive of it would be refused for: absolute, leaving the
    tree, or passing through another symlink (tier 0 checks a bundle with this)."""
    links = {}
    for dirpath, dirs, files in os.walk(root):
        for entry in [*dirs, *files]:
            path = Path(dirpath, entry)
            if path.is_symlink():
                links[path.relative_to(root).as_posix()] = str(path.readlink())
    problems = []
    for name, linkname in sorted(links.items()):
        try:
            _walk_link(name, linkname, links)
        except EntryRefused as why:
            problems.append(f"{name} {why}")
    return problems


def safe_extract(
    archive: Entries,
    dest: Path,
    source: str,
    *,
    top: str | None = None,
    select: Callable[[str, tarfile.TarInfo], bool] = lambda name, member: True,
) -> int:
    """Extract ``archive`` into ``dest`` (created if missing, and expected empty): entries must sit under
    ``top/``, which is stripped, when ``top`` is given; ``select(final_name, member)`` may skip entries.
    ``source`` names the archive in errors. Returns the number of entries extracted. On a refusal the
    partial output stays in ``dest`` for the caller (a stage or staging directory) to discard."""
    dest.mkdir(parents=True, exist_ok=True)
    state = _Extraction(dest)
    member: tarfile.TarInfo | None = None
    try:
        with raising_disk_full(f"the disk under {dest} filled up while extracting {source}", "free space"):
            for member in archive:
                name = _final_name(member, top)
                if name is None or name == "" or not select(name, member):
                    continue
                _check_kind(member)
                state.add(archive, member, name, top)
            member = None
            state.finish()
    except UNPACK_ERRORS as err:
        raise unpack_error(err, "extract", source, member) from None
    return len(state.kinds) - 1
