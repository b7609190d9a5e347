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

from . import amdgpu, visibility

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


def largest_fitting(pool: amdgpu.MemoryPool) -> float | None:
    """The largest utilization in hundredths that vLLM's own check (free >= ceil(total x u)) accepts now;
    None when not even 0.01 does. The one rule ``doctor`` and the launcher judge a value by."""
    if pool.total <= 0:
        return None
    hundredths = pool.free * 100 // pool.total
    while hundredths > 0 and math.ceil(pool.total * (hundredths / 100)) > pool.free:
        hundredths -= 1  # float rounding at the edge
    return hundredths / 100 if hundredths > 0 else None


def with_headroom(pool: amdgpu.MemoryPool) -> float:
    """The largest utilization in hundredths that leaves :data:`HEADROOM_FRACTION` (at least
    :data:`HEADROOM_MIN_BYTES`) free, at most vLLM's default (may be 0 or less)."""
    headroom = max(HEADROOM_MIN_BYTES, pool.total * HEADROOM_FRACTION)
    return min(VLLM_DEFAULT, math.floor((pool.free - headroom) / pool.total * 100) / 100)


def choose(pool: amdgpu.MemoryPool) -> float | None:
    """The launcher's default: the largest utilization that leaves headroom, else the largest vLLM
    accepts at all (vLLM's own default would fail either way); None when that is below :data:`LOWEST`."""
    if pool.total <= 0:
        return None
    if (value := with_headroom(pool)) >= LOWEST:
        return value
    fitting = largest_fitting(pool)
    return min(VLLM_DEFAULT, fitting) if fitting is not None and fitting >= LOWEST else None


def leaves_headroom(pool: amdgpu.MemoryPool, value: float) -> bool:
    return pool.total > 0 and value <= with_headroom(pool)


def too_little(pool: amdgpu.MemoryPool) -> str:
    """Why no default fits, naming the largest value vLLM would accept if there is one."""
    largest = largest_fitting(pool)
    accepts = f"vLLM accepts at most --gpu-memory-utilization {largest:.2f}" if largest else "vLLM accepts no value"
    return f"too little for vLLM to start ({accepts}, below the {LOWEST:.2f} that serves a model)"


@dataclass(frozen=True)
class Decision:
    value: float | None
    line: str | None  # what the launcher says on stderr, if anything


#: What ``describe`` adds for a pool that is not plain VRAM.
POOL_NOTES = {"gtt": " (GTT: an APU's shared system memory)", "partition": " (this compute partition's share)"}


def describe(pool: amdgpu.MemoryPool) -> str:
    shared = POOL_NOTES.get(pool.kind, "")
    return f"{pool.free / GIB:.1f} of {pool.total / GIB:.1f} GiB free{shared}"


def decide(args: Sequence[str], root: Path, environ: Mapping[str, str]) -> Decision:
    if caller_chose(args):
        return Decision(None, None)
    gpus = amdgpu.gpu_nodes(root)
    if not gpus:
        return Decision(None, None)  # no AMD GPU: vLLM says so itself
    selection = visibility.select([gpu.unique_id for gpu in gpus], environ)
    index = selection.device0
    if index is None:
        return Decision(None, _keep(f"no GPU is HIP's device 0 ({selection.problem})"))
    gpu = gpus[index]
    try:
        pool = amdgpu.memory_pool(root, gpu)
    except amdgpu.Unreadable as err:
        return Decision(None, _keep(f"cannot read GPU {index}'s memory ({err})"))
    value = choose(pool)
    if value is None:
        return Decision(
            None,
            f"vllm-server: GPU {index} has {describe(pool)}: {too_little(pool)}; close what holds GPU memory",
        )
    tight = "" if leaves_headroom(pool, value) else ", all that fits now: no headroom left for other programs"
    return Decision(
        value,
        f"vllm-server: GPU {index} has {describe(pool)}; starting vLLM with --gpu-memory-utilization "
        f"{value:.2f}{tight} (pass --gpu-memory-utilization to choose)",
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
