"""A real OCI registry on 127.0.0.1 (the CNCF distribution registry, Debian's ``docker-registry``), and
the image base it serves in place of UBI: an index with a linux/amd64 and a linux/arm64 image, pushed
there with skopeo, an independent client.

The amd64 base holds what the bundle needs from a real one: ``/bin/sh`` and the coreutils the launcher
calls, and the system libraries (glibc, libstdc++...) the bundle's ELF files load, copied from this
machine so that the image's entrypoint runs in a chroot of its unpacked layers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import requests

from vllm_bundle.util.transport import free_port

from .server import LoopbackServer

REGISTRY_BINARIES = ("docker-registry", "registry")
INSTALL_HINT = "install Debian's docker-registry and skopeo (apt-get install docker-registry skopeo; .ci/run does)"
BASE_REPOSITORY = "ubi10/ubi-minimal"  # recipes/image.toml's base, with the registry host mirrored
BASE_TAG = "latest"
# What the launcher and the bundle's cc wrapper run (id: the wrapper's per-user cache directory); UBI
# minimal has them all (coreutils-single).
TOOLS = ("/bin/sh", "/usr/bin/dirname", "/usr/bin/readlink", "/usr/bin/env", "/usr/bin/id")


def require_tools() -> tuple[str, str]:
    """The registry and skopeo binaries; a missing one fails the test run with how to install it."""
    registry = next((path for name in REGISTRY_BINARIES if (path := shutil.which(name))), None)
    skopeo = shutil.which("skopeo")
    if registry is None or skopeo is None:
        raise RuntimeError(f"the image tests need a real registry and skopeo: {INSTALL_HINT}")
    return registry, skopeo


def bcrypt_hash(password: str) -> str:
    """``password``'s bcrypt hash, the only kind the registry's htpasswd accepts, from the C library's
    crypt (libxcrypt: libcrypt1, which Debian's perl-base and login need, so every Debian has it)."""
    name = ctypes.util.find_library("crypt")
    if name is None:
        raise RuntimeError("the registry login tests hash a password with libcrypt: apt-get install libcrypt1")
    lib = ctypes.CDLL(name)
    lib.crypt_gensalt.restype = lib.crypt.restype = ctypes.c_char_p
    lib.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    salt = lib.crypt_gensalt(b"$2b$", 5, None, 0)
    hashed = lib.crypt(password.encode(), salt) if salt else None
    if not hashed or not hashed.startswith(b"$2b$"):
        raise RuntimeError("this libcrypt has no bcrypt ($2b$): the registry login tests need libxcrypt's")
    return str(hashed.decode())


@dataclass
class RegistryServer:
    """``docker-registry serve`` with its storage in ``root`` (or ``storage``: one several registries of a
    run serve), listening on a free loopback port. With ``logins`` (user -> password), it asks for them by
    HTTP Basic auth (the registry's htpasswd auth)."""

    root: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    logins: dict[str, str] = field(default_factory=dict)
    storage: Path | None = None
    log: Path = field(init=False)

    def start(self) -> RegistryServer:
        binary, _ = require_tools()
        self.port = free_port()
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "config.yml"
        auth = ""
        if self.logins:
            htpasswd = self.root / "htpasswd"
            htpasswd.write_text("".join(f"{user}:{bcrypt_hash(pw)}\n" for user, pw in self.logins.items()))
            auth = f"auth:\n  htpasswd:\n    realm: vllm-bundle-tests\n    path: {htpasswd}\n"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage or self.root / 'data'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n" + auth
        )
        self.log = self.root / "registry.log"
        with self.log.open("wb") as log:
            # The registry reads REGISTRY_<SECTION>_<KEY> variables as its configuration: podman's
            # $REGISTRY_AUTH_FILE would be taken for an "auth: file:" section.
            env = {key: value for key, value in os.environ.items() if not key.startswith("REGISTRY_")}
            self.process = subprocess.Popen(
                [binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/v2/", timeout=1).status_code == (401 if self.logins else 200):
                    return self
            except requests.ConnectionError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the registry did not answer within 30 s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"


class RegistryProxy(BaseHTTPRequestHandler):
    """A proxy in front of a real registry (``target``), for tests that make it misbehave or ask for a
    login: subclasses decide what to answer themselves (``answer``) and relay the rest (``forward``,
    ``relay``), the registry's own URLs in its headers rewritten to the proxy's."""

    target: ClassVar[str] = ""
    #: Request headers not passed on (the proxy's host; a login the registry behind it must not see).
    DROPPED: ClassVar[tuple[str, ...]] = ("host", "content-length", "authorization")

    def answer(self, status: int, body: bytes = b"", **headers: str) -> None:
        """An answer of the proxy's own (``Retry_After=`` is the header ``Retry-After``)."""
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length", "0"))
        return self.rfile.read(length) if length else b""

    def forward(self, body: bytes) -> requests.Response:
        """The request as the registry behind the proxy answers it."""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in self.DROPPED}
        return requests.request(
            self.command, self.target + self.path, data=body or None, headers=headers, timeout=30, allow_redirects=False
        )

    def relay(self, answer: requests.Response) -> None:
        """``answer``'s status and headers sent back (its URLs made the proxy's); its body is the caller's."""
        self.send_response(answer.status_code)
        for key, value in answer.headers.items():
            if key.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                self.send_header(key, value.replace(self.target, f"http://{self.headers['Host']}"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on a free loopback port; yields its host:port."""
    server = LoopbackServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def skopeo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """skopeo against the loopback registry (plain http there: --tls-verify=false)."""
    _, binary = require_tools()
    return subprocess.run(
        [binary, "--insecure-policy", *args], capture_output=True, text=True, timeout=timeout, check=True
    )


# -- the base image -----------------------------------------------------------------------------------


def _system_closure(elf_files: list[Path], inside: Path) -> set[Path]:
    """The system libraries (outside ``inside``) that these programs and libraries load."""
    needed: set[Path] = set()
    for path in elf_files:
        result = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
        for line in result.stdout.splitlines():
            parts = line.split()
            candidates = [parts[2]] if "=>" in parts and len(parts) > 2 else parts[:1]
            for candidate in candidates:
                path = Path(candidate)
                if path.is_absolute() and path.exists() and not path.resolve().is_relative_to(inside.resolve()):
                    needed.add(path)
    return needed


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 1_700_000_000
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 1_700_000_000
    tar.addfile(info)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 1_700_000_000
    tar.addfile(info)


def _in_usr(path: Path) -> str:
    """Where a system path lives in a merged-/usr tree: /lib/x -> usr/lib/x, /usr/bin/y -> usr/bin/y."""
    text = str(path)
    return text[1:] if text.startswith("/usr/") else "usr" + text


def _base_layer(bundle_root: Path) -> bytes:
    """An uncompressed tar: the tools, their libraries and the bundle's system libraries, in a merged-/usr
    layout (/bin, /lib, /lib64 are links into /usr, as on UBI). Each file is stored under the path the
    loader asks for, with the bytes of what that path resolves to here."""
    elf = [p for p in bundle_root.rglob("*") if p.is_file() and not p.is_symlink() and _is_elf(p)]
    tools = [Path(tool) for tool in TOOLS]
    files = {
        _in_usr(path): path.resolve() for path in sorted(_system_closure([*tools, *elf], bundle_root) | set(tools))
    }
    dirs = {"etc", "tmp", "dev", "proc", "usr/bin", "usr/lib", "usr/lib64"}
    for name in files:
        parent = Path(name).parent
        while str(parent) not in ("", "."):
            dirs.add(str(parent))
            parent = parent.parent
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(dirs):
            _add_dir(tar, name, 0o1777 if name == "tmp" else 0o755)
        for name, source in sorted(files.items()):
            _add(tar, name, source.read_bytes())
        for top in ("bin", "lib", "lib64"):
            _add_link(tar, top, f"usr/{top}")
        _add(tar, "etc/os-release", b'NAME="fake UBI for vllm-bundle tests"\nID=fake\n', 0o644)
    return buffer.getvalue()


def base_rootfs(dest: Path, bundle_root: Path) -> Path:
    """The amd64 base's file system, unpacked into ``dest`` (a chroot with no compiler, libc headers,
    crt objects or linker: only the tools above and the system libraries the bundle loads)."""
    with tarfile.open(fileobj=io.BytesIO(_base_layer(bundle_root))) as tar:
        tar.extractall(dest, filter="tar")
    return dest


def _blob(layout: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _image(layout: Path, layer_tar: bytes, architecture: str) -> dict[str, object]:
    compressed = gzip.compress(layer_tar, mtime=0)
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **_blob(layout, compressed)}
    config = {
        "architecture": architecture,
        "os": "linux",
        "created": "2026-11-01T00:00:00Z",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "container=oci"],
            "Cmd": ["/bin/sh"],
            "Labels": {"name": "ubi10-minimal", "org.opencontainers.image.version": "10.0"},
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer_tar).hexdigest()}"]},
        "history": [{"created": "2026-11-01T00:00:00Z", "created_by": "fake base"}],
    }
    config_desc = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **_blob(layout, json.dumps(config).encode()),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer],
    }
    manifest_desc = _blob(layout, json.dumps(manifest, indent=2).encode())
    return {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **manifest_desc,
        "platform": {"architecture": architecture, "os": "linux"},
    }


def write_base_layout(layout: Path, bundle_root: Path) -> Path:
    """An OCI layout of the base: an index (tag ``latest``) with an arm64 image listed before amd64."""
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    arm = _image(layout, _base_layer_for_other_arch(), "arm64")
    amd = _image(layout, _base_layer(bundle_root), "amd64")
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [arm, amd]}
    index_desc = {"mediaType": "application/vnd.oci.image.index.v1+json", **_blob(layout, json.dumps(index).encode())}
    index_desc["annotations"] = {"org.opencontainers.image.ref.name": BASE_TAG}
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(
        json.dumps(
            {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [index_desc]}
        )
    )
    return layout


def _base_layer_for_other_arch() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add(tar, "etc/os-release", b'NAME="the arm64 image: never chosen for amd64"\n', 0o644)
    return buffer.getvalue()


def push_base(registry: RegistryServer, layout: Path) -> None:
    """Publish the base under ``BASE_REPOSITORY:latest`` with skopeo (the whole index)."""
    skopeo(
        "copy",
        "--all",
        "--dest-tls-verify=false",
        f"oci:{layout}:{BASE_TAG}",
        f"docker://{registry.host}/{BASE_REPOSITORY}:{BASE_TAG}",
    )
