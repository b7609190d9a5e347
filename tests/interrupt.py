"""Ctrl-C sent to a ``vllm-bundle`` process the way a terminal sends it, and, where the process does not
end, evidence of why: its signal masks from ``/proc`` and every thread's Python stack (faulthandler,
dumped on SIGABRT), in the failure message rather than a bare timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest


def start(command: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``command`` running with its pipes captured and faulthandler armed (SIGABRT dumps its stacks)."""
    full_env = {**os.environ, **(env or {}), "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)


def ctrl_c(process: subprocess.Popen[str], within: float) -> tuple[float, str, str]:
    """SIGINT, then the process's output read until it exits; returns (seconds it took, stdout, stderr).
    The pipes are read while waiting: a process blocked writing to a full pipe is not a hang of its own.
    If it has not exited ``within`` seconds, the test fails showing where it was."""
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    try:
        stdout, stderr = process.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        masks = _signal_masks(process.pid)
        process.send_signal(signal.SIGABRT)
        try:
            stdout, stderr = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        pytest.fail(f"still running {within:.0f} s after Ctrl-C ({masks}); its output:\n{stdout}\n{stderr}")
    return time.monotonic() - sent, stdout, stderr


def _signal_masks(pid: int) -> str:
    """The process's pending, blocked, ignored and caught signal masks (``/proc/PID/status``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as err:
        return f"no status: {err}"
    return ", ".join(line.replace("\t", " ") for line in status.splitlines() if line.startswith("Sig"))
