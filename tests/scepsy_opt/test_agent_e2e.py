"""The end-to-end example (examples/agent/): a LangGraph program with two LLM roles and a tool,
recorded twice at once, by ``scepsy record`` (the proxy in front of the server) and by
OpenTelemetry (OTLP/HTTP to ``scepsy trace receive``, then ``scepsy trace import``). Both traces
must validate and their per-LLM statistics agree.

The always-run test puts a loopback fake OpenAI-compatible chat server (below) upstream; the
``vllm`` test puts a real ``vllm serve`` there (a tiny random-weight Llama on the CPU, with a
word-level tokenizer and a chat template written here, two served model names for the two
roles).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "examples" / "agent" / "agent.py"
MAP = REPO / "examples" / "agent" / "map.yaml"
PLANNER_MODEL, WRITER_MODEL = "tiny-planner", "tiny-writer"
LLMS = ("planner", "writer")

# -- a fake OpenAI-compatible chat server ------------------------------------------------------------

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa")


def fake_completion(messages: Sequence[Mapping[str, Any]], max_tokens: int) -> tuple[str, int, int]:
    """The fake's answer to ``messages``: (text, prompt tokens, completion tokens). Tokens are
    whitespace-separated words (plus 3 per message for the template); the answer's length is
    1..max_tokens words, from a CRC of the prompt."""
    prompt = "\n".join(str(m.get("content", "")) for m in messages)
    h = zlib.crc32(prompt.encode())
    n_out = 1 + h % max(1, max_tokens)
    text = " ".join(WORDS[(h >> (i % 24)) % len(WORDS)] for i in range(n_out))
    return text, len(prompt.split()) + 3 * len(messages), n_out


class FakeChatServer:
    """``POST /v1/chat/completions`` (non-streaming, and streaming with a usage chunk when asked)
    on a loopback port, each call taking ``base_s + token_s`` per completion token; it keeps the
    headers of every call. ``with FakeChatServer() as srv: srv.base_url``."""

    def __init__(self, base_s: float = 0.05, token_s: float = 0.002) -> None:
        self.base_s, self.token_s = base_s, token_s
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path in ("/health", "/v1/models"):
                    self._send(200, b'{"object": "list", "data": []}')
                else:
                    self._send(404, b'{"error": "not found"}')

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/chat/completions":
                    self._send(404, b'{"error": "not found"}')
                    return
                req = json.loads(raw)
                max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
                text, n_in, n_out = fake_completion(req["messages"], max_tokens)
                with outer._lock:
                    outer.calls.append({"model": req["model"], "headers": dict(self.headers),
                                        "stream": req.get("stream") is True,
                                        "input_tokens": n_in, "output_tokens": n_out})
                time.sleep(outer.base_s + outer.token_s * n_out)
                usage = {"prompt_tokens": n_in, "completion_tokens": n_out,
                         "total_tokens": n_in + n_out}
                cid, now = f"chatcmpl-{len(outer.calls)}", int(time.time())
                if req.get("stream"):
                    self._stream(req, cid, now, text, usage)
                    return
                body = {"id": cid, "object": "chat.completion", "created": now,
                        "model": req["model"], "usage": usage,
                        "choices": [{"index": 0, "finish_reason": "length",
                                     "message": {"role": "assistant", "content": text}}]}
                self._send(200, json.dumps(body).encode())

            def _stream(self, req: dict[str, Any], cid: str, now: int, text: str,
                        usage: dict[str, int]) -> None:
                chunks = [{"id": cid, "object": "chat.completion.chunk", "created": now,
                           "model": req["model"],
                           "choices": [{"index": 0, "delta": {"role": "assistant",
                                                              "content": text},
                                        "finish_reason": "length"}]}]
                if (req.get("stream_options") or {}).get("include_usage"):
                    chunks.append({"id": cid, "object": "chat.completion.chunk", "created": now,
                                   "model": req["model"], "choices": [], "usage": usage})
                body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                self._send(200, body.encode(), "text/event-stream")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeChatServer:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


# -- a real vllm serve with a tokenizer and a chat template ---------------------------------------

def _example_recipe() -> str:
    """The tokenizer recipe examples/agent/tiny_chat_model.py ships (one recipe for both)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "agent" / "tiny_chat_model.py"
    spec = importlib.util.spec_from_file_location("tiny_chat_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.TOKENIZER_SCRIPT)


TOKENIZER_SCRIPT = _example_recipe()


@dataclass(frozen=True)
class ChatServer:
    base_url: str
    log: Path


def _pin(cores: set[int] | None) -> Any:
    """A ``preexec_fn`` that binds the child to ``cores`` (None: no binding)."""
    if not cores:
        return None
    return lambda: os.sched_setaffinity(0, cores)


@contextmanager
def vllm_chat_server(workdir: Path, served: Sequence[str],
                     server_cores: set[int] | None = None) -> Iterator[ChatServer]:
    """``vllm serve`` of the tiny random-weight Llama (llama-3-8b at 1/16) on a CPU core, with a
    word-level tokenizer and a chat template, answering to every name of ``served``."""
    from scepsy_profile.profiling.engine_env import engine_environment, vllm_python, write_model_dir
    from scepsy_profile.profiling.models import engine_model
    from scepsy_profile.profiling.processes import end_process_group
    from scepsy_profile.profiling.server import engine_tmp, free_port, port_in_use, wait_healthy

    python = str(vllm_python().path)
    model = engine_model("llama-3-8b", 1 / 16)
    model_dir = write_model_dir(model, workdir / "model")
    subprocess.run([python, "-c", TOKENIZER_SCRIPT, str(model_dir), str(model.vocab)],
                   check=True, capture_output=True, timeout=120)
    tmp, made = engine_tmp(workdir)
    env = {**os.environ, **engine_environment(1, 1.0, "cpu", 1, tmp,
                                              cores=sorted(server_cores) if server_cores
                                              else None)}
    port = free_port()
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", *served, "--load-format", "dummy", "--enforce-eager",
           "--dtype", model.dtype, "--max-model-len", "512", "--max-num-seqs", "8",
           "--chat-template", str(model_dir / "chat_template.jinja"),
           "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"]
    log = workdir / "vllm.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=workdir,
                                preexec_fn=_pin(server_cores))
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, proc, 300.0, log)
        yield ChatServer(base_url=base, log=log)
    finally:
        end_process_group(proc, 15.0, wait_first=False)
        deadline = time.monotonic() + 10
        while port_in_use(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        if made:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


# -- the pipeline ----------------------------------------------------------------------------------

URL = re.compile(r"http://127\.0\.0\.1:\d+")


class CliServer:
    """``scepsy ARGS`` as a child process (a long-running one: ``record``, ``trace receive``):
    its base URL read from what it prints at start; stopped with SIGINT (Ctrl-C)."""

    def __init__(self, args: Sequence[str], workdir: Path, name: str,
                 cores: set[int] | None = None) -> None:
        self.args, self.name, self.cores = list(args), name, cores
        self.out, self.err = workdir / f"{name}.out", workdir / f"{name}.err"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.rc: int | None = None

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") if p.exists() else ""
                       for p in (self.out, self.err))

    def __enter__(self) -> CliServer:
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "scepsy.cli", *self.args],
                                         stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=_pin(self.cores))
        deadline = time.monotonic() + 60
        while not (m := URL.search(self.logs())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"scepsy {self.name} did not start: {self.logs()}")
            time.sleep(0.1)
        self.url = m.group(0)
        return self

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.rc = self.proc.returncode
        return self.rc

    def __exit__(self, *_: Any) -> None:
        self.stop()


@dataclass(frozen=True)
class Recorded:
    """What one run of the pipeline left: the agent's summary, both traces, the import report,
    both traces' statistics (``scepsy stats --json``)."""

    summary: dict[str, Any]
    proxy_trace: Path
    otel_trace: Path
    otel_session_trace: Path
    report: dict[str, Any]
    proxy_stats: dict[str, Any]
    otel_stats: dict[str, Any]
    otel_session_stats: dict[str, Any]
    proxy_log: str
    receiver_log: str


def _cli_json(*argv: str) -> dict[str, Any]:
    from conftest import run_cli

    code, out, err = run_cli(*argv)
    assert code == 0, (argv, out, err)
    return json.loads(out)


def run_pipeline(upstream: str, workdir: Path, *, requests: int, seed: int, stream: bool = False,
                 cores: set[int] | None = None, agent_timeout_s: float = 600.0) -> Recorded:
    """``scepsy trace receive`` and ``scepsy record`` (in front of ``upstream``), the agent
    through both, both stopped, ``scepsy trace import`` (grouped by root span, and by the
    ``session.id`` attribute), ``scepsy stats --json`` of each trace. ``cores``: where the
    receiver, the proxy and the agent run (None: anywhere)."""
    spans = workdir / "spans.otlp.jsonl"
    proxy_trace = workdir / "proxy.jsonl"
    with CliServer(["trace", "receive", "--listen", "127.0.0.1:0", "--out", str(spans)],
                   workdir, "receive", cores) as receiver, \
            CliServer(["record", "--listen", "127.0.0.1:0", "--upstream", upstream,
                       "--out", str(proxy_trace), "--map", str(MAP)], workdir, "record",
                      cores) as proxy:
        run = subprocess.run([sys.executable, str(AGENT), "--base-url", proxy.url + "/v1",
                              "--requests", str(requests), "--seed", str(seed),
                              "--otlp-endpoint", receiver.url + "/v1/traces",
                              "--planner-model", PLANNER_MODEL, "--writer-model", WRITER_MODEL,
                              *(["--stream"] if stream else [])],
                             capture_output=True, text=True, timeout=agent_timeout_s,
                             preexec_fn=_pin(cores))
        assert run.returncode == 0, run.stdout + run.stderr
    assert proxy.rc == 0 and receiver.rc == 0, (proxy.logs(), receiver.logs())
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    otel_trace, session_trace = workdir / "otel.jsonl", workdir / "otel-session.jsonl"
    report_path = workdir / "import-report.json"
    _cli_json("trace", "import", str(spans), "--out", str(otel_trace), "--map", str(MAP),
              "--report", str(report_path), "--strict", "--json")
    _cli_json("trace", "import", str(spans), "--out", str(session_trace), "--map", str(MAP),
              "--request-attribute", "session.id", "--json")
    return Recorded(summary=summary, proxy_trace=proxy_trace, otel_trace=otel_trace,
                    otel_session_trace=session_trace,
                    report=json.loads(report_path.read_text()),
                    proxy_stats=_cli_json("stats", str(proxy_trace), "--json"),
                    otel_stats=_cli_json("stats", str(otel_trace), "--json"),
                    otel_session_stats=_cli_json("stats", str(session_trace), "--json"),
                    proxy_log=proxy.logs(), receiver_log=receiver.logs())


P_REL_TOL = 0.10
"""How far the two traces' ``p`` (mean concurrency of an LLM's calls within a request) may
differ, relative: the proxy times a call from the request arriving to the last byte from the
upstream, the OpenTelemetry span from the client's call to its parsed answer (client overhead on
both ends, another clock), so the two fan-out calls' overlap is measured slightly differently."""
TOKEN_ABS_TOL = 1e-6
"""Both traces read the token counts of the same ``usage`` object of the same responses, so
they agree call by call (checked as multisets below); the means may differ only by float
rounding in the summation."""


def per_llm(trace: Path) -> dict[str, list[tuple[int, int]]]:
    """Each LLM's calls as sorted (input, output) token pairs."""
    from scepsy_opt.traces import read_trace

    out: dict[str, list[tuple[int, int]]] = {}
    for c in read_trace(trace).calls:
        if c.llm is not None:
            out.setdefault(c.llm, []).append((c.input_tokens, c.output_tokens))
    return {k: sorted(v) for k, v in sorted(out.items())}


def per_request_counts(trace: Path) -> dict[str, dict[str, int]]:
    """Calls per LLM (and tool) of each request id."""
    from scepsy_opt.traces import read_trace

    out: dict[str, dict[str, int]] = {}
    for c in read_trace(trace).calls:
        name = c.llm or f"tool:{c.tool}"
        row = out.setdefault(c.request_id, {})
        row[name] = row.get(name, 0) + 1
    return out


def agreement(rec: Recorded) -> dict[str, dict[str, tuple[float, float]]]:
    """(proxy, otel) of n, p, input_mean, output_mean per LLM."""
    a, b = rec.proxy_stats["agent"]["llms"], rec.otel_stats["agent"]["llms"]
    return {llm: {k: (a[llm][k], b[llm][k]) for k in ("n", "p", "input_mean", "output_mean")}
            for llm in sorted(a)}


def check_agreement(rec: Recorded, requests: int) -> None:
    from scepsy_opt.traces import read_trace

    proxy, otel = read_trace(rec.proxy_trace), read_trace(rec.otel_trace)  # both validate
    read_trace(rec.otel_session_trace)
    assert rec.summary["succeeded"] == requests and not rec.summary["failed"], rec.summary
    # the proxy saw every LLM call, attributed to its request, none failed (its tool calls are
    # the client's own time between calls: the 'client' tool)
    assert all(c.error is None for c in proxy.calls)
    assert {c.llm or f"tool:{c.tool}" for c in proxy.calls} <= {*LLMS, "tool:client"}
    assert len(proxy.requests) == requests and len(otel.requests) == requests
    counts = rec.summary["llm_calls"]
    assert sum(c.llm == "planner" for c in proxy.calls) == counts[PLANNER_MODEL] == requests
    assert sum(c.llm == "writer" for c in proxy.calls) == counts[WRITER_MODEL]
    # OpenTelemetry saw the same LLM calls and one lookup tool call per request
    assert sum(c.tool == "lookup" for c in otel.calls) == requests
    assert {c.tool for c in otel.calls if c.tool} <= {"lookup", "client"}
    assert all(c.error is None for c in otel.calls)
    assert rec.report.get("unmapped") in ({}, None, []), rec.report
    # the same LLMs: the map is keyed by the model name as sent (vLLM answers every call with
    # its first served name, which OpenInference puts in llm.model_name)
    assert sorted({c.llm for c in otel.calls if c.llm}) == list(LLMS), per_request_counts(
        rec.otel_trace)
    # call by call, the same token counts
    assert per_llm(rec.proxy_trace) == per_llm(rec.otel_trace)
    # grouped by session.id, the requests are the proxy's, call for call
    proxy_rows, session_rows = (
        {r: {k: v for k, v in row.items() if not k.startswith("tool:")}
         for r, row in per_request_counts(t).items()}
        for t in (rec.proxy_trace, rec.otel_session_trace))
    assert session_rows == proxy_rows
    # the statistics
    pa, pb = rec.proxy_stats["agent"], rec.otel_stats["agent"]
    assert sorted(pa["llms"]) == sorted(pb["llms"]) == list(LLMS)
    for llm, row in agreement(rec).items():
        (n_a, n_b), (p_a, p_b) = row["n"], row["p"]
        assert n_a == pytest.approx(n_b, abs=1e-12), (llm, row)
        assert abs(p_a - p_b) <= P_REL_TOL * p_a, (llm, row)
        for key in ("input_mean", "output_mean"):
            assert abs(row[key][0] - row[key][1]) <= TOKEN_ABS_TOL, (llm, key, row)
    assert rec.otel_session_stats["agent"]["llms"]["writer"]["n"] == pytest.approx(
        pb["llms"]["writer"]["n"], abs=1e-12)
    # the planner runs alone; the writer's two drafts run at once
    assert pa["llms"]["planner"]["p"] == pytest.approx(1.0, abs=1e-9)
    assert pb["llms"]["planner"]["p"] == pytest.approx(1.0, abs=1e-9)
    assert pa["llms"]["writer"]["p"] > 1.2 and pb["llms"]["writer"]["p"] > 1.2


def _need(*modules: str) -> None:
    for m in modules:
        pytest.importorskip(m)


AGENT_MODULES = ("langgraph", "langchain_openai", "openinference.instrumentation.langchain",
                 "opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_agent_through_proxy_and_otel_with_a_fake_upstream(tmp_path: Path, stream: bool):
    _need(*AGENT_MODULES)
    requests = 12
    with FakeChatServer(base_s=0.1, token_s=0.004) as fake:
        rec = run_pipeline(fake.base_url, tmp_path, requests=requests, seed=3, stream=stream)
        seen = list(fake.calls)
    check_agreement(rec, requests)
    # every call the upstream answered carried its request's header, and was recorded
    assert len(seen) == sum(rec.summary["llm_calls"].values())
    assert all(c["stream"] is stream for c in seen)
    assert all(c["headers"].get("X-Scepsy-Request") is None for c in seen)  # the proxy strips it
    tokens = sorted((c["input_tokens"], c["output_tokens"]) for c in seen)
    assert tokens == sorted(t for calls in per_llm(rec.proxy_trace).values() for t in calls)
    # the loop depends on the data: requests take 1, 2 and 3 writer steps
    assert set(rec.summary["writer_steps"]) == {"1", "2", "3"}, rec.summary


@pytest.mark.vllm
def test_agent_through_proxy_and_otel_with_vllm(tmp_path: Path):
    from scepsy_profile.profiling.backend import BackendUnavailable
    from scepsy_profile.profiling.engine_env import vllm_python

    _need(*AGENT_MODULES)
    try:
        vllm_python()
    except BackendUnavailable as exc:
        pytest.skip(f"no vLLM environment: {exc}")
    requests = 16
    # vLLM on the first core, the client side on the others: on a 2-core machine a client that
    # shares its core with the busy engine sends the second call of a fan-out late and reads
    # answers late, and its spans then report more concurrency than the server saw
    cores = sorted(os.sched_getaffinity(0))
    server_cores, client_cores = ({cores[0]}, set(cores[1:])) if len(cores) > 1 else (None, None)
    t0 = time.monotonic()
    recorded: dict[str, Recorded] = {}
    with vllm_chat_server(tmp_path / "serve", [PLANNER_MODEL, WRITER_MODEL],
                          server_cores) as srv:
        for mode in ("json", "stream"):  # plain answers, then streamed ones (usage chunk)
            (tmp_path / mode).mkdir()
            recorded[mode] = run_pipeline(srv.base_url, tmp_path / mode, requests=requests,
                                          seed=0, stream=mode == "stream", cores=client_cores)
    wall = time.monotonic() - t0
    figures = {"wall_s": round(wall, 1), **{m: agreement(r) for m, r in recorded.items()}}
    print(json.dumps(figures))
    for rec in recorded.values():
        check_agreement(rec, requests)
