"""Host trees (a machine's ``sys``, ``proc`` and ``dev`` as ``doctor --host-root`` reads them) written from
the kernel's formats, for the machines tests/data/hosts has no capture of: Instinct MI300X (whole, and
split into compute partitions), MI300A, and a Radeon beside an integrated GPU that is enumerated first.

Formats, from Linux 6.12 (drivers/gpu/drm/amd/...) unless said otherwise:

- ``sys/class/kfd/kfd/topology/nodes/<N>/properties``: ``node_show()`` in amdkfd/kfd_topology.c, one
  ``name value`` line each, decimal; ``unique_id`` and ``num_xcc`` on GPU nodes only. A partition node's
  ``location_id`` is the PCI device id with the node's partition number OR'ed in, and its
  ``drm_render_minor`` its own render node (``kfd_topology_add_device``); ``simd_count`` is its share of
  the CUs (kfd_crat.c); every partition prints the device's ``unique_id``. ``gfx_target_version`` of
  GC 9.4.3 with rev_id >= 1 (MI300X, MI300A) is 90402 (kfd_device.c).
- ``nodes/<N>/gpu_id`` (decimal) and ``nodes/<N>/mem_banks/<i>/properties`` (``mem_show()``:
  ``heap_type``, ``size_in_bytes``, ``flags``, ``width``, ``mem_clk_max``); a partition's
  ``size_in_bytes`` is its share, ``amdgpu_amdkfd_xcp_memory_size`` (amdgpu_amdkfd.c).
- ``sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>``: the VRAM a process holds on that node, ``"%llu\\n"``
  (amdkfd/kfd_process.c, ``kfd_procfs_show``).
- ``sys/class/drm/renderD<M>/device``: the PCI device, with ``board_info`` (``type : oam``, hidden on an
  APU: ``amdgpu_board_attrs_is_visible``, amdgpu_device.c; MI300A is one, amdgpu_discovery.c) and
  ``mem_info_{vram,gtt}_{total,used}`` (whole device, amdgpu_vram_mgr.c / amdgpu_gtt_mgr.c). Partitions
  1 and up: a link to the platform device ``amdgpu_xcp_<i>`` (amdxcp/amdgpu_xcp_drv.c), which has none
  of amdgpu's attributes.
- ``sys/module/amdgpu/{version,taint}`` and ``sys/module/amdkcl``: amdgpu-dkms, as tests/data/hosts/README.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1 << 30
#: A GPU node's properties in node_show()'s order; the values a test does not set are plausible.
NODE_TEMPLATE = (
    ("cpu_cores_count", 0),
    ("simd_count", 0),
    ("mem_banks_count", 1),
    ("caches_count", 0),
    ("io_links_count", 1),
    ("p2p_links_count", 0),
    ("cpu_core_id_base", 0),
    ("simd_id_base", 0),
    ("max_waves_per_simd", 8),
    ("lds_size_in_kb", 64),
    ("gds_size_in_kb", 0),
    ("num_gws", 64),
    ("wave_front_size", 64),
    ("array_count", 0),
    ("simd_arrays_per_engine", 1),
    ("cu_per_simd_array", 0),
    ("simd_per_cu", 4),
    ("max_slots_scratch_cu", 32),
    ("gfx_target_version", 0),
    ("vendor_id", 4098),
    ("device_id", 0),
    ("location_id", 0),
    ("domain", 0),
    ("drm_render_minor", 0),
    ("hive_id", 0),
    ("num_sdma_engines", 2),
    ("num_sdma_xgmi_engines", 0),
    ("num_sdma_queues_per_engine", 8),
    ("num_cp_queues", 24),
    ("cwsr_size", 0),
    ("ctl_stack_size", 0),
    ("max_engine_clk_fcompute", 2100),
    ("local_mem_size", 0),
    ("fw_version", 0),
    ("capability", 0),
    ("debug_prop", 0),
    ("sdma_fw_version", 0),
    ("unique_id", 0),
    ("num_xcc", 1),
    ("max_engine_clk_ccompute", 3700),
)


@dataclass
class Gpu:
    """One KFD GPU node and its render node."""

    gfx_target_version: int
    simd_count: int
    location_id: int
    render_minor: int
    gpu_id: int
    bank_bytes: int
    unique_id: int = 0
    num_xcc: int = 1
    #: The PCI device's amdgpu attributes; None for a partition's ``amdgpu_xcp_<i>`` device.
    pci: dict[str, str] | None = field(default_factory=dict)
    xcp: int = 0


@dataclass
class Host:
    gpus: list[Gpu]
    osrelease: str = "6.14.0-37-generic"
    meminfo_available_kib: int = 400 * (1 << 20)
    dkms: bool = False
    #: pid -> {gpu_id: bytes of VRAM held}
    processes: dict[int, dict[int, int]] = field(default_factory=dict)


def write(root: Path, host: Host) -> Path:
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    cpu = nodes / "0"
    cpu.mkdir(parents=True)
    cpu_properties = dict(NODE_TEMPLATE, cpu_cores_count=96, simd_per_cu=0, wave_front_size=0)
    cpu_properties.pop("unique_id"), cpu_properties.pop("num_xcc")
    (cpu / "properties").write_text("".join(f"{k} {v}\n" for k, v in cpu_properties.items()))
    (cpu / "gpu_id").write_text("0\n")
    for number, gpu in enumerate(host.gpus, start=1):
        _write_node(root, nodes / str(number), gpu)
    for pid, held in host.processes.items():
        process = root / "sys/class/kfd/kfd/proc" / str(pid)
        process.mkdir(parents=True)
        (process / "pasid").write_text(f"{32768 + pid % 1000}\n")
        for gpu_id, used in held.items():
            (process / f"vram_{gpu_id}").write_text(f"{used}\n")
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(host.osrelease + "\n")
    (root / "proc/meminfo").write_text(
        f"MemTotal:       {512 * (1 << 20)} kB\nMemAvailable:   {host.meminfo_available_kib} kB\n"
    )
    module = root / "sys/module/amdgpu"
    module.mkdir(parents=True)
    (module / "initstate").write_text("live\n")
    (module / "taint").write_text("O\n" if host.dkms else "\n")
    if host.dkms:
        (module / "version").write_text("6.16.6\n")
        (root / "sys/module/amdkcl").mkdir()
    (root / "dev/dri").mkdir(parents=True)
    (root / "dev/kfd").write_text("")
    for gpu in host.gpus:
        (root / "dev/dri" / f"renderD{gpu.render_minor}").write_text("")
    return root


def _write_node(root: Path, node: Path, gpu: Gpu) -> None:
    node.mkdir()
    properties = dict(NODE_TEMPLATE)
    properties.update(
        simd_count=gpu.simd_count,
        gfx_target_version=gpu.gfx_target_version,
        location_id=gpu.location_id,
        drm_render_minor=gpu.render_minor,
        unique_id=gpu.unique_id,
        num_xcc=gpu.num_xcc,
        array_count=gpu.num_xcc * 4,
        cu_per_simd_array=gpu.simd_count // 4 // max(1, gpu.num_xcc * 4),
    )
    (node / "properties").write_text("".join(f"{k} {v}\n" for k, v in properties.items()))
    (node / "gpu_id").write_text(f"{gpu.gpu_id}\n")
    bank = node / "mem_banks" / "0"
    bank.mkdir(parents=True)
    (bank / "properties").write_text(
        f"heap_type 1\nsize_in_bytes {gpu.bank_bytes}\nflags 0\nwidth 8192\nmem_clk_max 1300\n"
    )
    render = root / "sys/class/drm" / f"renderD{gpu.render_minor}"
    render.mkdir(parents=True)
    if gpu.pci is None:
        platform = root / "sys/devices/platform" / f"amdgpu_xcp_{gpu.xcp}"
        platform.mkdir(parents=True)
        (platform / "uevent").write_text(f"DRIVER=amdgpu_xcp_drv\nMODALIAS=platform:amdgpu_xcp_{gpu.xcp}\n")
        os.symlink(os.path.relpath(platform, render), render / "device")
        return
    device = render / "device"
    device.mkdir()
    for name, value in gpu.pci.items():
        (device / name).write_text(value + "\n")


def mi300x(partitions: int = 1, *, used: dict[int, int] | None = None, dkms: bool = True) -> Host:
    """One MI300X (192 GiB HBM, 304 CUs, 8 XCCs) whole (SPX) or split into ``partitions`` compute
    partitions in NPS1 (each its share of the CUs and of the memory). ``used``: partition -> bytes held
    by a process on it; the PCI device's ``mem_info_vram_used`` counts them all."""
    total = 192 * GIB
    unique_id = 0x5C3A1E9F0B2D4786
    held = used or {}
    pci = {
        "board_info": "type : oam",
        "mem_info_vram_total": str(total),
        "mem_info_vram_used": str(sum(held.values()) + 700 * (1 << 20)),
        "mem_info_gtt_total": str(256 * GIB),
        "mem_info_gtt_used": str(20 * (1 << 20)),
    }
    gpus = [
        Gpu(
            gfx_target_version=90402,
            simd_count=1216 // partitions,
            location_id=0x0C00 | (xcp if partitions > 1 else 0),
            render_minor=128 + xcp,
            gpu_id=41000 + xcp,
            bank_bytes=total // partitions,
            unique_id=unique_id,
            num_xcc=8 // partitions,
            pci=pci if xcp == 0 else None,
            xcp=xcp,
        )
        for xcp in range(partitions)
    ]
    processes = {4100 + xcp: {41000 + xcp: amount} for xcp, amount in held.items()}
    return Host(gpus, osrelease="5.15.0-126-generic", dkms=dkms, processes=processes)


def mi300a(*, dkms: bool = True) -> Host:
    """One MI300A (gfx942 APU: no board_info; its HBM is system memory, served as GTT)."""
    gpu = Gpu(
        gfx_target_version=90402,
        simd_count=912,
        location_id=0x0200,
        render_minor=128,
        gpu_id=52000,
        bank_bytes=96 * GIB,
        unique_id=0x1F00A3C4D5E6F708,
        num_xcc=6,
        pci={
            "mem_info_vram_total": str(512 * (1 << 20)),
            "mem_info_vram_used": str(30 * (1 << 20)),
            "mem_info_gtt_total": str(96 * GIB),
            "mem_info_gtt_used": str(2 * GIB),
        },
    )
    return Host([gpu], osrelease="5.14.0-503.el9.x86_64", dkms=dkms, meminfo_available_kib=110 * (1 << 20))


def radeon_beside_igpu() -> Host:
    """A Raphael iGPU (gfx1036, enumerated first) and a Radeon RX 9070 XT (gfx1201, 16 GiB)."""
    igpu = Gpu(
        gfx_target_version=100306,
        simd_count=4,
        location_id=0x1100,
        render_minor=128,
        gpu_id=1001,
        bank_bytes=512 * (1 << 20),
        unique_id=0,
        pci={
            "mem_info_vram_total": str(512 * (1 << 20)),
            "mem_info_vram_used": str(200 * (1 << 20)),
            "mem_info_gtt_total": str(30 * GIB),
            "mem_info_gtt_used": str(1 * GIB),
        },
    )
    radeon = Gpu(
        gfx_target_version=120001,
        simd_count=128,
        location_id=0x0300,
        render_minor=129,
        gpu_id=2002,
        bank_bytes=16 * GIB,
        unique_id=0x0A1B2C3D4E5F6071,
        pci={
            "board_info": "type : cem",
            "mem_info_vram_total": str(16 * GIB),
            "mem_info_vram_used": str(400 * (1 << 20)),
            "mem_info_gtt_total": str(30 * GIB),
            "mem_info_gtt_used": str(100 * (1 << 20)),
        },
    )
    return Host([igpu, radeon], osrelease="6.14.0-37-generic")
