"""The ``python`` stage: python-build-standalone's CPython, verified, extracted safely (see
:mod:`vllm_bundle.util.extract`) and made relocatable."""

from __future__ import annotations

import os
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_bundle.errors import BundleError, UnsafeArchiveError
from vllm_bundle.tree.stage import StageResult, run_stage
from vllm_bundle.util.extract import safe_extract
from vllm_bundle.util.fetch import require_sha256

STAGE_VERSION = 2
TOP = "python"
BUILD_PREFIX = "/install"  # python-build-standalone's build prefix, left in its build files

SYSCONFIG_RELOCATION = f"""

# vllm-bundle: python-build-standalone was built in {BUILD_PREFIX}; point the build-time paths at
# wherever this tree now is (extensions and Triton's run-time compiles read them).
def _vllm_bundle_relocate(values):
    import os
    prefix = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {{key: value.replace({BUILD_PREFIX!r}, prefix) if isinstance(value, str) else value
            for key, value in values.items()}}


build_time_vars = _vllm_bundle_relocate(build_time_vars)
"""


def extract_python(tarball: Path, dest: Path, filename: str) -> None:
    """Extract the tarball's ``python/`` tree into ``dest``, refusing any unsafe entry."""
    try:
        with tarfile.open(tarball, "r:*") as archive:
            safe_extract(archive, dest, filename, top=TOP)
    except tarfile.TarError as err:
        raise UnsafeArchiveError(f"cannot read {filename}: {err}", "fetch it again") from None


def fix_build_paths(root: Path, minor: str) -> list[Path]:
    """Point sysconfig data, the config Makefile and pkg-config files at the tree, relatively."""
    fixed = []
    stdlib = root / "lib" / f"python{minor}"
    for path in sorted(stdlib.glob("_sysconfigdata_*.py")):
        text = path.read_text()
        if "_vllm_bundle_relocate" not in text:
            path.write_text(text + SYSCONFIG_RELOCATION)
            fixed.append(path)
    for path in sorted(stdlib.glob("config-*/Makefile")):
        text = path.read_text()
        # The Makefile sits in lib/pythonX.Y/config-*/: the prefix is three directories up.
        relative = "$(abspath $(dir $(lastword $(MAKEFILE_LIST)))../../..)"
        text = re.sub(rf"(?m)^prefix=(\s*){re.escape(BUILD_PREFIX)}\s*$", rf"prefix=\g<1>{relative}", text)
        path.write_text(text.replace(BUILD_PREFIX + "/", "$(prefix)/"))
        fixed.append(path)
    for path in sorted((root / "lib" / "pkgconfig").glob("*.pc")):
        if path.is_symlink():
            continue
        text = re.sub(rf"(?m)^prefix={re.escape(BUILD_PREFIX)}\s*$", "prefix=${pcfiledir}/../..", path.read_text())
        path.write_text(text.replace(BUILD_PREFIX + "/", "${prefix}/"))
        fixed.append(path)
    return fixed


def python_stage(
    tarball: Path, sha256: str, minor: str, filename: str | None = None, *, out: Path, force: bool = False
) -> StageResult:
    """``filename``: the artifact's own name, for messages (``tarball`` may be a cache blob)."""
    name = filename or tarball.name

    def build(tmp: Path) -> Mapping[str, Any]:
        require_sha256(tarball, sha256, name)
        extract_python(tarball, tmp, name)
        if not (tmp / "bin" / f"python{minor}").exists():
            raise BundleError(f"{name} has no bin/python{minor}", "check python.version in the recipe")
        fixed = fix_build_paths(tmp, minor)
        return {"fixed": [os.fspath(p.relative_to(tmp)) for p in fixed]}

    return run_stage(out, "python", STAGE_VERSION, {"tarball": sha256, "minor": minor}, build, force=force)
