"""vLLM's own requirement files, read from its source release, for the lock's dependency closure.

The bundle's vLLM wheel is installed with ``--no-deps``, so its dependency closure must be locked
from the same files its build reads. Like vLLM's ``use_existing_torch.py`` we drop the torch family
(the bundle ships TheRock's), and we drop index options: indexes come from the channel only.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from vllm_bundle.errors import LockError
from vllm_bundle.util.extract import safe_extract

INDEX_OPTIONS = ("--index-url", "-i", "--extra-index-url", "--find-links", "-f", "--trusted-host")


@dataclass
class FilteredRequirements:
    top_files: list[Path]
    dropped: list[str]


def extract_requirement_files(sdist: Path, dest: Path, version: str) -> Path:
    """Extract ``vllm-<version>/requirements/*`` of the source release into ``dest``; returns the tree
    they are in (``dest``, the top directory stripped)."""
    name = f"vllm-{version}.tar.gz"

    def wanted(final: str, member: tarfile.TarInfo) -> bool:
        return member.isfile() and final.startswith("requirements/")

    try:
        with tarfile.open(sdist, "r:gz") as archive:
            count = safe_extract(archive, dest, name, top=f"vllm-{version}", select=wanted)
    except tarfile.TarError as err:
        raise LockError(f"cannot read {name}: {err}", "delete it from the cache and re-lock") from None
    if not count:
        raise LockError(f"{name} has no requirements/ directory", "check vllm.version")
    return dest


def _requirement_name(line: str) -> str | None:
    text = line.split(" #", 1)[0].strip()
    if not text or text.startswith(("#", "-")):
        return None
    try:
        return canonicalize_name(Requirement(text).name)
    except InvalidRequirement:
        return None


TORCH_FAMILY = ("torch", "torchvision", "torchaudio", "torchcodec")


def drop_lines(path: Path, names: set[str], drop_index_options: bool = True) -> list[str]:
    """Rewrite one requirement file without the named packages (and index options); returns what went."""
    kept, dropped = [], []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        name = _requirement_name(stripped)
        if (name is not None and name in names) or (drop_index_options and stripped.startswith(INDEX_OPTIONS)):
            dropped.append(f"{path.name}: {stripped}")
            continue
        kept.append(line)
    path.write_text("\n".join(kept) + "\n")
    return dropped


def filter_requirement_files(top: Path, files: tuple[str, ...], drop: tuple[str, ...]) -> FilteredRequirements:
    """Rewrite the requirement files reachable from ``files``, dropping the named packages and index options."""
    names: set[str] = {canonicalize_name(name) for name in drop}
    dropped = [line for path in _included_files([top / name for name in files]) for line in drop_lines(path, names)]
    return FilteredRequirements([top / name for name in files], dropped)


def filter_torch_family(source: Path) -> list[str]:
    """What vLLM's ``use_existing_torch.py`` does, for releases that lack a working one."""
    names = set(TORCH_FAMILY)
    dropped = []
    for path in sorted((source / "requirements").rglob("*")):
        if path.is_file() and path.suffix in (".txt", ".in"):
            dropped += drop_lines(path, names, drop_index_options=False)
    return dropped


def _included_files(roots: list[Path]) -> list[Path]:
    """The requirement files reachable from ``roots`` through ``-r``/``-c`` lines, in order."""
    seen: list[Path] = []
    pending = list(roots)
    while pending:
        path = pending.pop(0)
        if path in seen:
            continue
        if not path.is_file():
            raise LockError(
                f"vLLM's source release has no {path.name} (wanted by its requirement files)",
                "fix vllm.requirement-files in recipes/components.toml",
            )
        seen.append(path)
        for line in path.read_text().splitlines():
            option, _, value = line.strip().partition(" ")
            if option in ("-r", "--requirement", "-c", "--constraint") and value.strip():
                pending.append(path.parent / value.strip())
    return seen
