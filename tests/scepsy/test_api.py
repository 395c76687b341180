"""The Python entry points (``scepsy.plan``, ``scepsy.predict``, ``scepsy.simulate``): the same
results as the CLI, paths or loaded objects alike, and the library pieces they are built from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import scepsy
from scepsy.cli import main
from scepsy_common.errors import InputError
from scepsy_opt.allocation import load_allocation
from scepsy_opt.prediction.reports import prediction_to_dict, simulation_to_dict
from scepsy_opt.workflows import generate_trace, load_workflow, load_workload
from scepsy_opt.workload import generate_workload_trace, load_specs, split_rate
from scepsy_place.packing.topology import load_topology

REPO = Path(__file__).resolve().parents[2]
RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
RAG_BEAM = str(REPO / "datasets" / "workflows" / "rag-beam.yaml")
A4 = str(REPO / "datasets" / "clusters" / "a100-4.yaml")
ALLOC = str(REPO / "datasets" / "allocations" / "rag-4gpu.yaml")
N = 150  # requests per workflow of the generated traces


def test_import_scepsy_is_cheap():
    code = ("import sys, scepsy; heavy = [m for m in ('numpy', 'scipy', 'sklearn', 'pulp', "
            "'pydantic', 'scepsy_opt', 'scepsy_place', 'scepsy_profile') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_help_imports_no_library():
    code = ("import sys, contextlib, io\nfrom scepsy.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['--help'])\n"
            "print([m for m in ('numpy', 'scipy', 'pulp', 'scepsy_opt', 'scepsy_place', "
            "'scepsy_profile') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_plan_equals_what_the_cli_writes(capsys, tmp_path):
    res = scepsy.plan(RAG, A4, 2.0, trace_requests=N)
    out = tmp_path / "plan.json"
    assert main(["plan", "--workflow", RAG, "--cluster", A4, "--target", "2", "--out", str(out),
                 "--trace-requests", str(N), "--no-timings"]) == 0
    capsys.readouterr()
    assert res.to_dict(timings=False) == json.loads(out.read_text())
    assert res.plan.allocation is not None and res.placed.placed
    # the objective is the weighted sum of the workflows' mean predicted latencies
    lat = res.workflow_latencies
    assert res.plan.objective_s == pytest.approx(sum(lat.values()), rel=1e-9)


def test_plan_accepts_loaded_objects_and_per_workflow_targets():
    by_path = scepsy.plan(RAG, A4, 2.0, trace_requests=N, formulation="blocks")
    loaded = scepsy.plan(load_workflow(RAG), load_topology(A4), {"rag": 2.0}, trace_requests=N,
                         formulation="blocks")
    a, b = by_path.to_dict(timings=False), loaded.to_dict(timings=False)
    # the request records each input as given: a path, or the type of the object given
    ra, rb = a.pop("request"), b.pop("request")
    assert a == b
    assert ra["inputs"]["workflow"] == RAG and ra["inputs"]["targets"] == 2.0
    assert rb["inputs"]["workflow"].startswith("<") and rb["inputs"]["targets"] == {"rag": 2.0}
    assert rb["inputs"]["cluster"] == "<Topology>"
    assert {k: v for k, v in ra.items() if k != "inputs"} == {
        k: v for k, v in rb.items() if k != "inputs"}


def test_plan_splits_a_total_target_over_the_workload_weights():
    from scepsy.api import plan_problem

    specs = load_workload(RAG_BEAM)

    problem, _ = plan_problem(RAG_BEAM, A4, 0.6, trace_requests=50)
    assert dict(problem.targets) == pytest.approx(split_rate(specs, 0.6), rel=1e-12)
    assert sum(problem.targets.values()) == pytest.approx(0.6, rel=1e-12)


def test_predict_equals_what_the_cli_prints(capsys):
    pred = scepsy.predict(RAG, ALLOC, 1.5, trace_requests=N)
    assert main(["predict", "--workflow", RAG, "--allocation", ALLOC, "--rate", "1.5",
                 "--trace-requests", str(N), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    ours = json.loads(json.dumps(scepsy.api.prediction_document(pred, "critical-path")))
    assert ours == cli
    base = json.loads(json.dumps(prediction_to_dict(pred, "critical-path")))
    for part in ("workflows", "llms"):  # the library's document, plus the newer fields
        for key, entry in base[part].items():
            assert cli[part][key].items() >= entry.items()
    again = scepsy.predict(load_specs(RAG), load_allocation(ALLOC), {"rag": 1.5},
                           trace_requests=N)
    assert again == pred


def test_simulate_equals_what_the_cli_prints(capsys):
    res = scepsy.simulate(RAG, ALLOC, 1.0, requests=60, trace_requests=N, seed=3)
    assert main(["simulate", "--workflow", RAG, "--allocation", ALLOC, "--rate", "1",
                 "--requests", "60", "--trace-requests", str(N), "--seed", "3", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert json.loads(json.dumps(scepsy.api.simulation_document(res))) == cli
    base = json.loads(json.dumps(simulation_to_dict(res)))
    assert cli["workflows"] == base["workflows"]
    assert all(cli["llms"][m].items() >= x.items() for m, x in base["llms"].items())


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"change_penalty_s": 1.0}, "change_penalty_s"),
    ({"latency_bound_s": 1.0}, "latency_bound_s"),
    ({"optimiser": "user"}, "optimiser"),
    ({"tps": (3,)}, "tps"),
    ({"shares": (0.01,)}, "shares"),
    ({"seed": -1}, "seed"),
    ({"colour": "red"}, "colour"),
])
def test_plan_rejects_bad_options_before_solving(kwargs, field):
    with pytest.raises(InputError) as info:
        scepsy.plan(RAG, A4, 2.0, trace_requests=N, **kwargs)
    assert field in str(info.value)


def test_user_optimiser_evaluates_the_current_allocation():
    res = scepsy.plan(RAG, A4, 1.0, trace_requests=N, optimiser="user", current=ALLOC)
    assert res.plan.optimiser == "user"
    assert res.allocation == load_allocation(ALLOC)


# ------------------------------------------------------------- the library pieces


def test_workload_trace_is_each_workflows_trace_with_its_own_seed():
    specs = load_workload(RAG_BEAM)
    calls = generate_workload_trace(specs, 3, seed=5)
    want = [c for i, s in enumerate(specs) for c in generate_trace(s, 3, seed=5 + i)]
    assert list(calls) == want


@settings(max_examples=25, derandomize=True, deadline=None)
@given(weights=st.lists(st.floats(0.01, 100), min_size=1, max_size=5),
       total=st.floats(1e-3, 1e3))
def test_split_rate_is_proportional_and_sums_to_the_total(weights, total):
    import dataclasses

    base = load_workflow(RAG)
    specs = [dataclasses.replace(base, name=f"w{i}", weight=w) for i, w in enumerate(weights)]
    rates = split_rate(specs, total)
    assert sum(rates.values()) == pytest.approx(total, rel=1e-12)
    for s in specs:
        assert rates[s.name] / total == pytest.approx(s.weight / sum(weights), rel=1e-12)


def test_load_specs_rejects_duplicate_keys(tmp_path):
    wf = tmp_path / "dup.yaml"
    wf.write_text(Path(RAG).read_text() + "\nname: rag2\n")
    with pytest.raises(InputError, match=r"dup\.yaml"):
        load_specs(wf)


def test_profile_rows_are_the_cli_rows_and_name_the_bad_grid(capsys):
    from scepsy_profile.roofline import roofline_model
    from scepsy_profile.show import profile_rows

    rows = profile_rows(roofline_model(), "qwen2.5-7b", "A100-80GB", [1, 2], [0.5, 1.0])
    assert main(["profile", "show", "--model", "qwen2.5-7b", "--gpu", "A100-80GB", "--tp", "1,2",
                 "--shares", "0.5,1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == rows
    assert [(r["tp"], r["share"]) for r in rows] == [(1, 0.5), (1, 1.0), (2, 0.5), (2, 1.0)]
    with pytest.raises(InputError) as info:
        profile_rows(roofline_model(), "qwen2.5-7b", "A100-80GB", [3], [1.0])
    assert info.value.field == "tp"
