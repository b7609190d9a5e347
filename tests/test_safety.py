"""Nothing lost, nothing escapes: what `install` may replace, one builder per build directory, scratch
space beside the output, and extraction that no tarball can steer outside its destination."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import interrupt
from tests.conftest import (
    OLD_VLLM,
    REPO,
    TEST_DOWNLOADS,
    assert_one_line_error,
    bundle_args,
    install,
    lock_against,
    run_cli,
    seed_vllm_build,
    small_disk,
    tree_digest,
)
from tests.upstream.fixture import PYTHON_MINOR, ROCM_VERSION, Fixture
from tests.upstream.registry import RegistryServer
from tests.upstream.server import Fault, UpstreamServer
from vllm_bundle.errors import BundleError
from vllm_bundle.tree.python_stage import python_stage
from vllm_bundle.tree.vllm_source import prepare_source
from vllm_bundle.util.fsutil import sha256_file

TAG = f"vllm0.33.0-rocm{ROCM_VERSION}-gfx1151"
STEM = f"{TAG}-x64"


# -- 1. install replaces only a directory it created -----------------------------------------------------


def test_install_refuses_a_folder_that_is_not_an_install(built: Path, tmp_path: Path) -> None:
    dest = tmp_path / "Documents"
    dest.mkdir()
    (dest / "thesis.tex").write_text("years of work")
    (dest / "bin").mkdir()
    before = tree_digest(dest)
    result = install(built.parent / "bundles" / TAG, dest, tmp_path / "cache")
    assert_one_line_error(result, str(dest), "not an install", "--dest")
    assert tree_digest(dest) == before, "nothing touched"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Documents"], "no staging, no lock file left"


def test_install_refuses_a_folder_that_only_looks_like_an_install(built: Path, tmp_path: Path) -> None:
    """A version.txt and a bin/vllm-server do not make a folder ours: only our marker does (#21.3)."""
    dest = tmp_path / "vllm"
    (dest / "bin").mkdir(parents=True)
    (dest / "bin" / "vllm-server").write_text("#!/bin/sh\n")
    (dest / "bin" / "vllm-server").chmod(0o755)
    (dest / "version.txt").write_text("vllm0.32.0-rocm7.13.0-gfx1151")
    (dest / "notes.txt").write_text("the user's own")
    before = tree_digest(dest)
    result = install(built.parent / "bundles" / TAG, dest, tmp_path / "cache")
    assert_one_line_error(result, str(dest), "not an install", "--dest")
    assert tree_digest(dest) == before, "nothing touched"


def test_install_refuses_a_destination_that_is_a_file_or_a_symlink(built: Path, tmp_path: Path) -> None:
    assets = built.parent / "bundles" / TAG
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert_one_line_error(install(assets, a_file, tmp_path / "cache"), str(a_file), "--dest")
    assert a_file.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to("real")
    assert_one_line_error(install(assets, link, tmp_path / "cache"), "symlink", "--dest")
    assert link.is_symlink() and list((tmp_path / "real").iterdir()) == []


def test_install_into_an_empty_folder_or_over_its_own_install(built: Path, tmp_path: Path) -> None:
    assets, dest = built.parent / "bundles" / TAG, tmp_path / "vllm"
    dest.mkdir()  # what a user makes before pointing --dest at it: nothing in it to lose
    assert install(assets, dest, tmp_path / "cache").returncode == 0
    (dest / "version.txt").write_text("vllm0.32.0-rocm7.13.0-gfx1151")  # an older install of ours
    again = install(assets, dest, tmp_path / "cache")
    assert again.returncode == 0, again.stdout + again.stderr
    assert (dest / "version.txt").read_text() == TAG


# -- 2. one builder per build directory --------------------------------------------------------------------

SLOW_SITE = textwrap.dedent("""
    import sys, time
    import vllm_bundle.tree.assemble as assemble
    original = assemble.install_wheels
    def slow(*args, **kwargs):
        print("SITE-STARTED", flush=True)
        time.sleep(4)
        return original(*args, **kwargs)
    assemble.install_wheels = slow
    from vllm_bundle.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_second_bundle_on_the_same_build_dir_waits_for_the_first(
    locked: Path, upstream: UpstreamServer, built: Path, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    build = seed_vllm_build(built, tmp_path / "build")  # what is tested is the wait, not vLLM's build
    args = bundle_args(locked, upstream, build, built.parent / "cache", builder_registry)
    first = subprocess.Popen(
        [sys.executable, "-c", SLOW_SITE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert first.stdout is not None
    for line in first.stdout:
        if "SITE-STARTED" in line:
            break
    second = run_cli(*args, timeout=300)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    assert second.returncode == 0, second.stdout + second.stderr
    assert "another vllm-bundle is building" in second.stderr and str(build / "gfx1151") in second.stderr
    states = {line.split()[1]: line.split()[2] for line in second.stdout.splitlines() if line.startswith("stage")}
    assert set(states.values()) == {"cached"}, "the second run found the first one's complete stages"
    assert tree_digest(build / "gfx1151" / "root") == tree_digest(built / "gfx1151" / "root")
    assert tree_digest(build.parent / "bundles") == tree_digest(built.parent / "bundles")


# -- 3. scratch space lives beside the output --------------------------------------------------------------


def test_tmpdir_on_another_file_system_is_fine(vllm_sdist: Callable[[str], Path], tmp_path: Path) -> None:
    vllm_sdist(OLD_VLLM)
    with small_disk(tmp_path / "tmpfs", "64m") as other_fs:
        result = run_cli(
            *("patch", "gfx1151", "--vllm", OLD_VLLM, "--build-dir", tmp_path / "build"),
            *("--cache-dir", TEST_DOWNLOADS, "--plain"),
            env={"TMPDIR": str(other_fs)},
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hip-archs-rdna" in result.stdout and "applied" in result.stdout


# -- 4. extraction: checks on the final on-disk path, links resolved inside, no special entries -----------


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


def _tarball(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _symlink_chain(top: str, landing: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    """Names and link targets that all stay inside ``top/`` when read as text, but not once ``top/`` is
    stripped and the links are followed on disk: ``a/s -> .`` makes ``a/s/s/s/../..`` climb out."""
    depth = 20  # deeper than any test directory (the climb stops at /), within the kernel's 40 link hops
    climb = "/".join(["s"] * depth + [".."] * (depth - 1))
    return [
        (_member(f"{top}/a/s", tarfile.SYMTYPE, "."), b""),
        (_member(f"{top}/a/x", tarfile.SYMTYPE, climb), b""),
        (_member(f"{top}/a/x{landing}"), b"escaped"),
    ]


@pytest.fixture
def landing(tmp_path: Path) -> Iterator[Path]:
    """Where an escaping entry would land: a file under /tmp, named for this test."""
    path = Path("/tmp") / f"vllm-bundle-escape-{tmp_path.name}"
    path.unlink(missing_ok=True)
    yield path
    path.unlink(missing_ok=True)


def test_python_stage_refuses_a_symlink_chain_out_of_the_tree(tmp_path: Path, landing: Path) -> None:
    ok = (_member(f"python/bin/python{PYTHON_MINOR}", mode=0o755), b"\x7fELF")
    tarball = _tarball(tmp_path / "cpython.tar.gz", [ok, *_symlink_chain("python", landing)])
    build = tmp_path / "build" / "gfx1151"
    with pytest.raises(BundleError, match="refusing to extract"):
        python_stage(tarball, sha256_file(tarball), PYTHON_MINOR, out=build / "python")
    assert not landing.exists(), "nothing written outside the stage"
    assert not (build / "python").exists() and not (build / ".python.stage.json").exists()


def test_vllm_source_stage_refuses_a_link_out_of_the_tree(tmp_path: Path, landing: Path) -> None:
    top = "vllm-0.33.0"
    members = [
        (_member(f"{top}/PKG-INFO"), b"Metadata-Version: 2.1\n"),
        (_member(f"{top}/esc", tarfile.SYMTYPE, ".."), b""),
        (_member(f"{top}/esc/vllm-bundle-escaped"), b"escaped"),
        *_symlink_chain(top, landing),
    ]
    sdist = _tarball(tmp_path / "vllm-0.33.0.tar.gz", members)
    out = tmp_path / "build" / "gfx1151" / "vllm-src"
    with pytest.raises(BundleError, match="refusing to extract"):
        prepare_source(sdist, sha256_file(sdist), "0.33.0", REPO / "patches" / "vllm", frozenset({"gfx1151"}), out=out)
    assert not landing.exists() and not (out.parent / "vllm-bundle-escaped").exists()
    assert not out.exists()


def _realpath_limit_attack(staging_dir_length: int) -> list[tuple[tarfile.TarInfo, bytes]]:
    """CVE-2025-4517: directories and symlinks whose expansion overflows PATH_MAX, so a realpath()-based
    check (tarfile's data filter before Python 3.11.13/3.12.11) stops resolving and lets a link out."""
    steps = "abcdefghijklmnop"
    component = "d" * ((os.pathconf("/", "PC_PATH_MAX") - staging_dir_length - 1) // (len(steps) + 1))
    members, path = [], "."
    for step in steps:
        members.append((_member(f"{path}/{component}", tarfile.DIRTYPE, mode=0o755), b""))
        members.append((_member(f"{path}/{step}", tarfile.SYMTYPE, component), b""))
        path = f"{path}/{component}"
    deep_link = "/".join(steps) + "/" + "l" * 254
    members.append((_member(f"./{deep_link}", tarfile.SYMTYPE, "/".join([".."] * len(steps))), b""))
    members.append((_member("./escape", tarfile.SYMTYPE, f"{deep_link}/.."), b""))
    members.append((_member("./flaglink", tarfile.LNKTYPE, "escape/flag"), b""))
    members.append((_member("./flaglink"), b"overwritten"))
    members.append((_member("./escape/newfile"), b"new"))
    return members


def _release_of(members: list[tuple[tarfile.TarInfo, bytes]], where: Path) -> Path:
    """A release directory whose one part is the given archive, with matching manifests."""
    import hashlib

    where.mkdir(parents=True)
    launcher = _member("./bin/vllm-server", mode=0o755)
    part = _tarball(where / f"{STEM}.part01-of-01.tar.gz", [(launcher, b"#!/bin/sh\n"), *members])
    digest = hashlib.sha256(part.read_bytes()).hexdigest()
    (where / f"{STEM}.partcount").write_text("01")
    entry = {"name": part.name, "size": part.stat().st_size, "sha256": digest}
    archive = {"size": entry["size"], "sha256": digest, "parts": [entry]}
    (where / "release.json").write_text(json.dumps({"tag": TAG, "target": "gfx1151", "archive": archive}))
    return where


def test_install_refuses_the_realpath_limit_attack(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    flag = home / "flag"
    flag.write_text("original")
    dest = home / "vllm"
    staging_length = len(str(home)) + len(f"/.vllm.staging-{TAG}") + 10
    release = _release_of(_realpath_limit_attack(staging_length), tmp_path / "release")
    result = install(release, dest, tmp_path / "cache")
    assert_one_line_error(result, "refusing to extract")
    assert flag.read_text() == "original" and not (home / "newfile").exists()
    assert sorted(p.name for p in home.iterdir() if not p.name.endswith(".lock")) == ["flag"]


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (_member("/tmp/vllm-bundle-abs"), "absolute"),
        (_member("./../vllm-bundle-up"), "'..'"),
        (_member("./bin/sudo-like", mode=0o4755), "setuid"),
        (_member("./bin/group-like", mode=0o2755), "setgid"),
        (_member("./dev/sda", tarfile.BLKTYPE), "device"),
        (_member("./dev/tty", tarfile.CHRTYPE), "device"),
        (_member("./fifo", tarfile.FIFOTYPE), "FIFO"),
        (_member("./lib/abs", tarfile.SYMTYPE, "/etc/passwd"), "symlink"),
        (_member("./lib/hard", tarfile.LNKTYPE, "../outside"), "hard link"),
    ],
)
def test_install_refuses_special_and_escaping_entries(tmp_path: Path, entry: tarfile.TarInfo, reason: str) -> None:
    release = _release_of([(entry, b"x" if entry.isreg() else b"")], tmp_path / "release")
    result = install(release, tmp_path / "vllm", tmp_path / "cache")
    assert_one_line_error(result, "refusing to extract", reason)
    assert not (tmp_path / "vllm").exists()
    assert not Path("/tmp/vllm-bundle-abs").exists() and not (tmp_path / "vllm-bundle-up").exists()


def test_tier0_fails_on_a_symlink_leaving_the_bundle(built: Path, locked: Path, tmp_path: Path) -> None:
    root = tmp_path / "bundle"
    shutil.copytree(built / "gfx1151" / "root", root, symlinks=True)
    (root / "lib" / "escape").symlink_to("../../..")
    result = run_cli("qualify", root, "--recipes", locked, "--report", tmp_path / "r.json", timeout=300)
    last = assert_one_line_error(result, "symlinks")
    assert "lib/escape" in last


# -- 5. incremental builds never go stale -------------------------------------------------------------------


def _private(built: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the built tree and of its download cache, for tests that damage one of them (the cache by
    hard links: a test damages a blob by writing a file of its own in its place, ``_corrupt``; the builder
    image's hundreds of MB are not copied)."""
    build, cache = tmp_path / "build", tmp_path / "cache"
    shutil.copytree(built, build, symlinks=True)
    subprocess.run(["cp", "-al", str(built.parent / "cache"), str(cache)], check=True)
    return build, cache


def _stage_states(stdout: str) -> dict[str, str]:
    return {line.split()[1]: line.split()[2] for line in stdout.splitlines() if line.startswith("stage")}


def test_a_wheel_republished_under_the_same_name_redoes_the_site_stage(
    fixture_tree: Fixture, locked: Path, built: Path, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    from tests.upstream.fixture import flat_mirror, write_index
    from tests.upstream.packaging_fixtures import make_wheel

    copy = Fixture(tmp_path / "upstream")
    shutil.copytree(fixture_tree.root, copy.root, symlinks=True)
    for index, paths in fixture_tree.indexes.items():
        copy.serve(index, [copy.root / p.relative_to(fixture_tree.root) for p in paths])
    (old,) = [name for name in copy.files if name.startswith("sentencepiece-")]
    files = {"sentencepiece/__init__.py": b"", "sentencepiece/republished.py": b"x = 1\n"}
    new = make_wheel(copy.root / "files", "sentencepiece", "0.2.1", "py3-none-any", files)
    assert new.name == old, "the same file name, other bytes"
    write_index(copy)
    flat_mirror(copy)
    server = UpstreamServer(copy.root).start()
    try:
        recipes = tmp_path / "recipes"
        shutil.copytree(locked, recipes)
        assert lock_against(server, recipes, "gfx1151", tmp_path / "lock-cache").returncode == 0
        build = tmp_path / "build"
        shutil.copytree(built, build, symlinks=True)
        result = run_cli(*bundle_args(recipes, server, build, built.parent / "cache", builder_registry), timeout=300)
    finally:
        server.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    assert _stage_states(result.stdout)["site"] == "built"
    site = build / "gfx1151" / "root" / "lib" / f"python{PYTHON_MINOR}" / "site-packages"
    assert (site / "sentencepiece" / "republished.py").is_file(), "the bundle has the new bytes"
    sbom = json.loads(next((build.parent / "bundles").glob("*/*.cdx.json")).read_text())
    entry = next(c for c in sbom["components"] if c["name"] == "sentencepiece")
    assert entry["hashes"][0]["content"] == sha256_file(new)


def test_a_truncated_staged_wheel_is_replaced_from_the_cache(
    locked: Path, upstream: UpstreamServer, built: Path, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    build, cache = _private(built, tmp_path)
    (staged,) = (build / "gfx1151" / ".wheels").glob("fastapi-*.whl")
    data = staged.read_bytes()
    staged.unlink()  # a file of its own (not the cache's hard link), cut short
    staged.write_bytes(data[: len(data) // 2])
    result = run_cli(*bundle_args(locked, upstream, build, cache, builder_registry), "--force", "site", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert staged.read_bytes() == data
    assert tree_digest(build / "gfx1151" / "root") == tree_digest(built / "gfx1151" / "root")


# -- 6. corrupt cache blobs never reach a stamped stage ----------------------------------------------------


def _corrupt(path: Path) -> None:
    """Same size, other bytes: only a hash can tell. A new file in its place, so that a hard link of it
    (another cache's) keeps its bytes."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.with_name(f"{path.name}.corrupt").write_bytes(bytes(data))
    path.with_name(f"{path.name}.corrupt").replace(path)


def test_a_corrupt_cpython_blob_is_refused_before_extraction_and_healed_by_verify_cache(
    locked: Path, upstream: UpstreamServer, built: Path, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    build, cache = _private(built, tmp_path)
    lock = tomllib.loads((locked / "locks" / "stable" / "gfx1151.toml").read_text())
    python = next(a for a in lock["artifacts"] if a["role"] == "python")
    _corrupt(cache / "blobs" / "sha256" / python["sha256"][:2] / python["sha256"])
    args = bundle_args(locked, upstream, build, cache, builder_registry)
    refused = run_cli(*args, "--force", "python", timeout=300)
    last = assert_one_line_error(refused, python["filename"], "does not match its sha256", "--verify-cache")
    assert python["sha256"] not in last, "the file is named, not the cache blob"
    assert not (build / "gfx1151" / ".python.stage.json").exists(), "nothing stamped"
    healed = run_cli(*args, "--verify-cache", timeout=300)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert tree_digest(build / "gfx1151" / "root") == tree_digest(built / "gfx1151" / "root")


def test_a_corrupt_wheel_blob_is_one_line(
    locked: Path, upstream: UpstreamServer, built: Path, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    build, cache = _private(built, tmp_path)
    (staged,) = (build / "gfx1151" / ".wheels").glob("pydantic-*.whl")
    digest = sha256_file(staged)
    _corrupt(cache / "blobs" / "sha256" / digest[:2] / digest)
    result = run_cli(*bundle_args(locked, upstream, build, cache, builder_registry), "--force", "site", timeout=300)
    assert_one_line_error(result, staged.name, "does not match its sha256", "--verify-cache")


def test_install_re_hashes_a_corrupt_cached_part(built: Path, tmp_path: Path) -> None:
    assets, cache = built.parent / "bundles" / TAG, tmp_path / "cache"
    assert install(assets, tmp_path / "first", cache).returncode == 0
    part = sorted(assets.glob(f"{STEM}.part*-of-*.tar.gz"))[1]
    _corrupt(cache / "blobs" / "sha256" / sha256_file(part)[:2] / sha256_file(part))
    result = install(assets, tmp_path / "second", cache)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "does not match its sha256" in result.stderr + result.stdout
    assert tree_digest(tmp_path / "second") == tree_digest(tmp_path / "first")


# -- 7. Ctrl-C ends a verb within 2 s, keeping resumable partials ------------------------------------------


def _interrupt_when(
    process: subprocess.Popen[str], ready: Callable[[], bool], timeout: float = 120
) -> tuple[float, str]:
    """Send SIGINT once ``ready()``; returns the seconds the process took to exit after it, and its stderr."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "never got ready"
        time.sleep(0.05)
    seconds, _, stderr = interrupt.ctrl_c(process, within=30)
    return seconds, stderr


def test_ctrl_c_during_fetch_stops_at_once_and_the_next_run_resumes(
    locked: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    upstream.inject("*", Fault("throttle", times=None, rate=400_000))
    command = [sys.executable, "-m", "vllm_bundle", "fetch", "gfx1151", "--recipes", str(locked), "--plain"]
    command += ["--cache-dir", str(tmp_path / "cache"), "--mirror", f"{upstream.url}/mirror/", "-j", "4"]
    process = interrupt.start(command)
    partials = tmp_path / "cache" / "partial"
    seen: dict[str, int] = {}

    def downloading() -> bool:
        for partial in partials.glob("*.part") if partials.is_dir() else []:
            try:
                size = partial.stat().st_size
            except FileNotFoundError:  # finished (renamed into the cache) since the glob
                continue
            if size > 200_000:
                seen[partial.name] = size
                return True
        return False

    seconds, err = _interrupt_when(process, downloading)
    assert seconds < 2, f"Ctrl-C took {seconds:.1f} s"
    assert process.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    kept = {p.name: p.stat().st_size for p in partials.glob("*.part")}
    # What had arrived is kept (a download that had only opened its file at the signal may keep 0 bytes).
    assert all(kept.get(name, 0) >= size for name, size in seen.items()), (seen, kept)
    upstream.reset()
    again = run_cli(*command[3:], timeout=300)
    assert again.returncode == 0, again.stderr
    assert any(r.range for r in upstream.log if r.method == "GET"), "a partial was resumed with a Range request"


def test_ctrl_c_while_archiving_stops_at_once_and_leaves_no_parts(
    locked: Path, upstream: UpstreamServer, built: Path, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    build = tmp_path / "build"
    shutil.copytree(built, build, symlinks=True)
    with (build / "gfx1151" / "root" / "big.bin").open("wb") as big:  # incompressible: archiving takes a while
        for _ in range(384):
            big.write(os.urandom(1 << 20))
    command = [
        sys.executable,
        "-m",
        "vllm_bundle",
        *bundle_args(locked, upstream, build, built.parent / "cache", builder_registry),
    ]
    process = interrupt.start([*command, "--force", "release", "--level", "9"])
    bundles = build.parent / "bundles"

    def archiving() -> bool:
        return any(p.stat().st_size > 0 for p in bundles.glob(".*.tmp/.*.part*.tmp"))

    seconds, err = _interrupt_when(process, archiving)
    assert seconds < 2, f"Ctrl-C took {seconds:.1f} s"
    assert process.returncode == 130 and "Traceback" not in err, err
    assert [p.name for p in bundles.iterdir() if not p.name.endswith(".lock")] == [], "no parts, no stamp left"


# -- 8. errors are one line -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", ["4m", "40m"])
def test_a_full_build_disk_is_one_line(
    locked: Path, upstream: UpstreamServer, built: Path, tmp_path: Path, size: str, builder_registry: RegistryServer
) -> None:
    with small_disk(tmp_path / "disk", size) as disk:
        result = run_cli(
            *bundle_args(locked, upstream, disk / "build", built.parent / "cache", builder_registry), timeout=300
        )
        assert_one_line_error(result, "disk", "filled up")
        assert not list((disk / "build" / "gfx1151").glob(".*.tmp")), "no half-built stage left"


def test_a_full_install_disk_is_one_line_and_leaves_no_staging(built: Path, tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "4m") as disk:
        result = install(built.parent / "bundles" / TAG, disk / "vllm", tmp_path / "cache")
        assert_one_line_error(result, "disk", "full")
        assert [p.name for p in disk.iterdir() if not p.name.endswith(".lock")] == [], "no staging, no install"


def test_install_retries_a_cut_release_json(built: Path, upstream: UpstreamServer, tmp_path: Path) -> None:
    published = upstream.root / "cut" / TAG
    shutil.copytree(built.parent / "bundles" / TAG, published)
    upstream.inject(f"/cut/{TAG}/release.json", Fault("cut", after=100))
    upstream.inject(f"/cut/{TAG}/{STEM}.partcount", Fault("cut", after=1))
    result = install(f"{upstream.url}/cut/{TAG}/", tmp_path / "vllm", tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(upstream.requests_for(f"/cut/{TAG}/release.json")) == 2
