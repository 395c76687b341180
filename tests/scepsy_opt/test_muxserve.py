"""The ``muxserve`` baseline (MuxServe's greedy co-location): budgets, the greedy rule against a
brute-force walk over every candidate list, the exact optimum as a floor, when it is
infeasible, max-throughput, and its use through the registry, the API and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import scepsy
from scepsy.cli import main
from scepsy_common.units import UNITS
from scepsy_opt.cluster import Cluster, GPUPool
from scepsy_opt.planning.baselines import BruteForce, MuxServeGreedy, _placement, capacity_scale
from scepsy_opt.planning.candidates import (
    Candidate,
    generate_candidates,
    mem_units_by_gpu,
    units_by_gpu,
)
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.optimisers import OPTIMISERS, optimiser
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
REL = 1e-9  # float slack of objective comparisons (both are sums of the same candidate costs)
FAST = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
TWO = PlanOptions(shares=(0.2, 0.4, 0.6, 0.8, 1.0), tps=(1, 2),
                  memory_shares=(0.1, 0.2, 0.4, 0.6, 0.8, 1.0))
REPO = Path(__file__).resolve().parents[2]
RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
A4 = str(REPO / "datasets" / "clusters" / "a100-4.yaml")

problems = st.builds(
    lambda n, gpus, seed, load, other: random_problem(
        n, gpus, ROOF, seed=seed, load=load,
        cluster=None if other is None else Cluster("mixed", (GPUPool("A100-80GB", 1, gpus),
                                                             GPUPool(other, 1, 2)))),
    n=st.integers(1, 4), gpus=st.integers(1, 6), seed=st.integers(0, 10**6),
    load=st.sampled_from([0.3, 0.6, 0.9, 1.4]), other=st.sampled_from([None, "L4", "H100-80GB"]))
# llm000's fewest-unit candidates tie across the two types (300 units each): the cheaper wins
TIED = random_problem(2, 2, ROOF, seed=1, load=0.3,
                      cluster=Cluster("mixed", (GPUPool("A100-80GB", 1, 2),
                                                GPUPool("H100-80GB", 1, 2))))


def _eff(c: Candidate) -> int:
    return max(c.units, c.mem_units)


def _demand(p: PlanningProblem, cands: tuple[Candidate, ...]) -> float:
    """GPUs kept busy: calls/s x GPU seconds per call on the fewest-unit (then cheapest) shape."""
    c = sorted(cands, key=lambda c: (_eff(c), c.cost))[0]
    return p.loads[c.llm] * (c.tp * c.share) / c.mu


def _greedy_oracle(p: PlanningProblem) -> dict[str, Candidate] | None:
    """The greedy rule by exhaustion: in demand order, of every candidate of the LLM that fits
    what is left and leaves the others' minimum placeable, the one with the fewest units, then
    the cheapest, then the earliest listed."""
    cset = generate_candidates(p)
    by_llm = cset.by_llm
    if cset.unfit or not all(by_llm.values()):
        return None
    order = sorted(by_llm, key=lambda m: (-_demand(p, by_llm[m]), m))
    mins = {m: {g: min(_eff(c) for c in cs if c.gpu == g) for g in {c.gpu for c in cs}}
            for m, cs in by_llm.items()}
    free = {g: n * UNITS for g, n in p.cluster.budgets().items()}
    out = {}
    for k, m in enumerate(order):
        fits = []
        for j, c in enumerate(by_llm[m]):
            after = dict(free)
            after[c.gpu] = after.get(c.gpu, 0) - _eff(c)
            if after[c.gpu] >= 0 and _placement(order[k + 1:], mins, after) is not None:
                fits.append(((_eff(c), c.cost, j), c))
        if not fits:
            return None
        pick = min(fits, key=lambda f: f[0])[1]
        out[m] = pick
        free[pick.gpu] -= _eff(pick)
    return out


@FAST
@given(p=problems)
@example(p=TIED)
def test_it_is_the_greedy_rule_and_never_exceeds_a_budget(p):
    plan = optimiser("muxserve").solve(p)
    expect = _greedy_oracle(p)
    assert plan.feasible == (expect is not None)
    if not plan.feasible:
        return
    assert plan.status == "heuristic" and dict(plan.candidates) == expect
    budgets = p.cluster.budgets()
    used = units_by_gpu(plan.candidates.values())
    assert all(u <= budgets[g] * UNITS for g, u in used.items())
    by_llm = generate_candidates(p).by_llm
    demand = [_demand(p, by_llm[m]) for m in plan.stats["demand_order"]]
    assert demand == sorted(demand, reverse=True)


@FAST
@given(n=st.integers(1, 3), gpus=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_it_keeps_both_budgets_with_memory_shares(n, gpus, seed):
    p = random_problem(n, gpus, ROOF, seed=seed, load=0.7, options=TWO)
    plan = optimiser("muxserve").solve(p)
    if plan.feasible:
        for used in (units_by_gpu(plan.candidates.values()),
                     mem_units_by_gpu(plan.candidates.values())):
            assert all(u <= p.cluster.budgets()[g] * UNITS for g, u in used.items())


@FAST
@given(p=problems)
def test_the_exact_optimum_is_a_floor(p):
    plan, exact = optimiser("muxserve").solve(p), BruteForce().solve(p)
    if plan.feasible:
        assert exact.feasible and exact.objective_s <= plan.objective_s * (1 + REL)
        assert plan.bound_s <= exact.objective_s * (1 + REL)  # its reported bound is honest


@FAST
@given(n=st.integers(1, 4), gpus=st.integers(1, 6), seed=st.integers(0, 10**6),
       load=st.sampled_from([0.5, 0.9, 1.2, 1.6]))
def test_on_one_gpu_type_it_fails_only_when_nothing_fits_and_uses_each_minimum(n, gpus, seed, load):
    """One GPU type, memory tied to the share: each LLM's minimum fits whenever all minimums do,
    so it is infeasible exactly when no allocation exists, and it never adds GPUs to an LLM."""
    p = random_problem(n, gpus, ROOF, seed=seed, load=load)
    plan, exact = optimiser("muxserve").solve(p), BruteForce().solve(p)
    assert plan.feasible == exact.feasible
    if not plan.feasible:
        assert plan.infeasible is not None and plan.infeasible.reason == exact.infeasible.reason
        return
    by_llm = generate_candidates(p).by_llm
    for m, c in plan.candidates.items():
        assert c.units == min(x.units for x in by_llm[m])
        assert c.cost == min(x.cost for x in by_llm[m] if x.units == c.units)


def test_it_leaves_gpus_idle_that_the_optimum_uses():
    """The point of the baseline: it meets the rates with the least GPU, not the least latency."""
    p = random_problem(2, 4, ROOF, seed=3, load=0.3)
    plan, exact = optimiser("muxserve").solve(p), optimiser("milp").solve(p)
    used = sum(c.units for c in plan.candidates.values())
    assert used < 4 * UNITS <= sum(c.units for c in exact.candidates.values()) + UNITS
    assert plan.objective_s > exact.objective_s * (1 + 1e-6)


@settings(FAST, max_examples=6)
@given(n=st.integers(1, 3), gpus=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_max_throughput_is_feasible_and_within_the_exact_capacity(n, gpus, seed):
    p = random_problem(n, gpus, ROOF, seed=seed,
                       options=PlanOptions(objective="max-throughput"))
    plan = optimiser("muxserve").solve(p)
    best, _ = capacity_scale(p)
    assert plan.feasible and 0 < plan.scale <= best * (1 + REL)
    assert MuxServeGreedy().solve(p.scaled(plan.scale)).feasible


def test_registry_api_and_cli_use_it(capsys, tmp_path):
    assert "muxserve" in OPTIMISERS and isinstance(optimiser("muxserve"), MuxServeGreedy)
    res = scepsy.plan(RAG, A4, 2.0, trace_requests=200, optimiser="muxserve")
    assert res.plan.optimiser == "muxserve" and res.plan.status == "heuristic"
    assert res.placed.placed
    out = tmp_path / "plan.json"
    code = main(["plan", "--workflow", RAG, "--cluster", A4, "--target", "2", "--optimiser",
                 "muxserve", "--out", str(out), "--trace-requests", "200"])
    capsys.readouterr()
    doc = json.loads(out.read_text())
    assert code == 0 and doc["optimiser"] == "muxserve" and doc["status"] == "heuristic"
    assert math.isclose(sum(i["tp"] * i["share"] * i["replicas"]
                            for i in doc["allocation"]["llms"].values()),
                        res.plan.allocation.gpus(), rel_tol=1e-9)
