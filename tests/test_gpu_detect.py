"""``--target auto``: the GPU's ISA from captured KFD topology trees, mapped to a target."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_bundle.errors import BundleError
from vllm_bundle.gpu_detect import isa_from_target_version, kfd_isas, target_for_isas
from vllm_bundle.recipes import Recipes, load_recipes

SYSFS = Path(__file__).parent / "data" / "sysfs"


@pytest.fixture(scope="module")
def recipes() -> Recipes:
    return load_recipes(Path("recipes"))


@pytest.mark.parametrize(
    ("version", "isa"),
    [(110501, "gfx1151"), (110000, "gfx1100"), (90010, "gfx90a"), (90402, "gfx942"), (120001, "gfx1201")],
)
def test_gfx_target_version_decodes_with_hex_minor_and_stepping(version: int, isa: str) -> None:
    assert isa_from_target_version(version) == isa


def test_strix_halo_is_gfx1151(recipes: Recipes) -> None:
    isas = kfd_isas(SYSFS / "strix-halo-gfx1151")
    assert isas == ["gfx1151"]
    assert target_for_isas(recipes, isas) == "gfx1151"


def test_a_7900_xtx_beside_an_unsupported_igpu_is_gfx110X(recipes: Recipes) -> None:
    isas = kfd_isas(SYSFS / "desktop-gfx1100")
    assert isas == ["gfx1100", "gfx1036"]
    assert target_for_isas(recipes, isas) == "gfx110X"


def test_no_amd_gpu_is_refused_clearly(recipes: Recipes, tmp_path: Path) -> None:
    for root in (SYSFS / "cpu-only", tmp_path):  # a CPU node only; no /sys/class/kfd at all
        assert kfd_isas(root) == []
        with pytest.raises(BundleError, match="no AMD GPU found") as caught:
            target_for_isas(recipes, kfd_isas(root))
        assert "--target" in str(caught.value)


def test_an_unsupported_gpu_names_itself_and_the_targets(recipes: Recipes) -> None:
    with pytest.raises(BundleError) as caught:
        target_for_isas(recipes, ["gfx1036"])
    assert "gfx1036" in str(caught.value) and "gfx1151" in str(caught.value)
