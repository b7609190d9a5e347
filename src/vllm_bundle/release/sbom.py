"""A CycloneDX 1.6 SBOM of a bundle, written with cyclonedx-python-lib: every installed Python
distribution (from its dist-info), plus CPython, the ROCm SDK, torch and vLLM as the bundle's named
components, and the dependency graph between them.

The SBOM is a release asset, so the same inputs give the same bytes:

- the serial number is a UUID derived from the content (the document is rendered once with a zero
  serial, and the serial is the uuid5 of those bytes' sha256);
- the timestamp is the release's source date (``SOURCE_DATE_EPOCH``, else the lock's), not the clock;
- components and dependencies are the library's sorted sets, ordered by their content, not by the
  order they were added in;
- ``metadata.tools`` names the library and its version, so the version is in the bytes: pyproject
  pins it exactly.

A named component that is also an installed distribution (torch, vLLM, TheRock's ``rocm`` package)
appears once: the distribution's name, version, purl, licence and wheel hash, the named title as its
description, its source release (sdist) hash as its pedigree.
"""

from __future__ import annotations

import email.message
import email.parser
import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from cyclonedx.contrib.license.exceptions import InvalidLicenseExpressionException, InvalidSpdxLicenseException
from cyclonedx.contrib.license.factories import LicenseFactory
from cyclonedx.contrib.this.builders import this_component
from cyclonedx.model import HashAlgorithm, HashType
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.bom_ref import BomRef
from cyclonedx.model.component import Component, ComponentType, Pedigree
from cyclonedx.model.dependency import Dependency
from cyclonedx.model.license import DisjunctiveLicense, License
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output import make_outputter
from cyclonedx.schema import OutputFormat, SchemaVersion
from packageurl import PackageURL
from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from vllm_bundle.inputs.lockfile import bundle_environment
from vllm_bundle.manifests import SBOM_SPEC

SBOM_NAMESPACE = uuid.UUID("6f1c1a52-8d0b-4a3e-9f5e-2b7d2f0c7a10")  # fixed: serials derive from content
SCHEMA = SchemaVersion.from_version(SBOM_SPEC)
LICENSES = LicenseFactory()
#: The platform the bundle's CPython runs on, for the markers of its distributions' requirements.
PLATFORM = "x86_64-linux"
#: Trove licence classifiers that name exactly one SPDX licence (most do not: "Apache Software
#: License" has no version, "BSD License" no clause count); others go through as named licences.
CLASSIFIER_IDS = {
    "MIT License": "MIT",
    "ISC License (ISCL)": "ISC",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
}


@dataclass(frozen=True)
class Named:
    """One of the bundle's named components (what the bundle is made of, as its release names it)."""

    ref: str  # its bom-ref when it is no installed distribution
    title: str
    version: str  # its key in the release's versions
    type: ComponentType
    distribution: str | None = None  # the installed distribution it is, if any
    license_id: str | None = None  # its SPDX licence, where known without its metadata
    artifact: str | None = None  # role (in the lock) of the file this component is
    source: str | None = None  # role of the source release it is built from


NAMED = (
    Named(
        "cpython",
        "CPython (python-build-standalone)",
        "python",
        ComponentType.APPLICATION,
        license_id="PSF-2.0",
        artifact="python",
    ),
    Named("rocm", "ROCm SDK (TheRock)", "rocm", ComponentType.FRAMEWORK, distribution="rocm", source="rocm-sdist"),
    Named("torch", "PyTorch (TheRock)", "torch", ComponentType.FRAMEWORK, distribution="torch"),
    Named(
        "vllm",
        "vLLM",
        "vllm",
        ComponentType.APPLICATION,
        distribution="vllm",
        license_id="Apache-2.0",
        source="vllm-sdist",
    ),
)


@dataclass(frozen=True)
class Distribution:
    """An installed Python distribution, as its dist-info's METADATA gives it."""

    name: str  # as METADATA spells it
    version: str
    metadata: email.message.Message

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)

    @property
    def ref(self) -> str:
        return f"pkg:pypi/{self.key}@{self.version}"


def read_distributions(site: Path) -> dict[str, Distribution]:
    """Canonical name → distribution, for every dist-info in ``site`` with a METADATA file (the first
    dist-info of a name, in sorted order, should a site hold two)."""
    found: dict[str, Distribution] = {}
    for info in sorted(site.glob("*.dist-info")):
        metadata_file = info / "METADATA"
        if not metadata_file.is_file():
            continue
        metadata = email.parser.Parser().parsestr(metadata_file.read_text(errors="replace"), headersonly=True)
        dist = Distribution(metadata.get("Name", info.name), metadata.get("Version", ""), metadata)
        found.setdefault(dist.key, dist)
    return found


def _id_or_name(text: str) -> DisjunctiveLicense:
    """An SPDX id where ``text`` is one (case aside), or a classifier known to mean one, or ends in one
    in parentheses ("Boost Software License 1.0 (BSL-1.0)"); else a licence named ``text``."""
    inner = re.search(r"\(([^()]+)\)$", text)
    for candidate in (text, CLASSIFIER_IDS.get(text), inner and inner[1]):
        if candidate:
            try:
                return LICENSES.make_with_id(candidate)
            except InvalidSpdxLicenseException:
                pass
    return LICENSES.make_with_name(text)


def licenses(metadata: email.message.Message) -> list[License]:
    """License-Expression (PEP 639) as an expression; else a one-line License field; else the licence
    classifiers. An expression that is not valid SPDX is kept as a named licence, not dropped."""
    expression = (metadata.get("License-Expression") or "").strip()
    if expression:
        try:
            return [LICENSES.make_with_expression(expression)]
        except InvalidLicenseExpressionException:
            return [LICENSES.make_with_name(expression)]
    text = (metadata.get("License") or "").strip()
    if text and len(text) < 100 and "\n" not in text:
        return [_id_or_name(text)]
    classifiers = {
        c.split("::")[-1].strip() for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")
    }
    return [_id_or_name(name) for name in sorted(classifiers)]


def _requirements(dist: Distribution) -> list[Requirement]:
    found = []
    for line in dist.metadata.get_all("Requires-Dist") or []:
        try:
            found.append(Requirement(line))
        except InvalidRequirement:
            continue
    return found


def _applies(requirement: Requirement, extras: Iterable[str], environment: Mapping[str, str]) -> bool:
    """Whether the marker holds with one of ``extras`` ("" for none). A marker that cannot be decided
    counts: the distribution it names is installed, so the edge is more likely real than not."""
    if requirement.marker is None:
        return True
    try:
        return any(requirement.marker.evaluate({**environment, "extra": extra}) for extra in sorted(extras))
    except (UndefinedComparison, UndefinedEnvironmentName):
        return True


def dependency_graph(dists: Mapping[str, Distribution], environment: Mapping[str, str]) -> dict[str, list[str]]:
    """Canonical name → the installed distributions its Requires-Dist names, for the bundle's Python.

    Extras count where an installed distribution asks for them (``fastapi[standard]`` makes fastapi's
    ``extra == "standard"`` requirements count), repeated until no new extra is asked for."""
    required = {key: _requirements(dist) for key, dist in dists.items()}
    extras: dict[str, set[str]] = {key: {""} for key in dists}
    changed = True
    while changed:
        changed = False
        for key, requirements in required.items():
            for requirement in requirements:
                target = canonicalize_name(requirement.name)
                if target in dists and _applies(requirement, extras[key], environment):
                    wanted = {canonicalize_name(extra) for extra in requirement.extras} - extras[target]
                    if wanted:
                        extras[target] |= wanted
                        changed = True
    return {
        key: sorted(
            {canonicalize_name(r.name) for r in requirements if _applies(r, extras[key], environment)}
            & (dists.keys() - {key})
        )
        for key, requirements in required.items()
    }


def _sha256(digest: str | None) -> list[HashType]:
    return [HashType(alg=HashAlgorithm.SHA_256, content=digest)] if digest else []


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def distribution_component(dist: Distribution, wheel_hash: str | None) -> Component:
    return Component(
        type=ComponentType.LIBRARY,
        bom_ref=dist.ref,
        name=dist.name,
        version=dist.version,
        purl=PackageURL(type="pypi", name=dist.key, version=dist.version),
        licenses=licenses(dist.metadata),
        hashes=_sha256(wheel_hash),
    )


def _public(version: str) -> str:
    """``0.33.0`` for ``0.33.0+rocm714``: the source release's version, without the build's local part."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def _source_release(named: Named, version: str, digest: str) -> Pedigree:
    """The sdist a named component is built from, as its ancestor (the built wheel has a hash of its own)."""
    ancestor = Component(
        type=ComponentType.LIBRARY,
        bom_ref=named.source,
        name=named.distribution or named.ref,
        version=_public(version),
        description=f"{named.title}: source release (sdist)",
        hashes=_sha256(digest),
    )
    return Pedigree(ancestors=[ancestor])


def named_component(
    named: Named,
    version: str,
    dist: Distribution | None,
    wheel_hash: str | None,
    artifact_hashes: Mapping[str, str],
) -> Component:
    """``named`` as a component of its own, or as ``dist`` when it is that distribution."""
    if dist:
        component = distribution_component(dist, wheel_hash)
        component.type, component.description = named.type, named.title
    else:
        component = Component(type=named.type, bom_ref=named.ref, name=named.title, version=version)
    if named.license_id:
        component.licenses = [LICENSES.make_with_id(named.license_id)]
    if named.artifact and named.artifact in artifact_hashes:
        component.hashes = _sha256(artifact_hashes[named.artifact])
    if named.source and named.source in artifact_hashes:
        component.pedigree = _source_release(named, version, artifact_hashes[named.source])
    return component


def _render(bom: Bom) -> bytes:
    return (make_outputter(bom, OutputFormat.JSON, SCHEMA).output_as_string(indent=2) + "\n").encode()


def build_sbom(
    tag: str,
    site: Path,
    versions: Mapping[str, str],
    wheel_hashes: Mapping[str, str],
    artifact_hashes: Mapping[str, str],
    *,
    date: int,
) -> bytes:
    """``wheel_hashes``: sha256 of each installed wheel, by canonical name; ``artifact_hashes``: sha256
    of the CPython tarball and the vLLM and ROCm source releases, by role; ``date``: the release's
    source date (seconds), the SBOM's timestamp."""
    dists = read_distributions(site)
    components = {key: distribution_component(dist, wheel_hashes.get(key)) for key, dist in dists.items()}
    tops, standalone = [], []
    for named in NAMED:
        version = versions[named.version]
        dist = dists.get(named.distribution or "")
        if dist and not _same_version(dist.version, version):
            dist = None  # another version than the bundle's is another thing: both are listed
        wheel_hash = wheel_hashes.get(dist.key) if dist else None
        component = named_component(named, version, dist, wheel_hash, artifact_hashes)
        if dist:
            components[dist.key] = component
        else:
            standalone.append(component)
        tops.append(component.bom_ref)
    root = Component(type=ComponentType.APPLICATION, name="vllm-bundle", version=tag, bom_ref=tag)
    environment = cast("Mapping[str, str]", bundle_environment(versions["python"], PLATFORM))  # every value a str
    graph = dependency_graph(dists, environment)
    edges = {components[key].bom_ref: [components[k].bom_ref for k in deps] for key, deps in graph.items()}
    edges[root.bom_ref] = tops
    bom = Bom(
        components=[*components.values(), *standalone],
        dependencies=[_dependency(ref, refs) for ref, refs in edges.items()],
        metadata=BomMetaData(
            component=root,
            timestamp=datetime.fromtimestamp(date, UTC),
            tools=ToolRepository(components=[this_component()]),
        ),
        serial_number=uuid.UUID(int=0),
    )
    bom.serial_number = uuid.uuid5(SBOM_NAMESPACE, hashlib.sha256(_render(bom)).hexdigest())
    return _render(bom)


def _dependency(ref: BomRef, depends_on: Iterable[BomRef]) -> Dependency:
    return Dependency(ref=ref, dependencies=[Dependency(ref=other) for other in depends_on])
