"""Release manifests: SHA256SUMS, release.json, Lemonade's backend_versions.json, and their merge.

All are written with sorted keys and a trailing newline, so the same inputs give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_bundle.errors import BundleError

RELEASE_JSON = "release.json"
BACKEND_VERSIONS = "backend_versions.json"
SHA256SUMS = "SHA256SUMS"
#: GitHub refuses release assets of 2 GiB and more; 1.9 GB leaves room.
DEFAULT_PART_SIZE = 1_900_000_000
#: The gzip level of release archives.
DEFAULT_LEVEL = 6
#: Where GitHub Actions names the repository the assets are published in.
REPO_ENV = "GITHUB_REPOSITORY"


class ManifestError(BundleError):
    """A manifest is malformed or manifests disagree."""


def dump_json(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def public_version(version: str) -> str:
    try:
        return Version(version).public
    except InvalidVersion:
        raise ManifestError(f"{version!r} is not a PEP 440 version") from None


def release_tag(vllm: str, rocm: str, target: str) -> str:
    """``vllm<vllm>-rocm<rocm>-<target>``: public versions only (installers do not URL-encode '+')."""
    tag = f"vllm{public_version(vllm)}-rocm{public_version(rocm)}-{target}"
    if any(c in tag for c in "+ /"):
        raise ManifestError(f"release tag {tag!r} has a character installers cannot use")
    return tag


def pin_of(tag: str, target: str) -> str:
    """The ``vllm.rocm`` pin in backend_versions.json: the tag without ``-<target>``."""
    return tag.removesuffix(f"-{target}")


def part_name(stem: str, number: int, count: int) -> str:
    """``<tag>-x64.partNN-of-MM.tar.gz``: what installers ask for, NN and MM two digits, 01-based."""
    return f"{stem}.part{number:02d}-of-{count:02d}.tar.gz"


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def sha256sums(directory: Path, names: Sequence[str]) -> bytes:
    return "".join(f"{sha256_file(directory / name)}  {name}\n" for name in sorted(names)).encode()


def write_sha256sums(directory: Path) -> None:
    """``SHA256SUMS`` of every other (non-hidden) file in ``directory``, written atomically."""
    names = [p.name for p in directory.iterdir() if p.is_file() and p.name != SHA256SUMS and p.name[0] != "."]
    tmp = directory / f".{SHA256SUMS}.tmp"
    tmp.write_bytes(sha256sums(directory, names))
    tmp.replace(directory / SHA256SUMS)


def check_repo(repo: str) -> None:
    """The GitHub repository the checksums name must be ``<owner>/<name>``."""
    hint = f"pass --repo owner/name (in GitHub Actions ${REPO_ENV} is used)"
    if not repo:
        raise ManifestError("no GitHub repository for backend_versions.json checksums", hint)
    if repo.count("/") != 1 or not all(repo.split("/")) or any(c.isspace() for c in repo):
        raise ManifestError(f"GitHub repository {repo!r} is not <owner>/<name>", hint)


def backend_versions(tag: str, target: str, repo: str, parts: Mapping[str, str]) -> dict[str, Any]:
    """Lemonade's format: the pin, and ``checksums.github.<repo>.<tag>.<asset> = sha256:<hex>`` per part."""
    check_repo(repo)
    return {
        "vllm": {"rocm": pin_of(tag, target)},
        "checksums": {"github": {repo: {tag: {name: f"sha256:{digest}" for name, digest in sorted(parts.items())}}}},
    }


def merge_backend_versions(documents: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One backend_versions.json for a release made of several targets' files."""
    if not documents:
        raise ManifestError("nothing to merge")
    pins = {json.dumps(doc.get("vllm"), sort_keys=True) for doc in documents}
    if len(pins) != 1:
        raise ManifestError(
            f"the files pin different vLLM builds: {sorted(pins)}", "merge only the targets of one release"
        )
    merged: dict[str, Any] = {"vllm": documents[0]["vllm"], "checksums": {"github": {}}}
    for doc in documents:
        for repo, tags in doc.get("checksums", {}).get("github", {}).items():
            for tag, assets in tags.items():
                existing = merged["checksums"]["github"].setdefault(repo, {}).setdefault(tag, {})
                for name, digest in assets.items():
                    if existing.get(name, digest) != digest:
                        raise ManifestError(
                            f"{repo} {tag} {name} has two different checksums", "the files come from different builds"
                        )
                    existing[name] = digest
    return merged


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ManifestError(f"cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path} is not a JSON object")
    return data
