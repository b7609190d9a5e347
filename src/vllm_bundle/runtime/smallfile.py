"""Reading a small file that someone else controls, without hanging or filling memory.

What the host (sysfs, procfs) and the user's environment (registry login files) hand us may be a FIFO,
a device such as ``/dev/zero``, or a huge file. ``Path.read_text`` would block forever on a FIFO with
no writer and read ``/dev/zero`` until memory runs out. Here the file is opened non-blocking, refused
unless it is a regular file, and read to at most ``limit`` bytes (one more tells that it is larger).

Written by hand: no standard or well-kept library offers a bounded, type-checked read; it is a dozen
lines over ``os.open``/``os.fstat``/``os.read``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: A sysfs attribute is at most one page (``sysfs_emit`` writes into a PAGE_SIZE buffer).
PAGE = 4096


class NotSmallFile(OSError):
    """The path is not a regular file, or is larger than the caller allows."""


def read_small_bytes(path: Path, limit: int = PAGE, *, head: bool = False) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; :class:`NotSmallFile` when it
    is something else (FIFO, device, directory, socket) or larger (``head``: its first ``limit`` bytes
    instead); other :class:`OSError` as raised."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    descriptor = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotSmallFile(f"{path} is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(descriptor, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(descriptor)
    if size > limit and head:
        return b"".join(chunks)[:limit]
    if size > limit:
        raise NotSmallFile(f"{path} is larger than {limit} bytes")
    return b"".join(chunks)


def read_small_text(path: Path, limit: int = PAGE, *, head: bool = False) -> str:
    """:func:`read_small_bytes` decoded as UTF-8, undecodable bytes replaced."""
    return read_small_bytes(path, limit, head=head).decode("utf-8", errors="replace")
