"""A stand-in for ``vllm serve`` with vLLM 0.33.0's opt-in Rust frontend (``VLLM_USE_RUST_FRONTEND=1``),
run by the bundle's interpreter as the server: its children that never load the bundle's Python.

vLLM starts that frontend from the API server process itself (vllm/entrypoints/cli/serve.py,
``run_multi_api_server`` -> vllm/v1/utils.py, ``RustFrontendProcessManager``) with
``subprocess.Popen(cmd, pass_fds=[listen fd, ZMQ fds])``: a native binary that holds the listening
socket and stops on SIGINT or SIGTERM only (rust/src/cmd/src/main.rs, ``shutdown_signal``), never
watching its parent. Here:

frontend          a native child given the listening socket, started from the main thread as vLLM does;
                  it is ``sh``, which starts a child of its own (frontend-child, holding the socket too)
                  and then ``exec``\\s ``sleep``
threaded-native   a native child started from a short-lived thread, which then ends
engine            the engine, started with multiprocessing ``spawn``
engine-native     a native child of the engine

On SIGTERM the server exits with status 0 at once (``os._exit``: multiprocessing's exit handler would
wait for the engine, which ignores SIGTERM), leaving its children to the runtime.

Usage: ``native_orphan_server.py <pid dir>``; each process writes ``<role>.pid`` there, and the server
writes ``port``: the listening socket's, refused once no process holds it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SLEEP = ("sleep", "300")


def _record(pids: Path, role: str, value: int) -> None:
    (pids / f"{role}.tmp").write_text(str(value))
    (pids / f"{role}.tmp").rename(pids / role)


def _native(pids: Path, role: str) -> None:
    _record(pids, f"{role}.pid", subprocess.Popen(SLEEP).pid)


def engine(pids: Path) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _native(pids, "engine-native")
    _record(pids, "engine.pid", os.getpid())
    while True:
        time.sleep(60)


def main() -> None:
    pids = Path(sys.argv[1])
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    listener = socket.create_server(("127.0.0.1", 0))
    child = pids / "frontend-child.pid"
    frontend = subprocess.Popen(
        ["sh", "-c", 'sleep 300 & echo $! > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 300', "sh", str(child)],
        pass_fds=[listener.fileno()],
    )
    _record(pids, "frontend.pid", frontend.pid)
    multiprocessing.get_context("spawn").Process(target=engine, args=(pids,)).start()
    starter = threading.Thread(target=_native, args=(pids, "threaded-native"))
    starter.start()
    starter.join()  # the thread that started "threaded-native" is gone now
    _record(pids, "port", listener.getsockname()[1])
    _record(pids, "server.pid", os.getpid())
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
