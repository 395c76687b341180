"""One conformance suite for every registered placeable formulation, and the exhaustive oracle.

Every formulation of ``scepsy_place.formulations.FORMULATIONS_REGISTRY`` must hand on placed plans
that break no placement invariant and carry every LLM's load, never beat the aggregate MILP's
bound nor (on tiny instances) the exhaustive placeable optimum of the same candidate grid, equal
that optimum when it claims a proven gap of 0 over the grid, be deterministic, and say
``time_limit`` (never ``infeasible``) when the time runs out. The oracle
(``scepsy_place.packing.exhaustive``) is itself checked against hand-made instances, brute force and
its own second method (exhaustive assignment vs the placement MILP).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_common.units import share_units
from scepsy_opt.allocation import Allocation
from scepsy_opt.cluster import Cluster, GPUPool, uniform_cluster
from scepsy_opt.planning.candidates import Candidate, generate_candidates, price
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.milp import max_scale, solve_min_latency
from scepsy_opt.planning.problem import Deadline, PlanOptions
from scepsy_place.formulations import FORMULATIONS_REGISTRY, formulation
from scepsy_place.formulations.loop import GRID_BOUNDS, PROVEN_GAP
from scepsy_place.packing.check import violations
from scepsy_place.packing.exhaustive import (
    OracleLimit,
    combinations_by_cost,
    fits_budgets,
    placeable,
    placeable_optimum,
)
from scepsy_place.packing.placement import demands
from scepsy_place.packing.topology import from_cluster, parse_topology
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
GPU = "A100-80GB"
REL = 1e-9  # float paths of one objective (the MILP's sum, the oracle's sum)
NAMES = sorted(FORMULATIONS_REGISTRY)
EXACT_UP_TO_64 = ("aggregate", "auto")  # the cheapest placeable allocation up to 64 GPUs
TINY_OPTS = PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1,))
TP_OPTS = PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1, 2))


def tiny(seed: int, kind: str):
    """Tiny instances whose whole candidate grid the oracle enumerates."""
    if kind == "3gpu":  # one node of three GPUs: fractional shares that do not always pack
        cl = uniform_cluster(GPU, 3, 3)
        return random_problem(3, 3, ROOF, seed=seed, load=0.6, options=TINY_OPTS, cluster=cl)
    # two nodes of two GPUs, TP 1-2: locality matters
    cl = uniform_cluster(GPU, 4, 2)
    return random_problem(3, 4, ROOF, seed=seed, load=0.7, options=TP_OPTS, cluster=cl)


def mixed(seed: int):
    """A heterogeneous cluster: an A100 node and an H100 node of eight GPUs each."""
    cl = Cluster("mix", (GPUPool(GPU, 1, 8), GPUPool("H100-80GB", 1, 8)))
    return random_problem(5, 16, ROOF, seed=seed, load=0.5, cluster=cl)


TINY = [(s, k) for k in ("3gpu", "2x2") for s in (0, 1, 2, 3)]


def carries_every_load(p, allocation) -> list[str]:
    """LLMs whose replicas do not carry their load at ``max_utilisation``, or are missing."""
    bad = sorted(set(p.llms) ^ set(allocation.llms))
    for m, c in price(p, allocation).items():
        if c.capacity * p.options.max_utilisation < p.loads[m] * (1 - 1e-9):
            bad.append(m)
    return bad


def check_placed(p, topo, res) -> None:
    assert res.placed and res.status == "placed" and res.reason is None
    ds = demands(res.plan.allocation, p.catalog)
    assert violations(topo, ds, res.placement) == []
    assert carries_every_load(p, res.plan.allocation) == []
    if res.bound_s is not None:  # a bound never above the plan it bounds
        assert res.bound_s <= res.plan.objective_s * (1 + REL)
        assert res.gap is not None and res.gap >= 0


# ----------------------------------------------------------------------- the conformance suite


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("seed", "kind"), TINY)
def test_tiny_plans_are_placed_valid_and_never_beat_the_exhaustive_optimum(name, seed, kind):
    p = tiny(seed, kind)
    topo = from_cluster(p.cluster)
    oracle = placeable_optimum(p, topo)
    res = formulation(name).solve(p, topo)
    if oracle is None:  # nothing places: no formulation may claim a placed plan
        assert not res.placed and res.status in ("infeasible", "unplaced")
        return
    best, _ = oracle
    assert res.status != "infeasible", res.reason  # a placeable allocation exists
    if not res.placed:  # blocks may need more GPUs, patterns' price-and-branch may miss
        assert name not in EXACT_UP_TO_64 and res.status == "unplaced", res.reason
        return
    check_placed(p, topo, res)
    assert res.plan.objective_s >= best * (1 - REL)
    scoped = res.formulation in GRID_BOUNDS or name == "auto"
    if res.bound_s is not None and scoped:  # a bound over the whole grid is below its optimum
        assert res.bound_s <= best * (1 + REL)
    if scoped and res.gap is not None and res.gap <= PROVEN_GAP:  # proven optimal: it is
        assert res.plan.objective_s == pytest.approx(best, rel=1e-7)


@pytest.mark.parametrize(("seed", "kind"), TINY)
def test_the_exact_aggregate_loop_and_auto_reach_the_exhaustive_optimum(seed, kind):
    p = tiny(seed, kind)
    topo = from_cluster(p.cluster)
    oracle = placeable_optimum(p, topo)
    agg = formulation("aggregate").solve(p, topo)
    auto = formulation("auto").solve(p, topo)
    if oracle is None:
        assert agg.status == "infeasible" and not auto.placed
        return
    assert agg.placed and agg.exact and agg.gap == pytest.approx(0.0, abs=1e-9)
    assert agg.plan.objective_s == pytest.approx(oracle[0], rel=1e-9)
    assert auto.placed and auto.plan.objective_s == pytest.approx(oracle[0], rel=1e-9)
    # auto keeps the best placed plan of the formulations it ran, and says how each ended
    placed = [o.objective_s for o in auto.compared.values() if o.status == "placed"]
    assert auto.plan.objective_s == min(placed)
    assert set(auto.compared) >= {"blocks", "aggregate"} or "patterns" in auto.compared


LARGER = [("16", 0), ("16", 1), ("mixed", 0), ("mixed", 1)]


def larger(kind: str, seed: int):
    return random_problem(5, 16, ROOF, seed=seed) if kind == "16" else mixed(seed)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("kind", "seed"), LARGER)
def test_plans_are_valid_and_never_below_the_aggregate_bound(name, kind, seed):
    p = larger(kind, seed)
    topo = from_cluster(p.cluster)
    bound = solve_min_latency(p)
    assert bound.status == "optimal"
    res = formulation(name).solve(p, topo)
    assert res.status != "infeasible", res.reason  # these place (the aggregate loop shows it)
    if not res.placed:
        assert name not in EXACT_UP_TO_64 and res.status == "unplaced", res.reason
        return
    check_placed(p, topo, res)
    assert res.plan.objective_s >= bound.bound_s * (1 - REL)
    if res.bound_s is not None and (res.formulation in GRID_BOUNDS or name == "auto"):
        # a bound of every placeable allocation is at least the aggregate MILP's bound ... or at
        # most the aggregate optimum where it is the first round's
        assert res.bound_s >= bound.bound_s * (1 - 1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_formulations_are_deterministic(name):
    p = random_problem(5, 16, ROOF, seed=2)
    topo = from_cluster(p.cluster)
    a = formulation(name).solve(p, topo)
    b = formulation(name).solve(p, topo)
    def same(r):  # the plan without its solver statistics (wall times)
        return (dataclasses.replace(r.plan, stats={}), r.placement, r.status, r.bound_s,
                r.compared, r.exact)

    assert same(a) == same(b)
    assert untimed(a.to_dict(timings=False)) == untimed(b.to_dict(timings=False))


def untimed(doc: dict) -> dict:
    """plan.json's placement section without the wall times a formulation's history reports."""
    return {**doc, "history": [{k: v for k, v in h.items() if not k.endswith("seconds")}
                               for h in doc["history"]]}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("limit_s", [1e-9, 1e-3])
def test_a_tiny_time_limit_is_time_limit_never_infeasible(name, limit_s):
    p = random_problem(5, 16, ROOF, seed=0)
    topo = from_cluster(p.cluster)
    res = formulation(name).solve(p, topo, deadline=Deadline.after(limit_s))
    assert res.status in ("placed", "time_limit"), (res.status, res.reason)
    if res.placed:
        check_placed(p, topo, res)
    else:
        assert res.answer.status == "time_limit_no_solution" and res.answer.allocation is None
    for k, o in res.compared.items():
        assert o.status != "infeasible", k


def test_plan_json_carries_the_bound_and_the_gap():
    p = random_problem(5, 16, ROOF, seed=0)
    res = formulation("auto").solve(p, from_cluster(p.cluster))
    doc = res.to_dict()
    assert doc["bound_s"] == res.bound_s and doc["gap"] == res.gap
    assert res.bound_s is not None and 0 <= res.gap <= 0.05
    for k, o in doc["compared"].items():
        assert set(o) == {"status", "objective_s", "bound_s", "seconds"}, k
        assert o["seconds"] >= 0
    assert all("seconds" not in o for o in res.to_dict(timings=False)["compared"].values())
    # blocks alone prove no bound beyond their own allocations
    blk = formulation("blocks").solve(p, from_cluster(p.cluster))
    assert blk.bound_s is None and blk.gap is None and blk.to_dict()["gap"] is None


def test_unknown_formulation_is_an_input_error():
    from scepsy_common.errors import InputError

    with pytest.raises(InputError):
        formulation("simplex")


# ----------------------------------------------------------------------- the exhaustive oracle


def cand(llm: str, share: float, replicas: int = 1, cost: float = 1.0, tp: int = 1,
         memory: float | None = None, gpu: str = GPU) -> Candidate:
    units = tp * share_units(share) * replicas
    mem = memory if memory is not None else share
    return Candidate(llm, gpu, tp, share, replicas, units, 1.0, 1.0, cost, 0.0,
                     memory_gib=80.0 * mem, memory_share=memory)


def topology(nodes: list[tuple[int, int]], used: dict[tuple[int, int], float] | None = None):
    """Nodes of (gpus, nvlink domain) A100s; ``used``: (node, gpu) -> share already taken."""
    used = used or {}
    doc = [{"name": f"n{i}", "gpu": GPU, "gpus": g, "nvlink_domain": d,
            "in_use": [{"gpu": j, "share": s, "memory_gib": 80 * s}
                       for (k, j), s in sorted(used.items()) if k == i]}
           for i, (g, d) in enumerate(nodes)]
    return parse_topology({"name": "t", "racks": [{"name": "r", "nodes": doc}]}, "test")


def budget_problem(gpus: int):
    """A problem whose only role is the GPU budget (hand-made candidates replace its own)."""
    return random_problem(2, gpus, ROOF, seed=0, cluster=uniform_cluster(GPU, gpus, gpus))


def both(p, topo, cands):
    """The oracle by both placeability methods: they must agree."""
    a = placeable_optimum(p, topo, cands)
    b = placeable_optimum(p, topo, cands, method="search")
    assert a == b
    return a


def test_three_shares_of_six_tenths_do_not_place_on_two_gpus():
    p = budget_problem(2)
    cands = {m: (cand(m, 0.6),) for m in "abc"}
    assert fits_budgets(p, {m: c[0] for m, c in cands.items()})  # 1.8 GPUs: the budget holds
    assert both(p, topology([(2, 2)]), cands) is None


def test_the_oracle_skips_the_cheapest_unplaceable_combination():
    # four LLMs at 0.6 (cost 1) fit a budget of 3 GPUs, not the GPUs; one at 0.4 (cost 1.5) does
    p = budget_problem(3)
    cands = {m: (cand(m, 0.6, cost=1.0), cand(m, 0.4, cost=1.5)) for m in "abcd"}
    cost, alloc = both(p, topology([(3, 3)]), cands)
    assert cost == pytest.approx(4.5 + p.constant_s, rel=1e-12)
    assert sorted(i.share for i in alloc.llms.values()) == [0.4, 0.6, 0.6, 0.6]


def test_tp_groups_stay_inside_one_nvlink_domain():
    p = budget_problem(4)
    two = {m: (cand(m, 0.6, tp=2),) for m in "ab"}
    assert both(p, topology([(4, 2)]), two) is not None  # one group per domain
    three = {m: (cand(m, 0.6, tp=2),) for m in "abc"}
    assert both(p, topology([(4, 2)]), three) is None  # 2.4 of 4 GPUs, but no room
    solo = {"a": (cand("a", 0.5, tp=2),)}
    assert both(p, topology([(2, 1), (2, 1)]), solo) is None  # domains of one GPU
    assert both(p, topology([(2, 2)]), solo) is not None


def test_memory_and_compute_are_two_resources():
    # compute 0.3 each fits one GPU twice over, memory 0.6 each does not
    p = budget_problem(2)
    one = topology([(1, 1)])
    cands = {m: (cand(m, 0.3, memory=0.6),) for m in "ab"}
    assert both(p, one, cands) is None
    assert both(p, topology([(2, 2)]), cands) is not None
    assert both(p, one, {m: (cand(m, 0.3, memory=0.4),) for m in "ab"}) is not None


def test_the_oracle_places_around_gpus_in_use():
    p = budget_problem(2)
    cands = {m: (cand(m, 0.6),) for m in "ab"}
    assert both(p, topology([(2, 2)]), cands) is not None
    assert both(p, topology([(2, 2)], {(0, 0): 0.5}), cands) is None  # 0.5 left on GPU 0


def test_the_oracle_limit_is_no_answer():
    p = budget_problem(2)
    cands = {m: (cand(m, 0.6), cand(m, 0.6, cost=2.0)) for m in "abc"}
    with pytest.raises(OracleLimit):
        placeable_optimum(p, topology([(2, 2)]), cands, limit=3)
    assert placeable_optimum(p, topology([(2, 2)]), cands, limit=8) is None  # all 8 tested


ORACLE = settings(derandomize=True, deadline=None, database=None, max_examples=40)
tenths = st.integers(1, 10).map(lambda k: k / 10)


@ORACLE
@given(costs=st.lists(st.lists(st.tuples(st.integers(0, 5), tenths, st.sampled_from([1, 1, 2]),
                                         st.integers(1, 2)), min_size=1, max_size=3),
                      min_size=1, max_size=3),
       domain=st.sampled_from([1, 2]))
def test_the_oracle_is_the_first_placeable_combination_in_cost_order(costs, domain):
    """Brute force: every combination sorted by cost, the first that fits the budget and places
    (by exhaustive assignment), against the oracle's best-first enumeration (by both methods)."""
    p = budget_problem(4)
    topo = topology([(2, domain), (2, domain)])
    cands = {f"m{i}": tuple(cand(f"m{i}", s, r, float(c), tp) for c, s, tp, r in cs)
             for i, cs in enumerate(costs)}
    llms = sorted(cands)
    want = None
    for combo in sorted(itertools.product(*(cands[m] for m in llms)),
                        key=lambda cs: math.fsum(c.cost for c in cs)):
        choice = dict(zip(llms, combo, strict=True))
        alloc = Allocation({m: c.instance for m, c in choice.items()})
        if fits_budgets(p, choice) and placeable(topo, demands(alloc), "search"):
            want = math.fsum(c.cost for c in combo) + p.constant_s
            break
    got = both(p, topo, cands)
    assert (got is None) == (want is None)
    if got is not None:
        assert got[0] == pytest.approx(want, rel=1e-12)


@ORACLE
@given(sizes=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=4), min_size=1,
                      max_size=4))
def test_combinations_come_once_each_in_cost_order(sizes):
    cands = {f"m{i}": tuple(cand(f"m{i}", 0.1 * (k + 1), cost=float(c))
                            for k, c in enumerate(cs)) for i, cs in enumerate(sizes)}
    got = list(combinations_by_cost(cands))
    costs = [c for c, _ in got]
    assert costs == sorted(costs)
    keys = [tuple(sorted((m, c.share) for m, c in ch.items())) for _, ch in got]
    assert len(keys) == len(set(keys)) == math.prod(len(cs) for cs in sizes)


def test_the_tiny_grids_are_enumerable():
    """The conformance instances' candidate grids are what the oracle enumerates unpruned."""
    for seed, kind in TINY:
        p = tiny(seed, kind)
        n = math.prod(len(cs) for cs in generate_candidates(p, prune=False).by_llm.values())
        assert 1 < n < 200_000


# ----------------------------------------------------------------------- max-throughput, registry


@pytest.mark.parametrize("name", NAMES)
def test_max_throughput_places_at_a_scale_the_allocation_carries(name):
    cl = uniform_cluster(GPU, 3, 3)
    mt = random_problem(3, 3, ROOF, seed=0, load=0.6, cluster=cl,
                        options=dataclasses.replace(TINY_OPTS, objective="max-throughput"))
    topo = from_cluster(cl)
    res = formulation(name).solve(mt, topo)
    assert res.placed, res.reason
    cap, _, _ = max_scale(mt)  # the capacity optimum bounds every placed scale
    assert 0 < res.plan.scale <= cap * (1 + 1e-9)
    assert violations(topo, demands(res.plan.allocation), res.placement) == []
    assert carries_every_load(mt.scaled(res.plan.scale), res.plan.allocation) == []


def test_the_registry_holds_every_formulation():
    assert set(FORMULATIONS_REGISTRY) == {"aggregate", "auto", "blocks", "patterns", "slots"}
    with pytest.raises(InputError, match="formulation"):
        formulation("simplex")
    assert all(FORMULATIONS_REGISTRY[n].name == n for n in NAMES)
