"""``scepsy control`` (scepsy.cli.control, scepsy_serve.control.live): bad inputs are one line
and exit 2 before anything runs; a --dry-run against a loopback fake gateway whose request
counter rises logs a scale-up decision and changes nothing, and SIGTERM ends it cleanly; the
live loop with a fake apply target applies the change (new routes, the controller's running
plan, its metrics); the controller's Prometheus metrics."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from conftest import REPO, run_cli
from fakes.control_gateway import FakeGateway
from scepsy_profile.profiling.server import parse_metrics

RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
A16 = str(REPO / "datasets" / "clusters" / "a100-16.yaml")
TRACE = ["--trace-requests", "300"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    """rag at 1 req/s, min-cost: one GPU of the 16, so there is room to scale up."""
    out = tmp_path_factory.mktemp("control") / "plan.json"
    code, _, err = run_cli("plan", "--workflow", RAG, "--cluster", A16, "--target", "1",
                           "--objective", "min-cost", "--out", str(out), *TRACE)
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def gateway():
    with FakeGateway() as gw:
        yield gw


def control(plan: Path, gateway_url: str, *extra: str) -> list[str]:
    return ["control", "--plan", str(plan), "--workflow", RAG, "--gateway", gateway_url,
            *TRACE, *extra]


def test_bad_inputs_are_one_line_exit_2(plan_file, gateway, tmp_path):
    doc = json.loads(plan_file.read_text())
    doc["placement"]["placed"] = False
    unplaced = tmp_path / "unplaced.json"
    unplaced.write_text(json.dumps(doc))
    log = tmp_path / "d.jsonl"
    cases = [
        (control(unplaced, gateway.base_url, "--log", str(log)), ["unplaced.json"]),
        (control(plan_file, "ftp://x", "--log", str(log)), ["--gateway"]),
        (control(plan_file, "http://127.0.0.1:1", "--log", str(log)),
         ["--gateway", "/scepsy/state"]),
        (control(plan_file, gateway.base_url, "--window", "0", "--log", str(log)),
         ["--window"]),
        (control(plan_file, gateway.base_url, "--window", "-3", "--log", str(log)),
         ["--window"]),
        (control(plan_file, gateway.base_url, "--startup-s", "nan", "--log", str(log)),
         ["--startup-s"]),
        (control(plan_file, gateway.base_url, "--metrics-listen", "nowhere", "--log",
                 str(log)), ["--metrics-listen"]),
        (control(plan_file, gateway.base_url, "--log", str(tmp_path)), ["--log"]),
        (control(plan_file, gateway.base_url, "--log", str(tmp_path / "no" / "d.jsonl")),
         ["--log"]),
    ]
    for argv, words in cases:
        code, _, err = run_cli(*argv)
        assert code == 2, (argv, err)
        assert len(err.strip().splitlines()) == 1, err
        assert all(w in err for w in words), (words, err)
    assert not log.exists()  # nothing written before the inputs were good
    assert gateway.routes is None


def _log_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_dry_run_logs_a_scale_up_and_sigterm_ends_it(plan_file, tmp_path):
    log = tmp_path / "decisions.jsonl"
    code = "import sys; from scepsy.cli import main; sys.exit(main(sys.argv[1:]))"
    with FakeGateway(per_second={"rag": 12.0}) as gw:  # planned for 1 req/s
        argv = control(plan_file, gw.base_url, "--dry-run", "--window", "1", "--startup-s", "2",
                       "--log", str(log), "--metrics-listen", "127.0.0.1:0")
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO / "src"),
                                              os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 240
            while not any(r.get("action") == "scale-up" for r in _log_rows(log)):
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "no scale-up decision in 240 s"
                time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert gw.routes is None  # a dry run re-routes nothing
    assert proc.returncode == 0, stderr
    assert "windows; decisions:" in stderr and "applied 0" in stderr
    rows = _log_rows(log)
    up = next(r for r in rows if r.get("kind") == "decision" and r["action"] == "scale-up")
    assert up["observed_rates"]["rag"] > 1.0 and up["reason"]
    assert up["predicted_now"] and up["predicted_after"]
    plans = [r for r in rows if r.get("kind") == "apply"]
    assert plans and all(r["step"] == "plan" and r["dry_run"] for r in plans)
    assert plans[0]["start"]  # what it would have started


class RecordingTarget:
    name = "fake"

    def __init__(self) -> None:
        self.started: list[int] = []
        self.stopped: list[int] = []

    def start(self, plan, r) -> None:
        self.started.append(r.port)

    def healthy(self, plan, r) -> bool:
        return True

    def url(self, plan, r) -> str:
        return f"http://127.0.0.1:{r.port}/v1"

    def stop(self, plan, r) -> None:
        self.stopped.append(r.port)


def test_the_live_loop_applies_a_scale_up(plan_file, tmp_path):
    from scepsy.cli.control import add_arguments, build
    from scepsy_serve.control.core import ControlConfig, Controller
    from scepsy_serve.control.live import ControlMetrics, control_loop

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(control(plan_file, "http://127.0.0.1:1")[1:])
    problem, topology, placed, launch = build(args)
    controller = Controller(problem, topology, placed, ControlConfig(window_s=1.0,
                                                                     startup_s=1.0))
    before = sum(i.replicas for i in controller.allocation.llms.values())
    target = RecordingTarget()
    metrics = ControlMetrics()
    rows: list[dict] = []

    async def main(url: str):
        stop = asyncio.Event()

        def decided(d):
            if d.action == "scale-up":
                asyncio.get_running_loop().call_later(3.0, stop.set)

        return await control_loop(controller, launch, target, url, window_s=1.0,
                                  log=rows.append, stop=stop, health_timeout_s=10,
                                  metrics=metrics, on_decision=decided)

    with FakeGateway(per_second={"rag": 12.0}) as gw:
        res = asyncio.run(asyncio.wait_for(main(gw.base_url), 240))
        routes = gw.routes
    assert res.applied >= 1 and res.moves > 0, rows
    after = sum(i.replicas for i in controller.allocation.llms.values())
    assert after > before  # the controller's running plan is the new one
    assert target.started and routes is not None
    urls = {e["url"] for llms in routes["workflows"].values() for eps in llms.values()
            for e in eps}
    assert {f"http://127.0.0.1:{port}/v1" for port in target.started} <= urls
    steps = [r["step"] for r in rows if r.get("kind") == "apply"]
    assert steps.index("routes") > steps.index("healthy")
    snap = parse_metrics(generate_latest(metrics.registry).decode())
    assert snap.value("scepsy_control_moves_total") == res.moves
    assert snap.value("scepsy_control_decisions_total") == res.windows
    assert snap.value("scepsy_control_replicas") == after
    assert snap.value("scepsy_control_forecast_rate") > 1.0


# -- end to end: the real gateway, fake servers, the live loop --------------------------------------


class FakeServersTarget:
    """Each replica a FakeOpenAIServer (started on a port of its own; the plan's port is its
    key), so calls really flow through the gateway to replicas that start and stop."""

    name = "fake-servers"

    def __init__(self) -> None:
        self.servers: dict[int, Any] = {}
        self.stopped: list[Any] = []

    def start(self, plan, r) -> None:
        from fakes.openai_server import FakeOpenAIServer

        srv = FakeOpenAIServer(slots=8)
        srv.__enter__()
        self.servers[r.port] = srv

    def healthy(self, plan, r) -> bool:
        return r.port in self.servers

    def url(self, plan, r) -> str:
        return self.servers[r.port].base_url + "/v1"

    def stop(self, plan, r) -> None:
        srv = self.servers.pop(r.port)
        srv.__exit__(None, None, None)
        self.stopped.append(srv)

    def close(self) -> None:
        for srv in self.servers.values():
            srv.__exit__(None, None, None)


def test_end_to_end_a_scale_up_through_the_real_gateway_loses_no_call(plan_file, tmp_path):
    """The gateway routes the plan's replicas (fake servers); load well above the plan's rate
    flows through it; the controller scales up through the gateway's admin API; every call
    answers 200 and the gateway counts no failed call."""
    import aiohttp

    from scepsy.cli.control import add_arguments, build
    from scepsy_opt.ingest.record import RecordConfig
    from scepsy_serve.control.core import ControlConfig, Controller
    from scepsy_serve.control.live import control_loop
    from scepsy_serve.gateway import GatewayConfig, gateway_in_thread
    from scepsy_serve.launch.routes import plan_routes

    p = argparse.ArgumentParser()
    add_arguments(p)
    problem, topology, placed, launch = build(p.parse_args(
        control(plan_file, "http://127.0.0.1:1")[1:]))
    controller = Controller(problem, topology, placed, ControlConfig(window_s=1.0,
                                                                     startup_s=1.0))
    target = FakeServersTarget()
    for r in launch.replicas:
        target.start(launch, r)
    initial = set(target.servers.values())
    rows: list[dict] = []
    statuses: list[int] = []
    try:
        cfg = GatewayConfig(record=RecordConfig(out=tmp_path / "trace.jsonl", routed=True,
                                                client_time=False),
                            routes=plan_routes(launch, lambda r: target.url(launch, r)))
        with gateway_in_thread(cfg) as url:
            base = str(url)

            async def load(stop: asyncio.Event) -> None:
                async with aiohttp.ClientSession() as s:
                    async def one(i: int) -> None:
                        for llm in ("rewriter", "reranker", "generator"):
                            async with s.post(base + "/v1/completions", json={
                                    "model": llm, "max_tokens": 4, "prompt": [1, 2, 3]},
                                    headers={"X-Scepsy-Request": f"r{i}",
                                             "X-Scepsy-Workflow": "rag"}) as resp:
                                await resp.read()
                                statuses.append(resp.status)
                    tasks, i = [], 0
                    while not stop.is_set():
                        tasks.append(asyncio.ensure_future(one(i)))
                        i += 1
                        await asyncio.sleep(1 / 12)  # 12 req/s, planned for 1
                    await asyncio.gather(*tasks)

            async def main():
                stop = asyncio.Event()

                def decided(d):
                    if d.action == "scale-up":
                        asyncio.get_running_loop().call_later(3.0, stop.set)

                feeding = asyncio.ensure_future(load(stop))
                res = await control_loop(controller, launch, target, base, window_s=1.0,
                                         log=rows.append, stop=stop, health_timeout_s=10,
                                         on_decision=decided)
                stop.set()
                await feeding
                return res

            res = asyncio.run(asyncio.wait_for(main(), 240))
            final = httpx.get(base + "/scepsy/state", timeout=10).json()
            new = [srv for srv in [*target.servers.values(), *target.stopped]
                   if srv not in initial]
    finally:
        target.close()
    assert res.applied >= 1, rows
    steps = [r["step"] for r in rows if r.get("kind") == "apply"]
    assert "routes" in steps and "applied" in steps, steps
    assert statuses and set(statuses) == {200}  # no call lost or failed during the change
    assert all(e["failed"] == 0 for e in final["endpoints"])
    assert final["version"] >= 2  # the controller's routes were taken
    assert new and any(srv.requests for srv in new)  # the new replicas took calls
    assert len(statuses) > 50
