"""The gateway heals (docs/gateway.md, "A replica that is gone"): active health checks keep
calls off an endpoint whose ``/health`` fails and bring it back when it passes; outlier
detection ejects an endpoint after 5xx answers, timeouts or a refused connection, for longer
each time, never taking an LLM's ejected share over ``max_ejection_percent``; the listen address
is the one given (every interface only when asked). Real sockets and a real HTTP client against
fake replicas on loopback (tests/fakes/openai_replica.py); no test asserts a duration, waits
are polls of ``GET /scepsy/state`` with a deadline."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from conftest import run_cli
from fakes.openai_replica import Replica
from scepsy_common.errors import InputError
from scepsy_opt.ingest.record import RecordConfig
from scepsy_opt.traces import read_trace
from scepsy_serve.gateway import (
    Gateway,
    GatewayConfig,
    HealthCheck,
    OutlierDetection,
    ejection_s,
    gateway_in_thread,
    may_eject,
    outcome_of,
    parse_health_check,
    parse_outlier_detection,
)
from scepsy_serve.launch.routes import parse_routes

FAST_HC = HealthCheck(interval_s=0.05, timeout_s=5.0, unhealthy_threshold=2, healthy_threshold=2)
"""Probes every 50 ms; a long timeout, so that a slow machine never fails a probe that the test
means to pass (the failures the tests make are immediate: 503, a refused connection)."""
LONG_EJECTION = 600.0
"""An ejection that outlasts any test: what is ejected stays ejected while the test looks."""


class Dead:
    """An endpoint where nothing listens (a replica that died)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.v1 = f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def doc(*v1s: str, llm: str = "gen") -> dict[str, Any]:
    w = 1.0 / len(v1s)
    return {"version": 1, "workflows": {"rag": {llm: [
        {"url": u, "model": llm, "weight": w, "replica": i} for i, u in enumerate(v1s)]}}}


def config(tmp_path: Path, routes: dict[str, Any], **kw: Any) -> GatewayConfig:
    record = {k: kw.pop(k) for k in ("retries", "timeout_s", "host") if k in kw}
    return GatewayConfig(record=RecordConfig(out=tmp_path / "trace.jsonl", routed=True,
                                             client_time=False, **record),
                         routes=parse_routes(routes, "routes"), **kw)


def calls(url: str, n: int, stream: bool = False) -> list[int]:
    """``n`` sequential calls through the gateway; their statuses."""
    async def run() -> list[int]:
        out = []
        async with aiohttp.ClientSession() as s:
            for i in range(n):
                async with s.post(url + "/v1/chat/completions",
                                  json={"model": "gen", "messages": [], "stream": stream},
                                  headers={"X-Scepsy-Workflow": "rag",
                                           "X-Scepsy-Request": f"r{i}"}) as r:
                    await r.read()
                    out.append(r.status)
        return out
    return asyncio.run(run())


def rows(url: str) -> dict[str, dict[str, Any]]:
    got = httpx.get(url + "/scepsy/state", timeout=10).json()
    return {e["url"]: e for e in got["endpoints"]}


def wait_for(url: str, endpoint: str, key: str, value: Any, deadline_s: float = 20.0) -> None:
    """Poll the state until ``endpoint``'s ``key`` is ``value`` (a deadline, not a timing
    assertion: it only bounds a hang)."""
    end = time.monotonic() + deadline_s
    while rows(url)[endpoint][key] != value:
        assert time.monotonic() < end, (endpoint, key, value, rows(url)[endpoint])
        time.sleep(0.02)


def metric(base: str, name: str, **labels: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


# ------------------------------------------------------------------------------ pure rules


@given(st.integers(1, 40), st.floats(0, 100))
def test_may_eject_never_takes_an_llm_over_the_percentage_but_always_allows_one(n, pct):
    ejected = 0
    while ejected < n and may_eject(ejected, n, pct):
        ejected += 1
    # brute force: the largest count k with k == 1 or k <= pct% of n
    assert ejected == max(k for k in range(1, n + 1) if k == 1 or 100 * k <= pct * n)
    if n >= 2 and pct < 100:
        assert ejected < n  # an LLM of two or more endpoints keeps one


@given(st.integers(1, 200), st.floats(0.01, 100), st.floats(0.01, 1000))
def test_ejection_time_grows_with_each_ejection_up_to_the_cap(times, base, cap):
    t = ejection_s(times, base, cap)
    assert t == pytest.approx(min(base * times, max(cap, base)), rel=1e-12)
    assert ejection_s(times + 1, base, cap) >= t >= base


@pytest.mark.parametrize("error, kind", [
    (None, "ok"), ("upstream_400", "ok"), ("upstream_429", "ok"), ("upstream_500", "5xx"),
    ("upstream_501", "5xx"), ("upstream_502", "gateway"), ("upstream_503", "gateway"),
    ("upstream_504", "gateway"), ("upstream_timeout", "gateway"),
    ("upstream_stream_cut", "gateway"), ("upstream_unreachable", "gateway"),
    ("client_disconnected", None), ("proxy_stopped", None), ("no_route", None)])
def test_outcome_of_each_error_kind(error, kind):
    assert outcome_of(error) == kind


@given(st.integers(1, 1000), st.integers(1, 1000),
       st.floats(0.001, 3600, allow_nan=False), st.floats(0.001, 3600, allow_nan=False),
       st.sampled_from(["/health", "/v1/models", "/ping/ok"]))
def test_health_check_text_round_trips(unhealthy, healthy, interval, timeout, path):
    text = (f"path={path},interval={interval!r},timeout={timeout!r},unhealthy={unhealthy},"
            f"healthy={healthy}")
    assert parse_health_check(text) == HealthCheck(path, interval, timeout, unhealthy, healthy)


def test_health_check_and_outlier_texts_refuse_bad_input_naming_the_key():
    assert parse_health_check("off") is None and parse_health_check("on") == HealthCheck()
    assert parse_outlier_detection("consecutive_5xx=2,decay=1") == OutlierDetection(
        consecutive_5xx=2, decay_s=1.0)
    for text, key in [("interval=0", "interval"), ("interval=nan", "interval"),
                      ("unhealthy=0", "unhealthy"), ("healthy=1.5", "healthy"),
                      ("path=health", "path"), ("bogus=1", "bogus"),
                      ("interval=1,interval=2", "interval"), ("interval", "interval")]:
        with pytest.raises(InputError) as exc:
            parse_health_check(text)
        assert str(exc.value).startswith(f"--health-check: {key}:"), str(exc.value)
    for text, key in [("max_ejection_percent=101", "max_ejection_percent"),
                      ("consecutive_5xx=0", "consecutive_5xx"),
                      ("base_ejection=-1", "base_ejection"), ("decay=inf", "decay")]:
        with pytest.raises(InputError) as exc:
            parse_outlier_detection(text)
        assert str(exc.value).startswith(f"--outlier-detection: {key}:"), str(exc.value)


@given(st.lists(st.floats(0, 100), min_size=1, max_size=12))
def test_each_ejection_lasts_base_times_its_count_decayed_by_time_un_ejected(gaps):
    """A reference model of Envoy's multiplier against the gateway's: ejections at increasing
    times, each ``gap`` seconds after the previous one ended."""
    od = OutlierDetection(base_ejection_s=2.0, max_ejection_s=30.0, decay_s=5.0)
    with_two = {"version": 1, "workflows": {"rag": {"gen": [
        {"url": f"http://127.0.0.1:{p}/v1", "model": "gen", "weight": 0.5} for p in (1, 2)]}}}
    gw = Gateway(GatewayConfig(record=RecordConfig(out=Path("/nonexistent/t.jsonl"),
                                                   routed=True),
                               routes=parse_routes(with_two, "r"), outlier=od, health=None))
    srv = gw._servers["http://127.0.0.1:1/v1"]
    now, times, until = 1000.0, 0, 0.0
    for gap in gaps:
        now = until + gap if times else now
        if times:
            times = max(0, times - int((now - until) // od.decay_s))
        times += 1
        until = now + min(od.base_ejection_s * times, od.max_ejection_s)
        assert gw.eject(srv, "test", now=now)
        assert (srv.ejections, srv.down_until) == (times, pytest.approx(until))
        assert not gw.eject(srv, "test", now=now + 1e-6)  # already ejected: no change
        assert srv.down_until == pytest.approx(until)


# ------------------------------------------------------------------------------ health checks


def test_an_endpoint_failing_its_health_check_gets_no_call_until_it_passes_again(tmp_path):
    with Replica() as good, Replica(health_status=503) as sick:
        cfg = config(tmp_path, doc(good.v1, sick.v1), health=FAST_HC)
        with gateway_in_thread(cfg) as url:
            wait_for(url, sick.v1, "healthy", False)
            assert calls(url, 20) == [200] * 20
            assert (good.calls, sick.calls) == (20, 0)
            assert rows(url)[sick.v1]["last_probe"] == "answered 503"
            assert metric(url, "scepsy_gateway_endpoint_healthy", url=sick.v1) == 0
            sick.health_status = 200
            wait_for(url, sick.v1, "healthy", True)
            assert calls(url, 20) == [200] * 20
            assert metric(url, "scepsy_gateway_endpoint_healthy", url=sick.v1) == 1
    # healthy again, it gets the calls until the counts meet (ties go to the fewest sent)
    assert (sick.calls, good.calls) == (20, 20)
    assert sick.probes >= FAST_HC.unhealthy_threshold + FAST_HC.healthy_threshold


def test_a_dead_replica_costs_no_refused_connection_once_its_checks_failed(tmp_path):
    """Passive ejection alone tries a dead endpoint again after each ejection; with health
    checks it stays out while its probes fail, however many ejections run out."""
    dead = Dead()
    od = OutlierDetection(base_ejection_s=0.05, max_ejection_s=0.05)
    with Replica() as live:
        cfg = config(tmp_path, doc(dead.v1, live.v1), health=FAST_HC, outlier=od)
        with gateway_in_thread(cfg) as url:
            wait_for(url, dead.v1, "healthy", False)
            lost = rows(url)[dead.v1]["lost"]
            statuses = []
            end = time.monotonic() + 1.0  # twenty ejection spans
            while time.monotonic() < end:
                statuses += calls(url, 5)
            after = rows(url)[dead.v1]
    assert statuses == [200] * len(statuses) and live.calls == len(statuses)
    assert after["lost"] == lost and after["calls"] == lost and after["healthy"] is False


def test_without_health_checks_a_table_change_resets_nothing_and_probes_nothing(tmp_path):
    with Replica() as a, gateway_in_thread(config(tmp_path, doc(a.v1), health=None)) as url:
        assert calls(url, 3) == [200] * 3
        time.sleep(0.2)
        row = rows(url)[a.v1]
    assert a.probes == 0 and row["healthy"] is True and row["last_probe"] is None


def test_an_endpoint_added_by_a_new_table_is_probed_and_one_dropped_is_not(tmp_path):
    with (Replica() as a, Replica(health_status=500) as b,
          gateway_in_thread(config(tmp_path, doc(a.v1), health=FAST_HC)) as url):
        assert httpx.put(url + "/scepsy/routes", json=doc(a.v1, b.v1),
                         timeout=10).status_code == 200
        wait_for(url, b.v1, "healthy", False)
        assert httpx.put(url + "/scepsy/routes", json=doc(a.v1),
                         timeout=10).status_code == 200
        probes = b.probes
        time.sleep(0.3)  # six intervals
        assert b.probes <= probes + 1  # at most one probe was already on its way
        b.health_status = 200
        assert httpx.put(url + "/scepsy/routes", json=doc(a.v1, b.v1),
                         timeout=10).status_code == 200
        assert rows(url)[b.v1]["healthy"] is True  # back in a table: health starts over


def test_a_table_set_from_another_thread_is_probed_on_the_gateway_loop(tmp_path):
    with (Replica() as a, Replica(health_status=503) as b,
          gateway_in_thread(config(tmp_path, doc(a.v1), health=FAST_HC)) as url):
        version = url._proxy.set_routes(parse_routes(doc(a.v1, b.v1), "routes"))
        assert version == 2
        wait_for(url, b.v1, "healthy", False)
        assert calls(url, 6) == [200] * 6 and b.calls == 0


# ------------------------------------------------------------------------------ outliers


@pytest.mark.parametrize("status, threshold_key", [(500, "consecutive_5xx"),
                                                   (503, "consecutive_gateway_failure")])
def test_consecutive_errors_eject_an_endpoint_and_the_client_sees_only_those(
        tmp_path, status, threshold_key):
    """500 counts toward consecutive_5xx (5 here); 503 is a gateway failure (2 here). A 5xx
    answer is not sent again (the server answered): the client sees exactly those."""
    od = OutlierDetection(consecutive_5xx=5, consecutive_gateway_failure=2,
                          base_ejection_s=LONG_EJECTION)
    threshold = getattr(od, threshold_key)
    with (Replica(status=status) as bad, Replica() as good,
          gateway_in_thread(config(tmp_path, doc(bad.v1, good.v1), health=None,
                                   outlier=od)) as url):
        statuses = calls(url, 30)
        row = rows(url)[bad.v1]
        ejections = metric(url, "scepsy_gateway_ejections_total", url=bad.v1,
                           reason=threshold_key)
    assert bad.calls == threshold and statuses.count(status) == threshold
    last_bad = max(i for i, s in enumerate(statuses) if s == status)
    assert statuses[last_bad + 1:] == [200] * (29 - last_bad)
    assert (row["ejected"], row["ejections"], row["failed"]) == (True, 1, threshold)
    assert ejections == 1
    errors = [c.error for c in read_trace(tmp_path / "trace.jsonl").calls]
    assert errors.count(f"upstream_{status}") == threshold


def test_a_success_between_errors_resets_the_count(tmp_path):
    """Only errors in a row eject: an endpoint that answers well every other call is kept."""
    od = OutlierDetection(consecutive_5xx=2, consecutive_gateway_failure=2,
                          base_ejection_s=LONG_EJECTION)
    with (Replica() as flaky,
          gateway_in_thread(config(tmp_path, doc(flaky.v1), health=None, outlier=od)) as url):
        statuses = []
        for i in range(10):
            flaky.status = 500 if i % 2 else 200
            statuses += calls(url, 1)
        row = rows(url)[flaky.v1]
    assert statuses == [200, 500] * 5 and (row["ejected"], row["ejections"]) == (False, 0)


def test_timeouts_are_gateway_failures(tmp_path):
    od = OutlierDetection(consecutive_gateway_failure=2, base_ejection_s=LONG_EJECTION)
    with (Replica(delay_s=3.0) as slow, Replica() as fast,
          gateway_in_thread(config(tmp_path, doc(slow.v1, fast.v1), health=None,
                                   outlier=od, timeout_s=1.0)) as url):
        statuses = calls(url, 8)
        row = rows(url)[slow.v1]
    assert statuses.count(504) == 2 and statuses.count(200) == 6
    assert (row["ejected"], slow.calls) == (True, 2)


@pytest.mark.parametrize("bad_of_three, pct", [(2, 50.0), (2, 100.0), (3, 50.0), (3, 70.0)])
def test_max_ejection_percent_bounds_what_one_llm_loses(tmp_path, bad_of_three, pct):
    """Three endpoints, some answering 500; ejection at the first error. The ejected count is
    the most the percentage allows (one at least), and the LLM keeps the others, sick or not."""
    od = OutlierDetection(consecutive_5xx=1, max_ejection_percent=pct,
                          base_ejection_s=LONG_EJECTION)
    reps = [Replica(status=500) for _ in range(bad_of_three)] + \
        [Replica() for _ in range(3 - bad_of_three)]
    for r in reps:
        r.__enter__()
    try:
        with gateway_in_thread(config(tmp_path, doc(*(r.v1 for r in reps)), health=None,
                                      outlier=od)) as url:
            statuses = calls(url, 30)
            state = rows(url)
    finally:
        for r in reps:
            r.__exit__(None, None, None)
    allowed = max(k for k in range(1, 4) if k == 1 or 100 * k <= pct * 3)
    ejected = [r for r in reps if state[r.v1]["ejected"]]
    assert len(ejected) == min(allowed, bad_of_three)
    assert all(r.status == 500 for r in ejected)  # only the failing ones
    kept_bad = bad_of_three - len(ejected)
    assert (statuses.count(500) > bad_of_three) == (kept_bad > 0)  # a kept one still answers
    assert len(state) - len(ejected) >= (1 if pct < 100 else 0)


def test_a_refused_connection_ejects_at_once_and_the_call_goes_elsewhere(tmp_path):
    dead = Dead()
    with (Replica() as live,
          gateway_in_thread(config(tmp_path, doc(dead.v1, live.v1), health=None)) as url):
        assert calls(url, 6) == [200] * 6
        row = rows(url)[dead.v1]
        refused = metric(url, "scepsy_gateway_ejections_total", url=dead.v1,
                         reason="refused")
    assert (row["lost"], row["ejected"], row["ejections"], refused) == (1, True, 1, 1)
    assert row["failed"] == 0 and live.calls == 6


# ------------------------------------------------------------------------------ listening


def _connects(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(5)
        return s.connect_ex((host, port)) == 0


def test_the_gateway_listens_only_on_the_address_it_was_given(tmp_path):
    """Bound to 127.0.0.1, a connection to 127.0.0.2 (the same host, another address) is
    refused; every interface only with all_interfaces."""
    with Replica() as a:
        with gateway_in_thread(config(tmp_path, doc(a.v1), health=None)) as url:
            port = int(url.rsplit(":", 1)[1])
            assert _connects("127.0.0.1", port) and not _connects("127.0.0.2", port)
        with pytest.raises(InputError, match=r"--listen.*--all-interfaces"):
            config(tmp_path, doc(a.v1), host="0.0.0.0")
        cfg = config(tmp_path, doc(a.v1), health=None, host="0.0.0.0", all_interfaces=True)
        (tmp_path / "trace.jsonl").unlink(missing_ok=True)
        with gateway_in_thread(cfg) as url:
            port = int(url.rsplit(":", 1)[1])
            assert _connects("127.0.0.1", port) and _connects("127.0.0.2", port)


@pytest.mark.parametrize("argv, named", [
    (["--listen", "0.0.0.0:0"], "--listen"),
    (["--listen", "[::]:0"], "--listen"),
    (["--listen", "127.0.0.1:0", "--health-check", "interval=0"], "--health-check: interval"),
    (["--listen", "127.0.0.1:0", "--outlier-detection", "decay=x"],
     "--outlier-detection: decay")])
def test_cli_refuses_every_interface_and_bad_checks_in_one_line(tmp_path, argv, named):
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps(doc("http://127.0.0.1:9/v1")))
    out = tmp_path / "t.jsonl"
    code, _, err = run_cli("gateway", *argv, "--routes", str(routes), "--out", str(out),
                           "--duration", "0.1")
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_the_cli_loop_is_uvloop_where_installed_else_asyncio(monkeypatch):
    import sys

    from scepsy_serve.gateway import loop_factory

    uvloop = pytest.importorskip("uvloop")
    assert loop_factory() is uvloop.new_event_loop
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert loop_factory() is None


def test_cli_runs_with_its_checks_set_and_on_every_interface_when_asked(tmp_path):
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps(doc("http://127.0.0.1:9/v1")))
    for i, extra in enumerate([["--listen", "127.0.0.1:0", "--health-check", "off"],
                               ["--listen", "127.0.0.1:0", "--health-check",
                                "path=/health,interval=0.1,timeout=0.1,unhealthy=1,healthy=3",
                                "--outlier-detection", "consecutive_5xx=2,max_ejection_percent=100"],
                               ["--listen", "0.0.0.0:0", "--all-interfaces"]]):
        code, _, err = run_cli("gateway", *extra, "--routes", str(routes), "--out",
                               str(tmp_path / f"t{i}.jsonl"), "--duration", "0.3")
        assert code == 0, err
        assert "listening on http://" in err
