"""The OTLP/HTTP trace receiver (scepsy_opt.ingest.otlp_http, `scepsy trace receive`).

The oracle is the OpenTelemetry SDK itself: spans made by the real SDK, exported by the real
OTLP/HTTP exporter (protobuf, plain or gzip) to the receiver on loopback, must come back from
the written file with the SDK's own ids, names, kinds, times, attributes, events, links and
status. Error paths use hand-made bodies.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from scepsy.cli import main
from scepsy_opt.ingest.otlp_http import (
    JSON,
    PROTOBUF,
    BadExportRequest,
    OtlpReceiver,
    UnsupportedMediaType,
    otlp_receiver,
    otlp_request_to_json,
    request_line,
    span_count,
)

# ------------------------------------------------------------------------------ helpers


def _value(v: dict[str, Any]) -> Any:
    """An OTLP/JSON AnyValue as the Python value the SDK holds (sequences as tuples)."""
    (kind, x), = v.items()
    if kind == "stringValue":
        return x
    if kind == "boolValue":
        return x
    if kind == "intValue":
        assert isinstance(x, str), "int64 values are strings in the OTLP/JSON mapping"
        return int(x)
    if kind == "doubleValue":
        return float(x)  # "Infinity", "-Infinity" are strings in proto3 JSON
    if kind == "arrayValue":
        return tuple(_value(i) for i in x.get("values", []))
    raise AssertionError(f"unexpected AnyValue {v}")


def _attrs(items: Sequence[dict[str, Any]] | None) -> dict[str, Any]:
    return {a["key"]: _value(a["value"]) for a in items or ()}


def _file_spans(path: Path) -> dict[str, dict[str, Any]]:
    """Every span of an OTLP/JSON lines file by span id, with its scope and resource."""
    out: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    assert s["spanId"] not in out
                    out[s["spanId"]] = {**s, "_scope": ss.get("scope", {}),
                                        "_resource": _attrs(rs.get("resource", {}).get(
                                            "attributes"))}
    return out


def _hex(n: int, digits: int) -> str:
    return format(n, f"0{digits}x")


def _check_span(got: dict[str, Any], want: ReadableSpan) -> None:
    """One file span against the SDK's ReadableSpan (exact: ids, times, values)."""
    ctx = want.get_span_context()
    assert got["traceId"] == _hex(ctx.trace_id, 32)
    assert got["spanId"] == _hex(ctx.span_id, 16)
    if want.parent is None:
        assert "parentSpanId" not in got
    else:
        assert got["parentSpanId"] == _hex(want.parent.span_id, 16)
    assert got.get("name", "") == want.name  # proto3 JSON leaves out empty values
    assert got["kind"] == want.kind.value + 1  # SDK INTERNAL=0 .. CONSUMER=4; OTLP 1..5
    assert got["startTimeUnixNano"] == str(want.start_time)
    assert got["endTimeUnixNano"] == str(want.end_time)
    assert _attrs(got.get("attributes")) == dict(want.attributes or {})
    status = got.get("status", {})
    assert status.get("code", 0) == want.status.status_code.value  # UNSET 0, OK 1, ERROR 2
    assert status.get("message", "") == (want.status.description or "")
    assert [(e["name"], e["timeUnixNano"], _attrs(e.get("attributes")))
            for e in got.get("events", [])] == [
        (e.name, str(e.timestamp), dict(e.attributes or {})) for e in want.events]
    assert [(k["traceId"], k["spanId"], _attrs(k.get("attributes")))
            for k in got.get("links", [])] == [
        (_hex(k.context.trace_id, 32), _hex(k.context.span_id, 16), dict(k.attributes or {}))
        for k in want.links]
    assert got["_scope"].get("name") == want.instrumentation_scope.name
    assert got["_resource"] == dict(want.resource.attributes)


ATTRS: dict[str, Any] = {
    "text": "héllo \u2603", "empty": "", "flag": True, "int": 42, "negative": -7,
    "big": 2**62 + 3, "double": 0.1, "huge": 1e300, "inf": float("inf"),
    "names": ("a", "b"), "ints": (1, -2, 3), "doubles": (0.5, 2.25), "flags": (True, False),
    "gen_ai.usage.input_tokens": 128,
}


def _make_spans(tracer: Any) -> None:
    """A small tree: a root with every attribute type, a CLIENT child with an event and an
    ERROR status, a grandchild linked to the root, and a second trace."""
    with tracer.start_as_current_span("root", attributes=ATTRS) as root, \
            tracer.start_as_current_span("chat model", kind=SpanKind.CLIENT) as child:
        child.add_event("first token", {"at": 3})
        with tracer.start_as_current_span("tool", links=[Link(root.get_span_context(),
                                                              {"why": "x"})]):
            pass
        child.set_status(Status(StatusCode.ERROR, "upstream said 500"))
    with tracer.start_as_current_span("other", kind=SpanKind.SERVER, start_time=1_000,
                                      end_on_exit=False) as s:
        s.set_status(Status(StatusCode.OK))
    s.end(end_time=5_000_000_123)


def _provider(*processors: Any) -> TracerProvider:
    p = TracerProvider(resource=Resource.create({"service.name": "receiver-test"}))
    for proc in processors:
        p.add_span_processor(proc)
    return p


def _post(url: str, body: bytes, ctype: str, encoding: str | None = None
          ) -> tuple[int, bytes, str]:
    headers = {"Content-Type": ctype}
    if encoding:
        headers["Content-Encoding"] = encoding
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def _request_bytes() -> bytes:
    """A real exporter's protobuf body (the SDK's encoder) with the spans of _make_spans."""
    memory = InMemorySpanExporter()
    p = _provider(SimpleSpanProcessor(memory))
    _make_spans(p.get_tracer("unit"))
    p.shutdown()
    return encode_spans(memory.get_finished_spans()).SerializeToString()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[OtlpReceiver]:
    with OtlpReceiver(tmp_path / "spans.otlp.jsonl") as r:
        yield r


# -------------------------------------------------------------------- the SDK as oracle


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_sdk_export_comes_back_exactly(tmp_path: Path, compression: Compression) -> None:
    out = tmp_path / "spans.otlp.jsonl"
    memory = InMemorySpanExporter()
    with OtlpReceiver(out) as r:
        exporter = OTLPSpanExporter(endpoint=r.url + "/v1/traces", compression=compression,
                                    timeout=30)
        p = _provider(SimpleSpanProcessor(memory), SimpleSpanProcessor(exporter))
        _make_spans(p.get_tracer("unit", "1.2"))
        p.shutdown()
        counts = r.counts()
    want = memory.get_finished_spans()
    got = _file_spans(out)
    assert len(want) == 4 and set(got) == {_hex(s.context.span_id, 16) for s in want}
    for s in want:
        _check_span(got[_hex(s.context.span_id, 16)], s)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert counts.requests == len(lines) == 4  # SimpleSpanProcessor: one export per span
    assert counts.spans == 4
    assert all(line == request_line(json.loads(line)).rstrip("\n") for line in lines)


def test_concurrent_exports_give_whole_lines(receiver: OtlpReceiver) -> None:
    body = _request_bytes()

    def send() -> None:
        for _ in range(5):
            assert _post(receiver.url + "/v1/traces", body, PROTOBUF)[0] == 200

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = receiver.out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 20 == receiver.requests
    assert set(lines) == {request_line(otlp_request_to_json(body, PROTOBUF))
                                        .rstrip("\n")}
    assert receiver.spans == 20 * 4


# ------------------------------------------------------------------------- the mapping


def test_mapping_is_the_otlp_json_one() -> None:
    doc = otlp_request_to_json(_request_bytes(), PROTOBUF)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert re.fullmatch(r"[0-9a-f]{32}", span["traceId"])
    assert re.fullmatch(r"[0-9a-f]{16}", span["spanId"])
    assert isinstance(span["startTimeUnixNano"], str) and span["startTimeUnixNano"].isdigit()
    assert set(span) >= {"traceId", "spanId", "name", "kind", "startTimeUnixNano",
                         "endTimeUnixNano"}
    assert all("_" not in k for k in span)  # camelCase, never snake_case
    assert isinstance(span["kind"], int)
    assert span_count(doc) == 4


def test_same_body_same_bytes_whatever_the_encoding() -> None:
    body = _request_bytes()
    line = request_line(otlp_request_to_json(body, PROTOBUF))
    assert request_line(otlp_request_to_json(body, PROTOBUF + "; charset=binary")) == line
    doc = json.loads(line)
    # the OTLP/JSON body (hex ids) and protobuf's own JSON (base64 ids) both give the same line
    assert request_line(otlp_request_to_json(line.encode(), JSON)) == line
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    b64 = json_format.MessageToJson(msg).encode()
    assert request_line(otlp_request_to_json(b64, "application/json; charset=utf-8")) == line
    # keys in the mapping's order, not sorted: resource before scopeSpans, traceId first
    assert list(doc["resourceSpans"][0]) == ["resource", "scopeSpans"]
    assert next(iter(doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0])) == "traceId"


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_scalar = st.one_of(
    _text, st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=True))
_value_st = st.one_of(
    _scalar, st.lists(_text, max_size=3).map(tuple),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3).map(tuple),
    st.lists(st.floats(allow_nan=False), max_size=3).map(tuple),
    st.lists(st.booleans(), max_size=3).map(tuple))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attrs=st.dictionaries(st.text(min_size=1, max_size=6), _value_st, max_size=6),
       name=_text, kind=st.sampled_from(list(SpanKind)))
def test_any_sdk_span_converts_exactly(attrs: dict[str, Any], name: str, kind: SpanKind
                                       ) -> None:
    memory = InMemorySpanExporter()
    p = _provider(SimpleSpanProcessor(memory))
    tracer = p.get_tracer("prop")
    with tracer.start_as_current_span("parent"), tracer.start_as_current_span(
            name, kind=kind, attributes=attrs):
        pass
    p.shutdown()
    spans = memory.get_finished_spans()
    body = encode_spans(spans).SerializeToString()
    doc = otlp_request_to_json(body, PROTOBUF)
    got = {s["spanId"]: {**s, "_scope": ss.get("scope", {}),
                         "_resource": _attrs(rs["resource"].get("attributes"))}
           for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}
    for s in spans:
        _check_span(got[_hex(s.context.span_id, 16)], s)
    line = request_line(doc)
    assert request_line(otlp_request_to_json(line.encode(), JSON)) == line


# ------------------------------------------------------------------------- HTTP answers


def test_answers_in_the_request_encoding(receiver: OtlpReceiver) -> None:
    body = _request_bytes()
    status, data, ctype = _post(receiver.url + "/v1/traces", body, PROTOBUF)
    assert (status, ctype) == (200, PROTOBUF)
    ExportTraceServiceResponse().ParseFromString(data)  # an empty response, as protobuf
    line = request_line(otlp_request_to_json(body, PROTOBUF)).encode()
    status, data, ctype = _post(receiver.url + "/v1/traces", gzip.compress(line), JSON, "gzip")
    assert (status, ctype, json.loads(data)) == (200, JSON, {})
    assert receiver.out.read_bytes() == line * 2


def _bad_cases(url: str, limit: int) -> list[tuple[str, str, bytes, str, str | None, int]]:
    good = _request_bytes()
    return [
        ("other path", url + "/v1/logs", good, PROTOBUF, None, 404),
        ("text body", url + "/v1/traces", b"hello", "text/plain", None, 415),
        ("no content type", url + "/v1/traces", good, "", None, 415),
        ("brotli", url + "/v1/traces", good, PROTOBUF, "br", 415),
        ("cut protobuf", url + "/v1/traces", good[: len(good) // 2], PROTOBUF, None, 400),
        ("junk protobuf", url + "/v1/traces", b"\x0a\x05ab", PROTOBUF, None, 400),
        ("not json", url + "/v1/traces", b"{nope", JSON, None, 400),
        ("json list", url + "/v1/traces", b"[1]", JSON, None, 400),
        ("no resourceSpans", url + "/v1/traces", b"{}", JSON, None, 400),
        ("bad trace id", url + "/v1/traces",
         json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
             {"traceId": "xyz", "spanId": "00f067aa0ba902b7", "name": "a"}]}]}]}).encode(),
         JSON, None, 400),
        ("wrong field type", url + "/v1/traces",
         json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
             {"name": ["a"]}]}]}]}).encode(), JSON, None, 400),
        ("lone surrogate", url + "/v1/traces",
         b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"\\ud800"}]}]}]}', JSON, None,
         400),
        ("not utf-8", url + "/v1/traces", b'{"resourceSpans":["\xff"]}', JSON, None, 400),
        ("not gzip", url + "/v1/traces", good, PROTOBUF, "gzip", 400),
        ("cut gzip", url + "/v1/traces", gzip.compress(good)[:-10], PROTOBUF, "gzip", 400),
        ("too large", url + "/v1/traces", b"\0" * (limit + 1), PROTOBUF, None, 413),
        ("gzip bomb", url + "/v1/traces", gzip.compress(b"\0" * (limit * 50)), PROTOBUF,
         "gzip", 413),
    ]


def test_bad_requests_get_4xx_and_write_nothing(tmp_path: Path) -> None:
    out = tmp_path / "spans.otlp.jsonl"
    limit = 4096
    with OtlpReceiver(out, max_body_bytes=limit) as r:
        cases = _bad_cases(r.url, limit)
        got = {name: _post(u, body, ctype, enc)[0] for name, u, body, ctype, enc, _ in cases}
        ok = _post(r.url + "/v1/traces", _request_bytes(), PROTOBUF)[0]
        assert r.requests == 1
    assert got == {name: code for name, *_, code in cases}
    assert ok == 200
    assert len(out.read_text(encoding="utf-8").splitlines()) == 1


@pytest.mark.parametrize("body,ctype,error", [
    (b"\x0a\x05ab", PROTOBUF, BadExportRequest),
    (b"{}", JSON, BadExportRequest),
    (b"{}", "text/plain", UnsupportedMediaType),
    # an id that ends in a newline is not 16 hex digits
    (json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "0" * 31 + "1", "spanId": "eee19b7ec3c1b17\n", "name": "x"}]}]}]}).encode(),
     JSON, BadExportRequest),
])
def test_conversion_errors_are_value_errors(body: bytes, ctype: str, error: type) -> None:
    with pytest.raises(error) as info:
        otlp_request_to_json(body, ctype)
    assert isinstance(info.value, ValueError)


def test_empty_export_is_an_empty_line_of_spans() -> None:
    assert otlp_request_to_json(b"", PROTOBUF) == {"resourceSpans": []}


def test_appends_and_exclusive(tmp_path: Path) -> None:
    out = tmp_path / "spans.otlp.jsonl"
    out.write_text("keep\n", encoding="utf-8")
    with pytest.raises(FileExistsError), OtlpReceiver(out, exclusive=True):
        pass
    with otlp_receiver(out) as url:
        assert _post(url + "/v1/traces", _request_bytes(), PROTOBUF)[0] == 200
    assert out.read_text(encoding="utf-8").startswith("keep\n{")


def test_port_in_use_raises_and_leaves_no_file(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        out = tmp_path / "spans.otlp.jsonl"
        with pytest.raises(OSError), OtlpReceiver(out, port=s.getsockname()[1]):
            pass
        assert not out.exists()


# ----------------------------------------------------------------------------------- CLI


def test_cli_creates_the_folder_of_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "new" / "spans.otlp.jsonl"
    assert main(["trace", "receive", "--listen", "127.0.0.1:0", "--out", str(out),
                 "--duration", "0.1"]) == 0
    assert out.exists() and "wrote 0 export requests, 0 spans" in capsys.readouterr().out


def test_cli_refuses_existing_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "spans.otlp.jsonl"
    out.write_text("keep\n", encoding="utf-8")
    rc = main(["trace", "receive", "--listen", "127.0.0.1:0", "--out", str(out),
               "--duration", "0.1"])
    err = capsys.readouterr().err
    assert rc == 2 and "--out" in err and str(out) in err and len(err.splitlines()) == 1
    assert out.read_text(encoding="utf-8") == "keep\n"


@pytest.mark.parametrize("listen", ["localhost", "127.0.0.1:http", "127.0.0.1:70000", ":4318",
                                    "1.2.3.4:5:6", "[::1:4318"])
def test_cli_bad_listen(tmp_path: Path, listen: str, capsys: pytest.CaptureFixture[str]
                        ) -> None:
    out = tmp_path / "spans.otlp.jsonl"
    rc = main(["trace", "receive", "--listen", listen, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "--listen" in err and repr(listen) in err
    assert not out.exists()


def test_cli_port_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "spans.otlp.jsonl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        listen = f"127.0.0.1:{s.getsockname()[1]}"
        rc = main(["trace", "receive", "--listen", listen, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "--listen" in err and listen in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_cli_duration_with_nothing_received(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "spans.otlp.jsonl"
    rc = main(["trace", "receive", "--listen", "127.0.0.1:0", "--out", str(out),
               "--duration", "0.2"])
    assert rc == 0
    assert capsys.readouterr().out == f"wrote 0 export requests, 0 spans to {out}\n"
    assert out.read_bytes() == b""


def _scepsy() -> str:
    exe = shutil.which("scepsy") or str(Path(sys.executable).with_name("scepsy"))
    assert Path(exe).exists(), "the scepsy console script is not installed"
    return exe


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_receives_until_signalled(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "spans.otlp.jsonl"
    proc = subprocess.Popen([_scepsy(), "trace", "receive", "--listen", "127.0.0.1:0",
                             "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    watchdog = threading.Timer(120, proc.kill)  # a hung receiver fails the test, never hangs it
    watchdog.start()
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+/v1/traces)", first)
        assert m, first
        memory = InMemorySpanExporter()
        p = _provider(SimpleSpanProcessor(memory),
                      SimpleSpanProcessor(OTLPSpanExporter(endpoint=m[1], timeout=30)))
        _make_spans(p.get_tracer("cli"))
        p.shutdown()
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert stdout == f"wrote 4 export requests, 4 spans to {out}\n"
    got = _file_spans(out)
    for s in memory.get_finished_spans():
        _check_span(got[_hex(s.context.span_id, 16)], s)


def test_base64_ids_in_json_are_read() -> None:
    tid, sid = bytes(range(16)), bytes(range(8))
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": base64.b64encode(tid).decode(), "spanId": base64.b64encode(sid).decode(),
        "name": "a", "kind": "SPAN_KIND_CLIENT", "startTimeUnixNano": 5,
        "endTimeUnixNano": "6", "unknownField": 1}]}]}]}
    span = otlp_request_to_json(json.dumps(doc).encode(), JSON)[
        "resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span == {"traceId": tid.hex(), "spanId": sid.hex(), "name": "a", "kind": 3,
                    "startTimeUnixNano": "5", "endTimeUnixNano": "6"}
