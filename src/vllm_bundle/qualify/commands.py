"""``vllm-bundle qualify`` and ``qualify-gpu``: a bundle tree, archive or directory of parts checked,
the report written and printed, a failure one line and a non-zero exit."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_bundle.errors import UsageError
from vllm_bundle.manifests import detect_target
from vllm_bundle.qualify.tier0 import (
    SHOWN,
    Report,
    bundle_root,
    detect_minor,
    failure_message,
    load_rules,
    qualify_tree,
)
from vllm_bundle.recipes import load_recipes
from vllm_bundle.util.fsutil import atomic_write


def print_report(report: Report, path: Path) -> None:
    print(f"tier {report.tier} qualification: {'PASSED' if report.passed else 'FAILED'} ({path})")
    for check in report.checks:
        print(f"  {'ok  ' if check.passed else 'FAIL'} {check.name:<18} {check.summary}")
        for problem in check.problems[:SHOWN]:
            print(f"       - {problem}")
        if len(check.problems) > SHOWN:
            print(f"       - ... and {len(check.problems) - SHOWN} more")


def cmd_qualify(args: argparse.Namespace) -> int:
    recipes = load_recipes(args.recipes)
    with bundle_root(args.bundle) as root:
        name = args.target or detect_target(root)
        if name is None:
            raise UsageError(f"cannot tell the target of {args.bundle}", "pass --target")
        report = qualify_tree(
            root,
            detect_minor(root),
            recipes.target(name),
            load_rules(recipes.root, recipes.python.platform, recipes.vllm.extensions),
        )
    path = args.report or Path(f"qualification-{name}.json")
    atomic_write(path, report.to_json())
    print_report(report, path)
    if not report.passed and not args.warn_only:
        raise failure_message(report, path)
    return 0


def cmd_qualify_gpu(args: argparse.Namespace) -> int:
    # here, not at the top: the GPU tiers talk HTTP to the server they start, and ``qualify`` (tier 0,
    # run for every build) would otherwise import requests and urllib3 for nothing
    from vllm_bundle.qualify.gpu import ServeOptions, merge_into_release, qualify_gpu

    recipes = load_recipes(args.recipes)
    options = ServeOptions(
        model=args.model, max_model_len=args.max_model_len, boot_timeout=args.boot_timeout, port=args.port
    )
    with bundle_root(args.bundle) as root:
        name = args.target or detect_target(root)
        if name is None:
            raise UsageError(f"cannot tell the target of {args.bundle}", "pass --target")
        log = args.log or Path(f"vllm-server-{name}.log").resolve()
        report = qualify_gpu(root, detect_minor(root), recipes.target(name), args.tiers, options, log)
    path = args.report or Path(f"qualification-gpu-{name}.json")
    atomic_write(path, report.to_json())
    print_report(report, path)
    if args.release_dir is not None:
        merge_into_release(args.release_dir, report, args.model)
        print(f"recorded in {args.release_dir / 'release.json'} (SHA256SUMS updated)")
    if not report.passed:
        raise failure_message(report, path)
    return 0
