"""``scepsy bench control`` at a tiny size (scepsy_serve.control.bench): the JSON's keys and
types, nothing lost by the drain-based policies, static-peak's GPU-hours at least static-mean's,
the same seed giving the same bytes; a resize in place starts only what it adds or changes and
drains nothing before its replacement is up; the controller loses nothing under generated rate
profiles."""

from __future__ import annotations

import json
from dataclasses import replace as _replace
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_opt.allocation import Allocation
from scepsy_opt.prediction.simulate import simulate
from scepsy_serve.control import bench as B
from scepsy_serve.control.bench import POLICIES, BenchOptions, run
from scepsy_serve.control.core import ControlConfig

TINY = BenchOptions(workflow="rag-beam", gpus=8, profiles=("daily",), windows=6, window_s=30.0,
                    startup_s=30.0, trace_requests=60, priority=False)
KEYS = {"p90_latency_s": float, "slo_attainment": float, "gpu_hours": float, "moves": int,
        "lost_requests": int}


@cache
def _result() -> str:
    return json.dumps(run(TINY), sort_keys=True, allow_nan=False)


def test_the_json_has_every_policy_and_metric():
    res = json.loads(_result())
    assert set(res["policies"]) == set(POLICIES)
    for row in res["policies"].values():
        assert set(row) == set(KEYS)
        for k, t in KEYS.items():
            assert isinstance(row[k], t) or (t is float and isinstance(row[k], int)), (k, row)
        assert 0.0 <= row["slo_attainment"] <= 1.0 and row["gpu_hours"] > 0
    assert set(res["forecast"]["daily"]) == {"holt", "last", "auto", "holt_at_horizon",
                                             "last_at_horizon", "auto_at_horizon", "horizon"}
    assert len(res["profiles"]["daily"]["decisions"]) == TINY.windows


def test_static_peak_costs_at_least_static_mean_and_static_policies_do_not_move():
    pol = json.loads(_result())["policies"]
    assert pol["static-peak"]["gpu_hours"] >= pol["static-mean"]["gpu_hours"] - 1e-9
    assert pol["static-peak"]["moves"] == pol["static-mean"]["moves"] == 0
    assert pol["static-peak"]["lost_requests"] == 0


def test_the_same_seed_gives_the_same_bytes():
    assert json.dumps(run(TINY), sort_keys=True, allow_nan=False) == _result()


# ------------------------------------------------- resizing in place, nothing drained early

SMOKE = _replace(TINY, windows=5)
STARTUP = SMOKE.startup_s


@cache
def _setup():
    return B.setup(SMOKE)


@cache
def _start():
    s = _setup()
    return B.min_cost_plan(s, 0.5 * s.peak)


def _spans(initial: Allocation, steps, rates):
    """Replay ``steps`` (bench.Step) from ``initial`` under Poisson arrivals at ``rates``."""
    s = _setup()
    prof = B.rate_profile("smoke", rates, SMOKE.window_s, 7)
    changes, _ = B.compile_schedule(B.Schedule(initial, tuple(steps), 0),
                                    len(rates) * SMOKE.window_s)
    p = s.problem
    return simulate(s.trace, s.models, initial, p.latency, dict(p.targets), seed=0,
                    arrival_times_s=list(prof.times_s), warmup_fraction=0.0,
                    drain_s=B.drain_s(s, SMOKE.window_s), changes=changes,
                    catalog=p.catalog).replica_spans


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_a_resize_in_place_leaves_the_untouched_replicas_running(data):
    """A re-plan that changes counts (and one LLM's share) starts only the added and changed
    replicas: the others keep their start time and run on; a shrunk LLM drains its
    highest-index replicas; a changed shape's old replicas drain only once its new ones are up
    (decision + start-up)."""
    s = _setup()
    initial = _start().plan.allocation
    names = sorted(initial.llms)
    after = dict(initial.llms)
    deltas = {}
    for m in names:
        d = data.draw(st.integers(-2, 2), label=f"delta {m}")
        after[m] = _replace(after[m], replicas=max(1, after[m].replicas + d))
        deltas[m] = after[m].replicas - initial.llms[m].replicas
    reshaped = data.draw(st.sampled_from([None, *names]), label="reshaped")
    if reshaped is not None:
        old = after[reshaped]
        after[reshaped] = _replace(old, share=1.0 if old.share < 1.0 else 0.5, memory=None)
    at = SMOKE.window_s
    steps = B.resize_steps(initial, Allocation(after, "test"), at, STARTUP)
    assert {st_.llm for st_ in steps} == {m for m in names if after[m] != initial.llms[m]}
    spans = _spans(initial, steps, [0.3 * s.peak] * 3)
    for m in names:
        mine = sorted((sp for sp in spans if sp.llm == m), key=lambda sp: sp.replica)
        first = [sp for sp in mine if sp.up_s == 0.0]
        later = [sp for sp in mine if sp.up_s > 0.0]
        assert len(first) == initial.llms[m].replicas
        if m == reshaped:
            assert len(later) == after[m].replicas
            assert all(sp.up_s == pytest.approx(at + STARTUP) for sp in later)
            # never drained before the replacement is healthy: down after the new ones are up
            assert all(sp.down_s is not None and sp.down_s >= at + STARTUP - 1e-9
                       for sp in first)
        elif deltas[m] >= 0:
            assert all(sp.down_s is None for sp in first), m  # untouched: still up
            assert len(later) == deltas[m]
            assert all(sp.up_s == pytest.approx(at + STARTUP) for sp in later)
        else:
            keep = initial.llms[m].replicas + deltas[m]
            assert all(sp.down_s is None for sp in first[:keep]), m
            assert all(sp.down_s is not None and sp.down_s >= at - 1e-9 for sp in first[keep:])
            assert not later


RATES = st.lists(st.floats(0.1, 1.0), min_size=SMOKE.windows, max_size=SMOKE.windows)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(RATES)
def test_the_controller_loses_nothing_and_starts_before_it_drains(fractions):
    """Under any rate profile within the peak: every step that starts or changes replicas
    takes effect a start-up after its decision (what it replaces serves until then), and no
    request is lost (lost: not complete by the end of the drain, twice the largest bound after
    the last arrival)."""
    s = _setup()
    n, ws = SMOKE.windows, SMOKE.window_s
    prof = B.rate_profile("smoke", [f * s.peak for f in fractions], ws, 3)
    counts = B.window_counts(prof.times_s, n, ws)
    cfg = ControlConfig(window_s=ws, startup_s=STARTUP)
    start = B.min_cost_plan(s, float(sum(counts)) / (n * ws) or 0.1)
    sched = B.control_schedule(s, start, counts, ws, cfg)
    cur = dict(sched.initial.llms)
    for st_ in sched.steps:
        old = cur[st_.llm]
        grows = st_.instance.replicas > old.replicas or B._shape(old) != B._shape(st_.instance)
        if grows:
            assert st_.at_s == pytest.approx(st_.decided_s + STARTUP)
        cur[st_.llm] = st_.instance
    row = B.run_policy(s, prof, sched, SMOKE)
    assert row["lost_requests"] == 0, row


def test_the_controllers_capacity_is_a_rate_a_placed_plan_carries():
    """The rate a target is capped at must be one the cluster carries within the bounds and
    the band, placed: a min-cost plan of the controller's own problem places at it, at most the
    max-throughput plan's rate (an upper bound). Placement is not monotone in the rate, so no
    rate above it is claimed not to place."""
    from scepsy_place.formulations.loop import plan_and_place
    from scepsy_serve.control.core import Controller

    s = _setup()
    ctl = Controller(s.problem, s.topology, _start(), ControlConfig(window_s=30.0,
                                                                   startup_s=STARTUP))
    p = ctl.problem
    base = sum(p.targets.values())
    cost = _replace(p, options=_replace(p.options, objective="min-cost", current=None))

    def places(rate):
        r = plan_and_place(cost.scaled(rate / base), s.topology, formulation="aggregate")
        return r.placed and r.plan.allocation is not None

    mt = plan_and_place(_replace(p, options=_replace(p.options, objective="max-throughput",
                                                     current=None)), s.topology,
                        formulation="aggregate")
    assert ctl.capacity <= mt.plan.scale * base + 1e-9
    assert ctl.capacity > 0 and places(ctl.capacity)
