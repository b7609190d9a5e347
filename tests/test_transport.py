"""The transport's policy, each part with one home: the timeouts every request of a session waits, and
the one retry loop (beside urllib3's) every hand-written retry goes through."""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from vllm_bundle.util.policy import RetryPolicy
from vllm_bundle.util.transport import (
    BodyTooLarge,
    BodyTooSlow,
    RetryStatus,
    describe,
    make_session,
    raise_for_retry_status,
    range_answer_problem,
    retrying,
)


@pytest.mark.timeout(30)
def test_every_request_of_a_session_waits_the_policys_timeouts() -> None:
    """A host that takes the connection and never answers: a request naming no timeout gives up after the
    policy's read timeout (the lock's index requests name none), one naming its own keeps it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()  # connections wait in the backlog: connected, never answered
        url = f"http://127.0.0.1:{server.getsockname()[1]}/"
        policy = RetryPolicy(attempts=1, read_timeout=0.5)
        assert policy.timeouts == (policy.connect_timeout, 0.5)
        with make_session(policy) as session:
            began = time.monotonic()
            with pytest.raises(requests.RequestException):
                session.get(url)
            assert 0.5 <= time.monotonic() - began < 10
            began = time.monotonic()
            with pytest.raises(requests.RequestException):
                session.head(url, timeout=(5, 1.5))
            assert 1.5 <= time.monotonic() - began < 10


class _Cut(Exception):
    """A transient failure, as a body cut off midway."""


class _Later(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__("busy")
        self.retry_after = retry_after


def test_the_retry_loop_tries_a_transient_failure_up_to_the_policys_attempts() -> None:
    policy = RetryPolicy(attempts=4, backoff=0.5, max_backoff=1.5)
    slept: list[float] = []
    notes: list[tuple[str, int]] = []
    tries: list[int] = []

    def failing() -> str:
        tries.append(len(tries) + 1)
        raise _Cut(f"cut {len(tries)}")

    with pytest.raises(_Cut, match="cut 4"):  # the last failure, as it is
        retrying(
            policy,
            failing,
            lambda err: isinstance(err, _Cut),
            on_failure=lambda err, failures: notes.append((str(err), failures)),
            sleep=slept.append,
        )
    assert tries == [1, 2, 3, 4] and slept == [0.5, 1.0, 1.5], "exponential backoff, capped"
    assert notes == [("cut 1", 1), ("cut 2", 2), ("cut 3", 3)], "noted before each wait"

    cuts = iter([_Cut("once")])

    def second_time() -> str:
        for cut in cuts:
            raise cut
        return "done"

    slept.clear()
    assert retrying(policy, second_time, lambda err: isinstance(err, _Cut), sleep=slept.append) == "done"
    assert slept == [0.5]


def test_the_retry_loop_gives_up_at_once_on_a_lasting_failure_and_honours_retry_after() -> None:
    policy = RetryPolicy(attempts=3, backoff=0.5, max_backoff=10.0)
    slept: list[float] = []
    tries: list[int] = []

    def refused() -> None:
        tries.append(1)
        raise ValueError("not transient")

    with pytest.raises(ValueError, match="not transient"):
        retrying(policy, refused, lambda err: isinstance(err, _Cut), sleep=slept.append)
    assert tries == [1] and slept == []
    answers = iter([_Later(7), _Later(60), None])

    def busy() -> None:
        answer = next(answers)
        if answer is not None:
            raise answer

    retrying(policy, busy, lambda err: isinstance(err, _Later), sleep=slept.append)
    assert slept == [7, 10.0], "the server's Retry-After, at most max_backoff"


def test_a_429_or_5xx_answer_is_one_to_ask_again_with_its_retry_after() -> None:
    response = requests.Response()
    response.status_code, response.headers["Retry-After"] = 503, "3"
    with pytest.raises(RetryStatus) as caught:
        raise_for_retry_status(response)
    assert caught.value.response is response and caught.value.retry_after == 3.0
    response.headers["Retry-After"] = "Wed, 21 Oct 2015 07:28:00 GMT"  # a date: the policy's backoff
    with pytest.raises(RetryStatus) as caught:
        raise_for_retry_status(response)
    assert caught.value.retry_after is None
    response.status_code = 404
    assert raise_for_retry_status(response) is response


# -- bodies read whole: at most body_limit bytes, within body_deadline seconds (#32 E4) -------------------


class _Bodies(BaseHTTPRequestHandler):
    """``/<size>``: that many zero bytes with a Content-Length; ``/<size>/chunked``: without one (chunked);
    ``/<size>/gzip``: gzipped, its Content-Length the compressed size."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, with_body: bool) -> None:
        size, _, how = self.path.strip("/").partition("/")
        body = bytes(int(size))
        self.send_response(200)
        if how == "gzip":
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        if how == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if with_body:
                for start in range(0, len(body), 4096):
                    piece = body[start : start + 4096]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)


@pytest.fixture(scope="module")
def bodies() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bodies)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.mark.parametrize("how", ["", "/chunked", "/gzip"])
def test_a_body_read_whole_may_be_as_large_as_the_policy_says_and_no_larger(bodies: str, how: str) -> None:
    """The limit counts the bytes as the caller gets them: a gzipped body by its unpacked size."""
    limit = 100_000
    with make_session(RetryPolicy(attempts=1, body_limit=limit)) as session:
        assert session.get(f"{bodies}/{limit}{how}").content == bytes(limit)
        with pytest.raises(BodyTooLarge, match="the answer is larger than 100000 bytes"):
            session.get(f"{bodies}/{limit + 1}{how}")
        assert session.get(f"{bodies}/5{how}").content == bytes(5), "the session goes on after a refusal"
        assert session.head(f"{bodies}/{10 * limit}{how}").status_code == 200, "a HEAD's length is no body"
        with session.get(f"{bodies}/{10 * limit}{how}", stream=True) as streamed:  # a download: its own business
            assert sum(len(chunk) for chunk in streamed.iter_content(1 << 16)) == 10 * limit
    with make_session(RetryPolicy(attempts=1)) as session:
        assert len(session.get(f"{bodies}/{10 * limit}{how}").content) == 10 * limit, "no limit unless asked"
    assert str(BodyTooLarge(64 << 20)) == "the answer is larger than 64 MiB"


@pytest.mark.timeout(30)
def test_a_body_that_trickles_is_given_up_on_at_the_deadline_not_at_each_read() -> None:
    """A host sending a byte every 0.1 s never trips a 1 s read timeout; the 1.5 s deadline ends it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"http://127.0.0.1:{server.getsockname()[1]}/"
        stop = threading.Event()

        def trickle() -> None:
            connection, _ = server.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
                with contextlib.suppress(OSError):
                    while not stop.wait(0.1):
                        connection.sendall(b"x")

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        policy = RetryPolicy(attempts=1, read_timeout=1, body_deadline=1.5)
        began = time.monotonic()
        try:
            with make_session(policy) as session, pytest.raises(BodyTooSlow) as caught:
                session.get(url)
        finally:
            stop.set()
            thread.join(10)
        assert 1.5 <= time.monotonic() - began < 5
        assert describe(caught.value) == "the answer did not arrive whole within 1.5 s"


def _answer(status: int, **headers: str) -> requests.Response:
    answer = requests.Response()
    answer.status_code = status
    answer.headers.update({name.replace("_", "-"): value for name, value in headers.items()})
    return answer


@pytest.mark.parametrize(
    ("answer", "first", "last", "total", "problem"),
    [
        (_answer(206, Content_Range="bytes 10-19/100", Content_Length="10"), 10, 19, 100, None),
        (_answer(206, Content_Range="bytes 10-99/*"), 10, None, 100, None),
        (_answer(206, Content_Range="bytes 10-99/100"), 10, None, None, None),
        (_answer(200), 10, 19, 100, "HTTP 200, not 206"),
        (_answer(206), 10, 19, 100, "a Content-Range of '', not bytes"),
        (_answer(206, Content_Range="bytes */100"), 10, 19, 100, "a Content-Range of 'bytes */100'"),
        (_answer(206, Content_Range="bytes 11-19/100"), 10, 19, 100, "the range bytes 11-19/100 for bytes 10-19/100"),
        (_answer(206, Content_Range="bytes 10-20/100"), 10, 19, 100, "the range bytes 10-20/100 for"),
        (_answer(206, Content_Range="bytes 10-98/100"), 10, None, 100, "for bytes 10-99/100"),
        (_answer(206, Content_Range="bytes 10-19/101"), 10, 19, 100, "the range bytes 10-19/101"),
        (_answer(206, Content_Range="bytes 19-10/100"), 19, None, None, "the range bytes 19-10/100"),
        (_answer(206, Content_Range="bytes 10-19/100", Content_Length="11"), 10, 19, 100, "a Content-Length of '11'"),
    ],
    ids=[
        "exact",
        "to-the-end-total-unknown-to-the-server",
        "to-the-end-total-unknown-to-us",
        "not-206",
        "no-content-range",
        "unsatisfied-form",
        "other-first",
        "other-last",
        "short-of-the-end",
        "other-total",
        "backwards",
        "other-length",
    ],
)
def test_a_ranged_answer_is_checked_for_the_bytes_asked(
    answer: requests.Response, first: int, last: int | None, total: int | None, problem: str | None
) -> None:
    """The one check of every ranged read (a resumed download, a delta's members, a wheel read in place):
    each reader's own test serves it a wrong Content-Range (test_fetch, test_delta, test_probe)."""
    said = range_answer_problem(answer, first, last, total)
    assert said == problem if problem is None else (said is not None and problem in said), said
