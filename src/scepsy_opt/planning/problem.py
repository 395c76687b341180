"""A planning problem: workflows, their target throughputs, a cluster and a latency model.

A :class:`PlanningProblem` is workflows (their statistics and LLM -> catalog model map), a
target throughput per workflow (req/s), a :class:`~scepsy_opt.cluster.Cluster` and a latency
model, with the :class:`PlanOptions` of candidate generation and the solvers. A plan's time
limit is a :class:`Deadline` on the monotonic clock that every step of the plan shares.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from scepsy_common.errors import InputError
from scepsy_common.units import UNITS
from scepsy_opt.allocation import Allocation
from scepsy_opt.cluster import Cluster
from scepsy_opt.planning.objectives import OBJECTIVES, ObjectiveKind, objective
from scepsy_opt.planning.objectives import Name as Objective
from scepsy_opt.prediction.pipeline import LLMDemand, llm_demands, llm_load
from scepsy_opt.prediction.slo import CallSLO
from scepsy_opt.stats import WorkflowStats
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.latency import LatencyModel
from scepsy_profile.serving import MemoryPolicy

TENTHS = tuple(round(0.1 * i, 1) for i in range(1, 11))


@dataclass(frozen=True)
class PlanOptions:
    """Knobs of candidate generation and of the solvers (defaults documented in docs/optimiser.md)."""

    shares: tuple[float, ...] = TENTHS
    # per (model, gpu, tp), only the shares of the grid within the latency model's measured
    # range (scepsy_profile.measured_shares; an analytical model's: every share): no plan then
    # rests on a latency extrapolated below (or above) the profiled shares (scepsy_opt.planning.coverage)
    shares_within_profile: bool = False
    # the grid of memory fractions per GPU (a second resource beside the compute share); None:
    # memory tied to the compute share (an instance gets that share of each GPU's memory)
    memory_shares: tuple[float, ...] | None = None
    tps: tuple[int, ...] = (1, 2, 4, 8)
    max_utilisation: float = 0.95
    weights: Mapping[str, float] = field(default_factory=dict)  # per workflow, default 1
    objective: Objective = "min-latency"
    # per workflow: a bound on its predicted mean latency (s); max-throughput and min-cost
    latency_bound_s: Mapping[str, float] = field(default_factory=dict)
    # per workflow: (percentile in (0, 100), seconds): the predicted request-latency percentile
    # (scepsy_opt.prediction.tails) must not exceed the seconds; both objectives (docs/optimiser.md)
    latency_bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # per LLM: bounds on its calls' TTFT (mean or percentile) and mean TPOT (scepsy_opt.prediction.slo):
    # every candidate meets them at its rate per replica; every objective (docs/slo.md)
    slos: Mapping[str, CallSLO] = field(default_factory=dict)
    current: Allocation | None = None
    change_penalty_s: float = 0.0
    prune_rel: float = 1e-9
    # wall-clock limit of one whole plan (candidates, reduction, every solver call, bisection,
    # optimise-place rounds): a :class:`Deadline` started when the plan starts
    time_limit_s: float = 60.0
    gap_rel: float = 0.0
    max_replicas: int = 100_000
    # Lagrangian reduced-cost fixing before the MILP (exact); None: on from 64 GPUs, where the
    # candidate sets grow large, off below, where one generation pass is cheaper than two
    reduce: bool | None = None
    # min-cost, LLMs split over GPU types: also offer routing each split LLM's calls by prompt
    # length (each group a range of input tokens, cut at quantiles into ``length_buckets``
    # buckets), taken only where it lowers the price (docs/min-cost.md)
    length_routing: bool = False
    length_buckets: int = 4

    def __post_init__(self) -> None:
        src = "plan options"
        if not isinstance(self.length_routing, bool):
            raise InputError(src, "length_routing", "true or false", self.length_routing)
        if (not isinstance(self.length_buckets, int) or isinstance(self.length_buckets, bool)
                or not 2 <= self.length_buckets <= 16):
            raise InputError(src, "length_buckets", "an integer from 2 to 16",
                             self.length_buckets)
        if not self.shares or any(not (0 < s <= 1) or abs(s * UNITS - round(s * UNITS)) > 1e-9
                                  for s in self.shares):
            raise InputError(src, "shares", "GPU shares in (0, 1], multiples of 0.001", self.shares)
        if not isinstance(self.shares_within_profile, bool):
            raise InputError(src, "shares_within_profile", "true or false",
                             self.shares_within_profile)
        if self.memory_shares is not None and (not self.memory_shares or any(
                not (0 < s <= 1) or abs(s * UNITS - round(s * UNITS)) > 1e-9
                for s in self.memory_shares)):
            raise InputError(src, "memory_shares", "fractions of GPU memory in (0, 1], "
                             "multiples of 0.001", self.memory_shares)
        if not self.tps or any(not (isinstance(t, int) and t >= 1) for t in self.tps):
            raise InputError(src, "tps", "TP degrees, integers >= 1", self.tps)
        if not 0 < self.max_utilisation < 1:
            raise InputError(src, "max_utilisation", "a fraction in (0, 1)", self.max_utilisation)
        if self.objective not in OBJECTIVES:
            raise InputError(src, "objective", f"one of {list(OBJECTIVES)}", self.objective)
        for w, x in self.weights.items():
            if not (math.isfinite(x) and x >= 0):
                raise InputError(src, f"weights.{w}", "a weight >= 0", x)
        for w, x in self.latency_bound_s.items():
            if not (math.isfinite(x) and x > 0):
                raise InputError(src, f"latency_bound_s.{w}", "a latency bound > 0 s", x)
        bounds = {}
        for w, b in self.latency_bounds.items():
            field_ = f"latency_bounds.{w}"
            try:
                q, x = (float(v) for v in b)
            except (TypeError, ValueError):
                raise InputError(src, field_, "a pair (percentile, seconds)", b) from None
            if not (math.isfinite(q) and 0 < q < 100):
                raise InputError(src, field_, "a percentile in (0, 100)", q)
            if not (math.isfinite(x) and x > 0):
                raise InputError(src, field_, "a latency bound > 0 s", x)
            bounds[w] = (q, x)
        for m, slo in self.slos.items():
            if not isinstance(slo, CallSLO):
                raise InputError(src, f"slos.{m}", "a CallSLO (scepsy_opt.prediction.slo)", slo)
        if not (math.isfinite(self.change_penalty_s) and self.change_penalty_s >= 0):
            raise InputError(src, "change_penalty_s", "a penalty >= 0 s per changed replica",
                             self.change_penalty_s)
        if not 0 <= self.prune_rel < 1e-3:
            raise InputError(src, "prune_rel", "a tolerance in [0, 1e-3)", self.prune_rel)
        if not self.time_limit_s > 0:
            raise InputError(src, "time_limit_s", "a time limit > 0 s", self.time_limit_s)
        if not 0 <= self.gap_rel < 1:
            raise InputError(src, "gap_rel", "a relative gap in [0, 1)", self.gap_rel)
        object.__setattr__(self, "shares", tuple(sorted(set(self.shares))))
        object.__setattr__(self, "tps", tuple(sorted(set(self.tps))))
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        object.__setattr__(self, "latency_bound_s", MappingProxyType(dict(self.latency_bound_s)))
        object.__setattr__(self, "latency_bounds", MappingProxyType(dict(sorted(bounds.items()))))
        object.__setattr__(self, "slos", MappingProxyType(dict(sorted(self.slos.items()))))

    @property
    def kind(self) -> ObjectiveKind:
        """The objective's strategy (:mod:`scepsy_opt.planning.objectives`)."""
        return objective(self.objective)


class TimeLimitReached(Exception):
    """The plan's :class:`Deadline` passed: no allocation can be returned from this point on.

    Raised by the steps that take time (candidate generation, reduced-cost fixing, solver calls);
    the optimiser's entry points turn it into a plan of status ``time_limit_no_solution``
    (:func:`time_limit_plan`)."""


@dataclass(frozen=True)
class Deadline:
    """The time limit of one whole plan (``PlanOptions.time_limit_s``) as a point on the
    monotonic clock: every step of the plan gets what remains of it."""

    at: float  # time.monotonic() seconds
    limit_s: float  # the limit it was started with

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """A deadline ``seconds`` from now."""
        return cls(time.monotonic() + seconds, seconds)

    @classmethod
    def of(cls, problem: PlanningProblem, deadline: Deadline | None = None) -> Deadline:
        """``deadline``, or a new one for ``problem``'s time limit (a plan's entry point)."""
        return deadline if deadline is not None else cls.after(problem.options.time_limit_s)

    def remaining(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self.at - time.monotonic())

    def within(self, seconds: float) -> Deadline:
        """A deadline ``seconds`` from now, never past this one (a step's share of the time;
        the limit it names is still this one's)."""
        return Deadline(min(self.at, time.monotonic() + max(0.0, seconds)), self.limit_s)

    def check(self) -> None:
        """Raise :class:`TimeLimitReached` once the deadline has passed."""
        if time.monotonic() >= self.at:
            raise TimeLimitReached(time_limit_detail(self.limit_s))


@dataclass(frozen=True)
class PlanningProblem:
    """Workflows, their target throughputs (req/s), a cluster and a latency model."""

    stats: Mapping[str, WorkflowStats]
    models: Mapping[str, str]
    targets: Mapping[str, float]
    cluster: Cluster
    latency: LatencyModel
    options: PlanOptions = PlanOptions()
    catalog: Catalog | None = None
    policy: MemoryPolicy | None = None

    def __post_init__(self) -> None:
        if not self.targets:
            raise InputError("plan", "targets", "a target throughput for at least one workflow")
        for w, t in self.targets.items():
            if w not in self.stats:
                raise InputError("plan", f"targets.{w}",
                                 f"a workflow of the problem ({', '.join(sorted(self.stats))})", w)
            if not (isinstance(t, int | float) and math.isfinite(t) and t > 0):
                raise InputError("plan", f"targets.{w}", "a throughput > 0 req/s", t)
        if self.cluster.total_gpus < 1 and not self.cluster.open:
            raise InputError("plan", "cluster", "a cluster with at least one GPU")
        if self.cluster.unbounded and not self.options.kind.priced:
            raise InputError("plan", "cluster", "pools of a known size (nodes: auto without "
                             "max_nodes needs the min-cost objective)",
                             ", ".join(self.cluster.unbounded))
        cat = self.catalog or default_catalog()
        for m in self.llms:
            if m not in self.models:
                raise InputError("plan", f"llms.{m}", "the catalog model this LLM runs")
            cat.model(self.models[m])
        cur = self.options.current
        # the file it came from (a plan.json or allocation YAML, scepsy plan --current)
        cur_src = ("current allocation" if cur is None or cur.source == "allocation" else
                   f"{cur.source} (--current)")
        if cur is not None and cur.splits:
            raise InputError(cur_src, f"splits.{next(iter(cur.splits))}",
                             "an allocation whose LLMs each run on one GPU type (re-planning a "
                             "plan that splits an LLM over GPU types is not supported: plan "
                             "again with scepsy plan)")
        if cur is not None:
            for m in cur.llms:
                if m not in self.llms:
                    raise InputError(cur_src, f"llms.{m}", f"an LLM of the workflows planned "
                                     f"({', '.join(self.llms)}): the current allocation must "
                                     "be one of these workflows' (their plan.json or "
                                     "allocation)", m)
        for w in self.options.weights:
            if w not in self.targets:
                raise InputError("plan options", f"weights.{w}", "a workflow with a target", w)
        for w in self.options.latency_bounds:
            if w not in self.targets:
                raise InputError("plan options", f"latency_bounds.{w}",
                                 f"a workflow with a target ({', '.join(sorted(self.targets))})", w)
        for m in self.options.slos:
            if m not in self.llms:
                raise InputError("plan options", f"slos.{m}",
                                 f"an LLM the targeted workflows call ({', '.join(self.llms)})", m)
        object.__setattr__(self, "targets", MappingProxyType(dict(sorted(self.targets.items()))))

    @property
    def llms(self) -> list[str]:
        """The LLMs the targeted workflows call, sorted."""
        return sorted({m for w in self.targets for m in self.stats[w].llms})

    @cached_property
    def demands(self) -> Mapping[str, LLMDemand]:
        """Per LLM, what the targets ask of it (:func:`scepsy_opt.prediction.pipeline.llm_demand`), computed
        once per problem (the targets are fixed; :meth:`scaled` makes a new problem)."""
        return MappingProxyType(llm_demands(self.stats, self.models, self.targets, self.llms))

    @cached_property
    def loads(self) -> Mapping[str, float]:
        """Per LLM, its load at the targets (calls/s, :func:`scepsy_opt.prediction.pipeline.llm_load`): the
        capacity its replicas must carry."""
        return MappingProxyType({m: llm_load(d) for m, d in self.demands.items()})

    def weight(self, workflow: str) -> float:
        return float(self.options.weights.get(workflow, 1.0))

    def scaled(self, factor: float) -> PlanningProblem:
        """The same problem with every target multiplied by ``factor``."""
        return PlanningProblem(self.stats, self.models, {w: t * factor for w, t in self.targets.items()},
                               self.cluster, self.latency, self.options, self.catalog, self.policy)

    @property
    def constant_s(self) -> float:
        """The part of the objective no allocation changes: weighted tool time on the path."""
        return sum(self.weight(w) * self.stats[w].tool_critical_s for w in self.targets)


def time_limit_detail(limit_s: float) -> str:
    """What a ``time_limit_no_solution`` plan says (the CLI's message)."""
    return (f"the time limit of {limit_s:g} s ran out before any allocation was found "
            "(a longer time limit may find one; nothing is known about feasibility)")
