"""The file mechanisms of ``util.fsutil``, each with one home: hashing a file, linking else copying,
writing atomically, and a full disk as one line."""

from __future__ import annotations

import hashlib
from pathlib import Path

from vllm_bundle import manifests
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
