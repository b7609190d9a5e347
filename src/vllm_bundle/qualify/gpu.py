"""Tier 1 and 2 qualification, for a self-hosted runner with the target GPU.

Tier 1 runs a probe with the bundled python: vLLM's native extensions load, torch sees a GPU, and the
GPU's ``gcnArchName`` is one of the target's ISAs. Tier 2 starts ``bin/vllm-server`` exactly as
installers do (``--model``, ``--host``, ``--port``, ``--served-model-name``, ``--max-model-len``,
``PYTHONNOUSERSITE=1``), waits for ``GET /health`` to answer 200, checks completion, chat, streaming
and greedy determinism through the OpenAI-compatible API, then stops it the installers' way (SIGTERM,
SIGKILL after 5 s) and checks nothing still answers (the launcher must ``exec`` python).

The results merge into ``release.json`` (pass/fail per check and the GPU's ISA only, so the merged
manifest does not depend on timing) and ``SHA256SUMS`` is rewritten to match.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests

from vllm_bundle.errors import ManifestError
from vllm_bundle.manifests import RELEASE_JSON, dump_json, read_json, write_sha256sums
from vllm_bundle.qualify.tier0 import CheckResult, Report
from vllm_bundle.recipes import Target
from vllm_bundle.runtime import amdgpu, visibility
from vllm_bundle.tree.layout import Layout, library_dirs
from vllm_bundle.util.fsutil import atomic_write
from vllm_bundle.util.transport import free_port

#: How often the wait for /health says it is still waiting.
WAIT_NOTICE_SECONDS = 30.0
#: Installers send SIGTERM, then SIGKILL after this many seconds (DESIGN.md).
STOP_GRACE_SECONDS = 5.0
#: After a SIGKILL of the server, how long what it started may take to go (issue #22).
ORPHAN_GRACE_SECONDS = 2.0
#: How far sysfs's figure for device 0's memory may be from torch's (pages the driver keeps aside).
MEMORY_TOLERANCE = 0.02
GIB = float(1 << 30)
SERVED_NAME = "qualify"
PROMPT = "The capital of France is"
LOG_TAIL = 20

#: Run by the bundled python. Prints one JSON line: torch's HIP version, each GPU's gcnArchName, and for
#: each native extension of vLLM (``vllm/*.so``) None or the error importing it raised.
PROBE = """
import importlib, json, pathlib
out = {"hip": None, "devices": [], "extensions": {}}
try:
    import torch
    out["hip"] = torch.version.hip
    if torch.cuda.is_available():
        out["devices"] = [torch.cuda.get_device_properties(i).gcnArchName for i in range(torch.cuda.device_count())]
        out["memory"] = list(torch.cuda.mem_get_info(0))
except Exception as err:
    out["torch_error"] = f"{type(err).__name__}: {err}"
import vllm
for so in sorted(pathlib.Path(vllm.__file__).parent.glob("*.so")):
    name = "vllm." + so.name.split(".")[0]
    try:
        importlib.import_module(name)
        out["extensions"][name] = None
    except Exception as err:
        out["extensions"][name] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""


@dataclass(frozen=True)
class ServeOptions:
    model: str
    max_model_len: int = 2048
    boot_timeout: float = 900.0  # a first boot compiles Triton kernels
    request_timeout: float = 300.0
    poll_interval: float = 1.0
    port: int | None = None  # a free loopback port when None


def _base_isa(arch: str) -> str:
    """``gfx90a:sramecc+:xnack-`` -> ``gfx90a``."""
    return arch.split(":", 1)[0]


def _launcher_env(layout: Layout) -> dict[str, str]:
    libraries = ":".join(str(layout.site / d) for d in library_dirs(layout))
    return {**os.environ, "PYTHONNOUSERSITE": "1", "LD_LIBRARY_PATH": libraries}


def run_probe(layout: Layout, timeout: float = 600.0) -> dict[str, Any]:
    """The probe's findings; a probe that does not run is reported as a torch error."""
    try:
        result = subprocess.run(
            [str(layout.python), "-P", "-c", PROBE],
            env=_launcher_env(layout),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"hip": None, "devices": [], "extensions": {}, "probe_error": str(err)}
    lines = result.stdout.strip().splitlines()
    try:
        found: dict[str, Any] = json.loads(lines[-1])
        return found
    except (IndexError, json.JSONDecodeError):
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"hip": None, "devices": [], "extensions": {}, "probe_error": f"exit {result.returncode}: {tail}"}


def check_memory_figure(probe: dict[str, Any], root: Path) -> CheckResult:
    """The launcher's memory default is computed from sysfs (runtime.gpu_memory); it is only right if
    sysfs's pool for device 0 is the memory HIP reports (``torch.cuda.mem_get_info``), which on an APU
    depends on the kernel's GTT choice. Both figures are in the report."""
    name, what = "gpu-memory", "sysfs and torch agree on device 0's memory"
    memory = probe.get("memory")
    if not memory:
        return CheckResult(name, False, what, ["torch reported no memory figure for device 0"])
    torch_free, torch_total = int(memory[0]), int(memory[1])
    gpus = amdgpu.gpu_nodes(root)
    index = visibility.select([gpu.unique_id for gpu in gpus], os.environ).device0
    if index is None:
        return CheckResult(name, False, what, ["no KFD node is device 0 (see `vllm-bundle doctor`)"])
    try:
        pool = amdgpu.memory_pool(root, gpus[index])
    except amdgpu.Unreadable as err:
        return CheckResult(name, False, what, [f"sysfs: {err}"])
    summary = (
        f"device 0: sysfs {pool.kind} {pool.total / GIB:.2f} GiB, torch {torch_total / GIB:.2f} GiB "
        f"({torch_free / GIB:.2f} GiB free)"
    )
    if abs(pool.total - torch_total) > MEMORY_TOLERANCE * torch_total:
        return CheckResult(name, False, what, [f"{summary}: they differ by more than {MEMORY_TOLERANCE:.0%}"])
    return CheckResult(name, True, summary)


def tier1_checks(probe: dict[str, Any], target: Target, host: Path) -> list[CheckResult]:
    """Native extensions load; a GPU is visible to torch; its ISA is one the bundle was built for;
    ``host``'s sysfs (``/`` on the runner) gives device 0 the memory torch sees."""
    extensions: dict[str, str | None] = probe.get("extensions", {})
    failed = [f"{name}: {error}" for name, error in sorted(extensions.items()) if error]
    if probe.get("probe_error"):
        failed.insert(0, f"the probe did not run: {probe['probe_error']}")
    elif not extensions:
        failed.append("vLLM has no native extensions (a Python-only build cannot serve on a GPU)")
    devices: list[str] = probe.get("devices", [])
    visible = [] if devices else [probe.get("torch_error") or "torch sees no GPU (is /dev/kfd accessible?)"]
    if probe.get("hip") is None and not visible:
        visible.append("torch is not a ROCm build (torch.version.hip is None)")
    isas = sorted({_base_isa(arch) for arch in devices})
    wrong = [
        f"GPU {index} is {arch}; the bundle is built for {', '.join(target.isas)}"
        for index, arch in enumerate(devices)
        if _base_isa(arch) not in target.isas
    ]
    return [
        CheckResult("native-extensions", not failed, f"{len(extensions)} vLLM extensions load", failed),
        CheckResult("gpu-visible", not visible, f"{len(devices)} GPU(s), HIP {probe.get('hip')}", visible),
        CheckResult("gcn-arch", bool(devices) and not wrong, f"gcnArchName {', '.join(isas) or 'none'}", wrong),
        check_memory_figure(probe, host),
    ]


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines() if self.log.exists() else []
        return " | ".join(lines[-LOG_TAIL:]) or "no output"

    def stop(self) -> bool:
        """SIGTERM, then SIGKILL after the grace period; True when it stopped by itself in time."""
        if self.process.poll() is not None:
            return True
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_GRACE_SECONDS)
            return True
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return False


@contextmanager
def started_server(layout: Layout, options: ServeOptions, log: Path) -> Iterator[Server]:
    """``bin/vllm-server`` running as installers start it; killed on the way out whatever happens."""
    port = options.port or free_port()
    command = [
        str(layout.root / "bin" / "vllm-server"),
        "--model",
        options.model,
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(options.max_model_len),
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONNOUSERSITE": "1"}
        )
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        yield server
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def wait_healthy(server: Server, options: ServeOptions) -> CheckResult:
    """Poll ``GET /health`` until it answers 200, the server exits, or the boot timeout passes; a model's
    first load takes minutes, so a line on stderr every :data:`WAIT_NOTICE_SECONDS` says it is still
    waiting (and for what)."""
    deadline = time.monotonic() + options.boot_timeout
    began, last = time.monotonic(), "no answer yet"
    notice = began + WAIT_NOTICE_SECONDS
    while time.monotonic() < deadline:
        if time.monotonic() >= notice:
            waited = time.monotonic() - began
            print(
                f"health waiting for GET /health: {waited:.0f} of {options.boot_timeout:.0f} s (last: {last})",
                file=sys.stderr,
                flush=True,
            )
            notice = time.monotonic() + WAIT_NOTICE_SECONDS
        if server.process.poll() is not None:
            problem = f"vllm-server exited with {server.process.returncode} before it was healthy: {server.tail()}"
            return CheckResult("health", False, "GET /health answers 200", [problem])
        try:
            answer = requests.get(f"{server.url}/health", timeout=5)
            if answer.status_code == 200:
                return CheckResult("health", True, f"GET /health answered 200 after {time.monotonic() - began:.0f} s")
            last = f"HTTP {answer.status_code}"
        except requests.ConnectionError:
            last = "not listening yet"  # a booting server's port is not open before its Python has started
        except requests.RequestException as err:
            last = type(err).__name__
        time.sleep(options.poll_interval)
    problem = f"GET /health did not answer 200 within {options.boot_timeout:.0f} s (last: {last}): {server.tail()}"
    return CheckResult("health", False, "GET /health answers 200", [problem])


class CheckFailed(Exception):
    """One API check's failure, as the line the report shows."""


def _post(server: Server, path: str, body: dict[str, Any], options: ServeOptions) -> dict[str, Any]:
    try:
        answer = requests.post(f"{server.url}{path}", json=body, timeout=options.request_timeout)
    except requests.RequestException as err:
        raise CheckFailed(f"POST {path}: {type(err).__name__}") from None
    if answer.status_code != 200:
        raise CheckFailed(f"POST {path}: HTTP {answer.status_code}: {answer.text[:200]}")
    try:
        doc: dict[str, Any] = answer.json()
        return doc
    except ValueError:
        raise CheckFailed(f"POST {path}: the answer is not JSON") from None


def _completion_body(**extra: Any) -> dict[str, Any]:
    return {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "seed": 0, **extra}


def _completion_text(doc: dict[str, Any], path: str) -> str:
    try:
        text = doc["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        raise CheckFailed(f"POST {path}: no choices[0].text in the answer") from None
    if not isinstance(text, str) or not text.strip():
        raise CheckFailed(f"POST {path}: the completion is empty")
    return text


def check_completion(server: Server, options: ServeOptions) -> str:
    text = _completion_text(_post(server, "/v1/completions", _completion_body(), options), "/v1/completions")
    return f"completion: {text.strip()[:40]!r}"


def check_chat(server: Server, options: ServeOptions) -> str:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
        "temperature": 0,
    }
    doc = _post(server, "/v1/chat/completions", body, options)
    try:
        content = doc["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise CheckFailed("POST /v1/chat/completions: no choices[0].message.content in the answer") from None
    if not isinstance(content, str) or not content.strip():
        raise CheckFailed("POST /v1/chat/completions: the reply is empty")
    return f"chat reply: {content.strip()[:40]!r}"


def check_streaming(server: Server, options: ServeOptions) -> str:
    """Server-sent events: ``data: {json}`` chunks carrying text, ended by ``data: [DONE]``."""
    try:
        answer = requests.post(
            f"{server.url}/v1/completions",
            json=_completion_body(stream=True),
            timeout=options.request_timeout,
            stream=True,
        )
    except requests.RequestException as err:
        raise CheckFailed(f"streaming POST /v1/completions: {type(err).__name__}") from None
    if answer.status_code != 200:
        raise CheckFailed(f"streaming POST /v1/completions: HTTP {answer.status_code}")
    chunks, text, done = 0, "", False
    try:
        for line in answer.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data:"):
                continue
            payload = line.removeprefix("data:").strip()
            if payload == "[DONE]":
                done = True
                break
            chunks += 1
            text += json.loads(payload)["choices"][0].get("text") or ""
    except (requests.RequestException, ValueError, KeyError, IndexError, TypeError) as err:
        raise CheckFailed(f"streaming: a malformed or cut event stream ({type(err).__name__})") from None
    if not done:
        raise CheckFailed(f"streaming: the event stream ended without data: [DONE] after {chunks} chunks")
    if chunks < 2 or not text.strip():
        raise CheckFailed(f"streaming: {chunks} chunk(s) and {len(text)} characters; expected text in several")
    return f"{chunks} chunks, ended by [DONE]"


def check_greedy_determinism(server: Server, options: ServeOptions) -> str:
    texts = [
        _completion_text(_post(server, "/v1/completions", _completion_body(max_tokens=32), options), "/v1/completions")
        for _ in range(2)
    ]
    if texts[0] != texts[1]:
        raise CheckFailed(f"two greedy completions differ: {texts[0][:40]!r} != {texts[1][:40]!r}")
    return "two temperature-0 completions are identical"


#: Tier 2's measured comparison: the same completions one at a time, then all at once. A server that
#: batches them (what vLLM is for) finishes the concurrent round several times faster; one that runs them
#: one after another does not. On Strix Halo vLLM's throughput grows with the prompts in flight
#: (vllm-project/vllm#34579: 7.5 tok/s for one, "increases with increase in number of prompts"), and
#: Lemonade's users report about 3x at 10 sequences (issue #53; no source of theirs was readable here). The
#: floor is below that, so a slower host passes and a server that serialises does not. This is also what
#: decides vLLM's image's rebuilt ROCr/CLR ("multi-stream perf improvements", docs/building-rocm.md): the
#: bundle ships TheRock's stock runtime, and tier 2 records what it gives.
CONCURRENT_SEQUENCES = 10
CONCURRENT_TOKENS = 64
MIN_CONCURRENT_SPEEDUP = 2.0


def _timed_completions(server: Server, options: ServeOptions, workers: int) -> float:
    body = _completion_body(max_tokens=CONCURRENT_TOKENS, ignore_eos=True)
    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        answers = list(pool.map(lambda _: _post(server, "/v1/completions", body, options), range(CONCURRENT_SEQUENCES)))
    elapsed = time.perf_counter() - began
    for answer in answers:
        _completion_text(answer, "/v1/completions")
    return elapsed


def check_concurrency(server: Server, options: ServeOptions) -> CheckResult:
    """``CONCURRENT_SEQUENCES`` completions of ``CONCURRENT_TOKENS`` tokens (EOS ignored, so every one is as
    long), sequential then concurrent; the speedup is their ratio, recorded in release.json."""
    name = "concurrency"
    try:
        sequential = _timed_completions(server, options, workers=1)
        concurrent = _timed_completions(server, options, workers=CONCURRENT_SEQUENCES)
    except CheckFailed as failure:
        return CheckResult(name, False, name, [str(failure)])
    speedup = sequential / concurrent if concurrent > 0 else 0.0
    figures = {
        "sequences": CONCURRENT_SEQUENCES,
        "tokens": CONCURRENT_TOKENS,
        "sequential_s": round(sequential, 3),
        "concurrent_s": round(concurrent, 3),
        "speedup": round(speedup, 2),
    }
    said = (
        f"{CONCURRENT_SEQUENCES} sequences of {CONCURRENT_TOKENS} tokens: concurrent {speedup:.2f}x as fast as "
        f"sequential ({sequential:.1f} s / {concurrent:.1f} s)"
    )
    problems = [] if speedup >= MIN_CONCURRENT_SPEEDUP else [f"{said}; the floor is {MIN_CONCURRENT_SPEEDUP:g}x"]
    return CheckResult(name, not problems, said, problems, figures)


APICheck = Callable[[Server, ServeOptions], str]
API_CHECKS: list[tuple[str, APICheck]] = [
    ("completion", check_completion),
    ("chat", check_chat),
    ("streaming", check_streaming),
    ("greedy-determinism", check_greedy_determinism),
]


def _api_check(name: str, check: APICheck, server: Server, options: ServeOptions) -> CheckResult:
    try:
        return CheckResult(name, True, check(server, options))
    except CheckFailed as failure:
        return CheckResult(name, False, name, [str(failure)])


def _not_python(pid: int) -> str | None:
    """Why ``pid`` (the launcher's process) is not the interpreter, if it is not: a launcher that does
    not ``exec`` keeps a shell between the installer's signals and vLLM."""
    try:
        executable = psutil.Process(pid).exe()
    except psutil.Error as err:
        return f"cannot tell what pid {pid} runs: {type(err).__name__}"
    return None if Path(executable).name.startswith("python") else f"pid {pid} runs {executable}"


def check_stop(server: Server) -> CheckResult:
    """The launcher's process is vLLM's (it ``exec``s python), SIGTERM stops it within the grace period
    and nothing is left serving the port."""
    problems = []
    if (why := _not_python(server.process.pid)) is not None:
        problems.append(f"the launcher did not exec python ({why}): SIGTERM would not reach vLLM")
    if not server.stop():
        problems.append(f"vllm-server ignored SIGTERM for {STOP_GRACE_SECONDS:.0f} s and was killed")
    try:
        requests.get(f"{server.url}/health", timeout=2)
        problems.append("something still answers on the port after the launcher exited (does it exec python?)")
    except requests.RequestException:
        pass
    return CheckResult("stop", not problems, f"SIGTERM stops it within {STOP_GRACE_SECONDS:.0f} s", problems)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _survivors(processes: list[psutil.Process], within: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within
    while True:
        alive = [process for process in processes if _alive(process)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def check_no_orphans(layout: Layout, options: ServeOptions, log: Path) -> CheckResult:
    """SIGKILL of a healthy server (an installer's last resort; a load that timed out) leaves none of
    the processes it started: one that lived on would hold GPU memory until found by hand."""
    name, what = "no-orphans", f"nothing it started outlives a SIGKILL by {ORPHAN_GRACE_SECONDS:.0f} s"
    with started_server(layout, options, log) as server:
        health = wait_healthy(server, options)
        if not health.passed:
            return CheckResult(name, False, what, [f"not run: {health.problems[0]}"])
        try:
            started = psutil.Process(server.process.pid).children(recursive=True)
        except psutil.Error as err:  # not seen, not proven: fail
            return CheckResult(name, False, what, [f"cannot list the server's processes: {type(err).__name__}"])
        server.process.kill()
        server.process.wait()
        left = _survivors(started, ORPHAN_GRACE_SECONDS)
    for process in left:
        with suppress(psutil.Error):
            process.kill()  # the runner's GPU is wanted by the next check
    problems = [f"pid {p.pid} ({_process_name(p)}) was alive {ORPHAN_GRACE_SECONDS:.0f} s after" for p in left]
    problems = [f"{problem} SIGKILL of vllm-server" for problem in problems]
    return CheckResult(name, not problems, f"{what} ({len(started)} process(es) started)", problems)


def _process_name(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:80] or process.name()
    except psutil.Error:
        return "?"


def tier2_checks(layout: Layout, options: ServeOptions, log: Path) -> list[CheckResult]:
    """Boot, health, the API checks (skipped as failed when not healthy), a clean stop; then a second
    boot, killed, that must leave nothing behind."""
    with started_server(layout, options, log) as server:
        health = wait_healthy(server, options)
        results = [health]
        for name, check in API_CHECKS:
            if health.passed:
                results.append(_api_check(name, check, server, options))
            else:
                results.append(CheckResult(name, False, name, ["not run: the server never became healthy"]))
        if health.passed:
            results.append(check_concurrency(server, options))
        else:
            results.append(
                CheckResult("concurrency", False, "concurrency", ["not run: the server never became healthy"])
            )
        results.append(check_stop(server))
    results.append(check_no_orphans(layout, options, log.with_name(f"{log.stem}-killed{log.suffix}")))
    return results


def qualify_gpu(root: Path, minor: str, target: Target, tiers: int, options: ServeOptions, log: Path) -> Report:
    """Tier 1, then (``tiers`` == 2) tier 2 when tier 1 passed."""
    layout = Layout(root, minor)
    checks = tier1_checks(run_probe(layout), target, amdgpu.host_root())
    if tiers >= 2:
        if all(c.passed for c in checks):
            checks += tier2_checks(layout, options, log)
        else:
            checks.append(CheckResult("serve", False, "tier 2", ["not run: tier 1 failed"]))
    return Report(target.name, checks, tier="1+2" if tiers >= 2 else "1")


def merge_into_release(release_dir: Path, report: Report, model: str) -> None:
    """Record the GPU tiers' outcome in ``release.json`` and rewrite ``SHA256SUMS`` to match."""
    path = release_dir / RELEASE_JSON
    release = read_json(path)
    if release.get("target") != report.target:
        raise ManifestError(
            f"{path} is for {release.get('target')}, the report for {report.target}",
            "qualify the bundle of that release",
        )
    gcn = next((c.summary.removeprefix("gcnArchName ") for c in report.checks if c.name == "gcn-arch"), "")
    release.setdefault("qualification", {})[f"tier{report.tier}"] = {
        "passed": report.passed,
        "checks": {check.name: check.passed for check in report.checks},
        "figures": {check.name: check.figures for check in report.checks if check.figures},
        "gcn_arch": gcn,
        "model": model,
    }
    atomic_write(path, dump_json(release))
    write_sha256sums(release_dir)
