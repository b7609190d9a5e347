"""A tree a delta install assembled, proven to be the tree of the release's parts before it is installed
(#51 F7): a delta installs what a full install of the same release would, or nothing.

The table of contents says where each chunk of each file is, but it is a file of its own, with its own
sha256 in release.json: a table that does not describe the parts (re-signed alone, or another release's)
would otherwise have a delta install bytes, entries and modes no full install would. So the assembled tree
is archived again as the release stage archived it: the same tar stream (:mod:`vllm_bundle.util.tarstream`),
cut into gzip members where the table says its members end, each compressed alone by the same libdeflate
at the release's level (:mod:`vllm_bundle.util.gzip_members`); each part's sha256 must then be the one
release.json gives, the one a full install checks. A tree that differs gives another tar stream, member
ends that differ give other members: either way other parts. What is trusted is the parts' sha256.

Modes are not in question here: the delta writes each entry's mode as the release's tar stream has it
(:func:`vllm_bundle.util.tarstream.released_mode`), whatever the table says.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from vllm_bundle.util.gzip_members import Members, PartDigests
from vllm_bundle.util.tarstream import end_of_archive, header, padding, tar_entry, tree_entries

#: How much of a file is read at a time.
WINDOW = 1 << 20


class _Cutter:
    """The tar stream cut into members at the given sizes, each handed to ``members`` whole; bytes past
    the last size go as one more member (they cannot be the release's)."""

    def __init__(self, members: Members, sizes: Sequence[int]) -> None:
        self.members, self.sizes, self.buffer, self.offset = members, deque(sizes), bytearray(), 0

    def write(self, data: bytes) -> None:
        self.buffer += data
        self.offset += len(data)
        while self.sizes and len(self.buffer) >= self.sizes[0]:
            size = self.sizes.popleft()  # (a real bundle has tens of thousands of members)
            self.members.add(bytes(self.buffer[:size]))
            del self.buffer[:size]

    def close(self) -> None:
        if self.buffer:
            self.members.add(bytes(self.buffer))
            self.buffer.clear()


def archive_digests(
    root: Path,
    source_date: int,
    member_sizes: Sequence[int],
    part_sizes: Sequence[int],
    level: int,
    *,
    leave_out: Collection[str] = (),
    progress: Callable[[int], None] = lambda size: None,
) -> list[str]:
    """The sha256 of each part of the archive of ``root`` (but the top-level names in ``leave_out``), its
    members ending where ``member_sizes`` (inflated) say and its parts where ``part_sizes`` say; one digest
    more where the archive is longer or shorter. ``progress`` is told each regular file's bytes as read."""
    digests = PartDigests(part_sizes)
    members = Members(digests, level)
    cutter = _Cutter(members, member_sizes)
    seen: dict[tuple[int, int], str] = {}
    try:
        for name, path in tree_entries(root, leave_out):
            info = tar_entry(name, path, root, source_date, seen)
            cutter.write(header(info))
            if info.isreg():
                _file(path, info.size, cutter, progress)
                cutter.write(padding(info.size))
        cutter.write(end_of_archive(cutter.offset))
        cutter.close()
        members.finish()
    except BaseException:
        members.abandon()
        raise
    return digests.finish()


def _file(path: Path, size: int, cutter: _Cutter, progress: Callable[[int], None]) -> None:
    left = size
    with path.open("rb") as handle:
        while left:
            data = handle.read(min(left, WINDOW))
            if not data:
                raise OSError(f"{path} is shorter than when it was listed")
            cutter.write(data)
            progress(len(data))
            left -= len(data)
