"""Compute and memory as two resources per GPU: the serving curve takes a memory share of its
own, candidates cross every compute share with a memory grid, and every optimiser keeps both
budgets. Tied mode (no memory grid) is the old model, bit for bit."""

from __future__ import annotations

import dataclasses
import json
import math
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.units import UNITS, gpu_units, replicas_per_gpu
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.cluster import Cluster, GPUPool, uniform_cluster
from scepsy_opt.planning.baselines import BruteForce, capacity_scale
from scepsy_opt.planning.candidates import (
    fits_budget,
    generate_candidates,
    mem_units_by_gpu,
    price,
    shape_curves,
    units_by_gpu,
)
from scepsy_opt.planning.instances import random_problem, random_stats
from scepsy_opt.planning.milp import (
    _prices,
    capacity_shapes,
    max_scale,
    reduced_candidates,
    solve_min_latency,
)
from scepsy_opt.planning.optimisers import OPTIMISERS, optimiser
from scepsy_opt.planning.planfile import dumps, plan_to_dict
from scepsy_opt.planning.problem import TENTHS, Deadline, PlanningProblem, PlanOptions
from scepsy_place.formulations.blocks import capacity_rows
from scepsy_place.formulations.cuts import free_capacity_rows, packing_inequalities
from scepsy_place.packing.topology import from_cluster
from scepsy_profile.catalog import default_catalog
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import serving_curve, serving_curves

ROOF = roofline_model()
GPU = "A100-80GB"
REL = 1e-9  # objectives compared within this relative tolerance
FAST = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
optimiser("milp")  # fills the registry


def independent(p: PlanningProblem, grid: tuple[float, ...] = TENTHS) -> PlanningProblem:
    """``p`` with memory planned on ``grid``."""
    return dataclasses.replace(p, options=dataclasses.replace(p.options, memory_shares=grid))


def _agree(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b), 1.0)


@cache
def mix(gpus: int, big_rate: float = 0.05) -> PlanningProblem:
    """A 65B model at low load, a 7B model at high load and a reranker, on A100-80GB GPUs."""
    stats, _ = random_stats(3, 3, 7)
    models = {"llm000": "llama-65b", "llm001": "qwen2.5-7b", "llm002": "bge-reranker-large"}
    targets = {"wf00": big_rate, "wf01": 4.0, "wf02": 8.0}
    return PlanningProblem(stats, models, targets, uniform_cluster(GPU, gpus, min(gpus, 8)),
                           ROOF, PlanOptions())


# --------------------------------------------------------------------------- serving curves


def test_tied_curves_are_the_curves_at_memory_equal_to_share():
    """``memory_shares=None`` and ``memory_shares=shares`` give the same curves, bit for bit."""
    shares = list(TENTHS)
    a = serving_curves(ROOF, "llama-3-8b", GPU, 1, shares, 900.0, 150.0)
    b = serving_curves(ROOF, "llama-3-8b", GPU, 1, shares, 900.0, 150.0, memory_shares=shares)
    for x, y in zip(a, b, strict=True):
        assert x.memory_share == x.share == y.memory_share
        assert (x.mu, x.max_batch, x.memory) == (y.mu, y.max_batch, y.memory)
        assert np.array_equal(x.service_ms, y.service_ms)


@given(share=st.sampled_from(TENTHS), lo=st.sampled_from(TENTHS), hi=st.sampled_from(TENTHS))
@FAST
def test_more_memory_never_lowers_the_batch_limit_or_the_throughput(share, lo, hi):
    """Memory sets the KV cache, so the batch limit and μ; compute alone sets the speed."""
    lo, hi = min(lo, hi), max(lo, hi)
    a = serving_curve(ROOF, "llama-3-8b", GPU, 1, share, 900.0, 150.0, memory_share=lo)
    b = serving_curve(ROOF, "llama-3-8b", GPU, 1, share, 900.0, 150.0, memory_share=hi)
    assert b.memory.kv_tokens >= a.memory.kv_tokens
    if a.feasible:
        assert b.feasible and b.max_batch >= a.max_batch and b.mu >= a.mu * (1 - 1e-12)
        # same compute: the same in-service time at the batches both reach (no preemption)
        n = a.max_batch
        if a.preemptions_at_batch(n) == 0.0:
            assert np.array_equal(a.service_ms[:n], b.service_ms[:n])


def test_a_large_model_at_a_small_compute_share_needs_more_memory_than_that_share():
    """llama-65b on 4 GPUs at 30% of the SMs: 30% of the memory does not hold its weights, the
    tied model has no such instance, two resources do (with more memory)."""
    dem_in, dem_out = 800.0, 120.0
    tied = serving_curve(ROOF, "llama-65b", GPU, 4, 0.3, dem_in, dem_out)
    assert not tied.feasible
    fits = [m for m in TENTHS if serving_curve(ROOF, "llama-65b", GPU, 4, 0.3, dem_in, dem_out,
                                               memory_share=m).feasible]
    assert fits and min(fits) > 0.3
    p = independent(mix(4))
    cands = generate_candidates(p).by_llm["llm000"]
    at = [c for c in cands if c.tp == 4 and c.share == 0.3]
    assert at and all(c.memory_share > 0.3 for c in at)
    assert not [c for c in generate_candidates(mix(4)).by_llm["llm000"]
                if c.tp == 4 and c.share == 0.3]


def test_the_mix_gives_the_large_model_more_memory_than_compute_and_the_reranker_less():
    big = solve_min_latency(independent(mix(4)))
    assert big.status == "optimal"
    c = big.candidates["llm000"]
    assert c.memory_share > c.share  # the 65B model at low load: memory above its SMs
    small = solve_min_latency(independent(mix(8)))
    r = small.candidates["llm002"]
    assert r.memory_share < r.share  # the reranker: compute, little memory
    for plan, p in ((big, mix(4)), (small, mix(8))):
        assert plan.objective_s <= solve_min_latency(p).objective_s * (1 + REL)


# --------------------------------------------------------------------------- candidates


def test_tied_candidates_carry_no_memory_share_and_use_one_resource():
    p = random_problem(3, 4, ROOF, seed=1)
    cs = generate_candidates(p)
    flat = [c for v in cs.by_llm.values() for c in v]
    assert flat and all(c.memory_share is None and c.mem_units == c.units for c in flat)


def test_independent_candidates_carry_memory_and_are_3d_pareto():
    p = independent(random_problem(3, 4, ROOF, seed=1))
    cs = generate_candidates(p)
    cat = default_catalog()
    for cands in cs.by_llm.values():
        assert cands
        for c in cands:
            assert c.memory_share is not None
            assert c.mem_units == c.replicas * gpu_units(c.tp, c.memory_share)
            assert math.isclose(c.memory_gib, c.memory_share * cat.gpu(c.gpu).memory_gib)
        for a in cands:  # none is matched or beaten on units, memory units and cost
            assert not any(b is not a and b.gpu == a.gpu and b.units <= a.units
                           and b.mem_units <= a.mem_units and b.cost <= a.cost for b in cands)


def test_skipped_memory_values_serve_as_the_largest():
    """Memory values above the first whose curve equals the largest's are not generated."""
    p = independent(random_problem(2, 4, ROOF, seed=3))
    m = p.llms[0]
    dem = p.demands[m]
    full = shape_curves(p, dem, GPU, 1, list(TENTHS), skip=False)
    kept = shape_curves(p, dem, GPU, 1, list(TENTHS))
    assert len(kept) <= len(full)
    keys = {(c.share, c.memory_share) for c in kept}
    for c in full:
        if c.feasible and (c.share, c.memory_share) not in keys:
            lower = max((k for k in kept if k.share == c.share and k.feasible
                         and k.memory_share < c.memory_share), key=lambda k: k.memory_share)
            assert lower.mu == c.mu and np.array_equal(lower.service_ms, c.service_ms)


def test_price_honours_the_instance_memory():
    p = mix(4)
    tied = Allocation({"llm000": Instance(GPU, 4, 0.6), "llm001": Instance(GPU, 1, 0.4, 2),
                       "llm002": Instance(GPU, 1, 0.1, 8)})
    more = Allocation({**tied.llms, "llm000": Instance(GPU, 4, 0.6, memory=0.9)})
    a, b = price(p, tied), price(p, more)
    assert a["llm000"].memory_share is None and b["llm000"].memory_share == 0.9
    assert b["llm000"].mu >= a["llm000"].mu and b["llm000"].memory_gib > a["llm000"].memory_gib
    assert b["llm000"].mem_units == 4 * 900 and a["llm000"].mem_units == 4 * 600


# --------------------------------------------------------------------------- optimisers


@given(seed=st.integers(0, 10**6), n=st.integers(1, 4))
@FAST
def test_independent_optimum_is_no_worse_than_tied(seed, n):
    """The memory grid holds the share grid, so every tied plan is an independent one."""
    p = random_problem(n, 4, ROOF, seed=seed, load=0.6)
    a, b = solve_min_latency(p), solve_min_latency(independent(p))
    if a.status == "optimal":
        assert b.status == "optimal"
        assert b.objective_s <= a.objective_s + REL * max(abs(a.objective_s), 1.0)
        assert fits_budget(independent(p), b.candidates)


TINY = PlanOptions(shares=(0.3, 0.5, 1.0), tps=(1, 2), memory_shares=(0.1, 0.3, 0.5, 0.7, 1.0))


@pytest.mark.parametrize("seed", range(6))
def test_milp_equals_brute_force_in_independent_mode(seed):
    cl = Cluster("tiny", (GPUPool(GPU, 1, 2),)) if seed % 2 else \
        Cluster("het", (GPUPool(GPU, 1, 2), GPUPool("H100-80GB", 1, 1)))
    p = random_problem(3, cl.total_gpus, ROOF, seed=seed, load=0.7, cluster=cl, options=TINY)
    a = solve_min_latency(p)
    b = BruteForce().solve(p)
    c = BruteForce(prune=False).solve(p)
    assert a.status == b.status == c.status
    if a.status == "optimal":
        assert _agree(a.objective_s, b.objective_s) and _agree(b.objective_s, c.objective_s)
        assert fits_budget(p, a.candidates) and fits_budget(p, b.candidates)


@pytest.mark.parametrize("seed", range(4))
def test_max_scale_equals_the_capacity_oracle_in_independent_mode(seed):
    cl = Cluster("tiny", (GPUPool(GPU, 1, 2),))
    p = random_problem(2, 2, ROOF, seed=seed, load=0.7, cluster=cl, options=TINY)
    s, choice, status = max_scale(p)
    oracle, _ = capacity_scale(p)
    assert status == "optimal"
    assert abs(s - oracle) <= 1e-6 * max(oracle, 1.0)
    if choice:
        assert fits_budget(p, choice)


SMALL = PlanOptions(shares=(0.2, 0.4, 0.6, 0.8, 1.0), tps=(1, 2),
                    memory_shares=(0.1, 0.2, 0.4, 0.6, 0.8, 1.0))


@pytest.mark.parametrize("seed", range(4))
def test_no_optimiser_goes_over_either_budget(seed):
    p = random_problem(3, 4, ROOF, seed=seed, load=0.7, options=SMALL)
    budgets = p.cluster.budgets()
    for name in sorted(OPTIMISERS):
        if name == "user":
            continue
        plan = optimiser(name).solve(p)
        if plan.allocation is None:
            continue
        for used in (units_by_gpu(plan.candidates.values()),
                     mem_units_by_gpu(plan.candidates.values())):
            assert all(u <= budgets[g] * UNITS for g, u in used.items()), name


def test_capacity_shapes_carry_memory_units():
    p = independent(mix(4))
    for shapes_ in capacity_shapes(p).values():
        assert shapes_
        for sh in shapes_:
            assert len(sh) == 5 and sh.memory_share is not None
            assert sh.mem_units == gpu_units(sh[1], sh.memory_share)
    for shapes_ in capacity_shapes(mix(4)).values():
        assert all(sh.mem_units == sh[3] and sh.memory_share is None for sh in shapes_)


# --------------------------------------------------------------------------- reduced-cost fixing


def _two_price_instances() -> list[PlanningProblem]:
    out = []
    for seed in range(8):
        cl = Cluster(f"r{seed}", (GPUPool(GPU, 1 + seed % 2, 4),
                                  GPUPool("H100-80GB", 1, 2)) if seed % 3 == 0 else
                     (GPUPool(GPU, 1 + seed % 3, 4),))
        out.append(independent(random_problem(2 + seed % 4, cl.total_gpus, ROOF, seed=seed,
                                              load=(0.4, 0.8, 1.1)[seed % 3], cluster=cl,
                                              options=PlanOptions(reduce=True,
                                                                  tps=(1, 2, 4)))))
    out.append(independent(mix(4), TENTHS))
    return out


@pytest.mark.parametrize("i", range(9))
def test_reduced_cost_fixing_is_exact_with_two_prices(i):
    p = _two_price_instances()[i]
    full = generate_candidates(p)
    red = reduced_candidates(p)
    a, b = solve_min_latency(p, full), solve_min_latency(p, red)
    assert a.status == b.status
    if a.status == "optimal":
        assert _agree(a.objective_s, b.objective_s)
    keys = {(m, c.gpu, c.tp, c.share, c.memory_share, c.replicas)
            for m, v in full.by_llm.items() for c in v}
    assert all((m, c.gpu, c.tp, c.share, c.memory_share, c.replicas) in keys
               for m, v in red.by_llm.items() for c in v)


def test_the_lp_prices_memory_where_memory_binds():
    """Not vacuous: on the mix (the 65B model is memory-heavy) the memory row has a price."""
    p = independent(mix(4))
    priced = _prices(p, generate_candidates(p, coarse=True), Deadline.after(60.0))
    assert priced is not None
    _, _, mem = priced
    assert set(mem) == set(p.cluster.budgets()) and all(v >= 0 for v in mem.values())


# --------------------------------------------------------------------------- plan.json


def test_plan_json_carries_memory_only_when_independent():
    p = mix(4)
    tied = json.loads(dumps(plan_to_dict(p, solve_min_latency(p), timings=False)))
    assert all("memory" not in v for v in tied["allocation"]["llms"].values())
    assert all("memory" not in v for v in tied["llms"].values())
    q = independent(p)
    plan = solve_min_latency(q)
    doc = json.loads(dumps(plan_to_dict(q, plan, timings=False)))
    dev = default_catalog().gpu(GPU).memory_gib
    for m, c in plan.candidates.items():
        assert doc["allocation"]["llms"][m]["memory"] == c.memory_share
        assert doc["llms"][m]["memory"] == c.memory_share
        assert math.isclose(doc["llms"][m]["memory_gib_per_gpu"], c.memory_share * dev)


# --------------------------------------------------------------------------- blocks and cuts


def test_block_candidates_fit_both_resources_per_gpu():
    p = independent(mix(8))
    cs = generate_candidates(p, blocks=True)
    for v in cs.by_llm.values():
        for c in v:
            k = min(replicas_per_gpu(c.share), replicas_per_gpu(c.memory_share))
            assert c.replicas % k == 0 and c.units == UNITS * c.tp * (c.replicas // k)
            assert c.mem_units <= c.units  # the memory row is implied by the block rows
    rows = capacity_rows(from_cluster(p.cluster), cs.by_llm)
    assert rows


def test_packing_rows_cover_memory_slices_and_stay_valid():
    """Memory rows are written beside the compute rows; on an empty cluster the free-capacity
    rows are the budgets, which every plan keeps."""
    p = independent(mix(8))
    cs = generate_candidates(p)
    compute_only = {m: [dataclasses.replace(c, memory_share=None) for c in v]
                    for m, v in cs.by_llm.items()}
    rows = packing_inequalities(p, cs.by_llm)
    assert len(rows) > len(packing_inequalities(p, compute_only))
    free = free_capacity_rows(from_cluster(p.cluster), cs.by_llm)
    assert len(free) == 2  # compute and memory of the one GPU type
    assert [rhs for _, rhs in free] == [8 * UNITS, 8 * UNITS]  # an empty cluster: all of it
    plan = solve_min_latency(p)
    for coeffs, rhs in free:
        assert sum(coeffs.get(c, 0.0) for c in plan.candidates.values()) <= rhs + 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_max_throughput_equals_brute_force_in_independent_mode(seed):
    cl = Cluster("tiny", (GPUPool(GPU, 1, 2),))
    opts = dataclasses.replace(TINY, objective="max-throughput")
    p = random_problem(2, 2, ROOF, seed=seed, load=0.7, cluster=cl, options=opts)
    a = optimiser("milp").solve(p)
    b = BruteForce().solve(p)
    assert a.feasible == b.feasible
    if a.feasible:
        assert abs(a.scale - b.scale) <= 1e-6 * max(b.scale, 1.0)
        assert fits_budget(p.scaled(a.scale), a.candidates)
