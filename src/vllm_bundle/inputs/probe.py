"""``vllm-bundle probe``: the facts the fake upstream is built from (tests/upstream/facts.toml), each
checked against the hosts a channel locks from.

The test suite plays upstream from those facts, so a fact that no longer holds (or never did) makes
the suite test a world that is not there. The probe asks the real hosts, one fact at a time, and prints
one line per fact that differs, with the source the fact was read from; the refresh-locks workflow
runs it before it locks, so the first networked run names what the fake got wrong. Wheels are read by
range (their METADATA and file list are a few kilobytes of a multi-gigabyte file).
"""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urljoin

import requests
from packaging.requirements import Requirement
from packaging.tags import parse_tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from vllm_bundle.errors import InvalidValueError, LockError, RecipeError
from vllm_bundle.inputs.facts import VERSION_PROJECTS, Facts, IndexFacts, ProjectFacts
from vllm_bundle.inputs.locker import Sources, get_text
from vllm_bundle.inputs.remote_wheel import metadata_of, open_wheel
from vllm_bundle.inputs.simple_index import IndexFile, page_status, project_files
from vllm_bundle.inputs.therock import in_extra, requirements_of
from vllm_bundle.recipes import Channel, Recipes, Target
from vllm_bundle.util.elf import dynamic_info
from vllm_bundle.util.fetch import Artifact, mirror_source

ABSENT_PROJECT = "vllm-bundle-probe-no-such-project"  # a project page no index has
#: The most files the probe keeps from all the pages it reads. It keeps every page for the run (a page is
#: looked at again by later facts), ~450 bytes a file: simple_index.MOST_FILES bounds one page, this the
#: sum, about 450 MiB. The real indexes list a few thousand files on each of the few dozen pages read.
MOST_FILES_IN_ALL = 1_000_000


@dataclass(frozen=True)
class Difference:
    """A fact the hosts do not bear out."""

    fact: str
    found: str
    source: str

    def line(self) -> str:
        return f"differs  {self.fact}; found: {self.found}  [fact from: {self.source}]"


@dataclass
class _Where:
    """One index as the probe reads it."""

    label: str
    url: str
    index: IndexFacts | None  # None: PyPI


@dataclass
class Probe:
    session: requests.Session
    facts: Facts
    values: Mapping[str, str]  # template values common to every fact ({cp})
    isas: tuple[str, ...]
    checked: int = 0
    differences: list[Difference] = field(default_factory=list)
    fragments: list[bool] = field(default_factory=list)  # per TheRock file listed: has a #sha256
    kept: int = 0  # the files of every page in _pages
    _pages: dict[str, list[IndexFile] | None] = field(default_factory=dict)

    def expect(self, holds: bool, fact: str, found: str, source: str) -> bool:
        self.checked += 1
        if not holds:
            self.differences.append(Difference(fact, found, source))
        return holds

    def page(self, where: _Where, project: str) -> list[IndexFile] | None:
        """A project's files on an index, None when the index has no such project."""
        key = f"{where.url}|{canonicalize_name(project)}"
        if key not in self._pages:
            try:
                files: list[IndexFile] | None = project_files(self.session, where.url, project)
            except LockError:  # the page is not there (403/404/410): a fact, not an error
                files = None
            self.kept += len(files or ())
            if self.kept > MOST_FILES_IN_ALL:
                raise InvalidValueError(
                    f"the index pages the probe read list more than {MOST_FILES_IN_ALL:,} files in all (the last: "
                    f"{where.url.rstrip('/')}/{canonicalize_name(project)}/): not indexes this tool reads",
                    "check the index URLs",
                )
            if files and where.index is not None:
                self.fragments += [f.sha256 is not None for f in files]
            self._pages[key] = files
        return self._pages[key]


def _version_of(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return Version(filename.removesuffix(".tar.gz").rsplit("-", 1)[-1])
    except (InvalidWheelFilename, InvalidVersion):
        return None


def _versions(files: list[IndexFile]) -> str:
    """The newest versions a page lists, for a line saying what was found instead."""
    found = sorted({str(v) for f in files if (v := _version_of(f.filename)) is not None}, key=Version)
    if not found:
        return "none"
    older = f" (and {len(found) - 5} older)" if len(found) > 5 else ""
    return ", ".join(found[-5:]) + older


def _needed(wheel: zipfile.ZipFile, member: str) -> tuple[str, ...] | None:
    with tempfile.NamedTemporaryFile(suffix=".so") as handle:
        handle.write(wheel.read(member))
        handle.flush()
        info = dynamic_info(Path(handle.name))
    return info.needed if info else None


def _check_wheel_contents(
    probe: Probe, where: _Where, project: ProjectFacts, values: Mapping[str, str], wheel: IndexFile
) -> None:
    """What the fact says of the wheel's inside: requirements, device extras, files, DT_NEEDED."""
    label = f"{where.label} {wheel.filename}"
    with open_wheel(probe.session, wheel.url) as archive:
        names = set(archive.namelist())
        requires = requirements_of(metadata_of(archive, wheel.url))
        for line in project.requirements(values, where.index):
            wanted = Requirement(line)
            same_name = [str(r) for r in requires if canonicalize_name(r.name) == canonicalize_name(wanted.name)]
            probe.expect(
                wanted in requires,
                f"{label} requires {wanted}",
                "; ".join(same_name) or "no such requirement",
                project.source,
            )
        if project.device_packages and where.index is not None:
            for isa in probe.isas:
                version = project.version.format_map(values)
                wanted_set = {
                    f"{name}=={version}" for name in where.index.device_packages(project.device_packages, isa)
                }
                got = {f"{canonicalize_name(r.name)}{r.specifier}" for r in requires if in_extra(r, f"device-{isa}")}
                probe.expect(
                    got == wanted_set,
                    f"{label} [device-{isa}] requires {', '.join(sorted(wanted_set))}",
                    ", ".join(sorted(got)) or "no such extra",
                    f"{project.source}; {where.index.torch_device_bundles_source}",
                )
        for path in project.files:
            member = path.format_map(values)
            probe.expect(member in names, f"{label} ships {member}", "not in the wheel", project.source)
        for path, libraries in project.needed.items():
            needed = _needed(archive, path) if path in names else None
            for library in libraries:
                probe.expect(
                    needed is not None and library in needed,
                    f"{label} {path} needs {library}",
                    ", ".join(needed) if needed is not None else "no such ELF file",
                    project.source,
                )


def _check_project(
    probe: Probe, where: _Where, project: ProjectFacts, values: Mapping[str, str], versions_checked: bool
) -> None:
    name, version = project.name.format_map(values), project.version.format_map(values)
    files = probe.page(where, name)
    if not probe.expect(files is not None, f"{where.label} serves {name}", "no project page", project.source):
        return
    assert files is not None
    if project.mirror:
        return  # the fact is that TheRock serves it; the version is the fake's own
    mine = [f for f in files if _version_of(f.filename) == Version(version)]
    if "sdist" in project.kind:  # named by the project's name as published or normalized (PEP 625)
        sdists = {f"{name}-{version}.tar.gz", f"{name.replace('-', '_')}-{version}.tar.gz"}
        probe.expect(
            any(f.filename in sdists for f in files),
            f"{where.label} has {min(sdists)}",
            _versions(files),
            project.source,
        )
    if "wheel" not in project.kind:
        return
    wheels = [f for f in mine if f.filename.endswith(".whl")]
    if not wheels:
        if not versions_checked:  # else the version fact has said it
            probe.expect(False, f"{where.label} has {name} {version}", _versions(files), project.source)
        return
    tag = project.tag.format_map(values)
    tagged = [w for w in wheels if parse_wheel_filename(w.filename)[3] == parse_tag(tag)]
    found = ", ".join(w.filename for w in wheels)
    inside = project.requires or project.files or project.device_packages or project.needed
    if probe.expect(bool(tagged), f"{where.label} has {name} {version} tagged {tag}", found, project.source) and inside:
        _check_wheel_contents(probe, where, project, values, tagged[0])


def _instances(probe: Probe, project: ProjectFacts, index: IndexFacts | None) -> Iterator[dict[str, str]]:
    for extra in project.instances(probe.isas, index):
        yield {**probe.values, **(index.versions if index else {}), **extra}


def _check_index(probe: Probe, where: _Where, index: IndexFacts) -> None:
    absent = f"{where.url.rstrip('/')}/{ABSENT_PROJECT}/"
    status = page_status(probe.session, absent)
    probe.expect(
        status == index.missing_project,
        f"{where.label} answers HTTP {index.missing_project} for a project it does not have",
        f"HTTP {status}",
        index.missing_project_source,
    )
    version_names = {}
    for key, name in VERSION_PROJECTS.items():
        files = probe.page(where, name) or []
        version = index.versions[key]
        version_names[name] = probe.expect(
            any(_version_of(f.filename) == Version(version) for f in files),
            f"{where.label} has {name} {version}",
            _versions(files),
            index.versions_source,
        )
    for project in probe.facts.therock:
        if not index.serves(project):
            continue
        for values in _instances(probe, project, index):
            checked = project.name in version_names  # missing versions are said once
            _check_project(probe, where, project, values, checked)
            if index.owner_pages:
                _check_owner(probe, where, index, project, values)
    seen = probe.fragments
    pattern = "always" if seen and all(seen) else "never" if not any(seen) else "some"
    probe.expect(
        pattern == index.sha256_fragments,
        f"{where.label} gives #sha256 fragments: {index.sha256_fragments}",
        f"{pattern} ({sum(seen)} of {len(seen)} files listed)",
        index.sha256_fragments_source,
    )


def _check_owner(
    probe: Probe, where: _Where, index: IndexFacts, project: ProjectFacts, values: Mapping[str, str]
) -> None:
    name = project.name.format_map(values)
    owner_index = urljoin(where.url.rstrip("/") + "/", index.owner_pages.format(owner=project.owner))
    status = page_status(probe.session, f"{owner_index}{canonicalize_name(name)}/")
    probe.expect(
        status == 200,
        f"{name} is published in {project.owner}'s index {owner_index}",
        f"HTTP {status}",
        f"{index.owner_pages_source}; {project.source}",
    )


def _check_cpython(probe: Probe, recipes: Recipes, channel: Channel, sources: Sources) -> None:
    python, cpython = recipes.python, probe.facts.cpython
    asset = cpython.asset_name(python.version, python.release, python.triple, python.flavor)
    probe.expect(python.asset == asset, f"the recipe names its CPython {asset}", python.asset, cpython.source)
    release = channel.python_releases.format(release=python.release)
    sums = mirror_source(sources.mirror, Artifact("sums", cpython.checksums, release + cpython.checksums, ""))
    listed = {line.split()[-1].lstrip("*") for line in get_text(probe.session, sums).splitlines() if line.strip()}
    probe.expect(
        asset in listed,
        f"python-build-standalone {python.release}'s {cpython.checksums} lists {asset}",
        f"{len(listed)} other assets",
        cpython.source,
    )


def run_probe(
    session: requests.Session,
    facts: Facts,
    recipes: Recipes,
    target: Target,
    channel: Channel,
    sources: Sources,
    note: Callable[[str], None],
) -> Probe:
    """Check every fact that applies to ``channel`` against its hosts (``sources`` overrides them)."""
    index = facts.index_for_channel(channel.name)
    if index is None:
        modelled = ", ".join(c for i in facts.indexes.values() for c in i.channels)
        raise RecipeError(
            f"the facts file models no TheRock index of channel {channel.name}", f"probe one of: {modelled}"
        )
    if index.layout == "per-family":  # the target's family's own index
        index = replace(index, name=index.name.format(family=target.legacy_family), families=(target.legacy_family,))
    cp = "cp{}{}".format(*recipes.python.minor.split("."))
    probe = Probe(session, facts, {"cp": cp}, target.isas)
    note(f"probe  python-build-standalone release {recipes.python.release}")
    _check_cpython(probe, recipes, channel, sources)
    therock = _Where(f"TheRock {index.name}", sources.therock(channel, target), index)
    note(f"probe  {therock.label} at {therock.url} ({', '.join(target.isas)})")
    _check_index(probe, therock, index)
    pypi = _Where("PyPI", sources.pypi(channel), None)
    note(f"probe  PyPI at {pypi.url}")
    for project in facts.pypi:
        for values in _instances(probe, project, None):
            _check_project(probe, pypi, project, values, versions_checked=False)
    return probe
