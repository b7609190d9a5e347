"""Which GPU ISAs a native extension carries code objects for: the clang offload bundles in its
``.hip_fatbin`` section, plain (``__CLANG_OFFLOAD_BUNDLE__``) or compressed (``CCOB``, zlib or zstd:
vLLM builds with ``--offload-compress``). Hand-written because no Python library reads this format
(LLVM's clang-offload-bundler is a C++ tool); the layout follows clang's ClangOffloadBundler docs.

Memory stays bounded whatever the section's size (ROCm's and PyTorch's libraries carry fat binaries of
1-2 GB): the section is scanned CHUNK bytes at a time, of a plain bundle only its header is read, and of
a compressed one only the first MAX_INFLATED bytes are inflated (the inner bundle's header comes first).
"""

from __future__ import annotations

import io
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

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


def _isas(read: Read, size: int, *, inflate: bool = True) -> set[str]:
    """The ISAs of the bundles in a region. What a compressed bundle inflates to is searched only for plain
    ones (clang compresses a plain bundle), so one inflated prefix at most is held at a time."""
    isas: set[str] = set()
    for start, magic in _magics(read, size):
        if magic == PLAIN:
            isas |= _plain_entries(read, start)
        elif inflate:
            inflated = _inflate(read, start, size)
            isas |= _isas(_buffer_reader(inflated), len(inflated), inflate=False)
    return isas


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


def _plain_entries(read: Read, start: int) -> set[str]:
    """Entry ids of a plain bundle: magic, entry count, then (offset, size, id length, id) per entry. Only
    this header is read, not the code objects it points at."""
    isas: set[str] = set()
    position = start + len(PLAIN)
    counted = _fields(read, position, "<Q")
    position += 8
    for _ in range(min(counted[0], MAX_ENTRIES) if counted else 0):
        entry = _fields(read, position, "<QQQ")
        if entry is None or entry[2] > MAX_ID_LENGTH:
            break
        match = ISA.search(read(position + 24, entry[2]).decode("ascii", errors="replace"))
        position += 24 + entry[2]
        if match:
            isas.add(match.group(1))
    return isas


def _inflate(read: Read, start: int, size: int) -> bytes:
    """The first MAX_INFLATED bytes of what a compressed bundle holds: magic, version, method (0 zlib,
    1 zstd), sizes, a hash (COMPRESSED_HEADERS), then the compressed plain bundle, up to the region's end."""
    fields = _fields(read, start + len(COMPRESSED), "<HH")
    if fields is None or fields[0] not in COMPRESSED_HEADERS:
        return b""
    payload = io.BufferedReader(_Stream(read, start + COMPRESSED_HEADERS[fields[0]], size))
    try:
        if fields[1] == 0:
            return _inflate_zlib(payload)
        if fields[1] == 1:
            return _inflate_zstd(payload)
    except (zlib.error, zstandard.ZstdError):
        pass
    return b""


def _inflate_zlib(payload: BinaryIO) -> bytes:
    inflater = zlib.decompressobj()
    inflated = bytearray()
    while len(inflated) < MAX_INFLATED and not inflater.eof:
        data = inflater.unconsumed_tail or payload.read(CHUNK)
        if not data:
            break
        inflated += inflater.decompress(data, MAX_INFLATED - len(inflated))
    return bytes(inflated)


def _inflate_zstd(payload: BinaryIO) -> bytes:
    """One read: it stops short only at the frame's end (the next would start on what follows it). zstd's
    own window is bounded too: its decoder refuses frames whose window exceeds 128 MiB."""
    return zstandard.ZstdDecompressor().stream_reader(payload, read_across_frames=False).read(MAX_INFLATED)


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
