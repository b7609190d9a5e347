"""Reading a small file that someone else controls, without hanging or filling memory.

What the host (sysfs, procfs) and the user's environment (registry login files) hand us may be a FIFO,
a device such as ``/dev/zero``, or a huge file. ``Path.read_text`` would block forever on a FIFO with
no writer and read ``/dev/zero`` until memory runs out. Here the file is opened non-blocking, refused
unless it is a regular file, and read to at most ``limit`` bytes (one more tells that it is larger).

Written by hand: no standard or well-kept library offers a bounded, type-checked read; it is a dozen
lines over ``os.open``/``os.fstat``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

#: A sysfs attribute is at most one page (``sysfs_emit`` writes into a PAGE_SIZE buffer).
PAGE = 4096


class NotSmallFile(OSError):
    """The path is not a regular file, or is larger than the caller allows."""


def open_regular_file(path: Path, *, follow: bool = True) -> BinaryIO:
    """``path`` opened for reading if it is a regular file: opened non-blocking (a FIFO with no writer
    does not hang the open), and :class:`NotSmallFile` for anything else (FIFO, device, directory,
    socket). ``follow=False``: a symbolic link at ``path`` itself is refused too (``O_NOFOLLOW``: ELOOP)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW)
    descriptor = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotSmallFile(f"{path} is not a regular file")
    except BaseException:
        os.close(descriptor)
        raise
    return os.fdopen(descriptor, "rb")  # O_NONBLOCK means nothing to a regular file's reads


def read_small_bytes(path: Path, limit: int = PAGE, *, head: bool = False, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; :class:`NotSmallFile` when it
    is something else (FIFO, device, directory, socket) or larger (``head``: its first ``limit`` bytes
    instead); other :class:`OSError` as raised. ``follow``: as :func:`open_regular_file`."""
    with open_regular_file(path, follow=follow) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit and head:
        return data[:limit]
    if len(data) > limit:
        raise NotSmallFile(f"{path} is larger than {limit} bytes")
    return data


def read_small_text(path: Path, limit: int = PAGE, *, head: bool = False) -> str:
    """:func:`read_small_bytes` decoded as UTF-8, undecodable bytes replaced."""
    return read_small_bytes(path, limit, head=head).decode("utf-8", errors="replace")
