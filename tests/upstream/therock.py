"""TheRock-shaped artifacts: one stream (index) of ROCm SDK wheels, device-code packages, torch and triton,
shaped after TheRock's packaging (build_tools/packaging/python) and its RELEASES.md:

- ``rocm`` is an sdist only (a setuptools project whose ``rocm_sdk`` module torch imports at start-up);
- the SDK is the wheels rocm-sdk-core, rocm-sdk-libraries, rocm-sdk-devel, rocm-sdk-device-<isa>;
- torch requires ``rocm[libraries]==<ver>`` and names its device code through extras ``device-<isa>``:
  per ISA on whl-multi-arch, per sub-family (rocm-bootstrap's bundle, e.g. gfx115x) on whl-next;
- the index mirrors PyPI packages (numpy, setuptools 81.0.0, filelock) in other versions than PyPI's;
- the compiler lives in rocm-sdk-core (``_rocm_sdk_core/lib/llvm/bin``: clang, clang++, amdclang,
  amdclang++ and ``rocm.cfg``), with the device libraries under ``lib/llvm/amdgcn/bitcode`` and the HIP
  headers under ``include/hip``; rocm-sdk-devel holds only ``rocm_sdk_devel/_devel.tar``, a tree of
  ``_rocm_sdk_devel/`` whose files are symlinks into ``_rocm_sdk_core`` plus the CMake packages
  (``lib/cmake/hip``, ``lib/cmake/hip-lang``) that core lacks, expanded on first use by ``rocm_sdk``
  (fake_rocm_devel.py; ROCm/TheRock@89553ce build_tools/_therock_utils/py_packaging.py
  populate_devel_files, templates/rocm-sdk-core/setup.py, base/aux-overlay/CMakeLists.txt);
- the fake compiler is Debian's clang-19 (real AMDGPU code objects) behind a wrapper that finds its ROCm
  root, device libraries and headers as TheRock's clang does (``compiler_wrapper``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rocm_bootstrap import PackagingLevel, bundle_for_target, device_dist_name

from .packaging_fixtures import make_tarball, make_wheel

ALL_ISAS = ("gfx1150", "gfx1151", "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1200", "gfx1201", "gfx942", "gfx950")
LINUX = "linux_x86_64"
AMDSMI_STUB = b"def amdsmi_init():\n    raise RuntimeError('no GPU')\n"
MIRRORED = (("numpy", "2.9.0"), ("setuptools", "81.0.0"), ("filelock", "3.20.0"))


@dataclass(frozen=True)
class Stream:
    """One of TheRock's indexes: its name under therock/ and the versions it serves."""

    name: str
    rocm: str
    torch: str
    triton: str
    torch_device: Callable[[str], str]  # ISA -> the torch device-code package that holds it


def per_isa(isa: str) -> str:
    return f"amd-torch-device-{isa}"


def per_sub_family(isa: str) -> str:
    return str(device_dist_name("amd-torch-device", bundle_for_target(isa, PackagingLevel.SUB_FAMILY)))


MULTI_ARCH = Stream("whl-multi-arch", "7.14.0", "2.12.0+rocm7.14.0", "3.7.1+git0263a6a6.rocm7.14.0", per_isa)
NEXT = Stream("whl-next", "10.0.0", "2.13.0+rocm10.0.0", "3.7.1+rocm10.0.0", per_sub_family)

ROCM_SDK_INIT = """import ctypes, pathlib
from rocm_sdk._dist_info import __version__


def initialize_process(preload_shortnames=(), check_version=None):
    \"\"\"Preload the SDK's libraries by short name, as TheRock's rocm_sdk does for torch.\"\"\"
    if check_version and check_version != __version__:
        raise RuntimeError(f"rocm_sdk {__version__} does not match the {check_version} torch was built for")
    import _rocm_sdk_core

    lib = pathlib.Path(_rocm_sdk_core.__file__).parent / "lib"
    for short in preload_shortnames:
        for path in sorted(lib.glob(f"lib{short}.so*")):
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
"""
ROCM_SDK_MAIN = """import sys, pathlib
from rocm_sdk._dist_info import __version__


def main():
    args = sys.argv[1:]
    if args[:1] in (['path'], ['init']):
        try:
            from rocm_sdk import _devel
            root = _devel.get_devel_root()
        except ModuleNotFoundError:
            print('ERROR: Could not load the `rocm[devel]` package, which is needed for development', file=sys.stderr)
            sys.exit(1)
        if args[:1] == ['init']:
            if '--quiet' not in args:
                print(f"Devel contents expanded to '{root}'")
            return
        sub = {'--root': '', '--bin': 'bin', '--cmake': 'lib/cmake'}[args[1]]
        print(root / sub if sub else root)
    elif args[:1] == ['version']:
        print(__version__)
    elif args[:1] == ['targets']:
        import _rocm_sdk_core
        info = pathlib.Path(_rocm_sdk_core.__file__).parent / 'share' / 'therock' / 'dist_info.json'
        import json
        print(json.loads(info.read_text())['dist_amdgpu_targets'])
    else:
        sys.exit('usage: rocm-sdk path --root|--bin|--cmake | init | version | targets')


if __name__ == "__main__":
    main()
"""
ROCM_SETUP = """import os, subprocess, sysconfig
from setuptools import find_packages, setup

VERSION = {version!r}
ISAS = {isas!r}
DEFAULT_TARGET_FAMILY = {default!r}


def determine_target_family():
    # rocm_sdk/_dist_info.py: $ROCM_SDK_TARGET_FAMILY, else what offload-arch reports on this machine
    # (the interpreter's scripts directory first on PATH), else the default.
    family = os.getenv("ROCM_SDK_TARGET_FAMILY")
    if family is None:
        path = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
        try:
            found = subprocess.check_output(["offload-arch"], env={{**os.environ, "PATH": path}}, text=True)
            family = next((isa for isa in found.split() if isa in ISAS), None)
        except (OSError, subprocess.CalledProcessError):
            family = None
    family = family or DEFAULT_TARGET_FAMILY
    if family not in ISAS:
        raise ValueError(f"Requested ROCM_SDK_TARGET_FAMILY={{family}} is not available")
    return family


TARGET_FAMILY = determine_target_family()

setup(
    name="rocm",
    version=VERSION,
    package_dir={{"": "src"}},
    packages=find_packages(where="src"),
    entry_points={{"console_scripts": ["rocm-sdk = rocm_sdk.__main__:main"]}},
    install_requires=[f"rocm-sdk-core=={{VERSION}}"],
    extras_require={{
        "libraries": [f"rocm-sdk-libraries=={{VERSION}}"],
        "devel": [f"rocm-sdk-devel=={{VERSION}}"],
        "device": [f"rocm-sdk-device-{{TARGET_FAMILY}}=={{VERSION}}"],
        **{{f"device-{{isa}}": [f"rocm-sdk-device-{{isa}}=={{VERSION}}"] for isa in ISAS}},
    }},
)
"""


BUILD_SYSTEM = b'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'


def rocm_sdist(out: Path, version: str) -> Path:
    """``rocm-<ver>.tar.gz``: TheRock publishes the meta package only as an sdist."""
    top = f"rocm-{version}"
    files = {
        f"{top}/PKG-INFO": f"Metadata-Version: 2.1\nName: rocm\nVersion: {version}\n".encode(),
        f"{top}/pyproject.toml": BUILD_SYSTEM,
        f"{top}/setup.py": ROCM_SETUP.format(version=version, isas=ALL_ISAS, default="gfx1151").encode(),
        f"{top}/src/rocm_sdk/__init__.py": ROCM_SDK_INIT.encode(),
        f"{top}/src/rocm_sdk/__main__.py": ROCM_SDK_MAIN.encode(),
        f"{top}/src/rocm_sdk/_devel.py": Path(__file__).with_name("fake_rocm_devel.py").read_bytes(),
        f"{top}/src/rocm_sdk/_dist_info.py": f"__version__ = {version!r}\n".encode(),
    }
    return make_tarball(out / f"{top}.tar.gz", files)


def torch_files(stream: Stream, libs: dict[str, Path]) -> dict[str, bytes | Path]:
    init = (
        "from torch import version\n"
        "from torch import _rocm_init\n"
        "_rocm_init.initialize()\n"
        "from torch._C import _hip_check\n"
        f"__version__ = '{stream.torch}'\n"
    )
    rocm_init = (
        "def initialize():\n"
        "    import rocm_sdk\n"
        "    rocm_sdk.initialize_process(\n"
        f"        preload_shortnames=['amd_comgr', 'amdhip64'], check_version='{stream.rocm}')\n"
    )
    return {
        "torch/__init__.py": init.encode(),
        "torch/_rocm_init.py": rocm_init.encode(),
        f"torch/{libs['torch_C'].name}": libs["torch_C"],
        "torch/version.py": f"__version__ = '{stream.torch}'\nhip = '{stream.rocm}'\ncuda = None\n".encode(),
        "torch/lib/libc10.so": libs["c10"],
        "torch/lib/libtorch_hip.so": libs["torch_hip"],
    }


# The fake SDK's compiler: Debian's clang-19 (a real AMDGPU backend, real code objects), behind a
# wrapper that behaves as TheRock's clang does where a build depends on it (see compiler_wrapper).
HOST_CLANG = {"clang": "clang-19", "clang++": "clang++-19", "amdclang": "clang-19", "amdclang++": "clang++-19"}
COMPILER_WRAPPER = """#!/bin/sh
# Stands in for TheRock's lib/llvm/bin/{name} (rocm-sdk-core) with {host}.
# Its ROCm root is three levels above where it really is: /proc/self/exe resolves a symlink but not a
# hard link (TheRock lib/llvm/bin/rocm.cfg: --rocm-path='<CFGDIR>/../../..').
self=$(realpath -- "$0")
root=$(cd -- "$(dirname -- "$self")/../../.." && pwd)
hip=
for arg in "$@"; do
    case $arg in
        -v) [ -f "$root/include/hip/hip_runtime.h" ] && echo "Found HIP installation: $root, version {version}" >&2 ;;
        hip|*.hip) hip=1 ;;
    esac
done
if [ -n "$hip" ]; then
    if [ ! -f "${{HIP_DEVICE_LIB_PATH:-$root/amdgcn/bitcode}}/ocml.bc" ]; then
        echo "clang: error: cannot find ROCm device library; provide its path via '--rocm-path' or '--rocm-device-lib-path', or pass '-nogpulib' to build without ROCm device library" >&2
        exit 1
    fi
    if [ ! -f "$root/include/hip/hip_runtime.h" ]; then
        echo "clang: error: cannot find HIP runtime; provide its path via '--rocm-path', or pass '-nogpuinc' to build without HIP runtime" >&2
        exit 1
    fi
    exec {host} -nogpulib -nogpuinc -isystem "$root/include" "$@"
fi
exec {host} "$@"
"""
# Just what a kernel and its host-side launch stub need from hip_runtime.h (our own, not AMD's header).
HIP_RUNTIME_H = b"""#pragma once
#include <stddef.h>
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
typedef struct { unsigned x, y, z; } dim3;
typedef int hipError_t;
typedef struct ihipStream_t *hipStream_t;
#ifdef __cplusplus
extern "C" {
#endif
hipError_t hipLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared, hipStream_t stream);
hipError_t __hipPushCallConfiguration(dim3 grid, dim3 block, size_t shared, hipStream_t stream);
hipError_t __hipPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared, hipStream_t *stream);
#ifdef __cplusplus
}
#endif
"""


def host_compiler(name: str) -> str:
    """The absolute path of Debian's clang-19 driver ``name`` stands in for; the tests need it."""
    found = shutil.which(HOST_CLANG[name])
    if found is None:
        raise RuntimeError(
            f"the fake ROCm SDK compiles HIP with Debian's {HOST_CLANG[name]}, which is not installed "
            "(apt-get install clang-19 lld-19 clang-tools-19; .ci/run does)"
        )
    return found


def compiler_wrapper(name: str, version: str) -> bytes:
    """``_rocm_sdk_core/lib/llvm/bin/<name>``. Like TheRock's clang it needs the device libraries
    ($HIP_DEVICE_LIB_PATH, else <root>/amdgcn/bitcode, which only the devel tree has) and the HIP headers
    of its ROCm root, failing with clang's own messages, and its ``-v`` names that root ("Found HIP
    installation: <root>, version <v>", llvm-project clang/lib/Driver/ToolChains/AMDGPU.cpp
    RocmInstallationDetector), which CMake reads (Modules/CMakeDetermineHIPCompiler.cmake)."""
    return COMPILER_WRAPPER.format(name=name, host=host_compiler(name), version=version).encode()


def core_files(version: str, libs: dict[str, Path]) -> dict[str, bytes | Path]:
    files: dict[str, bytes | Path] = {
        "_rocm_sdk_core/__init__.py": b"",
        "_rocm_sdk_core/lib/libamdhip64.so.7": libs["hip"],
        "_rocm_sdk_core/lib/libamd_comgr.so.3": libs["comgr"],
        "_rocm_sdk_core/lib/llvm/bin/clang-20": libs["clang"],
        "_rocm_sdk_core/lib/llvm/lib/libomp.so": libs["omp"],
        "_rocm_sdk_core/lib/llvm/bin/rocm.cfg": b"--rocm-path='<CFGDIR>/../../..'\n",
        "_rocm_sdk_core/lib/llvm/amdgcn/bitcode/ocml.bc": b"BC\xc0\xde fixture device library\n",
        "_rocm_sdk_core/include/hip/hip_runtime.h": HIP_RUNTIME_H,
        "_rocm_sdk_core/share/amd_smi/amdsmi/__init__.py": AMDSMI_STUB,
        "_rocm_sdk_core/share/therock/dist_info.json": json.dumps({"dist_amdgpu_targets": ";".join(ALL_ISAS)}).encode(),
    }
    for name in HOST_CLANG:
        files[f"_rocm_sdk_core/lib/llvm/bin/{name}"] = compiler_wrapper(name, version)
    return files


#: Files of core the devel tree links to, and what only the devel tree has.
DEVEL_ONLY = {
    "lib/cmake/hip/hip-config.cmake": b"# fixture: find_package(hip)\n",
    "lib/cmake/hip-lang/hip-lang-config.cmake": b"# fixture: enable_language(HIP) checks that this exists\n",
}


def devel_tarball(core: dict[str, bytes | Path], out: Path) -> Path:
    """``rocm_sdk_devel/_devel.tar`` (uncompressed, as TheRock's CI publishes it): ``_rocm_sdk_devel/``
    with each core file as a relative symlink into ``_rocm_sdk_core``, the top-level ``bin/amdclang*``
    links, the ``llvm`` and ``amdgcn`` directory links, and the CMake packages core lacks."""
    top = "_rocm_sdk_devel"
    files: dict[str, bytes | Path] = {f"{top}/__init__.py": b"", **{f"{top}/{k}": v for k, v in DEVEL_ONLY.items()}}
    symlinks = {
        f"{top}/llvm": "lib/llvm",
        f"{top}/amdgcn": "lib/llvm/amdgcn",
        f"{top}/lib/libamdhip64.so": "libamdhip64.so.7",
    }
    for name in core:
        relative = name.removeprefix("_rocm_sdk_core/")
        if relative in ("__init__.py",) or relative.startswith("share/"):
            continue
        link = f"{top}/{relative}"
        symlinks[link] = os.path.relpath(name, os.path.dirname(link))
    for name in ("amdclang", "amdclang++"):
        symlinks[f"{top}/bin/{name}"] = f"../lib/llvm/bin/{name}"
    return make_tarball(out / "_devel.tar", files, symlinks=symlinks, compressed=False)


def device_link_manifest(isa: str, version: str) -> bytes:
    """``_rocm_sdk_libraries/.devel_links/<isa>.json``: what ``rocm-sdk init`` links into the devel tree."""
    kpack = f"lib/.kpack/rocblas_{isa}.kpack"
    links = [{"relpath": kpack, "target": f"../../../_rocm_sdk_libraries/{kpack}"}]
    return json.dumps({"version": version, "links": links}).encode()


def stream_artifacts(files: Path, stream: Stream, libs: dict[str, Path], cp: str) -> list[Path]:
    """Every file one TheRock stream serves."""
    v, py_tag = stream.rocm, f"py3-none-{LINUX}"
    core = core_files(v, libs)
    devel: dict[str, bytes | Path] = {
        "rocm_sdk_devel/__init__.py": b"from ._dist_info import __version__\n",
        "rocm_sdk_devel/_dist_info.py": f"__version__ = {v!r}\n".encode(),
        "rocm_sdk_devel/_devel.tar": devel_tarball(core, files.parent / "_work" / f"devel-{v}"),
    }
    executables = tuple(f"_rocm_sdk_core/lib/llvm/bin/{name}" for name in HOST_CLANG)
    artifacts = [
        rocm_sdist(files, v),
        make_wheel(files, "rocm-sdk-core", v, py_tag, core, executables=executables),
        make_wheel(
            files,
            "rocm-sdk-libraries",
            v,
            py_tag,
            {"_rocm_sdk_libraries/__init__.py": b"", "_rocm_sdk_libraries/lib/librocblas.so.5": libs["rocblas"]},
            requires=(f"rocm-sdk-core=={v}",),
        ),
        make_wheel(files, "rocm-sdk-devel", v, py_tag, devel, requires=(f"rocm-sdk-core=={v}",)),
    ]
    for isa in ALL_ISAS:
        kpack = {
            f"_rocm_sdk_libraries/lib/.kpack/rocblas_{isa}.kpack": f"device code {isa}\n".encode(),
            f"_rocm_sdk_libraries/.devel_links/{isa}.json": device_link_manifest(isa, v),
        }
        artifacts.append(make_wheel(files, f"rocm-sdk-device-{isa}", v, py_tag, kpack, (f"rocm-sdk-libraries=={v}",)))
    holders: dict[str, list[str]] = {}
    for isa in ALL_ISAS:
        holders.setdefault(stream.torch_device(isa), []).append(isa)
    for package, isas in sorted(holders.items()):
        kpacks = {f"torch/lib/.kpack/torch_hip_{isa}.kpack": f"torch device code {isa}\n".encode() for isa in isas}
        artifacts.append(make_wheel(files, package, stream.torch, py_tag, kpacks, (f"torch=={stream.torch}",)))
    requires = [f"rocm[libraries]=={v}", f"triton=={stream.triton}", "filelock", "typing-extensions>=4.10"]
    requires += [f'{stream.torch_device(isa)}=={stream.torch}; extra == "device-{isa}"' for isa in ALL_ISAS]
    tag = f"{cp}-{cp}-{LINUX}"
    artifacts.append(make_wheel(files, "torch", stream.torch, tag, torch_files(stream, libs), tuple(requires)))
    triton: dict[str, bytes | Path] = {
        "triton/__init__.py": b"__version__ = '3.7.1'\n",
        "triton/_C/libtriton.so": libs["triton"],
    }
    artifacts.append(make_wheel(files, "triton", stream.triton, f"{cp}-{cp}-{LINUX}", triton))
    for name, version in MIRRORED:  # what TheRock's index mirrors from PyPI, in its own versions
        module = name.replace("-", "_")
        artifacts.append(make_wheel(files, name, version, "py3-none-any", {f"{module}/__init__.py": b""}))
    return artifacts


def hashless(filename: str) -> bool:
    """TheRock's index pages give a #sha256 for some files only."""
    return filename.startswith(("rocm-", "rocm_sdk_libraries", "rocm_sdk_device", "amd_torch_device", "triton"))
