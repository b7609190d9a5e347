"""Registry credentials, found where ``docker login``, ``podman login`` and ``skopeo login`` leave them.

In this order, the first that has credentials for the registry wins:

1. ``$VLLM_BUNDLE_REGISTRY_USERNAME`` and ``$VLLM_BUNDLE_REGISTRY_PASSWORD``, both set (CI: the actor
   and ``GITHUB_TOKEN``).
2. ``$REGISTRY_AUTH_FILE`` when it is set, and then no other file: skopeo's ``--authfile`` defaults to
   it (containers/skopeo:cmd/skopeo/utils.go) and containers/image reads only a file the user named
   (containers/image:pkg/docker/config/config.go, ``getAuthFilePaths``: ``if !userSpecifiedPath``).
3. Otherwise, as containers/image's ``getAuthFilePaths``/``getPathToAuthWithOS`` on Linux:
   ``$XDG_RUNTIME_DIR/containers/auth.json`` (``/run/containers/<uid>/auth.json`` without it),
   ``${XDG_CONFIG_HOME:-~/.config}/containers/auth.json``, then ``$DOCKER_CONFIG/config.json`` if
   ``DOCKER_CONFIG`` is set, else ``~/.docker/config.json`` (docker/cli:cli/config/config.go, ``Dir``).
   The legacy ``~/.dockercfg`` is not read.

Within one file (docker/cli:cli/config/configfile/file.go, ``GetCredentialsStore`` and
``getConfiguredCredentialStore``; containers/image's ``findCredentialsInFile``): a ``credHelpers``
entry for the registry, else a ``credsStore``, names a helper ``docker-credential-<name>``, run as
``docker-credential-<name> get`` with the server on stdin; it answers ``{"Username": ..., "Secret":
...}``, or fails saying ``credentials not found in native keychain``, and a ``Username`` of
``<token>`` makes the secret an identity token (docker/docker-credential-helpers:client/client.go
``Get``, credentials/error.go; docker/cli:cli/config/credentials/native_store.go). Otherwise the
``auths`` entry whose key is the registry (for Docker Hub ``https://index.docker.io/v1/`` first,
docker/cli:cli/config/configfile/file.go ``getAuthConfigKey``), else one whose key reduces to the
registry's host once its scheme and path are dropped (docker/cli:cli/config/credentials/file_store.go
``Get``/``ConvertToHostname``; containers/image's ``normalizeAuthFileKey``/``normalizeRegistry``, where
``docker.io`` and ``registry-1.docker.io`` are ``index.docker.io``). An entry holds ``"auth":
base64("user:password")`` (docker/cli ``decodeAuth``: cut at the first colon, NULs trimmed from the
password), or ``username``/``password`` (docker/cli:cli/config/types/authconfig.go), and may hold an
``identitytoken``: an OAuth refresh token, traded for a registry token by a POST with
``grant_type=refresh_token`` (containers/image:docker/docker_client.go ``getBearerTokenOAuth2``, the
Docker token spec's OAuth flow). An empty entry ``{}`` (docker's marker beside a helper) is no
credentials. Registry keys with a repository path (``quay.io/ns``, a containers/image extension) are not
matched.

A login file is read only when it is a regular file of at most :data:`MAX_AUTH_FILE` bytes, opened
without blocking (a FIFO or a device is refused in one line naming it, not waited on or read forever),
and decoded as strict UTF-8. No message names a password, a token or a file's content: only hosts, file
paths and helper names.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_bundle.errors import CredentialsError
from vllm_bundle.runtime.smallfile import NotSmallFile, read_small_bytes

USER_ENV = "VLLM_BUNDLE_REGISTRY_USERNAME"
PASSWORD_ENV = "VLLM_BUNDLE_REGISTRY_PASSWORD"  # noqa: S105 - the variable's name, not a secret
AUTH_FILE_ENV = "REGISTRY_AUTH_FILE"
#: Docker Hub: the names a reference may use, the host its API answers on, and the key of its
#: credentials (containers/image:docker/docker_client.go ``dockerHostname``/``dockerV1Hostname``/
#: ``dockerRegistry``; docker/cli:cli/config/configfile/file.go ``authConfigKey``).
DOCKER_HUB = "docker.io"
DOCKER_HUB_NAMES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
DOCKER_HUB_API = "registry-1.docker.io"
DOCKER_HUB_KEY = "https://index.docker.io/v1/"
#: What a helper prints when it has nothing for the server (docker-credential-helpers' standard message).
NOT_FOUND = "credentials not found in native keychain"
TOKEN_USER = "<token>"  # noqa: S105 - the helpers' marker for an identity token, not a secret
HELPER_TIMEOUT = 60.0
HELPER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
FIX = f"fix or remove it, or set ${USER_ENV} and ${PASSWORD_ENV}"
#: The most a login file may hold. docker and podman write a few KiB (one entry per registry); more is not
#: a login file, and a FIFO or a device is not read at all (``lock --image`` hung on a FIFO, read
#: ``/dev/zero`` until MemoryError).
MAX_AUTH_FILE = 1 << 20


@dataclass(frozen=True)
class Credentials:
    """A login for one registry; ``source`` says where it came from (an environment variable's name, a
    file's path, a helper's name). The secrets stay out of ``repr``."""

    username: str
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    source: str = ""

    def basic(self) -> str:
        """The ``Authorization`` header value for a Basic challenge."""
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def login_hint(registry: str) -> str:
    return f"set ${USER_ENV} and ${PASSWORD_ENV}, or run `docker login {registry}` or `podman login {registry}`"


def is_docker_hub(registry: str) -> bool:
    return registry in DOCKER_HUB_NAMES


def api_host(registry: str) -> str:
    """The host a registry's API answers on: Docker Hub's is ``registry-1.docker.io``, not ``docker.io``
    (containers/image:docker/docker_client.go ``newDockerClient``)."""
    return DOCKER_HUB_API if registry in ("docker.io", "index.docker.io") else registry


def auth_files(environ: Mapping[str, str], home: Path | None) -> list[Path]:
    """The files to look in, in order (see the module's docstring); ``home`` None (a user without one)
    leaves out the files only a home names."""
    named = environ.get(AUTH_FILE_ENV)
    if named:
        try:
            return [Path(named).expanduser()]
        except RuntimeError:  # "~user" of no user (or "~" without $HOME nor a passwd entry)
            user = named[1:].split("/", 1)[0]
            whose = f"no user {user} whose home ~{user}" if user else "no home directory that ~"
            raise CredentialsError(
                f"${AUTH_FILE_ENV} is {named!r}: there is {whose} could stand for",
                f"set ${AUTH_FILE_ENV} to the file's full path",
            ) from None
    runtime = environ.get("XDG_RUNTIME_DIR")
    files = [
        Path(runtime) / "containers" / "auth.json" if runtime else Path(f"/run/containers/{os.getuid()}/auth.json")
    ]
    config = environ.get("XDG_CONFIG_HOME") or (home / ".config" if home is not None else None)
    if config is not None:
        files.append(Path(config) / "containers" / "auth.json")
    docker_config = environ.get("DOCKER_CONFIG") or (home / ".docker" if home is not None else None)
    if docker_config is not None:
        files.append(Path(docker_config) / "config.json")
    return files


def find_credentials(
    registry: str, environ: Mapping[str, str] | None = None, home: Path | None = None
) -> Credentials | None:
    """The credentials for ``registry`` (``host[:port]``, as in a reference), or None for anonymous."""
    environ = os.environ if environ is None else environ
    user, password = environ.get(USER_ENV), environ.get(PASSWORD_ENV)
    if user and password:
        return Credentials(user, password, source=f"${USER_ENV}")
    for path in auth_files(environ, home if home is not None else _home(environ)):
        found = _from_file(path, registry, environ)
        if found is not None:
            return found
    return None


def _home(environ: Mapping[str, str]) -> Path | None:
    """$HOME, else the passwd entry's; None for a user with neither (a container's arbitrary uid)."""
    if environ.get("HOME"):
        return Path(environ["HOME"])
    try:
        return Path.home()
    except RuntimeError:
        return None


def _hostname(key: str) -> str:
    """An ``auths`` key as a host: ``https://index.docker.io/v1/`` -> ``index.docker.io``."""
    if "://" in key:
        key = key.split("://", 1)[1]
    return key.split("/", 1)[0]


def _same_registry(key: str, registry: str) -> bool:
    host = _hostname(key)
    return host == registry or (is_docker_hub(host) and is_docker_hub(registry))


def _keys(registry: str) -> Iterator[str]:
    """The keys an entry for ``registry`` is stored under, the usual one first."""
    if is_docker_hub(registry):
        yield DOCKER_HUB_KEY
        yield from sorted(DOCKER_HUB_NAMES)
    else:
        yield registry


def _read(path: Path) -> dict[str, Any] | None:
    try:
        text = read_small_bytes(path, MAX_AUTH_FILE).decode("utf-8")
    except FileNotFoundError:
        return None
    except NotSmallFile as err:  # a FIFO, a device, a directory, or more than a login file holds
        raise CredentialsError(f"the registry credentials file {err}", FIX) from None
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else "not UTF-8 text"
        raise CredentialsError(f"cannot read the registry credentials file {path}: {reason}", FIX) from None
    try:
        document = json.loads(text)
    except ValueError as err:
        where = f" at line {err.lineno}" if isinstance(err, json.JSONDecodeError) else ""
        raise CredentialsError(f"{path} is not valid JSON{where}", FIX) from None
    if not isinstance(document, dict):
        raise CredentialsError(f"{path} is not a JSON object", FIX)
    return document


def _section(document: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    value = document.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CredentialsError(f'{path}: "{name}" is not a JSON object', FIX)
    return value


def _from_file(path: Path, registry: str, environ: Mapping[str, str]) -> Credentials | None:
    document = _read(path)
    if document is None:
        return None
    helpers = _section(document, "credHelpers", path)
    for key in _keys(registry):
        if key in helpers:
            return _from_helper(helpers[key], key, path, environ)
    store = document.get("credsStore")
    if store:
        return _from_helper(store, next(_keys(registry)), path, environ)
    auths = _section(document, "auths", path)
    exact = (k for k in _keys(registry) if k in auths)
    found = next(exact, None) or next((k for k in auths if _same_registry(k, registry)), None)
    return None if found is None else _entry(auths[found], found, path)


def _entry(entry: object, key: str, path: Path) -> Credentials | None:
    """One ``auths`` entry's credentials; None for an empty one (a helper's marker)."""
    what = f'the "auths" entry {key!r} in {path}'
    if not isinstance(entry, dict):
        raise CredentialsError(f"{what} is not a JSON object", FIX)
    token = entry.get("identitytoken") or ""
    user, password = entry.get("username") or "", entry.get("password") or ""
    auth = entry.get("auth") or ""
    if not all(isinstance(value, str) for value in (token, user, password, auth)):
        raise CredentialsError(f"{what} has a field that is not a string", FIX)
    if auth:
        try:
            decoded = base64.b64decode(auth, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise CredentialsError(f'{what}: "auth" is not base64 of USER:PASSWORD', FIX) from None
        user, colon, password = decoded.partition(":")
        if not colon or not user:
            raise CredentialsError(f'{what}: "auth" is not base64 of USER:PASSWORD', FIX)
        password = password.strip("\x00")
    if not (user and password) and not token:
        return None
    return Credentials(user, password, token, source=str(path))


def _from_helper(name: object, server: str, path: Path, environ: Mapping[str, str]) -> Credentials | None:
    """Ask ``docker-credential-<name> get`` for ``server``'s credentials (None: it has none)."""
    if not isinstance(name, str) or not HELPER_NAME.match(name):
        raise CredentialsError(f"{path} names a credential helper that is not a plain name", FIX)
    program = f"docker-credential-{name}"
    found = shutil.which(program, path=environ.get("PATH"))
    if found is None:
        raise CredentialsError(
            f"{path} asks the credential helper {program} for {server}, and it is not on PATH",
            f"install {program}, or drop it from {path}, or set ${USER_ENV} and ${PASSWORD_ENV}",
        )
    try:
        answer = subprocess.run(
            [found, "get"],
            input=server.encode(),
            capture_output=True,
            timeout=HELPER_TIMEOUT,
            check=False,
            env=dict(environ),
        )
    except subprocess.TimeoutExpired:
        raise CredentialsError(
            f"the credential helper {program} did not answer within {HELPER_TIMEOUT:.0f} s",
            f"run `echo {server} | {program} get` to see what it waits for",
        ) from None
    except OSError as err:
        raise CredentialsError(f"cannot run the credential helper {found}: {err.strerror}", f"check {found}") from None
    if answer.returncode != 0:
        if NOT_FOUND in answer.stdout.decode(errors="replace"):
            return None
        raise CredentialsError(
            f"the credential helper {program} failed for {server} (exit status {answer.returncode})",
            f"run `echo {server} | {program} get` to see why",
        )
    try:
        reply = json.loads(answer.stdout)
        user, secret = reply.get("Username") or "", reply.get("Secret") or ""
    except (ValueError, AttributeError):
        user = secret = None
    if not isinstance(user, str) or not isinstance(secret, str):
        raise CredentialsError(
            f"the credential helper {program} answered for {server} with something that is not its JSON",
            f"run `echo {server} | {program} get` to see it",
        )
    if not secret:
        return None
    if user == TOKEN_USER:
        return Credentials("", identity_token=secret, source=program)
    return Credentials(user, secret, source=program)
