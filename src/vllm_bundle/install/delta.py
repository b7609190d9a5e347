"""A delta install: the new release assembled from the chunks the previous install already has and the
few gzip members of the new archive it lacks, fetched with HTTP Range.

The release's table of contents (:mod:`vllm_bundle.release.archive`; ``<tag>-x64.toc.json.gz``, its
sha256 in release.json) gives each file as chunks, each with its sha256 and its place: the gzip member
that holds it (the member's offset in the archive the parts make up) and where inside the member. Every
install keeps the table it was installed from (:data:`KEPT_TOC`). Over such an install:

1. a chunk of the new table that the old table names (by sha256) is read from the old install's file,
   hashed again as it is read; one that a cut run already fetched is read from the chunk cache, hashed
   again too;
2. the members holding every other chunk are fetched with HTTP Range (adjacent members in one request,
   several requests at a time); each member is inflated alone, and each of its chunks checked and kept in
   the chunk cache, so a run cut off resumes where it stopped;
3. meanwhile, the new tree is written by the same safe extraction as a full install (:func:`safe_extract`:
   the same checks of names, kinds and links) from the new table's entries, each file from its chunks; a
   file that needs a member still on its way waits for it (so the download and the writing overlap), and
   a chunk that does not match its sha256 (or whose file is no longer a regular file inside the install:
   a FIFO, a link loop, a link out of it) is fetched from the release instead. A file the previous install
   has under the same name, with the same chunks, mode, time and owner and no name the old table does not
   give it, is not written again: once every byte of it is hashed, the new tree gets a hard link to it
   (:meth:`Previous.link`). Nothing of the previous install is changed by that (its bytes and metadata are
   what both trees need), so an install given up, or a swap that fails, leaves it as it was;
4. the tree written must give the tar stream release.json's ``archive.tar_sha256`` names: hashed again
   from the files on disk, it is what the parts inflate to, which a full install checks too
   (:func:`vllm_bundle.util.tarstream.stream_sha256`). The table is a map of where to find bytes, never
   what decides what is installed.

Where a delta cannot be done safely (no install of ours with a table, the server ignores Range or drips,
more than half of the archive to fetch, fetched bytes that do not match, a table that does not add up or
does not describe the parts) it raises :class:`DeltaUnavailable` and the caller installs the whole
release instead. Ctrl-C ends the answers in flight at once.

Every entry's modification time is the release's (:data:`~vllm_bundle.util.tarstream.RELEASED_MTIME`), and
its mode the one the release's tar stream gives it (:func:`vllm_bundle.util.tarstream.released_mode`),
whatever the table says.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import secrets
import stat
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

import requests
import urllib3

from vllm_bundle import toc as toc_format
from vllm_bundle.errors import ArchiveError, InsecureURLError, UnsafeArchiveError
from vllm_bundle.runtime.smallfile import NotSmallFile, open_regular_file, read_small_bytes
from vllm_bundle.toc import MAX_TOC, BadToc, Chunk, Entry, Toc
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.extract import safe_extract
from vllm_bundle.util.fsutil import raising_disk_full
from vllm_bundle.util.policy import RetryPolicy
from vllm_bundle.util.progress import Reporter, human_size, reported_step
from vllm_bundle.util.tarstream import RELEASED_MTIME, released_mode, stream_sha256
from vllm_bundle.util.transport import describe, range_answer_problem, retrying

#: The table an install was made from, kept in it: what the next delta install reads.
KEPT_TOC = ".vllm-bundle-toc.json.gz"
#: One request fetches adjacent members up to this many bytes, so that several run at a time.
MAX_REQUEST = 8 << 20
REQUESTS_AT_ONCE = 4
#: A Range answer of N bytes must arrive whole within the read timeout plus N / this many bytes a second
#: (256 kbit/s), however it trickles: past that it is asked again from the member it had not finished, as
#: a cut one is; a server that drips keeps no delta going for good (#51 F2).
LEAST_RANGE_RATE = 32 << 10
#: Above this share of the archive to fetch, the whole release is downloaded (its parts are cached and
#: resumable as a whole, and a Range request per member gains nothing).
MOST_TO_FETCH = 0.5


class DeltaUnavailable(Exception):
    """Why this install cannot be a delta: the caller downloads the whole release instead. (Not an
    OSError or ValueError: safe extraction lets it through as it is.)"""


def parse_toc(data: bytes, archive_size: int | None = None) -> Toc:
    """:func:`vllm_bundle.toc.parse`, a table that does not add up being a delta given up."""
    try:
        return toc_format.parse(data, archive_size)
    except BadToc as err:
        raise DeltaUnavailable(f"the table of contents does not add up: {err}") from None


# -- where chunks come from ---------------------------------------------------------------------------


class ChunkStore:
    """Chunks fetched for a delta, one file each under their sha256, in the download cache: a run cut
    off resumes from them. Every read hashes the chunk again (a torn or changed file is a miss), so writes
    need no fsync."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.kept: set[str] = set()  # the chunks this run put (a delta given up leaves none behind)
        self.present = self._listed()  # the chunks the cache held when the run began (a cut run's)

    def _listed(self) -> set[str]:
        """The names of the chunk files in the cache, listed once, so that asking for a chunk the cache
        does not have is a set lookup: each path of the cache is checked for links on its way
        (util/cache.py), which for every chunk of a 3 GiB tree (about 100,000) took most of a date-only
        update's time. Links are not followed; one at the chunks' folder is refused at the first put."""
        folder, found = self.cache.root / "chunks", set[str]()
        with suppress(OSError):  # no chunks folder yet
            if not folder.is_symlink():
                with os.scandir(folder) as groups:
                    for group in groups:
                        if group.is_dir(follow_symlinks=False):
                            with os.scandir(group.path) as names:
                                found.update(name.name for name in names if name.is_file(follow_symlinks=False))
        return found

    def _path(self, digest: str) -> Path:
        return self.cache.chunk(digest)  # refused where the cache would be written through a link

    def _known(self, digest: str) -> bool:
        return digest in self.present or digest in self.kept

    def get(self, digest: str, size: int) -> bytes | None:
        if not self._known(digest):
            return None
        try:
            with open_regular_file(self._path(digest), follow=False) as handle:  # a FIFO there is a miss
                data = handle.read(size + 1)
        except OSError:
            return None
        return data if len(data) == size and hashlib.sha256(data).hexdigest() == digest else None

    def has(self, digest: str, size: int) -> bool:
        if not self._known(digest):
            return False
        try:
            found = self._path(digest).lstat()
        except OSError:
            return False
        return stat.S_ISREG(found.st_mode) and found.st_size == size

    def discard(self, digests: Iterable[str]) -> None:
        """The chunks of an update once it is installed (or given up for the whole release): made by a
        delta, needed by none after it; and their folders, once empty."""
        folders = set()
        for digest in {digest for digest in digests if self._known(digest)}:
            path = self._path(digest)
            path.unlink(missing_ok=True)
            folders.add(path.parent)
        for folder in folders:
            with suppress(OSError):  # not empty: another release's chunks
                folder.rmdir()

    def put(self, digest: str, data: bytes) -> None:
        """``data`` kept under ``digest``: written beside its place, then renamed into it; what was half
        written is removed whatever stops it, and a full disk is one line naming the cache's."""
        path = self._path(digest)
        scratch = path.with_name(f".{digest}.{secrets.token_hex(4)}")
        with raising_disk_full(
            f"disk full while keeping a fetched chunk in the download cache {self.cache.root}",
            "free some space or point --cache-dir / $VLLM_BUNDLE_CACHE_DIR at a larger disk",
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(scratch, "wb", opener=_exclusive) as handle:
                    handle.write(data)
                scratch.replace(path)
            except BaseException:
                scratch.unlink(missing_ok=True)
                raise
        self.kept.add(digest)


def _exclusive(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def _layout(chunks: Iterable[Chunk]) -> tuple[tuple[int, int, str], ...]:
    """A file's bytes as its chunks give them: (offset in the file, size, sha256) of each."""
    return tuple((chunk.at, chunk.size, chunk.digest) for chunk in chunks)


class Previous:
    """The chunks of the previous install, by sha256: where in which of its files each one is; and each of
    its regular files by name, with its chunks and how many names the old table gives its inode."""

    def __init__(self, root: Path, toc: Toc) -> None:
        self.root = root.resolve()
        self.where: dict[str, tuple[str, int, int]] = {}
        for entry, chunk in toc.chunks():
            self.where.setdefault(chunk.digest, (entry.name, chunk.at, chunk.size))
        self.files = {entry.name: entry for entry in toc.entries if entry.kind == "reg"}
        self.names = dict.fromkeys(self.files, 1)
        for entry in toc.entries:
            if entry.kind == "hardlink" and entry.link in self.names:
                self.names[entry.link] += 1
        self._open: tuple[str, BinaryIO] | None = None
        self._folders: dict[str, Path | None] = {}  # a folder's name -> where it is, None: not inside

    def link(self, entry: Entry, path: Path, mode: int) -> bool:
        """``path`` made a hard link to the previous install's file of ``entry``'s name, where that file is
        ``entry`` exactly: the same chunks in the old table, every byte hashed again now, and the mode
        ``mode``, the release's time, this user's, with no name the old table does not give it (a link
        from outside the install would change the new one). Nothing at ``path`` otherwise (False). The
        old file is not changed: both trees need it as it is (its name count, ctime aside)."""
        old = self.files.get(entry.name)
        if old is None or _layout(old.chunks) != _layout(entry.chunks):
            return False
        try:
            handle = self._handle(entry.name)
            found = os.fstat(handle.fileno())
            if (
                found.st_size != entry.size
                or stat.S_IMODE(found.st_mode) != mode
                or found.st_mtime_ns != RELEASED_MTIME * 1_000_000_000
                or found.st_uid != os.geteuid()
                or found.st_nlink != self.names[entry.name]
                or not self._hashes_to(handle, entry.chunks)
            ):
                return False
            os.link(self.root / entry.name, path, follow_symlinks=False)
        except OSError:  # gone, not a file inside the install, a file system without hard links
            return False
        linked = path.lstat()
        if (linked.st_dev, linked.st_ino) != (found.st_dev, found.st_ino):  # the name was changed meanwhile
            path.unlink()
            return False
        return True

    @staticmethod
    def _hashes_to(handle: BinaryIO, chunks: Sequence[Chunk]) -> bool:
        """``handle``'s bytes are ``chunks``, in order, and nothing after them."""
        handle.seek(0)
        for chunk in chunks:
            data = handle.read(chunk.size)
            if len(data) != chunk.size or hashlib.sha256(data).hexdigest() != chunk.digest:
                return False
        return not handle.read(1)

    def read(self, digest: str) -> bytes | None:
        """The chunk, read from the old install and hashed again; None where it is not there as it was
        (a file changed, gone, or not a plain file inside the install)."""
        found = self.where.get(digest)
        if found is None:
            return None
        name, at, size = found
        try:
            handle = self._handle(name)
            handle.seek(at)
            data = handle.read(size)
        except OSError:
            return None
        return data if len(data) == size and hashlib.sha256(data).hexdigest() == digest else None

    def _handle(self, name: str) -> BinaryIO:
        if self._open is not None and self._open[0] == name:
            return self._open[1]
        self.close()
        handle = open_regular_file(self._inside(name), follow=False)  # a link, FIFO, device: not a file of it
        self._open = (name, handle)
        return handle

    def _inside(self, name: str) -> Path:
        """Where the file ``name`` (as the old table gives it) is: its folder resolved (once per folder),
        never outside the install."""
        parent, _, base = name.rpartition("/")
        if parent not in self._folders:
            try:
                resolved = (self.root / parent).resolve()
            except RuntimeError as loop:  # Python 3.11's "Symlink loop" (3.13 raises OSError): a changed folder
                raise OSError(str(loop)) from None
            self._folders[parent] = resolved if resolved.is_relative_to(self.root) else None
        folder = self._folders[parent]
        if folder is None or base in ("", ".", ".."):
            raise OSError(f"{name} is not inside the previous install")
        return folder / base

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None


# -- fetching members ---------------------------------------------------------------------------------


class Part(NamedTuple):
    location: str  # an URL, or a path of a release directory
    size: int
    sha256: str  # as release.json gives it: what the assembled tree must archive to


@dataclass
class Moved:
    """What a delta moved: bytes fetched (compressed, on the wire), requests, members; bytes re-used
    (inflated, read from the previous install or linked to it), and files linked."""

    fetched: int = 0
    requests: int = 0
    members: int = 0
    reused: int = 0
    linked: int = 0


def _spans(parts: Sequence[Part], start: int, end: int) -> Iterator[tuple[Part, int, int]]:
    """The pieces of the archive's bytes ``[start, end)`` in each part: (part, first, last + 1)."""
    offset = 0
    for part in parts:
        low, high = max(start, offset), min(end, offset + part.size)
        if low < high:
            yield part, low - offset, high - offset
        offset += part.size


@dataclass
class MemberFetcher:
    """Fetches members of the new archive with Range requests (or reads them from a release directory),
    inflates each alone, and keeps its chunks in ``store`` once they match the table."""

    toc: Toc
    parts: Sequence[Part]
    session: requests.Session | None  # None: the parts are files
    store: ChunkStore
    moved: Moved = field(default_factory=Moved)
    by_member: dict[int, list[Chunk]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    kept: dict[int, threading.Event] = field(default_factory=dict)  # members on their way, set once kept
    stopped: threading.Event = field(default_factory=threading.Event)  # the install gave up: fetch no more
    policy: RetryPolicy = field(default_factory=RetryPolicy)  # the session's: its tries and read timeout
    answers: set[requests.Response] = field(default_factory=set)  # being read now: shut down by stop()

    def __post_init__(self) -> None:
        for _, chunk in self.toc.chunks():
            self.by_member.setdefault(chunk.member, []).append(chunk)

    def in_background(
        self, pool: ThreadPoolExecutor, members: Sequence[int], progress: Callable[[int], None]
    ) -> Future[None]:
        """:meth:`fetch` in ``pool``, each member awaitable (:meth:`wait_for`) as soon as it is kept."""
        self.kept.update((number, threading.Event()) for number in members)
        return pool.submit(self.fetch, members, progress)

    def stop(self) -> None:
        """No further request, and the answers being read end now: their sockets are shut down, which
        wakes a read blocked on a stalled server (urllib3's ``HTTPResponse.shutdown``)."""
        self.stopped.set()
        with self.lock:
            answers = list(self.answers)
        for answer in answers:
            with suppress(ValueError, RuntimeError, OSError):  # already released, or closed
                answer.raw.shutdown()

    def wait_for(self, number: int, fetching: Future[None]) -> None:
        """Until member ``number`` is kept, or the fetch ``fetching`` has ended (raising why it failed)."""
        event = self.kept.get(number)
        while event is not None and not event.wait(0.05):
            if fetching.done():
                fetching.result()
                return

    def fetch(self, members: Sequence[int], progress: Callable[[int], None]) -> None:
        """Every member in ``members`` (sorted), adjacent ones in one request, several at a time;
        ``progress`` is told each count of bytes received."""
        groups: list[list[int]] = []
        for number in members:
            last = groups[-1] if groups else None
            member = self.toc.members[number]
            start = self.toc.members[last[0]].offset if last else 0
            if last and last[-1] == number - 1 and member.offset + member.size - start <= MAX_REQUEST:
                last.append(number)
            else:
                groups.append([number])
        pool = ThreadPoolExecutor(REQUESTS_AT_ONCE)
        try:
            for done in pool.map(functools.partial(self._fetch_group, progress=progress), groups):
                del done
        except BaseException:  # a group failed, or Ctrl-C: the others end now, not once their answers do
            self.stop()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()

    def _fetch_group(self, group: list[int], progress: Callable[[int], None]) -> None:
        """The members of ``group`` in one request; one cut off is asked again from the first member it
        had not finished (what came before it is kept), up to the policy's ``attempts`` (``--retries``) times,
        with its backoff between them (util/transport.py ``retrying``, as a full download has)."""
        remaining = list(group)

        def attempt() -> None:
            if self.stopped.is_set():
                return
            first, last = self.toc.members[remaining[0]], self.toc.members[remaining[-1]]
            body = _Body(self._bytes(first.offset, last.offset + last.size, progress))
            try:
                while remaining:
                    self._keep(remaining[0], body.take(self.toc.members[remaining[0]].size))
                    remaining.pop(0)
                body.finish()
            finally:
                body.close()

        try:  # the policy's backoff between tries, cut short once the install stopped
            retrying(self.policy, attempt, lambda err: isinstance(err, _Cut), sleep=self.stopped.wait)
        except _Cut as err:
            if not self.stopped.is_set():
                raise DeltaUnavailable(f"a Range request was cut off {self.policy.attempts} times ({err})") from None

    def _keep(self, number: int, compressed: bytes) -> None:
        offset, _, inflated = self.toc.members[number]
        try:
            inflater = zlib.decompressobj(31)
            data = inflater.decompress(compressed, inflated + 1)
            complete = inflater.eof and not inflater.unused_data and len(data) == inflated
        except zlib.error:
            complete = False
        if not complete:
            raise DeltaUnavailable(f"the member fetched at byte {offset} of the archive does not match the table")
        for chunk in self.by_member.get(number, []):
            piece = data[chunk.inner : chunk.inner + chunk.size]
            if hashlib.sha256(piece).hexdigest() != chunk.digest:
                raise DeltaUnavailable(f"a chunk fetched at byte {offset} of the archive does not match its sha256")
            self.store.put(chunk.digest, piece)
        with self.lock:
            self.moved.members += 1
        if number in self.kept:
            self.kept[number].set()

    def _bytes(self, start: int, end: int, progress: Callable[[int], None]) -> Generator[bytes, None, None]:
        for part, low, high in _spans(self.parts, start, end):
            yield from (self._read_file if self.session is None else self._get)(part, low, high, progress)

    def _read_file(self, part: Part, low: int, high: int, progress: Callable[[int], None]) -> Iterator[bytes]:
        with Path(part.location).open("rb") as handle:
            handle.seek(low)
            data = handle.read(high - low)
        with self.lock:
            self.moved.requests += 1
        self._count(len(data), progress)
        yield data

    def _get(self, part: Part, low: int, high: int, progress: Callable[[int], None]) -> Iterator[bytes]:
        assert self.session is not None
        headers = {"Range": f"bytes={low}-{high - 1}", "Accept-Encoding": "identity"}
        started, seconds = time.monotonic(), self.policy.read_timeout + (high - low) / LEAST_RANGE_RATE
        try:
            with self.session.get(part.location, headers=headers, stream=True) as answer:
                with self.lock:
                    self.answers.add(answer)
                try:
                    yield from self._read_answer(answer, part, (low, high), progress, (started, seconds))
                finally:
                    with self.lock:
                        self.answers.discard(answer)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as err:  # read1: urllib3's own
            raise _Cut("the install stopped" if self.stopped.is_set() else describe(err)) from None
        except InsecureURLError as err:  # a redirect to plain http: the whole release, if it is not redirected so
            raise DeltaUnavailable(err.message) from None

    def _read_answer(
        self,
        answer: requests.Response,
        part: Part,
        span: tuple[int, int],
        progress: Callable[[int], None],
        deadline: tuple[float, float],
    ) -> Iterator[bytes]:
        """The body of the answer to ``span`` of ``part``, checked to be that span, arriving whole within
        ``deadline`` (started, seconds); ends early once the install stopped."""
        (low, high), (started, seconds) = span, deadline
        if problem := range_answer_problem(answer, low, high - 1, part.size):
            raise DeltaUnavailable(f"the server answered a Range request with {problem}")
        with self.lock:
            self.moved.requests += 1
        while piece := answer.raw.read1(1 << 20):
            if self.stopped.is_set():
                raise _Cut("the install stopped")
            if time.monotonic() - started > seconds:
                raise _Cut(f"a Range answer of {human_size(high - low)} did not arrive whole within {seconds:.0f} s")
            self._count(len(piece), progress)
            yield piece

    def _count(self, size: int, progress: Callable[[int], None]) -> None:
        with self.lock:
            self.moved.fetched += size
            progress(size)


class _Cut(Exception):
    """A Range answer cut off before its end: asked again from where it stopped."""


class _Body:
    """The bytes of a Range answer (or several, across parts), taken a member at a time."""

    def __init__(self, pieces: Generator[bytes, None, None]) -> None:
        self.pieces, self.buffer = pieces, bytearray()

    def take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            piece = next(self.pieces, None)
            if piece is None:
                raise _Cut("the answer ended early")
            self.buffer += piece
        taken = bytes(self.buffer[:size])
        del self.buffer[:size]
        return taken

    def finish(self) -> None:
        if self.buffer or next(self.pieces, None) is not None:
            raise DeltaUnavailable("a Range answer held more bytes than asked for")

    def close(self) -> None:
        self.pieces.close()


# -- the new tree, from the table ---------------------------------------------------------------------


class _FileData(io.RawIOBase):
    """A file of the new tree, read a chunk at a time from wherever :class:`Sources` finds each, or
    linked to the previous install's (:meth:`link_into`)."""

    def __init__(self, sources: Sources, entry: Entry | None) -> None:
        super().__init__()
        self.sources, self.entry, self.next = sources, entry, 0
        self.chunks = () if entry is None else entry.chunks

    def link_into(self, path: Path, member: tarfile.TarInfo) -> bool:
        """``path`` a hard link to the previous install's file where that is this one exactly
        (:meth:`Previous.link`); else nothing there, and the file is read."""
        return self.entry is not None and self.sources.link(self.entry, path, member.mode)

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1, /) -> bytes:
        """The next chunk (whatever ``size`` asks: safe extraction reads until b"")."""
        if self.next == len(self.chunks):
            return b""
        chunk = self.chunks[self.next]
        self.next += 1
        return self.sources.chunk(chunk)


class Sources:
    """Each chunk from the chunk cache, else the previous install, else (its member being fetched) once
    its member is kept, else fetched from the release now (a chunk the plan took for re-usable whose file
    changed since). ``room``: the compressed bytes such fetches may add to the plan's before the delta
    has fetched more than half of the archive after all, and gives up for the whole release."""

    def __init__(
        self,
        store: ChunkStore,
        previous: Previous,
        fetcher: MemberFetcher,
        fetching: Future[None],
        reporter: Reporter,
        progress: Callable[[int], None],
        room: int,
    ) -> None:
        self.store, self.previous, self.fetcher, self.fetching = store, previous, fetcher, fetching
        self.reporter, self.progress, self.room = reporter, progress, room
        self.reused = 0
        self.linked = 0  # files

    def link(self, entry: Entry, path: Path, mode: int) -> bool:
        if not self.previous.link(entry, path, mode):
            return False
        self.reused += entry.size
        self.linked += 1
        self.progress(entry.size)
        return True

    def chunk(self, chunk: Chunk) -> bytes:
        data = self.store.get(chunk.digest, chunk.size)
        if data is None:
            data = self.previous.read(chunk.digest)
            if data is not None:
                self.reused += chunk.size
        if data is None and chunk.member in self.fetcher.kept:
            self.fetcher.wait_for(chunk.member, self.fetching)
            data = self.store.get(chunk.digest, chunk.size)
        if data is None:
            size = self.fetcher.toc.members[chunk.member].size
            self.room -= size
            if self.room < 0:
                raise DeltaUnavailable(
                    "more than half of the archive changed after all (files of the previous install changed since)"
                )
            with reported_step(self.reporter, "fetch a changed chunk", size, download=True) as progress:
                self.fetcher.fetch([chunk.member], progress)
            data = self.store.get(chunk.digest, chunk.size)
        if data is None:
            raise DeltaUnavailable("a chunk fetched from the release could not be kept in the download cache")
        self.progress(chunk.size)
        return data


class TocArchive:
    """The table's entries as the tar entries :func:`safe_extract` reads (the same checks as a full
    install), each file's bytes from :class:`Sources`."""

    def __init__(self, toc: Toc, sources: Sources) -> None:
        self.toc, self.sources = toc, sources
        self._files: dict[str, Entry] = {}

    def __iter__(self) -> Iterator[tarfile.TarInfo]:
        kinds = {
            "reg": tarfile.REGTYPE,
            "dir": tarfile.DIRTYPE,
            "symlink": tarfile.SYMTYPE,
            "hardlink": tarfile.LNKTYPE,
        }
        for entry in self.toc.entries:
            if entry.name == "." and entry.kind == "dir":
                continue  # the staging directory itself: 0755 once checked, as a full install leaves it
            info = tarfile.TarInfo(entry.name)
            # The mode the release's tar stream gives such an entry, whatever the table says (#51 F7)
            info.type, info.mode, info.mtime = kinds[entry.kind], released_mode(entry.kind, entry.mode), RELEASED_MTIME
            info.size, info.linkname = entry.size, entry.link
            self._files[entry.name] = entry
            yield info

    def extractfile(self, member: tarfile.TarInfo) -> _FileData:
        return _FileData(self.sources, self._files.pop(member.name, None))


@dataclass(frozen=True)
class Plan:
    """What a delta would re-use and fetch (compressed bytes of the new archive)."""

    fetch: list[int]  # members, sorted
    fetch_bytes: int
    reuse_bytes: int  # inflated bytes found in the previous install or the chunk cache


def plan(new: Toc, previous: Previous, store: ChunkStore) -> Plan:
    """The members to fetch: those holding a chunk neither the previous install's table nor the chunk
    cache has (what is there is checked as it is read, and fetched then if it is not what it was)."""
    fetch: set[int] = set()
    reuse = 0
    for _, chunk in new.chunks():
        if chunk.digest in previous.where or store.has(chunk.digest, chunk.size):
            reuse += chunk.size
        else:
            fetch.add(chunk.member)
    members = sorted(fetch)
    return Plan(members, sum(new.members[number].size for number in members), reuse)


def previous_toc(dest: Path) -> Toc:
    """The table the install at ``dest`` was made from (the caller has checked it is ours)."""
    try:
        data = read_small_bytes(dest / KEPT_TOC, MAX_TOC, follow=False)
    except FileNotFoundError:
        raise DeltaUnavailable(f"the install in {dest} keeps no table of contents (an older install)") from None
    except NotSmallFile as err:
        raise DeltaUnavailable(str(err)) from None
    except OSError as err:
        raise DeltaUnavailable(f"cannot read {dest / KEPT_TOC}: {err.strerror}") from None
    try:
        return parse_toc(data)
    except DeltaUnavailable as why:
        raise DeltaUnavailable(f"the previous install's {why}") from None


@dataclass(frozen=True)
class Delta:
    """A delta install's inputs: the new table (checked), the parts, the sha256 of their tar stream,
    where the previous install and the chunk cache are."""

    toc: Toc
    parts: Sequence[Part]
    session: requests.Session | None  # None: the parts are files of a release directory
    tar_sha256: str  # release.json's archive.tar_sha256: what the tree written must hash to
    previous: Path
    store: ChunkStore
    installers_own: Collection[str] = ()  # top-level names in the staging directory that are not the release's
    policy: RetryPolicy = field(default_factory=RetryPolicy)  # the session's: tries, read timeout


def install_delta(delta: Delta, staging: Path, reporter: Reporter, say: Callable[[str], None], source: str) -> Moved:
    """Write the new tree into ``staging`` (empty, marked by the caller) from the previous install's
    chunks and the members fetched; returns what moved. Raises DeltaUnavailable where the whole release
    must be downloaded instead."""
    previous = Previous(delta.previous, previous_toc(delta.previous))
    try:
        archive_size = sum(part.size for part in delta.parts)
        chosen = plan(delta.toc, previous, delta.store)
        if chosen.fetch_bytes > MOST_TO_FETCH * archive_size:
            raise DeltaUnavailable(
                f"{human_size(chosen.fetch_bytes)} of the {human_size(archive_size)} archive changed (more than half)"
            )
        say(
            f"delta: {human_size(chosen.reuse_bytes)} to re-use from the previous install, "
            f"{human_size(chosen.fetch_bytes)} of the {human_size(archive_size)} archive to fetch "
            f"({len(chosen.fetch)} of {len(delta.toc.members)} members)"
        )
        fetcher = MemberFetcher(delta.toc, delta.parts, delta.session, delta.store, policy=delta.policy)
        sources = _assemble_while_fetching(delta, chosen, fetcher, previous, staging, reporter, source)
    finally:
        previous.close()
    check_assembled(delta, staging, reporter)
    staging.chmod(released_mode("dir", 0))
    fetcher.moved.reused, fetcher.moved.linked = sources.reused, sources.linked
    return fetcher.moved


def check_assembled(delta: Delta, staging: Path, reporter: Reporter) -> None:
    """The tree in ``staging``, read back from disk, gives the tar stream the release's parts inflate to
    (release.json ``archive.tar_sha256``, which a full install checks too), else DeltaUnavailable: the
    table of contents did not describe them. Hashing, not compressing: the check no longer needs the
    release's compressor, and costs a read of the tree."""
    total = sum(entry.size for entry in delta.toc.entries if entry.kind == "reg")
    try:
        with reported_step(reporter, "check against the release", total) as checked:
            digest = stream_sha256(staging, leave_out=delta.installers_own, progress=checked)
    except ArchiveError as err:  # a link leaving the tree, a FIFO: never what safe extraction writes
        raise DeltaUnavailable(
            f"the tree assembled from the table of contents is not a release's: {err.message}"
        ) from None
    except OSError as err:  # a file of it replaced while it was read
        raise DeltaUnavailable(f"the tree assembled could not be read back: {err}") from None
    if digest != delta.tar_sha256:
        raise DeltaUnavailable(
            "the tree assembled from the table of contents is not the tar stream of the release's parts "
            "(the table does not describe them)"
        )


def _assemble_while_fetching(
    delta: Delta,
    chosen: Plan,
    fetcher: MemberFetcher,
    previous: Previous,
    staging: Path,
    reporter: Reporter,
    source: str,
) -> Sources:
    """The members of ``chosen`` fetched in the background while the tree is written: the download and the
    writing of what is re-used overlap. If the writing fails (or Ctrl-C), no further request is made and
    the answers in flight are ended, not waited for; a failed fetch is raised once the tree is written (or
    as soon as a file waits for a member it will not bring)."""
    total = sum(chunk.size for _, chunk in delta.toc.chunks())
    background = ThreadPoolExecutor(1)
    try:
        with (
            reported_step(reporter, "fetch what changed", chosen.fetch_bytes, download=True) as fetched,
            reported_step(reporter, "assemble", total) as assembled,
        ):
            fetching = fetcher.in_background(background, chosen.fetch, fetched)
            room = int(MOST_TO_FETCH * sum(part.size for part in delta.parts)) - chosen.fetch_bytes
            sources = Sources(delta.store, previous, fetcher, fetching, reporter, assembled, room)
            try:
                safe_extract(TocArchive(delta.toc, sources), staging, source)
            except UnsafeArchiveError as failure:
                raise DeltaUnavailable(failure.message) from None
            fetching.result()
    except BaseException:
        fetcher.stop()
        background.shutdown(wait=False, cancel_futures=True)
        raise
    background.shutdown()
    return sources
