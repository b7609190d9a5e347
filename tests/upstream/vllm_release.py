"""The fixture's vLLM source release: PyPI's real ``vllm-0.33.0.tar.gz`` with its build system as it is, and
the parts that only a GPU machine with vLLM's whole dependency closure could run replaced by stand-ins.

What every test bundle builds, byte for byte from PyPI's file (real_wheels.py ``VLLM_SDIST``):

- the build system: ``setup.py``, ``pyproject.toml`` (its ``[build-system] requires``), ``setup.cfg``,
  ``MANIFEST.in``, ``PKG-INFO`` (setuptools-scm reads the version from it), ``CMakeLists.txt``, ``cmake/``
  (``utils.cmake``, ``hipify.py``, ``external_projects/triton_kernels.cmake``...), ``csrc/`` (every source
  CMake lists and hipifies; each unit's compile is the fake SDK's stand-in, therock.py), ``tools/``
  (``build_rust.py``, which setup.py loads), ``rust/`` (the optional Rust frontend), ``vllm/envs.py``
  (setup.py loads it) and ``requirements/build/`` (the lock's build group reads ``rocm.txt``);
- everything else of the release that is not ``vllm/`` or ``requirements/``, except what no build reads
  (``DROPPED``: tests, docs, benchmarks, examples, 40 MB of the 47).

What stands in:

- ``vllm/`` (3,600 files, 56 MB, imported at run time): the real one needs CUDA/ROCm torch and ~80 packages
  at import (``vllm/__init__.py`` imports ``vllm.env_override``, which patches ``torch._inductor``). In its
  place: ``vllm/envs.py`` (real), the lines the patch series anchors on (``VLLM_PLATFORMS``, ``VLLM_ROCM``:
  vLLM 0.33.0's own ``rocm_platform_plugin`` and ``with_amdsmi_context``), and a server module that proves
  the interpreter, torch's native extension and the launcher's arguments (``VLLM_SERVER``);
- ``requirements/{common,rocm,cuda}.txt``: the real ones name ~80 projects, far more than the fake PyPI
  serves; these name what it serves (pypi.py), with the real files' shapes (``-r common.txt``, index
  options, markers, comments). ``requirements/build/rocm.txt`` is the real one.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from .packaging_fixtures import make_tarball

VERSION = "0.33.0"
TOP = f"vllm-{VERSION}"
#: Parts of the real release that no build reads: left out to keep the fixture's release small (7 MB).
DROPPED = ("tests/", "docs/", "benchmarks/", "examples/", "docker/", ".buildkite/", ".github/")
#: The parts of ``vllm/`` and ``requirements/`` taken as they are (the rest stands in: ``STAND_INS``).
REAL_FILES = ("vllm/envs.py", "requirements/build/rocm.txt")
REAL_DIRS = ("requirements/build/",)
#: The triton_kernels commit vLLM 0.33.0's cmake/external_projects/triton_kernels.cmake pins for ROCm.
TRITON_KERNELS_COMMIT = "669b31acc1dd1b3fd93286afd5db67f65d9f7557"

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
# Stands in for vllm.entrypoints.cli.main (and the deprecated openai.api_server): proves the interpreter,
# torch's native extension (through the launcher's library path) and the arguments, then exits.
VLLM_SERVER = """import json, os, sys
import torch
print(json.dumps({"argv": sys.argv[1:], "executable": sys.executable, "hip_check": torch._hip_check(),
                  "torch": torch.__file__, "sys_path": sys.path,
                  "env": {k: os.environ.get(k) for k in ("PYTHONPATH", "PYTHONNOUSERSITE", "LD_LIBRARY_PATH",
                          "FLASH_ATTENTION_TRITON_AMD_ENABLE", "CC", "VLLM_ATTENTION_BACKEND")}}))
"""
COMMON = (
    "regex # tokenizer fallback\nfastapi>=0.115\nsentencepiece\nnumpy\n"
    'llguidance >= 1.7.0, < 1.8.0; platform_machine == "x86_64" or platform_machine == "aarch64"\n'
    "ninja # Required for xgrammar, rocm, tpu, xpu\n"
    # requirements/common.txt:15 as it is (PyPI's newest protobuf is a pre-release: facts.toml)
    "protobuf >= 5.29.6, !=6.30.*, !=6.31.*, !=6.32.*, !=6.33.0.*, !=6.33.1.*, !=6.33.2.*, !=6.33.3.*, "
    '!=6.33.4.*; platform_machine != "s390x"\n'
)
ROCM = (
    "# Common dependencies\n-r common.txt\n\n--extra-index-url https://download.pytorch.org/whl/rocm6.4\n"
    "torch==2.12.0\ntriton==3.7.1\ngrpcio==1.78.0\nsetuptools>=78.1.1,<80.0.0\n"
    "mooncake-transfer-engine-rocm >= 0.3.13\ntorchao\ntimm>=1.0.17\ntilelang==0.1.10\napache-tvm-ffi==0.1.11\n"
)
STAND_INS = {
    "vllm/__init__.py": f"__version__ = '{VERSION}'\n",
    "vllm/platforms/__init__.py": VLLM_PLATFORMS,
    "vllm/platforms/rocm.py": VLLM_ROCM,
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/cli/__init__.py": "",
    "vllm/entrypoints/cli/main.py": VLLM_SERVER,
    "vllm/entrypoints/openai/__init__.py": "",
    "vllm/entrypoints/openai/api_server.py": VLLM_SERVER,
    "requirements/common.txt": COMMON,
    "requirements/rocm.txt": ROCM,
    "requirements/cuda.txt": "-r common.txt\ntorch==2.12.0\n",
}


def _kept(name: str) -> bool:
    if name in REAL_FILES or name.startswith(REAL_DIRS):
        return True
    return not name.startswith(("vllm/", "requirements/", *DROPPED))


def fixture_vllm_sdist(real: Path, files: Path) -> Path:
    """``files/vllm-0.33.0.tar.gz``: the real release ``real`` as the module's docstring says."""
    contents: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    symlinks: dict[str, str] = {}
    with tarfile.open(real, "r:gz") as archive:
        for member in archive:
            name = member.name.removeprefix(f"{TOP}/")
            if not _kept(name) or member.isdir():
                continue
            if member.issym():
                symlinks[member.name] = member.linkname
            elif member.isfile():
                handle = archive.extractfile(member)
                assert handle is not None
                contents[member.name], modes[member.name] = handle.read(), member.mode & 0o777
    missing = [name for name in REAL_FILES if f"{TOP}/{name}" not in contents]
    assert not missing, f"{real.name} no longer has {missing}: look again at what the fixture takes from it"
    contents |= {f"{TOP}/{name}": text.encode() for name, text in STAND_INS.items()}
    return make_tarball(files / f"{TOP}.tar.gz", contents, modes, symlinks)
