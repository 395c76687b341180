"""Candidates: every way to serve each LLM of a planning problem, priced at its target load.

An allocation gives every LLM one instance shape (gpu, tp, share) and a replica count.

**The objective is separable.** At the target rates every LLM's call rate ``λ_m`` is fixed, so
the predictor's latency (``scepsy_opt.prediction.pipeline``, critical-path form) is a sum over LLMs of a
term that depends only on that LLM's own instance and replicas:
``Σ_w ω_w·L_w = Σ_m Σ_{w,c} ω_w·k_wmc·L_mc(gpu, tp, share, λ_m/r) + Σ_w ω_w·τ_w``. Each
(LLM, gpu, tp, share, replicas) is therefore a :class:`Candidate` with a fixed cost and a fixed
use of one GPU type, and planning is a multiple-choice knapsack: pick one candidate per LLM
within the per-type GPU budgets. GPU use is counted in thousandths of a GPU (``units``) so
budgets are exact integers.

**Candidates** (:func:`generate_candidates`): every GPU type of the cluster × TP degree the model
supports and a node of that type holds in one NVLink domain × share on the grid (shares < 1 only
where the instance fits in that share of the memory; the serving curve decides; with
``PlanOptions.shares_within_profile`` only the shares within the latency model's measured range
of that (model, gpu, tp), ``scepsy_opt.planning.coverage``) × replicas from
the fewest that carry the load at ``max_utilisation`` and are not overloaded (the serving curve
predicts no more preemptions per call than the policy's threshold at the per-replica call rate:
the optimiser does not plan predicted preemption; :func:`unoverloaded_replicas`) and, for an
LLM with an SLO (``PlanOptions.slos``), meet it at the rate per replica
(:func:`scepsy_opt.prediction.slo.fewest_replicas`: a shape whose zero-load TTFT or TPOT misses it has no
candidate) up to what the budget allows. Latency costs include the engine's per-call delay
(``scepsy_profile.overheads.call_delay_s``), as the predictor's do. Replica counts
stop once the latency is within ``prune_rel`` of its zero-load floor (more replicas cannot gain
more than that). **Dominance pruning**, per LLM and GPU type: a candidate is dropped when another
uses no more GPU units and costs no more (on equal cost the one with fewer GPUs survives: the
tie-break on GPUs used). Both counts are reported.

**Two resources** (``PlanOptions.memory_shares``, a grid of memory fractions; None ties memory
to the compute share, the default): every (gpu, tp, compute share) is crossed with the memory
shares of the grid at which the instance fits (:func:`shape_curves`). The compute share drives
the latency model, the memory share the KV cache and hence the batch limit and μ. Memory values
above the first whose serving curve equals the curve at the grid's largest memory that fits
(same μ, batch limit and service table, no preemption at the batch limit) buy nothing and are
skipped. Candidates then carry ``memory_share`` (always set in this mode) and use two
resources per GPU type, compute ``units`` and memory ``mem_units``; dominance pruning drops a
candidate when another uses no more of either and costs no more (ties: fewer units, fewer memory
units, then tp, share, memory, replicas).

Re-planning: with a ``current`` allocation, each candidate also pays ``change_penalty_s`` per
replica started or stopped (``|r − r₀|`` on the same shape, ``r + r₀`` on another).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from scepsy_common.errors import InputError
from scepsy_common.search import first_true
from scepsy_common.units import UNITS, gpu_units, replicas_per_gpu
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.planning.coverage import profiled_shares
from scepsy_opt.planning.problem import Deadline, PlanningProblem
from scepsy_opt.prediction.pipeline import (
    LLMDemand,
    class_latencies,
    class_latencies_many,
    curve_preemptions,
    instance_curve,
    instance_curves,
    llm_demand,
    min_replicas,
)
from scepsy_opt.prediction.slo import CallSLO, SLOCheck, check, fewest_replicas
from scepsy_opt.stats import split_stats
from scepsy_profile.catalog import default_catalog
from scepsy_profile.overheads import call_delay_s


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
    memory_share: float | None = None  # fraction of each GPU's memory; None: the compute share

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
    def mem_units(self) -> int:
        """GPU memory used in 1/1000 of a GPU's memory: replicas · tp · memory share · 1000
        (the compute units when memory is tied to the share)."""
        if self.memory_share is None:
            return self.units
        return self.replicas * gpu_units(self.tp, self.memory_share)

    @property
    def instance(self) -> Instance:
        return Instance(self.gpu, self.tp, self.share, self.replicas, self.memory_share)


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


def units_by_gpu(cands: Iterable[Candidate]) -> dict[str, int]:
    """GPU units the candidates use, per GPU type."""
    used: dict[str, int] = {}
    for c in cands:
        used[c.gpu] = used.get(c.gpu, 0) + c.units
    return used


def mem_units_by_gpu(cands: Iterable[Candidate]) -> dict[str, int]:
    """GPU memory units (thousandths of a GPU's memory) the candidates use, per GPU type."""
    used: dict[str, int] = {}
    for c in cands:
        used[c.gpu] = used.get(c.gpu, 0) + c.mem_units
    return used


def independent_memory(problem: PlanningProblem) -> bool:
    """Whether ``problem`` plans memory as a resource of its own (a memory grid is set)."""
    return problem.options.memory_shares is not None


def changed_replicas(inst: Instance, current: Instance | None) -> int:
    """Replicas started or stopped to go from ``current`` to ``inst``."""
    return int(_changed(current, inst.gpu, inst.tp, inst.share, np.array([inst.replicas]),
                        inst.memory_share)[0])


def _changed(current: Instance | None, gpu: str, tp: int, share: float,
             replicas: np.ndarray, memory: float | None = None) -> np.ndarray:
    """Replicas started or stopped to go from ``current`` to each replica count of the shape
    (``memory``: its memory share, None: ``share``): ``|r − r₀|`` on the same shape, ``r + r₀``
    on another, ``r`` from nothing."""
    if current is None:
        return replicas
    mem = share if memory is None else memory
    if (current.gpu == gpu and current.tp == tp and abs(current.share - share) < 1e-9
            and abs(current.memory_share - mem) < 1e-9):
        return np.abs(replicas - current.replicas)
    return replicas + current.replicas


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


def workflow_latency_terms(problem: PlanningProblem, llm: str, curves: Sequence[Any],
                           replicas: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Per curve of ``curves`` (of ``llm``'s model on one GPU type and TP degree), per workflow
    that calls ``llm``, its calls' contribution to the workflow's mean latency at the targets,
    per replica count of ``replicas`` (as the optimiser prices them; one latency query per
    phase and class for all the curves)."""
    dem = problem.demands[llm]
    out = class_latencies_many(dem, list(curves), problem.latency, list(replicas))
    return [_weighted(problem, dem, per_class, np.shape(r))[1]
            for r, (_, per_class) in zip(replicas, out, strict=True)]


def shapes(problem: PlanningProblem, llm: str) -> list[tuple[str, int, float]]:
    """Every (gpu, tp, share) the cluster and the model allow for ``llm`` (memory not checked);
    with ``shares_within_profile`` only the shares within the latency model's measured range
    of each (gpu, tp) (:func:`scepsy_opt.planning.coverage.profiled_shares`)."""
    cat = problem.catalog or default_catalog()
    spec = cat.model(problem.models[llm])
    out: list[tuple[str, int, float]] = []
    for gpu in problem.cluster.budgets():
        top = problem.cluster.max_tp(gpu, cat)
        for tp in problem.options.tps:
            if tp <= top and spec.supports_tp(tp):
                out.extend((gpu, tp, s)
                           for s in profiled_shares(problem, llm, gpu, tp, problem.options.shares))
    return out


def shape_groups(problem: PlanningProblem, llm: str) -> dict[tuple[str, int], list[float]]:
    """:func:`shapes` grouped by (gpu, tp): the shares of each, for one batched curve query."""
    out: dict[tuple[str, int], list[float]] = {}
    for gpu, tp, share in shapes(problem, llm):
        out.setdefault((gpu, tp), []).append(share)
    return out


@dataclass(frozen=True)
class PricedRows:
    """Consecutive replica counts of one (gpu, tp, share) shape of one LLM, priced at the target
    load: one entry per replica count in every array (the scan's output, before pruning)."""

    gpu: str
    tp: int
    share: float
    mu: float  # calls/s per replica
    memory_gib: float  # per GPU of each replica
    replicas: np.ndarray
    units: np.ndarray  # GPU use in 1/1000 GPU
    call_latency_s: np.ndarray  # the LLM's mean call latency
    latency_s: np.ndarray  # its weighted contribution to the objective
    change_s: np.ndarray  # re-planning penalty
    workflow_latency_s: Mapping[str, np.ndarray]  # per workflow: the LLM's contribution
    memory_share: float | None = None  # fraction of each GPU's memory; None: tied to the share

    def __len__(self) -> int:
        return len(self.replicas)

    @property
    def mem_units(self) -> np.ndarray:
        """Memory use in 1/1000 of a GPU's memory per replica count (= units when tied)."""
        if self.memory_share is None:
            return self.units
        return self.replicas.astype(np.int64) * gpu_units(self.tp, self.memory_share)

    def head(self, n: int) -> PricedRows:
        """The first ``n`` replica counts."""
        return PricedRows(self.gpu, self.tp, self.share, self.mu, self.memory_gib,
                          self.replicas[:n], self.units[:n], self.call_latency_s[:n],
                          self.latency_s[:n], self.change_s[:n],
                          {w: v[:n] for w, v in self.workflow_latency_s.items()},
                          self.memory_share)

    def candidate(self, llm: str, j: int) -> Candidate:
        """The ``j``-th replica count as a :class:`Candidate`."""
        return Candidate(llm, self.gpu, self.tp, self.share, int(self.replicas[j]),
                         int(self.units[j]), self.mu, float(self.call_latency_s[j]),
                         float(self.latency_s[j]), float(self.change_s[j]),
                         tuple((w, float(v[j])) for w, v in sorted(self.workflow_latency_s.items())),
                         self.memory_gib, self.memory_share)


def _change_s(problem: PlanningProblem, current: Instance | None, gpu: str, tp: int, share: float,
              replicas: np.ndarray, memory: float | None = None) -> np.ndarray:
    """The re-planning penalty of each replica count (:func:`changed_replicas`, vectorised)."""
    opts = problem.options
    if opts.current is None:
        return np.zeros(len(replicas))
    return opts.change_penalty_s * _changed(current, gpu, tp, share, replicas, memory)


def _current(problem: PlanningProblem, llm: str) -> Instance | None:
    cur = problem.options.current
    return cur.llms.get(llm) if cur is not None else None


def same_service(a: Any, b: Any) -> bool:
    """Whether two feasible serving curves of one compute share serve alike: the same μ, batch
    limit and service table, and no predicted preemption at the batch limit in either (the
    preemption term is then exactly 0 at every batch up to it: module doc of
    ``scepsy_profile.serving``)."""
    return (a.feasible and b.feasible and a.mu == b.mu and a.max_batch == b.max_batch
            and np.array_equal(a.service_ms, b.service_ms)
            and a.preemptions_at_batch(a.max_batch) == 0.0
            and b.preemptions_at_batch(b.max_batch) == 0.0)


def shape_curves(problem: PlanningProblem, demand: LLMDemand, gpu: str, tp: int,
                 shares: list[float], *, skip: bool = True) -> list[Any]:
    """The serving curves of ``demand``'s LLM on (gpu, tp) at ``shares``: one per share when
    memory is tied; with a memory grid, one per (share, memory) of the grid, share-major and
    memory ascending, dropping (``skip``) the memory values above the first whose curve serves
    as the largest memory that fits does (:func:`same_service`: they buy nothing)."""
    mems = problem.options.memory_shares
    if mems is None:
        return instance_curves(demand, problem.latency, gpu, tp, shares,
                               catalog=problem.catalog, policy=problem.policy)
    grid = sorted(set(mems))
    pairs = [(sh, m) for sh in shares for m in grid]
    curves = instance_curves(demand, problem.latency, gpu, tp, [p[0] for p in pairs],
                             catalog=problem.catalog, policy=problem.policy,
                             memory_shares=[p[1] for p in pairs])
    if not skip:
        return curves
    out: list[Any] = []
    n = len(grid)
    for i in range(len(shares)):
        row = curves[i * n:(i + 1) * n]
        live = [c for c in row if c.feasible]
        if not live:
            out.extend(row[:1])  # one infeasible curve stands for the share
            continue
        top = live[-1]
        for c in live:
            out.append(c)
            if c is top or same_service(c, top):
                break
    return out


def curve_key(problem: PlanningProblem, llm: str) -> tuple[Any, ...]:
    """What ``llm``'s serving curves (:func:`fitting_curves`) depend on besides the problem's
    cluster, options and latency model: its model and the token lengths of its demand, not its
    rate. LLMs of equal keys have the same curves (computed once: a fleet of thousands of LLMs
    has a few models)."""
    dem = problem.demands[llm]
    return (problem.models[llm], dem.input_mean, dem.output_mean, dem.group,
            dem.output_sq_mean, dem.io_mean, dem.longest_tokens)


def fitting_curves(problem: PlanningProblem, llm: str,
                   demand: LLMDemand) -> Iterator[tuple[str, int, Any]]:
    """(gpu, tp, serving curve) of every shape of ``llm`` whose instance fits in memory, in
    :func:`shape_groups` order (``demand``: the LLM's :func:`~scepsy_opt.prediction.pipeline.llm_demand`);
    with a memory grid, every (share, memory) of :func:`shape_curves`."""
    for (gpu, tp), shares in shape_groups(problem, llm).items():
        for curve in shape_curves(problem, demand, gpu, tp, shares):
            if curve.feasible:
                yield gpu, tp, curve


def price(problem: PlanningProblem, allocation: Allocation) -> dict[str, Candidate]:
    """Each LLM's instance of ``allocation`` as a :class:`Candidate` (priced like the optimiser's)."""
    out = {}
    curves: dict[tuple[Any, ...], Any] = {}  # LLMs of equal curves (curve_key) on one instance
    for m in problem.llms:
        if m not in allocation.llms:
            raise InputError("allocation", f"llms.{m}", "an instance for every LLM the workflows call")
        inst = allocation.llms[m]
        dem = problem.demands[m]
        key = (curve_key(problem, m), inst.gpu, inst.tp, inst.share, inst.memory)
        if key not in curves:
            curves[key] = instance_curve(dem, problem.latency, inst.gpu, inst.tp, inst.share,
                                         catalog=problem.catalog, policy=problem.policy,
                                         memory_share=inst.memory)
        curve = curves[key]
        r = np.array([float(inst.replicas)])
        mix, total, per_wf = _terms(problem, dem, curve, r)
        row = PricedRows(inst.gpu, inst.tp, inst.share, curve.mu, curve.memory.available_gib, r,
                         np.array([gpu_units(inst.tp, inst.share, inst.replicas)]), mix, total,
                         _change_s(problem, _current(problem, m), inst.gpu, inst.tp, inst.share, r,
                                   inst.memory),
                         per_wf, inst.memory)
        out[m] = row.candidate(m, 0)
    return out


def slo_checks(problem: PlanningProblem, allocation: Allocation) -> dict[str, SLOCheck]:
    """Each LLM with an SLO (``PlanOptions.slos``) against its instance of ``allocation`` at
    its rate per replica (:func:`scepsy_opt.prediction.slo.check`). An LLM split over GPU types
    (``allocation.splits``) is checked group by group, each at its fraction of the calls, and
    reported for all its calls: mean TTFT and TPOT and the attainment weighted by the
    fractions, a TTFT percentile as the groups' largest (the mixture's is at most that)."""
    out = {}
    for m, slo in problem.options.slos.items():
        if m in allocation.splits:
            out[m] = _split_check(problem, allocation, m, slo)
            continue
        if m not in allocation.llms:
            raise InputError("allocation", f"llms.{m}", "an instance for every LLM with an SLO")
        out[m] = _one_check(problem, allocation.llms[m], problem.demands[m], slo)
    return out


def _one_check(problem: PlanningProblem, inst: Instance, dem: LLMDemand,
               slo: CallSLO) -> SLOCheck:
    curve = instance_curve(dem, problem.latency, inst.gpu, inst.tp, inst.share,
                           catalog=problem.catalog, policy=problem.policy,
                           memory_share=inst.memory)
    return check(slo, curve, dem.rate / inst.replicas, call_delay_s(problem.latency),
                 inst.replicas)


def _split_check(problem: PlanningProblem, allocation: Allocation, m: str,
                 slo: CallSLO) -> SLOCheck:
    """:func:`slo_checks` of a split LLM (its docstring)."""
    parts = []
    for g, f in sorted(allocation.splits[m].items()):
        if g not in allocation.llms:
            raise InputError("allocation", f"llms.{g}", f"an instance for every group of {m}")
        if m in allocation.lengths:  # its range's calls, with their own statistics
            dem = llm_demand(
                {w: split_stats(st, allocation.splits, allocation.lengths)
                 for w, st in problem.stats.items()},
                allocation.models(problem.models), dict(problem.targets), g)
        else:
            dem = llm_demand(problem.stats, problem.models,  # m's demand at fraction f only
                             {w: f * t for w, t in problem.targets.items()}, m)
        parts.append((f, _one_check(problem, allocation.llms[g], dem, slo)))
    if any(not math.isfinite(c.ttft_s) for _, c in parts):
        return SLOCheck(slo, math.inf, math.inf, 0.0)
    ttft = (max(c.ttft_s for _, c in parts) if slo.ttft_percentile is not None
            else math.fsum(f * c.ttft_s for f, c in parts))
    return SLOCheck(slo, ttft, math.fsum(f * c.tpot_s for f, c in parts),
                    math.fsum(f * c.attainment for f, c in parts))


def slo_floors(problem: PlanningProblem, llm: str) -> tuple[float, float]:
    """The least zero-load TTFT (the SLO's statistic) and TPOT any shape of ``llm`` that fits
    achieves (s; inf when none fits): an SLO below them is met by no replica count."""
    slo, dem = problem.options.slos[llm], problem.demands[llm]
    delay = call_delay_s(problem.latency)
    best = (math.inf, math.inf)
    for _, _, curve in fitting_curves(problem, llm, dem):
        c = check(slo, curve, 0.0, delay, math.inf)  # single calls: the least delay
        best = (min(best[0], c.ttft_s), min(best[1], c.tpot_s))
    return best


@dataclass(frozen=True)
class _Scan:
    """One shape's replica scan in progress: steps ``s`` from ``start`` to ``cap`` are still to
    price (replicas ``k·s``, units ``per·s``; ``k = 1`` unless blocks), ``floor`` the latency at
    zero load once known."""

    curve: Any
    start: int
    cap: int
    per: int
    k: int
    floor: float = math.nan


@dataclass(frozen=True)
class _ScanSpec:
    """What every shape scan of one LLM shares (the options of :func:`generate_candidates`)."""

    problem: PlanningProblem
    demand: LLMDemand
    current: Instance | None
    caps: Mapping[str, int]
    prices: Mapping[str, float] | None
    memory_prices: Mapping[str, float] | None
    slack: float
    coarse: bool
    blocks: bool
    deadline: Deadline | None
    scans: dict[tuple[str, str, int], list[_Scan]] | None = None  # generate_candidates' scan_cache


def unoverloaded_replicas(curve: Any, rate: float, start: int, limit: int) -> int:
    """The fewest replicas, from ``start``, at which ``curve`` is not overloaded at the
    per-replica call rate ``rate / r`` (:func:`~scepsy_opt.prediction.pipeline.curve_preemptions`: predicted
    preemption above the policy's threshold); ``limit + 1`` when none up to ``limit`` is.
    Preemption grows with the rate, so the answer is found by doubling and bisection."""
    if rate <= 0 or not curve_preemptions(curve, rate / start)[1]:
        return start
    return first_true(lambda r: not curve_preemptions(curve, rate / r)[1], start, limit)


def _scans(spec: _ScanSpec, gpu: str, tp: int, live: list[Any]) -> list[_Scan]:
    """The replica range of each shape: from the fewest replicas that carry the load at
    ``max_utilisation`` to what the cap and ``max_replicas`` allow (empty ranges dropped)."""
    opts = spec.problem.options
    load = spec.problem.loads[spec.demand.llm]  # what every candidate carries at max_utilisation
    out = []
    tied = opts.memory_shares is None
    for c in live:
        k = 1
        if spec.blocks:
            k = replicas_per_gpu(c.share) if tied else min(replicas_per_gpu(c.share),
                                                           replicas_per_gpu(c.memory_share))
        per = UNITS * tp if spec.blocks else gpu_units(tp, c.share)
        r_min = unoverloaded_replicas(c, spec.demand.rate,
                                      min_replicas(load, c.mu, opts.max_utilisation),
                                      opts.max_replicas)
        slo = opts.slos.get(spec.demand.llm)
        if slo is not None and r_min <= opts.max_replicas:
            r_min = fewest_replicas(slo, c, spec.demand.rate, r_min, opts.max_replicas,
                                    call_delay_s(spec.problem.latency))
        s_cap = min(spec.caps.get(gpu, 0) // per, opts.max_replicas // k)
        if not tied and not spec.blocks:  # memory units within the budget too
            s_cap = min(s_cap, spec.caps.get(gpu, 0) // gpu_units(tp, c.memory_share))
        s_min = math.ceil(r_min / k)
        if s_min <= s_cap:
            out.append(_Scan(c, s_min, s_cap, per, k))
    return out


def _scan_group(spec: _ScanSpec, gpu: str, tp: int, live: list[Any],
                best_v: float) -> tuple[list[PricedRows], float]:
    """Price the replica counts of every share of one (gpu, tp), in batches over the shares.

    A shape's scan stops once its latency is within ``prune_rel`` of its zero-load floor (at or
    above the current replica count), or, under ``prices``, once ``floor + π·units`` passes the
    least ``v`` seen (``best_v``, carried across the LLM's groups) plus ``slack``. Returns the
    priced rows and the updated ``best_v``."""
    problem, opts = spec.problem, spec.problem.options
    key = (spec.demand.llm, gpu, tp)
    if spec.scans is not None and key in spec.scans:
        pending = spec.scans[key]
    else:
        pending = _scans(spec, gpu, tp, live)
        if spec.scans is not None:
            spec.scans[key] = pending
    r0 = spec.current.replicas if spec.current is not None else 0
    price_ = spec.prices.get(gpu, 0.0) if spec.prices is not None else 0.0
    mprice = spec.memory_prices.get(gpu, 0.0) if spec.memory_prices is not None else 0.0
    tied = opts.memory_shares is None
    rows: list[PricedRows] = []
    chunk, first = 16, True
    while pending:
        if spec.deadline is not None:
            spec.deadline.check()
        if spec.coarse:
            steps = np.concatenate(([0], 2 ** np.arange(0, 40)))
            rs = [np.unique(np.minimum(p.start + steps, p.cap)).astype(float) for p in pending]
        else:
            rs = [np.arange(p.start, min(p.cap, p.start + chunk - 1) + 1, dtype=float)
                  for p in pending]
        rs = [r * p.k for p, r in zip(pending, rs, strict=True)]  # steps -> replicas
        if first:  # r = ∞ prices the zero-load floor: more replicas cannot get below it
            rs = [np.concatenate(([math.inf], r)) for r in rs]
        results = class_latencies_many(spec.demand, [p.curve for p in pending], problem.latency, rs)
        nxt = []
        for p, r_arr, (mix, per_class) in zip(pending, rs, results, strict=True):
            total, per_wf = _weighted(problem, spec.demand, per_class, r_arr.shape)
            floor = p.floor
            if first:
                floor = float(total[0])
                r_arr, mix, total = r_arr[1:], mix[1:], total[1:]
                per_wf = {w: v[1:] for w, v in per_wf.items()}
            mem = None if tied else p.curve.memory_share
            change = _change_s(problem, spec.current, gpu, tp, p.curve.share, r_arr, mem)
            units = p.per * (r_arr // p.k)
            stop = (r_arr >= r0) & (total <= floor * (1.0 + opts.prune_rel))
            if spec.prices is not None:  # beyond this, v ≥ floor + π·units > v*_m + slack
                use = price_ * units
                if mprice:  # ... + ρ·memory units (two resources)
                    use = use + mprice * (units if mem is None else r_arr * gpu_units(tp, mem))
                v = total + change + use
                best_v = min(best_v, float(v.min()))
                stop |= (r_arr >= r0) & (floor + use > best_v + spec.slack)
            done = bool(stop.any()) or spec.coarse
            n = int(np.argmax(stop)) + 1 if stop.any() else len(r_arr)  # more gain < prune_rel
            rows.append(PricedRows(gpu, tp, p.curve.share, p.curve.mu,
                                   p.curve.memory.available_gib, r_arr, units, mix, total, change,
                                   per_wf, mem).head(n))
            last = int(r_arr[-1]) // p.k
            if not done and last < p.cap:
                nxt.append(_Scan(p.curve, last + 1, p.cap, p.per, p.k, floor))
        pending, first = nxt, False
        chunk = min(chunk * 4, 4096)
    return rows, best_v


def generate_candidates(problem: PlanningProblem, *, prune: bool = True,
                        max_units: Mapping[str, int] | None = None, coarse: bool = False,
                        prices: Mapping[str, float] | None = None,
                        slack: float = math.inf,
                        memory_prices: Mapping[str, float] | None = None,
                        curve_cache: dict[tuple[str, str, int], list[Any]] | None = None,
                        blocks: bool = False, deadline: Deadline | None = None,
                        scan_cache: dict[tuple[str, str, int], list[_Scan]] | None = None,
                        ) -> CandidateSet:
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
    between calls on the same problem; ``scan_cache`` keeps each shape's replica range (from
    the fewest replicas that carry the load unoverloaded, a third of a scan's time) between
    calls on the same problem with the same ``max_units``, ``blocks`` and ``curve_cache``.

    ``blocks``: count GPUs as whole-GPU blocks of one LLM shape (``scepsy_place.formulations.blocks``): a
    block of ``tp`` GPUs holds ``k = replicas_per_gpu(share)`` replicas, so only replica counts
    that fill their blocks (multiples of ``k``) are candidates (fewer replicas cost as many GPUs
    and are slower), ``units = 1000·tp·replicas/k``, and pruning keeps a candidate unless another
    uses no more units, costs no more and has no larger TP degree (the block capacity rows weigh
    larger TP groups more).

    ``memory_prices`` (per GPU type, per memory unit; two resources): ``v_c`` gains
    ``ρ·mem_units_c`` and ``LB`` subtracts ``Σ_t ρ_t·budget_t`` as well.

    ``deadline``: raise :class:`TimeLimitReached` once it passes (checked per batch of curves).
    """
    t0 = time.perf_counter()
    budgets = {g: n * UNITS for g, n in problem.cluster.budgets().items()}
    caps = dict(max_units) if max_units is not None else budgets
    by_llm: dict[str, tuple[Candidate, ...]] = {}
    least: dict[str, float] = {}
    generated = curves = 0
    unfit = []
    for m in problem.llms:
        best_v = math.inf
        dem = problem.demands[m]
        spec = _ScanSpec(problem, dem, _current(problem, m), caps, prices, memory_prices, slack,
                         coarse, blocks, deadline, scan_cache)
        rows: list[PricedRows] = []
        any_fit = False
        for (gpu, tp), shares in shape_groups(problem, m).items():
            if deadline is not None:
                deadline.check()
            key = (m, gpu, tp)
            if curve_cache is not None and key in curve_cache:
                curves_ = curve_cache[key]
            else:
                curves_ = shape_curves(problem, dem, gpu, tp, shares, skip=prune)
                if curve_cache is not None:
                    curve_cache[key] = curves_
            curves += len(curves_)
            live = [c for c in curves_ if c.feasible]
            any_fit = any_fit or bool(live)
            if live:
                group, best_v = _scan_group(spec, gpu, tp, live, best_v)
                rows.extend(group)
        if not any_fit:
            unfit.append(m)
        generated += sum(len(row) for row in rows)
        cands = _candidates(m, rows, prune, by_tp=blocks)
        if prices is not None and cands:
            mp = memory_prices or {}
            v = np.array([c.cost + prices.get(c.gpu, 0.0) * c.units
                          + (mp.get(c.gpu, 0.0) * c.mem_units if mp.get(c.gpu, 0.0) else 0.0)
                          for c in cands])
            least[m] = float(v.min())
            cands = [c for c, x in zip(cands, v, strict=True) if x - least[m] <= slack]
        by_llm[m] = tuple(cands)
    kept = sum(len(c) for c in by_llm.values())
    return CandidateSet(MappingProxyType(by_llm), generated, kept, curves, tuple(unfit),
                        time.perf_counter() - t0, MappingProxyType(least))


def _candidates(llm: str, rows: list[PricedRows], prune: bool,
                by_tp: bool = False) -> list[Candidate]:
    """Candidate objects from the priced rows; with ``prune``, per GPU type only those no other
    beats on both units and cost (on equal cost the fewest units, then tp, share, replicas);
    with ``by_tp`` the other must also have no larger TP degree. Rows with a memory share of
    their own (two resources) are pruned on units, memory units and cost (:func:`_pareto3`;
    blocks: on units, cost and TP degree, the block's replicas fit both resources)."""
    out = []
    for gpu in sorted({row.gpu for row in rows}):
        mine = [row for row in rows if row.gpu == gpu]
        if not by_tp and any(row.memory_share is not None for row in mine):
            out.extend(_pareto3(llm, mine, prune))
            continue
        idx = np.concatenate([np.column_stack((np.full(len(row), i), np.arange(len(row))))
                              for i, row in enumerate(mine)]).astype(int)
        units = np.concatenate([row.units for row in mine])
        cost = np.concatenate([row.latency_s + row.change_s for row in mine])
        tp = np.concatenate([np.full(len(row), row.tp) for row in mine])
        share = np.concatenate([np.full(len(row), row.share) for row in mine])
        reps = np.concatenate([row.replicas for row in mine])
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
            out.append(mine[i].candidate(llm, int(j)))
    return out


def _pareto3(llm: str, mine: list[PricedRows], prune: bool) -> list[Candidate]:
    """The candidates of one GPU type's rows, in the order (units, memory units, cost, tp,
    share, memory share, replicas); with ``prune`` only those that no earlier one matches or
    beats on memory units and cost (earlier ones use no more units): the 3-D Pareto front."""
    idx = np.concatenate([np.column_stack((np.full(len(row), i), np.arange(len(row))))
                          for i, row in enumerate(mine)]).astype(int)
    units = np.concatenate([row.units for row in mine]).astype(np.int64)
    mem = np.concatenate([row.mem_units for row in mine]).astype(np.int64)
    cost = np.concatenate([row.latency_s + row.change_s for row in mine])
    tp = np.concatenate([np.full(len(row), row.tp) for row in mine])
    share = np.concatenate([np.full(len(row), row.share) for row in mine])
    mshare = np.concatenate([np.full(len(row), row.share if row.memory_share is None
                                     else row.memory_share) for row in mine])
    reps = np.concatenate([row.replicas for row in mine])
    order = np.lexsort((reps, mshare, share, tp, cost, mem, units))
    if prune:
        # a prefix-minimum Fenwick tree over the memory units of the kept candidates
        levels = np.unique(mem)
        pos = np.searchsorted(levels, mem)
        tree = [math.inf] * (len(levels) + 1)
        keep = []
        for k in order.tolist():
            i, best = int(pos[k]) + 1, math.inf
            while i > 0:
                best = min(best, tree[i])
                i -= i & -i
            if cost[k] < best:
                keep.append(k)
                i = int(pos[k]) + 1
                while i <= len(levels):
                    tree[i] = min(tree[i], float(cost[k]))
                    i += i & -i
        order = np.array(keep, dtype=int)
    out = []
    for k in order.tolist():
        i, j = idx[k]
        out.append(mine[i].candidate(llm, int(j)))
    return out


def fits_budget(problem: PlanningProblem, choice: Mapping[str, Candidate]) -> bool:
    """Whether ``choice`` is within every GPU type's budget of compute units and of memory
    units (exact integers)."""
    budgets = problem.cluster.budgets()
    return all(u <= budgets.get(g, 0) * UNITS
               for used in (units_by_gpu(choice.values()), mem_units_by_gpu(choice.values()))
               for g, u in used.items())
