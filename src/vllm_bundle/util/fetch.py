"""The fetcher: pinned artifacts into the verified cache, in parallel, resumably.

Every artifact has a sha256 (and usually a size). Bytes are written to a partial file, checked
against the pin and only then renamed into the content-addressed cache, so bad bytes never enter it.
An interrupted body is resumed with an HTTP Range request guarded by If-Range; a server that ignores
Range gets a clean restart. A per-blob file lock lets concurrent builds share one cache.

requests/urllib3 do the HTTP and the per-request retries; what is hand-written here is what they do
not do: resuming a body across broken connections, validating Content-Range, and the cache protocol.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote, urlsplit

import requests
import urllib3

from vllm_bundle.errors import (
    BundleError,
    CorruptCacheError,
    DiskFullError,
    FetchError,
    HashMismatchError,
    NetworkError,
    OfflineMissingError,
)
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.fsutil import sha256_file
from vllm_bundle.util.locks import held
from vllm_bundle.util.policy import RetryPolicy
from vllm_bundle.util.progress import Reporter, human_size
from vllm_bundle.util.transport import (
    RETRY_STATUSES,
    check_url,
    describe,
    is_connect_failure,
    make_session,
    range_answer_problem,
    retrying,
)

CHUNK = 1 << 20
SHOWN_MISSING = 8  # artifacts named in an --offline refusal (the rest are counted)
UNREACHABLE_HINT = "check the network, or use --mirror URL|DIR, or --offline with a filled cache"


@dataclass(frozen=True)
class Artifact:
    """One pinned input: where it lives upstream and what its bytes must be."""

    name: str
    filename: str
    url: str
    sha256: str
    size: int | None = None


@dataclass(frozen=True)
class Source:
    """Where to read an artifact from this time: an URL (with the headers its host wants, such as a
    registry's token) or a file in a local mirror directory."""

    url: str | None = None
    path: Path | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.url or str(self.path)


def mirror_source(mirror: str | None, artifact: Artifact) -> Source:
    """The artifact's upstream URL, or the same file name under ``--mirror`` (an URL or a directory)."""
    if mirror is None:
        return Source(url=artifact.url)
    scheme = urlsplit(mirror).scheme
    if scheme in ("http", "https"):
        return Source(url=mirror.rstrip("/") + "/" + quote(artifact.filename))
    base = Path(mirror[len("file://") :] if scheme == "file" else mirror)
    return Source(path=base / artifact.filename)


def host_of(url: str) -> str:
    """``host[:port]`` of ``url``, without the userinfo (a password or token is never printed)."""
    return urlsplit(url).netloc.rpartition("@")[2]


def _strong_validator(response: requests.Response) -> str | None:
    """If-Range needs a strong validator: an ETag that is not weak, else Last-Modified."""
    etag = response.headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return response.headers.get("Last-Modified")


def require_sha256(path: Path, sha256: str, filename: str) -> None:
    """A stage checks its input's bytes before using them: a cache damaged after the download (a disk
    error, a cache restored from elsewhere) must not end up in a bundle stamped complete."""
    actual = sha256_file(path)
    if actual != sha256:
        raise CorruptCacheError(
            f"{filename} in the download cache does not match its sha256 (expected {sha256[:16]}…, got {actual[:16]}…)",
            "run again with --verify-cache to fetch it again",
        )


class _Cancelled(BaseException):
    """The run was interrupted; the partial file is kept for the next run to resume."""


class _BodyBroken(Exception):
    """The connection broke off mid-body; what was written so far is kept for a resume."""


class Fetcher:
    def __init__(
        self,
        cache: Cache,
        reporter: Reporter,
        *,
        policy: RetryPolicy | None = None,
        mirror: str | None = None,
        offline: bool = False,
        jobs: int = 4,
        verify_cached: bool = False,
    ) -> None:
        self.cache = cache
        self.reporter = reporter
        self.policy = policy or RetryPolicy()
        self.mirror = mirror
        self.offline = offline
        self.jobs = max(1, jobs)
        self.verify_cached = verify_cached  # re-hash cache hits (a cache restored from elsewhere)
        self.session = make_session(self.policy, pool_size=self.jobs)
        self.bytes_transferred = 0  # body bytes received over the network in this run
        self.cancelled = threading.Event()  # set on Ctrl-C: downloads in flight stop at their next chunk

    # -- public API -------------------------------------------------------------------------

    def missing(self, artifacts: Iterable[Artifact]) -> list[Artifact]:
        return [a for a in artifacts if not self.cache.has(a.sha256, a.size)]

    def fetch_all(self, artifacts: Sequence[Artifact]) -> dict[str, Path]:
        """Fetch every artifact (in parallel); returns sha256 -> cached path. Raises on any failure."""
        unique = list({a.sha256: a for a in artifacts}.values())
        if self.offline:
            self._require_cached(unique)
        errors: list[BundleError] = []
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        try:
            futures = {pool.submit(self.fetch_one, a): a for a in unique}
            for future in as_completed(futures):
                err = future.exception() if not future.cancelled() else None
                if err is None:
                    continue
                if not isinstance(err, BundleError):
                    raise err
                errors.append(err)
                self.reporter.note(f"failed {futures[future].filename}: {err}")
                if isinstance(err, NetworkError | DiskFullError):  # the rest would fail alike
                    for pending in futures:
                        pending.cancel()
        except BaseException:
            # Ctrl-C (or a bug): stop now, not after every download in flight. Workers see the flag at
            # their next chunk; what they wrote so far stays as resumable partial files.
            self.cancelled.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        if errors:
            raise self._summarise(errors)
        return {a.sha256: self.cache.blob(a.sha256) for a in unique}

    def fetch_one(self, artifact: Artifact, source: Source | None = None) -> Path:
        """Fetch one artifact from ``source`` (default: upstream, or --mirror) into the cache."""
        if self._cached(artifact):
            return self.cache.blob(artifact.sha256)
        if self.offline:
            self._require_cached([artifact])
        source = source or mirror_source(self.mirror, artifact)
        if source.url:
            check_url(source.url)
        with self._locked(artifact):
            if self.cache.has(artifact.sha256, artifact.size):  # another process finished it meanwhile
                return self.cache.blob(artifact.sha256)
            partial = self.cache.partial(artifact.sha256)
            have = partial.stat().st_size if partial.exists() else 0
            self.reporter.begin(artifact.filename, artifact.filename, artifact.size, have)
            status = "error"
            try:
                with self.cache.disk_full(artifact.sha256, artifact.filename):
                    self._transfer(artifact, source, partial)
                    self._verify(artifact, partial, source)
                    path = self.cache.commit(artifact.sha256)
                status = "done"
                return path
            except HashMismatchError:
                self.cache.discard_partial(artifact.sha256)
                raise
            except OSError as err:
                raise self._write_error(artifact, err) from None
            finally:
                self.reporter.finish(artifact.filename, status)

    def measure(self, name: str, filename: str, url: str, source: Source | None = None) -> Artifact:
        """Pin a file nobody published a sha256 for: download it (from ``source``, a --mirror, when given)
        through the same resumable, retried path as every download, hash the bytes, keep them in the cache
        under that hash (so the fetch that follows costs nothing) and return the pin, which names ``url``.
        Until the hash is known, the partial file is named by a hash of where the bytes come from."""
        source = source or Source(url=url)
        where = hashlib.sha256(str(source).encode()).hexdigest()
        pending = Artifact(name, filename, url, where)
        if source.url:
            check_url(source.url)
        with self._locked(pending):
            partial = self.cache.partial(where)
            have = partial.stat().st_size if partial.exists() else 0
            self.reporter.begin(filename, filename, None, have)
            status = "error"
            try:
                with self.cache.disk_full(where, filename):
                    self._transfer(pending, source, partial)
                    sha256, size = sha256_file(partial), partial.stat().st_size
                    self.cache.commit(where, sha256)
                status = "done"
                return Artifact(name, filename, url, sha256, size)
            except OSError as err:
                raise self._write_error(pending, err) from None
            finally:
                self.reporter.finish(filename, status)

    def measure_all(self, wanted: Sequence[tuple[str, str, str]]) -> dict[str, Artifact]:
        """``measure`` each ``(name, filename, url)``, several at a time; returns url -> pin."""
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        try:
            futures = [pool.submit(self.measure, *item) for item in dict.fromkeys(wanted)]
            pins = [future.result() for future in futures]
        except BaseException:
            self.cancelled.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return {pin.url: pin for pin in pins}

    def _cached(self, artifact: Artifact) -> bool:
        """A cache hit; with ``verify_cached``, one whose bytes still hash to the pin (else dropped)."""
        if not self.cache.has(artifact.sha256, artifact.size):
            return False
        if not self.verify_cached or sha256_file(self.cache.blob(artifact.sha256)) == artifact.sha256:
            return True
        self.reporter.note(f"cached {artifact.filename} does not match its sha256; dropped, downloading again")
        self.cache.blob(artifact.sha256).unlink(missing_ok=True)
        return False

    def __enter__(self) -> Fetcher:
        self.reporter.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.reporter.__exit__(*exc)
        self.session.close()

    # -- internals --------------------------------------------------------------------------

    def _require_cached(self, artifacts: Sequence[Artifact]) -> None:
        missing = self.missing(artifacts)
        if missing:
            shown = [a.filename for a in missing[:SHOWN_MISSING]]
            more = f" and {len(missing) - len(shown)} more" if len(missing) > len(shown) else ""
            raise OfflineMissingError(
                f"--offline: {len(missing)} artifact(s) missing from the cache {self.cache.root}: "
                f"{', '.join(shown)}{more}",
                "run once without --offline (or with --mirror) to fill the cache",
            )

    @staticmethod
    def _summarise(errors: list[BundleError]) -> BundleError:
        if len(errors) == 1:
            return errors[0]
        first = errors[0]
        summary = type(first)(f"{len(errors)} downloads failed; first: {first.message}", first.hint)
        return summary

    @contextmanager
    def _locked(self, artifact: Artifact) -> Iterator[None]:
        waiting = f"wait   {artifact.filename}: another process is downloading it"
        with held(self.cache.lock(artifact.sha256), lambda: self.reporter.note(waiting)):
            yield

    def _verify(self, artifact: Artifact, partial: Path, source: Source) -> None:
        size = partial.stat().st_size
        actual = sha256_file(partial)
        if actual == artifact.sha256 and (artifact.size is None or size == artifact.size):
            return
        self.cache.discard_partial(artifact.sha256)
        size_note = f", size {size} (expected {artifact.size})" if artifact.size not in (None, size) else ""
        raise HashMismatchError(
            f"hash mismatch for {artifact.filename} from {source}: expected sha256 {artifact.sha256}, "
            f"got {actual}{size_note}; the bytes were discarded",
            "the source serves different bytes than the lock pins: check the mirror, or re-lock",
        )

    def _write(self, artifact: Artifact, out: BinaryIO, chunks: Iterable[bytes]) -> None:
        written = out.tell()
        for chunk in chunks:
            if self.cancelled.is_set():
                raise _Cancelled
            view = memoryview(chunk)
            while view:  # an unbuffered file may take part of a chunk at a time
                view = view[out.write(view) or 0 :]
            written += len(chunk)
            self.reporter.advance(artifact.filename, len(chunk))
            if artifact.size is not None and written > artifact.size:
                raise HashMismatchError(
                    f"{artifact.filename} is larger than its pinned size {artifact.size}; the bytes were discarded",
                    "the source serves different bytes than the lock pins: check the mirror, or re-lock",
                )
        out.flush()

    def _transfer(self, artifact: Artifact, source: Source, partial: Path) -> None:
        if source.path is not None:
            self._copy_local(artifact, source.path)
        else:
            assert source.url is not None
            self._download(artifact, source, partial)

    def _write_error(self, artifact: Artifact, err: OSError) -> BundleError:
        """A write into the cache failed for another reason than a full disk."""
        return FetchError(
            f"cannot write {artifact.filename} into the cache {self.cache.root}: {err.strerror}",
            "check the permissions of --cache-dir / $VLLM_BUNDLE_CACHE_DIR",
        )

    def _copy_local(self, artifact: Artifact, path: Path) -> None:
        if not path.is_file():
            raise FetchError(
                f"{artifact.filename} is not in the mirror directory {path.parent}",
                "copy it there, or fetch without --mirror",
            )
        with path.open("rb") as src, self.cache.open_partial(artifact.sha256) as out:
            self._write(artifact, out, iter(lambda: src.read(CHUNK), b""))

    def _download(self, artifact: Artifact, source: Source, partial: Path) -> None:
        assert source.url is not None
        url = source.url
        meta_path = self.cache.partial_meta(artifact.sha256)

        def kept() -> int:
            return partial.stat().st_size if partial.exists() else 0

        def once() -> None:
            """One request, resuming from what the partial file holds (and the validator it came with)."""
            validator = self._load_validator(meta_path, url)
            have = kept()
            if artifact.size is not None and have >= artifact.size:
                if have == artifact.size:
                    return
                self.cache.discard_partial(artifact.sha256)  # longer than the pin: cannot be right
                have = 0
            self._download_once(artifact, source, partial, have, validator)

        try:
            retrying(
                self.policy,
                once,
                lambda err: isinstance(err, _BodyBroken),
                on_failure=lambda err, failures: self.reporter.restart(artifact.filename, kept(), str(err)),
            )
        except _BodyBroken as err:
            raise NetworkError(
                f"download of {artifact.filename} from {host_of(url)} kept breaking off "
                f"({err}); {human_size(kept())} kept for resuming",
                "run the same command again to resume, or " + UNREACHABLE_HINT,
            ) from None

    def _request(self, artifact: Artifact, url: str, headers: dict[str, str]) -> requests.Response:
        try:
            return self.session.get(url, headers=headers, stream=True)
        except requests.RequestException as err:
            if is_connect_failure(err):
                raise NetworkError(
                    f"cannot reach {host_of(url)} to download {artifact.filename}: {describe(err)}",
                    UNREACHABLE_HINT,
                ) from None
            raise _BodyBroken(describe(err)) from None

    def _download_once(
        self,
        artifact: Artifact,
        source: Source,
        partial: Path,
        have: int,
        validator: str | None,
    ) -> None:
        assert source.url is not None
        url = source.url
        headers = dict(source.headers)
        if have:
            headers["Range"] = f"bytes={have}-"
            if validator:
                headers["If-Range"] = validator
        with self._request(artifact, url, headers) as response:
            self._check_status(artifact, url, response, have)
            resuming = bool(have) and response.status_code == 206
            if resuming and (problem := range_answer_problem(response, have, None, artifact.size)):
                self.cache.discard_partial(artifact.sha256)
                raise _BodyBroken(f"server answered an unusable range: {problem}")
            if have and not resuming:
                self.reporter.restart(artifact.filename, 0, "server ignored the range request; restarting")
            self.cache.write_partial_meta(artifact.sha256, {"url": url, "validator": _strong_validator(response)})
            with self.cache.open_partial(artifact.sha256, append=resuming, buffering=0) as out:
                try:
                    self._write(artifact, out, self._body(response))
                except (requests.RequestException, urllib3.exceptions.HTTPError) as err:
                    raise _BodyBroken(describe(err)) from None
        got = partial.stat().st_size
        if artifact.size is not None and got < artifact.size:
            raise _BodyBroken(f"body ended at {got} of {artifact.size} bytes")

    def _body(self, response: requests.Response) -> Iterator[bytes]:
        """Body bytes as they arrive. ``read1`` hands over what is buffered before a connection
        breaks (``iter_content`` would drop the half-read chunk), so a resume loses nothing."""
        while chunk := response.raw.read1(CHUNK):
            self.bytes_transferred += len(chunk)
            yield chunk

    def _check_status(self, artifact: Artifact, url: str, response: requests.Response, have: int) -> None:
        status = response.status_code
        if status in (200, 206):
            return
        if status == 416 and have:
            self.cache.discard_partial(artifact.sha256)
            raise _BodyBroken("server refused the range of our partial file; starting over")
        if status in RETRY_STATUSES:
            raise NetworkError(
                f"{host_of(url)} kept answering HTTP {status} for {artifact.filename} "
                f"after {self.policy.attempts} attempts",
                "try again later, or " + UNREACHABLE_HINT,
            )
        if status == 404:
            raise FetchError(
                f"{artifact.filename} not found at {url} (HTTP 404)",
                "the mirror may lack it, or the lock is stale: re-lock with `nox -s lock`",
            )
        raise FetchError(f"HTTP {status} {response.reason} for {url}")

    @staticmethod
    def _load_validator(meta_path: Path, url: str) -> str | None:
        """The ETag or date a partial file came with, if it came from ``url`` (a damaged or foreign meta
        file only costs the resume's If-Range guard: the bytes are still checked against the pin)."""
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("url") != url:
            return None
        validator = meta.get("validator")
        return validator if isinstance(validator, str) and validator.isprintable() else None
