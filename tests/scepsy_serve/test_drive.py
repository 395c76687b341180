"""The workflow driver against the loopback fake server: accounting, the call graph's order and
fan-out, Poisson arrivals and endpoint weights (drawn without HTTP), every failure kind, timeouts
and the run's deadline, the in-flight bound, the measured trace and the command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import threading
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.openai_server import FakeOpenAIServer
from scepsy.cli.drive import register
from scepsy.cli.util import UsageError
from scepsy_common.errors import InputError
from scepsy_opt.stats import trace_stats
from scepsy_opt.traces import read_trace
from scepsy_opt.workflows import Distribution as D
from scepsy_opt.workflows import WorkflowSpec, generate_trace
from scepsy_profile.profiling.replay import ReplayTimeouts, poisson_arrivals
from scepsy_serve.launch.drive import (
    BATCHES,
    DRIVE_FAILURE_KINDS,
    DriveProgress,
    DriveResult,
    drive,
    drive_async,
    plan_drive,
    summarize_latency,
    write_drive_trace,
)
from scepsy_serve.launch.routes import Endpoint, Routes

FAST = ReplayTimeouts(connect_s=1.0, stall_s=0.3, call_s=3.0)
PATIENT = ReplayTimeouts(connect_s=10.0, stall_s=10.0, call_s=30.0)
"""For tests that count failures by kind: the fake answers at once, so only a loaded machine
(a CI runner) would turn its answers into stalls under FAST."""
RERANK_K = 6


def rag(name: str = "rag", k: int = RERANK_K) -> WorkflowSpec:
    return WorkflowSpec(
        name=name, program="rag",
        llms={"rewriter": "qwen2.5-1.5b", "reranker": "bge-reranker-large",
              "generator": "qwen2.5-7b"},
        tools={"retrieval": D.constant(0.005)},
        params={"query_tokens": D.uniform(4, 12), "rewrite_prompt_tokens": 16,
                "rewritten_tokens": 4, "rerank_k": k, "doc_tokens": D.uniform(8, 24),
                "top_n": 2, "answer_prompt_tokens": 8, "answer_tokens": D.uniform(2, 8)})


def beam() -> WorkflowSpec:
    return WorkflowSpec(
        name="beam", program="beam_search",
        llms={"generator": "qwen2.5-7b", "prm": "qwen2.5-math-prm-7b"},
        params={"problem_tokens": 12, "steps": 2, "beam_width": 3, "step_tokens": 4})


def coder() -> WorkflowSpec:
    return WorkflowSpec(
        name="agent", program="coding_agent",
        llms={"coder": "qwen2.5-7b", "reviewer": "qwen2.5-1.5b"},
        tools={"tests": D.constant(0.005)},
        params={"task_tokens": 20, "planner_prompt_tokens": 8, "plan_tokens": 4, "rounds": 2,
                "coder_prompt_tokens": 8, "code_tokens": 6, "test_log_tokens": 4,
                "reviewer_prompt_tokens": 8, "review_tokens": 3})


def routes_for(specs, url: str, model=lambda w, llm: f"{w}.{llm}") -> Routes:
    """One endpoint per LLM; its model name (the fake's behaviour) from ``model``."""
    return Routes({s.name: {m: (Endpoint(url, model(s.name, m), 1.0, 0),) for m in s.llms}
                   for s in specs})


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAIServer(slots=256, prefill_s=0.01, token_s=0.002, hang_s=5.0) as srv:
        yield srv


@pytest.fixture(scope="module")
def normal_run(fake):
    """Three workflows, every call normal: the run most tests read."""
    specs = (rag(), beam(), coder())
    before = len(fake.requests)
    res = drive(specs, routes_for(specs, fake.base_url + "/v1"), rate=40.0, requests=30,
                seed=3, max_in_flight=6, timeouts=FAST)
    plan = plan_drive(specs, routes_for(specs, fake.base_url + "/v1"), rate=40.0, requests=30,
                      seed=3)
    return specs, plan, res, list(fake.requests[before:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accounted(res: DriveResult) -> None:
    assert res.completed + res.failed == res.sent
    assert res.sent + res.not_sent == res.planned
    assert sum(res.failures.values()) == res.failed
    assert set(res.failures) <= set(DRIVE_FAILURE_KINDS)
    assert set(res.call_failures) <= set(DRIVE_FAILURE_KINDS)
    for o in res.requests:
        assert o.calls_ok + o.calls_failed + o.calls_cancelled == o.calls_sent
        assert o.sent or o.calls_sent == 0


# ------------------------------------------------------------------------- a normal run


def test_all_normal_run_completes_every_request(normal_run):
    specs, plan, res, bodies = normal_run
    _accounted(res)
    assert (res.planned, res.sent, res.completed, res.failed) == (30, 30, 30, 0)
    assert dict(res.failures) == {} and dict(res.call_failures) == {}
    per = Counter(r.workflow for r in plan.requests)
    for s in specs:
        w = res.workflows[s.name]
        assert (w.sent, w.completed, w.failed) == (per[s.name], per[s.name], 0)
        assert w.latency.n == per[s.name] and w.throughput_rps > 0
        assert w.latency.p50_s <= w.latency.p90_s <= w.latency.p99_s
    # every call of the plan was sent once, with its tokens: prompt ids of the input length,
    # exactly its output length asked for, ignore_eos, streamed
    planned_llm = [c for r in plan.requests for c in r.calls if c.llm is not None]
    assert len(bodies) == len(planned_llm)
    want = Counter((f"{c.workflow}.{c.llm}", c.input_tokens, c.output_tokens)
                   for c in planned_llm)
    got = Counter((b["model"], len(b["prompt"]), b["max_tokens"]) for b in bodies)
    assert got == want
    assert all(b["ignore_eos"] and b["stream"] and b["min_tokens"] == b["max_tokens"]
               and all(isinstance(t, int) for t in b["prompt"]) for b in bodies)
    assert all(3 <= t < 1000 for b in bodies for t in b["prompt"])
    # the rewriter's system prompt (16 tokens) is one cacheable prefix: the same ids every call,
    # the rest of each prompt differs
    rw = [b["prompt"] for b in bodies if b["model"] == "rag.rewriter"]
    assert len(rw) >= 2 and all(x[:16] == rw[0][:16] for x in rw)
    assert len({tuple(x[16:]) for x in rw}) == len(rw)
    # per LLM: the calls of every workflow using it
    assert sum(m.calls for m in res.llms.values()) == len(planned_llm)
    assert res.llms["reranker"].calls == RERANK_K * per["rag"]
    assert all(m.ttft_mean_s is not None and 0 < m.ttft_mean_s <= m.latency.mean_s
               for m in res.llms.values())


def test_measured_trace_follows_the_dag_and_the_plan(normal_run):
    _, plan, res, _ = normal_run
    trace = res.trace()  # validate_calls: ids unique, parents end before children start
    by_req = {(r.workflow, r.request_id): r for r in plan.requests}
    assert len(trace.requests) == len(plan.requests)
    for key, calls in trace.requests.items():
        planned = by_req[key]
        ends = {c.call_id: c.end_s for c in calls}
        for c in calls:
            assert all(ends[p] <= c.start_s for p in c.parents)
            assert c.start_s >= planned.arrival_s - 1e-3  # nothing before its arrival
        assert [(c.call_id, c.parents, c.llm, c.tool, c.input_tokens, c.output_tokens)
                for c in calls] == [
            (c.call_id, c.parents, c.llm, c.tool, c.input_tokens, c.output_tokens)
            for c in planned.calls]
    # tool calls last at least their drawn duration
    for c in trace.calls:
        if c.tool is not None:
            assert c.duration_s >= 0.005 - 1e-3


def test_reranker_fan_out_runs_concurrently(normal_run):
    _, _, res, _ = normal_run
    overlapped = 0
    for (w, _), calls in res.trace().requests.items():
        if w != "rag":
            continue
        rr = [c for c in calls if c.llm == "reranker"]
        assert len(rr) == RERANK_K
        # all reranker calls of a request are in flight together: the last starts before the
        # first ends
        overlapped += max(c.start_s for c in rr) < min(c.end_s for c in rr)
    assert overlapped >= 0.8 * sum(1 for (w, _) in res.trace().requests if w == "rag")


def test_fan_out_is_concurrent_at_the_server():
    """One request at a time: the server itself sees all RERANK_K reranker calls at once (its
    running gauge, polled), and never more."""
    spec = rag()
    peak = [0]
    with FakeOpenAIServer(slots=64, prefill_s=0.2, token_s=0.001) as srv:
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], srv.running)
                time.sleep(0.002)

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        try:
            res = drive([spec], routes_for([spec], srv.base_url + "/v1"), rate=100.0,
                        requests=2, seed=0, max_in_flight=1, timeouts=FAST)
        finally:
            stop.set()
            t.join(5)
    assert res.completed == 2
    assert peak[0] == RERANK_K


def test_max_in_flight_is_honoured(fake):
    spec = rag(k=3)
    res = drive([spec], routes_for([spec], fake.base_url + "/v1"), rate=500.0, requests=24,
                seed=5, max_in_flight=3, timeouts=FAST)
    _accounted(res)
    assert res.completed == 24
    events = sorted([(o.admitted_s, 1) for o in res.requests]
                    + [(o.end_s, -1) for o in res.requests], key=lambda e: (e[0], e[1]))
    cur = most = 0
    for _, d in events:
        cur += d
        most = max(most, cur)
    assert most == 3  # the bound is reached (arrivals far outpace service) and never passed
    # the same from the measured trace: request spans overlap at most 3 deep
    spans = [(min(c.start_s for c in cs), max(c.end_s for c in cs))
             for cs in res.trace().requests.values()]
    for t, _ in spans:
        assert sum(1 for a, b in spans if a <= t < b) <= 3
    # waiting for a slot counts in the latency (measured from the scheduled arrival)
    assert res.workflows["rag"].wait_mean_s > 0
    for o in res.requests:
        assert o.latency_s == pytest.approx(o.end_s - o.arrival_s)
        assert o.latency_s >= o.end_s - o.admitted_s


# ------------------------------------------------------------------------- the plan


def test_plan_is_deterministic_and_uses_the_trace_generator():
    specs = (rag(), beam(), coder())
    routes = routes_for(specs, "http://127.0.0.1:9/v1")
    a = plan_drive(specs, routes, rate=3.0, requests=60, seed=11)
    b = plan_drive(specs, routes, rate=3.0, requests=60, seed=11)
    c = plan_drive(specs, routes, rate=3.0, requests=60, seed=12)
    assert a == b and a != c
    assert all(np.array_equal(a.prefixes[k], b.prefixes[k]) for k in a.prefixes)
    # workflow i's requests are generate_trace(spec, n_i, seed + i), as `scepsy trace generate`
    for i, spec in enumerate(specs):
        mine = [r for r in a.requests if r.workflow == spec.name]
        gen = generate_trace(spec, len(mine), 11 + i)
        assert [c for r in mine for c in r.calls] == list(gen)
        assert [r.request_id for r in mine] == [f"r{j}" for j in range(len(mine))]
    arrivals = [r.arrival_s for r in a.requests]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)


@settings(max_examples=25, deadline=None)
@given(rate=st.floats(0.05, 500.0), seed=st.integers(0, 2**32 - 1))
def test_poisson_arrivals_have_exponential_gaps(rate, seed):
    n = 20_000
    t = poisson_arrivals(rate, n, np.random.default_rng(seed))
    gaps = np.diff(t)
    assert t[0] == 0.0 and np.all(gaps >= 0)
    # mean gap 1/rate: standard error (1/rate)/sqrt(n-1); 5 standard errors
    assert abs(gaps.mean() * rate - 1.0) < 5.0 / math.sqrt(n - 1)
    # exponential: the coefficient of variation is 1 (its standard error is about 1/sqrt(n))
    assert abs(gaps.std() / gaps.mean() - 1.0) < 6.0 / math.sqrt(n)


def test_plan_mix_and_arrival_rate_without_http():
    specs = (rag("a", k=1), rag("b", k=1))
    routes = routes_for(specs, "http://127.0.0.1:9/v1")
    n = 8000
    plan = plan_drive(specs, routes, rate=7.0, requests=n, seed=2, mix={"a": 1.0, "b": 3.0})
    counts = Counter(r.workflow for r in plan.requests)
    p = 0.25
    assert abs(counts["a"] - n * p) < 5 * math.sqrt(n * p * (1 - p))
    gaps = np.diff([r.arrival_s for r in plan.requests])
    assert abs(gaps.mean() * 7.0 - 1.0) < 5.0 / math.sqrt(n - 1)
    # each workflow's own arrivals are Poisson at rate · p
    a = np.diff([r.arrival_s for r in plan.requests if r.workflow == "a"])
    assert abs(a.mean() * 7.0 * p - 1.0) < 5.0 / math.sqrt(len(a))


def test_endpoint_choice_follows_the_weights():
    spec = rag(k=10)
    w = (0.2, 0.3, 0.5)
    eps = tuple(Endpoint(f"http://10.0.0.{i}:8000/v1", "reranker", x, i) for i, x in enumerate(w))
    one = (Endpoint("http://10.0.0.9:8000/v1", "x", 1.0, 0),)
    routes = Routes({"rag": {"reranker": eps, "rewriter": one, "generator": one}})
    plan = plan_drive([spec], routes, rate=1.0, requests=2000, seed=4)
    chosen = Counter(e.replica for r in plan.requests for c, e in zip(r.calls, r.endpoints, strict=True)
                     if c.llm == "reranker")
    n = sum(chosen.values())
    assert n == 20_000
    for i, x in enumerate(w):
        assert abs(chosen[i] - n * x) < 5 * math.sqrt(n * x * (1 - x))
    # tool calls have no endpoint, every LLM call has one of its LLM's
    for r in plan.requests:
        for c, e in zip(r.calls, r.endpoints, strict=True):
            assert (e is None) == (c.llm is None)


def test_bad_arguments_are_input_errors():
    spec = rag()
    routes = routes_for([spec], "http://127.0.0.1:9/v1")
    for kw in ({"rate": 0.0}, {"rate": math.inf}, {"requests": 0}, {"requests": 1.5},
               {"seed": -1}, {"mix": {"nope": 1.0}}, {"mix": {"rag": 0.0}}):
        args = {"rate": 1.0, "requests": 2, **kw}
        with pytest.raises(InputError):
            plan_drive([spec], routes, **args)
    with pytest.raises(InputError, match="route for every LLM"):
        plan_drive([spec], Routes({"rag": {"rewriter": routes.endpoints("rag", "rewriter")}}),
                   rate=1.0, requests=2)
    with pytest.raises(InputError):
        drive([spec], routes, rate=1.0, requests=1, max_in_flight=0)
    with pytest.raises(InputError):
        drive([spec], routes, rate=1.0, requests=1, deadline_s=-1.0)
    plan = plan_drive([spec], routes, rate=1.0, requests=1)
    with pytest.raises(InputError, match="plan alone"):
        drive(plan, routes, rate=2.0)
    with pytest.raises(InputError, match="vocab"):
        plan_drive([spec], routes, rate=1.0, requests=1, vocab=3)


# ------------------------------------------------------------------------- failures


@pytest.mark.parametrize(("mode", "kind"), [
    ("http500", "http_5xx"), ("http400", "http_4xx"), ("malformed", "malformed"),
    ("not_sse", "malformed"), ("short", "short_stream"), ("truncate", "short_stream"),
    ("stall", "timeout"), ("hang", "timeout")])
def test_failure_kinds_fail_the_request_and_stop_its_calls(fake, mode, kind):
    """The reranker fails: rewriter and retrieval ran, the generator is never sent."""
    spec = rag()
    before = len(fake.requests)
    t = time.perf_counter()
    res = drive([spec], routes_for([spec], fake.base_url + "/v1",
                                   lambda w, m: mode if m == "reranker" else f"{w}.{m}"),
                rate=50.0, requests=4, seed=1, max_in_flight=4, timeouts=FAST)
    wall = time.perf_counter() - t
    _accounted(res)
    assert (res.sent, res.failed, res.completed) == (4, 4, 0)
    assert dict(res.failures) == {kind: 4}
    assert res.call_failures[kind] >= 4
    assert res.calls == ()
    sent = [b["model"] for b in fake.requests[before:]]
    assert "rag.generator" not in sent and sent.count("rag.rewriter") == 4
    for o in res.requests:
        assert o.failure == kind and o.detail
        assert o.calls_skipped >= 1  # the generator at least
        assert o.calls_ok == 2  # rewriter, retrieval
    # bounded: timeouts fire at stall_s, everything else fails at once
    assert wall < 5.0
    assert res.llms["reranker"].failed >= 4 and res.llms["reranker"].failures[kind] >= 4


def test_connection_refused_is_counted(fake):
    spec = coder()
    port = _free_port()
    res = drive([spec], routes_for([spec], f"http://127.0.0.1:{port}/v1"), rate=100.0,
                requests=5, seed=0, timeouts=FAST)
    _accounted(res)
    assert dict(res.failures) == {"connection": 5}
    # the planner's call failed; the 6 later calls (2 rounds of code, tests, review) never ran
    assert all((o.calls_sent, o.calls_failed, o.calls_skipped) == (1, 1, 6)
               for o in res.requests)


def test_partial_failures_are_accounted_by_the_plan(fake):
    """Half the reranker traffic goes to a failing endpoint: exactly the requests with a call
    routed there fail, the others complete."""
    spec = rag(k=2)
    url = fake.base_url + "/v1"
    bad = Endpoint(url, "http500", 0.5, 1)
    routes = Routes({"rag": {"reranker": (Endpoint(url, "rag.reranker", 0.5, 0), bad),
                             "rewriter": (Endpoint(url, "rag.rewriter", 1.0, 0),),
                             "generator": (Endpoint(url, "rag.generator", 1.0, 0),)}})
    plan = plan_drive([spec], routes, rate=100.0, requests=24, seed=9)
    doomed = {r.request_id for r in plan.requests if bad in r.endpoints}
    assert 0 < len(doomed) < 24
    res = drive(plan, max_in_flight=8, timeouts=PATIENT)
    _accounted(res)
    assert res.failed == len(doomed) and dict(res.failures) == {"http_5xx": len(doomed)}
    assert {o.request_id for o in res.requests if not o.ok} == doomed
    assert {rid for (_, rid) in res.trace().requests} == {
        r.request_id for r in plan.requests} - doomed


def test_a_client_exception_is_an_error_failure(fake, monkeypatch):
    """An exception the replay client does not turn into a failure kind fails the call as
    'error', with its text; the run goes on."""
    import scepsy_serve.launch.drive as drive_mod

    real = drive_mod.replay_call

    async def flaky(client, url, call, model, timeouts, send_s, headers=None):
        if model.endswith("generator"):
            raise RuntimeError("boom")
        return await real(client, url, call, model, timeouts, send_s, headers)

    monkeypatch.setattr(drive_mod, "replay_call", flaky)
    spec = rag(k=2)
    res = drive([spec], routes_for([spec], fake.base_url + "/v1"), rate=100.0, requests=3,
                timeouts=FAST)
    _accounted(res)
    assert dict(res.failures) == {"error": 3}
    assert all("RuntimeError: boom" in o.detail for o in res.requests)


def test_deadline_ends_a_hanging_run(fake):
    """Calls that hang longer than the deadline: the run ends at the deadline, requests in
    flight fail as 'deadline', later arrivals are not sent; nothing hangs."""
    spec = coder()
    slow = ReplayTimeouts(connect_s=1.0, stall_s=30.0, call_s=60.0)
    t = time.perf_counter()
    res = drive([spec], routes_for([spec], fake.base_url + "/v1", lambda w, m: "hang"),
                rate=4.0, requests=40, seed=0, max_in_flight=2, timeouts=slow, deadline_s=0.6)
    wall = time.perf_counter() - t
    _accounted(res)
    assert wall < 4.0
    assert res.deadline_hit and res.completed == 0
    assert res.sent == 2 and dict(res.failures) == {"deadline": 2}
    assert res.not_sent == 38
    assert all(o.calls_cancelled == 1 for o in res.requests if o.sent)


def test_cancelling_a_drive_ends_every_call(fake):
    """An interrupted drive (Ctrl-C cancels the task) ends at once: the hanging calls are
    cancelled and the client is closed, nothing is left waiting."""
    spec = coder()
    slow = ReplayTimeouts(connect_s=1.0, stall_s=30.0, call_s=60.0)

    async def main() -> float:
        task = asyncio.create_task(drive_async(
            [spec], routes_for([spec], fake.base_url + "/v1", lambda w, m: "hang"),
            rate=50.0, requests=10, max_in_flight=4, timeouts=slow))
        await asyncio.sleep(0.3)
        t = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not [x for x in asyncio.all_tasks() if x is not asyncio.current_task()]
        return time.perf_counter() - t

    assert asyncio.run(main()) < 2.0


def test_an_interrupted_drive_keeps_what_it_measured(fake):
    """Cancelled mid-run (what Ctrl-C does), the drive's progress holds a result of what was
    measured until then: requests completed, those in flight failed as 'interrupted', the
    rest not sent; every request accounted for."""
    spec = coder()
    progress = DriveProgress()

    async def main() -> None:
        task = asyncio.create_task(drive_async(
            [spec], routes_for([spec], fake.base_url + "/v1"), rate=20.0, requests=400,
            seed=0, timeouts=FAST, progress=progress))
        while progress.completed < 3:
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    res = progress.result
    assert res is not None and res.interrupted and not res.deadline_hit
    _accounted(res)
    assert res.completed >= 3 and res.not_sent > 0
    assert set(res.failures) <= {"interrupted"}
    assert (progress.sent, progress.completed, progress.failed) == (res.sent, res.completed,
                                                                    res.failed)
    assert res.to_dict()["interrupted"] is True
    assert "sent " in progress.line() and f"/{res.planned}" in progress.line()


# ------------------------------------------------------------------------- statistics


def test_latency_summary_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 19, 20, 333):
        x = rng.lognormal(0.0, 0.5, n)
        s = summarize_latency(x)
        assert s.n == n and s.mean_s == pytest.approx(x.mean(), rel=1e-12)
        assert (s.p50_s, s.p90_s, s.p99_s) == pytest.approx(tuple(np.percentile(x, [50, 90, 99])))
        if n == 1:
            assert s.std_s is None and s.ci95_s is None
        else:
            assert s.std_s == pytest.approx(x.std(ddof=1), rel=1e-12) and s.ci95_s > 0
    assert summarize_latency([]).n == 0 and summarize_latency([]).mean_s is None


@pytest.mark.parametrize("n", [10, 2 * BATCHES * 5])
def test_latency_ci_covers_the_mean_95_percent_of_the_time(n):
    """Independent samples of known mean: the 95% interval (t below 2·BATCHES values, batch
    means above) holds the mean in about 95% of 2000 runs (binomial 5σ ≈ ±2.4%)."""
    rng = np.random.default_rng(1)
    hits = 0
    runs = 2000
    for _ in range(runs):
        x = rng.normal(3.0, 1.0, n)
        s = summarize_latency(x)
        hits += abs(s.mean_s - 3.0) <= s.ci95_s
    assert abs(hits / runs - 0.95) < 5 * math.sqrt(0.95 * 0.05 / runs)


# ------------------------------------------------------------------------- the trace file


def test_measured_trace_is_read_by_traces_and_stats(normal_run, tmp_path):
    specs, plan, res, _ = normal_run
    path = tmp_path / "measured.jsonl"
    n = write_drive_trace(str(path), res)
    trace = read_trace(path)
    assert n == len(trace.calls) == sum(len(r.calls) for r in plan.requests)
    assert trace.workflows() == sorted(s.name for s in specs)
    stats = trace_stats(trace, seed=0)
    rag_stats = stats["rag"]
    assert rag_stats.requests == res.workflows["rag"].completed
    assert rag_stats.llms["reranker"].n == pytest.approx(RERANK_K)
    assert rag_stats.llms["reranker"].p > 1.0  # concurrency seen in the measured times
    assert stats["beam"].llms["generator"].n == pytest.approx(2 * 3)


def test_no_trace_without_a_completed_request(fake, tmp_path):
    spec = coder()
    res = drive([spec], routes_for([spec], fake.base_url + "/v1", lambda w, m: "http500"),
                rate=100.0, requests=2, timeouts=FAST)
    with pytest.raises(InputError, match="completed request"):
        write_drive_trace(str(tmp_path / "t.jsonl"), res)


# ------------------------------------------------------------------------- command line


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scepsy")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_drive_prints_tables_and_writes_trace_and_json(fake, tmp_path, capsys):
    wf = tmp_path / "w.yaml"
    wf.write_text(
        "name: agent\nprogram: coding_agent\n"
        "llms: {coder: qwen2.5-7b, reviewer: qwen2.5-1.5b}\n"
        "tools: {tests: 0.002}\n"
        "params: {task_tokens: 20, planner_prompt_tokens: 8, plan_tokens: 4, rounds: 2,\n"
        "  coder_prompt_tokens: 8, code_tokens: 6, test_log_tokens: 4,\n"
        "  reviewer_prompt_tokens: 8, review_tokens: 3}\n")
    routes = tmp_path / "routes.json"
    routes.write_text(routes_for([coder()], fake.base_url + "/v1").dumps())
    trace, out = tmp_path / "measured.jsonl", tmp_path / "drive.json"
    rc = _cli(["drive", "--workflow", str(wf), "--routes", str(routes), "--rate", "50",
               "--requests", "6", "--seed", "2", "--max-in-flight", "3", "--timeout", "5",
               "--stall-timeout", "1", "--trace-out", str(trace), "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "agent" in text and "ci95_s" in text and "coder" in text and "reviewer" in text
    assert "6 completed, 0 failed" in text
    doc = json.loads(out.read_text())
    assert doc["completed"] == 6 and doc["workflows"]["agent"]["latency"]["n"] == 6
    assert len(read_trace(trace).requests) == 6
    # failures: exit 1, a failure table
    bad = tmp_path / "bad.json"
    bad.write_text(routes_for([coder()], fake.base_url + "/v1", lambda w, m: "http500").dumps())
    rc = _cli(["drive", "--workflow", str(wf), "--routes", str(bad), "--rate", "50",
               "--requests", "2", "--timeout", "5", "--stall-timeout", "1"])
    text = capsys.readouterr().out
    assert rc == 1 and "http_5xx" in text and "0 completed, 2 failed" in text


def test_cli_drive_bad_input(tmp_path):
    wf = tmp_path / "w.yaml"
    wf.write_text("name: agent\nprogram: nope\nllms: {coder: qwen2.5-7b}\n")
    routes = tmp_path / "routes.json"
    routes.write_text(routes_for([coder()], "http://127.0.0.1:9/v1").dumps())
    base = ["drive", "--routes", str(routes), "--rate", "1", "--requests", "1"]
    with pytest.raises(InputError, match="program"):
        _cli([*base, "--workflow", str(wf)])
    other = tmp_path / "rag.yaml"
    other.write_text("name: rag\nprogram: rag\nllms: {rewriter: qwen2.5-1.5b, "
                     "reranker: bge-reranker-large, generator: qwen2.5-7b}\n"
                     "tools: {retrieval: 0.01}\nparams: {query_tokens: 4, "
                     "rewrite_prompt_tokens: 4, rewritten_tokens: 4, rerank_k: 2, "
                     "doc_tokens: 4, top_n: 1, answer_prompt_tokens: 4, answer_tokens: 4}\n")
    with pytest.raises(InputError, match=r"routes\.json: workflows\.rag"):
        _cli([*base, "--workflow", str(other)])  # no route for the workflow
    garbled = tmp_path / "garbled.json"
    garbled.write_text('{"version": 7}')
    with pytest.raises(InputError, match="version"):
        _cli(["drive", "--routes", str(garbled), "--rate", "1", "--requests", "1",
              "--workflow", str(other)])
    with pytest.raises(UsageError, match="--trace-out"):
        _cli([*base, "--workflow", str(other), "--trace-out", str(tmp_path)])
    with pytest.raises(SystemExit):
        _cli([*base, "--workflow", str(other), "--rate", "-1"])
