"""``vllm-bundle doctor``, and the same checks run by ``install``, on the fixture hosts of tests/data/hosts."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests import host_trees
from tests.conftest import REPO, as_a_user, assert_one_line_error, run_cli
from tests.upstream.server import LoopbackServer
from vllm_bundle.install.doctor import Finding, diagnose, render_json, render_text
from vllm_bundle.paths import default_recipes
from vllm_bundle.recipes import load_targets

HOSTS = REPO / "tests" / "data" / "hosts"
TARGETS = load_targets(default_recipes())
#: What decides HIP's device 0 and where the host is read: the tests set them themselves.
HOST_VARIABLES = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "VLLM_BUNDLE_HOST_ROOT")


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in HOST_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def doctor(host: str | Path | None, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    where = () if host is None else ("--host-root", HOSTS / host if isinstance(host, str) else host)
    return run_cli("doctor", *where, *extra, env=env, timeout=60)


def findings(result: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str]]:
    """``check -> (status, line)`` of the text output (every line but the summary)."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stdout.strip().splitlines()
    parsed = {}
    for line in lines[:-1]:
        status, check = line.split()[:2]
        assert status in ("ok", "warn", "block"), line
        assert check not in parsed, f"{check} twice: {result.stdout}"
        parsed[check] = (status, line)
    return parsed


def statuses(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {check: status for check, (status, _) in findings(result).items()}


#: Every check of doctor's CLI on a host that passes them: this machine's glibc (Debian 12's 2.36) is at or
#: above the floor the recipes claim (2.35), then the GPU's checks.
ALL_OK = {"glibc": "ok", "gpu": "ok", "cwsr": "ok", "driver": "ok", "access": "ok", "memory": "ok"}


@pytest.mark.parametrize(
    ("host", "expected", "code", "fragments"),
    [
        (
            "strix-halo",
            ALL_OK,
            0,
            [
                "ok    gpu     HIP device 0 is KFD node 1, a gfx1151 APU: the gfx1151 bundle serves it",
                "ok    cwsr    kernel 6.18.4-061804-generic exports cwsr_size and ctl_stack_size for the gfx1151",
                "ok    driver  amdgpu is the kernel's own driver",
                "76.5 of 96.0 GiB free (GTT: an APU's shared system memory); vllm-server will pass "
                "--gpu-memory-utilization 0.74",
            ],
        ),
        (
            "strix-halo-old-kernel",
            {**ALL_OK, "cwsr": "block"},
            1,
            [
                "block cwsr    kernel 6.17.0-8-generic does not export cwsr_size and ctl_stack_size for the gfx1151 "
                "(KFD node 1)",
                "(fix: upgrade the kernel to 6.18.4 or later and reboot; on Ubuntu 24.04: sudo apt install "
                "linux-oem-24.04; see https://lemonade-server.ai/gfx1151_linux.html)",
            ],
        ),
        (
            "strix-halo-dkms",
            {**ALL_OK, "driver": "block"},
            1,
            [
                "block driver  amdgpu is AMD's out-of-tree amdgpu-dkms (module version 6.16.6, taint O, amdkcl "
                "loaded), not the kernel's own driver: on a Ryzen AI / Strix Halo APU it conflicts with it",
                "(fix: sudo apt remove --purge amdgpu-dkms && sudo reboot, or reinstall ROCm without it: "
                "sudo amdgpu-install -y --usecase=rocm --no-dkms)",
            ],
        ),
        (
            "desktop-dgpu-igpu",
            ALL_OK,
            0,
            [
                "ok    gpu     HIP device 0 is KFD node 1, a gfx1100 discrete GPU: the gfx110X bundle serves it",
                "ok    cwsr    not needed: only gfx1151 needs the CWSR export (kernel 6.14.0-37-generic)",
                "dev/dri/renderD128 open read-write",
                "ok    memory  HIP device 0 has 22.8 of 24.0 GiB free; vllm-server will pass --gpu-memory-utilization",
            ],
        ),
    ],
)
def test_each_fixture_host_gets_its_findings(
    host: str, expected: dict[str, str], code: int, fragments: list[str]
) -> None:
    result = doctor(host)
    assert result.returncode == code, result.stdout + result.stderr
    assert statuses(result) == expected, result.stdout
    for fragment in fragments:
        assert fragment in result.stdout, f"{fragment!r} not in:\n{result.stdout}"
    summary = result.stdout.strip().splitlines()[-1]
    assert summary == ("ready" if code == 0 else "not ready: 1 blocker")


def test_a_host_without_a_gpu_node_is_one_finding() -> None:
    result = doctor("no-gpu")
    assert result.returncode == 1
    assert list(findings(result)) == ["glibc", "gpu"]
    line = findings(result)["gpu"][1]
    assert line.startswith(f"block gpu     no AMD GPU: no GPU node in {HOSTS / 'no-gpu' / 'sys/class/kfd'}"), line
    assert "(fix: run on a machine with an AMD GPU that a bundle serves (gfx1151, gfx1150, gfx1100" in line


@pytest.mark.skipif(Path("/sys/class/kfd").exists(), reason="this machine has the amdgpu driver loaded")
def test_this_machine_has_no_amd_gpu() -> None:
    result = doctor(None)
    assert result.returncode == 1
    assert list(findings(result)) == ["glibc", "gpu"], result.stdout
    assert findings(result)["gpu"][1].startswith("block gpu     no AMD GPU: /sys/class/kfd does not exist")
    as_json = json.loads(doctor(None, "--json").stdout)
    assert as_json["ready"] is False and [f["check"] for f in as_json["findings"]] == ["glibc", "gpu"]


def test_json_has_ready_and_every_finding() -> None:
    result = doctor("strix-halo", "--json", "--gpu-memory-utilization", "0.9")
    assert result.returncode == 1, "a blocker exits 1 with --json too"
    doc = json.loads(result.stdout)
    assert set(doc) == {"ready", "findings"} and doc["ready"] is False
    assert all(set(f) == {"check", "status", "message", "fix"} for f in doc["findings"])
    assert [(f["check"], f["status"]) for f in doc["findings"]] == [*{**ALL_OK, "memory": "block"}.items()]
    ready = doctor("strix-halo", "--json")
    assert ready.returncode == 0 and json.loads(ready.stdout)["ready"] is True


def test_a_utilization_the_free_memory_cannot_cover_blocks_naming_one_that_fits() -> None:
    """76.45 GiB free of 96: vLLM refuses 0.9 (86.4 GiB); the largest that fits is 0.79."""
    refused = doctor("strix-halo", "--gpu-memory-utilization", "0.9")
    assert refused.returncode == 1
    status, line = findings(refused)["memory"]
    assert status == "block"
    assert "--gpu-memory-utilization 0.9 needs 86.4 GiB free at start (vLLM refuses to start)" in line
    assert "(fix: pass --gpu-memory-utilization 0.79 or less, or close what holds GPU memory)" in line
    fits = doctor("strix-halo", "--gpu-memory-utilization", "0.7")
    assert fits.returncode == 0, fits.stdout
    assert "--gpu-memory-utilization 0.7 needs 67.2 GiB free at start" in findings(fits)["memory"][1]


@pytest.mark.parametrize("value", ["0", "-0.5", "1.01", "nan", "inf", "x"])
def test_a_utilization_out_of_range_is_a_usage_error(value: str) -> None:
    result = doctor("strix-halo", f"--gpu-memory-utilization={value}")
    assert result.returncode == 2
    assert_one_line_error(result, "argument --gpu-memory-utilization", repr(value), "above 0 and at most 1")


def test_another_targets_bundle_is_refused() -> None:
    result = doctor("strix-halo", "--target", "gfx110X")
    assert result.returncode == 1
    status, line = findings(result)["gpu"]
    assert status == "block"
    assert "a gfx1151 APU: the gfx110X bundle serves gfx1100, gfx1101, gfx1102, gfx1103" in line
    assert line.endswith("(fix: install the gfx1151 bundle)")
    assert doctor("strix-halo", "--target", "gfx1151").returncode == 0
    assert doctor("strix-halo", "--target", "auto").returncode == 0


def test_an_installed_bundle_is_checked_for_its_target(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "bin").mkdir(parents=True)
    (bundle / "bin" / "vllm-server").write_text("#!/bin/sh\n# Generated by vllm-bundle for vLLM 0.33.0 (gfx110X)\n")
    result = doctor("strix-halo", "--bundle", str(bundle))
    assert "the gfx110X bundle serves" in findings(result)["gpu"][1]
    assert_one_line_error(doctor("strix-halo", "--bundle", str(tmp_path)), "cannot tell the target of", "--target")
    assert_one_line_error(doctor("strix-halo", "--target", "gfx9999"), "unknown target 'gfx9999'")


def test_device_0_is_the_desktops_discrete_gpu_unless_hip_chooses_the_igpu() -> None:
    served = doctor("desktop-dgpu-igpu", "--target", "gfx110X")
    assert served.returncode == 0, served.stdout
    assert "KFD node 1, a gfx1100 discrete GPU: the gfx110X bundle serves it" in findings(served)["gpu"][1]

    igpu = doctor("desktop-dgpu-igpu", env={"HIP_VISIBLE_DEVICES": "1"})
    assert igpu.returncode == 1
    status, line = findings(igpu)["gpu"]
    assert status == "block"
    assert "HIP device 0 (HIP_VISIBLE_DEVICES=1) is KFD node 2, a gfx1036 APU: no bundle serves it" in line
    assert "(fix: make KFD node 1's gfx1100 HIP's device 0: HIP_VISIBLE_DEVICES=0)" in line
    assert "renderD129" in findings(igpu)["access"][1], "the iGPU's own render node"

    beyond = doctor("desktop-dgpu-igpu", env={"HIP_VISIBLE_DEVICES": "2"})
    assert beyond.returncode == 1 and list(findings(beyond)) == ["glibc", "gpu"]
    assert "HIP_VISIBLE_DEVICES=2: HIP sees no GPU: 2 is not one of the 2 GPUs HIP sees (0 to 1)" in beyond.stdout


def host_copy(name: str, where: Path) -> Path:
    return Path(shutil.copytree(HOSTS / name, where / name))


def test_device_nodes_the_user_cannot_open_block_naming_the_groups(tmp_path: Path) -> None:
    host = host_copy("strix-halo", tmp_path)
    for node in (host / "dev" / "kfd", host / "dev" / "dri" / "renderD128"):
        node.chmod(0)
    command = as_a_user([sys.executable, "-m", "vllm_bundle", "doctor", "--host-root", str(host)])
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    status, line = findings(result)["access"]
    assert status == "block"
    assert f"cannot open {host / 'dev/kfd'} read-write: Permission denied (group " in line
    assert f"cannot open {host / 'dev/dri/renderD128'} read-write" in line and "mode ----------" in line
    assert "(fix: sudo usermod -aG render,video $USER, then log out and in" in line


def test_a_missing_device_node_says_so(tmp_path: Path) -> None:
    host = host_copy("strix-halo", tmp_path)
    (host / "dev" / "kfd").unlink()
    status, line = findings(doctor(host))["access"]
    assert status == "block"
    assert f"{host / 'dev/kfd'} does not exist" in line
    assert "(fix: in a container, pass --device /dev/kfd --device /dev/dri --group-add video" in line


def test_dkms_on_a_discrete_gpu_is_stated_with_no_advice_to_remove_it(tmp_path: Path) -> None:
    """#32 M3: AMD's installer puts amdgpu-dkms in every use case; the conflict is documented for Ryzen AI
    APUs only."""
    host = host_copy("desktop-dgpu-igpu", tmp_path)
    shutil.copytree(HOSTS / "strix-halo-dkms" / "sys" / "module", host / "sys" / "module", dirs_exist_ok=True)
    result = doctor(host)
    assert result.returncode == 0, result.stdout
    status, line = findings(result)["driver"]
    assert status == "ok" and "amdgpu-dkms (module version 6.16.6, taint O, amdkcl loaded)" in line
    assert "apt remove" not in result.stdout and "conflict" not in line
    assert result.stdout.strip().splitlines()[-1] == "ready"


# -- unit: odd trees give findings, never a traceback -------------------------------------------------------


def _diagnose(root: Path, utilization: float | None = None, environ: dict[str, str] | None = None) -> list[Finding]:
    return diagnose(root, TARGETS, None, utilization, environ or {})


@pytest.mark.parametrize("damage", ["missing", "garbage", "directory", "empty", "huge-number"])
def test_every_file_of_a_host_may_be_damaged(tmp_path: Path, damage: str) -> None:
    pristine = HOSTS / "strix-halo"
    for number, file in enumerate(sorted(p.relative_to(pristine) for p in pristine.rglob("*") if p.is_file())):
        root = Path(shutil.copytree(pristine, tmp_path / str(number)))
        (root / file).unlink()
        if damage == "garbage":
            (root / file).write_bytes(b"\xff\xfe\x00 12 \x80\n")
        elif damage == "directory":
            (root / file).mkdir()
        elif damage == "empty":
            (root / file).write_text("")
        elif damage == "huge-number":  # a number no byte count is, within a page (#32 E6)
            (root / file).write_text("9" * 4000 + "\n")
        result = _diagnose(root, 0.5)
        assert result and all(isinstance(finding, Finding) for finding in result), file
        render_text(result)
        json.loads(render_json(result))
        shutil.rmtree(root)


def test_the_gfx1151_needs_the_cwsr_lines_on_its_own_node(tmp_path: Path) -> None:
    """The kernel prints them on CPU nodes too (value 0): only the GPU node tells."""
    root = host_copy("strix-halo-old-kernel", tmp_path)
    cpu = root / "sys/class/kfd/kfd/topology/nodes/0/properties"
    cpu.write_text(cpu.read_text().replace("num_cp_queues 0\n", "num_cp_queues 0\ncwsr_size 0\nctl_stack_size 0\n"))
    (cwsr,) = [f for f in _diagnose(root) if f.check == "cwsr"]
    assert cwsr.status == "block", cwsr


def test_a_render_minor_no_file_name_can_hold_is_a_finding(tmp_path: Path) -> None:
    root = host_copy("strix-halo", tmp_path)
    node = root / "sys/class/kfd/kfd/topology/nodes/1/properties"
    node.write_text(node.read_text().replace("drm_render_minor 128", "drm_render_minor " + "9" * 300))
    by_check = {f.check: f for f in _diagnose(root)}
    assert by_check["access"].status == "block" and by_check["memory"].status == "warn"


def test_a_uuid_that_matches_no_gpu_leaves_hip_none() -> None:
    """#32 M5: HIP's first invalid token ends its list (rocdevice.cpp, Device::init): no GPU, no checks."""
    findings_ = _diagnose(HOSTS / "desktop-dgpu-igpu", environ={"HIP_VISIBLE_DEVICES": "GPU-4d3f2a"})
    assert [(f.check, f.status) for f in findings_] == [("gpu", "block")]
    assert "HIP_VISIBLE_DEVICES=GPU-4d3f2a: HIP sees no GPU: GPU-4d3f2a matches no GPU's UUID" in findings_[0].message


# -- install runs the same checks before it downloads anything -------------------------------------------

TAG = "vllm0.33.0-rocm7.14.0-gfx1151"
STEM = f"{TAG}-x64"


def tiny_release(where: Path) -> Path:
    """A one-part release whose archive holds only an executable ``bin/vllm-server``."""
    where.mkdir(parents=True)
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as archive:
        for name, kind in (("./", tarfile.DIRTYPE), ("./bin", tarfile.DIRTYPE), ("./bin/vllm-server", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = kind, 0o755
            body = b"#!/bin/sh\n" if kind == tarfile.REGTYPE else b""
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    part = where / f"{STEM}.part01-of-01.tar.gz"
    part.write_bytes(data.getvalue())
    digest = hashlib.sha256(part.read_bytes()).hexdigest()
    entry = {"name": part.name, "size": part.stat().st_size, "sha256": digest}
    release = {"tag": TAG, "target": "gfx1151", "archive": {"size": entry["size"], "sha256": digest, "parts": [entry]}}
    (where / "release.json").write_text(json.dumps(release))
    (where / f"{STEM}.partcount").write_text("01")
    return where


@pytest.fixture
def served_release(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """The tiny release on a loopback HTTP server, and the paths it was asked for."""
    root = tiny_release(tmp_path / "site" / "r")
    asked: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root.parent), **kwargs)

        def do_GET(self) -> None:
            asked.append(self.path)
            super().do_GET()

        def log_message(self, *args: Any) -> None:
            pass

    server = LoopbackServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/r/", asked
    finally:
        server.shutdown()
        server.server_close()


def test_install_refuses_a_host_that_cannot_run_the_bundle_before_downloading(
    served_release: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, asked = served_release
    dest, cache = tmp_path / "vllm", tmp_path / "cache"
    common = ("--dest", dest, "--cache-dir", cache, "--plain", "--host-root", HOSTS / "strix-halo-old-kernel")
    refused = run_cli("install", url, *common)
    assert_one_line_error(
        refused,
        "error: this machine cannot run the gfx1151 bundle: kernel 6.17.0-8-generic does not export cwsr_size",
        "(fix what `vllm-bundle doctor` lists, or pass --force to install anyway)",
    )
    assert "block cwsr" in refused.stdout, "the findings are printed"
    assert asked == ["/r/release.json"], "nothing but the manifest was read"
    assert not dest.exists() and not cache.exists()

    forced = run_cli("install", url, *common, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "installing anyway (--force): 1 blocker" in forced.stdout
    assert f"/r/{STEM}.part01-of-01.tar.gz" in asked
    assert (dest / "bin" / "vllm-server").is_file()


def test_install_on_a_ready_host_prints_the_findings_and_proceeds(
    served_release: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, _ = served_release
    result = run_cli(
        *("install", url, "--dest", tmp_path / "vllm", "--cache-dir", tmp_path / "cache", "--plain"),
        *("--host-root", HOSTS / "strix-halo"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok    cwsr" in result.stdout and "\nready\n" in result.stdout
    assert "installing anyway" not in result.stdout


def test_install_only_warns_of_short_memory(served_release: tuple[str, list[str]], tmp_path: Path) -> None:
    """Memory held by other programs at install time is no reason to refuse: it frees up, and the
    launcher chooses its budget at each start. ``doctor`` itself still blocks on it."""
    host = tmp_path / "host"
    shutil.copytree(HOSTS / "strix-halo", host)
    (host / "sys/class/drm/renderD128/device/mem_info_gtt_used").write_text(f"{95 * 2**30}\n")
    assert run_cli("doctor", "--host-root", host).returncode == 1
    url, _ = served_release
    result = run_cli(
        *("install", url, "--dest", tmp_path / "vllm", "--cache-dir", tmp_path / "cache", "--plain"),
        *("--host-root", host),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warn  memory  HIP device 0 has 1.0 of 96.0 GiB free" in result.stdout
    assert (tmp_path / "vllm" / "bin" / "vllm-server").is_file()


def test_install_target_auto_detects_the_gpu_of_the_host_root(
    served_release: tuple[str, list[str]], tmp_path: Path
) -> None:
    """#32 M8: the GPU is detected under --host-root, where the checks that follow read (this machine
    has no /sys/class/kfd: detecting from the real /sys found no GPU at all)."""
    url, _ = served_release
    result = run_cli(
        *("install", url, "--target", "auto", "--dest", tmp_path / "vllm", "--cache-dir", tmp_path / "cache"),
        *("--plain", "--host-root", HOSTS / "strix-halo"),
        env={"ROCM_BOOTSTRAP_FORCE_GFX_ARCH": "", "ROCM_BOOTSTRAP_DISABLE_DETECTION": ""},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "this machine's GPU: gfx1151 -> target gfx1151" in result.stdout
    other = run_cli(
        *("install", url, "--target", "auto", "--dest", tmp_path / "other", "--cache-dir", tmp_path / "cache"),
        *("--plain", "--host-root", HOSTS / "desktop-dgpu-igpu"),
    )
    assert_one_line_error(other, "is the gfx1151 release, not gfx110X")


# -- hostile host trees: FIFOs, devices, huge files, odd names and text (issue #32, E2, E6, E11) ----------

#: What a host root may hold where a sysfs/procfs file belongs: each must give findings, at once.
HOSTILE_FILES = ("fifo", "dev-zero", "huge")


def _plant(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        with path.open("wb") as sparse:
            sparse.truncate(1 << 30)  # 1 GiB, sparse: costs no disk


def _unblock(path: Path) -> None:
    """Give a reader stuck on the FIFO ``path`` its end of file (a writer that opens and closes)."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def _within(seconds: float, work: Any, unblock: Any) -> tuple[bool, int]:
    """Run ``work`` in a thread; (finished in time, peak bytes Python allocated meanwhile)."""
    import tracemalloc

    tracemalloc.start()
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(seconds)
    finished = not worker.is_alive()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    if not finished:
        unblock()
        worker.join(seconds)
    return finished, peak


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_a_host_file_that_is_a_fifo_a_device_or_huge_is_read_bounded(tmp_path: Path, kind: str) -> None:
    """doctor, install's checks and the launcher's memory chooser (one reader: runtime.amdgpu) read every
    host file non-blocking, as a regular file only, and at most a page of it."""
    from vllm_bundle.runtime import gpu_memory

    pristine = HOSTS / "strix-halo-dkms"
    files = sorted(p.relative_to(pristine) for p in pristine.rglob("*") if p.is_file())
    assert len(files) > 10
    for number, file in enumerate(files):
        root = Path(shutil.copytree(pristine, tmp_path / str(number)))
        _plant(root / file, kind)
        outcome: list[object] = []

        def work(root: Path = root, outcome: list[object] = outcome) -> None:
            outcome.append(_diagnose(root, 0.5))
            outcome.append(gpu_memory.decide([], root, {}))

        finished, peak = _within(20, work, lambda root=root, file=file: _unblock(root / file))
        assert finished, f"reading {file} as a {kind} hangs"
        assert len(outcome) == 2, f"{file} as a {kind}: {outcome}"
        assert peak < 4 << 20, f"reading {file} as a {kind} took {peak} bytes"
        findings_ = outcome[0]
        assert isinstance(findings_, list) and all(isinstance(f, Finding) for f in findings_)
        render_text(findings_)
        shutil.rmtree(root)


def test_a_node_file_that_is_a_fifo_names_the_problem(tmp_path: Path) -> None:
    root = host_copy("strix-halo", tmp_path)
    _plant(root / "sys/class/drm/renderD128/device/mem_info_gtt_used", "fifo")
    (memory,) = [f for f in _diagnose(root) if f.check == "memory"]
    assert memory.status == "warn" and "mem_info_gtt_used is not a regular file" in memory.message, memory


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_doctor_reads_only_the_head_of_a_bundles_launcher(tmp_path: Path, kind: str) -> None:
    bundle = tmp_path / "bundle"
    launcher = bundle / "bin" / "vllm-server"
    launcher.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(launcher)
    else:
        with launcher.open("wb") as out:
            out.write(b"#!/bin/sh\n# Generated by vllm-bundle for vLLM 0.33.0 (gfx1151)\n")
            out.truncate(1 << 30)
    result = doctor("strix-halo", "--bundle", str(bundle))
    if kind == "fifo":
        assert_one_line_error(result, "cannot tell the target of", "--target")
    else:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "the gfx1151 bundle serves it" in findings(result)["gpu"][1]


@pytest.mark.parametrize(
    "environ",
    [
        {"HIP_VISIBLE_DEVICES": "\u00b2"},
        {"ROCR_VISIBLE_DEVICES": "1\u0662"},
        {"ROCR_VISIBLE_DEVICES": "9" * 5000},
        {"CUDA_VISIBLE_DEVICES": "0,9" + "9" * 5000},
    ],
    ids=["superscript-two", "arabic-indic-digit", "5000-digits", "5000-digits-second"],
)
def test_device_numbers_int_refuses_are_findings_not_tracebacks(environ: dict[str, str]) -> None:
    result = doctor("desktop-dgpu-igpu", env=environ)
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr and "ValueError" not in result.stderr
    line = findings(result)["gpu"][1]
    assert len(line) < 400, f"the finding repeats the whole value: {len(line)} characters"


def test_a_topology_node_folder_int_refuses_is_skipped(tmp_path: Path) -> None:
    root = host_copy("strix-halo", tmp_path)
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    shutil.copytree(nodes / "1", nodes / "\u00b2")
    result = doctor(root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "KFD node 1, a gfx1151 APU" in findings(result)["gpu"][1]


def test_host_text_is_shown_escaped_and_forges_no_row(tmp_path: Path) -> None:
    root = host_copy("strix-halo-old-kernel", tmp_path)
    forged = "6.17.0\nok    cwsr    forged\n\x1b[2J\x1b[Hready"
    (root / "proc/sys/kernel/osrelease").write_text(forged + "\n")
    result = doctor(root)
    assert result.returncode == 1
    assert "\x1b" not in result.stdout
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 7 and lines[-1] == "not ready: 1 blocker", result.stdout
    assert statuses(result)["cwsr"] == "block"
    assert "kernel 6.17.0\\nok    cwsr    forged\\n\\x1b[2J\\x1b[Hready does not export" in result.stdout


def test_a_huge_launcher_is_read_only_as_far_as_its_header(tmp_path: Path) -> None:
    import tracemalloc

    from vllm_bundle.manifests import detect_target

    launcher = tmp_path / "bin" / "vllm-server"
    launcher.parent.mkdir()
    with launcher.open("wb") as out:
        out.write(b"#!/bin/sh\n# Generated by vllm-bundle for vLLM 0.33.0 (gfx120X)\n")
        out.truncate(1 << 30)
    tracemalloc.start()
    target = detect_target(tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert target == "gfx120X"
    assert peak < 1 << 20, f"read {peak} bytes of a 1 GiB launcher"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "huge", "page"])
def test_small_files_are_read_bounded_and_regular_only(tmp_path: Path, kind: str) -> None:
    from vllm_bundle.runtime.smallfile import PAGE, NotSmallFile, read_small_bytes

    path = tmp_path / "attribute"
    path.write_bytes(b"x" * PAGE)
    if kind == "page":
        assert read_small_bytes(path) == b"x" * PAGE
        return
    if kind == "directory":
        path.unlink()
        path.mkdir()
    else:
        _plant(path, kind)
    with pytest.raises(NotSmallFile, match="is not a regular file" if kind != "huge" else "larger than 4096"):
        read_small_bytes(path)
    if kind == "huge":
        assert read_small_bytes(path, 10, head=True) == b"\0" * 10


# -- machines doctor and the launcher misjudged (issue #32, M1-M7): host trees from the kernel's formats --


def _tree(tmp_path: Path, host: host_trees.Host, name: str = "host") -> Path:
    return host_trees.write(tmp_path / name, host)


def _by_check(
    root: Path, environ: dict[str, str] | None = None, utilization: float | None = None
) -> dict[str, Finding]:
    return {f.check: f for f in _diagnose(root, utilization, environ)}


def test_dkms_on_an_mi300a_is_amds_install_path_not_a_ryzen_ai_conflict(tmp_path: Path) -> None:
    """M1: MI300A is an APU (no board_info) where amdgpu-dkms is what AMD installs; the Ryzen AI / Strix
    Halo conflict is documented for gfx1150/gfx1151/gfx1152 only."""
    found = _by_check(_tree(tmp_path, host_trees.mi300a()))
    assert "a gfx942 APU" in found["gpu"].message
    assert found["driver"].status == "ok", found["driver"]
    assert "Strix Halo" not in found["driver"].message and not found["driver"].fix
    strix = _by_check(HOSTS / "strix-halo-dkms")
    assert strix["driver"].status == "block" and "Ryzen AI / Strix Halo" in strix["driver"].message


def test_mi300x_partitions_are_discrete_and_read_their_own_memory(tmp_path: Path) -> None:
    """M2, M4: in CPX mode, partitions after the first are amdgpu_xcp render nodes with no board_info
    or mem_info_*; each is a discrete GPU whose memory is its own 24 GiB share, less what runs on it."""
    busy = {1: 20 * host_trees.GIB, 2: 23 * host_trees.GIB, 3: 23 * host_trees.GIB, 4: 23 * host_trees.GIB}
    root = _tree(tmp_path, host_trees.mi300x(8, used={**busy, 5: 23 * host_trees.GIB, 6: 23 * host_trees.GIB}))
    first = _by_check(root)
    assert "KFD node 1, a gfx942 discrete GPU" in first["gpu"].message, first["gpu"]
    assert first["driver"].status == "ok"
    assert first["memory"].status == "ok", first["memory"]
    assert "24.0 of 24.0 GiB free (this compute partition's share)" in first["memory"].message
    assert "--gpu-memory-utilization 0.92" in first["memory"].message
    second = _by_check(root, {"HIP_VISIBLE_DEVICES": "1"})
    assert "KFD node 2, a gfx942 discrete GPU" in second["gpu"].message, second["gpu"]
    assert "renderD129" in second["access"].message
    assert "4.0 of 24.0 GiB free (this compute partition's share)" in second["memory"].message, second["memory"]
    result = doctor(root, env={"HIP_VISIBLE_DEVICES": "1"})
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1] == "ready", result.stdout


def test_a_whole_mi300x_reads_the_devices_vram(tmp_path: Path) -> None:
    found = _by_check(_tree(tmp_path, host_trees.mi300x(1, used={0: 100 * host_trees.GIB})))
    assert "a gfx942 discrete GPU" in found["gpu"].message
    assert "91.3 of 192.0 GiB free;" in found["memory"].message, found["memory"]


def test_the_launcher_sizes_a_partitions_memory_from_its_share(tmp_path: Path) -> None:
    from vllm_bundle.runtime import gpu_memory

    root = _tree(tmp_path, host_trees.mi300x(8, used={1: 150 * host_trees.GIB // 100}))
    whole_device = gpu_memory.decide([], root, {})
    assert whole_device.value == 0.92, whole_device
    assert "GPU 0 has 24.0 of 24.0 GiB free (this compute partition's share)" in (whole_device.line or "")
    second = gpu_memory.decide([], root, {"ROCR_VISIBLE_DEVICES": "1"})
    assert second.value == 0.88, second


@pytest.mark.parametrize(
    ("environ", "node"),
    [
        ({"HIP_VISIBLE_DEVICES": "GPU-0a1b2c3d4e5f6071"}, 2),  # HIP's UUIDs are lower-case
        ({"HIP_VISIBLE_DEVICES": "GPU-0a1b2c"}, 2),  # a part of it matches
        ({"HIP_VISIBLE_DEVICES": "GPU-XX"}, 1),  # unique_id 0 is GPU-XX to HIP
        ({"ROCR_VISIBLE_DEVICES": "gpu-0A1B2C3D"}, 2),  # ROCr upper-cases, matches a prefix
        ({"ROCR_VISIBLE_DEVICES": "1,GPU-FFFF,0"}, 2),  # the first bad token ends the list
        ({"ROCR_VISIBLE_DEVICES": "0x1"}, 2),  # strtol(.., 0)
        ({"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0"}, 2),  # HIP indexes what ROCr left
        ({"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "1"}, 2),  # empty is unset
        ({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "1"}, 2),  # the same: vLLM is content
    ],
)
def test_uuids_and_indexes_choose_the_gpu_rocr_and_hip_choose(
    tmp_path: Path, environ: dict[str, str], node: int
) -> None:
    """M5, M7: ROCr's RvdFilter and HIP's Device::init rules (runtime/visibility.py cites them)."""
    found = _by_check(_tree(tmp_path, host_trees.radeon_beside_igpu()), environ)
    assert f"is KFD node {node}," in found["gpu"].message, found["gpu"]


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        ({"HIP_VISIBLE_DEVICES": "GPU-ffff"}, "HIP sees no GPU: GPU-ffff matches no GPU's UUID"),
        ({"HIP_VISIBLE_DEVICES": "GPU-0A1B2C3D"}, "HIP sees no GPU: GPU-0A1B2C3D matches no GPU's UUID"),
        ({"ROCR_VISIBLE_DEVICES": "GPU-XX"}, "ROCr sees no GPU: GPU-XX matches 0 GPUs' unique_id"),
        ({"ROCR_VISIBLE_DEVICES": ""}, "ROCr sees no GPU: ROCR_VISIBLE_DEVICES is set but empty"),
        ({"HIP_VISIBLE_DEVICES": " 1"}, "HIP sees no GPU: ' 1' is not a device index"),
        (
            {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"},
            "vLLM refuses to start: HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES differ",
        ),
    ],
)
def test_variables_that_leave_no_gpu_or_stop_vllm_block(tmp_path: Path, environ: dict[str, str], problem: str) -> None:
    root = _tree(tmp_path, host_trees.radeon_beside_igpu())
    found = _by_check(root, environ)
    assert list(found) == ["gpu"] and found["gpu"].status == "block", found
    assert problem in found["gpu"].message, found["gpu"]
    from vllm_bundle.runtime import gpu_memory

    decision = gpu_memory.decide([], root, environ)
    assert decision.value is None and problem in (decision.line or ""), decision


def test_partitions_sharing_a_uuid_are_named_by_index(tmp_path: Path) -> None:
    root = _tree(tmp_path, host_trees.mi300x(8))
    found = _by_check(root, {"ROCR_VISIBLE_DEVICES": "GPU-5C3A1E9F"})
    assert found["gpu"].status == "block"
    assert "matches 8 GPUs' unique_id (partitions of one GPU share its UUID: name them by index)" in (
        found["gpu"].message
    )


def test_doctor_and_the_launcher_judge_memory_by_one_rule(tmp_path: Path) -> None:
    """M6: 6 of 96 GiB free. vLLM's check accepts 0.06 (5.76 GiB); the launcher passes it when nothing
    else fits (vLLM's own 0.92 would fail), and doctor says what the launcher will do."""
    from vllm_bundle.runtime import gpu_memory

    root = host_copy("strix-halo", tmp_path)
    (root / "sys/class/drm/renderD128/device/mem_info_gtt_used").write_text(f"{90 * 2**30}\n")
    found = _by_check(root)
    assert found["memory"].status == "warn", found["memory"]
    assert "vllm-server will pass --gpu-memory-utilization 0.06, all that fits now" in found["memory"].message
    decision = gpu_memory.decide([], root, {})
    assert decision.value == 0.06 and "all that fits now" in (decision.line or "")
    assert _by_check(root, utilization=0.06)["memory"].status == "ok"
    refused = _by_check(root, utilization=0.07)["memory"]
    assert refused.status == "block" and "pass --gpu-memory-utilization 0.06 or less" in refused.fix
    (root / "sys/class/drm/renderD128/device/mem_info_gtt_used").write_text(f"{int(95.5 * 2**30)}\n")
    nothing = _by_check(root)["memory"]
    assert nothing.status == "block"
    assert "too little for vLLM to start (vLLM accepts at most --gpu-memory-utilization 0.00" not in nothing.message
    assert "vLLM accepts no value" in nothing.message or "at most --gpu-memory-utilization 0.0" in nothing.message
    assert gpu_memory.decide([], root, {}).value is None


@pytest.mark.parametrize("value", ["\u00b2", "9" * 5000, "-1", "0", ""])
def test_a_parent_pid_variable_int_refuses_arms_nothing_and_says_nothing(value: str) -> None:
    """E6 in the runtime: every Python process under the server reads VLLM_BUNDLE_PARENT_PID at start."""
    code = "from vllm_bundle.runtime import orphans; orphans.arm()"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "VLLM_BUNDLE_PARENT_PID": value},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


# -- the bundle's glibc floor (issue #50) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("needed", "have", "status", "message"),
    [
        ("2.35", "2.36", "ok", "glibc 2.36; the bundle needs glibc 2.35 or newer (its release)"),
        ("2.36", "2.36", "ok", "glibc 2.36; the bundle needs glibc 2.36 or newer (its release)"),
        ("2.38", "2.36", "block", "this machine has glibc 2.36; the bundle needs glibc 2.38 or newer (its release)"),
        ("2.35", "2.4", "block", "this machine has glibc 2.4; the bundle needs glibc 2.35 or newer (its release)"),
        ("2.35", None, "block", "this machine's C library is not glibc; the bundle needs glibc 2.35 or newer"),
    ],
)
def test_the_glibc_check_names_both_versions(needed: str, have: str | None, status: str, message: str) -> None:
    from vllm_bundle.install.doctor import glibc_check

    finding = glibc_check(needed, "its release", have)
    assert (finding.check, finding.status) == ("glibc", status) and finding.message.startswith(message), finding
    if status == "block" and have:
        assert (
            finding.fix
            == f"run it on a system with glibc {needed} or newer, or install a release built for glibc {have}"
        )


def test_doctor_of_an_installed_bundle_reads_the_floor_its_install_kept(tmp_path: Path) -> None:
    """install keeps the release's floor beside the bundle (.vllm-bundle-glibc); doctor --bundle checks this
    machine against it, and against the recipes' claim (2.35) when there is none (a Lemonade install)."""
    bundle = tmp_path / "vllm"
    (bundle / "bin").mkdir(parents=True)
    (bundle / "bin" / "vllm-server").write_text("#!/bin/sh\n# Generated by vllm-bundle for vLLM 0.33.0 (gfx1151)\n")
    claimed = doctor("strix-halo", "--bundle", str(bundle))
    assert findings(claimed)["glibc"][1].endswith("the bundle needs glibc 2.35 or newer (the floor its recipes claim)")
    (bundle / ".vllm-bundle-glibc").write_text("9.99")
    refused = doctor("strix-halo", "--bundle", str(bundle))
    assert refused.returncode == 1
    status, line = findings(refused)["glibc"]
    assert status == "block" and f"the bundle needs glibc 9.99 or newer (its release, {bundle}" in line, line
