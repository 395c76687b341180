"""The serving-curve measurement: the rate sweep's control logic and the metrics reading against the
loopback fake server, the comparison with the derived curve against a closed form, and (marker
``vllm``) one real ``vllm serve`` started, replayed against, read and stopped."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from fakes.latency import ConstantLatency
from fakes.openai_server import FakeOpenAIServer
from scepsy_common.errors import InputError
from scepsy_profile.profiling.models import engine_model
from scepsy_profile.profiling.replay import LengthDist, ReplayTimeouts, poisson_schedule, run_replay
from scepsy_profile.profiling.servecurve import (
    ServeCurvePoint,
    ServeCurveResult,
    Stats,
    SweepPlan,
    compare_with_step_profile,
    device_catalog,
    load_result,
    result_path,
    saturation_reason,
    save_result,
    sweep_rates,
)
from scepsy_profile.profiling.server import (
    HistogramDelta,
    fetch_metrics,
    histogram_delta,
    parse_metrics,
)
from scepsy_profile.serving import serving_curve

TIMEOUTS = ReplayTimeouts(connect_s=5.0, stall_s=5.0, call_s=20.0)

# -- /metrics parsing ------------------------------------------------------------------------------

TEXT = """\
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.5",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
garbage line without value
vllm:bad_value{engine="0"} not-a-number
"""


def test_parse_metrics_sums_label_sets_and_keeps_buckets():
    snap = parse_metrics(TEXT)
    assert snap.value("vllm:e2e_request_latency_seconds_count") == 6.0  # two engines summed
    assert snap.value("vllm:e2e_request_latency_seconds_sum") == 3.0
    assert snap.value("vllm:num_requests_waiting") == 3.0
    assert snap.buckets("vllm:e2e_request_latency_seconds") == [(0.5, 2.0), (1.0, 4.0),
                                                               (math.inf, 4.0)]
    assert ("vllm:bad_value", None) not in snap.samples


def test_histogram_delta_mean_and_quantiles():
    before = parse_metrics("h_sum 1.0\nh_count 2\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"2\"} 2\n"
                           "h_bucket{le=\"+Inf\"} 2\n")
    after = parse_metrics("h_sum 7.0\nh_count 6\nh_bucket{le=\"1\"} 4\nh_bucket{le=\"2\"} 6\n"
                          "h_bucket{le=\"+Inf\"} 6\n")
    d = histogram_delta(before, after, "h")
    assert d.count == 4 and d.total == 6.0 and d.mean == 1.5
    assert d.buckets == ((1.0, 2.0), (2.0, 4.0), (math.inf, 4.0))
    assert d.quantile(0.5) == pytest.approx(1.0)  # rank 2 = the end of the first bucket
    assert d.quantile(0.75) == pytest.approx(1.5)  # halfway through the second
    with pytest.raises(ValueError, match="went down"):
        histogram_delta(after, before, "h")
    assert HistogramDelta("x", 0, 0.0, ()).mean is None


# -- the sweep against the fake server ----------------------------------------------------------------

@pytest.fixture(scope="module")
def fake():
    # 2 slots, each call 20 ms to its first token + 7 × 5 ms: saturates near 2/0.055 ≈ 36 calls/s
    with FakeOpenAIServer(slots=2, prefill_s=0.02, token_s=0.005) as srv:
        yield srv


def test_fake_metrics_match_the_client(fake):
    before = fetch_metrics(fake.base_url)
    calls = poisson_schedule(5.0, LengthDist.constant(4), LengthDist.constant(6), seed=1,
                             n_calls=6)
    res = run_replay(fake.base_url, calls, model="normal", timeouts=TIMEOUTS)
    after = fetch_metrics(fake.base_url)
    e2e = histogram_delta(before, after, "vllm:e2e_request_latency_seconds")
    assert e2e.count == 6
    client_mean = np.mean([c.e2e_s for c in res.calls])
    assert e2e.mean is not None and e2e.mean <= client_mean + 0.01  # the server sees less
    assert e2e.mean >= 0.02 + 5 * 0.005 * 0.9


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
def test_sweep_stops_at_saturation_and_refines(fake):
    plan = SweepPlan(start_rate=4.0, factor=2.0, max_rates=8, calls_per_rate=24, warmup_calls=2,
                     refine_steps=2, fill_fractions=(), poll_s=0.1, timeouts=TIMEOUTS)
    seen: list[ServeCurvePoint] = []
    points, stop = sweep_rates(fake.base_url, "normal", LengthDist.constant(4),
                               LengthDist.constant(8), plan, seed=5, progress=seen.append)
    assert list(points) == seen
    main = points[: len(points) - plan.refine_steps]
    # geometric steps until the first saturated one, which ends the main sweep
    assert [p.rate for p in main] == [4.0 * 2.0**k for k in range(len(main))]
    assert main[-1].saturated and not any(p.saturated for p in main[:-1])
    assert stop.startswith(f"saturated at {main[-1].rate:.4g}/s")
    assert 2 <= len(main) <= 6  # it saturates somewhere between 8 and 128 calls/s
    # the refinement lies between the last unsaturated rate and the first saturated one
    for p in points[len(main):]:
        assert main[-2].rate < p.rate < main[-1].rate
    mu = max(p.achieved_rate for p in points)
    assert 5 < mu < 2 / 0.055 * 1.1  # never faster than the fake's two slots allow
    low = points[0]
    assert low.completed == low.calls == 24 and low.failures == {}
    assert low.server["e2e"].n == 24 and low.client["e2e"].n == 22  # warm-up calls left out
    assert low.server["ttft"].mean is not None and low.client["tpot"].mean is not None
    assert low.mean_running is not None and low.waiting_fraction is not None
    assert low.achieved_rate == pytest.approx(low.offered_rate, rel=0.25)


def test_sweep_measures_the_reported_loads_above_the_last_unsaturated_rate(fake):
    """Every load the comparison reports (a fraction of the measured saturation) is either
    below an unsaturated measured rate (interpolated) or measured itself."""
    fractions = (0.3, 0.6, 0.9)
    plan = SweepPlan(start_rate=4.0, factor=5.0, max_rates=8, calls_per_rate=16, warmup_calls=2,
                     refine_steps=0, fill_fractions=fractions, poll_s=0.1, timeouts=TIMEOUTS)
    points, stop = sweep_rates(fake.base_url, "normal", LengthDist.constant(4),
                               LengthDist.constant(8), plan, seed=7)
    assert stop.startswith("saturated")
    main = [p for p in points if p.rate in {4.0 * 5.0**k for k in range(8)}]
    fills = points[len(main):]
    assert fills, "a factor-5 sweep leaves 90% of saturation above the last unsaturated rate"
    mu_main = max(p.achieved_rate for p in main)
    for p in fills:  # fills are fractions of the saturation measured before them
        assert any(p.rate == pytest.approx(f * mu_main) for f in fractions), p.rate
    mu = max(p.achieved_rate for p in points)
    for f in fractions:
        covered = any(not p.saturated and p.offered_rate >= f * mu * 0.999 for p in points)
        measured = any(p.rate == pytest.approx(f * mu_main) for p in fills)
        assert covered or measured or any(p.saturated for p in fills), f


def test_a_fill_fraction_outside_0_1_is_refused():
    with pytest.raises(InputError, match="fill_fractions"):
        SweepPlan(fill_fractions=(0.5, 1.2))


def test_sweep_without_saturation_says_so(fake):
    plan = SweepPlan(start_rate=2.0, factor=1.5, max_rates=2, calls_per_rate=6, warmup_calls=1,
                     poll_s=0.1, timeouts=TIMEOUTS)
    points, stop = sweep_rates(fake.base_url, "normal", LengthDist.constant(3),
                               LengthDist.constant(3), plan, seed=0)
    assert [p.rate for p in points] == [2.0, 3.0]
    assert stop == "no saturation within 2 rates"


def test_sweep_counts_a_failing_server_as_saturated(fake):
    plan = SweepPlan(start_rate=5.0, calls_per_rate=4, warmup_calls=0, poll_s=0.1,
                     timeouts=TIMEOUTS)
    points, stop = sweep_rates(fake.base_url, "http500", LengthDist.constant(3),
                               LengthDist.constant(3), plan, seed=0)
    assert len(points) == 1 and points[0].failures == {"http_5xx": 4}
    assert "4 of 4 calls failed" in stop


def _point(rate: float, achieved: float, e2e: float, **kw) -> ServeCurvePoint:
    return ServeCurvePoint(rate=rate, offered_rate=rate, achieved_rate=achieved, calls=10,
                           completed=kw.pop("completed", 10), failures={},
                           client={"e2e": Stats.of([e2e])}, server=kw.pop("server", {}), **kw)


@pytest.mark.parametrize(("point", "zero", "needle"), [
    (_point(10, 8.5, 0.1), 0.1, "achieved"),
    (_point(10, 10, 1.5), 0.1, "mean latency"),
    (_point(10, 10, 0.1, waiting_fraction=0.9), 0.1, "waiting"),
    (_point(10, 10, 0.1, completed=5), 0.1, "failed"),
    (_point(10, 9.5, 0.5), 0.1, ""),
    (_point(10, 9.5, 5.0), None, ""),  # no zero-load latency yet: latency cannot saturate
])
def test_saturation_rules(point, zero, needle):
    reason = saturation_reason(point, zero, SweepPlan())
    assert (needle in reason) and (bool(reason) == bool(needle))


def test_server_latency_wins_over_client():
    p = _point(1, 1, 0.5, server={"e2e": Stats.of([0.3])})
    assert p.latency("e2e") == 0.3
    assert _point(1, 1, 0.5).latency("e2e") == 0.5
    assert p.latency("itl") is None


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"start_rate": 0}, "start_rate"), ({"factor": 1.0}, "factor"),
    ({"calls_per_rate": 1}, "calls_per_rate"), ({"warmup_calls": 60}, "warmup_calls"),
    ({"saturation_ratio": 1.5}, "saturation_ratio"), ({"min_duration_s": -1.0}, "min_duration_s"),
])
def test_bad_plans_name_the_field(kwargs, field):
    with pytest.raises(InputError) as err:
        SweepPlan(**kwargs)
    assert err.value.field == field


# -- the result file and the comparison ------------------------------------------------------------

def _result(points, max_num_seqs: int = 1) -> ServeCurveResult:
    em = engine_model("llama-3-8b", 1 / 16)
    return ServeCurveResult(
        model=em.name, profiled_name=em.profiled_name, scale=em.scale, config=em.config(),
        device="cpu", tp=1, share=1.0, input_tokens=128.0, output_tokens=32.0,
        inputs=LengthDist.constant(128).to_json(), outputs=LengthDist.constant(32).to_json(),
        engine="vllm", engine_version="0.32.0", server={"max_num_seqs": max_num_seqs,
                                                        "kv_gib": 1.0, "max_model_len": 512},
        points=tuple(points), stop_reason="test", seed=3)


def test_result_round_trips_through_its_file(tmp_path):
    res = _result([_point(1.0, 1.0, 0.2, server={"e2e": Stats.of([0.1, 0.3])},
                          mean_running=0.2, waiting_fraction=0.0)])
    path = save_result(res, result_path(tmp_path / "prof.jsonl"))
    assert path.name == "prof.serve-curve.json"
    assert load_result(path) == res
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    (tmp_path / "x.json").write_text('{"kind": "other"}')
    with pytest.raises(InputError):
        load_result(tmp_path / "x.json")


def test_device_catalog_gives_the_server_memory():
    res = _result([], max_num_seqs=7)
    cat, policy = device_catalog(res)
    spec = cat.model(res.profiled_name)
    assert cat.gpu("cpu").memory_gib == pytest.approx(spec.weight_bytes_per_gpu(1) / 2**30 + 1.0)
    assert (policy.reserve_fraction, policy.reserve_gib, policy.max_batch) == (0.0, 0.0, 7)


def test_comparison_against_the_closed_form():
    # one call at a time (max_num_seqs 1): μ = 1 / (P + (O − 1)·d); latency = service + an
    # M/M/1-like wait ρ/(1 − ρ)·service. Measured: exactly that, but latencies 10 % higher.
    p_ms, d_ms = 20.0, 5.0
    service = (p_ms + 31 * d_ms) / 1e3
    mu = 1.0 / service
    rates = [0.2 * mu, 0.4 * mu, 0.7 * mu, 0.95 * mu]
    pts = [_point(r, r, 1.1 * (service + r / mu / (1 - r / mu) * service),
                  server={"itl": Stats.of([0.006]), "prefill": Stats.of([0.02])},
                  mean_running=r / mu) for r in rates]
    pts.append(_point(1.3 * mu, mu, 10.0, saturated=True, reason="x"))
    res = _result(pts)
    cmp = compare_with_step_profile(res, ConstantLatency(p_ms, d_ms))
    assert cmp.measured_mu == pytest.approx(mu)
    assert cmp.predicted_mu == pytest.approx(mu, rel=1e-9) and abs(cmp.mu_error) < 1e-9
    assert [x.fraction for x in cmp.loads] == [0.3, 0.6, 0.9]
    curve = serving_curve(ConstantLatency(p_ms, d_ms), res.profiled_name, "cpu", 1, 1.0, 128, 32,
                          catalog=device_catalog(res)[0], policy=device_catalog(res)[1])
    for x in cmp.loads:
        meas = np.interp(x.rate, rates, [q.latency("e2e") for q in pts[:-1]])
        assert x.measured_latency_s == pytest.approx(meas)
        assert x.predicted_latency_s == pytest.approx(curve.latency_s(x.rate))
        assert x.latency_error == pytest.approx(x.predicted_latency_s / meas - 1)
    assert cmp.terms["decode"]["error"] == pytest.approx(0.005 / 0.006 - 1)
    assert cmp.terms["prefill"]["error"] == pytest.approx(0.0, abs=1e-12)
    assert cmp.terms["zero_load"]["measured"] == pytest.approx(pts[0].latency("e2e"))
    assert "decode" in cmp.verdict


def test_comparison_does_not_extrapolate_beyond_the_last_unsaturated_rate():
    pts = [_point(1.0, 1.0, 0.2), _point(2.0, 1.0, 5.0, saturated=True, reason="x")]
    cmp = compare_with_step_profile(_result(pts), ConstantLatency(20.0, 5.0))
    assert cmp.measured_mu == 1.0
    # 0.3 × μ = 0.3/s is below the lowest measured rate, 0.9/s too: nothing to compare
    assert all(x.measured_latency_s is None and x.latency_error is None for x in cmp.loads)


# -- the real server ---------------------------------------------------------------------------------

def _vllm_python_or_skip() -> None:
    from scepsy_profile.profiling.backend import BackendUnavailable
    from scepsy_profile.profiling.engine_env import vllm_python

    try:
        vllm_python()
    except BackendUnavailable as exc:
        pytest.skip(f"no vLLM environment: {exc}")


@pytest.mark.vllm
def test_real_vllm_serve_replay_metrics_and_clean_stop(tmp_path: Path):
    _vllm_python_or_skip()
    from scepsy_profile.profiling.processes import group_members
    from scepsy_profile.profiling.server import ServerConfig, port_in_use, vllm_server

    cfg = ServerConfig(model=engine_model("llama-3-8b", 1 / 16), kv_gib=1.0, max_num_seqs=8,
                       max_model_len=256)
    with vllm_server(cfg, tmp_path / "serve") as srv:
        assert srv.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
        before = fetch_metrics(srv.base_url)
        calls = poisson_schedule(2.0, LengthDist.constant(32), LengthDist.constant(8), seed=0,
                                 n_calls=4, vocab=cfg.model.vocab)
        res = run_replay(srv.base_url, calls, model=cfg.served_name, timeouts=TIMEOUTS)
        after = fetch_metrics(srv.base_url)
        pid, port = srv.pid, srv.port
    assert [c.failure for c in res.calls] == [None] * 4, [c.detail for c in res.calls]
    assert all(c.tokens == 8 and c.ttft_s and c.e2e_s >= c.ttft_s for c in res.calls)
    e2e = histogram_delta(before, after, "vllm:e2e_request_latency_seconds")
    itl = histogram_delta(before, after, "vllm:inter_token_latency_seconds")
    assert e2e.count == 4 and e2e.mean is not None and e2e.mean > 0
    assert itl.count == 4 * 7
    assert after.value("vllm:num_requests_running") == 0
    assert group_members(pid) == [] and not port_in_use(port)


def test_engine_tmp_leaves_room_for_vllm_socket_names(tmp_path: Path):
    import shutil
    import tempfile

    from scepsy_profile.profiling.server import IPC_PATH_ROOM, engine_tmp

    root = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    try:
        short, made = engine_tmp(root)
        assert (short, made) == (root / "tmp", False) and short.is_dir()
    finally:
        shutil.rmtree(root)
    deep = tmp_path / ("x" * 80)
    tmp, made = engine_tmp(deep)
    try:
        assert made and tmp.is_dir() and len(str(tmp)) + IPC_PATH_ROOM <= 107
    finally:
        tmp.rmdir()
