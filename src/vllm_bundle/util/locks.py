"""Holding a FileLock another process may hold: waited for, saying so once, never silently. The one home
of that wait: the build directory's lock (tree/stage.py), a download's (util/fetch.py) and an install
destination's (install/installer.py). filelock has no "say when you start to wait" hook, hence this."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from filelock import BaseFileLock, Timeout


@contextmanager
def held(lock: BaseFileLock, say: Callable[[], None], *, notice_after: float = 0.0) -> Iterator[None]:
    """``lock`` held for the block. Not free within ``notice_after`` seconds: ``say()`` is called once
    (what is being waited for, in the caller's words) and the lock is waited for as long as it takes."""
    try:
        lock.acquire(timeout=notice_after)
    except Timeout:
        say()
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
