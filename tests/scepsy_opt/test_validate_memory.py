"""The KV memory an LLM of a MuxServe mesh can hold, as the engine gives it: the mesh's pool
(its gpu_memory_utilization of each GPU, on top of the weights), shared by its LLMs; meshes
that ran at the limit load, and validate as measured runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_opt.validate.evaluate import kv_gib, kv_pool_gib, validate_run
from scepsy_opt.validate.muxserve import GPU, MeasuredLLM, Mesh, MeshLLM, MuxRun
from scepsy_profile.catalog import default_catalog
from scepsy_profile.hardware import GIB
from scepsy_profile.roofline import roofline_model

MODELS = ("llama-7b", "llama-13b", "llama-30b", "llama-65b")
LONGEST_CALL = 2048  # tokens: the longest prompt and output the validator replays together


def _run(mesh: Mesh, models: dict[str, str], rate: float = 0.5,
         strategy: str = "flexsm") -> MuxRun:
    measured = MeasuredLLM(throughput=rate, requests=200, ttft_mean_s=0.5, tpot_mean_s=0.05,
                           p90_ttft_s=1.0, p99_ttft_s=2.0, p90_latency_s=20.0,
                           p99_latency_s=30.0, p90_tpot_s=0.08)
    return MuxRun("load", strategy, 1, mesh.gpus, {m: rate for m in models}, models, 100.0,
                  250.0, (mesh,), {m: measured for m in models})


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
