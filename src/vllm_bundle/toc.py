"""The release archive's table of contents (TOC): a contract between the release that writes it
(:mod:`vllm_bundle.release.archive`) and every installer that reads it, now and for years
(:mod:`vllm_bundle.install.delta`), so both take it from here: its records, its writer's document and
its checked parser. Standard library only: the installer's environment has no build extra.

The document (``<tag>-x64.toc.json.gz``; its sha256 in release.json) is gzip'd JSON with sorted keys::

    {"entries": [...], "format": "vllm-bundle-toc", "members": [[offset, size, inflated], ...], "version": 1}

Lineage: its entries are eStargz's TOC entries (containerd/stargz-snapshotter docs/estargz.md): one per
file, directory and link (``reg``, ``dir``, ``symlink``, ``hardlink``; names without ``./``, the root as
``.``), a regular file's first chunk on its entry and each later one in a ``chunk`` entry after it, each
chunk with ``offset`` (its gzip member's, in the whole archive), ``innerOffset`` (in the member's inflated
bytes), ``chunkOffset``, ``chunkSize`` and ``chunkDigest``. But it is a format of its own, not eStargz: the
archive is one tar stream cut into gzip members, not a stargz blob of one stream per file; ``members``
(each member's offset, compressed and inflated size, so a reader need not infer where one ends) is ours;
there is no whole-file ``digest`` (every chunk checked is the file checked) and no landmark files. Hence a
name (:data:`FORMAT`) and a version (:data:`VERSION`) of its own. Tables written before the name was given
have ``"version": 1`` alone (then taken from eStargz's TOC version) and the same fields: they are read as
this format's version 1, so installs made from them still get deltas.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from vllm_bundle.util.fields import Document, Fields

FORMAT = "vllm-bundle-toc"
VERSION = 1
KINDS = ("reg", "dir", "symlink", "hardlink")
#: The most a member may inflate to: the writer's members are about 256 KiB plus one chunk and tar
#: headers; a table that says more is not one of ours, and memory stays bounded whatever it says.
MAX_MEMBER = 16 << 20
#: The most a table may inflate to, far above what a release's needs (an entry per file and per chunk): a
#: hostile table is refused before it is parsed into objects several times its size.
MAX_TOC = 128 << 20
SHA256_PREFIX = "sha256:"


class Member(NamedTuple):
    """One gzip member of the archive."""

    offset: int  # in the whole archive (the parts back to back)
    size: int  # compressed
    inflated: int


class Chunk(NamedTuple):
    """One content-defined chunk of a regular file, and where the archive has it."""

    member: int  # index in Toc.members
    inner: int  # offset in the member's inflated bytes
    at: int  # offset in the file
    size: int
    digest: str  # sha256, hex


class Entry(NamedTuple):
    """One file, directory or link of the tree; a regular file's bytes are its chunks in order."""

    name: str
    kind: str  # one of KINDS
    mode: int
    size: int  # a regular file's, else 0
    link: str  # a link's target, else ""
    chunks: tuple[Chunk, ...]


@dataclass(frozen=True)
class Toc:
    entries: list[Entry]
    members: list[Member]

    def chunks(self) -> Iterator[tuple[Entry, Chunk]]:
        for entry in self.entries:
            for chunk in entry.chunks:
                yield entry, chunk


class BadToc(Exception):
    """A table that is not one of this format, or whose fields do not add up: one line saying what."""


# -- the writer's side -------------------------------------------------------------------------------


class WrittenEntry(NamedTuple):
    """An entry as the archive writer records it before its chunks' digests and members' offsets are
    known (a real bundle has about 100,000 of them: tuples, not dicts)."""

    name: str
    kind: str
    mode: int
    extra: int | str | None  # a regular file's size, a link's target, else None
    first: int  # its first chunk's index in the writer's chunk list
    chunk_count: int  # how many chunks it has


class WrittenChunk(NamedTuple):
    member: int  # the number of the member it is in
    inner: int  # its offset in that member's inflated bytes
    at: int  # its offset in the file
    size: int


def written_entry(info: tarfile.TarInfo, first: int, count: int) -> WrittenEntry:
    """The entry for what ``info`` describes, whose chunks are the writer's ``first`` to ``first + count``."""
    name = info.name.removeprefix("./") or "."
    kind = {tarfile.REGTYPE: "reg", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink"}
    extra: int | str | None = info.size if info.isreg() else None
    if info.issym():
        extra = info.linkname
    elif info.islnk():
        extra = info.linkname.removeprefix("./")
    return WrittenEntry(name, kind[info.type], info.mode, extra, first, count)


def document(
    entries: Sequence[WrittenEntry], chunks: Sequence[WrittenChunk], digests: Sequence[str], members: Sequence[Member]
) -> Iterator[bytes]:
    """The document's JSON (sorted keys, no spaces), an entry at a time so the writer can compress it as
    it goes. ``digests`` are the chunks' sha256 in the order of ``chunks``."""
    yield b'{"entries":['
    number = 0
    for written in entries:
        for entry in _entry_objects(written, chunks, digests, members):
            yield f"{',' if number else ''}{json.dumps(entry, sort_keys=True, separators=(',', ':'))}".encode()
            number += 1
    spans = json.dumps([list(member) for member in members], separators=(",", ":"))
    yield f'],"format":"{FORMAT}","members":{spans},"version":{VERSION}}}'.encode()


def _entry_objects(
    written: WrittenEntry, chunks: Sequence[WrittenChunk], digests: Sequence[str], members: Sequence[Member]
) -> Iterator[dict[str, Any]]:
    """An entry's object, its first chunk on it, then a ``chunk`` object for each later chunk."""
    entry: dict[str, Any] = {"name": written.name, "type": written.kind, "mode": written.mode}
    if written.extra is not None:
        entry["size" if written.kind == "reg" else "linkName"] = written.extra
    later = []
    for number in range(written.first, written.first + written.chunk_count):
        chunk = chunks[number]
        target: dict[str, Any] = entry if number == written.first else {"name": written.name, "type": "chunk"}
        target.update(offset=members[chunk.member].offset, innerOffset=chunk.inner, chunkOffset=chunk.at)
        target.update(chunkSize=chunk.size, chunkDigest=f"{SHA256_PREFIX}{digests[number]}")
        if target is not entry:
            later.append(target)
    yield entry
    yield from later


# -- the reader's side -------------------------------------------------------------------------------


def parse(data: bytes, archive_size: int | None = None) -> Toc:
    """The table in ``data`` (gzip'd JSON), every field checked: this format and version, members back
    to back (to the archive's end, given ``archive_size``), every chunk inside its member, each file's
    chunks one after the other from its first byte to its last. Raises BadToc saying what does not add up."""
    try:
        doc = json.loads(_inflated(data))
    except (OSError, EOFError, zlib.error, ValueError) as err:  # not gzip, cut, not JSON
        raise BadToc(f"it is not gzip'd JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("format", FORMAT) != FORMAT or doc.get("version") != VERSION:
        raise BadToc(f"it is not a {FORMAT} version {VERSION} table of contents")
    table = _TABLE.fields(doc)
    entries = table.tables("entries")
    reader = _Reader(_members(table, archive_size))
    for entry in entries:
        reader.add(entry)
    return Toc(reader.finish(), reader.members)


def _inflated(data: bytes) -> bytes:
    """``data`` inflated, a window at a time: ``read(MAX_TOC + 1)`` at once allocates MAX_TOC (128 MiB)
    whatever the table's size, which was most of a delta's peak memory (#54)."""
    text = bytearray()
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
        while piece := stream.read(1 << 20):
            text += piece
            if len(text) > MAX_TOC:
                raise BadToc(f"it inflates to more than {MAX_TOC} bytes")
    return bytes(text)


#: The table's fields: each bad one a BadToc naming it (``entries[3].mode is ...``); the installer's
#: message names the table.
_TABLE = Document("", BadToc)


def _members(doc: Fields, archive_size: int | None) -> list[Member]:
    """The members, back to back from the archive's start; when ``archive_size`` is given, to its end."""
    members: list[Member] = []
    end = 0
    for number, row in enumerate(doc.array("members")):
        if not isinstance(row, list) or len(row) != 3:
            raise BadToc(f"members[{number}] is not [offset, size, inflated size]")
        named = Fields(_TABLE, dict(zip(Member._fields, row, strict=True)), f"members[{number}]")
        member = Member(*(named.whole(field) for field in Member._fields))
        if member.offset != end or member.size == 0 or member.inflated > MAX_MEMBER:
            raise BadToc(f"members[{number}] is not the member after the one before it, or too large")
        members.append(member)
        end = member.offset + member.size
    if archive_size is not None and end != archive_size:
        raise BadToc(f"its members end at byte {end}, the archive at {archive_size}")
    return members


class _Reader:
    """Reads a table's entries one after the other, a file's chunks after it."""

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self.at_offset = {member.offset: number for number, member in enumerate(members)}
        self.entries: list[Entry] = []
        self.pending: dict[str, Any] | None = None
        self.chunks: list[Chunk] = []

    def _chunk(self, raw: Fields) -> Chunk:
        member = self.at_offset.get(raw.whole("offset"))
        if member is None:
            raise raw.bad("offset", "a member's offset")
        inner, size, at = raw.whole("innerOffset"), raw.whole("chunkSize", least=1), raw.whole("chunkOffset", 0)
        if inner + size > self.members[member].inflated:
            raise BadToc(f"{raw.path} lies outside its member")
        expected = self.chunks[-1].at + self.chunks[-1].size if self.chunks else 0
        if at != expected:
            raise BadToc(f"{raw.path} starts at byte {at} of its file, not {expected}: chunks overlap or leave a gap")
        return Chunk(member, inner, at, size, raw.sha256("chunkDigest", prefix=SHA256_PREFIX))

    def _close(self) -> None:
        raw = self.pending
        if raw is None:
            return
        size = sum(chunk.size for chunk in self.chunks)
        if raw["type"] == "reg" and size != raw["size"]:
            raise BadToc(f"the chunks of {raw['name']!r} hold {size} bytes, its size is {raw['size']}")
        link = raw.get("linkName", "")
        self.entries.append(Entry(raw["name"], raw["type"], raw["mode"], raw.get("size", 0), link, tuple(self.chunks)))
        self.pending, self.chunks = None, []

    def add(self, entry: Fields) -> None:
        raw = entry.data
        kind = raw.get("type")
        if kind == "chunk":
            if self.pending is None or self.pending["type"] != "reg" or raw.get("name") != self.pending["name"]:
                raise BadToc(f"{entry.path} is a chunk of no file before it")
            self.chunks.append(self._chunk(entry))
            return
        self._close()
        if kind not in KINDS:
            raise entry.bad("type", " or ".join(KINDS))
        entry.text("name")
        raw["mode"] = entry.whole("mode")
        if kind == "reg":
            raw["size"] = entry.whole("size")
            if "chunkDigest" in raw:
                self.chunks.append(self._chunk(entry))
        elif kind in ("symlink", "hardlink"):
            entry.text("linkName")
        self.pending = raw

    def finish(self) -> list[Entry]:
        self._close()
        return self.entries
