"""What runs inside a bundle when ``bin/vllm-server`` starts (issue #22): a GPU-memory default vLLM can
start with, and no process of the server's outliving it.

Both run in the real fixture bundle's interpreter, with its ``_vllm_bundle_runtime`` and ``.pth``, under
the launcher rendered from the production template; only the server command is a stand-in. The GPU's
sysfs comes from the fixture hosts (tests/data/hosts) through ``VLLM_BUNDLE_HOST_ROOT``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO
from tests.upstream.fixture import PYTHON_MINOR
from vllm_bundle.recipes import ServerRule, load_recipes
from vllm_bundle.runtime import amdgpu, gpu_memory, orphans
from vllm_bundle.runtime.amdgpu import HOST_ROOT_VARIABLE, MemoryPool
from vllm_bundle.runtime.orphans import TOKEN_VARIABLE, VARIABLE
from vllm_bundle.tree.launcher import render_launcher

HOSTS = Path(__file__).parent / "data" / "hosts"
ORPHAN_SERVER = Path(__file__).with_name("orphan_server.py")
REPORT_ARGV = Path(__file__).with_name("report_argv.py")
RECIPES = load_recipes(REPO / "recipes")
GIB = 2**30
#: The bundle is the session's shared fixture: its interpreter must not write bytecode into it (other
#: tests compare its tree).
NO_PYC = {"PYTHONDONTWRITEBYTECODE": "1"}


def launcher_root(built: Path, root: Path, script: Path) -> Path:
    """``bin/vllm-server`` from the production template, starting ``script`` with the fixture bundle's
    interpreter (a symlink: Python finds its prefix, site-packages and the runtime through it)."""
    bundle = built / "gfx1151" / "root"
    (root / "bin").mkdir(parents=True)
    python = f"python{PYTHON_MINOR}"
    (root / "bin" / python).symlink_to(bundle / "bin" / python)
    launcher = root / "bin" / "vllm-server"
    launcher.write_text(
        render_launcher(
            python_minor=PYTHON_MINOR,
            library_dirs=[],
            attention=RECIPES.vllm.attention_rule("0.33.0"),
            vllm_version="0.33.0",
            target="gfx1151",
            server=ServerRule(RECIPES.vllm.server_rule("0.33.0").versions, (str(script),)),
        )
    )
    launcher.chmod(0o755)
    return launcher


# -- the GPU-memory default ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def argv_launcher(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return launcher_root(built, tmp_path_factory.mktemp("argv-launcher"), REPORT_ARGV)


def serve(launcher: Path, *args: str, host: Path, env: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """The arguments vLLM would get, and the launcher's own stderr lines."""
    result = subprocess.run(
        [str(launcher), *args],
        env={"PATH": os.environ["PATH"], HOST_ROOT_VARIABLE: str(host), **NO_PYC, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("vllm-server:")]
    argv: list[str] = json.loads(result.stdout)
    at = argv.index("--attention-backend")  # the launcher's attention default, not under test here
    return argv[:at] + argv[at + 2 :], said


def added(argv: list[str], given: tuple[str, ...]) -> list[str]:
    assert argv[: len(given)] == list(given), "the caller's arguments come first, unchanged"
    return argv[len(given) :]


def test_a_strix_halo_with_a_desktop_running_gets_a_budget_that_fits() -> None:
    """76.45 of 96 GiB free (the issue's report): vLLM's 0.92 would fail; 0.74 leaves 5% headroom."""
    pool = amdgpu.memory_pool(HOSTS / "strix-halo", amdgpu.gpu_nodes(HOSTS / "strix-halo")[0])
    assert (pool.kind, pool.total) == ("gtt", 96 * GIB)
    assert gpu_memory.choose(pool) == 0.74
    assert pool.free >= 0.74 * pool.total, "vLLM's own check (request_memory) passes"
    assert pool.free < gpu_memory.VLLM_DEFAULT * pool.total, "and vLLM's default would not"


def test_the_launcher_adds_the_default_and_says_so_in_one_line(argv_launcher: Path) -> None:
    given = ("--model", "/models/m", "--port", "8000")
    argv, said = serve(argv_launcher, *given, host=HOSTS / "strix-halo")
    assert added(argv, given) == ["--gpu-memory-utilization", "0.74"]
    assert said == [
        "vllm-server: GPU 0 has 76.5 of 96.0 GiB free (GTT: an APU's shared system memory); starting vLLM with "
        "--gpu-memory-utilization 0.74 (pass --gpu-memory-utilization to choose)"
    ]


def test_a_kv_cache_budget_alone_still_gets_a_utilization_vllm_starts_with(argv_launcher: Path) -> None:
    """Lemonade passes ``--kv-cache-memory-bytes 4G``; vLLM 0.33.0 still checks free memory against
    gpu_memory_utilization x total at start (vllm/v1/worker/gpu_worker.py init_device -> request_memory),
    and sizes nothing else by it when the KV budget is given: adding it overrides nothing of the caller's."""
    given = ("--model", "m", "--kv-cache-memory-bytes", "4G")
    argv, _ = serve(argv_launcher, *given, host=HOSTS / "strix-halo")
    assert added(argv, given) == ["--gpu-memory-utilization", "0.74"]


@pytest.mark.parametrize(
    "choice",
    [
        ("--gpu-memory-utilization", "0.5"),
        ("--gpu-memory-utilization=0.5",),
        ("--gpu_memory_utilization", "0.5"),  # vLLM's parser takes _ for -
        ("--device-memory-utilization", "0.5"),  # its alias
        ("--gpu-memory", "0.5"),  # an abbreviation argparse accepts
        ("--config", "serve.yaml"),  # a config file may set it: the launcher cannot tell
    ],
)
def test_the_callers_choice_is_never_overridden(argv_launcher: Path, choice: tuple[str, ...]) -> None:
    given = ("--model", "m", *choice)
    argv, said = serve(argv_launcher, *given, host=HOSTS / "strix-halo")
    assert added(argv, given) == []
    assert said == []


def test_a_discrete_gpu_uses_its_vram_and_hip_visible_devices_picks_the_gpu(argv_launcher: Path) -> None:
    host = HOSTS / "desktop-dgpu-igpu"
    nodes = amdgpu.gpu_nodes(host)
    dgpu, igpu = (amdgpu.memory_pool(host, node) for node in nodes)
    assert dgpu.kind == "vram"
    argv, said = serve(argv_launcher, "--model", "m", host=host)
    assert added(argv, ("--model", "m")) == ["--gpu-memory-utilization", f"{gpu_memory.choose(dgpu):.2f}"]
    assert said[0].startswith("vllm-server: GPU 0 has ") and "GTT" not in said[0]
    argv, said = serve(argv_launcher, "--model", "m", host=host, env={"HIP_VISIBLE_DEVICES": "1"})
    expected = gpu_memory.choose(igpu)
    assert added(argv, ("--model", "m")) == (
        [] if expected is None else ["--gpu-memory-utilization", f"{expected:.2f}"]
    )
    assert said[0].startswith("vllm-server: GPU 1 has "), said


def test_without_an_amd_gpu_nothing_is_added_or_said(argv_launcher: Path, tmp_path: Path) -> None:
    for host in (HOSTS / "no-gpu", tmp_path):  # a CPU node only; no sysfs at all
        argv, said = serve(argv_launcher, "--model", "m", host=host)
        assert (added(argv, ("--model", "m")), said) == ([], [])


def _host_copy(tmp_path: Path) -> tuple[Path, Path]:
    host = tmp_path / "host"
    shutil.copytree(HOSTS / "strix-halo", host, symlinks=True)
    node = amdgpu.gpu_nodes(host)[0]
    return host, amdgpu.device_dir(host, node)


def test_too_little_free_memory_is_said_and_left_to_vllm(argv_launcher: Path, tmp_path: Path) -> None:
    host, device = _host_copy(tmp_path)
    (device / "mem_info_gtt_used").write_text(f"{94 * GIB}\n")
    argv, said = serve(argv_launcher, "--model", "m", host=host)
    assert added(argv, ("--model", "m")) == []
    assert said == [
        "vllm-server: GPU 0 has 2.0 of 96.0 GiB free (GTT: an APU's shared system memory): too little for vLLM "
        "to start (vLLM accepts at most --gpu-memory-utilization 0.02, below the 0.05 that serves a model); "
        "close what holds GPU memory"
    ]


def test_unreadable_memory_is_said_and_the_server_still_starts(argv_launcher: Path, tmp_path: Path) -> None:
    host, device = _host_copy(tmp_path)
    (device / "mem_info_gtt_total").unlink()
    argv, said = serve(argv_launcher, "--model", "m", host=host)
    assert added(argv, ("--model", "m")) == []
    assert len(said) == 1 and said[0].startswith("vllm-server: cannot read GPU 0's memory (cannot read ")
    assert said[0].endswith("vLLM's default --gpu-memory-utilization applies")


def test_an_apus_free_memory_is_bounded_by_the_systems() -> None:
    """GTT pages are system RAM: a GTT with room is no use when the system has little available."""
    pool = MemoryPool("gtt", 96 * GIB, 0, 10 * GIB)
    assert gpu_memory.choose(pool) == 0.05
    roomy = [MemoryPool("vram", 24 * GIB, used * GIB // 4, 24 * GIB - used * GIB // 4) for used in range(96)]
    for pool in roomy:
        value = gpu_memory.choose(pool)
        if value is not None and gpu_memory.leaves_headroom(pool, value):
            assert pool.free >= value * pool.total + gpu_memory.HEADROOM_MIN_BYTES, pool
        if value is not None:  # with headroom, or else all that vLLM's own check accepts
            assert pool.free >= value * pool.total and value <= gpu_memory.VLLM_DEFAULT, pool


# -- no orphaned GPU memory ----------------------------------------------------------------------------


def _wait_for_pids(pids: Path, roles: tuple[str, ...], within: float = 60) -> dict[str, int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all((pids / f"{role}.pid").exists() for role in roles):
            return {role: int((pids / f"{role}.pid").read_text()) for role in roles}
        time.sleep(0.1)
    raise AssertionError(f"the stand-in did not start {roles} within {within} s: {sorted(os.listdir(pids))}")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _alive_after(pids: dict[str, int], seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while True:
        alive = [role for role, pid in pids.items() if _alive(pid)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


@pytest.fixture
def reaped() -> Iterator[list[int]]:
    """Pids a test started: whatever is left of them is killed afterwards."""
    started: list[int] = []
    yield started
    for pid in started:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


ROLES = ("server", "engine", "worker", "threaded")


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_sigkilled_server_leaves_no_process_behind(
    built: Path, tmp_path: Path, method: str, reaped: list[int]
) -> None:
    launcher = launcher_root(built, tmp_path / "bundle", ORPHAN_SERVER)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    env = {"PATH": os.environ["PATH"], HOST_ROOT_VARIABLE: str(HOSTS / "no-gpu"), **NO_PYC}
    server = subprocess.Popen([str(launcher), str(pids_dir), method], env=env)
    pids = _wait_for_pids(pids_dir, ROLES)
    reaped.extend(pids.values())
    assert pids["server"] == server.pid, "the launcher exec's the server"
    time.sleep(0.5)
    assert _alive_after(pids, 0) == list(ROLES), "a child whose starting thread ended lives while the server does"
    server.send_signal(signal.SIGKILL)
    server.wait()
    assert _alive_after(pids, 2.0) == [], "every process the server started is gone within 2 s"


def test_without_the_runtime_the_same_tree_outlives_the_server(built: Path, tmp_path: Path, reaped: list[int]) -> None:
    """The control: the stand-in started by the bundle's python without the launcher (no parent pid
    handed down) leaves its engine and worker running after a SIGKILL. This is what the test above
    would see if the runtime did nothing."""
    python = built / "gfx1151" / "root" / "bin" / f"python{PYTHON_MINOR}"
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    env = {**{key: value for key, value in os.environ.items() if key != VARIABLE}, **NO_PYC}
    server = subprocess.Popen([str(python), "-P", str(ORPHAN_SERVER), str(pids_dir), "spawn"], env=env)
    pids = _wait_for_pids(pids_dir, ROLES)
    reaped.extend(pids.values())
    server.send_signal(signal.SIGKILL)
    server.wait()
    assert _alive_after({k: v for k, v in pids.items() if k != "server"}, 2.0) == ["engine", "worker", "threaded"]


# -- children that never load the bundle's Python (#32, M9) ---------------------------------------------

NATIVE_ORPHAN_SERVER = Path(__file__).with_name("native_orphan_server.py")
NATIVE_ROLES = ("server", "engine", "frontend", "frontend-child", "threaded-native", "engine-native")


def _start_native_server(
    built: Path, root: Path, reaped: list[int]
) -> tuple[subprocess.Popen[bytes], dict[str, int], int]:
    """The stand-in for vLLM with its Rust frontend, under the launcher: the server, its processes' pids
    once all are started, and the port its listening socket is bound to."""
    launcher = launcher_root(built, root / "bundle", NATIVE_ORPHAN_SERVER)
    pids_dir = root / "pids"
    pids_dir.mkdir()
    env = {"PATH": os.environ["PATH"], HOST_ROOT_VARIABLE: str(HOSTS / "no-gpu"), **NO_PYC}
    server = subprocess.Popen([str(launcher), str(pids_dir)], env=env)
    reaped.append(server.pid)
    pids = _wait_for_pids(pids_dir, NATIVE_ROLES)
    reaped.extend(pids.values())
    assert pids["server"] == server.pid, "the launcher exec's the server"
    return server, pids, int((pids_dir / "port").read_text())  # written before server.pid


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _tree(pid: int) -> dict[str, int]:
    """Every process below ``pid`` now, by pid and name (whatever the runtime itself started included)."""
    return {f"{p.pid} {p.name()}": p.pid for p in psutil.Process(pid).children(recursive=True)}


def test_a_sigkilled_server_leaves_no_native_process_behind(built: Path, tmp_path: Path, reaped: list[int]) -> None:
    """vLLM's Rust frontend is a native binary: no .pth arms it. It, a child of its own, one started from
    an ended thread and one started by the engine are all gone within 2 s of a SIGKILL of the server,
    and so is the listening socket they hold; while the server lives, none of them is killed."""
    server, pids, port = _start_native_server(built, tmp_path, reaped)
    time.sleep(0.5)
    assert _alive_after(pids, 0) == list(NATIVE_ROLES), "a child lives while the server does"
    assert _listening(port)
    started = _tree(server.pid)
    reaped.extend(started.values())
    server.send_signal(signal.SIGKILL)
    server.wait()
    assert _alive_after(pids, 2.0) == [], "every process the server started is gone within 2 s"
    assert _alive_after(started, 2.0) == [], "and so is anything the runtime started for it"
    assert not _listening(port), "no process holds the server's listening socket"


def test_a_server_that_exits_leaves_no_native_process_and_no_reaper_behind(
    built: Path, tmp_path: Path, reaped: list[int]
) -> None:
    """A server that exits with status 0 (here on SIGTERM) but leaves children running: they go too, and
    nothing the runtime started for the server is left running."""
    server, pids, port = _start_native_server(built, tmp_path, reaped)
    started = _tree(server.pid)
    reaped.extend(started.values())
    reaper = [psutil.Process(pid).cmdline() for pid in started.values() if psutil.Process(pid).ppid() == server.pid]
    reaper = [argv for argv in reaper if any(arg.endswith("/_vllm_bundle_runtime/orphans.py") for arg in argv)]
    assert len(reaper) == 1, "the server has one reaper"
    assert "-B" in reaper[0], "it writes no bytecode into the bundle when the server does not"
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) == 0
    assert _alive_after(pids, 2.0) == []
    assert _alive_after(started, 2.0) == []
    assert not _listening(port)


def test_killing_a_server_kills_no_process_of_another_server_or_of_its_caller(
    built: Path, tmp_path: Path, reaped: list[int]
) -> None:
    """Two servers from the same bundle, and a child of the caller's (an installer's own process): the
    SIGKILL of one server leaves the other's processes and the caller's running."""
    killed, killed_pids, _ = _start_native_server(built, tmp_path / "killed", reaped)
    other, other_pids, other_port = _start_native_server(built, tmp_path / "other", reaped)
    callers = subprocess.Popen(["sleep", "300"])
    reaped.append(callers.pid)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert _alive_after(killed_pids, 2.0) == []
    time.sleep(0.5)
    assert _alive_after(other_pids, 0) == list(NATIVE_ROLES)
    assert _listening(other_port)
    assert callers.poll() is None
    other.send_signal(signal.SIGKILL)
    other.wait()
    assert _alive_after(other_pids, 2.0) == []
    callers.kill()
    callers.wait()  # a Popen left running is a ResourceWarning, an error under filterwarnings = error


def test_the_reaper_kills_only_the_carriers_of_its_token(reaped: list[int]) -> None:
    base = {key: value for key, value in os.environ.items() if key != TOKEN_VARIABLE}
    started = {
        name: subprocess.Popen(["sleep", "300"], env={**base, **extra})
        for name, extra in {
            "carrier": {TOKEN_VARIABLE: "1.mine"},
            "another server's": {TOKEN_VARIABLE: "2.theirs"},
            "a prefix of it": {TOKEN_VARIABLE: "1.mi"},
            "none": {},
        }.items()
    }
    reaped.extend(process.pid for process in started.values())
    assert orphans.kill_carriers("1.mine") == [started["carrier"].pid]
    assert started["carrier"].wait(timeout=2) == -signal.SIGKILL
    assert [name for name, process in started.items() if process.poll() is None] == [
        "another server's",
        "a prefix of it",
        "none",
    ]
    for process in started.values():
        process.kill()
        process.wait()


def test_a_server_that_cannot_start_its_reaper_says_so_in_one_line_and_starts() -> None:
    code = (
        "import os, sys; sys.executable = '/nonexistent/python'; from vllm_bundle.runtime import orphans;"
        " orphans.arm(); print(os.environ[orphans.VARIABLE] == str(os.getpid()), orphans.TOKEN_VARIABLE in os.environ)"
    )
    result = subprocess.run(
        ["sh", "-c", f'{VARIABLE}=$$ exec "$0" -c "$1"', sys.executable, code],
        env={key: value for key, value in os.environ.items() if key != TOKEN_VARIABLE},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "True False\n"), result.stderr
    assert result.stderr.startswith("vllm-bundle: cannot start the reaper of this server's non-Python processes: ")
    assert result.stderr.count("\n") == 1
