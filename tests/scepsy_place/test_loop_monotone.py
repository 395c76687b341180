"""Placed plans are monotone in the load, keeping the current allocation is always a candidate,
and max-throughput with placement finds the largest placeable scale.

Oracles: the plan for a higher target, priced at the lower one (``scepsy_opt.planning.candidates.price``,
or ``scepsy predict`` on the CLI), bounds the lower target's plan; the current allocation priced
at the new targets bounds a re-plan; brute force over every (shape, replicas) combination with
the placer as the oracle gives the largest placeable scale of tiny instances.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy.cli import main
from scepsy_opt.allocation import Allocation
from scepsy_opt.cluster import uniform_cluster
from scepsy_opt.planning.candidates import price
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.milp import capacity_shapes
from scepsy_opt.planning.plans import plan_from_choice
from scepsy_opt.planning.problem import PlanOptions
from scepsy_opt.prediction.pipeline import carried_scale, llm_demand, llm_load
from scepsy_place.formulations.loop import SCALE_REL, plan_and_place
from scepsy_place.packing.check import violations
from scepsy_place.packing.placement import demands
from scepsy_place.packing.topology import from_cluster
from scepsy_profile.roofline import roofline_model

REPO = Path(__file__).resolve().parents[2]
RAG_BEAM = str(REPO / "datasets" / "workflows" / "rag-beam.yaml")
A16 = str(REPO / "datasets" / "clusters" / "a100-16.yaml")
ROOF = roofline_model()
REL = 1e-9  # two float paths (the MILP's sum of candidate costs, price() of the allocation)
FAST = settings(derandomize=True, deadline=None, database=None, max_examples=12)


def plan(capsys, out: Path, *argv: str, requests: int = 600) -> dict:
    code = main(["plan", "--workflow", RAG_BEAM, "--cluster", A16, "--out", str(out),
                 "--no-timings", "--trace-requests", str(requests), *argv])
    capsys.readouterr()
    doc = json.loads(out.read_text())
    assert (code == 0) == ("allocation" in doc)
    return doc


def predicted_objective(capsys, allocation: Path, rate: float, requests: int = 600) -> float:
    """``scepsy predict``'s mean workflow latencies of ``allocation`` at ``rate``, summed (the
    plan objective with unit weights and no change penalty)."""
    assert main(["predict", "--workflow", RAG_BEAM, "--allocation", str(allocation), "--rate",
                 str(rate), "--json", "--trace-requests", str(requests)]) == 0
    pred = json.loads(capsys.readouterr().out)
    return math.fsum(w["mean_latency_s"] for w in pred["workflows"].values())


# ----------------------------------------------------------------- the bundled example (CLI)

@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
def test_bundled_example_lower_target_is_never_worse(capsys, tmp_path):
    """The new user's report: --target 2.8 returned 323 s / 33.5 s while the placed 3.0 plan
    predicts 117 s / 10.6 s at 2.8 req/s (600 requests per workflow)."""
    high = plan(capsys, tmp_path / "high.json", "--target", "3.0")
    low = plan(capsys, tmp_path / "low.json", "--target", "2.8")
    assert high["placement"]["placed"] and low["placement"]["placed"]
    bound = predicted_objective(capsys, tmp_path / "high.json", 2.8)
    assert low["solver"]["objective_s"] <= bound * (1 + REL)


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
def test_bundled_example_replanning_never_worse_than_keeping_the_current(capsys, tmp_path):
    high = plan(capsys, tmp_path / "high.json", "--target", "3.0")
    assert high["placement"]["placed"]
    low = plan(capsys, tmp_path / "low.json", "--target", "2.8", "--current",
               str(tmp_path / "high.json"), "--change-penalty", "0.01")
    keep = predicted_objective(capsys, tmp_path / "high.json", 2.8)
    assert low["placement"]["placed"]
    assert low["solver"]["objective_s"] <= keep * (1 + REL)
    assert low["placement"]["compared"]["current"]["status"] in ("placed", "stopped")


def test_current_allocation_off_the_grid_is_kept(capsys, tmp_path):
    """A coarser share grid cannot express the current allocation: keeping it is the better
    plan, and the re-plan says so."""
    first = plan(capsys, tmp_path / "first.json", "--target", "2.8", requests=300)
    assert first["placement"]["placed"]
    again = plan(capsys, tmp_path / "again.json", "--target", "2.8", "--shares", "0.5,1",
                 "--current", str(tmp_path / "first.json"), "--change-penalty", "0.01",
                 requests=300)
    assert again["placement"]["formulation"] == "current"
    assert again["allocation"] == first["allocation"]
    assert again["solver"]["objective_s"] == pytest.approx(first["solver"]["objective_s"],
                                                           rel=REL)
    assert again["placement"]["compared"]["current"]["status"] == "placed"
    assert again["placement"]["placed"] and again["placement"]["instances"]


def test_bundled_example_max_throughput_reaches_every_placed_target(capsys, tmp_path):
    """The report: --target 3.3 places (300 requests per workflow) while max-throughput said
    1.3234 req/s per workflow."""
    placed = plan(capsys, tmp_path / "t.json", "--target", "3.3", requests=300)
    assert placed["placement"]["placed"], placed["placement"]["reason"]
    mt = plan(capsys, tmp_path / "mt.json", "--target", "2", "--objective", "max-throughput",
              requests=300)
    assert mt["placement"]["placed"]
    assert sum(w["throughput"] for w in mt["workflows"].values()) >= 3.3 * (1 - REL)


# ----------------------------------------------------------------- properties, tiny instances

OPTS = PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1, 2))


def tiny(seed: int, gpus: int, per_node: int):
    cl = uniform_cluster("A100-80GB", gpus, per_node)
    return random_problem(3, gpus, ROOF, seed=seed, load=0.6, options=OPTS, cluster=cl), cl


def objective_at(problem, allocation: Allocation) -> float:
    """``allocation``'s objective at ``problem``'s targets (:func:`price`, no change penalty)."""
    return plan_from_choice(problem, "oracle", "evaluated", price(problem, allocation),
                            {}).objective_s


@FAST
@given(seed=st.integers(0, 10_000), shape=st.sampled_from([(3, 3), (4, 2), (4, 4)]),
       low=st.floats(0.4, 1.0), step=st.floats(1.05, 1.6),
       formulation=st.sampled_from(["auto", "aggregate"]))
def test_a_lower_target_is_never_worse_than_a_higher_targets_plan(seed, shape, low, step,
                                                                  formulation):
    p, cl = tiny(seed, *shape)
    topo = from_cluster(cl)
    hi_p, lo_p = p.scaled(low * step), p.scaled(low)
    hi = plan_and_place(hi_p, topo, formulation=formulation)
    if not hi.placed:
        return
    lo = plan_and_place(lo_p, topo, formulation=formulation)
    assert lo.placed, lo.reason  # what carries more load places at less
    assert violations(topo, demands(lo.plan.allocation), lo.placement) == []
    assert lo.plan.objective_s <= objective_at(lo_p, hi.plan.allocation) * (1 + REL)


@FAST
@given(seed=st.integers(0, 10_000), shape=st.sampled_from([(3, 3), (4, 2), (4, 4)]),
       low=st.floats(0.4, 1.0), step=st.floats(1.0, 1.6), penalty=st.sampled_from([0.0, 0.01, 1.0]),
       coarse=st.booleans())
def test_replanning_is_never_worse_than_keeping_the_current_allocation(seed, shape, low, step,
                                                                        penalty, coarse):
    p, cl = tiny(seed, *shape)
    topo = from_cluster(cl)
    first = plan_and_place(p.scaled(low * step), topo, formulation="auto")
    if not first.placed:
        return
    cur = first.plan.allocation
    opts = dataclasses.replace(p.options, current=cur, change_penalty_s=penalty,
                               shares=(0.6, 1.0) if coarse else p.options.shares)
    again = dataclasses.replace(p, options=opts).scaled(low)
    res = plan_and_place(again, topo, formulation="auto")
    assert res.placed, res.reason
    assert res.plan.objective_s <= objective_at(again, cur) * (1 + REL)


def packs(items: list[int], bins: list[int]) -> bool:
    """Exhaustive search: do the items (units) fit into the bins (free units)?"""
    if not items:
        return True
    first, rest = items[0], items[1:]
    tried = set()
    for i, free in enumerate(bins):
        if free >= first and free not in tried:  # equal bins are interchangeable
            tried.add(free)
            if packs(rest, [*bins[:i], free - first, *bins[i + 1:]]):
                return True
    return False


def largest_placeable_scale(problem, gpus: int) -> float:
    """Brute force: every combination of (shape, replicas) per LLM within the budget whose
    replicas (TP 1) pack onto the GPUs; the largest scale of the targets one of them carries."""
    u = problem.options.max_utilisation
    budget = problem.cluster.total_gpus * 1000
    options = {}
    for m, shapes in capacity_shapes(problem).items():
        load = llm_load(llm_demand(problem.stats, problem.models, problem.targets, m))
        options[m] = [(sh, r, carried_scale(load, sh[4], r, u)) for sh in shapes
                      for r in range(1, budget // sh[3] + 1)]
    best = 0.0
    llms = sorted(options)
    for combo in itertools.product(*(options[m] for m in llms)):
        scale = min(x[2] for x in combo)
        if scale <= best or sum(sh[3] * r for sh, r, _ in combo) > budget:
            continue
        items = sorted((sh[3] for sh, r, _ in combo for _ in range(r)), reverse=True)
        if packs(items, [1000] * gpus):
            best = scale
    return best


@pytest.mark.parametrize(("seed", "gpus"), [(0, 3), (5, 3), (11, 4)])
def test_max_throughput_finds_the_largest_placeable_scale(seed, gpus):
    cl = uniform_cluster("A100-80GB", gpus, gpus)
    p = random_problem(2, gpus, ROOF, seed=seed, load=0.6, cluster=cl,
                       options=PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1,),
                                           objective="max-throughput"))
    topo = from_cluster(cl)
    res = plan_and_place(p, topo, formulation="aggregate")
    oracle = largest_placeable_scale(p, gpus)
    assert res.placed
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    assert res.plan.scale <= oracle * (1 + REL)
    assert res.plan.scale >= oracle * (1 - 2 * SCALE_REL)
