"""``/metrics`` parsing (scepsy_profile.profiling.server.parse_metrics) by prometheus_client's
parser: vLLM-style exposition text with what a regular expression gets wrong (escaped quotes, a
``}`` inside a label value, comments, timestamps), and a property test against prometheus_client's
own writer (random registries of counters, gauges and histograms, exposed, parsed, compared)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from scepsy_profile.profiling.server import histogram_delta, parse_metrics

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="org/model}x"} 2.0
vllm:num_requests_running{engine="1",model_name="org/model}x"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a \\"quoted\\" name, with\\\\slash\\n"} 4.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0 1712345678000
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m{1}"} 3.5
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m{1}"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m{1}"} 3.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m{1}"} 4.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m{1}"} 4.0
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="m{1}"} 0.5
vllm:e2e_request_latency_seconds_bucket{engine="1",le="0.3",model_name="m{1}"} 0.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="1.0",model_name="m{1}"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="m{1}"} 1.0
vllm:e2e_request_latency_seconds_count{engine="1",model_name="m{1}"} 1.0
"""


def test_vllm_text_with_escapes_braces_comments_and_timestamps():
    snap = parse_metrics(VLLM_TEXT)
    # a '}' in model_name cut the regular expression's label set short; both engines summed
    assert snap.value("vllm:num_requests_running") == 3.0
    assert snap.value("vllm:num_requests_waiting") == 4.0
    assert snap.value("vllm:request_success_total") == 10.0  # the timestamped sample too
    assert snap.value("vllm:e2e_request_latency_seconds_count") == 5.0
    assert math.isclose(snap.value("vllm:e2e_request_latency_seconds_sum"), 4.0)
    assert snap.buckets("vllm:e2e_request_latency_seconds") == [(0.3, 1.0), (1.0, 4.0),
                                                               (math.inf, 5.0)]
    assert not any(name.startswith("#") for name, _ in snap.samples)


def test_a_bad_line_costs_that_line_only():
    text = VLLM_TEXT + "garbage line without value\nvllm:bad{engine=\"0\"} not-a-number\n"
    snap = parse_metrics(text)
    assert snap.value("vllm:num_requests_running") == 3.0
    assert snap.value("vllm:e2e_request_latency_seconds_count") == 5.0
    assert ("vllm:bad", None) not in snap.samples


def test_the_regular_expression_got_the_brace_wrong():
    # the regex this parser replaced read `x{a="}"} 2` as name x with labels `a="` and value `"}"`
    snap = parse_metrics('x{a="}"} 2\nx{a="y"} 3\n')
    assert snap.value("x") == 5.0


NAMES = st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), min_size=1, max_size=4,
                 unique=True)
LABEL_VALUES = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                       max_size=8)
VALUES = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)


@st.composite
def registries(draw):
    """A registry with random counters, gauges and histograms, each with 0-3 label sets; the
    expected sums (over label sets) of every exposed sample name and of every bucket."""
    reg = CollectorRegistry()
    expected: dict[tuple[str, str | None], float] = {}

    def add(key, v):
        expected[key] = expected.get(key, 0.0) + v

    for i, base in enumerate(draw(NAMES)):
        kind = draw(st.sampled_from(["counter", "gauge", "histogram"]))
        name = f"m{i}_{base}"
        label_sets = draw(st.lists(LABEL_VALUES, max_size=3, unique=True))
        labelled = bool(label_sets)
        if kind == "counter":
            c = Counter(name, "help", ["lab"] if labelled else [], registry=reg)
            for lv in label_sets or [None]:
                v = draw(VALUES)
                (c.labels(lab=lv) if labelled else c).inc(v)
                add((name + "_total", None), v)
        elif kind == "gauge":
            g = Gauge(name, "help", ["lab"] if labelled else [], registry=reg)
            for lv in label_sets or [None]:
                v = draw(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False))
                (g.labels(lab=lv) if labelled else g).set(v)
                add((name, None), v)
        else:
            bounds = sorted(draw(st.lists(st.floats(min_value=0.001, max_value=100.0),
                                          min_size=1, max_size=5, unique=True)))
            h = Histogram(name, "help", ["lab"] if labelled else [], buckets=bounds,
                          registry=reg)
            for lv in label_sets or [None]:
                obs = draw(st.lists(st.floats(min_value=0.0, max_value=200.0), max_size=6))
                target = h.labels(lab=lv) if labelled else h
                for x in obs:
                    target.observe(x)
                add((name + "_count", None), len(obs))
                add((name + "_sum", None), sum(obs))
                for le in [*bounds, math.inf]:
                    add((name + "_bucket", le), sum(1 for x in obs if x <= le))
    return reg, expected


@settings(max_examples=40, deadline=None)
@given(registries())
def test_round_trip_through_prometheus_clients_writer(drawn):
    reg, expected = drawn
    snap = parse_metrics(generate_latest(reg).decode())
    for (name, le), want in expected.items():
        if le is None:
            got = snap.value(name, default=math.nan)
        else:
            got = dict(snap.buckets(name.removesuffix("_bucket"))).get(le, math.nan)
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9), (name, le, got, want)


def test_histogram_delta_of_parsed_exposition():
    reg = CollectorRegistry()
    h = Histogram("lat_seconds", "h", ["llm"], buckets=[0.5, 1.0, 2.0], registry=reg)
    for x in (0.2, 0.7):
        h.labels(llm="a").observe(x)
    before = parse_metrics(generate_latest(reg).decode())
    for x in (0.6, 0.8, 1.5, 3.0):
        h.labels(llm="b" if x > 1 else "a").observe(x)
    after = parse_metrics(generate_latest(reg).decode())
    d = histogram_delta(before, after, "lat_seconds")
    assert d.count == 4 and math.isclose(d.total, 5.9)
    assert d.buckets == ((0.5, 0.0), (1.0, 2.0), (2.0, 3.0), (math.inf, 4.0))
    assert math.isclose(d.quantile(0.5), 1.0)  # rank 2 = the end of the (0.5, 1] bucket
