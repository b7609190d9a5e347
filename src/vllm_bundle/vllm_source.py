"""The vLLM source stage: the pristine source release, extracted safely, with the patch series."""

from __future__ import annotations

import tarfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.version import Version

from vllm_bundle.errors import BundleError
from vllm_bundle.patches import Outcome, apply_series, read_series
from vllm_bundle.stage import StageResult, file_digest, run_stage

STAGE_VERSION = 1


def _strip_top(top: str) -> Any:
    """A tarfile filter: the "data" filter's safety checks, then drop the ``vllm-<ver>/`` prefix."""

    def strip(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        member = tarfile.data_filter(member, dest)
        parts = PurePosixPath(member.name).parts
        if parts[0] != top:
            raise tarfile.FilterError(f"entry {member.name!r} is outside {top}/")
        if len(parts) == 1:
            return None
        return member.replace(name=str(PurePosixPath(*parts[1:])), deep=False)

    return strip


def extract_sdist(sdist: Path, dest: Path, version: str) -> None:
    """Extract ``vllm-<version>.tar.gz`` into ``dest`` (its top directory removed), refusing unsafe entries."""
    top = f"vllm-{version}"
    try:
        with tarfile.open(sdist, "r:gz") as archive:
            archive.extractall(dest, filter=_strip_top(top))  # noqa: S202 - data filter + prefix check
    except (tarfile.TarError, OSError) as err:
        raise BundleError(f"cannot extract {sdist.name}: {err}", "delete it from the cache and fetch again") from None


def prepare_source(
    sdist: Path, sdist_sha256: str, version: str, patches_dir: Path, out: Path, force: bool = False
) -> StageResult:
    """Stage ``vllm-src``: extract the source release into ``out`` and apply the patch series."""
    series = read_series(patches_dir)
    patch_files = [p.path for group in series for p in group]
    inputs = {"sdist": sdist_sha256, "version": version, "patches": file_digest(patches_dir / "series", *patch_files)}

    def build(tmp: Path) -> Mapping[str, Any]:
        extract_sdist(sdist, tmp, version)
        outcomes = apply_series(tmp, series, Version(version))
        return {"patches": [o.__dict__ for o in outcomes]}

    return run_stage(out, "vllm-src", STAGE_VERSION, inputs, build, force=force)


def outcomes_of(result: StageResult) -> list[Outcome]:
    return [Outcome(**entry) for entry in result.details.get("patches", [])]
