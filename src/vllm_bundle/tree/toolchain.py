"""The bundle's C toolchain: ``libexec/vllm-bundle/cc``, the one-word ``CC`` Triton runs at first GPU use.

Triton's AMD backend compiles ``driver.c`` into ``hip_utils`` (Triton <= 3.6 also a per-signature
launcher) with ``[$CC, src, -O3, -shared, -fPIC, -Wno-psabi, -o, so, -I...]``
(triton-lang/triton python/triton/runtime/build.py ``_build``): that needs libc headers, crt objects
and a linker, which UBI minimal and many hosts lack. The bundle carries PyPI's ziglang (components.toml
``[toolchain]``, installed like every locked wheel) and this sh wrapper around its ``zig cc``: ``CC``
must be one executable path, zig needs a writable cache directory, and ``-target`` pins the glibc the
bundle's wheels were resolved for.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from vllm_bundle.recipes import PythonRecipe
from vllm_bundle.tree.scripts import fill, read_template

#: The wrapper, relative to the bundle root: not under bin/, so that a bin/ put on PATH shadows no
#: host ``cc``.
WRAPPER = "libexec/vllm-bundle/cc"
#: zig in the ziglang wheel, relative to site-packages.
ZIG = "ziglang/zig"
TEMPLATE = "cc.sh"
#: The line of the rendered wrapper that names zig (tier 0 reads it back).
ZIG_LINE = re.compile(r'^zig="\$root/(?P<path>[^"]+)"$', re.MULTILINE)
#: The line that runs it, and the target it compiles for.
TARGET_LINE = re.compile(r'^exec "\$zig" cc -target (?P<target>\S+) "\$@"$', re.MULTILINE)


def wrapper_template() -> str:
    return read_template(TEMPLATE)


def zig_target(python: PythonRecipe) -> str:
    """zig's target triple for the bundle: its CPU, Linux, glibc at the manylinux floor of its wheels
    (``x86_64-manylinux_2_35`` -> ``x86_64-linux-gnu.2.35``): what the compiled module links against then
    exists on every host the bundle's own wheels load on."""
    return f"{python.arch}-linux-gnu.{python.glibc}"


def render_wrapper(python_minor: str, target: str) -> str:
    values = {"@PYTHON_MINOR@": python_minor, "@ZIG@": ZIG, "@ZIG_TARGET@": target}
    return fill(wrapper_template(), values)


def write_wrapper(root: Path, text: str) -> Path:
    path = root / WRAPPER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def named_zig(root: Path) -> str | None:
    """The zig the bundle's wrapper runs, relative to the bundle root (None when it names none)."""
    found = ZIG_LINE.search((root / WRAPPER).read_text(errors="replace"))
    return found["path"] if found else None


def named_target(root: Path) -> str | None:
    """The target the bundle's wrapper compiles for (None when it names none)."""
    found = TARGET_LINE.search((root / WRAPPER).read_text(errors="replace"))
    return found["target"] if found else None


def toolchain_problems(root: Path) -> list[str]:
    """What keeps ``CC`` from working in the bundle at ``root``: the wrapper missing or not executable,
    the zig it names missing or not executable, or no glibc target given."""
    wrapper = root / WRAPPER
    if not wrapper.is_file():
        return [f"{WRAPPER} (the CC Triton runs) is missing"]
    problems = [] if os.access(wrapper, os.X_OK) else [f"{WRAPPER} is not executable"]
    zig = named_zig(root)
    if zig is None:
        problems.append(f"{WRAPPER} names no zig")
    elif not (root / zig).is_file() or not os.access(root / zig, os.X_OK):
        problems.append(f"{zig}, which {WRAPPER} runs, is missing or not executable (the [toolchain] wheel)")
    if named_target(root) is None:  # zig would build for this host's glibc, not the bundle's floor
        problems.append(f"{WRAPPER} runs zig cc without -target")
    return problems
