"""The Aggregate LLM Pipeline predictor: closed forms on hand-built traces, monotonicity, errors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.prediction.pipeline import (
    LLMDemand,
    instance_curve,
    llm_demand,
    predict,
    station_latencies,
    station_latency,
)
from scepsy_opt.stats import workflow_stats
from scepsy_opt.traces import CallRecord, validate_calls
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import serving_curve

ROOF = roofline_model()
GPU = "A100-80GB"
MODELS = {"a": "qwen2.5-7b", "b": "qwen2.5-1.5b"}


def call(req, cid, llm=None, tool=None, start=0.0, end=1.0, parents=(), i=512, o=64, wf="w", role=None):
    return CallRecord(workflow=wf, request_id=req, call_id=cid, start_s=start, end_s=end, llm=llm,
                      tool=tool, role=role, parents=tuple(parents), input_tokens=i if llm else 0,
                      output_tokens=o if llm else 0)


def serial_trace(wf="w"):
    """Each request: a -> b -> a, strictly serial."""
    calls = []
    for r in range(4):
        q = f"r{r}"
        calls += [call(q, "c0", "a", start=0, end=1, wf=wf), call(q, "c1", "b", start=1, end=2, parents=["c0"], wf=wf),
                  call(q, "c2", "a", start=2, end=3, parents=["c1"], wf=wf)]
    return validate_calls(calls)


def parallel_trace():
    """Each request: a and b run concurrently, then a tool waits for both."""
    calls = []
    for r in range(4):
        q = f"r{r}"
        calls += [call(q, "c0", "a", start=0, end=2), call(q, "c1", "b", start=0, end=1),
                  call(q, "t", tool="search", start=2, end=2.5, parents=["c0", "c1"])]
    return validate_calls(calls)


ALLOC = Allocation({"a": Instance(GPU, 1, 0.5, 2), "b": Instance(GPU, 1, 0.3, 1)})


def exact_station(curve, critical_rate: float, group: float, replicas: int) -> float:
    """The request-level station summed state by state (the oracle of ``station_latency``):
    ``π(N)/π(N−1) = (Λ·p/r) / λ(min(N·p/r, B_max))``, mean call latency ``E[N]/Λ``."""
    x = critical_rate * group / replicas
    pi, total, mean_n, n = 1.0, 1.0, 0.0, 0
    while True:
        n += 1
        pi *= x / curve.rate_at_batch(min(n * group / replicas, curve.max_batch))
        total += pi
        mean_n += n * pi
        if pi > 1e100:  # rescale: only ratios matter
            pi, total, mean_n = pi / 1e100, total / 1e100, mean_n / 1e100
        if n * group / replicas >= curve.max_batch and pi < 1e-18 * total:
            return mean_n / total / critical_rate


def test_single_llm_matches_the_serving_curve_closed_form():
    calls = [call(f"r{r}", f"c{k}", "a", start=k, end=k + 1, parents=[f"c{k - 1}"] if k else [])
             for r in range(3) for k in range(2)]
    stats = {"w": workflow_stats(validate_calls(calls), "w")}
    alloc = Allocation({"a": Instance(GPU, 1, 0.5, 3)})
    curve = serving_curve(ROOF, MODELS["a"], GPU, 1, 0.5, 512, 64)
    want = {"paper": 2 * curve.latency_s(1.0 * 2 / 3),  # n·L(λn/r): calls one at a time
            # two serial calls per request: Λ = 2 critical-path calls/s, p = 1
            "critical-path": 2 * exact_station(curve, 2.0, 1.0, 3)}
    for form in ("paper", "critical-path"):
        pred = predict(stats, MODELS, alloc, ROOF, {"w": 1.0}, form=form)
        wp = pred.workflows["w"]
        assert wp.max_throughput == pytest.approx(3 * curve.mu / 2, rel=1e-12)  # r·μ/n, n = 2
        assert wp.bottleneck == "a"
        assert wp.mean_latency_s == pytest.approx(want[form], rel=1e-9)


def _demand(rate: float, group: float, critical_rate: float) -> LLMDemand:
    return LLMDemand("a", MODELS["a"], rate, 512.0, 64.0, group, ((rate, 512.0, 64.0),),
                     (("w", critical_rate / max(rate, 1e-300), 512.0, 64.0),), critical_rate)


@settings(max_examples=60, deadline=None)
@given(share=st.sampled_from([0.3, 0.5, 1.0]), replicas=st.integers(1, 12),
       group=st.sampled_from([1.0, 2.5, 4.0, 8.0]), load=st.floats(0.02, 0.97),
       slowest=st.floats(1.0, 1.6))
def test_station_matches_the_state_by_state_chain(share, replicas, group, load, slowest):
    """The windowed, blocked sum equals the chain summed state by state (to 0.2%: windows wider
    than STATION_NODES states are summed in blocks by the midpoint rule)."""
    curve = serving_curve(ROOF, MODELS["a"], GPU, 1, share, 512, 64, prefill_batch=group)
    rate = load * curve.mu * replicas / slowest  # calls/s; Λ·p = slowest · rate
    crit = slowest * rate / group
    got = float(station_latency(curve, _demand(rate, group, crit), [replicas])[0])
    assert got == pytest.approx(exact_station(curve, crit, group, replicas), rel=2e-3)


def test_station_answers_do_not_depend_on_their_batch_mates():
    """The optimiser prices (curve, replicas) pairs in varying batches: every answer must be a
    function of its own pair only (plans are compared to 1e-9)."""
    curves = [serving_curve(ROOF, MODELS["a"], GPU, 1, sh, 512, 64, prefill_batch=4.0)
              for sh in (0.3, 0.5, 1.0)]
    rate = 0.6 * curves[0].mu * 3
    dem = _demand(rate, 4.0, rate / 4.0)
    reps = [np.array([1.0, 2, 3, 5, 8, 40, 300, math.inf]), np.array([4.0, 9]), np.array([2.0])]
    together = station_latencies(dem, curves, reps)
    for c, r, got in zip(curves, reps, together, strict=True):
        alone = [float(station_latency(c, dem, [x])[0]) for x in r]
        # the same formula on arrays of other lengths: SIMD and scalar loops may differ in the
        # last bit on some CPUs, so equal within 1e-12 relative (the latency-model contract)
        assert got == pytest.approx(alone, rel=1e-12, abs=0.0)


def test_station_blocks_of_states_on_a_wide_chain():
    """Hundreds of replicas of one-call requests: thousands of states, summed in blocks."""
    curve = serving_curve(ROOF, MODELS["b"], GPU, 1, 1.0, 512, 64)
    for load in (0.3, 0.7, 0.95):
        rate = load * curve.mu * 300
        got = float(station_latency(curve, _demand(rate, 1.0, rate), [300])[0])
        assert got == pytest.approx(exact_station(curve, rate, 1.0, 300), rel=1e-3)


@settings(max_examples=40, deadline=None)
@given(share=st.sampled_from([0.3, 0.5, 1.0]), group=st.sampled_from([1.0, 4.0]),
       load=st.floats(0.05, 0.9))
def test_station_latency_falls_with_replicas_to_the_zero_load_floor(share, group, load):
    curve = serving_curve(ROOF, MODELS["a"], GPU, 1, share, 512, 64, prefill_batch=group)
    rate = load * curve.mu
    lat = station_latency(curve, _demand(rate, group, rate / group),
                          np.array([1, 2, 3, 5, 8, 16, 64, 1024, math.inf], dtype=float))
    assert np.all(np.diff(lat) <= 1e-12 * lat[:-1])
    assert lat[-1] == curve.zero_load_latency_s
    assert lat[-2] == pytest.approx(curve.zero_load_latency_s, rel=1e-9)
    assert lat[0] > curve.zero_load_latency_s


@settings(max_examples=40, deadline=None)
@given(share=st.sampled_from([0.3, 0.5, 1.0]), replicas=st.integers(1, 6),
       group=st.sampled_from([1.0, 4.0]))
def test_station_latency_grows_with_load_and_diverges_at_saturation(share, replicas, group):
    curve = serving_curve(ROOF, MODELS["a"], GPU, 1, share, 512, 64, prefill_batch=group)
    lats = [float(station_latency(curve, _demand(f * curve.mu * replicas, group,
                                                 f * curve.mu * replicas / group), [replicas])[0])
            for f in (1e-6, 0.2, 0.5, 0.8, 0.95, 0.999, 1.0)]
    assert all(a <= b * (1 + 1e-9) for a, b in itertools.pairwise(lats))
    assert lats[-1] == math.inf and lats[-2] > 10 * lats[1]
    # at vanishing load one request's group alone on the replicas it reaches
    b = min(group / replicas, curve.max_batch)
    lone = curve.service_ms[0] / 1e3 if b <= 1 else b / curve.rate_at_batch(b)
    assert lats[0] == pytest.approx(lone, rel=1e-3)


def test_station_prices_bursts_above_the_call_level_queue():
    """Four-call requests at a quarter of saturation wait longer than Poisson calls would: the
    request-level chain counts the bursts the M/M/c call queue cannot see."""
    curve = serving_curve(ROOF, MODELS["a"], GPU, 1, 0.5, 512, 64, prefill_batch=4.0)
    rate = 0.25 * curve.mu
    station = float(station_latency(curve, _demand(rate, 4.0, rate / 4.0), [1])[0])
    assert station > curve.latency_s(rate) > curve.zero_load_latency_s


def test_serial_chain_both_forms_agree_at_vanishing_load():
    """A serial chain has no concurrency and no tools: the forms differ only in queueing."""
    stats = {"w": workflow_stats(serial_trace(), "w")}
    paper = predict(stats, MODELS, ALLOC, ROOF, {"w": 1e-7}, form="paper").workflows["w"]
    crit = predict(stats, MODELS, ALLOC, ROOF, {"w": 1e-7}, form="critical-path").workflows["w"]
    assert crit.mean_latency_s == pytest.approx(paper.mean_latency_s, rel=1e-5)
    assert crit.max_throughput == paper.max_throughput


def test_concurrency_and_tools_are_counted_on_the_critical_path_only():
    stats = {"w": workflow_stats(parallel_trace(), "w")}
    pred = predict(stats, MODELS, ALLOC, ROOF, {"w": 0.5})
    paper = predict(stats, MODELS, ALLOC, ROOF, {"w": 0.5}, form="paper")
    la = pred.llms["a"].call_latency_s
    # critical path: the tool and the a call (a ends last among the tool's parents)
    assert pred.workflows["w"].mean_latency_s == pytest.approx(la + 0.5, rel=1e-9)
    # the paper's form: one call of each LLM in sequence, each at its call-level latency
    paper_calls = 0.0
    for m in ("a", "b"):
        dem = llm_demand(stats, MODELS, {"w": 0.5}, m)
        inst = ALLOC.llms[m]
        curve = instance_curve(dem, ROOF, inst.gpu, inst.tp, inst.share)
        paper_calls += curve.latency_s(dem.rate / inst.replicas)
    assert paper.workflows["w"].mean_latency_s == pytest.approx(paper_calls, rel=1e-9)


def test_shared_llm_sums_the_load_of_both_workflows():
    trace = validate_calls(list(serial_trace("w1").calls) + list(serial_trace("w2").calls))
    stats = {w: workflow_stats(trace, w) for w in ("w1", "w2")}
    both = predict(stats, MODELS, ALLOC, ROOF, {"w1": 0.3, "w2": 0.2})
    assert both.llms["a"].rate == pytest.approx(2 * 0.3 + 2 * 0.2)
    one = predict(stats, MODELS, ALLOC, ROOF, {"w1": 0.5, "w2": 0.0})
    assert one.llms["a"].rate == pytest.approx(both.llms["a"].rate)
    # the shared bottleneck caps both workflows in proportion to their rates
    t1, t2 = both.workflows["w1"].max_throughput, both.workflows["w2"].max_throughput
    assert t1 / t2 == pytest.approx(0.3 / 0.2)


def test_two_roles_of_one_llm_get_their_own_latency():
    calls = []
    for r in range(4):
        q = f"r{r}"
        calls += [call(q, "p", "a", start=0, end=1, i=4000, o=16, role="planner"),
                  call(q, "c", "a", start=1, end=3, parents=["p"], i=200, o=600, role="coder")]
    stats = {"w": workflow_stats(validate_calls(calls), "w")}
    alloc = Allocation({"a": Instance(GPU, 1, 1.0, 1)})
    pred = predict(stats, MODELS, alloc, ROOF, {"w": 1e-9})
    # at zero load each role costs its own prefill plus its own O - 1 decode steps
    # the mixture's time-average context of a running call, (E[I·O] + E[O²]/2) / E[O]: each
    # call holds I + O/2 on average over its O steps, weighted by those steps
    ctx = ((4000 * 16 + 200 * 600) / 2 + (16**2 + 600**2) / 4) / ((16 + 600) / 2)
    d = ROOF.decode_ms(MODELS["a"], GPU, 1, 1.0, 1, ctx)
    want = (ROOF.prefill_ms(MODELS["a"], GPU, 1, 1.0, 1, 4000) + 15 * d
            + ROOF.prefill_ms(MODELS["a"], GPU, 1, 1.0, 1, 200) + 599 * d) / 1e3
    assert pred.workflows["w"].mean_latency_s == pytest.approx(want, rel=1e-6)
    # the paper's form prices both calls at the mean lengths
    paper = predict(stats, MODELS, alloc, ROOF, {"w": 1e-9}, form="paper")
    mean_call = (ROOF.prefill_ms(MODELS["a"], GPU, 1, 1.0, 1, 2100) + 307 * d) / 1e3
    assert paper.workflows["w"].mean_latency_s == pytest.approx(2 * mean_call, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(share=st.sampled_from([0.3, 0.4, 0.5, 0.7, 1.0]), extra=st.sampled_from([0.1, 0.2, 0.3]),
       replicas=st.integers(1, 4), more=st.integers(1, 3))
def test_throughput_is_monotone_in_replicas_and_share(share, extra, replicas, more):
    stats = {"w": workflow_stats(serial_trace(), "w")}

    def t(a_share, a_rep):
        alloc = Allocation({"a": Instance(GPU, 1, a_share, a_rep), "b": Instance(GPU, 1, 1.0, 4)})
        return predict(stats, MODELS, alloc, ROOF, {"w": 0.1}).workflows["w"].max_throughput

    base = t(share, replicas)
    assert t(share, replicas + more) >= base
    assert t(min(1.0, share + extra), replicas) >= base * (1 - 1e-12)


def test_latency_grows_with_rate_and_is_infinite_past_saturation():
    stats = {"w": workflow_stats(serial_trace(), "w")}
    tmax = predict(stats, MODELS, ALLOC, ROOF, {"w": 0.1}).workflows["w"].max_throughput
    lat = [predict(stats, MODELS, ALLOC, ROOF, {"w": f * tmax}).workflows["w"].mean_latency_s
           for f in (0.1, 0.5, 0.9)]
    assert lat[0] <= lat[1] <= lat[2] < math.inf
    assert predict(stats, MODELS, ALLOC, ROOF, {"w": 1.01 * tmax}).workflows["w"].mean_latency_s == math.inf


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"rates": {"w": -1.0}}, "w"),
    ({"rates": {"zz": 1.0}}, "zz"),
    ({"rates": {"w": 0.0}}, "positive rate"),
    ({"allocation": Allocation({"a": Instance(GPU, 1, 0.5, 1)})}, "llms.b"),
    ({"models": {"a": "qwen2.5-7b"}}, "llms.b"),
    ({"form": "magic"}, "form"),
])
def test_bad_input_is_an_input_error(kwargs, field):
    args = {"stats": {"w": workflow_stats(serial_trace(), "w")}, "models": MODELS,
            "allocation": ALLOC, "latency": ROOF, "rates": {"w": 0.5}}
    form = kwargs.pop("form", "critical-path")
    args.update(kwargs)
    with pytest.raises(InputError, match=field):
        predict(**args, form=form)


def test_fan_out_prices_the_slowest_branch():
    """Three concurrent calls of one LLM lasting 1, 1 and 4 s: the request waits for the 4 s
    one, so the critical path holds 4 / mean(2) = 2 mean calls, not 1."""
    calls = []
    for r in range(3):
        q = f"r{r}"
        calls += [call(q, "x", "a", start=0, end=1), call(q, "y", "a", start=0, end=1),
                  call(q, "z", "a", start=0, end=4)]
    stats = {"w": workflow_stats(validate_calls(calls), "w")}
    assert stats["w"].llms["a"].critical_calls == 1
    assert stats["w"].llms["a"].critical_s == pytest.approx(4.0)
    alloc = Allocation({"a": Instance(GPU, 1, 1.0, 1)})
    pred = predict(stats, MODELS, alloc, ROOF, {"w": 0.01})
    assert pred.workflows["w"].mean_latency_s == pytest.approx(2 * pred.llms["a"].call_latency_s, rel=1e-9)
