"""An exact dynamic program for the min-latency plan on one GPU type (a benchmark reference).

Planning is a multiple-choice knapsack (``scepsy_opt.planning.candidates``): pick one candidate per LLM,
minimise ``Σ cost`` subject to ``Σ units ≤ budget``. With a single GPU type the budget is one
integer and the classic pseudo-polynomial DP is exact:

    f_0[0] = 0, f_0[b > 0] = ∞;   f_k[b] = min_{c ∈ LLM k} f_{k-1}[b − w_c] + cost_c

where ``f_k[b]`` is the least cost of the first ``k`` LLMs using exactly ``b`` steps. All weights
are counted in steps of ``g = gcd`` of every candidate's units (typically 100 = a tenth of a GPU),
so the table has ``⌊budget/g⌋ + 1`` cells at most, and fewer when the LLMs together cannot use
the whole budget (the table only reaches ``Σ_k max_c w_c``). Each LLM is one pass over its
candidates, each a vectorised shift-and-minimum over the table; the argmin per cell is kept
(int16/int32 per LLM) for the backtrack. The optimum is the least ``f_n[b]`` over ``b``; among
equal costs the fewest GPU units win (``argmin`` takes the first).

Several GPU types would make the table multi-dimensional: not supported (use the MILP).

Usage::

    from dp import solve_dp, solve_problem   # with benchmarks/solvers/ on sys.path
    res = solve_problem(problem)             # or solve_dp(cset.by_llm, budget_units)
    res.status, res.objective, res.choice
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce

import numpy as np

from scepsy_common.units import UNITS
from scepsy_opt.planning.candidates import Candidate, CandidateSet, generate_candidates
from scepsy_opt.planning.problem import PlanningProblem


@dataclass(frozen=True)
class DPResult:
    """The DP's answer: ``objective`` is ``Σ cost`` of the choice (no constant tool time)."""

    status: str  # "optimal" or "infeasible"
    choice: Mapping[str, Candidate] = field(default_factory=dict)
    objective: float = math.inf
    step: int = 0  # the gcd of the candidates' units: one table cell
    cells: int = 0  # the table's length
    seconds: float = 0.0

    @property
    def units(self) -> int:
        return sum(c.units for c in self.choice.values())


def solve_dp(cands: Mapping[str, Sequence[Candidate]], budget_units: int) -> DPResult:
    """Least ``Σ cost`` with one candidate per LLM and ``Σ units ≤ budget_units`` (one GPU type).

    Raises ``NotImplementedError`` when the candidates use several GPU types.
    """
    t0 = time.perf_counter()
    gpus = {c.gpu for cs in cands.values() for c in cs}
    if len(gpus) > 1:
        raise NotImplementedError(f"the DP handles one GPU type; these candidates use {sorted(gpus)}"
                                  " (solve several types with the MILP)")
    llms = sorted(cands)
    if not llms:
        return DPResult("optimal", {}, 0.0, 1, 1, time.perf_counter() - t0)
    if any(not cands[m] for m in llms) or budget_units < 0:
        return DPResult("infeasible", seconds=time.perf_counter() - t0)
    units = [c.units for m in llms for c in cands[m]]
    if any(u < 0 for u in units):
        raise ValueError("candidate units must be >= 0")
    step = reduce(math.gcd, units, 0) or 1
    cap = budget_units // step
    # per LLM: the candidates that fit at all, as (weight in steps, cost) arrays
    per: list[tuple[list[Candidate], np.ndarray, np.ndarray]] = []
    for m in llms:
        ok = [c for c in cands[m] if c.units // step <= cap and math.isfinite(c.cost)]
        if not ok:
            return DPResult("infeasible", step=step, seconds=time.perf_counter() - t0)
        per.append((ok, np.array([c.units // step for c in ok], dtype=np.int64),
                    np.array([c.cost for c in ok], dtype=float)))
    if sum(int(w.min()) for _, w, _ in per) > cap:
        return DPResult("infeasible", step=step, seconds=time.perf_counter() - t0)

    f = np.zeros(1)  # f[b]: least cost of the LLMs so far using exactly b steps
    args: list[np.ndarray] = []
    for ok, w, cost in per:
        length = min(cap, len(f) - 1 + int(w.max())) + 1
        new = np.full(length, np.inf)
        arg = np.full(length, -1, dtype=np.int16 if len(ok) < 2**15 else np.int32)
        shifted = np.empty(length)
        better = np.empty(length, dtype=bool)
        for j in range(len(ok)):
            wj = int(w[j])
            hi = min(length, len(f) + wj)  # cells wj .. hi-1 are reachable with candidate j
            if hi <= wj:
                continue
            k = hi - wj
            np.add(f[:k], cost[j], out=shifted[:k])
            np.less(shifted[:k], new[wj:hi], out=better[:k])
            np.copyto(new[wj:hi], shifted[:k], where=better[:k])
            np.copyto(arg[wj:hi], j, where=better[:k])
        f = new
        args.append(arg)

    b = int(np.argmin(f))
    if not math.isfinite(f[b]):
        return DPResult("infeasible", step=step, cells=len(f), seconds=time.perf_counter() - t0)
    choice: dict[str, Candidate] = {}
    for m, (ok, w, _), arg in zip(reversed(llms), reversed(per), reversed(args), strict=True):
        j = int(arg[b])
        choice[m] = ok[j]
        b -= int(w[j])
    assert b == 0, "DP backtrack did not end at zero"
    choice = dict(sorted(choice.items()))
    objective = math.fsum(c.cost for c in choice.values())
    return DPResult("optimal", choice, objective, step, len(f), time.perf_counter() - t0)


def solve_problem(problem: PlanningProblem, cset: CandidateSet | None = None) -> DPResult:
    """The DP on a problem's (pruned) candidates, against its one GPU type's budget.

    Raises ``NotImplementedError`` when the candidates span several GPU types.
    """
    cset = cset or generate_candidates(problem)
    if cset.unfit:
        return DPResult("infeasible")
    gpus = {c.gpu for cs in cset.by_llm.values() for c in cs}
    if len(gpus) > 1:
        raise NotImplementedError(f"the DP handles one GPU type; the candidates use {sorted(gpus)}")
    budgets = problem.cluster.budgets()
    gpu = next(iter(gpus)) if gpus else next(iter(budgets))
    return solve_dp(cset.by_llm, budgets.get(gpu, 0) * UNITS)
