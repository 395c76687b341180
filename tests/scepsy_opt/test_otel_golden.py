"""Golden OTLP/JSON files made by real OpenTelemetry instrumentation (tests/golden/otel/).

The files were written by ``tests/golden/otel/make_golden.py``: real instrumentation packages
(opentelemetry-instrumentation-openai-v2, openinference-instrumentation-openai,
openinference-instrumentation-langchain on a LangGraph graph) traced a program against a fake
OpenAI-compatible server, and the OpenTelemetry SDK exported the spans over OTLP/HTTP to
``scepsy_opt.ingest.otlp_http``. ``NAME.expected.json`` holds what the fake server itself answered.

- Importing each committed file gives one call per server call, with the server's own token
  counts, the model -> LLM table applied, the tool calls, the failed call marked failed, and
  the calls of a request chained in the order the program made them.
- Running the generator again (where the packages are installed) gives files of the same
  structure (span names, kinds, attribute keys, parent structure, status codes) and the same
  server answers; only ids and times differ.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from scepsy_opt.ingest.otel import import_otlp
from scepsy_opt.ingest.tracemap import TraceMap
from scepsy_opt.traces import CallRecord

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "otel"
SCENARIOS = ("openai_v2", "openinference_openai", "openinference_langchain")
NEEDS = {
    "openai_v2": ("openai", "opentelemetry.instrumentation.openai_v2"),
    "openinference_openai": ("openai", "openinference.instrumentation.openai"),
    "openinference_langchain": ("langgraph", "langchain_openai",
                                "openinference.instrumentation.langchain"),
}


def _expected(name: str) -> dict[str, Any]:
    return json.loads((GOLDEN / f"{name}.expected.json").read_text(encoding="utf-8"))


def _steps(exp: dict[str, Any]) -> dict[int, list[tuple[Any, ...]]]:
    """Per request, the calls in the order the program made them, as the importer should
    give them: ``(llm or tool, input tokens, output tokens, failed)``; untraced server calls
    (a legacy completions call that an instrumentation does not wrap) left out."""
    models = exp["models"]
    steps: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
    for i, c in enumerate(exp["calls"]):
        if not c["traced"]:
            continue
        failed = c["status"] != 200
        step = (models[c["model"]], 0 if failed else c["prompt_tokens"],
                0 if failed else c["completion_tokens"], failed)
        steps.setdefault(c["request"], []).append((2 * i + 1, step))
    for t in exp["tool_calls"]:  # a tool ran after the server's call number after_call
        steps.setdefault(t["request"], []).append((2 * t["after_call"], (t["tool"], 0, 0, False)))
    return {r: [s for _, s in sorted(v)] for r, v in steps.items()}


def _imported(calls: tuple[CallRecord, ...]) -> dict[str, list[CallRecord]]:
    by_request: dict[str, list[CallRecord]] = {}
    for c in calls:
        by_request.setdefault(c.request_id, []).append(c)
    return {r: sorted(v, key=lambda c: (c.start_s, c.end_s)) for r, v in by_request.items()}


def _step(c: CallRecord) -> tuple[Any, ...]:
    return (c.llm if c.llm is not None else c.tool, c.input_tokens, c.output_tokens, c.failed)


@pytest.mark.parametrize("name", SCENARIOS)
def test_import_matches_the_server(name: str) -> None:
    exp = _expected(name)
    result = import_otlp([GOLDEN / f"{name}.otlp.jsonl"], TraceMap(models=exp["models"]))
    want = _steps(exp)
    got = _imported(result.calls)
    assert len(got) == exp["requests"] == len(want)
    # requests come in the order they ran; each request's calls in the order they were made
    order = sorted(got, key=lambda r: got[r][0].start_s)
    assert [[_step(c) for c in got[r]] for r in order] == [want[i] for i in sorted(want)]
    for calls in got.values():
        done: list[str] = []  # sequential program: each call waited for the last good one
        for c in calls:
            assert c.parents == tuple(done[-1:]), (name, c)
            assert c.workflow == "agent"
            if not c.failed:
                done.append(c.call_id)
    counts = result.report.counts()
    assert counts["failed"] == sum(c["status"] != 200 and c["traced"] for c in exp["calls"])
    assert counts["unmapped"] == counts["malformed"] == counts["orphans"] == 0
    assert counts["cycles"] == counts["duplicates"] == 0
    failed = [c for c in result.calls if c.failed]
    assert len(failed) == len(exp["failed"]) >= 1
    assert all(c.error == "span_error" for c in failed)


def test_golden_scenarios_cover_what_they_claim() -> None:
    """Several requests, chat and streaming calls with usage, a completions call, two models,
    a tool (LangGraph) and one failed call in every scenario."""
    for name in SCENARIOS:
        exp = _expected(name)
        calls = exp["calls"]
        assert exp["requests"] >= 3
        assert {c["model"] for c in calls} == set(exp["models"]) and len(exp["models"]) == 2
        assert any(c["stream"] and c["status"] == 200 for c in calls)
        assert any(not c["stream"] and c["status"] == 200 for c in calls)
        assert sum(c["status"] == 500 for c in calls) == 1
        if name == "openinference_langchain":
            assert len(exp["tool_calls"]) == exp["requests"]
        else:
            assert any(c["endpoint"] == "/v1/completions" for c in calls)


# ------------------------------------------------------------------------- regeneration


def _spans(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    out.append({**s, "_scope": ss.get("scope", {}).get("name", ""),
                                "_resource": sorted(a["key"] for a in rs.get("resource", {})
                                                    .get("attributes", []))})
    return out


def _shape(path: Path) -> list[Any]:
    """The file's span trees without ids and times: per span its name, kind, scope, resource
    attribute keys, attribute keys, event names, status code and children (sorted)."""
    spans = _spans(path)
    children: dict[str, list[dict[str, Any]]] = {}
    ids = {s["spanId"] for s in spans}
    for s in spans:
        children.setdefault(s.get("parentSpanId", ""), []).append(s)

    def tree(s: dict[str, Any]) -> Any:
        kids = sorted((tree(k) for k in children.get(s["spanId"], [])), key=repr)
        return (s.get("name", ""), s.get("kind", 0), s["_scope"], tuple(s["_resource"]),
                tuple(sorted(a["key"] for a in s.get("attributes", []))),
                tuple(e.get("name", "") for e in s.get("events", [])),
                s.get("status", {}).get("code", 0), tuple(kids))

    roots = [s for s in spans if s.get("parentSpanId", "") not in ids]
    return sorted((tree(r) for r in roots), key=repr)


@pytest.mark.parametrize("name", SCENARIOS)
def test_regenerated_files_have_the_committed_structure(name: str, tmp_path: Path) -> None:
    for mod in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http", *NEEDS[name]):
        pytest.importorskip(mod)
    gen = _generator()
    made_with = _expected(name)["versions"]
    if gen.versions(name) != made_with:
        pytest.skip(f"the golden {name} files were made with {made_with}; other versions are "
                    "installed here (regenerate them: python tests/golden/otel/make_golden.py)")
    proc = subprocess.run([sys.executable, str(GOLDEN / "make_golden.py"), "--out",
                           str(tmp_path), "--only", name], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    new, old = tmp_path / f"{name}.otlp.jsonl", GOLDEN / f"{name}.otlp.jsonl"
    assert _shape(new) == _shape(old)
    assert json.loads((tmp_path / f"{name}.expected.json").read_text()) == _expected(name)
    new_ids = {s["spanId"] for s in _spans(new)}
    assert new_ids.isdisjoint({s["spanId"] for s in _spans(old)})  # really a new run


def test_shape_sees_a_changed_structure(tmp_path: Path) -> None:
    """The regeneration check can fail: a renamed attribute key or a moved span changes it."""
    old = GOLDEN / "openinference_langchain.otlp.jsonl"
    text = old.read_text(encoding="utf-8")
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text(text.replace('"llm.token_count.prompt"', '"llm.token_count.input"', 1))
    assert _shape(renamed) != _shape(old)
    spans = _spans(old)
    tool = next(s for s in spans if s.get("name") == "lookup")
    root = next(s for s in spans if s["traceId"] == tool["traceId"] and "parentSpanId" not in s)
    moved = tmp_path / "moved.jsonl"
    moved.write_text(text.replace(f'"parentSpanId":"{tool["parentSpanId"]}","name":"lookup"',
                                  f'"parentSpanId":"{root["spanId"]}","name":"lookup"', 1))
    assert moved.read_text() != text and _shape(moved) != _shape(old)


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generator_lists_the_same_scenarios() -> None:
    mod = _generator()
    assert mod.SCENARIOS == SCENARIOS
    assert {k: tuple(v) for k, v in mod._PACKAGES.items()} == NEEDS
    assert Counter(mod.MODELS.values()) == Counter({"planner": 1, "writer": 1})
    for name in SCENARIOS:
        assert _expected(name)["models"] == mod.MODELS
