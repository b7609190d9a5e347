"""Downloads against a throttled loopback server: the fetch (files with a pinned sha256), a resume
after a cut, and the lock's hashing of files an index published no sha256 for (``Fetcher.measure_all``,
what ``vllm-bundle lock`` runs for TheRock's hashless pages)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import shutil
from collections.abc import Callable
from pathlib import Path

from tests.upstream.fixture import Fixture, make_blob
from tests.upstream.server import Fault, UpstreamServer

from bench.measure import Outcome, run_child, run_inline
from bench.report import Report, ratio
from vllm_bundle.errors import NetworkError
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.fetch import Artifact, Fetcher
from vllm_bundle.util.policy import RetryPolicy
from vllm_bundle.util.progress import PlainReporter

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


Transfer = Callable[[Fetcher], object]


def _parallel_and_serial(
    server: UpstreamServer, work: Path, name: str, transfer: Transfer, check: Callable[[object], str | None]
) -> tuple[Outcome, Outcome]:
    """``transfer`` through a fetcher with FILES jobs, then with one, each from an empty cache, every
    connection throttled to RATE."""
    server.inject("*", Fault("throttle", times=None, rate=RATE))
    try:
        outcomes = []
        for jobs in (FILES, 1):
            fetcher = _fresh_fetcher(work / f"{name}-j{jobs}", jobs)
            outcomes.append(run_inline(functools.partial(transfer, fetcher), check))
    finally:
        server.reset()
    return outcomes[0], outcomes[1]


def _report_parallel(report: Report, what: str, parallel: Outcome, serial: Outcome, workload: str) -> float | None:
    report.run(f"{what}, parallel (-j{FILES})", parallel, workload, "1.00x")
    one_by_one = ratio(serial, parallel)
    report.run(f"{what}, one by one (-j1)", serial, workload, f"{one_by_one:.2f}x slower" if one_by_one else "")
    return one_by_one


def _after_a_cut(
    server: UpstreamServer, work: Path, path: str, size: int, transfer: Transfer, check: Callable[[object], str | None]
) -> tuple[Outcome, int]:
    """``transfer`` cut at 60 % (one attempt), then again with the same cache: the second run's outcome
    and the bytes it moved."""
    server.inject(path, Fault("cut", after=int(size * 0.6)))
    cache = work / f"cut-{Path(path).name}"
    with contextlib.suppress(NetworkError):  # the cut is the point: the next run resumes
        transfer(_fresh_fetcher(cache, 1, RetryPolicy(attempts=1)))
    again = Fetcher(Cache(cache), PlainReporter(io.StringIO()))
    outcome = run_inline(lambda: transfer(again), check)
    server.reset()
    return outcome, again.bytes_transferred


def _report_resume(report: Report, case: str, outcome: Outcome, moved: int, full: int) -> None:
    report.run(
        case,
        outcome,
        f"full download {full / 2**20:.1f} MiB",
        f"{moved / full:.2f} of full",
        figure=f"{moved / 2**20:.1f} MiB moved",
    )


def bench_fetch(server: UpstreamServer, fixture: Fixture, work: Path, report: Report) -> None:
    blobs = [make_blob(fixture, f"bench{i}.bin", FILE_SIZE) for i in range(FILES)]
    pins = _pins(server, blobs)
    parallel, serial = _parallel_and_serial(server, work, "fetch", lambda f: f.fetch_all(pins), _fetched_all(pins))
    server.inject("*", Fault("throttle", times=None, rate=RATE))
    try:
        curl = _curl(server, blobs, work)
    finally:
        server.reset()
    size = f"{FILES} x {FILE_SIZE // 2**20} MiB @ {RATE // 2**20} MiB/s per connection"
    one_by_one = _report_parallel(report, "fetch", parallel, serial, size)
    if curl is not None:
        versus_curl = ratio(curl, parallel)
        report.run("curl, one by one", curl, size, f"{versus_curl:.2f}x slower" if versus_curl else "")
    report.goal("fetch: parallel >= 3x one by one", None if one_by_one is None else one_by_one >= 3, _x(one_by_one))


def bench_resume(server: UpstreamServer, fixture: Fixture, work: Path, report: Report) -> None:
    blob = make_blob(fixture, "bench-resume.bin", 32 * 1024 * 1024)
    (pin,) = _pins(server, [blob])
    full = blob.stat().st_size
    outcome, moved = _after_a_cut(server, work, f"/files/{blob.name}", full, lambda f: f.fetch_one(pin), _no_check)
    _report_resume(report, "fetch: resume after a cut at 60 %", outcome, moved, full)


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

    parallel, serial = _parallel_and_serial(server, work, "hash", lambda f: f.measure_all(wanted), check)
    size = f"{FILES} x {FILE_SIZE // 2**20} MiB, no sha256 published, @ {RATE // 2**20} MiB/s per connection"
    one_by_one = _report_parallel(report, "lock: hash unpublished files", parallel, serial, size)
    report.goal("lock: parallel >= 3x one by one", None if one_by_one is None else one_by_one >= 3, _x(one_by_one))

    url, first = next(iter(pins.items()))
    outcome, moved = _after_a_cut(
        server,
        work,
        f"/files/{first.filename}",
        FILE_SIZE,
        lambda f: f.measure(first.filename, first.filename, url),
        lambda pin: None if getattr(pin, "sha256", None) == first.sha256 else "the resumed file hashes wrong",
    )
    _report_resume(report, "lock: re-lock after a cut at 60 %", outcome, moved, FILE_SIZE)


def _no_check(_: object) -> None:
    return None


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"
