"""TheRock's indexes as AMD publishes them today (tests/upstream/facts.toml, each fact cited there), and what
the lock takes from them: every channel locks against the fake shaped so; only TheRock's own packages may
be pre-releases; nothing under one of TheRock's names comes from anywhere but TheRock's index; a device
package requires its parents, and a missing parent is one line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import requests
from packaging.version import Version

from tests.conftest import REPO, SUITE_PAIRS, assert_one_line_error, bundle_args, in_the_suite, run_cli
from tests.upstream.fixture import (
    PYPI,
    PYTHON_MINOR,
    THEROCK_MULTI_ARCH,
    THEROCK_NEXT,
    THEROCK_NIGHTLY,
    THEROCK_PER_FAMILY,
    Fixture,
)
from tests.upstream.server import Fault, UpstreamServer
from tests.upstream.therock import MULTI_ARCH, NEXT, NIGHTLY, PER_FAMILY
from tests.upstream.vllm_release import TRITON_KERNELS_COMMIT
from vllm_bundle.errors import LockError
from vllm_bundle.inputs.therock import check_origins, therock_names
from vllm_bundle.inputs.triton_kernels import triton_commit
from vllm_bundle.recipes import load_recipes
from vllm_bundle.util.offload import fatbin_isas

DEVICE_CODE = load_recipes(REPO / "recipes").vllm.extension_rule("0.33.0").device_code

#: Each channel, the fake index that plays its host and that index's facts.
CHANNELS = {
    "stable": (THEROCK_NEXT, NEXT),
    "nightly": (THEROCK_NIGHTLY, NIGHTLY),
    "frozen-7.14": (THEROCK_MULTI_ARCH, MULTI_ARCH),
    "nightly-legacy": (THEROCK_PER_FAMILY, PER_FAMILY),
}


def _lock(
    upstream: UpstreamServer,
    recipes: Path,
    channel: str,
    cache: Path,
    index: str = "",
    target: str = "gfx1151",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return run_cli(
        *("lock", target, "--channel", channel, "--recipes", recipes, "--cache-dir", cache, "--plain"),
        *("--therock-index", f"{upstream.url}/{index or CHANNELS[channel][0]}/"),
        *("--pypi-index", f"{upstream.url}/{PYPI}/", "--mirror", f"{upstream.url}/releases/"),
        env=env,
    )


def _packages(recipes: Path, channel: str, target: str = "gfx1151") -> dict[str, dict[str, Any]]:
    pylock = tomllib.loads((recipes / "locks" / channel / f"pylock.{target}.toml").read_text())
    return {p["name"]: p for p in pylock["packages"]}


def test_the_channels_read_the_indexes_amd_publishes_to_today() -> None:
    """Since TheRock#7547 releases go to https://<stream>.repo.amd.com/rocm/whl-next/ (s3_buckets.py:229-232,
    setup_venv.py:56-61); `stable` is the current stable stream, and a channel whose index gets nothing new
    says it is frozen. A change detector on purpose: the URLs are a decision that follows AMD's, and
    moving a channel must be a change to this test too; the rest of this module checks behaviour."""
    recipes = load_recipes(REPO / "recipes")
    indexes = {name: channel.therock_index for name, channel in recipes.channels.items()}
    assert indexes["stable"] == "https://stable.repo.amd.com/rocm/whl-next/"
    assert indexes["nightly"] == "https://nightly.repo.amd.com/rocm/whl-next/"
    assert "https://rocm.nightlies.amd.com/whl-multi-arch/" not in indexes.values(), "superseded, frozen nightlies"
    current = {name for name, channel in recipes.channels.items() if not channel.frozen}
    assert current == {"stable", "nightly"}
    assert recipes.channel("frozen-7.14").therock_index == "https://repo.amd.com/rocm/whl-multi-arch/"
    assert "only while" in recipes.channel("nightly-legacy").frozen, "kept only while its indexes exist"
    for name in recipes.channels:
        facts = CHANNELS[name][1]
        assert name in facts.channels, f"the fake models channel {name}"


@pytest.mark.parametrize("channel", list(CHANNELS))
def test_every_channel_locks_against_the_fake_shaped_as_amd_publishes(
    channel: str, upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path
) -> None:
    facts = CHANNELS[channel][1]
    result = _lock(upstream, recipes_dir, channel, tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    packages = _packages(recipes_dir, channel)
    assert packages["rocm-sdk-core"]["version"] == facts.versions["rocm"]
    assert packages["torch"]["version"] == facts.versions["torch"]
    lock = tomllib.loads((recipes_dir / "locks" / channel / "gfx1151.toml").read_text())
    assert lock["versions"]["rocm"] == facts.versions["rocm"]
    frozen = f"note: channel {channel} is frozen"
    assert (frozen in result.stdout + result.stderr) == (channel in ("frozen-7.14", "nightly-legacy"))
    if facts.layout == "per-family":
        assert "rocm-sdk-libraries-gfx1151" in packages and not any("device" in name for name in packages)
    else:
        assert {"rocm-bootstrap", "rocm-sdk-device-gfx1151", "amd-torch-device-gfx1151"} <= set(packages)
    # triton_kernels of the commit the channel's Triton names, else vLLM's pin (docs/building-rocm.md)
    commit = triton_commit(facts.versions["triton"]) or TRITON_KERNELS_COMMIT
    (kernels,) = [a for a in lock["artifacts"] if a["role"] == "triton-kernels"]
    assert kernels["filename"] == f"triton-{commit}.tar.gz"
    said = "own commit" if triton_commit(facts.versions["triton"]) else "names no commit"
    assert f"the bundle's Triton {facts.versions['triton']}" in result.stdout + result.stderr
    assert said in result.stdout + result.stderr, "the lock says where triton_kernels came from"


def test_a_nightly_lock_takes_therocks_pre_release_sdk_and_pypis_final_releases(
    upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path
) -> None:
    """Nightly ROCm is X.Y.ZaYYYYMMDD; PyPI's newest protobuf is 7.37.0rc1 (vLLM asks protobuf >= 5.29.6):
    uv's `--prerelease allow` took it, `if-necessary-or-explicit` takes the newest final, 7.36.2."""
    result = _lock(upstream, recipes_dir, "nightly", tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    packages = _packages(recipes_dir, "nightly")
    assert Version(packages["rocm-sdk-core"]["version"]).is_prerelease
    assert packages["protobuf"]["version"] == "7.36.2"
    pypi = {name: p for name, p in packages.items() if name not in therock_names_for("nightly")}
    assert pypi and not [name for name, p in pypi.items() if Version(p["version"]).is_prerelease]


def therock_names_for(channel: str) -> Any:
    recipes = load_recipes(REPO / "recipes")
    return therock_names(recipes, recipes.channel(channel), recipes.target("gfx1151"))


class _Fetcher:
    """What check_origins reads through: the session."""

    def __init__(self) -> None:
        self.session = requests.Session()


def _package(name: str, version: str, url: str) -> dict[str, Any]:
    return {"name": name, "version": version, "wheels": [{"url": url}]}


def test_a_pypi_pre_release_is_refused_naming_it(upstream: UpstreamServer) -> None:
    names = therock_names_for("stable")
    url = f"{upstream.url}/files/protobuf-7.37.0rc1-cp310-abi3-manylinux2014_x86_64.whl"
    with pytest.raises(LockError) as refused:
        check_origins([_package("protobuf", "7.37.0rc1", url)], names, _Fetcher(), f"{upstream.url}/{THEROCK_NEXT}/")  # type: ignore[arg-type]
    assert "protobuf 7.37.0rc1 is a pre-release from PyPI" in str(refused.value)


def test_pypi_serves_placeholders_under_therocks_names(fixture_tree: Fixture) -> None:
    """PyPI's squatted names: 0.1.0 sdists and 0.0.1.dev0 py3-none-any wheels with a hello() stub."""
    served = {p.name for p in fixture_tree.indexes[PYPI]}
    assert {"rocm_sdk_core-0.1.0.tar.gz", "rocm-0.1.0.tar.gz", "rocm_kpack-0.0.1.dev0-py3-none-any.whl"} <= served
    assert "amd_torch_device_gfx110x-0.0.1.dev0-py3-none-any.whl" in served, "the sub-family name whl-next uses"
    wheel = fixture_tree.files["amd_torch_device_gfx11-0.0.1.dev0-py3-none-any.whl"]
    with zipfile.ZipFile(wheel) as archive:
        assert "def hello()" in archive.read("amd_torch_device_gfx11/__init__.py").decode()
    names = therock_names_for("stable")
    for name in ("rocm-sdk-core", "rocm-sdk-devel", "amd-torch-device-gfx11", "amd-torchvision-device-gfx1151", "rocm"):
        assert name in names, name
    for name in ("numpy", "setuptools", "filelock", "protobuf"):
        assert name not in names, f"{name}: a PyPI project TheRock only mirrors"


def _future_index(upstream: UpstreamServer, project: str, extra: str) -> str:
    """A copy of stable whl-next whose ``project`` wheel (same version, same files otherwise) also requires
    ``extra`` unpinned, as a future TheRock release might: served beside the others (nothing shared changes)."""
    root = upstream.root
    index = f"therock/future-{project}/whl-next"
    shutil.rmtree(root / index, ignore_errors=True)
    shutil.copytree(root / THEROCK_NEXT, root / index)
    page = (root / index / project / "index.html").read_text()
    wheel_name = page.split("files/", 1)[1].split('"', 1)[0].split("#", 1)[0]
    future = root / "files-future"
    future.mkdir(exist_ok=True)
    with zipfile.ZipFile(root / "files" / wheel_name) as source, zipfile.ZipFile(future / wheel_name, "w") as out:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith(".dist-info/METADATA"):
                data = data.replace(b"Requires-Dist: ", f"Requires-Dist: {extra}\nRequires-Dist: ".encode(), 1)
            out.writestr(info, data)
    (root / index / project / "index.html").write_text(page.replace("/files/", "/files-future/"))
    return index


@pytest.mark.parametrize(
    ("project", "refusal"),
    [
        # a device wheel's own requirement: resolved from the default index, PyPI, which has a placeholder
        ("amd-torch-device-gfx1151", ("amd-torch-device-gfx11 0.0.1.dev0", "TheRock's names", "not a file of")),
        # a host's requirement on a TheRock name is taken from TheRock's index only, which has none
        ("torch", ("requires amd-torch-device-gfx11, which the index it must come from does not have",)),
    ],
)
def test_a_therock_name_reached_unpinned_takes_no_pypi_placeholder(
    project: str, refusal: tuple[str, ...], upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path
) -> None:
    """stable whl-next has no family package amd-torch-device-gfx11; PyPI has a placeholder under that name.
    A TheRock wheel requiring it unpinned would put an empty package where device code belongs."""
    index = _future_index(upstream, project, "amd-torch-device-gfx11")
    result = _lock(upstream, recipes_dir, "stable", tmp_path / "cache", index=index)
    assert_one_line_error(result, *refusal)
    assert not (recipes_dir / "locks" / "stable" / "gfx1151.toml").exists(), "nothing half-written"


def test_rocm_bootstrap_comes_from_therocks_index(upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path) -> None:
    """TheRock owns rocm-bootstrap (rocm_whl_next_ownership.yaml) and its torch requires it: the lock takes it
    from TheRock's index and never asks PyPI (which serves the same 0.3.0: TheRock mirrors it from there)."""
    result = _lock(upstream, recipes_dir, "stable", tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    asked = {r.path for r in upstream.log}
    assert f"/{THEROCK_NEXT}/rocm-bootstrap/" in asked
    assert f"/{PYPI}/rocm-bootstrap/" not in asked, "resolved from TheRock's index only"
    assert f"/{PYPI}/numpy/" in asked, "premise: the PyPI projects TheRock only mirrors come from PyPI"
    assert "rocm-bootstrap" in _packages(recipes_dir, "stable")


def test_device_wheels_require_their_parents_the_index_has(fixture_tree: Fixture) -> None:
    """rocm-systems wheel_splitter.py generate_device_metadata: a per-ISA wheel requires each sub-family and
    family package the split made (== the host's version); those require only the host."""
    cases: tuple[tuple[str, str, set[str]], ...] = (
        (THEROCK_NEXT, "amd_torch_device_gfx1151-", {"amd-torch-device-gfx115x==2.13.0+rocm10.0.0"}),
        (THEROCK_MULTI_ARCH, "amd_torch_device_gfx1151-", {"amd-torch-device-gfx11==2.12.0+rocm7.14.0"}),
        (THEROCK_NEXT, "amd_torch_device_gfx1201-", {"amd-torch-device-gfx12-0==2.13.0+rocm10.0.0"}),
        (THEROCK_NEXT, "amd_torch_device_gfx115x-", set()),
        (THEROCK_NEXT, "amd_torchvision_device_gfx1151-", set()),
    )
    for index, prefix, parents in cases:
        (wheel,) = [p for p in fixture_tree.indexes[index] if p.name.startswith(prefix)]
        with zipfile.ZipFile(wheel) as archive:
            meta = archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()
        requires = {line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist: ")}
        assert {r for r in requires if "-device-gfx1" in r and not r.startswith("rocm-sdk")} == parents, wheel.name
    for sdk in ("rocm_sdk_libraries-10.0.0-", "rocm_sdk_devel-10.0.0-", "rocm_sdk_core-10.0.0-"):
        (wheel,) = [p for p in fixture_tree.indexes[THEROCK_NEXT] if p.name.startswith(sdk)]
        with zipfile.ZipFile(wheel) as archive:
            meta = archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()
        assert "Requires-Dist" not in meta, f"{sdk}: TheRock's templates declare no requirements"


@pytest.mark.parametrize("terminal", [{}, {"COLUMNS": "40"}, {"FORCE_COLOR": "1"}], ids=["plain", "narrow", "color"])
def test_a_missing_family_package_is_one_line_naming_it(
    terminal: dict[str, str], upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path
) -> None:
    """TheRock#6223 published a torch whose gfx11 device bundle was missing from the index. The lock
    tells it from uv's explanation, which uv wraps at ``$COLUMNS`` and colours when asked (a CI's
    ``FORCE_COLOR``): the same line whatever the caller's terminal says."""
    upstream.inject(f"/{THEROCK_MULTI_ARCH}/amd-torch-device-gfx11/", Fault("status", times=None, status=403))
    result = _lock(upstream, recipes_dir, "frozen-7.14", tmp_path / "cache", env=terminal)
    assert_one_line_error(result, "amd-torch-device-gfx11", "TheRock#6223")


#: What a fact's source may cite (facts.toml's header): code at a commit, a PyPI file by its sha256, a file of
#: the pinned vLLM 0.33.0 sdist, or a GitHub thread.
CITATION = re.compile(
    r"[\w.-]+/[\w.-]+@[0-9a-f]{7,40} \S"
    r"|PyPI \S+\.(?:whl|tar\.gz) \([^)]*sha256 [0-9a-f]{64}"
    r"|vLLM 0\.33\.0 (?:requirements|docker|cmake|tools|setup\.py|CMakeLists\.txt|vllm)/?\S*"
    r"|[\w.-]+/[\w.-]+#\d+"
)
#: What is no source: our own notes, and repositories named without a commit.
NOT_A_CITATION = re.compile(
    r"UPSTREAM-FACTS|our notes|(?<![/\w])(?:TheRock|rocm-systems|rocm-cli) (?:PR #\d|[\w/.-]+\.(?:py|ya?ml|md|txt)\b)"
)


def _sources(doc: Any, where: str = "") -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "source" or key.endswith("-source"):
                found.append((f"{where}.{key}", value))
            else:
                found += _sources(value, f"{where}.{key}")
    elif isinstance(doc, list):
        for i, item in enumerate(doc):
            found += _sources(item, f"{where}[{i}]")
    return found


def test_every_fact_cites_a_source_that_holds() -> None:
    doc = tomllib.loads((REPO / "tests" / "upstream" / "facts.toml").read_text())
    sources = _sources(doc)
    assert len(sources) >= 60
    uncited = [f"{where}: {text[:90]}" for where, text in sources if not CITATION.search(text)]
    assert uncited == [], "facts without a source that holds"
    loose = [f"{where}: {found[0]}" for where, text in sources if (found := NOT_A_CITATION.search(text))]
    assert loose == [], "facts citing our notes or a repository without its commit"


def test_a_fact_without_a_commit_is_caught() -> None:
    """The check above can fail: the sources this issue found wanting."""
    for text in (
        "UPSTREAM-FACTS.md Corrections 1: TheRock's index mirrors setuptools 81.0.0",
        "rocm-systems shared/kpack/python/rocm_kpack/wheel_splitter.py generate_device_metadata",
        "rocm-cli PR #111 once saw 404 there",
    ):
        assert not CITATION.search(text) or NOT_A_CITATION.search(text), text


# -- every target on every channel that serves it (#33) ----------------------------------------------------

TARGETS = load_recipes(REPO / "recipes").targets


#: The channels besides the default, each with the targets its fake index serves: every one is built from it
#: (below). A per-family index serves only the families TheRock made one for (none for gfx1150); the default
#: channel's targets are built in test_targets.py.
BUILT_CHANNELS = [name for name in CHANNELS if name != "stable"]
BUILT = [
    (channel, target)
    for channel in BUILT_CHANNELS
    for target in TARGETS
    if CHANNELS[channel][1].layout != "per-family" or TARGETS[target].legacy_family in CHANNELS[channel][1].families
]


#: Every pair a channel serves, the default channel's too (it serves every target).
SERVED = [("stable", target) for target in TARGETS] + BUILT


def _assert_locked_for(target: str, channel: str, recipes: Path) -> None:
    """A multi-arch index's lock holds each ISA's SDK and torch device packages; a per-family index's, the
    family's libraries under their normalized project name (PEP 503: ``rocm-sdk-libraries-gfx110x-all``)."""
    packages = _packages(recipes, channel, target)
    if CHANNELS[channel][1].layout == "per-family":
        assert f"rocm-sdk-libraries-{TARGETS[target].legacy_family.lower()}" in packages, sorted(packages)
        return
    for isa in TARGETS[target].isas:
        assert {f"rocm-sdk-device-{isa}", f"amd-torch-device-{isa}"} <= set(packages), (isa, sorted(packages))


@pytest.mark.parametrize(
    ("channel", "target"),
    [(c, t) for c in BUILT_CHANNELS for t in TARGETS if (c, t) not in BUILT],  # stable: test_targets.py
)
def test_a_target_a_channel_does_not_serve_is_refused_in_one_line(
    channel: str, target: str, upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path
) -> None:
    """A per-family index serves the families TheRock made one for (facts.toml: none for gfx1150): the lock
    of any other target says so in one line. (Every target a channel serves is built in the test below.)"""
    family = TARGETS[target].legacy_family
    assert CHANNELS[channel][1].layout == "per-family" and family not in CHANNELS[channel][1].families
    result = _lock(upstream, recipes_dir, channel, tmp_path / "cache", target=target)
    assert_one_line_error(result, f"TheRock has no per-family index for {family}", "--channel stable")


@pytest.mark.parametrize(
    ("channel", "target"),
    [pair for pair in SERVED if pair not in SUITE_PAIRS],
)
def test_every_target_a_channel_serves_is_locked_with_its_device_packages(
    channel: str, target: str, upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path
) -> None:
    """The pairs the suite does not build (conftest.py SUITE_BUILDS; built with ``--full-matrix``) are
    locked from their channel's own index all the same, the default channel's too: what a pair changes
    first is what the lock takes."""
    result = _lock(upstream, recipes_dir, channel, tmp_path / "cache", target=target)
    assert result.returncode == 0, result.stderr
    _assert_locked_for(target, channel, recipes_dir)


@pytest.mark.parametrize(("channel", "target"), [pytest.param(c, t, marks=in_the_suite(c, t)) for c, t in BUILT])
def test_every_target_is_built_qualified_and_released_on_every_channel_built_from(
    channel: str, target: str, upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path
) -> None:
    """Each target from a channel's own index, lock to release assets (#33; the pairs of conftest.py
    SUITE_BUILDS in the suite, every pair with ``--full-matrix``): the lock holds every ISA's
    device packages (a per-family index: the family's libraries), vLLM's own CMake builds real code objects
    for each ISA against that channel's torch (frozen-7.14: torch 2.12 on ROCm 7.14; nightly-legacy: torch
    2.9 and a per-family SDK, whose devel tree links into ``_rocm_sdk_libraries_<family>``) and SDK, tier 0
    passes (on nightly-legacy reading the SDK's and torch's device code from their fat binaries), and the
    release is tagged with the channel's ROCm and names the channel and its torch."""
    facts = CHANNELS[channel][1]
    result = _lock(upstream, recipes_dir, channel, tmp_path / "cache", target=target)
    assert result.returncode == 0, result.stderr
    _assert_locked_for(target, channel, recipes_dir)
    args = bundle_args(recipes_dir, upstream, tmp_path / "build", tmp_path / "cache")
    if facts.layout == "per-family":  # each family's index has files named as the others': no flat mirror
        del args[args.index("--mirror") : args.index("--mirror") + 2]
    result = run_cli(args[0], target, *args[2:], "--channel", channel, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    isas = list(TARGETS[target].isas)
    tag = f"vllm0.33.0-rocm{facts.versions['rocm']}-{target}"
    release = json.loads((tmp_path / "bundles" / tag / "release.json").read_text())
    assert release["channel"] == channel and release["versions"]["torch"] == facts.versions["torch"], release
    assert release["vllm_build"]["extensions"] == dict.fromkeys(DEVICE_CODE, isas)
    assert release["qualification"]["tier0"]["passed"], release["qualification"]
    site = tmp_path / "build" / target / "root" / f"lib/python{PYTHON_MINOR}/site-packages"
    for name in DEVICE_CODE:
        assert fatbin_isas(site / "vllm" / f"{name}.abi3.so") == set(isas), name
    if facts.layout == "per-family":  # the SDK's and torch's device code inside their libraries, as tier 0 read it
        assert not list(site.rglob("*.kpack")), "a per-family index's wheels have no split device code"
        assert fatbin_isas(site / "torch" / "lib" / "libtorch_hip.so") == set(isas)
