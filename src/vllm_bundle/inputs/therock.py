"""What the lock takes from TheRock's index, and only from there.

TheRock owns the ROCm SDK wheels (named by the channel), the torch family, triton and the device-code
packages; its index also mirrors PyPI packages (numpy, setuptools, ...) that must keep coming from PyPI.
The lock pins TheRock's part from what the host wheels themselves declare (TheRock's build writes it:
external-builds/pytorch/build_prod_wheels.py, rocm-systems rocm_kpack/wheel_splitter.py):

- torch requires ``rocm[libraries]==<sdk version>``: the SDK wheels are pinned to that version, so torch
  and the SDK are one ROCm build whatever range the channel allows;
- torch requires ``triton==<version>``: triton is pinned to it;
- torch and torchvision name their device code through extras ``device-<isa>`` (the target's package and
  the sub-family or family packages the index has): those names, pinned, and the SDK's per-ISA
  ``rocm-sdk-device-<isa>``, never a name guessed and probed (a missing page on repo.amd.com answers 403).

- what those hosts require by one of TheRock's names (rocm-bootstrap) comes from TheRock's index too.

``rocm`` itself is published as an sdist only; it is pinned as such and built into the bundle (its
``rocm_sdk`` module is what torch imports).

Which names are TheRock's is read from its own ownership data (:class:`TheRockNames`): PyPI holds
placeholders under many of them (``rocm-sdk-core`` 0.1.0, ``amd-torch-device-gfx1151`` 0.0.1.dev0, a
``hello()`` stub), so after resolution the lock refuses any such package that is not a file of TheRock's index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import requests
import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from vllm_bundle.errors import LockError
from vllm_bundle.inputs.remote_wheel import wheel_metadata
from vllm_bundle.inputs.simple_index import page_exists, project_files
from vllm_bundle.recipes import Channel, Recipes, Target
from vllm_bundle.util.fetch import Artifact, Fetcher

ROCM_META = "rocm"


@dataclass(frozen=True)
class TheRockNames:
    """The package names that are TheRock's: every name of its whl-next ownership data less the PyPI
    projects it only mirrors (components.toml ``[therock]``), every device-code package (by the prefixes of
    targets.toml ``[device-packages]``: ``amd-torch-device-gfx11`` exists on whl-multi-arch though the
    whl-next ownership data has no family package) and the channel's own SDK wheels."""

    names: frozenset[str]
    prefixes: tuple[str, ...]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        canonical = canonicalize_name(name)
        return canonical in self.names or canonical.startswith(self.prefixes)


def ownership_names(path: Path) -> frozenset[str]:
    """Every package name of TheRock's ownership file (its ``python_indexes[].packages`` keys)."""
    try:
        doc: Any = yaml.safe_load(path.read_text())
        indexes = doc["python_indexes"]
        return frozenset(str(canonicalize_name(name)) for index in indexes for name in index["packages"])
    except (OSError, yaml.YAMLError, KeyError, TypeError) as err:
        raise LockError(
            f"cannot read TheRock's package names from {path}: {err}",
            "restore recipes/therock-ownership.yaml from the repository (a verbatim copy of TheRock's)",
        ) from None


def therock_names(recipes: Recipes, channel: Channel, target: Target) -> TheRockNames:
    names = ownership_names(recipes.therock.ownership) - recipes.therock.pypi_mirrors
    names |= {
        str(canonicalize_name(n)) for n in (*channel.sdk_wheels_for(target), *channel.sdk_build_wheels_for(target))
    }
    prefixes = tuple(f"{canonicalize_name(prefix)}-" for prefix in recipes.device_packages.values())
    return TheRockNames(frozenset(names), prefixes)


@dataclass(frozen=True)
class Owned:
    """A requirement resolved from TheRock's index only."""

    name: str
    specifier: str

    @property
    def line(self) -> str:
        return f"{self.name}{self.specifier}"


def require_index(session: requests.Session, index: str, channel: Channel, target: Target) -> None:
    """One line instead of a resolver's 404 when the channel has no index for the target."""
    if page_exists(session, index):
        return
    if channel.therock_layout == "per-family":
        raise LockError(
            f"TheRock has no per-family index for {target.name} at {index}: the legacy per-family indexes are "
            "frozen, some were removed, and some families never had one",
            "use a multi-arch channel (--channel stable or nightly)",
        )
    raise LockError(f"TheRock's index {index} does not exist", f"check therock-index of channel {channel.name}")


def torch_specifier(recipes: Recipes, channel: Channel) -> str:
    """The channel's torch versions, narrowed to those the pinned vLLM version supports."""
    return str(SpecifierSet(channel.versions["torch"]) & SpecifierSet(recipes.vllm.torch))


@dataclass(frozen=True)
class Host:
    """A TheRock wheel the channel selects (torch, torchvision, triton) and what its METADATA declares."""

    name: str
    version: str
    url: str
    exact: Mapping[str, str] = field(default_factory=dict)  # requirement -> the one version it pins (==)
    devices: Mapping[str, tuple[Owned, ...]] = field(default_factory=dict)  # ISA -> its device-<isa> extra
    requires: tuple[Owned, ...] = ()  # its requirements that apply whatever the extras


def _exact(requirement: Requirement) -> str | None:
    pins = [spec.version for spec in requirement.specifier if spec.operator in ("==", "===")]
    return pins[0] if len(pins) == 1 else None


def requirements_of(metadata: Message) -> list[Requirement]:
    """A METADATA's ``Requires-Dist`` entries (an entry packaging cannot parse is no requirement)."""
    found = []
    for text in metadata.get_all("Requires-Dist") or []:
        try:
            found.append(Requirement(text))
        except InvalidRequirement:
            continue
    return found


def in_extra(requirement: Requirement, extra: str) -> bool:
    """Whether a requirement applies only with ``extra`` (e.g. ``device-gfx1151``)."""
    marker = requirement.marker
    return marker is not None and marker.evaluate({"extra": extra}) and not marker.evaluate({"extra": ""})


def read_host(session: requests.Session, name: str, version: str, url: str, isas: tuple[str, ...]) -> Host:
    """What the wheel at ``url`` declares: exact pins of its plain requirements, and for each ISA the
    packages its ``device-<isa>`` extra requires (empty where it has no such extra)."""
    exact: dict[str, str] = {}
    devices: dict[str, list[Owned]] = {isa: [] for isa in isas}
    plain: list[Owned] = []
    for requirement in requirements_of(wheel_metadata(session, url)):
        pinned = _exact(requirement)
        if requirement.marker is None:
            plain.append(Owned(requirement.name, str(requirement.specifier)))
        if requirement.marker is None and pinned:
            exact[canonicalize_name(requirement.name)] = pinned
        for isa in isas:
            if in_extra(requirement, f"device-{isa}"):
                devices[isa].append(Owned(requirement.name, str(requirement.specifier)))
    return Host(name, version, url, exact, {isa: tuple(found) for isa, found in devices.items()}, tuple(plain))


def _local(version: str) -> str | None:
    return Version(version).local


def pinned_stack(
    recipes: Recipes, target: Target, channel: Channel, hosts: Mapping[str, Host], names: TheRockNames
) -> list[Owned]:
    """TheRock's packages of the bundle, each pinned to one version: the SDK at the version torch requires,
    triton at torch's, each ISA's device code as torch and torchvision declare it; and what the hosts
    require by one of TheRock's ``names`` (rocm-bootstrap), from TheRock's index as they require it."""
    torch = hosts.get("torch")
    if torch is None or "rocm" not in torch.exact:
        raise LockError(
            "torch from TheRock's index declares no rocm[libraries]==<version>",
            "this is not one of TheRock's torch builds: check the channel's index",
        )
    sdk = torch.exact["rocm"]
    allowed = SpecifierSet(channel.versions["rocm"])
    if not allowed.contains(sdk):  # a pre-release only where the channel's versions name one
        raise LockError(
            f"torch {torch.version} requires ROCm {sdk}, which channel {channel.name} does not allow (rocm {allowed})",
            "change the versions of rocm or torch in recipes/channels.toml to agree",
        )
    pins = {name: host.version for name, host in hosts.items()}
    for name in pins:
        if name in torch.exact and name != "torch":
            pins[name] = torch.exact[name]  # torch's word on triton (its build pinned it)
    for name, host in hosts.items():  # hosts with device code are split from one build: one local version
        if any(host.devices.values()) and _local(host.version) != _local(torch.version):
            raise LockError(
                f"{name} {host.version} and torch {torch.version} are not one ROCm build",
                f"narrow {name} in recipes/channels.toml to the release built with this torch",
            )
    owned = [Owned(name, f"=={sdk}") for name in channel.sdk_wheels_for(target)]
    owned += [Owned(name, f"=={version}") for name, version in pins.items()]
    if channel.therock_layout == "multi-arch":
        prefix = recipes.device_packages["rocm"]
        owned += [Owned(f"{prefix}-{isa}", f"=={sdk}") for isa in target.isas]
        for name, host in hosts.items():
            for isa, packages in host.devices.items():
                if not packages and name == "torch":
                    raise LockError(
                        f"torch {host.version} on TheRock's index declares no device code for {isa} "
                        f"(no extra device-{isa})",
                        f"check that channel {channel.name} serves {target.name}",
                    )
                owned += packages
    owned += [
        req
        for host in hosts.values()
        for req in host.requires
        if req.name in names and canonicalize_name(req.name) != ROCM_META
    ]
    unique: dict[str, Owned] = {}
    for item in owned:
        unique.setdefault(str(canonicalize_name(item.name)), item)
    return list(unique.values())


def lock_rocm_sdist(fetcher: Fetcher, index: str, version: str) -> Artifact:
    """The ``rocm`` meta package's sdist in the SDK's version, hashed from its bytes when the index
    does not say."""
    filename = f"{ROCM_META}-{version}.tar.gz"
    entry = next((f for f in project_files(fetcher.session, index, ROCM_META) if f.filename == filename), None)
    if entry is None:
        raise LockError(f"TheRock's index {index} has no {filename}", "the SDK wheels and rocm must be one release")
    if entry.sha256:
        path = fetcher.fetch_one(Artifact(ROCM_META, filename, entry.url, entry.sha256, entry.size))
        return Artifact(ROCM_META, filename, entry.url, entry.sha256, path.stat().st_size)
    return fetcher.measure(ROCM_META, filename, entry.url)


def check_origins(packages: list[dict[str, Any]], names: TheRockNames, fetcher: Fetcher, therock: str) -> None:
    """Refuse, in one line, a resolved package that is not what it claims to be: one with a TheRock name
    whose wheel is not a file of TheRock's index (PyPI's placeholders under those names are empty stubs
    where device code belongs), or a pre-release from PyPI (only TheRock's own packages may be one)."""
    for package in packages:
        name, version = package["name"], package["version"]
        wheel = package["wheels"][0]
        filename = unquote(wheel.get("name") or wheel["url"].rsplit("/", 1)[-1])
        if name in names:
            try:
                served = {f.filename for f in project_files(fetcher.session, therock, name)}
            except LockError:  # no page there: nothing of TheRock's
                served = set()
            if filename not in served:
                raise LockError(
                    f"{name} {version} is one of TheRock's names but is not a file of TheRock's index {therock} "
                    f"({filename}): the lock would take a package published elsewhere under TheRock's name "
                    "(PyPI holds empty placeholders under them)",
                    "find the requirement that reaches it unpinned (uv pip tree) and report it; do not ship this lock",
                )
        elif Version(version).is_prerelease:
            raise LockError(
                f"{name} {version} is a pre-release from PyPI, and a bundle ships PyPI's final releases only",
                f"no final release of {name} satisfies vLLM's requirements: report it, or wait for a final release",
            )


def unpublished_hashes(fetcher: Fetcher, therock: str, owned: list[Owned]) -> set[str]:
    """The files of TheRock's packages whose index page gives no sha256 (its generators add one only
    sometimes): the lock hashes those from their bytes rather than trust a hash it cannot check."""
    return {f.filename for o in owned for f in project_files(fetcher.session, therock, o.name) if not f.sha256}
