"""PyPI-shaped artifacts: vLLM's (fixture) dependency closure, with what the real one holds that matters to
the pipeline (UPSTREAM-FACTS.md):

- llguidance 1.7 ships only manylinux_2_31 wheels, mooncake-transfer-engine-rocm only manylinux_2_35:
  the closure needs the x86_64-manylinux_2_35 platform;
- mooncake's extension needs libraries the bundle never carries (libibverbs, libnuma, libcurl) and has
  an absolute RUNPATH (/opt/rocm-7.0.0/lib); torchao carries a CUDA extension needing libtorch_cuda.so;
  grpcio's extension needs libz.so.1, which the manylinux policy allows;
- setuptools exists in versions vLLM cannot take (81.0.0 on TheRock's mirror, a stand-in 80.9.0 here) and
  one it can (79.0.1, PyPI's real wheel); regex in several platform variants, of which the lock keeps one;
- vLLM's build tools are PyPI's real wheels (real_wheels.py ``BUILD_TOOLS``, served by the fixture): cmake
  3.31.10 (its binary runs vLLM's own CMakeLists.txt in every test bundle's build), ninja (vLLM's run-time
  requirement too, requirements/common.txt), setuptools, setuptools-scm, setuptools-rust, wheel, jinja2 and
  packaging with what they require (semantic-version, markupsafe, typing-extensions);
- ziglang, the C toolchain of components.toml's ``[toolchain]``: the real 0.17.1 wheel (real_wheels.py,
  served by the fixture) and a small stand-in the shared test recipes pin (``ziglang_stand_in``);
- the CUDA builds a ROCm closure meets on PyPI, from facts.toml ([[pypi]]): torchvision 0.27.0 built for
  CUDA 13 (what timm pulls in unless the torch family comes from TheRock), torch-c-dlpack-ext's ``-cuda``
  add-ons (through tilelang), each ``.so`` a real ELF with the DT_NEEDED and RPATH the real one has.
"""

from __future__ import annotations

from pathlib import Path

from vllm_bundle.inputs.facts import ProjectFacts

from .packaging_fixtures import Content, compile_shared, make_tarball, make_wheel
from .therock import FACTS

OTHER_CP = "cp39"  # a wheel for another interpreter, which the lock must not pick
MANYLINUX_2_17 = "manylinux_2_17_x86_64.manylinux2014_x86_64"
PURE = (
    ("filelock", "3.20.0", ()),
    ("pydantic", "2.12.4", ("typing-extensions>=4.14",)),
    ("fastapi", "0.121.0", ("pydantic>=2.7",)),
    ("sentencepiece", "0.2.1", ()),
    ("setuptools", "80.9.0", ()),
    ("pillow", "11.3.0", ()),
)
#: The absolute RUNPATH PyPI's CUDA torchvision 0.27.0 carries (a CI conda environment; facts.toml).
TORCHVISION_RPATH = "/__w/_temp/conda_environment_25355632216/lib"


#: The stand-in for PyPI's ziglang that the shared test recipes pin (conftest.copy_recipes): the real 0.17.1
#: wheel (served too, real_wheels.py) adds ~411 MB installed to each bundle, and the suite builds ~25.
#: It has the real wheel's layout (ziglang/__init__.py, __main__.py, an executable ziglang/zig, the
#: python-zig console script); its zig checks what the bundle's cc wrapper passes and compiles nothing
#: itself: it hands the rest to this machine's cc (tier 0 builds a C extension with every bundle's CC).
#: tests/test_toolchain.py proves a bundle with the real zig.
ZIGLANG_STAND_IN = "0.0.1"
ZIGLANG_TAG = "py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64.musllinux_1_1_x86_64"  # the real wheel's
STAND_IN_ZIG = b"""#!/bin/sh
# stand-in zig (vllm-bundle tests): `zig cc -target <arch>-linux-gnu.<glibc> ARGS` as the bundle's cc
# wrapper runs it, compiled by this machine's cc; anything else is refused.
set -eu
if [ "${1:-}" != cc ] || [ "${2:-}" != -target ]; then
    echo "stand-in zig: not a compiler (only 'zig cc -target <triple> ...', for tests)" >&2
    exit 1
fi
case ${3:-} in
    *-linux-gnu.[0-9]*.[0-9]*) ;;
    *) echo "stand-in zig: unexpected target '${3:-}'" >&2; exit 1 ;;
esac
# zig writes its global cache first: a wrapper that gives none, or an unwritable one, fails here as there.
mkdir -p "${ZIG_GLOBAL_CACHE_DIR:?stand-in zig: no ZIG_GLOBAL_CACHE_DIR}"
shift 3
exec cc "$@"
"""
ZIGLANG_MAIN = b"""import os, sys
argv = [os.path.join(os.path.dirname(__file__), "zig"), *sys.argv[1:]]
os.execv(argv[0], argv)

def dummy(): "The python-zig entry point; zig runs as a side effect of the import (as in ziglang's own)."
"""


def ziglang_stand_in(files: Path) -> Path:
    contents = {"ziglang/__init__.py": b"", "ziglang/__main__.py": ZIGLANG_MAIN, "ziglang/zig": STAND_IN_ZIG}
    scripts = {"console_scripts": {"python-zig": "ziglang.__main__:dummy"}}
    return make_wheel(
        files, "ziglang", ZIGLANG_STAND_IN, ZIGLANG_TAG, contents, entry_points=scripts, executables=("ziglang/zig",)
    )


def _native_libraries(work: Path) -> dict[str, Path]:
    """ELF files with the dependencies real wheels have: on libraries the bundle lacks, on libz."""
    stubs = {
        name: compile_shared(work / name, name, f"int {stem}_stub(void) {{ return 0; }}\n")
        for name, stem in (
            ("libibverbs.so.1", "ibverbs"),
            ("libnuma.so.1", "numa"),
            ("libcurl.so.4", "curl"),
            ("libtorch_cuda.so", "torch_cuda"),
        )
    }
    return {
        "mooncake": compile_shared(
            work / "mooncake_engine.so",
            "",
            "int mooncake(void) { return 1; }\n",
            needed=(stubs["libibverbs.so.1"], stubs["libnuma.so.1"], stubs["libcurl.so.4"]),
            rpath="/opt/rocm-7.0.0/lib",
        ),
        "torchao": compile_shared(
            work / "torchao_cuda.so", "", "int torchao(void) { return 1; }\n", needed=(stubs["libtorch_cuda.so"],)
        ),
        "grpc": compile_shared(
            work / "cygrpc.so", "", "int cygrpc(void) { return 1; }\n", system_libraries=("libz.so.1",)
        ),
    }


def _fact_contents(project: ProjectFacts, work: Path, values: dict[str, str]) -> dict[str, Content]:
    """The files a PyPI fact names: each ``.so`` a real ELF needing what the real one needs (a library of
    the same wheel, by its SONAME through ``$ORIGIN`` as tilelang's are; else a stub, not shipped, standing
    in for CUDA's), the rest small stubs."""
    contents: dict[str, Content] = {f"{project.name.replace('-', '_')}/__init__.py": b""}
    shipped = {Path(path).name: path for path in project.files}
    wanted = {soname for sonames in project.needed.values() for soname in sonames}
    for path in sorted(project.files, key=lambda p: p in project.needed):  # what others need first
        if not path.endswith(".so") and ".so." not in path:
            contents[path] = f"{path}\n".encode()
            continue
        own = [contents[shipped[soname]] for soname in project.needed.get(path, ()) if soname in shipped]
        foreign = [
            compile_shared(work / "cuda" / soname, soname, f"int stub_{i}(void) {{ return 0; }}\n")
            for i, soname in enumerate(project.needed.get(path, ()))
            if soname not in shipped
        ]
        needed = tuple(p for p in (*own, *foreign) if isinstance(p, Path))
        rpath = TORCHVISION_RPATH if project.name == "torchvision" and path.endswith("_C.so") else None
        soname = Path(path).name if Path(path).name in wanted else ""
        out = work / project.name / path.replace("/", "_")
        contents[path] = compile_shared(
            out, soname, "int entry(void) { return 0; }\n", needed=needed, rpath=rpath or ("$ORIGIN" if own else None)
        )
    return contents


#: A placeholder's module, as PyPI's amd_torch_device_gfx1151-0.0.1.dev0 wheel has it (facts.toml).
PLACEHOLDER = "__version__ = {version!r}\n\n\ndef hello():\n    return 'Hello from {name}!'\n"


def _placeholder_sdist(files: Path, name: str, version: str) -> Path:
    """``<name>-<version>.tar.gz`` (PEP 625 name) with an empty module: what PyPI's 0.1.0 placeholders hold."""
    top = f"{name.replace('-', '_')}-{version}"
    contents = {
        f"{top}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{top}/src/{name.replace('-', '_')}/__init__.py": b"",
    }
    return make_tarball(files / f"{top}.tar.gz", contents)


def fact_projects(files: Path, work: Path, cp: str) -> list[Path]:
    """PyPI's projects as facts.toml records them (tags, requirements, the native files that matter), and
    the placeholders PyPI holds under TheRock's names."""
    artifacts = []
    for project in FACTS.pypi:
        values = {"cp": cp}
        if "sdist" in project.kind:
            artifacts.append(_placeholder_sdist(files, project.name, project.version))
        if "wheel" not in project.kind:
            continue
        contents = _fact_contents(project, work, values)
        if project.placeholder:
            module = f"{project.name.replace('-', '_')}/__init__.py"
            contents[module] = PLACEHOLDER.format(version=project.version, name=project.name).encode()
        tag = project.tag.format_map(values)
        artifacts.append(make_wheel(files, project.name, project.version, tag, contents, project.requires))
    return artifacts


def pypi_artifacts(files: Path, work: Path, cp: str) -> list[Path]:
    native = _native_libraries(work)
    wheels = [
        make_wheel(files, name, version, "py3-none-any", {f"{name.replace('-', '_')}/__init__.py": b""}, requires)
        for name, version, requires in PURE
    ]
    regex = {"regex/__init__.py": b"__version__ = '2025.11.3'\n"}
    for tag in (  # several wheels for one version: the lock keeps the one the bundle's platform installs
        f"{cp}-{cp}-{MANYLINUX_2_17}",
        f"{cp}-{cp}-musllinux_1_2_x86_64",
        f"{OTHER_CP}-{OTHER_CP}-{MANYLINUX_2_17}",
        f"{cp}-{cp}-manylinux_2_31_aarch64",
    ):
        wheels.append(make_wheel(files, "regex", "2025.11.3", tag, regex))
    wheels += [
        make_wheel(files, "numpy", "2.3.5", f"{cp}-{cp}-{MANYLINUX_2_17}", {"numpy/__init__.py": b""}),
        make_wheel(files, "llguidance", "1.7.3", "cp39-abi3-manylinux_2_31_x86_64", {"llguidance/__init__.py": b""}),
        make_wheel(
            files,
            "mooncake-transfer-engine-rocm",
            "0.3.13",
            f"{cp}-{cp}-manylinux_2_35_x86_64",
            {"mooncake/__init__.py": b"", "mooncake/engine.so": native["mooncake"]},
        ),
        make_wheel(
            files,
            "torchao",
            "0.14.0",
            "cp39-abi3-manylinux_2_28_x86_64",
            {"torchao/__init__.py": b"", "torchao/_C_cuda.abi3.so": native["torchao"]},
        ),
        make_wheel(
            files,
            "grpcio",
            "1.78.0",
            f"{cp}-{cp}-{MANYLINUX_2_17}",
            {"grpc/__init__.py": b"", "grpc/_cython/cygrpc.so": native["grpc"]},
        ),
        *fact_projects(files, work, cp),
        ziglang_stand_in(files),
    ]
    return wheels
