"""Errors a user can cause, each printed by the CLI as one line (what went wrong; how to fix it), in one
hierarchy with one exit code per kind. Anything that is not a :class:`BundleError` is a bug in this tool
and keeps its traceback; ``--debug`` (or ``VLLM_BUNDLE_DEBUG=1``) prints a :class:`BundleError`'s too,
for a bug report.

Exit codes: each class's ``exit_code`` (a subclass inherits its base's), and :data:`OTHER_EXITS` for the
exits no class stands for (success, a verb's own "no", argparse's errors, a disk-full ``OSError``,
Ctrl-C). The README's exit-code table is generated from these two (``python tests/test_docs.py``) and
tests/test_docs.py fails when it no longer matches them: it is the one table, read it there.

The rule for a bad command-line option or option value (an environment variable standing in for an
option included): a :class:`UsageError` (or, for a recipe, a :class:`RecipeError`), exit 2, raised before
any work; the one line says which option, what is wrong with its value and how to fix it.
"""

from __future__ import annotations

import re

#: The userinfo of an URL (``https://user:token@host/``): a password or token that must never be printed.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")

#: The variable that, like ``--debug``, makes the CLI print a BundleError's traceback.
DEBUG_ENV = "VLLM_BUNDLE_DEBUG"


def redact_urls(text: str) -> str:
    """``text`` with every URL's userinfo replaced by ``***`` (``https://***@host/``). Every line this tool
    prints about an URL goes through here: errors (below) and the progress reporters' notes."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


def printable(text: str, limit: int | None = None) -> str:
    """``text`` as one line a terminal shows as written: every character that is not printable (newline,
    ESC and the other controls, a line separator) escaped the way Python's ``repr`` writes it, and cut to
    ``limit`` characters with an ellipsis. Text from outside (a host's files, the environment, a server's
    reply) goes through here before it is printed, so it can neither forge a line nor drive the terminal."""
    shown = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    if limit is not None and len(shown) > limit:
        return shown[: limit - 1] + "\u2026"
    return shown


class BundleError(Exception):
    """Base of every user-facing error. ``str(err)`` is the one line the CLI prints. Raised as such (or as
    one of the checks' classes below), it means a check ran and said no."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return printable(redact_urls(f"{self.message} ({self.hint})" if self.hint else self.message))


# -- 1: a check said no ------------------------------------------------------------------------------


class QualificationError(BundleError):
    """Tier 0 (or a GPU tier) found a defect: the bundle is not fit to ship."""


class NotReproducibleError(BundleError):
    """Two builds from the same inputs differ."""


class NotReadyError(BundleError):
    """``install`` refused: the machine cannot run the bundle it would install."""


class NoSupportedGPUError(BundleError):
    """No AMD GPU, or none that any target supports."""


# -- 2: usage ----------------------------------------------------------------------------------------


class UsageError(BundleError):
    """A bad option or option value, refused before any work: options that conflict, one that is missing,
    a value not of the form it must have (a repository, an image reference), a file or directory that
    cannot be used as the option asks; an environment variable standing in for an option too."""

    exit_code = 2


class RecipeError(UsageError):
    """A recipe file is malformed, or an option names what no recipe defines: names the file or option,
    the key and what was expected."""


class UnknownTargetError(RecipeError):
    """A target (or channel) name that the recipes do not define."""


# -- 3: locks ----------------------------------------------------------------------------------------


class LockError(BundleError):
    """A lock could not be made, read or trusted."""

    exit_code = 3


class LockMissingError(LockError):
    """No lock exists for the (target, channel)."""


class LockOutOfDateError(LockError):
    """The lock no longer matches its recipe."""


# -- 4: downloads ------------------------------------------------------------------------------------


class FetchError(BundleError):
    """A download failed for good (after retries)."""

    exit_code = 4


class HashMismatchError(FetchError):
    """Bytes did not match the pinned size or sha256; nothing was cached."""


class NetworkError(FetchError):
    """A host could not be reached or kept failing."""


class InsecureURLError(FetchError):
    """A plain-http URL that is not on a loopback address."""


class OfflineMissingError(FetchError):
    """--offline was given and the cache lacks some artifacts."""


class CorruptCacheError(FetchError):
    """A cached file no longer matches the sha256 it was stored under."""


class RegistryError(FetchError):
    """A registry refused a request or answered with something unusable."""


# -- 5: disk full ------------------------------------------------------------------------------------


class DiskFullError(BundleError):
    """The disk filled up while writing (a download, a stage, an install); the partial file was removed."""

    exit_code = 5


# -- 6: a stage failed -------------------------------------------------------------------------------


class StageError(BundleError):
    """A stage could not do its work; its log (where there is one) is kept."""

    exit_code = 6


class PatchError(StageError):
    """A patch does not apply (or no variant covers the vLLM version)."""


class BuildError(StageError):
    """The vLLM wheel build failed, or its output is not what the target needs; the full log is kept."""


class AssembleError(StageError):
    """A wheel could not be installed, or the tree is not what the launcher needs."""


class RelocationError(StageError):
    """A file still refers to the build directory."""


class ArchiveError(StageError):
    """The tree cannot be archived as it is (e.g. a symlink that leaves it)."""


class ImageError(StageError):
    """The image cannot be written as asked (an unknown base layer type, a tree entry no layer takes)."""


class KServeError(StageError):
    """The KServe manifests cannot be rendered for this target."""


# -- 7: bad input from outside -----------------------------------------------------------------------


class InputError(BundleError):
    """Something read from outside (a manifest, an index page, an archive) is malformed or unsafe."""

    exit_code = 7


class InvalidValueError(InputError):
    """A value read from outside (a manifest, an index page, a checksums file, ``$SOURCE_DATE_EPOCH``) is not
    of the form it must have."""


class ManifestError(InputError):
    """A manifest is malformed or manifests disagree."""


class CredentialsError(InputError):
    """A saved registry login (a credentials file or helper) that cannot be used: names the file or
    helper, never a secret."""


class MalformedRecordError(InputError):
    """A RECORD row installer cannot read (not three fields, an unknown hash algorithm, a bad size)."""


class UnsafeArchiveError(InputError):
    """An archive entry would write outside its destination, or is a special file."""


# -- 8: install --------------------------------------------------------------------------------------


class InstallError(BundleError):
    """The release cannot be installed as given."""

    exit_code = 8


def _exit_codes() -> dict[str, int]:
    """Every error class of this module by name, with its exit code."""
    found: dict[str, int] = {}
    pending: list[type[BundleError]] = [BundleError]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls.exit_code
        pending.extend(cls.__subclasses__())
    return dict(sorted(found.items(), key=lambda item: (item[1], item[0])))


#: Class name → exit code, for the docs' table and its test.
EXIT_CODES = _exit_codes()

#: The exits no error class above stands for: (code, the module that exits so, when). The README's one
#: exit-code table lists them among the classes, in code order (tests/test_docs.py generates it).
OTHER_EXITS: tuple[tuple[int, str, str], ...] = (
    (0, "cli.py", "Success; also `qualify --warn-only` when a check failed (the report says which)."),
    (1, "install/commands.py", "`doctor` found a blocker: this machine cannot run the bundle (its findings say why)."),
    (1, "pipeline/verbs.py", "`probe` found facts of the fake upstream that differ from what the channel serves."),
    (1, "cli.py", "A bug in this tool: any exception that is not a `BundleError`, printed with its traceback."),
    (
        2,
        "cli.py",
        "argparse's own errors: an unknown option, a missing argument, a value of the wrong type or out of "
        "range; one line, as a `UsageError` is.",
    ),
    (5, "cli.py", "No space left on a write the tool has no error class for (an `OSError` with `ENOSPC`)."),
    (130, "cli.py", "Interrupted (Ctrl-C): partial downloads are kept and resume on the next run."),
)
