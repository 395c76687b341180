"""The routing gateway (``scepsy gateway``, :mod:`scepsy_serve.gateway`) in
front of real aiohttp fake upstreams on loopback: weights, least-loaded choice, draining with
weight 0, live reloads (PUT, file change, SIGHUP) without losing a call, LAS priorities, the
admin API and the Prometheus metrics; one test in front of a real ``vllm serve`` (marker
``vllm``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, run_cli
from fakes.dropping_upstream import DroppingUpstream
from fakes.loop_thread import LoopThreadServer
from scepsy_common.errors import InputError
from scepsy_opt.ingest.record import RecordConfig
from scepsy_opt.prediction.priority import las_level
from scepsy_opt.traces import read_trace
from scepsy_serve.gateway import (
    EJECT_S,
    Gateway,
    GatewayConfig,
    choose,
    choose_live,
    gateway_in_thread,
)
from scepsy_serve.launch.routes import parse_routes

PROMPT_TOKENS, COMPLETION_TOKENS = 3000, 1000


class Upstream(LoopThreadServer):
    """An OpenAI-compatible fake: answers every completion after ``delay_s`` with a fixed usage
    (a stream when asked); keeps the bodies it received."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    async def _serve(self) -> None:
        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            if request.method != "POST":
                return web.json_response({"data": [], "object": "list", "port": self.port})
            body = json.loads(await request.read())
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS}
            if body.get("stream"):
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if (body.get("stream_options") or {}).get("include_usage"):
                    await resp.write(b"data: " + json.dumps(
                        {"choices": [], "usage": usage}).encode() + b"\n\n")
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            return web.json_response({"object": "chat.completion", "port": self.port,
                                      "choices": [{"index": 0, "message": {
                                          "role": "assistant", "content": "ok"}}],
                                      "usage": usage})

        runner = web.ServerRunner(web.Server(handle, access_log=None))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()


def routes_doc(eps: list[tuple[Upstream, float]], llm: str = "gen", workflow: str = "rag",
               model: str | None = None) -> dict[str, Any]:
    return {"version": 1, "workflows": {workflow: {llm: [
        {"url": u.v1, "model": model or llm, "weight": w, "replica": i}
        for i, (u, w) in enumerate(eps)]}}}


def gateway(tmp_path: Path, doc: dict[str, Any], priority: str = "fcfs", retries: int = 1,
            **kw: Any) -> Any:
    cfg = GatewayConfig(record=RecordConfig(out=tmp_path / "trace.jsonl", routed=True,
                                            client_time=False, retries=retries),
                        routes=parse_routes(doc, "routes"), priority=priority,  # type: ignore[arg-type]
                        **kw)
    return gateway_in_thread(cfg)


def call_body(model: str = "gen", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            **extra}


async def _many(url: str, n: int, concurrency: int, request_of=lambda i: f"r{i}",
                during=None) -> list[int]:
    """``n`` calls with ``concurrency`` workers; their statuses."""
    statuses: list[int] = []
    todo = iter(range(n))
    async with aiohttp.ClientSession() as s:
        async def worker() -> None:
            for i in todo:
                async with s.post(url + "/v1/chat/completions", json=call_body(),
                                  headers={"X-Scepsy-Request": request_of(i),
                                           "X-Scepsy-Workflow": "rag"}) as r:
                    await r.read()
                    statuses.append(r.status)
        tasks = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
        if during is not None:
            await during(s)
        await asyncio.gather(*tasks)
    return statuses


def state(url: str) -> dict[str, Any]:
    return httpx.get(url + "/scepsy/state", timeout=10).json()


# ------------------------------------------------------------------------------ the chooser


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0]),
                          st.integers(0, 20), st.integers(0, 100)), min_size=1, max_size=8))
def test_choose_picks_the_argmin_and_never_a_weight_zero(rows):
    weights, in_flight, sent = zip(*rows, strict=True)
    i = choose(weights, in_flight, sent)
    live = [j for j, w in enumerate(weights) if w > 0]
    if not live:
        assert i is None
        return
    assert i in live
    key = [((in_flight[j] + 1) / weights[j], sent[j] / weights[j], j) for j in live]
    assert (in_flight[i] + 1) / weights[i] == min(k[0] for k in key)
    assert min(key)[2] == i


def test_choose_alternates_equal_weights_when_idle():
    sent = [0, 0]
    for _ in range(10):
        i = choose([0.5, 0.5], [0, 0], sent)
        assert i is not None
        sent[i] += 1
    assert sent == [5, 5]


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.integers(0, 5),
                          st.integers(0, 20), st.booleans(), st.booleans()),
                min_size=1, max_size=6))
def test_choose_live_prefers_untried_live_endpoints_by_tiers(rows):
    """Oracle: choose() over the first non-empty tier of (untried and live), (untried), (all)
    endpoints of weight > 0."""
    weights, in_flight, sent, tried, down = (list(c) for c in zip(*rows, strict=True))
    i = choose_live(weights, in_flight, sent, tried, down)
    tiers = [[j for j, w in enumerate(weights) if w > 0 and not tried[j] and not down[j]],
             [j for j, w in enumerate(weights) if w > 0 and not tried[j]],
             [j for j, w in enumerate(weights) if w > 0]]
    tier = next((t for t in tiers if t), None)
    if tier is None:
        assert i is None
        return
    assert i in tier
    masked = [w if j in tier else 0.0 for j, w in enumerate(weights)]
    assert i == choose(masked, in_flight, sent)


# ------------------------------------------------------------------------------ routing


class Dead:
    """An endpoint where nothing listens (a replica that died)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.v1 = f"http://127.0.0.1:{s.getsockname()[1]}/v1"


@pytest.mark.parametrize("dead_first", [True, False])
def test_a_dead_replica_is_ejected_and_its_calls_go_to_the_live_one(tmp_path, dead_first):
    dead = Dead()
    with Upstream() as live:
        eps = [(dead, 0.5), (live, 0.5)] if dead_first else [(live, 0.5), (dead, 0.5)]
        with gateway(tmp_path, routes_doc(eps), health=None) as url:  # type: ignore[arg-type]
            t0 = time.monotonic()
            statuses = asyncio.run(_many(url, 20, 1))
            elapsed = time.monotonic() - t0
            s = state(url)
    assert statuses == [200] * 20 and len(live.bodies) == 20
    rows = {e["url"]: e for e in s["endpoints"]}
    # one lost attempt ejects it for EJECT_S (passive only: no health checks here); then one
    # call tries it again
    assert 1 <= rows[dead.v1]["lost"] <= 2 + int(elapsed / EJECT_S)
    assert rows[dead.v1]["failed"] == 0 and rows[live.v1]["lost"] == 0
    if elapsed < EJECT_S / 2:  # read right after the calls: still ejected
        assert rows[dead.v1]["ejected"] is True
    assert s["workflows"] == {"rag": {"requests": 20, "calls": 20}}  # retries not counted
    calls = read_trace(tmp_path / "trace.jsonl").calls
    assert len(calls) == 20 and all(c.error is None for c in calls)


def test_without_retries_a_dead_replica_fails_its_calls(tmp_path):
    dead = Dead()
    with Upstream() as live, gateway(tmp_path, routes_doc([(dead, 0.5), (live, 0.5)]),  # type: ignore[list-item]
                                     retries=0, health=None) as url:
        statuses = asyncio.run(_many(url, 4, 1))
    assert statuses[0] == 502 and statuses[1:] == [200] * 3  # then ejected


def test_a_connection_closed_at_the_only_replica_is_tried_there_again(tmp_path):
    with DroppingUpstream() as up:
        doc = {"version": 1, "workflows": {"rag": {"gen": [
            {"url": up.base_url + "/v1", "model": "gen", "weight": 1.0, "replica": 0}]}}}
        with gateway(tmp_path, doc, health=None) as url:
            statuses = asyncio.run(_many(url, 5, 1))
            s = state(url)
    assert statuses == [200] * 5 and up.dropped == 4
    (row,) = s["endpoints"]
    assert (row["lost"], row["ejected"], row["calls"]) == (4, False, 9)


def test_lost_attempts_are_counted_in_the_metrics(tmp_path):
    dead = Dead()
    with Upstream() as live, gateway(tmp_path, routes_doc([(dead, 0.5), (live, 0.5)]),  # type: ignore[list-item]
                                     health=None) as url:
        assert asyncio.run(_many(url, 3, 1)) == [200] * 3
        text = httpx.get(url + "/metrics", timeout=10).text
    samples = {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
               for fam in text_string_to_metric_families(text) for smp in fam.samples}
    assert samples[("scepsy_gateway_lost_attempts_total",
                    (("llm", "gen"), ("url", dead.v1)))] == 1
    assert samples[("scepsy_gateway_calls_total",
                    (("llm", "gen"), ("status", "ok"), ("workflow", "rag")))] == 3


def test_weights_respected_under_concurrent_load(tmp_path):
    with Upstream(0.01) as a, Upstream(0.01) as b, \
            gateway(tmp_path, routes_doc([(a, 0.75), (b, 0.25)])) as url:
        statuses = asyncio.run(_many(url, 400, 8))
        s = state(url)
    assert statuses == [200] * 400
    share = len(a.bodies) / (len(a.bodies) + len(b.bodies))
    assert share == pytest.approx(0.75, abs=0.05), (len(a.bodies), len(b.bodies))
    assert {e["url"]: e["calls"] for e in s["endpoints"]} == {a.v1: len(a.bodies),
                                                               b.v1: len(b.bodies)}
    assert all(e["in_flight"] == 0 for e in s["endpoints"])
    assert s["workflows"] == {"rag": {"requests": 400, "calls": 400}}
    assert len(read_trace(tmp_path / "trace.jsonl").calls) == 400  # still recorded


def test_least_loaded_sends_calls_past_a_slow_endpoint(tmp_path):
    with Upstream(2.0) as slow, Upstream(0.0) as fast, \
            gateway(tmp_path, routes_doc([(slow, 0.5), (fast, 0.5)])) as url:
        async def run() -> None:
            async with aiohttp.ClientSession() as s:
                first = asyncio.ensure_future(s.post(url + "/v1/chat/completions",
                                                     json=call_body()))
                while not slow.bodies:  # the first call goes to the first endpoint (a tie)
                    await asyncio.sleep(0.01)
                mid = state(url)
                for _ in range(10):
                    async with s.post(url + "/v1/chat/completions", json=call_body()) as r:
                        assert r.status == 200
                (await first).release()
                assert {e["url"]: e["in_flight"] for e in mid["endpoints"]} == {
                    slow.v1: 1, fast.v1: 0}
        asyncio.run(run())
        after = state(url)
    assert (len(slow.bodies), len(fast.bodies)) == (1, 10)
    assert all(e["in_flight"] == 0 for e in after["endpoints"])


def test_weight_zero_gets_no_new_call(tmp_path):
    with Upstream(0.005) as a, Upstream(0.0) as b, \
            gateway(tmp_path, routes_doc([(a, 1.0), (b, 0.0)])) as url:
        statuses = asyncio.run(_many(url, 60, 6))
    assert statuses == [200] * 60
    assert (len(a.bodies), len(b.bodies)) == (60, 0)


def test_model_rewritten_only_when_the_endpoint_names_another(tmp_path):
    with Upstream() as a:
        with gateway(tmp_path, routes_doc([(a, 1.0)], model="served-gen")) as url:
            httpx.post(url + "/v1/chat/completions", json=call_body(user="x"), timeout=10)
        assert a.bodies[-1] == call_body("served-gen", user="x")
        (tmp_path / "b").mkdir()
        with gateway(tmp_path / "b", routes_doc([(a, 1.0)])) as url:
            raw = b'{"model":"gen",  "messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
            r = httpx.post(url + "/v1/chat/completions", content=raw, timeout=10,
                           headers={"Content-Type": "application/json"})
        assert r.status_code == 200
        # fcfs and the same model: the body reaches the server byte for byte, no priority
        assert a.headers[-1]["Content-Length"] == str(len(raw))
        assert "priority" not in a.bodies[-1]


def test_unknown_llm_is_answered_404_and_recorded_as_failed(tmp_path):
    with Upstream() as a, gateway(tmp_path, routes_doc([(a, 1.0)])) as url:
        r = httpx.post(url + "/v1/chat/completions", json=call_body("other"), timeout=10)
        models = httpx.get(url + "/v1/models", timeout=10)  # not recorded: to an endpoint
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    assert models.json()["port"] == a.port
    (rec,) = read_trace(tmp_path / "trace.jsonl").calls
    assert rec.error == "no_route"
    assert a.bodies == []


def test_fallback_without_workflow_header_uses_the_union_of_workflows(tmp_path):
    with Upstream() as a, Upstream() as b:
        doc = {"version": 1, "workflows": {
            "rag": {"gen": [{"url": a.v1, "model": "gen", "weight": 1.0}]},
            "chat": {"gen": [{"url": b.v1, "model": "gen", "weight": 1.0}]}}}
        with gateway(tmp_path, doc) as url, httpx.Client(base_url=url, timeout=10) as c:
            for _ in range(6):
                c.post("/v1/chat/completions", json=call_body())
            for _ in range(3):
                c.post("/v1/chat/completions", json=call_body(),
                       headers={"X-Scepsy-Workflow": "chat"})
    assert (len(a.bodies), len(b.bodies)) == (3, 6)  # 3 + 3 by the union, then 3 for chat


# ------------------------------------------------------------------------------ live reload


def test_live_put_during_concurrent_calls_loses_none(tmp_path):
    with Upstream(0.005) as a, Upstream(0.005) as b, \
            gateway(tmp_path, routes_doc([(a, 0.5), (b, 0.5)])) as url:
        docs = [routes_doc([(a, 1.0), (b, 0.0)]), routes_doc([(a, 0.0), (b, 1.0)])]
        versions = []

        async def flip(s: aiohttp.ClientSession) -> None:
            for k in range(10):
                await asyncio.sleep(0.05)
                async with s.put(url + "/scepsy/routes", json=docs[k % 2]) as r:
                    assert r.status == 200, await r.text()
                    versions.append((await r.json())["version"])

        statuses = asyncio.run(_many(url, 300, 12, during=flip))
        s = state(url)
    assert statuses == [200] * 300
    assert versions == list(range(2, 12)) and s["version"] == 11
    assert all(e["in_flight"] == 0 for e in s["endpoints"])
    assert sum(e["failed"] for e in s["endpoints"]) == 0
    assert len(a.bodies) + len(b.bodies) == 300
    # the last table (version 11) drains a: its weight is 0 there
    assert {e["url"]: e["weight"] for e in s["endpoints"]} == {a.v1: 0.0, b.v1: 1.0}


def test_bad_put_is_refused_and_the_old_table_kept(tmp_path):
    with Upstream() as a, Upstream() as b, \
            gateway(tmp_path, routes_doc([(a, 1.0)])) as url:
        bad = routes_doc([(a, 0.5), (b, 0.3)])
        r = httpx.put(url + "/scepsy/routes", json=bad, timeout=10)
        r2 = httpx.put(url + "/scepsy/routes", content=b"{not json", timeout=10)
        r3 = httpx.delete(url + "/scepsy/routes", timeout=10)
        ok = httpx.post(url + "/v1/chat/completions", json=call_body(), timeout=10)
        s = state(url)
    assert r.status_code == 400 and "workflows.rag.gen" in r.json()["error"]["message"]
    assert "weights that sum to 1" in r.json()["error"]["message"]
    assert r2.status_code == 400 and r3.status_code == 405
    assert ok.status_code == 200 and s["version"] == 1
    assert [e["url"] for e in s["endpoints"]] == [a.v1]


def _wait_version(url: str, version: int, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        s = state(url)
        if s["version"] == version or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def test_cli_reloads_the_routes_file_on_change_and_on_sighup(tmp_path):
    with Upstream() as a, Upstream() as b:
        routes = tmp_path / "routes.json"
        routes.write_text(json.dumps(routes_doc([(a, 0.75), (b, 0.25)])))
        proc = subprocess.Popen(
            [sys.executable, "-m", "scepsy.cli", "gateway", "--listen", "127.0.0.1:0",
             "--routes", str(routes), "--out", str(tmp_path / "t.jsonl"), "--duration", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONUNBUFFERED": "1"})
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            url = line.split("listening on ")[1].split(";")[0]
            assert state(url)["version"] == 1
            # a change of the file (new mtime): picked up by the poll
            routes.write_text(json.dumps(routes_doc([(a, 0.25), (b, 0.75)])))
            s = _wait_version(url, 2)
            assert {e["url"]: e["weight"] for e in s["endpoints"]} == {a.v1: 0.25, b.v1: 0.75}
            # the same size and mtime (the poll cannot see it): SIGHUP reads it
            st = routes.stat()
            routes.write_text(json.dumps(routes_doc([(a, 0.75), (b, 0.25)])))
            os.utime(routes, ns=(st.st_atime_ns, st.st_mtime_ns))
            assert routes.stat().st_size == st.st_size
            time.sleep(1.5)
            assert state(url)["version"] == 2
            proc.send_signal(signal.SIGHUP)
            s = _wait_version(url, 3)
            assert {e["url"]: e["weight"] for e in s["endpoints"]} == {a.v1: 0.75, b.v1: 0.25}
            # a bad file: refused with one line, the table kept
            routes.write_text(json.dumps(routes_doc([(a, 0.75)])))
            time.sleep(2.0)
            assert state(url)["version"] == 3
            assert httpx.post(url + "/v1/chat/completions", json=call_body(),
                              timeout=10).status_code == 200
        finally:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "routes refused, keeping version 3" in err and "workflows.rag.gen" in err
    assert "Traceback" not in err
    assert "recorded 1 calls" in out


# ------------------------------------------------------------------------------ priorities


def test_las_priorities_follow_the_tokens_of_finished_calls(tmp_path):
    per_call = PROMPT_TOKENS + COMPLETION_TOKENS
    with Upstream() as a, gateway(tmp_path, routes_doc([(a, 1.0)]), priority="las") as url, \
            httpx.Client(base_url=url, timeout=10) as c:
        for k in range(5):
            stream = k % 2 == 1  # streamed calls count their usage too
            c.post("/v1/chat/completions", json=call_body(stream=stream),
                   headers={"X-Scepsy-Request": "long"})
        c.post("/v1/chat/completions", json=call_body(), headers={"X-Scepsy-Request": "short"})
        c.post("/v1/chat/completions", json=call_body())  # unattributed: a request of its own
        gw: Gateway = url._proxy  # type: ignore[attr-defined]
        attained = gw.attained("agent", "long")
    got = [b["priority"] for b in a.bodies]
    assert got == [las_level(k * per_call) for k in range(5)] + [0, 0]
    assert got[:5] == [0, 1, 2, 2, 3]  # the oracle is not trivially 0
    assert attained == 5 * per_call


def test_las_state_is_forgotten_after_idle(tmp_path):
    with Upstream() as a, gateway(tmp_path, routes_doc([(a, 1.0)]), priority="las",
                                  request_idle_s=0.2, poll_s=0.05) as url, \
            httpx.Client(base_url=url, timeout=10) as c:
        gw: Gateway = url._proxy  # type: ignore[attr-defined]
        c.post("/v1/chat/completions", json=call_body(), headers={"X-Scepsy-Request": "r"})
        assert gw.attained("agent", "r") > 0
        time.sleep(0.3)
        time.sleep(0.2)  # the sweep runs every poll_s
        assert gw.attained("agent", "r") == 0
        c.post("/v1/chat/completions", json=call_body(), headers={"X-Scepsy-Request": "r"})
    assert [b["priority"] for b in a.bodies] == [0, 0]


def test_fcfs_leaves_the_body_untouched(tmp_path):
    with Upstream() as a, gateway(tmp_path, routes_doc([(a, 1.0)])) as url, \
            httpx.Client(base_url=url, timeout=10) as c:
        for _ in range(3):
            c.post("/v1/chat/completions", json=call_body(), headers={"X-Scepsy-Request": "r"})
    assert a.bodies == [call_body()] * 3


# ------------------------------------------------------------------------------ metrics


def test_metrics_parse_and_count_the_calls(tmp_path):
    with Upstream(0.002) as a, Upstream(0.002) as b, \
            gateway(tmp_path, routes_doc([(a, 0.5), (b, 0.5)])) as url:
        statuses = asyncio.run(_many(url, 40, 4, request_of=lambda i: f"r{i % 10}"))
        httpx.post(url + "/v1/chat/completions", json=call_body("nope"), timeout=10)
        text = httpx.get(url + "/metrics", timeout=10).text
    assert statuses == [200] * 40
    samples: dict[tuple[str, tuple], float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    assert samples[("scepsy_gateway_requests_total", (("workflow", "rag"),))] == 10
    assert samples[("scepsy_gateway_calls_total",
                    (("llm", "gen"), ("status", "ok"), ("workflow", "rag")))] == 40
    assert samples[("scepsy_gateway_calls_total",
                    (("llm", "nope"), ("status", "no_route"), ("workflow", "agent")))] == 1
    assert samples[("scepsy_gateway_call_latency_seconds_count",
                    (("llm", "gen"), ("workflow", "rag")))] == 40
    assert samples[("scepsy_gateway_overhead_seconds_count", ())] == 40
    gauges = {k: v for k, v in samples.items() if k[0] == "scepsy_gateway_in_flight"}
    assert set(gauges) == {("scepsy_gateway_in_flight", (("llm", "gen"), ("url", u.v1)))
                           for u in (a, b)}
    assert all(v == 0 for v in gauges.values())


# ------------------------------------------------------------------------------ the CLI


def test_cli_gateway_and_record_are_apart(tmp_path):
    """The gateway takes a table, never a fixed upstream; the recording proxy has no table
    and no priorities: each refuses the other's options, one line, exit 2, nothing written."""
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"version": 1, "workflows": {"rag": {"gen": [
        {"url": "http://127.0.0.1:9/v1", "model": "gen", "weight": 1.0}]}}}))
    out = tmp_path / "t.jsonl"
    code, _, err = run_cli("gateway", "--listen", "127.0.0.1:0", "--routes", str(routes),
                           "--upstream", "http://127.0.0.1:9", "--out", str(out))
    assert code == 2 and "--upstream" in err
    code, _, err = run_cli("gateway", "--listen", "127.0.0.1:0", "--out", str(out))
    assert code == 2 and "--routes" in err
    for flag, value in (("--routes", str(routes)), ("--priority", "las")):
        code, _, err = run_cli("record", "--listen", "127.0.0.1:0", flag, value,
                               "--upstream", "http://127.0.0.1:9", "--out", str(out))
        assert code == 2 and flag in err
    assert not out.exists()


def test_cli_bad_routes_file_names_file_and_field(tmp_path):
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"version": 1, "workflows": {"rag": {"gen": [
        {"url": "http://127.0.0.1:9/v1", "model": "gen", "weight": 0.4}]}}}))
    out = tmp_path / "t.jsonl"
    code, _, err = run_cli("gateway", "--listen", "127.0.0.1:0", "--routes", str(routes),
                           "--out", str(out))
    assert code == 2 and str(routes) in err and "workflows.rag.gen" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_help_names_the_gateway_options():
    code, out, _ = run_cli("gateway", "--help")
    assert code == 0 and "--routes" in out and "--priority" in out
    code, out, _ = run_cli("record", "--help")
    assert code == 0 and "--routes" not in out and "--priority" not in out


# ------------------------------------------------------------------------------ real vLLM


@pytest.mark.vllm
def test_las_gateway_in_front_of_a_real_vllm_with_priority_scheduling(tmp_path):
    """One real ``vllm serve --scheduling-policy priority`` (CPU, dummy weights) behind the
    gateway with ``--priority las``: every call of two requests succeeds, the third call of the
    long request with priority 1 (vLLM refuses a nonzero priority without that policy)."""
    from scepsy_profile.profiling.backend import BackendUnavailable
    from scepsy_profile.profiling.engine_env import vllm_python
    from scepsy_profile.profiling.models import engine_model
    from scepsy_profile.profiling.server import ServerConfig, vllm_server

    try:
        vllm_python()
    except BackendUnavailable as exc:
        pytest.skip(f"no vLLM environment: {exc}")
    cfg = ServerConfig(model=engine_model("llama-3-8b", 1 / 16), kv_gib=1.0, max_num_seqs=4,
                       max_model_len=2048, extra_args=("--scheduling-policy", "priority"))
    name, prompt, out = cfg.served_name, list(range(1, 1101)), 8
    with vllm_server(cfg, tmp_path / "serve") as srv:
        doc = {"version": 1, "workflows": {"rag": {"gen": [
            {"url": srv.base_url + "/v1", "model": name, "weight": 1.0}]}}}
        with gateway(tmp_path, doc, priority="las") as url, \
                httpx.Client(base_url=url, timeout=300) as c:
            gw: Gateway = url._proxy  # type: ignore[attr-defined]
            answers, levels = [], []
            for rid in ("a", "a", "a", "b"):
                levels.append(las_level(gw.attained("agent", rid)))
                answers.append(c.post("/v1/completions", headers={"X-Scepsy-Request": rid},
                                      json={"model": "gen", "prompt": prompt, "max_tokens": out,
                                            "ignore_eos": True}))
            attained = gw.attained("agent", "a")
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
    assert levels == [0, 0, 1, 0]
    assert attained == 3 * (len(prompt) + out)
    calls = read_trace(tmp_path / "trace.jsonl").calls
    assert [(c.request_id, c.error, c.output_tokens) for c in calls] == [
        ("a", None, out), ("a", None, out), ("a", None, out), ("b", None, out)]


def test_idle_requests_are_forgotten_by_the_recorder_too_and_call_ids_stay_unique(tmp_path):
    with Upstream() as a, gateway(tmp_path, routes_doc([(a, 1.0)]), request_idle_s=0.2,
                                  poll_s=0.05) as url, \
            httpx.Client(base_url=url, timeout=10) as c:
        gw: Gateway = url._proxy  # type: ignore[attr-defined]
        c.post("/v1/chat/completions", json=call_body(), headers={"X-Scepsy-Request": "r"})
        assert ("agent", "r") in gw.proxy._requests
        time.sleep(0.5)
        assert ("agent", "r") not in gw.proxy._requests and gw._active == {}
        c.post("/v1/chat/completions", json=call_body(), headers={"X-Scepsy-Request": "r"})
    calls = read_trace(tmp_path / "trace.jsonl").calls
    assert [(c.call_id, c.parents) for c in calls] == [("c0", ()), ("c1", ())]


def test_a_table_without_endpoints_is_refused(tmp_path):
    with Upstream() as a, gateway(tmp_path, routes_doc([(a, 1.0)])) as url:
        r = httpx.put(url + "/scepsy/routes", json={"version": 1, "workflows": {}}, timeout=10)
        assert r.status_code == 400 and "workflows" in r.json()["error"]["message"]
        assert state(url)["version"] == 1
    with pytest.raises(InputError, match="at least one workflow"):
        GatewayConfig(record=RecordConfig(out=tmp_path / "x.jsonl", routed=True),
                      routes=parse_routes({"version": 1, "workflows": {"w": {}}}, "r"))
