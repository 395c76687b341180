"""LLMs sharing a mesh under MuxServe's scheduler (``simulate(mesh_jobs=MeshJobs(...))``): jobs
hold SM parts, a waiting prefill holds the decodes (docs/simulator.md, "Shared meshes")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.prediction.simulate import MeshJobs, simulate
from scepsy_opt.traces import CallRecord, Trace

GPU = "A100-80GB"
MODELS = {"a": "llama-2-7b", "b": "llama-2-7b"}


class Toy:
    """Every prefill takes ``p`` ms and every decode step ``d`` ms."""

    def __init__(self, p: float, d: float) -> None:
        self.p, self.d = p, d

    def prefill_ms(self, model, gpu, tp, share, batch, seq):
        shape = np.broadcast(np.asarray(batch), np.asarray(seq)).shape
        return np.full(shape, self.p)

    def decode_ms(self, model, gpu, tp, share, batch, ctx):
        return self.d

    def covers(self, model, gpu, tp):
        return True


def two_calls(b_at: float, a_out: int = 11, b_out: int = 5) -> Trace:
    """LLM ``a`` called at 0 s, LLM ``b`` at ``b_at`` (one request each)."""
    return Trace((CallRecord("wa", "r0", "c", 0.0, 1.0, llm="a", input_tokens=50,
                             output_tokens=a_out),
                  CallRecord("wb", "r0", "c", b_at, b_at + 1.0, llm="b", input_tokens=50,
                             output_tokens=b_out)))


def ends(res) -> dict[str, float]:
    return {e.llm: e.end_s for e in res.call_log}


def test_a_waiting_prefill_holds_the_decodes_and_parts_serialise_jobs():
    """Worked by hand from MuxServe's rules. a (8 parts) and b (9 parts) on a mesh of 10 + 2:
    a prefills over [0, 0.1] and decodes 10 steps of 10 ms. b arrives at 0.125, during a's
    third step; 8 + 9 > 12, so b's prefill waits and holds the decodes: a's step in progress
    ends at 0.13 and a stops. b prefills over [0.13, 0.23]. Their decodes do not fit together
    (9 + 8 > 12) and take turns step by step, a first (it waited first): a at 0.23, 0.25,
    0.27, 0.29, b at 0.24, ..., 0.30, its 4th and last step ending at 0.31; a then runs its
    last 3 steps alone, to 0.34."""
    alloc = Allocation({"a": Instance(GPU, 1, 0.8), "b": Instance(GPU, 1, 0.9)})
    lat = Toy(100.0, 10.0)
    shared = simulate(two_calls(0.125), MODELS, alloc, lat, record_events=True,
                      mesh_jobs=MeshJobs({"a": "x", "b": "x"}))
    assert ends(shared) == pytest.approx({"a": 0.34, "b": 0.31}, abs=1e-9)
    alone = simulate(two_calls(0.125), MODELS, alloc, lat, record_events=True)
    assert ends(alone) == pytest.approx({"a": 0.2, "b": 0.125 + 0.1 + 0.04}, abs=1e-9)
    # the decode parts fit beside the prefill (3 + 9 <= 12): b's prefill starts at once and
    # a's decode steps go on meanwhile
    small = Allocation({"a": Instance(GPU, 1, 0.3), "b": Instance(GPU, 1, 0.9)})
    beside = simulate(two_calls(0.125), MODELS, small, lat, record_events=True,
                      mesh_jobs=MeshJobs({"a": "x", "b": "x"}))
    assert ends(beside) == pytest.approx({"a": 0.2, "b": 0.265}, abs=1e-9)


def test_prefill_and_decode_limits_give_each_job_its_own_parts():
    """With a prefill limit of 0.9 and a decode limit of 0.3 (MuxServe's [90, 30]), b's decode
    fits beside a's (3 + 8 <= 12) after its prefill: both decode from 0.23."""
    alloc = Allocation({"a": Instance(GPU, 1, 0.8),
                        "b": Instance(GPU, 1, 0.3, prefill_share=0.9)})
    lat = Toy(100.0, 10.0)
    res = simulate(two_calls(0.125), MODELS, alloc, lat, record_events=True,
                   latencies={"b": lat}, mesh_jobs=MeshJobs({"a": "x", "b": "x"}))
    assert ends(res) == pytest.approx({"a": 0.30, "b": 0.27}, abs=1e-9)


def rate_trace(n: int = 40) -> Trace:
    calls = []
    for w, llm in (("wa", "a"), ("wb", "b")):
        for i in range(n):
            calls.append(CallRecord(w, f"r{i}", "c", 0.0, 1.0, llm=llm, input_tokens=60 + i,
                                    output_tokens=1 + (7 * i) % 23))
    return Trace(tuple(calls))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), ra=st.floats(1.0, 60.0), rb=st.floats(1.0, 60.0),
       sa=st.sampled_from([0.3, 0.5, 0.8, 1.0]), sb=st.sampled_from([0.3, 0.5, 0.8, 1.0]))
def test_a_mesh_whose_jobs_always_fit_changes_nothing(seed, ra, rb, sa, sb):
    """Parts never run short (an overload of 100 parts): the run is the one without a mesh.
    Both compute the same events with the same arithmetic; the tolerance is 1e-12 s."""
    alloc = Allocation({"a": Instance(GPU, 1, sa), "b": Instance(GPU, 1, sb)})
    lat = Toy(20.0, 3.0)
    kw = dict(requests=120, seed=seed, record_events=True)
    free = simulate(rate_trace(), MODELS, alloc, lat, {"wa": ra, "wb": rb}, **kw)
    meshed = simulate(rate_trace(), MODELS, alloc, lat, {"wa": ra, "wb": rb},
                      mesh_jobs=MeshJobs({"a": "x", "b": "x"}, overload=100), **kw)
    assert [e.end_s for e in meshed.call_log] == pytest.approx(
        [e.end_s for e in free.call_log], abs=1e-12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), ra=st.floats(5.0, 200.0), rb=st.floats(5.0, 200.0))
def test_jobs_that_need_the_whole_mesh_never_overlap(seed, ra, rb):
    """Two LLMs at the whole mesh with no overload take turns (MuxServe's temporal sharing):
    their busy fractions add up to at most 1 (1e-9 for the sums), and every arrival ends or is
    left unfinished. Without the mesh they overlap at these loads."""
    alloc = Allocation({"a": Instance(GPU, 1, 1.0), "b": Instance(GPU, 1, 1.0)})
    lat = Toy(20.0, 3.0)
    res = simulate(rate_trace(), MODELS, alloc, lat, {"wa": ra, "wb": rb}, requests=150,
                   seed=seed, warmup_fraction=0.0,
                   mesh_jobs=MeshJobs({"a": "x", "b": "x"}, overload=0))
    assert res.llms["a"].utilisation + res.llms["b"].utilisation <= 1.0 + 1e-9
    assert res.completed + res.unfinished == res.arrivals


def test_jobs_that_need_the_whole_mesh_overlap_without_it():
    """The property above can fail: without the mesh, both LLMs are busy at once."""
    alloc = Allocation({"a": Instance(GPU, 1, 1.0), "b": Instance(GPU, 1, 1.0)})
    res = simulate(rate_trace(), MODELS, alloc, Toy(20.0, 3.0), {"wa": 150.0, "wb": 150.0},
                   requests=150, seed=1, warmup_fraction=0.0)
    assert res.llms["a"].utilisation + res.llms["b"].utilisation > 1.2


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"mesh_jobs": MeshJobs({"zz": "x"})}, "mesh_jobs.meshes.zz"),
    ({"mesh_jobs": "x"}, "mesh_jobs"),
    ({"batch_limits": {"zz": 4}}, "batch_limits.zz"),
    ({"batch_limits": {"a": 0}}, "batch_limits.a"),
])
def test_bad_mesh_input_names_the_field(kwargs, field):
    alloc = Allocation({"a": Instance(GPU, 1, 0.5), "b": Instance(GPU, 1, 0.5)})
    with pytest.raises(InputError) as err:
        simulate(two_calls(0.1), MODELS, alloc, Toy(1.0, 1.0), **kwargs)
    assert err.value.field == field


def test_an_llm_on_a_mesh_has_one_replica_and_parts_are_checked():
    alloc = Allocation({"a": Instance(GPU, 1, 0.5, 2), "b": Instance(GPU, 1, 0.5)})
    with pytest.raises(InputError, match="one replica"):
        simulate(two_calls(0.1), MODELS, alloc, Toy(1.0, 1.0),
                 mesh_jobs=MeshJobs({"a": "x", "b": "x"}))
    with pytest.raises(InputError, match=r"mesh_jobs\.parts"):
        MeshJobs({"a": "x"}, parts=0)
    with pytest.raises(InputError, match=r"mesh_jobs\.meshes"):
        MeshJobs({"a": ""})
    assert [MeshJobs({}).job_parts(s) for s in (0.01, 0.3, 0.85, 1.0)] == [1, 3, 8, 10]
