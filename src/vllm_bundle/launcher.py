"""The ``bin/vllm-server`` launcher, rendered from a POSIX sh template.

sh rather than Python: it must find the bundle and set the library path *before* the bundled
interpreter starts, and ``exec`` it so installers' SIGTERM/SIGKILL reach vLLM directly.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from importlib import resources

from vllm_bundle.recipes import AttentionRule, ServerRule

TEMPLATE = "vllm-server.sh"
#: Options by which a caller chooses the attention backend itself (then no default is added):
#: --attention-backend, and vLLM's --attention-config / -ac (JSON, key=value or dotted forms).
CALLER_CHOICE = ("--attention-config", "-ac")
#: What the launcher says of a vLLM built without its native code (only ever on request); tier 0 reads
#: the header line ``# vLLM build: <kind>``.
PYTHON_ONLY = "python-only"
BUILD_HEADER = "# vLLM build: "
PYTHON_ONLY_WARNING = (
    "echo \"vllm-server: this bundle's vLLM was built Python-only on request (--python-only-vllm):"
    ' it has no GPU kernels of its own" >&2'
)


def template_text() -> str:
    return resources.files("vllm_bundle").joinpath("templates", TEMPLATE).read_text()


def render_launcher(
    *,
    python_minor: str,
    library_dirs: Sequence[str],
    clang: str,
    attention: AttentionRule,
    vllm_version: str,
    target: str,
    server: ServerRule,
    vllm_build: str = "rocm",
    defaults: Mapping[str, str] | None = None,
) -> str:
    """``library_dirs`` and ``clang`` are relative to site-packages (they become ``$site/...``);
    ``vllm_build`` is stated in the header (tier 0 reads it) and warned about when Python-only;
    ``defaults`` (launcher.toml) are set unless the caller's environment has them."""
    for name in (*library_dirs, clang):
        if any(c in name for c in '"$`\\\n') or name.startswith("/"):
            raise ValueError(f"unsafe path for the launcher: {name!r}")
    values = {
        "@PYTHON_MINOR@": python_minor,
        "@LIBRARY_PATH@": ":".join(f"$site/{d}" for d in library_dirs),
        "@CC@": f"$site/{clang}",
        "@ATTENTION_MODE@": "flag" if attention.flag else "env",
        "@ATTENTION_FLAG@": shlex.quote(attention.flag or "--attention-backend"),
        "@ATTENTION_ENV@": attention.env or "VLLM_ATTENTION_BACKEND",
        "@ATTENTION_BACKEND@": shlex.quote(attention.backend),
        "@SERVER_COMMAND@": shlex.join(server.command),
        "@CALLER_CHOICE@": "|".join(f"{o}|{o}=*|{o}.*" for o in CALLER_CHOICE),
        "@VLLM_VERSION@": vllm_version,
        "@TARGET@": target,
        "@VLLM_BUILD@": vllm_build,
        "@PYTHON_ONLY_WARNING@": PYTHON_ONLY_WARNING if vllm_build == PYTHON_ONLY else "",
        "@ENV_DEFAULTS@": "\n".join(
            f': "${{{name}={value}}}"\nexport {name}' for name, value in (defaults or {}).items()
        ),
    }
    text = template_text()
    for key, value in values.items():
        text = text.replace(key, value)
    return text
