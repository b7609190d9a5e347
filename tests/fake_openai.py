"""A stand-in for ``vllm serve`` on 127.0.0.1: the OpenAI-compatible endpoints tier 2 uses, with faults.

Run as the bundle's ``bin/vllm-server`` would be: ``python fake_openai.py --model M --port P ...``
(unknown vLLM arguments are ignored). ``FAKE_OPENAI_FAULT`` picks one fault:

crash             exit 3 at start with a HIP error, as a bundle built for the wrong GPU does
unhealthy         /health answers 503 forever
never-listens     the port is never opened (as while a server's Python is still starting)
completion-500    POST /v1/completions (not streaming) answers 500
chat-empty        the chat reply is empty
stream-no-done    the event stream ends without ``data: [DONE]``
nondeterministic  each completion differs (a counter in the text)
ignore-sigterm    SIGTERM is ignored (only SIGKILL stops it)
orphan            the engine child is not tied to the server: it outlives a SIGKILL of the server
serial            completions run one at a time (no batching): concurrent ones are no faster

A completion with ``ignore_eos`` (tier 2's concurrency check) takes ``max_tokens`` x 1.5 ms, as decoding
would; concurrent ones overlap (the server is threaded), unless the fault is ``serial``.

Like ``vllm serve`` it starts an engine child with multiprocessing ``spawn`` (vllm/v1/engine/utils.py,
``CoreEngineProcManager``), which ignores SIGTERM. The bundle's interpreter runs
``_vllm_bundle_runtime.orphans.arm()`` at every start (its ``.pth``); this stand-in runs on the test's
own Python, so it calls the same function itself, in the server and in the engine.

``FAKE_OPENAI_BOOT_SECONDS`` makes /health answer 503 that long first, as while a model loads.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import multiprocessing.process
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from vllm_bundle.runtime import orphans

FAULT = os.environ.get("FAKE_OPENAI_FAULT", "")
BOOT_SECONDS = float(os.environ.get("FAKE_OPENAI_BOOT_SECONDS", "0"))
STARTED = time.monotonic()
COUNTER = itertools.count()
ANSWER = " Paris. It is also the largest city of France."
SERIAL = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    served_name = "model"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"fake-openai: {format % args}\n")

    def _json(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path != "/health":
            self._json(404, {"error": "not found"})
        elif FAULT == "unhealthy" or time.monotonic() - STARTED < BOOT_SECONDS:
            self._json(503, {"error": "loading"})
        else:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if request.get("model") != self.served_name:
            self._json(404, {"error": f"the model {request.get('model')!r} does not exist"})
        elif self.path == "/v1/completions" and request.get("stream"):
            self._stream()
        elif self.path == "/v1/completions":
            if FAULT == "completion-500":
                self._json(500, {"error": "HIP error: an illegal memory access was encountered"})
                return
            if request.get("ignore_eos"):
                with SERIAL if FAULT == "serial" else contextlib.nullcontext():
                    time.sleep(int(request.get("max_tokens", 16)) * 0.0015)
            suffix = f" ({next(COUNTER)})" if FAULT == "nondeterministic" else ""
            self._json(200, {"object": "text_completion", "choices": [{"index": 0, "text": ANSWER + suffix}]})
        elif self.path == "/v1/chat/completions":
            content = "" if FAULT == "chat-empty" else "Hello!"
            message = {"role": "assistant", "content": content}
            self._json(200, {"object": "chat.completion", "choices": [{"index": 0, "message": message}]})
        else:
            self._json(404, {"error": "not found"})

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in ANSWER.split(" ")[1:]:
            chunk = {"object": "text_completion", "choices": [{"index": 0, "text": " " + word}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        if FAULT != "stream-no-done":
            self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


def engine() -> None:
    if FAULT != "orphan":
        orphans.arm()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(60)


def start_engine() -> multiprocessing.process.BaseProcess:
    if FAULT != "orphan":
        orphans.arm()
    process = multiprocessing.get_context("spawn").Process(target=engine, name="EngineCore", daemon=True)
    process.start()
    return process


def stop(process: multiprocessing.process.BaseProcess) -> None:
    """A SIGTERM'd server takes its engine down (vLLM's shutdown ends in kill_process_tree)."""
    process.kill()
    process.join()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--served-model-name", default="model")
    args, _ = parser.parse_known_args()
    if FAULT == "crash":
        sys.stderr.write("RuntimeError: HIP error: invalid device function\n")
        raise SystemExit(3)
    child = start_engine()
    if FAULT == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop(child))
    assert args.host in ("127.0.0.1", "localhost"), "tests serve on loopback only"
    Handler.served_name = args.served_model_name
    if FAULT == "never-listens":
        signal.pause()  # until the SIGTERM (or SIGKILL) the check ends with
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
