"""Parts rebalanced by their own bounds (:func:`scepsy_place.formulations.slots.rebalanced`):
LLMs move between parts of one GPU type so that the least of the parts' own bounds rises.
The oracle of a part's bound is :func:`scepsy_opt.planning.milp.scale_upper_bound` on the
part's own LLMs and nodes, computed apart from the code under test."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_opt.cluster import Cluster, GPUPool
from scepsy_opt.planning.instances import many_models_problem, random_problem
from scepsy_opt.planning.milp import SCALE_BOUND_REL, scale_upper_bound
from scepsy_opt.planning.problem import Deadline, PlanOptions
from scepsy_place.formulations.slots import (
    QUICK_PART_LLMS,
    QUICK_PART_NODES,
    _largest_quick,
    _refit,
    _subs,
    _tries,
    as_capacity_shapes,
    capacity_need,
    partition,
    rebalanced,
    separable,
    slot_shapes,
    tied,
    typed_partition,
)
from scepsy_place.packing.topology import from_cluster
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
FAST = settings(derandomize=True, deadline=None, database=None, max_examples=80)
MT = PlanOptions(objective="max-throughput")
TOL = 2 * SCALE_BOUND_REL  # the oracle's bisection rounds each bound up to this


def _part_bounds(problem, topology, parts, shapes) -> list[float]:
    return [scale_upper_bound(sub, as_capacity_shapes({m: shapes[m] for m in q.llms}))
            for q, (sub, _) in zip(parts, _subs(problem, topology, parts), strict=True)]


def _zipf(n: int, gpus: int, size: int):
    p = many_models_problem(n, gpus, ROOF, copies=False, options=MT)
    topo = from_cluster(p.cluster)
    shp = slot_shapes(p)
    bound = scale_upper_bound(p, as_capacity_shapes(shp))
    parts = typed_partition(p, topo, size, capacity_need(p, shp, bound))
    return p, topo, shp, bound, parts


def _same_frame(before, after, problem) -> None:
    """Every LLM in one part, the parts' nodes and types kept, no workflow's LLMs cut apart."""
    assert sorted(m for q in after for m in q.llms) == sorted(problem.llms)
    assert [(q.nodes, q.gpu) for q in after] == [(q.nodes, q.gpu) for q in before]
    where = {m: i for i, q in enumerate(after) for m in q.llms}
    assert all(len({where[m] for m in g}) == 1 for g in tied(problem))
    assert all(q.llms for q in after)


def test_zipf_256_parts_least_own_bound_rises_to_near_the_whole_bound():
    """Balanced by their need at the bound, one of the Zipf 256 / 512 parts of about 64 LLMs
    bounds at 1.1686 where the whole problem bounds at 1.2223 (whole replicas make each
    LLM's need a step function of the scale); rebalanced, every part bounds within 0.5%."""
    p, topo, shp, bound, parts = _zipf(256, 512, 64)
    before = _part_bounds(p, topo, parts, shp)
    after_parts = rebalanced(p, topo, parts, shp, bound)
    after = _part_bounds(p, topo, after_parts, shp)
    _same_frame(parts, after_parts, p)
    assert min(before) < 0.97 * bound  # not vacuous: a part was low
    assert min(after) >= 0.995 * bound
    assert rebalanced(p, topo, parts, shp, bound) == after_parts  # deterministic


@pytest.mark.parametrize("seed", range(6))
def test_rebalancing_never_lowers_the_least_part_bound(seed):
    """Zipf mixes of 40 LLMs on two GPU types, in typed parts of 6: the least own bound of
    the parts (oracle) after is at least the one before, and the frame is kept."""
    p = many_models_problem(40, 96, ROOF, seed=seed, copies=False, options=MT)
    topo = from_cluster(p.cluster)
    shp = slot_shapes(p)
    bound = scale_upper_bound(p, as_capacity_shapes(shp))
    parts = typed_partition(p, topo, 6, capacity_need(p, shp, bound))
    assert len(parts) > 2
    moved = rebalanced(p, topo, parts, shp, bound)
    _same_frame(parts, moved, p)
    assert (min(_part_bounds(p, topo, moved, shp))
            >= min(_part_bounds(p, topo, parts, shp)) * (1 - TOL))


def test_parts_a_workflow_spans_stay_as_they_are():
    """Workflows that call several LLMs: where the typed parts cut a workflow's LLMs apart,
    nothing moves (the search plans such a partition as one part)."""
    cl = Cluster("mix", (GPUPool("A100-80GB", 4, 8), GPUPool("H100-80GB", 4, 8)))
    p = random_problem(14, 64, ROOF, seed=0, workflows=10, cluster=cl, options=MT)
    topo = from_cluster(p.cluster)
    shp = slot_shapes(p)
    bound = scale_upper_bound(p, as_capacity_shapes(shp))
    parts = typed_partition(p, topo, 3, capacity_need(p, shp, bound))
    assert not separable(p, parts)
    assert rebalanced(p, topo, parts, shp, bound) == parts


def test_a_target_every_part_carries_leaves_the_parts_alone_and_one_they_do_not_moves_them():
    p, topo, shp, bound, parts = _zipf(256, 512, 64)
    before = _part_bounds(p, topo, parts, shp)
    low = 0.99 * min(before)
    assert rebalanced(p, topo, parts, shp, bound, target=low) == parts
    target = 0.99 * bound  # above the low part's bound, below the others'
    moved = rebalanced(p, topo, parts, shp, bound, target=target)
    _same_frame(parts, moved, p)
    assert moved != parts
    assert min(_part_bounds(p, topo, moved, shp)) >= target * (1 - TOL)


def test_copies_of_one_problem_stay_as_they_are():
    """Equal parts have equal bounds: no move raises the least, and equal parts stay equal
    (their probes are solved once and copied)."""
    p = many_models_problem(64, 128, ROOF, copies=True, options=MT)
    topo = from_cluster(p.cluster)
    shp = slot_shapes(p)
    bound = scale_upper_bound(p, as_capacity_shapes(shp))
    parts = partition(p, topo, 16, capacity_need(p, shp, bound))
    assert len(parts) > 1
    assert rebalanced(p, topo, parts, shp, bound) == parts


@st.composite
def _bins(draw):
    k = draw(st.integers(2, 4))
    kind = draw(st.lists(st.sampled_from(["a", "b", None]), min_size=k, max_size=k))
    n = draw(st.integers(k, 9))
    sizes = np.array([[draw(st.integers(1, 9)) for _ in range(k)] for _ in range(n)],
                     dtype=float)
    cap = np.array([draw(st.integers(4, 20)) for _ in range(k)], dtype=float)
    start = np.array([i % k for i in range(n)] , dtype=np.int64)
    movable = np.array([draw(st.booleans()) for _ in range(n)], dtype=bool)
    return sizes, cap, start, movable, kind


@FAST
@given(_bins())
def test_refit_is_sound(case):
    """Whatever it returns fits: no part of one type over its cap, moves only between parts
    of one type and only of movable groups; a start that fits is returned as it is."""
    sizes, cap, start, movable, kind = case
    got = _refit(sizes, cap, start, movable, kind)
    if got is None:
        return
    n = len(start)
    load = np.zeros(len(cap))
    np.add.at(load, got, sizes[np.arange(n), got])
    for b, k in enumerate(kind):
        if k is not None:
            assert load[b] <= cap[b] + 1e-9
    for i in range(n):
        if got[i] != start[i]:
            assert movable[i] and kind[got[i]] is not None and kind[got[i]] == kind[start[i]]
    fits = all(k is None or load0 <= c for k, load0, c in zip(
        kind, np.bincount(start, weights=sizes[np.arange(n), start], minlength=len(cap)),
        cap, strict=True))
    if fits:
        assert np.array_equal(got, start)


def test_refit_moves_a_group_and_else_swaps_the_one_that_sheds_least():
    """Two parts of one type, caps 10: {6, 5} and {3}: moving 5 fits; {6, 5} and {4, 3}
    with caps 10 and 8: no move fits (5 or 6 on top of 7); of the swaps that fit (5 for 4 or
    3, 6 for 4 or 3) 5 for 4 sheds the least that ends the excess of 1."""
    kind = ["a", "a"]
    movable = np.ones(3, dtype=bool)
    sizes = np.array([[6, 6], [5, 5], [3, 3]], dtype=float)
    got = _refit(sizes, np.array([10.0, 10.0]), np.array([0, 0, 1]), movable, kind)
    assert got is not None and list(got) == [0, 1, 1]
    sizes = np.array([[6, 6], [5, 5], [4, 4], [3, 3]], dtype=float)
    got = _refit(sizes, np.array([10.0, 8.0]), np.array([0, 0, 1, 1]),
                 np.ones(4, dtype=bool), kind)
    assert got is not None and list(got) == [0, 1, 0, 1]


def test_the_largest_quick_partition_has_parts_probes_settle_on():
    """Zipf 256 / 512: one part per GPU type (192 LLMs on 32 A100 nodes, 64 on 32 H100),
    whose feasibility probes settle in seconds; at 1,000 / 4,096 no part size past 64 is."""
    p, topo, shp, bound, _ = _zipf(256, 512, 16)
    need = capacity_need(p, shp, bound)
    made: dict[int, list] = {}
    quick = _largest_quick(p, topo, 64, need, made, typed_partition)
    assert quick is not None and len(quick) == 2
    assert all(len(q.nodes) <= QUICK_PART_NODES and len(q.llms) <= QUICK_PART_LLMS
               for q in quick)
    tries = _tries(p, topo, 16, need, Deadline.after(30), True, {})
    assert tries[0] == quick  # tried first
    big, bt = many_models_problem(1000, 4096, ROOF, copies=False, options=MT), None
    bt = from_cluster(big.cluster)
    bshp = slot_shapes(big)
    bneed = capacity_need(big, bshp, scale_upper_bound(big, as_capacity_shapes(bshp)))
    assert _largest_quick(big, bt, 64, bneed, {}, typed_partition) is None
