"""The exact allocation optimiser: a multiple-choice knapsack MILP (PuLP + in-process HiGHS).

One binary ``x_c`` per surviving candidate (``scepsy_opt.planning``):

* **min-latency** (default): ``min Σ_c cost_c·x_c`` s.t. ``Σ_{c∈m} x_c = 1`` for every LLM and
  ``Σ_{c on type t} units_c·x_c ≤ 1000·G_t`` for every GPU type. Every candidate already carries
  the load at ``max_utilisation``, so the throughput targets hold by construction.
* **max-throughput**: the largest scale ``s`` of the targets the cluster carries: ``max s`` s.t.
  ``s·λ_m ≤ max_utilisation · Σ_{c∈m} capacity_c·x_c``; with per-workflow latency bounds the
  answer is refined by bisection on ``s`` with min-latency solves whose workflows' latencies
  (linear in ``x``) are constrained.

Before the min-latency MILP, :func:`reduced_candidates` applies exact Lagrangian reduced-cost
fixing (prices from the LP relaxation of a coarse candidate sample; docs/optimiser.md), so large
clusters solve over a few percent of the candidates with the same optimum.

HiGHS runs in-process through PuLP's ``HiGHS`` interface, single-threaded with a fixed seed
(deterministic), with the time limit and relative gap of :class:`~scepsy_opt.planning.PlanOptions`.
The status comes from HiGHS itself (``optimal``, ``time_limit`` with the gap of its best bound,
``infeasible``). When the targets cannot be met the plan says why (:func:`diagnose`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import highspy
import pulp

from scepsy_opt.pipeline import instance_curves, llm_demand
from scepsy_opt.planning import (
    UNITS,
    Candidate,
    CandidateSet,
    Infeasibility,
    Plan,
    PlanningProblem,
    generate_candidates,
    gpu_units,
    plan_from_choice,
    price,
    register,
    shape_groups,
    units_by_gpu,
)

SEED = 0
Row = tuple[Mapping[Candidate, float], float]  # an extra MILP row: Σ coeff·x_c ≤ rhs


def _quiet_banner() -> None:
    """HiGHS prints a banner to stdout when the process creates its first solver: swallow it
    once here, so ``--json`` output stays clean."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


_quiet_banner()
SOLVER = (f"HiGHS {highspy.HIGHS_VERSION_MAJOR}.{highspy.HIGHS_VERSION_MINOR}."
          f"{highspy.HIGHS_VERSION_PATCH}")


def _solver(problem: PlanningProblem, time_limit_s: float | None = None,
            gap_rel: float | None = None, mip: bool = True) -> pulp.HiGHS:
    """HiGHS as every solve here runs it: one thread, fixed seed, the problem's limits unless
    overridden (``mip=False`` solves the LP relaxation)."""
    opts = problem.options
    return pulp.HiGHS(mip=mip, msg=False, threads=1,
                      timeLimit=time_limit_s or opts.time_limit_s,
                      gapRel=opts.gap_rel if gap_rel is None else gap_rel, gapAbs=0.0,
                      random_seed=SEED,
                      # at HiGHS's default 1e-6 a share-1.0 column can stand in for share 0.9
                      # and the plan be called optimal 2e-8 above the optimum (found by the
                      # brute-force oracle); tighter integrality makes it exact
                      mip_feasibility_tolerance=1e-9,
                      # presolve spends most of the time on these knapsacks and removes little
                      # (solvers/plan_bench.py: 2-8x faster without it, same optima)
                      presolve="off")


def _status(prob: pulp.LpProblem) -> tuple[str, float, float]:
    """(status, objective, dual bound) as HiGHS reports them."""
    h: highspy.Highs = prob.solverModel
    st = h.getModelStatus()
    info = h.getInfo()
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if st == highspy.HighsModelStatus.kOptimal:
        return "optimal", info.objective_function_value, info.mip_dual_bound
    if st == highspy.HighsModelStatus.kInfeasible:
        return "infeasible", math.inf, math.inf
    if st in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kIterationLimit,
              highspy.HighsModelStatus.kSolutionLimit, highspy.HighsModelStatus.kInterrupt):
        return ("time_limit" if has_solution else "time_limit_no_solution",
                info.objective_function_value if has_solution else math.inf, info.mip_dual_bound)
    return h.modelStatusToString(st).lower().replace(" ", "_"), math.inf, math.inf


def _knapsack(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
              extra: list[tuple[Mapping[Candidate, float], float]] | None = None,
              ) -> tuple[pulp.LpProblem, dict[str, list[tuple[Candidate, pulp.LpVariable]]]]:
    """The min-cost MILP; ``extra`` rows ``Σ coeff_c·x_c ≤ rhs``."""
    prob = pulp.LpProblem("scepsy_plan", pulp.LpMinimize)
    xs: dict[str, list[tuple[Candidate, pulp.LpVariable]]] = {}
    n = 0
    for m in sorted(cands):
        xs[m] = []
        for c in cands[m]:
            xs[m].append((c, prob.add_variable(f"x{n}", 0, 1, pulp.LpBinary)))
            n += 1
    prob += pulp.LpAffineExpression([(v, c.cost) for m in xs for c, v in xs[m]])
    for j, m in enumerate(xs):
        prob += pulp.LpAffineExpression([(v, 1) for _, v in xs[m]]) == 1, f"one_{j}"
    for i, (gpu, g) in enumerate(problem.cluster.budgets().items()):
        terms = [(v, c.units) for m in xs for c, v in xs[m] if c.gpu == gpu]
        if terms:
            prob += pulp.LpAffineExpression(terms) <= g * UNITS, f"budget_{i}"
    for j, (coeffs, rhs) in enumerate(extra or []):
        terms = [(v, coeffs[c]) for m in xs for c, v in xs[m] if c in coeffs]
        prob += pulp.LpAffineExpression(terms) <= rhs, f"extra_{j}"
    return prob, xs


def _chosen(xs: Mapping[str, list[tuple[Candidate, pulp.LpVariable]]]) -> dict[str, Candidate]:
    out = {}
    for m, pairs in xs.items():
        out[m] = max(pairs, key=lambda p: (p[1].value() or 0.0))[0]
    return out


def _prices(problem: PlanningProblem, cands: CandidateSet) -> dict[str, float]:
    """Per GPU type, the LP relaxation's budget dual (a price per GPU unit, ≥ 0)."""
    prob, _ = _knapsack(problem, cands.by_llm)
    prob.solve(_solver(problem, mip=False))
    prices = {}
    for i, gpu in enumerate(problem.cluster.budgets()):
        con = prob.get_constraint_by_name(f"budget_{i}")
        prices[gpu] = max(0.0, -(con.pi or 0.0)) if con is not None else 0.0
    return prices


def _greedy(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
            prices: Mapping[str, float]) -> float:
    """The cost of a feasible allocation near the Lagrangian optimum (``inf`` if none found):
    per LLM the least ``v = cost + π·units`` (fewest units on ties), then, while a GPU type is
    over budget, the move off it that adds the least cost per unit freed."""
    budgets = problem.cluster.budgets()
    choice = {m: min(cs, key=lambda c: (c.cost + prices[c.gpu] * c.units, c.units))
              for m, cs in cands.items()}
    for _ in range(10 * len(choice) + 10):
        over = sorted(g for g, u in units_by_gpu(choice.values()).items() if u > budgets[g] * UNITS)
        if not over:
            return sum(c.cost for c in choice.values())
        g = over[0]
        moves = [((c.cost - choice[m].cost) / max(choice[m].units - (c.units if c.gpu == g else 0), 1),
                  m, c.units, c)
                 for m, cs in cands.items() if choice[m].gpu == g
                 for c in cs if c.units < choice[m].units or c.gpu != g]
        if not moves:
            return math.inf
        _, m, _, c = min(moves, key=lambda t: t[:3])
        choice[m] = c
    return math.inf


def reduced_candidates(problem: PlanningProblem, *, blocks: bool = False,
                       rows: Callable[[Mapping[str, Sequence[Candidate]]], list[Row]] | None = None,
                       ) -> CandidateSet:
    """Candidates after exact Lagrangian reduced-cost fixing (:func:`generate_candidates`).

    1. A coarse sample of replica counts gives prices π (LP duals) and a feasible allocation.
    2. A full scan keeping only candidates within a hair of each LLM's least ``v = cost + π·units``
       gives the exact Lagrangian bound ``LB`` and a tighter feasible allocation (``UB``).
    3. If ``UB − LB`` exceeds that hair, a last scan keeps every candidate whose reduced cost is
       at most ``UB − LB``: no cheaper allocation uses any other. The MILP over the result has
       the optimum of the full candidate set.

    ``blocks`` counts GPUs as whole-GPU blocks (:func:`generate_candidates`); ``rows`` gives the
    extra rows of the final MILP for a candidate set (the block capacity rows). ``LB`` relaxes
    them (still a bound), and ``UB`` then comes from the MILP over the sample and the near set
    with those rows, so that it is feasible for the final problem.
    """
    t0 = time.perf_counter()
    cache: dict[tuple[str, str, int], list[Any]] = {}
    gen = functools.partial(generate_candidates, problem, curve_cache=cache, blocks=blocks)
    coarse = gen(coarse=True)
    if coarse.unfit or any(not c for c in coarse.by_llm.values()):
        return gen()
    prices = _prices(problem, coarse)
    budgets = problem.cluster.budgets()
    fixed = sum(prices[g] * budgets[g] * UNITS for g in budgets)
    ub = _greedy(problem, coarse.by_llm, prices) if rows is None else math.inf
    hair = 1e-4 * abs(ub) if math.isfinite(ub) else 0.0
    near = gen(prices=prices, slack=hair)
    lb = sum(near.least_price.values()) - fixed
    if rows is None:
        ub = min(ub, _greedy(problem, near.by_llm, prices))
    if ub - lb > hair:  # a tighter UB: the MILP over the sample and the near-optimal candidates
        pool = {m: tuple(sorted(set(coarse.by_llm[m]) | set(near.by_llm.get(m, ())),
                                key=lambda c: (c.gpu, c.units, c.cost, c.tp, c.share)))
                for m in coarse.by_llm}
        prob, xs = _knapsack(problem, pool, rows(pool) if rows is not None else None)
        prob.solve(_solver(problem, time_limit_s=min(problem.options.time_limit_s, 5.0),
                           gap_rel=1e-6))
        if _status(prob)[0] in ("optimal", "time_limit"):
            ub = min(ub, sum(c.cost for c in _chosen(xs).values()))
    generated = coarse.generated + near.generated
    if not math.isfinite(ub):
        full = gen()
    elif ub - lb <= hair:
        full = near
    else:
        full = gen(prices=prices, slack=(ub - lb) * (1 + 1e-9) + 1e-12)
        generated += full.generated
    return CandidateSet(full.by_llm, generated, full.kept, full.curves, full.unfit,
                        time.perf_counter() - t0, full.least_price)


def solve_min_latency(problem: PlanningProblem, cset: CandidateSet | None = None,
                      extra: list[tuple[Mapping[Candidate, float], float]] | None = None,
                      name: str = "milp") -> Plan:
    """Min weighted latency at the targets (see the module docstring)."""
    if cset is None:
        reduce = problem.options.reduce
        if reduce is None:
            reduce = problem.cluster.total_gpus >= 64
        cset = reduced_candidates(problem) if reduce else generate_candidates(problem)
    stats: dict[str, Any] = {"candidates_generated": cset.generated, "candidates_kept": cset.kept,
                             "serving_curves": cset.curves, "candidates_s": cset.seconds}
    if cset.unfit or any(not c for c in cset.by_llm.values()):
        return diagnose(problem, cset, name, stats)
    t1 = time.perf_counter()
    prob, xs = _knapsack(problem, cset.by_llm, extra)
    t2 = time.perf_counter()
    prob.solve(_solver(problem))
    t3 = time.perf_counter()
    status, _, bound = _status(prob)
    stats.update(build_s=t2 - t1, solve_s=t3 - t2, total_s=cset.seconds + (t3 - t1),
                 variables=sum(len(v) for v in xs.values()), solver=SOLVER)
    if status not in ("optimal", "time_limit"):
        if extra:  # a constrained solve (latency bounds) that has no answer
            return Plan(name, "infeasible", None, math.inf, math.inf, math.inf, {}, stats)
        return diagnose(problem, cset, name, stats)
    choice = _chosen(xs)
    return plan_from_choice(problem, name, status, choice, stats,  # type: ignore[arg-type]
                            bound_s=bound + problem.constant_s)


def capacity_shapes(problem: PlanningProblem) -> dict[str, list[tuple[str, int, float, int, float]]]:
    """Per LLM, the shapes that fit: ``(gpu, tp, share, units per replica, μ per replica)``.

    For max-throughput only capacity matters, and per GPU type and units per replica only the
    shape with the largest μ is kept (a smaller μ for the same GPUs never helps).
    """
    out: dict[str, list[tuple[str, int, float, int, float]]] = {}
    for m in problem.llms:
        dem = llm_demand(problem.stats, problem.models, problem.targets, m)
        best: dict[tuple[str, int], tuple[str, int, float, int, float]] = {}
        for (gpu, tp), shares in shape_groups(problem, m).items():
            for curve in instance_curves(dem, problem.latency, gpu, tp, shares,
                                         catalog=problem.catalog, policy=problem.policy):
                if not curve.feasible:
                    continue
                per = gpu_units(tp, curve.share)
                key = (gpu, per)
                if key not in best or curve.mu > best[key][4]:
                    best[key] = (gpu, tp, curve.share, per, curve.mu)
        out[m] = [best[k] for k in sorted(best)]
    return out


def max_scale(problem: PlanningProblem,
              shapes_: Mapping[str, Sequence[tuple[str, int, float, int, float]]] | None = None,
              ) -> tuple[float, dict[str, Candidate], str]:
    """The largest ``s`` such that ``s`` × the targets fit at ``max_utilisation`` (exact MILP).

    One binary per (LLM, shape) chooses the shape, an integer counts its replicas:
    ``s·λ_m ≤ u·Σ μ·r`` and ``Σ units·r ≤ budget`` per GPU type.
    """
    shp = shapes_ if shapes_ is not None else capacity_shapes(problem)
    if any(not v for v in shp.values()):
        return 0.0, {}, "infeasible"
    budgets = problem.cluster.budgets()
    u = problem.options.max_utilisation
    if len(budgets) == 1:
        return _max_scale_one_type(problem, shp, budgets)
    prob = pulp.LpProblem("scepsy_max_throughput", pulp.LpMaximize)
    s = prob.add_variable("scale", 0, None)
    ys: dict[str, list[tuple[tuple[str, int, float, int, float], Any, Any]]] = {}
    n = 0
    for m in sorted(shp):
        ys[m] = []
        for sh in shp[m]:
            top = budgets[sh[0]] * UNITS // sh[3]
            y = prob.add_variable(f"y{n}", 0, 1, pulp.LpBinary)
            r = prob.add_variable(f"r{n}", 0, top, pulp.LpInteger)
            prob += pulp.LpAffineExpression([(r, 1), (y, -top)]) <= 0, f"link{n}"
            prob += pulp.LpAffineExpression([(r, 1), (y, -1)]) >= 0, f"min{n}"
            ys[m].append((sh, y, r))
            n += 1
    prob += pulp.LpAffineExpression([(s, 1.0)])
    for j, m in enumerate(ys):
        lam = _rate(problem, m)
        prob += pulp.LpAffineExpression([(y, 1) for _, y, _ in ys[m]]) == 1, f"one{j}"
        prob += (pulp.LpAffineExpression([(s, lam)] + [(r, -u * sh[4]) for sh, _, r in ys[m]])
                 <= 0, f"load{j}")
    for gpu, g in budgets.items():
        terms = [(r, sh[3]) for m in ys for sh, _, r in ys[m] if sh[0] == gpu]
        if terms:
            prob += pulp.LpAffineExpression(terms) <= g * UNITS, f"budget_{gpu}"
    prob.solve(_solver(problem))
    status, _, _ = _status(prob)
    if status not in ("optimal", "time_limit"):
        return 0.0, {}, status
    choice = {}
    for m, triples in ys.items():
        sh, _, r = max(triples, key=lambda t: (t[1].value() or 0.0))
        reps = max(1, round(r.value() or 0))
        choice[m] = Candidate(m, sh[0], sh[1], sh[2], reps, sh[3] * reps, sh[4], math.nan, 0.0, 0.0)
    return float(s.value() or 0.0), choice, status


def _max_scale_one_type(problem: PlanningProblem,
                        shp: Mapping[str, Sequence[tuple[str, int, float, int, float]]],
                        budgets: Mapping[str, int]) -> tuple[float, dict[str, Candidate], str]:
    """:func:`max_scale` on one GPU type, exactly and without a MILP: the LLMs do not interact
    except through the budget, so at scale ``s`` each takes its fewest-unit shape and replica
    count ``max(1, ⌈s·λ/(u·μ)⌉)``; bisect on ``s``, then move to the breakpoint the choices reach.
    """
    u = problem.options.max_utilisation
    budget = next(iter(budgets.values())) * UNITS
    lam = {m: _rate(problem, m) for m in shp}

    def pick(scale: float) -> tuple[int, dict[str, tuple[tuple[str, int, float, int, float], int]]]:
        total, choice = 0, {}
        for m, options in shp.items():
            best = None
            for sh in options:
                r = max(1, math.ceil(scale * lam[m] / (u * sh[4]) * (1 - 1e-12)))
                if best is None or (sh[3] * r, -sh[4] * r) < (best[0][3] * best[1], -best[0][4] * best[1]):
                    best = (sh, r)
            assert best is not None
            choice[m] = best
            total += best[0][3] * best[1]
        return total, choice

    if pick(0.0)[0] > budget:
        return 0.0, {}, "infeasible"
    lo, hi = 0.0, 1.0
    while pick(hi)[0] <= budget:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if pick(mid)[0] <= budget:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    _, choice = pick(lo)
    scale = min(r * u * sh[4] / lam[m] for m, (sh, r) in choice.items())
    cands = {m: Candidate(m, sh[0], sh[1], sh[2], r, sh[3] * r, sh[4], math.nan, 0.0, 0.0)
             for m, (sh, r) in choice.items()}
    return max(scale, lo), cands, "optimal"


def _rate(problem: PlanningProblem, m: str) -> float:
    """LLM ``m``'s call rate at the problem's targets (calls/s)."""
    return llm_demand(problem.stats, problem.models, problem.targets, m).rate


def diagnose(problem: PlanningProblem, cset: CandidateSet, name: str,
             stats: Mapping[str, Any]) -> Plan:
    """An infeasible plan that says why: a model that fits nowhere, or how far the GPUs go."""
    if cset.unfit:
        models = ", ".join(f"{m} ({problem.models[m]})" for m in cset.unfit)
        info = Infeasibility("memory", f"{models} fits on no GPU of the cluster with any TP degree "
                             "and share of the grid", 0.0, {w: 0.0 for w in problem.targets},
                             cset.unfit[0], tuple(cset.unfit))
        return Plan(name, "infeasible", None, math.inf, math.inf, math.inf, {}, dict(stats), info, 0.0)
    scale, choice, _ = max_scale(problem)
    budgets = problem.cluster.budgets()
    used = units_by_gpu(choice.values())
    # the LLM with the least headroom bounds the scale; GPU types it could grow on are binding
    heads = {m: c.capacity * problem.options.max_utilisation / _rate(problem, m)
             for m, c in choice.items()}
    bottleneck = min(heads, key=lambda m: (heads[m], m)) if heads else None
    binding = tuple(sorted(g for g in budgets if g in used)) or tuple(sorted(budgets))
    tput = {w: scale * t for w, t in problem.targets.items()}
    detail = (f"the targets need more GPUs than the cluster has: at most {scale:.4g}x the targets "
              f"({', '.join(f'{w} {v:.4g} req/s' for w, v in tput.items())}), bounded by "
              f"{bottleneck} on the {', '.join(binding)} budget")
    info = Infeasibility("gpus", detail, scale, tput, bottleneck, binding)
    return Plan(name, "infeasible", None, math.inf, math.inf, math.inf, {}, dict(stats), info, scale)


def solve_max_throughput(problem: PlanningProblem, name: str = "milp") -> Plan:
    """The largest scale of the targets the cluster carries, within the latency bounds if set."""
    t0 = time.perf_counter()
    scale, choice, status = max_scale(problem)
    bounds = problem.options.latency_bound_s
    if not choice or scale <= 0:
        cset = generate_candidates(problem)
        return diagnose(problem, cset, name, {"total_s": time.perf_counter() - t0})
    if not bounds:  # the capacity optimum; price its latency at that load
        scaled = problem.scaled(scale * (1 - 1e-9))
        priced = price(scaled, plan_from_choice(scaled, name, "optimal", choice, {}).allocation)  # type: ignore[arg-type]
        return plan_from_choice(scaled, name, status, priced,  # type: ignore[arg-type]
                                {"total_s": time.perf_counter() - t0}, scale=scale)
    # bisection on the scale with latency-bounded min-latency solves
    lo, hi, best = 0.0, scale, None
    for i in range(40):
        mid = hi if i == 0 else (lo + hi) / 2  # full capacity first, then bisect
        plan = _bounded(problem.scaled(mid), name)
        if plan.feasible:
            lo, best = mid, (plan, mid)
        else:
            hi = mid
        if hi - lo <= 1e-4 * hi:
            break
    if best is None:
        cset = generate_candidates(problem)
        return diagnose(problem, cset, name, {"total_s": time.perf_counter() - t0})
    plan, s = best
    stats = dict(plan.stats, total_s=time.perf_counter() - t0)
    return Plan(plan.optimiser, plan.status, plan.allocation, plan.objective_s, plan.bound_s,
                plan.gap, plan.candidates, stats, None, s)


def _bounded(problem: PlanningProblem, name: str) -> Plan:
    cset = generate_candidates(problem)
    if cset.unfit or any(not c for c in cset.by_llm.values()):
        return Plan(name, "infeasible", None, math.inf, math.inf, math.inf, {}, {})
    extra = []
    for w, bound in problem.options.latency_bound_s.items():
        if w not in problem.targets:
            continue
        coeffs = {}
        for cands in cset.by_llm.values():
            for c in cands:
                v = dict(c.workflow_latency_s).get(w)
                if v is not None:
                    coeffs[c] = v
        extra.append((coeffs, bound - problem.stats[w].tool_critical_s))
    return solve_min_latency(problem, cset, extra, name)


@register("milp")
class MILPOptimiser:
    """The exact optimiser (module docstring)."""

    name = "milp"

    def solve(self, problem: PlanningProblem) -> Plan:
        if problem.options.objective == "max-throughput":
            return solve_max_throughput(problem, self.name)
        return solve_min_latency(problem, name=self.name)
