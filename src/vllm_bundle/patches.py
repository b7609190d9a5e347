"""The vLLM patch series: version-aware selection and transactional application.

Patches are unified diffs with a small header (see patches/vllm/README.md). GNU ``patch`` applies
them and ``unidiff`` parses them (to name a rejected hunk); what is written here is only the series
logic: choosing the variant for a vLLM version, recognising "already applied" and "already
upstream", and applying the whole series to a scratch copy first so a failure leaves the tree as it
was.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from unidiff.patch import PatchSet

from vllm_bundle.errors import BundleError, RecipeError

HEADER_FIELDS = ("Patch", "Versions", "Why", "Upstream-Marker")


class PatchError(BundleError):
    """A patch does not apply (or no variant covers the vLLM version)."""


@dataclass(frozen=True)
class Patch:
    path: Path
    id: str
    versions: SpecifierSet
    why: str
    marker: tuple[str, re.Pattern[str]] | None
    diff: PatchSet

    @property
    def files(self) -> list[str]:
        return [f.path for f in self.diff]


@dataclass(frozen=True)
class Outcome:
    patch_id: str
    status: str  # "applied" | "already applied" | "already upstream"
    variant: str  # file name of the variant used, or ""


def _header(text: str, path: Path) -> dict[str, str]:
    fields: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if line.startswith(("--- ", "diff ")):
            break
        if line.startswith(" ") and key:
            fields[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip()
            if key not in HEADER_FIELDS:
                raise RecipeError(
                    f"bad patch header {path.name}: unknown field {key!r}", f"use {', '.join(HEADER_FIELDS)}"
                )
            fields[key] = value.strip()
    return fields


def read_patch(path: Path) -> Patch:
    text = path.read_text()
    fields = _header(text, path)
    for required in ("Patch", "Versions", "Why"):
        if not fields.get(required):
            raise RecipeError(f"bad patch header {path.name}: {required}: is missing", "see patches/vllm/README.md")
    try:
        versions = SpecifierSet(fields["Versions"])
    except InvalidSpecifier:
        raise RecipeError(
            f"bad patch header {path.name}: Versions: expected a PEP 440 specifier, got {fields['Versions']!r}"
        ) from None
    marker = None
    if fields.get("Upstream-Marker"):
        file, sep, regex = fields["Upstream-Marker"].partition(" ~ ")
        if not sep:
            raise RecipeError(f"bad patch header {path.name}: Upstream-Marker: expected '<path> ~ <regex>'")
        marker = (file.strip(), re.compile(regex.strip()))
    diff = PatchSet(text)
    if not len(diff):
        raise RecipeError(f"bad patch {path.name}: no unified diff after the header")
    return Patch(path, fields["Patch"], versions, fields["Why"], marker, diff)


def read_series(directory: Path) -> list[list[Patch]]:
    """The series as groups of variants (one group per patch id), in application order."""
    series_file = directory / "series"
    if not series_file.is_file():
        raise RecipeError(f"no patch series at {series_file}", "restore patches/vllm/series")
    groups: dict[str, list[Patch]] = {}
    for line in series_file.read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if not (directory / name).is_file():
            raise RecipeError(f"bad patch series {series_file}: {name} does not exist")
        patch = read_patch(directory / name)
        groups.setdefault(patch.id, []).append(patch)
    return list(groups.values())


def _run_patch(
    tree: Path, patch: Patch, *, reverse: bool = False, dry_run: bool = False
) -> subprocess.CompletedProcess[str]:
    # --force, not --batch: --batch would silently reverse a patch that looks applied already; we
    # want a failure there and decide "already applied" ourselves from an explicit reverse dry run.
    command = [
        "patch",
        "-p1",
        "--force",
        "--no-backup-if-mismatch",
        "--reject-file=-",
        "--fuzz=0",
        "-d",
        str(tree),
        "-i",
        str(patch.path.absolute()),
    ]
    if reverse:
        command.append("--reverse")
    if dry_run:
        command.append("--dry-run")
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _marker_matches(tree: Path, patch: Patch) -> bool:
    if patch.marker is None:
        return False
    file, regex = patch.marker
    target = tree / file
    return target.is_file() and regex.search(target.read_text(errors="replace")) is not None


def _rejected_hunk(patch: Patch, output: str, version: Version) -> PatchError:
    """Name the patch, file, hunk (with its first lines) and vLLM version of a failed apply."""
    failed = re.search(r"Hunk #(\d+) FAILED at (\d+)", output)
    file_match = re.findall(r"(?:checking|patching) file (\S+)", output[: failed.start()] if failed else output)
    file = file_match[-1] if file_match else (patch.files[0] if patch.files else "?")
    detail = "the file it patches is missing" if "No such file" in output or "can't find file" in output else ""
    if failed:
        number = int(failed.group(1))
        hunks = next((list(f) for f in patch.diff if f.path == file), [])
        hunk = hunks[number - 1] if 0 < number <= len(hunks) else None
        lines = str(hunk).splitlines() if hunk else []
        context = " | ".join(ln.strip() for ln in lines[1:4])
        detail = f"hunk #{number} {lines[0] if lines else ''} rejected: {context}"
    return PatchError(
        f"patch {patch.path.name} ({patch.id}) does not apply to vLLM {version}: {file}: {detail or output.strip()}",
        f"port the patch for vLLM {version} (see patches/vllm/README.md); the source tree was left untouched",
    )


def _choose(group: Sequence[Patch], version: Version) -> Patch | None:
    chosen = [p for p in group if p.versions.contains(version, prereleases=True)]
    if len(chosen) > 1:
        names = ", ".join(p.path.name for p in chosen)
        raise RecipeError(
            f"bad patch series: variants of {group[0].id} overlap for vLLM {version}: {names}",
            "make their Versions: ranges disjoint",
        )
    return chosen[0] if chosen else None


def _plan(tree: Path, series: list[list[Patch]], version: Version) -> list[tuple[Patch | None, Outcome]]:
    plan: list[tuple[Patch | None, Outcome]] = []
    for group in series:
        patch = _choose(group, version)
        if patch is None:
            if any(_marker_matches(tree, p) for p in group):
                plan.append((None, Outcome(group[0].id, "already upstream", "")))
                continue
            ranges = "; ".join(f"{p.path.name}: {p.versions}" for p in group)
            raise PatchError(
                f"no variant of patch {group[0].id} covers vLLM {version} ({ranges})",
                "port the patch to this version: see patches/vllm/README.md",
            )
        plan.append((patch, Outcome(patch.id, "pending", patch.path.name)))
    return plan


def apply_series(tree: Path, series: list[list[Patch]], version: Version) -> list[Outcome]:
    """Apply the series to ``tree`` all or nothing; returns each patch id's outcome."""
    plan = _plan(tree, series, version)
    touched = sorted({f for patch, _ in plan if patch for f in patch.files})
    outcomes: list[Outcome] = []
    # Scratch space beside the tree, not in $TMPDIR: its files are renamed into the tree at the end, and
    # a rename cannot cross file systems (a tmpfs /tmp, as on Fedora or Arch).
    with tempfile.TemporaryDirectory(prefix=".patch-scratch-", dir=tree.parent) as tmp:
        scratch = Path(tmp)
        for name in touched:
            if (tree / name).is_file():
                (scratch / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(tree / name, scratch / name)
        for patch, outcome in plan:
            if patch is None:
                outcomes.append(outcome)
                continue
            outcomes.append(_apply_one(scratch, tree, patch, version))
        _check_python_compiles(scratch, touched, version)
        for name in touched:
            if (scratch / name).is_file():
                (scratch / name).replace(tree / name)
    return outcomes


def _apply_one(scratch: Path, tree: Path, patch: Patch, version: Version) -> Outcome:
    if _run_patch(scratch, patch, reverse=True, dry_run=True).returncode == 0:
        return Outcome(patch.id, "already applied", patch.path.name)
    if _marker_matches(tree, patch):
        return Outcome(patch.id, "already upstream", patch.path.name)
    result = _run_patch(scratch, patch)
    if result.returncode != 0:
        raise _rejected_hunk(patch, result.stdout + result.stderr, version)
    return Outcome(patch.id, "applied", patch.path.name)


def _check_python_compiles(scratch: Path, touched: list[str], version: Version) -> None:
    for name in touched:
        if name.endswith(".py") and (scratch / name).is_file():
            try:
                compile((scratch / name).read_text(), name, "exec")
            except SyntaxError as err:
                raise PatchError(
                    f"the patched {name} of vLLM {version} does not compile: {err}",
                    "fix the patch; the source tree was left untouched",
                ) from None
