"""LLMs sharing a mesh under MPS limits in allocation files, the predictor and the simulator
(docs/validate.md, "Evaluating a co-located placement")."""

from __future__ import annotations

import pytest
import yaml

import scepsy
from conftest import REPO, run_cli
from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance, load_allocation, save_allocation
from scepsy_opt.prediction.pipeline import phase_latencies, predict
from scepsy_opt.prediction.simulate import simulate
from scepsy_opt.ratework import load_rate_workload, models, rate_stats, rate_trace
from scepsy_profile.mps import PhaseShareModel
from scepsy_profile.roofline import roofline_model

RATES = REPO / "datasets" / "workloads" / "muxserve-a100.yaml"
GPU = "A100-80GB"


def _alloc(a: Instance, b: Instance) -> Allocation:
    return Allocation({"llama-7b-a": a, "llama-7b-b": b,
                       "llama-13b": Instance(GPU, 1, 1.0), "llama-30b": Instance(GPU, 2, 1.0)})


def meshed(limit: float = 0.8, prefill: float = 0.9) -> Allocation:
    return _alloc(Instance(GPU, 1, limit, 1, 0.45, prefill, "m0"),
                  Instance(GPU, 1, limit, 1, 0.45, prefill, "m0"))


def alone(limit: float = 0.8, prefill: float = 0.9) -> Allocation:
    """The same limits, each LLM on GPUs of its own (no co-runner)."""
    return _alloc(Instance(GPU, 1, limit, 1, 0.45, prefill),
                  Instance(GPU, 1, limit, 1, 0.45, prefill))


def _predict(alloc: Allocation, rate: float | None = None):
    return scepsy.predict(str(RATES), alloc, rate, trace_requests=200)


def test_co_runners_slow_each_other_and_an_idle_one_does_not():
    """Limits adding up to 1.6 on one GPU: each LLM of the mesh is slower than with the same
    limits alone; the LLMs off the mesh are unchanged."""
    shared, apart = _predict(meshed()).llms, _predict(alone()).llms
    for m in ("llama-7b-a", "llama-7b-b"):
        assert shared[m].call_latency_s > apart[m].call_latency_s * 1.02
        assert shared[m].mu < apart[m].mu
    for m in ("llama-13b", "llama-30b"):
        assert shared[m].call_latency_s == pytest.approx(apart[m].call_latency_s, rel=1e-12)


def test_limits_within_the_gpu_are_not_contended():
    """Limits adding up to at most 1 and no interference: the co-runners take nothing from each
    other, so the prediction is the one alone."""
    shared, apart = _predict(meshed(0.5, 0.5)).llms, _predict(alone(0.5, 0.5)).llms
    for m in ("llama-7b-a", "llama-7b-b"):
        assert shared[m].call_latency_s == pytest.approx(apart[m].call_latency_s, rel=1e-9)


def test_a_prefill_limit_alone_is_a_phase_share_model():
    """An LLM with its own prefill limit and no mesh is predicted with the latency model at
    its two limits."""
    w = load_rate_workload(RATES)
    stats, mods = rate_stats(w, 200, 0), models(w)
    alloc = alone(0.6, 0.9)
    got = phase_latencies(stats, mods, alloc, roofline_model(), {n: w.llms[n].rate for n in w.llms})
    assert set(got) == {"llama-7b-a", "llama-7b-b"}
    lat = got["llama-7b-a"]
    assert isinstance(lat, PhaseShareModel)
    assert (lat.prefill, lat.decode, lat.slowdown) == (0.9, 0.6, 1.0)
    rates = {n: w.llms[n].rate for n in w.llms}
    assert predict(stats, mods, alloc, roofline_model(), rates).llms["llama-7b-a"].mu > 0


def test_the_simulator_sees_the_contention_too():
    sim_shared = scepsy.simulate(str(RATES), meshed(), trace_requests=200, requests=400)
    sim_apart = scepsy.simulate(str(RATES), alone(), trace_requests=200, requests=400)
    pred = _predict(meshed())
    m = "llama-7b-a"
    assert sim_shared.workflows[m].mean_latency_s > sim_apart.workflows[m].mean_latency_s
    assert sim_shared.workflows[m].mean_latency_s == pytest.approx(
        pred.workflows[m].mean_latency_s, rel=0.35)


def test_the_simulator_refuses_a_mesh_without_its_latencies():
    w = load_rate_workload(RATES)
    with pytest.raises(InputError, match="phase_latencies") as exc:
        simulate(rate_trace(w, 50, 0), models(w), meshed(), roofline_model(),
                 {n: w.llms[n].rate for n in w.llms}, requests=20)
    assert exc.value.field.startswith("llms.llama-7b-")


@pytest.mark.parametrize("b, field", [
    (Instance(GPU, 2, 0.8, 1, 0.45, None, "m0"), "llms.llama-7b-b.mesh"),
    (Instance("H100-80GB", 1, 0.8, 1, 0.45, None, "m0"), "llms.llama-7b-b.mesh"),
    (Instance(GPU, 1, 0.8, 2, 0.45, None, "m0"), "llms.llama-7b-b.replicas"),
    (Instance(GPU, 1, 0.8, 1, None, None, "m0"), "llms.llama-7b-b.memory"),
    (Instance(GPU, 1, 0.8, 1, 0.6, None, "m0"), "llms.llama-7b-b.memory"),
])
def test_a_mesh_must_be_one_set_of_gpus(b, field):
    with pytest.raises(InputError) as exc:
        _alloc(Instance(GPU, 1, 0.8, 1, 0.45, None, "m0"), b)
    assert exc.value.field == field


def test_a_mesh_counts_its_gpus_once_and_round_trips(tmp_path):
    a = meshed()
    assert a.meshes() == {"m0": ("llama-7b-a", "llama-7b-b")}
    assert a.gpus() == pytest.approx(1 + 1 + 2, rel=1e-12)
    path = tmp_path / "alloc.yaml"
    save_allocation(a, path)
    assert load_allocation(path) == a
    doc = yaml.safe_load(path.read_text())
    assert doc["llms"]["llama-7b-a"]["mesh"] == "m0"
    assert doc["llms"]["llama-7b-a"]["prefill_share"] == 0.9
    assert "mesh" not in doc["llms"]["llama-13b"]


def test_predict_reads_a_mesh_from_an_allocation_file(tmp_path):
    path = tmp_path / "alloc.yaml"
    save_allocation(meshed(), path)
    code, out, err = run_cli("predict", "--workflow", str(RATES), "--allocation", str(path),
                             "--trace-requests", "200")
    assert code == 0, err
    assert "llama-7b-a" in out
    bad = yaml.safe_load(path.read_text())
    bad["llms"]["llama-7b-a"]["prefill_share"] = 1.5
    path.write_text(yaml.safe_dump(bad))
    code, _, err = run_cli("predict", "--workflow", str(RATES), "--allocation", str(path),
                           "--trace-requests", "200")
    assert code == 2 and "llms.llama-7b-a.prefill_share" in err


def test_a_mesh_part_too_small_for_one_call_is_named():
    a = _alloc(Instance(GPU, 1, 0.8, 1, 0.2, 0.9, "m0"), Instance(GPU, 1, 0.8, 1, 0.45, 0.9, "m0"))
    with pytest.raises(InputError) as exc:
        _predict(a)
    assert exc.value.field == "llms.llama-7b-a.memory"


def test_a_split_group_cannot_join_a_mesh():
    with pytest.raises(InputError) as exc:
        Allocation({"chat-a": Instance(GPU, 1, 0.8, 1, 0.45, None, "m0"),
                    "chat-b": Instance(GPU, 1, 0.8, 1, 0.45, None, "m0")},
                   splits={"chat": {"chat-a": 0.5, "chat-b": 0.5}})
    assert exc.value.field == "llms.chat-a.mesh"


def test_planning_refuses_a_mesh_as_its_current_allocation(tmp_path):
    path = tmp_path / "alloc.yaml"
    save_allocation(meshed(), path)
    code, _, err = run_cli("plan", "--workflow", str(RATES), "--cluster",
                           str(REPO / "datasets" / "clusters" / "a100-16.yaml"),
                           "--current", str(path), "--optimiser", "user", "--trace-requests",
                           "100", "--out", str(tmp_path / "plan.json"))
    assert code == 2 and "llms.llama-7b-a.mesh" in err and "scepsy plan --current" in err
    assert not (tmp_path / "plan.json").exists()
