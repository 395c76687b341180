"""The optimiser and the placer in a closed loop: never hand on a plan that cannot be placed.

The MILP budgets GPUs in aggregate, which can admit allocations that no concrete placement
realises (shares that do not fit together on whole GPUs, TP groups that do not fit a node's free
NVLink domains). :func:`plan_and_place` places every optimal allocation; when replicas stay
unplaced it adds a *no-good cut* for the GPU types that failed — ``Σ_{c ∈ S_t} x_c ≤ |S_t| − 1``
over the candidates ``S_t`` the plan chose on type ``t``: that combination is forbidden, every
other stays allowed — and solves again, until a placeable optimum or a clear report that none
exists (the cut MILP is infeasible, or ``max_rounds`` is reached).

After the first cut the MILP runs over every candidate, unpruned: reduced-cost fixing is exact
only for the aggregate optimum (the best *placeable* allocation may cost more than its bound),
and dominance pruning may drop the placeable one (two whole GPUs cost more than three 0.6 shares
and use more units, yet only they fit on two GPUs). The MILP also gets the valid inequalities of
bin packing (:func:`packing_inequalities`), which remove most aggregate-only allocations at once,
so few rounds of no-good cuts remain. The loop's answer is then the cheapest
allocation the placer can place — exact when the placer is (tests check it against brute force
with the placer as the oracle). Above 64 GPUs the unpruned set is too large to re-solve round
after round: the loop then keeps the dominance-pruned candidates and reports ``exact=False``.

On a cluster with GPUs already in use (re-planning), the loop's MILP also gets one row per GPU
type bounding the units by the topology's free capacity (:func:`free_capacity_rows`): the
optimiser's cluster budgets count every GPU.

Formulations (``formulation``): ``aggregate`` is the loop above; ``blocks`` solves the
placeable-by-construction formulation of :mod:`scepsy_place.blocks` (one LLM shape per GPU,
whole-GPU blocks) and places it with the ``blocks`` placer in one round; ``auto`` (the CLI's
default) solves ``blocks`` and, up to :data:`UNPRUNED_MAX_GPUS` GPUs where the aggregate loop is
exact and cheap, the aggregate loop too, and keeps the better placed plan (lower objective; the
loop stops once its objective reaches the blocks plan's, so blocks win ties). Above that size the aggregate loop needs many rounds of placements that
cost seconds each at thousands of GPUs (docs/benchmarks.md), so ``auto`` is ``blocks`` there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from scepsy_opt.milp import Row, solve_min_latency
from scepsy_opt.planning import (
    UNITS,
    Candidate,
    CandidateSet,
    Plan,
    PlanningProblem,
    generate_candidates,
    optimiser,
)
from scepsy_place.blocks import block_candidates, capacity_rows
from scepsy_place.bounds import quality
from scepsy_place.placement import Placement, demands, place
from scepsy_place.topology import Topology
from scepsy_profile.errors import InputError

UNPRUNED_MAX_GPUS = 64
Formulation = Literal["aggregate", "blocks", "auto"]
FORMULATIONS: tuple[Formulation, ...] = ("aggregate", "blocks", "auto")


@dataclass(frozen=True)
class PlacedPlan:
    """A plan, its placement, and how many optimise-place rounds it took."""

    plan: Plan
    placement: Placement | None
    rounds: int
    history: tuple[Mapping[str, Any], ...]  # per round: objective, unplaced replicas
    quality: Mapping[str, Any] | None
    reason: str | None = None  # why no placeable plan exists (None when placed)
    exact: bool = True  # only valid cuts were used: the cheapest allocation the placer places
    formulation: str = "aggregate"  # the formulation whose plan this is
    # objective (s) per formulation tried (auto); inf where that formulation placed nothing
    compared: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def placed(self) -> bool:
        return self.placement is not None and self.placement.complete


def _failed_types(placement: Placement, plan: Plan) -> set[str]:
    return {plan.candidates[llm].gpu for llm, _, _ in placement.unplaced}


def plan_and_place(problem: PlanningProblem, topology: Topology, *, name: str = "milp",
                   policy: str = "hierarchical", max_rounds: int = 25, exact_rounds: int = 8,
                   placer_options: Mapping[str, Any] | None = None,
                   formulation: Formulation = "aggregate") -> PlacedPlan:
    """A placed plan for ``problem`` on ``topology`` by ``formulation`` (module docstring).

    ``blocks`` and ``auto`` apply to the MILP's min-latency objective; other optimisers and
    max-throughput use the aggregate loop whatever ``formulation`` says.
    """
    if formulation not in FORMULATIONS:
        raise InputError("plan", "formulation", f"one of {', '.join(FORMULATIONS)}", formulation)
    if formulation == "aggregate" or name != "milp" or problem.options.objective != "min-latency":
        return _aggregate_loop(problem, topology, name=name, policy=policy, max_rounds=max_rounds,
                               exact_rounds=exact_rounds, placer_options=placer_options)
    blocks = plan_blocks(problem, topology)
    if formulation == "blocks" or problem.cluster.total_gpus > UNPRUNED_MAX_GPUS:
        return blocks
    agg = _aggregate_loop(problem, topology, name=name, policy=policy, max_rounds=max_rounds,
                          exact_rounds=exact_rounds, placer_options=placer_options,
                          cutoff_s=blocks.plan.objective_s if blocks.placed else math.inf)
    tried = MappingProxyType({"aggregate": agg.plan.objective_s if agg.placed else math.inf,
                              "blocks": blocks.plan.objective_s if blocks.placed else math.inf})
    best = agg if agg.placed and (not blocks.placed or tried["aggregate"] <= tried["blocks"]) else (
        blocks if blocks.placed else agg)
    return replace(best, compared=tried)


def plan_blocks(problem: PlanningProblem, topology: Topology) -> PlacedPlan:
    """The placeable-by-construction plan (:mod:`scepsy_place.blocks`), placed by ``blocks``."""
    cset = block_candidates(problem, topology)
    plan = solve_min_latency(problem, cset, capacity_rows(topology, cset.by_llm))
    if plan.allocation is None:
        why = (plan.infeasible.detail if plan.infeasible is not None else
               "no allocation fits the free GPUs as whole-GPU blocks of one LLM each "
               "(the aggregate formulation may still find one)")
        return PlacedPlan(plan, None, 1, ({"round": 1, "objective_s": plan.objective_s,
                                           "unplaced": 0},), None, why, True, "blocks")
    dem = demands(plan.allocation, problem.catalog)
    placement = place(topology, dem, "blocks")
    history = ({"round": 1, "objective_s": plan.objective_s, "unplaced": len(placement.unplaced)},)
    why = None if placement.complete else (
        f"{len(placement.unplaced)} block replica(s) did not fit: TP degrees that do not divide "
        "one another void the capacity rows' guarantee")
    return PlacedPlan(plan, placement, 1, history, quality(topology, placement, dem), why, True,
                      "blocks")


def _aggregate_loop(problem: PlanningProblem, topology: Topology, *, name: str = "milp",
                    policy: str = "hierarchical", max_rounds: int = 25, exact_rounds: int = 8,
                    placer_options: Mapping[str, Any] | None = None,
                    cutoff_s: float = math.inf) -> PlacedPlan:
    """Optimise, place, cut and re-optimise until the plan is placed (module docstring).

    ``cutoff_s``: the objective of a placed plan in hand (``auto``'s blocks plan). Rounds only
    add constraints, so their objectives never fall: once one reaches the cutoff the loop stops
    without placing, as it cannot beat the plan in hand.

    The first ``exact_rounds`` rounds add only valid cuts (no-good cuts); later rounds also
    tighten the failing GPU type's budget by the units that did not fit, which converges fast
    but may skip a cheaper placeable allocation (``exact`` is then False).
    """
    opts = dict(placer_options or {})
    exact = True
    history: list[dict[str, Any]] = []
    cuts: list[tuple[Mapping[Candidate, float], float]] = []
    cset = None
    # every candidate on small clusters (exact); the dominance-pruned ones above
    # UNPRUNED_MAX_GPUS, where the unpruned set is too large to re-solve round after round
    unpruned = problem.cluster.total_gpus <= UNPRUNED_MAX_GPUS
    looping = name == "milp" and problem.options.objective == "min-latency"
    busy = any(n.busy for n in topology.nodes)

    def loop_candidates() -> CandidateSet:
        cs = generate_candidates(problem, prune=not unpruned)
        if busy:  # re-planning on a busy cluster: budget the free capacity, not every GPU
            cuts.extend(free_capacity_rows(topology, cs.by_llm))
        cuts.extend(packing_inequalities(problem, cs.by_llm))
        return cs

    if looping and busy:
        exact = unpruned
        cset = loop_candidates()
        plan = solve_min_latency(problem, cset, cuts)
    else:
        plan = optimiser(name).solve(problem)
    for rnd in range(1, max_rounds + 1):
        if plan.allocation is None:
            why = (plan.infeasible.detail if plan.infeasible is not None else
                   f"no allocation is placeable: {len(cuts)} unplaceable allocation(s) cut, "
                   "and the MILP has no other")
            return PlacedPlan(plan, None, rnd, tuple(history), None, why)
        if plan.objective_s >= cutoff_s:
            history.append({"round": rnd, "objective_s": plan.objective_s, "unplaced": None})
            return PlacedPlan(plan, None, rnd, tuple(history), None,
                              f"stopped at an objective of {plan.objective_s:.6g} s, no better "
                              f"than the plan in hand ({cutoff_s:.6g} s)", exact)
        dem = demands(plan.allocation, problem.catalog)
        placement = place(topology, dem, policy, **opts)
        history.append({"round": rnd, "objective_s": plan.objective_s,
                        "unplaced": len(placement.unplaced)})
        if placement.complete:
            return PlacedPlan(plan, placement, rnd, tuple(history), quality(topology, placement, dem),
                              None, exact)
        if name == "milp" and problem.options.objective == "max-throughput" and plan.scale > 0:
            return _placeable_scale(problem, topology, plan.scale, tuple(history), name=name,
                                    policy=policy, max_rounds=max_rounds,
                                    exact_rounds=exact_rounds, placer_options=placer_options)
        if not looping:
            break  # baselines get no cuts: report what did not fit
        if cset is None:
            exact = exact and unpruned
            cset = loop_candidates()
        for gpu in sorted(_failed_types(placement, plan)):
            chosen = [c for c in plan.candidates.values() if c.gpu == gpu]
            cuts.append(({c: 1.0 for c in chosen}, len(chosen) - 1.0))
            if rnd >= exact_rounds:  # tighten the type's budget by what did not fit
                exact = False
                used = sum(c.units for c in chosen)
                lost = sum(round(plan.candidates[m].tp * plan.candidates[m].share * UNITS)
                           for m, _, _ in placement.unplaced if plan.candidates[m].gpu == gpu)
                cuts.append(({c: float(c.units) for cs in cset.by_llm.values() for c in cs
                              if c.gpu == gpu}, float(used - max(lost, 1))))
        plan = solve_min_latency(problem, cset, cuts)
    last = history[-1] if history else {}
    why = (f"the plan could not be placed after {len(history)} round(s) "
           f"({last.get('unplaced', 0)} replica(s) unplaced)")
    return PlacedPlan(plan, placement, len(history), tuple(history),
                      quality(topology, placement, dem), why, exact)


def _placeable_scale(problem: PlanningProblem, topology: Topology, top: float,
                     history: tuple[Mapping[str, Any], ...], *, steps: int = 7,
                     **kw: Any) -> PlacedPlan:
    """Max-throughput whose capacity optimum does not place: bisect the scale (``steps``
    halvings of the bracket below ``top``) with min-latency optimise-place loops; the largest
    scale that placed wins (``exact`` False: the scale is a bracket, not an optimum)."""
    base = replace(problem, options=replace(problem.options, objective="min-latency"))
    lo, hi, best = 0.0, top, None
    rounds = len(history)
    for i in range(steps):
        mid = hi * (1 - 1e-9) if i == 0 else (lo + hi) / 2  # just below the capacity optimum first
        res = _aggregate_loop(base.scaled(mid), topology, **kw)
        rounds += res.rounds
        history = history + res.history
        if res.placed:
            lo, best = mid, res
        else:
            hi = mid
    if best is None:
        return PlacedPlan(replace(res.plan, scale=0.0), None, rounds, history, None,
                          "no scale of the targets could be placed", False)
    return replace(best, plan=replace(best.plan, scale=lo), rounds=rounds, history=history,
                   exact=False)


def free_capacity_rows(topology: Topology, cands: Mapping[str, Sequence[Candidate]]) -> list[Row]:
    """Per GPU type, the units the candidates use within the topology's free capacity (the
    cluster's budgets count every GPU, in use or not)."""
    rows: list[Row] = []
    for gpu, free in topology.free_budgets().items():
        coeffs = {c: float(c.units) for cs in cands.values() for c in cs if c.gpu == gpu}
        if coeffs:
            rows.append((coeffs, float(round(free * UNITS))))
    return rows


def packing_inequalities(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
                         kmax: int = 4) -> list[tuple[Mapping[Candidate, float], float]]:
    """Valid inequalities of bin packing, per GPU type ``t`` and ``k = 1..kmax``: a GPU holds at
    most ``k`` replica-GPUs of share above ``1/(k+1)``, so
    ``Σ_c tp_c·replicas_c·[share_c > 1/(k+1)]·x_c ≤ k·G_t``. They never exclude a placeable
    allocation and exclude most of the aggregate-only ones (three 0.6 shares on two GPUs)."""
    rows: list[tuple[Mapping[Candidate, float], float]] = []
    for gpu, g in problem.cluster.budgets().items():
        for k in range(1, kmax + 1):
            coeffs = {c: float(c.tp * c.replicas) for cs in cands.values() for c in cs
                      if c.gpu == gpu and c.share > 1.0 / (k + 1) + 1e-12}
            if coeffs:
                rows.append((coeffs, float(k * g)))
    return rows
