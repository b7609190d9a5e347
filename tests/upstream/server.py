"""A local HTTP server on 127.0.0.1 that plays upstream (release mirror + package index), with faults.

Hand-written on http.server because fault injection at the byte level (cut a body after N bytes,
stall mid-body, ignore Range) needs control that ready-made test servers do not expose.

Serving rules:
- files under ``root`` by path; ``GET /x/`` serves ``x/index.json`` when the client asks for PEP 691
  JSON (Accept), else ``x/index.html`` (PEP 503);
- Range (``bytes=N-`` / ``bytes=N-M``) with 206 + Content-Range, If-Range against a strong ETag;
- a path that does not exist answers 404, or the status the fixture's ``missing-status.json`` gives for
  its directory (TheRock's repo.amd.com answers 403: facts.toml);
- every request is logged with the bytes of body it carried, so tests can assert what was moved.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


class LoopbackServer(ThreadingHTTPServer):
    """A test's HTTP server on loopback. Clients in the tests cut connections on purpose (a killed
    download, a deadline given up on): such a cut is the test's business, not a traceback on the run's
    stderr, where pytest-xdist's workers would print it among the results."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


@dataclass
class Fault:
    """One misbehaviour, applied to the next ``times`` requests of a path (None: every request)."""

    # "status" | "cut" | "ignore-range" | "wrong-bytes" (the file's first 64) | "wrong-range" (a 206
    # answer's first 64: a range of other bytes; a 200 is sent as it is) | "other-range" (a 206 whose
    # Content-Range names the span one byte later than the bytes sent) | "stall" | "throttle" | "redirect"
    # | "hold" (the headers, then the body only once ``until`` is set, or after ``seconds``: 60 if 0)
    kind: str
    times: int | None = 1
    status: int = 500
    retry_after: str | None = None
    after: int = 0  # cut/stall: body bytes sent first
    seconds: float = 0.0  # stall length
    rate: int = 0  # throttle: bytes per second
    agent: str = ""  # only requests whose User-Agent starts with this (uv and the tool share the upstream)
    location: str = ""  # redirect: where a 302 sends the client
    until: threading.Event | None = None  # hold: the body goes out once this is set
    ranged: bool = False  # only requests with a Range header (a delta's, not the whole part's download)


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int


class SharedLink:
    """One link of ``rate`` bytes per second that every answer's body shares, as a home connection is
    shared by parallel downloads (the "throttle" fault paces each answer on its own instead)."""

    def __init__(self, rate: int) -> None:
        self.rate, self.lock, self.free_at = rate, threading.Lock(), time.monotonic()

    def reserve(self, size: int) -> float:
        """When ``size`` more bytes will have gone through: the link's next free moment after them."""
        with self.lock:
            start = max(time.monotonic(), self.free_at)
            self.free_at = start + size / self.rate
            return self.free_at


@dataclass
class UpstreamServer:
    root: Path
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    log: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    missing_status: dict[str, int] = field(default_factory=dict)  # path prefix -> status for what is not there
    in_flight: int = 0  # bodies being sent now
    most_in_flight: int = 0  # the most bodies sent at once since the last reset
    link: SharedLink | None = None  # every body through one link of this rate (the bench's 100 Mbit/s)
    httpd: LoopbackServer | None = None
    _thread: threading.Thread | None = None

    # -- control -----------------------------------------------------------------------------

    def start(self) -> UpstreamServer:
        statuses = self.root / "missing-status.json"
        if not self.missing_status and statuses.is_file():
            self.missing_status = json.loads(statuses.read_text())
        handler = type("Handler", (_Handler,), {"upstream": self})
        self.httpd = LoopbackServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()

    @property
    def url(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def inject(self, path: str, *faults: Fault) -> None:
        with self.lock:
            self.faults.setdefault(path, []).extend(faults)

    def reset(self) -> None:
        with self.lock:
            self.faults.clear()
            self.log.clear()
            self.most_in_flight = 0

    def requests_for(self, path: str) -> list[Request]:
        with self.lock:
            return [r for r in self.log if r.path == path]

    def body_bytes(self, path: str | None = None) -> int:
        with self.lock:
            return sum(r.body_bytes for r in self.log if path is None or r.path == path)

    # -- used by the handler -----------------------------------------------------------------

    def take_fault(self, path: str, agent: str = "", ranged: bool = False) -> Fault | None:
        with self.lock:
            queue = self.faults.get(path) or self.faults.get("*")
            if not queue or not agent.startswith(queue[0].agent) or (queue[0].ranged and not ranged):
                return None
            fault = queue[0]
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    queue.pop(0)
            return fault

    def status_for_missing(self, path: str) -> int:
        with self.lock:
            found = [prefix for prefix in self.missing_status if path.startswith(prefix)]
            return self.missing_status[max(found, key=len)] if found else 404

    def record(self, request: Request) -> None:
        with self.lock:
            self.log.append(request)


class _Handler(BaseHTTPRequestHandler):
    upstream: UpstreamServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # As web servers do (nginx/nginx src/http/ngx_http_core_module.c, ngx_http_core_merge_loc_conf:
        # tcp_nodelay defaults to 1): without it, an answer on a kept-alive connection whose body follows
        # its headers in a second write waits for the client's delayed ACK, and every request of a
        # session took 44 ms on loopback.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _resolve(self, path: str) -> Path | None:
        target = (self.upstream.root / path.lstrip("/")).resolve()
        if not target.is_relative_to(self.upstream.root.resolve()):
            return None
        if path.endswith("/"):
            wants_json = JSON_TYPE in self.headers.get("Accept", "")
            target = target / ("index.json" if wants_json and (target / "index.json").exists() else "index.html")
        return target if target.is_file() else None

    def _serve(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        fault = self.upstream.take_fault(path, self.headers.get("User-Agent", ""), "Range" in self.headers)
        if fault and fault.kind == "status":
            self._status_only(path, fault)
            return
        if fault and fault.kind == "redirect":
            self._send_simple(path, 302, b"", {"Location": fault.location})
            return
        file = self._resolve(path)
        if file is None:
            status = self.upstream.status_for_missing(path)
            self._send_simple(path, status, b"not found" if status == 404 else b"AccessDenied")
            return
        data = file.read_bytes()
        if fault and fault.kind == "wrong-bytes":
            data = bytes(b ^ 0x5A for b in data[:64]) + data[64:]
        etag = '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
        start, end, status = self._range(len(data), etag, ignore=bool(fault and fault.kind == "ignore-range"))
        if status == 416:
            self._send_simple(path, 416, b"", {"Content-Range": f"bytes */{len(data)}"})
            return
        body = data[start : end + 1]
        if fault and fault.kind == "wrong-range" and status == 206:
            body = bytes(b ^ 0x5A for b in body[:64]) + body[64:]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", self._content_type(file))
        if status == 206:
            shift = 1 if fault and fault.kind == "other-range" else 0
            self.send_header("Content-Range", f"bytes {start + shift}-{end + shift}/{len(data)}")
        self.end_headers()
        # Logged before the body goes out, so a client that has read it finds the entry in place.
        planned = 0 if head else self._planned_bytes(len(body), fault)
        entry = Request(self.command, path, self.headers.get("Range"), status, planned)
        self.upstream.record(entry)
        if not head:
            with self.upstream.lock:
                self.upstream.in_flight += 1
                self.upstream.most_in_flight = max(self.upstream.most_in_flight, self.upstream.in_flight)
            sent = 0
            try:
                sent = self._send_body(body, fault)
            finally:
                with self.upstream.lock:
                    self.upstream.in_flight -= 1
                    entry.body_bytes = sent

    @staticmethod
    def _planned_bytes(length: int, fault: Fault | None) -> int:
        return min(fault.after, length) if fault and fault.kind in ("cut", "stall") else length

    def _range(self, total: int, etag: str, ignore: bool) -> tuple[int, int, int]:
        header = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if ignore or not header or not header.startswith("bytes=") or (if_range and if_range != etag):
            return 0, total - 1, 200
        first, _, last = header[len("bytes=") :].partition("-")
        start = int(first or 0)
        end = min(int(last), total - 1) if last else total - 1
        if start >= total:
            return 0, 0, 416
        return start, end, 206

    def _send_body(self, body: bytes, fault: Fault | None) -> int:
        sent = 0
        try:
            if fault and fault.kind in ("cut", "stall"):
                self.wfile.write(body[: fault.after])
                self.wfile.flush()
                sent = min(fault.after, len(body))
                if fault.kind == "stall":
                    time.sleep(fault.seconds)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return sent
            if fault and fault.kind == "throttle":
                return self._send_throttled(body, fault.rate)
            if fault and fault.kind == "hold":
                assert fault.until is not None, "a hold fault needs the event that lets its body go"
                fault.until.wait(fault.seconds or 60)
            if self.upstream.link is not None:
                return self._send_on_link(body, self.upstream.link)
            self.wfile.write(body)
            return len(body)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
            return sent

    def _send_throttled(self, body: bytes, rate: int) -> int:
        step = max(1, rate // 20)
        began = time.monotonic()
        sent = 0
        while sent < len(body):
            self.wfile.write(body[sent : sent + step])
            sent += min(step, len(body) - sent)
            ahead = sent / rate - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)
        return sent

    def _send_on_link(self, body: bytes, link: SharedLink) -> int:
        step = max(1, link.rate // 50)
        for start in range(0, len(body), step):
            piece = body[start : start + step]
            time.sleep(max(0.0, link.reserve(len(piece)) - time.monotonic()))
            self.wfile.write(piece)
        return len(body)

    def _status_only(self, path: str, fault: Fault) -> None:
        extra = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
        self._send_simple(path, fault.status, b"injected failure", extra)

    def _send_simple(self, path: str, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.upstream.record(Request(self.command, path, self.headers.get("Range"), status, 0))
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    @staticmethod
    def _content_type(file: Path) -> str:
        if file.name == "index.json":
            return JSON_TYPE
        if file.suffix == ".html":
            return "text/html"
        return "application/octet-stream"
