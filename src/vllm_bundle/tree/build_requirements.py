"""What vLLM's own build asks of its environment, checked before it runs: a no-isolation build installs
nothing, so a build tool the lock's build group lacks surfaces as an ImportError deep in setup.py (or,
for a CMake step, as a configure error), after minutes. These checks read the source release itself:

- its ``pyproject.toml`` ``[build-system] requires`` (vllm-0.33.0: cmake, ninja, packaging, setuptools,
  setuptools-scm, setuptools-rust, wheel, jinja2; torch is the bundle's own, as vLLM's
  ``use_existing_torch.py`` says), each installed where the build's interpreter looks (the build group
  in scratch, then the site stage) in a version the requirement allows;
- the programs its CMake runs by name from PATH: GNU ``patch`` (vllm-0.33.0 CMakeLists.txt:409-441
  patches a torch 2.13 header with it), which the builder must have (tree/builder.py checks it there).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from vllm_bundle.errors import BuildError
from vllm_bundle.inputs.sdist_requirements import TORCH_FAMILY

#: Programs vLLM's CMake code may run by name (``execute_process(COMMAND <name> ...)``).
CMAKE_PROGRAMS = ("patch",)


def build_system_requires(source: Path) -> list[Requirement]:
    """``[build-system] requires`` of the source's pyproject.toml, without the torch family."""
    pyproject = source / "pyproject.toml"
    if not pyproject.is_file():
        return []
    try:
        table = tomllib.loads(pyproject.read_text())
        lines = table.get("build-system", {}).get("requires", [])
        requirements = [Requirement(line) for line in lines]
    except (tomllib.TOMLDecodeError, InvalidRequirement, AttributeError) as err:
        raise BuildError(f"vLLM's pyproject.toml has no readable [build-system] requires: {err}") from None
    family = {canonicalize_name(name) for name in TORCH_FAMILY}
    return [r for r in requirements if canonicalize_name(r.name) not in family]


def _installed(sites: Sequence[Path]) -> dict[str, str]:
    """Every distribution in ``sites`` -> its version; the first site wins, as on ``sys.path``."""
    found: dict[str, str] = {}
    for site in sites:
        for dist in metadata.distributions(path=[str(site)]):
            found.setdefault(canonicalize_name(dist.metadata["Name"] or ""), dist.version)
    return found


def _satisfied(requirement: Requirement, version: str | None) -> bool:
    if version is None:
        return False
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def require_build_tools(source: Path, sites: Sequence[Path]) -> None:
    """Fail in one line, before the build, when a Python build tool vLLM's build needs is missing or too old."""
    installed = _installed(sites)
    for requirement in build_system_requires(source):
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        version = installed.get(canonicalize_name(requirement.name))
        if not _satisfied(requirement, version):
            have = f"the build group has {requirement.name} {version}" if version else "the build group lacks it"
            raise BuildError(
                f"vLLM's build needs {requirement} (its pyproject.toml [build-system] requires); {have}",
                "re-lock: the build group comes from vLLM's requirements/build/rocm.txt "
                "(vllm.build-requirement-files in recipes/components.toml)",
            )


def cmake_programs(source: Path) -> list[str]:
    """The programs of CMAKE_PROGRAMS that the source's CMakeLists.txt runs."""
    lists = source / "CMakeLists.txt"
    text = lists.read_text(errors="replace") if lists.is_file() else ""
    return [program for program in CMAKE_PROGRAMS if re.search(rf"COMMAND\s+{re.escape(program)}\b", text)]
