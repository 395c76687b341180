"""The KV memory an LLM of a MuxServe mesh can hold, as the engine gives it: the mesh's pool
(its gpu_memory_utilization of each GPU, on top of the weights), shared by its LLMs; meshes
that ran at the limit load, and validate as measured runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_opt.validate.evaluate import adbs_max_num_seqs, kv_gib, kv_pool_gib, validate_run
from scepsy_opt.validate.muxserve import GPU, MeasuredLLM, Mesh, MeshLLM, MuxRun
from scepsy_profile.catalog import default_catalog
from scepsy_profile.hardware import GIB
from scepsy_profile.mps import jobs_fit
from scepsy_profile.roofline import roofline_model

MODELS = ("llama-7b", "llama-13b", "llama-30b", "llama-65b")
LONGEST_CALL = 2048  # tokens: the longest prompt and output the validator replays together


def _run(mesh: Mesh, models: dict[str, str], rate: float | dict[str, float] = 0.5,
         strategy: str = "flexsm", prompt: float = 100.0, output: float = 250.0) -> MuxRun:
    measured = MeasuredLLM(throughput=1.0, requests=200, ttft_mean_s=0.5, tpot_mean_s=0.05,
                           p90_ttft_s=1.0, p99_ttft_s=2.0, p90_latency_s=20.0,
                           p99_latency_s=30.0, p90_tpot_s=0.08)
    rates = rate if isinstance(rate, dict) else {m: rate for m in models}
    return MuxRun("load", strategy, 1, mesh.gpus, rates, models, prompt, output, (mesh,),
                  {m: measured for m in models})


def _per_token_gib(model: str, tp: int) -> float:
    return default_catalog().model(model).kv_bytes_per_token_per_gpu(tp) / GIB


def _supported(tp: int) -> list[str]:
    return [m for m in MODELS if default_catalog().model(m).supports_tp(tp)]


meshes = st.tuples(st.integers(1, 4), st.sampled_from([1, 2, 4, 8])).flatmap(
    lambda n_tp: st.tuples(
        st.lists(st.tuples(st.sampled_from(_supported(n_tp[1])), st.integers(1, 64)),
                 min_size=n_tp[0], max_size=n_tp[0]),
        st.just(n_tp[1]), st.floats(0.02, 0.6)))


@given(meshes, st.data())
@settings(max_examples=60, deadline=None)
def test_every_llm_holds_its_quota_and_at_most_the_pool(mesh_spec, data):
    llms, tp, util = mesh_spec
    models = {f"llm-{i}": m for i, (m, _) in enumerate(llms)}
    mesh = Mesh("m.yaml", tp, util, 256, tuple(
        MeshLLM(f"llm-{i}", tp, 100.0, 50.0, seqs) for i, (_, seqs) in enumerate(llms)))
    run = _run(mesh, models)
    pool = kv_pool_gib(mesh)
    assert pool == pytest.approx(util * default_catalog().gpu(GPU).memory_gib, rel=1e-12)
    quota = kv_gib(run, mesh)
    per_token = {m: _per_token_gib(models[m], tp) for m in models}
    if len(models) == 1:
        assert quota == {"llm-0": pool}
    else:
        # the same tokens for every LLM, and the quotas fill the pool
        tokens = {m: quota[m] / per_token[m] for m in models}
        assert max(tokens.values()) == pytest.approx(min(tokens.values()), rel=1e-9)
        assert sum(quota.values()) == pytest.approx(pool, rel=1e-9)
    held = {m: data.draw(st.floats(0, pool)) for m in models}
    got = kv_gib(run, mesh, held)
    for m in models:
        assert quota[m] - 1e-12 <= got[m] <= pool + 1e-12
        free = pool - sum(v for k, v in held.items() if k != m)
        assert got[m] == pytest.approx(max(quota[m], free), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("seqs", [(17, 10, 5), (60, 1, 60), (200, 2, 200)])
def test_a_mesh_that_ran_at_the_limit_is_not_refused(seqs):
    """Two llama-65b and a llama-7b on 8 GPUs with a fifth of each GPU's memory for KV: the
    engine splits its pool by tokens, whatever each LLM's max_num_seqs; an LLM with few
    max_num_seqs beside busy ones still holds its calls (before, a split by max_num_seqs left
    llama-65b less than one call and the run was refused)."""
    models = {"llm-16": "llama-65b", "llm-14": "llama-65b", "llm-7": "llama-7b"}
    mesh = Mesh("m.yaml", 8, 0.2, 256, tuple(
        MeshLLM(m, 8, 100.0, 30.0, s) for m, s in zip(models, seqs, strict=True)))
    run = _run(mesh, models)
    quota = kv_gib(run, mesh)
    for m, model in models.items():
        assert quota[m] / _per_token_gib(model, 8) >= LONGEST_CALL
    res = validate_run(run, roofline_model(), simulate_runs=False)
    assert set(res.llms) == set(models)
    assert res.predicted.throughput > 0


def _muxserve_init_max_num_seqs(run: MuxRun, mesh: Mesh) -> dict[str, int]:
    """MuxServe's scheduler in its own units (muxserve/muxsched/scheduler.py,
    ``init_max_num_seqs``; the pool from flexstore's ``get_num_gpu_blocks``): head-wise blocks
    of 16 tokens of one head of one layer, ``group_size = heads/TP × layers`` blocks per 16
    tokens, the pool's blocks split by ``rate × group_size``."""
    total_bytes = default_catalog().gpu(GPU).memory_gib * GIB
    block_bytes = 2 * (128 * 16 + 128 * 16)  # K and V of one head, 16 tokens, fp16
    blocks = (int(round(mesh.memory_utilization * total_bytes) - 1) // block_bytes // 128) * 128
    cat = default_catalog()
    group = {x.name: cat.model(run.models[x.name]).heads // x.tp
             * cat.model(run.models[x.name]).layers for x in mesh.llms}
    base = sum(run.rates[m] * g for m, g in group.items())
    per_seq = (int(run.prompt_mean) + int(run.output_mean)) // 16
    return {m: (int(run.rates[m] * g / base * blocks) // g) // per_seq for m, g in group.items()}


@given(meshes, st.lists(st.floats(0.05, 40.0), min_size=4, max_size=4),
       st.floats(20.0, 400.0), st.floats(20.0, 600.0))
@settings(max_examples=80, deadline=None)
def test_the_batch_limit_is_muxserves_starting_max_num_seqs(mesh_spec, rates, prompt, output):
    """The scheduler's own arithmetic (block units, integer divisions) is the oracle: the
    limits agree to one call (its pool is rounded down to 128 blocks), and are at least one."""
    llms, tp, util = mesh_spec
    models = {f"llm-{i}": m for i, (m, _) in enumerate(llms)}
    mesh = Mesh("m.yaml", tp, util, 256, tuple(
        MeshLLM(f"llm-{i}", tp, 100.0, 50.0, seqs) for i, (_, seqs) in enumerate(llms)))
    run = _run(mesh, models, {m: rates[i] for i, m in enumerate(models)}, prompt=prompt,
               output=output)
    got = adbs_max_num_seqs(run, mesh)
    want = _muxserve_init_max_num_seqs(run, mesh)
    for m in models:
        assert got[m] >= 1
        assert abs(got[m] - max(want[m], 1)) <= 1, (m, got, want)


def test_a_busier_llm_of_the_same_model_gets_more_calls():
    models = {"a": "llama-13b", "b": "llama-13b"}
    mesh = Mesh("m.yaml", 2, 0.3, 256, tuple(MeshLLM(m, 2, 90.0, 60.0, 8) for m in models))
    got = adbs_max_num_seqs(_run(mesh, models, {"a": 8.0, "b": 1.0}), mesh)
    assert got["a"] > 4 * got["b"] >= 4


def test_muxserves_engine_runs_at_most_its_scheduler_limit_and_vllm_at_max_num_seqs():
    """flexsm and temporal take the scheduler's limit; spatial (plain vLLM) the mesh's."""
    models = {"llm-3": "llama-13b", "llm-9": "llama-30b"}
    mesh = Mesh("m.yaml", 2, 0.2225, 256, (MeshLLM("llm-3", 2, 100.0, 60.0, 115),
                                           MeshLLM("llm-9", 2, 100.0, 30.0, 11)))
    rates = {"llm-3": 7.08, "llm-9": 0.76}
    for strategy in ("flexsm", "temporal"):
        run = _run(mesh, models, rates, strategy=strategy, prompt=100.2, output=261.3)
        res = validate_run(run, roofline_model(), simulate_runs=True)
        limits = adbs_max_num_seqs(run, mesh)
        assert limits["llm-9"] < 20 < limits["llm-3"]
        sim = res.llms["llm-9"]["simulated"]
        assert sim.throughput > 0
    alone = Mesh("s.yaml", 2, 0.375, 256, (MeshLLM("llm-9", 2, 100.0, 90.0, 256),))
    run = _run(alone, {"llm-9": "llama-30b"}, 0.76, strategy="spatial")
    assert validate_run(run, roofline_model(), simulate_runs=False).predicted.throughput > 0


co_located = st.tuples(
    st.sampled_from(["flexsm", "temporal"]), st.sampled_from([1, 2, 4]),
    st.lists(st.tuples(st.sampled_from(["llama-7b", "llama-13b"]), st.sampled_from([60, 80, 100]),
                       st.sampled_from([30, 50, 70, 90]), st.floats(0.2, 2.0)),
             min_size=2, max_size=3),
    st.sampled_from([0.3, 0.5]))


def jobs_always_fit(limits: list[tuple[float, float]]) -> bool:
    """No two jobs of a mesh (prefill or decode of one LLM, decode of another) ever wait for
    each other's SM parts under MuxServe's scheduler."""
    return all(jobs_fit(max(a), b[1]) and jobs_fit(max(b), a[1]) and jobs_fit(a[1], b[1])
               for i, a in enumerate(limits) for b in limits[i + 1:])


@given(co_located)
@settings(max_examples=16, deadline=None, derandomize=True)
def test_predictor_and_simulator_agree_on_a_co_located_mesh_below_saturation(mesh_spec):
    """The same shares, limits, memory and requests: where neither finds an LLM overloaded,
    the simulated throughput is within 20% of the predicted (the simulator's run ends with its
    longest last request, the prediction's with a mean one). Where the mesh's jobs always fit
    together, the two models are the same one and the mean latency agrees within 25%. Where
    they take turns, the predictor's steady-state turns and the simulator's step-by-step
    scheduler differ (docs/validate.md, "Co-location"): within a factor of 4, measured on 60
    random meshes at 0.32-1.96."""
    strategy, tp, llms, util = mesh_spec
    models = {f"llm-{i}": m for i, (m, *_rest) in enumerate(llms)}
    mesh = Mesh("m.yaml", tp, util, 256, tuple(
        MeshLLM(f"llm-{i}", tp, float(p), float(d), 64) for i, (_, p, d, _r) in enumerate(llms)))
    rates = {f"llm-{i}": r for i, (*_rest, r) in enumerate(llms)}
    run = _run(mesh, models, rates, strategy=strategy)
    v = validate_run(run, roofline_model())
    fits = jobs_always_fit([(p / 100, d / 100) for _, p, d, _r in llms])
    compared = 0
    for m, f in v.llms.items():
        p, s = f["predicted"], f["simulated"]
        if p.overloaded or s.overloaded:
            continue
        compared += 1
        assert s.throughput == pytest.approx(p.throughput, rel=0.2), m
        if fits:
            assert s.mean_latency_s == pytest.approx(p.mean_latency_s, rel=0.25), m
        else:
            assert 0.25 < s.mean_latency_s / p.mean_latency_s < 4.0, m
    assert compared  # these rates leave at least one LLM of every mesh below saturation


def test_where_jobs_fit_the_two_models_agree_and_where_they_conflict_the_simulator_takes_turns():
    """[80, 30] beside [60, 30] never wait for SM parts (8 + 3, 6 + 3, 3 + 3 <= 12): predictor
    and simulator agree on both LLMs. Two [100, 90] LLMs (temporal's limits) never run two
    jobs at once: each one's busy time leaves the other's idle, so their simulated decode
    steps are slower than the same LLM's alone."""
    assert jobs_always_fit([(0.8, 0.3), (0.6, 0.3)])
    assert not jobs_always_fit([(1.0, 0.9), (1.0, 0.9)])
    models = {"llm-0": "llama-7b", "llm-1": "llama-7b"}
    mesh = Mesh("m.yaml", 1, 0.5, 256, (MeshLLM("llm-0", 1, 80.0, 30.0, 64),
                                        MeshLLM("llm-1", 1, 60.0, 30.0, 64)))
    v = validate_run(_run(mesh, models, {"llm-0": 1.0, "llm-1": 0.7}, strategy="flexsm"),
                     roofline_model())
    for m in models:
        p, s = v.llms[m]["predicted"], v.llms[m]["simulated"]
        assert not (p.overloaded or s.overloaded)
        assert s.mean_latency_s == pytest.approx(p.mean_latency_s, rel=0.25), m
    turns = Mesh("t.yaml", 1, 0.5, 256, (MeshLLM("llm-0", 1, 100.0, 90.0, 64),
                                         MeshLLM("llm-1", 1, 100.0, 90.0, 64)))
    alone = Mesh("a.yaml", 1, 0.5, 256, (MeshLLM("llm-0", 1, 100.0, 90.0, 64),))
    rates = {"llm-0": 1.5, "llm-1": 1.5}
    shared = validate_run(_run(turns, models, rates, strategy="temporal"), roofline_model())
    single = validate_run(_run(alone, {"llm-0": "llama-7b"}, {"llm-0": 1.5},
                               strategy="temporal"), roofline_model())
    assert (shared.llms["llm-0"]["simulated"].mean_tpot_s
            > 1.2 * single.llms["llm-0"]["simulated"].mean_tpot_s)
