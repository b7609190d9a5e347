"""The oldest system a bundle runs on: the manylinux policy its ``python.platform`` claims (auditwheel's
data, the reference for what manylinux allows), the symbol versions each ELF file needs held against that
policy, and the floor measured from them.

A file compiled against a newer glibc or libstdc++ than the floor loads only where that one is: glibc
2.38's headers redirect ``strtol`` and its family to ``__isoc23_*`` (``GLIBC_2.38``) whenever
``_GNU_SOURCE`` is on, which g++ always sets, and newer libstdc++ headers emit newer ``GLIBCXX_*`` symbols.
Such a file stops with "version `GLIBC_2.38' not found" on Debian 12, Ubuntu 22.04 or RHEL 9 (the
release job's ubuntu-24.04 builds exactly that: pypa/manylinux#1875, tobocop2/lilbee#628). The check is
auditwheel's own (``WheelPolicies.versioned_symbols_policy``: every version of a prefix the policy lists,
GLIBC, GLIBCXX, CXXABI, GCC and the rest, must be one it allows), run on every ELF file of the tree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from auditwheel.architecture import Architecture
from auditwheel.libc import Libc
from auditwheel.policy import Policy, WheelPolicies

from vllm_bundle.errors import RecipeError
from vllm_bundle.util.elf import DynamicInfo, symbols_by_version

#: A manylinux policy's name: ``manylinux_2_35_x86_64``.
POLICY_NAME = re.compile(r"manylinux_(\d+)_(\d+)_\w+")
SHOWN_SYMBOLS = 3  # symbols named per problem


def _policies(arch: str) -> WheelPolicies:
    return WheelPolicies(libc=Libc.GLIBC, arch=Architecture(arch))


def manylinux_policy(platform: str) -> Policy:
    """auditwheel's policy for ``platform`` as the recipes spell it (``x86_64-manylinux_2_35``)."""
    arch, _, tag = platform.partition("-")
    try:
        policy: Policy = _policies(arch).get_policy_by_name(f"{tag}_{arch}")
    except (ValueError, LookupError):
        raise RecipeError(f"bad recipe components.toml: python.platform: auditwheel knows no policy {tag!r}") from None
    return policy


def glibc_of(policy_name: str) -> str | None:
    """The glibc version a manylinux policy stands for (``manylinux_2_35_x86_64`` -> ``2.35``)."""
    match = POLICY_NAME.fullmatch(policy_name)
    return f"{match[1]}.{match[2]}" if match else None


def _numeric(version: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return None  # GLIBC_PRIVATE, GLIBC_ABI_DT_RELR, CXXABI_TM_1: no place in an order


def _prefix(version: str) -> tuple[str, str]:
    prefix, _, number = version.partition("_")
    return prefix, number


@dataclass(frozen=True)
class Excess:
    """One symbol version a file needs that the policy does not allow."""

    path: Path
    library: str
    version: str


def excesses(elf_files: Mapping[Path, DynamicInfo], policy: Policy) -> list[Excess]:
    """Every (file, version) above ``policy``: a version of a prefix the policy lists that it does not
    allow. Versions of other prefixes (a bundled library's own, ``OPENSSL_3.0.0``) are not the system's."""
    found = []
    for path, info in elf_files.items():
        for library, version in info.versions:
            prefix, number = _prefix(version)
            allowed = policy.symbol_versions.get(prefix)
            if allowed is not None and number not in allowed:
                found.append(Excess(path, library, version))
    return found


def describe(excess: Excess, root: Path, policy: Policy) -> str:
    """``<file> needs <symbols>@<version> (<library>): above <policy> (<prefix> <= <highest allowed>)``."""
    symbols = symbols_by_version(excess.path, {excess.version}).get(excess.version, [])
    more = len(symbols) - SHOWN_SYMBOLS
    named = ", ".join(symbols[:SHOWN_SYMBOLS]) + (f" and {more} more" if more > 0 else "")
    prefix, _ = _prefix(excess.version)
    numbers = [n for n in (_numeric(v) for v in policy.symbol_versions.get(prefix, ())) if n is not None]
    highest = ".".join(map(str, max(numbers))) if numbers else "none"
    return (
        f"{excess.path.relative_to(root)} needs {named or 'a symbol'}@{excess.version} ({excess.library}): "
        f"above the floor {policy.name} ({prefix} <= {highest})"
    )


@dataclass(frozen=True)
class Floor:
    """What a tree's ELF files need at most: the most compatible manylinux policy that allows all of it
    (``manylinux_2_36_x86_64``; ``linux`` when none does), the glibc that policy stands for, and the
    highest version of each of its prefixes that some file needs."""

    platform: str
    glibc: str | None
    highest: Mapping[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"platform": self.platform, "glibc": self.glibc, "highest": dict(sorted(self.highest.items()))}


def measure(elf_files: Mapping[Path, DynamicInfo], platform: str) -> Floor:
    """The floor of ``elf_files``, for the architecture of ``platform`` (auditwheel picks the policy)."""
    arch = platform.partition("-")[0]
    policies = _policies(arch)
    known = set().union(*(p.symbol_versions for p in policies))
    required: dict[str, set[str]] = {}
    highest: dict[str, tuple[int, ...]] = {}
    for info in elf_files.values():
        for library, version in info.versions:
            prefix, number = _prefix(version)
            if prefix not in known:
                continue
            required.setdefault(library, set()).add(version)
            numeric = _numeric(number)
            if numeric is not None and numeric > highest.get(prefix, ()):
                highest[prefix] = numeric
    chosen = policies.versioned_symbols_policy(required)
    return Floor(chosen.name, glibc_of(chosen.name), {p: ".".join(map(str, v)) for p, v in highest.items()})
