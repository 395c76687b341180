"""The per-model and one-pass paths that make thousands of LLMs cheap to set up: every LLM's
demand in one pass over the workflows (``llm_demands``), each model's capacity shapes and a
plan's serving curves computed once per distinct curve (``curve_key``), all equal to the
one-LLM-at-a-time computation they replace (exactly: the same floating-point operations)."""

from __future__ import annotations

import numpy as np
import pytest

import scepsy_opt.planning.candidates as candidates_mod
import scepsy_opt.planning.milp as milp_mod
from scepsy_common.units import gpu_units
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.planning.candidates import (
    PricedRows,
    _change_s,
    _current,
    _terms,
    curve_key,
    price,
)
from scepsy_opt.planning.instances import many_models_problem, random_problem, random_stats
from scepsy_opt.planning.milp import _llm_shapes, capacity_shapes
from scepsy_opt.planning.problem import PlanOptions
from scepsy_opt.prediction.pipeline import instance_curve, llm_demand, llm_demands
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()


@pytest.mark.parametrize(("n", "workflows", "seed"), [(5, 2, 0), (12, 4, 1), (30, 8, 2)])
def test_llm_demands_in_one_pass_equal_one_llm_at_a_time(n, workflows, seed):
    """Shared LLMs (two workflows call some), a workflow without a rate (its calls do not
    count, its longest call still does): the one-pass demands equal llm_demand exactly."""
    stats, models = random_stats(n, workflows, seed)
    rng = np.random.default_rng(seed)
    rates = {w: float(rng.choice([0.0, 0.5, 2.0])) for w in stats}
    rates[next(iter(stats))] = 1.0  # at least one workflow with a rate
    llms = sorted({m for w, st in stats.items() if rates[w] > 0 for m in st.llms})
    assert llm_demands(stats, models, rates, llms) == {
        m: llm_demand(stats, models, rates, m) for m in llms}


def test_a_problems_demands_are_the_one_pass_demands():
    p = many_models_problem(64, 128, ROOF, copies=False)
    assert dict(p.demands) == {m: llm_demand(p.stats, p.models, p.targets, m) for m in p.llms}


@pytest.mark.parametrize("memory", [None, (0.5, 1.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_capacity_shapes_per_distinct_curve_equal_the_per_llm_shapes(seed, memory, monkeypatch):
    """Each LLM's shapes equal its own computation (_llm_shapes) exactly, and the serving
    curves are computed once per distinct curve key, not once per LLM."""
    opts = PlanOptions(memory_shares=memory) if memory else PlanOptions()
    p = random_problem(24, 32, ROOF, seed=seed, options=opts)
    # LLMs whose curves are alike: many_models has 4 models over 64 LLMs
    q = many_models_problem(64, 128, ROOF, copies=False, options=opts)
    for prob in (p, q):
        calls: list[str] = []
        real = milp_mod.fitting_curves

        def counted(problem, llm, demand, real=real, calls=calls):
            calls.append(llm)
            return real(problem, llm, demand)

        monkeypatch.setattr(milp_mod, "fitting_curves", counted)
        got = capacity_shapes(prob)
        monkeypatch.setattr(milp_mod, "fitting_curves", real)
        assert got == {m: _llm_shapes(prob, m) for m in prob.llms}
        assert len(calls) == len({curve_key(prob, m) for m in prob.llms})
    # 4 models; their token means differ in the last bit by the rate mix (400 vs 399.99...)
    assert len({curve_key(q, m) for m in q.llms}) < len(q.llms) / 3


def _price_one_at_a_time(problem, allocation):
    """price() as it was: each LLM's serving curve computed for itself."""
    out = {}
    for m in problem.llms:
        inst = allocation.llms[m]
        dem = problem.demands[m]
        curve = instance_curve(dem, problem.latency, inst.gpu, inst.tp, inst.share,
                               catalog=problem.catalog, policy=problem.policy,
                               memory_share=inst.memory)
        r = np.array([float(inst.replicas)])
        mix, total, per_wf = _terms(problem, dem, curve, r)
        row = PricedRows(inst.gpu, inst.tp, inst.share, curve.mu, curve.memory.available_gib, r,
                         np.array([gpu_units(inst.tp, inst.share, inst.replicas)]), mix, total,
                         _change_s(problem, _current(problem, m), inst.gpu, inst.tp, inst.share, r,
                                   inst.memory),
                         per_wf, inst.memory)
        out[m] = row.candidate(m, 0)
    return out


def test_pricing_reuses_a_curve_across_alike_llms_with_the_same_prices(monkeypatch):
    p = many_models_problem(48, 96, ROOF, copies=False)
    shapes = capacity_shapes(p)
    alloc = Allocation({m: Instance(shapes[m][-1][0], shapes[m][-1][1], shapes[m][-1][2],
                                    1 + i % 3) for i, m in enumerate(p.llms)})
    calls = []
    real = candidates_mod.instance_curve
    monkeypatch.setattr(candidates_mod, "instance_curve",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    got = price(p, alloc)
    monkeypatch.setattr(candidates_mod, "instance_curve", real)
    assert got == _price_one_at_a_time(p, alloc)
    keys = {(curve_key(p, m), *(lambda i: (i.gpu, i.tp, i.share, i.memory))(alloc.llms[m]))
            for m in p.llms}
    assert len(calls) == len(keys) < len(p.llms)
