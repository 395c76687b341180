"""Mixed GPU types for one LLM (scepsy_opt.planning.mixing): Mélange's formulation and scepsy's portions,
each against brute force over every assignment on small instances, and the properties that make
the split worth planning: never dearer than one type, never above the latency bound, a bound
below the price.

Prices are sums of a few floats: compared with a relative tolerance of 1e-9."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_opt.cluster import Cluster, GPUPool
from scepsy_opt.planning.milp import unit_latency
from scepsy_opt.planning.mincost import gpu_prices
from scepsy_opt.planning.mixing import (
    melange_min_cost,
    mixed_latencies,
    mixed_plan,
    portion_candidates,
    solve_mixed,
)
from scepsy_opt.planning.plans import workflow_latencies
from scepsy_opt.planning.problem import Deadline, PlanningProblem, PlanOptions
from scepsy_opt.prediction.pipeline import predict
from scepsy_opt.ratework import models as rate_models
from scepsy_opt.ratework import parse_rate_workload, rate_stats, rates
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
REL = 1e-9


# -- Mélange's formulation ----------------------------------------------------------------------


def _melange_brute(rates, tputs, prices, k):
    """Every assignment of every slice to a GPU type; GPUs per type the ceiling of its load."""
    slices = [(b, r / k) for b, r in enumerate(rates) for _ in range(k)]
    gpus = sorted(tputs)
    best = math.inf
    for assign in itertools.product(gpus, repeat=len(slices)):
        load = dict.fromkeys(gpus, 0.0)
        ok = True
        for (b, r), g in zip(slices, assign, strict=True):
            if r == 0:
                continue
            if tputs[g][b] <= 0:
                ok = False
                break
            load[g] += r / tputs[g][b]
        if ok:
            best = min(best, math.fsum(prices[g] * math.ceil(load[g] - 1e-9) for g in gpus))
    return best


def test_melange_own_example_matches_brute_force():
    """Mélange's example (melange/main.py): A10G at 1.01 and A100 at 3.67 USD/h, four buckets,
    16 req/s, slice factor 1; and the same with two slices per bucket."""
    rates = [16 * p for p in (0.25, 0.125, 0.375, 0.25)]
    tputs = {"A10G": [5, 1, 10, 5], "A100": [20, 2, 50, 20]}
    prices = {"A10G": 1.01, "A100": 3.67}
    for k in (1, 2):
        ans = melange_min_cost(rates, tputs, prices, k)
        assert ans.status == "optimal"
        assert ans.cost_per_hour == pytest.approx(_melange_brute(rates, tputs, prices, k), rel=REL)
        assert len(ans.assignment) == 4 * k
        loads = dict.fromkeys(prices, 0.0)
        for i, g in enumerate(ans.assignment):
            b = i // k
            loads[g] += rates[b] / k / tputs[g][b]
        assert all(ans.gpus[g] >= loads[g] - 1e-9 for g in prices)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(0.01, 8.0)), min_size=1, max_size=3),
       st.lists(st.floats(0.5, 30.0), min_size=6, max_size=6),
       st.floats(0.5, 5.0), st.integers(1, 2))
def test_melange_is_the_least_cost_assignment(rates, tp, price_b, k):
    """Rates are 0 or at least 0.01 req/s: a load below HiGHS's feasibility tolerance (1e-6 of
    a GPU) would need no GPU."""
    n = len(rates)
    tputs = {"a": tp[:n], "b": tp[3:3 + n]}
    prices = {"a": 1.0, "b": price_b}
    ans = melange_min_cost(rates, tputs, prices, k)
    assert ans.cost_per_hour == pytest.approx(_melange_brute(rates, tputs, prices, k),
                                              rel=1e-7, abs=1e-9)


def test_melange_input_errors_name_the_field():
    with pytest.raises(InputError, match=r"tputs\.a"):
        melange_min_cost([1.0, 2.0], {"a": [1.0]}, {"a": 1.0})
    with pytest.raises(InputError, match="slice_factor"):
        melange_min_cost([1.0], {"a": [1.0]}, {"a": 1.0}, 0)
    with pytest.raises(InputError, match=r"rates\[0\]"):
        melange_min_cost([-1.0], {"a": [1.0]}, {"a": 1.0})
    with pytest.raises(InputError, match=r"tputs\.a"):
        melange_min_cost([1.0], {"a": [math.nan]}, {"a": 1.0})
    # a bucket no GPU type serves: no assignment exists
    assert melange_min_cost([1.0], {"a": [0.0]}, {"a": 1.0}).status == "infeasible"


# -- portions of one LLM ------------------------------------------------------------------------


def _one_llm(model: str, rate: float, gpus=("L4", "A10"), bound: float | None = None,
             per_type: int = 8, **opts) -> PlanningProblem:
    wl = parse_rate_workload({"kind": "rates", "name": "one", "llms": {"chat": {
        "model": model, "rate": rate,
        "input": {"kind": "lognormal", "mean": 300, "cv": 1.0, "min": 4, "max": 1536},
        "output": {"kind": "exponential", "mean": 180, "min": 1, "max": 512}}}})
    cl = Cluster("two", tuple(GPUPool(g, per_type, 1) for g in gpus))
    options = PlanOptions(objective="min-cost", time_limit_s=60,
                          latency_bound_s={"chat": bound} if bound else {}, **opts)
    return PlanningProblem(rate_stats(wl, 200, seed=0), rate_models(wl), rates(wl), cl, ROOF,
                           options)


def _brute(p: PlanningProblem, s: int) -> float:
    """The least price of any set of portions (at most one per GPU type, fractions summing to
    1) within the GPUs and the mean bound."""
    prices = gpu_prices(p)
    caps = p.cluster.budgets()
    options = portion_candidates(p, s)["chat"]
    by_type: dict[str, list] = {}
    for q in options:
        by_type.setdefault(q.candidate.gpu, []).append(q)
    best = math.inf
    types = sorted(by_type)
    for combo in itertools.product(*([None, *by_type[g]] for g in types)):
        picked = [q for q in combo if q is not None]
        if sum(q.slices for q in picked) != s:
            continue
        if any(q.gpus > caps[q.candidate.gpu] for q in picked):
            continue
        lat = mixed_latencies(p, {"chat": tuple(picked)})["chat"]
        if "chat" in p.options.latency_bound_s and lat > p.options.latency_bound_s["chat"] + 1e-9:
            continue
        best = min(best, math.fsum(prices[q.candidate.gpu] * q.gpus for q in picked))
    return best


@pytest.mark.parametrize(("rate", "bound"), [(16.0, None), (6.0, None), (16.0, 10.0),
                                             (10.0, None)])
def test_mixed_price_is_the_brute_force_least(rate, bound):
    p = _one_llm("llama-3-8b", rate, bound=bound)
    mx = solve_mixed(p, slices=4)
    oracle = _brute(p, 4)
    assert mx.status == "optimal"
    assert mx.cost_per_hour == pytest.approx(oracle, rel=REL)
    assert mx.cost_bound_per_hour <= mx.cost_per_hour * (1 + REL)
    if bound:
        assert mx.latency_s["chat"] <= bound * (1 + 1e-9)


def test_mixing_pays_where_one_type_leaves_a_gpu_mostly_idle():
    """12 req/s of an 8B model on L4 and A10: two A10 carry three quarters of it and one L4 the
    rest, cheaper than three A10 or any other single type (every single-type candidate is a
    portion of 1)."""
    p = _one_llm("llama-3-8b", 12.0)
    mx = solve_mixed(p, slices=8)
    prices = gpu_prices(p)
    single = min(prices[q.candidate.gpu] * q.gpus for q in portion_candidates(p, 8)["chat"]
                 if q.slices == 8)
    assert mx.mixed
    assert mx.cost_per_hour < single - 1e-9
    assert sum(q.fraction for q in mx.portions["chat"]) == pytest.approx(1.0, rel=REL)
    # each group carries its fraction of the load within max_utilisation
    load = p.loads["chat"]
    for q in mx.portions["chat"]:
        assert q.candidate.capacity * p.options.max_utilisation >= q.fraction * load * (1 - 1e-9)


@settings(max_examples=8, deadline=None)
@given(st.floats(1.0, 24.0), st.sampled_from([("L4", "A10"), ("A100-80GB", "H100-80GB")]))
def test_mixed_never_costs_more_than_one_type(rate, gpus):
    p = _one_llm("llama-3-8b", rate, gpus=gpus)
    mx = solve_mixed(p, slices=4)
    prices = gpu_prices(p)
    caps = p.cluster.budgets()
    single = [prices[q.candidate.gpu] * q.gpus for q in portion_candidates(p, 4)["chat"]
              if q.slices == 4 and q.gpus <= caps[q.candidate.gpu]]
    if not single:
        return
    assert mx.feasible
    assert mx.cost_per_hour <= min(single) * (1 + REL)
    assert mx.cost_bound_per_hour <= mx.cost_per_hour * (1 + REL)
    assert sum(mx.gpus_used.values()) == sum(q.gpus for q in mx.portions["chat"])


def test_an_unmeetable_bound_is_infeasible_and_a_spent_deadline_is_a_time_limit():
    p = _one_llm("llama-3-8b", 16.0, bound=0.01)
    assert solve_mixed(p, slices=2).status == "infeasible"
    p = _one_llm("llama-3-8b", 16.0)
    spent = Deadline.after(0.0)
    mx = solve_mixed(p, slices=2, deadline=spent)
    assert mx.status == "time_limit_no_solution" and not mx.feasible


def test_bad_slices_are_refused():
    with pytest.raises(InputError, match="slices"):
        solve_mixed(_one_llm("llama-3-8b", 4.0), slices=0)


# -- percentile bounds on split plans -------------------------------------------------------------


def _brute_percentile(p: PlanningProblem, s: int) -> float:
    """The least price of any set of portions within the GPUs whose p90 with the slowest
    routing (every split LLM at its slowest group) is within the bound."""
    prices = gpu_prices(p)
    caps = p.cluster.budgets()
    by_type: dict[str, list] = {}
    for q in portion_candidates(p, s)["chat"]:
        by_type.setdefault(q.candidate.gpu, []).append(q)
    (q90, bound), = p.options.latency_bounds.values()
    best = math.inf
    for combo in itertools.product(*([None, *by_type[g]] for g in sorted(by_type))):
        picked = tuple(q for q in combo if q is not None)
        if sum(q.slices for q in picked) != s or any(q.gpus > caps[q.candidate.gpu]
                                                     for q in picked):
            continue
        # the slowest routing, computed here from the definition: each request's latency with
        # the slowest group's unit latency
        st = p.stats["chat"]
        unit = max(unit_latency(p, "chat", q.candidate) for q in picked)
        y = st.paths.weights[:, 0] * unit + st.paths.tool_s
        if float(np.percentile(y, q90)) <= bound * (1 + 1e-9):
            best = min(best, math.fsum(prices[q.candidate.gpu] * q.gpus for q in picked))
    return best


@pytest.mark.parametrize("bound", [60.0, 40.0, 36.0, 30.0, 25.0, 21.0, 19.0, 15.0])
def test_a_percentile_bound_plans_the_brute_force_least_split(bound):
    """With a p90 bound the split plan is the cheapest set of portions whose p90 holds for
    every routing (brute force over every set, computed from the definition), proven; an
    unmeetable bound is infeasible. At loose bounds the answer splits (cheaper than one type),
    at tight ones it takes the faster type alone."""
    p = _one_llm("llama-3-8b", 12.0, latency_bounds={"chat": (90.0, bound)})
    mx = solve_mixed(p, slices=4)
    oracle = _brute_percentile(p, 4)
    if math.isinf(oracle):
        assert mx.status == "infeasible" and not mx.feasible
        return
    assert mx.status == "optimal"
    assert mx.cost_per_hour == pytest.approx(oracle, rel=REL)
    assert mx.cost_bound_per_hour <= mx.cost_per_hour * (1 + REL)
    got = mx.stats["latency_bounds"]["chat"]
    assert got["met"] and got["slowest_routing_s"] <= bound * (1 + 1e-9)
    # the predictor's fraction-weighted routing is never slower than the slowest routing
    assert got["predicted_s"] <= got["slowest_routing_s"] * (1 + 1e-12)


def test_loose_percentile_bounds_still_split_and_the_predictor_agrees(tmp_path):
    """A bound the unbounded split plan meets keeps that plan (the split is not lost to the
    bound), and the predictor on the split plan's groups predicts the p90 the plan reports
    (relative 1e-9: the same sum over requests in another order)."""
    free = solve_mixed(_one_llm("llama-3-8b", 12.0), slices=8)
    assert free.mixed
    p = _one_llm("llama-3-8b", 12.0, latency_bounds={"chat": (90.0, 1000.0)})
    mx = solve_mixed(p, slices=8)
    assert mx.mixed and mx.status == "optimal"
    assert mx.cost_per_hour == pytest.approx(free.cost_per_hour, rel=REL)
    _, plan = mixed_plan(p, mx)
    pred = predict(p.stats, p.models, plan.allocation, p.latency, dict(p.targets))
    assert pred.workflows["chat"].p90_latency_s == pytest.approx(
        mx.stats["latency_bounds"]["chat"]["predicted_s"], rel=1e-9)


@pytest.mark.parametrize("tpot_s", [0.2, 0.09])
def test_an_slo_holds_group_by_group_on_a_split_llm(tpot_s):
    """A per-LLM TPOT SLO holds group by group: at 0.2 s the unbounded split plan meets it and
    is kept; at 0.09 s its L4 group (0.098 s at its quarter of the calls) would miss it, and
    the plan changes until every group meets it. The check of the split allocation reports
    the fraction-weighted mean TPOT of its groups' checks (relative 1e-9)."""
    from scepsy_opt.planning.candidates import slo_checks
    from scepsy_opt.prediction.slo import CallSLO

    free = solve_mixed(_one_llm("llama-3-8b", 12.0), slices=8)
    p = _one_llm("llama-3-8b", 12.0, slos={"chat": CallSLO(tpot_s=tpot_s)})
    mx = solve_mixed(p, slices=8)
    assert mx.status == "optimal"
    groups, plan = mixed_plan(p, mx)
    each = slo_checks(groups, plan.allocation)
    assert each and all(c.met for c in each.values())
    whole = slo_checks(p, plan.allocation)["chat"] if plan.allocation.splits else None
    if tpot_s == 0.2:
        assert mx.mixed and mx.cost_per_hour == pytest.approx(free.cost_per_hour, rel=REL)
    else:
        # the free plan's groups do not all meet it: the answer differs from it
        _, free_groups = mixed_plan(p, free)
        missed = [g for g, c in slo_checks(mixed_plan(p, free)[0], free_groups.allocation).items()
                  if not c.met]
        assert missed and mx.portions != free.portions
    if whole is not None:
        assert whole.met
        fr = plan.allocation.splits["chat"]
        assert whole.tpot_s == pytest.approx(math.fsum(fr[g] * each[g].tpot_s for g in fr),
                                             rel=1e-9)


def test_the_split_problem_prices_each_group_as_the_split_milp_does():
    """The plan of the replica groups (split statistics, candidates priced again) predicts the
    workflow's mean latency the MILP summed from its portions (relative 1e-9: one sum in
    another order)."""
    p = _one_llm("llama-3-8b", 12.0)
    mx = solve_mixed(p, slices=8)
    groups, plan = mixed_plan(p, mx)
    splits = plan.allocation.splits
    assert set(splits) == {"chat"} and len(splits["chat"]) == 2
    assert sum(splits["chat"].values()) == pytest.approx(1.0, rel=REL)
    assert set(plan.allocation.llms) == set(splits["chat"])
    assert groups.llms == sorted(splits["chat"])
    got = workflow_latencies(groups, plan)["chat"]
    assert got == pytest.approx(mx.latency_s["chat"], rel=1e-9)
    # each group sees its fraction of the calls
    for g, f in splits["chat"].items():
        assert groups.loads[g] == pytest.approx(f * p.loads["chat"], rel=1e-9)
    # the predictor reads the split allocation against the original workflow statistics
    pred = predict(p.stats, p.models, plan.allocation, p.latency, dict(p.targets))
    assert pred.workflows["chat"].mean_latency_s == pytest.approx(got, rel=1e-9)
    assert set(pred.llms) == set(splits["chat"])


def test_the_simulator_routes_a_split_llm_by_its_fractions():
    """The simulator sends each group its fraction of the calls (smooth weighted round robin:
    within one call of its fraction of the calls) and reports the groups; its mean latency is
    near the prediction's (the predictor's own accuracy, within 30%, at this light load)."""
    p = _one_llm("llama-3-8b", 12.0)
    mx = solve_mixed(p, slices=8)
    _, plan = mixed_plan(p, mx)
    alloc = plan.allocation
    wl = parse_rate_workload({"kind": "rates", "name": "one", "llms": {"chat": {
        "model": "llama-3-8b", "rate": 12.0,
        "input": {"kind": "lognormal", "mean": 300, "cv": 1.0, "min": 4, "max": 1536},
        "output": {"kind": "exponential", "mean": 180, "min": 1, "max": 512}}}})
    from scepsy_opt.prediction.simulate import simulate
    from scepsy_opt.ratework import rate_trace

    trace = rate_trace(wl, 200, seed=0)
    sim = simulate(trace, rate_models(wl), alloc, ROOF, {"chat": 6.0}, requests=800, seed=1)
    calls = {g: sim.llms[g].calls for g in alloc.splits["chat"]}
    total = sum(calls.values())
    for g, f in alloc.splits["chat"].items():
        assert abs(calls[g] - f * total) <= 1
    assert set(sim.llms) == set(alloc.llms)
    pred = predict(p.stats, p.models, alloc, ROOF, {"chat": 6.0})
    assert sim.workflows["chat"].mean_latency_s == pytest.approx(
        pred.workflows["chat"].mean_latency_s, rel=0.3)


# -- the placed min-cost plan, plan.json and the routes -------------------------------------------


def test_placed_min_cost_splits_an_llm_and_routes_calls_by_fraction(tmp_path):
    """scepsy plan's min-cost on A10 and L4 takes the split plan when it is the cheapest placed
    one; plan.json carries the splits; every launch target routes each group its fraction."""
    import json

    from scepsy_place.formulations.loop import plan_and_place, plan_document
    from scepsy_place.packing.topology import from_cluster
    from scepsy_serve.launch.planfile import launch_plan, parse_plan
    from scepsy_serve.launch.routes import plan_routes, service_routes

    p = _one_llm("llama-3-8b", 12.0)
    res = plan_and_place(p, from_cluster(p.cluster))
    assert res.placed and res.formulation == "mixed"
    stats = res.plan.stats
    assert stats["placed_cost_per_hour"] <= stats["cost_bound_per_hour"] * (1 + REL)
    assert res.plan.status == "optimal"
    alloc = res.plan.allocation
    assert alloc.splits and set(alloc.splits) == {"chat"}
    doc = json.loads(json.dumps(plan_document(p, res, timings=False)))
    assert doc["allocation"]["splits"] == {m: dict(v) for m, v in alloc.splits.items()}
    lp = launch_plan(parse_plan(doc, "plan.json"), "plan.json")
    for routes in (plan_routes(lp), service_routes(lp, lambda g: f"http://{g}:8000/v1")):
        eps = routes.endpoints("chat", "chat")
        assert math.isclose(sum(e.weight for e in eps), 1.0, rel_tol=1e-9)
        for g, f in alloc.splits["chat"].items():
            assert math.isclose(sum(e.weight for e in eps if e.model == g), f, rel_tol=1e-9)


@pytest.mark.parametrize(("splits", "field"), [
    ({"chat": {"chat-a10": 0.5, "chat-l4": 0.25}}, "allocation.splits.chat"),
    ({"chat": {"chat-a10": 0.5, "chat-h100": 0.5}}, "allocation.splits.chat.chat-h100"),
    ({"chat": {"chat-a10": 1.0}}, "allocation.splits.chat"),
    ({"chat-a10": {"chat-l4": 0.5, "chat-a10": 0.5}}, "allocation.splits.chat-a10"),
])
def test_bad_splits_name_the_field(tmp_path, splits, field):
    """An allocation file (or plan.json) whose splits do not hold: fractions not summing to 1,
    a group that is no entry, one group, a split LLM that is also an entry; exit 2, the field
    named."""
    import yaml

    from conftest import REPO, run_cli
    from scepsy_opt.allocation import load_allocation

    alloc = {"llms": {"chat-a10": {"gpu": "A10", "tp": 1, "share": 1.0, "replicas": 2},
                      "chat-l4": {"gpu": "L4", "tp": 1, "share": 1.0, "replicas": 1}},
             "splits": splits}
    path = tmp_path / "alloc.yaml"
    path.write_text(yaml.safe_dump({"optimiser": "x", "status": "optimal", "allocation": alloc}))
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        load_allocation(path)
    code, _, err = run_cli("predict", "--workflow", str(REPO / "datasets/workloads/chat-8b.yaml"),
                           "--allocation", str(path), "--trace-requests", "50")
    assert code == 2, err
    assert field in err and "Traceback" not in err


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([0.3, 0.5, 1.0]), st.integers(1, 9),
       st.sampled_from([2, 4]))
def test_replica_gpus_is_the_fewest_gpus_the_exact_placement_finds(tp, share, replicas, domain):
    """The whole GPUs ``replicas`` identical replicas take (TP groups may overlap inside an
    NVLink domain) against the exact placement test on ``g`` free GPUs, for the least ``g``."""
    from scepsy_common.units import replica_gpus, replicas_per_gpu
    from scepsy_opt.allocation import Allocation, Instance
    from scepsy_place.packing.exhaustive import placeable
    from scepsy_place.packing.placement import demands
    from scepsy_place.packing.topology import Node, Topology

    if tp > domain:
        return
    dem = demands(Allocation({"m": Instance("A100-80GB", tp, share, replicas)}))

    def fits(g: int) -> bool:
        nodes = []
        for i in range(-(-g // domain)):
            free = min(domain, g - i * domain)
            used = tuple((0.0, 0.0) if k < free else (1.0, 0.0) for k in range(domain))
            nodes.append(Node(f"n{i}", "r", "A100-80GB", domain, domain, 80.0, used))
        return placeable(Topology("t", tuple(nodes)), dem)

    want = replica_gpus(replicas, tp, replicas_per_gpu(share), domain)
    assert fits(want)
    assert want == 1 or not fits(want - 1)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([0.3, 0.5, 0.6, 1.0]), st.integers(1, 12),
       st.integers(1, 3))
def test_layout_groups_uses_the_gpus_the_split_formulation_prices(tp, share, replicas, nodes):
    """A group laid out alone on nodes of 8 A100 (one NVLink domain each) takes exactly
    replica_gpus GPUs, and the placement checker finds nothing wrong with it."""
    from scepsy_common.units import replica_gpus, replicas_per_gpu
    from scepsy_opt.allocation import Allocation, Instance
    from scepsy_place.packing.check import violations
    from scepsy_place.packing.groups import layout_groups
    from scepsy_place.packing.placement import demands
    from scepsy_place.packing.topology import from_cluster

    topo = from_cluster(Cluster("c", (GPUPool("A100-80GB", nodes, 8),)))
    alloc = Allocation({"m": Instance("A100-80GB", tp, share, replicas)})
    pl = layout_groups(topo, alloc)
    need = replica_gpus(replicas, tp, replicas_per_gpu(share), 8)
    if need > 8 * nodes or (replicas * tp > 8 * nodes * replicas_per_gpu(share)):
        assert not pl.complete
        return
    assert pl.complete
    assert violations(topo, demands(alloc), pl) == []
    assert len({(s.node, g) for s in pl.slots for g in s.gpus}) == need



def test_placed_min_cost_splits_under_a_percentile_bound():
    """scepsy plan's min-cost with a p90 bound on L4 and A10 plans split LLMs too: at a bound
    the split meets with every routing, the placed plan is the split one, at the unbounded
    split's price, and reports the bound met; at a tight bound the faster type alone wins."""
    from scepsy_place.formulations.loop import plan_and_place
    from scepsy_place.packing.topology import from_cluster

    free = solve_mixed(_one_llm("llama-3-8b", 12.0), slices=8)
    for bound, split in ((1000.0, True), (25.0, False)):
        p = _one_llm("llama-3-8b", 12.0, latency_bounds={"chat": (90.0, bound)})
        res = plan_and_place(p, from_cluster(p.cluster))
        assert res.placed and "mixed" in res.compared
        assert (res.formulation == "mixed") == split
        got = res.plan.stats["latency_bounds"]["chat"]
        assert got["met"] and got["predicted_s"] <= bound
        if split:
            assert res.plan.stats["placed_cost_per_hour"] == pytest.approx(free.cost_per_hour,
                                                                          rel=REL)
            assert got["slowest_routing_s"] <= bound
