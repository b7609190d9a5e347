"""Installed distributions' RECORD files (PEP 376/627): kept true after relocation and pruning, and
verified by qualification (a missing hidden ``.kpack`` or an edited library shows up here). Rows are
parsed and checked by pypa/installer's ``installer.records``: any hashlib algorithm a row names
(``sha256=``, ``sha384=``, ``sha512=``...) is checked with that algorithm."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

from installer.records import Hash, InvalidRecordEntry, RecordEntry, parse_record_file

from vllm_bundle.errors import MalformedRecordError
from vllm_bundle.tree.relocate import unshare


def file_hash(path: Path, algorithm: str = "sha256") -> Hash:
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, algorithm).digest()
    return Hash(algorithm, base64.urlsafe_b64encode(digest).rstrip(b"=").decode())


def read_record(record: Path) -> list[RecordEntry]:
    try:
        return [RecordEntry.from_elements(*row) for row in parse_record_file(record.read_text().splitlines())]
    except InvalidRecordEntry as e:
        raise MalformedRecordError(f"{record.parent.name}/RECORD: {e}") from e


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
            if entry.hash_ and not path.exists():
                continue
            if entry.hash_ and path.resolve() in changed_resolved:
                entry = RecordEntry(entry.path, file_hash(path, entry.hash_.name), path.stat().st_size)
            kept.append(entry)
        if kept != entries:
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerows(e.to_row() for e in kept)
            unshare(record)
            record.write_text(out.getvalue())
            rewritten += 1
    return rewritten


def verify_records(site: Path) -> list[str]:
    """Every file a RECORD lists is present with its size and hash; returns the problems."""
    problems = []
    for record in records(site):
        dist = record.parent.name
        try:
            entries = read_record(record)
        except MalformedRecordError as e:
            problems.append(str(e))
            continue
        for entry in entries:
            if not entry.hash_:
                continue
            path = resolve(site, entry)
            if not path.is_file():
                problems.append(f"{dist} lists {entry.path}, which is missing")
            elif entry.size is not None and path.stat().st_size != entry.size:
                problems.append(f"{dist}: {entry.path} has size {path.stat().st_size}, RECORD says {entry.size}")
            elif file_hash(path, entry.hash_.name) != entry.hash_:
                problems.append(f"{dist}: {entry.path} does not match its RECORD hash")
    return problems
