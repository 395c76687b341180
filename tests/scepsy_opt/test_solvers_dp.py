"""The DP reference solver of benchmarks/solvers/dp.py against brute force and the MILP."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from scepsy_common.units import UNITS
from scepsy_opt.planning.candidates import Candidate, generate_candidates
from scepsy_opt.planning.milp import solve_min_latency

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "solvers"))
from dp import solve_dp, solve_problem


def _cand(llm: str, units: int, cost: float, gpu: str = "A100-80GB") -> Candidate:
    return Candidate(llm, gpu, 1, 1.0, 1, units, 1.0, cost, cost, 0.0)


def _random_knapsack(rng: np.random.Generator) -> dict[str, list[Candidate]]:
    n = int(rng.integers(1, 5))
    step = int(rng.choice([1, 100, 250]))
    return {f"m{k}": [_cand(f"m{k}", step * int(rng.integers(0, 12)), float(rng.uniform(0, 10)))
                      for _ in range(int(rng.integers(1, 6)))] for k in range(n)}


def _brute(cands: dict[str, list[Candidate]], budget: int) -> float:
    best = math.inf
    for combo in itertools.product(*(cands[m] for m in sorted(cands))):
        if sum(c.units for c in combo) <= budget:
            best = min(best, sum(c.cost for c in combo))
    return best


@pytest.mark.parametrize("seed", range(60))
def test_dp_matches_enumeration_on_synthetic_knapsacks(seed):
    rng = np.random.default_rng(seed)
    cands = _random_knapsack(rng)
    budget = int(rng.integers(0, 3000))
    res = solve_dp(cands, budget)
    best = _brute(cands, budget)
    if math.isinf(best):
        assert res.status == "infeasible"
        return
    assert res.status == "optimal"
    assert res.objective == pytest.approx(best, rel=1e-12, abs=1e-12)
    assert set(res.choice) == set(cands)
    assert all(res.choice[m] in cands[m] for m in cands)
    assert res.units <= budget


def test_dp_prefers_fewer_units_on_equal_cost_and_counts_in_gcd_steps():
    cands = {"a": [_cand("a", 400, 1.0), _cand("a", 200, 1.0)], "b": [_cand("b", 600, 2.0)]}
    res = solve_dp(cands, 1000)
    assert res.step == 200 and res.cells <= 1000 // 200 + 1
    assert res.choice["a"].units == 200 and res.objective == 3.0


def test_dp_reports_infeasible_and_rejects_several_gpu_types():
    assert solve_dp({"a": [_cand("a", 500, 1.0)], "b": [_cand("b", 600, 1.0)]}, 1000).status \
        == "infeasible"
    assert solve_dp({"a": []}, 1000).status == "infeasible"
    with pytest.raises(NotImplementedError):
        solve_dp({"a": [_cand("a", 100, 1.0), _cand("a", 100, 0.5, gpu="H100-80GB")]}, 1000)


CASES = [(1 + s % 4, (1, 2, 3, 4, 6, 8, 12, 16)[(3 * s) % 8], s) for s in range(20)]


@pytest.mark.parametrize(("n_llms", "gpus", "seed"), CASES)
def test_dp_objective_equals_the_milp_on_random_problems(roofline, n_llms, gpus, seed):
    from scepsy_opt.planning.instances import random_problem

    problem = random_problem(n_llms, gpus, roofline, seed=seed)
    cset = generate_candidates(problem)
    plan = solve_min_latency(problem, cset)
    res = solve_problem(problem, cset)
    if not plan.feasible:
        assert res.status == "infeasible"
        return
    assert plan.status == "optimal"
    assert res.status == "optimal"
    dp_obj = res.objective + problem.constant_s
    assert math.isclose(dp_obj, plan.objective_s, rel_tol=1e-9, abs_tol=1e-12)
    assert res.units <= gpus * UNITS
