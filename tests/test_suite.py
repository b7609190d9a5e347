"""The suite's own shape (#35, point 5): the quick tier is chosen from the fixtures a test uses, and a
fixture that lives for the whole run lives in conftest.py, where every module and worker can see it."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

TESTS = REPO / "tests"


def _fixture_scopes(module: Path) -> dict[str, str]:
    """Each fixture defined in ``module`` -> its scope ("function" when none is given)."""
    scopes = {}
    for node in ast.walk(ast.parse(module.read_text())):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call else decorator
            if ast.unparse(target) != "pytest.fixture":
                continue
            scope = next((k.value for k in call.keywords if k.arg == "scope"), None) if call else None
            scopes[node.name] = ast.literal_eval(scope) if scope is not None else "function"
    return scopes


def test_session_fixtures_live_in_conftest() -> None:
    """A session fixture in a test module is built once per worker that runs that module and is seen by
    no other module: it says "shared" and is not. Such a fixture is module-scoped, or moves to conftest."""
    misplaced = [
        f"{module.name}::{name}"
        for module in sorted(TESTS.glob("test_*.py"))
        for name, scope in _fixture_scopes(module).items()
        if scope == "session"
    ]
    assert misplaced == []
    assert _fixture_scopes(TESTS / "conftest.py")["built"] == "session", "the check reads scopes"


def _collected(*args: str) -> set[str]:
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert listed.returncode in (0, 5), listed.stdout + listed.stderr  # 5: every test deselected
    return {line for line in listed.stdout.splitlines() if "::" in line}


def test_the_quick_tier_is_chosen_by_the_fixtures_a_test_uses() -> None:
    """`-m "not slow"` leaves out a test that uses the fake upstream through another fixture (``built``
    asks for ``locked``, which asks for ``_server``) and keeps one that needs nothing slow."""
    files = ["tests/test_fsutil.py", "tests/test_bundle.py"]
    everything, quick = _collected(*files), _collected(*files, "-m", "not slow")
    assert "tests/test_bundle.py::test_moved_bundle_runs_with_an_empty_environment" in everything - quick
    assert {test for test in everything if test.startswith("tests/test_fsutil.py::")} <= quick
    assert any(test.startswith("tests/test_bundle.py::test_unsafe_python_tarball_is_refused[") for test in quick)


def test_each_build_case_is_a_unit_of_work_of_its_own() -> None:
    """`nox -s tests` (``--dist=loadscope``) keeps a module's tests in one worker, except the cases of
    ONE_BUILD_PER_CASE, each a unit of its own; a name there that no longer names a test would quietly
    put all its builds back in one worker."""
    from tests.conftest import ONE_BUILD_PER_CASE, unit_of_work

    collected = _collected("tests/test_channels.py", "tests/test_targets.py")
    for function in ONE_BUILD_PER_CASE:
        assert sum(1 for test in collected if test.startswith(f"{function}[")) > 1, function
    build = next(test for test in sorted(collected) if "test_every_target_is_built" in test)
    other = "tests/test_channels.py::test_the_channels_read_the_indexes_amd_publishes_to_today"
    assert unit_of_work(build, "tests/test_channels.py") == build
    assert unit_of_work(other, "tests/test_channels.py") == "tests/test_channels.py"


def test_the_suite_builds_every_target_and_every_channel_and_full_matrix_builds_every_pair() -> None:
    """SUITE_BUILDS (conftest.py) builds each target at least once and each channel at least once, only
    pairs a channel serves; `--full-matrix` adds every other pair, and nothing else; without it they are
    deselected, never skipped (a skip would read as a pass that never ran)."""
    from tests.conftest import SUITE_BUILDS, SUITE_PAIRS
    from tests.test_channels import SERVED
    from vllm_bundle.recipes import load_recipes

    recipes = load_recipes(REPO / "recipes")
    assert set(SUITE_BUILDS) == set(recipes.channels), "each channel is built in the suite"
    assert {target for _, target in SUITE_PAIRS} == set(recipes.targets), "each target"
    served = set(SERVED)
    assert served >= SUITE_PAIRS, "the suite builds only pairs a channel serves"
    files = ("tests/test_channels.py", "tests/test_targets.py")
    suite, full = _collected(*files), _collected(*files, "--full-matrix")
    builds = re.compile(r"::test_(?:every_target_is_built|each_target_is_built)\w*\[(?:(.+)-)?(gfx\w+)\]$")

    def pairs(collected: set[str]) -> set[tuple[str, str]]:
        found = {m.groups() for test in collected if (m := builds.search(test))}
        return {(channel or "stable", target) for channel, target in found}

    assert pairs(suite) == SUITE_PAIRS - {("stable", "gfx1151")}, (
        "the suite builds what SUITE_BUILDS says (gfx1151/stable: ``built``)"
    )
    assert pairs(full) == served - {("stable", "gfx1151")}, "--full-matrix builds every pair served"
    assert suite < full and {test for test in full - suite if not builds.search(test)} == set()


def test_the_readme_table_says_which_pairs_only_the_full_matrix_builds() -> None:
    """A cell of the README's targets x channels table says "full matrix" exactly where the suite locks the
    pair but leaves its build to `--full-matrix`."""
    from tests.conftest import SUITE_BUILDS, SUITE_PAIRS
    from tests.test_channels import SERVED

    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| target (ISAs)") :]
    header, _, *rows = table[: table.index("\n\n")].splitlines()
    channels = [cell.strip() for cell in header.strip("|").split("|")][1 : 1 + len(SUITE_BUILDS)]
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        target = cells[0].split("(")[0].strip()
        for channel, cell in zip(channels, cells[1:], strict=False):
            full_only = (channel, target) in SERVED and (channel, target) not in SUITE_PAIRS
            assert ("full matrix" in cell) == full_only, (target, channel, cell)


def test_one_build_case_then_the_starters_then_a_build_case_for_every_other_worker() -> None:
    """The worker that builds the fake upstream's files has a build case; the others run modules that need
    nothing slow meanwhile, then a build case each, which needs no shared gfx1151 build."""
    from tests.conftest import STARTERS, hand_out_order

    case = "tests/test_targets.py::test_each_target_is_built_qualified_and_released[{}]"
    cases = [case.format(t) for t in ("a", "b", "c", "d")]
    units = ["tests/test_install.py", STARTERS[1], "tests/test_safety.py", *cases, STARTERS[0]]
    expected = [cases[0], STARTERS[0], STARTERS[1], cases[1], cases[2]]
    assert hand_out_order(units, 3) == [*expected, "tests/test_install.py", "tests/test_safety.py", cases[3]]
    assert sorted(hand_out_order(units, 3)) == sorted(units)
    assert hand_out_order(units, 1) == units


def test_the_starters_are_modules_without_a_slow_test() -> None:
    """A starter that gains a slow test would wait for the fake upstream like any other: it leaves the list."""
    from tests.conftest import STARTERS

    assert all((REPO / starter).is_file() for starter in STARTERS), STARTERS
    assert _collected(*STARTERS), "the starters collect tests"
    assert not _collected(*STARTERS, "-m", "slow"), "a starter has a slow test: take it out of STARTERS"


SHM = "tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0"
DISK = "/dev/vda / ext4 rw,relatime 0 0"


def test_the_runs_folders_are_in_ram_when_it_has_room() -> None:
    from tests.conftest import RAM_DIR, RAM_NEEDED, RAM_PEAK, ram_temproot

    assert ram_temproot(f"{DISK}\n{SHM}\n", RAM_PEAK, RAM_NEEDED) == RAM_DIR
    assert ram_temproot(DISK, RAM_PEAK, RAM_NEEDED) is None, "no tmpfs at /dev/shm"
    assert ram_temproot("/dev/vdb /dev/shm ext4 rw 0 0", RAM_PEAK, RAM_NEEDED) is None, "a disk there"
    assert ram_temproot(SHM, RAM_PEAK - 1, RAM_NEEDED) is None, "too small a tmpfs"
    assert ram_temproot(SHM, RAM_PEAK, RAM_NEEDED - 1) is None, "too little memory for it and the builds"


FOLDER = """
def test_where(tmp_path):
    print("FOLDER", tmp_path, flush=True)
"""


@pytest.mark.parametrize("asked", [None, "--basetemp"])
def test_a_run_puts_its_folders_where_it_chose_and_says_where(asked: str | None, tmp_path: Path) -> None:
    """Without ``--basetemp`` (or ``$PYTEST_DEBUG_TEMPROOT``) a run's folders are in RAM when this machine
    has room (``ram_temproot``), else in the system's temporary directory; the header says which."""
    import tempfile

    from tests.conftest import TEMPROOT_ENV, this_machines_ram_temproot

    (tmp_path / "test_where.py").write_text(FOLDER)
    command = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-s"]
    command += ["--rootdir", str(tmp_path), str(tmp_path / "test_where.py")]
    if asked:
        command += ["--basetemp", str(tmp_path / "base")]
    env = {key: value for key, value in os.environ.items() if key != TEMPROOT_ENV}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    (folder,) = [Path(folder) for folder in re.findall(r"FOLDER (\S+)", result.stdout)]
    if asked:
        assert folder.is_relative_to(tmp_path / "base")
        assert f"temporary folders: {tmp_path / 'base'} (--basetemp)" in result.stdout
        return
    chosen = this_machines_ram_temproot()
    root = chosen or Path(tempfile.gettempdir())
    assert folder.is_relative_to(root), (folder, root)
    assert f"temporary folders: under {root}" + (" (in RAM)" if chosen else "") in result.stdout
