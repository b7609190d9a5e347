"""Which GPU ISAs a native extension carries code objects for: the clang offload bundles in its
``.hip_fatbin`` section, plain (``__CLANG_OFFLOAD_BUNDLE__``) or compressed (``CCOB``, zlib or zstd:
vLLM builds with ``--offload-compress``). Hand-written because no Python library reads this format
(LLVM's clang-offload-bundler is a C++ tool); the layout follows clang's ClangOffloadBundler docs.
"""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import zstandard
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

PLAIN = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED = b"CCOB"
SECTION = ".hip_fatbin"
ISA = re.compile(r"amdgcn-amd-amdhsa-+(gfx[0-9a-z]+)")
MAX_ENTRIES = 4096  # a sanity bound while reading a header of unknown origin


def fatbin_isas(path: Path) -> set[str]:
    """The ISAs (``gfx1151``, without target features) of every code object in ``path``'s fat binary."""
    try:
        with path.open("rb") as handle:
            section = ELFFile(handle).get_section_by_name(SECTION)
            data = section.data() if section is not None else b""
    except (ELFError, OSError, ValueError):
        return set()
    return bundle_isas(data)


def bundle_isas(data: bytes) -> set[str]:
    isas: set[str] = set()
    for start in _offsets(data, PLAIN):
        isas |= _plain_entries(data, start)
    for start in _offsets(data, COMPRESSED):
        isas |= bundle_isas(_decompress(data, start))
    return isas


def _offsets(data: bytes, magic: bytes) -> list[int]:
    return [match.start() for match in re.finditer(re.escape(magic), data)]


def _plain_entries(data: bytes, start: int) -> set[str]:
    """Entry ids of a plain bundle: magic, entry count, then (offset, size, id length, id) per entry."""
    isas: set[str] = set()
    try:
        (count,) = struct.unpack_from("<Q", data, start + len(PLAIN))
        position = start + len(PLAIN) + 8
        for _ in range(min(count, MAX_ENTRIES)):
            _offset, _size, id_length = struct.unpack_from("<QQQ", data, position)
            position += 24
            entry = data[position : position + id_length].decode("ascii", errors="replace")
            position += id_length
            match = ISA.search(entry)
            if match:
                isas.add(match.group(1))
    except struct.error:
        pass
    return isas


def _decompress(data: bytes, start: int) -> bytes:
    """A compressed bundle: magic, version, method (0 zlib, 1 zstd), sizes (their width depends on the
    version), a hash, then the compressed plain bundle."""
    try:
        version, method = struct.unpack_from("<HH", data, start + 4)
        header = {1: 4 + 2 + 2 + 4 + 8, 2: 4 + 2 + 2 + 4 + 4 + 8, 3: 4 + 2 + 2 + 8 + 8 + 8}.get(version)
        if header is None:
            return b""
        payload = data[start + header :]
        if method == 0:
            return zlib.decompressobj().decompress(payload)
        if method == 1:
            return zstandard.ZstdDecompressor().decompressobj().decompress(payload)
    except (struct.error, zlib.error, zstandard.ZstdError):
        pass
    return b""
