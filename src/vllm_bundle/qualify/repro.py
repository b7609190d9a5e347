"""Reproducibility check: build twice in different directories under a different umask, time zone,
number of usable CPUs and clock, and compare every asset; on a difference, name the first differing
archive member and field."""

from __future__ import annotations

import filecmp
import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from vllm_bundle.errors import BundleError
from vllm_bundle.manifests import is_part
from vllm_bundle.oci.layout import LAYER_NAME, read_layout
from vllm_bundle.util.parts import read_archive

MEMBER_FIELDS = ("name", "type", "mode", "uid", "gid", "uname", "gname", "mtime", "size", "linkname")


def _members(parts: Sequence[Path]) -> Iterator[tuple[tarfile.TarInfo, str]]:
    """The members of an archive given as its parts, with a hash of each member's content."""
    with read_archive(parts) as (archive, _, _):
        for member in archive:
            handle = archive.extractfile(member) if member.isreg() else None
            digest = (
                hashlib.file_digest(cast(io.BufferedReader, handle), "sha256").hexdigest() if handle else ""
            )  # streamed
            yield member, digest


def first_difference(parts_a: Sequence[Path], parts_b: Sequence[Path]) -> str | None:
    """``member <name>: <field> <a> != <b>`` for the first difference between two archives, or None."""
    members_b = _members(parts_b)
    for member_a, digest_a in _members(parts_a):
        try:
            member_b, digest_b = next(members_b)
        except StopIteration:
            return f"member {member_a.name}: only in the first archive"
        for field in MEMBER_FIELDS:
            value_a, value_b = getattr(member_a, field), getattr(member_b, field)
            if value_a != value_b:
                shown = (oct(value_a), oct(value_b)) if field == "mode" else (repr(value_a), repr(value_b))
                return f"member {member_a.name}: {field} {shown[0]} != {shown[1]}"
        if digest_a != digest_b:
            return f"member {member_a.name}: content differs"
    extra = next(members_b, None)
    return f"member {extra[0].name}: only in the second archive" if extra else None


def compare_asset_dirs(first: Path, second: Path) -> list[str]:
    """Human-readable differences between two asset directories (empty: identical bytes)."""
    names_a = sorted(p.name for p in first.iterdir())
    names_b = sorted(p.name for p in second.iterdir())
    if names_a != names_b:
        return [f"different assets: {sorted(set(names_a) ^ set(names_b))}"]
    differences = []
    for name in names_a:
        if not filecmp.cmp(first / name, second / name, shallow=False):  # block by block: parts weigh GBs
            differences.append(name)
    parts_a = sorted(p for p in first.iterdir() if is_part(p.name))
    parts_b = sorted(p for p in second.iterdir() if is_part(p.name))
    if any(p.name in differences for p in parts_a):
        detail = first_difference(parts_a, parts_b) or "the archives hold the same members; the compression differs"
        differences = [f"{name}: {detail}" if is_part(name) else name for name in differences]
    return differences


def _differing_keys(first: dict[str, Any], second: dict[str, Any], where: str = "") -> list[str]:
    keys = sorted(set(first) | set(second))
    found = []
    for key in keys:
        a, b = first.get(key), second.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += _differing_keys(a, b, f"{where}{key}.")
        elif a != b:
            found.append(f"{where}{key}")
    return found


def compare_layouts(first: Path, second: Path) -> list[str]:
    """Differences between two OCI layouts of the same image (empty: the same manifest digest), down to
    the first differing member of a layer or the config keys that differ."""
    descriptor_a, manifest_a = read_layout(first)
    descriptor_b, manifest_b = read_layout(second)
    if descriptor_a.digest == descriptor_b.digest:
        return []
    layers_a, layers_b = manifest_a["layers"], manifest_b["layers"]
    if len(layers_a) != len(layers_b):
        return [f"image: {len(layers_a)} layers != {len(layers_b)}"]
    differences = []
    for layer_a, layer_b in zip(layers_a, layers_b, strict=True):
        if layer_a["digest"] != layer_b["digest"]:
            name = (layer_a.get("annotations") or {}).get(LAYER_NAME, layer_a["digest"][:19])
            blob_a, blob_b = (
                root / "blobs" / "sha256" / doc["digest"][7:] for root, doc in ((first, layer_a), (second, layer_b))
            )
            detail = first_difference([blob_a], [blob_b]) or "the same members; the compression differs"
            differences.append(f"image layer {name}: {detail}")
    if manifest_a["config"]["digest"] != manifest_b["config"]["digest"]:
        configs = [
            json.loads((root / "blobs" / "sha256" / doc["config"]["digest"][7:]).read_bytes())
            for root, doc in ((first, manifest_a), (second, manifest_b))
        ]
        differences.append(f"image config: {', '.join(_differing_keys(*configs)[:5])} differ")
    return differences or [f"image manifest {descriptor_a.digest} != {descriptor_b.digest}"]


def _restrict(umask: int, one_cpu: bool) -> None:
    """In the child before exec: set the umask and, for the second build, allow a single CPU."""
    os.umask(umask)
    if one_cpu:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _run_prefixed(command: list[str], env: dict[str, str], umask: int, one_cpu: bool, prefix: str) -> int:
    """Run one build, its output shown as it comes, each line prefixed (which build said it); its exit code."""
    with subprocess.Popen(
        command,
        env=env,
        preexec_fn=functools.partial(_restrict, umask, one_cpu),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()
        return process.wait()


def build_twice(bundle_args: Sequence[str], work: Path | None = None) -> tuple[Path, Path]:
    """Run ``vllm-bundle bundle`` twice into separate build and asset directories; returns both."""
    base = Path(work or tempfile.mkdtemp(prefix="vllm-bundle-repro-"))
    outputs = []
    variations = [({"TZ": "UTC"}, 0o022), ({"TZ": "Pacific/Kiritimati"}, 0o077)]
    for index, (env, umask) in enumerate(variations):
        run_dir = base / f"run{index + 1}"
        shutil.rmtree(run_dir, ignore_errors=True)
        command = [
            sys.executable,
            "-m",
            "vllm_bundle",
            "bundle",
            *bundle_args,
            "--build-dir",
            str(run_dir / "build"),
            "--bundles-dir",
            str(run_dir / "bundles"),
            "--plain",
        ]
        if index and shutil.which("faketime"):  # a clock a year ahead, where available
            command = ["faketime", "+365d", *command]
        print(f"build  {index + 1} of 2 (TZ={env['TZ']}, umask {umask:03o}): {run_dir}", flush=True)
        returncode = _run_prefixed(command, {**os.environ, **env}, umask, index == 1, f"  {index + 1}| ")
        if returncode != 0:
            raise BundleError(f"build {index + 1} of the reproducibility check failed (exit {returncode}; see above)")
        (tag_dir,) = [p for p in (run_dir / "bundles").iterdir() if p.is_dir()]
        outputs.append(tag_dir)
        time.sleep(1.1)  # the second build runs at another wall-clock second
    return outputs[0], outputs[1]
