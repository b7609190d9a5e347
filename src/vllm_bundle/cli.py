"""Command line: ``vllm-bundle <verb>``; the nox sessions call these verbs. This module only parses the
command line and dispatches each verb to one function (pipeline/verbs.py, qualify/ and install/ commands).

Every user-caused error ends in one line on stderr, ``error: <what> (<how to fix>)``, and a non-zero
exit; only bugs in this tool show a traceback.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from vllm_bundle import __version__
from vllm_bundle.errors import DEBUG_ENV, BundleError, DiskFullError, UsageError
from vllm_bundle.manifests import DEFAULT_LEVEL, DEFAULT_PART_SIZE, REPO_ENV
from vllm_bundle.paths import CACHE_ENV, default_cache_dir, default_patches, default_recipes
from vllm_bundle.util.ci import GitHubActions
from vllm_bundle.util.fsutil import is_disk_full
from vllm_bundle.util.policy import PAGE_DEADLINE, PAGE_LIMIT, RetryPolicy

DEFAULT_CHANNEL = "stable"
VERIFY_CACHE_ENV = "VLLM_BUNDLE_VERIFY_CACHE"


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad option reported as every other user error is: one line, ``error: <what>
    (<how to fix>)``, exit 2 (argparse's own code), no usage dump above it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {_one_line(message)} (see `{self.prog} --help`)\n")


def _whole_number(lowest: int, highest: int | None = None, unit: str = "") -> Callable[[str], int]:
    """An argparse ``type``: a whole number in [lowest, highest]; argparse names the option."""
    upper = f" and at most {highest}" if highest is not None else ""
    wanted = f"a whole number{unit} of at least {lowest}{upper}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
        if value < lowest or (highest is not None and value > highest):
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
        return value

    return parse


#: A socket timeout beyond this overflows the platform's time_t on some systems; a day is plenty.
MAX_SECONDS = 86400.0


def _seconds(text: str) -> float:
    """An argparse ``type``: a number of seconds above 0 (and at most a day)."""
    wanted = f"a number of seconds above 0 and at most {MAX_SECONDS:.0f}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
    return value


def _fraction(text: str) -> float:
    """An argparse ``type``: a fraction above 0 and at most 1 (vLLM's bounds for --gpu-memory-utilization)."""
    wanted = "a number above 0 and at most 1"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
    if not math.isfinite(value) or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
    return value


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(path.anchor or ".")


def _why_not_writable(path: Path) -> str:
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "permission denied"


def check_work_dir(path: Path, option: str) -> None:
    """A directory this run writes into (``--cache-dir``, ``--build-dir``, ``--bundles-dir``) is one or can
    be made, and is writable: checked before any stage, without creating it (a refused run leaves nothing); a
    :class:`UsageError` (exit 2) otherwise, as every bad option value."""
    if option.startswith("--"):
        hint = f"pass {option} a directory you can write to"
    else:
        hint = f"set ${CACHE_ENV} or pass --cache-dir: a directory you can write to"
    shown = f"{option} {path}"
    absolute = path.absolute()
    if absolute.is_dir():
        if not os.access(absolute, os.W_OK | os.X_OK):
            raise UsageError(f"{shown} is not writable: {_why_not_writable(absolute)}", hint)
        return
    if os.path.lexists(absolute):
        what = "a broken symbolic link" if not absolute.exists() else "not a directory"
        raise UsageError(f"{shown} is {what}", hint)
    ancestor = _nearest_existing(absolute.parent)
    if not ancestor.is_dir():
        raise UsageError(f"{shown} cannot be made: {ancestor} is a file", hint)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        why = _why_not_writable(ancestor)
        where = "is on a read-only file system" if why == "read-only file system" else "is not writable"
        raise UsageError(f"{shown} cannot be made: {ancestor} {where}", hint)


def _check_work_dirs(args: argparse.Namespace) -> None:
    """Every directory the verb will write into, before it starts."""
    if getattr(args, "build_dir", None) is not None:
        check_work_dir(args.build_dir, "--build-dir")
    if getattr(args, "bundles_dir", None) is not None and not args.no_archive:
        check_work_dir(args.bundles_dir, "--bundles-dir")
    if hasattr(args, "cache_dir") and not (args.verb == "lock" and args.check):
        if args.cache_dir is not None:
            check_work_dir(args.cache_dir, "--cache-dir")
        elif os.environ.get(CACHE_ENV):
            check_work_dir(default_cache_dir(), f"${CACHE_ENV}")
        else:
            check_work_dir(default_cache_dir(), "the download cache")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Help with each option's default shown (when it has one worth showing) and the epilog's examples
    kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default in (None, False, [], argparse.SUPPRESS) or "%(default)" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


@functools.cache
def _targets_line() -> str:
    """The valid targets, for the target argument's help (read from the packaged recipes, once: nine
    verbs show them)."""
    from vllm_bundle.recipes import load_targets

    try:
        return ", ".join(load_targets(default_recipes()))
    except BundleError:
        return "a target of the recipes (recipes/targets.toml)"


def _target_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help=f"one of: {_targets_line()}")


def _download_options(parser: argparse.ArgumentParser) -> None:
    """How downloads go: the cache, parallelism, retries, progress. Every verb that downloads has them."""
    group = parser.add_argument_group("downloads")
    group.add_argument(
        "--cache-dir", type=Path, default=None, help=f"download cache (${CACHE_ENV}, else {default_cache_dir()})"
    )
    group.add_argument(
        "--jobs", "-j", type=_whole_number(1, 64), default=min(8, (os.cpu_count() or 2) * 2), help="parallel downloads"
    )
    group.add_argument(
        "--retries",
        type=_whole_number(1, 100),
        default=RetryPolicy.attempts,
        help="attempts per request and per interrupted body",
    )
    _read_timeout_option(group, "seconds a stalled download may stay silent before it is resumed")
    group.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")


def _read_timeout_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    parser.add_argument("--read-timeout", type=_seconds, default=RetryPolicy.read_timeout, help=what)


def _recipes_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, shown: bool = True) -> None:
    default = default_recipes()
    parser.add_argument(
        "--recipes", type=Path, default=default, help="recipes directory" if shown else argparse.SUPPRESS
    )


def _common(parser: argparse.ArgumentParser) -> None:
    """The recipes, locks and channel a build verb reads, and how it downloads."""
    group = parser.add_argument_group("recipes and locks")
    _recipes_option(group)
    group.add_argument("--locks", type=Path, default=None, help="locks directory (<recipes>/locks)")
    group.add_argument("--channel", default=DEFAULT_CHANNEL, help="release channel")
    group.add_argument(
        "--verify-cache",
        action="store_true",
        default=_switched_on(VERIFY_CACHE_ENV),
        help=f"re-hash cached files before use, for a cache restored from elsewhere (${VERIFY_CACHE_ENV}=1)",
    )
    _download_options(parser)


def _index_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, when: str = "") -> None:
    parser.add_argument("--therock-index", help=f"TheRock's index instead of the channel's{when}; {{family}} allowed")
    parser.add_argument("--pypi-index", help=f"a PEP 503 index instead of PyPI{when}")


def _mirror_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str = "") -> None:
    parser.add_argument(
        "--mirror", metavar="URL|DIR", help=what or "a URL or directory serving the same file names as upstream"
    )


def _build_options(parser: argparse.ArgumentParser) -> None:
    """``patch`` and ``vllm-wheel``: one stage of the pipeline, run by itself."""
    _target_argument(parser)
    parser.add_argument("--vllm", metavar="VERSION", help="use this vLLM source release instead of the locked one")
    parser.add_argument("--pypi-index", help="package index for --vllm (default: the channel's PyPI index)")
    parser.add_argument("--build-dir", type=Path, default=Path("build"), help="work directory")
    parser.add_argument("--patches", type=Path, default=default_patches(), help="patch series")
    parser.add_argument("--force", action="store_true", help="redo the stage even when its inputs are unchanged")
    parser.add_argument("--offline", action="store_true", help="use the download cache only")
    _mirror_option(parser)


def _bundle_options(parser: argparse.ArgumentParser) -> None:
    """Options of ``bundle`` and ``image`` (the same pipeline; ``image`` adds the image stage), in groups."""
    _target_argument(parser)
    build = parser.add_argument_group("the build")
    build.add_argument("--build-dir", type=Path, default=Path("build"), help="work directory")
    build.add_argument("--patches", type=Path, default=default_patches(), help="patch series")
    build.add_argument(
        "--force",
        dest="force_stage",
        action="append",
        default=[],
        metavar="STAGE",
        # The stages are pipeline/build.py's table, which this module (the consumer side too) does not
        # import: an unknown name is refused with the list.
        help="redo this stage even if its inputs are unchanged (the stages: docs/building.md)",
    )
    build.add_argument(
        "--python-only-vllm",
        action="store_true",
        help="build vLLM without its native code (no GPU kernels; recorded in the launcher and release.json)",
    )
    build.add_argument("--warn-only", action="store_true", help="archive even when tier 0 qualification fails")
    build.add_argument(
        "--no-builder",
        action="store_true",
        help="compile vLLM on this machine, not in the pinned builder image (recipes/builder.toml); recorded in "
        "release.json, and tier 0 holds what it compiles to the bundle's glibc floor",
    )
    inputs = parser.add_argument_group("inputs")
    inputs.add_argument(
        "--locked",
        action="store_true",
        help="refuse a missing or out-of-date lock instead of locking first (release builds)",
    )
    inputs.add_argument("--offline", action="store_true", help="use the download cache only")
    _mirror_option(inputs)
    _index_options(inputs, " (when locking first)")
    release = parser.add_argument_group("release assets")
    release.add_argument("--bundles-dir", type=Path, default=Path("bundles"), help="where the release assets go")
    release.add_argument("--repo", help=f"GitHub owner/name the assets are published in (${REPO_ENV})")
    release.add_argument(
        "--part-size", type=_whole_number(1, unit=" of bytes"), default=DEFAULT_PART_SIZE, help="largest part, in bytes"
    )
    release.add_argument(
        "--level", type=int, default=DEFAULT_LEVEL, choices=range(1, 10), metavar="1-9", help="gzip level"
    )
    release.add_argument("--no-archive", action="store_true", help="stop at the bundle tree (no release assets)")
    image = parser.add_argument_group("OCI image")
    image.add_argument("--image", action="store_true", help="also build the OCI image (build/<target>/image)")
    image.add_argument("--push", metavar="REGISTRY/REPO", help="push the image there, tagged with the release tag")
    _registry_mirror_option(inputs)
    _common(parser)


def _host_root_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host-root",
        type=Path,
        metavar="DIR",
        help="read sys/, proc/ and dev/ under DIR instead of / (a captured host tree; $VLLM_BUNDLE_HOST_ROOT)",
    )


def _registry_mirror_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--registry-mirror",
        metavar="HOST[:PORT]|URL",
        help="a registry serving the repositories of the images (the builder, the image base)",
    )


DESCRIPTION = """\
Build, release, qualify and install relocatable vLLM bundles for AMD GPUs (TheRock's ROCm).
Every user error ends in one line, "error: <what> (<how to fix>)", and the exit code of its kind
(see the README's exit-code table); --debug or VLLM_BUNDLE_DEBUG=1 adds the traceback."""

EXAMPLES = """\
examples:
  vllm-bundle bundle gfx1151                  lock if needed, build, qualify, write ./bundles/<tag>/
  vllm-bundle bundle gfx1151 --image --push ghcr.io/OWNER/vllm
  vllm-bundle qualify bundles/<tag>           tier 0 checks of a release's parts
  vllm-bundle doctor                          can this machine run a bundle?
  vllm-bundle install https://github.com/OWNER/REPO/releases/download/<tag>/
  vllm-bundle <verb> --help                   that verb's options"""


def _verb_parser(
    verbs: argparse._SubParsersAction[_Parser], name: str, summary: str, run: str
) -> argparse.ArgumentParser:
    """A verb: its one-line summary (listed once in the top-level help) and the function that runs it."""
    parser = verbs.add_parser(name, help=summary, description=summary, formatter_class=_Formatter)
    parser.set_defaults(run=run)
    # Also after the verb, where a user adds it to the command that failed; SUPPRESS keeps the verb's
    # parser from resetting a --debug given before the verb.
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vllm-bundle", description=DESCRIPTION, epilog=EXAMPLES, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"vllm-bundle {__version__}")
    parser.add_argument("--debug", action="store_true", help=f"print the traceback of an error too (${DEBUG_ENV}=1)")
    verbs = parser.add_subparsers(dest="verb", required=True, title="verbs", metavar="<verb>")
    build = "vllm_bundle.pipeline.verbs:"

    lock = _verb_parser(verbs, "lock", "pin every input of a target (url, size, sha256)", build + "cmd_lock")
    lock.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help=f"targets to lock (with --check: default every lock); one of: {_targets_line()}",
    )
    lock.add_argument("--check", action="store_true", help="fail when a lock no longer matches its recipe")
    _index_options(lock)
    _mirror_option(lock, "URL or directory with the release files (CPython tarball, SHA256SUMS)")
    lock.add_argument("--image", action="store_true", help="also pin the container image's base (recipes/image.toml)")
    lock.add_argument(
        "--builder", action="store_true", help="also pin the image vLLM is compiled in (recipes/builder.toml)"
    )
    _registry_mirror_option(lock)
    _common(lock)

    probe = _verb_parser(
        verbs, "probe", "check the fake upstream's facts against a channel's real hosts", build + "cmd_probe"
    )
    probe.add_argument(
        "target", nargs="?", default="gfx1151", metavar="TARGET", help="the target whose packages are probed"
    )
    probe.add_argument("--channel", default=DEFAULT_CHANNEL, help="release channel")
    probe.add_argument("--facts", type=Path, help="the facts file (tests/upstream/facts.toml of the checkout)")
    _index_options(probe)
    _mirror_option(probe, "URL or directory with the release files (SHA256SUMS)")
    _recipes_option(probe)
    _read_timeout_option(probe, "seconds a host may stay silent before the probe gives up on it")
    probe.add_argument(
        "--response-deadline",
        type=_seconds,
        default=PAGE_DEADLINE,
        help=f"seconds one answer (a page, a wheel's range; at most {PAGE_LIMIT >> 20} MiB) may take in all",
    )

    fetch = _verb_parser(
        verbs, "fetch", "download a target's locked inputs into the verified cache", build + "cmd_fetch"
    )
    _target_argument(fetch)
    _mirror_option(fetch)
    fetch.add_argument("--offline", action="store_true", help="use the cache only; list what is missing")
    _common(fetch)

    patch = _verb_parser(
        verbs, "patch", "extract vLLM's source release and apply the patch series", build + "cmd_patch"
    )
    _build_options(patch)
    _common(patch)

    wheel = _verb_parser(
        verbs, "vllm-wheel", "build a Python-only vLLM wheel from the patched source", build + "cmd_vllm_wheel"
    )
    _build_options(wheel)
    wheel.add_argument(
        "--python", type=Path, default=Path(sys.executable), help="build interpreter with torch and vLLM's build tools"
    )
    wheel.add_argument("--python-only", action="store_true", help="a Python-only wheel (the only kind built here)")
    _common(wheel)

    bundle = _verb_parser(
        verbs, "bundle", "build a target's bundle tree, qualify it, write its release assets", build + "cmd_bundle"
    )
    _bundle_options(bundle)

    image = _verb_parser(
        verbs, "image", "bundle, then the OCI image of it (= bundle --image); --push to publish", build + "cmd_bundle"
    )
    _bundle_options(image)
    image.set_defaults(image=True)

    repro = _verb_parser(
        verbs,
        "verify-repro",
        "build twice (other dirs, umask, TZ, clock) and compare assets",
        build + "cmd_verify_repro",
    )
    _target_argument(repro)
    repro.add_argument("--work", type=Path, default=None, help="where the two builds go (default: a new temp dir)")
    repro.epilog = "Every other option is passed to `bundle` (e.g. --recipes, --mirror, --repo)."

    qualify = _verb_parser(
        verbs,
        "qualify",
        "tier 0 checks of a bundle tree, an archive or a directory of parts",
        "vllm_bundle.qualify.commands:cmd_qualify",
    )
    qualify.add_argument("bundle", type=Path, help="bundle tree, archive or directory of parts")
    qualify.add_argument("--target", help="the bundle's target (default: read from its launcher)")
    qualify.add_argument(
        "--report", type=Path, help="where the JSON report goes (default: qualification-<target>.json)"
    )
    qualify.add_argument("--warn-only", action="store_true", help="exit 0 even when a check fails")
    _recipes_option(qualify)

    gpu = _verb_parser(
        verbs,
        "qualify-gpu",
        "tier 1/2 checks on a machine with the target GPU",
        "vllm_bundle.qualify.commands:cmd_qualify_gpu",
    )
    gpu.add_argument("bundle", type=Path, help="bundle tree, archive or directory of parts")
    gpu.add_argument("--model", required=True, help="a small model (directory or hub id) for vllm-server")
    gpu.add_argument("--target", help="the bundle's target (default: read from its launcher)")
    gpu.add_argument("--tiers", type=int, choices=(1, 2), default=2, help="1: probe only; 2: also serve")
    gpu.add_argument(
        "--port", type=_whole_number(1, 65535), help="port for vllm-server on 127.0.0.1 (default: a free one)"
    )
    gpu.add_argument("--boot-timeout", type=_seconds, default=900.0, help="seconds to wait for /health")
    gpu.add_argument("--max-model-len", type=_whole_number(1), default=2048, help="passed to vllm-server")
    gpu.add_argument("--report", type=Path, help="JSON report (default: qualification-gpu-<target>.json)")
    gpu.add_argument("--log", type=Path, help="vllm-server's output (default: vllm-server-<target>.log)")
    gpu.add_argument("--release-dir", type=Path, help="merge the outcome into this release's release.json")
    _recipes_option(gpu)

    install = _verb_parser(
        verbs,
        "install",
        "install a released bundle (verified, atomic, resumable)",
        "vllm_bundle.install.commands:cmd_install",
    )
    install.add_argument(
        "source", help="release URL (…/releases/download/<tag>/), release directory, or backend_versions.json"
    )
    install.add_argument(
        "--target", help=f"the target to install (required with backend_versions.json): auto, {_targets_line()}"
    )
    install.add_argument("--dest", type=Path, help="install directory (default: the user data dir/<target>)")
    _mirror_option(install, "with backend_versions.json: an URL or directory serving the assets")
    install.add_argument(
        "--force", action="store_true", help="install even when `vllm-bundle doctor` finds a blocker on this machine"
    )
    install.add_argument(
        "--no-delta",
        action="store_true",
        help="download the whole release, even over a previous install it could re-use (docs/running.md)",
    )
    _host_root_option(install)
    _recipes_option(install, shown=False)
    _download_options(install)

    doctor = _verb_parser(
        verbs,
        "doctor",
        "can this machine run a bundle? (GPU, kernel, driver, access, memory)",
        "vllm_bundle.install.commands:cmd_doctor",
    )
    chosen = doctor.add_mutually_exclusive_group()
    chosen.add_argument(
        "--target", help=f"the bundle's target (default: the one serving the GPU): auto, {_targets_line()}"
    )
    chosen.add_argument("--bundle", type=Path, metavar="DIR", help="an installed bundle: check for its target")
    doctor.add_argument(
        "--gpu-memory-utilization",
        type=_fraction,
        metavar="FLOAT",
        help="the value you will pass vllm-server (default: check the one the launcher chooses)",
    )
    doctor.add_argument("--json", action="store_true", help='print {"ready": ..., "findings": [...]} as JSON')
    _host_root_option(doctor)
    _recipes_option(doctor, shown=False)

    targets = _verb_parser(
        verbs,
        "targets",
        "list the recipes' targets (or channels): the one list the workflows' matrices come from",
        "vllm_bundle.pipeline.workflow:cmd_targets",
    )
    targets.add_argument("names", nargs="*", metavar="NAME", help="check these and list them (default: every one)")
    targets.add_argument("--channels", action="store_true", help="list channels instead of targets")
    targets.add_argument("--json", action="store_true", help="print a JSON list (a workflow matrix)")
    _recipes_option(targets)

    merge = _verb_parser(
        verbs,
        "merge-manifests",
        "merge several targets' backend_versions.json for one release",
        "vllm_bundle.pipeline.workflow:cmd_merge_manifests",
    )
    merge.add_argument("files", nargs="+", type=Path, metavar="FILE")
    merge.add_argument("-o", "--output", type=Path, required=True)
    return parser


MAX_ERROR_LENGTH = 1000


def _one_line(text: str) -> str:
    """An error is one line a person reads: newlines folded, and a runaway detail cut."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_LENGTH else line[: MAX_ERROR_LENGTH - 1] + "…"


def _switched_on(variable: str) -> bool:
    """An on/off environment variable: on unless unset, empty or ``0``."""
    return os.environ.get(variable, "") not in ("", "0")


def _verb(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The function that runs the verb, imported only now: ``install`` and ``doctor`` run with the runtime
    dependencies alone, and importing the build verbs would need the build extra."""
    module, _, name = str(args.run).partition(":")
    function: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), name)
    return function


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.verb == "verify-repro":
        args.bundle_args = unknown
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    debug = args.debug or _switched_on(DEBUG_ENV)
    ci = GitHubActions.detect()
    try:
        _check_work_dirs(args)
        return int(_verb(args)(args))
    except BundleError as err:
        if debug:
            traceback.print_exc()
        return _fail(_one_line(str(err)), err.exit_code, ci)
    except OSError as err:
        # Downloads, extraction and stages name what filled up; this catches every other write.
        if not is_disk_full(err):
            raise
        where = f" writing {err.filename}" if err.filename else ""
        return _fail(f"no space left on device{where} (free space and run again)", DiskFullError.exit_code, ci)
    except KeyboardInterrupt:
        # Every cleanup of ours ran while the interrupt unwound this thread. Exit now rather than wait
        # for download threads blocked in a socket read: their partial files are kept for a resume.
        print("interrupted: partial downloads are kept and resume on the next run", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)


def _fail(line: str, code: int, ci: GitHubActions | None) -> int:
    """The one error line (and, in GitHub Actions, the same line as an ``::error::`` annotation)."""
    print(f"error: {line}", file=sys.stderr)
    if ci is not None:
        ci.error(line)
    return code
