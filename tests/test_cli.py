"""The command line as users meet it: the help (verbs listed once, examples, options in groups, the
consumer's verb showing only consumer options, valid targets, defaults), the exit code of each kind of
error, ``--debug`` for a bug report, and GitHub Actions' annotations."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_docs import error_classes
from vllm_bundle.errors import EXIT_CODES, DiskFullError, InstallError, LockError, RecipeError
from vllm_bundle.recipes import load_targets
from vllm_bundle.util.ci import GitHubActions

VERBS = [
    "lock",
    "probe",
    "fetch",
    "patch",
    "vllm-wheel",
    "bundle",
    "image",
    "verify-repro",
    "qualify",
    "qualify-gpu",
    "install",
    "doctor",
    "targets",
    "merge-manifests",
]


def test_the_top_level_help_lists_each_verb_once_with_examples() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    text = result.stdout
    listed = re.findall(r"^    (\S+)", text, re.M)
    assert listed == VERBS, "each verb once, in the order a build goes"
    assert "{" not in text.split("verbs:")[1].split("examples:")[0], "no {a,b,c} list of the verbs"
    assert "``" not in text and ":mod:" not in text, "no reST markup"
    assert "examples:\n  vllm-bundle bundle gfx1151" in text


@pytest.mark.parametrize("verb", VERBS)
def test_no_verb_help_has_rest_markup(verb: str) -> None:
    text = run_cli(verb, "--help").stdout
    assert text.startswith("usage: ")
    assert "``" not in text and ":class:" not in text


def test_bundle_help_groups_its_options_and_names_targets_and_defaults() -> None:
    text = run_cli("bundle", "--help").stdout
    groups = re.findall(r"^(\S[^:\n]*):$", text, re.M)
    assert groups[:1] == ["positional arguments"]
    assert {"the build", "inputs", "release assets", "OCI image", "recipes and locks", "downloads"} <= set(groups)
    assert f"one of: {', '.join(load_targets(Path('recipes')))}" in " ".join(text.split())
    assert "--build-dir BUILD_DIR" in text and "(default: build)" in text
    assert "(default: 6)" in text, "the gzip level's default"
    assert "(default: False)" not in text and "(default: None)" not in text


def test_install_help_shows_only_what_a_consumer_needs() -> None:
    text = run_cli("install", "--help").stdout
    for builder_option in ("--locks", "--channel", "--verify-cache", "--recipes", "--build-dir", "--therock-index"):
        assert builder_option not in text
    for option in ("--target", "--dest", "--force", "--cache-dir", "--retries"):
        assert option in text
    assert "auto, gfx1151" in text


def test_every_error_class_has_a_documented_exit_code() -> None:
    """One hierarchy, one code per kind; 0, 130 and argparse's 2 keep their meanings."""
    assert EXIT_CODES["BundleError"] == 1
    assert RecipeError.exit_code == 2 and LockError.exit_code == 3 and DiskFullError.exit_code == 5
    assert InstallError.exit_code == 8
    assert set(EXIT_CODES.values()) == set(range(1, 9))
    assert not issubclass(DiskFullError, LockError | RecipeError), "disk full is its own kind"
    defined = {cls.__name__: cls.__module__ for cls in error_classes()}
    assert {name: module for name, module in defined.items() if module != "vllm_bundle.errors"} == {}, (
        "every error class lives in errors.py"
    )
    assert set(defined) == set(EXIT_CODES), "EXIT_CODES names every class the package defines"


def test_debug_prints_the_traceback_of_a_user_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    plain = run_cli("doctor", "--host-root", str(missing))
    assert plain.returncode == 2 and "Traceback" not in plain.stderr, "a bad option value: a UsageError"
    assert plain.stderr.strip().startswith("error: --host-root") and plain.stderr.count("\n") == 1
    for debug in (
        run_cli("--debug", "doctor", "--host-root", str(missing)),
        run_cli("doctor", "--host-root", str(missing), "--debug"),
        run_cli("doctor", "--host-root", str(missing), env={"VLLM_BUNDLE_DEBUG": "1"}),
    ):
        assert debug.returncode == 2
        assert "Traceback (most recent call last)" in debug.stderr and "UsageError" in debug.stderr
        assert debug.stderr.strip().splitlines()[-1] == plain.stderr.strip(), "the one line still ends it"


def test_in_github_actions_the_error_is_also_an_annotation(tmp_path: Path) -> None:
    result = run_cli("doctor", "--host-root", str(tmp_path / "missing"), env={"GITHUB_ACTIONS": "true"})
    assert result.returncode == 2
    line = result.stderr.strip().removeprefix("error: ")
    assert f"::error::{line}" in result.stdout.splitlines()


def test_workflow_commands_escape_their_data_and_groups_do_not_nest() -> None:
    out = io.StringIO()
    ci = GitHubActions(out)
    ci.group("stage python")
    ci.group("stage site")  # closes the one open
    ci.end_group()
    ci.end_group()  # nothing open: nothing written
    ci.error("100% broken\nsecond line\r")
    assert out.getvalue().splitlines() == [
        "::group::stage python",
        "::endgroup::",
        "::group::stage site",
        "::endgroup::",
        "::error::100%25 broken%0Asecond line%0D",
    ]


@pytest.mark.parametrize(("value", "on"), [("", False), ("0", False), ("1", True), ("yes", True)])
def test_on_off_variables_read_0_as_off(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    from vllm_bundle.cli import build_parser

    monkeypatch.setenv("VLLM_BUNDLE_VERIFY_CACHE", value)
    assert build_parser().parse_args(["fetch", "gfx1151"]).verify_cache is on


def test_in_github_actions_each_stage_is_a_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The stage printer the build verbs use: in GitHub Actions, what a stage prints is folded under it."""
    import argparse

    from vllm_bundle.pipeline.console import stage_printer
    from vllm_bundle.tree.stage import StageResult

    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    starting, finished = stage_printer(argparse.Namespace(plain=True))
    for name in ("python", "site"):
        starting(name)
        print(f"work of {name}")
        finished(StageResult(name, tmp_path, "0" * 64, cached=name == "site", seconds=1.5, details={}))
    assert capsys.readouterr().out.splitlines() == [
        "::group::stage python",
        "work of python",
        "stage  python      built in 1.5 s",
        "::endgroup::",
        "::group::stage site",
        "work of site",
        "stage  site        cached",
        "::endgroup::",
    ]


# -- a conflict of options is a usage error (#35 point 4) ---------------------------------------------------


def _usage_cases(tmp_path: Path) -> dict[str, list[str]]:
    """Command lines whose options conflict (or lack one), each refused before any work; the files they
    name are made by the test."""
    build = ("--build-dir", str(tmp_path / "build"))
    return {
        "lock without a target": ["lock"],
        "--force image without --image": ["bundle", "gfx1151", "--force", "image", *build, "--repo", "o/r"],
        "--image with --no-archive": ["bundle", "gfx1151", "--image", "--no-archive", *build],
        "--bundles-dir inside the build tree": [
            *("bundle", "gfx1151", *build, "--repo", "o/r", "--bundles-dir", str(tmp_path / "build" / "gfx1151" / "b")),
        ],
        "verify-repro --push": ["verify-repro", "gfx1151", "--push", "ghcr.io/o/r"],
        "install pins without --target": [
            "install",
            str(tmp_path / "backend_versions.json"),
            "--dest",
            str(tmp_path / "d"),
        ],
        "doctor --bundle not ours": ["doctor", "--bundle", str(tmp_path / "not-a-bundle")],
        "qualify a tree of no target": ["qualify", str(tmp_path / "not-a-bundle")],
        "patch --vllm --offline": ["patch", "gfx1151", "--vllm", "0.33.0", "--offline", *build],
    }


CASES = list(_usage_cases(Path("/")))


@pytest.mark.parametrize("case", CASES)
def test_a_conflict_of_options_is_a_usage_error(case: str, tmp_path: Path) -> None:
    """Exit 2 either way; the class (shown with --debug, and what a caller of the library catches) says
    the command line is wrong, not a recipe."""
    (tmp_path / "not-a-bundle" / "bin").mkdir(parents=True)
    (tmp_path / "backend_versions.json").write_text("{}")
    result = run_cli(*_usage_cases(tmp_path)[case], "--debug")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "vllm_bundle.errors.UsageError:" in result.stderr, result.stderr[-2000:]
