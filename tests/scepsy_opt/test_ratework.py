"""Rate-driven workloads (``kind: rates``, docs/rate-workloads.md): the exponential length
distribution, strict parsing, the generated trace, the rates and their rescaling, per-LLM
independence of the prediction, and ``scepsy predict|simulate|plan`` on the bundled examples."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

import scepsy
from conftest import REPO
from scepsy import api
from scepsy.cli import main
from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.prediction.pipeline import WorkflowPrediction
from scepsy_opt.ratework import (
    RateLLM,
    RateWorkload,
    load_rate_workload,
    models,
    parse_rate_workload,
    rate_stats,
    rate_trace,
    rates,
)
from scepsy_opt.workflows import Distribution, load_workload, parse_distribution, reference_timer
from scepsy_opt.workload import load_specs, resolve_rates, workload_trace

WORKLOADS = REPO / "datasets" / "workloads"
MUX = WORKLOADS / "muxserve-a100.yaml"
CPU = WORKLOADS / "cpu-rates.yaml"
CPU_CATALOG = REPO / "datasets" / "catalogs" / "cpu-host.yaml"
CPU_CURVES = REPO / "datasets" / "profiles" / "vllm-cpu-llama-3-8b-x0.0625-curves.json"
CPU_CLUSTER = REPO / "datasets" / "clusters" / "cpu-host.yaml"
A100_16 = REPO / "datasets" / "clusters" / "a100-16.yaml"
RAG = REPO / "datasets" / "workflows" / "rag.yaml"
RAG_ALLOC = REPO / "datasets" / "allocations" / "rag-4gpu.yaml"


def _two_llms(rate_a: float = 2.0, rate_b: float = 1.0) -> RateWorkload:
    return RateWorkload("pair", {
        "a": RateLLM("llama-7b", rate_a, Distribution.lognormal(300, 1.0, min=4, max=1500),
                     Distribution.exponential(150, min=1, max=500)),
        "b": RateLLM("llama-13b", rate_b, Distribution.constant(200),
                     Distribution.exponential(80, min=1, max=400)),
    })


# --------------------------------------------------------------------- exponential lengths


def _clipped_mean_by_quadrature(mean: float, lo: float, hi: float) -> float:
    """E[clip(X, lo, hi)] = lo + ∫_lo^hi P(X > x) dx for X ~ Exp(mean), lo >= 0, by scipy's
    quadrature of scipy's survival function (cut where it is below e^-60 of its start)."""
    sf = stats.expon(scale=mean).sf
    end = min(hi, lo + 60 * mean)
    return lo + integrate.quad(sf, lo, end, epsabs=1e-13, epsrel=1e-12, limit=200)[0]


@pytest.mark.parametrize(("mean", "lo", "hi"), [(128, 0, math.inf), (128, 1, 512),
                                                (180, 1, 512), (2.0, 2.5, 4.0), (50, 60, 70)])
def test_exponential_mean_is_the_clipped_closed_form(mean, lo, hi):
    d = Distribution.exponential(mean, min=lo or None, max=None if math.isinf(hi) else hi)
    assert d.mean() == pytest.approx(_clipped_mean_by_quadrature(mean, lo, hi), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(mean=st.floats(0.01, 1e4), a=st.floats(0, 1e4), width=st.floats(0, 1e4))
def test_exponential_clipped_mean_property(mean, a, width):
    d = Distribution.exponential(mean, min=a, max=a + width)
    m = d.mean()
    assert a - 1e-9 <= m <= a + width + 1e-9  # a clipped mean lies in [min, max]
    assert m == pytest.approx(_clipped_mean_by_quadrature(mean, a, a + width), rel=1e-7, abs=1e-9)


def test_exponential_samples_are_numpys_clipped_draws():
    # the same stream as numpy's own exponential sampler, clipped: an exact reference
    d = Distribution.exponential(128, min=1, max=512)
    x = d.sample(np.random.default_rng(7), 10_000)
    ref = np.clip(np.random.default_rng(7).exponential(128, 10_000), 1, 512)
    np.testing.assert_array_equal(x, ref)


def test_exponential_sample_mean_and_shape_match_scipy():
    # 200k draws: the sample mean is within 4 standard errors (about 1.1% of the mean here) of
    # the exact mean, and a Kolmogorov-Smirnov test against scipy's expon does not reject
    d = Distribution.exponential(100.0)
    x = d.sample(np.random.default_rng(3), 200_000)
    se = x.std(ddof=1) / math.sqrt(x.size)
    assert abs(x.mean() - 100.0) <= 4 * se
    assert x.std() == pytest.approx(100.0, rel=0.02)  # cv 1
    assert stats.kstest(x, stats.expon(scale=100.0).cdf).pvalue > 1e-3
    assert d.support() == (0.0, math.inf)


def test_exponential_in_yaml_and_errors():
    assert parse_distribution({"kind": "exponential", "mean": 64, "min": 1}) == \
        Distribution.exponential(64, min=1)
    for bad in ({"kind": "exponential", "mean": -1}, {"kind": "exponential", "mean": 0}):
        with pytest.raises(InputError, match=re.escape("f.yaml: d.mean: expected a number > 0")):
            parse_distribution(bad, "f.yaml", "d")


# ------------------------------------------------------------------------------- parsing


def test_bundled_rate_workloads_load():
    mux = load_rate_workload(MUX)
    assert rates(mux) == {"llama-7b-a": 6.0, "llama-7b-b": 2.0, "llama-13b": 1.5,
                          "llama-30b": 0.5}
    assert models(mux) == {"llama-7b-a": "llama-7b", "llama-7b-b": "llama-7b",
                           "llama-13b": "llama-13b", "llama-30b": "llama-30b"}
    assert mux.llms["llama-30b"].output == Distribution.exponential(200, min=1, max=512)
    specs = mux.specs()
    assert [s.name for s in specs] == list(rates(mux))
    assert all(s.program == "call" and dict(s.llms) == {s.name: models(mux)[s.name]}
               and s.weight == rates(mux)[s.name] for s in specs)
    assert load_specs(MUX) == specs
    with api.using_catalog(CPU_CATALOG):
        cpu = load_rate_workload(CPU)
    assert set(models(cpu).values()) == {"llama-3-8b:x0.0625"} and cpu.reference_gpu == "cpu"


def _write(tmp_path: Path, doc: object, name: str = "rates.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _doc() -> dict:
    return {"kind": "rates", "name": "w", "llms": {
        "x": {"model": "llama-7b", "rate": 1.0, "input": 100,
              "output": {"kind": "exponential", "mean": 50, "min": 1}},
        "y": {"model": "llama-13b", "rate": 0.5, "input": 200, "output": 20}}}


@pytest.mark.parametrize(("change", "field", "expected"), [
    (lambda d: d.update(colour="red"), "colour", "unknown field"),
    (lambda d: d["llms"]["x"].update(cv=1), "llms.x.cv", "unknown field"),
    (lambda d: d["llms"]["x"].update(rate=-1), "llms.x.rate", ">= 0"),
    (lambda d: d["llms"]["x"].update(rate=True), "llms.x.rate", "number"),
    (lambda d: d["llms"]["x"].update(rate="fast"), "llms.x.rate", "number"),
    (lambda d: d["llms"]["x"].update(model="llama-8b"), "llms.x.model", "known model name"),
    (lambda d: d["llms"]["x"].pop("input"), "llms.x.input", "missing"),
    (lambda d: d["llms"]["x"].update(output={"kind": "exponential", "mean": -3}),
     "llms.x.output.mean", "> 0"),
    (lambda d: d["llms"]["x"].update(input={"kind": "uniform", "low": -5, "high": 5}),
     "llms.x.input", "non-negative"),
    (lambda d: d["llms"].update({"bad name": d["llms"]["x"]}), "llms", "name"),
    (lambda d: d.update(name="a b"), "name", "name"),
    (lambda d: d.update(kind="rate"), "kind", "rates"),
    (lambda d: d.update(llms={}), "llms", "at least 1"),
    (lambda d: [v.update(rate=0) for v in d["llms"].values()], "llms", "rate > 0"),
    (lambda d: d["llms"]["x"].update(rate=1e-320), "llms.x.rate",
     "0 (not served) or a rate in [1e-06, 1e+06] requests/s"),
    (lambda d: d.update(reference_gpu="Z100"), "reference_gpu", "GPU"),
])
def test_bad_rate_files_name_file_and_field(tmp_path, change, field, expected):
    doc = _doc()
    change(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(InputError) as info:
        load_rate_workload(path)
    e = info.value
    assert e.source == str(path) and e.field.startswith(field), str(e)
    assert expected in str(e), str(e)


def test_duplicate_keys_and_non_mappings_are_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("kind: rates\nname: w\nname: v\nllms: {}\n")
    with pytest.raises(InputError, match=re.escape("dup.yaml")):
        load_rate_workload(path)
    with pytest.raises(InputError, match="a YAML mapping"):
        parse_rate_workload([1, 2], "list.yaml")


def test_zero_rate_llm_is_declared_but_not_served(tmp_path):
    doc = _doc()
    doc["llms"]["y"]["rate"] = 0
    w = load_rate_workload(_write(tmp_path, doc))
    assert set(w.llms) == {"x", "y"} and w.llms["y"].rate == 0.0
    assert rates(w) == {"x": 1.0} and models(w) == {"x": "llama-7b"}
    assert [s.name for s in w.specs()] == ["x"]


def test_python_construction_checks_itself():
    with pytest.raises(InputError, match=re.escape("rate workload 'pair': llms.a.rate")):
        _two_llms(rate_a=-1.0)
    with pytest.raises(InputError, match=re.escape("llms.a.rate")):
        _two_llms(rate_a=math.inf)
    w = RateWorkload("w", {"a": RateLLM("huggyllama/llama-7b", 1, Distribution.constant(5),
                                        Distribution.constant(5))})
    assert models(w) == {"a": "llama-7b"}  # an alias resolves to the canonical name
    assert _two_llms() == _two_llms() and hash(_two_llms()) == hash(_two_llms())
    assert _two_llms(rate_b=2.0) != _two_llms()
    with pytest.raises(AttributeError):
        w.name = "v"  # frozen


def test_a_workload_cannot_list_a_rate_file(tmp_path):
    rate_file = _write(tmp_path, _doc())
    workload = _write(tmp_path, {"workflows": [rate_file.name]}, "mix.yaml")
    with pytest.raises(InputError) as info:
        load_workload(workload)
    assert info.value.source == str(rate_file) and info.value.field == "kind"
    assert "rate workload" in str(info.value)


# --------------------------------------------------------------------------------- trace


def test_rate_trace_shape_and_lengths():
    w = _two_llms()
    n = 3000
    tr = rate_trace(w, n, seed=4)
    assert tr.workflows() == ["a", "b"]
    assert len(tr.calls) == 2 * n and len(tr.requests) == 2 * n  # one call per request
    keys = [(c.workflow, c.request_id) for c in tr.calls]
    assert len(set(keys)) == len(keys)  # request ids unique within each workflow
    assert all(c.llm == c.workflow and c.call_id == "c0" and c.parents == () and c.tool is None
               for c in tr.calls)
    for name, llm in w.llms.items():
        mine = [c for c in tr.calls if c.workflow == name]
        assert {c.request_id for c in mine} == {f"r{i}" for i in range(n)}
        for part, dist in (("input_tokens", llm.input), ("output_tokens", llm.output)):
            x = np.array([getattr(c, part) for c in mine], dtype=float)
            lo, hi = dist.support()
            assert x.min() >= max(1, math.floor(lo)) and x.max() <= hi
            # rounding to whole tokens moves the mean by well under half a token
            se = x.std(ddof=1) / math.sqrt(n)
            assert abs(x.mean() - dist.mean()) <= 4 * se + 0.5, (name, part)


def test_rate_trace_durations_come_from_the_reference_timer():
    w = _two_llms()
    tr = rate_trace(w, 2000, seed=1)
    for spec in w.specs():
        timer = reference_timer(spec)
        mine = [c for c in tr.calls if c.workflow == spec.name]
        ratio = np.array([c.duration_s / timer.zero_load_s(spec.name, c.input_tokens,
                                                           c.output_tokens) for c in mine])
        # the timer's log-normal jitter: mean 1, cv 0.1 (4 standard errors: about ±0.009)
        assert abs(ratio.mean() - 1.0) <= 4 * 0.1 / math.sqrt(ratio.size)
        assert ratio.std() == pytest.approx(0.1, rel=0.1)


def test_rate_trace_is_deterministic_and_is_the_workloads_trace():
    w = load_rate_workload(MUX)
    tr = rate_trace(w, 200, seed=3)
    assert rate_trace(w, 200, seed=3).calls == tr.calls
    assert rate_trace(w, 200, seed=4).calls != tr.calls
    assert workload_trace(load_specs(MUX), requests=200, seed=3).calls == tr.calls
    faster = RateWorkload(w.name, {**w.llms, "llama-13b": RateLLM(
        "llama-13b", 9.0, w.llms["llama-13b"].input, w.llms["llama-13b"].output)},
        w.reference_gpu)
    assert rate_trace(faster, 200, seed=3).calls == tr.calls  # rates are not in the trace
    with pytest.raises(InputError, match="requests_per_llm"):
        rate_trace(w, 0)


def test_rate_stats_are_the_traces_statistics():
    w = _two_llms()
    tr = rate_trace(w, 1000, seed=2)
    st_ = rate_stats(w, 1000, seed=2)
    assert set(st_) == {"a", "b"}
    for name, s in st_.items():
        assert set(s.llms) == {name} and s.requests == 1000
        llm = s.llms[name]
        assert llm.n == 1.0 and llm.p == 1.0 and llm.critical_calls == 1.0
        mine = [c for c in tr.calls if c.workflow == name]
        assert llm.input_mean == pytest.approx(np.mean([c.input_tokens for c in mine]))
        assert llm.output_mean == pytest.approx(np.mean([c.output_tokens for c in mine]))
        assert s.latency_mean_s == pytest.approx(np.mean([c.duration_s for c in mine]))


# --------------------------------------------------------------------------------- rates


@settings(max_examples=50, deadline=None)
@given(total=st.floats(1e-3, 1e4))
def test_a_total_rescales_the_file_rates_proportionally(total):
    w = load_rate_workload(MUX)
    file_rates = rates(w)
    got = resolve_rates(w.specs(), total, file_rates)
    assert sum(got.values()) == pytest.approx(total, rel=1e-12)
    scale = total / sum(file_rates.values())
    for name, r in file_rates.items():
        assert got[name] == pytest.approx(r * scale, rel=1e-12)


def test_rates_default_to_the_file_and_are_required_otherwise():
    w = load_rate_workload(MUX)
    assert resolve_rates(w.specs(), None, rates(w)) == rates(w)
    assert resolve_rates(w.specs(), {"llama-30b": 3.0}, rates(w)) == {"llama-30b": 3.0}
    with pytest.raises(InputError, match="rate: expected a total rate > 0"):
        resolve_rates(load_specs(RAG), None, None)


# ------------------------------------------------------------------- prediction, per LLM

SEPARATE = Allocation({"a": Instance("A100-80GB", 1, 1.0, 1),
                       "b": Instance("A100-80GB", 1, 1.0, 1)})


def test_predict_uses_the_file_rates_and_rescales_them():
    w = _two_llms()
    own = scepsy.predict(w, SEPARATE, trace_requests=300)
    assert {n: p.rate for n, p in own.workflows.items()} == rates(w)
    doubled = scepsy.predict(w, SEPARATE, 6.0, trace_requests=300)
    assert {n: p.rate for n, p in doubled.workflows.items()} == pytest.approx(
        {"a": 4.0, "b": 2.0})


def test_changing_one_llms_rate_leaves_the_other_llms_prediction_alone():
    # Two LLMs on their own GPUs share nothing: LLM b's rate must not move LLM a's latency,
    # maximum throughput or tail percentiles.
    base = scepsy.predict(_two_llms(rate_b=1.0), SEPARATE, trace_requests=300)
    busy = scepsy.predict(_two_llms(rate_b=8.0), SEPARATE, trace_requests=300)
    a0, a1 = base.workflows["a"], busy.workflows["a"]
    assert busy.llms["b"].utilisation > 4 * base.llms["b"].utilisation
    assert a1.mean_latency_s == pytest.approx(a0.mean_latency_s, rel=1e-12)
    assert busy.llms["a"] == base.llms["a"]
    assert a1.max_throughput == pytest.approx(a0.max_throughput, rel=1e-12)
    assert a1.bottleneck == "a" and not a1.saturated and a1.throughput == a1.rate
    for q in ("p50_latency_s", "p90_latency_s", "p99_latency_s"):
        assert getattr(a1, q) == pytest.approx(getattr(a0, q), rel=1e-12)


# ---------------------------------------------------------------------------------- CLI


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


CPU_ARGS = ["--catalog", CPU_CATALOG, "--curves", CPU_CURVES, "--trace-requests", "200"]


@pytest.fixture(scope="module")
def cpu_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cpu") / "plan.json"
    rc = main([str(a) for a in ["plan", "--workflow", CPU, "--cluster", CPU_CLUSTER, *CPU_ARGS,
                                "--tp", "1", "--out", out, "--quiet", "--json"]])
    assert rc == 0
    return out


def test_cli_plan_uses_the_file_rates(cpu_plan):
    doc = json.loads(cpu_plan.read_text())
    assert {w: round(x["throughput"], 9) for w, x in doc["workflows"].items()} == \
        {"chat": 2.0, "summarise": 1.0}


def test_cli_predict_and_simulate_on_the_cpu_example(cpu_plan, capsys):
    rc, out, _ = _run(capsys, ["predict", "--workflow", CPU, "--allocation", cpu_plan,
                               *CPU_ARGS, "--json"])
    assert rc == 0
    doc = json.loads(out)
    assert {w: x["rate"] for w, x in doc["workflows"].items()} == {"chat": 2.0, "summarise": 1.0}
    present = {f.name for f in fields(WorkflowPrediction)}
    for key in {"throughput", "saturated", "p90_latency_s"} & present:
        assert all(key in x for x in doc["workflows"].values())
    rc, out, _ = _run(capsys, ["predict", "--workflow", CPU, "--allocation", cpu_plan,
                               *CPU_ARGS, "--rate", "6"])
    assert rc == 0
    header = out.splitlines()[0].split()
    assert header[:6] == ["workflow", "rate", "throughput", "max_throughput", "bottleneck",
                          *(["saturated"] if "saturated" in present else ["mean_latency_s"])]
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:3]}
    assert float(rows["chat"][1]) == 4.0 and float(rows["summarise"][1]) == 2.0  # rescaled
    rc, out, _ = _run(capsys, ["simulate", "--workflow", CPU, "--allocation", cpu_plan,
                               *CPU_ARGS, "--requests", "300", "--json"])
    assert rc == 0
    sim = json.loads(out)
    assert set(sim["workflows"]) == {"chat", "summarise"}
    assert sum(x["completed"] for x in sim["workflows"].values()) == 300
    assert all("p99_latency_s" in x for x in sim["workflows"].values())


def test_cli_plan_predict_simulate_on_the_muxserve_example(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    rc, out, err = _run(capsys, ["plan", "--workflow", MUX, "--cluster", A100_16,
                                 "--trace-requests", "200", "--out", plan, "--quiet"])
    assert rc == 0, err
    assert "targets (req/s): llama-13b 1.5, llama-30b 0.5, llama-7b-a 6, llama-7b-b 2" in out
    rc, out, _ = _run(capsys, ["predict", "--workflow", MUX, "--allocation", plan,
                               "--trace-requests", "200", "--json"])
    assert rc == 0
    pred = json.loads(out)
    assert all(x["throughput"] == x["rate"] for x in pred["workflows"].values())
    rc, out, _ = _run(capsys, ["simulate", "--workflow", MUX, "--allocation", plan,
                               "--trace-requests", "200", "--requests", "200"])
    assert rc == 0 and "p99_latency_s" in out.splitlines()[0]


def test_cli_trace_generate_reads_a_rate_workload(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    rc, text, _ = _run(capsys, ["trace", "generate", "--workflow", MUX, "--requests", "5",
                                "--out", out])
    assert rc == 0 and text.startswith("wrote 20 calls of 20 requests")


@pytest.mark.parametrize(("change", "needle"), [
    (lambda d: d["llms"]["x"].update(rate=-2), "llms.x.rate: expected"),
    (lambda d: d["llms"]["x"].update(model="llama-8b"), "llms.x.model: expected"),
    (lambda d: d["llms"]["x"].update(speed=3), "llms.x.speed: expected no such field"),
])
def test_cli_bad_rate_file_exits_2_with_one_line(tmp_path, capsys, change, needle):
    doc = _doc()
    change(doc)
    bad = _write(tmp_path, doc)
    out = tmp_path / "plan.json"
    for argv in (["plan", "--workflow", bad, "--cluster", A100_16, "--out", out],
                 ["predict", "--workflow", bad, "--allocation", RAG_ALLOC],
                 ["simulate", "--workflow", bad, "--allocation", RAG_ALLOC]):
        rc, text, err = _run(capsys, argv)
        assert rc == 2 and text == ""
        assert err.count("\n") == 1 and err.startswith(f"scepsy: error: {bad}: ")
        assert needle in err, err
    assert list(tmp_path.iterdir()) == [bad]  # nothing written


@pytest.mark.parametrize(("argv", "needle"), [
    (["predict", "--workflow", RAG, "--allocation", RAG_ALLOC], "--rate: expected a total rate"),
    (["simulate", "--workflow", RAG, "--allocation", RAG_ALLOC], "--rate: expected a total rate"),
    (["plan", "--workflow", RAG, "--cluster", A100_16], "--target: expected a total rate"),
    (["plan", "--workflow", RAG, "--cluster", A100_16, "--target", "2",
      "--latency-bound", "rag=90:"], "--latency-bound: expected PCT:SECONDS"),
    (["plan", "--workflow", RAG, "--cluster", A100_16, "--target", "2",
      "--latency-bound", "rag=100:2"], "--latency-bound: expected PCT:SECONDS"),
    (["plan", "--workflow", RAG, "--cluster", A100_16, "--target", "2",
      "--latency-bound", "90:2", "--latency-bound", "rag=90:2"], "either one PCT:SECONDS"),
    (["plan", "--workflow", MUX, "--cluster", A100_16, "--latency-bound", "nope=90:2"],
     "--latency-bound: nope: expected a workflow of the workload"),
])
def test_cli_rate_and_bound_mistakes_exit_2(tmp_path, capsys, argv, needle):
    out = tmp_path / "plan.json"
    if argv[0] == "plan":
        argv = [*argv, "--out", out]
    rc, text, err = _run(capsys, argv)
    assert rc == 2 and text == "" and err.count("\n") == 1, err
    assert needle in err, err
    assert not out.exists()


def test_percentile_bounds_reach_the_plan_options(monkeypatch):

    problem, _ = api.plan_problem(MUX, A100_16, trace_requests=50,
                                         latency_bounds=(90, 30.0))
    assert dict(problem.options.latency_bounds) == dict.fromkeys(rates(load_rate_workload(MUX)),
                                                                 (90.0, 30.0))
    problem, _ = api.plan_problem(MUX, A100_16, trace_requests=50,
                                         latency_bounds={"llama-30b": (99, 20)})
    assert dict(problem.options.latency_bounds) == {"llama-30b": (99.0, 20.0)}


# ------------------------------------------------------------------------- overheads


def test_overheads_wrap_the_latency_model(tmp_path, capsys):
    from scepsy_profile import overheads
    calib = overheads.EngineOverheads("vllm", "test", "A100-80GB", iteration_ms=5.0,
                                      per_token_ms=0.1, first_token_ms=200.0, http_ms=20.0)
    path = tmp_path / "overheads.yaml"
    overheads.save_overheads(calib, path)
    w = _two_llms()
    plain = scepsy.predict(w, SEPARATE, trace_requests=200)
    slow = scepsy.predict(w, SEPARATE, trace_requests=200, overheads=path)
    assert scepsy.predict(w, SEPARATE, trace_requests=200, overheads=calib) == slow
    for name in ("a", "b"):  # at least the pure per-call delay is added to every call
        assert slow.workflows[name].mean_latency_s >= \
            plain.workflows[name].mean_latency_s + calib.call_delay_s - 1e-9
    rc, _, err = _run(capsys, ["predict", "--workflow", RAG, "--allocation", RAG_ALLOC,
                               "--rate", "1", "--overheads", tmp_path / "missing.yaml"])
    assert rc == 2 and "missing.yaml" in err and err.count("\n") == 1


def test_cli_overheads_reach_predict_simulate_and_plan(tmp_path, cpu_plan, capsys):
    from scepsy_profile import overheads
    path = tmp_path / "o.json"
    overheads.save_overheads(overheads.EngineOverheads("vllm", "t", "cpu", first_token_ms=300.0),
                             path)
    common = ["--workflow", CPU, "--allocation", cpu_plan, *CPU_ARGS, "--json"]
    for cmd, extra in (("predict", []), ("simulate", ["--requests", "200"])):
        docs = []
        for more in ([], ["--overheads", path]):
            rc, out, err = _run(capsys, [cmd, *common, *extra, *more])
            assert rc == 0, err
            docs.append(json.loads(out))
        for w in ("chat", "summarise"):  # a pure 0.3 s delay per call, one call per request
            before, after = (d["workflows"][w]["mean_latency_s"] for d in docs)
            assert after >= before + 0.3 - 1e-6, (cmd, w, before, after)
    out = tmp_path / "plan.json"
    rc, _, err = _run(capsys, ["plan", "--workflow", CPU, "--cluster", CPU_CLUSTER, *CPU_ARGS,
                               "--tp", "1", "--overheads", path, "--out", out, "--json"])
    assert rc == 0, err
    lat = {w: x["mean_latency_s"] for w, x in json.loads(out.read_text())["workflows"].items()}
    assert min(lat.values()) >= 0.3


def test_cli_percentile_bounds_are_planned_and_reported(tmp_path, capsys):

    out = tmp_path / "plan.json"
    rc, text, err = _run(capsys, ["plan", "--workflow", MUX, "--cluster", A100_16,
                                  "--trace-requests", "200", "--out", out, "--quiet",
                                  "--latency-bound", "llama-30b=90:60"])
    assert rc == 0, err
    assert "subject to llama-30b p90 <= 60 s" in text
