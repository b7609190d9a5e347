"""``vllm-bundle install``: a verified, atomic install of a released bundle.

From a release (an URL serving its assets, or a directory holding them) or from a
``backend_versions.json`` plus a target: read ``<tag>-x64.partcount``, download the parts (resumable,
parallel, with progress, through the verified cache), check each against the release's checksums,
extract the concatenated parts safely into a staging directory beside the destination, write
``version.txt`` (the tag, no newline), and swap the staging directory into place. The previous install
stays untouched until the new one is complete; an install of the tag already present does nothing.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import requests
from filelock import FileLock

from vllm_bundle.errors import BundleError, DiskFullError, NetworkError
from vllm_bundle.extract import safe_extract
from vllm_bundle.fetch import Artifact, Fetcher
from vllm_bundle.manifests import BACKEND_VERSIONS, RELEASE_JSON, ManifestError, part_name, pinned_tag, read_json
from vllm_bundle.transport import RetryPolicy, check_url, describe, is_connect_failure, make_session

VERSION_FILE = "version.txt"
MARKER = ".vllm-bundle-install"  # in every install this tool made: the only directories it replaces
STAGING_MARKER = ".vllm-bundle-staging"
GITHUB_DOWNLOAD = "https://github.com/{repo}/releases/download/{tag}/"


class InstallError(BundleError):
    """The release cannot be installed as given."""


@dataclass(frozen=True)
class Release:
    """What to install: the tag, where its assets are (URL prefix or directory), each part's checksum."""

    tag: str
    target: str
    location: str  # "https://.../" (ends with "/") or a directory path
    checksums: dict[str, str]  # part name -> sha256 hex
    sizes: dict[str, int]  # part name -> size, when the manifest gives them
    archive_sha256: str | None = None  # of the parts concatenated, when release.json gives it

    @property
    def stem(self) -> str:
        return f"{self.tag}-x64"

    def is_url(self) -> bool:
        return urlsplit(self.location).scheme in ("http", "https")


def _read_asset(location: str, name: str, policy: RetryPolicy) -> bytes:
    """A small asset (manifest, partcount) from an URL prefix or a directory. A body cut off midway is
    fetched again (urllib3 already retries connect errors and 429/5xx answers)."""
    if urlsplit(location).scheme not in ("http", "https"):
        path = Path(location) / name
        try:
            return path.read_bytes()
        except OSError as err:
            raise InstallError(f"cannot read {path}: {err.strerror}", "is this a release directory?") from None
    url = location + quote(name)
    check_url(url)
    with make_session(policy) as session:
        for attempt in range(1, policy.attempts + 1):
            try:
                answer = session.get(url, timeout=(policy.connect_timeout, policy.read_timeout))
                if answer.status_code != 200:
                    raise InstallError(f"{url} answered HTTP {answer.status_code}", "check the release URL and tag")
                return answer.content
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as err:
                if attempt == policy.attempts or is_connect_failure(err):
                    raise NetworkError(
                        f"cannot download {url}: {describe(err)}", "check the URL and your network"
                    ) from None
                time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


def _as_location(source: str) -> str:
    return source if source.endswith("/") or not urlsplit(source).scheme else source + "/"


def release_from_assets(source: str, policy: RetryPolicy) -> Release:
    """A release URL (``.../releases/download/<tag>/``) or directory: its ``release.json`` says it all."""
    location = _as_location(source)
    try:
        doc = json.loads(_read_asset(location, RELEASE_JSON, policy))
        parts = doc["archive"]["parts"]
        return Release(
            doc["tag"],
            doc["target"],
            location,
            {p["name"]: p["sha256"] for p in parts},
            {p["name"]: int(p["size"]) for p in parts},
            doc["archive"].get("sha256"),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise ManifestError(f"{location}{RELEASE_JSON} is not a release manifest ({err})") from None


def release_from_pins(pins_file: Path, target: str, mirror: str | None) -> Release:
    """Lemonade's way: ``backend_versions.json`` pins ``<tag without target>``; the checksums name the repo."""
    doc = read_json(pins_file)
    try:
        tag = pinned_tag(doc, target)
        repos: dict[str, dict[str, dict[str, str]]] = doc["checksums"]["github"]
    except (KeyError, TypeError):
        raise ManifestError(f"{pins_file} is not a {BACKEND_VERSIONS} (no vllm.rocm pin or checksums)") from None
    found = [(repo, tags[tag]) for repo, tags in repos.items() if tag in tags]
    if not found:
        raise InstallError(f"{pins_file} has no checksums for {tag}", f"is {target} part of this release?")
    repo, assets = found[0]
    checksums = {name: digest.removeprefix("sha256:") for name, digest in assets.items()}
    location = _as_location(mirror) if mirror else GITHUB_DOWNLOAD.format(repo=repo, tag=tag)
    return Release(tag, target, location, checksums, {})


def part_artifacts(release: Release, policy: RetryPolicy) -> list[Artifact]:
    """Reads ``partcount`` and names every part; each must have a checksum in the manifest."""
    text = _read_asset(release.location, f"{release.stem}.partcount", policy).decode(errors="replace").strip()
    if not text.isdigit() or not 1 <= int(text) <= 99:
        raise ManifestError(f"{release.stem}.partcount holds {text[:20]!r}, not a part count")
    count = int(text)
    names = [part_name(release.stem, number, count) for number in range(1, count + 1)]
    unknown = [name for name in names if name not in release.checksums]
    if unknown or len(release.checksums) != count:
        raise ManifestError(
            f"partcount says {count} parts, the manifest checksums {len(release.checksums)} "
            f"({', '.join(sorted(release.checksums))})",
            "the release is incomplete or mixed up; re-publish it",
        )
    return [
        Artifact(name, name, _asset_url(release, name), release.checksums[name], release.sizes.get(name))
        for name in names
    ]


def _asset_url(release: Release, name: str) -> str:
    """An URL for a part; for a release directory, the fetcher reads ``location`` as its mirror."""
    return release.location + quote(name) if release.is_url() else (Path(release.location).absolute() / name).as_uri()


class _Concatenated(io.RawIOBase):
    """The parts, read one after the other as one stream (what ``cat part*`` gives a shell), hashed as
    they are read."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._paths = list(paths)
        self._handle: io.BufferedReader | None = None
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            if self._handle is None:
                if not self._paths:
                    return 0
                self._handle = self._paths.pop(0).open("rb")
            count = self._handle.readinto(buffer)
            if count:
                self.digest.update(memoryview(buffer)[:count])
                return count
            self._handle.close()
            self._handle = None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
        super().close()


def extract_parts(parts: Sequence[Path], dest: Path, tag: str, archive_sha256: str | None = None) -> None:
    """Extract the archive the parts make up into ``dest`` (see :mod:`vllm_bundle.extract`), and check
    the whole archive's sha256 against release.json's when it gives one."""
    raw = _Concatenated(parts)
    stream = io.BufferedReader(raw, buffer_size=1 << 20)
    with stream:
        try:
            with tarfile.open(fileobj=stream, mode="r|gz") as archive:
                safe_extract(archive, dest, f"the {tag} release")
        except tarfile.TarError as err:
            raise InstallError(f"cannot extract the {tag} release: {err}", "its parts are damaged") from None
        while stream.read(1 << 20):  # what the tar reader left unread (end blocks, gzip trailer)
            pass
    if archive_sha256 is not None and raw.digest.hexdigest() != archive_sha256:
        raise InstallError(
            f"the {tag} release's parts put together do not match release.json's archive sha256",
            "the release is mixed up: install again, or re-publish it",
        )


def _rename_exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step with renameat2(RENAME_EXCHANGE) (Linux >= 3.15, glibc >= 2.28).
    Hand-written because neither os nor a maintained library exposes it; False when unsupported."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange)
    return bool(result == 0)


def swap_into_place(staging: Path, dest: Path) -> None:
    """``staging`` becomes ``dest``; an existing ``dest`` (an install of ours, checked by the caller) is
    removed only once the new one is in place."""
    if not dest.exists():
        staging.rename(dest)
        return
    if _rename_exchange(staging, dest):
        shutil.rmtree(staging)  # now the previous install
        return
    previous = Path(tempfile.mkdtemp(prefix=f".{dest.name}.previous-", dir=dest.parent))
    dest.rename(previous)  # onto the empty directory just made: a name nobody else uses
    try:
        staging.rename(dest)
    except OSError:
        previous.rename(dest)
        raise
    shutil.rmtree(previous)


def installed_tag(dest: Path) -> str | None:
    try:
        return (dest / VERSION_FILE).read_text()
    except OSError:
        return None


def _ours(directory: Path) -> bool:
    """An install made by this tool: it holds our marker (or, from before the marker, the version file
    and launcher every bundle install has)."""
    if (directory / MARKER).is_file():
        return True
    return (directory / VERSION_FILE).is_file() and (directory / "bin" / "vllm-server").is_file()


def check_destination(dest: Path) -> None:
    """Install only ever replaces a directory it made, or fills a new or empty one; anything else is
    refused with nothing touched."""
    hint = "pick a new or empty --dest, or the directory of an earlier install; nothing was changed"
    if dest.is_symlink():
        raise InstallError(f"--dest {dest} is a symlink", "pass the directory it points to as --dest")
    if not dest.exists():
        return
    if not dest.is_dir():
        raise InstallError(f"--dest {dest} exists and is not a directory", hint)
    if any(dest.iterdir()) and not _ours(dest):
        raise InstallError(f"--dest {dest} is not an install made by vllm-bundle (it holds other files)", hint)


@contextmanager
def _staging(dest: Path) -> Iterator[Path]:
    """A new staging directory beside ``dest`` (the same file system, for the final rename); ones left
    by killed earlier attempts (they carry our marker) are removed first."""
    for stale in dest.parent.glob(f".{dest.name}.staging-*"):
        if (stale / STAGING_MARKER).is_file():
            shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.staging-", dir=dest.parent))
    (staging / STAGING_MARKER).touch()
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def install_release(
    release: Release,
    dest: Path,
    fetcher: Fetcher,
    policy: RetryPolicy,
    say: Callable[[str], None] = print,
) -> bool:
    """Install ``release`` at ``dest``; False when that tag was already installed there."""
    dest = dest.absolute()
    check_destination(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(dest.with_name(f".{dest.name}.vllm-bundle.lock"))):
            check_destination(dest)  # again, now that no other installer can change it
            installed = _install_locked(release, dest, fetcher, policy, say)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"the disk under {dest.parent} is full", "free space and retry") from None
        where = err.filename or dest.parent
        raise InstallError(f"cannot install into {dest}: {where}: {err.strerror}", "pick another --dest") from None
    if installed:
        say(f"installed {release.tag}: {dest / 'bin' / 'vllm-server'}")
    return installed


def _install_locked(
    release: Release, dest: Path, fetcher: Fetcher, policy: RetryPolicy, say: Callable[[str], None]
) -> bool:
    if installed_tag(dest) == release.tag and _ours(dest):
        say(f"{release.tag} is already installed in {dest}; nothing to do")
        return False
    artifacts = part_artifacts(release, policy)
    say(f"installing {release.tag} ({len(artifacts)} parts) into {dest}")
    fetched = fetcher.fetch_all(artifacts)
    with _staging(dest) as staging:
        extract_parts([fetched[a.sha256] for a in artifacts], staging, release.tag, release.archive_sha256)
        (staging / STAGING_MARKER).unlink()
        launcher = staging / "bin" / "vllm-server"
        if not launcher.is_file() or not os.access(launcher, os.X_OK):
            raise InstallError(f"{release.tag} has no executable bin/vllm-server", "this is not a bundle release")
        (staging / VERSION_FILE).write_text(release.tag)
        (staging / MARKER).write_text(release.tag)
        swap_into_place(staging, dest)
    return True
