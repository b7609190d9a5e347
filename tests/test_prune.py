"""The drop and keep lists (recipes/prune.toml) on a small tree: fnmatch's meaning for each pattern, a matching
directory taking what is under it, keep winning at any depth. (The suite's bundle, pruned by the shipped rules:
tests/test_bundle.py.)"""

from __future__ import annotations

import fnmatch
from pathlib import Path, PurePosixPath

from vllm_bundle.tree.prune import PruneRules, _matches, _one_pattern, prune

FILES = [
    "bin/pip3.11",
    "bin/python3.11",
    "lib/python3.11/test/test_os.py",
    "lib/python3.11/site-packages/torch/__pycache__/x.cpython-311.pyc",
    "lib/python3.11/site-packages/torch/.kpack/torch_gfx1151.kpack",
    "lib/python3.11/site-packages/torch/tests/t.py",
    "lib/python3.11/site-packages/ziglang/lib/std/crypto/pcurves/tests/p.zig",
    "lib/python3.11/site-packages/_rocm_sdk_core/lib/llvm/bin/clang-20",
    "lib/python3.11/site-packages/_rocm_sdk_core/lib/llvm/bin/clang-tblgen",
]
RULES = PruneRules(
    drop=("*/__pycache__", "bin/pip3*", "lib/python*/test", "lib/python*/site-packages/*/tests", "*/llvm/bin/*"),
    keep=("*.kpack", "lib/python*/site-packages/ziglang", "*/llvm/bin/clang-[0-9]*"),
)


def test_drop_takes_whole_directories_and_keep_wins_at_any_depth(tmp_path: Path) -> None:
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    prune(tmp_path, RULES)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == [
        "bin/python3.11",
        "lib/python3.11/site-packages/_rocm_sdk_core/lib/llvm/bin/clang-20",
        "lib/python3.11/site-packages/torch/.kpack/torch_gfx1151.kpack",
        "lib/python3.11/site-packages/ziglang/lib/std/crypto/pcurves/tests/p.zig",
    ]
    assert not (tmp_path / "lib/python3.11/test").exists(), "an emptied dropped directory goes too"


def test_the_joined_patterns_match_as_fnmatch_matches_each() -> None:
    """One expression for a list of patterns says what ``fnmatchcase`` with each of them says."""
    paths = [PurePosixPath(name) for name in FILES] + [PurePosixPath("a[b]/c"), PurePosixPath("x")]
    for patterns in (RULES.drop, RULES.keep, ("a[[]b]/*",), ()):
        joined = _one_pattern(patterns)
        for path in paths:
            candidates = [str(path), *(str(parent) for parent in path.parents if str(parent) != ".")]
            expected = any(fnmatch.fnmatchcase(c, p) for c in candidates for p in patterns)
            assert _matches(path, joined) == expected, (patterns, path)
