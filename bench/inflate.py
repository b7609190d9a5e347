"""TheRock's wheels at real size: the fixture upstream's wheels grown, before the lock, with what makes
the real ones big (:mod:`bench.tree`'s padding: machine code, incompressible device code, many small
``.py`` files), each wheel's RECORD and every index's hashes rewritten, so that the lock pins them and
the pipeline downloads, verifies, installs, builds against, archives and layers them as it would the
real ones. What each wheel is grown by is :data:`PADDING`."""

from __future__ import annotations

import base64
import dataclasses
import fnmatch
import hashlib
import io
import random
import tarfile
import tomllib
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from tests.upstream.fixture import Fixture, flat_mirror, write_index

from bench.tree import LARGEST, elf_blocks, machine_code, python_sources, random_blocks, tiny_library

Blocks = Callable[[], Iterator[bytes]]


@dataclass(frozen=True)
class Padding:
    """What the wheel of every locked project matching ``projects`` (fnmatch) is grown by: ``size``
    bytes (installed) of ``kind`` under ``folder`` in the wheel. ``elf``: machine code, compressible as
    library code is; ``kpack``: compressed device code, one wheel per ISA (a target of four ISAs
    downloads and installs four); ``python``: small sources; ``devel``: members of
    ``rocm_sdk_devel/_devel.tar``, which the build expands and the bundle never ships."""

    projects: str
    kind: str
    size: int
    folder: str


#: Real wheels are not reachable from here (AMD's indexes are not; PyPI holds only name placeholders), so
#: each size is the largest published download size found for the wheel (docs/ci.md, "The release
#: job's disk and memory", cites each), installed at 2.5x that for machine code (what the padding's
#: machine code compresses to: 0.4) and 1x for device code (compressed already). ``projects`` are
#: fnmatch patterns over the locked names; a target with four ISAs gets four per-ISA wheels.
MB = 10**6
PADDING: tuple[Padding, ...] = (
    # ~700 MB (ROCm/TheRock RELEASES.md, torch[device-gfx1100] download table)
    Padding("rocm-sdk-core", "elf", int(2.5 * 700 * MB), "_rocm_sdk_core/lib"),
    # 253 MiB: rocm-sdk-libraries-gfx1151 with its device code (ROCm/TheRock#3046)
    Padding("rocm-sdk-libraries", "elf", int(2.5 * 265 * MB), "_rocm_sdk_libraries/lib"),
    # 63-481 MB per ISA (pytorch/pytorch#193979): the largest
    Padding("rocm-sdk-device-*", "kpack", 481 * MB, "_rocm_sdk_libraries/.kpack"),
    # no published size: as large as core's compiler and runtime again, expanded by the build only
    Padding("rocm-sdk-devel", "devel", int(2.5 * 700 * MB), "_rocm_sdk_devel/lib"),
    # 431 MB: torch 2.10's host wheel after the split (ROCm/rocm-systems#3855)
    Padding("torch", "elf", int(2.5 * 400 * MB), "torch/lib"),
    Padding("torch", "python", int(2.5 * 31 * MB), "torch"),
    # per ISA: 672 MB (gfx1100) and 2.0 GB (gfx942) downloaded with that 431 MB host (ROCm/rocm-systems#3855)
    Padding("amd-torch-device-gfx1[0-9][0-9][0-9]", "kpack", 241 * MB, "torch/.kpack"),
    Padding("amd-torch-device-gfx9[0-9][0-9]", "kpack", 1569 * MB, "torch/.kpack"),
    # aotriton's images for a family: 436 MB for gfx110X (ROCm/TheRock#1077)
    Padding("amd-torch-device-gfx1[0-9][0-9]x", "kpack", 436 * MB, "torch/lib/aotriton.images"),
    Padding("amd-torch-device-gfx12-0", "kpack", 436 * MB, "torch/lib/aotriton.images"),
    # 305 MiB (ROCm/TheRock#3046)
    Padding("triton", "elf", int(2.5 * 320 * MB), "triton/_C"),
)


def record_row(name: str, digest: bytes, size: int) -> str:
    encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return f"{name},sha256={encoded},{size}"


def inflate_wheel(wheel: Path, additions: Sequence[tuple[str, Blocks, bool]]) -> int:
    """Rewrite ``wheel`` with ``additions`` (name inside the wheel, its bytes, compressed?) listed in its
    RECORD; returns the bytes added (uncompressed). The new wheel replaces the old one whole."""
    partial = wheel.with_name(wheel.name + ".partial")
    added = 0
    with zipfile.ZipFile(wheel) as old, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as new:
        (record,) = [n for n in old.namelist() if n.endswith(".dist-info/RECORD")]
        replaced = {name for name, _, _ in additions}
        rows = [row for row in old.read(record).decode().splitlines() if row.split(",")[0] not in replaced]
        for info in old.infolist():
            if info.filename != record and info.filename not in replaced:
                new.writestr(info, old.read(info))
        for name, blocks, compressed in additions:
            info = zipfile.ZipInfo(name, date_time=(2025, 11, 20, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            digest, size = hashlib.sha256(), 0
            with new.open(info, "w", force_zip64=True) as out:
                for block in blocks():
                    out.write(block)
                    digest.update(block)
                    size += len(block)
            rows.append(record_row(name, digest.digest(), size))
            added += size
        new.writestr(record, "\n".join(rows) + "\n")
    partial.replace(wheel)
    return added


def _python_files(budget: int, folder: str) -> list[tuple[str, int, Blocks]]:
    sources, written, copy = python_sources(), 0, 0
    files: list[tuple[str, int, Blocks]] = []
    while written < budget:
        for source in sources:
            data = source.read_bytes()
            files.append((f"{folder}/copy{copy}/{source.stem}{len(files)}.py", len(data), _constant(data)))
            written += len(data)
            if written >= budget:
                break
        copy += 1
    return files


def _constant(data: bytes) -> Blocks:
    return lambda: iter((data,))


def devel_tar(old: bytes, padding: Sequence[tuple[str, int, Blocks]]) -> Blocks:
    """``_devel.tar`` as it was, then the padding members (what the build expands and never ships)."""

    def blocks() -> Iterator[bytes]:
        yield old[: _end_of_members(old)]
        for name, size, member in padding:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = size, 0o644, 1763596800
            yield info.tobuf(tarfile.PAX_FORMAT)
            yield from member()
            yield b"\0" * (-size % tarfile.BLOCKSIZE)
        yield b"\0" * (2 * tarfile.BLOCKSIZE)

    return blocks


def _end_of_members(tar: bytes) -> int:
    """Where the end-of-archive marker of a (small) tar starts: after its last member."""
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.getmembers()
        return archive.offset


def _padding_files(
    padding: Padding, project: str, rng: random.Random, head: bytes, code: Iterator[bytes]
) -> list[tuple[str, int, Blocks]]:
    """The files one padding adds to ``project``'s wheel (named after it: wheels never share a file):
    ELF libraries of up to 2 GiB, kpack blobs of 256 MiB, or sources."""
    stem = "bench_padding_" + project.replace("-", "_")
    if padding.kind == "python":
        return _python_files(padding.size, f"{padding.folder}/{stem}")
    largest = LARGEST if padding.kind in ("elf", "devel") else 256 * 2**20
    files = []
    for index, offset in enumerate(range(0, padding.size, largest)):
        size = min(largest, padding.size - offset)
        if padding.kind == "kpack":
            seed = rng.getrandbits(64)
            files.append((f"{padding.folder}/{stem}_{index}.kpack", size, _seeded(size, seed)))
        else:
            files.append((f"{padding.folder}/lib{stem}_{index}.so", size, _elf(size, head, code)))
    return files


def _seeded(size: int, seed: int) -> Blocks:
    return lambda: random_blocks(size, random.Random(seed))


def _elf(size: int, head: bytes, code: Iterator[bytes]) -> Blocks:
    return lambda: elf_blocks(size, head, code)


def locked_wheels(pylock: Path) -> dict[str, str]:
    """Project name -> wheel file name, of every wheel a pylock pins."""
    doc = tomllib.loads(pylock.read_text())
    return {p["name"]: unquote(w["url"].rsplit("/", 1)[1]) for p in doc["packages"] for w in p.get("wheels", [])}


def grow_wheels(fixture: Fixture, wheels: dict[str, str], work: Path, scale: float = 1.0) -> dict[str, int]:
    """Grow every wheel of ``wheels`` (project -> file name) that :data:`PADDING` names, then rewrite the
    indexes and the mirror; returns the bytes added to each grown wheel (installed size). ``scale``
    multiplies every size (a smaller job, the same shape)."""
    head, code, rng = tiny_library(work), machine_code(), random.Random(1151)
    added: dict[str, int] = {}
    for project, filename in sorted(wheels.items()):
        paddings = [p for p in PADDING if fnmatch.fnmatchcase(project, p.projects)]
        if not paddings:
            continue
        wheel = fixture.files[filename]
        additions: list[tuple[str, Blocks, bool]] = []
        for padding in paddings:
            scaled = dataclasses.replace(padding, size=int(padding.size * scale))
            files = _padding_files(scaled, project, rng, head, code)
            if padding.kind == "devel":
                additions.append(_devel_member(wheel, files))
            else:
                additions += [(name, blocks, padding.kind != "kpack") for name, _, blocks in files]
        added[filename] = inflate_wheel(wheel, additions)
    write_index(fixture)
    flat_mirror(fixture)
    return added


def _devel_member(wheel: Path, files: list[tuple[str, int, Blocks]]) -> tuple[str, Blocks, bool]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("/_devel.tar")]
        return name, devel_tar(archive.read(name), files), True
