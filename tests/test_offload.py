"""Reading the GPU ISAs of a fat binary: real clang-19 code objects, plain and compressed, in memory bounded
whatever the size of the ``.hip_fatbin`` section (ROCm's and PyTorch's libraries carry 1-2 GB of it)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import zstandard
from elftools.elf.elffile import ELFFile

from tests.code_objects import offload_bundle
from tests.upstream.therock import HIP_RUNTIME_H, host_compiler
from vllm_bundle.util import offload
from vllm_bundle.util.offload import bundle_isas, fatbin_isas

MEMORY_LIMIT = 512 << 20  # the address space the reader runs in: less than the fat binaries below
HUGE = 1 << 30
# real code objects: a plain bundle, and what vLLM's --offload-compress makes (format version 2, zstd)
OBJECTS = {"plain": ({"gfx90a"}, []), "compressed": ({"gfx1100", "gfx1151"}, ["--offload-compress"])}


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("code-objects")
    (root / "hip").mkdir()
    (root / "hip" / "hip_runtime.h").write_bytes(HIP_RUNTIME_H)
    source = root / "k.hip"
    source.write_text('#include <hip/hip_runtime.h>\nextern "C" __global__ void k(float *a) { a[0] = 1; }\n')
    built = {}
    for name, (isas, flags) in OBJECTS.items():
        arches = [f"--offload-arch={isa}" for isa in sorted(isas)]
        command = [host_compiler("clang++"), "-x", "hip", *arches, *flags, "-nogpulib", "-nogpuinc", f"-I{root}"]
        subprocess.run([*command, "-c", str(source), "-o", str(root / f"{name}.o")], check=True)
        built[name] = root / f"{name}.o"
    return built


def _fatbin(path: Path) -> bytes:
    with path.open("rb") as handle:
        section = ELFFile(handle).get_section_by_name(".hip_fatbin")
        assert section is not None
        return bytes(section.data())


def _relocate_fatbin(path: Path, fatbin: bytes, padding: int, claimed: int | None = None) -> None:
    """``path``'s ``.hip_fatbin`` made ``padding`` zero bytes then ``fatbin``, at the file's end: the zeros
    are a hole, so a section of any size costs next to no disk. ``claimed``: the size its header says."""
    with path.open("r+b") as handle:
        elf = ELFFile(handle)
        index = next(i for i, section in enumerate(elf.iter_sections()) if section.name == ".hip_fatbin")
        header = elf["e_shoff"] + index * elf["e_shentsize"]
        end = handle.seek(0, os.SEEK_END)
        handle.seek(end + padding)
        handle.write(fatbin)
        handle.seek(header + 24)  # Elf64_Shdr: sh_offset, then sh_size
        handle.write(struct.pack("<QQ", end, padding + len(fatbin) if claimed is None else claimed))


def _isas_in_bounded_memory(path: Path) -> str:
    """fatbin_isas(path) in a process whose address space is MEMORY_LIMIT: the ISAs, comma-separated."""
    script = (
        f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT}))\n"
        "import sys; from pathlib import Path; from vllm_bundle.util.offload import fatbin_isas\n"
        "print(','.join(sorted(fatbin_isas(Path(sys.argv[1])))))\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def _compressed(bundle_parts: list[bytes], *, version: int, method: int) -> bytes:
    """A compressed bundle (``CCOB``) of the concatenated parts, compressed a part at a time so a huge
    one costs little memory: zlib (method 0) or zstd (1), header of format ``version`` (1 to 3)."""
    compressor = zlib.compressobj(1) if method == 0 else zstandard.ZstdCompressor().compressobj()
    payload = b"".join([*(compressor.compress(part) for part in bundle_parts), compressor.flush()])
    size = sum(len(part) for part in bundle_parts)
    sizes = {1: struct.pack("<I", size), 2: struct.pack("<II", 24 + len(payload), size)}
    header = sizes.get(version, struct.pack("<QQ", 32 + len(payload), size))
    return b"CCOB" + struct.pack("<HH", version, method) + header + struct.pack("<Q", 0) + payload


def test_a_huge_fat_binary_is_read_in_bounded_memory(objects: dict[str, Path], tmp_path: Path) -> None:
    """1 GiB of section before the real bundles, plain and compressed: given 512 MiB, the reader still
    finds their ISAs."""
    path = tmp_path / "huge.o"
    shutil.copyfile(objects["plain"], path)
    try:
        _relocate_fatbin(path, _fatbin(objects["plain"]) + _fatbin(objects["compressed"]), HUGE)
        assert _isas_in_bounded_memory(path) == "gfx1100,gfx1151,gfx90a"
    finally:
        path.unlink()  # a hole, but a 1 GiB one to anything that copies it


@pytest.mark.parametrize("method", [0, 1], ids=["zlib", "zstd"])
def test_a_bundle_inflating_past_memory_is_read_in_bounded_memory(
    objects: dict[str, Path], tmp_path: Path, method: int
) -> None:
    """A small compressed bundle whose plain bundle is 768 MiB: only the start of it, its header, is
    inflated."""
    zeros = bytes(8 << 20)
    inner = [_fatbin(objects["plain"]), *[zeros] * 96]
    path = tmp_path / "inflating.o"
    shutil.copyfile(objects["plain"], path)
    _relocate_fatbin(path, _compressed(inner, version=2, method=method), 0)
    assert _isas_in_bounded_memory(path) == "gfx90a"


def test_a_magic_straddling_two_scan_chunks_is_found(
    objects: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offload, "CHUNK", 64)
    for kind, (isas, _flags) in OBJECTS.items():
        fatbin = _fatbin(objects[kind])
        for padding in range(64 - len(offload.PLAIN), 64 + 1):  # from wholly in the first chunk to the second
            path = tmp_path / f"{kind}-{padding}.o"
            shutil.copyfile(objects[kind], path)
            _relocate_fatbin(path, fatbin, padding)
            assert fatbin_isas(path) == isas, (kind, padding)
            assert bundle_isas(bytes(padding) + fatbin) == isas, (kind, padding)


def test_a_section_is_read_to_the_files_end_whatever_size_its_header_claims(
    objects: dict[str, Path], tmp_path: Path
) -> None:
    path = tmp_path / "claims-more.o"
    shutil.copyfile(objects["compressed"], path)
    _relocate_fatbin(path, _fatbin(objects["compressed"]), 100, claimed=1 << 62)
    assert fatbin_isas(path) == {"gfx1100", "gfx1151"}


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("method", [0, 1], ids=["zlib", "zstd"])
def test_each_compressed_bundle_format_is_read(version: int, method: int, code_objects: dict[str, bytes]) -> None:
    plain = offload_bundle({"gfx90a": code_objects["gfx90a"]})
    inner = offload_bundle({isa: code_objects[isa] for isa in ("gfx942", "gfx1151")})
    compressed = _compressed([inner], version=version, method=method)
    assert bundle_isas(plain + bytes(100) + compressed + b"trailing bytes") == {"gfx90a", "gfx942", "gfx1151"}


def test_a_header_of_unknown_origin_is_read_within_bounds(code_objects: dict[str, bytes]) -> None:
    """An entry count of 2**64 - 1 stops at the data's end; an id longer than any real one ends the header."""
    entry = b"hipv4-amdgcn-amd-amdhsa--gfx1100"
    code = code_objects["gfx1100"]
    header = b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", 2**64 - 1)
    first = struct.pack("<QQQ", 0, len(code), len(entry)) + entry
    table = first + struct.pack("<QQQ", 0, 4, 1 << 40) + entry
    at = len(header) + len(table)
    table = struct.pack("<QQQ", at, len(code), len(entry)) + entry + table[len(first) :]
    assert bundle_isas(header + table + code) == {"gfx1100"}
    assert bundle_isas(header + table[: len(table) // 2]) == set(), (
        "an entry whose code is not there counts for nothing"
    )


# -- an entry counts for its ISA only when it holds that ISA's code object (#33) -------------------------


def test_the_machine_table_is_what_a_real_compiler_writes(code_objects: dict[str, bytes]) -> None:
    """offload.AMDGPU_MACH (LLVM's EF_AMDGPU_MACH_AMDGCN_*) against real code objects of the real
    ziglang's clang, for every ISA of every target (gfx950 included) and gfx90a."""
    for isa, code in code_objects.items():
        assert code[:4] == b"\x7fELF" and struct.unpack_from("<H", code, 18)[0] == offload.EM_AMDGPU, isa
        assert struct.unpack_from("<I", code, 48)[0] & offload.EF_AMDGPU_MACH == offload.AMDGPU_MACH[isa], isa


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "compressed"])
def test_every_target_isa_is_read_from_its_real_code_object(code_objects: dict[str, bytes], compressed: bool) -> None:
    bundle = offload_bundle(code_objects)
    data = _compressed([bundle], version=2, method=1) if compressed else bundle
    assert bundle_isas(data) == set(code_objects)


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "compressed"])
def test_an_entry_that_is_not_its_isas_code_object_does_not_count(
    code_objects: dict[str, bytes], compressed: bool
) -> None:
    """The id says gfx950; the bytes are gfx942's, a bare ELF magic, a host ELF, nothing, or an AMDGPU
    ELF of another OS ABI: none passes for gfx950 (a bundle that cannot run there never does)."""
    gfx942 = code_objects["gfx942"]
    not_hsa = bytearray(code_objects["gfx950"])
    not_hsa[7] = 0
    with open(sys.executable, "rb") as host:
        host_elf = host.read(4096)
    for lie in (gfx942, b"\x7fELF", host_elf, b"", bytes(not_hsa)):
        bundle = offload_bundle({"gfx950": lie, "gfx1151": code_objects["gfx1151"]})
        data = _compressed([bundle], version=2, method=1) if compressed else bundle
        assert bundle_isas(data) == {"gfx1151"}, lie[:8]


def test_a_compressed_bundle_is_read_to_its_last_code_object_in_bounded_memory(
    code_objects: dict[str, bytes],
) -> None:
    """Code objects far past the inflated head (64 MiB of other code first) are reached by inflating
    forward, a chunk at a time: given 512 MiB of address space, the reader still checks them."""
    # first an entry of 64 MiB for an ISA no target has (its bytes are no code object, and never asked for)
    entries = {"gfx1036": bytes(64 << 20), "gfx950": code_objects["gfx950"], "gfx1201": code_objects["gfx1201"]}
    data = _compressed([offload_bundle(entries)], version=3, method=0)
    assert len(data) < 1 << 20
    script = (
        f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT}))\n"
        "import sys; from vllm_bundle.util.offload import bundle_isas\n"
        "print(','.join(sorted(bundle_isas(sys.stdin.buffer.read()))))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], input=data, capture_output=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.decode().strip() == "gfx1201,gfx950"
