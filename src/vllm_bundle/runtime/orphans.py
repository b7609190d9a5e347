"""Every process a bundled ``vllm-server`` starts dies with the process that started it, however that
one dies (SIGKILL included), so no EngineCore is left holding GPU memory.

Why this is needed: installers stop the server with SIGTERM and SIGKILL after 5 s (Lemonade:
src/cpp/server/utils/platform/process_linux.cpp, ``terminate``, signals the server's pid only), and a
load that times out is killed outright. vLLM starts its EngineCore with multiprocessing ``spawn`` and
watches its parent only between EngineCore and multi-GPU workers (vllm/v1/executor/
multiproc_executor.py's death pipe), so a killed API server leaves the EngineCore running.

How: the launcher exports :data:`VARIABLE` as its own pid (it ``exec``s python, so that is the server's
pid). A ``.pth`` file in the bundle's site-packages (not a ``sitecustomize``: installers put theirs on
``PYTHONPATH``) calls :func:`arm` in every Python process the bundle's interpreter starts. In the server
itself it does nothing; in a process below it, a daemon thread waits on a pidfd of the process that
started it and SIGKILLs its own process when that one exits; then the variable is set to this
process's pid for its own children. A forked child (``fork`` start method) is armed the same way.

Why not ``prctl(PR_SET_PDEATHSIG)``: it fires when the parent *thread* that forked the child exits,
so a child started from a worker thread would be killed while the server is healthy. A pidfd follows
the process. It needs Linux 5.3; on older kernels the thread polls the pid instead.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading

VARIABLE = "VLLM_BUNDLE_PARENT_PID"
POLL_SECONDS = 0.2  # only without pidfd_open


def arm() -> None:
    """Called at interpreter start-up by the bundle's ``.pth`` file; never stops the interpreter."""
    try:
        _arm()
    except Exception as err:  # a start-up hook that fails must not take the server down with it
        print(f"vllm-bundle: cannot tie this process to its parent: {type(err).__name__}: {err}", file=sys.stderr)


def _arm() -> None:
    parent = _parent_from_environment()
    if parent is None:
        return  # not under vllm-server
    if parent != os.getpid():
        _die_with(parent)
    _hand_down()


def _parent_from_environment() -> int | None:
    value = os.environ.get(VARIABLE, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _hand_down() -> None:
    """This process is the parent its children watch: by the environment (spawn, subprocess) and by
    the fork hooks (fork keeps the environment, and starts no interpreter to read it again)."""
    os.environ[VARIABLE] = str(os.getpid())
    os.register_at_fork(before=_remember_forker, after_in_child=_armed_after_fork)


_forker = 0


def _remember_forker() -> None:
    global _forker
    _forker = os.getpid()


def _armed_after_fork() -> None:
    if _forker:
        _die_with(_forker)
    os.environ[VARIABLE] = str(os.getpid())


def _die_with(parent: int) -> None:
    """SIGKILL this process once ``parent`` has exited (at once if it already has)."""
    try:
        handle = os.pidfd_open(parent)
    except ProcessLookupError:
        _kill_self()
        return
    except (OSError, AttributeError):
        handle = -1  # no pidfd_open (Linux < 5.3): poll instead
    threading.Thread(target=_watch, args=(parent, handle), name="vllm-bundle-die-with-parent", daemon=True).start()


def _watch(parent: int, handle: int) -> None:
    if handle >= 0:
        poller = select.poll()
        poller.register(handle, select.POLLIN)  # readable once the process has exited
        while not poller.poll():
            pass
    else:
        while _alive(parent):
            threading.Event().wait(POLL_SECONDS)
    _kill_self()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
