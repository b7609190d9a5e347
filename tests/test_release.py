"""Release assets: names, parts, manifests, SBOM, extraction as Lemonade does it, reproducibility."""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import itertools
import json
import os
import shutil
import stat
import subprocess
import time
from datetime import datetime
from pathlib import Path
from random import Random
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from zlib_ng import zlib_ng as zlib_ng_core

from tests.conftest import (
    PART_SIZE,
    TEST_REPO,
    assert_one_line_error,
    bundle_args,
    run_cli,
)
from tests.upstream.fixture import ROCM_VERSION, VLLM_BUILT_VERSION
from tests.upstream.server import UpstreamServer
from vllm_bundle.manifests import DEFAULT_PART_SIZE, ReleaseAssets, part_name, pinned_tag
from vllm_bundle.qualify.repro import first_difference
from vllm_bundle.release.archive import CHUNK_AVG, CHUNK_MAX, CHUNK_MIN, MEMBER_SIZE, write_archive
from vllm_bundle.release.assets import archive_assets, default_repo
from vllm_bundle.toc import FORMAT, VERSION
from vllm_bundle.util import gzip_members
from vllm_bundle.util.fsutil import sha256_file
from vllm_bundle.util.parts import read_archive
from vllm_bundle.util.tarstream import RELEASED_MTIME, stream_sha256

TAG = f"vllm0.33.0-rocm{ROCM_VERSION}-gfx1151"
STEM = f"{TAG}-x64"


@pytest.fixture(scope="module")
def assets(built: Path) -> Path:
    return built.parent / "bundles" / TAG


def parts_of(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"{STEM}.part*-of-*.tar.gz"))


def test_asset_names_and_parts(assets: Path) -> None:
    parts = parts_of(assets)
    count = len(parts)
    assert count > 1, "the fixture bundle spans several parts at the test part size"
    assert [p.name for p in parts] == [f"{STEM}.part{n:02d}-of-{count:02d}.tar.gz" for n in range(1, count + 1)]
    assert (assets / f"{STEM}.partcount").read_text() == f"{count:02d}"
    assert all(p.stat().st_size <= PART_SIZE for p in parts)
    assert all(p.stat().st_size == PART_SIZE for p in parts[:-1]), "only the last part is short"
    assert "+" not in TAG


def test_parts_concatenate_to_one_gzip_tarball(assets: Path) -> None:
    listing = subprocess.run(
        f"cat {' '.join(map(str, parts_of(assets)))} | tar -tzf -",
        shell=True,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert listing[0] == "./"
    assert all(name.startswith("./") for name in listing)
    assert listing == sorted(listing, key=lambda n: n.rstrip("/")), "entries in sorted order"
    release = json.loads((assets / "release.json").read_text())
    whole = hashlib.sha256(b"".join(p.read_bytes() for p in parts_of(assets))).hexdigest()
    assert release["archive"]["sha256"] == whole
    first = parts_of(assets)[0].read_bytes()[:10]
    assert first[3] == 0 and first[4:8] == b"\0\0\0\0", "gzip header: no file name, mtime 0"


def test_archive_members_are_normalised(assets: Path) -> None:
    release = json.loads((assets / "release.json").read_text())
    with read_archive(parts_of(assets)) as (archive, _, _):
        members = list(archive)
    for member in members:
        assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "", "")
        assert member.mtime == RELEASED_MTIME, "one time whatever the source date (#54)"
        if member.isdir():
            assert member.mode == 0o755
        elif member.isreg():
            assert member.mode in (0o755, 0o644)
    assert release["source_date_epoch"] != RELEASED_MTIME, "the release's date is its manifest's, not its files'"
    modes = {m.name: m.mode for m in members}
    assert modes["./bin/vllm-server"] == 0o755
    assert any(m.issym() for m in members), "symlinks are kept"
    hidden = [m.name for m in members if "/.kpack/" in m.name]
    assert hidden, "hidden device code is in the archive"


def _tree_files(root: Path) -> dict[str, Path]:
    """Every regular file of a tree by its TOC name (a second name of an inode is a hard link)."""
    seen: set[tuple[int, int]] = set()
    files = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            files[path.relative_to(root).as_posix()] = path
    return files


def test_the_toc_locates_every_chunk_of_every_file_in_independent_gzip_members(assets: Path, built: Path) -> None:
    """The archive is a series of gzip members that its TOC lists back to back, each of which inflates
    alone; each chunk the TOC names is at its place in its member's bytes, has its sha256, and is that
    file's bytes at its offset; the chunks of a file cover it in order, from its start to its end."""
    whole = b"".join(part.read_bytes() for part in parts_of(assets))
    toc = json.loads(gzip.decompress((assets / f"{STEM}.toc.json.gz").read_bytes()))
    assert (toc["format"], toc["version"]) == (FORMAT, VERSION)
    members = toc["members"]
    assert len(members) > 1 and members[0][0] == 0
    assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(members)), "back to back"
    assert members[-1][0] + members[-1][1] == len(whole), "and nothing after the last"
    inflated = {offset: gzip.decompress(whole[offset : offset + size]) for offset, size, _ in members}
    assert [len(inflated[offset]) for offset, _, _ in members] == [size for _, _, size in members]
    root = built / "gfx1151" / "root"
    files = _tree_files(root)
    covered: dict[str, int] = {}
    for entry in toc["entries"]:
        if entry["type"] not in ("reg", "chunk") or "chunkSize" not in entry:
            continue
        data = inflated[entry["offset"]][entry["innerOffset"] : entry["innerOffset"] + entry["chunkSize"]]
        assert entry["chunkDigest"] == "sha256:" + hashlib.sha256(data).hexdigest(), entry
        with files[entry["name"]].open("rb") as handle:
            handle.seek(entry["chunkOffset"])
            assert handle.read(entry["chunkSize"]) == data, entry
        assert covered.get(entry["name"], 0) == entry["chunkOffset"], "in order, without a gap"
        covered[entry["name"]] = entry["chunkOffset"] + entry["chunkSize"]
    regular = {entry["name"]: entry for entry in toc["entries"] if entry["type"] == "reg"}
    assert set(regular) == set(files), "every file once; a second name is a hard link"
    for name, path in files.items():
        assert covered.get(name, 0) == regular[name]["size"] == path.stat().st_size, name
        assert "digest" not in regular[name], "a file is its chunks: each is checked, so the file is"
    kinds = {entry["type"] for entry in toc["entries"]}
    assert {"dir", "symlink", "chunk"} <= kinds, kinds
    assert any(len(inflated[offset]) > MEMBER_SIZE for offset, _, _ in members), "members group chunks"


def test_the_chunked_archive_is_at_most_4_percent_larger_than_one_gzip_stream(assets: Path) -> None:
    """Each member starts from an empty dictionary; against the same tar stream as one gzip stream at the
    same level (what the archive was until #34), the cost stays within 4 %."""
    whole = b"".join(part.read_bytes() for part in parts_of(assets))
    one_stream = zlib_ng_core.compress(gzip.decompress(whole), 6, wbits=31)
    assert len(whole) <= 1.04 * len(one_stream), (len(whole), len(one_stream))


def test_lemonade_style_extraction(assets: Path, tmp_path: Path) -> None:
    """One name a line (setuptools, which the bundle ships, has files such as ``script (dev).tmpl``)."""
    archive = tmp_path / "download.tar.gz"
    with archive.open("wb") as out:
        for part in parts_of(assets):
            out.write(part.read_bytes())
    names = subprocess.run(["tar", "-tf", str(archive)], capture_output=True, text=True, check=True).stdout.splitlines()
    tops = {name.split("/")[0] for name in names}
    strip = 1 if len(tops) == 1 else 0
    assert strip == 1, "every entry shares one top directory ('./')"
    staging = tmp_path / "staging"
    staging.mkdir()
    subprocess.run(
        ["tar", "-xf", str(archive), "-C", str(staging), f"--strip-components={strip}", "--no-same-owner"],
        check=True,
        timeout=300,
    )
    servers = [p for p in staging.rglob("vllm-server") if p.is_file() and not p.is_symlink()]
    assert servers == [staging / "bin" / "vllm-server"]
    assert os.access(servers[0], os.X_OK)
    report = json.loads(
        subprocess.run(
            [str(servers[0]), "--model", "m"], env={}, capture_output=True, text=True, check=True, timeout=60
        ).stdout
    )
    assert report["hip_check"] == 17 and report["executable"].startswith(str(staging))


def test_manifests(assets: Path) -> None:
    release = json.loads((assets / "release.json").read_text())
    parts = parts_of(assets)
    assert release["tag"] == TAG and release["target"] == "gfx1151" and release["channel"] == "stable"
    assert release["versions"]["vllm"] == VLLM_BUILT_VERSION, "vLLM's local version part is kept here"
    assert release["versions"]["rocm"] == ROCM_VERSION
    assert set(release["versions"]) == {"python", "rocm", "torch", "torchvision", "triton", "vllm"}
    assert len(release["lock_sha256"]) == 64
    assert [p["name"] for p in release["archive"]["parts"]] == [p.name for p in parts]
    assert [p["sha256"] for p in release["archive"]["parts"]] == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in parts
    ]
    assert release["archive"]["size"] == sum(p.stat().st_size for p in parts)
    assert release["archive"]["sha256"] == hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()
    # gzip bytes may depend on the compressor's version (zlib-ng#1751 for zlib-ng): the manifest names it
    # ... and chunks are where FastCDC cuts them
    assert release["archive"]["archiver"] == {
        "library": "libdeflate",
        "deflate": importlib.metadata.version("deflate"),
        "members": "chunked",
        "fastcdc": importlib.metadata.version("fastcdc"),
        "chunk": f"{CHUNK_MIN}/{CHUNK_AVG}/{CHUNK_MAX}",
        "member_size": MEMBER_SIZE,
    }
    toc = (assets / f"{STEM}.toc.json.gz").read_bytes()
    assert release["archive"]["toc"] == {
        "name": f"{STEM}.toc.json.gz",
        "size": len(toc),
        "sha256": hashlib.sha256(toc).hexdigest(),
    }
    assert release["archive"]["level"] == 6
    backend = json.loads((assets / "backend_versions.json").read_text())
    assert backend["vllm"] == {"rocm": f"vllm0.33.0-rocm{ROCM_VERSION}"}
    checksums = backend["checksums"]["github"][TEST_REPO][TAG]
    assert checksums == {p.name: "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest() for p in parts}
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=assets, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    listed = {line.split()[1] for line in (assets / "SHA256SUMS").read_text().splitlines()}
    assert listed == {p.name for p in assets.iterdir()} - {"SHA256SUMS"}


def test_sbom(assets: Path) -> None:
    """The bundle's SBOM (release/sbom.py; tests/test_sbom.py has the details): valid CycloneDX 1.6,
    stamped with the release's source date, torch, vLLM and the ROCm SDK as the distributions they are."""
    text = (assets / f"{STEM}.cdx.json").read_text()
    sbom = json.loads(text)
    assert sbom["bomFormat"] == "CycloneDX" and sbom["serialNumber"].startswith("urn:uuid:")
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    release = json.loads((assets / "release.json").read_text())
    assert datetime.fromisoformat(sbom["metadata"]["timestamp"]).timestamp() == release["source_date_epoch"]
    by_name = {c["name"]: c for c in sbom["components"]}
    assert len(by_name) == len(sbom["components"]), "each component once"
    assert "CPython (python-build-standalone)" in by_name
    titles = {c["description"]: c for c in sbom["components"] if "description" in c}
    assert {"ROCm SDK (TheRock)", "PyTorch (TheRock)", "vLLM"} <= set(titles)
    assert {"torch", "fastapi", "rocm-sdk-core", "vllm"} <= set(by_name)
    assert by_name["torch"]["hashes"][0]["alg"] == "SHA-256"
    assert titles["vLLM"] is by_name["vllm"] and by_name["vllm"]["version"] == VLLM_BUILT_VERSION
    assert titles["ROCm SDK (TheRock)"]["name"] == "rocm" and "pedigree" in titles["ROCm SDK (TheRock)"]
    graph = {d["ref"]: set(d.get("dependsOn", [])) for d in sbom["dependencies"]}
    ref = {name: c["bom-ref"] for name, c in by_name.items()}
    assert {ref["vllm"], ref["torch"], ref["rocm"], "cpython"} == graph[sbom["metadata"]["component"]["bom-ref"]]
    assert ref["fastapi"] in graph[ref["vllm"]], "vLLM's requirements (it names no torch: ROCm's is its own)"
    assert ref["rocm"] in graph[ref["torch"]] and ref["rocm-sdk-core"] in graph[ref["rocm"]]


def test_an_archive_within_one_part_is_part01_of_01_with_partcount_01(built: Path, tmp_path: Path) -> None:
    """At the default part size the fixture bundle is one part: named ``01-of-01``, and the partcount
    says ``01`` (two digits, no newline), as for several parts (Lemonade reads it first)."""
    assets = ReleaseAssets("x")
    archive = archive_assets(built / "gfx1151" / "root", tmp_path, assets, part_size=DEFAULT_PART_SIZE, level=6)
    (part,) = archive["parts"]
    assert part["name"] == "x-x64.part01-of-01.tar.gz" == part_name(assets.stem, 1, 1)
    assert (tmp_path / assets.partcount).read_bytes() == b"01"
    assert archive["size"] == part["size"] == (tmp_path / part["name"]).stat().st_size
    assert archive["sha256"] == part["sha256"] == sha256_file(tmp_path / part["name"])
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([part["name"], assets.partcount, assets.toc])


def test_a_trees_stream_sha256_is_the_tar_stream_its_parts_inflate_to(tmp_path: Path) -> None:
    """What a delta install checks its assembled tree with (util/tarstream.py ``stream_sha256``, #51 F7,
    #54): the tree's tar stream hashed gives release.json's ``archive.tar_sha256``, which is the sha256 of
    what the parts inflate to (a full install checks that); a name left out at the top is as if it were not
    there; a mode, a byte or a second name that differs, differs."""
    root = tmp_path / "root"
    (root / "lib" / "empty").mkdir(parents=True)
    (root / "lib" / "big.so").write_bytes(os.urandom(3 * MEMBER_SIZE))
    (root / "lib" / "small.py").write_text("x = 1\n")
    (root / "lib" / "second-name.py").hardlink_to(root / "lib" / "small.py")
    (root / "lib" / "link.so").symlink_to("big.so")
    written = write_archive(root, tmp_path / "out", "x", part_size=MEMBER_SIZE)
    assert len(written.parts) > 2
    inflated = gzip.decompress(b"".join(part.path.read_bytes() for part in written.parts))
    assert written.tar_sha256 == hashlib.sha256(inflated).hexdigest()
    assert stream_sha256(root) == written.tar_sha256
    (root / ".marker").write_text("the installer's own")
    assert stream_sha256(root, leave_out={".marker"}) == written.tar_sha256
    assert stream_sha256(root) != written.tar_sha256
    (root / ".marker").unlink()
    (root / "lib" / "small.py").chmod(0o755)
    assert stream_sha256(root) != written.tar_sha256, "another mode"
    (root / "lib" / "small.py").chmod(0o644)
    (root / "lib" / "second-name.py").unlink()
    (root / "lib" / "second-name.py").write_text("x = 1\n")
    assert stream_sha256(root) != written.tar_sha256, "a file of its own where the release has a second name"
    (root / "lib" / "second-name.py").unlink()
    (root / "lib" / "second-name.py").hardlink_to(root / "lib" / "small.py")
    assert stream_sha256(root) == written.tar_sha256
    (root / "lib" / "small.py").write_text("x = 2\n")
    assert stream_sha256(root) != written.tar_sha256, "another byte"


def test_same_bytes_whatever_the_workers_and_the_order_they_finish_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive's bytes depend on neither how many threads compress its members (the count is fixed,
    util/gzip_members.py ``COMPRESSION_WORKERS``, but nothing in the archive may rely on it) nor on the
    order the members finish in: with one worker, and with eight of which every third member is made to
    finish late, the parts, the table of contents and the tar stream are the same."""
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    random = Random(54)
    for number in range(12):
        size = random.randrange(1, 6 * MEMBER_SIZE)
        (root / "lib" / f"f{number}.so").write_bytes(random.randbytes(size // 2) + bytes(size - size // 2))

    def written(name: str) -> tuple[object, ...]:
        archive = write_archive(root, tmp_path / name, "x", part_size=4 * MEMBER_SIZE)
        return [part.sha256 for part in archive.parts], archive.toc, archive.tar_sha256

    eight = written("eight")
    monkeypatch.setattr(gzip_members, "COMPRESSION_WORKERS", 1)
    one = written("one")
    monkeypatch.setattr(gzip_members, "COMPRESSION_WORKERS", 8)
    finished: list[int] = []
    given = itertools.count()
    real_pack = gzip_members._pack

    def late_pack(data: bytes, chunks: Any, level: int) -> tuple[bytes, list[str]]:
        number = next(given)
        if number % 3 == 0:
            time.sleep(0.05)
        packed = real_pack(data, chunks, level)
        finished.append(number)
        return packed

    monkeypatch.setattr(gzip_members, "_pack", late_pack)
    shuffled = written("shuffled")
    assert finished != sorted(finished) and len(finished) > 20, "members finished out of order"
    assert one == eight == shuffled


def test_a_difference_names_the_member_and_field(built: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(built / "gfx1151" / "root", root, symlinks=True)
    a = write_archive(root, tmp_path / "a", "x").parts
    (root / "bin" / "vllm-server").chmod(0o644)
    b = write_archive(root, tmp_path / "b", "x").parts
    assert first_difference([p.path for p in a], [p.path for p in b]) == "member ./bin/vllm-server: mode 0o755 != 0o644"


def test_merge_backend_versions(assets: Path, tmp_path: Path) -> None:
    other = json.loads((assets / "backend_versions.json").read_text())
    other["checksums"]["github"][TEST_REPO] = {
        f"vllm0.33.0-rocm{ROCM_VERSION}-gfx110X": {"x.part01-of-01.tar.gz": "sha256:" + "a" * 64}
    }
    (tmp_path / "gfx110X.json").write_text(json.dumps(other))
    result = run_cli(
        "merge-manifests", assets / "backend_versions.json", tmp_path / "gfx110X.json", "-o", tmp_path / "merged.json"
    )
    assert result.returncode == 0, result.stderr
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert set(merged["checksums"]["github"][TEST_REPO]) == {TAG, f"vllm0.33.0-rocm{ROCM_VERSION}-gfx110X"}
    assert merged["vllm"] == {"rocm": f"vllm0.33.0-rocm{ROCM_VERSION}"}, "one line for both: no override"
    other["vllm"]["rocm"] = "vllm0.34.0-rocm7.14.0"
    (tmp_path / "wrong.json").write_text(json.dumps(other))
    bad = run_cli("merge-manifests", assets / "backend_versions.json", tmp_path / "wrong.json", "-o", tmp_path / "m")
    assert_one_line_error(bad, "pins 'vllm0.34.0-rocm7.14.0' but checksums")


def test_targets_on_another_release_line_become_lemonade_overrides(assets: Path, tmp_path: Path) -> None:
    """Lemonade's backend_versions.json keeps one vllm.rocm pin and vllm.rocm_arch_overrides per family."""
    files = [assets / "backend_versions.json"]
    for target, pin in (("gfx110X", f"vllm0.33.0-rocm{ROCM_VERSION}"), ("gfx942", "vllm0.32.0-rocm7.13.0")):
        doc = {
            "vllm": {"rocm": pin},
            "checksums": {"github": {TEST_REPO: {f"{pin}-{target}": {"a": "sha256:" + "0" * 64}}}},
        }
        files.append(tmp_path / f"{target}.json")
        files[-1].write_text(json.dumps(doc))
    result = run_cli("merge-manifests", *files, "-o", tmp_path / "merged.json")
    assert result.returncode == 0, result.stderr
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["vllm"] == {
        "rocm": f"vllm0.33.0-rocm{ROCM_VERSION}",
        "rocm_arch_overrides": {"gfx942": "vllm0.32.0-rocm7.13.0"},
    }
    assert pinned_tag(merged, "gfx942") == "vllm0.32.0-rocm7.13.0-gfx942"
    assert pinned_tag(merged, "gfx1151") == TAG


def test_a_tag_without_its_target_is_refused_in_one_line(tmp_path: Path) -> None:
    doc = {"vllm": {"rocm": "v1"}, "checksums": {"github": {TEST_REPO: {"v1": {"a": "sha256:" + "0" * 64}}}}}
    (tmp_path / "hand-made.json").write_text(json.dumps(doc))
    bad = run_cli("merge-manifests", tmp_path / "hand-made.json", "-o", tmp_path / "merged.json")
    assert_one_line_error(bad, "names tag 'v1', not <pin>-<target>")
    assert not (tmp_path / "merged.json").exists()


def test_bundle_without_a_repository_says_how_to_set_one_before_any_stage(
    locked: Path, upstream: UpstreamServer, built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "not-a-repository"))  # no origin remote to fall back on
    result = run_cli(
        "bundle",
        "gfx1151",
        "--recipes",
        locked,
        "--cache-dir",
        built.parent / "cache",
        "--mirror",
        f"{upstream.url}/mirror/",
        "--build-dir",
        tmp_path / "b",
        "--plain",
    )
    assert_one_line_error(result, "no GitHub repository", "--repo owner/name")
    assert "stage" not in result.stdout and not (tmp_path / "b").exists(), "refused before any stage ran"
    bad = run_cli(*bundle_args(locked, upstream, tmp_path / "c", built.parent / "cache"), "--repo", "not a repo")
    assert_one_line_error(bad, "'not a repo' is not <owner>/<name>")
    assert not (tmp_path / "c").exists()


def test_bundle_without_a_repository_is_refused_before_the_lock_check(
    recipes_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#32 E10: a missing (or bad) repository is a bad option, refused before any work, locking included
    (it was checked after the lock: without --locked, after locking over the network)."""
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "not-a-repository"))  # no origin remote to fall back on
    args = ("bundle", "gfx1151", "--recipes", recipes_dir, "--build-dir", tmp_path / "b")
    result = run_cli(*args, "--locked")
    assert_one_line_error(result, "no GitHub repository", "--repo owner/name")
    assert result.returncode == 2
    assert_one_line_error(run_cli(*args, "--locked", "--repo", TEST_REPO), "no lock for stable/gfx1151")
    assert not (recipes_dir / "locks").exists() and not (tmp_path / "b").exists()


def test_the_repository_defaults_to_the_checkouts_github_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    for number, (url, repo) in enumerate(
        (
            ("git@github.com:acme/vllm-builds.git", "acme/vllm-builds"),
            ("https://github.com/acme/vllm-builds", "acme/vllm-builds"),
            ("https://gitlab.example.com/acme/vllm-builds.git", ""),
        )
    ):
        monkeypatch.delenv("GIT_DIR", raising=False)
        clone = tmp_path / f"clone{number}"
        subprocess.run(["git", "init", "-q", str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "remote", "add", "origin", url], check=True)
        monkeypatch.setenv("GIT_DIR", str(clone / ".git"))
        assert default_repo(None) == repo, url
        assert default_repo("other/repo") == "other/repo"


def test_every_json_file_is_written_in_one_form_the_oci_documents_in_theirs(tmp_path: Path) -> None:
    """release.json, backend_versions.json, image.json, the base lock, tier 0's report and a stage's stamp
    come from manifests.dump_json: sorted keys, two-space indent, ASCII, a trailing newline. Their bytes
    must not change (published assets are compared byte for byte); the OCI documents keep their compact
    form, whose bytes their digests are of."""
    from vllm_bundle.manifests import dump_json
    from vllm_bundle.oci.layout import canonical_json
    from vllm_bundle.qualify.tier0 import CheckResult, Report
    from vllm_bundle.tree.stage import run_stage

    doc = {"b": [1, {"é": None, "a": True}], "a": "x"}
    assert (
        dump_json(doc)
        == b'{\n  "a": "x",\n  "b": [\n    1,\n    {\n      "a": true,\n      "\\u00e9": null\n    }\n  ]\n}\n'
    )
    assert canonical_json(doc) == '{"a":"x","b":[1,{"a":true,"é":null}]}'.encode()
    report = Report("gfx1151", [CheckResult("names", True, "ok")])
    assert report.to_json() == dump_json(json.loads(report.to_json()))
    run_stage(tmp_path / "out", "demo", 1, {"where": tmp_path}, lambda tmp: {"n": 1})
    stamp = (tmp_path / ".out.stage.json").read_bytes()
    assert stamp == dump_json(json.loads(stamp)) and json.loads(stamp)["inputs"] == {"where": str(tmp_path)}


# -- Lemonade's checksum lookup (lemonade-sdk/lemonade@e385039), modelled from its source ------------------


def lemonade_hash(doc: dict[str, Any], recipe: str, backend: str, version: str, repo: str, filename: str) -> str:
    """src/cpp/server/backends/backend_utils.cpp:46-113 ``lookup_expected_asset_hash``: the first of ten
    key paths that leads to a hash (a string, or an object with ``digest``, ``sha256`` or ``algorithm`` and
    ``value``); a path with an empty part is skipped; "" when none does."""
    paths = [
        ["checksums", "github", repo, version, filename],
        ["checksums", repo, version, filename],
        ["checksums", recipe, backend, version, filename],
        ["checksums", recipe, version, filename],
        ["checksums", recipe, filename],
        ["artifact_hashes", "github", repo, version, filename],
        ["artifact_hashes", repo, version, filename],
        ["artifact_hashes", recipe, backend, version, filename],
        ["artifact_hashes", recipe, version, filename],
        ["artifact_hashes", filename],
    ]
    for path in paths:
        if "" in path:
            continue
        node: Any = doc
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, str) and node:
            return node
        if isinstance(node, dict):
            if isinstance(node.get("digest"), str):
                return str(node["digest"])
            if isinstance(node.get("sha256"), str):
                return f"sha256:{node['sha256']}"
            if isinstance(node.get("algorithm"), str) and isinstance(node.get("value"), str):
                return f"{node['algorithm']}:{node['value']}"
    return ""


def lemonade_assets(doc: dict[str, Any], target: str, release: Path) -> tuple[str, list[str]]:
    """The tag and the files Lemonade downloads for ``target``: vllm_server.cpp:310-335 (the target's
    override, else ``vllm.rocm``, plus ``-<target>``; the file ``<tag>-x64.tar.gz``) and
    backend_utils.cpp:584-620 (``<base>.partcount`` answered: parts ``<base>.partNN-of-MM.tar.gz``, base the
    file name without ``.tar.gz``)."""
    pins = doc["vllm"]
    tag = f"{pins.get('rocm_arch_overrides', {}).get(target, pins['rocm'])}-{target}"
    base = f"{tag}-x64.tar.gz"[: -len(".tar.gz")]
    count = int((release / f"{base}.partcount").read_text())
    return tag, [f"{base}.part{n:02d}-of-{count:02d}.tar.gz" for n in range(1, count + 1)]


def test_every_checksum_lemonade_looks_up_is_in_the_merged_manifest(assets: Path, tmp_path: Path) -> None:
    """Lemonade never reads the release's backend_versions.json: its own pin file must hold the merged one,
    and its lookup (repository lemonade-sdk/vllm-rocm, vllm_server.cpp:299) must find every part's sha256.
    Under another repository key (the fixture's release) it finds none, and merge-manifests says so."""
    from vllm_bundle.manifests import LEMONADE_VLLM_REPO, backend_versions

    ours = json.loads((assets / "backend_versions.json").read_text())
    tag = next(iter(ours["checksums"]["github"][TEST_REPO]))
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in parts_of(assets)}
    published = backend_versions(tag, "gfx1151", LEMONADE_VLLM_REPO, digests)
    other_tag = f"vllm0.33.0-rocm{ROCM_VERSION}-gfx110X"
    other = backend_versions(
        other_tag, "gfx110X", LEMONADE_VLLM_REPO, {f"{other_tag}-x64.part01-of-01.tar.gz": "b" * 64}
    )
    for name, doc in (("ours.json", published), ("other.json", other), ("fixture.json", ours)):
        (tmp_path / name).write_text(json.dumps(doc))
    result = run_cli("merge-manifests", tmp_path / "ours.json", tmp_path / "other.json", "-o", tmp_path / "m.json")
    assert result.returncode == 0, result.stderr
    assert f'checksums.github["{LEMONADE_VLLM_REPO}"]["<tag>"]["<part>"]' in result.stdout
    assert "warning" not in result.stdout
    merged = json.loads((tmp_path / "m.json").read_text())
    looked_up, files = lemonade_assets(merged, "gfx1151", assets)
    assert looked_up == tag and len(files) > 1
    for name in files:
        found = lemonade_hash(merged, "vllm", "rocm", tag, LEMONADE_VLLM_REPO, name)
        assert found == f"sha256:{digests[name]}", name

    result = run_cli("merge-manifests", tmp_path / "fixture.json", "-o", tmp_path / "f.json")
    assert result.returncode == 0, result.stderr
    assert f"warning: these checksums are under {TEST_REPO}, not {LEMONADE_VLLM_REPO}" in result.stdout
    fixture = json.loads((tmp_path / "f.json").read_text())
    assert [lemonade_hash(fixture, "vllm", "rocm", tag, LEMONADE_VLLM_REPO, n) for n in files] == [""] * len(files)
