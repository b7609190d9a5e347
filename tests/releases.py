"""A release of a tree, made by the production archive writer without the pipeline around it: what the
delta tests (test_delta.py) and the bench's delta row install over each other."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from vllm_bundle.manifests import DEFAULT_LEVEL, RELEASE_JSON, ReleaseAssets
from vllm_bundle.release.archive import archiver, write_archive


def make_release(root: Path, where: Path, tag: str, date: int, part_size: int, target: str = "gfx1151") -> Path:
    """A release of ``root`` in ``where``: its archive in parts as the release stage writes it
    (release/archive.py), its table of contents, partcount, and the release.json fields ``install``
    reads (release/assets.py writes these and more)."""
    where.mkdir(parents=True)
    assets = ReleaseAssets(tag)
    archive = write_archive(root, where, assets.stem, part_size=part_size)
    (where / assets.partcount).write_text(f"{len(archive.parts):02d}")
    (where / assets.toc).write_bytes(archive.toc)
    release = {
        "tag": tag,
        "target": target,
        "source_date_epoch": date,
        "archive": {
            "size": archive.size,
            "sha256": archive.sha256,
            "tar_sha256": archive.tar_sha256,
            "level": DEFAULT_LEVEL,
            "archiver": archiver(),
            "parts": [{"name": p.path.name, "size": p.size, "sha256": p.sha256} for p in archive.parts],
            "toc": toc_field(assets, archive.toc),
        },
    }
    (where / RELEASE_JSON).write_text(json.dumps(release))
    return where


def toc_field(assets: ReleaseAssets, toc: bytes) -> dict[str, Any]:
    """release.json's ``archive.toc`` for the table ``toc``."""
    return {"name": assets.toc, "size": len(toc), "sha256": hashlib.sha256(toc).hexdigest()}
