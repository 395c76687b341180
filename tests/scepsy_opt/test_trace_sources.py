"""What both trace sources (telemetry import and the recording proxy) share: parents inferred
from timing, failed calls, and the model -> LLM table."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_opt.ingest.tracemap import TraceMap, load_trace_map, model_pairs, trace_map
from scepsy_opt.stats import trace_stats
from scepsy_opt.traces import (
    CallRecord,
    infer_parents,
    read_trace,
    validate_calls,
    with_client_time,
    write_trace,
)
from scepsy_opt.workflows import generate_trace, load_workflow, parse_workflow

EPS = 1e-9


def brute_parents(calls: list[CallRecord]) -> list[set[str]]:
    """The definition, call by call, in O(n^2)."""
    out = []
    for c in calls:
        done = [d for d in calls if d is not c and not d.failed and d.request_id == c.request_id
                and d.end_s <= c.start_s + EPS
                and (d.start_s, d.end_s, d.call_id) < (c.start_s, c.end_s, c.call_id)]
        if not done:
            out.append(set())
            continue
        last = max(d.start_s for d in done)
        out.append({d.call_id for d in done if d.end_s > last + EPS or d.start_s >= last - EPS})
    return out


times = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0])


@st.composite
def call_sets(draw: st.DrawFn) -> list[CallRecord]:
    n = draw(st.integers(1, 10))
    calls = []
    for i in range(n):
        start = draw(st.one_of(times, st.floats(0, 4, allow_nan=False)))
        length = draw(st.one_of(st.just(0.0), times, st.floats(0, 2, allow_nan=False)))
        calls.append(CallRecord("w", draw(st.sampled_from(["r0", "r1"])), f"c{i}", start,
                                start + length, llm="m",
                                error=draw(st.sampled_from([None, None, None, "upstream_500"]))))
    return calls


@settings(max_examples=400, deadline=None)
@given(call_sets())
def test_inferred_parents_match_the_definition(calls):
    got = infer_parents(calls)
    assert [set(c.parents) for c in got] == brute_parents(calls)
    validate_calls(got)  # parents end before their child starts, ids resolve
    # listed in order of their end (then id), never a failed call, never the call itself
    for c in got:
        ends = [next(d for d in got if d.call_id == p and d.request_id == c.request_id)
                for p in c.parents]
        assert [(d.end_s, d.call_id) for d in ends] == sorted((d.end_s, d.call_id) for d in ends)
        assert not any(d.failed for d in ends) and c.call_id not in c.parents


@settings(max_examples=100, deadline=None)
@given(call_sets(), st.randoms(use_true_random=False))
def test_inferred_parents_do_not_depend_on_record_order(calls, rnd):
    shuffled = list(calls)
    rnd.shuffle(shuffled)
    a = {(c.request_id, c.call_id): c.parents for c in infer_parents(calls)}
    b = {(c.request_id, c.call_id): c.parents for c in infer_parents(shuffled)}
    assert a == b


@settings(max_examples=100, deadline=None)
@given(call_sets())
def test_inferred_parents_have_no_cycle(calls):
    got = {c.call_id: c for c in infer_parents(calls) if c.request_id == "r0"}
    state: dict[str, int] = {}

    def visit(cid: str) -> None:
        assert state.get(cid) != 1, "cycle"
        if state.get(cid) == 2:
            return
        state[cid] = 1
        for p in got[cid].parents:
            visit(p)
        state[cid] = 2

    for cid in got:
        visit(cid)


def _call(cid, start, end, **kw):
    return CallRecord("w", kw.pop("request", "r0"), cid, start, end, llm=kw.pop("llm", "m"), **kw)


def test_chain_fan_out_and_fan_in():
    calls = [_call("a", 0, 1), _call("b1", 1, 2), _call("b2", 1, 3), _call("c", 3, 4),
             _call("d", 4.5, 5)]
    got = {c.call_id: c.parents for c in infer_parents(calls)}
    # a ends exactly when the fan-out starts: it is the fan-out's parent, not c's
    assert got == {"a": (), "b1": ("a",), "b2": ("a",), "c": ("b1", "b2"), "d": ("c",)}


def test_a_call_still_running_is_not_a_parent_and_requests_stay_apart():
    calls = [_call("long", 0, 10), _call("x", 0, 1), _call("y", 2, 3),
             _call("z", 1, 2, request="r1")]
    got = {(c.request_id, c.call_id): c.parents for c in infer_parents(calls)}
    assert got[("r0", "y")] == ("x",) and got[("r1", "z")] == ()


@pytest.mark.parametrize("name", ["rag", "beam-search"])
def test_generated_workflows_get_back_their_own_parents(name):
    calls = generate_trace(load_workflow(f"datasets/workflows/{name}.yaml"), 100, seed=3)
    assert [set(c.parents) for c in infer_parents(calls)] == [set(c.parents) for c in calls]


def test_coding_agent_statistics_are_unchanged_by_inferred_parents():
    """Its tool loops give other parent sets, but the same critical paths."""
    spec = load_workflow("datasets/workflows/coding-agent.yaml")
    calls = generate_trace(spec, 150, seed=1)
    true = trace_stats(validate_calls(calls))[spec.name]
    inferred = trace_stats(validate_calls(infer_parents(calls)))[spec.name]
    assert inferred.tool_critical_s == pytest.approx(true.tool_critical_s, rel=1e-9)
    for m, s in true.llms.items():
        assert inferred.llms[m].critical_calls == pytest.approx(s.critical_calls, rel=1e-9)
        assert inferred.llms[m].n == s.n and inferred.llms[m].p == pytest.approx(s.p, rel=1e-12)


# ------------------------------------------------------------------------------ failed calls

def test_failed_calls_are_left_out_and_their_children_rewired(tmp_path):
    calls = [_call("a", 0, 1, input_tokens=10), _call("f", 1, 2, error="upstream_503"),
             _call("g", 2, 2.5, error="upstream_timeout", parents=("f",)),
             _call("b", 3, 4, parents=("g",), input_tokens=30)]
    trace = validate_calls(calls)
    assert trace.failed == 2
    ok = trace.succeeded()
    assert [(c.call_id, c.parents) for c in ok.calls] == [("a", ()), ("b", ())]
    calls[1] = _call("f", 1, 2, error="upstream_503", parents=("a",))
    ok = validate_calls(calls).succeeded()
    assert [(c.call_id, c.parents) for c in ok.calls] == [("a", ()), ("b", ("a",))]
    stats = trace_stats(validate_calls(calls))["w"]
    assert stats.failed_calls == 2 and stats.llms["m"].n == 2
    assert stats.llms["m"].input_mean == pytest.approx(20.0)
    assert stats.llms["m"].critical_calls == pytest.approx(2.0)
    # the error survives a file round trip; a bad error name is an input error
    write_trace(tmp_path / "t.jsonl", calls)
    assert read_trace(tmp_path / "t.jsonl").calls == tuple(calls)
    text = (tmp_path / "t.jsonl").read_text().replace("upstream_503", "upstream 503")
    (tmp_path / "t.jsonl").write_text(text)
    with pytest.raises(InputError, match=r"line 2: error"):
        read_trace(tmp_path / "t.jsonl")


def test_a_workflow_whose_calls_all_failed_is_an_input_error():
    trace = validate_calls([_call("a", 0, 1, error="upstream_500")])
    with pytest.raises(InputError, match="did not fail"):
        trace_stats(trace)


def test_failed_calls_leave_the_counts_and_tokens_of_the_others():
    rng = random.Random(5)
    calls = list(generate_trace(load_workflow("datasets/workflows/rag.yaml"), 60, seed=2))
    failed = {i for i, c in enumerate(calls) if c.llm and rng.random() < 0.1}
    marked = [replace(c, error="upstream_500") if i in failed else c for i, c in enumerate(calls)]
    stats = trace_stats(validate_calls(marked))["rag"]
    assert stats.failed_calls == len(failed) > 0 and stats.requests == 60
    for m, s in stats.llms.items():
        ok = [c for i, c in enumerate(calls) if c.llm == m and i not in failed]
        assert s.n == pytest.approx(len(ok) / 60, rel=1e-12)
        assert s.input_mean == pytest.approx(sum(c.input_tokens for c in ok) / len(ok), rel=1e-12)


# ------------------------------------------------------------------------------ the table

def test_trace_map_from_file_and_pairs(tmp_path):
    f = tmp_path / "map.yaml"
    f.write_text("workflow: support\nrequest_attribute: session.id\nmodels:\n"
                 "  Qwen/Qwen2.5-7B-Instruct: planner\n  gpt-4o-mini: coder\n")
    m = trace_map(f, ["gpt-4o-mini=writer", "a=b=c"])
    assert m.workflow == "support" and m.request_attribute == "session.id"
    assert m.llm_for("Qwen/Qwen2.5-7B-Instruct") == "planner" and m.llm_for("gpt-4o-mini") == "writer"
    assert m.llm_for("a=b") == "c" and m.llm_for("other") is None and m.llm_for(None) is None
    assert trace_map(f, workflow="w2").workflow == "w2"
    assert load_trace_map(f) == trace_map(f)


def test_without_a_table_models_keep_their_names_when_they_are_names():
    m = TraceMap()
    assert m.workflow == "agent" and m.llm_for("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert m.llm_for("has space") is None and m.llm_for("") is None


@pytest.mark.parametrize("text, field", [
    ("workflow: a b\n", "workflow"), ("models: {gpt: 'not a name'}\n", "models"),
    ("modls: {}\n", "modls"), ("models: [a]\n", "models"), ("request_attribute: ''\n", "request_attribute"),
])
def test_bad_trace_map_files_name_the_field(tmp_path, text, field):
    f = tmp_path / "map.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match=field) as err:
        load_trace_map(f)
    assert str(f) in str(err.value)


@pytest.mark.parametrize("pair", ["nomodel", "=llm", "m=", "m=bad name", "m= x"])
def test_bad_model_pairs(pair):
    with pytest.raises(InputError, match="--model"):
        model_pairs([pair])


# ------------------------------------------------------------------------------ client time

def test_client_time_fills_the_gaps_on_the_critical_path():
    calls = infer_parents([_call("a", 0, 1), _call("b", 1.5, 2), _call("c", 2.002, 3),
                           _call("d", 4, 5, error="upstream_500"), _call("e", 6, 7)])
    out = with_client_time(calls)
    ids = [c.call_id for c in out]
    assert ids == ["a", "b.client", "b", "c", "d", "e.client", "e"]
    gap = out[1]
    assert (gap.tool, gap.start_s, gap.end_s, gap.parents) == ("client", 1.0, 1.5, ("a",))
    assert out[2].parents == ("b.client",) and out[3].parents == ("b",)  # 2 ms: under 5 ms
    trace = validate_calls(out)
    stats = trace_stats(trace)["w"]
    # the critical path now covers the whole request except the 2 ms gap and the failed call
    # (e waited on c: the failed d never counts)
    assert stats.tool_critical_s == pytest.approx(0.5 + 3.0, abs=1e-9)
    assert stats.llms["m"].critical_calls == pytest.approx(4.0)


def test_a_gap_of_exactly_the_floor_is_client_time():
    calls = infer_parents([_call("a", 0, 1.195), _call("b", 1.2, 2)])  # 1.2 - 1.195 < 0.005
    assert [c.call_id for c in with_client_time(calls)] == ["a", "b.client", "b"]


@settings(max_examples=100, deadline=None)
@given(call_sets())
def test_client_time_keeps_the_calls_and_a_valid_trace(calls):
    base = infer_parents(calls)
    out = with_client_time(base, min_gap_s=0.0)
    validate_calls(out)
    assert [c for c in out if c.tool is None] == [
        c if not c.parents or c.failed else replace(c, parents=next(
            d.parents for d in out if d.call_id == c.call_id)) for c in base]
    for gap in (c for c in out if c.tool == "client"):
        assert gap.end_s >= gap.start_s


@st.composite
def failing_dags(draw: st.DrawFn) -> list[CallRecord]:
    """Calls in start order, each with parents among the earlier ones, some failed."""
    n = draw(st.integers(1, 9))
    calls: list[CallRecord] = []
    for i in range(n):
        parents = draw(st.sets(st.sampled_from([c.call_id for c in calls]), max_size=3)) \
            if calls else set()
        calls.append(CallRecord("w", "r", f"c{i}", float(i), i + 0.5, llm="m",
                                parents=tuple(sorted(parents, key=lambda p: int(p[1:]))),
                                error=draw(st.sampled_from([None, "upstream_500"]))))
    return calls


def completed_ancestors(calls: list[CallRecord], c: CallRecord) -> set[str]:
    """Oracle: the nearest completed calls up every path through failed ones (recursive)."""
    by_id = {d.call_id: d for d in calls}
    out: set[str] = set()
    for p in c.parents:
        out |= completed_ancestors(calls, by_id[p]) if by_id[p].failed else {p}
    return out


@settings(max_examples=300, deadline=None)
@given(failing_dags())
def test_succeeded_keeps_the_nearest_completed_ancestors(calls):
    got = {c.call_id: set(c.parents) for c in validate_calls(calls).succeeded().calls}
    assert got == {c.call_id: completed_ancestors(calls, c) for c in calls if not c.failed}


def test_succeeded_through_a_long_chain_of_failures():
    calls = [_call("a", 0, 1)]
    for i in range(3000):  # deeper than Python's recursion limit
        calls.append(_call(f"f{i}", 1 + i, 1 + i, parents=(calls[-1].call_id,),
                           error="upstream_500"))
    calls.append(_call("z", 4000, 4001, parents=(calls[-1].call_id,)))
    assert [(c.call_id, c.parents) for c in validate_calls(calls).succeeded().calls] == [
        ("a", ()), ("z", ("a",))]


# ------------------------------------------------------------------------- program: recorded

def test_a_recorded_workflow_takes_any_llm_names_and_generates_nothing():
    spec = parse_workflow({"name": "agent", "program": "recorded",
                           "llms": {"my-planner": "qwen2.5-7b", "w.2": "qwen2.5-1.5b"}}, "a.yaml")
    assert sorted(spec.llms) == ["my-planner", "w.2"]
    with pytest.raises(InputError, match=r"a\.yaml: program: expected a recorded trace"):
        generate_trace(replace(spec, source="a.yaml"), 1, seed=0)
    for bad, field in [({"llms": {}}, "llms"), ({"tools": {"t": 0.1}}, "tools.t"),
                       ({"params": {"x": 1}}, "params.x")]:
        raw = {"name": "agent", "program": "recorded", "llms": {"p": "qwen2.5-7b"}, **bad}
        with pytest.raises(InputError, match=field):
            parse_workflow(raw, "a.yaml")


def test_a_recorded_workflow_is_planned_from_its_trace(tmp_path, capsys):
    from scepsy.cli import main

    calls = []
    for r in range(20):
        t = 10.0 * r
        calls.append(_call("p", t, t + 0.3, request=f"r{r}", llm="planner", input_tokens=20,
                           output_tokens=12))
        for k in range(1 + r % 3):
            calls.append(_call(f"w{k}", t + 0.4 + 0.5 * k, t + 0.8 + 0.5 * k, request=f"r{r}",
                               llm="writer", input_tokens=45, output_tokens=12))
    trace = tmp_path / "agent.jsonl"
    write_trace(trace, [replace(c, workflow="agent") for c in with_client_time(
        infer_parents(calls))])
    wf = tmp_path / "agent.yaml"
    wf.write_text("name: agent\nprogram: recorded\nllms:\n  planner: qwen2.5-7b\n"
                  "  writer: qwen2.5-1.5b\n")
    out = tmp_path / "plan.json"
    args = ["plan", "--workflow", str(wf), "--cluster", "datasets/clusters/a100-4.yaml",
            "--target", "1", "--out", str(out)]
    assert main([*args, "--trace", str(trace)]) == 0
    plan = json.loads(out.read_text())
    assert set(plan["allocation"]["llms"]) == {"planner", "writer"} and plan["status"] == "optimal"
    capsys.readouterr()
    out.unlink()
    assert main(args) == 2 and not out.exists()
    assert "--trace TRACE.jsonl" in capsys.readouterr().err
