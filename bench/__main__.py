"""`nox -s bench`: performance measured in one run, against the tools people use today, and printed
(never asserted by tests). Every run is checked: a run that failed is shown as FAILED, and no ratio is
computed from it; the exit status is non-zero when any run failed.

network:   downloads from a throttled loopback server: parallel vs one by one (and curl), a resume after
           a cut, and the lock's hashing of files an index published no sha256 for. Goals: >= 3x.
bundle:    the fixture bundle, a full build from an empty build directory, then nothing changed (< 1 s).
real-size: a bundle grown to --tree-gib (8 GiB: ELF files up to 2 GiB, .kpack blobs, many small .py):
           archive (vs tar | pigz: >= 1.5x at <= 1.01x its size), tier 0, verify-repro's comparison,
           image layers, install (vs Lemonade's way); each in a process of its own, peak RSS < 512 MiB.
delta:     updates over a previous install through one 100 Mbit/s loopback link, as a delta and as a full
           download: vLLM 0.32.0 -> 0.33.0 only (goals: <= 15% of the bytes, <= 10% of the time), the
           source date only (< 1% of the bytes, <= 5% of the time).
release-job: the release workflow's job (lock, bundle --image, tier 0 on the parts) for each of
           --job-targets, its wheels grown to real size: peak disk and memory against the runner's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from tests.upstream.fixture import Fixture
from tests.upstream.server import UpstreamServer

from bench.delta import DeltaBench
from bench.network import bench_fetch, bench_lock_hashless, bench_resume
from bench.pipeline import Pipeline, bench_bundle
from bench.real_size import REPO, RealSize, scratch_problem
from bench.release_job import ReleaseJob, job_scratch_problem
from bench.report import Report
from vllm_bundle.recipes import load_recipes

GROUPS = ("network", "bundle", "delta", "real-size", "release-job")


def _network(work: Path, report: Report) -> None:
    fixture = Fixture(work / "upstream")
    (fixture.root / "files").mkdir(parents=True)
    server = UpstreamServer(fixture.root).start()
    try:
        bench_fetch(server, fixture, work, report)
        bench_resume(server, fixture, work, report)
        bench_lock_hashless(server, fixture, work, report)
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--only", choices=GROUPS, action="append", help="run this group (repeatable; default all)")
    parser.add_argument("--tree-gib", type=float, default=8.0, help="size of the real-size tree (default 8)")
    parser.add_argument("--delta-gib", type=float, default=3.0, help="size of the delta row's trees (default 3)")
    parser.add_argument("--job-targets", nargs="+", default=["gfx1151"], help="release-job's targets (default gfx1151)")
    parser.add_argument(
        "--job-scale", type=float, default=1.0, help="release-job's wheels at this share of real size (default 1)"
    )
    parser.add_argument("--work", type=Path, help="scratch directory (default: a new one in $TMPDIR, removed after)")
    args = parser.parse_args()
    targets = load_recipes(REPO / "recipes").targets
    unknown = sorted(set(args.job_targets) - set(targets))
    if unknown:
        parser.error(f"--job-targets: {', '.join(unknown)} is not a target of recipes/targets.toml")
    if args.work is not None and not args.work.is_dir():
        parser.error(f"--work {args.work} is not a directory (create it, or leave --work out)")
    groups = args.only or list(GROUPS)
    console = Console(width=200)
    with tempfile.TemporaryDirectory(prefix="vllm-bundle-bench-", dir=args.work) as tmp:
        work = Path(tmp)
        size = int(args.tree_gib * 2**30)
        if "real-size" in groups and (problem := scratch_problem(work, size)):
            console.print(
                f"error: {problem} (free some space, pass --work DIR on a bigger disk, or a smaller --tree-gib)"
            )
            return 2
        isas = max(len(targets[name].isas) for name in args.job_targets)
        if "release-job" in groups and (problem := job_scratch_problem(work, args.job_scale, isas)):
            console.print(
                f"error: {problem} (free some space, pass --work DIR on a bigger disk, or a smaller --job-scale)"
            )
            return 2
        report = Report("vllm-bundle bench")
        if "network" in groups:
            _network(work, report)
        if {"bundle", "delta", "real-size", "release-job"} & set(groups):
            pipeline = Pipeline(work)
            try:
                if "bundle" in groups:
                    bench_bundle(pipeline, report)
                if "delta" in groups:
                    DeltaBench(pipeline.bundle(), work, report, int(args.delta_gib * 2**30)).run()
                if "real-size" in groups:
                    RealSize(pipeline.bundle(), work, report, size).run()
                for target in args.job_targets if "release-job" in groups else []:
                    ReleaseJob(work, report, target, args.job_scale).run(pipeline.bundle().root)
            finally:
                pipeline.stop()
        report.print(console)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
