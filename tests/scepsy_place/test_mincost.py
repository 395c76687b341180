"""The min-cost objective (scepsy_opt.planning.mincost): brute-force oracle on tiny instances, monotonicity
in the latency bound and the GPU types, the fewest GPUs of open pools, truthful statuses, and
the prices of the catalog and the cluster file.

Costs are compared with a relative tolerance of 1e-9 (sums of a few prices), latencies with
1e-7 (HiGHS's integrality tolerance times the candidates' costs)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_common.units import UNITS
from scepsy_opt.allocation import Allocation
from scepsy_opt.cluster import (
    Cluster,
    GPUPool,
    cluster_to_dict,
    parse_cluster,
    sized_cluster,
    with_prices,
)
from scepsy_opt.planning.candidates import Candidate, generate_candidates
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.milp import MILPOptimiser, percentile_latencies
from scepsy_opt.planning.mincost import (
    cost_per_hour,
    gpu_prices,
    gpus_used,
    latency_cost,
    latency_floors,
    nodes_to_buy,
    prune_for_cost,
    slo_rows,
    solve_min_cost,
)
from scepsy_opt.planning.optimisers import optimiser
from scepsy_opt.planning.plans import workflow_latencies
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.stats import workflow_stats
from scepsy_opt.traces import validate_calls
from scepsy_opt.workflows import generate_trace, load_workflow
from scepsy_profile.catalog import default_catalog, parse_catalog
from scepsy_profile.roofline import RooflineModel

COST_TOL = 1e-9
COST_TIE = 1e-6  # placed plans: latency breaks ties within this share of a GPU-hour
LAT_TOL = 1e-7
OPTS = PlanOptions(objective="min-cost", shares=(0.5, 1.0), tps=(1, 2))
A100, H100 = "A100-80GB", "H100-80GB"


def tiny(roofline: RooflineModel, seed: int, cluster: Cluster, n_llms: int = 2,
         load: float = 0.4, **opts: object) -> PlanningProblem:
    """A random problem of ``n_llms`` LLMs on ``cluster`` (one workflow)."""
    return random_problem(n_llms, cluster.total_gpus or 4, roofline, seed=seed, workflows=1,
                          load=load, cluster=cluster, options=dataclasses.replace(OPTS, **opts))


def pools(*spec: tuple[str, int, float | None]) -> Cluster:
    """One-GPU nodes: ``(gpu, nodes, price)`` per pool."""
    return Cluster("c", tuple(GPUPool(g, n, 1, p) for g, n, p in spec))


def with_bounds(problem: PlanningProblem, **opts: object) -> PlanningProblem:
    return dataclasses.replace(problem, options=dataclasses.replace(problem.options, **opts))


def mean_latency(problem: PlanningProblem, choice: Mapping[str, Candidate], w: str) -> float:
    return math.fsum(dict(c.workflow_latency_s).get(w, 0.0) for c in choice.values()) \
        + problem.stats[w].tool_critical_s


def oracle(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
           ) -> tuple[float, float] | None:
    """(cost, latency) of the cheapest choice (ties: least latency) meeting the budgets, the mean
    bounds and the percentile bounds, by enumeration; None when none does."""
    prices = gpu_prices(problem)
    budgets = problem.cluster.budgets()
    llms = sorted(cands)
    best: tuple[float, float] | None = None
    for combo in itertools.product(*(cands[m] for m in llms)):
        choice = dict(zip(llms, combo, strict=True))
        used = {}
        for c in combo:
            u, mem = used.get(c.gpu, (0, 0))
            used[c.gpu] = (u + c.units, mem + c.mem_units)
        n = {g: -(-max(u, mem) // UNITS) for g, (u, mem) in used.items()}
        if any(n[g] > budgets.get(g, 0) for g in n):
            continue
        if any(mean_latency(problem, choice, w) > b * (1 + 1e-12)
               for w, b in problem.options.latency_bound_s.items()):
            continue
        if problem.options.latency_bounds:
            got = percentile_latencies(problem, choice)
            if any(got[w] > b * (1 + 1e-9) for w, (_, b) in problem.options.latency_bounds.items()):
                continue
        key = (math.fsum(prices[g] * k for g, k in n.items()), latency_cost(choice))
        if best is None or key[0] < best[0] * (1 - COST_TOL) or (
                key[0] <= best[0] * (1 + COST_TOL) and key[1] < best[1]):
            best = key
    return best


def check_against_oracle(problem: PlanningProblem) -> None:
    cands = generate_candidates(problem, prune=False).by_llm
    want = oracle(problem, cands)
    plan = solve_min_cost(problem)
    if want is None:
        assert plan.status == "infeasible", plan.stats
        return
    assert plan.status == "optimal", (plan.status, plan.infeasible)
    cost = plan.stats["cost_per_hour"]
    assert cost == pytest.approx(want[0], rel=COST_TOL)
    assert cost == pytest.approx(cost_per_hour(plan.candidates, gpu_prices(problem)), rel=COST_TOL)
    assert latency_cost(plan.candidates) == pytest.approx(want[1], rel=LAT_TOL)
    for w, b in problem.options.latency_bound_s.items():  # the predictor agrees
        assert workflow_latencies(problem, plan)[w] <= b * (1 + 1e-9)


# -- the oracle ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_equals_brute_force_on_one_gpu_type(roofline: RooflineModel, seed: int) -> None:
    problem = tiny(roofline, seed, pools((A100, 4, 2.0)))
    check_against_oracle(problem)
    free = solve_min_cost(problem)
    assert free.feasible
    for frac in (0.97, 0.8):  # bounds between the cheapest plan's latency and the floor
        w = next(iter(problem.targets))
        bound = workflow_latencies(problem, free)[w] * frac
        check_against_oracle(with_bounds(problem, latency_bound_s={w: bound}))


@pytest.mark.parametrize("seed", range(6))
def test_equals_brute_force_on_two_gpu_types(roofline: RooflineModel, seed: int) -> None:
    cluster = pools((A100, 2, 1.5), (H100, 2, 3.0))
    problem = tiny(roofline, seed, cluster, load=0.3)
    check_against_oracle(problem)
    free = solve_min_cost(problem)
    w = next(iter(problem.targets))
    check_against_oracle(with_bounds(
        problem, latency_bound_s={w: workflow_latencies(problem, free)[w] * 0.9}))


def test_three_llms_two_workflows_with_shared_llm(roofline: RooflineModel) -> None:
    for seed in (3, 5):
        problem = random_problem(3, 4, roofline, seed=seed, workflows=2, load=0.3,
                                 cluster=pools((A100, 4, 1.0)), options=OPTS)
        free = solve_min_cost(problem)
        lat = workflow_latencies(problem, free)
        check_against_oracle(with_bounds(problem, latency_bound_s={
            w: v * 0.9 for w, v in lat.items()}))


def test_pruning_keeps_an_optimum(roofline: RooflineModel) -> None:
    problem = tiny(roofline, 1, pools((A100, 4, 2.0)))
    every = generate_candidates(problem, prune=False).by_llm
    kept = prune_for_cost(problem, every)
    assert all(set(kept[m]) <= set(every[m]) for m in every)
    assert sum(map(len, kept.values())) < sum(map(len, every.values()))
    assert oracle(problem, kept) == oracle(problem, every)


# -- properties ---------------------------------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 50), a=st.floats(0.5, 1.5), b=st.floats(0.5, 1.5))
def test_a_looser_bound_never_costs_more(roofline: RooflineModel, seed: int, a: float,
                                         b: float) -> None:
    problem = tiny(roofline, seed, pools((A100, 4, 2.0), (H100, 2, 3.5)), load=0.3)
    base = solve_min_cost(problem)
    if not base.feasible:
        return
    w = next(iter(problem.targets))
    lat = workflow_latencies(problem, base)[w]
    tight, loose = sorted((a * lat, b * lat))
    p_tight = solve_min_cost(with_bounds(problem, latency_bound_s={w: tight}))
    p_loose = solve_min_cost(with_bounds(problem, latency_bound_s={w: loose}))
    assert p_loose.status in ("optimal", "infeasible") and p_tight.status in ("optimal",
                                                                              "infeasible")
    if p_tight.feasible:
        assert p_loose.feasible
        assert p_loose.stats["cost_per_hour"] <= p_tight.stats["cost_per_hour"] * (1 + COST_TOL)
    assert base.stats["cost_per_hour"] <= (p_loose.stats["cost_per_hour"] * (1 + COST_TOL)
                                           if p_loose.feasible else math.inf)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 50), price=st.floats(0.1, 4.0))
def test_another_gpu_type_never_raises_the_cost(roofline: RooflineModel, seed: int,
                                                price: float) -> None:
    one = tiny(roofline, seed, pools((A100, 3, 2.0)), load=0.4)
    two = dataclasses.replace(one, cluster=pools((A100, 3, 2.0), (H100, 2, price)))
    p1, p2 = solve_min_cost(one), solve_min_cost(two)
    if p1.feasible:
        assert p2.feasible
        assert p2.stats["cost_per_hour"] <= p1.stats["cost_per_hour"] * (1 + COST_TOL)
        if p2.stats["cost_per_hour"] < p1.stats["cost_per_hour"] * (1 - COST_TOL):
            assert p2.stats["gpus_used"][H100] > 0  # only the new type can make it cheaper


def test_mean_rows_are_the_predicted_mean(roofline: RooflineModel) -> None:
    problem = tiny(roofline, 2, pools((A100, 4, 2.0)), latency_bound_s={"wf00": 100.0})
    plan = solve_min_cost(problem)
    (coeffs, rhs), = slo_rows(problem, plan.candidates and {m: (c,) for m, c in
                                                              plan.candidates.items()})
    got = math.fsum(coeffs.values()) + problem.stats["wf00"].tool_critical_s
    assert got == pytest.approx(workflow_latencies(problem, plan)["wf00"], rel=1e-9)
    assert rhs == pytest.approx(100.0 - problem.stats["wf00"].tool_critical_s)


# -- open pools ---------------------------------------------------------------------------------


def open_cluster(gpu: str, price: float, max_nodes: int | None = None) -> Cluster:
    return Cluster("open", (GPUPool(gpu, max_nodes or 0, 1, price, True),))


@pytest.mark.parametrize("seed", range(4))
def test_open_pool_buys_the_fewest_gpus(roofline: RooflineModel, seed: int) -> None:
    fixed = tiny(roofline, seed, pools((A100, 4, 2.0)), load=0.5)
    free = solve_min_cost(fixed)
    assert free.feasible
    w = next(iter(fixed.targets))
    bound = workflow_latencies(fixed, free)[w] * 0.85
    opened = dataclasses.replace(with_bounds(fixed, latency_bound_s={w: bound}),
                                 cluster=open_cluster(A100, 2.0))
    plan = solve_min_cost(opened)
    fewest = None
    for n in range(1, 13):  # brute force over counts: the first closed cluster that works
        closed = dataclasses.replace(opened, cluster=pools((A100, n, 2.0)))
        if oracle(closed, generate_candidates(closed, prune=False).by_llm) is not None:
            fewest = n
            break
    if fewest is None:
        assert plan.status == "infeasible"
        return
    assert plan.status == "optimal", plan.infeasible
    assert plan.stats["gpus_used"] == {A100: fewest}
    assert plan.stats["nodes_to_buy"] == {A100: fewest}
    assert plan.stats["cost_per_hour"] == pytest.approx(2.0 * fewest, rel=COST_TOL)
    capped = solve_min_cost(dataclasses.replace(opened, cluster=open_cluster(A100, 2.0, fewest)))
    assert capped.stats["gpus_used"] == {A100: fewest}
    if fewest > 1:
        short = solve_min_cost(dataclasses.replace(opened,
                                                   cluster=open_cluster(A100, 2.0, fewest - 1)))
        assert short.status == "infeasible"


def test_open_pool_that_no_count_satisfies_is_infeasible(roofline: RooflineModel) -> None:
    problem = tiny(roofline, 0, pools((A100, 4, 2.0)), latency_bound_s={"wf00": 1e-3})
    opened = dataclasses.replace(problem, cluster=open_cluster(A100, 2.0))
    plan = solve_min_cost(opened)
    assert plan.status == "infeasible" and plan.infeasible.reason == "latency"
    assert "at any number of GPUs" in plan.infeasible.detail
    assert latency_floors(opened)["wf00"] > 1e-3


def test_unbounded_open_pool_needs_min_cost_and_a_price(roofline: RooflineModel) -> None:
    problem = dataclasses.replace(tiny(roofline, 0, pools((A100, 4, 2.0))),
                                  cluster=open_cluster(A100, 2.0))
    with pytest.raises(InputError, match="min-cost"):
        dataclasses.replace(problem, options=PlanOptions())
    with pytest.raises(InputError, match="price > 0"):
        solve_min_cost(dataclasses.replace(problem, cluster=open_cluster(A100, 0.0)))


def test_sized_cluster_closes_open_pools() -> None:
    cl = Cluster("c", (GPUPool(A100, 1, 8), GPUPool(A100, 0, 8, 2.0, True),
                       GPUPool(H100, 2, 8, None, True)))
    got = sized_cluster(cl, {A100: 13, H100: 0})
    assert got.pools == (GPUPool(A100, 1, 8), GPUPool(A100, 1, 8, 2.0))
    assert nodes_to_buy(cl, {A100: 13, H100: 0}) == {A100: 1, H100: 0}
    assert nodes_to_buy(cl, {A100: 8, H100: 17}) == {A100: 0, H100: 2}  # at most max_nodes


# -- statuses -----------------------------------------------------------------------------------


def test_an_impossible_bound_is_infeasible_for_latency(roofline: RooflineModel) -> None:
    problem = tiny(roofline, 1, pools((A100, 4, 2.0)), latency_bound_s={"wf00": 1e-3})
    plan = solve_min_cost(problem)
    assert plan.status == "infeasible" and plan.allocation is None
    assert plan.infeasible.reason == "latency"
    assert "fastest candidate" in plan.infeasible.detail


def test_too_few_gpus_is_infeasible_for_gpus(roofline: RooflineModel) -> None:
    problem = tiny(roofline, 1, pools((A100, 4, 2.0)), load=0.4)
    small = dataclasses.replace(problem.scaled(20.0), cluster=pools((A100, 4, 2.0)))
    plan = solve_min_cost(small)
    assert plan.status == "infeasible" and plan.infeasible.reason == "gpus"
    assert 0 < plan.infeasible.max_scale < 1


def test_the_time_limit_is_honoured(roofline: RooflineModel) -> None:
    problem = random_problem(8, 64, roofline, seed=0, options=dataclasses.replace(
        OPTS, time_limit_s=0.01))
    t0 = time.perf_counter()
    plan = solve_min_cost(problem)
    assert time.perf_counter() - t0 < 2.0
    assert plan.status in ("time_limit_no_solution", "time_limit")
    if plan.status == "time_limit_no_solution":
        assert plan.allocation is None


def test_the_milp_optimiser_dispatches(roofline: RooflineModel) -> None:
    problem = tiny(roofline, 4, pools((A100, 2, 1.0), (H100, 2, 2.0)), load=0.3)
    a, b = optimiser("milp").solve(problem), solve_min_cost(problem)
    assert a.candidates == b.candidates and a.stats["cost_per_hour"] == b.stats["cost_per_hour"]
    with pytest.raises(InputError, match="objective"):  # the min-latency MILP alone refuses it
        MILPOptimiser().solve(problem)


@pytest.fixture(scope="module")
def rag(roofline: RooflineModel) -> PlanningProblem:
    """The RAG workflow (a trace of 120 requests: real per-request paths) on 3 A100s."""
    spec = load_workflow("datasets/workflows/rag.yaml")
    stats = {spec.name: workflow_stats(validate_calls(generate_trace(spec, 120, seed=0)),
                                       spec.name)}
    return PlanningProblem(stats, dict(spec.llms), {spec.name: 2.0}, pools((A100, 3, 2.0)),
                           roofline, dataclasses.replace(OPTS, tps=(1,)))


def test_percentile_bounds_hold_and_match_brute_force(rag: PlanningProblem) -> None:
    problem, spec = rag, load_workflow("datasets/workflows/rag.yaml")
    free = solve_min_cost(problem)
    assert free.feasible
    p90 = percentile_latencies(with_bounds(problem, latency_bounds={spec.name: (90.0, 1e3)}),
                               free.candidates)[spec.name]
    bounded = with_bounds(problem, latency_bounds={spec.name: (90.0, 0.9 * p90)})
    plan = solve_min_cost(bounded)
    want = oracle(bounded, generate_candidates(bounded, prune=False).by_llm)
    if want is None:
        assert plan.status == "infeasible" and plan.infeasible.reason == "latency"
        return
    assert plan.status == "optimal" and plan.stats["latency_bounds_verified"]
    assert plan.stats["cost_per_hour"] == pytest.approx(want[0], rel=COST_TOL)
    assert latency_cost(plan.candidates) == pytest.approx(want[1], rel=LAT_TOL)


# -- prices and files ---------------------------------------------------------------------------


def test_prices_come_from_the_pool_then_the_catalog(roofline: RooflineModel) -> None:
    problem = tiny(roofline, 0, pools((A100, 2, None), (H100, 2, 9.0)))
    assert gpu_prices(problem) == {A100: default_catalog().price(A100), H100: 9.0}
    gb = dataclasses.replace(problem, cluster=Cluster("g", (GPUPool("GB200", 1, 4),)))
    with pytest.raises(InputError, match="price_per_hour"):
        gpu_prices(gb)


def test_catalog_prices_parse_and_round_trip() -> None:
    cat = default_catalog()
    assert cat.price("h100-80gb") == 3.78 and cat.price("GB200") is None
    text = ("gpus:\n  X:\n    memory_gib: 24\n    bf16_tflops: 100\n    hbm_gbps: 900\n"
            "    nvlink_domain: 1\n    interconnect_gbps: 64\n    price_per_hour: 0.5\n")
    mine = parse_catalog(text, "mine.yaml", base=cat)
    assert mine.price("x") == 0.5 and mine.price(A100) == cat.price(A100)
    no_price = parse_catalog(text.replace("    price_per_hour: 0.5\n", "").replace("X:", "H100-80GB:"),
                             "mine.yaml", base=cat)
    assert no_price.price(H100) is None  # an entry is replaced whole
    with pytest.raises(InputError, match=r"gpus\.X\.price_per_hour"):
        parse_catalog(text.replace("0.5", "-1"), "mine.yaml")


def test_cluster_files_with_prices_and_open_pools() -> None:
    doc = {"name": "c", "pools": [
        {"gpu": A100, "nodes": 2, "gpus_per_node": 8},
        {"gpu": H100, "nodes": "auto", "max_nodes": 3, "gpus_per_node": 8, "price_per_hour": 3},
        {"gpu": "L4", "nodes": "auto", "gpus_per_node": 1}]}
    cl = parse_cluster(doc, "c.yaml")
    assert cl.pools == (GPUPool(A100, 2, 8), GPUPool(H100, 3, 8, 3.0, True),
                        GPUPool("L4", 0, 1, None, True))
    assert cl.unbounded == ("L4",) and cl.budgets() == {A100: 16, H100: 24, "L4": 0}
    assert parse_cluster(cluster_to_dict(cl), "back") == cl
    plain = {"name": "p", "pools": [{"gpu": A100, "nodes": 2, "gpus_per_node": 8}]}
    assert cluster_to_dict(parse_cluster(plain, "p")) == plain  # unchanged for old files
    bad = [({"max_nodes": 2}, r"pools\[0\]\.max_nodes"),
           ({"price_per_hour": -1.0}, "price_per_hour"),
           ({"nodes": "some"}, r"pools\[0\]\.nodes")]
    for change, match in bad:
        with pytest.raises(InputError, match=match):
            parse_cluster({"name": "b", "pools": [dict(plain["pools"][0], **change)]}, "b.yaml")
    two = {"name": "t", "pools": [dict(plain["pools"][0], price_per_hour=1.0),
                                  dict(plain["pools"][0], price_per_hour=2.0)]}
    with pytest.raises(InputError, match="share one price"):
        parse_cluster(two, "t.yaml")


def test_gpus_used_counts_compute_and_memory() -> None:
    c = Candidate("m", A100, 1, 0.5, 3, 1500, 1.0, 0.1, 0.1, 0.0, memory_share=0.8)
    assert c.mem_units == 2400
    assert gpus_used({"m": c}) == {A100: 3}


def test_every_pruned_candidate_has_a_kept_dominator(roofline: RooflineModel) -> None:
    problem = random_problem(3, 4, roofline, seed=2, workflows=2, load=0.3,
                             cluster=pools((A100, 4, 1.0)), options=OPTS)
    assert any(sum(m in problem.stats[w].llms for w in problem.targets) > 1
               for m in problem.llms)  # an LLM shared by both workflows
    problem = with_bounds(problem, latency_bound_s=dict.fromkeys(problem.targets, 100.0))
    every = generate_candidates(problem, prune=False).by_llm
    kept = prune_for_cost(problem, every)

    def key(c: Candidate) -> tuple[float, ...]:
        return (c.units, c.mem_units, c.cost,
                *(dict(c.workflow_latency_s).get(w, 0.0) for w in sorted(problem.targets)))

    for m in every:
        for c in every[m]:
            assert any(k.gpu == c.gpu and all(a <= b for a, b in zip(key(k), key(c), strict=True))
                       for k in kept[m])
        assert len({key(k) for k in kept[m]}) == len(kept[m])  # no duplicate survives


def test_latency_floors_bound_every_plan(roofline: RooflineModel) -> None:
    for seed in range(4):
        problem = tiny(roofline, seed, pools((A100, 4, 2.0), (H100, 2, 3.0)), load=0.3)
        floors = latency_floors(problem)
        for c in itertools.product(*generate_candidates(problem).by_llm.values()):
            choice = {x.llm: x for x in c}
            for w in problem.targets:
                assert mean_latency(problem, choice, w) >= floors[w] * (1 - 1e-12)


def test_an_unreachable_percentile_bound_with_open_pools(rag: PlanningProblem) -> None:
    opened = dataclasses.replace(with_bounds(rag, latency_bounds={"rag": (90.0, 0.05)}),
                                 cluster=open_cluster(A100, 2.0))
    plan = solve_min_cost(opened)
    assert plan.status == "infeasible" and plan.infeasible.reason == "latency"
    assert "p90 latency is at least" in plan.infeasible.detail
    assert plan.stats["latency_bounds_proven_infeasible"]


@pytest.mark.parametrize("seed", range(3))
def test_two_open_types_buy_the_cheapest_mix(roofline: RooflineModel, seed: int) -> None:
    fixed = tiny(roofline, seed, pools((A100, 3, 1.5), (H100, 3, 2.5)), load=0.4)
    w = next(iter(fixed.targets))
    bound = workflow_latencies(fixed, solve_min_cost(fixed))[w] * 0.9
    bounded = with_bounds(fixed, latency_bound_s={w: bound})
    opened = dataclasses.replace(bounded, cluster=Cluster("open", (
        GPUPool(A100, 0, 1, 1.5, True), GPUPool(H100, 0, 1, 2.5, True))))
    plan = solve_min_cost(opened)
    best = None  # brute force over the counts of both types
    for na, nh in itertools.product(range(7), repeat=2):
        if na + nh == 0:
            continue
        spec = [(g, n, p) for g, n, p in ((A100, na, 1.5), (H100, nh, 2.5)) if n]
        closed = dataclasses.replace(bounded, cluster=pools(*spec))
        if oracle(closed, generate_candidates(closed, prune=False).by_llm) is not None:
            cost = 1.5 * na + 2.5 * nh
            best = cost if best is None else min(best, cost)
    if best is None:
        assert plan.status == "infeasible"
        return
    assert plan.status == "optimal"
    assert plan.stats["cost_per_hour"] == pytest.approx(best, rel=COST_TOL)
    used = plan.stats["gpus_used"]
    assert 1.5 * used[A100] + 2.5 * used[H100] == pytest.approx(best, rel=COST_TOL)


@pytest.mark.parametrize("seed", range(3))
def test_equals_brute_force_with_memory_as_a_second_resource(roofline: RooflineModel,
                                                             seed: int) -> None:
    problem = tiny(roofline, seed, pools((A100, 3, 2.0)), memory_shares=(0.3, 0.6, 1.0))
    cands = generate_candidates(problem, prune=False).by_llm
    assert any(c.mem_units != c.units for v in cands.values() for c in v)
    check_against_oracle(problem)
    free = solve_min_cost(problem)
    w = next(iter(problem.targets))
    check_against_oracle(with_bounds(
        problem, latency_bound_s={w: workflow_latencies(problem, free)[w] * 0.9}))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), pa=st.sampled_from([0.0, 0.8, 1.5, 2.5]),
       ph=st.sampled_from([1.0, 2.5, 4.0]), frac=st.sampled_from([None, 0.95, 0.85, 0.7]))
def test_random_tiny_instances_equal_brute_force(roofline: RooflineModel, seed: int, pa: float,
                                                 ph: float, frac: float | None) -> None:
    problem = tiny(roofline, seed % 50, pools((A100, 2, pa), (H100, 2, ph)), load=0.3)
    if frac is not None:
        free = solve_min_cost(problem)
        if not free.feasible:
            return
        w = next(iter(problem.targets))
        problem = with_bounds(problem,
                              latency_bound_s={w: workflow_latencies(problem, free)[w] * frac})
    check_against_oracle(problem)


def test_price_flags_override_the_pools() -> None:
    cl = Cluster("c", (GPUPool(A100, 1, 8, 9.0), GPUPool(H100, 1, 8)))
    got = with_prices(cl, {"a100-80gb": 1.25})
    assert got.pools == (GPUPool(A100, 1, 8, 1.25), GPUPool(H100, 1, 8))
    with pytest.raises(InputError, match="a GPU type of the cluster"):
        with_prices(cl, {"L4": 1.0})
    with pytest.raises(InputError, match="price per GPU-hour of 0"):
        with_prices(cl, {A100: -1.0})


# -- placed min-cost plans (scepsy_place.formulations.loop.plan_and_place) ------------------------------------


def placed_cost_oracle(problem: PlanningProblem) -> float | None:
    """The least price of a *placed* plan: over every combination of unpruned candidates that
    meets the mean bounds, the fewest GPUs of each type it places on (exact placement on the
    first k GPUs of the type, k = 1, 2, ...), priced; None when none places."""
    from scepsy_place.packing.exhaustive import placeable
    from scepsy_place.packing.placement import demands
    from scepsy_place.packing.topology import Topology, from_cluster

    prices = gpu_prices(problem)
    top = from_cluster(problem.cluster)
    cands = generate_candidates(problem, prune=False).by_llm
    llms = sorted(cands)
    best: float | None = None
    for combo in itertools.product(*(cands[m] for m in llms)):
        choice = dict(zip(llms, combo, strict=True))
        if any(mean_latency(problem, choice, w) > b * (1 + 1e-12)
               for w, b in problem.options.latency_bound_s.items()):
            continue
        cost = 0.0
        for g in sorted({c.gpu for c in combo}):
            dem = demands(Allocation({m: c.instance for m, c in choice.items() if c.gpu == g}))
            nodes = [n for n in top.nodes if n.gpu == g]
            k = next((k for k in range(1, len(nodes) + 1)
                      if placeable(Topology("k", tuple(nodes[:k])), dem)), None)
            if k is None:
                cost = math.inf
                break
            cost += prices[g] * k
        if math.isfinite(cost) and (best is None or cost < best):
            best = cost
    return best


@pytest.mark.parametrize("seed", range(6))
def test_placed_min_cost_against_the_placed_oracle(roofline: RooflineModel, seed: int) -> None:
    from scepsy_place.formulations.loop import plan_and_place
    from scepsy_place.packing.check import violations
    from scepsy_place.packing.placement import demands
    from scepsy_place.packing.topology import from_cluster

    problem = tiny(roofline, seed, pools((A100, 3, 1.0)), n_llms=2, load=0.4)
    want = placed_cost_oracle(problem)
    top = from_cluster(problem.cluster)
    res = plan_and_place(problem, top)
    if want is None:
        assert not res.placed
        return
    assert res.placed, res.reason
    assert violations(top, demands(res.plan.allocation), res.placement) == []
    st = res.plan.stats
    gpus = len({(s.node, g) for s in res.placement.slots for g in s.gpus})
    assert st["placed_cost_per_hour"] == pytest.approx(1.0 * gpus, rel=COST_TIE)
    assert st["cost_bound_per_hour"] <= want * (1 + COST_TOL)  # a valid bound
    assert st["placed_cost_per_hour"] >= want * (1 - COST_TOL)  # never below the optimum
    if res.plan.status == "optimal":
        assert st["placed_cost_per_hour"] == pytest.approx(want, rel=COST_TOL)


@pytest.mark.parametrize("max_nodes", [0, 3])
def test_open_pools_buy_the_nodes_the_placement_uses(roofline: RooflineModel,
                                                     max_nodes: int) -> None:
    from scepsy_place.formulations.loop import plan_and_place, plan_document
    from scepsy_place.packing.topology import from_cluster
    from scepsy_serve.launch.planfile import parse_plan

    fixed = Cluster("buy", (GPUPool(A100, 2, 2, 1.0),))
    problem = random_problem(2, 4, roofline, seed=1, workflows=1, load=0.4, cluster=fixed,
                             options=OPTS)
    problem = dataclasses.replace(problem, cluster=Cluster(
        "buy", (GPUPool(A100, max_nodes, 2, 1.0, True),)))  # no max_nodes (0): unbounded
    res = plan_and_place(problem, from_cluster(problem.cluster))
    assert res.placed, res.reason
    nodes = {s.node for s in res.placement.slots}
    assert res.plan.stats["nodes_to_buy"] == {A100: len(nodes)}
    doc = plan_document(problem, res, timings=False)
    assert doc["cluster"]["pools"] == [{"gpu": A100, "nodes": len(nodes), "gpus_per_node": 2}]
    parse_plan(doc, "plan.json")  # the launcher reads it (every placed node is in the cluster)
