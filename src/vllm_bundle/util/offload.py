"""Which GPU ISAs a native extension carries code objects for: the clang offload bundles in its
``.hip_fatbin`` section, plain (``__CLANG_OFFLOAD_BUNDLE__``) or compressed (``CCOB``, zlib or zstd:
vLLM builds with ``--offload-compress``). Hand-written because no Python library reads this format
(LLVM's clang-offload-bundler is a C++ tool); the layout follows clang's ClangOffloadBundler docs.

An entry counts for the ISA its id names only when what it points at is an AMDGPU code object for that
ISA: a 64-bit little-endian ELF of the HSA OS ABI for ``EM_AMDGPU`` whose ``e_flags`` machine field is
the ISA's (:data:`AMDGPU_MACH`). An entry that lies, is empty or holds another ISA's code never passes
for the ISA it names.

Memory stays bounded whatever the section's size (ROCm's and PyTorch's libraries carry fat binaries of
1-2 GB): the section is scanned CHUNK bytes at a time; of a plain bundle its header and each code
object's ELF header are read; a compressed one is inflated as a stream (its first MAX_INFLATED bytes
held, where the inner bundle's header is), skipping forward to each code object's header.
"""

from __future__ import annotations

import io
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

import zstandard
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

PLAIN = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED = b"CCOB"
SECTION = ".hip_fatbin"
ISA = re.compile(r"amdgcn-amd-amdhsa-+(gfx[0-9a-z]+)")
MAX_ENTRIES = 4096  # sanity bounds while reading a header of unknown origin
MAX_ID_LENGTH = 4096
CHUNK = 8 << 20  # bytes scanned at a time
OVERLAP = max(len(PLAIN), len(COMPRESSED)) - 1  # read past each chunk, so a magic straddling two is found
MAX_INFLATED = 4 << 20  # of a compressed bundle's plain bundle, far more than its header needs
# bytes before a compressed bundle's payload, by format version: magic, version, method, sizes (4 bytes
# each before version 3, 8 from it; version 1 has no total size), hash
COMPRESSED_HEADERS = {1: 4 + 2 + 2 + 4 + 8, 2: 4 + 2 + 2 + 4 + 4 + 8, 3: 4 + 2 + 2 + 8 + 8 + 8}

Read = Callable[[int, int], bytes]  # (offset, size) -> at most size bytes of a region from offset

#: ``EF_AMDGPU_MACH_AMDGCN_*``: the ISA an AMDGPU ELF's ``e_flags & EF_AMDGPU_MACH`` names, from LLVM's
#: llvm/include/llvm/BinaryFormat/ELF.h. tests/test_offload.py checks each against a real code object the
#: real ziglang 0.17.1's clang compiles for it. Every ISA of every target is here.
AMDGPU_MACH = {
    "gfx900": 0x02C,
    "gfx906": 0x02F,
    "gfx908": 0x030,
    "gfx90a": 0x03F,
    "gfx942": 0x04C,
    "gfx950": 0x04F,
    "gfx1010": 0x033,
    "gfx1030": 0x036,
    "gfx1036": 0x045,
    "gfx1100": 0x041,
    "gfx1101": 0x046,
    "gfx1102": 0x047,
    "gfx1103": 0x044,
    "gfx1150": 0x043,
    "gfx1151": 0x04A,
    "gfx1152": 0x055,
    "gfx1153": 0x058,
    "gfx1200": 0x048,
    "gfx1201": 0x04E,
}
EF_AMDGPU_MACH = 0x0FF
EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
ELF_HEADER = 64  # bytes of an ELF64 header: all a code object's ISA needs


def fatbin_isas(path: Path) -> set[str]:
    """The ISAs (``gfx1151``, without target features) of every code object in ``path``'s fat binary."""
    try:
        with path.open("rb") as handle:
            section = ELFFile(handle).get_section_by_name(SECTION)
            if section is None or section["sh_type"] == "SHT_NOBITS":
                return set()
            return _isas(_file_reader(handle, section["sh_offset"], section["sh_size"]), section["sh_size"])
    except (ELFError, OSError, ValueError):
        return set()


def bundle_isas(data: bytes) -> set[str]:
    """The ISAs of every code object in the offload bundles found in ``data``."""
    return _isas(_buffer_reader(data), len(data))


def _buffer_reader(data: bytes) -> Read:
    return lambda offset, size: data[offset : offset + size]


def _file_reader(handle: io.BufferedReader, start: int, size: int) -> Read:
    """Reads of the ``size`` bytes of ``handle`` from ``start``, never past them."""

    def read(offset: int, length: int) -> bytes:
        handle.seek(start + offset)
        return handle.read(max(0, min(length, size - offset)))

    return read


def _isas(read: Read, size: int) -> set[str]:
    """The ISAs of the bundles in a region whose code objects are that ISA's. A compressed bundle holds
    one plain bundle (clang compresses what it bundled), read from its start as it inflates."""
    isas: set[str] = set()
    for start, magic in _magics(read, size):
        if magic == PLAIN:
            entries = _plain_entries(read, start)
            isas |= {isa for isa, offset in entries if _is_code_for(read(start + offset, ELF_HEADER), isa)}
        else:
            isas |= _compressed_isas(read, start, size)
    return isas


def _is_code_for(header: bytes, isa: str) -> bool:
    """``header`` (an entry's first bytes) starts an AMDGPU HSA code object (ELF64, little-endian) for ``isa``."""
    if len(header) < ELF_HEADER or header[:4] != b"\x7fELF" or header[4:6] != b"\x02\x01":
        return False
    (machine,) = struct.unpack_from("<H", header, 18)
    (flags,) = struct.unpack_from("<I", header, 48)
    return (
        header[7] == ELFOSABI_AMDGPU_HSA
        and machine == EM_AMDGPU
        and int(flags) & EF_AMDGPU_MACH == AMDGPU_MACH.get(isa)
    )


def _magics(read: Read, size: int) -> Iterator[tuple[int, bytes]]:
    """Where each magic occurs in a region, read CHUNK bytes (and the OVERLAP after them) at a time."""
    for base in range(0, size, CHUNK):
        window = read(base, CHUNK + OVERLAP)
        for magic in (PLAIN, COMPRESSED):
            found = window.find(magic)
            while 0 <= found < CHUNK:  # one starting in the overlap is the next chunk's
                yield base + found, magic
                found = window.find(magic, found + len(magic))
        if len(window) <= CHUNK:  # the file ended before the size its section header claims
            return


def _fields(read: Read, offset: int, layout: str) -> tuple[int, ...] | None:
    """The little-endian integers ``layout`` reads at ``offset``; None past the region's end."""
    data = read(offset, struct.calcsize(layout))
    return struct.unpack(layout, data) if len(data) == struct.calcsize(layout) else None


def _plain_entries(read: Read, start: int) -> list[tuple[str, int]]:
    """(ISA, offset from the bundle's start) of each GPU entry of a plain bundle, from its header: magic,
    entry count, then (offset, size, id length, id) per entry. An entry too small for an ELF header is
    left out."""
    entries: list[tuple[str, int]] = []
    position = start + len(PLAIN)
    counted = _fields(read, position, "<Q")
    position += 8
    for _ in range(min(counted[0], MAX_ENTRIES) if counted else 0):
        entry = _fields(read, position, "<QQQ")
        if entry is None or entry[2] > MAX_ID_LENGTH:
            break
        match = ISA.search(read(position + 24, entry[2]).decode("ascii", errors="replace"))
        position += 24 + entry[2]
        if match and entry[1] >= ELF_HEADER:
            entries.append((match.group(1), entry[0]))
    return entries


def _compressed_isas(read: Read, start: int, size: int) -> set[str]:
    """The ISAs of the plain bundle a compressed one inflates to: its header from the first MAX_INFLATED
    bytes, then each code object's ELF header, inflating forward to it (holding no more than a CHUNK of
    what lies between)."""
    stream = _inflating(read, start, size)
    if stream is None:
        return set()
    isas: set[str] = set()
    try:
        head = stream.read(MAX_INFLATED)
        if not head.startswith(PLAIN):
            return set()
        position = len(head)
        for isa, offset in sorted(_plain_entries(_buffer_reader(head), 0), key=lambda entry: entry[1]):
            if offset + ELF_HEADER <= len(head):
                header = head[offset : offset + ELF_HEADER]
            elif offset < position:
                continue  # overlaps what was passed already: no bundle clang writes
            else:
                position += _skip(stream, offset - position)
                header = stream.read(ELF_HEADER)
                position += len(header)
            if _is_code_for(header, isa):
                isas.add(isa)
    except (zlib.error, zstandard.ZstdError, OSError):
        pass  # what was read up to the damage counts
    return isas


def _skip(stream: _Inflating, count: int) -> int:
    """Read and drop ``count`` bytes of ``stream``, a CHUNK at a time; the bytes dropped."""
    dropped = 0
    while dropped < count:
        data = stream.read(min(CHUNK, count - dropped))
        if not data:
            break
        dropped += len(data)
    return dropped


class _Inflating(Protocol):
    """What a compressed bundle inflates to, read forward: ``read(n)`` gives at most n bytes, fewer only
    at its end."""

    def read(self, size: int, /) -> bytes: ...


def _inflating(read: Read, start: int, size: int) -> _Inflating | None:
    """What a compressed bundle holds, as a stream: magic, version, method (0 zlib, 1 zstd), sizes, a hash
    (COMPRESSED_HEADERS), then the compressed plain bundle, up to the region's end."""
    fields = _fields(read, start + len(COMPRESSED), "<HH")
    if fields is None or fields[0] not in COMPRESSED_HEADERS:
        return None
    payload = io.BufferedReader(_Stream(read, start + COMPRESSED_HEADERS[fields[0]], size))
    if fields[1] == 0:
        return _ZlibStream(payload)
    if fields[1] == 1:
        # One frame (the next would start on what follows it). zstd's own window is bounded too: its
        # decoder refuses frames whose window exceeds 128 MiB.
        return zstandard.ZstdDecompressor().stream_reader(payload, read_across_frames=False)
    return None


class _ZlibStream:
    """zlib's inflater as a stream (zlib has no reader of its own over a file)."""

    def __init__(self, payload: BinaryIO) -> None:
        self._payload, self._inflater = payload, zlib.decompressobj()

    def read(self, size: int, /) -> bytes:
        out = bytearray()
        while len(out) < size and not self._inflater.eof:
            data = self._inflater.unconsumed_tail or self._payload.read(CHUNK)
            if not data:
                break
            out += self._inflater.decompress(data, size - len(out))
        return bytes(out)


class _Stream(io.RawIOBase):
    """A region from ``offset`` to ``end`` as a file, for the decompressors to read at their own pace."""

    def __init__(self, read: Read, offset: int, end: int) -> None:
        super().__init__()
        self._read, self._offset, self._end = read, offset, end

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        with memoryview(buffer) as view, view.cast("B") as bytes_view:
            data = self._read(self._offset, max(0, min(len(bytes_view), self._end - self._offset)))
            bytes_view[: len(data)] = data
        self._offset += len(data)
        return len(data)
