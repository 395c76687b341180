"""The optimiser registry: every optimiser by name (``--optimiser`` of ``scepsy plan``).

Each entry builds an object with a ``name`` and a ``solve(problem) -> Plan`` method
(:class:`scepsy_opt.planning.plans.Optimiser`): the exact MILP (:mod:`scepsy_opt.planning.milp`) and the baselines
and oracle (:mod:`scepsy_opt.planning.baselines`). The registry imports the optimisers; they do not know
of it.

Percentile bounds (``PlanOptions.latency_bounds``): the MILP enforces them; the baselines do not
know of them, so the registry checks their answers (:func:`bound_checked`): a plan whose
predicted percentile misses a bound becomes ``infeasible`` with the figures (the ``user``
optimiser, an evaluation, keeps its allocation and reports the miss), and every plan's
``stats["latency_bounds"]`` gives each bound, the predicted percentile and whether it is met.

Per-LLM SLOs (``PlanOptions.slos``, :mod:`scepsy_opt.prediction.slo`): the MILP's candidates meet them by
construction; every optimiser's answer is checked the same way (:func:`check_slos`) and a miss
makes the plan ``infeasible`` (``user`` keeps its allocation); ``stats["slos"]`` gives each
LLM's bounds, its predicted TTFT and TPOT, its predicted attainment and whether it is met.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from scepsy_common.registry import Registry
from scepsy_opt.planning.baselines import (
    BruteForce,
    EqualSplit,
    Hierarchical,
    Independent,
    MuxServeGreedy,
    UserAllocation,
)
from scepsy_opt.planning.candidates import price, slo_checks
from scepsy_opt.planning.milp import MILPOptimiser, percentile_latencies
from scepsy_opt.planning.mincost import solve_min_cost
from scepsy_opt.planning.plans import Infeasibility, Optimiser, Plan, no_allocation_plan
from scepsy_opt.planning.problem import OBJECTIVES, Deadline, PlanningProblem
from scepsy_opt.planning.solvestats import SolveStats


class ExactOptimiser(MILPOptimiser):
    """The exact MILP for every objective: min-latency and max-throughput
    (:mod:`scepsy_opt.planning.milp`), min-cost (:mod:`scepsy_opt.planning.mincost`)."""

    def solve(self, problem: PlanningProblem, *, deadline: Deadline | None = None) -> Plan:
        """The plan within ``deadline`` (default: the problem's time limit from now)."""
        if problem.options.kind.priced:
            return solve_min_cost(problem, deadline=Deadline.of(problem, deadline))
        return super().solve(problem, deadline=deadline)


def check_latency_bounds(problem: PlanningProblem, plan: Plan, *, keep: bool = False) -> Plan:
    """``plan`` with its percentile bounds checked (module docstring); ``keep``: report a miss
    without dropping the allocation."""
    bounds = {w: b for w, b in problem.options.latency_bounds.items() if w in problem.targets}
    if not bounds or plan.allocation is None:
        return plan
    at = problem.scaled(plan.scale) if plan.scale != 1.0 else problem
    got = percentile_latencies(at, price(at, plan.allocation))
    report = {w: {"percentile": q, "bound_s": b, "predicted_s": got[w],
                  "met": got[w] <= b * (1.0 + 1e-9)} for w, (q, b) in bounds.items()}
    met = all(r["met"] for r in report.values())
    stats = dict(plan.stats, latency_bounds=report, latency_bounds_verified=met)
    if met or keep:
        return replace(plan, stats=SolveStats.of(stats))
    miss = ", ".join(f"{w} p{q:g} {got[w]:.4g} s > {b:g} s" for w, (q, b) in bounds.items()
                     if not report[w]["met"])
    info = Infeasibility("latency", f"{plan.optimiser} found no allocation within the percentile "
                         f"bounds (its answer predicts {miss})", 0.0,
                         {w: 0.0 for w in problem.targets}, None, ())
    return no_allocation_plan(optimiser=plan.optimiser, status="infeasible", candidates={},
                              stats=MappingProxyType(stats), infeasible=info, scale=0.0)


def check_slos(problem: PlanningProblem, plan: Plan, *, keep: bool = False) -> Plan:
    """``plan`` with its LLMs' SLOs checked at its scale (module docstring); ``keep``: report
    a miss without dropping the allocation."""
    if not problem.options.slos or plan.allocation is None:
        return plan
    at = problem.scaled(plan.scale) if plan.scale != 1.0 else problem
    checks = slo_checks(at, plan.allocation)
    stats = dict(plan.stats, slos={m: c.to_dict() for m, c in checks.items()})
    missed = {m: c for m, c in checks.items() if not c.met}
    if not missed or keep:
        return replace(plan, stats=SolveStats.of(stats))
    miss = "; ".join(f"{m}: {c.slo.describe()}, predicted ttft {c.ttft_s:.4g} s, tpot "
                     f"{c.tpot_s:.4g} s" for m, c in missed.items())
    info = Infeasibility("latency", f"{plan.optimiser} found no allocation within the LLMs' SLOs "
                         f"(its answer misses {miss})", 0.0,
                         {w: 0.0 for w in problem.targets}, None, ())
    return no_allocation_plan(optimiser=plan.optimiser, status="infeasible", candidates={},
                              stats=MappingProxyType(stats), infeasible=info, scale=0.0)


def bound_checked(cls: type, *, keep: bool = False, percentiles: bool = True) -> type:
    """A subclass of the optimiser class ``cls`` whose plans are checked against the LLMs'
    SLOs (:func:`check_slos`) and, with ``percentiles``, the percentile bounds
    (:func:`check_latency_bounds`); instances are still instances of ``cls``."""

    class Checked(cls):
        def solve(self, problem: PlanningProblem, **kwargs: Any) -> Plan:
            plan = super().solve(problem, **kwargs)
            if percentiles:
                plan = check_latency_bounds(problem, plan, keep=keep)
            return check_slos(problem, plan, keep=keep)

    Checked.__name__ = Checked.__qualname__ = cls.__name__
    Checked.__doc__ = cls.__doc__
    return Checked


OPTIMISERS: Registry[Callable[[], Optimiser]] = Registry("optimiser", source="plan",
                                                      field="optimiser")
"""Every optimiser by name (:class:`~scepsy_common.registry.Registry`); each supports every
objective of :data:`~scepsy_opt.planning.problem.OBJECTIVES` (the baselines price their allocations as
the MILP does, so their objective compares with its)."""
for _name, _cls, _summary in (
        ("milp", bound_checked(ExactOptimiser, percentiles=False),  # enforces the bounds itself
         "the exact MILP"),
        ("brute-force", bound_checked(BruteForce), "the exact oracle: exhaustive search with pruning"),
        ("heuristic", bound_checked(Hierarchical), "the paper's hierarchical heuristic search"),
        ("muxserve", bound_checked(MuxServeGreedy), "MuxServe's greedy co-location with MPS shares"),
        ("independent", bound_checked(Independent), "every LLM sized alone within its slice of the budget"),
        ("equal-split", bound_checked(EqualSplit), "every LLM an equal slice of every GPU type"),
        ("user", bound_checked(UserAllocation, keep=True), "evaluates the current allocation as it is")):
    OPTIMISERS.register(_name, _cls, summary=_summary, supports={"objective": OBJECTIVES})


def optimiser(name: str) -> Optimiser:
    """The registered optimiser called ``name``."""
    return OPTIMISERS.require(name)()
