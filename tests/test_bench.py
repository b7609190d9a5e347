"""The bench checks its own runs: a failed run is a FAILED row and gives no ratio, and the peak RSS it
reports is the command's, not the bench's. (The bench's figures themselves are never asserted.)"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
from bench.inflate import devel_tar, inflate_wheel, record_row
from bench.measure import Outcome, run_child, run_inline
from bench.release_job import ReleaseJob, Sampler, du_each
from bench.report import Report, ratio
from rich.console import Console

from tests.conftest import small_disk
from vllm_bundle.tree.assemble import install_into
from vllm_bundle.tree.records import verify_records


def _printed(report: Report) -> str:
    out = io.StringIO()
    report.print(Console(file=out, width=300, color_system=None))
    return out.getvalue()


def test_a_command_that_fails_is_a_failed_outcome_with_its_last_error_line(tmp_path: Path) -> None:
    script = "import sys; print('working'); print('error: the tool said why', file=sys.stderr); sys.exit(3)"
    outcome = run_child([sys.executable, "-c", script], logs=tmp_path / "logs" / "case")
    assert not outcome.ok
    assert outcome.error is not None and outcome.error.startswith("exit 3: error: the tool said why")


def test_a_command_killed_by_the_timeout_is_a_failure(tmp_path: Path) -> None:
    outcome = run_child([sys.executable, "-c", "import time; time.sleep(60)"], logs=tmp_path / "slow", timeout=1)
    assert not outcome.ok and "killed by signal 9" in (outcome.error or "")
    assert outcome.seconds < 30


def test_the_peak_rss_is_the_commands_own_not_the_benchs(tmp_path: Path) -> None:
    held = bytearray(400 * 2**20)  # the bench holding a lot when it starts a small command
    held[::4096] = b"x" * len(held[::4096])  # touched: resident
    small = run_child([sys.executable, "-c", "pass"], logs=tmp_path / "small")
    big = run_child(
        [sys.executable, "-c", "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"], logs=tmp_path / "big"
    )
    assert small.ok and big.ok
    assert small.peak_rss is not None and small.peak_rss < 100 * 2**20
    assert big.peak_rss is not None and 300 * 2**20 < big.peak_rss < 400 * 2**20
    del held


def test_an_exception_inline_is_a_failure_and_so_is_a_wrong_result() -> None:
    raised = run_inline(lambda: 1 / 0)
    assert not raised.ok and "ZeroDivisionError" in (raised.error or "")
    wrong = run_inline(lambda: 41, lambda result: None if result == 42 else f"got {result}")
    assert wrong.error == "got 41"


def test_a_failed_run_shows_as_failed_and_gives_no_ratio() -> None:
    fine, failed = Outcome(2.0), Outcome(0.5, None, "exit 1: error: no GitHub repository")
    assert ratio(fine, failed) is None and ratio(failed, fine) is None
    assert ratio(Outcome(4.0), fine) == 2.0
    report = Report("bench")
    report.run("bundle, nothing changed", failed, "every stage cached")
    report.goal("nothing changed < 1 s", None)
    text = _printed(report)
    assert "FAILED" in text and "no GitHub repository" in text
    assert "not measured" in text and "0.50 s" not in text
    assert report.failed == ["bundle, nothing changed"]


def test_the_release_jobs_sampler_sees_its_steps_memory_and_disk_not_the_benchs(tmp_path: Path) -> None:
    """What the release job's peak disk and memory are read from: every process of a step (in a session
    of its own, as run_child starts them), the disk used since the job began; not the bench's own."""
    held = bytearray(300 * 2**20)  # the bench's own memory, which the job's figure must leave out
    held[::4096] = b"x" * len(held[::4096])
    step = (
        "import os, sys, time\n"
        "b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096])\n"
        "with open(sys.argv[1], 'wb') as f:\n"
        "    f.write(os.urandom(64 * 2**20)); f.flush(); os.fsync(f.fileno())\n"
        "time.sleep(1.5)\n"
    )
    with small_disk(tmp_path / "disk", "256m") as disk, Sampler(disk) as sampler:  # a disk nobody else writes
        outcome = run_child([sys.executable, "-c", step, disk / "written"], logs=tmp_path / "logs" / "step")
    assert outcome.ok
    assert 200 * 2**20 < sampler.memory < 300 * 2**20
    assert 64 * 2**20 <= sampler.disk < 80 * 2**20
    del held


def test_du_each_counts_a_hard_linked_file_once_in_the_first_place_that_has_it(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x" * 2**20)
    (tmp_path / "b" / "f").hardlink_to(tmp_path / "a" / "f")
    (tmp_path / "b" / "g").write_bytes(b"y" * 2**20)
    sizes = du_each({"a": tmp_path / "a", "b": tmp_path / "b", "absent": tmp_path / "none"})
    assert sizes["a"] >= 2**20 and 2**20 <= sizes["b"] < 2 * 2**20 and sizes["absent"] == 0


def test_a_grown_wheel_installs_and_its_record_holds_every_file(tmp_path: Path) -> None:
    """bench.inflate grows TheRock's wheels: the grown wheel is still one installer takes and the
    pipeline's RECORD check passes on, with the padding in it (a replaced member too)."""
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    files = {
        "demo/__init__.py": b"",
        "demo/data.tar": b"old",
        "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
        "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = [record_row(name, hashlib.sha256(data).digest(), len(data)) for name, data in files.items()]
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("demo-1.0.dist-info/RECORD", "\n".join([*rows, "demo-1.0.dist-info/RECORD,,"]) + "\n")
    additions = [
        ("demo/lib/libpad.so", lambda: iter([b"\x7fELF", b"code" * 1000]), True),
        ("demo/.kpack/pad.kpack", lambda: iter([b"\x01" * 5000]), False),
        ("demo/data.tar", lambda: iter([b"new"]), True),
    ]
    assert inflate_wheel(wheel, additions) == 4 + 4000 + 5000 + 3
    site = tmp_path / "site"
    install_into({k: str(site) for k in ("purelib", "platlib", "headers", "scripts", "data")}, sys.executable, [wheel])
    assert (site / "demo" / "data.tar").read_bytes() == b"new"
    assert (site / "demo" / ".kpack" / "pad.kpack").stat().st_size == 5000
    assert verify_records(site) == []


def test_the_devel_padding_is_read_by_tarfile_as_the_build_expands_it() -> None:
    """The devel tarball keeps its members and gains the padding after them, not after the end-of-archive
    blocks (where tarfile, and so the build's expansion, would never see it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in ("_rocm_sdk_devel/a", "_rocm_sdk_devel/b"):
            info = tarfile.TarInfo(name)
            info.size = 3
            archive.addfile(info, io.BytesIO(b"abc"))
    padding = [("_rocm_sdk_devel/lib/libpad.so", 5000, lambda: iter([b"x" * 5000]))]
    grown = b"".join(devel_tar(buffer.getvalue(), padding)())
    with tarfile.open(fileobj=io.BytesIO(grown)) as archive:
        members = [(m.name, m.size) for m in archive.getmembers()]
    assert members == [("_rocm_sdk_devel/a", 3), ("_rocm_sdk_devel/b", 3), ("_rocm_sdk_devel/lib/libpad.so", 5000)]


def test_a_built_job_whose_log_shows_no_hip_compile_is_a_failed_row_not_a_count_of_0(tmp_path: Path) -> None:
    assets, log = tmp_path / "assets", tmp_path / "vllm-wheel.log"
    assets.mkdir()
    (assets / "release.json").write_text(json.dumps({"vllm_build": {"isas": ["gfx1100", "gfx1101"]}}))
    log.write_text("[1/2] Building CXX object CMakeFiles/_C.dir/csrc/cpu.cpp.o\n")
    report = Report("bench")
    ReleaseJob(tmp_path / "work", report, "gfx110X", 0.1)._compile_row(log, assets)
    assert report.failed == ["release job gfx110X: vLLM's device compiles"]
    log.write_text("[1/2] Building HIP object CMakeFiles/_C.dir/csrc/a.hip.o\n" * 3)
    counted = Report("bench")
    ReleaseJob(tmp_path / "work2", counted, "gfx110X", 0.1)._compile_row(log, assets)
    assert not counted.failed and "3 HIP units x 2 ISAs" in _printed(counted)


def test_the_shared_link_paces_parallel_answers_as_one_link() -> None:
    """The delta row's 100 Mbit/s is one link for every answer at once (tests/upstream/server.py
    SharedLink): two answers of a second's worth each are through after two seconds, not one."""
    from tests.upstream.server import SharedLink

    link = SharedLink(rate=1000)
    began = time.monotonic()
    first, second = link.reserve(1000), link.reserve(1000)
    assert second - first == pytest.approx(1.0)
    assert second - began >= 2.0


def test_the_delta_rows_vllm_tree_replaces_every_python_file_and_keeps_the_rest(tmp_path: Path) -> None:
    """bench/delta.py puts a vLLM release's Python tree into the bundle: every *.py is that release's,
    every other file (the extensions) the bundle's."""
    from bench.delta import with_vllm_tree

    root = tmp_path / "root"
    vllm = root / "lib" / "python3.11" / "site-packages" / "vllm"
    (vllm / "gone").mkdir(parents=True)
    (vllm / "gone" / "old.py").write_text("old = 1\n")
    (vllm / "_C.abi3.so").write_bytes(b"\x7fELF kept")
    sdist = tmp_path / "vllm-9.9.9.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, data in (("vllm/__init__.py", b"new = 1\n"), ("vllm/x/y.py", b"y = 2\n"), ("setup.py", b"")):
            info = tarfile.TarInfo(f"vllm-9.9.9/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    made = with_vllm_tree(root, sdist, "9.9.9", tmp_path / "made")
    site = made / "lib" / "python3.11" / "site-packages"
    assert sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()) == [
        "vllm/_C.abi3.so",
        "vllm/__init__.py",
        "vllm/x/y.py",
    ]
    assert (site / "vllm" / "_C.abi3.so").read_bytes() == b"\x7fELF kept"


def test_a_vllm_bump_in_the_delta_row_recompiles_every_extension(tmp_path: Path) -> None:
    """bench/delta.py's vLLM bump: the extensions grow to the stated total, keep their own ELF head, and
    share no 4 KiB block with another version's (a recompile changes every byte of them)."""
    from bench.delta import recompile

    versions = {}
    for version in ("0.32.0", "0.33.0"):
        extensions = [tmp_path / version / name for name in ("_C.abi3.so", "_rocm_C.abi3.so")]
        for extension in extensions:
            extension.parent.mkdir(exist_ok=True)
            extension.write_bytes(b"\x7fELF" + extension.name.encode())
        recompile(extensions, 2 << 20, version)
        assert [e.stat().st_size for e in extensions] == [1 << 20, 1 << 20]
        assert all(e.read_bytes().startswith(b"\x7fELF" + e.name.encode()) for e in extensions)
        versions[version] = b"".join(e.read_bytes() for e in extensions)
    old, new = (versions[v] for v in ("0.32.0", "0.33.0"))
    blocks = {old[i : i + 4096] for i in range(0, len(old), 4096)}
    assert not any(new[i : i + 4096] in blocks for i in range(0, len(new), 4096))
