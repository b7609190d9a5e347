"""The fake PyPI's ``cmake`` wheel: this file is its ``cmake/__init__.py`` (console script ``cmake =
cmake:cmake``, as PyPI's real wheel has). It runs the subset of CMake that vLLM's ROCm build uses, on the
fixture's vLLM source, with the real compiler behind the fake SDK (Debian's clang-19):

- ``cmake --version``; configure ``cmake <src> [-G Ninja] -D...``; ``cmake --build . -j=N --target=...``;
  ``cmake --install . --prefix P --component X`` (the calls of vllm-0.33.0:setup.py:342-399);
- ``cmake_minimum_required`` is enforced against this cmake's version (vllm-0.33.0:CMakeLists.txt:1);
- the HIP compiler is found as CMake does (Modules/CMakeDetermineHIPCompiler.cmake, 3.21+): ``$HIPCXX``,
  else ``-DCMAKE_HIP_COMPILER``, else ``clang++`` on PATH; the ROCm root is what ``<compiler> -v
  -print-targets`` reports as "Found HIP installation", and it must hold
  ``lib/cmake/hip-lang/hip-lang-config.cmake``;
- ``CMAKE_HIP_FLAGS``/``CMAKE_CXX_FLAGS`` start from ``$HIPFLAGS``/``$CXXFLAGS``; the build type adds
  CMake's Clang defaults (RelWithDebInfo ``-O2 -g -DNDEBUG``); ``CMAKE_<LANG>_COMPILER_LAUNCHER`` prefixes
  every compile (setup.py passes ccache/sccache there, vllm-0.33.0:setup.py:279-292);
- the GPU architectures are ``$PYTORCH_ROCM_ARCH`` intersected with ``HIP_SUPPORTED_ARCHS``, unknown ones
  dropped silently and none at all fatal (vllm-0.33.0:cmake/utils.cmake:542-577);
- triton_kernels comes from ``$TRITON_KERNELS_SRC_DIR``, else from a git clone of the repository its
  cmake file names (vllm-0.33.0:cmake/external_projects/triton_kernels.cmake): this fake never clones,
  it fails as a build without network does; ``FETCHCONTENT_FULLY_DISCONNECTED`` fails it earlier;
- targets come from the source's ``define_extension_target(...)`` calls (their name, LANGUAGE, SOURCES
  and COMPILE_FLAGS, vllm-0.33.0:cmake/utils.cmake:604-667); each is a Python module compiled against
  the headers of ``VLLM_PYTHON_EXECUTABLE`` (find_package(Python ... Development.SABIModule)) and linked as
  ``<name>.abi3.so``, HIP ones against ``${ROCM_PATH}/lib/libamdhip64.so``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

VERSION = "3.31.10"
CACHE = "fixture-cmake-cache.json"
BUILD_TYPE_FLAGS = {"Release": ["-O3", "-DNDEBUG"], "RelWithDebInfo": ["-O2", "-g", "-DNDEBUG"], "Debug": ["-g"]}
TARGET = re.compile(r"define_extension_target\(\s*(?P<body>[^)]*)\)", re.S)
KEYWORDS = ("DESTINATION", "LANGUAGE", "SOURCES", "COMPILE_FLAGS", "ARCHITECTURES", "USE_SABI", "LIBRARIES")


class CMakeError(Exception):
    pass


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _targets(source: Path) -> dict[str, dict[str, list[str]]]:
    targets = {}
    for match in TARGET.finditer((source / "CMakeLists.txt").read_text()):
        words = match["body"].split()
        fields: dict[str, list[str]] = {key: [] for key in KEYWORDS}
        name, current = words[0], "SOURCES"
        for word in words[1:]:
            if word in KEYWORDS:
                current = word
            else:
                fields[current].append(word)
        targets[name] = fields
    return targets


def _which(name: str) -> str | None:
    return shutil.which(name)


def _hip_compiler(defines: dict[str, str]) -> str:
    compiler = os.environ.get("HIPCXX") or defines.get("CMAKE_HIP_COMPILER") or _which("clang++")
    if not compiler:
        raise CMakeError("No CMAKE_HIP_COMPILER could be found.")
    if "hipcc" in Path(compiler).name:
        raise CMakeError(
            f"The HIPCXX environment variable is set to the hipcc wrapper:\n {compiler}\nThis is not supported."
        )
    if not Path(compiler).exists():
        raise CMakeError(f"Could not find compiler set in environment variable HIPCXX:\n{compiler}.")
    return compiler


def _rocm_root(compiler: str) -> str:
    probe = subprocess.run([compiler, "-v", "-print-targets"], capture_output=True, text=True, check=False)
    match = re.search(r"Found HIP installation: *([^,\n]*)[,\n]", probe.stderr)
    if probe.returncode != 0 or not match:
        raise CMakeError("Failed to find ROCm root directory.")
    root = match.group(1)
    config = Path(root) / "lib" / "cmake" / "hip-lang" / "hip-lang-config.cmake"
    if not config.exists():
        raise CMakeError(
            f"The ROCm root directory:\n {root}\n"
            f"does not contain the HIP runtime CMake package, expected at:\n {config}"
        )
    return root


def _gpu_arches(source: Path, defines: dict[str, str]) -> list[str]:
    match = re.search(r'set\(HIP_SUPPORTED_ARCHS "([^"]*)"\)', (source / "CMakeLists.txt").read_text())
    supported = match.group(1).split(";") if match else []
    wanted = os.environ.get("PYTORCH_ROCM_ARCH", defines.get("CMAKE_HIP_ARCHITECTURES", "")).split(";")
    arches = [arch for arch in wanted if arch and arch in supported]
    if not arches:
        raise CMakeError(
            f"None of the detected ROCm architectures: {';'.join(wanted)} is supported. "
            f"Supported ROCm architectures are: {';'.join(supported)}."
        )
    return arches


def _triton_kernels(source: Path, defines: dict[str, str]) -> str:
    given = os.environ.get("TRITON_KERNELS_SRC_DIR")
    if given is not None:
        return given
    text = (source / "cmake" / "external_projects" / "triton_kernels.cmake").read_text()
    repository = re.search(r'set\(TRITON_GIT "([^"]+)"\)', text)
    url = repository.group(1) if repository else "?"
    if defines.get("FETCHCONTENT_FULLY_DISCONNECTED", "").upper() in ("ON", "TRUE", "1"):
        raise CMakeError(f"FETCHCONTENT_FULLY_DISCONNECTED is set but triton_kernels was never populated ({url})")
    raise CMakeError(f"Failed to clone repository: '{url}' (git clone needs the network)")


def configure(argv: list[str]) -> None:
    source, generator, defines = None, "Unix Makefiles", {}
    args = iter(argv)
    for arg in args:
        if arg == "-G":
            generator = next(args)
        elif arg.startswith("-D"):
            key, _, value = arg[2:].partition("=")
            defines[key.split(":")[0]] = value
        elif not arg.startswith("-"):
            source = Path(arg).resolve()
    if source is None:
        raise CMakeError("no source directory given")
    lists = (source / "CMakeLists.txt").read_text()
    minimum = re.search(r"cmake_minimum_required\(VERSION ([0-9.]+)\)", lists)
    if minimum and _version_tuple(VERSION) < _version_tuple(minimum.group(1)):
        raise CMakeError(f"CMake {minimum.group(1)} or higher is required.  You are running version {VERSION}")
    python = defines.get("VLLM_PYTHON_EXECUTABLE")
    if not python:
        raise CMakeError("Please set VLLM_PYTHON_EXECUTABLE to the path of the desired python version")
    probe = "import sysconfig, torch; print(sysconfig.get_paths()['include']); print(torch.version.hip or '')"
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    lines = found.stdout.splitlines()
    if found.returncode != 0 or len(lines) < 2 or not lines[1]:
        raise CMakeError(f"Can't find CUDA or HIP installation. {found.stderr.strip()[-300:]}")
    python_include = lines[0]
    hip_compiler = _hip_compiler(defines)
    cxx = os.environ.get("CXX") or defines.get("CMAKE_CXX_COMPILER") or _which("c++") or "c++"
    build_type = defines.get("CMAKE_BUILD_TYPE", "")
    cache = {
        "source": str(source),
        "generator": generator,
        "build_type": build_type,
        "hip_compiler": hip_compiler,
        "rocm_root": _rocm_root(hip_compiler),
        "rocm_path": defines.get("ROCM_PATH", "/opt/rocm"),
        "cxx": cxx,
        "hip_flags": shlex.split(os.environ.get("HIPFLAGS", "")) + BUILD_TYPE_FLAGS.get(build_type, []),
        "cxx_flags": shlex.split(os.environ.get("CXXFLAGS", "")) + BUILD_TYPE_FLAGS.get(build_type, []),
        "includes": [f"-I{python_include}"],
        "hip_launcher": defines.get("CMAKE_HIP_COMPILER_LAUNCHER", ""),
        "cxx_launcher": defines.get("CMAKE_CXX_COMPILER_LAUNCHER", ""),
        "arches": _gpu_arches(source, defines),
        "triton_kernels": _triton_kernels(source, defines),
    }
    print(f"-- HIP supported arches, building for: {';'.join(cache['arches'])}")
    print(f"-- [triton_kernels] Fetch from {cache['triton_kernels']}")
    Path(CACHE).write_text(json.dumps(cache, indent=1))


def _run(command: list[str]) -> None:
    print(" ".join(shlex.quote(part) for part in command), flush=True)
    subprocess.run(command, check=True)


def _compile_target(name: str, fields: dict[str, list[str]], cache: dict) -> None:  # type: ignore[type-arg]
    source = Path(cache["source"])
    hip = fields["LANGUAGE"] == ["HIP"]
    objects = []
    for index, relative in enumerate(fields["SOURCES"]):
        obj = Path(f"{name}.dir") / f"{index}.o"
        obj.parent.mkdir(exist_ok=True)
        launcher = (
            [cache["hip_launcher" if hip else "cxx_launcher"]]
            if cache["hip_launcher" if hip else "cxx_launcher"]
            else []
        )
        if hip:
            arches = [f"--offload-arch={arch}" for arch in cache["arches"]]
            command = [cache["hip_compiler"], "-x", "hip", *cache["hip_flags"], "-fPIC", "-fno-gpu-rdc", *arches]
        else:
            command = [cache["cxx"], *cache["cxx_flags"], "-fPIC"]
        command += [*cache["includes"], *fields["COMPILE_FLAGS"], "-c", str(source / relative), "-o", str(obj)]
        _run([*launcher, *command])
        objects.append(str(obj))
    libraries = [f"-L{cache['rocm_path']}/lib", "-lamdhip64"] if hip else []
    linker = cache["hip_compiler"] if hip else cache["cxx"]
    _run([linker, "-shared", "-o", f"{name}.abi3.so", *objects, *libraries])


def build(argv: list[str]) -> None:
    cache = json.loads(Path(CACHE).read_text())
    targets = _targets(Path(cache["source"]))
    for wanted in [arg.removeprefix("--target=") for arg in argv if arg.startswith("--target=")]:
        if wanted == "triton_kernels":
            continue
        if wanted not in targets:
            raise CMakeError(f"unknown target '{wanted}'")
        _compile_target(wanted, targets[wanted], cache)


def install(argv: list[str]) -> None:
    cache = json.loads(Path(CACHE).read_text())
    prefix = Path(argv[argv.index("--prefix") + 1])
    component = argv[argv.index("--component") + 1]
    if component == "triton_kernels":
        source = Path(cache["triton_kernels"])
        for path in sorted(source.rglob("*.py")):
            dest = prefix / "vllm" / "third_party" / "triton_kernels" / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        return
    dest = prefix / "vllm" / f"{component}.abi3.so"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(f"{component}.abi3.so", dest)
    print(f"-- Installing: {dest}")


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["--version"]:
            print(f"cmake version {VERSION}\n\nCMake suite maintained and supported by Kitware (kitware.com/cmake).")
        elif argv[:1] == ["--build"]:
            build(argv[2:])
        elif argv[:1] == ["--install"]:
            install(argv[2:])
        else:
            configure(argv)
    except CMakeError as err:
        print(f"CMake Error: {err}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as err:
        print(f"CMake Error: a build command failed ({err.returncode})", file=sys.stderr)
        return 1
    return 0


def cmake() -> None:
    raise SystemExit(main(sys.argv[1:]))
