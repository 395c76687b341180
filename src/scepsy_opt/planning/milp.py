"""The exact allocation optimiser: a multiple-choice knapsack MILP (PuLP + in-process HiGHS).

One binary ``x_c`` per surviving candidate (``scepsy_opt.planning.candidates``):

* **min-latency** (default): ``min Σ_c cost_c·x_c`` s.t. ``Σ_{c∈m} x_c = 1`` for every LLM and
  ``Σ_{c on type t} units_c·x_c ≤ 1000·G_t`` for every GPU type. Every candidate already carries
  the load at ``max_utilisation``, so the throughput targets hold by construction.
* **max-throughput**: the largest scale ``s`` of the targets the cluster carries: ``max s`` s.t.
  ``s·ℓ_m ≤ max_utilisation · Σ_{c∈m} capacity_c·x_c`` (``ℓ_m`` the LLM's load,
  :func:`scepsy_opt.prediction.pipeline.llm_load`: the same capacity as the candidates'); with per-workflow latency bounds the
  answer is refined by bisection on ``s`` with min-latency solves whose workflows' latencies
  (linear in ``x``) are constrained.

**Percentile bounds** (``PlanOptions.latency_bounds``, workflow -> (percentile ``q``, seconds
``B``), either objective): the predicted ``q``-th percentile of the workflow's request latency
(:mod:`scepsy_opt.prediction.tails`: request ``j`` takes ``Σ_m W_jm·u_m + t_j``, ``u_m`` the unit latency
of the chosen candidate of ``m``, linear in ``x``) must not exceed ``B``. A percentile is not
linear in ``x``; :func:`solve_min_latency` enforces it by lazy constraints
(:func:`_percentile_bounded`): solve, *verify* the choice with
:func:`scepsy_opt.prediction.tails.latency_quantiles`, and on a violation add (a) a dominance no-good cut
excluding that choice and every choice no faster on any of the workflow's LLMs (valid: the
percentile grows with every unit latency), (b) a valid lower bound of the percentile
(:func:`scepsy_opt.prediction.tails.floor_cut`: the least weights of the requests above the percentile's
rank; valid for every choice) and (c) the percentile linearised at the choice (the mean
weights of the requests within ±2.5 percentile points of ``q``, :func:`scepsy_opt.prediction.tails.linearise`),
then re-solve; at most :data:`LINEARISE_ITERS` times. The linearised rows steer the search but may
cut off allowed choices, so the verified answer is then checked without them: the MILP with only
the valid cuts (a relaxation of the bounded problem: its optimum is a lower bound) and a
cost below the verified choice's, until it is infeasible (the choice is optimal), finds a
cheaper choice that verifies (that one is optimal) or :data:`EXACT_ITERS` solves are spent
(status ``time_limit``, with the gap to the relaxation's bound). Without any verified choice the
plan is ``infeasible``: proven when even the fastest candidate of every LLM misses the bound or
the relaxation runs out of choices, and said to be unproven otherwise. Every plan's
``stats["latency_bounds"]`` gives each bound, the predicted percentile and whether it is met.

Before the min-latency MILP, :func:`reduced_candidates` applies exact Lagrangian reduced-cost
fixing (prices from the LP relaxation of a coarse candidate sample; docs/optimiser.md), so large
clusters solve over a few percent of the candidates with the same optimum.

HiGHS runs in-process through PuLP's ``HiGHS`` interface (set up by :mod:`scepsy_opt.planning.solver`),
single-threaded with a fixed seed (deterministic), with the relative gap of
:class:`~scepsy_opt.planning.problem.PlanOptions`. Its time limit bounds the whole plan (a
:class:`~scepsy_opt.planning.problem.Deadline`): candidate generation, the reduction, every solver call
(each gets the time that remains), the bisection and the diagnosis. The status comes from HiGHS
itself (``optimal``, ``time_limit`` with the gap of its best bound, ``infeasible``), or is
``time_limit_no_solution`` when the time ran out before any allocation was found. When the
targets cannot be met the plan says why (:func:`diagnose`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, TypeVar

import highspy
import numpy as np
import pulp
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_matrix

from scepsy_common.bisection import Probe, largest_accepted
from scepsy_common.errors import InputError
from scepsy_common.units import UNITS, gpu_units
from scepsy_opt.planning.candidates import (
    Candidate,
    CandidateSet,
    curve_key,
    fits_budget,
    fitting_curves,
    generate_candidates,
    price,
    slo_floors,
)
from scepsy_opt.planning.plans import (
    Infeasibility,
    Plan,
    headroom,
    no_allocation_plan,
    plan_from_choice,
    time_limit_plan,
)
from scepsy_opt.planning.problem import Deadline, PlanningProblem, TimeLimitReached
from scepsy_opt.planning.solver import FAILED as SOLVER_FAILED
from scepsy_opt.planning.solver import SEED as SEED  # re-exported: the seed of every solve
from scepsy_opt.planning.solver import SOLVER, SolverStopped, highs_status, pulp_highs
from scepsy_opt.prediction.pipeline import min_replicas, replicas_needed
from scepsy_opt.prediction.tails import floor_cut, latency_quantiles, linearise
from scepsy_opt.stats import LLMStats

BISECT_REL = 1e-4  # max-throughput within latency bounds: the scale's relative bracket
BISECT_STEPS = 40
ONE_TYPE_REL = 1e-13  # the max scale on one GPU type: bisected to float precision
Row = tuple[Mapping[Candidate, float], float]  # an extra MILP row: Σ coeff·x_c ≤ rhs


class Shape(tuple):
    """A capacity shape ``(gpu, tp, share, units per replica, μ per replica)`` (a 5-tuple), with
    the memory units per replica (:attr:`mem_units`, = units when tied) and the memory share
    (:attr:`memory_share`, None when tied) as attributes."""

    mem_units: int
    memory_share: float | None

    def __new__(cls, gpu: str, tp: int, share: float, units: int, mu: float,
                mem_units: int | None = None, memory_share: float | None = None) -> Shape:
        self = super().__new__(cls, (gpu, tp, share, units, mu))
        self.mem_units = units if mem_units is None else mem_units
        self.memory_share = memory_share
        return self

    def __reduce__(self) -> Any:
        return (Shape, (*self, self.mem_units, self.memory_share))


Shapes = Mapping[str, Sequence[Shape]]  # per LLM (:func:`capacity_shapes`)
LINEARISE_ITERS = 6  # percentile bounds: solves with linearised rows before the exact check
EXACT_ITERS = 40  # ... and solves of the exact check (valid cuts only)


def _solver(problem: PlanningProblem, deadline: Deadline | None = None, *,
            time_limit_s: float | None = None, gap_rel: float | None = None,
            mip: bool = True) -> pulp.HiGHS:
    """HiGHS as every solve here runs it: one thread, fixed seed, the problem's gap unless
    overridden (``mip=False`` solves the LP relaxation), and the time that remains of
    ``deadline`` (a fresh one of the problem's time limit when None), at most ``time_limit_s``.
    Raises :class:`TimeLimitReached` when none remains."""
    opts = problem.options
    left = Deadline.of(problem, deadline)
    left.check()
    limit = left.remaining() if time_limit_s is None else min(left.remaining(), time_limit_s)
    return pulp_highs(limit, mip=mip, gap_rel=opts.gap_rel if gap_rel is None else gap_rel,
                      gap_abs=0.0,
                      # at HiGHS's default 1e-6 a share-1.0 column can stand in for share 0.9
                      # and the plan be called optimal 2e-8 above the optimum (found by the
                      # brute-force oracle); tighter integrality makes it exact
                      mip_feasibility_tolerance=1e-9,
                      # presolve spends most of the time on these knapsacks and removes little
                      # (benchmarks/solvers/plan_bench.py: 2-8x faster without it, same optima)
                      presolve="off")


def _status(prob: pulp.LpProblem) -> tuple[str, float, float]:
    """(status, objective, dual bound) of a solved PuLP problem (:func:`highs_status`)."""
    return highs_status(prob.solverModel)


def _knapsack(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
              extra: list[tuple[Mapping[Candidate, float], float]] | None = None,
              ) -> tuple[pulp.LpProblem, dict[str, list[tuple[Candidate, pulp.LpVariable]]]]:
    """The min-cost MILP; ``extra`` rows ``Σ coeff_c·x_c ≤ rhs``."""
    prob = pulp.LpProblem("scepsy_plan", pulp.LpMinimize)
    xs = choice_variables(prob, cands)
    prob += pulp.LpAffineExpression([(v, c.cost) for m in xs for c, v in xs[m]])
    for j, m in enumerate(xs):
        prob += pulp.LpAffineExpression([(v, 1) for _, v in xs[m]]) == 1, f"one_{j}"
    two = _two_resources(cands)
    for i, (gpu, g) in enumerate(problem.cluster.budgets().items()):
        terms: list[tuple[Any, float]] = [(v, c.units) for m in xs for c, v in xs[m]
                                          if c.gpu == gpu]
        if terms:
            prob += pulp.LpAffineExpression(terms) <= g * UNITS, f"budget_{i}"
        if two:
            terms = [(v, c.mem_units) for m in xs for c, v in xs[m] if c.gpu == gpu]
            if terms:
                prob += pulp.LpAffineExpression(terms) <= g * UNITS, f"mem_budget_{i}"
    for j, (coeffs, rhs) in enumerate(extra or []):
        terms = [(v, coeffs[c]) for m in xs for c, v in xs[m] if c in coeffs]
        prob += pulp.LpAffineExpression(terms) <= rhs, f"extra_{j}"
    return prob, xs


_C = TypeVar("_C")


def _two_resources(cands: Mapping[str, Sequence[Candidate]]) -> bool:
    """Whether some candidate has a memory share of its own (memory is then a second budget)."""
    return any(c.memory_share is not None for cs in cands.values() for c in cs)


def choice_variables(prob: pulp.LpProblem, cands: Mapping[str, Sequence[_C]],
                     ) -> dict[str, list[tuple[_C, pulp.LpVariable]]]:
    """One binary ``x_c`` per candidate (``x0, x1, ...`` in LLM then candidate order), per LLM
    (any item per LLM: candidates, or :mod:`scepsy_opt.planning.mixing`'s portions)."""
    xs: dict[str, list[tuple[_C, pulp.LpVariable]]] = {}
    n = 0
    for m in sorted(cands):
        xs[m] = []
        for c in cands[m]:
            xs[m].append((c, prob.add_variable(f"x{n}", 0, 1, pulp.LpBinary)))
            n += 1
    return xs


def _chosen(xs: Mapping[str, list[tuple[Candidate, pulp.LpVariable]]]) -> dict[str, Candidate]:
    out = {}
    for m, pairs in xs.items():
        out[m] = max(pairs, key=lambda p: (p[1].value() or 0.0))[0]
    return out


def _prices(problem: PlanningProblem, cands: CandidateSet, deadline: Deadline,
            ) -> tuple[dict[str, float], float, dict[str, float]] | Literal["infeasible"] | None:
    """Per GPU type, the LP relaxation's budget dual (a price per GPU unit, ≥ 0), the
    relaxation's objective and, per type, the memory budget's dual (a price per memory unit,
    ≥ 0; 0 when memory is tied); ``"infeasible"`` when HiGHS proves the relaxation infeasible
    (so is the MILP over ``cands``), None when it ends without an optimum otherwise."""
    prob, _ = _knapsack(problem, cands.by_llm)
    prob.solve(_solver(problem, deadline, mip=False))
    st = prob.solverModel.getModelStatus()
    if st == highspy.HighsModelStatus.kTimeLimit:
        raise TimeLimitReached(f"the LP relaxation ran out of time ({deadline.limit_s:g} s)")
    if st == highspy.HighsModelStatus.kInfeasible:
        return "infeasible"
    if st != highspy.HighsModelStatus.kOptimal:
        return None
    prices, mem = {}, {}
    for i, gpu in enumerate(problem.cluster.budgets()):
        con = prob.get_constraint_by_name(f"budget_{i}")
        prices[gpu] = max(0.0, -(con.pi or 0.0)) if con is not None else 0.0
        con = prob.get_constraint_by_name(f"mem_budget_{i}")
        mem[gpu] = max(0.0, -(con.pi or 0.0)) if con is not None else 0.0
    return prices, float(prob.solverModel.getInfo().objective_function_value), mem


def _fewest_units(cands: CandidateSet) -> CandidateSet:
    """``cands`` with, per LLM and GPU type, only the candidate of fewest units (ties: the
    order dominance pruning keeps, cost, TP degree, share, replicas)."""
    by_llm: dict[str, tuple[Candidate, ...]] = {}
    for m, cs in cands.by_llm.items():
        firsts: dict[str, tuple[tuple[float, ...], Candidate]] = {}
        for c in cs:
            key = (c.units, c.cost, c.tp, c.share, c.replicas)
            if c.gpu not in firsts or key < firsts[c.gpu][0]:
                firsts[c.gpu] = (key, c)
        by_llm[m] = tuple(firsts[g][1] for g in sorted(firsts))
    return CandidateSet(MappingProxyType(by_llm), cands.generated,
                        sum(len(v) for v in by_llm.values()), cands.curves, cands.unfit,
                        cands.seconds, cands.least_price)


def _greedy(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
            prices: Mapping[str, float], deadline: Deadline | None = None,
            memory_prices: Mapping[str, float] | None = None,
            ) -> dict[str, Candidate] | None:
    """A feasible allocation near the Lagrangian optimum (None if none found): per LLM the least
    ``v = cost + π·units`` (fewest units on ties); then, while a GPU type is over budget (the
    first by name), the move of one LLM off its current candidate on that type, to one with
    fewer units on it or to another type with room, that adds the least cost per unit of the
    excess it frees (ties: the first LLM by name, then the fewest units). Vectorised over all
    candidates; ``deadline`` is checked every move. Two resources (candidates with a memory
    share of their own): ``v`` adds ``ρ·mem_units`` (``memory_prices``), a type is over budget in
    compute or memory (compute repaired first), and a move must keep the other resource within
    its budget."""
    budgets = problem.cluster.budgets()
    types = sorted(budgets)
    cap = np.array([budgets[g] * UNITS for g in types], dtype=np.int64)
    llms = sorted(cands)
    flat = [c for m in llms for c in cands[m]]
    owner = np.array([j for j, m in enumerate(llms) for _ in cands[m]], dtype=np.int64)
    cost = np.array([c.cost for c in flat])
    units = np.array([c.units for c in flat], dtype=np.int64)
    mem = np.array([c.mem_units for c in flat], dtype=np.int64)
    gpu = np.array([types.index(c.gpu) for c in flat], dtype=np.int64)
    two = _two_resources(cands)
    rho = memory_prices or {}
    start = np.concatenate(([0], np.cumsum([len(cands[m]) for m in llms])))

    def v(c: Candidate) -> float:
        out = c.cost + prices[c.gpu] * c.units
        return out + rho[c.gpu] * c.mem_units if two and rho.get(c.gpu, 0.0) else out

    pick = np.array([int(start[j]) + min(range(len(cands[m])), key=lambda i: (
        v(cands[m][i]), cands[m][i].units, cands[m][i].mem_units))
        for j, m in enumerate(llms)], dtype=np.int64)
    for _ in range(100 * len(llms) + 100):
        if deadline is not None:
            deadline.check()
        used = np.bincount(gpu[pick], weights=units[pick], minlength=len(types)).astype(np.int64)
        used_m = (np.bincount(gpu[pick], weights=mem[pick], minlength=len(types)).astype(np.int64)
                  if two else used)
        over = np.flatnonzero(used > cap)
        res, used_r, other, used_o = units, used, mem, used_m
        if not len(over) and two:  # compute within budget: repair memory
            over = np.flatnonzero(used_m > cap)
            res, used_r, other, used_o = mem, used_m, units, used
        if not len(over):
            return {m: flat[int(pick[j])] for j, m in enumerate(llms)}
        g = int(over[0])
        cur = pick[owner]  # each candidate's LLM's current choice
        freed = np.where(gpu == g, res[cur] - res, res[cur])
        room = (gpu == g) | (used[gpu] + units <= cap[gpu])
        if two:  # the other resource stays within its budget where the LLM lands
            same = used_o[g] - other[cur] + other <= cap[g]
            room = np.where(gpu == g, same, room & (used_m[gpu] + mem <= cap[gpu]))
        ok = np.flatnonzero((gpu[cur] == g) & (freed > 0) & room)
        if not len(ok):
            return None
        ratio = (cost[ok] - cost[cur[ok]]) / np.minimum(freed[ok], used_r[g] - cap[g])
        k = ok[np.lexsort((units[ok], owner[ok], ratio))[0]]
        pick[owner[k]] = k
    return None


REDUCE_REL = 1e-9  # reduced-cost fixing's float tolerance: relative to the magnitudes summed ...
REDUCE_ABS = 1e-12  # ... and absolute (s)


def _cost(choice: Mapping[str, Candidate]) -> float:
    return math.fsum(choice[m].cost for m in sorted(choice))


def _better(a: dict[str, Candidate] | None, b: dict[str, Candidate] | None,
            ) -> dict[str, Candidate] | None:
    """The cheaper of two allocations (either may be None)."""
    if a is None or (b is not None and _cost(b) < _cost(a)):
        return b
    return a


def _satisfies(problem: PlanningProblem, choice: Mapping[str, Candidate], extra: Sequence[Row]) -> bool:
    """``choice`` within the budgets (exact integer units) and the ``extra`` rows."""
    return fits_budget(problem, choice) and all(
        math.fsum(coeffs.get(c, 0.0) for c in choice.values()) <= rhs + 1e-9 * max(1.0, abs(rhs))
        for coeffs, rhs in extra)


def _covers(cands: Mapping[str, Sequence[Candidate]], choice: Mapping[str, Candidate],
            by_tp: bool) -> bool:
    """Every candidate of ``choice`` is in ``cands`` or has there a stand-in on its GPU type with
    no more units (``by_tp``: and no larger TP degree): then ``cands`` holds an allocation that is
    feasible wherever ``choice`` is (the budgets and the block capacity rows only count units per
    type and TP level)."""
    return all(any(c.gpu == a.gpu and c.units <= a.units and c.mem_units <= a.mem_units
                   and (not by_tp or c.tp <= a.tp)
                   for c in cands.get(m, ()))
               for m, a in choice.items())


def reduced_candidates(problem: PlanningProblem, *, blocks: bool = False,
                       rows: Callable[[Mapping[str, Sequence[Candidate]]], list[Row]] | None = None,
                       deadline: Deadline | None = None) -> CandidateSet:
    """Candidates after exact Lagrangian reduced-cost fixing (:func:`generate_candidates`): the
    MILP over them has the optimum of the MILP over every candidate.

    1. A coarse sample of replica counts gives prices ``π ≥ 0`` (the LP relaxation's budget
       duals) and, by :func:`_greedy`, a feasible allocation.
    2. A scan of every candidate with ``v_c = cost_c + π·units_c`` within a guessed slack of each
       LLM's least ``v*_m`` gives the exact Lagrangian bound
       ``LB = Σ_m v*_m − Σ_t π_t·budget_t`` and the best known feasible allocation ``A`` (cost
       ``UB``): the greedy again, or, when that leaves ``UB − LB`` above the guess (or ``rows``
       are given), the MILP over the sample and the scanned candidates (with the rows).
    3. The result keeps every candidate with ``v_c − v*_m ≤ max(UB − LB, 0) + tol``.

    When HiGHS proves step 1's relaxation infeasible (memory tied to compute), the result is
    each LLM's candidate of fewest units per GPU type, and the MILP over every candidate is
    infeasible too. Every shape's replica scan starts at the same fewest replicas in the sample
    as in the full scan and units grow with replicas, so the sample holds, per LLM and type,
    the candidate of fewest units the full set keeps (the first in pruning's order); a point
    of the relaxation over every candidate maps to one over these (the relaxation has budget
    rows only), so none exists. With a memory share of their own, every candidate is generated
    as before.

    With two resources (candidates with a memory share of their own) every GPU type has two
    budget rows and two prices, ``π_t`` (compute units) and ``ρ_t`` (memory units):
    ``v_c = cost_c + π·units_c + ρ·mem_units_c`` and ``LB = Σ_m v*_m − Σ_t (π_t + ρ_t)·budget_t``;
    the argument below holds row by row.

    Why the optimum is unchanged: for any allocation ``x`` within the budgets,
    ``cost(x) ≥ cost(x) − Σ_t π_t·(budget_t − units_t(x)) = LB + Σ_m (v_{x_m} − v*_m)``, every
    term of the sum ≥ 0. An optimal ``x*`` costs at most ``UB``, so each of its candidates has
    ``v − v*_m ≤ UB − LB``: all are kept, and the kept set (a subset of all candidates) has the
    same optimum. ``tol = 1e-9·(|UB| + |LB| + Σ_m |v*_m| + Σ_t π_t·budget_t) + 1e-12`` bounds the
    rounding of these float sums by orders of magnitude (relative and absolute), so a tie a few
    ulps away is kept. The scan never skips a kept candidate: a shape's replica scan stops where
    ``floor + π·units`` (the zero-load cost, below every cost of more replicas) passes
    ``v*_m + slack``. The kept set is checked to hold ``A`` or a stand-in for each of its
    candidates with no more units (:func:`_covers`), so it holds a feasible allocation; without a
    known ``A`` (``UB = ∞``), or should that check fail, the result is every candidate.

    ``blocks`` counts GPUs as whole-GPU blocks (:func:`generate_candidates`); ``rows`` gives the
    extra rows of the final MILP for a candidate set (the block capacity rows). ``LB`` relaxes
    them (still a bound) and ``A`` satisfies them. ``deadline``: the plan's time limit
    (:class:`TimeLimitReached` once it passes). With percentile bounds
    (``PlanOptions.latency_bounds``: lazy constraints, no known feasible ``A``) the result is
    every candidate.
    """
    left = Deadline.of(problem, deadline)
    if _percentile_bounds(problem):  # the bound is no MILP row: nothing to fix by
        return generate_candidates(problem, blocks=blocks, deadline=left)
    t0 = time.perf_counter()
    cache: dict[tuple[str, str, int], list[Any]] = {}
    gen = functools.partial(generate_candidates, problem, curve_cache=cache, blocks=blocks,
                            deadline=left, scan_cache={})
    generated = 0

    def run(**kw: Any) -> CandidateSet:
        nonlocal generated
        cs = gen(**kw)
        generated += cs.generated
        return cs

    def result(cs: CandidateSet) -> CandidateSet:  # counts and time of the whole reduction
        return CandidateSet(cs.by_llm, generated, cs.kept, cs.curves, cs.unfit,
                            time.perf_counter() - t0, cs.least_price)

    coarse = run(coarse=True)
    if coarse.unfit or any(not c for c in coarse.by_llm.values()):
        return result(run())
    priced = _prices(problem, coarse, left)
    if priced == "infeasible" and not _two_resources(coarse.by_llm):
        return result(_fewest_units(coarse))  # no allocation of any candidate fits (docstring)
    if not isinstance(priced, tuple):  # no optimum to price by
        return result(run())
    prices, relaxed, mprices = priced
    budgets = problem.cluster.budgets()
    fixed = math.fsum([prices[g] * budgets[g] * UNITS for g in budgets]
                      + [mprices[g] * budgets[g] * UNITS for g in budgets if mprices[g]])
    best = _greedy(problem, coarse.by_llm, prices, left, mprices) if rows is None else None
    guess = 1e-4 * abs(_cost(best) if best is not None else relaxed)
    near = run(prices=prices, slack=guess, memory_prices=mprices)
    least = [near.least_price[m] for m in sorted(near.least_price)]
    lb = math.fsum(least) - fixed

    def slack(choice: Mapping[str, Candidate]) -> float:  # UB − LB and its float tolerance
        ub = _cost(choice)
        scale = abs(ub) + abs(lb) + math.fsum(abs(v) for v in least) + fixed
        return max(ub - lb, 0.0) + REDUCE_REL * scale + REDUCE_ABS

    if rows is None:
        best = _better(best, _greedy(problem, near.by_llm, prices, left, mprices))
    if best is None or slack(best) > guess:  # a tighter UB: the MILP over sample and scan
        pool = {m: tuple(sorted(set(coarse.by_llm[m]) | set(near.by_llm.get(m, ())),
                                key=lambda c: (c.gpu, c.units, c.cost, c.tp, c.share, c.replicas,
                                               c.mem_units, c.memory_share or 0.0)))
                for m in coarse.by_llm}
        extra = rows(pool) if rows is not None else []
        prob, xs = _knapsack(problem, pool, extra)
        prob.solve(_solver(problem, left, time_limit_s=5.0, gap_rel=1e-6))
        if _status(prob)[0] in ("optimal", "time_limit"):
            found = _chosen(xs)
            if _satisfies(problem, found, extra):
                best = _better(best, found)
    if best is None:  # no feasible allocation known, so no bound to fix by
        return result(run())
    need = slack(best)
    kept = near if need <= guess else run(prices=prices, slack=need, memory_prices=mprices)
    if not _covers(kept.by_llm, best, by_tp=blocks):  # the proof says never; checked all the same
        return result(run())
    return result(kept)


def solve_min_latency(problem: PlanningProblem, cset: CandidateSet | None = None,
                      extra: list[tuple[Mapping[Candidate, float], float]] | None = None,
                      name: str = "milp", *, deadline: Deadline | None = None) -> Plan:
    """Min weighted latency at the targets (see the module docstring).

    Everything runs within ``deadline`` (default: the problem's time limit from now): the
    candidates when ``cset`` is not given, the solve, and the diagnosis of an infeasible problem.
    When it passes before any allocation is found the status is ``time_limit_no_solution``.
    """
    left = Deadline.of(problem, deadline)
    t0 = time.perf_counter()
    if cset is None:
        reduce = problem.options.reduce
        if reduce is None:
            reduce = problem.cluster.total_gpus >= 64
        # the reduction keeps the unbounded optimum's candidates only: not with percentile bounds
        reduce = reduce and not _percentile_bounds(problem)
        try:
            cset = (reduced_candidates(problem, deadline=left) if reduce
                    else generate_candidates(problem, deadline=left))
        except TimeLimitReached:
            return time_limit_plan(name, {"total_s": time.perf_counter() - t0})
    stats: dict[str, Any] = {"candidates_generated": cset.generated, "candidates_kept": cset.kept,
                             "serving_curves": cset.curves, "candidates_s": cset.seconds}
    if cset.unfit or any(not c for c in cset.by_llm.values()):
        return _diagnosed(problem, cset, name, stats, left)
    if _percentile_bounds(problem):
        return _percentile_bounded(problem, cset, list(extra or []), name, stats, left)
    t1 = time.perf_counter()
    prob, xs = _knapsack(problem, cset.by_llm, extra)
    t2 = time.perf_counter()
    try:
        prob.solve(_solver(problem, left))
    except TimeLimitReached:
        return time_limit_plan(name, dict(stats, build_s=t2 - t1,
                                          total_s=cset.seconds + (time.perf_counter() - t1)))
    t3 = time.perf_counter()
    status, _, bound = _status(prob)
    stats.update(build_s=t2 - t1, solve_s=t3 - t2, total_s=cset.seconds + (t3 - t1),
                 variables=sum(len(v) for v in xs.values()), solver=SOLVER)
    if status == "time_limit_no_solution":
        return time_limit_plan(name, stats)
    if status in SOLVER_FAILED:
        raise SolverStopped(status, "the allocation MILP")
    if status not in ("optimal", "time_limit"):
        if extra:  # a constrained solve (latency bounds) that has no answer
            return no_allocation_plan(optimiser=name, status="infeasible", candidates={},
                                      stats=stats)
        return _diagnosed(problem, cset, name, stats, left)
    choice = _chosen(xs)
    return plan_from_choice(problem, name, status, choice, stats,  # type: ignore[arg-type]
                            bound_s=bound + problem.constant_s)


def _percentile_bounds(problem: PlanningProblem) -> dict[str, tuple[float, float]]:
    """The percentile bounds of the targeted workflows: workflow -> (percentile, seconds)."""
    return {w: b for w, b in problem.options.latency_bounds.items() if w in problem.targets}


def _path_weight(s: LLMStats) -> float:
    """An LLM's mean critical-path weight in a workflow (units of its mean call): the ``Σ_c k_c``
    the candidates' per-workflow latencies are weighted by (scepsy_opt.prediction.pipeline)."""
    return s.critical_s / s.mean_call_s if s.mean_call_s > 0 else s.critical_calls


def unit_latency(problem: PlanningProblem, workflow: str, cand: Candidate) -> float:
    """The unit latency (s) of ``cand``'s LLM for ``workflow``: its contribution to the
    workflow's mean latency over the LLM's mean critical-path weight (0 when off every path)."""
    k = _path_weight(problem.stats[workflow].llms[cand.llm])
    return dict(cand.workflow_latency_s).get(workflow, 0.0) / k if k > 0 else 0.0


def percentile_latencies(problem: PlanningProblem, choice: Mapping[str, Candidate],
                         ) -> dict[str, float]:
    """Per percentile-bounded workflow, its predicted percentile (s) under ``choice``."""
    out = {}
    for w, (q, _) in _percentile_bounds(problem).items():
        u = {m: unit_latency(problem, w, choice[m]) for m in problem.stats[w].llms}
        out[w] = latency_quantiles(problem.stats[w].paths, u, (q,))[0]
    return out


def _meets(value: float, bound: float) -> bool:
    return value <= bound * (1.0 + 1e-9)


def _bound_report(problem: PlanningProblem, choice: Mapping[str, Candidate] | None,
                  ) -> dict[str, dict[str, Any]]:
    """``stats["latency_bounds"]``: each bound, its predicted percentile and whether it is met."""
    got = percentile_latencies(problem, choice) if choice is not None else {}
    return {w: {"percentile": q, "bound_s": b, "predicted_s": got.get(w),
                "met": (w in got and _meets(got[w], b))}
            for w, (q, b) in _percentile_bounds(problem).items()}


def _solve_rows(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
                rows: list[Row], deadline: Deadline,
                ) -> tuple[str, dict[str, Candidate] | None, float, float]:
    """(status, choice, objective, dual bound) of the min-cost MILP with ``rows``."""
    prob, xs = _knapsack(problem, cands, rows)
    prob.solve(_solver(problem, deadline))
    status, _, bound = _status(prob)
    if status not in ("optimal", "time_limit"):
        return status, None, math.inf, math.inf
    choice = _chosen(xs)
    return status, choice, _cost(choice), bound


def dominance_cut(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
                  unit: Mapping[Candidate, float], choice: Mapping[str, Candidate],
                  w: str) -> Row:
    """``choice`` violates workflow ``w``'s percentile bound, and so does every choice no
    faster on any LLM (the percentile grows with each unit latency ``unit``): one of ``w``'s
    LLMs must get a faster candidate."""
    llms = [m for m in problem.stats[w].llms if _path_weight(problem.stats[w].llms[m]) > 0]
    coeffs: dict[Candidate, float] = {}
    for m in llms:
        at = unit[choice[m]]
        coeffs.update((c, 1.0) for c in cands[m] if unit[c] >= at)
    return coeffs, len(llms) - 1.0


def percentile_row(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
                   unit: Mapping[Candidate, float], choice: Mapping[str, Candidate], w: str,
                   bound: tuple[float, float], valid: bool) -> Row:
    """Workflow ``w``'s percentile bound ``(q, seconds)`` as a linear row at ``choice``: the
    floor cut (``valid``: holds for every choice) or the linearisation (steering only)."""
    q, b = bound
    u = {m: unit[choice[m]] for m in problem.stats[w].llms}
    a, off = (floor_cut if valid else linearise)(problem.stats[w].paths, u, q)
    coeffs: dict[Candidate, float] = {}
    for m, am in a.items():
        if am > 0:
            for c in cands[m]:
                coeffs[c] = coeffs.get(c, 0.0) + am * unit[c]
    return coeffs, b - off


def _percentile_bounded(problem: PlanningProblem, cset: CandidateSet, extra: list[Row], name: str,
                        stats: dict[str, Any], deadline: Deadline) -> Plan:
    """Min-latency within the percentile bounds by lazy constraints (module docstring)."""
    t0 = time.perf_counter()
    bounds = _percentile_bounds(problem)
    cands = cset.by_llm
    # every candidate's unit latency per bounded workflow, once
    unit = {w: {c: unit_latency(problem, w, c) for m in problem.stats[w].llms for c in cands[m]}
            for w in bounds}
    # a proof of infeasibility at no cost: the fastest candidate of every LLM (the percentile
    # only grows with any unit latency)
    for w, (q, b) in bounds.items():
        llms = problem.stats[w].llms
        fastest = {m: min(unit[w][c] for c in cands[m]) for m in llms}
        least = latency_quantiles(problem.stats[w].paths, fastest, (q,))[0]
        if not _meets(least, b):
            return _bound_infeasible(problem, name, stats, t0, (
                f"{w}'s predicted p{q:g} latency is at least {least:.4g} s (every LLM on its "
                f"fastest candidate at the targets), above the bound of {b:g} s"), proven=True)

    def violated(choice: Mapping[str, Candidate]) -> list[str]:
        got = percentile_latencies(problem, choice)
        return [w for w, (_, b) in bounds.items() if not _meets(got[w], b)]

    def nogood(choice: Mapping[str, Candidate], w: str) -> Row:
        return dominance_cut(problem, cands, unit[w], choice, w)

    def lin_row(w: str, choice: Mapping[str, Candidate], valid: bool = False) -> Row:
        return percentile_row(problem, cands, unit[w], choice, w, bounds[w], valid)

    nogoods: list[Row] = []
    lins: list[Row] = []
    best: dict[str, Candidate] | None = None
    proven = False  # best is optimal (or, without best, no allocation meets the bounds)
    lower = 0.0  # every cost is >= 0: a bound before any relaxation is solved
    solves = 0
    try:
        # 1. linearised rows steer towards a verified choice
        for _ in range(LINEARISE_ITERS):
            status, choice, obj, bound = _solve_rows(problem, cands, extra + nogoods + lins,
                                                     deadline)
            solves += 1
            if status == "time_limit_no_solution":
                raise TimeLimitReached("time limit")
            if choice is None and not lins:  # infeasible before any bound: as without bounds
                if extra:
                    return no_allocation_plan(optimiser=name, status="infeasible", candidates={},
                                              stats=dict(stats, latency_bound_solves=solves))
                return _diagnosed(problem, cset, name, stats, deadline)
            if choice is None:  # the linearised rows admit nothing
                break
            if not lins:  # a relaxation of the bounded problem
                lower = max(lower, bound)
            bad = violated(choice)
            if not bad:
                best = choice
                proven = not lins and status == "optimal"
                break
            nogoods.append(nogood(choice, bad[0]))
            nogoods.extend(lin_row(w, choice, valid=True) for w in bad)
            lins.extend(lin_row(w, choice) for w in bad)
        # 2. the exact check: valid cuts only, cheaper than the best verified choice
        for _ in range(EXACT_ITERS if not proven else 0):
            cut: list[Row] = []
            if best is not None:
                z = _cost(best)
                cut = [({c: c.cost for m in cands for c in cands[m]}, z - 1e-9 * max(1.0, abs(z)))]
            status, choice, obj, bound = _solve_rows(problem, cands, extra + nogoods + cut,
                                                     deadline)
            solves += 1
            if status == "time_limit_no_solution":
                break
            if choice is None:  # nothing cheaper left: the best verified choice is optimal
                proven = status == "infeasible"
                if best is not None:
                    lower = _cost(best)
                break
            lower = max(lower, bound if math.isfinite(bound) else obj)
            bad = violated(choice)
            if not bad:
                best, proven = choice, status == "optimal"
                break
            nogoods.append(nogood(choice, bad[0]))
            nogoods.extend(lin_row(w, choice, valid=True) for w in bad)
    except TimeLimitReached:
        if best is None:
            return time_limit_plan(name, dict(stats, latency_bound_solves=solves,
                                              total_s=cset.seconds + time.perf_counter() - t0))
    stats = dict(stats, latency_bound_solves=solves, solver=SOLVER,
                 total_s=cset.seconds + time.perf_counter() - t0)
    if best is None:
        if proven:
            why = (f"no allocation of the candidates meets the percentile bounds "
                   f"({_bounds_text(bounds)}): every one that fits the GPUs misses one")
        else:
            why = (f"no allocation found whose predicted percentiles meet the bounds "
                   f"({_bounds_text(bounds)}) in {solves} solves (not proven impossible: a longer "
                   "search or a looser bound may find one)")
        return _bound_infeasible(problem, name, stats, t0, why, proven=proven)
    stats["latency_bounds"] = _bound_report(problem, best)
    stats["latency_bounds_verified"] = True
    stats["latency_bounds_optimal"] = proven
    status_ = "optimal" if proven else "time_limit"
    bound_s = (_cost(best) if proven else min(lower, _cost(best))) + problem.constant_s
    return plan_from_choice(problem, name, status_, best, stats,  # type: ignore[arg-type]
                            bound_s=bound_s)


def _bounds_text(bounds: Mapping[str, tuple[float, float]]) -> str:
    return ", ".join(f"{w} p{q:g} <= {b:g} s" for w, (q, b) in bounds.items())


def _bound_infeasible(problem: PlanningProblem, name: str, stats: Mapping[str, Any], t0: float,
                      detail: str, *, proven: bool) -> Plan:
    """The infeasible plan of percentile bounds no allocation was found to meet."""
    info = Infeasibility("latency", detail, 0.0, {w: 0.0 for w in problem.targets}, None, ())
    st = dict(stats, latency_bounds=_bound_report(problem, None), latency_bounds_verified=False,
              latency_bounds_proven_infeasible=proven)
    st.setdefault("total_s", time.perf_counter() - t0)
    return no_allocation_plan(optimiser=name, status="infeasible", candidates={}, stats=st,
                              infeasible=info, scale=0.0)


def _diagnosed(problem: PlanningProblem, cset: CandidateSet, name: str, stats: Mapping[str, Any],
               deadline: Deadline, shapes_: Shapes | None = None) -> Plan:
    """:func:`diagnose` within what remains of ``deadline``. The problem is infeasible (proven);
    when the time runs out before the diagnosis it stays so, without one."""
    try:
        return diagnose(problem, cset, name, stats, deadline=deadline, shapes_=shapes_)
    except TimeLimitReached:
        return no_allocation_plan(optimiser=name, status="infeasible", candidates={},
                                  stats=dict(stats, diagnosis="time_limit"))


def capacity_shapes(problem: PlanningProblem, deadline: Deadline | None = None,
                    ) -> dict[str, list[Shape]]:
    """Per LLM, the shapes that fit: ``(gpu, tp, share, units per replica, μ per replica)``.

    For max-throughput only capacity matters, and per GPU type and units per replica only the
    shape with the largest μ is kept (a smaller μ for the same GPUs never helps). With a memory
    grid (two resources) shapes also carry memory units per replica (:class:`Shape`), and one
    is kept unless another of the type has no more units, no more memory units and no less μ.
    """
    out: dict[str, list[Shape]] = {}
    seen: dict[tuple[Any, ...], list[Shape]] = {}  # LLMs of equal curves share their shapes
    for m in problem.llms:
        if deadline is not None:  # the plan's time limit (TimeLimitReached)
            deadline.check()
        key = curve_key(problem, m)
        if key not in seen:
            seen[key] = _llm_shapes(problem, m)
        out[m] = list(seen[key])
    return out


def _llm_shapes(problem: PlanningProblem, m: str) -> list[Shape]:
    """:func:`capacity_shapes` of one LLM."""
    dem = problem.demands[m]
    if problem.options.memory_shares is not None:
        return _pareto_shapes([
            Shape(gpu, tp, curve.share, gpu_units(tp, curve.share), curve.mu,
                  gpu_units(tp, curve.memory_share), curve.memory_share)
            for gpu, tp, curve in fitting_curves(problem, m, dem)])
    best: dict[tuple[str, int], Shape] = {}
    for gpu, tp, curve in fitting_curves(problem, m, dem):
        per = gpu_units(tp, curve.share)
        key = (gpu, per)
        if key not in best or curve.mu > best[key][4]:
            best[key] = Shape(gpu, tp, curve.share, per, curve.mu)
    return [best[k] for k in sorted(best)]


def _pareto_shapes(shapes_: list[Shape]) -> list[Shape]:
    """The shapes no other of their GPU type matches or beats on units, memory units and μ
    (ties: fewer units, fewer memory units, larger μ, then tp, share, memory share)."""
    order = sorted(shapes_, key=lambda s: (s[0], s[3], s.mem_units, -s[4], s[1], s[2],
                                          s.memory_share or 0.0))
    kept: list[Shape] = []
    for s in order:
        if not any(k[0] == s[0] and k.mem_units <= s.mem_units and k[4] >= s[4] for k in kept):
            kept.append(s)
    return kept


def max_scale(problem: PlanningProblem,
              shapes_: Shapes | None = None,
              *, budgets: Mapping[str, int] | None = None, deadline: Deadline | None = None,
              ) -> tuple[float, dict[str, Candidate], str]:
    """The largest ``s`` such that ``s`` × the targets fit at ``max_utilisation`` (exact MILP).

    One binary per (LLM, shape) chooses the shape, an integer counts its replicas:
    ``s·ℓ_m ≤ u·Σ μ·r`` (``ℓ_m`` the LLM's load, :func:`scepsy_opt.prediction.pipeline.llm_load`: every
    candidate of the scaled problem carries it, and its latency is finite) and
    ``Σ units·r ≤ budget`` per GPU type. ``budgets`` (GPUs per type) replaces the cluster's
    (the shapes stay the cluster's). The scale returned is the one the chosen replicas carry
    (:func:`scepsy_opt.prediction.pipeline.carried_scale`), not the solver's float.
    """
    try:
        shp = shapes_ if shapes_ is not None else capacity_shapes(problem, deadline)
    except TimeLimitReached:
        return 0.0, {}, "time_limit_no_solution"
    if any(not v for v in shp.values()):
        return 0.0, {}, "infeasible"
    budgets = dict(budgets) if budgets is not None else problem.cluster.budgets()
    u = problem.options.max_utilisation
    two = any(sh.mem_units != sh[3] for v in shp.values() for sh in v if isinstance(sh, Shape))
    if len(budgets) == 1 and not two:
        return _max_scale_one_type(problem, shp, budgets)
    prob = pulp.LpProblem("scepsy_max_throughput", pulp.LpMaximize)
    s = prob.add_variable("scale", 0, None)
    ys: dict[str, list[tuple[Shape, Any, Any]]] = {}
    n = 0
    for m in sorted(shp):
        ys[m] = []
        for sh in shp[m]:
            top = budgets[sh[0]] * UNITS // sh[3]
            if two:
                top = min(top, budgets[sh[0]] * UNITS // sh.mem_units)
                if top < 1:  # not one replica fits the memory budget: not a choice
                    continue
            y = prob.add_variable(f"y{n}", 0, 1, pulp.LpBinary)
            r = prob.add_variable(f"r{n}", 0, top, pulp.LpInteger)
            prob += pulp.LpAffineExpression([(r, 1), (y, -top)]) <= 0, f"link{n}"
            prob += pulp.LpAffineExpression([(r, 1), (y, -1)]) >= 0, f"min{n}"
            ys[m].append((sh, y, r))
            n += 1
    prob += pulp.LpAffineExpression([(s, 1.0)])
    for j, m in enumerate(ys):
        lam = problem.loads[m]
        prob += pulp.LpAffineExpression([(y, 1) for _, y, _ in ys[m]]) == 1, f"one{j}"
        prob += (pulp.LpAffineExpression([(s, lam)] + [(r, -u * sh[4]) for sh, _, r in ys[m]])
                 <= 0, f"load{j}")
    for gpu, g in budgets.items():
        terms = [(r, sh[3]) for m in ys for sh, _, r in ys[m] if sh[0] == gpu]
        if terms:
            prob += pulp.LpAffineExpression(terms) <= g * UNITS, f"budget_{gpu}"
        if two:
            terms = [(r, sh.mem_units) for m in ys for sh, _, r in ys[m] if sh[0] == gpu]
            if terms:
                prob += pulp.LpAffineExpression(terms) <= g * UNITS, f"mem_budget_{gpu}"
    if two and any(not v for v in ys.values()):
        return 0.0, {}, "infeasible"
    try:
        prob.solve(_solver(problem, deadline))
    except TimeLimitReached:
        return 0.0, {}, "time_limit_no_solution"
    status, _, _ = _status(prob)
    if status not in ("optimal", "time_limit"):
        return 0.0, {}, status
    choice = {}
    for m, triples in ys.items():
        sh, _, r = max(triples, key=lambda t: (t[1].value() or 0.0))
        reps = max(1, round(r.value() or 0))
        choice[m] = _shape_candidate(m, sh, reps)
    scale = min(headroom(problem, choice).values())
    return (scale if math.isfinite(scale) else float(s.value() or 0.0)), choice, status


SCALE_BOUND_REL = 1e-4  # the relative precision of :func:`scale_upper_bound`'s bisection


def unit_needs(problem: PlanningProblem, shapes_: Shapes, types: Sequence[str],
               least: Mapping[str, Sequence[int]] | None = None,
               ) -> Callable[[float], np.ndarray]:
    """``need(scale)``: per LLM (rows, in sorted order) and GPU type of ``types`` (columns), the
    fewest GPU units that carry the LLM's load at ``scale`` with one of its shapes on that type,
    ``units·min_replicas(scale·ℓ, μ)`` (whole replicas at ``max_utilisation``,
    :func:`~scepsy_opt.prediction.pipeline.replicas_needed`); ``inf`` where it has no shape
    there. What :func:`scale_upper_bound` and the price bound
    (:func:`scepsy_opt.planning.mincost.cost_lower_bound`) count. ``least``: per LLM, per shape
    (in ``shapes_``'s order), the fewest replicas it may run whatever the load (for example
    those its latency bound needs)."""
    u = problem.options.max_utilisation
    llms = sorted(shapes_)
    index = {t: j for j, t in enumerate(types)}
    # every (LLM, shape) as flat arrays: LLM row, type column, units, μ, load, least replicas
    flat = [(i, index[sh[0]], sh[3], sh[4], problem.loads[m],
             least[m][k] if least is not None and m in least else 1)
            for i, m in enumerate(llms) for k, sh in enumerate(shapes_[m]) if sh[0] in index]
    row = np.array([x[0] for x in flat], dtype=np.int64)
    col = np.array([x[1] for x in flat], dtype=np.int64)
    units = np.array([x[2] for x in flat], dtype=float)
    mu = np.array([x[3] for x in flat], dtype=float)
    load = np.array([x[4] for x in flat], dtype=float)
    fewest = np.array([x[5] for x in flat], dtype=float)

    def need(scale: float) -> np.ndarray:
        reps = np.maximum(replicas_needed(scale * load, mu, u), fewest)
        f = np.full((len(llms), len(types)), np.inf)
        np.minimum.at(f, (row, col), units * reps)
        return f
    return need


def scale_upper_bound(problem: PlanningProblem, shapes_: Shapes | None = None, *,
                      deadline: Deadline | None = None, one_type: bool = False) -> float:
    """An upper bound on the scale of every allocation (placed or not), much tighter than the
    LP relaxation of :func:`max_scale` when LLMs need few replicas each.

    At scale ``s`` an LLM ``m`` on GPU type ``t`` needs at least
    ``f_mt(s) = min over its shapes on t of units·min_replicas(s·ℓ_m, μ)`` units (whole replicas:
    the rounding the LP relaxation loses is kept). Scale ``s`` is possible only if the LP
    ``Σ_t y_mt = 1, Σ_m f_mt(s)·y_mt ≤ budget_t, y ≥ 0`` is feasible (every allocation gives an
    integer ``y``); ``f`` grows with ``s``, so bisection finds the largest feasible ``s`` (to
    :data:`SCALE_BOUND_REL`, rounded up). With memory shares (two resources) the memory
    budgets are left out (a relaxation, still a bound). ``inf`` when the time runs out first.

    ``one_type``: ``y`` binary, every LLM on one GPU type (a MILP per probe): the bound over the
    allocations that do not split an LLM across GPU types, which max-throughput's plans never
    do; the difference between the two bounds is the part of a gap that comes from letting an
    LLM split. A probe the MILP does not settle in the time left counts as feasible (the bound
    stays valid, only looser)."""
    left = Deadline.of(problem, deadline)
    shp = shapes_ if shapes_ is not None else capacity_shapes(problem, left)
    if any(not v for v in shp.values()):
        return 0.0
    budgets = problem.cluster.budgets()
    types = sorted(budgets)
    llms = sorted(shp)
    need = unit_needs(problem, shp, types)

    def feasible(scale: float) -> Probe[None]:
        if left.remaining() <= 0:
            return Probe(False, stop=True)
        f = need(scale)
        if np.any(np.all(~np.isfinite(f), axis=1)):
            return Probe(False)
        ii, jj = np.nonzero(np.isfinite(f))  # one column per (LLM, type) it can run on
        n = len(ii)
        rows_eq = coo_matrix((np.ones(n), (ii, np.arange(n))), shape=(len(llms), n))
        rows_ub = coo_matrix((f[ii, jj], (jj, np.arange(n))), shape=(len(types), n))
        b_ub = [budgets[t] * UNITS for t in types]
        if one_type:
            out = milp(np.zeros(n), integrality=np.ones(n), bounds=Bounds(0, 1),
                       constraints=[LinearConstraint(rows_ub, -np.inf, b_ub),
                                    LinearConstraint(rows_eq, 1.0, 1.0)],
                       options={"time_limit": max(left.remaining(), 1e-3)})
            return Probe(out.status != 2)  # 2: proven infeasible; a time limit proves nothing
        res = linprog(np.zeros(n), A_ub=rows_ub, b_ub=b_ub,
                      A_eq=rows_eq, b_eq=np.ones(len(llms)), bounds=(0, 1), method="highs")
        return Probe(res.status == 0)

    hi = 1.0
    while feasible(hi).accepted:  # an infeasible upper end (every scale below is feasible)
        hi *= 2.0
        if hi > 1e9:
            return math.inf
    lo = hi / 2 if hi > 1 else 0.0  # the last doubling was feasible
    found = largest_accepted(feasible, hi, rel=SCALE_BOUND_REL, max_steps=200, lo=lo,
                             first=(lo + hi) / 2)
    return math.inf if found.stopped else found.hi


def _max_scale_one_type(problem: PlanningProblem,
                        shp: Shapes,
                        budgets: Mapping[str, int]) -> tuple[float, dict[str, Candidate], str]:
    """:func:`max_scale` on one GPU type, exactly and without a MILP: the LLMs do not interact
    except through the budget, so at scale ``s`` each takes its fewest-unit shape and replica
    count (:func:`scepsy_opt.prediction.pipeline.min_replicas` of its load ``s·ℓ``); bisect on ``s``, then
    move to the breakpoint the choices reach.
    """
    u = problem.options.max_utilisation
    budget = next(iter(budgets.values())) * UNITS
    lam = problem.loads

    def pick(scale: float) -> tuple[int, dict[str, tuple[Shape, int]]]:
        total, choice = 0, {}
        for m, options in shp.items():
            best = None
            for sh in options:
                r = min_replicas(scale * lam[m], sh[4], u)
                if best is None or (sh[3] * r, -sh[4] * r) < (best[0][3] * best[1], -best[0][4] * best[1]):
                    best = (sh, r)
            assert best is not None
            choice[m] = best
            total += best[0][3] * best[1]
        return total, choice

    if pick(0.0)[0] > budget:
        return 0.0, {}, "infeasible"
    lo = largest_accepted(lambda x: Probe(pick(x)[0] <= budget), math.inf,
                          rel=ONE_TYPE_REL, max_steps=200).lo
    _, choice = pick(lo)
    cands = {m: Candidate(m, sh[0], sh[1], sh[2], r, sh[3] * r, sh[4], math.nan, 0.0, 0.0)
             for m, (sh, r) in choice.items()}
    return max(min(headroom(problem, cands).values()), lo), cands, "optimal"


def _shape_candidate(llm: str, sh: Shape, reps: int) -> Candidate:
    """``reps`` replicas of a capacity shape as an (unpriced) :class:`Candidate`."""
    mem = getattr(sh, "memory_share", None)
    return Candidate(llm, sh[0], sh[1], sh[2], reps, sh[3] * reps, sh[4], math.nan, 0.0, 0.0,
                     memory_share=mem)


GAIN_REL = 1e-9  # a max scale this much (relative) above another is a gain, not rounding


def scale_gains(problem: PlanningProblem, scale: float,
                shapes_: Shapes | None = None,
                *, deadline: Deadline | None = None) -> tuple[tuple[str, ...], dict[str, float]]:
    """Which GPU types bound the max scale ``scale`` (:func:`max_scale`), and what one more GPU
    of each would add: ``(binding, gain per GPU)``.

    A type is *binding* when more of it alone raises the max scale: :func:`max_scale` with that
    type's budget doubled (the cluster's shapes, every other budget as it is) exceeds ``scale``
    by more than :data:`GAIN_REL`. Its gain is the rise of the max scale with one more GPU of
    it (0 when one GPU is not enough: a replica needs more, or another LLM bounds the scale
    next); when that gain is positive the type binds without the doubled solve (the max scale
    never falls with more GPUs). A type whose solve ends without proven optimum is left out of
    the answer it would decide.
    """
    shp = shapes_ if shapes_ is not None else capacity_shapes(problem)
    budgets = problem.cluster.budgets()
    binding: list[str] = []
    gains: dict[str, float] = {}

    def more(gpu: str, gpus: int) -> float | None:
        s, _, status = max_scale(problem, shp, budgets={**budgets, gpu: gpus}, deadline=deadline)
        return s if status == "optimal" else None

    for gpu in sorted(budgets):
        if not any(sh[0] == gpu for v in shp.values() for sh in v):
            gains[gpu] = 0.0  # no LLM runs there: more of it changes nothing
            continue
        one = more(gpu, budgets[gpu] + 1)
        if one is not None and one > scale * (1 + GAIN_REL):  # then doubling raises it too
            binding.append(gpu)
            gains[gpu] = one - scale
            continue
        if one is not None:
            gains[gpu] = 0.0
        doubled = one if budgets[gpu] == 1 else more(gpu, 2 * budgets[gpu])
        if doubled is not None and doubled > scale * (1 + GAIN_REL):
            binding.append(gpu)
    return tuple(binding), gains


def diagnose(problem: PlanningProblem, cset: CandidateSet, name: str,
             stats: Mapping[str, Any], *, deadline: Deadline | None = None,
             shapes_: Shapes | None = None) -> Plan:
    """An infeasible plan that says why: a model that fits nowhere, or how far the GPUs go
    (the max scale, its bottleneck LLM, the binding GPU types and what one more GPU of each
    adds, :func:`scale_gains`). ``shapes_``: the problem's :func:`capacity_shapes` when the
    caller has them."""
    if cset.unfit:
        models = ", ".join(f"{m} ({problem.models[m]})" for m in cset.unfit)
        info = Infeasibility("memory", f"{models} fits on no GPU of the cluster with any TP degree "
                             "and share of the grid", 0.0, {w: 0.0 for w in problem.targets},
                             cset.unfit[0], tuple(cset.unfit))
        return no_allocation_plan(optimiser=name, status="infeasible", candidates={},
                                  stats=dict(stats), infeasible=info, scale=0.0)
    slo_missed = [m for m in problem.options.slos if not cset.by_llm.get(m)]
    if slo_missed:
        return _slo_diagnosis(problem, slo_missed, name, stats)
    shp = shapes_ if shapes_ is not None else capacity_shapes(problem, deadline)
    scale, choice, st = max_scale(problem, shp, deadline=deadline)
    if st == "time_limit_no_solution":
        raise TimeLimitReached("the time limit ran out before the max scale was found")
    # the LLM with the least headroom at the max-scale allocation bounds the scale
    heads = headroom(problem, choice)
    bottleneck = min(heads, key=lambda m: (heads[m], m)) if heads else None
    binding, gains = scale_gains(problem, scale, shp, deadline=deadline)
    tput = {w: scale * t for w, t in problem.targets.items()}
    if binding:
        adds = ", ".join(f"{g} +{gains[g]:.4g}x" if g in gains else f"{g} unknown (time limit)"
                         for g in binding)
        where = f"more {', '.join(binding)} GPUs raise it (one more GPU: {adds})"
    else:
        both, _, _ = max_scale(problem, shp, budgets={g: 2 * n for g, n in
                                                     problem.cluster.budgets().items()},
                               deadline=deadline)
        where = ("no GPU type alone raises it, only more GPUs of several types together"
                 if both > scale * (1 + GAIN_REL) else "twice the GPUs of every type do not raise it")
    detail = (f"the targets need more GPUs than the cluster has: at most {scale:.4g}x the targets "
              f"({', '.join(f'{w} {v:.4g} req/s' for w, v in tput.items())}), bounded by "
              f"{bottleneck}; {where}")
    info = Infeasibility("gpus", detail, scale, tput, bottleneck, binding,
                         MappingProxyType(dict(sorted(gains.items()))))
    return no_allocation_plan(optimiser=name, status="infeasible", candidates={}, stats=dict(stats),
                              infeasible=info, scale=scale)


def _slo_diagnosis(problem: PlanningProblem, llms: list[str], name: str,
                   stats: Mapping[str, Any]) -> Plan:
    """An infeasible plan for LLMs whose SLO no candidate meets: beyond every shape even at
    zero load (with the best zero-load figures), or needing more replicas than the GPUs give."""
    parts = []
    for m in llms:
        slo = problem.options.slos[m]
        ttft, tpot = slo_floors(problem, m)
        floor_ok = ((slo.ttft_s is None or ttft <= slo.ttft_s * (1 + 1e-9))
                    and (slo.tpot_s is None or tpot <= slo.tpot_s * (1 + 1e-9)))
        if floor_ok:
            parts.append(f"{m}'s SLO ({slo.describe()}) needs more GPUs than the cluster has at "
                         "the targets")
        else:
            parts.append(f"{m}'s SLO ({slo.describe()}) is beyond every instance shape even at "
                         f"zero load (best: ttft {ttft:.4g} s, tpot {tpot:.4g} s)")
    info = Infeasibility("latency", "; ".join(parts), 0.0, {w: 0.0 for w in problem.targets},
                         llms[0], tuple(llms))
    return no_allocation_plan(optimiser=name, status="infeasible", candidates={}, stats=dict(stats),
                              infeasible=info, scale=0.0)


def solve_max_throughput(problem: PlanningProblem, name: str = "milp", *,
                         deadline: Deadline | None = None) -> Plan:
    """The largest scale of the targets the cluster carries, within the latency bounds and the
    LLMs' SLOs if set.

    Within ``deadline`` (default: the problem's time limit from now): a bisection it cuts short
    returns the largest scale found so far with status ``time_limit``; without any, the status
    is ``time_limit_no_solution`` (:class:`TimeLimitReached` from the steps it cannot cut)."""
    left = Deadline.of(problem, deadline)
    t0 = time.perf_counter()
    try:  # the shapes once: the max scale and, if it is 0, the diagnosis
        shp = capacity_shapes(problem, left)
    except TimeLimitReached:
        return time_limit_plan(name, {"total_s": time.perf_counter() - t0})
    scale, choice, status = max_scale(problem, shp, deadline=left)
    if status == "time_limit_no_solution":
        return time_limit_plan(name, {"total_s": time.perf_counter() - t0})
    bounds = dict(problem.options.latency_bound_s) or _percentile_bounds(problem)
    if not choice or scale <= 0:
        cset = generate_candidates(problem, deadline=left)
        return _diagnosed(problem, cset, name, {"total_s": time.perf_counter() - t0}, left, shp)
    if not bounds and not problem.options.slos:  # the capacity optimum; priced at that load
        scaled = problem.scaled(scale * (1 - 1e-9))
        priced = price(scaled, plan_from_choice(scaled, name, "optimal", choice, {}).allocation)  # type: ignore[arg-type]
        return plan_from_choice(scaled, name, status, priced,  # type: ignore[arg-type]
                                {"total_s": time.perf_counter() - t0}, scale=scale)
    # bisection on the scale with latency-bounded min-latency solves, full capacity first (the
    # SLOs too: their candidates thin out as the rate per replica grows)

    def probe(x: float) -> Probe[Plan]:
        plan = _bounded(problem.scaled(x), name, left)
        if plan.status == "time_limit_no_solution":  # out of time: the bracket so far
            return Probe(False, stop=True)
        return Probe(plan.feasible, plan)

    found = largest_accepted(probe, scale, rel=BISECT_REL, max_steps=BISECT_STEPS)
    if found.best is None:
        if found.stopped:
            return time_limit_plan(name, {"total_s": time.perf_counter() - t0})
        cset = generate_candidates(problem, deadline=left)
        return _diagnosed(problem, cset, name, {"total_s": time.perf_counter() - t0}, left, shp)
    plan, s = found.best, found.best_at
    stats = plan.stats.updated(total_s=time.perf_counter() - t0)
    return Plan(optimiser=plan.optimiser, status="time_limit" if found.stopped else plan.status,
                allocation=plan.allocation, objective_s=plan.objective_s, bound_s=plan.bound_s,
                gap=plan.gap, candidates=plan.candidates, stats=stats, infeasible=None, scale=s)


def _bounded(problem: PlanningProblem, name: str, deadline: Deadline) -> Plan:
    """Min-latency at ``problem``'s targets within the latency bounds (one bisection step)."""
    try:
        cset = generate_candidates(problem, deadline=deadline)
    except TimeLimitReached:
        return time_limit_plan(name)
    if cset.unfit or any(not c for c in cset.by_llm.values()):
        return no_allocation_plan(optimiser=name, status="infeasible", candidates={}, stats={})
    extra: list[Row] = []
    for w, bound in problem.options.latency_bound_s.items():
        if w not in problem.targets:
            continue
        coeffs: dict[Candidate, float] = {}
        for cands in cset.by_llm.values():
            for c in cands:
                v = dict(c.workflow_latency_s).get(w)
                if v is not None:
                    coeffs[c] = v
        extra.append((coeffs, bound - problem.stats[w].tool_critical_s))
    return solve_min_latency(problem, cset, extra, name, deadline=deadline)


class MILPOptimiser:
    """The exact optimiser (module docstring)."""

    name = "milp"

    def solve(self, problem: PlanningProblem, *, deadline: Deadline | None = None) -> Plan:
        """The plan within ``deadline`` (default: the problem's time limit from now)."""
        left = Deadline.of(problem, deadline)
        if problem.options.kind.priced:  # scepsy_opt.planning.mincost builds on this module
            raise InputError("plan", "objective", "min-latency or max-throughput for "
                             "scepsy_opt.planning.milp (min-cost: scepsy_opt.planning.optimisers.optimiser('milp') "
                             "or scepsy_opt.planning.mincost.solve_min_cost)", "min-cost")
        if problem.options.kind.scales_targets:
            try:
                return solve_max_throughput(problem, self.name, deadline=left)
            except TimeLimitReached:
                return time_limit_plan(self.name)
        return solve_min_latency(problem, name=self.name, deadline=left)
