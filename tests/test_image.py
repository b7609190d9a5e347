"""The OCI image (issue #14): built from the fixture bundle on a base served by a real registry on
loopback, reproducible, pushed with retries, pulled back by skopeo, run from its entrypoint, and its
KServe manifests checked against KServe's API models."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import shutil
import socket
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
import yaml

from tests.conftest import (
    TEST_REPO,
    assert_one_line_error,
    bundle_args,
    copy_recipes,
    run_cli,
    shuffled_order,
    small_disk,
    tree_digest,
)
from tests.upstream.fixture import PYTHON_MINOR, ROCM_VERSION
from tests.upstream.registry import (
    BASE_REPOSITORY,
    RegistryProxy,
    RegistryServer,
    push_base,
    serving,
    skopeo,
    write_base_layout,
)
from tests.upstream.server import UpstreamServer
from vllm_bundle.oci.image import image_reference
from vllm_bundle.oci.layout import LayerRule, Layout, split_tree, write_layer

TARGET = "gfx1151"
LAUNCHER = "/opt/vllm/bin/vllm-server"


# -- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry(builder_registry: RegistryServer) -> RegistryServer:
    """The loopback registry: the one that serves the builder images (``--registry-mirror`` names one
    registry for every image, as a mirror of a user's serves them all), the image base pushed there too."""
    return builder_registry


@pytest.fixture(scope="module")
def base_published(registry: RegistryServer, built: Path, tmp_path_factory: pytest.TempPathFactory) -> RegistryServer:
    """The fake UBI base, pushed by skopeo to the loopback registry as ubi10/ubi-minimal:latest."""
    layout = write_base_layout(tmp_path_factory.mktemp("base") / "layout", built / TARGET / "root")
    push_base(registry, layout)
    return registry


def image_args(locked: Path, upstream: UpstreamServer, registry: RegistryServer, work: Path) -> list[str]:
    """``image gfx1151`` against the fake upstream, the builder and the base from the loopback registry."""
    args = bundle_args(locked, upstream, work / "build", work / "cache", registry)
    return ["image", *args[1:]]


@pytest.fixture(scope="module")
def repro(
    locked: Path, _server: UpstreamServer, base_published: RegistryServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.CompletedProcess[str], Path]]:
    """``verify-repro gfx1151 --image``: two builds (other directories, umask, TZ, one CPU), each listing
    its folders in an order of its own, shuffled anew at every read (``shuffled_order``): what the run
    compares against is the suite's own build (``built``), whose folders list in the usual order."""
    work = tmp_path_factory.mktemp("image-repro")
    args = image_args(locked, _server, base_published, work)[2:]  # without "image gfx1151"
    with shuffled_order(work / "runs-unshuffled", work / "runs") as runs:
        result = run_cli("verify-repro", TARGET, "--work", runs, *args, "--image", timeout=900)
        yield result, runs


@pytest.fixture(scope="module")
def image_dir(repro: tuple[subprocess.CompletedProcess[str], Path]) -> Path:
    result, runs = repro
    assert result.returncode == 0, result.stdout + result.stderr
    return runs / "run1" / "build" / TARGET / "image"


def blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def manifest_and_config(layout: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    index = json.loads((layout / "index.json").read_bytes())
    (entry,) = index["manifests"]
    manifest = json.loads(blob(layout, entry["digest"]).read_bytes())
    config = json.loads(blob(layout, manifest["config"]["digest"]).read_bytes())
    return entry["digest"], manifest, config


def layer_names(layout: Path, descriptor: dict[str, Any]) -> list[str]:
    with tarfile.open(blob(layout, descriptor["digest"]), "r:gz") as tar:
        return tar.getnames()


# -- reproducibility -----------------------------------------------------------------------------------


def test_two_builds_give_the_same_image_digest_and_byte_identical_layers(
    repro: tuple[subprocess.CompletedProcess[str], Path], built: Path
) -> None:
    """The one verify-repro run of the suite (two full builds): the assets and the image are each
    byte-identical across the two builds, and the assets are those of the suite's own first build."""
    result, runs = repro
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("build  1 of 2 (TZ=UTC, umask 022): "), "each build announced, then its output"
    assert any(line.startswith("  2| stage  python") for line in lines), "the builds' lines shown as they come"
    tag = f"vllm0.33.0-rocm{ROCM_VERSION}-{TARGET}"
    assets = tree_digest(runs / "run2" / "bundles" / tag)
    assert assets == tree_digest(built.parent / "bundles" / tag), "the same assets as the first build here"
    layouts = [runs / run / "build" / TARGET / "image" / "oci" for run in ("run1", "run2")]
    digests = [manifest_and_config(layout)[0] for layout in layouts]
    assert digests[0] == digests[1]
    assert f"the image {digests[0]} are byte-identical across two builds" in result.stdout
    names = [sorted(p.name for p in (layout / "blobs" / "sha256").iterdir()) for layout in layouts]
    assert names[0] == names[1]
    for name in names[0]:
        assert (layouts[0] / "blobs" / "sha256" / name).read_bytes() == (
            layouts[1] / "blobs" / "sha256" / name
        ).read_bytes()
    assert (layouts[0] / "index.json").read_bytes() == (layouts[1] / "index.json").read_bytes()


def test_a_changed_layer_is_named_down_to_its_member(image_dir: Path, tmp_path: Path) -> None:
    from vllm_bundle.qualify.repro import compare_layouts

    other = tmp_path / "other"
    shutil.copytree(image_dir / "oci", other)
    digest, manifest, _ = manifest_and_config(other)
    last = manifest["layers"][-1]
    with tarfile.open(blob(other, last["digest"]), "r:gz") as tar:
        members = [(m, tar.extractfile(m).read() if m.isreg() else None) for m in tar.getmembers()]  # type: ignore[union-attr]
    rewritten = tmp_path / "layer.tar.gz"
    # (level 1: the layer is re-compressed only to give it another digest)
    with gzip.open(rewritten, "wb", compresslevel=1) as raw, tarfile.open(fileobj=raw, mode="w|") as tar:
        for member, data in members:
            if member.name == LAUNCHER.lstrip("/"):
                member.mode = 0o700
            tar.addfile(member, None if data is None else __import__("io").BytesIO(data))
    new_digest = "sha256:" + hashlib.sha256(rewritten.read_bytes()).hexdigest()
    shutil.copyfile(rewritten, blob(other, new_digest))
    manifest["layers"][-1] = {**last, "digest": new_digest, "size": rewritten.stat().st_size}
    data = json.dumps(manifest).encode()
    manifest_digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blob(other, manifest_digest).write_bytes(data)
    index = json.loads((other / "index.json").read_bytes())
    index["manifests"][0]["digest"] = manifest_digest
    (other / "index.json").write_text(json.dumps(index))
    assert digest != manifest_digest
    (difference,) = compare_layouts(image_dir / "oci", other)
    assert difference == "image layer vllm: member opt/vllm/bin/vllm-server: mode 0o755 != 0o700"


# -- what the image holds ------------------------------------------------------------------------------


def test_the_image_is_the_bundle_on_the_locked_base_with_labels_and_annotations(image_dir: Path) -> None:
    layout = image_dir / "oci"
    digest, manifest, config = manifest_and_config(layout)
    record = json.loads((image_dir / "image.json").read_bytes())
    assert record["digest"] == digest
    tag = record["tag"]
    assert tag.startswith("vllm") and tag.endswith(f"-{TARGET}")
    index = json.loads((layout / "index.json").read_bytes())
    assert index["manifests"][0]["annotations"] == {"org.opencontainers.image.ref.name": tag}
    assert index["manifests"][0]["platform"] == {"architecture": "amd64", "os": "linux"}

    assert config["config"]["Entrypoint"] == [LAUNCHER]
    assert "Cmd" not in config["config"], "the base's /bin/sh command is not kept"
    env = dict(item.split("=", 1) for item in config["config"]["Env"])
    assert env["PATH"].startswith("/usr/local/sbin"), "the base's environment is kept"
    assert env["HF_HOME"] == "/tmp/hf_home"
    assert config["config"]["ExposedPorts"] == {"8000/tcp": {}}
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == tag
    assert labels["org.opencontainers.image.ref.name"] == tag
    assert labels["org.opencontainers.image.source"] == f"https://github.com/{TEST_REPO}"
    assert len(labels["org.opencontainers.image.revision"]) == 40
    assert labels["org.opencontainers.image.base.name"] == "registry.access.redhat.com/ubi10/ubi-minimal:latest"
    annotations = manifest["annotations"]
    assert annotations["dev.vllm-bundle.target"] == TARGET
    assert annotations["dev.vllm-bundle.isas"] == "gfx1151"
    assert annotations["org.opencontainers.image.base.digest"] == labels["org.opencontainers.image.base.digest"]

    # One base layer, then the bundle's: the ROCm SDK apart from vLLM.
    base_layer, *ours = manifest["layers"]
    assert "annotations" not in base_layer
    names = [layer["annotations"]["dev.vllm-bundle.layer"] for layer in ours]
    assert names == ["rocm", "torch", "vllm"]
    assert len(config["rootfs"]["diff_ids"]) == len(manifest["layers"]) == len(config["history"])
    for descriptor, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
        data = blob(layout, descriptor["digest"]).read_bytes()
        assert descriptor["size"] == len(data)
        assert "sha256:" + hashlib.sha256(gzip.decompress(data)).hexdigest() == diff_id

    site = f"opt/vllm/lib/python{PYTHON_MINOR}/site-packages"
    rocm, torch, rest = (set(layer_names(layout, layer)) for layer in ours)
    assert f"{site}/_rocm_sdk_core/lib/libamdhip64.so.7" in rocm
    assert all(n.startswith(f"{site}/_rocm_sdk_") or n.startswith(f"{site}/rocm") or site.startswith(n) for n in rocm)
    assert f"{site}/torch/__init__.py" in torch and f"{site}/torch/__init__.py" not in rest
    assert LAUNCHER.lstrip("/") in rest and f"opt/vllm/bin/python{PYTHON_MINOR}" in rest
    assert not any("_rocm_sdk_" in n for n in rest | torch)


def _unpack(layout: Path, manifest: dict[str, Any], rootfs: Path) -> None:
    for descriptor in manifest["layers"]:
        with tarfile.open(blob(layout, descriptor["digest"]), "r:gz") as tar:
            tar.extractall(rootfs, filter="tar")


def test_the_entrypoint_runs_the_launcher_in_a_chroot_of_the_layers(image_dir: Path, tmp_path: Path) -> None:
    layout = image_dir / "oci"
    _, manifest, config = manifest_and_config(layout)
    rootfs = tmp_path / "rootfs"
    _unpack(layout, manifest, rootfs)
    env = dict(item.split("=", 1) for item in config["config"]["Env"])
    args = ["--model", "/mnt/models", "--port", "8080"]
    # As a container runtime does: new mount and PID namespaces with /proc (the loader finds $ORIGIN there).
    namespaces = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={rootfs / 'proc'}"]
    result = subprocess.run(
        [*namespaces, "chroot", str(rootfs), *config["config"]["Entrypoint"], *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["executable"] == f"/opt/vllm/bin/python{PYTHON_MINOR}"
    assert report["torch"].startswith("/opt/vllm/"), "the image's torch"
    assert report["hip_check"] == 17, "torch's native extension reached libamdhip64 inside the image"
    assert report["argv"] == ["serve", *args, "--attention-backend", "TRITON_ATTN"], "Triton attention by default"


# -- push, pull back, retries --------------------------------------------------------------------------


def test_push_then_pull_back_with_skopeo_gives_the_same_image(
    locked: Path, upstream: UpstreamServer, base_published: RegistryServer, image_dir: Path, tmp_path: Path
) -> None:
    registry = base_published
    work = image_dir.parent.parent.parent  # run1: the stages are built already
    args = [*image_args(locked, upstream, registry, work), "--push", f"{registry.host}/example/vllm-rocm"]
    result = run_cli(*args, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    digest, manifest, _ = manifest_and_config(image_dir / "oci")
    tag = json.loads((image_dir / "image.json").read_bytes())["tag"]
    assert "stage  image       cached" in result.stdout, "a push rebuilds nothing"
    assert f"pushed {registry.host}/example/vllm-rocm:{tag}@{digest}" in result.stdout
    assert f"({len(manifest['layers']) + 1} blobs sent, 0 already there)" in result.stdout
    progress = [line for line in result.stderr.splitlines() if line.startswith(("push sha256:", "done   push sha256:"))]
    assert len(progress) == 2 * (len(manifest["layers"]) + 1), "plain progress: a begin and a done line per blob"

    remote = f"docker://{registry.host}/example/vllm-rocm:{tag}"
    raw = skopeo("inspect", "--raw", "--tls-verify=false", remote).stdout.encode()
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest, "the registry holds our exact manifest"
    pulled = tmp_path / "pulled"
    skopeo("copy", "--src-tls-verify=false", remote, f"oci:{pulled}:{tag}")
    assert manifest_and_config(pulled)[0] == digest
    for path in (pulled / "blobs" / "sha256").iterdir():
        assert path.read_bytes() == blob(image_dir / "oci", path.name).read_bytes()

    # The push takes the image's tag and digest from the image stage's result, not from image.json on
    # disk (#35, point 3): without the file a push of the cached stage is the same.
    record = image_dir / "image.json"
    record.rename(record.with_name("image.json.away"))
    try:
        again = run_cli(*args, timeout=600)
    finally:
        record.with_name("image.json.away").rename(record)
    assert again.returncode == 0, again.stderr
    assert f"pushed {registry.host}/example/vllm-rocm:{tag}@{digest}" in again.stdout
    assert f"(0 blobs sent, {len(manifest['layers']) + 1} already there)" in again.stdout
    assert "push sha256:" not in again.stderr

    # The bundle's SBOM is attached to the image as an OCI 1.1 referrer; this registry (distribution 2.8)
    # has no referrers API, so the spec's fallback tag lists it, once however often the image is pushed.
    assert "sbom   " in result.stdout and "attached to the image as sha256:" in result.stdout
    fallback = f"docker://{registry.host}/example/vllm-rocm:{digest.replace(':', '-')}"
    referrers = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", fallback).stdout)
    (entry,) = referrers["manifests"]
    assert entry["artifactType"] == "application/vnd.cyclonedx+json"
    at = f"docker://{registry.host}/example/vllm-rocm@{entry['digest']}"
    artifact = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", at).stdout)
    assert artifact["subject"]["digest"] == digest
    sbom = work / "bundles" / tag / f"{tag}-x64.cdx.json"
    assert artifact["layers"][0]["digest"] == "sha256:" + hashlib.sha256(sbom.read_bytes()).hexdigest()

    # The KServe manifests name what was pushed, by digest.
    runtime = yaml.safe_load((image_dir.parent / "kserve" / "servingruntime.yaml").read_text())
    assert runtime["spec"]["containers"][0]["image"] == f"{registry.host}/example/vllm-rocm:{tag}@{digest}"


class _FlakyProxy(RegistryProxy):
    """Forwards to the registry, misbehaving as ``faults`` says: the first upload start answered 503
    (Retry-After: 0), an upload body's connection dropped, a manifest PUT answered 500. With ``token``
    set it plays a token-auth registry as GHCR does: 401 with a Bearer challenge, and a token endpoint
    that hands ``token`` out for the Basic credentials user:secret only."""

    faults: ClassVar[dict[str, int]] = {}
    drop_nth: ClassVar[dict[str, int]] = {}  # kind -> which request of that kind loses its connection
    seen: ClassVar[list[str]] = []
    body_bytes: ClassVar[dict[str, int]] = {}
    token: ClassVar[str | None] = None
    garble: ClassVar[frozenset[str]] = frozenset()  # kinds whose answers become an HTML page
    cut_after: ClassVar[dict[str, int]] = {}  # kind -> the next answer's body breaks off after so many bytes
    ranges: ClassVar[list[str]] = []  # the Range headers of the requests seen

    def _refused(self) -> bool:
        """Token auth: True when this request was answered here (the token endpoint, or a 401)."""
        if self.token is None:
            return False
        if self.path.startswith("/token"):
            if self.headers.get("Authorization") == "Basic " + base64.b64encode(b"user:secret").decode():
                self.answer(200, json.dumps({"token": self.token}).encode(), Content_Type="application/json")
            else:
                self.answer(401)
            return True
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            realm = f"http://{self.headers['Host']}/token"
            challenge = f'Bearer realm="{realm}",service="fake-ghcr",scope="repository:any:pull"'
            self.answer(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', WWW_Authenticate=challenge)
            return True
        return False

    def _forward(self) -> None:
        body = self.read_body()
        if self._refused():
            return
        what = "manifest" if "/manifests/" in self.path else "upload" if "/uploads/" in self.path else "blob"
        kind = f"{self.command} {what}"
        self.seen.append(kind)
        if "Range" in self.headers:
            self.ranges.append(self.headers["Range"])
        self.body_bytes[kind] = self.body_bytes.get(kind, 0) + len(body)
        if self.drop_nth.get(kind) == self.seen.count(kind):
            self.close_connection = True
            return
        if self.faults.get(kind, 0) > 0:
            self.faults[kind] -= 1
            if kind == "PUT upload":  # the connection drops, no answer at all
                self.close_connection = True
                return
            self.answer(503 if self.command == "POST" else 500, Retry_After="0")
            return
        answer = self.forward(body)
        if kind in self.garble:
            self.answer(200, b"<html>a captive portal</html>", Content_Type=answer.headers.get("content-type", ""))
            return
        self.relay(answer)
        cut = self.cut_after.pop(kind, None) if self.command != "HEAD" else None
        if cut is not None:  # the connection breaks off mid-body
            self.wfile.write(answer.content[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.command != "HEAD":
            self.wfile.write(answer.content)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _forward


def test_push_retries_refused_and_dropped_uploads(base_published: RegistryServer, image_dir: Path) -> None:
    from vllm_bundle.oci.registry import Reference, RegistryClient, push_layout
    from vllm_bundle.util.policy import RetryPolicy

    class Proxy(_FlakyProxy):
        target = base_published.url
        faults: ClassVar[dict[str, int]] = {"POST upload": 1, "PUT upload": 1, "PUT manifest": 1}
        seen: ClassVar[list[str]] = []

    with serving(Proxy) as host:
        client = RegistryClient(f"http://{host}", RetryPolicy(backoff=0.01), sleep=lambda seconds: None)
        result = push_layout(image_dir / "oci", Reference(host, "retried/vllm", "v1"), client)
    digest = manifest_and_config(image_dir / "oci")[0]
    assert result.digest == digest
    assert Proxy.faults == {"POST upload": 0, "PUT upload": 0, "PUT manifest": 0}, "every fault was met"
    assert Proxy.seen.count("PUT manifest") == 2
    raw = skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{base_published.host}/retried/vllm:v1").stdout
    assert "sha256:" + hashlib.sha256(raw.encode()).hexdigest() == digest


def test_a_large_blob_goes_up_in_chunks_and_resumes_after_a_dropped_one(
    base_published: RegistryServer, image_dir: Path
) -> None:
    from vllm_bundle.oci.layout import Descriptor
    from vllm_bundle.oci.registry import RegistryClient
    from vllm_bundle.util.policy import RetryPolicy

    layout = image_dir / "oci"
    _, manifest, _ = manifest_and_config(layout)
    largest = Descriptor.from_json(max(manifest["layers"], key=lambda layer: layer["size"]))
    chunk = 4 * 1024 * 1024
    assert largest.size > 4 * chunk, "the fixture's largest layer spans several chunks"

    class Proxy(_FlakyProxy):
        target = base_published.url
        faults: ClassVar[dict[str, int]] = {}
        drop_nth: ClassVar[dict[str, int]] = {"PATCH upload": 3}
        seen: ClassVar[list[str]] = []
        body_bytes: ClassVar[dict[str, int]] = {}

    with serving(Proxy) as host:
        client = RegistryClient(
            f"http://{host}", RetryPolicy(backoff=0.01), sleep=lambda seconds: None, chunk_size=chunk
        )
        client.push_blob("chunked/vllm", largest, lambda: blob(layout, largest.digest).open("rb"))
    chunks = -(-largest.size // chunk)
    assert Proxy.seen.count("PATCH upload") == chunks + 1, "one chunk was sent twice"
    assert Proxy.body_bytes["PATCH upload"] == largest.size + chunk, "resumed after the dropped chunk, not from 0"
    assert Proxy.seen.count("GET upload") == 1, "the session's Range was asked once"
    pulled = requests.get(f"{base_published.url}/v2/chunked/vllm/blobs/{largest.digest}", timeout=60)
    assert pulled.content == blob(layout, largest.digest).read_bytes()


def test_push_trades_credentials_for_a_bearer_token(
    base_published: RegistryServer, image_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_bundle.errors import RegistryError
    from vllm_bundle.oci.auth import PASSWORD_ENV, USER_ENV
    from vllm_bundle.oci.registry import Reference, RegistryClient, push_layout

    class Proxy(_FlakyProxy):
        target = base_published.url
        faults: ClassVar[dict[str, int]] = {}
        seen: ClassVar[list[str]] = []
        token = "t0k3n"

    layout = image_dir / "oci"
    with serving(Proxy) as host:
        destination = Reference(host, "private/vllm", "v1")
        monkeypatch.delenv(USER_ENV, raising=False)
        with pytest.raises(
            RegistryError,
            match=rf"refused a token .* \(set \${USER_ENV} and \${PASSWORD_ENV}, or run `docker login {host}`",
        ):
            push_layout(layout, destination, RegistryClient(f"http://{host}"))
        monkeypatch.setenv(USER_ENV, "user")
        monkeypatch.setenv(PASSWORD_ENV, "wrong")
        with pytest.raises(RegistryError, match=rf"refused a token .* \(check the credentials from \${USER_ENV}\)"):
            push_layout(layout, destination, RegistryClient(f"http://{host}"))
        monkeypatch.setenv(PASSWORD_ENV, "secret")
        result = push_layout(layout, destination, RegistryClient(f"http://{host}"))
    assert result.digest == manifest_and_config(layout)[0]


# -- KServe --------------------------------------------------------------------------------------------


def _model_class(name: str) -> Any:
    import kserve.models
    import kubernetes.client

    return getattr(kserve.models, name, None) or getattr(kubernetes.client, name)


PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "object": (object,),
}


def check_against_model(doc: Any, type_name: str, where: str) -> None:
    """``doc`` against KServe's (and Kubernetes') generated API models: every key known, every value of
    its declared type, every required field present. Hand-written: kserve's ApiClient cannot resolve
    the Kubernetes types its models refer to, and drops unknown keys silently."""
    if type_name.lower().startswith("list["):
        assert isinstance(doc, list), f"{where}: expected a list"
        for number, item in enumerate(doc):
            check_against_model(item, type_name[5:-1], f"{where}[{number}]")
    elif type_name.startswith(("dict(", "Dict[")):
        assert isinstance(doc, dict), f"{where}: expected a map"
        value_type = type_name[5:-1].split(", ", 1)[1]
        for key, value in doc.items():
            check_against_model(value, value_type, f"{where}.{key}")
    elif type_name in PRIMITIVES:
        assert isinstance(doc, PRIMITIVES[type_name]), f"{where}: expected {type_name}, got {doc!r}"
    else:
        model = _model_class(type_name)
        assert isinstance(doc, dict), f"{where}: expected a {type_name} object"
        keys = {key: attr for attr, key in model.attribute_map.items()}
        unknown = sorted(set(doc) - set(keys))
        assert not unknown, f"{where}: {type_name} has no field {unknown[0]!r}"
        for key, value in doc.items():
            check_against_model(value, model.openapi_types[keys[key]], f"{where}.{key}")
        model(**{keys[key]: value for key, value in doc.items()})  # raises on a missing required field


@pytest.mark.parametrize(
    ("name", "model"),
    [("servingruntime.yaml", "V1alpha1ServingRuntime"), ("inferenceservice.yaml", "V1beta1InferenceService")],
)
def test_kserve_manifests_match_kserves_api(image_dir: Path, name: str, model: str) -> None:
    doc = yaml.safe_load((image_dir.parent / "kserve" / name).read_text())
    check_against_model(doc, model, name)


def test_the_model_check_catches_a_wrong_manifest(image_dir: Path) -> None:
    doc = yaml.safe_load((image_dir.parent / "kserve" / "servingruntime.yaml").read_text())
    doc["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(AssertionError, match="V1Container has no field 'imagePullPolicyy'"):
        check_against_model(doc, "V1alpha1ServingRuntime", "runtime")
    del doc["spec"]["containers"][0]["imagePullPolicyy"]
    doc["spec"]["containers"][0]["ports"][0]["containerPort"] = "8080"
    with pytest.raises(AssertionError, match="expected int"):
        check_against_model(doc, "V1alpha1ServingRuntime", "runtime")


def test_the_kserve_runtime_asks_for_an_amd_gpu_and_keeps_the_launcher(image_dir: Path) -> None:
    digest = manifest_and_config(image_dir / "oci")[0]
    runtime = yaml.safe_load((image_dir.parent / "kserve" / "servingruntime.yaml").read_text())
    service = yaml.safe_load((image_dir.parent / "kserve" / "inferenceservice.yaml").read_text())
    (container,) = runtime["spec"]["containers"]
    tag = json.loads((image_dir / "image.json").read_bytes())["tag"]
    assert container["image"].endswith(f":{tag}@{digest}"), "pinned by digest (a push test may have named its registry)"
    assert (
        image_reference("ghcr.io/{repo}", TEST_REPO, tag, digest)
        == f"ghcr.io/example-org/vllm-rocm-bundles:{tag}@{digest}"
    )
    assert "command" not in container, "the image's entrypoint (the launcher) runs"
    assert "--attention-backend=TRITON_ATTN" in container["args"]
    assert container["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"] == f"vllm-rocm-{TARGET}"
    assert model["resources"]["limits"]["amd.com/gpu"] == "1"


# -- the base lock and user errors ---------------------------------------------------------------------


def test_lock_image_pins_the_amd64_manifest_of_the_base(
    base_published: RegistryServer, locked: Path, tmp_path: Path
) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(locked, recipes, ignore=shutil.ignore_patterns("image-base.json"))
    result = run_cli(
        "lock",
        "--image",
        "--recipes",
        recipes,
        "--cache-dir",
        tmp_path / "cache",
        "--registry-mirror",
        base_published.host,
    )
    assert result.returncode == 0, result.stderr
    lock = json.loads((recipes / "locks" / "image-base.json").read_text())
    remote = f"docker://{base_published.host}/{BASE_REPOSITORY}:latest"
    index_raw = skopeo("inspect", "--raw", "--tls-verify=false", remote).stdout.encode()
    index = json.loads(index_raw)
    (amd64,) = [m for m in index["manifests"] if m["platform"]["architecture"] == "amd64"]
    assert lock["manifest"]["digest"] == amd64["digest"]
    assert lock["index_digest"] == "sha256:" + hashlib.sha256(index_raw).hexdigest()
    assert f"locked image base registry.access.redhat.com/ubi10/ubi-minimal:latest: {amd64['digest']}" in result.stdout

    check = run_cli("lock", "--check", "--recipes", recipes)
    assert check.returncode == 0, check.stderr
    base = "registry.access.redhat.com/ubi10/ubi-minimal:latest"
    assert f"ok     image base {base}: lock matches its recipe ({amd64['digest']})" in check.stdout

    # A lock edited by hand (another layer digest): refused before anything is built or downloaded.
    edited = dict(lock, layers=[dict(lock["layers"][0], digest="sha256:" + "0" * 64)])
    (recipes / "locks" / "image-base.json").write_text(json.dumps(edited))
    common = ("--recipes", recipes, "--cache-dir", tmp_path / "cache", "--repo", TEST_REPO, "--locked", "--no-builder")
    tampered = run_cli("image", TARGET, *common, "--registry-mirror", base_published.host)
    assert_one_line_error(tampered, "does not list the blobs of the manifest", "edited by hand")
    # A digest that is not one (a path, say) is refused before it names any file.
    escaping = dict(lock, config=dict(lock["config"], digest="sha256:../../../../escaped"))
    (recipes / "locks" / "image-base.json").write_text(json.dumps(escaping))
    refused = run_cli("image", TARGET, *common, "--registry-mirror", base_published.host)
    assert_one_line_error(refused, "'sha256:../../../../escaped' is not a sha256 digest")
    assert not list(tmp_path.rglob("escaped*"))
    # --offline with the base not in the cache: one line, no network.
    (recipes / "locks" / "image-base.json").write_text(json.dumps(lock))
    offline = run_cli("image", TARGET, *common[:2], "--cache-dir", tmp_path / "empty", *common[4:], "--offline")
    assert_one_line_error(offline, "--offline: 3 blobs of the image base", "without --offline")

    # Another base in the recipe: the lock is stale, and --locked refuses it in one line.
    recipe = recipes / "image.toml"
    recipe.write_text(recipe.read_text().replace("ubi10/ubi-minimal:latest", "ubi10/ubi-minimal:10.1"))
    stale = run_cli(
        "image", TARGET, "--recipes", recipes, "--locked", "--cache-dir", tmp_path / "cache", "--repo", TEST_REPO
    )
    assert_one_line_error(stale, "pins registry.access.redhat.com/ubi10/ubi-minimal:latest", "lock --image")


def test_user_errors_are_one_line(base_published: RegistryServer, locked: Path, tmp_path: Path) -> None:
    common = ("--recipes", locked, "--cache-dir", tmp_path / "cache", "--repo", TEST_REPO)
    forced = run_cli("bundle", TARGET, *common, "--force", "image")
    assert_one_line_error(forced, "--force image redoes the image stage", "add --image")
    no_archive = run_cli("image", TARGET, *common, "--no-archive")
    assert_one_line_error(no_archive, "the image needs the release stage", "drop --no-archive")
    bad_push = run_cli("bundle", TARGET, *common, "--push", "vllm-rocm")
    assert_one_line_error(bad_push, "is not an image reference", "ghcr.io/OWNER/vllm-rocm")
    upper = run_cli("bundle", TARGET, *common, "--push", "ghcr.io/Example-Org/vllm-rocm")
    assert_one_line_error(upper, "is not an image reference", "repository names are lower case")
    recipes = copy_recipes(tmp_path / "recipes")
    closed = run_cli("lock", "--image", "--recipes", recipes, "--registry-mirror", "127.0.0.1:9", "--retries", "1")
    assert_one_line_error(closed, "cannot reach http://127.0.0.1:9: connection refused")
    recipe = recipes / "image.toml"
    recipe.write_text(recipe.read_text().replace("ubi10/ubi-minimal:latest", "ubi10/nothing-here:latest"))
    missing = run_cli(
        "lock",
        "--image",
        "--recipes",
        recipes,
        "--registry-mirror",
        base_published.host,
        "--cache-dir",
        tmp_path / "c2",
    )
    assert_one_line_error(missing, "cannot read the manifest ubi10/nothing-here:latest: HTTP 404")
    assert not (recipes / "locks" / "image-base.json").exists(), "no lock is written for a base that was not found"


def test_layer_rules_split_the_tree_and_keep_links_within_a_layer(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "lib" / "sdk").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "lib" / "sdk" / "big.so").write_bytes(b"rocm")
    (root / "bin" / "tool").write_bytes(b"tool")
    (root / "lib" / "sdk" / "alias.so").hardlink_to(root / "lib" / "sdk" / "big.so")
    (root / "bin" / "copy.so").hardlink_to(root / "lib" / "sdk" / "big.so")
    rules = [LayerRule("rocm", ("lib/sdk",)), LayerRule("rest", ())]
    layers = {rule.name: [name for name, _ in entries] for rule, entries in split_tree(root, rules)}
    assert layers == {
        "rocm": ["./", "./lib", "./lib/sdk", "./lib/sdk/alias.so", "./lib/sdk/big.so"],
        "rest": ["./", "./bin", "./bin/copy.so", "./bin/tool", "./lib"],  # a directory only above a rule's paths
    }
    layout = Layout(tmp_path / "layout")
    written = {}
    for rule, entries in split_tree(root, rules):
        path, *_ = write_layer(layout, root, entries, "/opt/vllm", 6)
        with tarfile.open(path, "r:gz") as tar:
            written[rule.name] = {m.name: (m.type, m.linkname) for m in tar.getmembers()}
    assert written["rocm"]["opt/vllm/lib/sdk/big.so"] == (tarfile.LNKTYPE, "opt/vllm/lib/sdk/alias.so")
    assert written["rest"]["opt/vllm/bin/copy.so"] == (tarfile.REGTYPE, ""), "no link into another layer"
    assert next(iter(written["rest"])) == "opt", "each layer holds the directories above the bundle"
    with pytest.raises(Exception, match="the last layer rule must take the rest"):
        split_tree(root, [LayerRule("rocm", ("lib/sdk",))])


def test_a_full_disk_while_downloading_a_base_layer_leaves_no_partial_file(
    base_published: RegistryServer, tmp_path: Path
) -> None:
    from vllm_bundle.errors import DiskFullError
    from vllm_bundle.oci.layout import Descriptor
    from vllm_bundle.oci.registry import RegistryClient, platform_manifest
    from vllm_bundle.util.cache import Cache

    client = RegistryClient(base_published.url)
    data, *_ = platform_manifest(client, BASE_REPOSITORY, "latest", {"architecture": "amd64", "os": "linux"})
    layer = Descriptor.from_json(json.loads(data)["layers"][0])
    assert layer.size > 1024 * 1024
    with small_disk(tmp_path / "disk", "512k") as disk:
        cache = Cache(disk / "cache")
        with pytest.raises(DiskFullError, match="disk full while downloading"):
            client.blob_into(BASE_REPOSITORY, layer, cache)
        assert not list((disk / "cache" / "partial").iterdir()), "the partial download is removed"
        assert not cache.has(layer.digest.removeprefix("sha256:"), None)


def test_a_cut_base_layer_download_resumes_where_it_stopped(base_published: RegistryServer, tmp_path: Path) -> None:
    """Issue #21 (7): a base layer comes through the fetcher's resumable path, not one plain stream."""
    import io

    from vllm_bundle.oci.layout import Descriptor
    from vllm_bundle.oci.registry import RegistryClient, platform_manifest
    from vllm_bundle.util.cache import Cache
    from vllm_bundle.util.policy import RetryPolicy
    from vllm_bundle.util.progress import PlainReporter

    class Proxy(_FlakyProxy):
        target = base_published.url
        faults: ClassVar[dict[str, int]] = {}
        cut_after: ClassVar[dict[str, int]] = {"GET blob": 200_000}
        seen: ClassVar[list[str]] = []
        ranges: ClassVar[list[str]] = []

    with serving(Proxy) as host:
        client = RegistryClient(f"http://{host}", RetryPolicy(attempts=3, backoff=0.01, read_timeout=5.0))
        data, *_ = platform_manifest(client, BASE_REPOSITORY, "latest", {"architecture": "amd64", "os": "linux"})
        layer = Descriptor.from_json(json.loads(data)["layers"][0])
        assert layer.size > 1024 * 1024
        log = io.StringIO()
        path = client.blob_into(BASE_REPOSITORY, layer, Cache(tmp_path / "cache"), PlainReporter(log))
    assert "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest() == layer.digest
    assert Proxy.seen.count("GET blob") == 2, "one cut, one resume"
    assert Proxy.ranges == ["bytes=200000-"], "the resume asked only for what was missing"
    assert "retry" in log.getvalue()


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        (
            [('[[layer]]\nname = "vllm"', '[[layer]]\nname = "vllm"\npaths = ["bin"]')],
            "the last [[layer]] must have no",
        ),
        ([('prefix = "/opt/vllm"', 'prefix = "/"')], "image.prefix is '/', not an absolute directory other than /"),
        ([('reference = "registry.access.redhat.com/', 'reference = "')], "'ubi10/ubi-minimal:latest' is not an image"),
        ([("[[layer]]", "[[other]]"), ("[base]", "layer = [1]\n[base]")], "layer[0] is an integer, not a table"),
    ],
)
def test_a_bad_image_recipe_is_one_line(tmp_path: Path, edits: list[tuple[str, str]], message: str) -> None:
    recipes = copy_recipes(tmp_path / "recipes")
    recipe = recipes / "image.toml"
    text = recipe.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    recipe.write_text(text)
    result = run_cli("lock", "--image", "--recipes", recipes, "--registry-mirror", "127.0.0.1:9")
    assert_one_line_error(result, message)


def test_kserve_manifests_for_an_older_vllm_set_the_backend_by_environment(tmp_path: Path) -> None:
    from packaging.specifiers import SpecifierSet

    from vllm_bundle.oci.kserve import render_kserve
    from vllm_bundle.recipes import AttentionRule

    rule = AttentionRule(SpecifierSet("<0.13"), "TRITON_ATTN", None, "VLLM_ATTENTION_BACKEND")
    image = "ghcr.io/example/vllm-rocm:v@sha256:" + "1" * 64
    runtime_path, service_path = render_kserve(image, "gfx110X", rule, tmp_path)
    runtime = yaml.safe_load(runtime_path.read_text())
    check_against_model(runtime, "V1alpha1ServingRuntime", "runtime")
    check_against_model(yaml.safe_load(service_path.read_text()), "V1beta1InferenceService", "service")
    (container,) = runtime["spec"]["containers"]
    assert container["env"] == [{"name": "VLLM_ATTENTION_BACKEND", "value": "TRITON_ATTN"}]
    assert not any("attention" in arg for arg in container["args"])
    assert runtime["metadata"]["name"] == "vllm-rocm-gfx110x", "Kubernetes names are lower case"


def test_a_registry_answering_html_for_a_manifest_is_one_line(base_published: RegistryServer, tmp_path: Path) -> None:
    class Proxy(_FlakyProxy):
        target = base_published.url
        faults: ClassVar[dict[str, int]] = {}
        seen: ClassVar[list[str]] = []
        garble = frozenset({"GET manifest"})

    recipes = copy_recipes(tmp_path / "recipes")
    with serving(Proxy) as host:
        result = run_cli(
            "lock", "--image", "--recipes", recipes, "--registry-mirror", host, "--cache-dir", tmp_path / "c"
        )
    assert_one_line_error(result, "ubi10/ubi-minimal:latest is not a JSON document", "check the registry address")
    assert not (recipes / "locks" / "image-base.json").exists()


@pytest.mark.parametrize(
    "doc", [{"digest": "sha256:" + "a" * 64}, {"mediaType": "x", "digest": "sha256:" + "a" * 64, "size": "big"}, []]
)
def test_a_descriptor_that_is_not_one_is_refused_in_one_error(doc: Any) -> None:
    from vllm_bundle.errors import ImageError
    from vllm_bundle.oci.layout import Descriptor

    with pytest.raises(ImageError, match="not an OCI descriptor"):
        Descriptor.from_json(doc)
