"""What vLLM's own build asks of its environment, checked before it runs: a no-isolation build installs
nothing, so a build tool the lock's build group lacks surfaces as an ImportError deep in setup.py (or,
for a CMake step, as a configure error), after minutes. These checks read the source release itself:

- its ``pyproject.toml`` ``[build-system] requires`` (vllm-0.33.0: cmake, ninja, packaging, setuptools,
  setuptools-scm, setuptools-rust, wheel, jinja2; torch is the bundle's own, as vLLM's
  ``use_existing_torch.py`` says), each installed where the build's interpreter looks (the build group
  in scratch, then the site stage) in a version the requirement allows;
- the programs its CMake runs by name from PATH: GNU ``patch`` (vllm-0.33.0 CMakeLists.txt:409-441
  patches a torch 2.13 header with it).
"""

from __future__ import annotations

import re
import shutil
import tomllib
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from vllm_bundle.errors import BuildError
from vllm_bundle.inputs.sdist_requirements import TORCH_FAMILY

#: Programs vLLM's CMake code runs by name (``execute_process(COMMAND <name> ...)``), with the package that
#: brings them on Debian and Ubuntu.
CMAKE_PROGRAMS = {"patch": "patch"}


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


def require_build_tools(source: Path, sites: Sequence[Path], env: Mapping[str, str], *, runs_cmake: bool) -> None:
    """Fail in one line, before the build, when a tool vLLM's build needs is missing or too old (the
    programs its CMake runs only where it runs CMake: not in a Python-only build)."""
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
    lists = source / "CMakeLists.txt"
    text = lists.read_text(errors="replace") if runs_cmake and lists.is_file() else ""
    for program, package in CMAKE_PROGRAMS.items():
        if re.search(rf"COMMAND\s+{re.escape(program)}\b", text) and not shutil.which(program, path=env.get("PATH")):
            raise BuildError(
                f"vLLM's CMakeLists.txt runs `{program}`, which is not on the build's PATH",
                f"install it (apt-get install {package}) on the build machine",
            )
