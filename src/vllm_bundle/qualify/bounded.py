"""Running the bundle's own code, which qualification must not trust to end, with a bound that holds.

``subprocess.run(..., timeout=)`` does not give one: at the timeout it kills only the process it started,
and then waits for its pipes, which any process that one forked still holds open; and it kills nothing
when that process exits by itself and leaves a child of its own running. Here the command runs in its own
session (so its own process group: every process it forks is in it, unless one starts a session of its
own), its output goes to files rather than pipes (so nothing waits for a pipe's last writer), and once the
command has ended, or at the deadline, the whole group is killed. The process started is reaped only
after that: until then its pid, which is its group's id, cannot be given to another process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import IO

import psutil

#: How often the wait looks whether the command has ended (it must not reap it, so it cannot block).
POLL_S = 0.05
#: How long a killed group is given to be gone: SIGKILL ends a process at once unless it is inside the
#: kernel in an uninterruptible wait (a hung device or file system), which no signal can cut short.
KILL_WAIT_S = 5.0


class Bounded(subprocess.CompletedProcess[str]):
    """A command's result, and how many processes of its group were still running when it ended (each
    then killed): a command that leaves work running behind it did not finish that work."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str, left_running: int) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.left_running = left_running


def run_bounded(command: Sequence[str], *, env: Mapping[str, str], timeout: float) -> Bounded:
    """Run ``command`` (no stdin; stdout and stderr captured as text) for at most ``timeout`` seconds,
    then kill its whole process group. Raises :class:`subprocess.TimeoutExpired` (with what it wrote)
    when it had not ended by then; ``OSError`` when it cannot be started."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
        )
        try:
            ended = _ended(process.pid, timeout)
            left = _others_in_group(process.pid) if ended else 0
        finally:  # an interrupt, too: in a session of its own, a Ctrl-C does not reach the group
            _kill_group(process.pid)
            process.wait()
        stdout, stderr = (_text(stream) for stream in (out, err))
    if not ended:
        raise subprocess.TimeoutExpired(list(command), timeout, stdout, stderr)
    return Bounded(list(command), process.returncode, stdout, stderr, left)


def _ended(pid: int, timeout: float) -> bool:
    """Whether ``pid`` ends within ``timeout`` s; it is left unreaped (``WNOWAIT``)."""
    deadline = time.monotonic() + timeout
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(POLL_S, left))
    return True


def _others_in_group(group: int) -> int:
    """The processes of ``group`` still running, its leader and any zombie (ended, not yet reaped by its
    parent, or by init when its parent is gone) not counted."""
    count = 0
    for process in psutil.process_iter():
        try:
            if process.pid != group and os.getpgid(process.pid) == group:
                count += process.status() != psutil.STATUS_ZOMBIE
        except (OSError, psutil.Error):  # ended meanwhile
            continue
    return count


def _kill_group(group: int) -> None:
    """SIGKILL to every process of ``group``, then a wait until none of them runs any more: a signal is
    delivered, not obeyed at once, and the caller is told that nothing of the command outlives it."""
    with suppress(ProcessLookupError):  # cannot happen while the leader is unreaped; harmless if it does
        os.killpg(group, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while _others_in_group(group) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _text(stream: IO[bytes]) -> str:
    stream.seek(0)
    return stream.read().decode(errors="replace")
