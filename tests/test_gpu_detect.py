"""``--target auto``: the GPU's ISA is rocm-bootstrap's reading of the KFD topology under the host root
(here captured trees); the ISA maps to a release target. And recipes/targets.toml agrees with
rocm-bootstrap's GFX hierarchy."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from rocm_bootstrap import PackagingLevel, bundle_for_target, lookup_target

from tests.conftest import REPO
from vllm_bundle.errors import BundleError
from vllm_bundle.install.gpu_detect import detect_isas, target_for_isas
from vllm_bundle.recipes import Target, load_targets

SYSFS = Path(__file__).parent / "data" / "sysfs"


@pytest.fixture(scope="module")
def targets() -> Mapping[str, Target]:
    return load_targets(REPO / "recipes")


def test_strix_halo_is_gfx1151(targets: Mapping[str, Target]) -> None:
    isas = detect_isas(SYSFS / "strix-halo-gfx1151", {})
    assert isas == ["gfx1151"]
    assert target_for_isas(targets, isas) == "gfx1151"


def test_a_7900_xtx_beside_an_unsupported_igpu_is_gfx110X(targets: Mapping[str, Target]) -> None:
    isas = detect_isas(SYSFS / "desktop-gfx1100", {})
    assert isas == ["gfx1100", "gfx1036"]
    assert target_for_isas(targets, isas) == "gfx110X"


def test_no_amd_gpu_is_refused_clearly(targets: Mapping[str, Target], tmp_path: Path) -> None:
    for root in (SYSFS / "cpu-only", tmp_path):  # a CPU node only; no /sys/class/kfd at all
        assert detect_isas(root, {}) == []
        with pytest.raises(BundleError, match="no supported AMD GPU found") as caught:
            target_for_isas(targets, [], root)
        assert f"no GPU node under {root / 'sys/class/kfd'}" in str(caught.value)
        assert "--target" in str(caught.value)


def test_an_unsupported_gpu_names_itself_and_the_targets(targets: Mapping[str, Target]) -> None:
    with pytest.raises(BundleError) as caught:
        target_for_isas(targets, ["gfx1036"])
    assert "gfx1036" in str(caught.value) and "gfx1151" in str(caught.value)


def test_rocm_bootstraps_overrides_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = SYSFS / "strix-halo-gfx1151"
    monkeypatch.setenv("ROCM_BOOTSTRAP_FORCE_GFX_ARCH", "gfx942,gfx942")
    assert detect_isas(tree) == ["gfx942"]
    monkeypatch.delenv("ROCM_BOOTSTRAP_FORCE_GFX_ARCH")
    monkeypatch.setenv("ROCM_BOOTSTRAP_DISABLE_DETECTION", "1")
    assert detect_isas(tree) == []


def test_an_isa_rocm_bootstrap_does_not_know_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROCM_BOOTSTRAP_FORCE_GFX_ARCH", "gfx9999")
    with pytest.raises(BundleError, match=r"no supported AMD GPU found.*gfx9999"):
        detect_isas(SYSFS / "cpu-only")


# -- recipes/targets.toml against rocm-bootstrap, the canonical GFX target knowledge -------------------


def test_every_isa_of_every_target_is_a_known_gfx_target(targets: Mapping[str, Target]) -> None:
    for target in targets.values():
        for isa in target.isas:
            assert lookup_target(isa).name == isa, (target.name, isa)


def test_each_target_is_one_sub_family_and_no_isa_is_in_two_targets(targets: Mapping[str, Target]) -> None:
    owner: dict[str, str] = {}
    for target in targets.values():
        sub_families = {bundle_for_target(isa, PackagingLevel.SUB_FAMILY).key for isa in target.isas}
        assert len(sub_families) == 1, f"{target.name} spans {sorted(sub_families)}"
        for isa in target.isas:
            assert isa not in owner, f"{isa} is in {owner.get(isa)} and {target.name}"
            owner[isa] = target.name


def test_a_family_target_holds_every_isa_of_its_sub_family_that_it_names(targets: Mapping[str, Target]) -> None:
    """gfx110X and gfx120X are release families: they must not leave out an ISA of their sub-family
    that rocm-bootstrap knows (a gfx1102 owner would find no release)."""
    for name in ("gfx110X", "gfx120X"):
        target = targets[name]
        bundle = bundle_for_target(target.isas[0], PackagingLevel.SUB_FAMILY)
        members = {member.name for member in bundle.members}
        assert set(target.isas) == members, (name, sorted(members))
