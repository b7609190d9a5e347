"""The fetcher against the fake upstream: resume, verification, retries, sharing, offline, errors."""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error, disk_filling_up, run_cli, small_disk
from tests.upstream.fixture import TORCH_VERSION, Fixture, make_blob
from tests.upstream.server import Fault, UpstreamServer
from vllm_bundle.errors import DiskFullError, HashMismatchError, NetworkError, OfflineMissingError
from vllm_bundle.inputs.lockfile import BUILD_GROUP, read_lock, wheel_artifacts
from vllm_bundle.recipes import load_recipes
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.fetch import SHOWN_MISSING, Artifact, Fetcher
from vllm_bundle.util.policy import RetryPolicy
from vllm_bundle.util.progress import PlainReporter

FAST = RetryPolicy(attempts=5, backoff=0.01, read_timeout=2.0, connect_timeout=2.0)
BLOB_SIZE = 3 * 1024 * 1024 + 17


@pytest.fixture
def blob(fixture_tree: Fixture) -> Path:
    return make_blob(fixture_tree, "blob.bin", BLOB_SIZE)


def artifact_for(path: Path, server: UpstreamServer, *, sha256: str | None = None) -> Artifact:
    data = path.read_bytes()
    return Artifact(
        path.stem, path.name, f"{server.url}/files/{path.name}", sha256 or hashlib.sha256(data).hexdigest(), len(data)
    )


def make_fetcher(cache_dir: Path, **kwargs: object) -> tuple[Fetcher, io.StringIO]:
    log = io.StringIO()
    fetcher = Fetcher(Cache(cache_dir), PlainReporter(log), policy=kwargs.pop("policy", FAST), **kwargs)  # type: ignore[arg-type]
    return fetcher, log


def test_fetch_verifies_and_caches_by_hash(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = artifact_for(blob, upstream)
    fetcher, _ = make_fetcher(tmp_path / "cache")
    path = fetcher.fetch_one(artifact)
    assert path == tmp_path / "cache" / "blobs" / "sha256" / artifact.sha256[:2] / artifact.sha256
    assert path.read_bytes() == blob.read_bytes()
    assert not list((tmp_path / "cache" / "partial").iterdir()), "no partial file is left behind"
    before = len(upstream.log)
    fetcher.fetch_one(artifact)
    assert len(upstream.log) == before, "a cached artifact is not downloaded again"


@pytest.mark.parametrize("cut_at", [1, 65536, BLOB_SIZE // 2, BLOB_SIZE - 1])
def test_resume_after_cut_fetches_only_the_remainder(
    upstream: UpstreamServer, blob: Path, tmp_path: Path, cut_at: int
) -> None:
    artifact = artifact_for(blob, upstream)
    upstream.inject("/files/blob.bin", Fault("cut", after=cut_at))
    fetcher, log = make_fetcher(tmp_path / "cache")
    fetcher.fetch_one(artifact)
    gets = [r for r in upstream.requests_for("/files/blob.bin") if r.method == "GET"]
    assert [r.range for r in gets] == [None, f"bytes={cut_at}-"]
    assert [r.status for r in gets] == [200, 206]
    assert upstream.body_bytes("/files/blob.bin") == BLOB_SIZE, "only the remainder was sent again"
    assert fetcher.cache.blob(artifact.sha256).read_bytes() == blob.read_bytes()
    assert "retry" in log.getvalue()


def test_resume_survives_several_cuts_and_a_new_process(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = artifact_for(blob, upstream)
    upstream.inject("/files/blob.bin", *[Fault("cut", after=300_000) for _ in range(3)])
    # First run gives up after two attempts, keeping what it has...
    fetcher, _ = make_fetcher(tmp_path / "cache", policy=RetryPolicy(attempts=2, backoff=0.01, read_timeout=2))
    with pytest.raises(NetworkError, match="kept breaking off"):
        fetcher.fetch_one(artifact)
    kept = fetcher.cache.partial(artifact.sha256).stat().st_size
    assert kept == 600_000
    # ...and a later run (a new Fetcher, as a new process would be) resumes from there.
    fetcher, _ = make_fetcher(tmp_path / "cache")
    fetcher.fetch_one(artifact)
    assert upstream.body_bytes("/files/blob.bin") == BLOB_SIZE
    assert fetcher.bytes_transferred == BLOB_SIZE - 600_000


def test_server_ignoring_range_gets_a_clean_restart(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = artifact_for(blob, upstream)
    upstream.inject("/files/blob.bin", Fault("cut", after=1_000_000), Fault("ignore-range"))
    fetcher, log = make_fetcher(tmp_path / "cache")
    fetcher.fetch_one(artifact)
    statuses = [r.status for r in upstream.requests_for("/files/blob.bin")]
    assert statuses == [200, 200]
    assert fetcher.cache.blob(artifact.sha256).read_bytes() == blob.read_bytes()
    assert "ignored the range request" in log.getvalue()


def test_a_resume_answered_with_another_range_starts_over(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    """A 206 to ``bytes=N-`` whose Content-Range names other bytes (util/transport.py range_answer_problem)
    is not appended to the partial file: the partial file is dropped and the download starts over."""
    artifact = artifact_for(blob, upstream)
    upstream.inject("/files/blob.bin", Fault("cut", after=1_000_000), Fault("other-range"))
    fetcher, log = make_fetcher(tmp_path / "cache")
    fetcher.fetch_one(artifact)
    requests = upstream.requests_for("/files/blob.bin")
    assert [(r.status, r.range) for r in requests] == [(200, None), (206, "bytes=1000000-"), (200, None)]
    assert fetcher.cache.blob(artifact.sha256).read_bytes() == blob.read_bytes()
    assert (
        f"the range bytes 1000001-{BLOB_SIZE}/{BLOB_SIZE} for bytes 1000000-{BLOB_SIZE - 1}/{BLOB_SIZE}"
        in log.getvalue()
    )


def test_stalled_body_is_abandoned_and_resumed(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = artifact_for(blob, upstream)
    upstream.inject("/files/blob.bin", Fault("stall", after=500_000, seconds=4))
    fetcher, _ = make_fetcher(tmp_path / "cache", policy=RetryPolicy(attempts=3, backoff=0.01, read_timeout=0.5))
    fetcher.fetch_one(artifact)
    ranges = [r.range for r in upstream.requests_for("/files/blob.bin")]
    assert ranges[-1] == "bytes=500000-"
    assert fetcher.cache.blob(artifact.sha256).read_bytes() == blob.read_bytes()


def test_corrupted_bytes_are_rejected_and_not_cached(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = artifact_for(blob, upstream)
    upstream.inject("/files/blob.bin", Fault("wrong-bytes"))
    fetcher, _ = make_fetcher(tmp_path / "cache")
    with pytest.raises(HashMismatchError) as caught:
        fetcher.fetch_one(artifact)
    message = str(caught.value)
    assert "blob.bin" in message and artifact.url in message and artifact.sha256 in message
    actual = hashlib.sha256(bytes(b ^ 0x5A for b in blob.read_bytes()[:64]) + blob.read_bytes()[64:]).hexdigest()
    assert actual in message, "the error shows the hash actually received"
    assert not fetcher.cache.blob(artifact.sha256).exists()
    assert not fetcher.cache.partial(artifact.sha256).exists()
    fetcher.fetch_one(artifact)  # the next (clean) attempt starts from zero and succeeds
    assert fetcher.cache.blob(artifact.sha256).read_bytes() == blob.read_bytes()


def test_wrong_pin_never_enters_the_cache(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = artifact_for(blob, upstream, sha256="0" * 64)
    fetcher, _ = make_fetcher(tmp_path / "cache")
    with pytest.raises(HashMismatchError):
        fetcher.fetch_one(artifact)
    assert not any(p.is_file() for p in (tmp_path / "cache" / "blobs").rglob("*"))


def test_a_tampered_cache_entry_is_caught_when_verifying(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    """A cache restored from elsewhere (CI's cache service) is re-hashed with verify_cached."""
    artifact = artifact_for(blob, upstream)
    fetcher, _ = make_fetcher(tmp_path / "cache")
    cached = fetcher.fetch_one(artifact)
    cached.write_bytes(bytes(b ^ 0x01 for b in cached.read_bytes()))  # same size, other bytes
    upstream.log.clear()
    verifying, _ = make_fetcher(tmp_path / "cache", verify_cached=True)
    assert verifying.fetch_one(artifact).read_bytes() == blob.read_bytes()
    assert len(upstream.requests_for("/files/blob.bin")) == 1, "downloaded again"


def test_5xx_and_429_bursts_are_retried_through(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = artifact_for(blob, upstream)
    upstream.inject(
        "/files/blob.bin",
        Fault("status", times=2, status=503),
        Fault("status", status=429, retry_after="0"),
        Fault("status", status=500),
    )
    fetcher, _ = make_fetcher(tmp_path / "cache")
    fetcher.fetch_one(artifact)
    assert [r.status for r in upstream.requests_for("/files/blob.bin")] == [503, 503, 429, 500, 200]
    assert fetcher.cache.blob(artifact.sha256).exists()


def test_endless_5xx_ends_in_a_clear_error(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = artifact_for(blob, upstream)
    upstream.inject("/files/blob.bin", Fault("status", times=None, status=502))
    fetcher, _ = make_fetcher(tmp_path / "cache", policy=RetryPolicy(attempts=3, backoff=0.01))
    with pytest.raises(NetworkError, match="kept answering HTTP 502"):
        fetcher.fetch_one(artifact)
    assert len(upstream.requests_for("/files/blob.bin")) == 3, "bounded: exactly `attempts` requests"


def test_parallel_fetch_of_many_files(upstream: UpstreamServer, fixture_tree: Fixture, tmp_path: Path) -> None:
    blobs = [make_blob(fixture_tree, f"part{i}.bin", 200_000 + i) for i in range(6)]
    artifacts = [artifact_for(b, upstream) for b in blobs]
    fetcher, _ = make_fetcher(tmp_path / "cache", jobs=4)
    paths = fetcher.fetch_all(artifacts)
    assert {p.read_bytes() for p in paths.values()} == {b.read_bytes() for b in blobs}


def test_offline_with_full_cache_opens_no_connection(
    upstream: UpstreamServer, blob: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifact = artifact_for(blob, upstream)
    make_fetcher(tmp_path / "cache")[0].fetch_one(artifact)
    upstream.reset()

    import socket

    def no_connections(*args: object, **kwargs: object) -> None:
        raise AssertionError("offline fetch opened a connection")

    monkeypatch.setattr(socket.socket, "connect", no_connections)
    fetcher, _ = make_fetcher(tmp_path / "cache", offline=True)
    assert fetcher.fetch_all([artifact]) == {artifact.sha256: fetcher.cache.blob(artifact.sha256)}
    assert upstream.log == []


def test_offline_lists_every_missing_artifact(upstream: UpstreamServer, fixture_tree: Fixture, tmp_path: Path) -> None:
    artifacts = [artifact_for(make_blob(fixture_tree, f"part{i}.bin", 200_000 + i), upstream) for i in range(3)]
    fetcher, _ = make_fetcher(tmp_path / "cache", offline=True)
    with pytest.raises(OfflineMissingError) as caught:
        fetcher.fetch_all(artifacts)
    assert all(a.filename in str(caught.value) for a in artifacts)
    assert upstream.log == []


def test_mirror_directory_serves_the_same_file_names(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = artifact_for(blob, upstream)
    fetcher, _ = make_fetcher(tmp_path / "cache", mirror=str(blob.parent))
    fetcher.fetch_one(artifact)
    assert upstream.log == [], "a directory mirror replaces upstream entirely"
    assert fetcher.cache.blob(artifact.sha256).read_bytes() == blob.read_bytes()


def test_mirror_url_is_used_instead_of_upstream(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = Artifact(
        "blob",
        blob.name,
        "https://unreachable.invalid/blob.bin",
        hashlib.sha256(blob.read_bytes()).hexdigest(),
        BLOB_SIZE,
    )
    fetcher, _ = make_fetcher(tmp_path / "cache", mirror=f"{upstream.url}/files/")
    fetcher.fetch_one(artifact)
    assert [r.path for r in upstream.log] == ["/files/blob.bin"]


def test_plain_http_to_a_remote_host_is_refused(tmp_path: Path) -> None:
    artifact = Artifact("x", "x.whl", "http://example.com/x.whl", "0" * 64, 1)
    fetcher, _ = make_fetcher(tmp_path / "cache")
    with pytest.raises(Exception, match="only https://"):
        fetcher.fetch_one(artifact)


def test_disk_full_removes_the_partial_file(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    """A real full disk: the cache lives on a 1 MiB tmpfs and the file is 3 MiB."""
    with small_disk(tmp_path / "small-disk", "1m") as disk:
        artifact = artifact_for(blob, upstream)
        fetcher, _ = make_fetcher(disk / "cache")
        with pytest.raises(DiskFullError, match=r"disk full while downloading blob\.bin"):
            fetcher.fetch_one(artifact)
        assert not fetcher.cache.partial(artifact.sha256).exists()
        assert not fetcher.cache.blob(artifact.sha256).exists()


def test_unreachable_host_cli_error_is_one_line(tmp_path: Path, locked: Path) -> None:
    import socket

    with socket.socket() as probe:  # a loopback port with nobody listening: refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_cli(
        "fetch",
        "gfx1151",
        "--recipes",
        locked,
        "--cache-dir",
        tmp_path / "cache",
        "--mirror",
        f"http://127.0.0.1:{port}/",
        "--retries",
        "2",
        "--plain",
    )
    assert_one_line_error(result, f"cannot reach 127.0.0.1:{port}", "--mirror", "--offline")


def test_cli_offline_missing_is_one_line(tmp_path: Path, locked: Path) -> None:
    result = run_cli("fetch", "gfx1151", "--recipes", locked, "--cache-dir", tmp_path / "cache", "--offline")
    last = assert_one_line_error(result, "--offline", "missing from the cache", "cpython-", "more")
    lock, pylock = read_lock(locked / "locks", "stable", "gfx1151")
    python = load_recipes(locked).python
    total = len(lock.artifacts) + len(wheel_artifacts(pylock, python.minor, python.platform, frozenset({BUILD_GROUP})))
    assert re.search(rf"{total} artifact\(s\) missing .* and {total - SHOWN_MISSING} more", last), last


def test_cli_disk_full_is_one_line(upstream: UpstreamServer, tmp_path: Path, locked: Path) -> None:
    with small_disk(tmp_path / "tiny", "8k") as disk:
        result = run_cli(
            "fetch",
            "gfx1151",
            "--recipes",
            locked,
            "--cache-dir",
            disk,
            "--mirror",
            f"{upstream.url}/mirror/",
            "--plain",
            "--jobs",
            "1",
        )
        assert_one_line_error(result, "disk full while downloading", "partial file was removed", "--cache-dir")
        assert not [p for p in (disk / "partial").iterdir() if p.suffix == ".part"]


def test_two_concurrent_fetches_share_one_cache(
    upstream: UpstreamServer, fixture_tree: Fixture, tmp_path: Path, locked: Path
) -> None:
    # Slow the biggest file down so that both processes are in flight together.
    upstream.inject("*", Fault("throttle", times=None, rate=8_000_000))
    command: list[str | Path] = [
        "fetch",
        "gfx1151",
        "--recipes",
        locked,
        "--cache-dir",
        tmp_path / "cache",
        "--mirror",
        f"{upstream.url}/mirror/",
        "--plain",
    ]
    import sys

    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "vllm_bundle", *map(str, command)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    gets = [r for r in upstream.log if r.method == "GET"]
    assert len({r.path for r in gets}) == len(gets), "each file was downloaded once, by one of the two"
    again = run_cli(*command, "--offline")
    assert again.returncode == 0, again.stderr


def test_rich_progress_on_a_terminal(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    from rich.console import Console

    from vllm_bundle.util.progress import RichReporter

    screen = io.StringIO()
    artifact = artifact_for(blob, upstream)
    upstream.inject("/files/blob.bin", Fault("cut", after=100_000))
    reporter = RichReporter(Console(file=screen, force_terminal=True, width=120), artifact.size)
    with Fetcher(Cache(tmp_path / "cache"), reporter, policy=FAST) as fetcher:
        fetcher.fetch_all([artifact])
    output = screen.getvalue()
    assert "blob.bin" in output and "total" in output and "retry" in output


def test_plain_progress_lines_when_not_a_terminal(locked: Path, upstream: UpstreamServer, tmp_path: Path) -> None:
    result = run_cli(
        "fetch",
        "gfx1151",
        "--recipes",
        locked,
        "--cache-dir",
        tmp_path / "cache",
        "--mirror",
        f"{upstream.url}/mirror/",
    )
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in result.stderr, "no terminal escapes in logs"
    assert any(line.startswith(f"done   torch-{TORCH_VERSION.split('+')[0]}") for line in result.stderr.splitlines())
    assert "already cached" in result.stdout


def test_a_refused_connection_fails_fast_with_default_retries(tmp_path: Path, locked: Path) -> None:
    import socket
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    began = time.monotonic()
    result = run_cli(
        *("fetch", "gfx1151", "--recipes", locked, "--cache-dir", tmp_path / "cache"),
        *("--mirror", f"http://127.0.0.1:{port}/", "--plain"),
    )
    elapsed = time.monotonic() - began
    last = assert_one_line_error(result, f"cannot reach 127.0.0.1:{port}", "connection refused")
    assert elapsed < 10, f"a refused connection took {elapsed:.1f} s"
    assert "Connection(" not in last and "object at 0x" not in last, last


def test_retry_lines_say_why_in_words(upstream: UpstreamServer, blob: Path, tmp_path: Path) -> None:
    artifact = artifact_for(blob, upstream)
    upstream.inject("/files/blob.bin", Fault("cut", after=65536))
    fetcher, log = make_fetcher(tmp_path / "cache")
    fetcher.fetch_one(artifact)
    (retry,) = [line for line in log.getvalue().splitlines() if line.startswith("retry")]
    assert "connection broken after 65536 of" in retry, retry
    assert "(" not in retry.split(":", 1)[1].split(";")[0], f"no tuple or object repr: {retry}"


def test_a_full_disk_anywhere_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Beyond the places that name what filled up (downloads, extraction, stages), any write a verb makes
    on a full disk (a lock file, a measured wheel) still ends in one line and a non-zero exit."""
    import errno

    from vllm_bundle import cli
    from vllm_bundle.errors import DiskFullError
    from vllm_bundle.pipeline import verbs

    def full(_: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "locks" / "gfx1151.toml"))

    monkeypatch.setattr(verbs, "cmd_lock", full)
    assert cli.main(["lock", "gfx1151"]) == DiskFullError.exit_code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: no space left on device writing ") and "free space" in err


# -- every write into the cache goes through Cache; a full disk on any of them leaves no partial file ----


def _no_partial_files(cache: Cache) -> bool:
    partial = cache.root / "partial"
    return not partial.exists() or not list(partial.iterdir())


@pytest.mark.parametrize("room", [10, 100_000], ids=["meta-file", "partial-file"])
def test_a_full_disk_on_any_write_of_a_download_leaves_no_partial_file(
    upstream: UpstreamServer, blob: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: int
) -> None:
    artifact = artifact_for(blob, upstream)
    fetcher, _ = make_fetcher(tmp_path / "cache")
    disk_filling_up(monkeypatch, room)
    with pytest.raises(DiskFullError, match=r"disk full while downloading blob\.bin .*the partial file was removed"):
        fetcher.fetch_one(artifact)
    assert _no_partial_files(fetcher.cache) and not fetcher.cache.has(artifact.sha256, None)


def test_a_full_disk_while_copying_from_a_mirror_directory_leaves_no_partial_file(
    upstream: UpstreamServer, blob: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifact = artifact_for(blob, upstream)
    fetcher, _ = make_fetcher(tmp_path / "cache", mirror=str(blob.parent))
    disk_filling_up(monkeypatch, 100_000)
    with pytest.raises(DiskFullError, match=r"disk full while downloading blob\.bin"):
        fetcher.fetch_one(artifact)
    assert _no_partial_files(fetcher.cache) and not fetcher.cache.has(artifact.sha256, None)
    assert upstream.log == [], "the mirror directory was read, not the network"


def test_a_full_disk_while_measuring_leaves_no_partial_file(
    upstream: UpstreamServer, blob: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetcher, _ = make_fetcher(tmp_path / "cache")
    disk_filling_up(monkeypatch, 100_000)
    with pytest.raises(DiskFullError, match=r"disk full while downloading blob\.bin"):
        fetcher.measure("blob", blob.name, f"{upstream.url}/files/{blob.name}")
    assert _no_partial_files(fetcher.cache) and not (tmp_path / "cache" / "blobs").exists()


def test_small_bytes_enter_the_cache_under_their_sha256_through_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_bundle.errors import CorruptCacheError

    cache = Cache(tmp_path / "cache")
    data = b'{"schemaVersion":2}'
    path = cache.store(data, "a manifest")
    assert path == cache.blob(hashlib.sha256(data).hexdigest()) and path.read_bytes() == data
    assert cache.store(data, "a manifest") == path and _no_partial_files(cache)
    victim = tmp_path / "victim"
    victim.write_text("kept")
    planted = cache.partial(hashlib.sha256(b"linked").hexdigest())
    planted.symlink_to(victim)
    with pytest.raises(CorruptCacheError, match="symbolic link"):
        cache.store(b"linked", "a linked manifest")
    assert victim.read_text() == "kept"
    planted.unlink()
    disk_filling_up(monkeypatch, 5)
    with pytest.raises(DiskFullError, match="disk full while downloading another manifest"):
        cache.store(b"more than five bytes", "another manifest")
    assert _no_partial_files(cache) and not cache.has(hashlib.sha256(b"more than five bytes").hexdigest(), None)
