"""A client of the OCI distribution API: resolve a reference to a manifest, download blobs into the
verified cache, and push an image layout with retries.

Base image blobs come through this client rather than the Fetcher because registries hand out a token
per repository; they land in the same verified, content-addressed cache.

Hand-written on the project's requests session rather than oras-py: oras-py reads a whole blob into
memory for a monolithic upload (a ROCm layer is gigabytes), re-serialises manifests (their digest
would change on the way), and retries with a fixed sleep that ignores Retry-After. The protocol
needed here is five requests; the transport (urllib3 retries, the URL policy, the failure wording)
is the one every download of this tool uses.

Authentication: anonymous until the registry asks; then the credentials :mod:`vllm_bundle.oci.auth`
finds (``$VLLM_BUNDLE_REGISTRY_USERNAME``/``$VLLM_BUNDLE_REGISTRY_PASSWORD``, else what ``docker login``
or ``podman login`` wrote), sent as Basic or traded for a Bearer token as the registry's challenge asks;
an identity token (an OAuth refresh token) is traded with ``grant_type=refresh_token``.

Docker Hub: ``index.docker.io/NAME`` is ``docker.io/NAME``, and ``docker.io/NAME`` is
``docker.io/library/NAME`` (distribution/reference:normalize.go ``splitDockerDomain``); its API answers
on ``registry-1.docker.io`` (containers/image:docker/docker_client.go ``newDockerClient``).
"""

from __future__ import annotations

import functools
import io
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urljoin, urlsplit

import requests

from vllm_bundle.errors import HashMismatchError, NetworkError, RegistryError
from vllm_bundle.oci.auth import (
    DOCKER_HUB,
    Credentials,
    api_host,
    find_credentials,
    login_hint,
)
from vllm_bundle.oci.layout import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    INDEX,
    MANIFEST,
    Descriptor,
    canonical_json,
    layout_blobs,
    open_blob,
    sha256_digest,
)
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.fetch import Artifact, Fetcher, Source
from vllm_bundle.util.policy import RetryPolicy
from vllm_bundle.util.progress import PlainReporter, Reporter
from vllm_bundle.util.transport import (
    RETRY_STATUSES,
    RetryStatus,
    check_url,
    describe,
    is_loopback,
    make_session,
    raise_for_retry_status,
    retrying,
)

MANIFEST_TYPES = (INDEX, MANIFEST, DOCKER_LIST, DOCKER_MANIFEST)
REFERENCE = re.compile(
    r"^(?P<registry>[a-zA-Z0-9.-]+(?::[0-9]+)?)/(?P<repository>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
#: Blobs larger than this go up in chunks of this size, each retried on its own. GHCR refuses a
#: chunk over 4 MiB (416 "exceeds the maximum permissible limit of 4.00MiB", ocx-sh/ocx#237).
CHUNK_SIZE = 4 * 1024 * 1024


@dataclass(frozen=True)
class Reference:
    """``registry/repository[:tag][@digest]``; the registry host is always spelled out."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Reference:
        match = REFERENCE.match(text)
        if match is None or (
            "." not in match["registry"] and ":" not in match["registry"] and match["registry"] != "localhost"
        ):
            repository = text.split("/", 1)[-1].split(":")[0]
            raise RegistryError(
                f"{text!r} is not an image reference of the form REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]",
                "repository names are lower case"
                if repository != repository.lower()
                else "name the registry host, e.g. ghcr.io/OWNER/vllm-rocm, or docker.io/OWNER/vllm-rocm for "
                "Docker Hub",
            )
        registry, repository = match["registry"], match["repository"]
        if registry == "index.docker.io":  # Docker Hub's legacy name
            registry = DOCKER_HUB
        if registry == DOCKER_HUB and "/" not in repository:  # docker.io/ubuntu is docker.io/library/ubuntu
            repository = f"library/{repository}"
        return cls(registry, repository, match["tag"], match["digest"])

    @property
    def reference(self) -> str:
        """What the manifest endpoint takes: the digest if known, else the tag (default ``latest``)."""
        return self.digest or self.tag or "latest"

    def with_registry(self, registry: str) -> Reference:
        return Reference(registry, self.repository, self.tag, self.digest)

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        text += f":{self.tag}" if self.tag else ""
        return text + (f"@{self.digest}" if self.digest else "")


def mirrored(reference: Reference, mirror: str | None) -> tuple[Reference, str]:
    """The reference on ``mirror`` (``host:port`` or a URL; the same repository path), and the base URL
    its API is reached at (http only on loopback, as every other download; Docker Hub's API host for
    ``docker.io``)."""
    registry = reference.registry
    if mirror:
        registry = re.sub(r"^https?://", "", mirror).rstrip("/")
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    scheme = "http" if is_loopback(host) and not (mirror or "").startswith("https://") else "https"
    return reference.with_registry(registry), f"{scheme}://{api_host(registry)}"


@dataclass
class RegistryClient:
    """One registry; requests go through the shared transport and answer auth challenges."""

    base_url: str
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    #: None: looked up (:func:`~vllm_bundle.oci.auth.find_credentials`) when the registry first asks.
    credentials: Credentials | None = None
    sleep: Callable[[float], None] = time.sleep
    chunk_size: int = CHUNK_SIZE
    session: requests.Session = field(init=False)
    _tokens: dict[str, str] = field(default_factory=dict, init=False)
    _looked_up: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        check_url(self.base_url + "/v2/")
        self.session = make_session(self.policy)
        self._looked_up = self.credentials is not None

    @property
    def registry(self) -> str:
        """``host[:port]`` of the API, the name credentials are kept under."""
        return urlsplit(self.base_url).netloc

    def _credentials(self) -> Credentials | None:
        if not self._looked_up:
            self.credentials = find_credentials(self.registry)
            self._looked_up = True
        return self.credentials

    # -- requests ------------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return urljoin(self.base_url + "/", path.lstrip("/"))

    def _send(self, method: str, url: str, scope: str, **kwargs: Any) -> requests.Response:
        headers = dict(kwargs.pop("headers", {}))
        token = self._tokens.get(scope)
        if token:
            headers["Authorization"] = token
        try:
            response = self.session.request(method, url, headers=headers, **kwargs)
            if response.status_code == 401 and "www-authenticate" in response.headers:
                self._tokens[scope] = self._authorize(response.headers["www-authenticate"], scope)
                headers["Authorization"] = self._tokens[scope]
                rewind = getattr(kwargs.get("data"), "seek", None)
                if rewind is not None:  # a file body was read by the refused attempt
                    rewind(0)
                response = self.session.request(method, url, headers=headers, **kwargs)
        except requests.RequestException as err:
            raise NetworkError(
                f"cannot reach {self.base_url}: {describe(err)}", "check the registry address and the network"
            ) from None
        return response

    def _authorize(self, challenge: str, scope: str) -> str:
        """The Authorization header the registry's challenge asks for."""
        scheme = challenge.split(" ", 1)[0].lower()
        params = dict(CHALLENGE.findall(challenge))
        if scheme not in ("basic", "bearer") or (scheme == "bearer" and "realm" not in params):
            raise RegistryError(f"{self.base_url} asks for an authentication this tool does not speak: {challenge}")
        credentials = self._credentials()
        if scheme == "basic":
            if credentials is None:
                raise RegistryError(f"{self.base_url} asks for a login", login_hint(self.registry))
            if not credentials.password:
                raise RegistryError(
                    f"{self.base_url} asks for a password, and {credentials.source} has only an identity token",
                    login_hint(self.registry),
                )
            return credentials.basic()
        realm = params["realm"]
        check_url(realm)
        query = {"service": params.get("service", ""), "scope": scope}
        try:
            if credentials is not None and credentials.identity_token:
                # The Docker token spec's OAuth flow: the identity token is a refresh token.
                form = {**query, "grant_type": "refresh_token", "client_id": "vllm-bundle"}
                form["refresh_token"] = credentials.identity_token
                answer = self.session.post(realm, data=form, timeout=self.policy.connect_timeout)
            else:
                login = None
                if credentials is not None:
                    login = (credentials.username, credentials.password)
                    query["account"] = credentials.username
                answer = self.session.get(realm, params=query, auth=login, timeout=self.policy.connect_timeout)
        except requests.RequestException as err:
            raise NetworkError(f"cannot reach {realm}: {describe(err)}", "check the network") from None
        if answer.status_code != 200:
            hint = (
                login_hint(self.registry) if credentials is None else f"check the credentials from {credentials.source}"
            )
            raise RegistryError(f"{realm} refused a token for {scope} (HTTP {answer.status_code})", hint)
        try:
            token = answer.json().get("token") or answer.json().get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{realm} answered without a token", "check the registry address")
        return f"Bearer {token}"

    def _check(self, response: requests.Response, what: str) -> requests.Response:
        if response.ok:
            return response
        detail = ""
        try:
            errors = response.json().get("errors") or []
            detail = "; ".join(str(e.get("message") or e.get("code")) for e in errors)
        except (ValueError, AttributeError, TypeError):  # an error page that is not the spec's JSON
            pass
        hint = "check the credentials and that the repository exists" if response.status_code in (401, 403, 404) else ""
        raise RegistryError(f"{what}: HTTP {response.status_code}{': ' + detail if detail else ''}", hint)

    # -- reading -------------------------------------------------------------------------------

    def manifest(self, repository: str, reference: str) -> tuple[bytes, str, str]:
        """A manifest or index as published: (bytes, media type, digest); the digest is checked."""
        scope = f"repository:{repository}:pull"
        response = self._send(
            "GET",
            self._url(f"/v2/{repository}/manifests/{reference}"),
            scope,
            headers={"Accept": ", ".join(MANIFEST_TYPES)},
        )
        self._check(response, f"cannot read the manifest {repository}:{reference}")
        data = response.content
        digest = sha256_digest(data)
        if reference.startswith("sha256:") and digest != reference:
            raise HashMismatchError(f"the manifest {repository}@{reference} arrived with digest {digest}", "try again")
        media_type = response.headers.get("content-type", "").split(";")[0].strip()
        return data, media_type, digest

    def blob_into(
        self, repository: str, descriptor: Descriptor, cache: Cache, reporter: Reporter | None = None
    ) -> Path:
        """The blob's verified bytes in the cache, downloaded unless present with its size. The download
        goes through the fetcher like every other one (a base layer is hundreds of MB): retried, resumed
        with Range after a cut or a stall, with progress, and checked against the digest before it is
        cached. The registry's token is asked for first and handed to the fetcher as a header."""
        sha256 = descriptor.digest.removeprefix("sha256:")
        if cache.has(sha256, descriptor.size):
            return cache.blob(sha256)
        scope = f"repository:{repository}:pull"
        url = self._url(f"/v2/{repository}/blobs/{descriptor.digest}")
        self._check(self._send("HEAD", url, scope), f"cannot download {repository}@{descriptor.digest}")
        token = self._tokens.get(scope)
        source = Source(url=url, headers={"Authorization": token} if token else {})
        name = f"{repository}@{descriptor.digest[:19]}"
        artifact = Artifact(name, name, url, sha256, descriptor.size)
        with Fetcher(cache, reporter or PlainReporter(), policy=self.policy, jobs=1) as fetcher:
            return fetcher.fetch_one(artifact, source)

    def blob_bytes(self, repository: str, descriptor: Descriptor, cache: Cache) -> bytes:
        return self.blob_into(repository, descriptor, cache).read_bytes()

    # -- pushing -------------------------------------------------------------------------------

    def has_blob(self, repository: str, digest: str) -> bool:
        response = self._send(
            "HEAD", self._url(f"/v2/{repository}/blobs/{digest}"), f"repository:{repository}:pull,push"
        )
        return response.status_code == 200

    def _with_retries(self, what: str, attempt_once: Callable[[], requests.Response]) -> requests.Response:
        """Uploads are POST/PUT, which urllib3 does not retry: the whole request is tried again."""
        try:
            response = retrying(
                self.policy, lambda: raise_for_retry_status(attempt_once()), _upload_failed, sleep=self.sleep
            )
        except RetryStatus as last:
            response = last.response
        return self._check(response, what)

    def push_blob(
        self,
        repository: str,
        descriptor: Descriptor,
        open_body: Callable[[], BinaryIO],
        progress: UploadProgress | None = None,
    ) -> None:
        """Upload a blob: in one PUT when it fits in a chunk, else in chunks that resume where the
        registry's upload session stands after a failure (a ROCm layer is gigabytes: a failure costs
        one chunk, not the layer). ``progress`` hears how many bytes the registry has, chunk by chunk."""
        progress = progress or UploadProgress()
        if descriptor.size > self.chunk_size:
            self._push_chunked(repository, descriptor, open_body, progress)
            return
        scope = f"repository:{repository}:pull,push"

        def once() -> requests.Response:
            start = self._send("POST", self._url(f"/v2/{repository}/blobs/uploads/"), scope)
            if start.status_code != 202 or "location" not in start.headers:
                return start
            with open_body() as body:
                return self._send(
                    "PUT",
                    _with_digest(self._absolute(start.headers["location"]), descriptor.digest),
                    scope,
                    data=body,
                    headers={"Content-Type": "application/octet-stream", "Content-Length": str(descriptor.size)},
                )

        self._with_retries(f"cannot upload {descriptor.digest} to {repository}", once)
        progress.at(descriptor.size)

    def _absolute(self, location: str) -> str:
        return urljoin(self.base_url + "/", location)

    def _start_upload(self, repository: str, scope: str) -> str:
        """A new upload session's URL."""
        response = self._with_retries(
            f"cannot start an upload to {repository}",
            lambda: self._send("POST", self._url(f"/v2/{repository}/blobs/uploads/"), scope),
        )
        if "location" not in response.headers:
            raise RegistryError(f"{self.base_url} opened an upload to {repository} without a Location")
        return self._absolute(response.headers["location"])

    def _upload_state(self, repository: str, location: str, scope: str) -> tuple[str, int]:
        """Where an upload session stands: (its URL, the bytes the registry has); a session the
        registry forgot is replaced by a new one."""
        try:
            response = self._send("GET", location, scope)
        except NetworkError:
            return location, -1
        if response.status_code == 204:
            # "Range: 0-<last byte>"; distribution says 0-0 for an empty session too (chunks are never 1 byte).
            end = response.headers.get("range", "0-0").rpartition("-")[2]
            if not end.isdigit():  # a Range this client cannot read: go on from where it was
                return location, -1
            last = int(end)
            return self._absolute(response.headers.get("location", location)), last + 1 if last > 0 else 0
        if response.status_code in RETRY_STATUSES:
            return location, -1
        return self._start_upload(repository, scope), 0

    def _push_chunked(
        self, repository: str, descriptor: Descriptor, open_body: Callable[[], BinaryIO], progress: UploadProgress
    ) -> None:
        """POST, PATCH chunks in order, PUT with the digest (the OCI distribution spec's chunked upload).
        After a failed chunk the session's Range says where to go on; only that chunk is sent again."""
        scope = f"repository:{repository}:pull,push"
        what = f"cannot upload {descriptor.digest} to {repository}"
        location, offset, failed = self._start_upload(repository, scope), 0, ""

        def send_chunk() -> None:
            nonlocal location, offset, failed
            if failed:  # after a failure, go on from where the session stands
                location, known = self._upload_state(repository, location, scope)
                offset = offset if known < 0 else known
                progress.retry(offset, f"a chunk failed ({failed})")
                failed = ""
            body.seek(offset)
            chunk = body.read(min(self.chunk_size, descriptor.size - offset))
            headers = {
                "Content-Type": "application/octet-stream",
                "Content-Range": f"{offset}-{offset + len(chunk) - 1}",
                "Content-Length": str(len(chunk)),
            }
            response = self._send("PATCH", location, scope, data=chunk, headers=headers)
            if response.status_code == 202:
                location, offset = self._absolute(response.headers.get("location", location)), offset + len(chunk)
                progress.at(offset)
                return
            if response.status_code not in RETRY_STATUSES:
                self._check(response, what)
            raise RetryStatus(response)

        def note_failure(err: Exception, failures: int) -> None:
            nonlocal failed
            failed = str(err) if isinstance(err, RetryStatus) else "the connection dropped"

        with open_body() as body:
            while offset < descriptor.size:
                try:
                    retrying(self.policy, send_chunk, _upload_failed, on_failure=note_failure, sleep=self.sleep)
                except (NetworkError, RetryStatus):
                    raise NetworkError(
                        f"{what}: {self.policy.attempts} tries failed at byte {offset}", "try again later"
                    ) from None
        self._with_retries(
            what,
            lambda: self._send(
                "PUT", _with_digest(location, descriptor.digest), scope, headers={"Content-Length": "0"}
            ),
        )

    def put_manifest(self, repository: str, reference: str, media_type: str, data: bytes) -> requests.Response:
        """Put the manifest's exact bytes under ``reference`` (a tag or its digest), refusing a registry
        that stored other bytes."""
        scope = f"repository:{repository}:pull,push"
        response = self._with_retries(
            f"cannot put the manifest {repository}:{reference}",
            lambda: self._send(
                "PUT",
                self._url(f"/v2/{repository}/manifests/{reference}"),
                scope,
                data=data,
                headers={"Content-Type": media_type},
            ),
        )
        digest = sha256_digest(data)
        stored = response.headers.get("docker-content-digest", digest)
        if stored != digest:
            raise RegistryError(
                f"{repository}:{reference} was stored as {stored}, not {digest}", "the registry altered the manifest"
            )
        return response


def _upload_failed(err: Exception) -> bool:
    """An upload's try that may pass when made again: the registry unreachable or answering 429/5xx."""
    return isinstance(err, NetworkError | RetryStatus)


def _with_digest(location: str, digest: str) -> str:
    return f"{location}{'&' if '?' in location else '?'}digest={digest}"


@dataclass(frozen=True)
class PushResult:
    reference: Reference
    digest: str
    uploaded: int  # blobs sent
    skipped: int  # blobs the registry had already


@dataclass
class UploadProgress:
    """One blob's upload as a step of a progress reporter (none: silent): ``at`` the bytes the registry
    has, ``retry`` when a chunk failed and the upload goes on from ``offset``."""

    reporter: Reporter | None = None
    key: str = ""
    sent: int = 0

    def at(self, offset: int) -> None:
        if self.reporter is not None and offset != self.sent:
            self.reporter.advance(self.key, offset - self.sent)
        self.sent = offset

    def retry(self, offset: int, reason: str) -> None:
        if self.reporter is not None:
            self.reporter.restart(self.key, offset, reason)
        self.sent = offset


def push_layout(
    layout: Path, destination: Reference, client: RegistryClient, reporter: Reporter | None = None
) -> PushResult:
    """Push the layout's image as ``destination`` (its tag): blobs the registry lacks, then the manifest.
    Each blob sent is a step of ``reporter`` (``push sha256:…``, its bytes as the registry takes them)."""
    *blobs, manifest = layout_blobs(layout)
    uploaded = skipped = 0
    for blob in blobs:
        if client.has_blob(destination.repository, blob.digest):
            skipped += 1
            continue
        opener = functools.partial(open_blob, layout, blob.digest)
        if reporter is None:
            client.push_blob(destination.repository, blob, opener)
        else:
            key = f"push {blob.digest[:19]}"
            reporter.begin(key, key, blob.size, 0, download=False)
            status = "error"
            try:
                client.push_blob(destination.repository, blob, opener, UploadProgress(reporter, key))
                status = "done"
            finally:
                reporter.finish(key, status)
        uploaded += 1
    with open_blob(layout, manifest.digest) as handle:
        data = handle.read()
    client.put_manifest(destination.repository, destination.reference, manifest.media_type, data)
    return PushResult(destination, manifest.digest, uploaded, skipped)


def parse_document(data: bytes, what: str) -> dict[str, Any]:
    """A manifest, index or config as a JSON object, or one line saying the registry sent something else."""
    try:
        document = json.loads(data)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise RegistryError(f"{what} is not a JSON document (got {data[:60]!r})", "check the registry address")
    return document


EMPTY_CONFIG = b"{}"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
CYCLONEDX = "application/vnd.cyclonedx+json"


def referrer_manifest(subject: Descriptor, artifact_type: str, file: Descriptor, created: str) -> bytes:
    """An OCI 1.1 artifact manifest about ``subject`` (an SBOM of the image, say)."""
    config = Descriptor(EMPTY_TYPE, sha256_digest(EMPTY_CONFIG), len(EMPTY_CONFIG))
    document = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "artifactType": artifact_type,
        "config": config.to_json(),
        "layers": [file.to_json()],
        "subject": Descriptor(subject.media_type, subject.digest, subject.size).to_json(),
        "annotations": {"org.opencontainers.image.created": created},
    }
    return canonical_json(document)


def push_referrer(
    client: RegistryClient, repository: str, subject: Descriptor, artifact_type: str, path: Path, created: str
) -> str:
    """Attach ``path`` to the pushed image ``subject`` as an OCI 1.1 referrer; returns its digest.

    A registry with the referrers API links it by the ``subject`` field (it answers with OCI-Subject);
    for one without, the referrers tag schema of the distribution spec 1.1 is kept: the index tagged
    ``sha256-<subject hex>`` lists it."""
    data = path.read_bytes()
    title = {"org.opencontainers.image.title": path.name}
    file = Descriptor(artifact_type, sha256_digest(data), len(data), title)
    config = Descriptor(EMPTY_TYPE, sha256_digest(EMPTY_CONFIG), len(EMPTY_CONFIG))
    for blob, body in ((config, EMPTY_CONFIG), (file, data)):
        if not client.has_blob(repository, blob.digest):
            client.push_blob(repository, blob, functools.partial(io.BytesIO, body))
    manifest = referrer_manifest(subject, artifact_type, file, created)
    digest = sha256_digest(manifest)
    linked = client.put_manifest(repository, digest, MANIFEST, manifest).headers.get("oci-subject")
    if linked != subject.digest:
        entry = Descriptor(MANIFEST, digest, len(manifest), {}).to_json() | {"artifactType": artifact_type}
        _add_to_referrers_tag(client, repository, subject.digest, entry)
    return digest


def _add_to_referrers_tag(client: RegistryClient, repository: str, subject: str, entry: dict[str, Any]) -> None:
    tag = subject.replace(":", "-")
    try:
        data, _, _ = client.manifest(repository, tag)
        index = parse_document(data, f"{repository}:{tag}")
    except RegistryError:
        index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": []}
    if any(item.get("digest") == entry["digest"] for item in index.get("manifests", [])):
        return
    index["manifests"] = [*index.get("manifests", []), entry]
    client.put_manifest(repository, tag, INDEX, canonical_json(index))


def platform_manifest(
    client: RegistryClient, repository: str, reference: str, platform: Mapping[str, str]
) -> tuple[bytes, str, str, str | None]:
    """The image manifest for ``platform``: (bytes, media type, digest, the index digest if any)."""
    data, media_type, digest = client.manifest(repository, reference)
    if media_type not in (INDEX, DOCKER_LIST):
        return data, media_type, digest, None
    entries = parse_document(data, f"{repository}:{reference}").get("manifests") or []
    for entry in entries:
        found = entry.get("platform") or {}
        if all(found.get(key) == value for key, value in platform.items()):
            child, child_type, child_digest = client.manifest(repository, Descriptor.from_json(entry).digest)
            return child, child_type, child_digest, digest
    wanted = "/".join(platform.values())
    raise RegistryError(f"{repository}:{reference} has no image for {wanted}", "choose a base image that has one")
