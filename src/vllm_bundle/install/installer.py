"""``vllm-bundle install``: a verified, atomic install of a released bundle.

From a release (an URL serving its assets, or a directory holding them) or from a
``backend_versions.json`` plus a target: read ``<tag>-x64.partcount``, download the parts (resumable,
parallel, with progress, through the verified cache), check each against the release's checksums,
extract the concatenated parts safely (with progress) into a staging directory beside the destination, write
``version.txt`` (the tag, no newline) and ``.vllm-bundle-glibc`` (the bundle's glibc floor, where the release
states it: ``doctor --bundle`` reads it), and swap the staging directory into place. The previous install
stays untouched until the new one is complete; an install of the tag already present does nothing. Over
a previous install that keeps its table of contents, only what changed is fetched (:mod:`.delta`), where
that can be done safely; else, and with ``--no-delta``, the whole release.

Every value read from a manifest is checked before use (a tag is a plain name, a target one of the
target table's, a checksum a sha256): a manifest never chooses a path. Every directory a run makes beside
the destination carries a marker of ours from its creation to its removal (the markers go last), so
what a killed run leaves is recognised and removed by the next one, under the destination's lock; a
swap killed half way is rolled back first.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import requests
from filelock import FileLock

from vllm_bundle.errors import ArchiveError, BundleError, InstallError, ManifestError, NetworkError
from vllm_bundle.install.delta import (
    KEPT_TOC,
    ChunkStore,
    Delta,
    DeltaUnavailable,
    Moved,
    Part,
    install_delta,
    parse_toc,
)
from vllm_bundle.install.doctor import GLIBC_FILE
from vllm_bundle.manifests import (
    GLIBC_VERSION,
    MAX_PARTS,
    RELEASE_JSON,
    ReleaseAssets,
    pinned_tag,
    read_backend_versions,
)
from vllm_bundle.paths import default_recipes
from vllm_bundle.recipes import load_targets
from vllm_bundle.runtime.smallfile import NotSmallFile, read_small_bytes
from vllm_bundle.util.fetch import Artifact, Fetcher
from vllm_bundle.util.fields import Document, Fields
from vllm_bundle.util.fsutil import raising_disk_full
from vllm_bundle.util.locks import held
from vllm_bundle.util.parts import extract_parts
from vllm_bundle.util.policy import RetryPolicy
from vllm_bundle.util.progress import human_size, reported_step
from vllm_bundle.util.tarstream import stream_sha256
from vllm_bundle.util.transport import check_url, describe, is_connect_failure, make_session, retrying

VERSION_FILE = "version.txt"
MARKER = ".vllm-bundle-install"  # in every install this tool made: the only directories it replaces
STAGING_MARKER = ".vllm-bundle-staging"  # in a staging directory until the install marker is written
#: The sha256 of the tar stream an install's tree was checked to be (release.json ``archive.tar_sha256``):
#: a release that gives the same is the same tree (:func:`_same_tree`).
STREAM_FILE = ".vllm-bundle-tar-sha256"
#: What the installer writes beside a release's files: never part of its tree.
INSTALLERS_OWN = (VERSION_FILE, MARKER, STAGING_MARKER, KEPT_TOC, GLIBC_FILE, STREAM_FILE)
GITHUB_DOWNLOAD = "https://github.com/{repo}/releases/download/{tag}/"
#: A tag names files (its parts, ``version.txt``) and URL path segments: one plain name, never a path.
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
#: What a run makes beside ``<dest>``: ``.<dest>.staging-XXXXXXXX`` and ``.<dest>.previous-XXXXXXXX`` (hex
#: here; earlier versions' ``tempfile.mkdtemp`` names are lowercase letters, digits and ``_``).
SCRATCH_SUFFIX = "-[a-z0-9_]{8}"
#: Seconds to wait for the destination's lock before saying that another install holds it.
LOCK_NOTICE_AFTER = 1.0
BAD_RELEASE_HINT = "the release is damaged or was tampered with: do not install it"


@dataclass(frozen=True)
class Release:
    """What to install: the tag, where its assets are (URL prefix or directory), each part's checksum."""

    tag: str
    target: str
    location: str  # "https://.../" (ends with "/") or a directory path
    checksums: dict[str, str]  # part name -> sha256 hex
    sizes: dict[str, int]  # part name -> size, when the manifest gives them
    archive_sha256: str | None = None  # of the parts concatenated, when release.json gives it
    toc: Artifact | None = None  # the archive's table of contents, when release.json names it
    glibc: str | None = None  # the oldest glibc the bundle runs on (its measured floor), when the manifest says
    tar_sha256: str | None = None  # of the tar stream the parts inflate to, when release.json gives it

    @property
    def assets(self) -> ReleaseAssets:
        return ReleaseAssets(self.tag)

    def is_url(self) -> bool:
        return urlsplit(self.location).scheme in ("http", "https")


#: How a small asset's download fails when the connection broke off (or stalled) midway.
CUT_OFF = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


def _body_cut(err: Exception) -> bool:
    """Worth fetching again: a body cut off midway (urllib3 has retried a host that cannot be reached)."""
    return isinstance(err, CUT_OFF) and not is_connect_failure(err)


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
        try:
            answer = retrying(policy, lambda: session.get(url), _body_cut)
        except CUT_OFF as err:
            raise NetworkError(f"cannot download {url}: {describe(err)}", "check the URL and your network") from None
    if answer.status_code != 200:
        raise InstallError(f"{url} answered HTTP {answer.status_code}", "check the release URL and tag")
    return answer.content


def _as_location(source: str) -> str:
    return source if source.endswith("/") or not urlsplit(source).scheme else source + "/"


#: What a tag, which names a directory and an URL's path, may be.
PLAIN_NAME_RULE = "a plain name (letters, digits, '.', '_', '+', '-'; no '/' or '..')"


def is_plain_name(value: str) -> bool:
    """One plain name: no ``/``, no ``..``, no NUL (a tag names a directory and an URL's path)."""
    return bool(PLAIN_NAME.fullmatch(value)) and ".." not in value


def release_from_assets(source: str, policy: RetryPolicy, targets: Collection[str] | None = None) -> Release:
    """A release URL (``.../releases/download/<tag>/``) or directory: its ``release.json`` says it all.
    ``targets``: the target names its ``target`` may have (default: the packaged target table's), for a
    release's target picks the default install directory."""
    location = _as_location(source)
    where = location + RELEASE_JSON if urlsplit(location).scheme else str(Path(location) / RELEASE_JSON)
    try:
        loaded = json.loads(_read_asset(location, RELEASE_JSON, policy))
    except ValueError as err:
        raise ManifestError(f"{where} is not a release manifest ({err})", BAD_RELEASE_HINT) from None
    doc = Document(where, lambda message: ManifestError(message, BAD_RELEASE_HINT)).fields(loaded)
    tag = doc.text("tag")
    if not is_plain_name(tag):
        raise doc.bad("tag", PLAIN_NAME_RULE)
    known = load_targets(default_recipes()) if targets is None else targets
    target = doc.text("target")
    if target not in known:
        raise doc.bad("target", f"a target of this tool ({', '.join(known)})")
    archive = doc.table("archive")
    checksums, sizes = {}, {}
    for part in archive.tables("parts"):
        name = part.text("name")
        checksums[name] = part.sha256("sha256")
        sizes[name] = part.whole("size", unit="bytes")
    archive_sha256, tar_sha256 = archive.sha256("sha256", None), archive.sha256("tar_sha256", None)
    release = Release(tag, target, location, checksums, sizes, archive_sha256, tar_sha256=tar_sha256)
    toc = _toc_asset(release, archive.table("toc")) if archive.data.get("toc") is not None else None
    floor = doc.table("floor", required=False)
    glibc = floor.text("glibc", None)
    if glibc is not None and not GLIBC_VERSION.fullmatch(glibc):
        raise floor.bad("glibc", "a glibc version")
    return dataclasses.replace(release, toc=toc, glibc=glibc)


def _toc_asset(release: Release, field: Fields) -> Artifact:
    """release.json's ``archive.toc``: the asset named for the tag (a manifest never chooses a path)."""
    name = field.text("name")
    if name != release.assets.toc:
        raise field.bad("name", release.assets.toc)
    size = field.whole("size", unit="bytes")
    return Artifact(name, name, _asset_url(release, name), field.sha256("sha256"), size)


def release_from_pins(pins_file: Path, target: str, mirror: str | None) -> Release:
    """Lemonade's way: ``backend_versions.json`` pins ``<tag without target>``; the checksums name the repo.
    Every field is checked first (:func:`vllm_bundle.manifests.check_backend_versions`: one line naming the
    file and field), and the tag must be a plain name."""
    doc = read_backend_versions(pins_file)
    where = str(pins_file)
    overridden = target in doc["vllm"].get("rocm_arch_overrides", {})
    pin_field = f"vllm.rocm_arch_overrides.{target}" if overridden else "vllm.rocm"
    tag = pinned_tag(doc, target, where)
    if not is_plain_name(tag):
        raise ManifestError(
            f"{where}: {pin_field} (with -{target}) is {tag[:80]!r}, not {PLAIN_NAME_RULE}", BAD_RELEASE_HINT
        )
    repos: dict[str, dict[str, dict[str, str]]] = doc["checksums"]["github"]
    found = [(repo, tags[tag]) for repo, tags in repos.items() if tag in tags]
    if not found:
        raise InstallError(f"{pins_file} has no checksums for {tag}", f"is {target} part of this release?")
    repo, assets = found[0]
    checksums = {name: digest.removeprefix("sha256:") for name, digest in assets.items()}
    location = _as_location(mirror) if mirror else GITHUB_DOWNLOAD.format(repo=repo, tag=tag)
    return Release(tag, target, location, checksums, {}, glibc=doc.get("glibc", {}).get(tag))


def part_artifacts(release: Release, policy: RetryPolicy) -> list[Artifact]:
    """Reads ``partcount`` and names every part; each must have a checksum in the manifest."""
    text = _read_asset(release.location, release.assets.partcount, policy).decode(errors="replace").strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_PARTS:
        raise ManifestError(f"{release.assets.partcount} holds {text[:20]!r}, not a part count")
    count = int(text)
    names = release.assets.parts(count)
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


def _scratch_dir(dest: Path, kind: str) -> Path:
    """A new, empty ``.<dest>.<kind>-XXXXXXXX`` beside ``dest`` (the same file system, for the renames)."""
    while True:
        path = dest.with_name(f".{dest.name}.{kind}-{secrets.token_hex(4)}")
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return path


def _remove_tree(path: Path) -> None:
    """``path`` and everything in it, our markers last: a removal cut short leaves a directory the next
    run still knows as ours (and removes)."""
    markers = [path / MARKER, path / STAGING_MARKER]
    for entry in [*(entry for entry in path.iterdir() if entry not in markers), *markers]:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)
    path.rmdir()


def _leftovers(dest: Path, kinds: str = "staging|previous") -> list[Path]:
    """The directories runs for ``dest`` made beside it (``.<dest>.staging-*``, ``.<dest>.previous-*``),
    matched by exact name: ``dest``'s name is not a pattern (``v[1]`` never matches ``v1``'s)."""
    pattern = re.compile(rf"\.{re.escape(dest.name)}\.(?:{kinds}){SCRATCH_SUFFIX}")
    try:
        found = sorted(path for path in dest.parent.iterdir() if pattern.fullmatch(path.name))
    except OSError:
        return []
    return [path for path in found if path.is_dir() and not path.is_symlink()]


def _marked(directory: Path) -> bool:
    return any((directory / marker).is_file() for marker in (MARKER, STAGING_MARKER))


def _empty(directory: Path) -> bool:
    try:
        return not any(directory.iterdir())
    except OSError:
        return False


def recover(dest: Path, say: Callable[[str], None]) -> None:
    """A swap without RENAME_EXCHANGE killed between its two renames leaves no ``dest``, and the previous
    install beside it as ``.<dest>.previous-*``: put it back (the caller holds ``dest``'s lock)."""
    if os.path.lexists(dest):
        return
    moved = [path for path in _leftovers(dest, "previous") if (path / MARKER).is_file() or _empty(path)]
    if moved:
        latest = max(moved, key=lambda path: path.stat().st_mtime_ns)
        latest.rename(dest)
        if (dest / MARKER).is_file():
            say(f"put back the install a killed run had moved aside: {dest}")


def sweep(dest: Path) -> None:
    """Remove what killed runs for ``dest`` left beside it: each such directory carries a marker of ours
    or is empty (made, then killed before it was marked); anything else there is left alone. Only under
    ``dest``'s lock: a live install's staging is never another run's leftover."""
    for path in _leftovers(dest):
        with suppress(OSError):
            if _marked(path):
                _remove_tree(path)
            elif _empty(path):
                path.rmdir()


def swap_into_place(staging: Path, dest: Path) -> None:
    """``staging`` becomes ``dest``; an existing ``dest`` (an install of ours, checked by the caller) is
    removed only once the new one is in place. Without RENAME_EXCHANGE (NFS) the swap is two renames: a
    run killed between them is rolled back by the next (:func:`recover`)."""
    if not os.path.lexists(dest):
        staging.rename(dest)
        return
    if _rename_exchange(staging, dest):
        _remove_tree(staging)  # now the previous install (marked: ours) or the empty folder it replaced
        return
    previous = _scratch_dir(dest, "previous")
    dest.rename(previous)  # onto the empty directory just made: a name nobody else uses
    try:
        staging.rename(dest)
    except OSError:
        previous.rename(dest)
        raise
    _remove_tree(previous)


def installed_tag(dest: Path) -> str | None:
    try:
        return (dest / VERSION_FILE).read_text()
    except OSError:
        return None


def _ours(directory: Path) -> bool:
    """An install made by this tool: it holds our marker. Nothing else counts (a folder that merely holds
    a version.txt and a bin/vllm-server may be anyone's)."""
    return (directory / MARKER).is_file()


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
    """A new staging directory beside ``dest``, marked as ours from the start; removed on the way out
    unless it was swapped into place."""
    staging = _scratch_dir(dest, "staging")
    try:
        (staging / STAGING_MARKER).touch()
        yield staging
    finally:
        if os.path.lexists(staging):
            with suppress(OSError):
                _remove_tree(staging)


@contextmanager
def _destination_lock(dest: Path, say: Callable[[str], None]) -> Iterator[None]:
    """``dest``'s lock, beside it. The lock file is made here first: where none can be made (``/proc``,
    a read-only folder) that is one error at once, where FileLock would retry forever. An install that
    holds the lock is waited for, saying so."""
    path = dest.with_name(f".{dest.name}.vllm-bundle.lock")
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    waiting = f"another install into {dest} is running (it holds {path}); waiting for it to finish"
    with held(FileLock(str(path)), lambda: say(waiting), notice_after=LOCK_NOTICE_AFTER):
        yield


def _say(line: str) -> None:
    print(line, flush=True)


def install_release(
    release: Release,
    dest: Path,
    fetcher: Fetcher,
    policy: RetryPolicy,
    say: Callable[[str], None] = _say,
    *,
    delta: bool = True,
) -> bool:
    """Install ``release`` at ``dest``; False when that tag was already installed there. ``delta``: over
    a previous install, fetch only what changed (:mod:`vllm_bundle.install.delta`) where that can be done."""
    dest = dest.absolute()
    check_destination(dest)
    try:
        with raising_disk_full(f"the disk under {dest.parent} is full", "free space and retry"):
            dest.parent.mkdir(parents=True, exist_ok=True)
            with _destination_lock(dest, say):
                recover(dest, say)  # a swap cut short: the previous install back first
                sweep(dest)  # what killed runs left beside it
                check_destination(dest)  # again, now that no other installer can change it
                installed = _install_locked(release, dest, fetcher, policy, say, delta)
    except OSError as err:
        where = err.filename or dest.parent
        raise InstallError(f"cannot install into {dest}: {where}: {err.strerror}", "pick another --dest") from None
    if installed:
        say(f"installed {release.tag}: {dest / 'bin' / 'vllm-server'}")
    return installed


def _install_locked(
    release: Release, dest: Path, fetcher: Fetcher, policy: RetryPolicy, say: Callable[[str], None], delta: bool
) -> bool:
    if installed_tag(dest) == release.tag and _ours(dest):
        say(f"{release.tag} is already installed in {dest}; nothing to do")
        return False
    artifacts = part_artifacts(release, policy)
    toc, previous_tag = _table_of_contents(release, fetcher, say), installed_tag(dest)
    if delta and toc is not None and _ours(dest) and _same_tree(release, dest, fetcher):
        _mark_in_place(dest, release, toc)
        say(
            f"{release.tag} is the tree of the installed {previous_tag or 'release'} (the same tar stream, "
            "checked file by file): nothing fetched, only the install's own files written"
        )
        return True
    if delta and toc is not None and _ours(dest):
        store = ChunkStore(fetcher.cache)
        try:
            with _staging(dest) as staging:
                delta_run, moved = _install_delta(release, dest, toc, fetcher, store, staging, say)
                _put_in_place(staging, dest, release, toc)
            store.discard(chunk.digest for _, chunk in delta_run.toc.chunks())  # installed: not needed
        except DeltaUnavailable as why:
            store.discard(store.kept)  # the whole release replaces what this run fetched
            say(f"delta: {why}; downloading the whole release")
        else:
            total = sum(release.sizes.values())
            say(
                f"delta from {previous_tag or 'the previous install'}: re-used {human_size(moved.reused)} "
                f"({moved.linked} files kept as they were), fetched {human_size(moved.fetched)} "
                f"in {moved.requests} requests "
                f"({moved.fetched / max(total, 1):.1%} of the {human_size(total)} release)"
            )
            return True
    say(f"installing {release.tag} ({len(artifacts)} parts) into {dest}")
    fetched = fetcher.fetch_all(artifacts)
    with _staging(dest) as staging:
        parts = [fetched[a.sha256] for a in artifacts]
        extract_parts(  # the download's display
            parts, staging, release.tag, release.archive_sha256, fetcher.reporter, tar_sha256=release.tar_sha256
        )
        _put_in_place(staging, dest, release, toc)
    return True


def _same_tree(release: Release, dest: Path, fetcher: Fetcher) -> bool:
    """The release's tree is the installed one (a release that changed only its date, tarstream.
    RELEASED_MTIME): the install recorded the tar stream release.json gives, and its tree, read now with
    every file's bytes, mode, time and owner (no file more, none less), still is that stream."""
    if release.tar_sha256 is None:
        return False
    try:
        recorded = read_small_bytes(dest / STREAM_FILE, 64, follow=False).decode()
    except (OSError, NotSmallFile, UnicodeDecodeError):
        return False
    if recorded != release.tar_sha256:
        return False
    total = sum(release.sizes.values())  # (compressed: the step shows bytes read against it)
    try:
        with reported_step(fetcher.reporter, "check the installed tree", total) as checked:
            found = stream_sha256(dest, leave_out=INSTALLERS_OWN, progress=checked, as_installed=True)
    except (ArchiveError, OSError):  # a FIFO, a link out, a file chmod-ed: not the release's tree
        return False
    return found == release.tar_sha256


def _mark_in_place(dest: Path, release: Release, toc: bytes) -> None:
    """The install's own files for ``release``, each written beside ``dest`` (in a folder marked for
    :func:`sweep`) and renamed into it, the tag last: an install cut off midway is still the previous
    tag's, whose tree this is too, and is done again."""
    scratch = _scratch_dir(dest, "mark")
    try:
        (scratch / STAGING_MARKER).touch()
        for name, data in _own_files(release, toc).items():
            if data is None:
                (dest / name).unlink(missing_ok=True)
            else:
                (scratch / name).write_bytes(data)
                (scratch / name).replace(dest / name)
    finally:
        _remove_tree(scratch)


def _own_files(release: Release, toc: bytes | None) -> dict[str, bytes | None]:
    """What the installer writes beside the release's files, in the order it writes them (the install's
    tag last)."""
    glibc = release.glibc.encode() if release.glibc else None
    stream = release.tar_sha256.encode() if release.tar_sha256 else None
    tag = release.tag.encode()
    return {KEPT_TOC: toc, GLIBC_FILE: glibc, STREAM_FILE: stream, MARKER: tag, VERSION_FILE: tag}


def _table_of_contents(release: Release, fetcher: Fetcher, say: Callable[[str], None]) -> bytes | None:
    """The release's table of contents (checked against release.json's sha256), kept in the install for
    the next update; None where the release has none, or it cannot be had (said: the install goes on
    without, its parts checked as always)."""
    if release.toc is None:
        return None
    try:
        return fetcher.fetch_one(release.toc).read_bytes()
    except (BundleError, OSError) as err:
        say(f"the release's table of contents cannot be used ({err}); installing without it")
        return None


def _install_delta(
    release: Release,
    dest: Path,
    toc: bytes,
    fetcher: Fetcher,
    store: ChunkStore,
    staging: Path,
    say: Callable[[str], None],
) -> tuple[Delta, Moved]:
    """The new tree in ``staging``, from ``dest``'s chunks and the members of the new archive it lacks."""
    names = release.assets.parts(len(release.checksums))
    if any(name not in release.sizes for name in names) or release.tar_sha256 is None:
        raise DeltaUnavailable(
            "release.json does not give every part's size and archive.tar_sha256 (a release made before #54)"
        )
    parts = [
        Part(
            _asset_url(release, name) if release.is_url() else str(Path(release.location) / name),
            release.sizes[name],
            release.checksums[name],
        )
        for name in names
    ]
    delta = Delta(
        parse_toc(toc, sum(release.sizes.values())),
        parts,
        fetcher.session if release.is_url() else None,
        release.tar_sha256,
        dest,
        store,
        installers_own=(STAGING_MARKER,),
        policy=fetcher.policy,
    )
    return delta, install_delta(delta, staging, fetcher.reporter, say, f"the {release.tag} release")


def _put_in_place(staging: Path, dest: Path, release: Release, toc: bytes | None) -> None:
    """The staged tree, checked to be a bundle and marked as ours (with the table of contents it came
    from, for the next update), swapped in for ``dest``."""
    launcher = staging / "bin" / "vllm-server"
    if not launcher.is_file() or not os.access(launcher, os.X_OK):
        raise InstallError(f"{release.tag} has no executable bin/vllm-server", "this is not a bundle release")
    for name, data in _own_files(release, toc).items():
        (staging / name).unlink(missing_ok=True)  # never written through a link the archive put there
        if data is not None:
            (staging / name).write_bytes(data)
    (staging / STAGING_MARKER).unlink()  # after the install marker: the directory always carries one
    swap_into_place(staging, dest)
