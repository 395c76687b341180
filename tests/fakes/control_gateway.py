"""A loopback stand-in for the gateway's admin API (scepsy_serve.gateway):
``PUT /scepsy/routes`` (kept, versioned, recorded in ``events``), ``GET /scepsy/state`` (every
routed URL and every URL of ``in_flight`` with its calls in flight) and ``GET /metrics``
(``scepsy_gateway_requests_total{workflow}``, raised by :meth:`add_requests`)."""

from __future__ import annotations

import threading
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest

from fakes.loop_thread import LoopThreadServer


class FakeGateway(LoopThreadServer):
    def __init__(self, events: list[tuple[str, Any]] | None = None, *, refuse: bool = False,
                 per_second: dict[str, float] | None = None) -> None:
        super().__init__()
        self.events = events if events is not None else []
        self.version = 0
        self.routes: dict[str, Any] | None = None
        self.in_flight: dict[str, list[int]] = {}
        """URL -> calls in flight at each successive GET /scepsy/state (the last one stays)."""
        self.refuse = refuse
        self.per_second = per_second or {}
        """workflow -> requests added per second of wall time (a rising counter)."""
        self._reg = CollectorRegistry()
        self._requests = Counter("scepsy_gateway_requests", "new workflow requests",
                                 ["workflow"], registry=self._reg)
        self._lock = threading.Lock()
        self._last: float | None = None

    def add_requests(self, workflow: str, n: float) -> None:
        with self._lock:
            self._requests.labels(workflow=workflow).inc(n)

    async def _put_routes(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.refuse:
            self.events.append(("routes-refused", body))
            return web.json_response({"error": "no"}, status=400)
        self.version += 1
        self.routes = body
        self.events.append(("routes", body))
        return web.json_response({"version": self.version})

    async def _state(self, _: web.Request) -> web.Response:
        rows = []
        urls: set[str] = set()
        for wf, llms in ((self.routes or {}).get("workflows") or {}).items():
            for llm, eps in llms.items():
                for e in eps:
                    urls.add(e["url"])
                    rows.append({"workflow": wf, "llm": llm, "url": e["url"],
                                 "model": e["model"], "weight": e["weight"],
                                 "in_flight": self._flight(e["url"], pop=False),
                                 "calls": 0, "failed": 0})
        for url in self.in_flight:
            n = self._flight(url, pop=True)
            self.events.append(("state", (url, n)))
            if url not in urls and n > 0:
                rows.append({"workflow": "w", "llm": "m", "url": url, "model": None,
                             "weight": 0.0, "in_flight": n, "calls": 0, "failed": 0})
        return web.json_response({"version": self.version, "endpoints": rows, "workflows": {}})

    def _flight(self, url: str, pop: bool) -> int:
        seq = self.in_flight.get(url)
        if not seq:
            return 0
        return seq.pop(0) if pop and len(seq) > 1 else seq[0]

    async def _metrics(self, _: web.Request) -> web.Response:
        import time

        with self._lock:
            now = time.monotonic()
            if self._last is not None:
                for wf, r in self.per_second.items():
                    self._requests.labels(workflow=wf).inc(r * (now - self._last))
            self._last = now
            text = generate_latest(self._reg).decode()
        return web.Response(text=text, content_type="text/plain")

    async def _serve(self) -> None:
        import asyncio

        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_put("/scepsy/routes", self._put_routes)
        app.router.add_get("/scepsy/state", self._state)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()
