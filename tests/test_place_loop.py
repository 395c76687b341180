"""The optimise-place loop: it recovers from unplaceable optima and finds the cheapest placeable
allocation (brute force over every candidate combination, the placer as the oracle)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from scepsy_opt.cluster import uniform_cluster
from scepsy_opt.instances import random_problem
from scepsy_opt.milp import max_scale
from scepsy_opt.pipeline import llm_demand
from scepsy_opt.planning import (
    PlanOptions,
    fits_budget,
    generate_candidates,
    plan_from_choice,
    price,
)
from scepsy_place.check import violations
from scepsy_place.loop import plan_and_place
from scepsy_place.placement import demands, place
from scepsy_place.topology import from_cluster
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
OPTS = PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1,))


def problem(seed: int, gpus: int):
    cl = uniform_cluster("A100-80GB", gpus, gpus)
    return random_problem(3, gpus, ROOF, seed=seed, load=0.6, options=OPTS, cluster=cl), cl


def cheapest_placeable(p, topo):
    """Every combination of (unpruned) candidates in cost order; the first the placer places."""
    cands = generate_candidates(p, prune=False).by_llm
    llms = sorted(cands)
    combos = sorted(
        (math.fsum(c.cost for c in combo), i, combo)
        for i, combo in enumerate(itertools.product(*(cands[m] for m in llms))))
    for _, _, combo in combos:
        choice = dict(zip(llms, combo, strict=True))
        if not fits_budget(p, choice):
            continue
        plan = plan_from_choice(p, "oracle", "optimal", choice, {})
        if place(topo, demands(plan.allocation)).complete:
            return plan
    return None


@pytest.mark.parametrize(("seed", "gpus"), [(0, 3), (2, 3), (3, 3)])
def test_loop_recovers_from_an_unplaceable_optimum(seed, gpus):
    p, cl = problem(seed, gpus)
    topo = from_cluster(cl)
    res = plan_and_place(p, topo)
    assert res.rounds > 1  # the aggregate optimum did not fit on whole GPUs
    assert res.history[0]["unplaced"] > 0 and res.history[-1]["unplaced"] == 0
    assert res.placed and res.reason is None
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    # objectives rise round by round (each round forbids a cheaper, unplaceable allocation)
    objs = [h["objective_s"] for h in res.history]
    assert objs == sorted(objs)
    oracle = cheapest_placeable(p, topo)
    assert oracle is not None
    assert res.plan.objective_s == pytest.approx(oracle.objective_s, rel=1e-9)


def test_whole_gpu_power_of_two_plans_place_in_one_round():
    # whole GPUs, TP degrees and nodes powers of two: the aggregate optimum is always placeable
    cl = uniform_cluster("A100-80GB", 16, 8)
    p = random_problem(4, 16, ROOF, seed=1, cluster=cl, options=PlanOptions(shares=(1.0,)))
    res = plan_and_place(p, from_cluster(cl))
    assert res.placed and res.rounds == 1 and res.exact
    assert res.quality["gpus_used"] == res.quality["bound_l1"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_loop_always_ends_placed_with_tp_groups_of_fractional_shares(seed):
    cl = uniform_cluster("A100-80GB", 16, 8)
    p = random_problem(4, 16, ROOF, seed=seed, cluster=cl)
    topo = from_cluster(cl)
    res = plan_and_place(p, topo)
    assert res.placed, res.reason
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    assert res.rounds == len(res.history) and res.history[-1]["unplaced"] == 0
    # each round is at least as expensive as the last: cuts only remove allocations
    objs = [h["objective_s"] for h in res.history]
    assert objs == sorted(objs)


def test_no_placeable_allocation_is_reported():
    # one GPU, two LLMs that each need more than half of it: no allocation fits
    cl = uniform_cluster("A100-80GB", 1, 1)
    p = random_problem(2, 1, ROOF, seed=4, load=0.9, options=PlanOptions(shares=(0.6, 1.0), tps=(1,)),
                       cluster=cl)
    res = plan_and_place(p, from_cluster(cl))
    assert not res.placed and res.reason


def test_max_throughput_plans_are_placed_at_the_largest_placeable_scale():
    cl = uniform_cluster("A100-80GB", 3, 3)
    mt = random_problem(3, 3, ROOF, seed=0, load=0.6, cluster=cl,
                        options=dataclasses.replace(OPTS, objective="max-throughput"))
    topo = from_cluster(cl)
    res = plan_and_place(mt, topo)
    cap, _, _ = max_scale(mt)
    assert res.placed and 0 < res.plan.scale <= cap
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    # the placed allocation carries the targets at the scale it reports
    at = mt.scaled(res.plan.scale)
    for m, c in price(at, res.plan.allocation).items():
        load = llm_demand(at.stats, at.models, at.targets, m).rate
        assert c.capacity * at.options.max_utilisation >= load * (1 - 1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replanning_on_a_busy_cluster_budgets_the_free_capacity(seed):
    """Half of the GPUs are taken: the loop's MILP sees only the free capacity, so its plan fits
    what is left and is placed around the running work (the cluster's budget counts every GPU)."""
    p = random_problem(3, 16, ROOF, seed=seed, load=0.3, options=OPTS)
    free = from_cluster(p.cluster)
    busy = free.with_nodes(dataclasses.replace(n, used=((0.5, 40.0),) * n.gpus)
                           if i == 0 else n for i, n in enumerate(free.nodes))
    res = plan_and_place(p, busy, formulation="aggregate")
    assert res.placed
    left = sum(n.free_units(g) for n in busy.nodes for g in range(n.gpus))
    assert sum(c.units for c in res.plan.candidates.values()) <= left
    ds = demands(res.plan.allocation)
    assert violations(busy, ds, res.placement) == []
    # on the idle cluster the optimum uses more than is left here: the rows bind
    unconstrained = plan_and_place(p, free, formulation="aggregate")
    assert sum(c.units for c in unconstrained.plan.candidates.values()) > left
    assert res.plan.objective_s >= unconstrained.plan.objective_s - 1e-9
