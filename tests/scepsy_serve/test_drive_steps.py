"""A drive whose load steps mid-run, and the headers every call carries: the arrival counts per
piece against the piecewise rate (a Poisson count bound), no steps = the plain Poisson times (to
rounding), bad steps refused by name, and a recording proxy in front of the fake server sees each
call's workflow and request."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_drive import beam, rag, routes_for

from fakes.openai_server import FakeOpenAIServer
from scepsy_common.errors import InputError
from scepsy_opt.ingest.record import RecordConfig, recording_proxy
from scepsy_opt.traces import read_trace
from scepsy_profile.profiling.replay import (
    ReplayTimeouts,
    poisson_arrivals,
    stepped_poisson_arrivals,
)
from scepsy_serve.launch.drive import drive, plan_drive


@given(st.floats(0.1, 50), st.integers(1, 400), st.integers(0, 2 ** 32 - 1))
@settings(max_examples=60, deadline=None)
def test_without_steps_the_plain_poisson_times(rate: float, n: int, seed: int) -> None:
    a = poisson_arrivals(rate, n, np.random.default_rng(seed))
    b = stepped_poisson_arrivals(rate, (), n, np.random.default_rng(seed))
    np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9)


@given(st.lists(st.tuples(st.floats(0.5, 20), st.floats(0.2, 20)), min_size=1, max_size=4),
       st.integers(0, 1000))
@settings(max_examples=40, deadline=None)
def test_times_increase_from_zero(pieces: list[tuple[float, float]], seed: int) -> None:
    steps, t = [], 0.0
    for gap, r in pieces:
        t += gap
        steps.append((t, r))
    times = stepped_poisson_arrivals(1.0, steps, 300, np.random.default_rng(seed))
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)


def test_counts_per_piece_follow_the_rates() -> None:
    """2 req/s for 200 s, then 10 req/s: each piece's count within 5 sigma of its mean."""
    times = stepped_poisson_arrivals(2.0, [(200.0, 10.0)], 4000, np.random.default_rng(7))
    first = int(np.sum(times < 200.0))
    assert abs(first - 400) < 5 * math.sqrt(400)
    second = times[(times >= 200.0) & (times < 300.0)]
    assert abs(len(second) - 1000) < 5 * math.sqrt(1000)


@pytest.mark.parametrize("steps, field", [
    ([(0.0, 1.0)], "rate_steps[0].at_s"), ([(5.0, 1.0), (5.0, 2.0)], "rate_steps[1].at_s"),
    ([(5.0, 0.0)], "rate_steps[0].rate"), ([(math.inf, 1.0)], "rate_steps[0].at_s")])
def test_bad_steps_are_refused_by_name(steps, field) -> None:
    specs = (rag(),)
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        plan_drive(specs, routes_for(specs, "http://127.0.0.1:9/v1"), rate=1.0, requests=5,
                   rate_steps=steps)


def test_a_proxy_in_front_sees_each_call_s_workflow_and_request(tmp_path) -> None:
    specs = (rag(), beam())
    out = tmp_path / "trace.jsonl"
    timeouts = ReplayTimeouts(connect_s=10.0, stall_s=10.0, call_s=30.0)
    with FakeOpenAIServer(slots=64, prefill_s=0.001, token_s=0.0005) as fake, \
            recording_proxy(RecordConfig(out=out, upstream=fake.base_url)) as url:
        plan = plan_drive(specs, routes_for(specs, url + "/v1"), rate=50.0, requests=12,
                          seed=1, rate_steps=[(0.05, 200.0)])
        res = drive(plan, timeouts=timeouts)
    assert res.completed == 12 and res.failed == 0
    want = Counter((r.workflow, f"{r.workflow}/{r.request_id}") for r in plan.requests
                   for c in r.calls if c.llm is not None)
    got = Counter((c.workflow, c.request_id) for c in read_trace(out).calls if c.llm is not None)
    assert got == want
