"""The release workflow's job for one target at real size, for its peak disk and memory: does it fit the
runner `.github/workflows/release.yml` names? The fixture upstream's wheels are grown to real size
(:mod:`bench.inflate`) before the lock, then the job runs as the workflow runs it, each step the real
command in a process of its own:

1. ``lock <target>`` against the grown indexes (the refresh-locks job; the release job checks the lock);
2. ``bundle <target> --image``: download, build vLLM, assemble, tier 0, archive, OCI image (the
   workflow's "Build, qualify (tier 0), archive and write the image" step);
3. ``qualify <assets>``: tier 0 again, on the parts as installers receive them.

A sampler reads, every quarter second, the disk used on the work directory's file system (over what it
was before the job) and the memory of the job's processes (the sum of their resident sets, every
process of the job's session: shared pages are counted once per process, so the sum errs high)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from tests.conftest import TEST_CACHE, TEST_DOWNLOADS, TEST_REPO, copy_recipes
from tests.upstream.fixture import CP, PYPI, THEROCK_NEXT, build_fixture
from tests.upstream.real_wheels import real_wheels
from tests.upstream.registry import RegistryServer, push_base, write_base_layout
from tests.upstream.server import UpstreamServer

from bench.inflate import grow_wheels, locked_wheels
from bench.measure import Outcome, run_child
from bench.real_size import REPO
from bench.report import Report
from vllm_bundle.manifests import RELEASE_JSON

GiB = 2**30
#: GitHub's ubuntu-24.04 runner for public repositories (docs/ci.md cites the figures).
RUNNER_MEMORY = 16 * 10**9
RUNNER_DISK = 14 * 10**9
SAMPLE_EVERY = 0.25
#: Free disk a job needs at --job-scale 1: its peak (docs/ci.md: 19.6 GiB measured for gfx1151, about 31
#: for the four ISAs of gfx110X) and the grown upstream it is served from, with room.
JOB_SCRATCH = 30 * GiB
JOB_SCRATCH_PER_ISA = 3 * GiB


def release_need_bytes() -> int:
    """The free disk release.yml's bundle job makes sure of before building (its step's NEED_GB)."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    needs = [
        int(step["env"]["NEED_GB"]) for step in workflow["jobs"]["bundle"]["steps"] if "NEED_GB" in step.get("env", {})
    ]
    if len(needs) != 1:
        raise SystemExit("bench: release.yml's bundle job has no one NEED_GB (its step that frees the disk)")
    return needs[0] * 10**9


def job_scratch_problem(work: Path, scale: float, isas: int) -> str | None:
    """Too little free disk for a job of this many ISAs at this scale, said in a line; or None."""
    free, need = shutil.disk_usage(work).free, int((JOB_SCRATCH + JOB_SCRATCH_PER_ISA * (isas - 1)) * scale)
    if free >= need:
        return None
    return f"{work} has {free / GiB:.1f} GiB free; a release job at scale {scale:g} needs {need / GiB:.1f} GiB"


def _used_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def _job_rss(root: int) -> int:
    """The summed resident set of every process below the bench (``root``) that is not in the bench's
    session: the job's steps run in sessions of their own (bench.measure), the bench's servers do not."""
    page = os.sysconf("SC_PAGE_SIZE")
    parents: dict[int, int] = {}
    sessions: dict[int, int] = {}
    resident: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            statm = Path(entry.path, "statm").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        pid = int(entry.name)
        parents[pid], sessions[pid] = int(fields[1]), int(fields[3])
        resident[pid] = int(statm.split()[1]) * page
    ours = sessions.get(root)

    def below_root(pid: int) -> bool:
        seen = 0
        while pid in parents and seen < 64:
            pid, seen = parents[pid], seen + 1
            if pid == root:
                return True
        return False

    return sum(rss for pid, rss in resident.items() if sessions[pid] != ours and below_root(pid))


@dataclass
class Sampler:
    """Peak disk and memory over a job, and per step (``step`` names the one running)."""

    where: Path
    step: str = ""
    base_disk: int = 0
    peaks: dict[str, tuple[int, int]] = field(default_factory=dict)  # step -> (disk, memory)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self.base_disk = _used_bytes(self.where)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(SAMPLE_EVERY):
            disk = _used_bytes(self.where) - self.base_disk
            memory = _job_rss(me)
            old = self.peaks.get(self.step, (0, 0))
            self.peaks[self.step] = (max(old[0], disk), max(old[1], memory))

    @property
    def disk(self) -> int:
        return max((d for d, _ in self.peaks.values()), default=0)

    @property
    def memory(self) -> int:
        return max((m for _, m in self.peaks.values()), default=0)


class ReleaseJob:
    """One target's release job at real size, in ``work``; its rows go to ``report``."""

    def __init__(self, work: Path, report: Report, target: str, scale: float) -> None:
        self.work, self.report, self.target, self.scale = work / f"job-{target}", report, target, scale
        self.work.mkdir(parents=True)
        self.logs = self.work / "logs"

    def step(self, sampler: Sampler, name: str, *args: str | Path, timeout: float = 3 * 3600) -> Outcome:
        sampler.step = name
        argv = [sys.executable, "-m", "vllm_bundle", *map(str, args)]
        return run_child(argv, logs=self.logs / name, cwd=self.work, timeout=timeout)  # nothing lands in the checkout

    def run(self, base_root: Path) -> None:
        began = time.perf_counter()
        fixture = build_fixture(
            self.work / "upstream", real_wheels(TEST_DOWNLOADS, CP, self.work / "real"), cache=TEST_CACHE / "fixture"
        )
        upstream = UpstreamServer(fixture.root).start()
        registry = RegistryServer(self.work / "registry").start()
        try:
            recipes = copy_recipes(self.work / "recipes", real_toolchain=True)
            wheels = self._locked_wheels(upstream, recipes)
            grown = grow_wheels(fixture, wheels, self.work, self.scale)
            self.report.row(
                f"release job {self.target}: its wheels grown",
                f"{time.perf_counter() - began:.0f} s",
                f"{len(grown)} wheels, {sum(grown.values()) / GiB:.2f} GiB added (installed size)",
            )
            push_base(registry, write_base_layout(self.work / "base", base_root))
            self._job(upstream, registry, recipes)
        finally:
            upstream.stop()
            registry.stop()
            shutil.rmtree(self.work, ignore_errors=True)

    def _index(self, upstream: UpstreamServer) -> tuple[str, ...]:
        return (
            "--therock-index",
            f"{upstream.url}/{THEROCK_NEXT}/",
            "--pypi-index",
            f"{upstream.url}/{PYPI}/",
            "--mirror",
            f"{upstream.url}/releases/",
        )

    def _locked_wheels(self, upstream: UpstreamServer, recipes: Path) -> dict[str, str]:
        """What the lock picks for the target (a lock of the fixture as it is, then put away): the wheels
        to grow."""
        argv: list[str | Path] = [
            sys.executable,
            "-m",
            "vllm_bundle",
            "lock",
            self.target,
            "--recipes",
            recipes,
            *self._index(upstream),
            "--cache-dir",
            self.work / "pre-lock-cache",
            "--plain",
        ]
        outcome = run_child(argv, logs=self.logs / "pre-lock")
        if not outcome.ok:
            raise SystemExit(f"bench: cannot lock the fixture upstream for {self.target}: {outcome.error}")
        (pylock,) = (recipes / "locks").rglob(f"pylock.{self.target}.toml")
        wheels = locked_wheels(pylock)
        shutil.rmtree(recipes / "locks")
        shutil.rmtree(self.work / "pre-lock-cache")
        return wheels

    def _job(self, upstream: UpstreamServer, registry: RegistryServer, recipes: Path) -> None:
        cache, build, bundles = self.work / "cache", self.work / "build", self.work / "bundles"
        lock: list[str | Path] = [
            "lock",
            self.target,
            "--recipes",
            recipes,
            *self._index(upstream),
            "--cache-dir",
            cache,
            "--plain",
        ]
        bundle: list[str | Path] = [
            *("bundle", self.target, "--recipes", recipes, "--cache-dir", cache),
            *("--mirror", f"{upstream.url}/mirror/", "--build-dir", build, "--bundles-dir", bundles),
            *("--repo", TEST_REPO, "--image", "--registry-mirror", registry.host, "--plain"),
        ]
        outcomes: dict[str, Outcome] = {}
        with Sampler(self.work) as sampler:
            outcomes["lock"] = self.step(sampler, "lock", *lock)
            if outcomes["lock"].ok:
                outcomes["bundle --image"] = self.step(sampler, "bundle --image", *bundle)
            assets = next(bundles.glob(f"*-{self.target}"), None) if bundles.is_dir() else None
            if assets is not None and outcomes["bundle --image"].ok:
                qualify = ("qualify", assets, "--target", self.target, "--report", self.logs / "qualification.json")
                outcomes["qualify the parts"] = self.step(sampler, "qualify the parts", *qualify)
        self._report(
            sampler,
            outcomes,
            {
                "downloads": cache,
                "image": build / self.target / "image",
                "release assets": bundles,
                "build (stages)": build,
            },
        )
        self._compile_row(build / self.target / "logs" / "vllm-wheel.log", assets)

    def _report(self, sampler: Sampler, outcomes: dict[str, Outcome], places: dict[str, Path]) -> None:
        case = f"release job {self.target}"
        for name, outcome in outcomes.items():
            disk, memory = sampler.peaks.get(name, (0, 0))
            figure = f"{outcome.seconds:.0f} s, peak disk {gib(disk)}, peak memory {gib(memory)}"
            self.report.run(f"{case}: {name}", outcome, figure=figure)
        left = du_each(places)
        where = ", ".join(f"{name} {gib(size)}" for name, size in left.items())
        self.report.row(f"{case}: on disk at the end", gib(sum(left.values())), where)
        complete = len(outcomes) == 3 and all(o.ok for o in outcomes.values())
        figure = f"peak disk {gib(sampler.disk)}, peak memory {gib(sampler.memory)}"
        fits = sampler.disk <= RUNNER_DISK and sampler.memory <= RUNNER_MEMORY
        runner = f"ubuntu-24.04 as documented: {RUNNER_MEMORY / 1e9:.0f} GB memory, {RUNNER_DISK / 1e9:.0f} GB disk"
        self.report.goal(f"{case} fits {runner}", fits if complete else None, figure)
        need = release_need_bytes()
        within = sampler.disk <= need and sampler.memory <= RUNNER_MEMORY
        freed = f"the {need / 1e9:.0f} GB release.yml makes sure of after freeing the runner's disk"
        self.report.goal(f"{case} fits {freed}", within if complete else None, figure)

    def _compile_row(self, log: Path, assets: Path | None) -> None:
        """How many HIP translation units vLLM's own CMake compiled, times the target's ISAs: what a real
        compile's time grows with (docs/ci.md turns it into hours). After a build that succeeded, a log
        with no HIP compile in it is a failed row, never a count of 0."""
        release = assets / RELEASE_JSON if assets is not None else None
        if release is None or not release.is_file():
            return  # the build failed: its own row says so
        case = f"release job {self.target}: vLLM's device compiles"
        units = len(re.findall(r"Building HIP object ", log.read_text(errors="replace"))) if log.is_file() else 0
        if units == 0:
            self.report.run(case, Outcome(0, None, f"no HIP compile found in {log}"))
            return
        isas = json.loads(release.read_text())["vllm_build"]["isas"]
        self.report.row(case, f"{units * len(isas)}", f"{units} HIP units x {len(isas)} ISAs ({', '.join(isas)})")


def du_each(places: dict[str, Path]) -> dict[str, int]:
    """Bytes each place takes on disk (blocks), in order, a file hard-linked from an earlier place
    counted there only: the places add up to what they take together."""
    seen: set[tuple[int, int]] = set()
    sizes: dict[str, int] = {}
    for name, place in places.items():
        total = 0
        for root, _, files in os.walk(place):
            for file in files:
                stat = (Path(root) / file).lstat()
                if (stat.st_dev, stat.st_ino) not in seen:
                    seen.add((stat.st_dev, stat.st_ino))
                    total += stat.st_blocks * 512
        sizes[name] = total
    return sizes


def gib(size: int) -> str:
    return f"{size / GiB:.2f} GiB"
