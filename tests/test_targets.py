"""Every target from lock to release on the fake upstream (#33, point 1). gfx1151 is the suite's own
build (``built``); here each other target of recipes/targets.toml is locked on the default channel,
built (vLLM 0.33.0's own CMake compiling real code objects for each of the target's ISAs, gfx110X's four
too, with the fake SDK's compiler, the real ziglang wheel's clang: LLVM 22, which knows gfx950),
qualified by tier 0 and written as release assets. The other channels: test_channels.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, bundle_args, lock_against, run_cli
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
    return [args[0], target, *args[2:]]


@pytest.mark.parametrize("target", sorted(set(TARGETS) - COVERED_ELSEWHERE))
def test_each_target_is_built_qualified_and_released(
    target: str, locked: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    args = _bundle(target, locked, upstream, tmp_path)
    result = run_cli(*args, timeout=600)
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
