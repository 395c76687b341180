"""Slot groups at the scale of thousands of LLMs (scepsy_place.formulations.slots): the fast
partition, sub-problems and layout equal the one-at-a-time versions they replace
(slots_reference.py, exactly); a model scans the free GPUs once per GPU type; a probe cut short
by its time is reported as such, never as infeasible, and does not step the ladder down as a
proof would; every part gets a solution before the time runs out, and the plan in hand is kept
when it does."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slots_reference import _dealt as dealt_before
from slots_reference import _highest_averages as highest_averages_before
from slots_reference import _sub as sub_before
from slots_reference import layout as layout_before

import scepsy_place.formulations.slots as slots
from scepsy_opt.planning.instances import many_models_problem, random_problem
from scepsy_opt.planning.milp import scale_upper_bound
from scepsy_opt.planning.problem import Deadline, PlanOptions
from scepsy_place.formulations.slots import (
    _dealt,
    _highest_averages,
    _none,
    _sub,
    _subs,
    as_capacity_shapes,
    layout,
    partition,
    plan_slot_scale,
    slot_shapes,
    solve_parts,
    solve_slot_scale,
)
from scepsy_place.packing.placement import apply, demands
from scepsy_place.packing.quality import fragmentation
from scepsy_place.packing.replicas import task_mix
from scepsy_place.packing.topology import from_cluster
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
FAST = settings(derandomize=True, deadline=None, database=None, max_examples=60)
MT = PlanOptions(objective="max-throughput")


# --------------------------------------------------------------------------- equal to before

@FAST
@given(st.lists(st.tuples(st.floats(0.0, 50.0), st.floats(0.0, 50.0), st.floats(0.0, 50.0)),
                min_size=1, max_size=25),
       st.lists(st.sampled_from([None, "A", "B"]), min_size=1, max_size=6),
       st.lists(st.floats(1.0, 40.0), min_size=6, max_size=6), st.data())
def test_dealt_equals_the_one_part_at_a_time_deal(needs, kind, capacity, data):
    llms = [f"m{i:02d}" for i in range(len(needs))]
    per = {m: {None: a, "A": b, "B": c} for m, (a, b, c) in zip(llms, needs, strict=True)}
    k = len(kind)
    seeded = data.draw(st.lists(st.sampled_from(llms), unique=True, max_size=min(k, 3)))
    seed = dict(enumerate(seeded))
    args = (llms, per, kind, capacity[:k], seed)
    assert _dealt(*args) == dealt_before(*args)


@FAST
@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=8), st.integers(0, 30),
       st.lists(st.sampled_from([None, "A", "B"]), min_size=8, max_size=8),
       st.lists(st.integers(0, 3), min_size=8, max_size=8), st.integers(0, 6),
       st.integers(0, 6))
def test_highest_averages_equals_the_scan_over_parts(weights, n, classes, least, a, b):
    k = len(weights)
    kw = {"least": least[:k], "classes": classes[:k], "most": {"A": a, "B": b}}
    assert _highest_averages(weights, n, **kw) == highest_averages_before(weights, n, **kw)
    assert _highest_averages(weights, n) == highest_averages_before(weights, n)


@pytest.mark.parametrize(("n", "gpus", "copies"), [(64, 128, False), (48, 96, True)])
def test_sub_problems_in_one_pass_equal_one_part_at_a_time(n, gpus, copies):
    p = many_models_problem(n, gpus, ROOF, copies=copies, options=MT)
    topo = from_cluster(p.cluster)
    parts = partition(p, topo, 8)
    assert len(parts) > 2
    for (got, got_top), part in zip(_subs(p, topo, parts), parts, strict=True):
        want, want_top = sub_before(p, topo, part)
        assert got_top == want_top
        assert dict(got.targets) == dict(want.targets) and got.cluster == want.cluster
        assert got == want
    assert _sub(p, topo, parts[0])[0] == sub_before(p, topo, parts[0])[0]


@pytest.mark.parametrize("seed", range(4))
def test_layout_equals_the_layout_scanning_every_domain(seed):
    """Slot solutions with TP groups and pieces passed down (random problems on 2 to 4 nodes):
    the one-pass layout places every replica where the scanning one did."""
    opts = PlanOptions(objective="max-throughput", tps=(1, 2, 4, 8))
    p = random_problem(6 + seed, 16 + 8 * seed, ROOF, seed=seed, options=opts, load=0.6)
    topo = from_cluster(p.cluster)
    sol = solve_slot_scale(p, topo, deadline=Deadline.after(60), time_limit_s=30)
    assert sol.choice
    from scepsy_opt.allocation import Allocation
    alloc = Allocation({m: c.instance for m, c in sol.choice.items()})
    dem = demands(alloc, p.catalog)
    got = layout(topo, sol, dem)
    assert got == layout_before(topo, sol, dem)
    assert got.complete


def test_fragmentation_computed_once_per_distinct_node_equals_the_sum_over_nodes():
    from scepsy_place.packing.fgd import domain_fragmentation
    p = many_models_problem(48, 96, ROOF, options=MT)
    topo = from_cluster(p.cluster)
    res = plan_slot_scale(p, topo, deadline=Deadline.after(60))
    assert res.placed
    after = apply(topo, res.placement)
    dem = demands(res.plan.allocation, p.catalog)
    mix = task_mix(dem)
    want = math.fsum(domain_fragmentation([n.free_units(i) for i in range(n.gpus)],
                                          n.nvlink_domain, list(mix))
                     for n in after.canonical_nodes())
    assert fragmentation(after, mix) == want


def test_a_model_scans_the_free_gpus_once_per_gpu_type(monkeypatch):
    p = many_models_problem(16, 32, ROOF, options=MT)
    topo = from_cluster(p.cluster)
    calls: list[str] = []
    real = slots.whole_free_gpus
    monkeypatch.setattr(slots, "whole_free_gpus",
                        lambda top, gpu: calls.append(gpu) or real(top, gpu))
    sol = solve_slot_scale(p, topo, deadline=Deadline.after(60), at_scale=0.5, time_limit_s=30)
    assert sol.choice
    assert sorted(calls) == sorted(set(calls)) == sorted({n.gpu for n in topo.nodes})


# --------------------------------------------------------------------------- truthful time

def test_probes_cut_short_are_reported_as_a_time_limit_with_the_bound(monkeypatch):
    """No probe answers within its time: the plan is time_limit (not infeasible, not a
    plan without a bound), its stats say every probe was cut short and carry the bound."""
    p = many_models_problem(64, 128, ROOF, copies=False, options=MT)
    topo = from_cluster(p.cluster)
    monkeypatch.setattr(slots, "solve_slot_scale", lambda *a, **k: _none("time_limit"))
    res = plan_slot_scale(p, topo, deadline=Deadline.after(5))
    assert res.status == "time_limit" and res.plan.status == "time_limit_no_solution"
    stats = res.plan.stats
    bound = scale_upper_bound(p, as_capacity_shapes(slot_shapes(p)))
    assert stats["scale_bound"] == bound
    assert stats["probes_cut"] > 0 and stats["probes_infeasible"] == 0


def test_probes_proven_infeasible_are_not_a_time_limit(monkeypatch):
    p = many_models_problem(64, 128, ROOF, copies=False, options=MT)
    topo = from_cluster(p.cluster)
    monkeypatch.setattr(slots, "solve_slot_scale", lambda *a, **k: _none("infeasible"))
    res = plan_slot_scale(p, topo, deadline=Deadline.after(30))
    assert res.status == "unplaced" and res.plan.status == "infeasible"
    assert res.plan.stats["probes_cut"] == 0 and res.plan.stats["probes_infeasible"] > 0


def _low_solutions(p, topo, parts):
    """The slot shapes, each part's index by its first LLM, and a real solution of each part
    at a low scale (0.05) for the fakes to hand out."""
    shp = slot_shapes(p)
    owner = {q.llms[0]: i for i, q in enumerate(parts)}
    real = {}
    for i, q in enumerate(parts):
        sub, sub_top = _sub(p, topo, q)
        real[i] = solve_slot_scale(sub, sub_top, deadline=Deadline.after(60), at_scale=0.05,
                                   shapes={m: shp[m] for m in q.llms}, time_limit_s=30)
        assert real[i].choice
    return shp, owner, real


def _fake_parts(monkeypatch, p, topo, parts, capacity, cut_above=True, slow=0.0, cost=0.0):
    """solve_slot_scale replaced by an oracle: part ``i`` (by its first LLM) has a solution at
    scales up to ``capacity[i]`` (a real one, solved once at a low scale, that claims the
    scale asked), found in ``cost`` seconds (a probe given less is cut short, like HiGHS's
    presolve); above it the probe is cut short (after ``slow`` seconds or its whole time,
    whichever is less) or proven infeasible. Returns the scales asked, per part."""
    shp, owner, real = _low_solutions(p, topo, parts)
    asked: dict[int, list[float]] = {i: [] for i in range(len(parts))}

    def fake(sub, sub_top, *, deadline, time_limit_s=None, shapes=None, at_scale=None, **kw):
        i = owner[min(sub.llms)]
        asked[i].append(at_scale)
        if time_limit_s < cost:
            time.sleep(time_limit_s)
            return _none("time_limit")
        if at_scale <= capacity[i]:
            from dataclasses import replace
            time.sleep(cost)
            return replace(real[i], scale=at_scale * 1.0001)
        if cut_above:
            time.sleep(min(slow, time_limit_s))
            return _none("time_limit")
        return _none("infeasible")

    monkeypatch.setattr(slots, "solve_slot_scale", fake)
    return shp, asked


def test_a_probe_cut_short_steps_the_ladder_down_less_than_a_proof(monkeypatch):
    """The first part's probes above its capacity are cut short: the ladder steps down by
    FIRST_STEP each time (1 - 0.02, 0.04, 0.06, ... of the bound), where proofs that none
    exists double the step (0.02, 0.04, 0.08, ...); the result is time_limit, not a proof."""
    p = many_models_problem(16, 32, ROOF, options=MT)
    topo = from_cluster(p.cluster)
    parts = partition(p, topo, 16)
    ub = 1.0
    for cut in (True, False):
        _, asked = _fake_parts(monkeypatch, p, topo, parts, [0.9], cut_above=cut)
        res = solve_parts(p, topo, parts, deadline=Deadline.after(20), shapes=slot_shapes(p),
                          scale_ub=ub)
        steps = [round(1 - a / ub, 6) for a in asked[0][:4]]
        if cut:
            assert steps == [0.02, 0.04, 0.06, 0.08]
            assert res.timed_out and res.cut >= 4 and res.infeasible == 0
        else:
            assert steps[:3] == [0.02, 0.04, 0.08]
            assert not res.timed_out and res.infeasible >= 2
        # the bracket closes within a step of the capacity (the fake's solutions are real
        # ones of a low scale, so the joined scale is theirs: the scales asked tell)
        assert res.solution is not None
        assert max(a for a in asked[0] if a <= 0.9) >= 0.9 - slots.LADDER_REL * ub


def test_every_part_gets_a_solution_when_probes_cost_time_and_the_plan_is_kept(monkeypatch):
    """8 parts; a probe needs 0.25 s to find a solution (less time: cut short) and one above
    its part's capacity is cut short after up to 1 s; the first part carries 0.9 of the bound,
    the others 0.6. Every part still gets a solution in 8 s (the first part's search keeps to
    its budget, each probe gets at least PROBE_MIN_S, the others are asked a safe way below the
    first), and when catching up runs out of time the plan in hand comes back (time_limit).
    Before, the later parts' probes at the first part's level, cut short and retried, left the
    last parts shares below what a probe needs: no plan."""
    p = many_models_problem(64, 128, ROOF, copies=False, options=MT)
    topo = from_cluster(p.cluster)
    parts = partition(p, topo, 8)
    assert len(parts) == 8
    cap = [0.9] + [0.6] * (len(parts) - 1)
    shp, asked = _fake_parts(monkeypatch, p, topo, parts, cap, slow=1.0, cost=0.25)
    t0 = time.monotonic()
    res = solve_parts(p, topo, parts, deadline=Deadline.after(8), shapes=shp, scale_ub=1.0)
    assert time.monotonic() - t0 <= 8 + 0.5
    assert res.solution is not None and res.solved == len(parts) and res.timed_out
    assert set(res.solution.choice) == set(p.llms)
    assert all(asked[i] for i in range(len(parts)))


# --------------------------------------------------------------------------- a target scale

def _target_parts(monkeypatch, capacity, cut_above=False):
    p = many_models_problem(64, 128, ROOF, copies=False, options=MT)
    topo = from_cluster(p.cluster)
    parts = partition(p, topo, 16)
    assert len(parts) == len(capacity)
    shp, asked = _fake_parts(monkeypatch, p, topo, parts, capacity, cut_above=cut_above)
    return p, topo, parts, shp, asked


def test_a_target_is_asked_once_of_every_part_and_nothing_lower(monkeypatch):
    """With a target every part is probed at the target only: one probe each when every part
    carries it, and a joined solution comes back (the fake's solutions are real ones of a low
    scale, so the scales asked tell, not the joined scale)."""
    p, topo, parts, shp, asked = _target_parts(monkeypatch, [0.9, 0.7, 0.8, 0.75])
    res = solve_parts(p, topo, parts, deadline=Deadline.after(20), shapes=shp, scale_ub=1.0,
                      target=0.65)
    assert [asked[i] for i in range(len(parts))] == [[0.65]] * len(parts)
    assert res.solution is not None and res.probes == len(parts) and not res.timed_out


def test_a_part_proven_not_to_carry_the_target_ends_the_search(monkeypatch):
    """Part 1 carries 0.7 < 0.75 and is proven infeasible there: no solution, no lower scale
    asked of anyone, and the parts after it are not probed."""
    p, topo, parts, shp, asked = _target_parts(monkeypatch, [0.9, 0.7, 0.8, 0.75])
    res = solve_parts(p, topo, parts, deadline=Deadline.after(20), shapes=shp, scale_ub=1.0,
                      target=0.75)
    assert res.solution is None and res.infeasible == 1 and not res.timed_out
    assert asked[0] == [0.75] and asked[1] == [0.75] and asked[2] == [] and asked[3] == []


def test_a_part_cut_short_is_asked_again_with_the_time_the_others_left(monkeypatch):
    """Part 0's probe needs 2 s and its first round's share is about a quarter of 6 s: it is
    cut short, the others find theirs at once, and the second round gives part 0 the time
    they left, so every part carries the target."""
    p = many_models_problem(64, 128, ROOF, copies=False, options=MT)
    topo = from_cluster(p.cluster)
    parts = partition(p, topo, 16)
    shp, owner, real = _low_solutions(p, topo, parts)
    shares: dict[int, list[float]] = {i: [] for i in range(len(parts))}

    def fake(sub, sub_top, *, deadline, time_limit_s=None, shapes=None, at_scale=None, **kw):
        from dataclasses import replace
        i = owner[min(sub.llms)]
        shares[i].append(time_limit_s)
        need = 2.0 if i == 0 else 0.01
        if time_limit_s < need:
            time.sleep(time_limit_s)
            return _none("time_limit")
        time.sleep(need)
        return replace(real[i], scale=at_scale * 1.0001)

    monkeypatch.setattr(slots, "solve_slot_scale", fake)
    res = solve_parts(p, topo, parts, deadline=Deadline.after(6), shapes=shp, scale_ub=1.0,
                      target=0.5)
    assert len(shares[0]) == 2 and shares[0][0] < 2.0 <= shares[0][1]
    assert all(len(shares[i]) == 1 for i in range(1, len(parts)))
    assert res.solution is not None and res.cut == 1 and res.solved == len(parts)


def test_a_target_above_the_bound_is_refused_without_a_probe(monkeypatch):
    """The proven bound is below the target: no allocation carries it, which is known
    without searching (exact, unplaced, no probe)."""
    p = many_models_problem(64, 128, ROOF, copies=False, options=MT)
    topo = from_cluster(p.cluster)
    bound = scale_upper_bound(p, as_capacity_shapes(slot_shapes(p)))

    def never(*a, **k):
        raise AssertionError("probed")

    monkeypatch.setattr(slots, "solve_slot_scale", never)
    res = plan_slot_scale(p, topo, deadline=Deadline.after(30), target=bound * 1.01)
    assert res.status == "unplaced" and res.exact and res.plan.status == "infeasible"
    assert res.plan.stats["scale_bound"] == pytest.approx(bound, rel=1e-9)


def test_a_target_below_the_bound_is_carried_by_a_valid_placement():
    """One Zipf popularity over 64 LLMs on 128 GPUs, asked for 0.8 of the proven bound: the
    parts carry it (the plan's scale, the least headroom of its LLMs, at least the target), laid out
    without a violation on the cluster."""
    from scepsy_place.packing.check import violations

    p = many_models_problem(64, 128, ROOF, copies=False, options=MT)
    topo = from_cluster(p.cluster)
    bound = scale_upper_bound(p, as_capacity_shapes(slot_shapes(p)))
    res = plan_slot_scale(p, topo, deadline=Deadline.after(60), target=0.8 * bound)
    assert res.placed and res.plan.scale >= 0.8 * bound * (1 - 1e-9)
    assert violations(topo, demands(res.plan.allocation), res.placement) == []


# --------------------------------------------------------------------------- the least price

def _fewest_gpus(p, target: float, most: int) -> int | None:
    """Brute force: the fewest GPUs (one node of that many) on which some allocation of one
    slot shape per LLM carries ``target`` of the targets and places exactly."""
    import itertools

    from scepsy_common.units import UNITS
    from scepsy_opt.cluster import uniform_cluster
    from scepsy_opt.planning.candidates import Candidate
    from scepsy_opt.planning.plans import headroom, plan_from_choice
    from scepsy_place.packing.exhaustive import placeable

    shp = slot_shapes(p)
    llms = sorted(shp)
    for n in range(1, most + 1):
        topo = from_cluster(uniform_cluster("A100-80GB", n, n))
        options = [[Candidate(m, sh.gpu, sh.tp, sh.share, r, sh.tp * sh.units * r, sh.mu,
                              math.nan, 0.0, 0.0)
                    for sh in shp[m] for r in range(1, n * UNITS // (sh.tp * sh.units) + 1)]
                   for m in llms]
        for combo in itertools.product(*options):
            if sum(c.units for c in combo) > n * UNITS:
                continue
            choice = dict(zip(llms, combo, strict=True))
            if min(headroom(p, choice).values()) < target * (1 - 1e-9):
                continue
            if placeable(topo, demands(plan_from_choice(p, "oracle", "optimal", choice,
                                                        {}).allocation)):
                return n
    return None


@pytest.mark.parametrize("seed", range(4))
def test_a_target_at_the_least_price_takes_the_fewest_gpus_of_any_placement(seed):
    """With TP 1 only slot groups describe every packing of a GPU, so the solution at a fixed
    scale whose groups' GPUs cost the least takes as few GPUs as the best placeable allocation
    (brute force over shapes, replica counts and GPU counts), and its layout is valid."""
    from scepsy_opt.cluster import uniform_cluster
    from scepsy_opt.planning.plans import plan_from_choice
    from scepsy_place.packing.check import violations

    opts = PlanOptions(shares=(0.3, 0.5, 0.6, 1.0), tps=(1,), objective="max-throughput")
    cl = uniform_cluster("A100-80GB", 3, 3)
    p = random_problem(2, 3, ROOF, seed=seed, load=0.5, options=opts, cluster=cl)
    topo = from_cluster(cl)
    most = solve_slot_scale(p, topo, deadline=Deadline.after(60), gap_rel=1e-9).scale
    target = 0.5 * most
    sol = solve_slot_scale(p, topo, deadline=Deadline.after(60), at_scale=target,
                           gpu_cost={"A100-80GB": 1.0}, gap_rel=1e-9)
    taken = sum(t * count for (_, t), groups in sol.groups.items() for _, count in groups)
    alloc = plan_from_choice(p, "milp", "optimal", dict(sol.choice), {}).allocation
    placement = layout(topo, sol, demands(alloc))
    assert placement.complete and violations(topo, demands(alloc), placement) == []
    assert min(slots.headroom(p, dict(sol.choice)).values()) >= target * (1 - 1e-9)
    assert taken == _fewest_gpus(p, target, 3)


@settings(derandomize=True, deadline=None, database=None, max_examples=60)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 6), st.integers(1, 4)),
                min_size=1, max_size=3),
       st.integers(0, 40), st.data())
def test_fewer_nodes_ends_where_one_node_less_of_any_type_does_not_carry(types, need, data):
    """A monotone 'carries' (enough weighted nodes, and each type at least its least): from
    counts that carry, the descent never asks the same counts twice, keeps carrying, and ends
    where each type is at its floor or one node less of it (the others as they end) does not
    carry; it asks fewer counts than the exhaustive search over the box would."""
    from scepsy_place.formulations.loop import _fewer_nodes

    order = [f"t{i}" for i in range(len(types))]
    weight = {t: w for t, (w, _, _) in zip(order, types, strict=True)}
    least = {t: m for t, (_, m, _) in zip(order, types, strict=True)}
    floor = {t: max(0, least[t] - d) for t, (_, _, d) in zip(order, types, strict=True)}
    top = {t: max(least[t], floor[t]) + data.draw(st.integers(0, 12)) for t in order}
    if sum(weight[t] * top[t] for t in order) < need:
        top[order[0]] += need
    price = {t: data.draw(st.floats(0.5, 4.0)) for t in order}

    def carries(c):
        return (all(c[t] >= least[t] for t in order)
                and sum(weight[t] * c[t] for t in order) >= need)

    asked: list[tuple[int, ...]] = []

    def attempt(c):
        asked.append(tuple(c[t] for t in order))
        return carries(c)

    assert carries(top)
    best = _fewer_nodes(top, floor, price, attempt, Deadline.after(60), set(), order)
    assert len(asked) == len(set(asked))
    assert carries(best) and all(best[t] <= top[t] for t in order)
    for t in order:
        assert best[t] == floor[t] or not carries({**best, t: best[t] - 1})
    box = math.prod(top[t] - floor[t] + 1 for t in order)
    assert len(asked) <= box


# --------------------------------------------------------------------------- mean latency bounds

def _bounded(n: int, gpus: int, factor: float, scale: float):
    """One Zipf popularity over ``n`` LLMs (each its own one-call workflow), min-cost at
    ``scale``, each workflow's mean bound ``factor`` times its LLM's least latency at the
    fewest replicas that carry it on any shape."""
    from dataclasses import replace

    from scepsy_opt.planning.instances import least_latency_bounds

    p = many_models_problem(n, gpus, ROOF, copies=False,
                            options=PlanOptions(objective="min-cost")).scaled(scale)
    bounds = least_latency_bounds(p, factor)
    return replace(p, options=replace(p.options, latency_bound_s=bounds))


def test_the_least_replicas_of_a_bounded_shape_are_the_first_count_that_meets_its_bound():
    """Every shape's ``least`` is the fewest replicas that carry the load and meet the mean
    bound, found count by count (the predictor, one count at a time); a shape without one
    meets it at no count scanned."""
    import numpy as np

    from scepsy_opt.planning.candidates import fitting_curves, workflow_latency_terms
    from scepsy_opt.prediction.pipeline import min_replicas

    p = _bounded(16, 32, 1.2, 0.8)
    shp = slot_shapes(p, bounded=True)
    u = p.options.max_utilisation
    checked = 0
    for m in p.llms:
        curves = {(g, t, c.share): c for g, t, c in fitting_curves(p, m, p.demands[m])}
        budget = p.options.latency_bound_s[m]
        for sh in shp[m]:
            c = curves[(sh.gpu, sh.tp, sh.share)]
            first = min_replicas(p.loads[m], c.mu, u)
            meets = [r for r in range(first, first + slots.LATENCY_SCAN)
                     if workflow_latency_terms(p, m, [c], [np.array([float(r)])])[0][m][0]
                     <= budget * (1 + 1e-9)]
            assert sh.meets == bool(meets)
            assert sh.least == (meets[0] if meets else first + slots.LATENCY_SCAN)
            checked += 1
    assert checked > 0 and any(sh.least > 1 for v in shp.values() for sh in v)
    assert any(not sh.meets for v in shp.values() for sh in v)  # the bound binds somewhere


def test_the_bounded_price_bound_holds_for_the_exact_aggregate_optimum():
    """16 LLMs / 32 GPUs with mean bounds: the price bound counting each shape's least
    replicas is at most the exact aggregate min-cost optimum under the same bounds, and at
    least the bound without them."""
    from scepsy_opt.planning.mincost import cost_lower_bound, gpu_prices, solve_min_cost

    p = _bounded(16, 32, 2.0, 0.8)
    prices = gpu_prices(p)
    shp = slot_shapes(p, bounded=True)
    bound, _ = cost_lower_bound(p, prices, as_capacity_shapes(shp),
                                least={m: [sh.least for sh in v] for m, v in shp.items()})
    plain, _ = cost_lower_bound(p, prices)
    exact = solve_min_cost(p, deadline=Deadline.after(120))
    assert exact.status == "optimal"
    assert plain <= bound * (1 + 1e-9)
    assert bound <= exact.stats.cost_per_hour * (1 + 1e-6)


@pytest.mark.slow
def test_min_cost_with_mean_bounds_on_many_llms_is_placed_within_the_bounds():
    """64 LLMs / 128 GPUs, each workflow bounded: the search on fewer nodes places a plan whose
    predicted means meet every bound, valid on the cluster, priced at or above its bound."""
    from scepsy_opt.planning.candidates import price
    from scepsy_place.formulations.loop import by_scale_applies, plan_and_place
    from scepsy_place.packing.check import violations

    p = _bounded(64, 128, 2.0, 0.95)
    topo = from_cluster(p.cluster)
    assert by_scale_applies(p, topo)
    res = plan_and_place(p, topo, deadline=Deadline.after(40))
    assert res.placed and "slots-scale" in res.compared
    priced = price(p, res.plan.allocation)
    for w, b in p.options.latency_bound_s.items():
        assert dict(priced[w].workflow_latency_s)[w] <= b * (1 + 1e-6)
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    s = res.plan.stats
    assert s.placed_cost_per_hour >= s.cost_bound_per_hour * (1 - 1e-9)
