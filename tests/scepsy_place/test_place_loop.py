"""The optimise-place loop: it recovers from unplaceable optima and finds the cheapest placeable
allocation (brute force over every candidate combination, the placer as the oracle)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from scepsy_opt.cluster import uniform_cluster
from scepsy_opt.planning.candidates import fits_budget, generate_candidates, price
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.milp import max_scale
from scepsy_opt.planning.plans import plan_from_choice
from scepsy_opt.planning.problem import PlanOptions
from scepsy_opt.prediction.pipeline import llm_demand
from scepsy_place.formulations.loop import plan_and_place
from scepsy_place.packing.check import violations
from scepsy_place.packing.placement import demands, place
from scepsy_place.packing.topology import from_cluster
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
OPTS = PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1,))


def problem(seed: int, gpus: int):
    cl = uniform_cluster("A100-80GB", gpus, gpus)
    return random_problem(3, gpus, ROOF, seed=seed, load=0.6, options=OPTS, cluster=cl), cl


def cheapest_placeable(p, topo):
    """Every combination of (unpruned) candidates in cost order; the first the placer places."""
    cands = generate_candidates(p, prune=False).by_llm
    llms = sorted(cands)
    combos = sorted(
        (math.fsum(c.cost for c in combo), i, combo)
        for i, combo in enumerate(itertools.product(*(cands[m] for m in llms))))
    for _, _, combo in combos:
        choice = dict(zip(llms, combo, strict=True))
        if not fits_budget(p, choice):
            continue
        plan = plan_from_choice(p, "oracle", "optimal", choice, {})
        if place(topo, demands(plan.allocation)).complete:
            return plan
    return None


@pytest.mark.parametrize(("seed", "gpus"), [(0, 3), (2, 3), (3, 3)])
def test_loop_recovers_from_an_unplaceable_optimum(seed, gpus):
    p, cl = problem(seed, gpus)
    topo = from_cluster(cl)
    res = plan_and_place(p, topo, formulation="aggregate")
    assert res.rounds > 1  # the aggregate optimum did not fit on whole GPUs
    assert res.history[0]["unplaced"] > 0 and res.history[-1]["unplaced"] == 0
    assert res.placed and res.reason is None
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    # objectives rise round by round (each round forbids a cheaper, unplaceable allocation)
    objs = [h["objective_s"] for h in res.history]
    assert objs == sorted(objs)
    oracle = cheapest_placeable(p, topo)
    assert oracle is not None
    assert res.plan.objective_s == pytest.approx(oracle.objective_s, rel=1e-9)


def test_whole_gpu_power_of_two_plans_place_in_one_round():
    # whole GPUs, TP degrees and nodes powers of two: the aggregate optimum is always placeable
    cl = uniform_cluster("A100-80GB", 16, 8)
    p = random_problem(4, 16, ROOF, seed=1, cluster=cl, options=PlanOptions(shares=(1.0,)))
    res = plan_and_place(p, from_cluster(cl), formulation="aggregate")
    assert res.placed and res.rounds == 1 and res.exact
    assert res.quality["gpus_used"] == res.quality["bound_l1"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_loop_always_ends_placed_with_tp_groups_of_fractional_shares(seed):
    cl = uniform_cluster("A100-80GB", 16, 8)
    p = random_problem(4, 16, ROOF, seed=seed, cluster=cl)
    topo = from_cluster(cl)
    res = plan_and_place(p, topo, formulation="aggregate")
    assert res.placed, res.reason
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    assert res.rounds == len(res.history) and res.history[-1]["unplaced"] == 0
    # each round is at least as expensive as the last: cuts only remove allocations
    objs = [h["objective_s"] for h in res.history]
    assert objs == sorted(objs)


def test_no_placeable_allocation_is_reported():
    # one GPU, two LLMs that each need more than half of it: no allocation fits
    cl = uniform_cluster("A100-80GB", 1, 1)
    p = random_problem(2, 1, ROOF, seed=4, load=0.9, options=PlanOptions(shares=(0.6, 1.0), tps=(1,)),
                       cluster=cl)
    res = plan_and_place(p, from_cluster(cl), formulation="aggregate")
    assert not res.placed and res.reason


def test_max_throughput_plans_are_placed_at_the_largest_placeable_scale():
    cl = uniform_cluster("A100-80GB", 3, 3)
    mt = random_problem(3, 3, ROOF, seed=0, load=0.6, cluster=cl,
                        options=dataclasses.replace(OPTS, objective="max-throughput"))
    topo = from_cluster(cl)
    res = plan_and_place(mt, topo, formulation="aggregate")
    cap, _, _ = max_scale(mt)
    assert res.placed and 0 < res.plan.scale <= cap
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    # the placed allocation carries the targets at the scale it reports
    at = mt.scaled(res.plan.scale)
    for m, c in price(at, res.plan.allocation).items():
        load = llm_demand(at.stats, at.models, at.targets, m).rate
        assert c.capacity * at.options.max_utilisation >= load * (1 - 1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replanning_on_a_busy_cluster_budgets_the_free_capacity(seed):
    """Half of the GPUs are taken: the loop's MILP sees only the free capacity, so its plan fits
    what is left and is placed around the running work (the cluster's budget counts every GPU)."""
    p = random_problem(3, 16, ROOF, seed=seed, load=0.3, options=OPTS)
    free = from_cluster(p.cluster)
    busy = free.with_nodes(dataclasses.replace(n, used=((0.5, 40.0),) * n.gpus)
                           if i == 0 else n for i, n in enumerate(free.nodes))
    res = plan_and_place(p, busy, formulation="aggregate")
    assert res.placed
    left = sum(n.free_units(g) for n in busy.nodes for g in range(n.gpus))
    assert sum(c.units for c in res.plan.candidates.values()) <= left
    ds = demands(res.plan.allocation)
    assert violations(busy, ds, res.placement) == []
    # on the idle cluster the optimum uses more than is left here: the rows bind
    unconstrained = plan_and_place(p, free, formulation="aggregate")
    assert sum(c.units for c in unconstrained.plan.candidates.values()) > left
    assert res.plan.objective_s >= unconstrained.plan.objective_s - 1e-9


# --------------------------------------------------------------------------- cuts and statuses
# Each row the loop adds must hold for every placeable allocation; the instance is called
# infeasible only when such rows alone leave no allocation; plan.json never carries a partial
# placement; `compared` says how each formulation ended.

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from scepsy.cli import main  # noqa: E402
from scepsy_common.units import share_units  # noqa: E402
from scepsy_opt.planning.candidates import Candidate  # noqa: E402
from scepsy_place.formulations.cuts import configuration_cut, most_weight  # noqa: E402
from scepsy_place.packing.exact import place_exactly  # noqa: E402
from scepsy_place.packing.placement import Placement  # noqa: E402
from scepsy_place.packing.replicas import Demand  # noqa: E402
from scepsy_place.packing.topology import parse_topology  # noqa: E402

FAST = settings(derandomize=True, deadline=None, database=None, max_examples=60)
GPU = "A100-80GB"
REPO = Path(__file__).resolve().parents[2]
RAG_BEAM = str(REPO / "datasets" / "workflows" / "rag-beam.yaml")
A16 = str(REPO / "datasets" / "clusters" / "a100-16.yaml")


def packs(items: list[int], bins: list[int]) -> bool:
    """Exhaustive search: do the slices (units) fit into the GPUs (free units)?"""
    if not items:
        return True
    tried = set()
    for i, free in enumerate(bins):
        if free >= items[0] and free not in tried:
            tried.add(free)
            if packs(items[1:], [*bins[:i], free - items[0], *bins[i + 1:]]):
                return True
    return False


def cand(llm: str, share: float, replicas: int, tp: int = 1) -> Candidate:
    return Candidate(llm, GPU, tp, share, replicas, tp * share_units(share) * replicas, 1.0, 1.0,
                     1.0, 0.0)


def busy_topology(gpus: int, used: list[float]):
    nodes = [{"name": "n", "gpu": GPU, "gpus": gpus,
              "in_use": [{"gpu": i, "share": s, "memory_gib": 80 * s}
                         for i, s in enumerate(used) if s > 0]}]
    return parse_topology({"name": "t", "racks": [{"name": "r", "nodes": nodes}]}, "test")


tenths = st.integers(1, 10).map(lambda k: k / 10)


@FAST
@given(gpus=st.integers(1, 4), used=st.lists(st.sampled_from([0.0, 0.0, 0.3, 0.5]), max_size=4),
       failed=st.lists(st.tuples(tenths, st.integers(1, 5)), min_size=1, max_size=3),
       packing=st.lists(st.lists(tenths, max_size=4), max_size=4))
def test_configuration_cuts_hold_for_every_placeable_allocation(gpus, used, failed, packing):
    """Oracle: exhaustive packing. A cut is only made for slices that do not pack; every
    allocation whose slices were packed GPU by GPU satisfies it."""
    used = (used + [0.0] * gpus)[:gpus]
    topo = busy_topology(gpus, used)
    free = [1000 - share_units(s) for s in used]
    bad = [cand(f"f{i}", s, r) for i, (s, r) in enumerate(failed)]
    # a placeable allocation: per GPU, shares that fit what is free on it
    slices: dict[float, int] = {}
    for g, shares in enumerate(packing[:gpus]):
        room = free[g]
        for s in shares:
            if share_units(s) <= room:
                room -= share_units(s)
                slices[s] = slices.get(s, 0) + 1
    good = [cand(f"p{s}", s, n) for s, n in sorted(slices.items())]
    cands = {c.llm: (c,) for c in bad + good}
    cut = configuration_cut(topo, GPU, bad, cands)
    items = sorted((share_units(c.share) for c in bad for _ in range(c.replicas)), reverse=True)
    if cut is None:
        return
    coeffs, rhs = cut
    assert not packs(items, free)
    assert sum(coeffs.get(c, 0.0) for c in bad) > rhs
    assert sum(coeffs.get(c, 0.0) for c in good) <= rhs


def test_knapsack_of_the_cut_is_exact():
    sizes, weights = [400, 300, 100], [1.0, 0.5, 0.1]
    for cap in (0, 99, 300, 700, 1000):
        brute = max(a * 1.0 + b * 0.5 + c * 0.1 for a in range(3) for b in range(4)
                    for c in range(11) if 400 * a + 300 * b + 100 * c <= cap)
        assert most_weight(sizes, weights, cap)[0] == pytest.approx(brute, abs=1e-12)


def brute_place(domains: list[list[int]], ds: list[tuple[int, int]]) -> bool:
    """Exhaustive: TP groups (tp, units) onto distinct GPUs of one domain each."""
    if not ds:
        return True
    (tp, units), rest = ds[0], ds[1:]
    for d, free in enumerate(domains):
        for gs in itertools.combinations(range(len(free)), tp):
            if all(free[g] >= units for g in gs):
                nxt = [list(f) for f in domains]
                for g in gs:
                    nxt[d][g] -= units
                if brute_place(nxt, rest):
                    return True
    return False


@FAST
@given(domain=st.sampled_from([1, 2, 4]),
       groups=st.lists(st.tuples(st.sampled_from([1, 1, 2, 4]), tenths), min_size=1, max_size=6))
def test_exact_placement_agrees_with_exhaustive_search(domain, groups):
    node = {"name": "n", "gpu": GPU, "gpus": 4, "nvlink_domain": domain}
    topo = parse_topology({"name": "t", "racks": [{"name": "r", "nodes": [node]}]}, "test")
    ds = [Demand(f"m{tp}_{s}", i, GPU, tp, s, 80 * s) for i, (tp, s) in enumerate(groups)]
    ex = place_exactly(topo, ds)
    want = brute_place([[1000] * domain for _ in range(4 // domain)],
                       sorted(((d.tp, d.units) for d in ds), reverse=True))
    assert ex.status == ("placed" if want else "infeasible")
    if want:
        assert violations(topo, ds, Placement(ex.slots, (), "exact")) == []


def test_infeasible_is_reported_with_each_kind_of_cut_counted():
    # three LLMs of at least 0.6 of a GPU each on two GPUs: 1.8 GPUs fit the budget, not the GPUs
    cl = uniform_cluster("A100-80GB", 2, 2)
    p = random_problem(3, 2, ROOF, seed=0, load=0.3,
                       options=PlanOptions(shares=(0.6, 1.0), tps=(1,)), cluster=cl)
    res = plan_and_place(p, from_cluster(cl), formulation="aggregate")
    assert res.status == "infeasible" and res.exact and not res.placed
    assert cheapest_placeable(p, from_cluster(cl)) is None  # brute force agrees
    assert res.cuts["packing"] > 0 and res.cuts["no_good_placer"] == 0
    for kind in ("configuration", "no_good"):  # rounds' cuts add up; packing rows counted apart
        assert sum(h.get("cuts", {}).get(kind, 0) for h in res.history) == res.cuts[kind]
    assert f"{res.cuts['packing']} packing row(s)" in res.reason
    assert f"{res.cuts['configuration']} configuration cut(s)" in res.reason


def test_aggregate_loop_places_what_blocks_places(capsys, tmp_path):
    """The bundled example at 2.8 req/s (300 requests per workflow): the aggregate loop said
    "no allocation is placeable" with exact: true while the blocks plan places."""
    docs = {}
    for form in ("aggregate", "blocks"):
        out = tmp_path / f"{form}.json"
        main(["plan", "--workflow", RAG_BEAM, "--cluster", A16, "--target", "2.8",
              "--trace-requests", "300", "--formulation", form, "--out", str(out)])
        docs[form] = json.loads(out.read_text())
    capsys.readouterr()
    assert docs["blocks"]["placement"]["placed"]
    agg = docs["aggregate"]
    assert agg["placement"]["placed"] and agg["placement"]["exact"]
    # the exact loop's optimum is over a superset of the blocks allocations
    assert (agg["solver"]["objective_s"]
            <= docs["blocks"]["solver"]["objective_s"] * (1 + 1e-8))


def test_a_plan_that_is_not_placed_carries_no_placement(capsys, tmp_path):
    """One round is not enough on the bundled example: the loop gives up (not infeasible), and
    plan.json has no allocation, no replica rows, the unplaced replicas and the reason."""
    out = tmp_path / "plan.json"
    code = main(["plan", "--workflow", RAG_BEAM, "--cluster", A16, "--target", "2.8",
                 "--trace-requests", "300", "--formulation", "aggregate", "--max-rounds", "1",
                 "--out", str(out)])
    err = capsys.readouterr().err
    doc = json.loads(out.read_text())
    pl = doc["placement"]
    assert code == 1 and err.startswith("scepsy: unplaced:")
    assert doc["status"] == "unplaced" and "allocation" not in doc
    assert pl["status"] == "unplaced" and not pl["placed"] and not pl["exact"]
    assert pl["instances"] == [] and pl["unplaced"] and "not proven infeasible" in pl["reason"]


def test_compared_says_how_each_formulation_ended():
    # whole GPUs: both formulations reach the same optimum, and the loop stops at it
    p = random_problem(3, 8, ROOF, seed=0, options=PlanOptions(shares=(1.0,)))
    res = plan_and_place(p, from_cluster(p.cluster), formulation="auto")
    agg, blk = res.compared["aggregate"], res.compared["blocks"]
    assert res.formulation == "blocks" and blk.status == "placed"
    assert agg.status == "stopped" and agg.objective_s >= blk.objective_s
    entry = res.to_dict()["compared"]["aggregate"]
    assert entry == {"status": "stopped", "objective_s": agg.objective_s,
                     "bound_s": agg.bound_s, "seconds": entry["seconds"]}
    assert "seconds" not in res.to_dict(timings=False)["compared"]["aggregate"]
    # the exact loop's bound stopped at the blocks plan: blocks are proven optimal
    assert agg.bound_s == pytest.approx(blk.objective_s, rel=1e-6)
    assert res.bound_s == agg.bound_s and res.gap == pytest.approx(0.0, abs=1e-6)
    # blocks find nothing here (not a proof: whole GPUs cost more), the aggregate loop places
    p = random_problem(3, 4, ROOF, seed=1)
    res = plan_and_place(p, from_cluster(p.cluster), formulation="auto")
    assert res.compared["blocks"].status == "unplaced"
    assert res.compared["blocks"].objective_s is None
    assert res.compared["aggregate"].status == "placed" and res.formulation == "aggregate"


@settings(derandomize=True, deadline=None, database=None, max_examples=10)
@given(seed=st.integers(0, 10_000), load=st.floats(0.5, 1.3))
def test_aggregate_never_calls_infeasible_what_blocks_places(seed, load):
    cl = uniform_cluster("A100-80GB", 4, 2)
    p = random_problem(3, 4, ROOF, seed=seed, load=load, cluster=cl,
                       options=PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1, 2)))
    topo = from_cluster(cl)
    agg = plan_and_place(p, topo, formulation="aggregate")
    blk = plan_and_place(p, topo, formulation="blocks")
    if agg.status == "infeasible":
        assert not blk.placed
    if agg.placed and blk.placed:
        assert agg.plan.objective_s <= blk.plan.objective_s * (1 + 1e-8)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_without_the_exact_test_the_loop_is_inexact_never_infeasible(monkeypatch, seed):
    """When the exact test cannot decide (here: never), the placer's failures give unproven
    no-good cuts and then budget tightening: the result is not exact, and the loop never calls
    the instance infeasible (these instances place with the exact test)."""
    import scepsy_place.packing.exact

    cl = uniform_cluster("A100-80GB", 16, 8)
    p = random_problem(4, 16, ROOF, seed=seed, cluster=cl)
    topo = from_cluster(cl)
    assert plan_and_place(p, topo, formulation="aggregate").placed
    monkeypatch.setattr(scepsy_place.packing.exact, "EXACT_MAX_GPUS", 0)
    res = plan_and_place(p, topo, formulation="aggregate")
    assert res.status in ("placed", "unplaced")
    if res.cuts["no_good_placer"] or res.cuts["tightened"]:
        assert not res.exact
    if not res.placed:
        assert "not proven infeasible" in res.reason and res.answer.status == "unplaced"
