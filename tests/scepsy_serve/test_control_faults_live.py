"""The controller under a real fault (docs/control.md, "Faults"): the plan's four replicas are
fake OpenAI-compatible servers in processes of their own (tests/fakes/openai_replica.py), behind
the real gateway with active health checks; the live control loop (1 s windows) runs with an
apply target that starts and stops those processes. One of the generator's two replicas is
killed with SIGKILL mid-run while clients keep calling. The controller logs ``replica_down``
for it at the first or second window end after the kill, starts a replacement in its place
(the other replicas run on: no re-plan, no decision but keep), the replacement takes calls, and
the only calls that failed were in flight on the killed replica."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import aiohttp
import httpx
import test_control_cli
from test_control_cli import RAG, TRACE
from test_gateway_kill import ReplicaProcess, _complete

from scepsy_opt.ingest.record import RecordConfig
from scepsy_serve.control.core import ControlConfig, Controller
from scepsy_serve.control.live import control_loop
from scepsy_serve.gateway import GatewayConfig, HealthCheck, gateway_in_thread
from scepsy_serve.launch.routes import plan_routes

plan_file = test_control_cli.plan_file  # the fixture: rag at 1 req/s, placed on one GPU
WINDOW_S = 1.0
WORKERS = 6


class ProcessTarget:
    """Each replica an ``openai_replica.py`` process; ``procs`` every one it started."""

    name = "processes"

    def __init__(self) -> None:
        self.running: dict[tuple[str, int], ReplicaProcess] = {}
        self.procs: list[ReplicaProcess] = []

    def start(self, plan, r) -> None:
        p = ReplicaProcess("--delay", "0.05", "--chunks", "4", "--chunk-s", "0.02")
        self.running[(r.llm, r.replica)] = p
        self.procs.append(p)

    def healthy(self, plan, r) -> bool:
        p = self.running.get((r.llm, r.replica))
        if p is None or p.proc.poll() is not None:
            raise RuntimeError("not running")
        return httpx.get(p.v1[:-3] + "/health", timeout=2, trust_env=False).status_code == 200

    def url(self, plan, r) -> str:
        return self.running[(r.llm, r.replica)].v1

    def stop(self, plan, r) -> None:
        p = self.running.pop((r.llm, r.replica), None)
        if p is not None:
            p.close()

    def close(self) -> None:
        for p in self.procs:
            p.close()


def test_a_killed_replica_is_noticed_within_two_windows_and_replaced(plan_file, tmp_path):
    from scepsy.cli.control import add_arguments, build

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    problem, topology, placed, launch = build(ap.parse_args(
        ["--plan", str(plan_file), "--workflow", RAG, "--gateway", "http://127.0.0.1:1",
         *TRACE]))
    # no scale-down within the run (the calls below are far under the planned rate)
    controller = Controller(problem, topology, placed,
                            ControlConfig(window_s=WINDOW_S, startup_s=1.0, hold_windows=10_000))
    gens = [r for r in launch.replicas if r.llm == "generator"]
    assert len(gens) == 2, launch.replicas
    target = ProcessTarget()
    rows: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    seen: dict[str, list[float]] = {"decision": [], "fault": []}
    try:
        for r in launch.replicas:
            target.start(launch, r)
        victim = target.running[("generator", gens[1].replica)]
        cfg = GatewayConfig(record=RecordConfig(out=tmp_path / "trace.jsonl", routed=True,
                                                client_time=False, retries=1),
                            routes=plan_routes(launch, lambda r: target.url(launch, r)),
                            health=HealthCheck(interval_s=0.05, timeout_s=0.5))
        with gateway_in_thread(cfg) as url:
            base = str(url)
            dead_at: list[float] = []

            async def main() -> Any:
                stop = asyncio.Event()
                replaced = asyncio.Event()

                def decided(d) -> None:
                    seen["decision"].append(time.monotonic())
                    if len(seen["decision"]) == 2:  # a baseline: then kill it
                        asyncio.get_running_loop().run_in_executor(None, kill)
                    if replaced.is_set() and len(seen["decision"]) >= 4 + n_at_replace[0]:
                        stop.set()

                n_at_replace = [10**6]

                def kill() -> None:
                    victim.kill()
                    dead_at.append(time.monotonic())

                def faulted(f) -> None:
                    seen["fault"].append(time.monotonic())
                    if f.kind == "replica_down":
                        replaced.set()
                        n_at_replace[0] = len(seen["decision"])

                async def worker(k: int, s: aiohttp.ClientSession) -> None:
                    i = 0
                    while not stop.is_set():
                        cid, stream = f"w{k}-{i}", i % 2 == 1
                        i += 1
                        t0 = time.monotonic()
                        try:
                            async with s.post(base + "/v1/chat/completions", json={
                                    "model": "generator", "messages": [], "stream": stream,
                                    "user": cid}, headers={"X-Scepsy-Workflow": "rag",
                                                           "X-Scepsy-Request": "one"}) as resp:
                                ok = _complete(resp.status, await resp.read(), stream)
                        except aiohttp.ClientError:
                            ok = False
                        calls.append({"id": cid, "start": t0, "end": time.monotonic(),
                                      "ok": ok})
                        await asyncio.sleep(0.02)

                async with aiohttp.ClientSession(
                        timeout=aiohttp.ClientTimeout(total=30)) as s:
                    # one workflow request, seen before the loop's first read: the observed
                    # rate is 0 and the controller keeps the plan (no change besides the fault)
                    async with s.post(base + "/v1/chat/completions", json={
                            "model": "generator", "messages": [], "user": "warm"},
                            headers={"X-Scepsy-Workflow": "rag",
                                     "X-Scepsy-Request": "one"}) as resp:
                        assert resp.status == 200
                    feeding = [asyncio.ensure_future(worker(k, s)) for k in range(WORKERS)]
                    res = await control_loop(controller, launch, target, base,
                                             window_s=WINDOW_S, log=rows.append, stop=stop,
                                             health_timeout_s=10, on_decision=decided,
                                             on_fault=faulted)
                    stop.set()
                    await asyncio.gather(*feeding)
                return res

            res = asyncio.run(asyncio.wait_for(main(), 60))
            state = httpx.get(base + "/scepsy/state", timeout=10, trust_env=False).json()
    finally:
        target.close()
    log = [json.loads(json.dumps(r)) for r in rows]  # every line JSON-ready
    down = [r for r in log if r.get("kind") == "fault" and r["fault"] == "replica_down"]
    assert len(down) == 1, log
    assert down[0]["subject"] == victim.v1 and down[0]["llm"] == "generator" and down[0]["reason"]
    # noticed at the first or second window end after the kill
    t_kill, t_fault = dead_at[0], seen["fault"][0]
    assert sum(1 for t in seen["decision"] if t_kill < t < t_fault) <= 1, (seen, t_kill)
    assert not [r for r in log if r.get("kind") == "fault" and r["fault"] != "replica_down"]
    # replaced in place: a new process for the same replica, routed; the others ran on
    steps = [r["step"] for r in log if r.get("kind") == "replace"]
    assert steps == ["start", "healthy"], log
    assert res.replaced == 1 and res.applied == 0 and set(res.decisions) == {"keep"}
    new = target.running[("generator", gens[1].replica)]
    assert new is not victim and new in target.procs
    urls = {e["url"] for e in state["endpoints"] if e["weight"] > 0}
    assert new.v1 in urls and victim.v1 not in urls
    assert any(ln.startswith("start ") for ln in new.lines)  # the replacement took calls
    # nothing lost beyond the calls in flight on the killed replica
    failed = {c["id"] for c in calls if not c["ok"]}
    assert failed <= victim.in_flight(), (failed, victim.in_flight())
    assert all(c["ok"] for c in calls if c["start"] > t_kill + 0.5)
    assert len(calls) > 50 and len([c for c in calls if c["start"] > t_fault]) > 10


def test_no_decision_while_the_gateway_is_gone(plan_file):
    """The gateway (a loopback fake, idle: the controller would scale down) goes away after two
    windows: every later window is held with a reason, ``telemetry_stale`` is declared at the
    second, and no decision (above all no scale-down) is taken on the missing data."""
    import threading

    from fakes.control_gateway import FakeGateway
    from scepsy.cli.control import add_arguments, build

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    problem, topology, placed, launch = build(ap.parse_args(
        ["--plan", str(plan_file), "--workflow", RAG, "--gateway", "http://127.0.0.1:1",
         *TRACE]))
    controller = Controller(problem, topology, placed,
                            ControlConfig(window_s=0.5, startup_s=0.5, hold_windows=1))
    rows: list[dict[str, Any]] = []
    gw = FakeGateway()
    gw.__enter__()
    gone: list[float] = []

    async def main() -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def decided(d) -> None:
            if sum(1 for r in rows if r.get("kind") == "decision") == 2 and not gone:
                gone.append(time.monotonic())
                threading.Thread(target=gw.__exit__, args=(None, None, None)).start()

        stale: list[bool] = []

        def faulted(f) -> None:
            if f.kind == "telemetry_stale":
                stale.append(True)

        def logged(row: dict[str, Any]) -> None:
            # three held windows after the fault, however long a loaded machine takes for them
            # (a fixed 1.5 s saw only two under load)
            rows.append(row)
            if stale and sum(1 for r in rows if r.get("kind") == "hold") >= 4:
                loop.call_soon(stop.set)

        return await control_loop(controller, launch, None, gw.base_url, window_s=0.5,
                                  log=logged, stop=stop, on_decision=decided,
                                  on_fault=faulted)

    try:
        res = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        if not gone:  # else stopped by the loop's callback
            gw.__exit__(None, None, None)
    kinds = [r["kind"] for r in rows if r["kind"] in ("decision", "hold", "fault")]
    first_hold = kinds.index("hold")
    assert "decision" not in kinds[first_hold:], kinds  # nothing decided on missing data
    holds = [r for r in rows if r["kind"] == "hold"]
    assert len(holds) >= 3 and all("no fresh telemetry" in r["reason"] for r in holds)
    stale = [r for r in rows if r["kind"] == "fault"]
    assert [r["fault"] for r in stale] == ["telemetry_stale"] and stale[0]["response"] == "hold"
    assert kinds[first_hold:first_hold + 3] == ["hold", "fault", "hold"]  # at the second
    assert res.held == len(holds) and res.windows == 2 and res.faults == {"telemetry_stale": 1}
