"""vLLM's native extensions in a ROCm build: which must exist, and whether each HIP one carries code
objects for every ISA of the target. One check for the built wheel (the vllm-wheel stage, before it is
stamped) and for a bundle tree (tier 0).

vLLM drops ISAs missing from its architecture list without failing the build (vllm-0.33.0:
cmake/utils.cmake override_gpu_arches), and a Python-only build has no extensions at all: only the
extensions' own offload bundles show whether its kernels exist for the target's GPUs.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from vllm_bundle.recipes import ExtensionRule
from vllm_bundle.util.offload import fatbin_isas


def _pattern(name: str) -> re.Pattern[str]:
    """``vllm/<name>.abi3.so`` or ``vllm/<name>.cpython-312-x86_64-linux-gnu.so`` (free-threaded)."""
    return re.compile(rf"^vllm/{re.escape(name)}\.(?:[^/]+\.)?so$")


def find_in_tree(site: Path, rule: ExtensionRule) -> dict[str, Path | None]:
    files = (
        sorted(p.relative_to(site).as_posix() for p in (site / "vllm").glob("*.so")) if (site / "vllm").is_dir() else []
    )
    return {name: next((site / f for f in files if _pattern(name).match(f)), None) for name in rule.names}


def find_in_wheel(wheel: Path, rule: ExtensionRule, scratch: Path) -> dict[str, Path | None]:
    """Each extension of the wheel, extracted to ``scratch`` to be read (None where it is missing)."""
    found: dict[str, Path | None] = {}
    scratch.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        for name in rule.names:
            member = next((m for m in names if _pattern(name).match(m)), None)
            if member is None:
                found[name] = None
                continue
            path = scratch / Path(member).name
            with archive.open(member) as src, path.open("wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            found[name] = path
    return found


def extension_problems(
    found: Mapping[str, Path | None], rule: ExtensionRule, isas: Sequence[str]
) -> tuple[list[str], dict[str, set[str]]]:
    """Problems (a missing extension, an ISA without code objects) and the ISAs of each HIP extension."""
    problems: list[str] = []
    carried: dict[str, set[str]] = {}
    for name in rule.names:
        path = found.get(name)
        if path is None:
            problems.append(f"vllm/{name} (a native extension of a ROCm build) is missing")
            continue
        if name not in rule.device_code:
            continue
        carried[name] = fatbin_isas(path)
        missing = [isa for isa in isas if isa not in carried[name]]
        if missing:
            has = ", ".join(sorted(carried[name])) or "none"
            problems.append(f"vllm/{path.name} has no code objects for {', '.join(missing)} (it has {has})")
    return problems, carried
