"""One operation of the pipeline, run in a process of its own so the bench can read that process's
peak RSS (``python -m bench.child <op> ...``). Each op calls the production function and checks what
it gave; a problem ends the process non-zero with one line on stderr."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def archive(tree: Path, out: Path, stem: str, part_size: int) -> None:
    from vllm_bundle.release.archive import write_archive

    parts, size, *_ = write_archive(tree, out, stem, part_size=part_size)
    if sum(p.size for p in parts) != size or not all(p.path.stat().st_size == p.size for p in parts):
        raise SystemExit("the parts on disk do not add up to the archive")
    print(json.dumps({"parts": len(parts), "size": size}))


def qualify(tree: Path, recipes_dir: Path, target: str, build_dir: Path) -> None:
    """Tier 0 as the pipeline's qualify stage runs it (with a build directory to look for)."""
    from vllm_bundle.qualify.tier0 import detect_minor, load_rules, qualify_tree
    from vllm_bundle.recipes import load_recipes

    recipes = load_recipes(recipes_dir)
    rules = load_rules(recipes.root, recipes.python.platform, recipes.vllm.extensions)
    report = qualify_tree(tree, detect_minor(tree), recipes.target(target), rules, build_dir)
    if not report.passed:
        raise SystemExit("tier 0 failed: " + "; ".join(f"{c.name}: {c.problems[:1]}" for c in report.failures()))
    print(json.dumps({"checks": len(report.checks)}))


def compare(first: Path, second: Path, expected: str) -> None:
    """verify-repro's comparison of two release folders; ``expected`` is the one difference they have."""
    from vllm_bundle.qualify.repro import compare_asset_dirs

    differences = compare_asset_dirs(first, second)
    if not any(expected in line for line in differences):
        raise SystemExit(f"compare found {differences!r}, not {expected!r}")
    print(json.dumps({"differences": differences}))


def image(tree: Path, out: Path, recipes_dir: Path) -> None:
    """The OCI layout of the tree, layered by recipes/image.toml, on an empty base."""
    from vllm_bundle.manifests import DEFAULT_LEVEL
    from vllm_bundle.oci.image import load_image_recipe
    from vllm_bundle.oci.layout import BaseImage, ImageSpec, read_layout, write_image

    recipe = load_image_recipe(recipes_dir)
    config = {"architecture": "amd64", "os": "linux", "config": {}, "rootfs": {"type": "layers", "diff_ids": []}}
    base = BaseImage("bench/empty", "sha256:" + "0" * 64, config, [])
    spec = ImageSpec(recipe.prefix, [recipe.launcher], recipe.env, [recipe.port], {}, {}, 0, "bench")
    descriptor = write_image(tree, out, base, spec, recipe.layers, DEFAULT_LEVEL)
    _, manifest = read_layout(out)
    print(json.dumps({"digest": descriptor.digest, "layers": len(manifest["layers"])}))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.child")
    ops = parser.add_subparsers(dest="op", required=True)
    op = ops.add_parser("archive")
    op.add_argument("tree", type=Path)
    op.add_argument("out", type=Path)
    op.add_argument("stem")
    op.add_argument("part_size", type=int)
    op = ops.add_parser("qualify")
    op.add_argument("tree", type=Path)
    op.add_argument("recipes", type=Path)
    op.add_argument("target")
    op.add_argument("build_dir", type=Path)
    op = ops.add_parser("compare")
    op.add_argument("first", type=Path)
    op.add_argument("second", type=Path)
    op.add_argument("expected")
    op = ops.add_parser("image")
    op.add_argument("tree", type=Path)
    op.add_argument("out", type=Path)
    op.add_argument("recipes", type=Path)
    args = parser.parse_args()
    if args.op == "archive":
        archive(args.tree, args.out, args.stem, args.part_size)
    elif args.op == "qualify":
        qualify(args.tree, args.recipes, args.target, args.build_dir)
    elif args.op == "compare":
        compare(args.first, args.second, args.expected)
    else:
        image(args.tree, args.out, args.recipes)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
