"""The package's folders read as the pipeline, and imports run one way only: from a later step to an
earlier one, never back (a tier 0 check that imports the installer, a lock file that imports the network
code). The consumer's side (``install/``) imports nothing that needs the ``build`` extra: the installer's
environment does not have it (once, install → archive → zlib_ng broke every clean install).

The graph is read from the sources (every ``import``, at module level or inside a function), so a lazy
import cannot hide a wrong-way edge; each rule is also shown to fail on a copy of the package with one
wrong-way import added.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "vllm_bundle"

#: Layers, earliest first: a module may import its own layer's modules and earlier layers' only.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("vllm_bundle", "errors", "paths", "runtime"),  # the version, the error classes, data paths, shipped runtime
    ("util",),  # shared mechanisms: atomic files, HTTP, verified downloads, extraction, progress
    ("recipes", "manifests", "toc"),  # the vocabulary: targets and channels, the release's manifests and TOC
    ("inputs",),  # step 1: pins and the indexes they come from
    ("tree",),  # steps 2-3: the stages that build the tree
    ("release",),  # step 4: tarball parts, checksums, manifests, SBOM
    ("oci",),  # the image of a bundle, the registry, KServe
    ("qualify",),  # step 5: tier 0, the GPU tiers, reproducibility
    ("pipeline",),  # the one module that wires the stages
    ("cli", "__main__"),  # parsing and dispatch
)
#: The consumer's side may import only these layers (and nothing from the build extra).
INSTALL_MAY_IMPORT = ("vllm_bundle", "errors", "paths", "runtime", "util", "recipes", "manifests", "toc", "install")


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, package: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved."""
    name = _module_name(path, package)
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module → the modules it imports (outside names kept as written, e.g. ``tomli_w``)."""
    return {_module_name(path, package): _imports(path, package) for path in sorted(package.rglob("*.py"))}


def _group(module: str) -> str:
    """The layer name a module belongs to: ``vllm_bundle.util.fetch`` → ``util``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _layer(group: str) -> int | None:
    return next((index for index, names in enumerate(LAYERS) if group in names), None)


def wrong_way_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a imports b`` lines where ``b`` is in a later layer than ``a`` (or the consumer's side reaches
    outside what it may import, or a module sits in no layer)."""
    problems = []
    for module, imported in graph.items():
        group = _group(module)
        for target in sorted(name for name in imported if name in graph):
            other = _group(target)
            if group == "install" or other == "install":
                allowed = (group == "install" and other in INSTALL_MAY_IMPORT) or group in ("cli", "__main__")
            else:
                mine, theirs = _layer(group), _layer(other)
                allowed = mine is not None and theirs is not None and theirs <= mine
            if not allowed:
                problems.append(f"{module} imports {target}")
    return problems


def _reachable(graph: dict[str, set[str]], start: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(name for name in graph.get(module, ()) if name in graph)
    return seen


def build_extra_modules() -> set[str]:
    """The top-level import names of the distributions in pyproject's ``build`` extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {Requirement(line).name.lower().replace("_", "-") for line in project["optional-dependencies"]["build"]}
    names = {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(dist.lower().replace("_", "-") in wanted for dist in dists)
    }
    assert {"uv", "unidiff", "installer", "elftools", "zlib_ng", "tomli_w"} <= names, names
    return names


def consumer_uses_build_extra(graph: dict[str, set[str]]) -> list[str]:
    """``module imports name`` lines where a module the installer's verbs reach imports a build-extra module."""
    extra = build_extra_modules()
    # The installer's verbs start in cli (which dispatches by name, importing a verb's module only to run it).
    starts = [name for name in graph if _group(name) == "install"] + ["vllm_bundle.cli", "vllm_bundle.__main__"]
    consumer = _reachable(graph, [name for name in starts if name in graph])
    top_level = {(module, name.split(".")[0]) for module in consumer for name in graph[module]}
    return sorted(f"{module} imports {name}" for module, name in top_level if name in extra)


def test_imports_run_from_later_steps_to_earlier_ones() -> None:
    graph = import_graph(PACKAGE)
    assert not [module for module in graph if _group(module) != "install" and _layer(_group(module)) is None]
    assert wrong_way_imports(graph) == []


def test_the_consumer_side_needs_nothing_from_the_build_extra() -> None:
    graph = import_graph(PACKAGE)
    assert "vllm_bundle.install.installer" in graph
    assert consumer_uses_build_extra(graph) == []


def test_the_build_verbs_start_without_the_sbom_library() -> None:
    """cyclonedx-python-lib (its SPDX licence tables: 0.15 s of every build verb's start) is imported only
    when a release stage writes an SBOM (release/assets.py ``sbom_writer``)."""
    code = "import sys, vllm_bundle.pipeline.verbs; print(sorted(m for m in sys.modules if m.startswith('cyclonedx')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.parametrize(
    "verb",
    [
        "vllm_bundle.cli",
        "vllm_bundle.qualify.commands",
        "vllm_bundle.install.commands",
        "vllm_bundle.pipeline.workflow",
    ],
)
def test_the_command_line_and_tier_0_start_without_an_http_stack(verb: str) -> None:
    """Neither requests nor urllib3 is imported to parse the command line, to run tier 0, ``doctor``,
    ``targets`` or ``merge-manifests`` (0.13 s of each of the suite's ~850 runs of the tool went to them): a
    retry policy's defaults come from util/policy.py, a bundle's layout from tree/layout.py (not the
    assembler, which downloads), and the GPU tiers and ``install`` import their HTTP client when they run."""
    heavy = ("requests", "urllib3")
    code = f"import sys, {verb}; print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(heavy)!r}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def _copy_with(tmp_path: Path, module: str, line: str) -> Path:
    copy = tmp_path / "vllm_bundle"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*_data", "templates"))
    path = copy / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n\ndef _added() -> None:\n    {line}\n")
    return copy


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        ("qualify/tier0", "from vllm_bundle.install.installer import swap_into_place", "install.installer"),
        ("inputs/lockfile", "from ..util import fetch", "util.fetch"),  # allowed: util is earlier
        ("util/fsutil", "from vllm_bundle.tree.stage import run_stage", "tree.stage"),
        ("release/archive", "import vllm_bundle.oci.layout", "oci.layout"),
        ("tree/stage", "from vllm_bundle import pipeline", "pipeline"),
    ],
)
def test_a_wrong_way_import_is_caught(tmp_path: Path, module: str, line: str, expected: str) -> None:
    problems = wrong_way_imports(import_graph(_copy_with(tmp_path, module, line)))
    if expected == "util.fetch":
        assert problems == []
    else:
        assert problems == [f"vllm_bundle.{module.replace('/', '.')} imports vllm_bundle.{expected}"]


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("install/doctor", "import tomli_w"),
        ("util/tarstream", "import zlib_ng"),  # reached from install through util.parts
        ("manifests", "from elftools.elf.elffile import ELFFile"),
        ("cli", "import uv"),
    ],
)
def test_a_build_extra_import_on_the_consumer_side_is_caught(tmp_path: Path, module: str, line: str) -> None:
    problems = consumer_uses_build_extra(import_graph(_copy_with(tmp_path, module, line)))
    assert problems == [f"vllm_bundle.{module.replace('/', '.')} imports {line.split()[1].split('.')[0]}"]


# -- the release assets' names have one home (#35, point 3) -------------------------------------------------

#: Fragments of a release asset's name: only manifests.py (ReleaseAssets, part_name) may spell them.
ASSET_NAME = re.compile(r"-x64\b|\.partcount|\.cdx\.json|\.part(\{|[0-9*])")


def _strings_in_code(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module but its docstrings (module, class, function), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_release_asset_names_are_spelled_in_manifests_only() -> None:
    spelled = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "manifests.py"
        for line, text in _strings_in_code(path)
        if ASSET_NAME.search(text)
    ]
    assert spelled == [], "asset names belong to manifests.ReleaseAssets"
