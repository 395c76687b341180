"""OpenTelemetry GenAI spans -> traces (scepsy_opt.ingest.otel, `scepsy trace import`).

Spans are built by hand with a small OTLP/JSON builder and written to files in both formats; the
expected calls, request ids and report entries are worked out in each test from the spans it
built (no golden files), plus a property over random span trees with a brute-force oracle.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy.cli import main
from scepsy_common.errors import InputError
from scepsy_opt.ingest.otel import (
    SPAN_ERROR,
    Malformed,
    Nested,
    Orphan,
    import_otlp,
    otlp_calls,
    read_otlp,
    sanitize_name,
)
from scepsy_opt.ingest.tracemap import TraceMap
from scepsy_opt.traces import read_trace, validate_calls, write_trace

BASE_NS = 1_760_000_000_123_456_789  # an epoch time with nanoseconds: times must stay exact
MS = 1_000_000
T1, T2, T3 = (f"{n:032x}" for n in (0xA1, 0xB2, 0xC3))
MODELS = {"Qwen/Qwen2.5-7B-Instruct": "planner", "Qwen/Qwen2.5-0.5B-Instruct": "coder"}
BIG, SMALL = "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"
TMAP = TraceMap(workflow="support", models=MODELS)


def sid(n: int) -> str:
    return f"{n:016x}"


def any_value(v: Any) -> dict:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list | tuple):
        return {"arrayValue": {"values": [any_value(x) for x in v]}}
    return {"stringValue": v}


def attrs(d: dict) -> list[dict]:
    return [{"key": k, "value": any_value(v)} for k, v in d.items()]


@dataclass
class Otlp:
    """OTLP/JSON spans built one by one (times in ms after BASE_NS), written as files."""

    resource: dict = field(default_factory=lambda: {"service.name": "agent"})
    spans: list[dict] = field(default_factory=list)

    def span(self, n: int, parent: int | None = None, start: float = 0, end: float = 1, *,
             trace: str = T1, name: str = "step", error: bool = False, **a: Any) -> dict:
        s = {"traceId": trace, "spanId": sid(n), "parentSpanId": sid(parent) if parent else "",
             "name": name, "kind": 1, "startTimeUnixNano": str(BASE_NS + int(start * MS)),
             "endTimeUnixNano": str(BASE_NS + int(end * MS)),
             "attributes": attrs({k.replace("__", "."): v for k, v in a.items()})}
        if error:
            s["status"] = {"code": 2, "message": "boom"}
        self.spans.append(s)
        return s

    def chat(self, n: int, parent: int | None, start: float, end: float, model: str | None = BIG,
             tokens: tuple[int, int] | None = (100, 10), **kw: Any) -> dict:
        a: dict[str, Any] = {"gen_ai__operation__name": "chat", "gen_ai__system": "openai"}
        if model is not None:
            a["gen_ai__request__model"] = model
        if tokens is not None:
            a["gen_ai__usage__input_tokens"], a["gen_ai__usage__output_tokens"] = tokens
        return self.span(n, parent, start, end, name=f"chat {model}", **a, **kw)

    def tool(self, n: int, parent: int | None, start: float, end: float, tool: str = "search",
             **kw: Any) -> dict:
        return self.span(n, parent, start, end, name=f"execute_tool {tool}",
                         gen_ai__operation__name="execute_tool", gen_ai__tool__name=tool, **kw)

    def request(self, spans: list[dict] | None = None) -> dict:
        return {"resourceSpans": [{"resource": {"attributes": attrs(self.resource)},
                                   "scopeSpans": [{"scope": {"name": "test"},
                                                   "spans": self.spans if spans is None
                                                   else spans}]}]}

    def jsonl(self, path: Path, per_line: int = 2) -> Path:
        lines = [json.dumps(self.request(self.spans[i:i + per_line]))
                 for i in range(0, len(self.spans), per_line)]
        path.write_text("\n".join(lines) + "\n")
        return path

    def document(self, path: Path) -> Path:
        path.write_text(json.dumps(self.request(), indent=2))
        return path


def run(tmp_path: Path, b: Otlp, tmap: TraceMap = TMAP):
    return import_otlp([b.jsonl(tmp_path / "spans.jsonl")], tmap)


def by_id(imp) -> dict:
    return {c.call_id: c for c in imp.calls}


def agent(b: Otlp, trace: str = T1, base: int = 0) -> Otlp:
    """root (HTTP) > agent > chat(planner), tool, chat(coder)."""
    b.span(base + 1, None, 0, 100, trace=trace, name="POST /run", http__request__method="POST")
    b.span(base + 2, base + 1, 1, 99, trace=trace, name="invoke_agent",
           gen_ai__operation__name="invoke_agent", gen_ai__request__model=BIG)
    b.chat(base + 3, base + 2, 2, 30, BIG, (500, 40))
    b.tool(base + 4, base + 2, 30, 45, "web search")
    b.chat(base + 5, base + 2, 45, 90, SMALL, (900, 70))
    return b


# ------------------------------------------------------------------------------ classification


def test_gen_ai_agent_run_becomes_three_calls(tmp_path):
    imp = run(tmp_path, agent(Otlp()))
    rep = imp.report
    assert [c.call_id for c in imp.calls] == [sid(3), sid(4), sid(5)]
    c3, c4, c5 = imp.calls
    assert (c3.llm, c3.input_tokens, c3.output_tokens, c3.prefix_tokens) == ("planner", 500, 40, 0)
    assert (c4.tool, c4.llm, c4.input_tokens) == ("web_search", None, 0)  # sanitized
    assert (c5.llm, c5.input_tokens, c5.output_tokens) == ("coder", 900, 70)
    assert {c.request_id for c in imp.calls} == {sid(1)}
    assert {c.workflow for c in imp.calls} == {"support"}
    # seconds since the earliest span start (the root), exactly as integer nanoseconds give
    assert (c3.start_s, c3.end_s, c4.start_s, c5.end_s) == (0.002, 0.03, 0.03, 0.09)
    assert (c3.parents, c4.parents, c5.parents) == ((), (sid(3),), (sid(4),))
    assert (rep.spans, rep.llm_calls, rep.tool_calls, rep.structure_spans, rep.requests) == (
        5, 2, 1, 2, 1)
    assert rep.problems == 0 and not rep.unmapped and not rep.nested_llm


def test_openinference_attributes(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 50, openinference__span__kind="CHAIN")
    b.span(2, 1, 1, 10, name="ChatOpenAI", openinference__span__kind="LLM",
           llm__model_name=SMALL, llm__token_count__prompt=300, llm__token_count__completion=12,
           llm__token_count__prompt_details__cache_read=256)
    b.span(3, 1, 10, 20, name="lookup", openinference__span__kind="TOOL", tool__name="db.query")
    b.span(4, 1, 20, 30, name="vector store", openinference__span__kind="RETRIEVER")
    b.span(5, 1, 30, 40, openinference__span__kind="EMBEDDING", embedding__model_name=SMALL)
    b.span(6, 1, 40, 50, name="t2", openinference__span__kind="TOOL")
    calls = by_id(run(tmp_path, b))
    assert sorted(calls) == [sid(2), sid(3), sid(4), sid(6)]
    c = calls[sid(2)]
    assert (c.llm, c.input_tokens, c.output_tokens, c.prefix_tokens) == ("coder", 300, 12, 256)
    assert (calls[sid(3)].tool, calls[sid(4)].tool, calls[sid(6)].tool) == (
        "db.query", "vector_store", "t2")


def test_the_model_as_sent_wins_over_the_model_that_answered(tmp_path):
    """vLLM answers every alias in its first served name; OpenInference's llm.model_name is the
    answer, llm.invocation_parameters holds what was sent."""
    b = Otlp()
    b.span(1, None, 0, 50, openinference__span__kind="CHAIN")
    sent = json.dumps({"model": SMALL, "max_tokens": 8})
    b.span(2, 1, 1, 10, openinference__span__kind="LLM", llm__model_name=BIG,
           llm__invocation_parameters=sent, llm__token_count__prompt=3,
           llm__token_count__completion=1)
    b.span(3, 1, 11, 20, openinference__span__kind="LLM", llm__model_name=BIG,
           llm__invocation_parameters=json.dumps({"model_name": SMALL}))
    b.span(4, 1, 21, 30, openinference__span__kind="LLM", llm__model_name=BIG,
           llm__invocation_parameters="not json")
    b.span(5, 1, 31, 40, gen_ai__operation__name="chat", gen_ai__request__model=SMALL,
           gen_ai__response__model=BIG)
    calls = by_id(run(tmp_path, b))
    assert [calls[sid(i)].llm for i in (2, 3, 4, 5)] == ["coder", "coder", "planner", "coder"]


def test_gen_ai_variants(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 100)
    # old token names, response model only, cache read under the older key
    b.span(2, 1, 1, 2, gen_ai__operation__name="text_completion", gen_ai__response__model=BIG,
           gen_ai__usage__prompt_tokens=7, gen_ai__usage__completion_tokens=3,
           gen_ai__usage__cache_read_input_tokens=5)
    # no operation, a model: an LLM call; the newer cache key
    b.span(3, 1, 3, 4, gen_ai__request__model=SMALL, gen_ai__usage__input_tokens=11,
           gen_ai__usage__output_tokens=2, gen_ai__usage__cache_read__input_tokens=8)
    # model but an agent / embeddings / OpenLLMetry embedding: structure
    b.span(4, 1, 5, 6, gen_ai__operation__name="create_agent", gen_ai__request__model=BIG)
    b.span(5, 1, 6, 7, gen_ai__operation__name="embeddings", gen_ai__request__model=BIG)
    b.span(6, 1, 7, 8, llm__request__type="embedding", gen_ai__request__model=BIG)
    b.span(7, 1, 8, 9, gen_ai__operation__name="generate_content", gen_ai__request__model=BIG,
           gen_ai__response__model="other", gen_ai__usage__input_tokens=1.0,
           gen_ai__usage__output_tokens=0)
    b.span(8, 1, 9, 10, name="ask_human", traceloop__span__kind="tool")
    b.span(9, 1, 10, 11, name="retrieve docs", gen_ai__operation__name="retrieval")
    calls = by_id(run(tmp_path, b))
    assert sorted(calls) == [sid(n) for n in (2, 3, 7, 8, 9)]
    assert (calls[sid(2)].llm, calls[sid(2)].input_tokens, calls[sid(2)].output_tokens,
            calls[sid(2)].prefix_tokens) == ("planner", 7, 3, 5)
    assert (calls[sid(3)].llm, calls[sid(3)].prefix_tokens) == ("coder", 8)
    assert (calls[sid(7)].llm, calls[sid(7)].input_tokens) == ("planner", 1)  # request model wins
    assert calls[sid(8)].tool == "ask_human" and calls[sid(9)].tool == "retrieve_docs"


def test_nested_llm_spans_are_one_call(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 100, openinference__span__kind="CHAIN")
    # LangChain's span (model, cache read) around the client's (tokens, no model)
    b.span(2, 1, 1, 20, openinference__span__kind="LLM", llm__model_name=BIG,
           llm__token_count__prompt=1, llm__token_count__prompt_details__cache_read=64)
    b.chat(3, 2, 2, 19, model=None, tokens=(400, 30))
    # three levels: the innermost is the call, each level fills what is still missing
    b.span(4, 1, 20, 40, openinference__span__kind="LLM", llm__model_name=SMALL,
           llm__token_count__completion=99)
    b.span(5, 4, 21, 39, openinference__span__kind="LLM", llm__token_count__prompt=50)
    b.chat(6, 5, 22, 38, model=None, tokens=None)
    # one LLM span around two calls (retries): both kept, the outer gives nothing
    b.span(7, 1, 40, 80, gen_ai__operation__name="chat", gen_ai__request__model=BIG,
           gen_ai__usage__input_tokens=5, gen_ai__usage__output_tokens=5)
    b.chat(8, 7, 41, 50, SMALL, (10, 1))
    b.chat(9, 7, 51, 79, None, (20, 2))
    imp = run(tmp_path, b)
    calls = by_id(imp)
    assert sorted(calls) == [sid(n) for n in (3, 6, 8)]  # 9: no model of its own, none given
    c3, c6 = calls[sid(3)], calls[sid(6)]
    assert (c3.llm, c3.input_tokens, c3.output_tokens, c3.prefix_tokens) == ("planner", 400, 30, 64)
    assert (c6.llm, c6.input_tokens, c6.output_tokens) == ("coder", 50, 99)
    assert imp.report.nested_llm == (Nested(sid(2), sid(3)), Nested(sid(4), sid(6)),
                                     Nested(sid(5), sid(6)), Nested(sid(7), None))
    assert dict(imp.report.unmapped) == {"": (sid(9),)}
    assert imp.report.missing_usage == ()


def test_tool_with_calls_beneath_is_structure(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 100)
    b.tool(2, 1, 1, 50, "research_agent")  # an agent used as a tool
    b.chat(3, 2, 2, 20)
    b.tool(4, 2, 20, 30, "search")
    b.tool(5, 1, 50, 60, "outer")
    b.tool(6, 5, 51, 59, "inner")
    imp = run(tmp_path, b)
    assert sorted(by_id(imp)) == [sid(3), sid(4), sid(6)]
    assert imp.report.tools_as_structure == (sid(2), sid(5))


def test_error_status_and_missing_usage(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 100)
    b.chat(2, 1, 1, 10, error=True)
    b.chat(3, 1, 11, 20)["status"] = {"code": "STATUS_CODE_ERROR"}
    b.chat(6, 1, 41, 50, error=True, tokens=None)  # an error span has no usage: not a problem
    b.chat(4, 1, 21, 30, tokens=None)
    b.tool(5, 1, 31, 40, status_ok=True)
    imp = run(tmp_path, b)
    calls = by_id(imp)
    assert (calls[sid(2)].error, calls[sid(3)].error, calls[sid(4)].error) == (
        SPAN_ERROR, SPAN_ERROR, None)
    assert imp.report.failed == (sid(2), sid(3), sid(6))
    assert calls[sid(4)].parents == ()  # failed calls are nobody's parent
    assert (calls[sid(4)].input_tokens, calls[sid(4)].output_tokens) == (0, 0)
    assert imp.report.missing_usage == (sid(4),)
    assert imp.report.problems == 1


def test_unmapped_models_are_reported_not_renamed(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 100)
    b.chat(2, 1, 1, 10, "gpt-4o")
    b.chat(3, 1, 11, 20, "gpt-4o")
    b.chat(4, 1, 21, 30, BIG)
    imp = run(tmp_path, b)
    assert [c.call_id for c in imp.calls] == [sid(4)]
    assert dict(imp.report.unmapped) == {"gpt-4o": (sid(2), sid(3))}
    assert imp.report.unmapped_calls == 2 and imp.report.problems == 2
    # without a table, a model name that is a valid name is the LLM name; one that is not is
    # unmapped
    b.chat(5, 1, 31, 40, "my model")
    imp = run(tmp_path, b, TraceMap())
    assert sorted(c.llm for c in imp.calls) == ["Qwen/Qwen2.5-7B-Instruct", "gpt-4o", "gpt-4o"]
    assert dict(imp.report.unmapped) == {"my model": (sid(5),)}


# ------------------------------------------------------------------------------ bad spans


def test_malformed_spans_are_reported_with_their_id(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 100)
    b.chat(2, 1, 1, 2, tokens=(-1, 5))
    b.chat(3, 1, 2, 3, tokens=(1.5, 5))
    b.span(4, 1, 3, 4, gen_ai__operation__name="chat", gen_ai__request__model=BIG,
           gen_ai__usage__input_tokens="12")
    b.span(5, 1, 4, 5, gen_ai__operation__name=7)
    s6 = b.chat(6, 1, 6, 5)  # ends before it starts
    s7 = b.chat(7, 1, 6, 7)
    del s7["startTimeUnixNano"]
    s8 = b.chat(8, 1, 8, 9)
    s8["spanId"] = "xyz"
    s9 = b.chat(9, 1, 9, 10)
    s9["traceId"] = "0" * 32
    b.spans.append("not a span")
    b.chat(10, 1, 10, 11, tokens=(True, 1))
    b.chat(11, 1, 11, 12)  # the only good call
    assert s6 and s7
    imp = import_otlp([b.jsonl(tmp_path / "s.jsonl", per_line=100)], TMAP)
    assert [c.call_id for c in imp.calls] == [sid(11)]
    got = {m.span: m.reason for m in imp.report.malformed}
    where = f"{tmp_path / 's.jsonl'}:line 1 resourceSpans[0].scopeSpans[0].spans"
    assert set(got) == {sid(2), sid(3), sid(4), sid(5), sid(6), sid(7), sid(9), sid(10),
                        f"{where}[7]", f"{where}[9]"}  # a span id is enough to name one
    assert "gen_ai.usage.input_tokens" in got[sid(2)] and "-1" in got[sid(2)]
    assert "gen_ai.usage.input_tokens" in got[sid(3)] and "1.5" in got[sid(3)]
    assert "'12'" in got[sid(4)]
    assert "gen_ai.operation.name" in got[sid(5)]
    assert "endTimeUnixNano" in got[sid(6)]
    assert "startTimeUnixNano" in got[sid(7)] and "missing" in got[sid(7)]
    assert "spanId" in got[f"{where}[7]"] and "'xyz'" in got[f"{where}[7]"]
    assert "traceId" in got[sid(9)] and "non-zero" in got[sid(9)]
    assert "span object" in got[f"{where}[9]"]
    assert "True" in got[sid(10)]
    assert imp.report.problems == 10
    assert imp.report.structure_spans == 1  # the root; malformed spans are not counted


def test_malformed_parent_still_groups_its_children(tmp_path):
    b = Otlp()
    root = b.span(1, None, 0, 100)
    del root["endTimeUnixNano"]  # still open when exported
    b.chat(2, 1, 1, 10)
    imp = run(tmp_path, b)
    assert [(c.call_id, c.request_id) for c in imp.calls] == [(sid(2), sid(1))]
    assert imp.report.malformed == (Malformed(sid(1), imp.report.malformed[0].reason),)
    assert imp.report.orphans == ()


def test_orphans(tmp_path):
    b = Otlp()
    # trace 1: one root and an orphan beneath a span that was never exported: joins the root
    b.span(1, None, 0, 100, trace=T1)
    b.chat(2, 1, 1, 10, trace=T1)
    b.span(3, 99, 10, 40, trace=T1)
    b.chat(4, 3, 11, 20, trace=T1)
    # trace 2: no root, two orphans: one request named by the trace id
    b.chat(5, 98, 0, 10, trace=T2)
    b.tool(6, 97, 10, 20, trace=T2)
    # trace 3: two roots and an orphan: the orphan's request is the trace id
    b.span(7, None, 0, 10, trace=T3)
    b.chat(8, 7, 1, 2, trace=T3)
    b.span(9, None, 20, 30, trace=T3)
    b.chat(10, 96, 40, 50, trace=T3)
    imp = run(tmp_path, b)
    req = {c.call_id: c.request_id for c in imp.calls}
    assert req == {sid(2): sid(1), sid(4): sid(1), sid(5): T2, sid(6): T2, sid(8): sid(7),
                   sid(10): T3}
    assert imp.report.orphans == (Orphan(sid(3), sid(99)), Orphan(sid(5), sid(98)),
                                  Orphan(sid(6), sid(97)), Orphan(sid(10), sid(96)))
    assert imp.report.problems == 4


def test_cycles_are_dropped(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 100)
    b.chat(2, 1, 1, 10)
    b.span(3, 5, 10, 20)   # 3 -> 5 -> 4 -> 3: a cycle
    b.span(4, 3, 10, 20)
    b.span(5, 4, 10, 20)
    b.chat(6, 4, 11, 12)   # beneath the cycle
    b.chat(7, 7, 20, 30)   # its own parent
    imp = run(tmp_path, b)
    assert [c.call_id for c in imp.calls] == [sid(2)]
    assert imp.report.cycles == ((sid(3), sid(5), sid(4)), (sid(7),))
    assert imp.report.cycle_dropped == 5
    assert imp.report.problems == 2


def test_duplicates_first_wins(tmp_path):
    b = agent(Otlp())
    b.chat(3, 2, 2, 30, BIG, (1, 1))  # a retried export of span 3, changed
    path = b.jsonl(tmp_path / "d.jsonl", per_line=5)
    imp = import_otlp([path], TMAP)
    assert by_id(imp)[sid(3)].input_tokens == 500
    (dup,) = imp.report.duplicates
    assert (dup.span, dup.where) == (sid(3), f"{path}:line 2 resourceSpans[0].scopeSpans[0]."
                                     "spans[0]")
    assert imp.report.problems == 0
    # across files: the first file wins
    other = Otlp(spans=[b.spans[-1]]).jsonl(tmp_path / "first.jsonl")
    imp = import_otlp([other, path], TMAP)
    assert by_id(imp)[sid(3)].input_tokens == 1


def test_request_attribute(tmp_path):
    b = Otlp(resource={"service.name": "agent", "session.id": "from-resource"})
    b.span(1, None, 0, 50, trace=T1, session__id="user 42")  # on the root
    b.chat(2, 1, 1, 10, trace=T1)
    b.span(3, None, 60, 100, trace=T2)
    b.chat(4, 3, 61, 70, trace=T2, session__id="user 42")  # on the call itself
    b.chat(2, 3, 71, 80, trace=T2)  # span id 2 again, other trace: resource's session
    imp = run(tmp_path, b, TraceMap(models=MODELS, request_attribute="session.id"))
    got = sorted((c.request_id, c.call_id) for c in imp.calls)
    assert got == [("from-resource", sid(2)), ("user_42", sid(2)), ("user_42", sid(4))]
    assert imp.report.no_request_attribute == ()
    # without the resource attribute, the third call falls back to its root
    b.resource = {"service.name": "agent"}
    imp = run(tmp_path, b, TraceMap(models=MODELS, request_attribute="session.id"))
    got = sorted((c.request_id, c.call_id) for c in imp.calls)
    assert got == [(sid(3), sid(2)), ("user_42", sid(2)), ("user_42", sid(4))]
    assert imp.report.no_request_attribute == (sid(2),)
    # two traces in one request with the same span id: the trace id tells them apart
    b.spans[4]["attributes"] += attrs({"session.id": "user 42"})
    imp = run(tmp_path, b, TraceMap(models=MODELS, request_attribute="session.id"))
    assert sorted(c.call_id for c in imp.calls) == [f"{T1}:{sid(2)}", f"{T2}:{sid(2)}", sid(4)]
    assert {c.request_id for c in imp.calls} == {"user_42"}
    validate_calls(imp.calls)


def test_attribute_values_and_all_zero_parents(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 100, tags=["a", "b"], neg=-3, x=0.5, ok=True)
    b.spans[0]["attributes"] += [
        {"key": "kv", "value": {"kvlistValue": {"values": [
            {"key": "inner", "value": {"intValue": 7}}]}}},
        {"key": "junk", "value": {"intValue": "seven"}},  # not read: harmless
        {"key": "empty", "value": {}}]
    b.spans[0]["parentSpanId"] = "0" * 16  # no parent
    b.span(2, 1, 1, 10, openinference__span__kind="llm", llm__model_name=BIG)  # any case
    s3 = b.chat(3, None, 10, 20)
    s3["parentSpanId"] = base64.b64encode(bytes(8)).decode()  # all-zero, base64
    bad = b.chat(4, 1, 20, 30)
    bad["attributes"].append({"key": "gen_ai.usage.output_tokens",
                              "value": {"intValue": "many"}})
    del bad["attributes"][-2]  # the good output count
    path = b.jsonl(tmp_path / "v.jsonl", per_line=10)
    spans = read_otlp(path)
    a = spans[0].attributes
    assert (a["tags"], a["neg"], a["x"], a["ok"], a["kv"], a["empty"]) == (
        ("a", "b"), -3, 0.5, True, {"inner": 7}, None)
    assert spans[0].bad_attributes == {"junk"} and spans[0].problem is None
    assert spans[0].parent_id == "" and spans[2].parent_id == ""
    imp = otlp_calls(spans, TMAP)
    assert sorted(c.call_id for c in imp.calls) == [sid(2), sid(3)]
    assert {c.request_id for c in imp.calls} == {sid(1), sid(3)}
    (m,) = imp.report.malformed
    assert m.span == sid(4) and "gen_ai.usage.output_tokens" in m.reason
    assert imp.report.missing_usage == (sid(2),)


def test_root_span_ids_shared_by_two_traces(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 10, trace=T1)
    b.chat(2, 1, 1, 9, trace=T1)
    b.span(1, None, 20, 30, trace=T2)
    b.chat(3, 1, 21, 29, trace=T2)
    imp = run(tmp_path, b)
    assert [c.request_id for c in imp.calls] == [f"{T1}:{sid(1)}", f"{T2}:{sid(1)}"]
    assert imp.report.duplicates == ()


def test_sanitize_name():
    assert sanitize_name("web search") == "web_search"
    assert sanitize_name(".hidden") == "_hidden"
    assert sanitize_name("") == "_"
    assert sanitize_name("é" * 300) == "_" * 128
    assert sanitize_name("ok.name:1/2-3+4") == "ok.name:1/2-3+4"


# ------------------------------------------------------------------------------ files


def _b64(hexid: str) -> str:
    return base64.b64encode(bytes.fromhex(hexid)).decode()


def test_base64_and_uppercase_ids_give_the_same_trace(tmp_path):
    b = agent(Otlp())
    want = run(tmp_path, b).calls
    b64 = Otlp(spans=[{**s, "traceId": _b64(s["traceId"]), "spanId": _b64(s["spanId"]),
                       "parentSpanId": _b64(s["parentSpanId"]) if s["parentSpanId"] else ""}
                      for s in b.spans])
    assert run(tmp_path, b64).calls == want
    upper = Otlp(spans=[{**s, "traceId": s["traceId"].upper(), "spanId": s["spanId"].upper()}
                        for s in b.spans])
    assert run(tmp_path, upper).calls == want
    # ints instead of strings for times and intValue, json_format's field names
    snake = json.loads(json.dumps(b.request()).replace("resourceSpans", "resource_spans")
                       .replace("scopeSpans", "scope_spans").replace("TimeUnixNano",
                                                                     "_time_unix_nano")
                       .replace("stringValue", "string_value").replace("spanId", "span_id"))
    for s in snake["resource_spans"][0]["scope_spans"][0]["spans"]:
        s["start_time_unix_nano"] = int(s.pop("start_time_unix_nano"))
    (tmp_path / "snake.json").write_text(json.dumps(snake))
    assert import_otlp(tmp_path / "snake.json", TMAP).calls == want


def test_both_file_formats(tmp_path):
    b = agent(agent(Otlp(), T2, base=10))
    lines = import_otlp([b.jsonl(tmp_path / "a.jsonl", per_line=3)], TMAP)
    doc = import_otlp([b.document(tmp_path / "b.json")], TMAP)
    assert lines.calls == doc.calls and len(lines.calls) == 6
    assert lines.report.to_dict() == doc.report.to_dict()
    assert len(read_otlp(tmp_path / "a.jsonl")) == 10
    text = (tmp_path / "a.jsonl").read_text()
    (tmp_path / "blank.jsonl").write_text("\n" + text.replace("\n", "\n\n"))
    assert import_otlp([tmp_path / "blank.jsonl"], TMAP).calls == lines.calls


def test_deterministic_and_order_free(tmp_path):
    b = agent(agent(agent(Otlp(), T2, base=10), T3, base=20))
    b.chat(40, 2, 50, 60, "gpt-4o")
    b.chat(41, 77, 5, 6)
    out1, out2, out3 = (tmp_path / f"t{i}.jsonl" for i in range(3))
    first = run(tmp_path, b)
    write_trace(out1, first.calls)
    write_trace(out2, run(tmp_path, b).calls)
    shuffled = Otlp(spans=random.Random(3).sample(b.spans, len(b.spans)))
    again = run(tmp_path, shuffled)
    write_trace(out3, again.calls)
    assert out1.read_bytes() == out2.read_bytes() == out3.read_bytes()
    assert first.report.to_dict() == again.report.to_dict()
    assert read_trace(out1).calls == first.calls


@pytest.mark.parametrize("text, field, expected", [
    ('{"resourceSpans": []}\n{"resourceSpans": [\n', "line 2", "JSON"),
    ('{"resourceSpans": []}\n[1, 2]\n', "line 2", "a JSON object"),
    ('\n\n{"resourceMetrics": []}\n', "line 3", "resourceSpans"),
    ('{"resourceSpans": {}}\n', "line 1: resourceSpans", "a list"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": 3}]}]}\n',
     "line 1: resourceSpans[0].scopeSpans[0].spans", "a list"),
    ('{\n  "resourceSpans": [\n    {,}\n  ]\n}\n', "line 3", "JSON"),
    ('"just a string"\n', "line 1", "a JSON object"),
])
def test_file_errors_name_file_and_line(tmp_path, text, field, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        read_otlp([path])
    assert info.value.source == str(path)
    assert info.value.field == field
    assert expected in info.value.expected


def test_missing_file(tmp_path):
    with pytest.raises(InputError) as info:
        read_otlp([tmp_path / "nope.jsonl"])
    assert info.value.source == str(tmp_path / "nope.jsonl")


# ------------------------------------------------------------------------------ property

KINDS = ("struct", "mapped", "unmapped", "tool")


@st.composite
def forests(draw):
    n = draw(st.integers(1, 25))
    spans = []
    for i in range(n):
        parent = draw(st.integers(-1, i - 1))
        trace = draw(st.sampled_from((T1, T2))) if parent < 0 else spans[parent]["trace"]
        start = draw(st.integers(0, 1000))
        spans.append({"parent": parent, "trace": trace, "kind": draw(st.sampled_from(KINDS)),
                      "start": start, "end": start + draw(st.integers(0, 300)),
                      "tokens": draw(st.none() | st.tuples(st.integers(0, 9999),
                                                           st.integers(0, 999)))})
    return spans, draw(st.randoms(use_true_random=False))


def _below(spans, i):
    """Indices of the descendants of span i."""
    out, todo = [], [i]
    while todo:
        j = todo.pop()
        kids = [k for k, s in enumerate(spans) if s["parent"] == j]
        out += kids
        todo += kids
    return out


@settings(max_examples=60, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(forests())
def test_property_every_mapped_llm_leaf_is_one_call(tmp_path, case):
    spans, rnd = case
    b = Otlp()
    for i, s in enumerate(spans):
        parent = s["parent"] + 1 if s["parent"] >= 0 else None
        if s["kind"] == "struct":
            b.span(i + 1, parent, s["start"], s["end"], trace=s["trace"])
        elif s["kind"] == "tool":
            b.tool(i + 1, parent, s["start"], s["end"], trace=s["trace"])
        else:
            b.chat(i + 1, parent, s["start"], s["end"],
                   BIG if s["kind"] == "mapped" else "gpt-4o", s["tokens"], trace=s["trace"])
    b.spans = rnd.sample(b.spans, len(b.spans))
    imp = run(tmp_path, b)
    llm = {"mapped", "unmapped"}
    expected = set()
    for i, s in enumerate(spans):
        below = [spans[j]["kind"] for j in _below(spans, i)]
        if s["kind"] == "mapped" and not llm & set(below):
            expected.add(sid(i + 1))
        if s["kind"] == "tool" and not set(below) - {"struct"}:
            expected.add(sid(i + 1))
    assert {c.call_id for c in imp.calls} == expected
    assert len(imp.calls) == len(expected)
    rep = imp.report
    candidates = sum(s["kind"] != "struct" for s in spans)
    assert len(imp.calls) + rep.unmapped_calls + len(rep.nested_llm) + len(
        rep.tools_as_structure) == candidates
    assert rep.structure_spans + candidates - len(rep.nested_llm) - len(
        rep.tools_as_structure) == len(spans)
    # the request of every call is its tree's root
    for c in imp.calls:
        i = int(c.call_id, 16) - 1
        while spans[i]["parent"] >= 0:
            i = spans[i]["parent"]
        assert c.request_id == sid(i + 1)
    validate_calls(imp.calls)
    out = tmp_path / "p.jsonl"
    if imp.calls:
        write_trace(out, imp.calls)
        assert read_trace(out).calls == imp.calls


def test_otlp_calls_of_no_spans():
    imp = otlp_calls((), TMAP)
    assert imp.calls == () and imp.report.spans == 0 and imp.report.problems == 0


# ------------------------------------------------------------------------------ CLI


def test_cli_imports_and_reports(tmp_path, capsys):
    b = agent(Otlp())
    b.chat(6, 2, 91, 95, "gpt-4o")
    src = b.jsonl(tmp_path / "spans.jsonl")
    mapping = tmp_path / "map.yaml"
    mapping.write_text(f"workflow: support\nmodels:\n  {BIG}: planner\n")
    out, report = tmp_path / "trace.jsonl", tmp_path / "report.json"
    rc = main(["trace", "import", str(src), "--out", str(out), "--map", str(mapping),
               "--model", f"{SMALL}=coder", "--report", str(report)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "unmapped" in text and sid(6) in text and "gpt-4o" in text
    assert f"wrote {out} (3 calls, 1 request)" in text
    trace = read_trace(out)
    assert [c.llm or c.tool for c in trace.calls] == ["planner", "web_search", "coder"]
    assert {c.workflow for c in trace.calls} == {"support"}
    rep = json.loads(report.read_text())
    assert rep["unmapped"] == {"gpt-4o": {"calls": 1, "spans": [sid(6)]}}
    assert rep["counts"]["unmapped"] == 1 and rep["problems"] == 1
    rc = main(["trace", "import", str(src), "--out", str(out), "--model", "gpt-4o=big",
               "--model", f"{BIG}=planner", "--model", f"{SMALL}=coder", "--workflow", "wf2",
               "--json"])
    js = json.loads(capsys.readouterr().out)
    assert rc == 0 and js["llm_calls"] == 3 and js["problems"] == 0 and js["out"] == str(out)
    assert {c.workflow for c in read_trace(out).calls} == {"wf2"}


def test_cli_request_attribute(tmp_path, capsys):
    b = Otlp(resource={"session.id": "s-1"})
    agent(agent(b, T2, base=10))
    src = b.jsonl(tmp_path / "s.jsonl")
    out = tmp_path / "t.jsonl"
    assert main(["trace", "import", str(src), "--out", str(out), "--request-attribute",
                 "session.id", "--model", f"{BIG}=planner", "--model", f"{SMALL}=coder"]) == 0
    assert {c.request_id for c in read_trace(out).calls} == {"s-1"}
    assert "(6 calls, 1 request)" in capsys.readouterr().out


def test_cli_examples_cut_at_five(tmp_path, capsys):
    b = Otlp()
    b.span(1, None, 0, 100)
    for n in range(2, 10):
        b.chat(n, 1, n, n + 1, "gpt-4o")
    b.chat(20, 1, 50, 60)
    src = b.jsonl(tmp_path / "s.jsonl")
    assert main(["trace", "import", str(src), "--out", str(tmp_path / "t.jsonl"),
                 "--model", f"{BIG}=planner"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "unmapped" in ln
                and "8" in ln.split())
    assert " ".join(sid(n) for n in range(2, 7)) + " (+3)" in line


def test_cli_strict_writes_nothing(tmp_path, capsys):
    b = agent(Otlp())
    b.chat(6, 99, 91, 95, "gpt-4o")  # an orphan of an unmapped model
    src = b.jsonl(tmp_path / "spans.jsonl")
    out = tmp_path / "trace.jsonl"
    rc = main(["trace", "import", str(src), "--out", str(out), "--strict",
               "--model", f"{BIG}=planner", "--model", f"{SMALL}=coder",
               "--report", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists() and not (tmp_path / "r.json").exists()
    assert err.count("\n") == 1
    assert "--strict: 2 problems" in err and "unmapped 1" in err and "orphans 1" in err
    # no problem: --strict passes
    b.spans.pop()
    rc = main(["trace", "import", str(b.jsonl(src)), "--out", str(out), "--strict",
               "--model", f"{BIG}=planner", "--model", f"{SMALL}=coder"])
    assert rc == 0 and out.exists()


def test_cli_errors_exit_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"resourceSpans": []}\nnot json\n')
    out = tmp_path / "t.jsonl"
    assert main(["trace", "import", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: line 2" in err and err.count("\n") == 1 and not out.exists()
    # spans, but no calls at all
    b = Otlp()
    b.span(1, None, 0, 10)
    b.chat(2, 1, 1, 2, "gpt-4o")
    src = b.jsonl(tmp_path / "s.jsonl")
    assert main(["trace", "import", str(src), "--out", str(out), "--model", "x=y"]) == 2
    err = capsys.readouterr().err
    assert f"no LLM or tool calls in {src}" in err and "gpt-4o" in err
    # bad flags before any work
    assert main(["trace", "import", str(src), "--out", str(tmp_path)]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["trace", "import", str(src), "--out", str(out), "--model", "nope"]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["trace", "import", str(src), "--out", str(out), "--report", str(out)]) == 2
    assert "--report" in capsys.readouterr().err
    assert main(["trace", "import", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert not out.exists()


def test_cli_writes_the_agent_time_between_calls_as_client_calls(tmp_path, capsys):
    b = Otlp()
    b.span(1, None, 0, 100, name="POST /run")
    b.chat(3, 1, 2, 30, BIG, (500, 40))
    b.tool(4, 1, 40, 45, "search")  # 10 ms after the planner: the agent's own time
    b.chat(5, 1, 47, 90, SMALL, (900, 70))  # 2 ms: under the 5 ms floor
    src = b.jsonl(tmp_path / "spans.jsonl")
    out = tmp_path / "trace.jsonl"
    args = ["trace", "import", str(src), "--out", str(out), "--model", f"{BIG}=planner",
            "--model", f"{SMALL}=coder"]
    assert main(args) == 0
    assert "1 of them client time" in capsys.readouterr().out
    calls = read_trace(out).calls
    assert [(c.call_id, c.tool, c.parents) for c in calls] == [
        (sid(3), None, ()), (f"{sid(4)}.client", "client", (sid(3),)),
        (sid(4), "search", (f"{sid(4)}.client",)), (sid(5), None, (sid(4),))]
    gap = calls[1]
    assert (gap.start_s, gap.end_s) == pytest.approx((0.03, 0.04), abs=1e-12)
    assert main([*args, "--no-client-time"]) == 0
    assert [c.call_id for c in read_trace(out).calls] == [sid(3), sid(4), sid(5)]


def test_line_separators_inside_strings_do_not_cut_lines(tmp_path):
    """JSON leaves U+2028, U+2029 and U+0085 raw in strings (the collector writes them so)."""
    b = agent(agent(Otlp(), T2, base=10))
    src = b.jsonl(tmp_path / "a.jsonl", per_line=3)
    text = src.read_text().replace('"web search"', '"web\u2028sea\u0085rch\u2029"')
    raw = text.replace("\\u2028", "\u2028").replace("\\u0085", "\u0085").replace(
        "\\u2029", "\u2029")
    assert "\u2028" in raw and raw.count("\n") == text.count("\n") >= 2
    src.write_text(raw + "\r\n")
    imp = import_otlp([src], TMAP)
    assert len(imp.calls) == 6 and {c.tool for c in imp.calls if c.tool} == {"web_sea_rch_"}


@pytest.mark.parametrize("field, value", [
    ("endTimeUnixNano", "9" * 5000), ("endTimeUnixNano", "9" * 400), ("endTimeUnixNano", 2 ** 70),
    ("startTimeUnixNano", "-5"),
])
def test_out_of_range_times_are_malformed_spans(tmp_path, field, value):
    b = Otlp()
    b.span(1, None, 0, 100)
    b.chat(2, 1, 1, 10)[field] = value
    imp = run(tmp_path, b)
    assert [m.span for m in imp.report.malformed] == [sid(2)] and not imp.calls
    assert len(imp.report.malformed[0].reason) < 200


def test_out_of_range_integer_attributes_are_not_read(tmp_path):
    b = Otlp()
    b.span(1, None, 0, 100, some__count=1)
    b.chat(2, 1, 1, 10)["attributes"].append({"key": "x", "value": {"intValue": "-" + "9" * 5000}})
    b.chat(3, 1, 11, 20)["attributes"].append(
        {"key": "gen_ai.usage.input_tokens", "value": {"intValue": str(2 ** 64)}})
    imp = run(tmp_path, b)
    assert [c.call_id for c in imp.calls] == [sid(2)]  # the unread attribute does not matter
    assert [m.span for m in imp.report.malformed] == [sid(3)]


def test_deeply_nested_json_is_an_input_error(tmp_path):
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(InputError, match=r"deep\.jsonl"):
        read_otlp(deep)


def test_instrumentation_library_spans_of_older_files(tmp_path):
    b = agent(Otlp())
    doc = json.loads(b.document(tmp_path / "new.json").read_text())
    for rs in doc["resourceSpans"]:
        rs["instrumentationLibrarySpans"] = rs.pop("scopeSpans")
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert import_otlp([tmp_path / "old.json"], TMAP).calls == \
        import_otlp([tmp_path / "new.json"], TMAP).calls
