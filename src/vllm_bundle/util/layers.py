"""An image's layers applied in order to one root file system, safely: the builder's rootfs
(tree/builder.py), which bubblewrap then mounts read-only as ``/`` of the build.

A layer is a tar of changes (OCI image-spec layer.md): entries add or replace paths, ``.wh.<name>``
removes ``<name>`` of the layers below, ``.wh..wh..opq`` empties its directory of what they put there.
A root file system is not a bundle: its symlinks may be absolute (they are read inside the sandbox,
where ``/`` is this tree), its programs may be setuid, it may hold device nodes. So the rules differ from
:mod:`vllm_bundle.util.extract`'s, but the guarantee is the same: nothing is written outside ``root`` or
through a link, whatever a layer holds:

- a name is relative, without ``..``; every directory above it must be a real directory of the tree
  (a symlink there, even one pointing inside, is refused: it would be written through);
- what a name replaces is removed as itself (``unlink``, or ``rmtree``, which never follows a link);
- a hard link names a regular file already in the tree, reached the same way;
- setuid and setgid bits are dropped (the build runs unprivileged), device nodes and FIFOs are skipped
  (bubblewrap gives the build its own ``/dev``); owners are not kept.

Written by hand: no maintained Python library applies OCI layers (umoci and containers/storage are Go
programs, and a Docker or Podman engine is what this replaces where none can run).
"""

from __future__ import annotations

import gzip
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, cast

from vllm_bundle.errors import UnsafeArchiveError
from vllm_bundle.util.extract import UNPACK_ERRORS, EntryRefused, relative_parts, unpack_error
from vllm_bundle.util.fsutil import raising_disk_full

CHUNK = 1 << 20
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
GZIP_TYPES = ("application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.docker.image.rootfs.diff.tar.gzip")
ZSTD_TYPES = ("application/vnd.oci.image.layer.v1.tar+zstd",)
PLAIN_TYPES = ("application/vnd.oci.image.layer.v1.tar", "application/vnd.docker.image.rootfs.diff.tar")


@contextmanager
def layer_stream(path: Path, media_type: str) -> Iterator[IO[bytes]]:
    """The layer's tar bytes, decompressed as its media type says."""
    if media_type in GZIP_TYPES:
        with path.open("rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            yield cast(IO[bytes], stream)
    elif media_type in ZSTD_TYPES:
        import zstandard  # the build extra's (tier 0 reads zstd offload bundles with it too)

        with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
            yield stream
    elif media_type in PLAIN_TYPES:
        with path.open("rb") as stream:
            yield stream
    else:
        raise UnsafeArchiveError(f"a layer of media type {media_type!r} cannot be unpacked", "lock another image")


def _relative(name: str) -> str:
    return "/".join(relative_parts(name))


class _Tree:
    """The root file system being written, and what the current layer has put there so far."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ours: set[str] = set()  # names the current layer wrote (whiteouts apply to the layers below)

    def directory(self, name: str) -> Path:
        """``name``'s directory, made where missing; every component a real directory, never a link."""
        here = self.root
        for part in name.split("/") if name else ():
            here = here / part
            try:
                mode = os.lstat(here).st_mode
            except FileNotFoundError:
                here.mkdir(mode=0o755)
                continue
            if stat.S_ISLNK(mode):
                raise EntryRefused(f"lies below {here.relative_to(self.root)}, a symlink: it would be written through")
            if not stat.S_ISDIR(mode):
                raise EntryRefused(f"lies below {here.relative_to(self.root)}, which is not a directory")
        return here

    def remove(self, path: Path) -> None:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(mode):
            shutil.rmtree(path)  # never follows a symlink below it
        else:
            path.unlink()

    def whiteout(self, name: str) -> None:
        parent, base = posixpath.split(name)
        directory = self.directory(parent)
        if base == OPAQUE:
            for child in list(directory.iterdir()):
                if posixpath.join(parent, child.name) not in self.ours:
                    self.remove(child)
            return
        hidden = posixpath.join(parent, base.removeprefix(WHITEOUT))
        if hidden not in self.ours:
            self.remove(directory / base.removeprefix(WHITEOUT))

    def add(self, layer: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> None:
        parent, base = posixpath.split(name)
        path = self.directory(parent) / base
        mode = member.mode & 0o1777 & ~(stat.S_ISUID | stat.S_ISGID)
        if member.isdir():
            if not path.is_dir() or path.is_symlink():
                self.remove(path)
                path.mkdir()
            path.chmod(mode | 0o700)
        elif member.issym():
            self.remove(path)
            path.symlink_to(member.linkname)
        elif member.islnk():
            target = self._existing_file(_relative(member.linkname))
            self.remove(path)
            os.link(target, path, follow_symlinks=False)
        elif member.isreg():
            self.remove(path)
            source = layer.extractfile(member)
            assert source is not None
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with source, os.fdopen(os.open(path, flags, 0o600), "wb") as out:
                while chunk := source.read(CHUNK):
                    out.write(chunk)
            path.chmod(mode | 0o600)
        else:
            return  # a device node or FIFO: the sandbox has its own /dev
        self.ours.add(name)

    def _existing_file(self, name: str) -> Path:
        parent, base = posixpath.split(name)
        path = self.directory(parent) / base
        if not path.is_file() or path.is_symlink():
            raise EntryRefused(f"is a hard link to {name}, which is not a file written before it")
        return path


def apply_layers(layers: list[tuple[str, Path]], root: Path, source: str) -> int:
    """Apply ``layers`` ((media type, blob file), lowest first) to ``root`` (created, expected empty);
    ``source`` names the image in errors. Returns the number of entries written."""
    root.mkdir(parents=True, exist_ok=True)
    written = 0
    for number, (media_type, blob) in enumerate(layers, start=1):
        tree, member = _Tree(root), None
        where = f"{source} layer {number} of {len(layers)}"
        try:
            with (
                raising_disk_full(f"the disk under {root} filled up while unpacking {where}", "free space"),
                layer_stream(blob, media_type) as stream,
                tarfile.open(fileobj=stream, mode="r|") as layer,
            ):
                for member in layer:
                    name = _relative(member.name)
                    if not name:
                        continue
                    if posixpath.basename(name).startswith(WHITEOUT):
                        tree.whiteout(name)
                    else:
                        tree.add(layer, member, name)
                        written += 1
        except UNPACK_ERRORS as err:
            raise unpack_error(err, "unpack", where, member, kind="image") from None
    return written
