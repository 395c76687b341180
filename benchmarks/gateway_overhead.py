"""What the routing gateway (``scepsy gateway``) adds to a call: the same client sends N
sequential calls to a fast loopback upstream directly and through the gateway (the real command,
in its own process, routes of two endpoints, ``--priority las``, its default health checks and
outlier detection on), non-streamed and streamed; the overhead is the gateway's median (p90)
minus the direct one, and the ratio of the two medians; the CPU time the gateway process
spends per call is measured too (it depends less than latency on how busy the machine is).
The plain recording proxy (``scepsy record --upstream``) runs beside it, so the table also
shows what routing adds to
recording, and the same gateway on asyncio's own event loop (``routed_asyncio``) runs beside them
too, so the table shows what uvloop (the loop ``scepsy gateway`` runs on where it is installed)
changes.

    python benchmarks/gateway_overhead.py [--calls 2000] [--warmup 200] [--out FILE.json]

Target: under 1 ms median overhead per call on loopback. Prints a table and writes the figures
as JSON to ``--out`` (default results/gateway_overhead.json). The upstream (one aiohttp server
listening on two ports: the two endpoints) runs in a process of its own, the client (aiohttp,
one pooled session) in this one; direct and routed calls alternate in blocks so that a change in
the machine's load hits both. The calls of one block belong to one workflow request, so LAS
sees its attained service grow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from proxy_overhead import answer_handler
from scepsy_opt.traces import read_trace

TARGET_MS = 1.0
BLOCK = 10
"""Calls per block; direct, proxy and gateway blocks alternate (small blocks: a burst of
other work on the machine hits all three alike)."""


def _upstream(port_q: mp.Queue, chunks: int) -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": chunks}
    body = json.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello " * chunks},
         "finish_reason": "stop"}], "usage": usage}).encode()
    stream = b"".join(b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk",
                                              "choices": [{"index": 0, "delta": {
                                                  "content": "hello "}}]}).encode() + b"\n\n"
                      for _ in range(chunks))
    usage_event = b"data: " + json.dumps({"id": "x", "choices": [], "usage": usage}).encode() \
        + b"\n\n"

    answer = answer_handler(body, stream, usage_event)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/health":  # the gateway's probes
            return web.Response(status=200)
        return await answer(request)

    async def main() -> None:
        runner = web.ServerRunner(web.Server(handle, access_log=None))
        await runner.setup()
        ports = []
        for _ in range(2):
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        port_q.put(ports)
        await asyncio.Event().wait()

    asyncio.run(main())


async def _one(session: aiohttp.ClientSession, url: str, stream: bool, rid: str) -> float:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "stream": stream}
    t0 = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers={"X-Scepsy-Request": rid,
                                     "X-Scepsy-Workflow": "bench"}) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"status {r.status}: {await r.text()}")
    return time.perf_counter() - t0


async def _measure(urls: dict[str, str], calls: int, warmup: int,
                   stream: bool) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in urls}
    async with aiohttp.ClientSession() as session:
        for url in urls.values():
            for i in range(warmup):
                await _one(session, url, stream, f"warm-{stream:d}-{i // BLOCK}")
        block = 0
        while len(out["routed"]) < calls:
            block += 1
            for name, url in urls.items():
                for _ in range(min(BLOCK, calls - len(out[name]))):
                    out[name].append(await _one(session, url, stream, f"b-{stream:d}-{block}"))
    return out


ON_ASYNCIO = ("import sys; import scepsy_serve.gateway as g; g.loop_factory = lambda: None; "
              "from scepsy.cli import main; raise SystemExit(main(sys.argv[1:]))")
"""``scepsy`` with the gateway on asyncio's own event loop instead of uvloop's."""


def _start(argv: list[str], env: dict[str, str],
           asyncio_loop: bool = False) -> tuple[subprocess.Popen, str]:
    """``scepsy ARGV`` in its own process (``asyncio_loop``: the gateway on asyncio's loop,
    not uvloop's); it and the URL of its start-up line."""
    how = ["-c", ON_ASYNCIO] if asyncio_loop else ["-m", "scepsy.cli"]
    proc = subprocess.Popen([sys.executable, *how, *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"scepsy {argv[0]} did not start: {line}")
    return proc, line.split("listening on ")[1].split(";")[0]


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _q(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q * 100) - 1]


def _table(rows: list[dict]) -> str:
    cols = list(rows[0])
    width = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, width, strict=True))]
    lines += ["  ".join(str(r[c]).ljust(w) for c, w in zip(cols, width, strict=True))
              for r in rows]
    return "\n".join(lines)


def _gateway_overhead(url: str) -> dict[str, float]:
    """The gateway's own histogram: mean time from a call's arrival to its endpoint choice."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    vals = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("scepsy_gateway_overhead_seconds_")}
    n = vals.get("scepsy_gateway_overhead_seconds_count", 0.0)
    return {"calls": n, "mean_ms": round(1e3 * vals["scepsy_gateway_overhead_seconds_sum"] / n,
                                         4) if n else float("nan")}


def _routing_us(priority: str, n: int = 20_000) -> float:
    """The gateway's own work per call, in this process, microseconds: choose the endpoint,
    set the priority, serialise the body again, count it in flight and release it (no network;
    the counts at its end are left out)."""
    from types import SimpleNamespace

    from multidict import CIMultiDict

    from scepsy_opt.ingest.record import Call, RecordConfig, Upstream
    from scepsy_serve.gateway import Gateway, GatewayConfig
    from scepsy_serve.launch.routes import parse_routes

    doc = {"version": 1, "workflows": {"bench": {"m": [
        {"url": f"http://127.0.0.1:{p}/v1", "model": "m", "weight": 0.5} for p in (1, 2)]}}}
    with tempfile.TemporaryDirectory() as tmp:
        gw = Gateway(GatewayConfig(record=RecordConfig(out=Path(tmp) / "t.jsonl", routed=True),
                                   routes=parse_routes(doc, "routes"),
                                   priority=priority))  # type: ignore[arg-type]
        req = SimpleNamespace(headers=CIMultiDict({"X-Scepsy-Workflow": "bench"}))
        body0 = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        t0 = time.perf_counter()
        for i in range(n):
            call = Call("bench", f"r{i // 10}", f"c{i % 10}", "m", None, 0.0, False)
            body = dict(body0)
            up = gw.upstream(req, body, call, ())  # type: ignore[arg-type]
            assert isinstance(up, Upstream) and up.release is not None
            if up.changed:
                json.dumps(body).encode()
            up.release()
        return 1e6 * (time.perf_counter() - t0) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--chunks", type=int, default=8, help="chunks of the streamed answer")
    ap.add_argument("--priority", choices=("fcfs", "las"), default="las")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parents[1] / "results"
                    / "gateway_overhead.json")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when the median overhead is over the target")
    args = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    port_q: mp.Queue = ctx.Queue()
    up = ctx.Process(target=_upstream, args=(port_q, args.chunks), daemon=True)
    up.start()
    ports = port_q.get(timeout=60)
    direct = f"http://127.0.0.1:{ports[0]}"
    rows, raw = [], {}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        routes = Path(tmp) / "routes.json"
        routes.write_text(json.dumps({"version": 1, "workflows": {"bench": {"m": [
            {"url": f"http://127.0.0.1:{p}/v1", "model": "m", "weight": 0.5, "replica": i}
            for i, p in enumerate(ports)]}}}))
        trace = Path(tmp) / "trace.jsonl"
        src = str(Path(__file__).resolve().parents[1] / "src")
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH"))
                                             if p)}
        procs: list[subprocess.Popen] = []
        try:
            gw, routed = _start(["gateway", "--listen", "127.0.0.1:0", "--routes", str(routes),
                                 "--priority", args.priority, "--out", str(trace)], env)
            procs.append(gw)
            gw_asyncio, routed_asyncio = _start(
                ["gateway", "--listen", "127.0.0.1:0", "--routes", str(routes), "--priority",
                 args.priority, "--out", str(Path(tmp) / "asyncio.jsonl")], env,
                asyncio_loop=True)
            procs.append(gw_asyncio)
            rec, recorded_url = _start(["record", "--listen", "127.0.0.1:0", "--upstream",
                                        direct, "--out", str(Path(tmp) / "plain.jsonl")], env)
            procs.append(rec)
            urls = {"direct": direct, "record": recorded_url, "routed": routed,
                    "routed_asyncio": routed_asyncio}
            gateways = (("record", rec), ("routed", gw), ("routed_asyncio", gw_asyncio))
            for stream in (False, True):
                kind = "streaming" if stream else "non-streaming"
                print(f"{kind}: {args.calls} calls each way after {args.warmup} warm-up",
                      file=sys.stderr, flush=True)
                cpu0 = {k: _cpu_s(proc.pid) for k, proc in gateways}
                res = asyncio.run(_measure(urls, args.calls, args.warmup, stream))
                n = args.calls + args.warmup
                cpu = {k: 1e3 * (_cpu_s(proc.pid) - cpu0[k]) / n
                       for k, proc in gateways}
                raw[kind] = res
                d, r, p = res["direct"], res["record"], res["routed"]
                med = {k: statistics.median(v) for k, v in res.items()}
                rows.append({
                    "kind": kind, "calls": args.calls,
                    "direct_p50_ms": round(1e3 * med["direct"], 3),
                    "routed_p50_ms": round(1e3 * med["routed"], 3),
                    "overhead_p50_ms": round(1e3 * (med["routed"] - med["direct"]), 3),
                    "ratio_p50": round(med["routed"] / med["direct"], 3),
                    "overhead_p90_ms": round(1e3 * (_q(p, 0.9) - _q(d, 0.9)), 3),
                    "record_overhead_p50_ms": round(1e3 * (med["record"] - med["direct"]), 3),
                    "routing_over_record_p50_ms": round(1e3 * (med["routed"] - med["record"]),
                                                        3),
                    "record_overhead_p90_ms": round(1e3 * (_q(r, 0.9) - _q(d, 0.9)), 3),
                    "record_cpu_ms_per_call": round(cpu["record"], 3),
                    "gateway_cpu_ms_per_call": round(cpu["routed"], 3),
                    "asyncio_overhead_p50_ms": round(
                        1e3 * (med["routed_asyncio"] - med["direct"]), 3),
                    "asyncio_cpu_ms_per_call": round(cpu["routed_asyncio"], 3)})
            own = _gateway_overhead(routed)
        finally:
            for proc in procs:
                proc.terminate()
                proc.communicate(timeout=60)
            up.terminate()
        recorded = sum(c.llm is not None for c in read_trace(trace).calls) \
            if trace.exists() else 0  # LLM calls, not the client's time between them
    expected = 2 * (args.calls + args.warmup)
    print(_table(rows))
    routing_us = _routing_us(args.priority)
    print(f"\ngateway's routing work per call, in process (choice, priority, body, counts): "
          f"{routing_us:.1f} us")
    print(f"gateway's own time to route a call (arrival to endpoint chosen): "
          f"{own['mean_ms']} ms mean over {own['calls']:.0f} calls")
    print(f"calls recorded by the gateway: {recorded} (expected {expected}); priority "
          f"{args.priority}; {os.cpu_count()} cores, 1-min load average {load_before:.1f} "
          f"before, {os.getloadavg()[0]:.1f} after")
    met = all(r["overhead_p50_ms"] < TARGET_MS for r in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "rows": rows, "target_p50_ms": TARGET_MS, "target_met": met,
        "gateway_route_mean_ms": own["mean_ms"], "routing_us_per_call": round(routing_us, 2), "recorded": recorded, "expected": expected,
        "calls": args.calls, "warmup": args.warmup, "chunks": args.chunks,
        "priority": args.priority, "block": BLOCK, "cores": os.cpu_count(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python benchmarks/gateway_overhead.py " + " ".join(argv or sys.argv[1:]),
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "samples_ms": {k: {n: [round(1e3 * x, 4) for x in v] for n, v in r.items()}
                       for k, r in raw.items()}}, indent=1) + "\n")
    print(f"wrote {args.out}")
    ok = recorded == expected and (met or not args.strict)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
