"""``scepsy validate``: MuxServe's measured runs read, co-location and finite runs modelled,
overheads fitted, and the command's output (docs/validate.md)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import BUNDLED_CURVES, REPO, SHARED_DATA, run_cli
from scepsy_common.errors import InputError
from scepsy_opt.prediction.slo import CallSLO
from scepsy_opt.validate.evaluate import (
    OUTPUT_CV,
    Figures,
    combine,
    decoding_ratio,
    grew,
    validate_run,
)
from scepsy_opt.validate.finite import (
    _admission_wait,
    backlog_waits,
    finite_run,
    finite_run_recorded,
    walk_wait,
)
from scepsy_opt.validate.fit import fit_output_cv, fit_overheads, lognormal_ratios
from scepsy_opt.validate.muxserve import MeasuredLLM, load_muxserve_dir, load_muxserve_workload
from scepsy_opt.validate.report import document, run_rows, validate_muxserve
from scepsy_profile.latency import CompositeLatencyModel
from scepsy_profile.mps import (
    CoRunner,
    PhaseShareModel,
    contended_shares,
    job_parts,
    jobs_fit,
)
from scepsy_profile.overheads import (
    MUXSERVE_A100,
    EngineOverheads,
    load_overheads,
    with_overheads,
)
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import MemoryPolicy, serving_curve

MUX = SHARED_DATA / "e2e" / "muxserve-chatlmsys"
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True)
STEM = "toy_load"
CKPT = "/ckpt/huggyllama/"


@pytest.fixture(scope="module")
def latency(bundled_curves):
    return CompositeLatencyModel(bundled_curves, roofline_model())


# ------------------------------------------------------------------ a small folder to read


def _measured(rate: float, n: int, mps=(100, 90), lengths=(100.0, 200.0)) -> dict:
    """One LLM's results entry; its token counts give ``lengths`` (prompt, output) per
    request."""
    prompt, output = lengths
    return {"model_name": "x", "mps": list(mps), "first_token_latency": 0.2,
            "output_per_token_latency": 0.03, "request_num": n, "throughput": 0.95 * rate,
            "tokens_throughput": 0.95 * rate * (prompt + output), "p90[TTFT]": 0.4, "p99[TTFT]": 0.8, "p95[TTFT]": 0.5,
            "p90[TPOT]": 0.05, "p95[TPOT]": 0.06, "p99[TPOT]": 0.07, "p90[avg_latency]": 12.0,
            "p95[avg_latency]": 14.0, "p99[avg_latency]": 20.0, "prefill_avg_batches": 1.0,
            "prefill_batch_times": 10, "decoding_avg_batches": output * n / 100,
            "decoding_batch_times": 100}


def toy_folder(root: Path, *, strategies=("spatial", "flexsm"), rates=(2.0, 1.0),
               mps=((80, 60), (90, 70))) -> Path:
    """Two LLaMA-7B LLMs on 2 GPUs: alone on one GPU each (spatial), or sharing one mesh of 2
    GPUs under MPS (flexsm, limits adding up to more than 100)."""
    (root / "yamls").mkdir(parents=True)
    (root / "merged").mkdir()
    names = ["llm-1", "llm-2"]
    (root / "yamls" / f"{STEM}.yaml").write_text(yaml.safe_dump({
        "cluster": {"nnodes": 1, "ngpus_per_node": 2},
        "models": [{"name": m, "model": CKPT + "llama-7b", "rate": r}
                   for m, r in zip(names, rates, strict=True)],
        "avg_output_len": 200.0, "avg_prompt_len": 100.0}))
    for s in strategies:
        (root / "yamls" / s).mkdir()
        if s == "flexsm":
            meshes = [[(m, 2, list(p)) for m, p in zip(names, mps, strict=True)]]
        else:
            meshes = [[(m, 1, [100, 90])] for m in names]
        for i, mesh in enumerate(meshes):
            doc = {"num_gpus": mesh[0][1], "max_num_seqs": 256, "overload_threshold": 2,
                   "gpu_memory_utilization": 0.5,
                   "models": [{"name": m, "model": CKPT + "llama-7b", "tensor_parallel_size": tp,
                               "pipeline_parallel_size": 1, "placement": [list(range(tp))],
                               "mps_percentage": p, "max_num_seqs": 64, "model_dtype": "fp16"}
                              for m, tp, p in mesh]}
            name = f"{STEM}_GPUnum2_mesh_size{mesh[0][1]}_idx{i}_{s}.yaml"
            (root / "yamls" / s / name).write_text(yaml.safe_dump(doc))
        recorded = dict(zip(names, mps, strict=True)) if s == "flexsm" else {}
        merged = {m: _measured(r, int(60 * r), recorded.get(m, (100, 90)))
                  for m, r in zip(names, rates, strict=True)}
        merged.update({"throughput": 1.0, "request_num": 180})
        (root / "merged" / f"merged_{STEM}_placement_{STEM}_GPUnum2_{s}.json").write_text(
            json.dumps(merged))
    return root


def test_prefills_take_the_larger_limit_as_muxserves_engine_does(tmp_path):
    """MuxServe's ``estimate_mps``: prefills at the larger percentage, decodes at the smaller,
    whatever their order in the file (and in the results' recorded ``mps``)."""
    runs = load_muxserve_dir(toy_folder(tmp_path, strategies=("flexsm",),
                                        mps=((60, 80), (90, 70))))
    assert [(x.prefill_pct, x.decode_pct) for x in runs[0].meshes[0].llms] == [
        (80.0, 60.0), (90.0, 70.0)]


def test_a_folder_is_read_into_runs(tmp_path):
    runs = load_muxserve_dir(toy_folder(tmp_path))
    assert [(r.workload, r.strategy) for r in runs] == [(STEM, "spatial"), (STEM, "flexsm")]
    spatial, flexsm = runs
    assert spatial.models == {"llm-1": "llama-7b", "llm-2": "llama-7b"}
    assert spatial.rates == {"llm-1": 2.0, "llm-2": 1.0}
    assert len(spatial.meshes) == 2 and len(flexsm.meshes) == 1
    shared = flexsm.mesh_of("llm-2")
    assert shared.gpus == 2 and [(x.prefill_pct, x.decode_pct) for x in shared.llms] == [
        (80.0, 60.0), (90.0, 70.0)]
    m = spatial.measured["llm-1"]
    assert m.requests == 120 and m.p90_ttft_s == 0.4
    assert m.mean_latency_s(200.0) == pytest.approx(0.2 + 0.03 * 200, rel=1e-12)


def test_each_llms_lengths_come_from_its_token_counts(tmp_path):
    """Oracle: counts written for known lengths give those lengths back; without the counts
    the workload's means stand for every LLM; counts that leave no prompt are refused."""
    root = toy_folder(tmp_path, strategies=("spatial",))
    path = next((root / "merged").glob("*.json"))
    doc = json.loads(path.read_text())
    doc["llm-2"] = _measured(1.0, 60, lengths=(37.0, 410.0))
    path.write_text(json.dumps(doc))
    run = load_muxserve_dir(root)[0]
    assert run.lengths("llm-1") == pytest.approx((100.0, 200.0), rel=1e-12)
    assert run.lengths("llm-2") == pytest.approx((37.0, 410.0), rel=1e-12)
    del doc["llm-2"]["decoding_batch_times"]
    path.write_text(json.dumps(doc))
    assert load_muxserve_dir(root)[0].lengths("llm-2") == (100.0, 200.0)  # the workload's
    doc["llm-2"] = _measured(1.0, 60, lengths=(0.0, 300.0))
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"llm-2\.tokens_throughput"):
        load_muxserve_dir(root)


def _edit_yaml(path: Path, fn) -> None:
    doc = yaml.safe_load(path.read_text())
    fn(doc)
    path.write_text(yaml.safe_dump(doc))


def _mesh_file(root: Path, s: str = "flexsm") -> Path:
    return next((root / "yamls" / s).glob("*.yaml"))


@pytest.mark.parametrize("case, field", [
    ("unknown-llm", "models[0].name"),
    ("bad-mps", "models[0].mps_percentage"),
    ("tp-too-large", "models[0].tensor_parallel_size"),
    ("unknown-model", "models[0].model"),
    ("no-measurement", "llm-2"),
    ("bad-rate", "models[1].rate"),
    ("not-placed", "toy_load flexsm"),
])
def test_bad_input_names_the_file_and_the_field(tmp_path, case, field):
    root = toy_folder(tmp_path)
    mesh = _mesh_file(root)
    if case == "unknown-llm":
        _edit_yaml(mesh, lambda d: d["models"][0].update(name="llm-9"))
    elif case == "bad-mps":
        _edit_yaml(mesh, lambda d: d["models"][0].update(mps_percentage=[120, 50]))
    elif case == "tp-too-large":
        _edit_yaml(mesh, lambda d: d["models"][0].update(tensor_parallel_size=4))
    elif case == "unknown-model":
        _edit_yaml(mesh, lambda d: d["models"][0].update(model="/ckpt/no-such-llm"))
    elif case == "no-measurement":
        f = next((root / "merged").glob("*flexsm.json"))
        doc = json.loads(f.read_text())
        del doc["llm-2"]
        f.write_text(json.dumps(doc))
    elif case == "bad-rate":
        _edit_yaml(root / "yamls" / f"{STEM}.yaml", lambda d: d["models"][1].update(rate=-1))
    elif case == "not-placed":
        _edit_yaml(mesh, lambda d: d.update(models=d["models"][:1]))
    with pytest.raises(InputError) as exc:
        load_muxserve_dir(root)
    assert exc.value.field == field
    assert exc.value.source.startswith(str(root))


def test_the_limits_the_run_recorded_win_over_the_yaml(tmp_path):
    root = toy_folder(tmp_path)
    f = next((root / "merged").glob("*flexsm.json"))
    doc = json.loads(f.read_text())
    doc["llm-1"]["mps"] = [100, 40]
    f.write_text(json.dumps(doc))
    flexsm = load_muxserve_dir(root)[1]
    got = {x.name: (x.prefill_pct, x.decode_pct) for x in flexsm.mesh_of("llm-1").llms}
    assert got == {"llm-1": (100.0, 40.0), "llm-2": (90.0, 70.0)}
    doc["llm-1"]["mps"] = [100, 140]
    f.write_text(json.dumps(doc))
    with pytest.raises(InputError) as exc:
        load_muxserve_dir(root)
    assert exc.value.field == "llm-1.mps"


def test_one_results_file_per_load_and_strategy(tmp_path):
    root = toy_folder(tmp_path, strategies=("spatial",))
    f = next((root / "merged").glob("*spatial.json"))
    (root / "merged" / f.name.replace("GPUnum2", "GPUnum4")).write_text(f.read_text())
    with pytest.raises(InputError, match="one results file"):
        load_muxserve_dir(root)


def test_a_missing_result_or_a_zero_rate_is_named(tmp_path):
    root = toy_folder(tmp_path)
    f = next((root / "merged").glob("*spatial.json"))
    doc = json.loads(f.read_text())
    del doc["llm-1"]
    f.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="a results entry for LLM llm-1"):
        load_muxserve_dir(root)
    root = toy_folder(tmp_path / "z")
    _edit_yaml(root / "yamls" / f"{STEM}.yaml", lambda d: d["models"][0].update(rate=0))
    with pytest.raises(InputError, match="rate > 0") as exc:
        load_muxserve_dir(root)
    assert exc.value.field == "models[0].rate"


def test_a_mesh_too_small_for_one_call_is_named(tmp_path, latency):
    root = toy_folder(tmp_path)
    _edit_yaml(_mesh_file(root), lambda d: d.update(gpu_memory_utilization=0.0005))
    run = load_muxserve_dir(root)[1]
    with pytest.raises(InputError) as exc:
        validate_run(run, latency, simulate_runs=False)
    assert exc.value.field.startswith("gpu_memory_utilization (of llm-")
    assert exc.value.source == str(_mesh_file(root))


def test_fitting_refuses_flags_it_would_ignore(tmp_path):
    root = toy_folder(tmp_path / "d")
    code, _, err = run_cli("validate", "muxserve", str(root), "--fit-overheads",
                           str(tmp_path / "o.yaml"), "--json", str(tmp_path / "v.json"))
    assert code == 2 and "--json" in err
    assert not (tmp_path / "o.yaml").exists()


def test_an_llm_placed_twice_is_refused(tmp_path):
    root = toy_folder(tmp_path, strategies=("spatial",))
    files = sorted((root / "yamls" / "spatial").glob("*.yaml"))
    _edit_yaml(files[1], lambda d: d["models"][0].update(name="llm-1"))
    with pytest.raises(InputError, match="placed once"):
        load_muxserve_dir(root)


def test_a_folder_without_results_is_refused(tmp_path):
    with pytest.raises(InputError, match="yamls"):
        load_muxserve_dir(tmp_path)
    root = toy_folder(tmp_path / "x")
    for f in (root / "merged").iterdir():
        f.unlink()
    with pytest.raises(InputError, match="merged"):
        load_muxserve_dir(root)


# ------------------------------------------------------------------ co-location


limits = st.floats(0.05, 1.0)
busy = st.floats(0.0, 1.0)


@PROPERTY
@given(st.lists(st.tuples(limits, limits), min_size=1, max_size=5))
def test_all_busy_mps_shares_fill_at_most_the_gpu(lims):
    """Everyone busy: the decode shares add up to the limits' sum, or to the whole GPU when
    the limits ask for more (scaled in proportion)."""
    mesh = {f"m{i}": CoRunner(p, d, 1.0) for i, (p, d) in enumerate(lims)}
    got = contended_shares(mesh, "mps")
    total = sum(d for _, d in lims)
    assert sum(c.decode for c in got.values()) == pytest.approx(min(total, 1.0), rel=1e-9)
    for m, c in got.items():
        assert c.decode <= mesh[m].decode * (1 + 1e-12)
        assert c.prefill <= mesh[m].prefill * (1 + 1e-12)


@PROPERTY
@given(st.tuples(limits, limits), st.lists(st.tuples(limits, limits, busy), max_size=4),
       st.integers(0, 3), busy)
def test_a_busier_co_runner_never_gives_more(me, others, who, more):
    mesh = {"me": CoRunner(*me)} | {f"o{i}": CoRunner(p, d, b)
                                     for i, (p, d, b) in enumerate(others)}
    before = contended_shares(mesh, "mps", interference=0.3)["me"]
    if others:
        key = f"o{who % len(others)}"
        mesh[key] = replace(mesh[key], busy=max(mesh[key].busy, more))
    after = contended_shares(mesh, "mps", interference=0.3)["me"]
    assert after.decode <= before.decode * (1 + 1e-12)
    assert after.prefill <= before.prefill * (1 + 1e-12)
    assert after.slowdown >= before.slowdown * (1 - 1e-12)


@PROPERTY
@given(st.lists(st.tuples(busy, st.floats(0.1, 100.0)), min_size=1, max_size=5),
       st.floats(0.1, 100.0))
def test_turns_slowdown_is_the_expected_round_robin_cycle(others, own):
    """Oracle: enumerate which co-runners have work (each independently, with its busy
    fraction); one round-robin cycle is the LLM's own step plus one step of each that has.
    The expected cycle over its own step is the slowdown."""
    mesh = {"me": CoRunner(1.0, 1.0, 1.0, own)} | {
        f"o{i}": CoRunner(1.0, 1.0, b, s) for i, (b, s) in enumerate(others)}
    expected = 0.0
    for pattern in itertools.product((0, 1), repeat=len(others)):
        prob = math.prod(b if on else 1 - b for on, (b, _) in zip(pattern, others, strict=True))
        expected += prob * (own + sum(s for on, (_, s) in zip(pattern, others, strict=True)
                                      if on))
    got = contended_shares(mesh, "turns")["me"]
    assert got.slowdown == pytest.approx(expected / own, rel=1e-9)
    assert (got.prefill, got.decode) == (1.0, 1.0)


@PROPERTY
@given(st.tuples(limits, limits, st.floats(0.1, 100.0)),
       st.lists(st.tuples(limits, limits, busy, st.floats(0.1, 100.0)), max_size=4))
def test_jobs_sharing_is_mps_beside_the_co_runners_that_fit_and_turns_with_the_others(me,
                                                                                     others):
    """Oracle: split the co-runners by whether their decode steps fit beside the LLM's
    (MuxServe's SM parts: round(limit * 10) each, at most 12 at once); the shares are the MPS
    model's over those that fit, the slowdown adds the turns model's over the others."""
    mesh = {"me": CoRunner(me[0], me[1], 1.0, me[2])} | {
        f"o{i}": CoRunner(p, d, b, s) for i, (p, d, b, s) in enumerate(others)}
    got = contended_shares(mesh, "jobs", interference=0.3)["me"]
    fit = {k: c for k, c in mesh.items() if k != "me" and jobs_fit(me[1], c.decode)}
    turns = {k: c for k, c in mesh.items() if k != "me" and k not in fit}
    mps = contended_shares({"me": mesh["me"]} | fit, "mps", interference=0.3)["me"]
    wait = contended_shares({"me": mesh["me"]} | turns, "turns")["me"]
    assert (got.prefill, got.decode) == pytest.approx((mps.prefill, mps.decode), rel=1e-12)
    assert got.slowdown == pytest.approx(mps.slowdown + wait.slowdown - 1.0, rel=1e-12)
    # the part arithmetic itself, from its definition
    assert jobs_fit(me[1], 0.3) == (max(1, min(10, round(me[1] * 10))) + 3 <= 12)


def test_job_parts_are_tenths_of_the_sms():
    assert [job_parts(s) for s in (0.01, 0.3, 0.54, 0.9, 1.0)] == [1, 3, 5, 9, 10]
    assert jobs_fit(0.9, 0.3) and not jobs_fit(0.9, 0.4) and not jobs_fit(1.0, 0.9)


def test_an_llm_alone_keeps_its_limits():
    for sharing in ("mps", "turns", "jobs"):
        got = contended_shares({"a": CoRunner(0.8, 0.3, 1.0, 5.0)}, sharing, interference=2.0)
        assert (got["a"].prefill, got["a"].decode, got["a"].slowdown) == (0.8, 0.3, 1.0)


@pytest.mark.parametrize("mesh, sharing, field", [
    ({"a": CoRunner(0.0, 0.5)}, "mps", "mesh.a"),
    ({"a": CoRunner(0.5, 1.5)}, "mps", "mesh.a"),
    ({"a": CoRunner(0.5, 0.5, busy=2.0)}, "mps", "mesh.a"),
    ({"a": CoRunner(0.5, 0.5)}, "spatial", "sharing"),
])
def test_bad_co_location_input_is_refused(mesh, sharing, field):
    with pytest.raises(InputError) as exc:
        contended_shares(mesh, sharing)
    assert exc.value.field == field


def test_phase_shares_answer_at_their_own_shares(latency):
    """Prefills at the prefill share, decode steps at the decode share, whatever share is
    asked, each ``slowdown`` times longer (arrays as scalars)."""
    model = PhaseShareModel(latency, prefill=0.7, decode=0.35, slowdown=1.25)
    args = ("llama-7b", "A100-80GB", 1)
    for asked in (0.3, 1.0, np.array([0.5, 0.9])):
        p = model.prefill_ms(*args, asked, 4, 300)
        d = model.decode_ms(*args, asked, 16, 500)
        np.testing.assert_allclose(p, 1.25 * np.asarray(latency.prefill_ms(*args, 0.7, 4, 300)),
                                   rtol=1e-12)
        np.testing.assert_allclose(d, 1.25 * np.asarray(latency.decode_ms(*args, 0.35, 16, 500)),
                                   rtol=1e-12)
    for bad in ({"prefill": 0.0}, {"decode": 1.2}, {"slowdown": 0.5}):
        with pytest.raises(InputError):
            PhaseShareModel(latency, **({"prefill": 0.5, "decode": 0.5} | bad))


# ------------------------------------------------------------------ finite runs


@pytest.fixture(scope="module")
def curve(latency):
    return serving_curve(latency, "llama-7b", "A100-80GB", 1, 1.0, 150.0, 200.0,
                         policy=MemoryPolicy(max_batch=64))


@PROPERTY
@given(st.floats(0.01, 0.99))
def test_ttft_and_tpot_split_the_call_latency(curve, load):
    """Below μ a call's latency is its TTFT plus ``O − 1`` TPOTs; the TTFT's quantiles grow with
    the quantile (the mean of an exponential wait is its 63rd percentile); at μ both are inf."""
    rate = load * curve.mu
    ttft, tpot = curve.ttft_s(rate), curve.tpot_s(rate)
    assert ttft + tpot * (curve.output_tokens - 1) == pytest.approx(
        float(curve.latency_s(rate)), rel=1e-9)
    qs = [curve.ttft_s(rate, q) for q in (0.1, 0.5, 1 - math.exp(-1), 0.9, 0.99)]
    assert qs == sorted(qs)
    assert qs[2] == pytest.approx(ttft, rel=1e-9)
    assert math.isinf(curve.ttft_s(curve.mu)) and math.isinf(curve.tpot_s(2 * curve.mu))
    with pytest.raises(InputError):
        curve.ttft_s(rate, 1.0)


def test_predict_reports_ttft_and_tpot_per_llm(tmp_path):
    alloc = tmp_path / "alloc.yaml"
    alloc.write_text(yaml.safe_dump({"llms": {
        m: {"gpu": "A100-80GB", "tp": tp, "share": 1.0}
        for m, tp in (("llama-7b-a", 1), ("llama-7b-b", 1), ("llama-13b", 1), ("llama-30b", 2))}}))
    code, out, err = run_cli("predict", "--workflow", str(REPO / "datasets" / "workloads" /
                                                         "muxserve-a100.yaml"),
                             "--allocation", str(alloc), "--trace-requests", "100", "--json")
    assert code == 0, err
    llms = json.loads(out)["llms"]
    for x in llms.values():
        assert 0 < x["ttft_s"] < x["call_latency_s"] and 0 < x["tpot_s"] < x["call_latency_s"]


def test_a_long_stable_run_is_the_steady_state(curve):
    """Below μ and with very many requests, the random walk's bound is far above the steady
    wait: the run's mean latency is the steady state's, and it serves its rate."""
    rate = 0.6 * curve.mu
    run = finite_run(curve, rate, 10**7)
    assert run.mean_latency_s == pytest.approx(float(curve.latency_s(rate)), rel=1e-9)
    assert run.throughput == pytest.approx(rate, rel=1e-4)
    assert not run.overloaded
    assert 0 < run.mean_ttft_s <= run.mean_latency_s and run.mean_tpot_s > 0


@PROPERTY
@given(st.floats(1.05, 5.0), st.integers(50, 5000))
def test_an_overload_serves_its_capacity_and_waits_for_its_backlog(curve, factor, n):
    """Beyond μ the run serves about μ (exactly ``N / (N/μ + L)``), each request waits at least
    the fluid backlog ``(N − 1)/2·(1/μ − 1/λ)``, and a longer run waits longer."""
    rate = factor * curve.mu
    run = finite_run(curve, rate, n)
    longer = finite_run(curve, rate, 2 * n)
    assert run.overloaded
    assert run.throughput < curve.mu and longer.throughput >= run.throughput
    backlog = (n - 1) / 2 * (1 / curve.mu - 1 / rate)
    assert run.mean_latency_s >= backlog
    assert longer.mean_latency_s > run.mean_latency_s
    assert run.mean_ttft_s <= run.mean_latency_s


@PROPERTY
@given(st.integers(1, 3000), st.floats(1.01, 10.0), st.floats(0.1, 50.0),
       st.floats(0.0, 500.0))
def test_the_admission_wait_is_the_mean_over_arrivals(n, factor, mu, admitted):
    """Oracle: the ``k``-th of ``n`` arrivals waits ``(k·c − A)⁺/μ``; the closed form (a
    continuous sum) is within one arrival's step of the discrete mean."""
    rate = factor * mu
    c = 1 - mu / rate
    k = np.arange(1, n + 1)
    discrete = np.maximum(k * c - admitted, 0.0) / mu
    mean, p90 = _admission_wait(n, rate, mu, admitted)
    assert mean == pytest.approx(float(discrete.mean()), abs=c / mu + 1e-9)
    assert p90 == pytest.approx(max(0.0, 0.9 * n * c - admitted) / mu, rel=1e-12)


def test_a_queue_in_front_puts_the_backlog_before_the_first_token(curve):
    """``queued = 1``: the whole backlog waits before the first token (an engine that admits
    nothing beyond its batch); the request latency is the same either way."""
    rate, n = 2.0 * curve.mu, 2000
    admitted, queue = finite_run(curve, rate, n), finite_run(curve, rate, n, queued=1.0)
    backlog = (n - 1) / 2 * (1 / curve.mu - 1 / rate)
    assert queue.mean_ttft_s >= backlog > admitted.mean_ttft_s
    assert queue.mean_latency_s == pytest.approx(admitted.mean_latency_s, rel=1e-12)
    assert queue.mean_tpot_s < admitted.mean_tpot_s
    with pytest.raises(InputError):
        finite_run(curve, rate, n, queued=1.5)


@given(st.floats(1.05, 4.0), st.floats(0.0, 1.0))
@settings(max_examples=30, deadline=None)
def test_an_engine_that_admits_the_whole_run_queues_none_of_it_in_front(curve, factor, q):
    """Overloaded, but the run brings no more requests than the engine admits at once
    (``curve.admits``): every request is admitted on arrival, nothing waits before its first
    token whatever ``queued`` says, and the overload shows as the same latency with a slower
    TPOT; one request more than it admits and ``queued`` puts the backlog in front again."""
    rate, n = factor * curve.mu, curve.admits
    assert curve.admits >= curve.max_batch
    small = finite_run(curve, rate, n, queued=q)
    none = finite_run(curve, rate, n, queued=0.0)
    assert small.overloaded
    assert small.mean_ttft_s == pytest.approx(none.mean_ttft_s, rel=1e-12)
    assert small.mean_latency_s == pytest.approx(none.mean_latency_s, rel=1e-12)
    drift = (n - 1) / 2 * (1 / curve.mu - 1 / rate)
    assert small.mean_ttft_s < drift or drift == 0.0
    big = finite_run(curve, rate, n + 1, queued=1.0)
    assert big.mean_ttft_s >= n / 2 * (1 / curve.mu - 1 / rate)


def test_finite_run_refuses_bad_input(curve):
    for rate, n in ((0.0, 10), (math.inf, 10), (1.0, 0), (1.0, 2.5)):
        with pytest.raises(InputError):
            finite_run(curve, rate, n)  # type: ignore[arg-type]
    assert walk_wait(100, 2.0) == pytest.approx(0.75 * 10 / 2.0, rel=1e-12)


def test_a_run_whose_latency_grew_is_overloaded():
    assert grew(np.array([1.0] * 10 + [5.0] * 10))
    assert not grew(np.array([2.0, 3.0, 2.5, 2.2, 2.8, 2.1, 2.9, 2.4]))
    assert not grew(np.array([1.0, 9.0]))  # too short to tell


def test_runs_combine_by_request_count():
    a = Figures(2.0, 10.0, 1.0, 0.5, 0.05, ("a",))
    b = Figures(1.0, 4.0, 3.0, 1.5, 0.02)
    got = combine({"a": a, "b": b}, {"a": 3.0, "b": 1.0})
    assert got.throughput == pytest.approx(3.0, rel=1e-12)
    assert got.mean_latency_s == pytest.approx((3 * 10 + 4) / 4, rel=1e-12)
    assert got.p90_ttft_s == pytest.approx((3 * 1 + 3) / 4, rel=1e-12)
    assert got.overloaded == ("a",)


# ------------------------------------------------------------------ whole runs


def test_an_llm_alone_is_its_instance_finite_run(tmp_path, latency):
    """Spatial: no co-runner, so the prediction is the finite run of the LLM's instance at its
    own limits, and the shares reported are the limits."""
    run = load_muxserve_dir(toy_folder(tmp_path, strategies=("spatial",)))[0]
    v = validate_run(run, latency, simulate_runs=False)
    assert {m: (c.prefill, c.decode, c.slowdown) for m, c in v.shares.items()} == {
        "llm-1": (1.0, 0.9, 1.0), "llm-2": (1.0, 0.9, 1.0)}
    for m, f in v.llms.items():
        assert f["predicted"].throughput < run.rates[m]  # the drain after the last arrival
        assert f["predicted"].throughput > 0.8 * run.rates[m]
        assert not f["predicted"].overloaded


def test_each_source_reports_the_share_of_requests_within_the_slo(tmp_path, latency):
    """Attainment: predicted from the finite run's TTFT distribution, simulated over its
    requests, measured as the range the percentiles allow; a looser bound never attains
    less; the run's figure is the request-weighted mean of its LLMs'."""
    run = load_muxserve_dir(toy_folder(tmp_path, strategies=("spatial",)))[0]
    shares = []
    for bound in (0.05, 0.3, 5.0):
        slos = {m: CallSLO(ttft_s=bound) for m in run.rates}
        v = validate_run(run, latency, simulate_runs=True, slos=slos)
        for f in v.llms.values():
            for src in ("predicted", "simulated"):
                assert 0.0 <= f[src].attainment == f[src].attainment_high <= 1.0
            assert f["measured"].attainment <= f["measured"].attainment_high
        w = {m: run.measured[m].requests for m in run.rates}
        assert v.predicted.attainment == pytest.approx(sum(
            w[m] * v.llms[m]["predicted"].attainment for m in w) / sum(w.values()), rel=1e-12)
        shares.append((v.predicted.attainment, v.simulated.attainment))
    assert shares[0][0] <= shares[1][0] <= shares[2][0]
    assert shares[0][1] <= shares[1][1] <= shares[2][1]
    assert shares[2] == pytest.approx((1.0, 1.0), abs=1e-9)  # 5 s: every first token
    none = validate_run(run, latency, simulate_runs=False)
    assert none.predicted.attainment is None and none.measured.attainment is None


def test_co_located_llms_slow_each_other(tmp_path, latency):
    """The same two LLMs on one shared mesh under limits adding up to more than 100: where
    their decode steps fit together (6 + 5 SM parts of 12) each gets less than its limit;
    where they do not (6 + 7) they take turns at their limits, each step slowed. Either way
    each is slower than alone on the same mesh."""
    for name, mps, turns in (("fit", ((80, 60), (90, 50)), False),
                             ("turns", ((80, 60), (90, 70)), True)):
        both = load_muxserve_dir(toy_folder(tmp_path / name / "a", strategies=("flexsm",),
                                            rates=(6.0, 6.0), mps=mps))[0]
        v = validate_run(both, latency, simulate_runs=False)
        lims = {"llm-1": (mps[0][0] / 100, mps[0][1] / 100),
                "llm-2": (mps[1][0] / 100, mps[1][1] / 100)}
        for m, c in v.shares.items():
            if turns:
                assert (c.prefill, c.decode) == lims[m] and c.slowdown > 1.0
            else:
                assert c.decode < lims[m][1] and c.prefill < lims[m][0]
        alone = load_muxserve_dir(toy_folder(tmp_path / name / "b", strategies=("flexsm",),
                                             rates=(6.0, 0.02), mps=mps))[0]
        w = validate_run(alone, latency, simulate_runs=False)
        assert (w.shares["llm-1"].decode / w.shares["llm-1"].slowdown
                > v.shares["llm-1"].decode / v.shares["llm-1"].slowdown)
        assert (v.llms["llm-1"]["predicted"].mean_tpot_s
                > w.llms["llm-1"]["predicted"].mean_tpot_s)


def test_simulated_figures_are_defined_as_muxserve_measures_them(tmp_path, latency):
    """MuxServe's statistics: mean latency is mean TTFT plus mean TPOT times the LLM's mean
    output (as the measured figure is built), TPOT a request's decode time over its output
    tokens (at a light load about one decode step), throughput the requests over the last
    completion since the run began (at most what the last arrival allows)."""
    run = load_muxserve_dir(toy_folder(tmp_path, strategies=("spatial",), rates=(0.5, 0.3)))[0]
    v = validate_run(run, latency, simulate_runs=True)
    for m, f in v.llms.items():
        s = f["simulated"]
        out = run.lengths(m)[1]
        assert s.mean_latency_s == pytest.approx(s.mean_ttft_s + s.mean_tpot_s * out, rel=1e-9)
        mine = next(x for mesh in run.meshes for x in mesh.llms if x.name == m)
        step = float(latency.decode_ms(run.models[m], "A100-80GB", mine.tp,
                                       mine.decode_pct / 100.0, 1.0, 300.0)) / 1e3
        assert step * 0.7 < s.mean_tpot_s < step * 2.0
        n = run.measured[m].requests  # the last of n uniform arrivals: n/(n+1) of the span
        assert 0 < s.throughput < run.rates[m] * (n + 1) / n


def test_the_simulator_replays_the_same_run(tmp_path, latency):
    run = load_muxserve_dir(toy_folder(tmp_path, strategies=("spatial",)))[0]
    v = validate_run(run, latency, simulate_runs=True)
    assert v.simulated is not None
    for f in v.llms.values():
        s, p = f["simulated"], f["predicted"]
        assert s.throughput == pytest.approx(p.throughput, rel=0.25)
        assert s.mean_latency_s == pytest.approx(p.mean_latency_s, rel=0.35)
    again = validate_run(run, latency, simulate_runs=True)
    assert again.simulated == v.simulated  # seeded: the same replay


def test_fitting_recovers_the_overheads_that_made_the_measurements(tmp_path, latency):
    """Oracle: measurements generated by the model itself with known overheads (on the grid)
    are fitted back to exactly those overheads."""
    root = toy_folder(tmp_path, strategies=("spatial",), rates=(3.0, 1.5))
    truth = EngineOverheads("muxserve", "", "A100-80GB", iteration_ms=5.0, tp_doubling_ms=0.0)
    run = load_muxserve_dir(root)[0]
    made = validate_run(run, with_overheads(latency, truth), simulate_runs=False)
    measured = {m: MeasuredLLM(f["predicted"].throughput, run.measured[m].requests,
                               f["predicted"].mean_ttft_s, f["predicted"].mean_tpot_s,
                               f["predicted"].p90_ttft_s, 1.0, 1.0, 1.0, 1.0)
                for m, f in made.llms.items()}
    fake = replace(run, measured=measured)
    fit = fit_overheads([fake], latency, grid=(0.0, 2.5, 5.0, 7.5), output_cv=OUTPUT_CV)
    assert (fit.overheads.iteration_ms, fit.overheads.tp_doubling_ms) == (5.0, 0.0)
    best = min(p.score for p in fit.points)
    assert best == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(InputError, match="spatial"):
        fit_overheads([replace(run, strategy="flexsm")], latency, output_cv=OUTPUT_CV)


def test_fitting_recovers_how_much_of_an_overload_queues_in_front(tmp_path, latency):
    """Oracle: one LLM overloaded (18 req/s on one GPU of LLaMA-7B, a backlog of about twice
    what its batch admits), one not; measurements made by the model with a known
    ``overload_queued`` (on the grid) are fitted back to it, and the engine's value is what
    :func:`validate_run` uses when it is given none."""
    root = toy_folder(tmp_path, strategies=("spatial",), rates=(18.0, 1.5))
    run = load_muxserve_dir(root)[0]
    truth = EngineOverheads("muxserve", "", "A100-80GB", iteration_ms=5.0, overload_queued=0.75)
    made = validate_run(run, with_overheads(latency, truth), simulate_runs=False)
    assert made.predicted.overloaded == ("llm-1",)
    explicit = validate_run(run, with_overheads(latency, replace(truth, overload_queued=0.0)),
                            simulate_runs=False, queued=0.75)
    assert explicit.predicted == made.predicted
    assert validate_run(run, with_overheads(latency, replace(truth, overload_queued=0.5)),
                        simulate_runs=False).predicted.p90_ttft_s < made.predicted.p90_ttft_s
    measured = {m: MeasuredLLM(f["predicted"].throughput, run.measured[m].requests,
                               f["predicted"].mean_ttft_s, f["predicted"].mean_tpot_s,
                               f["predicted"].p90_ttft_s, 1.0, 1.0, 1.0, 1.0)
                for m, f in made.llms.items()}
    fit = fit_overheads([replace(run, measured=measured)], latency, grid=(0.0, 5.0),
                        first_grid=(0.0,), queued_grid=(0.0, 0.25, 0.5, 0.75, 1.0),
                        output_cv=OUTPUT_CV)
    assert fit.overheads.iteration_ms == 5.0
    assert fit.overheads.overload_queued == 0.75
    with pytest.raises(InputError, match="queued_grid"):
        fit_overheads([run], latency, queued_grid=(1.5,), output_cv=OUTPUT_CV)


@given(cv=st.sampled_from([0.3, 0.55, 0.8, 1.0, 1.5]), part=st.floats(0.0, 0.09))
@settings(max_examples=25, deadline=None)
def test_fitting_recovers_the_output_spread_that_made_the_latency_percentiles(
        cv, part, tmp_path_factory):
    """Oracle: LLMs that did not queue, whose p90 and p99 latencies over their mean are a
    log-normal's of a known coefficient of variation (on the grid), are fitted back to it;
    LLMs that queued (mean TTFT a large part of the latency) and other strategies are left
    out."""
    root = toy_folder(tmp_path_factory.mktemp("cv"), strategies=("spatial",))
    run = load_muxserve_dir(root)[0]
    r90, r99 = lognormal_ratios(cv)
    measured = {}
    for m, x in run.measured.items():
        out = run.lengths(m)[1]
        x = replace(x, ttft_mean_s=part * x.tpot_mean_s * out)  # less than a tenth
        mean = x.mean_latency_s(out)
        measured[m] = replace(x, p90_latency_s=r90 * mean, p99_latency_s=r99 * mean)
    queued = replace(run.measured["llm-2"], ttft_mean_s=5.0, p90_latency_s=1e3,
                     p99_latency_s=1e4)
    fake = replace(run, measured={**measured, "llm-2": queued})
    assert fit_output_cv([fake, replace(fake, strategy="flexsm")]) == cv
    with pytest.raises(InputError, match="did not queue"):
        fit_output_cv([replace(fake, measured={"llm-2": queued})])
    with pytest.raises(InputError, match="output_cv"):
        validate_run(run, roofline_model(), simulate_runs=False, output_cv=0.0)


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "half"])
def test_overload_queued_is_a_fraction(bad, tmp_path):
    with pytest.raises(InputError, match="overload_queued"):
        EngineOverheads("e", "", "d", overload_queued=bad)
    path = tmp_path / "o.yaml"
    path.write_text(yaml.safe_dump({"engine": "e", "version": "", "device": "d",
                                    "overload_queued": bad}))
    with pytest.raises(InputError, match="overload_queued"):
        load_overheads(path)
    assert not EngineOverheads("e", "", "d", overload_queued=0.25).is_zero


def test_tp_overheads_grow_with_log2_tp(latency):
    o = EngineOverheads("muxserve", "", "A100-80GB", tp_doubling_ms=10.0)
    lat = with_overheads(latency, o)
    for tp, add in ((1, 0.0), (2, 10.0), (4, 20.0)):
        base = float(latency.decode_ms("llama-13b", "A100-80GB", tp, 1.0, 8, 400))
        assert float(lat.decode_ms("llama-13b", "A100-80GB", tp, 1.0, 8, 400)) == pytest.approx(
            base + add, rel=1e-12)
    bundled = load_overheads(MUXSERVE_A100)
    assert bundled.device == "A100-80GB" and "condense500" in bundled.source


# ------------------------------------------------------------------ the measured runs in shared


needs_mux = pytest.mark.skipif(not MUX.is_dir(), reason="../shared/data/e2e/muxserve-chatlmsys "
                               "is not beside the repository")


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
@needs_mux
def test_the_calibrated_predictor_meets_the_latency_target_on_the_training_loads(latency):
    """The two loads in shared (the calibration's own: in-sample): every run's mean latency
    within 0.74-1.35x of measured and throughput within 15% (the issue's targets), and flexsm
    carries at least as much as temporal at every load (MuxServe's own ranking of the two)."""
    lat = with_overheads(latency, load_overheads(MUXSERVE_A100))
    rep = validate_muxserve(MUX, lat, simulate=False)
    assert len(rep.runs) == 6
    by = {(v.workload, v.strategy): v for v in rep.runs}
    for v in rep.runs:
        ratio = v.predicted.mean_latency_s / v.measured.mean_latency_s
        assert 0.74 <= ratio <= 1.35, (v.workload, v.strategy, ratio)
        assert v.predicted.throughput == pytest.approx(v.measured.throughput, rel=0.15)
    for w in {v.workload for v in rep.runs}:
        assert by[(w, "flexsm")].predicted.throughput > by[(w, "temporal")].predicted.throughput


@needs_mux
def test_validate_muxserve_prints_and_writes_the_documented_json(tmp_path):
    out = tmp_path / "v.json"
    code, text, err = run_cli("validate", "muxserve", str(MUX), "--curves", str(BUNDLED_CURVES),
                               "--no-simulate", "--json", str(out), "--ttft-slo", "90:5",
                               "--tpot-slo", "llm-1=0.15")
    assert code == 0, err
    assert "predicted" in text and "flexsm" in text and "attainment" in text
    doc = json.loads(out.read_text())
    assert len(doc["runs"]) == 6
    for r in doc["runs"]:
        assert r["strategy"] in ("spatial", "flexsm", "temporal")
        assert r["workload"].startswith("requests_over_time")
        for src in ("measured", "predicted"):
            assert set(r[src]) >= {"throughput", "mean_latency_s", "p90_ttft_s"}
            assert all(isinstance(r[src][k], float) for k in ("throughput", "mean_latency_s"))
        assert r["simulated"] is None and len(r["llms"]) == 16
        assert r["errors"]["predicted"]["throughput"] == pytest.approx(
            r["predicted"]["throughput"] / r["measured"]["throughput"] - 1, rel=1e-9)
        assert 0 <= r["measured"]["attainment"] <= r["measured"]["attainment_high"] <= 1
        assert 0 <= r["predicted"]["attainment"] <= 1


def test_validate_muxserve_bad_input_exits_2_and_writes_nothing(tmp_path):
    root = toy_folder(tmp_path / "d")
    _edit_yaml(_mesh_file(root), lambda d: d["models"][0].update(mps_percentage=[0, 50]))
    out = tmp_path / "v.json"
    code, _, err = run_cli("validate", "muxserve", str(root), "--curves", str(BUNDLED_CURVES),
                            "--json", str(out))
    assert code == 2 and "mps_percentage" in err and "Traceback" not in err
    assert not out.exists()
    code, _, err = run_cli("validate", "muxserve", str(root), "--curves", str(BUNDLED_CURVES),
                            "--json", str(tmp_path / "no" / "v.json"))
    assert code == 2 and "--json" in err


def test_validate_muxserve_runs_the_simulator_on_a_small_folder(tmp_path):
    root = toy_folder(tmp_path / "d")
    out = tmp_path / "v.json"
    code, text, err = run_cli("validate", "muxserve", str(root), "--curves", str(BUNDLED_CURVES),
                               "--llms", "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert [r["strategy"] for r in doc["runs"]] == ["spatial", "flexsm"]
    assert all(r["simulated"]["throughput"] > 0 for r in doc["runs"])
    assert "llm-2" in text


def test_validate_muxserve_defaults_to_muxserves_own_curves(tmp_path):
    """Without --curves the repository's MuxServe A100 curves are used, and the document names
    them the same way on any machine."""
    root = toy_folder(tmp_path / "d")
    out = tmp_path / "v.json"
    code, _, err = run_cli("validate", "muxserve", str(root), "--no-simulate", "--json",
                              str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["model"] == ("datasets/profiles/muxserve-a100-curves.json + overheads "
                            "overheads-muxserve-a100.yaml")
    code, _, _ = run_cli("validate", "muxserve", str(root), "--no-simulate", "--curves",
                         str(BUNDLED_CURVES), "--json", str(tmp_path / "w.json"))
    again = json.loads((tmp_path / "w.json").read_text())
    assert code == 0 and again["runs"] == doc["runs"]


def test_the_document_has_one_entry_per_run(tmp_path, latency):
    rep = validate_muxserve(toy_folder(tmp_path), latency, simulate=False)
    doc = document(rep)
    assert doc["format"] == "scepsy-validate/1"
    assert [(r["workload"], r["strategy"]) for r in doc["runs"]] == [
        (STEM, "spatial"), (STEM, "flexsm")]
    assert set(doc["runs"][1]["shares"]) == {"llm-1", "llm-2"}


# ------------------------------------------------------------------ recorded arrivals


@given(st.lists(st.floats(0.0, 50.0), min_size=1, max_size=60), st.floats(0.2, 20.0))
@settings(max_examples=80, deadline=None)
def test_backlog_waits_are_the_fifo_deterministic_servers(times, mu):
    """Oracle: a FIFO server taking 1/μ per call makes arrival ``k`` wait
    ``max(0, max_{j<k} ((k − j)/μ − (t_k − t_j)))`` (the work of the calls since ``j`` less
    the time since ``j`` arrived)."""
    t = sorted(times)
    got = backlog_waits(t, mu)
    for k in range(len(t)):
        want = max([0.0] + [(k - j) / mu - (t[k] - t[j]) for j in range(k)])
        assert got[k] == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_evenly_spread_recorded_arrivals_are_the_finite_runs_model(curve):
    """Requests evenly spread over the span at a rate beyond μ wait the backlog's drift on
    average, as the Poisson finite run has it, and are served at its operating point; below
    μ, evenly spread requests build no backlog (the recorded path keeps bursts, not the noise
    of random arrivals)."""
    n = 3 * curve.admits
    for factor in (2.0, 0.5):
        rate = factor * curve.mu
        times = np.arange(n) / rate
        rec = finite_run_recorded(curve, times, queued=1.0)
        fin = finite_run(curve, rate, n, queued=1.0)
        assert rec.overloaded == fin.overloaded == (factor > 1)
        if factor > 1:
            drift = (n - 1) / 2 * (1 / curve.mu - 1 / rate)
            assert rec.mean_latency_s == pytest.approx(fin.mean_latency_s, rel=0.02)
            assert rec.mean_ttft_s == pytest.approx(drift + rec.ttft_floor_s, rel=0.02)
        else:
            assert rec.mean_ttft_s == pytest.approx(rec.ttft_floor_s, rel=1e-12)
        assert rec.throughput == pytest.approx(fin.throughput, rel=0.1)
    with pytest.raises(InputError, match="times_s"):
        finite_run_recorded(curve, [-1.0])


def _workload_file(path: Path, times: dict[str, list[float]], lengths=(100, 200)) -> Path:
    arrivals, requests = [], []
    for m, ts in times.items():
        for t in ts:
            arrivals.append(t)
            requests.append({"model_name": m, "slo": None, "idx": len(requests),
                             "data": [[1, 2, 3], lengths[0], lengths[1]]})
    order = np.argsort(arrivals, kind="stable")
    path.write_text(json.dumps({"arrivals": [arrivals[i] for i in order],
                                "requests": [requests[i] for i in order]}))
    return path


def test_recorded_bursts_wait_longer_than_the_same_requests_spread_out(tmp_path, latency):
    """The same count and span per LLM, once evenly spread and once in a burst at the start:
    the burst's requests wait longer before their first token, predicted and simulated; the
    Poisson rows stay as they were, and the recorded rows name their arrivals."""
    root = toy_folder(tmp_path / "d", strategies=("spatial",), rates=(6.0, 1.0))
    run = load_muxserve_dir(root)[0]
    n = {m: run.measured[m].requests for m in run.rates}
    span = {m: n[m] / run.rates[m] for m in run.rates}
    even = {m: list(np.linspace(0.0, span[m], n[m])) for m in run.rates}
    burst = {m: [0.0] * (n[m] - 1) + [span[m]] for m in run.rates}
    loads = {}
    for name, times in (("even", even), ("burst", burst)):
        (tmp_path / name).mkdir()
        f = _workload_file(tmp_path / name / f"{STEM}.json", times)
        loads[name] = validate_muxserve(root, latency, recorded=[load_muxserve_workload(f)])
    for rep in loads.values():
        assert [v.arrivals for v in rep.runs] == ["poisson", "recorded"]
    assert loads["even"].runs[0] == loads["burst"].runs[0]
    e, b = loads["even"].runs[1], loads["burst"].runs[1]
    assert b.predicted.p90_ttft_s > e.predicted.p90_ttft_s
    assert b.simulated.p90_ttft_s > e.simulated.p90_ttft_s
    rows = run_rows(loads["burst"])
    assert [r["source"] for r in rows] == ["measured", "predicted", "simulated",
                                           "predicted (recorded)", "simulated (recorded)"]
    doc = document(loads["burst"])
    assert [r["arrivals"] for r in doc["runs"]] == ["poisson", "recorded"]


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(arrivals=[]), "arrivals"),
    (lambda d: d["requests"].pop(), "requests"),
    (lambda d: d["arrivals"].__setitem__(0, -1.0), "arrivals[0]"),
    (lambda d: d["requests"][0].update(model_name=""), "requests[0].model_name"),
    (lambda d: d["requests"][0].update(data=[[1], 0, 5]), "requests[0].data[1]"),
    (lambda d: d["requests"][0].update(data="x"), "requests[0].data"),
])
def test_a_bad_workload_file_names_the_field(tmp_path, edit, field):
    f = _workload_file(tmp_path / f"{STEM}.json", {"llm-1": [0.0, 1.0], "llm-2": [0.5]})
    doc = json.loads(f.read_text())
    edit(doc)
    f.write_text(json.dumps(doc))
    with pytest.raises(InputError) as exc:
        load_muxserve_workload(f)
    assert exc.value.field.startswith(field) and exc.value.source == str(f)


def test_validate_with_arrivals_refuses_a_file_of_no_load_or_missing_llms(tmp_path):
    root = toy_folder(tmp_path / "d", strategies=("spatial",))
    other = _workload_file(tmp_path / "other.json", {"llm-1": [0.0], "llm-2": [0.0]})
    code, _, err = run_cli("validate", "muxserve", str(root), "--no-simulate",
                           "--arrivals", str(other))
    assert code == 2 and "other.json" in err and "name" in err
    (tmp_path / "x").mkdir()
    short = _workload_file(tmp_path / "x" / f"{STEM}.json", {"llm-1": [0.0, 1.0]})
    code, _, err = run_cli("validate", "muxserve", str(root), "--no-simulate",
                           "--arrivals", str(short), "--json", str(tmp_path / "v.json"))
    assert code == 2 and "llm-2" in err and not (tmp_path / "v.json").exists()
    (tmp_path / "y").mkdir()
    good = _workload_file(tmp_path / "y" / f"{STEM}.json",
                          {"llm-1": list(np.linspace(0, 30, 120)),
                           "llm-2": list(np.linspace(0, 60, 60))})
    code, out, _ = run_cli("validate", "muxserve", str(root), "--no-simulate",
                           "--arrivals", str(good), "--llms")
    assert code == 0 and "predicted (recorded)" in out and "(recorded arrivals)" in out


# ------------------------------------------------------------------ decode batches


def test_the_measured_decode_batch_is_the_schedulers_mean(tmp_path, latency):
    """``decoding_avg_batches`` is read into the measured figures; the simulated figures carry
    the simulator's mean decode batch, which a step never exceeds the limit of."""
    run = load_muxserve_dir(toy_folder(tmp_path, strategies=("spatial",)))[0]
    assert run.measured["llm-1"].decode_batch == pytest.approx(200.0 * 120 / 100, rel=1e-12)
    v = validate_run(run, latency)
    for m in ("llm-1", "llm-2"):
        assert v.llms[m]["measured"].decode_batch == run.measured[m].decode_batch
        sim = v.llms[m]["simulated"].decode_batch
        assert sim is not None and 1.0 <= sim <= 64  # the mesh's max_num_seqs
        assert v.llms[m]["predicted"].decode_batch is None
    assert v.measured.decode_batch is None  # a run's combined figures carry none


@given(st.floats(0.1, 50), st.floats(1, 2000), st.floats(0.005, 1.0), st.floats(0.5, 500))
@settings(max_examples=60, deadline=None, derandomize=True)
def test_decoding_ratio_is_littles_count_over_the_step_batch(rate, output, tpot, batch):
    """Little's law: ``rate x output x TPOT`` requests decode on average. A steady engine that
    puts every one of them in every step has exactly that batch: the ratio is 1 (to 1e-12)."""
    f = Figures(rate, 1.0, 1.0, 1.0, tpot, decode_batch=batch)
    assert decoding_ratio(f, output) == pytest.approx(rate * output * tpot / batch, rel=1e-12)
    steady = replace(f, decode_batch=rate * output * tpot)
    assert decoding_ratio(steady, output) == pytest.approx(1.0, rel=1e-12)
    assert decoding_ratio(replace(f, decode_batch=None), output) is None
    assert decoding_ratio(replace(f, decode_batch=0.0), output) is None


def test_the_simulator_keeps_every_decoding_request_in_every_step(tmp_path, latency):
    """Poisson arrivals below saturation and no batch limit in the way: the count decoding
    holds steady, so the simulated ratio is near 1 (within 25%: the mean TPOT and the mean
    output are taken apart, and a finite run's tail thins the last steps)."""
    run = load_muxserve_dir(toy_folder(tmp_path, strategies=("spatial",)))[0]
    v = validate_run(run, latency)
    for m in ("llm-1", "llm-2"):
        ratio = decoding_ratio(v.llms[m]["simulated"], run.lengths(m)[1])
        assert ratio is not None and 0.75 <= ratio <= 1.25, (m, ratio)
