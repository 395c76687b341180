"""Latency SLOs per LLM (scepsy_opt.prediction.slo, docs/slo.md): the bounds, their attainment, the fewest
replicas that meet them, and plans that keep them (checked against an exhaustive oracle)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from scepsy_common.errors import InputError
from scepsy_common.search import first_true
from scepsy_opt.allocation import Allocation
from scepsy_opt.cluster import uniform_cluster
from scepsy_opt.planning.candidates import generate_candidates, slo_checks
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.milp import solve_min_latency
from scepsy_opt.planning.optimisers import check_slos, optimiser
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.prediction.pipeline import instance_curve
from scepsy_opt.prediction.slo import CallSLO, check, fewest_replicas, parse_slos, ttft_attainment
from scepsy_opt.validate.evaluate import attainment_measured
from scepsy_opt.validate.muxserve import MeasuredLLM
from scepsy_place.packing.exhaustive import combinations_by_cost, fits_budgets
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
GPU = "A100-80GB"
REL = 1e-9  # two float paths of one objective
WORKFLOW = str(REPO / "datasets" / "workflows" / "rag-beam.yaml")
CLUSTER = str(REPO / "datasets" / "clusters" / "a100-16.yaml")


# ------------------------------------------------------------------ the bounds


@pytest.mark.parametrize("kw, field", [
    ({}, "ttft_s"), ({"ttft_s": 0.0}, "ttft_s"), ({"tpot_s": -1.0}, "tpot_s"),
    ({"ttft_s": math.inf}, "ttft_s"), ({"ttft_s": True}, "ttft_s"),
    ({"ttft_s": 1.0, "ttft_percentile": 100.0}, "ttft_percentile"),
    ({"tpot_s": 0.1, "ttft_percentile": 90.0}, "ttft_percentile")])
def test_a_bad_slo_names_its_field(kw, field):
    with pytest.raises(InputError, match=field):
        CallSLO(**kw)


def test_slos_for_every_llm_merge_with_each_llms_own():
    got = parse_slos({"*": {"ttft_s": 2.0, "ttft_percentile": 90.0, "tpot_s": 0.1},
                      "b": {"ttft_s": 0.5}, "c": {"tpot_s": 0.05}}, ["a", "b", "c"])
    assert got["a"] == CallSLO(ttft_s=2.0, tpot_s=0.1, ttft_percentile=90.0)
    assert got["b"] == CallSLO(ttft_s=0.5, tpot_s=0.1)  # its own TTFT bound: on the mean
    assert got["c"] == CallSLO(ttft_s=2.0, tpot_s=0.05, ttft_percentile=90.0)
    with pytest.raises(InputError, match="zz"):
        parse_slos({"zz": {"ttft_s": 1.0}}, ["a"])
    with pytest.raises(InputError, match=r"a\.ttft_ms"):
        parse_slos({"a": {"ttft_ms": 1.0}}, ["a"])
    with pytest.raises(InputError, match=r"a\.tpot_s"):
        parse_slos({"a": {"tpot_s": -1}}, ["a"])


# ------------------------------------------------------------------ attainment


@given(floor=st.floats(0, 5), wait=st.floats(1e-3, 10), b1=st.floats(0, 50),
       b2=st.floats(0, 50), shape=st.sampled_from(["exponential", "uniform"]))
def test_ttft_attainment_is_a_distribution_function(floor, wait, b1, b2, shape):
    lo, hi = sorted((b1, b2))
    a, b = ttft_attainment(lo, floor, wait, shape), ttft_attainment(hi, floor, wait, shape)
    assert 0.0 <= a <= b <= 1.0
    assert ttft_attainment(floor - 1e-9, floor, wait, shape) == 0.0


@pytest.mark.parametrize("shape, p90", [("exponential", math.log(10.0)), ("uniform", 1.8)])
def test_the_p90_of_each_wait_is_where_ninety_percent_are_within(shape, p90):
    assert ttft_attainment(0.3 + 2.0 * p90, 0.3, 2.0, shape) == pytest.approx(0.9, rel=1e-12)


@pytest.fixture(scope="module")
def curve():
    problem = random_problem(2, 2, ROOF, seed=1, load=0.5, cluster=uniform_cluster(GPU, 2, 2))
    m = problem.llms[0]
    return instance_curve(problem.demands[m], ROOF, GPU, 1, 0.5)


@settings(max_examples=40, deadline=None)
@given(frac=st.floats(0.02, 0.97), pct=st.floats(5.0, 99.0), scale=st.floats(0.3, 3.0))
def test_a_percentile_bound_is_met_exactly_when_that_share_attains_it(curve, frac, pct, scale):
    """Oracle: two paths to one fact. The TTFT quantile (``ServingCurve.ttft_s``) and the
    attainment (the wait's distribution function) agree: the p-th percentile is within the
    bound exactly when at least p% of the calls are."""
    rate = frac * curve.mu
    q = check(CallSLO(ttft_s=1.0, ttft_percentile=pct), curve, rate).ttft_s
    bound = q * scale
    c = check(CallSLO(ttft_s=bound, ttft_percentile=pct), curve, rate)
    if abs(scale - 1.0) > 1e-6:
        assert c.met == (c.attainment >= pct / 100.0), (c, bound)
    # at the percentile itself, within a relative 1e-9 of it either way (the wait may be
    # rounding noise beside the prefill, where the distribution function is a step)
    below = check(CallSLO(ttft_s=q * (1 - 1e-9), ttft_percentile=pct), curve, rate)
    above = check(CallSLO(ttft_s=q * (1 + 1e-9), ttft_percentile=pct), curve, rate)
    assert below.attainment <= pct / 100.0 + 1e-6 and above.attainment >= pct / 100.0 - 1e-6


def test_saturation_meets_no_slo(curve):
    c = check(CallSLO(ttft_s=1e6, tpot_s=1e6), curve, curve.mu)
    assert not c.met and c.attainment == 0.0 and math.isinf(c.ttft_s)


@settings(max_examples=30, deadline=None)
@given(load=st.floats(0.5, 30.0), tight=st.floats(1.0, 3.0), start=st.integers(1, 4))
def test_fewest_replicas_is_the_first_count_that_meets_it(curve, load, tight, start):
    """Oracle: a linear scan over replica counts."""
    floor = check(CallSLO(ttft_s=1.0, tpot_s=1.0), curve, 0.0)
    slo = CallSLO(ttft_s=floor.ttft_s * tight, tpot_s=floor.tpot_s * tight)
    rate, limit = load * curve.mu, 64
    scan = next((r for r in range(start, limit + 1) if check(slo, curve, rate / r).met),
                limit + 1)
    assert fewest_replicas(slo, curve, rate, start, limit) == scan


def test_an_slo_below_the_zero_load_floor_has_no_replica_count(curve):
    floor = check(CallSLO(tpot_s=1.0), curve, 0.0).tpot_s
    assert fewest_replicas(CallSLO(tpot_s=0.9 * floor), curve, 0.1, 1, 1000) == 1001


def _measured(p90_ttft, p99_ttft, p90_tpot):
    return MeasuredLLM(1.0, 100, 0.5, 0.05, p90_ttft, p99_ttft, 10.0, 20.0, p90_tpot)


@pytest.mark.parametrize("slo, lo, hi", [
    (CallSLO(ttft_s=0.5), 0.0, 0.9), (CallSLO(ttft_s=1.0), 0.9, 0.99),
    (CallSLO(ttft_s=5.0), 0.99, 1.0), (CallSLO(tpot_s=0.2), 0.9, 1.0),
    (CallSLO(ttft_s=1.0, tpot_s=0.2), 0.8, 0.99), (CallSLO(ttft_s=5.0, tpot_s=0.01), 0.0, 0.9)])
def test_measured_attainment_is_what_the_percentiles_allow(slo, lo, hi):
    got = attainment_measured(slo, _measured(p90_ttft=1.0, p99_ttft=3.0, p90_tpot=0.1))
    assert got == pytest.approx((lo, hi), abs=1e-12)


# ------------------------------------------------------------------ plans


def _tiny(seed: int) -> PlanningProblem:
    cl = uniform_cluster(GPU, 4, 2)
    return random_problem(3, 4, ROOF, seed=seed, load=0.6, cluster=cl,
                          options=PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1, 2)))


def _binding(problem: PlanningProblem) -> PlanningProblem:
    """``problem`` with a TTFT bound on one LLM just below what its unconstrained optimum
    predicts, so that the bound binds."""
    free = solve_min_latency(problem)
    assert free.allocation is not None
    m = problem.llms[0]
    probe = replace(problem, options=replace(problem.options,
                                             slos={m: CallSLO(ttft_s=1e9, ttft_percentile=90)}))
    got = slo_checks(probe, free.allocation)[m].ttft_s
    slo = CallSLO(ttft_s=0.97 * got, ttft_percentile=90.0)
    return replace(problem, options=replace(problem.options, slos={m: slo}))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_milp_with_slos_is_the_exhaustive_optimum_among_allocations_that_meet_them(seed):
    """Oracle: every combination of the unfiltered candidates in cost order; the first within
    the GPUs whose allocation meets the SLOs (checked on the allocation, not on candidates)."""
    base = _tiny(seed)
    problem = _binding(base)
    plan = solve_min_latency(problem)
    oracle = None
    cands = generate_candidates(base, prune=False).by_llm
    for cost, choice in combinations_by_cost(cands):
        if not fits_budgets(base, choice):
            continue
        alloc = plan_allocation(choice)
        if all(c.met for c in slo_checks(problem, alloc).values()):
            oracle = cost
            break
    if oracle is None:
        assert plan.allocation is None and plan.status == "infeasible"
        return
    assert plan.allocation is not None
    assert plan.objective_s == pytest.approx(oracle + problem.constant_s, rel=REL)
    assert all(c.met for c in slo_checks(problem, plan.allocation).values())
    free = solve_min_latency(base)
    assert plan.objective_s >= free.objective_s * (1 - REL)


def plan_allocation(choice):
    return Allocation({m: c.instance for m, c in choice.items()})


def test_a_heuristic_that_misses_an_slo_is_infeasible_and_says_which():
    problem = _binding(_tiny(0))
    m = problem.llms[0]
    free = solve_min_latency(replace(problem, options=replace(problem.options, slos={})))
    checked = check_slos(problem, free)
    assert checked.status == "infeasible" and checked.allocation is None
    assert m in checked.infeasible.detail and "SLO" in checked.infeasible.detail
    assert checked.stats["slos"][m]["met"] is False
    kept = check_slos(problem, free, keep=True)
    assert kept.allocation is free.allocation and kept.stats["slos"][m]["met"] is False
    plan = optimiser("heuristic").solve(problem)
    if plan.allocation is not None:
        assert all(c.met for c in slo_checks(problem, plan.allocation).values())
    else:
        assert plan.status == "infeasible"


def test_an_slo_on_an_llm_no_workflow_calls_is_refused():
    problem = _tiny(0)
    with pytest.raises(InputError, match=r"slos\.nobody"):
        replace(problem, options=replace(problem.options,
                                         slos={"nobody": CallSLO(ttft_s=1.0)}))


# ------------------------------------------------------------------ the command line


def _plan(tmp_path, *extra):
    out = tmp_path / "p.json"
    code, stdout, stderr = run_cli("plan", "--workflow", WORKFLOW, "--cluster", CLUSTER,
                                   "--target", "0.6", "--trace-requests", "300", "--quiet",
                                   "--out", str(out), *extra)
    return code, stdout, stderr, out


def test_plan_keeps_the_slos_and_reports_them(tmp_path):
    code, stdout, _, out = _plan(tmp_path, "--ttft-slo", "90:0.12",
                                 "--tpot-slo", "generator=0.02")
    assert code == 0
    slos = json.loads(out.read_text())["solver"]["slos"]
    assert set(slos) == {"generator", "prm", "reranker", "rewriter"}
    assert slos["generator"]["tpot_s"] == 0.02 and slos["generator"]["ttft_percentile"] == 90
    for c in slos.values():
        assert c["met"] and c["predicted_ttft_s"] <= c["ttft_s"] and c["attainment"] >= 0.9
    assert "SLO generator: ttft p90 <= 0.12 s, tpot <= 0.02 s" in stdout


def test_an_slo_below_every_shape_is_infeasible_and_says_so(tmp_path):
    code, _, stderr, out = _plan(tmp_path, "--tpot-slo", "generator=0.001")
    assert code == 1  # infeasible
    assert "generator's SLO (tpot <= 0.001 s) is beyond every instance shape" in stderr
    assert json.loads(out.read_text())["status"] == "infeasible"


@pytest.mark.parametrize("argv, message", [
    (("--ttft-slo", "fast"), "--ttft-slo: expected [LLM=]SECONDS or [LLM=]PCT:SECONDS"),
    (("--tpot-slo", "generator=0"), "--tpot-slo: expected [LLM=]SECONDS with seconds > 0"),
    (("--ttft-slo", "120:1"), "--ttft-slo: expected PCT:SECONDS"),
    (("--tpot-slo", "g=0.1", "--tpot-slo", "g=0.2"), "one bound for LLM g"),
    (("--ttft-slo", "=1"), "--ttft-slo: expected an LLM name before '='"),
    (("--tpot-slo", "nobody=0.1"), "nobody")])
def test_bad_slo_flags_exit_2_and_write_nothing(tmp_path, argv, message):
    code, _, stderr, out = _plan(tmp_path, *argv)
    assert code == 2 and message in stderr and "Traceback" not in stderr
    assert not out.exists()


@given(threshold=st.integers(0, 300), start=st.integers(1, 100), limit=st.integers(0, 250))
def test_first_true_is_the_first_count_a_monotone_predicate_holds(threshold, start, limit):
    """Oracle: a linear scan (the search behind fewest_replicas and unoverloaded_replicas)."""
    calls = []

    def ok(n: int) -> bool:
        calls.append(n)
        return n >= threshold
    want = next((n for n in range(start, limit + 1) if ok(n)), limit + 1)
    calls.clear()
    assert first_true(ok, start, limit) == want
    assert len(calls) <= 2 * max(1, limit - start + 1).bit_length() + 2


@pytest.mark.parametrize("objective", ["max-throughput", "min-cost", "min-latency"])
def test_every_objective_keeps_the_slos(tmp_path, objective):
    """Whatever formulation wins (auto compares them), the placed plan meets every SLO."""
    code, _, err, out = _plan(tmp_path, "--ttft-slo", "90:0.2", "--objective", objective)
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["solver"]["slos"] and all(c["met"] for c in doc["solver"]["slos"].values())
