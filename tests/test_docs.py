"""The README and docs/ say what the code does: the exit-code table is the errors' own, every link
resolves, the two commands are what CI runs, the downstream workflow is valid and uses only options
`install` has, and every environment variable the sources read is in the table.

``python tests/test_docs.py`` rewrites the README's exit-code table from the sources."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import pkgutil
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

if not __package__:  # run as `python tests/test_docs.py`: the checkout's root, for `tests.` (as pytest has it)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import TEST_REPO, as_a_user, assert_one_line_error, copy_recipes, run_cli
from vllm_bundle.errors import OTHER_EXITS, BundleError
from vllm_bundle.oci.image import BASE_LOCK, load_image_recipe

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
BEGIN, END = "<!-- exit-codes: generated from errors.py -->", "<!-- /exit-codes -->"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
ROW = re.compile(r"^\| (\d+) \| `(\w+)` \|", re.MULTILINE)


# -- the exit-code table ----------------------------------------------------------------------------------


def error_classes() -> list[type[BundleError]]:
    """Every user-facing error the package defines: BundleError and its subclasses, in every module."""
    import vllm_bundle

    for module in pkgutil.walk_packages(vllm_bundle.__path__, "vllm_bundle."):
        if not module.name.endswith("__main__"):  # that one runs the CLI
            importlib.import_module(module.name)

    def below(cls: type[BundleError]) -> Iterator[type[BundleError]]:
        for sub in sorted(cls.__subclasses__(), key=lambda c: c.__name__):
            yield sub
            yield from below(sub)

    return [BundleError, *below(BundleError)]


def _meaning(cls: type[BundleError]) -> str:
    doc = inspect.getdoc(cls) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.replace("``", "`").replace("|", "\\|")


def _other_rows() -> list[tuple[int, str]]:
    """The exits no class stands for (errors.OTHER_EXITS), as rows: no class, the module that exits so."""
    return [
        (code, f"| {code} | — | — | `src/vllm_bundle/{where}` | {meaning} |") for code, where, meaning in OTHER_EXITS
    ]


def exit_code_table() -> str:
    """The README's one table, as the sources define it: by exit code, the classes (in class order) and
    then the exits no class stands for."""
    classes = error_classes()
    order = {cls: i for i, cls in enumerate(classes)}
    rows: list[tuple[int, int, str]] = []
    for cls in classes:
        base = cls.__bases__[0].__name__
        where = "src/vllm_bundle/" + cls.__module__.removeprefix("vllm_bundle.").replace(".", "/") + ".py"
        rows.append(
            (
                cls.exit_code,
                order[cls],
                f"| {cls.exit_code} | `{cls.__name__}` | `{base}` | `{where}` | {_meaning(cls)} |",
            )
        )
    rows += [(code, len(classes) + i, row) for i, (code, row) in enumerate(_other_rows())]
    lines = ["| exit code | error | a kind of | defined in | what it means |", "|---|---|---|---|---|"]
    return "\n".join(lines + [row for _, _, row in sorted(rows)])


def _table_block(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end]


def test_the_exit_code_table_lists_every_error_and_its_code() -> None:
    rows = ROW.findall(_table_block(README.read_text()))
    listed = [(name, int(code)) for code, name in rows]
    defined = [(cls.__name__, cls.exit_code) for cls in error_classes()]
    assert len({name for name, _ in listed}) == len(listed), "each error once"
    assert sorted(listed) == sorted(defined), "run `python tests/test_docs.py` to regenerate the README's table"


def test_each_row_names_the_errors_base_and_module() -> None:
    """A class moved or re-based shows too (its meaning, the docstring's first paragraph, may drift)."""

    def columns(table: str) -> list[list[str]]:
        return [row.split(" | ")[:4] for row in table.strip().splitlines()[2:]]

    assert columns(_table_block(README.read_text())) == columns(exit_code_table()), "run `python tests/test_docs.py`"


def test_the_exits_no_class_stands_for_are_in_the_one_table() -> None:
    """Success, a verb's own "no", argparse, an unclassed disk-full, Ctrl-C: rows of the same table (from
    errors.OTHER_EXITS), as written there; the README has no second table that could disagree."""
    block = _table_block(README.read_text())
    assert [row for _, row in _other_rows()] == [
        line for line in block.splitlines() if line.startswith("| ") and " | — |" in line
    ]
    assert {code for code, _, _ in OTHER_EXITS} >= {0, 1, 2, 5, 130}
    section = _section(README.read_text(), "Exit codes")
    assert section.count("| exit code |") == 1, "one exit-code table"


# -- the table says what the CLI does: one code for a bad option or option value ------------------------

#: The README row a bad option or option value exits with (#32 E10: they exited 1, 4, 6 or 7).
BAD_OPTION = "a bad option or option value"
#: The README row a hand-edited lock exits with: image-base.json is a lock (`lock --image` writes it).
LOCK = "| `LockError` | `BundleError` |"


def _readme_code(row: str) -> int:
    """The exit code the README's one table gives in the row that contains ``row``."""
    found = [line for line in _table_block(README.read_text()).splitlines() if row.lower() in line.lower()]
    assert len(found) == 1, f"one row of the README's exit-code table says {row!r}: {found}"
    return int(found[0].split(" | ")[0].removeprefix("| "))


#: A refused run: the CLI's output, and what its one error line must contain.
Case = tuple[subprocess.CompletedProcess[str], tuple[str, ...]]


def _cli_as_a_user(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``run_cli``, subject to file modes even as root (setpriv drops the capabilities that bypass them)."""
    env = {key: value for key, value in os.environ.items() if key != "VLLM_BUNDLE_CACHE_DIR"}
    command = as_a_user([sys.executable, "-m", "vllm_bundle", *map(str, args)])
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


def _bundle_args(tmp_path: Path, *extra: str | Path) -> list[str | Path]:
    """``bundle`` with everything it writes under ``tmp_path`` and recipes without locks: refused before
    any lock or download (``--locked --offline`` would refuse those too, in another line)."""
    recipes = copy_recipes(tmp_path / "recipes")
    args: list[str | Path] = ["bundle", "gfx1151", "--recipes", recipes, "--locked", "--offline", "--plain"]
    args += [
        "--build-dir",
        tmp_path / "build",
        "--bundles-dir",
        tmp_path / "bundles",
        "--cache-dir",
        tmp_path / "cache",
    ]
    return [*args, *extra]


def _a_file_as_cache_dir(tmp_path: Path) -> Case:
    file = tmp_path / "file"
    file.write_text("")
    result = run_cli("fetch", "gfx1151", "--offline", "--cache-dir", file)
    return result, (f"--cache-dir {file} is not a directory", "pass --cache-dir a directory you can write to")


def _a_read_only_build_dir(tmp_path: Path) -> Case:
    build = tmp_path / "read-only"
    build.mkdir(mode=0o555)
    result = _cli_as_a_user(*_bundle_args(tmp_path, "--repo", TEST_REPO, "--build-dir", build))
    return result, (f"--build-dir {build} is not writable: permission denied", "a directory you can write to")


def _a_missing_host_root(tmp_path: Path) -> Case:
    missing = tmp_path / "missing"
    result = run_cli("doctor", "--host-root", missing)
    return result, (f"--host-root {missing} is not a directory", "name the root of a host tree")


def _a_push_that_is_no_image_reference(tmp_path: Path) -> Case:
    result = run_cli(*_bundle_args(tmp_path, "--repo", TEST_REPO, "--push", "vllm-rocm"))
    return result, ("--push 'vllm-rocm' is not an image reference", "e.g. ghcr.io/OWNER/vllm-rocm")


def _a_repo_of_three_parts(tmp_path: Path) -> Case:
    result = run_cli(*_bundle_args(tmp_path, "--repo", "a/b/c"))
    return result, ("GitHub repository 'a/b/c' is not <owner>/<name>", "pass --repo owner/name")


def _no_repo_at_all(tmp_path: Path) -> Case:
    """No --repo, an empty $GITHUB_REPOSITORY and no checkout to read an origin from (GIT_DIR names none)."""
    env = {"GITHUB_REPOSITORY": "", "GIT_DIR": str(tmp_path / "no-checkout")}
    result = run_cli(*_bundle_args(tmp_path), env=env)
    return result, ("no GitHub repository for backend_versions.json checksums", "pass --repo owner/name")


def _a_path_for_a_digest_in_image_base_json(tmp_path: Path) -> Case:
    recipes = copy_recipes(tmp_path / "recipes")
    recipe = load_image_recipe(recipes)
    blob = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + "1" * 64, "size": 1}
    lock = {
        "reference": str(recipe.base),
        "platform": dict(recipe.platform),
        "index_digest": None,
        "manifest": blob,
        "config": dict(blob, digest="sha256:../../../../escaped"),
        "layers": [blob],
    }
    (recipes / "locks").mkdir()
    (recipes / "locks" / BASE_LOCK).write_text(json.dumps(lock))
    result = run_cli("lock", "--check", "--image", "--recipes", recipes)
    return result, ("'sha256:../../../../escaped' is not a sha256 digest", "lock --image")


@pytest.mark.parametrize(
    ("case", "row"),
    [
        pytest.param(_a_file_as_cache_dir, BAD_OPTION, id="a-file-as-cache-dir"),
        pytest.param(_a_read_only_build_dir, BAD_OPTION, id="a-read-only-build-dir"),
        pytest.param(_a_missing_host_root, BAD_OPTION, id="doctor-host-root-missing"),
        pytest.param(_a_push_that_is_no_image_reference, BAD_OPTION, id="push-not-an-image-reference"),
        pytest.param(_a_repo_of_three_parts, BAD_OPTION, id="repo-a/b/c"),
        pytest.param(_no_repo_at_all, BAD_OPTION, id="no-repo"),
        pytest.param(_a_path_for_a_digest_in_image_base_json, LOCK, id="image-base-json-path-digest"),
    ],
)
def test_a_bad_value_exits_with_the_code_the_readme_gives_in_one_line_before_any_work(
    tmp_path: Path, case: Callable[[Path], Case], row: str
) -> None:
    """#32 E10: each exited 1, 4, 6 or 7. The expected code is read from the README's table, not written
    here: a bad option or option value (an environment variable standing in for one too) is 2; a lock
    edited by hand (image-base.json is the image base's lock) is 3, as every other lock's is."""
    result, fragments = case(tmp_path)
    last = assert_one_line_error(result, *fragments)
    assert result.returncode == _readme_code(row), f"exit {result.returncode}: {last}"
    assert result.stderr.strip() == last, "one line on stderr"
    assert result.stdout == "", "refused before any work (nothing locked, fetched or built)"
    assert not (tmp_path / "build").exists() and not (tmp_path / "cache").exists()


# -- links ------------------------------------------------------------------------------------------------


def _links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", path.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_doc_is_linked_from_the_readme_and_exists() -> None:
    linked = {target.split("#")[0] for target in _links(README) if target.startswith("docs/")}
    assert linked, "the README links its docs"
    assert {ROOT / target for target in linked} == set(DOCS), "every docs/*.md linked, every link a file"


def test_every_relative_link_resolves() -> None:
    broken = []
    for path in [README, ROOT / "DESIGN.md", *DOCS]:
        for target in _links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


# -- the two commands -------------------------------------------------------------------------------------


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def _readme_commands() -> list[str]:
    block = re.search(r"```sh\n(.*?)```", _section(README.read_text(), "The two commands"), re.DOTALL)
    assert block, "the two commands are a sh block"
    lines = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line]


def test_the_readme_has_two_commands_and_the_test_command_is_what_ci_runs() -> None:
    bundle, tests = _readme_commands()  # exactly two
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if re.search(r"\bnox -s\b", line)]
    # its arguments, if any, after `--` (CI's full-matrix job); none: the README's command itself
    assert ci == [f'python3 -m {tests} ${{1+-- "$@"}}'], ".ci/run runs the README's test command"
    words = shlex.split(bundle)
    assert words[:3] == ["nox", "-s", "bundle"] and words[3] == "--"
    assert re.search(r"^def bundle\(", (ROOT / "noxfile.py").read_text(), re.MULTILINE), "a nox session"
    assert f"[targets.{words[4]}]" in (ROOT / "recipes" / "targets.toml").read_text(), "a target"


# -- the downstream workflow -----------------------------------------------------------------------------


def _workflow_snippet() -> str:
    block = re.search(
        r"```yaml\n(.*?)```", _section(README.read_text(), "Using a release from a downstream repository"), re.DOTALL
    )
    assert block, "a GitHub Actions job to copy"
    return block.group(1)


def _tool(name: str) -> str:
    """A test dependency's console script, beside this interpreter."""
    path = Path(sys.executable).with_name(name)
    assert path.exists(), f"{name} is a test dependency (pyproject's test group)"
    return str(path)


def _install_options() -> set[str]:
    from vllm_bundle.cli import build_parser

    parser = build_parser()
    (verbs,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(verbs.choices["install"]._option_string_actions)


def test_the_downstream_workflow_is_valid_and_uses_only_options_install_has(tmp_path: Path) -> None:
    snippet = _workflow_snippet()
    doc: dict[Any, Any] = yaml.safe_load(snippet)
    runs = [step["run"] for job in doc["jobs"].values() for step in job["steps"] if "run" in step]
    installs = [shlex.split(run) for run in runs if run.startswith("vllm-bundle install ")]
    assert installs, "it installs with `vllm-bundle install`"
    options = _install_options()
    for words in installs:
        used = {w.split("=")[0] for w in words if w.startswith("-")}
        assert used <= options, f"not options of install: {sorted(used - options)}"
    pinned = {line.split("uses:")[1].split("#")[0].strip() for line in snippet.splitlines() if "uses:" in line}
    workflows = "".join(p.read_text() for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    assert all(f"uses: {ref}" in workflows for ref in pinned), "the actions this repository pins"
    workflow = tmp_path / ".github" / "workflows" / "downstream.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text(snippet)
    schema = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(workflow)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert schema.returncode == 0, schema.stdout + schema.stderr
    audit = subprocess.run(
        [_tool("zizmor"), "--offline", "--format", "json", "--no-exit-codes", str(workflow)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert audit.returncode == 0, audit.stderr
    severe = [f["ident"] for f in json.loads(audit.stdout) if f["determinations"]["severity"] in ("High", "Medium")]
    assert severe == [], "zizmor, as for this repository's own workflows"


# -- environment variables -------------------------------------------------------------------------------

#: Read by the sources, but not the tool's to document: the builder's own PATH.
NOT_OURS = {"PATH"}


def _variables_read() -> set[str]:
    """Names the sources read from the environment: ``environ.get("X")`` and ``*_ENV``/``*VARIABLE*``
    constants."""
    names: set[str] = set()
    for path in (ROOT / "src" / "vllm_bundle").rglob("*.py"):
        text = path.read_text()
        names.update(re.findall(r"environ(?:\.get\(|\[)\s*\"([A-Z][A-Z0-9_]+)\"", text))
        for value in re.findall(r"^[A-Z_]*(?:ENV|VARIABLES?)\s*=\s*(.+)$", text, re.MULTILINE):
            names.update(re.findall(r"\"([A-Z][A-Z0-9_]+)\"", value))
    return names - NOT_OURS


def test_every_variable_the_sources_read_is_in_the_table() -> None:
    table = _section(README.read_text(), "Environment variables")
    listed = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", table))
    read = _variables_read()
    assert {"VLLM_BUNDLE_CACHE_DIR", "SOURCE_DATE_EPOCH", "HIP_VISIBLE_DEVICES"} <= read, "the scan finds them"
    assert read - listed == set()


def main() -> None:
    """Rewrite the README's exit-code table from the sources."""
    text = README.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    README.write_text(text[:start] + "\n" + exit_code_table() + "\n" + text[end:])


if __name__ == "__main__":
    main()
