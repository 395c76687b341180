"""Planning problems, their candidates and plans: what every optimiser shares.

A :class:`PlanningProblem` is workflows (their statistics and LLM -> catalog model map), a
target throughput per workflow (req/s), a :class:`~scepsy_opt.cluster.Cluster` and a latency
model. An allocation gives every LLM one instance shape (gpu, tp, share) and a replica count.

**The objective is separable.** At the target rates every LLM's call rate ``λ_m`` is fixed, so
the predictor's latency (``scepsy_opt.pipeline``, critical-path form) is a sum over LLMs of a
term that depends only on that LLM's own instance and replicas:
``Σ_w ω_w·L_w = Σ_m Σ_{w,c} ω_w·k_wmc·L_mc(gpu, tp, share, λ_m/r) + Σ_w ω_w·τ_w``. Each
(LLM, gpu, tp, share, replicas) is therefore a :class:`Candidate` with a fixed cost and a fixed
use of one GPU type, and planning is a multiple-choice knapsack: pick one candidate per LLM
within the per-type GPU budgets. GPU use is counted in thousandths of a GPU (``units``) so
budgets are exact integers.

**Candidates** (:func:`generate_candidates`): every GPU type of the cluster × TP degree the model
supports and a node of that type holds in one NVLink domain × share on the grid (shares < 1 only
where the instance fits in that share of the memory; the serving curve decides) × replicas from
the fewest that carry the load at ``max_utilisation`` up to what the budget allows. Replica counts
stop once the latency is within ``prune_rel`` of its zero-load floor (more replicas cannot gain
more than that). **Dominance pruning**, per LLM and GPU type: a candidate is dropped when another
uses no more GPU units and costs no more (on equal cost the one with fewer GPUs survives: the
tie-break on GPUs used). Both counts are reported.

Re-planning: with a ``current`` allocation, each candidate also pays ``change_penalty_s`` per
replica started or stopped (``|r − r₀|`` on the same shape, ``r + r₀`` on another).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

import numpy as np

from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.cluster import Cluster
from scepsy_opt.pipeline import (
    LLMDemand,
    carried_scale,
    class_latencies,
    class_latencies_many,
    instance_curve,
    instance_curves,
    llm_demand,
    llm_load,
    min_replicas,
    predict,
)
from scepsy_opt.stats import WorkflowStats
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.errors import InputError
from scepsy_profile.latency import LatencyModel
from scepsy_profile.serving import MemoryPolicy

UNITS = 1000  # GPU units per GPU: budgets and uses are exact integers
SHARE_TOL_UNITS = 1e-6  # float noise forgiven when a share is counted in units


def share_units(share: float) -> int:
    """A GPU share in thousandths of a GPU (:data:`UNITS`): the one share-to-units rule.

    Rounded *up* to the next thousandth (a replica gets at least its share, so units never
    over-commit a GPU: four 0.2501 shares take 251 units each and do not fit on one GPU), with a
    :data:`SHARE_TOL_UNITS` tolerance so that float noise (``0.1 + 0.2``) does not add a unit.
    Every positive share takes at least one unit; 0 takes none. The planner's budgets
    (:func:`gpu_units`), the blocks (:func:`replicas_per_gpu`), every placer and the placement
    checker count shares with this function.
    """
    if share <= 0:
        return 0
    return max(1, math.ceil(share * UNITS - SHARE_TOL_UNITS))
TENTHS = tuple(round(0.1 * i, 1) for i in range(1, 11))
Objective = Literal["min-latency", "max-throughput"]
OBJECTIVES: tuple[Objective, ...] = ("min-latency", "max-throughput")


@dataclass(frozen=True)
class PlanOptions:
    """Knobs of candidate generation and of the solvers (defaults documented in docs/optimiser.md)."""

    shares: tuple[float, ...] = TENTHS
    tps: tuple[int, ...] = (1, 2, 4, 8)
    max_utilisation: float = 0.95
    weights: Mapping[str, float] = field(default_factory=dict)  # per workflow, default 1
    objective: Objective = "min-latency"
    latency_bound_s: Mapping[str, float] = field(default_factory=dict)  # max-throughput mode
    current: Allocation | None = None
    change_penalty_s: float = 0.0
    prune_rel: float = 1e-9
    # wall-clock limit of one whole plan (candidates, reduction, every solver call, bisection,
    # optimise-place rounds): a :class:`Deadline` started when the plan starts
    time_limit_s: float = 60.0
    gap_rel: float = 0.0
    max_replicas: int = 100_000
    # Lagrangian reduced-cost fixing before the MILP (exact); None: on from 64 GPUs, where the
    # candidate sets grow large, off below, where one generation pass is cheaper than two
    reduce: bool | None = None

    def __post_init__(self) -> None:
        src = "plan options"
        if not self.shares or any(not (0 < s <= 1) or abs(s * UNITS - round(s * UNITS)) > 1e-9
                                  for s in self.shares):
            raise InputError(src, "shares", "GPU shares in (0, 1], multiples of 0.001", self.shares)
        if not self.tps or any(not (isinstance(t, int) and t >= 1) for t in self.tps):
            raise InputError(src, "tps", "TP degrees, integers >= 1", self.tps)
        if not 0 < self.max_utilisation < 1:
            raise InputError(src, "max_utilisation", "a fraction in (0, 1)", self.max_utilisation)
        if self.objective not in OBJECTIVES:
            raise InputError(src, "objective", f"one of {list(OBJECTIVES)}", self.objective)
        for w, x in self.weights.items():
            if not (math.isfinite(x) and x >= 0):
                raise InputError(src, f"weights.{w}", "a weight >= 0", x)
        for w, x in self.latency_bound_s.items():
            if not (math.isfinite(x) and x > 0):
                raise InputError(src, f"latency_bound_s.{w}", "a latency bound > 0 s", x)
        if not (math.isfinite(self.change_penalty_s) and self.change_penalty_s >= 0):
            raise InputError(src, "change_penalty_s", "a penalty >= 0 s per changed replica",
                             self.change_penalty_s)
        if not 0 <= self.prune_rel < 1e-3:
            raise InputError(src, "prune_rel", "a tolerance in [0, 1e-3)", self.prune_rel)
        if not self.time_limit_s > 0:
            raise InputError(src, "time_limit_s", "a time limit > 0 s", self.time_limit_s)
        if not 0 <= self.gap_rel < 1:
            raise InputError(src, "gap_rel", "a relative gap in [0, 1)", self.gap_rel)
        object.__setattr__(self, "shares", tuple(sorted(set(self.shares))))
        object.__setattr__(self, "tps", tuple(sorted(set(self.tps))))
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        object.__setattr__(self, "latency_bound_s", MappingProxyType(dict(self.latency_bound_s)))


class TimeLimitReached(Exception):
    """The plan's :class:`Deadline` passed: no allocation can be returned from this point on.

    Raised by the steps that take time (candidate generation, reduced-cost fixing, solver calls);
    the optimiser's entry points turn it into a plan of status ``time_limit_no_solution``
    (:func:`time_limit_plan`)."""


@dataclass(frozen=True)
class Deadline:
    """The time limit of one whole plan (``PlanOptions.time_limit_s``) as a point on the
    monotonic clock: every step of the plan gets what remains of it."""

    at: float  # time.monotonic() seconds
    limit_s: float  # the limit it was started with

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """A deadline ``seconds`` from now."""
        return cls(time.monotonic() + seconds, seconds)

    @classmethod
    def of(cls, problem: PlanningProblem, deadline: Deadline | None = None) -> Deadline:
        """``deadline``, or a new one for ``problem``'s time limit (a plan's entry point)."""
        return deadline if deadline is not None else cls.after(problem.options.time_limit_s)

    def remaining(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self.at - time.monotonic())

    def check(self) -> None:
        """Raise :class:`TimeLimitReached` once the deadline has passed."""
        if time.monotonic() >= self.at:
            raise TimeLimitReached(time_limit_detail(self.limit_s))


@dataclass(frozen=True)
class PlanningProblem:
    """Workflows, their target throughputs (req/s), a cluster and a latency model."""

    stats: Mapping[str, WorkflowStats]
    models: Mapping[str, str]
    targets: Mapping[str, float]
    cluster: Cluster
    latency: LatencyModel
    options: PlanOptions = PlanOptions()
    catalog: Catalog | None = None
    policy: MemoryPolicy | None = None

    def __post_init__(self) -> None:
        if not self.targets:
            raise InputError("plan", "targets", "a target throughput for at least one workflow")
        for w, t in self.targets.items():
            if w not in self.stats:
                raise InputError("plan", f"targets.{w}",
                                 f"a workflow of the problem ({', '.join(sorted(self.stats))})", w)
            if not (isinstance(t, int | float) and math.isfinite(t) and t > 0):
                raise InputError("plan", f"targets.{w}", "a throughput > 0 req/s", t)
        if self.cluster.total_gpus < 1:
            raise InputError("plan", "cluster", "a cluster with at least one GPU")
        cat = self.catalog or default_catalog()
        for m in self.llms:
            if m not in self.models:
                raise InputError("plan", f"llms.{m}", "the catalog model this LLM runs")
            cat.model(self.models[m])
        cur = self.options.current
        if cur is not None:
            for m in cur.llms:
                if m not in self.llms:
                    raise InputError("current allocation", f"llms.{m}",
                                     f"an LLM of the workflows ({', '.join(self.llms)})", m)
        for w in self.options.weights:
            if w not in self.targets:
                raise InputError("plan options", f"weights.{w}", "a workflow with a target", w)
        object.__setattr__(self, "targets", MappingProxyType(dict(sorted(self.targets.items()))))

    @property
    def llms(self) -> list[str]:
        """The LLMs the targeted workflows call, sorted."""
        return sorted({m for w in self.targets for m in self.stats[w].llms})

    def weight(self, workflow: str) -> float:
        return float(self.options.weights.get(workflow, 1.0))

    def scaled(self, factor: float) -> PlanningProblem:
        """The same problem with every target multiplied by ``factor``."""
        return PlanningProblem(self.stats, self.models, {w: t * factor for w, t in self.targets.items()},
                               self.cluster, self.latency, self.options, self.catalog, self.policy)

    @property
    def constant_s(self) -> float:
        """The part of the objective no allocation changes: weighted tool time on the path."""
        return sum(self.weight(w) * self.stats[w].tool_critical_s for w in self.targets)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to serve one LLM: ``replicas`` × (gpu, tp, share), priced at the target load."""

    llm: str
    gpu: str
    tp: int
    share: float
    replicas: int
    units: int  # GPU use in 1/1000 GPU: replicas · tp · share · 1000
    mu: float  # calls/s per replica
    call_latency_s: float  # the LLM's mean call latency at the target load
    latency_s: float  # its weighted contribution to the objective
    change_s: float  # re-planning penalty
    # per workflow: this LLM's contribution to the workflow's mean latency
    workflow_latency_s: tuple[tuple[str, float], ...] = ()
    memory_gib: float = 0.0  # per GPU of each replica: its share of the GPU's memory (MPS limit)

    @property
    def cost(self) -> float:
        return self.latency_s + self.change_s

    @property
    def capacity(self) -> float:
        """Calls/s the replicas carry together."""
        return self.replicas * self.mu

    @property
    def gpus(self) -> float:
        return self.units / UNITS

    @property
    def instance(self) -> Instance:
        return Instance(self.gpu, self.tp, self.share, self.replicas)


@dataclass(frozen=True)
class CandidateSet:
    """Every LLM's candidates after pruning, and how many there were before."""

    by_llm: Mapping[str, tuple[Candidate, ...]]
    generated: int
    kept: int
    curves: int  # serving curves built
    unfit: tuple[str, ...]  # LLMs without any feasible candidate (memory)
    seconds: float
    least_price: Mapping[str, float] = field(default_factory=dict)  # v*_m under prices


def gpu_units(tp: int, share: float, replicas: int = 1) -> int:
    """GPU capacity of ``replicas`` × (tp, share) in thousandths of a GPU: ``tp`` GPUs of
    :func:`share_units` each."""
    return tp * share_units(share) * replicas


def replicas_per_gpu(share: float) -> int:
    """Replicas of one shape that share a GPU when it serves that shape only:
    ``floor(UNITS / share_units(share))`` (``floor(1/share)`` for multiples of 0.001; a share is
    in (0, 1])."""
    return max(1, UNITS // share_units(share))


def units_by_gpu(cands: Iterable[Candidate]) -> dict[str, int]:
    """GPU units the candidates use, per GPU type."""
    used: dict[str, int] = {}
    for c in cands:
        used[c.gpu] = used.get(c.gpu, 0) + c.units
    return used


def changed_replicas(inst: Instance, current: Instance | None) -> int:
    """Replicas started or stopped to go from ``current`` to ``inst``."""
    if current is None:
        return inst.replicas
    same = (current.gpu == inst.gpu and current.tp == inst.tp
            and abs(current.share - inst.share) < 1e-9)
    return abs(inst.replicas - current.replicas) if same else inst.replicas + current.replicas


def _weighted(problem: PlanningProblem, dem: LLMDemand, per_class: Mapping[tuple[float, float], np.ndarray],
              shape: tuple[int, ...]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(weighted objective term, per-workflow term) from the class latencies."""
    total = np.zeros(shape)
    per_wf: dict[str, np.ndarray] = {}
    for w, k, i, o in dem.terms:
        per_wf[w] = per_wf.get(w, np.zeros(shape)) + k * per_class[(i, o)]
    for w in sorted(per_wf):
        total = total + problem.weight(w) * per_wf[w]
    return total, per_wf


def _terms(problem: PlanningProblem, dem: LLMDemand, curve: Any, replicas: np.ndarray,
           ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(mixture call latency, weighted objective term, per-workflow term) per replica count."""
    mix, per_class = class_latencies(dem, curve, problem.latency, replicas)
    total, per_wf = _weighted(problem, dem, per_class, replicas.shape)
    return mix, total, per_wf


def shapes(problem: PlanningProblem, llm: str) -> list[tuple[str, int, float]]:
    """Every (gpu, tp, share) the cluster and the model allow for ``llm`` (memory not checked)."""
    cat = problem.catalog or default_catalog()
    spec = cat.model(problem.models[llm])
    out = []
    for gpu in problem.cluster.budgets():
        top = problem.cluster.max_tp(gpu, cat)
        for tp in problem.options.tps:
            if tp <= top and spec.supports_tp(tp):
                out.extend((gpu, tp, s) for s in problem.options.shares)
    return out


def shape_groups(problem: PlanningProblem, llm: str) -> dict[tuple[str, int], list[float]]:
    """:func:`shapes` grouped by (gpu, tp): the shares of each, for one batched curve query."""
    out: dict[tuple[str, int], list[float]] = {}
    for gpu, tp, share in shapes(problem, llm):
        out.setdefault((gpu, tp), []).append(share)
    return out


def price(problem: PlanningProblem, allocation: Allocation) -> dict[str, Candidate]:
    """Each LLM's instance of ``allocation`` as a :class:`Candidate` (priced like the optimiser's)."""
    out = {}
    for m in problem.llms:
        if m not in allocation.llms:
            raise InputError("allocation", f"llms.{m}", "an instance for every LLM the workflows call")
        inst = allocation.llms[m]
        dem = llm_demand(problem.stats, problem.models, problem.targets, m)
        curve = instance_curve(dem, problem.latency, inst.gpu, inst.tp, inst.share,
                               catalog=problem.catalog, policy=problem.policy)
        mix, total, per_wf = _terms(problem, dem, curve, np.array([float(inst.replicas)]))
        cur = problem.options.current.llms.get(m) if problem.options.current else None
        change = problem.options.change_penalty_s * changed_replicas(inst, cur) if problem.options.current else 0.0
        out[m] = Candidate(m, inst.gpu, inst.tp, inst.share, inst.replicas,
                           gpu_units(inst.tp, inst.share, inst.replicas), curve.mu, float(mix[0]),
                           float(total[0]), change,
                           tuple((w, float(v[0])) for w, v in sorted(per_wf.items())),
                           curve.memory.available_gib)
    return out


def generate_candidates(problem: PlanningProblem, *, prune: bool = True,
                        max_units: Mapping[str, int] | None = None, coarse: bool = False,
                        prices: Mapping[str, float] | None = None,
                        slack: float = math.inf,
                        curve_cache: dict[tuple[str, str, int], list[Any]] | None = None,
                        blocks: bool = False, deadline: Deadline | None = None) -> CandidateSet:
    """All candidates of every LLM (see the module docstring), dominance-pruned unless ``prune``
    is False. ``max_units`` caps the GPU units one LLM may use per type (default: the budget).

    ``coarse``: replica counts ``r_min + {0, 1, 2, 4, 8, ...}`` only (real candidates, a sample).
    ``prices`` (per GPU type, per unit) and ``slack``: Lagrangian reduced-cost fixing. With
    ``v_c = cost_c + π·units_c`` and ``v*_m`` the least ``v`` of LLM ``m``, every allocation
    costs at least ``LB + Σ_m (v_c − v*_m)`` where ``LB = Σ_m v*_m − Σ_t π_t·budget_t``, so a
    candidate with ``v_c − v*_m > slack ≥ UB − LB`` is in no allocation cheaper than ``UB``. Such
    candidates are neither generated (a shape's replica scan stops once ``floor + π·units``
    passes ``v*_m + slack``) nor kept. The caller checks ``slack ≥ UB − LB`` afterwards
    (:attr:`CandidateSet.least_price` gives ``v*_m``). ``curve_cache`` keeps the serving curves
    between calls on the same problem.

    ``blocks``: count GPUs as whole-GPU blocks of one LLM shape (``scepsy_place.blocks``): a
    block of ``tp`` GPUs holds ``k = replicas_per_gpu(share)`` replicas, so only replica counts
    that fill their blocks (multiples of ``k``) are candidates (fewer replicas cost as many GPUs
    and are slower), ``units = 1000·tp·replicas/k``, and pruning keeps a candidate unless another
    uses no more units, costs no more and has no larger TP degree (the block capacity rows weigh
    larger TP groups more).

    ``deadline``: raise :class:`TimeLimitReached` once it passes (checked per batch of curves).
    """
    t0 = time.perf_counter()
    opts = problem.options
    budgets = {g: n * UNITS for g, n in problem.cluster.budgets().items()}
    caps = dict(max_units) if max_units is not None else budgets
    by_llm: dict[str, tuple[Candidate, ...]] = {}
    least: dict[str, float] = {}
    generated = curves = 0
    unfit = []
    for m in problem.llms:
        best_v = math.inf
        dem = llm_demand(problem.stats, problem.models, problem.targets, m)
        load = llm_load(dem)  # the capacity every candidate carries at max_utilisation
        cur = opts.current.llms.get(m) if opts.current else None
        rows: list[tuple[Any, ...]] = []
        any_fit = False
        for (gpu, tp), shares in shape_groups(problem, m).items():
            if deadline is not None:
                deadline.check()
            key = (m, gpu, tp)
            if curve_cache is not None and key in curve_cache:
                curves_ = curve_cache[key]
            else:
                curves_ = instance_curves(dem, problem.latency, gpu, tp, shares,
                                          catalog=problem.catalog, policy=problem.policy)
                if curve_cache is not None:
                    curve_cache[key] = curves_
            curves += len(curves_)
            live = [c for c in curves_ if c.feasible]
            any_fit = any_fit or bool(live)
            if not live:
                continue
            # the scan runs over steps s: replicas k·s, units per·s (k = 1 unless blocks)
            pending: dict[Any, tuple[int, int, int, float]] = {}
            step: dict[Any, int] = {}
            for c in live:
                k = replicas_per_gpu(c.share) if blocks else 1
                per = UNITS * tp if blocks else gpu_units(tp, c.share)
                r_min = min_replicas(load, c.mu, opts.max_utilisation)
                s_min, s_cap = math.ceil(r_min / k), min(caps.get(gpu, 0) // per, opts.max_replicas // k)
                if s_min <= s_cap:
                    pending[c] = (s_min, s_cap, per, math.nan)
                    step[c] = k
            r0 = cur.replicas if cur is not None else 0
            price = prices.get(gpu, 0.0) if prices is not None else 0.0
            chunk, first = 16, True
            while pending:
                if deadline is not None:
                    deadline.check()
                batch = list(pending)
                if coarse:
                    steps = np.concatenate(([0], 2 ** np.arange(0, 40)))
                    rs = [np.unique(np.minimum(pending[c][0] + steps, pending[c][1])).astype(float)
                          for c in batch]
                else:
                    rs = [np.arange(pending[c][0], min(pending[c][1], pending[c][0] + chunk - 1) + 1,
                                    dtype=float) for c in batch]
                rs = [r * step[c] for c, r in zip(batch, rs, strict=True)]  # steps -> replicas
                if first:  # r = ∞ prices the zero-load floor: more replicas cannot get below it
                    rs = [np.concatenate(([math.inf], r)) for r in rs]
                results = class_latencies_many(dem, batch, problem.latency, rs)
                nxt = {}
                for c, r_arr, (mix, per_class) in zip(batch, rs, results, strict=True):
                    _, r_cap, per, floor = pending[c]
                    k = step[c]
                    total, per_wf = _weighted(problem, dem, per_class, r_arr.shape)
                    if first:
                        floor = float(total[0])
                        r_arr, mix, total = r_arr[1:], mix[1:], total[1:]
                        per_wf = {w: v[1:] for w, v in per_wf.items()}
                    if opts.current is None:
                        change = np.zeros(len(r_arr))
                    elif cur is None:
                        change = opts.change_penalty_s * r_arr
                    elif cur.gpu == gpu and cur.tp == tp and abs(cur.share - c.share) < 1e-9:
                        change = opts.change_penalty_s * np.abs(r_arr - cur.replicas)
                    else:
                        change = opts.change_penalty_s * (r_arr + cur.replicas)
                    stop = (r_arr >= r0) & (total <= floor * (1.0 + opts.prune_rel))
                    units = per * (r_arr // k)
                    if prices is not None:  # beyond this, v ≥ floor + π·units > v*_m + slack
                        v = total + change + price * units
                        best_v = min(best_v, float(v.min()))
                        stop |= (r_arr >= r0) & (floor + price * units > best_v + slack)
                    done = bool(stop.any()) or coarse
                    n = int(np.argmax(stop)) + 1 if stop.any() else len(r_arr)  # more gain < prune_rel
                    rows.append((gpu, tp, c.share, c.mu, units[:n], r_arr[:n], mix[:n], total[:n],
                                 change[:n], {w: v[:n] for w, v in per_wf.items()},
                                 c.memory.available_gib))
                    last = int(r_arr[-1]) // k
                    if not done and last < r_cap:
                        nxt[c] = (last + 1, r_cap, per, floor)
                pending, first = nxt, False
                chunk = min(chunk * 4, 4096)
        if not any_fit:
            unfit.append(m)
        generated += sum(len(row[5]) for row in rows)
        cands = _candidates(m, rows, prune, by_tp=blocks)
        if prices is not None and cands:
            v = np.array([c.cost + prices.get(c.gpu, 0.0) * c.units for c in cands])
            least[m] = float(v.min())
            cands = [c for c, x in zip(cands, v, strict=True) if x - least[m] <= slack]
        by_llm[m] = tuple(cands)
    kept = sum(len(c) for c in by_llm.values())
    return CandidateSet(MappingProxyType(by_llm), generated, kept, curves, tuple(unfit),
                        time.perf_counter() - t0, MappingProxyType(least))


def _candidates(llm: str, rows: list[tuple[Any, ...]], prune: bool,
                by_tp: bool = False) -> list[Candidate]:
    """Candidate objects from the priced rows; with ``prune``, per GPU type only those no other
    beats on both units and cost (on equal cost the fewest units, then tp, share, replicas);
    with ``by_tp`` the other must also have no larger TP degree."""
    out = []
    for gpu in sorted({row[0] for row in rows}):
        mine = [row for row in rows if row[0] == gpu]
        if not mine:
            continue
        idx = np.concatenate([np.column_stack((np.full(len(row[5]), i), np.arange(len(row[5]))))
                              for i, row in enumerate(mine)]).astype(int)
        units = np.concatenate([row[4] for row in mine])
        cost = np.concatenate([row[7] + row[8] for row in mine])
        tp = np.concatenate([np.full(len(row[5]), row[1]) for row in mine])
        share = np.concatenate([np.full(len(row[5]), row[2]) for row in mine])
        reps = np.concatenate([row[5] for row in mine])
        order = np.lexsort((reps, share, tp, cost, units))
        if prune and by_tp:
            c, t = cost[order], tp[order]
            keep = np.zeros(len(order), dtype=bool)
            for level in np.unique(t):  # beaten by an earlier candidate of no larger TP degree?
                seen = np.where(t <= level, c, math.inf)
                best = np.minimum.accumulate(np.concatenate(([math.inf], seen)))[:-1]
                keep |= (t == level) & (c < best)
            order = order[keep]
        elif prune:
            c = cost[order]
            best = np.minimum.accumulate(np.concatenate(([math.inf], c)))[:-1]
            order = order[c < best]
        for k in order.tolist():
            i, j = idx[k]
            g, t, sh, mu, u_arr, r_arr, mix, total, change, per_wf, mem = mine[i]
            r = int(r_arr[j])
            out.append(Candidate(llm, g, t, sh, r, int(u_arr[j]), mu, float(mix[j]), float(total[j]),
                                 float(change[j]),
                                 tuple((w, float(v[j])) for w, v in sorted(per_wf.items())), mem))
    return out


# --------------------------------------------------------------------------- plans

# optimal: proven optimal; time_limit: the time limit ended the search with an allocation (its
# gap says how far from proven); time_limit_no_solution: it ran out before any allocation was
# found (nothing is known about feasibility); infeasible: no allocation meets the targets;
# unplaced: an allocation was found but no placement of it (nor of any other tried) on the
# concrete GPUs was (scepsy_place.loop)
Status = Literal["optimal", "time_limit", "time_limit_no_solution", "infeasible", "unplaced",
                 "heuristic", "evaluated"]


@dataclass(frozen=True)
class Infeasibility:
    """Why no allocation meets the targets, and how far the cluster gets."""

    reason: Literal["memory", "gpus"]
    detail: str
    max_scale: float  # the largest fraction of the targets the cluster carries
    max_throughput: Mapping[str, float]  # per workflow, req/s
    bottleneck: str | None  # the LLM that bounds it
    # the GPU types whose extra capacity raises max_scale (or the unfit LLMs); milp.scale_gains
    binding: tuple[str, ...]
    # per GPU type, how much one more GPU of it raises max_scale (fraction of the targets)
    gain_per_gpu: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Plan:
    """An optimiser's answer: the allocation, its predicted figures and how it was found."""

    optimiser: str
    status: Status
    allocation: Allocation | None
    objective_s: float  # weighted sum of predicted mean workflow latencies (+ change penalties)
    bound_s: float  # best proven lower bound on the objective (= objective when optimal)
    gap: float
    candidates: Mapping[str, Candidate]
    stats: Mapping[str, Any]
    infeasible: Infeasibility | None = None
    scale: float = 1.0  # max-throughput mode: the fraction of the targets reached

    @property
    def feasible(self) -> bool:
        return self.allocation is not None


class Optimiser(Protocol):
    """Anything that turns a :class:`PlanningProblem` into a :class:`Plan`."""

    name: str

    def solve(self, problem: PlanningProblem) -> Plan: ...


OPTIMISERS: dict[str, Callable[[], Optimiser]] = {}


def register(name: str) -> Callable[[Callable[[], Optimiser]], Callable[[], Optimiser]]:
    def deco(factory: Callable[[], Optimiser]) -> Callable[[], Optimiser]:
        OPTIMISERS[name] = factory
        return factory
    return deco


def optimiser(name: str) -> Optimiser:
    """The registered optimiser called ``name``."""
    import scepsy_opt.baselines
    import scepsy_opt.milp  # noqa: F401

    if name not in OPTIMISERS:
        raise InputError("plan", "optimiser", f"one of {', '.join(sorted(OPTIMISERS))}", name)
    return OPTIMISERS[name]()


def time_limit_detail(limit_s: float) -> str:
    """What a ``time_limit_no_solution`` plan says (the CLI's message)."""
    return (f"the time limit of {limit_s:g} s ran out before any allocation was found "
            "(a longer time limit may find one; nothing is known about feasibility)")


def time_limit_plan(name: str, stats: Mapping[str, Any] | None = None) -> Plan:
    """The plan of a run whose time limit ran out before any allocation was found: no
    allocation, no diagnosis, and no scale of the targets reached (0)."""
    return Plan(name, "time_limit_no_solution", None, math.inf, math.inf, math.inf, {},
                MappingProxyType(dict(stats or {})), None, 0.0)


def plan_from_choice(problem: PlanningProblem, name: str, status: Status,
                     choice: Mapping[str, Candidate], stats: Mapping[str, Any],
                     bound_s: float | None = None, scale: float = 1.0) -> Plan:
    """A :class:`Plan` for one candidate per LLM (objective includes the constant tool time).

    A choice with a saturated LLM (infinite predicted latency: its replicas do not carry its
    load) is no plan of any status but ``infeasible``: the answer says how far the choice
    carries the targets (:func:`saturated_plan`)."""
    if any(not math.isfinite(c.latency_s) for c in choice.values()):
        return saturated_plan(problem, name, choice, stats)
    alloc = Allocation({m: c.instance for m, c in choice.items()})
    obj = math.fsum([choice[m].cost for m in sorted(choice)]) + problem.constant_s
    bound = obj if bound_s is None else bound_s
    gap = 0.0 if obj <= 0 else max(obj - bound, 0.0) / obj
    gap = 0.0 if gap < 1e-12 else gap  # float noise between HiGHS's bound and our sum
    return Plan(name, status, alloc, obj, bound, gap, MappingProxyType(dict(sorted(choice.items()))),
                MappingProxyType(dict(stats)), None, scale)


def saturated_plan(problem: PlanningProblem, name: str, choice: Mapping[str, Candidate],
                   stats: Mapping[str, Any]) -> Plan:
    """The infeasible plan of a choice whose replicas do not all carry their LLM's load: its
    ``max_scale`` is the fraction of the targets the choice carries at ``max_utilisation``
    (:func:`scepsy_opt.pipeline.carried_scale` of each LLM's :func:`~scepsy_opt.pipeline.llm_load`)."""
    u = problem.options.max_utilisation
    heads = {m: carried_scale(llm_load(llm_demand(problem.stats, problem.models, problem.targets, m)),
                              c.mu, c.replicas, u) for m, c in choice.items()}
    bottleneck = min(heads, key=lambda m: (heads[m], m))
    scale = heads[bottleneck]
    full = [m for m, c in sorted(choice.items()) if not math.isfinite(c.latency_s)]
    tput = {w: scale * t for w, t in problem.targets.items()}
    info = Infeasibility(
        "gpus", f"{', '.join(full)} saturated: the allocation carries at most {scale:.4g}x the "
        f"targets at utilisation {u:g} ({', '.join(f'{w} {v:.4g} req/s' for w, v in tput.items())}), "
        f"bounded by {bottleneck}", scale, tput, bottleneck, ())
    return Plan(name, "infeasible", None, math.inf, math.inf, math.inf,
                MappingProxyType(dict(sorted(choice.items()))), MappingProxyType(dict(stats)),
                info, scale)


def fits_budget(problem: PlanningProblem, choice: Mapping[str, Candidate]) -> bool:
    used = units_by_gpu(choice.values())
    budgets = problem.cluster.budgets()
    return all(u <= budgets.get(g, 0) * UNITS for g, u in used.items())


def workflow_latencies(problem: PlanningProblem, plan: Plan) -> dict[str, float]:
    """Predicted mean latency per targeted workflow (the predictor's critical-path form)."""
    if plan.allocation is None:
        return {}
    pred = predict(problem.stats, problem.models, plan.allocation, problem.latency,
                   dict(problem.targets), catalog=problem.catalog, policy=problem.policy)
    return {w: p.mean_latency_s for w, p in pred.workflows.items()}
