"""Registry logins as registry users keep them: the files ``docker login``, ``podman login`` and
``skopeo login`` write, credential helpers, identity tokens, the environment variables CI sets; Docker
Hub's names; and the push's progress. The credential lookup is tested on fake homes, the logins on real
registries on 127.0.0.1 (Debian's docker-registry with htpasswd auth, a login written by skopeo)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl

import pytest

from tests.conftest import assert_one_line_error, copy_recipes, run_cli
from tests.upstream.registry import RegistryProxy, RegistryServer, require_tools, serving
from vllm_bundle.errors import CredentialsError, RegistryError
from vllm_bundle.oci.auth import (
    DOCKER_HUB_KEY,
    PASSWORD_ENV,
    USER_ENV,
    Credentials,
    find_credentials,
)
from vllm_bundle.oci.layout import Descriptor
from vllm_bundle.oci.registry import Reference, RegistryClient, mirrored, push_layout
from vllm_bundle.util.progress import PlainReporter, human_size

HOST = "registry.example.test:5000"
USER = "pusher"
SECRET = "pa55-w0rd-s3cret"  # the test registry's password, looked for in every output
REFRESH = "refresh-t0ken-s3cret"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def write_json(path: Path, document: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


def login(user: str, password: str) -> dict[str, Any]:
    return {"auths": {HOST: {"auth": b64(f"{user}:{password}")}}}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A user with a fresh home, a runtime directory and a bin directory first on PATH."""
    (tmp_path / "bin").mkdir()
    return {
        "HOME": str(tmp_path / "home"),
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
    }


def who(registry: str, env: dict[str, str]) -> str | None:
    found = find_credentials(registry, env)
    return None if found is None else found.username


# -- where logins are found ---------------------------------------------------------------------------


def test_a_user_without_a_home_still_finds_logins_where_the_environment_points(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container's arbitrary user (OpenShift's) has no $HOME and no passwd entry, so Path.home() raises:
    the files under the home are skipped, those the environment names are still read, and nothing ends
    in a traceback."""

    def no_home(cls: type[Path]) -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", classmethod(no_home))
    homeless = {key: value for key, value in env.items() if key != "HOME"}
    assert who(HOST, homeless) is None
    write_json(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json", login("runtime", "1"))
    assert who(HOST, homeless) == "runtime"
    write_json(tmp_path / "dockerdir" / "config.json", login("docker-config", "2"))
    (Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json").unlink()
    assert who(HOST, {**homeless, "DOCKER_CONFIG": str(tmp_path / "dockerdir")}) == "docker-config"


def test_login_files_are_read_in_the_order_containers_image_reads_them(env: dict[str, str], tmp_path: Path) -> None:
    home = Path(env["HOME"])
    runtime = write_json(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json", login("runtime", "1"))
    config = write_json(home / ".config" / "containers" / "auth.json", login("config", "2"))
    docker = write_json(home / ".docker" / "config.json", login("docker", "3"))
    assert who(HOST, env) == "runtime"
    runtime.unlink()
    assert who(HOST, env) == "config"
    config.unlink()
    assert who(HOST, env) == "docker"
    found = find_credentials(HOST, env)
    assert found is not None and found.source == str(docker) and found.password == "3"

    # $XDG_CONFIG_HOME moves podman's file, $DOCKER_CONFIG docker's directory.
    write_json(tmp_path / "xdg" / "containers" / "auth.json", login("xdg", "4"))
    assert who(HOST, {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}) == "xdg"
    write_json(tmp_path / "dockerdir" / "config.json", login("docker-config", "5"))
    assert who(HOST, {**env, "DOCKER_CONFIG": str(tmp_path / "dockerdir")}) == "docker-config"
    assert who(HOST, {**env, "DOCKER_CONFIG": str(tmp_path / "empty")}) is None, "then ~/.docker is not read"

    # $REGISTRY_AUTH_FILE (skopeo's and podman's --authfile): that file and no other.
    named = write_json(tmp_path / "named.json", login("named", "6"))
    assert who(HOST, {**env, "REGISTRY_AUTH_FILE": str(named)}) == "named"
    assert who(HOST, {**env, "REGISTRY_AUTH_FILE": str(tmp_path / "none.json")}) is None
    assert who("other.example.test", env) is None


def test_the_environment_variables_win_over_every_file(env: dict[str, str]) -> None:
    write_json(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json", login("file", "1"))
    found = find_credentials(HOST, {**env, USER_ENV: "ci", PASSWORD_ENV: "gh-token"})
    assert found == Credentials("ci", "gh-token", source=f"${USER_ENV}")
    assert who(HOST, {**env, USER_ENV: "ci"}) == "file", "a user without a password is not a login"


def test_auth_entries_as_docker_and_podman_write_them(env: dict[str, str], tmp_path: Path) -> None:
    path = Path(env["HOME"]) / ".docker" / "config.json"
    entries: list[tuple[dict[str, Any], Credentials | None]] = [
        ({"auth": b64("me:pa:ss\0\0")}, Credentials("me", "pa:ss")),  # cut at the first colon, NULs trimmed
        ({"username": "me", "password": "pw"}, Credentials("me", "pw")),
        ({"auth": b64("me:"), "identitytoken": REFRESH}, Credentials("me", "", REFRESH)),
        ({"identitytoken": REFRESH}, Credentials("", "", REFRESH)),
        ({}, None),  # docker's marker beside a credential helper: no login
    ]
    for entry, expected in entries:
        write_json(path, {"auths": {HOST: entry}})
        found = find_credentials(HOST, env)
        assert (found and Credentials(found.username, found.password, found.identity_token)) == expected, entry

    # Keys with a scheme or a path (older docker logins) name the same host; other hosts' are not taken.
    for key in (f"https://{HOST}/v1/", f"http://{HOST}", f"{HOST}/"):
        write_json(path, {"auths": {key: {"auth": b64("keyed:pw")}, "registry.example.test:50": {"auth": b64("x:y")}}})
        assert who(HOST, env) == "keyed", key
    # An empty entry in the first file does not hide a login in a later one.
    write_json(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json", {"auths": {HOST: {}}})
    assert who(HOST, env) == "keyed"
    assert SECRET not in repr(Credentials(USER, SECRET, REFRESH, "x")), "the secrets stay out of repr"
    assert REFRESH not in repr(Credentials(USER, SECRET, REFRESH, "x"))


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"auths": {"', "is not valid JSON at line 1"),
        ("[]", "is not a JSON object"),
        ('{"auths": ["pa55-w0rd-s3cret"]}', '"auths" is not a JSON object'),
        (json.dumps({"auths": {HOST: "pa55-w0rd-s3cret"}}), "is not a JSON object"),
        (json.dumps({"auths": {HOST: {"auth": "pa55-w0rd-s3cret!"}}}), '"auth" is not base64 of USER:PASSWORD'),
        (json.dumps({"auths": {HOST: {"auth": b64(SECRET)}}}), '"auth" is not base64 of USER:PASSWORD'),
        (json.dumps({"auths": {HOST: {"password": 1}}}), "has a field that is not a string"),
        (json.dumps({"credHelpers": {HOST: "../pa55-w0rd-s3cret"}}), "not a plain name"),
        ("\udcff", "cannot read the registry credentials file"),
    ],
    ids=["json", "array", "auths", "entry", "base64", "colon", "field", "helper", "utf8"],
)
def test_a_malformed_login_file_is_one_error_naming_the_file(env: dict[str, str], content: str, fragment: str) -> None:
    path = Path(env["HOME"]) / ".docker" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content.encode(errors="surrogateescape"))
    with pytest.raises(CredentialsError) as caught:
        find_credentials(HOST, env)
    message = str(caught.value)
    assert str(path) in message and fragment in message and "\n" not in message
    assert SECRET not in message and b64(SECRET) not in message, "no secret and no file content in the message"


#: find_credentials in a child process, its address space capped (1 GiB) so that reading /dev/zero ends in
#: MemoryError rather than eating the machine's memory; the caller's timeout bounds a read that hangs.
LOOKUP = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from vllm_bundle.errors import BundleError
from vllm_bundle.oci.auth import find_credentials
try:
    found = find_credentials(sys.argv[1], json.loads(sys.argv[2]))
except BundleError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(err.exit_code)
print(found)
"""


def lookup_in_child(env: dict[str, str], timeout: float = 10) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LOOKUP, HOST, json.dumps(env)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("where", ["REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "directory"])
def test_a_login_file_that_is_a_fifo_a_device_or_huge_is_one_line_not_a_hang(
    env: dict[str, str], tmp_path: Path, where: str, kind: str
) -> None:
    """Before the fix: a FIFO blocked the open forever (``lock --image``, ``image`` and ``--push`` hung),
    /dev/zero was read until MemoryError. Now: read non-blocking and bounded, one line naming the file."""
    path = (
        tmp_path / "named.json"
        if where == "REGISTRY_AUTH_FILE"
        else Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "huge":  # a sparse 64 MiB file: read whole before, far above what a login file holds
        with path.open("wb") as handle:
            handle.truncate(64 << 20)
    else:
        path.mkdir()
    if where == "REGISTRY_AUTH_FILE":
        env = {**env, "REGISTRY_AUTH_FILE": str(path)}
    try:
        result = lookup_in_child(env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading a {kind} at {path} as a login file hung")
    assert result.returncode == CredentialsError.exit_code, result
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("error: "), line
    what = "is larger than 1048576 bytes" if kind == "huge" else "is not a regular file"
    assert f"the registry credentials file {path} {what}" in line, line
    assert f"fix or remove it, or set ${USER_ENV} and ${PASSWORD_ENV}" in line, line


def test_a_login_file_at_the_size_limit_is_still_read(env: dict[str, str], tmp_path: Path) -> None:
    document = json.dumps(login(USER, SECRET))
    path = tmp_path / "auth.json"
    path.write_text(document + " " * ((1 << 20) - len(document)))  # exactly 1 MiB, padded with JSON whitespace
    assert who(HOST, {**env, "REGISTRY_AUTH_FILE": str(path)}) == USER


@pytest.mark.parametrize("value", ["~vllm-bundle-no-such-user/auth.json", "~vllm-bundle-no-such-user"])
def test_an_auth_file_under_an_unknown_users_home_is_one_line(env: dict[str, str], value: str) -> None:
    """Before the fix: ``RuntimeError: Could not determine home directory`` (Path.expanduser)."""
    with pytest.raises(CredentialsError) as caught:
        find_credentials(HOST, {**env, "REGISTRY_AUTH_FILE": value})
    assert str(caught.value) == (
        f"$REGISTRY_AUTH_FILE is {value!r}: there is no user vllm-bundle-no-such-user whose home "
        "~vllm-bundle-no-such-user could stand for (set $REGISTRY_AUTH_FILE to the file's full path)"
    )


def test_an_auth_file_under_the_users_own_home_is_still_expanded(env: dict[str, str]) -> None:
    home = Path(os.path.expanduser("~"))
    assert home.is_absolute()
    named = Path("~") / "vllm-bundle-test-absent-auth.json"
    assert not (home / named.name).exists()
    assert find_credentials(HOST, {**env, "REGISTRY_AUTH_FILE": str(named)}) is None


# -- credential helpers ---------------------------------------------------------------------------------

HELPER = """#!{python}
import json, os, sys
server = sys.stdin.read()
with open(os.environ["FAKE_HELPER_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + " " + server + "\\n")
answers = json.load(open(os.environ["FAKE_HELPER_ANSWERS"]))
code, out = answers.get(server, [1, "credentials not found in native keychain"])
print(out)
print("pa55-w0rd-s3cret in a helper's complaint", file=sys.stderr)
sys.exit(code)
"""


@pytest.fixture
def helper(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``docker-credential-fake`` on PATH: answers from a JSON file (server -> [exit, stdout]), logs its calls."""
    program = Path(env["PATH"].split(os.pathsep)[0]) / "docker-credential-fake"
    program.write_text(HELPER.format(python=sys.executable))
    program.chmod(0o755)
    env["FAKE_HELPER_LOG"], env["FAKE_HELPER_ANSWERS"] = str(tmp_path / "helper.log"), str(tmp_path / "answers.json")
    yield tmp_path / "helper.log", tmp_path / "answers.json"


def test_credential_helpers_are_asked_as_docker_asks_them(
    env: dict[str, str], helper: tuple[Path, Path], tmp_path: Path
) -> None:
    log, answers = helper
    config = Path(env["HOME"]) / ".docker" / "config.json"
    write_json(answers, {HOST: [0, json.dumps({"ServerURL": HOST, "Username": "helped", "Secret": SECRET})]})
    write_json(config, {"auths": {HOST: {"auth": b64("file:pw")}}, "credHelpers": {HOST: "fake"}})
    found = find_credentials(HOST, env)
    assert found == Credentials("helped", SECRET, source="docker-credential-fake")
    assert log.read_text() == f"get {HOST}\n"

    # credsStore: every registry; Docker Hub is asked for under its key; "<token>" is an identity token.
    write_json(answers, {DOCKER_HUB_KEY: [0, json.dumps({"Username": "<token>", "Secret": REFRESH})]})
    write_json(config, {"auths": {DOCKER_HUB_KEY: {}}, "credsStore": "fake"})
    found = find_credentials("registry-1.docker.io", env)
    assert found is not None and found.identity_token == REFRESH and not found.password
    assert log.read_text().splitlines()[-1] == f"get {DOCKER_HUB_KEY}"
    assert find_credentials(HOST, env) is None, "the helper's not-found answer is no login"

    # A helper that fails otherwise: one line, its exit status, none of what it printed.
    write_json(answers, {HOST: [3, "pa55-w0rd-s3cret"]})
    with pytest.raises(CredentialsError) as caught:
        find_credentials(HOST, env)
    assert str(caught.value) == (
        f"the credential helper docker-credential-fake failed for {HOST} (exit status 3) "
        f"(run `echo {HOST} | docker-credential-fake get` to see why)"
    )


def test_a_helper_that_is_not_installed_is_one_line_saying_how_to_fix_it(env: dict[str, str]) -> None:
    config = write_json(Path(env["HOME"]) / ".docker" / "config.json", {"credsStore": "desktop"})
    with pytest.raises(CredentialsError) as caught:
        find_credentials(HOST, env)
    assert str(caught.value) == (
        f"{config} asks the credential helper docker-credential-desktop for {HOST}, and it is not on PATH "
        f"(install docker-credential-desktop, or drop it from {config}, or set ${USER_ENV} and ${PASSWORD_ENV})"
    )


# -- Docker Hub ------------------------------------------------------------------------------------------


def test_docker_hub_names_its_api_host_and_its_login_key(env: dict[str, str]) -> None:
    assert str(Reference.parse("docker.io/ubuntu:24.04")) == "docker.io/library/ubuntu:24.04"
    assert str(Reference.parse("index.docker.io/someone/tool")) == "docker.io/someone/tool"
    with pytest.raises(RegistryError, match=r"or docker\.io/OWNER/vllm-rocm for Docker Hub"):
        Reference.parse("library/ubuntu")  # host-less names stay refused: the destination is spelled out
    reference, url = mirrored(Reference.parse("docker.io/someone/tool:v1"), None)
    assert (str(reference), url) == ("docker.io/someone/tool:v1", "https://registry-1.docker.io")
    assert mirrored(Reference.parse("index.docker.io/someone/tool"), None)[1] == "https://registry-1.docker.io"
    client = RegistryClient(url)
    assert client.registry == "registry-1.docker.io"

    config = Path(env["HOME"]) / ".docker" / "config.json"
    write_json(config, {"auths": {DOCKER_HUB_KEY: {"auth": b64("hub:pw")}, "docker.io": {"auth": b64("short:pw")}}})
    for name in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        assert who(name, env) == "hub", f"{name}: docker's key for Docker Hub comes first"
    write_json(config, {"auths": {"docker.io": {"auth": b64("short:pw")}}})
    assert who("registry-1.docker.io", env) == "short", "podman's key for it is found too"
    write_json(config, {"auths": {"https://index.docker.io/v2/": {"auth": b64("v2:pw")}}})
    assert who("registry-1.docker.io", env) == "v2"


# -- real registries -----------------------------------------------------------------------------------


def tiny_layout(root: Path, seed: int = 7) -> tuple[Path, list[Descriptor]]:
    """An OCI layout of a linux/amd64 image: a config and a 300 kB layer (several 64 KiB chunks)."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(media_type: str, data: bytes) -> Descriptor:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return Descriptor(media_type, f"sha256:{digest}", len(data))

    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w") as tar:
        info = tarfile.TarInfo("data.bin")
        payload = random.Random(seed).randbytes(300_000)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    layer = put("application/vnd.oci.image.layer.v1.tar", tar_bytes.getvalue())
    config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [layer.digest]}}
    config_blob = put("application/vnd.oci.image.config.v1+json", json.dumps(config).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_blob.to_json(),
        "layers": [layer.to_json()],
    }
    manifest_blob = put("application/vnd.oci.image.manifest.v1+json", json.dumps(manifest).encode())
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    write_json(root / "index.json", {"schemaVersion": 2, "manifests": [manifest_blob.to_json()]})
    return root, [config_blob, layer, manifest_blob]


@pytest.fixture(scope="module")
def login_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """docker-registry asking for ``pusher``/``SECRET`` by HTTP Basic auth (htpasswd, bcrypt)."""
    server = RegistryServer(tmp_path_factory.mktemp("login-registry"), logins={USER: SECRET}).start()
    yield server
    server.stop()


def skopeo_login(registry: RegistryServer, authfile: Path) -> None:
    """``skopeo login``: the file a containers-image tool writes (podman login writes the same)."""
    _, skopeo = require_tools()
    subprocess.run(
        [
            skopeo,
            "login",
            "--tls-verify=false",
            "--authfile",
            str(authfile),
            "-u",
            USER,
            "--password-stdin",
            registry.host,
        ],
        input=SECRET,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_a_push_logs_in_with_what_skopeo_login_wrote_and_reports_each_blob(
    login_registry: RegistryServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    authfile = tmp_path / "auth.json"
    skopeo_login(login_registry, authfile)
    assert json.loads(authfile.read_text())["auths"][login_registry.host]["auth"] == b64(f"{USER}:{SECRET}")
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(authfile))
    monkeypatch.delenv(USER_ENV, raising=False)
    layout, (config, layer, manifest) = tiny_layout(tmp_path / "layout")

    screen = io.StringIO()
    client = RegistryClient(login_registry.url, chunk_size=64 * 1024)
    result = push_layout(layout, Reference(login_registry.host, "logged/in", "v1"), client, PlainReporter(screen))
    assert (result.digest, result.uploaded, result.skipped) == (manifest.digest, 2, 0)
    assert client.credentials is not None and client.credentials.source == str(authfile)
    lines = screen.getvalue().splitlines()
    for blob in (config, layer):
        mine = [line for line in lines if blob.digest[:19] in line]
        assert len(mine) == 2, f"a begin and a done line per blob, plain: {lines}"
        assert mine[0] == f"push {blob.digest[:19]} ({human_size(blob.size)})"
        assert mine[1].startswith(f"done   push {blob.digest[:19]} ({human_size(blob.size)} in ")
    assert SECRET not in screen.getvalue() and b64(f"{USER}:{SECRET}") not in screen.getvalue()

    # skopeo, with the same login, reads back our exact manifest.
    _, skopeo = require_tools()
    raw = subprocess.run(
        [
            skopeo,
            "inspect",
            "--raw",
            "--tls-verify=false",
            "--authfile",
            str(authfile),
            f"docker://{login_registry.host}/logged/in:v1",
        ],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == manifest.digest

    # On a terminal: a bar per blob in flight (the layer's advanced chunk by chunk), no download total.
    from rich.console import Console

    from vllm_bundle.util.progress import RichReporter

    terminal = io.StringIO()
    reporter = RichReporter(Console(file=terminal, force_terminal=True, width=120), None)
    with reporter:
        client = RegistryClient(login_registry.url, chunk_size=64 * 1024)
        push_layout(layout, Reference(login_registry.host, "logged/again", "v1"), client, reporter)
        assert [task.visible for task in reporter.progress.tasks] == [False], "only the hidden total is left"
    shown = re.sub(r"\x1b(\[[0-9;?]*[A-Za-z]|\][^\x1b]*\x1b\\)", "", terminal.getvalue())  # escapes, links
    assert f"done push {layer.digest[:19]}" in shown and "total" not in shown, shown


def test_no_login_or_a_wrong_one_is_one_line_without_the_secret(
    login_registry: RegistryServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, _ = tiny_layout(tmp_path / "layout")
    destination = Reference(login_registry.host, "refused/vllm", "v1")
    monkeypatch.delenv(USER_ENV, raising=False)
    with pytest.raises(RegistryError) as caught:
        push_layout(layout, destination, RegistryClient(login_registry.url))
    assert str(caught.value) == (
        f"{login_registry.url} asks for a login (set ${USER_ENV} and ${PASSWORD_ENV}, or run "
        f"`docker login {login_registry.host}` or `podman login {login_registry.host}`)"
    )
    monkeypatch.setenv(USER_ENV, USER)
    monkeypatch.setenv(PASSWORD_ENV, SECRET + "-wrong")
    with pytest.raises(RegistryError) as caught:
        push_layout(layout, destination, RegistryClient(login_registry.url))
    assert "HTTP 401" in str(caught.value) and SECRET not in str(caught.value)


def test_the_cli_reads_docker_config_and_says_in_one_line_what_is_wrong_with_it(
    login_registry: RegistryServer, tmp_path: Path
) -> None:
    """``lock --image`` against the login registry (the base mirrored there): no login, a malformed
    ~/.docker/config.json, a credential helper that is not installed, then a good login."""
    layout, (_, _, manifest) = tiny_layout(tmp_path / "base")
    owner = RegistryClient(login_registry.url, credentials=Credentials(USER, SECRET))
    push_layout(layout, Reference(login_registry.host, "ubi10/ubi-minimal", "latest"), owner)
    recipes = copy_recipes(tmp_path / "recipes")
    home = tmp_path / "home"
    env = {
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
        "XDG_CONFIG_HOME": "",
        "DOCKER_CONFIG": "",
        "REGISTRY_AUTH_FILE": "",
        USER_ENV: "",
        PASSWORD_ENV: "",
    }
    args = ("lock", "--image", "--recipes", recipes, "--registry-mirror", login_registry.host, "--retries", "1")
    config = home / ".docker" / "config.json"
    results: list[subprocess.CompletedProcess[str]] = []

    def lock() -> subprocess.CompletedProcess[str]:
        results.append(run_cli(*args, "--cache-dir", tmp_path / f"cache{len(results)}", env=env))
        return results[-1]

    assert_one_line_error(lock(), "asks for a login", f"docker login {login_registry.host}")
    write_json(config, {"auths": {login_registry.host: {"auth": SECRET}}})
    assert_one_line_error(lock(), str(config), '"auth" is not base64 of USER:PASSWORD')
    config.write_text('{"auths": {')
    assert_one_line_error(lock(), f"{config} is not valid JSON at line 1", "fix or remove it")
    write_json(config, {"auths": {login_registry.host: {}}, "credsStore": "vllm-bundle-test-absent"})
    assert_one_line_error(lock(), "docker-credential-vllm-bundle-test-absent", "not on PATH", "install")

    write_json(config, {"auths": {login_registry.host: {"auth": b64(f"{USER}:{SECRET}")}}})
    good = lock()
    assert good.returncode == 0, good.stderr
    assert f"locked image base registry.access.redhat.com/ubi10/ubi-minimal:latest: {manifest.digest}" in good.stdout
    for result in results:
        for secret in (SECRET, b64(f"{USER}:{SECRET}")):
            assert secret not in result.stdout + result.stderr


# -- an identity token ----------------------------------------------------------------------------------


class _TokenProxy(RegistryProxy):
    """A registry that asks for a Bearer token and hands one out only for ``REFRESH`` traded by the OAuth
    flow (POST, grant_type=refresh_token), as Docker Hub does for an identity token; the rest goes to a
    real registry behind it. The flow as distribution/distribution:docs/content/spec/auth/oauth.md gives
    it (a form with grant_type, service, scope, client_id and refresh_token; an ``access_token`` back),
    and as containers/image:docker/docker_client.go ``getBearerTokenOAuth2`` sends it."""

    forms: ClassVar[list[dict[str, str]]] = []
    open_access: ClassVar[bool] = False  # no token asked for
    drop_patch: ClassVar[int] = 0  # this upload chunk (PATCH, counted from 1) loses its connection
    patches: ClassVar[list[str]] = []

    def _serve(self) -> None:
        body = self.read_body()
        if self.path.startswith("/token"):
            form = dict(parse_qsl(body.decode())) if self.command == "POST" else {}
            self.forms.append(form)
            if form.get("grant_type") == "refresh_token" and form.get("refresh_token") == REFRESH:
                self.answer(200, json.dumps({"access_token": "access-1"}).encode(), Content_Type="application/json")
            else:
                self.answer(401)
            return
        if self.command == "PATCH":
            self.patches.append(self.path)
            if len(self.patches) == self.drop_patch:
                self.close_connection = True
                return
        if not self.open_access and self.headers.get("Authorization") != "Bearer access-1":
            realm = f"http://{self.headers['Host']}/token"
            self.answer(401, b"{}", WWW_Authenticate=f'Bearer realm="{realm}",service="fake-hub"')
            return
        answer = self.forward(body)
        self.relay(answer)
        if self.command != "HEAD":
            self.wfile.write(answer.content)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _serve


@contextmanager
def token_proxy(
    target: str, *, open_access: bool = False, drop_patch: int = 0
) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """The proxy on a free loopback port: its host:port and the token requests' forms."""

    class Proxy(_TokenProxy):
        pass

    Proxy.target, Proxy.forms, Proxy.patches = target, [], []
    Proxy.open_access, Proxy.drop_patch = open_access, drop_patch
    with serving(Proxy) as host:
        yield host, Proxy.forms


def test_an_identity_token_is_traded_for_a_registry_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = RegistryServer(tmp_path / "registry").start()
    monkeypatch.delenv(USER_ENV, raising=False)
    try:
        layout, (_, _, manifest) = tiny_layout(tmp_path / "layout")
        with token_proxy(registry.url) as (host, forms):
            entry = {"auth": b64("me:"), "identitytoken": REFRESH}  # what docker login keeps for one
            authfile = write_json(tmp_path / "auth.json", {"auths": {host: entry}})
            monkeypatch.setenv("REGISTRY_AUTH_FILE", str(authfile))
            result = push_layout(layout, Reference(host, "token/vllm", "v1"), RegistryClient(f"http://{host}"))
            assert result.digest == manifest.digest
            assert forms[0] == {
                "grant_type": "refresh_token",
                "refresh_token": REFRESH,
                "client_id": "vllm-bundle",
                "service": "fake-hub",
                "scope": "repository:token/vllm:pull,push",
            }
            write_json(authfile, {"auths": {host: {"identitytoken": "expired-s3cret"}}})
            with pytest.raises(RegistryError) as caught:
                push_layout(layout, Reference(host, "token/other", "v1"), RegistryClient(f"http://{host}"))
    finally:
        registry.stop()
    message = str(caught.value)
    assert message.endswith(f"(HTTP 401) (check the credentials from {authfile})"), message
    assert "expired-s3cret" not in message and REFRESH not in message


def test_a_resent_chunk_sets_the_blobs_progress_back(tmp_path: Path) -> None:
    """The third chunk's connection drops: the upload goes on from where the registry's session stands,
    and the progress says so (plain: a retry line between the begin and the done line)."""
    from vllm_bundle.util.policy import RetryPolicy

    registry = RegistryServer(tmp_path / "registry").start()
    try:
        layout, (_, layer, _) = tiny_layout(tmp_path / "layout")
        with token_proxy(registry.url, open_access=True, drop_patch=3) as (host, _):
            screen = io.StringIO()
            client = RegistryClient(
                f"http://{host}", RetryPolicy(backoff=0.01), sleep=lambda seconds: None, chunk_size=64 * 1024
            )
            push_layout(layout, Reference(host, "resent/vllm", "v1"), client, PlainReporter(screen))
    finally:
        registry.stop()
    key = f"push {layer.digest[:19]}"
    lines = [line for line in screen.getvalue().splitlines() if key in line]
    assert lines[:2] == [
        f"{key} ({human_size(layer.size)})",
        f"retry  {key}: a chunk failed (the connection dropped); continuing from 128.0 KiB",
    ]
    assert len(lines) == 3 and lines[2].startswith(f"done   {key} ({human_size(layer.size)} in "), lines
