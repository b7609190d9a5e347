"""Real wheels from PyPI that the fake upstream serves or takes files from, downloaded once into the test
downloads cache (``VLLM_BUNDLE_TEST_DOWNLOADS``) by the production fetcher, which checks each against the
sha256 and size pinned here (computed from the bytes PyPI served, and equal to what PyPI publishes).

- ziglang 0.17.1: the C toolchain of the production recipe (recipes/components.toml ``[toolchain]``),
  served on the fake PyPI beside a small stand-in (pypi.py) that the shared test recipes pin instead;
  tests/test_toolchain.py builds a bundle with the real one and compiles Triton's C in a chroot with it.
- triton 3.7.1 (the wheel for this interpreter's tag): the AMD backend's ``driver.c`` and its vendored
  HIP/HSA headers (``include/``), which the fixture's triton wheel carries, so that the test compiles
  the very source Triton compiles at first GPU use (triton-lang/triton python/triton/backends/amd/driver.py
  ``HIPUtils``, python/triton/runtime/build.py ``_build``).
- ninja 1.13.2: served on the fake PyPI (vLLM's run-time requirement and build tool).
- cmake 3.31.10: the CMake that runs vLLM's own CMake code in the tests (test_vllm_build_system.py).
- torch 2.12.0 and 2.13.0 (read by HTTP range, never downloaded whole: 0.5 GB each): the CMake package a torch wheel
  installs (``torch/share/cmake/{Torch,Caffe2,ATen}``, ``Caffe2/public/LoadHIP.cmake``), which the
  fixture's torch carries configured for ROCm (torch_cmake.py), and the modules vLLM's build runs
  (``torch.utils.cpp_extension``, ``torch.utils.hipify``). Each member is checked against the size and
  CRC-32 of the wheel's own zip directory, and PyPI must publish the pinned sha256 for the wheel.
- vLLM's build tools as requirements/build/rocm.txt (vllm-0.33.0) names them, real wheels:
  setuptools, setuptools-scm, setuptools-rust, wheel, jinja2, packaging, cmake and ninja, with what they
  require (``BUILD_TOOLS``): the fake PyPI serves them, so every test bundle's build group is these.
- vLLM 0.33.0's source release (``VLLM_SDIST``, 47 MB): its build system is the fixture's (vllm_release.py).
"""

from __future__ import annotations

import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from vllm_bundle.inputs.simple_index import project_files
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.fetch import Artifact, Fetcher
from vllm_bundle.util.progress import PlainReporter

PYPI_URL = "https://pypi.org/simple/"


@dataclass(frozen=True)
class Pinned:
    project: str
    filename: str
    sha256: str
    size: int


ZIGLANG = Pinned(
    "ziglang",
    "ziglang-0.17.1-py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64.musllinux_1_1_x86_64.whl",
    "ea6cc5d87b033cf0aedfbc8f9549a908cae6c50ac31f1698188fa48a74524b54",
    101_083_562,
)
TRITON = {
    "cp311": Pinned(
        "triton",
        "triton-3.7.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "6744957e9fd610a29680ec2346057d0c86948ed3812468670719f391e94b44a5",
        197_701_306,
    ),
    "cp312": Pinned(
        "triton",
        "triton-3.7.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "7e40869937a68206ec70d7f25bb7ec6433cb083f9135e1f36dbd318dc449a728",
        197_719_725,
    ),
}
CMAKE = Pinned(
    "cmake",
    "cmake-3.31.10-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "2f766bb46367e5e0559fa33184653754bce044583a06014dcaebf8e6dff8a1f1",
    27_808_794,
)
NINJA = Pinned(
    "ninja",
    "ninja-1.13.2-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "65a24341b5ac09fcadcc37082660be40a94174e51a937fabf6e2cae26225fa2c",
    183_365,
)
#: vLLM 0.33.0's build tools (requirements/build/rocm.txt: cmake>=3.26.1,<4, packaging>=26.2,
#: setuptools>=78.1.1,<80, setuptools-scm>=8, setuptools-rust>=1.9.0, wheel, jinja2>=3.1.6; pyproject.toml:
#: ninja) with what they require (semantic-version, markupsafe), and typing-extensions, which
#: torch.utils.cpp_extension imports (torch requires it).
BUILD_TOOLS = (
    CMAKE,
    NINJA,
    Pinned(
        "setuptools",
        "setuptools-79.0.1-py3-none-any.whl",
        "e147c0549f27767ba362f9da434eab9c5dc0045d5304feb602a0af001089fc51",
        1_256_281,
    ),
    Pinned(
        "setuptools-scm",
        "setuptools_scm-9.2.2-py3-none-any.whl",
        "30e8f84d2ab1ba7cb0e653429b179395d0c33775d54807fc5f1dd6671801aef7",
        62_975,
    ),
    Pinned(
        "setuptools-rust",
        "setuptools_rust-1.13.0-py3-none-any.whl",
        "666439c4d90e968bb625bcf87ec0aa02b4f49e599d2f5dc255c633a04e8eca99",
        30_536,
    ),
    Pinned(
        "semantic-version",
        "semantic_version-2.10.0-py2.py3-none-any.whl",
        "de78a3b8e0feda74cabc54aab2da702113e33ac9d9eb9d2389bcf1f58b7d9177",
        15_552,
    ),
    Pinned(
        "wheel",
        "wheel-0.48.0-py3-none-any.whl",
        "3217dcc807155e45db462d7ef2431f5ddda0d7273b700d05a67b271ceb1287ab",
        33_320,
    ),
    Pinned(
        "jinja2",
        "jinja2-3.1.6-py3-none-any.whl",
        "85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67",
        134_899,
    ),
    Pinned(
        "packaging",
        "packaging-26.4-py3-none-any.whl",
        "81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2",
        140_049,
    ),
    Pinned(
        "typing-extensions",
        "typing_extensions-4.16.0-py3-none-any.whl",
        "481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8",
        45_571,
    ),
)
#: PyPI's vLLM 0.33.0 source release, as ``pip download vllm==0.33.0 --no-binary :all:`` gets it.
VLLM_SDIST = Pinned(
    "vllm",
    "vllm-0.33.0.tar.gz",
    "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
    47_101_396,
)
MARKUPSAFE = {
    "cp311": Pinned(
        "markupsafe",
        "markupsafe-3.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
        "6da83a088f8ef93b2d483a8232a4dbf4d69d3d8496b568a03c56becac43e1808",
        22_961,
    ),
}
#: Read by range for the members below only (the same files in every CPython tag's wheel), one wheel for
#: each torch release the fake indexes serve (2.9.0 on the per-family ones, 2.12.0 on whl-multi-arch, 2.13.0
#: on whl-next).
TORCH = {
    "2.9.0": Pinned(
        "torch",
        "torch-2.9.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "51de31219c97c51cf4bf2be94d622e3deb5dcc526c6dc00e97c17eaec0fc1d67",
        899_815_990,
    ),
    "2.12.0": Pinned(
        "torch",
        "torch-2.12.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "415c1b8d0412f67551c8e89a2daca0fb3e56694af0281ba155eaa9da481f58b4",
        532_170_085,
    ),
    "2.13.0": Pinned(
        "torch",
        "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "60fcdcb2f3876e21146cb4524ef06397d727ca9ad5f020818547e25075fe3cb7",
        526_574_961,
    ),
}
#: What the fixture's torch takes from the real one: its CMake package, and the pure-Python modules vLLM's
#: build runs (setup.py imports torch.utils.cpp_extension; cmake/hipify.py runs torch.utils.hipify) with
#: what they import of torch (torch_version and its vendored packaging, _appdirs).
TORCH_PREFIXES = ("torch/share/cmake/", "torch/utils/hipify/", "torch/_vendor/")
TORCH_FILES = (
    "torch/utils/cpp_extension.py",
    "torch/utils/file_baton.py",
    "torch/utils/_cpp_extension_versioner.py",
    "torch/torch_version.py",
    "torch/_appdirs.py",
    # The header vLLM's CMake reads and patches on torch 2.13 (vllm-0.33.0 CMakeLists.txt:409-441).
    "torch/include/torch/csrc/stable/stableivalue_conversions.h",
)
MEMBERS_VERSION = "members-v2"  # a new selection above: a new folder in the downloads cache
#: What the fixture's triton wheel takes from the real one (paths in the wheel).
TRITON_AMD = "triton/backends/amd/"
TRITON_AMD_FILES = ("driver.c", "include/")


@dataclass(frozen=True)
class RealWheels:
    ziglang: Path  # the wheel, under its own file name
    build_tools: list[Path]  # vLLM's build tools (ninja, cmake, setuptools, ...), under their own names
    triton_amd: Path  # a directory: the real triton/backends/amd/driver.c and include/
    torch: dict[str, Path]  # torch version -> the members of its real wheel the fixture's torch carries
    cmake: Path  # a directory: the real cmake wheel unpacked (its data/bin/cmake runs)
    vllm_sdist: Path  # PyPI's vllm-0.33.0.tar.gz (verified, in the downloads cache)


def _located(fetcher: Fetcher, pin: Pinned) -> Artifact:
    """The pin as an Artifact with PyPI's URL for it; PyPI must publish the pinned sha256 for it."""
    files = {f.filename: f for f in project_files(fetcher.session, PYPI_URL, pin.project)}
    entry = files[pin.filename]
    assert entry.sha256 == pin.sha256, f"PyPI publishes {entry.sha256} for {pin.filename}, pinned {pin.sha256}"
    return Artifact(pin.project, pin.filename, entry.url, pin.sha256, pin.size)


def fetch_pinned(downloads: Path, pins: list[Pinned]) -> dict[str, Path]:
    """Each pinned file's verified bytes in the cache (PyPI's index is read only for what is missing)."""
    fetcher = Fetcher(Cache(downloads), PlainReporter(), jobs=2)
    wanted = [Artifact(p.project, p.filename, "", p.sha256, p.size) for p in pins]
    missing = {a.filename for a in fetcher.missing(wanted)}
    located = [_located(fetcher, p) if p.filename in missing else a for p, a in zip(pins, wanted, strict=True)]
    fetched = fetcher.fetch_all(located)
    return {p.filename: fetched[p.sha256] for p in pins}


def triton_pin(cp: str) -> Pinned:
    if cp not in TRITON:
        raise RuntimeError(f"no real triton 3.7.1 wheel pinned for {cp}: add it to tests/upstream/real_wheels.py")
    return TRITON[cp]


def _extract_triton_amd(wheel: Path, dest: Path) -> Path:
    """``triton/backends/amd/{driver.c, include/}`` of the real wheel, under ``dest``."""
    shutil.rmtree(dest, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            relative = name.removeprefix(TRITON_AMD)
            if name.startswith(TRITON_AMD) and relative.startswith(TRITON_AMD_FILES) and not name.endswith("/"):
                target = dest / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
    return dest


def _wanted_torch_member(name: str) -> bool:
    return not name.endswith("/") and (name.startswith(TORCH_PREFIXES) or name in TORCH_FILES)


def torch_members(downloads: Path, pin: Pinned) -> Path:
    """The members of the pinned torch wheel the fixture's torch carries (``TORCH_PREFIXES``,
    ``TORCH_FILES``), under ``torch/``, read by range once and kept in ``downloads`` (under the wheel's
    sha256); every member checked against the wheel's zip directory (size, CRC-32)."""
    kept = downloads / "members" / pin.sha256 / MEMBERS_VERSION
    if (kept / ".complete").is_file():
        return kept
    from vllm_bundle.inputs.remote_wheel import open_wheel
    from vllm_bundle.util.policy import RetryPolicy
    from vllm_bundle.util.transport import make_session

    session = make_session(RetryPolicy())
    files = {f.filename: f for f in project_files(session, PYPI_URL, pin.project)}
    entry = files[pin.filename]
    assert (entry.sha256, entry.size) == (pin.sha256, pin.size), f"PyPI publishes another {pin.filename}"
    partial = kept.with_name(f"{MEMBERS_VERSION}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    with open_wheel(session, entry.url) as wheel:
        for info in wheel.infolist():
            if not _wanted_torch_member(info.filename):
                continue
            data = wheel.read(info)  # zipfile checks the CRC-32 of what it read against the directory's
            assert len(data) == info.file_size, info.filename
            target = partial / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    missing = [name for name in TORCH_FILES if not (partial / name).is_file()]
    assert not missing, f"{pin.filename} has no {missing}"
    (partial / ".complete").write_text(f"{pin.filename} {pin.sha256}\n")
    shutil.rmtree(kept, ignore_errors=True)
    partial.rename(kept)
    return kept


def markupsafe_pin(cp: str) -> Pinned:
    if cp not in MARKUPSAFE:
        raise RuntimeError(f"no real markupsafe wheel pinned for {cp}: add it to tests/upstream/real_wheels.py")
    return MARKUPSAFE[cp]


def build_tools(downloads: Path, cp: str, dest: Path) -> dict[Path, str]:
    """vLLM's build tools (``BUILD_TOOLS``) as wheel files under their own names in ``dest`` -> sha256,
    each checked against the pin (a build group, as the vllm-wheel stage takes it)."""
    pins = [*BUILD_TOOLS, markupsafe_pin(cp)]
    fetched = fetch_pinned(downloads, pins)
    dest.mkdir(parents=True, exist_ok=True)
    return {_named(fetched, pin, dest): pin.sha256 for pin in pins}


def cmake_binary(unpacked: Path) -> Path:
    """The ``cmake`` executable of the real wheel unpacked at ``unpacked``."""
    return unpacked / "cmake" / "data" / "bin" / "cmake"


def _unpack_cmake(wheel: Path, dest: Path) -> Path:
    """The cmake wheel's files under ``dest`` (``cmake/data/bin/cmake`` and its modules), executable."""
    shutil.rmtree(dest, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(dest)
    for binary in (dest / "cmake" / "data" / "bin").iterdir():
        binary.chmod(0o755)
    return dest


def _named(fetched: dict[str, Path], pin: Pinned, work: Path) -> Path:
    """The fetched file under its own name in ``work`` (the cache names blobs by hash; an index serves the
    file name)."""
    named = work / pin.filename
    named.unlink(missing_ok=True)
    try:
        named.hardlink_to(fetched[pin.filename])
    except OSError:  # another file system
        shutil.copyfile(fetched[pin.filename], named)
    return named


def real_wheels(downloads: Path, cp: str, work: Path) -> RealWheels:
    """Download (once) and unpack what the fake upstream needs from the real wheels, into ``work``."""
    triton = triton_pin(cp)
    served = [*BUILD_TOOLS, markupsafe_pin(cp)]
    fetched = fetch_pinned(downloads, [ZIGLANG, triton, VLLM_SDIST, *served])
    work.mkdir(parents=True, exist_ok=True)
    return RealWheels(
        _named(fetched, ZIGLANG, work),
        [_named(fetched, pin, work) for pin in served],
        _extract_triton_amd(fetched[triton.filename], work / "triton-amd"),
        {version: torch_members(downloads, pin) for version, pin in TORCH.items()},
        _unpack_cmake(fetched[CMAKE.filename], work / "cmake"),
        fetched[VLLM_SDIST.filename],
    )
