"""Tar archives read or written once, front to back, and the tar stream of a release's tree entry by
entry (what the release archive and an image layer hold, and what a delta install checks the tree it
assembled against). Standard library only: ``install`` imports it, and the installer's environment has
none of the build's dependencies.

Determinism: entries ``./...`` in sorted order; every mtime :data:`RELEASED_MTIME`, whatever the release's
source date; uid/gid 0 with empty owner names;
modes 0755/0644 from the owner's exec bit (directories 0755); symlinks kept (they must stay inside the
tree); a second name of an inode is recorded as a hard link to the first name in sorted order; PAX
headers as tarfile writes them.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
import tarfile
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_bundle.errors import ArchiveError
from vllm_bundle.runtime.smallfile import open_regular_file

if TYPE_CHECKING:
    from _typeshed import SupportsRead


class StreamTar(tarfile.TarFile):
    """A tar read or written once, front to back (``r|gz``, ``w|``), that keeps no list of its entries:
    tarfile appends each one it reads or writes to ``members`` (for ``getmembers()``, which a stream
    never calls), and a bundle's hundreds of thousands of files would grow that with their count."""

    members: list[tarfile.TarInfo]  # tarfile's own list (typeshed leaves it out)

    def next(self) -> tarfile.TarInfo | None:
        member = super().next()
        self.members.clear()  # iteration asks next() for each entry once the list is empty
        return member

    def addfile(self, tarinfo: tarfile.TarInfo, fileobj: SupportsRead[bytes] | None = None) -> None:
        super().addfile(tarinfo, fileobj)
        self.members.clear()


#: Every entry's modification time in a release (its archive, its image's layer, and so every install):
#: 1980-01-01 00:00:00 UTC, the earliest time a zip (a wheel) can hold, so a file's time is the same
#: whichever archive carries it. Not the release's source date (release.json keeps that, and the SBOM and
#: the image's ``created``): an unchanged file then has the same tar header in two releases, so an update
#: can keep the previous install's file as it is, a hard link, and a release that changes only its date
#: has the tar stream of the one before it (#54). The bundle ships no byte code whose check reads it.
RELEASED_MTIME = 315532800

#: tarfile's writing of names that are not valid UTF-8 (its defaults on Linux)
TAR_ENCODING, TAR_ERRORS = "utf-8", "surrogateescape"


def tree_entries(root: Path, leave_out: Collection[str] = ()) -> Iterator[tuple[str, Path]]:
    """``(archive name, path)`` for the root and everything under it, sorted by archive name; but the
    names in ``leave_out`` at the top of the tree (an installer's own files beside the release's)."""
    names = [("./", root)]
    for dirpath, dirs, files in os.walk(root):
        top = dirpath == os.fspath(root)
        if top:
            dirs[:] = [name for name in dirs if name not in leave_out]
        for name in [*dirs, *files]:
            if top and name in leave_out:
                continue
            path = Path(dirpath, name)
            names.append(("./" + path.relative_to(root).as_posix(), path))
    yield from sorted(names, key=lambda item: item[0])


def released_mode(kind: str, mode: int) -> int:
    """The mode an entry of ``kind`` (``reg``, ``dir``, ``symlink``, ``hardlink``) has in a release whose
    file had ``mode``: 0755 or 0644 by the owner's exec bit, 0755 for a directory, 0777 for a link."""
    if kind == "dir":
        return 0o755
    if kind == "symlink":
        return 0o777
    return 0o755 if mode & 0o100 else 0o644


def tar_entry(name: str, path: Path, root: Path, seen: dict[tuple[int, int], str]) -> tarfile.TarInfo:
    """The tar header of ``path`` (archive name ``name``) as a release holds it; ``seen`` maps each inode
    met so far to its first name (a later name becomes a hard link to it)."""
    found = path.lstat()  # one stat for the kind too: a tree of 100,000 entries is read whole by an update
    info = tarfile.TarInfo(name.rstrip("/") if name != "./" else ".")
    info.mtime, info.uid, info.gid, info.uname, info.gname = RELEASED_MTIME, 0, 0, "", ""
    if stat.S_ISLNK(found.st_mode):
        target = str(path.readlink())
        inside = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        if target.startswith("/") or inside == ".." or inside.startswith("../"):
            raise ArchiveError(
                f"{path.relative_to(root)} is a symlink leaving the bundle (-> {target})",
                "make it relative and inside the tree",
            )
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, released_mode("symlink", 0)
    elif stat.S_ISDIR(found.st_mode):
        info.type, info.mode = tarfile.DIRTYPE, released_mode("dir", 0)
    elif stat.S_ISREG(found.st_mode):
        info.mode = released_mode("reg", found.st_mode)
        key = (found.st_dev, found.st_ino)
        if found.st_nlink > 1 and key in seen:
            info.type, info.linkname = tarfile.LNKTYPE, seen[key]
        else:
            seen[key] = info.name
            info.size = found.st_size
    else:
        raise ArchiveError(
            f"{path.relative_to(root)} is neither a file, a directory nor a symlink", "remove it from the bundle"
        )
    return info


def header(info: tarfile.TarInfo) -> bytes:
    """``info``'s header blocks, PAX as tarfile writes them."""
    return info.tobuf(tarfile.PAX_FORMAT, TAR_ENCODING, TAR_ERRORS)


def padding(size: int) -> bytes:
    """What follows ``size`` bytes of a file's data: NULs to a whole block."""
    return tarfile.NUL * (-size % tarfile.BLOCKSIZE)


def end_of_archive(offset: int) -> bytes:
    """The end-of-archive blocks after ``offset`` bytes of entries, and the NULs to a whole record, as
    tarfile writes them."""
    end = 2 * tarfile.BLOCKSIZE
    return tarfile.NUL * (end + (-(offset + end) % tarfile.RECORDSIZE))


#: How much of a file :func:`stream_sha256` reads at a time.
WINDOW = 1 << 20


def stream_sha256(
    root: Path,
    leave_out: Collection[str] = (),
    progress: Callable[[int], None] = lambda size: None,
    *,
    as_installed: bool = False,
) -> str:
    """The sha256 of the tar stream of ``root`` (but the top-level names in ``leave_out``) as a release's
    archive holds it before it is compressed: what release.json's ``archive.tar_sha256`` gives, and what a
    full install's parts inflate to. ``progress`` is told each regular file's bytes as read. Raises
    ArchiveError for what a release cannot hold (a link leaving the tree, a FIFO) and for a file whose
    size changes while it is read. ``as_installed``: also for an entry whose mode, time or owner on disk
    is not what an install of the release gives it (the stream has the release's, whatever the disk's)."""
    digest, offset = hashlib.sha256(), 0
    seen: dict[tuple[int, int], str] = {}
    for name, path in tree_entries(root, leave_out):
        info = tar_entry(name, path, root, seen)
        if as_installed:
            _as_installed(path, info)
        block = header(info)
        digest.update(block)
        offset += len(block)
        if info.isreg():
            _hash_file(path, info.size, digest, progress)
            block = padding(info.size)
            digest.update(block)
            offset += info.size + len(block)
    digest.update(end_of_archive(offset))
    return digest.hexdigest()


def _as_installed(path: Path, info: tarfile.TarInfo) -> None:
    """``path`` has the mode an install gives ``info`` (a file also the release's time and this user as
    owner); directories' times are the extraction's, never set."""
    if info.issym():
        return
    found = path.lstat()
    if stat.S_IMODE(found.st_mode) != info.mode or (
        info.isreg() and (found.st_mtime_ns != info.mtime * 1_000_000_000 or found.st_uid != os.geteuid())
    ):
        raise ArchiveError(f"{path} is not as it was installed (its mode, time or owner)", "install it again")


def _hash_file(path: Path, size: int, digest: hashlib._Hash, progress: Callable[[int], None]) -> None:
    left = size
    with open_regular_file(path, follow=False) as handle:  # a FIFO or a link there since the lstat: refused
        while left:
            data = handle.read(min(left, WINDOW))
            if not data:
                break
            digest.update(data)
            left -= len(data)
            progress(len(data))
        if left or handle.read(1):
            raise ArchiveError(f"{path} changed while it was read", "do not change the tree while it is checked")
