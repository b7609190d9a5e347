"""Pruning: a drop-list and a keep-list (recipes/prune.toml), keep winning, with a size report.

Patterns are matched with fnmatch against paths relative to the bundle root, so ``*`` also matches
across ``/`` (``*/__pycache__`` matches at any depth). A file is dropped when it, or a directory
above it, matches a drop pattern, unless the file (or a directory above it) matches a keep pattern:
hidden device code (``.kpack``), the SDK's versioned ``clang-NN`` and the C toolchain are never lost to
a broad drop rule.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vllm_bundle.errors import RecipeError
from vllm_bundle.recipes import read_toml

PRUNE_FILE = "prune.toml"


@dataclass(frozen=True)
class PruneRules:
    drop: tuple[str, ...]
    keep: tuple[str, ...]


def load_prune_rules(recipes_dir: Path) -> PruneRules:
    doc = read_toml(recipes_dir / PRUNE_FILE)
    rules = {}
    for key in ("drop", "keep"):
        value = doc.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise RecipeError(f"bad recipe {PRUNE_FILE}: {key}: expected a list of path patterns, got {value!r}")
        rules[key] = tuple(value)
    return PruneRules(rules["drop"], rules["keep"])


def _one_pattern(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """The patterns as one regular expression: what ``fnmatch.fnmatchcase`` compiles for each, joined, so a
    path is matched once instead of once per pattern (a bundle's tree is tens of thousands of paths)."""
    return re.compile("|".join(fnmatch.translate(pattern) for pattern in patterns) or r"(?!)")


def _matches(path: PurePosixPath, pattern: re.Pattern[str]) -> bool:
    """The path, or a directory above it, matches."""
    candidates = [str(path), *(str(parent) for parent in path.parents if str(parent) != ".")]
    return any(pattern.match(candidate) for candidate in candidates)


def group_of(rel: PurePosixPath) -> str:
    """The size-report group: a package in site-packages, else the top two path components."""
    parts = rel.parts
    if "site-packages" in parts:
        index = parts.index("site-packages")
        return "site-packages/" + (parts[index + 1] if len(parts) > index + 1 else "")
    return "/".join(parts[:2]) if len(parts) > 1 else parts[0]


def sizes(root: Path) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath, name)
            if not path.is_symlink():
                totals[group_of(PurePosixPath(path.relative_to(root)))] += path.stat().st_size
    return dict(totals)


def prune(root: Path, rules: PruneRules) -> dict[str, tuple[int, int]]:
    """Delete what the rules drop; returns ``group -> (bytes before, bytes after)``."""
    before = sizes(root)
    drop, keep = _one_pattern(rules.drop), _one_pattern(rules.keep)
    for dirpath, dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = Path(dirpath, name)
            rel = PurePosixPath(path.relative_to(root))
            if _matches(rel, drop) and not _matches(rel, keep):
                path.unlink()
        for name in dirs:
            path = Path(dirpath, name)
            rel = PurePosixPath(path.relative_to(root))
            if not _matches(rel, drop) or _matches(rel, keep):
                continue
            if path.is_symlink():
                path.unlink()
            elif not any(path.iterdir()):
                path.rmdir()
    after = sizes(root)
    return {group: (before.get(group, 0), after.get(group, 0)) for group in sorted(set(before) | set(after))}
