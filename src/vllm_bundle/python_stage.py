"""The ``python`` stage: python-build-standalone's CPython, extracted safely and made relocatable.

Extraction is stricter than tarfile's "data" filter (which it also applies): every entry is checked
before anything is written, and an absolute name, a ``..`` component, a link (symbolic or hard)
that leaves the tree, a device node or FIFO, or an entry outside ``python/`` refuses the archive.
"""

from __future__ import annotations

import os
import posixpath
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from vllm_bundle.errors import BundleError
from vllm_bundle.stage import StageResult, run_stage

STAGE_VERSION = 1
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


class UnsafeArchiveError(BundleError):
    """An archive entry would write outside its destination or create a special file."""


def _inside_top(base: PurePosixPath, target: str) -> bool:
    """Whether ``base/target`` stays inside ``python/`` (the part of the archive that is extracted)."""
    normal = posixpath.normpath(str(base / target))
    return normal.startswith(TOP + "/")


def check_member(member: tarfile.TarInfo) -> str | None:
    """Why an entry of a CPython tarball is unsafe, or None."""
    name = PurePosixPath(member.name)
    if member.name.startswith("/"):
        return "has an absolute path"
    if ".." in name.parts:
        return "has a '..' component"
    if name.parts[0] != TOP:
        return f"is outside the {TOP}/ directory"
    if member.isdev() or member.isfifo():
        return "is a device node or FIFO"
    if member.issym() and (member.linkname.startswith("/") or not _inside_top(name.parent, member.linkname)):
        return f"is a symlink leaving the tree (-> {member.linkname})"
    if member.islnk():
        target = PurePosixPath(member.linkname)
        if member.linkname.startswith("/") or ".." in target.parts or target.parts[0] != TOP:
            return f"is a hard link leaving the tree (-> {member.linkname})"
    return None


def _strip_top(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    member = tarfile.data_filter(member, dest)
    parts = PurePosixPath(member.name).parts
    if len(parts) == 1:
        return None
    name = str(PurePosixPath(*parts[1:]))
    if member.islnk():
        linkname = str(PurePosixPath(*PurePosixPath(member.linkname).parts[1:]))
        return member.replace(name=name, linkname=linkname, deep=False)
    return member.replace(name=name, deep=False)


def extract_python(tarball: Path, dest: Path) -> None:
    """Extract the tarball's ``python/`` tree into ``dest`` after checking every entry."""
    try:
        with tarfile.open(tarball, "r:*") as archive:
            members = archive.getmembers()
            for member in members:
                reason = check_member(member)
                if reason:
                    raise UnsafeArchiveError(
                        f"refusing to extract {tarball.name}: entry {member.name!r} {reason}",
                        "this is not a python-build-standalone tarball: re-lock, or check the mirror",
                    )
            archive.extractall(dest, members=members, filter=_strip_top)  # noqa: S202 - checked above
    except tarfile.TarError as err:
        raise UnsafeArchiveError(f"cannot extract {tarball.name}: {err}", "fetch it again") from None


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


def python_stage(tarball: Path, sha256: str, minor: str, out: Path, force: bool = False) -> StageResult:
    def build(tmp: Path) -> Mapping[str, Any]:
        extract_python(tarball, tmp)
        if not (tmp / "bin" / f"python{minor}").exists():
            raise BundleError(f"{tarball.name} has no bin/python{minor}", "check python.version in the recipe")
        fixed = fix_build_paths(tmp, minor)
        return {"fixed": [os.fspath(p.relative_to(tmp)) for p in fixed]}

    return run_stage(out, "python", STAGE_VERSION, {"tarball": sha256, "minor": minor}, build, force=force)
