"""The CMake package of the fixture's torch: a real torch wheel's ``torch/share/cmake`` (PyPI's torch 2.12.0,
read by range in real_wheels.py), configured as a ROCm build configures it.

PyPI's wheel is a CUDA build, so its configured files say ``USE_CUDA`` where a ROCm build says
``USE_ROCM``. The templates they come from are pytorch's ``cmake/Caffe2Config.cmake.in`` (``if
(@USE_ROCM@) include(public/LoadHIP.cmake)``, ``if(@USE_CUDA@) ... public/cuda.cmake``) and
``cmake/TorchConfig.cmake.in`` (the ``TORCH_CUDA_LIBRARIES`` block under ``if(@USE_CUDA@)``); the export
set in ``Caffe2Targets*.cmake`` is what install(EXPORT Caffe2Targets) writes, whose CUDA targets a ROCm
build names ``*_hip`` (pytorch ``c10/hip/CMakeLists.txt``: ``c10_hip`` links ``c10`` and
``hip::amdhip64``; ``caffe2/CMakeLists.txt``: ``torch_hip``, ``torch_hip_library``) and which has no
NVSHMEM target (``USE_NVSHMEM`` is CUDA-only). This module flips exactly those switches and names, and
fails when a line it flips is not in the real file (a new torch: look again). Every other byte, and
``public/LoadHIP.cmake`` with its ``find_package`` of every ROCm library, is PyPI's.
"""

from __future__ import annotations

import re
from pathlib import Path

#: (file, the configured CUDA text, what a ROCm build configures there)
SWITCHES = (
    (
        "Caffe2/Caffe2Config.cmake",
        'if (OFF)\n  include("${CMAKE_CURRENT_LIST_DIR}/public/LoadHIP.cmake")',
        'if (ON)\n  include("${CMAKE_CURRENT_LIST_DIR}/public/LoadHIP.cmake")',
    ),
    (
        "Caffe2/Caffe2Config.cmake",
        "if(ON)\n  # The file public/cuda.cmake exclusively uses CAFFE2_USE_*.",
        "if(OFF)\n  # The file public/cuda.cmake exclusively uses CAFFE2_USE_*.",
    ),
    (
        "Torch/TorchConfig.cmake",
        "if(ON)\n  if(MSVC)\n    find_library(CAFFE2_NVRTC_LIBRARY",
        "if(OFF)\n  if(MSVC)\n    find_library(CAFFE2_NVRTC_LIBRARY",
    ),
    (
        "Torch/TorchConfig.cmake",
        "  if(ON)\n    append_wholearchive_lib_if_found(torch_cuda c10_cuda)",
        "  if(OFF)\n    append_wholearchive_lib_if_found(torch_cuda c10_cuda)",
    ),
)
#: The CUDA build's names in the export set, and a ROCm build's.
RENAMES = (("torch::cudart", "hip::amdhip64"), ("c10_cuda", "c10_hip"), ("torch_cuda", "torch_hip"))
NVSHMEM = "torch_nvshmem"
#: The libraries the ROCm export set and TorchConfig.cmake name under ``torch/lib``.
LIBRARIES = ("libc10.so", "libc10_hip.so", "libtorch.so", "libtorch_cpu.so", "libtorch_hip.so")


def _switch(text: str, old: str, new: str, name: str) -> str:
    if text.count(old) != 1:
        raise RuntimeError(f"torch's {name} no longer has {old.splitlines()[0]!r} once: read its template again")
    return text.replace(old, new)


def _without_nvshmem(text: str, name: str) -> str:
    """The export set without its NVSHMEM target: the block that creates or configures it, and its name
    in the expected-targets list."""
    blocks = re.split(r"\n(?=# (?:Create imported target|Import target) )", text)
    kept = [b for b in blocks if not re.match(rf'# (?:Create imported target|Import target) "?{NVSHMEM}\b', b)]
    if len(kept) != len(blocks) - 1:
        raise RuntimeError(f"torch's {name} no longer has one {NVSHMEM} block: read it again")
    return "\n".join(kept).replace(f" {NVSHMEM} ", " ")


def rocm_configured(real: Path) -> dict[str, bytes]:
    """``torch/share/cmake/...`` -> bytes, as a ROCm build of the same torch installs it."""
    files = {
        f"torch/share/cmake/{p.relative_to(real)}": p.read_text()
        for p in sorted(real.rglob("*"))
        if p.is_file() and p.name != ".complete"
    }
    for name, old, new in SWITCHES:
        key = f"torch/share/cmake/{name}"
        files[key] = _switch(files[key], old, new, name)
    for name in ("Caffe2/Caffe2Targets.cmake", "Caffe2/Caffe2Targets-release.cmake"):
        key = f"torch/share/cmake/{name}"
        text = _without_nvshmem(files[key], name)
        for old, new in RENAMES:
            text = text.replace(old, new)
        files[key] = text
    return {name: text.encode() for name, text in files.items()}
