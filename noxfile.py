"""The verbs of the pipeline. Each session runs the `vllm-bundle` CLI (or pytest) in its own venv.

nox -s lock -- gfx1151 [--channel stable] [--check]   pin every input (needs upstream reachable)
nox -s fetch -- gfx1151 [--mirror URL|DIR] [--offline] download the locked inputs into the cache
nox -s image -- gfx1151 [--push REGISTRY/REPO]         the bundle as an OCI image (build/<target>/image)
nox -s tests                                           the test suite (plays upstream on 127.0.0.1)
nox -s lint                                            ruff + mypy
nox -s bench                                           performance against today's tools, printed (not asserted)
"""

from __future__ import annotations

import os
import shutil

import nox

nox.needs_version = ">=2024.10.9"
nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests"]


def _install(session: nox.Session, *groups: str, silent: bool = False) -> None:
    """The project (editable, with its build extra) and the given dependency groups, exactly as
    uv.lock pins them: the tool's own environment is locked like every bundle input. ``silent``: uv's
    output only on failure (a session whose stdout a workflow reads)."""
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--extra=build",
        "--no-default-groups",
        *(f"--group={group}" for group in groups),
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        external=True,
        silent=silent,
    )


def _cli(session: nox.Session, verb: str) -> None:
    _install(session)
    session.run("vllm-bundle", verb, *session.posargs, external=False)


@nox.session
def lock(session: nox.Session) -> None:
    """Pin every input of a target: `nox -s lock -- gfx1151 [--channel nightly]`, or `-- --check`."""
    _cli(session, "lock")


@nox.session
def targets(session: nox.Session) -> None:
    """The recipes' targets, or `-- --channels`; `-- --json` for a workflow's matrix (stdout holds the
    list alone: the workflows read it)."""
    _install(session, silent=True)
    session.run("vllm-bundle", "targets", *session.posargs, external=False)


@nox.session
def probe(session: nox.Session) -> None:
    """Check tests/upstream/facts.toml (what the fake upstream is built from) against a channel's real hosts."""
    _cli(session, "probe")


@nox.session
def fetch(session: nox.Session) -> None:
    """Download a target's locked inputs into the verified cache: `nox -s fetch -- gfx1151`."""
    _cli(session, "fetch")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite, in three workers (pytest-xdist; the suite mostly waits on servers and child
    processes, so three keep two cores busy); each test module stays in one worker, which makes its
    module-scoped builds once. Extra arguments go to pytest: `-- -m "not slow"` is the quick tier,
    `-- -n 0` runs in one process."""
    _install(session, "test")
    # Bytecode is written (beside the sources, as on a CI runner): with $PYTHONDONTWRITEBYTECODE set, each of
    # the suite's hundreds of `vllm-bundle` processes compiled its ~400 modules anew, 1.6 s each, which
    # made the suite twice as slow as on a machine without it. (The pipeline passes -B or sets the variable
    # itself where a Python runs in a finished stage.)
    env = {"PYTHONDONTWRITEBYTECODE": None}
    session.run("pytest", "--numprocesses=3", "--dist=loadscope", *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format) and mypy --strict over the package, the tests, the bench and this file."""
    _install(session, "lint", "test")  # mypy reads the tests' imports too
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


#: What the bench compares against, from Debian: pigz and curl (the tools people script today), and the
#: compiler the fixture's ROCm build and the real-size tree's libraries use.
BENCH_PACKAGES = {"pigz": "pigz", "curl": "curl", "clang-19": "clang-19", "ld.lld-19": "lld-19"}


@nox.session
def bench(session: nox.Session) -> None:
    """Prints performance ratios against the tools people use today, measured in one run:
    `nox -s bench -- [--only network|bundle|real-size] [--tree-gib 8] [--work DIR]`."""
    missing = sorted({package for tool, package in BENCH_PACKAGES.items() if not shutil.which(tool)})
    if missing:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        session.run(*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, external=True)
    _install(session, "test")
    session.run("python", "-m", "bench", *session.posargs)


@nox.session
def image(session: nox.Session) -> None:
    """The bundle, then its OCI image on the locked base: `nox -s image -- gfx1151 [--push ghcr.io/OWNER/REPO]`."""
    _cli(session, "image")


@nox.session
def patch(session: nox.Session) -> None:
    """Extract vLLM's source release into build/ and apply patches/vllm: `nox -s patch -- gfx1151 [--vllm X]`."""
    _cli(session, "patch")


@nox.session
def bundle(session: nox.Session) -> None:
    """Build the relocatable bundle of a target: `nox -s bundle -- gfx1151 [--channel C] [--mirror M]`."""
    _cli(session, "bundle")


@nox.session(name="verify-repro")
def verify_repro(session: nox.Session) -> None:
    """Build twice (other directories, umask, time zone, clock) and compare every asset byte by byte."""
    _cli(session, "verify-repro")


@nox.session
def qualify(session: nox.Session) -> None:
    """Tier 0 checks of a bundle tree, archive or parts directory: `nox -s qualify -- build/gfx1151/root`."""
    _cli(session, "qualify")


@nox.session
def install(session: nox.Session) -> None:
    """Install a release: `nox -s install -- <release URL | dir | backend_versions.json> [--target auto]`."""
    _cli(session, "install")


@nox.session(name="qualify-gpu")
def qualify_gpu(session: nox.Session) -> None:
    """Tier 1/2 on a GPU runner: `nox -s qualify-gpu -- bundles/<tag> --model <dir> --release-dir bundles/<tag>`."""
    _cli(session, "qualify-gpu")
