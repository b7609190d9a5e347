"""The ``bin/vllm-server`` launcher, rendered from a POSIX sh template.

sh rather than Python: it must find the bundle and set the library path *before* the bundled
interpreter starts, and ``exec`` it so installers' SIGTERM/SIGKILL reach vLLM directly.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from importlib import resources

from vllm_bundle.recipes import AttentionRule, ServerRule
from vllm_bundle.runtime import PACKAGE as RUNTIME_PACKAGE
from vllm_bundle.runtime.orphans import VARIABLE as ORPHANS_VARIABLE
from vllm_bundle.tree.scripts import fill, read_template
from vllm_bundle.tree.toolchain import WRAPPER

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


#: Runs the runtime's start-up hook in every process of the bundled python (a ``.pth`` import line).
RUNTIME_PTH = "vllm-bundle-runtime.pth"


def template_text() -> str:
    return read_template(TEMPLATE)


def runtime_files() -> dict[str, str]:
    """What the launcher relies on in the bundle's site-packages, by path relative to it: the runtime
    package (``vllm_bundle.runtime``, shipped as ``_vllm_bundle_runtime``) and the ``.pth`` line that
    arms :mod:`.runtime.orphans` at every interpreter start."""
    package = resources.files("vllm_bundle").joinpath("runtime")
    files = {
        f"{RUNTIME_PACKAGE}/{entry.name}": entry.read_text()
        for entry in sorted(package.iterdir(), key=lambda entry: entry.name)
        if entry.name.endswith(".py")
    }
    files[RUNTIME_PTH] = f"import {RUNTIME_PACKAGE}.orphans; {RUNTIME_PACKAGE}.orphans.arm()\n"
    return files


def render_launcher(
    *,
    python_minor: str,
    library_dirs: Sequence[str],
    attention: AttentionRule,
    vllm_version: str,
    target: str,
    server: ServerRule,
    vllm_build: str = "rocm",
    defaults: Mapping[str, str] | None = None,
) -> str:
    """``library_dirs`` are relative to site-packages (they become ``$site/...``);
    ``vllm_build`` is stated in the header (tier 0 reads it) and warned about when Python-only;
    ``defaults`` (launcher.toml) are set unless the caller's environment has them."""
    for name in library_dirs:
        if any(c in name for c in '"$`\\\n') or name.startswith("/"):
            raise ValueError(f"unsafe path for the launcher: {name!r}")
    values = {
        "@PYTHON_MINOR@": python_minor,
        "@LIBRARY_PATH@": ":".join(f"$site/{d}" for d in library_dirs),
        "@CC@": f"$root/{WRAPPER}",
        "@ATTENTION_MODE@": "flag" if attention.flag else "env",
        "@ATTENTION_FLAG@": shlex.quote(attention.flag or "--attention-backend"),
        "@ATTENTION_ENV@": attention.env or "VLLM_ATTENTION_BACKEND",
        "@ATTENTION_BACKEND@": shlex.quote(attention.backend),
        "@SERVER_COMMAND@": shlex.join(server.command),
        "@CALLER_CHOICE@": "|".join(f"{o}|{o}=*|{o}.*" for o in CALLER_CHOICE),
        "@RUNTIME@": RUNTIME_PACKAGE,
        "@ORPHANS_VARIABLE@": ORPHANS_VARIABLE,
        "@VLLM_VERSION@": vllm_version,
        "@TARGET@": target,
        "@VLLM_BUILD@": vllm_build,
        "@PYTHON_ONLY_WARNING@": PYTHON_ONLY_WARNING if vllm_build == PYTHON_ONLY else "",
        "@ENV_DEFAULTS@": "\n".join(
            f': "${{{name}={value}}}"\nexport {name}' for name, value in (defaults or {}).items()
        ),
    }
    return fill(template_text(), values)
