"""Which AMD GPU this machine has, for ``install --target auto``.

Detection is AMD's ``rocm-bootstrap``, the canonical source of GFX target knowledge: it reads the
amdgpu driver's KFD topology (``/sys/class/kfd``), else ``clinfo``, and honours its own overrides
(``ROCM_BOOTSTRAP_FORCE_GFX_ARCH=gfx1151``, ``ROCM_BOOTSTRAP_DISABLE_DETECTION=1``). What is ours is the
mapping of the machine's ISAs to a release target (``recipes/targets.toml``) and the one-line refusals.
"""

from __future__ import annotations

from collections.abc import Mapping

from rocm_bootstrap import detect_gfx_targets

from vllm_bundle.errors import NoSupportedGPUError
from vllm_bundle.recipes import Target


def detect_isas() -> list[str]:
    """The ISAs of this machine's AMD GPUs, in the driver's node order, each once."""
    try:
        return [target.name for target in detect_gfx_targets()]
    except ValueError as err:  # a GPU (or a forced name) rocm-bootstrap does not know
        raise NoSupportedGPUError(
            f"no supported AMD GPU found: {err}", "pass --target <name> to install anyway"
        ) from None


def target_for_isas(targets: Mapping[str, Target], isas: list[str]) -> str:
    """The first target (in the order of the machine's GPUs) that covers one of ``isas``."""
    if not isas:
        raise NoSupportedGPUError(
            "no supported AMD GPU found (no GPU node under /sys/class/kfd, and clinfo found none)",
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
