"""The typed plan request (scepsy_place.request): the CLI's plan options are generated from its
fields, impossible combinations fail validation naming the field, and plan.json records the
request, which the same model reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from scepsy import api
from scepsy_common.errors import InputError
from scepsy_common.flags import FORMS
from scepsy_opt.planning.optimisers import OPTIMISERS
from scepsy_place.packing.placement import PLACERS
from scepsy_place.request import (
    HierarchicalPlacement,
    PlanRequest,
    SimplePlacement,
    flag_fields,
    flag_names,
)
from scepsy_serve.launch.planfile import parse_plan

RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
A4 = str(REPO / "datasets" / "clusters" / "a100-4.yaml")
INPUTS = {"workflow": RAG, "cluster": A4, "targets": 1.0}


def test_every_flag_is_a_field_with_help_and_a_known_form() -> None:
    fields = flag_fields()
    names = [f.flag.name for f in fields]
    assert len(set(names)) == len(names)
    code, out, _ = run_cli("plan", "--help")
    assert code == 0
    for f in fields:
        assert f.flag.form in FORMS and f.help, f
        for name in (f.flag.name, *f.flag.also):
            assert name in out, name  # generated, with its help
    # every field of a request path names its option for error messages
    assert set(flag_names()) >= {f.path[-1] for f in fields}


def test_the_placement_union_covers_every_registered_placer() -> None:
    simple = set(SimplePlacement.model_fields["placer"].annotation.__args__)
    assert simple | {"hierarchical"} == set(PLACERS)
    # a placer's options are the registry's: only the hierarchical one has improve/repack
    extra = set(HierarchicalPlacement.model_fields) - set(SimplePlacement.model_fields)
    assert extra == set(PLACERS.entry("hierarchical").supports["option"])


@pytest.mark.parametrize(("data", "field"), [
    ({"objective": {"latency_bound_s": 2.0}}, "latency_bound_s"),  # min-latency has no bound
    ({"objective": {"kind": "max-throughput", "prices": {"A100-80GB": 1.0}}}, "prices"),
    ({"placement": {"placer": "ffd", "repack": 2}}, "repack"),
    ({"placement": {"placer": "blocks", "improve": False}}, "improve"),
    ({"placement": {"placer": "nope"}}, "placer"),
    ({"search": {"optimiser": "heuristic", "formulation": "patterns"}}, "formulation"),
    ({"search": {"optimiser": "user"}}, "optimiser"),
    ({"search": {"change_penalty_s": 1.0}}, "change_penalty_s"),
    ({"search": {"options": {"nonsense": 1}}}, "nonsense"),
    ({"inputs": {**INPUTS, "peak_quantile": 0.5}}, "peak_quantile"),
    ({"inputs": {**INPUTS, "arrivals": "a.txt"}}, "arrivals"),
])
def test_impossible_combinations_fail_naming_the_field(data: dict, field: str) -> None:
    with pytest.raises(InputError) as err:
        PlanRequest.of({"inputs": INPUTS, **data})
    assert field in (err.value.field, err.value.source), err.value


@pytest.mark.parametrize(("argv", "flag"), [
    (("--latency-bound", "2"), "--latency-bound"),
    (("--objective", "max-throughput", "--price", "A100-80GB=1"), "--price"),
    (("--placer", "ffd", "--repack", "1"), "--repack"),
    (("--optimiser", "user"), "--optimiser"),
])
def test_the_cli_refuses_them_naming_the_option(tmp_path: Path, argv, flag) -> None:
    out = tmp_path / "plan.json"
    code, _, err = run_cli("plan", "--workflow", RAG, "--cluster", A4, "--target", "1",
                           "--quiet", "--out", str(out), *argv)
    assert code == 2 and err.startswith(f"scepsy: error: {flag}: expected"), err
    assert not out.exists()


objectives = st.one_of(
    st.just({"kind": "min-latency"}),
    st.builds(lambda b: {"kind": "max-throughput", "latency_bound_s": b},
              st.none() | st.floats(0.1, 10)),
    st.builds(lambda b, p: {"kind": "min-cost", "latency_bound_s": b, "prices": p},
              st.none() | st.floats(0.1, 10),
              st.none() | st.dictionaries(st.sampled_from(["A100-80GB", "H100"]),
                                          st.floats(0, 10), min_size=1)))
placements = st.one_of(
    st.builds(lambda s, i, r: {"placer": "hierarchical", "spread_replicas": s, "improve": i,
                               "repack": r}, st.booleans(), st.booleans(), st.integers(0, 3)),
    st.builds(lambda p, s: {"placer": p, "spread_replicas": s},
              st.sampled_from(["ffd", "best-fit", "blocks"]), st.booleans()))
searches = st.builds(
    lambda o, tps, t: {"optimiser": o, "tps": tps, "time_limit_s": t},
    st.sampled_from([o for o in OPTIMISERS if o != "user"]),
    st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=4, unique=True).map(tuple),
    st.floats(0.5, 100))


@settings(max_examples=60, deadline=None)
@given(objectives, placements, searches, st.integers(0, 9))
def test_a_recorded_request_reads_back_as_itself(objective, placement, search, seed) -> None:
    req = PlanRequest.of({"inputs": {**INPUTS, "seed": seed}, "objective": objective,
                          "placement": placement, "search": search})
    rec = req.record()
    assert json.loads(json.dumps(rec)) == rec  # JSON values only
    again = PlanRequest.of(rec)
    assert again.record() == rec and again == req


def test_cli_and_api_build_the_same_request_and_plan_json_keeps_it(tmp_path) -> None:
    out = tmp_path / "plan.json"
    argv = ("--workflow", RAG, "--cluster", A4, "--target", "1", "--trace-requests", "60",
            "--formulation", "blocks", "--tp", "1,2", "--placer", "best-fit",
            "--spread-replicas", "--max-num-seqs", "64", "--no-timings", "--quiet")
    code, _, err = run_cli("plan", *argv, "--out", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    res = api.plan(RAG, A4, 1.0, trace_requests=60, formulation="blocks", tps=(1, 2),
                   placer="best-fit", spread_replicas=True,
                   engine=PlanRequest.of({"inputs": INPUTS, "engine": {"max_batch": 64}}
                                         ).engine.memory_policy())
    rec = res.to_dict(timings=False)["request"]
    assert rec["search"] == doc["request"]["search"]
    assert rec["placement"] == doc["request"]["placement"] == {
        "placer": "best-fit", "spread_replicas": True}
    assert doc["request"]["engine"]["max_batch"] == 64
    assert rec["engine"]["policy"]["max_batch"] == 64
    # without the request, the two documents are the same plan
    assert {k: v for k, v in doc.items() if k != "request"} == {
        k: v for k, v in res.to_dict(timings=False).items() if k != "request"}
    parse_plan(doc, str(out))  # the plan file's model reads the request back
    doc["request"]["search"]["optimiser"] = "nope"
    with pytest.raises(InputError, match="request"):
        parse_plan(doc, str(out))


def _stats_keys() -> set[str]:
    """Every key the optimisers and formulations write into a plan's statistics (read from
    the source with ast: subscript stores, dict(...stats, key=...), stats dict literals)."""
    import ast

    def name(n: ast.AST) -> str:
        return n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""

    keys: set[str] = set()
    for path in (REPO / "src").rglob("*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Subscript) and "stats" in name(t.value) \
                            and isinstance(t.slice, ast.Constant):
                        keys.add(t.slice.value)
                    if "stats" in name(t) and isinstance(n.value, ast.Dict):
                        keys |= {k.value for k in n.value.keys if isinstance(k, ast.Constant)}
            if isinstance(n, ast.Call) and name(n.func) == "dict" and n.args \
                    and "stats" in name(n.args[0]):
                keys |= {kw.arg for kw in n.keywords if kw.arg}
            if isinstance(n, ast.Call):
                for kw in n.keywords:
                    if kw.arg == "stats" and isinstance(kw.value, ast.Dict):
                        keys |= {k.value for k in kw.value.keys if isinstance(k, ast.Constant)}
    return keys


def test_the_solver_section_is_closed_and_names_every_statistic(tmp_path) -> None:
    from scepsy_opt.planning.planfile import TIMING_KEYS
    from scepsy_serve.launch.planfile import SolverSection

    found = _stats_keys()
    assert {"candidates_kept", "cg_bound", "placed_cost_per_hour", "latency_bounds"} <= found
    assert found - set(TIMING_KEYS) <= set(SolverSection.model_fields), sorted(
        found - set(TIMING_KEYS) - set(SolverSection.model_fields))
    res = api.plan(RAG, A4, 1.0, trace_requests=60, formulation="blocks")
    doc = json.loads(json.dumps(res.to_dict(timings=False)))
    parse_plan(doc, "plan.json")
    doc["solver"]["made_up_statistic"] = 1
    with pytest.raises(InputError, match=r"solver\.made_up_statistic"):
        parse_plan(doc, "plan.json")


def test_the_typed_solve_report_says_how_each_plan_ended() -> None:
    ok = api.plan(RAG, A4, 1.0, trace_requests=60, formulation="auto", time_limit_s=30)
    rep = ok.report
    doc = ok.to_dict(timings=False)
    assert rep.status == doc["status"] == ok.plan.status
    assert rep.formulation == doc["placement"]["formulation"]
    assert set(rep.compared) == set(doc["placement"]["compared"])
    assert rep.statistics.candidates_kept == doc["solver"]["candidates_kept"]
    assert rep.proven_optimal == (rep.status == "optimal")
    if rep.bound_s is not None and rep.objective_s is not None:
        assert rep.bound_s <= rep.objective_s * (1 + 1e-9)  # a bound never above the plan
    bad = api.plan(RAG, A4, 1000.0, trace_requests=60, formulation="blocks")
    assert bad.report.status in ("infeasible", "unplaced") and bad.report.reason
    assert bad.report.objective_s is None


def test_replan_takes_the_options_it_shares_with_plan_from_the_request() -> None:
    from scepsy.cli.replan import REQUEST_FLAGS

    code, out, _ = run_cli("replan", "--help")
    assert code == 0
    by_flag = {f.flag.name: f for f in flag_fields()}
    text = " ".join(out.split())
    for flag in REQUEST_FLAGS:
        assert flag in by_flag  # a field of the request
        assert " ".join(by_flag[flag].help.split())[:40] in text, flag
