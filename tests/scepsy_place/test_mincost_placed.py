"""Min-cost, placed: the price of the GPUs a placed plan uses, against brute force over every
candidate combination and GPU count (exact placement), and open pools that only the nodes
they may buy bound (their candidates used to see a budget of 0 GPUs: "infeasible")."""

from __future__ import annotations

import itertools
import math

import pytest

from scepsy_opt.cluster import Cluster, GPUPool
from scepsy_opt.planning.candidates import generate_candidates
from scepsy_opt.planning.instances import many_models_problem, random_problem
from scepsy_opt.planning.mincost import cost_lower_bound
from scepsy_opt.planning.plans import plan_from_choice
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.ratework import models as rate_models
from scepsy_opt.ratework import parse_rate_workload, rate_stats, rates
from scepsy_place.formulations.loop import by_scale_applies, plan_and_place
from scepsy_place.packing.check import violations
from scepsy_place.packing.exhaustive import placeable
from scepsy_place.packing.placement import demands
from scepsy_place.packing.topology import from_cluster
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
A100 = "A100-80GB"
PRICE = 2.0


def _cheapest_placed(p: PlanningProblem, gpus: int) -> float | None:
    """The least price of any allocation of (unpruned) candidates that some placement on ``k``
    of the node's GPUs realises, over ``k = 1..gpus`` (brute force, exact placement)."""
    cands = generate_candidates(p, prune=False).by_llm
    llms = sorted(cands)
    best: int | None = None
    for combo in itertools.product(*(cands[m] for m in llms)):
        units = sum(c.units for c in combo)
        least = max(1, math.ceil(units / 1000 - 1e-9))
        if best is not None and least >= best:
            continue
        plan = plan_from_choice(p, "oracle", "optimal", dict(zip(llms, combo, strict=True)), {})
        ds = demands(plan.allocation)
        for k in range(least, (best or gpus + 1)):
            topo = from_cluster(Cluster("k", (GPUPool(A100, 1, k),)))
            if placeable(topo, ds):
                best = k
                break
    return None if best is None else best * PRICE


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5, 8])
def test_placed_min_cost_is_the_cheapest_placeable_price(seed):
    """One node of 3 GPUs, TP 1: the price of the GPUs the placed plan uses is the least of any
    placeable allocation of the grid (slot groups describe every packing of TP-1 replicas, so
    their optimum is the placeable optimum here)."""
    cl = Cluster("one", (GPUPool(A100, 1, 3, PRICE),))
    opts = PlanOptions(shares=(0.3, 0.5, 0.6, 1.0), tps=(1,), objective="min-cost",
                       time_limit_s=60)
    p = random_problem(2, 3, ROOF, seed=seed, load=0.6, options=opts, cluster=cl)
    oracle = _cheapest_placed(p, 3)
    res = plan_and_place(p, from_cluster(cl))
    if oracle is None:
        assert not res.placed
        return
    assert res.placed
    assert violations(from_cluster(cl), demands(res.plan.allocation), res.placement) == []
    assert res.plan.stats["placed_cost_per_hour"] == pytest.approx(oracle, rel=1e-9)
    assert res.plan.stats["cost_bound_per_hour"] <= oracle * (1 + 1e-9)


def _one_llm(model: str, rate: float) -> PlanningProblem:
    wl = parse_rate_workload({"kind": "rates", "name": "one", "llms": {"chat": {
        "model": model, "rate": rate,
        "input": {"kind": "lognormal", "mean": 300, "cv": 1.0, "min": 4, "max": 1536},
        "output": {"kind": "exponential", "mean": 180, "min": 1, "max": 512}}}})
    cl = Cluster("buy", (GPUPool(A100, 0, 8, None, True),
                         GPUPool("H100-80GB", 0, 8, None, True)))
    return PlanningProblem(rate_stats(wl, 300, seed=0), rate_models(wl), rates(wl), cl, ROOF,
                           PlanOptions(objective="min-cost", time_limit_s=30))


@pytest.mark.parametrize(("model", "rate"), [("llama-3-8b", 16.0), ("qwen2.5-14b", 4.0)])
def test_open_pools_give_the_co_locating_formulations_the_nodes_they_may_buy(model, rate):
    """Patterns and slot groups price candidates within the nodes an open pool may buy; both
    place (patterns called such a problem infeasible), and the answer meets the proven bound."""
    p = _one_llm(model, rate)
    res = plan_and_place(p, from_cluster(p.cluster))
    assert res.placed
    assert res.compared["patterns"].status == "placed"
    assert res.compared["slots"].status == "placed"
    stats = res.plan.stats
    assert stats["placed_cost_per_hour"] <= stats["cost_bound_per_hour"] * 1.02
    assert res.plan.status == ("optimal" if stats["placed_cost_gap"] <= 1e-9 else "heuristic")


# ------------------------------------------------------------------ many LLMs: fewer nodes


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5, 8])
def test_the_relaxations_price_bounds_the_cheapest_placeable_price(seed):
    """cost_lower_bound is at most the brute-force least price of any placeable allocation
    (the oracle above) and at least what the cheapest candidate of each LLM alone holds in
    GPU units (a plan pays for at least the units it holds), to 1e-9."""
    cl = Cluster("one", (GPUPool(A100, 1, 3, PRICE),))
    opts = PlanOptions(shares=(0.3, 0.5, 0.6, 1.0), tps=(1,), objective="min-cost",
                       time_limit_s=60)
    p = random_problem(2, 3, ROOF, seed=seed, load=0.6, options=opts, cluster=cl)
    bound, used = cost_lower_bound(p)
    oracle = _cheapest_placed(p, 3)
    if oracle is None:
        return
    assert bound <= oracle * (1 + 1e-9)
    least = sum(min(c.units for c in v) for v in generate_candidates(p, prune=False)
                .by_llm.values()) / 1000 * PRICE
    assert bound >= least * (1 - 1e-9)
    assert used[A100] * PRICE == pytest.approx(bound, rel=1e-9)  # one type: the units it holds


def test_a_cluster_too_small_for_the_targets_has_no_finite_price_bound():
    """No split of the LLMs over the types fits the GPUs: the bound is infinite, as no
    allocation carries the targets."""
    cl = Cluster("one", (GPUPool(A100, 1, 1, PRICE),))
    p = random_problem(3, 1, ROOF, seed=0, load=3.0, cluster=cl,
                       options=PlanOptions(objective="min-cost"))
    assert cost_lower_bound(p) == (math.inf, {})


def test_many_llms_get_a_placed_min_cost_plan_on_fewer_nodes_with_a_proven_gap():
    """One Zipf popularity over 64 LLMs on 128 GPUs of two types at 0.9 of its rates: the
    search on fewer nodes places a plan (its placement valid on the cluster), its price at
    least the relaxation's bound and its gap the price over that bound; the plan carries the
    targets (a finite predicted latency: no LLM saturated)."""
    p = many_models_problem(64, 128, ROOF, seed=0, copies=False,
                            options=PlanOptions(objective="min-cost", time_limit_s=40)
                            ).scaled(0.9)
    top = from_cluster(p.cluster)
    assert by_scale_applies(p, top)
    res = plan_and_place(p, top)
    assert res.placed and "slots-scale" in res.compared
    assert violations(top, demands(res.plan.allocation), res.placement) == []
    s = res.plan.stats
    bound = cost_lower_bound(p)[0]
    assert s["cost_bound_per_hour"] >= bound * (1 - 1e-9)
    assert s["placed_cost_per_hour"] >= s["cost_bound_per_hour"] * (1 - 1e-9)
    assert s["placed_cost_gap"] == pytest.approx(
        s["placed_cost_per_hour"] / s["cost_bound_per_hour"] - 1, rel=1e-9, abs=1e-12)
    assert math.isfinite(res.plan.objective_s)
