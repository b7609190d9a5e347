"""`nox -s bench`: performance measured in one run, printed as ratios (never asserted by tests).

fetch:  4 files from a throttled loopback server, fetched in parallel vs one by one (ours with -j4,
        ours with -j1, and curl one by one, the tool people script today). Goal: >= 3x.
resume: bytes transferred to finish a download cut at 60 %, vs a full download.
bundle: full build of the fixture bundle vs a second run with nothing changed. Goal: < 10 s.
archive: our archiver vs `tar --sort=name | gzip -6` (what current releases do) and `| pigz`, on a
        generated tree of realistic content (~2 GiB). Goal: >= 2x faster, at most 5 % larger.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tests.upstream.fixture import Fixture, make_blob
from tests.upstream.server import Fault, UpstreamServer

from vllm_bundle.cache import Cache
from vllm_bundle.errors import NetworkError
from vllm_bundle.fetch import Artifact, Fetcher
from vllm_bundle.progress import PlainReporter
from vllm_bundle.transport import RetryPolicy

FILES = 4
FILE_SIZE = 8 * 1024 * 1024
RATE = 4 * 1024 * 1024  # bytes/s per connection: a slow mirror, as CI runners often see


def _artifacts(server: UpstreamServer, blobs: list[Path]) -> list[Artifact]:
    return [
        Artifact(
            b.name, b.name, f"{server.url}/files/{b.name}", hashlib.sha256(b.read_bytes()).hexdigest(), b.stat().st_size
        )
        for b in blobs
    ]


def _timed(action: Callable[[], object]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def _ours(server: UpstreamServer, blobs: list[Path], jobs: int, work: Path) -> float:
    cache = work / f"cache-j{jobs}"
    shutil.rmtree(cache, ignore_errors=True)
    fetcher = Fetcher(Cache(cache), PlainReporter(io.StringIO()), jobs=jobs)
    return _timed(lambda: fetcher.fetch_all(_artifacts(server, blobs)))


def _curl(server: UpstreamServer, blobs: list[Path], work: Path) -> float | None:
    if not shutil.which("curl"):
        return None
    out = work / "curl"
    out.mkdir(exist_ok=True)

    def run() -> None:
        for blob in blobs:
            subprocess.run(["curl", "-sSf", "-o", str(out / blob.name), f"{server.url}/files/{blob.name}"], check=True)

    return _timed(run)


def bench_fetch(server: UpstreamServer, fixture: Fixture, work: Path, table: Table) -> None:
    blobs = [make_blob(fixture, f"bench{i}.bin", FILE_SIZE) for i in range(FILES)]
    server.inject("*", Fault("throttle", times=None, rate=RATE))
    parallel = _ours(server, blobs, FILES, work)
    serial = _ours(server, blobs, 1, work)
    curl = _curl(server, blobs, work)
    server.reset()
    size = f"{FILES} x {FILE_SIZE // 2**20} MiB @ {RATE // 2**20} MiB/s per connection"
    table.add_row("fetch, parallel (-j4)", f"{parallel:.2f} s", size, "1.00x")
    table.add_row("fetch, one by one (-j1)", f"{serial:.2f} s", size, f"{serial / parallel:.2f}x slower")
    if curl is not None:
        table.add_row("curl, one by one", f"{curl:.2f} s", size, f"{curl / parallel:.2f}x slower")
    verdict = "met" if serial / parallel >= 3 else "NOT met"
    table.add_row("goal: parallel >= 3x one by one", "", "", f"{serial / parallel:.2f}x ({verdict})")


def bench_resume(server: UpstreamServer, fixture: Fixture, work: Path, table: Table) -> None:
    blob = make_blob(fixture, "bench-resume.bin", 32 * 1024 * 1024)
    (artifact,) = _artifacts(server, [blob])
    cut = int(blob.stat().st_size * 0.6)
    server.inject(f"/files/{blob.name}", Fault("cut", after=cut))
    cache = Cache(work / "cache-resume")
    first = Fetcher(cache, PlainReporter(io.StringIO()), policy=RetryPolicy(attempts=1))
    with contextlib.suppress(NetworkError):  # the cut is the point: the next run resumes
        first.fetch_one(artifact)
    resumed = Fetcher(cache, PlainReporter(io.StringIO()))
    resumed.fetch_one(artifact)
    server.reset()
    full = blob.stat().st_size
    table.add_row(
        "resume after a cut at 60 %",
        f"{resumed.bytes_transferred / 2**20:.1f} MiB moved",
        f"full download {full / 2**20:.1f} MiB",
        f"{resumed.bytes_transferred / full:.2f} of full",
    )


def bench_bundle(work: Path, table: Table) -> None:
    """The whole pipeline on the fixture upstream: a full build, then a run with nothing changed."""
    from tests.conftest import TEST_CACHE, TEST_DOWNLOADS, copy_recipes, lock_against, run_cli
    from tests.upstream.fixture import CP, build_fixture
    from tests.upstream.real_wheels import real_wheels

    real = real_wheels(TEST_DOWNLOADS, CP, work / "real")
    fixture = build_fixture(work / "pipeline-upstream", real, cache=TEST_CACHE / "fixture")
    server = UpstreamServer(fixture.root).start()
    try:
        recipes = copy_recipes(work / "recipes")
        locked = lock_against(server, recipes, "gfx1151", work / "pipeline-cache")
        if locked.returncode != 0:
            raise SystemExit(locked.stderr)
        command: list[str | Path] = [
            "bundle",
            "gfx1151",
            "--recipes",
            recipes,
            "--cache-dir",
            work / "pipeline-cache",
            "--mirror",
            f"{server.url}/mirror/",
            "--build-dir",
            work / "build",
            "--plain",
        ]
        full = _timed(lambda: run_cli(*command, timeout=600))
        noop = _timed(lambda: run_cli(*command, timeout=600))
    finally:
        server.stop()
    table.add_row("bundle gfx1151, full build (fixture)", f"{full:.2f} s", "lock done; cache warm", "")
    verdict = "met" if noop < 10 else "NOT met"
    table.add_row(
        "bundle gfx1151, nothing changed",
        f"{noop:.2f} s",
        "every stage cached",
        f"{noop / full:.2f} of full (goal < 10 s: {verdict})",
    )


def make_realistic_tree(root: Path, total: int) -> int:
    """~40 % real ELF libraries, ~30 % Python sources, ~30 % incompressible data (device code, .gz)."""
    import random
    import sysconfig

    elf_sources = sorted(Path("/usr/lib/x86_64-linux-gnu").glob("*.so*")) + sorted(
        Path(sysconfig.get_paths()["platstdlib"], "lib-dynload").glob("*.so")
    )
    elf_sources = [p for p in elf_sources if p.is_file() and not p.is_symlink() and p.stat().st_size > 4096]
    py_sources = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    rng = random.Random(1151)
    written = 0
    for kind, sources, upto in (("lib", elf_sources, 0.4), ("python", py_sources, 0.7)):
        index = 0
        while written < upto * total:
            src = sources[index % len(sources)]
            dest = root / kind / f"copy{index // len(sources)}" / src.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            written += dest.stat().st_size
            index += 1
    blob = 0
    while written < total:
        dest = root / "data" / f".kpack{blob // 64}" / f"blob{blob}.bin"
        dest.parent.mkdir(parents=True, exist_ok=True)
        size = min(32 * 2**20, total - written)
        dest.write_bytes(rng.randbytes(size))
        written += size
        blob += 1
    return written


def _tar_pipe(root: Path, compressor: list[str], out: Path) -> float:
    command = (
        f"tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C {root} -cf - . | "
        f"{' '.join(compressor)} > {out}"
    )
    return _timed(lambda: subprocess.run(command, shell=True, check=True))


def bench_archive(work: Path, table: Table, size_gib: float) -> None:
    from vllm_bundle.archive import write_archive

    root = work / "tree"
    total = make_realistic_tree(root, int(size_gib * 2**30))
    ours_dir = work / "ours"
    ours = _timed(lambda: write_archive(root, ours_dir, "bench", 0))
    ours_size = sum(p.stat().st_size for p in ours_dir.iterdir())
    gzip_time = _tar_pipe(root, ["gzip", "-6"], work / "gzip.tar.gz")
    gzip_size = (work / "gzip.tar.gz").stat().st_size
    workload = f"{total / 2**30:.2f} GiB tree (ELF, .py, random)"
    table.add_row(
        "archive: ours (zlib-ng, 8 workers, level 6)",
        f"{ours:.1f} s, {ours_size / 2**20:.0f} MiB",
        workload,
        f"{gzip_time / ours:.2f}x faster than tar|gzip -6, size {ours_size / gzip_size:.3f}x",
    )
    table.add_row(
        "archive: tar --sort=name | gzip -6",
        f"{gzip_time:.1f} s, {gzip_size / 2**20:.0f} MiB",
        workload,
        "1.00x (what current releases do)",
    )
    if shutil.which("pigz"):
        pigz_time = _tar_pipe(root, ["pigz", "-6"], work / "pigz.tar.gz")
        pigz_size = (work / "pigz.tar.gz").stat().st_size
        table.add_row(
            "archive: tar --sort=name | pigz -6",
            f"{pigz_time:.1f} s, {pigz_size / 2**20:.0f} MiB",
            workload,
            f"{gzip_time / pigz_time:.2f}x faster than gzip",
        )
    else:
        table.add_row("archive: tar | pigz", "not installed", workload, "apt-get install pigz to compare")
    met = gzip_time / ours >= 2 and ours_size <= gzip_size * 1.05
    table.add_row("goal: >= 2x faster than tar|gzip -6, <= 5 % larger", "", "", "met" if met else "NOT met")
    shutil.rmtree(root)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--archive-gib", type=float, default=2.0, help="size of the archive benchmark's tree")
    parser.add_argument("--only", choices=["fetch", "bundle", "archive"], help="run one group")
    args = parser.parse_args()
    console = Console(width=150)
    with tempfile.TemporaryDirectory(prefix="vllm-bundle-bench-") as tmp:
        work = Path(tmp)
        fixture = Fixture(work / "upstream")
        (fixture.root / "files").mkdir(parents=True)
        server = UpstreamServer(fixture.root).start()
        table = Table(title="vllm-bundle bench")
        for column in ("case", "time / bytes", "workload", "ratio"):
            table.add_column(column)
        try:
            if args.only in (None, "fetch"):
                bench_fetch(server, fixture, work, table)
                bench_resume(server, fixture, work, table)
            if args.only in (None, "bundle"):
                bench_bundle(work, table)
            if args.only in (None, "archive"):
                bench_archive(work, table, args.archive_gib)
        finally:
            server.stop()
        console.print(table)


if __name__ == "__main__":
    main()
