"""Release manifests: SHA256SUMS, release.json, Lemonade's backend_versions.json, and their merge.

All are written with sorted keys and a trailing newline, so the same inputs give the same bytes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_bundle.errors import ManifestError, UsageError
from vllm_bundle.runtime.smallfile import read_small_text
from vllm_bundle.util.fields import Document
from vllm_bundle.util.fsutil import atomic_write, sha256_file

RELEASE_JSON = "release.json"
BACKEND_VERSIONS = "backend_versions.json"
SHA256SUMS = "SHA256SUMS"
#: GitHub refuses release assets of 2 GiB and more; 1.9 GB leaves room.
DEFAULT_PART_SIZE = 1_900_000_000
#: The gzip level of release archives.
DEFAULT_LEVEL = 6
#: The CycloneDX version the release's SBOM (``<stem>.cdx.json``) is written in.
SBOM_SPEC = "1.6"
#: Where GitHub Actions names the repository the assets are published in.
REPO_ENV = "GITHUB_REPOSITORY"
#: A GitHub ``owner/name``: an owner is letters, digits and '-' (at most 39), a name also '.' and '_'.
#: How much of a launcher ``detect_target`` reads: its header is in the first lines.
HEADER_BYTES = 4096
GITHUB_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}")


def is_github_repo(repo: str) -> bool:
    """``owner/name`` in GitHub's characters (it goes into download URLs); ``.`` and ``..`` are no names."""
    return bool(GITHUB_REPO.fullmatch(repo)) and repo.split("/")[1] not in (".", "..")


def dump_json(data: Mapping[str, Any], *, default: Callable[[Any], Any] | None = None) -> bytes:
    """The one form every JSON file of this tool is written in (release.json, backend_versions.json, the
    image's image.json and base lock, tier 0's report, a stage's stamp): keys sorted, two-space indent,
    ASCII only, a trailing newline; the same data gives the same bytes. ``default`` turns what JSON has
    no type for into something it has (a stamp's inputs: ``str``). OCI documents are the exception: their
    digest is of the bytes, which :func:`vllm_bundle.oci.layout.canonical_json` keeps compact."""
    return (json.dumps(data, indent=2, sort_keys=True, default=default) + "\n").encode()


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


#: The most parts an archive may have: their names carry the number and the count in two digits.
MAX_PARTS = 99


def part_name(stem: str, number: int, count: int) -> str:
    """``<tag>-x64.partNN-of-MM.tar.gz``: what installers ask for, NN and MM two digits, 01-based."""
    return f"{stem}.part{number:02d}-of-{count:02d}.tar.gz"


#: A part's name ends so (:func:`part_name`).
PART_SUFFIX = re.compile(r"\.part[0-9]{2}-of-[0-9]{2}\.tar\.gz$")


def is_part(name: str) -> bool:
    return PART_SUFFIX.search(name) is not None


@dataclass(frozen=True)
class ReleaseAssets:
    """The names of a release's assets, all made from its tag: the one place they are spelled (the
    installer contract, DESIGN.md). ``x64``: the architecture installers ask for."""

    tag: str

    @property
    def stem(self) -> str:
        return f"{self.tag}-x64"

    @property
    def partcount(self) -> str:
        """Holds the number of parts, two digits (also for a single part)."""
        return f"{self.stem}.partcount"

    @property
    def sbom(self) -> str:
        """The CycloneDX SBOM."""
        return f"{self.stem}.cdx.json"

    @property
    def toc(self) -> str:
        """The archive's table of contents (release/archive.py): where each file's chunks are in the parts."""
        return f"{self.stem}.toc.json.gz"

    def parts(self, count: int) -> list[str]:
        """The archive's parts, in order: cat them to get the one gzip tarball."""
        return [part_name(self.stem, number, count) for number in range(1, count + 1)]


def sha256sums(directory: Path, names: Sequence[str]) -> bytes:
    return "".join(f"{sha256_file(directory / name)}  {name}\n" for name in sorted(names)).encode()


def write_sha256sums(directory: Path) -> None:
    """``SHA256SUMS`` of every other (non-hidden) file in ``directory``, written atomically."""
    names = [p.name for p in directory.iterdir() if p.is_file() and p.name != SHA256SUMS and p.name[0] != "."]
    atomic_write(directory / SHA256SUMS, sha256sums(directory, names))


def check_repo(repo: str) -> None:
    """The GitHub repository the checksums name must be ``<owner>/<name>``: none, or one that is not, is a bad
    (or missing) ``--repo`` (or ``$GITHUB_REPOSITORY``, which stands in for it): a usage error, exit 2."""
    hint = f"pass --repo owner/name; in GitHub Actions ${REPO_ENV} is used"
    if not repo:
        raise UsageError("no GitHub repository for backend_versions.json checksums", hint)
    if not is_github_repo(repo):
        raise UsageError(f"GitHub repository {repo!r} is not <owner>/<name>", hint)


#: A glibc version as manifests record it: ``2.35``.
GLIBC_VERSION = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")


def backend_versions(
    tag: str, target: str, repo: str, parts: Mapping[str, str], glibc: str | None = None
) -> dict[str, Any]:
    """Lemonade's format: the pin, and ``checksums.github.<repo>.<tag>.<asset> = sha256:<hex>`` per part;
    with ``glibc``, the oldest glibc the tag's bundle runs on (tier 0's measured floor) under ``glibc.<tag>``,
    a key of its own that Lemonade's reader does not look at (it reads ``vllm`` and ``checksums``)."""
    check_repo(repo)
    doc: dict[str, Any] = {
        "vllm": {"rocm": pin_of(tag, target)},
        "checksums": {"github": {repo: {tag: {name: f"sha256:{digest}" for name, digest in sorted(parts.items())}}}},
    }
    return doc | ({"glibc": {tag: glibc}} if glibc else {})


BAD_MANIFEST_HINT = f"use a {BACKEND_VERSIONS} the release stage wrote"


def check_backend_versions(doc: object, where: str) -> dict[str, Any]:
    """``doc`` if it is a backend_versions.json every reader can use: each field of the type it must have
    (``vllm.rocm`` and each override a string, every checksum ``sha256:<hex>``), every repository an
    ``owner/name`` and every tag ``<pin>-<target>``; else one line naming ``where`` and the field."""
    top = Document(where, lambda message: ManifestError(message, BAD_MANIFEST_HINT)).fields(doc)
    vllm = top.table("vllm")
    vllm.text("rocm")
    vllm.table("rocm_arch_overrides", required=False).texts()
    github = top.table("checksums").table("github")
    for repo, tags in github.items():
        if not is_github_repo(repo):
            raise github.problem("", f"names {repo[:80]!r}, not a repository's <owner>/<name>")
        for tag, assets in tags.items():
            if "-" not in tag:
                raise tags.problem("", f"names tag {tag[:80]!r}, not <pin>-<target>")
            for name in assets:
                assets.sha256(name, prefix="sha256:")
    glibc = top.table("glibc", required=False)
    for tag, version in glibc.texts().items():
        if not GLIBC_VERSION.fullmatch(version):
            raise glibc.bad(tag, "a glibc version")
    return top.data


def read_backend_versions(path: Path) -> dict[str, Any]:
    """A backend_versions.json, every field checked (see :func:`check_backend_versions`)."""
    return check_backend_versions(read_json(path), str(path))


def _target_pins(doc: Mapping[str, Any]) -> dict[str, str]:
    """target -> pin of one file; every tag it checksums must be ``<its pin>-<target>``."""
    vllm = doc.get("vllm", {})
    pins = {"": vllm.get("rocm", "")} | dict(vllm.get("rocm_arch_overrides", {}))
    targets = {}
    for tags in doc.get("checksums", {}).get("github", {}).values():
        for tag in tags:
            pin, dash, target = tag.rpartition("-")
            if not dash:
                raise ManifestError(f"tag {tag!r} does not end in -<target>", "merge only release-stage files")
            if pin not in (pins.get(target), pins[""]):
                raise ManifestError(
                    f"a file pins {pins['']!r} but checksums {tag!r}", "merge only files written by the release stage"
                )
            targets[target] = pin
    return targets


#: The one repository Lemonade downloads vLLM from and looks its checksums up under
#: (lemonade-sdk/lemonade@e385039 src/cpp/server/backends/vllm/vllm_server.cpp:299 ``params.repo``; the
#: download URL, backend_utils.cpp:573-574, and the first key shape, ``checksums.github.<repo>.<tag>.<asset>``,
#: backend_utils.cpp:86-97). A checksum under another key is never found, and Lemonade then installs the
#: asset unchecked and says nothing (its download checks only a hash it found, http_client.cpp:1068).
LEMONADE_VLLM_REPO = "lemonade-sdk/vllm-rocm"


def lemonade_notes(merged: Mapping[str, Any]) -> list[str]:
    """What Lemonade must take from a merged backend_versions.json, and a warning for checksums it would
    never find: the release workflow's summary prints these."""
    repos = sorted(merged.get("checksums", {}).get("github", {}))
    notes = [
        f'Lemonade: merge "vllm" and "checksums" into its src/cpp/resources/{BACKEND_VERSIONS}; it checks each '
        f'part under checksums.github["{LEMONADE_VLLM_REPO}"]["<tag>"]["<part>"] and nowhere else'
    ]
    notes += [
        f"warning: these checksums are under {repo}, not {LEMONADE_VLLM_REPO}: Lemonade finds none of them and "
        f"installs without checking, silently; publish from {LEMONADE_VLLM_REPO} (bundle --repo "
        f"{LEMONADE_VLLM_REPO}) for Lemonade to verify it"
        for repo in repos
        if repo != LEMONADE_VLLM_REPO
    ]
    return notes


def merge_backend_versions(documents: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One backend_versions.json for several targets' files: Lemonade's ``vllm.rocm`` pin (the one most
    targets share) and ``vllm.rocm_arch_overrides`` for the targets on another release line (keyed by
    target, the family name Lemonade appends), with every part's checksum and every tag's glibc floor."""
    if not documents:
        raise ManifestError("nothing to merge")
    for number, doc in enumerate(documents, start=1):
        check_backend_versions(doc, f"manifest {number} of {len(documents)}")
    pins: dict[str, str] = {}
    for doc in documents:
        for target, pin in _target_pins(doc).items():
            if pins.setdefault(target, pin) != pin:
                raise ManifestError(f"{target} is pinned to both {pins[target]} and {pin}", "merge one release")
    counts = Counter(pins.values())
    default = min(counts, key=lambda pin: (-counts[pin], pin))
    overrides = {target: pin for target, pin in sorted(pins.items()) if pin != default}
    vllm: dict[str, Any] = {"rocm": default} | ({"rocm_arch_overrides": overrides} if overrides else {})
    merged: dict[str, Any] = {"vllm": vllm, "checksums": {"github": {}}}
    floors: dict[str, str] = {}
    for doc in documents:
        for tag, version in doc.get("glibc", {}).items():
            if floors.setdefault(tag, version) != version:
                raise ManifestError(f"{tag} needs both glibc {floors[tag]} and {version}", "merge one release")
    if floors:
        merged["glibc"] = dict(sorted(floors.items()))
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


def pinned_tag(doc: Mapping[str, Any], target: str, where: str = BACKEND_VERSIONS) -> str:
    """The tag Lemonade installs for ``target``: its override's, else the default pin, plus ``-<target>``.
    The document is checked first (one line naming ``where`` and the bad field)."""
    vllm = check_backend_versions(doc, where)["vllm"]
    return f"{vllm.get('rocm_arch_overrides', {}).get(target, vllm['rocm'])}-{target}"


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ManifestError(f"cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path} is not a JSON object")
    return data


def detect_target(root: Path) -> str | None:
    """The target named in a bundle's launcher header ("Generated by vllm-bundle for vLLM X (<target>)").
    Here, beside the manifests installers read: ``doctor --bundle`` runs with the consumer's dependencies alone."""
    try:  # the header is in the first lines: read no more than their page, and nothing but a file
        head = read_small_text(root / "bin" / "vllm-server", HEADER_BYTES, head=True)
    except OSError:
        return None
    for line in head.splitlines()[:5]:
        if "Generated by vllm-bundle" in line and "(" in line:
            return line.rsplit("(", 1)[1].split(")")[0]
    return None
