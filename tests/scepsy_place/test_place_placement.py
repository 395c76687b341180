"""Placers: invariants on random instances, optimality on tiny ones, incremental use."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_place import (
    FALLBACKS,
    PLACERS,
    Demand,
    Hierarchical,
    Node,
    Placement,
    Slot,
    Topology,
    apply,
    bound,
    demands,
    load_topology,
    place,
    placer,
    quality,
    remove,
    violations,
)

TYPES = {"A100-80GB": 80.0, "H100-80GB": 79.65}
SHARES = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 1.0)
FAST = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def nodes_st(draw, max_nodes=3, sizes=(1, 2, 4, 8), types=tuple(TYPES), used=True):
    out = []
    for k in range(draw(st.integers(1, max_nodes))):
        gpu = draw(st.sampled_from(types))
        g = draw(st.sampled_from(sizes))
        dom = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= g]))
        use = ()
        if used and draw(st.booleans()):
            use = tuple((s, round(s * TYPES[gpu], 3))
                        for s in draw(st.lists(st.sampled_from((0.0, 0.0, 0.3, 0.5, 1.0)),
                                               min_size=g, max_size=g)))
        out.append(Node(f"n{k}", f"r{k % 2}", gpu, g, dom, TYPES[gpu], use))
    return Topology("t", tuple(out))


@st.composite
def demands_st(draw, max_demands=8, tps=(1, 1, 1, 2, 4, 8), types=tuple(TYPES), shares=SHARES):
    out = []
    for i in range(draw(st.integers(0, max_demands))):
        gpu = draw(st.sampled_from(types))
        share = draw(st.sampled_from(shares))
        out.append(Demand(f"m{i % 3}", i, gpu, draw(st.sampled_from(tps)), share,
                          round(share * TYPES[gpu], 6)))
    return out


def _check(top: Topology, ds: list[Demand], pl: Placement) -> None:
    assert violations(top, ds, pl) == []
    q = quality(top, pl, ds)
    assert q["gpus_used"] >= q["bound_l2"] >= q["bound_l1"]
    assert q["nodes_used"] >= q["bound_nodes"] or q["placed"] == 0
    assert q["placed"] + q["unplaced"] == len(ds)


@settings(FAST, max_examples=1200)
@given(nodes_st(), demands_st(), st.sampled_from(sorted(PLACERS)), st.booleans())
def test_invariants_hold_on_random_instances(top, ds, name, spread):
    """>= 1,000 random topologies (with existing use) and demands across all placers."""
    opts = {"spread_replicas": spread, "colocate": (("m0", "m1"),)} if name == "hierarchical" else {}
    pl = placer(name, **opts).place(top, ds)
    _check(top, ds, pl)
    assert pl.policy == name


def test_every_placer_passes_a_mixed_instance():
    top = load_topology("datasets/clusters/racks-a100-h100.yaml")
    alloc = Allocation({"big": Instance("H100-80GB", 4, 1.0, 2), "mid": Instance("A100-80GB", 2, 0.5, 5),
                        "small": Instance("A100-80GB", 1, 0.3, 9), "h": Instance("H100-80GB", 1, 0.5, 3)})
    ds = demands(alloc)
    for name in PLACERS:
        pl = place(top, ds, name)
        _check(top, ds, pl)
        assert pl.complete, pl.unplaced


def test_demands_from_allocation():
    ds = demands(Allocation({"a": Instance("a100-80gb", 2, 0.5, 2), "b": Instance("L4", 1, 1.0)}))
    assert [(d.llm, d.replica, d.gpu, d.tp) for d in ds] == [
        ("a", 0, "A100-80GB", 2), ("a", 1, "A100-80GB", 2), ("b", 0, "L4", 1)]
    assert ds[0].memory_gib == 40.0 and ds[2].memory_gib == pytest.approx(22.49)
    more = demands(Allocation({"a": Instance("A100-80GB", 2, 0.5, 2)}), first_replica={"a": 2})
    assert [d.replica for d in more] == [2, 3]


@pytest.mark.parametrize("name", sorted(PLACERS))
def test_fits_in_aggregate_but_not_on_whole_gpus(name):
    """3 × 0.6 = 1.8 GPUs of 2, but no two 0.6 shares share a GPU: one replica is unplaced."""
    top = Topology("two", (Node("n", "r", "A100-80GB", 2, 2, 80.0),))
    ds = demands(Allocation({"m": Instance("A100-80GB", 1, 0.6, 3)}))
    pl = place(top, ds, name)
    assert len(pl.slots) == 2 and len(pl.unplaced) == 1
    # the greedy placers see fragmented capacity; blocks see no wholly free GPU left
    assert ("wholly free" if name == "blocks" else "fragmented") in pl.unplaced[0][2]
    assert violations(top, ds, pl) == []


def test_unplaced_reasons():
    top = Topology("t", (Node("n", "r", "A100-80GB", 8, 4, 80.0),))
    ds = [Demand("h", 0, "H100-80GB", 1, 1.0, 79.65), Demand("big", 0, "A100-80GB", 8, 0.5, 40.0),
          Demand("fill", 0, "A100-80GB", 4, 1.0, 80.0), Demand("fill", 1, "A100-80GB", 4, 1.0, 80.0),
          Demand("late", 0, "A100-80GB", 1, 0.5, 40.0)]
    why = {(m, r): w for m, r, w in place(top, ds).unplaced}
    assert "no node has H100-80GB" in why[("h", 0)]
    assert "largest NVLink domain" in why[("big", 0)]
    assert "not enough free" in why[("late", 0)]


def test_deterministic_and_seed_free():
    top = load_topology("datasets/clusters/racks-a100-h100.yaml")
    ds = demands(Allocation({"a": Instance("A100-80GB", 2, 0.4, 7), "b": Instance("A100-80GB", 1, 0.3, 11),
                             "c": Instance("H100-80GB", 2, 1.0, 3)}))
    for name in PLACERS:
        first = place(top, ds, name)
        assert place(top, ds, name) == first == place(top, ds, name, seed=5)
        assert place(top, list(reversed(ds)), name) == first


@settings(FAST, max_examples=150)
@given(nodes_st(max_nodes=4), demands_st(), st.randoms(use_true_random=False))
def test_quality_is_permutation_invariant(top, ds, rnd):
    """Shuffling demands and nodes, and renaming nodes, keeps the hierarchical placer's
    per-node multisets and quality figures."""
    base = place(top, ds)
    q0 = {k: v for k, v in quality(top, base, ds).items()}
    nodes = list(top.nodes)
    rnd.shuffle(nodes)
    names = [n.name for n in nodes]
    rnd.shuffle(names)
    # renaming keeps racks attached to node states: one rack for all nodes
    one_rack = [replace(n, rack="r") for n in top.nodes]
    renamed = Topology("t", tuple(replace(n, name=f"x{names[i]}", rack="r")
                                  for i, n in enumerate(reversed(one_rack))))
    shuffled_ds = list(ds)
    rnd.shuffle(shuffled_ds)
    other = place(Topology("t", tuple(nodes)), shuffled_ds)
    assert other.signature() == base.signature()
    assert quality(Topology("t", tuple(nodes)), other, ds) == q0
    single = Topology("t", tuple(one_rack))
    a, b = place(single, ds), place(renamed, shuffled_ds)
    assert a.signature() == b.signature()
    assert quality(single, a, ds) == quality(renamed, b, ds)


# --------------------------------------------------------------------------- optimality


def _brute(top: Topology, ds: list[Demand]) -> int | None:
    """Fewest GPUs of a placement of every demand, by exhaustive search (None: none exists)."""
    free = {n.name: [n.free_units(i) for i in range(n.gpus)] for n in top.nodes}
    use: dict[tuple[str, int], int] = {}
    best: list[int | None] = [None]
    order = sorted(ds, key=lambda d: (-d.size, d.key))

    def rec(i: int) -> None:
        opened = sum(1 for v in use.values() if v)
        if best[0] is not None and opened >= best[0]:
            return
        if i == len(order):
            best[0] = opened
            return
        d = order[i]
        for n in top.nodes:
            if n.gpu != d.gpu:
                continue
            for dom in n.domains():
                for gs in itertools.combinations(dom, d.tp):
                    if all(free[n.name][g] >= d.units for g in gs):
                        for g in gs:
                            free[n.name][g] -= d.units
                            use[(n.name, g)] = use.get((n.name, g), 0) + 1
                        rec(i + 1)
                        for g in gs:
                            free[n.name][g] += d.units
                            use[(n.name, g)] -= 1

    rec(0)
    return best[0]


@settings(FAST, max_examples=400)
@given(nodes_st(max_nodes=2, sizes=(1, 2, 4), types=("A100-80GB",), used=False),
       demands_st(max_demands=6, tps=(1, 1, 1, 2, 4), types=("A100-80GB",)))
def test_hierarchical_is_near_optimal_on_tiny_instances(top, ds):
    """Against exhaustive search: never fewer GPUs than the optimum (the search is right), at
    most one more, and the bounds hold."""
    opt = _brute(top, ds)
    pl = place(top, ds)
    _check(top, ds, pl)
    if opt is not None and pl.complete:
        assert opt <= pl.gpus_used() <= opt + 1
        assert bound(ds, top).l2 <= opt


def test_hierarchical_is_optimal_on_most_tiny_instances():
    """A fixed sample of 600 tiny instances: where a complete placement exists, hierarchical
    finds one in >= 98% and with the fewest GPUs in >= 95% (measured: 208 feasible, 208 complete,
    208 optimal; 207 without the improvement phase)."""
    import random

    rng = random.Random(0)
    feasible = complete = optimal = 0
    for _ in range(600):
        nodes = []
        for k in range(rng.randint(1, 2)):
            g = rng.choice([1, 2, 4])
            nodes.append(Node(f"n{k}", "r", "A100-80GB", g, rng.choice([d for d in (1, 2, 4) if d <= g]), 80.0))
        top = Topology("t", tuple(nodes))
        ds = [Demand(f"m{i}", 0, "A100-80GB", rng.choice([1, 1, 1, 2, 4]), sh, sh * 80)
              for i, sh in enumerate(rng.choice(SHARES) for _ in range(rng.randint(1, 6)))]
        opt = _brute(top, ds)
        if opt is None:
            continue
        feasible += 1
        pl = place(top, ds)
        complete += pl.complete
        optimal += pl.complete and pl.gpus_used() == opt
    assert feasible >= 150
    assert complete >= 0.98 * feasible and optimal >= 0.95 * feasible, (feasible, complete, optimal)


@settings(FAST, max_examples=200)
@given(st.integers(0, 3), st.integers(1, 4), st.integers(0, 3),
       st.lists(st.integers(0, 3), min_size=1, max_size=20), st.sampled_from(["ffd", "hierarchical"]))
def test_power_of_two_groups_are_exact(k, n_nodes, j, exps, name):
    """Whole-GPU TP groups of 2^i GPUs on nodes of 2^k GPUs (domains 2^j): everything that fits
    in aggregate is placed, on exactly L1 GPUs."""
    size, dom = 2 ** k, 2 ** min(j, k)
    top = Topology("p2", tuple(Node(f"n{i}", "r", "A100-80GB", size, dom, 80.0)
                               for i in range(n_nodes)))
    ds = [Demand(f"m{i}", 0, "A100-80GB", 2 ** min(e, j, k), 1.0, 80.0) for i, e in enumerate(exps)]
    total = n_nodes * size
    keep, acc = [], 0
    for d in sorted(ds, key=lambda d: -d.tp):
        if acc + d.tp <= total:
            keep.append(d)
            acc += d.tp
    pl = place(top, keep, name)
    assert pl.complete
    assert pl.gpus_used() == bound(keep).l1 == acc
    assert violations(top, keep, pl) == []


# --------------------------------------------------------------------------- options


def test_spread_replicas_uses_other_nodes_and_racks():
    top = Topology("t", (Node("a", "r0", "A100-80GB", 2, 2, 80.0), Node("b", "r1", "A100-80GB", 2, 2, 80.0)))
    ds = demands(Allocation({"m": Instance("A100-80GB", 1, 0.25, 4)}))
    packed = place(top, ds)
    assert packed.gpus_used() == 1
    spread = place(top, ds, spread_replicas=True)
    assert spread.nodes_used() == 2
    assert sorted(len(v) for v in spread.per_node().values()) == [2, 2]
    assert violations(top, ds, spread) == []


def test_colocate_keeps_workflow_mates_close():
    busy = ((0.9, 72.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0))
    top = Topology("t", tuple(Node(n, "r", "A100-80GB", 4, 4, 80.0, busy) for n in ("a", "b", "c")))
    ds = [Demand("x", 0, "A100-80GB", 1, 0.5, 40.0), Demand("y", 0, "A100-80GB", 1, 0.6, 48.0),
          Demand("z", 0, "A100-80GB", 1, 0.7, 56.0)]
    pl = place(top, ds, colocate=(("x", "y", "z"),))
    assert pl.nodes_used() == 1 and pl.gpus_used() == 3
    together = place(top, ds, colocate=(("x", "z"),))
    assert together.slot("x", 0).node == together.slot("z", 0).node


def test_registry_errors():
    with pytest.raises(InputError, match="policy"):
        placer("nope")
    with pytest.raises(InputError, match="options"):
        placer("ffd", spread_replicas=True)
    top = Topology("t", (Node("a", "r", "A100-80GB", 1, 1, 80.0),))
    d = Demand("m", 0, "A100-80GB", 1, 0.5, 40.0)
    with pytest.raises(InputError, match="once"):
        place(top, [d, d])


# --------------------------------------------------------------------------- incremental


def test_incremental_scale_out_and_in():
    top = load_topology("datasets/clusters/racks-a100-h100.yaml")
    first = demands(Allocation({"a": Instance("A100-80GB", 2, 0.5, 3), "b": Instance("H100-80GB", 1, 0.5, 2)}))
    p1 = place(top, first)
    t1 = apply(top, p1)
    more = demands(Allocation({"a": Instance("A100-80GB", 2, 0.5, 2)}), first_replica={"a": 3})
    p2 = place(t1, more)
    assert violations(t1, more, p2) == []
    both = p1.merge(p2)
    assert violations(top, first + more, both) == []
    t2 = apply(t1, p2)
    t3 = remove(t2, both, [("a", 0), "b"])
    rest = both.without([("a", 0), "b"])
    assert {s.key for s in rest.slots} == {("a", 1), ("a", 2), ("a", 3), ("a", 4)}
    assert all(rest.slot(*k) == both.slot(*k) for k in rest.replicas())  # nobody moved
    assert t3 == apply(top, rest)
    assert remove(t3, rest, ["a"]) == top
    with pytest.raises(InputError):
        remove(top, both, [("a", 0)])  # never applied: nothing to free
    with pytest.raises(InputError):
        remove(t3, both, [("zz", 0)])
    with pytest.raises(InputError):
        apply(apply(t1, p2), p2)  # twice: over capacity


class PlaceRemove(RuleBasedStateMachine):
    """Random sequences of placing and removing replicas keep every invariant, and what stays
    never moves."""

    placed = Bundle("placed")

    def __init__(self) -> None:
        super().__init__()
        self.base = Topology("s", (
            Node("a", "r0", "A100-80GB", 4, 4, 80.0, ((0.5, 40.0), (0.0, 0.0), (0.0, 0.0), (1.0, 80.0))),
            Node("b", "r0", "A100-80GB", 8, 4, 80.0),
            Node("c", "r1", "H100-80GB", 2, 2, 79.65)))
        self.topology = self.base
        self.live = Placement(())
        self.demands: dict[tuple[str, int], Demand] = {}
        self.serial = 0

    @rule(target=placed, ds=demands_st(max_demands=4, tps=(1, 1, 2, 4)),
          name=st.sampled_from(sorted(PLACERS)))
    def add(self, ds, name):
        self.serial += 1
        ds = [replace(d, llm=f"s{self.serial}-{d.llm}") for d in ds]
        before = self.live
        pl = placer(name).place(self.topology, ds)
        assert violations(self.topology, ds, pl) == []
        self.topology = apply(self.topology, pl)
        self.live = self.live.merge(Placement(pl.slots))
        self.demands.update((d.key, d) for d in ds if d.key in pl.replicas())
        assert all(self.live.slot(*k) == before.slot(*k) for k in before.replicas())
        return [s.key for s in pl.slots]

    @rule(keys=consumes(placed), k=st.integers(0, 3))
    def drop(self, keys, k):
        gone = keys[:k]
        if not gone:
            return
        before = self.live
        self.topology = remove(self.topology, self.live, gone)
        self.live = self.live.without(gone)
        for key in gone:
            del self.demands[key]
        assert all(self.live.slot(*x) == before.slot(*x) for x in self.live.replicas())

    @invariant()
    def consistent(self):
        assert violations(self.base, list(self.demands.values()), self.live) == []
        assert self.topology == apply(self.base, self.live)


TestPlaceRemove = PlaceRemove.TestCase
TestPlaceRemove.settings = settings(FAST, max_examples=60, stateful_step_count=12)


def test_slot_and_placement_helpers():
    pl = Placement((Slot("b", 0, "n", (0, 1), 0.5, 40.0), Slot("a", 0, "n", (1,), 0.5, 40.0)),
                   (("c", 0, "why"),), "x")
    assert [s.llm for s in pl.slots] == ["a", "b"]
    assert pl.per_gpu() == {("n", 0): 500, ("n", 1): 1000}
    assert pl.per_node() == {"n": ((1, 500), (2, 500))}
    assert pl.gpus_used() == 2 and pl.nodes_used() == 1 and not pl.complete
    assert pl.to_dict()["unplaced"] == [{"llm": "c", "replica": 0, "reason": "why"}]


# --------------------------------------------------------------------------- never worse than a simpler placer


def _four_gpu_domain_busy() -> Topology:
    """11.5 free A100s: a 4-GPU node (one NVLink domain, GPU 0 half used) and an 8-GPU node of
    2-GPU domains."""
    return Topology("t", (Node("a", "r", "A100-80GB", 4, 4, 80.0, ((0.5, 40.0),) + ((0.0, 0.0),) * 3),
                          Node("b", "r", "A100-80GB", 8, 2, 80.0)))


def test_small_groups_leave_the_only_four_gpu_domain_to_the_tp4_group():
    """4.4 GPUs of demand on 11.5 free GPUs: four whole TP-1 replicas and one TP-4 group at 0.1.
    The TP-4 group needs the only 4-GPU domain, so the hierarchical strategy itself (no
    fallback) must not fill it with TP-1 replicas."""
    top = _four_gpu_domain_busy()
    ds = [Demand("w", i, "A100-80GB", 1, 1.0, 80.0) for i in range(4)] + [
        Demand("t", 0, "A100-80GB", 4, 0.1, 8.0)]
    assert sum(n.free_units(g) for n in top.nodes for g in range(n.gpus)) == 11_500
    assert sum(d.size for d in ds) == 4_400
    alone = Hierarchical().place_alone(top, ds)
    assert alone.complete, alone.unplaced
    pl = place(top, ds)
    assert pl.complete and pl.placed_by == "hierarchical" and pl == alone
    assert pl.slot("t", 0).node == "a"
    _check(top, ds, pl)
    assert place(top, ds, "best-fit").complete


def test_a_simpler_placer_takes_over_and_is_named():
    """Two TP-2 groups at 0.4 on a 4-GPU domain with GPUs 1 and 3 half used: the hierarchical
    strategy takes GPUs 1 and 3 (no GPU newly opened) and strands the second group; first fit
    (GPUs 0+1, then 0+3) places both. The placement says that ``ffd`` produced it."""
    top = Topology("t", (Node("a", "r", "A100-80GB", 4, 4, 80.0,
                              ((0.0, 0.0), (0.5, 40.0), (1.0, 80.0), (0.5, 40.0))),
                         Node("b", "r", "A100-80GB", 2, 1, 80.0)))
    ds = [Demand("m0", 0, "A100-80GB", 2, 0.4, 32.0), Demand("m1", 0, "A100-80GB", 2, 0.4, 32.0)]
    assert not Hierarchical().place_alone(top, ds).complete
    pl = place(top, ds)
    assert pl.complete and pl.policy == "hierarchical" and pl.placed_by == "ffd"
    assert pl.to_dict()["placed_by"] == "ffd"
    _check(top, ds, pl)


@settings(FAST, max_examples=400)
@given(nodes_st(max_nodes=4), demands_st(max_demands=10), st.booleans())
def test_no_placer_leaves_more_unplaced_than_a_simpler_one(top, ds, spread):
    """Oracle: the simpler placers. Whenever one of them places everything, hierarchical does;
    no placer leaves more replicas unplaced than any placer of its FALLBACKS; every result
    passes the invariant checker."""
    opts = {"hierarchical": {"spread_replicas": spread}}
    got = {name: placer(name, **opts.get(name, {})).place(top, ds) for name in PLACERS}
    for name, pl in got.items():
        _check(top, ds, pl)
        assert pl.policy == name
        assert pl.placed_by in (name, *FALLBACKS[name])
        for simpler in FALLBACKS[name]:
            assert len(pl.unplaced) <= len(got[simpler].unplaced), (name, simpler)
    if any(pl.complete for pl in got.values()):
        assert got["hierarchical"].complete


def _random_instance(rng) -> tuple[Topology, list[Demand]]:
    """Up to 6 nodes of 1-8 A100s, NVLink domains of 1-8, half of them partly used; demands up
    to 12-90% of the free capacity."""
    nodes = []
    for k in range(rng.randint(1, 6)):
        g = rng.choice([1, 2, 4, 8])
        dom = rng.choice([d for d in (1, 2, 4, 8) if d <= g])
        use = ()
        if rng.random() < 0.5:
            use = tuple((s, s * 80) for s in (rng.choice((0, 0, 0, 0.3, 0.5, 1.0)) for _ in range(g)))
        nodes.append(Node(f"n{k}", f"r{k % 2}", "A100-80GB", g, dom, 80.0, use))
    top = Topology("t", tuple(nodes))
    free = sum(n.free_units(i) for n in nodes for i in range(n.gpus)) / 1000
    load = rng.choice([0.12, 0.3, 0.5, 0.7, 0.9])
    top_dom = max(n.nvlink_domain for n in nodes)
    ds: list[Demand] = []
    total = 0.0
    while True:
        tp = rng.choice([t for t in (1, 1, 1, 2, 4, 8) if t <= top_dom])
        share = rng.choice(SHARES)
        if total + tp * share > load * free:
            return top, ds
        ds.append(Demand(f"m{len(ds) % 4}", len(ds), "A100-80GB", tp, share, share * 80))
        total += tp * share


def test_hierarchical_strategy_rarely_needs_a_fallback():
    """A fixed sample of 1,500 random instances (12-90% load): the hierarchical strategy alone
    (largest TP degree first, NVLink-domain-aware FGD) leaves replicas unplaced where a simpler
    placer places all on at most 3 of the 1,177 where one does (measured: 0; 7 with whole-GPU
    groups first, FGD per node and nodes in input order); with its fallbacks, never."""
    import random

    rng = random.Random(2)
    alone_short = short = 0
    for _ in range(1500):
        top, ds = _random_instance(rng)
        simpler_ok = any(PLACERS[n]().place_alone(top, ds).complete for n in FALLBACKS["hierarchical"])
        if simpler_ok:
            alone_short += not Hierarchical().place_alone(top, ds).complete
            short += not place(top, ds).complete
    assert short == 0
    assert alone_short <= 3, alone_short


def test_hierarchical_improvement_options():
    """``improve`` (default on) runs the improvement phase on the chosen placement; it is skipped
    with ``spread_replicas`` or ``colocate``, whose preferences it would trade for GPUs."""
    top = Topology("dgx", tuple(Node(f"d{i}", "r", "A100-80GB", 8, 8, 80.0) for i in range(5)))
    ds = [Demand("tp8", i, "A100-80GB", 8, 0.3, 24.0) for i in range(2)]
    ds += [Demand("big", i, "A100-80GB", 1, 0.8, 64.0) for i in range(4)]
    ds += [Demand("mid", i, "A100-80GB", 1, 0.7, 56.0) for i in range(16)]
    assert Hierarchical().improve is True and Hierarchical().repack == 0
    on, off = place(top, ds), place(top, ds, improve=False)
    assert (on.gpus_used(), off.gpus_used()) == (20, 24)
    assert violations(top, ds, on) == [] and on.policy == on.placed_by == "hierarchical"
    assert place(top, ds, spread_replicas=True).gpus_used() == \
        place(top, ds, spread_replicas=True, improve=False).gpus_used()
    with pytest.raises(InputError):
        placer("ffd", improve=True)
