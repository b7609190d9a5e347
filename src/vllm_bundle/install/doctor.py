"""Can this machine run a bundle? ``vllm-bundle doctor`` answers, and ``install`` asks before it downloads.

Each check is one :class:`Finding`: ``ok``, ``warn`` (vLLM may still run) or ``block`` (it will not, or
will crash), with the fix. Everything is read under a root directory (``/``, or a captured host tree):
the GPU through the runtime's own reader (:mod:`vllm_bundle.runtime.amdgpu`, what ``bin/vllm-server``
reads at start), the kernel's release from ``proc/sys/kernel/osrelease``, the driver from ``sys/module``
and the device nodes under ``dev``. A file that is missing or garbled becomes a finding, never a
traceback.

What is checked, and where the rule comes from:

- ``glibc``: the bundle's native files need the glibc its floor names (tier 0 measures it from their symbol
  versions; the release records it, ``install`` keeps it beside the bundle): an older one stops vLLM at its
  first import of an extension. Checked against the glibc this process runs on.
- ``gpu``: vLLM uses HIP device 0, as ROCr, HIP and vLLM read ``ROCR_VISIBLE_DEVICES``,
  ``HIP_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` (:mod:`vllm_bundle.runtime.visibility` cites their
  rules); variables that leave no GPU, or that vLLM refuses, block. The bundle carries code objects for
  its target's ISAs only (``recipes/targets.toml``). The ISA is AMD's rocm-bootstrap's reading of the
  node's ``gfx_target_version`` (``parse_gfx_target_version``). An APU is a GPU whose PCI device (for a
  compute partition, partition 0's) has no ``board_info``.
- ``cwsr``: on gfx1151 (Strix Halo) ROCm needs a kernel that exports the KFD node properties
  ``cwsr_size`` and ``ctl_stack_size`` (kernel 6.18.4+, or a backport: mainline 8fc2796dea6f,
  "drm/amdkfd: Export the cwsr_size and ctl_stack_size to userspace", printed by ``node_show()`` in
  drivers/gpu/drm/amd/amdkfd/kfd_topology.c right after ``num_cp_queues`` for every node, CPU nodes
  included, so only the GPU node tells). Lemonade gates gfx1151 (``gfx_target_version 110501``) alone
  on it (lemonade-sdk/lemonade:src/cpp/server/system_info.cpp ``needs_gfx1151_cwsr_fix``); the fix is
  lemonade-sdk/lemonade:docs/gfx1151_linux.html's.
- ``driver``: AMD's out-of-tree ``amdgpu-dkms`` "conflicts with the in-tree amdgpu driver" on Ryzen AI /
  Strix Halo (lemonade-sdk/lemonade:docs/gfx1151_linux.html, the only place the conflict is documented):
  a blocker on those APUs (:data:`DKMS_CONFLICT_ISAS`). Everywhere else it is what AMD's installer sets up
  ("Kernel mode driver (included in all usecases)", amdgpu-install's use cases in ROCm's install docs; an
  Instinct MI300A or MI300X runs on it): stated, with no advice to remove it. DKMS shows as
  ``sys/module/amdgpu/version`` (only ROCm/amdgpu:drivers/gpu/drm/amd/amdgpu/amdgpu_drv.c sets
  ``MODULE_VERSION``; the kernel makes the file only for a module that has one, kernel/module/main.c), an
  ``O`` (out-of-tree) in ``sys/module/amdgpu/taint``, or its companion module ``amdkcl`` loaded
  (ROCm/amdgpu:drivers/gpu/drm/amd/dkms/dkms.conf).
- ``access``: ``dev/kfd`` and the GPU's ``dev/dri/renderD<drm_render_minor>`` must open read-write.
  They are really opened: a desktop session grants them by ACL (systemd's ``uaccess``), which mode
  bits do not show. The fix is the groups that own them, or in a container the devices passed in
  (lemonade-sdk/lemonade:docs/guide/install/docker.md).
- ``memory``: vLLM refuses to start when the free memory is below ``gpu_memory_utilization`` x total
  (``request_memory`` in vllm/v1/worker/utils.py); without a value of the caller's, the launcher picks
  one (:func:`vllm_bundle.runtime.gpu_memory.choose`), and both judge a value by the same rule
  (``largest_fitting``).
"""

from __future__ import annotations

import errno
import grp
import json
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from rocm_bootstrap import parse_gfx_target_version

from vllm_bundle.errors import printable
from vllm_bundle.recipes import Target
from vllm_bundle.runtime import amdgpu, gpu_memory, visibility
from vllm_bundle.runtime.smallfile import read_small_text

Status = Literal["ok", "warn", "block"]

#: gfx1151's ``gfx_target_version`` (GC 11.5.1), the only GPU the CWSR export is required for.
GFX1151 = 110501
CWSR_PROPERTIES = ("cwsr_size", "ctl_stack_size")
CWSR_FIX = (
    "upgrade the kernel to 6.18.4 or later and reboot; on Ubuntu 24.04: sudo apt install linux-oem-24.04; "
    "see https://lemonade-server.ai/gfx1151_linux.html"
)
#: The ISAs of the APUs on which amdgpu-dkms is documented to conflict with the kernel's own amdgpu:
#: Ryzen AI 300 (Strix Point gfx1150, Krackan Point gfx1152) and Ryzen AI Max (Strix Halo gfx1151).
DKMS_CONFLICT_ISAS = ("gfx1150", "gfx1151", "gfx1152")
DKMS_FIX = (
    "sudo apt remove --purge amdgpu-dkms && sudo reboot, "
    "or reinstall ROCm without it: sudo amdgpu-install -y --usecase=rocm --no-dkms"
)
CONTAINER_DEVICES = "--device /dev/kfd --device /dev/dri --group-add video --group-add render"
GROUPS_FIX = f"sudo usermod -aG render,video $USER, then log out and in (in a container: {CONTAINER_DEVICES})"
OSRELEASE = Path("proc/sys/kernel/osrelease")
MODULES = Path("sys/module")
GIB = float(1 << 30)
#: The most of a variable's value a finding repeats.
SHOWN_VALUE = 60


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    message: str
    fix: str = ""


#: Beside an installed bundle (``install`` writes it): the oldest glibc it runs on, as its release states.
GLIBC_FILE = ".vllm-bundle-glibc"


def host_glibc() -> str | None:
    """The version of the glibc this process runs on (``2.36``); None on another C library (musl)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    name, _, version = text.partition(" ")
    return version if name == "glibc" and version else None


def _as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def glibc_check(needed: str, source: str, have: str | None) -> Finding:
    """The bundle's files load only where glibc is at least ``needed`` (its floor; ``source`` says where
    it was read): an older one stops vLLM at its first import of an extension ("version `GLIBC_2.38' not
    found"). ``have``: this machine's (host_glibc)."""
    wanted = f"the bundle needs glibc {needed} or newer ({source})"
    if have is None:
        return Finding("glibc", "block", f"this machine's C library is not glibc; {wanted}", "run it on a glibc system")
    if _as_tuple(have) < _as_tuple(needed):
        fix = f"run it on a system with glibc {needed} or newer, or install a release built for glibc {have}"
        return Finding("glibc", "block", f"this machine has glibc {have}; {wanted}", fix)
    return Finding("glibc", "ok", f"glibc {have}; {wanted}")


def diagnose(
    root: Path,
    targets: Mapping[str, Target],
    target: Target | None,
    utilization: float | None,
    environ: Mapping[str, str],
) -> list[Finding]:
    """Every check for HIP device 0 under ``root``. ``target``: the bundle to run (None: whichever
    serves the GPU); ``utilization``: the caller's ``--gpu-memory-utilization`` (None: the launcher's)."""
    gpus = amdgpu.gpu_nodes(root)  # a node whose properties cannot be read is no GPU node
    if not gpus:
        return [_no_gpu(root, targets)]
    selection = visibility.select([gpu.unique_id for gpu in gpus], environ)
    if selection.device0 is None:
        return [_not_visible(selection, len(gpus), environ)]
    gpu = gpus[selection.device0]
    apu = _is_apu(root, gpu)
    return [
        _gpu_check(gpus, gpu, apu, targets, target, environ),
        _cwsr_check(root, gpu),
        _driver_check(root, _isa(gpu)),
        _access_check(root, gpu),
        _memory_check(root, gpu, utilization),
    ]


def for_install(findings: list[Finding]) -> list[Finding]:
    """What ``install`` refuses on: everything but memory, which frees up when other programs exit (and
    the launcher chooses its budget at each start): short memory at install time is only a warning."""
    return [replace(f, status="warn") if f.check == "memory" and f.status == "block" else f for f in findings]


def blockers(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.status == "block"]


def render_text(findings: list[Finding]) -> str:
    """One line per finding (``status check message (fix: ...)``), then a summary line. A message quotes
    the host's text (a kernel release, a module version): shown escaped, it cannot forge a row."""
    lines = [
        printable(f"{f.status:<5} {f.check:<7} {f.message}" + (f" (fix: {f.fix})" if f.fix else "")) for f in findings
    ]
    blocking = len(blockers(findings))
    warnings = sum(finding.status == "warn" for finding in findings)
    if blocking:
        lines.append(f"not ready: {_count(blocking, 'blocker')}")
    else:
        lines.append("ready" + (f", with {_count(warnings, 'warning')}" if warnings else ""))
    return "\n".join(lines)


def render_json(findings: list[Finding]) -> str:
    doc = {"ready": not blockers(findings), "findings": [asdict(finding) for finding in findings]}
    return json.dumps(doc, indent=2)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


# -- which GPU, and is it one the bundle serves ----------------------------------------------------------


def _no_gpu(root: Path, targets: Mapping[str, Target]) -> Finding:
    kfd = root / amdgpu.KFD_NODES
    where = f"no GPU node in {kfd}" if amdgpu.kfd_present(root) else f"{root / 'sys/class/kfd'} does not exist"
    isas = ", ".join(isa for target in targets.values() for isa in target.isas)
    return Finding(
        "gpu",
        "block",
        f"no AMD GPU: {where} (the amdgpu driver is not loaded, or there is no AMD GPU)",
        f"run on a machine with an AMD GPU that a bundle serves ({isas}), its amdgpu driver loaded",
    )


def _visibility(environ: Mapping[str, str]) -> str:
    """The device-selection variables that are set, as ``NAME=value`` (what the user would see; a long
    value cut short)."""
    return ", ".join(
        f"{name}={printable(environ[name], SHOWN_VALUE)}"
        for name in visibility.VARIABLES
        if environ.get(name) is not None
    )


def _not_visible(selection: visibility.Selection, count: int, environ: Mapping[str, str]) -> Finding:
    if selection.problem and selection.problem.startswith("vLLM refuses"):
        fix = f"set only {visibility.HIP}, or both to the same value"
    else:
        fix = f"unset them, or name GPUs by index from 0 to {count - 1}"
    return Finding("gpu", "block", f"{_visibility(environ)}: {selection.problem}", fix)


def _isa(gpu: amdgpu.GpuNode) -> str | None:
    try:
        return str(parse_gfx_target_version(gpu.gfx_target_version).name)
    except ValueError:  # rocm-bootstrap does not know this GPU
        return None


def _is_apu(root: Path, gpu: amdgpu.GpuNode) -> bool | None:
    try:
        return amdgpu.is_apu(root, gpu)
    except amdgpu.Unreadable:  # e.g. a render minor too long for a file name
        return None


def _serving(targets: Mapping[str, Target], isa: str) -> str | None:
    return next((name for name, target in targets.items() if isa in target.isas), None)


def _describe_gpu(gpu: amdgpu.GpuNode, isa: str | None, apu: bool | None, environ: Mapping[str, str]) -> str:
    kind = {True: "APU", False: "discrete GPU", None: "GPU"}[apu]
    what = f"a {isa} {kind}" if isa else f"an unknown {kind} (gfx_target_version {gpu.gfx_target_version})"
    chosen = f" ({_visibility(environ)})" if _visibility(environ) else ""
    return f"HIP device 0{chosen} is KFD node {gpu.node}, {what}"


def _gpu_check(
    gpus: list[amdgpu.GpuNode],
    gpu: amdgpu.GpuNode,
    apu: bool | None,
    targets: Mapping[str, Target],
    target: Target | None,
    environ: Mapping[str, str],
) -> Finding:
    isa = _isa(gpu)
    described = _describe_gpu(gpu, isa, apu, environ)
    if target is not None:
        served = target.name if isa in target.isas else None
    else:
        served = _serving(targets, isa) if isa else None
    if served is not None:
        return Finding("gpu", "ok", f"{described}: the {served} bundle serves it")
    wanted = f"the {target.name} bundle serves {', '.join(target.isas)}" if target else "no bundle serves it"
    return Finding("gpu", "block", f"{described}: {wanted}", _gpu_fix(gpus, isa, targets, target, environ))


def _gpu_fix(
    gpus: list[amdgpu.GpuNode],
    isa: str | None,
    targets: Mapping[str, Target],
    target: Target | None,
    environ: Mapping[str, str],
) -> str:
    """Another GPU of this machine the bundle serves (made device 0), else the bundle that serves this one."""
    wanted = set(target.isas) if target else {isa for t in targets.values() for isa in t.isas}
    for position, other in enumerate(gpus):
        other_isa = _isa(other)
        if other_isa in wanted and environ.get("ROCR_VISIBLE_DEVICES") is None:
            return f"make KFD node {other.node}'s {other_isa} HIP's device 0: HIP_VISIBLE_DEVICES={position}"
    other_target = _serving(targets, isa) if isa else None
    if other_target is not None:
        return f"install the {other_target} bundle"
    return f"use a GPU a bundle serves ({', '.join(sorted(wanted))})"


# -- the kernel, the driver, the device nodes --------------------------------------------------------


def _read(path: Path) -> str | None:
    """A small text file (a page at most, a regular file only), stripped; None when it cannot be read."""
    try:
        return read_small_text(path).strip()
    except OSError:
        return None


def _kernel(root: Path) -> str:
    release = _read(root / OSRELEASE)
    return f"kernel {release}" if release else "the kernel (release unreadable)"


def _cwsr_check(root: Path, gpu: amdgpu.GpuNode) -> Finding:
    kernel = _kernel(root)
    if gpu.gfx_target_version != GFX1151:
        return Finding("cwsr", "ok", f"not needed: only gfx1151 needs the CWSR export ({kernel})")
    missing = [name for name in CWSR_PROPERTIES if name not in gpu.properties]
    if not missing:
        return Finding("cwsr", "ok", f"{kernel} exports cwsr_size and ctl_stack_size for the gfx1151")
    return Finding(
        "cwsr",
        "block",
        f"{kernel} does not export {' and '.join(missing)} for the gfx1151 (KFD node {gpu.node}): without them "
        "ROCm gets its VGPR count wrong and crashes",
        CWSR_FIX,
    )


def _dkms_signs(root: Path) -> list[str]:
    module = root / MODULES / "amdgpu"
    signs = []
    version = _read(module / "version")
    if version is not None:
        signs.append(f"module version {version}" if version else "a module version")
    taint = _read(module / "taint")
    if taint and "O" in taint:
        signs.append(f"taint {taint}")
    if (root / MODULES / "amdkcl").exists():
        signs.append("amdkcl loaded")
    return signs


def _driver_check(root: Path, isa: str | None) -> Finding:
    signs = _dkms_signs(root)
    if not signs:
        return Finding("driver", "ok", "amdgpu is the kernel's own driver (no module version, taint O or amdkcl)")
    message = f"amdgpu is AMD's out-of-tree amdgpu-dkms ({', '.join(signs)}), not the kernel's own driver"
    if isa in DKMS_CONFLICT_ISAS:
        return Finding("driver", "block", f"{message}: on a Ryzen AI / Strix Halo APU it conflicts with it", DKMS_FIX)
    return Finding("driver", "ok", f"{message}, as AMD's installer sets it up")


def _access_check(root: Path, gpu: amdgpu.GpuNode) -> Finding:
    render = gpu.render_node()
    if render is None:
        return Finding("access", "block", f"KFD node {gpu.node} names no render node (drm_render_minor)")
    problems = [problem for path in (root / "dev/kfd", root / render) if (problem := _open_problem(path))]
    if not problems:
        return Finding("access", "ok", f"{root / 'dev/kfd'} and {root / render} open read-write")
    missing = all("does not exist" in problem for problem in problems)
    fix = f"in a container, pass {CONTAINER_DEVICES}" if missing else GROUPS_FIX
    return Finding("access", "block", "; ".join(problems), fix)


def _open_problem(path: Path) -> str | None:
    """Why ``path`` does not open read-write for this user (None: it does). Opened for real: an ACL or
    a capability grants what the mode bits alone do not show."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY))
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM):
            return f"cannot open {path} read-write: {err.strerror} ({_ownership(path)})"
        return f"cannot open {path} read-write: {err.strerror}"
    return None


def _ownership(path: Path) -> str:
    try:
        info = path.stat()
    except OSError:
        return "owner unknown"
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    return f"group {group}, mode {stat.filemode(info.st_mode)}"


# -- memory -----------------------------------------------------------------------------------------------


def _memory_check(root: Path, gpu: amdgpu.GpuNode, utilization: float | None) -> Finding:
    try:
        pool = amdgpu.memory_pool(root, gpu)
    except amdgpu.Unreadable as err:
        return Finding("memory", "warn", f"cannot read HIP device 0's memory ({err}); vLLM checks it at start")
    if pool.total <= 0:
        return Finding("memory", "warn", "HIP device 0 reports no memory; vLLM checks it at start")
    has = f"HIP device 0 has {gpu_memory.describe(pool)}"
    if utilization is None:
        chosen = gpu_memory.choose(pool)
        if chosen is None:
            return Finding("memory", "block", f"{has}: {gpu_memory.too_little(pool)}", "close what holds GPU memory")
        passes = f"{has}; vllm-server will pass --gpu-memory-utilization {chosen:.2f}"
        if not gpu_memory.leaves_headroom(pool, chosen):
            return Finding(
                "memory",
                "warn",
                f"{passes}, all that fits now: no headroom left for what other programs allocate",
                "close what holds GPU memory",
            )
        return Finding("memory", "ok", passes)
    needed = math.ceil(pool.total * utilization)
    asked = f"--gpu-memory-utilization {utilization:g} needs {needed / GIB:.1f} GiB free at start"
    if pool.free >= needed:
        return Finding("memory", "ok", f"{has}; {asked}")
    largest = gpu_memory.largest_fitting(pool)
    fix = "close what holds GPU memory"
    if largest is not None:
        fix = f"pass --gpu-memory-utilization {largest:.2f} or less, or {fix}"
    return Finding("memory", "block", f"{has}, but {asked} (vLLM refuses to start)", fix)
