"""Recipes: the TOML data under ``recipes/`` that says what goes into a bundle for each target.

Validation is hand-written (a few typed accessors) rather than a JSON-schema library because the
error a user needs is one line naming ``file: key`` and what was expected, which schema validators
do not phrase that way.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from vllm_bundle.errors import BundleError, RecipeError, UnknownTargetError
from vllm_bundle.util.fields import TOML, Document, Fields

#: Bumped whenever the meaning of a recipe value or the lock format changes: it is part of the
#: recipe hash, so every lock made by an older tool shows as out of date.
RECIPE_SCHEMA = 3

TARGETS_FILE = "targets.toml"
CHANNELS_FILE = "channels.toml"
COMPONENTS_FILE = "components.toml"
LAUNCHER_FILE = "launcher.toml"
#: A launcher default must be safe to write into sh unquoted (a name, and a value of these characters).
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ENV_VALUE = re.compile(r"^[A-Za-z0-9_.,:/+=@%-]*$")
LAYOUTS = ("multi-arch", "per-family")
#: ``python.platform``: a manylinux platform as uv's --python-platform spells it (``x86_64-manylinux_2_35``).
MANYLINUX_PLATFORM = re.compile(r"^(?P<arch>x86_64|aarch64)-manylinux_(?P<major>[0-9]+)_(?P<minor>[0-9]+)$")
#: The one C toolchain the bundle knows how to run (the cc wrapper execs ``ziglang/zig cc``).
TOOLCHAIN_PROJECT = "ziglang"


@dataclass(frozen=True)
class SizeBudget:
    """The most a bundle may hold, derived from what its installers allow: Lemonade joins the parts and
    runs ``tar -tf`` then ``tar -xf``, each under ``time_limit_s`` (targets.toml [size-budget]); at
    ``extract_rate_mb_s`` that is a tree of ``time_limit_s * extract_rate_mb_s`` MB, of which a bundle may
    use one ``margin``-th (hosts slower than the one the rate was measured on)."""

    time_limit_s: float
    extract_rate_mb_s: float
    margin: float

    @property
    def bytes(self) -> int:
        return int(self.time_limit_s * self.extract_rate_mb_s * 1e6 / self.margin)

    @property
    def gib(self) -> float:
        return self.bytes / 2**30

    def derivation(self) -> str:
        return (
            f"Lemonade's {self.time_limit_s:g} s tar limit at {self.extract_rate_mb_s:g} MB/s, margin {self.margin:g}x"
        )


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    isas: tuple[str, ...]
    legacy_family: str
    size_budget: SizeBudget

    @property
    def pytorch_rocm_arch(self) -> str:
        return ";".join(self.isas)


@dataclass(frozen=True)
class Channel:
    name: str
    description: str
    therock_index: str
    therock_layout: str
    pypi_index: str
    python_releases: str
    versions: Mapping[str, str]
    sdk_wheels: tuple[str, ...]  # TheRock's ROCm SDK as wheels; `{family}` for per-family indexes
    vllm_wheel: str | None = None  # repackage mode: a prebuilt vLLM wheel (specifier) from the indexes
    sdk_build_wheels: tuple[str, ...] = ()  # the SDK's wheels needed only to build (rocm-sdk-devel)
    frozen: str = ""  # why AMD publishes nothing new to this channel's index; empty for a current one

    def therock_index_for(self, target: Target) -> str:
        return self.therock_index.replace("{family}", target.legacy_family)

    def sdk_wheels_for(self, target: Target) -> tuple[str, ...]:
        return tuple(name.replace("{family}", target.legacy_family) for name in self.sdk_wheels)

    def sdk_build_wheels_for(self, target: Target) -> tuple[str, ...]:
        return tuple(name.replace("{family}", target.legacy_family) for name in self.sdk_build_wheels)

    def sdk_target_family(self, target: Target) -> str:
        """What TheRock's ``rocm`` sdist takes as ``ROCM_SDK_TARGET_FAMILY``: a family name of the per-family
        indexes, an ISA of the multi-arch ones (rocm_sdk/_dist_info.py AVAILABLE_TARGET_FAMILIES)."""
        return target.legacy_family if self.therock_layout == "per-family" else target.isas[0]


@dataclass(frozen=True)
class PythonRecipe:
    version: str
    release: str
    triple: str
    flavor: str
    platform: str

    @property
    def minor(self) -> str:
        major, minor, *_ = self.version.split(".")
        return f"{major}.{minor}"

    @property
    def asset(self) -> str:
        return f"cpython-{self.version}+{self.release}-{self.triple}-{self.flavor}.tar.gz"

    @property
    def arch(self) -> str:
        """The CPU of ``platform`` (``x86_64``)."""
        return self._platform()["arch"]

    @property
    def glibc(self) -> str:
        """The oldest glibc the bundle runs on: the manylinux floor its wheels are resolved for
        (``x86_64-manylinux_2_35`` -> ``2.35``, PEP 600's ``manylinux_<major>_<minor>``)."""
        found = self._platform()
        return f"{found['major']}.{found['minor']}"

    def _platform(self) -> re.Match[str]:
        found = MANYLINUX_PLATFORM.match(self.platform)
        if found is None:  # _parse_python refuses such a recipe; a hand-made PythonRecipe may hold one
            raise RecipeError(
                f"bad recipe {COMPONENTS_FILE}: python.platform {self.platform!r} is no manylinux platform"
            )
        return found


@dataclass(frozen=True)
class TheRockRecipe:
    """``components.toml [therock]``: where TheRock's package names are read from (its ownership data, a
    file beside the recipes) and which of those names are PyPI projects it only mirrors."""

    ownership: Path
    pypi_mirrors: frozenset[str]  # canonical names


@dataclass(frozen=True)
class Toolchain:
    """``[toolchain]``: the C compiler every bundle carries, because Triton compiles C at first GPU use
    with ``$CC`` (triton-lang/triton python/triton/runtime/build.py ``_build``) and a host may have no
    libc headers, crt objects or linker. ``c`` is one exact pin of ziglang (PyPI), resolved and hashed by
    the lock with the other wheels; the bundle's ``libexec/vllm-bundle/cc`` runs its ``zig cc``."""

    c: str  # e.g. "ziglang==0.17.1"


@dataclass(frozen=True)
class AttentionRule:
    """How to make an attention backend the default for some vLLM versions: a flag or a variable."""

    versions: SpecifierSet
    backend: str
    flag: str | None
    env: str | None


@dataclass(frozen=True)
class ServerRule:
    """How the launcher starts vLLM's OpenAI-compatible server for some vLLM versions."""

    versions: SpecifierSet
    command: tuple[str, ...]  # arguments to python before the caller's, e.g. ("-m", "vllm...", "serve")


@dataclass(frozen=True)
class ExtensionRule:
    """vLLM's native extensions in a ROCm build, for some vLLM versions: each must exist; each of
    ``device_code`` must carry code objects for every ISA of the target."""

    versions: SpecifierSet
    names: tuple[str, ...]
    device_code: tuple[str, ...]


@dataclass(frozen=True)
class TritonKernels:
    """The triton_kernels source a ROCm build uses: an archive URL and file name made from the repository
    and commit vLLM's cmake names (``{owner}``, ``{repo}``, ``{commit}``), and the package inside it."""

    url: str
    filename: str
    package: str
    triton_repository: str = ""  # owner/repo the bundle's Triton is built from (its +git<commit>'s)


Rule = TypeVar("Rule", AttentionRule, ServerRule, ExtensionRule)


def _covering(rules: tuple[Rule, ...], wanted: Version, table: str) -> Rule:
    """The first rule whose ``versions`` contain ``wanted`` (prereleases too)."""
    for rule in rules:
        if rule.versions.contains(wanted, prereleases=True):
            return rule
    raise RecipeError(
        f"bad recipe {COMPONENTS_FILE}: no {table} entry covers vLLM {wanted}",
        "add one for this version",
    )


@dataclass(frozen=True)
class VllmRecipe:
    version: str
    requirement_files: tuple[str, ...]
    drop_requirements: tuple[str, ...]
    attention: tuple[AttentionRule, ...]
    torch: str  # the torch releases this vLLM version supports (a specifier; the channel narrows it)
    triton_kernels: TritonKernels
    servers: tuple[ServerRule, ...] = ()
    build_requirement_files: tuple[str, ...] = ()
    cmake_build_type: str = "Release"
    extensions: tuple[ExtensionRule, ...] = ()

    def server_rule(self, version: str | None = None) -> ServerRule:
        return _covering(self.servers, Version(version or self.version), "[[vllm.server]]")

    def extension_rule(self, version: str | None = None) -> ExtensionRule:
        return _covering(self.extensions, Version(version or self.version), "[[vllm.extensions]]")

    def attention_rule(self, version: str | None = None) -> AttentionRule:
        return _covering(self.attention, Version(version or self.version), "[[vllm.attention]]")

    @property
    def sdist(self) -> str:
        return f"vllm-{self.version}.tar.gz"


@dataclass(frozen=True)
class Recipes:
    root: Path
    targets: Mapping[str, Target]
    device_packages: Mapping[str, str]  # component -> prefix of TheRock's device-code packages
    channels: Mapping[str, Channel]
    python: PythonRecipe
    component_requirements: Mapping[str, tuple[str, ...]]  # rocm/torch/triton -> requirement names
    vllm: VllmRecipe
    raw: Mapping[str, Mapping[str, Any]]  # file name -> parsed TOML, for hashing
    launcher_defaults: Mapping[str, str]  # launcher.toml: variables bin/vllm-server sets unless the caller has
    toolchain: Toolchain
    therock: TheRockRecipe

    def target(self, name: str) -> Target:
        if name not in self.targets:
            valid = ", ".join(self.targets)
            raise UnknownTargetError(f"unknown target {name!r}; valid targets: {valid}")
        return self.targets[name]

    @property
    def all_isas(self) -> frozenset[str]:
        """Every ISA of every target: what vLLM's architecture list must hold."""
        return frozenset(isa for target in self.targets.values() for isa in target.isas)

    def channel(self, name: str) -> Channel:
        if name not in self.channels:
            valid = ", ".join(self.channels)
            raise UnknownTargetError(f"unknown channel {name!r}; valid channels: {valid}")
        return self.channels[name]

    def recipe_hash(self, target: Target, channel: Channel) -> str:
        """Hash of every recipe value a (target, channel) lock depends on."""
        inputs = {
            "schema": RECIPE_SCHEMA,
            "device-packages": self.raw[TARGETS_FILE].get("device-packages"),
            "target": self.raw[TARGETS_FILE]["targets"][target.name],
            "channel": self.raw[CHANNELS_FILE]["channels"][channel.name],
            "components": self.raw[COMPONENTS_FILE],
            "therock-ownership": _file_digest(self.therock.ownership),
        }
        canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _bad_recipe(message: str) -> RecipeError:
    return RecipeError(
        f"bad recipe {message}", 'fix that key; docs/recipes-and-locks.md, "The recipes", says what each file holds'
    )


class Table(Fields):
    """A recipe's table: :class:`Fields` whose errors are one-line RecipeErrors naming the recipe file and
    the key (``bad recipe targets.toml: targets.gfx1151.isas is ...``), with the checks only recipes need."""

    @classmethod
    def of(cls, data: object, file: str) -> Table:
        """The top table of the recipe file ``file`` (its name in messages)."""
        return cls(Document(file, _bad_recipe, TOML), data, "")

    def specifier(self, key: str) -> str:
        value = self.value(key, str, "a PEP 440 version specifier (may be empty)")
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            raise self.bad(key, "a PEP 440 version specifier such as '>=7.10' (may be empty)") from None
        return value

    def version(self, key: str) -> str:
        value = self.text(key)
        try:
            Version(value)
        except InvalidVersion:
            raise self.bad(key, "a PEP 440 version such as '0.33.0'") from None
        return value


def read_toml(
    path: Path,
    *,
    missing: Callable[[], BundleError] | None = None,
    invalid: Callable[[tomllib.TOMLDecodeError], BundleError] | None = None,
) -> dict[str, Any]:
    """Every TOML file this tool reads (recipes, locks, the facts file, uv's resolutions), as a dict. A
    missing or malformed one is one line: a RecipeError naming the recipe file, or for another kind of
    file the error ``missing()`` or ``invalid(err)`` makes."""
    return read_toml_and_bytes(path, missing=missing, invalid=invalid)[1]


def read_toml_and_bytes(
    path: Path,
    *,
    missing: Callable[[], BundleError] | None = None,
    invalid: Callable[[tomllib.TOMLDecodeError], BundleError] | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """:func:`read_toml`, with the bytes it was parsed from: what a reader hashes must be what it read
    (a lock's hash in the release, read again an hour of building later, could be another lock's)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if missing is not None:
            raise missing() from None
        raise RecipeError(f"recipe file {path} is missing", "restore it from the repository") from None
    try:
        return data, tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        decode = err if isinstance(err, tomllib.TOMLDecodeError) else tomllib.TOMLDecodeError(f"not UTF-8 ({err})")
        if invalid is not None:
            raise invalid(decode) from None
        raise RecipeError(f"bad recipe {path.name}: not valid TOML: {decode}") from None


def _parse_device_packages(doc: Table) -> dict[str, str]:
    prefixes = doc.table("device-packages")
    return {component: prefixes.text(component) for component in prefixes.data}


def _parse_size_budget(doc: Table) -> SizeBudget:
    entry = doc.table("size-budget")
    margin = entry.number("margin")
    if margin < 1:
        raise entry.bad("margin", "a number of at least 1 (the share of the installer's limit a bundle may use)")
    return SizeBudget(entry.number("tar-time-limit-s"), entry.number("extract-rate-mb-s"), margin)


def _parse_targets(doc: Table) -> dict[str, Target]:
    targets = {}
    budget = _parse_size_budget(doc)
    for name, entry in doc.table("targets").items():
        isas = entry.strings("isas")
        for isa in isas:
            if not isa.startswith("gfx"):
                raise entry.bad("isas", "ISA names such as 'gfx1151'")
        targets[name] = Target(
            name=name,
            description=entry.text("description", ""),
            isas=isas,
            legacy_family=entry.text("legacy-family"),
            size_budget=budget,
        )
    if not targets:
        raise doc.bad("targets", "at least one [targets.<name>] table")
    return targets


def _parse_channels(doc: Table, components: tuple[str, ...]) -> dict[str, Channel]:
    channels = {}
    for name, entry in doc.table("channels").items():
        layout = entry.text("therock-layout")
        if layout not in LAYOUTS:
            raise entry.bad("therock-layout", " or ".join(repr(v) for v in LAYOUTS))
        versions = entry.table("versions")
        for component in components:
            versions.specifier(component)
        channels[name] = Channel(
            name=name,
            description=entry.text("description", ""),
            therock_index=entry.text("therock-index"),
            therock_layout=layout,
            pypi_index=entry.text("pypi-index"),
            python_releases=entry.text("python-releases"),
            versions={c: versions.data[c] for c in components},
            sdk_wheels=entry.strings("sdk-wheels"),
            vllm_wheel=entry.specifier("vllm-wheel") if "vllm-wheel" in entry.data else None,
            sdk_build_wheels=entry.strings("sdk-build-wheels", ()),
            frozen=entry.text("frozen", ""),
        )
    return channels


def _parse_python(doc: Table) -> PythonRecipe:
    python = doc.table("python")
    version = python.version("version")
    release = python.text("release")
    if not (release.isdigit() and len(release) == 8):
        raise python.bad("release", "a python-build-standalone release date YYYYMMDD")
    platform = python.text("platform")
    if not MANYLINUX_PLATFORM.match(platform):
        raise python.bad("platform", "a manylinux platform such as 'x86_64-manylinux_2_35'")
    return PythonRecipe(
        version=version,
        release=release,
        triple=python.text("triple"),
        flavor=python.text("flavor"),
        platform=platform,
    )


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as err:
        raise RecipeError(f"cannot read {path}: {err.strerror}", "restore it from the repository") from None


def _parse_therock(doc: Table, root: Path) -> TheRockRecipe:
    table = doc.table("therock")
    ownership = root / table.text("ownership")
    if not ownership.is_file():
        raise RecipeError(
            f"bad recipe {COMPONENTS_FILE}: therock.ownership: no file {ownership}",
            "restore TheRock's ownership data from the repository",
        )
    mirrors = frozenset(str(canonicalize_name(name)) for name in table.strings("pypi-mirrors"))
    return TheRockRecipe(ownership=ownership, pypi_mirrors=mirrors)


def _parse_toolchain(doc: Table) -> Toolchain:
    """``[toolchain] c``: one exact pin of ziglang, nothing else (no markers, extras or ranges): the
    compiler a bundle ships is a recipe decision, never what a re-lock happens to find."""
    table = doc.table("toolchain")
    line = table.text("c")
    expected = f"an exact pin of {TOOLCHAIN_PROJECT} such as '{TOOLCHAIN_PROJECT}==0.17.1'"
    try:
        requirement = Requirement(line)
    except InvalidRequirement:
        raise table.bad("c", expected) from None
    specifiers = list(requirement.specifier)
    if (
        canonicalize_name(requirement.name) != TOOLCHAIN_PROJECT
        or requirement.marker is not None
        or requirement.extras
        or requirement.url
        or len(specifiers) != 1
        or specifiers[0].operator != "=="
        or "*" in specifiers[0].version
    ):
        raise table.bad("c", expected)
    return Toolchain(line)


def _parse_attention(vllm: Table) -> tuple[AttentionRule, ...]:
    rules = []
    for table in vllm.tables("attention"):
        flag, env = table.data.get("flag"), table.data.get("env")
        if (flag is None) == (env is None):
            raise table.bad("flag", "exactly one of flag = '--...' or env = 'NAME'")
        rules.append(
            AttentionRule(
                SpecifierSet(table.specifier("versions")),
                table.text("backend"),
                table.text("flag") if flag is not None else None,
                table.text("env") if env is not None else None,
            )
        )
    return tuple(rules)


def load_targets(root: Path) -> dict[str, Target]:
    """Only ``targets.toml``: all an installer needs (the ISA -> target table)."""
    return _parse_targets(Table.of(read_toml(root / TARGETS_FILE), TARGETS_FILE))


def _parse_servers(vllm: Table) -> tuple[ServerRule, ...]:
    rules = []
    for table in vllm.tables("server"):
        rules.append(ServerRule(SpecifierSet(table.specifier("versions")), table.strings("command")))
    return tuple(rules)


def _parse_extensions(vllm: Table) -> tuple[ExtensionRule, ...]:
    rules = []
    for table in vllm.tables("extensions"):
        names, device_code = table.strings("names"), table.strings("device-code")
        if not set(device_code) <= set(names):
            raise table.bad("device-code", "names listed in `names`")
        rules.append(ExtensionRule(SpecifierSet(table.specifier("versions")), names, device_code))
    return tuple(rules)


BUILD_TYPES = ("Release", "RelWithDebInfo", "Debug")  # what vLLM's envs.py accepts for CMAKE_BUILD_TYPE


def _build_type(vllm: Table) -> str:
    value = vllm.text("cmake-build-type")
    if value not in BUILD_TYPES:
        raise vllm.bad("cmake-build-type", " or ".join(repr(v) for v in BUILD_TYPES))
    return value


def _parse_triton_kernels(vllm: Table) -> TritonKernels:
    table = vllm.table("triton-kernels")
    url, filename = table.text("url"), table.text("filename")
    if "{commit}" not in url or "{commit}" not in filename:
        raise table.bad("url", "an URL and a file name with {commit} (and {owner}, {repo} as needed)")
    repository = table.text("triton-repository")
    if repository.count("/") != 1 or not all(repository.split("/")):
        raise table.bad("triton-repository", "a GitHub repository as owner/name, such as 'ROCm/triton'")
    return TritonKernels(url, filename, table.text("package"), repository)


def load_launcher_defaults(root: Path) -> dict[str, str]:
    """launcher.toml's ``[defaults]``: each a variable name and a value safe in sh without quotes."""
    defaults = Table.of(read_toml(root / LAUNCHER_FILE), LAUNCHER_FILE).table("defaults")
    found = {}
    for name in defaults.data:
        value = defaults.value(name, str, "a string")
        if not ENV_NAME.match(name) or not ENV_VALUE.match(value):
            raise defaults.bad(name, "a variable name and a value of letters, digits and _.,:/+=@%-")
        found[name] = value
    return found


def load_recipes(root: Path) -> Recipes:
    """Read and validate every recipe file under ``root``."""
    if not root.is_dir():
        raise RecipeError(f"no recipes directory at {root}", "pass --recipes DIR")
    raw = {name: read_toml(root / name) for name in (TARGETS_FILE, CHANNELS_FILE, COMPONENTS_FILE)}
    components = Table.of(raw[COMPONENTS_FILE], COMPONENTS_FILE)
    pinned = components.table("wheels")
    component_requirements = {name: pinned.strings(name) for name in pinned.data}
    vllm = components.table("vllm")
    targets_doc = Table.of(raw[TARGETS_FILE], TARGETS_FILE)
    return Recipes(
        root=root,
        targets=_parse_targets(targets_doc),
        device_packages=_parse_device_packages(targets_doc),
        channels=_parse_channels(Table.of(raw[CHANNELS_FILE], CHANNELS_FILE), ("rocm", *pinned.data)),
        python=_parse_python(components),
        component_requirements=component_requirements,
        vllm=VllmRecipe(
            version=vllm.version("version"),
            requirement_files=vllm.strings("requirement-files"),
            drop_requirements=vllm.strings("drop-requirements"),
            attention=_parse_attention(vllm),
            torch=vllm.specifier("torch"),
            servers=_parse_servers(vllm),
            build_requirement_files=vllm.strings("build-requirement-files"),
            cmake_build_type=_build_type(vllm),
            triton_kernels=_parse_triton_kernels(vllm),
            extensions=_parse_extensions(vllm),
        ),
        raw=raw,
        launcher_defaults=load_launcher_defaults(root),
        toolchain=_parse_toolchain(components),
        therock=_parse_therock(components, root),
    )
