"""Tail latency: per-request critical paths (stats), predicted percentiles (tails) against brute
force and closed forms, and percentile bounds in the MILP against exhaustive enumeration."""

from __future__ import annotations

import dataclasses
import itertools
import math
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_opt.planning.baselines import UserAllocation
from scepsy_opt.planning.candidates import fits_budget, generate_candidates
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.milp import MILPOptimiser
from scepsy_opt.planning.optimisers import optimiser
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.prediction.tails import (
    floor_cut,
    latency_quantiles,
    linearise,
    recorded_latencies,
    request_latencies,
)
from scepsy_opt.stats import RequestPaths, stats_to_dict, workflow_stats
from scepsy_opt.traces import CallRecord, validate_calls
from scepsy_profile.roofline import roofline_model

REL = 1e-9
FAST = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def _llm(req, cid, start, end, llm, parents=(), wf="w"):
    return CallRecord(wf, req, cid, float(start), float(end), llm=llm, parents=tuple(parents),
                      input_tokens=10, output_tokens=5)


def _tool(req, cid, start, end, parents=(), wf="w"):
    return CallRecord(wf, req, cid, float(start), float(end), tool="t", parents=tuple(parents))


# r1: serial chain A -> B -> A; r2: fan-out of three concurrent A calls, then B.
CHAIN_AND_FANOUT = [
    _llm("r1", "a1", 0, 1, "A"), _llm("r1", "b1", 1, 3, "B", ["a1"]),
    _llm("r1", "a2", 3, 4, "A", ["b1"]),
    _llm("r2", "a1", 0, 2, "A"), _llm("r2", "a2", 0, 2, "A"), _llm("r2", "a3", 0, 2, "A"),
    _llm("r2", "b1", 2, 3, "B", ["a1", "a2", "a3"]),
]


def _brute_quantile(values: list[float], q: float) -> float:
    """numpy's 'linear' percentile by hand: position (n − 1)·q/100 in the sorted values."""
    s = sorted(values)
    h = (len(s) - 1) * q / 100.0
    i = math.floor(h)
    if i + 1 >= len(s):
        return s[-1]
    return s[i] + (h - i) * (s[i + 1] - s[i])


def _paths(draw_w: np.ndarray, tool: np.ndarray) -> RequestPaths:
    return RequestPaths(tuple(f"m{j}" for j in range(draw_w.shape[1])), draw_w, tool)


paths_st = st.integers(1, 40).flatmap(lambda r: st.integers(1, 4).flatmap(lambda m: st.tuples(
    st.lists(st.floats(0, 50), min_size=r * m, max_size=r * m),
    st.lists(st.floats(0, 10), min_size=r, max_size=r),
    st.lists(st.floats(0, 5), min_size=m, max_size=m),
).map(lambda t: (_paths(np.array(t[0]).reshape(r, m), np.array(t[1])),
                 {f"m{j}": u for j, u in enumerate(t[2])}))))


# --------------------------------------------------------------------------- stats: the paths
def test_paths_by_hand():
    s = workflow_stats(validate_calls(CHAIN_AND_FANOUT), "w")
    # mean calls: A 8 s / 5 calls = 1.6 s, B 3 s / 2 calls = 1.5 s; critical paths
    # r1: a1 (1 s), b1 (2 s), a2 (1 s); r2: a1 (2 s, the tie of a1..a3), b1 (1 s)
    p = s.paths
    assert p.llms == ("A", "B") and p.requests == 2
    np.testing.assert_allclose(p.weights, [[2 / 1.6, 2 / 1.5], [2 / 1.6, 1 / 1.5]], rtol=REL)
    np.testing.assert_allclose(p.tool_s, [0.0, 0.0])
    # their means are the predictor's weights critical_s / mean_call_s
    for j, m in enumerate(p.llms):
        assert p.weights[:, j].mean() == pytest.approx(
            s.llms[m].critical_s / s.llms[m].mean_call_s, rel=REL)


def test_paths_tool_time_and_recorded_quantiles():
    """On serial chains at the recorded unit latencies (each LLM's mean call) every request's
    predicted latency is its recorded span when calls of one LLM last alike."""
    calls = []
    for r in range(7):
        t = 0.0
        prev: list[str] = []
        for k in range(r + 1):
            calls.append(_llm(f"r{r}", f"a{k}", t, t + 2.0, "A", prev))
            prev, t = [f"a{k}"], t + 2.0
        calls.append(_tool(f"r{r}", "t", t, t + 0.5 * r, prev))
        calls.append(_llm(f"r{r}", "b", t + 0.5 * r, t + 0.5 * r + 1.0, "B", ["t"]))
    s = workflow_stats(validate_calls(calls), "w")
    np.testing.assert_allclose(s.paths.tool_s, [0.5 * r for r in range(7)])
    assert s.paths.tool_s.mean() == pytest.approx(s.tool_critical_s, rel=REL)
    u = {m: s.llms[m].mean_call_s for m in s.llms}
    got = latency_quantiles(s.paths, u)
    assert got == pytest.approx((s.latency_p50_s, s.latency_p90_s, s.latency_p99_s), rel=REL)


def test_stats_equality_and_json_leave_paths_alone():
    tr = validate_calls(CHAIN_AND_FANOUT)
    a, b = workflow_stats(tr, "w"), workflow_stats(tr, "w")
    assert a == b and a.paths == b.paths
    other = dataclasses.replace(a, paths=RequestPaths(("A", "B"), np.zeros((2, 2)), np.zeros(2)))
    assert other != a
    assert "paths" not in stats_to_dict(a)
    with pytest.raises(ValueError):
        a.paths.weights[0, 0] = 1.0  # read-only


def test_stats_without_paths_get_the_mean_path():
    s = workflow_stats(validate_calls(CHAIN_AND_FANOUT), "w")
    fields = {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name != "paths"}
    bare = type(s)(**fields)
    assert bare.paths.requests == 1
    np.testing.assert_allclose(bare.paths.weights[0], s.paths.weights.mean(axis=0), rtol=REL)
    q = latency_quantiles(bare.paths, {"A": 1.0, "B": 3.0})
    assert q[0] == q[1] == q[2] == pytest.approx(2 / 1.6 + 3 * 1.5 / 1.5, rel=REL)


# --------------------------------------------------------------------------- quantiles
@FAST
@given(paths_st)
def test_quantiles_match_brute_force(case):
    paths, u = case
    ys = [sum(paths.weights[j, k] * u[m] for k, m in enumerate(paths.llms)) + paths.tool_s[j]
          for j in range(paths.requests)]
    got = latency_quantiles(paths, u, (0, 50, 90, 99, 100))
    want = [_brute_quantile(ys, q) for q in (0, 50, 90, 99, 100)]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_identical_requests_give_the_mean():
    calls = [c for r in range(5) for c in (
        _llm(f"r{r}", "a", 0, 1, "A"), _tool(f"r{r}", "t", 1, 1.5, ["a"]),
        _llm(f"r{r}", "b1", 1.5, 3.5, "B", ["t"]), _llm(f"r{r}", "b2", 1.5, 3.5, "B", ["t"]))]
    s = workflow_stats(validate_calls(calls), "w")
    u = {"A": 0.7, "B": 2.3}
    mean = sum(s.llms[m].critical_s / s.llms[m].mean_call_s * u[m] for m in u) + s.tool_critical_s
    p50, p90, p99 = latency_quantiles(s.paths, u)
    assert p50 == pytest.approx(mean, rel=REL) and p90 == pytest.approx(mean, rel=REL)
    assert p99 == pytest.approx(mean, rel=REL)
    assert mean == pytest.approx(0.7 + 2.3 + 0.5, rel=REL)


@FAST
@given(paths_st, st.integers(0, 3), st.floats(0, 10))
def test_quantiles_monotone_in_unit_latencies(case, which, more):
    paths, u = case
    m = paths.llms[which % len(paths.llms)]
    up = dict(u, **{m: u[m] + more})
    lo, hi = latency_quantiles(paths, u), latency_quantiles(paths, up)
    assert all(b >= a - 1e-9 * max(1.0, abs(a)) for a, b in zip(lo, hi, strict=True))


@FAST
@given(paths_st, st.sampled_from([10.0, 50.0, 90.0, 99.0]),
       st.lists(st.floats(0, 5), min_size=4, max_size=4))
def test_linearise_exact_at_its_point_and_floor_cut_valid_everywhere(case, q, other):
    paths, u = case
    a, b = linearise(paths, u, q)
    p = latency_quantiles(paths, u, (q,))[0]
    assert sum(a[m] * u[m] for m in paths.llms) + b == pytest.approx(p, rel=1e-9, abs=1e-9)
    # the floor cut taken at u bounds the percentile from below at any other u'
    fa, fb = floor_cut(paths, u, q)
    v = {m: other[j] for j, m in enumerate(paths.llms)}
    assert sum(fa[m] * v[m] for m in paths.llms) + fb <= (
        latency_quantiles(paths, v, (q,))[0] + 1e-9 * max(1.0, p))


def test_infinite_unit_latency_off_the_path_is_ignored():
    paths = _paths(np.array([[1.0, 0.0], [2.0, 0.0]]), np.zeros(2))
    assert request_latencies(paths, {"m0": 1.0, "m1": math.inf}).tolist() == [1.0, 2.0]
    assert latency_quantiles(paths, {"m0": 1.0}, (50,)) == (1.5,)  # m1 never on a path


@pytest.mark.parametrize("qs", [(), (-1,), (101,), (50, math.nan)])
def test_bad_percentiles(qs):
    paths = _paths(np.ones((2, 1)), np.zeros(2))
    with pytest.raises(InputError):
        latency_quantiles(paths, {"m0": 1.0}, qs)


def test_bad_unit_latencies():
    paths = _paths(np.ones((2, 1)), np.zeros(2))
    with pytest.raises(InputError):
        latency_quantiles(paths, {}, (50,))
    with pytest.raises(InputError):
        latency_quantiles(paths, {"m0": -1.0}, (50,))


# --------------------------------------------------------------------------- plan options
@pytest.mark.parametrize("bound", [(0, 1.0), (100, 1.0), (-5, 1.0), (90, 0.0), (90, -1.0),
                                   (90, math.inf), (math.nan, 1.0), (90,), "p90", None])
def test_bad_latency_bounds(bound):
    with pytest.raises(InputError):
        PlanOptions(latency_bounds={"w": bound})


def test_latency_bound_of_unknown_workflow():
    p = _problem()
    with pytest.raises(InputError):
        dataclasses.replace(p, options=dataclasses.replace(p.options,
                                                           latency_bounds={"nope": (90, 1.0)}))


def test_latency_bounds_normalised():
    o = PlanOptions(latency_bounds={"w": [90, 2]})
    assert o.latency_bounds["w"] == (90.0, 2.0)


# --------------------------------------------------------------------------- the MILP bound
ROOF = roofline_model()
TINY = PlanOptions(shares=(0.5, 1.0), tps=(1, 2))


@cache
def _problem() -> PlanningProblem:
    """One workflow over three LLMs whose per-request paths make the tail and the mean disagree:
    the first LLM's work is heavy-tailed (lognormal), the others' constant."""
    p = random_problem(3, 6, ROOF, seed=1, workflows=1, load=0.3, options=TINY)
    w = next(iter(p.targets))
    s = p.stats[w]
    llms = tuple(sorted(s.llms))
    rng = np.random.default_rng(3)
    weights = np.ones((200, len(llms)))
    weights[:, 0] = rng.lognormal(0.0, 1.5, 200)
    k = np.array([s.llms[m].critical_s / s.llms[m].mean_call_s for m in llms])
    weights = weights / weights.mean(axis=0) * k
    paths = RequestPaths(llms, weights, np.full(200, 0.1))
    return dataclasses.replace(p, stats={w: dataclasses.replace(s, paths=paths)})


def _oracle_percentile(p: PlanningProblem, w: str, choice, q: float) -> float:
    """The choice's percentile by brute force: each candidate's unit latency is its share of
    the workflow's mean latency over the LLM's mean critical-path weight."""
    s = p.stats[w]
    u = {m: dict(choice[m].workflow_latency_s)[w] / (s.llms[m].critical_s / s.llms[m].mean_call_s)
         for m in s.llms}
    paths = s.paths
    ys = [sum(paths.weights[j, k] * u[m] for k, m in enumerate(paths.llms)) + paths.tool_s[j]
          for j in range(paths.requests)]
    return _brute_quantile(ys, q)


@cache
def _enumerated() -> tuple[tuple[float, float], ...]:
    """(cost, p90) of every allocation of the candidates that fits the GPUs."""
    p = _problem()
    w = next(iter(p.targets))
    cset = generate_candidates(p)
    llms = sorted(cset.by_llm)
    out = []
    for combo in itertools.product(*(cset.by_llm[m] for m in llms)):
        choice = dict(zip(llms, combo, strict=True))
        if fits_budget(p, choice):
            out.append((math.fsum(c.cost for c in combo), _oracle_percentile(p, w, choice, 90)))
    assert len(out) > 20
    return tuple(sorted(out))


@pytest.mark.parametrize("where", [2.0, 1.0, 0.5, 0.1, 0.0, -0.01])
def test_bound_matches_exhaustive_enumeration(where):
    """Bounds from loose (above the unbounded optimum's p90) to below the least p90 reachable:
    the MILP returns the cheapest allocation whose p90 meets the bound, or infeasible."""
    p = _problem()
    w = next(iter(p.targets))
    combos = _enumerated()
    least = min(x for _, x in combos)
    free = combos[0][1]  # the unbounded optimum's p90 (above the least: the tail disagrees)
    assert free > least * (1 + 1e-6)
    bound = least + where * (free - least) if where >= 0 else least * (1 + where)
    plan = MILPOptimiser().solve(dataclasses.replace(
        p, options=dataclasses.replace(p.options, latency_bounds={w: (90, bound)})))
    ok = [c for c, x in combos if x <= bound * (1 + 1e-9)]
    rep = plan.stats["latency_bounds"][w]
    if not ok:
        assert plan.status == "infeasible" and plan.allocation is None
        assert plan.infeasible is not None and "p90" in plan.infeasible.detail
        assert plan.stats["latency_bounds_verified"] is False and rep["met"] is False
        return
    assert plan.status == "optimal" and plan.stats["latency_bounds_optimal"] is True
    assert plan.objective_s - p.constant_s == pytest.approx(ok[0], rel=1e-9)
    got = _oracle_percentile(p, w, plan.candidates, 90)
    assert got <= bound * (1 + 1e-9)
    assert rep["met"] is True and rep["predicted_s"] == pytest.approx(got, rel=1e-9)
    assert plan.stats["latency_bounds_verified"] is True


def test_bound_below_the_fastest_allocation_is_proven_infeasible():
    p = _problem()
    w = next(iter(p.targets))
    plan = MILPOptimiser().solve(dataclasses.replace(
        p, options=dataclasses.replace(p.options, latency_bounds={w: (99, 1e-3)})))
    assert plan.status == "infeasible"
    assert plan.stats["latency_bounds_proven_infeasible"] is True
    assert "fastest candidate" in plan.infeasible.detail


def test_max_throughput_meets_the_percentile_bound():
    p = _problem()
    w = next(iter(p.targets))
    combos = _enumerated()
    bound = (combos[0][1] + min(x for _, x in combos)) / 2
    opts = dataclasses.replace(p.options, objective="max-throughput")
    free = MILPOptimiser().solve(dataclasses.replace(p, options=opts))
    bounded = MILPOptimiser().solve(dataclasses.replace(
        p, options=dataclasses.replace(opts, latency_bounds={w: (90, bound)})))
    assert bounded.feasible and 0 < bounded.scale <= free.scale * (1 + 1e-9)
    assert bounded.stats["latency_bounds"][w]["predicted_s"] <= bound * (1 + 1e-9)


def test_baselines_are_checked_against_the_bound():
    """The baselines know nothing of percentile bounds: the registry checks their answers."""
    p = _problem()
    w = next(iter(p.targets))
    free = optimiser("independent").solve(p)
    assert free.feasible
    got = free.stats.get("latency_bounds")
    assert got is None  # no bounds: nothing reported

    def bounded(b: float) -> PlanningProblem:
        return dataclasses.replace(p, options=dataclasses.replace(p.options,
                                                                  latency_bounds={w: (90, b)}))

    loose = optimiser("independent").solve(bounded(1e6))
    assert loose.feasible and loose.stats["latency_bounds"][w]["met"] is True
    p90 = loose.stats["latency_bounds"][w]["predicted_s"]
    assert p90 == pytest.approx(_oracle_percentile(p, w, loose.candidates, 90), rel=1e-9)
    tight = optimiser("independent").solve(bounded(p90 * 0.999))
    assert tight.status == "infeasible" and tight.allocation is None
    assert "p90" in tight.infeasible.detail and tight.stats["latency_bounds_verified"] is False
    user = optimiser("user")
    assert isinstance(user, UserAllocation)
    user.allocation = loose.allocation
    kept = user.solve(bounded(p90 * 0.999))
    assert kept.allocation == loose.allocation
    assert kept.stats["latency_bounds"][w]["met"] is False


def test_a_saturated_llm_makes_the_requests_through_it_infinite():
    """An infinite unit latency (a saturated LLM) makes every request with work there infinite;
    the percentiles are inf from the first rank that needs one, finite below it."""
    paths = _paths(np.array([[1.0, 0.0], [2.0, 0.0], [1.0, 1.0], [1.0, 2.0]]), np.zeros(4))
    u = {"m0": 1.0, "m1": math.inf}
    assert request_latencies(paths, u).tolist() == [1.0, 2.0, math.inf, math.inf]
    p0, p25, p50, p99 = latency_quantiles(paths, u, (0, 25, 50, 99))
    assert (p0, p50, p99) == (1.0, math.inf, math.inf)
    assert p25 == pytest.approx(1.75)  # rank 0.75 between 1 and 2
    assert latency_quantiles(paths, {"m0": math.inf, "m1": 1.0}, (50,)) == (math.inf,)


# ------------------------------------------------------------------ recorded arrivals


@given(st.integers(1, 6), st.integers(1, 3), st.data())
@settings(max_examples=60, deadline=None)
def test_recorded_latencies_add_each_llms_wait_once_per_mean_call_on_the_path(r, m, data):
    """Oracle, by hand: arrival k replays request ``picks[k]`` and waits ``waits[llm][k]``
    once per mean call of that LLM on its path; no waits: the requests' own latencies."""
    llms = tuple(f"m{j}" for j in range(m))
    weights = np.array(data.draw(st.lists(st.lists(st.floats(0, 4), min_size=m, max_size=m),
                                          min_size=r, max_size=r)))
    tools = np.array(data.draw(st.lists(st.floats(0, 2), min_size=r, max_size=r)))
    paths = RequestPaths(llms, weights, tools)
    unit = {x: data.draw(st.floats(0.01, 3)) for x in llms}
    n = data.draw(st.integers(1, 12))
    picks = np.array(data.draw(st.lists(st.integers(0, r - 1), min_size=n, max_size=n)))
    waits = {x: np.array(data.draw(st.lists(st.floats(0, 5), min_size=n, max_size=n)))
             for x in llms}
    got = recorded_latencies(paths, unit, picks, waits)
    for k in range(n):
        j = picks[k]
        want = tools[j] + sum(weights[j, i] * (unit[x] + waits[x][k])
                              for i, x in enumerate(llms))
        assert got[k] == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert np.array_equal(recorded_latencies(paths, unit, picks, {}),
                          request_latencies(paths, unit)[picks])


def _arrivals_file(path, times):
    path.write_text("".join(f"{t:.6f}\n" for t in times))
    return str(path)


def test_predicted_percentiles_of_recorded_arrivals_grow_with_their_bursts(tmp_path):
    """The same count over the same span: evenly spread, the percentiles are the steady
    state's (a backlog the batch drains within a call's latency is no wait; the requests
    replayed are drawn, so up to the draw); all in one burst, they grow, and the mean with
    them; only the latency figures move."""
    from scepsy.api import run_predict
    from scepsy.evaluation import PredictRequest, request_of, split_keywords

    wf = "datasets/workflows/rag.yaml"
    alloc = "datasets/allocations/rag-8gpu.yaml"

    def run(**kw):
        return run_predict(request_of(PredictRequest, split_keywords(
            wf, alloc, kw.pop("rate", None), dict(trace_requests=200, **kw))))
    steady = run(rate=5.0).workflows["rag"]
    n, span = 2000, 400.0
    even = run(arrivals=_arrivals_file(tmp_path / "even.txt",
                                       np.linspace(0, span, n))).workflows["rag"]
    burst = run(arrivals=_arrivals_file(tmp_path / "burst.txt",
                                        [0.0] * (n - 1) + [span])).workflows["rag"]
    assert even.rate == pytest.approx(steady.rate, rel=1e-9)
    assert even.p90_latency_s == pytest.approx(steady.p90_latency_s, rel=0.05)
    assert even.mean_latency_s == pytest.approx(steady.mean_latency_s, rel=1e-9)
    assert burst.p90_latency_s > 2 * even.p90_latency_s
    assert burst.mean_latency_s > even.mean_latency_s
    assert burst.max_throughput == even.max_throughput
    with pytest.raises(InputError, match="rate"):
        run(rate=5.0, arrivals=_arrivals_file(tmp_path / "x.txt", [0.0, 1.0]))
