"""The environment of vLLM's build, variable by variable: only what the recipe and lock say, nothing of
the builder's."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from tests.conftest import REPO
from vllm_bundle.errors import BuildError
from vllm_bundle.recipes import load_recipes
from vllm_bundle.tree import vllm_build
from vllm_bundle.tree.builder import Tools
from vllm_bundle.tree.vllm_build import (
    DEAD_PROXY,
    HIP_LAUNCHER,
    MAPPED_PREFIX,
    RocmInputs,
    base_environment,
    max_jobs,
    rocm_environment,
)

RECIPES = load_recipes(REPO / "recipes")
#: What a builder's probe found (tree/builder.py): the host compilers are the builder's GCC.
TOOLS = Tools("/usr/bin/gcc", "/usr/bin/g++", "g++ (GCC) 13.3.1", "/usr/bin/patch", "GNU patch 2.7.6", "2.28")


def _devel(tmp_path: Path) -> Path:
    devel = tmp_path / "build dir" / ".vllm-wheel.build" / "site" / "_rocm_sdk_devel"
    (devel / "lib" / "llvm" / "bin").mkdir(parents=True)
    for name in ("clang", "clang++"):
        (devel / "lib" / "llvm" / "bin" / name).touch()
    return devel


def _rocm(tmp_path: Path) -> RocmInputs:
    rule = RECIPES.vllm.extension_rule()
    return RocmInputs(None, "python/triton_kernels/triton_kernels", "Release", rule)


@pytest.mark.parametrize(("target", "arch"), [("gfx1151", "gfx1151"), ("gfx110X", "gfx1100;gfx1101;gfx1102;gfx1103")])
def test_rocm_build_environment(tmp_path: Path, target: str, arch: str) -> None:
    devel, core = _devel(tmp_path), tmp_path / "site" / "_rocm_sdk_core"
    root = tmp_path / "build dir"
    kernels = tmp_path / "kernels"
    env = rocm_environment(RECIPES.target(target), devel, core, _rocm(tmp_path), kernels, root, TOOLS)
    llvm = devel / "lib" / "llvm" / "bin"
    assert env["VLLM_TARGET_DEVICE"] == "rocm" and env["PYTORCH_ROCM_ARCH"] == arch
    assert env["ROCM_PATH"] == env["ROCM_HOME"] == env["HIP_PATH"] == str(devel), "the devel tree is the ROCm root"
    assert env["HIPCXX"] == str(llvm / "clang++"), "HIP with the SDK's clang"
    assert (env["CC"], env["CXX"]) == ("/usr/bin/gcc", "/usr/bin/g++"), "host C and C++ with the builder's GCC"
    assert env["HIP_DEVICE_LIB_PATH"] == str(core / "lib/llvm/amdgcn/bitcode"), "as vLLM's Dockerfile.rocm_base"
    assert env["CMAKE_PREFIX_PATH"] == str(devel / "lib/cmake") and env["CMAKE_BUILD_TYPE"] == "Release"
    assert env["TRITON_KERNELS_SRC_DIR"] == str(kernels)
    maps = [f"-ffile-prefix-map={root}={MAPPED_PREFIX}"]
    for flags in ("CFLAGS", "CXXFLAGS"):
        assert shlex.split(env[flags]) == maps, "quoted: the path has a space"
    # TheRock's rocm.cfg has every link with --hip-link add -rpath <ROCm root>/lib: off, on the command line
    assert shlex.split(env["HIPFLAGS"]) == [*maps, "-fno-rtlib-add-rpath"]
    cmake_args = env["CMAKE_ARGS"].split()  # setup.py splits it at spaces
    assert cmake_args == [
        "-DCMAKE_C_COMPILER_LAUNCHER=",
        "-DCMAKE_CXX_COMPILER_LAUNCHER=",
        f"-DCMAKE_HIP_COMPILER_LAUNCHER={HIP_LAUNCHER}",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    ]
    assert env["VLLM_DISABLE_SCCACHE"] == "1"


def test_the_sdk_without_its_compiler_is_one_line(tmp_path: Path) -> None:
    devel = _devel(tmp_path)
    (devel / "lib" / "llvm" / "bin" / "clang++").unlink()
    with pytest.raises(
        BuildError, match=r"the ROCm SDK has no compiler: _rocm_sdk_core/lib/llvm/bin/clang\+\+ is missing"
    ):
        rocm_environment(RECIPES.target("gfx1151"), devel, tmp_path, _rocm(tmp_path), None, tmp_path, TOOLS)


def test_nothing_of_the_builders_environment_leaks_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Variables that would change what vLLM builds (or fetch a prebuilt wheel) are not passed on."""
    for name, value in {
        "CMAKE_ARGS": "-DFOO=1",
        "VLLM_USE_PRECOMPILED": "1",
        "PYTORCH_ROCM_ARCH": "gfx90a",
        "LD_LIBRARY_PATH": "/opt/rocm/lib",
        "CMAKE_BUILD_TYPE": "Debug",
        "CCACHE_DIR": "/ccache",
        "PIP_INDEX_URL": "https://example.org/simple",
        "https_proxy": "http://proxy.example:3128",
    }.items():
        monkeypatch.setenv(name, value)
    env = base_environment(tmp_path, [tmp_path / "bin"], 1763596800, jobs=3)
    assert set(env) == {
        *("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TZ", "SOURCE_DATE_EPOCH", "MAX_JOBS"),
        *("PYTHONPYCACHEPREFIX", "PYTHONNOUSERSITE", "PYTHONHASHSEED"),
        *("PIP_NO_INDEX", "PIP_CONFIG_FILE", "PIP_DISABLE_PIP_VERSION_CHECK", "CARGO_NET_OFFLINE", "HF_HUB_OFFLINE"),
        *("GIT_TERMINAL_PROMPT", "no_proxy", "NO_PROXY"),
        *("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"),
    }
    assert env["https_proxy"] == DEAD_PROXY and env["PIP_NO_INDEX"] == "1", "no network"
    assert env["PATH"].startswith(f"{tmp_path / 'bin'}{os.pathsep}"), "the build's own tools first"
    assert env["HOME"].startswith(str(tmp_path)) and env["TMPDIR"].startswith(str(tmp_path))
    assert env["SOURCE_DATE_EPOCH"] == "1763596800" and env["MAX_JOBS"] == "3"


def test_the_builds_interpreters_share_byte_code_in_scratch_and_write_none_beside_a_source(tmp_path: Path) -> None:
    """A vLLM build starts the site stage's Python some twenty times (setup.py, CMake's probes, hipify,
    torch's queries), and python-build-standalone's CPython ships no byte code: each of them compiled
    every module it imported anew. The build's interpreters write it under scratch, which goes with the
    build, and never beside a source: not into a finished stage (the site), not into vLLM's sources."""
    import subprocess
    import sys

    source = tmp_path / "stage" / "a_module.py"
    source.parent.mkdir()
    source.write_text("VALUE = 1\n")
    env = base_environment(tmp_path / "scratch", [tmp_path / "bin"], 1763596800, jobs=1)
    env["PYTHONPATH"] = str(source.parent)
    for _ in range(2):
        subprocess.run([sys.executable, "-c", "import a_module"], env=env, check=True)
    assert not (source.parent / "__pycache__").exists(), "nothing written beside the source"
    cached = list((tmp_path / "scratch").rglob("a_module.*.pyc"))
    assert len(cached) == 1 and cached[0].is_relative_to(tmp_path / "scratch"), cached


def test_max_jobs_is_bounded_by_cores_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 24 * 2**30 // 4096}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    assert max_jobs() == 24 // vllm_build.GIB_PER_COMPILE_JOB
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert max_jobs() == 2


def test_a_devel_link_to_a_file_its_wheel_lacks_is_named_in_one_line(tmp_path: Path) -> None:
    """TheRock's devel tree links each runtime file into its wheel's directory: a link whose wheel is
    there but not the file names the file (a wheel missing altogether is tests/test_vllm_build_system.py's)."""
    site = tmp_path / "site"
    (site / "_rocm_sdk_libraries" / "lib").mkdir(parents=True)
    (site / "_rocm_sdk_devel" / "lib").mkdir(parents=True)
    (site / "_rocm_sdk_devel" / "lib" / "librocblas.so.5").symlink_to("../../_rocm_sdk_libraries/lib/librocblas.so.5")
    (site / "_rocm_sdk_devel" / "lib" / "librocblas.so").symlink_to("librocblas.so.5")
    with pytest.raises(BuildError) as raised:
        vllm_build._require_no_dangling_links(site / "_rocm_sdk_devel", site)
    assert str(raised.value).startswith(
        "the ROCm SDK's devel tree has 2 link(s) to nothing, e.g. _rocm_sdk_devel/lib/librocblas.so.5 -> "
        "../../_rocm_sdk_libraries/lib/librocblas.so.5 (lib/librocblas.so.5 is not in the site stage's "
        "_rocm_sdk_libraries) ("
    )


def test_the_devel_tree_links_to_the_site_stage_from_a_relative_build_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nox -s bundle -- gfx1151` builds in ./build, a relative path: the devel tree's link to the site
    stage's core must lead there from scratch, not be a relative link that means something else where it
    lies (it stopped every build from the default --build-dir: "the ROCm SDK has no compiler")."""
    import io
    import tarfile

    monkeypatch.chdir(tmp_path)
    core = Path("build/gfx1151/site/lib/python3.11/site-packages/_rocm_sdk_core")
    for name in ("clang", "clang++"):
        (core / "lib/llvm/bin").mkdir(parents=True, exist_ok=True)
        (core / "lib/llvm/bin" / name).write_text("#!/bin/sh\n")
    site = Path("build/gfx1151/.vllm-wheel.build/site")
    (site / "rocm_sdk_devel").mkdir(parents=True)
    with tarfile.open(site / "rocm_sdk_devel" / "_devel.tar", "w") as tar:
        for name in ("clang", "clang++"):
            link = tarfile.TarInfo(f"_rocm_sdk_devel/lib/llvm/bin/{name}")
            link.type, link.linkname = tarfile.SYMTYPE, f"../../../../_rocm_sdk_core/lib/llvm/bin/{name}"
            tar.addfile(link)
        tar.addfile(tarfile.TarInfo("_rocm_sdk_devel/README"), io.BytesIO(b""))
    devel = vllm_build.expand_devel(site, core)
    assert vllm_build.compilers(devel)[0].read_text() == "#!/bin/sh\n"
