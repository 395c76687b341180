"""``scepsy bench control``: control policies compared in the simulator under loads that move
(docs/bench-control.md).

A paper workflow (``datasets/workflows``, the roofline and catalog ``scepsy bench paper`` uses)
on a cluster of ``gpus`` GPUs, under **rate profiles** over ``windows`` windows of ``window_s``:

* ``ramp``: from a quarter of the peak up to the peak over the first two thirds, then flat;
* ``daily``: a compressed daily cycle, ``0.625 − 0.375·cos(2π(k + ½)/n)`` of the peak (trough a
  quarter of the peak, one cycle over the run);
* ``bursts``: 0.4 of the peak with three bursts to the peak of two windows each;
* ``mooncake``: the arrival times of Mooncake's conversation trace
  (``../shared/data/request-traces/mooncake/conversation_trace.jsonl``), compressed onto the run
  and thinned (seeded) so that its busiest window carries the peak (skipped, with a note, when
  the file is not there).

The **peak** is :data:`PEAK_FRACTION` of the cluster's predicted capacity at the workload's
mix (its max-throughput plan); each workflow's **latency bound** is on its p90 request latency:
:data:`BOUND_FACTOR` times its predicted p90 under the min-latency plan at the peak on the whole
cluster. Every plan (the static ones, the controller's) bounds the predicted p90 by it
(``PlanOptions.latency_bounds``), and the SLO attainment counts the requests within it.
Arrivals of the other profiles are a piecewise-constant Poisson process (seeded); each arrival
is a workflow drawn by the mix.

**Policies**, each an allocation schedule the simulator replays (``changes=``; a replica
started at a decision at ``t`` serves from ``t + startup_s``):

* ``static-mean``: the min-cost plan within the bounds for the profile's mean rate, all along;
* ``static-peak``: the same for its peak window's rate;
* ``per-llm-autoscale``: from the static-mean plan, each LLM's replica count follows its own
  utilisation (``load / (replicas·μ)`` at the last window's rate, what its own metrics show),
  with the controller's band and hold: above ``up_utilisation`` it grows, below
  ``down_utilisation`` for ``hold_windows`` windows it shrinks, to the count that puts it at
  ``up_utilisation / (1 + headroom)`` (the controller's set point), within the cluster's GPUs;
  no forecast, no workflow view, shapes fixed;
* ``scepsy-control``: :class:`scepsy_serve.control.core.Controller` from the static-mean plan,
  one decision per window from the windows seen so far.

**Metrics** over every arrival: ``p90_latency_s`` (a request not complete when the run stops
counts with its time so far, a lower bound), ``slo_attainment`` (completed within its
workflow's bound), ``gpu_hours`` (``tp·share`` of every replica over the time it was up within
the profile, from the simulator's ``replica_spans``, a starting replica counted from the
decision), ``moves`` (replicas started, stopped and moved) and ``lost_requests`` (not complete
:data:`DRAIN_WINDOWS` windows after the last arrival). ``scepsy-control`` is also run with the
LAS priority (``priority``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.arrivals import Arrivals, Recorded, load_arrivals, load_recorded
from scepsy_opt.cluster import uniform_cluster
from scepsy_opt.planning.objectives import objective as kind
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.prediction.pipeline import predict
from scepsy_opt.prediction.schedule import AllocationChange
from scepsy_opt.prediction.simulate import simulate
from scepsy_opt.stats import workflow_stats
from scepsy_opt.traces import validate_calls
from scepsy_opt.workflows import PROGRAMS, Distribution, Param, WorkflowSpec, generate_trace
from scepsy_opt.workload import models_of, resolve_rates, specs_and_rates, workload_trace
from scepsy_place.formulations.loop import Formulation, PlacedPlan, plan_and_place
from scepsy_place.packing.topology import Topology, from_cluster
from scepsy_profile.catalog import default_catalog
from scepsy_profile.roofline import roofline_model
from scepsy_serve.control.core import ControlConfig, Controller, WindowStats
from scepsy_serve.control.forecast import FORECASTS, forecast_error

PROFILES = ("daily", "ramp", "bursts", "mooncake")
ARRIVALS = "arrivals"  # the profile of --arrivals FILE
POLICIES = ("static-mean", "static-peak", "per-llm-autoscale", "scepsy-control")
HEADLINE = "daily"  # the profile of the top-level "policies" table
PEAK_FRACTION = 0.8
BOUND_FACTOR = 1.5
PERCENTILE = 90.0  # the latency bound is on this percentile of a workflow's request latency
DRAIN_WINDOWS = 5
LOST_BOUNDS = 2.0  # the drain lasts at least this many times the largest latency bound
GPUS_PER_NODE = 8
TPS = (1, 2, 4, 8)
FORMULATION: Formulation = "aggregate"  # every plan: the aggregate MILP placed (no time-limited search)
MOONCAKE = Path("request-traces") / "mooncake" / "conversation_trace.jsonl"

Say = Callable[[str], None]


@dataclass(frozen=True)
class BenchOptions:
    """What one run covers (``quick``: the CI size)."""

    workflow: str = "rag-beam"
    gpu: str = "H100-80GB"
    gpus: int = 16
    profiles: tuple[str, ...] = PROFILES
    windows: int = 24
    window_s: float = 30.0
    startup_s: float = 60.0
    seed: int = 0
    trace_requests: int = 200
    time_limit_s: float = 30.0  # a safety net: the aggregate MILPs finish well within it
    shared_data: Path | None = None  # the folder holding request-traces/ (../shared/data)
    workflows_dir: Path | None = None  # datasets/workflows of the checkout
    priority: bool = True  # scepsy-control once more under LAS
    arrivals: Path | None = None  # a recorded trace (scepsy_opt.arrivals.load_recorded)

    def __post_init__(self) -> None:
        src = "bench control"
        bad = [p for p in self.profiles if p not in PROFILES]
        if bad or not (self.profiles or self.arrivals is not None):
            raise InputError(src, "profiles", f"profiles among {', '.join(PROFILES)}",
                             ",".join(self.profiles))
        if not (isinstance(self.gpus, int) and self.gpus >= 1):
            raise InputError(src, "gpus", "a number of GPUs >= 1", self.gpus)
        if not (isinstance(self.windows, int) and self.windows >= 4):
            raise InputError(src, "windows", "a number of windows >= 4", self.windows)
        for name in ("window_s", "time_limit_s"):
            x = getattr(self, name)
            if not (math.isfinite(x) and x > 0):
                raise InputError(src, name, "seconds > 0", x)
        if not (math.isfinite(self.startup_s) and self.startup_s >= 0):
            raise InputError(src, "startup_s", "seconds >= 0", self.startup_s)


QUICK = BenchOptions(profiles=("daily",), windows=24, trace_requests=150,
                     priority=True)


# ------------------------------------------------------------------------------ setting up


@dataclass(frozen=True)
class Setup:
    """The workflow's problem at 1 req/s in total (its mix), the cluster, the trace the
    simulator replays, the peak rate and the latency bounds."""

    problem: PlanningProblem
    topology: Topology
    trace: Any
    models: Mapping[str, str]
    peak: float  # req/s in total
    bounds: Mapping[str, float]

    @property
    def mix(self) -> dict[str, float]:
        total = sum(self.problem.targets.values())
        return {w: t / total for w, t in self.problem.targets.items()}


def workflows_dir(opts: BenchOptions) -> Path:
    """The folder of the workflows (``datasets/workflows`` of the checkout by default)."""
    if opts.workflows_dir is not None:
        return opts.workflows_dir
    return Path(__file__).resolve().parents[3] / "datasets" / "workflows"


def setup(opts: BenchOptions, recorded: Recorded | None = None) -> Setup:
    """The problem (the bundled catalog, the roofline, the TP degrees the workflow's models
    support, as ``scepsy bench paper``), the peak and the bounds; with a ``recorded`` trace
    that has token lengths, the workflows' requests take them (:func:`token_source`)."""
    folder = workflows_dir(opts)
    names = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
    if opts.workflow not in names:
        raise InputError("--workflow", "", f"the name of a workflow of {folder} "
                         f"({', '.join(names) if names else 'none: it needs a source checkout'})",
                         opts.workflow)
    path = folder / f"{opts.workflow}.yaml"
    specs, file_rates = specs_and_rates(path)
    rates = resolve_rates(specs, 1.0, file_rates, "targets")
    models = models_of(specs)
    cat = default_catalog()
    tps = tuple(t for t in TPS if any(cat.model(m).supports_tp(t) for m in models.values()))
    if recorded is not None and (recorded.input_tokens is not None
                                 or recorded.output_tokens is not None):
        trace = validate_calls(tuple(
            c for i, sp in enumerate(specs)
            for c in generate_trace(sp, opts.trace_requests, seed=opts.seed + i,
                                    token_source=token_source(sp, recorded))))
    else:
        trace = workload_trace(specs, requests=opts.trace_requests, seed=opts.seed)
    cluster = uniform_cluster(opts.gpu, opts.gpus, min(GPUS_PER_NODE, opts.gpus),
                              f"{opts.gpu}x{opts.gpus}")
    topology = from_cluster(cluster)
    stats = {sp.name: workflow_stats(trace, sp.name, seed=opts.seed) for sp in specs}
    problem = PlanningProblem(stats, models, rates, topology.to_cluster(), roofline_model(),
                              PlanOptions(time_limit_s=opts.time_limit_s, tps=tps))
    mt = plan_and_place(_with(problem, "max-throughput"), topology, formulation=FORMULATION)
    if not mt.placed or mt.plan.allocation is None:
        raise InputError("bench control", "cluster", f"a cluster that carries {opts.workflow}",
                         mt.status)
    peak = PEAK_FRACTION * mt.plan.scale * sum(problem.targets.values())
    at_peak = problem.scaled(peak / sum(problem.targets.values()))
    ml = plan_and_place(_with(at_peak, "min-latency"), topology, formulation=FORMULATION)
    if not ml.placed or ml.plan.allocation is None:
        raise InputError("bench control", "cluster", "a min-latency plan at the peak", ml.status)
    lat = _predict(at_peak, ml.plan.allocation, at_peak.targets)["p90_latency_s"]
    bounds = {w: BOUND_FACTOR * x for w, x in lat.items()}
    problem = replace(problem, options=replace(problem.options, latency_bounds={
        w: (PERCENTILE, b) for w, b in bounds.items()}))
    return Setup(problem, topology, trace, models, peak, bounds)


OUTPUT_PARAMS = ("answer_tokens", "output_tokens")
"""A program's param that is its request's final answer (the first of these it requires)."""


def token_source(spec: WorkflowSpec, recorded: Recorded) -> dict[str, Param]:
    """The params a recorded trace's lengths replace in ``spec``: its prompt (the first param
    its program requires) takes the recorded input lengths, its answer (:data:`OUTPUT_PARAMS`)
    the output lengths, each resampled from the trace and scaled so that its mean stays the
    workflow's (a chat prompt is not a RAG query: the trace gives the spread, the workflow the
    scale), within the param's own ``min``/``max``."""
    required = PROGRAMS[spec.program].required_params
    out: dict[str, Param] = {}
    picks = [(required[0] if required else None, recorded.input_tokens),
             (next((p for p in OUTPUT_PARAMS if p in required), None), recorded.output_tokens)]
    for name, values in picks:
        if name is None or values is None or name in out:
            continue
        old = spec.params[name]
        mean = old.mean() if isinstance(old, Distribution) else float(old)
        lo, hi = (old.min, old.max) if isinstance(old, Distribution) else (None, None)
        out[name] = Distribution.empirical(np.asarray(values) * (mean / float(np.mean(values))),
                                           min=lo, max=hi)
    return out


def _with(problem: PlanningProblem, objective: str) -> PlanningProblem:
    return replace(problem, options=replace(problem.options, objective=objective,  # type: ignore[arg-type]
                                            latency_bounds={} if not kind(objective).mean_bounds
                                            else problem.options.latency_bounds))


def _predict(problem: PlanningProblem, alloc: Allocation,
             rates: Mapping[str, float]) -> dict[str, Any]:
    p = predict(problem.stats, problem.models, alloc, problem.latency, dict(rates),
                catalog=problem.catalog, policy=problem.policy)
    return {"latency_s": {w: x.mean_latency_s for w, x in p.workflows.items()},
            "p90_latency_s": {w: x.p90_latency_s for w, x in p.workflows.items()},
            "utilisation": {m: x.utilisation for m, x in p.llms.items()},
            "load": {m: x.utilisation * x.replicas * x.mu for m, x in p.llms.items()},
            "mu": {m: x.mu for m, x in p.llms.items()}}


def min_cost_plan(s: Setup, total_rate: float) -> PlacedPlan:
    """The cheapest placed plan within the bounds at ``total_rate`` req/s (the mix); the
    min-latency plan on the whole cluster when none meets the bounds."""
    p = s.problem.scaled(total_rate / sum(s.problem.targets.values()))
    res = plan_and_place(_with(p, "min-cost"), s.topology, formulation=FORMULATION)
    if not res.placed:
        res = plan_and_place(_with(p, "min-latency"), s.topology, formulation=FORMULATION)
    if not res.placed or res.plan.allocation is None:
        raise InputError("bench control", "cluster", f"a plan for {total_rate:.3g} req/s",
                         res.status)
    return res


# -------------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class Profile:
    """Arrival times (s) over ``windows`` windows, and the nominal rate of each window."""

    name: str
    times_s: tuple[float, ...]
    rates: tuple[float, ...]  # req/s per window (nominal; mooncake: the thinned trace's)
    note: str = ""


def multipliers(name: str, n: int) -> list[float]:
    """The fraction of the peak of each of ``n`` windows (module docstring)."""
    if name == "ramp":
        rise = max(1, round(2 * n / 3))
        return [0.25 + 0.75 * min(1.0, k / (rise - 1 if rise > 1 else 1)) for k in range(n)]
    if name == "daily":
        return [0.625 - 0.375 * math.cos(2 * math.pi * (k + 0.5) / n) for k in range(n)]
    if name == "bursts":
        out = [0.4] * n
        for start in (n // 6, n // 2, (5 * n) // 6):
            for k in (start, start + 1):
                if k < n:
                    out[k] = 1.0
        return out
    raise InputError("bench control", "profile", f"one of {', '.join(PROFILES[:3])}", name)


def poisson_profile(name: str, peak: float, n: int, window_s: float, seed: int) -> Profile:
    """Seeded Poisson arrivals at :func:`multipliers` ``x peak``, constant within a window."""
    return rate_profile(name, [peak * f for f in multipliers(name, n)], window_s,
                        [seed, PROFILES.index(name)])


def rate_profile(name: str, rates: Sequence[float], window_s: float,
                 seed: int | Sequence[int]) -> Profile:
    """Seeded Poisson arrivals at ``rates[k]`` req/s within window ``k``."""
    rng = np.random.default_rng(seed)
    times: list[float] = []
    for k, r in enumerate(rates):
        c = int(rng.poisson(r * window_s))
        times += sorted((k * window_s + rng.uniform(0.0, window_s, c)).tolist())
    return Profile(name, tuple(times), tuple(float(r) for r in rates))


def mooncake_profile(path: Path, peak: float, n: int, window_s: float,
                     seed: int) -> Profile:
    """Mooncake's arrival times compressed onto ``n`` windows, thinned so that the busiest
    window's rate is ``peak``."""
    return recorded_profile("mooncake", load_arrivals(path), peak, n, window_s, seed)


def recorded_profile(name: str, arr: Arrivals, peak: float, n: int, window_s: float,
                     seed: int) -> Profile:
    """Recorded arrival times compressed (or stretched) onto ``n`` windows, thinned (seeded)
    so that the busiest window's rate is at most ``peak``."""
    path = Path(arr.source or name)
    span = n * window_s
    t = np.asarray(arr.times_s) * (span / max(arr.span_s, 1e-9))
    t = t[t < span]
    counts = np.bincount(np.minimum((t // window_s).astype(int), n - 1), minlength=n)
    keep = min(1.0, peak * window_s / max(1, counts.max()))
    named = (*PROFILES, ARRIVALS)
    rng = np.random.default_rng([seed, named.index(name) if name in named else len(named)])
    t = t[rng.uniform(size=len(t)) < keep]
    counts = np.bincount(np.minimum((t // window_s).astype(int), n - 1), minlength=n)
    return Profile(name, tuple(float(x) for x in t),
                   tuple(float(c) / window_s for c in counts),
                   note=f"{arr.count} arrivals of {path.name} over {arr.span_s:.0f} s, "
                        f"compressed {arr.span_s / span:.3g}x and thinned to {keep:.3g}")


def window_counts(times: Sequence[float], n: int, window_s: float) -> list[int]:
    """Arrivals per window (those after the last window's end count in it)."""
    idx = np.minimum((np.asarray(times, dtype=float) // window_s).astype(int), n - 1)
    return np.bincount(idx, minlength=n).tolist() if len(idx) else [0] * n


# -------------------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class Step:
    """One LLM's instance from ``at_s`` on, decided at ``decided_s`` (``at_s − decided_s``: the
    start-up of what it adds)."""

    decided_s: float
    at_s: float
    llm: str
    instance: Instance


@dataclass(frozen=True)
class Schedule:
    """A policy's allocation over the run: the first allocation, its steps, moves, decisions."""

    initial: Allocation
    steps: tuple[Step, ...]
    moves: int
    decisions: tuple[dict[str, Any], ...] = ()


def compile_schedule(s: Schedule, end_s: float) -> tuple[list[AllocationChange], float]:
    """The simulator's changes (full allocations at each time; one LLM's steps kept in the
    order decided) and the GPU-seconds of replicas starting (from the decision until they are
    up, within ``end_s``)."""
    cur = dict(s.initial.llms)
    last: dict[str, float] = {}
    steps = []
    for st in s.steps:  # an LLM's later decision never takes effect before its earlier one
        at = max(st.at_s, last.get(st.llm, 0.0))
        last[st.llm] = at
        steps.append(replace(st, at_s=at))
    steps.sort(key=lambda st: st.at_s)
    out: list[AllocationChange] = []
    starting = 0.0
    for st in steps:
        old = cur[st.llm]
        same = _shape(old) == _shape(st.instance)
        added = max(0, st.instance.replicas - old.replicas) if same else st.instance.replicas
        gpus = st.instance.tp * st.instance.share
        starting += added * gpus * max(0.0, min(st.at_s, end_s) - min(st.decided_s, end_s))
        cur[st.llm] = st.instance
        alloc = Allocation(dict(cur), "schedule")
        if out and abs(out[-1].at_s - st.at_s) < 1e-12:
            out[-1] = AllocationChange(st.at_s, alloc)
        else:
            out.append(AllocationChange(st.at_s, alloc))
    return out, starting


def static_schedule(plan: PlacedPlan) -> Schedule:
    """The plan's allocation all along."""
    assert plan.plan.allocation is not None
    return Schedule(plan.plan.allocation, (), 0)


def _observed(counts: Sequence[int], k: int, window_s: float,
              mix: Mapping[str, float]) -> dict[str, float]:
    total = counts[k] / window_s
    return {w: total * f for w, f in mix.items()}


def autoscale_schedule(s: Setup, start: PlacedPlan, counts: Sequence[int], window_s: float,
                       cfg: ControlConfig) -> Schedule:
    """``per-llm-autoscale`` (module docstring)."""
    assert start.plan.allocation is not None
    alloc = start.plan.allocation
    cur = dict(alloc.llms)
    below = dict.fromkeys(cur, 0)
    setpoint = cfg.up_utilisation / (1.0 + cfg.headroom)
    budget = float(s.topology.total_gpus)
    steps: list[Step] = []
    moves = 0
    for k in range(len(counts)):
        t = (k + 1) * window_s
        rates = _observed(counts, k, window_s, s.mix)
        if not any(r > 0 for r in rates.values()):
            continue
        pred = _predict(s.problem, Allocation(dict(cur), "autoscale"), rates)
        for m in sorted(cur, key=lambda m: -pred["utilisation"].get(m, 0.0)):
            u = pred["utilisation"].get(m, 0.0)
            inst = cur[m]
            want = inst.replicas
            if u > cfg.up_utilisation:
                below[m] = 0
                want = _replicas(pred["load"][m], pred["mu"][m], setpoint)
            elif u < cfg.down_utilisation:
                below[m] += 1
                if below[m] >= cfg.hold_windows:
                    want = _replicas(pred["load"][m], pred["mu"][m], setpoint)
            else:
                below[m] = 0
            if want > inst.replicas:  # within the cluster's GPUs
                per = inst.tp * inst.share
                used = sum(i.tp * i.share * i.replicas for i in cur.values())
                want = min(want, inst.replicas + int((budget - used + 1e-9) // per))
            if want == inst.replicas:
                continue
            if want < inst.replicas:
                below[m] = 0
            new = replace(inst, replicas=want)
            delay = cfg.startup_s if want > inst.replicas else 0.0
            steps.append(Step(t, t + delay, m, new))
            moves += abs(want - inst.replicas)
            cur[m] = new
    return Schedule(alloc, tuple(steps), moves)


def _replicas(load: float, mu: float, setpoint: float) -> int:
    return max(1, math.ceil(load / (setpoint * mu) - 1e-9)) if mu > 0 else 1


def resize_steps(before: Allocation, after: Allocation, at_s: float,
                 startup_s: float) -> list[Step]:
    """The steps of a re-plan decided at ``at_s``, LLM by LLM, resized in place: an LLM
    whose shape is kept and whose count only falls drains its highest-index replicas at
    ``at_s`` (the others keep serving); one that adds replicas of its shape adds them at
    ``at_s + startup_s`` (the others keep serving meanwhile); one whose shape changes keeps
    every old replica serving until its new ones are up at ``at_s + startup_s``, and only then
    drains them (no replica drains before its replacement is healthy). An LLM the re-plan
    leaves alone has no step."""
    out = []
    for m, inst in sorted(after.llms.items()):
        old = before.llms.get(m)
        if old == inst:
            continue
        shrink = old is not None and _shape(old) == _shape(inst) and inst.replicas < old.replicas
        out.append(Step(at_s, at_s if shrink else at_s + startup_s, m, inst))
    return out


def _shape(i: Instance) -> tuple[Any, ...]:
    return (i.gpu, i.tp, i.share, i.memory_share)


def control_schedule(s: Setup, start: PlacedPlan, counts: Sequence[int], window_s: float,
                     cfg: ControlConfig) -> Schedule:
    """``scepsy-control``: the controller's decisions, one per window."""
    ctl = Controller(s.problem, s.topology, start, cfg)
    assert start.plan.allocation is not None
    steps: list[Step] = []
    moves = 0
    log: list[dict[str, Any]] = []
    for k in range(len(counts)):
        w = WindowStats(k * window_s, (k + 1) * window_s,
                        _observed(counts, k, window_s, s.mix))
        d = ctl.observe(w)
        log.append(d.to_dict())
        alloc = d.allocation
        if alloc is not None and d.action in ("scale-up", "scale-down"):
            steps += resize_steps(ctl.allocation, alloc, d.at_s, d.startup_s)
            moves += d.moves
        ctl.commit(d)
    return Schedule(start.plan.allocation, tuple(steps), moves, tuple(log))


# ------------------------------------------------------------------------------- simulating


def run_policy(s: Setup, prof: Profile, sched: Schedule, opts: BenchOptions,
               priority: str = "fcfs") -> dict[str, Any]:
    """Simulate ``sched`` under ``prof`` and measure it (module docstring)."""
    n, ws = opts.windows, opts.window_s
    end = n * ws
    changes, starting = compile_schedule(sched, end)
    p = s.problem
    extra: dict[str, Any] = {} if p.policy is None else {"policy": p.policy}
    res = simulate(s.trace, s.models, sched.initial, p.latency, dict(p.targets),
                   seed=opts.seed, arrival_times_s=list(prof.times_s), warmup_fraction=0.0,
                   drain_s=drain_s(s, ws), changes=changes,
                   priority=priority, catalog=p.catalog, **extra)  # type: ignore[arg-type]
    stop = res.end_s
    lat, ok, lost = [], 0, 0
    per_window: list[list[float]] = [[] for _ in range(n)]
    for r in res.requests:
        x = r.latency_s
        if x is None:
            lost += 1
            x = stop - r.arrival_s
        elif x <= s.bounds[r.workflow] + 1e-12:
            ok += 1
        lat.append(x)
        per_window[min(n - 1, int(r.arrival_s // ws))].append(x)
    gsec = starting
    for sp in res.replica_spans:
        down = end if sp.down_s is None else min(sp.down_s, end)
        gsec += sp.instance.tp * sp.instance.share * max(0.0, down - min(sp.up_s, end))
    gpus_t = []
    for k in range(n):
        mid = (k + 0.5) * ws
        gpus_t.append(sum(sp.instance.tp * sp.instance.share for sp in res.replica_spans
                          if sp.up_s <= mid and (sp.down_s is None or sp.down_s > mid)))
    return {"p90_latency_s": _q(lat, 0.9), "slo_attainment": ok / len(lat) if lat else math.nan,
            "gpu_hours": gsec / 3600.0, "moves": int(sched.moves), "lost_requests": lost,
            "requests": len(lat),
            "series": {"gpus": [round(g, 6) for g in gpus_t],
                       "p90_latency_s": [_q(v, 0.9) for v in per_window]}}


def drain_s(s: Setup, window_s: float) -> float:
    """How long a run goes on after its last arrival (no new arrivals, the last allocation
    serving): :data:`DRAIN_WINDOWS` windows, and at least twice the largest latency bound, so
    that a request that meets its bound always completes within the run. A request still not
    complete then is lost."""
    return max(DRAIN_WINDOWS * window_s, LOST_BOUNDS * max(s.bounds.values(), default=0.0))


def _q(xs: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs, dtype=float), q)) if len(xs) else math.nan


# --------------------------------------------------------------------------------- the run


def run(opts: BenchOptions, say: Say | None = None) -> dict[str, Any]:
    """The whole comparison (module docstring) as JSON-ready data: ``policies`` (the headline
    profile), ``profiles`` (every profile and policy), ``forecast`` (MAPE per profile),
    ``priority`` (FCFS against LAS), ``setup`` and ``notes``."""
    say = say or (lambda _s: None)
    recorded = None if opts.arrivals is None else load_recorded(opts.arrivals)
    s = setup(opts, recorded)
    say(f"{opts.workflow} on {opts.gpus} {opts.gpu}: peak {s.peak:.3g} req/s, bounds "
        + ", ".join(f"{w} {b:.3g} s" for w, b in sorted(s.bounds.items())))
    cfg = ControlConfig(window_s=opts.window_s, startup_s=opts.startup_s)
    n, ws = opts.windows, opts.window_s
    notes: list[str] = []
    profiles: dict[str, dict[str, Any]] = {}
    forecast: dict[str, dict[str, float]] = {}
    priority: dict[str, dict[str, Any]] = {}
    plans: dict[float, PlacedPlan] = {}

    def plan_at(rate: float) -> PlacedPlan:
        key = round(rate, 9)
        if key not in plans:
            plans[key] = min_cost_plan(s, rate)
        return plans[key]

    names = opts.profiles + ((ARRIVALS,) if recorded is not None else ())
    for name in names:
        if name == ARRIVALS:
            assert recorded is not None
            prof = recorded_profile(ARRIVALS, recorded.arrivals, s.peak, n, ws, opts.seed)
            lengths = [k for k, v in (("input", recorded.input_tokens),
                                      ("output", recorded.output_tokens)) if v is not None]
            prof = replace(prof, note=prof.note + "; " + (
                f"{' and '.join(lengths)} lengths from the trace" if lengths
                else "lengths from the workflows (the trace has none)"))
        elif name == "mooncake":
            path = (opts.shared_data or Path()) / MOONCAKE
            if opts.shared_data is None or not path.is_file():
                notes.append(f"mooncake skipped: {path} not found")
                say(notes[-1])
                continue
            prof = mooncake_profile(path, s.peak, n, ws, opts.seed)
        else:
            prof = poisson_profile(name, s.peak, n, ws, opts.seed)
        counts = window_counts(prof.times_s, n, ws)
        rates = [c / ws for c in counts]
        mean, peak = float(np.mean(rates)), float(max(rates))
        forecast[name] = {**{k: _round(forecast_error(rates, k)) for k in FORECASTS},
                          **{f"{k}_at_horizon": _round(forecast_error(rates, k,
                                                                      horizon=cfg.horizon))
                             for k in FORECASTS}, "horizon": cfg.horizon}
        mean_plan = plan_at(mean)
        scheds = {"static-mean": static_schedule(mean_plan),
                  "static-peak": static_schedule(plan_at(peak)),
                  "per-llm-autoscale": autoscale_schedule(s, mean_plan, counts, ws, cfg),
                  "scepsy-control": control_schedule(s, mean_plan, counts, ws, cfg)}
        rows: dict[str, Any] = {}
        for pol in POLICIES:
            rows[pol] = run_policy(s, prof, scheds[pol], opts)
            say(f"{name} {pol}: " + ", ".join(f"{k} {_round(v)}" for k, v in rows[pol].items()
                                              if k != "series"))
        if opts.priority:
            las = run_policy(s, prof, scheds["scepsy-control"], opts, priority="las")
            priority[name] = {"fcfs": _metrics(rows["scepsy-control"]), "las": _metrics(las)}
        profiles[name] = {"rates": [_round(r) for r in rates], "mean_rate": _round(mean),
                          "peak_rate": _round(peak), "note": prof.note,
                          "policies": {p: _metrics(r) for p, r in rows.items()},
                          "series": {p: r["series"] for p, r in rows.items()},
                          "decisions": list(scheds["scepsy-control"].decisions)}
    if not profiles:
        raise InputError("bench control", "profiles", "a profile that can run", ",".join(
            opts.profiles))
    head = HEADLINE if HEADLINE in profiles else next(iter(profiles))
    return _finite({
        "policies": profiles[head]["policies"],
        "headline_profile": head,
        "profiles": profiles, "forecast": forecast, "priority": priority,
        "setup": {"workflow": opts.workflow, "gpu": opts.gpu, "gpus": opts.gpus,
                  "windows": n, "window_s": ws, "startup_s": opts.startup_s,
                  "seed": opts.seed, "peak_rate": _round(s.peak),
                  "arrivals": None if opts.arrivals is None else str(opts.arrivals),
                  "drain_s": _round(drain_s(s, ws)),
                  "latency_bounds_s": {w: _round(b) for w, b in sorted(s.bounds.items())},
                  "mix": {w: _round(f) for w, f in sorted(s.mix.items())},
                  "control": {"forecast": cfg.forecast, "alpha": cfg.alpha, "beta": cfg.beta,
                              "headroom": cfg.headroom, "up_utilisation": cfg.up_utilisation,
                              "down_utilisation": cfg.down_utilisation,
                              "hold_windows": cfg.hold_windows, "horizon": cfg.horizon,
                              "objective": cfg.objective}},
        "notes": notes})


def _metrics(r: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _round(r[k]) if isinstance(r[k], float) else r[k]
            for k in ("p90_latency_s", "slo_attainment", "gpu_hours", "moves", "lost_requests")}


def _round(x: float) -> float:
    return float(f"{x:.6g}") if isinstance(x, float) and math.isfinite(x) else x


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return _round(x) if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def figures(result: Mapping[str, Any], folder: Path) -> list[Path]:
    """Per profile, one PNG over time: the rate, each policy's GPUs and its p90 latency per
    window (matplotlib's Agg backend, no timestamps: the same result gives the same bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    ws = result["setup"]["window_s"]
    for name, prof in result["profiles"].items():
        fig, ax = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
        t = [(k + 0.5) * ws for k in range(len(prof["rates"]))]
        ax[0].step(t, prof["rates"], where="mid", color="black")
        ax[0].set_ylabel("req/s")
        for pol, series in prof["series"].items():
            ax[1].step(t, series["gpus"], where="mid", label=pol)
            ax[2].plot(t, [math.nan if v is None else v for v in series["p90_latency_s"]],
                       marker=".", label=pol)
        ax[1].set_ylabel("GPUs")
        ax[2].set_ylabel("p90 latency (s)")
        ax[2].set_xlabel("time (s)")
        ax[1].legend(fontsize=7)
        ax[0].set_title(f"{name}: {result['setup']['workflow']} on {result['setup']['gpus']} "
                        f"{result['setup']['gpu']}")
        fig.tight_layout()
        path = folder / f"control-{name}.png"
        fig.savefig(path, metadata={"Software": None})
        plt.close(fig)
        out.append(path)
    return out
