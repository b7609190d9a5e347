"""The bench checks its own runs: a failed run is a FAILED row and gives no ratio, and the peak RSS it
reports is the command's, not the bench's. (The bench's figures themselves are never asserted.)"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from bench.measure import Outcome, run_child, run_inline
from bench.report import Report, ratio
from rich.console import Console


def _printed(report: Report) -> str:
    out = io.StringIO()
    report.print(Console(file=out, width=300, color_system=None))
    return out.getvalue()


def test_a_command_that_fails_is_a_failed_outcome_with_its_last_error_line(tmp_path: Path) -> None:
    script = "import sys; print('working'); print('error: the tool said why', file=sys.stderr); sys.exit(3)"
    outcome = run_child([sys.executable, "-c", script], logs=tmp_path / "logs" / "case")
    assert not outcome.ok
    assert outcome.error is not None and outcome.error.startswith("exit 3: error: the tool said why")


def test_a_command_killed_by_the_timeout_is_a_failure(tmp_path: Path) -> None:
    outcome = run_child([sys.executable, "-c", "import time; time.sleep(60)"], logs=tmp_path / "slow", timeout=1)
    assert not outcome.ok and "killed by signal 9" in (outcome.error or "")
    assert outcome.seconds < 30


def test_the_peak_rss_is_the_commands_own_not_the_benchs(tmp_path: Path) -> None:
    held = bytearray(400 * 2**20)  # the bench holding a lot when it starts a small command
    held[::4096] = b"x" * len(held[::4096])  # touched: resident
    small = run_child([sys.executable, "-c", "pass"], logs=tmp_path / "small")
    big = run_child(
        [sys.executable, "-c", "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"], logs=tmp_path / "big"
    )
    assert small.ok and big.ok
    assert small.peak_rss is not None and small.peak_rss < 100 * 2**20
    assert big.peak_rss is not None and 300 * 2**20 < big.peak_rss < 400 * 2**20
    del held


def test_an_exception_inline_is_a_failure_and_so_is_a_wrong_result() -> None:
    raised = run_inline(lambda: 1 / 0)
    assert not raised.ok and "ZeroDivisionError" in (raised.error or "")
    wrong = run_inline(lambda: 41, lambda result: None if result == 42 else f"got {result}")
    assert wrong.error == "got 41"


def test_a_failed_run_shows_as_failed_and_gives_no_ratio() -> None:
    fine, failed = Outcome(2.0), Outcome(0.5, None, "exit 1: error: no GitHub repository")
    assert ratio(fine, failed) is None and ratio(failed, fine) is None
    assert ratio(Outcome(4.0), fine) == 2.0
    report = Report("bench")
    report.run("bundle, nothing changed", failed, "every stage cached")
    report.goal("nothing changed < 1 s", None)
    text = _printed(report)
    assert "FAILED" in text and "no GitHub repository" in text
    assert "not measured" in text and "0.50 s" not in text
    assert report.failed == ["bundle, nothing changed"]
