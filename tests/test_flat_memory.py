"""Memory that stays flat with size: real bundles hold files of 2 GB and hundreds of thousands of entries,
so what reads them reads a block at a time and what streams a tar keeps no list of its entries.
(``nox -s bench`` measures the peak RSS at 8 GiB; these tests pin the behaviour that keeps it flat.)"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_bundle.oci.layout import Layout, write_layer
from vllm_bundle.qualify.repro import compare_asset_dirs, first_difference
from vllm_bundle.release.archive import write_archive
from vllm_bundle.tree import relocate
from vllm_bundle.util.tarstream import StreamTar


@pytest.mark.parametrize("offset", [0, 13, 14, 15, 16, 17, 30, 47])
def test_a_needle_is_found_wherever_it_falls_across_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offset: int
) -> None:
    monkeypatch.setattr(relocate, "SEARCH_BLOCK", 16)
    needle = b"/build/dir"
    path = tmp_path / "lib.so"
    data = bytearray(b"x" * 64)
    data[offset : offset + len(needle)] = needle
    path.write_bytes(bytes(data[:64]))
    assert relocate.mentions(path, needle)
    assert relocate.files_mentioning(tmp_path, needle) == [path]


def test_a_needle_that_is_not_there_whole_is_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relocate, "SEARCH_BLOCK", 16)
    path = tmp_path / "lib.so"
    path.write_bytes(b"x" * 10 + b"/build/di" + b"y" * 30 + b"r/build/dir"[:-1])
    assert not relocate.mentions(path, b"/build/dir")
    (tmp_path / "empty").touch()
    assert relocate.files_mentioning(tmp_path, b"/build/dir") == []


CAP = """
vm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 256 * 2**20, resource.RLIM_INFINITY))
"""


def _bounded(imports: str, statement: str, *args: Path) -> subprocess.CompletedProcess[str]:
    """``statement`` run with the address space capped at what the process has once ``imports`` are
    done, plus 256 MiB. One malloc arena: glibc reserves 64 MiB of address space for each thread's own
    (used or not), so the archive's eight workers alone would pass the cap without using memory."""
    script = f"import resource, sys\nfrom pathlib import Path\n{imports}\n{CAP}\n{statement}\n"
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "MALLOC_ARENA_MAX": "1"},
    )


def test_comparing_release_folders_holds_no_whole_part(tmp_path: Path) -> None:
    """Two 768 MiB parts that differ in their last byte (sparse: no disk used), compared with 256 MiB to
    spare: reading either whole would not fit."""
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, last in ((first, b"a"), (second, b"b")):
        folder.mkdir()
        with (folder / "x-x64.bin").open("wb") as handle:
            handle.truncate(768 * 2**20 - 1)
            handle.seek(0, 2)
            handle.write(last)
    result = _bounded(
        "from vllm_bundle.qualify.repro import compare_asset_dirs",
        "print(compare_asset_dirs(Path(sys.argv[1]), Path(sys.argv[2])))",
        first,
        second,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['x-x64.bin']"


def test_hashing_an_archive_member_holds_no_whole_member(tmp_path: Path) -> None:
    """A 768 MiB member (sparse, gzip-compressed to a few MiB) hashed with 256 MiB to spare."""
    tree = tmp_path / "tree"
    tree.mkdir()
    with (tree / "big.bin").open("wb") as handle:
        handle.truncate(768 * 2**20)
    parts = write_archive(tree, tmp_path / "a", "x", level=1).parts
    result = _bounded(
        "from vllm_bundle.qualify.repro import first_difference",
        "print(first_difference([Path(sys.argv[1])], [Path(sys.argv[1])]))",
        parts[0].path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"


@pytest.fixture
def many_files(tmp_path: Path) -> Path:
    tree = tmp_path / "many"
    for index in range(300):
        folder = tree / f"d{index % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{index}.py").write_text(f"x = {index}\n")
    return tree


@pytest.fixture
def members_held(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many entries a tar being written holds in ``members`` as each entry is added."""
    held: list[int] = []
    addfile = tarfile.TarFile.addfile

    def counting(self: StreamTar, tarinfo: tarfile.TarInfo, fileobj: Any = None) -> None:
        held.append(len(self.members))
        addfile(self, tarinfo, fileobj)

    monkeypatch.setattr(tarfile.TarFile, "addfile", counting)
    yield held


def test_the_release_archive_chunks_a_file_a_window_at_a_time(tmp_path: Path) -> None:
    """A 768 MiB file (sparse: no disk used) archived with 256 MiB to spare: FastCDC is given a window of
    the file at a time, never the whole file (release/archive.py ``file_chunks``)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    with (tree / "big.bin").open("wb") as handle:
        handle.truncate(768 * 2**20)
    result = _bounded(
        "from vllm_bundle.release.archive import write_archive",
        "print(write_archive(Path(sys.argv[1]), Path(sys.argv[2]), 'x', level=1).size)",
        tree,
        tmp_path / "parts",
    )
    assert result.returncode == 0, result.stderr
    assert 0 < int(result.stdout) < 2**20


def test_an_image_layer_keeps_no_list_of_its_entries(many_files: Path, tmp_path: Path, members_held: list[int]) -> None:
    entries = [("./", many_files), *((f"./{p.relative_to(many_files)}", p) for p in sorted(many_files.rglob("*")))]
    write_layer(Layout(tmp_path / "layout"), many_files, entries, "/opt/vllm", 1)
    assert len(members_held) > 300 and max(members_held) <= 2, "the prefix directories at most"


def test_comparing_archives_keeps_no_list_of_their_members(
    many_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write_archive(many_files, tmp_path / "a", "x-x64").parts
    (many_files / "d6" / "f97.py").write_text("y = 97\n")  # the member that sorts last, its size kept
    second = write_archive(many_files, tmp_path / "b", "x-x64").parts
    held: list[int] = []
    following = tarfile.TarFile.next

    def counting(self: StreamTar) -> tarfile.TarInfo | None:
        held.append(len(self.members))
        return following(self)

    monkeypatch.setattr(tarfile.TarFile, "next", counting)
    assert first_difference([p.path for p in first], [p.path for p in second]) == "member ./d6/f97.py: content differs"
    assert len(held) > 300 and max(held) <= 1
    assert compare_asset_dirs(tmp_path / "a", tmp_path / "b") == [
        "x-x64.part01-of-01.tar.gz: member ./d6/f97.py: content differs"
    ]
