"""The decision core of ``scepsy control``: one telemetry window in, one decision out (pure, no
I/O). The live controller and ``scepsy bench control`` share it (docs/bench-control.md).

Each window (:meth:`Controller.observe`):

1. **Forecast.** Every workflow's request rate is forecast (:mod:`scepsy_serve.control.forecast`,
   by default ``auto``: Holt's double exponential smoothing or the last window's
   rate, whichever has forecast this series better so far) over the next ``H = 1 + ceil(startup_s /
   window_s)`` windows, and the largest of those forecasts is kept: a replica started now is
   healthy ``startup_s`` later, so the capacity decided now must carry the load until the window
   after it has started. The **target** is that forecast times ``1 + headroom`` (the forecast's
   error margin).
2. **Predict** the running plan at the target with the Aggregate LLM Pipeline
   (:func:`scepsy_opt.prediction.pipeline.predict`): each LLM's utilisation (its
   ``LLMLoad.utilisation``, ``load / (replicas·μ)``, the one the optimiser's ``max_utilisation``
   bounds) and each workflow's mean latency.
3. **Decide**, with a hysteresis band ``[down_utilisation, up_utilisation]``:

   * **scale-up** when some LLM's utilisation exceeds ``up_utilisation`` or some workflow's
     predicted latency exceeds its bound;
   * **scale-down** when some LLM's utilisation has been below ``down_utilisation`` for
     ``hold_windows`` consecutive windows (a window without one starts the count again: one
     LLM of a workflow may be oversized while another is busy), the re-plan uses fewer GPUs,
     and
     the smaller plan keeps every workflow within ``down_latency`` (0.8) times its bound (a
     plan at the bound's edge would be scaled up again at the next rise of the load);
   * **keep** otherwise.

   A change is an incremental re-plan (:func:`scepsy_place.formulations.incremental.replan`,
   fewest replicas started, stopped and moved) of the running plan to the target, first among
   the instance shapes already running (GPU shares and TP degrees: only replica counts change,
   no running replica restarts), then among all: by default the
   ``min-cost`` objective (the cheapest GPUs that carry the target within the latency bounds, at
   a utilisation of at most ``up_utilisation``, so the new plan sits inside the band). When no
   plan meets the bounds the re-plan falls back to ``min-latency`` (no bounds) on the whole
   cluster (again the running shapes first); without any plan the decision is ``replan-failed`` (the running plan stays). A
   target beyond the cluster's **capacity** (the total rate of its max-throughput plan within
   the bounds and the band, computed once) is scaled down to it, keeping its mix: the
   controller then asks for the most the cluster carries instead of a plan that cannot exist. A scale-down whose plan uses no fewer GPUs is a keep.
4. **Start-up.** A decision that starts or moves replicas has ``startup_s``: its new capacity
   counts only from ``at_s + startup_s`` (the forecast horizon above covers that gap).
   :meth:`Controller.commit` makes the decision's plan the running one (call it once the change
   is applied, or at once in a simulation that delays the new replicas itself).

5. **Measured overload.** The model can be optimistic about a real engine (on a CPU the
   serving model overestimates vLLM's saturation several times). When a window's measured
   queue (``WindowStats.llm_queue``, vLLM's waiting calls summed over an LLM's replicas) is at
   least ``queue_up`` calls per replica for an LLM that the model, at the observed rates times
   the current :attr:`Controller.derate`, predicts below full utilisation ``u``, the LLM is
   saturated in reality and the model is not: ``derate`` becomes ``derate / u`` (at most
   ``max_derate``), so that the model predicts full utilisation at the observed load. Every
   target is the forecast times ``(1 + headroom) * derate`` from then on: the re-plans add the
   capacity the engine really needs, and the scale-down rule sees the derated load too. The
   derating only grows (it measures the engine, not the load) and is logged with every
   decision. Windows without queues (the simulator's) leave it at 1.

The latency bound of a workflow is the problem's percentile bound for it (``latency_bounds``:
the predicted percentile, :mod:`scepsy_opt.prediction.tails`, of the predictor's at or above
the one given), else its mean bound (``latency_bound_s``), else ``bound_factor`` (1.5) times the
running plan's predicted mean latency at the problem's targets; the re-plans keep it.
:meth:`Decision.to_dict` is one line of the decision log: reason, forecast and predicted effect.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation
from scepsy_opt.planning.objectives import OBJECTIVES, MaxThroughput, MinLatency, objective
from scepsy_opt.planning.problem import Objective, PlanningProblem
from scepsy_opt.prediction.pipeline import predict
from scepsy_opt.prediction.tails import QUANTILES
from scepsy_place.formulations.incremental import LoadChanged, Replan, replan
from scepsy_place.formulations.loop import (
    FORMULATIONS,
    Formulation,
    PlacedPlan,
    plan_and_place,
)
from scepsy_place.packing.topology import Topology
from scepsy_serve.control.forecast import (
    ALPHA,
    BETA,
    FORECASTS,
    ForecastKind,
    RateForecaster,
    check_smoothing,
)

Action = Literal["keep", "scale-up", "scale-down", "replan-failed"]
MIN_RATE = 1e-3
"""The smallest target (req/s) a re-plan is given: a workflow forecast at 0 keeps a minimal
deployment (every LLM keeps at least one replica)."""
SOURCE = "control config"


@dataclass(frozen=True)
class WindowStats:
    """One telemetry window: the rate of new workflow requests (req/s) and, optionally, per LLM
    the mean waiting calls and the p90 call latency."""

    start_s: float
    end_s: float
    workflow_rates: Mapping[str, float]
    llm_queue: Mapping[str, float] = field(default_factory=dict)
    llm_latency_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        src = "window"
        for name in ("start_s", "end_s"):
            x = getattr(self, name)
            if isinstance(x, bool) or not (isinstance(x, int | float) and math.isfinite(x)):
                raise InputError(src, name, "a time in seconds", x)
        if not self.end_s > self.start_s:
            raise InputError(src, "end_s", f"a time after start_s ({self.start_s})", self.end_s)
        for name in ("workflow_rates", "llm_queue", "llm_latency_s"):
            m = getattr(self, name)
            for k, x in m.items():
                if isinstance(x, bool) or not (isinstance(x, int | float) and math.isfinite(x)
                                               and x >= 0):
                    raise InputError(src, f"{name}.{k}", "a finite number >= 0", x)
            object.__setattr__(self, name, MappingProxyType(dict(m)))


@dataclass(frozen=True)
class ControlConfig:
    """The controller's knobs (module docstring); every one validated (an input error naming
    it)."""

    window_s: float = 30.0
    startup_s: float = 60.0  # time a new replica takes to be healthy
    forecast: ForecastKind = "auto"
    alpha: float = ALPHA
    beta: float = BETA
    headroom: float = 0.15
    up_utilisation: float = 0.85
    down_utilisation: float = 0.5
    hold_windows: int = 3
    down_latency: float = 0.8  # a scale-down keeps every workflow within this part of its bound
    objective: Objective = "min-cost"  # of the re-plans
    # of the re-plans (scepsy_place.formulations.loop): "aggregate" solves the aggregate MILP
    # and places it, quick and independent of the time limit; "auto" searches further
    formulation: Formulation = "aggregate"
    bound_factor: float = 1.5  # bound = factor x the running plan's latency, without one given
    queue_up: float = 4.0  # measured waiting calls per replica that say an LLM is overloaded
    max_derate: float = 16.0  # the most the measured overload may derate the model's capacity

    def __post_init__(self) -> None:
        def positive(name: str, x: Any, zero: bool = False) -> None:
            ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) \
                and (x >= 0 if zero else x > 0)
            if not ok:
                raise InputError(SOURCE, name, "a number >= 0" if zero else "a number > 0", x)

        positive("window_s", self.window_s)
        positive("startup_s", self.startup_s, zero=True)
        positive("headroom", self.headroom, zero=True)
        positive("bound_factor", self.bound_factor)
        positive("queue_up", self.queue_up)
        if isinstance(self.max_derate, bool) or not (
                isinstance(self.max_derate, int | float) and math.isfinite(self.max_derate)
                and self.max_derate >= 1):
            raise InputError(SOURCE, "max_derate", "a factor >= 1", self.max_derate)
        if self.forecast not in FORECASTS:
            raise InputError(SOURCE, "forecast", f"one of {', '.join(FORECASTS)}", self.forecast)
        check_smoothing(self.alpha, self.beta, SOURCE)
        for name in ("up_utilisation", "down_utilisation", "down_latency"):
            x = getattr(self, name)
            if isinstance(x, bool) or not (isinstance(x, int | float) and 0 < x < 1):
                raise InputError(SOURCE, name, "a utilisation in (0, 1)", x)
        if not self.down_utilisation < self.up_utilisation:
            raise InputError(SOURCE, "down_utilisation", "a utilisation below up_utilisation "
                             f"({self.up_utilisation})", self.down_utilisation)
        if isinstance(self.hold_windows, bool) or not (isinstance(self.hold_windows, int)
                                                       and self.hold_windows >= 1):
            raise InputError(SOURCE, "hold_windows", "a whole number of windows >= 1",
                             self.hold_windows)
        if self.objective not in OBJECTIVES:
            raise InputError(SOURCE, "objective", f"one of {', '.join(OBJECTIVES)}",
                             self.objective)
        if self.formulation not in FORMULATIONS:
            raise InputError(SOURCE, "formulation", f"one of {', '.join(FORMULATIONS)}",
                             self.formulation)

    @property
    def horizon(self) -> int:
        """Windows the forecast covers: the next one plus those a new replica takes to start."""
        return 1 + math.ceil(self.startup_s / self.window_s - 1e-9)


@dataclass(frozen=True)
class Decision:
    """What the controller decided at ``at_s`` (module docstring)."""

    at_s: float
    action: Action
    reason: str
    observed_rates: Mapping[str, float]
    forecast_rates: Mapping[str, float]
    predicted_now: Mapping[str, Any]  # {"latency_s": {wf: s}, "utilisation": {llm: x}}
    predicted_after: Mapping[str, Any] | None = None
    replan: Replan | None = None
    startup_s: float = 0.0  # 0 when nothing starts
    derate: float = 1.0  # the model's capacity was divided by this (measured overload)

    @property
    def allocation(self) -> Allocation | None:
        """The new plan's allocation (None without a change)."""
        if self.replan is None or not self.replan.ok:
            return None
        return self.replan.placed.plan.allocation

    @property
    def moves(self) -> int:
        """Replicas started, stopped and moved by the change."""
        r = self.replan
        return 0 if r is None or not r.ok else len(r.started) + len(r.stopped) + len(r.moved)

    def to_dict(self) -> dict[str, Any]:
        """One line of the decision log (JSON-ready; a non-finite number is null)."""
        r = self.replan
        summary = None
        if r is not None:
            alloc = self.allocation
            summary = {"status": r.status, "reason": r.placed.reason,
                       "events": [e.spec for e in r.events],
                       "objective": r.problem.options.objective,
                       "started": len(r.started), "stopped": len(r.stopped),
                       "moved": len(r.moved), "kept": len(r.kept),
                       "gpus": None if alloc is None else round(alloc.gpus(), 6),
                       "llms": r.per_llm() if r.ok else None}
        return _finite({"at_s": self.at_s, "action": self.action, "reason": self.reason,
                        "observed_rates": dict(self.observed_rates),
                        "forecast_rates": dict(self.forecast_rates),
                        "predicted_now": _plain(self.predicted_now),
                        "predicted_after": (None if self.predicted_after is None
                                            else _plain(self.predicted_after)),
                        "replan": summary, "startup_s": self.startup_s,
                        "derate": self.derate})


def _plain(m: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _plain(v) if isinstance(v, Mapping) else v for k, v in m.items()}


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def _stat(q: float) -> float:
    """The predicted percentile that stands for a bound on percentile ``q``: the smallest of
    the predictor's (:data:`scepsy_opt.prediction.tails.QUANTILES`) at or above it."""
    have = sorted(QUANTILES)
    return next((x for x in have if x >= q - 1e-9), have[-1])


class Controller:
    """The running plan, the forecasts and the hysteresis count (module docstring)."""

    def __init__(self, problem: PlanningProblem, topology: Topology, placed: PlacedPlan,
                 config: ControlConfig | None = None, *, capacity: float | None = None) -> None:
        """``capacity``: the cluster's capacity (:meth:`capacity_of`) when it is known already
        (a controller resumed on the same problem, cluster and config); computed otherwise."""
        self.config = config or ControlConfig()
        if not placed.placed or placed.plan.allocation is None:
            raise InputError("running plan", "placement", "a placed plan (every replica placed)",
                             placed.status)
        self.topology = topology
        self._placed = placed
        cfg = self.config
        pct = problem.options.latency_bounds
        given = problem.options.latency_bound_s
        bounds: dict[str, float] = {}
        qs: dict[str, float | None] = {}
        for w in problem.targets:
            if w in pct:
                qs[w], bounds[w] = _stat(pct[w][0]), float(pct[w][1])
            elif w in given:
                qs[w], bounds[w] = None, float(given[w])
        # per workflow: the predicted percentile its bound is on (None: the mean)
        self.percentiles: Mapping[str, float | None] = MappingProxyType(qs)
        missing = [w for w in problem.targets if w not in bounds]
        if missing:
            pred = self._predict(problem, placed.plan.allocation, problem.targets)
            for w in missing:
                lat = pred["mean_latency_s"][w]
                if not math.isfinite(lat):
                    raise InputError("running plan", "latency", f"a plan that carries the "
                                     f"problem's targets (workflow {w} is saturated); give "
                                     "latency_bound_s", lat)
                qs[w], bounds[w] = None, cfg.bound_factor * lat
        self.percentiles = MappingProxyType(dict(sorted(qs.items())))
        self.bounds: Mapping[str, float] = MappingProxyType(dict(sorted(bounds.items())))
        cap = min(problem.options.max_utilisation, cfg.up_utilisation)
        self.problem = replace(problem, options=replace(
            problem.options, max_utilisation=cap,
            latency_bound_s={w: b for w, b in self.bounds.items() if qs[w] is None},
            latency_bounds={w: pct[w] for w in self.bounds if w in pct}))
        self.capacity = self._capacity() if capacity is None else capacity
        self.forecasters = {w: RateForecaster(cfg.forecast, cfg.alpha, cfg.beta)
                            for w in problem.targets}
        self.below = 0  # consecutive windows with every LLM below down_utilisation
        self.derate = 1.0  # demand multiplier learned from measured overload (module docstring)

    def _capacity(self) -> float:
        """The largest total rate (req/s, at the problem's mix) a plan on the whole cluster
        carries within the bounds and the band (its max-throughput plan); inf without one."""
        p = self.problem
        res = plan_and_place(replace(p, options=replace(p.options, objective=MaxThroughput.name,
                                                        current=None)), self.topology,
                             formulation=self.config.formulation)
        if not res.placed or res.plan.allocation is None:
            return math.inf
        return res.plan.scale * sum(p.targets.values())

    @property
    def placed(self) -> PlacedPlan:
        """The running plan."""
        return self._placed

    @property
    def allocation(self) -> Allocation:
        alloc = self._placed.plan.allocation
        assert alloc is not None
        return alloc

    def _predict(self, problem: PlanningProblem, alloc: Allocation,
                 rates: Mapping[str, float]) -> dict[str, Any]:
        """``latency_s``: per workflow the statistic its bound is on (a percentile or the
        mean); ``mean_latency_s``; ``utilisation`` per LLM."""
        p = predict(problem.stats, problem.models, alloc, problem.latency, dict(rates),
                    catalog=problem.catalog, policy=problem.policy)
        qs: Mapping[str, float | None] = getattr(self, "percentiles", {})

        def stat(w: str, x: Any) -> float:
            q = qs.get(w)
            v = getattr(x, f"p{int(q)}_latency_s", math.nan) if q is not None else math.nan
            return float(v if v == v else x.mean_latency_s)  # NaN: no path data, the mean

        return {"latency_s": {w: stat(w, x) for w, x in sorted(p.workflows.items())},
                "mean_latency_s": {w: float(x.mean_latency_s)
                                   for w, x in sorted(p.workflows.items())},
                "utilisation": {m: float(x.utilisation) for m, x in sorted(p.llms.items())}}

    def observe(self, w: WindowStats) -> Decision:
        """Take one window's telemetry and decide (module docstring). The decision is at
        ``w.end_s``; nothing changes until :meth:`commit`."""
        cfg = self.config
        observed = {wf: float(w.workflow_rates.get(wf, 0.0)) for wf in self.forecasters}
        for wf, f in self.forecasters.items():
            f.update(observed[wf])
        measured = self._learn_derate(w, observed)
        forecast = {wf: f.peak(cfg.horizon) for wf, f in self.forecasters.items()}
        target = {wf: max(MIN_RATE, x * (1.0 + cfg.headroom) * self.derate)
                  for wf, x in forecast.items()}
        total = sum(target.values())
        capped = total > self.capacity
        if capped:  # more than the cluster carries: plan for what it carries, at this mix
            target = {wf: max(MIN_RATE, x * self.capacity / total) for wf, x in target.items()}
        now = self._predict(self.problem, self.allocation, target)
        util, lat = now["utilisation"], now["latency_s"]
        over = sorted(m for m, u in util.items() if u > cfg.up_utilisation)
        late = sorted(wf for wf, x in lat.items() if x > self.bounds[wf])

        def decide(action: Action, reason: str, rp: Replan | None = None,
                   after: Mapping[str, Any] | None = None) -> Decision:
            started = rp is not None and rp.ok and bool(rp.started or rp.moved)
            return Decision(w.end_s, action, reason, observed, forecast, now, after, rp,
                            cfg.startup_s if started else 0.0, self.derate)

        at = (f"at the forecast x {1 + cfg.headroom:g} (horizon {cfg.horizon} windows)"
              + (f" x the derating {self.derate:.3g}" if self.derate > 1 else "") + measured
              + (f", capped at the cluster's capacity {self.capacity:.4g} req/s" if capped
                 else ""))
        if over or late:
            self.below = 0
            why = "; ".join(
                [f"{m} utilisation {util[m]:.2f} > {cfg.up_utilisation:g}" for m in over]
                + [f"{wf} latency {lat[wf]:.3g} s > bound {self.bounds[wf]:.3g} s"
                   for wf in late]) + f" {at}"
            return self._change("scale-up", why, target, decide)
        idle = sorted(m for m, u in util.items() if u < cfg.down_utilisation)
        if idle:
            self.below += 1
            names = ", ".join(idle) if len(idle) < len(util) else "every LLM"
            if self.below < cfg.hold_windows:
                return decide("keep", f"{names} below {cfg.down_utilisation:g} {at} for "
                              f"{self.below}/{cfg.hold_windows} windows")
            why = (f"{names} below {cfg.down_utilisation:g} {at} for {self.below} windows "
                   f"(least {min(util[m] for m in idle):.2f})")
            return self._change("scale-down", why, target, decide)
        self.below = 0
        return decide("keep", f"within the band [{cfg.down_utilisation:g}, "
                      f"{cfg.up_utilisation:g}] and the latency bounds {at}")

    def _learn_derate(self, w: WindowStats, observed: Mapping[str, float]) -> str:
        """Raise :attr:`derate` when the window's measured queues say an LLM is overloaded
        that the model, derated so far, predicts below full utilisation (module docstring);
        a phrase for the decision's reason ("" when nothing was learned)."""
        cfg = self.config
        llms = self.allocation.llms
        queued = {m: q / llms[m].replicas for m, q in w.llm_queue.items()
                  if m in llms and q / llms[m].replicas >= cfg.queue_up}
        if not queued or not any(r > 0 for r in observed.values()):
            return ""
        seen = self._predict(self.problem, self.allocation,
                             {wf: max(MIN_RATE, r * self.derate) for wf, r in observed.items()})
        u = max(seen["utilisation"].get(m, 0.0) for m in queued)
        if not 0 < u < 1:  # the model already sees it saturated (or cannot say)
            return ""
        before = self.derate
        self.derate = min(cfg.max_derate, self.derate / u)
        worst = max(queued, key=lambda m: queued[m])
        return (f"; measured queue of {worst} {queued[worst]:.3g} calls per replica >= "
                f"{cfg.queue_up:g} where the model predicts utilisation {u:.2f}: demand derated "
                f"x{before:.3g} -> x{self.derate:.3g}")

    def _change(self, action: Action, why: str, target: Mapping[str, float],
                decide: Any) -> Decision:
        """Re-plan the running plan to ``target`` (module docstring) for ``action``."""
        cfg = self.config
        events = [LoadChanged(wf, target=t) for wf, t in sorted(target.items())]
        form = cfg.formulation
        # first within the running shapes (GPU shares and TP degrees): counts change, replicas
        # keep running; a new shape restarts every replica of its LLM
        run = self.allocation.llms.values()
        within = replace(self.problem, options=replace(
            self.problem.options, shares=tuple(sorted({i.share for i in run})),
            tps=tuple(sorted({i.tp for i in run}))))
        rp = replan(within, self.topology, self._placed, events, objective=cfg.objective,
                    formulation=form)
        note = ""
        if not rp.ok:
            rp = replan(self.problem, self.topology, self._placed, events,
                        objective=cfg.objective, formulation=form)
            note = " (new shapes: none of the running ones carries the target)"
        if not rp.ok and action == "scale-up" and objective(cfg.objective).mean_bounds:
            for base in (within, self.problem):  # the running shapes first, again
                free = replace(base, options=replace(base.options, latency_bound_s={},
                                                     latency_bounds={}))
                rp = replan(free, self.topology, self._placed, events,
                            objective=MinLatency.name, formulation=form)
                if rp.ok:
                    break
            note = " (no plan meets the latency bounds: the lowest latency on the cluster)"
        if not rp.ok or rp.placed.plan.allocation is None:
            return decide("replan-failed", f"{why}; re-plan {rp.status}: "
                          f"{rp.placed.reason or 'no plan'}", rp)
        new = rp.placed.plan.allocation
        after = self._predict(self.problem, new, target)
        if not (rp.started or rp.stopped or rp.moved):
            return decide("keep", f"{why}; the re-plan keeps the running plan", None)
        if action == "scale-down" and new.gpus() >= self.allocation.gpus() - 1e-9:
            return decide("keep", f"{why}; the cheapest plan within the bounds uses no fewer "
                          f"GPUs ({new.gpus():g})", None)
        if action == "scale-down":  # hysteresis on latency too: no plan at the bound's edge
            tight = sorted(wf for wf, x in after["latency_s"].items()
                           if x > cfg.down_latency * self.bounds[wf])
            if tight:
                return decide("keep", f"{why}; the smaller plan would take "
                              + ", ".join(f"{wf} to {after['latency_s'][wf]:.3g} s" for wf in tight)
                              + f", above {cfg.down_latency:g} x the bound", None)
        return decide(action, f"{why}; re-plan: {len(rp.started)} started, {len(rp.stopped)} "
                      f"stopped, {len(rp.moved)} moved, {self.allocation.gpus():g} -> "
                      f"{new.gpus():g} GPUs{note}", rp, after)

    def commit(self, d: Decision) -> None:
        """The change of ``d`` was applied: its plan becomes the running one (a decision
        without one changes nothing)."""
        if d.replan is not None and d.replan.ok and d.action in ("scale-up", "scale-down"):
            self._placed = d.replan.placed
            self.below = 0
