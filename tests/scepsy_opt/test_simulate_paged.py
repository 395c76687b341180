"""Paged KV in the simulator (vLLM-style blocks, preemption by recomputation), the token budget
from the memory policy and the per-call engine delay.

Oracles: hand-worked admission sequences on a KV cache of a few blocks (constant or linear step
times), a token-by-token replica with the same rules (no jumps), and reserve mode where the KV
cache never binds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.prediction import simulate as sim
from scepsy_opt.prediction.simulate import simulate
from scepsy_opt.traces import CallRecord, Trace
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.hardware import GIB, GPUSpec
from scepsy_profile.overheads import EngineOverheads, front_delay_s, with_overheads
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import MemoryPolicy, memory_fit

MODEL = "llama-2-7b"
MODELS = {"m": MODEL}


def paged(block_size: int, max_batch: int = 256, **kw) -> MemoryPolicy:
    """Paged KV on a GPU whose whole memory is weights + KV (no reserve)."""
    return MemoryPolicy(kv_management="paged", block_size=block_size, max_batch=max_batch,
                        reserve_fraction=0.0, reserve_gib=0.0, **kw)


def reserve(max_batch: int = 256, **kw) -> MemoryPolicy:
    """Reserve mode (the whole I + O at admission) on the same GPU."""
    return MemoryPolicy(kv_management="reserve", max_batch=max_batch, reserve_fraction=0.0,
                        reserve_gib=0.0, **kw)


def tiny_catalog(tokens: int) -> Catalog:
    """The default catalog plus GPU ``tiny``: llama-2-7b's weights and ``tokens`` KV tokens."""
    cat = default_catalog()
    spec = cat.model(MODEL)
    w, per = spec.weight_bytes_per_gpu(1), spec.kv_bytes_per_token_per_gpu(1)
    return cat.with_gpu(GPUSpec("tiny", (w + (tokens + 0.5) * per) / GIB, 312.0, 2039.0, 1,
                                600.0))


TINY = Allocation({"m": Instance("tiny", 1, 1.0, 1)})


class Toy:
    """Constant step times: prefill ``p`` ms, decode ``d`` ms."""

    def __init__(self, p: float, d: float, delay: float = 0.0) -> None:
        self.p, self.d = p, d
        if delay:
            self.call_delay_s = delay

    def prefill_ms(self, model, gpu, tp, share, batch, seq):
        return self.p + 0.0 * np.asarray(batch, float) * np.asarray(seq, float)

    def decode_ms(self, model, gpu, tp, share, batch, ctx):
        return self.d

    def covers(self, model, gpu, tp):
        return True


class Lin(Toy):
    """Prefill ``1 + 0.5 · (prompt tokens of the batch)`` ms, decode ``d0 + d1 · B + c · ctx``."""

    def __init__(self, d0: float = 1.0, d1: float = 0.0, c: float = 0.0,
                 delay: float = 0.0) -> None:
        self.d0, self.d1, self.c = d0, d1, c
        if delay:
            self.call_delay_s = delay

    def prefill_ms(self, model, gpu, tp, share, batch, seq):
        return 1.0 + 0.5 * np.asarray(batch, float) * np.asarray(seq, float)

    def decode_ms(self, model, gpu, tp, share, batch, ctx):
        return self.d0 + self.d1 * np.asarray(batch, float) + self.c * np.asarray(ctx, float)


def calls_at(spec, workflow: str = "w") -> Trace:
    """One single-call request per ``(start, input, output)``, named r0, r1, ..."""
    return Trace(tuple(CallRecord(workflow, f"r{k}", "c", float(s), float(s) + 1.0, llm="m",
                                  input_tokens=int(i), output_tokens=int(o))
                       for k, (s, i, o) in enumerate(spec)))


def together(spec) -> Trace:
    """One request whose calls ``name: (input, output)`` all start at 0."""
    return Trace(tuple(CallRecord("w", "r", name, 0.0, 1.0, llm="m", input_tokens=i,
                                  output_tokens=o) for name, (i, o) in spec.items()))


def by_call(res):
    return {e.call_id: e for e in res.call_log}


# --------------------------------------------------------------------------- hand-worked
def test_tiny_kv_is_what_the_tests_assume():
    for tokens in (8, 24, 57):
        fit = memory_fit(MODEL, "tiny", 1, 1.0, 1, tiny_catalog(tokens), paged(4))
        assert fit.kv_tokens == tokens


def test_hand_worked_preemption_with_block_size_2():
    """KV of 8 tokens = 4 blocks of 2; prefill 10 ms, decode 1 ms.

    t=0: A (3 + 4 tokens) needs the blocks of 3+1 tokens (2), B (2 + 4) those of 3 (2): both
    admitted, prefilled together until 10 ms (A holds 4 tokens, B 3). Step 1: A's blocks are full
    and it needs a 5th block, none is free: B, the newest, is preempted (10 ms) with 2 + 1 tokens
    and goes back to the queue. A runs its 3 steps alone (it takes blocks 3 and 4 on the way) and
    ends at 13 ms; B (3 tokens + 1 needs 2 blocks) is prefilled again from 13 ms with its prompt and
    first token, gets its 2nd token at 23 ms and decodes the 3rd and 4th: 25 ms.
    Reserve mode: A (7 tokens) alone, then B: 13 ms and 13 + 10 + 3 = 26 ms."""
    trace = together({"A": (3, 4), "B": (2, 4)})
    res = simulate(trace, MODELS, TINY, Toy(10.0, 1.0), policy=paged(2),
                   catalog=tiny_catalog(8), record_events=True)
    a, b = by_call(res)["A"], by_call(res)["B"]
    assert (a.start_s, a.end_s) == pytest.approx((0.0, 0.013))
    assert a.admitted_s == (0.0,) and a.preempted_s == ()
    assert b.start_s == 0.0 and b.end_s == pytest.approx(0.025)
    assert b.admitted_s == pytest.approx((0.0, 0.013)) and b.preempted_s == pytest.approx((0.010,))
    m = res.llms["m"]
    assert (m.preemptions, m.calls, m.preemptions_per_call) == (1, 2, 0.5)
    assert m.kv_tokens == 8
    old = simulate(trace, MODELS, TINY, Toy(10.0, 1.0), policy=reserve(),
                   catalog=tiny_catalog(8), record_events=True)
    assert [e.end_s for e in old.call_log] == pytest.approx([0.013, 0.026])
    assert old.llms["m"].preemptions == 0 and by_call(old)["B"].start_s == pytest.approx(0.013)


def test_hand_worked_three_calls_two_preemptions_and_recompute_prefill():
    """KV of 24 tokens = 6 blocks of 4; prefill ``1 + 0.5 · prompt tokens`` ms, decode 1 ms.

    A, B, C (4 + 16 tokens each) need 2 blocks each to start: all admitted, prefill 1 + 6 = 7 ms,
    5 tokens each. Steps 1-3 fit (5 → 8 tokens); step 4 needs 3 blocks, none free: C (newest,
    8 tokens) is preempted at 10 ms and A, B take the 2 it freed. Steps 4-7 (→ 12 tokens); step 8
    needs 2, none free: B (12 tokens) preempted at 14 ms, to the front of the queue (before C).
    A (3 blocks free) finishes its 16 tokens at 7 + 15 = 22 ms. B is prefilled again with
    4 + 8 = 12 tokens (13 → 4 blocks; C needs 3 more, only 2 left): 1 + 6 = 7 ms → 29 ms, then 7
    steps: 36 ms. C: prefill of 4 + 4 = 8 tokens, 5 ms, then 11 steps: 52 ms.
    Reserve mode (20 tokens each: one at a time): 3 + 15 = 18, 36, 54 ms."""
    trace = together({"A": (4, 16), "B": (4, 16), "C": (4, 16)})
    res = simulate(trace, MODELS, TINY, Lin(), policy=paged(4), catalog=tiny_catalog(24),
                   record_events=True)
    ev = by_call(res)
    assert [ev[c].end_s for c in "ABC"] == pytest.approx([0.022, 0.036, 0.052])
    assert [ev[c].preempted_s for c in "ABC"] == [(), pytest.approx((0.014,)),
                                                  pytest.approx((0.010,))]
    assert [ev[c].admitted_s for c in "ABC"] == [(0.0,), pytest.approx((0.0, 0.022)),
                                                 pytest.approx((0.0, 0.036))]
    assert res.llms["m"].preemptions == 2
    assert res.llms["m"].mean_prefill_batch == pytest.approx(5 / 3)  # prefills of 3, 1, 1
    old = simulate(trace, MODELS, TINY, Lin(), policy=reserve(), catalog=tiny_catalog(24),
                   record_events=True)
    assert [e.end_s for e in old.call_log] == pytest.approx([0.018, 0.036, 0.054])


def test_hand_worked_admission_waits_for_blocks_and_an_arrival_cuts_a_jump():
    """KV of 16 tokens = 4 blocks of 4; prefill 5 ms, decode 1 ms.

    A (5 + 10) arrives at 0: blocks of 6 tokens (2), prefill → 5 ms, then 9 steps. B (6 + 3)
    arrives at 7.5 ms and needs 2 blocks: after step 3 (A at 9 tokens, 3 blocks) only 1 is free,
    so B waits (no cut) until A ends at 14 ms (A: 15 tokens, 4 blocks at the end); prefill
    → 19 ms. C (2 + 3) arrives at 19.5 ms, during B's first decode step: it needs 1 block, B
    holds 2 (8 tokens after the step), so the jump is cut at 20 ms and C is prefilled (→ 25 ms);
    B's last step ends at 26 ms, C's two at 27 ms."""
    trace = calls_at([(0.0, 5, 10), (0.0075, 6, 3), (0.0195, 2, 3)])
    res = simulate(trace, MODELS, TINY, Toy(5.0, 1.0), policy=paged(4),
                   catalog=tiny_catalog(16), record_events=True)
    assert [e.start_s for e in res.call_log] == pytest.approx([0.0, 0.014, 0.020])
    assert [e.end_s for e in res.call_log] == pytest.approx([0.014, 0.026, 0.027])
    # a B of 3 + 3 tokens needs 1 block: it cuts A's jump at 8 ms
    early = simulate(calls_at([(0.0, 5, 10), (0.0075, 3, 3)]), MODELS, TINY, Toy(5.0, 1.0),
                     policy=paged(4), catalog=tiny_catalog(16), record_events=True)
    assert [e.start_s for e in early.call_log] == pytest.approx([0.0, 0.008])
    assert res.llms["m"].preemptions == 0


def test_max_batch_and_token_budget_still_apply_with_paged_kv():
    """Ample KV: four calls of 100 + 20 tokens at once; max_batch 2 admits two at a time, and
    the policy's max_num_batched_tokens = 200 (the simulate() argument unset) prefills two
    at a time."""
    trace = together({f"c{i}": (100, 20) for i in range(4)})
    two = simulate(trace, MODELS, TINY, Toy(5.0, 1.0), policy=paged(16, max_batch=2),
                   catalog=tiny_catalog(4096), record_events=True)
    assert sorted(e.end_s for e in two.call_log) == pytest.approx([0.024] * 2 + [0.048] * 2)
    cap = simulate(trace, MODELS, TINY, Toy(5.0, 1.0), catalog=tiny_catalog(4096),
                   policy=paged(16, max_num_batched_tokens=200), record_events=True)
    assert cap.llms["m"].mean_prefill_batch == 2
    assert sorted(e.start_s for e in cap.call_log) == pytest.approx([0.0, 0.0, 0.005, 0.005])
    # the argument wins over the policy
    arg = simulate(trace, MODELS, TINY, Toy(5.0, 1.0), catalog=tiny_catalog(4096),
                   policy=paged(16, max_num_batched_tokens=200), max_prefill_tokens=100)
    assert arg.llms["m"].mean_prefill_batch == 1


# --------------------------------------------------------------------------- token by token
def naive_paged(arrivals, latency, max_batch, blocks, bs, budget=math.inf):
    """One replica, token by token, no jumps: the rules of docs/simulator.md.

    ``arrivals`` are ``(time, name, input, output)``; returns ``(ends, preemptions)`` and checks
    at every iteration that the blocks held stay within ``blocks``."""
    t, i, queue, running, ends, evicted = 0.0, 0, [], [], {}, 0

    def held():
        return sum(-(-tok // bs) for _, tok, _ in running)

    while i < len(arrivals) or queue or running:
        while i < len(arrivals) and arrivals[i][0] <= t:
            queue.append(list(arrivals[i][1:]))
            i += 1
        if not queue and not running:
            t = arrivals[i][0]
            continue
        adm, pend, tot = [], 0, 0
        while queue and len(running) + len(adm) < max_batch:
            name, inp, out = queue[0]
            need = -(-(inp + 1) // bs)
            if held() + pend + need > blocks or (tot and tot + inp > budget):
                break
            pend, tot = pend + need, tot + inp
            adm.append(queue.pop(0))
        if adm:
            t += float(latency.prefill_ms("", "", 1, 1.0, len(adm), tot / len(adm))) / 1e3
            for name, inp, out in adm:  # the prefill gives the first token
                if out == 1:
                    ends[name] = t
                else:
                    running.append([name, inp + 1, out - 1])  # tokens held, outputs left
            assert held() <= blocks
            continue
        while held() + sum(1 for _, tok, _ in running if tok % bs == 0) > blocks:
            name, tok, left = running.pop()  # the most recently admitted
            queue.insert(0, [name, tok, left])  # prefilled again with what it generated
            evicted += 1
        ctx = np.mean([tok for _, tok, _ in running])
        t += float(latency.decode_ms("", "", 1, 1.0, len(running), ctx)) / 1e3
        for r in running:
            r[1] += 1
            r[2] -= 1
        assert held() <= blocks
        for r in [r for r in running if r[2] == 0]:
            ends[r[0]] = t
            running.remove(r)
    return ends, evicted


def random_single_calls(rng, n, max_in, max_out, span):
    starts = np.sort(rng.uniform(0, span, n)).round(5)
    inp = rng.integers(1, max_in + 1, n)
    out = np.where(rng.random(n) < 0.2, 1, rng.integers(1, max_out + 1, n))
    return [(float(starts[k] - starts[0]), int(inp[k]), int(out[k])) for k in range(n)]


def check_against_naive(spec, bs, blocks, max_batch, budget, latency):
    trace = calls_at(spec)
    longest = max(i + o for _, i, o in spec)
    blocks = max(blocks, -(-longest // bs))
    res = simulate(trace, MODELS, TINY, latency, catalog=tiny_catalog(blocks * bs),
                   policy=paged(bs, max_batch, max_num_batched_tokens=budget))
    want, evicted = naive_paged([(s, f"r{k}", i, o) for k, (s, i, o) in enumerate(spec)],
                                latency, max_batch, blocks, bs,
                                math.inf if budget is None else budget)
    got = {r.request_id: r.end_s for r in res.requests}
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert res.llms["m"].preemptions == evicted
    return evicted


@pytest.mark.parametrize("seed", range(4))
def test_jumps_match_a_token_by_token_paged_replica(seed):
    """150 random calls on a KV cache that binds (preemptions happen): identical end times and
    preemption counts. The decode time depends on the batch only: a call arriving mid-jump cuts
    it at ``t0 + k·tau`` with the jump's mean step time ``tau``, exact for constant steps (as
    in reserve mode); ``tests/scepsy_opt/test_simulate.py`` checks the mean context of a jump."""
    rng = np.random.default_rng(seed)
    spec = random_single_calls(rng, 150, 60, 80, 1.0)
    evicted = check_against_naive(spec, [1, 4, 16, 3][seed], 60, [4, 8, 256, 6][seed],
                                  [None, 64, None, 100][seed], Lin(1.0, 0.5))
    assert evicted > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 25), bs=st.sampled_from([1, 2, 4, 16]),
       blocks=st.integers(1, 40), max_batch=st.integers(1, 8),
       budget=st.sampled_from([None, 8, 50]))
def test_property_paged_matches_token_by_token(seed, n, bs, blocks, max_batch, budget):
    """Small random instances: every call completes, the blocks held never pass the capacity
    (the token-by-token replica asserts it at every iteration) and the jumps agree with it."""
    rng = np.random.default_rng(seed)
    spec = random_single_calls(rng, n, 30, 30, 0.05)
    check_against_naive(spec, bs, blocks, max_batch, budget, Lin(1.0, 0.5))


# --------------------------------------------------------------------------- invariants
def workflow_trace() -> Trace:
    """Two workflows on LLMs g and h: a (g → tool → 3 h → g) with two recorded sizes, b (one g)."""
    calls = []
    for r, (k, out) in enumerate([(3, 25), (2, 40)]):
        rid = f"a{r}"
        calls.append(CallRecord("a", rid, "q", 10.0, 10.2, llm="g", input_tokens=50,
                                output_tokens=out))
        calls.append(CallRecord("a", rid, "search", 10.2, 10.3, tool="search", parents=("q",)))
        ranks = [f"h{i}" for i in range(k)]
        for cid in ranks:
            calls.append(CallRecord("a", rid, cid, 10.3, 10.35, llm="h", input_tokens=60,
                                    output_tokens=9, parents=("search",)))
        calls.append(CallRecord("a", rid, "answer", 10.35, 11.0, llm="g", input_tokens=90,
                                output_tokens=out, parents=tuple(ranks)))
    calls.append(CallRecord("b", "b0", "x", 3.0, 3.5, llm="g", input_tokens=80,
                            output_tokens=60))
    return Trace(tuple(calls))


TWO = {"g": MODEL, "h": MODEL}
TWO_TINY = Allocation({"g": Instance("tiny", 1, 1.0, 2), "h": Instance("tiny", 1, 1.0, 1)})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), rate=st.floats(5.0, 400.0), n=st.integers(1, 60),
       bs=st.sampled_from([1, 4, 16]), tokens=st.integers(160, 1200),
       routing=st.sampled_from(["round_robin", "least_loaded"]), delay=st.sampled_from([0, 2e-3]))
def test_property_blocks_within_capacity_and_every_call_completes(
        seed, rate, n, bs, tokens, routing, delay):
    """Workflows with dependencies, several replicas, call delays: at every iteration the blocks
    held (those of the running set to the end of the decode jump, plus a prefill's) stay within
    the capacity, and every request completes."""
    start = sim._Replica.start
    seen = {"checks": 0}

    def checked(rep, t):
        start(rep, t)
        if rep.paged and rep.state != sim._IDLE:
            ahead = rep.jump_n if rep.state == sim._DECODE else 0
            assert rep.used_blocks(rep.steps + ahead) + rep.kv_used <= rep.kv_cap
            assert rep.kv_used >= 0 and len(rep.running) + len(rep.admitted) <= rep.max_batch
            seen["checks"] += 1

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sim._Replica, "start", checked)
        res = simulate(workflow_trace(), TWO, TWO_TINY, Lin(1.0, 0.5, 0.01, delay),
                       {"a": rate, "b": rate}, requests=n, seed=seed, routing=routing,
                       policy=paged(bs, 16), catalog=tiny_catalog(tokens))
    assert res.unfinished == 0 and seen["checks"] > 0
    assert res.llm_calls == sum({"a0": 5, "a1": 4, "b0": 1}[r.request_id] for r in res.requests)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), rate=st.floats(1.0, 300.0), n=st.integers(1, 80),
       bs=st.sampled_from([1, 16, 32]), routing=st.sampled_from(["round_robin", "least_loaded"]))
def test_ample_kv_paged_equals_reserve(seed, rate, n, bs, routing):
    """llama-2-7b on half an A100 holds ~46k tokens; 8 sequences of at most 130 tokens never
    fill it: no preemption, and paged mode gives exactly reserve mode's run (the oracle)."""
    alloc = Allocation({"g": Instance("A100-80GB", 1, 0.5, 2), "h": Instance("A100-80GB", 1, 0.5)})
    args = (workflow_trace(), TWO, alloc, roofline_model(), {"a": rate, "b": rate / 3})
    kw = {"requests": n, "seed": seed, "routing": routing, "record_events": True}
    new = simulate(*args, policy=MemoryPolicy(max_batch=8, block_size=bs), **kw)
    old = simulate(*args, policy=MemoryPolicy(max_batch=8, kv_management="reserve"), **kw)
    assert all(m.preemptions == 0 for m in new.llms.values())
    assert new == old


def test_same_seed_same_result_with_preemptions():
    args = (workflow_trace(), TWO, TWO_TINY, Lin(1.0, 0.5, 0.01), {"a": 50.0, "b": 20.0})
    kw = {"requests": 300, "policy": paged(4, 16), "catalog": tiny_catalog(400)}
    one = simulate(*args, seed=7, **kw)
    assert one.llms["g"].preemptions > 0
    assert one == simulate(*args, seed=7, **kw)
    assert simulate(*args, seed=8, **kw).requests != one.requests


def test_preemption_counts_cover_the_whole_run():
    """Warm-up included: 3 calls (4 + 16 tokens) at once on 6 blocks of 4, three times, far apart
    (the hand-worked sequence above each time): 2 preemptions per 3 calls, with a warm-up of 90%."""
    trace = together({"A": (4, 16), "B": (4, 16), "C": (4, 16)})
    res = simulate(trace, MODELS, TINY, Lin(), {"w": 0.01}, requests=3, seed=0,
                   policy=paged(4), catalog=tiny_catalog(24), warmup_fraction=0.9)
    assert res.workflows["w"].measured == 1
    m = res.llms["m"]
    assert (m.preemptions, m.calls) == (6, 9) and m.preemptions_per_call == pytest.approx(2 / 3)


# --------------------------------------------------------------------------- call delay
def test_call_delay_is_a_pure_delay_per_llm_call():
    """Zero load: a chain q → tool (0.1 s) → answer takes 2·(delay + prefill + (O − 1)·d) + tool;
    the replica is not busy during the delay."""
    chain = Trace((CallRecord("w", "r", "q", 0.0, 0.1, llm="m", input_tokens=10, output_tokens=5),
                   CallRecord("w", "r", "t", 0.1, 0.2, tool="search", parents=("q",)),
                   CallRecord("w", "r", "a", 0.2, 0.3, llm="m", input_tokens=10,
                              output_tokens=3, parents=("t",))))
    alloc = Allocation({"m": Instance("A100-80GB", 1, 0.5)})
    for delay in (0.0, 0.25):
        res = simulate(chain, MODELS, alloc, Toy(7.0, 2.0, delay=delay), {"w": 0.001},
                       requests=3, record_events=True)
        want = (delay + 0.007 + 4 * 0.002) + 0.1 + (delay + 0.007 + 2 * 0.002)
        assert res.workflows["w"].mean_latency_s == pytest.approx(want)
        q = next(e for e in res.call_log if e.call_id == "q" and e.arrival == 0)
        assert q.start_s == pytest.approx(q.ready_s + delay)
        assert res.llms["m"].utilisation * (res.window_s[1] - res.window_s[0]) == pytest.approx(
            (0.007 + 4 * 0.002 + 0.007 + 2 * 0.002) * 2)  # two requests in the window


def test_least_loaded_counts_calls_in_flight_to_a_replica():
    """Four calls sent together during a delay of 0.1 s: routed at once, two per replica,
    each replica's front end passing them on one after the other."""
    trace = together({f"c{i}": (10, 5) for i in range(4)})
    alloc = Allocation({"m": Instance("A100-80GB", 1, 0.5, 2)})
    res = simulate(trace, MODELS, alloc, Toy(5.0, 1.0, delay=0.1), routing="least_loaded",
                   record_events=True)
    assert sorted(e.replica for e in res.call_log) == [0, 0, 1, 1]
    assert sorted(e.start_s for e in res.call_log) == pytest.approx([0.1, 0.1, 0.2, 0.2])


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_a_fan_out_waits_in_turn_at_the_front_end(k):
    """``k`` calls ready together on one replica: its front end passes them on ``delay`` apart,
    so the mean call latency is the engine's time plus ``front_delay_s(delay, k)``: the
    predictor's mean wait, checked here call by call (each call's engine time, 9 ms, is
    shorter than the delay, so the engine serves them one by one)."""
    trace = together({f"c{i}": (10, 5) for i in range(k)})
    delay = 0.05
    res = simulate(trace, MODELS, Allocation({"m": Instance("A100-80GB", 1, 0.5)}),
                   Toy(5.0, 1.0, delay=delay), record_events=True)
    starts = sorted(e.start_s for e in res.call_log)
    assert starts == pytest.approx([delay * (j + 1) for j in range(k)])
    engine = 0.005 + 4 * 0.001
    mean_call = sum(e.end_s - e.ready_s for e in res.call_log) / k
    assert mean_call == pytest.approx(engine + front_delay_s(delay, k), rel=1e-9)


def test_engine_overheads_reach_the_simulator():
    """An overhead-wrapped latency model: its call delay delays each call, its iteration time
    lengthens each step."""
    one = Trace((CallRecord("w", "r", "c", 0.0, 1.0, llm="m", input_tokens=10,
                            output_tokens=5),))
    o = EngineOverheads("vllm", "x", "cpu", iteration_ms=1.0, first_token_ms=30.0, http_ms=20.0)
    res = simulate(one, MODELS, Allocation({"m": Instance("A100-80GB", 1, 0.5)}),
                   with_overheads(Toy(7.0, 2.0), o))
    assert res.requests[0].end_s == pytest.approx(0.050 + 0.008 + 4 * 0.003)


# --------------------------------------------------------------------------- bad input
def test_a_call_whose_blocks_do_not_fit_is_an_error():
    """10 KV tokens hold a 9-token call, but 2 blocks of 4 (8 tokens) do not."""
    trace = together({"A": (5, 4)})
    ok = simulate(trace, MODELS, TINY, Toy(1.0, 1.0), policy=reserve(), catalog=tiny_catalog(10))
    assert ok.unfinished == 0
    with pytest.raises(InputError, match="2 blocks of 4") as err:
        simulate(trace, MODELS, TINY, Toy(1.0, 1.0), policy=paged(4), catalog=tiny_catalog(10))
    assert err.value.field == "llms.m"
    assert simulate(trace, MODELS, TINY, Toy(1.0, 1.0), policy=paged(5),
                    catalog=tiny_catalog(10)).unfinished == 0


def test_a_negative_call_delay_is_an_error():
    with pytest.raises(InputError) as err:
        simulate(together({"A": (5, 4)}), MODELS, TINY, Toy(1.0, 1.0, delay=-1.0),
                 catalog=tiny_catalog(64))
    assert err.value.field == "call_delay_s"


@given(st.floats(0.2, 2.0), st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_calls_that_arrive_apart_do_not_queue_behind_each_others_delay(delay, seed):
    """The front end's delay is a delay, not a server: single-call requests arriving far
    faster than one per delay each start exactly ``delay`` after they are ready (the
    predictor's front_delay_s of a group of one), so the delay does not cap the throughput at
    one call per delay (one LLM of MuxServe's measured runs served 14.7 req/s under a fitted
    first-token delay of 0.225 s)."""
    one = Trace((CallRecord("w", "r", "c", 0.0, 1.0, llm="m", input_tokens=10,
                            output_tokens=3),))
    rate = 20.0 / delay  # 20 calls per delay
    res = simulate(one, MODELS, Allocation({"m": Instance("A100-80GB", 1, 1.0)}),
                   Toy(0.5, 0.1, delay=delay), {"w": rate}, requests=200, seed=seed,
                   record_events=True, warmup_fraction=0.0)
    # each waits its own delay, and at most a step or two of the engine (0.7 ms a call) after
    waits = np.array([e.start_s - e.ready_s - delay for e in res.call_log])
    assert waits.min() >= -1e-9 and waits.mean() < 0.005
    span = max(r.end_s for r in res.requests) - min(r.arrival_s for r in res.requests)
    assert len(res.requests) / span > 5.0 / delay  # far above one call per delay
