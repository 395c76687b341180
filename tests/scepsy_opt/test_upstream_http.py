"""The recording proxy's lean upstream client (scepsy_opt.ingest.upstream_http) against raw
asyncio servers that answer as told: what it sends, how it reads each kind of answer (length,
chunked, until the connection closes), its pool (reuse, the keep-alive limit) and the aiohttp
exceptions it raises for each failure, which the proxy reads as it reads aiohttp's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scepsy_opt.ingest.upstream_http import (
    LeanPool,
    LeanResponse,
    UpstreamRefused,
    lean_target,
    request_head,
)

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
T = TypeVar("T")


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    length = next((int(v) for k, _, v in (line.partition(":") for line in head.split("\r\n"))
                   if k.strip().lower() == "content-length"), 0)
    return head, await reader.readexactly(length)


async def _serve(answer: Answer) -> tuple[asyncio.AbstractServer, int, list[int]]:
    """A server on a free loopback port calling ``answer`` once per connection; the list counts
    connections."""
    conns: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(1)
        try:
            await answer(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], conns


def _ok(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


async def _one_answer(answer: Answer, read: Callable[[LeanResponse], Awaitable[T]]) -> T:
    """``read`` on the answer to one POST to a server that answers with ``answer``, its
    headers in (the server and the pool closed after)."""
    server, port, _ = await _serve(answer)
    pool = LeanPool(5.0)
    t = lean_target(f"http://127.0.0.1:{port}/v1/completions")
    assert t is not None
    try:
        async with pool.post(t, b"{}", {}) as r:
            return await read(r)
    finally:
        pool.close()
        server.close()


async def _post(pool: LeanPool, port: int, data: bytes = b"{}") -> tuple[int, bytes]:
    t = lean_target(f"http://127.0.0.1:{port}/v1/chat/completions")
    assert t is not None
    async with pool.post(t, data, {"Content-Type": "application/json"}) as r:
        return r.status, await r.read()


def test_keep_alive_answers_reuse_one_connection_and_echo_the_body() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await _read_request(reader)
            assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
            writer.write(_ok(body))

    async def main() -> None:
        server, port, conns = await _serve(answer)
        pool = LeanPool(5.0)
        got = [await _post(pool, port, f'{{"i": {i}}}'.encode()) for i in range(3)]
        pool.close()
        server.close()
        assert got == [(200, f'{{"i": {i}}}'.encode()) for i in range(3)]
        assert len(conns) == pool.opened == 1

    asyncio.run(main())


def test_an_idle_connection_past_the_keepalive_is_not_reused() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            writer.write(_ok(b"{}"))

    async def main() -> None:
        server, port, conns = await _serve(answer)
        pool = LeanPool(5.0, keepalive_s=0.05)
        await _post(pool, port)
        await asyncio.sleep(0.1)
        await _post(pool, port)
        pool.close()
        server.close()
        assert len(conns) == 2

    asyncio.run(main())


@pytest.mark.parametrize("framing", ["chunked", "until_close"])
def test_chunked_and_until_close_answers_come_whole(framing: str) -> None:
    parts = [b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if framing == "chunked":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for p in parts:
                writer.write(f"{len(p):x}\r\n".encode() + p + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"".join(parts))
        await writer.drain()
        await asyncio.sleep(0.05)

    async def read(r: LeanResponse) -> bytes:
        assert not r.content.at_eof()
        got = b"".join([d async for d in r.content.iter_any()])
        assert r.content.at_eof()
        return got

    assert asyncio.run(_one_answer(answer, read)) == b"".join(parts)


async def _failure(answer: Answer, timeout_s: float = 5.0) -> BaseException:
    server, port, _ = await _serve(answer)
    pool = LeanPool(timeout_s)
    try:
        await _post(pool, port)
    except Exception as exc:
        return exc
    finally:
        pool.close()
        server.close()
    raise AssertionError("no error")


def test_each_failure_raises_the_aiohttp_error_the_proxy_reads() -> None:
    async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)

    async def cut_mid_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(2)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    async def main() -> None:
        lost = await _failure(close_at_once)
        assert isinstance(lost, aiohttp.ClientConnectionError)
        assert not isinstance(lost, aiohttp.ServerTimeoutError | UpstreamRefused)
        assert isinstance(await _failure(cut_mid_body), aiohttp.ClientPayloadError)
        assert isinstance(await _failure(hang, timeout_s=0.2), aiohttp.ServerTimeoutError)
        bad = await _failure(garbage)
        assert isinstance(bad, aiohttp.ClientError)
        assert not isinstance(bad, aiohttp.ClientConnectionError)  # not sent again
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        pool = LeanPool(5.0)
        with pytest.raises(UpstreamRefused):
            await _post(pool, port)

    asyncio.run(main())


def test_lean_target_takes_plain_http_only() -> None:
    t = lean_target("http://10.0.0.5:8000/v1/chat/completions?a=1")
    assert t is not None
    assert (t.host, t.port, t.host_header, t.target) == (
        "10.0.0.5", 8000, "10.0.0.5:8000", "/v1/chat/completions?a=1")
    assert lean_target("http://h/v1/completions") is not None
    assert lean_target("http://h/v1/completions").port == 80  # type: ignore[union-attr]
    for url in ("https://h/v1/completions", "http://u:p@h/v1/completions",
                "http://h/v1/caf\u00e9"):
        assert lean_target(url) is None


@given(st.dictionaries(st.sampled_from(["Content-Type", "Accept", "User-Agent",
                                        "Authorization", "X-Other", "Host",
                                        "Content-Length"]),
                       st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E),
                               max_size=20), max_size=7),
       st.integers(0, 10_000))
def test_the_request_head_keeps_the_callers_headers_and_adds_aiohttps_defaults(
        headers: dict[str, str], length: int) -> None:
    t = lean_target("http://127.0.0.1:9/v1/completions")
    assert t is not None
    lines = request_head(t, headers, length).decode("latin-1").split("\r\n")
    assert lines[0] == "POST /v1/completions HTTP/1.1" and lines[-2:] == ["", ""]
    sent = [tuple(line.split(": ", 1)) for line in lines[1:-2]]
    names = [k.lower() for k, _ in sent]
    assert len(names) == len(set(names))  # each header once
    got = dict(sent)
    assert got["Host"] == "127.0.0.1:9" and got["Content-Length"] == str(length)
    for k, v in headers.items():
        if k not in ("Host", "Content-Length"):
            assert got[k] == v
    assert ("Accept" in got) and ("User-Agent" in got)
    assert ("Content-Type" in got) == ("Content-Type" in headers or length > 0)
    with pytest.raises(ValueError):
        request_head(t, {"X-Bad": "a\r\nInjected: 1"}, 0)


def test_an_answer_cut_right_after_its_headers_fails_on_reading_the_body() -> None:
    """As aiohttp's: the response (status, headers) comes; reading its body raises."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
        await writer.drain()

    async def read(r: LeanResponse) -> None:
        assert r.status == 200 and r.headers["Content-Length"] == "50"
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
        assert not r.content.at_eof()

    asyncio.run(_one_answer(answer, read))
