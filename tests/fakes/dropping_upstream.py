"""An OpenAI-compatible fake on raw asyncio streams that loses the second request of every
connection: what a client sees when its server closes an idle kept-alive connection just as a
call is sent on it (uvicorn does after 5 s idle)."""

from __future__ import annotations

import asyncio
import json

from fakes.loop_thread import LoopThreadServer, read_request

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
                    await read_request(reader)
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

        await self._serve_streams(connection)
