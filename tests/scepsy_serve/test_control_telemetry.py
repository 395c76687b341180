"""Live telemetry of ``scepsy control`` (scepsy_serve.control.telemetry): counter increases
across restarts, per-window workflow rates, p90 call latency from histogram increases, queues
averaged over polls, all from Prometheus text written by prometheus_client itself; and one
scrape of a loopback gateway and replica over HTTP."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from scepsy_serve.control.telemetry import (
    GatewaySample,
    Scrape,
    Telemetry,
    counter_increase,
    histogram_increase,
    parse_gateway,
    parse_waiting,
    window_stats,
)

BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0)


class FakeGatewayMetrics:
    """The gateway's metrics as the gateway names them, in a registry of their own."""

    def __init__(self) -> None:
        self.reg = CollectorRegistry()
        self.requests = Counter("scepsy_gateway_requests", "r", ["workflow"], registry=self.reg)
        self.latency = Histogram("scepsy_gateway_call_latency_seconds", "l", ["workflow", "llm"],
                                 buckets=BUCKETS, registry=self.reg)

    def text(self) -> str:
        return generate_latest(self.reg).decode()


@given(st.floats(0, 1e9), st.floats(0, 1e9))
def test_counter_increase_is_never_negative_and_exact_without_restart(a, b):
    inc = counter_increase(a, b)
    assert inc >= 0
    if b >= a:
        assert math.isclose(inc, b - a, rel_tol=1e-12, abs_tol=1e-9)
    else:  # restarted: counted from 0 again
        assert inc == b


def test_rates_and_p90_of_one_window():
    g = FakeGatewayMetrics()
    g.requests.labels(workflow="rag").inc(100)
    g.latency.labels(workflow="rag", llm="gen").observe(0.05)
    first = Scrape(10.0, parse_gateway(g.text()), {"gen": 2.0})
    g.requests.labels(workflow="rag").inc(30)  # 30 requests in 10 s: 3 req/s
    g.requests.labels(workflow="chat").inc(5)
    for _ in range(8):
        g.latency.labels(workflow="rag", llm="gen").observe(0.3)  # (0.1, 0.5]
    for _ in range(2):
        g.latency.labels(workflow="chat", llm="gen").observe(1.5)  # (1, 2]
    mid = Scrape(15.0, parse_gateway(g.text()), {"gen": 6.0})
    last = Scrape(20.0, parse_gateway(g.text()), {"gen": 4.0})
    w = window_stats(first, last, [first, mid, last], workflows=["rag", "chat", "idle"])
    assert (w.start_s, w.end_s) == (10.0, 20.0)
    assert math.isclose(w.workflow_rates["rag"], 3.0)
    assert math.isclose(w.workflow_rates["chat"], 0.5)
    assert w.workflow_rates["idle"] == 0.0
    # 10 calls in the window: rank 9 falls in (1, 2], halfway through it (8 below, 2 in it)
    assert math.isclose(w.llm_latency_s["gen"], 1.5)
    assert math.isclose(w.llm_queue["gen"], 4.0)


def test_a_gateway_restart_counts_from_zero():
    g = FakeGatewayMetrics()
    g.requests.labels(workflow="rag").inc(500)
    for _ in range(50):
        g.latency.labels(workflow="rag", llm="gen").observe(0.05)
    first = Scrape(0.0, parse_gateway(g.text()))
    g2 = FakeGatewayMetrics()  # restarted: every counter from 0
    g2.requests.labels(workflow="rag").inc(20)
    for _ in range(4):
        g2.latency.labels(workflow="rag", llm="gen").observe(3.0)
    last = Scrape(10.0, parse_gateway(g2.text()))
    w = window_stats(first, last)
    assert math.isclose(w.workflow_rates["rag"], 2.0)  # not (20 - 500) / 10
    assert 2.0 < w.llm_latency_s["gen"] <= 5.0  # the restarted histogram's own calls


def test_histogram_increase_buckets_are_differences():
    n, rows = histogram_increase({1.0: 2, math.inf: 3}, {1.0: 5, math.inf: 9}, 3, 9)
    assert n == 6 and rows == ((1.0, 3.0), (math.inf, 6.0))


def test_no_calls_no_latency_and_a_window_needs_the_gateway():
    g = FakeGatewayMetrics()
    g.latency.labels(workflow="rag", llm="gen").observe(0.2)
    s = parse_gateway(g.text())
    w = window_stats(Scrape(0.0, s), Scrape(5.0, s))
    assert "gen" not in w.llm_latency_s
    with pytest.raises(ValueError, match="gateway"):
        window_stats(Scrape(0.0, None), Scrape(5.0, s))
    with pytest.raises(ValueError, match="window"):
        window_stats(Scrape(5.0, s), Scrape(5.0, s))


def test_parse_waiting_sums_engines():
    text = ('# TYPE vllm:num_requests_waiting gauge\n'
            'vllm:num_requests_waiting{engine="0",model_name="a}b"} 3.0\n'
            'vllm:num_requests_waiting{engine="1",model_name="a}b"} 2.0\n'
            'vllm:num_requests_running{engine="0",model_name="a}b"} 9.0\n')
    assert parse_waiting(text) == 5.0


def test_scrape_over_http_reads_gateway_and_replicas():
    g = FakeGatewayMetrics()
    g.requests.labels(workflow="rag").inc(7)

    async def main():
        async def gw(_):
            return web.Response(text=g.text())

        async def replica(_):
            return web.Response(text="vllm:num_requests_waiting{model_name=\"gen\"} 4\n")

        app = web.Application()
        app.router.add_get("/metrics", gw)
        app.router.add_get("/r/metrics", replica)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(trust_env=False) as client:
                tel = Telemetry(base, {"gen": [base + "/r/v1"], "down": ["http://127.0.0.1:1/v1"]},
                                client=client, timeout_s=2.0)
                return await tel.scrape()
        finally:
            await runner.cleanup()

    s = asyncio.run(main())
    assert isinstance(s.gateway, GatewaySample) and s.gateway.requests == {"rag": 7.0}
    assert s.waiting == {"gen": 4.0}  # the replica that did not answer: its LLM left out
    assert len(s.errors) == 1 and "127.0.0.1:1" in s.errors[0]
