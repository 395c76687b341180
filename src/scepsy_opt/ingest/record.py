"""A recording proxy for OpenAI-compatible LLM servers: every chat or text completion it
forwards becomes one :class:`~scepsy_opt.traces.CallRecord` of a trace (docs/record.md).

The proxy listens on a loopback port, forwards each call to the upstream server of the body's
``model`` (``upstream_for``, else ``upstream``) over pooled connections (recorded calls to an
``http://`` upstream: :class:`~scepsy_opt.ingest.upstream_http.LeanPool`; the rest: one
:class:`aiohttp.ClientSession`),
passes the answer back as it arrives (streams chunk by chunk) and, when the call has finished,
appends its record to the trace file as one JSON line and flushes it, so the file is a valid trace
after every call. Which workflow request a call belongs to comes from the ``X-Scepsy-Request``
header (fallback: the body's OpenAI ``user`` field; else the call is a request of its own);
``X-Scepsy-Workflow`` and ``X-Scepsy-Role`` set the workflow name and the role. Parents come
from timing (:class:`~scepsy_opt.traces.CompletedCalls`, the rule of
:func:`~scepsy_opt.traces.infer_parents`) over the request's calls so far.

Failed calls are recorded with ``error`` set and never stop the proxy: ``upstream_<status>``,
``upstream_unreachable``, ``upstream_timeout``, ``upstream_stream_cut``, ``client_disconnected``,
``proxy_stopped``. A call whose upstream refused, reset or closed the connection before any byte
of an answer came back is sent again on a fresh connection (up to ``retries`` times; the gateway
sends it to another replica of the LLM when it has one): nothing reached the client yet, and a
completion changes nothing on its server but the work it costs. Pooled connections to an
upstream are kept idle for at most :data:`~scepsy_common.net.CLIENT_KEEPALIVE_S`, less than
vLLM's server keeps them, so that a call is not sent on a connection the server is closing.

:class:`RecordingProxy` runs on the caller's event loop; :func:`recording_proxy` runs one in a
thread (``with recording_proxy(config) as url:``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from scepsy_common.errors import InputError, check_name, key_once
from scepsy_common.httpguard import (
    IDLE_TIMEOUT_S,
    READ_TIMEOUT_S,
    SHUTDOWN_GRACE_S,
    BodyRefused,
    ClientGone,
    one_line_logger,
    read_body,
    refused,
)
from scepsy_common.net import CLIENT_KEEPALIVE_S, check_url
from scepsy_opt.ingest.tracemap import TraceMap
from scepsy_opt.ingest.upstream_http import LeanPool, LeanResponse, UpstreamRefused
from scepsy_opt.traces import (
    CLIENT_MIN_GAP_S,
    CLIENT_TOOL,
    MAX_TOKENS,
    TIME_TOLERANCE_S,
    CallRecord,
    CompletedCalls,
)

RECORDED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
"""The POST paths whose calls are recorded; every other request is only forwarded."""
HEADER_REQUEST = "X-Scepsy-Request"
HEADER_WORKFLOW = "X-Scepsy-Workflow"
HEADER_ROLE = "X-Scepsy-Role"
SCEPSY_PREFIX = "x-scepsy-"
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding",
                        "upgrade"})
"""Headers that belong to one connection (RFC 9110 7.6.1): never forwarded either way."""
# the server hands on request bodies decompressed: their Content-Encoding no longer holds
_DROP_REQUEST = HOP_BY_HOP | {"host", "content-length", "content-encoding"}
_DROP_RESPONSE = HOP_BY_HOP | {"content-length"}
DEFAULT_TIMEOUT_S = 600.0
RETRIES = 1
"""How many times a call is sent again after its upstream refused, reset or closed the
connection before answering (Envoy's default too)."""
MAX_RETRIES = 5
MAX_BODY_BYTES = 256 * 1024 * 1024
"""The largest request body the proxy takes (long prompts, images), bytes: a larger one gets
413, before its body is read when its ``Content-Length`` says so."""
NO_MODEL = "<none>"
"""The key under which calls without a ``model`` are counted as unmapped."""
_EVENT_END = re.compile(rb"\r?\n\r?\n")
_LOG = one_line_logger("scepsy record")
_DONE = b"[DONE]"
_JSON_DOCUMENT = json.JSONDecoder().raw_decode
"""One JSON value at the start of a text and where it ends (``json.loads`` less its checks)."""


# --------------------------------------------------------------------------- configuration


def normalize_upstream(url: str, source: str = "--upstream", field_: str = "") -> str:
    """``url`` as a server base URL: ``http(s)://host:port[/prefix]`` without a trailing ``/``
    or ``/v1`` (the proxy appends the request's own path, ``/v1/...``)."""
    parts = urlsplit(check_url(url.strip() if isinstance(url, str) else url, source, field_))
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path.rstrip('/')}"


def upstream_pairs(pairs: list[str] | tuple[str, ...],
                   source: str = "--upstream-for") -> dict[str, str]:
    """``MODEL=URL`` strings as ``{model: base URL}`` (split at the first ``=``: a URL may hold
    one, a model name rarely does)."""
    out: dict[str, str] = {}
    for text in pairs:
        model, sep, url = text.partition("=")
        if not sep or not model.strip():
            raise InputError(source, "", "MODEL=URL", text)
        key_once(out, model, normalize_upstream(url, source, model), source)
    return out


@dataclass(frozen=True)
class RecordConfig:
    """What one recording proxy listens on, forwards to and writes.

    ``upstream`` serves every model without an entry in ``upstream_for`` and every path that is
    not recorded (``GET /v1/models``, ``/health``, ...); without it those go to the first
    ``upstream_for`` URL. ``client_time``: also write the gap between a call and the calls it
    waited for as a ``client`` tool call (:func:`~scepsy_opt.traces.with_client_time`).
    ``timeout_s`` bounds the connection to an upstream and each read from
    it. ``out`` must not exist yet (a trace is never overwritten); it is removed again when the
    proxy stops without having recorded a call. A client whose request body is over
    ``max_body_bytes`` is answered 413, one that pauses longer than ``read_timeout_s`` while
    sending it 408 (:mod:`scepsy_common.httpguard`). ``retries``: how many times a call is sent
    again when its upstream refused, reset or closed the connection before answering (0 to
    :data:`MAX_RETRIES`). ``routed``: a :class:`Router` other than the config's upstreams
    chooses each call's upstream (the gateway, :mod:`scepsy_serve.gateway`); no upstream is
    needed here then.
    """

    out: Path
    upstream: str | None = None
    upstream_for: Mapping[str, str] = field(default_factory=dict)
    trace_map: TraceMap = field(default_factory=TraceMap)
    host: str = "127.0.0.1"
    port: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    client_time: bool = True
    max_body_bytes: int = MAX_BODY_BYTES
    read_timeout_s: float = READ_TIMEOUT_S
    retries: int = RETRIES
    routed: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))
        if self.upstream is not None:
            object.__setattr__(self, "upstream", normalize_upstream(self.upstream))
        per = {m: normalize_upstream(u, "--upstream-for", m) for m, u in self.upstream_for.items()}
        object.__setattr__(self, "upstream_for", MappingProxyType(per))
        if self.upstream is None and not per and not self.routed:
            raise InputError("--upstream", "", "an upstream server URL (--upstream URL or "
                             "--upstream-for MODEL=URL)")
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (
                math.isfinite(t) and t > 0):
            raise InputError("--timeout", "", "a number of seconds > 0", t)
        for name, limit in (("max_body_bytes", self.max_body_bytes),
                            ("read_timeout_s", self.read_timeout_s)):
            if isinstance(limit, bool) or not isinstance(limit, int | float) or not (
                    math.isfinite(limit) and limit > 0):
                raise InputError("record config", name, "a number > 0", limit)
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 0 <= self.port <= 65535:
            raise InputError("--listen", "port", "a port in 0..65535", self.port)
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) \
                or not 0 <= self.retries <= MAX_RETRIES:
            raise InputError("--retries", "", f"an integer in 0..{MAX_RETRIES}", self.retries)

    @property
    def default_upstream(self) -> str:
        """Where calls of models without their own upstream and unrecorded paths go."""
        return self.upstream if self.upstream is not None else next(iter(
            self.upstream_for.values()))

    def upstream_of(self, model: object) -> str:
        """The base URL that serves ``model``."""
        if isinstance(model, str) and model in self.upstream_for:
            return self.upstream_for[model]
        return self.default_upstream


# ------------------------------------------------------------------------------- stats


@dataclass(frozen=True)
class RecordedLLM:
    """Recorded calls of one LLM: how many, how many failed, the tokens of those that did not."""

    calls: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    prefix_tokens: int = 0


@dataclass(frozen=True)
class RecordStats:
    """What a proxy has done so far.

    ``recorded``: calls written to the trace (``failed`` of them with an error, per kind in
    ``errors``); ``unattributed``: written calls without ``X-Scepsy-Request`` or a usable ``user``
    (each a request of its own); ``usage_missing``: successful calls whose upstream sent no
    usage (a stream's output tokens are then estimated from its chunks, an answer's are 0); ``unmapped``: forwarded calls per model
    that the trace map gave no LLM name (not written); ``malformed``: recorded-path calls
    answered 400 for a body that is not a JSON object; ``rejected``: calls answered 400 for an
    ``X-Scepsy-*`` header that is not a valid name; ``forwarded``: requests to other paths;
    ``retried``: times a request was sent again because its upstream refused, reset or closed
    the connection before answering.
    """

    recorded: int = 0
    failed: int = 0
    unattributed: int = 0
    usage_missing: int = 0
    malformed: int = 0
    rejected: int = 0
    forwarded: int = 0
    retried: int = 0
    unmapped: Mapping[str, int] = field(default_factory=dict)
    errors: Mapping[str, int] = field(default_factory=dict)
    llms: Mapping[str, RecordedLLM] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"recorded": self.recorded, "failed": self.failed,
                "unattributed": self.unattributed, "usage_missing": self.usage_missing,
                "malformed": self.malformed, "rejected": self.rejected,
                "forwarded": self.forwarded, "retried": self.retried,
                "unmapped": dict(self.unmapped),
                "errors": dict(self.errors),
                "llms": {k: asdict(v) for k, v in self.llms.items()}}


class _Counters:
    """The mutable counts behind :class:`RecordStats` (touched by the event loop only)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.unmapped: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.llms: dict[str, list[int]] = {}

    def add_call(self, rec: CallRecord, unattributed: bool, usage_missing: bool) -> None:
        self.counts["recorded"] += 1
        self.counts["unattributed"] += unattributed
        self.counts["usage_missing"] += usage_missing
        row = self.llms.setdefault(str(rec.llm), [0, 0, 0, 0, 0])
        row[0] += 1
        if rec.error is not None:
            self.counts["failed"] += 1
            self.errors[rec.error] += 1
            row[1] += 1
        else:
            row[2] += rec.input_tokens
            row[3] += rec.output_tokens
            row[4] += rec.prefix_tokens

    def snapshot(self) -> RecordStats:
        c = self.counts
        return RecordStats(
            recorded=c["recorded"], failed=c["failed"], unattributed=c["unattributed"],
            usage_missing=c["usage_missing"], malformed=c["malformed"], rejected=c["rejected"],
            forwarded=c["forwarded"], retried=c["retried"],
            unmapped=dict(sorted(self.unmapped.items())),
            errors=dict(sorted(self.errors.items())),
            llms={k: RecordedLLM(*v) for k, v in sorted(self.llms.items())})


# ------------------------------------------------------------------------------- usage


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one call as the upstream reported them."""

    input_tokens: int
    output_tokens: int
    prefix_tokens: int


def _count(v: object) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKENS:
        return None
    return v


def parse_usage(obj: object) -> Usage | None:
    """An OpenAI ``usage`` object as :class:`Usage` (``prompt_tokens``, ``completion_tokens``,
    ``prompt_tokens_details.cached_tokens`` as the prefix); None when it is not one."""
    if not isinstance(obj, dict):
        return None
    inp, out = _count(obj.get("prompt_tokens")), _count(obj.get("completion_tokens", 0))
    if inp is None or out is None:
        return None
    details = obj.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(inp, out, min(cached or 0, inp))


def _has_content(choices: object) -> bool:
    """Whether a stream chunk's choices carry generated text (chat ``delta.content`` or
    completions ``text``)."""
    if not isinstance(choices, list):
        return False
    for ch in choices:
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta")
        if isinstance(delta, dict) and delta.get("content"):
            return True
        if ch.get("text"):
            return True
    return False


class StreamScan:
    """Reads an SSE stream of completion chunks as it passes: the usage (last seen), chunks with
    content, whether ``data: [DONE]`` came, and which events to hold back from the client (the
    usage-only chunk the proxy asked for when ``drop_usage_chunk``).

    What passes is sliced from the bytes that came, never encoded again; an event of one
    ``data:`` line whose payload starts with ``{`` is decoded by the JSON scanner directly (what
    ``json.loads`` does for it, less its checks of the text's encoding); anything else takes
    the general path."""

    __slots__ = ("_buf", "content_chunks", "done", "drop_usage_chunk", "usage")

    def __init__(self, drop_usage_chunk: bool) -> None:
        self.drop_usage_chunk = drop_usage_chunk
        self.usage: Usage | None = None
        self.content_chunks = 0
        self.done = False
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        """The bytes of ``data`` (with what was held back before) to pass on now: complete
        events, byte for byte, minus a dropped usage chunk; an incomplete event waits."""
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:  # CRLF (or mixed) line ends: the general split
            return self._feed_any(buf)
        events = buf.split(b"\n\n")
        rest = self._buf = events.pop()
        if not events:
            return b""
        keep = self._keep
        dropped: list[int] | None = None
        pos = 0
        for event in events:
            if event.startswith(b"data:") and b"\n" not in event:
                payload = event[5:].strip()
            else:
                payload = _sse_data(event)
            if not keep(payload):
                if dropped is None:
                    dropped = []
                dropped.append(pos)
                dropped.append(pos + len(event) + 2)
            pos += len(event) + 2
        if dropped is None:
            return buf[:pos] if rest else buf
        dropped.append(pos)
        return b"".join(buf[dropped[i - 1] if i else 0:dropped[i]]
                        for i in range(0, len(dropped), 2))

    def _feed_any(self, buf: bytes) -> bytes:
        out: list[bytes] = []
        pos = 0
        for m in _EVENT_END.finditer(buf):
            if self._keep(_sse_data(buf[pos:m.start()])):
                out.append(buf[pos:m.end()])
            pos = m.end()
        self._buf = buf[pos:]
        return b"".join(out) if len(out) != 1 else out[0]

    def flush(self) -> bytes:
        """What is left at the end of the stream (an event without its blank line)."""
        rest, self._buf = self._buf, b""
        return rest if rest and self._keep(_sse_data(rest)) else b""

    def _keep(self, data: bytes) -> bool:
        """Reads the payload ``data`` of one event: whether the event passes."""
        if not data:
            return True
        if data == _DONE:
            self.done = True
            return True
        obj: Any
        if data[:1] == b"{" and data[1:2] != b"\x00":  # UTF-8 (json.loads' own test)
            try:
                text = data.decode("utf-8", "surrogatepass")
                obj, end = _JSON_DOCUMENT(text)
            except (ValueError, RecursionError):
                return True
            if end != len(text):  # more after the object (the payload ends without space)
                return True
        else:
            try:
                obj = json.loads(data)
            except (ValueError, RecursionError):
                return True
            if not isinstance(obj, dict):
                return True
        choices = obj.get("choices")
        if _has_content(choices):
            self.content_chunks += 1
        usage = obj.get("usage")
        if usage is not None and (usage := parse_usage(usage)) is not None:
            self.usage = usage
            return not (self.drop_usage_chunk and choices == [])
        return True


def _sse_data(event: bytes) -> bytes:
    """The payload of one SSE event: its ``data:`` lines' values, joined."""
    return b"".join(line[5:].strip() for line in event.splitlines()
                    if line.startswith(b"data:"))


# ------------------------------------------------------------------------------- the proxy


@dataclass(slots=True)
class Call:
    """A recorded call in flight: what the proxy knew when it arrived; ``ended`` once its
    record is written."""

    workflow: str
    request_id: str
    call_id: str
    llm: str
    role: str | None
    start_s: float
    unattributed: bool
    ended: bool = False
    route: Any = None
    """What the proxy's :class:`Router` keeps of the call (the gateway: its endpoint)."""


@dataclass(slots=True)
class Upstream:
    """Where one attempt of a recorded call goes (:meth:`Router.upstream`): the
    server's base URL; ``changed``: the body was changed in place (it is serialised again);
    ``release``: called once the attempt is over, however it ended; ``lost``: called when the
    attempt was lost before any answer came back (``True``: the connection was refused)."""

    base: str
    changed: bool = False
    release: Callable[[], None] | None = None
    lost: Callable[[bool], None] | None = None


@dataclass(frozen=True, slots=True)
class NoUpstream:
    """A call its router has nowhere to send: answered ``status`` with ``message`` and recorded
    with the error ``kind``."""

    status: int
    message: str
    kind: str


class Router(Protocol):
    """Where a proxy sends what it forwards: :class:`FixedUpstreams` (the upstreams of the
    recorder's config) or the gateway's routing table
    (:class:`scepsy_serve.gateway.Gateway`). The proxy records; the router only chooses."""

    def default_upstream(self) -> str:
        """The base URL of requests that are not recorded calls."""
        ...

    def upstream(self, request: web.BaseRequest, body: dict[str, Any], call: Call | None,
                 tried: tuple[str, ...]) -> Upstream | NoUpstream:
        """Where one attempt of a recorded call goes (``call`` is None for an unmapped model;
        ``tried``: the bases of the attempts lost so far); ``body`` may be changed in place
        (then ``Upstream.changed``)."""
        ...

    def ended(self, call: Call, usage: Usage | None, error: str | None) -> None:
        """Called once per recorded call, after its record is written."""
        ...

    async def answer(self, request: web.BaseRequest) -> web.StreamResponse | None:
        """The router's own answer to a request that is not a recorded call (an admin API),
        or None to forward it."""
        ...


class FixedUpstreams:
    """The recorder's router: each call to the upstream of its model (``upstream_for``, else
    ``upstream``), nothing answered by itself."""

    def __init__(self, config: RecordConfig) -> None:
        self.config = config

    def default_upstream(self) -> str:
        return self.config.default_upstream

    def upstream(self, request: web.BaseRequest, body: dict[str, Any], call: Call | None,
                 tried: tuple[str, ...]) -> Upstream | NoUpstream:
        return Upstream(self.config.upstream_of(body.get("model")))

    def ended(self, call: Call, usage: Usage | None, error: str | None) -> None:
        return None

    async def answer(self, request: web.BaseRequest) -> web.StreamResponse | None:
        return None


class UpstreamLost(Exception):
    """An attempt lost before any byte of an answer came back: the upstream refused, reset or
    closed the connection (``refused``: nothing listened). The call may be sent again."""

    def __init__(self, error: aiohttp.ClientError) -> None:
        super().__init__(str(error))
        self.refused = isinstance(error, aiohttp.ClientConnectorError | UpstreamRefused)


def _lost(exc: aiohttp.ClientError) -> bool:
    """Whether ``exc``, raised before an answer started, means the connection was lost
    (refused, reset, closed) rather than a slow or broken answer."""
    return isinstance(exc, aiohttp.ClientConnectionError) and not isinstance(
        exc, aiohttp.ServerTimeoutError)


def json_error(status: int, message: str, kind: str) -> web.Response:
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}})
    return web.Response(status=status, text=body, content_type="application/json")


class _HeadWithFirstBytes(web.StreamResponse):
    """A streamed answer whose status line and headers wait for its first write and go out in
    one piece with it (aiohttp buffers them so from 3.12 on; before, they go out at once)."""

    _send_headers_immediately = False


def _forward_headers(headers: Mapping[str, str], drop: frozenset[str]) -> CIMultiDict[str]:
    """``headers`` without hop-by-hop ones (and those the Connection header names), ``drop``
    and ``X-Scepsy-*``."""
    named = {t.strip().lower() for v in headers.getall("Connection", [])  # type: ignore[attr-defined]
             for t in v.split(",")} if "Connection" in headers else set()
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        low = k.lower()
        if low in drop or low in named or low.startswith(SCEPSY_PREFIX):
            continue
        out.add(k, v)
    return out


class RecordingProxy:
    """The proxy on the running event loop: ``url = await p.start()``, ``await p.stop()``;
    ``router`` chooses where each call goes (default: :class:`FixedUpstreams`)."""

    def __init__(self, config: RecordConfig, router: Router | None = None) -> None:
        self.config = config
        self.router: Router = router if router is not None else FixedUpstreams(config)
        self._counters = _Counters()
        self._origin = time.monotonic()
        self._file: IO[str] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._lean: LeanPool | None = None  # recorded calls to http:// upstreams
        self._runner: web.ServerRunner | None = None
        self._timeout = aiohttp.ClientTimeout(total=None, connect=config.timeout_s,
                                              sock_read=config.timeout_s)
        self._requests: dict[tuple[str, str], CompletedCalls] = {}
        self._next_call: dict[tuple[str, str], int] = {}
        self._unattributed = 0
        self._inflight: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self.port = 0

    # -- life cycle --------------------------------------------------------------------------

    async def start(self) -> str:
        """Create the trace file (it must not exist), bind, and return the proxy's base URL."""
        cfg = self.config
        try:
            self._file = open(cfg.out, "x", encoding="utf-8")  # noqa: SIM115  (closed in stop)
        except FileExistsError:
            raise InputError(str(cfg.out), "", "a trace file that does not exist yet (the "
                             "proxy never overwrites one)") from None
        except OSError as exc:
            raise InputError(str(cfg.out), "", f"a writable file path ({exc.strerror})") from None
        try:
            loop = asyncio.get_running_loop()

            def request(message: Any, payload: Any, protocol: Any, writer: Any,
                        task: Any) -> web.BaseRequest:  # aiohttp's own, with a larger body
                return web.BaseRequest(message, payload, protocol, writer, task, loop,
                                       client_max_size=cfg.max_body_bytes)

            server = web.Server(self._handle, request_factory=request,
                                handler_cancellation=True, access_log=None, logger=_LOG,
                                keepalive_timeout=IDLE_TIMEOUT_S)
            self._runner = web.ServerRunner(server, handle_signals=False,
                                            shutdown_timeout=SHUTDOWN_GRACE_S)
            await self._runner.setup()
            site = web.TCPSite(self._runner, cfg.host, cfg.port, reuse_address=True)
            await site.start()
        except OSError as exc:
            await self._close()
            cfg.out.unlink(missing_ok=True)
            raise InputError("--listen", "", f"a free address to listen on ({exc.strerror})",
                             f"{cfg.host}:{cfg.port}") from None
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = int(sock.getsockname()[1])
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300,
                                           keepalive_timeout=CLIENT_KEEPALIVE_S),
            auto_decompress=False, timeout=self._timeout)
        self._lean = LeanPool(cfg.timeout_s) if LeanPool.available() else None
        self._origin = time.monotonic()
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop: calls in flight are cut and recorded as ``proxy_stopped``; the file is closed."""
        self._stopping = True
        tasks = [t for t in self._inflight if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._close()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._lean is not None:
            self._lean.close()
            self._lean = None
        if self._file is not None:
            self._file.close()
            self._file = None
            if self._counters.counts["recorded"] == 0:  # an empty file is no trace
                self.config.out.unlink(missing_ok=True)

    def stats(self) -> RecordStats:
        return self._counters.snapshot()

    def _now(self) -> float:
        return round(max(0.0, time.monotonic() - self._origin), 6)

    def age_s(self, call: Call) -> float:
        """Seconds since ``call`` arrived (0 or more)."""
        return max(0.0, time.monotonic() - self._origin - call.start_s)

    def forget(self, workflow: str, request_id: str) -> None:
        """Forget a request's finished calls (kept to infer the parents of its next ones); its
        call counter stays, so the call ids of a request that comes back stay unique."""
        self._requests.pop((workflow, request_id), None)

    # -- dispatch ----------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            if request.method == "POST" and request.path in RECORDED_PATHS:
                return await self._recorded(request)
            answer = await self.router.answer(request)
            return answer if answer is not None else await self._forward(request)
        except BodyRefused as exc:
            refused(_LOG, request, exc.status, exc.reason)
            return json_error(exc.status, exc.reason, "invalid_request_error")
        except ClientGone as exc:
            refused(_LOG, request, 0, str(exc))
            return json_error(400, str(exc), "invalid_request_error")  # nobody left to read it
        finally:
            if task is not None:
                self._inflight.discard(task)

    async def _body(self, request: web.BaseRequest) -> bytes:
        limit = self.config.max_body_bytes
        content = request.content
        announced = request.content_length
        if content.is_eof() and content.exception() is None and (
                announced is None or announced <= limit):
            # the whole body came with the headers (a small call): take it without a timer
            data = content.read_nowait()
            if len(data) > limit:
                raise BodyRefused(413, f"the body is over the limit of {limit} bytes")
            return data
        return await read_body(request, limit, self.config.read_timeout_s)

    async def _forward(self, request: web.BaseRequest) -> web.StreamResponse:
        """Any request that is not recorded: forwarded unchanged, the answer streamed back."""
        assert self._session is not None
        self._counters.counts["forwarded"] += 1
        body = await self._body(request)
        url = self.router.default_upstream() + request.path_qs
        headers = _forward_headers(request.headers, _DROP_REQUEST)
        try:
            up_cm, up = await self._send(request.method, url, body or None, headers)
            try:
                resp = web.StreamResponse(status=up.status, reason=up.reason,
                                          headers=_forward_headers(up.headers, _DROP_RESPONSE))
                await resp.prepare(request)
                try:
                    async for data in up.content.iter_any():
                        await resp.write(data)
                except aiohttp.ClientConnectionResetError:  # the client's side
                    raise
                except (TimeoutError, aiohttp.ClientError):  # the upstream's: end it there
                    pass
                await resp.write_eof()
                return resp
            finally:
                await up_cm.__aexit__(None, None, None)
        except (TimeoutError, aiohttp.ServerTimeoutError):
            return json_error(504, "upstream timed out", "upstream_timeout")
        except aiohttp.ClientError as exc:
            return json_error(502, f"upstream unreachable: {exc}", "upstream_unreachable")

    async def _send(self, method: str, url: str, data: bytes | None, headers: CIMultiDict[str]
                    ) -> tuple[Any, aiohttp.ClientResponse]:
        """Send a request that is not recorded, again on a fresh connection (up to ``retries``
        times) when the connection is lost before an answer starts; the response's context
        manager (to exit) and the response."""
        assert self._session is not None
        attempt = 0
        while True:
            up_cm = self._session.request(method, url, data=data, headers=headers,
                                          allow_redirects=False)
            try:
                return up_cm, await up_cm.__aenter__()
            except aiohttp.ClientError as exc:
                if not _lost(exc) or attempt >= self.config.retries:
                    raise
            attempt += 1
            self._counters.counts["retried"] += 1

    # -- recorded calls ----------------------------------------------------------------------

    def _attribute(self, request: web.BaseRequest, body: dict[str, Any],
                   start: float) -> Call | web.Response | None:
        """The call's request, workflow, role and LLM; a 400 response for a bad header; None
        for an unmapped model (forwarded, not recorded)."""
        h = request.headers
        try:
            wf = h.get(HEADER_WORKFLOW)
            wf = check_name(wf, HEADER_WORKFLOW, "") if wf is not None else \
                self.config.trace_map.workflow
            rid = h.get(HEADER_REQUEST)
            rid = check_name(rid, HEADER_REQUEST, "") if rid is not None else None
            role = h.get(HEADER_ROLE)
            role = check_name(role, HEADER_ROLE, "") if role is not None else None
        except InputError as exc:
            self._counters.counts["rejected"] += 1
            return json_error(400, str(exc), "invalid_request_error")
        model = body.get("model")
        llm = self.config.trace_map.llm_for(model if isinstance(model, str) else None)
        if llm is None:
            self._counters.unmapped[model if isinstance(model, str) and model else NO_MODEL] += 1
            return None
        unattributed = False
        if rid is None:
            user = body.get("user")
            try:
                rid = check_name(user, "user", "") if user is not None else None
            except InputError:
                rid = None
        if rid is None:
            rid = f"call-{self._unattributed}"
            self._unattributed += 1
            unattributed = True
        key = (wf, rid)
        n = self._next_call.get(key, 0)
        self._next_call[key] = n + 1
        return Call(wf, rid, f"c{n}", llm, role, start, unattributed)

    async def _recorded(self, request: web.BaseRequest) -> web.StreamResponse:
        start = self._now()
        raw = await self._body(request)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            self._counters.counts["malformed"] += 1
            return json_error(400, "the request body is not a JSON object",
                               "invalid_request_error")
        call = self._attribute(request, body, start)
        if isinstance(call, web.Response):
            return call
        stream = body.get("stream") is True
        opts = body.get("stream_options")
        asked = isinstance(opts, dict) and opts.get("include_usage") is True
        inject = stream and not asked
        if inject:
            body["stream_options"] = {**(opts if isinstance(opts, dict) else {}),
                                      "include_usage": True}
        headers = _forward_headers(request.headers, _DROP_REQUEST)
        headers["Accept-Encoding"] = "identity"  # the proxy reads what passes
        tried: list[str] = []
        while True:
            sent = dict(body)  # what this attempt's endpoint may change (model, priority)
            up = self.router.upstream(request, sent, call, tuple(tried))
            if isinstance(up, NoUpstream):
                self._end(call, None, up.kind)
                return json_error(up.status, up.message, up.kind)
            data = json.dumps(sent).encode() if inject or up.changed else raw
            try:
                return await self._exchange(request, call, up.base + request.path_qs, data,
                                            headers, stream, inject)
            except UpstreamLost as exc:
                if up.lost is not None:
                    up.lost(exc.refused)
                if len(tried) >= self.config.retries:
                    self._end(call, None, "upstream_unreachable")
                    return json_error(502, f"upstream unreachable: {exc}",
                                       "upstream_unreachable")
                tried.append(up.base)
                self._counters.counts["retried"] += 1
            except asyncio.CancelledError:
                self._end(call, None,
                          "proxy_stopped" if self._stopping else "client_disconnected")
                raise
            except ConnectionError:  # writing to a client that has gone
                self._end(call, None, "client_disconnected")
                raise
            finally:
                if up.release is not None:
                    up.release()

    async def _exchange(self, request: web.BaseRequest, call: Call | None, url: str, raw: bytes,
                        headers: CIMultiDict[str], stream: bool,
                        inject: bool) -> web.StreamResponse:
        """Forward one attempt of a call, answer the client and record the call just before
        the answer's last bytes go out (a call the client sends next starts after this one
        ended); :class:`UpstreamLost` when the connection was lost before an answer started."""
        assert self._session is not None
        target = self._lean.target(url) if self._lean is not None else None
        up_cm: Any
        up: aiohttp.ClientResponse | LeanResponse
        try:
            if target is not None and self._lean is not None:
                up_cm = self._lean.post(target, raw, headers)
            else:
                up_cm = self._session.post(url, data=raw, headers=headers,
                                           allow_redirects=False)
            up = await up_cm.__aenter__()
        except (TimeoutError, aiohttp.ServerTimeoutError):
            self._end(call, None, "upstream_timeout")
            return json_error(504, f"upstream did not answer within {self.config.timeout_s:g} "
                               "s", "upstream_timeout")
        except aiohttp.ClientError as exc:
            if _lost(exc):
                raise UpstreamLost(exc) from exc
            self._end(call, None, "upstream_unreachable")
            return json_error(502, f"upstream unreachable: {exc}", "upstream_unreachable")
        try:
            out_headers = _forward_headers(up.headers, _DROP_RESPONSE)
            if up.status < 400 and stream and \
                    up.headers.get("Content-Type", "").startswith("text/event-stream"):
                return await self._relay(request, call, up, out_headers, inject)
            try:
                data = await up.read()
            except (TimeoutError, aiohttp.ServerTimeoutError):
                self._end(call, None, "upstream_timeout")
                return json_error(504, "upstream timed out mid-answer", "upstream_timeout")
            except aiohttp.ClientError:
                self._end(call, None, "upstream_stream_cut")
                return json_error(502, "upstream closed the connection mid-answer",
                                   "upstream_stream_cut")
            resp = web.Response(status=up.status, reason=up.reason, body=data,
                                headers=out_headers)
            await resp.prepare(request)
            if up.status >= 400:
                self._end(call, None, f"upstream_{up.status}")
            else:
                self._end(call, _body_usage(data), None)
            await resp.write_eof()
            return resp
        finally:
            await up_cm.__aexit__(None, None, None)

    async def _relay(self, request: web.BaseRequest, call: Call | None,
                     up: aiohttp.ClientResponse | LeanResponse, headers: CIMultiDict[str],
                     inject: bool) -> web.StreamResponse:
        """Pass a stream on event by event; record it with its usage (or the estimate). When
        ``[DONE]`` came with the rest of the answer in one read, those last bytes and the end of
        the answer go out in one write (with the headers too when nothing was written yet)."""
        scan = StreamScan(drop_usage_chunk=inject)
        content = up.content
        # bytes of the body came with the headers: the headers wait (microseconds) for them
        # and go out in the same write, not alone; else they go out now, as the upstream's did
        head_waits = isinstance(content, LeanResponse) and content.has_data()
        answer = _HeadWithFirstBytes if head_waits else web.StreamResponse
        resp = answer(status=up.status, reason=up.reason, headers=headers)
        if head_waits and (request.transport is None or request.transport.is_closing()):
            # what sending the headers now would raise (the client has gone)
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        await resp.prepare(request)
        error: str | None = None
        last: bytes | None = None  # the answer's last bytes, when they go out with its end
        try:
            async for data in content.iter_any():
                out = scan.feed(data)
                if scan.done:  # the call is complete for the client (which may close now)
                    self._end_stream(call, scan, None)
                    if content.at_eof():  # nothing more will come: the loop ends
                        last = out
                        continue
                if out or head_waits:  # the first write sends the headers, bytes or none
                    head_waits = False
                    await resp.write(out)
        except (TimeoutError, aiohttp.ServerTimeoutError):
            error = "upstream_timeout"
        except aiohttp.ClientConnectionResetError:  # the client's side
            if scan.done:  # it had its answer and closed: the call ended well
                return resp
            raise
        except aiohttp.ClientError:  # payload errors, disconnects
            error = "upstream_stream_cut"
        try:
            rest = scan.flush()
            if last is not None:  # ended well, recorded: the last bytes with the end
                await resp.write_eof(last + rest if rest else last)
                return resp
            if rest:
                await resp.write(rest)
            if error is None and not scan.done:
                error = "upstream_stream_cut"
            self._end_stream(call, scan, error)
            await resp.write_eof()
        except aiohttp.ClientConnectionResetError:
            if not scan.done:
                raise
        return resp

    def _end_stream(self, call: Call | None, scan: StreamScan, error: str | None) -> None:
        if error is not None:
            self._end(call, None, error)
        elif scan.usage is not None:
            self._end(call, scan.usage, None)
        else:
            self._end(call, Usage(0, scan.content_chunks, 0), None, estimated=True)

    def _end(self, call: Call | None, usage: Usage | None, error: str | None, *,
             estimated: bool = False) -> None:
        """Write the call's record once (parents from its request's calls so far) and flush.
        ``estimated``: the upstream sent no usage (counted); for a non-streamed answer, a
        missing ``usage`` leaves the tokens 0."""
        if call is None or call.ended:
            return
        call.ended = True
        missing = error is None and (usage is None or estimated)
        u = usage or Usage(0, 0, 0)
        key = (call.workflow, call.request_id)
        done = self._requests.get(key)
        if done is None:
            done = self._requests[key] = CompletedCalls()
        args = (call.workflow, call.request_id, call.call_id, call.start_s,
                max(self._now(), call.start_s), call.llm, None, call.role)
        counts = (u.input_tokens, u.output_tokens, u.prefix_tokens, error)
        rec = CallRecord(*args, (), *counts)
        parents = done.parents_of(rec)
        if parents:
            rec = CallRecord(*args, parents, *counts)
        done.add(rec)
        self._counters.add_call(rec, call.unattributed, missing)
        lines = client_gap(rec, done.by_id) if self.config.client_time else (rec,)
        if self._file is not None:
            self._file.write(lines[0].to_json() + "\n" if len(lines) == 1
                             else "".join(r.to_json() + "\n" for r in lines))
            self._file.flush()
        self.router.ended(call, usage, error)


def client_gap(rec: CallRecord, done: Mapping[str, CallRecord]) -> tuple[CallRecord, ...]:
    """``rec`` as :func:`~scepsy_opt.traces.with_client_time` writes it after its parents
    (``done``: its request's completed calls by id, which hold them): the client's time before
    it, when long enough, as a ``client`` tool call it waited on and that waited on its parents
    (the gap first), else ``rec`` alone. The same records as ``with_client_time([*parents,
    rec])`` without the parents, at a fraction of its cost (one call per proxied call)."""
    if rec.error is not None or not rec.parents:
        return (rec,)
    last_end = max(done[p].end_s for p in rec.parents)
    gap_s = rec.start_s - last_end
    if gap_s <= 0 or gap_s < CLIENT_MIN_GAP_S - TIME_TOLERANCE_S:
        return (rec,)
    taken = {*rec.parents, rec.call_id}
    cid = f"{rec.call_id}.client"
    while cid in taken:
        cid += "_"
    gap = CallRecord(rec.workflow, rec.request_id, cid, last_end, rec.start_s, tool=CLIENT_TOOL,
                     parents=rec.parents)
    return (gap, replace(rec, parents=(cid,)))


def _body_usage(data: bytes) -> Usage | None:
    """The usage of a non-streamed answer (None when it has none)."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return parse_usage(obj.get("usage")) if isinstance(obj, dict) else None


# ------------------------------------------------------------------------------- in a thread


class Service(Protocol):
    """What runs on an event loop and counts what it recorded: a :class:`RecordingProxy`, or the
    gateway that owns one."""

    async def start(self) -> str:
        """Listen; the base URL."""
        ...

    async def stop(self) -> None: ...

    def stats(self) -> RecordStats: ...


class ProxyURL(str):
    """The base URL of a proxy run by :func:`recording_proxy`; ``.stats()`` reads its counts."""

    _proxy: Service
    _loop: asyncio.AbstractEventLoop

    def stats(self) -> RecordStats:
        fut = asyncio.run_coroutine_threadsafe(_snapshot(self._proxy), self._loop)
        return fut.result(10)


async def _snapshot(proxy: Service) -> RecordStats:
    return proxy.stats()


def recording_proxy(config: RecordConfig) -> contextlib.AbstractContextManager[ProxyURL]:
    """Run a :class:`RecordingProxy` on its own event loop in a thread; yields its base URL (a
    :class:`ProxyURL`: a ``str`` with ``.stats()``); stops it (``proxy_stopped`` for calls still
    in flight) and closes the trace on exit."""
    return proxy_in_thread(RecordingProxy(config))


@contextlib.contextmanager
def proxy_in_thread(proxy: Service) -> Iterator[ProxyURL]:
    """:func:`recording_proxy` for a service already built (the gateway)."""
    loop = asyncio.new_event_loop()
    started: dict[str, Any] = {}
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            started["url"] = loop.run_until_complete(proxy.start())
        except BaseException as exc:
            started["error"] = exc
            ready.set()
            loop.close()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    thread = threading.Thread(target=run, name="scepsy-record", daemon=True)
    thread.start()
    ready.wait()
    if "error" in started:
        thread.join()
        raise started["error"]
    url = ProxyURL(started["url"])
    url._proxy, url._loop = proxy, loop
    try:
        yield url
    finally:
        asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)


async def serve(config: RecordConfig, stop: asyncio.Event,
                on_start: Callable[[str], None] | None = None,
                proxy: Service | None = None) -> RecordStats:
    """Run a proxy on the current loop until ``stop`` is set; its final stats. ``on_start``
    (optional) is called with the base URL once it listens; ``proxy``: a service already built
    (the gateway) in place of ``RecordingProxy(config)``."""
    proxy = proxy if proxy is not None else RecordingProxy(config)
    url = await proxy.start()
    try:
        if on_start is not None:
            on_start(url)
        await stop.wait()
    finally:
        await proxy.stop()
    return proxy.stats()
