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
- cmake 3.31.10: the CMake that runs vLLM's own CMake code in the tests (test_rocm_configure.py).
- torch 2.12.0 (read by HTTP range, never downloaded whole: 532 MB): the CMake package a torch wheel
  installs (``torch/share/cmake/{Torch,Caffe2,ATen}``, ``Caffe2/public/LoadHIP.cmake``), which the
  fixture's torch carries configured for ROCm (torch_cmake.py). Each member is checked against the size
  and CRC-32 of the wheel's own zip directory, and PyPI must publish the pinned sha256 for the wheel.
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
#: Read by range for its CMake package only (the same files in every CPython tag's wheel).
TORCH = Pinned(
    "torch",
    "torch-2.12.0-cp311-cp311-manylinux_2_28_x86_64.whl",
    "415c1b8d0412f67551c8e89a2daca0fb3e56694af0281ba155eaa9da481f58b4",
    532_170_085,
)
TORCH_CMAKE = "torch/share/cmake/"
#: What the fixture's triton wheel takes from the real one (paths in the wheel).
TRITON_AMD = "triton/backends/amd/"
TRITON_AMD_FILES = ("driver.c", "include/")


@dataclass(frozen=True)
class RealWheels:
    ziglang: Path  # the wheel, under its own file name
    triton_amd: Path  # a directory: the real triton/backends/amd/driver.c and include/
    torch_cmake: Path  # a directory: the real torch/share/cmake/ of a torch wheel
    cmake: Path  # a directory: the real cmake wheel unpacked (its data/bin/cmake runs)


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


def torch_cmake_files(downloads: Path) -> Path:
    """``torch/share/cmake/`` of the pinned torch wheel, read by range once and kept in ``downloads``
    (under the wheel's sha256); every member checked against the wheel's zip directory (size, CRC-32)."""
    kept = downloads / "members" / TORCH.sha256 / "share-cmake"
    if (kept / ".complete").is_file():
        return kept
    from vllm_bundle.inputs.remote_wheel import open_wheel
    from vllm_bundle.util.transport import RetryPolicy, make_session

    session = make_session(RetryPolicy())
    files = {f.filename: f for f in project_files(session, PYPI_URL, TORCH.project)}
    entry = files[TORCH.filename]
    assert (entry.sha256, entry.size) == (TORCH.sha256, TORCH.size), f"PyPI publishes another {TORCH.filename}"
    partial = kept.with_name("share-cmake.partial")
    shutil.rmtree(partial, ignore_errors=True)
    with open_wheel(session, entry.url) as wheel:
        for info in wheel.infolist():
            if not info.filename.startswith(TORCH_CMAKE) or info.is_dir():
                continue
            data = wheel.read(info)  # zipfile checks the CRC-32 of what it read against the directory's
            assert len(data) == info.file_size, info.filename
            target = partial / info.filename.removeprefix(TORCH_CMAKE)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    (partial / ".complete").write_text(f"{TORCH.filename} {TORCH.sha256}\n")
    shutil.rmtree(kept, ignore_errors=True)
    partial.rename(kept)
    return kept


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


def real_wheels(downloads: Path, cp: str, work: Path) -> RealWheels:
    """Download (once) and unpack what the fake upstream needs from the real wheels, into ``work``."""
    triton = triton_pin(cp)
    fetched = fetch_pinned(downloads, [ZIGLANG, triton, CMAKE])
    work.mkdir(parents=True, exist_ok=True)
    named = work / ZIGLANG.filename  # the cache names blobs by hash; the index serves the file name
    named.unlink(missing_ok=True)
    try:
        named.hardlink_to(fetched[ZIGLANG.filename])
    except OSError:  # another file system
        shutil.copyfile(fetched[ZIGLANG.filename], named)
    return RealWheels(
        named,
        _extract_triton_amd(fetched[triton.filename], work / "triton-amd"),
        torch_cmake_files(downloads),
        _unpack_cmake(fetched[CMAKE.filename], work / "cmake"),
    )
