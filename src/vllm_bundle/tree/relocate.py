"""Make a tree relocatable: no file may refer to the directory it was built in.

- scripts in ``bin/`` whose shebang names a Python get a ``/bin/sh`` trampoline that execs the
  interpreter beside them (the form uv uses for relocatable environments);
- RPATH/RUNPATH entries pointing into the build tree become ``$ORIGIN``-relative (patchelf);
- finally every file is scanned for the build path; any hit fails the stage, naming the files.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from vllm_bundle.errors import RelocationError
from vllm_bundle.util.elf import DynamicInfo, dynamic_info, is_elf, set_runpath

TRAMPOLINE = """#!/bin/sh
'''exec' "$(dirname -- "$(realpath -- "$0")")/{python}" "$0" "$@"
' '''
"""


def regular_files(root: Path) -> Iterator[Path]:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink():
                yield path


def dynamic_files(root: Path) -> dict[Path, DynamicInfo]:
    """Each dynamic ELF file of the tree (regular files, in path order) with what its dynamic section says:
    read once for all that need it (pyelftools takes milliseconds a file)."""
    found = {}
    for path in sorted(regular_files(root)):
        info = dynamic_info(path) if is_elf(path) else None
        if info is not None:
            found[path] = info
    return found


def unshare(path: Path) -> None:
    """Give a hard-linked file (shared with an earlier stage's output) its own copy before editing it."""
    if path.stat().st_nlink > 1:
        tmp = path.with_name(path.name + ".unshare")
        shutil.copy2(path, tmp)
        tmp.replace(path)


def fix_shebangs(root: Path, python_name: str) -> list[Path]:
    fixed = []
    bin_dir = root / "bin"
    for path in sorted(bin_dir.iterdir()) if bin_dir.is_dir() else []:
        if path.is_symlink() or not path.is_file():
            continue
        with path.open("rb") as handle:
            first = handle.readline()
        if not first.startswith(b"#!") or b"python" not in first:
            continue
        rest = path.read_bytes()[len(first) :]
        unshare(path)
        mode = path.stat().st_mode
        path.write_bytes(TRAMPOLINE.format(python=python_name).encode() + rest)
        path.chmod(mode)
        fixed.append(path)
    return fixed


def fix_rpaths(root: Path, build_dir: Path) -> list[Path]:
    """Rewrite search-path entries that point into ``build_dir`` as ``$ORIGIN``-relative ones, and drop
    other absolute entries (a wheel built against ``/opt/rocm-7.0.0/lib``, say): a bundle must never
    pick up a host's ROCm; the system's own directories are searched by the loader anyway."""
    fixed = []
    build = str(build_dir.resolve())
    for path, info in dynamic_files(root).items():
        entries = list(info.runpath or info.rpath)
        if not any(entry.startswith("/") for entry in entries):
            continue
        rewritten = [_origin_relative(path, e, root, build) for e in entries if e.startswith(("$", build))]
        unshare(path)
        set_runpath(path, rewritten, info)
        fixed.append(path)
    return fixed


def _origin_relative(path: Path, entry: str, root: Path, build: str) -> str:
    """``<build>/<stage dir>/rest`` (this stage's or an earlier one's) -> ``$ORIGIN/...`` to ``root/rest``."""
    if not entry.startswith(build):
        return entry
    parts = Path(entry).relative_to(build).parts
    target = root.joinpath(*parts[1:])
    return "$ORIGIN/" + os.path.relpath(target, path.parent)


#: How much of a file :func:`mentions` holds at a time.
SEARCH_BLOCK = 8 * 2**20


def mentions(path: Path, needle: bytes) -> bool:
    """Whether the file holds ``needle``, read a block at a time (each block searched with the tail of
    the one before it, so a needle across two blocks is found). Not an mmap: the pages of a mapped file
    count in the process's RSS once read, and a bundle's libraries weigh up to 2 GB each."""
    tail = b""
    with path.open("rb") as handle:
        while block := handle.read(SEARCH_BLOCK):
            if needle in tail + block[: len(needle) - 1] or needle in block:
                return True
            tail = block[-(len(needle) - 1) :] if len(needle) > 1 else b""
    return False


def files_mentioning(root: Path, needle: bytes) -> list[Path]:
    return [path for path in regular_files(root) if mentions(path, needle)]


def check_no_build_paths(root: Path, build_dir: Path) -> None:
    hits = files_mentioning(root, str(build_dir.resolve()).encode())
    if hits:
        names = ", ".join(str(p.relative_to(root)) for p in hits[:5])
        more = f" and {len(hits) - 5} more" if len(hits) > 5 else ""
        raise RelocationError(
            f"{len(hits)} file(s) still name the build directory {build_dir.resolve()}: {names}{more}",
            "such a bundle breaks once moved; fix the stage that wrote them",
        )
