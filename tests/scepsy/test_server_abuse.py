"""`scepsy trace receive` and `scepsy record` against abusive clients and upstreams, over raw
sockets to the real command in a child process: every misbehaviour gets a clean HTTP error (or a
closed connection) and at most one log line, never a traceback, and the server keeps serving.
Both print their start-up line on stderr in one shape."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_opt.ingest.otlp_http import OtlpReceiver
from scepsy_opt.ingest.record import RecordConfig, recording_proxy

CODE = "import sys; from scepsy.cli import main; sys.exit(main(sys.argv[1:]))"
START = re.compile(r"^scepsy (trace receive|record): listening on (http://127\.0\.0\.1:(\d+)\S*); "
                   r"(forwarding to \S+; )?writing (\S+); stop with Ctrl-C")
EMPTY_EXPORT = b'{"resourceSpans":[]}'
CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'


class Server:
    """``scepsy ARGS`` in a child process; its stderr in a file; its port from the start-up
    line."""

    def __init__(self, args: list[str], tmp: Path, path: str, body: bytes) -> None:
        self.err_path = tmp / "stderr.txt"
        self.path, self.body = path, body
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", CODE, *args],
                                         stdout=subprocess.PIPE, stderr=err, text=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 60
        while not (m := START.match(self.err_path.read_text())):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.stderr()
            time.sleep(0.05)
        self.start_line = m
        self.port = int(m[3])
        self.stdout = ""

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def good(self) -> int:
        """The status of a well-formed request (the server still serves)."""
        return _status(raw(self.port, _post(self.path, self.body)))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        self.stdout, _ = self.proc.communicate(timeout=60)


def _post(path: str, body: bytes, extra: str = "", length: int | str | None = None) -> bytes:
    n = len(body) if length is None else length
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {n}\r\n{extra}Connection: close\r\n\r\n").encode() + body


def raw(port: int, data: bytes, *, wait_s: float = 10.0, close_write: bool = False,
        read: bool = True) -> bytes:
    """Send ``data`` on a fresh connection; what comes back before the server closes (or
    ``wait_s`` passes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        if not read:
            return b""
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
                head, sep, body = out.partition(b"\r\n\r\n")
                n = re.search(rb"(?i)\r\ncontent-length: (\d+)", head)
                if sep and n and len(body) >= int(n[1]):
                    break  # the whole answer (the server may linger before it closes)
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def _status(resp: bytes) -> int:
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", resp)
    return int(m[1]) if m else 0


def _receive(tmp: Path) -> Server:
    return Server(["trace", "receive", "--listen", "127.0.0.1:0", "--out",
                   str(tmp / "spans.jsonl"), "--max-body-bytes", "4096"], tmp, "/v1/traces",
                  EMPTY_EXPORT)


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    """A tiny OpenAI-ish upstream that answers every request with a fixed chat completion."""
    answer = (b'{"choices":[{"message":{"content":"ok"}}],'
              b'"usage":{"prompt_tokens":3,"completion_tokens":1}}')
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    head, _, rest = data.partition(b"\r\n\r\n")
                    m = re.search(rb"(?i)content-length: (\d+)", head)
                    while m and len(rest) < int(m[1]):
                        rest += conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                                 % (len(answer), answer))
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(5)
    srv.close()


def _record(tmp: Path, upstream: int) -> Server:
    return Server(["record", "--listen", "127.0.0.1:0", "--upstream",
                   f"http://127.0.0.1:{upstream}", "--out", str(tmp / "trace.jsonl"),
                   "--max-body-bytes", "4096"], tmp, "/v1/chat/completions", CHAT)


def _abuse(srv: Server) -> dict[str, int]:
    """Each misbehaviour once, a good request after each: the status it got (0: none)."""
    p = srv.path
    cases: dict[str, bytes] = {
        "huge content-length": _post(p, b"abc", length=10**12),
        "over the limit": _post(p, b"x" * 5000),
        "negative content-length": _post(p, b"abc", length=-5),
        "non-numeric content-length": _post(p, b"abc", length="abc"),
        "garbage request line": b"\x00\xff\xfe garbage\r\n\r\n",
        "unknown HTTP version": b"GET / HTTP/9.9\r\n\r\n",
        "bad chunk size": (f"POST {p} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Transfer-Encoding: chunked\r\n\r\nzz\r\n").encode(),
        "bad gzip": _post(p, b"not gzip at all", "Content-Encoding: gzip\r\n"),
        "bad json": _post(p, b"{nope"),
    }
    got: dict[str, int] = {}
    for name, data in cases.items():
        got[name] = _status(raw(srv.port, data))
        got[name + ", then a good one"] = srv.good()
    # a client that announces a body and leaves after a few bytes
    raw(srv.port, _post(p, b"abc", length=1000), close_write=True, read=False)
    got["left mid-body, then a good one"] = srv.good()
    return got


def test_the_receiver_survives_abusive_clients(tmp_path: Path) -> None:
    srv = _receive(tmp_path)
    try:
        got = _abuse(srv)
    finally:
        srv.stop()
    err = srv.stderr()
    assert "Traceback" not in err, err
    assert srv.proc.returncode == 0
    assert {k: v for k, v in got.items() if k.endswith("good one")} == dict.fromkeys(
        [k for k in got if k.endswith("good one")], 200)
    assert got["huge content-length"] == got["over the limit"] == 413
    for name in ("negative content-length", "non-numeric content-length", "bad chunk size",
                 "unknown HTTP version", "bad gzip", "bad json"):
        assert got[name] == 400, (name, got)
    assert got["garbage request line"] in (0, 400)
    assert "Content-Length 1000000000000 is over the limit of 4096 bytes" in err
    assert "left mid-body" in err
    lines = err.splitlines()
    assert START.match(lines[0]) and len(lines) <= 1 + 10  # one line per refusal at most
    assert f"wrote 10 export requests, 0 spans to {tmp_path / 'spans.jsonl'}" in srv.stdout


def test_the_proxy_survives_abusive_clients(tmp_path: Path, upstream: int) -> None:
    srv = _record(tmp_path, upstream)
    try:
        got = _abuse(srv)
    finally:
        srv.stop()
    err = srv.stderr()
    assert "Traceback" not in err, err
    assert srv.proc.returncode == 0
    assert all(v == 200 for k, v in got.items() if k.endswith("good one")), got
    assert got["huge content-length"] == got["over the limit"] == 413
    for name in ("negative content-length", "non-numeric content-length", "bad chunk size",
                 "unknown HTTP version", "bad gzip", "bad json"):
        assert got[name] == 400, (name, got)
    assert "Content-Length 1000000000000 is over the limit of 4096 bytes" in err
    assert "recorded 10 calls (0 failed)" in srv.stdout


@pytest.mark.parametrize("reply", [
    b"",  # accepts, reads, closes without a word
    b"\x00\xffgarbage\r\n\r\n",  # not HTTP
    b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"choices\"",  # cut mid-answer
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # broken framing
])
def test_the_proxy_answers_502_for_an_upstream_that_misbehaves(tmp_path: Path,
                                                                reply: bytes) -> None:
    bad = socket.create_server(("127.0.0.1", 0))
    bad.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():  # a client may retry an idempotent request once
            try:
                conn, _ = bad.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    cfg = RecordConfig(out=tmp_path / "trace.jsonl",
                       upstream=f"http://127.0.0.1:{bad.getsockname()[1]}", client_time=False)
    try:
        with recording_proxy(cfg) as url:
            r = httpx.post(url + "/v1/chat/completions", content=CHAT, timeout=30,
                           headers={"Content-Type": "application/json"})
            other = httpx.get(url + "/v1/models", timeout=30)
            stats = url.stats()
    finally:
        stop.set()
        t.join(5)
        bad.close()
    assert r.status_code == 502 and r.json()["error"]["type"] in (
        "upstream_unreachable", "upstream_stream_cut")
    assert other.status_code in (200, 502)
    assert stats.failed == 1


def test_a_slow_client_is_answered_408(tmp_path: Path) -> None:
    with OtlpReceiver(tmp_path / "spans.jsonl", read_timeout_s=0.3) as r:
        port = int(r.url.rsplit(":", 1)[1])
        t0 = time.monotonic()
        resp = raw(port, _post("/v1/traces", b"{", length=50))
        assert _status(resp) == 408 and time.monotonic() - t0 < 5
        assert b"no body bytes for 0.3 s (1 of 50 received)" in resp
        assert _status(raw(port, _post("/v1/traces", EMPTY_EXPORT))) == 200
    cfg = RecordConfig(out=tmp_path / "trace.jsonl", upstream="http://127.0.0.1:9",
                       read_timeout_s=0.3)
    with recording_proxy(cfg) as url:
        port = int(url.rsplit(":", 1)[1])
        assert _status(raw(port, _post("/v1/chat/completions", b"{", length=50))) == 408


def test_start_up_lines_share_one_shape_on_stderr(tmp_path: Path, upstream: int) -> None:
    """Status on stderr, results on stdout: both commands' first stderr line names the URL, the
    file written and how to stop; stdout holds only the summary."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    servers = [_receive(a), _record(b, upstream)]
    for s in servers:
        s.stop()
    (rm, pm) = (s.start_line for s in servers)
    assert (rm[1], rm[2].endswith("/v1/traces"), rm[4], rm[5]) == (
        "trace receive", True, None, str(a / "spans.jsonl"))
    assert (pm[1], pm[4], pm[5]) == ("record", f"forwarding to http://127.0.0.1:{upstream}; ",
                                     str(b / "trace.jsonl"))
    assert all("listening on" not in s.stdout for s in servers)


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _receive(tmp_path_factory.mktemp("fuzz"))
    yield srv
    srv.stop()
    assert "Traceback" not in srv.stderr(), srv.stderr()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=300),
                 st.builds(lambda head, body: b"POST /v1/traces HTTP/1.1\r\n" + head + b"\r\n\r\n"
                           + body, st.binary(max_size=120), st.binary(max_size=120))))
def test_random_bytes_never_break_the_receiver(receiver: Server, data: bytes) -> None:
    resp = raw(receiver.port, data, close_write=True, wait_s=5)
    assert resp == b"" or _status(resp) in (200, 400, 404, 405, 408, 413, 415, 505), resp[:100]
    assert receiver.good() == 200
    assert "Traceback" not in receiver.stderr()


@pytest.mark.parametrize("which", ["receive", "record"])
def test_a_client_that_speaks_no_http_gets_one_log_line(tmp_path: Path, upstream: int,
                                                        which: str) -> None:
    # aiohttp logs a first request that is no HTTP at all at debug level only; the servers
    # say so like every other refusal: one line naming the client, no traceback
    srv = _receive(tmp_path) if which == "receive" else _record(tmp_path, upstream)
    try:
        status = _status(raw(srv.port, bytes(range(256)) * 8))
        good = srv.good()
    finally:
        srv.stop()
    lines = srv.stderr().splitlines()[1:]
    assert status == 400 and good == 200
    assert len(lines) == 1 and "refused a malformed request from 127.0.0.1" in lines[0], lines
    assert "Traceback" not in srv.stderr()


@pytest.mark.parametrize("which", ["receive", "record"])
def test_a_stop_does_not_wait_for_a_slow_client(tmp_path: Path, upstream: int,
                                                which: str) -> None:
    # a client that announced a body and pauses would hold a graceful stop for the 30 s read
    # timeout; the stop gives in-flight requests SHUTDOWN_GRACE_S, then closes them
    from scepsy_common.httpguard import READ_TIMEOUT_S, SHUTDOWN_GRACE_S

    srv = _receive(tmp_path) if which == "receive" else _record(tmp_path, upstream)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as slow:
        slow.sendall(_post(srv.path, b"abc", length=1000))  # 3 of 1000 bytes, then a pause
        time.sleep(0.5)
        t0 = time.monotonic()
        srv.stop()
        took = time.monotonic() - t0
    assert srv.proc.returncode == 0 and "Traceback" not in srv.stderr(), srv.stderr()
    assert took < SHUTDOWN_GRACE_S + (READ_TIMEOUT_S - SHUTDOWN_GRACE_S) / 2, took
