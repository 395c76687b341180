"""The optimiser and the placer in a closed loop: never hand on a plan that cannot be placed.

The MILP budgets GPUs in aggregate, which can admit allocations that no concrete placement
realises (shares that do not fit together on whole GPUs, TP groups that do not fit a node's free
NVLink domains). :func:`plan_and_place` places every optimal allocation; when replicas stay
unplaced it adds, per GPU type that failed, a cut and solves again:

* a *configuration cut* (:func:`scepsy_place.formulations.cuts.configuration_cut`) when not even a
  fractional packing of the allocation's GPU slices into the free GPUs exists: valid for every
  placeable allocation, it removes every allocation with a mix of shares as hard to pack;
* otherwise the *exact placement test* (:func:`scepsy_place.packing.exact.place_exactly`) decides the
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
inequalities of bin packing (:func:`scepsy_place.formulations.cuts.packing_inequalities`) and, on a cluster
with GPUs in use, the free capacity per GPU type (:func:`scepsy_place.formulations.cuts.free_capacity_rows`).
Every row but ``no_good_placer`` cuts and ``tightened`` budgets holds for every placeable
allocation, so the loop's answer is the cheapest placeable allocation of the candidate set
(``exact``; tests check it against brute force), and the instance is called ``infeasible`` only
when such rows alone leave no allocation. Above 64 GPUs the unpruned set is too large to
re-solve round after round: the loop keeps the dominance-pruned candidates and reports
``exact=False``.

Statuses (:data:`LoopStatus`, per formulation in ``compared``): ``placed``; ``infeasible``
(proven: the targets need more GPUs than the cluster has, or valid rows leave no allocation);
``unplaced`` (no placed plan, not proven infeasible: unproven cuts or pruned candidates left no
allocation, or the round cap ``max_rounds`` ran out: :data:`MAX_ROUNDS`, a safety net, as the
loop stops on a proof or at the deadline; the reason then names the cap; ``blocks``: no
whole-GPU block allocation exists, which
proves nothing about allocations that share GPUs); ``stopped`` (``auto``: the loop's objective reached the
plan in hand, which it could then not beat); ``time_limit`` (the deadline passed first).

Formulations (``formulation``; :mod:`scepsy_place.formulations` puts them behind one interface):
``aggregate`` is the loop above; ``blocks`` solves the placeable-by-construction formulation of
:mod:`scepsy_place.formulations.blocks` (one LLM shape per GPU, whole-GPU blocks) and places it with the
``blocks`` placer in one round (:func:`scepsy_place.formulations.placed.plan_blocks`); ``patterns``
(:mod:`scepsy_place.formulations.patterns`) packs co-located replicas into GPU and NVLink-domain patterns by
column generation. ``auto`` (the
default, here and in the CLI; :func:`plan_auto`) runs ``blocks``; up to
:data:`UNPRUNED_MAX_GPUS` GPUs the aggregate loop (exact there), stopped once its objective
reaches the blocks plan's; then ``patterns`` unless the plan in hand is proven optimal over the
candidate grid (within :data:`PROVEN_GAP` of a grid bound); above :data:`UNPRUNED_MAX_GPUS`
GPUs the aggregate loop runs beside them, from the start, in a forked child (a second core):
its first MILP is the bound, and where the aggregate optimum packs (or a re-solve with cuts
does) its placed plan competes; above :data:`PATTERNS_BLOCKS_MAX_GPUS` GPUs the child solves
the aggregate MILP alone, for its bound (the loop's placements cost seconds each at thousands
of GPUs); where the platform cannot fork they run last, with the time left. The best placed plan wins (ties: the first run). One
deadline is split across these steps, each getting a share of what remains when it starts
(:data:`BLOCKS_SHARE`, :data:`SLOTS_SHARE`, :data:`AGGREGATE_SHARE`,
:data:`PATTERNS_LARGE_SHARE`). ``slots`` (:mod:`scepsy_place.formulations.slots`) packs replicas of several
LLMs into GPU groups of one share configuration each, placeable by construction; ``auto`` runs
it after blocks, and max-throughput with ``auto`` searches the scale with it
(:func:`_max_throughput_auto`). With a
current allocation (``PlanOptions.current``) that still carries the targets, fits the budgets
and places, keeping it is a candidate too: it wins when its objective (no change penalty) is
lower than the formulation's.

Bounds (:attr:`PlacedPlan.bound_s`, ``gap = objective / bound_s − 1``): the aggregate loop's is
its first MILP's bound (the aggregate optimum's, valid for every allocation), or, when every row
it added is proven and its candidates are unpruned, its last MILP's bound (then a placed plan
has gap 0: the placeable optimum of the grid); ``patterns``' is its column generation bound,
valid for every placeable allocation of its candidates (the whole grid up to 64 GPUs, the
reduced candidates above); ``blocks`` give none (their MILP bound holds for block allocations
only). ``auto`` reports the highest bound that holds for the whole candidate grid
(:data:`GRID_BOUNDS`, :data:`GRID_BOUNDS_UNPRUNED`), and its plan says only what that bound
proves: ``optimal`` and ``exact`` within :data:`PROVEN_GAP` of it, otherwise ``time_limit``
(the time ran out) or ``heuristic``, the plan's bound and gap being the placement's
(:func:`_labelled`). ``compared`` gives each formulation's status, objective, bound and wall
time.

Max-throughput: when the capacity optimum does not place, the scale is bisected with
min-latency plans of the same formulation (:func:`_placeable_scale`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal, cast

from scepsy_common.bisection import Probe, largest_accepted
from scepsy_common.forked import ChildKilled, Forked, can_fork
from scepsy_common.registry import Registry
from scepsy_common.units import UNITS, share_units
from scepsy_opt.cluster import Cluster, GPUPool
from scepsy_opt.planning.candidates import (
    Candidate,
    CandidateSet,
    fits_budget,
    generate_candidates,
    price,
)
from scepsy_opt.planning.milp import Row, solve_min_latency
from scepsy_opt.planning.mincost import (
    cost_candidates,
    cost_lower_bound,
    gpu_prices,
    slo_rows,
    solve_min_cost,
)
from scepsy_opt.planning.mixing import domains, group_gpus, mixed_plan, solve_mixed
from scepsy_opt.planning.optimisers import optimiser
from scepsy_opt.planning.planfile import plan_to_dict
from scepsy_opt.planning.plans import (
    Plan,
    Status,
    headroom,
    no_allocation_plan,
    plan_from_choice,
    time_limit_plan,
)
from scepsy_opt.planning.problem import (
    OBJECTIVES,
    Deadline,
    PlanningProblem,
    TimeLimitReached,
    time_limit_detail,
)
from scepsy_opt.planning.solvestats import SolveStats
from scepsy_opt.prediction.pipeline import min_replicas
from scepsy_place.formulations import slots
from scepsy_place.formulations.cuts import (
    configuration_cut,
    free_capacity_rows,
    packing_inequalities,
)
from scepsy_place.formulations.patterns import PLACER_MAX_GPUS as PATTERNS_BLOCKS_MAX_GPUS
from scepsy_place.formulations.patterns import plan_patterns, solve_patterns
from scepsy_place.formulations.placed import LoopStatus, Outcome, PlacedPlan, plan_blocks, timed_out
from scepsy_place.packing.exact import EXACT_TIME_S, ExactPlacement, place_exactly
from scepsy_place.packing.groups import layout_groups
from scepsy_place.packing.placement import Placement, demands, place
from scepsy_place.packing.quality import quality
from scepsy_place.packing.replicas import Demand, Slot
from scepsy_place.packing.topology import Topology, from_cluster, topology_to_dict

UNPRUNED_MAX_GPUS = 64
SCALE_REL = 1e-3  # max-throughput with placement: the bisection's relative bracket
SCALE_STEPS = 20  # at most this many bisection steps (2^-20 of the capacity optimum)
Formulation = Literal["aggregate", "blocks", "patterns", "slots", "auto"]
FORMULATIONS: tuple[Formulation, ...] = ("aggregate", "blocks", "patterns", "slots", "auto")
PROVEN_GAP = 1e-6  # a placed plan within this relative gap of its bound is proven optimal
# formulations whose bound holds for every placeable allocation of the whole candidate grid
# (``auto`` reports the highest of theirs): the aggregate loop's first MILP is the aggregate
# optimum's bound; blocks have none beyond their own allocations
GRID_BOUNDS: tuple[str, ...] = ("aggregate",)
# ... up to UNPRUNED_MAX_GPUS GPUs, where their candidates are every candidate (reduced above)
GRID_BOUNDS_UNPRUNED: tuple[str, ...] = ("patterns",)
CUT_KINDS = ("free_capacity", "packing", "configuration", "no_good", "no_good_placer", "tightened")
# unproven no-good cuts (the exact test could not decide) before the budget of a type that
# still fails is also tightened (inexact: it may skip a placeable allocation)
TIGHTEN_AFTER = 2
# auto: one deadline split across the formulations it runs, each step getting a share of what
# remains (what a step leaves carries over to the next): blocks (usually a fraction of a
# second; the cap keeps slow ones from taking the others' time), the aggregate loop up to 64
# GPUs (patterns may still run after it and get the rest), patterns above 1,024 GPUs (the rest
# is for the blocks fallback and the aggregate bound)
BLOCKS_SHARE = 0.5
SLOTS_SHARE = 0.4  # auto: slot groups (scepsy_place.formulations.slots) after blocks, of what remains
SLOTS_FIRST_SHARE = 0.6  # min-cost: slot groups' share when nothing is placed yet (their first
# plan of 16 LLMs with mean bounds takes 6-12 s on 2 cores, depending on HiGHS's seed)
MIXED_SHARE = 0.5  # min-cost: LLMs split over GPU types (scepsy_opt.planning.mixing), of what remains
SLOTS_LARGE_SHARE = 0.8  # ... above UNPRUNED_MAX_GPUS GPUs
AGGREGATE_SHARE = 0.7
BOUND_WAIT_S = 0.25  # auto above 64 GPUs: how long past the deadline the bound's child is awaited
CHILD_SHARE = 0.9  # ... and the share of the deadline its aggregate loop gets
PATTERNS_LARGE_SHARE = 0.75
# the aggregate loop's round cap: a safety net only; the loop stops on a proof (placed,
# infeasible, the cutoff reached) or at the deadline
MAX_ROUNDS = 1000
# max-throughput (auto): the share of the time the slot groups (scepsy_place.formulations.slots) get; the
# exact capacity optimum gets the rest
SLOT_SHARE = 0.7
# ... and the capacity optimum runs only when the slot plan's proven gap is above this
CAPACITY_GAP = 0.02


def plan_document(problem: PlanningProblem, res: PlacedPlan, *, policy: str | None = None,
                  timings: bool = True, topology: Topology | None = None) -> dict[str, Any]:
    """The plan.json document of ``res`` (:func:`scepsy_opt.planning.planfile.plan_to_dict` of
    :attr:`PlacedPlan.answer`, with the ``placement`` section of :meth:`PlacedPlan.to_dict`):
    an allocation only when every replica is placed.

    ``topology``: the cluster placed on. Its racks format (``topology``) is added when its nodes
    are not those the ``cluster`` section's pools name (a racks cluster file: node names,
    NVLink domains, GPUs in use), so that a reader finds every placed node."""
    extra: dict[str, Any] = {"placement": res.to_dict(policy, timings)}
    problem = res.problem or problem  # a plan of LLMs split over GPU types: of their groups
    topology = res.topology or topology
    if problem.cluster.open:  # the cluster bought (open pools sized), or the fixed pools alone
        problem = replace(problem, cluster=(topology or from_cluster(problem.cluster)).to_cluster(
            problem.catalog))
    if topology is not None and _node_shapes(topology) != _node_shapes(
            from_cluster(problem.cluster, problem.catalog)):
        extra["topology"] = topology_to_dict(topology)
    return plan_to_dict(problem, res.answer, timings=timings, extra=extra)


def _node_shapes(topology: Topology) -> tuple[tuple[Any, ...], ...]:
    return tuple((n.name, n.gpu, n.gpus, n.nvlink_domain, n.used) for n in topology.nodes)


def _failed_types(placement: Placement, plan: Plan) -> set[str]:
    return {plan.candidates[llm].gpu for llm, _, _ in placement.unplaced}


def plan_and_place(problem: PlanningProblem, topology: Topology, *, name: str = "milp",
                   policy: str = "hierarchical", max_rounds: int = MAX_ROUNDS,
                   placer_options: Mapping[str, Any] | None = None,
                   formulation: Formulation = "auto",
                   deadline: Deadline | None = None) -> PlacedPlan:
    """A placed plan for ``problem`` on ``topology`` by ``formulation`` (module docstring).

    ``blocks`` and ``auto`` apply to the MILP; other optimisers use the aggregate placement
    without cuts (a heuristic whose allocation does not place is solved again with smaller
    budgets of the GPU types that failed, :func:`_shrunk`). Everything runs within
    ``deadline`` (default: the problem's time limit from now): once it passes no new round
    starts, and without a placed plan the status is ``time_limit``.
    """
    deadline = Deadline.of(problem, deadline)
    # the registry says which optimisers a formulation works with (blocks, patterns and slots
    # are MILPs of their own: another optimiser has none of them)
    FORMULATIONS_REGISTRY.check(formulation, "optimiser", name)
    kw: dict[str, Any] = {"name": name, "policy": policy, "max_rounds": max_rounds,
                          "placer_options": placer_options, "deadline": deadline}
    kind = problem.options.kind
    if kind.scales_targets and name == "milp":
        return _max_throughput(problem, topology, formulation, **kw)
    if kind.priced and name == "milp":
        return _min_cost(problem, topology, aggregate_only=formulation == "aggregate", **kw)
    return keep_current(problem, topology, _min_latency(problem, topology, formulation, **kw),
                        policy=policy, placer_options=placer_options, deadline=deadline)


@dataclass(frozen=True)
class LoopFormulation:
    """The formulation ``name`` of :func:`scepsy_place.formulations.loop.plan_and_place` (min-latency or
    max-throughput, as the problem says; ``kw``: its placer options, ``max_rounds``, ...)."""

    name: str

    def solve(self, problem: PlanningProblem, topology: Topology, *,
              deadline: Deadline | None = None, **kw: Any) -> PlacedPlan:
        """The placed plan of this formulation within ``deadline``."""
        return plan_and_place(problem, topology, formulation=self.name,  # type: ignore[arg-type]
                              deadline=deadline, **kw)


FORMULATIONS_REGISTRY: Registry[LoopFormulation] = Registry("formulation", source="plan",
                                                        field="formulation")
"""Every formulation by name (:class:`~scepsy_common.registry.Registry`), with the optimisers
it works with: ``aggregate`` and ``auto`` place any optimiser's allocation; ``blocks``,
``patterns`` and ``slots`` are MILPs of their own, so only the MILP has them."""
_SUMMARIES = {
    "aggregate": "the aggregate MILP, placed, cut and re-solved",
    "blocks": "whole-GPU blocks of one LLM each, placeable by construction",
    "patterns": "GPU patterns of co-located replicas by column generation, with an LP bound",
    "slots": "slot groups of LLMs sharing GPUs, placeable by construction",
    "auto": "the best placed plan of the others, optimal only where a bound proves it",
}
for _name in FORMULATIONS:
    FORMULATIONS_REGISTRY.register(
        _name, LoopFormulation(_name), summary=_SUMMARIES[_name],
        supports={"objective": OBJECTIVES,
                  **({} if _name in ("aggregate", "auto") else {"optimiser": ("milp",)})})


def formulation(name: str) -> LoopFormulation:
    """The registered formulation ``name`` (an input error naming the choices otherwise)."""
    return FORMULATIONS_REGISTRY.require(name)


OPEN_RACK = "open-"
"""Rack name prefix of the nodes added for open pools without ``max_nodes`` (min-cost)."""


COST_TIE = 1e-6
"""min-cost by patterns: candidate latencies weigh this fraction of the cheapest GPU-hour over
the largest total latency, so that latency only breaks ties in price."""


def _min_cost(problem: PlanningProblem, topology: Topology, *, aggregate_only: bool = False,
              **kw: Any) -> PlacedPlan:
    """The min-cost placed plan (docs/min-cost.md): the cheapest allocation in aggregate
    (:func:`scepsy_opt.planning.mincost.solve_min_cost`: its price is a lower bound on that of every
    placeable allocation) placed by the placer (then the exact test), and, without percentile
    bounds, the pattern formulation with the GPUs' prices as its objective (placeable by
    construction, LLMs sharing GPUs), slot groups and, with two or more GPU types, LLMs split
    over them (:func:`_min_cost_mixed`); the cheapest placed plan wins (ties: lower latency). The
    price of a placed plan is that of the GPUs its placement uses
    (``stats["placed_cost_per_hour"]``, gap to the best bound in ``placed_cost_gap``). Open
    pools without ``max_nodes`` get nodes for twice the GPUs the aggregate plan uses, and
    ``stats["nodes_to_buy"]`` counts the nodes of open pools the placement uses.
    ``aggregate_only`` (``formulation="aggregate"``): the cheapest allocation in aggregate,
    placed, and no other search (quick, and independent of the time limit once the MILP is
    solved: what a controller re-planning every window wants)."""
    deadline: Deadline = kw["deadline"]
    t0 = time.perf_counter()
    prices = gpu_prices(problem)
    scaled: PlacedPlan | None = None
    scaled_bound = 0.0
    if not aggregate_only and by_scale_applies(problem, topology):
        scaled, scaled_bound = _min_cost_by_scale(problem, topology, prices,
                                                  _share(deadline, BY_SCALE_SHARE))
    plan = solve_min_cost(problem, deadline=deadline)
    if plan.status == "time_limit_no_solution":
        if scaled is not None and scaled.placed:
            return _cheapest(problem, topology, {"slots-scale": scaled}, scaled_bound, prices,
                             deadline, t0)
        return timed_out(deadline, plan.optimiser, 1, (), "aggregate")
    history = ({"round": 1, "objective_s": plan.objective_s, "unplaced": 0},)
    if plan.allocation is None:
        why = (plan.infeasible.detail if plan.infeasible is not None
               else "no allocation meets the targets and the latency bounds")
        return PlacedPlan(plan=plan, placement=None, rounds=1, history=history, quality=None,
                          reason=why, exact=True, formulation="aggregate",
                          status="infeasible", seconds=time.perf_counter() - t0)
    top = open_topology(problem.cluster, topology, cast(Mapping[str, int], plan.stats.gpus_used or {}))
    bound = plan.stats.cost_bound_per_hour or 0.0
    tried: dict[str, PlacedPlan] = {} if scaled is None else {"slots-scale": scaled}
    dem = demands(plan.allocation, problem.catalog)
    placement = place_or_exact(top, dem, kw["policy"], kw["placer_options"], deadline)
    history = ({**history[0], "unplaced": len(placement.unplaced)},)
    if placement.complete:
        tried["aggregate"] = PlacedPlan(plan=plan, placement=placement, rounds=1, history=history,
                                        quality=None, reason=None, exact=False,
                                        formulation="aggregate", seconds=time.perf_counter() - t0)
    else:
        tried["aggregate"] = PlacedPlan(
            plan=plan, placement=placement, rounds=1, history=history, quality=None,
                                        reason=f"{len(placement.unplaced)} replica(s) of the "
            "cheapest allocation in aggregate did not fit on the cluster's nodes", exact=False,
            formulation="aggregate", status="unplaced", seconds=time.perf_counter() - t0)
    if (not aggregate_only and not problem.options.latency_bounds
            and deadline.remaining() > 0 and slots.applicable(problem) is None):
        placed_yet = any(r.placed for r in tried.values())
        tried["slots"] = _min_cost_slots(slots.on_nodes(problem, top), top, prices, _share(
            deadline, SLOTS_SHARE if placed_yet else SLOTS_FIRST_SHARE))
    if not aggregate_only and not problem.options.latency_bounds and deadline.remaining() > 0:
        # candidates within the nodes it may use (an open pool's budget is that of its nodes)
        pat, pat_bound = _min_cost_patterns(slots.on_nodes(problem, top), top, prices, deadline)
        tried["patterns"] = pat
        bound = max(bound, pat_bound)
    if not aggregate_only and mixing_applies(problem) and deadline.remaining() > 0:
        mixed, mixed_bound = _min_cost_mixed(slots.on_nodes(problem, top), top, prices,
                                             _share(deadline, MIXED_SHARE), kw)
        tried["mixed"] = mixed
        # the search now covers LLMs split over GPU types: the bound must hold for them too.
        # On wholly free GPUs the split formulation's bound holds for every plan the others
        # make (one LLM on one shape is a split into one group), so it replaces theirs; GPUs
        # partly in use are open to the others only, so then the lower of the two holds
        whole = _whole_free(top) == top.budgets()
        bound = (0.0 if mixed_bound is None else mixed_bound if whole
                 else min(bound, mixed_bound))
    # the relaxation's bound holds for every plan, LLMs split over GPU types included
    return _cheapest(problem, top, tried, max(bound, scaled_bound), prices, deadline, t0)


def _cheapest(problem: PlanningProblem, top: Topology, tried: Mapping[str, PlacedPlan],
              bound: float, prices: Mapping[str, float], deadline: Deadline, t0: float,
              ) -> PlacedPlan:
    """:func:`_min_cost`'s answer from the placed plans ``tried`` (by formulation): the
    cheapest placed plan (ties: lower latency), its price that of the GPUs its placement uses,
    its gap to ``bound`` (a lower bound on every plan's price), ``optimal`` only where it meets
    it; without a placed plan, the last tried's reason."""
    placed = {k: r for k, r in tried.items() if r.placed}
    compared = MappingProxyType({k: tried[k].outcome for k in sorted(tried)})
    if not placed:
        last = tried.get("patterns") or tried.get("aggregate") or next(iter(tried.values()))
        why = "; ".join(f"{k}: {r.reason}" for k, r in sorted(tried.items()))
        return replace(last, compared=compared, reason=why, seconds=time.perf_counter() - t0)
    costs = {k: _placed_cost(top, r.placement, prices) for k, r in placed.items()}
    name = min(placed, key=lambda k: (costs[k][0], placed[k].plan.objective_s, k))
    best = placed[name]
    cost, used = costs[name]
    stats = dict(best.plan.stats, placed_cost_per_hour=cost, placed_gpus=used,
                 placed_costs_per_hour={k: costs[k][0] for k in sorted(costs)},
                 cost_bound_per_hour=bound, prices_per_hour=dict(sorted(prices.items())),
                 placed_cost_gap=max(0.0, cost / bound - 1.0) if bound > 0 else 0.0)
    bought = None
    assert best.placement is not None and best.plan.allocation is not None
    if problem.cluster.open:
        stats["nodes_to_buy"] = _open_nodes_used(problem.cluster, top, best.placement)
        used_nodes = best.placement.nodes()
        bought = Topology(top.name, tuple(n for n in top.nodes if n.name in used_nodes
                                          or not _is_open(problem.cluster, n.rack)))
    dem = demands(best.plan.allocation, problem.catalog)
    # the status of the price: proven optimal when the placed price meets the bound
    status: Status = ("optimal" if cost <= bound * (1 + 1e-9) + 1e-12 else
              "time_limit" if deadline.remaining() <= 0 else "heuristic")
    return replace(best, plan=replace(best.plan, stats=SolveStats.of(stats), status=status),
                   quality=quality(top, best.placement, dem), compared=compared,
                   seconds=time.perf_counter() - t0, topology=bought)


BY_SCALE_SHARE = 0.9  # min-cost of many LLMs: the time the search on fewer nodes gets first
BY_SCALE_SLACK = 0.1  # ... its first try: the relaxation's GPUs per type and this much more
BY_SCALE_FIRST = 0.85  # ... the first try's share of the time (a first plan of 1,000 LLMs takes
# most of 30 s on 2 loaded cores), each later try half of what is left


def by_scale_applies(problem: PlanningProblem, topology: Topology) -> bool:
    """Whether min-cost also searches in parts on fewer nodes (:func:`_min_cost_by_scale`):
    slot groups would cut the problem into parts (:func:`scepsy_place.formulations.slots.splits`),
    on a cluster of known free GPUs (no open pool, no current allocation), without percentile
    bounds or per-LLM SLOs, and with mean latency bounds only on workflows that call one LLM
    each (each LLM's bound its own: :func:`scepsy_place.formulations.slots.bounds_alone`)."""
    o = problem.options
    return (slots.bounds_alone(problem) and not o.latency_bounds and not o.slos
            and o.current is None
            and not problem.cluster.open and slots.applicable(problem) is None
            and _whole_free(topology) == topology.budgets() and slots.splits(problem, topology))


def _min_cost_by_scale(problem: PlanningProblem, topology: Topology,
                       prices: Mapping[str, float], deadline: Deadline,
                       ) -> tuple[PlacedPlan | None, float]:
    """Min-cost of many LLMs, where the aggregate MILP does not settle in time: the GPUs per
    type that the cost bound's relaxation uses (:func:`scepsy_opt.planning.mincost.cost_lower_bound`)
    and :data:`BY_SCALE_SLACK` more, as the first whole nodes of each type in the topology's
    order, are asked to carry the targets (slot groups in parts on those nodes,
    :func:`scepsy_place.formulations.slots.plan_slot_scale` with the targets as its
    ``target``), the first try with :data:`BY_SCALE_FIRST` of the time, each later one with
    half the time left; the slack doubles until something carries. Then the node counts
    descend one GPU type at a time (:func:`_fewer_nodes`). With mean latency bounds (each on a
    workflow of one LLM) each shape runs at least the replicas its LLM's bound needs, in the
    plans and in the bound (:func:`scepsy_place.formulations.slots.slot_shapes`), and a plan
    whose predicted means miss a bound is not kept. The placed plan of the lowest price
    that carried is the answer, priced at the targets, with the relaxation's price as its
    bound: ``(plan, bound)``; ``(None, bound)`` when nothing carried in time, ``(None, 0.0)``
    without a finite bound in time."""
    t0 = time.perf_counter()
    bounded = bool(problem.options.latency_bound_s)
    shp: dict[str, list[slots.SlotShape]] | None = None
    try:
        if bounded:  # the replicas each shape needs for its LLM's bound count in the bound
            shp = slots.slot_shapes(problem, deadline, bounded=True)
            bound, used = cost_lower_bound(problem, prices, slots.as_capacity_shapes(shp),
                                           deadline=deadline,
                                           least={m: [sh.least for sh in v]
                                                  for m, v in shp.items()})
        else:
            bound, used = cost_lower_bound(problem, prices, deadline=deadline)
    except TimeLimitReached:
        return None, 0.0
    if not math.isfinite(bound):
        return None, 0.0
    by_type = {t: [n for n in topology.canonical_nodes() if n.gpu == t]
               for t in sorted(used) if used[t] > 1e-9}
    by_type = {t: nodes for t, nodes in by_type.items() if nodes}
    per = {t: nodes[0].gpus for t, nodes in by_type.items()}
    best: tuple[float, PlacedPlan] | None = None
    seen: set[tuple[int, ...]] = set()

    def attempt(counts: Mapping[str, int]) -> bool:
        """Whether the first ``counts[t]`` nodes of each type carry the targets (kept as the
        best when cheapest)."""
        nonlocal best
        seen.add(tuple(counts[t] for t in by_type))
        pick = [n for t, nodes in by_type.items() for n in nodes[:counts[t]]]
        sub = Topology(topology.name, tuple(pick))
        res = slots.plan_slot_scale(slots.on_nodes(problem, sub), sub, deadline=_share(
            deadline, BY_SCALE_FIRST if len(seen) == 1 else 0.5), target=1.0, gpu_cost=prices,
            bounded=bounded, shapes=shp)
        alloc = res.plan.allocation
        if not (res.placed and alloc is not None and res.plan.scale >= 1.0):
            return False
        priced = price(problem, alloc)
        if not _within_mean_bounds(problem, priced):
            return False
        cost, gpus = _placed_cost(sub, res.placement, prices)
        if best is None or cost < best[0]:
            plan = plan_from_choice(problem, "milp", "heuristic", priced,
                                    {"gpus_used": gpus, "parts": res.plan.stats.get("parts"),
                                     "probes": res.plan.stats.get("probes")})
            best = (cost, replace(res, plan=plan, formulation="slots",
                                  seconds=time.perf_counter() - t0))
        return True

    slack = BY_SCALE_SLACK
    carried: dict[str, int] | None = None
    while deadline.remaining() > 0 and carried is None:
        counts = {t: min(len(nodes), math.ceil(used[t] * (1 + slack) / per[t] - 1e-9))
                  for t, nodes in by_type.items()}
        if tuple(counts[t] for t in by_type) not in seen and attempt(counts):
            carried = counts
        elif all(counts[t] == len(nodes) for t, nodes in by_type.items()):
            break  # every node offered already
        slack *= 2
    if carried is not None:
        floor = {t: math.ceil(used[t] / per[t] - 1e-9) for t in by_type}
        _fewer_nodes(carried, floor, {t: prices[t] * per[t] for t in by_type}, attempt,
                     deadline, seen, list(by_type))
    return (None if best is None else best[1]), bound


def _within_mean_bounds(problem: PlanningProblem, priced: Mapping[str, Candidate]) -> bool:
    """Whether the choice ``priced`` meets every targeted workflow's mean latency bound, as the
    min-cost MILP's rows count it (:func:`scepsy_opt.planning.mincost.slo_rows`)."""
    return all(math.fsum(coeffs.values()) <= rhs + 1e-9 * max(1.0, abs(rhs))
               for coeffs, rhs in slo_rows(problem, {m: [c] for m, c in priced.items()}))


def _fewer_nodes(carried: Mapping[str, int], floor: Mapping[str, int],
                 node_price: Mapping[str, float], attempt: Callable[[Mapping[str, int]], bool],
                 deadline: Deadline, seen: set[tuple[int, ...]], order: Sequence[str],
                 ) -> dict[str, int]:
    """The descent of :func:`_min_cost_by_scale` from node counts that ``carried`` the
    targets: per GPU type, the count bisects between the highest count known not to carry
    (with the other types at their best; first, one below the relaxation's ``floor``) and the
    lowest that did; the type whose bracket is worth the most (its width times its node's
    price) goes next, each try with half the time left, until every bracket is closed or the
    time is spent. Counts tried before (``seen``, keyed in ``order``) are not asked again.
    Returns the fewest counts that carried. Where carrying is monotone in the counts, each
    type's count ends at its floor or one above a count that does not carry with the others
    as they end."""
    best = dict(carried)
    lo = {t: min(floor[t], best[t]) - 1 for t in best}
    while deadline.remaining() > 0:
        open_ = [t for t in order if best[t] - lo[t] > 1]
        if not open_:
            return best
        t = max(open_, key=lambda x: ((best[x] - lo[x] - 1) * node_price[x], x))
        mid = (lo[t] + best[t]) // 2
        counts = {**best, t: mid}
        if tuple(counts[x] for x in order) in seen:
            lo[t] = mid  # asked before, with other types at no fewer nodes: did not carry
            continue
        if attempt(counts):
            best = counts
        else:
            lo[t] = mid
    return best


def _placed_cost(topology: Topology, placement: Placement | None, prices: Mapping[str, float],
                 ) -> tuple[float, dict[str, int]]:
    """(USD per hour, GPUs per type) of the GPUs the placement uses."""
    used: dict[str, int] = {}
    for node, _ in (placement.per_gpu() if placement is not None else {}):
        g = topology.node(node).gpu
        used[g] = used.get(g, 0) + 1
    return math.fsum(prices[g] * n for g, n in sorted(used.items())), dict(sorted(used.items()))


def _cost_candidates(problem: PlanningProblem, prices: Mapping[str, float], deadline: Deadline,
                     ) -> tuple[CandidateSet, float, float]:
    """The candidates the co-locating min-cost formulations price (every one up to
    :data:`UNPRUNED_MAX_GPUS` GPUs, the cost-reduced ones above, whole GPUs a further count),
    the weight that makes their
    latencies only break ties in price (:data:`COST_TIE` of the cheapest GPU-hour over the
    largest total latency) and that total. Raises :class:`TimeLimitReached`."""
    dom = domains(problem)
    cs = (generate_candidates(problem, prune=False, deadline=deadline)
          if problem.cluster.total_gpus <= UNPRUNED_MAX_GPUS
          else cost_candidates(problem, deadline=deadline,  # keep those filling whole GPUs
                               whole=lambda c: group_gpus(c, dom[c.gpu])))
    worst = math.fsum(max((c.cost for c in v), default=0.0) for v in cs.by_llm.values())
    eps = COST_TIE * min(prices.values()) / worst if worst > 0 and min(prices.values()) > 0 \
        else 0.0
    return cs, eps, worst


def _min_cost_slots(problem: PlanningProblem, topology: Topology,
                    prices: Mapping[str, float], deadline: Deadline) -> PlacedPlan:
    """Slot groups (:mod:`scepsy_place.formulations.slots`) with the price of the GPUs their groups take as
    the objective (every candidate, whole-GPU and fractional shares together; the mean latency
    bounds as rows; latency scaled by :data:`COST_TIE` breaks ties): placeable by construction,
    so the price it finds is the price of its placement."""
    t0 = time.perf_counter()
    try:
        cs, eps, _ = _cost_candidates(problem, prices, deadline)
    except TimeLimitReached:
        return timed_out(deadline, "milp", 1, (), "slots", False)
    cands = cs.by_llm if problem.options.latency_bound_s else slots.slot_candidates(cs.by_llm)
    sol = slots.solve_slot_latency(problem, topology, cands, deadline=deadline,
                                   gpu_cost=prices, latency_weight=eps,
                                   extra=slo_rows(problem, cands))
    if not sol.choice:
        status: LoopStatus = "time_limit" if sol.status == "time_limit" else "unplaced"
        return PlacedPlan(plan=time_limit_plan("milp") if status == "time_limit" else
                          no_allocation_plan(optimiser="milp", status="unplaced", candidates={},
                                             stats={},
                                             infeasible=None, scale=0.0), placement=None, rounds=1,
                          history=(),
                          quality=None,
                          reason="no slot groups meet the targets within the GPUs offered",
                          exact=False,
                          formulation="slots", status=status, seconds=time.perf_counter() - t0)
    # the slot model's statuses (optimal, time_limit, infeasible) are plan statuses
    plan = plan_from_choice(problem, "milp", cast(Status, sol.status), dict(sol.choice),
                            {"candidates_generated": cs.generated,
                             "candidates_kept": sum(map(len, cands.values()))})
    assert plan.allocation is not None
    dem = demands(plan.allocation, problem.catalog)
    placement = slots.layout(topology, sol, dem)
    history = ({"round": 1, "objective_s": plan.objective_s,
                "unplaced": len(placement.unplaced)},)
    if not placement.complete:
        return PlacedPlan(plan=plan, placement=placement, rounds=1, history=history, quality=None,
                          reason="replicas found no slot", exact=False,
                          formulation="slots", status="unplaced", seconds=time.perf_counter() - t0)
    return PlacedPlan(plan=plan, placement=placement, rounds=1, history=history, quality=None,
                      reason=None, exact=False, formulation="slots",
                      seconds=time.perf_counter() - t0)


def _min_cost_patterns(problem: PlanningProblem, topology: Topology,
                       prices: Mapping[str, float], deadline: Deadline,
                       ) -> tuple[PlacedPlan, float]:
    """The pattern formulation with ``prices`` per GPU a pattern opens, the mean latency
    bounds as rows and candidate latencies scaled by :data:`COST_TIE` (ties only), and the
    price bound it proves (its LP bound less the largest scaled latency); the plan re-priced
    with the candidates' true latencies."""
    t0 = time.perf_counter()
    try:
        cs, eps, worst = _cost_candidates(problem, prices, deadline)
    except TimeLimitReached:
        return timed_out(deadline, "milp", 1, (), "patterns"), 0.0
    scaled = {m: tuple(replace(c, latency_s=eps * c.latency_s, change_s=eps * c.change_s)
                       for c in v) for m, v in cs.by_llm.items()}
    true = {replace(c, latency_s=eps * c.latency_s, change_s=eps * c.change_s): c
            for v in cs.by_llm.values() for c in v}
    res = solve_patterns(problem, topology, deadline=deadline, cset=replace(cs, by_llm=scaled),
                         gpu_cost=prices, extra=slo_rows(problem, scaled),
                         exact_candidates=problem.cluster.total_gpus <= UNPRUNED_MAX_GPUS)
    bound = max(0.0, res.lp_bound_s - eps * worst) if math.isfinite(res.lp_bound_s) else 0.0
    if res.placement is None or res.plan.allocation is None:
        status = {"infeasible": "infeasible", "time_limit_no_solution": "time_limit"}.get(
            res.status, "unplaced")
        return PlacedPlan(plan=res.plan, placement=None, rounds=1, history=(), quality=None,
                          reason=res.reason or res.status, exact=res.exact,
                          formulation="patterns", status=status,  # type: ignore[arg-type]
                          seconds=time.perf_counter() - t0), bound
    choice = {m: true[c] for m, c in res.plan.candidates.items()}
    plan = plan_from_choice(problem, "milp", res.plan.status, choice,
                            dict(res.stats, candidates_generated=cs.generated,
                                 candidates_kept=cs.kept))
    history = ({"round": 1, "objective_s": plan.objective_s, "unplaced": 0,
                "cost_objective": res.objective, "cost_bound": bound, "status": res.status,
                "columns": res.columns, "iterations": res.iterations},)
    return PlacedPlan(plan=plan, placement=res.placement, rounds=1, history=history, quality=None,
                      reason=None,
                      exact=res.exact and res.status == "optimal", formulation="patterns",
                      seconds=time.perf_counter() - t0), bound


def mixing_applies(problem: PlanningProblem) -> bool:
    """Whether min-cost also plans LLMs split over GPU types (:mod:`scepsy_opt.planning.mixing`): the
    cluster offers two or more GPU types and no current allocation is kept (latency bounds,
    mean or percentile, and per-LLM SLOs hold for split plans too)."""
    return (len({p.gpu for p in problem.cluster.pools}) > 1
            and problem.options.current is None)


def _whole_free(topology: Topology) -> dict[str, int]:
    """Per GPU type of ``topology``, its wholly free GPUs (sorted by type)."""
    out: dict[str, int] = {}
    for n in topology.nodes:
        out[n.gpu] = out.get(n.gpu, 0) + sum(n.free_units(i) == UNITS for i in range(n.gpus))
    return dict(sorted(out.items()))


def _min_cost_mixed(problem: PlanningProblem, topology: Topology, prices: Mapping[str, float],
                    deadline: Deadline, kw: Mapping[str, Any],
                    ) -> tuple[PlacedPlan, float | None]:
    """The cheapest portions of every LLM's load over the GPU types
    (:func:`scepsy_opt.planning.mixing.solve_mixed`, within the GPUs of ``topology``) as a plan of the
    problem split into its replica groups, each group laid out on the whole GPUs it was priced
    at (:func:`scepsy_place.packing.groups.layout_groups`; the placer, then the exact test, where that
    leaves replicas out); and the price bound it proves for every plan, split or not, on
    wholly free GPUs (None when it found no plan)."""
    t0 = time.perf_counter()
    mx = solve_mixed(problem, caps=_whole_free(topology), deadline=deadline, prices=prices)
    if not mx.feasible:
        status: LoopStatus = ("infeasible" if mx.status == "infeasible" else "time_limit")
        plan = (time_limit_plan("milp") if status == "time_limit" else
                no_allocation_plan(optimiser="milp", status="infeasible", candidates={}, stats={},
                                   infeasible=None, scale=0.0))
        why = ("no split of the LLMs' load over the GPU types meets the targets within the "
               "GPUs offered" if status == "infeasible" else "the time limit ran out")
        return PlacedPlan(plan=plan, placement=None, rounds=1, history=(), quality=None, reason=why,
                          exact=False, formulation="mixed", status=status,
                          seconds=time.perf_counter() - t0), None
    groups, plan = mixed_plan(problem, mx)
    assert plan.allocation is not None
    # each group on the whole GPUs it was priced at; the placer where that leaves some out
    placement = layout_groups(topology, plan.allocation, problem.catalog)
    if not placement.complete:
        placement = place_or_exact(topology, demands(plan.allocation, problem.catalog),
                                   kw["policy"], kw["placer_options"], deadline)
    history = ({"round": 1, "objective_s": plan.objective_s,
                "unplaced": len(placement.unplaced)},)
    reason = None if placement.complete else (
        f"{len(placement.unplaced)} replica(s) of the split plan did not fit on the nodes")
    return PlacedPlan(plan=plan, placement=placement, rounds=1, history=history, quality=None,
                      reason=reason, exact=False, formulation="mixed",
                      status="placed" if placement.complete else "unplaced",
                      seconds=time.perf_counter() - t0, problem=groups), mx.cost_bound_per_hour


def open_topology(cluster: Cluster, topology: Topology, gpus: Mapping[str, int]) -> Topology:
    """``topology`` with nodes for the open pools of ``cluster`` that have no ``max_nodes``:
    per such GPU type, nodes for twice ``gpus[type]`` (the GPUs a plan uses in aggregate; at
    least one node), in racks ``open-<gpu>``."""
    extra: list[GPUPool] = []
    for g in cluster.unbounded:
        node = max(p.gpus_per_node for p in cluster.pools if p.gpu == g and p.open)
        extra.append(GPUPool(g, max(1, -(-2 * gpus.get(g, 0) // node)), node))
    if not extra:
        return topology
    more = from_cluster(Cluster(topology.name, tuple(extra)))
    nodes = [replace(n, name=f"{OPEN_RACK}{n.name}", rack=f"{OPEN_RACK}{n.gpu}")
             for n in more.nodes]
    return Topology(topology.name, topology.nodes + tuple(nodes))


def _open_nodes_used(cluster: Cluster, topology: Topology, placement: Placement) -> dict[str, int]:
    """Per GPU type with an open pool, the nodes of open pools the placement uses (racks
    ``pool-<i>`` of an open pool ``i``, or ``open-<gpu>``)."""
    out = dict.fromkeys(sorted({p.gpu for p in cluster.pools if p.open}), 0)
    for name in sorted(placement.nodes()):
        n = topology.node(name)
        if _is_open(cluster, n.rack):
            out[n.gpu] = out.get(n.gpu, 0) + 1
    return out


def _is_open(cluster: Cluster, rack: str) -> bool:
    """Whether ``rack`` holds nodes of an open pool (``pool-<i>`` of an open pool ``i`` of
    :func:`~scepsy_place.packing.topology.from_cluster`, or ``open-<gpu>``)."""
    return rack.startswith(OPEN_RACK) or any(
        p.open and rack == f"pool-{i}" for i, p in enumerate(cluster.pools))


def _min_latency(problem: PlanningProblem, topology: Topology, formulation: Formulation,
                 **kw: Any) -> PlacedPlan:
    """The min-latency placed plan of ``formulation`` (no current-allocation check), its wall
    time in ``seconds``."""
    t0 = time.perf_counter()
    if formulation == "aggregate" or kw["name"] != "milp":
        res = _aggregate_loop(problem, topology, **kw)
    elif formulation == "blocks":
        res = plan_blocks(problem, topology, kw["deadline"])
    elif formulation == "patterns":
        res = plan_patterns(problem, topology, deadline=kw["deadline"])
    elif formulation == "slots":
        res = slots.plan_slot_latency(problem, topology, deadline=kw["deadline"])
    else:
        return plan_auto(problem, topology, **kw)
    return replace(res, seconds=time.perf_counter() - t0)


def plan_auto(problem: PlanningProblem, topology: Topology, **kw: Any) -> PlacedPlan:
    """``auto``: the best placed plan of the formulations its rule runs (module docstring,
    "auto"): ``blocks`` (above :data:`PATTERNS_BLOCKS_MAX_GPUS` GPUs only when patterns placed
    nothing: patterns falls back to blocks itself there); up to :data:`UNPRUNED_MAX_GPUS` GPUs
    the aggregate loop, stopped at the blocks plan's objective; ``patterns`` unless a plan in
    hand is proven optimal over the candidate grid (above :data:`UNPRUNED_MAX_GPUS` GPUs started
    from the blocks plan, and its aggregate MILP's bound kept); above :data:`UNPRUNED_MAX_GPUS`
    GPUs the aggregate loop (:func:`_aggregate_child`: its first MILP's bound, and its plan where
    it places; above :data:`PATTERNS_BLOCKS_MAX_GPUS` GPUs the MILP alone, for its bound) in a
    forked child from the start (:class:`scepsy_common.forked.Forked`, a second
    core while this one searches for plans, awaited until the deadline and
    :data:`BOUND_WAIT_S` unless a plan in hand is proven first), or, where the platform cannot
    fork, here with the time left.

    Slot groups (:mod:`scepsy_place.formulations.slots`, LLMs sharing GPUs, placeable by construction) run
    after blocks where they apply. One deadline, split: each step gets its share of what
    remains (:data:`BLOCKS_SHARE`, :data:`SLOTS_SHARE` or :data:`SLOTS_LARGE_SHARE`,
    :data:`AGGREGATE_SHARE`, :data:`PATTERNS_LARGE_SHARE`; patterns otherwise the rest), so
    time a step does not use carries over to the next. ``compared`` says how each formulation
    ended; ``bound_s`` is the highest bound valid for every placeable allocation of the
    candidate grid, and the plan's status, gap and ``exact`` are those that bound proves
    (:func:`_labelled`). Never raises on a spent deadline: without a placed plan the result is
    ``time_limit`` (or how the formulations ended)."""
    deadline: Deadline = kw["deadline"]
    t0 = time.perf_counter()
    small = problem.cluster.total_gpus <= UNPRUNED_MAX_GPUS
    with contextlib.ExitStack() as stack:
        # above UNPRUNED_MAX_GPUS the aggregate loop (the bound, and a plan where the aggregate
        # optimum packs): on a second core from the start, while this one searches for plans
        child = (stack.enter_context(Forked(lambda: _aggregate_child(problem, topology, kw)))
                 if not small and can_fork() else None)
        tried, bounds = _auto_steps(problem, topology, child is None, kw)
        # above PATTERNS_BLOCKS_MAX_GPUS the child has only the bound patterns may have given
        if child is not None and not _proven(tried, bounds, small) and not (_large(problem)
                                                                            and bounds):
            with contextlib.suppress(ChildKilled):
                agg, found = child.wait(max(0.0, deadline.remaining()) + BOUND_WAIT_S)
                if agg is not None:
                    tried["aggregate"] = agg
                if found is not None:
                    bounds.append(found)
    best = _best(tried.values())
    compared = MappingProxyType({k: tried[k].outcome for k in sorted(tried)})
    bound = _grid_bound(tried, bounds, small)
    seconds = time.perf_counter() - t0
    # the time ran out: the whole deadline, or a step's share of it (cut before it finished)
    ran_out = deadline.remaining() <= 0 or any(
        r.status == "time_limit" or r.plan.status == "time_limit" for r in tried.values())
    if best is not None:
        return replace(_labelled(best, bound, ran_out), compared=compared, seconds=seconds)
    if not tried:  # nothing ran: the time was gone before the first step
        return replace(timed_out(deadline, kw.get("name", "milp"), 1, (), "auto", False),
                       compared=compared, bound_s=bound, seconds=seconds)
    agg, pat, blk = tried.get("aggregate"), tried.get("patterns"), tried.get("blocks")
    why = "; ".join(f"{k}: {tried[k].reason}" for k in sorted(tried))
    if agg is not None and agg.status == "infeasible":  # proven for every allocation
        return replace(agg, compared=compared, bound_s=bound, seconds=seconds)
    last = agg or (pat if pat is not None and (pat.status != "time_limit" or blk is None)
                   else blk) or next(iter(tried.values()))
    status: LoopStatus = ("time_limit" if any(r.status == "time_limit" for r in tried.values())
                          else last.status)
    # no plan and no proof: nothing exact to report
    return replace(last, compared=compared, bound_s=bound, seconds=seconds, status=status,
                   reason=why if len(tried) > 1 else last.reason, exact=False)


def _auto_steps(problem: PlanningProblem, topology: Topology, in_process: bool,
                kw: Mapping[str, Any]) -> tuple[dict[str, PlacedPlan], list[float]]:
    """:func:`plan_auto`'s formulations in its order, each within its share of the deadline:
    how each ended (by formulation) and the bounds found on every placeable allocation of the
    grid. ``in_process``: above UNPRUNED_MAX_GPUS GPUs, whether the aggregate MILP's bound is
    left to this process (no child computes it)."""
    deadline: Deadline = kw["deadline"]
    small = problem.cluster.total_gpus <= UNPRUNED_MAX_GPUS
    # above PATTERNS_BLOCKS_MAX_GPUS patterns solves blocks itself only where it needs them
    large = _large(problem)
    tried: dict[str, PlacedPlan] = {}
    bounds: list[float] = []
    pat: PlacedPlan | None

    def run(step: str, share: float, **extra: Any) -> PlacedPlan:
        left = _share(deadline, share)
        t1 = time.perf_counter()
        if step == "blocks":
            res = plan_blocks(problem, topology, left)
        elif step == "slots":
            res = slots.plan_slot_latency(problem, topology, deadline=left)
        elif step == "aggregate":
            res = _aggregate_loop(problem, topology, **{**kw, "deadline": left}, **extra)
        else:
            res = plan_patterns(problem, topology, deadline=left, **extra)
        tried[step] = replace(res, seconds=time.perf_counter() - t1)
        return res

    if not large:
        run("blocks", BLOCKS_SHARE)
    if deadline.remaining() > 0 and slots.applicable(problem) is None and (
            small or slots.splits(problem, topology)):
        # LLMs sharing GPUs, placed by construction; above UNPRUNED_MAX_GPUS the one
        # co-locating formulation that scales with the number of LLMs, so it gets more (there
        # only in parts: one part is one MILP over every unpruned candidate, docs/optimiser.md)
        run("slots", SLOTS_SHARE if small else SLOTS_LARGE_SHARE)
    if small and deadline.remaining() > 0:
        best = _best(tried.values())
        # patterns may still run after the loop: it gets a share, they the rest
        run("aggregate", AGGREGATE_SHARE,
            cutoff_s=best.plan.objective_s if best is not None else math.inf)
    if deadline.remaining() > 0 and not _proven(tried, bounds, small):
        # the blocks plan as patterns' start where patterns would build it itself
        blocks = tried.get("blocks")
        start = blocks if blocks is not None and blocks.placed and not small else None
        pat = run("patterns", PATTERNS_LARGE_SHARE if large else 1.0, blocks_start=start)
        # its aggregate MILP (over candidates reduced exactly, so with the optimum of every
        # candidate): a bound on every allocation
        agg_bound = pat.plan.stats.aggregate_bound
        if not small and isinstance(agg_bound, float) and math.isfinite(agg_bound):
            bounds.append(agg_bound)
    if large and _best(tried.values()) is None and deadline.remaining() > 0:
        run("blocks", 1.0)
    if not small and in_process and deadline.remaining() > 0 and not _proven(tried, bounds,
                                                                            small):
        if not large:  # no child ran it: here, with the time left
            run("aggregate", 1.0)
        elif not bounds:
            found = _aggregate_bound(problem, deadline)
            if found is not None:
                bounds.append(found)
    return tried, bounds


def _large(problem: PlanningProblem) -> bool:
    """Above :data:`PATTERNS_BLOCKS_MAX_GPUS` GPUs: patterns fall back to blocks themselves,
    and the aggregate step is its MILP alone (each of the loop's placements costs seconds)."""
    return problem.cluster.total_gpus > PATTERNS_BLOCKS_MAX_GPUS


def _aggregate_child(problem: PlanningProblem, topology: Topology, kw: Mapping[str, Any],
                     ) -> tuple[PlacedPlan | None, float | None]:
    """``auto``'s aggregate step above :data:`UNPRUNED_MAX_GPUS` GPUs, run in a forked child
    from the start: the aggregate loop and None, or, above :data:`PATTERNS_BLOCKS_MAX_GPUS`
    GPUs (where each of its placements costs seconds), None and the aggregate MILP's bound
    alone. The loop gets :data:`CHILD_SHARE` of the deadline (the rest is the margin for its
    last step's overrun and its answer); its result carries its first MILP's bound on every
    allocation of the candidate grid and, where the aggregate optimum (or a re-solve with cuts)
    packs, its placed plan."""
    deadline: Deadline = kw["deadline"]
    if _large(problem):
        return None, _aggregate_bound(problem, deadline)
    t1 = time.perf_counter()
    res = _aggregate_loop(problem, topology, **{**kw, "deadline": _share(deadline, CHILD_SHARE)})
    return replace(res, seconds=time.perf_counter() - t1), None


def _aggregate_bound(problem: PlanningProblem, deadline: Deadline) -> float | None:
    """The aggregate MILP's bound on every allocation of the candidate grid within
    ``deadline`` (None: no allocation in time, or none at all)."""
    plan = solve_min_latency(problem, deadline=deadline)
    return plan.bound_s if plan.allocation is not None and math.isfinite(plan.bound_s) else None


def _share(deadline: Deadline, share: float) -> Deadline:
    """A step's deadline: ``share`` of what remains of ``deadline`` from now (never past it;
    the limit it names is still the whole plan's)."""
    return deadline.within(share * deadline.remaining())


def _labelled(best: PlacedPlan, bound: float | None, ran_out: bool) -> PlacedPlan:
    """``best`` as ``auto`` hands it on, saying only what ``bound`` (valid for every placeable
    allocation of the grid, None without one) proves: ``optimal`` and ``exact`` only within
    :data:`PROVEN_GAP` of it; otherwise ``time_limit`` when the time ran out, ``heuristic``
    when it did not. The plan's bound and gap (plan.json's ``solver``) are the placement's
    (``bound_s``, ``objective / bound_s - 1``; none without a bound), not those of the
    formulation's own MILP over its own candidates."""
    res = replace(best, bound_s=bound)
    proven = bound is not None and bound > 0 and best.plan.objective_s <= bound * (1 + PROVEN_GAP)
    gap = res.gap
    status: Status = "optimal" if proven else "time_limit" if ran_out else "heuristic"
    # the formulation's own gap (patterns: over its own bound) would stand in for the solver's
    stats = {k: v for k, v in best.plan.stats.items() if k != "gap"}
    plan = replace(best.plan, status=status, stats=SolveStats.of(stats),
                   bound_s=bound if bound is not None else -math.inf,
                   gap=gap if gap is not None else math.inf)
    return replace(res, plan=plan, exact=proven)


def _grid_bound(tried: Mapping[str, PlacedPlan], bounds: list[float], small: bool,
                ) -> float | None:
    """The highest of ``bounds`` and the bounds of ``tried`` that hold for every placeable
    allocation of the candidate grid (:data:`GRID_BOUNDS`; :data:`GRID_BOUNDS_UNPRUNED` only
    up to :data:`UNPRUNED_MAX_GPUS` GPUs)."""
    valid = [*bounds, *(r.bound_s for k, r in tried.items() if r.bound_s is not None
                        and (k in GRID_BOUNDS or (small and k in GRID_BOUNDS_UNPRUNED)))]
    return max(valid) if valid else None


def _proven(tried: Mapping[str, PlacedPlan], bounds: list[float], small: bool) -> bool:
    """Whether the best placed plan of ``tried`` is within :data:`PROVEN_GAP` of a bound on
    every placeable allocation of the grid (no other formulation can beat it)."""
    best, bound = _best(tried.values()), _grid_bound(tried, bounds, small)
    return (best is not None and bound is not None and bound > 0
            and best.plan.objective_s <= bound * (1 + PROVEN_GAP))


def _best(results: Any) -> PlacedPlan | None:
    """The placed plan of lowest objective (the first of equals, in the order run)."""
    best: PlacedPlan | None = None
    for r in results:
        if r.placed and (best is None or r.plan.objective_s < best.plan.objective_s):
            best = r
    return best


def keep_current(problem: PlanningProblem, topology: Topology, res: PlacedPlan, *,
                 policy: str = "hierarchical",
                 placer_options: Mapping[str, Any] | None = None,
                 deadline: Deadline | None = None) -> PlacedPlan:
    """``res``, or keeping the current allocation (``problem.options.current``) when that still
    carries the targets within the budgets, places on ``topology`` and has a lower objective
    (:func:`scepsy_opt.planning.candidates.price`: the same latencies as the optimiser's, no change
    penalty). ``compared["current"]`` says how it ended (``stopped``: priced no better than
    ``res``, not placed; ``infeasible``: it does not carry the targets or fit the budgets)."""
    cur = problem.options.current
    if cur is None or not problem.options.kind.keeps_current:
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
    return PlacedPlan(plan=plan, placement=placement, rounds=res.rounds, history=res.history,
                      quality=quality(topology, placement, dem), reason=None, exact=False,
                      formulation="current", compared=compared,
                      status="placed", cuts=res.cuts)


def current_plan(problem: PlanningProblem, name: str = "milp") -> Plan | None:
    """The current allocation priced at ``problem``'s targets (status ``evaluated``), or None
    when it uses a GPU type the cluster lacks, exceeds the budgets or does not carry an LLM's
    load at ``max_utilisation`` (the candidates' rule, :func:`scepsy_opt.prediction.pipeline.min_replicas`)."""
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


def _aggregate_loop(problem: PlanningProblem, topology: Topology, *, name: str = "milp",
                    policy: str = "hierarchical", max_rounds: int = MAX_ROUNDS,
                    placer_options: Mapping[str, Any] | None = None,
                    cutoff_s: float = math.inf, deadline: Deadline | None = None) -> PlacedPlan:
    """Optimise, place, cut and re-optimise until the plan is placed (module docstring).

    ``cutoff_s``: the objective of a placed plan in hand (``auto``'s blocks plan). Rounds only
    add constraints, so their objectives never fall: once one reaches the cutoff the loop stops
    without placing (status ``stopped``), as it cannot beat the plan in hand.

    Every solve gets what remains of ``deadline``; a round whose solve finds nothing in time
    ends the loop (status ``time_limit``), and so does a round that fails to place once the
    deadline has passed, or whose re-solve could not even be built in the time left (no
    step is started that would overrun it by more than its own build). It stops on a proof
    (placed, infeasible, the cutoff reached) or at the deadline; ``max_rounds`` is a safety
    net, and a loop it ends says so (``unplaced``, the reason naming the round cap).
    """
    deadline = Deadline.of(problem, deadline)
    run = _AggregateRun(problem, topology, name, policy, dict(placer_options or {}), cutoff_s,
                        deadline)
    try:
        plan = run.first_plan()
    except TimeLimitReached:
        return timed_out(deadline, name, 1, (), "aggregate", run.exact)
    placement: Placement | None = None
    for rnd in range(1, max_rounds + 1):
        done = run.settled(plan, placement, rnd)
        if done is not None:
            return done
        assert plan.allocation is not None
        dem = demands(plan.allocation, problem.catalog)
        placement = place(topology, dem, policy, **run.opts)
        entry: dict[str, Any] = {"round": rnd, "objective_s": plan.objective_s,
                                 "unplaced": len(placement.unplaced)}
        run.history.append(entry)
        if placement.complete:
            return run.ended(plan, placement, "placed", None, quality(topology, placement, dem))
        if run.looping and deadline.remaining() <= 0:  # no time for cuts and another round
            return run.timed_out(rnd)
        step = run.shrink(plan, placement, entry) if not run.looping else \
            run.cut(plan, placement, dem, entry, rnd)
        if isinstance(step, PlacedPlan):
            return step
        plan = step
    last = run.history[-1] if run.history else {}
    return run.ended(plan, placement, "unplaced",
                     f"stopped by the round cap: no placed plan after {len(run.history)} "
                     f"round(s) (max_rounds, --max-rounds {max_rounds}; "
                     f"{last.get('unplaced', 0)} replica(s) unplaced in the last, "
                     f"{_cut_text(run.cuts)}); not proven infeasible")


@dataclass
class _AggregateRun:
    """The state of one run of :func:`_aggregate_loop`: what it was asked, the rows it has
    added (``valid``: hold for every placeable allocation; ``nogood``: allocations the placer
    failed on), the cuts by kind, the rounds so far and the first MILP's bound."""

    problem: PlanningProblem
    topology: Topology
    name: str
    policy: str
    opts: dict[str, Any]
    cutoff_s: float
    deadline: Deadline
    exact: bool = True
    history: list[dict[str, Any]] = field(default_factory=list)
    valid: list[Row] = field(default_factory=list)
    nogood: list[Row] = field(default_factory=list)
    cuts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CUT_KINDS, 0))
    cset: CandidateSet | None = None
    first: list[float] = field(default_factory=list)  # the first MILP's bound, if any
    solved_on: PlanningProblem | None = None  # a heuristic's problem, budgets shrunk

    @property
    def unpruned(self) -> bool:
        """Every candidate on small clusters (exact); the dominance-pruned ones above
        UNPRUNED_MAX_GPUS, where the unpruned set is too large to re-solve round after round."""
        return self.problem.cluster.total_gpus <= UNPRUNED_MAX_GPUS

    @property
    def looping(self) -> bool:
        """Only the MILP re-solves with cuts; the heuristics re-solve with smaller budgets."""
        return self.name == "milp"

    @property
    def busy(self) -> bool:
        return any(n.busy for n in self.topology.nodes)

    def candidates(self) -> CandidateSet:
        cs = generate_candidates(self.problem, prune=not self.unpruned, deadline=self.deadline)
        if self.busy:  # re-planning on a busy cluster: budget the free capacity, not every GPU
            rows = free_capacity_rows(self.topology, cs.by_llm)
            self.valid.extend(rows)
            self.cuts["free_capacity"] += len(rows)
        rows = packing_inequalities(self.problem, cs.by_llm)
        self.valid.extend(rows)
        self.cuts["packing"] += len(rows)
        return cs

    def first_plan(self) -> Plan:
        if self.looping and self.busy:
            self.exact = self.unpruned
            self.cset = self.candidates()
            plan = solve_min_latency(self.problem, self.cset, self.valid, deadline=self.deadline)
        elif self.looping:
            plan = optimiser(self.name).solve(self.problem,  # type: ignore[call-arg]
                                              deadline=self.deadline)
        else:
            plan = optimiser(self.name).solve(self.problem)
        if self.looping and plan.allocation is not None and math.isfinite(plan.bound_s):
            self.first.append(plan.bound_s)
        return plan

    def ended(self, plan: Plan, placement: Placement | None, status: LoopStatus,
              why: str | None, qual: Mapping[str, Any] | None = None) -> PlacedPlan:
        proven = self.exact and not self.cuts["no_good_placer"] and not self.cuts["tightened"]
        # a placed (or stopped) plan is the cheapest placeable only when its MILP was solved
        # to optimality (or, stopped, its bound reached the cutoff), not cut by the deadline
        solved = (status == "infeasible" or plan.status == "optimal"
                  or (status == "stopped" and plan.bound_s >= self.cutoff_s))
        return PlacedPlan(plan=plan, placement=placement, rounds=max(len(self.history), 1),
                          history=tuple(self.history), quality=qual, reason=why,
                          exact=proven and solved and status in ("placed", "infeasible",
                                                                 "stopped"),
                          formulation="aggregate",
                          status=status, cuts=MappingProxyType(dict(self.cuts)),
                          bound_s=_loop_bound(self.first, plan, proven and self.looping))

    def timed_out(self, rounds: int) -> PlacedPlan:
        """No placed plan: the deadline passed; the bound is the first MILP's."""
        return replace(timed_out(self.deadline, self.name, rounds, tuple(self.history),
                                 "aggregate", self.exact),
                       bound_s=self.first[0] if self.first else None)

    def settled(self, plan: Plan, placement: Placement | None, rnd: int) -> PlacedPlan | None:
        """How the run ends before placing ``plan`` (None: place it): no solution in time, no
        allocation, or an objective no better than the cutoff."""
        if plan.status == "time_limit_no_solution":
            return self.timed_out(rnd)
        if plan.allocation is None:
            return self.ended(plan, placement, *_no_allocation(plan, self.cuts,
                                                                proven=self.unpruned))
        if plan.objective_s >= self.cutoff_s and plan.status != "optimal" and not (
                plan.bound_s >= self.cutoff_s):  # cut by the deadline before it proved anything
            valid_rows = (self.exact and self.looping and not self.cuts["no_good_placer"]
                          and not self.cuts["tightened"])
            return replace(self.timed_out(rnd), bound_s=_loop_bound(self.first, plan, valid_rows))
        if plan.objective_s >= self.cutoff_s:
            self.history.append({"round": rnd, "objective_s": plan.objective_s,
                                 "unplaced": None})
            return self.ended(plan, None, "stopped",
                              f"stopped at an objective of {plan.objective_s:.6g} s, no better "
                              f"than the plan in hand ({self.cutoff_s:.6g} s)")
        return None

    def shrink(self, plan: Plan, placement: Placement, entry: dict[str, Any]
               ) -> Plan | PlacedPlan:
        """A heuristic's next plan: solved again with smaller budgets of the GPU types that
        failed to place (or the end of the run, unplaced)."""
        solved_on = self.solved_on or self.problem
        smaller = _shrunk(solved_on, plan, placement) if plan.status == "heuristic" else None
        if smaller is None:
            return self.ended(plan, placement, "unplaced",
                              f"the {self.name} allocation could not be placed "
                              f"({len(placement.unplaced)} replica(s) unplaced; only the milp "
                              "optimiser re-solves with cuts, the heuristics with smaller "
                              "budgets)")
        entry["shrunk_to"] = smaller.budgets()
        self.cuts["tightened"] += 1
        self.solved_on = replace(self.problem, cluster=smaller)
        return optimiser(self.name).solve(self.solved_on)

    def cut(self, plan: Plan, placement: Placement, dem: Any, entry: dict[str, Any],
            rnd: int) -> Plan | PlacedPlan:
        """The MILP's next plan: cuts for each GPU type that failed to place (configuration
        cuts, no-goods, tightened no-goods), then a re-solve; or the placed plan, when the
        exact test places what the placer did not; or the end of the run, out of time."""
        deadline = self.deadline
        try:
            if self.cset is None:
                self.exact = self.exact and self.unpruned
                self.cset = self.candidates()
            cset = self.cset
            added = dict.fromkeys(("configuration", "no_good", "no_good_placer", "tightened"), 0)
            rescued: list[Slot] = []
            failed = _failed_types(placement, plan)
            for gpu in sorted(failed):
                deadline.check()
                chosen = [c for c in plan.candidates.values() if c.gpu == gpu]
                cut = configuration_cut(self.topology, gpu, chosen, cset.by_llm)
                if cut is not None:
                    self.valid.append(cut)
                    added["configuration"] += 1
                    continue
                ex = _place_type_exactly(self.topology, dem, gpu, deadline)
                if ex.status == "placed":
                    rescued.extend(ex.slots)
                    continue
                self.nogood.append(({c: 1.0 for c in chosen}, len(chosen) - 1.0))
                if ex.status == "infeasible":
                    added["no_good"] += 1
                    continue
                added["no_good_placer"] += 1
                if self.cuts["no_good_placer"] + added["no_good_placer"] > TIGHTEN_AFTER:
                    self.nogood.append(_tightened(plan, placement, gpu, cset))
                    added["tightened"] += 1
            if not any(added.values()):  # the exact test placed what the placer did not
                plan_unplaced = placement.unplaced
                placement = _rescue(placement, failed, rescued,
                                    {m: c.gpu for m, c in plan.candidates.items()})
                entry.update(unplaced=0, placer_unplaced=len(plan_unplaced), placed_by="exact")
                return self.ended(plan, placement, "placed", None,
                                  quality(self.topology, placement, dem))
            entry["cuts"] = added
            for k, v in added.items():
                self.cuts[k] += v
            # building the MILP and handing it to HiGHS run outside HiGHS's clock (about the
            # last build's time each): a re-solve without time for both is not started, and
            # HiGHS's limit ends that much before the deadline
            build_s = float(plan.stats.build_s or 0.0)
            if deadline.remaining() <= 2 * build_s:
                raise TimeLimitReached(time_limit_detail(deadline.limit_s))
            return solve_min_latency(self.problem, cset, self.valid + self.nogood,
                                     deadline=deadline.within(deadline.remaining() - build_s))
        except TimeLimitReached:
            return self.timed_out(rnd + 1)


def _loop_bound(first: list[float], plan: Plan, proven: bool) -> float | None:
    """The aggregate loop's proven lower bound: its first MILP's (the aggregate optimum's
    bound, valid for every allocation), or, when every row since holds for every placeable
    allocation of the unpruned candidates (``proven``), the last MILP's bound if higher."""
    best = first[0] if first else None
    if proven and plan.allocation is not None and math.isfinite(plan.bound_s):
        best = plan.bound_s if best is None else max(best, plan.bound_s)
    return best


def _place_type_exactly(topology: Topology, dem: list[Demand], gpu: str,
                        deadline: Deadline) -> ExactPlacement:
    """:func:`scepsy_place.packing.exact.place_exactly` of the demands of GPU type ``gpu``, within
    :data:`~scepsy_place.packing.exact.EXACT_TIME_S` and what remains of ``deadline``."""
    return place_exactly(topology, [d for d in dem if d.gpu == gpu],
                         time_limit_s=min(EXACT_TIME_S, deadline.remaining()))


def _rescue(placement: Placement, failed: set[str], slots: list[Slot], gpu_of: Mapping[str, str],
            ) -> Placement:
    """``placement`` with the replicas of the GPU types ``failed`` placed by ``slots``
    (:func:`scepsy_place.packing.exact.place_exactly`), ``placed_by`` ``exact``."""
    keep = tuple(s for s in placement.slots if gpu_of[s.llm] not in failed)
    return replace(placement, slots=keep + tuple(slots), unplaced=(), placed_by="exact")


def place_or_exact(topology: Topology, dem: list[Demand], policy: str,
                   placer_options: Mapping[str, Any] | None, deadline: Deadline) -> Placement:
    """The placer's placement of ``dem``, or, where it leaves replicas of a GPU type unplaced and
    :func:`scepsy_place.packing.exact.place_exactly` places them all, that one (``placed_by``
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


def _shrunk(problem: PlanningProblem, plan: Plan, placement: Placement) -> Cluster | None:
    """A heuristic's next budget after its allocation did not place: every GPU type with a
    replica left unplaced loses the whole GPUs those replicas needed (at least one), its node
    size kept while a whole node is left; None when a type would be left with none (the
    heuristic is then out of room)."""
    lost: dict[str, int] = {}
    for m, _, _ in placement.unplaced:
        c = plan.candidates[m]
        lost[c.gpu] = lost.get(c.gpu, 0) + c.tp * share_units(c.share)
    budgets = problem.cluster.budgets()
    pools = []
    for gpu in budgets:
        have = [p for p in problem.cluster.pools if p.gpu == gpu]
        if gpu not in lost:
            pools.extend(have)
            continue
        left = budgets[gpu] - max(1, math.ceil(lost[gpu] / UNITS))
        if left <= 0:
            return None
        size = max(p.gpus_per_node for p in have)
        if left >= size:
            pools.append(GPUPool(gpu, left // size, size, have[0].price_per_hour))
        if left % size:
            pools.append(GPUPool(gpu, 1, left % size, have[0].price_per_hour))
    return Cluster(problem.cluster.name, tuple(pools))


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
    """Max-throughput with placement. ``auto`` (without latency bounds or SLOs, where slot
    groups apply: their scale search prices shapes, not the candidates that keep the bounds):
    :func:`_max_throughput_auto`. Otherwise the capacity optimum when it places, else the
    largest placeable scale found by bisection (:func:`_placeable_scale`)."""
    deadline: Deadline = kw["deadline"]
    if (formulation in ("auto", "slots") and slots.applicable(problem) is None
            and not problem.options.latency_bound_s and not problem.options.latency_bounds
            and not problem.options.slos):
        if formulation == "slots":
            return slots.plan_slot_scale(problem, topology, deadline=deadline)
        return _max_throughput_auto(problem, topology, **kw)
    try:
        plan = optimiser("milp").solve(problem, deadline=deadline)  # type: ignore[call-arg]
    except TimeLimitReached:
        return timed_out(deadline, "milp", 1, (), formulation)
    if plan.status == "time_limit_no_solution":
        return timed_out(deadline, "milp", 1, (), formulation)
    if plan.allocation is None:
        return _infeasible_scale(plan, formulation)
    dem = demands(plan.allocation, problem.catalog)
    placement = place_or_exact(topology, dem, kw["policy"], kw["placer_options"], deadline)
    entry = {"round": 1, "scale": plan.scale, "objective_s": plan.objective_s,
             "unplaced": len(placement.unplaced)}
    if placement.complete:
        return PlacedPlan(plan=plan, placement=placement, rounds=1, history=(entry,),
                          quality=quality(topology, placement, dem), reason=None,
                          exact=True, formulation="aggregate")
    return _placeable_scale(problem, topology, plan.scale, (entry,), formulation, **kw)


def _infeasible_scale(plan: Plan, formulation: str) -> PlacedPlan:
    """No scale of the targets is carried (the optimiser's diagnosis)."""
    why = plan.infeasible.detail if plan.infeasible is not None else "no scale carried"
    history = ({"round": 1, "scale": plan.scale, "status": "infeasible"},)
    return PlacedPlan(plan=plan, placement=None, rounds=1, history=history, quality=None,
                      reason=why, exact=True, formulation=formulation, status="infeasible")


def _max_throughput_auto(problem: PlanningProblem, topology: Topology, **kw: Any) -> PlacedPlan:
    """``auto``'s max-throughput: slot groups (:func:`scepsy_place.formulations.slots.plan_slot_scale`,
    placed by construction, with a proven bound on the scale) within :data:`SLOT_SHARE` of the
    time (all of it above :data:`UNPRUNED_MAX_GPUS` GPUs, where the exact capacity optimum
    does not finish and is not run); when that plan is more than :data:`CAPACITY_GAP` below its bound (or there is none),
    the exact capacity optimum with the time left, kept when it places at a larger scale (it is
    then the placeable optimum). The capacity optimum also decides infeasibility when the slots
    found nothing."""
    deadline: Deadline = kw["deadline"]
    # above UNPRUNED_MAX_GPUS the exact capacity optimum does not finish: the slots get it all
    small = problem.cluster.total_gpus <= UNPRUNED_MAX_GPUS
    res = slots.plan_slot_scale(problem, topology,
                                deadline=_share(deadline, SLOT_SHARE) if small else deadline)
    res = replace(res, history=tuple({**h, "formulation": "slots"} for h in res.history))
    gap = res.plan.stats.scale_gap if res.placed else None
    # above UNPRUNED_MAX_GPUS, slots cut short by the time limit end the run: the capacity
    # optimum would not finish in what is left (and would overrun the limit)
    if ((res.placed and (not small or (gap is not None and gap <= CAPACITY_GAP)))
            or deadline.remaining() <= 0 or (not small and res.status == "time_limit")):
        return res if res.placed else timed_out(deadline, "milp", res.rounds, res.history,
                                                "auto", False, stats=res.plan.stats)
    try:
        plan = optimiser("milp").solve(problem, deadline=deadline)  # type: ignore[call-arg]
    except TimeLimitReached:
        plan = None
    if plan is not None and plan.allocation is None and plan.status == "infeasible":
        return _infeasible_scale(plan, "auto")
    if plan is not None and plan.allocation is not None and deadline.remaining() > 0 and (
            not res.placed or plan.scale > res.plan.scale):
        dem = demands(plan.allocation, problem.catalog)
        placement = place_or_exact(topology, dem, kw["policy"], kw["placer_options"], deadline)
        entry = {"round": res.rounds + 1, "scale": plan.scale, "objective_s": plan.objective_s,
                 "unplaced": len(placement.unplaced), "formulation": "aggregate"}
        if placement.complete:
            bound = res.plan.stats.scale_bound
            exact = plan.status == "optimal"
            stats = plan.stats.updated(scale_bound=plan.scale if exact else bound,
                                       scale_gap=0.0 if exact else (bound / plan.scale - 1
                                                                    if bound is not None
                                                                    else None))
            return PlacedPlan(plan=replace(plan, stats=stats), placement=placement,
                              rounds=res.rounds + 1, history=(*res.history, entry),
                              quality=quality(topology, placement, dem), reason=None,
                              exact=exact, formulation="aggregate")
        res = replace(res, history=(*res.history, entry), rounds=res.rounds + 1)
    if res.placed:
        return res
    return timed_out(deadline, "milp", res.rounds, res.history, "auto", False,
                     stats=res.plan.stats) if deadline.remaining() <= 0 else res


def placed_scale(problem: PlanningProblem, plan: Plan) -> float:
    """The largest factor of ``problem``'s targets that ``plan``'s allocation carries at
    ``max_utilisation`` (:func:`scepsy_opt.planning.plans.headroom`, the candidates' rule)."""
    return min(headroom(problem, plan.candidates).values())


def _placeable_scale(problem: PlanningProblem, topology: Topology, top: float,
                     history: tuple[Mapping[str, Any], ...], formulation: Formulation,
                     **kw: Any) -> PlacedPlan:
    """Max-throughput whose capacity optimum (scale ``top``) does not place: bisect the scale
    below ``top`` with min-latency placed plans of ``formulation`` (``auto``: its rule) until the
    bracket is within :data:`SCALE_REL`. A placed plan at scale ``s`` carries up to its
    :func:`placed_scale` ``≥ s``, which moves the lower end; the answer is priced at that scale.
    ``exact`` is False (a bracket, not an optimum), and so is the plan's status: ``time_limit``
    when the time limit cut the search short, ``heuristic`` otherwise; a step that failed
    without proof (status other than ``infeasible``) is named in the history."""
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
            return timed_out(deadline, "milp", rounds, tuple(steps), formulation, False)
        return PlacedPlan(plan=replace(last, scale=0.0, allocation=None), placement=None,
                          rounds=rounds,
                          history=tuple(steps), quality=None,
                          reason="no scale of the targets could be placed", exact=False,
                          formulation=formulation, status="unplaced")
    scale, res = best
    at = base.scaled(scale)
    assert res.plan.allocation is not None
    # a bracket, not a proven optimum: cut short by the time limit, or closed by probes that
    # may have failed without a proof (the min-latency step's own status says nothing here)
    status: Status = "time_limit" if search.stopped or deadline.remaining() <= 0 else "heuristic"
    plan = plan_from_choice(at, res.plan.optimiser, status, price(at, res.plan.allocation),
                            res.plan.stats, scale=scale)
    # re-priced at the scale found: the min-latency bound of the step no longer applies
    return replace(res, plan=plan, rounds=rounds, history=tuple(steps), exact=False, bound_s=None)
