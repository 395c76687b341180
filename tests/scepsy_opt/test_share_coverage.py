"""Shares outside the profiled range (scepsy_opt.planning.coverage, ``--shares-within-profile``).

MuxServe measured 30% to 100% of an A100's SMs, so the bundled curves know nothing below share
0.3, while the optimiser's grid goes down to 0.1. Oracles: the curves' own share nodes (the
measured range, computed here independently of ``measured_shares``), the roofline model (no
measured range: its instances keep the whole grid), and the plans themselves: with the flag no
share of a measured instance lies outside its range and the problem still solves; without it the
plan picks shares below 0.3 and every one of them, and only those, is reported (in the plan's
``llms`` section, plan.json and ``scepsy plan``'s output).
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy.cli import main
from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.cluster import Cluster, GPUPool, uniform_cluster
from scepsy_opt.planning.candidates import generate_candidates, shape_groups
from scepsy_opt.planning.coverage import ShareExtrapolation, extrapolated_shares, profiled_shares
from scepsy_opt.planning.milp import MILPOptimiser, capacity_shapes
from scepsy_opt.planning.planfile import plan_to_dict
from scepsy_opt.planning.problem import TENTHS, PlanningProblem, PlanOptions
from scepsy_opt.stats import CallClass, LLMStats, WorkflowStats
from scepsy_profile import (
    CompositeLatencyModel,
    FittedLatencyModel,
    load_curves,
    measured_shares,
    roofline_model,
)
from scepsy_profile.fitted import CurveTable
from scepsy_serve.launch.planfile import parse_plan

REPO = Path(__file__).resolve().parents[2]
CURVES_FILE = REPO / "datasets" / "profiles" / "muxserve-a100-curves.json"
MUX = REPO / "datasets" / "workloads" / "muxserve-a100.yaml"
A100_4 = REPO / "datasets" / "clusters" / "a100-4.yaml"
A100, H100 = "A100-80GB", "H100-80GB"
LENGTHS = {"llama-7b": (300.0, 180.0), "llama-13b": (400.0, 200.0),
           "llama-30b": (400.0, 200.0), "llama-65b": (400.0, 200.0)}
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True)
TOL = 1e-9


@cache
def curves() -> FittedLatencyModel:
    return load_curves(CURVES_FILE)


@cache
def latency() -> CompositeLatencyModel:
    """The bundled MuxServe curves where they cover an instance, the roofline elsewhere."""
    return CompositeLatencyModel(curves(), roofline_model())


def node_range(model: FittedLatencyModel, name: str, gpu: str, tp: int) -> tuple[float, float] | None:
    """The measured shares straight from the share nodes of the curves stored at exactly
    ``tp`` (None where there are none: the composite falls back to the roofline)."""
    nodes = [t.share_nodes for (m, g, t_, _), t in model.curves.items()
             if (m, g, t_) == (name, gpu, tp)]
    if len(nodes) < 2:
        return None
    return max(float(n[0]) for n in nodes), min(float(n[-1]) for n in nodes)


def sliced(lo: float, hi: float) -> FittedLatencyModel:
    """The bundled curves measured only at their share nodes within [lo, hi] (the lattice cut
    down to those nodes): a curves set with another measured range."""
    out = {}
    for key, t in curves().curves.items():
        keep = (t.share_nodes >= lo - TOL) & (t.share_nodes <= hi + TOL)
        out[key] = CurveTable(t.model, t.gpu, t.tp, t.phase, t.batch_nodes, t.token_nodes,
                              t.share_nodes[keep], t.values[:, :, keep], t.batch_elasticity,
                              t.token_elasticity, t.share_elasticity, t.n_points, t.source)
    return FittedLatencyModel(curves=out)


def one_call_stats(llms: dict[str, str]) -> dict[str, WorkflowStats]:
    """Every LLM a workflow of its own, one call per request (a rate workload), with
    ShareGPT-like mean lengths per model."""
    stats = {}
    for name, model in llms.items():
        i, o = LENGTHS[model]
        cls = CallClass(name, None, 1.0, i, 0.0, o, 0.0, 0.0)
        llm = LLMStats(llm=name, n=1.0, p=1.0, rounds=1.0, critical_calls=1.0, critical_s=1.0,
                       input_mean=i, input_std=0.0, output_mean=o, output_std=0.0,
                       classes=(cls,), time_share=0.0, time_share_cv_requests=0.0,
                       time_share_cv_halves=0.0, mean_call_s=1.0)
        stats[name] = WorkflowStats(
            workflow=name, requests=1, llms=MappingProxyType({name: llm}), latency_mean_s=0.0,
            latency_p50_s=0.0, latency_p90_s=0.0, latency_p99_s=0.0, latency_cv=0.0,
            calls_per_request_cv=0.0, tool_time_mean_s=0.0, tool_critical_s=0.0,
            llm_overlap=0.0)
    return stats


def problem(llms: dict[str, str], rates: dict[str, float], cluster: Cluster,
            lat=None, **options) -> PlanningProblem:
    return PlanningProblem(one_call_stats(llms), dict(llms), rates, cluster, lat or latency(),
                           PlanOptions(**options))


# MuxServe's four-LLM workload (datasets/workloads/muxserve-a100.yaml) on four A100s: light
# loads, so the full grid's plan runs LLMs on 10-20% of the SMs
MUX4 = {"llama-7b-a": "llama-7b", "llama-7b-b": "llama-7b", "llama-13b": "llama-13b",
        "llama-30b": "llama-30b"}
MUX4_RATES = {"llama-7b-a": 6.0, "llama-7b-b": 2.0, "llama-13b": 1.5, "llama-30b": 0.5}
# sixteen LLMs in MuxServe's proportions (4 x 7B, 6 x 13B, 3 x 30B, 3 x 65B), Zipf rates, on
# one A100 node (measured curves) and one H100 node (the roofline)
MIX16 = dict(zip([f"m{j:02d}" for j in range(16)],
                 ["llama-7b"] * 4 + ["llama-13b"] * 6 + ["llama-30b"] * 3 + ["llama-65b"] * 3,
                 strict=True))
MIX16_RATES = {m: round(4.0 / (j + 1) ** 0.9, 3) for j, m in enumerate(MIX16)}
MIXED16 = Cluster("a100-h100-16", (GPUPool(A100, 1, 8), GPUPool(H100, 1, 8)))


def outside(p: PlanningProblem, alloc: Allocation) -> set[str]:
    """The LLMs of ``alloc`` whose share lies outside their instance's node range."""
    out = set()
    for m, inst in alloc.llms.items():
        rng = node_range(curves(), p.models[m], inst.gpu, inst.tp) \
            if curves().covers(p.models[m], inst.gpu, inst.tp) else None
        if rng is not None and not rng[0] - TOL <= inst.share <= rng[1] + TOL:
            out.add(m)
    return out


# --------------------------------------------------------------------------- the grid


@PROPERTY
@given(lo=st.sampled_from([0.3, 0.4, 0.5, 0.6]), hi=st.sampled_from([0.7, 0.8, 0.9, 1.0]),
       grid=st.sets(st.integers(1, 1000), min_size=1, max_size=12),
       tp=st.sampled_from([1, 2, 4, 8]), flag=st.booleans())
def test_profiled_shares_are_the_grid_within_the_measured_range(lo, hi, grid, tp, flag) -> None:
    lat = sliced(lo, hi)
    shares = sorted(g / 1000 for g in grid)
    p = problem(MUX4, MUX4_RATES, uniform_cluster(A100, 8, 8), lat, shares=tuple(shares),
                shares_within_profile=flag)
    assert measured_shares(lat, "llama-7b", A100, tp) == (lo, hi)
    got = profiled_shares(p, "llama-7b-a", A100, tp, shares)
    assert got == ([s for s in shares if lo - TOL <= s <= hi + TOL] if flag else shares)
    # an instance the curves do not cover (TP 8 of llama-30b: measured 2 and 4) keeps the grid
    assert profiled_shares(p, "llama-30b", A100, 8, shares) == shares


@PROPERTY
@given(grid=st.sets(st.integers(1, 1000), min_size=1, max_size=12), tp=st.sampled_from([1, 2]))
def test_roofline_instances_keep_the_whole_grid(grid, tp) -> None:
    """The roofline is a model, not a measurement: no measured range, every share covered."""
    shares = sorted(g / 1000 for g in grid)
    p = problem(MUX4, MUX4_RATES, uniform_cluster(H100, 8, 8), shares=tuple(shares),
                shares_within_profile=True)
    assert measured_shares(p.latency, "llama-7b", H100, tp) is None
    assert profiled_shares(p, "llama-7b-a", H100, tp, shares) == shares
    assert profiled_shares(p, "llama-30b", H100, tp, shares) == shares


def test_shape_groups_and_candidates_stay_within_the_range() -> None:
    """Per (gpu, tp): measured instances lose exactly the shares below 0.3, roofline ones (the
    H100s, llama-30b at TP 1 on an A100) keep the grid; every candidate follows."""
    base = problem(MUX4, MUX4_RATES, MIXED16)
    within = dataclasses.replace(base, options=dataclasses.replace(base.options,
                                                                   shares_within_profile=True))
    roofline_kept = 0
    for m in base.llms:
        full, cut = shape_groups(base, m), shape_groups(within, m)
        for (gpu, tp), shares in full.items():
            rng = node_range(curves(), base.models[m], gpu, tp) \
                if curves().covers(base.models[m], gpu, tp) else None
            want = [s for s in shares if rng is None or rng[0] - TOL <= s <= rng[1] + TOL]
            assert cut.get((gpu, tp), []) == want, (m, gpu, tp)
            roofline_kept += rng is None and 0.1 in want
    assert roofline_kept  # the roofline's instances did keep shares below 0.3
    cands = generate_candidates(within)
    assert all(c.gpu == H100 or c.share >= 0.3 - TOL or not curves().covers(
        base.models[c.llm], c.gpu, c.tp) for cs in cands.by_llm.values() for c in cs)
    full = generate_candidates(base)
    assert any(c.gpu == A100 and c.share < 0.3 for cs in full.by_llm.values() for c in cs)
    for m, shp in capacity_shapes(within).items():  # max-throughput's shapes
        for gpu, tp, share, *_ in shp:
            if curves().covers(within.models[m], gpu, tp):
                assert share >= 0.3 - TOL, (m, gpu, tp, share)


def test_the_option_is_a_boolean() -> None:
    with pytest.raises(InputError) as info:
        PlanOptions(shares_within_profile="yes")  # type: ignore[arg-type]
    assert info.value.field == "shares_within_profile"
    assert PlanOptions().shares_within_profile is False


# --------------------------------------------------------------------------- the report


@PROPERTY
@given(lo=st.sampled_from([0.3, 0.4, 0.5]), hi=st.sampled_from([0.6, 0.8, 1.0]),
       picks=st.lists(st.tuples(st.sampled_from(TENTHS), st.sampled_from([1, 2, 4])),
                      min_size=4, max_size=4))
def test_the_report_names_exactly_the_shares_outside_the_range(lo, hi, picks) -> None:
    lat = sliced(lo, hi)
    p = problem(MUX4, MUX4_RATES, uniform_cluster(A100, 8, 8), lat)
    llms = sorted(MUX4)
    alloc = Allocation({m: Instance(A100, tp if MUX4[m] != "llama-30b" else 2, s, 1)
                        for m, (s, tp) in zip(llms, picks, strict=True)})
    got = extrapolated_shares(p, alloc)
    want = {m for m, inst in alloc.llms.items() if not lo - TOL <= inst.share <= hi + TOL}
    assert set(got) == want
    for m, e in got.items():
        inst = alloc.llms[m]
        assert isinstance(e, ShareExtrapolation)
        assert (e.llm, e.model, e.gpu, e.tp, e.share) == (m, MUX4[m], A100, inst.tp, inst.share)
        assert (e.measured_min, e.measured_max) == (lo, hi)
        assert e.side == ("below" if inst.share < lo else "above")
        assert e.to_dict() == {"share": inst.share, "measured_min": lo, "measured_max": hi}
        assert f"share {inst.share:g}, {e.side}" in e.message()
    assert extrapolated_shares(p, None) == {}
    # the roofline alone measures nothing: nothing is extrapolated
    roof = dataclasses.replace(p, latency=roofline_model())
    assert extrapolated_shares(roof, alloc) == {}


# --------------------------------------------------------------------------- plans


@cache
def mux4_plan(obj: str, within: bool):
    p = problem(MUX4, MUX4_RATES, uniform_cluster(A100, 4, 4), objective=obj,
                shares_within_profile=within, time_limit_s=60)
    return p, MILPOptimiser().solve(p)


@pytest.mark.parametrize("obj", ["min-latency", "max-throughput"])
def test_without_the_flag_a_plan_below_the_profile_is_reported(obj) -> None:
    p, plan = mux4_plan(obj, False)
    assert plan.status == "optimal" and plan.allocation is not None
    below = {m for m, i in plan.allocation.llms.items() if i.share < 0.3}
    assert below  # the full grid's plan does use shares MuxServe never measured
    assert set(extrapolated_shares(p, plan.allocation)) == outside(p, plan.allocation) == below
    doc = json.loads(json.dumps(plan_to_dict(p, plan, timings=False)))
    for m, row in doc["llms"].items():
        if m in below:
            assert row["extrapolated_share"] == {"share": row["share"], "measured_min": 0.3,
                                                 "measured_max": 1.0}
        else:
            assert "extrapolated_share" not in row
    parse_plan(doc, "plan.json")  # the format's models accept it
    bad = json.loads(json.dumps(doc))
    m = sorted(below)[0]
    bad["llms"][m]["extrapolated_share"]["share"] = 0.9
    with pytest.raises(InputError) as info:
        parse_plan(bad, "plan.json")
    assert info.value.field == f"llms.{m}.extrapolated_share.share"


@pytest.mark.parametrize("obj", ["min-latency", "max-throughput"])
def test_with_the_flag_the_plan_stays_within_the_profile_and_solves(obj) -> None:
    p, plan = mux4_plan(obj, True)
    assert plan.status == "optimal" and plan.allocation is not None
    assert all(i.share >= 0.3 - TOL for i in plan.allocation.llms.values())
    assert outside(p, plan.allocation) == set() and extrapolated_shares(p, plan.allocation) == {}
    # the restriction costs something here: the full grid's plan is strictly better
    _, full = mux4_plan(obj, False)
    if obj == "min-latency":
        assert plan.objective_s > full.objective_s
    else:
        assert 0 < plan.scale < full.scale


@cache
def mix16_plan(obj: str, within: bool, targets_scale: float = 1.0):
    p = problem(MIX16, {m: r * targets_scale for m, r in MIX16_RATES.items()}, MIXED16,
                objective=obj, shares_within_profile=within, time_limit_s=60)
    return p, MILPOptimiser().solve(p)


def test_sixteen_llms_solve_within_the_profile() -> None:
    """The reported failure: a grid cut to shares >= 0.3 everywhere made max-throughput on 16
    LLMs run out of time. Cut per instance (the H100s are priced by the roofline and keep the
    grid) both objectives solve, with no share outside a measured range."""
    for obj in ("max-throughput", "min-latency"):
        p, plan = mix16_plan(obj, True)
        assert plan.status == "optimal" and plan.allocation is not None, (obj, plan.status)
        assert outside(p, plan.allocation) == set()
        assert extrapolated_shares(p, plan.allocation) == {}
        for m, inst in plan.allocation.llms.items():
            if inst.gpu == A100 and curves().covers(p.models[m], A100, inst.tp):
                assert inst.share >= 0.3 - TOL
    p, full = mix16_plan("min-latency", False)
    assert full.status == "optimal" and full.allocation is not None
    assert set(extrapolated_shares(p, full.allocation)) == outside(p, full.allocation)
    assert mix16_plan("min-latency", True)[1].objective_s >= full.objective_s * (1 - 1e-9)


# --------------------------------------------------------------------------- the command line


def _plan_cli(tmp_path: Path, capsys, *flags: str) -> tuple[str, dict]:
    out = tmp_path / "plan.json"
    code = main(["plan", "--workflow", str(MUX), "--cluster", str(A100_4), "--curves",
                 str(CURVES_FILE), "--trace-requests", "300", "--quiet", "--no-timings",
                 "--out", str(out), *flags])
    assert code == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.out  # warnings go to stderr, the tables to stdout
    return captured.err, json.loads(out.read_text())


def test_scepsy_plan_warns_of_extrapolated_shares_and_the_flag_avoids_them(tmp_path,
                                                                           capsys) -> None:
    text, doc = _plan_cli(tmp_path, capsys)
    prefix = "scepsy: warning: "
    warned = {ln.removeprefix(prefix).split()[0] for ln in text.splitlines()
              if ln.startswith(prefix)}
    below = {m for m, row in doc["llms"].items() if row["share"] < 0.3}
    assert below and warned == below == {m for m, row in doc["llms"].items()
                                         if "extrapolated_share" in row}
    for m in below:
        assert f"{prefix}{m} runs at share {doc['llms'][m]['share']:g}, below" in text
    text, doc = _plan_cli(tmp_path, capsys, "--shares-within-profile")
    assert "warning:" not in text
    assert all(row["share"] >= 0.3 and "extrapolated_share" not in row
               for row in doc["llms"].values())
    assert doc["status"] == "optimal"
