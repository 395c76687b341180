"""One definition of "an instance can serve this LLM": its KV cache holds the LLM's longest call
(scepsy_profile.serving.call_tokens), for the planner's serving curves, the predictor and the
simulator alike (vLLM's max_model_len asks the same)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy.api import plan_problem
from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.prediction.pipeline import instance_curve, llm_demand
from scepsy_opt.prediction.simulate import simulate
from scepsy_opt.traces import validate_calls
from scepsy_opt.workflows import generate_trace, load_workflow
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import MemoryPolicy, call_tokens, memory_fit, serving_curves

ROOF = roofline_model()
GPU = "A100-80GB"
BEAM = "datasets/workflows/beam-search.yaml"


@given(tokens=st.floats(0, 1e6), block=st.integers(1, 64),
       kv=st.sampled_from(["paged", "reserve"]))
def test_call_tokens_is_the_whole_blocks_of_a_call(tokens: float, block: int, kv: str) -> None:
    policy = MemoryPolicy(kv_management=kv, block_size=block)
    got = call_tokens(tokens, policy)
    n = max(math.ceil(tokens), 1)
    assert got >= n
    if kv == "paged":
        assert got % block == 0 and got - n < block
    else:
        assert got == n


@settings(max_examples=30, deadline=None)
@given(longest=st.integers(1, 200_000), share=st.sampled_from([0.1, 0.2, 0.3, 0.5, 1.0]))
def test_a_curve_is_feasible_exactly_when_its_cache_holds_the_longest_call(
        longest: int, share: float) -> None:
    (curve,) = serving_curves(ROOF, "qwen2.5-7b", GPU, 1, [share], 512.0, 128.0,
                              longest_tokens=float(longest))
    fit = memory_fit("qwen2.5-7b", GPU, 1, share, call_tokens(max(longest, 640)))
    assert curve.memory.feasible == fit.feasible
    assert (curve.mu > 0) == fit.feasible


@pytest.fixture(scope="module")
def beam():
    trace = validate_calls(generate_trace(load_workflow(BEAM), 60, 0))
    problem, _ = plan_problem(BEAM, "datasets/clusters/a100-16.yaml", 0.1, trace=trace,
                              tps=(1, 2, 4))
    return problem, trace


def test_the_planner_and_the_simulator_agree_on_every_memory_share(beam) -> None:
    problem, trace = beam
    calls = trace.calls
    llm = "prm"  # its longest call is far above its mean one
    demand = llm_demand(problem.stats, problem.models, problem.targets, llm)
    longest = max(max(c.input_tokens, 1) + max(c.output_tokens, 1) for c in calls
                  if c.llm == llm)
    assert demand.longest_tokens == longest
    other = {m: Instance(GPU, 1, 1.0, 1) for m in problem.llms if m != llm}
    seen = set()
    for share in (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.6, 1.0):
        curve = instance_curve(demand, problem.latency, GPU, 1, share)
        alloc = Allocation({**other, llm: Instance(GPU, 1, share, 1)})
        try:
            simulate(trace, problem.models, alloc, problem.latency, {"beam_search": 0.01},
                     requests=3, seed=0)
            runs = True
        except InputError as exc:  # the weights do not fit, or the cache is short
            assert "longest call" in str(exc) or "does not fit" in str(exc)
            runs = False
            if "longest call" in str(exc):
                seen.add("the mean call fits, the longest does not")
                assert memory_fit(problem.models[llm], GPU, 1, share,
                                  math.ceil(demand.input_mean + demand.output_mean)).feasible
        assert (curve.mu > 0) == runs, share
        seen.add(runs)
    # the grid crosses the boundary, at a share where only the longest call decides
    assert seen == {True, False, "the mean call fits, the longest does not"}
