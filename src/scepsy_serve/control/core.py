"""The decision core of ``scepsy control``: one telemetry window in, one decision out (pure, no
I/O). The live controller and ``scepsy bench control`` share it (docs/bench-control.md).

Each window (:meth:`Controller.observe`):

1. **Forecast and demand.** Every workflow's request rate is forecast
   (:mod:`scepsy_serve.control.forecast`, by default ``auto``: Holt's double exponential
   smoothing or the last window's rate, whichever has forecast this series better so far) over
   the next ``H = 1 + ceil(startup_s / window_s)`` windows: a replica started now is healthy
   ``startup_s`` later, so the capacity decided now must carry the load until the window after
   it has started. A request keeps its LLMs busy for about its latency (``in_flight_s``: the
   running plan's predicted mean latency at the observed rates, at most the bound), so the
   load at a window is the arrival rate averaged over the last ``D = ceil(in_flight_s /
   window_s)`` windows, observed and forecast; the **demand** (:meth:`Controller.demand`) is
   the largest such average over the horizon (the forecast's peak when ``D = 1``). With
   ``trend_ahead`` (the default) the forecast ``k`` windows ahead is
   :meth:`~scepsy_serve.control.forecast.RateForecaster.ahead`: on a rising trend the last
   window's rate plus ``k`` windows of Holt's trend, so that the capacity decided now is sized
   for the windows it serves in. The **target** is the demand times ``1 + headroom`` (the
   forecast's error margin), held (:func:`held_target`) at the largest of the last
   ``down_memory`` (2) windows' targets: a rise is followed at once, a fall a window later,
   while the requests of the higher load are still in flight.
   The band's ``up_utilisation`` bounds the load at the demand: at the target each LLM may
   reach ``up_utilisation * (1 + headroom)`` (at most the problem's ``max_utilisation``,
   :attr:`Controller.cap`), and the headroom is checked on the predicted latency there, so
   the margin is not counted twice (0.85 at the target would be 0.74 at the demand).
2. **Predict** the running plan at the target with the Aggregate LLM Pipeline
   (:func:`scepsy_opt.prediction.pipeline.predict`): each LLM's utilisation (its
   ``LLMLoad.utilisation``, ``load / (replicas·μ)``, the one the optimiser's ``max_utilisation``
   bounds) and each workflow's latency.
3. **Decide**, with a band:

   * **scale-up** when some LLM's utilisation exceeds the cap or some workflow's
     predicted latency exceeds its bound;
   * **scale-down** after ``hold_windows`` consecutive windows in each of which an LLM of more
     than one replica was below ``down_utilisation``, or the running plan with fewer replicas
     fits inside the band (a window with neither starts the count again); after a
     scale-down with ``down_follow``, at the next such window (:func:`hold_after`);
   * **keep** otherwise.

   A change **resizes in place** where it can (every LLM keeps its shape: added replicas
   start, removed ones drain, the others run on), since a change of shape restarts an LLM's
   replicas and its old ones serve beside the new for a start-up
   (:mod:`scepsy_serve.control.inplace`). A **scale-down only removes replicas**: one at a
   time, the one that frees the most GPUs first, while every LLM stays at or below
   the cap and every workflow within ``down_latency`` (0.8) times its bound at the
   target (inside the band, so that the next small rise does not cross the bound again);
   nothing starts, and without a replica to remove it is a keep. A **scale-up** is an
   incremental re-plan (:func:`scepsy_place.formulations.incremental.replan`, fewest replicas
   started, stopped and moved) of the running plan to the target, by default with the
   ``min-cost`` objective at a utilisation of at most the cap, within the bounds,
   first among the instance shapes already running; when that plan changes an LLM's shape,
   replicas of the running shapes are added instead (one at a time, the one that leaves the
   least excess utilisation and latency) when that meets the bounds within the cluster and
   they fit around the running replicas. A scale-up that the running shapes do not carry takes
   new shapes; one that no plan within the bounds carries falls back to ``min-latency`` (no
   bounds) on the whole cluster, unless that plan adds no GPU (a keep: at the cluster's limit,
   moving replicas around starts them for a plan that still misses the bounds). Without any
   plan the decision is ``replan-failed`` (the running plan stays). A target beyond the
   cluster's **capacity** (a total rate at which a min-cost plan within the bounds and the cap
   places on the whole cluster, found once by bisection below the max-throughput plan's rate:
   that plan need not place at the bounds' percentiles) is scaled down to it, keeping its
   mix.
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
   target is the demand times ``(1 + headroom) * derate`` from then on: the re-plans add the
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation
from scepsy_opt.planning.objectives import (
    OBJECTIVES,
    MaxThroughput,
    MinCost,
    MinLatency,
    objective,
)
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
from scepsy_serve.control.inplace import grow, in_place, shrink

Action = Literal["keep", "scale-up", "scale-down", "replan-failed"]
MIN_RATE = 1e-3
"""The smallest target (req/s) a re-plan is given: a workflow forecast at 0 keeps a minimal
deployment (every LLM keeps at least one replica)."""
SOURCE = "control config"
CAPACITY_TOLERANCE = 0.02
"""The relative precision of the cluster's capacity (:meth:`Controller._capacity`)."""


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
    # on a rising trend, the forecast at the windows ahead adds Holt's trend to the naive one
    # (RateForecaster.ahead): the capacity decided now is sized for the window it is ready in
    trend_ahead: bool = True
    # the target is the largest of the last this many windows' targets (held_target): a rise
    # is followed at once, a fall a window later, so the requests of the higher load still in
    # flight keep their capacity
    down_memory: int = 2
    # after a scale-down, the next may come one window later (while the fall goes on) rather
    # than after another hold_windows (hold_after)
    down_follow: bool = True
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
        if isinstance(self.down_memory, bool) or not (isinstance(self.down_memory, int)
                                                      and self.down_memory >= 1):
            raise InputError(SOURCE, "down_memory", "a whole number of windows >= 1",
                             self.down_memory)
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


def held_target(targets: Sequence[Mapping[str, float]], memory: int) -> dict[str, float]:
    """Per workflow of the newest target (the last of ``targets``), the largest of the last
    ``memory`` windows' targets: a rise is followed at once, a fall only once it has lasted
    ``memory`` windows."""
    last = targets[-max(1, memory):]
    return {wf: max(t.get(wf, 0.0) for t in last) for wf in last[-1]}


def hold_after(action: Action, hold_windows: int, follow: bool) -> int:
    """The count of windows below the band once a change of ``action`` is applied: 0 (a new
    hold of ``hold_windows`` before the next scale-down), except after a scale-down with
    ``follow``, where the next window below may scale down again (``hold_windows - 1``)."""
    return hold_windows - 1 if follow and action == "scale-down" else 0


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
        # the utilisation a plan may reach at the target (the demand x (1 + headroom)): the
        # band's up_utilisation applies to the demand itself; the headroom is checked on the
        # predicted latency at the target, not counted a second time on the utilisation
        cap = min(problem.options.max_utilisation, cfg.up_utilisation * (1.0 + cfg.headroom))
        self.cap = cap
        self.problem = replace(problem, options=replace(
            problem.options, max_utilisation=cap,
            latency_bound_s={w: b for w, b in self.bounds.items() if qs[w] is None},
            latency_bounds={w: pct[w] for w in self.bounds if w in pct}))
        self.capacity = self._capacity() if capacity is None else capacity
        self.forecasters = {w: RateForecaster(cfg.forecast, cfg.alpha, cfg.beta)
                            for w in problem.targets}
        self.history: dict[str, list[float]] = {w: [] for w in problem.targets}
        # per workflow, how long a request stays in the system (its predicted mean latency
        # under the running plan, at most its bound): the LLMs still serve what arrived then
        self.in_flight_s: dict[str, float] = dict(self.bounds)
        self.below = 0  # consecutive windows with every LLM below down_utilisation
        self.targets: list[dict[str, float]] = []  # every window's target, before the cap
        self.derate = 1.0  # demand multiplier learned from measured overload (module docstring)

    def _capacity(self) -> float:
        """The largest total rate (req/s, at the problem's mix) a plan on the whole cluster
        carries within the bounds and the band, placed: its max-throughput plan's rate when a
        min-cost plan places at it, else a rate at which one does, found by bisection to
        :data:`CAPACITY_TOLERANCE` below it (the aggregate max-throughput plan is an upper
        bound that need not place at the bounds' percentiles; placement is not monotone in the
        rate, so the rate found places but need not be the largest that does); inf without
        any plan."""
        p = self.problem
        form = self.config.formulation
        res = plan_and_place(replace(p, options=replace(p.options, objective=MaxThroughput.name,
                                                        current=None)), self.topology,
                             formulation=form)
        if not res.placed or res.plan.allocation is None:
            return math.inf
        base = sum(p.targets.values())
        cost = replace(p, options=replace(p.options, objective=MinCost.name, current=None))

        def places(rate: float) -> bool:
            r = plan_and_place(cost.scaled(rate / base), self.topology, formulation=form)
            return r.placed and r.plan.allocation is not None

        hi = res.plan.scale * base
        if places(hi):
            return hi
        lo = 0.8 * hi  # bracketed from above: the capacity is usually near the upper bound
        while lo > 1e-3 * hi and not places(lo):
            lo, hi = 0.8 * lo, lo
        if lo <= 1e-3 * hi:
            return math.inf
        while hi - lo > CAPACITY_TOLERANCE * hi:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if places(mid) else (lo, mid)
        return lo

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
            self.history[wf].append(observed[wf])
        measured = self._learn_derate(w, observed)
        forecast = {wf: f.peak(cfg.horizon) for wf, f in self.forecasters.items()}
        demand = self.demand(w.end_s - w.start_s)
        raw = {wf: max(MIN_RATE, x * (1.0 + cfg.headroom) * self.derate)
               for wf, x in demand.items()}
        self.targets = [*self.targets, raw][-cfg.down_memory:]
        target = held_target(self.targets, cfg.down_memory)
        held = any(target[wf] > raw[wf] for wf in raw)
        total = sum(target.values())
        capped = total > self.capacity
        if capped:  # more than the cluster carries: plan for what it carries, at this mix
            target = {wf: max(MIN_RATE, x * self.capacity / total) for wf, x in target.items()}
        seen = self._predict(self.problem, self.allocation,
                             {wf: max(MIN_RATE, r) for wf, r in observed.items()})
        self.in_flight_s = {wf: min(x, self.bounds[wf]) if math.isfinite(x) else self.bounds[wf]
                            for wf, x in seen["mean_latency_s"].items()}
        now = self._predict(self.problem, self.allocation, target)
        util, lat = now["utilisation"], now["latency_s"]
        over = sorted(m for m, u in util.items() if u > self.cap)
        late = sorted(wf for wf, x in lat.items() if x > self.bounds[wf])

        def decide(action: Action, reason: str, rp: Replan | None = None,
                   after: Mapping[str, Any] | None = None) -> Decision:
            started = rp is not None and rp.ok and bool(rp.started or rp.moved)
            return Decision(w.end_s, action, reason, observed, forecast, now, after, rp,
                            cfg.startup_s if started else 0.0, self.derate)

        spread = sorted(wf for wf in demand if self._span(wf, w.end_s - w.start_s) > 1)
        at = (f"at the forecast x {1 + cfg.headroom:g} (horizon {cfg.horizon} windows"
              + (f"; {', '.join(spread)} averaged over the requests in flight" if spread else "")
              + ")"
              + (f" x the derating {self.derate:.3g}" if self.derate > 1 else "")
              + (f", held at the largest of the last {cfg.down_memory} windows' targets"
                 if held else "") + measured
              + (f", capped at the cluster's capacity {self.capacity:.4g} req/s" if capped
                 else ""))
        if over or late:
            self.below = 0
            why = "; ".join(
                [f"{m} utilisation {util[m]:.2f} > {self.cap:.3g}" for m in over]
                + [f"{wf} latency {lat[wf]:.3g} s > bound {self.bounds[wf]:.3g} s"
                   for wf in late]) + f" {at}"
            return self._change("scale-up", why, target, decide)
        llms = self.allocation.llms
        idle = sorted(m for m, u in util.items() if u < cfg.down_utilisation
                      and (m not in llms or llms[m].replicas > 1))
        smaller = None if idle else self._smaller(target)
        if idle or smaller is not None:
            self.below += 1
            names = (", ".join(idle) if len(idle) < len(util) else "every LLM") if idle \
                else f"a plan of {smaller:g} GPUs inside the band"
            if self.below < cfg.hold_windows:
                return decide("keep", f"{names} below {cfg.down_utilisation:g} {at} for "
                              f"{self.below}/{cfg.hold_windows} windows" if idle else
                              f"{names} {at} for {self.below}/{cfg.hold_windows} windows")
            why = (f"{names} {'below ' + format(cfg.down_utilisation, 'g') + ' ' if idle else ''}"
                   f"{at} for {self.below} windows "
                   + (f"(least {min(util[m] for m in idle):.2f})" if idle else ""))
            return self._change("scale-down", why, target, decide)
        self.below = 0
        return decide("keep", f"within the band [{cfg.down_utilisation:g}, "
                      f"{self.cap:.3g}] and the latency bounds {at}")

    def _span(self, wf: str, window_s: float) -> int:
        """Windows a request of ``wf`` stays in the system: ``ceil(in_flight_s / window)``."""
        return max(1, math.ceil(self.in_flight_s.get(wf, 0.0) / window_s - 1e-9))

    def demand(self, window_s: float) -> dict[str, float]:
        """Per workflow, the request rate the LLMs will carry over the forecast horizon. A
        request keeps its LLMs busy for about its latency (``in_flight_s``: the running plan's
        predicted mean latency at the observed rates, at most the bound), so the load at a
        window is the arrival rate averaged over the last ``D = ceil(in_flight_s / window)``
        windows, observed ones and forecast ones; the demand is the largest such average over
        the next ``horizon`` windows. With ``D = 1`` it is the forecast's peak; with a longer
        ``D`` the work that arrived before a fall is still counted (no scale-down under it)
        and a rise is counted as fast as it loads the LLMs."""
        h = self.config.horizon
        out = {}
        for wf, f in self.forecasters.items():
            d = self._span(wf, window_s)
            seq = self.history[wf][-(d - 1):] if d > 1 else []
            ahead = [f.ahead(k) if self.config.trend_ahead else f.forecast(k)
                     for k in range(1, h + 1)]
            full = seq + ahead
            out[wf] = max(math.fsum(full[max(0, i - d + 1):i + 1]) / min(d, i + 1)
                          for i in range(len(seq), len(full)))
        return out

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

    def _smaller(self, target: Mapping[str, float]) -> float | None:
        """The GPUs of the running plan shrunk in place (:meth:`_shrunk`) at ``target``, when
        that uses fewer than the running plan."""
        new = self._shrunk(target)
        return None if new is None else round(new.gpus(), 6)

    def _shrunk(self, target: Mapping[str, float]) -> Allocation | None:
        """The running plan with replicas removed while every LLM stays at or below
        the cap and every workflow within ``down_latency`` x its bound at
        ``target`` (:func:`scepsy_serve.control.shrink.shrink`: the shapes kept, nothing
        started), when that frees a GPU share; None otherwise."""
        cfg = self.config

        def fits(a: Allocation) -> bool:
            p = self._predict(self.problem, a, target)
            return (all(u <= self.cap for u in p["utilisation"].values())
                    and all(x <= cfg.down_latency * self.bounds[wf]
                            for wf, x in p["latency_s"].items()))

        new = shrink(self.allocation, fits)
        return new if new.gpus() < self.allocation.gpus() - 1e-9 else None

    def _grown(self, target: Mapping[str, float]) -> Replan | None:
        """The running plan with replicas of its shapes added (:func:`~scepsy_serve.control.
        inplace.grow`: the LLM whose replica leaves the least excess utilisation and latency
        first) until every LLM is at or below the cap and every workflow within its
        bound at ``target``, within the cluster's GPUs, placed around the running replicas;
        None when the running shapes do not get there."""

        def excess(a: Allocation) -> tuple[float, bool]:
            p = self._predict(self.problem, a, target)
            over = math.fsum(max(0.0, u - self.cap) for u in p["utilisation"].values())
            late = math.fsum(min(1e3, max(0.0, x / self.bounds[wf] - 1.0)) if x == x else 1e3
                             for wf, x in p["latency_s"].items())
            return over + late, over <= 0 and late <= 0

        new = grow(self.allocation, lambda a: excess(a)[1], lambda a: excess(a)[0],
                   float(self.topology.total_gpus))
        if new is None:
            return None
        return in_place(self.problem, self.topology, self._placed, new, target)

    def _change(self, action: Action, why: str, target: Mapping[str, float],
                decide: Any) -> Decision:
        """The change for ``action`` at ``target`` (module docstring): a scale-down removes
        replicas in place (:meth:`_shrunk`); a scale-up re-plans first among the running
        shapes, preferring a plan that resizes every LLM in place (replica counts change, no
        running replica restarts; :meth:`_grown` where the re-plan changes a shape), within the
        bounds, then in new shapes and, failing those, at the lowest latency on the cluster."""
        cfg = self.config
        events = [LoadChanged(wf, target=t) for wf, t in sorted(target.items())]
        form = cfg.formulation
        run = self.allocation.llms.values()

        def within(p: PlanningProblem) -> PlanningProblem:
            return replace(p, options=replace(
                p.options, shares=tuple(sorted({i.share for i in run})),
                tps=tuple(sorted({i.tp for i in run}))))

        if action == "scale-down":  # in place: fewer replicas of the running shapes
            small = self._shrunk(target)
            down = None if small is None else in_place(self.problem, self.topology,
                                                       self._placed, small, target)
            if small is None or down is None:
                return decide("keep", f"{why}; no smaller plan of the running shapes within "
                              f"{cfg.down_latency:g} x the bound", None)
            return decide(action, f"{why}; resized in place: 0 started, {len(down.stopped)} "
                          f"stopped, {self.allocation.gpus():g} -> {small.gpus():g} GPUs", down,
                          self._predict(self.problem, small, target))
        # groups of (problem, note), tried in order; within a group a plan that keeps every
        # running LLM's shape (resized in place: counts change, no running replica restarts)
        # wins over one that changes an LLM's shape (its replicas restart), else the first
        # plan found: at the bounds, then (no plan meets them) at the lowest latency
        groups = [[(within(self.problem), ""), (self.problem, " (new shapes)")]]
        if objective(cfg.objective).mean_bounds:
            note = " (no plan meets the latency bounds: the lowest latency on the cluster)"
            groups.append([(replace(b, options=replace(b.options, latency_bound_s={},
                                                       latency_bounds={})), note)
                           for b in (within(self.problem), self.problem)])
        rp: Replan | None = None
        last: Replan | None = None
        note = ""
        for gi, group in enumerate(groups):
            found: list[tuple[Replan, str]] = []
            for p, why_note in group:
                last = replan(p, self.topology, self._placed, events,
                              objective=MinLatency.name if gi else cfg.objective,
                              formulation=form)
                if last.ok:
                    found.append((last, why_note))
                    if not self._reshaped(last):
                        break
            if found:
                rp, note = next(((r, n) for r, n in found if not self._reshaped(r)), found[0])
                if self._reshaped(rp):
                    up = self._grown(target) if gi == 0 else None
                    if up is not None:  # the running shapes carry it: no replica restarts
                        rp, note = up, " (resized in place: the re-plan changed a shape)"
                    else:
                        note += " (an LLM changes shape: its replicas restart)"
                break
        if rp is None:
            assert last is not None
            return decide("replan-failed", f"{why}; re-plan {last.status}: "
                          f"{last.placed.reason or 'no plan'}", last)
        if rp.placed.plan.allocation is None:
            return decide("replan-failed", f"{why}; re-plan {rp.status}: "
                          f"{rp.placed.reason or 'no plan'}", rp)
        new = rp.placed.plan.allocation
        after = self._predict(self.problem, new, target)
        if note.startswith(" (no plan meets") and new.gpus() <= self.allocation.gpus() + 1e-9:
            return decide("keep", f"{why}; no plan meets the latency bounds and the lowest "
                          "latency on the cluster adds no GPU: no replica starts for it", None)
        if not (rp.started or rp.stopped or rp.moved):
            return decide("keep", f"{why}; the re-plan keeps the running plan", None)
        return decide(action, f"{why}; re-plan: {len(rp.started)} started, {len(rp.stopped)} "
                      f"stopped, {len(rp.moved)} moved, {self.allocation.gpus():g} -> "
                      f"{new.gpus():g} GPUs{note}", rp, after)

    def _reshaped(self, rp: Replan) -> bool:
        """Whether ``rp`` changes the instance shape (GPU, TP, share, memory) of an LLM that
        runs now: all its running replicas would restart."""
        new = rp.placed.plan.allocation
        if new is None:
            return False
        old = self.allocation.llms
        return any(m in old and (i.gpu, i.tp, i.share, i.memory_share) != (
            old[m].gpu, old[m].tp, old[m].share, old[m].memory_share)
            for m, i in new.llms.items())

    def commit(self, d: Decision) -> None:
        """The change of ``d`` was applied: its plan becomes the running one (a decision
        without one changes nothing)."""
        if d.replan is not None and d.replan.ok and d.action in ("scale-up", "scale-down"):
            self._placed = d.replan.placed
            self.below = hold_after(d.action, self.config.hold_windows,
                                    self.config.down_follow)
