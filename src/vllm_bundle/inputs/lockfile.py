"""Lock files: the exact, hashed inputs of one (channel, target).

``recipes/locks/<channel>/<target>.toml`` pins the non-wheel artifacts (the CPython tarball, the vLLM
source release, the triton_kernels source) and records the recipe hash it was made from;
``pylock.<target>.toml`` (PEP 751, written by uv) pins every wheel. The TOML lock records the pylock's
sha256, so neither file can be edited or swapped alone without ``lock --check`` noticing.

What only the vLLM build needs (rocm-sdk-devel, cmake, ...) is the pylock's dependency group ``build``:
those packages carry the marker ``'build' in dependency_groups`` (PEP 751), so a plain install of the
lock, the bundle's, leaves them out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import tomli_w
from packaging.markers import Environment
from packaging.pylock import PackageWheel, Pylock, PylockSelectError, PylockValidationError
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from vllm_bundle.errors import LockError, LockMissingError
from vllm_bundle.recipes import read_toml_and_bytes
from vllm_bundle.util.fetch import Artifact
from vllm_bundle.util.fields import TOML, Document, Fields
from vllm_bundle.util.fsutil import named_bytes_digest

LOCK_VERSION = 4
BUILD_GROUP = "build"
BUILD_MARKER = f"'{BUILD_GROUP}' in dependency_groups"
LOCK_HINT = "re-lock instead of editing lock files by hand"


@dataclass(frozen=True)
class Lock:
    target: str
    channel: str
    recipe_hash: str
    pylock_sha256: str
    source_date_epoch: int
    versions: Mapping[str, str]
    artifacts: tuple[Artifact, ...]  # non-wheel inputs, by role
    roles: Mapping[str, str] = field(default_factory=dict)  # role -> sha256
    #: The two files' names and bytes hashed as read (util/fsutil.py named_bytes_digest): the lock a
    #: release records is the one its build read. Empty for a lock not read from files (just made).
    files_sha256: str = ""

    def artifact(self, role: str) -> Artifact:
        sha = self.roles.get(role)
        for artifact in self.artifacts:
            if artifact.sha256 == sha:
                return artifact
        raise LockError(f"the lock for {self.channel}/{self.target} has no {role} artifact", "re-lock")


#: A lock as read and checked: the lock file's record and its parsed pylock (PEP 751).
Locked = tuple[Lock, dict[str, Any]]


def lock_paths(locks_dir: Path, channel: str, target: str) -> tuple[Path, Path]:
    base = locks_dir / channel
    # PEP 751 requires the name pylock.<name>.toml for a lock file that is not plain pylock.toml.
    return base / f"{target}.toml", base / f"pylock.{target}.toml"


def render_lock(lock: Lock, header: str) -> bytes:
    doc: dict[str, Any] = {
        "lock-version": LOCK_VERSION,
        "target": lock.target,
        "channel": lock.channel,
        "recipe-hash": lock.recipe_hash,
        "pylock-sha256": lock.pylock_sha256,
        "source-date-epoch": lock.source_date_epoch,
        "versions": dict(sorted(lock.versions.items())),
        "artifacts": [
            {
                "role": role,
                "name": a.name,
                "filename": a.filename,
                "url": a.url,
                "size": a.size,
                "sha256": a.sha256,
            }
            for role, sha in sorted(lock.roles.items())
            for a in lock.artifacts
            if a.sha256 == sha
        ],
    }
    doc["content-sha256"] = content_digest(doc)
    return (header + tomli_w.dumps(doc)).encode()


def content_digest(doc: Mapping[str, Any]) -> str:
    """The hash of every field of a lock but this one: an edit by hand (a size, a sha256, an URL) shows."""
    fields = {key: value for key, value in doc.items() if key != "content-sha256"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _load_toml(path: Path, what: str) -> tuple[bytes, dict[str, Any]]:
    return read_toml_and_bytes(
        path,
        missing=lambda: LockMissingError(
            f"no {what} at {path}",
            "make it with `nox -s lock -- <target> --channel <channel>` where upstream is reachable",
        ),
        invalid=lambda err: LockError(f"{path} is not valid TOML ({err})", "re-lock instead of editing by hand"),
    )


def read_lock(locks_dir: Path, channel: str, target: str) -> Locked:
    """Read and cross-check both lock files; returns the lock and the parsed pylock."""
    lock_path, pylock_path = lock_paths(locks_dir, channel, target)
    lock_bytes, doc = _load_toml(lock_path, f"lock for {channel}/{target}")
    if doc.get("lock-version") != LOCK_VERSION:
        raise LockError(
            f"{lock_path} has lock-version {doc.get('lock-version')!r}, expected {LOCK_VERSION}",
            "re-lock with this version of the tool",
        )
    if doc.get("content-sha256") != content_digest(doc):
        raise LockError(
            f"{lock_path} was edited by hand (its content-sha256 does not match its fields)",
            LOCK_HINT,
        )
    pylock_bytes, pylock = _load_toml(pylock_path, f"wheel lock for {channel}/{target}")
    pylock_sha = hashlib.sha256(pylock_bytes).hexdigest()
    if pylock_sha != doc.get("pylock-sha256"):
        raise LockError(
            f"{pylock_path.name} does not match {lock_path.name} (pylock-sha256 differs): "
            "one was edited or replaced alone",
            LOCK_HINT,
        )
    fields = _lock_document(lock_path).fields(doc)
    entries = fields.tables("artifacts")
    artifacts = tuple(
        Artifact(e.text("name"), _file_name(e, "filename"), e.text("url"), e.sha256("sha256"), _size(e))
        for e in entries
    )
    lock = Lock(
        target=fields.text("target"),
        channel=fields.text("channel"),
        recipe_hash=fields.text("recipe-hash"),
        pylock_sha256=pylock_sha,
        source_date_epoch=fields.whole("source-date-epoch", unit="seconds"),
        versions=fields.table("versions").texts(),
        artifacts=artifacts,
        roles={e.text("role"): a.sha256 for e, a in zip(entries, artifacts, strict=True)},
        files_sha256=named_bytes_digest((lock_path.name, lock_bytes), (pylock_path.name, pylock_bytes)),
    )
    check_pylock(pylock, pylock_path)
    try:
        Pylock.from_dict(pylock)
    except PylockValidationError as err:
        raise LockError(f"{pylock_path}: {err}", LOCK_HINT) from None
    return lock, pylock


def _lock_document(path: Path) -> Document:
    """A lock file's fields, each checked by type as it is read (the content hash only shows an edit: a
    lock re-signed after one must still be refused by type), each bad one a one-line LockError."""
    return Document(str(path), lambda message: LockError(message, LOCK_HINT), TOML)


def _size(entry: Fields) -> int | None:
    """A size in bytes; absent means unknown (a lock records one when the index gives it)."""
    return entry.whole("size", None, unit="bytes")


def _file_name(entry: Fields, key: str) -> str:
    name = entry.text(key)
    if name in (".", "..") or any(c in name for c in "/\\"):  # (text() refused "" and NUL)
        raise entry.bad(key, "a file name")
    return name


def check_pylock(pylock: Mapping[str, Any], path: Path) -> None:
    """Every value of a PEP 751 lock that this tool reads, checked by type (one line naming the file and
    field): package names, versions and markers; each wheel's url, name, size and sha256."""
    doc = _lock_document(path).fields(dict(pylock))
    for package in doc.tables("packages", required=False):
        package.text("name")
        package.text("version", None)
        package.text("marker", None)
        for wheel in package.tables("wheels", required=False):
            wheel.text("url")
            wheel.text("name", None)
            _size(wheel)
            wheel.table("hashes", required=False).sha256("sha256", None)


def platform_tags(platform: str) -> list[str]:
    """Linux platform tags a ``<arch>-manylinux_2_<N>`` platform accepts, most specific first."""
    arch, _, libc = platform.partition("-")
    if not libc.startswith("manylinux_2_"):
        raise LockError(f"unsupported platform {platform!r}", "use e.g. 'x86_64-manylinux_2_28'")
    newest = int(libc.removeprefix("manylinux_2_"))
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = []
    for minor in range(newest, 4, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        if minor in legacy:
            tags.append(f"{legacy[minor]}_{arch}")
    return [*tags, f"linux_{arch}"]


def supported_tags(python_minor: str, platform: str) -> list[Tag]:
    version = tuple(int(part) for part in python_minor.split("."))
    interpreter = f"cp{version[0]}{version[1]}"
    platforms = platform_tags(platform)
    return [
        *cpython_tags(version, abis=[interpreter], platforms=platforms),
        *compatible_tags(version, interpreter=interpreter, platforms=platforms),
    ]


def best_wheel(package: Mapping[str, Any], ranking: Mapping[Tag, int]) -> dict[str, Any] | None:
    best: tuple[int, dict[str, Any]] | None = None
    for wheel in package.get("wheels", []):
        filename = wheel.get("name") or wheel["url"].rsplit("/", 1)[-1]
        try:
            tags = parse_wheel_filename(unquote(filename))[3]
        except InvalidWheelFilename:
            continue
        rank = min((ranking[t] for t in tags if t in ranking), default=None)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, wheel)
    return best[1] if best else None


def bundle_environment(python_version: str, platform: str) -> Environment:
    """The PEP 508 environment of the bundle's interpreter (CPython ``python_version``: ``3.11``, or a
    full ``3.11.14``) on its platform (``x86_64-manylinux_2_35``), for a lock's markers and
    requires-python and the SBOM's dependency edges. Every key is set, so the host building the bundle
    never shows through; its kernel is unknown (``""``), and without a patch release the lowest of the
    minor (``.0``) stands in."""
    parts = python_version.split(".")
    full = python_version if len(parts) >= 3 else f"{python_version}.0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": platform.partition("-")[0],
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "python_version": ".".join(parts[:2]),
        "sys_platform": "linux",
    }


def wheel_artifacts(
    pylock: Mapping[str, Any], python_minor: str, platform: str, groups: frozenset[str] = frozenset()
) -> list[Artifact]:
    """The one best wheel of each locked package for the bundle's interpreter and platform: by default
    what the bundle installs; with ``groups`` (e.g. {"build"}) also those groups' packages. The lock is
    validated and selected from by ``packaging.pylock`` (PEP 751: markers, requires-python, tags)."""
    where = f"CPython {python_minor} on {platform}"
    try:
        lock = Pylock.from_dict(pylock)
        chosen = list(
            lock.select(
                environment=bundle_environment(python_minor, platform),
                tags=supported_tags(python_minor, platform),
                dependency_groups=groups,
            )
        )
    except (PylockValidationError, PylockSelectError) as err:
        raise LockError(f"the wheel lock cannot be installed for {where}: {err}", "re-lock") from None
    artifacts = []
    for package, wheel in chosen:
        if not isinstance(wheel, PackageWheel) or wheel.url is None:
            raise LockError(
                f"locked package {package.name} {package.version} has no wheel for {where}",
                "re-lock; if it persists the package only ships an sdist for this platform",
            )
        sha = wheel.hashes.get("sha256")
        if not sha:
            raise LockError(f"locked wheel {wheel.url} has no sha256", "re-lock")
        artifacts.append(Artifact(package.name, wheel.filename, wheel.url, sha, wheel.size))
    return artifacts


def build_only(pylock: Mapping[str, Any], python_minor: str, platform: str) -> list[Artifact]:
    """The wheels only the vLLM build needs (the ``build`` group), not installed into the bundle."""
    everything = wheel_artifacts(pylock, python_minor, platform, frozenset({BUILD_GROUP}))
    bundled = {a.sha256 for a in wheel_artifacts(pylock, python_minor, platform)}
    return [a for a in everything if a.sha256 not in bundled]


def locked_versions(pylock: Mapping[str, Any]) -> dict[str, str]:
    """Every package's version (the build group's too)."""
    return {canonicalize_name(p["name"]): p["version"] for p in pylock.get("packages", [])}


def all_wheels(pylock: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    for package in pylock.get("packages", []):
        yield from package.get("wheels", [])
