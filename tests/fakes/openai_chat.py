"""A loopback fake of an OpenAI-compatible server with chat and text completions, streaming and
not, for the recording proxy's tests and benchmark (aiohttp, keep-alive, in a thread).

The answer to ``POST /v1/chat/completions`` and ``/v1/completions`` is ``max_tokens`` (default
3) tokens ``t0 t1 ...``; its usage says ``prompt_tokens`` = the words of the prompt (or the
length of a token-id prompt), ``completion_tokens`` = ``max_tokens`` and
``prompt_tokens_details.cached_tokens`` = half the prompt tokens. A stream is one role chunk
(chat; empty content), one chunk per token, a final chunk with ``finish_reason`` and empty
content, the usage-only chunk (``choices: []``) when ``stream_options.include_usage`` is true,
then ``data: [DONE]``. The request's ``model`` picks a behaviour:

* any other name: the normal answer;
* ``http503`` / ``http400``: that status with a JSON error;
* ``hang``: nothing for ``hang_s`` (a timeout fires first);
* ``stall``: a stream's first half, then nothing;
* ``cut``: a stream's first half, then the connection closes (no ``[DONE]``, no last chunk);
* ``slow``: a token every ``slow_s`` (to leave mid-stream);
* ``nousage``: never sends usage;
* ``linger``: a normal stream that stays open ``hang_s`` after ``data: [DONE]``;
* ``barrier``: answers only once ``barrier`` calls of this model are waiting (calls that
  provably overlap).

Every call is kept in ``requests`` (path, headers, body); ``disconnects`` counts the calls whose
client went away before the answer was complete. ``GET /v1/models`` and ``/health`` answer, any
other path echoes its method, path, query and body as JSON. ``name`` is sent back in the
``X-Fake-Name`` header (which server answered).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from fakes.loop_thread import LoopThreadServer


class FakeChatServer(LoopThreadServer):
    """``with FakeChatServer() as srv: srv.base_url``."""

    def __init__(self, name: str = "fake", *, hang_s: float = 30.0, slow_s: float = 0.05,
                 barrier: int = 4, slow_tokens: int = 200) -> None:
        super().__init__()
        self.name, self.hang_s, self.slow_s, self.barrier = name, hang_s, slow_s, barrier
        self.slow_tokens = slow_tokens
        self.requests: list[dict[str, Any]] = []
        self.disconnects = 0
        self._waiting = 0
        self._gate: asyncio.Event | None = None

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self._gate = asyncio.Event()
        loop = asyncio.get_running_loop()

        def request(message: Any, payload: Any, protocol: Any, writer: Any,
                    task: Any) -> web.BaseRequest:  # bodies up to 64 MiB
            return web.BaseRequest(message, payload, protocol, writer, task, loop,
                                   client_max_size=64 << 20)

        server = web.Server(self._handle, request_factory=request, handler_cancellation=True,
                            access_log=None)
        runner = web.ServerRunner(server)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    # -- HTTP -------------------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        raw = await request.read()
        if request.method == "GET" and request.path == "/health":
            return web.Response(status=200)
        if request.method == "GET" and request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]},
                                     headers={"X-Fake-Name": self.name})
        if request.method != "POST" or request.path not in ("/v1/chat/completions",
                                                            "/v1/completions"):
            return web.json_response({"method": request.method, "path": request.path,
                                      "query": request.query_string,
                                      "body": raw.decode(errors="replace")},
                                     headers={"X-Fake-Name": self.name})
        body = json.loads(raw)
        self.requests.append({"path": request.path, "headers": dict(request.headers),
                              "body": body})
        try:
            return await self._complete(request, body, request.path == "/v1/chat/completions")
        except (asyncio.CancelledError, ConnectionError):
            self.disconnects += 1
            raise

    async def _complete(self, request: web.BaseRequest, body: dict[str, Any],
                        chat: bool) -> web.StreamResponse:
        mode = str(body.get("model", ""))
        n = int(body.get("max_tokens", 3))
        if mode == "slow":
            n = max(n, self.slow_tokens)
        if mode in ("http503", "http400"):
            return web.json_response({"error": {"message": "fake", "code": int(mode[4:])}},
                                     status=int(mode[4:]))
        if mode == "hang":
            await asyncio.sleep(self.hang_s)
        if mode == "barrier":
            await self._barrier()
        usage = None if mode == "nousage" else self.usage(body, chat, n)
        headers = {"X-Fake-Name": self.name}
        if body.get("stream") is not True:
            text = "".join(f"t{i} " for i in range(n))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": text, "finish_reason": "length"})
            doc: dict[str, Any] = {"id": "x1", "object": "chat.completion" if chat else
                                   "text_completion", "model": mode, "choices": [choice]}
            if usage is not None:
                doc["usage"] = usage
            return web.json_response(doc, headers=headers)
        resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for chunk in self.chunks(body, chat, n, usage):
            if mode == "cut" and chunk is self._CUT:
                assert request.transport is not None
                request.transport.close()
                return resp
            if mode == "stall" and chunk is self._CUT:
                await asyncio.sleep(self.hang_s)
            if chunk is self._CUT:
                continue
            await resp.write(chunk)
            if mode == "slow":
                await asyncio.sleep(self.slow_s)
        if mode == "linger":
            await asyncio.sleep(self.hang_s)
        await resp.write_eof()
        return resp

    async def _barrier(self) -> None:
        assert self._gate is not None
        self._waiting += 1
        if self._waiting >= self.barrier:
            self._gate.set()
        await self._gate.wait()
        self._waiting -= 1
        if self._waiting == 0:
            self._gate = asyncio.Event()

    _CUT = b""

    @staticmethod
    def usage(body: dict[str, Any], chat: bool, n: int) -> dict[str, Any]:
        """The usage the fake reports for ``body``."""
        if chat:
            prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        else:
            p = body.get("prompt", "")
            prompt = len(p) if isinstance(p, list) else len(str(p).split())
        return {"prompt_tokens": prompt, "completion_tokens": n,
                "total_tokens": prompt + n,
                "prompt_tokens_details": {"cached_tokens": prompt // 2}}

    def chunks(self, body: dict[str, Any], chat: bool, n: int,
               usage: dict[str, Any] | None) -> list[bytes]:
        """The SSE events of a streamed answer; ``_CUT`` marks the middle (where ``cut``
        closes and ``stall`` stops)."""
        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            doc = {"id": "x1", "object": "chat.completion.chunk" if chat else "text_completion",
                   "model": body.get("model"), "choices": choices, **extra}
            return b"data: " + json.dumps(doc).encode() + b"\n\n"

        def piece(text: str, finish: str | None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"content": text} if text or finish is None
                        else {}, "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish}

        out: list[bytes] = []
        if chat:
            out.append(event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                               "finish_reason": None}]))
        for i in range(n):
            if i == max(1, n // 2):
                out.append(self._CUT)
            out.append(event([piece(f"t{i} ", None)]))
        out.append(event([piece("", "length")]))
        opts = body.get("stream_options")
        if usage is not None and isinstance(opts, dict) and opts.get("include_usage") is True:
            out.append(event([], usage=usage))
        out.append(b"data: [DONE]\n\n")
        return out
