"""KServe manifests for a pushed image: a ServingRuntime and an InferenceService, rendered from the
templates in ``kserve/`` (shipped as ``kserve_data``) with the image pinned by digest.

string.Template rather than a YAML library: the templates stay readable YAML with their comments. Every
value put in is JSON (a double-quoted YAML scalar, a YAML flow sequence), so no character of an image
reference (``#``, ``: ``, quotes) can end a value early, start a comment or change the document; the
names made from the target are checked against Kubernetes' rules first.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from string import Template

from vllm_bundle.errors import KServeError
from vllm_bundle.recipes import AttentionRule
from vllm_bundle.util.fsutil import atomic_write

TEMPLATES = ("servingruntime.yaml", "inferenceservice.yaml")
PORT = 8080  # KServe's convention for a runtime's HTTP port
RUNTIME_PREFIX = "vllm-rocm-"  # the ServingRuntime's name: vllm-rocm-<target>
SERVICE_PREFIX = "qwen3-0-6b-"  # the example InferenceService's name: qwen3-0-6b-<target>
#: KServe names the predictor's Deployment, Service and autoscaler ``<InferenceService>-predictor``.
DERIVED_SUFFIX = "-predictor"
#: Kubernetes' DNS-1123 label, the rule of every name here (a Service's name is one).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_NAME = 63
MAX_TARGET = MAX_NAME - max(len(RUNTIME_PREFIX), len(SERVICE_PREFIX) + len(DERIVED_SUFFIX))


def kserve_names(target: str) -> dict[str, str]:
    """The Kubernetes names made from a target (lower case: Kubernetes names have no capitals)."""
    name = target.lower()
    return {"RUNTIME": RUNTIME_PREFIX + name, "SERVICE": SERVICE_PREFIX + name}


def check_target(target: str) -> None:
    """A target whose KServe names Kubernetes accepts: lower case letters, digits and ``-`` once lowered,
    starting and ending with a letter or digit, and short enough that every derived name stays within
    63 characters."""
    name = target.lower()
    if DNS_LABEL.fullmatch(name) and len(name) <= MAX_TARGET:
        return
    raise KServeError(
        f"target {target!r} cannot name Kubernetes objects (KServe's ServingRuntime {RUNTIME_PREFIX}<target>, "
        f"InferenceService {SERVICE_PREFIX}<target>): a Kubernetes name is letters, digits and '-', starting "
        f"and ending with a letter or digit, and here at most {MAX_TARGET} characters for the target",
        "rename the target in targets.toml",
    )


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
    check_target(target)
    flags, env = attention_args(attention)
    args = [f"--port={PORT}", "--model=/mnt/models", "--served-model-name={{.Name}}", *flags]
    names = kserve_names(target)
    values = {
        "IMAGE": json.dumps(image),
        "TARGET": target.lower(),  # in comments only; every value below is quoted
        "RUNTIME": json.dumps(names["RUNTIME"]),
        "SERVICE": json.dumps(names["SERVICE"]),
        "DISPLAY_NAME": json.dumps(f"vLLM ROCm {target.lower()} (vllm-bundle)"),
        "PORT": str(PORT),  # a constant number
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
