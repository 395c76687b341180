"""Placements do not depend on the order of the input, and names only decide between
interchangeable nodes, racks and LLMs (docs/placement.md, "Order and names").

Oracles: the placement of the same instance given in another order (identical, names
included), and of the same instance renamed (identical up to the renaming when it keeps the
names' relative order; otherwise identical quality and identical per-node-content slots).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_place import PLACERS, Demand, Node, Placement, Topology, placer, quality, violations

TYPES = {"A100-80GB": 80.0, "H100-80GB": 79.65}
SHARES = (0.1, 0.2, 0.25, 0.3, 0.5, 0.6, 0.75, 1.0)
FAST = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
USES = {  # a few node states, drawn repeatedly so that interchangeable nodes are common
    "free": lambda g: (),
    "half": lambda g: ((0.5, 40.0),) + ((0.0, 0.0),) * (g - 1),
    "busy": lambda g: tuple(((0.3, 24.0) if i % 2 else (0.0, 0.0)) for i in range(g)),
}


@st.composite
def instances(draw):
    """Up to 6 nodes in up to 3 racks, built from few shapes (many equal nodes), and up to 10
    replicas of up to 4 LLMs."""
    nodes = []
    for k in range(draw(st.integers(1, 6))):
        gpu = draw(st.sampled_from(sorted(TYPES)))
        g = draw(st.sampled_from((1, 2, 4, 8)))
        dom = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= g]))
        use = USES[draw(st.sampled_from(sorted(USES)))](g)
        nodes.append(Node(f"n{k}", f"r{draw(st.integers(0, 2))}", gpu, g, dom, 80.0, use))
    ds = []
    for i in range(draw(st.integers(0, 10))):
        gpu = draw(st.sampled_from(sorted(TYPES)))
        share = draw(st.sampled_from(SHARES))
        ds.append(Demand(f"m{draw(st.integers(0, 3))}", i, gpu, draw(st.sampled_from((1, 1, 2, 4))),
                         share, share * 80.0))
    return Topology("t", tuple(nodes)), ds


def _options(name: str, spread: bool, colocate: bool) -> dict:
    if name != "hierarchical":
        return {}
    return {"spread_replicas": spread, "colocate": (("m0", "m1"),) if colocate else ()}


def _renamed(top: Topology, ds: list[Demand], node: dict, rack: dict, llm: dict
             ) -> tuple[Topology, list[Demand]]:
    return (Topology(top.name, tuple(replace(n, name=node[n.name], rack=rack[n.rack])
                                     for n in top.nodes)),
            [replace(d, llm=llm[d.llm]) for d in ds])


def _back(pl: Placement, node: dict, llm: dict) -> Placement:
    """``pl`` with the renaming undone."""
    inv_n = {v: k for k, v in node.items()}
    inv_m = {v: k for k, v in llm.items()}
    return Placement(tuple(replace(s, node=inv_n[s.node], llm=inv_m[s.llm]) for s in pl.slots),
                     tuple((inv_m[m], r, why) for m, r, why in pl.unplaced), pl.policy,
                     pl.placed_by)


def _by_content(top: Topology, pl: Placement) -> list:
    """Per used node: its content and its slots' (GPU indices, share, memory), sorted; no name."""
    out: dict[str, list] = {}
    for s in pl.slots:
        out.setdefault(s.node, []).append((s.gpus, s.units, s.memory_gib))
    return sorted((top.node(n).content, sorted(v)) for n, v in out.items())


def _unplaced(ds: list[Demand], pl: Placement) -> list:
    """The unplaced replicas' contents and reasons; no name."""
    by_key = {d.key: d for d in ds}
    return sorted((by_key[(m, r)].content, why) for m, r, why in pl.unplaced)


def _names(top: Topology, ds: list[Demand], rnd) -> tuple[dict, dict, dict]:
    nodes = [f"x{i}" for i in range(len(top.nodes))]
    racks = [f"q{i}" for i in range(3)]
    llms = [f"l{i}" for i in range(4)]
    for xs in (nodes, racks, llms):
        rnd.shuffle(xs)
    return ({n.name: nodes[i] for i, n in enumerate(top.nodes)},
            {f"r{i}": racks[i] for i in range(3)}, {f"m{i}": llms[i] for i in range(4)})


@settings(FAST, max_examples=250)
@given(instances(), st.sampled_from(sorted(PLACERS)), st.booleans(), st.booleans(),
       st.randoms(use_true_random=False))
def test_input_order_changes_nothing(inst, name, spread, colocate, rnd):
    """Every placer, every option: nodes and demands in another order give the same placement,
    names included."""
    top, ds = inst
    p = placer(name, **_options(name, spread, colocate))
    base = p.place(top, ds)
    nodes, shuffled = list(top.nodes), list(ds)
    rnd.shuffle(nodes)
    rnd.shuffle(shuffled)
    other = Topology(top.name, tuple(nodes))
    assert p.place(other, shuffled) == base
    assert violations(top, ds, base) == []


@settings(FAST, max_examples=250)
@given(instances(), st.sampled_from(sorted(PLACERS)), st.booleans(),
       st.randoms(use_true_random=False))
def test_renaming_keeps_the_placement_up_to_interchangeable_nodes(inst, name, spread, rnd):
    """Renaming nodes, racks and LLMs (and reordering them) keeps every quality figure and the
    slots per node content; a renaming that keeps the names' relative order (a prefix) gives
    exactly the renamed placement."""
    top, ds = inst
    p = placer(name, **_options(name, spread, False))
    base = p.place(top, ds)
    q0 = quality(top, base, ds)
    node, rack, llm = _names(top, ds, rnd)
    top2, ds2 = _renamed(top, ds, node, rack, llm)
    nodes, shuffled = list(top2.nodes), list(ds2)
    rnd.shuffle(nodes)
    rnd.shuffle(shuffled)
    top2 = Topology(top.name, tuple(nodes))
    other = p.place(top2, shuffled)
    assert quality(top2, other, ds2) == q0
    assert other.signature() == base.signature()
    assert _by_content(top2, other) == _by_content(top, base)
    assert _unplaced(ds2, other) == _unplaced(ds, base)
    # monotone renaming: the very same placement under the new names
    node = {n.name: f"z-{n.name}" for n in top.nodes}
    rack = {f"r{i}": f"y-r{i}" for i in range(3)}
    llm = {f"m{i}": f"w-m{i}" for i in range(4)}
    top3, ds3 = _renamed(top, ds, node, rack, llm)
    assert _back(p.place(top3, ds3), node, llm) == base


def test_equal_nodes_tie_by_name_not_by_position():
    """Two equal free nodes: whichever comes first in the input, the one whose name sorts first
    gets the replica."""
    a, b = (Node(n, "r", "A100-80GB", 2, 2, 80.0) for n in ("a", "b"))
    d = [Demand("m", 0, "A100-80GB", 1, 0.5, 40.0)]
    for name in PLACERS:
        for nodes in ((a, b), (b, a)):
            assert placer(name).place(Topology("t", nodes), d).slot("m", 0).node == "a"
