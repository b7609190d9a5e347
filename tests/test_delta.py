"""Updates that download only what changed (#34): ``install`` over a previous install re-uses the chunks
it has, fetches the gzip members it lacks with HTTP Range, and installs what a full install would; where
a delta cannot be done safely it downloads the whole release, and a release that is wrong is refused with
the previous install intact."""

from __future__ import annotations

import functools
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import interrupt
from tests.conftest import HOST, PART_SIZE, assert_one_line_error, install, publish, tree_digest
from tests.releases import make_release
from tests.test_install import TAG
from tests.upstream.fixture import ROCM_VERSION
from tests.upstream.server import Fault, UpstreamServer
from vllm_bundle.install.delta import KEPT_TOC
from vllm_bundle.install.installer import INSTALLERS_OWN
from vllm_bundle.manifests import RELEASE_JSON, ReleaseAssets
from vllm_bundle.release.assets import toc_field
from vllm_bundle.util.cache import Cache

OLD_TAG = f"vllm0.32.0-rocm{ROCM_VERSION}-gfx1151"
ASSETS = ReleaseAssets(TAG)


@dataclass(frozen=True)
class Releases:
    old: str  # URL of the older release
    new: str  # URL of the fixture release (the pipeline's own)
    new_dir: Path
    installed_old: Path  # a full install of the older one, to copy
    installed_new: Path  # a full install of the new one (--no-delta), the tree a delta must give
    changed: str  # the file the older release has another version of


@pytest.fixture(scope="module")
def releases(built: Path, _server: UpstreamServer, tmp_path_factory: pytest.TempPathFactory) -> Releases:
    """The fixture release, and an older one made from its tree with one library changed in its middle,
    one file gone and one file more, both on the loopback server and each installed in full once."""
    work = tmp_path_factory.mktemp("delta")
    new_dir = built.parent / "bundles" / TAG
    date = json.loads((new_dir / RELEASE_JSON).read_text())["source_date_epoch"]
    old_root = Path(shutil.copytree(built / "gfx1151" / "root", work / "old-root", symlinks=True))
    vllm = next(old_root.glob("lib/python*/site-packages/vllm"))
    library = vllm / "_C.abi3.so"
    data = bytearray(library.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = os.urandom(4096)
    library.write_bytes(bytes(data))
    (vllm / "envs.py").unlink()  # the new release adds it back
    (vllm / "only_in_the_old_release.py").write_text("gone = True\n")
    # The upstream's files are every worker's: the older release under a folder of this worker's own
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    make_release(old_root, _server.root / "older" / worker / OLD_TAG, OLD_TAG, date - 86400, PART_SIZE)
    old, new = f"{_server.url}/older/{worker}/{OLD_TAG}/", publish(built, _server)
    for url, dest in ((old, work / "installed-old"), (new, work / "installed-new")):
        result = install(url, dest, work / "cache", "--no-delta")
        assert result.returncode == 0, result.stdout + result.stderr
    return Releases(
        old, new, new_dir, work / "installed-old", work / "installed-new", str(library.relative_to(old_root))
    )


def previous(releases: Releases, tmp_path: Path) -> Path:
    """A copy of the older release's install: the install to update."""
    return Path(shutil.copytree(releases.installed_old, tmp_path / "vllm", symlinks=True))


def tree_with_times(root: Path) -> dict[str, tuple[str, int]]:
    """Every entry with its contents and mode (tree_digest) and the release's files' modification times."""
    return {
        name: (digest, 0 if digest.startswith("->") or name in INSTALLERS_OWN else int((root / name).lstat().st_mtime))
        for name, digest in tree_digest(root).items()
    }


@functools.cache
def _expected(installed_new: Path) -> dict[str, tuple[str, int]]:
    return tree_with_times(installed_new)


def expected_tree(releases: Releases) -> dict[str, tuple[str, int]]:
    """:func:`tree_with_times` of the full install of the new release, the tree every delta must give:
    read once per module (the install is the module's and no test changes it), not once per test."""
    return dict(_expected(releases.installed_new))  # a copy: tests pop from it


def release_files(root: Path) -> dict[str, tuple[str, int]]:
    """:func:`tree_with_times` without the installer's own files (they name the tag installed)."""
    return {name: found for name, found in tree_with_times(root).items() if name not in INSTALLERS_OWN}


def part_requests(upstream: UpstreamServer, tag: str = TAG) -> list[tuple[str | None, int]]:
    """Each GET of a part of ``tag``'s release: its Range header (None: the whole part) and bytes sent."""
    return [
        (r.range, r.body_bytes)
        for r in upstream.log
        if r.method == "GET"
        and f"/{tag}/" in r.path
        and ".part" in r.path
        and r.path.endswith(".tar.gz")
        and r.status in (200, 206)
    ]


def why_the_whole_release(result: subprocess.CompletedProcess[str]) -> str:
    """The one line of a successful install that says why it downloaded the whole release, not a delta."""
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "downloading the whole release" in line]
    return line


def archive_size(release_dir: Path) -> int:
    return int(json.loads((release_dir / RELEASE_JSON).read_text())["archive"]["size"])


# -- an update ----------------------------------------------------------------------------------------


def test_an_update_fetches_only_what_changed_and_installs_what_a_full_install_does(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    dest = previous(releases, tmp_path)
    result = install(releases.new, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"delta from {OLD_TAG}: re-used " in result.stdout, result.stdout
    fetched = part_requests(upstream)
    assert fetched and all(header is not None for header, _ in fetched), "only Range requests, no whole part"
    total = archive_size(releases.new_dir)
    moved = sum(size for _, size in fetched)
    assert moved < 0.05 * total, f"{moved} of {total} bytes fetched for one changed library and one file"
    assert tree_with_times(dest) == expected_tree(releases), "what a full install gives"
    assert (dest / KEPT_TOC).read_bytes() == (releases.new_dir / ASSETS.toc).read_bytes()
    assert (dest / "version.txt").read_text() == TAG
    chunks = tmp_path / "cache" / "chunks"
    assert not chunks.exists() or not any(p.is_file() for p in chunks.rglob("*")), "the fetched chunks are cleared"


def test_no_delta_downloads_the_whole_release(releases: Releases, upstream: UpstreamServer, tmp_path: Path) -> None:
    dest = previous(releases, tmp_path)
    result = install(releases.new, dest, tmp_path / "cache", "--no-delta")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "delta:" not in result.stdout and "delta from" not in result.stdout
    assert all(header is None for header, _ in part_requests(upstream))
    assert tree_with_times(dest) == expected_tree(releases)


def test_a_file_changed_in_the_previous_install_is_fetched_not_copied(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """Every re-used chunk is hashed again as it is read: a file the user changed after the install (or
    a disk that flipped a bit) is not copied into the new one; its chunks are fetched."""
    dest = previous(releases, tmp_path)
    launcher = dest / "bin" / "vllm-server"
    launcher.write_text(launcher.read_text().replace("#", "# edited", 1))
    result = install(releases.new, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "delta from" in result.stdout
    assert tree_with_times(dest) == expected_tree(releases)


def test_a_cut_range_is_resumed_from_the_member_it_stopped_at(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """Each part's first answer is cut after 2000 bytes: the Range request that meets it is asked again
    from the member it had not finished, and the update is still a delta."""
    dest = previous(releases, tmp_path)
    for part in releases.new_dir.glob(f"{ASSETS.stem}.part*.tar.gz"):
        upstream.inject(f"/releases/download/{TAG}/{part.name}", Fault("cut", after=2000, times=1))
    result = install(releases.new, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "downloading the whole release" not in result.stdout, result.stdout
    requests = part_requests(upstream)
    assert all(header is not None for header, _ in requests), "Range requests only"
    cut = [header for header, size in requests if size == 2000]
    assert cut, f"a Range answer was cut: {requests}"
    assert len(requests) > len(cut), "and asked again"
    assert tree_with_times(dest) == expected_tree(releases)


def test_the_tree_is_written_while_what_changed_is_fetched(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """The download and the writing overlap: while every Range answer is held back by the server (its
    headers sent, its body not), the files the previous install has are already being written; once the
    answers go out, the update completes as a delta."""
    dest = previous(releases, tmp_path)
    answers = threading.Event()
    for part in releases.new_dir.glob(f"{ASSETS.stem}.part*.tar.gz"):
        upstream.inject(f"/releases/download/{TAG}/{part.name}", Fault("hold", until=answers, times=None))
    done: list[Any] = []
    installing = threading.Thread(target=lambda: done.append(install(releases.new, dest, tmp_path / "cache")))
    installing.start()
    # Both, while no answer has gone out: which one happens first is the scheduler's choice (on a loaded
    # machine the file can be written before the fetching thread has sent its first request).
    deadline, written, held = time.monotonic() + 45, False, 0  # (the client's read timeout is 60 s)
    while installing.is_alive() and not (written and held) and time.monotonic() < deadline:
        written = written or any((d / "bin" / "vllm-server").is_file() for d in tmp_path.glob(".vllm.*"))
        held = len(part_requests(upstream))
        time.sleep(0.02)
    answers.set()
    installing.join(timeout=300)
    (result,) = done
    assert result.returncode == 0, result.stdout + result.stderr
    assert held, "the update asked for nothing of what changed while the tree was being written"
    assert written, "no re-used file was written while every Range answer was held back"
    assert "delta from" in result.stdout and all(header is not None for header, _ in part_requests(upstream))
    assert tree_with_times(dest) == expected_tree(releases)


# -- where a delta cannot be done: the whole release ---------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        (Fault("ignore-range", times=None), "HTTP 200, not 206"),
        (Fault("wrong-range", times=1), "does not match"),
        (Fault("other-range", times=1), "with the range bytes"),
    ],
    ids=["server-ignores-range", "range-with-other-bytes", "range-named-otherwise"],
)
def test_a_server_that_does_not_answer_the_range_gets_the_full_download(
    fault: Fault, why: str, releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    dest = previous(releases, tmp_path)
    new = sorted(releases.new_dir.glob(f"{ASSETS.stem}.part*.tar.gz"))
    for part in new:
        upstream.inject(f"/releases/download/{TAG}/{part.name}", fault)
    result = install(releases.new, dest, tmp_path / "cache")
    line = why_the_whole_release(result)
    assert why in line
    assert tree_with_times(dest) == expected_tree(releases)


def test_an_unrelated_previous_install_gets_the_full_download(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """More than half of the archive to fetch: the whole release, its parts resumable as a whole."""
    root = tmp_path / "tiny"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "vllm-server").write_text("#!/bin/sh\n")
    (root / "bin" / "vllm-server").chmod(0o755)
    tiny = make_release(root, upstream.root / "tiny" / "x", "tiny-gfx1151", 0, PART_SIZE)
    assert install(tiny, tmp_path / "vllm", tmp_path / "cache").returncode == 0
    result = install(releases.new, tmp_path / "vllm", tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(more than half); downloading the whole release" in result.stdout
    assert tree_with_times(tmp_path / "vllm") == expected_tree(releases)


def test_a_previous_install_without_a_table_gets_the_full_download(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    dest = previous(releases, tmp_path)
    (dest / KEPT_TOC).unlink()  # as an install of an earlier version of this tool left it
    result = install(releases.new, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "keeps no table of contents" in result.stdout
    assert tree_with_times(dest) == expected_tree(releases)


# -- hostile tables and parts ------------------------------------------------------------------------


def _entries(toc: dict[str, Any], kind: str = "reg") -> list[dict[str, Any]]:
    return [entry for entry in toc["entries"] if entry["type"] == kind and entry.get("chunkSize")]


def _beyond_the_archive(toc: dict[str, Any]) -> None:
    _entries(toc)[0]["offset"] = toc["members"][-1][0] + toc["members"][-1][1]


def _overlapping(toc: dict[str, Any]) -> None:
    (chunk,) = [e for e in toc["entries"] if e["type"] == "chunk"][:1]
    chunk["chunkOffset"] -= 1


def _other_digest(toc: dict[str, Any]) -> None:
    entry = _entries(toc)[-1]
    entry["chunkDigest"] = "sha256:" + "0" * 64


def _escaping(toc: dict[str, Any]) -> None:
    _entries(toc)[-1]["name"] = "../escaped"


def _single_chunk_files(toc: dict[str, Any]) -> list[dict[str, Any]]:
    """The files of one chunk, each other than the one before it."""
    many = {entry["name"] for entry in toc["entries"] if entry["type"] == "chunk"}
    return [e for e in _entries(toc) if e["name"] not in many and e["name"] != "bin/vllm-server"]


def _another_files_bytes(toc: dict[str, Any]) -> None:
    """A file given another file's chunk (one the previous install has: re-used, never fetched)."""
    first, other = _single_chunk_files(toc)[:2]
    for key in ("size", "offset", "innerOffset", "chunkSize", "chunkDigest"):
        first[key] = other[key]


def _entries_the_archive_lacks(toc: dict[str, Any]) -> None:
    (other,) = _single_chunk_files(toc)[:1]
    toc["entries"] += [{"name": "planted", "type": "dir", "mode": 0o755}, {**other, "name": "planted/file.py"}]


@pytest.mark.parametrize(
    "lie",
    [_another_files_bytes, _entries_the_archive_lacks],
    ids=["another-files-bytes", "entries-the-archive-lacks"],
)
def test_a_table_that_does_not_describe_the_parts_gets_the_full_download(
    lie: Callable[[dict[str, Any]], None], releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """The parts untouched, only the table and its sha256 in release.json changed (#51 F7): a table that
    adds up but does not describe the parts. The assembled tree's tar stream, hashed again from disk, is not
    the one the parts inflate to (archive.tar_sha256), so the whole release is downloaded: what --no-delta
    installs, never what the table says."""
    url = _lying_release(lie, releases, upstream, tmp_path)
    dest = previous(releases, tmp_path)
    result = install(url, dest, tmp_path / "cache")
    line = why_the_whole_release(result)
    assert "is not the tar stream of the release's parts" in line, line
    installed, expected = tree_with_times(dest), expected_tree(releases)
    assert installed.pop(KEPT_TOC) != expected.pop(KEPT_TOC)
    assert installed == expected


def modes(root: Path) -> dict[str, str]:
    """Every entry's mode, the root's and each directory's too."""
    return {str(path.relative_to(root)): oct(path.lstat().st_mode) for path in [root, *sorted(root.rglob("*"))]}


def _world_writable(toc: dict[str, Any]) -> None:
    for entry in toc["entries"]:
        if entry["type"] == "dir" and entry["name"] in (".", "bin"):
            entry["mode"] = 0o777
    (file,) = [entry for entry in _single_chunk_files(toc) if entry["mode"] == 0o644][:1]
    file["mode"] = 0o666  # (on a file of mode 0755, the exec bit it lacks would change the parts: checked)


def test_a_delta_writes_the_modes_a_full_install_does_whatever_the_table_says(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """A table that makes the install root, a directory and a file world-writable (#51 F7): the delta
    writes each entry's mode as the release's tar stream has it, so it installs what a full install does."""
    url = _lying_release(_world_writable, releases, upstream, tmp_path)
    dest = previous(releases, tmp_path)
    result = install(url, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "delta from" in result.stdout, result.stdout
    assert modes(dest) == modes(releases.installed_new)
    installed, expected = tree_with_times(dest), expected_tree(releases)
    assert installed.pop(KEPT_TOC) != expected.pop(KEPT_TOC)
    assert installed == expected


def _lying_release(
    lie: Callable[[dict[str, Any]], None], releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> str:
    """The new release with its table changed by ``lie`` and release.json's sha256 of it made to agree."""
    case = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{tmp_path.name}"  # the upstream's files are every worker's
    published = upstream.root / "lying" / case / TAG
    shutil.copytree(releases.new_dir, published)
    toc = json.loads(gzip.decompress((published / ASSETS.toc).read_bytes()))
    lie(toc)
    data = gzip.compress(json.dumps(toc).encode(), mtime=0)
    (published / ASSETS.toc).write_bytes(data)
    release = json.loads((published / RELEASE_JSON).read_text())
    release["archive"]["toc"] = toc_field(ASSETS, data)
    (published / RELEASE_JSON).write_text(json.dumps(release))
    return f"{upstream.url}/lying/{case}/{TAG}/"


@pytest.mark.parametrize(
    ("lie", "why"),
    [
        (_beyond_the_archive, "not a member's offset"),
        (_overlapping, "chunks overlap"),
        (_other_digest, "does not match"),
        (_escaping, "refusing to extract"),
    ],
    ids=["offset-outside-the-parts", "overlapping-chunks", "sha256-that-does-not-match", "path-that-escapes"],
)
def test_a_table_that_lies_gets_the_full_download(
    lie: Callable[[dict[str, Any]], None], why: str, releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """A table that does not match the archive, even one release.json vouches for: the delta stops, and
    the whole release is downloaded and checked against its parts' sha256 instead."""
    url = _lying_release(lie, releases, upstream, tmp_path)
    dest = previous(releases, tmp_path)
    result = install(url, dest, tmp_path / "cache")
    line = why_the_whole_release(result)
    assert why in line
    installed, expected = tree_with_times(dest), expected_tree(releases)
    assert installed.pop(KEPT_TOC) != expected.pop(KEPT_TOC), "the table kept is the one released (a hint only)"
    assert installed == expected
    assert not (tmp_path / "escaped").exists() and not (dest.parent / "escaped").exists()


@pytest.mark.parametrize("claimed", ["does/not/exist.so", "../../outside.so"])
def test_a_chunk_claimed_from_a_file_the_previous_install_lacks_is_fetched(
    claimed: str, releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """The previous install's table is read only to find chunks, each hashed again: one naming a file
    that is not there (or not inside the install) is fetched from the release."""
    dest = previous(releases, tmp_path)
    (tmp_path / "outside.so").write_bytes(b"not part of any install")
    toc = json.loads(gzip.decompress((dest / KEPT_TOC).read_bytes()))
    for entry in _entries(toc):
        if entry["name"].endswith("_C.abi3.so"):
            entry["name"] = claimed
    (dest / KEPT_TOC).write_bytes(gzip.compress(json.dumps(toc).encode()))
    result = install(releases.new, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "delta from" in result.stdout and "downloading the whole release" not in result.stdout
    assert tree_with_times(dest) == expected_tree(releases)


def test_a_part_replaced_under_the_same_name_is_refused_with_the_previous_install_intact(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    published = upstream.root / "replaced" / TAG
    shutil.copytree(releases.new_dir, published)
    for part in published.glob(f"{ASSETS.stem}.part*.tar.gz"):  # other bytes, the same size
        part.write_bytes(os.urandom(part.stat().st_size))
    dest = previous(releases, tmp_path)
    before = tree_with_times(dest)
    result = install(f"{upstream.url}/replaced/{TAG}/", dest, tmp_path / "cache")
    assert_one_line_error(result, "hash mismatch for")
    assert tree_with_times(dest) == before, "the previous install as it was"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".vllm.")] == [".vllm.vllm-bundle.lock"]


def test_a_chunk_fetched_while_assembling_is_shown_on_a_terminal(releases: Releases, tmp_path: Path) -> None:
    """On a terminal (rich's bars), a chunk the plan took from the previous install but found changed is
    fetched during the assembly, apart from the planned fetch: it gets a bar of its own."""
    from rich.console import Console

    from vllm_bundle.install.installer import install_release, release_from_assets
    from vllm_bundle.util.cache import Cache
    from vllm_bundle.util.fetch import Fetcher
    from vllm_bundle.util.policy import RetryPolicy
    from vllm_bundle.util.progress import RichReporter

    dest = previous(releases, tmp_path)
    launcher = dest / "bin" / "vllm-server"
    launcher.write_text(launcher.read_text().replace("#", "# edited", 1))
    policy, said = RetryPolicy(), list[str]()
    release = release_from_assets(releases.new, policy)
    screen = io.StringIO()
    reporter = RichReporter(Console(file=screen, force_terminal=True, width=160), None)
    with reporter, Fetcher(Cache(tmp_path / "cache"), reporter, policy=policy) as fetcher:
        assert install_release(release, dest, fetcher, policy, said.append)
    assert any(line.startswith(f"delta from {OLD_TAG}") for line in said), said
    assert "fetch a changed chunk" in screen.getvalue()
    assert tree_with_times(dest) == expected_tree(releases)


def test_a_chunk_cache_that_is_a_link_is_refused_in_one_line(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """The chunks a delta keeps are download cache entries: like every other, never written through a
    symbolic link (util/cache.py), and the previous install stays as it was."""
    dest = previous(releases, tmp_path)
    before = tree_with_times(dest)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "chunks").symlink_to(elsewhere)
    result = install(releases.new, dest, tmp_path / "cache")
    assert_one_line_error(result, "is a symbolic link")
    assert list(elsewhere.iterdir()) == [], "nothing written through the link"
    assert tree_with_times(dest) == before


# -- a previous install the user has touched (#51 F1, F3) ----------------------------------------------


def _reused_files(dest: Path, count: int) -> list[str]:
    """``count`` regular files of the previous install whose chunks the new release re-uses (the library
    the older release changed aside), the largest first."""
    toc = json.loads(gzip.decompress((dest / KEPT_TOC).read_bytes()))
    files = sorted(_entries(toc), key=lambda entry: -int(entry["size"]))
    names = [entry["name"] for entry in files if not entry["name"].endswith("_C.abi3.so")]
    return names[:count]


def test_fifos_loops_and_links_out_in_the_previous_install_are_fetched_not_read(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """Anything in the previous install that is not the regular file its table names is a changed file:
    a FIFO (opened, it would block for good), a symbolic link loop (``Path.resolve`` raises RuntimeError on
    Python 3.11), a link out of the tree (to a copy with the right bytes) and a file with other bytes; and
    FIFOs in the chunk cache. Each is fetched, and the update gives the tree a full install does."""
    dest = previous(releases, tmp_path)
    fifo, loop, out, other = _reused_files(dest, 4)
    outside = tmp_path / "outside"
    outside.write_bytes((dest / out).read_bytes())
    for name in (fifo, loop, out):
        (dest / name).unlink()
    os.mkfifo(dest / fifo)
    (dest / loop).symlink_to(Path(loop).name)  # itself
    (dest / out).symlink_to(outside)
    (dest / other).write_bytes(b"other bytes")
    cache = Cache(tmp_path / "cache")  # every chunk is looked for in the chunk cache first
    for entry in _entries(json.loads(gzip.decompress((dest / KEPT_TOC).read_bytes())))[:3]:
        chunk = cache.chunk(entry["chunkDigest"].removeprefix("sha256:"))
        chunk.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(chunk)
    result = install(releases.new, dest, tmp_path / "cache", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "delta from" in result.stdout and "downloading the whole release" not in result.stdout, result.stdout
    assert tree_with_times(dest) == expected_tree(releases)


def test_a_fifo_for_the_kept_table_gets_the_full_download_in_one_line(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    dest = previous(releases, tmp_path)
    (dest / KEPT_TOC).unlink()
    os.mkfifo(dest / KEPT_TOC)
    result = install(releases.new, dest, tmp_path / "cache", timeout=60)
    line = why_the_whole_release(result)
    assert "not a regular file" in line, line
    assert tree_with_times(dest) == expected_tree(releases)


# -- a server that drips, Ctrl-C, a full disk (#51 F2, F8) ---------------------------------------------


def _part_paths(releases: Releases) -> list[str]:
    return [f"/releases/download/{TAG}/{part.name}" for part in releases.new_dir.glob(f"{ASSETS.stem}.part*.tar.gz")]


def test_range_answers_that_drip_get_the_full_download(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """Each Range answer sends 20 bytes a second, never silent for a read timeout: it is given up at its
    deadline (the read timeout plus its size at 256 kbit/s), asked again as often as --retries says, and
    the whole release is downloaded instead (its parts are not dripped)."""
    for path in _part_paths(releases):
        upstream.inject(path, Fault("throttle", rate=20, times=None, ranged=True))
    dest = previous(releases, tmp_path)
    result = install(releases.new, dest, tmp_path / "cache", "--read-timeout", "2", "--retries", "2", timeout=150)
    line = why_the_whole_release(result)
    assert "cut off 2 times" in line and "did not arrive whole within" in line, line
    assert tree_with_times(dest) == expected_tree(releases)
    chunks = tmp_path / "cache" / "chunks"
    assert not chunks.exists() or not any(chunks.iterdir()), "what the delta fetched is not kept"


def test_ctrl_c_during_a_delta_ends_it_at_once_with_the_previous_install_intact(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """Ctrl-C while the Range answers are held back by the server (their headers sent, their bodies due
    in 120 s): the install ends now, not when the answers do, and the previous install is as it was."""
    released = threading.Event()
    for path in _part_paths(releases):
        upstream.inject(path, Fault("hold", until=released, seconds=120, times=None, ranged=True))
    dest = previous(releases, tmp_path)
    before = tree_with_times(dest)
    command = [sys.executable, "-m", "vllm_bundle", "install", releases.new, "--dest", str(dest)]
    command += ["--cache-dir", str(tmp_path / "cache"), "--plain", *HOST]
    process = interrupt.start(command)
    try:
        deadline = time.monotonic() + 60
        while not any(header for header, _ in part_requests(upstream)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None and any(header for header, _ in part_requests(upstream)), "a Range request"
        time.sleep(0.5)  # the answer's headers are read; its body is held
        _, _, stderr = interrupt.ctrl_c(process, within=20)
    finally:
        released.set()
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("interrupted: "), stderr
    assert tree_with_times(dest) == before, "the previous install as it was"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".vllm.")] == [".vllm.vllm-bundle.lock"]


def test_a_full_disk_under_the_chunk_cache_is_one_line_naming_it(
    releases: Releases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunk cache on a disk of its own that is full (its chunk files written to /dev/full): one line
    naming the cache, no half-written chunk left, and the previous install as it was."""
    from vllm_bundle.errors import DiskFullError
    from vllm_bundle.install.installer import install_release, release_from_assets
    from vllm_bundle.util.fetch import Fetcher
    from vllm_bundle.util.policy import RetryPolicy
    from vllm_bundle.util.progress import PlainReporter

    dest = previous(releases, tmp_path)
    before = tree_with_times(dest)
    chunks, real_open = tmp_path / "cache" / "chunks", os.open

    def on_a_full_disk(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        descriptor = real_open(path, flags, mode, **kwargs)
        if Path(os.fsdecode(path)).is_relative_to(chunks) and flags & os.O_CREAT:
            full = real_open("/dev/full", os.O_WRONLY)
            os.dup2(full, descriptor)
            os.close(full)
        return descriptor

    monkeypatch.setattr(os, "open", on_a_full_disk)
    policy = RetryPolicy()
    release = release_from_assets(releases.new, policy)
    with (
        Fetcher(Cache(tmp_path / "cache"), PlainReporter(), policy=policy) as fetcher,
        pytest.raises(DiskFullError) as raised,
    ):
        install_release(release, dest, fetcher, policy, lambda line: None)
    assert f"download cache {tmp_path / 'cache'}" in raised.value.message, raised.value.message
    assert "the disk under" not in raised.value.message, "not the staging's disk"
    assert [p.name for p in chunks.rglob("*") if p.is_file()] == [], "no half-written chunk"
    monkeypatch.undo()
    assert tree_with_times(dest) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".vllm.")] == [".vllm.vllm-bundle.lock"]


def test_files_changed_since_count_towards_more_than_half(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """Every file of the previous install changed after it was installed (its table still names them):
    the plan re-uses them all, the assembly finds each changed, and once what it fetched makes more than
    half of the archive the whole release is downloaded instead; what the delta fetched is not kept."""
    dest = previous(releases, tmp_path)
    for path in dest.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.name not in INSTALLERS_OWN:
            path.write_bytes(os.urandom(path.stat().st_size))
    result = install(releases.new, dest, tmp_path / "cache")
    line = why_the_whole_release(result)
    assert "more than half of the archive changed after all" in line, line
    assert tree_with_times(dest) == expected_tree(releases)
    chunks = tmp_path / "cache" / "chunks"
    assert not chunks.exists() or not any(chunks.iterdir()), "what the delta fetched is not kept, nor its folders"


def test_a_range_redirected_to_plain_http_gets_the_full_download(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """A Range request redirected to http:// on another host (192.0.2.1, TEST-NET-1: never contacted, the
    hop is refused before it is followed): the delta gives up, and the parts come as they are served."""
    for path in _part_paths(releases):
        upstream.inject(path, Fault("redirect", location="http://192.0.2.1/part", times=None, ranged=True))
    dest = previous(releases, tmp_path)
    result = install(releases.new, dest, tmp_path / "cache")
    line = why_the_whole_release(result)
    assert "refusing to download http://192.0.2.1/part" in line, line
    assert tree_with_times(dest) == expected_tree(releases)


@pytest.mark.parametrize("value", ["0" * 63, 7, None], ids=["short", "number", "missing"])
def test_a_tar_sha256_that_is_not_one_is_refused_or_gets_the_full_download(
    value: object, releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """release.json's archive.tar_sha256 is what a delta checks the tree it wrote against (#54): one that
    is not a sha256 makes release.json not one of ours, refused in one line like any other field that is
    wrong, with the previous install as it was; a release without one (made before #54) is installed whole."""
    case = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{tmp_path.name}"
    published = upstream.root / "stream-digests" / case / TAG
    shutil.copytree(releases.new_dir, published)
    release = json.loads((published / RELEASE_JSON).read_text())
    if value is None:
        del release["archive"]["tar_sha256"]
    else:
        release["archive"]["tar_sha256"] = value
    (published / RELEASE_JSON).write_text(json.dumps(release))
    dest = previous(releases, tmp_path)
    before = tree_with_times(dest)
    result = install(f"{upstream.url}/stream-digests/{case}/{TAG}/", dest, tmp_path / "cache")
    if value is None:
        assert "archive.tar_sha256 (a release made before #54)" in why_the_whole_release(result)
        assert release_files(dest) == release_files(releases.installed_new)
        return
    assert_one_line_error(result, "archive.tar_sha256")
    assert tree_with_times(dest) == before


# -- files kept as they were: hard links to the previous install's (#54) --------------------------------


def kept(result: subprocess.CompletedProcess[str]) -> int:
    """How many files the delta said it kept as they were (linked to the previous install's)."""
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("delta from ")]
    return int(line.split(" files kept as they were")[0].rsplit("(", 1)[1])


def regular_files(toc_bytes: bytes) -> dict[str, list[str]]:
    """Each regular file of a table: its chunks' sha256."""
    entries = json.loads(gzip.decompress(toc_bytes))["entries"]
    files: dict[str, list[str]] = {}
    for entry in entries:
        if entry["type"] in ("reg", "chunk") and "chunkDigest" in entry:
            files.setdefault(entry["name"], []).append(entry["chunkDigest"])
        elif entry["type"] == "reg":
            files[entry["name"]] = []
    return files


def test_an_update_keeps_every_unchanged_file_as_a_link_and_writes_only_what_changed(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """The older release is a day older, one library changed, one file gone, one more: every other file
    has the same bytes, mode and time in both (tarstream.RELEASED_MTIME), so the update links it and
    writes only the changed library and the new file (and the files the copy of the previous install
    holds as a file of their own where the release has a second name); the tree is a full install's."""
    dest = previous(releases, tmp_path)
    old = regular_files((dest / KEPT_TOC).read_bytes())
    new = regular_files((releases.new_dir / ASSETS.toc).read_bytes())
    same = {name for name, chunks in new.items() if old.get(name) == chunks}
    assert releases.changed in old and releases.changed in new and releases.changed not in same
    result = install(releases.new, dest, tmp_path / "cache")
    assert kept(result) == len(same) > 0.9 * len(new), result.stdout
    assert tree_with_times(dest) == expected_tree(releases), "what a full install gives"


def _touched(dest: Path) -> Path:
    path = dest / "bin" / "vllm-server"
    os.utime(path, (1_700_000_000, 1_700_000_000))
    return path


def _mode_changed(dest: Path) -> Path:
    path = dest / "bin" / "vllm-server"
    path.chmod(0o700)
    return path


def _linked_from_outside(dest: Path) -> Path:
    path = dest / "bin" / "vllm-server"
    (dest.parent / "outside").hardlink_to(path)
    return path


@pytest.mark.parametrize(
    "change", [_touched, _mode_changed, _linked_from_outside], ids=["other-time", "other-mode", "linked-from-outside"]
)
def test_a_file_whose_metadata_differs_is_written_not_linked(
    change: Callable[[Path], Path], releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """A file of the previous install with the release's bytes but another time, another mode, or a name
    outside the install (a link from elsewhere would change the new install when that name is written)
    is written as a full install writes it, never linked and never changed in place."""
    dest = previous(releases, tmp_path)
    path = change(dest)
    expected = kept(install(releases.new, previous(releases, tmp_path / "plain"), tmp_path / "plain-cache"))
    result = install(releases.new, dest, tmp_path / "cache")
    assert kept(result) == expected - 1, result.stdout
    assert tree_with_times(dest) == expected_tree(releases)
    assert (dest / "bin" / "vllm-server").stat().st_nlink == 1
    if change is _linked_from_outside:
        assert (dest.parent / "outside").stat().st_nlink == 1, "the new install shares nothing with it"
    del path


def nlinks(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.lstat().st_nlink for p in sorted(root.rglob("*")) if not p.is_symlink()}


@pytest.mark.parametrize("how", ["exchange", "second-rename"])
def test_a_swap_that_fails_with_shared_files_leaves_the_previous_install_intact(
    how: str, releases: Releases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new tree is assembled, most of its files hard links to the previous install's; then the swap
    fails: at the exchange itself, or (without RENAME_EXCHANGE, as on NFS) at the second rename, after the
    previous install was moved aside and must be moved back. The previous install is as it was, byte,
    mode, time and link count, nothing of the new tree is left, and it still runs."""
    from vllm_bundle.errors import InstallError
    from vllm_bundle.install import installer
    from vllm_bundle.util.fetch import Fetcher
    from vllm_bundle.util.policy import RetryPolicy
    from vllm_bundle.util.progress import PlainReporter

    dest = previous(releases, tmp_path)
    before, links = tree_with_times(dest), nlinks(dest)
    shared: list[int] = []
    real_swap, real_rename = installer.swap_into_place, Path.rename

    def failing_swap(staging: Path, into: Path) -> None:
        inodes = {p.lstat().st_ino for p in into.rglob("*") if p.is_file() and not p.is_symlink()}
        shared.append(sum(1 for p in staging.rglob("*") if p.is_file() and p.lstat().st_ino in inodes))
        if how == "exchange":
            raise OSError(5, "Input/output error", str(into))
        monkeypatch.setattr(installer, "_rename_exchange", lambda first, second: False)

        def rename(self: Path, target: Any) -> Path:
            if self == staging:
                raise OSError(5, "Input/output error", str(self))
            return real_rename(self, target)

        monkeypatch.setattr(Path, "rename", rename)
        real_swap(staging, into)

    monkeypatch.setattr(installer, "swap_into_place", failing_swap)
    policy = RetryPolicy()
    release = installer.release_from_assets(releases.new, policy)
    with (
        Fetcher(Cache(tmp_path / "cache"), PlainReporter(), policy=policy) as fetcher,
        pytest.raises(InstallError, match="Input/output error"),
    ):
        installer.install_release(release, dest, fetcher, policy, lambda line: None)
    monkeypatch.undo()
    files = sum(1 for path in dest.rglob("*") if path.is_file() and not path.is_symlink())
    assert shared and shared[0] > 0.9 * files, f"the new tree shared {shared} of {files} files with the old"
    assert tree_with_times(dest) == before, "the previous install's bytes, modes and times"
    assert nlinks(dest) == links, "and link counts: nothing of the new tree holds its files"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".vllm.")] == [".vllm.vllm-bundle.lock"]
    python = next((dest / "bin").glob("python3.*"))
    ran = subprocess.run([python, "-I", "-c", "import json; print('ran')"], capture_output=True, text=True, check=False)
    assert ran.stdout.strip() == "ran", ran.stderr


# -- a release of the same tree: the install's own files only (#54) ------------------------------------

DAY2_TAG = f"vllm0.33.0-rocm{ROCM_VERSION}.day2-gfx1151"


def _same_tree_release(releases: Releases, built: Path, upstream: UpstreamServer, tmp_path: Path) -> str:
    """The new release's tree released again a day later under another tag (what a nightly with no
    change is): the same tar stream, so the same ``archive.tar_sha256``."""
    case = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{tmp_path.name}"
    date = json.loads((releases.new_dir / RELEASE_JSON).read_text())["source_date_epoch"] + 86400
    where = make_release(
        built / "gfx1151" / "root", upstream.root / "day2" / case / DAY2_TAG, DAY2_TAG, date, PART_SIZE
    )
    stream = json.loads((where / RELEASE_JSON).read_text())["archive"]["tar_sha256"]
    assert stream == json.loads((releases.new_dir / RELEASE_JSON).read_text())["archive"]["tar_sha256"]
    return f"{upstream.url}/day2/{case}/{DAY2_TAG}/"


def installed_copy(releases: Releases, tmp_path: Path) -> Path:
    """A copy of a full install of the new release, as ``cp -a`` makes it: modes, times and hard links kept."""
    dest = tmp_path / "vllm"
    subprocess.run(["cp", "-a", str(releases.installed_new), str(dest)], check=True)
    return dest


def test_a_release_of_the_same_tree_checks_every_file_and_writes_only_the_installs_own(
    releases: Releases, built: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """Over an install of the same tree (its recorded tar stream is the release's), every file is read
    and checked, no part is fetched, no staging tree is made: the install's own files are renamed into
    it, and it is what a full install of the new release gives."""
    url = _same_tree_release(releases, built, upstream, tmp_path)
    dest = installed_copy(releases, tmp_path)
    root = dest.stat().st_ino
    result = install(url, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{DAY2_TAG} is the tree of the installed {TAG}" in result.stdout, result.stdout
    assert "check the installed tree" in result.stderr, result.stderr
    assert part_requests(upstream, DAY2_TAG) == [], "no part fetched"
    assert dest.stat().st_ino == root, "in place: no staging tree swapped in"
    assert release_files(dest) == release_files(releases.installed_new)
    assert (dest / "version.txt").read_text() == DAY2_TAG
    day2 = url.removeprefix(upstream.url + "/")
    assert (dest / KEPT_TOC).read_bytes() == (upstream.root / day2 / ReleaseAssets(DAY2_TAG).toc).read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".vllm.")] == [".vllm.vllm-bundle.lock"]


def _file_touched(dest: Path) -> None:
    os.utime(dest / "bin" / "vllm-server", (1_700_000_000, 1_700_000_000))


def _byte_code_written(dest: Path) -> None:
    site = next(dest.glob("lib/python3*/site-packages"))
    (site / "vllm" / "__pycache__").mkdir(exist_ok=True)
    (site / "vllm" / "__pycache__" / "envs.cpython-311.pyc").write_bytes(b"written by a run")


def _file_made_private(dest: Path) -> None:
    (dest / "bin" / "vllm-server").chmod(0o700)


@pytest.mark.parametrize(
    "change", [_file_touched, _byte_code_written, _file_made_private], ids=["time", "file-more", "mode"]
)
def test_an_install_changed_since_is_not_taken_for_the_same_tree(
    change: Callable[[Path], None], releases: Releases, built: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """The same release tree over an install changed since (a file's time or mode, a file a run wrote):
    the check of the installed tree says no, and the update is a delta, which gives a full install's tree
    (the file more is gone, the time and mode are the release's)."""
    url = _same_tree_release(releases, built, upstream, tmp_path)
    dest = installed_copy(releases, tmp_path)
    change(dest)
    result = install(url, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is the tree of the installed" not in result.stdout and "delta from" in result.stdout, result.stdout
    assert release_files(dest) == release_files(releases.installed_new)
