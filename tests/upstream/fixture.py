"""Builds a small upstream in the real names and layouts, to be served by ``server.UpstreamServer``.

Served tree::

    releases/cpython-<ver>+<date>-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz, SHA256SUMS
    files/<wheels and sdists>
    simple/<project>/index.html       PEP 503 (TheRock's indexes: hashes, no sizes)
    simple/<project>/index.json       PEP 691 (PyPI-like projects: hashes, sizes, upload times)

TheRock-shaped wheels carry real ELF libraries with DT_NEEDED chains between packages and hidden
``.kpack`` device-code files; the python-build-standalone-shaped tarball has one ``python/`` top
directory whose build files still name the ``/install`` prefix, as upstream's do.
"""

from __future__ import annotations

import hashlib
import html
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from .packaging_fixtures import compile_shared, make_tarball, make_wheel

PYTHON_VERSION = "3.12.12"
PYTHON_RELEASE = "20251120"
ROCM_VERSION = "7.14.0"
TORCH_VERSION = f"2.12.0+rocm{ROCM_VERSION}"
TRITON_VERSION = f"3.7.1+git0263a6a6.rocm{ROCM_VERSION}"
VLLM_VERSION = "0.33.0"
ALL_ISAS = ("gfx1150", "gfx1151", "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1200", "gfx1201", "gfx942", "gfx950")
CP = "cp312"
LINUX = "linux_x86_64"
THEROCK_PROJECTS = {"rocm", "rocm-sdk-core", "rocm-sdk-libraries", "rocm-sdk-devel", "torch", "triton"}

AMDSMI_STUB = b"def amdsmi_init():\n    raise RuntimeError('no GPU')\n"
C_LIB = "int {name}(void) {{ return {value}; }}\n"


@dataclass
class Fixture:
    root: Path
    python_asset: str = ""
    files: dict[str, Path] = field(default_factory=dict)  # filename -> path under files/

    @property
    def releases(self) -> Path:
        return self.root / "releases"

    def sha256(self, filename: str) -> str:
        path = self.files.get(filename) or self.releases / filename
        return hashlib.sha256(path.read_bytes()).hexdigest()


def _elf_chain(work: Path) -> dict[str, Path]:
    """Real ELF files: comgr <- amdhip64 <- rocblas / c10 <- torch_hip, and a clang executable."""
    libs: dict[str, Path] = {}
    libs["comgr"] = compile_shared(work / "libamd_comgr.so.3", "libamd_comgr.so.3", C_LIB.format(name="comgr", value=3))
    libs["hip"] = compile_shared(
        work / "libamdhip64.so.7",
        "libamdhip64.so.7",
        "int comgr(void);\nint hip(void) { return comgr() + 4; }\n",
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
        rpath="$ORIGIN:$ORIGIN/../../_rocm_sdk_core/lib",
    )
    libs["triton"] = compile_shared(work / "libtriton.so", "libtriton.so", C_LIB.format(name="triton", value=35))
    libs["clang"] = compile_shared(work / "clang-20", "", "int main(void) { return 0; }\n", executable=True)
    libs["python"] = compile_shared(
        work / "libpython3.12.so.1.0", "libpython3.12.so.1.0", C_LIB.format(name="Py_Main", value=0)
    )
    libs["python_exe"] = compile_shared(
        work / "python3.12",
        "",
        "int Py_Main(void);\nint main(void) { return Py_Main(); }\n",
        needed=(libs["python"],),
        rpath="$ORIGIN/../lib",
        executable=True,
    )
    return libs


def _python_tarball(fx: Fixture, libs: dict[str, Path]) -> None:
    minor = "3.12"
    top = "python"
    files = {
        f"{top}/bin/python{minor}": libs["python_exe"],
        f"{top}/lib/libpython{minor}.so.1.0": libs["python"],
        f"{top}/include/python{minor}/Python.h": b"/* fixture */\n",
        f"{top}/lib/python{minor}/os.py": b"# fixture stdlib\n",
        f"{top}/lib/python{minor}/_sysconfigdata__linux_x86_64-linux-gnu.py": (
            b"build_time_vars = {'prefix': '/install', 'CC': 'clang -pthread', 'LIBDIR': '/install/lib'}\n"
        ),
        f"{top}/lib/python{minor}/config-{minor}-x86_64-linux-gnu/Makefile": b"prefix=\t/install\nCC=\tclang\n",
        f"{top}/lib/pkgconfig/python-{minor}.pc": b"prefix=/install\nlibdir=${prefix}/lib\n",
    }
    symlinks = {f"{top}/bin/python3": f"python{minor}", f"{top}/lib/libpython{minor}.so": f"libpython{minor}.so.1.0"}
    fx.python_asset = f"cpython-{PYTHON_VERSION}+{PYTHON_RELEASE}-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz"
    tarball = make_tarball(fx.releases / fx.python_asset, files, symlinks=symlinks)
    other = fx.releases / f"cpython-{PYTHON_VERSION}+{PYTHON_RELEASE}-x86_64-unknown-linux-gnu-install_only.tar.gz"
    shutil.copyfile(tarball, other)
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}" for p in sorted([tarball, other])]
    (fx.releases / "SHA256SUMS").write_text("\n".join(sums) + "\n")


def _therock_wheels(fx: Fixture, libs: dict[str, Path]) -> None:
    out = fx.root / "files"
    v = ROCM_VERSION
    py_tag = f"py3-none-{LINUX}"
    rocm_sdk_main = (
        "import sys, pathlib\n"
        "def main():\n"
        "    import _rocm_sdk_core\n"
        "    root = pathlib.Path(_rocm_sdk_core.__file__).parent\n"
        "    args = sys.argv[1:]\n"
        "    if args[:1] == ['path']:\n"
        "        sub = {'--root': '', '--bin': 'bin', '--cmake': 'lib/cmake'}[args[1]]\n"
        "        print(root / sub if sub else root)\n"
        f"    elif args[:1] == ['version']:\n        print('{v}')\n"
        "    else:\n        sys.exit('usage: rocm-sdk path --root|--bin|--cmake | version | targets')\n"
    )
    requires = [f"rocm-sdk-core=={v}"]
    requires += [f'rocm-sdk-libraries=={v}; extra == "libraries"', f'rocm-sdk-devel=={v}; extra == "devel"']
    requires += [f'rocm-sdk-device-{isa}=={v}; extra == "device-{isa}"' for isa in ALL_ISAS]
    wheels = [
        make_wheel(
            out,
            "rocm",
            v,
            "py3-none-any",
            {"rocm_sdk/__init__.py": b"", "rocm_sdk/__main__.py": rocm_sdk_main.encode()},
            requires=tuple(requires),
            entry_points={"console_scripts": {"rocm-sdk": "rocm_sdk.__main__:main"}},
        ),
        make_wheel(
            out,
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
            out,
            "rocm-sdk-libraries",
            v,
            py_tag,
            {
                "_rocm_sdk_libraries/__init__.py": b"",
                "_rocm_sdk_libraries/lib/librocblas.so.5": libs["rocblas"],
            },
            requires=(f"rocm-sdk-core=={v}",),
        ),
        make_wheel(
            out,
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
        wheels.append(
            make_wheel(
                out,
                f"rocm-sdk-device-{isa}",
                v,
                py_tag,
                {
                    f"_rocm_sdk_libraries/lib/.kpack/rocblas_{isa}.kpack": f"device code {isa}\n".encode(),
                },
                requires=(f"rocm-sdk-libraries=={v}",),
            )
        )
        wheels.append(
            make_wheel(
                out,
                f"amd-torch-device-{isa}",
                TORCH_VERSION,
                py_tag,
                {
                    f"torch/lib/.kpack/torch_hip_{isa}.kpack": f"torch device code {isa}\n".encode(),
                },
                requires=(f"torch=={TORCH_VERSION}",),
            )
        )
    wheels.append(
        make_wheel(
            out,
            "torch",
            TORCH_VERSION,
            f"{CP}-{CP}-{LINUX}",
            {
                "torch/__init__.py": f"__version__ = '{TORCH_VERSION}'\n".encode(),
                "torch/version.py": f"__version__ = '{TORCH_VERSION}'\nhip = '{v}'\ncuda = None\n".encode(),
                "torch/lib/libc10.so": libs["c10"],
                "torch/lib/libtorch_hip.so": libs["torch_hip"],
            },
            requires=(f"rocm[libraries]=={v}", f"triton=={TRITON_VERSION}", "filelock", "typing-extensions>=4.10"),
        )
    )
    wheels.append(  # a prebuilt ROCm vLLM wheel, for channels in repackage mode
        make_wheel(
            out,
            "vllm",
            f"{VLLM_VERSION}+rocm{v}",
            f"{CP}-{CP}-{LINUX}",
            {"vllm/__init__.py": f"__version__ = '{VLLM_VERSION}+rocm{v}'\n".encode()},
            requires=(f"torch=={TORCH_VERSION}", "fastapi>=0.115", "regex"),
        )
    )
    wheels.append(
        make_wheel(
            out,
            "triton",
            TRITON_VERSION,
            f"{CP}-{CP}-{LINUX}",
            {
                "triton/__init__.py": b"__version__ = '3.7.1'\n",
                "triton/_C/libtriton.so": libs["triton"],
            },
        )
    )
    fx.files.update({w.name: w for w in wheels})


def _pypi_wheels(fx: Fixture) -> None:
    """vLLM's (fixture) dependency closure and torch's, as PyPI serves them."""
    out = fx.root / "files"
    pure = {
        ("filelock", "3.20.0", ()),
        ("typing-extensions", "4.15.0", ()),
        ("pydantic", "2.12.4", ("typing-extensions>=4.14",)),
        ("fastapi", "0.121.0", ("pydantic>=2.7",)),
        ("sentencepiece", "0.2.1", ()),
    }
    wheels = [
        make_wheel(
            out,
            name,
            version,
            "py3-none-any",
            {f"{name.replace('-', '_')}/__init__.py": f"__version__ = '{version}'\n".encode()},
            requires=requires,
        )
        for name, version, requires in sorted(pure)
    ]
    regex = {"regex/__init__.py": b"__version__ = '2025.11.3'\n"}
    # Several wheels for one version: the lock must keep the one the bundle's platform installs.
    for tag in (
        f"{CP}-{CP}-manylinux_2_17_x86_64.manylinux2014_x86_64",
        f"{CP}-{CP}-musllinux_1_2_x86_64",
        "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64",
        f"{CP}-{CP}-manylinux_2_31_aarch64",
    ):
        wheels.append(make_wheel(out, "regex", "2025.11.3", tag, regex))
    fx.files.update({w.name: w for w in wheels})


def _fixture_vllm_sdist(fx: Fixture) -> None:
    top = f"vllm-{VLLM_VERSION}"
    files = {
        f"{top}/PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n".encode(),
        f"{top}/pyproject.toml": b"[build-system]\nrequires = ['setuptools']\n",
        f"{top}/requirements/common.txt": b"regex # tokenizer fallback\nfastapi>=0.115\nsentencepiece\n",
        f"{top}/requirements/rocm.txt": (
            b"# Common dependencies\n-r common.txt\n\n--extra-index-url https://download.pytorch.org/whl/rocm6.4\n"
            b"torch==2.12.0\ntriton==3.7.1\n"
        ),
        f"{top}/requirements/cuda.txt": b"-r common.txt\ntorch==2.12.0\n",
    }
    sdist = make_tarball(fx.root / "files" / f"{top}.tar.gz", files)
    fx.files[sdist.name] = sdist


def write_index(fx: Fixture) -> None:
    """PEP 503 pages for every project; PEP 691 JSON (sizes, upload times) for the PyPI-like ones."""
    projects: dict[str, list[Path]] = {}
    for filename, path in sorted(fx.files.items()):
        name = filename.split("-")[0] if filename.endswith(".whl") else filename.rsplit("-", 1)[0]
        projects.setdefault(canonicalize_name(name), []).append(path)
    simple = fx.root / "simple"
    shutil.rmtree(simple, ignore_errors=True)
    for project, paths in sorted(projects.items()):
        page = simple / project
        page.mkdir(parents=True)
        anchors, entries = [], []
        for path in paths:
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            href = f"../../files/{path.name}#sha256={sha}"
            anchors.append(f'<a href="{html.escape(href)}">{html.escape(path.name)}</a><br/>')
            entries.append(
                {
                    "filename": path.name,
                    "url": f"../../files/{path.name}",
                    "hashes": {"sha256": sha},
                    "size": path.stat().st_size,
                    "upload-time": "2025-11-20T00:00:00Z",
                }
            )
        (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>\n")
        if project not in THEROCK_PROJECTS and not project.startswith(("rocm-sdk-device", "amd-torch-device")):
            meta = {"meta": {"api-version": "1.1"}, "name": project, "files": entries, "versions": []}
            (page / "index.json").write_text(json.dumps(meta))
    links = "\n".join(f'<a href="{p}/">{p}</a><br/>' for p in sorted(projects))
    (simple / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}\n</body></html>\n")


def build_fixture(root: Path, vllm_sdist: Path | None = None) -> Fixture:
    """Make every artifact under ``root`` (a real vLLM source release replaces the fixture one if given)."""
    fx = Fixture(root)
    libs = _elf_chain(root / "_work")
    _python_tarball(fx, libs)
    _therock_wheels(fx, libs)
    _pypi_wheels(fx)
    if vllm_sdist is None:
        _fixture_vllm_sdist(fx)
    else:
        shutil.copyfile(vllm_sdist, root / "files" / vllm_sdist.name)
        fx.files[vllm_sdist.name] = root / "files" / vllm_sdist.name
    write_index(fx)
    _flat_mirror(fx)
    return fx


def _flat_mirror(fx: Fixture) -> None:
    """``mirror/``: every release file and package file under its own name (what --mirror serves)."""
    mirror = fx.root / "mirror"
    mirror.mkdir(exist_ok=True)
    for path in [*fx.releases.iterdir(), *fx.files.values()]:
        (mirror / path.name).unlink(missing_ok=True)
        (mirror / path.name).hardlink_to(path)


def make_blob(fx: Fixture, name: str, size: int) -> Path:
    """A deterministic, incompressible file under ``files/`` (for transfer tests and the bench)."""
    path = fx.root / "files" / name
    if not path.exists():
        seed = hashlib.sha256(name.encode()).digest()
        blocks, block = [], seed
        while sum(map(len, blocks)) < size:
            block = hashlib.sha256(block).digest() * 64
            blocks.append(block)
        path.write_bytes(b"".join(blocks)[:size])
    return path
