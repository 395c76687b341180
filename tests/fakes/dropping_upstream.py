"""An OpenAI-compatible fake on raw asyncio streams that loses the second request of every
connection: what a client sees when its server closes an idle kept-alive connection just as a
call is sent on it (uvicorn does after 5 s idle)."""

from __future__ import annotations

import asyncio
import json

from fakes.loop_thread import LoopThreadServer

USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


class DroppingUpstream(LoopThreadServer):
    """Answers the first request of each connection (200, JSON, keep-alive) and closes the
    connection unanswered when a second request arrives on it. ``answered`` and ``dropped``
    count requests; ``connections`` counts accepted connections."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = 0
        self.dropped = 0
        self.connections = 0

    async def _serve(self) -> None:
        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            first = True
            try:
                while True:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                    length = 0
                    for line in head.split("\r\n")[1:]:
                        name, _, value = line.partition(":")
                        if name.strip().lower() == "content-length":
                            length = int(value)
                    await reader.readexactly(length)
                    if not first:
                        self.dropped += 1
                        return
                    first = False
                    body = json.dumps({"object": "chat.completion", "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                        "usage": USAGE}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()
                    self.answered += 1
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            finally:
                writer.close()

        server = await asyncio.start_server(connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        server.close()  # not wait_closed: it waits for kept-alive connections on 3.12+
