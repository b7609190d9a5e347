"""Cached, atomic pipeline stages.

A stage writes its output into a temporary directory beside its final place and is renamed into
place only when complete. Its stamp (``.<name>.stage.json`` beside the output) records the hash of
the stage's declared inputs and is written last and removed first, so a stamp exists only for a
complete output built from exactly those inputs: a killed build never leaves a stage that looks
finished, and an unchanged stage is skipped.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_bundle.errors import RecipeError
from vllm_bundle.fsutil import atomic_write

#: The bundle pipeline's stages, in order (``bundle --force STAGE`` names one).
STAGES = ("python", "site", "vllm-src", "vllm-wheel", "app", "root", "qualify", "release")


def check_stage_names(names: Iterable[str]) -> None:
    """``--force`` names only stages that exist."""
    unknown = sorted(set(names) - set(STAGES))
    if unknown:
        raise RecipeError(f"unknown stage {unknown[0]!r} for --force", f"stages: {', '.join(STAGES)}")


@dataclass(frozen=True)
class StageResult:
    name: str
    path: Path
    key: str
    cached: bool
    seconds: float
    details: Mapping[str, Any]


def stage_key(name: str, version: int, inputs: Mapping[str, Any]) -> str:
    canonical = json.dumps({"stage": name, "version": version, "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def file_digest(*paths: Path) -> str:
    """One hash over files' names and bytes (for declaring patch files, templates... as inputs)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _stamp_path(out: Path) -> Path:
    return out.parent / f".{out.name}.stage.json"


def read_stamp(out: Path) -> dict[str, Any] | None:
    try:
        stamp: dict[str, Any] = json.loads(_stamp_path(out).read_text())
    except (OSError, ValueError):
        return None
    return stamp if out.exists() else None


def run_stage(
    out: Path,
    name: str,
    version: int,
    inputs: Mapping[str, Any],
    build: Callable[[Path], Mapping[str, Any] | None],
    force: bool = False,
) -> StageResult:
    """Build ``out`` with ``build(tmp_dir)`` unless a stamp with the same input hash exists.

    ``build`` may return details (e.g. patch outcomes) that are kept in the stamp and returned
    again when the stage is skipped.
    """
    key = stage_key(name, version, inputs)
    stamp = read_stamp(out)
    if stamp and stamp.get("key") == key and not force:
        return StageResult(name, out, key, True, 0.0, stamp.get("details", {}))
    began = time.monotonic()
    _stamp_path(out).unlink(missing_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        details = dict(build(tmp) or {})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    record = {"stage": name, "key": key, "inputs": inputs, "details": details}
    atomic_write(_stamp_path(out), json.dumps(record, indent=2, sort_keys=True, default=str).encode())
    return StageResult(name, out, key, False, time.monotonic() - began, details)
