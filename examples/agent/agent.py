"""A small LangGraph agent with two LLM roles and a tool, for recording a workflow trace.

Each request runs one graph::

    planner (LLM) -> lookup (tool) -> writer (LLM, two concurrent drafts) -+-> END
                                        ^                                  |
                                        +---- 1 to 3 writer steps ---------+

* ``planner`` asks the planner model for a plan; a topic word is taken from its answer;
* ``lookup`` is a deterministic Python tool (a small fact table) called by the graph with that
  topic (not chosen by the LLM: a random-weight test model writes random text);
* ``writer`` asks the writer model for two drafts at once (a fan-out: two concurrent calls)
  and loops back to itself a data-dependent number of times (1 to 3 steps, from the seed, the
  request number and the length of its first drafts).

Every LLM call of request ``rK`` carries the header ``X-Scepsy-Request: rK`` (how ``scepsy
record`` groups the calls it forwards into requests) and runs inside an OpenInference session
``rK`` (the span attribute ``session.id``); with ``--otlp-endpoint`` the program also exports
OpenTelemetry spans (OpenInference's LangChain instrumentation: one root span per graph run, LLM
spans with the model name and token counts, a TOOL span per lookup) over OTLP/HTTP (protobuf),
flushed before it exits.

    python examples/agent/agent.py --base-url http://127.0.0.1:8100/v1 --requests 20 --seed 0 \\
        --otlp-endpoint http://127.0.0.1:4318/v1/traces

It prints one JSON line at the end: requests run, LLM calls per model, tool calls, failures.
The exit code is 1 when a request failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

REQUEST_HEADER = "X-Scepsy-Request"
MAX_WRITER_STEPS = 3
FANOUT = 2

TOPICS = ("weather", "trains", "bread", "rivers", "chess", "tea", "bridges", "owls")
FACTS = {
    "weather": "Fog forms when air cools to its dew point.",
    "trains": "The first public steam railway opened in 1825.",
    "bread": "Sourdough rises with wild yeast and lactic bacteria.",
    "rivers": "The Amazon carries about a fifth of river water to the sea.",
    "chess": "A chess board has sixty-four squares.",
    "tea": "Green and black tea come from the same plant.",
    "bridges": "Suspension bridges hang their deck from cables.",
    "owls": "Owls cannot move their eyes within their sockets.",
}


class AgentState(TypedDict, total=False):
    request: str
    index: int
    question: str
    plan: str
    topic: str
    fact: str
    drafts: list[str]
    steps: int
    target_steps: int


@dataclass(frozen=True)
class Options:
    base_url: str
    requests: int
    seed: int
    planner_model: str
    writer_model: str
    otlp_endpoint: str | None
    max_tokens: int
    timeout_s: float
    service_name: str
    stream: bool = False


def _lookup_impl(topic: str) -> str:
    """The fact about ``topic``; an unknown word maps onto the table by a stable hash."""
    if topic in FACTS:
        return FACTS[topic]
    return FACTS[TOPICS[zlib.crc32(topic.encode()) % len(TOPICS)]]


def make_lookup_tool() -> Any:
    """``lookup`` as a LangChain tool (so that instrumentation sees a TOOL call)."""
    from langchain_core.tools import tool

    @tool
    def lookup(topic: str) -> str:
        """Look up one fact about a topic."""
        return _lookup_impl(topic)

    return lookup


def topic_of(plan: str, fallback: str) -> str:
    """The tool's argument: the longest alphabetic word of the plan (ties: the first), lower
    case; ``fallback`` when the plan has none."""
    words = ["".join(ch for ch in w if ch.isalpha()).lower() for w in plan.split()]
    words = [w for w in words if w]
    return max(words, key=len) if words else fallback


def writer_steps(seed: int, index: int, first_drafts: Sequence[str]) -> int:
    """How many writer steps a request takes (1 to :data:`MAX_WRITER_STEPS`): from the seed, the
    request number and the length of the first step's drafts."""
    length = sum(len(d) for d in first_drafts)
    return 1 + (seed + index + length) % MAX_WRITER_STEPS


def _text(message: Any) -> str:
    content = getattr(message, "content", message)
    if isinstance(content, list):  # content blocks
        return " ".join(str(b.get("text", "")) if isinstance(b, dict) else str(b)
                        for b in content)
    return str(content)


def build_graph(opts: Options, lookup: Any) -> Any:
    """The compiled graph; the models come with each invocation's config (their headers name
    the request)."""
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.runnables import RunnableConfig
    from langgraph.graph import END, START, StateGraph

    def llms(config: RunnableConfig) -> dict[str, Any]:
        return config["configurable"]["llms"]

    async def planner(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        msgs = [SystemMessage("You plan short answers. Name the topic first."),
                HumanMessage(f"Request {state['index']}: {state['question']}")]
        plan = _text(await llms(config)["planner"].ainvoke(msgs))
        return {"plan": plan, "topic": topic_of(plan, state["question"].split()[-1])}

    async def tool_node(state: AgentState) -> dict[str, Any]:
        return {"fact": str(await lookup.ainvoke({"topic": state["topic"]}))}

    async def writer(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        step = state.get("steps", 0)
        previous = " ".join(state.get("drafts", []))
        batches = [[SystemMessage("You write one short paragraph."),
                    HumanMessage(f"Question: {state['question']} Fact: {state['fact']} "
                                 f"Plan: {state['plan']} Draft {k} of step {step}: {previous}")]
                   for k in range(FANOUT)]
        drafts = [_text(m) for m in await llms(config)["writer"].abatch(batches)]
        out: dict[str, Any] = {"drafts": drafts, "steps": step + 1}
        if step == 0:
            out["target_steps"] = writer_steps(opts.seed, state["index"], drafts)
        return out

    def again(state: AgentState) -> str:
        return "writer" if state["steps"] < state["target_steps"] else END

    g = StateGraph(AgentState)
    g.add_node("planner", planner)
    g.add_node("lookup", tool_node)
    g.add_node("writer", writer)
    g.add_edge(START, "planner")
    g.add_edge("planner", "lookup")
    g.add_edge("lookup", "writer")
    g.add_conditional_edges("writer", again, ["writer", END])
    return g.compile()


def chat_models(opts: Options, request: str) -> dict[str, Any]:
    """The two chat models of one request: every call carries the request's header."""
    from langchain_openai import ChatOpenAI

    def model(name: str) -> Any:
        return ChatOpenAI(model=name, base_url=opts.base_url, api_key="not-needed",
                          max_tokens=opts.max_tokens, temperature=0.0, max_retries=0,
                          timeout=opts.timeout_s, default_headers={REQUEST_HEADER: request},
                          streaming=opts.stream, stream_usage=opts.stream)

    return {"planner": model(opts.planner_model), "writer": model(opts.writer_model)}


def setup_tracing(opts: Options) -> Callable[[], None]:
    """Instrument LangChain and export spans to ``opts.otlp_endpoint``; the returned function
    flushes and shuts down (a no-op without an endpoint)."""
    if not opts.otlp_endpoint:
        return lambda: None
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": opts.service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=opts.otlp_endpoint,
                                                                    timeout=10)))
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)

    def close() -> None:
        provider.force_flush(timeout_millis=30_000)
        instrumentor.uninstrument()
        provider.shutdown()

    return close


def questions(seed: int, n: int) -> list[str]:
    """The requests' questions: deterministic in the seed."""
    rng = random.Random(seed)
    return [f"Tell me something about {rng.choice(TOPICS)} for reader {rng.randrange(1000)}."
            for _ in range(n)]


async def run(opts: Options) -> dict[str, Any]:
    """Run ``opts.requests`` requests one after the other (asyncio: the writer's two calls go
    out together from one event loop); a summary."""
    close = setup_tracing(opts)
    if opts.otlp_endpoint:
        from openinference.instrumentation import using_session
    else:  # no telemetry: OpenInference is not needed
        def using_session(_request: str) -> contextlib.AbstractContextManager[None]:
            return contextlib.nullcontext()

    lookup = make_lookup_tool()
    graph = build_graph(opts, lookup)
    failures: list[str] = []
    steps = Counter[int]()
    t0 = time.monotonic()
    try:
        for index, question in enumerate(questions(opts.seed, opts.requests)):
            request = f"r{index}"
            config = {"configurable": {"llms": chat_models(opts, request)},
                      "run_name": "agent", "metadata": {"scepsy.request": request}}
            try:
                with using_session(request):
                    final = await graph.ainvoke({"request": request, "index": index,
                                          "question": question}, config=config)
                steps[int(final["steps"])] += 1
            except Exception as exc:
                failures.append(f"{request}: {type(exc).__name__}: {exc}"[:300])
    finally:
        close()
    ok = opts.requests - len(failures)
    writer_calls = sum(k * FANOUT * v for k, v in steps.items())
    return {"requests": opts.requests, "succeeded": ok, "failed": failures,
            "llm_calls": {opts.planner_model: ok, opts.writer_model: writer_calls},
            "tool_calls": ok, "writer_steps": {str(k): v for k, v in sorted(steps.items())},
            "wall_s": round(time.monotonic() - t0, 3)}


def parse_args(argv: Sequence[str] | None = None) -> Options:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True,
                    help="OpenAI-compatible base URL (the recording proxy), e.g. "
                         "http://127.0.0.1:8100/v1")
    ap.add_argument("--requests", type=int, default=10, help="workflow requests (default 10)")
    ap.add_argument("--seed", type=int, default=0, help="questions and loop counts (default 0)")
    ap.add_argument("--planner-model", default="tiny-planner",
                    help="model name of the planner role (default tiny-planner)")
    ap.add_argument("--writer-model", default="tiny-writer",
                    help="model name of the writer role (default tiny-writer)")
    ap.add_argument("--otlp-endpoint", default=None,
                    help="export spans by OTLP/HTTP to this URL (e.g. "
                         "http://127.0.0.1:4318/v1/traces); default: no telemetry")
    ap.add_argument("--max-tokens", type=int, default=12,
                    help="max_tokens of every call (default 12)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per call (default 60)")
    ap.add_argument("--stream", action="store_true",
                    help="stream every answer (with a final usage chunk)")
    ap.add_argument("--service-name", default="scepsy-agent-example",
                    help="OpenTelemetry service.name (default scepsy-agent-example)")
    a = ap.parse_args(argv)
    if a.requests < 1:
        ap.error("--requests: expected an integer >= 1")
    if a.max_tokens < 1:
        ap.error("--max-tokens: expected an integer >= 1")
    if not a.timeout > 0:
        ap.error("--timeout: expected a number > 0")
    return Options(base_url=a.base_url, requests=a.requests, seed=a.seed,
                   planner_model=a.planner_model, writer_model=a.writer_model,
                   otlp_endpoint=a.otlp_endpoint, max_tokens=a.max_tokens,
                   timeout_s=a.timeout, service_name=a.service_name, stream=a.stream)


def main(argv: Sequence[str] | None = None) -> int:
    summary = asyncio.run(run(parse_args(argv)))
    print(json.dumps(summary, sort_keys=True))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
