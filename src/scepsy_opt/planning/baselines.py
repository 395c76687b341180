"""Baseline optimisers: the exact brute-force oracle, the paper's heuristic, MuxServe's greedy
co-location, naive splits, and the evaluation of a user's allocation.

Every optimiser here prices its answer with :func:`~scepsy_opt.planning.plans.plan_from_choice` (or
:func:`~scepsy_opt.planning.candidates.price`), so its objective is comparable to the MILP's to the last
bit; when it finds no allocation it returns an infeasible :class:`~scepsy_opt.planning.plans.Plan`
that says why (:func:`scepsy_opt.planning.milp.diagnose`).

* ``brute-force`` (:class:`BruteForce`): the exact oracle (status ``optimal``). A depth-first
  branch and bound over the product of every LLM's candidates (pruned by default, unpruned with
  ``prune=False``): a branch is cut when it exceeds a budget, leaves too few GPU units for the
  minimum of the LLMs still to choose, or when its cost so far plus a lower bound on those LLMs
  (each alone at its cheapest candidate within what their GPU type has left) exceeds the best
  found. Ties go to fewer GPU units, then to the earlier candidate (in
  :func:`~scepsy_opt.planning.candidates.generate_candidates`'s order) of the first LLM by name that
  differs. It refuses (``InputError``) when the product of the candidate counts exceeds
  ``max_product``. Max-throughput: the exact largest scale by the same kind of search over every
  (shape, replicas) of every LLM (:func:`capacity_scale`), then the min-latency allocation at
  that scale; with latency bounds, bisection on the scale (to 1e-6) with brute-force solves that
  respect the bounds.
* ``heuristic`` (:class:`Hierarchical`): the paper's hierarchical search. LLMs are ranked by
  latency share (each LLM's weighted ALP latency term at its smallest allocation). For each of a
  few *ordered share profiles* (weights ∝ latency share^α, α ∈ {1, ½, 2, 0}: heavier LLMs get
  larger shares), LLM by LLM in rank order: every LLM still to place keeps its minimum (the
  smallest instance that holds its weights and KV cache and carries its load); the LLM gets its
  minimum plus its weight's fraction of the spare GPUs of each type, and takes the best
  TP × share × replicas split within that, scored with the ALP. Left-over GPUs then go, one step
  at a time, to the LLM whose latency term they cut most (the paper's "waste no GPU"). The best
  profile wins. The paper's extra level that splits GPUs between workflows is folded into the
  ranking (workflow weights are part of each LLM's latency term).
* ``muxserve`` (:class:`MuxServeGreedy`): MuxServe's greedy co-location (Duan et al., ICML'24),
  which packs LLMs onto GPUs with MPS compute shares sized to their rates. LLMs in descending
  order of compute demand: the load (calls/s) times the GPU time per call
  (``tp·share / μ`` GPU·s) of the LLM's fewest-GPU candidate, i.e. the GPUs its calls keep busy
  (MuxServe's "computation requirement", rate times compute per request; continuous, so LLMs
  whose minimum rounds to the same share grid point are still ordered by need). Each LLM in turn
  takes its candidate with the fewest GPU units (every candidate carries the LLM's load at
  ``max_utilisation``), ties to the lower latency cost and then the earlier candidate, within
  what the budget has left once every LLM still to place keeps its minimum (as the paper's
  heuristic reserves it). Left-over GPUs stay unused: it meets the rates, it does not minimise
  latency. On a one-type cluster with memory tied to the compute share, every LLM gets its
  fewest-unit candidate, and it finds an allocation whenever one exists (latency bounds aside).
* ``independent`` (:class:`Independent`): every LLM sized alone for its own load: each GPU
  type's budget is split among the LLMs in proportion to their minimum-GPU candidate's units
  (``by="units"``) or their traced time share (``by="time"``), and each LLM takes its cheapest
  candidate within its own slice.
* ``equal-split`` (:class:`EqualSplit`): every LLM gets an equal slice of every GPU type and its
  cheapest candidate within it.
* ``user`` (:class:`UserAllocation`): evaluates a given allocation (status ``evaluated``):
  priced like a candidate; infeasible when an instance does not fit in memory (``memory``), the
  allocation exceeds a budget or a TP group does not fit a node, or an LLM's replicas do not
  carry its load at ``max_utilisation`` (``gpus``; ``max_scale`` is then the fraction of the
  targets the allocation carries).

The heuristics (status ``heuristic``) report as ``bound_s`` the relaxation "every LLM at its
cheapest candidate, budgets ignored", so their ``gap`` is an honest upper bound on how far from
optimal they are; a user allocation's bound is the constant tool time. When a heuristic finds no
allocation although one exists, its infeasible plan's detail says so (``baseline_failed`` in its
stats). The heuristics answer max-throughput problems by bisection on the scale of the targets
(to 1e-4) with their own min-latency solves, a plan counting when it is feasible and, with
latency bounds, within them; a user allocation is evaluated at the largest scale it carries.

**Two resources** (``PlanOptions.memory_shares``): the brute-force oracle and the capacity search
check the compute and the memory budget of every GPU type exactly (it stays an exact oracle);
the heuristics count each candidate as ``max(units, mem_units)`` of one budget per type, which
keeps both budgets (a sum of maxima bounds both sums) at some loss of room.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from scepsy_common.bisection import Probe, largest_accepted
from scepsy_common.errors import InputError
from scepsy_common.units import UNITS, gpu_units
from scepsy_opt.allocation import Allocation
from scepsy_opt.planning.candidates import (
    Candidate,
    CandidateSet,
    fitting_curves,
    generate_candidates,
    price,
)
from scepsy_opt.planning.milp import diagnose
from scepsy_opt.planning.plans import Infeasibility, Plan, no_allocation_plan, plan_from_choice
from scepsy_opt.planning.problem import PlanningProblem
from scepsy_opt.prediction.pipeline import carried_scale
from scepsy_profile.catalog import default_catalog

DEFAULT_MAX_PRODUCT = 10**10
BISECT_REL = 1e-4  # max-throughput bisection stops when hi - lo <= BISECT_REL * hi
BRUTE_BISECT_REL = 1e-6  # the oracle's (and a user allocation's) bisection
BISECT_STEPS = 60
_REL = 1e-12  # float slack of the branch-and-bound comparisons


# --------------------------------------------------------------------------- shared helpers


def _budget_units(problem: PlanningProblem) -> dict[str, int]:
    return {g: n * UNITS for g, n in problem.cluster.budgets().items()}


def _eff(c: Candidate) -> int:
    """The units a heuristic counts for ``c``: ``max(units, mem_units)`` (= units when tied)."""
    return max(c.units, c.mem_units)


def _cset_stats(cset: CandidateSet) -> dict[str, Any]:
    return {"candidates_generated": cset.generated, "candidates_kept": cset.kept,
            "serving_curves": cset.curves, "candidates_s": cset.seconds}


def _unsolvable(cset: CandidateSet) -> bool:
    return bool(cset.unfit) or any(not c for c in cset.by_llm.values())


def _not_found(problem: PlanningProblem, cset: CandidateSet, name: str,
               stats: dict[str, Any]) -> Plan:
    """An infeasible plan for a baseline that found nothing: :func:`diagnose`'s answer, with
    the detail saying so when the cluster does carry the targets (another allocation exists)."""
    plan = diagnose(problem, cset, name, stats)
    info = plan.infeasible
    if info is not None and info.reason == "gpus" and info.max_scale >= 1.0:
        info = replace(info, detail=(
            f"{name} found no allocation that meets the targets within its budget split, "
            f"although the cluster carries up to {info.max_scale:.4g}x the targets"))
        plan = replace(plan, infeasible=info, stats=plan.stats.updated(baseline_failed=True))
    return plan


def _relaxed_bound(problem: PlanningProblem, cset: CandidateSet) -> float:
    """A lower bound on the optimum for a heuristic's plan: every LLM at its cheapest candidate,
    budgets ignored (plus the constant tool time)."""
    return math.fsum(min(c.cost for c in cs) for cs in cset.by_llm.values()) + problem.constant_s


def _sorted_cands(by_llm: Mapping[str, Sequence[Candidate]]) -> dict[str, list[Candidate]]:
    """Each LLM's candidates, cheapest first (then fewer units, then listing order)."""
    return {m: [c for _, c in sorted(enumerate(cs), key=lambda p: (p[1].cost, _eff(p[1]), p[0]))]
            for m, cs in by_llm.items()}


def _min_units(by_llm: Mapping[str, Sequence[Candidate]]) -> dict[str, dict[str, int]]:
    """Per LLM and GPU type, the fewest units of any candidate (types without one left out)."""
    out: dict[str, dict[str, int]] = {}
    for m, cs in by_llm.items():
        d: dict[str, int] = {}
        for c in cs:
            d[c.gpu] = min(d.get(c.gpu, _eff(c)), _eff(c))
        out[m] = d
    return out


def _workflow_latency(problem: PlanningProblem, choice: Mapping[str, Candidate]) -> dict[str, float]:
    """Predicted mean latency per targeted workflow of a choice (LLM terms + tool time)."""
    out = {w: problem.stats[w].tool_critical_s for w in problem.targets}
    for c in choice.values():
        for w, v in c.workflow_latency_s:
            if w in out:
                out[w] += v
    return out


def _bounds(problem: PlanningProblem) -> dict[str, float]:
    """The latency bounds on targeted workflows."""
    return {w: b for w, b in problem.options.latency_bound_s.items() if w in problem.targets}


def _within_bounds(problem: PlanningProblem, choice: Mapping[str, Candidate]) -> bool:
    lat = _workflow_latency(problem, choice)
    return all(lat[w] <= b for w, b in _bounds(problem).items())


def _slice_choice(by_llm: Mapping[str, Sequence[Candidate]],
                  slices: Mapping[str, Mapping[str, int]]) -> dict[str, Candidate] | None:
    """Each LLM's cheapest candidate within its own per-type slice; None if one has none."""
    choice = {}
    for m, cs in _sorted_cands(by_llm).items():
        pick = next((c for c in cs if _eff(c) <= slices[m].get(c.gpu, 0)), None)
        if pick is None:
            return None
        choice[m] = pick
    return choice


# --------------------------------------------------------------------------- capacity (max-throughput)


@dataclass(frozen=True, slots=True)
class _CapOption:
    gpu: str
    tp: int
    share: float
    replicas: int
    units: int
    scale: float  # the fraction of the targets' load on this LLM it carries at max_utilisation
    mem_units: int = -1  # memory units (-1: = units, tied)
    memory_share: float | None = None

    @property
    def mem(self) -> int:
        return self.units if self.mem_units < 0 else self.mem_units


def _capacity_options(problem: PlanningProblem) -> dict[str, list[_CapOption]]:
    """Per LLM, every (shape, replicas) within the budget, Pareto-pruned per GPU type on
    (fewer units, larger scale). The mixture an LLM serves, hence its μ, does not depend on the
    scale of the targets, and its load (:func:`~scepsy_opt.prediction.pipeline.llm_load`) is linear in it,
    so these scales (:func:`~scepsy_opt.prediction.pipeline.carried_scale`) are exact."""
    budgets = _budget_units(problem)
    u = problem.options.max_utilisation
    out: dict[str, list[_CapOption]] = {}
    for m in problem.llms:
        load = problem.loads[m]
        raw: list[_CapOption] = []
        two = problem.options.memory_shares is not None
        for gpu, tp, curve in fitting_curves(problem, m, problem.demands[m]):
            per = gpu_units(tp, curve.share)
            top = min(budgets.get(gpu, 0) // per, problem.options.max_replicas)
            if not two:
                raw.extend(_CapOption(gpu, tp, curve.share, r, per * r,
                                      carried_scale(load, curve.mu, r, u))
                           for r in range(1, top + 1))
                continue
            mper = gpu_units(tp, curve.memory_share)
            top = min(top, budgets.get(gpu, 0) // mper)
            raw.extend(_CapOption(gpu, tp, curve.share, r, per * r,
                                  carried_scale(load, curve.mu, r, u), mper * r,
                                  curve.memory_share)
                       for r in range(1, top + 1))
        kept: list[_CapOption] = []
        for gpu in sorted({o.gpu for o in raw}):
            if two:  # Pareto on (fewer units, fewer memory units, larger scale)
                mine: list[_CapOption] = []
                for o in sorted((o for o in raw if o.gpu == gpu),
                                key=lambda o: (o.units, o.mem, -o.scale, o.tp, o.share,
                                               o.memory_share or 0.0)):
                    if not any(k.mem <= o.mem and k.scale >= o.scale for k in mine):
                        mine.append(o)
                kept.extend(mine)
                continue
            best = -math.inf
            for o in sorted((o for o in raw if o.gpu == gpu),
                            key=lambda o: (o.units, -o.scale, o.tp, o.share)):
                if o.scale > best:
                    kept.append(o)
                    best = o.scale
        out[m] = kept
    return out


def _alone_scale(problem: PlanningProblem) -> float:
    """An upper bound on the scale: every LLM alone with the whole cluster."""
    opts = _capacity_options(problem)
    return min((max((o.scale for o in v), default=0.0) for v in opts.values()), default=0.0)


def capacity_scale(problem: PlanningProblem, max_product: int = DEFAULT_MAX_PRODUCT,
                   ) -> tuple[float, dict[str, _CapOption]]:
    """The exact largest scale of the targets the cluster carries at ``max_utilisation``, and a
    (shape, replicas) per LLM that reaches it (brute force; 0 and {} when nothing fits)."""
    opts = _capacity_options(problem)
    if any(not v for v in opts.values()):
        return 0.0, {}
    _check_product(opts, max_product)
    budgets = _budget_units(problem)
    order = sorted(opts, key=lambda m: (len(opts[m]), m))
    lists = {m: sorted(opts[m], key=lambda o: (-o.scale, o.units)) for m in order}
    min_u = [min(o.units for o in lists[m]) for m in order]
    rem_u = [sum(min_u[d:]) for d in range(len(order) + 1)]
    best: list[Any] = [0.0, {}]  # the scale and the pick that reaches it
    used = dict.fromkeys(budgets, 0)
    used_m = dict.fromkeys(budgets, 0)
    pick: dict[str, _CapOption] = {}

    def rec(d: int, cur: float) -> None:
        if cur <= best[0]:
            return
        if d == len(order):
            best[0], best[1] = cur, dict(pick)
            return
        m = order[d]
        free = sum(budgets.values()) - sum(used.values())
        for o in lists[m]:
            if o.scale <= best[0]:
                break
            if used[o.gpu] + o.units > budgets[o.gpu] or rem_u[d + 1] > free - o.units:
                continue
            if used_m[o.gpu] + o.mem > budgets[o.gpu]:
                continue
            used[o.gpu] += o.units
            used_m[o.gpu] += o.mem
            pick[m] = o
            rec(d + 1, min(cur, o.scale))
            used[o.gpu] -= o.units
            used_m[o.gpu] -= o.mem
            del pick[m]

    rec(0, math.inf)
    return float(best[0]), best[1]


def _check_product(lists: Mapping[str, Sequence[Any]], max_product: int) -> None:
    product = math.prod(len(v) for v in lists.values())
    if product > max_product:
        raise InputError("brute-force", "candidates",
                         f"at most {max_product} combinations of the LLMs' candidates "
                         "(use a coarser share grid, fewer LLMs or the milp optimiser)", product)


def _bisect(problem: PlanningProblem, hi: float, solve_at: Callable[[PlanningProblem], Plan],
            ok: Callable[[PlanningProblem, Plan], bool], rel: float = BISECT_REL,
            ) -> tuple[Plan, float] | None:
    """The largest scale in (0, hi] at which ``solve_at`` gives a plan ``ok`` accepts, by
    bisection to ``rel`` (the highest first); None when no scale tried works."""
    def probe(x: float) -> Probe[Plan]:
        scaled = problem.scaled(x)
        plan = solve_at(scaled)
        return Probe(plan.feasible and ok(scaled, plan), plan)

    found = largest_accepted(probe, hi, rel=rel, max_steps=BISECT_STEPS)
    return (found.best, found.best_at) if found.best is not None else None


def _no_scale(problem: PlanningProblem, name: str, stats: dict[str, Any]) -> Plan:
    """Infeasible: no scale of the targets meets the latency bounds (or the optimiser found none)."""
    bounds = _bounds(problem)
    info = Infeasibility(
        "latency" if bounds else "gpus",
        f"{name} found no scale of the targets at which the workflows meet their latency "
        f"bounds ({', '.join(f'{w} {b:.4g} s' for w, b in bounds.items())})" if bounds else
        f"{name} found no scale of the targets it can serve", 0.0,
        {w: 0.0 for w in problem.targets}, None, ())  # no GPU budget is known to bind
    return no_allocation_plan(optimiser=name, status="infeasible", candidates={}, stats=stats,
                              infeasible=info, scale=0.0)


def _max_throughput_by_bisection(problem: PlanningProblem, name: str,
                                 solve_min: Callable[[PlanningProblem], Plan]) -> Plan:
    """Max-throughput for an optimiser that only solves min-latency problems."""
    t0 = time.perf_counter()
    hi = _alone_scale(problem)
    if hi <= 0:
        cset = generate_candidates(problem)
        return diagnose(problem, cset, name, {"total_s": time.perf_counter() - t0})
    found = _bisect(problem, hi, solve_min, _within_bounds_plan)
    if found is None:
        return _no_scale(problem, name, {"total_s": time.perf_counter() - t0})
    plan, s = found
    return replace(plan, scale=s, stats=plan.stats.updated(total_s=time.perf_counter() - t0))


def _within_bounds_plan(problem: PlanningProblem, plan: Plan) -> bool:
    return _within_bounds(problem, plan.candidates)


# --------------------------------------------------------------------------- brute force


def _search(problem: PlanningProblem, by_llm: Mapping[str, Sequence[Candidate]],
            bounds: Mapping[str, float] | None = None,
            ) -> tuple[dict[str, Candidate] | None, int]:
    """The cheapest choice within the budgets (and latency bounds), exact, ties to fewer units
    then to listing order; and the number of search nodes visited.

    Depth first, each LLM's candidates cheapest first. A branch is cut when its cost so far plus
    a lower bound on the LLMs still to choose exceeds the best found: each of them at its
    cheapest candidate within what is left of its GPU type once the others' minimum units are
    set aside (every LLM alone, so the bound is valid).
    """
    llms = sorted(by_llm)
    budgets = _budget_units(problem)
    types = sorted(budgets)
    index = {m: {id(c): j for j, c in enumerate(by_llm[m])} for m in llms}
    lists = _sorted_cands(by_llm)
    # fewest candidates first: the tree stays narrow near the root
    order = sorted(llms, key=lambda m: (len(lists[m]), m))
    n = len(order)
    min_u = [min(c.units for c in lists[m]) for m in order]
    rem_u = [sum(min_u[d:]) for d in range(n + 1)]
    # per LLM and type: units ascending and the cheapest cost within that many units
    frontier: list[dict[str, tuple[list[int], list[float]]]] = []
    for m in order:
        f = {}
        for g in types:
            cs = sorted((c.units, c.cost) for c in lists[m] if c.gpu == g)
            units, best_cost, low = [], [], math.inf
            for u, c in cs:
                low = min(low, c)
                units.append(u)
                best_cost.append(low)
            f[g] = (units, best_cost)
        frontier.append(f)
    rhs = {w: b - problem.stats[w].tool_critical_s for w, b in (bounds or {}).items()}
    wl = {m: [dict(c.workflow_latency_s) for c in lists[m]] for m in order}
    rem_wl = {w: [math.fsum(min((x.get(w, 0.0) for x in wl[m]), default=0.0) for m in order[d:])
                  for d in range(n + 1)] for w in rhs}
    flat = {m: [(c.cost, c.units, c.gpu) for c in lists[m]] for m in order}
    mems = {m: [c.mem_units for c in lists[m]] for m in order}

    best: list[Any] = [None, None]  # key, choice
    used = dict.fromkeys(budgets, 0)
    used_m = dict.fromkeys(budgets, 0)  # memory units (= used when tied)
    pick: dict[str, Candidate] = {}
    part_wl = dict.fromkeys(rhs, 0.0)
    nodes = [0]

    def rest_bound(d: int) -> float:
        """A lower bound on the cost of the LLMs order[d:], given what is used."""
        free = {g: budgets[g] - used[g] for g in types}
        total_free = sum(free.values())
        out = 0.0
        for k in range(d, n):
            others = rem_u[d] - min_u[k]
            low = math.inf
            for g in types:
                cap = free[g] - max(0, others - (total_free - free[g]))
                units, costs = frontier[k][g]
                i = bisect_right(units, cap)
                if i:
                    low = min(low, costs[i - 1])
            if low == math.inf:
                return math.inf
            out += low
        return out

    def rec(d: int, cost: float, units: int) -> None:
        nodes[0] += 1
        if d == n:
            total = math.fsum(pick[m].cost for m in llms)
            key = (total, units, tuple(index[m][id(pick[m])] for m in llms))
            if best[0] is None or key < best[0]:
                best[0], best[1] = key, {x: pick[x] for x in llms}  # by name, as the MILP's
            return
        m = order[d]
        free = sum(budgets.values()) - units
        need = rem_u[d + 1]
        for j, (c_cost, c_units, c_gpu) in enumerate(flat[m]):
            if used[c_gpu] + c_units > budgets[c_gpu] or need > free - c_units:
                continue
            c_mem = mems[m][j]
            if used_m[c_gpu] + c_mem > budgets[c_gpu]:  # the memory budget (two resources)
                continue
            used_m[c_gpu] += c_mem
            used[c_gpu] += c_units
            lb = cost + c_cost + (rest_bound(d + 1) if d + 1 < n else 0.0)
            if best[0] is not None and lb > best[0][0] * (1 + _REL):
                used[c_gpu] -= c_units
                used_m[c_gpu] -= c_mem
                if cost + c_cost > best[0][0] * (1 + _REL):
                    break  # cheapest first: the rest cost more
                continue
            lat = wl[m][j]
            if rhs and any(part_wl[w] + lat.get(w, 0.0) + rem_wl[w][d + 1] > r
                           for w, r in rhs.items()):
                used[c_gpu] -= c_units
                used_m[c_gpu] -= c_mem
                continue
            for w in rhs:
                part_wl[w] += lat.get(w, 0.0)
            pick[m] = lists[m][j]
            rec(d + 1, cost + c_cost, units + c_units)
            del pick[m]
            for w in rhs:
                part_wl[w] -= lat.get(w, 0.0)
            used[c_gpu] -= c_units
            used_m[c_gpu] -= c_mem

    rec(0, 0.0, 0)
    return best[1], nodes[0]


class BruteForce:
    """The exact oracle (module docstring): exhaustive search with bound and budget pruning."""

    name = "brute-force"

    def __init__(self, prune: bool = True, max_product: int = DEFAULT_MAX_PRODUCT) -> None:
        self.prune = prune
        self.max_product = max_product

    def solve(self, problem: PlanningProblem) -> Plan:
        if problem.options.kind.scales_targets:
            return self._max_throughput(problem)
        return self._min_latency(problem)

    def _min_latency(self, problem: PlanningProblem, bounds: Mapping[str, float] | None = None,
                     ) -> Plan:
        t0 = time.perf_counter()
        cset = generate_candidates(problem, prune=self.prune)
        stats = _cset_stats(cset)
        if _unsolvable(cset):
            return diagnose(problem, cset, self.name, stats)
        _check_product(cset.by_llm, self.max_product)
        t1 = time.perf_counter()
        choice, nodes = _search(problem, cset.by_llm, bounds)
        stats.update(solve_s=time.perf_counter() - t1, nodes=nodes,
                     total_s=time.perf_counter() - t0)
        if choice is None:
            if bounds:
                return no_allocation_plan(optimiser=self.name, status="infeasible", candidates={},
                                          stats=stats)
            return diagnose(problem, cset, self.name, stats)
        return plan_from_choice(problem, self.name, "optimal", choice, stats)

    def _max_throughput(self, problem: PlanningProblem) -> Plan:
        t0 = time.perf_counter()
        scale, _ = capacity_scale(problem, self.max_product)
        if scale <= 0:
            cset = generate_candidates(problem, prune=self.prune)
            return diagnose(problem, cset, self.name, {"total_s": time.perf_counter() - t0})
        bounds = _bounds(problem)
        if not bounds:  # the min-latency allocation at the largest scale
            plan = self._min_latency(problem.scaled(scale * (1 - 1e-9)))
            return replace(plan, scale=scale, stats=plan.stats.updated(total_s=time.perf_counter() - t0))
        found = _bisect(problem, scale, lambda p: self._min_latency(p, bounds),
                        lambda p, plan: True, BRUTE_BISECT_REL)
        if found is None:
            return _no_scale(problem, self.name, {"total_s": time.perf_counter() - t0})
        plan, s = found
        return replace(plan, scale=s, stats=plan.stats.updated(total_s=time.perf_counter() - t0))


# --------------------------------------------------------------------------- the paper's heuristic


def _placement(llms: Sequence[str], min_units: Mapping[str, Mapping[str, int]],
               free: Mapping[str, int]) -> dict[str, str] | None:
    """A GPU type per LLM on which each gets its minimum (greedy, largest first, each on the type
    with the most room left; exact on a one-type cluster), or None when they do not all fit."""
    room = dict(free)
    out = {}
    for m in sorted(llms, key=lambda m: (-min(min_units[m].values()), m)):
        fits = [(room[g] - u, g) for g, u in min_units[m].items() if u <= room.get(g, 0)]
        if not fits:
            return None
        _, g = max(fits)
        room[g] -= min_units[m][g]
        out[m] = g
    return out


class _CandidateHeuristic:
    """A heuristic over the priced candidates: :meth:`choose` picks one per LLM (or None);
    this frame prices the answer like the MILP's, diagnoses unsolvable problems and answers
    max-throughput problems by bisection on the scale."""

    name = ""

    def choose(self, problem: PlanningProblem, by_llm: Mapping[str, Sequence[Candidate]],
               ) -> tuple[dict[str, Candidate] | None, dict[str, Any]]:
        raise NotImplementedError

    def solve(self, problem: PlanningProblem) -> Plan:
        if problem.options.kind.scales_targets:
            # the bisection needs only whether a scale works: no diagnosis of the failures
            return _max_throughput_by_bisection(
                problem, self.name, lambda p: self._min_latency(p, explain=False))
        return self._min_latency(problem)

    def _min_latency(self, problem: PlanningProblem, explain: bool = True) -> Plan:
        """The heuristic's plan; an infeasible one says why (:func:`diagnose`) unless
        ``explain`` is False."""
        t0 = time.perf_counter()
        cset = generate_candidates(problem)
        stats = _cset_stats(cset)
        unexplained = no_allocation_plan(optimiser=self.name, status="infeasible", candidates={},
                                         stats=stats)
        if _unsolvable(cset):
            return diagnose(problem, cset, self.name, stats) if explain else unexplained
        choice, extra = self.choose(problem, cset.by_llm)
        stats.update(total_s=time.perf_counter() - t0, **extra)
        if choice is None:
            return _not_found(problem, cset, self.name, stats) if explain else unexplained
        return plan_from_choice(problem, self.name, "heuristic", choice, stats,
                                bound_s=_relaxed_bound(problem, cset))


class _SliceBaseline(_CandidateHeuristic):
    """Each LLM takes its cheapest candidate within its own slice of the budget; subclasses say
    how the budget is sliced (:meth:`slices`)."""

    def slices(self, problem: PlanningProblem, by_llm: Mapping[str, Sequence[Candidate]],
               ) -> dict[str, dict[str, int]]:
        raise NotImplementedError

    def choose(self, problem: PlanningProblem, by_llm: Mapping[str, Sequence[Candidate]],
               ) -> tuple[dict[str, Candidate] | None, dict[str, Any]]:
        return _slice_choice(by_llm, self.slices(problem, by_llm)), {}


class Hierarchical(_CandidateHeuristic):
    """The paper's hierarchical heuristic allocation search (module docstring)."""

    name = "heuristic"
    exponents: tuple[float, ...] = (1.0, 0.5, 2.0, 0.0)  # ordered share profiles, α

    def choose(self, problem: PlanningProblem, by_llm: Mapping[str, Sequence[Candidate]],
               ) -> tuple[dict[str, Candidate] | None, dict[str, Any]]:
        choice, alpha = self.search(problem, by_llm)
        return choice, {"profile_alpha": alpha}

    def search(self, problem: PlanningProblem, by_llm: Mapping[str, Sequence[Candidate]],
               ) -> tuple[dict[str, Candidate] | None, float | None]:
        """The best allocation over the share profiles, and the profile's α."""
        lists = _sorted_cands(by_llm)
        min_units = _min_units(by_llm)
        # latency share: the LLM's weighted latency term at its smallest allocation
        heavy = {}
        for m, cs in lists.items():
            fewest = min(_eff(c) for c in cs)
            heavy[m] = min(c.cost for c in cs if _eff(c) == fewest)
        rank = sorted(lists, key=lambda m: (-heavy[m], m))
        best: tuple[float, dict[str, Candidate], float] | None = None
        for alpha in self.exponents:
            choice = self._greedy(problem, lists, min_units, heavy, rank, alpha)
            if choice is None:
                continue
            obj = math.fsum(choice[m].cost for m in sorted(choice))
            if best is None or obj < best[0]:
                best = (obj, dict(sorted(choice.items())), alpha)  # by name, as the MILP's
        return (best[1], best[2]) if best else (None, None)

    @staticmethod
    def _greedy(problem: PlanningProblem, lists: Mapping[str, list[Candidate]],
                min_units: Mapping[str, Mapping[str, int]], heavy: Mapping[str, float],
                rank: Sequence[str], alpha: float) -> dict[str, Candidate] | None:
        free = _budget_units(problem)
        top = max(heavy.values())
        weight = {m: (heavy[m] / top) ** alpha if top > 0 and alpha > 0 else 1.0 for m in rank}
        choice: dict[str, Candidate] = {}
        for k, m in enumerate(rank):
            rest = rank[k + 1:]
            # every LLM still to place keeps its minimum; the spare GPUs of each type are
            # shared in proportion to the profile's weights, heaviest first
            place = _placement(rank[k:], min_units, free)
            if place is None:
                return None
            reserved = dict.fromkeys(free, 0)
            for x, g in place.items():
                reserved[g] += min_units[x][g]
            total = math.fsum(weight[x] for x in rank[k:])
            frac = weight[m] / total if total > 0 else 1.0 / len(rank[k:])
            pick = None
            for c in lists[m]:  # cheapest first: the best TP x share x replicas within its share
                spare = max(free[c.gpu] - reserved[c.gpu], 0)
                if _eff(c) > min(free[c.gpu], min_units[m][c.gpu] + math.floor(spare * frac)):
                    continue
                after = dict(free)
                after[c.gpu] -= _eff(c)
                if _placement(rest, min_units, after) is not None:
                    pick = c
                    break
            if pick is None:
                return None
            choice[m] = pick
            free[pick.gpu] -= _eff(pick)
        # left-over GPUs: each time to the LLM they help most, until nothing improves
        while True:
            gain, best = 0.0, None
            for m in rank:
                cur = choice[m]
                avail = dict(free)
                avail[cur.gpu] += _eff(cur)
                better = next(c for c in lists[m] if _eff(c) <= avail[c.gpu])
                if cur.cost - better.cost > gain:
                    gain, best = cur.cost - better.cost, (m, better)
            if best is None:
                return choice
            m, better = best
            free[choice[m].gpu] += _eff(choice[m])
            free[better.gpu] -= _eff(better)
            choice[m] = better


# --------------------------------------------------------------------------- MuxServe


def _compute_demand(problem: PlanningProblem, cands: Sequence[Candidate]) -> float:
    """An LLM's compute demand for :class:`MuxServeGreedy`: its load (calls/s) times the GPU time
    per call (GPU·s) of its fewest-unit candidate (ties to the cheaper, then the earlier one),
    i.e. the GPUs its calls keep busy on that shape; 0 without candidates."""
    if not cands:
        return 0.0
    c = min(cands, key=lambda c: (_eff(c), c.cost))
    per_call = c.units / (c.replicas * UNITS * c.mu) if c.mu > 0 else math.inf
    return problem.loads[c.llm] * per_call


class MuxServeGreedy(_CandidateHeuristic):
    """MuxServe's greedy co-location with MPS compute shares (module docstring)."""

    name = "muxserve"

    def choose(self, problem: PlanningProblem, by_llm: Mapping[str, Sequence[Candidate]],
               ) -> tuple[dict[str, Candidate] | None, dict[str, Any]]:
        demand = {m: _compute_demand(problem, cs) for m, cs in by_llm.items()}
        order = sorted(by_llm, key=lambda m: (-demand[m], m))
        min_units = _min_units(by_llm)
        free = _budget_units(problem)
        choice: dict[str, Candidate] = {}
        for k, m in enumerate(order):
            pick = self.smallest_fit(by_llm[m], free, order[k + 1:], min_units)
            if pick is None:
                return None, {"demand_order": order}
            choice[m] = pick
            free[pick.gpu] -= _eff(pick)
        return dict(sorted(choice.items())), {"demand_order": order}  # by name, as the MILP's

    @staticmethod
    def smallest_fit(cands: Sequence[Candidate], free: Mapping[str, int], rest: Sequence[str],
                     min_units: Mapping[str, Mapping[str, int]]) -> Candidate | None:
        """The candidate with the fewest units (then the cheapest, then the earliest) that fits
        ``free`` and leaves room for the minimum of every LLM in ``rest``; None if none does."""
        for c in sorted(cands, key=lambda c: (_eff(c), c.cost)):  # stable: then listing order
            if _eff(c) > free.get(c.gpu, 0):
                continue
            after = dict(free)
            after[c.gpu] -= _eff(c)
            if _placement(rest, min_units, after) is not None:
                return c
        return None


# --------------------------------------------------------------------------- naive splits


class Independent(_SliceBaseline):
    """Every LLM sized alone within its slice of the budget (module docstring)."""

    name = "independent"

    def __init__(self, by: Literal["units", "time"] = "units") -> None:
        if by not in ("units", "time"):
            raise InputError("independent", "by", "one of ['units', 'time']", by)
        self.by = by

    def slices(self, problem: PlanningProblem, by_llm: Mapping[str, Sequence[Candidate]],
               ) -> dict[str, dict[str, int]]:
        """Per LLM and GPU type, the units it may use."""
        min_units = _min_units(by_llm)
        key = {m: {g: float(u) for g, u in d.items()} for m, d in min_units.items()}
        if self.by == "time":
            share = {m: math.fsum(problem.weight(w) * problem.stats[w].llms[m].time_share
                                  for w in problem.targets if m in problem.stats[w].llms)
                     for m in by_llm}
            if any(v > 0 for v in share.values()):
                key = {m: dict.fromkeys(d, share[m]) for m, d in min_units.items()}
        out: dict[str, dict[str, int]] = {m: {} for m in by_llm}
        for g, b in _budget_units(problem).items():
            total = math.fsum(key[m].get(g, 0.0) for m in by_llm)
            for m in by_llm:
                out[m][g] = math.floor(b * key[m].get(g, 0.0) / total) if total > 0 else 0
        return out


class EqualSplit(_SliceBaseline):
    """Every LLM gets an equal slice of every GPU type (module docstring)."""

    name = "equal-split"

    def slices(self, problem: PlanningProblem, by_llm: Mapping[str, Sequence[Candidate]],
               ) -> dict[str, dict[str, int]]:
        each = {g: b // len(by_llm) for g, b in _budget_units(problem).items()}
        return dict.fromkeys(by_llm, each)


# --------------------------------------------------------------------------- a user's allocation


class UserAllocation:
    """Evaluates a given allocation (module docstring), by default the problem's current one
    (``PlanOptions.current``); without either, ``solve`` refuses."""

    name = "user"

    def __init__(self, allocation: Allocation | None = None) -> None:
        self.allocation = allocation

    def solve(self, problem: PlanningProblem) -> Plan:
        if self.allocation is None:  # default: the problem's current allocation
            if problem.options.current is None:
                raise InputError("plan", "current", "an allocation to evaluate (the 'user' "
                                 "optimiser prices the current allocation)")
            return UserAllocation(problem.options.current).solve(problem)
        t0 = time.perf_counter()
        plan, scale = self._evaluate(problem)
        if problem.options.kind.scales_targets and (plan.feasible or scale > 0):
            plan = self._max_throughput(problem, plan, scale)
        return replace(plan, stats=plan.stats.updated(total_s=time.perf_counter() - t0))

    def _evaluate(self, problem: PlanningProblem) -> tuple[Plan, float]:
        """The priced plan (infeasible when the allocation cannot run or carry the targets) and
        the largest scale of the targets the allocation carries (0 when it cannot run)."""
        alloc = self.allocation
        assert alloc is not None
        cat = problem.catalog or default_catalog()
        for m in problem.llms:
            inst = alloc.llms.get(m)
            if inst is not None and not cat.model(problem.models[m]).supports_tp(inst.tp):
                raise InputError("allocation", f"llms.{m}.tp",
                                 f"a TP degree {problem.models[m]} supports", inst.tp)
        priced = price(problem, alloc)
        u = problem.options.max_utilisation
        loads = problem.loads
        budgets = problem.cluster.budgets()
        used: dict[str, int] = {}
        used_m: dict[str, int] = {}
        for inst in alloc.llms.values():
            used[inst.gpu] = used.get(inst.gpu, 0) + gpu_units(inst.tp, inst.share, inst.replicas)
            used_m[inst.gpu] = used_m.get(inst.gpu, 0) + gpu_units(inst.tp, inst.memory_share,
                                                                   inst.replicas)
        stats: dict[str, Any] = {"gpus_used": {g: v / UNITS for g, v in sorted(used.items())}}
        if any(i.memory is not None for i in alloc.llms.values()):
            stats["gpu_memory_used"] = {g: v / UNITS for g, v in sorted(used_m.items())}
        zero = {w: 0.0 for w in problem.targets}

        def infeasible(info: Infeasibility) -> Plan:
            return no_allocation_plan(optimiser=self.name, status="infeasible",
                                      candidates=dict(sorted(priced.items())), stats=stats,
                                      infeasible=info, scale=info.max_scale)

        unfit = tuple(m for m, c in priced.items() if c.mu <= 0)
        if unfit:
            what = ", ".join(f"{m} ({problem.models[m]} on {priced[m].gpu} tp={priced[m].tp} "
                             f"share={priced[m].share:g})" for m in unfit)
            return infeasible(Infeasibility("memory", f"{what} does not fit in memory", 0.0,
                                            zero, unfit[0], unfit)), 0.0
        over = tuple(sorted(g for g, v in used.items() if v > budgets.get(g, 0) * UNITS))
        over_m = tuple(sorted(g for g, v in used_m.items() if v > budgets.get(g, 0) * UNITS
                              and g not in over))
        wide = tuple(sorted(m for m, c in priced.items() if c.tp > problem.cluster.max_tp(c.gpu, cat)))
        if over or over_m or wide:
            parts = [f"it uses {used[g] / UNITS:g} {g} GPUs of {budgets.get(g, 0)}" for g in over]
            parts += [f"it uses the memory of {used_m[g] / UNITS:g} {g} GPUs of "
                      f"{budgets.get(g, 0)}" for g in over_m]
            parts += [f"{m}'s TP group of {priced[m].tp} does not fit one {priced[m].gpu} node"
                      for m in wide]
            return infeasible(Infeasibility("gpus", "the allocation does not fit the cluster: "
                                            + "; ".join(parts), 0.0, zero,
                                            wide[0] if wide else None,
                                            tuple(sorted(set(over) | set(over_m)))
                                            or tuple(sorted({priced[m].gpu for m in wide})))), 0.0
        heads = {m: carried_scale(loads[m], priced[m].mu, priced[m].replicas, u)
                 for m in problem.llms if loads[m] > 0}
        bottleneck = min(heads, key=lambda m: (heads[m], m))
        scale = heads[bottleneck]
        if scale < 1.0 - 1e-9:
            tput = {w: scale * t for w, t in problem.targets.items()}
            return infeasible(Infeasibility(
                "gpus", f"the allocation carries at most {scale:.4g}x the targets at utilisation "
                f"{u:g} ({', '.join(f'{w} {v:.4g} req/s' for w, v in tput.items())}), bounded by "
                f"{bottleneck}", scale, tput, bottleneck, (priced[bottleneck].gpu,))), scale
        return plan_from_choice(problem, self.name, "evaluated", priced, stats,
                                bound_s=problem.constant_s), scale

    def _max_throughput(self, problem: PlanningProblem, plan: Plan, scale: float) -> Plan:
        """The allocation at the largest scale it carries (within the latency bounds)."""
        def at(p: PlanningProblem) -> Plan:
            return self._evaluate(p)[0]

        if not _bounds(problem):
            return replace(at(problem.scaled(scale * (1 - 1e-9))), scale=scale)
        found = _bisect(problem, scale * (1 - 1e-9), at, _within_bounds_plan, BRUTE_BISECT_REL)
        if found is None:
            return _no_scale(problem, self.name, dict(plan.stats))
        best, s = found
        return replace(best, scale=s)
