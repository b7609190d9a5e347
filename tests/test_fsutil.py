"""The file mechanisms of ``util.fsutil``, each with one home: hashing a file, linking else copying,
writing atomically, and a full disk as one line."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from tests.conftest import disk_filling_up
from vllm_bundle import manifests
from vllm_bundle.errors import DiskFullError
from vllm_bundle.util import fsutil


def test_a_file_is_hashed_by_one_helper_whatever_its_size(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000 + b"tail"  # more than one read block
    (tmp_path / "big").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert fsutil.sha256_file(tmp_path / "big") == hashlib.sha256(data).hexdigest()
    assert fsutil.sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
    # SHA256SUMS and the fetcher's checks hash through it.
    assert manifests.sha256sums(tmp_path, ["empty", "big"]) == (
        f"{hashlib.sha256(data).hexdigest()}  big\n{hashlib.sha256(b'').hexdigest()}  empty\n".encode()
    )


def test_link_or_copy_links_on_one_file_system_and_copies_across(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    source.write_bytes(b"bytes")
    source.chmod(0o755)
    fsutil.link_or_copy(source, tmp_path / "linked")
    assert (tmp_path / "linked").stat().st_ino == source.stat().st_ino

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    fsutil.link_or_copy(str(source), str(tmp_path / "copied"))  # also a copytree copy function
    copied = (tmp_path / "copied").stat()
    assert copied.st_ino != source.stat().st_ino and (tmp_path / "copied").read_bytes() == b"bytes"
    assert copied.st_mode & 0o777 == 0o755, "a copy keeps the mode, as the link would"


def test_sha256sums_is_written_atomically_with_its_bytes_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SHA256SUMS goes through atomic_write: synced before the rename, so a failure (or a crash) leaves
    the previous file whole and no temporary file beside it."""
    (tmp_path / "a.tar.gz").write_bytes(b"a")
    manifests.write_sha256sums(tmp_path)
    before = (tmp_path / manifests.SHA256SUMS).read_bytes()
    assert before == f"{hashlib.sha256(b'a').hexdigest()}  a.tar.gz\n".encode()
    (tmp_path / "b.tar.gz").write_bytes(b"b")

    def failing_sync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_sync)
    with pytest.raises(OSError, match="Input/output error"):
        manifests.write_sha256sums(tmp_path)
    assert (tmp_path / manifests.SHA256SUMS).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [manifests.SHA256SUMS, "a.tar.gz", "b.tar.gz"]
    monkeypatch.undo()
    manifests.write_sha256sums(tmp_path)
    assert (tmp_path / manifests.SHA256SUMS).stat().st_mode & 0o777 == 0o644
    assert (tmp_path / manifests.SHA256SUMS).read_bytes().count(b"\n") == 2


# -- a full disk is one line -----------------------------------------------------------------------------


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_is_one_line_after_the_cleanup(code: int) -> None:
    cleaned: list[str] = []
    with (
        pytest.raises(DiskFullError, match=r"^disk full writing x \(free space\)$"),
        fsutil.raising_disk_full("disk full writing x", "free space", cleanup=lambda: cleaned.append("x")),
    ):
        raise OSError(code, os.strerror(code))
    assert cleaned == ["x"]
    with (
        pytest.raises(PermissionError),  # any other error passes as it is, with nothing removed
        fsutil.raising_disk_full("disk full", "free space", cleanup=lambda: cleaned.append("y")),
    ):
        raise PermissionError(errno.EACCES, "Permission denied")
    assert cleaned == ["x"]


def test_a_full_disk_while_extracting_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_bundle.util.extract import safe_extract

    data = os.urandom(5000)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("top/big.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    disk_filling_up(monkeypatch, room=1000)
    with tarfile.open(fileobj=buffer) as tar, pytest.raises(DiskFullError, match=r"filled up while extracting a\.tar"):
        safe_extract(tar, tmp_path / "out", "a.tar", top="top")


def test_a_full_disk_while_building_a_stage_keeps_nothing_of_it(tmp_path: Path) -> None:
    from vllm_bundle.tree.stage import run_stage

    def build(tmp: Path) -> None:
        (tmp / "half").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskFullError, match="filled up while building the demo stage; nothing of it was kept"):
        run_stage(tmp_path / "out", "demo", 1, {}, build)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock"]
