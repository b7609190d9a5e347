"""The SBOM (release/sbom.py) from a small fake site-packages: valid CycloneDX 1.6 (the schema check is
shown to fail on broken documents), the same bytes from the same inputs, each thing once, SPDX licences
where the metadata gives them, and the dependency graph the metadata declares for the bundle's Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from vllm_bundle.release.assets import sbom_writer
from vllm_bundle.release.sbom import build_sbom

DATE = 1763596800  # 2025-11-20, the release's source date
VERSIONS = {
    "python": "3.12.15",
    "rocm": "7.14.0",
    "torch": "2.12.0+rocm7.14.0",
    "torchvision": "0.27.0+rocm7.14.0",
    "vllm": "0.33.0+rocm714",
}
WHEELS = {"torch": "a" * 64, "fastapi": "b" * 64, "vllm": "c" * 64, "sentencepiece": "d" * 64}
ARTIFACTS = {"python": "1" * 64, "vllm-sdist": "2" * 64, "rocm-sdist": "3" * 64}
#: name, version, METADATA lines after Name and Version
DISTRIBUTIONS: list[tuple[str, str, list[str]]] = [
    (
        "vllm",
        "0.33.0+rocm714",
        [
            "License: Apache 2.0",
            "Requires-Dist: torch==2.12.0",
            "Requires-Dist: fastapi[standard]>=0.115",
            "Requires-Dist: sentencepiece",
            "Requires-Dist: not-installed>=1",
            "Requires-Dist: tomli; python_version < '3.11'",  # installed, but not for the bundle's 3.12
            "Requires-Dist: typing-extensions; python_version >= '3.12' and sys_platform == 'linux'",
            "Requires-Dist: pywin32; sys_platform == 'win32'",
            # what vLLM's setup.py adds for each ISA it built for (vllm-0.33.0 setup.py:1531-1546)
            "Requires-Dist: torch[device-gfx1151]",
            "Requires-Dist: torchvision[device-gfx1151]",
            "Requires-Dist: rocm[device-gfx1151]",
        ],
    ),
    (
        "torch",
        "2.12.0+rocm7.14.0",
        [
            "License-Expression: BSD-3-Clause",
            "Requires-Dist: rocm[libraries]==7.14.0",
            "Requires-Dist: amd-torch-device-gfx1151==2.12.0+rocm7.14.0; extra == 'device-gfx1151'",
            "Requires-Dist: amd-torch-device-gfx1100==2.12.0+rocm7.14.0; extra == 'device-gfx1100'",
        ],
    ),
    ("amd-torch-device-gfx1151", "2.12.0+rocm7.14.0", ["Requires-Dist: torch==2.12.0+rocm7.14.0"]),
    (
        "rocm",
        "7.14.0",
        [
            "Requires-Dist: rocm-sdk-core==7.14.0",
            "Requires-Dist: rocm-sdk-libraries==7.14.0; extra == 'libraries'",
            "Requires-Dist: rocm-sdk-device-gfx1151==7.14.0; extra == 'device-gfx1151'",
        ],
    ),
    ("rocm-sdk-device-gfx1151", "7.14.0", []),
    ("rocm_sdk_core", "7.14.0", []),
    ("rocm-sdk-libraries", "7.14.0", ["Requires-Dist: rocm-sdk-core==7.14.0"]),
    (
        "FastAPI",
        "0.115.0",
        [
            "Classifier: License :: OSI Approved :: MIT License",
            "Requires-Dist: uvicorn; extra == 'standard'",
            "Requires-Dist: httpx; extra == 'all'",  # nothing installed asks for [all]
        ],
    ),
    ("uvicorn", "0.30.0", ["License: bsd-3-clause"]),
    ("httpx", "0.28.0", ["License-Expression: BSD-3-Clause OR MIT"]),
    ("sentencepiece", "0.2.1", ["Classifier: License :: OSI Approved :: Apache Software License"]),
    ("tomli", "2.0.0", ["Classifier: License :: OSI Approved :: Boost Software License 1.0 (BSL-1.0)"]),
    ("typing_extensions", "4.12.0", ["License-Expression: not a licence (really)"]),
    ("pywin32", "306", ["License: PSF"]),
    # torchvision is in the release's versions, but not one of its named components
    ("torchvision", "0.27.0+rocm7.14.0", ["Requires-Dist: torch==2.12.0"]),
]
TAG = "vllm0.33.0-rocm7.14.0-gfx1151"
ROOT_DEPENDS_ON = {
    "cpython",
    "pkg:pypi/rocm@7.14.0",
    "pkg:pypi/torch@2.12.0+rocm7.14.0",
    "pkg:pypi/vllm@0.33.0+rocm714",
}


def make_site(site: Path, distributions: list[tuple[str, str, list[str]]] = DISTRIBUTIONS) -> Path:
    site.mkdir(parents=True)
    for name, version, lines in distributions:
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        metadata = ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}", *lines]
        (info / "METADATA").write_text("\n".join(metadata) + "\n")
    (site / "broken-1.0.dist-info").mkdir()  # no METADATA: not a distribution
    return site


def sbom_bytes(site: Path, date: int = DATE, wheels: dict[str, str] = WHEELS) -> bytes:
    return build_sbom(TAG, site, VERSIONS, wheels, ARTIFACTS, date=date)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return make_site(tmp_path / "site-packages")


@pytest.fixture
def sbom(site: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(sbom_bytes(site))
    return document


def by_name(sbom: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in sbom["components"]}


def depends_on(sbom: dict[str, Any]) -> dict[str, set[str]]:
    return {d["ref"]: set(d.get("dependsOn", [])) for d in sbom["dependencies"]}


# --- the schema ---------------------------------------------------------------------------------------


def schema_errors(document: dict[str, Any]) -> object:
    return JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(document))


def test_valid_cyclonedx_1_6(sbom: dict[str, Any]) -> None:
    assert sbom["bomFormat"] == "CycloneDX" and sbom["specVersion"] == "1.6"
    assert sbom["$schema"] == "http://cyclonedx.org/schema/bom-1.6.schema.json"
    assert schema_errors(sbom) is None


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("component without a name", "'name' is a required property"),
        ("wrong bomFormat", "'SPDX' is not one of ['CycloneDX']"),
        ("unknown key (strict)", "'nickname' was unexpected"),
        ("bad hash", "'not hex' does not match"),
        ("licence id not SPDX", "is not valid under any of the given schemas"),
    ],
)
def test_the_schema_check_fails_on_a_broken_document(sbom: dict[str, Any], breakage: str, message: str) -> None:
    component = by_name(sbom)["FastAPI"]
    if breakage == "component without a name":
        del component["name"]
    elif breakage == "wrong bomFormat":
        sbom["bomFormat"] = "SPDX"
    elif breakage == "unknown key (strict)":
        component["nickname"] = "fa"
    elif breakage == "bad hash":
        component["hashes"][0]["content"] = "not hex"
    else:
        component["licenses"] = [{"license": {"id": "MIT License"}}]
    assert message in str(schema_errors(sbom))


# --- the same bytes -----------------------------------------------------------------------------------


def test_the_same_inputs_give_the_same_bytes(site: Path, tmp_path: Path) -> None:
    """Again in this process; from a site whose dist-info dirs were made in the other order; and in
    fresh interpreters with other hash seeds (set and dict orders inside the library)."""
    first = sbom_bytes(site)
    assert sbom_bytes(site) == first
    assert sbom_bytes(make_site(tmp_path / "reversed", DISTRIBUTIONS[::-1])) == first
    script = (
        "import sys; from pathlib import Path; from tests.test_sbom import sbom_bytes; "
        "sys.stdout.buffer.write(sbom_bytes(Path(sys.argv[1])))"
    )
    for seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", script, str(site)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert result.stdout == first


def test_serial_from_content_and_timestamp_from_the_source_date(site: Path, sbom: dict[str, Any]) -> None:
    assert sbom["serialNumber"].startswith("urn:uuid:")
    assert datetime.fromisoformat(sbom["metadata"]["timestamp"]) == datetime.fromtimestamp(DATE, UTC)
    later = json.loads(sbom_bytes(site, date=DATE + 1))
    other_wheel = json.loads(sbom_bytes(site, wheels={**WHEELS, "fastapi": "e" * 64}))
    serials = {sbom["serialNumber"], later["serialNumber"], other_wheel["serialNumber"]}
    assert len(serials) == 3, "another date or another hash is another document"


def test_the_tool_is_the_pinned_library(sbom: dict[str, Any]) -> None:
    """The library names itself and its version in the bytes: the build extra pins it exactly."""
    (tool,) = sbom["metadata"]["tools"]["components"]
    assert tool["name"] == "cyclonedx-python-lib"
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'"cyclonedx-python-lib=={tool["version"]}",' in pyproject


def test_the_release_stage_key_names_the_library_and_spec_the_sbom_is_written_with(sbom: dict[str, Any]) -> None:
    """The release stage's key reads the library's version from its metadata (not importing it): the same
    version the SBOM names, and the spec it is written in."""
    (tool,) = sbom["metadata"]["tools"]["components"]
    assert sbom_writer() == {"cyclonedx-python-lib": tool["version"], "spec": sbom["specVersion"]}


# --- each thing once ----------------------------------------------------------------------------------


def test_each_component_once(sbom: dict[str, Any]) -> None:
    refs = [c["bom-ref"] for c in sbom["components"]]
    names = [c["name"] for c in sbom["components"]]
    assert len(refs) == len(set(refs)) and len(names) == len(set(names))
    assert {d["ref"] for d in sbom["dependencies"]} == {*refs, TAG}
    assert set(names) == {name for name, _, _ in DISTRIBUTIONS} | {"CPython (python-build-standalone)"}
    assert sbom["metadata"]["component"] == {
        "type": "application",
        "name": "vllm-bundle",
        "version": TAG,
        "bom-ref": TAG,
    }


def test_a_named_component_that_is_installed_is_that_distribution(sbom: dict[str, Any]) -> None:
    """torch, vLLM and the ROCm SDK are their distributions, with the named title, type, licence and
    source release kept; CPython is no distribution and stays as it was."""
    components = by_name(sbom)
    torch, vllm, rocm = components["torch"], components["vllm"], components["rocm"]
    assert (torch["description"], torch["type"]) == ("PyTorch (TheRock)", "framework")
    assert torch["purl"] == "pkg:pypi/torch@2.12.0%2Brocm7.14.0" and torch["version"] == VERSIONS["torch"]
    assert torch["hashes"] == [{"alg": "SHA-256", "content": WHEELS["torch"]}]
    assert (vllm["description"], vllm["type"], vllm["version"]) == ("vLLM", "application", "0.33.0+rocm714")
    assert vllm["licenses"] == [{"license": {"id": "Apache-2.0"}}]
    assert vllm["hashes"] == [{"alg": "SHA-256", "content": WHEELS["vllm"]}]
    (sdist,) = vllm["pedigree"]["ancestors"]
    assert (sdist["name"], sdist["version"], sdist["bom-ref"]) == ("vllm", "0.33.0", "vllm-sdist")
    assert sdist["hashes"] == [{"alg": "SHA-256", "content": ARTIFACTS["vllm-sdist"]}]
    assert (rocm["description"], rocm["version"]) == ("ROCm SDK (TheRock)", "7.14.0")
    assert rocm["pedigree"]["ancestors"][0]["hashes"][0]["content"] == ARTIFACTS["rocm-sdist"]
    cpython = components["CPython (python-build-standalone)"]
    assert cpython["bom-ref"] == "cpython" and cpython["version"] == "3.12.15"
    assert cpython["licenses"] == [{"license": {"id": "PSF-2.0"}}]
    assert cpython["hashes"] == [{"alg": "SHA-256", "content": ARTIFACTS["python"]}]


def test_named_components_without_their_distribution(tmp_path: Path) -> None:
    """No torch installed, another vLLM than the release's: the named ones stand on their own, and the
    other vLLM is listed beside the release's (not merged into it)."""
    others = [d for d in DISTRIBUTIONS if d[0] not in ("torch", "vllm")] + [("vllm", "0.1.0", [])]
    sbom = json.loads(sbom_bytes(make_site(tmp_path / "site", others)))
    components = by_name(sbom)
    assert components["PyTorch (TheRock)"]["bom-ref"] == "torch" and "torch" not in components
    assert components["vLLM"]["version"] == "0.33.0+rocm714" and components["vllm"]["version"] == "0.1.0"
    assert components["vLLM"]["pedigree"]["ancestors"][0]["bom-ref"] == "vllm-sdist"
    assert depends_on(sbom)[TAG] == {"cpython", "pkg:pypi/rocm@7.14.0", "torch", "vllm"}
    assert schema_errors(sbom) is None


# --- licences -----------------------------------------------------------------------------------------


def test_licences(sbom: dict[str, Any]) -> None:
    licences = {name: c.get("licenses") for name, c in by_name(sbom).items()}
    assert licences["torch"] == [{"expression": "BSD-3-Clause"}]
    assert licences["httpx"] == [{"expression": "BSD-3-Clause OR MIT"}]
    assert licences["FastAPI"] == [{"license": {"id": "MIT"}}], "a classifier that names one SPDX licence"
    assert licences["uvicorn"] == [{"license": {"id": "BSD-3-Clause"}}], "a License field that is an id"
    assert licences["tomli"] == [{"license": {"id": "BSL-1.0"}}], "the id in a classifier's parentheses"
    assert licences["sentencepiece"] == [{"license": {"name": "Apache Software License"}}], "no version: no id"
    assert licences["pywin32"] == [{"license": {"name": "PSF"}}]
    assert licences["typing_extensions"] == [{"license": {"name": "not a licence (really)"}}], "kept, not an id"
    assert licences["rocm_sdk_core"] is None


# --- dependencies -------------------------------------------------------------------------------------


def test_dependencies(sbom: dict[str, Any]) -> None:
    graph = depends_on(sbom)
    ref = {c["name"]: c["bom-ref"] for c in sbom["components"]}
    assert graph[TAG] == ROOT_DEPENDS_ON, "the bundle depends on its named components"
    vllm_needs = ("torch", "torchvision", "rocm", "FastAPI", "sentencepiece", "typing_extensions")
    assert graph[ref["vllm"]] == {ref[n] for n in vllm_needs}
    assert graph[ref["FastAPI"]] == {ref["uvicorn"]}, "[standard] is asked for, [all] is not"
    assert graph[ref["torch"]] == {ref["rocm"], ref["amd-torch-device-gfx1151"]}, "vLLM asks for [device-gfx1151]"
    rocm_needs = {ref["rocm_sdk_core"], ref["rocm-sdk-libraries"], ref["rocm-sdk-device-gfx1151"]}
    assert graph[ref["rocm"]] == rocm_needs, "torch asks for rocm[libraries], vLLM for rocm[device-gfx1151]"
    assert graph[ref["torchvision"]] == {ref["torch"]}
    assert graph[ref["httpx"]] == graph[ref["tomli"]] == graph[ref["CPython (python-build-standalone)"]] == set()


def test_markers_are_the_bundles_python_not_the_hosts(site: Path) -> None:
    older = json.loads(build_sbom(TAG, site, {**VERSIONS, "python": "3.10.16"}, WHEELS, ARTIFACTS, date=DATE))
    ref = {c["name"]: c["bom-ref"] for c in older["components"]}
    needs = ("torch", "torchvision", "rocm", "FastAPI", "sentencepiece", "tomli")
    assert depends_on(older)[ref["vllm"]] == {ref[n] for n in needs}
