"""Flags that would be silently ignored together are refused, naming the one that would be:
``--trace-requests`` with ``--trace`` (plan, predict, simulate) and a total ``--rate`` with
``--arrivals`` (simulate)."""

from __future__ import annotations

import pytest

from conftest import REPO, run_cli
from scepsy import api
from scepsy_common.errors import InputError

D = REPO / "datasets"
RAG = str(D / "workflows" / "rag.yaml")
TRACE = str(D / "traces" / "rag-50.jsonl")
ALLOC = str(D / "allocations" / "rag-8gpu.yaml")
ARRIVALS = str(D / "arrivals" / "bursty-10min.txt")


@pytest.mark.parametrize("argv", [
    ["plan", "--cluster", str(D / "clusters" / "a100-16.yaml"), "--target", "0.3", "--quiet"],
    ["predict", "--allocation", ALLOC, "--rate", "0.3"],
    ["simulate", "--allocation", ALLOC, "--rate", "0.3", "--requests", "10"],
], ids=lambda a: a[0])
def test_trace_requests_with_a_recorded_trace_is_refused(tmp_path, argv):
    out = tmp_path / "plan.json"
    extra = ["--out", str(out)] if argv[0] == "plan" else []
    code, stdout, err = run_cli(*argv, "--workflow", RAG, "--trace", TRACE,
                                "--trace-requests", "100", *extra)
    assert code == 2 and stdout == "" and "Traceback" not in err
    assert "--trace-requests" in err and "recorded trace" in err, err
    assert not out.exists()


def test_a_recorded_trace_alone_still_plans(tmp_path):
    out = tmp_path / "plan.json"
    code, _, err = run_cli("plan", "--workflow", RAG, "--cluster",
                           str(D / "clusters" / "a100-16.yaml"), "--target", "0.3", "--quiet",
                           "--trace", TRACE, "--out", str(out), "--time-limit", "20")
    assert code == 0, err
    assert out.exists()


def test_simulate_refuses_a_total_rate_with_arrivals():
    code, out, err = run_cli("simulate", "--workflow", RAG, "--allocation", ALLOC, "--rate", "1",
                             "--arrivals", ARRIVALS, "--trace-requests", "100",
                             "--requests", "100")
    assert code == 2 and out == "" and "--rate" in err and "arrivals" in err, err
    with pytest.raises(InputError) as exc:
        api.simulate(RAG, ALLOC, 1.0, arrivals=ARRIVALS, requests=10, trace_requests=50)
    assert exc.value.source == "rate"


def test_simulate_with_arrivals_and_per_workflow_rates_still_runs():
    res = api.simulate(RAG, ALLOC, {"rag": 1.0}, arrivals=ARRIVALS, requests=20,
                       trace_requests=50)
    assert res is not None
