"""Two resources per GPU in every placer: compute and memory as independent vectors.

Random demands whose memory is drawn independently of their compute share, on random topologies
with existing use: for every placer of PLACERS (and the improvement phase on top of it) no GPU
goes over 100% of its compute or over its memory, TP groups sit on distinct GPUs of one NVLink
domain, existing use is respected, GPUs used are at least the vector bound, and the improvement
phase is never worse. The capacity recount here is independent of scepsy_place.packing.check.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.units import UNITS, share_units
from scepsy_place import PLACERS, Demand, Node, Placement, Topology, bound, placer, violations
from scepsy_place.packing.improve import improve
from scepsy_place.packing.topology import MEMORY_TOL_GIB

FAST = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TYPES = {"A100-80GB": 80.0, "H100-80GB": 79.65}


@st.composite
def topologies(draw, max_nodes=3):
    nodes = []
    for k in range(draw(st.integers(1, max_nodes))):
        gpu = draw(st.sampled_from(sorted(TYPES)))
        g = draw(st.sampled_from([1, 2, 4, 8]))
        dom = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= g and g % d == 0]))
        use = ()
        if draw(st.booleans()):  # existing use with memory apart from compute
            use = tuple((s, round(m * TYPES[gpu], 3)) for s, m in draw(st.lists(
                st.tuples(st.sampled_from([0.0, 0.0, 0.2, 0.5, 1.0]),
                          st.sampled_from([0.0, 0.0, 0.1, 0.6, 1.0])), min_size=g, max_size=g)))
        nodes.append(Node(f"n{k}", f"r{k % 2}", gpu, g, dom, TYPES[gpu], use))
    return Topology("t", tuple(nodes))


@st.composite
def vector_demands(draw, max_demands=10):
    out = []
    for i in range(draw(st.integers(0, max_demands))):
        gpu = draw(st.sampled_from(sorted(TYPES)))
        share = draw(st.integers(1, 10)) / 10
        memory = draw(st.integers(0, 10)) / 10  # independent of the share
        out.append(Demand(f"m{i % 4}", i, gpu, draw(st.sampled_from([1, 1, 1, 2, 4, 8])), share,
                          round(memory * TYPES[gpu], 6)))
    return out


def _recount(top: Topology, ds: list[Demand], pl: Placement) -> None:
    """Capacity and locality, counted from scratch (existing use included)."""
    want = {d.key: d for d in ds}
    compute: dict[tuple[str, int], int] = {}
    memory: dict[tuple[str, int], float] = {}
    for s in pl.slots:
        d, n = want[s.key], top.node(s.node)
        assert n.gpu == d.gpu and len(s.gpus) == d.tp == len(set(s.gpus))
        assert len({g // n.nvlink_domain for g in s.gpus}) == 1  # one NVLink domain
        assert share_units(s.share) == d.units and s.memory_gib >= d.memory_gib - MEMORY_TOL_GIB
        for g in s.gpus:
            compute[(s.node, g)] = compute.get((s.node, g), 0) + s.units
            memory[(s.node, g)] = memory.get((s.node, g), 0.0) + s.memory_gib
    for (name, g), units in compute.items():
        n = top.node(name)
        assert units + share_units(n.used[g][0]) <= UNITS
        assert memory[(name, g)] + n.used[g][1] <= n.memory_gib + MEMORY_TOL_GIB
    assert sorted([s.key for s in pl.slots] + [(m, r) for m, r, _ in pl.unplaced]) == \
        sorted(want)


@settings(FAST, max_examples=500)
@given(topologies(), vector_demands(), st.sampled_from(sorted(PLACERS)))
def test_every_placer_keeps_both_resources(top, ds, name):
    pl = placer(name).place(top, ds)
    _recount(top, ds, pl)
    assert violations(top, ds, pl) == []
    placed = [d for d in ds if d.key in pl.replicas()]
    b = bound(placed, top)
    assert pl.gpus_used() >= b.best >= b.memory_l2
    better = improve(top, ds, pl, repack=2)
    _recount(top, ds, better)
    assert violations(top, ds, better) == []
    assert len(better.unplaced) <= len(pl.unplaced)
    assert better.gpus_used() <= pl.gpus_used()


@settings(FAST, max_examples=200)
@given(topologies(), vector_demands())
def test_hierarchical_improvement_is_never_worse(top, ds):
    off = placer("hierarchical", improve=False).place(top, ds)
    on = placer("hierarchical").place(top, ds)
    _recount(top, ds, on)
    assert (len(on.unplaced), on.gpus_used()) <= (len(off.unplaced), off.gpus_used())


def test_memory_alone_decides():
    """Compute would fit one GPU; memory (0.6 of the GPU each) needs one GPU per replica, in
    every placer."""
    top = Topology("t", (Node("n", "r", "A100-80GB", 4, 4, 80.0),))
    ds = [Demand("m", i, "A100-80GB", 1, 0.1, 48.0) for i in range(4)]
    assert bound(ds, top).best == 4
    for name in sorted(PLACERS):
        pl = placer(name).place(top, ds)
        _recount(top, ds, pl)
        assert pl.complete and pl.gpus_used() == 4
