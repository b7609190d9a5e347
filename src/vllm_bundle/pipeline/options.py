"""What the parsed command line selects for the build verbs: the recipes, the locks directory, the
download cache, the retry policy and a fetcher (``args`` is the ``argparse.Namespace`` cli.py parsed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_bundle.paths import default_cache_dir
from vllm_bundle.recipes import Recipes, load_recipes
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.fetch import Fetcher
from vllm_bundle.util.policy import RetryPolicy
from vllm_bundle.util.progress import make_reporter


def recipes_of(args: argparse.Namespace) -> Recipes:
    return load_recipes(args.recipes)


def locks_dir(args: argparse.Namespace) -> Path:
    locks: Path = args.locks or args.recipes / "locks"
    return locks


def cache_of(args: argparse.Namespace) -> Cache:
    return Cache(args.cache_dir or default_cache_dir())


def policy_of(args: argparse.Namespace) -> RetryPolicy:
    return RetryPolicy(attempts=args.retries, read_timeout=args.read_timeout)


def fetcher_of(args: argparse.Namespace, grand_total: int | None, mirror: str | None = None) -> Fetcher:
    return Fetcher(
        cache_of(args),
        make_reporter(grand_total, plain=True if args.plain else None),
        policy=policy_of(args),
        mirror=mirror,
        offline=getattr(args, "offline", False),
        jobs=args.jobs,
        verify_cached=args.verify_cache,
    )
