"""Which AMD GPU this machine has, for ``install --target auto``.

The ISA of a GPU is AMD's ``rocm-bootstrap``'s reading of its KFD node's ``gfx_target_version``
(``parse_gfx_target_version``, the canonical GFX target knowledge), and its overrides hold
(``ROCM_BOOTSTRAP_FORCE_GFX_ARCH=gfx1151``, ``ROCM_BOOTSTRAP_DISABLE_DETECTION=1``: then rocm-bootstrap's
``detect_gfx_targets`` answers). The KFD topology itself is read by the runtime's reader under the host
root, the one ``doctor``'s checks read: rocm-bootstrap's own reader knows only ``/sys`` (``install
--host-root`` detected the real machine's GPU and then checked the tree's), and reads a FIFO there
until it blocks. What is ours is the mapping of the machine's ISAs to a release target
(``recipes/targets.toml``) and the one-line refusals.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from rocm_bootstrap import detect_gfx_targets, parse_gfx_target_version

from vllm_bundle.errors import NoSupportedGPUError
from vllm_bundle.recipes import Target
from vllm_bundle.runtime import amdgpu

#: rocm-bootstrap's overrides (rocm_bootstrap/detect.py, ``detect_gpus``).
OVERRIDE_VARIABLES = ("ROCM_BOOTSTRAP_DISABLE_DETECTION", "ROCM_BOOTSTRAP_FORCE_GFX_ARCH")


def detect_isas(root: Path, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The ISAs of the AMD GPUs of the host under ``root``, in the driver's node order, each once."""
    try:
        if any(environ.get(name) for name in OVERRIDE_VARIABLES):
            return [target.name for target in detect_gfx_targets()]
        names = [parse_gfx_target_version(gpu.gfx_target_version).name for gpu in amdgpu.gpu_nodes(root)]
    except ValueError as err:  # a GPU (or a forced name) rocm-bootstrap does not know
        raise NoSupportedGPUError(
            f"no supported AMD GPU found: {err}", "pass --target <name> to install anyway"
        ) from None
    return list(dict.fromkeys(str(name) for name in names))


def target_for_isas(targets: Mapping[str, Target], isas: list[str], root: Path = Path("/")) -> str:
    """The first target (in the order of the machine's GPUs) that covers one of ``isas``."""
    if not isas:
        raise NoSupportedGPUError(
            f"no supported AMD GPU found (no GPU node under {root / 'sys/class/kfd'})",
            "install the amdgpu driver, or pass --target <name> to install anyway",
        )
    for isa in isas:
        for name, target in targets.items():
            if isa in target.isas:
                return name
    raise NoSupportedGPUError(
        f"no supported AMD GPU found: this machine's GPU ({', '.join(isas)}) is not covered by any target "
        f"({', '.join(targets)})",
        "pass --target <name> to install anyway",
    )
