"""The pattern formulation (scepsy_place.formulations.patterns): on tiny instances an exhaustive placeable
optimum is the oracle (every combination of unpruned candidates in cost order, placeability
decided exactly by scepsy_place.packing.exact); the column generation bound is below every placeable
plan; every placement is valid (no GPU over its compute or memory) and complete."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_opt.cluster import uniform_cluster
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.problem import Deadline, PlanOptions
from scepsy_place.formulations.patterns import domain_types, plan_patterns, solve_patterns
from scepsy_place.packing.check import violations
from scepsy_place.packing.exhaustive import placeable_optimum
from scepsy_place.packing.placement import demands
from scepsy_place.packing.topology import Node, Topology
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
OPTS = PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1, 2))
GPU = "A100-80GB"
TOL = 1e-9  # relative tolerance on objectives


def tiny(seed: int, gpus: int = 4, llms: int = 3, load: float = 0.6):
    """A random problem on ``gpus`` GPUs and a topology of one node with 2-GPU domains."""
    cl = uniform_cluster(GPU, gpus, gpus)
    p = random_problem(llms, gpus, ROOF, seed=seed, load=load, options=OPTS, cluster=cl)
    topo = Topology("t", (Node("n0", "r0", GPU, gpus, 2, 80.0),))
    return p, topo


def oracle(p, topo):
    """The cheapest placeable objective (:func:`scepsy_place.packing.exhaustive.placeable_optimum`:
    every combination of the unpruned candidates in cost order, the first that fits the
    budgets and places exactly), or None."""
    best = placeable_optimum(p, topo)
    return None if best is None else best[0]


def valid(topo, res) -> None:
    dem = demands(res.plan.allocation)
    assert violations(topo, dem, res.placement) == []
    assert res.placement.complete and len(res.placement.slots) == len(dem)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 7, 9])
def test_patterns_against_the_exhaustive_placeable_optimum(seed):
    p, topo = tiny(seed)
    best = oracle(p, topo)
    res = solve_patterns(p, topo)
    if best is None:
        assert res.status in ("infeasible", "no_solution")
        return
    assert res.lp_bound_s <= best * (1 + TOL)  # a proven bound
    assert res.status in ("optimal", "feasible")
    valid(topo, res)
    assert res.objective >= best * (1 - TOL)  # never below the optimum
    assert math.isclose(res.objective, res.plan.objective_s, rel_tol=TOL)
    if res.status == "optimal":
        assert math.isclose(res.objective, best, rel_tol=TOL)
        assert res.gap == 0.0
    else:
        assert res.gap > 0 and math.isclose(res.gap, res.objective / res.lp_bound_s - 1)


def test_deterministic():
    p, topo = tiny(1)
    a, b = solve_patterns(p, topo), solve_patterns(p, topo)
    assert a.plan.allocation == b.plan.allocation and a.placement == b.placement
    assert a.lp_bound_s == b.lp_bound_s and a.status == b.status


def test_partly_used_topology_is_respected():
    p, _ = tiny(2)
    used = ((0.6, 48.0), (0.0, 0.0), (0.3, 24.0), (0.0, 0.0))
    busy = Topology("busy", (Node("n0", "r0", GPU, 4, 2, 80.0, used),))
    res = solve_patterns(p, busy)
    if res.plan.allocation is None:  # then it must say why, not pretend
        assert res.status in ("infeasible", "no_solution")
        return
    valid(busy, res)
    free = solve_patterns(p, tiny(2)[1])
    assert res.lp_bound_s >= free.lp_bound_s * (1 - TOL) or res.status != "optimal"
    # the busy GPUs' free capacity is what the domain types see
    kinds = domain_types(busy)
    assert sorted(f for k in kinds for f in k.free) == sorted(
        [(400, 32.0), (1000, 80.0), (700, 56.0), (1000, 80.0)])


def test_min_cost_mode_opens_fewer_gpus():
    p, topo = tiny(0, gpus=4, llms=2, load=0.3)
    lat = solve_patterns(p, topo)
    cost = solve_patterns(p, topo, gpu_cost={GPU: 1e3})
    valid(topo, lat)
    valid(topo, cost)
    assert cost.placement.gpus_used() < lat.placement.gpus_used()
    # its objective counts the GPUs it opens (no constant: a price, not a latency)
    assert cost.objective >= 1e3 * cost.placement.gpus_used()


def test_infeasible_is_proven():
    p, topo = tiny(0, load=4.0)
    res = solve_patterns(p, topo)
    assert res.status == "infeasible" and res.plan.allocation is None
    placed = plan_patterns(p, topo)
    assert placed.status == "infeasible" and not placed.placed


def test_plan_patterns_is_a_placed_plan():
    p, topo = tiny(0)
    res = plan_patterns(p, topo)
    assert res.placed and res.formulation == "patterns"
    assert res.placement.placed_by in ("patterns", "blocks")
    assert res.quality is not None and res.quality["unplaced"] == 0
    assert res.plan.bound_s <= res.plan.objective_s * (1 + TOL)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), gpus=st.sampled_from([2, 4]),
       load=st.floats(0.2, 0.8))
def test_every_answer_is_placed_and_bounded(seed, gpus, load):
    p, topo = tiny(seed, gpus=gpus, llms=2, load=load)
    res = solve_patterns(p, topo)
    if res.plan.allocation is None:
        assert res.status in ("infeasible", "no_solution")
        return
    valid(topo, res)
    assert res.lp_bound_s <= res.objective * (1 + TOL)


@pytest.mark.parametrize("seed", [0, 3, 5])
def test_column_generation_bound_alone(seed):
    """Without the aggregate MILP (no start, no aggregate bound) the Lagrangian bound of
    column generation is still below the placeable optimum, and the dive's plan above it."""
    p, topo = tiny(seed)
    best = oracle(p, topo)
    res = solve_patterns(p, topo, aggregate=False)
    assert res.converged and res.stats["aggregate_bound"] is None
    assert res.lp_bound_s <= best * (1 + TOL)
    if res.plan.allocation is not None:
        valid(topo, res)
        assert res.objective >= best * (1 - TOL)


def test_phase_one_proves_a_topology_too_small():
    """Candidates of a 4-GPU cluster on one 2-GPU node: the load needs more than two GPUs, so
    no covering exists, and phase 1 of column generation proves it (the oracle agrees)."""
    p, _ = tiny(1, load=0.9)
    small = Topology("small", (Node("n0", "r0", GPU, 2, 2, 80.0),))
    assert oracle(p, small) is None
    res = solve_patterns(p, small, aggregate=False)
    assert res.status == "infeasible" and res.plan.allocation is None


def test_extra_rows_are_kept():
    """A row forbidding the optimum's candidate of one LLM: the plan avoids it, costs no less,
    and its bound stays below it."""
    p, topo = tiny(0)
    first = solve_patterns(p, topo)
    m = sorted(first.plan.candidates)[0]
    banned = first.plan.candidates[m]
    res = solve_patterns(p, topo, extra=[({banned: 1.0}, 0.0)])
    assert res.plan.candidates[m] != banned
    valid(topo, res)
    assert res.objective >= first.objective * (1 - TOL)
    assert res.lp_bound_s <= res.objective * (1 + TOL)


def test_out_of_time_says_so():
    """A deadline that has passed: no plan, and a status that says time ran out (not
    infeasible)."""
    p, topo = tiny(0)
    res = solve_patterns(p, topo, deadline=Deadline.after(0.0))
    assert res.status == "time_limit_no_solution" and res.plan.allocation is None
    placed = plan_patterns(p, topo, deadline=Deadline.after(0.0))
    assert placed.status == "time_limit" and not placed.placed


def test_recombinations_are_valid_patterns():
    """Half-and-half recombinations keep whole TP groups on distinct GPUs and no GPU over its
    compute or memory; a recombination that would split a TP group or overfill a GPU is not
    added."""
    from types import SimpleNamespace

    from scepsy_place.formulations.patterns import DomainType, Shape, _make_pattern, _recombine

    dt = DomainType(GPU, ((1000, 80.0),) * 4, (("n0", (0, 1, 2, 3)),))
    shapes = [Shape("a", GPU, 1, 0.5, None, 500, 40.0), Shape("b", GPU, 2, 0.4, None, 400, 32.0),
              Shape("c", GPU, 1, 0.6, None, 600, 48.0)]
    pats = [_make_pattern(0, dt, shapes, w) for w in (
        {0: [2, 2, 0, 0], 1: [0, 0, 1, 1]},  # a a | b-pair
        {1: [1, 1, 0, 0], 2: [0, 0, 1, 1]},  # b-pair | c c
        {1: [0, 1, 1, 0]},  # a TP group across the halves
        {0: [0, 0, 2, 2]})]  # | a a
    assert all(p is not None for p in pats)
    master = SimpleNamespace(patterns=list(pats), types=[dt], shapes=shapes, seen={})

    def add(p):
        key = (p.kind, p.counts)
        if key in master.seen:
            return False
        master.seen[key] = len(master.patterns)
        master.patterns.append(p)
        return True

    master.add = add
    for i, p in enumerate(pats):
        master.seen[(p.kind, p.counts)] = i
    added = _recombine(master, [0, 1, 2, 3], [0, 1, 2, 3])
    new = master.patterns[len(pats):]
    assert added == len(new) > 0
    counts = {p.counts for p in new}
    assert ((0, 4), (2, 2)) in counts  # a a | c c (two replicas of a per GPU)
    assert ((0, 8),) in counts  # a a | a a
    assert ((1, 2),) in counts  # the b pairs of patterns 1 and 0
    # pattern 2's first half holds half a TP-2 group: never recombined on its own
    assert all(dict(p.counts).get(1, 0) != 1 or dict(p.counts).get(0, 0) == 4 for p in new)
    for p in new:
        load = [0] * 4
        mem = [0.0] * 4
        for s, grp in p.groups:
            assert len(set(grp)) == len(grp) == shapes[s].tp
            for g in grp:
                load[g] += shapes[s].units
                mem[g] += shapes[s].memory_gib
        assert max(load) <= 1000 and max(mem) <= 80.0 + 1e-9
