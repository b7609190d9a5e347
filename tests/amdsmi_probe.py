"""Run by the test suite with a CPU torch: import a patched vLLM tree's ROCm platform and call every
function that used to call amdsmi, with amdsmi missing and with amdsmi raising.

Usage: python amdsmi_probe.py <tree> [<tree> ...]   (prints one JSON object per tree)

Only the files under test are real (vllm/platforms/__init__.py, interface.py, rocm.py and the bundle's
fallback module); every other ``vllm.*`` module is a permissive stand-in, so no vLLM dependency has
to be installed. torch reports one gfx1151 GPU through its public API (get_device_properties,
device_count, is_available), as a ROCm build of torch does.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import torch

STAND_IN_IF_MISSING = ("numpy",)  # third-party modules the real files import at the top
REAL = ("vllm.platforms", "vllm.platforms.interface", "vllm.platforms.rocm", "vllm.platforms._vllm_bundle_amdsmi")
GPU = types.SimpleNamespace(
    name="AMD Radeon 8060S Graphics",
    gcnArchName="gfx1151",
    uuid="58580000-0000-0000-0000-000000001151",
    total_memory=96 * 2**30,
    major=11,
    minor=5,
)


class _Anything(type):
    """A class that stands for any name: attributes, calls, subclasses, ``X | None``, iteration."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Anything(cls.__name__, (), {})

    def __iter__(cls) -> Any:
        return iter(())

    def __bool__(cls) -> bool:
        return False

    def __getitem__(cls, item: Any) -> Any:
        return cls


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "init_logger":
            import logging

            return lambda *a, **k: _Logger(logging.getLogger("vllm"))
        return _Anything(name, (), {})


class _Logger:
    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name.removesuffix("_once"), lambda *a, **k: None)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The tree's real files for REAL modules; stand-ins for every other ``vllm.*``; ``amdsmi`` as asked."""

    def __init__(self, tree: Path, amdsmi: str) -> None:
        self.tree, self.amdsmi = tree, amdsmi

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "amdsmi":
            if self.amdsmi == "missing":
                raise ModuleNotFoundError("No module named 'amdsmi'")
            return importlib.util.spec_from_loader(name, self)
        if name in REAL:
            parts = name.split(".")
            file = self.tree.joinpath(*parts[:-1], parts[-1] + ".py")
            if name == "vllm.platforms":
                file = self.tree / "vllm" / "platforms" / "__init__.py"
                return importlib.util.spec_from_file_location(name, file, submodule_search_locations=[])
            return importlib.util.spec_from_file_location(name, file)
        if name == "vllm" or name.startswith("vllm."):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        if name == "regex":
            return importlib.util.find_spec("re")
        if name in STAND_IN_IF_MISSING and not any(
            f.find_spec(name, path) for f in sys.meta_path if f is not self and hasattr(f, "find_spec")
        ):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        if spec.name == "amdsmi":
            return _raising_amdsmi()
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _raising_amdsmi() -> types.ModuleType:
    """An amdsmi that imports but fails against the driver, as a mismatched one does."""
    module = types.ModuleType("amdsmi")

    class AmdSmiException(Exception):
        pass

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AmdSmiException("AMDSMI_STATUS_DRIVER_NOT_LOADED")

    module.AmdSmiException = AmdSmiException  # type: ignore[attr-defined]
    module.AmdSmiMemoryType = types.SimpleNamespace(VRAM=0)  # type: ignore[attr-defined]
    for name in (
        "amdsmi_init",
        "amdsmi_shut_down",
        "amdsmi_get_processor_handles",
        "amdsmi_get_gpu_asic_info",
        "amdsmi_get_gpu_device_uuid",
        "amdsmi_get_gpu_memory_total",
        "amdsmi_topo_get_link_type",
        "amdsmi_topo_get_numa_node_number",
    ):
        setattr(module, name, fail)
    return module


def _fake_rocm_torch() -> None:
    torch.version.hip = "7.14.0"
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_properties = lambda device=None: GPU
    torch.cuda.get_device_capability = lambda device=None: (GPU.major, GPU.minor)
    if hasattr(torch, "accelerator"):
        torch.accelerator.is_available = lambda: True


def _call(results: dict[str, Any], name: str, call: Any) -> None:
    try:
        results[name] = call()
    except Exception as err:  # recorded, not raised: the test names the function and the error
        results[name] = f"ERROR {type(err).__name__}: {err}"


def probe(tree: Path, amdsmi: str) -> dict[str, Any]:
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.") or n in ("amdsmi", "regex")]:
        del sys.modules[name]
    finder = _Finder(tree, amdsmi)
    sys.meta_path.insert(0, finder)
    results: dict[str, Any] = {}
    try:
        platforms = importlib.import_module("vllm.platforms")
        if hasattr(platforms, "vllm_version_matches_substr"):  # reads the installed vLLM's version
            setattr(platforms, "vllm_version_matches_substr", lambda substr: False)  # noqa: B010
        _call(results, "rocm_platform_plugin", platforms.rocm_platform_plugin)
        try:
            rocm = importlib.import_module("vllm.platforms.rocm")
        except Exception as err:
            results["import"] = f"ERROR {type(err).__name__}: {err}"
            return results
        results["import"] = "ok"
        platform = rocm.RocmPlatform
        platform.device_count = classmethod(lambda cls: 1)
        source = (tree / "vllm" / "platforms" / "rocm.py").read_text()
        _call(results, "get_device_name", lambda: platform.get_device_name(0))
        _call(results, "is_fully_connected", lambda: platform.is_fully_connected([0, 0]))
        for name, call in (
            ("get_device_uuid", lambda: platform.get_device_uuid(0)),
            ("get_all_device_numa_nodes", lambda: platform.get_all_device_numa_nodes()),
            ("get_device_total_memory", lambda: platform.get_device_total_memory(0)),
            ("_GCN_ARCH", lambda: rocm._GCN_ARCH),
        ):
            if re.search(rf"\b{re.escape(name)}\b", source):
                _call(results, name, call)
    finally:
        sys.meta_path.remove(finder)
    return results


def main() -> None:
    _fake_rocm_torch()
    for tree in map(Path, sys.argv[1:]):
        print(json.dumps({"tree": str(tree), "missing": probe(tree, "missing"), "raising": probe(tree, "raising")}))


if __name__ == "__main__":
    main()
