"""What ``scepsy record`` adds to a call: the same client sends N sequential calls to a fast
loopback upstream directly and through the proxy (the real command, in its own process), for a
non-streaming chat call (a small fixed JSON answer) and a streamed one (a short stream of
chunks); the overhead is the proxied median (p90) minus the direct one.

    python benchmarks/proxy_overhead.py [--calls 2000] [--warmup 200] [--chunks 8]

Target: at most 2 ms median overhead per call on loopback. Prints a table and writes
results/proxy_overhead.json. The upstream runs in a process of its own, the client (aiohttp,
one pooled session) in this one; direct and proxied calls alternate in blocks so that a change
in the machine's load hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from _common import progress, table, write_results
from scepsy_opt.traces import read_trace

TARGET_MS = 2.0
BLOCK = 50
"""Calls per block; direct and proxied blocks alternate."""


# ------------------------------------------------------------------------------ the upstream


def _answer(chunks: int) -> tuple[bytes, bytes]:
    usage = {"prompt_tokens": 12, "completion_tokens": chunks, "total_tokens": 12 + chunks,
             "prompt_tokens_details": {"cached_tokens": 8}}
    body = json.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello " * chunks},
         "finish_reason": "stop"}], "usage": usage}).encode()
    events = [b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": "hello "}, "finish_reason": None}]}).encode() + b"\n\n"
        for _ in range(chunks)]
    stream = b"".join(events)
    return body, stream


def answer_handler(body: bytes, stream: bytes, usage: bytes) -> Any:
    """The fake upstream's request handler: ``body`` at once, or ``stream`` then the ``usage``
    event (when the call asks for it) and ``[DONE]`` (also the gateway benchmark's upstream)."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        req = json.loads(await request.read())
        if not req.get("stream"):
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(stream)
        opts = req.get("stream_options") or {}
        await resp.write((usage if opts.get("include_usage") else b"") + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    return handle


def _upstream(port_q: mp.Queue, chunks: int) -> None:
    body, stream = _answer(chunks)
    usage = b"data: " + json.dumps({"id": "x", "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": chunks}}).encode() + b"\n\n"
    handle = answer_handler(body, stream, usage)

    async def main() -> None:
        runner = web.ServerRunner(web.Server(handle, access_log=None))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_q.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


# ------------------------------------------------------------------------------ the client


async def _one(session: aiohttp.ClientSession, url: str, stream: bool) -> float:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "stream": stream}
    t0 = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers={"X-Scepsy-Request": "bench"}) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"status {r.status}")
    return time.perf_counter() - t0


async def _measure(direct: str, proxied: str, calls: int, warmup: int,
                   stream: bool) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"direct": [], "proxied": []}
    async with aiohttp.ClientSession() as session:
        for url in (direct, proxied):
            for _ in range(warmup):
                await _one(session, url, stream)
        while len(out["proxied"]) < calls:
            for name, url in (("direct", direct), ("proxied", proxied)):
                for _ in range(min(BLOCK, calls - len(out[name]))):
                    out[name].append(await _one(session, url, stream))
    return out


def _q(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q * 100) - 1] if q < 1 else \
        max(xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--chunks", type=int, default=8, help="chunks of the streamed answer")
    args = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    port_q: mp.Queue = ctx.Queue()
    up = ctx.Process(target=_upstream, args=(port_q, args.chunks), daemon=True)
    up.start()
    direct = f"http://127.0.0.1:{port_q.get(timeout=30)}"
    rows, raw = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.jsonl"
        proxy = subprocess.Popen(
            [sys.executable, "-m", "scepsy.cli", "record", "--listen", "127.0.0.1:0",
             "--upstream", direct, "--out", str(out)], stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            assert proxy.stderr is not None
            line = proxy.stderr.readline()  # the start-up line
            proxied = line.split("listening on ")[1].split(";")[0]
            for stream in (False, True):
                kind = "streaming" if stream else "non-streaming"
                progress(f"{kind}: {args.calls} calls each way after {args.warmup} warm-up")
                res = asyncio.run(_measure(direct, proxied, args.calls, args.warmup, stream))
                raw[kind] = res
                d, p = res["direct"], res["proxied"]
                rows.append({
                    "kind": kind, "calls": args.calls,
                    "direct_p50_ms": round(1e3 * statistics.median(d), 3),
                    "proxied_p50_ms": round(1e3 * statistics.median(p), 3),
                    "overhead_p50_ms": round(1e3 * (statistics.median(p) - statistics.median(d)),
                                             3),
                    "direct_p90_ms": round(1e3 * _q(d, 0.9), 3),
                    "proxied_p90_ms": round(1e3 * _q(p, 0.9), 3),
                    "overhead_p90_ms": round(1e3 * (_q(p, 0.9) - _q(d, 0.9)), 3),
                    "target_p50_ms": TARGET_MS})
        finally:
            proxy.terminate()
            proxy.communicate(timeout=60)
            up.terminate()
        recorded = sum(c.llm is not None for c in read_trace(out).calls)  # not client time
    expected = 2 * (args.calls + args.warmup)
    print(table(rows, list(rows[0])))
    print(f"\ncalls recorded by the proxy: {recorded} (expected {expected}); "
          f"{os.cpu_count()} cores")
    write_results("proxy_overhead", {"rows": rows, "recorded": recorded, "expected": expected,
                                     "calls": args.calls, "warmup": args.warmup,
                                     "chunks": args.chunks, "block": BLOCK,
                                     "samples_ms": {k: {n: [round(1e3 * x, 4) for x in v]
                                                        for n, v in r.items()}
                                                    for k, r in raw.items()}})
    ok = recorded == expected and all(r["overhead_p50_ms"] <= TARGET_MS for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
