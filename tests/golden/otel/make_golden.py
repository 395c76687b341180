#!/usr/bin/env python
"""Generate the golden OTLP/JSON files of this folder from REAL OpenTelemetry instrumentation.

    python tests/golden/otel/make_golden.py [--out DIR] [--only NAME]...

For each scenario a loopback fake OpenAI-compatible server answers ``/v1/chat/completions``
and ``/v1/completions`` (plain JSON with ``usage``, or server-sent events ending with a usage
chunk when ``stream_options.include_usage`` is set) with token counts derived from the request:
prompt tokens = whitespace-separated words of the prompt or of every message's text, completion
tokens = words of the answer. A message holding ``FAIL:<model>`` makes the call to that model
fail with HTTP 500. An instrumentation package traces a small program against it, the
OpenTelemetry SDK exports the spans with the OTLP/HTTP exporter (protobuf, batched) to
:func:`scepsy_opt.ingest.otlp_http.otlp_receiver`, and the receiver's file becomes
``NAME.otlp.jsonl``; ``NAME.expected.json`` lists what the fake server answered, per call, and
the tool calls the program made. Each scenario runs in a child process of its own (the
instrumentors patch client libraries process-wide).

Scenarios (NAME):

- ``openai_v2``: opentelemetry-instrumentation-openai-v2 (``gen_ai.*`` attributes).
- ``openinference_openai``: openinference-instrumentation-openai (``llm.*`` attributes).
- ``openinference_langchain``: openinference-instrumentation-langchain on a LangGraph graph
  (planner LLM with a tool, a ``ToolNode``, writer LLM streaming).

Ids and timestamps differ from run to run; span names, kinds, attribute keys, parent structure
and token counts do not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCENARIOS = ("openai_v2", "openinference_openai", "openinference_langchain")
PLANNER = "Qwen/Qwen2.5-7B-Instruct"
WRITER = "Qwen/Qwen2.5-0.5B-Instruct"
MODELS = {PLANNER: "planner", WRITER: "writer"}
"""The model -> LLM table of every scenario (a trace map's ``models``)."""
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta")
CREATED = 1_700_000_000
SERVICE = "scepsy-golden"
_PACKAGES = {
    "openai_v2": ("openai", "opentelemetry.instrumentation.openai_v2"),
    "openinference_openai": ("openai", "openinference.instrumentation.openai"),
    "openinference_langchain": ("langgraph", "langchain_openai",
                                "openinference.instrumentation.langchain"),
}
"""The modules each scenario imports (besides the OpenTelemetry SDK and exporter)."""
DISTRIBUTIONS = {
    "openai_v2": ("opentelemetry-instrumentation-openai-v2", "opentelemetry-util-genai",
                  "openai"),
    "openinference_openai": ("openinference-instrumentation-openai",
                             "openinference-instrumentation", "openinference-semantic-conventions",
                             "openai"),
    "openinference_langchain": ("openinference-instrumentation-langchain",
                                "openinference-instrumentation",
                                "openinference-semantic-conventions", "langgraph",
                                "langchain-core", "langchain-openai", "openai"),
}
"""The packages whose versions decide what a scenario's spans look like (recorded in
NAME.expected.json; with other versions installed the spans may differ)."""


def versions(name: str) -> dict[str, str]:
    """The installed versions of what shapes a scenario's spans."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http",
                 *DISTRIBUTIONS[name]):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "missing"
    return out


def golden_file(name: str) -> str:
    return f"{name}.otlp.jsonl"


def expected_file(name: str) -> str:
    return f"{name}.expected.json"


# ------------------------------------------------------------------------ fake OpenAI server


def _text(content: Any) -> str:
    """The text of a message content: a string or a list of parts with ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _words(text: str) -> int:
    return len(text.split())


def answer_words(prompt_tokens: int) -> str:
    """The fake model's answer: 1..7 words, set by the prompt's length."""
    return " ".join(WORDS[: 1 + prompt_tokens % len(WORDS)])


class FakeOpenAI:
    """An OpenAI-compatible server on loopback (aiohttp, own thread); ``calls`` lists what it
    answered, in order; ``request`` (set by the program) is stored with each call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.request: int | None = None
        self.url = ""

    def _record(self, endpoint: str, model: str, stream: bool, prompt: int, completion: int,
                status: int, **extra: Any) -> None:
        self.calls.append({"request": self.request, "endpoint": endpoint, "model": model,
                           "stream": stream, "prompt_tokens": prompt,
                           "completion_tokens": completion, "status": status, **extra})

    async def chat(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        model = body["model"]
        messages = body.get("messages", [])
        texts = [_text(m.get("content")) for m in messages]
        prompt = sum(_words(t) for t in texts)
        stream = bool(body.get("stream"))
        if any(f"FAIL:{model}" in t for t in texts):
            self._record("/v1/chat/completions", model, stream, prompt, 0, 500)
            return web.json_response({"error": {"message": "injected failure",
                                                "type": "server_error"}}, status=500)
        tools = body.get("tools") or []
        if tools and not any(m.get("role") == "tool" for m in messages):
            name = tools[0]["function"]["name"]
            args = json.dumps({"query": " ".join(texts[-1].split()[:3])})
            completion = _words(args)
            self._record("/v1/chat/completions", model, stream, prompt, completion, 200,
                         tool_call=name)
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{len(self.calls)}", "type": "function",
                "function": {"name": name, "arguments": args}}]}
            return web.json_response(self._chat_body(model, message, "tool_calls", prompt,
                                                     completion))
        content = answer_words(prompt)
        completion = _words(content)
        self._record("/v1/chat/completions", model, stream, prompt, completion, 200)
        await asyncio.sleep(0.002 * completion)  # a call takes some time
        if stream:
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._sse(request, model, content, prompt, usage, chat=True)
        message = {"role": "assistant", "content": content}
        return web.json_response(self._chat_body(model, message, "stop", prompt, completion))

    async def completions(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        model = body["model"]
        prompt_value = body.get("prompt", "")
        text = prompt_value if isinstance(prompt_value, str) else " ".join(map(str, prompt_value))
        prompt = _words(text)
        stream = bool(body.get("stream"))
        content = answer_words(prompt)
        completion = _words(content)
        self._record("/v1/completions", model, stream, prompt, completion, 200)
        await asyncio.sleep(0.002 * completion)
        if stream:
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._sse(request, model, content, prompt, usage, chat=False)
        return web.json_response({
            "id": f"cmpl-{len(self.calls)}", "object": "text_completion", "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "text": content, "finish_reason": "stop", "logprobs": None}],
            "usage": _usage(prompt, completion)})

    def _chat_body(self, model: str, message: dict[str, Any], finish: str, prompt: int,
                   completion: int) -> dict[str, Any]:
        return {"id": f"chatcmpl-{len(self.calls)}", "object": "chat.completion",
                "created": CREATED, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish,
                             "logprobs": None}],
                "usage": _usage(prompt, completion)}

    async def _sse(self, request: Any, model: str, content: str, prompt: int, usage: bool,
                   chat: bool) -> Any:
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        cid = f"{'chatcmpl' if chat else 'cmpl'}-{len(self.calls)}"
        base = {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": CREATED, "model": model}

        def choice(text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
            if not chat:
                return {"index": 0, "text": text or "", "finish_reason": finish,
                        "logprobs": None}
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}

        chunks = [choice("", None, first=True)] if chat else []
        words = content.split()
        chunks += [choice(w if i == 0 else " " + w, None) for i, w in enumerate(words)]
        chunks.append(choice(None if chat else "", "stop"))
        for c in chunks:
            await resp.write(_event({**base, "choices": [c]}))
        if usage:
            await resp.write(_event({**base, "choices": [],
                                     "usage": _usage(prompt, len(words))}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    @contextmanager
    def running(self) -> Iterator[str]:
        """Serve on 127.0.0.1 (a free port) in a thread; yields the base URL (``.../v1``)."""
        from aiohttp import web

        ready = threading.Event()
        state: dict[str, Any] = {}

        async def main() -> None:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self.chat)
            app.router.add_post("/v1/completions", self.completions)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            state["stop"] = asyncio.Event()
            state["loop"] = asyncio.get_running_loop()
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
            ready.set()
            await state["stop"].wait()
            await runner.cleanup()

        thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        thread.start()
        if not ready.wait(30):
            raise RuntimeError("fake OpenAI server did not start")
        try:
            yield self.url
        finally:
            state["loop"].call_soon_threadsafe(state["stop"].set)
            thread.join(30)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


# ------------------------------------------------------------------------------ programs


def _question(i: int) -> str:
    """Request i's question: a different length per request, so token counts differ."""
    return " ".join(["what", "is", "the", "plan", "for", "step", str(i)] + ["please"] * i)


def run_openai(fake: FakeOpenAI, tracer: Any, url: str, legacy_traced: bool) -> list[dict]:
    """Three requests (a root span each): a chat call (planner), a streaming chat call with
    usage (writer); request 0 adds a legacy completions call, request 2's writer call fails."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="sk-golden", max_retries=0)
    notes: list[dict[str, Any]] = []
    for i in range(3):
        fake.request = i
        with tracer.start_as_current_span("agent.request", attributes={"request.index": i}):
            client.chat.completions.create(
                model=PLANNER, max_tokens=32,
                messages=[{"role": "system", "content": "You plan the work."},
                          {"role": "user", "content": _question(i)}])
            fail = f" FAIL:{WRITER}" if i == 2 else ""
            try:
                stream = client.chat.completions.create(
                    model=WRITER, max_tokens=32, stream=True,
                    stream_options={"include_usage": True},
                    messages=[{"role": "user", "content": "write it up: " + _question(i) + fail}])
                for _ in stream:
                    pass
            except openai.InternalServerError:
                notes.append({"request": i, "failed": WRITER})
            if i == 0:
                client.completions.create(model=WRITER, prompt="Summarise in one line: "
                                          + _question(i), max_tokens=16)
                fake.calls[-1]["traced"] = legacy_traced
    return notes


def run_langgraph(fake: FakeOpenAI, tracer: Any, url: str) -> list[dict]:
    """A LangGraph graph per request (its invoke is the root span): planner -> lookup tool
    (ToolNode) -> planner -> writer (streaming). Request 3's writer call fails (HTTP 500)."""
    import openai
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    tool_calls: list[dict[str, Any]] = []

    @tool
    def lookup(query: str) -> str:
        """Look up a fact about the query."""
        # after_call: how many server calls came before it (its place in the request's order)
        tool_calls.append({"request": fake.request, "tool": "lookup",
                           "after_call": len(fake.calls)})
        return f"fact: {query} is fine"

    planner = ChatOpenAI(model=PLANNER, base_url=url, api_key="sk-golden", max_retries=0,
                         temperature=0).bind_tools([lookup])
    writer = ChatOpenAI(model=WRITER, base_url=url, api_key="sk-golden", max_retries=0,
                        temperature=0, streaming=True, stream_usage=True)

    def plan(state: MessagesState) -> dict[str, Any]:
        return {"messages": [planner.invoke(state["messages"])]}

    def write(state: MessagesState) -> dict[str, Any]:
        return {"messages": [writer.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("plan", plan)
    g.add_node("tools", ToolNode([lookup]))
    g.add_node("write", write)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", tools_condition, {"tools": "tools", END: "write"})
    g.add_edge("tools", "plan")
    g.add_edge("write", END)
    graph = g.compile()
    notes: list[dict[str, Any]] = []
    for i in range(4):
        fake.request = i
        fail = f" FAIL:{WRITER}" if i == 3 else ""
        try:
            graph.invoke({"messages": [("user", _question(i) + fail)]})
        except openai.InternalServerError:
            notes.append({"request": i, "failed": WRITER})
    return notes + tool_calls


# ------------------------------------------------------------------------------ scenarios


def run_scenario(name: str, out_dir: Path) -> None:
    """Run one scenario in this process; write NAME.otlp.jsonl and NAME.expected.json."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from scepsy_opt.ingest.otlp_http import OtlpReceiver

    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{golden_file(name)}.tmp"
    tmp.unlink(missing_ok=True)
    fake = FakeOpenAI()
    with OtlpReceiver(tmp, exclusive=True) as receiver, fake.running() as url:
        provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
        provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=receiver.url + "/v1/traces", timeout=30)))
        tracer = provider.get_tracer("scepsy.golden")
        instrumentor = _instrumentor(name)
        instrumentor.instrument(tracer_provider=provider)
        try:
            if name == "openinference_langchain":
                notes = run_langgraph(fake, tracer, url)
            else:
                notes = run_openai(fake, tracer, url, legacy_traced=name != "openai_v2")
        finally:
            instrumentor.uninstrument()
            provider.shutdown()  # exports what is left
        counts = receiver.counts()
    os.replace(tmp, out_dir / golden_file(name))
    expected = {
        "scenario": name, "models": MODELS, "spans": counts.spans,
        "requests": 1 + max(c["request"] for c in fake.calls),
        "calls": [{"traced": True, **c} for c in fake.calls],
        "tool_calls": [n for n in notes if "tool" in n],
        "failed": [n for n in notes if "failed" in n],
        "versions": versions(name),
    }
    (out_dir / expected_file(name)).write_text(json.dumps(expected, indent=2) + "\n")


def _instrumentor(name: str) -> Any:
    if name == "openai_v2":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
        return OpenAIInstrumentor()
    if name == "openinference_openai":
        from openinference.instrumentation.openai import OpenAIInstrumentor as OIOpenAI
        return OIOpenAI()
    from openinference.instrumentation.langchain import LangChainInstrumentor
    return LangChainInstrumentor()


def missing_modules(name: str) -> list[str]:
    """The modules a scenario needs that do not import here."""
    import importlib

    missing = []
    for mod in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http",
                *_PACKAGES[name]):
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(mod)
    return missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="folder to write (default: %(default)s)")
    ap.add_argument("--only", action="append", choices=SCENARIOS,
                    help="run only this scenario (repeatable)")
    ap.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)  # child process
    args = ap.parse_args(argv)
    if args.scenario:
        run_scenario(args.scenario, args.out)
        return 0
    status = 0
    for name in args.only or SCENARIOS:
        missing = missing_modules(name)
        if missing:
            print(f"{name}: skipped, cannot import {', '.join(missing)}", file=sys.stderr)
            status = 1
            continue
        env = {**os.environ, "OTEL_SDK_DISABLED": "false"}
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--scenario",
                               name, "--out", str(args.out)], env=env, check=False)
        if proc.returncode:
            print(f"{name}: failed (exit {proc.returncode})", file=sys.stderr)
            status = 1
        else:
            print(f"{name}: wrote {args.out / golden_file(name)}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
