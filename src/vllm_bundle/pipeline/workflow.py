"""The verbs the release workflows run between their jobs, each from the recipes or the assets alone:
``targets`` (the list a workflow's matrix is made of) and ``merge-manifests`` (several targets'
``backend_versions.json`` merged for one release). Apart from the build verbs, so that a workflow step
starts without importing the pipeline (``targets``: 0.74 s of CPU then, 0.2 s now)."""

from __future__ import annotations

import argparse
import json

from vllm_bundle.manifests import dump_json, lemonade_notes, merge_backend_versions, read_backend_versions
from vllm_bundle.recipes import load_recipes
from vllm_bundle.util.fsutil import atomic_write


def cmd_merge_manifests(args: argparse.Namespace) -> int:
    merged = merge_backend_versions([read_backend_versions(path) for path in args.files])
    atomic_write(args.output, dump_json(merged))
    tags = sorted({tag for repo in merged["checksums"]["github"].values() for tag in repo})
    print(f"merged {len(args.files)} files ({', '.join(tags)}) into {args.output}")
    for note in lemonade_notes(merged):
        print(note)
    return 0


def cmd_targets(args: argparse.Namespace) -> int:
    """The targets (or ``--channels``, the channels) of the recipes, one per line or as a JSON list: the
    one list the release and refresh-locks workflows' matrices are made of. Names given are checked and
    kept in their order (a workflow's ``targets`` input); none: every one, in the recipes' order."""
    recipes = load_recipes(args.recipes)
    if args.channels:
        names = [recipes.channel(name).name for name in args.names] if args.names else list(recipes.channels)
    else:
        names = [recipes.target(name).name for name in args.names] if args.names else list(recipes.targets)
    names = list(dict.fromkeys(names))
    print(json.dumps(names) if args.json else "\n".join(names))
    return 0
