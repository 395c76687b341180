"""The CPU deployment as it runs: servers placed on the same cores take turns on them
(scepsy_serve.launch.time_sliced)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO
from scepsy import api
from scepsy_opt.allocation import Allocation, Instance
from scepsy_serve.launch.time_sliced import running_allocation

WORKFLOW = REPO / "datasets" / "workflows" / "cpu-beam-search.yaml"
CATALOG = REPO / "datasets" / "catalogs" / "cpu-host.yaml"
CURVES = REPO / "datasets" / "profiles" / "vllm-cpu-llama-3-8b-x0.0625-curves.json"


def plan_doc(placed, *, replicas=1, tp=1, share=0.5):
    """A plan.json's allocation and placement: ``placed`` is LLM -> core."""
    return {"allocation": {"llms": {m: {"gpu": "cpu", "tp": tp, "share": share,
                                        "replicas": replicas} for m in placed}},
            "placement": {"instances": [
                {"llm": m, "replica": 0, "node": "host", "gpus": [c], "share": share,
                 "memory_gib": 2.0} for m, c in placed.items()]}}


def test_llms_on_one_core_become_a_mesh_at_the_cores_speed():
    got = running_allocation(plan_doc({"generator": 0, "prm": 0}), "cpu")
    assert got is not None
    for m in ("generator", "prm"):
        inst = got.llms[m]
        assert (inst.share, inst.memory, inst.mesh, inst.tp, inst.replicas) == \
            (1.0, 0.5, "host:0", 1, 1)
    apart = running_allocation(plan_doc({"generator": 0, "prm": 1}), "cpu")
    assert apart is not None
    assert {m: (i.share, i.mesh) for m, i in apart.llms.items()} == \
        {"generator": (1.0, None), "prm": (1.0, None)}


@pytest.mark.parametrize(("doc", "device"), [
    (plan_doc({"generator": 0, "prm": 0}), "cuda"),  # an MPS share is a limit: as planned
    (plan_doc({"generator": 0, "prm": 0}, replicas=2), "cpu"),  # a mesh holds one replica
    (plan_doc({"generator": 0, "prm": 0}, tp=2), "cpu"),  # ranks pinned one by one
])
def test_plans_that_run_as_planned_or_cannot_be_meshes_are_left_alone(doc, device):
    assert running_allocation(doc, device) is None


def _latencies(alloc, rate):
    pred = api.predict(str(WORKFLOW), alloc, rate, curves=str(CURVES), catalog=str(CATALOG),
                       trace_requests=300)
    return (pred.workflows["cpu_beam_search"].mean_latency_s,
            {m: ld.call_latency_s for m, ld in pred.llms.items()})


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.floats(0.05, 2.0))
def test_turns_on_a_core_lie_between_a_core_each_and_half_a_core_each(rate):
    """Bounds: taking turns is never faster than each LLM on a core of its own, and never
    slower than each held to half of the core all the time (the plan's view of share 0.5)."""
    sliced = running_allocation(plan_doc({"generator": 0, "prm": 0}), "cpu")
    alone = Allocation({m: Instance("cpu", 1, 1.0) for m in ("generator", "prm")})
    half = Allocation({m: Instance("cpu", 1, 0.5) for m in ("generator", "prm")})
    lat_s, call_s = _latencies(sliced, rate)
    lat_a, call_a = _latencies(alone, rate)
    lat_h, call_h = _latencies(half, rate)
    tol = 1e-9
    assert lat_a * (1 - tol) <= lat_s <= lat_h * (1 + tol)
    for m in call_s:
        assert call_a[m] * (1 - tol) <= call_s[m] <= call_h[m] * (1 + tol)
