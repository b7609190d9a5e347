"""The table of contents (:mod:`vllm_bundle.toc`), the contract between the release that writes it and
every installer that reads it: what the writer writes the parser reads back as the tree it describes, and
each way a table can fail to add up is refused, saying what. Quick tier: a small tree, no fake upstream."""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vllm_bundle import toc
from vllm_bundle.release.archive import CHUNK_MAX, MEMBER_SIZE, write_archive
from vllm_bundle.toc import FORMAT, VERSION, BadToc, Entry


def _small_tree(root: Path) -> None:
    """A tree of each kind the format has: files of one chunk and of several (across members), an empty
    one, an executable, folders, a symlink and a second name of a file."""
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "empty").mkdir(parents=True)
    (root / "bin" / "tool").write_text("#!/bin/sh\necho hi\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "lib" / "small.txt").write_text("small\n")
    (root / "lib" / "nothing").write_bytes(b"")
    (root / "lib" / "big.so").write_bytes(os.urandom(3 * CHUNK_MAX + 12345))  # several chunks, members
    (root / "lib" / "link").symlink_to("small.txt")
    os.link(root / "lib" / "small.txt", root / "lib" / "second-name.txt")


def test_what_the_writer_writes_the_parser_reads_back_as_the_tree(tmp_path: Path) -> None:
    """Every entry is the tree's, of its kind, mode and link target; each chunk, cut from its member of
    the archive's bytes, has its digest and is its file's bytes at its place, and a file's chunks are
    the whole file."""
    root = tmp_path / "root"
    _small_tree(root)
    archive = write_archive(root, tmp_path / "out", "t-x64")
    whole = b"".join(part.path.read_bytes() for part in archive.parts)

    table = toc.parse(archive.toc, archive.size)

    assert json.loads(gzip.decompress(archive.toc))["format"] == FORMAT
    assert len(table.members) > 1 and sum(member.size for member in table.members) == len(whole)
    assert sum(member.size for member in table.members) > MEMBER_SIZE
    by_name = {entry.name: entry for entry in table.entries}
    on_disk = {path.relative_to(root).as_posix() for path in root.rglob("*")} | {"."}
    assert set(by_name) == on_disk
    assert by_name["lib/link"] == Entry("lib/link", "symlink", 0o777, 0, "small.txt", ())
    second, first = by_name["lib/second-name.txt"], by_name["lib/small.txt"]
    assert {first.kind, second.kind} == {"reg", "hardlink"}, "one inode, archived once"
    assert by_name["lib/empty"].kind == "dir" and by_name["bin/tool"].mode == 0o755
    assert by_name["lib/nothing"].size == 0 and by_name["lib/nothing"].chunks == ()
    assert len(by_name["lib/big.so"].chunks) > 1
    assert len({chunk.member for chunk in by_name["lib/big.so"].chunks}) > 1
    for entry in table.entries:
        if entry.kind != "reg":
            continue
        data = (root / entry.name).read_bytes()
        assert entry.size == len(data) and entry.mode == stat.S_IMODE((root / entry.name).stat().st_mode)
        rebuilt = b""
        for chunk in entry.chunks:
            member = table.members[chunk.member]
            inflated = gzip.decompress(whole[member.offset : member.offset + member.size])
            piece = inflated[chunk.inner : chunk.inner + chunk.size]
            assert hashlib.sha256(piece).hexdigest() == chunk.digest and chunk.at == len(rebuilt)
            rebuilt += piece
        assert rebuilt == data, entry.name


#: A table that adds up: two members of an archive of 20 bytes, a file of two chunks (one in each), a
#: folder and two links.
GOOD: dict[str, Any] = {
    "entries": [
        {"name": ".", "type": "dir", "mode": 0o755},
        {
            "name": "a",
            "type": "reg",
            "mode": 0o644,
            "size": 150,
            "offset": 0,
            "innerOffset": 0,
            "chunkOffset": 0,
            "chunkSize": 100,
            "chunkDigest": "sha256:" + "a" * 64,
        },
        {
            "name": "a",
            "type": "chunk",
            "offset": 10,
            "innerOffset": 0,
            "chunkOffset": 100,
            "chunkSize": 50,
            "chunkDigest": "sha256:" + "b" * 64,
        },
        {"name": "l", "type": "symlink", "mode": 0o777, "linkName": "a"},
        {"name": "h", "type": "hardlink", "mode": 0o644, "linkName": "a"},
    ],
    "format": FORMAT,
    "members": [[0, 10, 100], [10, 10, 100]],
    "version": VERSION,
}
ARCHIVE_SIZE = 20


def _gz(doc: object) -> bytes:
    return gzip.compress(json.dumps(doc).encode(), mtime=0)


def test_a_table_that_adds_up_is_read_with_its_chunks_on_their_file() -> None:
    table = toc.parse(_gz(GOOD), ARCHIVE_SIZE)
    assert [(entry.name, entry.kind) for entry in table.entries] == [
        (".", "dir"),
        ("a", "reg"),
        ("l", "symlink"),
        ("h", "hardlink"),
    ]
    assert [(chunk.member, chunk.at, chunk.size) for _, chunk in table.chunks()] == [(0, 0, 100), (1, 100, 50)]
    assert table.members[1] == toc.Member(10, 10, 100)


def test_a_table_written_before_the_format_had_a_name_is_read_as_its_version_1() -> None:
    """Installs in the field keep the table they were made from (tables up to release STAGE_VERSION 8 had
    ``"version": 1`` alone): their next update must still be a delta."""
    legacy = {key: value for key, value in GOOD.items() if key != "format"}
    assert toc.parse(_gz(legacy), ARCHIVE_SIZE).entries == toc.parse(_gz(GOOD), ARCHIVE_SIZE).entries


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """A lie: the field at ``path`` (keys and indexes joined by "/") set to ``value``."""

    def lie(doc: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target: Any = doc
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[int(last) if isinstance(target, list) else last] = value

    return lie


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def lie(doc: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target: Any = doc
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        del target[last]

    return lie


def _entries_first(doc: dict[str, Any]) -> None:
    doc["entries"].insert(0, copy.deepcopy(doc["entries"][2]))  # a chunk before any file


def _chunk_of_a_folder(doc: dict[str, Any]) -> None:
    doc["entries"].insert(1, {**doc["entries"][2], "name": "."})


def _chunkless(doc: dict[str, Any]) -> None:
    for key in ("offset", "innerOffset", "chunkOffset", "chunkSize", "chunkDigest"):
        del doc["entries"][1][key]
    del doc["entries"][2]


REFUSALS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("wrong format", _set("format", "estargz"), f"not a {FORMAT} version {VERSION}"),
    ("wrong version", _set("version", 2), f"not a {FORMAT} version {VERSION}"),
    ("no version", _drop("version"), f"not a {FORMAT} version {VERSION}"),
    ("entries not an array", _set("entries", {}), "entries is a JSON object, not an array of JSON objects"),
    ("members not an array", _set("members", None), "members is null, not an array"),
    ("a member not a row of 3", _set("members/1", [10, 10]), "members[1] is not [offset, size, inflated size]"),
    ("a member's number not whole", _set("members/1/2", 1.5), "members[1].inflated is 1.5, not a whole number >= 0"),
    ("a member's number a bool", _set("members/0/0", False), "members[0].offset is a boolean, not a whole number"),
    ("a member's number negative", _set("members/0/1", -1), "members[0].size is -1, not a whole number >= 0"),
    ("members not back to back", _set("members/1/0", 11), "members[1] is not the member after the one before it"),
    ("a member of size 0", _set("members/0/1", 0), "members[0] is not the member after the one before it"),
    ("a member too large", _set("members/0/2", toc.MAX_MEMBER + 1), "members[0] is not the member after"),
    ("members short of the archive", _set("members", [[0, 10, 100]]), "its members end at byte 10, the archive at 20"),
    ("an entry not an object", _set("entries/3", "l"), "entries[3] is a string, not a JSON object"),
    ("a chunk first", _entries_first, "entries[0] is a chunk of no file before it"),
    ("a chunk of a folder", _chunk_of_a_folder, "entries[1] is a chunk of no file before it"),
    ("a chunk of another file", _set("entries/2/name", "b"), "entries[2] is a chunk of no file before it"),
    (
        "an unknown type",
        _set("entries/3/type", "fifo"),
        "entries[3].type is 'fifo', not reg or dir or symlink or hardlink",
    ),
    ("a name not a string", _set("entries/0/name", 7), "entries[0].name is a number, not a string"),
    ("a name with a NUL", _set("entries/1/name", "a\0b"), "entries[1].name is 'a\\x00b', not a string without NUL"),
    ("no mode", _drop("entries/0/mode"), "entries[0].mode is missing"),
    ("a size not a number", _set("entries/1/size", "150"), "entries[1].size is a string, not a whole number >= 0"),
    ("a link without target", _drop("entries/4/linkName"), "entries[4].linkName is missing"),
    ("a chunk not at a member", _set("entries/2/offset", 5), "entries[2].offset is 5, not a member's offset"),
    (
        "innerOffset negative",
        _set("entries/1/innerOffset", -1),
        "entries[1].innerOffset is -1, not a whole number >= 0",
    ),
    ("chunkSize 0", _set("entries/2/chunkSize", 0), "entries[2].chunkSize is 0, not a whole number >= 1"),
    ("chunkOffset not a number", _set("entries/2/chunkOffset", "100"), "entries[2].chunkOffset is a string, not a"),
    ("a chunk outside its member", _set("entries/2/innerOffset", 51), "entries[2] lies outside its member"),
    ("a gap between chunks", _set("entries/2/chunkOffset", 101), "starts at byte 101 of its file, not 100"),
    ("overlapping chunks", _set("entries/2/chunkOffset", 99), "starts at byte 99 of its file, not 100"),
    ("a first chunk not at 0", _set("entries/1/chunkOffset", 1), "entries[1] starts at byte 1 of its file, not 0"),
    ("a digest not sha256", _set("entries/1/chunkDigest", "md5:" + "a" * 32), "entries[1].chunkDigest is 'md5:aaaa"),
    (
        "a digest in capitals",
        _set("entries/2/chunkDigest", "sha256:" + "A" * 64),
        "entries[2].chunkDigest is 'sha256:AAAA",
    ),
    ("chunks short of the size", _set("entries/1/size", 151), "the chunks of 'a' hold 150 bytes, its size is 151"),
    ("a file without its chunks", _chunkless, "the chunks of 'a' hold 0 bytes, its size is 150"),
]


@pytest.mark.parametrize(
    ("lie", "expected"), [(lie, expected) for _, lie, expected in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_each_way_a_table_does_not_add_up_is_refused_saying_what(
    lie: Callable[[dict[str, Any]], None], expected: str
) -> None:
    doc = copy.deepcopy(GOOD)
    lie(doc)
    with pytest.raises(BadToc) as refused:
        toc.parse(_gz(doc), ARCHIVE_SIZE)
    assert expected in str(refused.value)


NOT_TABLES: list[tuple[str, Callable[[], bytes], str]] = [
    ("not gzip", lambda: json.dumps(GOOD).encode(), "it is not gzip'd JSON"),
    ("cut", lambda: _gz(GOOD)[:-9], "it is not gzip'd JSON"),
    ("not JSON", lambda: gzip.compress(b"{not json", mtime=0), "it is not gzip'd JSON"),
    ("not an object", lambda: _gz([GOOD]), f"it is not a {FORMAT} version {VERSION} table of contents"),
    ("inflates too large", lambda: gzip.compress(b" " * (toc.MAX_TOC + 1), 1), f"more than {toc.MAX_TOC} bytes"),
]


@pytest.mark.parametrize(("data", "expected"), [row[1:] for row in NOT_TABLES], ids=[row[0] for row in NOT_TABLES])
def test_a_document_that_is_not_a_table_is_refused_saying_what(data: Callable[[], bytes], expected: str) -> None:
    with pytest.raises(BadToc) as refused:
        toc.parse(data())
    assert expected in str(refused.value)
