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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from vllm_bundle.manifests import dump_json
from vllm_bundle.util.fsutil import atomic_write, named_bytes_digest, raising_disk_full
from vllm_bundle.util.locks import held


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
    return named_bytes_digest(*((path.name, path.read_bytes()) for path in paths))


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
    *,
    force: bool = False,
) -> StageResult:
    """Build ``out`` with ``build(tmp_dir)`` unless a stamp with the same input hash exists.

    ``build`` may return details (e.g. patch outcomes) that are kept in the stamp and returned
    again when the stage is skipped.
    """
    key = stage_key(name, version, inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    # One writer per stage output (two build directories may share a bundles directory); a second
    # process waits, then finds the first one's stamp.
    with FileLock(out.parent / f".{out.name}.lock"):
        stamp = read_stamp(out)
        if stamp and stamp.get("key") == key and not force:
            return StageResult(name, out, key, True, 0.0, stamp.get("details", {}))
        began = time.monotonic()
        with raising_disk_full(
            f"the disk under {out.parent} filled up while building the {name} stage; nothing of it was kept",
            "free space, or pass --build-dir on a larger disk",
        ):
            details = _build_in_place(out, build)
            record = {"stage": name, "key": key, "inputs": inputs, "details": details}
            atomic_write(_stamp_path(out), dump_json(record, default=str))
    return StageResult(name, out, key, False, time.monotonic() - began, details)


def _build_in_place(out: Path, build: Callable[[Path], Mapping[str, Any] | None]) -> dict[str, Any]:
    """Build into a temporary directory beside ``out`` and rename it into place; the stamp (removed
    first, written by the caller last) says whether ``out`` is complete."""
    _stamp_path(out).unlink(missing_ok=True)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        details = dict(build(tmp) or {})
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        # The stamp is gone already: an earlier output left in place would look usable (an older
        # vLLM's patched tree, say) without being current. It is ours; it goes too.
        shutil.rmtree(out, ignore_errors=True)
        raise
    return details


@contextmanager
def exclusive(directory: Path, say: Callable[[str], None]) -> Iterator[None]:
    """One builder per build directory: a second run waits for the first (and says so), then reuses
    what it completed."""
    directory.mkdir(parents=True, exist_ok=True)
    waiting = f"wait   another vllm-bundle is building {directory}; waiting for it to finish"
    with held(FileLock(directory / ".vllm-bundle.lock"), lambda: say(waiting)):
        yield
