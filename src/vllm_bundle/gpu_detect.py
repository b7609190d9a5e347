"""Which AMD GPU this machine has, for ``install --target auto``.

The amdgpu driver's KFD topology lists one node per CPU socket and GPU under
``/sys/class/kfd/kfd/topology/nodes/<N>/properties`` ("key value" lines); a GPU node has a non-zero
``gfx_target_version``, ``major * 10000 + minor * 100 + stepping``, where the ISA name writes minor and
stepping as hex digits (110501 -> gfx1151, 90010 -> gfx90a). Without that tree (a container without
/sys/class/kfd), ``rocminfo`` is asked instead. The ISA maps to a target through ``recipes/targets.toml``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from vllm_bundle.errors import BundleError
from vllm_bundle.recipes import Recipes

KFD_NODES = Path("sys/class/kfd/kfd/topology/nodes")
#: Read /sys from another root (a chroot, a captured tree); rocminfo is then not asked.
SYSTEM_ROOT_ENV = "VLLM_BUNDLE_SYSTEM_ROOT"
ROCMINFO_NAME = re.compile(r"^\s*Name:\s*(gfx[0-9a-f]+)\b", re.MULTILINE)


class NoSupportedGPUError(BundleError):
    """No AMD GPU, or none that any target supports."""


def isa_from_target_version(version: int) -> str:
    major, minor, stepping = version // 10000, version // 100 % 100, version % 100
    return f"gfx{major}{minor:x}{stepping:x}"


def _properties(path: Path) -> dict[str, str]:
    pairs = (line.split(None, 1) for line in path.read_text(errors="replace").splitlines())
    return {pair[0]: pair[1].strip() for pair in pairs if len(pair) == 2}


def kfd_isas(system_root: Path = Path("/")) -> list[str]:
    """The ISA of each GPU node in the KFD topology (CPU nodes have gfx_target_version 0)."""
    nodes = system_root / KFD_NODES
    if not nodes.is_dir():
        return []
    isas = []
    for node in sorted(nodes.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        try:
            version = int(_properties(node / "properties").get("gfx_target_version", "0"))
        except (OSError, ValueError):
            continue
        if version:
            isas.append(isa_from_target_version(version))
    return isas


def rocminfo_isas() -> list[str]:
    if shutil.which("rocminfo") is None:
        return []
    try:
        result = subprocess.run(["rocminfo"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return list(dict.fromkeys(ROCMINFO_NAME.findall(result.stdout)))


def detect_isas() -> list[str]:
    root = os.environ.get(SYSTEM_ROOT_ENV)
    if root:
        return kfd_isas(Path(root))
    return kfd_isas() or rocminfo_isas()


def target_for_isas(recipes: Recipes, isas: list[str]) -> str:
    """The first target (in the order of the machine's GPUs) that covers one of ``isas``."""
    if not isas:
        raise NoSupportedGPUError(
            "no AMD GPU found (no GPU node under /sys/class/kfd, and rocminfo found none)",
            "install the amdgpu driver, or pass --target <name> to install anyway",
        )
    for isa in isas:
        for name, target in recipes.targets.items():
            if isa in target.isas:
                return name
    raise NoSupportedGPUError(
        f"this machine's GPU ({', '.join(isas)}) is not covered by any target ({', '.join(recipes.targets)})",
        "pass --target <name> to install anyway",
    )
