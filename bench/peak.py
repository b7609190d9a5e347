"""``python -m bench.peak <file> <command...>``: run the command and write its peak RSS (bytes) to
``<file>``; exit as the command did.

Why a process in between: Linux records the memory high-water mark of the address space a process
leaves at ``exec`` in its peak RSS, and ``subprocess`` starts children with ``vfork``, whose address
space is the parent's. A child of the bench (hundreds of MiB after generating a tree) would carry the
bench's own peak. This small process starts the command instead, so the figure is the command's (and its
descendants', as ``wait4`` reports them), over a floor of this process's few MiB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def main() -> int:
    out, command = Path(sys.argv[1]), sys.argv[2:]
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = code = os.waitstatus_to_exitcode(status)
    out.write_text(str(usage.ru_maxrss * 1024))  # KiB on Linux
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
