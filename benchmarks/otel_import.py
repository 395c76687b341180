"""How fast does ``scepsy trace import`` read OpenTelemetry spans? Target: 100,000 spans in at most
10 s.

A synthetic OTLP/JSON file, as the collector's file exporter writes it (JSON lines, one export
request of up to 512 spans each, spans in the order they ended), of ``--requests`` agent runs,
seeded. Each run has eleven spans: a root (an HTTP server span), an agent span (``invoke_agent``),
five LLM calls (``chat`` spans with the attributes the OpenAI instrumentation sets; one of them
seen twice, a LangChain-style OpenInference LLM span around the client's span) and three tool
calls (``execute_tool``). The script times reading the file (:func:`scepsy_opt.ingest.otel.read_otlp`),
turning the spans into calls (:func:`scepsy_opt.ingest.otel.otlp_calls`) and writing the trace, best of
``--repeat`` runs, prints a table and writes results/otel_import.json.

    python benchmarks/otel_import.py [--requests N] [--seed S] [--repeat K]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from _common import table, write_results
from scepsy_opt.ingest.otel import otlp_calls, read_otlp
from scepsy_opt.ingest.tracemap import TraceMap
from scepsy_opt.traces import write_trace

TARGET_S = 10.0
TARGET_SPANS = 100_000
BATCH = 512
MODELS = {"Qwen/Qwen2.5-7B-Instruct": "planner", "Qwen/Qwen2.5-0.5B-Instruct": "coder"}
TOOLS = ("search", "run_tests", "read_file")


def _attr(key: str, value: object) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, list):
        return {"key": key, "value": {"arrayValue": {"values": [{"stringValue": v}
                                                                 for v in value]}}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _span(rng: random.Random, trace: str, parent: str, name: str, start: int, end: int,
          attrs: dict, kind: int = 1) -> dict:
    return {"traceId": trace, "spanId": f"{rng.getrandbits(64):016x}", "parentSpanId": parent,
            "name": name, "kind": kind, "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(end), "attributes": [_attr(k, v) for k, v in attrs.items()],
            "status": {}, "flags": 256}


def _chat(model: str, rng: random.Random) -> dict:
    return {"gen_ai.operation.name": "chat", "gen_ai.system": "openai",
            "gen_ai.request.model": model, "gen_ai.response.model": model,
            "gen_ai.request.temperature": 0.0, "gen_ai.request.max_tokens": 512,
            "gen_ai.response.id": f"chatcmpl-{rng.getrandbits(48):012x}",
            "gen_ai.response.finish_reasons": ["stop"],
            "gen_ai.usage.input_tokens": rng.randint(200, 4000),
            "gen_ai.usage.output_tokens": rng.randint(10, 500),
            "server.address": "127.0.0.1", "server.port": 8000}


def agent_run(rng: random.Random, t0: int) -> list[dict]:
    """The eleven spans of one agent run starting at ``t0`` ns."""
    trace = f"{rng.getrandbits(128):032x}"
    ms = 1_000_000
    spans: list[dict] = []
    t = t0 + rng.randint(1, 5) * ms
    agent_start = t
    root = _span(rng, trace, "", "POST /agent", t0, 0, {"http.request.method": "POST",
                                                       "url.path": "/agent"}, kind=2)
    agent = _span(rng, trace, root["spanId"], "invoke_agent support", t, 0,
                  {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support",
                   "gen_ai.request.model": "Qwen/Qwen2.5-7B-Instruct"})
    for step in range(5):
        model = "Qwen/Qwen2.5-7B-Instruct" if step % 2 == 0 else "Qwen/Qwen2.5-0.5B-Instruct"
        dur = rng.randint(50, 900) * ms
        if step == 2:  # seen by LangChain and by the client library
            outer = _span(rng, trace, agent["spanId"], "ChatOpenAI", t, t + dur + ms,
                          {"openinference.span.kind": "LLM", "llm.model_name": model,
                           "llm.token_count.prompt_details.cache_read": 128})
            spans.append(outer)
            spans.append(_span(rng, trace, outer["spanId"], f"chat {model}", t + ms // 2,
                               t + dur, _chat(model, rng), kind=3))
            t += dur + ms
        else:
            spans.append(_span(rng, trace, agent["spanId"], f"chat {model}", t, t + dur,
                               _chat(model, rng), kind=3))
            t += dur
        if step < 3:
            tool = TOOLS[step]
            dur = rng.randint(5, 300) * ms
            spans.append(_span(rng, trace, agent["spanId"], f"execute_tool {tool}", t, t + dur,
                               {"gen_ai.operation.name": "execute_tool",
                                "gen_ai.tool.name": tool, "gen_ai.tool.call.id":
                                f"call_{rng.getrandbits(32):08x}"}))
            t += dur
    agent["endTimeUnixNano"] = str(t)
    root["endTimeUnixNano"] = str(t + ms)
    assert agent_start >= t0
    return [*spans, agent, root]


def synthetic_file(path: Path, requests: int, seed: int) -> int:
    """Write the OTLP/JSON lines file; returns the number of spans."""
    rng = random.Random(seed)
    spans: list[dict] = []
    t0 = 1_760_000_000 * 10**9
    for _ in range(requests):
        spans.extend(agent_run(rng, t0))
        t0 += rng.randint(1, 200) * 1_000_000
    spans.sort(key=lambda s: int(s["endTimeUnixNano"]))
    resource = {"attributes": [_attr("service.name", "support-agent"),
                               _attr("telemetry.sdk.language", "python"),
                               _attr("telemetry.sdk.name", "opentelemetry")]}
    with path.open("w") as fh:
        for i in range(0, len(spans), BATCH):
            req = {"resourceSpans": [{"resource": resource, "scopeSpans": [
                {"scope": {"name": "opentelemetry.instrumentation.openai_v2"},
                 "spans": spans[i:i + BATCH]}]}]}
            fh.write(json.dumps(req, separators=(",", ":")) + "\n")
    return len(spans)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=TARGET_SPANS // 10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "spans.otlp.jsonl"
        n = synthetic_file(src, args.requests, args.seed)
        size_mb = src.stat().st_size / 1e6
        best = {"read": float("inf"), "calls": float("inf"), "write": float("inf")}
        for _ in range(args.repeat):
            t = time.perf_counter()
            spans = read_otlp([src])
            t1 = time.perf_counter()
            imp = otlp_calls(spans, TraceMap(workflow="support", models=MODELS))
            t2 = time.perf_counter()
            write_trace(Path(tmp) / "trace.jsonl", imp.calls)
            t3 = time.perf_counter()
            for k, v in zip(best, (t1 - t, t2 - t1, t3 - t2), strict=True):
                best[k] = min(best[k], v)
        rep = imp.report
    total = sum(best.values())
    rows = [{"phase": k, "seconds": round(v, 3), "spans_per_s": round(n / v)}
            for k, v in best.items()]
    rows.append({"phase": "total", "seconds": round(total, 3), "spans_per_s": round(n / total)})
    print(f"{n} spans ({size_mb:.1f} MB), {rep.requests} requests, {rep.llm_calls} LLM calls, "
          f"{rep.tool_calls} tool calls, {len(rep.nested_llm)} nested LLM spans merged; best of "
          f"{args.repeat}")
    print(table(rows, ["phase", "seconds", "spans_per_s"]))
    scaled = total * TARGET_SPANS / n
    ok = scaled <= TARGET_S
    print(f"{TARGET_SPANS} spans: {scaled:.2f} s (target <= {TARGET_S:g} s): "
          f"{'ok' if ok else 'TOO SLOW'}")
    path = write_results("otel_import", {
        "spans": n, "file_mb": round(size_mb, 2), "requests": args.requests, "seed": args.seed,
        "repeat": args.repeat, "rows": rows, "seconds_per_100k_spans": round(scaled, 3),
        "target_s": TARGET_S, "ok": ok, "llm_calls": rep.llm_calls,
        "tool_calls": rep.tool_calls, "problems": rep.problems})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
