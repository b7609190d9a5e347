"""The host's AMD GPUs as the amdgpu driver describes them in sysfs, read under a root directory (``/``
on a real host, a captured tree in tests).

- KFD topology, ``sys/class/kfd/kfd/topology/nodes/<N>/properties``: one ``name value`` line per
  property, printed by the kernel's ``node_show()`` (drivers/gpu/drm/amd/amdkfd/kfd_topology.c,
  ``"%s %u\\n"`` / ``"%s %llu\\n"``). GPU nodes are those with a non-zero ``simd_count`` and
  ``gfx_target_version`` (rocm-bootstrap's ``detect.py`` and Lemonade's ``system_info.cpp`` skip the
  others), in node order: the order HIP numbers devices in.
- The node's DRM device: ``drm_render_minor`` M -> ``sys/class/drm/renderD<M>/device`` (Lemonade,
  lemonade-sdk/lemonade:src/cpp/server/system_info.cpp). Its ``mem_info_{vram,gtt}_{total,used}`` are
  decimal bytes (amdgpu_vram_mgr.c, amdgpu_gtt_mgr.c); the VRAM files may be absent.
- An APU has no ``board_info`` under its device (Lemonade's ``get_amd_is_igpu``). On an APU whose
  carve-out is smaller than its GTT the kernel serves GPU allocations from GTT (``apu_prefer_gtt`` in
  ``amdgpu_ttm_init``), and HIP reports the GTT size as the device's memory; GTT pages are system RAM,
  so what is free is also bounded by ``MemAvailable`` in ``proc/meminfo``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .smallfile import read_small_text

KFD_NODES = Path("sys/class/kfd/kfd/topology/nodes")
DRM = Path("sys/class/drm")
MEMINFO = Path("proc/meminfo")
#: ``proc/meminfo`` is a few KiB (one line per counter); sysfs attributes are a page at most.
MEMINFO_LIMIT = 64 << 10
#: Where the host's ``sys``, ``proc`` and ``dev`` are read: ``/``, unless this names a captured tree
#: (the tests' fixture hosts; ``vllm-bundle doctor --host-root`` sets it for what it runs).
HOST_ROOT_VARIABLE = "VLLM_BUNDLE_HOST_ROOT"


def host_root(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get(HOST_ROOT_VARIABLE) or "/")


class Unreadable(Exception):
    """A file the answer depends on is missing or not what the driver writes."""


def read_properties(path: Path) -> dict[str, int]:
    """``name value`` lines; a value that is not an integer is skipped (none is, in the driver's format)."""
    properties: dict[str, int] = {}
    for line in read_small_text(path).splitlines():
        name, _, value = line.strip().partition(" ")
        try:
            properties[name] = int(value)
        except ValueError:
            continue
    return properties


@dataclass(frozen=True)
class GpuNode:
    """One GPU node of the KFD topology."""

    node: int
    properties: dict[str, int]

    @property
    def gfx_target_version(self) -> int:
        return self.properties.get("gfx_target_version", 0)

    @property
    def render_minor(self) -> int | None:
        minor = self.properties.get("drm_render_minor", -1)
        return minor if minor >= 0 else None

    def render_node(self) -> Path | None:
        """``dev/dri/renderD<M>``, relative to the host root."""
        return None if self.render_minor is None else Path("dev/dri") / f"renderD{self.render_minor}"


def kfd_present(root: Path) -> bool:
    return (root / KFD_NODES).is_dir()


def gpu_nodes(root: Path) -> list[GpuNode]:
    """The GPU nodes under ``root``, in node order (empty when there is no KFD topology)."""
    base = root / KFD_NODES
    try:
        numbers = sorted(int(entry.name) for entry in base.iterdir() if _is_number(entry.name))
    except OSError:
        return []
    nodes = []
    for number in numbers:
        try:
            properties = read_properties(base / str(number) / "properties")
        except (OSError, ValueError):  # unreadable, or not text: not a node the driver wrote
            continue
        if properties.get("simd_count", 0) > 0 and properties.get("gfx_target_version", 0) > 0:
            nodes.append(GpuNode(number, properties))
    return nodes


def _is_number(text: str, digits: int = 9) -> bool:
    """``text`` is a decimal number ``int()`` takes: ASCII digits only (``str.isdigit`` also accepts
    ``²`` and other scripts' digits) and not so long that ``int()`` refuses it."""
    return 0 < len(text) <= digits and text.isascii() and text.isdigit()


def device_dir(root: Path, gpu: GpuNode) -> Path:
    if gpu.render_minor is None:
        raise Unreadable(f"KFD node {gpu.node} names no DRM render node (drm_render_minor)")
    return root / DRM / f"renderD{gpu.render_minor}" / "device"


def is_apu(root: Path, gpu: GpuNode) -> bool:
    try:
        return not os.path.lexists(device_dir(root, gpu) / "board_info")
    except (OSError, ValueError) as err:
        raise Unreadable(f"cannot read KFD node {gpu.node}'s device: {err}") from None


def _bytes(path: Path) -> int:
    try:
        text = read_small_text(path).strip()
    except OSError as err:
        raise Unreadable(f"cannot read {path}" + (f": {err.strerror}" if err.strerror else f" ({err})")) from None
    if not text.isascii() or not text.isdigit():
        raise Unreadable(f"{path} holds no byte count")
    return int(text)


def mem_available(root: Path) -> int | None:
    """``MemAvailable`` of ``proc/meminfo`` in bytes (``MemAvailable:  123 kB``), None when absent."""
    try:
        for line in read_small_text(root / MEMINFO, MEMINFO_LIMIT).splitlines():
            name, _, rest = line.partition(":")
            if name == "MemAvailable":
                return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class MemoryPool:
    """The memory GPU allocations come from: ``vram``, or ``gtt`` (an APU's shared system memory)."""

    kind: str
    total: int
    used: int
    free: int  # total - used, and on an APU no more than the system's available memory


def memory_pool(root: Path, gpu: GpuNode) -> MemoryPool:
    """The pool HIP allocates from and reports (``hipMemGetInfo``) for ``gpu``."""
    device = device_dir(root, gpu)
    gtt_total = _bytes(device / "mem_info_gtt_total")
    try:
        vram_total = _bytes(device / "mem_info_vram_total")
    except Unreadable:
        vram_total = 0  # the VRAM manager is unused: the driver hides its files
    if is_apu(root, gpu) and vram_total < gtt_total:
        used = _bytes(device / "mem_info_gtt_used")
        free = max(0, gtt_total - used)
        available = mem_available(root)
        if available is not None:
            free = min(free, available)
        return MemoryPool("gtt", gtt_total, used, free)
    used = _bytes(device / "mem_info_vram_used")
    return MemoryPool("vram", vram_total, used, max(0, vram_total - used))


def visible_index(environ: Mapping[str, str]) -> int | None:
    """The index, among the GPU nodes, of the GPU a HIP program uses as device 0: ROCr's
    ``ROCR_VISIBLE_DEVICES`` selects first, then HIP's ``HIP_VISIBLE_DEVICES`` (or
    ``CUDA_VISIBLE_DEVICES``) among those. None when a list names devices by UUID (not worked out here)."""
    order: list[int] | None = None
    for names in (("ROCR_VISIBLE_DEVICES",), ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")):
        value = next((environ[name] for name in names if environ.get(name) is not None), None)
        if value is None:
            continue
        items = [item.strip() for item in value.split(",") if item.strip()]
        if not items or not all(_is_number(item) for item in items):
            return None
        chosen = [int(item) for item in items]
        order = chosen if order is None else [order[i] for i in chosen if i < len(order)]
        if not order:
            return None
    return 0 if order is None else order[0]
