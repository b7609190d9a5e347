"""Tar archives read or written once, front to back. Standard library only: ``install`` imports it, and
the installer's environment has none of the build's dependencies."""

from __future__ import annotations

import tarfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import SupportsRead


class StreamTar(tarfile.TarFile):
    """A tar read or written once, front to back (``r|gz``, ``w|``), that keeps no list of its entries:
    tarfile appends each one it reads or writes to ``members`` (for ``getmembers()``, which a stream
    never calls), and a bundle's hundreds of thousands of files would grow that with their count."""

    members: list[tarfile.TarInfo]  # tarfile's own list (typeshed leaves it out)

    def next(self) -> tarfile.TarInfo | None:
        member = super().next()
        self.members.clear()  # iteration asks next() for each entry once the list is empty
        return member

    def addfile(self, tarinfo: tarfile.TarInfo, fileobj: SupportsRead[bytes] | None = None) -> None:
        super().addfile(tarinfo, fileobj)
        self.members.clear()
