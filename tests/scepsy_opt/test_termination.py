"""How a plan's search ended: one definition (termination) for the result and the report."""

from __future__ import annotations

import math
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scepsy import api
from scepsy_opt.planning.plans import Limit, Reason, Status, Termination, termination

RAG = "datasets/workflows/rag.yaml"
A4 = "datasets/clusters/a100-4.yaml"


@given(st.sampled_from(typing.get_args(Status)),
       st.one_of(st.none(), st.floats(min_value=0, allow_nan=False)))
def test_every_status_has_one_termination(status, gap):
    t = termination(status, gap)
    assert t.reason in typing.get_args(Reason)
    assert t.limit is None or t.limit in typing.get_args(Limit)
    # proven exactly where the status claims a proof
    assert t.proven == (status in ("optimal", "infeasible"))
    # a time limit is never reported as infeasible or optimal, nor a heuristic as proven
    if status.startswith("time_limit"):
        assert t.limit == "time" and t.reason in ("feasible", "no_solution")
    if status == "optimal":
        assert (t.limit == "gap") == (gap is not None and math.isfinite(gap) and gap > 0)


def test_an_unknown_status_is_a_programming_error():
    with pytest.raises(ValueError, match="placed"):
        termination("placed", 0.0)


@pytest.mark.parametrize(("kwargs", "want"), [
    ({}, Termination("optimal", None)),
    ({"optimiser": "heuristic"}, Termination("feasible", None)),
    ({"time_limit_s": 1e-3}, Termination("no_solution", "time")),
])
def test_the_result_and_its_report_say_the_same(kwargs, want):
    res = api.plan(RAG, A4, 1.0, trace_requests=100, **kwargs)
    got = res.termination
    assert (got.reason, got.limit) == (want.reason, want.limit)
    assert res.report.termination == got
    assert (res.allocation is None) == (got.reason not in ("optimal", "feasible"))
    if got.limit == "time":
        assert "time limit" in got.detail
