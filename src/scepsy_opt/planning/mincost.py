"""The min-cost objective: the cheapest GPUs that meet the targets and the latency bounds.

With ``PlanOptions(objective="min-cost")`` the plan minimises the price per hour of the GPUs it
uses, ``Σ_t p_t·n_t`` (``p_t`` USD per GPU-hour of GPU type ``t``, :func:`gpu_prices`; ``n_t``
an integer count of GPUs of type ``t``), over the same candidates as the other objectives
(:mod:`scepsy_opt.planning.candidates`: every candidate carries its LLM's load at ``max_utilisation``, so
the targets hold), within the cluster's GPUs and the latency bounds:

    min Σ_t p_t·n_t   s.t.  Σ_{c of m} x_c = 1                     (every LLM m)
                            Σ_{c on t} units_c·x_c ≤ 1000·n_t       (compute, every type t)
                            Σ_{c on t} mem_units_c·x_c ≤ 1000·n_t   (memory, every type t)
                            n_t ≤ G_t                               (the cluster's GPUs)
                            Σ_c ℓ_wc·x_c ≤ B_w − τ_w                 (mean latency bounds)
                            x binary, n integer

``ℓ_wc`` is candidate ``c``'s contribution to workflow ``w``'s predicted mean latency and
``τ_w`` the workflow's tool time on the critical path (:func:`slo_rows`: the mean latency is
linear in ``x``). Percentile bounds (``PlanOptions.latency_bounds``) are lazy constraints
verified with :mod:`scepsy_opt.prediction.tails`, exactly as for min-latency (:mod:`scepsy_opt.planning.milp`):
dominance no-good cuts and floor cuts (valid), linearised rows (steering), then a check of
the answer without the linearised rows.

Ties in cost are broken by latency exactly: a second solve minimises the weighted latency
among the allocations whose cost is the optimum (lexicographic). ``n_t`` is an aggregate count
(compute and memory summed over the type), a lower bound on the GPUs a placement uses; the
placement formulations give the placeable version.

Open pools (``nodes: auto``, :mod:`scepsy_opt.cluster`) make ``G_t`` the pool's ``max_nodes``
or, without one, a bound computed from a feasible plan: a plan of cost ``U`` uses at most
``⌊U/p_t⌋`` GPUs of type ``t``, so after any feasible plan the caps ``⌊U/p_t⌋`` lose no
cheaper plan (the first caps grow by doubling until a plan is found, or until more GPUs add no
candidate: then no number of GPUs meets the bounds). The plan's ``stats`` report the cost,
the GPUs used per type and, for open pools, what to buy.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pulp

from scepsy_common.errors import InputError
from scepsy_common.units import UNITS
from scepsy_opt.cluster import Cluster, GPUPool, sized_cluster
from scepsy_opt.planning.candidates import (
    Candidate,
    CandidateSet,
    fitting_curves,
    generate_candidates,
)
from scepsy_opt.planning.milp import (
    EXACT_ITERS,
    LINEARISE_ITERS,
    SOLVER,
    _bound_report,
    _bounds_text,
    _chosen,
    _diagnosed,
    _meets,
    _path_weight,
    _percentile_bounds,
    _solver,
    _status,
    capacity_shapes,
    choice_variables,
    dominance_cut,
    percentile_latencies,
    percentile_row,
    unit_latency,
    unit_needs,
)
from scepsy_opt.planning.plans import (
    Infeasibility,
    Plan,
    no_allocation_plan,
    plan_from_choice,
    time_limit_plan,
)
from scepsy_opt.planning.problem import Deadline, PlanningProblem, TimeLimitReached
from scepsy_opt.planning.solver import FAILED, SolverStopped
from scepsy_opt.prediction.pipeline import class_latencies, min_replicas
from scepsy_opt.prediction.tails import latency_quantiles
from scepsy_profile.catalog import default_catalog

Row = tuple[Mapping[Candidate, float], float]  # Σ coeff_c·x_c ≤ rhs
Choice = dict[str, Candidate]
COST_REL = 1e-9  # the lexicographic second solve: cost within this (relative) of the optimum
OPEN_LIMIT_GPUS = 1 << 16  # an open pool without max_nodes: at most this many GPUs of a type
NAME = "milp"


# -- prices and rows ----------------------------------------------------------------------------


def gpu_prices(problem: PlanningProblem) -> dict[str, float]:
    """Price per GPU-hour (USD) of every GPU type of the cluster: the pools' ``price_per_hour``
    where given (pools of one type must agree), else the catalog's; InputError when neither."""
    cat = problem.catalog or default_catalog()
    own: dict[str, tuple[int, float]] = {}
    first: dict[str, int] = {}
    usd: float | None
    for i, p in enumerate(problem.cluster.pools):
        first.setdefault(p.gpu, i)
        if p.price_per_hour is None:
            continue
        if not (math.isfinite(p.price_per_hour) and p.price_per_hour >= 0):
            raise InputError("cluster", f"pools[{i}].price_per_hour",
                             "a price >= 0 USD per GPU-hour", p.price_per_hour)
        j, usd = own.setdefault(p.gpu, (i, p.price_per_hour))
        if usd != p.price_per_hour:
            raise InputError("cluster", f"pools[{i}].price_per_hour",
                             f"the price of pools[{j}] ({usd:g}): the pools of one GPU type "
                             "share one price", p.price_per_hour)
    out = {}
    for gpu in sorted(first):
        if gpu in own:
            out[gpu] = float(own[gpu][1])
            continue
        usd = cat.price(gpu)
        if usd is None:
            raise InputError("cluster", f"pools[{first[gpu]}].price_per_hour",
                             f"a price per GPU-hour for {gpu} (the catalog has none: give "
                             "price_per_hour in the cluster or catalog file)")
        out[gpu] = float(usd)
    return out


def slo_rows(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]]) -> list[Row]:
    """The mean latency bounds (``PlanOptions.latency_bound_s``) of the targeted workflows as
    rows ``Σ_c ℓ_wc·x_c ≤ B_w − τ_w`` (``ℓ_wc`` the candidate's contribution to ``w``'s mean
    latency, ``τ_w`` its tool time on the critical path), sorted by workflow."""
    rows: list[Row] = []
    for w, bound in sorted(problem.options.latency_bound_s.items()):
        if w not in problem.targets:
            continue
        coeffs: dict[Candidate, float] = {}
        for m in sorted(cands):
            for c in cands[m]:
                v = dict(c.workflow_latency_s).get(w)
                if v is not None:
                    coeffs[c] = v
        rows.append((coeffs, bound - problem.stats[w].tool_critical_s))
    return rows


def gpus_used(choice: Mapping[str, Candidate]) -> dict[str, int]:
    """Per GPU type, the fewest whole GPUs holding the choice's compute and memory in aggregate:
    ``⌈max(Σ units, Σ mem_units) / 1000⌉`` (a lower bound on the GPUs a placement uses)."""
    units: dict[str, int] = {}
    mem: dict[str, int] = {}
    for c in choice.values():
        units[c.gpu] = units.get(c.gpu, 0) + c.units
        mem[c.gpu] = mem.get(c.gpu, 0) + c.mem_units
    return {g: -(-max(units[g], mem[g]) // UNITS) for g in sorted(units)}


def cost_per_hour(choice: Mapping[str, Candidate], prices: Mapping[str, float]) -> float:
    """USD per hour of the GPUs the choice uses (:func:`gpus_used`)."""
    return math.fsum(prices[g] * n for g, n in gpus_used(choice).items())


def nodes_to_buy(cluster: Cluster, gpus: Mapping[str, int]) -> dict[str, int]:
    """Per GPU type with an open pool, the nodes of its open pools that :func:`sized_cluster`
    adds to the fixed pools to hold ``gpus`` (GPUs used per type)."""
    fixed: dict[str, int] = {}
    for p in cluster.pools:
        if not p.open:
            fixed[p.gpu] = fixed.get(p.gpu, 0) + p.gpus
    opened = Cluster(cluster.name, tuple(p for p in cluster.pools if p.open))
    out = dict.fromkeys(sorted({p.gpu for p in opened.pools}), 0)
    for p in sized_cluster(opened, {g: n - fixed.get(g, 0) for g, n in gpus.items()}).pools:
        out[p.gpu] += p.nodes
    return out


def latency_cost(choice: Mapping[str, Candidate]) -> float:
    """The choice's weighted latency objective without the constant tool time (s)."""
    return math.fsum(choice[m].cost for m in sorted(choice))


def _llm_floors(problem: PlanningProblem, deadline: Deadline | None = None,
                ) -> dict[str, dict[str, float]]:
    """Per targeted workflow and LLM, the least zero-load (unlimited replicas) contribution of
    any shape of the LLM to the workflow's mean latency."""
    out: dict[str, dict[str, float]] = {w: {} for w in problem.targets}
    for m in problem.llms:
        dem = problem.demands[m]
        for _, _, curve in fitting_curves(problem, m, dem):
            if deadline is not None:
                deadline.check()
            _, per_class = class_latencies(dem, curve, problem.latency, np.array([math.inf]))
            per_wf: dict[str, float] = {}
            for w, k, i, o in dem.terms:
                per_wf[w] = per_wf.get(w, 0.0) + k * float(per_class[(i, o)][0])
            for w, v in per_wf.items():
                if w in out:
                    out[w][m] = min(out[w].get(m, math.inf), v)
    return out


def latency_floors(problem: PlanningProblem, deadline: Deadline | None = None,
                   ) -> dict[str, float]:
    """Per targeted workflow, a lower bound on its predicted mean latency at any number of GPUs:
    each LLM on the shape whose zero-load latency (unlimited replicas) for the workflow is the
    least, plus the tool time. A mean bound below it holds for no allocation."""
    return {w: problem.stats[w].tool_critical_s + math.fsum(v[m] for m in sorted(v))
            for w, v in _llm_floors(problem, deadline).items()}


def _unreachable(problem: PlanningProblem, deadline: Deadline) -> list[str]:
    """The latency bounds no number of GPUs meets: the mean ones above :func:`latency_floors`,
    the percentile ones above the percentile at every LLM's zero-load unit latency (the
    percentile grows with each unit latency, :mod:`scepsy_opt.prediction.tails`)."""
    per = _llm_floors(problem, deadline)
    out = []
    for w, b in sorted(problem.options.latency_bound_s.items()):
        if w in per:
            low = problem.stats[w].tool_critical_s + math.fsum(per[w][m] for m in sorted(per[w]))
            if low > b * (1 + 1e-9):
                out.append(f"{w}'s mean latency is at least {low:.4g} s at any number of GPUs, "
                           f"above its bound of {b:g} s")
    for w, (q, b) in _percentile_bounds(problem).items():
        st = problem.stats[w]
        unit = {m: (per[w].get(m, 0.0) / k if (k := _path_weight(st.llms[m])) > 0 else 0.0)
                for m in st.llms}
        low = latency_quantiles(st.paths, unit, (q,))[0]
        if not _meets(low, b):
            out.append(f"{w}'s predicted p{q:g} latency is at least {low:.4g} s at any number "
                       f"of GPUs, above its bound of {b:g} s")
    return out


# -- candidates ---------------------------------------------------------------------------------


def _bounded_workflows(problem: PlanningProblem) -> list[str]:
    """The targeted workflows with a mean or percentile bound, sorted."""
    ws = set(problem.options.latency_bound_s) | set(problem.options.latency_bounds)
    return sorted(w for w in ws if w in problem.targets)


def _redundant(problem: PlanningProblem, llm: str, w: str) -> bool:
    """Whether ``llm``'s contribution to ``w`` orders its candidates as their cost does (the LLM
    serves no other targeted workflow, ``w`` weighs > 0, no re-planning penalty)."""
    serves = [v for v in problem.targets if llm in problem.stats[v].llms]
    return (serves == [w] and problem.weight(w) > 0
            and (problem.options.current is None or problem.options.change_penalty_s == 0))


def prune_for_cost(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]], *,
                   deadline: Deadline | None = None,
                   whole: Callable[[Candidate], int] | None = None,
                   ) -> dict[str, tuple[Candidate, ...]]:
    """Per LLM and GPU type, the candidates no other beats on every count the min-cost problem
    reads: compute units, memory units, weighted latency and the contribution to each bounded
    workflow's latency (equal on all: the first in a fixed order survives). Exact: swapping a
    dominated candidate for its dominator never raises a GPU count, a bounded latency (mean or
    percentile: both grow with each LLM's latency) or the tie-breaking latency. A count that
    orders the candidates as another does is left out (memory tied to compute; the
    contribution of an LLM that serves one workflow), so the usual case is two-dimensional.
    ``whole``: the whole GPUs a candidate's replicas take alone, a further count (a plan that
    prices whole GPUs keeps the candidate whose replicas fill them)."""
    bounded = _bounded_workflows(problem)
    out: dict[str, tuple[Candidate, ...]] = {}
    for m in sorted(cands):
        kept: list[Candidate] = []
        ws = [w for w in bounded if not _redundant(problem, m, w)]
        for gpu in sorted({c.gpu for c in cands[m]}):
            if deadline is not None:
                deadline.check()
            mine = [c for c in cands[m] if c.gpu == gpu]
            cols = [[c.units for c in mine], [c.cost for c in mine]]
            if any(c.mem_units != c.units for c in mine):
                cols.append([c.mem_units for c in mine])
            if whole is not None:
                cols.append([whole(c) for c in mine])
            cols.extend([dict(c.workflow_latency_s).get(w, 0.0) for c in mine] for w in ws)
            vec = np.array(cols, dtype=float).T
            ties = [(c.tp, c.share, c.memory_share or 0.0, c.replicas) for c in mine]
            order = sorted(range(len(mine)), key=lambda i: (tuple(vec[i]), ties[i]))
            if vec.shape[1] == 2:  # sorted by units then cost: keep each strictly cheaper one
                cost = vec[order, 1]
                best = np.minimum.accumulate(np.concatenate(([math.inf], cost)))[:-1]
                kept.extend(mine[i] for i, ok in zip(order, cost < best, strict=True) if ok)
                continue
            front = np.empty((len(mine), vec.shape[1]))
            n = 0
            for i in order:
                if n and bool(np.any(np.all(front[:n] <= vec[i], axis=1))):
                    continue
                front[n] = vec[i]
                n += 1
                kept.append(mine[i])
        out[m] = tuple(kept)
    return out


def cost_candidates(problem: PlanningProblem, *, deadline: Deadline | None = None,
                    curve_cache: dict[tuple[str, str, int], list[Any]] | None = None,
                    whole: Callable[[Candidate], int] | None = None,
                    ) -> CandidateSet:
    """Every candidate of the problem (:func:`generate_candidates` without its latency-only
    pruning), pruned by :func:`prune_for_cost` (``whole``: its further count)."""
    cs = generate_candidates(problem, prune=False, deadline=deadline, curve_cache=curve_cache)
    by_llm = prune_for_cost(problem, cs.by_llm, deadline=deadline, whole=whole)
    return dataclasses.replace(cs, by_llm=by_llm, kept=sum(len(v) for v in by_llm.values()))


# -- the MILP -----------------------------------------------------------------------------------


def _model(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
           prices: Mapping[str, float], caps: Mapping[str, int], rows: Sequence[Row], *,
           objective: str, cost_cap: float | None = None, latency_cap: float | None = None,
           ) -> tuple[pulp.LpProblem, dict[str, list[tuple[Candidate, Any]]]]:
    """The min-cost MILP (module docstring) with ``rows``; ``objective`` "cost" or "latency"
    (the tie-break), optional caps on the cost (USD/h) and the weighted latency (s)."""
    prob = pulp.LpProblem("scepsy_min_cost", pulp.LpMinimize)
    xs: dict[str, list[tuple[Candidate, Any]]] = dict(choice_variables(prob, cands))
    ns = {g: prob.add_variable(f"n{i}", 0, caps[g], pulp.LpInteger)
          for i, g in enumerate(sorted(caps))}
    cost = pulp.LpAffineExpression([(ns[g], prices[g]) for g in sorted(ns) if prices[g]])
    latency = pulp.LpAffineExpression([(v, c.cost) for m in xs for c, v in xs[m]])
    prob += cost if objective == "cost" else latency
    for j, m in enumerate(xs):
        prob += pulp.LpAffineExpression([(v, 1) for _, v in xs[m]]) == 1, f"one_{j}"
    for i, g in enumerate(sorted(ns)):
        for kind in ("units", "mem_units"):
            terms = [(v, getattr(c, kind)) for m in xs for c, v in xs[m] if c.gpu == g]
            if terms:
                prob += pulp.LpAffineExpression([*terms, (ns[g], -UNITS)]) <= 0, f"{kind}_{i}"
    for j, (coeffs, rhs) in enumerate(rows):
        terms = [(v, coeffs[c]) for m in xs for c, v in xs[m] if c in coeffs]
        prob += pulp.LpAffineExpression(terms) <= rhs, f"row_{j}"
    if cost_cap is not None:
        prob += cost <= cost_cap, "cost_cap"
    if latency_cap is not None:
        prob += latency <= latency_cap, "latency_cap"
    return prob, xs


Solve = Callable[[list[Row], float | None], tuple[str, Choice | None, float]]


def _solve_fn(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
              prices: Mapping[str, float], caps: Mapping[str, int], deadline: Deadline,
              objective: str, cost_cap: float | None = None) -> Solve:
    """``solve(rows, cap) -> (status, choice, dual bound)``: the MILP with ``rows`` and the
    objective at most ``cap``."""

    def solve(rows: list[Row], cap: float | None) -> tuple[str, Choice | None, float]:
        prob, xs = _model(problem, cands, prices, caps, rows, objective=objective,
                          cost_cap=cap if objective == "cost" else cost_cap,
                          latency_cap=cap if objective == "latency" else None)
        prob.solve(_solver(problem, deadline))
        status, _, bound = _status(prob)
        if status not in ("optimal", "time_limit"):
            return status, None, math.inf
        return status, _chosen(xs), bound

    return solve


@dataclasses.dataclass(frozen=True)
class _Found:
    """One lexicographic phase's answer."""

    status: str  # optimal | time_limit | infeasible | time_limit_no_solution
    choice: Choice | None
    bound: float  # a proven lower bound on the phase's objective
    solves: int
    proven_infeasible: bool = False  # infeasible (percentile bounds): proven, or not


def _phase(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]], solve: Solve,
           value: Callable[[Choice], float], rows: list[Row]) -> _Found:
    """Minimise ``value`` (what ``solve`` minimises) within ``rows`` and the percentile bounds
    (lazy constraints, :mod:`scepsy_opt.planning.milp`'s scheme with this phase's objective)."""
    bounds = _percentile_bounds(problem)
    try:
        status, choice, bound = solve(rows, None)
    except TimeLimitReached:
        return _Found("time_limit_no_solution", None, 0.0, 0)
    if not bounds or choice is None:
        return _Found(status, choice, bound if choice is not None else math.inf, 1,
                      status == "infeasible")
    unit = {w: {c: unit_latency(problem, w, c) for m in problem.stats[w].llms for c in cands[m]}
            for w in bounds}

    def violated(ch: Choice) -> list[str]:
        got = percentile_latencies(problem, ch)
        return [w for w, (_, b) in bounds.items() if not _meets(got[w], b)]

    def nogood(ch: Choice, w: str) -> Row:
        return dominance_cut(problem, cands, unit[w], ch, w)

    def lin_row(w: str, ch: Choice, valid: bool) -> Row:
        return percentile_row(problem, cands, unit[w], ch, w, bounds[w], valid)

    def cuts(ch: Choice, bad: list[str]) -> list[Row]:
        return [nogood(ch, bad[0])] + [lin_row(w, ch, True) for w in bad]

    nogoods: list[Row] = []
    lins: list[Row] = []
    best: Choice | None = None
    proven = False
    lower = bound
    solves = 1
    try:
        for it in range(LINEARISE_ITERS):  # linearised rows steer towards a verified choice
            if it:
                status, choice, bound = solve(rows + nogoods + lins, None)
                solves += 1
                if status == "time_limit_no_solution":
                    raise TimeLimitReached("time limit")
                if choice is None:
                    break
            assert choice is not None
            if not lins:
                lower = max(lower, bound)
            bad = violated(choice)
            if not bad:
                best, proven = choice, not lins and status == "optimal"
                break
            nogoods.extend(cuts(choice, bad))
            lins.extend(lin_row(w, choice, False) for w in bad)
        for _ in range(EXACT_ITERS if not proven else 0):  # valid cuts only, below the best
            cap = None
            if best is not None:
                z = value(best)
                cap = z - COST_REL * max(1.0, abs(z))
            status, choice, bound = solve(rows + nogoods, cap)
            solves += 1
            if status == "time_limit_no_solution":
                break
            if choice is None:
                proven = status == "infeasible"
                if best is not None:
                    lower = value(best)
                break
            lower = max(lower, bound if math.isfinite(bound) else value(choice))
            bad = violated(choice)
            if not bad:
                best, proven = choice, status == "optimal"
                break
            nogoods.extend(cuts(choice, bad))
    except TimeLimitReached:
        if best is None:
            return _Found("time_limit_no_solution", None, lower, solves)
    if best is None:
        return _Found("infeasible", None, math.inf, solves, proven)
    return _Found("optimal" if proven else "time_limit", best,
                  value(best) if proven else min(lower, value(best)), solves)


# -- the plan -----------------------------------------------------------------------------------


def _caps(problem: PlanningProblem) -> dict[str, int]:
    """GPUs per type the plan may use: the cluster's budgets (open pools at ``max_nodes``)."""
    return problem.cluster.budgets()


def _with_caps(problem: PlanningProblem, caps: Mapping[str, int]) -> PlanningProblem:
    """``problem`` with every unbounded open pool given the nodes that hold ``caps[type]`` GPUs
    beyond the type's other pools (the first such pool of a type; the others none)."""
    fixed: dict[str, int] = {}
    for p in problem.cluster.pools:
        if not (p.open and p.nodes == 0):
            fixed[p.gpu] = fixed.get(p.gpu, 0) + p.gpus
    pools, done = [], set()
    for p in problem.cluster.pools:
        if p.open and p.nodes == 0:
            extra = 0 if p.gpu in done else max(0, caps[p.gpu] - fixed.get(p.gpu, 0))
            done.add(p.gpu)
            nodes = max(1, -(-extra // p.gpus_per_node))
            p = GPUPool(p.gpu, nodes, p.gpus_per_node, p.price_per_hour, True)
        pools.append(p)
    return dataclasses.replace(problem, cluster=Cluster(problem.cluster.name, tuple(pools)))


def _latency_infeasible(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
                        rows: Sequence[Row], found: _Found | None, stats: dict[str, Any]) -> Plan:
    """The infeasible plan of latency bounds no allocation within the GPUs meets."""
    mean = {w: b for w, b in sorted(problem.options.latency_bound_s.items())
            if w in problem.targets}
    fastest = []
    for (coeffs, rhs), w in zip(rows, mean, strict=True):
        best = math.fsum(min((coeffs.get(c, 0.0) for c in cands[m]), default=0.0)
                         for m in sorted(cands))
        if best > rhs * (1 + 1e-9) + 1e-12:
            fastest.append(f"{w}'s mean latency is at least "
                           f"{best + problem.stats[w].tool_critical_s:.4g} s (every LLM on its "
                           f"fastest candidate), above its bound of {mean[w]:g} s")
    parts = [f"{w} mean <= {b:g} s" for w, b in mean.items()]
    pct = _percentile_bounds(problem)
    if pct:
        parts.append(_bounds_text(pct))
    proven = found is None or found.proven_infeasible or not pct
    detail = (f"no allocation within the GPUs meets the latency bounds ({', '.join(parts)})"
              + (f": {'; '.join(fastest)}" if fastest else "")
              + ("" if proven else " (not proven impossible: a longer search may find one)"))
    info = Infeasibility("latency", detail, 0.0, {w: 0.0 for w in problem.targets}, None, ())
    st = dict(stats, latency_bounds_proven_infeasible=proven)
    if pct:
        st.update(latency_bounds=_bound_report(problem, None), latency_bounds_verified=False)
    return no_allocation_plan(optimiser=NAME, status="infeasible", candidates={}, stats=st,
                              infeasible=info, scale=0.0)


def _solve_fixed(problem: PlanningProblem, cset: CandidateSet, prices: Mapping[str, float],
                 caps: Mapping[str, int], deadline: Deadline, t0: float) -> Plan:
    """Min cost then, at that cost, min latency over ``cset`` within ``caps`` GPUs per type."""
    stats: dict[str, Any] = {"candidates_generated": cset.generated,
                             "candidates_kept": cset.kept, "serving_curves": cset.curves,
                             "candidates_s": cset.seconds, "solver": SOLVER,
                             "prices_per_hour": dict(sorted(prices.items()))}
    if cset.unfit or any(not c for c in cset.by_llm.values()):
        return _diagnosed(problem, cset, NAME, dict(stats, total_s=time.perf_counter() - t0),
                          deadline)
    cands = cset.by_llm
    rows = slo_rows(problem, cands)

    def usd(ch: Choice) -> float:
        return cost_per_hour(ch, prices)

    first = _phase(problem, cands, _solve_fn(problem, cands, prices, caps, deadline, "cost"),
                   usd, rows)
    stats["solves"] = first.solves
    if first.choice is None:
        stats["total_s"] = time.perf_counter() - t0
        if first.status == "time_limit_no_solution":
            return time_limit_plan(NAME, stats)
        if first.status in FAILED:  # HiGHS failed: say so, not a time limit
            raise SolverStopped(first.status, "the min-cost MILP")
        if first.status != "infeasible":
            return time_limit_plan(NAME, dict(stats, highs_status=first.status))
        if not rows and not _percentile_bounds(problem):
            return _diagnosed(problem, cset, NAME, stats, deadline)
        try:  # without the bounds: do the GPUs carry the targets at all?
            loose = _solve_fn(problem, cands, prices, caps, deadline, "cost")([], None)
        except TimeLimitReached:
            loose = ("time_limit_no_solution", None, math.inf)
        if loose[0] == "infeasible":
            return _diagnosed(problem, cset, NAME, stats, deadline)
        return _latency_infeasible(problem, cands, rows, first, stats)
    cost = usd(first.choice)
    # lexicographic: the least latency at the optimal cost (or at the incumbent's)
    cap = cost + COST_REL * max(1.0, cost)
    second = _Found("time_limit", first.choice, -math.inf, 0)
    try:
        run = _phase(problem, cands,
                     _solve_fn(problem, cands, prices, caps, deadline, "latency", cap),
                     latency_cost, rows)
        if run.choice is not None and latency_cost(run.choice) <= latency_cost(first.choice):
            second = run
        elif run.status == "optimal":  # the first answer is the least latency at its cost
            second = dataclasses.replace(run, choice=first.choice)
        stats["solves"] += run.solves
    except TimeLimitReached:
        pass
    choice = second.choice
    assert choice is not None
    status = "optimal" if first.status == "optimal" and second.status == "optimal" else "time_limit"
    cost = usd(choice)
    cost_bound = min(first.bound, cost) if math.isfinite(first.bound) else cost
    used = gpus_used(choice)
    stats.update(
        cost_per_hour=cost, cost_bound_per_hour=cost_bound,
        cost_gap=0.0 if cost <= 0 or first.status == "optimal" else max(cost - cost_bound, 0) / cost,
        gpus_used={g: used.get(g, 0) for g in sorted(caps)},
        total_s=time.perf_counter() - t0)
    if problem.cluster.open:
        stats["nodes_to_buy"] = nodes_to_buy(problem.cluster, used)
    if _percentile_bounds(problem):
        stats.update(latency_bounds=_bound_report(problem, choice), latency_bounds_verified=True,
                     latency_bounds_optimal=status == "optimal")
    lat_bound = second.bound if math.isfinite(second.bound) else 0.0  # latency >= 0
    return plan_from_choice(problem, NAME, status, choice, stats,  # type: ignore[arg-type]
                            bound_s=min(lat_bound, latency_cost(choice)) + problem.constant_s)


def _first_caps(problem: PlanningProblem, deadline: Deadline) -> dict[str, int]:
    """Initial GPUs per type: the budgets, and for each unbounded open type the GPUs that carry
    every LLM on that type alone with its fewest-GPU shapes, twice over (at least one node)."""
    caps = _caps(problem)
    shapes = capacity_shapes(problem, deadline)
    u = problem.options.max_utilisation
    for g in problem.cluster.unbounded:
        node = max(p.gpus_per_node for p in problem.cluster.pools if p.gpu == g)
        units = sum(min((per * min_replicas(problem.loads[m], mu, u)
                         for gpu, _, _, per, mu in shapes[m] if gpu == g), default=0)
                    for m in sorted(shapes))
        caps[g] += max(node, -(-2 * units // UNITS))
    return caps


def solve_min_cost(problem: PlanningProblem, cset: CandidateSet | None = None, *,
                   deadline: Deadline | None = None) -> Plan:
    """The cheapest GPUs (USD per hour) that meet the targets and the latency bounds, ties
    broken by latency (see the module docstring); ``cset``: the candidates (default: every
    candidate, :func:`cost_candidates`). Within ``deadline`` (default: the problem's time limit
    from now); statuses as for min-latency, the cost in ``plan.stats``."""
    left = Deadline.of(problem, deadline)
    t0 = time.perf_counter()
    prices = gpu_prices(problem)
    for g in problem.cluster.unbounded:
        if prices[g] <= 0:
            raise InputError("cluster", "pools", f"a price > 0 or max_nodes for the open pool "
                             f"of {g} (free GPUs without a limit have no cheapest count)",
                             prices[g])
    if cset is not None:
        caps = _caps(problem)
        for g in problem.cluster.unbounded:  # every candidate of the set fits
            caps[g] += -(-sum(max((max(c.units, c.mem_units) for c in cs if c.gpu == g),
                                  default=0) for cs in cset.by_llm.values()) // UNITS)
        try:
            return _solve_fixed(_with_caps(problem, caps), cset, prices, caps, left, t0)
        except TimeLimitReached:
            return time_limit_plan(NAME, {"total_s": time.perf_counter() - t0})
    cache: dict[tuple[str, str, int], list[Any]] = {}
    try:
        caps = _first_caps(problem, left) if problem.cluster.unbounded else _caps(problem)
        last_generated = -1
        while True:
            sized = _with_caps(problem, caps)
            cs = cost_candidates(sized, deadline=left, curve_cache=cache)
            plan = _solve_fixed(sized, cs, prices, caps, left, t0)
            if not problem.cluster.unbounded:
                return plan
            if plan.feasible:  # a plan of cost U uses at most U/p GPUs of each type
                cost = plan.stats.cost_per_hour
                assert cost is not None  # every feasible min-cost plan is priced
                tight = {g: math.floor(cost / prices[g] * (1 + 1e-12)) for g in
                         problem.cluster.unbounded}
                if all(tight[g] <= caps[g] for g in tight) or plan.status != "optimal":
                    return _final(problem, plan, caps)
                caps = {**caps, **{g: min(tight[g], OPEN_LIMIT_GPUS) for g in tight}}
                continue
            if plan.status != "infeasible" or cs.generated == last_generated or all(
                    caps[g] >= OPEN_LIMIT_GPUS for g in problem.cluster.unbounded):
                return _final(problem, plan, caps)  # more GPUs add no candidate: proven
            if plan.infeasible is not None and plan.infeasible.reason == "latency":
                low = _unreachable(problem, left)
                if low:  # proven: no number of GPUs meets these bounds
                    info = dataclasses.replace(plan.infeasible, detail="; ".join(low))
                    stats = plan.stats.updated(latency_bounds_proven_infeasible=True)
                    return _final(problem, dataclasses.replace(plan, infeasible=info,
                                                               stats=stats), caps)
            last_generated = cs.generated
            caps = {**caps, **{g: min(2 * caps[g], OPEN_LIMIT_GPUS)
                               for g in problem.cluster.unbounded}}
    except TimeLimitReached:
        return time_limit_plan(NAME, {"total_s": time.perf_counter() - t0})


def _final(problem: PlanningProblem, plan: Plan, caps: Mapping[str, int]) -> Plan:
    """The plan of an open cluster, with the GPU caps it was solved within."""
    stats = plan.stats.updated(open_caps={g: caps[g] for g in problem.cluster.unbounded})
    return dataclasses.replace(plan, stats=stats)


def cost_lower_bound(problem: PlanningProblem, prices: Mapping[str, float] | None = None,
                     shapes: Mapping[str, Sequence[Any]] | None = None, *,
                     deadline: Deadline | None = None,
                     least: Mapping[str, Sequence[int]] | None = None,
                     ) -> tuple[float, dict[str, float]]:
    """A lower bound on the price per hour (USD) of every allocation that carries the targets
    (placed or not, latency bounds or not), and the GPUs per type the bound's relaxation uses.

    LLM ``m`` on GPU type ``t`` takes at least ``f_mt = min over its shapes on t of
    units·min_replicas(ℓ_m, μ)`` GPU units (whole replicas at ``max_utilisation``, as
    :func:`scepsy_opt.planning.milp.scale_upper_bound` counts them at scale 1), which cost
    ``p_t·f_mt/1000`` an hour at least however they are packed. The bound is the LP
    ``min Σ p_t·f_mt·y_mt/1000`` s.t. ``Σ_t y_mt = 1``, ``Σ_m f_mt·y_mt ≤ 1000·G_t``,
    ``y ≥ 0`` (HiGHS): a plan pays for at least the units it holds, and pays whole GPUs where
    it holds parts of them. ``(inf, {})`` when no split of the LLMs over the types fits the
    cluster's GPUs (no allocation carries the targets); ``(0.0, {})``, the trivial bound,
    when HiGHS ends the LP otherwise (numerical trouble); an open pool without ``max_nodes``
    counts as unbounded. ``least``: per LLM, per shape of ``shapes``, the fewest replicas any
    allocation that meets the latency bounds runs (:func:`scepsy_opt.planning.milp.unit_needs`),
    for a bound that holds for those allocations only. Raises :class:`TimeLimitReached` when
    ``deadline`` passes first."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    left = Deadline.of(problem, deadline)
    shp = shapes if shapes is not None else capacity_shapes(problem, left)
    cost = dict(prices) if prices is not None else gpu_prices(problem)
    budgets = problem.cluster.budgets()
    unbounded = set(problem.cluster.unbounded) if problem.cluster.open else set()
    types = sorted(set(budgets) | unbounded)
    llms = sorted(shp)
    table = unit_needs(problem, shp, types, least)(1.0)
    if not np.all(np.any(np.isfinite(table), axis=1)):
        return math.inf, {}
    if left.remaining() <= 0:
        raise TimeLimitReached("cost lower bound")
    ii, jj = np.nonzero(np.isfinite(table))  # one column per (LLM, type) it can run on
    n = len(ii)
    f = table[ii, jj]
    obj = np.array([cost[types[j]] for j in jj], dtype=float) * f / UNITS
    capped = [j for j, t in enumerate(types) if t not in unbounded]
    on = np.isin(jj, capped)
    a_ub = coo_matrix((f[on], (np.searchsorted(capped, jj[on]), np.arange(n)[on])),
                      shape=(len(capped), n))
    b_ub = [budgets.get(types[j], 0) * UNITS for j in capped]
    a_eq = coo_matrix((np.ones(n), (ii, np.arange(n))), shape=(len(llms), n))
    res = linprog(obj, A_ub=a_ub if capped else None, b_ub=b_ub if capped else None, A_eq=a_eq,
                  b_eq=np.ones(len(llms)), bounds=(0, 1), method="highs")
    if res.status == 2:
        return math.inf, {}
    if res.status != 0:  # not a proof either way: the trivial bound
        return 0.0, {}
    gpus = np.bincount(jj, weights=f * res.x, minlength=len(types)) / UNITS
    return float(res.fun), {t: float(gpus[j]) for j, t in enumerate(types) if np.any(jj == j)}
