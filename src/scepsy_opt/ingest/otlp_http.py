"""Receive OpenTelemetry spans over OTLP/HTTP and write them as OTLP/JSON lines.

An application instrumented with OpenTelemetry exports its spans with an OTLP/HTTP exporter
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces``). The receiver answers
``POST /v1/traces`` like an OpenTelemetry collector does and appends each export request to a
file as one line of JSON, in the OTLP/JSON mapping that the collector's file exporter writes:
camelCase field names, trace and span ids as lowercase hex, 64-bit integers as strings, enums
as integers (``"kind": 3``, ``"status": {"code": 2}`` for an error). Protobuf and JSON request
bodies, plain or gzip-compressed, are accepted; both come out the same way, so the same spans
give the same bytes whichever encoding the exporter used. :mod:`scepsy_opt.ingest.otel` reads the file.

- :func:`otlp_request_to_json` converts one request body.
- :func:`otlp_receiver` runs the receiver in a thread (``with otlp_receiver(out) as url:``);
  :class:`OtlpReceiver` does the same and also counts what it wrote.
- :func:`receive` runs it in the calling thread until SIGINT, SIGTERM or a duration
  (``scepsy trace receive``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from scepsy_common.errors import InputError
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
from scepsy_opt.ingest.otel import id_bytes

__all__ = ["JSON", "MAX_BODY_BYTES", "PROTOBUF", "TRACES_PATH", "BadExportRequest", "BodyTooLarge",
           "OtlpReceiver", "ReceiveCounts", "UnsupportedMediaType", "otlp_receiver",
           "otlp_request_to_json", "receive", "request_line", "span_count"]

TRACES_PATH = "/v1/traces"
"""The OTLP/HTTP path of trace exports."""
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY_BYTES = 64 * 2**20
"""The largest export request accepted, bytes, as sent and after decompression (``scepsy trace
receive --max-body-bytes``); a larger one gets 413, before its body is read when its
``Content-Length`` says so."""
SOURCE = "OTLP export request"

_ID_BYTES = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


class BadExportRequest(InputError):
    """A request body that is not an OTLP export request (the receiver answers 400)."""


class UnsupportedMediaType(InputError):
    """A content type or content encoding the receiver does not read (answered 415)."""


class BodyTooLarge(InputError):
    """A request body larger than the limit once decompressed (answered 413)."""


def _media_type(content_type: str) -> str:
    """The media type of a Content-Type header, lower case, without parameters."""
    return content_type.split(";", 1)[0].strip().lower()


def otlp_request_to_json(body: bytes, content_type: str) -> dict[str, Any]:
    """One OTLP/HTTP trace export body as the OTLP/JSON mapping (see the module docstring).

    ``content_type`` is the request's Content-Type: ``application/x-protobuf`` (an
    ``ExportTraceServiceRequest``) or ``application/json`` (its JSON mapping, ids in hex; base64
    ids are accepted too); the body must already be decompressed. A JSON body is read into the
    protobuf message and written back, so both encodings give the same mapping. Raises
    :class:`BadExportRequest` for a body that cannot be read and :class:`UnsupportedMediaType`
    for any other content type.
    """
    kind = _media_type(content_type)
    if kind == PROTOBUF:
        msg = _parse_protobuf(body)
    elif kind == JSON:
        msg = _parse_json(body)
    else:
        raise UnsupportedMediaType(SOURCE, "Content-Type", f"{PROTOBUF} or {JSON}", content_type)
    return _to_json(msg)


def _parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    msg = ExportTraceServiceRequest()
    try:
        msg.ParseFromString(body)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise BadExportRequest(SOURCE, "body", "a protobuf ExportTraceServiceRequest",
                               _short(exc)) from None
    return msg


def _parse_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadExportRequest(SOURCE, "body", "a JSON document", _short(exc)) from None
    if not isinstance(doc, dict):
        raise BadExportRequest(SOURCE, "body", "a JSON object", type(doc).__name__)
    if not isinstance(doc.get("resourceSpans"), list):
        raise BadExportRequest(SOURCE, "resourceSpans", "a list of resource spans",
                               type(doc.get("resourceSpans")).__name__)
    _map_ids(doc, _id_to_base64)
    msg = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise BadExportRequest(SOURCE, "body", "an ExportTraceServiceRequest in the OTLP/JSON "
                               "mapping", _short(exc)) from None
    return msg


def _to_json(msg: ExportTraceServiceRequest) -> dict[str, Any]:
    doc = json_format.MessageToDict(msg, use_integers_for_enums=True)
    doc.setdefault("resourceSpans", [])
    _map_ids(doc, _base64_to_hex)
    return doc


def _map_ids(doc: dict[str, Any], convert: Callable[[str, str], str]) -> None:
    """Apply ``convert(field, value)`` to the trace and span ids of every span and link."""
    for rs in _dicts(doc.get("resourceSpans")):
        for ss in _dicts(rs.get("scopeSpans")):
            for span in _dicts(ss.get("spans")):
                _convert_ids(span, convert)
                for link in _dicts(span.get("links")):
                    _convert_ids(link, convert)


def _dicts(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadExportRequest(SOURCE, "body", "lists for resourceSpans, scopeSpans, spans and "
                               "links", type(value).__name__)
    return [v for v in value if isinstance(v, dict)]  # other items: ParseDict says what is wrong


def _convert_ids(obj: dict[str, Any], convert: Callable[[str, str], str]) -> None:
    for key in _ID_BYTES:
        value = obj.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise BadExportRequest(SOURCE, key, "a hex string", value)
            obj[key] = convert(key, value)


def _id_to_base64(key: str, value: str) -> str:
    """A JSON id (hex, as OTLP/JSON has it; base64 from older exporters) as protobuf's base64."""
    size = _ID_BYTES[key]
    if not value:
        return value
    raw = id_bytes(value, size)
    if raw is None:
        raise BadExportRequest(SOURCE, key, f"{2 * size} hex digits", value)
    return base64.b64encode(raw).decode("ascii")


def _base64_to_hex(key: str, value: str) -> str:
    return base64.b64decode(value).hex()


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def request_line(doc: dict[str, Any]) -> str:
    """One export request as the compact JSON line written to the file (with its newline);
    the line separators JSON leaves raw in strings (U+0085, U+2028, U+2029) are escaped, so that
    no reader that splits lines on them cuts the line."""
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.translate(_LINE_BREAKS) + "\n"


_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def span_count(doc: dict[str, Any]) -> int:
    """How many spans an export request (OTLP/JSON mapping) holds."""
    return sum(len(ss.get("spans", ())) for rs in doc.get("resourceSpans", ())
               for ss in rs.get("scopeSpans", ()))


def _gunzip(data: bytes, limit: int = MAX_BODY_BYTES) -> bytes:
    """A gzip body (one or more members) decompressed; :class:`BodyTooLarge` past ``limit``
    bytes, :class:`BadExportRequest` when it is not gzip or is cut short."""
    out = bytearray()
    rest = data
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += d.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise BadExportRequest(SOURCE, "body", "gzip-compressed data (Content-Encoding: "
                                   "gzip)", _short(exc)) from None
        if len(out) > limit or d.unconsumed_tail:
            raise BodyTooLarge(SOURCE, "body", f"at most {limit} bytes once decompressed")
        if not d.eof:
            raise BadExportRequest(SOURCE, "body", "complete gzip data", "cut short")
        rest = d.unused_data
        if not rest:
            return bytes(out)


# ---------------------------------------------------------------------------------- server


@dataclass(frozen=True)
class ReceiveCounts:
    """What a receiver wrote: export requests (lines) and spans."""

    requests: int
    spans: int


class _Sink:
    """The open output file and what was written to it."""

    def __init__(self, out: Path, exclusive: bool) -> None:
        self.path = out
        self.created = exclusive or not out.exists()
        self.file: IO[str] = open(out, "x" if exclusive else "a", encoding="utf-8")  # noqa: SIM115
        self.requests = 0
        self.spans = 0

    def write(self, doc: dict[str, Any]) -> None:
        self.file.write(request_line(doc))
        self.file.flush()
        self.requests += 1
        self.spans += span_count(doc)

    def close(self, remove_if_empty: bool = False) -> None:
        self.file.close()
        if remove_if_empty and self.created and self.requests == 0:
            self.path.unlink(missing_ok=True)

    def counts(self) -> ReceiveCounts:
        return ReceiveCounts(self.requests, self.spans)


_SINK = web.AppKey("sink", _Sink)
_LIMIT = web.AppKey("limit", int)
_READ_TIMEOUT = web.AppKey("read_timeout", float)
_LOG = one_line_logger("scepsy trace receive")


def _text(request: web.Request, status: int, exc: InputError | BodyRefused) -> web.Response:
    """An error answer, and its one log line."""
    refused(_LOG, request, status, str(exc))
    return web.Response(status=status, text=str(exc) + "\n")


async def _export(request: web.Request) -> web.StreamResponse:
    sink, limit = request.app[_SINK], request.app[_LIMIT]
    ctype = request.headers.get("Content-Type", "")
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if _media_type(ctype) not in (PROTOBUF, JSON):
        return _text(request, 415, UnsupportedMediaType(
            SOURCE, "Content-Type", f"{PROTOBUF} or {JSON}", ctype))
    if encoding not in ("identity", "gzip", ""):
        return _text(request, 415, UnsupportedMediaType(
            SOURCE, "Content-Encoding", "gzip or none", encoding))
    try:
        body = await read_body(request, limit, request.app[_READ_TIMEOUT])
    except BodyRefused as exc:
        return _text(request, exc.status, exc)
    except ClientGone as exc:
        refused(_LOG, request, 0, str(exc))
        return web.Response(status=400, text=str(exc) + "\n")  # nobody left to read it
    try:
        if encoding == "gzip":
            body = _gunzip(body, limit)
        doc = otlp_request_to_json(body, ctype)  # strings: valid UTF-8, no lone surrogates
    except BodyTooLarge as exc:
        return _text(request, 413, exc)
    except BadExportRequest as exc:
        return _text(request, 400, exc)
    sink.write(doc)
    if _media_type(ctype) == PROTOBUF:
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type=PROTOBUF)
    return web.Response(body=b"{}", content_type=JSON)


def _make_app(sink: _Sink, max_body_bytes: int = MAX_BODY_BYTES,
              read_timeout_s: float = READ_TIMEOUT_S) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes, logger=_LOG)
    app[_SINK] = sink
    app[_LIMIT] = max_body_bytes
    app[_READ_TIMEOUT] = float(read_timeout_s)
    app.router.add_post(TRACES_PATH, _export)
    return app


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _start(sink: _Sink, host: str, port: int, max_body_bytes: int,
                 read_timeout_s: float = READ_TIMEOUT_S) -> tuple[web.AppRunner, str]:
    """Bind and start serving; returns the runner and the base URL (the bound port). Clients
    that misbehave get an HTTP error and one log line (:mod:`scepsy_common.httpguard`)."""
    runner = web.AppRunner(_make_app(sink, max_body_bytes, read_timeout_s), access_log=None,
                           auto_decompress=False, handle_signals=False, logger=_LOG,
                           keepalive_timeout=IDLE_TIMEOUT_S, shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0]
    return runner, _url(host, int(bound[1]))


def _check_limit(max_body_bytes: int, read_timeout_s: float = READ_TIMEOUT_S) -> None:
    if isinstance(max_body_bytes, bool) or not (isinstance(max_body_bytes, int)
                                                and max_body_bytes >= 1):
        raise InputError("otlp receiver", "max_body_bytes", "an integer >= 1", max_body_bytes)
    if isinstance(read_timeout_s, bool) or not isinstance(read_timeout_s, int | float) \
            or not 0 < read_timeout_s < float("inf"):
        raise InputError("otlp receiver", "read_timeout_s", "a number of seconds > 0",
                         read_timeout_s)


class OtlpReceiver:
    """The receiver in a thread of its own (its own event loop), as a context manager::

        with OtlpReceiver("spans.otlp.jsonl") as r:
            ...  # export to r.url + "/v1/traces"
        print(r.requests, r.spans)

    ``port=0`` takes a free port (``r.url`` has it). The output file is appended to
    (``exclusive=True``: created, FileExistsError when it exists). A bind error (port in use)
    is raised from ``__enter__``. On exit requests being answered are finished, the server stops
    and the file is closed. ``max_body_bytes``: see :data:`MAX_BODY_BYTES`; ``read_timeout_s``:
    a client that pauses longer mid-body is answered 408.
    """

    def __init__(self, out: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0, *,
                 max_body_bytes: int = MAX_BODY_BYTES, exclusive: bool = False,
                 read_timeout_s: float = READ_TIMEOUT_S) -> None:
        _check_limit(max_body_bytes, read_timeout_s)
        self.out = Path(out)
        self.host, self.port, self.max_body_bytes = host, port, max_body_bytes
        self.read_timeout_s = read_timeout_s
        self.exclusive = exclusive
        self.url = ""
        self._sink: _Sink | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def requests(self) -> int:
        """Export requests written so far."""
        return self._sink.requests if self._sink else 0

    @property
    def spans(self) -> int:
        """Spans written so far."""
        return self._sink.spans if self._sink else 0

    def counts(self) -> ReceiveCounts:
        return ReceiveCounts(self.requests, self.spans)

    def __enter__(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._run, name="otlp-receiver", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by __enter__ (bind errors and the like)
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._sink = _Sink(self.out, self.exclusive)
        try:
            runner, self.url = await _start(self._sink, self.host, self.port,
                                            self.max_body_bytes, self.read_timeout_s)
        except BaseException:
            self._sink.close(remove_if_empty=True)
            raise
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            self._sink.close()


@contextmanager
def otlp_receiver(out: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0, *,
                  max_body_bytes: int = MAX_BODY_BYTES, exclusive: bool = False
                  ) -> Iterator[str]:
    """Run the receiver in a thread; yields its base URL (``http://127.0.0.1:PORT``; export
    to that plus ``/v1/traces``). See :class:`OtlpReceiver`, which also counts."""
    with OtlpReceiver(out, host, port, max_body_bytes=max_body_bytes,
                      exclusive=exclusive) as r:
        yield r.url


def receive(out: str | os.PathLike[str], host: str, port: int, *,
            duration_s: float | None = None, max_body_bytes: int = MAX_BODY_BYTES,
            on_listening: Callable[[str], None] | None = None,
            read_timeout_s: float = READ_TIMEOUT_S) -> ReceiveCounts:
    """Serve in the calling thread until SIGINT or SIGTERM (main thread only) or until
    ``duration_s`` seconds have passed; ``out`` must not exist (FileExistsError). Returns what
    was written. ``on_listening(url)`` is called once the port is bound. A bind error (port in
    use, address not on this host) raises OSError and leaves no file behind."""
    _check_limit(max_body_bytes, read_timeout_s)
    return asyncio.run(_receive(Path(out), host, port, duration_s, max_body_bytes,
                                on_listening, read_timeout_s))


async def _receive(out: Path, host: str, port: int, duration_s: float | None,
                   max_body_bytes: int, on_listening: Callable[[str], None] | None,
                   read_timeout_s: float) -> ReceiveCounts:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    sink = _Sink(out, exclusive=True)
    try:
        runner, url = await _start(sink, host, port, max_body_bytes, read_timeout_s)
    except BaseException:
        sink.close(remove_if_empty=True)
        raise
    handled: list[signal.Signals] = []
    try:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
        if on_listening is not None:
            on_listening(url)
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), duration_s)
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        sink.close()
    return sink.counts()
