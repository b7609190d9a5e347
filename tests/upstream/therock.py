"""TheRock-shaped artifacts: one index (stream) of ROCm SDK wheels, device-code packages, the torch family
and triton, built from the facts in facts.toml (names, versions, tags, requirements, the files that
matter, each with its source) and from what those facts leave to the builder:

- ``rocm`` is an sdist only, whose ``rocm_sdk`` module torch imports at start-up and whose setup.py asks
  ``offload-arch`` unless ``ROCM_SDK_TARGET_FAMILY`` is set;
- torch and torchvision declare their device code as extras ``device-<isa>`` (the target's package and
  the sub-family and family packages the index has, by rocm-bootstrap's chain) and ``device-all``, as
  TheRock's wheel splitter writes them (rocm-systems shared/kpack/python/rocm_kpack/wheel_splitter.py);
- every ``rocm-sdk-device-*`` wheel and ``rocm-sdk-libraries`` ship the same empty
  ``_rocm_sdk_libraries/__init__.py``;
- the compiler lives in rocm-sdk-core (``_rocm_sdk_core/lib/llvm/bin``: clang, clang++, amdclang,
  amdclang++, TheRock's ``rocm.cfg`` and the driver configurations that include it), with the device libraries under ``lib/llvm/amdgcn/bitcode`` and the HIP
  headers under ``include/hip``; rocm-sdk-devel holds only ``rocm_sdk_devel/_devel.tar``, a tree of
  ``_rocm_sdk_devel/`` whose files are symlinks into ``_rocm_sdk_core`` plus the CMake packages
  (``lib/cmake/hip``, ``lib/cmake/hip-lang``) that core lacks, expanded on first use by ``rocm_sdk``
  (fake_rocm_devel.py; ROCm/TheRock@89553ce build_tools/_therock_utils/py_packaging.py
  populate_devel_files, templates/rocm-sdk-core/setup.py, base/aux-overlay/CMakeLists.txt);
- the fake compiler is the clang of the real ziglang 0.17.1 wheel (LLVM 22, whose AMDGPU backend knows every
  target ISA, gfx950 included: ``sdk_toolchain``) behind a wrapper that finds its ROCm root, device
  libraries and headers as TheRock's clang does (``compiler_wrapper``), and compiles each
  translation unit of a torch extension (vLLM's real sources, which need ROCm's and torch's headers) from
  a small stand-in with the command line CMake gave;
- the SDK's CMake packages (rocm_cmake.py) and torch's (torch_cmake.py: a real torch wheel's, configured
  for ROCm), with the libraries they name: the runtime in core, the math libraries in rocm-sdk-libraries.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import zipfile
from collections.abc import Mapping
from pathlib import Path

from vllm_bundle.inputs.facts import IndexFacts, ProjectFacts, load_facts

from . import rocm_cmake, torch_cmake
from .packaging_fixtures import Content, make_tarball, make_wheel
from .stand_ins import PARSE_ARGUMENTS, STAND_IN_UNIT

FACTS = load_facts(Path(__file__).with_name("facts.toml"))
MULTI_ARCH = FACTS.indexes["whl-multi-arch"]
NEXT = FACTS.indexes["stable/whl-next"]
NIGHTLY = FACTS.indexes["nightly/whl-next"]
PER_FAMILY = FACTS.indexes["v2/{family}"]
ALL_ISAS = ("gfx1150", "gfx1151", "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1200", "gfx1201", "gfx942", "gfx950")
#: The ISAs each legacy per-family index built for: its wheels carry device code for these, inside their
#: libraries (ROCm/TheRock@89553ce docs/packaging/legacy_per_family_releases.md:48-56, the table of GPUs,
#: ISAs and families; cmake/therock_amdgpu_targets.cmake, each ``therock_add_amdgpu_target(<isa> ... FAMILY
#: ... <family>)``, and an ISA is a family of its own).
FAMILY_ISAS = {
    "gfx1151": ("gfx1151",),
    "gfx110X-all": ("gfx1100", "gfx1101", "gfx1102", "gfx1103"),
    "gfx120X-all": ("gfx1200", "gfx1201"),
    "gfx94X-dcgpu": ("gfx942",),
    "gfx950-dcgpu": ("gfx950",),
}
#: The libraries of a per-family index that carry the family's device code in their fat binaries
#: (``.hip_fatbin``): one of the SDK's, and torch's own, built without TheRock's kpack split.
FAMILY_DEVICE_LIBRARIES = ("rocblas", "torch_hip")  # keys of the fixture's libraries (fixture._elf_chain)
AMDSMI_STUB = b"def amdsmi_init():\n    raise RuntimeError('no GPU')\n"


def _rocm_sdk_init() -> str:
    """TheRock's ``rocm_sdk/__init__.py`` as the fake ships it: ``preload_libraries`` and
    ``initialize_process`` with TheRock's signatures on TheRock's lines (92 and 118-126 of
    ROCm/TheRock@89553ce build_tools/packaging/python/templates/rocm/src/rocm_sdk/__init__.py; RTLD_GLOBAL by
    default, lines 104 and 145), the padding in between blank; a mismatched ``check_version`` raises."""
    head = (
        "import ctypes, pathlib\n"
        "from typing import List, Optional\n"
        "\n"
        "from rocm_sdk._dist_info import __version__\n"
        "\n"
        "_ALL_CDLLS = {}\n"
    )
    preload = (
        "def preload_libraries(*shortnames: str, rtld_global: bool = True):\n"
        "    import _rocm_sdk_core\n"
        "\n"
        "    lib = pathlib.Path(_rocm_sdk_core.__file__).parent / 'lib'\n"
        "    mode = ctypes.RTLD_GLOBAL if rtld_global is True else ctypes.RTLD_LOCAL\n"
        "    for shortname in shortnames:\n"
        "        for path in sorted(lib.glob(f'lib{shortname}.so*')):\n"
        "            _ALL_CDLLS.setdefault(shortname, ctypes.CDLL(str(path), mode=mode))\n"
    )
    initialize = (
        "def initialize_process(\n"
        "    *,\n"
        "    preload_shortnames: Optional[List[str]] = None,\n"
        "    rtld_global: bool = True,\n"
        "    env_override: bool = True,\n"
        "    check_version=None,\n"
        "    fail_on_version_mismatch: bool = False,\n"
        "    **kwargs,\n"
        "):\n"
        "    if check_version and check_version != __version__:\n"
        "        raise RuntimeError(f'rocm_sdk {__version__} does not match the {check_version} torch was built for')\n"
        "    if preload_shortnames:\n"
        "        preload_libraries(*preload_shortnames, rtld_global=rtld_global)\n"
    )
    lines = head.splitlines(keepends=True)
    lines += ["\n"] * (91 - len(lines))  # preload_libraries on line 92
    lines += preload.splitlines(keepends=True)
    lines += ["\n"] * (117 - len(lines))  # initialize_process on line 118, its rtld_global on 121
    return "".join(lines) + initialize


ROCM_SDK_INIT = _rocm_sdk_init()
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
AVAILABLE_TARGET_FAMILIES = {families!r}
DEFAULT_TARGET_FAMILY = {default!r}
# A kpack-split (multi-arch) SDK has one rocm-sdk-libraries and a device package per ISA; a per-family one,
# rocm-sdk-libraries-<family> with the family's device code inside.
KPACK_SPLIT = {split!r}


def determine_target_family():
    # rocm_sdk/_dist_info.py: $ROCM_SDK_TARGET_FAMILY, else what offload-arch reports on this machine
    # (the interpreter's scripts directory first on PATH), else the default. (The real one also maps an
    # ISA to the family names it belongs to; the pipeline always sets the variable.)
    family = os.getenv("ROCM_SDK_TARGET_FAMILY")
    if family is None:
        path = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
        try:
            found = subprocess.check_output(["offload-arch"], env={{**os.environ, "PATH": path}}, text=True)
            family = next((isa for isa in found.split() if isa in AVAILABLE_TARGET_FAMILIES), None)
        except (OSError, subprocess.CalledProcessError):
            family = None
    family = family or DEFAULT_TARGET_FAMILY
    if family not in AVAILABLE_TARGET_FAMILIES:
        raise ValueError(
            f"Requested ROCM_SDK_TARGET_FAMILY={{family}} is not available in the distribution "
            f"(available: {{', '.join(AVAILABLE_TARGET_FAMILIES)}})"
        )
    return family


TARGET_FAMILY = determine_target_family()
LIBRARIES = "rocm-sdk-libraries" if KPACK_SPLIT else f"rocm-sdk-libraries-{{TARGET_FAMILY}}"

setup(
    name="rocm",
    version=VERSION,
    package_dir={{"": "src"}},
    packages=find_packages(where="src"),
    entry_points={{"console_scripts": ["rocm-sdk = rocm_sdk.__main__:main"]}},
    install_requires=[f"rocm-sdk-core=={{VERSION}}"],
    extras_require={{
        "libraries": [f"{{LIBRARIES}}=={{VERSION}}"],
        "devel": [f"rocm-sdk-devel=={{VERSION}}"],
        "device": [f"rocm-sdk-device-{{TARGET_FAMILY}}=={{VERSION}}"],
        **{{f"device-{{isa}}": [f"rocm-sdk-device-{{isa}}=={{VERSION}}"] for isa in KPACK_SPLIT}},
    }},
)
"""


#: triton/language/target_info.py: the names PyPI's triton-3.7.1 wheel defines there (cp312 manylinux,
#: sha256 7e408699…dc449a728), which triton_kernels imports; no GPU query at import time here.
TRITON_TARGET_INFO = b"".join(
    f"def {name}(*args):\n    raise RuntimeError('no GPU')\n\n\n".encode()
    for name in ("current_target", "is_cuda", "cuda_capability_geq", "is_hip", "is_hip_cdna3", "is_hip_cdna4")
)


BUILD_SYSTEM = b'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'


def rocm_sdist(out: Path, version: str, index: IndexFacts) -> Path:
    """``rocm-<ver>.tar.gz``: TheRock publishes the meta package only as an sdist. A per-family index's is
    built for its one family, which is its default and only choice (ROCm/TheRock@89553ce
    build_tools/_therock_utils/py_packaging.py:240-256 ``restrict_families``; templates/rocm/setup.py:51-58:
    each extra names the package of that family, ``rocm-sdk-libraries-{target_family}``)."""
    top = f"rocm-{version}"
    if index.layout == "per-family":
        setup = ROCM_SETUP.format(version=version, families=index.families, default=index.families[0], split=())
    else:
        setup = ROCM_SETUP.format(version=version, families=ALL_ISAS, default="gfx1151", split=ALL_ISAS)
    files = {
        f"{top}/PKG-INFO": f"Metadata-Version: 2.1\nName: rocm\nVersion: {version}\n".encode(),
        f"{top}/pyproject.toml": BUILD_SYSTEM,
        f"{top}/setup.py": setup.encode(),
        f"{top}/src/rocm_sdk/__init__.py": ROCM_SDK_INIT.encode(),
        f"{top}/src/rocm_sdk/__main__.py": ROCM_SDK_MAIN.encode(),
        f"{top}/src/rocm_sdk/_devel.py": Path(__file__).with_name("fake_rocm_devel.py").read_bytes(),
        f"{top}/src/rocm_sdk/_dist_info.py": f"__version__ = {version!r}\n".encode(),
    }
    return make_tarball(out / f"{top}.tar.gz", files)


#: What the fixture's torch models of torch's Python package where vLLM's build reads it (the real modules
#: import the whole of torch): torch/cuda/__init__.py ``_is_compiled`` (true when torch._C has
#: ``_cuda_getDeviceCount``, as a HIP build's has), torch/xpu/__init__.py ``_is_compiled`` (false).
TORCH_MODELLED = {
    "torch/cuda/__init__.py": b"import torch\n\n\ndef _is_compiled() -> bool:\n"
    b'    return hasattr(torch._C, "_cuda_getDeviceCount")\n',
    "torch/xpu/__init__.py": b"def _is_compiled() -> bool:\n    return False\n",
    # One header where torch's CMake package names its include directories (TorchConfig.cmake
    # TORCH_INCLUDE_DIRS): CMake refuses an imported target whose include directory does not exist.
    "torch/include/torch/csrc/api/include/torch/version.h": b"#pragma once\n#define TORCH_VERSION_MAJOR 2\n",
}


def _torch_members(version: str, libs: dict[str, Path]) -> Path:
    """The real torch wheel's members for this torch release (``2.13.0+rocm10.0.0`` -> 2.13.0's)."""
    release = version.split("+")[0]
    if f"torch-members-{release}" not in libs:
        raise RuntimeError(f"no real torch {release} wheel pinned: add it to tests/upstream/real_wheels.py TORCH")
    return libs[f"torch-members-{release}"]


def torch_files(versions: Mapping[str, str], libs: dict[str, Path]) -> dict[str, Content]:
    init = (
        "from torch import version\n"
        "from torch import _rocm_init\n"
        "_rocm_init.initialize()\n"
        "from torch._C import _hip_check\n"
        "from torch import cuda, utils, xpu  # torch/__init__.py imports them (vLLM's build reads them)\n"
        f"__version__ = '{versions['torch']}'\n"
    )
    rocm_init = (
        "def initialize():\n"
        "    import rocm_sdk\n"
        "    rocm_sdk.initialize_process(\n"
        f"        preload_shortnames=['amd_comgr', 'amdhip64'], check_version='{versions['rocm']}')\n"
    )
    return {
        "torch/__init__.py": init.encode(),
        "torch/_rocm_init.py": rocm_init.encode(),
        f"torch/{libs['torch_C'].name}": libs["torch_C"],
        "torch/version.py": f"__version__ = '{versions['torch']}'\nhip = '{versions['rocm']}'\ncuda = None\n".encode(),
        "torch/lib/libc10.so": libs["c10"],
        "torch/lib/libtorch_hip.so": libs["torch_hip"],
        **{
            f"torch/lib/{name}": libs[name]
            for name in torch_cmake.LIBRARIES
            if name not in ("libc10.so", "libtorch_hip.so")
        },
        # torch/utils/__init__.py's own line: where find_package(Torch) looks (vLLM's CMakeLists.txt asks it)
        "torch/utils/__init__.py": b"import os.path as _osp\n\ncmake_prefix_path = _osp.join(_osp.dirname(_osp.dirname(__file__)), 'share', 'cmake')\n",
        **torch_cmake.rocm_configured(_torch_members(versions["torch"], libs)),
        **TORCH_MODELLED,
    }


# The fake SDK's compiler: the clang inside the real ziglang wheel (LLVM 22; TheRock builds its own clang
# from AMD's LLVM fork, the ROCm/TheRock submodule compiler/amd-llvm), behind a wrapper that behaves as TheRock's clang
# does where a build depends on it (see compiler_wrapper). By the name it stands in for, the driver mode.
DRIVER_MODES = {"clang": "gcc", "clang++": "g++", "amdclang": "gcc", "amdclang++": "g++"}
#: What zig does not ship and clang's HIP toolchain runs: Debian's clang-offload-bundler (.ci/run installs
#: clang-tools-19), which writes the .hip_fatbin clang asks for; its format is the same across versions.
OFFLOAD_BUNDLER = Path("/usr/lib/llvm-19/bin/clang-offload-bundler")
#: Where the fixture's builder images carry the SDK compiler's own files (tests/upstream/builders.py), which
#: the wrappers look in first: TheRock's clang carries them inside its wheel, and the fake's cannot (zig is
#: 185 MB, and every bundle of the suite would carry it).
IMAGE_TOOLCHAIN = "/opt/vllm-bundle-tests/sdk-clang"
# clang's AMDGPU toolchain links device code with `lld -flavor gnu ...`: zig's own lld, as ld.lld.
LLD_SHIM = """#!/bin/sh
[ "$1" = -flavor ] && shift 2
exec "${0%/bin/*}/ziglang/zig" ld.lld "$@"
"""
# Debian's bundler, run by its own dynamic loader with the libraries it loads beside it: the same program in
# any root file system (this machine's, a builder image's), whatever libraries that one has. It looks for
# llvm-objcopy (beside itself, then on PATH) before it bundles object files (clang/lib/Driver/OffloadBundler.cpp
# ObjectFileHandler), and finds zig's, the one of the shim below.
BUNDLER_SHIM = """#!/bin/sh
here=${0%/bin/*}/bundler
PATH=${0%/*}:$PATH exec "$here/lib/ld-linux-x86-64.so.2" --library-path "$here/lib" "$here/clang-offload-bundler" "$@"
"""
OBJCOPY_SHIM = """#!/bin/sh
exec "${0%/bin/*}/ziglang/zig" objcopy "$@"
"""
COMPILER_WRAPPER = """#!/bin/sh
# Stands in for TheRock's lib/llvm/bin/@NAME@ (rocm-sdk-core) with the real ziglang wheel's clang (LLVM 22),
# which reads the configuration file beside it as TheRock's clang does (@CFG@ -> @rocm.cfg: its ROCm root,
# RUNPATH dtags and -frtlib-add-rpath; ROCm/TheRock@89553ce base/aux-overlay/CMakeLists.txt:106-126).
# Its ROCm root is three levels above where it really is: /proc/self/exe resolves a symlink but not a
# hard link (TheRock lib/llvm/bin/rocm.cfg: --rocm-path='<CFGDIR>/../../..').
self=$(realpath -- "$0")
here=$(dirname -- "$self")
root=$(cd -- "$here/../../.." && pwd)
toolchain=@IMAGE_TOOLCHAIN@
[ -x "$toolchain/ziglang/zig" ] || toolchain=@TOOLCHAIN@
for arg in "$@"; do
    [ "$arg" = -v ] && [ -f "$root/include/hip/hip_runtime.h" ] && echo "Found HIP installation: $root, version @VERSION@" >&2
done
@PARSE@
@STAND_IN@
set -- --no-default-config "--config=$here/@CFG@" "$@"
if [ -n "$hip" ]; then
    if [ ! -f "${HIP_DEVICE_LIB_PATH:-$root/amdgcn/bitcode}/ocml.bc" ]; then
        echo "clang: error: cannot find ROCm device library; provide its path via '--rocm-path' or '--rocm-device-lib-path', or pass '-nogpulib' to build without ROCm device library" >&2
        exit 1
    fi
    if [ ! -f "$root/include/hip/hip_runtime.h" ]; then
        echo "clang: error: cannot find HIP runtime; provide its path via '--rocm-path', or pass '-nogpuinc' to build without HIP runtime" >&2
        exit 1
    fi
    exec @HOST@ -nogpulib -nogpuinc -isystem "$root/include" "$@"
fi
exec @HOST@ "$@"
"""
#: TheRock's rocm.cfg, byte for byte (ROCm/TheRock@89553ce base/aux-overlay/CMakeLists.txt:110, written
#: with no newline at its end): link-only ($) RUNPATH dtags, the ROCm root relative to the file, and
#: -frtlib-add-rpath, with which clang adds ``-rpath <ROCm root>/lib`` to a link with --hip-link
#: (clang/lib/Driver/ToolChains/Linux.cpp AddHIPRuntimeLibArgs). The driver configurations beside it include
#: it (lines 111-126): clang.cfg, clang++.cfg, clang-<major>.cfg and the others, each ``@rocm.cfg``.
ROCM_CFG = b"$-Wl,--enable-new-dtags\n--rocm-path='<CFGDIR>/../../..'\n-frtlib-add-rpath"
DRIVER_CONFIGS = ("clang.cfg", "clang++.cfg", "clang-20.cfg", "clang-cl.cfg", "clang-cpp.cfg", "flang.cfg")
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
    """Debian's clang-19 driver ``name`` (``clang`` or ``clang++``): a second real compiler, whose code
    objects and compressed offload bundles tier 0's reader is tested on (test_offload.py)."""
    found = shutil.which(f"{name}-19")
    if found is None:
        raise RuntimeError(f"the tests need Debian's {name}-19 (apt-get install clang-19 lld-19; .ci/run does)")
    return found


def sdk_toolchain(ziglang_wheel: Path, work: Path) -> Path:
    """The fake SDK compiler's own files under ``work/sdk-clang``, a directory that works wherever it is
    copied: ``zig`` and clang's resource headers (``lib/include``) from the real ziglang wheel, and ``bin/``
    with what clang's HIP toolchain runs beside itself (``lld``, ``clang-offload-bundler``: Debian's, with the
    libraries it loads in ``bundler/``; the ``llvm-objcopy`` it looks for: zig's). ``zig cc`` refuses GPU targets; ``zig clang`` is clang's own driver
    (tests/code_objects.py)."""
    if not OFFLOAD_BUNDLER.is_file():
        raise RuntimeError(
            f"the fake ROCm SDK's compiler needs Debian's {OFFLOAD_BUNDLER} "
            "(apt-get install clang-tools-19; .ci/run does)"
        )
    home = work / "sdk-clang"
    with zipfile.ZipFile(ziglang_wheel) as wheel:
        members = [m for m in wheel.namelist() if m == "ziglang/zig" or m.startswith("ziglang/lib/include/")]
        wheel.extractall(home, members)
    (home / "ziglang" / "zig").chmod(0o755)
    bundler = home / "bundler"
    (bundler / "lib").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(OFFLOAD_BUNDLER, bundler / "clang-offload-bundler")
    (bundler / "clang-offload-bundler").chmod(0o755)
    for name, path in loaded_libraries(OFFLOAD_BUNDLER).items():
        shutil.copyfile(path, bundler / "lib" / name)
        (bundler / "lib" / name).chmod(0o755)  # the loader is run as a program
    tools = home / "bin"
    tools.mkdir(exist_ok=True)
    for name, text in (("lld", LLD_SHIM), ("clang-offload-bundler", BUNDLER_SHIM), ("llvm-objcopy", OBJCOPY_SHIM)):
        (tools / name).unlink(missing_ok=True)
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    return home


def loaded_libraries(program: Path) -> dict[str, Path]:
    """Each library the dynamic loader loads for ``program``, the loader itself too: the name it is asked
    for (``libLLVM.so.19.1``, ``ld-linux-x86-64.so.2``) -> the file it resolves to here (ldd's answer)."""
    result = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True)
    found = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) > 2 and parts[2].startswith("/"):
            found[parts[0]] = Path(parts[2]).resolve()
        elif parts and parts[0].startswith("/") and "ld-linux" in parts[0]:
            found[Path(parts[0]).name] = Path(parts[0]).resolve()
    return found


def sdk_clang(toolchain: str, name: str) -> list[str]:
    """The command the fake SDK's ``name`` (clang, clang++, amdclang, amdclang++) runs: zig's clang in the
    driver mode of that name, for TheRock's host triple, with its tools and headers (``toolchain``: the
    directory sdk_toolchain made, or a shell word that expands to it)."""
    return [
        f"{toolchain}/ziglang/zig",
        "clang",
        f"--driver-mode={DRIVER_MODES[name]}",
        "--target=x86_64-unknown-linux-gnu",  # zig's clang would take musl for the host
        *("-B", f"{toolchain}/bin"),
        *("-resource-dir", f"{toolchain}/ziglang/lib"),
    ]


def compiler_wrapper(name: str, version: str, toolchain: Path) -> bytes:
    """``_rocm_sdk_core/lib/llvm/bin/<name>``. Like TheRock's clang it reads the driver configuration beside
    it (clang++.cfg for a g++-mode driver, clang.cfg for a gcc-mode one: clang looks for the configuration of
    its driver mode, clang/lib/Driver/Driver.cpp loadDefaultConfigFiles), needs the device libraries
    ($HIP_DEVICE_LIB_PATH, else <root>/amdgcn/bitcode, which only the devel tree has) and the HIP headers
    of its ROCm root, failing with clang's own messages, and its ``-v`` names that root ("Found HIP
    installation: <root>, version <v>", llvm-project clang/lib/Driver/ToolChains/AMDGPU.cpp
    RocmInstallationDetector), which CMake reads (Modules/CMakeDetermineHIPCompiler.cmake)."""
    config = "clang++.cfg" if DRIVER_MODES[name] == "g++" else "clang.cfg"
    values = {
        "@NAME@": name,
        "@CFG@": config,
        "@VERSION@": version,
        "@PARSE@": PARSE_ARGUMENTS.strip(),
        "@STAND_IN@": STAND_IN_UNIT.strip(),
        "@HOST@": " ".join(
            shlex.quote(w) if "$toolchain" not in w else f'"{w}"' for w in sdk_clang("$toolchain", name)
        ),
        "@IMAGE_TOOLCHAIN@": shlex.quote(IMAGE_TOOLCHAIN),
        "@TOOLCHAIN@": shlex.quote(str(toolchain)),
    }
    text = COMPILER_WRAPPER
    for token, value in values.items():
        text = text.replace(token, value)
    return text.encode()


#: The ELF files of the fixture (fixture._elf_chain) that stand for a ROCm library, by soname; every other
#: library rocm_cmake names is a stub under its own soname.
LIBRARY_KEYS = {"libamdhip64.so.7": "hip", "libamd_comgr.so.3": "comgr", "librocblas.so.5": "rocblas"}


def runtime_libraries(home: str, libs: dict[str, Path], platform: str = "") -> dict[str, Path]:
    """``<platform>/lib/<soname>`` -> ELF file, for the libraries rocm_cmake puts in ``home``'s wheel, whose
    platform directory is ``platform`` (default: ``home``)."""
    return {f"{platform or home}/lib/{so}": libs[LIBRARY_KEYS.get(so, so)] for so in rocm_cmake.runtime_libraries(home)}


def libraries_package(index: IndexFacts) -> str:
    """The platform directory of the SDK's math libraries: ``_rocm_sdk_libraries``, or on a per-family
    index ``_rocm_sdk_libraries_<family>`` with ``-`` as ``_`` (facts.toml, rocm-sdk-libraries-{family})."""
    if index.layout != "per-family":
        return rocm_cmake.LIBRARIES
    return f"{rocm_cmake.LIBRARIES}_{index.families[0].replace('-', '_')}"


def core_files(version: str, libs: dict[str, Path], isas: tuple[str, ...] = ALL_ISAS) -> dict[str, bytes | Path]:
    files: dict[str, bytes | Path] = {
        "_rocm_sdk_core/__init__.py": b"",
        **runtime_libraries(rocm_cmake.CORE, libs),
        "_rocm_sdk_core/lib/llvm/bin/clang-20": libs["clang"],
        "_rocm_sdk_core/lib/llvm/lib/libomp.so": libs["omp"],
        "_rocm_sdk_core/lib/llvm/bin/rocm.cfg": ROCM_CFG,
        **{f"_rocm_sdk_core/lib/llvm/bin/{name}": b"@rocm.cfg\n" for name in DRIVER_CONFIGS},
        "_rocm_sdk_core/lib/llvm/amdgcn/bitcode/ocml.bc": b"BC\xc0\xde fixture device library\n",
        "_rocm_sdk_core/include/hip/hip_runtime.h": HIP_RUNTIME_H,
        "_rocm_sdk_core/share/amd_smi/amdsmi/__init__.py": AMDSMI_STUB,
        "_rocm_sdk_core/share/therock/dist_info.json": json.dumps({"dist_amdgpu_targets": ";".join(isas)}).encode(),
    }
    for name in DRIVER_MODES:
        files[f"_rocm_sdk_core/lib/llvm/bin/{name}"] = compiler_wrapper(name, version, libs["sdk-clang"])
    return files


def devel_tarball(core: dict[str, bytes | Path], libraries: list[str], out: Path, version: str) -> Path:
    """``rocm_sdk_devel/_devel.tar`` (uncompressed, as TheRock's CI publishes it): ``_rocm_sdk_devel/``
    with each file of core and of rocm-sdk-libraries (``libraries``: its paths) as a relative symlink
    into that wheel's platform directory, every library's soname alias, the top-level ``bin/amdclang*``
    links, the ``llvm`` and ``amdgcn`` directory links, and the CMake packages and headers only the devel
    tree has (rocm_cmake.py; ROCm/TheRock build_tools/_therock_utils/py_packaging.py:702-741)."""
    top = "_rocm_sdk_devel"
    devel_only = rocm_cmake.devel_cmake_files(version)
    files: dict[str, bytes | Path] = {f"{top}/__init__.py": b"", **{f"{top}/{k}": v for k, v in devel_only.items()}}
    symlinks = {f"{top}/llvm": "lib/llvm", f"{top}/amdgcn": "lib/llvm/amdgcn"}
    for home in (rocm_cmake.CORE, rocm_cmake.LIBRARIES):
        for soname in rocm_cmake.runtime_libraries(home):
            symlinks[f"{top}/lib/{rocm_cmake.soname_alias(soname)}"] = soname
    for name in [*core, *libraries]:
        relative = name.split("/", 1)[1]
        if relative in ("__init__.py",) or relative.startswith("share/"):
            continue
        link = f"{top}/{relative}"
        symlinks[link] = os.path.relpath(name, os.path.dirname(link))
    for name in ("amdclang", "amdclang++"):
        symlinks[f"{top}/bin/{name}"] = f"../lib/llvm/bin/{name}"
    return make_tarball(out / "_devel.tar", files, symlinks=symlinks, compressed=False)


def device_link_manifest(isa: str, version: str) -> bytes:
    """``_rocm_sdk_libraries/.devel_links/<isa>.json``: what ``rocm-sdk init`` links into the devel tree."""
    kpack = f".kpack/blas_lib_{isa}.kpack"
    links = [{"relpath": kpack, "target": f"../../_rocm_sdk_libraries/{kpack}"}]
    return json.dumps({"version": version, "links": links}).encode()


def device_extras(prefix: str, version: str, index: IndexFacts) -> list[str]:
    lines, everything = [], set()
    for isa in ALL_ISAS:
        for name in index.device_packages(prefix, isa):
            lines.append(f'{name}=={version}; extra == "device-{isa}"')
            everything.add(name)
    lines += [f'{name}=={version}; extra == "device-all"' for name in sorted(everything)]
    return lines


def _stub(path: str) -> bytes:
    """A file a fact names that the builder has no content for: empty for Python packages' markers (they
    must be identical wherever several wheels ship one), else bytes naming the file."""
    return b"" if path.endswith("__init__.py") else f"{path}\n".encode()


def _per_family_sdk(name: str, rocm: str, libs: dict[str, Path], work: Path, index: IndexFacts) -> dict[str, Content]:
    """A per-family index's SDK wheels: core as everywhere, and the math libraries in the family's own
    platform directory, where the family's devel tarball links ("each wheel is NOT generic": ROCm/TheRock@89553ce
    build_tools/build_python_packages.py:459-466)."""
    family = index.families[0]
    platform = libraries_package(index)
    core = core_files(rocm, libs, FAMILY_ISAS[family])
    if name == "rocm-sdk-core":
        return core
    if name == "rocm-sdk-devel":
        libraries = list(runtime_libraries(rocm_cmake.LIBRARIES, libs, platform))
        return {
            "rocm_sdk_devel/__init__.py": b"from ._dist_info import __version__\n",
            "rocm_sdk_devel/_dist_info.py": f"__version__ = {rocm!r}\n".encode(),
            "rocm_sdk_devel/_devel.tar": devel_tarball(core, libraries, work / f"devel-{rocm}-{family}", rocm),
        }
    return {  # rocm-sdk-libraries-<family>
        f"rocm_sdk_libraries_{family}/__init__.py": f"__version__ = {rocm!r}\n".encode(),
        **runtime_libraries(rocm_cmake.LIBRARIES, libs, platform),
    }


def _built_contents(
    name: str, values: Mapping[str, str], libs: dict[str, Path], work: Path, index: IndexFacts
) -> dict[str, Content]:
    """The content the builder makes for a project, beyond the stubs its facts ask for. A per-family index
    builds its wheels without TheRock's kpack split: the family's device code stays in the fat binaries of
    the SDK's libraries and of torch's (``<key>@<family>``: fixture._family_device_code)."""
    rocm = values["rocm"]
    if index.layout == "per-family":
        family = index.families[0]
        libs = {**libs, **{key: libs[f"{key}@{family}"] for key in FAMILY_DEVICE_LIBRARIES}}
        if name in ("rocm-sdk-core", "rocm-sdk-devel", f"rocm-sdk-libraries-{family}"):
            return _per_family_sdk(name, rocm, libs, work, index)
    if name == "rocm-sdk-core":
        return core_files(rocm, libs)
    if name == "rocm-sdk-libraries":
        return {
            "rocm_sdk_libraries/__init__.py": f"__version__ = {rocm!r}\n".encode(),
            **runtime_libraries(rocm_cmake.LIBRARIES, libs),
        }
    if name == "rocm-sdk-devel":
        libraries = list(runtime_libraries(rocm_cmake.LIBRARIES, libs))
        return {
            "rocm_sdk_devel/__init__.py": b"from ._dist_info import __version__\n",
            "rocm_sdk_devel/_dist_info.py": f"__version__ = {rocm!r}\n".encode(),
            "rocm_sdk_devel/_devel.tar": devel_tarball(core_files(rocm, libs), libraries, work / f"devel-{rocm}", rocm),
        }
    if name.startswith("rocm-sdk-device-"):
        isa = values["isa"]
        return {f"_rocm_sdk_libraries/.devel_links/{isa}.json": device_link_manifest(isa, rocm)}
    if name == "torch":
        return torch_files(values, libs)
    if name == "torchvision":
        return {
            "torchvision/__init__.py": f"__version__ = {values['torchvision']!r}\n".encode(),
            "torchvision/_C.so": libs["vision"],
        }
    if name == "triton":  # with the real AMD backend's C source and headers (real_wheels.py)
        amd = libs["triton-amd"]
        real = {f"triton/backends/amd/{p.relative_to(amd)}": p for p in sorted(amd.rglob("*")) if p.is_file()}
        return {
            "triton/__init__.py": b"__version__ = '3.7.1'\n",
            "triton/_C/libtriton.so": libs["triton"],
            "triton/language/__init__.py": b"",
            "triton/language/target_info.py": TRITON_TARGET_INFO,
            **real,
        }
    return {}


def project_artifacts(
    files: Path, project: ProjectFacts, index: IndexFacts, libs: dict[str, Path], cp: str, rocm: str = ""
) -> list[Path]:
    """Every file of one project (template) on one index (``rocm``: another SDK release than the index's)."""
    artifacts = []
    for extra in project.instances(ALL_ISAS, index):
        values = {**index.versions, "cp": cp, **extra, **({"rocm": rocm} if rocm else {})}
        name, version = project.name.format_map(values), project.version.format_map(values)
        if project.kind == "sdist":
            artifacts.append(rocm_sdist(files, version, index))
            continue
        contents = _built_contents(name, values, libs, files.parent / "_work", index)
        for path in project.files:
            contents.setdefault(path.format_map(values), _stub(path.format_map(values)))
        if not contents:  # a mirrored PyPI package
            contents[f"{name.replace('-', '_')}/__init__.py"] = b""
        requires = project.requirements(values, index)
        if project.device_packages:
            requires += device_extras(project.device_packages, version, index)
        executables = tuple(path for path in contents if "/llvm/bin/" in path)
        artifacts.append(
            make_wheel(
                files, name, version, project.tag.format_map(values), contents, tuple(requires), executables=executables
            )
        )
    return artifacts


def is_sdk(project: ProjectFacts) -> bool:
    return project.owner == "core" and (project.name == "rocm" or project.name.startswith("rocm-sdk-"))


def stream_artifacts(files: Path, index: IndexFacts, libs: dict[str, Path], cp: str) -> dict[str, list[Path]]:
    """Every file one TheRock index serves, by the product that publishes it: its release, and the SDK of
    its SDK-only releases. A per-family index's files are under ``files/<family>/``: each family's index
    serves its own torch, rocm sdist and SDK core and devel wheels under the same file names as every other
    family's: their versions name the SDK, not the family (ROCm/TheRock@89553ce external-builds/pytorch/
    build_prod_wheels.py:286-296, torch's ``+rocm<sdk version>``; docs/packaging/legacy_per_family_releases.md:
    the same versions from each family's index)."""
    if index.layout == "per-family":
        files = files / index.families[0]
    by_owner: dict[str, list[Path]] = {}
    for project in FACTS.therock:
        if not index.serves(project):
            continue
        releases = ["", *(index.sdk_only if is_sdk(project) else ())]
        for rocm in releases:
            by_owner.setdefault(project.owner, []).extend(project_artifacts(files, project, index, libs, cp, rocm))
    return by_owner


def hashless(filename: str, index: IndexFacts) -> bool:
    """Whether the index page of this file gives no #sha256 (manage.py: some; manage_structured.py: none)."""
    if index.sha256_fragments == "never":
        return True
    if index.sha256_fragments == "always":
        return False
    return filename.startswith(("rocm-", "rocm_sdk_libraries", "rocm_sdk_device", "amd_torch_device", "triton"))
