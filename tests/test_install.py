"""``vllm-bundle install``: the fixture release from a loopback server, tampering, resume, idempotence."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, assert_one_line_error, run_cli, tree_digest
from tests.upstream.fixture import ROCM_VERSION
from tests.upstream.server import Fault, UpstreamServer

TAG = f"vllm0.33.0-rocm{ROCM_VERSION}-gfx1151"
STEM = f"{TAG}-x64"


@pytest.fixture(scope="module")
def served(built: Path, _server: UpstreamServer) -> str:
    """The fixture release published under ``/releases/download/<tag>/`` on the loopback server."""
    published = _server.root / "releases" / "download" / TAG
    if not published.exists():
        shutil.copytree(built.parent / "bundles" / TAG, published)
    return f"{_server.url}/releases/download/{TAG}/"


def install(source: str | Path, dest: Path, cache: Path, *extra: str | Path):  # type: ignore[no-untyped-def]
    return run_cli("install", source, "--dest", dest, "--cache-dir", cache, "--plain", *extra, timeout=300)


def part_paths(upstream: UpstreamServer) -> list[str]:
    return [r.path for r in upstream.log if r.method == "GET" and ".part" in r.path and r.path.endswith(".tar.gz")]


def without_version(tree: dict[str, str]) -> dict[str, str]:
    """An install's tree without what the installer adds: version.txt and its own marker."""
    return {name: digest for name, digest in tree.items() if name not in ("version.txt", ".vllm-bundle-install")}


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
    result = install(f"{upstream.url}/tampered/{TAG}/", dest, tmp_path / "fresh-cache")
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


def test_install_runs_from_any_directory_with_the_package_alone(
    consumer: Path, served: str, built: Path, tmp_path: Path
) -> None:
    """From a directory with no recipes in it: `--target auto` refuses in one line on a machine without
    an AMD GPU, and a named target installs the release, reading the packaged target table."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), **NO_GPU}
    command = [str(consumer / "bin" / "vllm-bundle"), "install", served, "--cache-dir", str(tmp_path / "cache")]

    def install_from_elsewhere(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *extra], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)

    refused = install_from_elsewhere("--target", "auto", "--dest", str(tmp_path / "auto"))
    assert_one_line_error(refused, "no supported AMD GPU found", "--target")
    assert "no recipes directory" not in refused.stderr
    installed = install_from_elsewhere("--target", "gfx1151", "--dest", str(tmp_path / "vllm"), "--plain")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert without_version(tree_digest(tmp_path / "vllm")) == tree_digest(built / "gfx1151" / "root")
