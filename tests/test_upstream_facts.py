"""UPSTREAM-FACTS.md as tests: the fake upstream has each property of the real one that the pipeline
depends on, and the lock, the build and tier 0 handle each (the real vLLM facts are read from its
source release on PyPI)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import requests
from packaging.utils import parse_wheel_filename

from tests.conftest import FIXTURE_PLATFORM, REPO, VllmSdists, assert_one_line_error, run_cli
from tests.upstream.fixture import (
    PYPI,
    PYTHON_MINOR,
    ROCM_VERSION,
    THEROCK_MULTI_ARCH,
    THEROCK_NEXT,
    TORCH_VERSION,
    TORCHVISION_VERSION,
    Fixture,
)
from tests.upstream.server import Fault, UpstreamServer
from tests.upstream.therock import HIP_RUNTIME_H, MULTI_ARCH, NEXT, PER_FAMILY, host_compiler, rocm_sdist, sdk_clang
from tests.upstream.vllm_release import TRITON_KERNELS_COMMIT
from vllm_bundle.errors import AssembleError
from vllm_bundle.inputs.facts import IndexFacts
from vllm_bundle.inputs.triton_kernels import CMAKE_FILE, source_of
from vllm_bundle.recipes import load_recipes
from vllm_bundle.tree.assemble import build_sdist_wheel, install_wheels
from vllm_bundle.tree.layout import Layout
from vllm_bundle.util.elf import dynamic_info
from vllm_bundle.util.fsutil import sha256_file
from vllm_bundle.util.offload import fatbin_isas

SITE = f"lib/python{PYTHON_MINOR}/site-packages"


def _project_files(fixture: Fixture, index: str, project: str) -> list[Path]:
    return [p for p in fixture.indexes[index] if re.sub(r"[-_.]+", "-", p.name.split("-")[0]).lower() == project]


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name).decode()


def _pylock(recipes: Path, target: str = "gfx1151", channel: str = "stable") -> dict[str, Any]:
    with (recipes / "locks" / channel / f"pylock.{target}.toml").open("rb") as handle:
        return tomllib.load(handle)


def _package(pylock: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in pylock["packages"] if p["name"] == name)


def _lock(upstream: UpstreamServer, recipes: Path, target: str, cache: Path, *extra: str, index: str = ""):  # type: ignore[no-untyped-def]
    return run_cli(
        *("lock", target, "--recipes", recipes, "--cache-dir", cache, "--plain"),
        *(
            "--therock-index",
            f"{upstream.url}/{index or THEROCK_NEXT}/",
            "--pypi-index",
            f"{upstream.url}/{PYPI}/",
        ),
        *("--mirror", f"{upstream.url}/releases/", *extra),
    )


# -- 1. `rocm` is an sdist only; torch requires rocm[libraries] ----------------------------------------------


def test_rocm_is_published_as_an_sdist_only_and_torch_requires_it(fixture_tree: Fixture) -> None:
    for index in (THEROCK_MULTI_ARCH, THEROCK_NEXT):
        rocm = _project_files(fixture_tree, index, "rocm")
        assert rocm and all(p.name.endswith(".tar.gz") for p in rocm), index
    (torch,) = _project_files(fixture_tree, THEROCK_NEXT, "torch")
    assert f"Requires-Dist: rocm[libraries]=={ROCM_VERSION}" in _metadata(torch)


def test_the_lock_takes_the_sdk_by_its_wheels_and_pins_the_rocm_sdist(locked: Path, fixture_tree: Fixture) -> None:
    names = {p["name"] for p in _pylock(locked)["packages"]}
    assert "rocm" not in names and {"rocm-sdk-core", "rocm-sdk-libraries", "rocm-sdk-devel"} <= names
    assert _package(_pylock(locked), "rocm-sdk-devel")["marker"] == "'build' in dependency_groups", "build-only"
    lock = tomllib.loads((locked / "locks" / "stable" / "gfx1151.toml").read_text())
    (rocm,) = [a for a in lock["artifacts"] if a["role"] == "rocm-sdist"]
    assert rocm["filename"] == f"rocm-{ROCM_VERSION}.tar.gz"
    assert rocm["sha256"] == fixture_tree.sha256(rocm["filename"]), "hashed from its bytes (its page has none)"
    assert lock["versions"]["rocm"] == _package(_pylock(locked), "rocm-sdk-core")["version"]


def test_the_bundle_builds_rocm_sdk_from_the_sdist(built: Path) -> None:
    site = built / "gfx1151" / "root" / SITE
    assert (site / "rocm_sdk" / "__init__.py").is_file() and list(site.glob("rocm-*.dist-info"))
    assert (built / "gfx1151" / "root" / "bin" / "rocm-sdk").is_file()
    report = json.loads((built / "gfx1151" / "qualify" / "qualification.json").read_text())
    smoke = next(c for c in report["checks"] if c["name"] == "relocated-smoke")
    assert smoke["passed"], "torch imports rocm_sdk at start-up: the bundle runs only with it"


@pytest.mark.parametrize("index", [NEXT, dataclasses.replace(PER_FAMILY, families=("gfx1151",))], ids=lambda i: i.name)
def test_an_sdk_family_the_rocm_sdist_was_not_built_for_is_named(index: IndexFacts, tmp_path: Path) -> None:
    """TheRock's ``rocm`` sdist raises at build time for a family it was not built for (rocm_sdk/_dist_info.py
    ``determine_target_family``); the error is its line, not uv's closing hint."""
    sdist = rocm_sdist(tmp_path, NEXT.versions["rocm"], index)
    with pytest.raises(AssembleError) as raised:
        build_sdist_wheel(sdist, sdist.name, tmp_path / "out", 0, "gfx110X-all")
    assert "Requested ROCM_SDK_TARGET_FAMILY=gfx110X-all is not available in the distribution" in str(raised.value)


# -- 2. the closure needs manylinux_2_35 ---------------------------------------------------------------------


def test_the_closure_has_wheels_only_for_newer_manylinux(fixture_tree: Fixture) -> None:
    def platforms(project: str) -> set[str]:
        return {
            t.platform for p in _project_files(fixture_tree, PYPI, project) for t in parse_wheel_filename(p.name)[3]
        }

    assert platforms("llguidance") == {"manylinux_2_31_x86_64"}
    assert platforms("mooncake-transfer-engine-rocm") == {"manylinux_2_35_x86_64"}
    assert load_recipes(REPO / "recipes").python.platform == "x86_64-manylinux_2_35"


def test_a_platform_too_old_for_the_closure_names_the_package(
    recipes_dir: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    components = recipes_dir / "components.toml"
    components.write_text(components.read_text().replace(FIXTURE_PLATFORM, "x86_64-manylinux_2_28"))
    result = _lock(upstream, recipes_dir, "gfx1151", tmp_path / "cache")
    assert_one_line_error(  # uv stops at the first such package of the closure (mooncake needs 2_35 too)
        result, "llguidance 1.7.3 has wheels only for manylinux_2_31_x86_64, none for x86_64-manylinux_2_28", "platform"
    )


# -- 3. TheRock's index mirrors PyPI packages: they still come from PyPI ------------------------------------


def test_overlapping_names_come_from_pypi_and_therocks_own_from_therock(
    locked: Path, fixture_tree: Fixture, upstream: UpstreamServer
) -> None:
    for project in ("numpy", "setuptools", "filelock"):
        assert _project_files(fixture_tree, THEROCK_NEXT, project) and _project_files(fixture_tree, PYPI, project)
    pylock = _pylock(locked)
    assert _package(pylock, "numpy")["version"] == "2.3.5", "TheRock's mirror has 2.9.0"
    assert _package(pylock, "setuptools")["version"] == "79.0.1", "vLLM needs setuptools<80 (TheRock mirrors 81)"
    assert _package(pylock, "torch")["version"] == TORCH_VERSION, "TheRock's own packages from TheRock"


# -- 4. hashes may be absent from TheRock's pages ----------------------------------------------------------


def test_pages_without_hashes_still_give_verified_pins(
    fixture_tree: Fixture, recipes_dir: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    page = (fixture_tree.root / THEROCK_NEXT / "rocm-sdk-libraries" / "index.html").read_text()
    assert "#sha256=" not in page, "premise: this page publishes no hash"
    result = _lock(upstream, recipes_dir, "gfx1151", tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    assert re.search(
        r"lock   hashed \d+ files the indexes published no sha256 for \([\d.]+ \w+ downloaded\)", result.stderr
    )
    wheel = _package(_pylock(recipes_dir), "rocm-sdk-libraries")["wheels"][0]
    served = fixture_tree.files[wheel["url"].rsplit("/", 1)[-1]]
    assert wheel["hashes"]["sha256"] == sha256_file(served) and wheel["size"] == served.stat().st_size


def test_the_locks_hashing_downloads_resume_show_progress_and_run_several_at_a_time(
    fixture_tree: Fixture, recipes_dir: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """TheRock's hashless wheels weigh gigabytes: the lock hashes them through the fetcher (manage.py gives
    some pages no #sha256, manage_structured.py none), so a cut body resumes where it stopped, each file
    shows progress, and several move at once (the faults touch only the tool's requests, not uv's)."""
    libraries = next(name for name in fixture_tree.files if name.startswith(f"rocm_sdk_libraries-{ROCM_VERSION}-"))
    slow = [
        next(name for name in fixture_tree.files if name.startswith(prefix))
        for prefix in ("rocm_sdk_device_gfx1151-", "amd_torch_device_gfx1151-", "triton-")
    ]
    size = fixture_tree.files[libraries].stat().st_size
    upstream.inject(f"/files/{libraries}", Fault("cut", after=size // 2, agent="vllm-bundle/"))
    for name in slow:  # each body takes half a second
        rate = fixture_tree.files[name].stat().st_size * 2
        upstream.inject(f"/files/{name}", Fault("throttle", times=None, rate=rate, agent="vllm-bundle/"))
    result = _lock(upstream, recipes_dir, "gfx1151", tmp_path / "cache", "--jobs", "4")
    assert result.returncode == 0, result.stderr
    ranges = [r.range for r in upstream.requests_for(f"/files/{libraries}") if r.range]
    assert f"bytes={size // 2}-" in ranges, f"the cut download resumed where it stopped: {ranges}"
    assert f"retry  {libraries}: " in result.stderr, "the resume is shown"
    for name in [libraries, *slow]:
        assert re.search(rf"(?m)^fetch  {re.escape(name)} \(", result.stderr), f"progress of {name}"
        assert re.search(rf"(?m)^done   {re.escape(name)} \(", result.stderr), f"progress of {name}"
    assert upstream.most_in_flight >= 2, "several hashing downloads at once"
    wheel = _package(_pylock(recipes_dir), "rocm-sdk-libraries")["wheels"][0]
    assert wheel["hashes"]["sha256"] == fixture_tree.sha256(libraries), "the resumed bytes hash to the file"


# -- 5. device code: what torch and torchvision declare, never a name probed --------------------------------


def test_a_project_page_that_is_not_there_answers_403_on_repo_amd_com(upstream: UpstreamServer) -> None:
    """repo.amd.com answers 403 for a missing project page (ROCm/rocm-cli#194, #271); PyPI answers 404."""
    for path, status in ((f"/{THEROCK_MULTI_ARCH}/rocm-sdk-device-gfx115x/", 403), (f"/{PYPI}/no-such-project/", 404)):
        assert requests.get(upstream.url + path, timeout=10).status_code == status, path


def test_the_lock_takes_device_code_from_torchs_extras_and_asks_for_no_missing_page(
    locked: Path, upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path
) -> None:
    """torch[device-gfx1151] names amd-torch-device-gfx1151 and the gfx11 family package on whl-multi-arch
    (channel frozen-7.14); the lock pins exactly those, and no request of it meets a 403 (the old lock probed
    gfx115x, gfx11 ...)."""
    result = _lock(
        upstream, recipes_dir, "gfx1151", tmp_path / "cache", "--channel", "frozen-7.14", index=THEROCK_MULTI_ARCH
    )
    assert result.returncode == 0, result.stderr
    names = {p["name"] for p in _pylock(recipes_dir, channel="frozen-7.14")["packages"]}
    assert {n for n in names if n.startswith("amd-torch-device")} == {
        "amd-torch-device-gfx1151",
        "amd-torch-device-gfx11",
    }
    assert {n for n in names if n.startswith("amd-torchvision-device")} == {"amd-torchvision-device-gfx1151"}
    assert {n for n in names if n.startswith("rocm-sdk-device")} == {"rocm-sdk-device-gfx1151"}
    assert [r.path for r in upstream.log if r.status in (403, 404)] == []


@pytest.mark.parametrize("missing", [403, 404])
def test_whl_next_device_code_is_what_torch_declares_whatever_a_missing_page_answers(
    missing: int, recipes_dir: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    """whl-next has per-ISA and sub-family torch device packages (rocm_whl_next_ownership.yaml); what it
    answers for a missing page no source says, so the lock must work with either."""
    upstream.missing_status[f"/{THEROCK_NEXT}/"] = missing
    try:
        for target, torch_devices, sdk_devices in (
            ("gfx1151", {"amd-torch-device-gfx1151", "amd-torch-device-gfx115x"}, {"rocm-sdk-device-gfx1151"}),
            (
                "gfx110X",
                {*(f"amd-torch-device-gfx110{n}" for n in range(4)), "amd-torch-device-gfx110x"},
                {f"rocm-sdk-device-gfx110{n}" for n in range(4)},
            ),
        ):
            result = _lock(upstream, recipes_dir, target, tmp_path / "cache")
            assert result.returncode == 0, result.stderr
            pylock = _pylock(recipes_dir, target)
            names = {p["name"] for p in pylock["packages"]}
            assert {n for n in names if n.startswith("amd-torch-device")} == torch_devices
            assert {n for n in names if n.startswith("rocm-sdk-device")} == sdk_devices
            assert _package(pylock, "torch")["version"] == "2.13.0+rocm10.0.0", "vLLM 0.33.0's own ROCm image's"
            for name in torch_devices:  # PyPI has a 0.0.1.dev0 placeholder under amd-torch-device-gfx110x
                assert _package(pylock, name)["version"] == "2.13.0+rocm10.0.0", name
    finally:
        upstream.missing_status[f"/{THEROCK_NEXT}/"] = 404


def test_the_sdk_is_the_release_torch_requires(locked: Path, fixture_tree: Fixture) -> None:
    """The index holds SDK 10.0.1 (no torch built with it) beside 10.0.0; torch requires rocm[libraries]==10.0.0:
    every SDK wheel and the rocm sdist are 10.0.0, though the channel allows >=10.0."""
    (torch,) = [p for p in _project_files(fixture_tree, THEROCK_NEXT, "torch")]
    assert f"Requires-Dist: rocm[libraries]=={ROCM_VERSION}" in _metadata(torch)
    assert any("10.0.1" in p.name for p in _project_files(fixture_tree, THEROCK_NEXT, "rocm-sdk-core"))
    pylock = _pylock(locked)
    for name in ("rocm-sdk-core", "rocm-sdk-libraries", "rocm-sdk-device-gfx1151", "rocm-sdk-devel"):
        assert _package(pylock, name)["version"] == ROCM_VERSION, name
    lock = tomllib.loads((locked / "locks" / "stable" / "gfx1151.toml").read_text())
    assert lock["versions"]["rocm"] == ROCM_VERSION
    assert next(a for a in lock["artifacts"] if a["role"] == "rocm-sdist")["filename"] == f"rocm-{ROCM_VERSION}.tar.gz"


# -- 6. the torch family from TheRock; PyPI's CUDA builds stay out --------------------------------------------


def test_pypi_serves_a_cuda_torchvision_and_the_bundle_takes_therocks(
    locked: Path, built: Path, fixture_tree: Fixture
) -> None:
    (cuda,) = _project_files(fixture_tree, PYPI, "torchvision")
    assert "-manylinux_2_28_x86_64" in cuda.name, "premise: PyPI's torchvision 0.27.0 is a CUDA 13 build"
    with zipfile.ZipFile(cuda) as wheel:
        assert "torchvision.libs/libcudart.faf08d9a.so.13" in wheel.namelist()
    vision = _package(_pylock(locked), "torchvision")
    assert vision["version"] == TORCHVISION_VERSION
    assert vision["wheels"][0]["url"].rsplit("/", 1)[-1] in {p.name for p in fixture_tree.indexes[THEROCK_NEXT]}
    site = built / "gfx1151" / "root" / SITE
    assert not list(site.rglob("libcudart.*")) and not list(site.glob("torch_c_dlpack_ext/*-cuda.so"))
    report = json.loads((built / "gfx1151" / "qualify" / "qualification.json").read_text())
    assert next(c for c in report["checks"] if c["name"] == "no-cuda")["passed"]


def test_tilelangs_own_cuda_shims_stay_and_are_not_cuda_libraries(built: Path) -> None:
    """tilelang 0.1.10 ships dlopen shims named like CUDA's libraries (libcudart_stub.so, libnvrtc_stub.so)
    that its libtilelang.so needs (facts.toml): they stay in the bundle, resolve, and pass no-cuda."""
    lib = built / "gfx1151" / "root" / SITE / "tilelang" / "lib"
    assert {"libcudart_stub.so", "libnvrtc_stub.so", "libcuda_stub.so"} <= {p.name for p in lib.iterdir()}
    info = dynamic_info(lib / "libtilelang.so")
    assert info is not None and {"libcuda_stub.so", "libhip_stub.so"} <= set(info.needed)
    report = json.loads((built / "gfx1151" / "qualify" / "qualification.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["no-cuda"]["passed"] and checks["elf-closure"]["passed"], checks["no-cuda"]["problems"]


def test_every_sdk_device_wheel_ships_the_same_empty_init(fixture_tree: Fixture, built: Path) -> None:
    """TheRock's rocm-sdk-libraries and rocm-sdk-device-* ship one empty _rocm_sdk_libraries/__init__.py;
    pypa/installer refuses a second copy unless it is told they coexist."""
    shared = "_rocm_sdk_libraries/__init__.py"
    wheels = [
        p for p in fixture_tree.indexes[THEROCK_NEXT] if p.name.startswith(("rocm_sdk_device", "rocm_sdk_libraries"))
    ]
    assert len(wheels) > 2
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            assert archive.read(shared) == b"", wheel.name
    site = built / "gfx1151" / "root" / SITE
    assert (site / shared).read_bytes() == b""
    assert (site / "_rocm_sdk_libraries" / ".kpack" / "blas_lib_gfx1151.kpack").is_file()


def test_a_frozen_per_family_index_that_does_not_exist_is_one_line(
    recipes_dir: Path, upstream: UpstreamServer, tmp_path: Path
) -> None:
    result = run_cli(
        *(
            "lock",
            "gfx1150",
            "--recipes",
            recipes_dir,
            "--cache-dir",
            tmp_path / "cache",
            "--channel",
            "nightly-legacy",
        ),
        *("--therock-index", f"{upstream.url}/therock/v2/{{family}}/", "--pypi-index", f"{upstream.url}/{PYPI}/"),
        *("--mirror", f"{upstream.url}/releases/"),
    )
    assert_one_line_error(result, "TheRock has no per-family index for gfx1150", "frozen", "--channel stable")


# -- 6. tier 0 on real inputs ------------------------------------------------------------------------------


def test_libpython3_so_names_its_library_through_origin_and_passes(built: Path) -> None:
    info = dynamic_info(built / "gfx1151" / "root" / "lib" / "libpython3.so")
    assert info is not None and f"$ORIGIN/../lib/libpython{PYTHON_MINOR}.so.1.0" in info.needed
    report = json.loads((built / "gfx1151" / "qualify" / "qualification.json").read_text())
    closure = next(c for c in report["checks"] if c["name"] == "elf-closure")
    assert closure["passed"], closure["problems"]
    assert "optional for mooncake-transfer-engine-rocm" in closure["summary"]


def test_wheel_libraries_host_and_absolute_runpaths(built: Path) -> None:
    site = built / "gfx1151" / "root" / SITE
    grpc = dynamic_info(site / "grpc" / "_cython" / "cygrpc.so")
    assert grpc is not None and "libz.so.1" in grpc.needed, "allowed by the manylinux policy (auditwheel's data)"
    mooncake = dynamic_info(site / "mooncake" / "engine.so")
    assert mooncake is not None and not any(e.startswith("/") for e in (*mooncake.rpath, *mooncake.runpath)), (
        "an absolute RUNPATH into a host's ROCm is dropped"
    )


def test_an_unresolved_library_is_named_by_its_package(built: Path, locked: Path, tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(locked, recipes)
    rules = recipes / "qualify.toml"
    rules.write_text("\n".join(ln for ln in rules.read_text().splitlines() if not ln.startswith('"mooncake')) + "\n")
    result = run_cli("qualify", built / "gfx1151" / "root", "--recipes", recipes, "--report", tmp_path / "r.json")
    assert_one_line_error(result, "elf-closure", "mooncake-transfer-engine-rocm: ", "engine.so needs libibverbs.so.1")


# -- 8. the CPython pin is one python-build-standalone publishes ----------------------------------------------


def test_the_cpython_recipe_is_in_pbs_installers_table() -> None:
    from importlib import resources

    table = json.loads(resources.files("pbs_installer").joinpath("versions.json").read_text())
    published = {f["filename"]: f for entry in table for f in entry["files"]}
    python = load_recipes(REPO / "recipes").python
    assert python.asset in published, f"{python.asset} is not a build python-build-standalone published"
    for lock in (REPO / "recipes" / "locks").glob("*/*.toml") if (REPO / "recipes" / "locks").is_dir() else ():
        if lock.name.startswith("pylock."):
            continue
        pinned = next(a for a in tomllib.loads(lock.read_text())["artifacts"] if a["role"] == "python")
        assert pinned["sha256"] == published[pinned["filename"]]["sha256"], lock


# -- the real vLLM 0.33.0 source release, as UPSTREAM-FACTS.md describes it ----------------------------------


def test_vllm_0_33_source_release_facts(vllm_sdist: VllmSdists) -> None:
    wanted = {
        "requirements/rocm.txt",
        "requirements/build/rock.txt",
        "requirements/build/rocm.txt",
        "docker/Dockerfile.rocm_base",
        "CMakeLists.txt",
        "vllm/entrypoints/openai/api_server.py",
        "vllm/platforms/__init__.py",
    }
    texts: dict[str, str] = {}
    with tarfile.open(vllm_sdist("0.33.0")) as archive:
        for member in archive:
            name = member.name.removeprefix("vllm-0.33.0/")
            if name in wanted:
                texts[name] = archive.extractfile(member).read().decode()  # type: ignore[union-attr]
    rocm = [ln.split("#")[0].strip() for ln in texts["requirements/rocm.txt"].splitlines()]
    assert not any(ln.startswith(("torch", "triton")) for ln in rocm), "no torch/triton lines"
    assert "torch==2.12.0+rocm7.14.0" in texts["requirements/build/rock.txt"]
    archs = re.search(r'set\(HIP_SUPPORTED_ARCHS "([^"]*)"\)', texts["CMakeLists.txt"])
    assert archs and {"gfx1150", "gfx1151", "gfx1152", "gfx1153"} <= set(archs.group(1).split(";"))
    assert "command is deprecated" in texts["vllm/entrypoints/openai/api_server.py"]
    assert "if not is_rocm and in_wsl():" in texts["vllm/platforms/__init__.py"]
    # The frozen whl-multi-arch index is what requirements/build/rock.txt names (rocm.txt's triton pin has no
    # .rocm7.14.0, so it names no wheel TheRock publishes); stable whl-next is what vLLM's own image uses.
    for name in ("torch", "torchvision", "triton"):
        assert f"{name}=={MULTI_ARCH.versions[name]}\n" in texts["requirements/build/rock.txt"], name
    assert "triton==3.7.1+git0263a6a6\n" in texts["requirements/build/rocm.txt"]
    dockerfile = texts["docker/Dockerfile.rocm_base"]
    assert f"ARG TORCH_VERSION={TORCH_VERSION}\n" in dockerfile, "the suite's (stable) torch is vLLM's image's"
    assert f"ARG TORCHVISION_VERSION={NEXT.versions['torchvision']}\n" in dockerfile
    assert f"ARG ROCM_SDK_VERSION={ROCM_VERSION}\n" in dockerfile
    assert 'ARG ROCM_RELEASE_WHEELS_MULTIARCH_URL="https://stable.repo.amd.com/rocm/whl-next/"' in dockerfile
    assert 'ARG ROCM_NIGHTLY_WHEELS_MULTIARCH_URL="https://nightly.repo.amd.com/rocm/whl-next/"' in dockerfile


def _sdist_texts(sdist: Path, version: str, names: set[str]) -> dict[str, str]:
    texts: dict[str, str] = {}
    with tarfile.open(sdist) as archive:
        for member in archive:
            name = member.name.removeprefix(f"vllm-{version}/")
            if name in names:
                texts[name] = archive.extractfile(member).read().decode()  # type: ignore[union-attr]
    return texts


def test_vllm_0_33_rocm_build_facts(vllm_sdist: VllmSdists) -> None:
    """What the recipes and the fixture's build take from vLLM 0.33.0's own sources: its ROCm extensions,
    the HIP ones among them, the triton_kernels commit the lock pins, the locked cmake's range, and what
    setup.py does with cmake, ccache and the build type."""
    sdist = vllm_sdist("0.33.0")
    names = {"setup.py", "CMakeLists.txt", "requirements/build/rocm.txt", "docker/Dockerfile.rocm", CMAKE_FILE}
    texts = _sdist_texts(sdist, "0.33.0", names)
    rule = load_recipes(REPO / "recipes").vllm.extension_rule("0.33.0")
    for name in rule.names:
        assert f'CMakeExtension(name="vllm.{name}")' in texts["setup.py"], name
    assert 'CMakeExtension(name="vllm._moe_C")' not in texts["setup.py"], "no _moe_C any more"
    targets = re.findall(
        r"define_extension_target\(\s*(\w+)\s+DESTINATION vllm\s+LANGUAGE (\S+)", texts["CMakeLists.txt"]
    )
    languages = dict(targets)
    for name in rule.device_code:
        assert languages[name] in ("HIP", "${VLLM_GPU_LANG}"), name
    for name in set(rule.names) - set(rule.device_code):
        assert languages[name] == "CXX", name
    assert source_of(texts[CMAKE_FILE], CMAKE_FILE) == ("ROCm", "triton", TRITON_KERNELS_COMMIT)
    assert f"ARG ROCM_TRITON_KERNELS_COMMIT={TRITON_KERNELS_COMMIT}" in texts["docker/Dockerfile.rocm"]
    assert (
        "https://codeload.github.com/ROCm/triton/tar.gz/${ROCM_TRITON_KERNELS_COMMIT}"
        in texts["docker/Dockerfile.rocm"]
    )
    assert "cmake>=3.26.1,<4" in texts["requirements/build/rocm.txt"].splitlines()
    setup = texts["setup.py"]
    assert 'raise RuntimeError("Cannot find CMake executable")' in setup
    assert 'default_cfg = "Debug" if self.debug else "RelWithDebInfo"' in setup
    assert 'return which("ccache") is not None' in setup and 'os.environ.get("CMAKE_ARGS")' in setup
    assert 'build_tool = ["-G", "Ninja"]' in setup
    assert 'return "rocm" + "".join(rocm_version.split(".")[:2])' in setup, "0.33.0+rocm714 for ROCm 7.14"
    assert 'version += f"{sep}empty"' in setup, "0.33.0+empty for a Python-only build"
    assert "optional=not should_require_rust_frontend()" in setup, "the Rust frontend is optional"
    assert "-ffile-prefix-map" not in setup + texts["CMakeLists.txt"], "no prefix maps of its own"


def _conditions_around(cmake: str) -> dict[str, list[str]]:
    """Each ``define_extension_target`` of a CMake file -> the ``if(...)`` conditions it sits inside."""
    around: dict[str, list[str]] = {}
    stack: list[str] = []
    lines = cmake.splitlines()
    for number, line in enumerate(lines):
        code = line.split("#", 1)[0].strip()
        if re.match(r"if\s*\(", code):
            stack.append(code)
        elif re.match(r"endif\s*\(", code):
            stack.pop()
        elif code.startswith("define_extension_target("):
            name = (code.removeprefix("define_extension_target(").strip() or lines[number + 1].strip()).split()[0]
            around[name] = list(stack)
    return around


def test_vllm_0_33_builds_each_hip_extension_for_every_isa(vllm_sdist: VllmSdists) -> None:
    """What vLLM 0.33.0's CMakeLists.txt builds per ISA, which tier 0's requirement follows
    (components.toml ``device-code``; test_qualify.py): each HIP extension for every ISA of the build
    (``ARCHITECTURES ${VLLM_GPU_ARCHES}``), none of them inside a condition on an ISA; the ISA-gated
    kernels are sources added to those extensions (Octave KV when the list has gfx942 or gfx1100, fused
    KDA decode for gfx942/gfx950 and its chunk kernel for gfx950)."""
    cmake = _sdist_texts(vllm_sdist("0.33.0"), "0.33.0", {"CMakeLists.txt"})["CMakeLists.txt"]
    rule = load_recipes(REPO / "recipes").vllm.extension_rule("0.33.0")
    around = _conditions_around(cmake)
    for name in rule.device_code:
        block = re.search(rf"define_extension_target\(\s*{name}\s(.*?)\)", cmake, re.S)
        assert block and "ARCHITECTURES ${VLLM_GPU_ARCHES}" in block[1], name
        assert not [c for c in around.get(name, []) if "gfx" in c], f"{name} is built only for some ISAs"
    assert 'if(VLLM_GPU_ARCHES MATCHES "gfx942|gfx1100")' in cmake and '"csrc/attention/octave_attn.cu"' in cmake
    assert 'list(FILTER FUSED_KDA_DECODE_HIP_ARCHS INCLUDE REGEX "gfx942|gfx950")' in cmake
    assert 'list(FILTER FUSED_KDA_CHUNK_HIP_ARCHS INCLUDE REGEX "gfx950")' in cmake
    assert 'list(APPEND VLLM_STABLE_EXT_SRC "${FUSED_KDA_DECODE_HIP_SRC}")' in cmake, "inside _C_stable_libtorch"


def test_rocm_sdk_path_expands_the_devel_tarball_into_the_interpreters_own_site_packages(
    built: Path, fixture_tree: Fixture, tmp_path: Path
) -> None:
    """How the fake SDK models TheRock's ``rocm_sdk`` (fake_rocm_devel.py): run with an interpreter, ``rocm-sdk
    path --root`` writes into that interpreter's site-packages, other wheels' RECORD files included, which
    is why the build never runs it in a cached stage."""
    site_stage = Path(shutil.copytree(built / "gfx1151" / "site", tmp_path / "site", symlinks=True))
    layout = Layout(site_stage, PYTHON_MINOR)
    (devel_wheel,) = [
        p for p in fixture_tree.indexes[THEROCK_NEXT] if p.name.startswith(f"rocm_sdk_devel-{ROCM_VERSION}-")
    ]
    install_wheels(layout, [devel_wheel])
    device_record = next(layout.site.glob("rocm_sdk_device_gfx1151-*.dist-info")) / "RECORD"
    before = device_record.read_text()
    result = subprocess.run(
        [str(layout.python), "-m", "rocm_sdk", "path", "--root"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    devel = layout.site / "_rocm_sdk_devel"
    assert result.stdout.strip() == str(devel)
    assert not (layout.site / "rocm_sdk_devel" / "_devel.tar").exists(), "the tarball is deleted"
    record = (next(layout.site.glob("rocm_sdk_devel-*.dist-info")) / "RECORD").read_text()
    assert "_rocm_sdk_devel/lib/cmake/hip-lang/hip-lang-config.cmake,," in record
    assert device_record.read_text() != before, "another wheel's RECORD was appended to"
    core_clang = layout.site / "_rocm_sdk_core" / "lib" / "llvm" / "bin" / "clang++"
    assert (devel / "lib" / "llvm" / "bin" / "clang++").stat().st_ino == core_clang.stat().st_ino, "a hard link"
    assert (devel / "bin" / "amdclang++").is_symlink() and (devel / "llvm").is_symlink()


def test_the_sdk_compiler_makes_real_code_objects_for_every_target_isa(fixture_tree: Fixture, tmp_path: Path) -> None:
    """The fake SDK's compiler is the real ziglang wheel's clang (LLVM 22): real code objects for every
    ISA of every target, gfx950 included (Debian's clang-19 rejects it: "invalid target ID 'gfx950'"), and
    it takes the LLVM option vLLM 0.33.0 passes for its CDNA kernels as TheRock's clang does
    (``-mllvm -amdgpu-mfma-vgpr-form``, vLLM CMakeLists.txt:397-401), which clang-19 does not know."""
    (tmp_path / "hip").mkdir()
    (tmp_path / "hip" / "hip_runtime.h").write_bytes(HIP_RUNTIME_H)
    source = tmp_path / "k.hip"
    source.write_text('#include <hip/hip_runtime.h>\nextern "C" __global__ void k(float *a) { a[0] = 1; }\n')
    clang = sdk_clang(str(fixture_tree.root / "_work" / "sdk-clang"), "clang++")
    flags = ["-x", "hip", "-nogpulib", "-nogpuinc", f"-I{tmp_path}", "-mllvm", "-amdgpu-mfma-vgpr-form", "-c"]
    for isa in sorted(load_recipes(REPO / "recipes").all_isas):
        out = tmp_path / f"{isa}.o"
        result = subprocess.run(
            [*clang, f"--offload-arch={isa}", *flags, str(source), "-o", str(out)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        assert fatbin_isas(out) == {isa}
    rejected = subprocess.run(
        [
            host_compiler("clang++"),
            "-x",
            "hip",
            "--offload-arch=gfx950",
            "-nogpulib",
            "-nogpuinc",
            f"-I{tmp_path}",
            "-c",
            str(source),
            "-o",
            str(tmp_path / "old.o"),
        ],
        capture_output=True,
        text=True,
    )
    assert rejected.returncode != 0 and "invalid target ID 'gfx950'" in rejected.stderr, "why clang-19 is not the SDK's"
