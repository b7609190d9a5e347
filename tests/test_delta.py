"""Updates that download only what changed (#34): ``install`` over a previous install re-uses the chunks
it has, fetches the gzip members it lacks with HTTP Range, and installs what a full install would; where
a delta cannot be done safely it downloads the whole release, and a release that is wrong is refused with
the previous install intact."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PART_SIZE, assert_one_line_error, publish, tree_digest
from tests.releases import make_release, toc_field
from tests.test_install import TAG, install
from tests.upstream.fixture import ROCM_VERSION
from tests.upstream.server import Fault, UpstreamServer
from vllm_bundle.install.delta import KEPT_TOC
from vllm_bundle.manifests import RELEASE_JSON, ReleaseAssets

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


#: What the installer writes beside the release's files, at the time it installs.
INSTALLERS_OWN = frozenset({"version.txt", ".vllm-bundle-install", ".vllm-bundle-glibc", KEPT_TOC})


def tree_with_times(root: Path) -> dict[str, tuple[str, int]]:
    """Every entry with its contents and mode (tree_digest) and the release's files' modification times."""
    return {
        name: (digest, 0 if digest.startswith("->") or name in INSTALLERS_OWN else int((root / name).lstat().st_mtime))
        for name, digest in tree_digest(root).items()
    }


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
    assert tree_with_times(dest) == tree_with_times(releases.installed_new), "what a full install gives"
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
    assert tree_with_times(dest) == tree_with_times(releases.installed_new)


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
    assert tree_with_times(dest) == tree_with_times(releases.installed_new)


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
    assert tree_with_times(dest) == tree_with_times(releases.installed_new)


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
    deadline, written = time.monotonic() + 45, False  # (the client's read timeout is 60 s)
    while installing.is_alive() and not written and time.monotonic() < deadline:
        written = any((d / "bin" / "vllm-server").is_file() for d in tmp_path.glob(".vllm.*"))
        time.sleep(0.02)
    held = len(part_requests(upstream))
    answers.set()
    installing.join(timeout=300)
    (result,) = done
    assert result.returncode == 0, result.stdout + result.stderr
    assert held, "the update asked for what changed before the tree was written"
    assert written, "no re-used file was written while every Range answer was held back"
    assert "delta from" in result.stdout and all(header is not None for header, _ in part_requests(upstream))
    assert tree_with_times(dest) == tree_with_times(releases.installed_new)


# -- where a delta cannot be done: the whole release ---------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        (Fault("ignore-range", times=None), "HTTP 200, not 206"),
        (Fault("wrong-range", times=1), "does not match"),
    ],
    ids=["server-ignores-range", "range-with-other-bytes"],
)
def test_a_server_that_does_not_answer_the_range_gets_the_full_download(
    fault: Fault, why: str, releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    dest = previous(releases, tmp_path)
    new = sorted(releases.new_dir.glob(f"{ASSETS.stem}.part*.tar.gz"))
    for part in new:
        upstream.inject(f"/releases/download/{TAG}/{part.name}", fault)
    result = install(releases.new, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "downloading the whole release" in line]
    assert why in line
    assert tree_with_times(dest) == tree_with_times(releases.installed_new)


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
    assert tree_with_times(tmp_path / "vllm") == tree_with_times(releases.installed_new)


def test_a_previous_install_without_a_table_gets_the_full_download(
    releases: Releases, upstream: UpstreamServer, tmp_path: Path
) -> None:
    dest = previous(releases, tmp_path)
    (dest / KEPT_TOC).unlink()  # as an install of an earlier version of this tool left it
    result = install(releases.new, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "keeps no table of contents" in result.stdout
    assert tree_with_times(dest) == tree_with_times(releases.installed_new)


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


@pytest.mark.parametrize(
    ("lie", "why"),
    [
        (_beyond_the_archive, "is not a member's"),
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
    dest = previous(releases, tmp_path)
    result = install(f"{upstream.url}/lying/{case}/{TAG}/", dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "downloading the whole release" in line]
    assert why in line
    installed, expected = tree_with_times(dest), tree_with_times(releases.installed_new)
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
    assert tree_with_times(dest) == tree_with_times(releases.installed_new)


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
    from vllm_bundle.util.progress import RichReporter
    from vllm_bundle.util.transport import RetryPolicy

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
    assert tree_with_times(dest) == tree_with_times(releases.installed_new)


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
