"""A stand-in for ``vllm serve``'s process tree, run by the bundle's interpreter as the server.

Like vLLM it starts its engine with multiprocessing (``spawn`` by default: vllm/entrypoints/common/
startup.py sets it for the CLI; ``fork`` when VLLM_WORKER_MULTIPROC_METHOD says so), and the engine
starts a worker; both ignore SIGTERM, as vLLM's EngineCore handles it itself. One more child is started
from a short-lived thread, which then ends: it must live on while the server does.

Usage: ``orphan_server.py <pid dir> <spawn|fork>``; each process writes ``<role>.pid`` there.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _record(pids: Path, role: str) -> None:
    (pids / f"{role}.pid.tmp").write_text(str(os.getpid()))
    (pids / f"{role}.pid.tmp").rename(pids / f"{role}.pid")


def _sleep_forever(pids: Path, role: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _record(pids, role)
    while True:
        time.sleep(60)


def engine(pids: Path, method: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    context: Any = multiprocessing.get_context(method)  # typeshed types it by the literal name only
    context.Process(target=_sleep_forever, args=(pids, "worker")).start()
    _sleep_forever(pids, "engine")


def main() -> None:
    pids, method = Path(sys.argv[1]), sys.argv[2]
    context: Any = multiprocessing.get_context(method)
    context.Process(target=engine, args=(pids, method)).start()
    starter = threading.Thread(target=lambda: context.Process(target=_sleep_forever, args=(pids, "threaded")).start())
    starter.start()
    starter.join()  # the thread that started "threaded" is gone now
    _record(pids, "server")
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
