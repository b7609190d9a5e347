"""Recipes: the real ones load; user mistakes give one line naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocm_bootstrap import all_bundles, lookup_target

from tests.conftest import REPO, assert_one_line_error, run_cli
from tests.upstream.therock import FACTS, FAMILY_ISAS
from vllm_bundle.errors import RecipeError, UnknownTargetError
from vllm_bundle.recipes import load_recipes

#: A change detector, kept because it records a decision: the targets DESIGN.md commits the project to
#: (gfx1151 first). Everything else about them is checked against its source below, not restated.
DESIGN_TARGETS = ("gfx1151", "gfx1150", "gfx110X", "gfx120X", "gfx942", "gfx950")


def test_repository_recipes_hold_the_design_targets() -> None:
    assert tuple(load_recipes(REPO / "recipes").targets) == DESIGN_TARGETS


def test_each_targets_isas_are_one_whole_group_of_rocm_bootstraps_hierarchy() -> None:
    """A target serves one ISA, or every ISA of one of rocm-bootstrap's bundles (AMD's canonical GFX
    hierarchy): no ISA it does not know, none of a group left out. Its PyTorch arch list is those ISAs."""
    groups = {frozenset(member.name for member in bundle.members) for bundle in all_bundles()}
    for name, target in load_recipes(REPO / "recipes").targets.items():
        assert all(lookup_target(isa) for isa in target.isas), name
        assert frozenset(target.isas) in groups, f"{name}: {target.isas} is no group of rocm-bootstrap's"
        assert name.lower().removesuffix("x") in target.isas[0], "named after its ISAs"
        assert target.pytorch_rocm_arch == ";".join(target.isas)


def test_each_legacy_family_is_a_family_therock_published_for_the_targets_isas() -> None:
    """A target's legacy per-family index is one TheRock published (tests/upstream/facts.toml, cited),
    built for exactly the target's ISAs (therock.FAMILY_ISAS, cited); gfx1150 had none."""
    published = next(index for index in FACTS.indexes.values() if index.layout == "per-family").families
    for name, target in load_recipes(REPO / "recipes").targets.items():
        if target.legacy_family not in published:
            assert name == "gfx1150", f"{name}: legacy family {target.legacy_family} was never published"
            continue
        assert FAMILY_ISAS[target.legacy_family] == target.isas, name


def test_the_device_packages_and_channels_the_lock_reads() -> None:
    recipes = load_recipes(REPO / "recipes")
    assert recipes.device_packages == {"rocm": "rocm-sdk-device", "torch": "amd-torch-device"}
    assert {"stable", "nightly", "frozen-7.14", "nightly-legacy"} <= set(recipes.channels)
    gfx110x = recipes.target("gfx110X")
    assert recipes.channel("nightly-legacy").sdk_wheels_for(gfx110x)[1] == "rocm-sdk-libraries-gfx110X-all"
    assert recipes.python.asset.endswith("-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz")


def test_per_family_channel_uses_the_legacy_family_name() -> None:
    recipes = load_recipes(REPO / "recipes")
    legacy = recipes.channel("nightly-legacy")
    assert legacy.therock_index_for(recipes.target("gfx110X")).endswith("/v2/gfx110X-all/")


def test_unknown_target_lists_the_valid_ones() -> None:
    recipes = load_recipes(REPO / "recipes")
    with pytest.raises(UnknownTargetError) as caught:
        recipes.target("gfx9999")
    assert "gfx9999" in str(caught.value)
    assert all(name in str(caught.value) for name in DESIGN_TARGETS)


def test_unknown_target_on_the_command_line(tmp_path: Path) -> None:
    result = run_cli("fetch", "gfx1234", "--recipes", REPO / "recipes", "--cache-dir", tmp_path)
    assert_one_line_error(result, "unknown target 'gfx1234'", "gfx1151, gfx1150, gfx110X")


@pytest.mark.parametrize(
    ("file", "old", "new", "where"),
    [
        ("targets.toml", 'isas = ["gfx1151"]', 'isas = "gfx1151"', "targets.toml: targets.gfx1151.isas"),
        ("targets.toml", "margin = 2\n", "margin = 0.5\n", "targets.toml: size-budget.margin"),
        ("targets.toml", "tar-time-limit-s = 300\n", "tar-time-limit-s = -1\n", "size-budget.tar-time-limit-s"),
        ("channels.toml", 'rocm = ">=10.0"', 'rocm = "seven"', "channels.toml: channels.stable.versions.rocm"),
        ("channels.toml", 'therock-layout = "multi-arch"', 'therock-layout = "flat"', "channels.stable.therock-layout"),
        ("components.toml", 'release = "', 'release = "x', "components.toml: python.release"),
        ("components.toml", 'version = "0.33.0"', 'version = "latest"', "components.toml: vllm.version"),
        (
            "components.toml",
            'requirement-files = ["requirements/rocm.txt"]',
            "requirement-files = []",
            "components.toml: vllm.requirement-files",
        ),
        ("components.toml", 'cmake-build-type = "Release"', 'cmake-build-type = "Fast"', "vllm.cmake-build-type"),
        ("components.toml", 'device-code = ["_C", ', 'device-code = ["_X", ', "vllm.extensions[0].device-code"),
        (
            "launcher.toml",
            'HIP_FORCE_DEV_KERNARG = "1"',
            'HIP_FORCE_DEV_KERNARG = "1; rm -rf ~"',
            "launcher.toml: defaults.HIP_FORCE_DEV_KERNARG",
        ),
    ],
)
def test_malformed_recipe_names_file_and_key(recipes_dir: Path, file: str, old: str, new: str, where: str) -> None:
    path = recipes_dir / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(RecipeError, match="bad recipe") as caught:
        load_recipes(recipes_dir)
    assert where in str(caught.value)
    result = run_cli("lock", "--check", "gfx1151", "--recipes", recipes_dir)
    assert_one_line_error(result, "bad recipe ", f"{where} is ", ", not ", "docs/recipes-and-locks.md")


def test_invalid_toml_is_one_line(recipes_dir: Path) -> None:
    (recipes_dir / "channels.toml").write_text("[channels.stable\n")
    result = run_cli("lock", "--check", "--recipes", recipes_dir)
    assert_one_line_error(result, "channels.toml", "not valid TOML")


def test_recipe_hash_tracks_only_what_the_lock_depends_on(recipes_dir: Path) -> None:
    recipes = load_recipes(recipes_dir)
    gfx1151, gfx950 = recipes.target("gfx1151"), recipes.target("gfx950")
    stable = recipes.channel("stable")
    before = (recipes.recipe_hash(gfx1151, stable), recipes.recipe_hash(gfx950, stable))
    targets = recipes_dir / "targets.toml"
    targets.write_text(targets.read_text().replace('isas = ["gfx950"]', 'isas = ["gfx950", "gfx951"]'))
    recipes = load_recipes(recipes_dir)
    after = (
        recipes.recipe_hash(recipes.target("gfx1151"), stable),
        recipes.recipe_hash(recipes.target("gfx950"), stable),
    )
    assert after[0] == before[0], "another target's change does not stale this lock"
    assert after[1] != before[1]


def test_every_toml_file_is_read_by_one_reader_each_failure_one_line(tmp_path: Path) -> None:
    """Recipes, prune rules, locks and the facts file go through recipes.read_toml: a missing or malformed
    file is one line naming it, in the error its kind calls for."""
    from vllm_bundle.errors import LockError, LockMissingError
    from vllm_bundle.inputs.facts import load_facts
    from vllm_bundle.inputs.lockfile import read_lock
    from vllm_bundle.recipes import read_toml
    from vllm_bundle.tree.prune import load_prune_rules

    bad = "x = [\n"
    (tmp_path / "components.toml").write_text(bad)
    (tmp_path / "ok.toml").write_text('a = "b"\n')
    assert read_toml(tmp_path / "ok.toml") == {"a": "b"}
    with pytest.raises(RecipeError, match=r"^recipe file .*/nothing\.toml is missing \(restore it"):
        read_toml(tmp_path / "nothing.toml")
    with pytest.raises(RecipeError, match=r"^bad recipe components\.toml: not valid TOML: "):
        read_toml(tmp_path / "components.toml")
    with pytest.raises(RecipeError, match=r"^recipe file .*/prune\.toml is missing"):
        load_prune_rules(tmp_path)
    (tmp_path / "prune.toml").write_text(bad)
    with pytest.raises(RecipeError, match=r"^bad recipe prune\.toml: not valid TOML: "):
        load_prune_rules(tmp_path)
    with pytest.raises(LockMissingError, match=r"^no lock for stable/gfx1151 at .*gfx1151\.toml \(make it with"):
        read_lock(tmp_path / "locks", "stable", "gfx1151")
    (tmp_path / "locks" / "stable").mkdir(parents=True)
    (tmp_path / "locks" / "stable" / "gfx1151.toml").write_text(bad)
    with pytest.raises(LockError, match=r"gfx1151\.toml is not valid TOML \(.*\) \(re-lock instead"):
        read_lock(tmp_path / "locks", "stable", "gfx1151")
    with pytest.raises(RecipeError, match=r"^no facts file at .*/facts\.toml"):
        load_facts(tmp_path / "facts.toml")
    with pytest.raises(RecipeError, match=r"^bad facts file .*/components\.toml: .* \(see the file's header"):
        load_facts(tmp_path / "components.toml")
