"""Lower bounds (L1, Martello-Toth L2, nodes) and the quality report."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_place import Demand, Node, Topology, bound, l1_bound, l2_bound, place, quality

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
    assert l1_bound(items) <= l2_bound(items) <= _opt_bins(items)


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
    from scepsy_place.fgd import domain_fragmentation, node_fragmentation

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
