"""Every target from lock to release on the fake upstream (#33, point 1). gfx1151 is the suite's own
build (``built``); here each other target of recipes/targets.toml is locked on the default channel,
built (vLLM 0.33.0's own CMake compiling real code objects for each of the target's ISAs, gfx110X's four
too, with the fake SDK's compiler, the real ziglang wheel's clang: LLVM 22, which knows gfx950),
qualified by tier 0 and written as release assets. The other channels: test_channels.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, bundle_args, in_the_suite, lock_against, run_cli
from tests.upstream.fixture import PYTHON_MINOR, ROCM_VERSION
from tests.upstream.server import UpstreamServer
from vllm_bundle.recipes import load_recipes, load_targets
from vllm_bundle.util.offload import fatbin_isas

SITE = f"lib/python{PYTHON_MINOR}/site-packages"
COVERED_ELSEWHERE = {"gfx1151"}
TARGETS = load_targets(REPO / "recipes")
DEVICE_CODE = load_recipes(REPO / "recipes").vllm.extension_rule("0.33.0").device_code


def _bundle(target: str, locked: Path, upstream: UpstreamServer, work: Path) -> list[str]:
    """The arguments that bundle ``target`` from a copy of the locked recipes with ``target`` locked too."""
    recipes = work / "recipes"
    shutil.copytree(locked, recipes)
    result = lock_against(upstream, recipes, target, work / "cache")
    assert result.returncode == 0, result.stderr
    args = bundle_args(recipes, upstream, work / "build", work / "cache")
    # the build and release directories as the README's command has them: relative, ./build and ./bundles
    relative = {str(work / "build"): "build", str(work / "bundles"): "bundles"}
    return [args[0], target, *(relative.get(arg, arg) for arg in args[2:])]


@pytest.mark.parametrize(
    "target", [pytest.param(t, marks=in_the_suite("stable", t)) for t in sorted(set(TARGETS) - COVERED_ELSEWHERE)]
)
def test_each_target_is_built_qualified_and_released(
    target: str, locked: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    args = _bundle(target, locked, upstream, tmp_path)
    result = run_cli(*args, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    isas = list(TARGETS[target].isas)
    site = tmp_path / "build" / target / "root" / SITE
    for name in DEVICE_CODE:
        assert fatbin_isas(site / "vllm" / f"{name}.abi3.so") == set(isas), name
    (assets,) = [path for path in (tmp_path / "bundles").iterdir() if path.is_dir()]
    assert assets.name == f"vllm0.33.0-rocm{ROCM_VERSION}-{target}"
    release = json.loads((assets / "release.json").read_text())
    assert release["target"] == target and release["vllm_build"]["isas"] == isas, release
    assert release["vllm_build"]["extensions"] == dict.fromkeys(DEVICE_CODE, isas)
    tier0 = release["qualification"]["tier0"]
    assert tier0["passed"] and tier0["checks"]["device-code"] and tier0["checks"]["vllm-device-code"], tier0
    sums = (assets / "SHA256SUMS").read_text()
    assert f"{assets.name}-x64.partcount" in sums and "backend_versions.json" in sums
    # compiled on this machine, as asked (--no-builder): said so, and held to the floor the fixture claims
    assert release["vllm_build"]["builder"]["host"] is True and "--no-builder" in release["vllm_build"]["note"]
    assert tier0["checks"]["symbol-versions"] and release["floor"]["claimed"] == "x86_64-manylinux_2_36"
    if target == "gfx1150":
        _held_to_the_recipes_floor(tmp_path / "build" / target / "root", tmp_path)


def _held_to_the_recipes_floor(root: Path, tmp_path: Path) -> None:
    """The same bundle, built on this machine (Debian 12, glibc 2.36), claiming the repository recipes' floor
    (manylinux_2_35): tier 0 names each file that needs more, with the symbol. Here that is what the fake
    CPython copied from this machine (its libexpat needs arc4random_buf@GLIBC_2.36); on a newer builder
    (ubuntu-24.04: glibc 2.39) vLLM's own cumem_allocator would be among them (test_builder.py)."""
    report = tmp_path / "floor-2.35.json"
    result = run_cli("qualify", root, "--recipes", REPO / "recipes", "--report", report, "--warn-only", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (check,) = [c for c in json.loads(report.read_text())["checks"] if c["name"] == "symbol-versions"]
    assert not check["passed"] and check["problems"], check
    above = re.compile(
        r"^\S+ needs \S+@GLIBC_2\.(3[6-9]|[4-9][0-9]) \(libc\.so\.6\): above the floor "
        r"manylinux_2_35_x86_64 \(GLIBC <= 2\.35\)$"
    )
    assert all(above.match(problem) for problem in check["problems"] if "more" not in problem), check["problems"]
