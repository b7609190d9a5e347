"""Builds a small upstream in the real names and layouts, to be served by ``server.UpstreamServer``.

Served tree::

    releases/cpython-<ver>+<date>-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz, SHA256SUMS
    releases/triton-<commit>.tar.gz               ROCm/triton's source as codeload serves it (triton_kernels)
    files/<every wheel and sdist>
    therock/stable/whl-next/<project>/index.html  TheRock's stable and nightly aggregate indexes (PEP 503,
    therock/nightly/whl-next/<project>/...         no #sha256), and the product-local ones they route to
    therock/<stream>/{core,pytorch}/whl-next/...   (therock.py, facts.toml)
    therock/whl-multi-arch/<project>/index.html   the frozen 7.14 index (#sha256 only sometimes)
    therock/v2/<family>/<project>/index.html      the frozen per-family nightly indexes
    pypi/simple/<project>/index.json, index.html  PyPI (PEP 691 + 503: hashes, sizes, upload times), with its
                                                  placeholders under TheRock's names and a pre-release
    mirror/<every file>                           a flat mirror (what --mirror serves)

TheRock-shaped wheels carry real ELF libraries with DT_NEEDED chains between packages and hidden
``.kpack`` device-code files; PyPI-shaped ones need system libraries, some allowed (libz) and some
the bundle never has (pypi.py). The python-build-standalone-shaped tarball has one ``python/`` top
directory whose build files still name the ``/install`` prefix, and its ``lib/libpython3.so`` names
its library through ``$ORIGIN``, as upstream's do. The vLLM source release is PyPI's real 0.33.0 with its
build system as it is and stand-ins for its run-time package (vllm_release.py): every test bundle's vLLM
is built by its own setup.py and CMake, whose compiler, the fake SDK's, is the real ziglang wheel's clang
(LLVM 22) compiling a stand-in kernel per unit for each ISA (therock.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import html
import json
import os
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

from filelock import FileLock
from packaging.utils import canonicalize_name

from vllm_bundle.inputs.facts import IndexFacts
from vllm_bundle.inputs.triton_kernels import triton_commit
from vllm_bundle.util.elf import dynamic_info, patchelf_bin, set_runpath
from vllm_bundle.util.offload import SECTION

from ..code_objects import compile_code_objects, offload_bundle
from . import pypi, therock
from .packaging_fixtures import compile_shared, make_tarball, make_tarball_from_tree, make_wheel
from .real_wheels import RealWheels
from .rocm_cmake import CORE, LIBRARIES, runtime_libraries
from .therock import FACTS, FAMILY_DEVICE_LIBRARIES, FAMILY_ISAS, LIBRARY_KEYS, MULTI_ARCH, NEXT, NIGHTLY, PER_FAMILY
from .torch_cmake import LIBRARIES as TORCH_LIBRARIES
from .vllm_release import TRITON_KERNELS_COMMIT, VERSION, fixture_vllm_sdist

# The bundled CPython of the fixture is this machine's own, repackaged in python-build-standalone's
# layout (tests must be able to run it); its version names the asset.
PYTHON_VERSION = platform.python_version()
PYTHON_MINOR = "{}.{}".format(*sys.version_info[:2])
PYTHON_RELEASE = "20251120"
PYTHON_TRIPLE = "x86_64-unknown-linux-gnu"
# The suite's default channel is `stable`, as a user's is: TheRock's stable whl-next index.
ROCM_VERSION = NEXT.versions["rocm"]
TORCH_VERSION = NEXT.versions["torch"]
TRITON_VERSION = NEXT.versions["triton"]
TORCHVISION_VERSION = NEXT.versions["torchvision"]
VLLM_VERSION = VERSION
#: What vLLM 0.33.0's setup.py makes of a ROCm build's version (setup.py:651: "rocm" and the SDK's major and
#: minor): 0.33.0+rocm100 for ROCm 10.0.
VLLM_BUILT_VERSION = f"{VERSION}+rocm" + "".join(ROCM_VERSION.split(".")[:2])
CP = "cp{}{}".format(*sys.version_info[:2])
THEROCK_MULTI_ARCH = f"therock/{MULTI_ARCH.name}"
THEROCK_NEXT = f"therock/{NEXT.name}"
THEROCK_NIGHTLY = f"therock/{NIGHTLY.name}"
THEROCK_PER_FAMILY = f"therock/{PER_FAMILY.name}"  # {family}: one index per family
#: Each served TheRock index directory and its facts (a per-family index: one directory per family).
INDEXES = {
    f"therock/{index.name.format(family=family)}": dataclasses.replace(index, families=(family,))
    if index.layout == "per-family"
    else index
    for index in FACTS.indexes.values()
    for family in (index.families or ("",))
}
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


#: triton_kernels/target_info.py's import of Triton's (triton-lang/triton python/triton_kernels): the names
#: Triton 3.7.1's triton/language/target_info.py defines (PyPI triton-3.7.1 cp312 wheel).
TRITON_KERNELS_TARGET_INFO = (
    b"from triton.language.target_info import (cuda_capability_geq, is_cuda, is_hip, is_hip_cdna3, is_hip_cdna4)\n"
)


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
        """``artifacts`` on ``index``'s pages; those directly under ``files/`` are in the flat mirror too (a
        per-family index's, under ``files/<family>/``, share their names with the other families')."""
        self.indexes.setdefault(index, []).extend(artifacts)
        self.files.update({a.name: a for a in artifacts if a.parent == self.root / "files"})


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


def _family_device_code(libs: dict[str, Path], work: Path) -> dict[str, Path]:
    """``<key>@<family>`` for each library a per-family index's wheels carry their family's device code in
    (therock.FAMILY_DEVICE_LIBRARIES): the fixture's library with a ``.hip_fatbin`` section holding a clang
    offload bundle of real code objects for each ISA of the family, compiled by the SDK's compiler (the
    real ziglang wheel's clang; tests/code_objects.py)."""
    zig = libs["sdk-clang"] / "ziglang" / "zig"
    isas = {isa for family in PER_FAMILY.families for isa in FAMILY_ISAS[family]}
    objects = compile_code_objects(zig, isas, work / "code-objects")
    carrying: dict[str, Path] = {}
    for family in PER_FAMILY.families:
        bundle = work / "code-objects" / f"{family}.hip_fatbin"
        bundle.write_bytes(offload_bundle({isa: objects[isa] for isa in FAMILY_ISAS[family]}))
        for key in FAMILY_DEVICE_LIBRARIES:
            library = work / family / libs[key].name
            library.parent.mkdir(parents=True, exist_ok=True)
            command = ["objcopy", "--add-section", f"{SECTION}={bundle}", str(libs[key]), str(library)]
            subprocess.run(command, check=True, capture_output=True, timeout=60)
            carrying[f"{key}@{family}"] = library
    return libs | carrying


_STDLIB_SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "__pycache__", "lib2to3", "ensurepip"}


def _not_in_install_only(stdlib: Path, directory: str, names: list[str]) -> list[str]:
    """What the fixture leaves out of this machine's standard library: the static ``libpython*.a`` (in
    ``config-3.X-<triple>/``, 45 MB here), as python-build-standalone's install_only archives do ("it
    significantly increases the size of the archive and isn't needed in most cases",
    astral-sh/python-build-standalone src/release.rs ``convert_to_install_only``, which also drops the
    stdlib's test packages: here the top-level ``test``, while the small ones inside other packages stay),
    byte code (its build-cpython.sh removes every ``__pycache__``) and the rest of _STDLIB_SKIP."""
    skipped = _STDLIB_SKIP if Path(directory) == stdlib else {"__pycache__"}
    return [name for name in names if name in skipped or (name.startswith("libpython") and name.endswith(".a"))]


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
        ignore=functools.partial(_not_in_install_only, lib),
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


def _make_python_tarball(fx: Fixture, tarball: Path) -> None:
    work = fx.root / "_work" / "python"
    shutil.rmtree(work, ignore_errors=True)
    _python_tree(work)
    make_tarball_from_tree(tarball, work)
    shutil.rmtree(work)


def _python_tarball(fx: Fixture, cache: Path | None) -> None:
    fx.python_asset = FACTS.cpython.asset_name(PYTHON_VERSION, PYTHON_RELEASE, PYTHON_TRIPLE, "install_only_stripped")
    tarball = fx.releases / fx.python_asset
    if cache is None:
        _make_python_tarball(fx, tarball)
    else:
        # The suite's workers (pytest-xdist) share the cache: one makes the tarball, the others wait for
        # it; it appears under its name only whole (os.replace), so a worker never copies half of one.
        cached = cache / f"{fx.python_asset}.{_builder_digest()}"
        cache.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{cached}.lock"):
            if not cached.exists():
                _make_python_tarball(fx, tarball)
                shutil.copyfile(tarball, f"{cached}.partial")
                os.replace(f"{cached}.partial", cached)
        fx.releases.mkdir(parents=True, exist_ok=True)
        if not tarball.exists():
            shutil.copyfile(cached, tarball)
    other = fx.releases / FACTS.cpython.asset_name(PYTHON_VERSION, PYTHON_RELEASE, PYTHON_TRIPLE, "install_only")
    shutil.copyfile(tarball, other)
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}" for p in sorted([tarball, other])]
    (fx.releases / FACTS.cpython.checksums).write_text("\n".join(sums) + "\n")


def _triton_kernels_archive(releases: Path, commit: str) -> Path:
    """What ``https://codeload.github.com/ROCm/triton/tar.gz/<commit>`` serves (vLLM's
    docker/Dockerfile.rocm:289-299 takes triton_kernels from it): one ``triton-<commit>/`` top directory,
    the Python package under ``python/triton_kernels/triton_kernels``, whose modules import Triton's
    internals (target_info: names Triton 3.7.1's triton.language.target_info has)."""
    top = f"triton-{commit}"
    package = f"{top}/python/triton_kernels/triton_kernels"
    contents = {
        f"{top}/README.md": b"# triton (fixture)\n",
        f"{top}/python/triton_kernels/pyproject.toml": b"[project]\nname = 'triton_kernels'\n",
        f"{package}/__init__.py": b"",
        f"{package}/target_info.py": TRITON_KERNELS_TARGET_INFO,
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
        owners = {owner_index(name, index, p.owner) for p in FACTS.therock} if index.owner_pages else set()
        if where == name or where in owners:
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
        facts = _index_facts(index)  # None: PyPI
        for project, paths in sorted(projects.items()):
            page = base / project
            page.mkdir(parents=True)
            anchors, entries = [], []
            for path in paths:
                sha = hashlib.sha256(path.read_bytes()).hexdigest()
                href = f"{depth}{path.relative_to(fx.root).as_posix()}"
                if facts is None or not therock.hashless(path.name, facts):
                    href += f"#sha256={sha}"
                anchors.append(f'<a href="{html.escape(href)}">{html.escape(path.name)}</a><br/>')
                entries.append(
                    {
                        "filename": path.name,
                        "url": f"{depth}{path.relative_to(fx.root).as_posix()}",
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
    libs["sdk-clang"] = therock.sdk_toolchain(real.ziglang, root / "_work")  # a directory: the SDK's compiler
    libs = _family_device_code(libs, root / "_work" / "families")
    for version, members in real.torch.items():  # directories: members of real torch wheels (torch/...)
        libs[f"torch-members-{version}"] = members
    _python_tarball(fx, cache)
    # vLLM's pin, and the commit whl-multi-arch's Triton names (3.7.1+git0263a6a6.rocm7.14.0)
    for commit in (TRITON_KERNELS_COMMIT, triton_commit(MULTI_ARCH.versions["triton"]) or ""):
        _triton_kernels_archive(fx.releases, commit)
    files = root / "files"
    for where, index in INDEXES.items():
        by_owner = therock.stream_artifacts(files, index, libs, CP)
        fx.serve(where, [path for paths in by_owner.values() for path in paths])
        for owner, paths in by_owner.items():  # whl-next's product-local indexes, which it routes to
            if index.owner_pages:
                fx.serve(owner_index(where, index, owner), paths)
    fx.serve(THEROCK_NEXT, [_prebuilt_vllm(files)])
    served = [*pypi.pypi_artifacts(files, root / "_work" / "pypi", CP), fixture_vllm_sdist(real.vllm_sdist, files)]
    real_files = [real.ziglang, *real.build_tools]
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
        # Written aside and renamed: a worker that finds the name finds the whole file (the fixture's
        # files are shared by the run's workers; under --dist=load one module's tests spread across them).
        partial = path.with_name(f".{name}.{os.getpid()}.tmp")
        partial.write_bytes(b"".join(blocks)[:size])
        os.replace(partial, path)
    return path
