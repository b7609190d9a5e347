"""The vLLM source stage: the pristine source release, extracted safely, with the patch series."""

from __future__ import annotations

import tarfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from vllm_bundle.errors import UnsafeArchiveError
from vllm_bundle.tree.patches import Outcome, apply_series, read_series, verify_outcomes
from vllm_bundle.tree.stage import StageResult, file_digest, run_stage
from vllm_bundle.util.extract import safe_extract
from vllm_bundle.util.fetch import require_sha256

STAGE_VERSION = 3


def extract_sdist(sdist: Path, dest: Path, version: str, filename: str | None = None) -> None:
    """Extract ``vllm-<version>.tar.gz`` into ``dest`` (its top directory removed), refusing unsafe entries."""
    name = filename or f"vllm-{version}.tar.gz"
    try:
        with tarfile.open(sdist, "r:gz") as archive:
            safe_extract(archive, dest, name, top=f"vllm-{version}")
    except tarfile.TarError as err:
        raise UnsafeArchiveError(f"cannot read {name}: {err}", "fetch it again") from None


def prepare_source(
    sdist: Path,
    sdist_sha256: str,
    version: str,
    patches_dir: Path,
    required_isas: frozenset[str],
    *,
    out: Path,
    force: bool = False,
) -> StageResult:
    """Stage ``vllm-src``: extract the source release into ``out`` and apply the patch series.
    ``required_isas``: every ISA of every target (the architecture list must hold them all).

    A cached tree is looked at, not trusted: when its files no longer match the outcomes recorded
    when it was patched (edited or reverted by hand), the stage is done again."""
    series = read_series(patches_dir)
    patch_files = [p.path for group in series for p in group]
    inputs = {
        "sdist": sdist_sha256,
        "version": version,
        "patches": file_digest(patches_dir / "series", *patch_files),
        "isas": sorted(required_isas),
    }

    def build(tmp: Path) -> Mapping[str, Any]:
        require_sha256(sdist, sdist_sha256, f"vllm-{version}.tar.gz")
        extract_sdist(sdist, tmp, version)
        outcomes = apply_series(tmp, series, Version(version), required_isas)
        return {"patches": [o.__dict__ for o in outcomes]}

    result = run_stage(out, "vllm-src", STAGE_VERSION, inputs, build, force=force)
    if result.cached:
        changed = verify_outcomes(result.path, series, outcomes_of(result), required_isas)
        if changed:
            result = run_stage(out, "vllm-src", STAGE_VERSION, inputs, build, force=True)
            result = replace(result, details={**result.details, "redone": changed})
    return result


def outcomes_of(result: StageResult) -> list[Outcome]:
    return [Outcome(**entry) for entry in result.details.get("patches", [])]
