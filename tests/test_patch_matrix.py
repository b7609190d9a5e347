"""The patch series on every vLLM release with a source distribution on PyPI, 0.10.2 to the newest.

For each release (downloaded once, verified, cached), only the files the series touches and the ones
the checks read are extracted; the series is applied; then, from the files themselves: the
architecture list holds every ISA of every target, re-applying changes nothing, and vLLM's ROCm
platform (imported with a CPU torch reporting a gfx1151) answers every former amdsmi call with amdsmi
missing and with amdsmi raising. Parse and apply only: nothing is built.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version
from zlib_ng import gzip_ng

from tests.conftest import REPO, VllmSdists
from vllm_bundle.errors import PatchError
from vllm_bundle.recipes import load_recipes
from vllm_bundle.tree.patches import apply_series, listed_archs, read_series
from vllm_bundle.util.extract import safe_extract

#: Every vLLM release with a source distribution on PyPI from 0.10.2 on (0.15.x has none).
SUPPORTED = (
    *("0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.16.0", "0.17.0"),
    *("0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0"),
    *("0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0"),
    *("0.30.0", "0.31.0", "0.32.0", "0.33.0"),
)
PATCHES = REPO / "patches" / "vllm"
SERIES = read_series(PATCHES)
REQUIRED = load_recipes(REPO / "recipes").all_isas
READ = {"CMakeLists.txt", "vllm/platforms/__init__.py", "vllm/platforms/interface.py", "vllm/platforms/rocm.py"}
GPU_NAME, GPU_UUID = "AMD Radeon 8060S Graphics", "58580000-0000-0000-0000-000000001151"


@dataclass
class Release:
    version: str
    pristine: Path
    tree: Path
    outcomes: dict[str, str] = field(default_factory=dict)
    error: str = ""
    probe: dict[str, Any] = field(default_factory=dict)


def _extract(sdist: Path, version: str, dest: Path) -> None:
    """The files the series and the checks read, by the tool's own safe extraction. Reading the few files
    means inflating the whole release (34 of them, 10-45 MiB each): zlib-ng (the tool's own dependency)
    inflates them in two thirds of the CPU time the standard library's gzip takes."""
    wanted = READ | {f for group in SERIES for patch in group for f in patch.files}
    with gzip_ng.open(sdist, "rb") as inflated, tarfile.open(fileobj=inflated, mode="r|") as archive:  # type: ignore[no-untyped-call]
        safe_extract(archive, dest, sdist.name, top=f"vllm-{version}", select=lambda name, m: name in wanted)


def _prepare(version: str, sdist: Path, work: Path) -> Release:
    release = Release(version, work / version / "pristine", work / version / "patched")
    _extract(sdist, version, release.pristine)
    shutil.copytree(release.pristine, release.tree)
    try:
        outcomes = apply_series(release.tree, SERIES, Version(version), REQUIRED)
        release.outcomes = {o.patch_id: o.status for o in outcomes}
    except PatchError as err:
        release.error = str(err)
    return release


@pytest.fixture(scope="module")
def matrix(vllm_sdist: VllmSdists, build_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Release]:
    work = tmp_path_factory.mktemp("matrix")
    sdists = vllm_sdist.many(SUPPORTED)
    with ThreadPoolExecutor(max_workers=4) as pool:  # gzip decompression releases the GIL
        releases = dict(zip(SUPPORTED, pool.map(lambda v: _prepare(v, sdists[v], work), SUPPORTED), strict=True))
    for result in _probe(build_python, [r.tree for r in releases.values() if not r.error], timeout=600):
        releases[Path(result["tree"]).parent.name].probe = result
    return releases


def _probe(build_python: Path, trees: list[Path], timeout: int) -> list[dict[str, Any]]:
    """amdsmi_probe.py's answers (one JSON object per tree), run by the build venv's python."""
    probe = subprocess.run(
        [str(build_python), str(Path(__file__).with_name("amdsmi_probe.py")), *map(str, trees)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    return [json.loads(line) for line in probe.stdout.splitlines()]


def _archs(tree: Path) -> set[str]:
    checked = next(p for group in SERIES for p in group if p.archs is not None)
    listed = listed_archs(tree, checked)
    assert listed is not None, f"no architecture list in {tree}"
    return set(listed)


def _digest(tree: Path) -> str:
    files = sorted(p for p in tree.rglob("*") if p.is_file())
    return hashlib.sha256(b"".join(p.relative_to(tree).as_posix().encode() + p.read_bytes() for p in files)).hexdigest()


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_target_isa_is_in_the_architecture_list(matrix: dict[str, Release], version: str) -> None:
    release = matrix[version]
    assert not release.error, release.error
    assert set(release.outcomes) == {group[0].id for group in SERIES}
    assert _archs(release.tree) >= REQUIRED, f"missing {sorted(REQUIRED - _archs(release.tree))}"
    if release.outcomes["hip-archs-rdna"] == "already upstream":
        assert _archs(release.pristine) >= REQUIRED, "'already upstream' only when upstream lists every ISA"
    else:
        assert release.outcomes["hip-archs-rdna"] == "applied"
        assert not _archs(release.pristine) >= REQUIRED, "a variant is applied only where upstream lacks an ISA"


@pytest.mark.parametrize("version", SUPPORTED)
def test_reapplying_changes_nothing(matrix: dict[str, Release], version: str) -> None:
    release = matrix[version]
    before = _digest(release.tree)
    again = apply_series(release.tree, SERIES, Version(version), REQUIRED)
    assert {o.status for o in again} <= {"already applied", "already upstream"}
    assert _digest(release.tree) == before


@pytest.mark.parametrize("amdsmi", ["missing", "raising"])
@pytest.mark.parametrize("version", SUPPORTED)
def test_every_former_amdsmi_call_answers(matrix: dict[str, Release], version: str, amdsmi: str) -> None:
    results = matrix[version].probe[amdsmi]
    errors = {name: value for name, value in results.items() if isinstance(value, str) and value.startswith("ERROR")}
    assert not errors, errors
    assert results["rocm_platform_plugin"] == "vllm.platforms.rocm.RocmPlatform", "detected through torch"
    assert results["get_device_name"] == GPU_NAME
    assert results["is_fully_connected"] is False, "no XGMI link known: the conservative answer"
    assert results.get("get_device_uuid", GPU_UUID) == GPU_UUID
    assert results.get("get_all_device_numa_nodes") is None
    assert results.get("_GCN_ARCH", "gfx1151") == "gfx1151"


def test_the_probe_fails_on_unpatched_releases(build_python: Path, matrix: dict[str, Release]) -> None:
    """The probe is not a check that cannot fail: on the pristine sources it sees the defects."""
    pristine = [matrix[v].pristine for v in ("0.10.2", "0.33.0")]
    results = _probe(build_python, pristine, timeout=300)
    assert len(results) == len(pristine)
    for result in results:
        assert "NameError" in result["missing"]["get_device_name"]
        assert "AmdSmiException" in result["raising"]["is_fully_connected"]
        assert result["missing"]["rocm_platform_plugin"] is None


def test_the_docs_table_lists_every_release_and_state(matrix: dict[str, Release]) -> None:
    text = (REPO / "docs" / "patches.md").read_text()
    rows = re.findall(r"^\| (0\.\d+\.\d+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", text, re.MULTILINE)
    table = {version: (archs.strip(), fallback.strip(), calls.strip()) for version, archs, fallback, calls in rows}
    expected = {
        v: (r.outcomes["hip-archs-rdna"], r.outcomes["amdsmi-fallback"], r.outcomes["amdsmi-calls"])
        for v, r in matrix.items()
    }
    assert table == expected
