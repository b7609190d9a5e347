"""Files on disk: written so that a reader or a crash never sees half of one, a full disk as one line,
hashed, linked or copied."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from vllm_bundle.errors import DiskFullError

#: What a write says when the disk is full: no space left, or the user's quota used up.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def atomic_write(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old or the new content, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).chmod(0o644)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS


@contextmanager
def raising_disk_full(message: str, hint: str, *, cleanup: Callable[[], object] | None = None) -> Iterator[None]:
    """A full disk (ENOSPC, EDQUOT) anywhere in the block ends as one line, ``DiskFullError(message,
    hint)``, after ``cleanup`` (which removes what was half written); any other error passes as it is."""
    try:
        yield
    except OSError as err:
        if not is_disk_full(err):
            raise
        if cleanup is not None:
            cleanup()
        raise DiskFullError(message, hint) from None


def named_bytes_digest(*files: tuple[str, bytes]) -> str:
    """One sha256 over files' names and bytes, in order: ``name NUL bytes NUL`` each (a stage's declared
    input files; a lock's two files, as the release records them)."""
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes in hex, read in blocks (a part or a wheel is gigabytes)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """A hard link where ``dst`` is on ``src``'s file system (and the file system links), else a copy
    with its mode and times; also a ``copytree`` copy function. For copies that nothing edits in place
    (a new file, or one replaced by rename, leaves the original as it was): copying a bundle of several
    GB only to import from it costs minutes."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
