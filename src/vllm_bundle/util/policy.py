"""How hard a download tries, and what a page read whole may be: the policy every HTTP reader is given
(util/transport.py applies it). Standard library only, so the command line can show its defaults without
importing an HTTP stack (requests and urllib3 took 0.13 s of each run's 0.37 s start)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. ``attempts`` counts tries per request and per resumed body."""

    attempts: int = 6
    #: A host that refuses the connection or has no address is rarely back a second later: fewer tries.
    connect_attempts: int = 3
    backoff: float = 0.5  # seconds; doubles each retry
    max_backoff: float = 30.0
    connect_timeout: float = 15.0
    read_timeout: float = 60.0  # a stalled body is abandoned (and resumed) after this long
    #: A body read whole may be at most this many bytes (:class:`BodyTooLarge`); None: any size.
    body_limit: int | None = None
    #: Seconds a body read whole may take, from the request on, however it trickles (:class:`BodyTooSlow`;
    #: caught at the first read that ends after it, so at most one read timeout late); None: no deadline.
    body_deadline: float | None = None

    @property
    def timeouts(self) -> tuple[float, float]:
        """(connect, read) seconds: what every request of a session made with this policy waits."""
        return (self.connect_timeout, self.read_timeout)

    def delay(self, attempt: int) -> float:
        return float(min(self.max_backoff, self.backoff * (2 ** max(0, attempt - 1))))


#: What a policy that bounds bodies allows when it reads pages: far more than any index page (PyPI's largest
#: simple pages are a few MiB), and a deadline far beyond what one takes on a slow link.
PAGE_LIMIT = 64 << 20
PAGE_DEADLINE = 300.0
