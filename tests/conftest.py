"""Shared fixtures: the fake upstream (built once per session, served on 127.0.0.1) and helpers."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest
from filelock import FileLock
from platformdirs import user_cache_dir

from tests.upstream.builders import publish_builder
from tests.upstream.fixture import CP, PYPI, PYTHON_RELEASE, PYTHON_VERSION, THEROCK_NEXT, Fixture, build_fixture
from tests.upstream.pypi import ZIGLANG_STAND_IN
from tests.upstream.real_wheels import build_tools, real_wheels
from tests.upstream.registry import RegistryServer
from tests.upstream.server import UpstreamServer
from tests.upstream.stand_ins import host_compiler
from vllm_bundle.recipes import load_targets

REPO = Path(__file__).resolve().parent.parent
# Built things that may outlive a run (the fixture's CPython, the build venv), each keyed by what made
# it. .ci/run points this at a new directory every time, so a warm cache can never hide a failure that
# a fresh machine would see.
TEST_CACHE = Path(os.environ.get("VLLM_BUNDLE_TEST_CACHE") or user_cache_dir("vllm-bundle-tests", appauthor=False))
# Downloads verified by sha256 (real vLLM source releases from PyPI): safe to reuse across runs.
TEST_DOWNLOADS = Path(os.environ.get("VLLM_BUNDLE_TEST_DOWNLOADS") or TEST_CACHE / "downloads")


POISON_CMAKE = """#!/bin/sh
echo "error: a host cmake was run ($0 $*): the tests run with no host cmake, builds use the locked one" >&2
exit 1
"""


# -- the quick tier, and several workers ----------------------------------------------------------------

# Fixtures that stand for a slow thing: the fake upstream (built, served, locked against), real builds,
# real downloads and compilers. A test that uses one (directly or through another fixture) is marked
# ``slow``; `nox -s tests -- -m "not slow"` runs the rest, the quick tier (docs/testing.md).
SLOW_FIXTURES = frozenset(
    {
        "fixture_tree",
        "_server",
        "upstream",
        "locked",
        "built",
        "code_objects",
        "vllm_sdist",
        "build_python",
        "build_tool_wheels",
        "builder_registry",
    }
)


#: The target x channel builds the suite makes (lock, build, tier 0, release assets), besides the shared
#: gfx1151/stable build (``built``): every target once and every channel at least once. Each build is a
#: whole pipeline run of about 40 s of CPU on the suite's 2 cores, and the 22 of the whole matrix took a
#: third of the suite's CPU (853 of 2785 s, docs/testing.md). What a target changes (its ISAs: the lock's
#: device packages, vLLM's code objects, tier 0's reading) and what a channel changes (its torch, SDK and
#: index layout) are each built here, and every pair a channel serves is locked here (test_channels.py).
#: The other pairs are built with ``--full-matrix`` (`.ci/run --full-matrix tests/test_channels.py
#: tests/test_targets.py`: CI's full-matrix job, docs/testing.md). Stable gets the targets Lemonade
#: publishes (gfx1150, gfx110X, gfx120X); nightly the CDNA4 target only LLVM 22 knows; frozen-7.14 (torch
#: 2.12) CDNA3; the per-family nightly-legacy an RDNA4 family of two ISAs, read from its fat binaries.
SUITE_BUILDS: dict[str, tuple[str, ...]] = {
    "stable": ("gfx1151", "gfx1150", "gfx110X", "gfx120X"),
    "nightly": ("gfx950",),
    "frozen-7.14": ("gfx942",),
    "nightly-legacy": ("gfx120X",),
}
FULL_MATRIX_OPTION = "--full-matrix"


#: SUITE_BUILDS as (channel, target) pairs.
SUITE_PAIRS = frozenset((channel, target) for channel, targets in SUITE_BUILDS.items() for target in targets)


def in_the_suite(channel: str, target: str) -> tuple[pytest.MarkDecorator, ...]:
    """The marks of a target x channel build case: none when the suite builds it (SUITE_BUILDS), else
    ``full_matrix`` (built only with ``--full-matrix``)."""
    return () if (channel, target) in SUITE_PAIRS else (pytest.mark.full_matrix,)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        FULL_MATRIX_OPTION,
        action="store_true",
        help="also build every target x channel pair the suite leaves out (tests/conftest.py SUITE_BUILDS)",
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if not config.getoption(FULL_MATRIX_OPTION):
        left_out = [item for item in items if item.get_closest_marker("full_matrix")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("full_matrix")]


#: Tests each of whose cases is a whole build from a lock of its own: each case is a unit of work of its own
#: for pytest-xdist (the rest of a module stays in one worker), so the suite's longest module is not a
#: queue of builds in one worker while the others have finished.
ONE_BUILD_PER_CASE = frozenset(
    {
        "tests/test_channels.py::test_every_target_is_built_qualified_and_released_on_every_channel_built_from",
        "tests/test_targets.py::test_each_target_is_built_qualified_and_released",
    }
)


def _is_build_case(nodeid: str) -> bool:
    return nodeid.split("[", 1)[0] in ONE_BUILD_PER_CASE


def unit_of_work(nodeid: str, scope: str) -> str:
    """The unit of work of a test for pytest-xdist: its own node id for a case of ONE_BUILD_PER_CASE,
    else ``scope`` (loadscope's: its module, or its class)."""
    return nodeid if _is_build_case(nodeid) else scope


#: Modules none of whose tests is slow, longest first (tests/test_suite.py checks that they stay so). On
#: a cold clean clone the worker that meets the first slow test builds the fake upstream's files (67-77 s)
#: while every other worker's first slow test waits for them: these keep those workers busy meanwhile.
STARTERS = (
    "tests/test_flat_memory.py",
    "tests/test_doctor.py",
    "tests/test_sbom.py",
    "tests/test_cli.py",
    "tests/test_workflows.py",
    "tests/test_recipes.py",
    "tests/test_layering.py",
    "tests/test_docs.py",
    "tests/test_registry_auth.py",
)


def hand_out_order(units: list[str], workers: int) -> list[str]:
    """The order the units are handed out in: one build case (its worker builds the fake upstream's
    files), the STARTERS (the other workers run them meanwhile), a build case for each other worker
    (they need the fake upstream but not the shared gfx1151 build, ``built``, which the first worker makes
    when it comes to its first module), then the rest as xdist queued them."""
    if workers < 2:
        return units
    cases = [unit for unit in units if _is_build_case(unit)]
    first = cases[:1] + [unit for unit in STARTERS if unit in units] + cases[1:workers]
    return first + [unit for unit in units if unit not in first]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist=loadscope`` (`nox -s tests`), but each case of ONE_BUILD_PER_CASE is a unit of its own.
    xdist queues the units with the most tests first, so these single cases come last and even out the
    workers' ends; a few go first instead (``hand_out_order``)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class Scheduling(LoadScopeScheduling):  # type: ignore[misc]
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid, super()._split_scope(nodeid))

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the first hand-out: the queue is complete
                self.ordered = True
                for unit in reversed(hand_out_order(list(self.workqueue), len(self.nodes))):
                    self.workqueue.move_to_end(unit, last=False)
            super()._assign_work_unit(node)

    return Scheduling(config, log)


@contextmanager
def one_worker_at_a_time(built: Path) -> Iterator[None]:
    """Hold the lock of ``built``, a thing the suite makes once in TEST_CACHE: the workers of a
    ``pytest -n`` run share that cache, so one makes it and the others wait, then reuse it."""
    built.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{built}.lock"):
        yield


@pytest.fixture(scope="session", autouse=True)
def no_host_cmake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite runs with no usable host cmake: the first ``cmake`` on PATH fails, naming itself. A vLLM
    build that reached for a builder's own cmake instead of the locked one fails here, on every machine
    (CI runners have a cmake new enough to hide that)."""
    poison = tmp_path_factory.mktemp("no-host-cmake")
    (poison / "cmake").write_text(POISON_CMAKE)
    (poison / "cmake").chmod(0o755)
    previous = os.environ["PATH"]
    os.environ["PATH"] = f"{poison}{os.pathsep}{previous}"
    yield
    os.environ["PATH"] = previous


@pytest.fixture(scope="session", autouse=True)
def host_compiler_stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This machine's g++ as a build with --no-builder finds it first on PATH: Debian's g++, compiling each
    unit of vLLM's torch extensions from its stand-in (tests/upstream/stand_ins.py), as the fixture's
    builder images' g++ does (tests/upstream/builders.py)."""
    real = shutil.which("g++")
    if real is None:
        pytest.fail("the tests need g++ (apt-get install g++): vLLM's host C++ is compiled with it")
    bin_dir = tmp_path_factory.mktemp("host-compilers")
    (bin_dir / "g++").write_text(host_compiler(str(Path(real).resolve())))
    (bin_dir / "g++").chmod(0o755)
    previous = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{previous}"
    yield
    os.environ["PATH"] = previous


@pytest.fixture(scope="session", autouse=True)
def no_registry_logins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite never reads the registry logins of whoever runs it (~/.docker/config.json, podman's
    auth.json, a credential helper): ``$REGISTRY_AUTH_FILE`` names a file that does not exist, and then
    no other file is read (vllm_bundle.oci.auth). Tests of those files set their own."""
    previous = os.environ.get("REGISTRY_AUTH_FILE")
    os.environ["REGISTRY_AUTH_FILE"] = str(tmp_path_factory.mktemp("no-logins") / "auth.json")
    yield
    if previous is None:
        os.environ.pop("REGISTRY_AUTH_FILE", None)
    else:
        os.environ["REGISTRY_AUTH_FILE"] = previous


@pytest.fixture(scope="session")
def code_objects() -> dict[str, bytes]:
    """Real code objects, by ISA, for every ISA of every target and gfx90a, from the real ziglang's clang
    (tests/code_objects.py): gfx950's too, which Debian's clang-19 cannot make."""
    from tests.code_objects import compile_code_objects, real_zig

    isas = {isa for target in load_targets(REPO / "recipes").values() for isa in target.isas} | {"gfx90a"}
    work = TEST_CACHE / "code-objects"
    with one_worker_at_a_time(work):
        return compile_code_objects(real_zig(TEST_DOWNLOADS, work), isas, work)


@pytest.fixture(scope="session")
def build_tool_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, str]:
    """vLLM's real build tools from PyPI (real_wheels.py ``BUILD_TOOLS``): wheel file -> sha256, a build
    group as the vllm-wheel stage takes it."""
    return build_tools(TEST_DOWNLOADS, CP, tmp_path_factory.mktemp("build-tools"))


@pytest.fixture(scope="session")
def fixture_tree(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    """The fake upstream's files, built once per run: under pytest-xdist the first worker builds them
    into the run's shared temporary directory and the others wait, then read what it recorded. Each
    worker serves the tree with a server of its own (``_server``: its faults and request log are its
    own); tests that add files put them under names of their own."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return _build_fixture_tree(tmp_path_factory.mktemp("upstream"))
    shared = tmp_path_factory.getbasetemp().parent  # the run's directory, above each worker's own
    record = shared / "upstream.pickle"
    with FileLock(f"{record}.lock"):
        if not record.exists():  # (a worker whose build failed left no record: build it anew)
            shutil.rmtree(shared / "upstream", ignore_errors=True)
            record.write_bytes(pickle.dumps(_build_fixture_tree(shared / "upstream")))
    fixture: Fixture = pickle.loads(record.read_bytes())
    return fixture


def _build_fixture_tree(root: Path) -> Fixture:
    root.mkdir(parents=True, exist_ok=True)
    real = real_wheels(TEST_DOWNLOADS, CP, root / "_real")
    return build_fixture(root, real, cache=TEST_CACHE / "fixture")


#: The floor the fixture's bundles have, and so claim: the fake upstream's CPython is this machine's (Debian 12,
#: glibc 2.36; fixture.py ``_python_tree``), and the host libraries it carries were built against that glibc
#: (its ``lib/libexpat.so.1`` needs ``arc4random_buf@GLIBC_2.36``). The recipes' own floor is manylinux_2_35,
#: which python-build-standalone's real CPython meets (glibc 2.17, its src/validation.rs); this one does not.
FIXTURE_PLATFORM = "x86_64-manylinux_2_36"
RECIPE_PLATFORM = 'platform = "x86_64-manylinux_2_35"'


def copy_recipes(dest: Path, *, real_toolchain: bool = False) -> Path:
    """The repository's recipes (without locks), with the CPython the fake upstream serves and the floor it
    has (FIXTURE_PLATFORM), and, unless ``real_toolchain``, the stand-in C toolchain: the real ziglang adds
    ~411 MB to every bundle the suite builds (tests/upstream/pypi.py ziglang_stand_in; test_toolchain.py
    builds one with the real one)."""
    shutil.copytree(REPO / "recipes", dest, ignore=shutil.ignore_patterns("locks"))
    components = dest / "components.toml"
    text = components.read_text()
    text = re.sub(r'(?m)^version = "3\.[0-9.]+"', f'version = "{PYTHON_VERSION}"', text, count=1)
    text = re.sub(r'(?m)^release = "[0-9]+"', f'release = "{PYTHON_RELEASE}"', text, count=1)
    assert RECIPE_PLATFORM in text, f"recipes/components.toml has no {RECIPE_PLATFORM} line"
    text = text.replace(RECIPE_PLATFORM, f'platform = "{FIXTURE_PLATFORM}"')
    if not real_toolchain:
        text, count = re.subn(r'(?m)^c = "ziglang==[^"]+"', f'c = "ziglang=={ZIGLANG_STAND_IN}"', text)
        assert count == 1, 'recipes/components.toml has no [toolchain] c = "ziglang==..." line'
    components.write_text(text)
    return dest


@pytest.fixture(scope="session")
def _server(fixture_tree: Fixture) -> Iterator[UpstreamServer]:
    server = UpstreamServer(fixture_tree.root).start()
    yield server
    server.stop()


@pytest.fixture
def upstream(_server: UpstreamServer) -> Iterator[UpstreamServer]:
    """The running fake upstream, with no faults and an empty request log."""
    _server.reset()
    yield _server
    _server.reset()


# -- the run's temporary folders ---------------------------------------------------------------------------

#: Where the run's temporary folders (``tmp_path``, ``tmp_path_factory``) go when the machine has room: a
#: RAM file system. On this suite's 2-core machine creating a file on the disk (ext4) took 0.3 ms of kernel
#: time against 0.005 ms in RAM, and test_install.py with test_safety.py took 202 s (134 s user, 68 s
#: system) with their folders on the disk against 153 s (125 s, 31 s) in RAM. How a folder lists its files
#: differs (ext4: in the order of a hash of the names; tmpfs: newest first), but on either the same files
#: list the same way in two builds: the one verify-repro run of the suite shuffles the order on purpose
#: (``shuffled_order``).
RAM_DIR = Path("/dev/shm")
#: The most a run holds in its folders at once, and beside it what its processes use. Measured on a whole
#: run (`nox -s tests`, 1137 tests, every one passing): at most 12.1 GiB in /dev/shm (the builder images: the
#: registry's storage, each cache's blobs and unpacked root file systems; 6.2 GiB before them), and the
#: machine's available memory fell by 13.7 GiB at most.
RAM_PEAK = 13 * 2**30
RAM_NEEDED = RAM_PEAK + 4 * 2**30
#: pytest's own setting: where its numbered ``pytest-of-<user>/pytest-<n>`` folders are made (and the
#: older ones removed: ``tmp_path_retention_count``).
TEMPROOT_ENV = "PYTEST_DEBUG_TEMPROOT"


def ram_temproot(mounts: str, ram_free: int, memory_available: int) -> Path | None:
    """RAM_DIR when it is a tmpfs (by ``mounts``, /proc/mounts' text) with RAM_PEAK free in it and
    RAM_NEEDED of memory available, else None (the system's temporary directory, on the disk)."""
    tmpfs = any(line.split()[1:3] == [str(RAM_DIR), "tmpfs"] for line in mounts.splitlines() if line.strip())
    return RAM_DIR if tmpfs and ram_free >= RAM_PEAK and memory_available >= RAM_NEEDED else None


def this_machines_ram_temproot() -> Path | None:
    """``ram_temproot`` of this machine, as it is now."""
    import psutil

    mounts = Path("/proc/mounts").read_text() if Path("/proc/mounts").is_file() else ""
    writable = RAM_DIR.is_dir() and os.access(RAM_DIR, os.W_OK)
    free = shutil.disk_usage(RAM_DIR).free if writable else 0
    return ram_temproot(mounts, free, psutil.virtual_memory().available)


#: The run's own ``$TMPDIR`` in RAM (``pytest_configure``), removed when the run ends.
_RUN_TMPDIR: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    """The run's folders in RAM when it has room (``ram_temproot``), unless ``--basetemp`` or
    ``$PYTEST_DEBUG_TEMPROOT`` says where. Set in the controller: pytest-xdist gives each worker a folder
    inside the controller's. Then, unless the caller set ``$TMPDIR``, the temporary files of the run's
    processes go to a folder of its own there too: tier 0 moves each bundle it checks to a temporary
    folder, by hard links when that folder is on the bundle's file system, else by a copy: on the disk
    that was a 75 MiB copy per check (about 100 in a run) and half of the run's writes to the disk."""
    if config.option.basetemp is not None or TEMPROOT_ENV in os.environ:
        return
    root = this_machines_ram_temproot()
    if root is not None:
        os.environ[TEMPROOT_ENV] = str(root)
        if "TMPDIR" not in os.environ:
            _RUN_TMPDIR.append(Path(tempfile.mkdtemp(prefix="vllm-bundle-tests-tmp-", dir=root)))
            os.environ["TMPDIR"] = str(_RUN_TMPDIR[0])
            tempfile.tempdir = None  # read again from $TMPDIR


def pytest_unconfigure(config: pytest.Config) -> None:
    for made in _RUN_TMPDIR:  # only in the process that made it (the controller)
        shutil.rmtree(made, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> str:
    if config.option.basetemp is not None:
        return f"temporary folders: {config.option.basetemp} (--basetemp)"
    root = Path(os.environ.get(TEMPROOT_ENV) or tempfile.gettempdir())
    return f"temporary folders: under {root}" + (" (in RAM)" if root == RAM_DIR else "")


@pytest.fixture
def recipes_dir(tmp_path: Path) -> Path:
    """A private copy of the repository's recipes (tests may edit it), without its locks."""
    return copy_recipes(tmp_path / "recipes")


def as_a_user(command: list[str]) -> list[str]:
    """``command`` subject to file modes: as root (CI), without the capabilities that bypass them."""
    if os.getuid() != 0:
        return command
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): file modes cannot be enforced")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]


def run_cli(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``vllm-bundle`` as a user would (a separate process), capturing its output: the same on a laptop
    and in GitHub Actions (``GITHUB_ACTIONS`` and the cache folder only where ``env`` sets them), help
    wrapped at 120 columns."""
    full_env = {**os.environ, "COLUMNS": "120", **(env or {})}
    for name in ("VLLM_BUNDLE_CACHE_DIR", "GITHUB_ACTIONS"):
        full_env.pop(name, None) if name not in (env or {}) else None
    return subprocess.run(
        [sys.executable, "-m", "vllm_bundle", *map(str, args)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


#: ``install --host-root``: a machine that can run the gfx1151 bundle (a Strix Halo's /sys and /dev).
HOST = ("--host-root", str(REPO / "tests" / "data" / "hosts" / "strix-halo"))


def install(source: str | Path, dest: Path, cache: Path, *extra: str | Path, timeout: float = 300):  # type: ignore[no-untyped-def]
    """``vllm-bundle install`` of ``source`` into ``dest`` on that machine, with plain progress."""
    return run_cli("install", source, "--dest", dest, "--cache-dir", cache, "--plain", *HOST, *extra, timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str, quotes_a_log: bool = False) -> str:
    """A user error: non-zero exit, no traceback, the last stderr line says what and how to fix.

    ``quotes_a_log``: the output may quote another program's log (with its tracebacks), but no
    traceback of ours."""
    assert result.returncode != 0, result
    if quotes_a_log:
        assert "vllm_bundle/" not in result.stderr, result.stderr
    else:
        assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in last, f"{fragment!r} not in {last!r}"
    return last


@pytest.fixture(scope="session")
def locked(_server: UpstreamServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the recipes with a gfx1151 lock of the default channel (stable) made against the fake upstream."""
    recipes = copy_recipes(tmp_path_factory.mktemp("locked") / "recipes")
    result = lock_against(_server, recipes, "gfx1151", recipes.parent / "lock-cache")
    assert result.returncode == 0, result.stderr
    return recipes


def lock_against(server: UpstreamServer, recipes: Path, target: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """`vllm-bundle lock <target>` with the fake upstream as index and release mirror."""
    return run_cli(
        "lock",
        target,
        "--recipes",
        recipes,
        "--therock-index",
        f"{server.url}/{THEROCK_NEXT}/",
        "--pypi-index",
        f"{server.url}/{PYPI}/",
        "--mirror",
        f"{server.url}/releases/",
        "--cache-dir",
        cache,
        "--plain",
    )


def _mount(command: list[str], why: str) -> None:
    """Run a mount ``command``; the test fails with ``why`` and the command's own error if it cannot."""
    mounted = subprocess.run(command, capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.fail(f"{why}: {mounted.stderr.strip()}")


@contextmanager
def small_disk(mount_point: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A real, tiny file system (tmpfs; needs root, as CI has) to fill up, or mounted read-only."""
    mount_point.mkdir(parents=True, exist_ok=True)
    options = f"ro,size={size}" if read_only else f"size={size}"
    _mount(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)], "this test mounts a tmpfs and needs root"
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@contextmanager
def shuffled_order(under: Path, mount_point: Path) -> Iterator[Path]:
    """``under`` seen at ``mount_point`` through disorderfs (Debian's; FUSE), which lists every folder in a
    new random order each time it is read: reprotest's file-ordering variation, the adversary of a build
    that lists a folder and keeps the order it got. Checked before use: a folder of 26 files, written in
    order, lists in another order than it was written, and in another order when read again."""
    if shutil.which("disorderfs") is None or shutil.which("fusermount") is None:
        pytest.fail("this test needs disorderfs and FUSE (apt-get install disorderfs; .ci/run does)")
    under.mkdir(parents=True, exist_ok=True)
    mount_point.mkdir(parents=True, exist_ok=True)
    command = ["disorderfs", "--quiet", "--shuffle-dirents=yes", str(under), str(mount_point)]
    _mount(command, "disorderfs could not mount (this test needs FUSE: /dev/fuse)")
    try:
        probe = mount_point / ".order-probe"
        probe.mkdir()
        names = [chr(ord("a") + i) for i in range(26)]
        for name in names:
            (probe / name).touch()
        listings = [os.listdir(probe), os.listdir(probe)]
        assert sorted(listings[0]) == names and names not in listings and listings[0] != listings[1], listings
        shutil.rmtree(probe)
        yield mount_point
    finally:
        if subprocess.run(["fusermount", "-u", str(mount_point)], capture_output=True, check=False).returncode:
            subprocess.run(["fusermount", "-u", "-z", str(mount_point)], capture_output=True, check=False)


class _FillingFile:
    """A file opened for writing on a disk that fills up after ``room`` bytes."""

    def __init__(self, handle: IO[Any], room: int) -> None:
        self.handle, self.room = handle, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return int(self.handle.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def __enter__(self) -> _FillingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()


def disk_filling_up(monkeypatch: pytest.MonkeyPatch, room: int) -> None:
    """A full disk without a mount: every file opened for writing through ``os.fdopen`` from now on (the
    download cache's files, extracted files) takes ``room`` bytes, then its write fails with ENOSPC."""
    real = os.fdopen

    def fdopen(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real(fd, mode, *args, **kwargs)
        return _FillingFile(handle, room) if "w" in mode or "a" in mode else handle

    monkeypatch.setattr(os, "fdopen", fdopen)


# -- real vLLM source releases (PyPI), cached across test runs --------------------------------------

OLD_VLLM = "0.11.0"  # its CMakeLists.txt lacks gfx1150/gfx1151


class VllmSdists:
    """Real vLLM source releases from PyPI, verified against PyPI's sha256 and downloaded once into a
    cache that outlives the test run (by the production fetcher, several at a time)."""

    def __init__(self) -> None:
        from vllm_bundle.util.cache import Cache
        from vllm_bundle.util.fetch import Fetcher
        from vllm_bundle.util.progress import PlainReporter

        self.fetcher = Fetcher(Cache(TEST_DOWNLOADS), PlainReporter(), jobs=8)
        self._index: dict[str, Any] | None = None
        self._found: dict[str, Path] = {}

    def _artifact(self, version: str) -> Any:
        from vllm_bundle.inputs.simple_index import project_files
        from vllm_bundle.util.fetch import Artifact

        if self._index is None:  # one read of PyPI's file list for every version asked for
            self._index = {f.filename: f for f in project_files(self.fetcher.session, PYPI_URL, "vllm")}
        entry = self._index[f"vllm-{version}.tar.gz"]
        assert entry.sha256
        return Artifact("vllm", entry.filename, entry.url, entry.sha256, entry.size)

    def many(self, versions: Sequence[str]) -> dict[str, Path]:
        wanted = [v for v in versions if v not in self._found]
        artifacts = {v: self._artifact(v) for v in wanted}
        fetched = self.fetcher.fetch_all(list(artifacts.values()))
        self._found.update({v: fetched[a.sha256] for v, a in artifacts.items()})
        return {v: self._found[v] for v in versions}

    def __call__(self, version: str) -> Path:
        return self.many([version])[version]


PYPI_URL = "https://pypi.org/simple/"


@pytest.fixture(scope="session")
def vllm_sdist() -> VllmSdists:
    """``vllm_sdist("0.33.0")`` (or ``vllm_sdist.many([...])``): real vLLM source releases from PyPI."""
    return VllmSdists()


@pytest.fixture(scope="session")
def build_python() -> Path:
    """A build interpreter for the Python-only vLLM wheel: a venv with PyPI's torch (its CUDA build, with
    the nvidia-* wheels it requires: PyPI has no other) and vLLM's build tools, kept between runs in the
    test cache (keyed by what is installed; .ci/run starts that cache anew)."""
    requirements = [
        "torch==2.13.0",
        "setuptools>=77,<80",
        "setuptools-scm>=8",
        "setuptools-rust>=1.9",
        "wheel",
        "jinja2",
        "packaging>=24.2",
    ]
    key = hashlib.sha256(json.dumps([sys.version, requirements]).encode()).hexdigest()[:12]
    venv = TEST_CACHE / f"build-venv-{key}"
    python = venv / "bin" / "python"
    with one_worker_at_a_time(venv):
        _make_build_venv(venv, requirements)
    return python


def _make_build_venv(venv: Path, requirements: list[str]) -> None:
    """The venv, by uv, its downloads kept with the suite's (TEST_DOWNLOADS: uv checks each wheel against
    the index's hash), so a machine that ran the suite before installs by links from that cache. With
    nothing cached, uv fetched and installed the 4.5 GB in 33 s (26 s of CPU) here; pip's own cache is in
    ``$HOME``, which a clean run starts without."""
    import uv

    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        tool = uv.find_uv_bin()
        subprocess.run([tool, "venv", "--quiet", "--seed", "--python", sys.executable, str(venv)], check=True)
        cache = ["--cache-dir", str(TEST_DOWNLOADS / "uv")]
        # no bytecode (uv's default): torch's would take twice the time of the install itself
        python = ["--python", str(venv / "bin" / "python")]
        subprocess.run([tool, "pip", "install", "--quiet", *cache, *python, *requirements], check=True)
        (venv / ".complete").touch()


# -- whole bundles -------------------------------------------------------------------------------------

TEST_REPO = "example-org/vllm-rocm-bundles"
PART_SIZE = 8 * 1024 * 1024  # small parts, so the fixture bundle spans several


def bundle_args(
    locked: Path, upstream: UpstreamServer, build: Path, cache: Path, builder: RegistryServer | None = None
) -> list[str]:
    """``bundle gfx1151`` against the fake upstream, assets in ``build``'s sibling ``bundles/``; vLLM compiled
    in the builder image ``builder`` serves (``builder_registry``), or with --no-builder on this machine."""
    where = ["--registry-mirror", builder.host] if builder is not None else ["--no-builder"]
    return [
        *("bundle", "gfx1151", "--recipes", str(locked), "--cache-dir", str(cache)),
        *("--mirror", f"{upstream.url}/mirror/", "--build-dir", str(build)),
        *("--bundles-dir", str(build.parent / "bundles"), "--repo", TEST_REPO, "--part-size", str(PART_SIZE)),
        "--plain",
        *where,
    ]


def bundle_cli(  # type: ignore[no-untyped-def]
    locked: Path, upstream: UpstreamServer, build: Path, cache: Path, *extra: str, builder: RegistryServer | None = None
):
    return run_cli(*bundle_args(locked, upstream, build, cache, builder), *extra, timeout=300)


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's directory every worker of pytest-xdist sees (above each worker's own), or this one's."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


@pytest.fixture(scope="session")
def builder_registry(fixture_tree: Fixture, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A registry of this worker's serving the run's builder images (tests/upstream/builders.py), with
    bookworm's (the recipe's ``latest``) in it. Their storage is the run's: the first worker that asks
    publishes an image, and every worker's registry serves it."""
    storage = run_dir(tmp_path_factory) / "builders"
    storage.mkdir(parents=True, exist_ok=True)
    server = RegistryServer(tmp_path_factory.mktemp("builder-registry"), storage=storage / "data").start()
    publish_builders(server, fixture_tree, "bookworm")
    yield server
    server.stop()


def publish_builders(server: RegistryServer, fixture_tree: Fixture, *suites: str) -> None:
    """The builder images of Debian's ``suites``, published in the run's storage that ``server`` serves,
    each once per run."""
    storage = server.storage
    assert storage is not None, "a builder registry serves the run's storage"
    for suite in suites:
        published = storage.parent / f"{suite}.published"
        with one_worker_at_a_time(published):
            if not published.exists():  # made on the disk (TEST_CACHE), not in the run's RAM: 0.5-1 GB each
                work = TEST_CACHE / f"builders-{os.getpid()}"
                publish_builder(server, suite, fixture_tree.root / "_work" / "sdk-clang", work)
                published.touch()


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry of a tree: file contents and modes, symlink targets."""
    entries = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            entries[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            entries[rel] = f"{oct(path.stat().st_mode)} {hashlib.sha256(path.read_bytes()).hexdigest()}"
    return entries


def publish(built: Path, server: UpstreamServer) -> str:
    """The suite's release (of ``built``) on the fake upstream under ``/releases/download/<tag>/``, as
    GitHub serves a release's assets; its URL. The upstream's files are shared by every worker of the run:
    the first to publish copies the assets, under a lock, and the others find them."""
    (assets,) = [path for path in (built.parent / "bundles").iterdir() if (path / "release.json").is_file()]
    published = server.root / "releases" / "download" / assets.name
    with one_worker_at_a_time(published):
        if not published.exists():
            shutil.copytree(assets, published.with_name(f".{assets.name}.tmp"), dirs_exist_ok=True)
            published.with_name(f".{assets.name}.tmp").rename(published)
    return f"{server.url}/releases/download/{assets.name}/"


def seed_vllm_build(
    built: Path, build: Path, target: str = "gfx1151", stages: tuple[str, ...] = ("vllm-src", "vllm-wheel")
) -> Path:
    """The suite's one real vLLM build for a test that needs a bundle but does not test the build: the
    built bundle's ``stages`` (``vllm-src`` and ``vllm-wheel``) with their stamps, copied into ``build``. The
    pipeline reuses them only where its own inputs give the same stage keys (site, source, build group,
    ISAs...) and builds anew otherwise, as it would after any earlier run."""
    done = built / target
    (build / target).mkdir(parents=True, exist_ok=True)
    for stage in stages:
        shutil.copytree(done / stage, build / target / stage, symlinks=True)
        shutil.copy2(done / f".{stage}.stage.json", build / target / f".{stage}.stage.json")
    return build


@pytest.fixture(scope="session")
def built(
    locked: Path, _server: UpstreamServer, builder_registry: RegistryServer, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """One full bundle build for gfx1151 (build dir returned; its cache and assets beside it).

    Under pytest-xdist the workers share the build itself: the first to come builds it (with its own lock,
    against its own server) into the run's shared directory, and every worker then runs ``bundle`` with its
    own lock on a copy of that build directory and cache. The stages are found up to date by their keys,
    which name the inputs' sha256, not their URLs; only the release, which records the lock's hash, is made
    again (1-2 s instead of a whole build per worker)."""
    work = tmp_path_factory.mktemp("bundle")
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = _shared_build(locked, _server, builder_registry, tmp_path_factory.getbasetemp().parent / "built")
        subprocess.run(["cp", "-a", str(shared / "build"), str(work / "build")], check=True)  # its hard links kept
        # The cache by hard links, not a copy of the builder image's hundreds of MB (its blobs and the builder
        # stage's root file system): the tool never writes a cached file in place (a new file is renamed over
        # it), and a test that damages one writes a file of its own in its place (test_safety.py _corrupt).
        subprocess.run(["cp", "-al", str(shared / "cache"), str(work / "cache")], check=True)
    result = bundle_cli(locked, _server, work / "build", work / "cache", builder=builder_registry)
    assert result.returncode == 0, result.stdout + result.stderr
    return work / "build"


def _shared_build(locked: Path, server: UpstreamServer, builder: RegistryServer, shared: Path) -> Path:
    """The run's one gfx1151 build (``shared``), made by the first worker that asks for it."""
    with one_worker_at_a_time(shared):
        if not (shared / ".complete").exists():  # (a worker whose build failed left no mark: build anew)
            shutil.rmtree(shared, ignore_errors=True)
            result = bundle_cli(locked, server, shared / "build", shared / "cache", builder=builder)
            assert result.returncode == 0, result.stdout + result.stderr
            (shared / ".complete").touch()
    return shared
