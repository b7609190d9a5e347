"""How the bench times a run and checks it: every run gives an :class:`Outcome` that says whether it
succeeded, and a figure is only ever computed from outcomes that did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Outcome:
    """One timed run. ``peak_rss`` (bytes) is the largest resident set of the run's processes (the child
    and every descendant it waited for: what ``wait4`` reports), None for a run in the bench's own
    process. ``error`` is None when the run succeeded; otherwise what went wrong, in one line."""

    seconds: float
    peak_rss: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def run_child(
    argv: Sequence[str | Path],
    *,
    logs: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 3600,
) -> Outcome:
    """Run a command to completion and measure it: wall time, and peak RSS (the largest of the command
    and its waited-for descendants, through :mod:`bench.peak`). Output goes to ``logs``
    (``<logs>.out``/``.err``), so a failure can be read after the table is printed. A non-zero exit, a
    signal or the timeout make the outcome a failure, with the last line of stderr as its error."""
    logs.parent.mkdir(parents=True, exist_ok=True)
    out, err, rss = logs.with_suffix(".out"), logs.with_suffix(".err"), logs.with_suffix(".rss")
    rss.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "bench.peak", str(rss), *map(str, argv)]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        began = time.perf_counter()
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=_child_env(env),
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the wrapper and the command it started
            code = process.wait()
        seconds = time.perf_counter() - began
    peak = int(rss.read_text()) if rss.exists() else None
    if code == 0:
        return Outcome(seconds, peak)
    signalled = -code if code < 0 else code - 128 if code > 128 else None
    why = f"killed by signal {signalled}" if signalled else f"exit {code}"
    detail = _last_line(err) or _last_line(out)
    return Outcome(seconds, peak, f"{why}: {detail} (log: {err})" if detail else f"{why} (log: {err})")


def _child_env(extra: dict[str, str] | None) -> dict[str, str]:
    """The bench's environment, with its own folder importable (``bench.peak``, ``bench.child``)."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_inline(action: Callable[[], object], check: Callable[[object], str | None] = lambda _: None) -> Outcome:
    """Time ``action`` in this process. An exception, or ``check`` returning a problem about what the
    action returned, makes the outcome a failure."""
    began = time.perf_counter()
    try:
        result = action()
    except Exception as err:  # the bench reports any failure as a failed row, and goes on
        last = traceback.format_exception_only(err)[-1].strip()
        return Outcome(time.perf_counter() - began, None, last)
    seconds = time.perf_counter() - began
    return Outcome(seconds, None, check(result))


def mib(size: int | None) -> str:
    return "?" if size is None else f"{size / 2**20:.0f} MiB"
