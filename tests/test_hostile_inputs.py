"""Values from outside that must never reach the file system or the network unchecked (issue #21):
digests used as cache paths, links planted in a restored cache, redirects to plain http, passwords in
URLs, and a registry that cuts a base layer's download."""

from __future__ import annotations

import hashlib
import io
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3.util.connection

from tests.conftest import assert_one_line_error, run_cli
from tests.upstream.fixture import Fixture, make_blob
from tests.upstream.server import Fault, UpstreamServer
from vllm_bundle.errors import CorruptCacheError, InsecureURLError, InvalidValueError
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.fetch import Artifact, Fetcher
from vllm_bundle.util.policy import RetryPolicy
from vllm_bundle.util.progress import PlainReporter
from vllm_bundle.util.transport import is_loopback

FAST = RetryPolicy(attempts=3, backoff=0.01, read_timeout=2.0, connect_timeout=2.0)


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """urllib3 may connect to loopback hosts only; any other host is recorded and refused, so a test
    that would follow a redirect off the machine fails without a packet leaving it."""
    tried: list[str] = []
    connect = urllib3.util.connection.create_connection

    def guarded(address: tuple[str, int], *args: object, **kwargs: object) -> socket.socket:
        if not is_loopback(address[0]):
            tried.append(address[0])
            raise ConnectionRefusedError(f"the test refuses a connection to {address[0]}")
        return connect(address, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(urllib3.util.connection, "create_connection", guarded)
    monkeypatch.setattr("urllib3.connection.connection.create_connection", guarded)
    yield tried


def fetcher_for(cache: Path, **kwargs: object) -> tuple[Fetcher, io.StringIO]:
    log = io.StringIO()
    return Fetcher(Cache(cache), PlainReporter(log), policy=FAST, **kwargs), log  # type: ignore[arg-type]


@pytest.fixture
def blob(fixture_tree: Fixture) -> Path:
    return make_blob(fixture_tree, "hostile.bin", 300_000)


def pinned(path: Path, server: UpstreamServer) -> Artifact:
    data = path.read_bytes()
    return Artifact(
        "hostile", path.name, f"{server.url}/files/{path.name}", hashlib.sha256(data).hexdigest(), len(data)
    )


# -- 1. digests are checked before they name a file ----------------------------------------------------


@pytest.mark.parametrize("digest", ["../../victim", "/tmp/victim", "A" * 64, "0" * 63, "sha256:" + "0" * 64])
def test_a_digest_that_is_not_one_never_becomes_a_path(
    upstream: UpstreamServer, blob: Path, tmp_path: Path, digest: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    fetcher, _ = fetcher_for(tmp_path / "cache" / "a" / "b")
    artifact = pinned(blob, upstream)
    with pytest.raises(InvalidValueError, match="is not a sha256"):
        fetcher.fetch_one(Artifact(artifact.name, artifact.filename, artifact.url, digest, artifact.size))
    assert victim.read_text() == "the user's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"], "nothing was created anywhere"
    assert upstream.log == [], "nothing was downloaded"


def test_an_index_page_with_a_path_for_a_hash_is_one_line(upstream: UpstreamServer, tmp_path: Path) -> None:
    import requests

    from vllm_bundle.inputs.simple_index import project_files

    page = upstream.root / "hostile-index" / "evil"
    page.mkdir(parents=True)
    (page / "index.html").write_text('<a href="evil-1.0.tar.gz#sha256=../../../../tmp/x">evil-1.0.tar.gz</a>')
    with (
        requests.Session() as session,
        pytest.raises(InvalidValueError, match=r"the sha256 .*/evil/ gives for evil-1\.0\.tar\.gz is not a sha256"),
    ):
        project_files(session, f"{upstream.url}/hostile-index/", "evil")


# -- 4. a link planted in the cache is never written through -------------------------------------------


@pytest.mark.parametrize("mirror", ["http", "directory"])
@pytest.mark.parametrize("verify", [False, True])
def test_a_link_at_the_partial_file_is_not_written_through(
    upstream: UpstreamServer, blob: Path, tmp_path: Path, mirror: str, verify: bool
) -> None:
    """A restored, poisoned cache: ``partial/<sha>.part`` links to a user's file. Before the fix the
    download overwrote it (local mirror) or appended to it (HTTP)."""
    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    artifact = pinned(blob, upstream)
    cache = Cache(tmp_path / "cache")
    partial = cache.partial(artifact.sha256)
    partial.parent.mkdir(parents=True)
    partial.symlink_to(victim)
    fetcher, _ = fetcher_for(
        cache.root, verify_cached=verify, mirror=str(blob.parent) if mirror == "directory" else None
    )
    with pytest.raises(CorruptCacheError, match=r"\.part is a symbolic link; .* \(remove it"):
        fetcher.fetch_one(artifact)
    assert victim.read_text() == "the user's file"
    assert not cache.has(artifact.sha256, artifact.size)


def test_a_linked_blob_or_cache_folder_is_refused(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(blob.read_bytes())  # same size and bytes: a plain stat would take it for the blob
    artifact = pinned(blob, upstream)
    cache = Cache(tmp_path / "cache")
    linked = tmp_path / "cache" / "blobs" / "sha256" / artifact.sha256[:2] / artifact.sha256
    linked.parent.mkdir(parents=True)
    linked.symlink_to(victim)
    fetcher, _ = fetcher_for(cache.root)
    with pytest.raises(CorruptCacheError, match="is a symbolic link"):
        fetcher.fetch_one(artifact)
    other = Cache(tmp_path / "other")
    other.root.mkdir()
    (other.root / "partial").symlink_to(tmp_path)
    with pytest.raises(CorruptCacheError, match=r"other/partial is a symbolic link"):
        fetcher_for(other.root)[0].fetch_one(artifact)
    assert victim.read_bytes() == blob.read_bytes()


# -- 5. every hop of a redirect is held to the https rule ----------------------------------------------


def test_a_redirect_to_plain_http_elsewhere_is_refused(
    upstream: UpstreamServer, blob: Path, tmp_path: Path, loopback_only: list[str]
) -> None:
    artifact = pinned(blob, upstream)
    upstream.inject(f"/files/{blob.name}", Fault("redirect", location=f"http://203.0.113.7/files/{blob.name}"))
    fetcher, _ = fetcher_for(tmp_path / "cache")
    with pytest.raises(InsecureURLError, match=r"refusing to download http://203\.0\.113\.7/.* \(a redirect from http"):
        fetcher.fetch_one(artifact)
    assert loopback_only == [], "the hop was refused before any connection"
    assert not fetcher.cache.has(artifact.sha256, None)


def test_install_takes_no_release_json_over_a_plain_http_hop(
    upstream: UpstreamServer, tmp_path: Path, loopback_only: list[str]
) -> None:
    from vllm_bundle.install.installer import release_from_assets

    upstream.inject("/hostile/release.json", Fault("redirect", location="http://203.0.113.7/release.json"))
    with pytest.raises(InsecureURLError, match="a redirect from"):
        release_from_assets(f"{upstream.url}/hostile/", FAST)
    assert loopback_only == []


def test_a_redirect_within_the_rules_is_followed(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = pinned(blob, upstream)
    upstream.inject("/elsewhere/hostile.bin", Fault("redirect", location=f"/files/{blob.name}"))
    fetcher, _ = fetcher_for(tmp_path / "cache")
    fetcher.fetch_one(
        Artifact(artifact.name, artifact.filename, f"{upstream.url}/elsewhere/hostile.bin", artifact.sha256)
    )
    assert fetcher.cache.has(artifact.sha256, artifact.size)


# -- 6. a password in an URL is never printed ----------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_password_in_a_mirror_url_is_not_printed(tmp_path: Path, locked: Path) -> None:
    port = closed_port()
    result = run_cli(
        "fetch", "gfx1151", "--recipes", locked, "--cache-dir", tmp_path / "cache",
        "--mirror", f"http://alice:s3cret-token@127.0.0.1:{port}/", "--retries", "2", "--plain",
    )  # fmt: skip
    assert_one_line_error(result, f"cannot reach 127.0.0.1:{port}")
    assert "s3cret" not in result.stdout + result.stderr


def test_a_password_in_a_release_url_is_not_printed(tmp_path: Path) -> None:
    port = closed_port()
    url = f"http://alice:s3cret-token@127.0.0.1:{port}/releases/download/x/"
    result = run_cli("install", url, "--dest", tmp_path / "dest", "--cache-dir", tmp_path / "cache", "--retries", "2")
    last = assert_one_line_error(result, f"http://***@127.0.0.1:{port}/releases/download/x/")
    assert "s3cret" not in result.stdout + result.stderr, last


def test_redaction_keeps_the_rest_of_the_line() -> None:
    from vllm_bundle.errors import FetchError, redact_urls

    line = "from https://u:p@h.example/a and http://tok@127.0.0.1:8/b, not a@b or user@host:path"
    assert redact_urls(line) == "from https://***@h.example/a and http://***@127.0.0.1:8/b, not a@b or user@host:path"
    assert (
        str(FetchError("cannot read https://x:y@h/", "see https://z@h/"))
        == "cannot read https://***@h/ (see https://***@h/)"
    )


def test_the_partial_file_helper_refuses_links(tmp_path: Path) -> None:
    from vllm_bundle.util.cache import open_for_writing

    victim = tmp_path / "victim"
    victim.write_text("kept")
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(CorruptCacheError):
        open_for_writing(tmp_path / "link", append=True)
    assert victim.read_text() == "kept"
    assert os.path.islink(tmp_path / "link")


@pytest.mark.parametrize("meta", ["[]", '{"url": 5}', '{"url": "%s", "validator": {"x": 1}}', "\x00"])
def test_a_damaged_partial_meta_file_only_costs_the_resume_guard(
    upstream: UpstreamServer, blob: Path, tmp_path: Path, meta: str
) -> None:
    artifact = pinned(blob, upstream)
    cache = Cache(tmp_path / "cache")
    cache.partial(artifact.sha256).parent.mkdir(parents=True)
    cache.partial(artifact.sha256).write_bytes(blob.read_bytes()[:1000])
    cache.partial_meta(artifact.sha256).write_text(meta.replace("%s", artifact.url))
    fetcher, _ = fetcher_for(cache.root)
    assert fetcher.fetch_one(artifact).read_bytes() == blob.read_bytes()
