"""Which GPU a HIP program such as vLLM uses as its device 0, from the device-selection variables, by the
rules of the code that reads them (so ``doctor`` checks the GPU vLLM will use, and the launcher sizes
memory for it). Three readers, in order:

1. ROCr, ``ROCR_VISIBLE_DEVICES`` (ROCm/rocm-systems:projects/rocr-runtime/runtime/hsa-runtime/core/
   runtime/amd_filter_device.cpp, ``RvdFilter``; rules in core/inc/amd_filter_device.h). Set but empty:
   no GPU. Tokens split at ``,``, trimmed and upper-cased. A token starting with ``G`` is a UUID, 5 to 20
   characters, a prefix of exactly one GPU's ``GPU-%016X`` of its KFD ``unique_id`` (a GPU whose
   ``unique_id`` is 0 has none); any other token is a number as C's ``strtol(.., 0)`` reads it (``0x``
   hex, a leading ``0`` octal), in range and not chosen before. The first token that is none of these
   ends the list; tokens beyond the number of GPUs are ignored.
2. HIP, ``HIP_VISIBLE_DEVICES``, or ``CUDA_VISIBLE_DEVICES`` when that is empty or unset; both empty or
   unset: every GPU ROCr left (ROCm/clr:rocclr/device/rocm/rocdevice.cpp, ``Device::init``). Tokens are
   not trimmed. A token holding ``GPU-`` picks the first GPU whose UUID (lower-case ``GPU-%016x``;
   ``GPU-XX`` when ``unique_id`` is 0) contains it; any other must be a decimal index written as
   ``str(int)`` writes it, below the number of GPUs ROCr left. The first invalid token ends the list;
   a GPU named twice is skipped.
3. vLLM 0.33.0 at import (vllm/platforms/rocm.py, ``_sync_hip_cuda_env_vars``): an empty value counts
   as unset; ``HIP_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` both set and not the same string
   raises ``Inconsistent GPU visibility env vars``: vLLM does not start.

Standard library only: this module ships inside every bundle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

VARIABLES = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
ROCR, HIP, CUDA = VARIABLES
#: ROCr's UUID tokens (amd_filter_device.cpp, ``ProcessUuidToken``).
UUID_TOKEN_LENGTH = range(5, 21)
#: What C's ``strtol(token, &end, 0)`` reads whole: a sign, then hex, octal or decimal digits.
_STRTOL = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
#: Digits beyond this many name no GPU (and ``int()`` refuses 4300 digits).
MAX_DIGITS = 9


@dataclass(frozen=True)
class Selection:
    """The GPUs a HIP program sees, as positions in the KFD GPU-node list (its device 0 first), or why
    vLLM cannot use any (``problem``)."""

    order: tuple[int, ...]
    problem: str | None = None

    @property
    def device0(self) -> int | None:
        return self.order[0] if self.order and self.problem is None else None


def rocr_uuid(unique_id: int) -> str | None:
    return None if unique_id == 0 else f"GPU-{unique_id:016X}"


def hip_uuid(unique_id: int) -> str:
    return "GPU-XX" if unique_id == 0 else f"GPU-{unique_id:016x}"


def select(unique_ids: Sequence[int], environ: Mapping[str, str]) -> Selection:
    """The selection for the GPUs whose KFD ``unique_id`` s are ``unique_ids`` (in node order)."""
    hip_value, cuda_value = environ.get(HIP) or None, environ.get(CUDA) or None
    if hip_value is not None and cuda_value is not None and hip_value != cuda_value:
        return Selection((), f"vLLM refuses to start: {HIP} and {CUDA} differ (Inconsistent GPU visibility env vars)")
    order = list(range(len(unique_ids)))
    rocr_value = environ.get(ROCR)
    if rocr_value is not None:
        order, why = _rocr(rocr_value, unique_ids)
        if not order:
            return Selection((), f"ROCr sees no GPU: {why}")
    chosen = hip_value if hip_value is not None else cuda_value
    if chosen is not None:
        order, why = _hip(chosen, [unique_ids[position] for position in order], order)
        if not order:
            return Selection((), f"HIP sees no GPU: {why}")
    return Selection(tuple(order))


def _rocr(value: str, unique_ids: Sequence[int]) -> tuple[list[int], str]:
    """ROCr's list, and why it ended where it did."""
    if not value:
        return [], f"{ROCR} is set but empty"
    uuids = [rocr_uuid(unique_id) for unique_id in unique_ids]
    chosen: list[int] = []
    for token in [token.strip().upper() for token in value.split(",")][: len(unique_ids)]:
        position, why = _rocr_token(token, uuids)
        if position is None or position in chosen:
            return chosen, why or f"{token} is named twice"
        chosen.append(position)
    return chosen, "every token names a GPU"


def _rocr_token(token: str, uuids: Sequence[str | None]) -> tuple[int | None, str]:
    if token.startswith("G"):
        if len(token) not in UUID_TOKEN_LENGTH:
            return None, f"{token[:24]!r} is not a UUID of 5 to 20 characters"
        matches = [position for position, uuid in enumerate(uuids) if uuid is not None and uuid.startswith(token)]
        if len(matches) != 1:
            shared = " (partitions of one GPU share its UUID: name them by index)" if matches else ""
            return None, f"{token} matches {len(matches)} GPUs' unique_id{shared}"
        return matches[0], ""
    if not _STRTOL.fullmatch(token) or len(token) > MAX_DIGITS + 2:
        return None, f"{token[:24]!r} is not a device index"
    index = int(token, 0) if not re.fullmatch(r"[+-]?0[0-7]+", token) else int(token, 8)
    if not 0 <= index < len(uuids):
        return None, f"{index} is not one of the {len(uuids)} GPUs (0 to {len(uuids) - 1})"
    return index, ""


def _hip(value: str, unique_ids: Sequence[int], positions: Sequence[int]) -> tuple[list[int], str]:
    """HIP's list among the GPUs ROCr left (``positions``), and why it ended where it did."""
    uuids = [hip_uuid(unique_id) for unique_id in unique_ids]
    chosen: list[int] = []
    for token in value.split(","):
        if "GPU-" in token:
            index = next((i for i, uuid in enumerate(uuids) if token in uuid), None)
            if index is None:
                return chosen, f"{token[:40]} matches no GPU's UUID"
        elif token.isascii() and token.isdigit() and len(token) <= MAX_DIGITS and str(int(token)) == token:
            index = int(token)
            if index >= len(uuids):
                return chosen, f"{index} is not one of the {len(uuids)} GPUs HIP sees (0 to {len(uuids) - 1})"
        else:
            return chosen, f"{token[:24]!r} is not a device index"
        if positions[index] not in chosen:
            chosen.append(positions[index])
    return chosen, "every token names a GPU"
