"""Where the tool finds its data when no option names it: never relative to the current directory.

The recipes and the patch series ship inside the package (``recipe_data/``, ``patch_data/``,
``rocm_patch_data/``: in the repository these are symlinks to ``recipes/``, ``patches/vllm/`` and
``patches/rocm-sdk/``, which a wheel build copies). An
editable install from a checkout therefore resolves them to the checkout's own directories, where the
locks are written too; an installed wheel reads its packaged copies.
"""

from __future__ import annotations

import os
import subprocess
from importlib import resources
from pathlib import Path

from platformdirs import user_cache_dir


def _packaged(name: str) -> Path:
    return Path(str(resources.files("vllm_bundle").joinpath(name))).resolve()


def default_recipes() -> Path:
    """``recipes/`` of the checkout this tool runs from, else the recipes packaged with it."""
    return _packaged("recipe_data")


def default_patches() -> Path:
    """``patches/vllm/`` of the checkout this tool runs from, else the series packaged with it."""
    return _packaged("patch_data")


def default_rocm_fixes() -> Path:
    """``patches/rocm-sdk/`` (the fixes to TheRock's installed SDK) of this checkout, else the packaged one."""
    return _packaged("rocm_patch_data")


def default_facts() -> Path:
    """``tests/upstream/facts.toml`` of the checkout this tool runs from (the probe runs in a checkout;
    the file is not packaged)."""
    return default_recipes().parent / "tests" / "upstream" / "facts.toml"


def checkout_git(*args: str) -> str:
    """``git <args>`` in the checkout this tool runs from: its output, or "" outside a checkout."""
    try:
        result = subprocess.run(
            ["git", "-C", str(default_recipes().parent), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


CACHE_ENV = "VLLM_BUNDLE_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$VLLM_BUNDLE_CACHE_DIR``, else the user cache dir (``~/.cache/vllm-bundle`` on Linux)."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path(user_cache_dir("vllm-bundle", appauthor=False))
