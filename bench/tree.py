"""A bundle at real size: the fixture bundle (a working tree tier 0 passes) grown to a given size with
what makes real bundles big. TheRock's ROCm and PyTorch wheels give 10-20 GB trees whose largest files
(rocBLAS/hipBLASLt kernels, libtorch_hip.so) are single ELF files of 1-2 GB, device code in hidden
``.kpack`` folders, and tens of thousands of small ``.py`` files; the padding here has that shape:

- ELF shared libraries of up to 2 GiB: a real (tiny) shared object built with clang-19, followed by
  machine code gathered from this machine's own libraries (as compressible as real library code);
- ``.kpack`` folders of incompressible blobs (device code is compressed already);
- copies of the standard library's ``.py`` files (~1 GiB, tens of thousands of files).

They belong to a distribution of their own whose RECORD lists every file with its hash, as a wheel's
does, so tier 0 reads them all as it reads a real bundle's."""

from __future__ import annotations

import random
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from vllm_bundle.tree.records import file_hash

GiB = 2**30
LARGEST = 2 * GiB
CHUNK = 64 * 2**20
PADDING = "bench_padding"
LAST = "zz-bench-last.bin"  # sorts after everything: the member a second archive changes


def _site(root: Path) -> Path:
    (site,) = root.glob("lib/python3.*/site-packages")
    return site


def tiny_library(work: Path) -> bytes:
    source = work / "tiny.c"
    source.write_text("int bench_padding(void) { return 1151; }\n")
    library = work / "libtiny.so"
    subprocess.run(
        ["clang-19", "-shared", "-fPIC", "-nostdlib", "-fuse-ld=lld", "-o", str(library), str(source)],
        check=True,
        capture_output=True,
    )
    return library.read_bytes()


def machine_code() -> Iterator[bytes]:
    """This machine's shared libraries, one after the other, for ever."""
    sources = sorted(Path("/usr/lib/x86_64-linux-gnu").glob("*.so*"))
    sources = [p for p in sources if p.is_file() and not p.is_symlink() and p.stat().st_size > 65536]
    while True:
        for path in sources:
            yield path.read_bytes()


def elf_blocks(size: int, head: bytes, code: Iterator[bytes]) -> Iterator[bytes]:
    """An ELF file's bytes, ``size`` of them: a real shared object's, then machine code."""
    yield head[:size]
    written = min(len(head), size)
    while written < size:
        block = next(code)[: size - written]
        yield block
        written += len(block)


def random_blocks(size: int, rng: random.Random) -> Iterator[bytes]:
    """``size`` incompressible bytes (device code is compressed already)."""
    for offset in range(0, size, CHUNK):
        yield rng.randbytes(min(CHUNK, size - offset))


def _write(path: Path, blocks: Iterator[bytes]) -> None:
    with path.open("wb") as out:
        for block in blocks:
            out.write(block)


def python_sources() -> list[Path]:
    """The standard library's ``.py`` files: what stands for the tens of thousands a bundle has."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in stdlib.rglob("*.py") if p.is_file())


def _copy_python(dest: Path, budget: int) -> int:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = python_sources()
    written, copy = 0, 0
    while written < budget:
        for source in sources:
            target = dest / f"copy{copy}" / source.relative_to(stdlib)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            written += target.stat().st_size
            if written >= budget:
                break
        copy += 1
    return written


def _write_distribution(site: Path) -> None:
    info = site / f"{PADDING}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PADDING}\nVersion: 1.0\n")
    rows = [
        f"{path.relative_to(site).as_posix()},{file_hash(path)},{path.stat().st_size}"
        for path in sorted((site / PADDING).rglob("*"))
        if path.is_file()
    ]
    rows += [f"{PADDING}-1.0.dist-info/METADATA,,", f"{PADDING}-1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def grow_bundle(bundle: Path, dest: Path, total: int, work: Path) -> dict[str, int]:
    """Copy ``bundle`` to ``dest`` and grow it to ``total`` bytes; returns what was added, by kind."""
    shutil.copytree(bundle, dest, symlinks=True)
    (dest / LAST).write_bytes(b"0" * 4096)
    base = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
    padding = _site(dest) / PADDING
    rng = random.Random(1151)
    python = _copy_python(padding / "python", min(GiB, (total - base) // 8))
    kpack = min(GiB, (total - base) // 8)
    for index, offset in enumerate(range(0, kpack, 256 * 2**20)):
        blob = padding / ".kpack" / f"bench_padding_gfx1151_{index}.kpack"
        blob.parent.mkdir(parents=True, exist_ok=True)
        _write(blob, random_blocks(min(256 * 2**20, kpack - offset), rng))
    head, code = tiny_library(work), machine_code()
    remaining = total - base - python - kpack
    index = 0
    while remaining > 0:
        library = padding / "lib" / f"libbench_padding{index}.so"
        library.parent.mkdir(parents=True, exist_ok=True)
        _write(library, elf_blocks(min(LARGEST, remaining), head, code))
        remaining -= library.stat().st_size
        index += 1
    _write_distribution(_site(dest))
    files = [p for p in dest.rglob("*") if p.is_file() and not p.is_symlink()]
    return {
        "python": python,
        "kpack": kpack,
        "elf": total - base - python - kpack,
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
    }
