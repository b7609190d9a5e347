"""Errors a user can cause, each printed by the CLI as one line (what went wrong; how to fix it).

Anything that is not a :class:`BundleError` is a bug in this tool and keeps its traceback.
"""

from __future__ import annotations

import re

#: The userinfo of an URL (``https://user:token@host/``): a password or token that must never be printed.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact_urls(text: str) -> str:
    """``text`` with every URL's userinfo replaced by ``***`` (``https://***@host/``). Every line this tool
    prints about an URL goes through here: errors (below) and the progress reporters' notes."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


class BundleError(Exception):
    """Base of every user-facing error. ``str(err)`` is the one line the CLI prints."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return redact_urls(f"{self.message} ({self.hint})" if self.hint else self.message)


class RecipeError(BundleError):
    """A recipe file is malformed: names the file, the key and what was expected."""

    exit_code = 2


class UnknownTargetError(RecipeError):
    """A target (or channel) name that the recipes do not define."""


class LockError(BundleError):
    """A lock could not be made, read or trusted."""


class LockMissingError(LockError):
    """No lock exists for the (target, channel)."""


class LockOutOfDateError(LockError):
    """The lock no longer matches its recipe."""


class FetchError(BundleError):
    """A download failed for good (after retries)."""


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


class DiskFullError(FetchError):
    """The disk filled up while writing; the partial file was removed."""


class InvalidValueError(BundleError):
    """A value read from a manifest, a lock, an index page or a flag is not of the form it must have."""


class InstallError(BundleError):
    """The release cannot be installed as given."""
