"""Download progress: rich bars (one per file and a total) on a terminal, plain lines otherwise. A step
that is not a download (extracting a release) reports through the same calls, with ``download=False``."""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from vllm_bundle.errors import redact_urls


def human_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


class Reporter(Protocol):
    def __enter__(self) -> Reporter: ...
    def __exit__(self, *exc: object) -> None: ...
    def begin(self, key: str, label: str, total: int | None, have: int, *, download: bool = True) -> None:
        """``download=False``: a step that is not a download (``label`` says what it does): no ``fetch``
        verb, and not counted in the downloads' total."""

    def advance(self, key: str, nbytes: int) -> None: ...
    def restart(self, key: str, have: int, reason: str) -> None: ...
    def finish(self, key: str, status: str) -> None: ...
    def note(self, message: str) -> None: ...


class PlainReporter:
    """One line per event; for logs and CI, where redrawn bars would be noise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()
        self._started: dict[str, float] = {}
        self._labels: dict[str, str] = {}
        self._bytes: dict[str, int] = {}

    def __enter__(self) -> PlainReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _line(self, text: str) -> None:
        with self._lock:
            print(text, file=self.stream, flush=True)

    def begin(self, key: str, label: str, total: int | None, have: int, *, download: bool = True) -> None:
        self._started[key], self._labels[key], self._bytes[key] = time.monotonic(), label, 0
        size = human_size(total) if total is not None else "unknown size"
        resume = f", resuming at {human_size(have)}" if have else ""
        verb = "fetch  " if download else ""
        self._line(f"{verb}{label} ({size}{resume})")

    def advance(self, key: str, nbytes: int) -> None:
        self._bytes[key] = self._bytes.get(key, 0) + nbytes

    def restart(self, key: str, have: int, reason: str) -> None:
        self._line(f"retry  {self._labels.get(key, key)}: {reason}; continuing from {human_size(have)}")

    def finish(self, key: str, status: str) -> None:
        seconds = time.monotonic() - self._started.get(key, time.monotonic())
        moved = human_size(self._bytes.get(key, 0))
        self._line(f"{status:<6} {self._labels.get(key, key)} ({moved} in {seconds:.1f} s)")

    def note(self, message: str) -> None:
        self._line(redact_urls(message))


class RichReporter:
    """A bar per file in flight and one for the total, redrawn in place."""

    def __init__(self, console: Console, grand_total: int | None) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._uncounted: set[str] = set()  # steps that are not downloads: kept out of the total
        # Hidden until a download begins: a reporter of other steps only (a push) has no total to show.
        self._total = self.progress.add_task("[bold]total", total=grand_total, visible=grand_total is not None)

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def begin(self, key: str, label: str, total: int | None, have: int, *, download: bool = True) -> None:
        self._tasks[key] = self.progress.add_task(label, total=total, completed=have)
        if download:
            self.progress.update(self._total, visible=True)
            self.progress.advance(self._total, have)
        else:
            self._uncounted.add(key)

    def advance(self, key: str, nbytes: int) -> None:
        self.progress.advance(self._tasks[key], nbytes)
        if key not in self._uncounted:
            self.progress.advance(self._total, nbytes)

    def restart(self, key: str, have: int, reason: str) -> None:
        task = self._tasks[key]
        lost = self.progress.tasks[task].completed - have
        self.progress.update(task, completed=have)
        if key not in self._uncounted:
            self.progress.advance(self._total, -lost)
        self.progress.console.log(f"retry {self.progress.tasks[task].description}: {reason}")

    def finish(self, key: str, status: str) -> None:
        task = self._tasks.pop(key, None)
        self._uncounted.discard(key)
        if task is not None:
            self.progress.remove_task(task)
        if status != "cached":
            self.progress.console.log(f"{status} {key}")

    def note(self, message: str) -> None:
        self.progress.console.log(redact_urls(message))


@contextmanager
def reported_step(
    reporter: Reporter | None, label: str, total: int, *, download: bool = False
) -> Iterator[Callable[[int], None]]:
    """One step's progress through ``reporter`` (none: silent), ``total`` bytes: yields what to tell each
    byte count, and reports the step done or failed. ``download``: its bytes count towards the total
    downloaded (an extraction's do not)."""
    if reporter is None:
        yield lambda count: None
        return
    reporter.begin(label, label, total, 0, download=download)
    status = "error"
    try:
        yield functools.partial(reporter.advance, label)
        status = "done"
    finally:
        reporter.finish(label, status)


def make_reporter(grand_total: int | None, plain: bool | None = None) -> Reporter:
    console = Console(stderr=True)
    if plain is None:
        plain = not console.is_terminal
    return PlainReporter() if plain else RichReporter(console, grand_total)
