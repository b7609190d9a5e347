"""GitHub Actions' workflow commands: one foldable ``::group::`` per stage in the job's log, and the one-line
error as an ``::error::`` annotation on the run's summary page.

Written by hand: the commands are lines on stdout with a documented escaping, and the libraries that
print them (e.g. ``actions-toolkit``) are for JavaScript or pull in far more than two lines need.
Format: https://docs.github.com/en/actions/reference/workflow-commands-for-github-actions
("Grouping log lines", "Setting an error message"; data escapes ``%`` ``\\r`` ``\\n``).
"""

from __future__ import annotations

import os
import sys
from typing import TextIO


def _escape(data: str) -> str:
    """A workflow command's data, escaped as the runner unescapes it."""
    return data.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


class GitHubActions:
    """Workflow commands, written to ``out`` (stdout: the runner reads them there). Groups do not nest in
    GitHub's log, so opening one closes the one still open."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out
        self._open = False

    @staticmethod
    def detect() -> GitHubActions | None:
        """An instance when running as a GitHub Actions step (``GITHUB_ACTIONS=true``), else None."""
        return GitHubActions() if os.environ.get("GITHUB_ACTIONS") == "true" else None

    def _write(self, line: str) -> None:
        out = self._out or sys.stdout
        out.write(line + "\n")
        out.flush()

    def group(self, title: str) -> None:
        self.end_group()
        self._write(f"::group::{_escape(title)}")
        self._open = True

    def end_group(self) -> None:
        if self._open:
            self._write("::endgroup::")
            self._open = False

    def error(self, message: str) -> None:
        self.end_group()
        self._write(f"::error::{_escape(message)}")
