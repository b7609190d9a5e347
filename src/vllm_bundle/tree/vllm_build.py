"""The vLLM wheel stage: vLLM built for the target's GPUs with TheRock's SDK, or a Python-only wheel
when (and only when) that is asked for.

A ROCm build runs in scratch space beside the stage (removed afterwards; never a cached or shipped stage):

    .vllm-wheel.build/site/    the lock's build group (rocm-sdk-devel, cmake, ...) installed with
                               pypa/installer, ``_rocm_sdk_core`` and ``_rocm_sdk_libraries`` linked to
                               the site stage's (the devel tree's files are links into both), and the
                               devel tarball expanded as ``_rocm_sdk_devel`` the way TheRock's ``rocm_sdk``
                               does it (files that are symlinks into core become hard links, so a tool
                               run from the devel tree takes it for its ROCm root) but with this tool's
                               safe extraction, and without touching any other wheel's files
    .vllm-wheel.build/shims/   first on PATH: ``rustc``/``cargo`` that refuse, the HIP compiler launcher
    .vllm-wheel.build/bin/     the build group's console scripts, on PATH after its native programs
                               (NATIVE_PROGRAM_DIRS: the cmake wheel's ``cmake/data/bin``)
    .vllm-wheel.build/triton-kernels/   the locked triton_kernels source (TRITON_KERNELS_SRC_DIR)
    .vllm-wheel.build/src/     a copy of the patched source, torch pins removed, built in place

Every command of the build runs in the builder (tree/builder.py): the pinned builder image, under
bubblewrap, or this machine on request. Host C and C++ are compiled with the builder's GCC, HIP with the
SDK's clang, as TheRock and vLLM's own image do. It uses the site stage's interpreter (torch and the SDK's
core as the bundle has them) with the build group first on ``PYTHONPATH``, never ``rocm-sdk path`` or
``init`` (they expand the devel tarball into the interpreter's own site-packages and append to other wheels'
RECORD files). The environment holds only what this module sets over the builder image's own (no variable
of the machine that runs the tool leaks in), no network (dead proxies, no index, FetchContent
disconnected), no compiler launcher and prefix maps (the same bytes on every builder). What vLLM's build
asks for is checked before it runs (build_requirements.py: its build-system requires; the builder's probe:
GCC with libstdc++'s headers, GNU patch), and the wheel is checked before the stage is stamped: every
extension this vLLM version builds for ROCm, with code objects for every ISA of the target in each HIP
one, and search paths relative to the extension.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uv

from vllm_bundle.errors import BuildError, UnsafeArchiveError
from vllm_bundle.inputs.sdist_requirements import filter_torch_family
from vllm_bundle.inputs.triton_kernels import extract_package
from vllm_bundle.recipes import ExtensionRule, Target
from vllm_bundle.tree.assemble import install_into
from vllm_bundle.tree.build_log import first_error, summary
from vllm_bundle.tree.build_requirements import cmake_programs, require_build_tools
from vllm_bundle.tree.builder import Builder, Tools
from vllm_bundle.tree.relocate import files_mentioning
from vllm_bundle.tree.stage import StageResult, run_stage
from vllm_bundle.tree.vllm_extensions import extension_problems, find_in_wheel
from vllm_bundle.util.elf import dynamic_info
from vllm_bundle.util.extract import safe_extract
from vllm_bundle.util.fetch import require_sha256
from vllm_bundle.util.fsutil import link_or_copy

#: Part of the vllm-wheel stage's key: raised whenever the build itself changes (its environment, CMake's
#: arguments, what goes into scratch), so a stage an older vllm-bundle built is built again. 3: the
#: libraries' link (CMAKE_BUILD_WITH_INSTALL_RPATH), the build group in a Python-only build. 4: in the
#: builder, host C++ with its GCC, no driver-added RUNPATH.
STAGE_VERSION = 4
LOG_TAIL_LINES = 40
#: A vLLM HIP/C++ compile job peaks at roughly 4 GiB of memory; more jobs than memory allows swaps or
#: gets OOM-killed, so MAX_JOBS is the smaller of the cores and the memory in 4 GiB units.
GIB_PER_COMPILE_JOB = 4
CORE, LIBRARIES, DEVEL = "_rocm_sdk_core", "_rocm_sdk_libraries", "_rocm_sdk_devel"
DEVEL_PACKAGE = "rocm_sdk_devel"
#: TheRock's expansion keeps these top-level compiler links as symlinks (rocm_sdk/_devel.py).
PRESERVED_SYMLINKS = ("amdclang", "amdclang++", "amdclang-cl", "amdclang-cpp", "amdflang", "amdlld", "amdllvm")
#: Where nothing listens: every HTTP(S)-speaking tool of the build (pip, git, curl in CMake, cargo)
#: fails at once instead of reaching out, as Debian's reproducible builds do it.
DEAD_PROXY = "http://127.0.0.1:9"
#: The build never compiles vLLM's Rust frontend (its crates are not locked inputs): setup.py skips the
#: optional extension when ``rustc -V`` fails, on every builder alike.
REFUSED_TOOLS = ("rustc", "cargo")
REFUSAL = """#!/bin/sh
echo "vllm-bundle: $0 is not available to the vLLM build (its Rust frontend is not built)" >&2
exit 1
"""
#: Where build-group wheels keep native programs that their console scripts only locate and exec: these go
#: on PATH before the scripts. The cmake wheel's ``cmake`` script reads its distribution's RECORD (3,889
#: files, through importlib.metadata) to find ``cmake/data/bin/cmake``, 0.3 s a run, and vLLM's setup.py
#: runs cmake once per extension to install it, 11 runs a build; the program that runs is the same.
NATIVE_PROGRAM_DIRS = ("cmake/data/bin",)
#: A prefix nothing on a builder is under: what every build path is mapped to in the native code.
MAPPED_PREFIX = "/vllm-bundle-build"
#: The HIP compiler launcher (where setup.py would put ccache): clang names each translation unit's
#: device-side globals by a compilation-unit ID, by default a hash of the source's absolute path and the
#: whole command line (prefix maps included), so the same source built in another directory gave other
#: bytes; ``-fuse-cuid=none`` is no way out (clang 19 then defines ``__hip_cuid_`` in every object, and a
#: library of two fails to link). This launcher gives each unit ``-cuid=`` a hash of its path inside the
#: build directory: unique per unit, the same on every builder.
HIP_LAUNCHER = "vllm-bundle-hip-cuid"
HIP_LAUNCHER_SCRIPT = """#!/bin/sh
# vllm-bundle's CMAKE_HIP_COMPILER_LAUNCHER: adds -cuid=<hash of the source's path in the build directory>.
src= prev=
for arg in "$@"; do
    [ "$prev" = "-c" ] && src=$arg
    prev=$arg
done
[ -n "$src" ] || exec "$@"
for root in "$VLLM_BUNDLE_BUILD_ROOT" "$VLLM_BUNDLE_BUILD_ROOT_REAL"; do
    case $src in "$root"/*) src=${src#"$root"/} ;; esac
done
cuid=$(printf '%s' "$src" | sha256sum | cut -c1-16)
exec "$@" "-cuid=$cuid"
"""


def max_jobs() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return cores
    return max(1, min(cores, int(memory_gib // GIB_PER_COMPILE_JOB)))


@dataclass(frozen=True)
class RocmInputs:
    """What a ROCm build needs beyond the patched source and its build tools: the triton_kernels archive
    with its sha256, the build type and which extensions must carry which code."""

    triton_kernels: tuple[Path, str, str] | None  # (archive, sha256, file name)
    triton_kernels_package: str
    cmake_build_type: str
    extensions: ExtensionRule


@dataclass(frozen=True)
class WheelBuild:
    """One wheel build: the interpreter, the source date, the ROCm inputs (None: Python-only), and the
    lock's build group (wheel file -> sha256) installed into scratch for it, with the site stage's
    site-packages it is checked against; ``builder``: where its commands run (default: this machine).
    vLLM's setup.py imports setuptools-scm and setuptools-rust whatever the device, so a Python-only build
    takes the build group too (without the SDK's devel part). A standalone Python-only build with an
    interpreter of the user's has neither."""

    python: Path
    source_date: int
    rocm: RocmInputs | None
    build_wheels: Mapping[Path, str] = field(default_factory=dict)
    site_packages: Path | None = None
    builder: Builder = field(default_factory=Builder)


# -- the SDK's devel tree in scratch --------------------------------------------------------------------


def install_build_group(wheels: Mapping[Path, str], site: Path, bin_dir: Path, python: Path) -> None:
    """The build group's wheels into scratch, their scripts run by the site stage's interpreter."""
    for wheel, sha256 in sorted(wheels.items()):
        require_sha256(wheel, sha256, wheel.name)
    scheme = {"purelib": str(site), "platlib": str(site), "headers": str(site.parent / "include")}
    install_into({**scheme, "scripts": str(bin_dir), "data": str(site.parent / "data")}, str(python), sorted(wheels))


def expand_devel(site: Path, core: Path) -> Path:
    """Expand ``rocm_sdk_devel/_devel.tar(.xz)`` in ``site`` as ``_rocm_sdk_devel``, beside links to the
    site stage's ``core`` and its math libraries' platform directory: ``_rocm_sdk_libraries``, or a
    per-family SDK's ``_rocm_sdk_libraries_<family>`` (ROCm/TheRock build_tools/build_python_packages.py:
    459-466: a family's devel tarball links into that family's); returns the devel root. TheRock's devel
    tarball holds every file a runtime wheel already has as a relative link into that wheel's directory
    (ROCm/TheRock build_tools/_therock_utils/py_packaging.py ``_populate_devel_file``): the math libraries
    that torch's CMake config finds (rocblas, MIOpen, ...) are in rocm-sdk-libraries, so without that link
    every one of them is a link to nothing, and CMake's configure stops at the first ("The imported target
    roc::rocblas references the file ... but this file
    does not exist")."""
    package = site / DEVEL_PACKAGE
    tarball = next((package / n for n in ("_devel.tar.xz", "_devel.tar") if (package / n).is_file()), None)
    if tarball is None:
        raise BuildError(
            "the ROCm SDK's devel part is missing: no rocm_sdk_devel/_devel.tar in the lock's build group",
            "re-lock; the channel's sdk-build-wheels must name rocm-sdk-devel",
        )
    core = core.absolute()  # a link's text is read from where the link lies: never a path relative to here
    (site / CORE).symlink_to(core, target_is_directory=True)
    for libraries in sorted(core.parent.glob(f"{LIBRARIES}*")):
        if libraries.is_dir():
            (site / libraries.name).symlink_to(libraries, target_is_directory=True)

    def inside_devel(name: str, member: tarfile.TarInfo) -> bool:
        if name != DEVEL and not name.startswith(f"{DEVEL}/"):
            raise UnsafeArchiveError(f"refusing to extract {tarball.name}: entry {name!r} is outside {DEVEL}/")
        return True

    try:
        with tarfile.open(tarball) as archive:
            safe_extract(archive, site, f"rocm-sdk-devel's {tarball.name}", select=inside_devel)
    except tarfile.TarError as err:
        raise UnsafeArchiveError(f"cannot read rocm-sdk-devel's {tarball.name}: {err}", "re-fetch it") from None
    root = site / DEVEL
    compilers(root)  # the more telling error first, when it is the compiler that is missing
    _require_no_dangling_links(root, site)
    _hard_link_file_symlinks(root)
    return root


def _require_no_dangling_links(root: Path, site: Path) -> None:
    """Every link of the devel tree must lead to a file or folder: one that does not names a runtime wheel
    the site stage lacks, and CMake would stop much later on the first package that names it."""
    dangling = sorted(p for p in root.rglob("*") if p.is_symlink() and not p.exists())
    if not dangling:
        return
    # The first link that leaves the devel tree names the missing wheel directory (an alias beside it,
    # libfoo.so -> libfoo.so.1, dangles only because of it).
    first = min(dangling, key=lambda p: ("/" not in str(p.readlink()), p))
    target = first.resolve()  # strict=False: as far as the links lead
    if not target.is_relative_to(site.resolve()):
        missing = f"{target} does not exist"
    else:
        wheel_dir, *rest = target.relative_to(site.resolve()).parts
        missing = (
            f"{'/'.join(rest)} is not in the site stage's {wheel_dir}"
            if (site / wheel_dir).exists()
            else f"{wheel_dir} is not in the site stage"
        )
    raise BuildError(
        f"the ROCm SDK's devel tree has {len(dangling)} link(s) to nothing, e.g. "
        f"{first.relative_to(root.parent)} -> {first.readlink()} ({missing})",
        "the lock's rocm-sdk-core, rocm-sdk-libraries and rocm-sdk-devel must be one ROCm release, "
        "all three installed; re-lock",
    )


def _hard_link_file_symlinks(root: Path) -> None:
    """As TheRock's expansion does: every symlink to a file becomes a hard link to it, but the top-level
    ``bin/amd*`` compiler links; directory symlinks stay. (A copy where a hard link cannot be made.)"""
    for path in sorted(root.rglob("*")):
        if not path.is_symlink() or not path.is_file():
            continue
        if path.parent == root / "bin" and path.name in PRESERVED_SYMLINKS:
            continue
        target = path.resolve()
        staged = path.with_name(f".{path.name}.link")
        link_or_copy(target, staged)
        staged.replace(path)


def compilers(devel: Path) -> tuple[Path, Path]:
    """The SDK's clang and clang++, run from the devel tree (TheRock's own PyTorch builds use these;
    they are rocm-sdk-core's, linked into the devel tree)."""
    llvm_bin = devel / "lib" / "llvm" / "bin"
    found = llvm_bin / "clang", llvm_bin / "clang++"
    missing = [p for p in found if not p.is_file()]
    if missing:
        raise BuildError(
            f"the ROCm SDK has no compiler: {CORE}/lib/llvm/bin/{missing[0].name} is missing",
            "check that the lock's rocm-sdk-core and rocm-sdk-devel are one ROCm release, the compiler in core",
        )
    return found


def require_core(site_packages: Path) -> Path:
    core = site_packages / CORE
    if not (core / "__init__.py").is_file():
        raise BuildError(
            f"the site stage has no ROCm SDK ({CORE} in {site_packages})", "check the lock's rocm-sdk-core wheel"
        )
    if not (site_packages / "rocm_sdk").is_dir():
        raise BuildError("the site stage has no rocm_sdk (TheRock's rocm package)", "check the lock's rocm sdist")
    return core


# -- the environment ---------------------------------------------------------------------------------


def build_roots(root: Path) -> list[str]:
    """The build directory as the compiler may see it: as given and with its symlinks resolved."""
    return list(dict.fromkeys([str(root.absolute()), str(root.resolve())]))


def prefix_maps(root: Path) -> list[str]:
    """``-ffile-prefix-map`` for the build directory: ``__FILE__``, debug info and macros then name
    ``/vllm-bundle-build/...`` on every builder (shell-quoted: CMake puts flags into commands as text)."""
    return [shlex.quote(f"-ffile-prefix-map={variant}={MAPPED_PREFIX}") for variant in build_roots(root)]


def base_environment(
    scratch: Path, bin_dirs: Sequence[Path], source_date: int, jobs: int, builder: Builder | None = None
) -> dict[str, str]:
    """What every build gets, whatever the device: the builder image's environment, with over it a fresh
    HOME, TMPDIR and byte-code cache in scratch, the tools of ``bin_dirs`` before the builder's own PATH
    (the image's; this machine's only with --no-builder), a fixed locale and time zone, the source date,
    no network."""
    builder = builder or Builder()
    home, tmp = scratch / "home", scratch / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join([*map(str, bin_dirs), *builder.path()])
    env = builder.environment() | {
        "PATH": path,
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "SOURCE_DATE_EPOCH": str(source_date),
        # The build starts the site stage's Python some twenty times, and python-build-standalone's CPython
        # ships no byte code: shared here, each compiles what it imports once per build; never written
        # beside a source (the finished site stage, vLLM's sources), and gone with scratch.
        "PYTHONPYCACHEPREFIX": str(scratch / "pycache"),
        "PYTHONNOUSERSITE": "1",
        "PYTHONHASHSEED": "0",
        "MAX_JOBS": str(jobs),
        "PIP_NO_INDEX": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "CARGO_NET_OFFLINE": "true",
        "HF_HUB_OFFLINE": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "no_proxy": "",
        "NO_PROXY": "",
    }
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = DEAD_PROXY
    return env


#: Link flags of the HIP compiler: TheRock's rocm.cfg, which every clang of the SDK reads, holds
#: ``-frtlib-add-rpath`` (ROCm/TheRock@89553ce base/aux-overlay/CMakeLists.txt:106-126), with which clang adds
#: ``-rpath <ROCm root>/lib`` to a link with ``--hip-link`` (clang/lib/Driver/ToolChains/Linux.cpp
#: AddHIPRuntimeLibArgs), and CMake links every HIP target with it (ROCm/HIP hip-lang-config.cmake.in:104):
#: each extension would carry a RUNPATH into the build's scratch. The command line comes after the
#: configuration file, so this wins; the extensions keep the $ORIGIN-relative RUNPATH CMake gives them.
HIP_LINK_FLAGS = ("-fno-rtlib-add-rpath",)


def rocm_environment(
    target: Target, devel: Path, core: Path, rocm: RocmInputs, kernels: Path | None, root: Path, tools: Tools
) -> dict[str, str]:
    """The variables of a ROCm build (vLLM's docker/Dockerfile.rocm_base names the same for TheRock's
    SDK): the devel tree as ROCm root, the builder's GCC for host C and C++ (``tools``: as its probe found
    them) and the SDK's clang for HIP, the device libraries of core, the target's ISAs, no ccache/sccache but
    the CUID launcher, FetchContent disconnected, and prefix maps."""
    _, clangxx = compilers(devel)
    maps = " ".join(prefix_maps(root))
    roots = build_roots(root)
    env = {
        "VLLM_TARGET_DEVICE": "rocm",
        "PYTORCH_ROCM_ARCH": target.pytorch_rocm_arch,
        "ROCM_PATH": str(devel),
        "ROCM_HOME": str(devel),
        "HIP_PATH": str(devel),
        "HIP_CLANG_PATH": str(clangxx.parent),
        "HIP_DEVICE_LIB_PATH": str(core / "lib" / "llvm" / "amdgcn" / "bitcode"),
        "CC": tools.cc,
        "CXX": tools.cxx,
        "HIPCXX": str(clangxx),
        "CMAKE_PREFIX_PATH": str(devel / "lib" / "cmake"),
        "CMAKE_BUILD_TYPE": rocm.cmake_build_type,
        "CFLAGS": maps,
        "CXXFLAGS": maps,
        "HIPFLAGS": " ".join([maps, *HIP_LINK_FLAGS]),
        "VLLM_BUNDLE_BUILD_ROOT": roots[0],
        "VLLM_BUNDLE_BUILD_ROOT_REAL": roots[-1],
        "VLLM_DISABLE_SCCACHE": "1",
        # setup.py adds ccache as CMAKE_<LANG>_COMPILER_LAUNCHER when found on PATH; CMAKE_ARGS comes last
        # on its command line (split at spaces: the launcher goes by its name on PATH), so these win.
        "CMAKE_ARGS": " ".join(
            [
                "-DCMAKE_C_COMPILER_LAUNCHER=",
                "-DCMAKE_CXX_COMPILER_LAUNCHER=",
                f"-DCMAKE_HIP_COMPILER_LAUNCHER={HIP_LAUNCHER}",
                "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
                # CMake links each extension with the build tree's absolute RPATH (torch's and the SDK's
                # library directories) and rewrites it at install: the GNU build ID, a hash taken at link,
                # then names the build directory. Linking with the install RPATH keeps it the same anywhere.
                "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
            ]
        ),
    }
    if kernels is not None:
        env["TRITON_KERNELS_SRC_DIR"] = str(kernels)
    return env


def write_shims(bin_dir: Path) -> None:
    """The tools the build finds first on PATH: ``rustc``/``cargo`` that refuse, the HIP launcher."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    scripts = {**dict.fromkeys(REFUSED_TOOLS, REFUSAL), HIP_LAUNCHER: HIP_LAUNCHER_SCRIPT}
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)


# -- the build ---------------------------------------------------------------------------------------


#: A command of the build as the builder runs it (Builder.command with the stage's mounts).
InBuilder = Callable[[Sequence[str], Path], list[str]]


def on_this_machine(command: Sequence[str], cwd: Path) -> list[str]:
    return list(command)


def _run(command: Sequence[str], cwd: Path, env: Mapping[str, str], log: Path, run_in: InBuilder) -> int:
    with log.open("a") as handle:
        handle.write(f"\n$ {' '.join(command)}\n")
        handle.flush()
        result = subprocess.run(
            run_in(command, cwd),
            cwd=cwd,
            env=dict(env),
            stdout=handle,
            stderr=subprocess.STDOUT,
            check=False,
            umask=0o022,  # the files the build writes get the same modes on every builder
        )
    return result.returncode


def remove_torch_pins(
    source: Path, python: Path, env: Mapping[str, str], log: Path, run_in: InBuilder = on_this_machine
) -> None:
    """vLLM's own ``tools/use_existing_torch.py`` where the release has it, else the same filter here."""
    script = source / "tools" / "use_existing_torch.py"
    if script.is_file():
        if _run([str(python), str(script)], source, env, log, run_in) != 0:
            raise BuildError(f"vLLM's tools/use_existing_torch.py failed; the log is {log}")
        return
    with log.open("a") as handle:
        for line in filter_torch_family(source):
            handle.write(f">>> removed {line}\n")


def build_wheel(
    source: Path,
    python: Path,
    env: Mapping[str, str],
    scratch: Path,
    wheel_dir: Path,
    log: Path,
    run_in: InBuilder = on_this_machine,
    builder: str = "this machine",
) -> Path:
    """Build the wheel from a copy of ``source`` in ``scratch``, each command run ``run_in`` the builder
    (named ``builder`` in the log); the whole log goes to ``log``."""
    work = scratch / "src"
    shutil.copytree(source, work, symlinks=True)
    shown = {k: v for k, v in sorted(env.items()) if k != "PATH"}
    log.write_text(f"# vLLM wheel build in {builder}\n# PATH={env.get('PATH')}\n# environment: {shown}\n")
    remove_torch_pins(work, python, env, log, run_in)
    # uv (this tool's own, the build extra) drives setuptools in ``python``: no pip needed there, no
    # index, no cache, no uv.toml or [tool.uv] of the builder's or vLLM's.
    command = [uv.find_uv_bin(), "build", "--no-build-isolation", "--no-config", "--offline", "--no-cache"]
    command += ["--wheel", "--python", str(python), "--out-dir", str(wheel_dir), "."]
    returncode = _run(command, work, env, log, run_in)
    wheels = sorted(wheel_dir.glob("vllm-*.whl"))
    if returncode != 0 or len(wheels) != 1:
        text = log.read_text(errors="replace")
        first = first_error(text)
        sys.stderr.write("\n".join(text.splitlines()[-LOG_TAIL_LINES:]) + "\n")
        if first:
            sys.stderr.write("\nThe build's first error:\n" + "\n".join(first) + "\n")
        cause = f": {summary(first)}" if first else ""
        raise BuildError(
            f"the vLLM wheel build failed (VLLM_TARGET_DEVICE={env.get('VLLM_TARGET_DEVICE')}){cause}",
            f"its first error and last {LOG_TAIL_LINES} lines are above; the full log is {log}",
        )
    return wheels[0]


def search_path_problems(extensions: Sequence[Path]) -> list[str]:
    """An extension whose RPATH or RUNPATH has an entry not relative to it (``$ORIGIN``): a path of the
    build machine (a compiler driver's ``-rpath``), which no bundle has where it is installed."""
    problems = []
    for path in extensions:
        info = dynamic_info(path)
        for entry in (*info.rpath, *info.runpath) if info else ():
            if entry and not entry.startswith(("$ORIGIN", "${ORIGIN}")):
                problems.append(f"vllm/{path.name} has a search path of the build machine: {entry}")
    return problems


def check_wheel(
    wheel: Path, version: str, rule: ExtensionRule, target: Target, scratch: Path, root: Path
) -> dict[str, list[str]]:
    """The wheel's extensions and the ISAs each carries; a missing extension or ISA, an extension that
    names the build directory ``root`` (prefix maps that did not apply) or has a search path that is not
    relative to it fails the stage."""
    found = find_in_wheel(wheel, rule, scratch)
    problems, isas = extension_problems(found, rule, target.isas)
    problems += search_path_problems([path for path in found.values() if path is not None])
    named = {path for variant in build_roots(root) for path in files_mentioning(scratch, variant.encode())}
    problems += [
        f"vllm/{p.name} names the build directory {root} (its prefix maps did not apply)" for p in sorted(named)
    ]
    if problems:
        raise BuildError(
            f"the ROCm build of vLLM {version} is not fit for {target.name}: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            "see the build log: an ISA missing from vLLM's HIP_SUPPORTED_ARCHS, a failed HIP compile, or a "
            "compiler or linker flag that did not apply",
        )
    return {name: sorted(found_isas) for name, found_isas in isas.items()}


def build_group_setup(build: WheelBuild, scratch: Path) -> tuple[dict[str, str], list[Path]]:
    """The build group in scratch's site (a Python-only build leaves out the SDK's devel part); returns
    the variables that make the build's Python find it, and its program directories for PATH: its native
    programs' (NATIVE_PROGRAM_DIRS), then its console scripts'."""
    site, bin_dir = scratch / "site", scratch / "bin"
    wheels = build.build_wheels
    if build.rocm is None:
        wheels = {wheel: sha for wheel, sha in wheels.items() if not wheel.name.startswith(f"{DEVEL_PACKAGE}-")}
    install_build_group(wheels, site, bin_dir, build.python)
    native = [site / name for name in NATIVE_PROGRAM_DIRS if (site / name).is_dir()]
    return {"PYTHONPATH": str(site)}, [*native, bin_dir]


def rocm_setup(target: Target, build: WheelBuild, scratch: Path, root: Path, tools: Tools) -> dict[str, str]:
    """The rest of a ROCm build's scratch (its build group installed there first): the devel tree
    expanded beside links to the site stage's SDK, the triton_kernels source; returns the variables."""
    rocm = build.rocm
    if rocm is None or build.site_packages is None:
        raise BuildError("a ROCm build of vLLM needs its ROCm inputs and the site stage", "build it with `bundle`")
    core = require_core(build.site_packages)
    site = scratch / "site"
    devel = expand_devel(site, core)
    kernels = None
    if rocm.triton_kernels is not None:
        archive, sha256, filename = rocm.triton_kernels
        require_sha256(archive, sha256, filename)
        kernels = extract_package(archive, filename, rocm.triton_kernels_package, scratch / "triton-kernels")
    return rocm_environment(target, devel, core, rocm, kernels, root, tools)


def probe_builder(source: Path, build: WheelBuild, work: Path) -> Tools | None:
    """What the build takes from its builder, checked there (tree/builder.py): the host compilers and GNU
    patch for a ROCm build; a Python-only build compiles nothing (None)."""
    if build.rocm is None:
        return None
    try:
        return build.builder.probe(work, needs_patch="patch" in cmake_programs(source))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _mounts(build: WheelBuild) -> list[Path]:
    """What the build reads from this machine besides its scratch: the stage its interpreter is in (the
    site stage: ``bin/python3.X`` beside ``lib/``) and uv, which drives the build."""
    return [build.python.parent.parent, Path(uv.find_uv_bin())]


def run_build(
    target: Target, source: Path, build: WheelBuild, out: Path, log: Path, version: str, tools: Tools | None = None
) -> dict[str, Any]:
    """Build into ``out`` (the stage's temporary directory) in the build's builder; scratch lives beside it
    and is removed. ``tools``: the builder's probe, when the caller has made it."""
    scratch = out.parent / ".vllm-wheel.build"
    shutil.rmtree(scratch, ignore_errors=True)
    tools = tools or probe_builder(source, build, out.parent / ".vllm-wheel.probe")
    scratch.mkdir(parents=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    builder = build.builder

    def run_in(command: Sequence[str], cwd: Path) -> list[str]:
        return builder.command(command, cwd, writable=[scratch, out], readable=_mounts(build))

    try:
        shims = scratch / "shims"
        write_shims(shims)
        env: dict[str, str] = {"VLLM_TARGET_DEVICE": "empty"}
        extra: list[Path] = []
        if build.build_wheels:
            group_env, extra = build_group_setup(build, scratch)
            env |= group_env
        if build.rocm is not None and tools is not None:  # out.parent: the source copy, scratch, the site stage
            env |= rocm_setup(target, build, scratch, out.parent, tools)
        bin_dirs = [shims, *extra, build.python.parent]
        env = {**base_environment(scratch, bin_dirs, build.source_date, max_jobs(), builder), **env}
        if build.site_packages is not None:
            require_build_tools(source, [scratch / "site", build.site_packages])
        wheel = build_wheel(source, build.python, env, scratch, out, log, run_in, builder.describe())
        record = {"builder": builder.record(tools)}
        if build.rocm is None:
            return {"wheel": wheel.name, "device": "python-only"} | record
        isas = check_wheel(wheel, version, build.rocm.extensions, target, scratch / "check", out.parent)
        return {"wheel": wheel.name, "device": "rocm", "isas": list(target.isas), "extensions": isas} | record
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def prebuilt_wheel_stage(wheel: Path, sha256: str, *, out: Path, force: bool = False) -> StageResult:
    """Stage ``vllm-wheel`` in repackage mode: the locked prebuilt wheel, taken as it is."""

    def build(tmp: Path) -> Mapping[str, Any]:
        require_sha256(wheel, sha256, wheel.name)
        name = wheel.name if wheel.name.endswith(".whl") else None
        if name is None:
            raise BuildError(f"the cached vLLM wheel {wheel} has no wheel file name")
        shutil.copyfile(wheel, tmp / name)
        return {"wheel": name, "device": "prebuilt"}

    return run_stage(out, "vllm-wheel", STAGE_VERSION, {"prebuilt": sha256}, build, force=force)


def wheel_stage(
    target: Target,
    source: StageResult,
    version: str,
    build: WheelBuild,
    log: Path,
    python_key: str | None = None,
    *,
    out: Path,
    force: bool = False,
) -> StageResult:
    """Stage ``vllm-wheel``: depends on the patched source, the interpreter (``python_key``: the key of the
    stage that made it, when it is one of ours), the build inputs, the target's ISAs and the builder (the
    image's digest, or this machine's tools, probed first)."""
    rocm = build.rocm
    # This machine's tools are part of the key (a new g++ rebuilds); an image's are its digest's, probed
    # only when the stage runs.
    tools = probe_builder(source.path, build, out.parent / ".vllm-wheel.probe") if build.builder.on_host else None
    inputs: dict[str, Any] = {
        "source": source.key,
        "python": python_key or str(build.python),
        "source_date": build.source_date,
        "device": "rocm" if rocm else "python-only",
        "build_wheels": {path.name: sha for path, sha in sorted(build.build_wheels.items())},
        "builder": build.builder.key(tools),
    }
    if rocm is not None:
        inputs |= {
            "isas": list(target.isas),
            "triton_kernels": rocm.triton_kernels[1] if rocm.triton_kernels else None,
            "triton_kernels_package": rocm.triton_kernels_package,
            "cmake_build_type": rocm.cmake_build_type,
            "extensions": [rocm.extensions.names, rocm.extensions.device_code],
        }
    return run_stage(
        out,
        "vllm-wheel",
        STAGE_VERSION,
        inputs,
        lambda tmp: run_build(target, source.path, build, tmp, log, version, tools),
        force=force,
    )
