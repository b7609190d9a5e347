"""The transport's policy, each part with one home: the timeouts every request of a session waits, and
the one retry loop (beside urllib3's) every hand-written retry goes through."""

from __future__ import annotations

import socket
import time

import pytest
import requests

from vllm_bundle.util.transport import RetryPolicy, make_session


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
