"""Facts about the real upstream (tests/upstream/facts.toml): what the fake upstream is built from and
what ``vllm-bundle probe`` checks against the real hosts. This module reads and expands them; each fact
carries the source it was read from.

Templates in a fact: ``{isa}`` (a project per ISA), ``{bundle}`` (a project per rocm-bootstrap bundle
above the target level), ``{rocm}`` ``{torch}`` ``{torchvision}`` ``{triton}`` (the index's versions),
``{cp}`` (the interpreter tag).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocm_bootstrap import PackagingLevel, device_dist_name, packaging_chain

from vllm_bundle.errors import RecipeError
from vllm_bundle.paths import default_facts
from vllm_bundle.recipes import read_toml

VERSION_KEYS = ("rocm", "torch", "torchvision", "triton")
VERSION_PROJECTS = {"rocm": "rocm-sdk-core", "torch": "torch", "torchvision": "torchvision", "triton": "triton"}
TORCH_DEVICE = "amd-torch-device"  # the only device-package family split above the target level


@dataclass(frozen=True)
class IndexFacts:
    """One of TheRock's indexes, by the directory the fake serves it from."""

    name: str
    channels: tuple[str, ...]
    missing_project: int
    missing_project_source: str
    sha256_fragments: str  # "always", "some" or "never"
    sha256_fragments_source: str
    versions: Mapping[str, str]
    versions_source: str
    torch_device_bundles: tuple[str, ...]  # rocm-bootstrap bundle keys above the target level
    torch_device_bundles_source: str
    # A scenario the fake stages, not a fact the probe checks: SDK releases without a torch built on them.
    sdk_only: tuple[str, ...] = ()
    sdk_only_source: str = ""
    # Where each owner's product-local index sits, relative to this one (whl-next routes to them).
    owner_pages: str = ""
    owner_pages_source: str = ""
    layout: str = "multi-arch"  # or "per-family": one index per family ({family} in its name)
    families: tuple[str, ...] = ()  # per-family: the families that have an index
    families_source: str = ""

    def serves(self, project: ProjectFacts) -> bool:
        """Whether this index has the project at all (some exist in one layout only)."""
        return project.layout in ("", self.layout)

    def device_packages(self, prefix: str, isa: str) -> list[str]:
        """What ``<host>[device-<isa>]`` requires: the ISA's own package and, for torch, each level of the
        ISA's rocm-bootstrap packaging chain this index has a package for (wheel_splitter.py
        _rewrite_host_metadata)."""
        names = []
        for bundle in packaging_chain(isa):
            name = str(device_dist_name(prefix, bundle))
            if bundle.level == PackagingLevel.TARGET or (
                prefix == TORCH_DEVICE and name.removeprefix(f"{prefix}-") in self.torch_device_bundles
            ):
                names.append(name)
        return names


@dataclass(frozen=True)
class ProjectFacts:
    """A project (a name template) as an index serves it."""

    name: str
    source: str
    owner: str = ""  # TheRock's: the product that publishes it (core or pytorch)
    mirror: bool = False  # a PyPI package TheRock's indexes serve in their own version
    kind: str = "wheel"  # or "sdist", or "wheel+sdist"
    placeholder: bool = False  # a name squatted on PyPI: a stub module (hello()), no code
    version: str = "{rocm}"
    tag: str = ""
    requires: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    device_packages: str = ""  # the prefix of its device-code packages (its device-<isa> extras name them)
    layout: str = ""  # the one index layout that has it ("multi-arch" or "per-family"), else both
    requires_parents: bool = False  # a per-ISA device package: also requires its parents the index has (==)
    aotriton_dirs: Mapping[str, str] = field(default_factory=dict)  # bundle -> its aotriton image directory

    def requirements(self, values: Mapping[str, str], index: IndexFacts | None) -> list[str]:
        """Its ``Requires-Dist`` lines for one instance: the fact's own and, for a per-ISA device package,
        ``<prefix>-<parent> == <version>`` for each sub-family and family package of the ISA's packaging
        chain that the index has (rocm-systems wheel_splitter.py generate_device_metadata)."""
        lines = [line.format_map(values) for line in self.requires]
        if self.requires_parents and index is not None:
            prefix = self.name.removesuffix("-{isa}")
            version = self.version.format_map(values)
            parents = index.device_packages(prefix, values["isa"])[1:]
            lines += [f"{parent}=={version}" for parent in parents]
        return lines

    needed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # file -> its DT_NEEDED entries

    def instances(self, isas: tuple[str, ...], index: IndexFacts | None) -> Iterator[dict[str, str]]:
        """The template values of each project this name template stands for."""
        if "{isa}" in self.name:
            yield from ({"isa": isa} for isa in isas)
        elif "{family}" in self.name:
            # {family_package}: the family as it is in a Python package's name, ``-`` as ``_`` (TheRock's
            # py_packaging.py ``get_py_package_name``: _rocm_sdk_libraries_gfx110X_all)
            families = index.families if index else ()
            yield from ({"family": family, "family_package": family.replace("-", "_")} for family in families)
        elif "{bundle}" in self.name:
            for bundle in index.torch_device_bundles if index else ():
                yield {"bundle": bundle, "aotriton": self.aotriton_dirs.get(bundle, f"amd-{bundle}")}
        else:
            yield {}


@dataclass(frozen=True)
class CPythonFacts:
    """How python-build-standalone names a release's assets and their checksums."""

    asset: str  # template: {version} {release} {triple} {flavor}
    checksums: str  # the asset listing every other's sha256
    source: str

    def asset_name(self, version: str, release: str, triple: str, flavor: str) -> str:
        return self.asset.format(version=version, release=release, triple=triple, flavor=flavor)


@dataclass(frozen=True)
class Facts:
    indexes: Mapping[str, IndexFacts]
    therock: tuple[ProjectFacts, ...]
    pypi: tuple[ProjectFacts, ...]
    cpython: CPythonFacts

    def index_for_channel(self, channel: str) -> IndexFacts | None:
        return next((i for i in self.indexes.values() if channel in i.channels), None)


def _project(entry: Mapping[str, Any]) -> ProjectFacts:
    return ProjectFacts(
        name=entry["name"],
        source=entry["source"],
        owner=entry.get("owner", ""),
        mirror=bool(entry.get("mirror", False)),
        kind=entry.get("kind", "wheel"),
        placeholder=bool(entry.get("placeholder", False)),
        version=entry.get("version", "{rocm}"),
        tag=entry.get("tag", ""),
        requires=tuple(entry.get("requires", ())),
        files=tuple(entry.get("files", ())),
        device_packages=entry.get("device-packages", ""),
        layout=entry.get("layout", ""),
        requires_parents=bool(entry.get("requires-parents", False)),
        aotriton_dirs=dict(entry.get("aotriton-dirs", {})),
        needed={path: tuple(libs) for path, libs in entry.get("needed", {}).items()},
    )


def _index(name: str, entry: Mapping[str, Any]) -> IndexFacts:
    return IndexFacts(
        name=name,
        channels=tuple(entry["channels"]),
        missing_project=int(entry["missing-project"]),
        missing_project_source=entry["missing-project-source"],
        sha256_fragments=entry["sha256-fragments"],
        sha256_fragments_source=entry["sha256-fragments-source"],
        versions={key: entry[key] for key in VERSION_KEYS},
        versions_source=entry["versions-source"],
        torch_device_bundles=tuple(entry["torch-device-bundles"]),
        torch_device_bundles_source=entry["torch-device-bundles-source"],
        sdk_only=tuple(entry.get("sdk-only", ())),
        sdk_only_source=entry.get("sdk-only-source", ""),
        owner_pages=entry.get("owner-pages", ""),
        owner_pages_source=entry.get("owner-pages-source", ""),
        layout=entry.get("layout", "multi-arch"),
        families=tuple(entry.get("families", ())),
        families_source=entry.get("families-source", ""),
    )


def load_facts(path: Path | None = None) -> Facts:
    """The facts file (default: the checkout's tests/upstream/facts.toml); a malformed one is one line."""
    path = path or default_facts()
    hint = "see the file's header for its shape"
    doc = read_toml(
        path,
        missing=lambda: RecipeError(f"no facts file at {path}", "run from a checkout, or pass --facts FILE"),
        invalid=lambda err: RecipeError(f"bad facts file {path}: {err}", hint),
    )
    try:
        return Facts(
            indexes={name: _index(name, entry) for name, entry in doc["indexes"].items()},
            therock=tuple(_project(entry) for entry in doc["therock"]),
            pypi=tuple(_project(entry) for entry in doc["pypi"]),
            cpython=CPythonFacts(doc["cpython"]["asset"], doc["cpython"]["checksums"], doc["cpython"]["source"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise RecipeError(f"bad facts file {path}: {err}", hint) from None
