"""The vLLM wheel stage: a no-isolation, no-deps wheel build from the patched source.

With the ROCm SDK importable in the build interpreter the build targets ROCm with the environment
DESIGN.md describes (all derived from the target table and ``rocm-sdk path --root``); without it (CI,
this machine) the very same code path builds a Python-only wheel (``VLLM_TARGET_DEVICE=empty``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_bundle.errors import BundleError
from vllm_bundle.fetch import require_sha256
from vllm_bundle.recipes import Target
from vllm_bundle.sdist_requirements import filter_torch_family
from vllm_bundle.stage import StageResult, run_stage

STAGE_VERSION = 1
LOG_TAIL_LINES = 40
#: A vLLM HIP/C++ compile job peaks at roughly 4 GiB of memory; more jobs than memory allows swaps or
#: gets OOM-killed, so MAX_JOBS is the smaller of the cores and the memory in 4 GiB units.
GIB_PER_COMPILE_JOB = 4


class BuildError(BundleError):
    """The vLLM wheel build failed; the full log is kept."""


def max_jobs() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return cores
    return max(1, min(cores, int(memory_gib // GIB_PER_COMPILE_JOB)))


def rocm_sdk_root(python: Path) -> Path | None:
    """``rocm-sdk path --root`` of the build interpreter's ROCm SDK, or None when it has none (or an
    SDK without its compiler, which cannot build HIP kernels)."""
    result = subprocess.run(
        [str(python), "-m", "rocm_sdk", "path", "--root"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not result.stdout.strip():
        return None
    root = Path(result.stdout.strip().splitlines()[-1])
    return root if (root / "lib" / "llvm" / "bin" / "amdclang").exists() else None


def rocm_build_env(target: Target, sdk_root: Path, jobs: int) -> dict[str, str]:
    """The variables a ROCm build of vLLM needs, from the target table and the SDK root alone."""
    llvm_bin = sdk_root / "lib" / "llvm" / "bin"
    return {
        "VLLM_TARGET_DEVICE": "rocm",
        "PYTORCH_ROCM_ARCH": target.pytorch_rocm_arch,
        "ROCM_PATH": str(sdk_root),
        "HIP_PATH": str(sdk_root),
        "ROCM_HOME": str(sdk_root),
        "CC": str(llvm_bin / "amdclang"),
        "CXX": str(llvm_bin / "amdclang++"),
        "HIP_DEVICE_LIB_PATH": str(sdk_root / "lib" / "llvm" / "amdgcn" / "bitcode"),
        "CMAKE_PREFIX_PATH": str(sdk_root / "lib" / "cmake"),
        "MAX_JOBS": str(jobs),
    }


def python_only_env() -> dict[str, str]:
    return {"VLLM_TARGET_DEVICE": "empty"}


def build_environment(target: Target, python: Path, jobs: int | None = None) -> dict[str, str]:
    sdk = rocm_sdk_root(python)
    if sdk is None:
        return python_only_env()
    return rocm_build_env(target, sdk, jobs or max_jobs())


def remove_torch_pins(source: Path, python: Path, log: Path) -> None:
    """vLLM's own ``tools/use_existing_torch.py`` where the release has it, else the same filter here."""
    script = source / "tools" / "use_existing_torch.py"
    if script.is_file():
        with log.open("a") as handle:
            subprocess.run([str(python), str(script)], cwd=source, stdout=handle, stderr=subprocess.STDOUT, check=True)
        return
    with log.open("a") as handle:
        for line in filter_torch_family(source):
            handle.write(f">>> removed {line}\n")


def _tail(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:])


def build_wheel(source: Path, python: Path, env: Mapping[str, str], wheel_dir: Path, log: Path) -> Path:
    """Build the wheel from a writable copy of ``source``; the whole log goes to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    work = wheel_dir.parent / f".{wheel_dir.name}.src"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, work, symlinks=True)
    log.write_text(f"# vLLM wheel build; environment: {dict(env)}\n")
    try:
        remove_torch_pins(work, python, log)
        command = [
            str(python),
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "--wheel-dir",
            str(wheel_dir),
            ".",
        ]
        with log.open("a") as handle:
            result = subprocess.run(
                command, cwd=work, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT, check=False
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wheels = sorted(wheel_dir.glob("vllm-*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        sys.stderr.write(_tail(log) + "\n")
        raise BuildError(
            f"the vLLM wheel build failed (VLLM_TARGET_DEVICE={env.get('VLLM_TARGET_DEVICE')}); "
            f"the last {LOG_TAIL_LINES} lines are above, the full log is {log}",
        )
    return wheels[0]


def prebuilt_wheel_stage(wheel: Path, sha256: str, out: Path, force: bool = False) -> StageResult:
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
    python: Path,
    out: Path,
    log: Path,
    force: bool = False,
    python_key: str | None = None,
) -> StageResult:
    """Stage ``vllm-wheel``: depends on the patched source, the build environment and the interpreter
    (``python_key``: the key of the stage that made it, when it is one of ours)."""
    env = build_environment(target, python)
    inputs: dict[str, Any] = {"source": source.key, "env": env, "python": python_key or str(python)}

    def build(tmp: Path) -> Mapping[str, Any]:
        wheel = build_wheel(source.path, python, env, tmp, log)
        return {"wheel": wheel.name, "device": env["VLLM_TARGET_DEVICE"]}

    return run_stage(out, "vllm-wheel", STAGE_VERSION, inputs, build, force=force)
