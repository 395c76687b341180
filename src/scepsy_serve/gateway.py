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

Routing by prompt length. When the candidates carry input-token ranges (``tokens`` in the table:
an LLM split over GPU types and routed by length), the call's prompt tokens are estimated
(:func:`prompt_tokens`) and only the candidates whose range ``[lo, hi)`` holds it are chosen
from, as above. When none of those has weight > 0 and is routable, the call goes to any
candidate (healing before length).

Priorities (``priority="las"``): a request's attained service is the prompt plus output tokens
of its finished calls (usage as recorded); each call's body gets ``"priority"`` =
:func:`~scepsy_opt.prediction.priority.las_level` of its request's attained service (vLLM
honours it under ``--scheduling-policy priority``). ``fcfs`` leaves the body alone. A request's
state (its attained service, and the calls the recorder keeps to infer the parents of its next
call) is forgotten once it has had no call in flight and no new call for ``request_idle_s``
seconds, so memory stays bounded by the requests active in that window (plus one call counter
per request id, which keeps the trace's call ids unique).

Healing (docs/gateway.md, "A replica that is gone"). An endpoint is *routable* while it is
healthy (active health checks, :class:`HealthCheck`: ``GET /health`` every ``interval_s``; it
turns unhealthy after ``unhealthy_threshold`` failed probes in a row and healthy again after
``healthy_threshold`` passed ones) and not ejected (outlier detection, :class:`OutlierDetection`,
as Envoy's: ``consecutive_5xx`` answers of 5xx or gateway failures in a row, or
``consecutive_gateway_failure`` of 502/503/504, timeouts and lost connections in a row, or one
refused connection eject it for ``base_ejection_s`` times the number of times it was ejected,
at most ``max_ejection_s``; no ejection takes an LLM's ejected share over
``max_ejection_percent``, except that one endpoint may always be ejected). Calls go to routable
endpoints; an LLM without one still sends its calls to its other endpoints (:func:`choose_live`).

Live reload: ``PUT /scepsy/routes`` with a routes document, :meth:`Gateway.reload_file` (the
CLI calls it on SIGHUP) and a poll of the routes file's modification time every ``poll_s``
seconds swap the table in one assignment: a call already routed finishes where it is; a bad
table is refused (400, or one log line) and the old one kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
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
from scepsy_opt.stats import in_range, length_key
from scepsy_serve.launch.routes import Routes, load_routes, parse_routes

__all__ = [
    "Gateway",
    "GatewayConfig",
    "HealthCheck",
    "OutlierDetection",
    "choose",
    "choose_live",
    "ejection_s",
    "gateway_in_thread",
    "loop_factory",
    "may_eject",
    "outcome_of",
    "parse_health_check",
    "parse_outlier_detection",
    "prompt_tokens",
    "serve_gateway",
]

ROUTES_PATH = "/scepsy/routes"
STATE_PATH = "/scepsy/state"
METRICS_PATH = "/metrics"
REQUEST_IDLE_S = 600.0
"""How long a request's state (its attained service, the calls that give the parents of its
next one) is kept after its last call, s."""
POLL_S = 1.0
"""How often the routes file's modification time is checked, s."""
EJECT_S = 5.0
"""The default :attr:`OutlierDetection.base_ejection_s`: how long an endpoint ejected for the
first time gets no call while its LLM has another routable endpoint, s."""
ALL_INTERFACES = frozenset({"0.0.0.0", "::", ""})
"""Listen addresses that bind every interface of the host: refused unless
:attr:`GatewayConfig.all_interfaces` (``--all-interfaces``)."""
MAX_ROUTES_BYTES = 16 * 1024 * 1024
CHARS_PER_TOKEN = 4
"""Characters of prompt text per token, for :func:`prompt_tokens` (no tokenizer is loaded)."""
_LOG = one_line_logger("scepsy gateway")


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The prompt tokens of a call, as length routing estimates them before the call is sent:
    a token-id prompt (``"prompt": [ids]``, or a list of such) counts its ids; text (a
    completion's ``prompt`` string or strings, a chat's ``messages`` contents, plain or as
    ``{"type": "text", "text": ...}`` parts) counts ``ceil(characters / CHARS_PER_TOKEN)``;
    at least 1 (:func:`scepsy_opt.stats.length_key`). Anything else counts nothing."""
    chars = ids = 0

    def walk(x: Any) -> None:
        nonlocal chars, ids
        if isinstance(x, str):
            chars += len(x)
        elif isinstance(x, list):
            if x and all(isinstance(t, int) and not isinstance(t, bool) for t in x):
                ids += len(x)
            else:
                for y in x:
                    walk(y)
        elif isinstance(x, dict):
            for k in ("content", "text"):
                if k in x:
                    walk(x[k])

    walk(body.get("messages") if "messages" in body else body.get("prompt"))
    return length_key(ids + math.ceil(chars / CHARS_PER_TOKEN))


def outcome_of(error: str | None) -> str | None:
    """What a recorded call's end says of its endpoint, for outlier detection: ``ok`` (an
    answer that is no 5xx: a 4xx is the caller's fault), ``gateway`` (a 502, 503 or 504 answer,
    ``upstream_timeout``, ``upstream_stream_cut``, ``upstream_unreachable``), ``5xx`` (another
    5xx answer), None (nothing about the endpoint: ``client_disconnected``, ``proxy_stopped``,
    ``no_route``)."""
    if error is None:
        return "ok"
    if error in ("upstream_timeout", "upstream_stream_cut", "upstream_unreachable"):
        return "gateway"
    code = error.removeprefix("upstream_")
    if code != error and code.isdigit():
        status = int(code)
        return "gateway" if status in (502, 503, 504) else "5xx" if status >= 500 else "ok"
    return None


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
    """:func:`choose` among the endpoints this call has not tried and that are not ``down``
    (unhealthy or ejected); without one, among those not tried; without one, among all (a connection lost
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


def may_eject(ejected: int, pool: int, max_percent: float) -> bool:
    """Whether one more endpoint of an LLM with ``pool`` endpoints, ``ejected`` of them ejected
    now, may be ejected: when the ejected ones would then be at most ``max_percent`` of the
    pool, or none is ejected yet (Envoy's rule: one endpoint may always be ejected)."""
    return ejected == 0 or 100 * (ejected + 1) <= max_percent * pool


def ejection_s(times: int, base_s: float, max_s: float) -> float:
    """How long an endpoint ejected for the ``times``-th time (1, 2, ...) stays ejected:
    ``base_s * times``, at most ``max(max_s, base_s)``."""
    return min(base_s * max(1, times), max(max_s, base_s))


def _check_number(source: str, name: str, v: object, *, integer: bool = False,
                  low: float = 0.0, high: float = math.inf, low_open: bool = True) -> None:
    ok = not isinstance(v, bool) and isinstance(v, int if integer else int | float)
    if ok:
        x = float(v)  # type: ignore[arg-type]
        ok = math.isfinite(x) and (x > low if low_open else x >= low) and x <= high
    if not ok:
        kind = "an integer" if integer else "a number"
        lo = f"> {low:g}" if low_open else f">= {low:g}"
        hi = f" and <= {high:g}" if math.isfinite(high) else ""
        raise InputError(source, name, f"{kind} {lo}{hi}", v)


@dataclass(frozen=True)
class HealthCheck:
    """Active health checks, as Envoy's HTTP health checker: each endpoint's server is sent
    ``GET path`` (on its base URL, e.g. ``http://10.0.0.5:8000/health``) every ``interval_s``
    on a fresh connection; a probe passes when it is answered 200 within ``timeout_s``. An
    endpoint turns unhealthy after ``unhealthy_threshold`` failed probes in a row and healthy
    again after ``healthy_threshold`` passed ones; a new endpoint counts as healthy until its
    probes say otherwise."""

    path: str = "/health"
    interval_s: float = 1.0
    timeout_s: float = 1.0
    unhealthy_threshold: int = 2
    healthy_threshold: int = 2

    def __post_init__(self) -> None:
        src = "--health-check"
        if not isinstance(self.path, str) or not self.path.startswith("/") or any(
                c.isspace() or c in "?#" for c in self.path):
            raise InputError(src, "path", "a path that starts with / (no spaces, ? or #), e.g. "
                             "/health", self.path)
        _check_number(src, "interval", self.interval_s, high=3600)
        _check_number(src, "timeout", self.timeout_s, high=3600)
        for name in ("unhealthy_threshold", "healthy_threshold"):
            _check_number(src, name.removesuffix("_threshold"), getattr(self, name),
                          integer=True, low=1, low_open=False, high=1000)


@dataclass(frozen=True)
class OutlierDetection:
    """Passive outlier detection, as Envoy's (``outlier_detection``): an endpoint is ejected
    after ``consecutive_5xx`` calls in a row ended with a 5xx answer or a gateway failure, or
    ``consecutive_gateway_failure`` in a row with a gateway failure (a 502, 503 or 504 answer,
    a timeout, a connection lost before or during the answer), or at once when it refused a
    connection (nothing listens there). The ``n``-th ejection lasts ``base_ejection_s * n``, at
    most ``max_ejection_s``; ``n`` drops by one for every ``decay_s`` the endpoint spent
    un-ejected. An ejection that would take the ejected endpoints of an LLM over
    ``max_ejection_percent`` of its endpoints is skipped, unless none is ejected yet."""

    consecutive_5xx: int = 5
    consecutive_gateway_failure: int = 3
    base_ejection_s: float = EJECT_S
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 50.0
    decay_s: float = 10.0

    def __post_init__(self) -> None:
        src = "--outlier-detection"
        for name in ("consecutive_5xx", "consecutive_gateway_failure"):
            _check_number(src, name, getattr(self, name), integer=True, low=1, low_open=False,
                          high=1000)
        for name in ("base_ejection_s", "max_ejection_s", "decay_s"):
            _check_number(src, name.removesuffix("_s"), getattr(self, name), high=86400)
        _check_number(src, "max_ejection_percent", self.max_ejection_percent, low=0,
                      low_open=False, high=100)


_HEALTH_KEYS = {"path": "path", "interval": "interval_s", "timeout": "timeout_s",
                "unhealthy": "unhealthy_threshold", "healthy": "healthy_threshold"}
_OUTLIER_KEYS = {"consecutive_5xx": "consecutive_5xx",
                 "consecutive_gateway_failure": "consecutive_gateway_failure",
                 "base_ejection": "base_ejection_s", "max_ejection": "max_ejection_s",
                 "max_ejection_percent": "max_ejection_percent", "decay": "decay_s"}


def _key_values(text: str, source: str, keys: Mapping[str, str],
                defaults: object) -> dict[str, Any]:
    """``KEY=VALUE,...`` as the keyword arguments of a config: each key one of ``keys``, once;
    numbers as numbers (integers where the default is one)."""
    out: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in keys or keys[key] in out:
            raise InputError(source, key or item, "KEY=VALUE pairs separated by commas, each "
                             "key once, one of " + ", ".join(keys), text)
        name = keys[key]
        default = getattr(defaults, name)
        if isinstance(default, str):
            out[name] = value
            continue
        try:
            out[name] = int(value) if isinstance(default, int) else float(value)
        except ValueError:
            raise InputError(source, key, "an integer" if isinstance(default, int)
                             else "a number", value) from None
    return out


def parse_health_check(text: str) -> HealthCheck | None:
    """``--health-check``: ``off`` (None: no active checks), ``on`` (the defaults) or
    ``KEY=VALUE,...`` over the defaults, keys ``path``, ``interval`` (s), ``timeout`` (s),
    ``unhealthy`` and ``healthy`` (the thresholds), as in ``path=/health,interval=2``."""
    if text.strip() in ("off", "on"):
        return None if text.strip() == "off" else HealthCheck()
    return HealthCheck(**_key_values(text, "--health-check", _HEALTH_KEYS, HealthCheck()))


def parse_outlier_detection(text: str) -> OutlierDetection:
    """``--outlier-detection``: ``KEY=VALUE,...`` over the defaults, keys ``consecutive_5xx``,
    ``consecutive_gateway_failure``, ``base_ejection`` (s), ``max_ejection`` (s),
    ``max_ejection_percent`` and ``decay`` (s)."""
    return OutlierDetection(**_key_values(text, "--outlier-detection", _OUTLIER_KEYS,
                                          OutlierDetection()))


# ------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class GatewayConfig:
    """A gateway: ``record`` (what it listens on and the trace it writes; ``routed=True``, no
    upstream), the first routing table, the file it is reloaded from (optional), the priority
    policy, how long a request's LAS state is kept after its last call and how often the file
    is checked for a change; the active health checks (None: none) and the outlier detection;
    ``all_interfaces``: the listen address may bind every interface (``0.0.0.0``, ``::``),
    otherwise refused: the gateway's admin API (``PUT /scepsy/routes``) has no authentication,
    so it listens only on the address it was given (the node's address in the plan, say)."""

    record: RecordConfig
    routes: Routes
    routes_file: Path | None = None
    priority: PriorityPolicy = "fcfs"
    request_idle_s: float = REQUEST_IDLE_S
    poll_s: float = POLL_S
    health: HealthCheck | None = HealthCheck()
    outlier: OutlierDetection = OutlierDetection()
    all_interfaces: bool = False

    def __post_init__(self) -> None:
        rec = self.record
        if rec.host.strip("[]") in ALL_INTERFACES and not self.all_interfaces:
            raise InputError("--listen", "", "an address of this host, e.g. 127.0.0.1:8100 or "
                             "the node's address in the plan (an address of every interface "
                             "exposes the gateway's unauthenticated admin API to every "
                             "network the host is on; add --all-interfaces to mean it)",
                             f"{rec.host}:{rec.port}")
        if self.health is not None and not isinstance(self.health, HealthCheck):
            raise InputError("gateway config", "health", "a HealthCheck or None", self.health)
        if not isinstance(self.outlier, OutlierDetection):
            raise InputError("gateway config", "outlier", "an OutlierDetection", self.outlier)
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
    attempts lost before an answer; its health (active checks: healthy, and the passed or failed
    probes in a row) and its outlier state (5xx and gateway failures in a row, times ejected,
    until when it is ejected, monotonic s)."""

    url: str
    base: str
    in_flight: int = 0
    calls: int = 0
    failed: int = 0
    lost: int = 0
    down_until: float = 0.0
    seen_as: tuple[str, str] = ("", "")  # (workflow, llm) it was last routed for
    healthy: bool = True
    probes_ok: int = 0
    probes_failed: int = 0
    last_probe: str = ""
    errors_5xx: int = 0
    errors_gateway: int = 0
    ejections: int = 0

    def routable(self, now: float) -> bool:
        return self.healthy and self.down_until <= now


@dataclass(slots=True)
class _Attempt:
    """What a recorded call keeps of its last attempt (``Call.route``): its endpoint, and
    whether that attempt was lost before an answer (already counted by outlier detection)."""

    server: _Server
    lost: bool = False


@dataclass(frozen=True, slots=True)
class _Choice:
    server: _Server
    weight: float
    model: str
    tokens: tuple[int, int | None] | None = None  # routed by prompt length: [lo, hi)


@dataclass(frozen=True)
class _Table:
    version: int
    routes: Routes
    by_key: Mapping[tuple[str, str], tuple[_Choice, ...]]
    by_llm: Mapping[str, tuple[_Choice, ...]]
    default: str
    pools: Mapping[str, tuple[tuple[_Server, ...], ...]]
    """URL -> the endpoints of each LLM it serves (the pools ``max_ejection_percent`` bounds)."""


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
                row.append(_Choice(srv, e.weight, e.model, e.tokens))
                u = union.setdefault(llm, {}).setdefault(e.url, [srv, [], e.model, e.tokens])
                u[1].append(e.weight)
                if not default and e.weight > 0:
                    default = srv.base
            by_key[(wf, llm)] = tuple(row)
    by_llm = {llm: tuple(_Choice(s, sum(ws) / len(ws), m, t) for s, ws, m, t in urls.values())
              for llm, urls in union.items()}
    pools: dict[str, list[tuple[_Server, ...]]] = {}
    for choices in by_llm.values():
        pool = tuple(c.server for c in choices)
        for srv in pool:
            pools.setdefault(srv.url, []).append(pool)
    return _Table(version, routes, by_key, by_llm, default,
                  {url: tuple(p) for url, p in pools.items()})


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
        self.instance = uuid.uuid4().hex  # this process's gateway: a restart gets a new one
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
        self._m_ejections = Counter("scepsy_gateway_ejections", "Endpoints ejected by outlier "
                                    "detection, by reason (refused, consecutive_5xx, "
                                    "consecutive_gateway_failure)", ["url", "reason"],
                                    registry=r)
        self._m_healthy = Gauge("scepsy_gateway_endpoint_healthy", "1 while an endpoint passes "
                                "its active health checks, else 0", ["url"], registry=r)
        self._children: dict[tuple[Any, ...], Any] = {}  # labels() once per label set
        self._probe_session: aiohttp.ClientSession | None = None
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

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
        self._loop = asyncio.get_running_loop()
        self._poller = self._loop.create_task(self._poll())
        if self.gateway.health is not None:
            self._probe_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=aiohttp.ClientTimeout(total=self.gateway.health.timeout_s))
            self._sync_probes()
        return url

    async def stop(self) -> None:
        tasks = [t for t in (self._poller, *self._probes.values()) if t is not None]
        self._poller = None
        self._probes = {}
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._probe_session is not None:
            await self._probe_session.close()
            self._probe_session = None
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
        """Swap the table (calls already routed finish where they are; the health checks follow
        it); its version."""
        self._table = _compile(routes, self._table.version + 1, self._servers)
        self._sync_probes()
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

    # -- active health checks ----------------------------------------------------------------

    def _sync_probes(self) -> None:
        """One probe task per endpoint of the table (started for a new one, its health reset;
        cancelled for one the table left out). Nothing before :meth:`start`; called from
        another thread, it runs on the gateway's loop."""
        loop = self._loop
        if self._probe_session is None or loop is None:
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is not loop:
            loop.call_soon_threadsafe(self._sync_probes)
            return
        listed = {c.server.url: c.server for choices in self._table.by_key.values()
                  for c in choices}
        for url in [u for u in self._probes if u not in listed]:
            self._probes.pop(url).cancel()
        for url, srv in listed.items():
            if url not in self._probes:
                srv.healthy, srv.probes_ok, srv.probes_failed, srv.last_probe = True, 0, 0, ""
                self._child(self._m_healthy, url).set(1)
                self._probes[url] = loop.create_task(self._probe_loop(srv))

    async def _probe_loop(self, srv: _Server) -> None:
        hc = self.gateway.health
        assert hc is not None and self._probe_session is not None
        session = self._probe_session
        url = srv.base + hc.path
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            try:
                async with session.get(url, allow_redirects=False) as resp:
                    await resp.read()
                    why = "" if resp.status == 200 else f"answered {resp.status}"
            except Exception as exc:  # timeouts, refused, reset, a bad answer: all failures
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.probed(srv, why)
            await asyncio.sleep(max(0.0, t0 + hc.interval_s - loop.time()))

    def probed(self, srv: _Server, why: str) -> None:
        """One probe's result (``why``: empty when it passed, else what failed): the endpoint
        turns unhealthy after ``unhealthy_threshold`` failures in a row, healthy again after
        ``healthy_threshold`` passes in a row."""
        hc = self.gateway.health
        assert hc is not None
        srv.last_probe = why or "ok"
        if not why:
            srv.probes_ok, srv.probes_failed = srv.probes_ok + 1, 0
            if not srv.healthy and srv.probes_ok >= hc.healthy_threshold:
                srv.healthy = True
                self._child(self._m_healthy, srv.url).set(1)
                _LOG.warning("endpoint %s healthy again (%d probes of %s passed)", srv.url,
                             srv.probes_ok, hc.path)
        else:
            srv.probes_ok, srv.probes_failed = 0, srv.probes_failed + 1
            if srv.healthy and srv.probes_failed >= hc.unhealthy_threshold:
                srv.healthy = False
                self._child(self._m_healthy, srv.url).set(0)
                _LOG.warning("endpoint %s unhealthy: %d probes of %s failed (%s)", srv.url,
                             srv.probes_failed, hc.path, why)

    # -- outlier detection -------------------------------------------------------------------

    def _outcome(self, srv: _Server, kind: str) -> None:
        """An attempt's outcome at ``srv``: ``ok`` (an answer that was no 5xx), ``5xx`` or
        ``gateway`` (a 502/503/504, a timeout, a connection lost); ejects it at a threshold."""
        if kind == "ok":
            srv.errors_5xx = srv.errors_gateway = 0
            return
        od = self.gateway.outlier
        srv.errors_5xx += 1
        srv.errors_gateway = srv.errors_gateway + 1 if kind == "gateway" else 0
        if srv.errors_gateway >= od.consecutive_gateway_failure:
            self.eject(srv, "consecutive_gateway_failure")
        elif srv.errors_5xx >= od.consecutive_5xx:
            self.eject(srv, "consecutive_5xx")

    def eject(self, srv: _Server, reason: str, now: float | None = None) -> bool:
        """Eject ``srv`` (OutlierDetection's rule: the ``n``-th time for ``base * n`` s, at most
        ``max``; not when it would take an LLM's ejected endpoints over the percentage); whether
        it was ejected."""
        now = time.monotonic() if now is None else now
        if srv.down_until > now:
            return False
        od = self.gateway.outlier
        for pool in self._table.pools.get(srv.url, ()):
            ejected = sum(1 for s in pool if s.down_until > now)
            if not may_eject(ejected, len(pool), od.max_ejection_percent):
                return False
        if srv.ejections and srv.down_until > 0:  # one less per decay_s spent un-ejected
            srv.ejections = max(0, srv.ejections - int((now - srv.down_until) // od.decay_s))
        srv.ejections += 1
        span = ejection_s(srv.ejections, od.base_ejection_s, od.max_ejection_s)
        srv.down_until = now + span
        srv.errors_5xx = srv.errors_gateway = 0
        self._child(self._m_ejections, srv.url, reason).inc()
        _LOG.warning("endpoint %s ejected for %g s (%s; ejection %d)", srv.url, span, reason,
                     srv.ejections)
        return True

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
        weights = [] if choices is None else [c.weight for c in choices]
        if choices is not None and any(c.tokens is not None for c in choices):
            x = prompt_tokens(body)
            inside = [c.tokens is None or in_range(x, c.tokens) for c in choices]
            if any(ok and c.weight > 0 and c.server.routable(now) and c.server.base not in tried
                   for ok, c in zip(inside, choices, strict=True)):
                weights = [w if ok else 0.0 for w, ok in zip(weights, inside, strict=True)]
        i = None if choices is None else choose_live(
            weights, [c.server.in_flight for c in choices],
            [c.server.calls for c in choices], [c.server.base in tried for c in choices],
            [not c.server.routable(now) for c in choices])
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
        attempt = None
        if call is not None:
            attempt = call.route = _Attempt(srv)
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
            if attempt is not None:
                attempt.lost = True
            if refused:  # nothing listens there: other endpoints first for a while
                self.eject(srv, "refused")
            else:
                self._outcome(srv, "gateway")

        return Upstream(srv.base, changed, release, lost)

    def ended(self, call: Call, usage: Usage | None, error: str | None) -> None:
        """A recorded call is over: count it, and add its tokens to its request's attained
        service; its outcome counts for outlier detection (:func:`outcome_of`)."""
        attempt = call.route
        if isinstance(attempt, _Attempt):
            srv = attempt.server
            if error is not None:
                srv.failed += 1
            kind = outcome_of(error)
            if kind is not None and not (attempt.lost and error == "upstream_unreachable"):
                self._outcome(srv, kind)
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

    @staticmethod
    def _health_row(s: _Server, now: float) -> dict[str, Any]:
        return {"healthy": s.healthy, "ejected": s.down_until > now, "ejections": s.ejections,
                "ejected_for_s": round(max(0.0, s.down_until - now), 3),
                "last_probe": s.last_probe or None}

    def state(self) -> dict[str, Any]:
        """``GET /scepsy/state``: the gateway's ``instance`` (an id of this process: another
        after a restart), the table's version, every endpoint of the table (and any URL left
        out of it that still has calls in flight, weight 0) with its URL's calls in flight,
        attempts, failed calls, attempts lost before an answer and whether it is ejected now;
        per workflow, new requests and calls."""
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
                             "failed": s.failed, "lost": s.lost, **self._health_row(s, now)})
        for s in self._servers.values():
            if s.url not in listed and s.in_flight > 0:
                rows.append({"workflow": s.seen_as[0], "llm": s.seen_as[1], "url": s.url,
                             "model": None, "weight": 0.0, "in_flight": s.in_flight,
                             "calls": s.calls, "failed": s.failed, "lost": s.lost,
                             **self._health_row(s, now)})
        return {"instance": self.instance, "version": table.version, "endpoints": rows,
                "workflows": {wf: {"requests": c[0], "calls": c[1]}
                              for wf, c in sorted(self._wf_counts.items())}}


# ------------------------------------------------------------------------------ running it


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``scepsy gateway`` runs on: uvloop's where it is installed (its sockets and
    callbacks in C cut the CPU time of each forwarded call, docs/gateway.md "Overhead"), else
    None (asyncio's own)."""
    try:  # optional: not a dependency of scepsy (typed checks pass without it)
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def gateway_in_thread(config: GatewayConfig) -> contextlib.AbstractContextManager[ProxyURL]:
    """Run a :class:`Gateway` on its own event loop in a thread; yields its base URL (a
    :class:`~scepsy_opt.ingest.record.ProxyURL`; ``url._proxy`` is the gateway)."""
    return proxy_in_thread(Gateway(config))


async def serve_gateway(config: GatewayConfig, stop: asyncio.Event,
                        on_start: Callable[[str], None] | None = None, gateway: Gateway | None = None) -> RecordStats:
    """Run a gateway on the current loop until ``stop`` is set; its final stats."""
    gw = gateway if gateway is not None else Gateway(config)
    return await serve(config.record, stop, on_start, proxy=gw)
