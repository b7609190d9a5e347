"""The launcher: defaults (Triton attention by vLLM version), environment, arguments, exec."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from vllm_bundle.recipes import load_recipes
from vllm_bundle.runtime import PACKAGE as RUNTIME_PACKAGE
from vllm_bundle.runtime.amdgpu import HOST_ROOT_VARIABLE
from vllm_bundle.tree.launcher import render_launcher, runtime_files
from vllm_bundle.tree.toolchain import WRAPPER

RECIPES = load_recipes(REPO / "recipes")
LIBS = ["_rocm_sdk_core/lib", "_rocm_sdk_libraries/lib", "torch/lib"]
# Stands in for the bundled interpreter: reports what it was started with.
STAND_IN = """#!/bin/sh
exec "{python}" -c '
import json, os, sys
keys = ["LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONNOUSERSITE", "FLASH_ATTENTION_TRITON_AMD_ENABLE", "CC",
        "VLLM_ATTENTION_BACKEND", "ROCPROFILER_QUEUE_INTERPOSITION", "HIP_FORCE_DEV_KERNARG", "HSA_NO_SCRATCH_RECLAIM"]
print(json.dumps({{"argv": sys.argv[1:], "pid": os.getpid(), "env": {{k: os.environ.get(k) for k in keys}}}}))
' "$@"
"""


def write_launcher(root: Path, vllm_version: str, minor: str = "3.12") -> Path:
    """``bin/vllm-server`` of a gfx1151 bundle of ``vllm_version`` whose python is ``python{minor}``."""
    launcher = root / "bin" / "vllm-server"
    launcher.write_text(
        render_launcher(
            python_minor=minor,
            library_dirs=LIBS,
            attention=RECIPES.vllm.attention_rule(vllm_version),
            vllm_version=vllm_version,
            target="gfx1151",
            server=RECIPES.vllm.server_rule(vllm_version),
            defaults=RECIPES.launcher_defaults,
        )
    )
    launcher.chmod(0o755)
    return launcher


def make_root(root: Path, vllm_version: str) -> Path:
    (root / "bin").mkdir(parents=True)
    site = root / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    launcher = write_launcher(root, vllm_version)
    python = root / "bin" / "python3.12"
    python.write_text(STAND_IN.format(python=sys.executable))
    python.chmod(0o755)
    return launcher


def start(launcher: Path, *args: str, env: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    """Run the launcher with an empty environment (plus ``env``), as `env -i` would."""
    proc = subprocess.Popen([str(launcher), *args], env=env or {}, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    report: dict = json.loads(out)  # type: ignore[type-arg]
    assert report["pid"] == proc.pid, "the launcher exec's python (signals reach vLLM directly)"
    return report


SERVER_ARGS = [
    "--model",
    "/models/Qwen 3",
    "--port",
    "8001",
    "--host",
    "127.0.0.1",
    "--served-model-name",
    'it\'s "quoted" $HOME *',
    "--max-model-len",
    "4096",
    "--enable-prefix-caching",
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "a path with spaces" / "bundle"


def test_launcher_is_valid_posix_sh(root: Path) -> None:
    launcher = make_root(root, "0.33.0")
    subprocess.run(["sh", "-n", str(launcher)], check=True)


def test_defaults_and_arguments_with_an_empty_environment(root: Path) -> None:
    report = start(make_root(root, "0.33.0"), *SERVER_ARGS)
    module_args = report["argv"]
    assert module_args == [
        "-P",
        *("-m", "vllm.entrypoints.cli.main", "serve"),  # the deprecated api_server module is not used
        *SERVER_ARGS,
        "--attention-backend",
        "TRITON_ATTN",
    ]
    env = report["env"]
    site = root.resolve() / "lib" / "python3.12" / "site-packages"
    assert env["LD_LIBRARY_PATH"] == ":".join(str(site / d) for d in LIBS)
    assert env["PYTHONNOUSERSITE"] == "1"
    assert env["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "TRUE"
    assert env["CC"] == str(root.resolve() / WRAPPER), "the bundle's C compiler wrapper (zig cc)"
    assert env["PYTHONPATH"] is None
    assert env["VLLM_ATTENTION_BACKEND"] is None, "0.33 ignores the variable; the flag is used"
    assert env["ROCPROFILER_QUEUE_INTERPOSITION"] == "0", "torch 2.12 can hang at HSA teardown without it"
    assert env["HIP_FORCE_DEV_KERNARG"] == "1" and env["HSA_NO_SCRATCH_RECLAIM"] == "1"


def test_a_callers_own_values_win_over_the_defaults(root: Path) -> None:
    env = {"ROCPROFILER_QUEUE_INTERPOSITION": "1", "HIP_FORCE_DEV_KERNARG": ""}
    report = start(make_root(root, "0.33.0"), env=env)
    assert report["env"]["ROCPROFILER_QUEUE_INTERPOSITION"] == "1"
    assert report["env"]["HIP_FORCE_DEV_KERNARG"] == "", "even an empty value is the caller's choice"
    assert report["env"]["HSA_NO_SCRATCH_RECLAIM"] == "1"


@pytest.mark.parametrize(
    "choice",
    [
        ["--attention-backend", "ROCM_ATTN"],
        ["--attention-backend=ROCM_ATTN"],
        ["--attention-config", '{"backend": "ROCM_ATTN"}'],
        ['--attention-config={"backend": "ROCM_ATTN"}'],
        ["--attention-config.backend=ROCM_ATTN"],
        ["-ac", '{"backend": "ROCM_ATTN"}'],
        ["-ac.backend=ROCM_ATTN"],
    ],
)
def test_caller_choice_of_backend_wins(root: Path, choice: list[str]) -> None:
    report = start(make_root(root, "0.33.0"), "--model", "m", *choice)
    assert report["argv"][4:] == ["--model", "m", *choice], "no second backend choice added"


@pytest.mark.parametrize(("version", "command"), [("0.28.0", ["-m", "vllm.entrypoints.openai.api_server"])])
def test_releases_before_the_deprecation_use_the_api_server_module(
    root: Path, version: str, command: list[str]
) -> None:
    report = start(make_root(root, version), "--model", "m")
    assert report["argv"][1:3] == command


@pytest.mark.parametrize(("version", "backend"), [("0.11.0", "TRITON_ATTN"), ("0.10.2", "TRITON_ATTN_VLLM_V1")])
def test_old_versions_get_the_environment_variable(root: Path, version: str, backend: str) -> None:
    launcher = make_root(root, version)
    report = start(launcher, "--model", "m")
    assert report["argv"][3:] == ["--model", "m"], "no flag that this vLLM would reject"
    assert report["env"]["VLLM_ATTENTION_BACKEND"] == backend
    chosen = start(launcher, "--model", "m", env={"VLLM_ATTENTION_BACKEND": "ROCM_FLASH"})
    assert chosen["env"]["VLLM_ATTENTION_BACKEND"] == "ROCM_FLASH"


def test_callers_paths_are_kept_after_ours(root: Path) -> None:
    report = start(
        make_root(root, "0.33.0"), env={"PYTHONPATH": "/lemonade/shim:/other", "LD_LIBRARY_PATH": "/caller/lib"}
    )
    assert report["env"]["PYTHONPATH"] == "/lemonade/shim:/other", "the installer's shim stays first"
    assert report["env"]["LD_LIBRARY_PATH"].endswith(":/caller/lib")
    assert report["env"]["LD_LIBRARY_PATH"].startswith(str(root.resolve()))


def test_started_through_a_symlink_elsewhere(root: Path, tmp_path: Path) -> None:
    launcher = make_root(root, "0.33.0")
    link_dir = tmp_path / "links dir"
    link_dir.mkdir()
    (link_dir / "vllm-server").symlink_to(launcher)
    report = start(link_dir / "vllm-server", "--port", "1")
    assert report["env"]["CC"].startswith(str(root.resolve()))


def test_unsafe_library_dir_is_refused() -> None:
    with pytest.raises(ValueError, match="unsafe"):
        render_launcher(
            python_minor="3.12",
            library_dirs=['x"; rm -rf /; "'],
            attention=RECIPES.vllm.attention_rule(),
            vllm_version="0.33.0",
            target="gfx1151",
            server=RECIPES.vllm.server_rule(),
        )


# -- a caller's `--` (issue #32) -------------------------------------------------------------------------

# Stands in for the bundled interpreter, but runs the bundle's real GPU-memory chooser (the runtime
# package, as the bundle ships it, on the fixture host's sysfs) and reports the server's arguments.
# The chooser runs isolated (-I), so the bundle's site-packages, which a real bundled python has on its
# path, is put there by hand.
CHOOSING_STAND_IN = """#!/bin/sh
if [ "$1" = -I ] && [ "$2" = -B ] && [ "$3" = -m ] && [ "$4" = {runtime}.gpu_memory ]; then
    shift 4
    exec "{python}" -I -B -c 'import runpy, sys; sys.path.insert(0, "{site}"); runpy.run_module(
    "{runtime}.gpu_memory", run_name="__main__", alter_sys=True)' "$@"
fi
exec "{python}" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
"""
HOSTS = Path(__file__).parent / "data" / "hosts"
SERVE = ["-P", "-m", "vllm.entrypoints.cli.main", "serve"]
OURS = ["--attention-backend", "TRITON_ATTN", "--gpu-memory-utilization", "0.74"]


def choosing_root(root: Path) -> Path:
    launcher = make_root(root, "0.33.0")
    site = root / "lib" / "python3.12" / "site-packages"
    for name, text in runtime_files().items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    python = root / "bin" / "python3.12"
    python.write_text(CHOOSING_STAND_IN.format(runtime=RUNTIME_PACKAGE, site=site, python=sys.executable))
    return launcher


def served(launcher: Path, *args: str, shell: str | None = None, timeout: float | None = 60) -> list[str]:
    """The arguments the server command gets, on a Strix Halo whose GPU takes 0.74; run by ``shell``
    when given, else by the launcher's own ``#!/bin/sh``."""
    env = {"PATH": "/usr/bin:/bin", HOST_ROOT_VARIABLE: str(HOSTS / "strix-halo"), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [*([shell] if shell else []), str(launcher), *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, result.stderr
    argv: list[str] = json.loads(result.stdout)
    return argv


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (["model"], ["--foo"]),
        (["model", "--port", "8001"], ["--foo", "--", "bar"]),  # only the first -- ends the options
        (["model", "", "a b"], ["", "*", "$HOME", "--attention-backend=X"]),  # words kept as given
        ([], ["model"]),
    ],
)
def test_the_launchers_options_go_before_a_callers_double_dash(root: Path, before: list[str], after: list[str]) -> None:
    """After `--` vLLM's parser takes every word as a positional argument: the options the launcher adds
    must come before the caller's `--`, and what follows it reach vLLM unchanged."""
    launcher = choosing_root(root)
    assert served(launcher, *before, "--", *after) == [*SERVE, *before, *OURS, "--", *after]
    assert served(launcher, *before) == [*SERVE, *before, *OURS], "without --, still added at the end"


def test_words_after_a_callers_double_dash_choose_nothing(root: Path) -> None:
    """The launcher's scans of the caller's options (a backend or a memory budget chosen) stop at `--`:
    what follows is a positional argument to vLLM, not a choice."""
    launcher = choosing_root(root)
    after = ["--attention-backend", "ROCM_ATTN", "-ac", "{}", "--gpu-memory-utilization", "0.5", "--config", "c"]
    assert served(launcher, "model", "--", *after) == [*SERVE, "model", *OURS, "--", *after]
    chosen = ["--attention-backend", "ROCM_ATTN", "--gpu-memory-utilization", "0.5"]
    assert served(launcher, "model", *chosen, "--", "x") == [*SERVE, "model", *chosen, "--", "x"]


# -- many arguments (issue #51, F5) ----------------------------------------------------------------------

# Words a caller may pass that a shell could mangle: each must reach vLLM as given, none expanded.
HOSTILE = [
    "",
    "a b",
    "line\nbreak",
    "*",
    "$HOME",
    "${1}",
    "$(echo no)",
    "`echo no`",
    "-x",
    "--port=1",
    'it\'s "q"',
    "\\",
]
SHELLS = [
    pytest.param(shell, marks=pytest.mark.skipif(shutil.which(shell) is None, reason=f"no {shell}"))
    for shell in ("dash", "bash")
]


@pytest.mark.timeout(120)  # the quadratic launcher (E9) took minutes here; a linear one well under a second
@pytest.mark.parametrize("shell", SHELLS)
def test_fifty_thousand_arguments_pass_through_in_order(root: Path, shell: str) -> None:
    """The launcher places its options among the caller's arguments in time linear in their number, and
    keeps every one as given, in order: /bin/sh is dash on Debian and bash on Fedora, so both."""
    words = [HOSTILE[i % len(HOSTILE)] if i % 2 else f"w{i}" for i in range(50_000)]
    before, after = words[:25_000], [*words[25_000:30_000], "--", *words[30_000:-1]]  # only the first -- ends them
    assert served(choosing_root(root), *before, "--", *after, shell=shell, timeout=None) == [
        *SERVE,
        *before,
        *OURS,
        "--",
        *after,
    ]


@pytest.mark.parametrize("shell", SHELLS)
def test_hostile_words_are_kept_by_either_shell(root: Path, shell: str) -> None:
    launcher = choosing_root(root)
    assert served(launcher, "model", *HOSTILE, shell=shell) == [*SERVE, "model", *HOSTILE, *OURS]
    both = [*SERVE, "model", *HOSTILE, *OURS, "--", *HOSTILE, "--", ""]
    assert served(launcher, "model", *HOSTILE, "--", *HOSTILE, "--", "", shell=shell) == both
    assert served(launcher, shell=shell) == [*SERVE, *OURS], "no arguments: only ours"


#: A Lemonade-style shim (lemonade-sdk/lemonade launches vLLM with PYTHONPATH=<its shim dir>, whose
#: sitecustomize.py imports vllm.utils.import_utils): here it records each interpreter that runs it.
SHIM = """import os, sys
with open(os.environ["SHIM_LOG"], "a") as log:
    log.write(" ".join(sys.orig_argv[1:3]) + "\\n")
"""
#: Stands in for vLLM's CLI module in the bundle's site-packages: what it was started with.
VLLM_MAIN = "import json, sys; print(json.dumps({'argv': sys.argv[1:]}))\n"


def test_a_callers_site_hook_runs_in_vllm_only_not_in_the_launchers_helper(tmp_path: Path) -> None:
    """The launcher's GPU-memory helper runs isolated (``-I``): the caller's PYTHONPATH and its
    sitecustomize reach vLLM, and vLLM only. With ``-P`` alone the shim ran twice per launch (once in the
    helper: with a real shim, one more import of torch and vLLM before vLLM starts). The bundle's python
    is a real interpreter here (a venv: lib/python3.X/site-packages is its own), the runtime is the one
    the bundle ships."""
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    root = tmp_path / "bundle"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = root / "lib" / f"python{minor}" / "site-packages"
    for name, text in runtime_files().items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    cli = site / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for package in (site / "vllm", site / "vllm" / "entrypoints", cli):
        (package / "__init__.py").write_text("")
    (cli / "main.py").write_text(VLLM_MAIN)
    launcher = write_launcher(root, "0.33.0", minor)
    shim = tmp_path / "lemonade-shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    log = tmp_path / "shim.log"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(shim), "SHIM_LOG": str(log), HOST_ROOT_VARIABLE: str(tmp_path)}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # as the caller asks, so that only the helper could write any
    result = subprocess.run([str(launcher), "--model", "m"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["argv"][:2] == ["serve", "--model"]
    assert log.read_text().splitlines() == ["-P -m"], "run once per launch, by vLLM's process only"
    written = sorted(str(p.relative_to(root)) for p in root.rglob("__pycache__"))
    assert written == [], f"the helper wrote bytecode into the bundle (-I ignores PYTHONDONTWRITEBYTECODE): {written}"
