"""A loopback fake of an OpenAI-compatible completions server, for the replay client's error paths
and the rate sweep's control logic (the real ``vllm serve`` is tested beside it).

Standard library only (asyncio streams, HTTP/1.1, one response per connection). The request's
``model`` field picks the behaviour:

* ``normal``: a stream of one chunk per token, ``[DONE]``; the call waits for one of ``slots``
  service slots, then takes ``prefill_s`` to its first token and ``token_s`` per further token, so
  the server saturates at about ``slots / (prefill_s + (O − 1)·token_s)`` calls/s;
* ``http500`` / ``http400``: that status with a JSON error;
* ``malformed``: a 200 stream whose first data line is not JSON;
* ``not_sse``: a 200 stream with a line that is not ``data:``;
* ``stall``: the first token, then nothing (the client's stall timeout fires);
* ``hang``: no response at all (the client's read timeout fires before any status);
* ``short``: half the tokens, then ``[DONE]``;
* ``truncate``: half the tokens, then the connection closes mid-body.

``GET /health`` answers 200; ``GET /metrics`` answers vLLM's histogram names in the Prometheus
text format, kept by the ``normal`` calls (sum, count and buckets of e2e, TTFT, inter-token,
queue, prefill and decode times; running and waiting gauges).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from typing import Any

from fakes.loop_thread import LoopThreadServer

BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
HISTOGRAMS = ("vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds",
              "vllm:inter_token_latency_seconds", "vllm:request_queue_time_seconds",
              "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
              "vllm:request_num_preemptions")


class FakeOpenAIServer(LoopThreadServer):
    """Run with ``with FakeOpenAIServer(...) as srv: srv.base_url``; a thread serves it."""

    def __init__(self, *, slots: int = 4, prefill_s: float = 0.005, token_s: float = 0.002,
                 hang_s: float = 30.0) -> None:
        super().__init__()
        self.slots, self.prefill_s, self.token_s, self.hang_s = slots, prefill_s, token_s, hang_s
        self.requests: list[dict[str, Any]] = []
        self._sem: asyncio.Semaphore | None = None
        self._hist_sum: dict[str, float] = defaultdict(float)
        self._hist_count: dict[str, int] = defaultdict(int)
        self._hist_buckets: dict[str, list[int]] = defaultdict(lambda: [0] * len(BUCKETS))
        self.running = 0
        self.waiting = 0

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self._sem = asyncio.Semaphore(self.slots)
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            # end the calls still open (a hanging or stalled one) before the loop closes
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

    # -- HTTP -------------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip()
                       for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method == "GET" and path == "/health":
                await self._plain(writer, 200, b"")
            elif method == "GET" and path == "/metrics":
                await self._plain(writer, 200, self.metrics_text().encode(), "text/plain")
            elif method == "POST" and path == "/v1/completions":
                req = json.loads(body)
                self.requests.append(req)
                await self._complete(writer, req)
            else:
                await self._plain(writer, 404, b'{"error": "not found"}')
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _plain(writer: asyncio.StreamWriter, status: int, body: bytes,
                     ctype: str = "application/json") -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: "
                     f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()

    @staticmethod
    async def _chunk(writer: asyncio.StreamWriter, data: str) -> None:
        raw = data.encode()
        writer.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
        await writer.drain()

    async def _event(self, writer: asyncio.StreamWriter, obj: Any) -> None:
        await self._chunk(writer, "data: " + (obj if isinstance(obj, str) else json.dumps(obj))
                          + "\n\n")

    @staticmethod
    def _token(i: int) -> dict[str, Any]:
        return {"choices": [{"index": 0, "text": "", "token_ids": [100 + i],
                             "finish_reason": None}]}

    async def _complete(self, writer: asyncio.StreamWriter, req: dict[str, Any]) -> None:
        mode = str(req.get("model", "normal"))
        n = int(req.get("max_tokens", 16))
        if mode in ("http500", "http400"):
            await self._plain(writer, int(mode[4:]), b'{"error": "fake"}')
            return
        if mode == "hang":
            await asyncio.sleep(self.hang_s)
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        await writer.drain()
        if mode == "malformed":
            await self._event(writer, "{not json")
        elif mode == "not_sse":
            await self._chunk(writer, "hello there\n\n")
        elif mode == "stall":
            await self._event(writer, self._token(0))
            await asyncio.sleep(self.hang_s)
            return
        elif mode in ("short", "truncate"):
            for i in range(max(n // 2, 1) if n > 1 else 0):
                await self._event(writer, self._token(i))
            if mode == "truncate":
                return  # closes without the terminating chunk
        else:
            await self._normal(writer, n)
        await self._event(writer, "[DONE]")
        await self._chunk(writer, "")

    async def _normal(self, writer: asyncio.StreamWriter, n: int) -> None:
        assert self._sem is not None
        t0 = time.perf_counter()
        self.waiting += 1
        async with self._sem:
            self.waiting -= 1
            self.running += 1
            t_start = time.perf_counter()
            try:
                await asyncio.sleep(self.prefill_s)
                await self._event(writer, self._token(0))
                t_first = time.perf_counter()
                last = t_first
                for i in range(1, n):
                    await asyncio.sleep(self.token_s)
                    await self._event(writer, self._token(i))
                    now = time.perf_counter()
                    self._observe("vllm:inter_token_latency_seconds", now - last)
                    last = now
            finally:
                self.running -= 1
        end = time.perf_counter()
        self._observe("vllm:request_queue_time_seconds", t_start - t0)
        self._observe("vllm:time_to_first_token_seconds", t_first - t0)
        self._observe("vllm:request_prefill_time_seconds", t_first - t_start)
        self._observe("vllm:request_decode_time_seconds", end - t_first)
        self._observe("vllm:e2e_request_latency_seconds", end - t0)
        self._observe("vllm:request_num_preemptions", 0.0)
        await self._event(writer, {"choices": [{"index": 0, "text": "", "token_ids": [],
                                                "finish_reason": "length"}],
                                   "usage": {"completion_tokens": n}})

    def _observe(self, name: str, value: float) -> None:
        self._hist_sum[name] += value
        self._hist_count[name] += 1
        for j, le in enumerate(BUCKETS):
            if value <= le:
                self._hist_buckets[name][j] += 1

    def metrics_text(self) -> str:
        """The Prometheus exposition of the fake's metrics (vLLM's names and labels)."""
        lab = 'engine="0",model_name="fake"'
        out = ["# HELP vllm:num_requests_running Running.", "# TYPE vllm:num_requests_running gauge",
               f"vllm:num_requests_running{{{lab}}} {float(self.running)}",
               "# TYPE vllm:num_requests_waiting gauge",
               f"vllm:num_requests_waiting{{{lab}}} {float(self.waiting)}"]
        for name in HISTOGRAMS:
            out.append(f"# TYPE {name} histogram")
            for le, c in zip(BUCKETS, self._hist_buckets[name], strict=True):
                out.append(f'{name}_bucket{{{lab},le="{le}"}} {float(c)}')
            out.append(f'{name}_bucket{{{lab},le="+Inf"}} {float(self._hist_count[name])}')
            out.append(f"{name}_count{{{lab}}} {float(self._hist_count[name])}")
            out.append(f"{name}_sum{{{lab}}} {self._hist_sum[name]}")
        return "\n".join(out) + "\n"
