"""Every registered optimiser against one contract, the MILP against the brute-force oracle,
metamorphic relations, infeasibility diagnosis and max-throughput mode."""

from __future__ import annotations

import dataclasses
import math
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_common.units import UNITS
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.cluster import Cluster, GPUPool, uniform_cluster
from scepsy_opt.planning.baselines import BruteForce, Independent, UserAllocation, capacity_scale
from scepsy_opt.planning.candidates import changed_replicas, generate_candidates, price
from scepsy_opt.planning.instances import random_problem, random_stats
from scepsy_opt.planning.optimisers import OPTIMISERS, optimiser
from scepsy_opt.planning.plans import Plan, plan_from_choice, workflow_latencies
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.prediction.pipeline import instance_curve, llm_demand
from scepsy_profile.catalog import default_catalog
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
optimiser("milp")  # fills the registry
NAMES = sorted(n for n in OPTIMISERS if n != "user")
BASELINES = [n for n in NAMES if n not in ("milp", "brute-force")]
STATUS = {"milp": {"optimal"}, "brute-force": {"optimal"}, "user": {"evaluated"}}
TINY = PlanOptions(shares=(0.5, 1.0), tps=(1, 2))
HET = Cluster("a100-l4", (GPUPool("A100-80GB", 1, 2), GPUPool("L4", 1, 2)))
REL = 1e-9
FAST = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])



def _with_tool_time(problem: PlanningProblem, seconds: float) -> PlanningProblem:
    stats = {w: dataclasses.replace(s, tool_critical_s=seconds) for w, s in problem.stats.items()}
    return dataclasses.replace(problem, stats=stats)


@cache
def problem(key: str) -> PlanningProblem:
    """The shared suite's problems."""
    if key == "uniform":
        return random_problem(3, 4, ROOF, seed=1)
    if key == "hetero":
        return random_problem(3, 4, ROOF, seed=2, cluster=HET)
    if key == "weighted":  # two workflows, weights, tool time on the path
        p = random_problem(4, 8, ROOF, seed=5, workflows=2,
                           options=PlanOptions(weights={"wf00": 2.0, "wf01": 0.5}))
        return _with_tool_time(p, 0.25)
    if key == "replan":  # re-planning from a running allocation
        p = problem("uniform")
        cur = solved("uniform", "independent").allocation
        assert cur is not None
        return dataclasses.replace(p, options=dataclasses.replace(p.options, current=cur,
                                                                  change_penalty_s=0.05))
    raise KeyError(key)


PROBLEMS = ("uniform", "hetero", "weighted", "replan")


@cache
def solved(key: str, name: str) -> Plan:
    if name == "user":
        return UserAllocation(solved(key, "milp").allocation).solve(problem(key))
    return optimiser(name).solve(problem(key))


def _units(inst: Instance) -> int:
    return round(inst.tp * inst.share * UNITS) * inst.replicas


def _fits(p: PlanningProblem, alloc: Allocation) -> bool:
    used: dict[str, int] = {}
    for inst in alloc.llms.values():
        used[inst.gpu] = used.get(inst.gpu, 0) + _units(inst)
    return all(u <= p.cluster.budgets().get(g, 0) * UNITS for g, u in used.items())


def _carries(p: PlanningProblem, alloc: Allocation) -> bool:
    """Every LLM's replicas carry its load at max_utilisation (independent of the optimisers)."""
    for m in p.llms:
        inst = alloc.llms[m]
        dem = llm_demand(p.stats, p.models, p.targets, m)
        curve = instance_curve(dem, p.latency, inst.gpu, inst.tp, inst.share)
        if not curve.feasible or dem.rate > p.options.max_utilisation * inst.replicas * curve.mu * (1 + REL):
            return False
    return True


def _close(a: float, b: float, rel: float = REL) -> bool:
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b))


def _same(a: Plan, b: Plan) -> bool:
    return (a.status, a.allocation, a.objective_s, a.scale, dict(a.candidates), a.infeasible) == \
           (b.status, b.allocation, b.objective_s, b.scale, dict(b.candidates), b.infeasible)


def check_plan(p: PlanningProblem, plan: Plan, name: str) -> None:
    """The contract every optimiser's plan meets."""
    assert isinstance(plan, Plan) and plan.optimiser == name
    if not plan.feasible:
        assert plan.status == "infeasible" and math.isinf(plan.objective_s)
        assert plan.infeasible is not None and plan.infeasible.reason in ("memory", "gpus")
        return
    assert plan.status in STATUS.get(name, {"heuristic"})
    alloc = plan.allocation
    assert alloc is not None and set(alloc.llms) == set(p.llms) == set(plan.candidates)
    cat = default_catalog()
    for m, inst in alloc.llms.items():
        assert plan.candidates[m].instance == inst
        assert inst.tp <= p.cluster.max_tp(inst.gpu) and cat.model(p.models[m]).supports_tp(inst.tp)
    assert _fits(p, alloc)
    assert _carries(p, alloc)
    # priced exactly like the MILP's candidates
    again = plan_from_choice(p, name, plan.status, price(p, alloc), {})
    assert _close(plan.objective_s, again.objective_s, 1e-12)
    # ... and like the predictor: weighted workflow latencies plus change penalties
    lat = workflow_latencies(p, plan)
    cur = p.options.current
    change = (p.options.change_penalty_s * sum(changed_replicas(i, cur.llms.get(m))
                                               for m, i in alloc.llms.items()) if cur else 0.0)
    assert _close(plan.objective_s, math.fsum(p.weight(w) * v for w, v in lat.items()) + change)
    assert plan.bound_s <= plan.objective_s * (1 + REL) and plan.gap >= 0


# --------------------------------------------------------------------------- the shared suite


@pytest.mark.parametrize("key", PROBLEMS)
@pytest.mark.parametrize("name", [*NAMES, "user"])
def test_every_optimiser_meets_the_plan_contract(name, key):
    p = problem(key)
    plan = solved(key, name)
    check_plan(p, plan, name)
    assert plan.feasible or name in BASELINES  # the exact ones and the MILP's own allocation
    again = solved.__wrapped__(key, name)  # deterministic: a fresh solve gives the same plan
    assert _same(plan, again)


@pytest.mark.parametrize("key", PROBLEMS)
def test_milp_is_never_worse_than_any_baseline(key):
    best = solved(key, "milp")
    assert best.feasible
    for name in [*NAMES, "user"]:
        other = solved(key, name)
        if other.feasible:
            assert best.objective_s <= other.objective_s * (1 + REL), name
    assert _close(best.objective_s, solved(key, "brute-force").objective_s)
    assert solved(key, "user").objective_s == best.objective_s


def test_the_paper_heuristic_is_close_and_beats_the_naive_splits_here():
    """Not a guarantee, a sanity check on the shared problems: the heuristic is within 5% of the
    optimum, no worse than either naive split, and its reported bound is a true lower bound."""
    for key in PROBLEMS:
        opt, heur = solved(key, "milp").objective_s, solved(key, "heuristic")
        assert heur.feasible and heur.objective_s <= 1.05 * opt
        assert heur.bound_s <= opt * (1 + REL) and heur.gap > 0
        for naive in ("independent", "equal-split"):
            assert heur.objective_s <= solved(key, naive).objective_s * (1 + REL)


@settings(FAST, max_examples=15)
@given(n=st.integers(1, 4), gpus=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_baselines_are_feasible_and_never_beat_the_milp(n, gpus, seed):
    p = random_problem(n, gpus, ROOF, seed=seed)
    best = optimiser("milp").solve(p)
    for name in BASELINES:
        plan = optimiser(name).solve(p)
        check_plan(p, plan, name)
        if plan.feasible:
            assert best.feasible and best.objective_s <= plan.objective_s * (1 + REL)


def _with_llm_stats(p: PlanningProblem, **changes) -> PlanningProblem:
    """Every LLM's statistics changed per LLM: ``changes[field] = {llm: value}``."""
    stats = {}
    for w, st_ in p.stats.items():
        llms = {m: dataclasses.replace(s, **{f: v[m] for f, v in changes.items() if m in v})
                for m, s in st_.llms.items()}
        stats[w] = dataclasses.replace(st_, llms=llms)
    return dataclasses.replace(p, stats=stats)


def test_independent_by_time_share_splits_the_budget_by_the_traced_shares():
    p = problem("uniform")
    llms = p.llms
    shares = {m: float(j + 1) for j, m in enumerate(llms)}
    q = _with_llm_stats(p, time_share=shares)
    opt = Independent(by="time")
    slices = opt.slices(q, generate_candidates(q).by_llm)
    total = sum(shares.values())
    for m in llms:
        assert slices[m]["A100-80GB"] == math.floor(4 * UNITS * shares[m] / total)
    plan = opt.solve(q)
    check_plan(q, plan, "independent")
    # no traced shares (all zero): the split falls back to the minimum-GPU units
    assert Independent(by="time").solve(p).allocation == solved("uniform", "independent").allocation


def test_the_heuristic_copes_with_an_llm_off_the_critical_path():
    """An LLM whose calls are never on the critical path costs nothing; it still gets its
    minimum and the plan stays feasible."""
    p = problem("uniform")
    q = _with_llm_stats(p, critical_s={p.llms[0]: 0.0}, critical_calls={p.llms[0]: 0.0})
    for name in NAMES:
        plan = optimiser(name).solve(q)
        check_plan(q, plan, name)
    assert optimiser("heuristic").solve(q).feasible


# --------------------------------------------------------------------------- the oracle


def _agree(p: PlanningProblem) -> tuple[Plan, Plan]:
    exact = optimiser("milp").solve(p)
    oracle = BruteForce().solve(p)
    assert exact.feasible == oracle.feasible
    if exact.feasible:
        assert _close(exact.objective_s, oracle.objective_s), (exact.objective_s, oracle.objective_s)
        assert _fits(p, oracle.allocation) and _carries(p, oracle.allocation)
    else:
        assert oracle.infeasible is not None and exact.infeasible is not None
        assert oracle.infeasible.reason == exact.infeasible.reason
    return exact, oracle


@FAST
@given(n=st.integers(1, 4), gpus=st.integers(1, 8), seed=st.integers(0, 10**6),
       load=st.sampled_from([0.3, 0.6, 0.9]))
def test_milp_equals_brute_force(n, gpus, seed, load):
    _agree(random_problem(n, gpus, ROOF, seed=seed, load=load))


@settings(FAST, max_examples=10)
@given(n=st.integers(1, 3), a=st.integers(1, 4), b=st.integers(1, 4), seed=st.integers(0, 10**6),
       other=st.sampled_from(["L4", "H100-80GB", "A100-40GB"]))
def test_milp_equals_brute_force_on_two_gpu_types(n, a, b, seed, other):
    cluster = Cluster("mixed", (GPUPool("A100-80GB", 1, a), GPUPool(other, 1, b)))
    _agree(random_problem(n, a + b, ROOF, seed=seed, cluster=cluster))


def test_milp_is_exact_below_the_solver_tolerance():
    """A two-type instance where HiGHS's default tolerances leave 9e-7 s on the table."""
    cluster = Cluster("mixed", (GPUPool("A100-80GB", 1, 4), GPUPool("L4", 1, 2)))
    p = random_problem(3, 6, ROOF, seed=653539, cluster=cluster)
    exact, oracle = optimiser("milp").solve(p), BruteForce().solve(p)
    assert _close(exact.objective_s, oracle.objective_s)


@settings(FAST, max_examples=10)
@given(n=st.integers(1, 3), gpus=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_pruning_is_exact(n, gpus, seed):
    p = random_problem(n, gpus, ROOF, seed=seed, options=TINY)
    pruned, full = BruteForce().solve(p), BruteForce(prune=False).solve(p)
    assert pruned.feasible == full.feasible
    if full.feasible:
        assert pruned.objective_s == full.objective_s
        assert full.stats["candidates_kept"] >= pruned.stats["candidates_kept"]


@pytest.mark.parametrize("n,gpus,seed", [(3, 4, 2), (4, 8, 0)])
def test_pruning_is_exact_on_the_full_grid(n, gpus, seed):
    p = random_problem(n, gpus, ROOF, seed=seed)
    pruned, full = BruteForce().solve(p), BruteForce(prune=False).solve(p)
    assert full.stats["candidates_kept"] > pruned.stats["candidates_kept"]
    assert pruned.objective_s == full.objective_s
    assert _close(full.objective_s, optimiser("milp").solve(p).objective_s)


def test_brute_force_breaks_ties_towards_fewer_gpus_and_refuses_huge_products():
    p = random_problem(2, 4, ROOF, seed=0, options=TINY)
    pruned, full = BruteForce().solve(p), BruteForce(prune=False).solve(p)
    # among the cheapest allocations, the fewest GPU units: the same with or without pruning
    assert pruned.objective_s == full.objective_s
    assert pruned.allocation.gpus() == full.allocation.gpus()
    assert full.stats["nodes"] >= 1
    with pytest.raises(InputError, match="combinations"):
        BruteForce(max_product=1).solve(random_problem(2, 2, ROOF, seed=0))


# --------------------------------------------------------------------------- metamorphic relations


class ScaledLatency:
    """A latency model ``c`` times slower (or faster) than ``base``."""

    def __init__(self, base, c: float) -> None:
        self.base, self.c = base, c

    def prefill_ms(self, model, gpu, tp, share, batch, seq):
        return self.c * self.base.prefill_ms(model, gpu, tp, share, batch, seq)

    def decode_ms(self, model, gpu, tp, share, batch, ctx):
        return self.c * self.base.decode_ms(model, gpu, tp, share, batch, ctx)

    def covers(self, model, gpu, tp):
        return self.base.covers(model, gpu, tp)


@FAST
@given(n=st.integers(1, 4), gpus=st.integers(1, 6), more=st.integers(1, 4),
       seed=st.integers(0, 10**6))
def test_more_gpus_are_never_worse(n, gpus, more, seed):
    p = random_problem(n, gpus, ROOF, seed=seed, load=0.8)
    big = dataclasses.replace(p, cluster=uniform_cluster("A100-80GB", gpus + more))
    small_plan, big_plan = optimiser("milp").solve(p), optimiser("milp").solve(big)
    if small_plan.feasible:
        assert big_plan.feasible and big_plan.objective_s <= small_plan.objective_s * (1 + REL)


@FAST
@given(n=st.integers(1, 4), gpus=st.integers(1, 8), seed=st.integers(0, 10**6),
       factor=st.floats(0.05, 0.95), two=st.booleans())
def test_lower_targets_are_never_worse(n, gpus, seed, factor, two):
    p = random_problem(n, gpus, ROOF, seed=seed, workflows=2 if two and n > 1 else 1)
    high, low = optimiser("milp").solve(p), optimiser("milp").solve(p.scaled(factor))
    if high.feasible:
        assert low.feasible and low.objective_s <= high.objective_s * (1 + REL)


@settings(FAST, max_examples=8)
@given(n=st.integers(1, 4), gpus=st.integers(1, 8), seed=st.integers(0, 10**6),
       c=st.floats(0.25, 4.0))
def test_scaling_every_latency_scales_the_objective(n, gpus, seed, c):
    """Latencies × c and targets / c: every instance's utilisation is unchanged and every
    latency (service and queueing) is c times longer; with no tool time the objective is c×."""
    p = random_problem(n, gpus, ROOF, seed=seed)
    assert p.constant_s == 0
    q = dataclasses.replace(p.scaled(1 / c), latency=ScaledLatency(ROOF, c))
    a, b = optimiser("milp").solve(p), optimiser("milp").solve(q)
    assert a.feasible == b.feasible
    if a.feasible:
        assert _close(b.objective_s, c * a.objective_s, 1e-6)


@pytest.mark.parametrize("name", ["milp", "brute-force"])
@pytest.mark.parametrize("key", ["uniform", "hetero"])
def test_replanning_from_the_optimum_changes_nothing(name, key):
    p = problem(key)
    best = solved(key, name)
    q = dataclasses.replace(p, options=dataclasses.replace(p.options, current=best.allocation,
                                                           change_penalty_s=0.5))
    plan = optimiser(name).solve(q)
    assert plan.allocation == best.allocation
    assert all(c.change_s == 0 for c in plan.candidates.values())
    assert _close(plan.objective_s, best.objective_s)


def test_a_change_penalty_keeps_the_running_allocation_when_it_is_large():
    p = problem("replan")
    cur = p.options.current
    sticky = dataclasses.replace(p, options=dataclasses.replace(p.options, change_penalty_s=1e6))
    plan = optimiser("milp").solve(sticky)
    assert plan.allocation == cur
    assert optimiser("brute-force").solve(sticky).allocation == cur


# --------------------------------------------------------------------------- infeasibility


def _single(model: str, cluster: Cluster, options: PlanOptions | None = None,
            extra: str | None = None) -> PlanningProblem:
    stats, _ = random_stats(2 if extra else 1, 1, seed=0)
    models = {"llm000": model, **({"llm001": extra} if extra else {})}
    return PlanningProblem(stats, models, {"wf00": 0.1}, cluster, ROOF, options or PlanOptions())


MEMORY = [
    _single("llama-3-70b", uniform_cluster("L4", 1)),
    _single("llama-3-70b", uniform_cluster("A10", 2), PlanOptions(tps=(1,))),
    _single("llama-3-70b", uniform_cluster("L4", 2), extra="qwen2.5-0.5b"),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", range(len(MEMORY)))
def test_a_model_that_fits_nowhere_is_a_memory_infeasibility(name, case):
    p = MEMORY[case]
    plan = optimiser(name).solve(p)
    check_plan(p, plan, name)
    assert plan.status == "infeasible" and plan.infeasible.reason == "memory"
    assert plan.infeasible.bottleneck == "llm000" and "llm000" in plan.infeasible.binding
    assert plan.infeasible.max_scale == 0 and plan.scale == 0


def test_a_user_allocation_that_does_not_fit_in_memory():
    p = MEMORY[0]
    plan = UserAllocation(Allocation({"llm000": Instance("L4", 1, 1.0, 1)})).solve(p)
    assert plan.status == "infeasible" and plan.infeasible.reason == "memory"


@pytest.mark.parametrize("name", NAMES)
def test_targets_beyond_the_cluster_report_how_far_it_goes(name):
    p = random_problem(2, 2, ROOF, seed=0).scaled(40.0)
    plan = optimiser(name).solve(p)
    check_plan(p, plan, name)
    info = plan.infeasible
    assert plan.status == "infeasible" and info.reason == "gpus"
    assert 0 < info.max_scale < 1
    for w, t in p.targets.items():
        assert _close(info.max_throughput[w], info.max_scale * t)
    # just below the reported maximum, the exact optimisers find an allocation
    below = p.scaled(0.99 * info.max_scale)
    assert optimiser("milp").solve(below).feasible and BruteForce().solve(below).feasible
    # ... and above it nobody does
    assert not BruteForce().solve(p.scaled(1.01 * info.max_scale)).feasible


def test_a_user_allocation_that_cannot_carry_the_load():
    p = problem("uniform")
    alloc = solved("uniform", "milp").allocation
    plan = UserAllocation(alloc).solve(p.scaled(10.0))
    info = plan.infeasible
    assert plan.status == "infeasible" and info.reason == "gpus" and 0 < info.max_scale < 1
    ok = UserAllocation(alloc).solve(p.scaled(10.0 * 0.99 * info.max_scale))
    assert ok.status == "evaluated"
    assert not UserAllocation(alloc).solve(p.scaled(10.0 * 1.01 * info.max_scale)).feasible


def test_a_user_allocation_over_the_budget_or_wrong():
    p = problem("uniform")
    big = Allocation({m: Instance("A100-80GB", 1, 1.0, 3) for m in p.llms})  # 9 of 4 GPUs
    plan = UserAllocation(big).solve(p)
    assert plan.status == "infeasible" and plan.infeasible.reason == "gpus"
    assert plan.infeasible.binding == ("A100-80GB",)
    with pytest.raises(InputError, match="allocation"):
        UserAllocation().solve(p)
    with pytest.raises(InputError, match="llms"):
        UserAllocation(Allocation({"nobody": Instance("A100-80GB", 1, 1.0)})).solve(p)
    with pytest.raises(InputError, match="tp"):
        UserAllocation(Allocation({m: Instance("A100-80GB", 3, 1.0) for m in p.llms})).solve(p)
    assert isinstance(optimiser("user"), UserAllocation)  # the registry builds one with no args
    with pytest.raises(InputError, match="by"):
        Independent(by="size")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- max-throughput


def _max_tput(p: PlanningProblem, **kw) -> PlanningProblem:
    return dataclasses.replace(p, options=dataclasses.replace(p.options, objective="max-throughput",
                                                              **kw))


def _min_lat(p: PlanningProblem) -> PlanningProblem:
    return dataclasses.replace(p, options=dataclasses.replace(p.options, objective="min-latency"))


@pytest.mark.parametrize("n,gpus,seed", [(1, 1, 0), (2, 2, 0), (2, 4, 2), (3, 4, 1)])
def test_max_throughput_equals_a_brute_force_search_over_the_scale(n, gpus, seed):
    p = _max_tput(random_problem(n, gpus, ROOF, seed=seed, options=TINY))
    oracle = BruteForce().solve(p)
    s = oracle.scale
    assert oracle.status == "optimal" and s > 0
    assert _close(s, capacity_scale(p)[0])
    # the bracket of a bisection with brute-force min-latency solves
    assert BruteForce().solve(_min_lat(p).scaled(s * (1 - 1e-6))).feasible
    assert not BruteForce().solve(_min_lat(p).scaled(s * (1 + 1e-6))).feasible
    exact = optimiser("milp").solve(p)
    assert exact.feasible and _close(exact.scale, s, 1e-6)
    # the plans are priced at the scale they reach
    for plan in (exact, oracle):
        q = _min_lat(p).scaled(plan.scale * (1 - 1e-9))
        assert _carries(q, plan.allocation) and _fits(q, plan.allocation)
    assert oracle.objective_s <= exact.objective_s * (1 + REL)  # min latency at that scale


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_in_max_throughput_mode_stay_below_the_optimum(name):
    p = _max_tput(random_problem(2, 2, ROOF, seed=0, options=TINY))
    s = BruteForce().solve(p).scale
    plan = optimiser(name).solve(p)
    assert plan.feasible and 0 < plan.scale <= s * (1 + REL)
    q = _min_lat(p).scaled(plan.scale)
    assert _carries(q, plan.allocation) and _fits(q, plan.allocation)


@pytest.mark.parametrize("tight", [0.9, 1.1])
@pytest.mark.parametrize("name", ["brute-force", "heuristic", "milp"])
def test_max_throughput_within_a_latency_bound(name, tight):
    p = _max_tput(random_problem(2, 2, ROOF, seed=0, options=TINY))
    free = BruteForce().solve(p)
    at = workflow_latencies(_min_lat(p).scaled(free.scale * (1 - 1e-9)), free)
    bound = {w: tight * v for w, v in at.items()}
    q = _max_tput(p, latency_bound_s=bound)
    plan = optimiser(name).solve(q)
    assert plan.feasible and 0 < plan.scale <= free.scale * (1 + REL)
    if tight >= 1:  # the bound does not bind
        assert _close(plan.scale, free.scale, 1e-4)
    lat = workflow_latencies(_min_lat(p).scaled(plan.scale), plan)
    assert all(lat[w] <= bound[w] * (1 + REL) for w in bound)
    oracle = BruteForce().solve(q)
    assert plan.scale <= oracle.scale * (1 + 2e-4)
    if name != "heuristic":
        assert _close(plan.scale, oracle.scale, 2e-4)


def test_user_allocation_in_max_throughput_mode():
    p = random_problem(2, 2, ROOF, seed=0, options=TINY)
    best = BruteForce().solve(_max_tput(p))
    plan = UserAllocation(best.allocation).solve(_max_tput(p))
    assert plan.status == "evaluated" and _close(plan.scale, best.scale, 1e-6)
    assert _close(plan.objective_s, best.objective_s, 1e-6)


# ----------------------------------------------------------------- reduced-cost fixing (exact)

@FAST
@given(n=st.integers(1, 4), gpus=st.integers(1, 8), seed=st.integers(0, 10**6),
       load=st.sampled_from([0.3, 0.6, 0.9]))
def test_reduced_cost_fixing_keeps_the_brute_force_optimum(n, gpus, seed, load):
    p = random_problem(n, gpus, ROOF, seed=seed, load=load, options=PlanOptions(reduce=True))
    _agree(p)


@pytest.mark.parametrize(("n", "gpus", "seed"), [(6, 64, 1), (10, 128, 2), (8, 96, 3)])
def test_reduced_cost_fixing_equals_the_full_candidate_milp(n, gpus, seed):
    from scepsy_opt.planning.milp import reduced_candidates, solve_min_latency

    p = random_problem(n, gpus, ROOF, seed=seed)
    full = generate_candidates(p)
    reduced = reduced_candidates(p)
    assert reduced.kept < full.kept  # it removes candidates ...
    a, b = solve_min_latency(p, full), solve_min_latency(p, reduced)
    assert a.status == b.status == "optimal"
    assert _close(a.objective_s, b.objective_s)  # ... and never the optimum
    # every candidate it kept is a real candidate of the full set
    for m, cands in reduced.by_llm.items():
        assert set(cands) <= set(full.by_llm[m])
