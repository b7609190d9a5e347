"""What the fixture's torch takes from a real torch wheel (PyPI's torch 2.12.0 and 2.13.0, the releases the
fake indexes serve, read by range in real_wheels.py): its CMake package ``torch/share/cmake``, configured as
a ROCm build configures it, and the pure-Python modules vLLM's build runs (``torch.utils.cpp_extension``,
``torch.utils.hipify``), as they are.

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

#: (file, the configured switch and the line it guards, the value a ROCm build configures there). CMake
#: writes a true @USE_CUDA@ as ON or 1 depending on how the build set it (2.12.0: ON, 2.13.0: 1).
SWITCHES = (
    (
        "Caffe2/Caffe2Config.cmake",
        r'if \((?:OFF|0|FALSE)\)(\n  include\("\$\{CMAKE_CURRENT_LIST_DIR\}/public/LoadHIP\.cmake"\))',
        "if (ON)",
    ),
    (
        "Caffe2/Caffe2Config.cmake",
        r"if\((?:ON|1|TRUE)\)(\n  # The file public/cuda\.cmake exclusively uses)",
        "if(OFF)",
    ),
    (
        "Torch/TorchConfig.cmake",
        r"if\((?:ON|1|TRUE)\)(\n  if\(MSVC\)\n    find_library\(CAFFE2_NVRTC_LIBRARY)",
        "if(OFF)",
    ),
    (
        "Torch/TorchConfig.cmake",
        r"(?<=\n  )if\((?:ON|1|TRUE)\)(\n    append_wholearchive_lib_if_found\(torch_cuda c10_cuda\))",
        "if(OFF)",
    ),
)
#: The CUDA build's names in the export set, and a ROCm build's.
RENAMES = (("torch::cudart", "hip::amdhip64"), ("c10_cuda", "c10_hip"), ("torch_cuda", "torch_hip"))
NVSHMEM = "torch_nvshmem"
#: The libraries the ROCm export set and TorchConfig.cmake name under ``torch/lib``.
LIBRARIES = ("libc10.so", "libc10_hip.so", "libtorch.so", "libtorch_cpu.so", "libtorch_hip.so")


def _switch(text: str, pattern: str, value: str, name: str) -> str:
    switched, count = re.subn(pattern, lambda match: value + match.group(1), text)
    if count != 1:
        raise RuntimeError(f"torch's {name} no longer has one match of {pattern!r}: read its template again")
    return switched


def _without_nvshmem(text: str, name: str) -> str:
    """The export set without its NVSHMEM target: the block that creates or configures it, and its name
    in the expected-targets list."""
    blocks = re.split(r"\n(?=# (?:Create imported target|Import target) )", text)
    kept = [b for b in blocks if not re.match(rf'# (?:Create imported target|Import target) "?{NVSHMEM}\b', b)]
    if len(kept) != len(blocks) - 1:
        raise RuntimeError(f"torch's {name} no longer has one {NVSHMEM} block: read it again")
    return "\n".join(kept).replace(f" {NVSHMEM} ", " ")


def rocm_configured(members: Path) -> dict[str, bytes]:
    """The real torch wheel's members (``torch/...`` under ``members``, real_wheels.py) as a ROCm build of
    the same torch installs them: the CMake package configured for ROCm, every other member as it is."""
    files = {
        str(p.relative_to(members)): p.read_bytes()
        for p in sorted(members.rglob("*"))
        if p.is_file() and p.name != ".complete"
    }
    for name, old, new in SWITCHES:
        key = f"torch/share/cmake/{name}"
        files[key] = _switch(files[key].decode(), old, new, name).encode()
    for name in ("Caffe2/Caffe2Targets.cmake", "Caffe2/Caffe2Targets-release.cmake"):
        key = f"torch/share/cmake/{name}"
        text = _without_nvshmem(files[key].decode(), name)
        for old, new in RENAMES:
            text = text.replace(old, new)
        files[key] = text.encode()
    return files
