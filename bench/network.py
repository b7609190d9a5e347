"""Downloads against a throttled loopback server: the fetch (files with a pinned sha256), a resume
after a cut, and the lock's hashing of files an index published no sha256 for (``Fetcher.measure_all``,
what ``vllm-bundle lock`` runs for TheRock's hashless pages)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import shutil
from collections.abc import Callable
from pathlib import Path

from tests.upstream.fixture import Fixture, make_blob
from tests.upstream.server import Fault, UpstreamServer

from bench.measure import Outcome, run_child, run_inline
from bench.report import Report, ratio
from vllm_bundle.cache import Cache
from vllm_bundle.errors import NetworkError
from vllm_bundle.fetch import Artifact, Fetcher
from vllm_bundle.progress import PlainReporter
from vllm_bundle.transport import RetryPolicy

FILES = 4
FILE_SIZE = 8 * 1024 * 1024
RATE = 4 * 1024 * 1024  # bytes/s per connection: a slow mirror, as CI runners often see


def _pins(server: UpstreamServer, blobs: list[Path]) -> list[Artifact]:
    return [
        Artifact(
            b.name, b.name, f"{server.url}/files/{b.name}", hashlib.sha256(b.read_bytes()).hexdigest(), b.stat().st_size
        )
        for b in blobs
    ]


def _fresh_fetcher(cache: Path, jobs: int, policy: RetryPolicy | None = None) -> Fetcher:
    shutil.rmtree(cache, ignore_errors=True)
    return Fetcher(Cache(cache), PlainReporter(io.StringIO()), jobs=jobs, policy=policy or RetryPolicy())


def _fetched_all(pins: list[Artifact]) -> Callable[[object], str | None]:
    """A check of what ``fetch_all`` returned (sha256 -> path): every pin is in it."""

    def check(result: object) -> str | None:
        got = set(result) if isinstance(result, dict) else set()
        missing = [p.filename for p in pins if p.sha256 not in got]
        return f"not fetched: {', '.join(missing)}" if missing else None

    return check


def _curl(server: UpstreamServer, blobs: list[Path], work: Path) -> Outcome | None:
    if not shutil.which("curl"):
        return None
    out = work / "curl"
    out.mkdir(exist_ok=True)
    script = " && ".join(f"curl -sSf -o {out / b.name} {server.url}/files/{b.name}" for b in blobs)
    return run_child(["bash", "-c", script], logs=work / "logs" / "curl", timeout=300)


def bench_fetch(server: UpstreamServer, fixture: Fixture, work: Path, report: Report) -> None:
    blobs = [make_blob(fixture, f"bench{i}.bin", FILE_SIZE) for i in range(FILES)]
    pins = _pins(server, blobs)
    check = _fetched_all(pins)
    server.inject("*", Fault("throttle", times=None, rate=RATE))
    try:
        parallel_fetcher = _fresh_fetcher(work / "cache-j4", FILES)
        parallel = run_inline(lambda: parallel_fetcher.fetch_all(pins), check)
        serial_fetcher = _fresh_fetcher(work / "cache-j1", 1)
        serial = run_inline(lambda: serial_fetcher.fetch_all(pins), check)
        curl = _curl(server, blobs, work)
    finally:
        server.reset()
    size = f"{FILES} x {FILE_SIZE // 2**20} MiB @ {RATE // 2**20} MiB/s per connection"
    report.run("fetch, parallel (-j4)", parallel, size, "1.00x")
    one_by_one = ratio(serial, parallel)
    report.run("fetch, one by one (-j1)", serial, size, f"{one_by_one:.2f}x slower" if one_by_one else "")
    if curl is not None:
        versus_curl = ratio(curl, parallel)
        report.run("curl, one by one", curl, size, f"{versus_curl:.2f}x slower" if versus_curl else "")
    report.goal("fetch: parallel >= 3x one by one", None if one_by_one is None else one_by_one >= 3, _x(one_by_one))


def bench_resume(server: UpstreamServer, fixture: Fixture, work: Path, report: Report) -> None:
    blob = make_blob(fixture, "bench-resume.bin", 32 * 1024 * 1024)
    (pin,) = _pins(server, [blob])
    server.inject(f"/files/{blob.name}", Fault("cut", after=int(blob.stat().st_size * 0.6)))
    cache = work / "cache-resume"
    first = _fresh_fetcher(cache, 1, RetryPolicy(attempts=1))
    with contextlib.suppress(NetworkError):  # the cut is the point: the next run resumes
        first.fetch_one(pin)
    resumed = Fetcher(Cache(cache), PlainReporter(io.StringIO()))
    outcome = run_inline(lambda: resumed.fetch_one(pin))
    server.reset()
    full = blob.stat().st_size
    moved = resumed.bytes_transferred
    report.run(
        "fetch: resume after a cut at 60 %",
        outcome,
        f"full download {full / 2**20:.1f} MiB",
        f"{moved / full:.2f} of full",
        figure=f"{moved / 2**20:.1f} MiB moved",
    )


def bench_lock_hashless(server: UpstreamServer, fixture: Fixture, work: Path, report: Report) -> None:
    """The lock's downloads of files whose index page gives no sha256: several at a time vs one by one,
    each result checked against the bytes' real hash; then how much a cut costs a second lock."""
    blobs = [make_blob(fixture, f"hashless{i}.whl", FILE_SIZE) for i in range(FILES)]
    pins = {p.url: p for p in _pins(server, blobs)}
    wanted = [(p.filename, p.filename, url) for url, p in pins.items()]

    def check(result: object) -> str | None:
        got = result if isinstance(result, dict) else {}
        wrong = [p.filename for url, p in pins.items() if url not in got or got[url].sha256 != p.sha256]
        return f"wrong or missing pins: {', '.join(wrong)}" if wrong else None

    server.inject("*", Fault("throttle", times=None, rate=RATE))
    try:
        parallel_fetcher = _fresh_fetcher(work / "hash-j4", FILES)
        parallel = run_inline(lambda: parallel_fetcher.measure_all(wanted), check)
        serial_fetcher = _fresh_fetcher(work / "hash-j1", 1)
        serial = run_inline(lambda: serial_fetcher.measure_all(wanted), check)
    finally:
        server.reset()
    size = f"{FILES} x {FILE_SIZE // 2**20} MiB, no sha256 published, @ {RATE // 2**20} MiB/s per connection"
    report.run("lock: hash unpublished files, parallel (-j4)", parallel, size, "1.00x")
    one_by_one = ratio(serial, parallel)
    report.run(
        "lock: hash unpublished files, one by one", serial, size, f"{one_by_one:.2f}x slower" if one_by_one else ""
    )
    report.goal("lock: parallel >= 3x one by one", None if one_by_one is None else one_by_one >= 3, _x(one_by_one))

    first_url, first = next(iter(pins.items()))
    server.inject(f"/files/{first.filename}", Fault("cut", after=int(FILE_SIZE * 0.6)))
    cut_fetcher = _fresh_fetcher(work / "hash-resume", 1, RetryPolicy(attempts=1))
    with contextlib.suppress(NetworkError):
        cut_fetcher.measure(first.filename, first.filename, first_url)
    again = Fetcher(Cache(work / "hash-resume"), PlainReporter(io.StringIO()))
    outcome = run_inline(
        lambda: again.measure(first.filename, first.filename, first_url),
        lambda pin: None if getattr(pin, "sha256", None) == first.sha256 else "the resumed file hashes wrong",
    )
    server.reset()
    full = FILE_SIZE
    report.run(
        "lock: re-lock after a cut at 60 %",
        outcome,
        f"full download {full / 2**20:.1f} MiB",
        f"{again.bytes_transferred / full:.2f} of full",
        figure=f"{again.bytes_transferred / 2**20:.1f} MiB moved",
    )


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"
