"""vLLM's own build system, run by the vllm-wheel stage: the real thing wherever it is reachable.

- vLLM: the real 0.33.0 sdist from PyPI with the patch series applied by the vllm-src stage; its own
  ``setup.py`` (torch, setuptools-scm, setuptools-rust, ``torch.utils.cpp_extension``), ``CMakeLists.txt``
  and ``cmake/*`` (``find_package(Python ... Development.SABIModule)``, ``find_package(Torch)``, the HIP
  language, ``override_gpu_arches``, ``cmake/hipify.py`` through ``torch.utils.hipify``,
  ``triton_kernels.cmake`` with ``TRITON_KERNELS_SRC_DIR``, the install components);
- its build tools: real wheels from PyPI (cmake 3.31.10, ninja, setuptools, setuptools-scm, ...;
  real_wheels.py ``BUILD_TOOLS``), installed by the stage into its scratch site;
- torch: the bundle's site stage, whose torch carries a real torch wheel's CMake package configured for
  ROCm (``Caffe2/public/LoadHIP.cmake`` finds every ROCm library) and its real ``cpp_extension`` and
  ``hipify`` (torch_cmake.py);
- the SDK: the fixture's rocm-sdk-core/-libraries/-devel, with TheRock's ROCm CMake packages modelled
  (rocm_cmake.py); CMake's own HIP detection runs on the fake SDK's compiler, the real ziglang's clang, which
  compiles each translation unit of a torch extension from a stand-in with CMake's very command line
  (therock.py ``COMPILER_WRAPPER``): real code objects for each ISA, vLLM's real kernels being out of
  reach (they need ROCm's and torch's headers).

The bundles the rest of the suite builds run the same build system on the same release, with stand-ins
for its run-time package (vllm_release.py); see docs/building-rocm.md, "What the tests run".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, TEST_DOWNLOADS, VllmSdists
from tests.upstream.fixture import (
    CP,
    PYTHON_MINOR,
    TORCH_VERSION,
    VLLM_BUILT_VERSION,
    Fixture,
)
from tests.upstream.real_wheels import build_tools, cmake_binary
from tests.upstream.therock import ROCM_SDK_INIT
from tests.upstream.vllm_release import STAND_INS, TOP, TRITON_KERNELS_COMMIT
from vllm_bundle.errors import BuildError
from vllm_bundle.recipes import load_recipes
from vllm_bundle.tree import build_requirements, vllm_build
from vllm_bundle.tree.assemble import install_into
from vllm_bundle.tree.layout import Layout
from vllm_bundle.tree.vllm_source import prepare_source
from vllm_bundle.util.fsutil import sha256_file
from vllm_bundle.util.offload import fatbin_isas

RECIPES = load_recipes(REPO / "recipes")
RULE = RECIPES.vllm.extension_rule("0.33.0")
SOURCE_DATE = 1_763_596_800
#: vLLM 0.33.0's CMakeLists.txt through this line is what the configure tests run (it is at line 115).
FIND_TORCH = "find_package(Torch REQUIRED)\n"
#: ... and through the end of the block that patches a torch 2.13 header (CMakeLists.txt:409-441).
SHADOW_HEADERS = '      include_directories(BEFORE "${TORCH_SHADOW_INCLUDE_DIR}")\n    endif()\n  endif()\n'
BUILD = "requirements/build/rocm.txt"
REPORT = 'message(STATUS "vllm-bundle test: Torch ${Torch_VERSION}, HIP found: ${PYTORCH_FOUND_HIP}")\n'


# -- the pieces ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_source(vllm_sdist: VllmSdists, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real vLLM 0.33.0 source release, patched by the vllm-src stage."""
    sdist = vllm_sdist("0.33.0")
    out = tmp_path_factory.mktemp("real-vllm") / "vllm-src"
    return prepare_source(
        sdist, sha256_file(sdist), "0.33.0", REPO / "patches" / "vllm", RECIPES.all_isas, out=out
    ).path


def cmake_project(source: Path, through: str, dest: Path, close: str = "") -> Path:
    """A CMake project of vLLM's own CMakeLists.txt up to and with ``through`` (then ``close``: the
    ``endif()`` of a block cut open), its cmake/ and csrc/."""
    lists = (source / "CMakeLists.txt").read_text()
    assert lists.count(through) == 1, f"vLLM's CMakeLists.txt no longer has {through.strip()!r} once: look again"
    dest.mkdir(parents=True)
    (dest / "CMakeLists.txt").write_text(lists[: lists.index(through) + len(through)] + close + REPORT)
    for name in ("cmake", "csrc"):
        (dest / name).symlink_to(source / name, target_is_directory=True)
    return dest


def _locked_devel(locked: Path, fixture_tree: Fixture) -> dict[Path, str]:
    """The lock's rocm-sdk-devel wheel (its build group's SDK part) with its locked sha256."""
    pylock = tomllib.loads((locked / "locks" / "stable" / "pylock.gfx1151.toml").read_text())
    (package,) = [p for p in pylock["packages"] if p["name"] == "rocm-sdk-devel"]
    assert package.get("marker") == "'build' in dependency_groups"
    (wheel,) = package["wheels"]
    return {fixture_tree.files[wheel["url"].rsplit("/", 1)[-1]]: wheel["hashes"]["sha256"]}


def _build_group(locked: Path, fixture_tree: Fixture, tools: Path, without: str = "") -> dict[Path, str]:
    """vLLM's real build tools (less ``without``) and the lock's rocm-sdk-devel."""
    group = build_tools(TEST_DOWNLOADS, CP, tools)
    group = {path: sha for path, sha in group.items() if not path.name.startswith(f"{without}-")} if without else group
    return {**group, **_locked_devel(locked, fixture_tree)}


def _kernels(fixture_tree: Fixture) -> tuple[Path, str, str]:
    archive = fixture_tree.releases / f"triton-{TRITON_KERNELS_COMMIT}.tar.gz"
    return archive, sha256_file(archive), archive.name


def _wheel_build(site: Layout, group: dict[Path, str], fixture_tree: Fixture) -> vllm_build.WheelBuild:
    package = RECIPES.vllm.triton_kernels.package
    rocm = vllm_build.RocmInputs(_kernels(fixture_tree), package, RECIPES.vllm.cmake_build_type, RULE)
    return vllm_build.WheelBuild(site.python, SOURCE_DATE, rocm, group, site.site)


def _prepare(site: Layout, group: dict[Path, str], fixture_tree: Fixture, scratch: Path) -> dict[str, str]:
    """What run_build does before it calls uv build: the scratch site and the build's environment."""
    build = _wheel_build(site, group, fixture_tree)
    scratch.mkdir(parents=True)
    env, bins = vllm_build.build_group_setup(build, scratch)
    tools = build.builder.probe(scratch.parent / "probe", needs_patch=False)  # this machine's GCC
    env |= vllm_build.rocm_setup(RECIPES.target("gfx1151"), build, scratch, scratch.parent, tools)
    return {**vllm_build.base_environment(scratch, bins, SOURCE_DATE, 2), **env}


def _configure(
    project: Path, env: dict[str, str], python: Path, fixture_tree: Fixture, build: Path
) -> subprocess.CompletedProcess[str]:
    """setup.py's configure call (vllm-0.33.0:setup.py:256-330): the source, -DVLLM_TARGET_DEVICE,
    -DVLLM_PYTHON_EXECUTABLE, -DROCM_PATH, $CMAKE_ARGS last; Unix Makefiles (the build is not run)."""
    command = [str(cmake_binary(fixture_tree.root / "_real" / "cmake")), str(project), "-G", "Unix Makefiles"]
    command += ["-DCMAKE_BUILD_TYPE=Release", "-DVLLM_TARGET_DEVICE=rocm", f"-DVLLM_PYTHON_EXECUTABLE={python}"]
    command += [f"-DROCM_PATH={env['ROCM_PATH']}", *env["CMAKE_ARGS"].split()]
    build.mkdir(parents=True)
    return subprocess.run(command, cwd=build, env=env, capture_output=True, text=True, timeout=300, check=False)


def _site_stage(built: Path) -> Layout:
    return Layout(built / "gfx1151" / "site", PYTHON_MINOR)


# -- configure: torch's CMake package and TheRock's devel tree --------------------------------------------


def test_vllms_own_configure_finds_torch_and_every_rocm_library(
    built: Path, locked: Path, fixture_tree: Fixture, real_source: Path, tmp_path: Path
) -> None:
    """Failed on the main before this test (the scratch site linked only ``_rocm_sdk_core``): CMake
    stopped at "The imported target "roc::rocrand" references the file .../_rocm_sdk_devel/lib/
    librocrand.so.1 but this file does not exist"."""
    site = _site_stage(built)
    env = _prepare(site, _locked_devel(locked, fixture_tree), fixture_tree, tmp_path / "scratch")
    project = cmake_project(real_source, FIND_TORCH, tmp_path / "project")
    result = _configure(project, env, site.python, fixture_tree, tmp_path / "cmake-build")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f"-- Found Torch: {site.site}/torch/lib/libtorch.so" in result.stdout
    load_hip = (site.site / "torch" / "share" / "cmake" / "Caffe2" / "public" / "LoadHIP.cmake").read_text()
    if "find_package_and_print_version(hip REQUIRED CONFIG)" in load_hip:  # torch 2.13: hip's CONFIG package
        assert "hip VERSION: " in result.stderr, "LoadHIP's find_package(hip CONFIG)"
        assert f"-- HIP language enabled with compiler: {env['ROCM_PATH']}/lib/llvm/bin/clang++" in result.stdout
    else:  # torch 2.12: FindHIP.cmake
        assert f"-- Found HIP: {env['ROCM_PATH']} (found suitable version" in result.stdout, (
            "LoadHIP's find_package(HIP)"
        )
    assert "-- The HIP compiler identification is Clang 22" in result.stdout, "CMake's own HIP detection"
    assert f"-- vllm-bundle test: Torch {TORCH_VERSION.split('+')[0]}, HIP found: TRUE" in result.stdout
    for package in ("amd_comgr", "rocrand", "hiprand", "rocblas", "hipblas", "miopen", "hipsolver", "hsa-runtime64"):
        assert f"{package} VERSION: " in result.stderr, f"LoadHIP found {package}"
    assert "references the file" not in output


def test_a_devel_tree_with_links_to_nothing_stops_the_build_in_one_line(
    built: Path,
    locked: Path,
    fixture_tree: Fixture,
    real_source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A site stage without rocm-sdk-libraries (what the scratch site was before): CMake would stop at the
    first library linked into it; the build says so first, in one line, before running anything."""
    site = _site_stage(built)
    lacking = Layout(tmp_path / "site-without-libraries", PYTHON_MINOR)
    lacking.site.mkdir(parents=True)
    for entry in site.site.iterdir():  # the site stage by links, all but _rocm_sdk_libraries
        if entry.name != vllm_build.LIBRARIES:
            (lacking.site / entry.name).symlink_to(entry)
    devel = _locked_devel(locked, fixture_tree)
    with pytest.raises(BuildError) as raised:
        _prepare(lacking, devel, fixture_tree, tmp_path / "scratch")
    line = str(raised.value)
    assert "\n" not in line and "link(s) to nothing" in line, line
    assert "(_rocm_sdk_libraries is not in the site stage)" in line and "rocm-sdk-libraries" in line, line

    # What CMake itself says then (the check above switched off): the error the first real build met.
    monkeypatch.setattr(vllm_build, "_require_no_dangling_links", lambda root, site: None)
    env = _prepare(lacking, devel, fixture_tree, tmp_path / "scratch-unchecked")
    project = cmake_project(real_source, FIND_TORCH, tmp_path / "project")
    result = _configure(project, env, site.python, fixture_tree, tmp_path / "cmake-build")
    assert result.returncode != 0
    assert 'The imported target "roc::rocrand" references the file' in result.stderr, result.stderr[-3000:]
    assert f"{env['ROCM_PATH']}/lib/librocrand.so.1" in result.stderr
    assert "but this file does not exist" in result.stderr


def test_the_fixture_devel_tree_links_as_therock_does(fixture_tree: Fixture, tmp_path: Path) -> None:
    """Each math library a relative link into ``_rocm_sdk_libraries``, each core file into
    ``_rocm_sdk_core``, each soname alias to the soname (py_packaging.py ``_populate_devel_file``)."""
    (devel_wheel,) = [p for n, p in fixture_tree.files.items() if n.startswith("rocm_sdk_devel-7.14.0-")]
    with zipfile.ZipFile(devel_wheel) as wheel:
        (tar_name,) = [n for n in wheel.namelist() if n.endswith("_devel.tar")]
        (tmp_path / "_devel.tar").write_bytes(wheel.read(tar_name))
    with tarfile.open(tmp_path / "_devel.tar") as tar:
        links = {m.name: m.linkname for m in tar if m.issym()}
    assert links["_rocm_sdk_devel/lib/librocblas.so.5"] == "../../_rocm_sdk_libraries/lib/librocblas.so.5"
    assert links["_rocm_sdk_devel/lib/librocblas.so"] == "librocblas.so.5"
    assert links["_rocm_sdk_devel/lib/libamdhip64.so.7"] == "../../_rocm_sdk_core/lib/libamdhip64.so.7"
    assert links["_rocm_sdk_devel/lib/libMIOpen.so"] == "libMIOpen.so.1"


def _members(sdist: Path) -> dict[str, bytes]:
    with tarfile.open(sdist) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive if m.isfile()}  # type: ignore[union-attr]


def test_every_test_bundle_builds_vllms_own_build_system(vllm_sdist: VllmSdists, fixture_tree: Fixture) -> None:
    """The fixture's vLLM release (every test bundle's) is PyPI's with stand-ins only for the run-time
    package and the run-time requirement lists (vllm_release.py): setup.py, pyproject.toml, CMakeLists.txt,
    cmake/, csrc/, tools/, requirements/build/ and vllm/envs.py are the real bytes."""
    real = _members(vllm_sdist("0.33.0"))
    fake = _members(fixture_tree.files["vllm-0.33.0.tar.gz"])
    stand_ins = {f"{TOP}/{name}" for name in STAND_INS}
    assert set(fake) - stand_ins <= set(real), "nothing but the stand-ins is the fixture's own"
    assert {name for name in fake if fake[name] != real.get(name)} <= stand_ins, "and nothing else differs"
    for name in ("setup.py", "pyproject.toml", "CMakeLists.txt", "cmake/utils.cmake", "cmake/hipify.py"):
        assert fake[f"{TOP}/{name}"] == real[f"{TOP}/{name}"], name
    for tree in ("cmake/", "csrc/", "tools/", "requirements/build/"):
        real_tree = {name for name in real if name.startswith(f"{TOP}/{tree}")}
        assert real_tree and real_tree <= set(fake), f"all of {tree}"
    assert BUILD in {name.removeprefix(f"{TOP}/") for name in fake}


# -- the whole build: setup.py, CMake, hipify, targets, link, install -------------------------------------


@dataclass(frozen=True)
class RealBuild:
    details: dict[str, object]
    wheel: Path
    log: str


@pytest.fixture(scope="module")
def real_build(
    built: Path, locked: Path, fixture_tree: Fixture, real_source: Path, tmp_path_factory: pytest.TempPathFactory
) -> RealBuild:
    """One real build of vLLM 0.33.0 for gfx1151 by the vllm-wheel stage's own ``run_build``, shared by
    the tests that read its result."""
    work = tmp_path_factory.mktemp("real-build")
    site = _site_stage(built)
    build = _wheel_build(site, _build_group(locked, fixture_tree, work / "tools"), fixture_tree)
    out = work / "build" / "vllm-wheel.tmp"
    out.mkdir(parents=True)
    log = work / "vllm-wheel.log"
    details = vllm_build.run_build(RECIPES.target("gfx1151"), real_source, build, out, log, "0.33.0")
    (wheel,) = out.glob("vllm-*.whl")
    return RealBuild(details, wheel, log.read_text())


def test_the_real_setup_py_and_cmake_build_vllm_for_the_target(real_build: RealBuild) -> None:
    log = real_build.log
    assert "-- Found Torch: " in log and "-- Target device: rocm" in log
    assert "-- HIP supported arches: " in log and "gfx1151" in log.split("-- HIP supported arches: ")[1].split("\n")[0]
    assert "-- Building skinny_gemms for archs: gfx1151\n" in log, "vLLM's own CMake chose the target's ISA"
    assert "Running hipify on all extension source files." in log, "cmake/hipify.py through torch.utils.hipify"
    (fetch,) = [line for line in log.splitlines() if line.startswith("-- [triton_kernels] Fetch from ")]
    assert "/.vllm-wheel.build/triton-kernels/" in fetch, "TRITON_KERNELS_SRC_DIR, the locked source"
    assert "Building HIP object CMakeFiles/_C_stable_libtorch.dir/csrc/activation_kernels.hip.o" in log, "hipified"
    for name in RULE.device_code:
        assert f"Linking HIP shared module {name}.abi3.so" in log, name
        installed = f"/vllm/{name}.abi3.so"
        assert any(line.startswith("-- Installing: ") and line.endswith(installed) for line in log.splitlines()), name
    assert "running build_rust\n" in log and "can't find Rust compiler" in log, "the Rust frontend: skipped"


def test_the_real_wheel_carries_every_extension_with_the_targets_code(real_build: RealBuild, tmp_path: Path) -> None:
    assert real_build.details["device"] == "rocm"
    assert real_build.details["extensions"] == {name: ["gfx1151"] for name in RULE.device_code}
    name = real_build.wheel.name
    assert name == f"vllm-{VLLM_BUILT_VERSION}-{CP}-{CP}-linux_x86_64.whl", "setup.py's own version and tag"
    with zipfile.ZipFile(real_build.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"vllm-{VLLM_BUILT_VERSION}.dist-info/METADATA").decode()
        for extension in RULE.names:
            assert f"vllm/{extension}.abi3.so" in names, extension
        wheel.extract("vllm/_C.abi3.so", tmp_path)
        assert any(n.startswith("vllm/third_party/triton_kernels/") for n in names), "the triton_kernels component"
    assert fatbin_isas(tmp_path / "vllm" / "_C.abi3.so") == {"gfx1151"}
    assert b"/vllm-bundle-build/" in (tmp_path / "vllm" / "_C.abi3.so").read_bytes(), "prefix maps applied"
    requires = [
        line.removeprefix("Requires-Dist: ") for line in metadata.splitlines() if line.startswith("Requires-Dist")
    ]
    assert "torch[device-gfx1151]" in requires and "rocm[device-gfx1151]" in requires, requires


# -- the build group's programs -------------------------------------------------------------------------------


def test_the_build_runs_the_cmake_wheels_program_not_its_python_script(
    build_tool_wheels: dict[Path, str], tmp_path: Path
) -> None:
    """The real cmake wheel's ``cmake`` console script reads its RECORD to find ``cmake/data/bin/cmake`` and
    execs it (0.3 s a run, 11 runs a build): the build's PATH finds that program first, and it is the one
    the script runs (what the script prints as its version is the program's)."""
    scratch = tmp_path / "scratch"
    build = vllm_build.WheelBuild(Path(sys.executable), SOURCE_DATE, None, build_tool_wheels)
    env, bins = vllm_build.build_group_setup(build, scratch)
    path = os.pathsep.join(map(str, bins))
    found = Path(shutil.which("cmake", path=path) or "")
    assert found == scratch / "site" / "cmake" / "data" / "bin" / "cmake", bins
    assert found.read_bytes()[:4] == b"\x7fELF"
    script = scratch / "bin" / "cmake"
    assert script.read_bytes().startswith(b"#!"), "the console script is still installed (what runs it: the same)"
    run = {**env, "PATH": path}
    versions = [
        subprocess.run([str(p), "--version"], env=run, capture_output=True, text=True, check=True).stdout
        for p in (found, script)
    ]
    assert versions[0] == versions[1] and versions[0].startswith("cmake version 3.31.10"), versions


# -- what the build needs, checked before it runs ----------------------------------------------------------


@pytest.mark.parametrize("tool", ["setuptools_scm", "setuptools_rust"])
def test_a_build_group_without_a_build_tool_fails_in_one_line(
    built: Path, locked: Path, fixture_tree: Fixture, real_source: Path, tmp_path: Path, tool: str
) -> None:
    site = _site_stage(built)
    group = _build_group(locked, fixture_tree, tmp_path / "tools", without=tool)
    out = tmp_path / "build" / "vllm-wheel.tmp"
    out.mkdir(parents=True)
    build = _wheel_build(site, group, fixture_tree)
    with pytest.raises(BuildError) as raised:
        vllm_build.run_build(RECIPES.target("gfx1151"), real_source, build, out, tmp_path / "log", "0.33.0")
    line = str(raised.value)
    assert line.startswith(f"vLLM's build needs {tool.replace('_', '-')}>=") and "lacks it" in line, line
    assert "\n" not in line and "re-lock" in line


def test_vllms_cmake_needs_gnu_patch_and_the_build_says_so_first(
    built: Path, locked: Path, fixture_tree: Fixture, real_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = _site_stage(built)
    group = _locked_devel(locked, fixture_tree)
    out = tmp_path / "build" / "vllm-wheel.tmp"
    out.mkdir(parents=True)
    tools = tmp_path / "tools"  # this machine's host compilers, and no GNU patch
    tools.mkdir()
    for name in ("gcc", "g++"):
        (tools / name).symlink_to(shutil.which(name, path="/usr/bin") or name)
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setattr(build_requirements, "build_system_requires", lambda source: [])
    build = _wheel_build(site, group, fixture_tree)
    with pytest.raises(BuildError) as raised:
        vllm_build.run_build(RECIPES.target("gfx1151"), real_source, build, out, tmp_path / "log", "0.33.0")
    assert str(raised.value) == (
        "vLLM's CMakeLists.txt runs GNU patch; this machine has no patch "
        "(install g++ and GNU patch (apt-get install g++ patch), or drop --no-builder)"
    )
    assert not (tmp_path / "build" / ".vllm-wheel.build").exists(), "said before the build began"


def test_on_torch_2_13_vllms_configure_patches_torchs_header_with_gnu_patch(
    locked: Path, fixture_tree: Fixture, real_source: Path, tmp_path: Path
) -> None:
    """The stable-next channel's torch 2.13.0: vLLM's configure copies torch's real
    ``stableivalue_conversions.h`` and patches it with GNU patch (CMakeLists.txt:409-441)."""
    site = _torch_2_13_site(fixture_tree, tmp_path / "site")
    (devel,) = [p for n, p in fixture_tree.files.items() if n.startswith("rocm_sdk_devel-10.0.0-")]
    group = {**build_tools(TEST_DOWNLOADS, CP, tmp_path / "tools"), devel: sha256_file(devel)}
    env = _prepare(site, group, fixture_tree, tmp_path / "scratch")
    # The enclosing block closed, and the hipify target vLLM defines after its last HIP extension.
    close = "endif()\nvllm_finalize_hipify_target()\n"
    project = cmake_project(real_source, SHADOW_HEADERS, tmp_path / "project", close=close)
    result = _configure(project, env, site.python, fixture_tree, tmp_path / "cmake-build")
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert "-- vllm-bundle test: Torch 2.13.0, HIP found: TRUE" in result.stdout
    shadow = tmp_path / "cmake-build" / "torch_patched_headers" / "torch/csrc/stable/stableivalue_conversions.h"
    assert "const auto str = std::string(data, length);" in shadow.read_text(), "GNU patch applied vLLM's patch"


def _torch_2_13_site(fixture_tree: Fixture, root: Path) -> Layout:
    """An interpreter whose site-packages holds the stable-next channel's torch and SDK (as a site stage
    does): a venv of this Python with the fixture's wheels installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    layout = Layout(root, PYTHON_MINOR)
    wanted = (f"torch-2.13.0+rocm10.0.0-{CP}-", "rocm_sdk_core-10.0.0-", "rocm_sdk_libraries-10.0.0-")
    wheels = sorted(path for name, path in fixture_tree.files.items() if name.startswith(wanted))
    assert len(wheels) == len(wanted), wheels
    install_into(layout.scheme(), str(layout.python), wheels)
    rocm_sdk = layout.site / "rocm_sdk"  # the rocm sdist's package, as the site stage builds it
    rocm_sdk.mkdir()
    (rocm_sdk / "__init__.py").write_text(ROCM_SDK_INIT)
    (rocm_sdk / "_dist_info.py").write_text("__version__ = '10.0.0'\n")
    return layout
