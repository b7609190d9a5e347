"""HTTP transport: one requests session with urllib3 retries, and the URL policy.

Connect errors, timeouts and 429/5xx answers are retried by urllib3 with exponential backoff (and
Retry-After honoured); a connection that drops in the middle of a body is resumed by the fetcher.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from vllm_bundle import __version__
from vllm_bundle.errors import InsecureURLError

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. ``attempts`` counts tries per request and per resumed body."""

    attempts: int = 6
    backoff: float = 0.5  # seconds; doubles each retry
    max_backoff: float = 30.0
    connect_timeout: float = 15.0
    read_timeout: float = 60.0  # a stalled body is abandoned (and resumed) after this long

    def delay(self, attempt: int) -> float:
        return float(min(self.max_backoff, self.backoff * (2 ** max(0, attempt - 1))))


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_url(url: str) -> None:
    """HTTPS only, except loopback hosts (local mirrors, the test upstream)."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return
    if parts.scheme == "http" and is_loopback(parts.hostname):
        return
    raise InsecureURLError(
        f"refusing to download {url}: only https:// URLs (or http:// on a loopback address) are allowed",
        "use an https mirror or a local directory with --mirror",
    )


def make_session(policy: RetryPolicy, pool_size: int = 8) -> requests.Session:
    retry = Retry(
        total=policy.attempts - 1,
        connect=policy.attempts - 1,
        read=0,  # body errors are resumed by the fetcher, not restarted from zero
        status=policy.attempts - 1,
        other=policy.attempts - 1,
        backoff_factor=policy.backoff,
        backoff_max=policy.max_backoff,
        status_forcelist=RETRY_STATUSES,
        allowed_methods=frozenset({"GET", "HEAD"}),
        respect_retry_after_header=True,
        raise_on_status=False,
    )
    adapter = HTTPAdapter(max_retries=retry, pool_connections=pool_size, pool_maxsize=pool_size)
    session = requests.Session()
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    session.headers["User-Agent"] = f"vllm-bundle/{__version__}"
    # Compressed transfer would make byte offsets (Range) and sizes meaningless.
    session.headers["Accept-Encoding"] = "identity"
    return session
