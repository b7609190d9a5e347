"""The GitHub workflows: schema-valid, free of high-severity zizmor findings, actions pinned by hash,
and wired to the same nox sessions a laptop runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_bundle.inputs.facts import load_facts
from vllm_bundle.recipes import load_recipes

ROOT = Path(__file__).parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def _tool(name: str) -> str:
    """The console script installed beside this interpreter (nox's venv), else on PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is a test dependency (pyproject's test group)"
    return found


def _load(path: Path) -> dict[Any, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


def _steps(doc: dict[Any, Any]) -> list[dict[str, Any]]:
    return [step for job in doc["jobs"].values() for step in job.get("steps", [])]


def test_the_three_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} == {"ci.yml", "release.yml", "refresh-locks.yml"}


def test_workflows_match_the_vendored_github_schema() -> None:
    files = [*map(str, WORKFLOWS)]
    result = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    dependabot = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.dependabot", str(ROOT / ".github" / "dependabot.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dependabot.returncode == 0, dependabot.stdout + dependabot.stderr


def test_zizmor_finds_nothing_high() -> None:
    result = subprocess.run(
        [_tool("zizmor"), "--offline", "--format", "json", "--no-exit-codes", str(ROOT / ".github" / "workflows")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    findings = json.loads(result.stdout)
    severe = [
        f"{f['ident']}: {f['desc']} ({f['locations'][0]['symbolic'].get('annotation', '')})"
        for f in findings
        if f["determinations"]["severity"] in ("High", "Medium") and not f.get("ignored")
    ]
    assert severe == []


def test_every_action_is_pinned_to_a_commit_with_its_version() -> None:
    for path in WORKFLOWS:
        text = path.read_text()
        for line in text.splitlines():
            if "uses:" in line:
                ref = line.split("uses:", 1)[1].split("#")[0].strip()
                assert PINNED.match(ref), f"{path.name}: {line.strip()} is not pinned to a commit"
                assert re.search(r"# v\d+\.\d+\.\d+$", line), f"{path.name}: {line.strip()} lacks its version comment"


def test_ci_runs_lint_and_the_readme_test_command() -> None:
    runs = " ".join(step.get("run", "") for step in _steps(_load(ROOT / ".github/workflows/ci.yml")))
    assert "nox -s lint" in runs and ".ci/run" in runs
    assert "python3 -m nox -s tests" in (ROOT / ".ci" / "run").read_text()


def test_release_builds_each_target_with_the_pipelines_sessions() -> None:
    doc = _load(ROOT / ".github/workflows/release.yml")
    on = doc[True]  # YAML 1.1 reads the key `on` as a boolean
    assert {"channel", "targets"} <= set(on["workflow_dispatch"]["inputs"]) and "schedule" in on
    bundle = doc["jobs"]["bundle"]
    assert bundle["strategy"]["matrix"]["target"] == "${{ fromJSON(needs.plan.outputs.targets) }}"
    runs = [step.get("run", "") for step in bundle["steps"]]
    order = [
        next(i for i, r in enumerate(runs) if "nox -s lock -- --check" in r),
        next(i for i, r in enumerate(runs) if "nox -s bundle" in r),
        next(i for i, r in enumerate(runs) if "nox -s qualify" in r),
    ]
    assert order == sorted(order)
    assert "--locked" in runs[order[1]], "a release build never locks on its own"
    uses = {step.get("uses", "").split("@")[0]: step for step in bundle["steps"]}
    assert "hashFiles(format('recipes/locks/" in uses["actions/cache"]["with"]["key"]
    assert "actions/attest-build-provenance" in uses
    assert uses["actions/upload-artifact"]["with"]["include-hidden-files"] is True
    assert bundle["env"]["VLLM_BUNDLE_VERIFY_CACHE"] == "1", "a restored cache is re-hashed"


def test_release_pushes_and_attests_the_image_after_tier_0() -> None:
    bundle = _load(ROOT / ".github/workflows/release.yml")["jobs"]["bundle"]
    runs = [step.get("run", "") for step in bundle["steps"]]
    build = next(i for i, r in enumerate(runs) if "nox -s bundle" in r)
    assert "--image" in runs[build] and "--locked" in runs[build]
    assert "--check --image" in next(r for r in runs if "nox -s lock" in r), "the image base lock is checked too"
    tier0 = next(i for i, r in enumerate(runs) if "nox -s qualify" in r)
    push = next(i for i, r in enumerate(runs) if "nox -s image" in r)
    assert build < tier0 < push and "--push" in runs[push] and "--locked" in runs[push]
    steps = bundle["steps"]
    assert steps[push]["env"]["VLLM_BUNDLE_REGISTRY_PASSWORD"] == "${{ github.token }}"
    attest = next(s for s in steps[push:] if s.get("uses", "").startswith("actions/attest-build-provenance"))
    assert (
        attest["with"]["push-to-registry"] is True and "steps.image.outputs.digest" in attest["with"]["subject-digest"]
    )
    assert bundle["permissions"]["packages"] == "write"


def test_release_builds_vllm_in_the_pinned_builder_and_refuses_a_bundle_above_its_floor() -> None:
    """Issue #50: the release job compiles vLLM in the builder image the lock pins (its lock checked, its
    sandbox set up first), never on the runner (--no-builder) and never past tier 0 (--warn-only), whose
    symbol-versions check holds every file to the floor the recipes claim."""
    bundle = _load(ROOT / ".github/workflows/release.yml")["jobs"]["bundle"]
    runs = [step.get("run", "") for step in bundle["steps"]]
    lock = next(i for i, r in enumerate(runs) if "nox -s lock -- --check" in r)
    sandbox = next(i for i, r in enumerate(runs) if "apt-get install" in r and "bubblewrap" in r)
    build = next(i for i, r in enumerate(runs) if "nox -s bundle" in r)
    assert lock < build and sandbox < build
    assert "--builder" in runs[lock], "the builder's lock is checked with the others"
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in runs[sandbox]
    assert "--no-builder" not in " ".join(runs) and "--warn-only" not in " ".join(runs)
    key = next(s for s in bundle["steps"] if s.get("uses", "").startswith("actions/cache"))["with"]["key"]
    assert "recipes/locks/builder.json" in key, "the builder's blobs are cached by its lock too"
    refresh = " ".join(step.get("run", "") for step in _steps(_load(ROOT / ".github/workflows/refresh-locks.yml")))
    assert "nox -s lock -- --image --builder" in refresh, "the builder is re-pinned with the image base"


def test_release_is_promoted_only_after_the_gpu_tiers() -> None:
    jobs = _load(ROOT / ".github/workflows/release.yml")["jobs"]
    publish = " ".join(step.get("run", "") for step in jobs["publish"]["steps"])
    assert "--prerelease" in publish and "merge-manifests" in publish
    gpu = jobs["gpu-qualify"]
    assert gpu["runs-on"] == ["self-hosted", "linux", "gfx1151"] and "publish" in gpu["needs"]
    runs = [step.get("run", "") for step in gpu["steps"]]
    qualify = next(i for i, r in enumerate(runs) if "qualify-gpu" in r)
    promote = next(i for i, r in enumerate(runs) if "--prerelease=false" in r)
    assert qualify < promote, "promotion comes after tiers 1/2 (a failing step stops the job)"


def test_refresh_locks_locks_every_target_and_channel_and_opens_a_pull_request() -> None:
    runs = " ".join(step.get("run", "") for step in _steps(_load(ROOT / ".github/workflows/refresh-locks.yml")))
    assert "mapfile -t targets < <(nox -s targets)" in runs, "the targets come from the recipes' one list"
    assert "mapfile -t channels < <(nox -s targets -- --channels)" in runs
    assert 'for target in "${targets[@]}"' in runs and 'for channel in "${channels[@]}"' in runs
    assert "nox -s lock" in runs and "gh pr create" in runs
    assert "nox -s lock -- --image" in runs, "the image base is re-pinned too"
    # 24 locks in one job: what each downloads to hash is gone before the next (docs/ci.md)
    lock = next(line for line in runs.splitlines() if 'nox -s lock -- "$target"' in line)
    assert '--cache-dir "$cache"' in lock and 'rm -rf "$cache"' in runs.split(lock, 1)[1].split("done", 1)[0]


def test_release_frees_the_runners_disk_and_checks_it_before_building() -> None:
    """The job needs more than the 14 GB GitHub promises (docs/ci.md): the disk is freed first, and a
    runner with too little left stops the job at its start, in one line, not an hour into the build."""
    steps = _load(ROOT / ".github/workflows/release.yml")["jobs"]["bundle"]["steps"]
    runs = [step.get("run", "") for step in steps]
    free = next(i for i, r in enumerate(runs) if "/usr/local/lib/android" in r)
    build = next(i for i, r in enumerate(runs) if "nox -s bundle" in r)
    assert free < build
    need = int(steps[free]["env"]["NEED_GB"])
    assert need >= 57, "at least the largest job measured at an 11 GB tree (docs/ci.md)"
    assert '-lt "$NEED_GB"' in runs[free] and "exit 1" in runs[free]
    assert f"NEED_GB` ({need} GB" in (ROOT / "docs" / "ci.md").read_text(), "docs/ci.md states the same figure"


def test_refresh_locks_probes_the_fake_upstreams_facts_before_locking() -> None:
    steps = [step.get("run", "") for step in _steps(_load(ROOT / ".github/workflows/refresh-locks.yml"))]
    probe = next(i for i, run in enumerate(steps) if "nox -s probe" in run)
    lock = next(i for i, run in enumerate(steps) if "nox -s lock" in run)
    assert probe < lock, "the first networked run names what the fake got wrong before it locks"
    modelled = [
        c for index in load_facts(ROOT / "tests" / "upstream" / "facts.toml").indexes.values() for c in index.channels
    ]
    assert all(re.search(rf"\b{re.escape(channel)}\b", steps[probe]) for channel in modelled), (
        "every channel the facts model"
    )


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflows_default_to_read_only_tokens(path: Path) -> None:
    assert _load(path)["permissions"] == {"contents": "read"}


# -- one list: the targets and channels of the workflows are the recipes' (#33) -------------------------

#: A target-shaped word (gfx + digits, then digits, letters or X).
TARGET_WORD = re.compile(r"\bgfx[0-9][0-9a-zA-Z]*\b")


def test_the_release_matrix_is_the_recipes_list_of_targets() -> None:
    doc = _load(ROOT / ".github/workflows/release.yml")
    inputs = doc[True]["workflow_dispatch"]["inputs"]
    assert inputs["targets"]["default"] == "", "no list of targets of its own: empty means every target"
    plan = " ".join(step.get("run", "") for step in doc["jobs"]["plan"]["steps"])
    assert 'targets=$(nox -s targets -- --json -- "${asked[@]}")' in plan, "the names asked for are never options"
    recipes = load_recipes(ROOT / "recipes")
    assert inputs["channel"]["options"] == list(recipes.channels), "a choice input is static: it must match"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda path: path.name)
def test_no_workflow_names_a_target_the_recipes_do_not_list_or_lists_them_itself(path: Path) -> None:
    """A target named in a workflow is one of the recipes' (the GPU runner's label, its qualify step); a
    workflow never spells out the whole list (that is `nox -s targets`)."""
    targets = set(load_recipes(ROOT / "recipes").targets)
    named = set(TARGET_WORD.findall(path.read_text()))
    assert named <= targets, f"{path.name} names {sorted(named - targets)}, which recipes/targets.toml does not"
    assert len(named) < len(targets) or len(targets) == 1, f"{path.name} spells out every target: {sorted(named)}"


def test_the_readme_table_has_a_row_per_target_and_a_column_per_channel() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Targets × channels") :]
    table = table[: table.index("\n\n", table.index("| target"))]
    header, _, *rows = table[table.index("| target") :].splitlines()
    recipes = load_recipes(ROOT / "recipes")
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    assert columns[1 : 1 + len(recipes.channels)] == list(recipes.channels), columns
    assert [row.strip("|").split("|")[0].split("(")[0].strip() for row in rows] == sorted(
        recipes.targets, key=list(recipes.targets).index
    ), "one row per target, in the recipes' order"


@pytest.mark.parametrize("asked", ["-h", "--channels", "gfx1151 --help"])
def test_the_release_plan_step_refuses_what_is_not_a_target(asked: str, tmp_path: Path) -> None:
    """The plan step as the workflow has it, run by bash as GitHub runs a step (-eo pipefail), its `nox -s
    targets --` the CLI itself: a `targets` input that is an option of the verb (`-h` printed the help with
    rc 0 into the matrix, #51) fails the step with one line naming it, and nothing goes to the outputs."""
    doc = _load(ROOT / ".github/workflows/release.yml")
    (step,) = [step for step in doc["jobs"]["plan"]["steps"] if step.get("id") == "plan"]
    nox = tmp_path / "bin" / "nox"
    nox.parent.mkdir()
    nox.write_text(
        '#!/bin/sh\n[ "$1 $2 $3" = "-s targets --" ] || exit 99\nshift 3\n'
        f'exec {sys.executable} -m vllm_bundle targets "$@"\n'
    )
    nox.chmod(0o755)
    outputs = tmp_path / "outputs"
    env = {**os.environ, "PATH": f"{nox.parent}:{os.environ['PATH']}", "TARGETS": asked, "CHANNEL": "nightly"}
    env["GITHUB_OUTPUT"] = str(outputs)
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0, result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("error: unknown target '-"), result.stderr
    assert not outputs.exists() or "targets=" not in outputs.read_text()
    fine = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        env={**env, "TARGETS": "gfx1151"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fine.returncode == 0, fine.stderr
    assert 'targets=["gfx1151"]' in outputs.read_text()


def test_the_targets_verb_prints_the_one_list() -> None:
    recipes = load_recipes(ROOT / "recipes")
    run = [sys.executable, "-m", "vllm_bundle", "targets"]
    listed = subprocess.run([*run, "--json"], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(listed.stdout) == list(recipes.targets)
    channels = subprocess.run([*run, "--channels"], capture_output=True, text=True, check=True, timeout=60)
    assert channels.stdout.split() == list(recipes.channels)
    asked = subprocess.run([*run, "--json", "gfx942", "gfx1151"], capture_output=True, text=True, timeout=60)
    assert json.loads(asked.stdout) == ["gfx942", "gfx1151"]
    unknown = subprocess.run([*run, "gfx9"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: unknown target 'gfx9'; valid targets:")
