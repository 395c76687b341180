"""The replay client against the loopback fake server: every failure kind, timing accounting,
the schedule's determinism and the length distributions."""

from __future__ import annotations

import itertools
import socket

import numpy as np
import pytest

from fakes.openai_server import FakeOpenAIServer
from scepsy_common.errors import InputError
from scepsy_profile.profiling.replay import (
    CallSpec,
    LengthDist,
    ReplayTimeouts,
    completion_body,
    poisson_schedule,
    run_replay,
)

FAST = ReplayTimeouts(connect_s=2.0, stall_s=0.5, call_s=5.0)


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAIServer(slots=4, prefill_s=0.02, token_s=0.01, hang_s=3.0) as srv:
        yield srv


def _call(index: int = 0, out: int = 8) -> CallSpec:
    return CallSpec(index=index, offset_s=0.0, prompt=(5, 6, 7), output_tokens=out)


def _one(fake: FakeOpenAIServer, mode: str, out: int = 8, timeouts: ReplayTimeouts = FAST):
    res = run_replay(fake.base_url, [_call(out=out)], model=mode, timeouts=timeouts)
    assert len(res.calls) == 1
    return res.calls[0]


def test_normal_stream_counts_tokens_and_times(fake):
    r = _one(fake, "normal", out=10)
    assert r.ok and r.failure is None and r.status == 200
    assert r.tokens == 10 and len(r.token_times_s) == 10
    # the fake takes 20 ms to the first token and 10 ms per further token
    assert r.ttft_s is not None and r.ttft_s >= 0.02
    assert r.e2e_s is not None and r.e2e_s >= r.token_times_s[-1] >= r.ttft_s
    assert r.tpot_s is not None and r.tpot_s >= 0.01 * 0.9
    assert list(r.token_times_s) == sorted(r.token_times_s)


def test_request_body_asks_exact_lengths_with_token_ids(fake):
    before = len(fake.requests)
    _one(fake, "normal", out=4)
    req = fake.requests[before]
    assert req["prompt"] == [5, 6, 7]
    assert req["max_tokens"] == req["min_tokens"] == 4
    assert req["ignore_eos"] is True and req["stream"] is True and req["return_token_ids"] is True
    assert completion_body(_call(out=4), "normal") == req


@pytest.mark.parametrize(("mode", "kind", "status"), [
    ("http500", "http_5xx", 500),
    ("http400", "http_4xx", 400),
    ("malformed", "malformed", 200),
    ("not_sse", "malformed", 200),
    ("short", "short_stream", 200),
    ("truncate", "short_stream", 200),
    ("stall", "timeout", 200),
    ("hang", "timeout", None),
])
def test_failures_are_recorded_not_raised(fake, mode, kind, status):
    r = _one(fake, mode)
    assert not r.ok
    assert r.failure == kind, r.detail
    assert r.status == status
    assert r.e2e_s is None
    assert r.detail


def test_short_stream_keeps_the_tokens_it_got(fake):
    r = _one(fake, "short", out=8)
    assert r.failure == "short_stream" and r.tokens == 4
    assert "[DONE]" in r.detail


def test_whole_call_timeout(fake):
    # a normal stream of 60 tokens takes > 0.6 s: the call limit fires although no stall does
    r = _one(fake, "normal", out=60, timeouts=ReplayTimeouts(stall_s=5.0, call_s=0.2))
    assert r.failure == "timeout"
    assert 0 < r.tokens < 60


def test_connection_refused_is_a_connection_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    res = run_replay(f"http://127.0.0.1:{port}", [_call()], model="normal", timeouts=FAST)
    assert res.calls[0].failure == "connection"
    assert res.failures == {"connection": 1}


def test_open_loop_sends_at_the_offsets(fake):
    calls = [CallSpec(i, 0.15 * i, (5, 6), 3) for i in range(4)]
    res = run_replay(fake.base_url, calls, model="normal", timeouts=FAST)
    assert all(c.ok for c in res.calls)
    sends = [c.send_s for c in res.calls]
    for want, got in zip([0.0, 0.15, 0.30, 0.45], sends, strict=True):
        assert got >= want - 1e-3  # never early (late only by scheduling noise)
    assert res.wall_s >= 0.45


def test_mixed_failures_are_counted(fake):
    calls = [_call(0), _call(1)]
    ok = run_replay(fake.base_url, calls, model="normal", timeouts=FAST)
    bad = run_replay(fake.base_url, calls, model="http500", timeouts=FAST)
    assert ok.failures == {} and len(ok.ok_calls) == 2
    assert bad.failures == {"http_5xx": 2} and bad.ok_calls == ()
    assert [c.index for c in bad.calls] == [0, 1]


# -- schedule and lengths --------------------------------------------------------------------------

def test_schedule_is_deterministic_in_the_seed():
    ins, outs = LengthDist.lognormal(128, 0.5), LengthDist.exponential(32)
    a = poisson_schedule(2.0, ins, outs, seed=3, n_calls=50, vocab=500)
    b = poisson_schedule(2.0, ins, outs, seed=3, n_calls=50, vocab=500)
    c = poisson_schedule(2.0, ins, outs, seed=4, n_calls=50, vocab=500)
    assert a == b and a != c
    assert a[0].offset_s == 0.0
    assert all(x.offset_s <= y.offset_s for x, y in itertools.pairwise(a))
    assert all(3 <= t < 500 for call in a for t in call.prompt)


def test_schedule_rate_and_duration():
    calls = poisson_schedule(50.0, LengthDist.constant(4), LengthDist.constant(2), seed=0,
                             duration_s=20.0)
    assert all(c.offset_s < 20.0 for c in calls)
    # Poisson count over 20 s at 50/s: mean 1000, sd ~32
    assert 850 < len(calls) < 1150
    gaps = np.diff([c.offset_s for c in calls])
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.1)
    both = poisson_schedule(50.0, LengthDist.constant(4), LengthDist.constant(2), seed=0,
                            duration_s=20.0, n_calls=10)
    assert len(both) == 10


@pytest.mark.parametrize(("dist", "mean"), [
    (LengthDist.constant(17), 17),
    (LengthDist.exponential(40), 40),
    (LengthDist.lognormal(128, 0.6), 128),
    (LengthDist.empirical([10, 20, 30, 40]), 25),
])
def test_length_distributions_have_their_means(dist, mean):
    xs = dist.sample(np.random.default_rng(1), 20_000)
    assert xs.dtype == np.int64 and xs.min() >= 1
    assert xs.mean() == pytest.approx(mean, rel=0.05)


def test_length_clipping():
    xs = LengthDist.exponential(100, maximum=50).sample(np.random.default_rng(0), 1000)
    assert xs.max() == 50 and xs.min() >= 1


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"kind": "gamma", "mean": 3}, "kind"),
    ({"kind": "constant", "mean": 0}, "mean"),
    ({"kind": "exponential", "mean": float("nan")}, "mean"),
    ({"kind": "lognormal", "mean": 10, "sigma": 0}, "sigma"),
    ({"kind": "empirical", "values": ()}, "values"),
    ({"kind": "empirical", "values": (3, 0)}, "values"),
    ({"kind": "constant", "mean": 5, "minimum": 10, "maximum": 4}, "maximum"),
])
def test_bad_distributions_name_the_field(kwargs, field):
    with pytest.raises(InputError) as err:
        LengthDist(**kwargs)
    assert err.value.field == field


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"rate": 0.0, "n_calls": 3}, "rate"),
    ({"rate": 1.0}, "n_calls/duration_s"),
    ({"rate": 1.0, "n_calls": 0}, "n_calls"),
    ({"rate": 1.0, "duration_s": -1.0}, "duration_s"),
])
def test_bad_schedules_name_the_field(kwargs, field):
    with pytest.raises(InputError) as err:
        poisson_schedule(inputs=LengthDist.constant(3), outputs=LengthDist.constant(3), seed=0,
                         **kwargs)
    assert err.value.field == field
