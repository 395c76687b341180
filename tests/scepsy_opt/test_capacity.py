"""One capacity for every caller: an LLM's load (``pipeline.llm_load``) against ``r·μ``.

The reproducer: one LLM on 2 A100s shared by a workflow with call concurrency 1 and one with
concurrency 4. Its calls arrive at ``λ`` but the request-level station (``pipeline``) saturates
at ``Λ·p̄ = 1.5625·λ``: candidates, pricing, max-scale, the baselines and the predictor's
throughput must all use the larger figure, so that no accepted candidate has an infinite
latency, min-latency is feasible exactly up to the max scale, and no plan with an infinite
latency is called optimal. The oracles: the station's own latency (finite or not) and an
exhaustive search over every allocation of tiny instances.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from types import MappingProxyType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.units import UNITS, gpu_units
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.cluster import Cluster, GPUPool, uniform_cluster
from scepsy_opt.planning.baselines import UserAllocation, capacity_scale
from scepsy_opt.planning.candidates import generate_candidates, price, shape_groups
from scepsy_opt.planning.milp import max_scale, solve_max_throughput, solve_min_latency
from scepsy_opt.planning.optimisers import optimiser
from scepsy_opt.planning.plans import plan_from_choice, workflow_latencies
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.prediction.pipeline import (
    class_latencies,
    instance_curve,
    instance_curves,
    llm_demand,
    llm_load,
    min_replicas,
    predict,
    utilisation,
)
from scepsy_opt.stats import CallClass, LLMStats, WorkflowStats
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
GPU = "A100-80GB"
EPS = 1e-6  # relative step past (or short of) a capacity in the oracle checks
FAST = settings(derandomize=True, deadline=None, database=None, max_examples=12)


def llm_stats(name: str, n: float, p: float, slowest: float = 1.0, i: float = 800.0,
              o: float = 120.0) -> LLMStats:
    """``n`` calls per request in groups of ``p``; the critical path holds ``n/p`` groups, each
    ``slowest`` mean calls long (the slowest-of-the-group factor κ)."""
    crit = slowest * n / p
    return LLMStats(llm=name, n=n, p=p, rounds=n / p, critical_calls=n / p, critical_s=crit,
                    input_mean=i, input_std=0.0, output_mean=o, output_std=0.0,
                    classes=(CallClass(name, None, n, i, 0.0, o, 0.0, 0.0),), time_share=0.0,
                    time_share_cv_requests=0.0, time_share_cv_halves=0.0, mean_call_s=1.0)


def workflow(name: str, llms: dict[str, LLMStats]) -> WorkflowStats:
    return WorkflowStats(workflow=name, requests=1, llms=MappingProxyType(llms), latency_mean_s=0.0,
                         latency_p50_s=0.0, latency_p90_s=0.0, latency_p99_s=0.0, latency_cv=0.0,
                         calls_per_request_cv=0.0, tool_time_mean_s=0.0, tool_critical_s=0.0,
                         llm_overlap=0.0)


def shared_problem(**options: object) -> PlanningProblem:
    """The reproducer: one qwen2.5-7b on 2 A100s; workflow ``one`` calls it once per request,
    ``four`` four times at once; equal call rates (1 call/s each at these targets)."""
    stats = {"one": workflow("one", {"m": llm_stats("m", 1.0, 1.0)}),
             "four": workflow("four", {"m": llm_stats("m", 4.0, 4.0)})}
    return PlanningProblem(stats, {"m": "qwen2.5-7b"}, {"one": 1.0, "four": 0.25},
                           uniform_cluster(GPU, 2, 2), ROOF, PlanOptions(**options))  # type: ignore[arg-type]


def test_the_shared_llm_is_loaded_beyond_its_call_rate():
    dem = llm_demand(*_parts(shared_problem()), "m")
    assert dem.rate == pytest.approx(2.0, rel=1e-12)
    # Λ = 1·1 + 0.25·1 critical-path calls/s; p̄ = (1 call/s·1 + 1 call/s·4)/2 = 2.5
    assert dem.critical_rate == pytest.approx(1.25, rel=1e-12)
    assert llm_load(dem) == pytest.approx(1.25 * 2.5, rel=1e-12)
    assert llm_load(dem, "paper") == dem.rate


def _parts(problem: PlanningProblem) -> tuple:
    return problem.stats, problem.models, problem.targets


def test_min_latency_is_feasible_exactly_up_to_the_max_scale():
    """The reproducer: below the max scale min-latency finds a finite optimum; above it it is
    infeasible and says the cluster carries less than the targets (it once reported infeasible
    with a max scale of 1.11, and accepted candidates priced at infinite latency)."""
    unit = shared_problem()
    s, _, status = max_scale(unit)
    assert status == "optimal" and s > 0
    for f in (0.5, 0.9, 1 - EPS):
        plan = solve_min_latency(unit.scaled(s * f))
        assert plan.status == "optimal" and math.isfinite(plan.objective_s), f
        assert all(math.isfinite(c.latency_s) for c in plan.candidates.values())
    for f in (1 + EPS, 1.1):
        plan = solve_min_latency(unit.scaled(s * f))
        assert plan.status == "infeasible" and plan.infeasible is not None
        assert plan.infeasible.reason == "gpus"
        assert plan.infeasible.max_scale == pytest.approx(1 / f, rel=1e-9)
        assert plan.infeasible.max_scale < 1


@pytest.mark.parametrize("name", ["milp", "brute-force", "heuristic", "independent", "equal-split"])
def test_max_throughput_plans_have_finite_latency(name):
    """Max-throughput once returned status optimal with objective inf: the capacity optimum was
    priced at a load its replicas cannot carry."""
    unit = shared_problem(objective="max-throughput")
    s = max_scale(unit)[0]
    plan = optimiser(name).solve(unit)
    assert plan.feasible and math.isfinite(plan.objective_s)
    at = unit.scaled(plan.scale)
    assert all(math.isfinite(v) for v in workflow_latencies(at, plan).values())
    assert plan.scale <= s * (1 + 1e-9)
    if name in ("milp", "brute-force"):
        assert plan.status == "optimal" and plan.scale == pytest.approx(s, rel=1e-9)
        assert capacity_scale(unit)[0] == pytest.approx(s, rel=1e-9)


def _saturating_allocation(unit: PlanningProblem) -> tuple[PlanningProblem, Allocation]:
    """Targets and one replica that carry the calls at 80% of μ but the station at 125%."""
    dem = llm_demand(*_parts(unit), "m")
    curve = instance_curve(dem, ROOF, GPU, 1, 0.5)
    problem = unit.scaled(0.8 * curve.mu / dem.rate)
    return problem, Allocation({"m": Instance(GPU, 1, 0.5, 1)})


def test_a_saturated_choice_is_never_optimal():
    problem, alloc = _saturating_allocation(shared_problem())
    priced = price(problem, alloc)
    assert math.isinf(priced["m"].latency_s)
    plan = plan_from_choice(problem, "test", "optimal", priced, {})
    assert plan.status == "infeasible" and not plan.feasible
    assert plan.infeasible is not None and plan.infeasible.reason == "gpus"
    assert plan.infeasible.max_scale == pytest.approx(0.95 / 1.25, rel=1e-9)
    assert plan.infeasible.bottleneck == "m"


def test_a_user_allocation_that_carries_the_calls_but_not_the_requests_is_infeasible():
    problem, alloc = _saturating_allocation(shared_problem())
    plan = UserAllocation(alloc).solve(problem)
    assert plan.status == "infeasible" and plan.infeasible is not None
    assert plan.infeasible.max_scale == pytest.approx(0.95 / 1.25, rel=1e-9)


def test_predicted_max_throughput_is_where_the_latency_turns_infinite():
    unit = shared_problem()
    alloc = Allocation({"m": Instance(GPU, 1, 0.5, 3)})
    pred = predict(unit.stats, unit.models, alloc, ROOF, dict(unit.targets))
    f = pred.workflows["one"].max_throughput / unit.targets["one"]
    assert pred.workflows["four"].max_throughput == pytest.approx(f * unit.targets["four"], rel=1e-12)
    for g, finite in ((1 - EPS, True), (1 + EPS, False)):
        rates = {w: t * f * g for w, t in unit.targets.items()}
        at = predict(unit.stats, unit.models, alloc, ROOF, rates)
        assert all(math.isfinite(w.mean_latency_s) == finite for w in at.workflows.values())
        assert (at.llms["m"].utilisation < 1) == finite


def test_calls_off_the_critical_path_still_load_the_instance():
    """Two calls per request, a quarter of their time on the critical path (they overlap other
    work): the station's work Λ·p is below the call rate, yet no replica carries more than μ
    calls/s. Beyond it the latency is infinite (it was finite, or the serving curve refused the
    rate), and the predicted throughput stops there."""
    off = llm_stats("m", 2.0, 1.0)
    off = LLMStats(**{**off.__dict__, "critical_s": 0.5, "critical_calls": 0.5})
    stats = {"w": workflow("w", {"m": off})}
    models = {"m": "qwen2.5-7b"}
    dem = llm_demand(stats, models, {"w": 1.0}, "m")
    assert dem.critical_rate * dem.group < dem.rate and llm_load(dem) == dem.rate
    alloc = Allocation({"m": Instance(GPU, 1, 0.5, 1)})
    mu = instance_curve(dem, ROOF, GPU, 1, 0.5).mu
    top = predict(stats, models, alloc, ROOF, {"w": 1.0}).workflows["w"].max_throughput
    assert top == pytest.approx(mu / 2.0, rel=1e-12)
    for g, finite in ((0.5, True), (1 - EPS, True), (1 + EPS, False), (1.2, False)):
        at = predict(stats, models, alloc, ROOF, {"w": top * g}).workflows["w"]
        assert math.isfinite(at.mean_latency_s) == finite, g


def test_min_replicas_is_the_fewest_that_carry_the_load():
    for load, mu, u in ((3.125, 1.0, 0.95), (0.95, 1.0, 0.95), (1e-9, 5.0, 0.5), (7.0, 0.7, 0.9999)):
        r = min_replicas(load, mu, u)
        assert utilisation(load, mu, r) <= u
        assert r == 1 or utilisation(load, mu, r - 1) > u


# --------------------------------------------------------------------------- random tiny problems

MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b")


@st.composite
def tiny_problems(draw: st.DrawFn) -> PlanningProblem:
    """One or two LLMs shared by two workflows of different concurrency, on one or two GPU types
    of one node each (1-3 GPUs), shares {0.5, 1}, TP {1, 2}: small enough for exhaustive search."""
    names = ["a", "b"][:draw(st.integers(1, 2))]
    stats = {}
    for w in ("w1", "w2"):
        llms = {}
        for m in names:
            if w == "w1" or draw(st.booleans()) or not llms:
                n = draw(st.sampled_from([1.0, 2.0, 4.0]))
                p = min(n, draw(st.sampled_from([1.0, 2.0, 4.0])))
                llms[m] = llm_stats(m, n, p, slowest=draw(st.sampled_from([1.0, 1.3])),
                                    i=draw(st.sampled_from([200.0, 900.0])),
                                    o=draw(st.sampled_from([30.0, 200.0])))
        stats[w] = workflow(w, llms)
    models = {m: draw(st.sampled_from(MODELS)) for m in names}
    types = draw(st.sampled_from([("A100-80GB",), ("H100-80GB",), ("A100-80GB", "H100-80GB")]))
    cluster = Cluster("tiny", tuple(GPUPool(g, 1, draw(st.integers(1, 3))) for g in types))
    targets = {"w1": draw(st.sampled_from([0.5, 1.0, 2.0])), "w2": draw(st.sampled_from([0.5, 1.0]))}
    opts = PlanOptions(shares=(0.5, 1.0), tps=(1, 2))
    return PlanningProblem(stats, models, targets, cluster, ROOF, opts)


def _station_finite(problem: PlanningProblem) -> dict[str, list[tuple[str, int, bool]]]:
    """Per LLM, every (gpu, units, latency finite?) of every shape and replica count within its
    type's budget: the station's own answer, no capacity formula involved."""
    budgets = problem.cluster.budgets()
    out: dict[str, list[tuple[str, int, bool]]] = {}
    for m in problem.llms:
        dem = llm_demand(*_parts(problem), m)
        rows = []
        for (gpu, tp), shares in shape_groups(problem, m).items():
            for curve in instance_curves(dem, ROOF, gpu, tp, shares):
                if not curve.feasible:
                    continue
                per = gpu_units(tp, curve.share)
                reps = np.arange(1, budgets[gpu] * UNITS // per + 1, dtype=float)
                if not len(reps):
                    continue
                mix, _ = class_latencies(dem, curve, ROOF, reps)
                rows += [(gpu, per * int(r), bool(np.isfinite(x))) for r, x in zip(reps, mix, strict=True)]
        out[m] = rows
    return out


def _any_finite_within_budget(problem: PlanningProblem) -> bool:
    """Exhaustive: is there an allocation within the budgets whose every LLM's latency is finite?"""
    budgets = {g: n * UNITS for g, n in problem.cluster.budgets().items()}
    rows = _station_finite(problem)
    options = [[(g, u) for g, u, ok in rows[m] if ok] for m in problem.llms]
    for combo in itertools.product(*options):
        used: dict[str, int] = {}
        for g, u in combo:
            used[g] = used.get(g, 0) + u
        if all(v <= budgets[g] for g, v in used.items()):
            return True
    return False


@FAST
@given(problem=tiny_problems(), factor=st.sampled_from([0.3, 0.9, 1 - EPS]))
def test_every_generated_candidate_has_finite_latency(problem, factor):
    s = max_scale(problem)[0]
    if s <= 0:
        return
    at = problem.scaled(s * factor)
    cset = generate_candidates(at, prune=False)
    for m, cands in cset.by_llm.items():
        assert cands, m  # below the max scale every LLM has a candidate within the budget
        for c in cands:
            assert math.isfinite(c.latency_s) and math.isfinite(c.call_latency_s), c
            assert all(math.isfinite(v) for _, v in c.workflow_latency_s)
    assert solve_min_latency(at).status == "optimal"


@FAST
@given(problem=tiny_problems())
def test_max_scale_is_where_the_station_saturates(problem):
    """Exhaustive oracle on tiny problems: the max-scale allocation has finite latency at its
    scale; at (1 + ε) × the scale at which utilisation would be 1 (``s/u``), no allocation
    within the budgets has a finite latency, and at (1 + ε) × s min-latency is infeasible."""
    s, choice, _ = max_scale(problem)
    assume_fit = s > 0
    if not assume_fit:
        assert not _any_finite_within_budget(problem.scaled(1e-9))
        return
    u = problem.options.max_utilisation
    at = problem.scaled(s)
    alloc = Allocation({m: c.instance for m, c in choice.items()})
    assert all(math.isfinite(c.latency_s) for c in price(at, alloc).values())
    assert _any_finite_within_budget(problem.scaled(s / u * (1 - EPS)))
    assert not _any_finite_within_budget(problem.scaled(s / u * (1 + EPS)))
    assert solve_min_latency(problem.scaled(s * (1 + EPS))).status == "infeasible"
    mt = solve_max_throughput(replace(problem, options=replace(problem.options,
                                                               objective="max-throughput")))
    assert mt.status == "optimal" and math.isfinite(mt.objective_s)
