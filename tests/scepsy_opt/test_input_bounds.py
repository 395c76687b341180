"""The documented bounds on what a file may ask for, checked before anything is built, and the
allocation check: an instance that cannot hold its model is refused, never predicted as
``throughput 0``."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO
from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance, check_allocation, parse_allocation
from scepsy_opt.cluster import MAX_NODES, parse_cluster
from scepsy_opt.prediction.pipeline import predict
from scepsy_opt.prediction.simulate import MAX_REQUESTS as MAX_SIM_REQUESTS
from scepsy_opt.prediction.simulate import simulate
from scepsy_opt.stats import workflow_stats
from scepsy_opt.traces import read_trace
from scepsy_opt.workflows import (
    MAX_CALLS_PER_REQUEST,
    MAX_PARAM_MEAN,
    MAX_REQUESTS,
    Distribution,
    generate_trace,
    load_workflow,
)
from scepsy_place.packing.topology import parse_topology
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import memory_fit

RAG = REPO / "datasets" / "workflows" / "rag.yaml"
SPEC = load_workflow(RAG)


# --- workflow params and generated traces ------------------------------------------------------


@settings(max_examples=40, derandomize=True, deadline=None)
@given(mean=st.floats(1.0, 1e12), cap=st.one_of(st.none(), st.floats(1.0, 1e12)))
def test_a_param_is_accepted_exactly_when_its_mean_is_within_the_bound(
    mean: float, cap: float | None
) -> None:
    dist = Distribution.lognormal(mean, 0.5, max=cap)
    try:
        dataclasses.replace(SPEC, params={**SPEC.params, "answer_tokens": dist})
        accepted = True
    except InputError as exc:
        accepted = False
        assert exc.field == "params.answer_tokens" and f"{MAX_PARAM_MEAN:.0e}" in exc.expected
    assert accepted == (dist.mean() <= MAX_PARAM_MEAN)


def test_the_request_bound_is_checked_before_generating() -> None:
    assert len({c.request_id for c in generate_trace(SPEC, 2, seed=0)}) == 2
    with pytest.raises(InputError) as info:
        generate_trace(SPEC, MAX_REQUESTS + 1, seed=0)  # would take minutes and gigabytes
    assert info.value.field == "requests" and info.value.got == MAX_REQUESTS + 1


def test_a_fan_out_beyond_the_per_request_bound_names_the_file() -> None:
    wide = dataclasses.replace(
        SPEC, params={**SPEC.params, "rerank_k": Distribution.constant(MAX_CALLS_PER_REQUEST + 1)}
    )
    with pytest.raises(InputError) as info:
        generate_trace(wide, 1, seed=0)
    assert info.value.source == str(RAG) and info.value.got == MAX_CALLS_PER_REQUEST + 1
    # at the bound itself a request is generated (the bound is not off by one)
    at = dataclasses.replace(SPEC, params={**SPEC.params, "rerank_k": 1000.0})
    assert sum(c.llm == "reranker" for c in generate_trace(at, 1, seed=0)) == 1000


# --- clusters ------------------------------------------------------------------------------------


def test_the_node_bound_holds_over_all_pools_and_racks() -> None:
    ok = {
        "name": "c",
        "pools": [
            {"gpu": "A100-80GB", "nodes": MAX_NODES - 1, "gpus_per_node": 8},
            {"gpu": "H100-80GB", "nodes": 1, "gpus_per_node": 8},
        ],
    }
    assert parse_cluster(ok, "c.yaml").total_gpus == 8 * MAX_NODES
    over = {**ok, "pools": [*ok["pools"], {"gpu": "L4", "nodes": 1, "gpus_per_node": 1}]}
    with pytest.raises(InputError) as info:
        parse_cluster(over, "c.yaml")
    assert (info.value.source, info.value.field, info.value.got) == (
        "c.yaml",
        "pools",
        MAX_NODES + 1,
    )
    racks = {
        "name": "r",
        "racks": [
            {
                "name": "a",
                "nodes": [
                    {"name": "n", "gpu": "A100-80GB", "gpus": 8, "count": MAX_NODES},
                    {"name": "m", "gpu": "A100-80GB", "gpus": 8},
                ],
            }
        ],
    }
    with pytest.raises(InputError, match="at most 10000 nodes"):
        parse_topology(racks, "r.yaml")


# --- allocations ---------------------------------------------------------------------------------

TRACE = read_trace(REPO / "datasets" / "traces" / "rag-50.jsonl")
STATS = {"rag": workflow_stats(TRACE, "rag", seed=0)}
BASE = {
    "rewriter": Instance("A100-80GB", 1, 0.3),
    "reranker": Instance("A100-80GB", 1, 0.2),
    "generator": Instance("A100-80GB", 1, 0.5, 5),
}


@pytest.mark.parametrize("share", [round(0.02 * k, 2) for k in range(1, 51)])
def test_predict_refuses_what_does_not_fit_and_never_answers_zero_throughput(share: float) -> None:
    alloc = Allocation({**BASE, "generator": Instance("A100-80GB", 1, share)}, source="a.yaml")
    fits = memory_fit("qwen2.5-7b", "A100-80GB", 1, share, 1).feasible  # the oracle
    try:
        pred = predict(STATS, dict(SPEC.llms), alloc, roofline_model(), {"rag": 0.1})
    except InputError as exc:
        assert (exc.source, exc.field) == ("a.yaml", "llms.generator.share")
        if fits:  # the weights fit, but not one call of the workload: says so
            assert "KV cache holds one call" in exc.expected
        return
    assert fits
    assert all(
        p.max_throughput > 0 and math.isfinite(p.mean_latency_s) for p in pred.workflows.values()
    )


def test_check_allocation_names_file_and_field() -> None:
    alloc = parse_allocation(
        {"llms": {"generator": {"gpu": "A100-80GB", "tp": 3, "share": 1.0}}}, "a.yaml"
    )
    with pytest.raises(InputError) as info:
        check_allocation(alloc, {"generator": "qwen2.5-7b"})
    assert (info.value.source, info.value.field, info.value.got) == (
        "a.yaml",
        "llms.generator.tp",
        3,
    )
    check_allocation(alloc, {"other": "qwen2.5-7b"})  # LLMs the workflows do not run: not checked
    with pytest.raises(InputError) as info:
        parse_allocation({"llms": {"g": {"gpu": "B300", "tp": 1, "share": 1.0}}}, "a.yaml")
    assert (info.value.source, info.value.field) == ("a.yaml", "llms.g.gpu")


def test_simulate_bounds_requests_and_duration() -> None:
    args = (TRACE, dict(SPEC.llms), Allocation(BASE), roofline_model(), {"rag": 1.0})
    with pytest.raises(InputError, match="requests"):
        simulate(*args, requests=MAX_SIM_REQUESTS + 1)
    with pytest.raises(InputError, match="duration_s"):
        simulate(*args, duration_s=float(np.nextafter(MAX_SIM_REQUESTS, math.inf)))
