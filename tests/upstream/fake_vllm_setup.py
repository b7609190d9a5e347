"""The fixture vLLM source release's build backend (``_build/fixture_backend.py`` in its sdist): what
vllm-0.33.0:setup.py does for a ROCm build, without setuptools (a no-isolation build of the fixture needs
nothing but the bundle's interpreter and the locked build tools):

- torch is imported first, from the build interpreter (setup.py:17);
- ``VLLM_TARGET_DEVICE`` defaults to ``cuda``; unset, it is ``rocm`` when torch is a HIP build; ``cuda``
  and ``rocm`` with a HIP torch both build the HIP extensions; ``empty`` builds none and gets ``+empty``
  (setup.py:99-121, 1269-1297, 1367-1369);
- a ROCm build runs ``cmake --version`` ("Cannot find CMake executable" without one, setup.py:342-347),
  configures with ``-G Ninja`` when ninja is on PATH, the build type from ``$CMAKE_BUILD_TYPE`` (default
  RelWithDebInfo), ccache/sccache launchers when found on PATH (sccache unless ``VLLM_DISABLE_SCCACHE=1``),
  ``-DROCM_PATH`` and ``$CMAKE_ARGS`` last; builds every extension target in one call with ``-j=$MAX_JOBS``
  and installs each component (setup.py:215-399, 1549-1620);
- the version's local part is ``rocm<major><minor>`` of the ROCm version (setup.py:646-651, 1383-1389);
- a ROCm build's METADATA requires ``requirements/rocm.txt`` and, where ``rocm_sdk`` is importable (TheRock's
  torch), ``torch[device-<isa>]``, ``torchvision[device-<isa>]`` and ``rocm[device-<isa>]`` for every ISA of
  ``$PYTORCH_ROCM_ARCH`` (setup.py:1473-1546, ``get_rocm_device_requirements``); its wheel is tagged for
  the building interpreter, ``cp3X-cp3X-linux_x86_64`` (what the real build makes:
  tests/test_vllm_build_system.py);
- the Rust frontend ``vllm/vllm-rs`` is built only where ``rustc -V`` works (setuptools-rust skips an
  optional extension otherwise, tools/build_rust.py);
- the wheel's zip entries carry ``$SOURCE_DATE_EPOCH`` when set, else the files' times (never before
  1980), and the files' modes, as bdist_wheel writes them (pypa/wheel:src/wheel/wheelfile.py,
  get_zipinfo_datetime and WheelFile.write).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import time
import zipfile

VERSION = "0.33.0"
#: setup.py's ROCm extensions, in its order (vllm-0.33.0:setup.py:1549-1620).
ROCM_EXTENSIONS = (
    "cumem_allocator",
    "triton_kernels",
    "spinloop",
    "fs_io_C",
    "_rocm_C",
    "_C",
    "_C_stable_libtorch",
    "_moe_C_stable_libtorch",
)


def _device() -> tuple[str, bool, str | None]:
    import torch

    hip = getattr(torch.version, "hip", None)
    device = os.environ.get("VLLM_TARGET_DEVICE")
    if device is None:
        device = "rocm" if hip else "cpu"
    return device, device in ("cuda", "rocm") and hip is not None, hip


def _version(device: str, is_hip: bool, hip: str | None) -> str:
    if device == "empty":
        return f"{VERSION}+empty"
    if is_hip and hip:
        return f"{VERSION}+rocm" + "".join(hip.split(".")[:2])
    raise RuntimeError("Unknown runtime environment")


def _cmake_extensions(source: pathlib.Path, device: str) -> dict[str, pathlib.Path]:
    try:
        subprocess.check_output(["cmake", "--version"])
    except OSError as err:
        raise RuntimeError("Cannot find CMake executable") from err
    build_temp = source / "build" / "temp.fixture"
    build_lib = source / "build" / "lib.fixture"
    build_temp.mkdir(parents=True, exist_ok=True)
    jobs = int(os.environ.get("MAX_JOBS") or len(os.sched_getaffinity(0)))
    args = [f"-DCMAKE_BUILD_TYPE={os.environ.get('CMAKE_BUILD_TYPE') or 'RelWithDebInfo'}"]
    args.append(f"-DVLLM_TARGET_DEVICE={device}")
    launcher = "sccache" if shutil.which("sccache") and os.environ.get("VLLM_DISABLE_SCCACHE", "0") == "0" else None
    launcher = launcher or ("ccache" if shutil.which("ccache") else None)
    if launcher:
        args += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={launcher}" for lang in ("C", "CXX", "CUDA", "HIP")]
    args += [f"-DVLLM_PYTHON_EXECUTABLE={sys.executable}", f"-DFETCHCONTENT_BASE_DIR={source / '.deps'}"]
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    if generator:
        args += ["-DCMAKE_JOB_POOL_COMPILE:STRING=compile", f"-DCMAKE_JOB_POOLS:STRING=compile={jobs}"]
    rocm_home = os.environ.get("ROCM_HOME") or os.environ.get("ROCM_PATH")
    if rocm_home:
        args.append(f"-DROCM_PATH={rocm_home}")
    args += os.environ.get("CMAKE_ARGS", "").split()
    subprocess.check_call(["cmake", str(source), *generator, *args], cwd=build_temp)
    targets = [f"--target={name}" for name in ROCM_EXTENSIONS]
    subprocess.check_call(["cmake", "--build", ".", f"-j={jobs}", *targets], cwd=build_temp)
    for name in ROCM_EXTENSIONS:
        install = ["cmake", "--install", ".", "--prefix", str(build_lib), "--component", name]
        subprocess.check_call(install, cwd=build_temp)
    return {str(p.relative_to(build_lib)): p for p in sorted(build_lib.rglob("*")) if p.is_file()}


def _rust_frontend(source: pathlib.Path) -> dict[str, pathlib.Path]:
    try:
        found = subprocess.run(["rustc", "-V"], capture_output=True, text=True, check=False)
    except OSError:
        return {}
    if found.returncode != 0:
        print("can't find Rust compiler", flush=True)
        return {}
    binary = source / "build" / "vllm-rs"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text(f"#!/bin/sh\n# vllm-rs, built by {found.stdout.strip()}\n")
    binary.chmod(0o755)
    return {"vllm/vllm-rs": binary}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _zip_time(path: pathlib.Path | None) -> tuple[int, int, int, int, int, int]:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    stamp = int(epoch) if epoch else int(path.stat().st_mtime if path else time.time())
    return time.gmtime(max(stamp, 315532800))[:6]


def _requirements(source: pathlib.Path, name: str) -> list[str]:
    lines = []
    for line in (source / "requirements" / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            lines += _requirements(source, line[3:].strip())
        elif line and not line.startswith("-"):
            lines.append(line)
    return lines


def _rocm_device_requirements() -> list[str]:
    if importlib.util.find_spec("rocm_sdk") is None:
        return []
    arches = [a for a in os.environ.get("PYTORCH_ROCM_ARCH", "").split(";") if a]
    return [f"{pkg}[device-{arch}]" for pkg in ("torch", "torchvision", "rocm") for arch in arches]


def _metadata(source: pathlib.Path, version: str, is_hip: bool) -> bytes:
    if is_hip:
        requires = _requirements(source, "rocm.txt") + _rocm_device_requirements()
    else:
        requires = _requirements(source, "common.txt")
    lines = ["Metadata-Version: 2.1", "Name: vllm", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    return ("\n".join(lines) + "\n").encode()


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: object = None) -> str:
    """The dist-info alone, without building anything (setuptools' egg_info does the same)."""
    source = pathlib.Path.cwd()
    device, is_hip, hip = _device()
    version = _version(device, is_hip, hip)
    info = pathlib.Path(metadata_directory) / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_bytes(_metadata(source, version, is_hip))
    return info.name


def build_wheel(wheel_directory: str, config_settings: object = None, metadata_directory: object = None) -> str:
    source = pathlib.Path.cwd()
    device, is_hip, hip = _device()
    version = _version(device, is_hip, hip)
    files: dict[str, pathlib.Path] = {str(p): p for p in sorted(pathlib.Path("vllm").rglob("*.py"))}
    if is_hip:
        files.update(_cmake_extensions(source, device))
    files.update(_rust_frontend(source))
    cp = "cp{}{}".format(*sys.version_info[:2])
    tag = f"{cp}-{cp}-linux_x86_64" if is_hip else "py3-none-any"
    name = f"vllm-{version}-{tag}.whl"
    info = f"vllm-{version}.dist-info"
    generated = {
        f"{info}/METADATA": _metadata(source, version, is_hip),
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: fixture\nRoot-Is-Purelib: {'false' if is_hip else 'true'}\nTag: {tag}\n"
        ).encode(),
    }
    record = [f"{member},{_record_hash(path.read_bytes())},{path.stat().st_size}" for member, path in files.items()]
    record += [f"{member},{_record_hash(data)},{len(data)}" for member, data in generated.items()]
    generated[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, path in sorted(files.items()):
            entry = zipfile.ZipInfo(member, _zip_time(path))
            entry.external_attr = (path.stat().st_mode & 0xFFFF) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, path.read_bytes())
        for member, data in generated.items():
            entry = zipfile.ZipInfo(member, _zip_time(None))
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, data)
    return name


def get_requires_for_build_wheel(config_settings: object = None) -> list[str]:
    return []
