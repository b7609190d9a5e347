"""vLLM's ROCm build, for real: vLLM 0.33.0's own setup.py and CMake (the fixture's release, vllm_release.py)
compile HIP with the real ziglang wheel's clang behind the fake SDK (real gfx11xx code objects), through the locked
cmake, against the devel tree expanded in scratch. These
tests hold the build to what a release needs: kernels for every ISA or a one-line failure, a Python-only
vLLM only on request, the cached site stage untouched, no network, and the same bytes on any builder."""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    assert_one_line_error,
    bundle_args,
    bundle_cli,
    copy_recipes,
    lock_against,
    run_cli,
    tree_digest,
)
from tests.upstream.fixture import PYTHON_MINOR, ROCM_VERSION, VLLM_BUILT_VERSION, Fixture
from tests.upstream.registry import RegistryServer
from tests.upstream.server import UpstreamServer
from tests.upstream.vllm_release import TRITON_KERNELS_COMMIT
from vllm_bundle.recipes import load_recipes
from vllm_bundle.tree.layout import Layout, library_dirs
from vllm_bundle.util.offload import fatbin_isas

SITE = f"lib/python{PYTHON_MINOR}/site-packages"
TAG = f"vllm0.33.0-rocm{ROCM_VERSION}-gfx1151"
RULE = load_recipes(REPO / "recipes").vllm.extension_rule("0.33.0")
BUILD_ONLY = ("cmake", "wheel", "rocm-sdk-devel")


def stages_of(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {line.split()[1]: line.split()[2] for line in result.stdout.splitlines() if line.startswith("stage")}


def copy_build(built: Path, dest: Path) -> Path:
    shutil.copytree(built, dest, symlinks=True)
    return dest


# -- what a ROCm build puts in the bundle ---------------------------------------------------------------


def test_every_hip_extension_carries_code_objects_for_the_target(built: Path) -> None:
    root = built / "gfx1151" / "root"
    site = root / SITE
    for name in RULE.names:
        assert (site / "vllm" / f"{name}.abi3.so").is_file(), name
    for name in RULE.device_code:
        assert fatbin_isas(site / "vllm" / f"{name}.abi3.so") == {"gfx1151"}, name
    for name in set(RULE.names) - set(RULE.device_code):
        assert fatbin_isas(site / "vllm" / f"{name}.abi3.so") == set(), f"{name} is host C++"
    kernels = site / "vllm" / "third_party" / "triton_kernels"
    assert (kernels / "matmul_ogs.py").is_file() and (kernels / "tensor_details" / "layout.py").is_file()
    assert not (kernels / "README.md").exists(), "only the *.py of the locked triton_kernels source"
    assert not (site / "vllm" / "vllm-rs").exists(), "no Rust frontend: its crates are not locked"
    header = (root / "bin" / "vllm-server").read_text().splitlines()[3]
    assert header == "# vLLM build: rocm"
    release = json.loads((built.parent / "bundles" / TAG / "release.json").read_text())
    assert release["versions"]["vllm"] == VLLM_BUILT_VERSION, "vLLM's own local version of its ROCm build"
    builder = release["vllm_build"].pop("builder")
    assert release["vllm_build"] == {
        "device": "rocm",
        "isas": ["gfx1151"],
        "extensions": {name: ["gfx1151"] for name in RULE.device_code},
    }
    # compiled in the pinned builder image (bookworm's, as the fixture serves TheRock's name), with its GCC
    assert builder["image"].startswith("ghcr.io/rocm/therock_build_manylinux_x86_64:latest@sha256:"), builder
    assert builder["cxx"] == "/opt/rh/gcc-toolset-13/root/usr/bin/g++" and builder["glibc"] == "2.36"
    assert builder["cxx_version"].startswith("g++ (Debian 12."), builder


def test_the_bundles_vllm_is_built_by_vllms_own_setup_py_and_cmake(built: Path) -> None:
    """The stage log of the suite's bundle: vLLM 0.33.0's own configure found torch and chose the target's
    ISA, its hipify ran, and setup.py built the wheel (what no fake build script would print). (The
    workers share one build: the log names the build directory it ran in, the run's shared one.)"""
    log = (built / "gfx1151" / "logs" / "vllm-wheel.log").read_text()
    torch = f"/gfx1151/site/lib/python{PYTHON_MINOR}/site-packages/torch/lib/libtorch.so"
    assert re.search(rf"^-- Found Torch: /\S+{re.escape(torch)}$", log, re.M), "the site stage's torch"
    assert "-- Target device: rocm" in log and "-- Enabling C extension." in log
    (arches,) = [line for line in log.splitlines() if line.startswith("-- HIP supported arches: ")]
    assert "gfx1151" in arches.split(": ", 1)[1].split(";")
    assert "-- Building skinny_gemms for archs: gfx1151\n" in log, "the HIP architectures it chose: the target's"
    assert "Running hipify on all extension source files." in log
    assert "running bdist_wheel" in log and "Successfully built " in log


def test_the_extensions_load_and_name_no_build_path(built: Path, tmp_path: Path) -> None:
    """Linked against the SDK's HIP runtime (found through the launcher's library path); ``__FILE__`` was
    mapped to /vllm-bundle-build, so nothing names the directory the build ran in."""
    root = Path(shutil.copytree(built / "gfx1151" / "root", tmp_path / "elsewhere", symlinks=True))
    layout = Layout(root, PYTHON_MINOR)
    env = {"LD_LIBRARY_PATH": ":".join(str(layout.site / d) for d in library_dirs(layout))}
    code = "import ctypes, sys; [ctypes.CDLL(p) for p in sys.argv[1:]]"
    libraries = [str(layout.site / "vllm" / f"{name}.abi3.so") for name in RULE.names]
    loaded = subprocess.run([str(layout.python), "-c", code, *libraries], env=env, capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    data = (layout.site / "vllm" / "_C.abi3.so").read_bytes()
    assert b"/vllm-bundle-build/.vllm-wheel.build/src/csrc/rocm/quickreduce/torch_bindings.cpp" in data, "a real unit"
    hipified = b"/vllm-bundle-build/.vllm-wheel.build/src/build/temp.linux-x86_64-cpython-311/csrc/"
    assert hipified in data, "a unit hipify wrote into the build directory"
    assert str(built.resolve()).encode() not in data


def test_what_only_the_build_needs_is_locked_and_never_shipped(
    locked: Path, built: Path, fixture_tree: Fixture
) -> None:
    with (locked / "locks" / "stable" / "pylock.gfx1151.toml").open("rb") as handle:
        pylock = tomllib.load(handle)
    assert pylock["dependency-groups"] == ["build"]
    markers = {p["name"]: p.get("marker") for p in pylock["packages"]}
    for name in BUILD_ONLY:
        assert markers[name] == "'build' in dependency_groups", name
    assert markers["ninja"] is None, "ninja is vLLM's run-time need too (requirements/common.txt)"
    lock = tomllib.loads((locked / "locks" / "stable" / "gfx1151.toml").read_text())
    (kernels,) = [a for a in lock["artifacts"] if a["role"] == "triton-kernels"]
    filename = f"triton-{TRITON_KERNELS_COMMIT}.tar.gz"
    assert kernels["url"] == f"https://codeload.github.com/ROCm/triton/tar.gz/{TRITON_KERNELS_COMMIT}"
    assert kernels["filename"] == filename and kernels["sha256"] == fixture_tree.sha256(filename)
    assert kernels["size"] == (fixture_tree.releases / filename).stat().st_size
    site = built / "gfx1151" / "root" / SITE
    assert not list(site.glob("cmake*")) and not list(site.glob("wheel*")), "build tools stay out of the bundle"
    assert not list(site.glob("*rocm_sdk_devel*")), "no devel tree, no devel wheel in the bundle"


# -- how the build runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rebuild:
    result: subprocess.CompletedProcess[str]
    build: Path
    site_before: dict[str, str]
    requests: list[str]


@pytest.fixture(scope="module")
def offline_rebuild(
    built: Path,
    locked: Path,
    _server: UpstreamServer,
    tmp_path_factory: pytest.TempPathFactory,
    builder_registry: RegistryServer,
) -> Rebuild:
    """The wheel stage rebuilt on a copy of the suite's build, in a network namespace of its own (nothing
    reachable, not even the loopback upstream), shared by the tests that read what it did."""
    build = copy_build(built, tmp_path_factory.mktemp("offline-rebuild") / "build")
    before = tree_digest(build / "gfx1151" / "site")
    _server.reset()
    args = [
        *bundle_args(locked, _server, build, built.parent / "cache", builder_registry),
        "--offline",
        "--force",
        "vllm-wheel",
    ]
    command = ["unshare", "--net", sys.executable, "-m", "vllm_bundle", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ)
    requests = [str(entry) for entry in _server.log]
    _server.reset()
    return Rebuild(result, build, before, requests)


def test_the_build_leaves_the_cached_site_stage_as_it_was(offline_rebuild: Rebuild) -> None:
    """TheRock's ``rocm-sdk path --root`` would expand the devel tarball into the interpreter's own
    site-packages and append to other wheels' RECORD files: the build never runs it there."""
    result, build = offline_rebuild.result, offline_rebuild.build
    assert result.returncode == 0, result.stdout + result.stderr
    assert stages_of(result)["site"] == "cached" and stages_of(result)["vllm-wheel"] == "built"
    site = build / "gfx1151" / "site"
    assert tree_digest(site) == offline_rebuild.site_before, "not a byte, mode or RECORD row of the site stage changed"
    assert not (site / "lib" / f"python{PYTHON_MINOR}" / "site-packages" / "_rocm_sdk_devel").exists()
    leftovers = [p.name for p in (build / "gfx1151").iterdir() if p.name.endswith((".build", ".tmp"))]
    assert leftovers == [], "the build's scratch space is gone"


def test_the_build_opens_no_connection(offline_rebuild: Rebuild) -> None:
    """Everything the wheel stage needs is a locked, cached input: it builds with no network at all."""
    result = offline_rebuild.result
    assert "unshare failed" not in result.stderr, "this test needs unshare(1) as root (CI runs the suite as root)"
    assert result.returncode == 0, result.stdout + result.stderr
    assert stages_of(result)["vllm-wheel"] == "built"
    assert offline_rebuild.requests == [], "no request reached the upstream"


def test_a_builder_with_ccache_rust_and_a_gpu_builds_the_same_bytes(
    built: Path, locked: Path, upstream: UpstreamServer, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    """setup.py uses ccache/sccache when it finds them, builds the Rust frontend where rustc runs, and
    TheRock's rocm sdist asks ``offload-arch`` for the machine's GPU: none of it may change a byte."""
    tools, marker = tmp_path / "tools", tmp_path / "ran"
    tools.mkdir()
    scripts = {
        "ccache": f'#!/bin/sh\necho ccache >> "{marker}"\nexec "$@"\n',
        "sccache": f'#!/bin/sh\necho sccache >> "{marker}"\nexec "$@"\n',
        "rustc": "#!/bin/sh\necho 'rustc 1.95.0 (59807616e 2026-04-14)'\n",
        "cargo": f'#!/bin/sh\necho cargo >> "{marker}"\n',
        "offload-arch": "#!/bin/sh\necho gfx1100\n",
    }
    for name, text in scripts.items():
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    env = {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    args = bundle_args(locked, upstream, tmp_path / "build", built.parent / "cache", builder_registry)
    result = run_cli(*args, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not marker.exists(), f"the build ran {marker.read_text() if marker.exists() else ''}"
    assert tree_digest(tmp_path / "bundles" / TAG) == tree_digest(built.parent / "bundles" / TAG)


# Runs the CLI with one piece of the build environment changed, to show that piece is what the build needs.
PATCHED_BUILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    import vllm_bundle.tree.vllm_build as build
    change = sys.argv[1]
    original = build.rocm_environment
    def rocm_environment(*args):
        env, core = original(*args), args[2]
        if change == "no-triton-kernels":
            del env["TRITON_KERNELS_SRC_DIR"]
        elif change == "core-compiler":  # CMake takes HIPCXX; torch 2.13's LoadHIP.cmake takes HIP_CLANG_PATH
            env["HIPCXX"] = str(core / "lib" / "llvm" / "bin" / "clang++")
            env["HIP_CLANG_PATH"] = str(core / "lib" / "llvm" / "bin")
        elif change == "no-prefix-maps":  # (the HIP link flag kept: it is not a prefix map)
            env["CFLAGS"] = env["CXXFLAGS"] = ""
            env["HIPFLAGS"] = " ".join(build.HIP_LINK_FLAGS)
        elif change == "driver-rpath":
            env["HIPFLAGS"] = env["HIPFLAGS"].replace("-fno-rtlib-add-rpath", "")
        return env
    build.rocm_environment = rocm_environment
    if change == "devel-symlinks":
        build._hard_link_file_symlinks = lambda root: None
    from vllm_bundle.cli import main
    sys.exit(main(sys.argv[2:]))
""")


@pytest.mark.parametrize(
    ("change", "stage", "why"),
    [
        # vLLM's configure step clones triton_kernels unless pointed at it; the build has no network, and a
        # disconnected FetchContent configures nothing, which setup.py finds when it copies the component
        ("no-triton-kernels", "vllm-wheel", "No such file or directory: 'build/lib.linux-x86_64-cpython-3"),
        # core's compiler takes core for its ROCm root, which has no CMake packages: the devel tree's is needed
        ("core-compiler", "vllm-wheel", "does not contain the HIP runtime CMake package"),
        # TheRock turns the devel tree's file symlinks into hard links for that very reason
        ("devel-symlinks", "vllm-wheel", "does not contain the HIP runtime CMake package"),
        # without prefix maps, __FILE__ puts the build directory into the extensions
        ("no-prefix-maps", "vllm-wheel", "vllm/_C.abi3.so names the build directory"),
        # TheRock's rocm.cfg has clang add -rpath <ROCm root>/lib to every link with --hip-link (CMake's for
        # HIP targets): the devel tree in scratch, a path of the build machine (issue #50)
        ("driver-rpath", "vllm-wheel", "vllm/_C.abi3.so has a search path of the build machine: /"),
    ],
)
def test_each_part_of_the_build_environment_is_needed(
    change: str,
    stage: str,
    why: str,
    built: Path,
    locked: Path,
    upstream: UpstreamServer,
    builder_registry: RegistryServer,
    tmp_path: Path,
) -> None:
    build = copy_build(built, tmp_path / "build")
    args = [*bundle_args(locked, upstream, build, built.parent / "cache", builder_registry), "--force", "vllm-wheel"]
    result = subprocess.run(
        [sys.executable, "-c", PATCHED_BUILD, change, *args], capture_output=True, text=True, timeout=300
    )
    last = assert_one_line_error(result, quotes_a_log=True)
    assert why in last, "the error line names the build's first error"
    assert stage not in [name for name, state in stages_of(result).items() if state == "built"]
    assert not (build / "gfx1151" / f".{stage}.stage.json").exists(), "the failed stage is not stamped"


def test_an_sdk_without_its_compiler_fails_in_one_line(
    built: Path, locked: Path, upstream: UpstreamServer, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    """A rocm-sdk-core without the compiler (a path that moved, a broken wheel): one line, no fallback."""
    build = copy_build(built, tmp_path / "build")
    (build / "gfx1151" / "site" / SITE / "_rocm_sdk_core" / "lib" / "llvm" / "bin" / "clang++").unlink()
    result = bundle_cli(
        locked, upstream, build, built.parent / "cache", "--force", "vllm-wheel", builder=builder_registry
    )
    assert_one_line_error(result, "the ROCm SDK has no compiler: _rocm_sdk_core/lib/llvm/bin/clang++ is missing")
    assert not (build / "gfx1151" / "vllm-wheel").exists()


def test_a_lock_without_the_devel_wheel_fails_in_one_line(
    locked: Path, upstream: UpstreamServer, built: Path, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    """The channel names no sdk-build-wheels: the build stops naming the devel part, never Python-only."""
    recipes = copy_recipes(tmp_path / "recipes")
    channels = recipes / "channels.toml"
    channels.write_text(channels.read_text().replace('sdk-build-wheels = ["rocm-sdk-devel"]\n', ""))
    assert lock_against(upstream, recipes, "gfx1151", built.parent / "cache").returncode == 0
    result = bundle_cli(recipes, upstream, tmp_path / "build", built.parent / "cache", builder=builder_registry)
    assert_one_line_error(result, "the ROCm SDK's devel part is missing", "re-lock")
    assert "vllm-wheel" not in stages_of(result)


# -- Python-only, only when asked ------------------------------------------------------------------------


def test_a_python_only_vllm_is_built_only_when_asked_and_says_so(
    built: Path, locked: Path, upstream: UpstreamServer, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    build = copy_build(built, tmp_path / "build")
    result = bundle_cli(locked, upstream, build, built.parent / "cache", "--python-only-vllm", builder=builder_registry)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vLLM built Python-only on request (--python-only-vllm)" in result.stdout
    assert "ok   vllm-device-code   Python-only vLLM, built on request" in result.stdout
    release = json.loads((tmp_path / "bundles" / TAG / "release.json").read_text())
    assert release["vllm_build"]["device"] == "python-only" and "no GPU kernels" in release["vllm_build"]["note"]
    assert release["versions"]["vllm"] == "0.33.0+empty"
    root = build / "gfx1151" / "root"
    assert not list((root / SITE / "vllm").glob("*.so"))
    started = subprocess.run([str(root / "bin" / "vllm-server")], capture_output=True, text=True, env={}, timeout=60)
    assert "this bundle's vLLM was built Python-only on request" in started.stderr


# -- an ISA lost on the way (a multi-ISA target's code objects for each ISA: test_targets.py) --------------


@pytest.fixture(scope="module")
def rdna3(locked: Path, _server: UpstreamServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the locked recipes with a gfx110X (four ISAs) lock too."""
    recipes = tmp_path_factory.mktemp("rdna3") / "recipes"
    shutil.copytree(locked, recipes)
    result = lock_against(_server, recipes, "gfx110X", recipes.parent / "lock-cache")
    assert result.returncode == 0, result.stderr
    return recipes


def rdna3_args(recipes: Path, upstream: UpstreamServer, build: Path, *extra: str) -> list[str]:
    args = bundle_args(recipes, upstream, build, recipes.parent / "lock-cache")
    return [args[0], "gfx110X", *args[2:], "--no-archive", *extra]


def drop_gfx1103_patch(sdist: Path) -> str:
    """A patch of vLLM 0.33.0's CMakeLists.txt (in ``sdist``) that takes gfx1103 out of HIP_SUPPORTED_ARCHS."""
    with tarfile.open(sdist) as archive:
        member = archive.extractfile("vllm-0.33.0/CMakeLists.txt")
        assert member is not None
        before = member.read().decode().splitlines(keepends=True)
    (index,) = [i for i, line in enumerate(before) if line.startswith("set(HIP_SUPPORTED_ARCHS")]
    after = [*before[:index], before[index].replace(";gfx1103", ""), *before[index + 1 :]]
    hunk = difflib.unified_diff(before, after, "a/CMakeLists.txt", "b/CMakeLists.txt", n=1)
    header = "Patch: drop-gfx1103\nVersions: >=0.33\nWhy: a release (or a patch) whose list lacks an ISA.\n\n"
    return header + "".join(hunk)


def test_a_build_that_loses_an_isa_fails_in_one_line(
    rdna3: Path, upstream: UpstreamServer, fixture_tree: Fixture, tmp_path: Path
) -> None:
    """vLLM drops an ISA its list lacks without failing (cmake/utils.cmake override_gpu_arches): here a
    series without the architecture check, whose patch removes gfx1103, builds kernels for three of four."""
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "drop-gfx1103.patch").write_text(drop_gfx1103_patch(fixture_tree.files["vllm-0.33.0.tar.gz"]))
    (patches / "series").write_text("drop-gfx1103.patch\n")
    result = run_cli(*rdna3_args(rdna3, upstream, tmp_path / "build", "--patches", str(patches)), timeout=600)
    last = assert_one_line_error(result, "the ROCm build of vLLM 0.33.0 is not fit for gfx110X", quotes_a_log=True)
    assert "has no code objects for gfx1103 (it has gfx1100, gfx1101, gfx1102)" in last
    assert not (tmp_path / "build" / "gfx110X" / "vllm-wheel").exists(), "nothing stamped"


def test_a_lock_whose_build_group_loses_a_build_tool_fails_before_the_build(
    locked: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """vLLM's pyproject.toml asks for setuptools-scm and setuptools-rust (setup.py imports both): a build
    group without one (here dropped by the recipe) stops the bundle in one line, before setup.py runs.
    (Either one missing, with vLLM's real setup.py: tests/test_vllm_build_system.py.)"""
    tool = "setuptools-rust"
    recipes = tmp_path / "recipes"
    shutil.copytree(locked, recipes)
    components = recipes / "components.toml"
    text = components.read_text()
    assert text.count('drop-requirements = ["torch",') == 1
    components.write_text(text.replace('drop-requirements = ["torch",', f'drop-requirements = ["{tool}", "torch",'))
    assert lock_against(upstream, recipes, "gfx1151", tmp_path / "cache").returncode == 0
    pylock = tomllib.loads((recipes / "locks" / "stable" / "pylock.gfx1151.toml").read_text())
    assert tool not in {p["name"] for p in pylock["packages"]}
    result = run_cli(*bundle_args(recipes, upstream, tmp_path / "build", tmp_path / "cache"), timeout=600)
    assert_one_line_error(result, f"vLLM's build needs {tool}>=", "the build group lacks it", "re-lock")
    assert not (tmp_path / "build" / "gfx1151" / "logs" / "vllm-wheel.log").exists(), "setup.py never ran"
    assert not (tmp_path / "build" / "gfx1151" / "vllm-wheel").exists(), "nothing stamped"
