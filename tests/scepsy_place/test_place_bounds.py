"""Lower bounds (L1, Martello-Toth L2, memory, the two-dimensional vector bound, nodes) and the
quality report."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_place import Demand, Node, Topology, bound, l1_bound, l2_bound, place, quality
from scepsy_place.packing.bounds import (
    MEMORY_SCALE,
    dff_bound,
    domain_bound,
    memory_capacity,
    memory_items,
    vector_bound,
)

FAST = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _opt_bins(items: list[int], cap: int = 1000) -> int:
    """Fewest bins by exhaustive search (tiny inputs only)."""
    items = sorted(items, reverse=True)
    best = [len(items)]

    def rec(i: int, bins: list[int]) -> None:
        if len(bins) >= best[0]:
            return
        if i == len(items):
            best[0] = len(bins)
            return
        seen = set()
        for b in range(len(bins)):
            if bins[b] + items[i] <= cap and bins[b] not in seen:
                seen.add(bins[b])
                bins[b] += items[i]
                rec(i + 1, bins)
                bins[b] -= items[i]
        bins.append(items[i])
        rec(i + 1, bins)
        bins.pop()

    rec(0, [])
    return best[0] if items else 0


@pytest.mark.parametrize(("items", "l1", "l2"), [
    ([600, 600, 600], 2, 3),
    ([500] * 4, 2, 2),
    ([], 0, 0),
    ([1000, 1000, 1], 3, 3),
    ([700, 700, 300, 300, 300], 3, 3),
    ([510, 510, 510, 490, 490, 490], 3, 3),
    ([400] * 5, 2, 2),
])
def test_known_values(items, l1, l2):
    assert l1_bound(items) == l1
    assert l2_bound(items) == l2


@settings(FAST, max_examples=300)
@given(st.lists(st.integers(1, 1000), max_size=8))
def test_l1_le_l2_le_optimum(items):
    opt = _opt_bins(items)
    assert l1_bound(items) <= l2_bound(items) <= opt
    assert l1_bound(items) <= dff_bound(items) <= opt


def test_dual_feasible_functions_see_items_above_a_third():
    """24 slices of 0.4 go at most two per GPU: u_2 counts each as 0.5 (12 GPUs), L2 says 10;
    with four 0.8 slices (which take no 0.4 beside them) 16, L2 14."""
    assert dff_bound([400] * 24) == 12 and l2_bound([400] * 24) == 10
    assert dff_bound([800] * 4 + [400] * 24) == 16 > l2_bound([800] * 4 + [400] * 24) == 14
    ds = [Demand("a", i, "A100-80GB", 2, 0.8, 64.0) for i in range(2)]
    ds += [Demand("b", i, "A100-80GB", 4, 0.4, 32.0) for i in range(6)]
    assert bound(ds).vector == 16 and bound(ds).l2 == 14
    assert dff_bound([]) == 0 and dff_bound([1000, 1]) == 2
    with pytest.raises(ValueError):
        dff_bound([1001])


def test_l2_beats_l1_on_large_items():
    assert l2_bound([600] * 10) == 10 > l1_bound([600] * 10) == 6


def test_bound_per_type_and_nodes():
    ds = [Demand("a", i, "A100-80GB", 3, 1.0, 80.0) for i in range(2)]
    ds += [Demand("b", 0, "H100-80GB", 1, 0.6, 48.0), Demand("b", 1, "H100-80GB", 1, 0.6, 48.0)]
    top = Topology("t", (Node("n0", "r", "A100-80GB", 4, 4, 80.0), Node("n1", "r", "A100-80GB", 4, 4, 80.0),
                         Node("h", "r", "H100-80GB", 8, 8, 79.65)))
    b = bound(ds, top)
    assert b.by_gpu["A100-80GB"] == (6, 6, 2)  # two 3-GPU groups cannot share a 4-GPU node
    assert b.by_gpu["H100-80GB"] == (2, 2, 1)
    assert (b.l1, b.l2, b.nodes) == (8, 8, 3)
    assert bound(ds).nodes == 2  # without a topology: one node per type
    q = quality(top, place(top, ds), ds)
    assert q["gpus_used"] == 8 and q["gpus_over_bound"] == 1.0 and q["nodes_used"] == 3
    assert q["unplaced"] == 0 and q["free_gpus"] == 8


def test_tp_groups_count_tp_items():
    ds = [Demand("a", 0, "A100-80GB", 4, 0.6, 48.0)]
    assert bound(ds).l1 == 3 and bound(ds).l2 == 4


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_bound_is_tight_for_equal_shares(n):
    for share, per in ((0.5, 2), (0.25, 4), (0.2, 5)):
        ds = [Demand("m", i, "A100-80GB", 1, share, share * 80) for i in range(n * per)]
        top = Topology("t", tuple(Node(f"n{k}", "r", "A100-80GB", 2, 2, 80.0) for k in range(n)))
        pl = place(top, ds)
        assert pl.complete and pl.gpus_used() == bound(ds).l2 == n


def test_brute_force_helper():
    assert _opt_bins([600, 600, 400, 400]) == 2
    assert all(_opt_bins(list(p)) == 2 for p in itertools.permutations([700, 300, 500, 500]))


@settings(FAST, max_examples=200)
@given(st.sampled_from([1, 2, 4, 8]), st.data())
def test_fragmentation_counts_what_each_nvlink_domain_holds(gpus, data):
    """Oracle: FGD of each domain scored as a node of its own. One domain per node is FGD's
    node measure; a TP group larger than every domain makes all free capacity a fragment."""
    from scepsy_place.packing.fgd import domain_fragmentation, node_fragmentation

    dom = data.draw(st.sampled_from([d for d in (1, 2, 4, 8) if gpus % d == 0 and d <= gpus]))
    free = data.draw(st.lists(st.sampled_from([0, 100, 300, 500, 1000]), min_size=gpus,
                              max_size=gpus))
    mix = data.draw(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]),
                                       st.sampled_from([100, 250, 500, 1000]),
                                       st.sampled_from([0.25, 0.5, 1.0])), min_size=1, max_size=3))
    want = sum(node_fragmentation(free[k:k + dom], mix) for k in range(0, gpus, dom))
    assert domain_fragmentation(free, dom, mix) == pytest.approx(want, rel=1e-12, abs=1e-9)
    assert domain_fragmentation(free, gpus, mix) == pytest.approx(node_fragmentation(free, mix),
                                                                 rel=1e-12, abs=1e-9)
    if all(tp > dom for tp, _, _ in mix):
        assert domain_fragmentation(free, dom, mix) == pytest.approx(
            sum(free) * sum(p for _, _, p in mix), rel=1e-12)


def test_quality_fragmentation_sees_nvlink_domains():
    """Eight free GPUs hold a TP-4 group in one 8-GPU domain, never in 2-GPU domains: there all
    8,000 thousandths are a fragment for it."""
    ds = [Demand("t", 0, "A100-80GB", 4, 0.5, 40.0)]
    wide = Topology("w", (Node("a", "r", "A100-80GB", 8, 8, 80.0),))
    narrow = Topology("n", (Node("a", "r", "A100-80GB", 8, 2, 80.0),))
    from scepsy_place import fragmentation, task_mix

    assert fragmentation(wide, task_mix(ds)) == 0.0
    assert fragmentation(narrow, task_mix(ds)) == 8000.0


# --------------------------------------------------------------------------- vector bounds

def _opt_vector(ds: list[Demand], memory: float = 80.0) -> int:
    """Fewest GPUs by exhaustive search: per-GPU items (units, GiB), a TP group's slices on
    distinct GPUs, capacity 1000 units and ``memory`` GiB (no node structure: a relaxation of
    placement, so every placement uses at least this many)."""
    items = sorted(((d.units, d.memory_gib, d.key) for d in ds for _ in range(d.tp)),
                   key=lambda x: (-x[0] - x[1] / memory * 1000, x[2]))
    best = [len(items)]

    def rec(i: int, bins: list[list]) -> None:
        if len(bins) >= best[0]:
            return
        if i == len(items):
            best[0] = len(bins)
            return
        u, m, k = items[i]
        seen = set()
        for b in bins:
            state = (b[0], b[1], k in b[2])
            if (b[0] + u <= 1000 and b[1] + m <= memory + 1e-6 and k not in b[2]
                    and state not in seen):
                seen.add(state)
                b[0] += u
                b[1] += m
                b[2].append(k)
                rec(i + 1, bins)
                b[2].pop()
                b[0] -= u
                b[1] -= m
        bins.append([u, m, [k]])
        rec(i + 1, bins)
        bins.pop()

    rec(0, [])
    return best[0] if items else 0


@st.composite
def vector_demands(draw, max_slices=7):
    out, slices = [], 0
    for i in range(draw(st.integers(0, 6))):
        tp = draw(st.sampled_from([1, 1, 2, 3]))
        if slices + tp > max_slices:
            break
        slices += tp
        share = draw(st.integers(1, 10)) / 10
        mem = draw(st.integers(0, 10)) * 8.0  # tenths of 80 GiB, independent of the share
        out.append(Demand(f"m{i}", 0, "A100-80GB", tp, share, mem))
    return out


@settings(FAST, max_examples=400)
@given(vector_demands())
def test_vector_bounds_le_exhaustive_optimum(ds):
    """Every bound (compute and memory L1/L2, the conflict-clique vector bound) is at most the
    exhaustive optimum of the two-dimensional packing with TP groups on distinct GPUs."""
    b = bound(ds)
    opt = _opt_vector(ds)
    assert b.l1 <= b.l2 <= b.vector <= b.best <= opt
    assert b.memory_l1 <= b.memory_l2 <= b.vector
    if ds:
        assert b.vector_by_gpu["A100-80GB"] == (b.memory_l1, b.memory_l2, b.vector)


@settings(FAST, max_examples=300)
@given(st.lists(st.tuples(st.integers(1, 10), st.integers(0, 10), st.sampled_from([1, 1, 2]),
                          st.just(1)), max_size=5))
def test_vector_bound_on_small_integers(groups):
    """The bound on raw integer items (capacity 10 × 10) against the same exhaustive search."""
    ds = [Demand(f"g{i}", 0, "A100-80GB", tp, c / 10, m * 8.0)
          for i, (c, m, tp, _) in enumerate(groups)]
    assert vector_bound(groups, (10, 10)) <= _opt_vector(ds)


def test_vector_bound_known_values():
    # five items that pairwise cannot share a GPU in one dimension or the other: each
    # dimension's L2 says 3, the clique 5 (= the optimum)
    groups = [(5, 4, 1, 1), (1, 10, 1, 1), (2, 10, 1, 1), (10, 2, 1, 1), (8, 2, 1, 1)]
    assert vector_bound(groups, (10, 10)) == 5
    assert l2_bound([5, 1, 2, 10, 8], 10) == l2_bound([4, 10, 10, 2, 2], 10) == 3
    ds = [Demand(f"g{i}", 0, "A100-80GB", 1, c / 10, m * 8.0) for i, (c, m, _, _) in
          enumerate(groups)]
    assert bound(ds).vector == _opt_vector(ds) == 5
    # a TP-4 group at 0.1: L2 = 1, its slices need four distinct GPUs
    tp4 = [Demand("t", 0, "A100-80GB", 4, 0.1, 8.0)]
    assert (bound(tp4).l2, bound(tp4).vector) == (1, 4)
    # memory decides: four replicas at 0.1 compute and 0.6 memory need four GPUs
    mem = [Demand("m", i, "A100-80GB", 1, 0.1, 48.0) for i in range(4)]
    b = bound(mem)
    assert (b.l2, b.memory_l1, b.memory_l2, b.vector, b.best) == (1, 3, 4, 4, 4)
    assert vector_bound([], (10, 10)) == 0
    with pytest.raises(ValueError):
        vector_bound([(11, 0, 1, 1)], (10, 10))


def test_memory_items_never_exceed_a_fitting_set():
    """Rounded down against the GPU memory plus the placers' tolerance: items that fit one GPU
    together fit MEMORY_SCALE."""
    for parts in ([79.65], [39.825, 39.825], [26.55] * 3, [7.965] * 10, [0.1] * 796):
        assert sum(memory_items(p, 79.65) for p in parts) <= MEMORY_SCALE
    assert memory_items(80.0, 80.0) == MEMORY_SCALE - 1  # the tolerance's millionth


def test_memory_capacity_from_topology_or_catalog():
    top = Topology("t", (Node("a", "r", "A100-80GB", 2, 2, 40.0),
                         Node("b", "r", "A100-80GB", 2, 2, 80.0)))
    assert memory_capacity("A100-80GB", top) == 80.0
    assert memory_capacity("A100-80GB") == 80.0
    assert memory_capacity("no-such-gpu") is None
    ds = [Demand("x", 0, "no-such-gpu", 1, 0.5, 10.0)]
    assert bound(ds).memory_l2 == 0 and bound(ds).vector == 1


def test_quality_reports_the_gap_to_the_best_bound():
    top = Topology("t", (Node("a", "r", "A100-80GB", 8, 8, 80.0),))
    ds = [Demand("m", i, "A100-80GB", 1, 0.1, 48.0) for i in range(4)]
    q = quality(top, place(top, ds), ds)
    assert q["bound_l2"] == 1 and q["bound_vector"] == q["bound_best"] == 4
    assert q["gpus_used"] == 4 and q["gap_to_bound"] == 0.0 and q["gpus_over_bound"] == 4.0


def _opt_placement(top: Topology, ds: list[Demand]) -> int | None:
    """Fewest GPUs over every complete placement on ``top`` (exhaustive; tiny inputs), or None
    when nothing places them all."""
    free = {(n.name, g): [n.free_units(g), n.free_memory(g)] for n in top.nodes
            for g in range(n.gpus)}
    options = []
    for d in ds:
        opts = [(n.name, gs) for n in top.nodes if n.gpu == d.gpu for dom in n.domains()
                for gs in itertools.combinations(dom, d.tp)]
        options.append(opts)
    order = sorted(range(len(ds)), key=lambda i: len(options[i]))
    best: list[int | None] = [None]
    used: dict[tuple[str, int], int] = {}

    def rec(k: int) -> None:
        if best[0] is not None and len(used) >= best[0]:
            return
        if k == len(order):
            best[0] = len(used)
            return
        d = ds[order[k]]
        for name, gs in options[order[k]]:
            if all(free[(name, g)][0] >= d.units and free[(name, g)][1] >= d.memory_gib - 1e-6
                   for g in gs):
                for g in gs:
                    free[(name, g)][0] -= d.units
                    free[(name, g)][1] -= d.memory_gib
                    used[(name, g)] = used.get((name, g), 0) + 1
                rec(k + 1)
                for g in gs:
                    free[(name, g)][0] += d.units
                    free[(name, g)][1] += d.memory_gib
                    used[(name, g)] -= 1
                    if not used[(name, g)]:
                        del used[(name, g)]

    rec(0)
    return best[0]


@settings(FAST, max_examples=300)
@given(st.sampled_from([(2, 4, 4), (2, 4, 2), (3, 2, 2), (1, 8, 4)]), st.data())
def test_bounds_with_a_topology_le_exhaustive_placement(shape, data):
    """With a topology the bounds add the full-domain bound (groups as wide as the largest NVLink
    domain pack into domains); every bound is at most the fewest GPUs of any placement."""
    nodes, gpus, dom = shape
    top = Topology("t", tuple(Node(f"n{i}", "r", "A100-80GB", gpus, dom, 80.0)
                              for i in range(nodes)))
    ds = []
    for i in range(data.draw(st.integers(1, 4))):
        tp = data.draw(st.sampled_from([t for t in (1, 2, 4) if t <= dom]))
        ds.append(Demand(f"m{i}", 0, "A100-80GB", tp, data.draw(st.integers(1, 10)) / 10,
                         data.draw(st.integers(0, 10)) * 8.0))
    opt = _opt_placement(top, ds)
    if opt is not None:
        b = bound(ds, top)
        assert b.best <= opt and b.vector <= opt and b.nodes <= nodes


def test_full_domain_groups_pack_into_domains():
    """Three TP-8 groups at 0.4 on 8-GPU domains: at most two share a domain, so two domains
    (16 GPUs), where the per-GPU view sees 12 (two 0.4 slices per GPU; L2: 10)."""
    top = Topology("t", tuple(Node(f"n{i}", "r", "A100-80GB", 8, 8, 80.0) for i in range(3)))
    ds = [Demand("w", i, "A100-80GB", 8, 0.4, 32.0) for i in range(3)]
    assert (bound(ds).best, bound(ds).l2) == (12, 10)
    assert bound(ds, top).best == bound(ds, top).vector == 16 == _opt_placement(top, ds)
    # items that fit beside no full-domain group sit elsewhere: 0.7 next to 0.4 is too much
    more = ds[:2] + [Demand("x", i, "A100-80GB", 1, 0.7, 56.0) for i in range(3)]
    assert domain_bound([(400, 400_000, 8, 2), (700, 700_000, 1, 3)], 8) == 8 + 3
    assert bound(more, top).best == 11 == _opt_placement(top, more)
    assert domain_bound([(400, 0, 4, 1)], 8) == 0
