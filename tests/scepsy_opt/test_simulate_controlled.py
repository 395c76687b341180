"""The simulator under a changing allocation (``changes=``) and with LAS priorities
(``priority=``): replicas come up and drain without losing a call, routing sees only the replicas
up and not draining, GPU-time follows the spans, and LAS reorders a queue as computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.prediction.priority import las_level
from scepsy_opt.prediction.schedule import AllocationChange, ReplicaSpan, gpu_seconds
from scepsy_opt.prediction.simulate import simulate
from scepsy_opt.traces import CallRecord, Trace
from scepsy_profile.serving import MemoryPolicy

MODELS = {"m": "llama-2-7b", "gen": "llama-2-7b", "rr": "bge-reranker-large"}
GPU = "A100-80GB"
RESERVE = MemoryPolicy(kv_management="reserve")


class Toy:
    """Constant step times: a prefill ``p`` ms, a decode step ``d`` ms; ``call_delay_s`` the
    front end's delay per call."""

    def __init__(self, p: float = 100.0, d: float = 10.0, delay: float = 0.0) -> None:
        self.p, self.d, self.call_delay_s = p, d, delay

    def prefill_ms(self, model, gpu, tp, share, batch, seq):
        return np.full(np.broadcast(np.asarray(batch), np.asarray(seq)).shape, self.p)

    def decode_ms(self, model, gpu, tp, share, batch, ctx):
        return self.d

    def covers(self, model, gpu, tp):
        return True


def alloc(n: int, share: float = 0.5, **more: Instance) -> Allocation:
    return Allocation({"m": Instance(GPU, 1, share, n), **more})


def single(out: int = 11, inp: int = 100) -> Trace:
    return Trace((CallRecord("w", "r0", "c0", 0.0, 1.0, llm="m", input_tokens=inp,
                             output_tokens=out),))


def rag_like() -> Trace:
    """gen -> tool -> 3 reranks -> gen, and a side call; two LLMs."""
    calls = []
    for r, out in enumerate([5, 12]):
        rid = f"a{r}"
        calls.append(CallRecord("a", rid, "q", 0.0, 0.2, llm="gen", input_tokens=50,
                                output_tokens=out))
        calls.append(CallRecord("a", rid, "side", 0.5, 0.6, llm="gen", input_tokens=30,
                                output_tokens=3))
        calls.append(CallRecord("a", rid, "search", 0.2, 0.3, tool="search", parents=("q",)))
        ranks = [f"rr{i}" for i in range(3)]
        for cid in ranks:
            calls.append(CallRecord("a", rid, cid, 0.3, 0.35, llm="rr", input_tokens=200,
                                    output_tokens=1, parents=("search",)))
        calls.append(CallRecord("a", rid, "answer", 0.35, 1.0, llm="gen", input_tokens=400,
                                output_tokens=out, parents=tuple(ranks)))
    return Trace(tuple(calls))


def rag_alloc(gen: int, share: float = 0.5) -> Allocation:
    return Allocation({"gen": Instance(GPU, 1, share, gen), "rr": Instance(GPU, 1, 0.25, 1)})


def spans_by_replica(res) -> dict[tuple[str, int], ReplicaSpan]:
    out = {(s.llm, s.replica): s for s in res.replica_spans}
    assert len(out) == len(res.replica_spans)  # one index per replica of an LLM
    return out


# ----------------------------------------------------------------------------- (a)
@pytest.mark.parametrize("routing", ["round_robin", "least_loaded"])
def test_a_change_to_the_same_allocation_changes_nothing(routing):
    trace, a = rag_like(), rag_alloc(3)
    kw = dict(requests=300, seed=4, routing=routing, record_events=True)
    plain = simulate(trace, MODELS, a, Toy(), {"a": 6.0}, **kw)
    same = simulate(trace, MODELS, a, Toy(), {"a": 6.0}, **kw,
                    changes=[AllocationChange(5.0, a), AllocationChange(5.0, a),
                             AllocationChange(20.0, rag_alloc(3))])
    assert same.requests == plain.requests
    assert same.call_log == plain.call_log
    assert same.workflows == plain.workflows and same.llms == plain.llms
    assert same.replica_spans == plain.replica_spans
    assert all(s.up_s == 0.0 and s.down_s is None for s in plain.replica_spans)


# ----------------------------------------------------------------------------- (b)
@pytest.mark.parametrize("routing", ["round_robin", "least_loaded"])
def test_b_added_replicas_take_calls_only_from_the_change(routing):
    t = 8.0
    res = simulate(rag_like(), MODELS, rag_alloc(1), Toy(), {"a": 5.0}, requests=200, seed=1,
                   routing=routing, record_events=True,
                   changes=[AllocationChange(t, rag_alloc(3))])
    spans = spans_by_replica(res)
    assert sorted(k for k in spans if k[0] == "gen") == [("gen", 0), ("gen", 1), ("gen", 2)]
    assert spans[("gen", 1)].up_s == spans[("gen", 2)].up_s == t
    on_new = [e for e in res.call_log if e.llm == "gen" and e.replica in (1, 2)]
    assert on_new  # the new replicas did serve
    assert all(e.ready_s >= t and e.start_s >= t for e in on_new)
    assert any(e.llm == "gen" and e.ready_s < t for e in res.call_log)
    assert res.unfinished == 0
    assert res.llms["gen"].replicas == 3


# ----------------------------------------------------------------------------- (c)
@pytest.mark.parametrize("delay", [0.0, 0.03])
def test_c_drained_replicas_take_no_calls_finish_theirs_and_go_down(delay):
    t = 6.0
    res = simulate(rag_like(), MODELS, rag_alloc(3), Toy(delay=delay), {"a": 8.0},
                   requests=200, seed=2, routing="least_loaded", record_events=True,
                   changes=[AllocationChange(t, rag_alloc(1))])
    assert res.unfinished == 0 and res.completed == 200
    spans = spans_by_replica(res)
    busy_at_change = 0
    for r in (1, 2):
        s = spans[("gen", r)]
        mine = [e for e in res.call_log if e.llm == "gen" and e.replica == r]
        assert all(e.ready_s < t for e in mine)  # routed before the drain only
        assert all(e.end_s is not None for e in mine)
        assert s.down_s is not None and s.down_s >= t
        assert s.down_s == max([t] + [e.end_s for e in mine])
        busy_at_change += s.down_s > t
    assert busy_at_change  # the case is not vacuous: a drained replica had work left
    assert spans[("gen", 0)].down_s is None
    assert res.llms["gen"].replicas == 1


def test_c_an_idle_replica_is_down_at_the_drain():
    res = simulate(single(), MODELS, alloc(2), Toy(), {"w": 1.0},
                   arrival_times_s=[0.0, 0.0, 5.0], record_events=True,
                   changes=[AllocationChange(2.0, alloc(1))])
    s = spans_by_replica(res)[("m", 1)]
    assert s.up_s == 0.0 and s.down_s == 2.0
    assert [e.replica for e in res.call_log] == [0, 1, 0]


def test_c_a_new_shape_drains_every_old_replica():
    res = simulate(single(), MODELS, alloc(2, 0.5), Toy(), {"w": 1.0},
                   arrival_times_s=[0.0, 0.0, 5.0, 5.0, 5.0], record_events=True,
                   changes=[AllocationChange(3.0, alloc(3, 1.0))])
    spans = res.replica_spans
    assert [(s.instance.share, s.replica, s.up_s, s.down_s) for s in spans] == [
        (0.5, 0, 0.0, 3.0), (0.5, 1, 0.0, 3.0),
        (1.0, 2, 3.0, None), (1.0, 3, 3.0, None), (1.0, 4, 3.0, None)]
    assert all(s.instance.replicas == 1 for s in spans)
    assert sorted(e.replica for e in res.call_log if e.ready_s >= 3.0) == [2, 3, 4]
    assert res.llms["m"].replicas == 3


# ----------------------------------------------------------------------------- (d)
def test_d_gpu_time_of_the_spans_by_hand():
    """One call alone: a 100 ms prefill and 10 decode steps of 10 ms = 0.2 s. Replica 0 serves
    from 0; replicas 1 and 2 come up at 10, take one call each at 15 and at 19.9 and are drained
    at 20 while serving their 19.9 calls, which end at 20.1; the last call ends at 25.2."""
    res = simulate(single(out=11), MODELS, alloc(1), Toy(), {"w": 1.0},
                   arrival_times_s=[0.0, 15.0, 15.0, 15.0, 19.9, 19.9, 19.9, 25.0],
                   record_events=True,
                   changes=[AllocationChange(10.0, alloc(3)), AllocationChange(20.0, alloc(1))])
    assert res.end_s == pytest.approx(25.2)
    got = [(s.replica, s.up_s, s.down_s) for s in res.replica_spans]
    assert got[0] == (0, 0.0, None)
    for (r, up, down), want in zip(got[1:], (1, 2), strict=True):
        assert (r, up) == (want, 10.0) and down == pytest.approx(20.1)
    hand = 0.5 * 25.2 + 2 * 0.5 * (20.1 - 10.0)
    assert gpu_seconds(res.replica_spans, res.end_s) == pytest.approx(hand)
    assert res.replica_spans[1].gpus == 0.5
    # the 19.9 calls went one to each replica (round robin over the three up)
    assert sorted(e.replica for e in res.call_log if e.ready_s == 19.9) == [0, 1, 2]


# ----------------------------------------------------------------------------- (e)
def las_case() -> Trace:
    """A: a1 (3000-token prompt) -> a2; F: one long call; B: one short call, arriving after a2
    is ready. One replica that runs one sequence at a time (max_batch 1)."""
    return Trace((
        CallRecord("w", "r0", "a1", 0.0, 0.1, llm="m", input_tokens=3000, output_tokens=2),
        CallRecord("w", "r0", "a2", 0.2, 0.3, llm="m", input_tokens=100, output_tokens=11,
                   parents=("a1",)),
        CallRecord("w", "r1", "f", 0.05, 1.0, llm="m", input_tokens=100, output_tokens=101),
        CallRecord("w", "r2", "b", 0.5, 0.6, llm="m", input_tokens=100, output_tokens=11),
    ))


@pytest.mark.parametrize("priority, a2_start, b_start", [
    # a1 runs 0-0.11 (prefill 0.1, one decode step); F waits since 0.05, runs 0.11-1.21
    # (prefill + 100 steps); then FCFS: a2 (ready 0.11) 1.21-1.41, B (ready 0.5) 1.41-1.61;
    # LAS: A has received 3002 tokens (level 1), B none (level 0): B first.
    ("fcfs", 1.21, 1.41),
    ("las", 1.41, 1.21),
])
def test_e_las_serves_the_fresh_request_first(priority, a2_start, b_start):
    assert las_level(3002) == 1 and las_level(0) == 0
    res = simulate(las_case(), MODELS, alloc(1, 1.0), Toy(), None, record_events=True,
                   policy=MemoryPolicy(max_batch=1), priority=priority)
    start = {e.call_id: e.start_s for e in res.call_log}
    assert start["a1"] == 0.0
    assert start["f"] == pytest.approx(0.11)
    assert start["a2"] == pytest.approx(a2_start)
    assert start["b"] == pytest.approx(b_start)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), rate=st.floats(2.0, 20.0), replicas=st.integers(1, 3),
       routing=st.sampled_from(["round_robin", "least_loaded"]))
def test_las_below_one_quantum_is_fcfs(seed, rate, replicas, routing):
    """Requests that never reach one quantum of service all stay at level 0: without
    preemption (reserved KV) LAS orders every queue as FCFS does."""
    trace = rag_like()  # at most 1,300 tokens per request
    kw = dict(requests=80, seed=seed, routing=routing, policy=RESERVE, record_events=True)
    a = rag_alloc(replicas)
    fcfs = simulate(trace, MODELS, a, Toy(), {"a": rate}, **kw)
    las = simulate(trace, MODELS, a, Toy(), {"a": rate}, **kw, priority="las")
    assert las.requests == fcfs.requests and las.call_log == fcfs.call_log


# ----------------------------------------------------------------------------- (f), (g)
def oracle_lifecycle(initial: tuple[int, float], steps: list[tuple[float, int, float]]):
    """Per replica index of LLM ``gen``: (up, drained at or inf), by the documented rules."""
    life: dict[int, list[float]] = {}
    n0, shape = initial
    active = list(range(n0))
    for i in active:
        life[i] = [0.0, math.inf]
    nxt = n0
    for t, n, sh in steps:
        if sh != shape:
            for i in active:
                life[i][1] = t
            active, shape = [], sh
        if n < len(active):
            for i in active[n:]:
                life[i][1] = t
            active = active[:n]
        while len(active) < n:
            life[nxt] = [t, math.inf]
            active.append(nxt)
            nxt += 1
    return life


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    initial=st.tuples(st.integers(1, 3), st.sampled_from([0.5, 1.0])),
    steps=st.lists(st.tuples(st.floats(0.0, 12.0), st.integers(1, 4), st.sampled_from([0.5, 1.0])),
                   max_size=4),
    routing=st.sampled_from(["round_robin", "least_loaded"]),
    priority=st.sampled_from(["fcfs", "las"]),
    delay=st.sampled_from([0.0, 0.02]),
    paged=st.booleans(),
)
def test_f_random_change_schedules_lose_nothing_and_route_only_to_serving_replicas(
        seed, initial, steps, routing, priority, delay, paged):
    steps = sorted(steps, key=lambda s: s[0])
    n0, sh0 = initial
    changes = [AllocationChange(t, rag_alloc(n, sh)) for t, n, sh in steps]
    policy = MemoryPolicy(max_batch=4) if paged else RESERVE
    res = simulate(rag_like(), MODELS, rag_alloc(n0, sh0), Toy(delay=delay), {"a": 10.0},
                   requests=120, seed=seed, routing=routing, priority=priority,
                   record_events=True, changes=changes, policy=policy)
    assert res.unfinished == 0 and res.completed == res.arrivals == 120
    # a change takes effect before the first event at or after its time: one after the run's
    # last event (every request done) never happens
    life = oracle_lifecycle(initial, [s for s in steps if s[0] <= res.end_s])
    spans = spans_by_replica(res)
    assert sorted(i for llm, i in spans if llm == "gen") == sorted(life)
    ends: dict[int, list[float]] = {i: [] for i in life}
    for e in res.call_log:
        assert e.end_s is not None
        if e.llm != "gen":
            continue
        up, drained = life[e.replica]
        assert up <= e.ready_s < drained  # routed while up and not draining
        assert e.start_s >= up
        ends[e.replica].append(e.end_s)
    for i, (up, drained) in life.items():
        s = spans[("gen", i)]
        assert s.up_s == up
        if drained == math.inf:
            assert s.down_s is None
        else:
            assert s.down_s == max([drained, *ends[i]])
    # (g) conservation: every LLM call of every replayed request completed once
    per_request = {rid: sum(1 for c in calls if c.llm is not None)
                   for (_, rid), calls in rag_like().requests.items()}
    assert res.llm_calls == sum(per_request[r.request_id] for r in res.requests)
    assert res.llm_calls == sum(1 for e in res.call_log if e.llm is not None)


def test_g_calls_are_conserved_across_changes():
    trace = rag_like()
    res = simulate(trace, MODELS, rag_alloc(2), Toy(), {"a": 12.0}, requests=400, seed=9,
                   changes=[AllocationChange(3.0, rag_alloc(1)), AllocationChange(9.0,
                            rag_alloc(4, 1.0)), AllocationChange(20.0, rag_alloc(2, 1.0))])
    recorded = {rid: sum(1 for c in calls if c.llm is not None)
                for (_, rid), calls in trace.requests.items()}
    assert res.unfinished == 0
    assert res.llm_calls == sum(recorded[r.request_id] for r in res.requests)
    assert res.llm_calls == sum(x.calls for x in res.llms.values())


# ----------------------------------------------------------------------------- inputs
@pytest.mark.parametrize("at", [-1.0, math.inf, math.nan, "3"])
def test_a_change_time_is_finite_and_not_negative(at):
    with pytest.raises(InputError, match="at_s"):
        AllocationChange(at, alloc(1))


def test_bad_changes_are_refused():
    kw = dict(requests=10)
    with pytest.raises(InputError, match="sorted"):
        simulate(single(), MODELS, alloc(1), Toy(), {"w": 1.0}, **kw,
                 changes=[AllocationChange(5.0, alloc(2)), AllocationChange(4.0, alloc(1))])
    with pytest.raises(InputError, match="0 replicas"):
        simulate(rag_like(), MODELS, rag_alloc(1), Toy(), {"a": 1.0}, **kw,
                 changes=[AllocationChange(1.0, Allocation({"gen": Instance(GPU, 1, 0.5, 1)}))])
    with pytest.raises(InputError, match="priority"):
        simulate(single(), MODELS, alloc(1), Toy(), {"w": 1.0}, **kw, priority="sjf")
    with pytest.raises(InputError, match="changes"):
        simulate(single(), MODELS, alloc(1), Toy(), {"w": 1.0}, **kw,
                 changes=AllocationChange(1.0, alloc(2)))
    split = Allocation({"g1": Instance(GPU, 1, 0.5, 1), "g2": Instance(GPU, 1, 0.5, 1)},
                       splits={"m": {"g1": 0.5, "g2": 0.5}})
    with pytest.raises(InputError, match="split"):
        simulate(single(), MODELS, split, Toy(), {"w": 1.0}, **kw,
                 changes=[AllocationChange(1.0, split)])
