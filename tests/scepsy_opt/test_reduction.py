"""Reduced-cost fixing is exact: the MILP over the reduced candidates has the unreduced optimum,
and the reduced set holds a feasible allocation whenever the unreduced one does."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_opt.cluster import Cluster, GPUPool
from scepsy_opt.planning.candidates import generate_candidates
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.milp import reduced_candidates, solve_min_latency
from scepsy_opt.planning.problem import PlanOptions
from scepsy_profile import roofline_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "solvers"))
from reduction_fuzz import compare, instance

ROOF = roofline_model()
REL = 1e-9


def test_a_tie_a_few_ulps_away_is_kept_when_the_greedy_finds_nothing():
    """1 A100 of 1 GPU + 2 H100 nodes of 2 GPUs: the greedy finds no allocation and the one
    the MILP over the sample finds uses a candidate whose reduced cost is 2e-14 (a float tie)."""
    cluster = Cluster("mixed", (GPUPool("A100-80GB", 1, 1), GPUPool("H100-80GB", 2, 2)))
    p = random_problem(4, 5, ROOF, seed=491, workflows=1, load=0.5, cluster=cluster,
                       options=PlanOptions(reduce=True))
    full = solve_min_latency(replace(p, options=replace(p.options, reduce=False)))
    reduced = solve_min_latency(p)
    assert full.status == reduced.status == "optimal"
    assert abs(reduced.objective_s - full.objective_s) <= REL * full.objective_s
    assert reduced.stats["candidates_kept"] < full.stats["candidates_kept"]  # it still reduces
    kept = reduced_candidates(p)
    every = generate_candidates(p)
    for m, cands in kept.by_llm.items():  # real candidates of the unreduced set
        keys = {(c.gpu, c.tp, c.share, c.replicas) for c in every.by_llm[m]}
        assert {(c.gpu, c.tp, c.share, c.replicas) for c in cands} <= keys


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
@settings(max_examples=20, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(i=st.integers(0, 10**6))
def test_reduced_milp_equals_the_unreduced_milp(i):
    """benchmarks/solvers/reduction_fuzz.py's instances (1-6 LLMs, one or two GPU types, from one GPU):
    the same status, the same optimum within 1e-9, for the aggregate and the blocks candidates."""
    p = instance(i)
    for blocks in (False, True):
        row = compare(p, blocks)
        assert row["agree"] and row["subset"], row


@settings(max_examples=30, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(i=st.integers(0, 10**6))
def test_greedy_repair_returns_an_allocation_within_the_budgets_or_none(i):
    """The upper bound of the reduction is a real allocation: one candidate per LLM, within
    every GPU type's budget (exact integer units)."""
    from scepsy_opt.planning.candidates import fits_budget
    from scepsy_opt.planning.milp import _greedy, _prices
    from scepsy_opt.planning.problem import Deadline

    p = instance(i)
    coarse = generate_candidates(p, coarse=True)
    if coarse.unfit or any(not c for c in coarse.by_llm.values()):
        return
    priced = _prices(p, coarse, Deadline.after(60.0))
    if not isinstance(priced, tuple):  # no optimum, or proven infeasible: nothing to repair
        return
    choice = _greedy(p, coarse.by_llm, priced[0])
    if choice is not None:
        assert set(choice) == set(p.llms) and fits_budget(p, choice)
        assert all(choice[m] in coarse.by_llm[m] for m in choice)


@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 4), gpus=st.sampled_from([1, 2, 4]), seed=st.integers(0, 10**6),
       load=st.sampled_from([0.8, 1.1, 1.5, 2.5]), blocks=st.booleans())
def test_a_sample_whose_relaxation_is_infeasible_proves_every_candidate_infeasible(
        n, gpus, seed, load, blocks):
    """Near and above the cluster's capacity the coarse sample's relaxation is often infeasible,
    and the reduction then returns each LLM's fewest-units candidates of the sample: the MILP
    over every candidate (unpruned, the oracle) is infeasible too, and wherever the relaxation is feasible the reduced and
    the unreduced MILPs agree on feasibility."""
    from scepsy_opt.planning.milp import _prices
    from scepsy_opt.planning.problem import Deadline

    p = random_problem(n, gpus, ROOF, seed=seed, load=load, options=PlanOptions(reduce=True))
    coarse = generate_candidates(p, coarse=True, blocks=blocks)
    if coarse.unfit or any(not c for c in coarse.by_llm.values()):
        return
    every = generate_candidates(p, prune=False, blocks=blocks)
    full = solve_min_latency(p, every)
    priced = _prices(p, coarse, Deadline.after(60.0))
    kept = reduced_candidates(p, blocks=blocks)
    if priced == "infeasible":
        assert full.allocation is None and full.status == "infeasible"
        # one candidate per LLM and GPU type, each one the full pruned set keeps
        pruned = generate_candidates(p, blocks=blocks)
        assert kept.kept == sum(len({c.gpu for c in v}) for v in coarse.by_llm.values())
        assert all(c in pruned.by_llm[m] for m, v in kept.by_llm.items() for c in v)
    reduced = solve_min_latency(p, kept)
    assert (reduced.allocation is None) == (full.allocation is None)
    if full.allocation is not None:
        assert abs(reduced.objective_s - full.objective_s) <= 1e-9 * full.objective_s


@settings(max_examples=25, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 4), gpus=st.sampled_from([1, 2, 4, 8, 16]), seed=st.integers(0, 10**6),
       load=st.sampled_from([0.3, 0.8, 1.2]), blocks=st.booleans())
def test_a_scan_cache_filled_by_the_sample_changes_no_later_scan(n, gpus, seed, load, blocks):
    """The replica ranges the coarse sample computed, reused by the priced and the full scans
    of the same problem, give exactly the candidates those scans compute afresh (the same
    computation: compared exactly)."""
    p = random_problem(n, gpus, ROOF, seed=seed, load=load)
    curves: dict = {}
    scans: dict = {}
    coarse = generate_candidates(p, coarse=True, blocks=blocks, curve_cache=curves,
                                 scan_cache=scans)
    assert coarse.by_llm == generate_candidates(p, coarse=True, blocks=blocks).by_llm
    prices = {g: 1e-4 * (i + 1) for i, g in enumerate(sorted(p.cluster.budgets()))}
    for kw in ({"prices": prices, "slack": 0.5}, {}):
        cached = generate_candidates(p, blocks=blocks, curve_cache=curves, scan_cache=scans,
                                     **kw)
        fresh = generate_candidates(p, blocks=blocks, **kw)
        assert cached.by_llm == fresh.by_llm and cached.generated == fresh.generated
        assert dict(cached.least_price) == dict(fresh.least_price)
