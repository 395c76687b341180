"""A heuristic's allocation that does not place is solved again with smaller budgets of the GPU
types that failed, until it places (scepsy_place.formulations.loop, ``_shrunk``); exact optimisers and a
user's allocation are never changed that way."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.units import UNITS, share_units
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.cluster import Cluster, GPUPool, uniform_cluster
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.optimisers import optimiser
from scepsy_opt.planning.problem import PlanOptions
from scepsy_place.formulations.loop import _shrunk, plan_and_place
from scepsy_place.packing.check import violations
from scepsy_place.packing.placement import Placement, demands
from scepsy_place.packing.topology import from_cluster
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
GPU = "A100-80GB"
HEURISTICS = ("heuristic", "independent", "equal-split", "muxserve")
REL = 1e-9  # one objective summed by two code paths (the loop's and the MILP's)


def _problem(seed: int, llms: int, gpus: int, load: float):
    return random_problem(llms, gpus, ROOF, seed=seed, load=load,
                          cluster=uniform_cluster(GPU, gpus, min(8, gpus)))


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), llms=st.integers(2, 5), gpus=st.sampled_from([4, 8, 16]),
       load=st.sampled_from([0.4, 0.7, 0.9]), name=st.sampled_from(HEURISTICS))
def test_a_placed_heuristic_plan_is_valid_and_no_better_than_the_placeable_optimum(
        seed: int, llms: int, gpus: int, load: float, name: str) -> None:
    problem = _problem(seed, llms, gpus, load)
    topo = from_cluster(problem.cluster)
    res = plan_and_place(problem, topo, name=name)
    hist = res.history
    shrunk = [h["shrunk_to"][GPU] for h in hist if "shrunk_to" in h]
    assert shrunk == sorted(shrunk, reverse=True) and len(set(shrunk)) == len(shrunk)
    assert all(0 < b < gpus for b in shrunk)
    assert res.cuts["tightened"] == len(shrunk)
    if res.status != "placed":
        assert res.answer.allocation is None
        return
    assert res.rounds == len(shrunk) + 1
    plan = res.answer
    assert violations(topo, demands(plan.allocation, problem.catalog), res.placement) == []
    best = plan_and_place(problem, topo, name="milp", formulation="aggregate")
    assert best.status == "placed"  # a placed heuristic plan proves a placeable one exists
    # the aggregate loop is exact up to 64 GPUs: the cheapest placeable allocation of the grid
    assert best.answer.objective_s <= plan.objective_s * (1 + REL)


def test_the_paper_heuristic_that_fills_every_fraction_is_repaired() -> None:
    # seed 0 of the 5-LLM, 16-GPU search instance: the heuristic's first allocation fills
    # fractions of GPUs that do not pack, and leaves replicas without a GPU
    problem = random_problem(5, 16, ROOF, seed=0, load=0.5,
                             cluster=uniform_cluster(GPU, 16, 8))
    res = plan_and_place(problem, from_cluster(problem.cluster), name="heuristic")
    assert res.status == "placed", res.reason
    assert res.history[0]["unplaced"] > 0 and res.cuts["tightened"] >= 1


def test_a_user_allocation_is_never_shrunk() -> None:
    # ten replicas at share 0.4 on four GPUs: 4.0 GPUs in aggregate, only eight fit
    problem = random_problem(1, 4, ROOF, seed=1, load=0.05,
                             options=PlanOptions(shares=(0.4, 1.0), tps=(1,)),
                             cluster=uniform_cluster(GPU, 4, 4))
    (m,) = problem.llms
    alloc = Allocation({m: Instance(GPU, 1, 0.4, 10)})
    problem = replace(problem, options=replace(problem.options, current=alloc))
    res = plan_and_place(problem, from_cluster(problem.cluster), name="user")
    assert res.status == "unplaced" and res.answer.allocation is None
    assert res.cuts["tightened"] == 0 and res.rounds == 1


def test_shrinking_takes_the_whole_gpus_that_did_not_fit_of_that_type_only() -> None:
    problem = random_problem(4, 32, ROOF, seed=2, load=0.6,
                             cluster=Cluster("mix", (GPUPool(GPU, 2, 8),
                                                     GPUPool("H100-80GB", 2, 8))))
    plan = optimiser("heuristic").solve(problem)
    for m in sorted(plan.candidates):  # every replica of one LLM left unplaced
        c = plan.candidates[m]
        placement = Placement((), tuple((m, r, "test") for r in range(c.replicas)))
        out = _shrunk(problem, plan, placement)
        before = problem.cluster.budgets()
        want = max(1, math.ceil(c.replicas * c.tp * share_units(c.share) / UNITS))
        if before[c.gpu] - want <= 0:
            assert out is None
            continue
        assert out is not None
        after = out.budgets()
        assert after == {**before, c.gpu: before[c.gpu] - want}
        if after[c.gpu] >= 8:  # a whole node is left: the largest TP group is unchanged
            assert out.max_tp(c.gpu) == problem.cluster.max_tp(c.gpu)
        assert [p for p in out.pools if p.gpu != c.gpu] == [
            p for p in problem.cluster.pools if p.gpu != c.gpu]
