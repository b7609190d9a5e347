"""Installed distributions' RECORD files (PEP 376/627): kept true after relocation and pruning, and
verified by qualification (a missing hidden ``.kpack`` or an edited library shows up here)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_bundle.tree.relocate import unshare


@dataclass(frozen=True)
class RecordEntry:
    path: str  # as written, relative to site-packages
    digest: str  # "sha256=<urlsafe b64>" or ""
    size: str


def record_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def read_record(record: Path) -> list[RecordEntry]:
    rows = csv.reader(io.StringIO(record.read_text()))
    return [RecordEntry(row[0], row[1] if len(row) > 1 else "", row[2] if len(row) > 2 else "") for row in rows if row]


def records(site: Path) -> Iterator[Path]:
    yield from sorted(site.glob("*.dist-info/RECORD"))


def resolve(site: Path, entry: RecordEntry) -> Path:
    return Path(os.path.normpath(site / entry.path))


def refresh_records(site: Path, changed: set[Path]) -> int:
    """Drop entries of files that are gone (pruned) and re-hash files that were edited (relocated)."""
    rewritten = 0
    changed_resolved = {p.resolve() for p in changed}
    for record in records(site):
        entries = read_record(record)
        kept = []
        for entry in entries:
            path = resolve(site, entry)
            if entry.digest and not path.exists():
                continue
            if entry.digest and path.resolve() in changed_resolved:
                entry = RecordEntry(entry.path, record_hash(path), str(path.stat().st_size))
            kept.append(entry)
        if kept != entries:
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerows((e.path, e.digest, e.size) for e in kept)
            unshare(record)
            record.write_text(out.getvalue())
            rewritten += 1
    return rewritten


def verify_records(site: Path) -> list[str]:
    """Every file a RECORD lists is present with its size and hash; returns the problems."""
    problems = []
    for record in records(site):
        dist = record.parent.name
        for entry in read_record(record):
            if not entry.digest:
                continue
            path = resolve(site, entry)
            if not path.is_file():
                problems.append(f"{dist} lists {entry.path}, which is missing")
            elif entry.size and str(path.stat().st_size) != entry.size:
                problems.append(f"{dist}: {entry.path} has size {path.stat().st_size}, RECORD says {entry.size}")
            elif record_hash(path) != entry.digest:
                problems.append(f"{dist}: {entry.path} does not match its RECORD hash")
    return problems
