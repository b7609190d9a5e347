"""KServe manifests for a pushed image: a ServingRuntime and an InferenceService, rendered from the
templates in ``kserve/`` (shipped as ``kserve_data``) with the image pinned by digest.

string.Template rather than a YAML library: the templates stay readable YAML with their comments, and
every value put in is either a plain word or JSON (a YAML flow sequence).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from string import Template

from vllm_bundle.fsutil import atomic_write
from vllm_bundle.recipes import AttentionRule

TEMPLATES = ("servingruntime.yaml", "inferenceservice.yaml")
PORT = 8080  # KServe's convention for a runtime's HTTP port


def kserve_templates() -> dict[str, str]:
    folder = resources.files("vllm_bundle").joinpath("kserve_data")
    return {name: folder.joinpath(name).read_text() for name in TEMPLATES}


def attention_args(rule: AttentionRule) -> tuple[list[str], list[dict[str, str]]]:
    """How the runtime states the Triton attention default: a flag, or (older vLLM) an env variable."""
    if rule.flag:
        return [f"{rule.flag}={rule.backend}"], []
    return [], [{"name": str(rule.env), "value": rule.backend}]


def render_kserve(image: str, target: str, attention: AttentionRule, out: Path) -> list[Path]:
    """The ServingRuntime and InferenceService examples with the image pinned by digest."""
    flags, env = attention_args(attention)
    args = [f"--port={PORT}", "--model=/mnt/models", "--served-model-name={{.Name}}", *flags]
    values = {
        "IMAGE": image,
        "TARGET": target.lower(),
        "PORT": str(PORT),
        "ARGS": json.dumps(args),
        "ENV": json.dumps(env),
    }
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in kserve_templates().items():
        path = out / name
        atomic_write(path, Template(text).substitute(values).encode())
        written.append(path)
    return written
