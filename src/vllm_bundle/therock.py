"""What the lock takes from TheRock's index, and only from there.

TheRock owns the ROCm SDK wheels (named by the channel), torch, triton and the device-code packages;
its index also mirrors PyPI packages (numpy, setuptools, ...) that must keep coming from PyPI. Device
package names follow rocm-bootstrap's packaging chain of each ISA (``gfx1151``, ``gfx115x``,
``gfx11``): stable multi-arch names them per ISA, whl-next per sub-family for torch, so the lock takes
every level the index actually has rather than assuming one. ``rocm`` itself is published as an sdist
only; it is pinned as such and built into the bundle (its ``rocm_sdk`` module is what torch imports).
"""

from __future__ import annotations

from dataclasses import dataclass

import requests
from packaging.specifiers import SpecifierSet
from rocm_bootstrap import device_dist_name, packaging_chain

from vllm_bundle.errors import LockError
from vllm_bundle.fetch import Artifact, Fetcher
from vllm_bundle.recipes import Channel, Recipes, Target
from vllm_bundle.simple_index import page_exists, project_files, project_page

ROCM_META = "rocm"


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


def owned_requirements(
    recipes: Recipes, target: Target, channel: Channel, session: requests.Session, index: str
) -> list[Owned]:
    owned = [Owned(name, channel.versions["rocm"]) for name in channel.sdk_wheels_for(target)]
    for component, names in recipes.component_requirements.items():
        specifier = torch_specifier(recipes, channel) if component == "torch" else channel.versions[component]
        owned += [Owned(name, specifier) for name in names]
    if channel.vllm_wheel is not None:  # repackage mode: TheRock's prebuilt vLLM wheel
        owned.append(Owned("vllm", channel.vllm_wheel))
    if channel.therock_layout == "multi-arch":
        owned += device_packages(recipes, target, channel, session, index)
    return owned


def device_packages(
    recipes: Recipes, target: Target, channel: Channel, session: requests.Session, index: str
) -> list[Owned]:
    """For each ISA and each device-package prefix, every level of its packaging chain the index has."""
    specifiers = {"rocm": channel.versions["rocm"], "torch": torch_specifier(recipes, channel)}
    found: dict[str, Owned] = {}
    for component, prefix in recipes.device_packages.items():
        for isa in target.isas:
            names = [str(device_dist_name(prefix, bundle)) for bundle in packaging_chain(isa)]
            present = [name for name in names if page_exists(session, project_page(index, name))]
            if not present:
                raise LockError(
                    f"TheRock's index {index} has no device code for {isa} (looked for {', '.join(names)})",
                    f"check that channel {channel.name} serves {target.name}",
                )
            for name in present:
                found.setdefault(name, Owned(name, specifiers.get(component, "")))
    return list(found.values())


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
