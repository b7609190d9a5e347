"""``vllm-bundle install``: the fixture release from a loopback server, tampering, resume, idempotence."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from tests.conftest import HOST, REPO, TEST_REPO, assert_one_line_error, install, publish, run_cli, tree_digest
from tests.upstream.fixture import ROCM_VERSION
from tests.upstream.server import Fault, UpstreamServer
from vllm_bundle.install.installer import INSTALLERS_OWN, STREAM_FILE
from vllm_bundle.util.extract import safe_extract
from vllm_bundle.util.progress import human_size

TAG = f"vllm0.33.0-rocm{ROCM_VERSION}-gfx1151"
STEM = f"{TAG}-x64"


#: The machine `install` checks (its doctor's checks) is a Strix Halo that can run the gfx1151 bundle.
@pytest.fixture(scope="module")
def served(built: Path, _server: UpstreamServer) -> str:
    """The fixture release published under ``/releases/download/<tag>/`` on the loopback server."""
    return publish(built, _server)


def part_paths(upstream: UpstreamServer) -> list[str]:
    return [r.path for r in upstream.log if r.method == "GET" and ".part" in r.path and r.path.endswith(".tar.gz")]


def without_version(tree: dict[str, str]) -> dict[str, str]:
    """An install's tree without what the installer adds: version.txt, its own marker, the release's
    table of contents (kept for the next update, install/delta.py), glibc floor (doctor reads it) and tar
    stream sha256 (installer.INSTALLERS_OWN)."""
    return {name: digest for name, digest in tree.items() if name not in INSTALLERS_OWN}


def test_installs_the_release_and_again_does_nothing(
    served: str, upstream: UpstreamServer, built: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "opt" / "vllm"
    first = install(served, dest, tmp_path / "cache")
    assert first.returncode == 0, first.stdout + first.stderr
    assert (dest / "version.txt").read_bytes() == TAG.encode(), "the tag, no newline"
    assert without_version(tree_digest(dest)) == tree_digest(built / "gfx1151" / "root")
    count = int((built.parent / "bundles" / TAG / f"{STEM}.partcount").read_text())
    assert len(set(part_paths(upstream))) == count
    assert sorted(p.name for p in dest.parent.iterdir()) == [".vllm.vllm-bundle.lock", "vllm"], "no staging left behind"

    upstream.log.clear()
    inode = dest.stat().st_ino
    again = install(served, dest, tmp_path / "cache")
    assert again.returncode == 0, again.stderr
    assert "already installed" in again.stdout
    assert part_paths(upstream) == [] and dest.stat().st_ino == inode


def test_a_tampered_part_is_refused_with_nothing_changed(
    served: str, upstream: UpstreamServer, built: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "vllm"
    assert install(served, dest, tmp_path / "cache").returncode == 0
    (dest / "version.txt").write_text("vllm0.32.0-rocm7.13.0-gfx1151")  # an older install is in place
    before = tree_digest(dest)

    tampered = upstream.root / "tampered" / TAG
    shutil.copytree(built.parent / "bundles" / TAG, tampered)
    part = tampered / f"{STEM}.part02-of-{(tampered / f'{STEM}.partcount').read_text()}.tar.gz"
    data = bytearray(part.read_bytes())
    data[1000] ^= 0xFF  # same size, other bytes
    part.write_bytes(bytes(data))
    # The whole release (a delta over this install would need none of the part's bytes, and reads no
    # byte it does not check against the table: tests/test_delta.py)
    result = install(f"{upstream.url}/tampered/{TAG}/", dest, tmp_path / "fresh-cache", "--no-delta")
    assert_one_line_error(result, part.name, "sha256")
    assert tree_digest(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir() if "vllm" in p.name) == [".vllm.vllm-bundle.lock", "vllm"]
    bad = hashlib.sha256(data).hexdigest()
    cached = [p for p in (tmp_path / "fresh-cache").rglob("*") if p.is_file()]
    assert all(hashlib.sha256(p.read_bytes()).hexdigest() != bad for p in cached), "bad bytes were cached"


def test_a_cut_connection_is_resumed(served: str, upstream: UpstreamServer, built: Path, tmp_path: Path) -> None:
    first_part = sorted((built.parent / "bundles" / TAG).glob(f"{STEM}.part01-of-*.tar.gz"))[0]
    path = f"/releases/download/{TAG}/{first_part.name}"
    upstream.inject(path, Fault("cut", after=3_000_000))
    result = install(served, tmp_path / "vllm", tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    ranges = [r.range for r in upstream.requests_for(path)]
    assert ranges == [None, "bytes=3000000-"], ranges
    assert upstream.body_bytes(path) == first_part.stat().st_size, "only the remainder was fetched again"


def test_installs_from_backend_versions_json_and_a_target(served: str, built: Path, tmp_path: Path) -> None:
    pins = built.parent / "bundles" / TAG / "backend_versions.json"
    result = install(pins, tmp_path / "vllm", tmp_path / "cache", "--target", "gfx1151", "--mirror", served)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "vllm" / "version.txt").read_text() == TAG
    missing_target = install(pins, tmp_path / "other", tmp_path / "cache")
    assert_one_line_error(missing_target, "--target")


def test_a_release_for_another_target_is_refused(served: str, tmp_path: Path) -> None:
    result = install(served, tmp_path / "vllm", tmp_path / "cache", "--target", "gfx110X")
    assert_one_line_error(result, "is the gfx1151 release, not gfx110X")
    assert not (tmp_path / "vllm").exists()


def _install_auto(served: str, tmp_path: Path, detected: dict[str, str]):  # type: ignore[no-untyped-def]
    """``--target auto`` with rocm-bootstrap's own overrides standing in for the machine's GPUs."""
    return run_cli(
        *("install", served, "--dest", tmp_path / "vllm", "--cache-dir", tmp_path / "cache", "--target", "auto"),
        *HOST,
        env=detected,
    )


NO_GPU = {"ROCM_BOOTSTRAP_DISABLE_DETECTION": "1"}
DESKTOP_7900_XTX = {"ROCM_BOOTSTRAP_FORCE_GFX_ARCH": "gfx1100,gfx1036"}
STRIX_HALO = {"ROCM_BOOTSTRAP_FORCE_GFX_ARCH": "gfx1151"}


def test_target_auto_refuses_a_machine_without_an_amd_gpu(served: str, tmp_path: Path) -> None:
    assert_one_line_error(_install_auto(served, tmp_path, NO_GPU), "no supported AMD GPU found", "--target")


def test_target_auto_refuses_another_gpus_release(served: str, tmp_path: Path) -> None:
    result = _install_auto(served, tmp_path, DESKTOP_7900_XTX)
    assert_one_line_error(result, "is the gfx1151 release, not gfx110X")


def test_target_auto_installs_on_strix_halo(served: str, tmp_path: Path) -> None:
    result = _install_auto(served, tmp_path, STRIX_HALO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gfx1151 -> target gfx1151" in result.stdout


def test_release_json_must_match_partcount(served: str, upstream: UpstreamServer, built: Path, tmp_path: Path) -> None:
    broken = upstream.root / "short" / TAG
    shutil.copytree(built.parent / "bundles" / TAG, broken)
    doc = json.loads((broken / "release.json").read_text())
    doc["archive"]["parts"] = doc["archive"]["parts"][:-1]
    (broken / "release.json").write_text(json.dumps(doc))
    result = install(f"{upstream.url}/short/{TAG}/", tmp_path / "vllm", tmp_path / "cache")
    assert_one_line_error(result, "partcount says")


@pytest.mark.parametrize("count", ["00", "100", "x1"])
def test_a_partcount_outside_what_part_names_allow_is_one_line(count: str, built: Path, tmp_path: Path) -> None:
    """Part names have two digits (manifests.MAX_PARTS): a count of 0, of 100 or not a number is refused
    before any part is read."""
    release = Path(shutil.copytree(built.parent / "bundles" / TAG, tmp_path / TAG))
    (release / f"{STEM}.partcount").write_text(count + "\n")
    result = install(release, tmp_path / "vllm", tmp_path / "cache")
    assert_one_line_error(result, f"{STEM}.partcount holds '{count}', not a part count")
    assert not (tmp_path / "vllm").exists()


def test_installs_from_a_release_directory_without_network(
    built: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    upstream.log.clear()
    result = install(built.parent / "bundles" / TAG, tmp_path / "vllm", tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "vllm" / "version.txt").read_text() == TAG
    assert upstream.log == []


def test_a_newer_release_replaces_the_previous_install(built: Path, tmp_path: Path) -> None:
    dest, assets = tmp_path / "vllm", built.parent / "bundles" / TAG
    assert install(assets, dest, tmp_path / "cache").returncode == 0
    (dest / "version.txt").write_text("vllm0.32.0-rocm7.13.0-gfx1151")  # what an older release left
    (dest / "left-by-the-old-release").write_text("x")
    result = install(assets, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (dest / "version.txt").read_text() == TAG and not (dest / "left-by-the-old-release").exists()
    assert without_version(tree_digest(dest)) == tree_digest(built / "gfx1151" / "root")
    assert sorted(p.name for p in tmp_path.iterdir() if "vllm" in p.name) == [".vllm.vllm-bundle.lock", "vllm"]


def test_an_unwritable_destination_is_one_line(built: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = install(built.parent / "bundles" / TAG, blocker / "vllm", tmp_path / "cache")
    assert_one_line_error(result, "cannot install into", "--dest")


# -- a hostile release, a killed run, odd destinations (#21) ----------------------------------------------


def release_dir(built: Path, where: Path, release: dict[str, Any] | None = None) -> Path:
    """The fixture release as a directory of links to its assets; ``release`` replaces its release.json."""
    where.mkdir(parents=True)
    for asset in (built.parent / "bundles" / TAG).iterdir():
        (where / asset.name).symlink_to(asset)
    if release is not None:
        (where / "release.json").unlink()
        (where / "release.json").write_text(json.dumps(release))
    return where


def release_doc(built: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((built.parent / "bundles" / TAG / "release.json").read_text())
    return doc


def pins_doc(built: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((built.parent / "bundles" / TAG / "backend_versions.json").read_text())
    return doc


FIRST = "<the first key>"  # in a key path: the dict's first key (the first part of a checksum list)
CHOSEN = "<an absolute path>"  # as a value: a directory under the test's tmp_path


def _put(doc: dict[str, Any], keys: tuple[str | int, ...], value: object) -> None:
    """``doc`` with the field at ``keys`` (list indices as numbers, ``FIRST`` for a dict's first key) set."""
    node: Any = doc
    for key in keys[:-1]:
        node = node[sorted(node)[0] if key == FIRST else key]
    node[sorted(node)[0] if keys[-1] == FIRST else keys[-1]] = value


@pytest.mark.parametrize(
    ("keys", "value", "named"),
    [
        (("target",), "../../elsewhere", "release.json: target"),
        (("target",), CHOSEN, "release.json: target"),
        (("target",), "gfx9999", "release.json: target"),
        (("target",), ["gfx1151"], "release.json: target"),
        (("tag",), "../../x", "release.json: tag"),
        (("tag",), "a/b", "release.json: tag"),
        (("tag",), "a\x00b", "release.json: tag"),
        (("archive",), [], "release.json: archive"),
        (("archive", "parts", 0), "a part", "release.json: archive.parts[0]"),
        (("archive", "parts", 0, "sha256"), 5, "release.json: archive.parts[0].sha256"),
        (("archive", "parts", 0, "sha256"), "../../x", "release.json: archive.parts[0].sha256"),
        (("archive", "parts", 1, "size"), -1, "release.json: archive.parts[1].size"),
        (("archive", "parts", 1, "size"), "big", "release.json: archive.parts[1].size"),
        (("archive", "parts", 1, "size"), True, "release.json: archive.parts[1].size"),
        (("archive", "sha256"), 5, "release.json: archive.sha256"),
        (("archive", "sha256"), "../../x", "release.json: archive.sha256"),
    ],
)
def test_a_bad_release_json_field_is_one_line_naming_it(
    built: Path, tmp_path: Path, keys: tuple[str | int, ...], value: object, named: str
) -> None:
    """Whatever release.json says, nothing lands where its author chose: without --dest the install
    directory is named after the release's target, which must be one of the target table's names."""
    doc = release_doc(built)
    _put(doc, keys, str(tmp_path / "chosen") if value == CHOSEN else value)
    assets = release_dir(built, tmp_path / "release", doc)
    data = tmp_path / "data"
    result = run_cli(
        *("install", assets, "--cache-dir", tmp_path / "cache", "--plain"), env={"XDG_DATA_HOME": str(data)}
    )
    assert_one_line_error(result, f"{assets / 'release.json'}: ", named)
    assert {p.name for p in tmp_path.iterdir()} <= {"cache", "release"}, "nothing installed anywhere"


@pytest.mark.parametrize(
    ("keys", "value", "named"),
    [
        (("vllm", "rocm"), "../../x", "vllm.rocm"),
        (("vllm", "rocm"), "a/b", "vllm.rocm"),
        (("vllm",), ["x"], "vllm is an array"),
        (("checksums", "github"), [], "checksums.github is an array"),
        (("checksums", "github", TEST_REPO), "x", f"checksums.github.{TEST_REPO} is a string"),
        (("checksums", "github", TEST_REPO, TAG), 5, f"checksums.github.{TEST_REPO}.{TAG} is a number"),
        (("checksums", "github", TEST_REPO, TAG, FIRST), 5, f"checksums.github.{TEST_REPO}.{TAG}.{STEM}.part01-"),
        (("checksums", "github", TEST_REPO, TAG, FIRST), "sha256:../../x", f"{TAG}.{STEM}.part01-"),
    ],
)
def test_a_bad_backend_versions_field_is_one_line_naming_it(
    built: Path, tmp_path: Path, keys: tuple[str | int, ...], value: object, named: str
) -> None:
    """Each field used is checked: one line naming the file and the field, never a traceback."""
    doc = pins_doc(built)
    _put(doc, keys, value)
    pins = tmp_path / "backend_versions.json"
    pins.write_text(json.dumps(doc))
    assets = built.parent / "bundles" / TAG
    result = install(pins, tmp_path / "vllm", tmp_path / "cache", "--target", "gfx1151", "--mirror", assets)
    assert_one_line_error(result, "backend_versions.json", named)
    assert not (tmp_path / "vllm").exists()


def test_a_checksum_naming_a_user_file_touches_nothing_outside_the_cache(built: Path, tmp_path: Path) -> None:
    """A checksum is a cache path: ``../../victim`` in either manifest would have the cache re-hash the
    user's file, find it wrong and delete it (or write a download over ``victim.part``)."""
    cache = tmp_path / "cache"
    (cache / "blobs" / "sha256").mkdir(parents=True)
    (cache / "partial").mkdir()
    victims = {tmp_path / "victim": b"precious", tmp_path / "victim.part": b"precious too"}
    for path, data in victims.items():
        path.write_bytes(data)

    pins = pins_doc(built)
    pins["checksums"]["github"][TEST_REPO][TAG][f"{STEM}.part01-of-05.tar.gz"] = "sha256:../../victim"
    (tmp_path / "backend_versions.json").write_text(json.dumps(pins))
    assets = built.parent / "bundles" / TAG
    from_pins = install(
        tmp_path / "backend_versions.json", tmp_path / "vllm", cache, "--target", "gfx1151", "--mirror", assets
    )
    assert_one_line_error(from_pins, "backend_versions.json", f"checksums.github.{TEST_REPO}.{TAG}.", "sha256")

    doc = release_doc(built)
    doc["archive"]["parts"][0].update(sha256="../../victim", size=len(b"precious"))
    from_release = install(release_dir(built, tmp_path / "release", doc), tmp_path / "vllm", cache)
    assert_one_line_error(from_release, "release.json: archive.parts[0].sha256")
    assert {path: path.read_bytes() for path in victims} == victims, "the user's files are untouched"
    assert not (tmp_path / "vllm").exists()


def test_the_installed_root_is_readable_by_everyone(built: Path, tmp_path: Path) -> None:
    """Other users run the install: its root has the archive's top directory's mode (0755), not 0700."""
    dest = tmp_path / "vllm"
    result = install(built.parent / "bundles" / TAG, dest, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755


def test_a_plain_install_shows_the_extraction_progress(built: Path, tmp_path: Path) -> None:
    """After the downloads, the extraction has a begin and an end line (its size: the parts' total), as
    a download has; no line per MiB read in between."""
    assets = built.parent / "bundles" / TAG
    total = sum(part.stat().st_size for part in assets.glob(f"{STEM}.part*.tar.gz"))
    result = install(assets, tmp_path / "vllm", tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    about = [number for number, line in enumerate(lines) if f"extract {TAG}" in line]
    assert [lines[number] for number in about[:1]] == [f"extract {TAG} ({human_size(total)})"], lines
    assert len(about) == 2 and lines[about[1]].startswith(f"done   extract {TAG} ({human_size(total)} in "), lines
    downloads = [number for number, line in enumerate(lines) if line.startswith(f"done   {STEM}.part")]
    assert len(downloads) == int((assets / f"{STEM}.partcount").read_text()), lines
    assert max(downloads) < about[0], "the extraction comes after every download"


def _generated_release(where: Path, directories: int, files: int, parts: int) -> tuple[list[Path], str]:
    """A release archive of ``directories`` x ``files`` tiny files under a ``./`` of mode 0750, cut into
    ``parts`` parts; with the whole archive's sha256."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as archive:
        top = tarfile.TarInfo(".")
        top.type, top.mode = tarfile.DIRTYPE, 0o750
        archive.addfile(top)
        for directory in range(directories):
            folder = tarfile.TarInfo(f"./pkg{directory}")
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(folder)
            for number in range(files):
                data = f"x = {number}\n".encode()
                entry = tarfile.TarInfo(f"./pkg{directory}/mod{number}.py")
                entry.size, entry.mode = len(data), 0o644
                archive.addfile(entry, io.BytesIO(data))
    whole = buffer.getvalue()
    cut = -(-len(whole) // parts)
    paths = []
    for index in range(parts):
        path = where / f"archive.part{index + 1:02d}-of-{parts:02d}.tar.gz"
        path.write_bytes(whole[index * cut : (index + 1) * cut])
        paths.append(path)
    return paths, hashlib.sha256(whole).hexdigest()


def _members_at_entries(where: Path, entries: int) -> tuple[list[Path], str]:
    """An archive of ``entries`` files written as one gzip member per entry (tar header and data), the
    end-of-archive blocks in a member of their own, in two parts; with the whole archive's sha256. GNU tar
    and gzip read such a stream as one (RFC 1952 2.2: a gzip file is a series of members)."""
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for number in range(entries):
            data = f"x = {number}\n".encode()
            entry = tarfile.TarInfo(f"./mod{number}.py")
            entry.size, entry.mode = len(data), 0o644
            archive.addfile(entry, io.BytesIO(data))
    raw = tar.getvalue()
    cuts = [1024 * number for number in range(entries + 1)]  # a header block and a data block each
    pieces = [raw[start:end] for start, end in zip(cuts, [*cuts[1:], len(raw)], strict=True)]
    whole = b"".join(gzip.compress(piece, mtime=0) for piece in pieces)
    paths = [where / "archive.part01-of-02.tar.gz", where / "archive.part02-of-02.tar.gz"]
    paths[0].write_bytes(whole[: len(whole) // 2])
    paths[1].write_bytes(whole[len(whole) // 2 :])
    return paths, hashlib.sha256(whole).hexdigest()


def test_an_archive_of_many_gzip_members_is_extracted_whole(tmp_path: Path) -> None:
    """tarfile's ``r|gz`` stops at the end of the first gzip member, and where that member ends at an
    entry's end it reads the rest as the end of the archive: the install would have the first file only,
    with every part's and the whole archive's sha256 right. Every member is read, as GNU tar reads it."""
    from vllm_bundle.util.parts import extract_parts

    paths, digest = _members_at_entries(tmp_path, entries=5)
    extract_parts(paths, tmp_path / "root", "generated", digest)
    assert sorted(path.name for path in (tmp_path / "root").iterdir()) == [f"mod{n}.py" for n in range(5)]
    assert (tmp_path / "root" / "mod4.py").read_text() == "x = 4\n"
    gnu = tmp_path / "gnu"
    gnu.mkdir()
    joined = tmp_path / "joined.tar.gz"
    joined.write_bytes(b"".join(path.read_bytes() for path in paths))
    subprocess.run(["tar", "-xzf", joined, "-C", gnu], check=True)
    assert sorted(path.name for path in gnu.iterdir()) == [f"mod{n}.py" for n in range(5)], "GNU tar: the same"


def test_extraction_keeps_no_list_of_the_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tarfile keeps every entry it reads in ``members``: a real bundle's hundreds of thousands of files
    would grow the installer's memory with their count. The list stays (near) empty as entries stream by,
    and the top directory's mode still reaches the install's root."""
    import vllm_bundle.util.parts as installer

    paths, digest = _generated_release(tmp_path, directories=20, files=250, parts=3)
    kept: list[int] = []

    def watched_extract(archive: tarfile.TarFile, dest: Path, source: str, **options: Any) -> int:
        def select(name: str, member: tarfile.TarInfo) -> bool:
            kept.append(len(archive.members))  # type: ignore[attr-defined]
            return True

        return safe_extract(archive, dest, source, select=select, **options)

    monkeypatch.setattr(installer, "safe_extract", watched_extract)
    dest = tmp_path / "root"
    installer.extract_parts(paths, dest, "generated", digest)
    assert len(kept) == 20 + 20 * 250, "every entry went through the extraction"
    assert max(kept) <= 1, f"tarfile kept up to {max(kept)} entries in memory"
    assert (dest / "pkg19" / "mod249.py").read_text() == "x = 249\n"
    assert sum(1 for _ in dest.rglob("*.py")) == 20 * 250
    assert stat.S_IMODE(dest.stat().st_mode) == 0o750, "the archive's top directory's mode"


def test_rich_extraction_progress_stays_out_of_the_download_total(tmp_path: Path) -> None:
    """On a terminal the extraction has its own bar on the download's display: the total bar counts
    downloads only."""
    from rich.console import Console

    from vllm_bundle.util.parts import extract_parts
    from vllm_bundle.util.progress import RichReporter

    paths, digest = _generated_release(tmp_path, directories=2, files=10, parts=2)
    screen = io.StringIO()
    reporter = RichReporter(Console(file=screen, force_terminal=True, width=120), 1000)
    with reporter:
        extract_parts(paths, tmp_path / "root", "generated", digest, reporter)
        total = reporter.progress.tasks[0]
        assert total.description == "[bold]total" and total.completed == 0
        assert len(reporter.progress.tasks) == 1, "the extraction's bar is gone once it is done"
    assert "done extract generated" in screen.getvalue()


def test_an_impossible_destination_fails_at_once(built: Path, tmp_path: Path) -> None:
    """/proc takes no lock file: one line at once, not a lock retried forever."""
    result = run_cli(
        *("install", built.parent / "bundles" / TAG, "--dest", "/proc/x", "--cache-dir", tmp_path / "cache"),
        *HOST,
        timeout=20,
    )
    assert_one_line_error(result, "cannot install into /proc/x", "--dest")


def _wait_for(path: Path, text: str, process: subprocess.Popen[str], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while text not in path.read_text():
        assert process.poll() is None, path.read_text()
        assert time.monotonic() < deadline, f"{text!r} never came: {path.read_text()!r}"
        time.sleep(0.1)


def marked(directory: Path, marker: str = ".vllm-bundle-staging") -> Path:
    """A directory as an install of ours leaves it: a file in it, and the marker."""
    (directory / "bin").mkdir(parents=True)
    (directory / "bin" / "something").write_text("x")
    (directory / marker).write_text("")
    return directory


def test_a_second_install_waits_for_the_first_and_leaves_its_staging_alone(built: Path, tmp_path: Path) -> None:
    """Another install holds the destination's lock: this one says it waits, and removes nothing of the
    other's (its staging directory) until the lock is free; then it takes over what a killed holder left."""
    dest = tmp_path / "vllm"
    live = marked(tmp_path / ".vllm.staging-live0001")
    out = tmp_path / "out.txt"
    with FileLock(str(tmp_path / ".vllm.vllm-bundle.lock")), out.open("w") as sink:
        waiting = subprocess.Popen(
            [
                *(sys.executable, "-m", "vllm_bundle", "install", str(built.parent / "bundles" / TAG)),
                *("--dest", str(dest), "--cache-dir", str(tmp_path / "cache"), "--plain", *HOST),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            _wait_for(out, "waiting", waiting)
            time.sleep(1)
            assert live.exists() and not dest.exists(), "nothing done while the other install runs"
        except BaseException:
            waiting.kill()
            raise
    assert waiting.wait(timeout=300) == 0, out.read_text()
    assert "another install into" in out.read_text()
    assert (dest / "version.txt").read_text() == TAG
    assert not live.exists(), "the holder is gone: its leftover is removed"


def test_an_install_leaves_a_like_named_destinations_staging_alone(built: Path, tmp_path: Path) -> None:
    """`v[1]` is not a pattern: installing there leaves a live install into `v1` alone (#21.10)."""
    others = marked(tmp_path / ".v1.staging-live0001")
    own = marked(tmp_path / ".v[1].staging-dead0001")
    with FileLock(str(tmp_path / ".v1.vllm-bundle.lock")):  # the install into v1 is running
        result = install(built.parent / "bundles" / TAG, tmp_path / "v[1]", tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert others.exists(), "another destination's staging"
    assert not own.exists(), "this destination's leftover, from a killed run"


KILLED_AT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import vllm_bundle.install.installer as install

    def die(*args):
        os.kill(os.getpid(), signal.SIGKILL)

    hook = sys.argv.pop(1)
    if hook == "before-swap":
        install.swap_into_place = die
    elif hook == "after-exchange":
        exchange = install._rename_exchange
        install._rename_exchange = lambda first, second: exchange(first, second) and die()
    elif hook == "between-renames":  # no RENAME_EXCHANGE (NFS): the fallback swap, killed half way
        install._rename_exchange = lambda first, second: False
        rename = Path.rename
        Path.rename = lambda self, target: die() if ".staging-" in self.name else rename(self, target)
    from vllm_bundle.cli import main
    sys.exit(main(sys.argv[1:]))
""")

OLDER = "vllm0.32.0-rocm7.13.0-gfx1151"


def as_older_install(dest: Path) -> None:
    """The install at ``dest`` made to look like an older release's: another tag, and no tar stream
    recorded (an older tree's would differ), so an install over it writes a new tree and swaps it in."""
    (dest / "version.txt").write_text(OLDER)
    (dest / STREAM_FILE).unlink()


def killed_install(hook: str, source: Path, dest: Path, cache: Path) -> None:
    """An install of ``source`` SIGKILLed at ``hook``."""
    command = [sys.executable, "-c", KILLED_AT, hook, "install", str(source), "--dest", str(dest)]
    result = subprocess.run(
        [*command, "--cache-dir", str(cache), "--plain", *HOST],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr


def ours_beside(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.") and p.is_dir())


@pytest.mark.parametrize("hook", ["before-swap", "after-exchange"])
def test_what_an_install_killed_at_the_swap_leaves_is_removed_by_the_next(
    built: Path, tmp_path: Path, hook: str
) -> None:
    assets, dest, cache = built.parent / "bundles" / TAG, tmp_path / "vllm", tmp_path / "cache"
    assert install(assets, dest, cache).returncode == 0
    as_older_install(dest)
    killed_install(hook, assets, dest, cache)
    left = [tmp_path / name for name in ours_beside(dest)]
    assert left, "the killed run left its staging (or the previous install) behind"
    empty = tmp_path / ".vllm.staging-empty001"  # killed between making the staging and marking it
    empty.mkdir()
    previous = marked(tmp_path / ".vllm.previous-older001", ".vllm-bundle-install")
    not_ours = tmp_path / ".vllm.staging-usermade"
    not_ours.mkdir()
    (not_ours / "mine.txt").write_text("no marker: not ours")

    again = install(assets, dest, cache)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (dest / "version.txt").read_text() == TAG
    assert not any(path.exists() for path in left), "what the killed run left is gone"
    assert not previous.exists() and not empty.exists()
    assert ours_beside(dest) == [not_ours.name], "every leftover of ours is gone, the user's folder stays"


def test_a_fallback_swap_killed_between_its_renames_is_rolled_back_by_the_next_run(built: Path, tmp_path: Path) -> None:
    """Without RENAME_EXCHANGE the swap is two renames; killed between them, no install is in place. The
    next run puts the previous one back first, so a rerun that fails still leaves the old install."""
    assets, dest, cache = built.parent / "bundles" / TAG, tmp_path / "vllm", tmp_path / "cache"
    assert install(assets, dest, cache).returncode == 0
    as_older_install(dest)
    before = tree_digest(dest)
    killed_install("between-renames", assets, dest, cache)
    assert not dest.exists(), "the kill state: the old install renamed away, the new one not yet in place"

    broken = tmp_path / "broken"  # a release.json and nothing else: the rerun fails once it holds the lock
    broken.mkdir()
    (broken / "release.json").symlink_to(assets / "release.json")
    failed = install(broken, dest, cache)
    assert_one_line_error(failed, "partcount")
    assert tree_digest(dest) == before, "the previous install is back"
    assert ours_beside(dest) == []

    killed_install("between-renames", assets, dest, cache)
    again = install(assets, dest, cache)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (dest / "version.txt").read_text() == TAG and ours_beside(dest) == []


# -- the consumer's command, installed alone --------------------------------------------------------------

BUILD_ONLY_MODULES = ("uv", "unidiff", "installer", "elftools", "zlib_ng", "tomli_w")


def _run(*command: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(map(str, command)), cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding this package's wheel and its runtime dependencies as uv.lock pins them, nothing of
    the build extra: what `pip install vllm-bundle` gives an installer. Built from a copy of the sources
    (the wheel build writes build/ beside them), with no network (uv's cache from the nox session)."""
    import uv

    work = tmp_path_factory.mktemp("consumer")
    source = work / "source"
    shutil.copytree(
        REPO,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(".git", ".nox", "build", "bundles", "*.egg-info", "__pycache__", ".*_cache"),
    )
    tool = uv.find_uv_bin()
    _run(tool, "build", "--no-build-isolation", "--python", sys.executable, "--wheel", "-o", work / "dist", source)
    pins = work / "pylock.toml"
    _run(
        tool,
        "export",
        "--frozen",
        "--no-dev",
        "--no-default-groups",
        "--no-emit-project",
        "--format",
        "pylock.toml",
        "-o",
        pins,
        "--project",
        source,
    )
    _run(tool, "venv", "--quiet", "--python", sys.executable, work / "venv")
    python = work / "venv" / "bin" / "python"
    _run(tool, "pip", "install", "--quiet", "--offline", "--python", python, "-r", pins)
    (wheel,) = (work / "dist").glob("vllm_bundle-*.whl")
    _run(tool, "pip", "install", "--quiet", "--offline", "--no-deps", "--python", python, wheel)
    return work / "venv"


def test_the_consumer_venv_has_no_build_dependency(consumer: Path) -> None:
    probe = f"import importlib.util as u; print([m for m in {BUILD_ONLY_MODULES!r} if u.find_spec(m)])"
    assert _run(consumer / "bin" / "python", "-c", probe).stdout.strip() == "[]"
    packaged = "from vllm_bundle.paths import default_rocm_fixes as d; print(sorted(p.name for p in d().iterdir()))"
    listed = _run(consumer / "bin" / "python", "-c", packaged).stdout
    assert "'rtld-local.patch'" in listed and "'series'" in listed, "tier 0 reads the SDK fixes from the wheel"


def test_install_runs_from_any_directory_with_the_package_alone(
    consumer: Path, served: str, built: Path, tmp_path: Path
) -> None:
    """From a directory with no recipes in it: `--target auto` refuses in one line on a machine without
    an AMD GPU, and a named target installs the release, reading the packaged target table."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), **NO_GPU}
    command = [str(consumer / "bin" / "vllm-bundle"), "install", served, "--cache-dir", str(tmp_path / "cache"), *HOST]

    def install_from_elsewhere(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *extra], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)

    refused = install_from_elsewhere("--target", "auto", "--dest", str(tmp_path / "auto"))
    assert_one_line_error(refused, "no supported AMD GPU found", "--target")
    assert "no recipes directory" not in refused.stderr
    installed = install_from_elsewhere("--target", "gfx1151", "--dest", str(tmp_path / "vllm"), "--plain")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert without_version(tree_digest(tmp_path / "vllm")) == tree_digest(built / "gfx1151" / "root")
