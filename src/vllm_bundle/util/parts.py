"""A release's parts, put together and extracted: what install does with downloaded parts and tier 0 with
a directory of parts, in one pass that hashes the whole archive and keeps memory flat in its entries."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from vllm_bundle.errors import InstallError
from vllm_bundle.util.extract import safe_extract
from vllm_bundle.util.progress import Reporter, reported_step
from vllm_bundle.util.tarstream import StreamTar

#: What reading damaged parts raises: a bad tar entry, a bad gzip header, a member cut short, bad deflate
#: data. (The standard library's reader: ``install`` runs with the package's own dependencies only.)
DAMAGED: tuple[type[Exception], ...] = (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error)


class _Concatenated(io.RawIOBase):
    """The parts, read one after the other as one stream (what ``cat part*`` gives a shell), hashed as
    they are read; ``progress`` is told the size of every read."""

    def __init__(self, paths: Sequence[Path], progress: Callable[[int], None] = lambda count: None) -> None:
        self._paths = list(paths)
        self._handle: io.BufferedReader | None = None
        self._progress = progress
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            if self._handle is None:
                if not self._paths:
                    return 0
                self._handle = self._paths.pop(0).open("rb")
            count = self._handle.readinto(buffer)
            if count:
                self.digest.update(memoryview(buffer)[:count])
                self._progress(count)
                return count
            self._handle.close()
            self._handle = None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
        super().close()


class _Inflated(io.RawIOBase):
    """The archive's tar stream as the gzip reader inflates it, hashed as tarfile reads it: its sha256 is
    release.json's ``archive.tar_sha256`` once it is read to its end."""

    def __init__(self, gz: gzip.GzipFile) -> None:
        super().__init__()
        self._gz, self.digest = gz, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1, /) -> bytes:
        data = self._gz.read(size)
        self.digest.update(data)
        return data


class _Streamed(StreamTar):
    """The release's tar stream, keeping no list of its entries (:class:`StreamTar`), noting the mode of
    the archive's top directory (``./``) as it passes, as extraction sets every directory's (owner rwx
    added); ``None`` until one passes."""

    top_mode: int | None = None

    def next(self) -> tarfile.TarInfo | None:
        member = super().next()
        if member is not None and self.top_mode is None and _is_top(member):
            self.top_mode = member.mode & 0o777 | 0o700
        return member


def _is_top(member: tarfile.TarInfo) -> bool:
    """The archive's top directory: ``.`` or ``./``."""
    return member.isdir() and not [part for part in PurePosixPath(member.name).parts if part != "."]


@contextmanager
def read_archive(
    parts: Sequence[Path], progress: Callable[[int], None] = lambda count: None
) -> Iterator[tuple[_Streamed, _Concatenated, _Inflated]]:
    """The tar stream of the archive the parts make up, read once front to back, and the parts' reader
    (``progress`` is told the size of each read). Every gzip member is read, one after the other (RFC 1952
    2.2), as GNU tar reads them: tarfile's own ``r|gz`` stops at the end of the first member, and where
    that member ends at an entry's end it takes the rest for the end of the archive, with nothing said.
    On leaving, what the tar reader left unread (end blocks, later members) is read and checked too, and
    the reader's ``digest`` is then the whole archive's sha256, and the inflated stream's ``digest`` its tar
    stream's. A damaged archive raises one of :data:`DAMAGED`."""
    raw = _Concatenated(parts, progress)
    with io.BufferedReader(raw, buffer_size=1 << 20) as stream, gzip.GzipFile(fileobj=stream) as gz:
        inflated = _Inflated(gz)
        with _Streamed.open(fileobj=inflated, mode="r|") as archive:
            yield archive, raw, inflated
        while inflated.read(1 << 20):
            pass


def extract_parts(
    parts: Sequence[Path],
    dest: Path,
    tag: str,
    archive_sha256: str | None = None,
    reporter: Reporter | None = None,
    tar_sha256: str | None = None,
) -> None:
    """Extract the archive the parts make up into ``dest`` (see :mod:`vllm_bundle.util.extract`), give ``dest``
    the mode of the archive's top directory (other users run the install; 0755 when it has no such entry),
    and check the whole archive's sha256 and its tar stream's against release.json's where it gives them
    (a release.json whose ``tar_sha256`` is not its parts' fails every full install, as an update over
    it would). ``reporter`` shows the
    progress as ``extract <tag>``, in compressed bytes read of the parts' total size. Memory stays flat in
    the number of entries (:class:`_Streamed`)."""
    total = sum(part.stat().st_size for part in parts)
    with reported_step(reporter, f"extract {tag}", total) as progress:
        try:
            with read_archive(parts, progress) as (archive, raw, inflated):
                safe_extract(archive, dest, f"the {tag} release")
                dest.chmod(0o755 if archive.top_mode is None else archive.top_mode)
        except DAMAGED as err:
            raise InstallError(f"cannot extract the {tag} release: {err}", "its parts are damaged") from None
        if archive_sha256 is not None and raw.digest.hexdigest() != archive_sha256:
            raise InstallError(
                f"the {tag} release's parts put together do not match release.json's archive sha256",
                "the release is mixed up: install again, or re-publish it",
            )
        if tar_sha256 is not None and inflated.digest.hexdigest() != tar_sha256:
            raise InstallError(
                f"the {tag} release's parts inflate to a tar stream that does not match release.json's "
                "archive.tar_sha256",
                "the release is mixed up: re-publish it",
            )
