"""The sh scripts a bundle carries (``bin/vllm-server``, ``libexec/vllm-bundle/cc``), rendered from
templates/: one way to fill a template, and one way for a script to find the folder it is in."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources

#: How a script finds its own folder (``$here``), through symlinks to it and paths with spaces; the
#: templates say ``@SCRIPT_DIR@`` where it goes.
SCRIPT_DIR = """# This script's folder, through symlinks to it and paths with spaces.
self=$0
while [ -L "$self" ]; do
    link=$(readlink -- "$self")
    case $link in
        /*) self=$link ;;
        *) self=$(dirname -- "$self")/$link ;;
    esac
done
here=$(CDPATH= cd -- "$(dirname -- "$self")" && pwd -P)"""


def read_template(name: str) -> str:
    return resources.files("vllm_bundle").joinpath("templates", name).read_text()


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with ``@SCRIPT_DIR@`` and each ``@KEY@`` of ``values`` replaced."""
    text = template.replace("@SCRIPT_DIR@", SCRIPT_DIR)
    for key, value in values.items():
        text = text.replace(key, value)
    return text
