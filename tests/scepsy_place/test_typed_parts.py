"""Parts of one GPU type (scepsy_place.formulations.slots.typed_partition): LLMs tied by a
workflow stay together, every LLM goes to a type that holds it, the type assignment is within the
longest-processing-time bound of the exhaustive optimum where the types are alike and within one
group of it where they differ,
every part is of one type on that type's nodes, and max-throughput cuts a skewed problem so
and copies of one problem not."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.units import UNITS
from scepsy_opt.cluster import Cluster, GPUPool
from scepsy_opt.planning.instances import many_models_problem, random_problem
from scepsy_opt.planning.milp import scale_upper_bound
from scepsy_opt.planning.problem import Deadline, PlanOptions
from scepsy_place.formulations.slots import (
    PART_LLMS,
    as_capacity_shapes,
    capacity_need,
    plan_slot_scale,
    separable,
    skewed,
    slot_shapes,
    tied,
    type_assignment,
    typed_partition,
)
from scepsy_place.packing.check import violations
from scepsy_place.packing.placement import demands
from scepsy_place.packing.topology import Node, Topology, from_cluster
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
FAST = settings(derandomize=True, deadline=None, database=None, max_examples=60)
MT = PlanOptions(objective="max-throughput")


def _components(problem) -> list[tuple[str, ...]]:
    """The oracle of :func:`tied`: connected components by breadth-first search over the graph
    whose edges join every two LLMs one workflow calls."""
    nbr: dict[str, set[str]] = {m: set() for m in problem.llms}
    for w in problem.targets:
        called = list(problem.stats[w].llms)
        for a, b in itertools.combinations(called, 2):
            nbr[a].add(b)
            nbr[b].add(a)
    seen: set[str] = set()
    out = []
    for m in problem.llms:
        if m in seen:
            continue
        todo, comp = [m], set()
        while todo:
            x = todo.pop()
            if x not in comp:
                comp.add(x)
                todo.extend(nbr[x] - comp)
        seen |= comp
        out.append(tuple(sorted(comp)))
    return sorted(out)


@pytest.mark.parametrize("seed", range(8))
def test_tied_groups_are_the_workflow_graphs_components(seed):
    p = random_problem(9, 16, ROOF, seed=seed, workflows=4)
    groups = tied(p)
    assert sorted(groups) == _components(p)
    assert sorted(m for g in groups for m in g) == sorted(p.llms)
    assert any(len(g) > 1 for g in groups)  # not vacuous: workflows tie LLMs together


def _topology(a: int, h: int) -> Topology:
    nodes = [Node(f"a{i}", "r", "A100-80GB", 8, 8, 80.0) for i in range(a)] + [
        Node(f"h{i}", "r", "H100-80GB", 8, 8, 80.0) for i in range(h)]
    return Topology("t", tuple(nodes))


def _fills(topo: Topology, groups, need, assign) -> dict[str, float]:
    units = {t: sum(n.gpus for n in topo.nodes if n.gpu == t) * UNITS for t in
             {n.gpu for n in topo.nodes}}
    fill = dict.fromkeys(units, 0.0)
    for g in groups:
        for m in g:
            fill[assign[m]] += need[m][assign[m]] / units[assign[m]]
    return fill


@FAST
@given(st.lists(st.floats(1.0, 500.0), min_size=1, max_size=8))
def test_alike_types_assignment_is_within_the_lpt_bound_of_the_optimum(sizes):
    """Two types of equal units and LLMs that need the same on either: identical machines, where
    the greedy rule is longest processing time first, within 7/6 of the exhaustive optimum of
    the largest fill (Graham's bound 4/3 - 1/(3m), m = 2)."""
    topo = _topology(2, 2)
    groups = [(f"m{i}",) for i in range(len(sizes))]
    need = {f"m{i}": {"A100-80GB": x, "H100-80GB": x} for i, x in enumerate(sizes)}
    assign = type_assignment(topo, groups, need)
    got = max(_fills(topo, groups, need, assign).values())
    best = math.inf
    for types in itertools.product(["A100-80GB", "H100-80GB"], repeat=len(groups)):
        trial = {g[0]: t for g, t in zip(groups, types, strict=True)}
        best = min(best, max(_fills(topo, groups, need, trial).values()))
    assert got <= best * (7 / 6) * (1 + 1e-12)


def _exhaustive(topo: Topology, groups, need) -> float:
    """The least largest fill over every assignment of whole groups to types that hold them."""
    types = sorted({n.gpu for n in topo.nodes})
    best = math.inf
    for choice in itertools.product(types, repeat=len(groups)):
        trial = {m: t for g, t in zip(groups, choice, strict=True) for m in g}
        if all(t in need[m] for m, t in trial.items()):
            best = min(best, max(_fills(topo, groups, need, trial).values()))
    return best


def _lpt(topo: Topology, groups, need) -> float:
    """The largest fill of longest processing time first alone (type_assignment's rule 2)."""
    types = sorted({n.gpu for n in topo.nodes})
    units = {t: sum(n.gpus for n in topo.nodes if n.gpu == t) * UNITS for t in types}
    share = {g: {t: sum(need[m].get(t, math.inf) for m in g) / units[t] for t in types}
             for g in groups}
    fill = dict.fromkeys(types, 0.0)
    for g in sorted(groups, key=lambda g: (-min(share[g].values()), g)):
        t = min((t for t in types if math.isfinite(share[g][t])),
                key=lambda t: (max([fill[t] + share[g][t]] + [fill[x] for x in types if x != t]),
                               fill[t] + share[g][t], t))
        fill[t] += share[g][t]
    return max(fill.values())


@FAST
@given(st.lists(st.tuples(st.floats(1.0, 400.0), st.floats(1.0, 400.0), st.integers(1, 2)),
                min_size=1, max_size=9), st.integers(1, 3), st.integers(1, 3))
def test_assignment_is_within_one_group_of_the_exhaustive_optimum(rows, a, h):
    """Types that differ per LLM (unrelated machines): the relaxation, rounded, is at most one
    group's largest fill above the exhaustive optimum (a vertex of the LP splits at most one
    group over two types), and never above longest processing time first alone."""
    topo = _topology(a, h)
    units = {"A100-80GB": a * 8 * UNITS, "H100-80GB": h * 8 * UNITS}
    groups, need, k = [], {}, 0
    for x, y, size in rows:
        g = tuple(f"m{k + j:02d}" for j in range(size))
        k += size
        groups.append(g)
        need.update({m: {"A100-80GB": x, "H100-80GB": y} for m in g})
    got = max(_fills(topo, groups, need, type_assignment(topo, groups, need)).values())
    widest = max(sum(need[m][t] for m in g) / units[t] for g in groups for t in units)
    assert got <= _exhaustive(topo, groups, need) + widest + 1e-9
    assert got <= _lpt(topo, groups, need) * (1 + 1e-12)


def test_assignment_gives_each_llm_the_type_it_is_relatively_cheapest_on():
    """Comparative advantage, where longest processing time first goes wrong: the LLM alike on
    both types is dealt first, to A100, and the three far cheaper on A100 follow it there
    (15 units on A100 against 8 at best). The relaxation keeps A100 for those three and gives
    the alike one H100: the exhaustive optimum."""
    topo = _topology(1, 1)
    need = {"m0": {"A100-80GB": 1.0, "H100-80GB": 20.0},
            "m1": {"A100-80GB": 3.0, "H100-80GB": 13.0},
            "m2": {"A100-80GB": 8.0, "H100-80GB": 8.0},
            "m3": {"A100-80GB": 3.0, "H100-80GB": 20.0}}
    groups = [(m,) for m in sorted(need)]
    assign = type_assignment(topo, groups, need)
    assert assign == {"m0": "A100-80GB", "m1": "A100-80GB", "m2": "H100-80GB",
                      "m3": "A100-80GB"}
    got = max(_fills(topo, groups, need, assign).values())
    assert got == pytest.approx(_exhaustive(topo, groups, need), rel=1e-12)
    assert _lpt(topo, groups, need) == pytest.approx(15 / 8 * got, rel=1e-12)


@FAST
@given(st.lists(st.tuples(st.floats(1.0, 300.0) | st.just(math.inf),
                          st.floats(1.0, 300.0) | st.just(math.inf), st.integers(1, 3)),
                min_size=1, max_size=10), st.integers(1, 3), st.integers(1, 3))
def test_assignment_keeps_groups_together_on_a_type_that_holds_them(rows, a, h):
    """Whatever the needs (a type may not hold an LLM at all) and group sizes: a group's LLMs
    share one type, that type holds each of them, every LLM is assigned; empty exactly when a
    group fits no type; the same input gives the same answer."""
    topo = _topology(a, h)
    groups, need, k = [], {}, 0
    for x, y, size in rows:
        g = tuple(f"m{k + j:02d}" for j in range(size))
        k += size
        groups.append(g)
        for m in g:
            need[m] = {t: v for t, v in (("A100-80GB", x), ("H100-80GB", y)) if math.isfinite(v)}
    assign = type_assignment(topo, groups, need)
    if any(not need[g[0]] for g in groups):
        assert assign == {}
        return
    assert set(assign) == {m for g in groups for m in g}
    for g in groups:
        assert len({assign[m] for m in g}) == 1
        assert all(assign[m] in need[m] for m in g)
    assert type_assignment(topo, groups, need) == assign


@pytest.mark.parametrize("n,gpus", [(64, 128), (256, 512)])
def test_typed_parts_are_of_one_type_on_its_nodes_and_cover_every_llm(n, gpus):
    p = many_models_problem(n, gpus, ROOF, copies=False, options=MT)
    topo = from_cluster(p.cluster)
    shp = slot_shapes(p)
    need = capacity_need(p, shp, scale_upper_bound(p, as_capacity_shapes(shp)))
    parts = typed_partition(p, topo, PART_LLMS, need)
    assert len(parts) > 1
    assert sorted(m for q in parts for m in q.llms) == sorted(p.llms)
    nodes = [x for q in parts for x in q.nodes]
    assert len(nodes) == len(set(nodes)) and set(nodes) <= {x.name for x in topo.nodes}
    for q in parts:
        assert q.gpu is not None and q.nodes and q.llms
        assert {topo.node(x).gpu for x in q.nodes} == {q.gpu}
        assert all(math.isfinite(need[m][q.gpu]) for m in q.llms)
    assert separable(p, parts)
    assert typed_partition(p, topo, PART_LLMS, need) == parts  # deterministic


def test_typed_partition_keeps_a_workflows_llms_on_one_type():
    """Workflows that call several LLMs: their LLMs get one GPU type (within it, parts may cut
    them apart as :func:`partition` does; max-throughput then plans them as one part)."""
    cl = Cluster("mix", (GPUPool("A100-80GB", 2, 8), GPUPool("H100-80GB", 2, 8)))
    p = random_problem(12, 32, ROOF, seed=3, workflows=5, cluster=cl, options=MT)
    topo = from_cluster(p.cluster)
    shp = slot_shapes(p)
    need = capacity_need(p, shp, scale_upper_bound(p, as_capacity_shapes(shp)))
    parts = typed_partition(p, topo, 4, need)
    assert sorted(m for q in parts for m in q.llms) == sorted(p.llms)
    kind = {m: q.gpu for q in parts for m in q.llms}
    assert any(len(g) > 1 for g in tied(p))  # not vacuous: some workflow ties LLMs
    for g in tied(p):
        assert len({kind[m] for m in g}) == 1


def test_skewed_problems_are_cut_by_type_and_copies_are_not():
    def need_of(p):
        shp = slot_shapes(p)
        return capacity_need(p, shp, scale_upper_bound(p, as_capacity_shapes(shp)))
    zipf = many_models_problem(64, 128, ROOF, copies=False, options=MT)
    copies = many_models_problem(64, 128, ROOF, copies=True, options=MT)
    assert skewed(zipf, from_cluster(zipf.cluster), PART_LLMS, need_of(zipf))
    assert not skewed(copies, from_cluster(copies.cluster), PART_LLMS, need_of(copies))
    # one GPU type: nothing to cut by
    topo = from_cluster(zipf.cluster)
    a100 = Topology("a", tuple(x for x in topo.nodes if x.gpu == "A100-80GB"))
    assert not skewed(zipf, a100, PART_LLMS, need_of(zipf))


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
def test_a_skewed_max_throughput_plan_is_placed_valid_and_within_its_bound():
    p = many_models_problem(64, 128, ROOF, copies=False,
                            options=PlanOptions(objective="max-throughput", time_limit_s=20))
    topo = from_cluster(p.cluster)
    res = plan_slot_scale(p, topo, deadline=Deadline.after(20))
    assert res.placed
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    assert 0 < res.plan.scale <= res.plan.stats["scale_bound"] * (1 + 1e-9)
