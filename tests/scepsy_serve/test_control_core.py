"""The decision core of ``scepsy control`` (scepsy_serve.control.core, .forecast): forecasts
against a closed-form oracle, the hysteresis band, scale-up and scale-down, start-up accounting,
the decision log line, and ``replan``'s objective."""

from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import replace
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.planning.instances import random_problem
from scepsy_place.formulations.incremental import LoadChanged, replan
from scepsy_place.formulations.loop import plan_and_place
from scepsy_place.packing.topology import Node, Topology
from scepsy_profile import roofline_model
from scepsy_serve.control.bench import Schedule, Step, compile_schedule
from scepsy_serve.control.core import (
    ControlConfig,
    Controller,
    WindowStats,
    held_target,
    hold_after,
)
from scepsy_serve.control.forecast import RateForecaster, forecast_error

FAST = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


# ------------------------------------------------------------------------------ forecasts


@given(st.floats(0.1, 100.0), st.floats(-1.0, 5.0), st.integers(3, 12), st.integers(1, 6),
       st.floats(0.05, 1.0), st.floats(0.05, 1.0))
@settings(FAST, max_examples=80)
def test_holt_is_exact_on_a_line_after_two_windows(a, b, n, h, alpha, beta):
    f = RateForecaster("holt", alpha, beta)
    line = [a + b * k for k in range(n)]
    if min(line) <= 0 or a + b * (n - 1 + h) < 0:
        return
    for x in line:
        f.update(x)
    assert f.forecast(h) == pytest.approx(a + b * (n - 1 + h), rel=1e-9, abs=1e-9)
    assert forecast_error(line, "holt", alpha=alpha, beta=beta) == pytest.approx(0.0, abs=1e-9)


def test_last_lags_a_line_and_holt_does_not():
    line = [1.0 + k for k in range(10)]
    assert forecast_error(line, "last") > 0.05
    assert forecast_error(line, "holt") == pytest.approx(0.0, abs=1e-12)
    f = RateForecaster("last")
    for x in line:
        f.update(x)
    assert f.forecast(3) == 10.0 and f.peak(3) == 10.0


@pytest.mark.parametrize("kw, field", [
    ({"kind": "arima"}, "kind"), ({"alpha": 0.0}, "alpha"), ({"beta": 1.5}, "beta")])
def test_bad_forecasters_name_the_field(kw, field):
    with pytest.raises(InputError) as exc:
        RateForecaster(**kw)
    assert exc.value.field == field


@pytest.mark.parametrize("kw, field", [
    ({"window_s": 0}, "window_s"), ({"startup_s": -1}, "startup_s"),
    ({"up_utilisation": 1.2}, "up_utilisation"), ({"down_utilisation": 0.9}, "down_utilisation"),
    ({"hold_windows": 0}, "hold_windows"), ({"forecast": "x"}, "forecast"),
    ({"objective": "cheap"}, "objective"), ({"headroom": math.nan}, "headroom"),
    ({"down_memory": 0}, "down_memory")])
def test_bad_configs_name_the_field(kw, field):
    with pytest.raises(InputError) as exc:
        ControlConfig(**kw)
    assert exc.value.field == field


@pytest.mark.parametrize("startup, window, horizon", [
    (0.0, 30.0, 1), (30.0, 30.0, 2), (60.0, 30.0, 3), (61.0, 30.0, 4), (10.0, 30.0, 2)])
def test_the_forecast_covers_the_startup(startup, window, horizon):
    assert ControlConfig(window_s=window, startup_s=startup).horizon == horizon


# ----------------------------------------------------------------------------- controller


@cache
@functools.cache
def _setup():
    top = Topology("one", (Node("n0", "r0", "A100-80GB", 8, 8, 80.0),
                           Node("n1", "r0", "A100-80GB", 8, 8, 80.0)))
    problem = random_problem(3, 16, roofline_model(), seed=1, cluster=top.to_cluster(),
                             load=0.2)
    problem = replace(problem, options=replace(problem.options, time_limit_s=10.0))
    start = plan_and_place(replace(problem, options=replace(problem.options,
                                                            objective="min-cost")), top)
    assert start.placed
    return problem, top, start


@functools.cache
def _capacity(cfg: ControlConfig) -> float:
    """The controller's capacity on :func:`_setup`'s plan: it depends on the config's bound
    factor, band and formulation only, so tests that differ elsewhere share it."""
    problem, top, start = _setup()
    return Controller(problem, top, start, cfg).capacity


def _made(cfg: ControlConfig) -> Controller:
    """A controller of :func:`_setup`'s plan with ``cfg``, its capacity computed once per bound
    factor, band and formulation."""
    problem, top, start = _setup()
    key = ControlConfig(bound_factor=cfg.bound_factor, up_utilisation=cfg.up_utilisation,
                        formulation=cfg.formulation)
    return Controller(problem, top, start, cfg, capacity=_capacity(key))


def _controller(**kw):
    return _made(ControlConfig(**kw)), _setup()[0]


def _window(k, rates, window_s=30.0):
    return WindowStats(k * window_s, (k + 1) * window_s, rates)


def _run(ctl, rates_per_window):
    out = []
    for k, rates in enumerate(rates_per_window):
        d = ctl.observe(_window(k, rates))
        ctl.commit(d)
        out.append(d)
    return out


def test_constant_load_does_not_flap():
    ctl, problem = _controller()
    ds = _run(ctl, [dict(problem.targets)] * 10)
    changes = [d.action for d in ds if d.action != "keep"]
    assert len(changes) <= 1, [d.reason for d in ds]  # one move into the band at most
    assert all(d.action == "keep" for d in ds[4:])


def test_scale_up_when_the_load_doubles_and_down_only_after_the_hold():
    ctl, problem = _controller(hold_windows=3, startup_s=60.0)
    base = dict(problem.targets)
    ds = _run(ctl, [base] * 4)
    gpus0 = ctl.allocation.gpus()
    up = _run(ctl, [{w: 2 * r for w, r in base.items()}] * 2)
    assert up[0].action == "scale-up", up[0].reason
    assert up[0].startup_s == 60.0 and up[0].replan is not None and up[0].replan.started
    assert up[0].predicted_after is not None
    # at the target (the demand x 1.15) the band is 0.85 x 1.15: 0.85 at the demand itself
    assert max(up[0].predicted_after["utilisation"].values()) <= ctl.cap + 1e-9
    assert ctl.allocation.gpus() > gpus0
    low = {w: r / 4 for w, r in base.items()}
    down = _run(ctl, [low] * 6)
    first = next(i for i, d in enumerate(down) if d.action == "scale-down")
    # the hold: the scale-down comes at the hold_windows-th window in a row with an LLM below
    # the band (the count may start before the drop, in a window an LLM was idle), after
    # hold_windows - 1 keeps that say so, and never earlier
    seq = [*up, *down]
    at = len(up) + first
    assert all(d.action == "keep" and "below" in d.reason for d in seq[at - 2:at]), \
        [d.reason for d in seq]
    assert "below" not in seq[0].reason or seq[0].action != "scale-down"
    assert down[first].allocation is not None
    assert down[first].allocation.gpus() < up[-1].replan.placed.plan.allocation.gpus() \
        if up[-1].replan is not None else True
    assert all(d.replan is None for d in ds[1:])


def test_decision_log_line_round_trips_as_json():
    ctl, problem = _controller()
    for d in _run(ctl, [dict(problem.targets), {w: 3 * r for w, r in problem.targets.items()}]):
        line = json.dumps(d.to_dict(), allow_nan=False)
        back = json.loads(line)
        assert back == d.to_dict()
        assert set(back) >= {"at_s", "action", "reason", "observed_rates", "forecast_rates",
                             "predicted_now", "predicted_after", "replan", "startup_s"}
        assert "\n" not in line


def test_replan_min_cost_uses_no_more_gpus_than_min_latency():
    problem, top, start = _setup()
    wf = next(iter(problem.targets))
    ev = [LoadChanged(wf, factor=1.5)]
    lat = replan(problem, top, start, ev)
    cost = replan(problem, top, start, ev, objective="min-cost")
    assert lat.ok and cost.ok
    assert lat.problem.options.objective == "min-latency"
    assert cost.problem.options.objective == "min-cost"
    assert cost.placed.plan.allocation.gpus() <= lat.placed.plan.allocation.gpus() + 1e-9
    with pytest.raises(InputError) as exc:
        replan(problem, top, start, ev, objective="fastest")
    assert exc.value.field == "objective"


def test_starting_replicas_count_from_the_decision():
    a = Instance("A100-80GB", 1, 0.5, 2)
    b = Instance("A100-80GB", 2, 1.0, 1)
    sched = Schedule(Allocation({"m": a, "n": b}), (
        Step(30.0, 90.0, "m", replace(a, replicas=5)),   # +3 replicas of 0.5 GPU, 60 s early
        Step(60.0, 60.0, "n", replace(b, replicas=1, share=0.5)),  # new shape: 1 x 1 GPU, 0 s
        Step(100.0, 400.0, "m", replace(a, replicas=6)),  # +1, clipped at the end (300 s)
    ), 0)
    changes, starting = compile_schedule(sched, 300.0)
    assert starting == pytest.approx(3 * 0.5 * 60 + 1 * 0.5 * 200)
    assert [c.at_s for c in changes] == [60.0, 90.0, 400.0]
    assert changes[1].allocation.llms["m"].replicas == 5
    assert changes[1].allocation.llms["n"].share == 0.5


def test_a_percentile_bound_is_checked_on_the_predicted_percentile_at_or_above_it():
    from scepsy_serve.control.core import _stat

    assert [_stat(q) for q in (10, 50, 90, 95, 99, 99.9)] == [50, 50, 90, 99, 99, 99]
    problem, top, start = _setup()
    wf = next(iter(problem.targets))
    bounded = replace(problem, options=replace(problem.options,
                                               latency_bounds={wf: (95.0, 1e4)}))
    ctl = Controller(bounded, top, start, ControlConfig())
    assert ctl.percentiles[wf] == 99 and ctl.bounds[wf] == 1e4
    assert ctl.problem.options.latency_bounds[wf] == (95.0, 1e4)
    assert wf not in ctl.problem.options.latency_bound_s
    d = ctl.observe(_window(0, dict(problem.targets)))
    assert d.predicted_now["latency_s"][wf] >= d.predicted_now["mean_latency_s"][wf] - 1e-9


def test_min_cost_by_the_aggregate_formulation_searches_nothing_else():
    problem, top, _ = _setup()
    cost = replace(problem, options=replace(problem.options, objective="min-cost"))
    agg = plan_and_place(cost, top, formulation="aggregate")
    assert agg.placed and agg.formulation == "aggregate"
    assert set(agg.compared) == {"aggregate"}
    full = plan_and_place(cost, top)
    assert set(full.compared) > {"aggregate"}
    assert full.plan.stats["placed_cost_per_hour"] <= agg.plan.stats["placed_cost_per_hour"] \
        + 1e-9


# ------------------------------------------------------------------ auto forecast, latency band

@given(st.lists(st.floats(0.0, 50.0), min_size=1, max_size=30))
@settings(max_examples=60, deadline=None)
def test_auto_forecasts_with_the_model_that_has_erred_less(series):
    """Oracle: the two models run on their own, their one-window-ahead APEs summed by hand;
    auto's forecast is the one of lower mean error (last until each has 3 scored windows)."""
    auto = RateForecaster("auto")
    alone = {k: RateForecaster(k) for k in ("holt", "last")}
    errs = {k: [] for k in alone}
    for x in series:
        for k, f in alone.items():
            if f.seen >= 2 and x > 0:
                errs[k].append(abs(f.forecast(1) - x) / x)
        auto.update(x)
        for f in alone.values():
            f.update(x)
        n = min(len(v) for v in errs.values())
        mean = {k: sum(v) / len(v) for k, v in errs.items() if v}
        want = "holt" if n >= 3 and mean["holt"] < mean["last"] else "last"
        assert auto.chosen == want
        for h in (1, 3):
            assert auto.forecast(h) == pytest.approx(alone[want].forecast(h), rel=1e-12)


def test_auto_follows_a_trend_with_holt():
    f = RateForecaster("auto")
    for k in range(8):
        f.update(1.0 + k)
    assert f.chosen == "holt" and f.forecast(2) == pytest.approx(10.0)


def test_a_scale_down_keeps_a_margin_below_the_bound():
    """With down_latency near 0 no smaller plan is within it: a falling load is kept; with it
    near 1 the same windows scale down (the latency band is what held it)."""
    for frac, want in ((1e-6, False), (0.999, True)):
        ctl, problem = _controller(hold_windows=2, forecast="last", down_latency=frac)
        base = dict(problem.targets)
        _run(ctl, [{w: 2 * r for w, r in base.items()}] * 2)
        ds = _run(ctl, [{w: r / 4 for w, r in base.items()}] * 5)
        assert any(d.action == "scale-down" for d in ds) is want, [d.reason for d in ds]
        if not want:
            assert any("within 1e-06 x the bound" in d.reason for d in ds)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 50.0), min_size=1, max_size=12), st.integers(1, 6),
       st.floats(1.0, 400.0))
def test_the_demand_counts_the_requests_in_flight(series, startup_windows, in_flight):
    """The demand of a workflow whose requests last one window is the forecast's peak over the
    horizon; a longer one averages the arrivals in flight. With the last window's rate as the
    forecast, a step from ``hi`` down to ``lo`` keeps the demand above ``lo`` while a ``hi``
    window is among the ``D - 1`` before the next one (``D - 2`` windows after the first
    ``lo`` one), falling window by window, and at ``lo`` from then on."""
    ctl, problem = _controller(forecast="last", startup_s=30.0 * startup_windows)
    wf = next(iter(problem.targets))
    f, hist = ctl.forecasters[wf], ctl.history[wf]
    for x in series:
        f.update(x)
        hist.append(x)
    ctl.in_flight_s = {w: 1.0 for w in ctl.forecasters}
    assert ctl.demand(30.0)[wf] == pytest.approx(f.peak(ctl.config.horizon))
    hi, lo = max(series) + 1.0, min(series)
    ctl.in_flight_s = {w: in_flight for w in ctl.forecasters}
    d = math.ceil(in_flight / 30.0 - 1e-9)
    for _ in range(d):
        f.update(hi)
        hist.append(hi)
    seen = []
    for _ in range(d + 2):
        f.update(lo)
        hist.append(lo)
        seen.append(ctl.demand(30.0)[wf])
    assert all(a >= b - 1e-9 for a, b in itertools.pairwise(seen)), seen
    k = max(0, d - 2)
    assert all(x > lo + 1e-9 for x in seen[:k]), seen
    assert all(x == pytest.approx(lo) for x in seen[k:]), seen


# ------------------------------------------------------- the headroom, counted once

def test_the_band_applies_to_the_demand_and_the_headroom_to_the_latency():
    """The target is the demand x 1.15 (the headroom). A load at
    which the running plan's busiest LLM is above 0.85 at the target but at most 0.85 at the
    demand (0.85 x 1.15 at the target), with every workflow within its bound at the target,
    is kept: the band's utilisation is not applied a second time on top of the headroom."""
    ctl, problem = _controller(forecast="last")
    cap = min(problem.options.max_utilisation, 0.85 * 1.15)
    alloc = ctl.allocation
    found = None
    for k in range(1, 400):
        f = 0.01 * k
        rates = {w: f * r for w, r in problem.targets.items()}
        p = ctl._predict(ctl.problem, alloc, {w: 1.15 * r for w, r in rates.items()})
        u = max(p["utilisation"].values())
        if 0.85 + 0.02 < u <= cap - 0.02 and all(
                x <= ctl.bounds[w] for w, x in p["latency_s"].items()):
            found = rates
            break
    assert found is not None, "no load between the two utilisations on this plan"
    d = ctl.observe(_window(0, found))
    assert d.action == "keep", d.reason
    assert ctl.cap == pytest.approx(cap)



# ------------------------------------------- provisioning ahead, scaling down lazily


def test_ahead_adds_a_rising_trend_to_the_naive_forecast():
    """While ``auto`` still forecasts with the last window (too few windows scored for Holt),
    :meth:`RateForecaster.ahead` adds Holt's positive trend, one step per window ahead: on a
    line rising by 1 a window, the rate 3 windows ahead of 3 is 6 where ``forecast`` says 3;
    on a falling line it is the forecast itself."""
    up = RateForecaster("auto")
    for x in (1.0, 2.0, 3.0):
        up.update(x)
    assert up.chosen == "last" and up.trend == pytest.approx(1.0)
    assert up.forecast(3) == pytest.approx(3.0)
    assert up.ahead(3) == pytest.approx(6.0)
    down = RateForecaster("auto")
    for x in (3.0, 2.0, 1.0):
        down.update(x)
    assert [down.ahead(h) for h in (1, 2, 3)] == [down.forecast(h) for h in (1, 2, 3)]
    assert RateForecaster("last").trend == 0.0


def test_on_a_rising_trend_the_demand_is_the_rate_when_the_capacity_is_ready():
    """With ``trend_ahead`` the demand on a rising series is sized for the windows the new
    capacity serves in (decision + start-up), above the demand of the last window's rate; on
    a flat series both are the same."""
    rising = [0.4, 0.6, 0.8]
    out = {}
    for ahead in (True, False):
        ctl, _ = _controller(trend_ahead=ahead, startup_s=60.0)
        for x in rising:
            for wf, f in ctl.forecasters.items():
                f.update(x)
                ctl.history[wf].append(x)
        ctl.in_flight_s = {w: 1.0 for w in ctl.forecasters}
        out[ahead] = ctl.demand(30.0)
    for wf in out[True]:
        assert out[False][wf] == pytest.approx(0.8)
        assert out[True][wf] == pytest.approx(0.8 + 3 * 0.2)
    ctl, _ = _controller(trend_ahead=True, startup_s=60.0)
    for _ in range(3):
        for wf, f in ctl.forecasters.items():
            f.update(0.5)
            ctl.history[wf].append(0.5)
    ctl.in_flight_s = {w: 1.0 for w in ctl.forecasters}
    assert all(x == pytest.approx(0.5) for x in ctl.demand(30.0).values())


def test_the_held_target_follows_a_rise_at_once_and_a_fall_after_memory_windows():
    ts = [{"a": 1.0, "b": 4.0}, {"a": 3.0, "b": 2.0}, {"a": 2.0, "b": 1.0}]
    assert held_target(ts[:2], 2) == {"a": 3.0, "b": 4.0}  # the rise of a at once
    assert held_target(ts, 2) == {"a": 3.0, "b": 2.0}  # each fall one window later
    assert held_target(ts, 1) == ts[-1]
    assert held_target(ts, 5) == {"a": 3.0, "b": 4.0}


def test_after_a_scale_down_the_next_may_follow_one_window_later():
    assert hold_after("scale-down", 3, True) == 2
    assert hold_after("scale-down", 3, False) == 0
    assert hold_after("scale-up", 3, True) == 0


def test_a_fall_keeps_the_last_windows_largest_target():
    """With ``down_memory = 2`` the window after a drop is still planned for the load before
    it (no scale-down at the drop), where ``down_memory = 1`` plans for the drop at once."""
    seen = {}
    for memory in (1, 2):
        ctl, problem = _controller(down_memory=memory, forecast="last")
        base = dict(problem.targets)
        _run(ctl, [base] * 3)
        low = _run(ctl, [{w: r / 4 for w, r in base.items()}])[0]
        seen[memory] = low
        assert low.action != "scale-up"
    held, fell = seen[2], seen[1]
    assert "held at the largest of the last 2 windows' targets" in held.reason, held.reason
    assert "held at" not in fell.reason
