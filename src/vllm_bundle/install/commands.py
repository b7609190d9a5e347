"""The consumer's verbs: ``vllm-bundle install`` (a release, verified, atomic, resumable, after doctor's
checks) and ``vllm-bundle doctor`` (can this machine run a bundle). Runtime dependencies only."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from platformdirs import user_data_path

from vllm_bundle.errors import InstallError, NotReadyError, RecipeError, UsageError
from vllm_bundle.install.doctor import (
    GLIBC_FILE,
    blockers,
    diagnose,
    for_install,
    glibc_check,
    host_glibc,
    render_json,
    render_text,
)
from vllm_bundle.install.gpu_detect import detect_isas, target_for_isas
from vllm_bundle.manifests import GLIBC_VERSION, detect_target
from vllm_bundle.paths import default_cache_dir
from vllm_bundle.recipes import Target, load_recipes, load_targets
from vllm_bundle.runtime.amdgpu import HOST_ROOT_VARIABLE, host_root

if TYPE_CHECKING:
    from vllm_bundle.install.installer import Release


def _install_target(args: argparse.Namespace) -> str | None:
    """The target asked for: a name, or (``auto``) the one covering this machine's GPU."""
    if args.target is None:
        return None
    targets = load_targets(args.recipes)
    if args.target != "auto":
        if args.target not in targets:
            raise RecipeError(f"unknown target {args.target!r}; valid targets: {', '.join(targets)}, auto")
        return str(args.target)
    root = _host_root(args)
    isas = detect_isas(root)
    name = target_for_isas(targets, isas, root)
    print(f"this machine's GPU: {', '.join(isas)} -> target {name}")
    return name


def _host_root(args: argparse.Namespace) -> Path:
    """``--host-root``, else ``$VLLM_BUNDLE_HOST_ROOT``, else ``/``: where ``sys``, ``proc`` and ``dev`` are
    read. One that is not a directory is a bad option value (exit 2), not a machine that is not ready (1)."""
    root: Path = args.host_root or host_root()
    if not root.is_dir():
        shown = f"--host-root {root}" if args.host_root else f"${HOST_ROOT_VARIABLE} {root}"
        raise UsageError(f"{shown} is not a directory", "name the root of a host tree (with sys/, proc/ and dev/)")
    return root


def _doctor_target(args: argparse.Namespace, targets: Mapping[str, Target]) -> Target | None:
    """The bundle to check for: ``--target NAME``, the target of ``--bundle DIR``, or (``auto`` or
    neither) None: whichever target serves the GPU."""
    name: str | None = args.target
    if args.bundle is not None:
        name = detect_target(args.bundle)
        if name is None:
            raise UsageError(f"cannot tell the target of {args.bundle} (no bin/vllm-server of ours)", "pass --target")
    if name is None or name == "auto":
        return None
    if name not in targets:
        raise RecipeError(f"unknown target {name!r}; valid targets: {', '.join(targets)}, auto")
    return targets[name]


def _claimed_floor(args: argparse.Namespace) -> tuple[str, str]:
    """The glibc every bundle of the recipes claims to run on (python.platform), and where that is said."""
    return load_recipes(args.recipes).python.glibc, "the floor its recipes claim"


def _installed_floor(args: argparse.Namespace) -> tuple[str, str]:
    """The floor ``install`` kept beside the ``--bundle`` given (its release's), else the recipes' claim."""
    record = args.bundle / GLIBC_FILE if args.bundle is not None else None
    if record is not None and record.is_file():
        text = record.read_text(errors="replace").strip()
        if GLIBC_VERSION.fullmatch(text):
            return text, f"its release, {record}"
    return _claimed_floor(args)


def cmd_doctor(args: argparse.Namespace) -> int:
    targets = load_targets(args.recipes)
    target = _doctor_target(args, targets)
    floor = glibc_check(*_installed_floor(args), host_glibc())
    findings = [floor, *diagnose(_host_root(args), targets, target, args.gpu_memory_utilization, os.environ)]
    print(render_json(findings) if args.json else render_text(findings))
    return 1 if blockers(findings) else 0


def _check_host(args: argparse.Namespace, release: Release) -> None:
    """``doctor``'s checks for the bundle about to be installed (its glibc floor as its manifest states it):
    its findings printed, and a blocker refuses the install before anything is downloaded (unless
    ``--force``)."""
    targets, target = load_targets(args.recipes), release.target
    floor = (release.glibc, "its release") if release.glibc else _claimed_floor(args)
    gpu = diagnose(_host_root(args), targets, targets.get(target), None, os.environ)
    findings = for_install([glibc_check(*floor, host_glibc()), *gpu])
    print(render_text(findings), flush=True)
    blocking = blockers(findings)
    if blocking and not args.force:
        raise NotReadyError(
            f"this machine cannot run the {target} bundle: {blocking[0].message}",
            "fix what `vllm-bundle doctor` lists, or pass --force to install anyway",
        )
    if blocking:
        print(f"installing anyway (--force): {len(blocking)} blocker{'' if len(blocking) == 1 else 's'}", flush=True)


def cmd_install(args: argparse.Namespace) -> int:
    # here, not at the top: ``doctor``, in this module too, needs none of the download and install
    # code, and importing it (requests, urllib3, rich) was half of doctor's start (0.48 s of CPU)
    from vllm_bundle.install.installer import install_release, release_from_assets, release_from_pins
    from vllm_bundle.util.cache import Cache
    from vllm_bundle.util.fetch import Fetcher
    from vllm_bundle.util.policy import RetryPolicy
    from vllm_bundle.util.progress import make_reporter

    _host_root(args)  # a bad --host-root is refused before anything is downloaded
    policy = RetryPolicy(attempts=args.retries, read_timeout=args.read_timeout)
    target = _install_target(args)
    source = str(args.source)
    if source.endswith(".json") and Path(source).is_file():
        if target is None:
            raise UsageError(f"{source} pins every target of a release", "pass --target <name> or --target auto")
        release = release_from_pins(Path(source), target, args.mirror)
    else:
        release = release_from_assets(source, policy, targets=load_targets(args.recipes))
        if target is not None and release.target != target:
            raise InstallError(f"{source} is the {release.target} release, not {target}", "pick that target's release")
    _check_host(args, release)
    dest = args.dest or user_data_path("vllm-bundle") / release.target
    fetcher = Fetcher(
        Cache(args.cache_dir or default_cache_dir()),
        make_reporter(sum(release.sizes.values()) or None, plain=True if args.plain else None),
        policy=policy,
        mirror=None if release.is_url() else release.location,
        jobs=args.jobs,
        verify_cached=True,  # re-hash cached parts: cheap beside the extraction, and what is installed is run
    )
    with fetcher:
        install_release(release, dest, fetcher, policy, delta=not args.no_delta)
    return 0
