"""What the build verbs print: a line per stage (a spinner while one runs on a terminal), how vLLM was
built, and the size report of pruning."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

from vllm_bundle.tree.stage import StageResult
from vllm_bundle.util.ci import GitHubActions
from vllm_bundle.util.progress import human_size


def print_size_report(sizes: dict[str, tuple[int, int]], limit: int = 15) -> None:
    print(f"         {'size before and after pruning, largest first':<44}")
    for group, (before, after) in sorted(sizes.items(), key=lambda item: -item[1][0])[:limit]:
        print(f"         {group:<44} {human_size(before):>10} -> {human_size(after):>10}")
    total_before, total_after = sum(b for b, _ in sizes.values()), sum(a for _, a in sizes.values())
    print(f"         {'all':<44} {human_size(total_before):>10} -> {human_size(total_after):>10}")


def stage_printer(
    args: argparse.Namespace,
) -> tuple[Callable[[str], None], Callable[[StageResult], None]]:
    """``(starting, finished)`` callbacks: a spinner on a terminal, one line per stage always, and in
    GitHub Actions each stage's lines in a group of their own."""
    console = Console(stderr=True)
    status = console.status("") if console.is_terminal and not args.plain else None
    ci = GitHubActions.detect()

    def starting(name: str) -> None:
        if ci is not None:
            ci.group(f"stage {name}")
        if status is not None:
            status.update(f"stage {name} ...")
            status.start()

    def finished(result: StageResult) -> None:
        if status is not None:
            status.stop()
        state = "cached" if result.cached else f"built in {result.seconds:.1f} s"
        print(f"stage  {result.name:<11} {state}", flush=True)
        if result.name == "vllm-wheel":
            print(f"         {vllm_build_line(result.details)}", flush=True)
        if result.name == "app" and not result.cached:
            print_size_report(result.details.get("sizes", {}))
        if ci is not None:
            ci.end_group()

    return starting, finished


def vllm_build_line(details: Any) -> str:
    device = details.get("device")
    if device == "rocm":
        extensions = details.get("extensions", {})
        return f"vLLM for ROCm: code objects for {', '.join(details.get('isas', []))} in {', '.join(extensions)}"
    if device == "python-only":
        return "vLLM built Python-only on request (--python-only-vllm): no GPU kernels of its own"
    return f"vLLM: {device} wheel"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
