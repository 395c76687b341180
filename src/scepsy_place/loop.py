"""The optimiser and the placer in a closed loop: never hand on a plan that cannot be placed.

The MILP budgets GPUs in aggregate, which can admit allocations that no concrete placement
realises (shares that do not fit together on whole GPUs, TP groups that do not fit a node's free
NVLink domains). :func:`plan_and_place` places every optimal allocation; when replicas stay
unplaced it adds, per GPU type that failed, a cut and solves again:

* a *configuration cut* (:func:`scepsy_place.cuts.configuration_cut`) when not even a
  fractional packing of the allocation's GPU slices into the free GPUs exists: valid for every
  placeable allocation, it removes every allocation with a mix of shares as hard to pack;
* otherwise the *exact placement test* (:func:`scepsy_place.exact.place_exactly`) decides the
  type: its placement is used when one exists (the greedy placers can miss it), and otherwise a
  *no-good cut* ``Σ_{c ∈ S_t} x_c ≤ |S_t| − 1`` over the candidates ``S_t`` the plan chose on
  type ``t`` forbids that combination, proven unplaceable (every other stays allowed). When the
  test cannot decide (time limit, more than 64 GPUs of the type) the no-good cut only records
  that the placer failed (``no_good_placer``): it proves nothing and the result is not exact.
  After :data:`TIGHTEN_AFTER` of those, each further one also tightens the type's budget by the
  units that did not fit (``tightened``): that ends the loop quickly on large clusters but may
  skip a cheaper placeable allocation.

After the first failure the MILP runs over every candidate, unpruned: reduced-cost fixing is
exact only for the aggregate optimum (the best *placeable* allocation may cost more than its
bound), and dominance pruning may drop the placeable one (two whole GPUs cost more than three
0.6 shares and use more units, yet only they fit on two GPUs). It also gets the valid
inequalities of bin packing (:func:`scepsy_place.cuts.packing_inequalities`) and, on a cluster
with GPUs in use, the free capacity per GPU type (:func:`scepsy_place.cuts.free_capacity_rows`).
Every row but ``no_good_placer`` cuts and ``tightened`` budgets holds for every placeable
allocation, so the loop's answer is the cheapest placeable allocation of the candidate set
(``exact``; tests check it against brute force), and the instance is called ``infeasible`` only
when such rows alone leave no allocation. Above 64 GPUs the unpruned set is too large to
re-solve round after round: the loop keeps the dominance-pruned candidates and reports
``exact=False``.

Statuses (:data:`LoopStatus`, per formulation in ``compared``): ``placed``; ``infeasible``
(proven: the targets need more GPUs than the cluster has, or valid rows leave no allocation);
``unplaced`` (no placed plan, not proven infeasible: ``max_rounds`` ran out, or unproven cuts
or pruned candidates left no allocation); ``stopped`` (``auto``: the loop's objective reached the
plan in hand, which it could then not beat); ``time_limit`` (the deadline passed first).

Formulations (``formulation``): ``aggregate`` is the loop above; ``blocks`` solves the
placeable-by-construction formulation of :mod:`scepsy_place.blocks` (one LLM shape per GPU,
whole-GPU blocks) and places it with the ``blocks`` placer in one round; ``auto`` (the
default, here and in the CLI) solves ``blocks`` and, up to :data:`UNPRUNED_MAX_GPUS` GPUs, the
aggregate loop too, and keeps the better placed plan (lower objective; the loop stops once its
objective reaches the blocks plan's, so blocks win ties). Above that size the aggregate loop needs many rounds of
placements that cost seconds each at thousands of GPUs (docs/benchmarks.md), so ``auto`` is
``blocks`` there. With a current allocation (``PlanOptions.current``) that still carries the
targets, fits the budgets and places, keeping it is a candidate too: it wins when its objective
(no change penalty) is lower than the formulation's.

Max-throughput: when the capacity optimum does not place, the scale is bisected with
min-latency plans of the same formulation (:func:`_placeable_scale`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from scepsy_common.bisection import Probe, largest_accepted
from scepsy_common.errors import InputError
from scepsy_common.units import share_units
from scepsy_opt.candidates import CandidateSet, fits_budget, generate_candidates, price
from scepsy_opt.milp import Row, solve_min_latency
from scepsy_opt.optimisers import optimiser
from scepsy_opt.pipeline import min_replicas
from scepsy_opt.planfile import plan_to_dict
from scepsy_opt.plans import Plan, headroom, plan_from_choice, time_limit_plan
from scepsy_opt.problem import Deadline, PlanningProblem, TimeLimitReached, time_limit_detail
from scepsy_place.blocks import block_candidates, capacity_rows
from scepsy_place.cuts import (
    configuration_cut,
    free_capacity_rows,
    packing_inequalities,
)
from scepsy_place.exact import EXACT_TIME_S, ExactPlacement, place_exactly
from scepsy_place.placement import Placement, demands, place
from scepsy_place.quality import quality
from scepsy_place.replicas import Demand, Slot
from scepsy_place.topology import Topology, from_cluster, topology_to_dict

UNPRUNED_MAX_GPUS = 64
SCALE_REL = 1e-3  # max-throughput with placement: the bisection's relative bracket
SCALE_STEPS = 20  # at most this many bisection steps (2^-20 of the capacity optimum)
Formulation = Literal["aggregate", "blocks", "auto"]
FORMULATIONS: tuple[Formulation, ...] = ("aggregate", "blocks", "auto")
LoopStatus = Literal["placed", "infeasible", "unplaced", "stopped", "time_limit"]
# the plan.json status of a plan that was not placed, per loop status
_PLAN_STATUS: Mapping[str, str] = MappingProxyType({
    "infeasible": "infeasible", "unplaced": "unplaced", "stopped": "unplaced",
    "time_limit": "time_limit_no_solution"})
CUT_KINDS = ("free_capacity", "packing", "configuration", "no_good", "no_good_placer", "tightened")
# unproven no-good cuts (the exact test could not decide) before the budget of a type that
# still fails is also tightened (inexact: it may skip a placeable allocation)
TIGHTEN_AFTER = 2


@dataclass(frozen=True)
class Outcome:
    """How one formulation (or keeping the current allocation) ended: its status and, when it
    placed or stopped at a plan, that plan's objective (s)."""

    status: LoopStatus
    objective_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "objective_s": self.objective_s}


@dataclass(frozen=True)
class PlacedPlan:
    """A plan, its placement, and how many optimise-place rounds it took.

    ``placement`` is the last one tried: complete when ``placed``, otherwise the attempt whose
    ``unplaced`` replicas say what did not fit (or None when no allocation was found).
    """

    plan: Plan
    placement: Placement | None
    rounds: int
    history: tuple[Mapping[str, Any], ...]  # per round: objective, unplaced replicas, cuts added
    quality: Mapping[str, Any] | None
    reason: str | None = None  # why no placed plan (None when placed)
    # all candidates and only proven cuts: the cheapest placeable allocation of the candidates
    exact: bool = True
    formulation: str = "aggregate"  # the formulation whose plan this is ("current": kept)
    # how each formulation tried ended (auto, or with a current allocation)
    compared: Mapping[str, Outcome] = field(default_factory=lambda: MappingProxyType({}))
    status: LoopStatus = "placed"
    cuts: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # rows by kind

    @property
    def placed(self) -> bool:
        return self.placement is not None and self.placement.complete

    @property
    def outcome(self) -> Outcome:
        obj = self.plan.objective_s if self.status in ("placed", "stopped") else None
        return Outcome(self.status, obj)

    @property
    def answer(self) -> Plan:
        """The plan handed on: the placed plan, or no allocation and a status that says why
        (``infeasible`` only when proven; ``unplaced``; ``time_limit_no_solution``)."""
        if self.placed:
            return self.plan
        return replace(self.plan, allocation=None,
                       status=_PLAN_STATUS.get(self.status, "unplaced"))  # type: ignore[arg-type]

    def to_dict(self, policy: str | None = None) -> dict[str, Any]:
        """plan.json's ``placement`` section: replica rows only when every replica is placed;
        otherwise ``instances`` is empty and ``unplaced`` / ``reason`` say what did not fit
        (``policy``: the placer named when no placement was tried)."""
        pl = self.placement
        return {
            "policy": pl.policy if pl is not None else policy,
            "placed_by": getattr(pl, "placed_by", None) if self.placed else None,
            "formulation": self.formulation, "status": self.status,
            "compared": {k: v.to_dict() for k, v in self.compared.items()},
            "rounds": self.rounds, "placed": self.placed, "exact": self.exact,
            "cuts": dict(self.cuts), "history": [dict(h) for h in self.history],
            "quality": dict(self.quality) if self.quality and self.placed else None,
            "instances": pl.to_dict()["slots"] if pl is not None and self.placed else [],
            "unplaced": [list(u) for u in pl.unplaced] if pl is not None else [],
            "reason": self.reason}


def plan_document(problem: PlanningProblem, res: PlacedPlan, *, policy: str | None = None,
                  timings: bool = True, topology: Topology | None = None) -> dict[str, Any]:
    """The plan.json document of ``res`` (:func:`scepsy_opt.planfile.plan_to_dict` of
    :attr:`PlacedPlan.answer`, with the ``placement`` section of :meth:`PlacedPlan.to_dict`):
    an allocation only when every replica is placed.

    ``topology``: the cluster placed on. Its racks format (``topology``) is added when its nodes
    are not those the ``cluster`` section's pools name (a racks cluster file: node names,
    NVLink domains, GPUs in use), so that a reader finds every placed node."""
    extra: dict[str, Any] = {"placement": res.to_dict(policy)}
    if topology is not None and _node_shapes(topology) != _node_shapes(
            from_cluster(problem.cluster, problem.catalog)):
        extra["topology"] = topology_to_dict(topology)
    return plan_to_dict(problem, res.answer, timings=timings, extra=extra)


def _node_shapes(topology: Topology) -> tuple[tuple[Any, ...], ...]:
    return tuple((n.name, n.gpu, n.gpus, n.nvlink_domain, n.used) for n in topology.nodes)


def _failed_types(placement: Placement, plan: Plan) -> set[str]:
    return {plan.candidates[llm].gpu for llm, _, _ in placement.unplaced}


def plan_and_place(problem: PlanningProblem, topology: Topology, *, name: str = "milp",
                   policy: str = "hierarchical", max_rounds: int = 25,
                   placer_options: Mapping[str, Any] | None = None,
                   formulation: Formulation = "auto",
                   deadline: Deadline | None = None) -> PlacedPlan:
    """A placed plan for ``problem`` on ``topology`` by ``formulation`` (module docstring).

    ``blocks`` and ``auto`` apply to the MILP; other optimisers use the aggregate placement
    without cuts. Everything runs within ``deadline`` (default: the problem's time limit from
    now): once it passes no new round starts, and without a placed plan the status is
    ``time_limit``.
    """
    deadline = Deadline.of(problem, deadline)
    if formulation not in FORMULATIONS:
        raise InputError("plan", "formulation", f"one of {', '.join(FORMULATIONS)}", formulation)
    kw: dict[str, Any] = {"name": name, "policy": policy, "max_rounds": max_rounds,
                          "placer_options": placer_options, "deadline": deadline}
    if problem.options.objective == "max-throughput" and name == "milp":
        return _max_throughput(problem, topology, formulation, **kw)
    return keep_current(problem, topology, _min_latency(problem, topology, formulation, **kw),
                        policy=policy, placer_options=placer_options, deadline=deadline)


def _min_latency(problem: PlanningProblem, topology: Topology, formulation: Formulation,
                 **kw: Any) -> PlacedPlan:
    """The min-latency placed plan of ``formulation`` (no current-allocation check)."""
    if formulation == "aggregate" or kw["name"] != "milp":
        return _aggregate_loop(problem, topology, **kw)
    blocks = plan_blocks(problem, topology, kw["deadline"])
    if formulation == "blocks" or problem.cluster.total_gpus > UNPRUNED_MAX_GPUS:
        return blocks
    agg = _aggregate_loop(problem, topology,
                          cutoff_s=blocks.plan.objective_s if blocks.placed else math.inf, **kw)
    tried = MappingProxyType({"aggregate": agg.outcome, "blocks": blocks.outcome})
    if agg.placed and (not blocks.placed or agg.plan.objective_s <= blocks.plan.objective_s):
        return replace(agg, compared=tried)
    if blocks.placed:
        return replace(blocks, compared=tried)
    # neither placed: the aggregate loop's answer covers every allocation (blocks' included)
    why = (agg.reason if agg.status == "infeasible"
           else f"aggregate: {agg.reason}; blocks: {blocks.reason}")
    return replace(agg, compared=tried, reason=why)


def keep_current(problem: PlanningProblem, topology: Topology, res: PlacedPlan, *,
                 policy: str = "hierarchical",
                 placer_options: Mapping[str, Any] | None = None,
                 deadline: Deadline | None = None) -> PlacedPlan:
    """``res``, or keeping the current allocation (``problem.options.current``) when that still
    carries the targets within the budgets, places on ``topology`` and has a lower objective
    (:func:`scepsy_opt.candidates.price`: the same latencies as the optimiser's, no change
    penalty). ``compared["current"]`` says how it ended (``stopped``: priced no better than
    ``res``, not placed; ``infeasible``: it does not carry the targets or fit the budgets)."""
    cur = problem.options.current
    if cur is None or problem.options.objective != "min-latency":
        return res
    plan = current_plan(problem, res.plan.optimiser)
    if plan is None:
        return replace(res, compared=MappingProxyType({**res.compared,
                                                       "current": Outcome("infeasible")}))
    if res.placed and res.plan.objective_s <= plan.objective_s:
        return replace(res, compared=MappingProxyType(
            {**res.compared, "current": Outcome("stopped", plan.objective_s)}))
    assert plan.allocation is not None
    dem = demands(plan.allocation, problem.catalog)
    placement = place_or_exact(topology, dem, policy, placer_options,
                               Deadline.of(problem, deadline))
    if not placement.complete:
        return replace(res, compared=MappingProxyType({**res.compared,
                                                       "current": Outcome("unplaced")}))
    compared = MappingProxyType({**res.compared, "current": Outcome("placed", plan.objective_s)})
    return PlacedPlan(plan, placement, res.rounds, res.history,
                      quality(topology, placement, dem), None, False, "current", compared,
                      "placed", res.cuts)


def current_plan(problem: PlanningProblem, name: str = "milp") -> Plan | None:
    """The current allocation priced at ``problem``'s targets (status ``evaluated``), or None
    when it uses a GPU type the cluster lacks, exceeds the budgets or does not carry an LLM's
    load at ``max_utilisation`` (the candidates' rule, :func:`scepsy_opt.pipeline.min_replicas`)."""
    cur = problem.options.current
    if cur is None:
        return None
    budgets = problem.cluster.budgets()
    if any(m not in cur.llms or cur.llms[m].gpu not in budgets for m in problem.llms):
        return None
    choice = price(problem, cur)
    for m, c in choice.items():
        if not (c.mu > 0 and min_replicas(problem.loads[m], c.mu, problem.options.max_utilisation)
                <= c.replicas and math.isfinite(c.latency_s)):
            return None
    if not fits_budget(problem, choice):
        return None
    return plan_from_choice(problem, name, "evaluated", choice, {})


def _timed_out(deadline: Deadline, name: str, rounds: int, history: tuple[Mapping[str, Any], ...],
               formulation: str, exact: bool = True) -> PlacedPlan:
    """No placed plan: the time limit ran out first (status ``time_limit``)."""
    return PlacedPlan(time_limit_plan(name), None, rounds, history, None,
                      time_limit_detail(deadline.limit_s), exact, formulation,
                      status="time_limit")


def plan_blocks(problem: PlanningProblem, topology: Topology,
                deadline: Deadline | None = None) -> PlacedPlan:
    """The placeable-by-construction plan (:mod:`scepsy_place.blocks`), placed by ``blocks``."""
    deadline = Deadline.of(problem, deadline)
    try:
        cset = block_candidates(problem, topology, deadline)
    except TimeLimitReached:
        return _timed_out(deadline, "milp", 1, (), "blocks")
    plan = solve_min_latency(problem, cset, capacity_rows(topology, cset.by_llm),
                             deadline=deadline)
    if plan.status == "time_limit_no_solution":
        return _timed_out(deadline, "milp", 1, (), "blocks")
    if plan.allocation is None:
        why = (plan.infeasible.detail if plan.infeasible is not None else
               "no allocation fits the free GPUs as whole-GPU blocks of one LLM each "
               "(the aggregate formulation may still find one)")
        return PlacedPlan(plan, None, 1, ({"round": 1, "objective_s": plan.objective_s,
                                           "unplaced": 0},), None, why, True, "blocks",
                          status="infeasible")
    dem = demands(plan.allocation, problem.catalog)
    placement = place(topology, dem, "blocks")
    history = ({"round": 1, "objective_s": plan.objective_s, "unplaced": len(placement.unplaced)},)
    if placement.complete:
        return PlacedPlan(plan, placement, 1, history, quality(topology, placement, dem), None,
                          True, "blocks")
    why = (f"{len(placement.unplaced)} block replica(s) did not fit: TP degrees that do not "
           "divide one another void the capacity rows' guarantee")
    return PlacedPlan(plan, placement, 1, history, None, why, True, "blocks", status="unplaced")


def _aggregate_loop(problem: PlanningProblem, topology: Topology, *, name: str = "milp",
                    policy: str = "hierarchical", max_rounds: int = 25,
                    placer_options: Mapping[str, Any] | None = None,
                    cutoff_s: float = math.inf, deadline: Deadline | None = None) -> PlacedPlan:
    """Optimise, place, cut and re-optimise until the plan is placed (module docstring).

    ``cutoff_s``: the objective of a placed plan in hand (``auto``'s blocks plan). Rounds only
    add constraints, so their objectives never fall: once one reaches the cutoff the loop stops
    without placing (status ``stopped``), as it cannot beat the plan in hand.

    Every solve gets what remains of ``deadline``; a round whose solve finds nothing in time
    ends the loop (status ``time_limit``).
    """
    deadline = Deadline.of(problem, deadline)
    opts = dict(placer_options or {})
    exact = True
    history: list[dict[str, Any]] = []
    valid: list[Row] = []  # rows that hold for every placeable allocation
    nogood: list[Row] = []  # allocations the placer failed on
    cuts = dict.fromkeys(CUT_KINDS, 0)
    cset: CandidateSet | None = None
    # every candidate on small clusters (exact); the dominance-pruned ones above
    # UNPRUNED_MAX_GPUS, where the unpruned set is too large to re-solve round after round
    unpruned = problem.cluster.total_gpus <= UNPRUNED_MAX_GPUS
    looping = name == "milp"
    busy = any(n.busy for n in topology.nodes)

    def loop_candidates() -> CandidateSet:
        cs = generate_candidates(problem, prune=not unpruned, deadline=deadline)
        if busy:  # re-planning on a busy cluster: budget the free capacity, not every GPU
            rows = free_capacity_rows(topology, cs.by_llm)
            valid.extend(rows)
            cuts["free_capacity"] += len(rows)
        rows = packing_inequalities(problem, cs.by_llm)
        valid.extend(rows)
        cuts["packing"] += len(rows)
        return cs

    def ended(plan: Plan, placement: Placement | None, status: LoopStatus, why: str | None,
              qual: Mapping[str, Any] | None = None) -> PlacedPlan:
        return PlacedPlan(plan, placement, max(len(history), 1), tuple(history), qual, why,
                          exact and not cuts["no_good_placer"] and not cuts["tightened"]
                          and status in ("placed", "infeasible", "stopped"), "aggregate",
                          status=status, cuts=MappingProxyType(dict(cuts)))

    try:
        if looping and busy:
            exact = unpruned
            cset = loop_candidates()
            plan = solve_min_latency(problem, cset, valid, deadline=deadline)
        elif looping:
            plan = optimiser(name).solve(problem, deadline=deadline)  # type: ignore[call-arg]
        else:
            plan = optimiser(name).solve(problem)
    except TimeLimitReached:
        return _timed_out(deadline, name, 1, (), "aggregate", exact)
    placement: Placement | None = None
    for rnd in range(1, max_rounds + 1):
        if plan.status == "time_limit_no_solution":
            return _timed_out(deadline, name, rnd, tuple(history), "aggregate", exact)
        if plan.allocation is None:
            return ended(plan, placement, *_no_allocation(plan, cuts, proven=unpruned))
        if plan.objective_s >= cutoff_s:
            history.append({"round": rnd, "objective_s": plan.objective_s, "unplaced": None})
            return ended(plan, None, "stopped",
                         f"stopped at an objective of {plan.objective_s:.6g} s, no better than "
                         f"the plan in hand ({cutoff_s:.6g} s)")
        dem = demands(plan.allocation, problem.catalog)
        placement = place(topology, dem, policy, **opts)
        entry: dict[str, Any] = {"round": rnd, "objective_s": plan.objective_s,
                                 "unplaced": len(placement.unplaced)}
        history.append(entry)
        if placement.complete:
            return ended(plan, placement, "placed", None, quality(topology, placement, dem))
        if not looping:
            return ended(plan, placement, "unplaced",
                         f"the {name} allocation could not be placed ({len(placement.unplaced)} "
                         "replica(s) unplaced; only the milp optimiser re-solves with cuts)")
        try:
            if cset is None:
                exact = exact and unpruned
                cset = loop_candidates()
            added = dict.fromkeys(("configuration", "no_good", "no_good_placer", "tightened"), 0)
            rescued: list[Slot] = []
            failed = _failed_types(placement, plan)
            for gpu in sorted(failed):
                chosen = [c for c in plan.candidates.values() if c.gpu == gpu]
                cut = configuration_cut(topology, gpu, chosen, cset.by_llm)
                if cut is not None:
                    valid.append(cut)
                    added["configuration"] += 1
                    continue
                ex = _place_type_exactly(topology, dem, gpu, deadline)
                if ex.status == "placed":
                    rescued.extend(ex.slots)
                    continue
                nogood.append(({c: 1.0 for c in chosen}, len(chosen) - 1.0))
                if ex.status == "infeasible":
                    added["no_good"] += 1
                    continue
                added["no_good_placer"] += 1
                if cuts["no_good_placer"] + added["no_good_placer"] > TIGHTEN_AFTER:
                    nogood.append(_tightened(plan, placement, gpu, cset))
                    added["tightened"] += 1
            if not any(added.values()):  # the exact test placed what the placer did not
                plan_unplaced = placement.unplaced
                placement = _rescue(placement, failed, rescued,
                                    {m: c.gpu for m, c in plan.candidates.items()})
                entry.update(unplaced=0, placer_unplaced=len(plan_unplaced), placed_by="exact")
                return ended(plan, placement, "placed", None, quality(topology, placement, dem))
            entry["cuts"] = added
            for k, v in added.items():
                cuts[k] += v
            plan = solve_min_latency(problem, cset, valid + nogood, deadline=deadline)
        except TimeLimitReached:
            return _timed_out(deadline, name, rnd + 1, tuple(history), "aggregate", exact)
    last = history[-1] if history else {}
    return ended(plan, placement, "unplaced",
                 f"no placed plan after {len(history)} round(s) (--max-rounds; "
                 f"{last.get('unplaced', 0)} replica(s) unplaced in the last, "
                 f"{_cut_text(cuts)}); not proven infeasible")


def _place_type_exactly(topology: Topology, dem: list[Demand], gpu: str,
                        deadline: Deadline) -> ExactPlacement:
    """:func:`scepsy_place.exact.place_exactly` of the demands of GPU type ``gpu``, within
    :data:`~scepsy_place.exact.EXACT_TIME_S` and what remains of ``deadline``."""
    return place_exactly(topology, [d for d in dem if d.gpu == gpu],
                         time_limit_s=min(EXACT_TIME_S, deadline.remaining()))


def _rescue(placement: Placement, failed: set[str], slots: list[Slot], gpu_of: Mapping[str, str],
            ) -> Placement:
    """``placement`` with the replicas of the GPU types ``failed`` placed by ``slots``
    (:func:`scepsy_place.exact.place_exactly`), ``placed_by`` ``exact``."""
    keep = tuple(s for s in placement.slots if gpu_of[s.llm] not in failed)
    return replace(placement, slots=keep + tuple(slots), unplaced=(), placed_by="exact")


def place_or_exact(topology: Topology, dem: list[Demand], policy: str,
                   placer_options: Mapping[str, Any] | None, deadline: Deadline) -> Placement:
    """The placer's placement of ``dem``, or, where it leaves replicas of a GPU type unplaced and
    :func:`scepsy_place.exact.place_exactly` places them all, that one (``placed_by``
    ``exact``); the placer's attempt when a type does not place exactly either."""
    placement = place(topology, dem, policy, **dict(placer_options or {}))
    if placement.complete:
        return placement
    gpu_of = {d.llm: d.gpu for d in dem}
    failed = {gpu_of[m] for m, _, _ in placement.unplaced}
    slots: list[Slot] = []
    for gpu in sorted(failed):
        ex = _place_type_exactly(topology, dem, gpu, deadline)
        if ex.status != "placed":
            return placement
        slots.extend(ex.slots)
    return _rescue(placement, failed, slots, gpu_of)


def _tightened(plan: Plan, placement: Placement, gpu: str, cset: CandidateSet) -> Row:
    """The units of type ``gpu`` below what the plan used there by what did not fit (at least
    one): ends the loop quickly where the exact test cannot decide, but may skip a placeable
    allocation (not valid: the loop is then not exact)."""
    used = sum(c.units for c in plan.candidates.values() if c.gpu == gpu)
    lost = sum(plan.candidates[m].tp * share_units(plan.candidates[m].share)
               for m, _, _ in placement.unplaced if plan.candidates[m].gpu == gpu)
    return ({c: float(c.units) for cs in cset.by_llm.values() for c in cs if c.gpu == gpu},
            float(used - max(lost, 1)))


def _cut_text(cuts: Mapping[str, int]) -> str:
    """The loop's rows by kind, for messages."""
    text = (f"{cuts.get('configuration', 0)} configuration cut(s), {cuts.get('no_good', 0)} "
            f"no-good cut(s) of allocations proven unplaceable, "
            f"{cuts.get('no_good_placer', 0)} of allocations only the placer failed on, "
            f"{cuts.get('tightened', 0)} budget tightening(s), {cuts.get('packing', 0)} packing "
            "row(s)")
    return text + (f", {cuts['free_capacity']} free-capacity row(s)" if cuts.get("free_capacity")
                   else "")


def _no_allocation(plan: Plan, cuts: Mapping[str, int], *, proven: bool,
                   ) -> tuple[LoopStatus, str]:
    """(status, reason) of a round whose MILP found no allocation. ``proven``: every candidate
    of the grid was in it (no dominance pruning), so rows that each hold for every placeable
    allocation prove the instance infeasible; a no-good cut of an allocation that only the
    placer failed on (the exact test ran out of time) proves nothing."""
    if plan.infeasible is not None and not any(cuts.values()):
        return "infeasible", plan.infeasible.detail  # the optimiser's own report (GPUs, memory)
    if proven and not cuts.get("no_good_placer"):
        return "infeasible", (f"no allocation is placeable: {_cut_text(cuts)} leave none, and "
                              "each holds for every placeable allocation")
    if cuts.get("no_good_placer") or cuts.get("tightened"):
        return "unplaced", (f"none of the allocations left was placed ({_cut_text(cuts)}): not "
                            "proven infeasible")
    return "unplaced", (f"no allocation of the dominance-pruned candidates is left "
                        f"({_cut_text(cuts)}): not proven infeasible")


def _max_throughput(problem: PlanningProblem, topology: Topology, formulation: Formulation,
                    **kw: Any) -> PlacedPlan:
    """Max-throughput with placement: the capacity optimum when it places, otherwise the
    largest placeable scale found by bisection (:func:`_placeable_scale`)."""
    deadline: Deadline = kw["deadline"]
    try:
        plan = optimiser("milp").solve(problem, deadline=deadline)  # type: ignore[call-arg]
    except TimeLimitReached:
        return _timed_out(deadline, "milp", 1, (), formulation)
    if plan.status == "time_limit_no_solution":
        return _timed_out(deadline, "milp", 1, (), formulation)
    if plan.allocation is None:
        why = plan.infeasible.detail if plan.infeasible is not None else "no scale carried"
        return PlacedPlan(plan, None, 1, ({"round": 1, "scale": plan.scale, "status":
                                           "infeasible"},), None, why, True, formulation,
                          status="infeasible")
    dem = demands(plan.allocation, problem.catalog)
    placement = place_or_exact(topology, dem, kw["policy"], kw["placer_options"], deadline)
    entry = {"round": 1, "scale": plan.scale, "objective_s": plan.objective_s,
             "unplaced": len(placement.unplaced)}
    if placement.complete:
        return PlacedPlan(plan, placement, 1, (entry,), quality(topology, placement, dem), None,
                          True, "aggregate")
    return _placeable_scale(problem, topology, plan.scale, (entry,), formulation, **kw)


def placed_scale(problem: PlanningProblem, plan: Plan) -> float:
    """The largest factor of ``problem``'s targets that ``plan``'s allocation carries at
    ``max_utilisation`` (:func:`scepsy_opt.plans.headroom`, the candidates' rule)."""
    return min(headroom(problem, plan.candidates).values())


def _placeable_scale(problem: PlanningProblem, topology: Topology, top: float,
                     history: tuple[Mapping[str, Any], ...], formulation: Formulation,
                     **kw: Any) -> PlacedPlan:
    """Max-throughput whose capacity optimum (scale ``top``) does not place: bisect the scale
    below ``top`` with min-latency placed plans of ``formulation`` (``auto``: both) until the
    bracket is within :data:`SCALE_REL`. A placed plan at scale ``s`` carries up to its
    :func:`placed_scale` ``≥ s``, which moves the lower end; the answer is priced at that scale.
    ``exact`` is False (a bracket, not an optimum); a step that failed without proof (status
    other than ``infeasible``) is named in the history."""
    base = replace(problem, options=replace(problem.options, objective="min-latency"))
    deadline: Deadline = kw["deadline"]

    def probe(x: float) -> Probe[PlacedPlan]:
        if deadline.remaining() <= 0:
            return Probe(False, stop=True)
        res = _min_latency(base.scaled(x), topology, formulation, **kw)
        if res.status == "time_limit":
            return Probe(False, res, stop=True)
        reach = min(placed_scale(base, res.plan), top) if res.placed else None
        return Probe(res.placed, res, reach)

    # the first probe just below the capacity optimum
    search = largest_accepted(probe, top, rel=SCALE_REL, max_steps=SCALE_STEPS,
                              first=top * (1 - 1e-9))
    tried = [(x, p.value) for x, p in search.probes if p.value is not None]
    rounds = len(history) + sum(res.rounds for _, res in tried)
    steps: list[Mapping[str, Any]] = list(history)
    for x, res in tried:
        steps.append({"round": len(steps) + 1, "scale": x, "status": res.status,
                      "formulation": res.formulation,
                      "objective_s": res.plan.objective_s if res.placed else None})
    last = tried[-1][1].plan if tried else None
    best = (search.best_at, search.best) if search.best is not None else None
    if best is None:
        if deadline.remaining() <= 0 or last is None:
            return _timed_out(deadline, "milp", rounds, tuple(steps), formulation, False)
        return PlacedPlan(replace(last, scale=0.0, allocation=None), None, rounds,
                          tuple(steps), None, "no scale of the targets could be placed", False,
                          formulation, status="unplaced")
    scale, res = best
    at = base.scaled(scale)
    assert res.plan.allocation is not None
    plan = plan_from_choice(at, res.plan.optimiser, res.plan.status, price(at, res.plan.allocation),
                            res.plan.stats, scale=scale)
    return replace(res, plan=plan, rounds=rounds, history=tuple(steps), exact=False)
