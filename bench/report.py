"""The bench's table: a row per run, a failed run shown as FAILED with its error (and never a ratio
from it), and a verdict per goal."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.measure import Outcome, mib


class Report:
    def __init__(self, title: str) -> None:
        self.table = Table(title=title)
        for column in ("case", "figure", "workload", "ratio / verdict"):
            self.table.add_column(column)
        self.failed: list[str] = []
        self.missed: list[str] = []

    def row(self, case: str, figure: str, workload: str = "", ratio: str = "") -> None:
        self.table.add_row(escape(case), escape(figure), escape(workload), escape(ratio))

    def run(self, case: str, outcome: Outcome, workload: str = "", ratio: str = "", figure: str | None = None) -> bool:
        """A row for one run; a failed run says FAILED and why, and the caller computes no ratio from it."""
        if not outcome.ok:
            self.failed.append(case)
            self.table.add_row(
                escape(case), "[red]FAILED[/]", escape(workload), f"[red]{escape(outcome.error or '')}[/]"
            )
            return False
        shown = figure if figure is not None else seconds_and_rss(outcome)
        self.row(case, shown, workload, ratio)
        return True

    def goal(self, text: str, met: bool | None, figure: str = "") -> None:
        """``met`` None: a run the goal needs failed, so the goal is not measured."""
        if met is None:
            verdict = "[yellow]not measured: a run it needs failed[/]"
        else:
            verdict = "[green]met[/]" if met else "[red]NOT met[/]"
            if not met:
                self.missed.append(text)
        self.table.add_row(f"goal: {escape(text)}", "", "", f"{escape(figure)} {verdict}".strip())

    def print(self, console: Console) -> None:
        console.print(self.table)
        if self.failed:
            console.print(f"[red]{len(self.failed)} run(s) failed:[/] {escape(', '.join(self.failed))}")


def seconds_and_rss(outcome: Outcome) -> str:
    rss = f", peak RSS {mib(outcome.peak_rss)}" if outcome.peak_rss is not None else ""
    return f"{outcome.seconds:.2f} s{rss}"


def ratio(slower: Outcome, faster: Outcome) -> float | None:
    """How many times faster ``faster`` was; None when either run failed."""
    if not (slower.ok and faster.ok) or faster.seconds <= 0:
        return None
    return slower.seconds / faster.seconds
