"""What scepsy's small HTTP servers (``scepsy trace receive``, ``scepsy record``) do about
clients that misbehave: one log line each, never a traceback, and the server keeps serving.

- :func:`read_body` reads a request body within a size limit and a read timeout: a
  ``Content-Length`` over the limit is answered 413 before any byte of the body is read, a body
  that grows past it 413 as soon as it does, a client that sends nothing for ``read_timeout_s``
  408, and a client that disconnects mid-body is reported, not raised as an error of the server.
- :func:`one_line_logger` is the logger to give aiohttp's server (``logger=``): what aiohttp
  reports (a request line or header it cannot parse, answered 400 by aiohttp itself; an error in
  a handler, answered 500) becomes one line naming the client and the reason.
- :data:`IDLE_TIMEOUT_S`: how long a connection may wait for a request's headers (or for the
  next request) before it is closed (aiohttp's ``keepalive_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["IDLE_TIMEOUT_S", "READ_TIMEOUT_S", "SHUTDOWN_GRACE_S", "BodyRefused", "ClientGone",
           "one_line_logger", "read_body", "refused"]

READ_TIMEOUT_S = 30.0
"""The longest a client may pause while sending a request body before it is answered 408."""
SHUTDOWN_GRACE_S = 5.0
"""How long a stopping server (Ctrl-C, SIGTERM, ``--duration``) waits for the requests it is
still reading or answering before it closes their connections: a slow client must not hold a
stop for :data:`READ_TIMEOUT_S`."""
IDLE_TIMEOUT_S = 75.0
"""The longest a connection may stay open without a complete request (headers sent slowly, or
idle between requests) before the server closes it."""


class BodyRefused(Exception):
    """A request body the server will not read on: ``status`` (413, 408) and ``reason``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class ClientGone(Exception):
    """The client disconnected (or broke the body's framing) before its body was complete."""


def _describe(exc: BaseException) -> str:
    """An exception as one short line: aiohttp's parse errors by their message, others by
    type and the first line of their text."""
    if isinstance(exc, HttpProcessingError):
        text = " ".join(w for w in str(exc.message).split() if w != "^")
        return f"{exc.code} {text or type(exc).__name__}"[:200]
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    return (f"{type(exc).__name__}: {first}" if first else type(exc).__name__)[:200]


async def read_body(request: web.BaseRequest, limit: int,
                    read_timeout_s: float = READ_TIMEOUT_S) -> bytes:
    """The whole body of ``request``, at most ``limit`` bytes as sent.

    :class:`BodyRefused` (413) when ``Content-Length`` or the bytes received pass ``limit``,
    (408) when no byte arrives for ``read_timeout_s`` seconds; :class:`ClientGone` when the
    client disconnects or sends a malformed chunked body before the end."""
    announced = request.content_length
    if announced is not None and announced > limit:
        raise BodyRefused(413, f"Content-Length {announced} is over the limit of {limit} bytes")
    buf = bytearray()
    while True:
        try:
            chunk = await asyncio.wait_for(request.content.readany(), read_timeout_s)
        except TimeoutError:
            raise BodyRefused(408, f"no body bytes for {read_timeout_s:g} s ({len(buf)} of "
                              f"{announced if announced is not None else '?'} received)"
                              ) from None
        except (ConnectionError, web.RequestPayloadError) as exc:
            raise ClientGone(f"the client left mid-body ({len(buf)} of "
                             f"{announced if announced is not None else '?'} bytes received: "
                             f"{_describe(exc)})") from None
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            raise BodyRefused(413, f"the body is over the limit of {limit} bytes")


def refused(log: logging.Logger, request: web.BaseRequest, status: int, reason: str) -> None:
    """Log one line for a request the server refused (``status``) or could not finish."""
    log.warning("%s %s from %s: %s%s", request.method, request.path, request.remote or "?",
                f"answered {status}: " if status else "", reason)


_AIOHTTP_REQUEST_ERROR = "Error handling request from "
"""How aiohttp's server starts the line of a request it could not parse (its address follows)."""


class _OneLine(logging.Logger):
    """A logger that never prints a traceback: the exception of a record becomes the end of
    its one line (aiohttp passes ``exc_info`` with the errors it logs)."""

    def __init__(self, name: str, prefix: str) -> None:
        super().__init__(name)
        self.prefix = prefix
        self.parent = logging.getLogger("scepsy")

    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """aiohttp logs a first request that is no HTTP at all (garbage, TLS to a plain port)
        at debug level; it is refused like any other malformed request, with its line."""
        if str(msg).startswith(_AIOHTTP_REQUEST_ERROR):
            self.warning(msg, *args, **kwargs)
        else:
            super().debug(msg, *args, **kwargs)

    def _log(self, level: int, msg: object, args: Any, exc_info: Any = None,
             extra: Any = None, stack_info: bool = False, stacklevel: int = 1) -> None:
        text = str(msg) % args if args else str(msg)
        exc: BaseException | None = None
        if isinstance(exc_info, BaseException):
            exc = exc_info
        elif isinstance(exc_info, tuple):
            exc = exc_info[1]
        elif exc_info:
            exc = sys.exc_info()[1]
        if exc is not None and isinstance(exc, HttpProcessingError) and \
                text.startswith(_AIOHTTP_REQUEST_ERROR):
            client = text.removeprefix(_AIOHTTP_REQUEST_ERROR)
            text = f"refused a malformed request from {client} (answered {_describe(exc)})"
        elif exc is not None:
            text = f"{text}: {_describe(exc)}"
        line = f"{self.prefix}: {' '.join(text.split())}"
        super()._log(level, line, (), None, extra, False, stacklevel)


def one_line_logger(prefix: str) -> logging.Logger:
    """A logger for an aiohttp server whose every line starts with ``prefix`` (the command,
    ``scepsy trace receive``) and holds no traceback. Its records go to the ``scepsy`` logger's
    handlers; with logging not configured, Python prints warnings and errors to stderr, one
    line each."""
    return _OneLine(f"scepsy.http.{prefix.replace(' ', '.')}", prefix)
