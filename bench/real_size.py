"""The pipeline's heavy steps on a bundle of real size (default 8 GiB; see :mod:`bench.tree`), each in
a process of its own for its wall time and peak RSS: archive (against ``tar | pigz``), tier 0,
verify-repro's comparison, the image layers, and ``install`` (against what Lemonade does today)."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.measure import Outcome, mib, run_child
from bench.pipeline import TARGET, FixtureBundle
from bench.report import Report, ratio, seconds_and_rss
from bench.tree import LAST, grow_bundle
from vllm_bundle.manifests import (
    BACKEND_VERSIONS,
    DEFAULT_PART_SIZE,
    RELEASE_JSON,
    backend_versions,
    write_sha256sums,
)

REPO = Path(__file__).resolve().parent.parent
RSS_GOAL = 512 * 2**20
#: Scratch a run needs, as a multiple of the tree: the tree, its archive, and Lemonade's way to install
#: (parts, their concatenation, the extracted tree) at the worst moment.
SCRATCH_FACTOR = 4.5
HOST = REPO / "tests" / "data" / "hosts" / "strix-halo"


def scratch_problem(work: Path, size: int) -> str | None:
    free = shutil.disk_usage(work).free
    need = int(size * SCRATCH_FACTOR)
    if free >= need:
        return None
    return f"{work} has {free / 2**30:.1f} GiB free; a {size / 2**30:.1f} GiB tree needs {need / 2**30:.1f} GiB"


class RealSize:
    def __init__(self, bundle: FixtureBundle, work: Path, report: Report, size: int) -> None:
        self.bundle, self.work, self.report, self.size = bundle, work / "real-size", report, size
        self.work.mkdir(parents=True, exist_ok=True)
        self.tree = self.work / "tree"
        self.workload = ""
        self.rss: dict[str, Outcome] = {}

    def child(self, name: str, *args: str | Path, timeout: float = 3600) -> Outcome:
        argv = [sys.executable, "-m", "bench.child", *map(str, args)]
        return run_child(argv, logs=self.work / "logs" / name, cwd=REPO, timeout=timeout)

    def run(self) -> None:
        began = time.perf_counter()
        added = grow_bundle(self.bundle.root, self.tree, self.size, self.work)
        self.workload = f"{added['bytes'] / 2**30:.2f} GiB tree, {added['files']} files"
        self.report.row(
            "real-size tree, generated",
            f"{time.perf_counter() - began:.0f} s",
            f"{self.workload}: ELF {added['elf'] / 2**30:.1f} GiB (files up to 2 GiB), .kpack "
            f"{added['kpack'] / 2**30:.1f} GiB, .py {added['python'] / 2**30:.1f} GiB",
        )
        release = self.archive()
        self.compare(release)
        self.qualify()
        self.image()
        if release is not None:
            self.install(release)
        self.memory_goal()

    # -- archive -------------------------------------------------------------------------------

    def archive(self) -> Path | None:
        """Ours into a release folder (the fixture's release, its archive replaced); then tar | pigz."""
        release = self.work / "release"
        stem = f"{self.bundle.release.name}-x64"
        ours = self.child("archive", "archive", self.tree, release, stem, str(DEFAULT_PART_SIZE))
        ours_size = sum(p.stat().st_size for p in release.glob("*.tar.gz")) if ours.ok else 0
        pigz, pigz_size = self._pigz()
        self.rss["archive"] = ours
        faster = ratio(pigz, ours)
        larger = ours_size / pigz_size if ours.ok and pigz_size else None
        versus = f"{faster:.2f}x faster than tar|pigz, size {larger:.3f}x" if faster and larger else ""
        self.report.run(
            "archive: ours (libdeflate members, level 6)", ours, self.workload, versus, self._with_size(ours, ours_size)
        )
        self.report.run(
            "archive: tar --sort=name | pigz -6", pigz, self.workload, "1.00x", self._with_size(pigz, pigz_size)
        )
        met = None if faster is None or larger is None else faster >= 1.5 and larger <= 1.01
        self.report.goal(
            "archive: >= 1.5x tar|pigz at <= 1.01x its size", met, f"{faster or 0:.2f}x, {larger or 0:.3f}x"
        )
        if not ours.ok:
            return None
        self._complete_release(release, stem)
        return release

    def _pigz(self) -> tuple[Outcome, int]:
        if not shutil.which("pigz"):
            return Outcome(0, None, "pigz is not installed (apt-get install pigz)"), 0
        out = self.work / "pigz.tar.gz"
        command = (
            f"tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=pax -C '{self.tree}' -cf - . "
            f"| pigz -6 > '{out}'"
        )
        outcome = run_child(["bash", "-c", f"set -o pipefail; {command}"], logs=self.work / "logs" / "pigz")
        size = out.stat().st_size if out.exists() else 0
        out.unlink(missing_ok=True)
        return outcome, size

    @staticmethod
    def _with_size(outcome: Outcome, size: int) -> str:
        return f"{seconds_and_rss(outcome)}, {size / 2**20:.0f} MiB"

    def _complete_release(self, release: Path, stem: str) -> None:
        """release.json, the partcount, backend_versions.json and SHA256SUMS for the new parts, the rest
        of the fixture's release.json as it is: what ``vllm-bundle install`` reads."""
        parts = sorted(release.glob(f"{stem}.part*.tar.gz"))
        doc = json.loads((self.bundle.release / RELEASE_JSON).read_text())
        entries: list[dict[str, Any]] = []
        whole = hashlib.sha256()  # of the parts put together, in the same pass as each part's
        for part in parts:
            digest = hashlib.sha256()
            with part.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
                    whole.update(block)
            entries.append({"name": part.name, "size": part.stat().st_size, "sha256": digest.hexdigest()})
        doc["archive"].update({"size": sum(e["size"] for e in entries), "sha256": whole.hexdigest(), "parts": entries})
        (release / RELEASE_JSON).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        (release / f"{stem}.partcount").write_text(f"{len(parts):02d}")
        pins = backend_versions(
            doc["tag"], doc["target"], "example-org/vllm-rocm-bundles", {e["name"]: e["sha256"] for e in entries}
        )
        (release / BACKEND_VERSIONS).write_text(json.dumps(pins, indent=2, sort_keys=True) + "\n")
        write_sha256sums(release)

    # -- verify-repro's comparison -------------------------------------------------------------

    def compare(self, release: Path | None) -> None:
        """A second archive of the tree with its last member changed: the comparison reads every part
        and, as they differ, both archives member by member down to that last one."""
        if release is None:
            self.report.run("verify-repro: compare two releases", Outcome(0, None, "not run: the archive failed"))
            return
        stem = f"{self.bundle.release.name}-x64"
        last = self.tree / LAST
        original = last.read_bytes()
        last.write_bytes(b"1" * len(original))
        try:
            second = self.work / "release-b"
            again = self.child("archive-b", "archive", self.tree, second, stem, str(DEFAULT_PART_SIZE))
        finally:
            last.write_bytes(original)
        first = self.work / "release-a"
        first.mkdir()
        for part in release.glob(f"{stem}.part*.tar.gz"):
            (first / part.name).hardlink_to(part)
        outcome = (
            again
            if not again.ok
            else self.child("compare", "compare", first, second, f"member ./{LAST}: content differs")
        )
        shutil.rmtree(first)
        shutil.rmtree(second, ignore_errors=True)
        self.rss["verify-repro compare"] = outcome
        self.report.run(
            "verify-repro: compare two releases", outcome, f"{self.workload}; they differ in the last member"
        )

    # -- tier 0, image -------------------------------------------------------------------------

    def qualify(self) -> None:
        build_dir = self.work / "build"  # named by no file: what the pipeline's qualify stage looks for
        outcome = self.child("qualify", "qualify", self.tree, self.bundle.recipes, TARGET, build_dir)
        self.rss["qualify (tier 0)"] = outcome
        self.report.run("qualify: tier 0", outcome, self.workload)

    def image(self) -> None:
        out = self.work / "image"
        outcome = self.child("image", "image", self.tree, out, self.bundle.recipes)
        layers = sum(p.stat().st_size for p in (out / "blobs" / "sha256").iterdir()) if outcome.ok else 0
        shutil.rmtree(out, ignore_errors=True)
        self.rss["image layers"] = outcome
        self.report.run("image: OCI layers", outcome, self.workload, figure=self._with_size(outcome, layers))

    # -- install -------------------------------------------------------------------------------

    def install(self, release: Path) -> None:
        """``vllm-bundle install`` from a loopback server against Lemonade's way (lemonade-sdk/lemonade
        src/cpp/server/backends/backend_utils.cpp, split-archive path: each part downloaded in turn and
        appended to one file; src/cpp/server/utils/platform/archive_unix.cpp extract_tarball: ``tar -tf``
        to find the strip depth, then ``tar -xf --no-same-owner``)."""
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(release)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for(port)
            url = f"http://127.0.0.1:{port}/"
            ours = self._install_ours(url, json.loads((release / RELEASE_JSON).read_text())["tag"])
            theirs = self._install_lemonade(url, sorted(p.name for p in release.glob("*.part*.tar.gz")))
        finally:
            server.terminate()
            server.wait()
        self.rss["install"] = ours
        faster = ratio(theirs, ours)
        self.report.run("install: vllm-bundle install", ours, self.workload, f"{faster:.2f}x faster" if faster else "")
        self.report.run(
            "install: Lemonade's way (curl each part, cat, tar -tf, tar -xf)", theirs, self.workload, "1.00x"
        )

    def _install_ours(self, url: str, tag: str) -> Outcome:
        dest, cache = self.work / "installed" / "vllm", self.work / "install-cache"
        argv: list[str | Path] = [
            sys.executable,
            "-m",
            "vllm_bundle",
            "install",
            url,
            "--dest",
            dest,
            "--cache-dir",
            cache,
        ]
        outcome = run_child([*argv, "--plain", "--host-root", HOST], logs=self.work / "logs" / "install")
        if outcome.ok and (dest / "version.txt").read_text() != tag:
            outcome = Outcome(outcome.seconds, outcome.peak_rss, "installed, but version.txt does not name the tag")
        elif outcome.ok and not (dest / "bin" / "vllm-server").is_file():
            outcome = Outcome(outcome.seconds, outcome.peak_rss, "installed, but bin/vllm-server is missing")
        shutil.rmtree(dest.parent, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        return outcome

    def _install_lemonade(self, url: str, parts: list[str]) -> Outcome:
        scratch = self.work / "lemonade"
        scratch.mkdir()
        dest = scratch / "vllm"
        steps = [f"curl -sSf -o '{scratch}/{name}' '{url}{name}'" for name in parts]
        combined = scratch / "combined.tar.gz"
        steps += [
            f"cat {' '.join(repr(str(scratch / n)) for n in parts)} > '{combined}'",
            f"tar -tf '{combined}' > /dev/null",
            f"mkdir '{dest}'",
            f"tar -xf '{combined}' -C '{dest}' --no-same-owner",
            f"test -f '{dest}/bin/vllm-server'",
        ]
        outcome = run_child(["bash", "-c", "set -e; " + "; ".join(steps)], logs=self.work / "logs" / "lemonade")
        shutil.rmtree(scratch, ignore_errors=True)
        return outcome

    # -- the memory goal -------------------------------------------------------------------------

    def memory_goal(self) -> None:
        failed = [name for name, outcome in self.rss.items() if not outcome.ok]
        peaks = {name: o.peak_rss or 0 for name, o in self.rss.items() if o.ok}
        worst = max(peaks, key=lambda name: peaks[name]) if peaks else None
        figure = f"largest: {worst} {mib(peaks[worst])}" if worst else ""
        met = None if failed or len(peaks) < 5 else all(peak < RSS_GOAL for peak in peaks.values())
        self.report.goal(f"peak RSS < {RSS_GOAL // 2**20} MiB each ({', '.join(self.rss)})", met, figure)

    def clean(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_for(port: int, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"bench: the loopback server on port {port} did not start")
