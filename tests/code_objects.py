"""Real AMDGPU code objects for any ISA, gfx950 included, and clang offload bundles of them.

The compiler is the clang inside the real ziglang 0.17.1 wheel (tests/upstream/real_wheels.py: the
production recipe's C toolchain, which the suite downloads anyway): LLVM with the AMDGPU backend, new
enough for gfx950, which Debian's clang-19 does not know. A kernel is compiled for the ISA and linked
into a shared object, as an HSA code object is (``zig clang --target=amdgcn-amd-amdhsa -mcpu=<isa>
-mcode-object-version=5 -nogpulib -c``, then ``zig ld.lld -shared``); ``zig cc`` itself refuses GPU
targets, and ``-nogpulib`` stands for ROCm's device libraries, which a kernel of one store does not need.

The bundle is laid out as clang-offload-bundler writes it (clang's ClangOffloadBundler docs): the magic,
the entry count, then offset, size, id length and id of each entry (a host entry first, empty), and the
code objects after the header.
"""

from __future__ import annotations

import struct
import subprocess
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.upstream.real_wheels import ZIGLANG, fetch_pinned

KERNEL = "__attribute__((amdgpu_kernel)) void vllm_bundle_fixture_kernel(int *out) { *out = 42; }\n"
HOST_ENTRY = "host-x86_64-unknown-linux-gnu-"


def real_zig(downloads: Path, work: Path) -> Path:
    """The ``zig`` binary of the real ziglang wheel (fetched once into ``downloads``), under ``work``."""
    wheel = fetch_pinned(downloads, [ZIGLANG])[ZIGLANG.filename]
    zig = work / "ziglang" / "zig"
    if not zig.exists():
        with zipfile.ZipFile(wheel) as archive:
            archive.extract("ziglang/zig", work)
        zig.chmod(0o755)
    return zig


def compile_code_object(zig: Path, isa: str, work: Path) -> bytes:
    """A real HSA code object holding one kernel, for ``isa``."""
    source, obj, shared = work / "kernel.c", work / f"{isa}.o", work / f"{isa}.hsaco"
    source.write_text(KERNEL)
    target = ["--target=amdgcn-amd-amdhsa", f"-mcpu={isa}", "-mcode-object-version=5", "-nogpulib", "-O2"]
    subprocess.run([zig, "clang", *target, "-c", source, "-o", obj], check=True, capture_output=True, timeout=120)
    subprocess.run([zig, "ld.lld", "-shared", obj, "-o", shared], check=True, capture_output=True, timeout=120)
    return shared.read_bytes()


def compile_code_objects(zig: Path, isas: Iterable[str], work: Path) -> dict[str, bytes]:
    work.mkdir(parents=True, exist_ok=True)
    return {isa: compile_code_object(zig, isa, work) for isa in sorted(set(isas))}


def offload_bundle(entries: Mapping[str, bytes]) -> bytes:
    """A plain clang offload bundle: a host entry, then one ``hipv4-amdgcn-amd-amdhsa--<isa>`` entry per
    item of ``entries`` (ISA -> the bytes the entry holds, normally that ISA's code object)."""
    ids = [(HOST_ENTRY, b""), *((f"hipv4-amdgcn-amd-amdhsa--{isa}", data) for isa, data in entries.items())]
    header_size = 24 + 8 + sum(24 + len(name) for name, _ in ids)
    offset, table, body = header_size, b"", b""
    for name, data in ids:
        table += struct.pack("<QQQ", offset, len(data), len(name)) + name.encode()
        body += data
        offset += len(data)
    return b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(ids)) + table + body
