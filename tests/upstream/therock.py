"""TheRock-shaped artifacts: one stream (index) of ROCm SDK wheels, device-code packages, torch and triton,
shaped after TheRock's packaging (build_tools/packaging/python) and its RELEASES.md:

- ``rocm`` is an sdist only (a setuptools project whose ``rocm_sdk`` module torch imports at start-up);
- the SDK is the wheels rocm-sdk-core, rocm-sdk-libraries, rocm-sdk-devel, rocm-sdk-device-<isa>;
- torch requires ``rocm[libraries]==<ver>`` and names its device code through extras ``device-<isa>``:
  per ISA on whl-multi-arch, per sub-family (rocm-bootstrap's bundle, e.g. gfx115x) on whl-next;
- the index mirrors PyPI packages (numpy, setuptools 81.0.0, filelock) in other versions than PyPI's.
"""

from __future__ import annotations

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
    import _rocm_sdk_core
    root = pathlib.Path(_rocm_sdk_core.__file__).parent
    args = sys.argv[1:]
    if args[:1] == ['path']:
        sub = {'--root': '', '--bin': 'bin', '--cmake': 'lib/cmake'}[args[1]]
        print(root / sub if sub else root)
    elif args[:1] == ['version']:
        print(__version__)
    else:
        sys.exit('usage: rocm-sdk path --root|--bin|--cmake | version | targets')


if __name__ == "__main__":
    main()
"""
ROCM_SETUP = """from setuptools import find_packages, setup

VERSION = {version!r}
ISAS = {isas!r}

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
        f"{top}/setup.py": ROCM_SETUP.format(version=version, isas=ALL_ISAS).encode(),
        f"{top}/src/rocm_sdk/__init__.py": ROCM_SDK_INIT.encode(),
        f"{top}/src/rocm_sdk/__main__.py": ROCM_SDK_MAIN.encode(),
        f"{top}/src/rocm_sdk/_dist_info.py": f"__version__ = {version!r}\n".encode(),
    }
    return make_tarball(out / f"{top}.tar.gz", files)


def torch_files(stream: Stream, libs: dict[str, Path]) -> dict[str, bytes | Path]:
    init = (
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


def stream_artifacts(files: Path, stream: Stream, libs: dict[str, Path], cp: str) -> list[Path]:
    """Every file one TheRock stream serves."""
    v, py_tag = stream.rocm, f"py3-none-{LINUX}"
    artifacts = [
        rocm_sdist(files, v),
        make_wheel(
            files,
            "rocm-sdk-core",
            v,
            py_tag,
            {
                "_rocm_sdk_core/__init__.py": b"",
                "_rocm_sdk_core/lib/libamdhip64.so.7": libs["hip"],
                "_rocm_sdk_core/lib/libamd_comgr.so.3": libs["comgr"],
                "_rocm_sdk_core/lib/llvm/bin/clang-20": libs["clang"],
                "_rocm_sdk_core/share/amd_smi/amdsmi/__init__.py": AMDSMI_STUB,
            },
        ),
        make_wheel(
            files,
            "rocm-sdk-libraries",
            v,
            py_tag,
            {"_rocm_sdk_libraries/__init__.py": b"", "_rocm_sdk_libraries/lib/librocblas.so.5": libs["rocblas"]},
            requires=(f"rocm-sdk-core=={v}",),
        ),
        make_wheel(
            files,
            "rocm-sdk-devel",
            v,
            py_tag,
            {
                "_rocm_sdk_devel/__init__.py": b"",
                "_rocm_sdk_devel/include/hip/hip_runtime.h": b"/* fixture */\n",
                "_rocm_sdk_devel/lib/cmake/hip/hip-config.cmake": b"# fixture\n",
            },
            requires=(f"rocm-sdk-core=={v}",),
        ),
    ]
    for isa in ALL_ISAS:
        kpack = {f"_rocm_sdk_libraries/lib/.kpack/rocblas_{isa}.kpack": f"device code {isa}\n".encode()}
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
