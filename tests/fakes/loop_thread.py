"""The part every loopback fake server shares: its own event loop in a daemon thread, started
by ``with``, serving until the block ends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Self

Connection = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> str:
    """One HTTP/1.1 request off ``reader``: its head (latin-1), its body read and dropped
    (``Content-Length`` bytes; none without one)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    length = 0
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return head


class LoopThreadServer:
    """Subclasses set up ``_serve()``: listen on 127.0.0.1, set ``self.port``, call
    ``self._ready.set()``, then wait on ``self._stop`` and clean up."""

    def __init__(self) -> None:
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{type(self).__name__} did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        raise NotImplementedError

    async def _serve_streams(self, connection: Connection) -> None:
        """A ``_serve`` on raw asyncio streams: ``connection`` per accepted connection, until
        the block ends."""
        server = await asyncio.start_server(connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        server.close()  # not wait_closed: it waits for kept-alive connections on 3.12+
