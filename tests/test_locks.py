"""util/locks.py: a lock another process holds is waited for, saying so once; a free one says nothing.
(Through the three users: tests/test_safety.py's second build, tests/test_install.py's second install.)"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from filelock import FileLock

from vllm_bundle.util.locks import held

#: Holds the lock at argv[1] until a line comes on its stdin.
HOLDER = (
    "import sys; from filelock import FileLock; l = FileLock(sys.argv[1]); l.acquire(); print(1, flush=True); input()"
)


def test_a_free_lock_is_taken_without_a_word(tmp_path: Path) -> None:
    said: list[str] = []
    with held(FileLock(tmp_path / "x.lock"), lambda: said.append("waiting"), notice_after=5):
        pass
    assert said == []


def test_a_held_lock_is_waited_for_saying_so_once(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    said: list[str] = []
    inside = threading.Event()

    def take() -> None:
        with held(FileLock(path), lambda: said.append("waiting"), notice_after=0.2):
            inside.set()

    try:
        assert holder.stdout is not None and holder.stdout.readline() == "1\n", "the other process holds it"
        taker = threading.Thread(target=take)
        taker.start()
        assert not inside.wait(1.0), "not taken while the other holds it"
        assert said == ["waiting"]
        holder.communicate("\n", timeout=30)
        taker.join(30)
        assert inside.is_set() and said == ["waiting"], "taken once the other let go, said once"
    finally:
        holder.kill()
        holder.wait()
