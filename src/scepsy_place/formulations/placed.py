"""A placed plan: a plan, its placement, how the formulation that found it ended, and its
proven bound (:class:`PlacedPlan`); and the blocks formulation (:func:`plan_blocks`), which the
other formulations (:mod:`scepsy_place.formulations.loop`, :mod:`scepsy_place.formulations.patterns`) start from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from scepsy_opt.planning.milp import solve_min_latency
from scepsy_opt.planning.plans import (
    Plan,
    Termination,
    no_allocation_plan,
    termination,
    time_limit_plan,
)
from scepsy_opt.planning.problem import (
    Deadline,
    PlanningProblem,
    TimeLimitReached,
    time_limit_detail,
)
from scepsy_opt.planning.solvestats import SolveStats
from scepsy_place.formulations.blocks import (
    block_candidates,
    capacity_rows,
    fewest_block_gpus,
    level_capacity,
)
from scepsy_place.packing.placement import Placement, demands, place
from scepsy_place.packing.quality import quality
from scepsy_place.packing.topology import Topology

LoopStatus = Literal["placed", "infeasible", "unplaced", "stopped", "time_limit"]
# the plan.json status of a plan that was not placed, per loop status
PLAN_STATUS: Mapping[str, str] = MappingProxyType({
    "infeasible": "infeasible", "unplaced": "unplaced", "stopped": "unplaced",
    "time_limit": "time_limit_no_solution"})

@dataclass(frozen=True)
class Outcome:
    """How one formulation (or keeping the current allocation) ended: its status and, when it
    placed or stopped at a plan, that plan's objective (s); the proven lower bound it gives
    (:attr:`PlacedPlan.bound_s`, None without one) and its wall time (s, left out of
    comparisons)."""

    status: LoopStatus
    objective_s: float | None = None
    bound_s: float | None = None
    seconds: float | None = field(default=None, compare=False)

    def to_dict(self, timings: bool = True) -> dict[str, Any]:
        """plan.json's entry of ``compared`` (``seconds`` only with ``timings``)."""
        out: dict[str, Any] = {"status": self.status, "objective_s": self.objective_s,
                               "bound_s": self.bound_s}
        if timings and self.seconds is not None:
            out["seconds"] = self.seconds
        return out


@dataclass(frozen=True, kw_only=True)
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
    # a proven lower bound on the objective of every placeable allocation of the formulation's
    # candidates (None: none proven; module docstring, "Bounds")
    bound_s: float | None = None
    seconds: float | None = field(default=None, compare=False)  # wall time of the formulation
    # the nodes placed on when not the caller's (min-cost with open pools: the nodes bought)
    topology: Topology | None = field(default=None, compare=False)
    # the problem the plan answers when not the caller's: a plan with LLMs on several GPU types
    # answers the problem split into its replica groups (scepsy_opt.planning.mixing.split_problem)
    problem: PlanningProblem | None = field(default=None, compare=False)

    @property
    def placed(self) -> bool:
        return self.placement is not None and self.placement.complete

    @property
    def gap(self) -> float | None:
        """The proven relative gap of a placed plan, ``objective / bound_s - 1`` (≥ 0; None
        without a bound or a placed plan)."""
        if not self.placed or self.bound_s is None or not self.bound_s > 0:
            return None
        gap = self.plan.objective_s / self.bound_s - 1.0
        return 0.0 if gap < 1e-12 else gap  # float noise between a MILP's bound and our sum

    @property
    def termination(self) -> Termination:
        """How the plan handed on (:attr:`answer`) ended: its status, the proven gap over
        every placeable allocation where one is known, and why nothing was placed."""
        ans = self.answer
        gap = self.gap if self.bound_s is not None else ans.gap
        detail = self.reason or (ans.infeasible.detail if ans.infeasible is not None else None)
        return termination(ans.status, gap, detail)

    @property
    def outcome(self) -> Outcome:
        obj = self.plan.objective_s if self.status in ("placed", "stopped") else None
        return Outcome(self.status, obj, self.bound_s, self.seconds)

    @property
    def answer(self) -> Plan:
        """The plan handed on: the placed plan, or no allocation and a status that says why
        (``infeasible`` only when proven; ``unplaced``; ``time_limit_no_solution``)."""
        if self.placed:
            return self.plan
        return replace(self.plan, allocation=None,
                       status=PLAN_STATUS.get(self.status, "unplaced"))  # type: ignore[arg-type]

    def to_dict(self, policy: str | None = None, timings: bool = True) -> dict[str, Any]:
        """plan.json's ``placement`` section: replica rows only when every replica is placed;
        otherwise ``instances`` is empty and ``unplaced`` / ``reason`` say what did not fit
        (``policy``: the placer named when no placement was tried; ``timings``: each compared
        formulation's wall time)."""
        pl = self.placement
        return {
            "policy": pl.policy if pl is not None else policy,
            "placed_by": getattr(pl, "placed_by", None) if self.placed else None,
            "formulation": self.formulation, "status": self.status,
            "bound_s": self.bound_s, "gap": self.gap,
            "compared": {k: v.to_dict(timings) for k, v in self.compared.items()},
            "rounds": self.rounds, "placed": self.placed, "exact": self.exact,
            "cuts": dict(self.cuts), "history": [dict(h) for h in self.history],
            "quality": dict(self.quality) if self.quality and self.placed else None,
            "instances": pl.to_dict()["slots"] if pl is not None and self.placed else [],
            "unplaced": [list(u) for u in pl.unplaced] if pl is not None else [],
            "reason": self.reason}


def timed_out(deadline: Deadline, name: str, rounds: int, history: tuple[Mapping[str, Any], ...],
               formulation: str, exact: bool = True,
               stats: Mapping[str, Any] | SolveStats | None = None) -> PlacedPlan:
    """No placed plan: the time limit ran out first (status ``time_limit``); ``stats``: what
    the search found before (a proven bound on the scale, the parts solved, ...)."""
    return PlacedPlan(plan=time_limit_plan(name, stats), placement=None, rounds=rounds,
                      history=history,
                      quality=None,
                      reason=time_limit_detail(deadline.limit_s), exact=exact,
                      formulation=formulation,
                      status="time_limit")


def _no_blocks(plan: Plan, history: tuple[Mapping[str, Any], ...], why: str) -> PlacedPlan:
    """No block allocation, ``why`` (not proven infeasible: shared GPUs may hold one)."""
    return PlacedPlan(plan=plan, placement=None, rounds=1, history=history, quality=None,
                      reason=f"whole-GPU blocks of one LLM each {why} (not proven infeasible: "
                      "the aggregate and patterns formulations may find one)",
                      exact=True, formulation="blocks", status="unplaced")


def plan_blocks(problem: PlanningProblem, topology: Topology,
                deadline: Deadline | None = None) -> PlacedPlan:
    """The placeable-by-construction plan (:mod:`scepsy_place.formulations.blocks`), placed by ``blocks``."""
    deadline = Deadline.of(problem, deadline)
    try:
        fewest = fewest_block_gpus(problem, deadline)
        free = sum(level_capacity(topology, g, 1) for g in problem.cluster.budgets())
        if fewest is not None and sum(fewest.values()) > free:
            # the counting bound settles it before the candidates (seconds at 256 LLMs)
            return _no_blocks(
                no_allocation_plan(optimiser="milp", status="infeasible", candidates={},
                                   stats={}), (),
                f"need at least {sum(fewest.values())} GPUs, and {free} are wholly free")
        cset = block_candidates(problem, topology, deadline)
    except TimeLimitReached:
        return timed_out(deadline, "milp", 1, (), "blocks")
    plan = solve_min_latency(problem, cset, capacity_rows(topology, cset.by_llm),
                             deadline=deadline)
    if plan.status == "time_limit_no_solution":
        return timed_out(deadline, "milp", 1, (), "blocks")
    if plan.allocation is None:
        # proven only when an LLM fits no GPU at all (memory): whole-GPU blocks use more GPUs
        # than shares, so their lack of room proves nothing about shared allocations
        history = ({"round": 1, "objective_s": plan.objective_s, "unplaced": 0},)
        if plan.infeasible is not None and plan.infeasible.reason == "memory":
            # proven: an LLM fits no GPU at all, shared or not
            return PlacedPlan(plan=plan, placement=None, rounds=1, history=history,
                              quality=None, reason=plan.infeasible.detail, exact=True,
                              formulation="blocks", status="infeasible")
        return _no_blocks(plan, history, "fit no allocation on the free GPUs")
    dem = demands(plan.allocation, problem.catalog)
    placement = place(topology, dem, "blocks")
    history = ({"round": 1, "objective_s": plan.objective_s, "unplaced": len(placement.unplaced)},)
    if placement.complete:
        return PlacedPlan(plan=plan, placement=placement, rounds=1, history=history,
                          quality=quality(topology, placement, dem), reason=None,
                          exact=True, formulation="blocks")
    why = (f"{len(placement.unplaced)} block replica(s) did not fit: TP degrees that do not "
           "divide one another void the capacity rows' guarantee")
    return PlacedPlan(plan=plan, placement=placement, rounds=1, history=history, quality=None,
                      reason=why, exact=True, formulation="blocks", status="unplaced")


