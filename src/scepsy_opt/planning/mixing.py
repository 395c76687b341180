"""Mixed GPU types for one LLM: its load split over replicas on several GPU types.

Every other formulation runs all of an LLM's replicas on one shape. When two GPU types are
offered, the cheapest way to carry one LLM may take some of each (two L4 and two A10 rather
than five L4): the first type's whole GPUs carry most of the load and the rest goes where it is
cheapest to carry. This module plans that, as Mélange does for one model, within scepsy's
predictor and latency bounds.

**Portions.** An LLM's calls are routed to its replica groups at random, by weight: a group
that gets fraction ``f`` of the calls sees ``f`` of the LLM's call rate, and the LLM's mean
call latency is ``Σ_g f_g·ℓ_g`` (``ℓ_g`` the group's mean latency at its own rate). The
fractions are multiples of ``1/S`` (``slices``, default :data:`SLICES`). A *portion* is a
candidate (:mod:`scepsy_opt.planning.candidates`) of the problem scaled to ``j/S`` of its targets
(every call rate times ``j/S``), so it carries ``j/S`` of its LLM's load at
``max_utilisation`` and its latencies are those at that load. The MILP picks at most one
portion per LLM and GPU type::

    min Σ_t p_t·G_t    s.t.  Σ_{portions of m} j·y = S                 (every LLM's load)
                             Σ_{portions of m on t} y ≤ 1              (one group per type)
                             G_t = Σ_{portions on t} gpus_c·y ≤ the GPUs of type t
                             Σ (j/S)·ℓ_wc·y ≤ B_w − τ_w               (mean latency bounds)

``gpus_c`` (:func:`group_gpus`) counts the whole GPUs the group takes alone: its replicas of
share ``s`` pack ``⌊1/s⌋`` to a GPU, each on ``tp`` GPUs of one NVLink domain, their TP groups
free to overlap (:func:`scepsy_common.units.replica_gpus`, the fewest GPUs that hold them). The
plan is therefore placeable group by group, and its price is an upper bound on the least price
of these portions. Two lower bounds are reported: the same MILP with GPUs counted in aggregate
(``n_t ≥ Σ units/1000``, integer, as :mod:`scepsy_opt.planning.mincost` counts them), which holds for
any plan of these portions, co-located with other LLMs or not; and, with one LLM, the MILP's
own optimum (nothing else shares its GPUs, so the whole GPUs are exact for every plan that runs
it one shape per GPU type). ``cost_bound_per_hour`` is the larger. Ties in price are broken by
the weighted latency ``Σ (j/S)·cost_c·y`` (a second solve at the optimal price). Candidates are
pruned exactly for these counts (:func:`scepsy_opt.planning.mincost.prune_for_cost` with the whole GPUs
as a further count).

**Percentile bounds** (``PlanOptions.latency_bounds``) hold for every routing of the calls: a
split plan meets workflow ``w``'s bound ``(q, B)`` when the ``q``-th percentile of its request
latency (:mod:`scepsy_opt.prediction.tails`) is within ``B`` with every split LLM at the unit
latency of its *slowest* group. Whatever group each call reaches, each request takes at most
that long (the latency grows with every unit latency), so its percentile is an upper bound on
the percentile under any routing, the predictor's fraction-weighted one included
(``stats["latency_bounds"]`` reports both); with no LLM split it is the percentile itself. It
is planned as :mod:`scepsy_opt.planning.milp` plans percentile bounds, by lazy constraints on
variables ``v_wm ≥ u_wp·y_p`` (at least the slowest chosen group's unit latency): solve,
verify, and on a violation add a dominance no-good (one of the workflow's LLMs must drop every
group at least as slow as now), the floor cut on ``v`` (valid for every choice) and the
linearised percentile (steering only), then an exact check with the valid cuts alone and a
price below the verified choice's. **Per-LLM SLOs** hold group by group: a portion is a
candidate of the problem scaled to its share of the load, so it meets the LLM's SLO at its own
rate (:mod:`scepsy_opt.planning.candidates`); the calls of the LLM then meet it too (a mean is
the groups' fraction-weighted mean, and a percentile of a mixture of groups that each meet it
is within it).

**Length routing** (``PlanOptions.length_routing``, :func:`length_portions`): a group may
serve a run of the LLM's prompt-length buckets instead of a fraction of its calls; its
candidate is priced on the run's own calls (:func:`length_problem`) and counts in full. An LLM
is routed by weight or by length (a binary ``z_m``: by length, every bucket lies in exactly one
chosen run), and :func:`solve_mixed` takes length routing only where it lowers the price.
Under percentile bounds a run's unit latency counts in the LLM's units scaled by the ratio of
the mean calls (:func:`_to_llm_units`), which keeps the slowest-group rule an upper bound.

**Mélange's formulation** (:func:`melange_min_cost`; Griggs et al., "Mélange: Cost Efficient
Large Language Model Serving by Exploiting GPU Heterogeneity", 2024) is the same split by
request size instead of by fraction: request-size buckets of rate ``r_b``, each cut into
``slice_factor`` equal slices, every slice assigned to one GPU type whose profiled maximum
throughput for the bucket is ``T_gb`` (req/s per GPU at the SLO), and
``n_g ≥ Σ_{slices on g} (r_b/slice_factor)/T_gb`` integer GPUs per type at least cost. It is
implemented here as published, to compare with on Mélange's own example (docs/min-cost.md).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pulp

from scepsy_common.errors import InputError
from scepsy_common.units import UNITS, replica_gpus, replicas_per_gpu
from scepsy_opt.allocation import Allocation
from scepsy_opt.planning.candidates import Candidate, generate_candidates, price
from scepsy_opt.planning.milp import (
    EXACT_ITERS,
    LINEARISE_ITERS,
    _meets,
    _path_weight,
    _percentile_bounds,
    _solver,
    _status,
    choice_variables,
    unit_latency,
)
from scepsy_opt.planning.mincost import gpu_prices, prune_for_cost
from scepsy_opt.planning.plans import Plan, Status, plan_from_choice
from scepsy_opt.planning.problem import Deadline, PlanningProblem, TimeLimitReached
from scepsy_opt.planning.solver import SOLVER, pulp_highs
from scepsy_opt.prediction.tails import floor_cut, latency_quantiles, linearise
from scepsy_opt.stats import (
    RequestPaths,
    WorkflowStats,
    length_edges,
    length_split,
    split_stats,
)

SLICES = 8  # fractions of an LLM's load are multiples of 1/SLICES
COST_REL = 1e-9  # the tie-break solve: price within this (relative) of the optimum
CHEAPER_REL = 1e-7  # percentile bounds' exact check: a price this much (relative) lower


# -- Mélange's formulation ----------------------------------------------------------------------


@dataclass(frozen=True)
class MelangeAnswer:
    """Mélange's answer: GPUs per type, the price per hour, and each slice's GPU type."""

    status: str  # optimal | infeasible | time_limit | time_limit_no_solution
    gpus: Mapping[str, int]
    cost_per_hour: float
    assignment: tuple[str, ...]  # per slice (bucket-major, then slice), its GPU type


def melange_min_cost(rates: Sequence[float], tputs: Mapping[str, Sequence[float]],
                     prices: Mapping[str, float], slice_factor: int = 1, *,
                     time_limit_s: float = 60.0) -> MelangeAnswer:
    """Mélange's ILP (module docstring): ``rates[b]`` req/s of request-size bucket ``b``,
    ``tputs[g][b]`` the maximum req/s one GPU of type ``g`` serves of bucket ``b`` within the
    SLO (0: it cannot), ``prices[g]`` USD per GPU-hour, each bucket cut into ``slice_factor``
    slices. Solved by HiGHS (Mélange ships CBC; both prove the optimum)."""
    if slice_factor < 1:
        raise InputError("melange", "slice_factor", "an integer >= 1", slice_factor)
    gpus = sorted(tputs)
    for b, r in enumerate(rates):
        if not (math.isfinite(r) and r >= 0):
            raise InputError("melange", f"rates[{b}]", "a request rate >= 0 (req/s)", r)
    for g in gpus:
        if not all(math.isfinite(t) and t >= 0 for t in tputs[g]):
            raise InputError("melange", f"tputs.{g}", "throughputs >= 0 (req/s per GPU)",
                             list(tputs[g]))
        if g in prices and not (math.isfinite(prices[g]) and prices[g] >= 0):
            raise InputError("melange", f"prices.{g}", "a price >= 0 USD per GPU-hour",
                             prices[g])
        if len(tputs[g]) != len(rates):
            raise InputError("melange", f"tputs.{g}", f"{len(rates)} throughputs, one per bucket",
                             len(tputs[g]))
        if g not in prices:
            raise InputError("melange", f"prices.{g}", "a price per GPU-hour")
    slices = [(b, rates[b] / slice_factor) for b in range(len(rates)) for _ in range(slice_factor)]
    prob = pulp.LpProblem("melange", pulp.LpMinimize)
    x: dict[tuple[int, str], Any] = {}
    n = {g: prob.add_variable(f"n{i}", 0, None, pulp.LpInteger) for i, g in enumerate(gpus)}
    for i, (b, r) in enumerate(slices):
        ok = [g for g in gpus if tputs[g][b] > 0 or r == 0]
        for k, g in enumerate(ok):
            x[i, g] = prob.add_variable(f"x{i}_{k}", 0, 1, pulp.LpBinary)
        prob += pulp.LpAffineExpression([(x[i, g], 1) for g in ok]) == 1, f"slice_{i}"
    prob += pulp.LpAffineExpression([(n[g], prices[g]) for g in gpus])
    for k, g in enumerate(gpus):
        load = [(x[i, g], r / tputs[g][b]) for i, (b, r) in enumerate(slices)
                if (i, g) in x and r > 0]
        prob += pulp.LpAffineExpression([*load, (n[g], -1)]) <= 0, f"load_{k}"
    prob.solve(pulp_highs(time_limit_s, gap_rel=0.0))  # HiGHS's defaults otherwise (presolve on)
    status, _, _ = _status(prob)
    if status not in ("optimal", "time_limit"):
        return MelangeAnswer(status, {}, math.inf, ())
    counts = {g: round(n[g].value() or 0) for g in gpus}
    assign = tuple(max((g for g in gpus if (i, g) in x), key=lambda g: x[i, g].value() or 0.0)
                   for i in range(len(slices)))
    return MelangeAnswer(status, MappingProxyType(counts),
                         math.fsum(prices[g] * counts[g] for g in gpus), assign)


# -- portions of one LLM's load -----------------------------------------------------------------


def group_gpus(c: Candidate, domain: int) -> int:
    """Whole GPUs a candidate's replicas take alone (:func:`scepsy_common.units.replica_gpus`):
    ``⌊1/share⌋`` replicas to a GPU (compute and memory), each on ``tp`` GPUs of one NVLink
    domain of ``domain`` GPUs."""
    per = replicas_per_gpu(c.share)
    if c.memory_share is not None:
        per = min(per, replicas_per_gpu(c.memory_share))
    return replica_gpus(c.replicas, c.tp, per, domain)


@dataclass(frozen=True, slots=True)
class Portion:
    """A replica group of one LLM on one GPU type, carrying ``slices/S`` of the LLM's calls:
    ``candidate`` is priced at that share of the LLM's load."""

    slices: int
    total: int  # S
    candidate: Candidate
    gpus: int  # the whole GPUs its replicas take alone (:func:`group_gpus`)
    # routed by length: the input tokens [lo, hi) of the calls it serves (``candidate`` is
    # priced on those calls' statistics), the LLM's length buckets [a, b) they span and the
    # fraction of the LLM's calls they are; None: routed by weight
    tokens: tuple[int, int | None] | None = None
    buckets: tuple[int, int] = (0, 0)
    calls: float = 0.0
    # routed by length, per percentile-bounded workflow: its unit latency in its range's own
    # critical-path units and the factor to the LLM's (mean call of the LLM over the range's)
    units: tuple[tuple[str, float, float], ...] = ()

    @property
    def fraction(self) -> float:
        """The fraction of the LLM's calls the group gets."""
        return self.calls if self.tokens is not None else self.slices / self.total

    @property
    def weight(self) -> float:
        """What its candidate's latencies count for in the LLM's: its fraction of the calls
        when routed by weight (the candidate is the LLM's at that rate), 1 when routed by
        length (the candidate is priced on the range's own calls)."""
        return 1.0 if self.tokens is not None else self.slices / self.total


@dataclass(frozen=True)
class MixedPlan:
    """The cheapest portions (module docstring): per LLM its replica groups, at most one per GPU
    type, their fractions summing to 1."""

    status: str  # optimal | time_limit | infeasible | time_limit_no_solution
    portions: Mapping[str, tuple[Portion, ...]]
    cost_per_hour: float  # the groups' whole GPUs (placeable group by group)
    cost_bound_per_hour: float  # no plan of these portions costs less (aggregate GPUs)
    gpus_used: Mapping[str, int]  # per GPU type, the groups' whole GPUs
    latency_s: Mapping[str, float]  # per targeted workflow, its predicted mean latency
    stats: Mapping[str, Any] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return bool(self.portions)

    @property
    def mixed(self) -> bool:
        """Whether some LLM runs on more than one GPU type."""
        return any(len(ps) > 1 for ps in self.portions.values())


def domains(problem: PlanningProblem) -> dict[str, int]:
    """Per GPU type of the cluster, the GPUs of its largest NVLink domain on one node."""
    return {g: problem.cluster.max_tp(g, problem.catalog) for g in problem.cluster.budgets()}


def portion_candidates(problem: PlanningProblem, slices: int = SLICES, *,
                       deadline: Deadline | None = None) -> dict[str, list[Portion]]:
    """Per LLM, a :class:`Portion` for every candidate of the problem scaled to ``j/slices``
    of its targets (``j = 1..slices``) that no other of the same GPU type and ``j`` beats on
    every count the split MILP reads (:func:`scepsy_opt.planning.mincost.prune_for_cost` with whole
    GPUs as a further count)."""
    return _portions(problem, slices, deadline)[0]


def _portions(problem: PlanningProblem, slices: int, deadline: Deadline | None,
              ) -> tuple[dict[str, list[Portion]], int]:
    """:func:`portion_candidates` and how many candidates were generated before pruning."""
    dom = domains(problem)

    def whole(c: Candidate) -> int:
        return group_gpus(c, dom[c.gpu])

    out: dict[str, list[Portion]] = {m: [] for m in problem.llms}
    cache: dict[tuple[str, str, int], list[Any]] = {}
    generated = 0
    for j in range(1, slices + 1):
        part = problem if j == slices else problem.scaled(j / slices)
        cs = generate_candidates(part, prune=False, deadline=deadline, curve_cache=cache)
        generated += cs.generated
        for m, cands in prune_for_cost(part, cs.by_llm, deadline=deadline, whole=whole).items():
            out[m].extend(Portion(j, slices, c, whole(c)) for c in cands)
    return out, generated


def _contrib(p: Portion) -> dict[str, float]:
    """Per workflow, the portion's contribution to its mean latency: ``(j/S)·ℓ_wc`` (routed
    by length: ``ℓ_wc`` of its range's calls)."""
    return {w: p.weight * v for w, v in p.candidate.workflow_latency_s}


# -- length routing -----------------------------------------------------------------------------

_BELOW, _ABOVE = "\x00below", "\x00above"  # the rest of an LLM's calls, around one range


def length_problem(problem: PlanningProblem, llm: str, rng: tuple[int, int | None],
                   ) -> PlanningProblem | None:
    """``problem`` reduced to the calls of ``llm`` whose prompt length is in ``rng``: every
    targeted workflow that makes such calls, with ``llm`` alone at the statistics of those
    calls (:func:`scepsy_opt.stats.length_split`), its targets, SLO and mean bounds. Its
    candidates carry the range's load at the range's latency. None when no call is in range."""
    lo, hi = rng
    ranges: dict[str, tuple[int, int | None]] = {llm: rng}
    if lo > 0:
        ranges[_BELOW] = (0, lo)
    if hi is not None:
        ranges[_ABOVE] = (hi, None)
    stats = {}
    for w in problem.targets:
        st = problem.stats[w]
        if llm not in st.llms:
            continue
        got, cols = length_split(st, llm, ranges)
        if llm in got:
            stats[w] = dataclasses.replace(
                st, llms={llm: got[llm]},
                paths=RequestPaths((llm,), cols[llm].reshape(-1, 1), st.paths.tool_s))
    if not stats:
        return None
    opts = problem.options
    options = dataclasses.replace(
        opts, current=None,
        latency_bounds={w: x for w, x in opts.latency_bounds.items() if w in stats},
        weights={w: x for w, x in opts.weights.items() if w in stats},
        latency_bound_s={w: x for w, x in opts.latency_bound_s.items() if w in stats},
        slos={m: x for m, x in opts.slos.items() if m == llm})
    return dataclasses.replace(problem, stats=stats, options=options,
                               targets={w: t for w, t in problem.targets.items() if w in stats})


def length_portions(problem: PlanningProblem, *, deadline: Deadline | None = None,
                    ) -> dict[str, list[Portion]]:
    """Per LLM, a :class:`Portion` routed by length for every candidate (pruned as
    :func:`portion_candidates` prunes) of every range of its length buckets
    (:func:`scepsy_opt.stats.length_edges` with ``PlanOptions.length_buckets``) that spans
    consecutive buckets but not all of them; none for an LLM with one bucket or statistics
    built without a trace."""
    dom = domains(problem)

    def whole(c: Candidate) -> int:
        return group_gpus(c, dom[c.gpu])

    targeted = {w: problem.stats[w] for w in problem.targets}
    out: dict[str, list[Portion]] = {m: [] for m in problem.llms}
    load = problem.loads
    for m in problem.llms:
        edges = length_edges(targeted, m, problem.options.length_buckets)
        bounds: list[int | None] = [0, *edges, None]
        nb = len(bounds) - 1
        for a in range(nb):
            for b in range(a + 1, nb + 1):
                if (a, b) == (0, nb):
                    continue
                rng = (int(bounds[a]), bounds[b])  # type: ignore[arg-type]
                sub = length_problem(problem, m, rng)
                if sub is None:
                    continue
                frac = sub.loads[m] / load[m] if load[m] > 0 else 0.0
                cs = generate_candidates(sub, prune=False, deadline=deadline)
                for c in prune_for_cost(sub, cs.by_llm, deadline=deadline, whole=whole)[m]:
                    units = tuple((w, unit_latency(sub, w, c) if w in sub.stats else 0.0,
                                   _to_llm_units(problem.stats[w], sub.stats.get(w), m))
                                  for w in _percentile_bounds(problem))
                    out[m].append(Portion(1, 1, c, whole(c), rng, (a, b), frac, units))
    return out


def _to_llm_units(st: WorkflowStats, part: WorkflowStats | None, llm: str) -> float:
    """The factor from a range's unit latency to an upper bound in the LLM's units: a request
    spends ``W_g·mc_g`` seconds of recorded time in range ``g`` (``W_g`` its path weight in
    units of the range's mean call ``mc_g``) and ``Σ_g W_g·mc_g = W·mc`` in all, so
    ``Σ_g W_g·u_g ≤ W·max_g(u_g·mc/mc_g)``. 1 where a mean call is 0 (weights count calls)."""
    if part is None or llm not in st.llms or llm not in part.llms:
        return 1.0
    mc, mg = st.llms[llm].mean_call_s, part.llms[llm].mean_call_s
    return mc / mg if mc > 0 and mg > 0 else 1.0


Vars = dict[str, list[tuple[Portion, Any]]]


def _model(problem: PlanningProblem, options: Mapping[str, Sequence[Portion]],
           s: int, prices: Mapping[str, float], caps: Mapping[str, int], *, aggregate: bool,
           objective: str, cost_cap: float | None = None, cuts: Sequence[Cut] = (),
           units: Units | None = None) -> tuple[pulp.LpProblem, Vars]:
    """The split MILP (module docstring): GPUs counted per group (or, ``aggregate``, in
    aggregate per type); ``objective`` "cost" or "latency" (then the cost at most
    ``cost_cap``); ``cuts`` of the percentile bounds on the portions' ``units``."""
    prob = pulp.LpProblem("scepsy_mixed", pulp.LpMinimize)
    ys: Vars = choice_variables(prob, options)  # one binary per portion
    types = sorted(caps)
    if aggregate:
        gp = {g: prob.add_variable(f"n{i}", 0, caps[g], pulp.LpInteger)
              for i, g in enumerate(types)}
        cost = pulp.LpAffineExpression([(gp[g], prices[g]) for g in types if prices[g]])
    else:
        cost = pulp.LpAffineExpression([(v, prices[p.candidate.gpu] * p.gpus)
                                        for m in ys for p, v in ys[m] if prices[p.candidate.gpu]])
    latency = pulp.LpAffineExpression([(v, p.weight * p.candidate.cost)
                                       for m in ys for p, v in ys[m]])
    prob += cost if objective == "cost" else latency
    for i, m in enumerate(ys):
        by_weight = [(v, p.slices) for p, v in ys[m] if p.tokens is None]
        by_length = [(p, v) for p, v in ys[m] if p.tokens is not None]
        if not by_length:
            prob += pulp.LpAffineExpression(by_weight) == s, f"load_{i}"
        else:  # z = 1: routed by length, every bucket in exactly one chosen range
            z = prob.add_variable(f"len_{i}", 0, 1, pulp.LpBinary)
            prob += pulp.LpAffineExpression([*by_weight, (z, s)]) == s, f"load_{i}"
            for b in range(max(p.buckets[1] for p, _ in by_length)):
                on = [(v, 1) for p, v in by_length if p.buckets[0] <= b < p.buckets[1]]
                prob += pulp.LpAffineExpression([*on, (z, -1)]) == 0, f"bucket_{i}_{b}"
        for t, g in enumerate(types):
            on = [(v, 1) for p, v in ys[m] if p.candidate.gpu == g]
            if len(on) > 1:
                prob += pulp.LpAffineExpression(on) <= 1, f"one_{i}_{t}"
    for t, g in enumerate(types):
        mine = [(p, v) for m in ys for p, v in ys[m] if p.candidate.gpu == g]
        if not mine:
            continue
        if aggregate:
            for kind in ("units", "mem_units"):
                terms = [(v, getattr(p.candidate, kind)) for p, v in mine]
                prob += (pulp.LpAffineExpression([*terms, (gp[g], -UNITS)]) <= 0, f"{kind}_{t}")
        else:
            prob += pulp.LpAffineExpression([(v, p.gpus) for p, v in mine]) <= caps[g], \
                f"gpus_{t}"
    for i, (w, bound) in enumerate(sorted(problem.options.latency_bound_s.items())):
        if w not in problem.targets:
            continue
        terms = [(v, _contrib(p).get(w, 0.0)) for m in ys for p, v in ys[m]]
        prob += (pulp.LpAffineExpression([t for t in terms if t[1]])
                 <= bound - problem.stats[w].tool_critical_s), f"bound_{i}"
    if cost_cap is not None:
        prob += cost <= cost_cap, "cost_cap"
    if cuts:
        assert units is not None
        _add_cuts(prob, ys, cuts, units)
    return prob, ys


# -- percentile bounds on split plans (module docstring) ---------------------------------------

Units = Mapping[str, Mapping[Portion, float]]  # workflow -> portion -> its unit latency (s)


@dataclass(frozen=True)
class Cut:
    """A lazy row of workflow ``workflow``'s percentile bound. ``"row"``: ``Σ_m a_m·v_wm ≤ rhs``
    (``terms`` LLM -> ``a_m``; ``v_wm`` at least the unit latency of ``m``'s slowest chosen
    group); ``"nogood"``: not every LLM of ``terms`` (LLM -> unit latency) keeps a group at least
    that slow."""

    kind: str  # row | nogood
    workflow: str
    terms: tuple[tuple[str, float], ...]
    rhs: float = 0.0


def _add_cuts(prob: pulp.LpProblem, ys: Vars, cuts: Sequence[Cut], units: Units) -> None:
    v: dict[tuple[str, str], Any] = {}

    def worst(w: str, m: str) -> Any:  # v_wm >= u_wp·y_p for every portion p of m
        if (w, m) not in v:
            x = v[w, m] = prob.add_variable(f"v{len(v)}", 0, None)
            for k, (p, y) in enumerate(ys[m]):
                if units[w][p] > 0:
                    prob.addConstraint(
                        pulp.LpAffineExpression([(x, 1.0), (y, -units[w][p])]) >= 0,
                        f"v{len(v) - 1}_{k}")
        return v[w, m]

    for i, c in enumerate(cuts):
        if c.kind == "row":
            terms = [(worst(c.workflow, m), a) for m, a in c.terms if a > 0]
            if terms:
                prob += pulp.LpAffineExpression(terms) <= c.rhs, f"pct_{i}"
            continue
        zs = []
        for j, (m, at) in enumerate(c.terms):
            slow = [y for p, y in ys[m] if units[c.workflow][p] >= at]
            if not slow:
                break  # m cannot keep a group that slow: the no-good always holds
            z = prob.add_variable(f"z{i}_{j}", 0, 1, pulp.LpBinary)
            for k, y in enumerate(slow):
                prob += pulp.LpAffineExpression([(z, 1), (y, -1)]) >= 0, f"z{i}_{j}_{k}"
            zs.append((z, 1))
        else:
            prob += pulp.LpAffineExpression(zs) <= len(zs) - 1, f"nogood_{i}"


def portion_units(problem: PlanningProblem, options: Mapping[str, Sequence[Portion]]) -> Units:
    """Per percentile-bounded workflow, every portion's unit latency
    (:func:`scepsy_opt.planning.milp.unit_latency` of its candidate: the group's calls at its
    share of the load); routed by length, its range's unit latency in the LLM's units, an
    upper bound (:func:`_to_llm_units`), so that the slowest group's bounds every routing."""
    def unit(w: str, p: Portion) -> float:
        if p.tokens is None:
            return unit_latency(problem, w, p.candidate)
        u, f = next((u, f) for x, u, f in p.units if x == w)
        return u * f
    return {w: {p: unit(w, p) for m in sorted(options) for p in options[m]}
            for w in _percentile_bounds(problem)}


def worst_units(problem: PlanningProblem, units: Units, w: str,
                portions: Mapping[str, Sequence[Portion]]) -> dict[str, float]:
    """Workflow ``w``'s unit latency of each LLM at its slowest group in ``portions``."""
    return {m: max(units[w][p] for p in portions[m]) for m in problem.stats[w].llms}


def split_percentiles(problem: PlanningProblem, portions: Mapping[str, Sequence[Portion]],
                      units: Units | None = None) -> dict[str, tuple[float, float]]:
    """Per percentile-bounded workflow, ``(slowest routing, the predictor's routing)``: its
    predicted percentile with every split LLM at its slowest group (what the bound holds) and
    with each at the fraction-weighted mean of its groups' unit latencies (the predictor's, on
    the split plan's groups), or, routed by length, with each group at its own unit latency
    on its range's critical paths (:func:`scepsy_opt.stats.length_split`)."""
    units = units if units is not None else portion_units(problem, portions)
    out = {}
    for w, (q, _) in _percentile_bounds(problem).items():
        st = problem.stats[w]
        by_length = {m: ps for m, ps in portions.items()
                     if m in st.llms and ps and ps[0].tokens is not None}
        mean = {m: math.fsum(p.fraction * units[w][p] for p in portions[m])
                for m in st.llms if m not in by_length}
        paths = st.paths
        if by_length:
            names = {m: [f"{m}\x00{k}" for k in range(len(ps))] for m, ps in by_length.items()}
            ranges = {m: {g: p.tokens for g, p in zip(names[m], ps, strict=True)
                          if p.tokens is not None} for m, ps in by_length.items()}
            paths = split_stats(st, {}, ranges).paths
            for m, ps in by_length.items():
                for g, p in zip(names[m], ps, strict=True):
                    mean[g] = next(u for x, u, _ in p.units if x == w)
        out[w] = (latency_quantiles(st.paths, worst_units(problem, units, w, portions),
                                    (q,))[0],
                  latency_quantiles(paths, mean, (q,))[0])
    return out


def _bound_report(problem: PlanningProblem, portions: Mapping[str, Sequence[Portion]] | None,
                  units: Units) -> dict[str, dict[str, Any]]:
    got = split_percentiles(problem, portions, units) if portions else {}
    return {w: {"percentile": q, "bound_s": b,
                "predicted_s": got[w][1] if w in got else None,
                "slowest_routing_s": got[w][0] if w in got else None,
                "met": w in got and _meets(got[w][0], b)}
            for w, (q, b) in _percentile_bounds(problem).items()}


def _picked(ys: Vars) -> dict[str, tuple[Portion, ...]]:
    return {m: tuple(sorted((p for p, v in pairs if (v.value() or 0) > 0.5),
                            key=lambda p: (p.buckets, p.candidate.gpu, p.slices)))
            for m, pairs in ys.items()}


def _cost(portions: Mapping[str, Sequence[Portion]], prices: Mapping[str, float]) -> float:
    return math.fsum(prices[p.candidate.gpu] * p.gpus
                     for m in sorted(portions) for p in portions[m])


def mixed_latencies(problem: PlanningProblem, portions: Mapping[str, Sequence[Portion]],
                    ) -> dict[str, float]:
    """Per targeted workflow, its predicted mean latency: tool time on the critical path plus
    every portion's ``(j/S)·ℓ_wc``."""
    out = {}
    for w in problem.targets:
        out[w] = problem.stats[w].tool_critical_s + math.fsum(
            _contrib(p).get(w, 0.0) for m in sorted(portions) for p in portions[m])
    return out


def _cost_solve(problem: PlanningProblem, options: Mapping[str, Sequence[Portion]], slices: int,
                prices: Mapping[str, float], caps: Mapping[str, int], left: Deadline,
                cuts: Sequence[Cut] = (), units: Units | None = None,
                cost_cap: float | None = None,
                ) -> tuple[str, dict[str, tuple[Portion, ...]] | None, float]:
    """(status, the cheapest portions or None, the solver's dual bound) of the split MILP."""
    prob, ys = _model(problem, options, slices, prices, caps, aggregate=False, objective="cost",
                      cost_cap=cost_cap, cuts=cuts, units=units)
    prob.solve(_solver(problem, left, gap_rel=0.0))
    status, _, bound = _status(prob)
    if status not in ("optimal", "time_limit"):
        return status, None, bound
    return status, _picked(ys), bound


def _violated(problem: PlanningProblem, portions: Mapping[str, Sequence[Portion]],
              units: Units) -> list[str]:
    """The workflows whose percentile bound ``portions`` miss with the slowest routing."""
    if not units:
        return []
    return [w for w, (q, b) in _percentile_bounds(problem).items()
            if not _meets(latency_quantiles(problem.stats[w].paths,
                                            worst_units(problem, units, w, portions), (q,))[0],
                          b)]


@dataclass
class _Search:
    """The percentile bounds' lazy-constraint search (module docstring): its valid cuts, the
    best verified portions, whether they are proven cheapest, a lower bound on the price of
    every plan that meets the bounds, the solves spent, the status and why nothing was found."""

    valid: list[Cut] = field(default_factory=list)
    steer: list[Cut] = field(default_factory=list)
    best: dict[str, tuple[Portion, ...]] | None = None
    proven: bool = False
    lower: float = 0.0
    solves: int = 0
    status: str = "infeasible"
    why: str | None = None


def _percentile_search(problem: PlanningProblem, options: Mapping[str, Sequence[Portion]],
                       slices: int, prices: Mapping[str, float], caps: Mapping[str, int],
                       left: Deadline, units: Units) -> _Search:
    """The cheapest portions whose percentiles meet the bounds with the slowest routing, by
    lazy constraints as :func:`scepsy_opt.planning.milp.solve_min_latency` plans them."""
    bounds = _percentile_bounds(problem)
    sr = _Search()
    for w, (q, b) in bounds.items():  # every LLM at its fastest portion: a proof at no cost
        fastest = {m: min(units[w][p] for p in options[m]) for m in problem.stats[w].llms}
        least = latency_quantiles(problem.stats[w].paths, fastest, (q,))[0]
        if not _meets(least, b):
            sr.proven = True
            sr.why = (f"{w}'s predicted p{q:g} latency is at least {least:.4g} s (every LLM on "
                      f"its fastest group), above the bound of {b:g} s")
            return sr

    def learn(pt: Mapping[str, Sequence[Portion]], bad: list[str], steer: bool) -> None:
        for w in bad:
            q, b = bounds[w]
            st = problem.stats[w]
            u = worst_units(problem, units, w, pt)
            on = tuple((m, u[m]) for m in st.llms if _path_weight(st.llms[m]) > 0)
            sr.valid.append(Cut("nogood", w, on))
            a, off = floor_cut(st.paths, u, q)
            sr.valid.append(Cut("row", w, tuple(sorted(a.items())), b - off))
            if steer:
                a, off = linearise(st.paths, u, q)
                sr.steer.append(Cut("row", w, tuple(sorted(a.items())), b - off))

    try:
        for _ in range(LINEARISE_ITERS):  # 1. linearised rows steer to a verified choice
            status, pt, bound = _cost_solve(problem, options, slices, prices, caps, left,
                                            sr.valid + sr.steer, units)
            sr.solves += 1
            if status == "time_limit_no_solution":
                raise TimeLimitReached("time limit")
            if pt is None:
                if not sr.steer:  # the valid cuts alone admit nothing: proven
                    sr.proven, sr.status = status == "infeasible", status
                    sr.why = "no split meets the targets and the bounds within the GPUs"
                    return sr
                break
            if not sr.steer:
                sr.lower = max(sr.lower, bound if math.isfinite(bound) else 0.0)
            bad = _violated(problem, pt, units)
            if not bad:
                sr.best, sr.proven = pt, not sr.steer and status == "optimal"
                break
            learn(pt, bad, steer=True)
        for _ in range(EXACT_ITERS if not sr.proven else 0):  # 2. valid cuts, a lower price
            cap = None
            if sr.best is not None:
                z = _cost(sr.best, prices)
                cap = z - CHEAPER_REL * max(1.0, z)
            status, pt, bound = _cost_solve(problem, options, slices, prices, caps, left,
                                            sr.valid, units, cost_cap=cap)
            sr.solves += 1
            if status == "time_limit_no_solution":
                break
            if pt is None:  # nothing cheaper left: the best verified choice is optimal
                sr.proven = status == "infeasible"
                break
            sr.lower = max(sr.lower, bound if math.isfinite(bound) else _cost(pt, prices))
            bad = _violated(problem, pt, units)
            if not bad:
                sr.best, sr.proven = pt, status == "optimal"
                break
            learn(pt, bad, steer=False)
    except TimeLimitReached:
        if sr.best is None:
            raise
    if sr.best is None:
        sr.status = "infeasible" if sr.proven else "time_limit_no_solution"
        sr.why = (f"no split meets the percentile bounds within the GPUs ({sr.solves} solves)"
                  if sr.proven else f"no split found whose percentiles meet the bounds in "
                  f"{sr.solves} solves (not proven impossible)")
        return sr
    cost = _cost(sr.best, prices)
    sr.lower = cost if sr.proven else min(sr.lower, cost)
    sr.status = "optimal" if sr.proven else "time_limit"
    return sr


def solve_mixed(problem: PlanningProblem, *, slices: int = SLICES,
                caps: Mapping[str, int] | None = None, deadline: Deadline | None = None,
                prices: Mapping[str, float] | None = None) -> MixedPlan:
    """The cheapest portions (module docstring) within ``caps`` GPUs per type (default: the
    cluster's budgets, open pools at ``max_nodes``); prices per GPU-hour default to
    :func:`scepsy_opt.planning.mincost.gpu_prices`. Statuses as for min-cost: ``time_limit`` with an
    answer not proven cheapest, ``time_limit_no_solution``, ``infeasible`` (no portions meet
    the targets and mean bounds within the GPUs).

    With ``PlanOptions.length_routing`` it solves twice: by weight
    alone, and with :func:`length_portions` offered too (each LLM routed by weight or by
    length, whichever the MILP finds cheaper); the second answer is taken only when it costs
    less than the first (by ``CHEAPER_REL``, relative), so ties keep the weight split.
    ``stats["length_routing"]`` reports both prices and which was taken."""
    if not isinstance(slices, int) or slices < 1:
        raise InputError("mixed plan", "slices", "an integer >= 1", slices)
    opts = problem.options
    if not opts.length_routing:
        return _solve_mixed(problem, slices, caps, deadline, prices, by_length=False)
    left = Deadline.of(problem, deadline)
    base = _solve_mixed(problem, slices, caps, left, prices, by_length=False)
    both = _solve_mixed(problem, slices, caps, left, prices, by_length=True)
    routed = both.feasible and any(p.tokens is not None for ps in both.portions.values()
                                   for p in ps)
    used = routed and (not base.feasible or both.cost_per_hour
                       < base.cost_per_hour - CHEAPER_REL * max(1.0, base.cost_per_hour))
    pick = both if used else base
    bound = pick.cost_bound_per_hour
    if both.feasible and base.feasible:  # the second solve's bound holds for plans either way
        bound = min(bound, both.cost_bound_per_hour)
    status = pick.status
    if pick.feasible and both.status != "optimal":  # no proof that length routing is dearer
        status = "time_limit"
    report = {"by_weight_cost_per_hour": base.cost_per_hour,
              "with_length_cost_per_hour": both.cost_per_hour, "used": used,
              "status": both.status, "buckets": opts.length_buckets}
    return dataclasses.replace(pick, status=status, cost_bound_per_hour=bound,
                               stats={**pick.stats, "length_routing": report})


def _solve_mixed(problem: PlanningProblem, slices: int, caps: Mapping[str, int] | None,
                 deadline: Deadline | None, prices: Mapping[str, float] | None, *,
                 by_length: bool) -> MixedPlan:
    t0 = time.perf_counter()
    left = Deadline.of(problem, deadline)
    prices = dict(gpu_prices(problem) if prices is None else prices)
    caps = dict(problem.cluster.budgets() if caps is None else caps)
    stats: dict[str, Any] = {"solver": SOLVER, "slices": slices}
    empty: Mapping[str, Any] = MappingProxyType({})
    try:
        options, generated = _portions(problem, slices, left)
        if by_length:
            for m, ps in length_portions(problem, deadline=left).items():
                options[m].extend(ps)
        stats.update(candidates_generated=generated,
                     candidates_kept=sum(len(v) for v in options.values()),
                     candidates_s=time.perf_counter() - t0)
        if any(not v for v in options.values()):
            return MixedPlan("infeasible", empty, math.inf, math.inf, empty, empty,
                             dict(stats, reason="an LLM has no candidate"))
        units = portion_units(problem, options)
        cuts: tuple[Cut, ...] = ()
        if units:  # percentile bounds: the lazy-constraint search
            search = _percentile_search(problem, options, slices, prices, caps, left, units)
            status, found, bound = search.status, search.best, search.lower
            cuts = tuple(search.valid)
            stats.update(latency_bound_solves=search.solves,
                         latency_bounds_optimal=search.proven)
            if found is None:
                return MixedPlan(status, empty, math.inf, math.inf, empty, empty,
                                 dict(stats, latency_bounds=_bound_report(problem, None, units),
                                      reason=search.why, total_s=time.perf_counter() - t0))
        else:
            status, found, bound = _cost_solve(problem, options, slices, prices, caps, left)
            if found is None:
                return MixedPlan(status, empty, math.inf, math.inf, empty, empty,
                                 dict(stats, total_s=time.perf_counter() - t0))
        portions = found
        cost = _cost(portions, prices)
        try:  # the least latency at that price
            cap = cost + COST_REL * max(1.0, cost)
            prob2, ys2 = _model(problem, options, slices, prices, caps, aggregate=False,
                                objective="latency", cost_cap=cap, cuts=cuts, units=units)
            prob2.solve(_solver(problem, left, gap_rel=0.0))
            st2, _, _ = _status(prob2)
            tied = _picked(ys2) if st2 in ("optimal", "time_limit") else None
            if tied is not None and not _violated(problem, tied, units):
                portions = tied
                status = status if st2 == "optimal" else "time_limit"
        except TimeLimitReached:
            status = "time_limit"
        agg = -math.inf
        try:  # a lower bound on any plan of these portions: GPUs counted in aggregate
            prob3, _ = _model(problem, options, slices, prices, caps, aggregate=True,
                              objective="cost", cuts=cuts, units=units)
            prob3.solve(_solver(problem, left, gap_rel=0.0))
            st3, val3, bound3 = _status(prob3)
            agg = val3 if st3 == "optimal" else (bound3 if st3 == "time_limit" else agg)
        except TimeLimitReached:
            pass
    except TimeLimitReached:
        return MixedPlan("time_limit_no_solution", empty, math.inf, math.inf, empty, empty,
                         dict(stats, total_s=time.perf_counter() - t0))
    cost = _cost(portions, prices)
    whole = min(bound, cost) if math.isfinite(bound) else 0.0
    # one LLM: nothing else shares its GPUs, so its groups' whole GPUs (exact for identical
    # replicas, scepsy_common.units.replica_gpus) bound every plan that runs it one shape per
    # GPU type; with several LLMs they may share GPUs and only the aggregate count bounds them
    lower = max(agg, whole if len(problem.llms) == 1 else 0.0, 0.0)
    used: dict[str, int] = dict.fromkeys(sorted(caps), 0)
    for m in portions:
        for p in portions[m]:
            used[p.candidate.gpu] += p.gpus
    stats.update(whole_gpus_bound_per_hour=whole, aggregate_bound_per_hour=max(agg, 0.0),
                 total_s=time.perf_counter() - t0)
    if units:
        stats["latency_bounds"] = _bound_report(problem, portions, units)
    return MixedPlan(status, MappingProxyType(portions), cost, min(lower, cost),
                     MappingProxyType(used), MappingProxyType(mixed_latencies(problem, portions)),
                     stats)


# -- a mixed plan as a plan of its replica groups -----------------------------------------------

Splits = Mapping[str, Mapping[str, float]]  # LLM -> its replica groups' names -> fraction of calls


def group_name(llm: str, gpu: str, taken: set[str]) -> str:
    """The name of ``llm``'s replica group on ``gpu``: ``LLM-gpu`` (lower case, characters
    outside the name rule dropped), with ``-2``, ``-3``, ... while ``taken`` has it."""
    base = f"{llm}-{re.sub(r'[^a-z0-9_.+:/-]', '', gpu.lower())}"
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}-{k}"
    return name


def split_problem(problem: PlanningProblem, splits: Splits,
                  lengths: Mapping[str, Mapping[str, tuple[int, int | None]]] | None = None,
                  ) -> PlanningProblem:
    """``problem`` with every LLM of ``splits`` replaced by its replica groups (each running
    the LLM's model, :func:`scepsy_opt.stats.split_stats`); an LLM of ``lengths`` routed by
    prompt length (each group the statistics of its range's calls)."""
    models = dict(problem.models)
    slos = dict(problem.options.slos)
    for m, parts in splits.items():
        for name in parts:
            models[name] = problem.models[m]
            if m in problem.options.slos:  # every group meets the LLM's SLO
                slos[name] = problem.options.slos[m]
        slos.pop(m, None)
    options = (dataclasses.replace(problem.options, slos=slos) if problem.options.slos
               else problem.options)
    return dataclasses.replace(problem, models=models, options=options,
                               stats={w: split_stats(st, splits, lengths)
                                      for w, st in problem.stats.items()})


def splits_of(mx: MixedPlan) -> dict[str, dict[str, float]]:
    """The LLMs ``mx`` runs on more than one GPU type, their groups' names and fractions."""
    taken = set(mx.portions)
    out: dict[str, dict[str, float]] = {}
    for m in sorted(mx.portions):
        ps = mx.portions[m]
        if len(ps) < 2:
            continue
        out[m] = {}
        for p in ps:
            name = group_name(m, p.candidate.gpu, taken)
            taken.add(name)
            out[m][name] = p.fraction
    return out


def lengths_of(mx: MixedPlan) -> dict[str, dict[str, tuple[int, int | None]]]:
    """The LLMs ``mx`` routes by prompt length, their groups' names (as :func:`splits_of`)
    and input-token ranges."""
    splits = splits_of(mx)
    out: dict[str, dict[str, tuple[int, int | None]]] = {}
    for m, names in splits.items():
        ps = mx.portions[m]
        if ps[0].tokens is not None:
            out[m] = {g: p.tokens for g, p in zip(names, ps, strict=True)
                      if p.tokens is not None}
    return out


def mixed_plan(problem: PlanningProblem, mx: MixedPlan, name: str = "milp",
               status: Status | None = None) -> tuple[PlanningProblem, Plan]:
    """``mx`` as a plan of the problem split into its replica groups (:func:`split_problem`):
    the split problem and its plan (candidates priced again there; the allocation's
    ``splits`` say which groups serve which LLM, its ``lengths`` the input-token range of
    each group of an LLM routed by length)."""
    splits = splits_of(mx)
    lengths = lengths_of(mx)
    groups = split_problem(problem, splits, lengths) if splits else problem
    inst = {}
    for m, ps in mx.portions.items():
        names = list(splits[m]) if m in splits else [m]
        for g, p in zip(names, ps, strict=True):
            inst[g] = p.candidate.instance
    choice = price(groups, Allocation(inst))
    stats = {**mx.stats, "cost_per_hour": mx.cost_per_hour,
             "cost_bound_per_hour": mx.cost_bound_per_hour,
             "gpus_used": dict(mx.gpus_used), "splits": {m: dict(v) for m, v in splits.items()}}
    if lengths:
        stats["lengths"] = {m: {g: list(r) for g, r in v.items()} for m, v in lengths.items()}
    plan = plan_from_choice(groups, name, status or mx.status, choice,  # type: ignore[arg-type]
                            stats)
    if plan.allocation is not None and splits:
        plan = dataclasses.replace(plan, allocation=Allocation(plan.allocation.llms,
                                                               splits=splits, lengths=lengths))
    return groups, plan
