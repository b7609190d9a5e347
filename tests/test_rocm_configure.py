"""vLLM's own CMake configure against the scratch site the vllm-wheel stage prepares: the real thing
wherever it is reachable.

- CMake: PyPI's cmake 3.31.10 wheel (real_wheels.py), not the fake PyPI's stand-in;
- vLLM's ``CMakeLists.txt`` and ``cmake/utils.cmake``: the real 0.33.0 sdist from PyPI, run from its first
  line through ``find_package(Torch REQUIRED)`` (CMakeLists.txt:1-115): ``find_python_from_executable``,
  ``append_cmake_prefix_path("torch" "torch.utils.cmake_prefix_path")``, then torch's CMake package;
- torch's CMake package: a real torch wheel's ``share/cmake`` (PyPI's 2.12.0) configured for ROCm
  (torch_cmake.py), whose ``Caffe2/public/LoadHIP.cmake`` enables the HIP language (CMake's own
  detection, run on the fake SDK's compiler: Debian's clang-19) and finds every ROCm library torch needs;
- the SDK: the fixture's rocm-sdk-core, rocm-sdk-libraries and rocm-sdk-devel, installed by the bundle's
  site stage and the build's own ``rocm_setup``; only TheRock's CMake packages are modelled
  (rocm_cmake.py).

TheRock's devel tree links the math libraries into ``_rocm_sdk_libraries`` (ROCm/TheRock
build_tools/_therock_utils/py_packaging.py:702-741): a scratch site without that wheel stops configure at
the first of them, which is what the first real build would have done.
"""

from __future__ import annotations

import subprocess
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.upstream.fixture import PYTHON_MINOR, TORCH_VERSION, Fixture
from tests.upstream.real_wheels import cmake_binary
from vllm_bundle.errors import BuildError
from vllm_bundle.recipes import load_recipes
from vllm_bundle.tree import vllm_build
from vllm_bundle.tree.assemble import Layout

RECIPES = load_recipes(REPO / "recipes")
#: vLLM 0.33.0's CMakeLists.txt up to this line is what the test runs (it is at line 115).
FIND_TORCH = "find_package(Torch REQUIRED)\n"
REPORT = 'message(STATUS "vllm-bundle test: Torch ${Torch_VERSION}, HIP found: ${PYTORCH_FOUND_HIP}")\n'


@pytest.fixture(scope="module")
def vllm_cmake_project(vllm_sdist, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    """A CMake project of vLLM 0.33.0's own files: its CMakeLists.txt through find_package(Torch), its
    cmake/utils.cmake."""
    project = tmp_path_factory.mktemp("vllm-cmake")
    with tarfile.open(vllm_sdist("0.33.0")) as sdist:
        lists = sdist.extractfile("vllm-0.33.0/CMakeLists.txt").read().decode()  # type: ignore[union-attr]
        utils = sdist.extractfile("vllm-0.33.0/cmake/utils.cmake").read()  # type: ignore[union-attr]
    assert lists.count(FIND_TORCH) == 1, "vLLM's CMakeLists.txt no longer finds torch once: look again"
    (project / "CMakeLists.txt").write_text(lists[: lists.index(FIND_TORCH) + len(FIND_TORCH)] + REPORT)
    (project / "cmake").mkdir()
    (project / "cmake" / "utils.cmake").write_bytes(utils)
    return project


def _build_group(locked: Path, fixture_tree: Fixture) -> dict[Path, str]:
    """The lock's build group (rocm-sdk-devel, cmake, ...): each served wheel with its locked sha256."""
    pylock = tomllib.loads((locked / "locks" / "stable" / "pylock.gfx1151.toml").read_text())
    group = {}
    for package in pylock["packages"]:
        if package.get("marker") == "'build' in dependency_groups":
            (wheel,) = package["wheels"]
            group[fixture_tree.files[wheel["url"].rsplit("/", 1)[-1]]] = wheel["hashes"]["sha256"]
    assert any(p.name.startswith("rocm_sdk_devel-") for p in group), group
    return group


def _site_stage(built: Path) -> Layout:
    return Layout(built / "gfx1151" / "site", PYTHON_MINOR)


def _prepare(site: Layout, locked: Path, fixture_tree: Fixture, scratch: Path) -> dict[str, str]:
    """What run_build does before it calls uv build: the scratch site and the build's environment."""
    rule = RECIPES.vllm.extension_rule("0.33.0")
    rocm = vllm_build.RocmInputs(site.site, _build_group(locked, fixture_tree), None, "", "Release", rule)
    scratch.mkdir(parents=True)
    env, bins = vllm_build.rocm_setup(RECIPES.target("gfx1151"), rocm, site.python, scratch, scratch.parent)
    return {**vllm_build.base_environment(scratch, bins, 0, 2), **env}


def _configure(project: Path, env: dict[str, str], python: Path, fixture_tree: Fixture, build: Path):  # type: ignore[no-untyped-def]
    """setup.py's configure call (vllm-0.33.0:setup.py:215-330): the source, -DVLLM_TARGET_DEVICE,
    -DVLLM_PYTHON_EXECUTABLE, -DROCM_PATH; Unix Makefiles here (the build itself is not run)."""
    command = [
        str(cmake_binary(fixture_tree.root / "_real" / "cmake")),
        "-S",
        str(project),
        "-B",
        str(build),
        "-G",
        "Unix Makefiles",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DVLLM_TARGET_DEVICE=rocm",
        f"-DVLLM_PYTHON_EXECUTABLE={python}",
        f"-DROCM_PATH={env['ROCM_PATH']}",
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_vllms_own_configure_finds_torch_and_every_rocm_library(
    built: Path, locked: Path, fixture_tree: Fixture, vllm_cmake_project: Path, tmp_path: Path
) -> None:
    """Failed on the main before this test (the scratch site linked only ``_rocm_sdk_core``): CMake
    stopped at "The imported target "roc::rocrand" references the file .../_rocm_sdk_devel/lib/
    librocrand.so.1 but this file does not exist"."""
    site = _site_stage(built)
    env = _prepare(site, locked, fixture_tree, tmp_path / "scratch")
    result = _configure(vllm_cmake_project, env, site.python, fixture_tree, tmp_path / "cmake-build")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    devel = env["ROCM_PATH"]
    assert f"-- Found Torch: {site.site}/torch/lib/libtorch.so" in result.stdout
    assert f"-- Found HIP: {devel} (found suitable version" in result.stdout, "LoadHIP's find_package(HIP MODULE)"
    assert "-- The HIP compiler identification is Clang 19" in result.stdout, "CMake's own HIP detection"
    assert f"-- vllm-bundle test: Torch {TORCH_VERSION.split('+')[0]}, HIP found: TRUE" in result.stdout
    for package in ("amd_comgr", "rocrand", "hiprand", "rocblas", "hipblas", "miopen", "hipsolver", "hsa-runtime64"):
        assert f"{package} VERSION: " in result.stderr, f"LoadHIP found {package}"
    assert "references the file" not in output


def test_a_devel_tree_with_links_to_nothing_stops_the_build_in_one_line(
    built: Path,
    locked: Path,
    fixture_tree: Fixture,
    vllm_cmake_project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A site stage without rocm-sdk-libraries (what the scratch site was before): CMake would stop at the
    first library linked into it; the build says so first, in one line, before running anything."""
    site = _site_stage(built)
    lacking = tmp_path / "site-without-libraries"
    lacking_site = Layout(lacking, PYTHON_MINOR).site
    lacking_site.mkdir(parents=True)
    for entry in site.site.iterdir():  # the site stage by links, all but _rocm_sdk_libraries
        if entry.name != vllm_build.LIBRARIES:
            (lacking_site / entry.name).symlink_to(entry)
    for name in ("bin", "lib"):  # the interpreter and its standard library, by link
        for entry in (site.root / name).iterdir():
            if not (lacking / name / entry.name).exists():
                (lacking / name).mkdir(exist_ok=True)
                (lacking / name / entry.name).symlink_to(entry)
    with pytest.raises(BuildError) as raised:
        _prepare(Layout(lacking, PYTHON_MINOR), locked, fixture_tree, tmp_path / "scratch")
    line = str(raised.value)
    assert "\n" not in line and "link(s) to nothing" in line and "_rocm_sdk_libraries" in line, line
    assert "rocm-sdk-libraries" in line, "says how to fix it"

    # What CMake itself says then (the check above switched off): the error the first real build met.
    monkeypatch.setattr(vllm_build, "_require_no_dangling_links", lambda root, site: None)
    env = _prepare(Layout(lacking, PYTHON_MINOR), locked, fixture_tree, tmp_path / "scratch-unchecked")
    result = _configure(vllm_cmake_project, env, site.python, fixture_tree, tmp_path / "cmake-build")
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
