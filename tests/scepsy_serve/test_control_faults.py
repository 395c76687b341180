"""The controller under faults (scepsy_serve.control.faults, docs/control.md "Faults"): hypothesis
over fault timelines against a brute-force reading of the rules (a replica down, telemetry lost
or frozen, the gateway restarted): every fault is noticed within two windows of its onset,
reported once per episode, and a window without fresh telemetry is always held; the gateway's
state parsed; a replacement that never becomes healthy is a ``start_hung``, stopped; one that
does is routed."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.control_gateway import FakeGateway
from fakes.launch_plans import cpu_plan
from scepsy_serve.control.faults import (
    EndpointView,
    FaultState,
    GatewayView,
    detect,
    start_deadline,
    start_hung,
)
from scepsy_serve.control.live import replace_replica

W = 10.0  # window (s)
URLS = ("http://a:1/v1", "http://b:2/v1", "http://c:3/v1")


def view(down: set[str] = frozenset(), *, version: int = 1, requests: int = 0, calls: int = 0,
         in_flight: int = 0, urls: tuple[str, ...] = URLS) -> GatewayView:
    return GatewayView(version, {u: EndpointView(u, "gen", u not in down, False,
                                                 in_flight if i == 0 else 0, calls)
                                 for i, u in enumerate(urls)}, requests, calls)


def run(views: list[GatewayView | None], first: GatewayView | None = None,
        **kw: Any) -> list[Any]:
    state, out = FaultState(last=first or view()), []
    for i, v in enumerate(views):
        verdict = detect(state, (i + 1) * W, v, **kw)
        state = verdict.state
        out.append(verdict)
    return out


# -- replica_down --------------------------------------------------------------------------------

@given(st.lists(st.frozensets(st.sampled_from(URLS)), min_size=1, max_size=30))
@settings(max_examples=200, deadline=None)
def test_replica_down_after_two_window_ends_once_per_episode(downs):
    """Oracle: a URL is declared at end i iff it is down at i and at i-1 and it was not
    already declared in this run of downs."""
    verdicts = run([view(set(d), requests=i, calls=i) for i, d in enumerate(downs)])
    for u in URLS:
        run_len = 0
        for i, (d, v) in enumerate(zip(downs, verdicts, strict=True)):
            run_len = run_len + 1 if u in d else 0
            declared = [f for f in v.faults if f.kind == "replica_down" and f.subject == u]
            assert len(declared) == (1 if run_len == 2 else 0), (u, i, downs)
            assert (u in v.replace) == bool(declared)
            if declared:
                assert declared[0].since_s == pytest.approx((i + 1 - run_len + 1) * W)
                assert declared[0].response == "replace" and declared[0].llm == "gen"
        assert not any(v.hold for v in verdicts)  # fresh telemetry: never held


@given(st.floats(0, 20 * W, allow_nan=False), st.integers(0, 2))
@settings(max_examples=200, deadline=None)
def test_a_replica_dying_at_any_time_is_noticed_within_two_windows(t, k):
    ends = [(i + 1) * W for i in range(25)]
    verdicts = run([view({URLS[k]} if e >= t else set(), requests=i, calls=i)
                    for i, e in enumerate(ends)])
    at = [e for e, v in zip(ends, verdicts, strict=True)
          for f in v.faults if f.kind == "replica_down"]
    assert len(at) == 1 and 0 <= at[0] - t <= 2 * W + 1e-9


def test_a_starting_replica_is_not_down_and_is_hung_after_its_deadline():
    dl = start_deadline(startup_s=12.0, window_s=W)
    assert dl == 24.0 and start_deadline(0.0, W) == W
    state = FaultState(last=view())
    seen = []
    for i in range(6):
        at = (i + 1) * W
        v = detect(state, at, view({URLS[2]}, requests=i), starting={URLS[2]: 5.0}, deadline_s=dl)
        state = v.state
        seen.append((at, v))
        assert not any(f.kind == "replica_down" for f in v.faults)
    hung = [(at, f) for at, v in seen for f in v.faults if f.kind == "start_hung"]
    assert [at for at, _ in hung] == [30.0]  # first end >= 5 + 24, reported once
    assert hung[0][1].response == "kill" and seen[2][1].kill == (URLS[2],)


@given(st.floats(0, 100), st.floats(0, 100), st.booleans(), st.floats(0.1, 50))
def test_start_hung_is_unhealthy_past_the_deadline(t0, dt, healthy, dl):
    assert start_hung(t0, t0 + dt, healthy, dl) == (not healthy and t0 + dt - t0 >= dl)


# -- telemetry_stale -----------------------------------------------------------------------------

READS = st.sampled_from(["ok", "none", "frozen", "idle"])


def timeline(kinds: list[str]) -> list[GatewayView | None]:
    """ok: counters move; none: no answer; frozen: the previous read again, calls in flight;
    idle: nothing in flight and nothing moves (fresh)."""
    out: list[GatewayView | None] = []
    n, prev = 0, view()
    for k in kinds:
        if k == "ok":
            n += 1
            prev = view(requests=n, calls=n, in_flight=1)
            out.append(prev)
        elif k == "none":
            out.append(None)
        elif k == "frozen":
            prev = view(requests=n, calls=n, in_flight=1)
            out.append(prev)  # equal to the last read that answered (or a first one with calls)
        else:
            prev = view(requests=n, calls=n, in_flight=0)
            out.append(prev)
    return out


@given(st.lists(READS, min_size=1, max_size=40))
@settings(max_examples=300, deadline=None)
def test_every_window_without_fresh_telemetry_is_held_and_stale_declared_at_the_second(kinds):
    views = timeline(kinds)
    verdicts = run(views)
    last: GatewayView | None = view()
    stale_run = 0
    for i, (v, verdict) in enumerate(zip(views, verdicts, strict=True)):
        fresh = v is not None and not (last is not None and v.frozen_since(last))
        if v is not None:
            last = v
        stale_run = 0 if fresh else stale_run + 1
        assert verdict.hold == (not fresh), (i, kinds)  # never a decision on missing data
        assert not verdict.replace  # nothing is replaced on a held window (nor here at all)
        stale = [f for f in verdict.faults if f.kind == "telemetry_stale"]
        assert len(stale) == (1 if stale_run == 2 else 0), (i, kinds)
        if stale:
            assert stale[0].response == "hold"
            assert stale[0].since_s == pytest.approx((i + 1 - 2 + 1) * W)


@given(st.floats(0, 20 * W, allow_nan=False), st.booleans())
@settings(max_examples=200, deadline=None)
def test_telemetry_stopping_at_any_time_is_noticed_within_two_windows(t, unreachable):
    ends = [(i + 1) * W for i in range(25)]
    views: list[GatewayView | None] = []
    n = 0
    for e in ends:
        if e < t:
            n += 1
        views.append(None if unreachable and e >= t else view(requests=n, calls=n, in_flight=2))
    verdicts = run(views, view(in_flight=2))  # the read before: calls in flight already
    at = [e for e, v in zip(ends, verdicts, strict=True)
          for f in v.faults if f.kind == "telemetry_stale"]
    assert len(at) == 1 and 0 <= at[0] - t <= 2 * W + 1e-9
    assert all(v.hold for e, v in zip(ends, verdicts, strict=True) if e >= t + W)


def test_a_replica_down_under_stale_telemetry_waits_for_fresh_reads():
    verdicts = run([view({URLS[0]}, requests=1, calls=1), None, None,
                    view({URLS[0]}, requests=2, calls=2)])
    kinds = [[f.kind for f in v.faults] for v in verdicts]
    assert kinds == [[], [], ["telemetry_stale"], ["replica_down"]]


# -- gateway_restarted ---------------------------------------------------------------------------

@given(st.integers(1, 15), st.integers(0, 30), st.lists(st.integers(0, 5), min_size=20,
                                                         max_size=20))
@settings(max_examples=200, deadline=None)
def test_a_restart_is_resynced_at_once_without_a_spurious_fault(at, after, steps):
    """Counters grow by ``steps``; at window ``at`` a new gateway counts from ``after`` (below
    what the old one had counted); a replica down across the restart is counted afresh."""
    views, total = [], 0
    for i, s in enumerate(steps):
        total += s
        if i == at:
            total = min(after, total - 1) if total > 0 else -1
        if total < 0:  # the old gateway had counted nothing: no counter can say it restarted
            return
        views.append(view({URLS[1]} if i in (at - 1, at) else set(), version=1 + (i < at),
                          requests=total, calls=total))
    verdicts = run(views)
    for i, v in enumerate(verdicts):
        restarted = [f for f in v.faults if f.kind == "gateway_restarted"]
        assert bool(restarted) == (i == at) == v.resync, (i, at, steps)
        assert v.hold == (i == at)
        assert not any(f.kind in ("telemetry_stale", "replica_down") for f in v.faults)
        if restarted:
            assert restarted[0].response == "resync" and "went down" in restarted[0].reason


@given(st.integers(1, 15), st.lists(st.integers(0, 5), min_size=20, max_size=20))
@settings(max_examples=100, deadline=None)
def test_a_gateway_that_names_its_instance_is_seen_restarting_even_before_it_counted(at, steps):
    """A new ``instance`` id is a restart whatever the counters say, a restart before the old
    gateway counted anything included (counters never go down there); the same id with
    counters that go down is no restart."""
    views, total = [], 0
    for i, s in enumerate(steps):
        total += s
        views.append(replace(view(requests=total, calls=total),
                             instance="new" if i >= at else "old"))
    verdicts = run(views)
    for i, v in enumerate(verdicts):
        restarted = [f for f in v.faults if f.kind == "gateway_restarted"]
        assert bool(restarted) == (i == at) == v.resync, (i, at)
        if restarted:
            assert "instance changed" in restarted[0].reason
    same = [replace(view(requests=n, calls=n), instance="one") for n in (5, 9, 2, 4)]
    assert not any(f.kind == "gateway_restarted" for v in run(same) for f in v.faults)
    doc = {"instance": "abc", "version": 1, "endpoints": [], "workflows": {}}
    assert GatewayView.from_state(doc).instance == "abc"
    assert GatewayView.from_state({**doc, "instance": 7}).instance is None


# -- the gateway's state -------------------------------------------------------------------------

def test_state_rows_of_one_url_are_one_endpoint_and_bad_states_are_refused():
    doc = {"version": 3, "workflows": {"a": {"requests": 5, "calls": 9},
                                       "b": {"requests": 1, "calls": 2}},
           "endpoints": [
               {"url": "http://x:1/v1/", "llm": "gen", "healthy": True, "ejected": False,
                "in_flight": 2, "calls": 7},
               {"url": "http://x:1/v1", "llm": "gen", "healthy": True, "ejected": True,
                "in_flight": 2, "calls": 7},
               {"url": "http://y:1/v1", "llm": "gen", "healthy": False, "ejected": False}]}
    v = GatewayView.from_state(doc)
    assert (v.version, v.requests, v.calls, v.in_flight()) == (3, 6, 11, 2)
    assert set(v.endpoints) == {"http://x:1/v1", "http://y:1/v1"}
    assert v.endpoints["http://x:1/v1"].down and v.endpoints["http://x:1/v1"].ejected
    assert v.endpoints["http://y:1/v1"].down and not v.endpoints["http://y:1/v1"].healthy
    for bad in ([], {"endpoints": []}, {"version": "1", "endpoints": []},
                {"version": 1, "endpoints": [{"llm": "gen"}]}, {"version": 1}):
        with pytest.raises(ValueError):
            GatewayView.from_state(bad)


# -- replacing a replica -------------------------------------------------------------------------

class Target:
    name = "fake"

    def __init__(self, healthy_after: float) -> None:
        self.healthy_after, self.events, self.t = healthy_after, [], 0.0

    def start(self, plan, r) -> None:
        self.events.append(("start", r.port))

    def healthy(self, plan, r) -> bool:
        self.t += 1.0
        return self.t >= self.healthy_after

    def url(self, plan, r) -> str:
        return f"http://127.0.0.1:{r.port}/v1"

    def stop(self, plan, r) -> None:
        self.events.append(("stop", r.port))


def test_a_replica_that_answers_the_target_is_left_running():
    plan = cpu_plan()
    target, rows = Target(0.0), []
    got = replace_replica(plan, target, plan.replicas[0], "http://127.0.0.1:1", log=rows.append,
                          deadline_s=5.0, poll_s=0.0, clock=lambda: target.t)
    assert got == "alive" and target.events == [] and rows[0]["step"] == "alive"


@pytest.mark.parametrize("healthy_after, ok", [(3.0, True), (math.inf, False)])
def test_a_replacement_is_routed_once_healthy_or_stopped_as_hung(healthy_after, ok):
    plan = cpu_plan()
    r = plan.replicas[0]
    target, rows = Target(healthy_after), []
    with FakeGateway() as gw:
        got = replace_replica(plan, target, r, gw.base_url, log=rows.append, deadline_s=5.0,
                              poll_s=0.0, clock=lambda: target.t)
        routes = gw.routes
    assert got == ("replaced" if ok else "hung")
    assert target.events[:2] == [("stop", r.port), ("start", r.port)]  # its leftovers first
    hung = [x for x in rows if x.get("fault") == "start_hung"]
    if ok:
        assert not hung and routes is not None and rows[-1] == {"kind": "routes", "ok": True}
        urls = {e["url"] for llms in routes["workflows"].values() for eps in llms.values()
                for e in eps}
        assert target.url(plan, r) in urls
    else:
        assert len(hung) == 1 and hung[0]["response"] == "kill" and routes is None
        assert target.events[-1] == ("stop", r.port) and target.t >= 5.0


# -- the live loop over a scripted gateway (httpx.MockTransport) ---------------------------------

def test_the_loop_resyncs_after_a_gateway_restart_without_a_spurious_reading():
    """A scripted gateway whose request counter rises by one per read; after 12 reads a new
    gateway process counts from 0 again (table version 1 below 2). The loop logs
    ``gateway_restarted`` once, holds that window, and every window it judges sees the same
    rate: none is computed across the restart (which would read as a fall, a spurious
    scale-down signal)."""
    import asyncio

    import httpx

    from scepsy_serve.control.core import ControlConfig
    from scepsy_serve.control.live import control_loop

    reads = {"n": 0}

    def counters() -> tuple[int, int]:
        n = reads["n"]
        return (n, 2) if n < 12 else (n - 12, 1)  # requests, table version

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics" and request.url.port == 9:
            reads["n"] += 1
            n, _ = counters()
            return httpx.Response(200, text="# TYPE scepsy_gateway_requests_total counter\n"
                                  f'scepsy_gateway_requests_total{{workflow="rag"}} {n}\n')
        if request.url.path == "/scepsy/state":
            n, version = counters()
            return httpx.Response(200, json={"version": version, "endpoints": [],
                                             "workflows": {"rag": {"requests": n, "calls": n}}})
        return httpx.Response(404)

    decisions: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []

    class Ctl:  # stands in for the Controller: records the windows it is asked to judge
        config = ControlConfig(window_s=0.25, startup_s=0.0)
        problem = type("P", (), {"targets": {"rag": 1.0}})()

        def observe(self, w):
            from scepsy_serve.control.core import Decision

            decisions.append(dict(w.workflow_rates))
            return Decision(w.end_s, "keep", "scripted", w.workflow_rates, {}, {})

    async def main() -> Any:
        stop = asyncio.Event()

        def faulted(f) -> None:
            asyncio.get_running_loop().call_later(0.8, stop.set)

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await control_loop(Ctl(), cpu_plan(), None, "http://gw:9", window_s=0.25,
                                      log=rows.append, stop=stop, client=http,
                                      on_fault=faulted)

    res = asyncio.run(asyncio.wait_for(main(), 30))
    faults = [r for r in rows if r["kind"] == "fault"]
    assert [r["fault"] for r in faults] == ["gateway_restarted"], rows
    assert "went down" in faults[0]["reason"] and faults[0]["response"] == "resync"
    holds = [r for r in rows if r["kind"] == "hold"]
    assert len(holds) == 1 and "restarted" in holds[0]["reason"] and res.held == 1
    rates = [d["rag"] for d in decisions]
    assert len(rates) >= 4 and max(rates) < 1.1 * min(rates), rates  # none across the restart
