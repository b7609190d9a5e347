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
- A GPU split into compute partitions (MI300X in DPX/QPX/CPX mode) is one KFD node per partition, each
  with its own render node; the nodes of one device share ``domain`` and their ``location_id`` but for
  the partition number OR'ed into its low bits (``kfd_topology_add_device``, kfd_topology.c). Only
  partition 0's render node is the PCI device; the others' are ``amdgpu_xcp_<i>`` platform devices
  (amdxcp/amdgpu_xcp_drv.c) with none of amdgpu's attributes (``board_info``, ``mem_info_*``), and
  ``mem_info_vram_*`` counts the whole device. HIP reports a partition's own share: the node's
  ``mem_banks/<i>/properties`` ``size_in_bytes`` (``amdgpu_amdkfd_xcp_memory_size``), less what the
  processes on it hold, ``sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>`` (kfd_process.c, decimal bytes).
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
KFD_PROCESSES = Path("sys/class/kfd/kfd/proc")
#: The partition number the kernel ORs into a partition node's ``location_id`` (at most 8 partitions).
PARTITION_BITS = 0x7
#: A byte count the driver prints (``%llu``) has at most 20 digits.
BYTE_COUNT_DIGITS = 20
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
    def unique_id(self) -> int:
        """The device's serial (0 when the driver has none): what ROCr and HIP make GPU UUIDs of."""
        return self.properties.get("unique_id", 0)

    @property
    def render_minor(self) -> int | None:
        minor = self.properties.get("drm_render_minor", -1)
        return minor if minor >= 0 else None

    @property
    def pci_device(self) -> tuple[int, int]:
        """(PCI domain, PCI device id): the same for every partition of one GPU."""
        return self.properties.get("domain", 0), self.properties.get("location_id", 0) & ~PARTITION_BITS

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


def partitions(root: Path, gpu: GpuNode) -> list[GpuNode]:
    """The KFD nodes of ``gpu``'s device, partition 0 first (just ``gpu`` when it is not partitioned)."""
    same = [node for node in gpu_nodes(root) if node.pci_device == gpu.pci_device]
    return sorted(same, key=lambda node: node.properties.get("location_id", 0)) if gpu in same else [gpu]


def pci_device_dir(root: Path, gpu: GpuNode) -> Path:
    """The PCI device's sysfs folder of ``gpu``, which holds amdgpu's attributes: partition 0's."""
    return device_dir(root, partitions(root, gpu)[0])


def is_apu(root: Path, gpu: GpuNode) -> bool:
    try:
        return not os.path.lexists(pci_device_dir(root, gpu) / "board_info")
    except (OSError, ValueError) as err:
        raise Unreadable(f"cannot read KFD node {gpu.node}'s device: {err}") from None


def _bytes(path: Path) -> int:
    try:
        text = read_small_text(path).strip()
    except OSError as err:
        raise Unreadable(f"cannot read {path}" + (f": {err.strerror}" if err.strerror else f" ({err})")) from None
    if not _is_number(text, BYTE_COUNT_DIGITS):
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
    if len(partitions(root, gpu)) > 1:
        return partition_pool(root, gpu)
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


def partition_pool(root: Path, gpu: GpuNode) -> MemoryPool:
    """A compute partition's own memory: its node's banks, less what KFD's processes hold on it."""
    node = root / KFD_NODES / str(gpu.node)
    try:
        banks = sorted((node / "mem_banks").iterdir())
    except OSError:
        raise Unreadable(f"cannot read {node / 'mem_banks'}") from None
    total = sum(read_properties_or_unreadable(bank / "properties").get("size_in_bytes", 0) for bank in banks)
    gpu_id = _bytes(node / "gpu_id")
    used = sum(_process_vram(process, gpu_id) for process in _kfd_processes(root))
    return MemoryPool("partition", total, used, max(0, total - used))


def read_properties_or_unreadable(path: Path) -> dict[str, int]:
    try:
        return read_properties(path)
    except OSError as err:
        raise Unreadable(f"cannot read {path}: {err.strerror or err}") from None


def _kfd_processes(root: Path) -> list[Path]:
    try:
        return [entry for entry in (root / KFD_PROCESSES).iterdir() if _is_number(entry.name)]
    except OSError:
        return []  # no process uses a GPU, or none the reader may see


def _process_vram(process: Path, gpu_id: int) -> int:
    try:
        text = read_small_text(process / f"vram_{gpu_id}").strip()
    except OSError:
        return 0  # the process does not use this GPU, or has exited
    return int(text) if _is_number(text, BYTE_COUNT_DIGITS) else 0
