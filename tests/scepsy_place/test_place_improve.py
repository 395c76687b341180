"""The improvement phase (scepsy_place.packing.improve): frees GPUs, never worse, every invariant kept."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_opt.planning.problem import Deadline
from scepsy_place import (
    PLACERS,
    Demand,
    Node,
    Placement,
    Slot,
    Topology,
    bound,
    place,
    placer,
    quality,
    violations,
)
from scepsy_place.packing.improve import improve

FAST = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
A100 = "A100-80GB"


def _dgx(nodes: int) -> Topology:
    return Topology("dgx", tuple(Node(f"dgx-{i}", "r", A100, 8, 8, 80.0) for i in range(nodes)))


def _stacked_case() -> tuple[Topology, list[Demand]]:
    """Two TP-8 groups at 0.3, four replicas at 0.8 and sixteen at 0.7 on 8-GPU nodes. TP
    groups first stacks the two groups on one node (0.6 per GPU, where no 0.7 or 0.8 fits):
    28 GPUs; the optimum puts each group over eight 0.7 replicas: 20 GPUs (= L2)."""
    ds = [Demand("tp8", i, A100, 8, 0.3, 24.0) for i in range(2)]
    ds += [Demand("big", i, A100, 1, 0.8, 64.0) for i in range(4)]
    ds += [Demand("mid", i, A100, 1, 0.7, 56.0) for i in range(16)]
    return _dgx(5), ds


def _never_worse(top: Topology, ds: list[Demand], before: Placement, after: Placement) -> None:
    assert violations(top, ds, after) == []
    qb, qa = quality(top, before, ds), quality(top, after, ds)
    assert qa["unplaced"] <= qb["unplaced"]
    assert qa["gpus_used"] <= qb["gpus_used"]
    assert qa["gpus_opened"] <= qb["gpus_opened"]
    assert qa["nodes_used"] <= qb["nodes_used"]
    assert qa["nodes_opened"] <= qb["nodes_opened"]
    assert after.policy == before.policy and after.placed_by == before.placed_by


def test_stacked_tp8_groups_are_spread_to_the_bound():
    top, ds = _stacked_case()
    stacked = place(top, ds, orders=1, improve=False)
    assert stacked.gpus_used() == 28
    assert any(sizes.count((8, 300)) == 2 for sizes in stacked.per_node().values())
    assert bound(ds, top).best == 20
    better = improve(top, ds, stacked)
    _never_worse(top, ds, stacked, better)
    assert better.gpus_used() == 20
    assert not any(sizes.count((8, 300)) == 2 for sizes in better.per_node().values())
    # the default placer runs the improvement phase: it meets the bound too
    assert place(top, ds).gpus_used() == 20
    assert place(top, ds, improve=False).gpus_used() == 24  # its best demand order alone


def test_exact_repacking_finds_the_triangle():
    """Three TP-2 groups at 0.4 fit on three GPUs (pairs 01, 12, 02), which no single move
    reaches from 4 GPUs; the exact repacking of the node finds it."""
    top = _dgx(2)
    ds = [Demand("m", i, A100, 2, 0.4, 32.0) for i in range(3)]
    ds += [Demand("w", i, A100, 1, 0.7, 56.0) for i in range(2)]
    pl = place(top, ds, improve=False)
    assert pl.gpus_used() == 6 and bound(ds, top).best == 5
    assert improve(top, ds, pl).gpus_used() == 6  # local search alone: a plateau
    best = improve(top, ds, pl, repack=10)
    _never_worse(top, ds, pl, best)
    assert best.gpus_used() == 5
    assert place(top, ds, repack=10).gpus_used() == 5


def test_places_unplaced_replicas_on_used_gpus_only():
    top = _dgx(1)
    ds = [Demand("a", 0, A100, 1, 0.5, 40.0), Demand("a", 1, A100, 1, 0.5, 40.0)]
    half = Placement((Slot("a", 0, "dgx-0", (3,), 0.5, 40.0),), (("a", 1, "left out"),), "x")
    out = improve(top, ds, half)
    assert out.complete and out.gpus_used() == 1 and violations(top, ds, out) == []
    # no used GPU has room: it stays unplaced (placing it would open a GPU)
    full = Placement((Slot("a", 0, "dgx-0", (3,), 0.5, 40.0),), (("a", 1, "left out"),), "x")
    big = [ds[0], Demand("a", 1, A100, 1, 0.6, 40.0)]
    assert improve(top, big, full) == full


def test_existing_use_is_respected_and_kept():
    use = ((0.7, 56.0),) * 8
    top = Topology("t", (Node("busy", "r", A100, 8, 8, 80.0, use), Node("free", "r", A100, 8, 8, 80.0)))
    ds = [Demand("s", i, A100, 1, 0.3, 24.0) for i in range(8)]
    scattered = Placement(tuple(Slot("s", i, "free", (i,), 0.3, 24.0) for i in range(4))
                          + tuple(Slot("s", i, "busy", (i,), 0.3, 24.0) for i in range(4, 8)),
                          policy="x")
    out = improve(top, ds, scattered)
    _never_worse(top, ds, scattered, out)
    # three per GPU where nothing else runs, one on each busy GPU (0.7 + 0.3): 8 GPUs -> 4;
    # existing use is never exceeded (violations counts it)
    assert out.gpus_used() == 4 and violations(top, ds, out) == []
    assert sum(1 for s in out.slots if s.node == "busy") == 2


def test_never_worse_bounds_and_no_op_cases():
    top, ds = _stacked_case()
    pl = place(top, ds, orders=1, improve=False)
    assert improve(top, ds, pl, max_moves=0) is pl
    assert violations(top, ds, improve(top, ds, pl, deadline=Deadline.after(0.0))) == []
    one = improve(top, ds, pl, max_moves=1)
    _never_worse(top, ds, pl, one)
    empty = Placement((), (), "x")
    assert improve(top, [], empty) is empty
    # over capacity on this topology: returned unchanged, nothing to improve
    bad = Placement((Slot("tp8", 0, "dgx-0", tuple(range(8)), 0.3, 24.0),), (), "x")
    used = Topology("u", (replace(top.nodes[0], used=((1.0, 80.0),) * 8),))
    assert improve(used, ds[:1], bad) is bad


def test_deterministic_and_independent_of_demand_order():
    top, ds = _stacked_case()
    pl = place(top, ds, orders=1, improve=False)
    a = improve(top, ds, pl)
    shuffled = list(ds)
    random.Random(4).shuffle(shuffled)
    assert improve(top, shuffled, pl) == a == improve(top, ds, pl)


TYPES = {A100: 80.0, "H100-80GB": 79.65}


@st.composite
def instance(draw):
    nodes = []
    for k in range(draw(st.integers(1, 3))):
        gpu = draw(st.sampled_from(sorted(TYPES)))
        g = draw(st.sampled_from([2, 4, 8]))
        dom = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= g and g % d == 0]))
        use = ()
        if draw(st.booleans()):
            use = tuple((s, round(m * TYPES[gpu], 3)) for s, m in draw(st.lists(
                st.sampled_from([(0.0, 0.0), (0.0, 0.0), (0.3, 0.6), (0.5, 0.2), (1.0, 1.0)]),
                min_size=g, max_size=g)))
        nodes.append(Node(f"n{k}", f"r{k % 2}", gpu, g, dom, TYPES[gpu], use))
    ds = []
    for i in range(draw(st.integers(0, 10))):
        gpu = draw(st.sampled_from(sorted(TYPES)))
        ds.append(Demand(f"m{i % 3}", i, gpu, draw(st.sampled_from([1, 1, 1, 2, 4])),
                         draw(st.integers(1, 10)) / 10,
                         round(draw(st.integers(0, 10)) / 10 * TYPES[gpu], 6)))
    return Topology("t", tuple(nodes)), ds


@settings(FAST, max_examples=300)
@given(instance(), st.sampled_from(sorted(PLACERS)), st.integers(0, 3))
def test_improvement_never_worse_on_random_instances(inst, name, repack):
    top, ds = inst
    pl = placer(name).place(top, ds)
    out = improve(top, ds, pl, repack=repack)
    _never_worse(top, ds, pl, out)
    assert out.gpus_used() >= bound([d for d in ds if d.key in out.replicas()], top).best


@pytest.mark.parametrize("seed", range(6))
def test_hierarchical_with_improvement_never_worse_than_without(seed):
    rng = random.Random(seed)
    top = _dgx(4)
    ds = []
    for i in range(rng.randint(8, 30)):
        ds.append(Demand(f"m{i % 5}", i, A100, rng.choice([1, 1, 2, 4, 8]),
                         rng.randint(1, 10) / 10, rng.randint(1, 10) * 8.0))
    off, on = place(top, ds, improve=False), place(top, ds)
    assert violations(top, ds, on) == []
    assert (len(on.unplaced), on.gpus_used()) <= (len(off.unplaced), off.gpus_used())


def test_renaming_llms_keeps_the_signature():
    """Replicas are visited by fill, content and position, names last: renamed LLMs give the
    same per-node multisets and GPU count."""
    top, ds = _stacked_case()
    ren = {"tp8": "zz", "big": "aa", "mid": "mm"}
    ds2 = [replace(d, llm=ren[d.llm]) for d in ds]
    a = improve(top, ds, place(top, ds, orders=1, improve=False))
    b = improve(top, ds2, place(top, ds2, orders=1, improve=False))
    assert a.signature() == b.signature() and a.gpus_used() == b.gpus_used() == 20
