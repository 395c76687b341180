"""What an infeasible plan says about the GPUs: which types bind, and what one more GPU adds.

``binding`` lists the GPU types whose extra capacity raises the max scale (tested by doubling
that type's budget alone), and ``gain_per_gpu`` how much one more GPU of each raises it. The
oracle: an exhaustive max-scale search over every (shape, replicas) of every LLM on tiny
two-type clusters, with each budget doubled or grown by one GPU.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.units import UNITS, gpu_units
from scepsy_opt.cluster import Cluster, GPUPool
from scepsy_opt.planning.candidates import shape_groups, units_by_gpu
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.milp import GAIN_REL, max_scale, solve_min_latency
from scepsy_opt.planning.planfile import dumps, plan_to_dict
from scepsy_opt.planning.plans import Infeasibility
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.prediction.pipeline import instance_curves, llm_demand, llm_load
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
FAST = settings(derandomize=True, deadline=None, database=None, max_examples=10)


def oracle_max_scale(problem: PlanningProblem, budgets: dict[str, int]) -> float:
    """The largest fraction of the targets some allocation within ``budgets`` (GPUs per type)
    carries at ``max_utilisation``: every (shape, replicas) of every LLM, every combination
    (per LLM and type only the largest scale for each GPU use, which loses nothing)."""
    u = problem.options.max_utilisation
    options = []
    for m in problem.llms:
        load = llm_load(llm_demand(problem.stats, problem.models, problem.targets, m))
        best: dict[tuple[str, int], float] = {}
        for (gpu, tp), shares in shape_groups(problem, m).items():
            for curve in instance_curves(llm_demand(problem.stats, problem.models,
                                                    problem.targets, m), ROOF, gpu, tp, shares):
                if not curve.feasible:
                    continue
                per = gpu_units(tp, curve.share)
                for r in range(1, budgets[gpu] * UNITS // per + 1):
                    key = (gpu, per * r)
                    best[key] = max(best.get(key, 0.0), u * r * curve.mu / load)
        options.append([(g, units, s) for (g, units), s in best.items()])
    top = 0.0
    for combo in itertools.product(*options):
        used: dict[str, int] = {}
        for g, units, _ in combo:
            used[g] = used.get(g, 0) + units
        if all(v <= budgets[g] * UNITS for g, v in used.items()):
            top = max(top, min(s for _, _, s in combo))
    return top


def _diagnosis(problem: PlanningProblem) -> Infeasibility:
    plan = solve_min_latency(problem)
    assert plan.status == "infeasible" and plan.infeasible is not None
    return plan.infeasible


def test_a_type_in_use_whose_budget_does_not_bind_is_not_binding():
    """1 node of 8 H100s plus 1 A100: the max-scale allocation uses the whole A100, but a
    second A100 does not raise the max scale; more H100s do."""
    cl = Cluster("h8a1", (GPUPool("H100-80GB", 1, 8), GPUPool("A100-80GB", 1, 1)))
    problem = random_problem(3, 9, ROOF, seed=21, workflows=1, load=1.5, cluster=cl)
    s, choice, _ = max_scale(problem)
    assert units_by_gpu(choice.values())["A100-80GB"] == 1000
    info = _diagnosis(problem)
    assert info.max_scale == pytest.approx(s, rel=1e-12) and s < 1
    assert max_scale(problem, budgets={"H100-80GB": 8, "A100-80GB": 2})[0] <= s * (1 + GAIN_REL)
    assert info.binding == ("H100-80GB",)
    nine = max_scale(problem, budgets={"H100-80GB": 9, "A100-80GB": 1})[0]
    assert dict(info.gain_per_gpu) == pytest.approx({"A100-80GB": 0.0, "H100-80GB": nine - s},
                                                    rel=1e-12)
    assert info.gain_per_gpu["H100-80GB"] > 0
    assert "more H100-80GB GPUs raise it" in info.detail and "A100-80GB +0x" not in info.detail


def test_an_unused_type_that_would_raise_the_scale_is_binding():
    """The max-scale allocation leaves the one A100 idle, yet a second one raises the scale."""
    cl = Cluster("h8a1", (GPUPool("H100-80GB", 1, 8), GPUPool("A100-80GB", 1, 1)))
    problem = random_problem(3, 9, ROOF, seed=0, workflows=1, load=1.5, cluster=cl)
    s, choice, _ = max_scale(problem)
    assert "A100-80GB" not in units_by_gpu(choice.values())
    info = _diagnosis(problem)
    assert "A100-80GB" in info.binding
    two = max_scale(problem, budgets={"H100-80GB": 8, "A100-80GB": 2})[0]
    assert info.gain_per_gpu["A100-80GB"] == pytest.approx(two - s, rel=1e-12)
    assert info.gain_per_gpu["A100-80GB"] > 0


def test_plan_json_carries_the_gain_per_gpu():
    cl = Cluster("h8a1", (GPUPool("H100-80GB", 1, 8), GPUPool("A100-80GB", 1, 1)))
    problem = random_problem(3, 9, ROOF, seed=21, workflows=1, load=1.5, cluster=cl)
    plan = solve_min_latency(problem)
    doc = json.loads(dumps(plan_to_dict(problem, plan, timings=False)))
    assert doc["infeasible"]["binding"] == ["H100-80GB"]
    assert set(doc["infeasible"]["gain_per_gpu"]) == {"A100-80GB", "H100-80GB"}
    assert doc["infeasible"]["gain_per_gpu"]["A100-80GB"] == 0.0


MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b")


@st.composite
def two_type_problems(draw: st.DrawFn) -> PlanningProblem:
    """Two LLMs on an A100 node and an H100 node of 1-3 GPUs each, targets beyond the cluster."""
    seed = draw(st.integers(0, 10_000))
    cl = Cluster("tiny", (GPUPool("A100-80GB", 1, draw(st.integers(1, 3))),
                          GPUPool("H100-80GB", 1, draw(st.integers(1, 3)))))
    opts = PlanOptions(shares=draw(st.sampled_from([(0.5, 1.0), (0.3, 1.0)])), tps=(1, 2))
    problem = random_problem(2, cl.total_gpus, ROOF, seed=seed, workflows=draw(st.integers(1, 2)),
                             cluster=cl, options=opts)
    return problem.scaled(draw(st.sampled_from([2.0, 5.0])))


@FAST
@given(problem=two_type_problems())
def test_binding_and_gains_match_the_exhaustive_max_scale(problem):
    budgets = problem.cluster.budgets()
    base = oracle_max_scale(problem, budgets)
    if not 0 < base < 1:
        return
    info = _diagnosis(problem)
    assert info.max_scale == pytest.approx(base, rel=1e-9)
    want_binding, want_gain = [], {}
    for g in sorted(budgets):
        doubled = oracle_max_scale(problem, {**budgets, g: 2 * budgets[g]})
        one = oracle_max_scale(problem, {**budgets, g: budgets[g] + 1})
        if doubled > base * (1 + GAIN_REL):
            want_binding.append(g)
        want_gain[g] = one - base
    assert info.binding == tuple(want_binding)
    assert set(info.gain_per_gpu) == set(budgets)
    for g, gain in want_gain.items():
        assert math.isclose(info.gain_per_gpu[g], gain, rel_tol=1e-9, abs_tol=1e-9 * base), g


def test_a_one_type_cluster_binds_with_the_exhaustive_gain():
    """A one-type cluster: its type binds and one more GPU's gain is the exhaustive one."""
    cl = Cluster("a2", (GPUPool("A100-80GB", 1, 2),))
    opts = PlanOptions(shares=(0.5, 1.0), tps=(1, 2))
    problem = random_problem(2, 2, ROOF, seed=3, workflows=1, cluster=cl, options=opts).scaled(3.0)
    base = oracle_max_scale(problem, {"A100-80GB": 2})
    info = _diagnosis(problem)
    assert info.binding == ("A100-80GB",)
    assert info.gain_per_gpu["A100-80GB"] == pytest.approx(
        oracle_max_scale(problem, {"A100-80GB": 3}) - base, rel=1e-9, abs=1e-12)
    assert "one more GPU: A100-80GB +" in info.detail
