"""``vllm-bundle probe`` against the fake upstream. The fake is built from tests/upstream/facts.toml, so it
agrees with every fact; a fake changed in one fact (or a fact changed under the same fake) has that fact,
and only it, named with its source."""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest

from tests.conftest import REPO, assert_one_line_error, run_cli
from tests.upstream.fixture import (
    PYPI,
    THEROCK_MULTI_ARCH,
    THEROCK_NEXT,
    THEROCK_NIGHTLY,
    THEROCK_PER_FAMILY,
)
from tests.upstream.server import Fault, LoopbackServer, UpstreamServer
from vllm_bundle.errors import NetworkError
from vllm_bundle.inputs import remote_wheel
from vllm_bundle.inputs.remote_wheel import open_wheel
from vllm_bundle.util.policy import PAGE_LIMIT, RetryPolicy
from vllm_bundle.util.transport import make_session

FACTS = REPO / "tests" / "upstream" / "facts.toml"
INDEX = {
    "stable": THEROCK_NEXT,
    "nightly": THEROCK_NIGHTLY,
    "frozen-7.14": THEROCK_MULTI_ARCH,
    "nightly-legacy": THEROCK_PER_FAMILY,
}


def _probe(
    upstream: UpstreamServer, recipes: Path, channel: str = "stable", *extra: str | Path
) -> subprocess.CompletedProcess[str]:
    return run_cli(
        *("probe", "gfx1151", "--channel", channel, "--recipes", recipes),
        *("--therock-index", f"{upstream.url}/{INDEX.get(channel, THEROCK_NEXT)}/"),
        *("--pypi-index", f"{upstream.url}/{PYPI}/", "--mirror", f"{upstream.url}/releases/", *extra),
    )


def _differences(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("differs  ")]


@pytest.mark.parametrize("channel", list(INDEX))
def test_the_fake_upstream_agrees_with_every_fact(upstream: UpstreamServer, recipes_dir: Path, channel: str) -> None:
    result = _probe(upstream, recipes_dir, channel)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _differences(result) == []
    checked = re.search(
        rf"(?m)^ok     (\d+) facts of {re.escape(str(FACTS))} agree with what channel {channel}", result.stdout
    )
    assert checked and int(checked[1]) > 40, result.stdout
    asked = {r.path for r in upstream.log}
    index = INDEX[channel].format(family="gfx1151")
    assert f"/{index}/vllm-bundle-probe-no-such-project/" in asked, "the missing-page status was asked for"
    assert "/releases/SHA256SUMS" in asked, "the CPython asset was looked up in its release's checksums"
    files = "/files/gfx1151/" if "{family}" in INDEX[channel] else "/files/"  # a per-family index's own
    torch = [r for r in upstream.log if r.path.startswith(f"{files}torch-2.")]
    assert torch and all(r.range or r.method == "HEAD" for r in torch), "torch's METADATA read by range, not downloaded"
    if channel in ("stable", "nightly"):
        assert f"/therock/{channel}/pytorch/whl-next/torch/" in asked, "each package's owner index was asked"


# A change to the fake upstream, as the real one may differ (on channel frozen-7.14's index):
# (how, where, the line the probe must print).
FAKE_CHANGES = {
    "repo.amd.com answers 404": (
        "status",
        f"/{THEROCK_MULTI_ARCH}/",
        "differs  TheRock whl-multi-arch answers HTTP 403 for a project it does not have; found: HTTP 404",
    ),
    "a family device package is gone": (
        "fault",
        f"/{THEROCK_MULTI_ARCH}/amd-torch-device-gfx11/",
        "differs  TheRock whl-multi-arch serves amd-torch-device-gfx11; found: no project page",
    ),
}


@pytest.mark.parametrize("change", FAKE_CHANGES, ids=list(FAKE_CHANGES))
def test_a_fake_changed_in_one_fact_has_that_fact_named(
    upstream: UpstreamServer, recipes_dir: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    how, path, expected = FAKE_CHANGES[change]
    if how == "status":
        monkeypatch.setitem(upstream.missing_status, path, 404)
    else:
        upstream.inject(path, Fault("status", times=None, status=403))
    result = _probe(upstream, recipes_dir, "frozen-7.14")
    assert_one_line_error(result, "1 of", "facts of", "differ from what channel frozen-7.14 serves")
    assert [line.partition("  [fact from:")[0] for line in _differences(result)] == [expected]


def test_a_package_that_left_its_owners_index_is_named(upstream: UpstreamServer, recipes_dir: Path) -> None:
    upstream.inject("/therock/stable/pytorch/whl-next/torchvision/", Fault("status", times=None, status=404))
    result = _probe(upstream, recipes_dir, "stable")
    assert_one_line_error(result, "1 of")
    (line,) = _differences(result)
    assert "torchvision is published in pytorch's index" in line and "found: HTTP 404" in line
    assert "aggregate_index.py" in line, "the fact's source is cited"


_MANAGE = (
    'sha256-fragments-source = "ROCm/TheRock@89553ce build_tools/third_party/s3_management/manage.py '
    "to_simple_package_html: #sha256="
)

# A fact changed under the same fake, probed on channel frozen-7.14's index (whl-multi-arch): (the fact as
# it was, as it is changed, what the line names).
FACT_CHANGES = {
    "torch's SDK pin": (
        '"rocm[libraries]=={rocm}", "triton=={triton}", "rocm-bootstrap"',
        '"rocm[libraries]==9.9.9", "triton=={triton}", "rocm-bootstrap"',
        "requires rocm[libraries]==9.9.9; found: rocm[libraries]==7.14.0",
    ),
    "where device code lives": (
        '"_rocm_sdk_libraries/.kpack/blas_lib_{isa}.kpack", "_rocm_sdk_libraries/.devel_links',
        '"_rocm_sdk_libraries/lib/blas_lib_{isa}.kpack", "_rocm_sdk_libraries/.devel_links',
        "ships _rocm_sdk_libraries/lib/blas_lib_gfx1151.kpack; found: not in the wheel",
    ),
    "a CUDA library PyPI's torchvision needs": (
        '"torchvision/_C.so" = ["libcudart.so.13"',
        '"torchvision/_C.so" = ["libcudnn.so.9"',
        "torchvision/_C.so needs libcudnn.so.9; found: libcudart.so.13",
    ),
    "the SDK's wheel tag": (
        'name = "rocm-sdk-core"\nowner = "core"\ntag = "py3-none-linux_x86_64"',
        'name = "rocm-sdk-core"\nowner = "core"\ntag = "py3-none-manylinux_2_28_x86_64"',
        "tagged py3-none-manylinux_2_28_x86_64; found: rocm_sdk_core-",
    ),
    "torch's family device packages": (
        'torch-device-bundles = ["gfx11", "gfx12-0"]',
        'torch-device-bundles = ["gfx12-0"]',
        "[device-gfx1151] requires amd-torch-device-gfx1151==",
    ),
    "which pages carry hashes": (
        f'sha256-fragments = "some"\n{_MANAGE} only',
        f'sha256-fragments = "always"\n{_MANAGE} only',
        "gives #sha256 fragments: always; found: some (",
    ),
}


@pytest.mark.parametrize("change", FACT_CHANGES, ids=list(FACT_CHANGES))
def test_a_fact_the_fake_does_not_bear_out_is_named_with_its_source(
    upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path, change: str
) -> None:
    before, after, named = FACT_CHANGES[change]
    text = FACTS.read_text()
    assert text.count(before) == 1, f"premise: the facts file has {before!r} once"
    changed = tmp_path / "facts.toml"
    changed.write_text(text.replace(before, after))
    result = _probe(upstream, recipes_dir, "frozen-7.14", "--facts", changed)
    assert_one_line_error(result, "1 of", str(changed))
    (line,) = _differences(result)
    assert named in line, line
    assert "[fact from: " in line and line.rstrip().endswith("]"), "each line cites where the fact was read"


def test_a_channel_the_facts_do_not_model_is_one_line(upstream: UpstreamServer, recipes_dir: Path) -> None:
    channels = recipes_dir / "channels.toml"
    stable = channels.read_text().split("[channels.nightly]")[0].split("[channels.stable]")[1]
    channels.write_text(channels.read_text() + "[channels.mine]" + stable.replace("channels.stable.", "channels.mine."))
    result = _probe(upstream, recipes_dir, "mine")
    assert_one_line_error(
        result, "models no TheRock index of channel mine", "stable, nightly, frozen-7.14, nightly-legacy"
    )
    assert upstream.log == [], "nothing asked before the facts say what to ask"


def test_a_malformed_facts_file_is_one_line(upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "facts.toml"
    broken.write_text(FACTS.read_text().replace("missing-project = 403\n", "", 1))
    result = _probe(upstream, recipes_dir, "stable", "--facts", broken)
    assert_one_line_error(result, f"bad facts file {broken}", "missing-project")


# -- #32 E4: a host that answers with too much, or too slowly ------------------------------------------


class _Hostile(BaseHTTPRequestHandler):
    """``/endless/…``: a body without end (1 MiB blocks, no length); ``/huge/…``: one that says it is 4 GiB;
    ``/trickle/…``: a byte every 0.1 s; ``/silent/…``: headers, then nothing; anything else: an empty page.
    Every body ends when the client hangs up or the fixture stops the server."""

    protocol_version = "HTTP/1.1"
    stop: ClassVar[threading.Event]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        kind = self.path.strip("/").split("/")[0]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Connection", "close")
        if kind == "huge":
            self.send_header("Content-Length", str(4 << 30))
        elif kind not in ("endless", "trickle", "silent"):
            self.send_header("Content-Length", "0")
        self.end_headers()
        block = b"0" * (1 << 20)
        try:
            while kind in ("endless", "huge", "trickle", "silent") and not self.stop.is_set():
                if kind == "trickle":
                    self.wfile.write(b"x")
                    self.wfile.flush()
                if kind in ("trickle", "silent"):
                    self.stop.wait(0.1)
                else:
                    self.wfile.write(block)
        except OSError:  # the client hung up
            pass


@pytest.fixture
def hostile() -> Iterator[str]:
    """A loopback host that answers as :class:`_Hostile` says; its URL."""
    _Hostile.stop = threading.Event()
    server = LoopbackServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Hostile.stop.set()
    server.shutdown()
    server.server_close()
    thread.join(10)


#: The CLI with its address space capped (1.5 GiB): a body read whole until memory runs out ends in
#: MemoryError there, not in the machine's memory.
CAPPED = (
    "import resource, runpy; resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29)); "
    "runpy.run_module('vllm_bundle', run_name='__main__', alter_sys=True)"
)


def _probe_hostile(hostile: str, mirror: str, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """probe with its release files (the first thing it reads) under ``hostile/<mirror>/``, its indexes
    empty pages; a hang fails the test after ``timeout`` seconds."""
    argv = ["probe", "gfx1151", "--channel", "stable", "--mirror", f"{hostile}/{mirror}/"]
    argv += ["--therock-index", f"{hostile}/empty/", "--pypi-index", f"{hostile}/empty/", *extra]
    try:
        return subprocess.run(
            [sys.executable, "-c", CAPPED, *argv], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"probe kept reading {hostile}/{mirror}/ for {timeout:.0f} s")


@pytest.mark.parametrize("kind", ["endless", "huge"])
def test_a_page_larger_than_any_index_page_is_one_line(hostile: str, kind: str) -> None:
    """Before the fix: read whole into memory (MemoryError; a 4 GiB page as much)."""
    result = _probe_hostile(hostile, kind)
    assert "MemoryError" not in result.stderr
    assert_one_line_error(result, f"cannot download {hostile}/{kind}/SHA256SUMS", "the answer is larger than 64 MiB")
    assert result.returncode == 4, result


def test_a_host_that_trickles_is_given_up_on_at_the_deadline(hostile: str) -> None:
    """Before the fix: no deadline (a byte in every read timeout kept the probe forever), no option."""
    began = time.monotonic()
    result = _probe_hostile(hostile, "trickle", "--read-timeout", "1", "--response-deadline", "1.5", timeout=30)
    assert_one_line_error(
        result, f"cannot download {hostile}/trickle/SHA256SUMS", "the answer did not arrive whole within 1.5 s"
    )
    assert time.monotonic() - began < 15


def test_the_probe_takes_a_read_timeout(hostile: str) -> None:
    began = time.monotonic()
    result = _probe_hostile(hostile, "silent", "--read-timeout", "1", timeout=30)
    assert_one_line_error(result, f"cannot download {hostile}/silent/SHA256SUMS", "no data before the read timeout")
    assert time.monotonic() - began < 15
    for option in ("--read-timeout", "--response-deadline"):
        bad = run_cli("probe", option, "0")
        assert_one_line_error(bad, f"argument {option}", "'0' is not a number of seconds above 0")
        assert bad.returncode == 2


class _Ranges(BaseHTTPRequestHandler):
    """Serves ``body`` (HEAD and GET, one ``Range: bytes=a-b`` honoured), as an index serves a wheel."""

    body: ClassVar[bytes] = b""
    shift: ClassVar[int] = 0  # a server whose Content-Range names other bytes than it sends: shifted by this

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()

    def do_GET(self) -> None:
        first, _, last = self.headers.get("Range", "bytes=0-").removeprefix("bytes=").partition("-")
        end = int(last) if last else len(self.body) - 1
        part = self.body[int(first) : end + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {int(first) + self.shift}-{end + self.shift}/{len(self.body)}")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)


@contextlib.contextmanager
def _wheel_server(body: bytes, shift: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A loopback index serving the wheel ``body`` by range; the URL of the wheel."""
    monkeypatch.setattr(_Ranges, "body", body)
    monkeypatch.setattr(_Ranges, "shift", shift)
    server = LoopbackServer(("127.0.0.1", 0), _Ranges)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/pkg-1-py3-none-any.whl"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _wheel_of(member: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/lib.so", member)
    return buffer.getvalue()


def test_a_wheel_member_larger_than_an_answer_may_be_is_read_in_ranges_that_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zipfile reads a member's compressed bytes in one read: one range request as large as the member,
    which a session bounding its answers (the probe's) refused for a library larger than the bound."""
    member = random.Random(3).randbytes(3 << 20)  # incompressible: 3 MiB compressed too
    monkeypatch.setattr(remote_wheel, "MOST", 1 << 20)
    with _wheel_server(_wheel_of(member), 0, monkeypatch) as url:
        policy = RetryPolicy(attempts=1, read_timeout=5, body_limit=1 << 20, body_deadline=30)
        with make_session(policy) as session:
            assert open_wheel(session, url).read("pkg/lib.so") == member


def test_a_wheel_answered_with_another_range_than_asked_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 206 whose Content-Range names other bytes than asked (util/transport.py range_answer_problem, the
    check every ranged reader makes) is refused at once, not read as the wheel's."""
    with (
        _wheel_server(_wheel_of(b"x" * 1000), 1, monkeypatch) as url,
        make_session(RetryPolicy(attempts=1, read_timeout=5)) as session,
        pytest.raises(NetworkError) as refused,
    ):
        open_wheel(session, url)
    said = re.search(r"a range request with the range bytes (\d+)-\d+/\d+ for bytes (\d+)-", refused.value.message)
    assert said and int(said[1]) == int(said[2]) + 1, refused.value.message


# -- #51 F6: index pages listing far more files than any index does ------------------------------------

#: Files on each page the crowded host serves: the issue's 200,000, a 41 MiB page (under PAGE_LIMIT).
CROWDED_LINKS = 200_000


class _Crowded(BaseHTTPRequestHandler):
    """Every ``/index/<project>/`` page lists :data:`CROWDED_LINKS` wheels (each with its own version and a
    #sha256 fragment); anything else is an empty page (the probe's release checksums: a fact that differs,
    not an error, so the probe goes on to the index pages)."""

    protocol_version = "HTTP/1.1"
    page: ClassVar[bytes] = b""
    content_type: ClassVar[str] = "text/html"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = self.page if self.path.startswith("/index/") and self.path.count("/") == 3 else b""
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client gave up on the page
            self.wfile.write(body)


def _crowded_page(links: int) -> bytes:
    digest = "0" * 64
    return "".join(
        f'<a href="../../files/torch-2.9.{i}+rocm7.10.0-cp312-cp312-linux_x86_64.whl#sha256={digest}">'
        f"torch-2.9.{i}+rocm7.10.0-cp312-cp312-linux_x86_64.whl</a><br/>\n"
        for i in range(links)
    ).encode()


@pytest.fixture
def crowded() -> Iterator[str]:
    """A loopback host whose index pages each list :data:`CROWDED_LINKS` files; its URL."""
    _Crowded.page, _Crowded.content_type = _crowded_page(CROWDED_LINKS), "text/html"
    server = LoopbackServer(("127.0.0.1", 0), _Crowded)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(10)


#: The CLI with its address space capped at the issue's 2 GiB.
CAPPED_2G = CAPPED.replace("(3 << 29, 3 << 29)", "(2 << 30, 2 << 30)")


def test_index_pages_of_200000_files_are_one_line_in_bounded_memory(crowded: str) -> None:
    """Before the fix: each page (41 MiB, under the 64 MiB bound) became 200,000 parsed links kept for the
    whole run (~90 MiB of objects a page, more while parsing), page after page, until MemoryError after
    ~100 s under a 2 GiB cap. Now a page is refused at the first link past the most any index lists."""
    assert len(_Crowded.page) < PAGE_LIMIT, "premise: each page is within the bound on bytes"
    argv = ["probe", "gfx1151", "--channel", "stable", "--mirror", f"{crowded}/releases/"]
    argv += ["--therock-index", f"{crowded}/index/", "--pypi-index", f"{crowded}/index/"]
    try:
        result = subprocess.run(
            [sys.executable, "-c", CAPPED_2G, *argv], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("probe kept parsing the crowded pages for 60 s")
    assert "MemoryError" not in result.stderr, result.stderr[-2000:]
    last = assert_one_line_error(result, f"{crowded}/index/", "lists more than 100,000 files")
    assert result.returncode == 7, last  # InputError: what a host sent is not what the tool reads


def test_pages_within_the_bound_on_each_are_bounded_in_all(
    crowded: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The probe keeps every page it reads for the run: pages each within the bound on one page are bounded
    in their sum too, refused at the page that passes it (here the third, torchvision: 3 x 1,000 > 2,500)."""
    from vllm_bundle.cli import main
    from vllm_bundle.inputs import probe

    _Crowded.page = _crowded_page(1_000)
    monkeypatch.setattr(probe, "MOST_FILES_IN_ALL", 2_500)
    argv = ["probe", "gfx1151", "--channel", "stable", "--mirror", f"{crowded}/releases/"]
    assert main([*argv, "--therock-index", f"{crowded}/index/", "--pypi-index", f"{crowded}/index/"]) == 7
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "error: the index pages the probe read list more than 2,500 files in all (the last: "
        f"{crowded}/index/torchvision/): not indexes this tool reads (check the index URLs)"
    )


@pytest.mark.parametrize("kind", ["html", "json"])
def test_an_index_page_is_refused_at_the_first_file_past_the_most(crowded: str, kind: str) -> None:
    """The bound holds for every reader of index pages (the lock too), PEP 503 HTML and PEP 691 JSON alike."""
    from vllm_bundle.errors import InvalidValueError
    from vllm_bundle.inputs.simple_index import JSON_TYPE, project_files

    if kind == "json":
        files = [{"filename": f"torch-2.9.{i}-py3-none-any.whl", "url": f"t{i}.whl", "hashes": {}} for i in range(6)]
        _Crowded.page, _Crowded.content_type = json.dumps({"files": files}).encode(), JSON_TYPE
    else:
        _Crowded.page = _crowded_page(6)
    with make_session(RetryPolicy(attempts=1)) as session:
        assert len(project_files(session, f"{crowded}/index/", "torch", most=6)) == 6
        with pytest.raises(InvalidValueError) as refused:
            project_files(session, f"{crowded}/index/", "torch", most=5)
    assert str(refused.value) == (
        f"the index page {crowded}/index/torch/ lists more than 5 files: not an index page this tool reads"
        " (check the index URL)"
    )


@pytest.mark.parametrize(
    ("page", "named"),
    [
        ({"files": [{"url": "t.whl", "hashes": {}}]}, "files[0].filename is missing"),
        ({"files": [{"filename": 5, "url": "t.whl"}]}, "files[0].filename is a number, not a string"),
        ({"files": [{"filename": "t.whl"}]}, "files[0].url is missing"),
        ({"files": ["t.whl"]}, "files[0] is a string, not a JSON object"),
        ({"files": {"t.whl": {}}}, "files is a JSON object, not an array of JSON objects"),
        ({"files": [{"filename": "t.whl", "url": "t.whl", "size": "9"}]}, "files[0].size is a string, not a whole"),
        ({"files": [{"filename": "t.whl", "url": "t.whl", "hashes": []}]}, "files[0].hashes is an array"),
        ({"files": [{"filename": "t.whl", "url": "t.whl", "hashes": {"sha256": "../x"}}]}, "hashes.sha256 is '../x'"),
        ({"files": [{"filename": "t.whl", "url": "t.whl", "upload-time": "noon"}]}, "upload-time is 'noon', not an"),
        ([], "the document is an array, not a JSON object"),
    ],
    ids=[
        "no-filename",
        "filename-number",
        "no-url",
        "file-string",
        "files-object",
        "size",
        "hashes",
        "digest",
        "time",
        "array",
    ],
)
def test_a_json_index_page_with_a_bad_field_is_one_line_naming_it(crowded: str, page: object, named: str) -> None:
    """A PEP 691 page is read through the one field reader (util/fields.py): a field that is missing or of
    the wrong kind is one line naming the page and the field (before: KeyError, ValueError tracebacks)."""
    from vllm_bundle.errors import InvalidValueError
    from vllm_bundle.inputs.simple_index import JSON_TYPE, project_files

    _Crowded.page, _Crowded.content_type = json.dumps(page).encode(), JSON_TYPE
    with make_session(RetryPolicy(attempts=1)) as session, pytest.raises(InvalidValueError) as refused:
        project_files(session, f"{crowded}/index/", "torch")
    assert str(refused.value).startswith(f"the index page {crowded}/index/torch/: "), str(refused.value)
    assert named in str(refused.value) and str(refused.value).endswith("(check the index URL)")
