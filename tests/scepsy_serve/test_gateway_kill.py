"""A replica killed mid-run costs at most the calls in flight on it (docs/gateway.md, "A replica
that is gone"): two fake replicas in processes of their own (tests/fakes/openai_replica.py)
behind the gateway, eight clients sending streamed and non-streamed calls; one replica is
killed with SIGKILL after a quarter of the calls. Every call that failed was in flight on the
killed replica (its own log of the calls it started and ended says which), every call that
started after it died succeeded, and the gateway took it out of the table's use (health checks)
without a failed call."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil

from scepsy_opt.ingest.record import RecordConfig
from scepsy_opt.traces import read_trace
from scepsy_serve.gateway import GatewayConfig, HealthCheck, gateway_in_thread
from scepsy_serve.launch.routes import parse_routes

REPLICA = Path(__file__).resolve().parents[1] / "fakes" / "openai_replica.py"
CALLS, WORKERS, KILL_AFTER = 240, 8, 60


class ReplicaProcess:
    """``python openai_replica.py`` in a process of its own; ``lines``: what it printed."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(REPLICA), *args],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        assert first.startswith("port "), first
        self.v1 = f"http://127.0.0.1:{int(first.split()[1])}/v1"
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def kill(self) -> None:
        psutil.Process(self.proc.pid).kill()  # SIGKILL: no goodbye to any connection
        self.proc.wait(30)
        self._reader.join(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self._reader.join(30)

    def in_flight(self) -> set[str]:
        """The calls it started and never ended."""
        started = {ln.split()[1] for ln in self.lines if ln.startswith("start ")}
        return started - {ln.split()[1] for ln in self.lines if ln.startswith("end ")}


def _complete(status: int, data: bytes, stream: bool) -> bool:
    """Whether a call's answer is whole: 200 and a parsed completion, or a stream that ends
    with ``[DONE]``."""
    if status != 200:
        return False
    if stream:
        return data.endswith(b"data: [DONE]\n\n")
    try:
        return bool(json.loads(data)["choices"])
    except (ValueError, KeyError):
        return False


async def _drive(url: str, victim: ReplicaProcess) -> tuple[list[dict[str, Any]], float]:
    """``CALLS`` calls from ``WORKERS`` clients, odd ones streamed; ``victim`` is killed once
    ``KILL_AFTER`` have ended. Each call's id, times and whether it came back whole; and when
    the victim was dead (monotonic)."""
    done: list[dict[str, Any]] = []
    todo = iter(range(CALLS))
    dead_at: list[float] = []
    killed = asyncio.Event()

    async def worker(s: aiohttp.ClientSession) -> None:
        for i in todo:
            stream = i % 2 == 1
            t0 = time.monotonic()
            try:
                async with s.post(url + "/v1/chat/completions",
                                  json={"model": "gen", "messages": [], "stream": stream,
                                        "user": f"k{i}"},
                                  headers={"X-Scepsy-Workflow": "rag",
                                           "X-Scepsy-Request": f"k{i}"}) as r:
                    ok = _complete(r.status, await r.read(), stream)
            except aiohttp.ClientError:
                ok = False
            done.append({"id": f"k{i}", "start": t0, "end": time.monotonic(), "ok": ok})
            if len(done) == KILL_AFTER:
                killed.set()

    async def killer() -> None:
        await killed.wait()
        await asyncio.to_thread(victim.kill)
        dead_at.append(time.monotonic())

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        await asyncio.gather(killer(), *(worker(s) for _ in range(WORKERS)))
    return done, dead_at[0]


def test_a_replica_killed_mid_run_costs_at_most_the_calls_in_flight_on_it(tmp_path):
    a = ReplicaProcess("--delay", "0.05", "--chunks", "4", "--chunk-s", "0.02")
    b = ReplicaProcess("--delay", "0.05", "--chunks", "4", "--chunk-s", "0.02")
    try:
        doc = {"version": 1, "workflows": {"rag": {"gen": [
            {"url": r.v1, "model": "gen", "weight": 0.5, "replica": i}
            for i, r in enumerate((a, b))]}}}
        cfg = GatewayConfig(record=RecordConfig(out=tmp_path / "trace.jsonl", routed=True,
                                                client_time=False, retries=1),
                            routes=parse_routes(doc, "routes"),
                            health=HealthCheck(interval_s=0.05, timeout_s=0.5))
        with gateway_in_thread(cfg) as url:
            done, dead_at = asyncio.run(_drive(url, a))
            end = time.monotonic() + 20  # a deadline, not a timing assertion
            while httpx.get(url + "/scepsy/state", timeout=10).json()["endpoints"][0][
                    "healthy"]:
                assert time.monotonic() < end
                time.sleep(0.02)
            state = httpx.get(url + "/scepsy/state", timeout=10).json()
    finally:
        a.close()
        b.close()
    in_flight = a.in_flight()
    failed = {c["id"] for c in done if not c["ok"]}
    after = [c for c in done if c["start"] > dead_at]
    assert len(done) == CALLS and len(after) >= CALLS // 4, len(after)
    assert failed <= in_flight, (failed, in_flight)  # only calls in flight on the victim
    assert len(in_flight) <= WORKERS
    assert all(c["ok"] for c in after)  # every later call succeeded
    rows = {e["url"]: e for e in state["endpoints"]}
    assert rows[a.v1]["healthy"] is False and rows[b.v1]["healthy"] is True
    assert rows[a.v1]["in_flight"] == rows[b.v1]["in_flight"] == 0
    trace = read_trace(tmp_path / "trace.jsonl").calls
    assert len(trace) == CALLS
    assert sum(c.error is not None for c in trace) == len(failed)
