"""The whole pipeline on the fixture upstream (a ROCm build of real vLLM 0.33.0's kernels with clang-19,
as the tests build it): a full build from an empty build directory, then a run with nothing changed."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import PART_SIZE, TEST_CACHE, TEST_DOWNLOADS, bundle_args, copy_recipes, lock_against
from tests.upstream.fixture import CP, build_fixture
from tests.upstream.real_wheels import real_wheels
from tests.upstream.server import UpstreamServer
from tests.upstream.stand_ins import host_compiler

from bench.measure import Outcome, run_child
from bench.report import Report, seconds_and_rss

TARGET = "gfx1151"


@dataclass(frozen=True)
class FixtureBundle:
    root: Path  # build/gfx1151/root
    release: Path  # bundles/<tag>: the release assets
    recipes: Path


def host_compilers(bin_dir: Path) -> Path:
    """This machine's g++ compiling the stand-ins of vLLM's units, first on the build's PATH, as the suite
    sets it up for a build with --no-builder (tests/conftest.py host_compiler_stand_ins): without it the
    fixture's sources reach for CUDA headers the fake SDK does not have."""
    real = shutil.which("g++")
    if real is None:
        raise SystemExit("bench: the fixture build needs g++ (apt-get install g++)")
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "g++").write_text(host_compiler(str(Path(real).resolve())))
    (bin_dir / "g++").chmod(0o755)
    return bin_dir


class Pipeline:
    """The fixture upstream served on loopback, its recipes locked once; builds on demand."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.env = {**os.environ, "PATH": f"{host_compilers(work / 'host-compilers')}{os.pathsep}{os.environ['PATH']}"}
        real = real_wheels(TEST_DOWNLOADS, CP, work / "real")
        fixture = build_fixture(work / "pipeline-upstream", real, cache=TEST_CACHE / "fixture")
        self.server = UpstreamServer(fixture.root).start()
        self.recipes = copy_recipes(work / "recipes")
        self.cache = work / "pipeline-cache"
        locked = lock_against(self.server, self.recipes, TARGET, self.cache)
        if locked.returncode != 0:
            self.server.stop()
            raise SystemExit(f"bench: cannot lock the fixture upstream: {locked.stderr.strip().splitlines()[-1]}")
        self._built: FixtureBundle | None = None

    def stop(self) -> None:
        self.server.stop()

    def build(self, build: Path) -> Outcome:
        """``vllm-bundle bundle gfx1151`` into ``build``; succeeded means exit 0 and a release on disk."""
        args = bundle_args(self.recipes, self.server, build, self.cache)
        outcome = run_child(
            [sys.executable, "-m", "vllm_bundle", *args],
            logs=self.work / "logs" / build.name,
            env=self.env,
            timeout=1800,
        )
        if outcome.ok and not any((build.parent / "bundles").glob("*/release.json")):
            return Outcome(outcome.seconds, outcome.peak_rss, "exit 0 but no release.json was written")
        return outcome

    def bundle(self) -> FixtureBundle:
        """A built fixture bundle (built once, the first time it is asked for)."""
        if self._built is None:
            build = self.work / "shared" / "build"
            outcome = self.build(build)
            if not outcome.ok:
                raise SystemExit(f"bench: the fixture bundle does not build: {outcome.error}")
            (release,) = (build.parent / "bundles").glob("*/release.json")
            self._built = FixtureBundle(build / TARGET / "root", release.parent, self.recipes)
        return self._built


def bench_bundle(pipeline: Pipeline, report: Report) -> None:
    build = pipeline.work / "bench-build" / "build"
    full = pipeline.build(build)
    noop = pipeline.build(build) if full.ok else Outcome(0, None, "not run: the full build failed")
    workload = f"lock done, download cache warm, parts of {PART_SIZE // 2**20} MiB"
    report.run("bundle gfx1151, full build (fixture)", full, f"empty build directory; {workload}")
    share = f"{noop.seconds / full.seconds:.2f} of full" if full.ok and noop.ok else ""
    report.run("bundle gfx1151, nothing changed", noop, "every stage cached", share)
    report.goal("bundle: nothing changed < 1 s", noop.seconds < 1 if noop.ok else None, seconds_and_rss(noop))
