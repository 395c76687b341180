"""A plan's solve statistics: one typed model of every figure an optimiser or formulation
reports (how many candidates, columns, iterations, each bound and cost, the timings).

:class:`SolveStats` is frozen and closed: a formulation that reports a figure not declared
here fails at once (a programming error, not a user's), so the ``solver`` section of plan.json,
which is these statistics beside the plan's objective, bound and limits
(``scepsy_serve.launch.planfile.SolverSection`` derives from this model), is defined in one
place. Each figure is a field; the figures a plan has are the fields set, and reading them as
a mapping (``stats.get("columns")``, ``dict(stats)``) gives only those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

Num = float | int
Count = int
Stat = float | int | bool | str | list[Any] | dict[str, Any] | None
"""A statistic whose shape differs by formulation (``gpus_used``: a count, or per GPU type
for a mixed plan)."""

TIMING_KEYS = ("candidates_s", "build_s", "solve_s", "total_s")
"""The wall-clock figures (plan.json's ``timings`` section, left out by ``--no-timings``)."""


class SolveFigures(BaseModel):
    """Every figure a solve reports beside its timings (plan.json's ``solver`` section holds
    these); read as a mapping, the figures set."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    solver: str | None = None
    """the MILP solver and its version (``HiGHS 1.x.y``)"""
    arrivals: dict[str, Any] | None = None
    """the peak window the targets came from (recorded arrivals)"""
    slos: dict[str, Any] | None = None
    """per LLM: its SLO, the predicted TTFT and TPOT and whether it is met (docs/slo.md)"""
    latency_bounds: dict[str, Any] | None = None
    """per workflow: the percentile bound, the predicted percentile and whether it is met"""
    latency_bounds_verified: bool | None = None
    latency_bounds_optimal: bool | None = None
    latency_bounds_proven_infeasible: bool | None = None
    latency_bound_solves: Count | None = None
    # candidate generation (every formulation)
    candidates: Count | None = None
    candidates_generated: Count | None = None
    candidates_kept: Count | None = None
    candidates_unplaceable: Count | None = None
    serving_curves: Count | None = None
    variables: Count | None = None
    diagnosis: Stat = None
    # the scale of the targets carried (max-throughput)
    scale_bound: Num | None = None
    scale_gap: Num | None = None
    # min-cost (docs/min-cost.md)
    cost_per_hour: Num | None = None
    cost_bound_per_hour: Num | None = None
    cost_gap: Num | None = None
    placed_cost_per_hour: Num | None = None
    placed_cost_gap: Num | None = None
    placed_costs_per_hour: dict[str, Any] | None = None
    placed_gpus: dict[str, Any] | None = None
    prices_per_hour: dict[str, Any] | None = None
    nodes_to_buy: dict[str, Any] | None = None
    open_caps: Stat = None
    highs_status: Stat = None
    solves: Count | None = None
    aggregate_bound_per_hour: Num | None = None
    whole_gpus_bound_per_hour: Num | None = None
    slices: Count | None = None
    splits: dict[str, Any] | None = None
    lengths: dict[str, Any] | None = None  # length-routed LLMs: their groups' token ranges
    length_routing: dict[str, Any] | None = None  # prices by weight and with length routing
    reason: Stat = None
    gpus_used: Stat = None
    # the pattern formulation (docs/patterns.md)
    gap: Num | None = None
    """the pattern formulation's proven gap over every placeable plan (the solver section
    reports it as the plan's gap)"""
    objective: Num | None = None
    aggregate_bound: Num | None = None
    aggregate_placed: Num | None = None
    blocks_start: Num | None = None
    cg_bound: Num | None = None
    lp_bound: Num | None = None
    root_lp: Num | None = None
    root_s: Num | None = None
    root_columns: Count | None = None
    root_iterations: Count | None = None
    columns: Count | None = None
    iterations: Count | None = None
    converged: bool | None = None
    dive: Num | None = None
    mip: Num | None = None
    recombined: Num | None = None
    domain_types: Count | None = None
    shapes: Count | None = None
    fallback: Stat = None
    # slot groups
    parts: Count | None = None
    fallback_parts: Count | None = None
    probes: Count | None = None
    reused: Count | None = None
    probes_cut: Count | None = None
    """feasibility probes cut short by their time (neither a solution nor a proof)"""
    probes_infeasible: Count | None = None
    """feasibility probes proven to have no solution"""
    solved_parts: Count | None = None
    """parts with a solution when the search ended without one for every part"""
    # the baselines
    profile_alpha: Num | None = None
    demand_order: list[Any] | None = None
    baseline_failed: Stat = None
    gpu_memory_used: dict[str, Any] | None = None
    nodes: Stat = None
    def without(self, *keys: str) -> dict[str, Any]:
        """The figures set, less ``keys``, as a plain mapping."""
        return {k: v for k, v in self.items() if k not in keys}

    # reading the figures set as a mapping
    def keys(self) -> list[str]:
        return [k for k in type(self).model_fields if k in self.model_fields_set]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self.model_fields_set else default

    def __getitem__(self, key: str) -> Any:
        if key not in self.model_fields_set:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self.model_fields_set

    def __len__(self) -> int:
        return len(self.model_fields_set)


class SolveStats(SolveFigures):
    """The statistics of one solve (module docstring): its figures and its wall-clock
    seconds (plan.json's ``timings`` section)."""

    candidates_s: Num | None = None
    build_s: Num | None = None
    solve_s: Num | None = None
    total_s: Num | None = None

    @classmethod
    def of(cls, stats: Mapping[str, Any] | SolveStats | None = None, **more: Any) -> SolveStats:
        """The statistics ``stats`` (and ``more``) name; a figure this model does not declare,
        or of the wrong type, is a ValueError naming it."""
        if isinstance(stats, SolveStats) and not more:
            return stats
        return cls.model_validate({**dict(stats or {}), **more})

    def updated(self, **more: Any) -> SolveStats:
        """These statistics with ``more`` set (validated)."""
        return SolveStats.of(self, **more) if more else self
