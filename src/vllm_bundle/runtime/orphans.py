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

Children that never load the bundle's Python are not armed by the ``.pth``. vLLM 0.33.0 has one that
matters: with ``VLLM_USE_RUST_FRONTEND=1`` the API server starts its Rust frontend, a native binary,
with ``subprocess.Popen(cmd, pass_fds=[listen fd, ZMQ fds])`` (vllm/entrypoints/cli/serve.py,
``run_multi_api_server`` -> vllm/v1/utils.py, ``RustFrontendProcessManager``); it holds the server's
listening socket and stops on SIGINT or SIGTERM only (rust/src/cmd/src/main.rs, ``shutdown_signal``),
never watching its parent. So the server, and only the server, also starts a *reaper*: this file run
by the bundle's python (``-I -S``: no ``.pth``, no installer's ``sitecustomize``) in a session of its
own, as a child of the server. The server puts a random token in :data:`TOKEN_VARIABLE` of its
environment first, which every process below it inherits whatever starts it (subprocess, spawn, fork,
``posix_spawn``, a native program's own children) and from whichever thread; the reaper's own
environment has none. The reaper waits on a pidfd of the server (a server already gone, or no pidfd:
its parent pid is no longer the server's), then SIGKILLs, through a pidfd opened before it reads the
environment again (so a pid reused meanwhile is never signalled), every process whose
``/proc/<pid>/environ`` holds ``<TOKEN_VARIABLE>=<token>``, and scans again until a scan finds none it
has not killed (a process forked just before its parent was killed is found by the next one); then it
exits. So it runs as long as the server does, acts only once the server has exited (SIGKILL or not),
and kills nothing without this server's token: not another server's processes, not the installer. If it
cannot start, the server says so in one line and starts anyway (the Python processes are still tied).

Why not the others: ``PR_SET_CHILD_SUBREAPER`` needs an ancestor of the server that outlives it, and
the server has none of ours (the launcher ``exec``s python; above it are only the installer and init).
``PR_SET_PDEATHSIG`` set in the child between fork and exec has no place to run: subprocess's fork path
is C (``_posixsubprocess``) and runs no Python in the child except ``preexec_fn``, which is unsafe with
threads (vLLM has many), and ``os.posix_spawn``, ``os.system`` and native code would each need their own
hook; it would still fire when the *thread* that called ``Popen`` ends, and it covers one generation only.
Limits of the token: a process that ``exec``s with a cleared environment, one whose environment cannot
be read (set-uid, not dumpable) and one that overwrote its initial environment block (``setproctitle``
does) do not carry it; the Python ones among them are still tied by the pidfd watcher above.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence

# os.path, os.listdir and open() rather than pathlib: this module is imported at every start of every
# Python process under the server, and pathlib's imports would cost each of them several milliseconds.

VARIABLE = "VLLM_BUNDLE_PARENT_PID"
#: Set by the server to a token of its own (``<pid>.<random>``); every process below it inherits it.
TOKEN_VARIABLE = "VLLM_BUNDLE_SERVER_TOKEN"  # noqa: S105 - the variable's name, not a secret
POLL_SECONDS = 0.2  # only without pidfd_open
#: A pid has at most 7 digits (pid_max is at most 2**22); anything longer is no pid.
PID_DIGITS = 7
#: A bound on the reaper's scans, should a killed process linger (in uninterruptible sleep) meanwhile.
SWEEP_SECONDS = 10.0


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
    else:
        _start_reaper()
    _hand_down()


_reaper: object = None  # the server's handle on its reaper, kept so it is never collected while running


def _start_reaper() -> None:
    """In the server: a reaper for the processes below it that the ``.pth`` does not arm."""
    global _reaper
    if _reaper is not None:
        return  # armed twice: one reaper, one token
    try:
        import subprocess  # only the server pays for it

        token = f"{os.getpid()}.{os.urandom(8).hex()}"
        environment = {key: value for key, value in os.environ.items() if key not in (VARIABLE, TOKEN_VARIABLE)}
        flags = ["-I", "-S", *(["-B"] if sys.dont_write_bytecode else [])]
        _reaper = subprocess.Popen(
            [sys.executable, *flags, os.path.abspath(__file__), str(os.getpid()), token],  # noqa: PTH100
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C or a signal to the server's group does not end it first
        )
        os.environ[TOKEN_VARIABLE] = token
    except Exception as err:  # the Python processes are still tied: go on
        print(
            f"vllm-bundle: cannot start the reaper of this server's non-Python processes: {type(err).__name__}: {err}",
            file=sys.stderr,
        )


def _parent_from_environment() -> int | None:
    value = os.environ.get(VARIABLE, "")
    # ASCII digits only, and no more than a pid has: str.isdigit() takes '²', which int() refuses
    if not (value.isascii() and value.isdigit() and len(value) <= PID_DIGITS):
        return None
    return int(value) if int(value) > 0 else None


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


# -- the reaper ------------------------------------------------------------------------------------------


def reap(server: int, token: str) -> None:
    """Wait for ``server`` (the parent of this process) to exit, then SIGKILL every process that carries
    its token."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _wait_for_exit(server)
    kill_carriers(token)


def _wait_for_exit(server: int) -> None:
    try:
        handle = os.pidfd_open(server)
    except ProcessLookupError:
        return
    except (OSError, AttributeError):
        handle = -1
    try:
        if os.getppid() != server:
            return  # it exited before the pidfd was opened (which may name another process now)
        if handle >= 0:
            poller = select.poll()
            poller.register(handle, select.POLLIN)
            while not poller.poll():
                pass
        else:
            while os.getppid() == server:  # an orphan is given another parent
                time.sleep(POLL_SECONDS)
    finally:
        if handle >= 0:
            os.close(handle)


def kill_carriers(token: str, within: float = SWEEP_SECONDS) -> list[int]:
    """SIGKILL every process whose environment holds ``token`` (but this one; those of other users cannot
    be read), scanning until a scan finds none not killed yet; the pids killed."""
    entry = f"{TOKEN_VARIABLE}={token}".encode()
    killed: set[tuple[int, bytes]] = set()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        new = {found for found in _carriers(entry) if found not in killed and _kill(found[0], entry)}
        if not new:
            break
        killed |= new  # one killed but not gone yet (exiting, or in uninterruptible sleep) is not new
    return sorted(pid for pid, _ in killed)


def _carriers(entry: bytes) -> Iterator[tuple[int, bytes]]:
    me = os.getpid()
    for name in os.listdir("/proc"):  # noqa: PTH208
        if name.isdigit() and int(name) != me and _carries(int(name), entry):
            yield int(name), _start_time(int(name))


def _carries(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:  # noqa: PTH123
            return entry in file.read().split(b"\0")
    except OSError:  # gone, another user's, or not dumpable
        return False


def _start_time(pid: int) -> bytes:
    """The process's start time (``/proc/<pid>/stat`` field 22): with the pid, one process ever."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:  # noqa: PTH123
            return file.read().rpartition(b")")[2].split()[19]
    except (OSError, IndexError):
        return b""


def _kill(pid: int, entry: bytes) -> bool:
    """SIGKILL ``pid`` if it still carries ``entry``, through a pidfd opened first: a pid reused since
    the scan read the environment is never signalled."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (OSError, AttributeError):  # no pidfd_open (Linux < 5.3)
        handle = -1
    try:
        if not _carries(pid, entry):
            return False
        if handle >= 0:
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except OSError:  # gone since
        return False
    finally:
        if handle >= 0:
            os.close(handle)


def main(argv: Sequence[str]) -> int:
    """``python -I -S orphans.py <server pid> <token>``: the reaper, started by :func:`_start_reaper`."""
    try:
        server, token = int(argv[0]), argv[1]
        reap(server, token)
    except Exception as err:
        print(f"vllm-bundle: the reaper of this server failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
