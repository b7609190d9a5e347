"""The ``release`` stage: the bundle root as release assets in ``bundles/<tag>/``.

<tag>-x64.partNN-of-MM.tar.gz   the archive, in parts (cat them in order: one gzip tarball, in members)
<tag>-x64.partcount             MM (also for a single part)
<tag>-x64.toc.json.gz           the archive's table of contents: each file's chunks, where they are
<tag>-x64.cdx.json              CycloneDX 1.6 SBOM
release.json                    tag, target, channel, versions, how vLLM was built (and where), lock hash,
                                source date, archive, parts, qualification (tier 0 here; GPU tiers merged
                                later), the floor (the oldest glibc the bundle runs on, as tier 0 measured)
backend_versions.json           Lemonade's pin + checksums of every part, and the tag's glibc floor
SHA256SUMS                      of every other file here
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_bundle.errors import InvalidValueError
from vllm_bundle.inputs.lockfile import Lock
from vllm_bundle.manifests import (
    BACKEND_VERSIONS,
    DEFAULT_LEVEL,
    DEFAULT_PART_SIZE,
    RELEASE_JSON,
    REPO_ENV,
    SBOM_SPEC,
    ReleaseAssets,
    backend_versions,
    check_repo,
    dump_json,
    release_tag,
    write_sha256sums,
)
from vllm_bundle.paths import checkout_git
from vllm_bundle.release.archive import archiver, write_archive
from vllm_bundle.tree.layout import Layout
from vllm_bundle.tree.stage import StageResult, run_stage

#: 9: the TOC names its format (vllm_bundle.toc); 8: one mtime for every entry, archive.tar_sha256; 7: the
#: floor; 6: the archive in chunked gzip members, with its TOC; 5: CycloneDX 1.6
STAGE_VERSION = 9
GITHUB_REMOTE = re.compile(r"github\.com[:/](?P<owner>[\w.-]+)/(?P<name>[\w.-]+?)(?:\.git)?/?$")
SOURCE_DATE_ENV = "SOURCE_DATE_EPOCH"
#: 9999-12-31T23:59:59Z: the latest second the outputs carry (the SBOM's and the image's timestamps are
#: datetimes, which end with year 9999; the archive's PAX headers hold any whole number).
LATEST_SOURCE_DATE = 253402300799
ASCII_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class ReleaseOptions:
    """How the release stage writes the assets. ``repo`` is checked when the options are made (the
    command line makes them before any lock or stage), so no build finds a bad one at its end."""

    repo: str
    part_size: int = DEFAULT_PART_SIZE
    level: int = DEFAULT_LEVEL
    source_date: int | None = None  # else $SOURCE_DATE_EPOCH, else the lock's

    def __post_init__(self) -> None:
        check_repo(self.repo)


def archive_assets(root: Path, where: Path, assets: ReleaseAssets, *, part_size: int, level: int) -> dict[str, Any]:
    """``root``'s archive in ``where`` as a release has it: its parts, ``partcount`` (``MM``, no newline,
    also for a single part) and table of contents. Returns release.json's ``archive`` object."""
    archive = write_archive(root, where, assets.stem, part_size=part_size, level=level)
    (where / assets.partcount).write_text(f"{len(archive.parts):02d}")
    (where / assets.toc).write_bytes(archive.toc)
    return {
        "size": archive.size,
        "sha256": archive.sha256,
        "tar_sha256": archive.tar_sha256,
        "format": "tar+gzip",
        "level": level,
        "archiver": archiver(),
        "parts": [{"name": part.path.name, "size": part.size, "sha256": part.sha256} for part in archive.parts],
        "toc": toc_field(assets, archive.toc),
    }


def toc_field(assets: ReleaseAssets, toc: bytes) -> dict[str, Any]:
    """release.json's ``archive.toc`` for the table ``toc``: the installer checks the table against it."""
    return {"name": assets.toc, "size": len(toc), "sha256": hashlib.sha256(toc).hexdigest()}


def source_date_from_env() -> int | None:
    """``$SOURCE_DATE_EPOCH`` (None when unset or empty), checked where it is read: a whole number of
    seconds (ASCII digits only) that every output can carry, from 0 to :data:`LATEST_SOURCE_DATE`. Larger
    passed until the SBOM's timestamp, after the whole build, as an OverflowError."""
    env = os.environ.get(SOURCE_DATE_ENV)
    if not env:
        return None
    if not ASCII_DIGITS.fullmatch(env) or int(env) > LATEST_SOURCE_DATE:
        shown = env if len(env) <= 40 else env[:40] + "..."
        raise InvalidValueError(
            f"{SOURCE_DATE_ENV}={shown!r} is not a whole number of seconds from 0 to {LATEST_SOURCE_DATE} "
            "(9999-12-31 23:59:59 UTC)",
            f"unset it (the lock's date is used), or set it to one, e.g. {SOURCE_DATE_ENV}=$(git log -1 --format=%ct)",
        )
    return int(env)


def source_date(lock: Lock, override: int | None) -> int:
    if override is not None:
        return override
    env = source_date_from_env()
    return env if env is not None else lock.source_date_epoch


def default_repo(configured: str | None) -> str:
    """``--repo``, else ``$GITHUB_REPOSITORY``, else the GitHub ``origin`` of the checkout this tool runs
    from; "" when none is known (the bundle refuses that before the lock check and any stage)."""
    return configured or os.environ.get(REPO_ENV, "") or _origin_repo()


def _origin_repo() -> str:
    match = GITHUB_REMOTE.search(checkout_git("config", "--get", "remote.origin.url"))
    return f"{match['owner']}/{match['name']}" if match else ""


def sbom_writer() -> dict[str, str]:
    """What writes the SBOM's bytes: part of the release stage's key, so a new cyclonedx-python-lib or
    spec redoes the stage. Read from its metadata: importing cyclonedx (its SPDX licence tables) takes
    0.15 s, which every build verb paid at start; release/sbom.py is imported only to write an SBOM."""
    return {"cyclonedx-python-lib": importlib.metadata.version("cyclonedx-python-lib"), "spec": SBOM_SPEC}


def release_stage(
    *,
    lock: Lock,
    target: str,
    minor: str,
    root: StageResult,
    vllm_version: str,
    wheel_hashes: Mapping[str, str],
    options: ReleaseOptions,
    tier0: Mapping[str, bool],
    vllm_build: Mapping[str, Any] | None = None,
    floor: Mapping[str, Any] | None = None,
    out: Path,
    force: bool = False,
) -> StageResult:
    """The release's assets in ``out``, a folder named for the tag. ``vllm_version`` is the built wheel's,
    with its local part; the tag keeps the public part.
    ``tier0`` maps each tier 0 check to whether it passed (recorded in release.json; GPU tiers add
    theirs later, see :mod:`vllm_bundle.qualify.gpu`); ``vllm_build`` says how vLLM was built (its
    device and builder; for ROCm, the ISAs each extension carries code for); ``floor`` is the oldest system
    the tree runs on as tier 0 measured it (the platform claimed beside it), recorded in release.json and
    backend_versions.json, where installers check it."""
    tag = release_tag(vllm_version, lock.versions["rocm"], target)
    assert out.name == tag, f"the release of {tag} goes in a folder of its name, not {out}"
    assets = ReleaseAssets(tag)
    date = source_date(lock, options.source_date)
    lock_hash = lock.files_sha256  # the bytes the build read, not the files as they are now
    assert lock_hash, "a release is made from a lock read from its files"
    versions = {**lock.versions, "vllm": vllm_version}
    inputs = {
        "root": root.key,
        "date": date,
        "part_size": options.part_size,
        "level": options.level,
        "repo": options.repo,
        "versions": versions,
        "lock": lock_hash,
        "tier0": dict(tier0),
        "archiver": archiver(),
        "sbom": sbom_writer(),
        "vllm_build": dict(vllm_build or {}),
        "floor": dict(floor or {}),
    }
    glibc = (floor or {}).get("glibc")

    def build(tmp: Path) -> Mapping[str, Any]:
        archive = archive_assets(root.path, tmp, assets, part_size=options.part_size, level=options.level)
        artifact_hashes = {
            role: lock.roles[role] for role in ("python", "vllm-sdist", "rocm-sdist") if role in lock.roles
        }
        from vllm_bundle.release.sbom import build_sbom  # imported here: see sbom_writer

        (tmp / assets.sbom).write_bytes(
            build_sbom(tag, Layout(root.path, minor).site, versions, wheel_hashes, artifact_hashes, date=date)
        )
        release = {
            "tag": tag,
            "target": target,
            "channel": lock.channel,
            "versions": versions,
            "vllm_build": dict(vllm_build or {}),
            "lock_sha256": lock_hash,
            "source_date_epoch": date,
            "archive": archive,
            "qualification": {"tier0": {"passed": all(tier0.values()), "checks": dict(tier0)}},
        } | ({"floor": dict(floor)} if floor else {})
        (tmp / RELEASE_JSON).write_bytes(dump_json(release))
        checksums = {part["name"]: part["sha256"] for part in archive["parts"]}
        pins = backend_versions(tag, target, options.repo, checksums, glibc)
        (tmp / BACKEND_VERSIONS).write_bytes(dump_json(pins))
        write_sha256sums(tmp)
        for asset in tmp.iterdir():  # the same modes whatever the umask
            asset.chmod(0o644)
        tmp.chmod(0o755)
        return {"tag": tag, "parts": len(archive["parts"]), "size": archive["size"]}

    return run_stage(out, "release", STAGE_VERSION, inputs, build, force=force)
