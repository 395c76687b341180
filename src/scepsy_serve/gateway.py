"""The routing gateway: in front of every replica of a deployment, it forwards each call by the
routing table (``routes.json``, :mod:`scepsy_serve.launch.routes`) and records the trace as
``scepsy record`` does (docs/gateway.md). A :class:`Gateway` owns a recording proxy
(:class:`~scepsy_opt.ingest.record.RecordingProxy`) and is its
:class:`~scepsy_opt.ingest.record.Router`: the proxy forwards and records, the gateway chooses
the endpoint of each attempt and answers its admin API.

Routing. A call's LLM is its body's ``model`` through the trace map (else the model name itself);
its workflow is the ``X-Scepsy-Workflow`` header. The candidates are that workflow's endpoints of
that LLM; without the header, or for a workflow the table does not route that LLM for, the
endpoints of that LLM over every workflow that routes it (one workflow: its own; several: the
union, one entry per URL with the mean of its weights). Among the candidates of weight > 0 the
call goes to the one that minimises ``(in_flight + 1) / weight`` (least loaded relative to its
share; in-flight calls are counted per URL, over all workflows); ties go to the one with the
fewest calls so far relative to its weight, then to the first in table order
(:func:`choose`). The body's ``model`` becomes the endpoint's ``model`` when they differ; the
body is serialised again only when something in it changed.

Priorities (``priority="las"``): a request's attained service is the prompt plus output tokens
of its finished calls (usage as recorded); each call's body gets ``"priority"`` =
:func:`~scepsy_opt.prediction.priority.las_level` of its request's attained service (vLLM
honours it under ``--scheduling-policy priority``). ``fcfs`` leaves the body alone. A request's
state (its attained service, and the calls the recorder keeps to infer the parents of its next
call) is forgotten once it has had no call in flight and no new call for ``request_idle_s``
seconds, so memory stays bounded by the requests active in that window (plus one call counter
per request id, which keeps the trace's call ids unique).

Live reload: ``PUT /scepsy/routes`` with a routes document, :meth:`Gateway.reload_file` (the
CLI calls it on SIGHUP) and a poll of the routes file's modification time every ``poll_s``
seconds swap the table in one assignment: a call already routed finishes where it is; a bad
table is refused (400, or one log line) and the old one kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from scepsy_common.errors import InputError
from scepsy_common.httpguard import BodyRefused, ClientGone, one_line_logger, read_body
from scepsy_opt.ingest.record import (
    HEADER_WORKFLOW,
    Call,
    NoUpstream,
    ProxyURL,
    RecordConfig,
    RecordingProxy,
    RecordStats,
    Upstream,
    Usage,
    json_error,
    normalize_upstream,
    proxy_in_thread,
    serve,
)
from scepsy_opt.prediction.priority import PRIORITY_POLICIES, PriorityPolicy, las_level
from scepsy_serve.launch.routes import Routes, load_routes, parse_routes

__all__ = ["Gateway", "GatewayConfig", "choose", "choose_live", "gateway_in_thread",
           "serve_gateway"]

ROUTES_PATH = "/scepsy/routes"
STATE_PATH = "/scepsy/state"
METRICS_PATH = "/metrics"
REQUEST_IDLE_S = 600.0
"""How long a request's state (its attained service, the calls that give the parents of its
next one) is kept after its last call, s."""
POLL_S = 1.0
"""How often the routes file's modification time is checked, s."""
EJECT_S = 5.0
"""How long an endpoint that refused a connection (nothing listens there) gets no call while
its LLM has another endpoint that did not, s; then one call tries it again."""
MAX_ROUTES_BYTES = 16 * 1024 * 1024
_LOG = one_line_logger("scepsy gateway")


def choose(weights: Sequence[float], in_flight: Sequence[int],
           sent: Sequence[int] | None = None) -> int | None:
    """The index of the endpoint a call goes to: among those of weight > 0, the one that
    minimises ``(in_flight + 1) / weight``; ties: the fewest ``sent`` calls relative to the
    weight, then the first. None when no endpoint has weight > 0."""
    best, best_load, best_sent = None, math.inf, math.inf
    for i, w in enumerate(weights):
        if not w > 0:
            continue
        load = (in_flight[i] + 1) / w
        s = sent[i] / w if sent is not None else 0.0
        if load < best_load or (load == best_load and s < best_sent):
            best, best_load, best_sent = i, load, s
    return best


def choose_live(weights: Sequence[float], in_flight: Sequence[int], sent: Sequence[int],
                tried: Sequence[bool], down: Sequence[bool]) -> int | None:
    """:func:`choose` among the endpoints this call has not tried and that are not ejected
    (``down``); without one, among those not tried; without one, among all (a connection lost
    at the only endpoint is tried again there). Weight 0 is never chosen."""
    if not any(tried) and not any(down):  # the common case: plain choose, no masks
        return choose(weights, in_flight, sent)
    for usable in ([not t and not d for t, d in zip(tried, down, strict=True)],
                   [not t for t in tried]):
        i = choose([w if u else 0.0 for w, u in zip(weights, usable, strict=True)],
                   in_flight, sent)
        if i is not None:
            return i
    return choose(weights, in_flight, sent)


# ------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class GatewayConfig:
    """A gateway: ``record`` (what it listens on and the trace it writes; ``routed=True``, no
    upstream), the first routing table, the file it is reloaded from (optional), the priority
    policy, how long a request's LAS state is kept after its last call and how often the file
    is checked for a change."""

    record: RecordConfig
    routes: Routes
    routes_file: Path | None = None
    priority: PriorityPolicy = "fcfs"
    request_idle_s: float = REQUEST_IDLE_S
    poll_s: float = POLL_S

    def __post_init__(self) -> None:
        rec = self.record
        if rec.upstream is not None or rec.upstream_for:
            raise InputError("--routes", "", "either --routes (the gateway) or --upstream / "
                             "--upstream-for (the plain proxy), not both")
        if not rec.routed:
            raise InputError("gateway config", "record.routed", "True (the gateway routes)",
                             rec.routed)
        if self.priority not in PRIORITY_POLICIES:
            raise InputError("--priority", "", " or ".join(PRIORITY_POLICIES), self.priority)
        for name in ("request_idle_s", "poll_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (
                    math.isfinite(v) and v > 0):
                raise InputError("gateway config", name, "a number of seconds > 0", v)
        if self.routes_file is not None:
            object.__setattr__(self, "routes_file", Path(self.routes_file))
        check_routes(self.routes, str(self.routes_file or "routes"))


# ------------------------------------------------------------------------------ the table


@dataclass(eq=False, slots=True)
class _Server:
    """One endpoint URL, across tables: its calls in flight, attempts sent, failed calls,
    attempts lost before an answer, and until when it is ejected (monotonic s)."""

    url: str
    base: str
    in_flight: int = 0
    calls: int = 0
    failed: int = 0
    lost: int = 0
    down_until: float = 0.0
    seen_as: tuple[str, str] = ("", "")  # (workflow, llm) it was last routed for


@dataclass(frozen=True, slots=True)
class _Choice:
    server: _Server
    weight: float
    model: str


@dataclass(frozen=True)
class _Table:
    version: int
    routes: Routes
    by_key: Mapping[tuple[str, str], tuple[_Choice, ...]]
    by_llm: Mapping[str, tuple[_Choice, ...]]
    default: str


def check_routes(routes: Routes, source: str) -> Routes:
    """``routes`` if the gateway can route by it (at least one endpoint), else an
    :class:`InputError`."""
    if not any(routes.workflows.values()):
        raise InputError(source, "workflows", "at least one workflow with an LLM and its "
                         "endpoints")
    return routes


def _compile(routes: Routes, version: int, servers: dict[str, _Server]) -> _Table:
    by_key: dict[tuple[str, str], tuple[_Choice, ...]] = {}
    union: dict[str, dict[str, list[Any]]] = {}  # llm -> url -> [server, weights, model]
    default = ""
    for wf, llms in routes.workflows.items():
        for llm, eps in llms.items():
            row = []
            for e in eps:
                srv = servers.get(e.url)
                if srv is None:
                    srv = servers[e.url] = _Server(e.url, normalize_upstream(e.url, "routes"))
                row.append(_Choice(srv, e.weight, e.model))
                u = union.setdefault(llm, {}).setdefault(e.url, [srv, [], e.model])
                u[1].append(e.weight)
                if not default and e.weight > 0:
                    default = srv.base
            by_key[(wf, llm)] = tuple(row)
    by_llm = {llm: tuple(_Choice(s, sum(ws) / len(ws), m) for s, ws, m in urls.values())
              for llm, urls in union.items()}
    return _Table(version, routes, by_key, by_llm, default)


# ------------------------------------------------------------------------------ the gateway


class Gateway:
    """Routes each call by the table (module docs) through the recording proxy it owns
    (``proxy``, whose :class:`~scepsy_opt.ingest.record.Router` it is); its admin API
    (``PUT /scepsy/routes``, ``GET /scepsy/state``, ``GET /metrics``) is on the same port:
    ``url = await gw.start()``, ``await gw.stop()``."""

    def __init__(self, config: GatewayConfig) -> None:
        self.gateway = config
        self.proxy = RecordingProxy(config.record, router=self)
        self._servers: dict[str, _Server] = {}
        self._table = _compile(config.routes, 1, self._servers)
        # per workflow request: [attained tokens, last seen (monotonic), calls in flight]
        self._active: dict[tuple[str, str], list[float]] = {}
        self._wf_counts: dict[str, list[int]] = {}  # workflow -> [requests, calls]
        self._file_sig: tuple[int, int, int] | None = self._signature()
        self._poller: asyncio.Task[None] | None = None
        self.registry = CollectorRegistry()
        r = self.registry
        self._m_requests = Counter("scepsy_gateway_requests", "New workflow requests",
                                   ["workflow"], registry=r)
        self._m_calls = Counter("scepsy_gateway_calls", "Finished LLM calls by status (ok or "
                                "the error kind)", ["workflow", "llm", "status"], registry=r)
        self._m_latency = Histogram("scepsy_gateway_call_latency_seconds",
                                    "LLM call latency as the gateway saw it",
                                    ["workflow", "llm"], registry=r,
                                    buckets=(.05, .1, .25, .5, 1, 2.5, 5, 10, 25, 60, 120, 300))
        self._m_in_flight = Gauge("scepsy_gateway_in_flight", "LLM calls in flight",
                                  ["llm", "url"], registry=r)
        self._m_lost = Counter("scepsy_gateway_lost_attempts", "Attempts lost before an answer "
                               "(connection refused, reset or closed); each is sent again "
                               "within --retries", ["llm", "url"], registry=r)
        self._m_overhead = Histogram("scepsy_gateway_overhead_seconds",
                                     "Time from a call's arrival to the choice of its endpoint",
                                     registry=r, buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                                                          5e-3, 1e-2, 5e-2))
        self._children: dict[tuple[Any, ...], Any] = {}  # labels() once per label set

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # -- life cycle --------------------------------------------------------------------------

    async def start(self) -> str:
        """Listen (the proxy's :meth:`~scepsy_opt.ingest.record.RecordingProxy.start`) and
        start polling the routes file; the base URL."""
        url = await self.proxy.start()
        self._poller = asyncio.get_running_loop().create_task(self._poll())
        return url

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        await self.proxy.stop()

    def stats(self) -> RecordStats:
        """What the proxy recorded so far."""
        return self.proxy.stats()

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def version(self) -> int:
        """The version of the table in use (1 at start, one more per accepted table)."""
        return self._table.version

    def set_routes(self, routes: Routes) -> int:
        """Swap the table (calls already routed finish where they are); its version."""
        self._table = _compile(routes, self._table.version + 1, self._servers)
        return self._table.version

    def reload_file(self) -> bool:
        """Read the routes file again: True when it became the table; a bad one is refused
        with one log line and the old table kept."""
        path = self.gateway.routes_file
        if path is None:
            return False
        self._file_sig = self._signature()
        try:
            routes = check_routes(load_routes(path), str(path))
        except InputError as exc:
            _LOG.warning("routes refused, keeping version %d: %s", self._table.version, exc)
            return False
        version = self.set_routes(routes)
        _LOG.warning("routes %s loaded as version %d", path, version)
        return True

    def _signature(self) -> tuple[int, int, int] | None:
        path = self.gateway.routes_file
        if path is None:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    async def _poll(self) -> None:
        """Every ``poll_s``: reload the routes file when it changed; forget idle requests."""
        while True:
            await asyncio.sleep(self.gateway.poll_s)
            try:
                if self.gateway.routes_file is not None:
                    sig = self._signature()
                    if sig is not None and sig != self._file_sig:
                        self.reload_file()
                self._forget_idle()
            except Exception as exc:  # never let the poll die: the next round tries again
                _LOG.warning("routes poll failed: %s: %s", type(exc).__name__, exc)

    def _forget_idle(self) -> None:
        """Forget the requests idle for ``request_idle_s``: their attained service and the calls
        the recorder keeps to infer parents (only their call counter stays, so that the call
        ids of a request that comes back stay unique)."""
        if not self._active:
            return
        horizon = time.monotonic() - self.gateway.request_idle_s
        for key in [k for k, v in self._active.items() if v[1] < horizon and v[2] <= 0]:
            del self._active[key]
            self.proxy.forget(*key)

    # -- routing -----------------------------------------------------------------------------

    def default_upstream(self) -> str:
        """Where requests that are not recorded calls go: the table's first endpoint of weight
        > 0 (else its first)."""
        return self._table.default or next(iter(self._servers.values())).base

    def upstream(self, request: web.BaseRequest, body: dict[str, Any], call: Call | None,
                 tried: tuple[str, ...] = ()) -> Upstream | NoUpstream:
        """The endpoint of one attempt (module docs), or 404 ``no_route``."""
        model = body.get("model")
        headers = request.headers
        if call is not None:
            llm, wf = call.llm, call.workflow
        else:
            trace_map = self.gateway.record.trace_map
            llm = trace_map.llm_for(model if isinstance(model, str) else None) \
                or (model if isinstance(model, str) else "")
            wf = headers.get(HEADER_WORKFLOW) or trace_map.workflow
        table = self._table
        asked = headers.get(HEADER_WORKFLOW)
        choices = table.by_key.get((asked, llm)) if asked is not None else None
        if choices is None:
            choices = table.by_llm.get(llm)
        now = time.monotonic()
        i = None if choices is None else choose_live(
            [c.weight for c in choices], [c.server.in_flight for c in choices],
            [c.server.calls for c in choices], [c.server.base in tried for c in choices],
            [c.server.down_until > now for c in choices])
        if i is None or choices is None:
            return NoUpstream(404, f"no route for LLM {llm!r} (workflow {wf!r}) in routes "
                              f"version {table.version}", "no_route")
        c = choices[i]
        srv = c.server
        srv.in_flight += 1
        srv.calls += 1
        srv.seen_as = (wf, llm)
        gauge = self._child(self._m_in_flight, llm, srv.url)
        gauge.inc()
        first = not tried  # a call is counted once, however many attempts it takes
        counts = self._wf_counts.get(wf)
        if counts is None:
            counts = self._wf_counts[wf] = [0, 0]
        counts[1] += first
        changed = False
        if c.model != model:
            body["model"] = c.model
            changed = True
        active = None
        if call is not None:
            call.route = srv
            if call.call_id == "c0" and first:
                counts[0] += 1
                self._child(self._m_requests, wf).inc()
            key = (call.workflow, call.request_id)
            active = self._active.get(key)
            if active is None:
                active = self._active[key] = [0, now, 0]
            active[1] = now
            active[2] += 1
            if self.gateway.priority == "las":
                body["priority"] = las_level(active[0])
                changed = True
            if first:
                self._m_overhead.observe(self.proxy.age_s(call))
        elif self.gateway.priority == "las":
            body["priority"] = 0
            changed = True

        def release() -> None:
            srv.in_flight -= 1
            gauge.dec()
            if active is not None:
                active[1] = time.monotonic()
                active[2] -= 1

        def lost(refused: bool) -> None:
            srv.lost += 1
            self._child(self._m_lost, llm, srv.url).inc()
            if refused:  # nothing listens there: other endpoints first for a while
                srv.down_until = time.monotonic() + EJECT_S

        return Upstream(srv.base, changed, release, lost)

    def ended(self, call: Call, usage: Usage | None, error: str | None) -> None:
        """A recorded call is over: count it, and add its tokens to its request's attained
        service."""
        srv = call.route
        if error is not None and srv is not None:
            srv.failed += 1
        self._child(self._m_calls, call.workflow, call.llm, error or "ok").inc()
        self._child(self._m_latency, call.workflow, call.llm).observe(self.proxy.age_s(call))
        if error is None and usage is not None:
            active = self._active.get((call.workflow, call.request_id))
            if active is not None:
                active[0] += usage.input_tokens + usage.output_tokens

    def attained(self, workflow: str, request_id: str) -> int:
        """The attained service of a request (tokens of its finished calls) as LAS sees it."""
        active = self._active.get((workflow, request_id))
        return int(active[0]) if active is not None else 0

    # -- admin API ---------------------------------------------------------------------------

    async def answer(self, request: web.BaseRequest) -> web.StreamResponse | None:
        """The admin API's answer (None: not an admin path, forwarded)."""
        path = request.path
        if path.startswith("/scepsy/") or path == METRICS_PATH:
            return await self._admin(request)
        return None

    async def _admin(self, request: web.BaseRequest) -> web.StreamResponse:
        path, method = request.path, request.method
        if path == STATE_PATH and method == "GET":
            return web.json_response(self.state())
        if path == METRICS_PATH and method == "GET":
            return web.Response(body=generate_latest(self.registry),
                                headers={"Content-Type": CONTENT_TYPE_LATEST})
        if path == ROUTES_PATH and method == "GET":
            return web.json_response({"version": self._table.version,
                                      "routes": self._table.routes.to_dict()})
        if path == ROUTES_PATH and method == "PUT":
            try:
                raw = await read_body(request, MAX_ROUTES_BYTES,
                                      self.gateway.record.read_timeout_s)
            except BodyRefused as exc:
                return json_error(exc.status, exc.reason, "invalid_request_error")
            except ClientGone as exc:
                return json_error(400, str(exc), "invalid_request_error")
            source = f"PUT {ROUTES_PATH}"
            try:
                try:
                    doc = json.loads(raw)
                except (ValueError, RecursionError):
                    raise InputError(source, "", "a routes document (JSON)") from None
                routes = check_routes(parse_routes(doc, source), source)
            except InputError as exc:
                _LOG.warning("routes refused, keeping version %d: %s", self._table.version,
                             exc)
                return json_error(400, str(exc), "invalid_routes")
            version = self.set_routes(routes)
            _LOG.warning("routes from %s loaded as version %d", request.remote or "?", version)
            return web.json_response({"version": version})
        if path in (STATE_PATH, METRICS_PATH, ROUTES_PATH):
            return json_error(405, f"{method} {path} is not supported", "method_not_allowed")
        return json_error(404, f"no such path: {path}", "not_found")

    def state(self) -> dict[str, Any]:
        """``GET /scepsy/state``: the table's version, every endpoint of the table (and any
        URL left out of it that still has calls in flight, weight 0) with its URL's calls in
        flight, attempts, failed calls, attempts lost before an answer and whether it is ejected
        now; per workflow, new requests and calls."""
        table = self._table
        now = time.monotonic()
        rows: list[dict[str, Any]] = []
        listed: set[str] = set()
        for (wf, llm), choices in table.by_key.items():
            for c in choices:
                s = c.server
                listed.add(s.url)
                rows.append({"workflow": wf, "llm": llm, "url": s.url, "model": c.model,
                             "weight": c.weight, "in_flight": s.in_flight, "calls": s.calls,
                             "failed": s.failed, "lost": s.lost,
                             "ejected": s.down_until > now})
        for s in self._servers.values():
            if s.url not in listed and s.in_flight > 0:
                rows.append({"workflow": s.seen_as[0], "llm": s.seen_as[1], "url": s.url,
                             "model": None, "weight": 0.0, "in_flight": s.in_flight,
                             "calls": s.calls, "failed": s.failed, "lost": s.lost,
                             "ejected": s.down_until > now})
        return {"version": table.version, "endpoints": rows,
                "workflows": {wf: {"requests": c[0], "calls": c[1]}
                              for wf, c in sorted(self._wf_counts.items())}}


# ------------------------------------------------------------------------------ running it


def gateway_in_thread(config: GatewayConfig) -> contextlib.AbstractContextManager[ProxyURL]:
    """Run a :class:`Gateway` on its own event loop in a thread; yields its base URL (a
    :class:`~scepsy_opt.ingest.record.ProxyURL`; ``url._proxy`` is the gateway)."""
    return proxy_in_thread(Gateway(config))


async def serve_gateway(config: GatewayConfig, stop: asyncio.Event,
                        on_start: Callable[[str], None] | None = None, gateway: Gateway | None = None) -> RecordStats:
    """Run a gateway on the current loop until ``stop`` is set; its final stats."""
    gw = gateway if gateway is not None else Gateway(config)
    return await serve(config.record, stop, on_start, proxy=gw)
