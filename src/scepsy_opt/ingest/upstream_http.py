"""A lean HTTP/1.1 client for the recording proxy's forwarded calls: one POST at a time per
pooled connection to a plain ``http://`` upstream, its answer parsed by httptools (llhttp).

It stands in for :class:`aiohttp.ClientSession` on the proxy's hot path, where aiohttp's client
(its request and response objects, its connector, its timers) was about a quarter of the CPU
time the proxy spends on a call. It keeps the session's behaviour as the proxy sees it: the same
request headers on the wire (``Host``, ``Accept``, ``User-Agent``, ``Content-Type`` and
``Content-Length`` where the caller gave none), idle connections reused for at most
:data:`~scepsy_common.net.CLIENT_KEEPALIVE_S`, ``timeout_s`` on the connection and on every read,
bodies passed on as they arrive, no decompression, no redirects, and aiohttp's exceptions, so
that the proxy's error handling reads them alike: a connection that could not be made
(:class:`UpstreamRefused`), lost before any byte of the answer
(:class:`aiohttp.ServerDisconnectedError`), a timeout (:class:`aiohttp.ServerTimeoutError`), an
answer cut short or malformed (:class:`aiohttp.ClientPayloadError`). The response offers what the
proxy reads of aiohttp's: ``status``, ``reason``, ``headers``, ``read()`` and
``content.iter_any()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

import aiohttp
from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict

from scepsy_common.net import CLIENT_KEEPALIVE_S

try:  # the proxy falls back to aiohttp's client without it
    import httptools

    HAVE_HTTPTOOLS = True
except ImportError:  # pragma: no cover - httptools is a dependency
    HAVE_HTTPTOOLS = False

__all__ = ["LeanPool", "LeanResponse", "LeanTarget", "UpstreamRefused", "lean_target", "request_head"]

READ_HIGH_WATER = 256 * 1024
"""Bytes of an answer held unread before the connection stops reading from the upstream."""


class UpstreamRefused(aiohttp.ClientConnectionError):
    """No connection to the upstream could be made (refused, unreachable, no such host): as
    aiohttp's :class:`aiohttp.ClientConnectorError`, nothing of the call reached it."""


@dataclass(frozen=True, slots=True)
class LeanTarget:
    """Where a call goes: the upstream's host and port, its ``Host`` header and the request
    target (path and query) of the request line."""

    host: str
    port: int
    host_header: str
    target: str


def lean_target(url: str) -> LeanTarget | None:
    """``url`` as a :class:`LeanTarget`, or None where the lean client does not go (``https``,
    credentials in the URL, a target with bytes outside printable ASCII): aiohttp's then."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "http" or parts.hostname is None or parts.username is not None \
            or parts.fragment:
        return None
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    if not target.startswith("/") or any(not 0x21 <= ord(ch) <= 0x7E for ch in target):
        return None
    host = parts.hostname
    host_header = parts.netloc if port is not None and port != 80 else (
        f"[{host}]" if ":" in host else host)
    return LeanTarget(host, 80 if port is None else port, host_header, target)


def request_head(target: LeanTarget, headers: Mapping[str, str], length: int) -> bytes:
    """The request line and headers of a POST of ``length`` body bytes, as aiohttp's client
    writes them: the caller's headers, plus ``Host``, ``Accept: */*``, its ``User-Agent`` and
    ``Content-Type: application/octet-stream`` where the caller gave none, and
    ``Content-Length``."""
    lines = [f"POST {target.target} HTTP/1.1", f"Host: {target.host_header}"]
    seen = set()
    for k, v in headers.items():
        low = k.lower()
        if low in ("host", "content-length"):
            continue
        seen.add(low)
        lines.append(f"{k}: {v}")
    if "accept" not in seen:
        lines.append("Accept: */*")
    if "user-agent" not in seen:
        lines.append(f"User-Agent: {SERVER_SOFTWARE}")
    if "content-type" not in seen and length:
        lines.append("Content-Type: application/octet-stream")
    lines.append(f"Content-Length: {length}")
    if any("\r" in line or "\n" in line for line in lines):
        raise ValueError("a header holds a line break")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class LeanResponse:
    """One answer as it arrives: ``status``, ``reason``, ``headers`` (once
    :meth:`LeanPool.post`'s context is entered), then its body by :meth:`read` or
    ``content.iter_any()``; the connection goes back to the pool when the body was read whole."""

    def __init__(self, conn: _Conn, timeout_s: float) -> None:
        self._conn = conn
        self._timeout_s = timeout_s
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.content = self
        self._raw: list[tuple[bytes, bytes]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._started = False  # a byte of the answer came
        self._head = False  # status line and headers parsed
        self._eof = False  # the whole body came
        self._until_close = False  # no length, not chunked: the body ends with the connection
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- the connection's side ---------------------------------------------------------------

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None and not self._eof:
            self._error = exc
        self._wake()

    # -- the proxy's side --------------------------------------------------------------------

    async def _wait(self) -> None:
        """Until the connection has news (bytes, the end, an error), at most ``timeout_s``."""
        loop = self._conn.loop
        self._waiter = fut = loop.create_future()
        timer = loop.call_later(self._timeout_s, _time_out, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._waiter = None

    async def _start(self) -> None:
        """Until the status line and headers are in."""
        while not self._head:
            if self._error is not None:
                raise self._error
            await self._wait_or_fail()
        # a body cut short after the headers is the reader's error (as aiohttp's)

    def _take(self) -> bytes:
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        if self._buffered > READ_HIGH_WATER:
            self._conn.resume()
        self._buffered = 0
        return data

    async def _next(self) -> bytes:
        """The body bytes that came since the last call; b"" at the end."""
        while True:
            if self._chunks:
                return self._take()
            if self._eof:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait_or_fail()

    async def _wait_or_fail(self) -> None:
        """:meth:`_wait`; past the read timeout, the connection closed and aiohttp's own
        timeout error raised (what the proxy's retry and error handling expect)."""
        try:
            await self._wait()
        except TimeoutError:
            self._conn.close()
            raise aiohttp.ServerTimeoutError(
                f"Timeout on reading data from socket ({self._timeout_s:g} s)") from None

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while data := await self._next():
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def has_data(self) -> bool:
        """Whether body bytes (or the body's end) came that were not taken yet."""
        return bool(self._chunks) or self._eof

    def at_eof(self) -> bool:
        """Whether the whole body came and was taken (as aiohttp's ``StreamReader.at_eof``)."""
        return self._eof and not self._chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrives in."""
        while data := await self._next():
            yield data


def _time_out(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class _Conn(asyncio.Protocol):
    """One connection to an upstream and the answer it is reading."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: LeanResponse | None = None
        self.closed = False
        self.reusable = False
        self.idle_since = 0.0
        self.paused = False

    # asyncio's callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # not a TCP socket
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        resp._started = True
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # httptools' parse errors (and an upgrade), all malformed
            self.close()
            resp._fail(aiohttp.ClientPayloadError(f"malformed answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self.resp
        if resp is None:
            return
        if resp._head and resp._until_close and exc is None:
            resp._eof = True
            resp._wake()
        elif not resp._started:
            resp._fail(aiohttp.ClientOSError(exc.errno or 0, str(exc))
                       if isinstance(exc, OSError)
                       else aiohttp.ServerDisconnectedError())
        else:
            resp._fail(aiohttp.ClientPayloadError("Response payload is not completed"))

    # httptools' callbacks
    def on_status(self, reason: bytes) -> None:
        assert self.resp is not None
        self.resp.reason += reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.resp is not None
        self.resp._raw.append((name, value))

    def on_headers_complete(self) -> None:
        resp = self.resp
        assert resp is not None
        resp.status = self.parser.get_status_code()
        headers: CIMultiDict[str] = CIMultiDict()
        chunked = length = False
        for k, v in resp._raw:
            name, value = k.decode("latin-1"), v.decode("latin-1")
            headers.add(name, value)
            low = name.lower()
            if low == "content-length":
                length = True
            elif low == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        resp.headers = headers
        resp._raw = []
        no_body = resp.status in (204, 304) or 100 <= resp.status < 200
        resp._until_close = not (chunked or length or no_body)
        resp._head = True
        resp._wake()

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        assert resp is not None
        resp._chunks.append(body)
        resp._buffered += len(body)
        if resp._buffered > READ_HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        resp._wake()

    def on_message_complete(self) -> None:
        resp = self.resp
        assert resp is not None
        self.reusable = self.parser.should_keep_alive() and not resp._until_close
        resp._eof = True
        resp._wake()

    # the pool's side
    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


class _Exchange:
    """:meth:`LeanPool.post`'s context: sends the request on entry (the response, once its
    headers are in), gives the connection back on exit (when the body was read whole)."""

    def __init__(self, pool: LeanPool, target: LeanTarget, data: bytes,
                 headers: Mapping[str, str]) -> None:
        self._pool, self._target, self._data, self._headers = pool, target, data, headers
        self._conn: _Conn | None = None

    async def __aenter__(self) -> LeanResponse:
        pool, t = self._pool, self._target
        head = request_head(t, self._headers, len(self._data))
        conn = await pool.acquire(t.host, t.port)
        self._conn = conn
        resp = conn.resp = LeanResponse(conn, pool.timeout_s)
        conn.reusable = False
        conn.parser = httptools.HttpResponseParser(conn)
        assert conn.transport is not None
        conn.transport.write(head + self._data if len(self._data) < 64 * 1024 else head)
        if len(self._data) >= 64 * 1024:
            conn.transport.write(self._data)
        try:
            await resp._start()
        except BaseException:  # an error, or the call cancelled (its client left): drop it
            self._conn = None
            pool.forget(conn)
            conn.resp = None
            conn.close()
            raise
        return resp

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        resp = conn.resp
        conn.resp = None
        self._pool.forget(conn)
        if resp is not None and resp._eof and not resp._chunks and conn.reusable \
                and not conn.closed and exc_type is None:
            conn.resume()
            self._pool.release(self._target.host, self._target.port, conn)
        else:
            conn.close()


class LeanPool:
    """Pooled connections to the upstreams (per host and port, the most recently used first;
    one idle for :data:`~scepsy_common.net.CLIENT_KEEPALIVE_S` or longer is closed, not
    reused); ``timeout_s`` bounds the connection and each read."""

    def __init__(self, timeout_s: float, keepalive_s: float = CLIENT_KEEPALIVE_S) -> None:
        self.timeout_s = timeout_s
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._busy: set[_Conn] = set()
        self._targets: dict[str, LeanTarget | None] = {}
        self.opened = 0

    @staticmethod
    def available() -> bool:
        """Whether httptools is installed (else the proxy uses aiohttp's client)."""
        return HAVE_HTTPTOOLS

    def target(self, url: str) -> LeanTarget | None:
        """:func:`lean_target` of ``url``, remembered (for up to 4,096 URLs)."""
        try:
            return self._targets[url]
        except KeyError:
            pass
        if len(self._targets) >= 4096:
            self._targets.clear()
        t = self._targets[url] = lean_target(url)
        return t

    def post(self, target: LeanTarget, data: bytes,
             headers: Mapping[str, str]) -> _Exchange:
        """``async with pool.post(target, data, headers) as resp:`` (see :class:`_Exchange`)."""
        return _Exchange(self, target, data, headers)

    async def acquire(self, host: str, port: int) -> _Conn:
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                conn.close()
                continue
            if now - conn.idle_since >= self.keepalive_s:
                conn.close()
                continue
            self._busy.add(conn)
            return conn
        loop = asyncio.get_running_loop()
        try:
            transport, proto = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(loop), host, port), self.timeout_s)
        except TimeoutError:
            raise aiohttp.ConnectionTimeoutError(
                f"Connection timeout to host {host}:{port}") from None
        except OSError as exc:
            raise UpstreamRefused(f"Cannot connect to host {host}:{port} "
                                  f"[{exc.strerror or exc}]") from exc
        self.opened += 1
        conn = proto
        assert isinstance(conn, _Conn)
        if conn.transport is None:  # uvloop may call connection_made later
            conn.transport = cast(asyncio.Transport, transport)
        self._busy.add(conn)
        return conn

    def forget(self, conn: _Conn) -> None:
        """``conn`` is no longer in use (given back or closed next)."""
        self._busy.discard(conn)

    def release(self, host: str, port: int, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault((host, port), []).append(conn)

    def close(self) -> None:
        """Close every connection, idle or in use."""
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        for conn in list(self._busy):
            conn.close()
        self._busy.clear()
