"""The delta row: updates installed over a previous install through a loopback server whose answers share
one 100 Mbit/s link, as a delta (install/delta.py) and as today's full download (``--no-delta``), on a
tree of real size (``--delta-gib``, default 3: the fixture bundle grown as the real-size row grows it,
bench/tree.py).

- vllm-only: that tree with the real vLLM 0.32.0 Python tree (every ``*.py`` of PyPI's sdist) in its
  site-packages, updated to the same tree with vLLM 0.33.0's, and every byte of vLLM's native extensions
  new (a vLLM bump recompiles them all). Their size is an assumption, ``EXTENSION_BYTES`` in all, shared
  evenly: no real ROCm vLLM wheel's sizes could be read here (AMD's indexes are not reachable), and the
  fixture's own build compiles stand-ins;
- date-only: one tree released with two source dates a day apart.

Each update starts from a copy of the same previous install and an empty download cache. Bytes on the
wire and requests are the server's log; wall time and peak RSS the install's process."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import VllmSdists
from tests.releases import make_release
from tests.upstream.server import SharedLink, UpstreamServer

from bench.measure import Outcome, mib, run_child
from bench.pipeline import FixtureBundle
from bench.real_size import HOST
from bench.report import Report
from bench.tree import elf_blocks, grow_bundle, machine_code
from vllm_bundle.manifests import DEFAULT_PART_SIZE, RELEASE_JSON
from vllm_bundle.util.extract import safe_extract

LINK = 100 * 10**6 // 8  # 100 Mbit/s, in bytes per second
#: vLLM's native extensions together, in a bump that recompiles them (an assumption: see above).
EXTENSION_BYTES = 100 * 2**20
OLD, NEW = "0.32.0", "0.33.0"
DAY = 86400


@dataclass(frozen=True)
class Moved:
    outcome: Outcome
    wire: int  # body bytes the server sent
    requests: int


def with_vllm_tree(root: Path, sdist: Path, version: str, dest: Path, extension_bytes: int = 0) -> Path:
    """A copy of the bundle ``root`` whose vLLM Python files are those of vLLM ``version``'s sdist, and with
    ``extension_bytes``, vLLM's native extensions rewritten to that size in all, with bytes of this version's
    own (everything else as it was)."""
    shutil.copytree(root, dest, symlinks=True)
    (vllm,) = dest.glob("lib/python3.*/site-packages/vllm")
    if extension_bytes:
        recompile(sorted(vllm.glob("*.so")), extension_bytes, version)
    for old in vllm.rglob("*.py"):
        old.unlink()
    with tarfile.open(sdist) as archive:

        def python(name: str, member: tarfile.TarInfo) -> bool:
            return name.startswith("vllm/") and (member.isdir() or name.endswith(".py"))

        safe_extract(archive, vllm.parent, f"vLLM {version}'s sdist", top=f"vllm-{version}", select=python)
    return dest


def recompile(extensions: list[Path], total: int, version: str) -> None:
    """Each extension rewritten as ``total / len(extensions)`` bytes: its own ELF head, then machine code
    (bench/tree.py) with every byte mapped through a permutation drawn for ``version``. It is as
    compressible as machine code, and no chunk of one version's extensions is another's: a recompile
    changes them all."""
    rng = random.Random(f"vllm-{version}")
    table = bytes(rng.sample(range(256), 256))
    code = machine_code()
    for extension in extensions:
        head = extension.read_bytes()
        blocks = elf_blocks(max(total // len(extensions), len(head)), head, code)
        with extension.open("wb") as out:
            out.write(next(blocks))  # the extension's own ELF file, as it was
            for block in blocks:
                out.write(block.translate(table))


class DeltaBench:
    def __init__(self, bundle: FixtureBundle, work: Path, report: Report, size: int) -> None:
        self.work, self.report = work / "delta", report
        self.bundle, self.size = bundle, size
        self.date = int(json.loads((bundle.release / RELEASE_JSON).read_text())["source_date_epoch"])
        self.server = UpstreamServer(self.work / "upstream")
        (self.server.root / "releases").mkdir(parents=True)

    def run(self) -> None:
        self.grown = self.work / "grown"
        added = grow_bundle(self.bundle.root, self.grown, self.size, self.work)
        self.workload = f"{added['bytes'] / 2**30:.2f} GiB tree, {added['files']} files"
        self.server.start()
        try:
            self._vllm_only()
            self._date_only()
        finally:
            self.server.stop()

    def _release(self, root: Path, tag: str, date: int) -> str:
        make_release(root, self.server.root / "releases" / tag, tag, date, DEFAULT_PART_SIZE)  # as released
        return f"{self.server.url}/releases/{tag}/"

    def _install(self, url: str, dest: Path, name: str, *extra: str) -> Moved:
        self.server.reset()
        command: list[str | Path] = [sys.executable, "-m", "vllm_bundle", "install", url, "--dest", dest, "--plain"]
        command += ["--cache-dir", self.work / name / "cache", "--host-root", HOST, *extra]
        outcome = run_child(command, logs=self.work / "logs" / name, timeout=1800)
        gets = [r for r in self.server.log if r.method == "GET"]
        return Moved(outcome, sum(r.body_bytes for r in gets), len(gets))

    def _update(self, old: str, new: str, name: str) -> tuple[Moved, Moved]:
        """``new`` over an install of ``old``: as a delta, then as a full download (each from a copy)."""
        base = self.work / name / "previous"
        self.server.link = None
        first = self._install(old, base, f"{name}-previous")
        if not first.outcome.ok:
            failed = Moved(Outcome(0, None, f"the previous install failed: {first.outcome.error}"), 0, 0)
            return failed, failed
        self.server.link = SharedLink(LINK)
        runs = []
        for kind, extra in (("delta", ()), ("full", ("--no-delta",))):
            dest = self.work / name / kind / "vllm"
            dest.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-a", str(base), str(dest)], check=True)  # modes, times, hard links: as installed
            moved = self._install(new, dest, f"{name}-{kind}", *extra)
            said = (self.work / "logs" / f"{name}-{kind}").with_suffix(".out").read_text(errors="replace")
            if moved.outcome.ok and kind == "delta" and "delta from" not in said and "is the tree of" not in said:
                moved = Moved(Outcome(moved.outcome.seconds, None, "installed, but not as a delta"), 0, 0)
            runs.append(moved)
            shutil.rmtree(dest.parent)
        return runs[0], runs[1]

    def _rows(self, what: str, delta: Moved, full: Moved) -> tuple[float, float] | None:
        workload = f"{self.workload}, over a copy of the previous install, empty download cache, one 100 Mbit/s link"
        for kind, moved in (("full download (today)", full), ("delta", delta)):
            figure = f"{moved.outcome.seconds:.2f} s, {mib(moved.wire)} on the wire, {moved.requests} requests"
            if moved.outcome.peak_rss is not None:
                figure += f", peak RSS {mib(moved.outcome.peak_rss)}"
            self.report.run(f"update {what}, {kind}", moved.outcome, workload, figure=figure)
        if not (delta.outcome.ok and full.outcome.ok) or not full.wire:
            return None
        share = delta.wire / full.wire, delta.outcome.seconds / full.outcome.seconds
        self.report.row(
            f"update {what}, delta / full", "", "", f"{share[0]:.1%} of the bytes, {share[1]:.1%} of the time"
        )
        return share

    def _vllm_only(self) -> None:
        sdists = VllmSdists().many([OLD, NEW])
        roots = {
            v: with_vllm_tree(self.grown, sdists[v], v, self.work / f"root-{v}", EXTENSION_BYTES) for v in (OLD, NEW)
        }
        shutil.rmtree(self.grown)
        old = self._release(roots[OLD], f"vllm{OLD}-bench-gfx1151", self.date - DAY)
        new = self._release(roots[NEW], f"vllm{NEW}-bench-gfx1151", self.date)
        what = f"vLLM {OLD} -> {NEW}, its {EXTENSION_BYTES >> 20} MiB of extensions recompiled"
        share = self._rows(what, *self._update(old, new, "vllm-only"))
        self.report.goal(
            "vLLM-only update: <= 15% of the bytes",
            None if share is None else share[0] <= 0.15,
            "" if share is None else f"{share[0]:.1%}",
        )
        self.report.goal(
            "vLLM-only update: <= 10% of the time (#54)",
            None if share is None else share[1] <= 0.10,
            "" if share is None else f"{share[1]:.1%}",
        )

    def _date_only(self) -> None:
        root = self.work / f"root-{NEW}"
        old = self._release(root, f"vllm{NEW}-bench-day1-gfx1151", self.date)
        new = self._release(root, f"vllm{NEW}-bench-day2-gfx1151", self.date + DAY)
        share = self._rows("of the source date only", *self._update(old, new, "date-only"))
        self.report.goal(
            "date-only update: < 1% of the bytes",
            None if share is None else share[0] < 0.01,
            "" if share is None else f"{share[0]:.2%}",
        )
        self.report.goal(
            "date-only update: <= 5% of the time (#54)",
            None if share is None else share[1] <= 0.05,
            "" if share is None else f"{share[1]:.1%}",
        )
