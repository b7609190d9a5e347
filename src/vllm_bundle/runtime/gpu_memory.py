"""The launcher's default for vLLM's ``--gpu-memory-utilization``, when the caller gave none.

vLLM refuses to start when the device's free memory is below ``gpu_memory_utilization`` x its total
(``request_memory`` in vllm/v1/worker/utils.py, run by every GPU worker at start, also when
``--kv-cache-memory-bytes`` is given: that option sizes the KV cache but the check still applies), and
its default is 0.92 (vllm/config/cache.py). A desktop on a Strix Halo holds several GiB of the shared
memory, so the default fails there. This module reads the GPU's memory from sysfs (:mod:`.amdgpu`),
leaves headroom, and prints the fraction for the launcher to pass, with one line on stderr saying so.

Run as ``python -m _vllm_bundle_runtime.gpu_memory <the caller's vLLM arguments>``; prints nothing when
the caller chose (``--gpu-memory-utilization`` or its alias, in any spelling argparse accepts, or a
``--config`` file that may set it) or when there is no AMD GPU to read. Never fails: the launcher
starts vLLM either way.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import amdgpu

#: vLLM's own default (vllm/config/cache.py, ``gpu_memory_utilization``): never chosen above it.
VLLM_DEFAULT = 0.92
#: Left free at start for what other programs allocate meanwhile and the engine's own HIP context.
HEADROOM_FRACTION = 0.05
HEADROOM_MIN_BYTES = 1 << 30
#: Below this, no value would start a useful server: the launcher leaves vLLM's error to say so.
LOWEST = 0.05
#: The options by which the caller sets the budget (vllm/engine/arg_utils.py; ``_`` and ``-`` alike,
#: and unambiguous abbreviations: vLLM's parser keeps argparse's ``allow_abbrev``).
CALLER_OPTIONS = ("gpu-memory-utilization", "device-memory-utilization", "config")
SHORTEST_ABBREVIATION = 4
GIB = float(1 << 30)


def caller_chose(args: Sequence[str]) -> bool:
    for arg in args:
        if arg == "--":
            break
        if not arg.startswith("--"):
            continue
        key = arg[2:].split("=", 1)[0].replace("_", "-")
        if len(key) >= SHORTEST_ABBREVIATION and any(option.startswith(key) for option in CALLER_OPTIONS):
            return True
    return False


def choose(pool: amdgpu.MemoryPool) -> float | None:
    """The largest utilization, in hundredths and at most vLLM's default, that the free memory covers
    with headroom left; None when that is below :data:`LOWEST`."""
    if pool.total <= 0:
        return None
    headroom = max(HEADROOM_MIN_BYTES, pool.total * HEADROOM_FRACTION)
    fraction = math.floor((pool.free - headroom) / pool.total * 100) / 100
    value = min(VLLM_DEFAULT, fraction)
    return value if value >= LOWEST else None


@dataclass(frozen=True)
class Decision:
    value: float | None
    line: str | None  # what the launcher says on stderr, if anything


def describe(pool: amdgpu.MemoryPool) -> str:
    shared = " (GTT: an APU's shared system memory)" if pool.kind == "gtt" else ""
    return f"{pool.free / GIB:.1f} of {pool.total / GIB:.1f} GiB free{shared}"


def decide(args: Sequence[str], root: Path, environ: Mapping[str, str]) -> Decision:
    if caller_chose(args):
        return Decision(None, None)
    gpus = amdgpu.gpu_nodes(root)
    if not gpus:
        return Decision(None, None)  # no AMD GPU: vLLM says so itself
    index = amdgpu.visible_index(environ)
    if index is None or index >= len(gpus):
        return Decision(None, _keep("cannot tell which GPU HIP makes device 0 (*_VISIBLE_DEVICES)"))
    gpu = gpus[index]
    try:
        pool = amdgpu.memory_pool(root, gpu)
    except amdgpu.Unreadable as err:
        return Decision(None, _keep(f"cannot read GPU {index}'s memory ({err})"))
    value = choose(pool)
    if value is None:
        return Decision(
            None,
            f"vllm-server: GPU {index} has {describe(pool)}: too little for vLLM to start; "
            "close what holds GPU memory, or pass --gpu-memory-utilization",
        )
    return Decision(
        value,
        f"vllm-server: GPU {index} has {describe(pool)}; starting vLLM with --gpu-memory-utilization "
        f"{value:.2f} (pass --gpu-memory-utilization to choose)",
    )


def _keep(why: str) -> str:
    return f"vllm-server: {why}; vLLM's default --gpu-memory-utilization applies"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        decision = decide(sys.argv[1:] if argv is None else argv, amdgpu.host_root(), os.environ)
    except Exception as err:  # the server starts regardless: say why there is no default, never fail
        decision = Decision(None, _keep(f"could not choose a memory default ({type(err).__name__}: {err})"))
    if decision.line:
        print(decision.line, file=sys.stderr)
    if decision.value is not None:
        print(f"{decision.value:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
