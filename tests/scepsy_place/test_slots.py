"""Slot groups (scepsy_place.formulations.slots): placeable by construction, exact where the model is, checked
against brute force; the scale bound (scepsy_opt.planning.milp.scale_upper_bound) never below an
optimum; the decomposition's parts and the replication floor of many-models problems."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.units import UNITS
from scepsy_opt.cluster import Cluster, GPUPool, uniform_cluster
from scepsy_opt.planning.candidates import Candidate
from scepsy_opt.planning.instances import many_models_problem, random_problem
from scepsy_opt.planning.milp import max_scale, scale_upper_bound
from scepsy_opt.planning.plans import headroom, plan_from_choice
from scepsy_opt.planning.problem import Deadline, PlanOptions
from scepsy_opt.prediction.pipeline import min_replicas, replicas_needed
from scepsy_place.formulations.loop import plan_and_place
from scepsy_place.formulations.slots import (
    _highest_averages,
    _interleaved,
    _nodes_by_need,
    as_capacity_shapes,
    capacity_need,
    configurations,
    layout,
    partition,
    plan_slot_scale,
    slot_shapes,
    solve_slot_scale,
)
from scepsy_place.packing.check import violations
from scepsy_place.packing.exhaustive import placeable
from scepsy_place.packing.placement import demands
from scepsy_place.packing.topology import Node, from_cluster
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
FAST = settings(derandomize=True, deadline=None, database=None, max_examples=40)


# --------------------------------------------------------------------------- configurations

def _all_multisets(sizes: list[int]) -> set[tuple[int, ...]]:
    """Every multiset of ``sizes`` that fits one GPU, by brute force."""
    out: set[tuple[int, ...]] = set()
    most = UNITS // min(sizes)
    for k in range(1, most + 1):
        for combo in itertools.combinations_with_replacement(sorted(sizes, reverse=True), k):
            if sum(combo) <= UNITS:
                out.add(tuple(sorted(combo, reverse=True)))
    return out


@FAST
@given(st.lists(st.sampled_from([100, 200, 250, 300, 400, 500, 600, 700, 800, 1000]),
                min_size=1, max_size=5, unique=True))
def test_configurations_are_the_maximal_fillings(sizes):
    confs = configurations(sizes)
    every = _all_multisets(sizes)
    assert all(c in every for c in confs)  # each fits one GPU
    least = min(sizes)
    for c in confs:  # maximal: no size of the grid fits the room left
        assert UNITS - sum(c) < least
    # every filling is contained in one of them (so restricting to them loses nothing)
    for m in every:
        assert any(len(m) <= len(c) and all(a <= b for a, b in zip(m, c, strict=False))
                   for c in confs), m


def test_configurations_of_tenths_are_the_partitions_of_ten():
    assert len(configurations([100 * k for k in range(1, 11)])) == 42  # p(10)


# --------------------------------------------------------------------------- replica counts

@FAST
@given(st.lists(st.tuples(st.floats(0, 200), st.floats(0.01, 50)), min_size=1, max_size=30),
       st.sampled_from([0.5, 0.8, 0.95]))
def test_replicas_needed_is_min_replicas(pairs, u):
    load = np.array([p[0] for p in pairs])
    mu = np.array([p[1] for p in pairs])
    assert replicas_needed(load, mu, u).tolist() == [min_replicas(a, b, u) for a, b in pairs]


# --------------------------------------------------------------------------- brute force

def _tiny(seed: int, gpus: int, tps: tuple[int, ...]):
    opts = PlanOptions(shares=(0.3, 0.5, 0.6, 1.0), tps=tps, objective="max-throughput")
    cl = uniform_cluster("A100-80GB", gpus, gpus)
    return random_problem(2, gpus, ROOF, seed=seed, load=0.5, options=opts, cluster=cl), cl


def _placeable_max_scale(p, topo) -> float:
    """The largest carried scale of any placeable allocation: every combination of one slot
    shape per LLM and replica counts within the GPUs, placed exactly."""
    shp = slot_shapes(p)
    llms = sorted(shp)
    options = []
    total = p.cluster.total_gpus * UNITS
    for m in llms:
        opts = []
        for sh in shp[m]:
            for r in range(1, total // (sh.tp * sh.units) + 1):
                opts.append(Candidate(m, sh.gpu, sh.tp, sh.share, r, sh.tp * sh.units * r,
                                      sh.mu, math.nan, 0.0, 0.0))
        options.append(opts)
    best = 0.0
    for combo in itertools.product(*options):
        if sum(c.units for c in combo) > total:
            continue
        choice = dict(zip(llms, combo, strict=True))
        scale = min(headroom(p, choice).values())
        if scale <= best:
            continue
        plan = plan_from_choice(p, "oracle", "optimal", choice, {})
        if placeable(topo, demands(plan.allocation)):
            best = scale
    return best


@pytest.mark.parametrize(("seed", "gpus"), [(0, 2), (1, 2), (2, 3), (3, 3), (4, 2)])
def test_slot_optimum_is_the_placeable_optimum_with_tp_1(seed, gpus):
    """With TP 1 only, slot groups describe every packing of one GPU: the slot model's optimum
    is the largest scale of any placeable allocation (brute force), and the layout places it."""
    p, cl = _tiny(seed, gpus, (1,))
    topo = from_cluster(cl)
    sol = solve_slot_scale(p, topo, deadline=Deadline.after(60), gap_rel=1e-9)
    oracle = _placeable_max_scale(p, topo)
    assert sol.choice and sol.status == "optimal"
    assert sol.scale == pytest.approx(oracle, rel=1e-6)
    alloc = plan_from_choice(p, "milp", "optimal", dict(sol.choice), {}).allocation
    placement = layout(topo, sol, demands(alloc))
    assert placement.complete and violations(topo, demands(alloc), placement) == []


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_slot_plans_with_tp_groups_are_placed_and_below_the_placeable_optimum(seed):
    p, cl = _tiny(seed, 4, (1, 2))
    topo = from_cluster(cl)
    sol = solve_slot_scale(p, topo, deadline=Deadline.after(60), gap_rel=1e-9)
    assert sol.choice
    alloc = plan_from_choice(p, "milp", "optimal", dict(sol.choice), {}).allocation
    placement = layout(topo, sol, demands(alloc))
    assert placement.complete and violations(topo, demands(alloc), placement) == []
    assert sol.scale <= _placeable_max_scale(p, topo) * (1 + 1e-9)


# --------------------------------------------------------------------------- the bound

@pytest.mark.parametrize("seed", range(6))
def test_scale_bound_is_never_below_the_aggregate_optimum(seed):
    """Two GPU types: the bound from whole replicas per type is at least the exact max scale
    (an allocation's scale, placed or not), and not far above it on these instances."""
    cl = Cluster("mix", (GPUPool("A100-80GB", 1, 8), GPUPool("H100-80GB", 1, 8)))
    p = random_problem(5, 16, ROOF, seed=seed, load=0.7, cluster=cl,
                       options=PlanOptions(objective="max-throughput"))
    exact, _, status = max_scale(p)
    bound = scale_upper_bound(p)
    assert status == "optimal"
    assert bound >= exact * (1 - 1e-12)
    assert bound <= exact * 1.25  # much tighter than nothing: a regression guard
    # every LLM on one GPU type (as every max-scale allocation is): still a bound, and no
    # looser than the LP over types (both bisect to the same relative step)
    one = scale_upper_bound(p, one_type=True)
    assert exact * (1 - 1e-12) <= one <= bound * (1 + 1e-12)


def test_one_type_bound_is_tighter_where_an_llm_must_split():
    """Small two-type instances (2 LLMs, 2 + 2 GPUs), where whole replicas often fit only with
    one LLM across both types: the one-type bound stays at or above the exact max scale (every
    allocation runs an LLM on one type) and at or below the LP over types, and is strictly
    below it on some of them."""
    cl = Cluster("mix", (GPUPool("A100-80GB", 1, 2), GPUPool("H100-80GB", 1, 2)))
    hits = 0
    for seed in range(12):
        p = random_problem(2, 3, ROOF, seed=seed, load=0.9, cluster=cl,
                           options=PlanOptions(objective="max-throughput"))
        exact, _, status = max_scale(p)
        assert status == "optimal"
        lp, one = scale_upper_bound(p), scale_upper_bound(p, one_type=True)
        assert exact * (1 - 1e-12) <= one <= lp * (1 + 1e-12)
        hits += one < lp * (1 - 1e-3)
    assert hits > 0  # the one-type bound is tighter on at least one of these instances


def test_scale_bound_from_slot_shapes_equals_the_bound_from_all_shapes():
    p = many_models_problem(16, 32, ROOF)
    assert scale_upper_bound(p, as_capacity_shapes(slot_shapes(p))) == pytest.approx(
        scale_upper_bound(p), rel=1e-9)


# --------------------------------------------------------------------------- decomposition

def test_copies_make_equal_parts_with_disjoint_nodes():
    p = many_models_problem(64, 128, ROOF)
    topo = from_cluster(p.cluster)
    parts = partition(p, topo, 16)
    assert len(parts) == 4
    assert sorted(m for q in parts for m in q.llms) == sorted(p.llms)
    nodes = [n for q in parts for n in q.nodes]
    assert sorted(nodes) == sorted(n.name for n in topo.nodes)
    kinds = {tuple(sorted((p.models[m], round(p.loads[m], 9)) for m in q.llms)) for q in parts}
    assert len(kinds) == 1  # four copies of the same 16 LLMs


def test_a_very_popular_llm_gets_a_part_of_one_gpu_type_that_holds_it():
    """One Zipf popularity over 256 LLMs: the most popular needs a tenth of the cluster, more
    than a part of 16 LLMs on an even share of both GPU types holds (one LLM runs on one GPU
    type). Its part takes nodes of one type, enough for it; every LLM and node is in one part."""
    p = many_models_problem(256, 512, ROOF, copies=False)
    topo = from_cluster(p.cluster)
    shp = slot_shapes(p)
    need = capacity_need(p, shp, scale_upper_bound(p, as_capacity_shapes(shp)))
    parts = partition(p, topo, 16, need)
    assert sorted(m for q in parts for m in q.llms) == sorted(p.llms)
    assert sorted(n for q in parts for n in q.nodes) == sorted(n.name for n in topo.nodes)
    top = max(p.llms, key=lambda m: min(need[m].values()))
    (home,) = [q for q in parts if top in q.llms]
    assert home.gpu is not None
    gpus = {n.name: n for n in topo.nodes}
    assert {gpus[n].gpu for n in home.nodes} == {home.gpu}
    assert need[top][home.gpu] <= sum(gpus[n].gpus for n in home.nodes) * UNITS
    # every LLM of a mixed part fits one GPU type of its part (here, the min-latency case:
    # needs at the targets, where a 30B LLM once got a part with one H100 node)
    for pp, scale in ((p, 1.0), (many_models_problem(64, 128, ROOF, copies=False), 1.0)):
        pt = from_cluster(pp.cluster)
        pn = capacity_need(pp, slot_shapes(pp), scale)
        have = {n.name: n for n in pt.nodes}
        for q in partition(pp, pt, 16, pn):
            for m in q.llms:
                assert any(v <= sum(have[x].gpus for x in q.nodes if have[x].gpu == t) * UNITS
                           for t, v in pn[m].items()), (m, q)
    # without a heavy LLM (copies of 16), every part has the cluster's mix of GPU types
    c = many_models_problem(64, 128, ROOF)
    ctop = from_cluster(c.cluster)
    cparts = partition(c, ctop, 16, capacity_need(c, slot_shapes(c), 1.0))
    cgpus = {n.name: n.gpu for n in ctop.nodes}
    assert all(q.gpu is None for q in cparts)
    assert all(sorted(cgpus[n] for n in q.nodes) == sorted(cgpus[n] for n in cparts[0].nodes)
               for q in cparts)


@FAST
@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=4), st.integers(0, 6))
def test_highest_averages_minimises_the_largest_weight_per_thing(weights, extra):
    """D'Hondt's rule against brute force over every way to deal ``n`` things, one at least
    each: its largest weight per thing is the least there is."""
    n = len(weights) + extra
    got = _highest_averages(weights, n)
    assert sum(got) == n and min(got) >= 1
    best = min(max(w / c for w, c in zip(weights, combo, strict=True))
               for combo in itertools.product(range(1, n + 1), repeat=len(weights))
               if sum(combo) == n)
    assert max(w / c for w, c in zip(weights, got, strict=True)) <= best * (1 + 1e-12)


@FAST
@given(st.integers(1, 9), st.integers(0, 9), st.integers(1, 9))
def test_interleaved_runs_keep_the_mix(a, h, run):
    """Every prefix of the interleaved order holds each GPU type within one node of its share,
    so any run of consecutive nodes within two."""
    nodes = [Node(f"a{i}", "r", "A100-80GB", 8, 8, 80.0) for i in range(a)] + [
        Node(f"h{i}", "r", "H100-80GB", 8, 8, 80.0) for i in range(h)]
    order = _interleaved(nodes)
    assert sorted(n.name for n in order) == sorted(n.name for n in nodes)
    for end in range(1, len(order) + 1):
        got = sum(1 for n in order[:end] if n.gpu == "A100-80GB")
        assert abs(got - end * a / len(nodes)) < 1 + 1e-9
    for start in range(len(order) - run + 1):
        got = sum(1 for n in order[start:start + run] if n.gpu == "A100-80GB")
        assert abs(got - run * a / len(nodes)) < 2


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
def test_two_copies_carry_what_one_carries():
    """The replication floor: two copies of the 16-LLM problem on twice the GPUs carry at least
    the scale the one copy carries."""
    one = many_models_problem(16, 32, ROOF, options=PlanOptions(objective="max-throughput"))
    two = many_models_problem(32, 64, ROOF, options=PlanOptions(objective="max-throughput"))
    a = plan_slot_scale(one, from_cluster(one.cluster), deadline=Deadline.after(60))
    b = plan_slot_scale(two, from_cluster(two.cluster), deadline=Deadline.after(60))
    assert a.placed and b.placed
    assert b.plan.scale >= a.plan.scale * (1 - 1e-9)


# --------------------------------------------------------------------------- through the loop

@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
def test_max_throughput_auto_is_placed_truthful_and_on_time():
    limit = 8.0
    p = many_models_problem(16, 32, ROOF, options=PlanOptions(objective="max-throughput",
                                                              time_limit_s=limit))
    topo = from_cluster(p.cluster)
    t0 = time.monotonic()
    res = plan_and_place(p, topo, formulation="auto")
    wall = time.monotonic() - t0
    assert wall <= 1.1 * limit + 1.5
    assert res.placed and violations(topo, demands(res.plan.allocation), res.placement) == []
    bound, gap = res.plan.stats["scale_bound"], res.plan.stats["scale_gap"]
    assert bound >= res.plan.scale * (1 - 1e-12)
    assert gap == pytest.approx(bound / res.plan.scale - 1, abs=1e-12)
    # a status never claims more than its gap says
    if res.plan.status == "optimal":
        assert gap <= 1e-6 and res.exact
    else:
        assert res.plan.status in ("heuristic", "time_limit") and not res.exact
    # the plan carries its scale: every LLM's replicas at max utilisation
    assert min(headroom(p, res.plan.candidates).values()) >= res.plan.scale * (1 - 1e-9)


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
def test_max_throughput_with_memory_shares_keeps_the_aggregate_path():
    p = many_models_problem(16, 32, ROOF, options=PlanOptions(
        objective="max-throughput", time_limit_s=20, memory_shares=(0.5, 1.0),
        shares=(0.5, 1.0)))
    res = plan_and_place(p, from_cluster(p.cluster), formulation="auto")
    assert res.formulation != "slots"  # slots tie memory to the share: not applicable
    assert all(h.get("formulation") != "slots" for h in res.history)
    assert "scale_bound" not in res.plan.stats


def _min_latency_without_its_milp(monkeypatch):
    """Min-latency in slot groups on 32 skewed LLMs / 64 GPUs at 0.7 of their targets, with the
    latency MILP never answering: the problem and the result, checked placed, ``time_limit``
    and valid."""
    from scepsy_place.formulations import slots as mod
    from scepsy_place.formulations.slots import _none, plan_slot_latency

    monkeypatch.setattr(mod, "solve_slot_latency", lambda *a, **k: _none("time_limit"))
    p = many_models_problem(32, 64, ROOF, copies=False, options=PlanOptions(time_limit_s=30))
    p = p.scaled(0.7)
    topo = from_cluster(p.cluster)
    res = plan_slot_latency(p, topo, deadline=Deadline.after(30))
    assert res.placed and res.plan.status == "time_limit"
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    return p, res


def test_min_latency_parts_without_an_incumbent_keep_a_plan_that_carries_them(monkeypatch):
    """Min-latency in several parts first finds, for each part, any slot solution that carries
    its targets; a part whose latency MILP then finds nothing in its time keeps that one. With
    the latency MILP never answering, the plan is still placed, valid, carries every target,
    and says how it was made (status time_limit, every distinct part a fallback)."""
    p, res = _min_latency_without_its_milp(monkeypatch)
    assert res.plan.stats["fallback_parts"] == res.plan.stats["parts"] - res.plan.stats["reused"]
    assert res.plan.stats["parts"] > 1
    assert min(headroom(p, res.plan.candidates).values()) >= 1 - 1e-9
    assert math.isfinite(res.plan.objective_s)


def test_min_latency_part_cut_short_in_the_first_round_tries_again(monkeypatch):
    """A part whose first plan in hand is cut short by its share of the first round (as on a
    loaded machine with many parts) tries again with what the other parts left, so the plan is
    still placed when the latency MILPs find nothing; the retried part is asked twice."""
    from scepsy_place.formulations import slots as mod
    from scepsy_place.formulations.slots import _none

    real = mod._carrying
    calls: dict[tuple[str, ...], int] = {}

    def first_cut(sub, *a, **k):
        key = tuple(sub.llms)
        calls[key] = calls.get(key, 0) + 1
        if calls[key] == 1 and len(calls) == 1:  # the first part's first try: cut short
            return _none("time_limit")
        return real(sub, *a, **k)

    monkeypatch.setattr(mod, "_carrying", first_cut)
    p, res = _min_latency_without_its_milp(monkeypatch)
    assert max(calls.values()) == 2 and sorted(calls.values())[:-1] == [1] * (len(calls) - 1)
    assert min(headroom(p, res.plan.candidates).values()) >= 1 - 1e-9


@FAST
@given(st.lists(st.tuples(st.sampled_from([None, "A100-80GB", "H100-80GB"]),
                          st.floats(0.1, 50.0), st.booleans()), min_size=1, max_size=5),
       st.integers(0, 6), st.integers(0, 6))
def test_nodes_by_need_deals_disjoint_runs_of_the_right_type(parts, a, h):
    """Whatever the parts' GPU types, needs and heavy (fixed) ones, even a type with no nodes:
    no node goes to two parts, a part of one GPU type gets only that type's nodes, and with a
    mixed part every node is dealt."""
    nodes = [Node(f"a{i}", "r", "A100-80GB", 8, 8, 80.0) for i in range(a + len(parts))] + [
        Node(f"h{i}", "r", "H100-80GB", 8, 8, 80.0) for i in range(h)]
    kind = [t for t, _, _ in parts]
    needs = [w for _, w, _ in parts]
    fixed = {i: 2 for i, (_, _, f) in enumerate(parts) if f}
    out = _nodes_by_need(nodes, needs, kind, fixed)
    names = [n.name for r in out for n in r]
    assert len(names) == len(set(names))
    for r, t in zip(out, kind, strict=True):
        assert t is None or all(n.gpu == t for n in r)
    if any(t is None for t in kind):
        assert sorted(names) == sorted(n.name for n in nodes)
