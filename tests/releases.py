"""A release of a tree, made by the production archive writer without the pipeline around it: what the
delta tests (test_delta.py) and the bench's delta row install over each other."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_bundle.manifests import DEFAULT_LEVEL, RELEASE_JSON, ReleaseAssets
from vllm_bundle.release.assets import archive_assets


def make_release(root: Path, where: Path, tag: str, date: int, part_size: int, target: str = "gfx1151") -> Path:
    """A release of ``root`` in ``where``: its archive in parts as the release stage writes it
    (release/assets.py archive_assets), its table of contents, partcount, and the release.json fields ``install``
    reads (release/assets.py writes these and more)."""
    where.mkdir(parents=True)
    archive = archive_assets(root, where, ReleaseAssets(tag), part_size=part_size, level=DEFAULT_LEVEL)
    release = {"tag": tag, "target": target, "source_date_epoch": date, "archive": archive}
    (where / RELEASE_JSON).write_text(json.dumps(release))
    return where
