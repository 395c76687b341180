"""The predictor's fidelity terms (issue 14): per-workflow maximum throughput, throughput and the
saturated flag, the engine's per-call delay, output-length moments, overloaded instances, and
closed-form references where the model is exact."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.cluster import uniform_cluster
from scepsy_opt.planning.candidates import generate_candidates, price, unoverloaded_replicas
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.optimisers import optimiser
from scepsy_opt.planning.plans import workflow_latencies
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.prediction.pipeline import (
    call_delay_s,
    curve_preemptions,
    instance_curve,
    llm_demand,
    min_replicas,
    predict,
)
from scepsy_opt.prediction.simulate import simulate
from scepsy_opt.stats import workflow_stats
from scepsy_opt.traces import CallRecord, validate_calls
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import MemoryPolicy

GPU = "A100-80GB"
ROOF = roofline_model()
MODELS = {"a": "qwen2.5-7b", "b": "qwen2.5-1.5b"}
REL = 1e-12


def reserve() -> MemoryPolicy:
    """Today's KV management (whole sequence reserved at admission), whatever the default."""
    if "kv_management" in MemoryPolicy.__dataclass_fields__:
        return MemoryPolicy(kv_management="reserve")  # type: ignore[call-arg]
    return MemoryPolicy()


def call(req, cid, llm=None, tool=None, start=0.0, end=1.0, parents=(), i=512, o=64, wf="w"):
    return CallRecord(workflow=wf, request_id=req, call_id=cid, start_s=start, end_s=end, llm=llm,
                      tool=tool, role=None, parents=tuple(parents), input_tokens=i if llm else 0,
                      output_tokens=o if llm else 0)


def serial_calls(wf="w", llms=("a", "b", "a"), requests=4):
    """Each request: the LLMs one after another (a -> b -> a by default)."""
    calls = []
    for r in range(requests):
        for k, m in enumerate(llms):
            calls.append(call(f"r{r}", f"c{k}", m, start=k, end=k + 1,
                              parents=[f"c{k - 1}"] if k else [], wf=wf))
    return calls


ALLOC = Allocation({"a": Instance(GPU, 1, 0.5, 2), "b": Instance(GPU, 1, 0.3, 1)})


class DelayedLatency:
    """``base`` plus a pure delay per LLM call (what ``with_overheads`` gives)."""

    def __init__(self, base, delay_s: float) -> None:
        self.base, self.call_delay_s = base, delay_s

    def prefill_ms(self, model, gpu, tp, share, batch, seq):
        return self.base.prefill_ms(model, gpu, tp, share, batch, seq)

    def decode_ms(self, model, gpu, tp, share, batch, ctx):
        return self.base.decode_ms(model, gpu, tp, share, batch, ctx)

    def covers(self, model, gpu, tp):
        return self.base.covers(model, gpu, tp)


# --------------------------------------------------------------------------- throughput


def two_workflows():
    """w1 calls only a (twice, serially), w2 only b: no LLM in common."""
    trace = validate_calls(serial_calls("w1", ("a", "a")) + serial_calls("w2", ("b",)))
    return {w: workflow_stats(trace, w) for w in ("w1", "w2")}


@pytest.mark.parametrize("rate2", [0.01, 1.0, 50.0, 1e4])
def test_workflows_on_disjoint_llms_are_independent(rate2):
    stats = two_workflows()
    alone = predict({"w1": stats["w1"]}, MODELS, ALLOC, ROOF, {"w1": 2.0}, policy=reserve())
    both = predict(stats, MODELS, ALLOC, ROOF, {"w1": 2.0, "w2": rate2}, policy=reserve())
    a, b = alone.workflows["w1"], both.workflows["w1"]
    assert b.max_throughput == a.max_throughput and b.bottleneck == a.bottleneck == "a"
    assert b.mean_latency_s == a.mean_latency_s and math.isfinite(b.mean_latency_s)
    assert b.throughput == 2.0 and not b.saturated
    # w2's own maximum: its rate times b's saturation factor, ``r·μ/λ`` (one call per request)
    ld = both.llms["b"]
    w2 = both.workflows["w2"]
    assert w2.bottleneck == "b"
    assert w2.max_throughput == pytest.approx(ld.replicas * ld.mu, rel=REL)
    assert w2.saturated == (rate2 >= w2.max_throughput)
    assert w2.throughput == pytest.approx(min(rate2, w2.max_throughput), rel=REL)


def test_workflows_sharing_an_llm_saturate_together():
    trace = validate_calls(serial_calls("w1", ("a", "b")) + serial_calls("w2", ("b",)))
    stats = {w: workflow_stats(trace, w) for w in ("w1", "w2")}
    pred = predict(stats, MODELS, ALLOC, ROOF, {"w1": 1.0, "w2": 3.0}, policy=reserve())
    ld = pred.llms["b"]
    scale = ld.replicas * ld.mu / ld.rate  # b carries 1 + 3 calls per unit of the rates
    b_first = pred.workflows["w2"]
    assert b_first.max_throughput == pytest.approx(3.0 * scale, rel=REL)
    w1 = pred.workflows["w1"]
    a = pred.llms["a"]
    expect = min(scale, a.replicas * a.mu / a.rate)
    assert w1.max_throughput == pytest.approx(1.0 * expect, rel=REL)


def test_throughput_is_the_rate_up_to_the_maximum_then_saturated():
    st = workflow_stats(validate_calls(serial_calls()), "w")
    top = predict({"w": st}, MODELS, ALLOC, ROOF, {"w": 1.0}).workflows["w"].max_throughput
    for frac in (0.1, 0.5, 0.99, 1.0, 1.5, 4.0):
        p = predict({"w": st}, MODELS, ALLOC, ROOF, {"w": frac * top}).workflows["w"]
        assert p.max_throughput == pytest.approx(top, rel=1e-9)
        assert p.throughput == pytest.approx(min(frac, 1.0) * top, rel=1e-9)
        assert p.saturated == (frac >= 1.0)
        assert math.isfinite(p.mean_latency_s) == (frac < 1.0)


# Today's figures (the predictor before issue 14) for the serial a -> b -> a workflow on ALLOC at
# 0.5 req/s, reserved KV: (max throughput, mean latency) per form.
TODAY = {"critical-path": (12.521617426246367, 2.6568167942700853),
         "paper": (12.521617426246367, 2.613649993960156)}


@pytest.mark.parametrize("form", sorted(TODAY))
def test_one_workflow_without_overheads_keeps_todays_figures(form):
    st = workflow_stats(validate_calls(serial_calls()), "w")
    p = predict({"w": st}, MODELS, ALLOC, ROOF, {"w": 0.5}, form=form, policy=reserve())
    w = p.workflows["w"]
    assert (w.max_throughput, w.mean_latency_s) == TODAY[form]
    assert w.bottleneck == "a" and w.throughput == 0.5 and not w.saturated


# --------------------------------------------------------------------------- call delay


@pytest.mark.parametrize("form", ["critical-path", "paper"])
@pytest.mark.parametrize("delay", [0.05, 0.4])
def test_call_delay_adds_k_delays_per_llm(form, delay):
    """a -> b -> a: two calls of a and one of b on the critical path, one at a time: 3 delays."""
    st = workflow_stats(validate_calls(serial_calls()), "w")
    slow = DelayedLatency(ROOF, delay)
    assert call_delay_s(slow) == delay and call_delay_s(ROOF) == 0.0
    base = predict({"w": st}, MODELS, ALLOC, ROOF, {"w": 0.5}, form=form, policy=reserve())
    more = predict({"w": st}, MODELS, ALLOC, slow, {"w": 0.5}, form=form, policy=reserve())
    b, m = base.workflows["w"], more.workflows["w"]
    assert m.mean_latency_s - b.mean_latency_s == pytest.approx(3 * delay, rel=1e-9)
    assert m.max_throughput == b.max_throughput  # a pure delay: the engine is not busy
    for llm in ("a", "b"):
        assert more.llms[llm].call_latency_s - base.llms[llm].call_latency_s == \
            pytest.approx(delay, rel=1e-9)
    if form == "critical-path" and math.isfinite(b.p90_latency_s):
        for q in ("p50_latency_s", "p90_latency_s", "p99_latency_s"):
            assert getattr(m, q) - getattr(b, q) == pytest.approx(3 * delay, rel=1e-9)


def test_candidates_price_the_call_delay_like_the_predictor():
    """`scepsy plan`'s objective equals `scepsy predict` on the plan, with a per-call delay."""
    p = random_problem(3, 4, DelayedLatency(ROOF, 0.25), seed=1,
                       options=PlanOptions(shares=(0.5, 1.0), tps=(1, 2)))
    plan = optimiser("milp").solve(p)
    assert plan.feasible
    lat = workflow_latencies(p, plan)
    assert plan.objective_s == pytest.approx(math.fsum(p.weight(w) * v for w, v in lat.items()),
                                             rel=1e-9)
    # each LLM's term is its no-delay term plus, per weighted critical-path call, the delay as
    # the calls of its groups wait for it in turn at a replica (front_delay_s)
    plain = dataclasses.replace(p, latency=ROOF)
    with_d, without = price(p, plan.allocation), price(plain, plan.allocation)
    assert any(p.demands[m].group > 1 for m in with_d)  # the instance has fan-outs
    for m, c in with_d.items():
        k = sum(p.weight(w) * k for w, k, _, _ in p.demands[m].terms)
        g = max(1.0, max(p.demands[m].group, 1.0) / plan.allocation.llms[m].replicas)
        assert c.latency_s - without[m].latency_s == pytest.approx(0.25 * k * (g + 1) / 2,
                                                                   rel=1e-9)


# --------------------------------------------------------------------------- length moments


def test_demand_carries_the_output_length_moments():
    rng = np.random.default_rng(3)
    outs = rng.integers(1, 400, size=60)
    ins = rng.integers(50, 900, size=60)
    calls = [call(f"r{r}", "c0", "a", i=int(ins[r]), o=int(outs[r])) for r in range(40)]
    calls += [call(f"r{r}", "c0", "a", i=int(ins[r]), o=int(outs[r]), wf="v")
              for r in range(40, 60)]
    trace = validate_calls(calls)
    stats = {w: workflow_stats(trace, w) for w in ("w", "v")}
    dem = llm_demand(stats, MODELS, {"w": 1.0, "v": 3.0}, "a")
    o_w, o_v, i_w, i_v = outs[:40], outs[40:], ins[:40], ins[40:]
    # call-rate-weighted mixtures: 1 call/s of w, 3 of v
    sq = (1 * (o_w.var() + o_w.mean() ** 2) + 3 * (o_v.var() + o_v.mean() ** 2)) / 4
    io = (1 * i_w.mean() * o_w.mean() + 3 * i_v.mean() * o_v.mean()) / 4
    assert dem.output_sq_mean == pytest.approx(sq, rel=1e-9)
    assert dem.io_mean == pytest.approx(io, rel=1e-9)
    assert dem.output_sq_mean >= dem.output_mean ** 2


# --------------------------------------------------------------------------- closed form


class PSLatency:
    """A processor-sharing engine: a prefill group of g calls takes ``c·g`` ms and a decode step
    of batch B takes ``e·B`` ms, so every batch serves ``1/(c + (O−1)·e)`` calls per ms: the
    station is an M/G/1-PS queue of mean work ``E[S] = c + (E[O]−1)·e``."""

    c, e = 4.0, 0.5

    def prefill_ms(self, model, gpu, tp, share, batch, seq):
        return self.c * np.asarray(batch, dtype=float) * np.ones(np.shape(share))

    def decode_ms(self, model, gpu, tp, share, batch, ctx):
        return self.e * np.asarray(batch, dtype=float) * np.ones(np.shape(share))

    def covers(self, model, gpu, tp):
        return True


@pytest.mark.parametrize("rho", [0.1, 0.3, 0.6, 0.9])
def test_one_llm_with_exponential_outputs_is_mg1_ps(rho):
    """Mean sojourn of M/G/1-PS: ``E[S]/(1 − ρ)``, whatever the distribution of the work
    (insensitivity): exponential output lengths give the figure of their mean."""
    rng = np.random.default_rng(7)
    outs = 1 + rng.exponential(80.0, size=300).astype(int)
    trace = validate_calls([call(f"r{r}", "c0", "b", i=256, o=int(outs[r]))
                            for r in range(len(outs))])
    st = workflow_stats(trace, "w")
    lat = PSLatency()
    work_s = (lat.c + (outs.mean() - 1.0) * lat.e) / 1e3
    alloc = Allocation({"b": Instance(GPU, 1, 1.0, 1)})
    pol = dataclasses.replace(reserve(), max_batch=32)
    p = predict({"w": st}, MODELS, alloc, lat, {"w": rho / work_s}, policy=pol)
    w = p.workflows["w"]
    assert w.max_throughput == pytest.approx(1.0 / work_s, rel=1e-9)
    assert w.mean_latency_s == pytest.approx(work_s / (1.0 - rho), rel=1e-9)


# --------------------------------------------------------------------------- overloaded


@dataclasses.dataclass(frozen=True)
class FakeCurve:
    """A curve overloaded above ``knee`` calls/s per replica (preemption grows with the rate)."""

    knee: float
    mu: float = 100.0
    feasible: bool = True

    def preemptions_per_call(self, rate):
        return max(0.0, rate / self.knee - 1.0)

    def overloaded(self, rate):
        return rate > self.knee


@pytest.mark.parametrize("rate,knee,start,limit", [
    (10.0, 3.0, 1, 100), (10.0, 3.0, 5, 100), (10.0, 20.0, 1, 100), (1000.0, 0.7, 1, 5000),
    (1000.0, 0.7, 1, 1000), (50.0, 1.0, 2, 64), (7.0, 7.0, 1, 10)])
def test_unoverloaded_replicas_is_the_fewest_that_are_not_overloaded(rate, knee, start, limit):
    curve = FakeCurve(knee)
    brute = next((r for r in range(start, limit + 1) if not curve.overloaded(rate / r)), limit + 1)
    assert unoverloaded_replicas(curve, rate, start, limit) == brute
    assert curve_preemptions(curve, rate / max(brute, 1))[1] == (brute > limit)


def test_candidates_exclude_overloaded_instances():
    """A 0.1 share whose KV cache holds about ten calls of 16 + 400 tokens (exponential
    outputs) preempts under load: 4 replicas carry the call rate, but only from 6 on are they
    predicted below the preemption threshold; no candidate is overloaded."""
    rng = np.random.default_rng(1)
    outs = 1 + rng.exponential(400.0, size=200).astype(int)
    trace = validate_calls([call(f"r{r}", "c0", "b", i=16, o=int(outs[r])) for r in range(200)])
    st = workflow_stats(trace, "w")
    p = PlanningProblem({"w": st}, MODELS, {"w": 5.0}, uniform_cluster(GPU, 8, 8), ROOF,
                        PlanOptions(shares=(0.1, 0.5), tps=(1,)),
                        policy=MemoryPolicy(reserve_fraction=0.5))
    dem = p.demands["b"]
    small = instance_curve(dem, ROOF, GPU, 1, 0.1, policy=p.policy)
    assert small.memory.kv_tokens < 12 * (16 + 400)
    r_cap = min_replicas(p.loads["b"], small.mu, p.options.max_utilisation)
    assert r_cap == 4 and small.overloaded(dem.rate / r_cap)
    cands = generate_candidates(p, prune=False).by_llm["b"]
    tiny = sorted(c.replicas for c in cands if c.share == 0.1)
    assert tiny[0] == 6 and not small.overloaded(dem.rate / 6) and small.overloaded(dem.rate / 5)
    for c in cands:
        curve = instance_curve(dem, ROOF, c.gpu, c.tp, c.share, policy=p.policy)
        assert not curve.overloaded(dem.rate / c.replicas)
    assert any(c.share == 0.5 and c.replicas == 1 for c in cands)  # an ample cache: no change


# --------------------------------------------------------------------------- prefill-only LLMs

PRM = {"p": "qwen2.5-math-prm-7b"}


def scoring_trace(group: int, inputs: np.ndarray):
    """Requests of ``group`` concurrent one-token calls (a reward model scoring a beam)."""
    return validate_calls([call(f"r{r}", f"c{j}", "p", i=int(inputs[r]), o=1)
                           for r in range(len(inputs)) for j in range(group)])


@pytest.mark.parametrize("cv", [0.0, 0.9])
def test_prefill_only_llm_is_a_gated_batch_queue(cv):
    """``L = S + V·(1 + 2ρ)/(1 + ρ)``, ``V = ρ·S·(1 + c²)/(2(1 − ρ))`` (Pollaczek-Khinchine),
    ``S`` the prefill of the ``max(1, p̄/r)`` calls of a group one replica gets (round robin),
    ``c²`` the inputs' squared coefficient of variation."""
    rng = np.random.default_rng(4)
    ins = (1000 * rng.lognormal(0.0, 0.8, 300)).astype(int) + 1 if cv else np.full(300, 1000)
    st = workflow_stats(scoring_trace(4, ins), "w")
    alloc = Allocation({"p": Instance(GPU, 1, 0.4, 2)})
    top = predict({"w": st}, PRM, alloc, ROOF, {"w": 1.0}, policy=reserve())
    for rho in (0.2, 0.5, 0.9):
        rate = rho * top.workflows["w"].max_throughput
        pred = predict({"w": st}, PRM, alloc, ROOF, {"w": rate}, policy=reserve())
        dem = llm_demand({"w": st}, PRM, {"w": rate}, "p")
        curve = instance_curve(dem, ROOF, GPU, 1, 0.4, policy=reserve())
        assert curve.prefill_batch == pytest.approx(4.0)  # four calls: two per replica
        s = float(ROOF.prefill_ms(PRM["p"], GPU, 1, 0.4, 2.0, curve.input_tokens)) / 1e3
        c2 = ins.var() / ins.mean() ** 2
        x = dem.rate / 2 / curve.mu
        v = x * s * (1 + c2) / (2 * (1 - x))
        assert x == pytest.approx(rho, rel=1e-9)
        assert pred.workflows["w"].mean_latency_s == pytest.approx(
            s + v * (1 + 2 * x) / (1 + x), rel=1e-9)


@pytest.mark.parametrize("rho", [0.5, 0.85])
def test_prefill_only_llm_agrees_with_the_simulator(rho):
    """Poisson requests of four equal scoring calls on one replica: the simulator prefills every
    queued call in one iteration, as the gated model assumes (the processor-sharing station
    predicted +22% and +36% here)."""
    st_trace = scoring_trace(4, np.full(200, 1000))
    st = workflow_stats(st_trace, "w")
    alloc = Allocation({"p": Instance(GPU, 1, 0.4, 1)})
    top = predict({"w": st}, PRM, alloc, ROOF, {"w": 1.0}, policy=reserve())
    rate = rho * top.workflows["w"].max_throughput
    pred = predict({"w": st}, PRM, alloc, ROOF, {"w": rate}, policy=reserve())
    sim = simulate(st_trace, PRM, alloc, ROOF, rates={"w": rate}, requests=6000, seed=1,
                   policy=reserve())
    assert pred.workflows["w"].mean_latency_s == pytest.approx(
        sim.workflows["w"].mean_latency_s, rel=0.08)
