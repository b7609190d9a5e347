"""A CycloneDX 1.5 SBOM of a bundle: every installed Python distribution (from its dist-info), plus
CPython, the ROCm SDK, torch and vLLM as the bundle's named components.

Written by hand rather than with cyclonedx-python-lib: that library stamps the document with the
current time and a random serial number, and reproducibility needs neither. The serial number here
is a UUID derived from the content, so the same bundle gives the same bytes.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

SBOM_NAMESPACE = uuid.UUID("6f1c1a52-8d0b-4a3e-9f5e-2b7d2f0c7a10")  # fixed: serials derive from content


def _license(metadata: email.message.Message) -> list[dict[str, Any]]:
    expression = metadata.get("License-Expression")
    if expression:
        return [{"expression": expression.strip()}]
    text = (metadata.get("License") or "").strip()
    if text and len(text) < 100 and "\n" not in text:
        return [{"license": {"name": text}}]
    classifiers = [
        c.split("::")[-1].strip() for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")
    ]
    return [{"license": {"name": name}} for name in sorted(set(classifiers))]


def python_components(site: Path, wheel_hashes: Mapping[str, str]) -> list[dict[str, Any]]:
    components = []
    for info in sorted(site.glob("*.dist-info")):
        metadata_file = info / "METADATA"
        if not metadata_file.is_file():
            continue
        metadata = email.parser.Parser().parsestr(metadata_file.read_text(errors="replace"), headersonly=True)
        name, version = metadata.get("Name", info.name), metadata.get("Version", "")
        component: dict[str, Any] = {
            "type": "library",
            "bom-ref": f"pkg:pypi/{canonicalize_name(name)}@{version}",
            "name": name,
            "version": version,
            "purl": f"pkg:pypi/{canonicalize_name(name)}@{version}",
            "licenses": _license(metadata),
        }
        digest = wheel_hashes.get(canonicalize_name(name))
        if digest:
            component["hashes"] = [{"alg": "SHA-256", "content": digest}]
        components.append(component)
    return components


def build_sbom(
    tag: str,
    site: Path,
    versions: Mapping[str, str],
    wheel_hashes: Mapping[str, str],
    artifact_hashes: Mapping[str, str],
) -> bytes:
    """``artifact_hashes``: sha256 of the CPython tarball and vLLM source release, by role."""
    named = [
        {
            "type": "application",
            "bom-ref": "cpython",
            "name": "CPython (python-build-standalone)",
            "version": versions["python"],
            "licenses": [{"license": {"id": "PSF-2.0"}}],
            "hashes": [{"alg": "SHA-256", "content": artifact_hashes["python"]}],
        },
        {"type": "framework", "bom-ref": "rocm", "name": "ROCm SDK (TheRock)", "version": versions["rocm"]},
        {"type": "framework", "bom-ref": "torch", "name": "PyTorch (TheRock)", "version": versions["torch"]},
        {
            "type": "application",
            "bom-ref": "vllm",
            "name": "vLLM",
            "version": versions["vllm"],
            "licenses": [{"license": {"id": "Apache-2.0"}}],
            **(
                {"hashes": [{"alg": "SHA-256", "content": artifact_hashes["vllm-sdist"]}]}
                if "vllm-sdist" in artifact_hashes
                else {}
            ),
        },
    ]
    components = named + python_components(site, wheel_hashes)
    body = {
        "components": components,
        "metadata": {"component": {"type": "application", "name": "vllm-bundle", "version": tag, "bom-ref": tag}},
    }
    serial = uuid.uuid5(SBOM_NAMESPACE, hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest())
    document = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{serial}",
        "version": 1,
        **body,
    }
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
