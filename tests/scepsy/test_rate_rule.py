"""One rule for every rate a user gives: ``--rate`` (predict, simulate, drive, bench), ``--target``
(plan), a rate workload's rates and a replan load event's result are finite numbers of
requests/s in [MIN_RATE, MAX_RATE], refused in the same words (exit 2, naming the flag)."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from scepsy_common.errors import InputError, check_rate
from scepsy_common.rates import MAX_RATE, MIN_RATE, RATE_EXPECTED, is_rate
from scepsy_opt.workload import load_specs, per_workflow_rates, split_rate

D = REPO / "datasets"
RAG = str(D / "workflows" / "rag.yaml")
ALLOC = str(D / "allocations" / "rag-8gpu.yaml")
CLUSTER = str(D / "clusters" / "a100-16.yaml")

OUTSIDE = ["1e-320", "5e-7", "1000001", "1e12"]


@settings(max_examples=300, derandomize=True, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**7),
                       st.booleans()))
def test_a_rate_is_accepted_iff_it_follows_the_stated_rule(value):
    ok = (not isinstance(value, bool) and math.isfinite(value)
          and MIN_RATE <= value <= MAX_RATE)
    assert is_rate(value) == ok
    if ok:
        assert check_rate(value, "f", "rate") == float(value)
    else:
        with pytest.raises(InputError) as exc:
            check_rate(value, "f", "rate")
        assert exc.value.expected == RATE_EXPECTED
    assert RATE_EXPECTED == "a rate in [1e-06, 1e+06] requests/s"


@pytest.mark.parametrize("value", OUTSIDE)
@pytest.mark.parametrize("argv", [
    ["predict", "--workflow", RAG, "--allocation", ALLOC],
    ["simulate", "--workflow", RAG, "--allocation", ALLOC],
    ["drive", "--workflow", RAG, "--routes", "routes.json", "--requests", "1"],
    ["bench", "gpu", "--out", "o"],
    ["bench", "loop", "--out", "o"],
], ids=lambda a: " ".join(a[:2]))
def test_every_rate_flag_refuses_a_rate_outside_the_rule(argv, value):
    code, out, err = run_cli(*argv, "--rate", value)
    assert code == 2 and out == ""
    assert "--rate" in err and RATE_EXPECTED in err and "Traceback" not in err


@pytest.mark.parametrize("target", ["1e-320", "rag=5e-7", "rag=2e6"])
def test_plan_target_follows_the_same_rule(tmp_path, target):
    out = tmp_path / "plan.json"
    code, _, err = run_cli("plan", "--workflow", RAG, "--cluster", CLUSTER, "--target", target,
                           "--trace-requests", "50", "--quiet", "--out", str(out))
    assert code == 2 and "--target" in err and RATE_EXPECTED in err
    assert not out.exists()


@pytest.mark.parametrize("rate", [1e-320, 5e-7, 2e6])
def test_the_library_refuses_the_same_rates(rate):
    specs = load_specs(RAG)
    for call in (lambda: split_rate(specs, rate),
                 lambda: per_workflow_rates(specs, {"rag": rate})):
        with pytest.raises(InputError) as exc:
            call()
        assert exc.value.expected == RATE_EXPECTED


def test_predict_at_the_smallest_rate_is_finite_and_quiet():
    from scepsy import api

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pred = api.predict(RAG, ALLOC, MIN_RATE, trace_requests=50)
    for w in pred.workflows.values():
        assert math.isfinite(w.max_throughput)


@pytest.mark.parametrize("load", [{"factor": 1e-320}, {"factor": 1e12}, {"target": 5e-7}])
def test_a_replan_load_event_leaves_a_rate_of_the_rule(load):
    from scepsy_opt.planning.instances import random_problem
    from scepsy_place.formulations.incremental import LoadChanged, apply_events
    from scepsy_place.packing.topology import Node, Topology
    from scepsy_profile import roofline_model

    top = Topology("t", (Node("n0", "r0", "A100-80GB", 8, 8, 80.0),))
    problem = random_problem(2, 8, roofline_model(), seed=1, cluster=top.to_cluster(), load=0.2)
    wf = next(iter(problem.targets))
    with pytest.raises(InputError) as exc:
        apply_events(problem, top, [LoadChanged(wf, **load)])
    assert exc.value.field == "load" and exc.value.expected.startswith(RATE_EXPECTED)

