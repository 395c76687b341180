"""A loopback fake of one vLLM replica behind the gateway (aiohttp): ``GET /health`` answers
``health_status`` (200 unless changed), ``POST /v1/chat/completions`` answers ``status``
(200: a chat completion, or a stream of ``chunks`` chunks ``chunk_s`` apart when asked) after
``delay_s``. Settable while it runs, so a test can make a replica sick and well again.

Two ways to run it:

* in this process, on a thread: ``with Replica(status=500) as r: r.v1``; ``r.calls`` counts
  the completions it received, ``r.probes`` the health probes;
* as a process of its own (``python tests/fakes/openai_replica.py --delay 0.1``), so that a test
  can kill it for real: it prints ``port N`` once it listens, then ``start ID`` when a
  completion arrives and ``end ID`` once its last byte went out (``ID``: the body's
  ``user``; the gateway keeps ``X-Scepsy-*`` headers to itself), one line each, flushed: when it is killed, the calls it had
  started and not ended are those in flight on it (and perhaps one that had just ended).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from aiohttp import web

try:
    from fakes.loop_thread import LoopThreadServer
except ImportError:  # run as a script: tests/fakes is not a package on the path
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from fakes.loop_thread import LoopThreadServer

USAGE = {"prompt_tokens": 10, "completion_tokens": 4}


def handler(knobs: Any, say: Any = None) -> Any:
    """The request handler over ``knobs`` (``status``, ``health_status``, ``delay_s``,
    ``chunks``, ``chunk_s``, counters ``calls`` and ``probes``); ``say(line)`` is told of each
    completion's start and end."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/health":
            knobs.probes += 1
            return web.Response(status=knobs.health_status)
        if request.method != "POST":
            return web.json_response({"object": "list", "data": []})
        body = json.loads(await request.read())
        rid = body.get("user") or "-"
        knobs.calls += 1
        if say is not None:
            say(f"start {rid}")
        if knobs.delay_s:
            await asyncio.sleep(knobs.delay_s)
        if knobs.status != 200:
            resp = web.json_response({"error": {"message": "sick", "code": knobs.status}},
                                     status=knobs.status)
        elif body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for _ in range(knobs.chunks):
                chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                await asyncio.sleep(knobs.chunk_s)
            if (body.get("stream_options") or {}).get("include_usage"):
                await resp.write(b"data: " + json.dumps(
                    {"choices": [], "usage": USAGE}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        else:
            resp = web.json_response({"object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                "usage": USAGE})
        await resp.prepare(request)
        await resp.write_eof()
        if say is not None:
            say(f"end {rid}")
        return resp

    return handle


class Replica(LoopThreadServer):
    def __init__(self, status: int = 200, health_status: int = 200, delay_s: float = 0.0,
                 chunks: int = 2, chunk_s: float = 0.0) -> None:
        super().__init__()
        self.status, self.health_status, self.delay_s = status, health_status, delay_s
        self.chunks, self.chunk_s = chunks, chunk_s
        self.calls = 0
        self.probes = 0

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    async def _serve(self) -> None:
        runner = web.ServerRunner(web.Server(handler(self), access_log=None),
                                  shutdown_timeout=0.5)  # a sleeping handler is cut
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--chunk-s", type=float, default=0.02)
    args = ap.parse_args()
    knobs = argparse.Namespace(status=200, health_status=200, delay_s=args.delay,
                               chunks=args.chunks, chunk_s=args.chunk_s, calls=0, probes=0)

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    async def serve() -> None:
        runner = web.ServerRunner(web.Server(handler(knobs, say), access_log=None))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        say(f"port {site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
