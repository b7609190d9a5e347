"""The transport's policy, each part with one home: the timeouts every request of a session waits, and
the one retry loop (beside urllib3's) every hand-written retry goes through."""

from __future__ import annotations

import socket
import time

import pytest
import requests

from vllm_bundle.util.transport import RetryPolicy, RetryStatus, make_session, raise_for_retry_status, retrying


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
