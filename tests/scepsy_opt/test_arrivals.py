"""Recorded arrival times (scepsy_opt.arrivals, docs/arrivals.md): reading them, their rate
profile, replaying them in the simulator and planning for their peak window."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from scepsy_common.errors import InputError
from scepsy_opt.allocation import load_allocation
from scepsy_opt.arrivals import Arrivals, load_arrivals, peak_target
from scepsy_opt.prediction.simulate import simulate
from scepsy_opt.workflows import generate_trace, load_workflow
from scepsy_profile.roofline import roofline_model

WORKFLOW = str(REPO / "datasets" / "workflows" / "rag.yaml")
ALLOCATION = str(REPO / "datasets" / "allocations" / "rag-16gpu.yaml")
CLUSTER = str(REPO / "datasets" / "clusters" / "a100-16.yaml")


def test_json_lines_in_milliseconds_and_text_in_seconds(tmp_path):
    js = tmp_path / "a.jsonl"
    js.write_text("\n".join(json.dumps({"timestamp": t, "input_length": 10}) for t in
                            (1500, 500, 2500)) + "\n")
    a = load_arrivals(js)
    assert a.times_s.tolist() == [0.0, 1.0, 2.0] and a.count == 3 and a.span_s == 2.0
    txt = tmp_path / "a.txt"
    txt.write_text("# seconds\n3.5\n\n1.5  # a comment\n2\n")
    assert load_arrivals(txt).times_s.tolist() == [0.0, 0.5, 2.0]


@pytest.mark.parametrize("name, text, field", [
    ("a.txt", "1\nsoon\n", "line 2"), ("a.txt", "1\n-2\n", "line 2"),
    ("a.txt", "1\nnan\n", "line 2"), ("a.txt", "# nothing\n", "one or more"),
    ("a.jsonl", '{"timestamp": 1}\n{"input_length": 3}\n', "line 2: timestamp"),
    ("a.jsonl", '{"timestamp": 1}\n{"timestamp": -1}\n', "line 2: timestamp"),
    ("a.jsonl", '{"timestamp": 1}\n[1]\n', "line 2")])
def test_bad_arrival_files_name_the_file_and_the_line(tmp_path, name, text, field):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_arrivals(p)
    assert str(p) in str(e.value) and field in str(e.value)


times = st.lists(st.floats(0, 1000, allow_nan=False), min_size=1, max_size=300)


@settings(max_examples=60, deadline=None)
@given(ts=times, window=st.floats(0.5, 200), q=st.floats(0.01, 1.0))
def test_window_rates_count_every_arrival_of_the_whole_windows(ts, window, q):
    """Oracle: counting arrivals window by window."""
    a = Arrivals(np.array(ts))
    t = a.times_s
    if a.span_s < window:  # a window longer than the span would count time without arrivals
        with pytest.raises(InputError, match="within the arrivals' span"):
            a.window_rates(window)
        return
    rates = a.window_rates(window)
    k = int(a.span_s // window)
    want = [sum(1 for x in t if i * window <= x < (i + 1) * window) / window for i in range(k)]
    assert rates == pytest.approx(want, rel=1e-12)
    assert a.peak_rate(window) == max(rates)
    assert min(rates) <= a.peak_rate(window, q) <= a.peak_rate(window)
    share = np.mean(rates <= a.peak_rate(window, q) + 1e-12)
    assert share >= q - 1e-12  # at least that share of the windows stay within it


@given(ts=times, scale=st.floats(0.1, 10))
def test_a_time_scale_multiplies_every_rate(ts, scale):
    a = Arrivals(np.array(ts))
    b = a.scaled(scale)
    assert b.times_s == pytest.approx(a.times_s / scale, rel=1e-12, abs=1e-12)
    if a.span_s > 0:
        assert b.mean_rate == pytest.approx(a.mean_rate * scale, rel=1e-9)


def test_the_peak_target_of_a_burst():
    # 60 arrivals a minute for 9 minutes, then 240 in the tenth: the peak is 4x the mean of 1.3
    ts = np.concatenate([np.linspace(0, 540, 540, endpoint=False),
                         540 + np.linspace(0, 60, 240, endpoint=False), [600.0]])
    p = peak_target(Arrivals(ts), 60.0)
    assert p.rate == pytest.approx(4.0, rel=1e-12)
    assert p.mean_rate == pytest.approx(780 / 600, rel=1e-12)
    assert p.peak_factor == pytest.approx(4.0 / 1.3, rel=1e-12)
    assert peak_target(Arrivals(ts), 60.0, 0.5).rate == pytest.approx(1.0, rel=1e-12)
    with pytest.raises(InputError, match="quantile"):
        peak_target(Arrivals(ts), 60.0, 0.0)


# ------------------------------------------------------------------ the simulator


@pytest.fixture(scope="module")
def rag():
    spec = load_workflow(WORKFLOW)
    alloc = load_allocation(ALLOCATION)
    return spec, generate_trace(spec, 200, seed=0), alloc


def test_the_simulator_replays_the_given_times(rag):
    spec, trace, alloc = rag
    ts = np.sort(np.random.default_rng(3).uniform(0, 100, 150))
    ts -= ts[0]
    res = simulate(trace, spec.llms, alloc, roofline_model(), {spec.name: 1.0},
                   arrival_times_s=ts, seed=1)
    assert [r.arrival_s for r in res.requests] == pytest.approx(ts.tolist(), abs=1e-9)
    first = simulate(trace, spec.llms, alloc, roofline_model(), {spec.name: 1.0},
                     arrival_times_s=ts, seed=1, requests=40)
    assert len(first.requests) == 40
    with pytest.raises(InputError, match="arrival_times_s"):
        simulate(trace, spec.llms, alloc, roofline_model(), None, arrival_times_s=ts)
    with pytest.raises(InputError, match="arrival_times_s"):
        simulate(trace, spec.llms, alloc, roofline_model(), {spec.name: 1.0},
                 arrival_times_s=ts[::-1])


def test_bursts_wait_longer_than_the_same_rate_evenly_spread(rag):
    """Same count, same span, on 4 GPUs: two bursts of 100 requests queue behind each other;
    evenly spread ones do not (the mean latency at least doubles; measured about 2.8x)."""
    spec, trace, _ = rag
    alloc = load_allocation(REPO / "datasets" / "allocations" / "rag-4gpu.yaml")
    n, span = 200, 100.0
    even = np.linspace(0, span, n)
    burst = np.repeat(np.linspace(0, span, 2), n // 2)
    lat = {}
    for name, ts in (("even", even), ("burst", burst)):
        res = simulate(trace, spec.llms, alloc, roofline_model(), {spec.name: 1.0},
                       arrival_times_s=ts, seed=0, warmup_fraction=0.0)
        lat[name] = res.workflows[spec.name].mean_latency_s
    assert lat["burst"] > 2.0 * lat["even"]


# ------------------------------------------------------------------ the command line


def _arrivals_file(tmp_path, ts):
    p = tmp_path / "arrivals.txt"
    p.write_text("".join(f"{t:.6f}\n" for t in ts))
    return p


def test_simulate_replays_an_arrivals_file(tmp_path):
    ts = np.linspace(0, 50, 101)
    p = _arrivals_file(tmp_path, ts)
    code, out, err = run_cli("simulate", "--workflow", WORKFLOW, "--allocation", ALLOCATION,
                             "--arrivals", str(p), "--time-scale", "2", "--trace-requests",
                             "100", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["workflows"]["rag"]["completed"] == 101
    code, _, err = run_cli("simulate", "--workflow", WORKFLOW, "--allocation", ALLOCATION,
                           "--time-scale", "2", "--trace-requests", "100")
    assert code == 2 and "--time-scale: expected together with arrivals" in err


def test_plan_carries_the_peak_window_of_the_arrivals(tmp_path):
    ts = np.concatenate([np.linspace(0, 240, 120, endpoint=False),
                         240 + np.linspace(0, 60, 300, endpoint=False), [300.0]])
    p = _arrivals_file(tmp_path, ts)
    out = tmp_path / "plan.json"
    code, text, err = run_cli("plan", "--workflow", WORKFLOW, "--cluster", CLUSTER,
                              "--arrivals", str(p), "--peak-window", "60", "--trace-requests",
                              "200", "--quiet", "--out", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["targets"]["rag"] == pytest.approx(5.0, rel=1e-9)  # 300 arrivals in a minute
    got = doc["solver"]["arrivals"]
    assert got["rate"] == pytest.approx(5.0, rel=1e-9) and got["window_s"] == 60
    assert got["mean_rate"] == pytest.approx(420 / 300, rel=1e-9)
    assert "targets from the peak 60 s window" in text
    code, _, _ = run_cli("plan", "--workflow", WORKFLOW, "--cluster", CLUSTER, "--arrivals",
                         str(p), "--peak-window", "60", "--peak-quantile", "0.5",
                         "--trace-requests", "200", "--quiet", "--out", str(out))
    assert code == 0
    assert json.loads(out.read_text())["targets"]["rag"] == pytest.approx(0.5, rel=1e-9)


@pytest.mark.parametrize("argv, message", [
    (("--target", "1"), "--arrivals: expected no targets"),
    (("--peak-window", "100"), "--peak-window: expected a window > 0 s within the arrivals' "
                               "span of 2 s"),
    (("--time-scale", "100"), "--peak-window: expected a window > 0 s within the arrivals' "
                              "span of 0.02 s"),
    (("--peak-quantile", "1.5"), "--peak-quantile: expected a quantile in (0, 1]"),
    (("--peak-window", "0"), "--peak-window")])
def test_plan_refuses_arrivals_flags_that_conflict(tmp_path, argv, message):
    p = _arrivals_file(tmp_path, [0.0, 1.0, 2.0])
    out = tmp_path / "plan.json"
    code, _, err = run_cli("plan", "--workflow", WORKFLOW, "--cluster", CLUSTER,
                           "--arrivals", str(p), *argv, "--quiet", "--out", str(out))
    assert code == 2 and message in err and not out.exists()
    code, _, err = run_cli("plan", "--workflow", WORKFLOW, "--cluster", CLUSTER, "--target",
                           "1", "--peak-window", "60", "--quiet", "--out", str(out))
    assert code == 2 and "--peak-window: expected together with arrivals" in err


def test_a_span_of_one_instant_has_an_infinite_mean_rate():
    assert math.isinf(Arrivals(np.zeros(3)).mean_rate)
