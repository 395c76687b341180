"""Aggregate trace statistics: hand-computed traces, properties on random DAG traces."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_opt.stats import (
    CallClass,
    WorkflowStats,
    critical_path,
    stats_table,
    stats_to_dict,
    trace_stats,
    workflow_stats,
)
from scepsy_opt.traces import CallRecord, Trace, validate_calls


def _llm(req, cid, start, end, llm, parents=(), wf="w", **kw):
    return CallRecord(wf, req, cid, float(start), float(end), llm=llm, parents=tuple(parents), **kw)


def _tool(req, cid, start, end, tool, parents=(), wf="w"):
    return CallRecord(wf, req, cid, float(start), float(end), tool=tool, parents=tuple(parents))


# r1: serial chain A -> B -> A; r2: fan-out of three concurrent A calls, then B.
CHAIN_AND_FANOUT = [
    _llm("r1", "a1", 0, 1, "A", input_tokens=100, output_tokens=10),
    _llm("r1", "b1", 1, 3, "B", ["a1"], input_tokens=50, output_tokens=1),
    _llm("r1", "a2", 3, 4, "A", ["b1"], input_tokens=300, output_tokens=30),
    _llm("r2", "a1", 0, 2, "A", input_tokens=200, output_tokens=20),
    _llm("r2", "a2", 0, 2, "A", input_tokens=200, output_tokens=20),
    _llm("r2", "a3", 0, 2, "A", input_tokens=200, output_tokens=20),
    _llm("r2", "b1", 2, 3, "B", ["a1", "a2", "a3"], input_tokens=150, output_tokens=3),
]


# --------------------------------------------------------------------------- hand-computed
def test_chain_and_fanout_by_hand():
    s = workflow_stats(validate_calls(CHAIN_AND_FANOUT), "w")
    a, b = s.llms["A"], s.llms["B"]
    assert list(s.llms) == ["A", "B"] and s.requests == 2
    # n: A has 2 + 3 calls over 2 requests, B 1 + 1
    assert a.n == 2.5 and b.n == 1.0
    # p_A: durations (1 + 1) + (2 + 2 + 2) = 8 over unions 2 + 2 = 4
    assert a.p == pytest.approx(2.0) and a.rounds == pytest.approx(1.25)
    assert b.p == pytest.approx(1.0) and b.rounds == pytest.approx(1.0)
    # critical paths: r1 a2 -> b1 -> a1 (A 2, B 1); r2 b1 -> a1 (tie of a1..a3 -> 'a1')
    assert a.critical_calls == pytest.approx(1.5) and b.critical_calls == pytest.approx(1.0)
    # busy: r1 A 2, B 2; r2 A 6, B 1 -> A 8/11, B 3/11
    assert a.time_share == pytest.approx(8 / 11) and b.time_share == pytest.approx(3 / 11)
    # per-request shares A: 1/2, 6/7 -> mean 19/28, std 5/28; B: 1/2, 1/7 -> mean 9/28
    assert a.time_share_cv_requests == pytest.approx(5 / 19)
    assert b.time_share_cv_requests == pytest.approx(5 / 9)
    # tokens over all of A's calls: 100, 300, 200, 200, 200
    assert a.input_mean == pytest.approx(200.0)
    assert a.input_std == pytest.approx(math.sqrt((100**2 + 100**2) / 5))
    assert a.output_mean == pytest.approx(20.0)
    assert b.input_mean == pytest.approx(100.0) and b.input_std == pytest.approx(50.0)
    assert a.mean_call_s == pytest.approx(8 / 5) and b.mean_call_s == pytest.approx(1.5)
    # latencies 4 and 3; LLM calls per request 3 and 4
    assert s.latency_mean_s == pytest.approx(3.5) and s.latency_p50_s == pytest.approx(3.5)
    assert s.latency_p90_s == pytest.approx(3.9) and s.latency_p99_s == pytest.approx(3.99)
    assert s.latency_cv == pytest.approx(0.5 / 3.5)
    assert s.calls_per_request_cv == pytest.approx(0.5 / 3.5)
    assert s.tool_time_mean_s == 0 and s.tool_critical_s == 0 and s.llm_overlap == 0
    assert a.classes == (CallClass("A", None, 2.5, 200.0, a.input_std, 20.0, a.output_std, 0.0),)


def test_half_sample_cv_by_hand():
    """Two requests, half-samples of one request each: the share is x or y with frequency q."""
    s = workflow_stats(validate_calls(CHAIN_AND_FANOUT), "w", bootstrap=4000, seed=3)
    for m, (x, y) in {"A": (1 / 2, 6 / 7), "B": (1 / 2, 1 / 7)}.items():
        # two-point distribution, q = 1/2 in expectation: CV = (|x - y|/2) / ((x + y)/2)
        assert s.llms[m].time_share_cv_halves == pytest.approx(abs(x - y) / (x + y), rel=0.03)
    same = [replace(c, request_id=f"{c.request_id}{k}") for k in range(3)
            for c in CHAIN_AND_FANOUT if c.request_id == "r1"]
    t = workflow_stats(validate_calls(same), "w")
    assert t.llms["A"].time_share_cv_halves == pytest.approx(0.0, abs=1e-12)
    assert t.llms["A"].time_share_cv_requests == pytest.approx(0.0, abs=1e-12)


def test_tool_on_the_critical_path():
    calls = [
        _llm("r", "a", 0, 1, "A"),
        _tool("r", "search", 1, 5, "web", ["a"]),
        _llm("r", "a2", 1, 2, "A", ["a"]),
        _tool("r", "calc", 2, 3, "python", ["a2"]),  # a side branch, off the critical path
        _llm("r", "b", 5, 6, "B", ["search"]),
    ]
    s = workflow_stats(validate_calls(calls), "w")
    assert [c.call_id for c in critical_path(calls)] == ["b", "search", "a"]
    assert s.tool_time_mean_s == pytest.approx(5.0)
    assert s.tool_critical_s == pytest.approx(4.0)
    assert s.llms["A"].n == 2 and s.llms["A"].critical_calls == 1
    assert s.llms["B"].critical_calls == 1
    # refined latency: critical calls x call time + tool time on the path = 1 + 1 + 4 = span
    assert s.latency_mean_s == pytest.approx(6.0)
    # tools are not LLM busy time: A 2 s, B 1 s
    assert s.llms["A"].time_share == pytest.approx(2 / 3)
    # A's two calls are serial (0-1, 1-2): p = 1
    assert s.llms["A"].p == pytest.approx(1.0)


def test_overlap_of_different_llms():
    calls = [
        _llm("r", "a", 0, 4, "A"),
        _llm("r", "a2", 1, 3, "A"),  # A with A does not count as overlap
        _llm("r", "b", 2, 6, "B"),
    ]
    s = workflow_stats(validate_calls(calls), "w")
    # LLM busy [0, 6] = 6 s; two different LLMs at once [2, 4] = 2 s
    assert s.llm_overlap == pytest.approx(1 / 3)
    assert s.llms["A"].p == pytest.approx(6 / 4)
    # no parents: the path is the call that ends last alone
    assert s.llms["B"].critical_calls == 1 and s.llms["A"].critical_calls == 0
    # averaged over requests: a second request without overlap halves it
    more = [*calls, _llm("r2", "a", 0, 1, "A"), _llm("r2", "b", 1, 2, "B", ["a"])]
    assert workflow_stats(validate_calls(more), "w").llm_overlap == pytest.approx(1 / 6)


def test_roles_become_call_classes():
    calls = [
        _llm("r", "p", 0, 1, "M", role="planner", input_tokens=1000, output_tokens=100,
             prefix_tokens=800),
        _llm("r", "c1", 1, 2, "M", ["p"], role="coder", input_tokens=200, output_tokens=400),
        _llm("r", "c2", 2, 3, "M", ["c1"], role="coder", input_tokens=400, output_tokens=600,
             prefix_tokens=100),
        _llm("r2", "p", 0, 1, "M", role="planner", input_tokens=1000, output_tokens=100,
             prefix_tokens=800),
    ]
    m = workflow_stats(validate_calls(calls), "w").llms["M"]
    coder, planner = m.classes
    assert (coder.role, coder.n, coder.input_mean, coder.input_std) == ("coder", 1.0, 300.0, 100.0)
    assert (coder.output_mean, coder.prefix_mean) == (500.0, 50.0)
    assert (planner.role, planner.n, planner.input_std, planner.prefix_mean) == (
        "planner", 1.0, 0.0, 800.0)
    assert m.n == 2.0


def test_critical_path_ties_and_order():
    calls = [_llm("r", "z", 0, 1, "A"), _llm("r", "y", 0, 1, "A"),
             _llm("r", "x", 1, 2, "B", ["z", "y"]), _llm("r", "w", 1, 2, "B", ["z"])]
    # last end tied between x and w -> 'w'; its only parent 'z'
    assert [c.call_id for c in critical_path(calls)] == ["w", "z"]
    assert critical_path(calls[::-1]) == critical_path(calls)
    assert critical_path([]) == ()


def test_errors_and_table():
    trace = validate_calls(CHAIN_AND_FANOUT)
    with pytest.raises(InputError, match="workflow"):
        workflow_stats(trace, "nope")
    with pytest.raises(InputError, match="bootstrap"):
        workflow_stats(trace, "w", bootstrap=-1)
    dangling = Trace((_llm("r", "a", 0, 1, "A", ["ghost"]),))
    with pytest.raises(InputError, match="ghost"):
        workflow_stats(dangling, "w")
    stats = trace_stats(trace)
    assert list(stats) == ["w"] and isinstance(stats["w"], WorkflowStats)
    rows = stats_table(stats)
    assert [r["llm"] for r in rows] == ["A", "B"]
    assert set(rows[0]) == {"workflow", "llm", "n", "p", "rounds", "critical_calls", "input_mean",
                            "output_mean", "time_share", "share_cv_requests", "share_cv_halves"}
    assert stats_table(stats["w"]) == rows
    d = json.loads(json.dumps(stats_to_dict(stats)))
    assert d["w"]["llms"]["A"]["n"] == 2.5 and d["w"]["llms"]["A"]["classes"][0]["role"] is None
    assert stats_to_dict(stats["w"]) == stats_to_dict(stats)["w"]
    assert workflow_stats(trace, "w", bootstrap=0).llms["A"].time_share_cv_halves == 0


def test_workflows_are_independent():
    other = [replace(c, workflow="v", llm="C") for c in CHAIN_AND_FANOUT]
    both = trace_stats(validate_calls([*CHAIN_AND_FANOUT, *other]), seed=5)
    alone = workflow_stats(validate_calls(CHAIN_AND_FANOUT), "w", seed=5)
    assert stats_to_dict(both["w"]) == stats_to_dict(alone)
    assert list(both["v"].llms) == ["C"] and both["v"].llms["C"].time_share == 1.0


# --------------------------------------------------------------------------- random DAG traces
NAMES = ("A", "B", "C", "tool:search")
Q = 0.25  # times are multiples of 1/4: exact in floating point


@st.composite
def dag_request(draw, wf: str, rid: str) -> list[CallRecord]:
    """Stages of serial calls or fan-outs; each call's parents are a subset of the last stage."""
    calls: list[CallRecord] = []
    t = draw(st.integers(0, 8)) * Q
    prev: list[CallRecord] = []
    for s in range(draw(st.integers(1, 5))):
        width = draw(st.integers(1, 4))
        stage = []
        for i in range(width):
            name = draw(st.sampled_from(NAMES))
            start = t + draw(st.integers(0, 4)) * Q
            end = start + draw(st.integers(0, 12)) * Q
            parents = tuple(c.call_id for c in prev if draw(st.booleans())) if prev else ()
            kw = {"tool": name[5:]} if name.startswith("tool:") else {"llm": name}
            stage.append(CallRecord(
                wf, rid, f"c{s}.{i}", start, end, parents=parents,
                input_tokens=draw(st.integers(0, 4096)), output_tokens=draw(st.integers(0, 512)),
                role=draw(st.sampled_from((None, "x", "y"))) if "llm" in kw else None, **kw))
        calls += stage
        prev = stage
        t = max(c.end_s for c in stage) + draw(st.integers(0, 2)) * Q
    return calls


@st.composite
def dag_trace(draw) -> list[CallRecord]:
    calls = []
    for r in range(draw(st.integers(1, 5))):
        calls += draw(dag_request("w", f"r{r}"))
    if not any(c.llm for c in calls):
        calls.append(_llm("r0", "extra", 0, 1, "A"))
    return calls


def _grid_oracle(calls: list[CallRecord], llm: str) -> tuple[float, float, int]:
    """Union measure, summed durations and max concurrency of ``llm``'s calls on a fine grid."""
    mine = [c for c in calls if c.llm == llm]
    if not mine:
        return 0.0, 0.0, 0
    hi = max(c.end_s for c in mine)
    mids = np.arange(0, hi, Q / 2) + Q / 4  # segment midpoints of the 1/8 grid
    conc = sum(((c.start_s < mids) & (mids < c.end_s)).astype(int) for c in mine)
    return (float((conc > 0).sum() * Q / 2), sum(c.duration_s for c in mine),
            int(conc.max(initial=0)))


def _flat(d, prefix=""):
    if isinstance(d, dict):
        return {k: v for key, val in d.items() for k, v in _flat(val, f"{prefix}.{key}").items()}
    if isinstance(d, list):
        return {k: v for i, val in enumerate(d) for k, v in _flat(val, f"{prefix}[{i}]").items()}
    return {prefix: d}


def _close(a: dict, b: dict) -> None:
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        if isinstance(fa[k], float):
            assert fa[k] == pytest.approx(fb[k], rel=1e-9, abs=1e-9), k
        else:
            assert fa[k] == fb[k], k


@settings(max_examples=80, deadline=None)
@given(dag_trace())
def test_properties_of_random_dags(calls):
    trace = validate_calls(calls)
    s = workflow_stats(trace, "w", bootstrap=20)
    reqs = {}
    for c in calls:
        reqs.setdefault(c.request_id, []).append(c)
    assert math.isclose(sum(m.time_share for m in s.llms.values()), 1.0, rel_tol=1e-12)
    assert 0 <= s.llm_overlap <= 1 + 1e-12
    assert s.tool_critical_s <= s.tool_time_mean_s + 1e-9
    for m, ls in s.llms.items():
        unions, durs, conc = zip(*(_grid_oracle(r, m) for r in reqs.values()), strict=True)
        assert 1 - 1e-12 <= ls.p <= max(1, *conc) + 1e-9
        if sum(unions) > 0:
            assert ls.p == pytest.approx(max(1.0, sum(durs) / sum(unions)), rel=1e-9)
        assert ls.rounds <= ls.n + 1e-12
        assert ls.critical_calls <= ls.n + 1e-12
        assert ls.n == pytest.approx(sum(c.n for c in ls.classes))
        assert ls.time_share_cv_requests >= 0 and ls.time_share_cv_halves >= 0


@settings(max_examples=40, deadline=None)
@given(dag_trace(), st.randoms(use_true_random=False),
       st.lists(st.integers(-4, 400), min_size=5, max_size=5))
def test_invariant_to_record_order_and_time_shifts(calls, rnd: random.Random, shifts):
    base = stats_to_dict(workflow_stats(validate_calls(calls), "w", bootstrap=20, seed=1))
    shuffled = list(calls)
    rnd.shuffle(shuffled)
    assert stats_to_dict(workflow_stats(validate_calls(shuffled), "w", bootstrap=20, seed=1)) == base
    # shift every request by its own constant (keeping times >= 0): reorders requests in time too
    offset = {f"r{i}": shifts[i] * Q - min(c.start_s for c in calls if c.request_id == f"r{i}")
              for i in range(5) if any(c.request_id == f"r{i}" for c in calls)}
    moved = [replace(c, start_s=c.start_s + offset[c.request_id] + 8,
                     end_s=c.end_s + offset[c.request_id] + 8) for c in calls]
    _close(stats_to_dict(workflow_stats(validate_calls(moved), "w", bootstrap=20, seed=1)), base)


@settings(max_examples=20, deadline=None)
@given(dag_trace(), st.integers(0, 2**32 - 1))
def test_bootstrap_is_deterministic_per_seed(calls, seed):
    trace = validate_calls(calls)
    a = workflow_stats(trace, "w", seed=seed, bootstrap=30)
    b = workflow_stats(trace, "w", seed=seed, bootstrap=30)
    assert stats_to_dict(a) == stats_to_dict(b)
