"""Plans: an optimiser's answer (allocation, predicted figures, status) and the optimiser protocol."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

from scepsy_opt.allocation import Allocation
from scepsy_opt.planning.candidates import Candidate
from scepsy_opt.planning.problem import PlanningProblem
from scepsy_opt.planning.solvestats import SolveStats
from scepsy_opt.prediction.pipeline import carried_scale, predict

# optimal: proven optimal; time_limit: the time limit ended the search with an allocation (its
# gap says how far from proven); time_limit_no_solution: it ran out before any allocation was
# found (nothing is known about feasibility); infeasible: no allocation meets the targets;
# unplaced: an allocation was found but no placement of it (nor of any other tried) on the
# concrete GPUs was (scepsy_place.formulations.loop)
Status = Literal["optimal", "time_limit", "time_limit_no_solution", "infeasible", "unplaced",
                 "heuristic", "evaluated"]


Reason = Literal["optimal", "feasible", "infeasible", "no_solution", "unplaced"]
"""Why a search ended (as OR-Tools math_opt's termination reasons): ``optimal``: proven
optimal (within the gap limit); ``feasible``: an allocation without a proof of optimality (a
limit stopped the search, or the optimiser does not prove: heuristics, an evaluated
allocation); ``infeasible``: proven that no allocation meets the targets; ``no_solution``: a
limit stopped the search before any allocation was found (nothing is known about
feasibility); ``unplaced``: allocations were found but none placed on the concrete GPUs."""

Limit = Literal["time", "gap"]
"""The limit that ended a search: the plan's time limit, or the relative gap limit
(``gap_rel``) reached before a proof of zero gap."""


@dataclass(frozen=True)
class Termination:
    """How a search ended: its :data:`Reason`, the :data:`Limit` that ended it (None: it ran to
    its end) and, where one is known, a sentence saying why."""

    reason: Reason
    limit: Limit | None = None
    detail: str = ""

    @property
    def proven(self) -> bool:
        """Whether the answer is proven: optimal within the gap limit, or infeasible."""
        return self.reason in ("optimal", "infeasible")


def termination(status: str, gap: float | None, detail: str | None = None) -> Termination:
    """The :class:`Termination` of a plan's ``status`` (:data:`Status`, or plan.json's) and
    its proven relative ``gap``: the one definition every result and report uses."""
    text = detail or ""
    if status == "optimal":
        stopped_at_gap = gap is not None and math.isfinite(gap) and gap > 0
        return Termination("optimal", "gap" if stopped_at_gap else None, text)
    if status == "time_limit":
        return Termination("feasible", "time", text)
    if status == "time_limit_no_solution":
        return Termination("no_solution", "time", text)
    if status in ("infeasible", "unplaced"):
        return Termination(status, None, text)  # type: ignore[arg-type]
    if status in ("heuristic", "evaluated"):
        return Termination("feasible", None, text)
    raise ValueError(f"no termination for plan status {status!r}")


@dataclass(frozen=True)
class Infeasibility:
    """Why no allocation meets the targets, and how far the cluster gets."""

    reason: Literal["memory", "gpus", "latency"]
    detail: str
    max_scale: float  # the largest fraction of the targets the cluster carries
    max_throughput: Mapping[str, float]  # per workflow, req/s
    bottleneck: str | None  # the LLM that bounds it
    # the GPU types whose extra capacity raises max_scale (or the unfit LLMs); milp.scale_gains
    binding: tuple[str, ...]
    # per GPU type, how much one more GPU of it raises max_scale (fraction of the targets)
    gain_per_gpu: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, kw_only=True)
class Plan:
    """An optimiser's answer: the allocation, its predicted figures and how it was found."""

    optimiser: str
    status: Status
    allocation: Allocation | None
    objective_s: float  # weighted sum of predicted mean workflow latencies (+ change penalties)
    bound_s: float  # best proven lower bound on the objective (= objective when optimal)
    gap: float
    candidates: Mapping[str, Candidate]
    stats: SolveStats
    infeasible: Infeasibility | None = None
    scale: float = 1.0  # max-throughput mode: the fraction of the targets reached

    def __post_init__(self) -> None:
        if not isinstance(self.stats, SolveStats):  # a mapping of figures: checked here
            object.__setattr__(self, "stats", SolveStats.of(self.stats))

    @property
    def feasible(self) -> bool:
        return self.allocation is not None

    @property
    def termination(self) -> Termination:
        """How the search for this plan ended (:func:`termination` of its status and gap)."""
        return termination(self.status, self.gap,
                           self.infeasible.detail if self.infeasible is not None else None)


class Optimiser(Protocol):
    """Anything that turns a :class:`PlanningProblem` into a :class:`Plan`."""

    name: str

    def solve(self, problem: PlanningProblem) -> Plan: ...


def no_allocation_plan(*, optimiser: str, status: Status, stats: Mapping[str, Any] | SolveStats,
                       candidates: Mapping[str, Candidate] | None = None,
                       infeasible: Infeasibility | None = None, scale: float = 1.0) -> Plan:
    """A plan without an allocation (infeasible, or no solution in time): no objective, bound
    or gap (infinite), with the ``stats``, the diagnosis and the scale of the targets
    reached."""
    return Plan(optimiser=optimiser, status=status, allocation=None, objective_s=math.inf,
                bound_s=math.inf, gap=math.inf, candidates={} if candidates is None else candidates,
                stats=SolveStats.of(stats), infeasible=infeasible, scale=scale)


def time_limit_plan(name: str, stats: Mapping[str, Any] | SolveStats | None = None) -> Plan:
    """The plan of a run whose time limit ran out before any allocation was found: no
    allocation, no diagnosis, and no scale of the targets reached (0)."""
    return no_allocation_plan(optimiser=name, status="time_limit_no_solution", candidates={},
                              stats=SolveStats.of(stats), infeasible=None, scale=0.0)


def plan_from_choice(problem: PlanningProblem, name: str, status: Status,
                     choice: Mapping[str, Candidate], stats: Mapping[str, Any] | SolveStats,
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
    return Plan(optimiser=name, status=status, allocation=alloc, objective_s=obj, bound_s=bound,
                gap=gap, candidates=MappingProxyType(dict(sorted(choice.items()))),
                stats=SolveStats.of(stats), infeasible=None, scale=scale)


def headroom(problem: PlanningProblem, choice: Mapping[str, Candidate]) -> dict[str, float]:
    """Per LLM of ``choice``, the largest factor of the targets its replicas carry at
    ``max_utilisation`` (:func:`scepsy_opt.prediction.pipeline.carried_scale` of its load,
    :attr:`PlanningProblem.loads`): the least of them is how far the choice carries the targets."""
    u = problem.options.max_utilisation
    return {m: carried_scale(problem.loads[m], c.mu, c.replicas, u) for m, c in choice.items()}


def saturated_plan(problem: PlanningProblem, name: str, choice: Mapping[str, Candidate],
                   stats: Mapping[str, Any] | SolveStats) -> Plan:
    """The infeasible plan of a choice whose replicas do not all carry their LLM's load: its
    ``max_scale`` is the fraction of the targets the choice carries at ``max_utilisation``
    (:func:`scepsy_opt.prediction.pipeline.carried_scale` of each LLM's :func:`~scepsy_opt.prediction.pipeline.llm_load`)."""
    u = problem.options.max_utilisation
    heads = headroom(problem, choice)
    bottleneck = min(heads, key=lambda m: (heads[m], m))
    scale = heads[bottleneck]
    full = [m for m, c in sorted(choice.items()) if not math.isfinite(c.latency_s)]
    tput = {w: scale * t for w, t in problem.targets.items()}
    info = Infeasibility(
        "gpus", f"{', '.join(full)} saturated: the allocation carries at most {scale:.4g}x the "
        f"targets at utilisation {u:g} ({', '.join(f'{w} {v:.4g} req/s' for w, v in tput.items())}), "
        f"bounded by {bottleneck}", scale, tput, bottleneck, ())
    return no_allocation_plan(optimiser=name, status="infeasible",
                              candidates=MappingProxyType(dict(sorted(choice.items()))),
                              stats=SolveStats.of(stats),
                              infeasible=info, scale=scale)


def workflow_latencies(problem: PlanningProblem, plan: Plan) -> dict[str, float]:
    """Predicted mean latency per targeted workflow (the predictor's critical-path form)."""
    if plan.allocation is None:
        return {}
    pred = predict(problem.stats, problem.models, plan.allocation, problem.latency,
                   dict(problem.targets), catalog=problem.catalog, policy=problem.policy)
    return {w: p.mean_latency_s for w, p in pred.workflows.items()}
