"""The patch series (vLLM's, and the fixes to TheRock's installed SDK): version-aware selection and
transactional application.

Patches are unified diffs with a small header (see patches/vllm/README.md). GNU ``patch`` applies
them and ``unidiff`` parses them (to name a rejected hunk); what is written here is only the series
logic: choosing the variant for a vLLM version, recognising "already applied" and "already
upstream", applying the whole series to a scratch copy first so a failure leaves the tree as it
was, and checking the result. "Already upstream" for the architecture list is decided by parsing
it: it must hold every ISA the targets need, not just one name.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from unidiff.patch import PatchSet

from vllm_bundle.errors import PatchError, RecipeError

HEADER_FIELDS = ("Patch", "Versions", "Why", "Upstream-Archs")


@dataclass(frozen=True)
class Patch:
    path: Path
    id: str
    versions: SpecifierSet
    why: str
    archs: tuple[str, re.Pattern[str]] | None  # Upstream-Archs: file, regex capturing a ';'-list of ISAs
    diff: PatchSet

    @property
    def files(self) -> list[str]:
        return [f.path for f in self.diff]


@dataclass(frozen=True)
class Outcome:
    patch_id: str
    status: str  # "applied" | "already applied" | "already upstream" | "not needed" (an SDK fix)
    variant: str  # file name of the variant used, or ""


@dataclass(frozen=True)
class Subject:
    """What a series patches, as its errors name it, and where its rules are written."""

    name: str
    readme: str


VLLM = Subject("vLLM", "patches/vllm/README.md")
ROCM_SDK = Subject("the ROCm SDK", "patches/rocm-sdk/README.md")


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
    archs = None
    if fields.get("Upstream-Archs"):
        file, sep, regex = fields["Upstream-Archs"].partition(" ~ ")
        if not sep or re.compile(regex.strip()).groups != 1:
            raise RecipeError(
                f"bad patch header {path.name}: Upstream-Archs: expected '<path> ~ <regex with one group>'"
            )
        archs = (file.strip(), re.compile(regex.strip()))
    diff = PatchSet(text)
    if not len(diff):
        raise RecipeError(f"bad patch {path.name}: no unified diff after the header")
    return Patch(path, fields["Patch"], versions, fields["Why"], archs, diff)


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


def listed_archs(tree: Path, patch: Patch) -> list[str] | None:
    """The ISAs the tree's file lists where the patch's Upstream-Archs points (None: not found)."""
    if patch.archs is None:
        return None
    file, regex = patch.archs
    target = tree / file
    match = regex.search(target.read_text(errors="replace")) if target.is_file() else None
    return [isa.strip() for isa in match.group(1).split(";") if isa.strip()] if match else None


def missing_archs(tree: Path, patch: Patch, required: frozenset[str]) -> list[str]:
    """The required ISAs the tree's list lacks (all of them when the list cannot be found)."""
    return sorted(required - set(listed_archs(tree, patch) or ()))


def _upstream_has(tree: Path, patch: Patch, required: frozenset[str]) -> bool:
    return listed_archs(tree, patch) is not None and not missing_archs(tree, patch, required)


def _closest_window(lines: list[str], expected: list[str], around: int) -> int:
    """Where the expected lines fit best in the file, near the hunk's own line (a start index)."""
    best, best_score = max(0, around), -1
    low, high = max(0, around - 200), min(len(lines), around + 200)
    for start in range(low, max(low, high - len(expected)) + 1):
        score = sum(1 for a, b in zip(lines[start : start + len(expected)], expected, strict=False) if a == b)
        if score > best_score:
            best, best_score = start, score
    return best


def _first_difference(tree: Path, file: str, hunk: Any) -> str:
    """The first line the hunk expects that the file does not have, where the hunk fits best."""
    expected = [line.value.rstrip("\n") for line in hunk if line.is_context or line.is_removed]
    path = tree / file
    if not path.is_file():
        return "the file it patches is missing"
    lines = path.read_text(errors="replace").splitlines()
    start = _closest_window(lines, expected, hunk.source_start - 1)
    for offset, wanted in enumerate(expected):
        found = lines[start + offset] if start + offset < len(lines) else "<end of file>"
        if found != wanted:
            return f"line {start + offset + 1} is {found.strip()!r}, the patch expects {wanted.strip()!r}"
    return "its lines are there, in another order or place"


def _rejected_hunk(patch: Patch, output: str, version: Version, tree: Path, subject: Subject = VLLM) -> PatchError:
    """Name the patch, file, hunk and version of a failed apply, and the line that differs."""
    failed = re.search(r"Hunk #(\d+) FAILED at (\d+)", output)
    file_match = re.findall(r"(?:checking|patching) file (\S+)", output[: failed.start()] if failed else output)
    file = file_match[-1] if file_match else (patch.files[0] if patch.files else "?")
    missing = [f.path for f in patch.diff if not f.is_added_file and not (tree / f.path).is_file()]
    if missing:
        file = missing[0]
    detail = "the file it patches is missing" if missing else ""
    if failed:
        number = int(failed.group(1))
        hunks = next((list(f) for f in patch.diff if f.path == file), [])
        hunk = hunks[number - 1] if 0 < number <= len(hunks) else None
        header = str(hunk).splitlines()[0] if hunk else ""
        difference = _first_difference(tree, file, hunk) if hunk else output.strip()
        detail = f"hunk #{number} {header} rejected: {difference}"
    return PatchError(
        f"patch {patch.path.name} ({patch.id}) does not apply to {subject.name} {version}: {file}: "
        f"{detail or output.strip()}",
        f"port the patch for {subject.name} {version} (see {subject.readme}); the tree was left untouched",
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


def _plan(
    tree: Path, series: list[list[Patch]], version: Version, required: frozenset[str]
) -> list[tuple[Patch | None, Outcome]]:
    plan: list[tuple[Patch | None, Outcome]] = []
    for group in series:
        patch = _choose(group, version)
        if patch is None:
            checked = [p for p in group if p.archs is not None]
            if checked and _upstream_has(tree, checked[0], required):
                plan.append((None, Outcome(group[0].id, "already upstream", "")))
                continue
            ranges = "; ".join(f"{p.path.name}: {p.versions}" for p in group)
            lacking = missing_archs(tree, checked[0], required) if checked else []
            upstream = f"; upstream lacks {', '.join(lacking)}" if lacking else ""
            raise PatchError(
                f"no variant of patch {group[0].id} covers vLLM {version} ({ranges}){upstream}",
                "port the patch to this version: see patches/vllm/README.md",
            )
        plan.append((patch, Outcome(patch.id, "pending", patch.path.name)))
    return plan


def apply_series(
    tree: Path, series: list[list[Patch]], version: Version, required_isas: frozenset[str]
) -> list[Outcome]:
    """Apply the series to ``tree`` all or nothing; returns each patch id's outcome. ``required_isas``:
    every ISA of every target, which the architecture list must hold once the series is applied."""
    plan = _plan(tree, series, version, required_isas)
    return _apply_plan(tree, plan, version, VLLM, series, required_isas)


def apply_fixes(tree: Path, series: list[list[Patch]], version: Version) -> list[Outcome]:
    """Apply a series of fixes to the installed ROCm SDK in ``tree`` (site-packages), all or nothing. Unlike
    vLLM's series, a fix whose ``Versions:`` do not contain the SDK's ``version`` is not needed there."""
    plan: list[tuple[Patch | None, Outcome]] = []
    for group in series:
        patch = _choose(group, version)
        outcome = Outcome(group[0].id, "pending", patch.path.name) if patch else Outcome(group[0].id, "not needed", "")
        plan.append((patch, outcome))
    return _apply_plan(tree, plan, version, ROCM_SDK)


def installed_rocm_version(site: Path) -> Version | None:
    """The ROCm SDK version site-packages holds: its ``rocm`` distribution's (TheRock's meta package), which
    says which fixes of patches/rocm-sdk it needs. None unless there is exactly one."""
    # Only the rocm-*.dist-info directories are read (a bundle has hundreds of distributions); the name in
    # the METADATA decides (rocm-sdk-core's directory is rocm_sdk_core-*, but a name is checked, not assumed).
    candidates = [importlib.metadata.PathDistribution(p) for p in sorted(site.glob("rocm-*.dist-info"))]
    found = [d.version for d in candidates if d.metadata["Name"] == "rocm"]
    return Version(found[0]) if len(found) == 1 else None


def fixes_not_applied(tree: Path, series: list[list[Patch]], version: Version) -> list[Patch]:
    """The fixes the SDK's ``version`` needs that ``tree`` does not have (tier 0)."""
    needed = [patch for group in series if (patch := _choose(group, version)) is not None]
    return [p for p in needed if _run_patch(tree, p, reverse=True, dry_run=True).returncode != 0]


def _apply_plan(
    tree: Path,
    plan: list[tuple[Patch | None, Outcome]],
    version: Version,
    subject: Subject,
    series: list[list[Patch]] | None = None,
    required_isas: frozenset[str] = frozenset(),
) -> list[Outcome]:
    """Apply the plan's patches to a scratch copy of the files they touch beside ``tree``, check the result
    (it compiles; the architecture lists of ``series`` hold ``required_isas``), then move it in: a failure
    leaves ``tree`` as it was."""
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
            outcomes.append(_apply_one(scratch, tree, patch, version, required_isas, subject))
        _check_python_compiles(scratch, touched, version, subject)
        _check_archs(scratch, tree, series or [], version, required_isas)
        for name in touched:
            if (scratch / name).is_file():
                created = not (tree / name).exists()
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                (scratch / name).replace(tree / name)
                if created:  # patch made it under the umask; a wheel records modes: the same on every builder
                    executable = (tree / name).stat().st_mode & 0o111
                    (tree / name).chmod(0o755 if executable else 0o644)
    return outcomes


def _apply_one(
    scratch: Path, tree: Path, patch: Patch, version: Version, required: frozenset[str], subject: Subject
) -> Outcome:
    if _run_patch(scratch, patch, reverse=True, dry_run=True).returncode == 0:
        return Outcome(patch.id, "already applied", patch.path.name)
    if patch.archs is not None and _upstream_has(tree, patch, required):
        return Outcome(patch.id, "already upstream", patch.path.name)
    result = _run_patch(scratch, patch)
    if result.returncode != 0:
        raise _rejected_hunk(patch, result.stdout + result.stderr, version, scratch, subject)
    return Outcome(patch.id, "applied", patch.path.name)


def _arch_checks(series: list[list[Patch]]) -> list[Patch]:
    """One patch per group that names where the architecture list is (Upstream-Archs)."""
    return [next(p for p in group if p.archs is not None) for group in series if any(p.archs for p in group)]


def _check_archs(
    scratch: Path, tree: Path, series: list[list[Patch]], version: Version, required: frozenset[str]
) -> None:
    """Once the series is applied, the architecture list holds every required ISA, or the series fails."""
    for patch in _arch_checks(series):
        file = patch.archs[0] if patch.archs else ""
        lacking = missing_archs(scratch if (scratch / file).is_file() else tree, patch, required)
        if lacking:
            raise PatchError(
                f"after the patch series, {file} of vLLM {version} still lacks {', '.join(lacking)} "
                "in its architecture list",
                "add a hip-archs variant for this version (patches/vllm/README.md); the source tree was left untouched",
            )


def verify_outcomes(
    tree: Path, series: list[list[Patch]], outcomes: list[Outcome], required_isas: frozenset[str]
) -> str | None:
    """Why ``tree`` no longer matches the outcomes recorded when it was patched (None: it does)."""
    variants = {p.path.name: p for group in series for p in group}
    for outcome in outcomes:
        patch = variants.get(outcome.variant)
        applied = outcome.status in ("applied", "already applied")
        if applied and patch is not None and _run_patch(tree, patch, reverse=True, dry_run=True).returncode != 0:
            return f"{patch.path.name} is no longer applied"
    for patch in _arch_checks(series):
        lacking = missing_archs(tree, patch, required_isas)
        if lacking:
            return f"{patch.archs[0] if patch.archs else '?'} lacks {', '.join(lacking)}"
    return None


def _check_python_compiles(scratch: Path, touched: list[str], version: Version, subject: Subject = VLLM) -> None:
    for name in touched:
        if name.endswith(".py") and (scratch / name).is_file():
            try:
                compile((scratch / name).read_text(), name, "exec")
            except SyntaxError as err:
                raise PatchError(
                    f"the patched {name} of {subject.name} {version} does not compile: {err}",
                    "fix the patch; the source tree was left untouched",
                ) from None
