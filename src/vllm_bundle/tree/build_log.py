"""What went wrong first in a failed vLLM build's log.

The log of a failed build ends in setuptools' and uv's traceback of the failed ``cmake`` call, which says
only that CMake failed: what failed is earlier, in CMake's own words ("CMake Error at <file>:<line>" and
its indented message) or ninja's ("FAILED: <target>", the command, then the compiler's message). A
configure's feature probes print compiler errors, and ninja's FAILED lines of their own, too
(``try_compile`` of hipBLASLt's newer types, say) that fail nothing: compiler messages count only after a
``FAILED:`` line, and a probe's ``FAILED:`` does not. Where neither is found, the
last error of setup.py is taken: its ``error: ...`` line (setuptools' own) or the exception that ended it
(``ModuleNotFoundError: ...``), not uv's "error: Failed to build" that follows either.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: At most this many lines of one error are quoted.
MAX_LINES = 12
_CMAKE_ERROR = re.compile(r"^CMake Error\b")
#: ninja's line for a failed edge (1.12 and later add ``[code=N]``), but not in a try_compile probe's own
#: project (CMake names those ``cmTC_<hex>``; vLLM prints the output of the ones that fail).
_NINJA_FAILED = re.compile(r"^FAILED: (?!.*\bcmTC_)")
_NINJA_PROGRESS = re.compile(r"^\[\d+/\d+\] |^ninja: ")
_SETUP_ERROR = re.compile(r"^error: (?!Failed to build)|^[A-Za-z_][\w.]*(Error|Exception): ")


def _cmake_block(lines: Sequence[str], start: int) -> list[str]:
    """``CMake Error at ...:`` and its message: the indented and blank lines that follow, up to the next
    unindented line."""
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if line and not line.startswith(" "):
            break
        block.append(line)
    return [line for line in block if line.strip()][:MAX_LINES]


def _ninja_block(lines: Sequence[str], start: int) -> list[str]:
    """``FAILED: <target>`` and the compiler's message after its command line, up to ninja's next line."""
    block = [lines[start]]
    for line in lines[start + 2 :]:
        if _NINJA_PROGRESS.match(line):
            break
        block.append(line)
    return [line for line in block if line.strip()][:MAX_LINES]


def first_error(text: str) -> list[str]:
    """The lines of the first error the log shows, as the module's docstring says; [] when none."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if _CMAKE_ERROR.match(line):
            return _cmake_block(lines, index)
        if _NINJA_FAILED.match(line):
            return _ninja_block(lines, index)
    errors = [line for line in lines if _SETUP_ERROR.match(line)]
    return errors[-1:]


_CMAKE_AT = re.compile(r"^(CMake Error at )\S*/([^/\s]+:\d+)")


def summary(block: Sequence[str], limit: int = 300) -> str:
    """One line of an error block: its lines' words joined (a CMake error's file by its name alone), cut
    at ``limit`` characters."""
    text = " ".join(" ".join(block).split())
    text = _CMAKE_AT.sub(r"\1\2", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
