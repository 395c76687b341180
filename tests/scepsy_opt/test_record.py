"""The recording proxy (``scepsy record``) against a loopback fake OpenAI server: what it
forwards (byte for byte), what it records (tokens from the upstream's usage, requests, parents
from timing), how each failure is recorded while the proxy keeps serving, and the command line.
The real ``vllm serve`` behind the proxy is in tests/scepsy_opt/test_record_vllm.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import http_writer, web
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.dropping_upstream import DroppingUpstream
from fakes.loop_thread import LoopThreadServer, read_request
from fakes.openai_chat import FakeChatServer
from scepsy.cli import main
from scepsy_common.errors import InputError
from scepsy_common.net import CLIENT_KEEPALIVE_S, parse_listen
from scepsy_opt.ingest.record import (
    RecordConfig,
    StreamScan,
    normalize_upstream,
    parse_usage,
    recording_proxy,
    upstream_pairs,
)
from scepsy_opt.ingest.tracemap import TraceMap
from scepsy_opt.stats import trace_stats
from scepsy_opt.traces import CallRecord, read_trace, validate_calls

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _chat(model: str = "m", words: str = "one two three four five", n: int = 3,
          **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": n,
            "messages": [{"role": "user", "content": words}], **extra}


def _completion(model: str = "m", prompt: str = "a b c d e f", n: int = 3,
                **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": n, "prompt": prompt, **extra}


def _req(rid: str, **more: str) -> dict[str, str]:
    return {"X-Scepsy-Request": rid, **more}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeChatServer]:
    with FakeChatServer("a", hang_s=20.0) as srv:
        yield srv


class Rec:
    """A proxy in front of ``upstream`` writing ``out``; ``calls()`` reads (and validates) the
    trace each time."""

    def __init__(self, url: str, out: Path) -> None:
        self.url, self.out = url, out
        self.client = httpx.Client(base_url=url, timeout=30.0)

    def calls(self) -> tuple[CallRecord, ...]:
        return read_trace(self.out).calls

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.client.post(path, json=body, headers=headers)

    def wait_calls(self, n: int, limit_s: float = 20.0) -> tuple[CallRecord, ...]:
        """The trace once it holds ``n`` calls (the proxy writes a call when it has ended)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.out.exists() and self.out.read_text().count("\n") >= n:
                return self.calls()
            time.sleep(0.02)
        raise AssertionError(f"the trace did not reach {n} calls")


@pytest.fixture
def rec(upstream: FakeChatServer, tmp_path: Path) -> Iterator[Rec]:
    # the calls alone (client time has its own test: it would add records between them)
    cfg = RecordConfig(out=tmp_path / "trace.jsonl", upstream=upstream.base_url + "/v1",
                       client_time=False)
    with recording_proxy(cfg) as url:
        r = Rec(url, cfg.out)
        yield r
        r.client.close()


def _usage_of(body: dict[str, Any], chat: bool) -> tuple[int, int, int]:
    u = FakeChatServer.usage(body, chat, body["max_tokens"])
    return u["prompt_tokens"], u["completion_tokens"], u["prompt_tokens_details"]["cached_tokens"]


def _tokens(c: CallRecord) -> tuple[int, int, int]:
    return c.input_tokens, c.output_tokens, c.prefix_tokens


# -------------------------------------------------------------------------- recorded calls


def test_non_streaming_chat_and_completion_are_recorded_with_the_upstreams_usage(rec: Rec):
    chat, comp = _chat(n=4), _completion(n=2, prompt="x " * 9)
    r1 = rec.post(CHAT, chat, _req("r1", **{"X-Scepsy-Role": "planner"}))
    r2 = rec.post(COMPLETIONS, comp, _req("r1"))
    assert r1.status_code == r2.status_code == 200
    usage = r1.json()["usage"]
    c0, c1 = rec.calls()
    assert (c0.call_id, c1.call_id) == ("c0", "c1")
    assert _tokens(c0) == (usage["prompt_tokens"], usage["completion_tokens"],
                           usage["prompt_tokens_details"]["cached_tokens"]) == (5, 4, 2)
    assert _tokens(c1) == _usage_of(comp, chat=False) == (9, 2, 4)
    assert c0.llm == c1.llm == "m" and c0.workflow == "agent" and c0.request_id == "r1"
    assert c0.role == "planner" and c1.role is None
    assert c1.parents == ("c0",) and c0.parents == ()
    assert 0 <= c0.start_s <= c0.end_s <= c1.start_s <= c1.end_s
    assert not c0.failed and not c1.failed


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_streams_pass_byte_for_byte_and_record_usage(rec: Rec, upstream: FakeChatServer,
                                                     path: str):
    body = (_chat if path == CHAT else _completion)(n=5, stream=True)
    direct = httpx.post(upstream.base_url + path, json=body, timeout=10).content
    proxied = rec.post(path, body, _req("s"))
    assert proxied.status_code == 200
    assert proxied.headers["content-type"].startswith("text/event-stream")
    # the proxy asked for usage and held the usage-only chunk back: what the client sees is
    # exactly what the upstream sends a client that did not ask
    assert proxied.content == direct
    assert b'"usage"' not in proxied.content and direct.endswith(b"data: [DONE]\n\n")
    sent = upstream.requests[-1]["body"]
    assert sent["stream_options"] == {"include_usage": True}
    (c,) = rec.calls()
    assert _tokens(c) == _usage_of(body, chat=path == CHAT)
    assert rec.client.get("/health").status_code == 200
    assert rec.url.stats().usage_missing == 0


def test_a_client_that_asks_for_usage_gets_it(rec: Rec, upstream: FakeChatServer):
    body = _chat(n=3, stream=True, stream_options={"include_usage": True})
    direct = httpx.post(upstream.base_url + CHAT, json=body, timeout=10).content
    proxied = rec.post(CHAT, body, _req("u")).content
    assert proxied == direct
    usage_events = [json.loads(e[6:]) for e in proxied.split(b"\n\n")
                    if e.startswith(b"data: {") and b'"usage"' in e]
    assert len(usage_events) == 1 and usage_events[0]["choices"] == []
    (c,) = rec.calls()
    assert _tokens(c) == (5, 3, 2) == _usage_of(body, chat=True)
    assert upstream.requests[-1]["body"] == body  # forwarded unchanged


def test_a_stream_without_usage_is_estimated_from_its_chunks_and_counted(rec: Rec):
    body = _chat("nousage", n=6, stream=True)
    r = rec.post(CHAT, body, _req("n"))
    assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n")
    (c,) = rec.calls()
    # 6 chunks with content; the role chunk and the final one carry none
    assert _tokens(c) == (0, 6, 0) and not c.failed
    assert rec.url.stats().usage_missing == 1
    r = rec.post(COMPLETIONS, _completion("nousage", n=6), _req("n"))
    assert r.status_code == 200 and "usage" not in r.json()
    assert _tokens(rec.calls()[1]) == (0, 0, 0) and rec.url.stats().usage_missing == 2


# ---------------------------------------------------------------------- requests and parents


def test_a_fan_out_and_its_follow_up(rec: Rec, upstream: FakeChatServer):
    """Four concurrent calls (the fake answers only once all four wait: they overlap for sure),
    then one call: the follow-up's parents are the four, which have the first call as parent."""
    assert upstream.barrier == 4
    rec.post(CHAT, _chat(), _req("fan"))

    async def fan() -> list[int]:
        async with httpx.AsyncClient(base_url=rec.url, timeout=30) as cl:
            rs = await asyncio.gather(*(cl.post(CHAT, json=_chat("barrier"), headers=_req("fan"))
                                        for _ in range(4)))
            return [r.status_code for r in rs]

    assert asyncio.run(fan()) == [200] * 4
    rec.post(CHAT, _chat(), _req("fan"))
    calls = {c.call_id: c for c in rec.calls()}
    assert sorted(calls) == ["c0", "c1", "c2", "c3", "c4", "c5"]
    fanned = ["c1", "c2", "c3", "c4"]
    assert all(calls[c].parents == ("c0",) for c in fanned)
    assert sorted(calls["c5"].parents) == fanned
    assert all(calls[c].llm == "barrier" for c in fanned)


def test_many_concurrent_calls_of_several_requests_make_a_valid_trace(rec: Rec):
    async def run() -> list[int]:
        async with httpx.AsyncClient(base_url=rec.url, timeout=30) as cl:
            rs = await asyncio.gather(*(
                cl.post(CHAT if i % 3 else COMPLETIONS,
                        json=(_chat if i % 3 else _completion)(stream=i % 2 == 0, n=1 + i % 4),
                        headers=_req(f"r{i % 5}")) for i in range(40)))
            return [r.status_code for r in rs]

    assert asyncio.run(run()) == [200] * 40
    trace = read_trace(rec.out)
    assert len(trace.requests) == 5
    for calls in trace.requests.values():
        assert sorted(int(c.call_id[1:]) for c in calls) == list(range(8))
    assert sum(c.output_tokens for c in trace.calls) == sum(1 + i % 4 for i in range(40))


def test_two_interleaved_requests_stay_apart(rec: Rec):
    for rid in ("a", "b", "a", "b", "a"):
        assert rec.post(CHAT, _chat(), _req(rid)).status_code == 200
    by = {(c.request_id, c.call_id): c for c in rec.calls()}
    assert sorted(by) == [("a", "c0"), ("a", "c1"), ("a", "c2"), ("b", "c0"), ("b", "c1")]
    assert by["a", "c1"].parents == ("c0",) and by["a", "c2"].parents == ("c1",)
    assert by["b", "c0"].parents == () and by["b", "c1"].parents == ("c0",)
    assert by["b", "c0"].start_s > by["a", "c0"].end_s  # in time, a's c0 came first


def test_user_field_and_unattributed_calls(rec: Rec):
    rec.post(CHAT, _chat(user="session-7"))
    rec.post(CHAT, _chat(user="session-7"))
    rec.post(CHAT, _chat())
    rec.post(CHAT, _chat(user="not a name"))  # unusable as a request id
    rec.post(CHAT, _chat(user="session-7"), _req("h"))  # the header wins
    calls = rec.calls()
    assert [(c.request_id, c.call_id) for c in calls] == [
        ("session-7", "c0"), ("session-7", "c1"), ("call-0", "c0"), ("call-1", "c0"),
        ("h", "c0")]
    assert calls[1].parents == ("c0",) and calls[2].parents == ()
    assert rec.url.stats().unattributed == 2


def test_workflow_header_and_trace_map(upstream: FakeChatServer, tmp_path: Path):
    tmap = TraceMap(workflow="support", models={"m": "planner", "nousage": "coder"})
    cfg = RecordConfig(out=tmp_path / "t.jsonl", upstream=upstream.base_url, trace_map=tmap)
    with recording_proxy(cfg) as url, httpx.Client(base_url=url, timeout=10) as cl:
        cl.post(CHAT, json=_chat(), headers=_req("r"))
        cl.post(CHAT, json=_chat(), headers=_req("r", **{"X-Scepsy-Workflow": "other"}))
        r = cl.post(CHAT, json=_chat("unlisted"), headers=_req("r"))
        assert r.status_code == 200 and r.json()["model"] == "unlisted"  # forwarded anyway
        cl.post(CHAT, json={"messages": [], "max_tokens": 1}, headers=_req("r"))
        stats = url.stats()
    calls = read_trace(cfg.out).calls
    assert [(c.workflow, c.request_id, c.call_id, c.llm) for c in calls] == [
        ("support", "r", "c0", "planner"), ("other", "r", "c0", "planner")]
    assert dict(stats.unmapped) == {"<none>": 1, "unlisted": 1}
    assert stats.recorded == 2 and stats.llms["planner"].calls == 2


def test_per_model_upstreams(upstream: FakeChatServer, tmp_path: Path):
    with FakeChatServer("b") as other:
        cfg = RecordConfig(out=tmp_path / "t.jsonl", upstream=upstream.base_url,
                           upstream_for={"mb": other.base_url + "/v1/"},
                           client_time=False)  # the calls alone, however slow the machine
        with recording_proxy(cfg) as url, httpx.Client(base_url=url, timeout=10) as cl:
            ra = cl.post(CHAT, json=_chat("ma"), headers=_req("r"))
            rb = cl.post(COMPLETIONS, json=_completion("mb"), headers=_req("r"))
            assert ra.headers["x-fake-name"] == "a" and rb.headers["x-fake-name"] == "b"
            assert other.requests[-1]["path"] == COMPLETIONS  # no doubled /v1
        calls = read_trace(cfg.out).calls
    assert [c.llm for c in calls] == ["ma", "mb"]


def test_other_paths_are_forwarded_unchanged_and_not_recorded(rec: Rec, upstream: FakeChatServer):
    r = rec.client.get("/v1/models")
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "m"
    r = rec.client.post("/v1/embeddings?x=1", content=b"raw body", headers=_req("r"))
    assert r.json() == {"method": "POST", "path": "/v1/embeddings", "query": "x=1",
                        "body": "raw body"}
    r = rec.client.get(CHAT)  # not a POST: forwarded, not recorded
    assert r.json()["method"] == "GET"
    assert rec.post(CHAT, _chat(), _req("r")).status_code == 200
    assert len(rec.calls()) == 1 and rec.url.stats().forwarded == 3
    assert rec.url.stats().recorded == 1


def test_a_long_prompt_passes(rec: Rec, upstream: FakeChatServer):
    words = "w " * 1_500_000  # 3 MB of body
    r = rec.post(CHAT, _chat(words=words, n=1), _req("r"))
    assert r.status_code == 200
    (c,) = rec.calls()
    assert c.input_tokens == 1_500_000


def test_scepsy_headers_are_stripped_and_hop_by_hop_not_forwarded(rec: Rec,
                                                                    upstream: FakeChatServer):
    rec.post(CHAT, _chat(), {**_req("r", **{"X-Scepsy-Role": "x", "X-Scepsy-Workflow": "w"}),
                             "Authorization": "Bearer k", "Keep-Alive": "timeout=5",
                             "X-Custom": "1"})
    sent = {k.lower(): v for k, v in upstream.requests[-1]["headers"].items()}
    assert not [k for k in sent if k.startswith("x-scepsy-")]
    assert sent["authorization"] == "Bearer k" and sent["x-custom"] == "1"
    assert "keep-alive" not in sent


@pytest.mark.parametrize("header,value", [("X-Scepsy-Request", "has space"),
                                          ("X-Scepsy-Workflow", "a;b"),
                                          ("X-Scepsy-Role", "-x" * 100)])
def test_bad_header_values_are_answered_400_and_not_forwarded(rec: Rec, upstream: FakeChatServer,
                                                              header: str, value: str):
    before = len(upstream.requests)
    r = rec.post(CHAT, _chat(), {header: value})
    assert r.status_code == 400 and header in r.json()["error"]["message"]
    assert len(upstream.requests) == before
    assert rec.post(CHAT, _chat(), _req("ok")).status_code == 200
    assert len(rec.calls()) == 1 and rec.url.stats().rejected == 1


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b""])
def test_malformed_bodies_are_answered_400_and_not_forwarded(rec: Rec, upstream: FakeChatServer,
                                                             content: bytes):
    before = len(upstream.requests)
    r = rec.client.post(CHAT, content=content, headers=_req("r"))
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert len(upstream.requests) == before and rec.url.stats().malformed == 1


def test_the_trace_validates_after_every_call_and_scepsy_stats_reads_it(rec: Rec):
    bodies = [(CHAT, _chat()), (COMPLETIONS, _completion(stream=True)),
              (CHAT, _chat("http503")), (CHAT, _chat(stream=True)), (COMPLETIONS, _completion())]
    for i, (path, body) in enumerate(bodies):
        rec.post(path, body, _req(f"r{i % 2}"))
        assert len(rec.calls()) == i + 1  # read_trace validates the whole file
    assert main(["stats", str(rec.out)]) == 0


# ------------------------------------------------------------------------------- failures


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_upstream_errors_are_passed_on_and_recorded(rec: Rec, upstream: FakeChatServer):
    direct = httpx.post(upstream.base_url + CHAT, json=_chat("http503"), timeout=10)
    r = rec.post(CHAT, _chat("http503"), _req("r"))
    assert (r.status_code, r.content) == (503, direct.content)
    r = rec.post(COMPLETIONS, _completion("http400", stream=True), _req("r"))
    assert r.status_code == 400
    assert rec.post(CHAT, _chat(), _req("r")).status_code == 200
    c0, c1, c2 = rec.calls()
    assert (c0.error, c1.error, c2.error) == ("upstream_503", "upstream_400", None)
    assert c2.parents == ()  # failed calls are nobody's parents
    assert rec.url.stats().failed == 2


def test_connection_refused_is_a_502_and_recorded(upstream: FakeChatServer, tmp_path: Path):
    dead = f"http://127.0.0.1:{_free_port()}"
    cfg = RecordConfig(out=tmp_path / "t.jsonl", upstream=upstream.base_url,
                       upstream_for={"gone": dead})
    with recording_proxy(cfg) as url, httpx.Client(base_url=url, timeout=10) as cl:
        r = cl.post(CHAT, json=_chat("gone", stream=True), headers=_req("r"))
        assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_unreachable"
        assert cl.post(CHAT, json=_chat(), headers=_req("r")).status_code == 200
        r = cl.get("/v1/models")
        assert r.status_code == 200
    calls = read_trace(cfg.out).calls
    assert [c.error for c in calls] == ["upstream_unreachable", None]


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_a_connection_lost_before_the_answer_is_sent_again(tmp_path: Path, retries: int):
    """The upstream closes a kept-alive connection as the next call arrives on it (what a
    server closing an idle connection at that moment does): with retries the call goes again
    on a fresh connection and succeeds, and is recorded once; without, it is a 502."""
    with DroppingUpstream() as up:
        cfg = RecordConfig(out=tmp_path / "t.jsonl", upstream=up.base_url, client_time=False,
                           retries=retries)
        with recording_proxy(cfg) as url, httpx.Client(base_url=url, timeout=10) as cl:
            codes = [cl.post(CHAT, json=_chat(), headers=_req(f"r{i}")).status_code
                     for i in range(4)]
            models = [cl.get("/v1/models").status_code for _ in range(2)]
            stats = url.stats()
        calls = read_trace(cfg.out).calls
    if retries:
        assert codes == [200] * 4 and models == [200] * 2
        # each call after the first found its connection closed, once (aiohttp itself sends
        # an idempotent GET again: those are not the proxy's retries)
        assert stats.retried == 3 and up.dropped >= 3
        assert [c.error for c in calls] == [None] * 4
        assert all(c.output_tokens == 3 for c in calls)
    else:
        assert codes == [200, 502, 200, 502] and stats.retried == 0
        assert [c.error for c in calls] == [None, "upstream_unreachable"] * 2
    assert stats.recorded == 4 and up.answered == 4 - stats.failed + 2


def test_an_idle_connection_is_not_reused_past_the_keepalive(tmp_path: Path):
    """After CLIENT_KEEPALIVE_S idle the proxy opens a new connection: a server that would lose
    a second request on the old one (as vLLM's does after 5 s idle) answers both, no retry."""
    with DroppingUpstream() as up:
        cfg = RecordConfig(out=tmp_path / "t.jsonl", upstream=up.base_url, client_time=False,
                           retries=0)
        with recording_proxy(cfg) as url, httpx.Client(base_url=url, timeout=10) as cl:
            first = cl.post(CHAT, json=_chat(), headers=_req("r0")).status_code
            time.sleep(CLIENT_KEEPALIVE_S + 0.5)
            second = cl.post(CHAT, json=_chat(), headers=_req("r1")).status_code
    assert (first, second) == (200, 200)
    assert (up.connections, up.dropped) == (2, 0)


def test_a_timeout_is_not_sent_again(upstream: FakeChatServer, tmp_path: Path):
    cfg = RecordConfig(out=tmp_path / "t.jsonl", upstream=upstream.base_url, timeout_s=0.3,
                       retries=2)
    with recording_proxy(cfg) as url, httpx.Client(base_url=url, timeout=10) as cl:
        assert cl.post(CHAT, json=_chat("hang"), headers=_req("r")).status_code == 504
        assert url.stats().retried == 0


def test_timeouts_before_the_answer_and_mid_stream(upstream: FakeChatServer, tmp_path: Path):
    cfg = RecordConfig(out=tmp_path / "t.jsonl", upstream=upstream.base_url, timeout_s=0.3)
    with recording_proxy(cfg) as url, httpx.Client(base_url=url, timeout=10) as cl:
        r = cl.post(CHAT, json=_chat("hang"), headers=_req("r"))
        assert r.status_code == 504
        r = cl.post(CHAT, json=_chat("stall", n=6, stream=True), headers=_req("r"))
        assert r.status_code == 200 and b"[DONE]" not in r.content  # the stream just ends
        assert b"t0 " in r.content
        assert cl.post(CHAT, json=_chat(), headers=_req("r")).status_code == 200
    assert [c.error for c in read_trace(cfg.out).calls] == [
        "upstream_timeout", "upstream_timeout", None]


def test_a_stream_cut_short_ends_the_clients_stream(rec: Rec):
    r = rec.post(COMPLETIONS, _completion("cut", n=6, stream=True), _req("r"))
    assert r.status_code == 200 and b"t2 " in r.content and b"t3 " not in r.content
    assert b"[DONE]" not in r.content
    assert rec.post(CHAT, _chat(), _req("r")).status_code == 200
    c0, c1 = rec.calls()
    assert c0.error == "upstream_stream_cut" and c1.error is None and c1.parents == ()


def test_a_client_leaving_mid_stream_cancels_the_upstream_call(rec: Rec,
                                                                upstream: FakeChatServer):
    before = upstream.disconnects
    with httpx.Client(base_url=rec.url, timeout=10) as cl, \
            cl.stream("POST", CHAT, json=_chat("slow", stream=True), headers=_req("r")) as r:
        first = next(r.iter_raw())
        assert first.startswith(b"data: ")
    # leaving the block closes the connection mid-stream
    (c,) = rec.wait_calls(1)
    assert c.error == "client_disconnected"
    deadline = time.monotonic() + 10
    while upstream.disconnects == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert upstream.disconnects == before + 1  # the upstream call was cut too
    assert rec.post(CHAT, _chat(), _req("r")).status_code == 200
    assert [c.error for c in rec.calls()] == ["client_disconnected", None]


def test_a_client_that_closes_after_done_has_a_complete_call(rec: Rec,
                                                             upstream: FakeChatServer):
    """Clients (the openai one) close a stream once ``data: [DONE]`` came, before the end of the
    HTTP body: the call is complete then, with its usage."""
    body = _chat("linger", n=4, stream=True)
    with httpx.Client(base_url=rec.url, timeout=10) as cl, \
            cl.stream("POST", CHAT, json=body, headers=_req("r")) as r:
        lines = []
        for line in r.iter_lines():
            lines.append(line)
            if line == "data: [DONE]":
                break
    (c,) = rec.wait_calls(1)
    assert c.error is None and _tokens(c) == _usage_of(body, chat=True)
    assert not any('"usage"' in ln for ln in lines)


class _WholeStreamUpstream(LoopThreadServer):
    """Answers every request with a whole SSE stream (content, usage-only chunk, [DONE]) in one
    write, with its length: the proxy reads the answer and its end at once. With ``hold``: the
    headers first (chunked), the stream once ``hold`` is set."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        super().__init__()
        self.hold = hold

    EVENTS = (b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n',
              b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\n',
              b"data: [DONE]\n\n")

    async def _serve(self) -> None:
        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    await read_request(reader)
                    body = b"".join(self.EVENTS)
                    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    if self.hold is None:
                        writer.write(head + b"Content-Length: %d\r\n\r\n%s" % (len(body),
                                                                                  body))
                    else:
                        writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n")
                        await writer.drain()
                        await asyncio.get_running_loop().run_in_executor(None, self.hold.wait)
                        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            finally:
                writer.close()

        await self._serve_streams(connection)


def test_a_stream_read_whole_goes_out_with_its_end_in_one_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """When ``[DONE]`` and the end of the upstream's answer come in one read with its headers,
    the proxy sends its headers, the events and the end of its answer in one write, recorded
    with the usage, the usage-only chunk it asked for held back."""
    writes: list[tuple[str, bytes]] = []
    write, write_eof = web.StreamResponse.write, web.StreamResponse.write_eof

    async def logged_write(self: web.StreamResponse, data: bytes) -> None:
        writes.append(("write", bytes(data)))
        await write(self, data)

    async def logged_eof(self: web.StreamResponse, data: bytes = b"") -> None:
        writes.append(("write_eof", bytes(data)))
        await write_eof(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", logged_write)
    monkeypatch.setattr(web.StreamResponse, "write_eof", logged_eof)
    sent_alone = []  # headers sent in a write of their own (aiohttp >= 3.12 has the method)
    monkeypatch.setattr(http_writer.StreamWriter, "send_headers",
                        lambda self: sent_alone.append(1), raising=False)
    ev = _WholeStreamUpstream.EVENTS
    out = tmp_path / "t.jsonl"
    with _WholeStreamUpstream() as up, \
            recording_proxy(RecordConfig(out=out, upstream=up.base_url,
                                         client_time=False)) as url:
        r = httpx.post(url + CHAT, json=_chat(stream=True), headers=_req("r"), timeout=10)
        assert r.status_code == 200 and r.content == ev[0] + ev[2]
        # (aiohttp ends every answer again once the handler returned: nothing is sent then)
        assert writes[0] == ("write_eof", ev[0] + ev[2])
        assert set(writes[1:]) <= {("write_eof", b"")}
        assert not sent_alone  # the headers went out with the answer
    (c,) = read_trace(out).calls
    assert c.error is None and (c.input_tokens, c.output_tokens) == (4, 1)


def test_a_streams_headers_are_not_held_for_an_upstream_that_has_sent_no_body_yet(
        tmp_path: Path):
    """Headers that came alone go to the client at once, while the upstream holds its body."""
    hold = threading.Event()
    ev = _WholeStreamUpstream.EVENTS
    out = tmp_path / "t.jsonl"
    with _WholeStreamUpstream(hold) as up, \
            recording_proxy(RecordConfig(out=out, upstream=up.base_url,
                                         client_time=False)) as url, \
            httpx.Client(base_url=url, timeout=5) as cl, \
            cl.stream("POST", CHAT, json=_chat(stream=True), headers=_req("r")) as r:
        assert r.status_code == 200 and not hold.is_set()  # not a ReadTimeout
        hold.set()
        assert r.read() == ev[0] + ev[2]
    (c,) = read_trace(out).calls
    assert c.error is None and (c.input_tokens, c.output_tokens) == (4, 1)


def test_a_client_leaving_while_waiting_for_an_answer(rec: Rec, upstream: FakeChatServer):
    before = upstream.disconnects
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(rec.url + CHAT, json=_chat("hang"), headers=_req("r"), timeout=0.3)
    (c,) = rec.wait_calls(1)
    assert c.error == "client_disconnected"
    deadline = time.monotonic() + 10
    while upstream.disconnects == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert upstream.disconnects == before + 1
    assert rec.post(CHAT, _chat(), _req("r")).status_code == 200


def test_stopping_with_calls_in_flight_records_them(upstream: FakeChatServer, tmp_path: Path):
    out = tmp_path / "t.jsonl"
    results: list[Any] = []
    with recording_proxy(RecordConfig(out=out, upstream=upstream.base_url)) as url:
        n = len(upstream.requests)

        def call() -> None:
            try:
                results.append(httpx.post(url + CHAT, json=_chat("hang"), headers=_req("r"),
                                          timeout=20).status_code)
            except httpx.HTTPError as exc:
                results.append(type(exc).__name__)

        t = threading.Thread(target=call)
        t.start()
        deadline = time.monotonic() + 10
        while len(upstream.requests) == n and time.monotonic() < deadline:
            time.sleep(0.02)
    t.join(20)
    assert results and results[0] != 200
    (c,) = read_trace(out).calls
    assert c.error == "proxy_stopped"


def test_nothing_recorded_leaves_no_file_and_an_existing_file_is_kept(upstream: FakeChatServer,
                                                                      tmp_path: Path):
    out = tmp_path / "t.jsonl"
    with recording_proxy(RecordConfig(out=out, upstream=upstream.base_url)) as url:
        assert httpx.get(url + "/health").status_code == 200
    assert not out.exists()
    out.write_text("keep\n")
    with pytest.raises(InputError, match="does not exist yet"), \
            recording_proxy(RecordConfig(out=out, upstream=upstream.base_url)):
        pass
    assert out.read_text() == "keep\n"


# ------------------------------------------------------------------- parsing, stream scanning


def test_config_and_flag_parsing():
    assert normalize_upstream("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert normalize_upstream("https://h/prefix/v1") == "https://h/prefix"
    assert upstream_pairs(["a/b=http://h:1/v1?"[:-1]]) == {"a/b": "http://h:1"}
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:4318") == ("::1", 4318)
    for bad in ("ftp://h", "http://", "h:80", "http://h:99999", "http://h/?q=1"):
        with pytest.raises(InputError):
            normalize_upstream(bad)
    for bad in ("8000", "h:", "h:65536", ":80"):
        with pytest.raises(InputError, match="--listen"):
            parse_listen(bad)
    with pytest.raises(InputError, match="MODEL=URL"):
        upstream_pairs(["=http://h"])
    with pytest.raises(InputError, match="--upstream"):
        RecordConfig(out=Path("x"))
    with pytest.raises(InputError, match="--timeout"):
        RecordConfig(out=Path("x"), upstream="http://h", timeout_s=float("nan"))
    cfg = RecordConfig(out=Path("x"), upstream_for={"m": "http://a", "n": "http://b"})
    assert cfg.upstream_of("n") == "http://b" and cfg.upstream_of("z") == "http://a"


def test_parse_usage():
    u = parse_usage({"prompt_tokens": 7, "completion_tokens": 2,
                     "prompt_tokens_details": {"cached_tokens": 5}})
    assert u is not None and (u.input_tokens, u.output_tokens, u.prefix_tokens) == (7, 2, 5)
    u = parse_usage({"prompt_tokens": 7, "prompt_tokens_details": None})
    assert u is not None and (u.output_tokens, u.prefix_tokens) == (0, 0)
    for bad in (None, [], {"prompt_tokens": -1}, {"prompt_tokens": True}, {"prompt_tokens": 1.5},
                {"completion_tokens": 3}):
        assert parse_usage(bad) is None


def _events(n: int, usage: bool, sep: bytes) -> list[bytes]:
    ev = [b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]})
          .encode() + sep for i in range(n)]
    ev.append(b": a comment" + sep)
    if usage:
        ev.append(b"data: " + json.dumps({"choices": [], "usage": {
            "prompt_tokens": 3, "completion_tokens": n}}).encode() + sep)
    ev.append(b"data: [DONE]" + sep)
    return ev


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 6), usage=st.booleans(), drop=st.booleans(),
       sep=st.sampled_from([b"\n\n", b"\r\n\r\n"]), cuts=st.lists(st.integers(0, 2000)))
def test_stream_scan_passes_every_split_byte_for_byte(n: int, usage: bool, drop: bool,
                                                      sep: bytes, cuts: list[int]):
    """However the stream is split into reads, what passes is the stream minus (when asked)
    the usage-only chunk, and the usage, the content chunks and [DONE] are found."""
    events = _events(n, usage, sep)
    whole = b"".join(events)
    expected = b"".join(e for e in events if not (drop and b'"usage"' in e))
    bounds = sorted({min(c, len(whole)) for c in cuts} | {0, len(whole)})
    scan = StreamScan(drop_usage_chunk=drop)
    out = b"".join(scan.feed(whole[a:b]) for a, b in itertools.pairwise(bounds)) + scan.flush()
    assert out == expected
    assert scan.done and scan.content_chunks == n
    assert (scan.usage is not None) == usage
    if usage:
        assert scan.usage is not None and scan.usage.output_tokens == n


class _ReferenceScan:
    """The plain reading of a stream the proxy's :class:`StreamScan` must agree with: split
    at every blank line, join each event's ``data:`` lines, ``json.loads`` every payload."""

    def __init__(self, drop_usage_chunk: bool) -> None:
        self.drop_usage_chunk = drop_usage_chunk
        self.usage: Any = None
        self.content_chunks = 0
        self.done = False
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        buf, out, pos = self._buf + data, [], 0
        for m in re.finditer(rb"\r?\n\r?\n", buf):
            if self._keep(buf[pos:m.start()]):
                out.append(buf[pos:m.end()])
            pos = m.end()
        self._buf = buf[pos:]
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest if rest and self._keep(rest) else b""

    def _keep(self, event: bytes) -> bool:
        data = b"".join(line[5:].strip() for line in event.splitlines()
                        if line.startswith(b"data:"))
        if not data:
            return True
        if data == b"[DONE]":
            self.done = True
            return True
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return True
        if not isinstance(obj, dict):
            return True
        choices = obj.get("choices")
        if isinstance(choices, list) and any(
                isinstance(ch, dict) and ((isinstance(ch.get("delta"), dict)
                                           and ch["delta"].get("content")) or ch.get("text"))
                for ch in choices):
            self.content_chunks += 1
        usage = parse_usage(obj.get("usage")) if obj.get("usage") is not None else None
        if usage is not None:
            self.usage = usage
            return not (self.drop_usage_chunk and choices == [])
        return True


_USAGE = {"prompt_tokens": 3, "completion_tokens": 2}
_TEXTS = st.one_of(st.text(max_size=12), st.sampled_from([
    "", "usage", '"usage": {"prompt_tokens": 9, "completion_tokens": 9}', "data: [DONE]",
    '{"choices": [], "usage": {"prompt_tokens": 1}}', "\n\ndata: x\n\n", "é\u2028😀"]))
_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2, 10**7) | _TEXTS,
                       lambda v: st.lists(v, max_size=3)
                       | st.dictionaries(st.sampled_from(["content", "text", "usage", "x"]), v,
                                         max_size=3), max_leaves=6)
_CHOICE = st.fixed_dictionaries({}, optional={
    "index": st.integers(0, 2), "text": _VALUES, "finish_reason": st.sampled_from([None, "stop"]),
    "delta": st.fixed_dictionaries({}, optional={"role": st.just("assistant"),
                                                 "content": _VALUES})})
_USAGES = st.one_of(st.just(_USAGE), st.builds(
    lambda p, c, d: {"prompt_tokens": p, "completion_tokens": c, **d},
    st.integers(-1, 20) | st.just(True), st.integers(0, 20),
    st.sampled_from([{}, {"prompt_tokens_details": {"cached_tokens": 2}},
                     {"prompt_tokens_details": None}])), _VALUES)
_CHUNKS = st.fixed_dictionaries({}, optional={
    "id": st.just("c1"), "choices": st.lists(_CHOICE, max_size=2) | _VALUES,
    "usage": _USAGES})


@st.composite
def _payloads(draw: st.DrawFn) -> bytes:
    """One event's payload: a completion chunk as servers write it (compact or spaced,
    escaped or raw UTF-8), or one of the ways a payload goes wrong."""
    obj = draw(_CHUNKS)
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    raw = text.encode()
    kind = draw(st.sampled_from(["json"] * 6 + ["cut", "extra", "escaped", "utf16", "bom",
                                                "surrogate", "latin1", "scalar", "done",
                                                "bytes"]))
    if kind == "cut":  # cut short: not JSON
        return raw[:draw(st.integers(0, max(0, len(raw) - 1)))]
    if kind == "extra":
        return raw + draw(st.sampled_from([b"x", b" {}", b"}", b"\x0b"]))
    if kind == "escaped":  # keys spelled with \u escapes
        return raw.replace(b'"usage"', b'"\\u0075sage"').replace(b'"content"',
                                                                  b'"c\\u006fntent"')
    if kind == "utf16":
        return text.encode(draw(st.sampled_from(["utf-16-le", "utf-16-be", "utf-32-le"])))
    if kind == "bom":
        return b"\xef\xbb\xbf" + raw
    if kind == "surrogate":  # a lone surrogate in UTF-8 (json.loads lets it pass)
        return raw.replace(b'"c1"', b'"\xed\xa0\x80"')
    if kind == "latin1":
        return raw.replace(b'"c1"', b'"\xe9"')
    if kind == "scalar":
        return draw(st.sampled_from([b"[]", b"3", b'"usage"', b"null", b"[{\"usage\": 1}]"]))
    if kind == "done":
        return draw(st.sampled_from([b"[DONE]", b"[DONE] ", b"[done]"]))
    if kind == "bytes":
        return draw(st.binary(max_size=20))
    return raw


@st.composite
def _any_events(draw: st.DrawFn) -> bytes:
    """One SSE event without its blank line: one or more ``data:`` lines (a payload may be
    split across lines), other fields, comments."""
    payload = draw(_payloads())
    if payload and draw(st.integers(0, 4)) == 0:  # split across two data lines
        at = draw(st.integers(0, len(payload)))
        lines = [b"data: " + payload[:at], b"data:" + payload[at:]]
    else:
        lines = [draw(st.sampled_from([b"data: ", b"data:", b"data:  "])) + payload
                 + draw(st.sampled_from([b"", b"", b" ", b"\t"]))]
    if draw(st.integers(0, 5)) == 0:
        lines.insert(0, draw(st.sampled_from([b"event: chunk", b": ping", b"id: 7"])))
    if draw(st.integers(0, 8)) == 0:
        lines = [draw(st.sampled_from([b": comment", b"", b"retry: 10"]))]
    eol = draw(st.sampled_from([b"\n", b"\n", b"\r\n", b"\r"]))
    return eol.join(lines)


@settings(max_examples=400, deadline=None)
@given(events=st.lists(_any_events(), max_size=8), drop=st.booleans(),
       seps=st.lists(st.sampled_from([b"\n\n", b"\n\n", b"\r\n\r\n", b"\r\n\n", b"\n\r\n"]),
                     min_size=1), tail=st.booleans(), cuts=st.lists(st.integers(0, 3000)))
def test_stream_scan_reads_any_stream_as_a_full_json_read_does(
        events: list[bytes], drop: bool, seps: list[bytes], tail: bool, cuts: list[int]):
    """However a stream of any events is split into reads, the scan passes on the same bytes
    after each read, and finds the same usage, content chunks and [DONE] (after each read), as
    a reading that parses every event's payload with ``json.loads``: a usage split across
    reads, "usage" inside a content string, keys spelled with escapes, payloads in UTF-16,
    broken JSON and CRLF line ends included."""
    whole = b"".join(e + (b"" if tail and i == len(events) - 1 else seps[i % len(seps)])
                     for i, e in enumerate(events))
    bounds = sorted({min(c, len(whole)) for c in cuts} | {0, len(whole)})
    scan, ref = StreamScan(drop_usage_chunk=drop), _ReferenceScan(drop_usage_chunk=drop)
    for a, b in itertools.pairwise(bounds):
        assert scan.feed(whole[a:b]) == ref.feed(whole[a:b])
        assert (scan.done, scan.usage, scan.content_chunks) == \
            (ref.done, ref.usage, ref.content_chunks)
    assert scan.flush() == ref.flush()
    assert (scan.done, scan.usage, scan.content_chunks) == \
        (ref.done, ref.usage, ref.content_chunks)


def test_stream_scan_finds_a_usage_cut_at_any_byte_and_not_one_inside_a_string():
    """The usage chunk cut into two reads at every byte is still found and held back; a
    content chunk whose text spells a usage chunk is content, passed on, and not the usage."""
    fake = json.dumps({"choices": [{"index": 0, "delta": {"content": 'x"usage": {"prompt_'
                       'tokens": 50, "completion_tokens": 50}, "choices": []'}}]})
    content = b"data: " + fake.encode() + b"\n\n"
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    whole = content + usage + b"data: [DONE]\n\n"
    for at in range(len(whole) + 1):
        scan = StreamScan(drop_usage_chunk=True)
        out = scan.feed(whole[:at]) + scan.feed(whole[at:]) + scan.flush()
        assert out == content + b"data: [DONE]\n\n", at
        assert scan.usage is not None and (scan.usage.input_tokens,
                                           scan.usage.output_tokens) == (3, 1), at
        assert scan.content_chunks == 1 and scan.done, at
    scan = StreamScan(drop_usage_chunk=True)
    assert scan.feed(content + b"data: [DONE]\n\n") == content + b"data: [DONE]\n\n"
    assert scan.usage is None and scan.content_chunks == 1


# ---------------------------------------------------------------------------- command line


def test_cli_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "t.jsonl"
    cases = [
        ["--listen", "nope", "--upstream", "http://h", "--out", str(out)],
        ["--listen", "127.0.0.1:0", "--out", str(out)],
        ["--listen", "127.0.0.1:0", "--upstream", "ftp://h", "--out", str(out)],
        ["--listen", "127.0.0.1:0", "--upstream-for", "m", "--out", str(out)],
        ["--listen", "127.0.0.1:0", "--upstream", "http://h", "--model", "m=bad name",
         "--out", str(out)],
        ["--listen", "127.0.0.1:0", "--upstream", "http://h", "--workflow", "a b",
         "--out", str(out)],
        ["--listen", "127.0.0.1:0", "--upstream", "http://h", "--timeout", "-1",
         "--out", str(out)],
        ["--listen", "127.0.0.1:0", "--upstream", "http://h", "--map",
         str(tmp_path / "missing.yaml"), "--out", str(out)],
        ["--listen", "127.0.0.1:0", "--upstream", "http://h", "--out", str(tmp_path)],
    ]
    for args in cases:
        assert main(["record", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error" in err and "Traceback" not in err, (args, err)
    assert not out.exists()
    out.write_text("x\n")
    assert main(["record", "--listen", "127.0.0.1:0", "--upstream", "http://h",
                 "--out", str(out)]) == 2
    assert "does not exist yet" in capsys.readouterr().err and out.read_text() == "x\n"


def test_cli_port_in_use_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["record", "--listen", f"127.0.0.1:{port}", "--upstream", "http://h",
                     "--out", str(tmp_path / "t.jsonl")]) == 2
    assert "--listen" in capsys.readouterr().err and not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_records_until_a_signal_and_prints_a_summary(upstream: FakeChatServer,
                                                         tmp_path: Path, sig: int):
    out = tmp_path / "t.jsonl"
    args = ["record", "--listen", "127.0.0.1:0", "--upstream", upstream.base_url,
            "--out", str(out), "--model", "m=planner", "--workflow", "wf"]
    code = "import sys; from scepsy.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # status on stderr, the summary on stdout
        assert line.startswith("scepsy record: listening on http://127.0.0.1:"), line
        url = line.split("listening on ")[1].split(";")[0]
        assert httpx.post(url + CHAT, json=_chat(), headers=_req("r"), timeout=10
                          ).status_code == 200
        assert httpx.post(url + CHAT, json=_chat("other"), headers=_req("r"), timeout=10
                          ).status_code == 200
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "planner" in stdout and "other (1 calls)" in stdout
    assert "recorded 1 calls (0 failed)" in stdout
    (c,) = read_trace(out).calls
    assert (c.workflow, c.llm, c.input_tokens) == ("wf", "planner", 5)


def test_cli_duration_ends_the_run(upstream: FakeChatServer, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "t.jsonl"
    assert main(["record", "--listen", "127.0.0.1:0", "--upstream", upstream.base_url,
                 "--out", str(out), "--duration", "0.2"]) == 0
    cap = capsys.readouterr()
    assert "listening on" in cap.err and "no call recorded" in cap.out and not out.exists()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 4), st.booleans(),
                          st.sampled_from([0.0, 5e-10, 2e-9, 1e-7, 1e-6])),
                min_size=1, max_size=25))
def test_parents_as_calls_complete_equal_infer_parents_over_all(
        spans: list[tuple[int, int, bool, float]]):
    """The proxy finds each call's parents as it completes, from the request's calls completed
    so far; the answer is the one over all of them (ties and zero-length calls included)."""
    from scepsy_opt.traces import CompletedCalls, infer_parents

    calls = [CallRecord("w", "r", f"c{i}", start_s=s / 10, end_s=(s + d) / 10 + late, llm="m",
                        error="upstream_503" if bad else None)
             for i, (s, d, bad, late) in enumerate(spans)]
    done, written = CompletedCalls(), []
    for c in sorted(calls, key=lambda c: c.end_s):  # the proxy ends calls in time order
        windowed = replace(c, parents=done.parents_of(c))
        full = infer_parents([*written, c])[-1]
        assert windowed.parents == full.parents
        done.add(windowed)
        written.append(windowed)


def test_parents_stay_right_when_calls_arrive_out_of_end_order():
    from scepsy_opt.traces import CompletedCalls, infer_parents

    a = CallRecord("w", "r", "a", 0.0, 2.0, llm="m")
    b = CallRecord("w", "r", "b", 1.0, 1.5, llm="m")
    c = CallRecord("w", "r", "c", 3.0, 4.0, llm="m")
    done = CompletedCalls()
    done.add(a)
    done.add(b)  # ended before a: inserted in order
    assert done.ends == [1.5, 2.0] and done.latest == [1.0, 1.0]
    assert done.parents_of(c) == infer_parents([a, b, c])[-1].parents == ("b", "a")


def test_the_client_time_between_calls_is_recorded_as_a_client_call(upstream, tmp_path):
    cfg = RecordConfig(out=tmp_path / "t.jsonl", upstream=upstream.base_url)
    with recording_proxy(cfg) as url:
        r = Rec(url, cfg.out)
        r.post(CHAT, _chat(), _req("r1"))
        time.sleep(0.05)  # the agent's own work between two calls
        r.post(CHAT, _chat(), _req("r1"))
        calls = r.wait_calls(3)
        r.client.close()
    assert [(c.call_id, c.tool) for c in calls] == [("c0", None), ("c1.client", "client"),
                                                    ("c1", None)]
    first, gap, second = calls
    assert gap.parents == ("c0",) and second.parents == ("c1.client",)
    assert gap.start_s == first.end_s and gap.end_s == second.start_s
    assert gap.duration_s >= 0.05 - 1e-3
    assert trace_stats(validate_calls(calls))["agent"].tool_critical_s == pytest.approx(
        gap.duration_s, rel=1e-9)


def test_client_time_never_writes_an_earlier_call_twice(tmp_path):
    """A call that starts when another completed at that instant makes the parent window take
    every completed call; only the new call and its own client time may be written."""
    from scepsy_opt.ingest.record import Call, RecordingProxy

    out = tmp_path / "t.jsonl"
    proxy = RecordingProxy(RecordConfig(out=out, upstream="http://127.0.0.1:9"))
    clock = [0.0]
    proxy._now = lambda: clock[0]  # type: ignore[method-assign]
    with out.open("w") as fh:
        proxy._file = fh
        for cid, start, end in [("c0", 0.0, 1.0), ("c1", 1.5, 2.0), ("c3", 3.0, 3.0),
                                ("c2", 3.0, 4.0)]:
            clock[0] = end
            proxy._end(Call("w", "r", cid, "m", None, start, False), None, None)
    calls = read_trace(out).calls
    # c3 took no time at 3.0, so c2 (also from 3.0) waited on it with no gap
    assert [(c.call_id, c.parents) for c in calls] == [
        ("c0", ()), ("c1.client", ("c0",)), ("c1", ("c1.client",)), ("c3.client", ("c1",)),
        ("c3", ("c3.client",)), ("c2", ("c3",))]


def test_a_gzip_request_body_reaches_the_upstream_as_json(rec: Rec, upstream: FakeChatServer):
    import gzip

    body = gzip.compress(json.dumps(_chat()).encode())
    headers = {**_req("gz"), "Content-Encoding": "gzip", "Content-Type": "application/json"}
    assert rec.client.post(CHAT, content=body, headers=headers).status_code == 200
    assert rec.client.post("/v1/embeddings", content=body, headers=headers).status_code == 200
    sent = upstream.requests[-2:]
    assert all("content-encoding" not in {k.lower() for k in r["headers"]} for r in sent)
    (call,) = rec.wait_calls(1)
    assert call.error is None and call.request_id == "gz"


def test_cli_creates_the_folder_of_out_only_when_the_flags_are_good(
        upstream: FakeChatServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "new" / "t.jsonl"
    assert main(["record", "--listen", "127.0.0.1:0", "--upstream", "ftp://x", "--out",
                 str(out), "--duration", "0.1"]) == 2
    assert not out.parent.exists()
    assert main(["record", "--listen", "127.0.0.1:0", "--upstream", upstream.base_url,
                 "--out", str(out), "--duration", "0.1"]) == 0
    assert out.parent.is_dir() and "no call recorded" in capsys.readouterr().out
