"""The lock step against the fake upstream: pins equal the served bytes; --check catches drift."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_REPO, assert_one_line_error, lock_against, run_cli, seed_vllm_build
from tests.upstream.fixture import (
    CP,
    PYPI,
    PYTHON_VERSION,
    ROCM_VERSION,
    THEROCK_NEXT,
    TORCH_VERSION,
    TORCHVISION_VERSION,
    TRITON_VERSION,
    Fixture,
)
from tests.upstream.registry import RegistryServer
from tests.upstream.server import UpstreamServer
from vllm_bundle.errors import LockError
from vllm_bundle.inputs.lockfile import BUILD_GROUP, BUILD_MARKER, read_lock, wheel_artifacts
from vllm_bundle.recipes import load_recipes


def lock_docs(recipes: Path, target: str = "gfx1151", channel: str = "stable") -> tuple[dict[str, Any], dict[str, Any]]:
    with (recipes / "locks" / channel / f"{target}.toml").open("rb") as f:
        lock = tomllib.load(f)
    with (recipes / "locks" / channel / f"pylock.{target}.toml").open("rb") as f:
        return lock, tomllib.load(f)


def test_lock_hashes_and_sizes_equal_the_served_bytes(locked: Path, fixture_tree: Fixture) -> None:
    lock, pylock = lock_docs(locked)
    pinned = [(a["filename"], a["sha256"], a["size"]) for a in lock["artifacts"]]
    for package in pylock["packages"]:
        (wheel,) = package["wheels"]
        pinned.append((wheel["url"].rsplit("/", 1)[-1], wheel["hashes"]["sha256"], wheel["size"]))
    assert len(pinned) > 10
    for filename, sha, size in pinned:
        served = fixture_tree.files.get(filename) or fixture_tree.releases / filename
        assert sha == fixture_tree.sha256(filename), filename
        assert size == served.stat().st_size, filename


def test_lock_holds_every_component_for_the_target(locked: Path) -> None:
    lock, pylock = lock_docs(locked)
    names = {p["name"] for p in pylock["packages"]}
    assert "rocm" not in names, "an sdist only: pinned beside the wheels, built into the bundle"
    assert {
        "rocm-sdk-core",
        "rocm-sdk-libraries",
        "rocm-sdk-devel",
        "rocm-sdk-device-gfx1151",
        "torch",
        "amd-torch-device-gfx1151",
        "amd-torch-device-gfx115x",  # the sub-family package stable whl-next has
        "torchvision",
        "amd-torchvision-device-gfx1151",
        "triton",
    } <= names
    assert not any(n.endswith(("gfx1100", "gfx950")) for n in names), "only the target's ISAs"
    assert {"fastapi", "pydantic", "regex", "sentencepiece"} <= names, "vLLM's requirement closure"
    assert lock["versions"] == {
        "python": PYTHON_VERSION,
        "rocm": ROCM_VERSION,
        "torch": TORCH_VERSION,
        "torchvision": TORCHVISION_VERSION,
        "triton": TRITON_VERSION,
        "vllm": "0.33.0",
    }
    assert {a["role"] for a in lock["artifacts"]} == {"python", "vllm-sdist", "rocm-sdist", "triton-kernels"}
    python = next(a for a in lock["artifacts"] if a["role"] == "python")
    assert python["url"].startswith("https://github.com/astral-sh/python-build-standalone/releases/download/")


def test_lock_keeps_the_one_wheel_the_bundle_installs(locked: Path) -> None:
    _, pylock = lock_docs(locked)
    regex = next(p for p in pylock["packages"] if p["name"] == "regex")
    assert [w["url"].rsplit("/", 1)[-1] for w in regex["wheels"]] == [
        f"regex-2025.11.3-{CP}-{CP}-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    ]


def test_vllm_torch_pins_are_replaced_by_therock_builds(locked: Path) -> None:
    _, pylock = lock_docs(locked)
    torch = next(p for p in pylock["packages"] if p["name"] == "torch")
    assert torch["version"] == TORCH_VERSION  # vLLM's requirements/rocm.txt asked for torch==2.12.0: dropped


def test_lock_check_passes_on_a_fresh_lock(locked: Path) -> None:
    result = run_cli("lock", "--check", "--recipes", locked)
    assert result.returncode == 0, result.stderr
    assert "ok     stable/gfx1151" in result.stdout


def test_fetch_artifacts_come_from_the_lock(locked: Path) -> None:
    recipes = load_recipes(locked)
    lock, pylock = read_lock(locked / "locks", "stable", "gfx1151")
    wheels = wheel_artifacts(pylock, recipes.python.minor, recipes.python.platform)
    assert all(a.size and len(a.sha256) == 64 for a in [*lock.artifacts, *wheels])
    # The lock keeps one wheel a package: the bundle's are those of the packages without the build marker
    # (uv's own markers, such as llguidance's platform_machine == 'x86_64', hold for the bundle).
    every = {p["name"]: p["wheels"][0]["url"] for p in pylock["packages"]}
    bundled = {p["name"]: p["wheels"][0]["url"] for p in pylock["packages"] if p.get("marker") != BUILD_MARKER}
    assert len(bundled) < len(every)
    assert {a.name: a.url for a in wheels} == bundled
    with_build = wheel_artifacts(pylock, recipes.python.minor, recipes.python.platform, frozenset({BUILD_GROUP}))
    assert {a.name: a.url for a in with_build} == every


def _pylock(*packages: dict[str, Any]) -> dict[str, Any]:
    return {"lock-version": "1.0", "created-by": "uv", "requires-python": ">=3.12", "packages": list(packages)}


def _wheel(name: str) -> dict[str, Any]:
    return {"url": f"https://files.example/{name}", "size": 1, "hashes": {"sha256": "ab" * 32}}


def test_wheel_selection_follows_pep_751() -> None:
    """The best wheel by tag for the bundle's CPython and manylinux platform, a build-group package only
    when the group is asked for; a lock that breaks PEP 751 or has no wheel for the platform is refused."""
    regex = {
        "name": "regex",
        "version": "1.0",
        "wheels": [
            _wheel("regex-1.0-cp312-cp312-manylinux_2_39_x86_64.whl"),  # newer than the platform allows
            _wheel("regex-1.0-py3-none-any.whl"),
            _wheel("regex-1.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
            _wheel("regex-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
        ],
    }
    cmake = {
        "name": "cmake",
        "version": "4.0",
        "marker": BUILD_MARKER,
        "wheels": [_wheel("cmake-4.0-py3-none-any.whl")],
    }
    lock = _pylock(regex, cmake)
    assert [a.filename for a in wheel_artifacts(lock, "3.12", "x86_64-manylinux_2_35")] == [
        "regex-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    ]
    assert [a.filename for a in wheel_artifacts(lock, "3.12", "x86_64-manylinux_2_17", frozenset({BUILD_GROUP}))] == [
        "regex-1.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "cmake-4.0-py3-none-any.whl",
    ]
    only_new = {**regex, "wheels": regex["wheels"][:1]}
    with pytest.raises(LockError, match="No wheel found matching the provided tags for package 'regex'"):
        wheel_artifacts(_pylock(only_new), "3.12", "x86_64-manylinux_2_35")
    with pytest.raises(LockError, match="Missing required value in 'created-by'"):
        wheel_artifacts({k: v for k, v in lock.items() if k != "created-by"}, "3.12", "x86_64-manylinux_2_35")
    with pytest.raises(LockError, match="does not satisfy the Python version requirement"):
        wheel_artifacts(lock, "3.11", "x86_64-manylinux_2_35")


@pytest.fixture
def locked_copy(locked: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "locked-recipes"
    shutil.copytree(locked, copy)
    return copy


def test_lock_out_of_date_with_its_recipe(locked_copy: Path) -> None:
    channels = locked_copy / "channels.toml"
    channels.write_text(channels.read_text().replace('torch = ">=2.13"', 'torch = ">=2.13,<2.14"', 1))
    result = run_cli("lock", "--check", "--recipes", locked_copy)
    assert_one_line_error(result, "out of date with its recipe", "nox -s lock -- gfx1151 --channel stable")
    fetch = run_cli("fetch", "gfx1151", "--recipes", locked_copy, "--offline", "--cache-dir", locked_copy / "c")
    assert_one_line_error(fetch, "out of date"), "fetch refuses a stale lock too"


def test_hand_edited_pylock_is_refused(locked_copy: Path) -> None:
    pylock = locked_copy / "locks" / "stable" / "pylock.gfx1151.toml"
    pylock.write_text(pylock.read_text().replace("fastapi", "fastapi-evil", 1))
    result = run_cli("lock", "--check", "--recipes", locked_copy)
    assert_one_line_error(result, "pylock.gfx1151.toml does not match gfx1151.toml")


@pytest.mark.parametrize("field", ["size", "sha256", "url"])
def test_hand_edited_toml_lock_is_refused(locked_copy: Path, field: str) -> None:
    lock = locked_copy / "locks" / "stable" / "gfx1151.toml"
    doc = tomllib.loads(lock.read_text())
    python = next(a for a in doc["artifacts"] if a["role"] == "python")
    edited = {"size": str(python["size"] + 1), "sha256": "0" * 64, "url": python["url"] + "x"}[field]
    original = str(python[field])
    text = lock.read_text()
    assert text.count(original) == 1
    lock.write_text(text.replace(original, edited))
    assert_one_line_error(run_cli("lock", "--check", "--recipes", locked_copy), "gfx1151.toml", "edited by hand")
    fetch = run_cli("fetch", "gfx1151", "--recipes", locked_copy, "--offline", "--cache-dir", locked_copy / "c")
    assert_one_line_error(fetch, "edited by hand")


def test_missing_lock_says_where_to_make_it(recipes_dir: Path) -> None:
    result = run_cli("lock", "--check", "gfx950", "--recipes", recipes_dir)
    assert_one_line_error(result, "no lock for stable/gfx950", "nox -s lock")


def test_relock_is_deterministic_and_leaves_no_unpacked_wheels(
    locked: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """The same lock again, byte for byte; and uv's cache, where it unpacks every wheel it downloads to
    hash or read it (2x the installed tree at real size, bench/release_job.py), goes when the lock is
    done: a job that locks every target and channel would otherwise keep them all."""
    again = tmp_path / "recipes"
    shutil.copytree(locked, again)
    result = lock_against(upstream, again, "gfx1151", tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    for name in ("gfx1151.toml", "pylock.gfx1151.toml"):
        assert (again / "locks" / "stable" / name).read_bytes() == (locked / "locks" / "stable" / name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["blobs", "locks", "partial"]
    assert not list((tmp_path / "cache").rglob("*.dist-info"))


def test_lock_for_a_multi_isa_target(locked: Path, upstream: UpstreamServer, tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(locked, recipes)
    result = lock_against(upstream, recipes, "gfx110X", tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    _, pylock = lock_docs(recipes, "gfx110X")
    names = {p["name"] for p in pylock["packages"]}
    for isa in ("gfx1100", "gfx1101", "gfx1102", "gfx1103"):
        assert {f"rocm-sdk-device-{isa}", f"amd-torch-device-{isa}"} <= names


def test_lock_with_a_python_release_lacking_the_asset(locked: Path, upstream: UpstreamServer, tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(locked, recipes)
    components = recipes / "components.toml"
    components.write_text(components.read_text().replace(f'version = "{PYTHON_VERSION}"', 'version = "3.99.1"'))
    result = lock_against(upstream, recipes, "gfx1151", tmp_path / "cache")
    assert_one_line_error(result, "does not list cpython-3.99.1", "components.toml")


@pytest.mark.parametrize(
    ("pin", "unsatisfiable", "error"),
    [
        ('torch = ">=2.13"', 'torch = ">=9"', "uv could not resolve the wheels for gfx1151/stable"),
        (
            'rocm = ">=10.0"',
            'rocm = "<10"',
            f"torch {TORCH_VERSION} requires ROCm {ROCM_VERSION}, which channel stable does not allow (rocm <10)",
        ),
    ],
    ids=["torch", "the ROCm torch requires"],
)
def test_lock_with_an_unsatisfiable_version(
    locked: Path, upstream: UpstreamServer, tmp_path: Path, pin: str, unsatisfiable: str, error: str
) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(locked, recipes)
    channels = recipes / "channels.toml"
    assert pin in channels.read_text(), f"premise: channels.toml has {pin}"
    channels.write_text(channels.read_text().replace(pin, unsatisfiable, 1))
    result = lock_against(upstream, recipes, "gfx1151", tmp_path / "cache")
    assert_one_line_error(result, error, "channels.toml")
    assert (recipes / "locks" / "stable" / "gfx1151.toml").read_bytes() == (
        locked / "locks" / "stable" / "gfx1151.toml"
    ).read_bytes(), "a failed lock leaves the old one intact"


def test_repackage_mode_pins_a_prebuilt_vllm_wheel(locked: Path, upstream: UpstreamServer, tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(locked, recipes)
    channels = recipes / "channels.toml"
    channels.write_text(
        channels.read_text().replace(
            "[channels.stable.versions]", f'vllm-wheel = "==0.33.0+rocm{ROCM_VERSION}"\n\n[channels.stable.versions]', 1
        )
    )
    result = lock_against(upstream, recipes, "gfx1151", tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    lock, pylock = lock_docs(recipes)
    assert [a["role"] for a in lock["artifacts"]] == ["python", "rocm-sdist"], "no vLLM source release to build"
    assert lock["versions"]["vllm"] == f"0.33.0+rocm{ROCM_VERSION}"
    vllm = next(p for p in pylock["packages"] if p["name"] == "vllm")
    assert vllm["wheels"][0]["url"].endswith(f"vllm-0.33.0+rocm{ROCM_VERSION}-{CP}-{CP}-linux_x86_64.whl")
    assert {"fastapi", "regex", "torch"} <= {p["name"] for p in pylock["packages"]}, "the wheel's own closure"

    common: list[str | Path] = [
        "--recipes",
        recipes,
        "--cache-dir",
        tmp_path / "cache2",
        "--mirror",
        f"{upstream.url}/mirror/",
        "--build-dir",
        tmp_path / "build",
        "--plain",
    ]
    built = run_cli("vllm-wheel", "gfx1151", *common)
    assert built.returncode == 0, built.stderr
    assert "(prebuilt)" in built.stdout
    stage = tmp_path / "build" / "gfx1151" / "vllm-wheel"
    assert [p.name for p in stage.iterdir()] == [f"vllm-0.33.0+rocm{ROCM_VERSION}-{CP}-{CP}-linux_x86_64.whl"]
    assert_one_line_error(run_cli("patch", "gfx1151", *common), "repackage mode", "nothing to patch")


# -- `bundle` locks first where no lock exists (as `uv run` does); `--locked` refuses ---------------------


def _bundle_locking(  # type: ignore[no-untyped-def]
    recipes: Path, upstream: UpstreamServer, work: Path, *extra: str, builder: RegistryServer | None = None
):
    """``bundle`` with the fake upstream's indexes (for locking first), vLLM compiled in the builder that
    ``builder`` serves (else refused before: the tests with none stop at the target's lock)."""
    args: list[str | Path] = ["bundle", "gfx1151", "--recipes", recipes, "--cache-dir", work / "cache", "--plain"]
    args += ["--therock-index", f"{upstream.url}/{THEROCK_NEXT}/", "--pypi-index", f"{upstream.url}/{PYPI}/"]
    args += ["--mirror", f"{upstream.url}/mirror/"]
    args += ["--registry-mirror", builder.host] if builder else []
    return run_cli(*args, "--build-dir", work / "build", "--no-archive", *extra, timeout=600)


def _cache_of(built: Path, work: Path) -> None:
    """The suite's download cache, by hard links (its builder image's root file system among it): what is
    tested is the lock, not a second unpacking of the builder."""
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(built.parent / "cache"), str(work / "cache")], check=True)


def test_bundle_without_a_lock_locks_first_then_builds(
    recipes_dir: Path,
    upstream: UpstreamServer,
    locked: Path,
    built: Path,
    builder_registry: RegistryServer,
    tmp_path: Path,
) -> None:
    seed_vllm_build(built, tmp_path / "build")  # the same lock: the suite's vLLM build is reused
    _cache_of(built, tmp_path)
    result = _bundle_locking(recipes_dir, upstream, tmp_path, builder=builder_registry)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stage  vllm-wheel  cached" in result.stdout, "the seeded build, as the lock is the same"
    first = result.stdout.splitlines()[0]
    assert first.startswith("lock   no lock for stable/gfx1151 at ") and "locking gfx1151 (stable) first" in first
    assert result.stdout.splitlines()[1].startswith("locked gfx1151 (stable): ")
    for name in ("gfx1151.toml", "pylock.gfx1151.toml"):  # the same pins as `vllm-bundle lock` makes
        made, expected = recipes_dir / "locks" / "stable" / name, locked / "locks" / "stable" / name
        assert made.read_bytes() == expected.read_bytes()
    assert (tmp_path / "build" / "gfx1151" / "root" / "bin" / "vllm-server").is_file()
    assert "locked builder image ghcr.io/rocm/therock_build_manylinux_x86_64:latest: sha256:" in result.stdout
    again = _bundle_locking(recipes_dir, upstream, tmp_path, builder=builder_registry)
    assert again.returncode == 0 and "lock   " not in again.stdout, "an existing, current lock is used as it is"


def test_bundle_locked_refuses_a_missing_or_stale_lock(
    recipes_dir: Path, locked_copy: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    missing = _bundle_locking(recipes_dir, upstream, tmp_path / "a", "--locked")
    assert_one_line_error(missing, "no lock for stable/gfx1151", "nox -s lock")
    assert not (recipes_dir / "locks").exists() and not (tmp_path / "a" / "build").exists()
    assert upstream.log == [], "no connection"
    channels = locked_copy / "channels.toml"
    channels.write_text(channels.read_text().replace('torch = ">=2.13"', 'torch = ">=2.13,<2.14"', 1))
    stale = _bundle_locking(locked_copy, upstream, tmp_path / "b", "--locked")
    assert_one_line_error(stale, "out of date with its recipe")


def test_bundle_with_a_stale_lock_relocks_and_says_why(
    locked_copy: Path, upstream: UpstreamServer, built: Path, builder_registry: RegistryServer, tmp_path: Path
) -> None:
    seed_vllm_build(built, tmp_path / "build")
    _cache_of(built, tmp_path)
    channels = locked_copy / "channels.toml"
    channels.write_text(channels.read_text().replace('torch = ">=2.13"', 'torch = ">=2.13,<2.14"', 1))
    result = _bundle_locking(locked_copy, upstream, tmp_path, builder=builder_registry)
    assert result.returncode == 0, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("lock   lock ") and "out of date with its recipe" in first and "first" in first
    check = run_cli("lock", "--check", "--recipes", locked_copy)
    assert check.returncode == 0, check.stderr


def test_bundle_without_a_lock_and_no_network_is_one_line(recipes_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    args: list[str | Path] = ["bundle", "gfx1151", "--recipes", recipes_dir, "--cache-dir", tmp_path / "cache"]
    args += ["--retries", "1", "--therock-index", f"{closed}/therock/", "--pypi-index", f"{closed}/simple/"]
    args += ["--mirror", f"{closed}/mirror/"]
    result = run_cli(*args, "--build-dir", tmp_path / "build", "--repo", TEST_REPO)
    assert_one_line_error(result, "cannot download", closed)
    assert not (recipes_dir / "locks").exists(), "no lock half-written"
