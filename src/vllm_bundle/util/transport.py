"""HTTP transport: one requests session with urllib3 retries and the policy's timeouts, and the URL policy.

Connect errors, timeouts and 429/5xx answers are retried by urllib3 with exponential backoff (and
Retry-After honoured); a connection that drops in the middle of a body is resumed by the fetcher.
Every request of a session from :func:`make_session` has the policy's (connect, read) timeouts unless
it names its own, so no call site spells out a number. What urllib3 does not retry (a body cut off
midway, an upload's POST, PATCH or PUT) goes through the one hand-written loop, :func:`retrying`.

A policy may also bound a body read whole (a request that is not streamed: an index page, a checksum
list, a wheel's range): at most ``body_limit`` bytes, arriving whole within ``body_deadline`` seconds.
The read timeout bounds each read only, so a host sending a byte per read timeout would otherwise keep
the run forever, and requests reads a body of any size into memory.

Every ranged read checks its answer with :func:`range_answer_problem`.
"""

from __future__ import annotations

import errno
import http.client
import io
import ipaddress
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from vllm_bundle import __version__
from vllm_bundle.errors import InsecureURLError
from vllm_bundle.util.policy import RetryPolicy

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
T = TypeVar("T")


#: The most one read of a body read whole asks for.
_CHUNK = 1 << 16
#: urllib3's errors while a body is read, as requests' ``iter_content`` raises them.
_AS_REQUESTS_ERRORS: tuple[tuple[type[Exception], type[requests.RequestException]], ...] = (
    (urllib3.exceptions.ProtocolError, requests.exceptions.ChunkedEncodingError),
    (urllib3.exceptions.DecodeError, requests.exceptions.ContentDecodingError),
    (urllib3.exceptions.ReadTimeoutError, requests.exceptions.ConnectionError),
    (urllib3.exceptions.SSLError, requests.exceptions.SSLError),
)


class BodyTooLarge(requests.RequestException):
    """A body read whole is larger than the policy's ``body_limit``."""

    def __init__(self, limit: int) -> None:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 and not limit % (1 << 20) else f"{limit} bytes"
        super().__init__(f"the answer is larger than {size}")


class BodyTooSlow(requests.RequestException):
    """A body read whole was still arriving at the policy's ``body_deadline``."""

    def __init__(self, deadline: float) -> None:
        super().__init__(f"the answer did not arrive whole within {deadline:g} s")


class RetryStatus(Exception):
    """An answer worth asking again (429, 5xx): ``response`` is it, ``retry_after`` the seconds its
    Retry-After asks for, if it says."""

    def __init__(self, response: requests.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response
        after = response.headers.get("retry-after", "")
        self.retry_after = float(after) if after.isdigit() else None


def raise_for_retry_status(response: requests.Response) -> requests.Response:
    """``response``, unless its status is one to ask again for (:class:`RetryStatus`)."""
    if response.status_code in RETRY_STATUSES:
        raise RetryStatus(response)
    return response


def retrying(
    policy: RetryPolicy,
    attempt: Callable[[], T],
    transient: Callable[[Exception], bool],
    *,
    on_failure: Callable[[Exception, int], object] = lambda err, failures: None,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """``attempt()``, tried again while it fails with an exception ``transient`` says may pass, up to
    ``policy.attempts`` tries in all. Between tries: ``on_failure(err, failures)``, then the policy's
    backoff (or the ``retry_after`` seconds the exception carries, at most ``max_backoff``). The last
    failure, or one that is not transient, is raised as it is."""
    failures = 0
    while True:
        try:
            return attempt()
        except Exception as err:
            failures += 1
            if failures >= policy.attempts or not transient(err):
                raise
            on_failure(err, failures)
            after: float | None = getattr(err, "retry_after", None)
            sleep(min(policy.max_backoff, after) if after is not None else policy.delay(failures))


CONTENT_RANGE = re.compile(r"bytes (?P<first>[0-9]+)-(?P<last>[0-9]+)/(?P<total>[0-9]+|\*)")


def range_answer_problem(answer: requests.Response, first: int, last: int | None, total: int | None) -> str | None:
    """What is wrong with ``answer`` as the answer to ``Range: bytes=<first>-<last>`` (``last`` None: to
    the end) of a resource of ``total`` bytes (None: not known), or None. The one check of every ranged
    read (a resumed download, a delta's members, a wheel read in place): HTTP 206; a ``Content-Range``
    (RFC 9110 14.4) of exactly that span, and of that total where both say one; a ``Content-Length``, where
    sent, of the span's size. A server that answers other bytes than asked is caught here, not by the
    sha256 after the whole body was read."""
    if answer.status_code != 206:
        return f"HTTP {answer.status_code}, not 206 (Partial Content)"
    header = answer.headers.get("Content-Range", "")
    span = CONTENT_RANGE.fullmatch(header.strip())
    if span is None:
        return f"a Content-Range of {header[:60]!r}, not bytes <first>-<last>/<total>"
    got_first, got_last, got_total = int(span["first"]), int(span["last"]), span["total"]
    if last is None and total is not None:
        last = total - 1
    wrong_total = total is not None and got_total != "*" and int(got_total) != total
    if got_first != first or (last is not None and got_last != last) or got_last < got_first or wrong_total:
        asked = f"bytes {first}-{'' if last is None else last}/{'*' if total is None else total}"
        return f"the range {header} for {asked}"
    length = answer.headers.get("Content-Length")
    if length is not None and length.strip() != str(got_last - got_first + 1):
        return f"a Content-Length of {length[:20]!r} for the range {header} ({got_last - got_first + 1} bytes)"
    return None


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_url(url: str, redirected_from: str | None = None) -> None:
    """HTTPS only, except loopback hosts (local mirrors, the test upstream)."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return
    if parts.scheme == "http" and is_loopback(parts.hostname):
        return
    hop = f" (a redirect from {redirected_from})" if redirected_from else ""
    raise InsecureURLError(
        f"refusing to download {url}{hop}: only https:// URLs (or http:// on a loopback address) are allowed",
        "use an https mirror or a local directory with --mirror",
    )


def _check_redirect(response: requests.Response, *args: object, **kwargs: object) -> None:
    """Every hop of a redirect is held to :func:`check_url` before it is followed: an https mirror (or a
    loopback one) answering 302 to a plain-http host would otherwise hand us bytes and manifests over an
    unchecked hop. A requests response hook: it sees each answer, redirects included, before the next
    request is made."""
    if response.is_redirect:
        check_url(urljoin(response.url, response.headers["location"]), redirected_from=response.url)


def _read_whole(response: requests.Response, started: float, limit: int | None, deadline: float | None) -> None:
    """Read the body of a request that is not streamed into ``response``, as requests would, but at most
    ``limit`` bytes and no later than ``deadline`` seconds after ``started``. ``read1`` returns what one
    read of the socket brings, so a body that trickles is looked at between its bytes, not after 64 KiB of
    them. urllib3's errors become requests' as requests' own reading turns them.

    The body grows in one BytesIO, whose ``getvalue`` hands over its buffer without a copy: a list of
    chunks joined at the end held every page twice at its end (issue #51)."""
    declared = response.raw.length_remaining  # urllib3's: Content-Length, 0 for HEAD, 204 and 304
    if limit is not None and declared is not None and declared > limit:
        response.close()
        raise BodyTooLarge(limit)
    body = io.BytesIO()
    size = 0
    try:
        while chunk := response.raw.read1(_CHUNK, decode_content=True):
            size += len(chunk)
            if limit is not None and size > limit:
                raise BodyTooLarge(limit)
            if deadline is not None and time.monotonic() - started > deadline:
                raise BodyTooSlow(deadline)
            body.write(chunk)
    except BaseException as err:
        response.close()
        for theirs, ours in _AS_REQUESTS_ERRORS:
            if isinstance(err, theirs):
                raise ours(err) from err
        raise
    response._content = body.getvalue()


class _PolicyAdapter(HTTPAdapter):
    """urllib3's retries, the policy's timeouts for a request that names none (a requests session has no
    timeout of its own: without one, a host that stops answering hangs the run), and its bounds on a
    body read whole."""

    def __init__(self, policy: RetryPolicy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timeouts = policy.timeouts
        self.body_limit, self.body_deadline = policy.body_limit, policy.body_deadline

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float, float] | tuple[float, None] | None = None,
        verify: bool | str = True,
        cert: bytes | str | tuple[bytes | str, bytes | str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        started = time.monotonic()
        response = super().send(request, stream, self.timeouts if timeout is None else timeout, verify, cert, proxies)
        if not stream and (self.body_limit is not None or self.body_deadline is not None):
            _read_whole(response, started, self.body_limit, self.body_deadline)
        return response


def make_session(policy: RetryPolicy, pool_size: int = 8) -> requests.Session:
    retry = Retry(
        total=policy.attempts - 1,
        connect=min(policy.connect_attempts, policy.attempts) - 1,
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
    adapter = _PolicyAdapter(policy, max_retries=retry, pool_connections=pool_size, pool_maxsize=pool_size)
    session = requests.Session()
    session.hooks["response"].append(_check_redirect)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    session.headers["User-Agent"] = f"vllm-bundle/{__version__}"
    # Compressed transfer would make byte offsets (Range) and sizes meaningless.
    session.headers["Accept-Encoding"] = "identity"
    return session


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and what it wraps: requests and urllib3 nest their causes in args, reason and __cause__."""
    seen: set[int] = set()
    pending: list[BaseException] = [err]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        nested = [getattr(current, "reason", None), current.__cause__, current.__context__]
        nested += [arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException)]
        pending += [item for item in nested if isinstance(item, BaseException)]


def describe(err: BaseException) -> str:
    """A network failure in a few words ("connection refused", "host name not found", "connection broken
    after N of M bytes"), never a tuple or an object's repr. Hand-written: requests and urllib3 nest
    the cause several levels deep and print it as Python reprs."""
    chain = list(_chain(err))
    for item in chain:
        if isinstance(item, http.client.IncompleteRead):  # urllib3's too; its `partial` is a count
            done = item.partial if isinstance(item.partial, int) else len(item.partial)
            total = f" of {done + item.expected}" if isinstance(item.expected, int) else ""
            return f"connection broken after {done}{total} bytes"
        if isinstance(item, urllib3.exceptions.NameResolutionError | socket.gaierror):
            return "host name not found"
        if isinstance(item, ConnectionRefusedError) or getattr(item, "errno", None) == errno.ECONNREFUSED:
            return "connection refused"
        if isinstance(item, ConnectionResetError):
            return "connection reset by the server"
        if isinstance(item, ssl.SSLError):
            return f"TLS error: {item.reason or item}"
    # Last: urllib3's NewConnectionError is a ConnectTimeoutError whatever the cause found above.
    for item in chain:
        if isinstance(item, urllib3.exceptions.ConnectTimeoutError | requests.ConnectTimeout):
            return "connection timed out"
        if isinstance(item, urllib3.exceptions.ReadTimeoutError | requests.ReadTimeout | TimeoutError):
            return "no data before the read timeout"
    text = str(chain[-1]) or type(chain[-1]).__name__
    return " ".join(text.split())[:200]


def is_connect_failure(err: BaseException) -> bool:
    """True when the host could not be reached at all (urllib3 has already retried those)."""
    if isinstance(err, requests.ConnectTimeout):
        return True
    if not isinstance(err, requests.ConnectionError):
        return False
    reason = getattr(err.args[0], "reason", None) if err.args else None
    return isinstance(reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
