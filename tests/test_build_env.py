"""The ROCm build environment of vLLM, variable by variable, and the Python-only fallback."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from vllm_bundle import vllm_build
from vllm_bundle.recipes import load_recipes
from vllm_bundle.vllm_build import build_environment, max_jobs, rocm_build_env, rocm_sdk_root

RECIPES = load_recipes(REPO / "recipes")
SDK = Path("/opt/bundle/lib/python3.12/site-packages/_rocm_sdk_core")


@pytest.mark.parametrize(
    ("target", "arch"),
    [("gfx1151", "gfx1151"), ("gfx110X", "gfx1100;gfx1101;gfx1102;gfx1103")],
)
def test_rocm_build_environment(target: str, arch: str) -> None:
    env = rocm_build_env(RECIPES.target(target), SDK, jobs=3)
    assert env == {
        "VLLM_TARGET_DEVICE": "rocm",
        "PYTORCH_ROCM_ARCH": arch,
        "ROCM_PATH": str(SDK),
        "HIP_PATH": str(SDK),
        "ROCM_HOME": str(SDK),
        "CC": str(SDK / "lib/llvm/bin/amdclang"),
        "CXX": str(SDK / "lib/llvm/bin/amdclang++"),
        "HIP_DEVICE_LIB_PATH": str(SDK / "lib/llvm/amdgcn/bitcode"),
        "CMAKE_PREFIX_PATH": str(SDK / "lib/cmake"),
        "MAX_JOBS": "3",
    }


def test_max_jobs_is_bounded_by_cores_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 24 * 2**30 // 4096}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    assert max_jobs() == 24 // vllm_build.GIB_PER_COMPILE_JOB
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert max_jobs() == 2


def test_sdk_root_comes_from_rocm_sdk_path(tmp_path: Path) -> None:
    """A build interpreter whose ``rocm_sdk`` answers ``path --root`` gives the ROCm environment."""
    package = tmp_path / "site" / "rocm_sdk"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    sdk = tmp_path / "sdk root"
    (sdk / "lib" / "llvm" / "bin").mkdir(parents=True)
    (sdk / "lib" / "llvm" / "bin" / "amdclang").touch()
    (package / "__main__.py").write_text(
        f"import sys\nassert sys.argv[1:] == ['path', '--root'], sys.argv\nprint({str(sdk)!r})\n"
    )
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{package.parent}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    assert rocm_sdk_root(python) == sdk
    env = build_environment(RECIPES.target("gfx1151"), python, jobs=2)
    assert env["VLLM_TARGET_DEVICE"] == "rocm" and env["ROCM_PATH"] == str(sdk)
    (sdk / "lib" / "llvm" / "bin" / "amdclang").unlink()
    assert rocm_sdk_root(python) is None, "an SDK without its compiler cannot build HIP kernels"


def test_without_the_sdk_the_build_is_python_only() -> None:
    assert rocm_sdk_root(Path(sys.executable)) is None
    assert build_environment(RECIPES.target("gfx1151"), Path(sys.executable)) == {"VLLM_TARGET_DEVICE": "empty"}
