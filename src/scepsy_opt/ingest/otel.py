"""OpenTelemetry GenAI spans -> workflow traces (docs/otel.md).

Agent frameworks and LLM client libraries report what they do as OpenTelemetry spans: one span
per LLM call (``gen_ai.operation.name = chat``, or OpenInference ``openinference.span.kind =
LLM``), one per tool run, and spans for the agent steps, chains and HTTP requests around them.
This module reads such spans from OTLP/JSON files (the collector's file exporter, or
``scepsy trace receive``) and turns them into trace records (:mod:`scepsy_opt.traces`):

- :func:`read_otlp` reads the files into :class:`Span` records. A file that is not OTLP/JSON is
  an :class:`~scepsy_common.errors.InputError` naming the file and the line; a span that cannot
  be used (a bad id, no times) is kept with a ``problem`` and only reported.
- :func:`otlp_calls` classifies the spans (LLM call, tool call, structure), groups them into
  requests (one per root span, or per value of an attribute), maps model names to LLM names
  with a :class:`~scepsy_opt.ingest.tracemap.TraceMap`, and returns the calls (parents inferred from
  timing by :func:`~scepsy_opt.traces.infer_parents`, validated) with an :class:`ImportReport`
  that lists every span it could not use and why.
- :func:`import_otlp` is both.

The same spans always give the same calls in the same order, whatever order they came in.
"""

from __future__ import annotations

import base64
import binascii
import gc
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from scepsy_common.errors import NAME_MAX, InputError
from scepsy_common.files import read_text
from scepsy_opt.ingest.tracemap import TraceMap
from scepsy_opt.traces import MAX_TOKENS, CallRecord, infer_parents, validate_calls

PathLike = str | os.PathLike[str]

LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "completion"})
"""``gen_ai.operation.name`` values of an LLM call."""
TOOL_OPERATIONS = frozenset({"execute_tool", "retrieval"})
"""``gen_ai.operation.name`` values of a tool call (a retrieval is a tool, as OpenInference's
RETRIEVER)."""
OPENINFERENCE_LLM = frozenset({"LLM"})
OPENINFERENCE_TOOLS = frozenset({"TOOL", "RETRIEVER"})
NOT_LLM_REQUEST_TYPES = frozenset({"embedding", "embeddings", "rerank"})
"""OpenLLMetry's ``llm.request.type`` values of a span that names a model but is no LLM call."""

MODEL_KEYS = ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name")
INVOCATION_KEY = "llm.invocation_parameters"
"""OpenInference's request parameters (JSON text); its ``model`` names a call that failed."""
INPUT_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
OUTPUT_KEYS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
               "llm.token_count.completion")
PREFIX_KEYS = ("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens",
               "llm.token_count.prompt_details.cache_read")
SPAN_ERROR = "span_error"
"""``CallRecord.error`` of a call whose span has status ERROR."""
STRICT_KINDS = ("malformed", "unmapped", "orphans", "cycles", "missing_usage")
"""The report's kinds of problem (``ImportReport.problems``, ``scepsy trace import --strict``);
the other lists say how spans were read, not that something is wrong."""

# ------------------------------------------------------------------------------ spans

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_HEX_DIGITS = "0123456789abcdefABCDEF"
_NO_KEYS: frozenset[str] = frozenset()
_B64_LEN = {16: 24, 8: 12}
_INT = re.compile(r"[+-]?[0-9]+")
_MAX_DIGITS = 20  # longer digit strings cannot be 64-bit integers (and int() of huge ones is slow)
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


def _short(value: object) -> str:
    """``repr(value)``, cut to 40 characters for a message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_KINDS = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2,
          "SPAN_KIND_CLIENT": 3, "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
_ERROR_CODES = (2, "STATUS_CODE_ERROR", "2")


@dataclass(frozen=True, slots=True)
class Span:
    """One span as read from an OTLP/JSON file.

    Ids are lowercase hex (``trace_id`` 32 digits, ``span_id`` 16, ``parent_id`` 16 or ``""``
    for a root) or ``""`` where the file's value was unusable; times are integer nanoseconds
    since the Unix epoch. ``problem`` says why the span cannot be used as a call (a bad id,
    missing times); a span with a problem but usable ids still groups its children.
    """

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    resource: Mapping[str, Any]
    where: str  # FILE:line N resourceSpans[i].scopeSpans[j].spans[k]
    error: bool = False  # status code ERROR
    kind: int = 0  # SpanKind (0 unspecified, 1 internal, 2 server, 3 client, ...)
    problem: str | None = None
    bad_attributes: frozenset[str] = _NO_KEYS  # attributes whose value could not be decoded

    @property
    def label(self) -> str:
        """The span id, or where it is in its file when it has no usable id."""
        return self.span_id or self.where


class _Bad(Exception):
    """A value that cannot be decoded (its message is the reason)."""


def id_bytes(value: str, size: int) -> bytes | None:
    """The bytes of an OTLP trace (16 bytes) or span (8 bytes) id written as hex (OTLP/JSON)
    or as base64, standard or URL-safe (protobuf's JSON mapping, older exporters); None when
    it is neither."""
    if len(value) == 2 * size and not value.strip(_HEX_DIGITS):
        return bytes.fromhex(value)
    if len(value) == _B64_LEN[size]:
        try:
            raw = base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError):
            return None
        return raw if len(raw) == size else None
    return None


def _id(value: object, size: int, field_name: str, zero: str | None = None) -> str:
    """A trace (16 bytes) or span (8 bytes) id as lowercase hex (:func:`id_bytes`). An
    all-zero id is invalid, or ``zero`` when given."""
    raw = id_bytes(value, size) if isinstance(value, str) else None
    if raw is not None and raw.strip(b"\0"):
        return raw.hex()
    if raw is not None and zero is not None:
        return zero
    if raw is not None:
        raise _Bad(f"{field_name}: expected a non-zero id (got {value!r})")
    raise _Bad(f"{field_name}: expected {2 * size} hex digits or the base64 of {size} bytes "
               f"(got {value!r})")


def _parent(value: object) -> str:
    """The parent span id; ``""`` (a root) when absent, empty or all zeros."""
    if value is None or value == "":
        return ""
    return _id(value, 8, "parentSpanId", zero="")


def _nanos(value: object, field_name: str) -> int:
    if type(value) is str and len(value) <= _MAX_DIGITS and (
            (value.isascii() and value.isdigit()) or _INT.fullmatch(value)):
        n = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    elif value is None:
        raise _Bad(f"{field_name}: expected a time in nanoseconds (field is missing)")
    else:
        raise _Bad(f"{field_name}: expected a time in integer nanoseconds (got {_short(value)})")
    if n <= 0 or n > _UINT64_MAX:
        raise _Bad(f"{field_name}: expected a time after the Unix epoch (0 means unset) that "
                   f"fits 64 bits (got {_short(value)})")
    return n


def _any_value(v: object) -> Any:
    """An OTLP AnyValue as a Python value (arrays as tuples, key-value lists as dicts)."""
    if not isinstance(v, dict):
        raise _Bad(f"expected an AnyValue object (got {v!r})")
    if not v:
        return None
    if len(v) != 1:
        raise _Bad(f"expected one of stringValue, intValue, ... (got {sorted(v)!r})")
    (k, x), = v.items()
    if k == "stringValue":
        if isinstance(x, str):
            return x
    elif k == "intValue":
        if isinstance(x, str) and len(x) <= _MAX_DIGITS and _INT.fullmatch(x):
            x = int(x)
        if isinstance(x, int) and not isinstance(x, bool) and _INT64_MIN <= x <= _INT64_MAX:
            return x
        x = _short(x)
    elif k == "doubleValue":
        if isinstance(x, int | float) and not isinstance(x, bool):
            return float(x)
        if x in ("NaN", "Infinity", "-Infinity"):
            return float(x.replace("Infinity", "inf"))
    elif k == "boolValue":
        if isinstance(x, bool):
            return x
    elif k == "arrayValue":
        if isinstance(x, dict) and isinstance(x.get("values", []), list):
            return tuple(_any_value(e) for e in x.get("values", []))
    elif k == "kvlistValue":
        if isinstance(x, dict) and isinstance(x.get("values", []), list):
            return _attributes(x.get("values", []))[0]
    elif k == "bytesValue":
        if isinstance(x, str):
            return x
    else:
        raise _Bad(f"expected one of stringValue, intValue, ... (got {k!r})")
    raise _Bad(f"{k}: expected a valid value (got {x!r})")


def _attributes(items: object) -> tuple[dict[str, Any], frozenset[str]]:
    """An OTLP attribute list as a dict, and the keys whose values could not be decoded."""
    if items is None:
        return {}, _NO_KEYS
    if type(items) is not list:
        raise _Bad(f"attributes: expected a list (got {type(items).__name__})")
    out: dict[str, Any] = {}
    bad: set[str] | None = None
    for kv in items:
        if type(kv) is not dict or type(key := kv.get("key")) is not str:
            raise _Bad(f"attributes: expected {{key, value}} objects (got {kv!r})")
        value = kv.get("value")
        if type(value) is dict and len(value) == 1:  # the common cases first, without calls
            x = value.get("stringValue")
            if type(x) is str:
                out[key] = x
                continue
            x = value.get("intValue")
            if type(x) is str and x.isascii() and x.isdigit() and len(x) < _MAX_DIGITS:
                out[key] = int(x)
                continue
        try:
            out[key] = _any_value(value) if value is not None else None
        except _Bad:
            bad = bad or set()
            bad.add(key)
    return out, frozenset(bad) if bad else _NO_KEYS


def _span(raw: object, resource: Mapping[str, Any], where: str) -> Span:
    """One span object; never raises (a problem goes into ``Span.problem``)."""
    if type(raw) is not dict:
        return Span("", "", "", "", 0, 0, _EMPTY, resource, where,
                    problem=f"expected a span object (got {type(raw).__name__})")
    try:  # a good span, quickly; the slow path finds every problem of a bad one
        trace_id = _id(raw.get("traceId"), 16, "traceId")
        span_id = _id(raw.get("spanId"), 8, "spanId")
        parent_id = _parent(raw.get("parentSpanId"))
        start = _nanos(raw.get("startTimeUnixNano"), "startTimeUnixNano")
        end = _nanos(raw.get("endTimeUnixNano"), "endTimeUnixNano")
        attrs, bad = _attributes(raw.get("attributes"))
        name = raw.get("name", "")
        if end < start or type(name) is not str:
            raise _Bad("")
    except _Bad:
        return _bad_span(raw, resource, where)
    status = raw.get("status")
    error = type(status) is dict and status.get("code") in _ERROR_CODES
    kind = raw.get("kind", 0)
    kind = _KINDS.get(kind, 0) if type(kind) is str else kind if type(kind) is int else 0
    return Span(trace_id, span_id, parent_id, name, start, end, attrs, resource, where,
                error=error, kind=kind, bad_attributes=bad)


def _bad_span(raw: dict, resource: Mapping[str, Any], where: str) -> Span:
    """A span with a problem, every problem named; its ids when they are usable."""
    problems: list[str] = []

    def get(fn: Any, *args: Any, default: Any) -> Any:
        try:
            return fn(*args)
        except _Bad as exc:
            problems.append(str(exc))
            return default

    trace_id = get(_id, raw.get("traceId"), 16, "traceId", default="")
    span_id = get(_id, raw.get("spanId"), 8, "spanId", default="")
    parent_id = get(_parent, raw.get("parentSpanId"), default="")
    if problems and not (trace_id and span_id):
        parent_id = ""
    start = get(_nanos, raw.get("startTimeUnixNano"), "startTimeUnixNano", default=0)
    end = get(_nanos, raw.get("endTimeUnixNano"), "endTimeUnixNano", default=0)
    if start and end and end < start:
        problems.append(f"endTimeUnixNano: expected a time >= startTimeUnixNano ({start}) "
                        f"(got {end})")
    attrs, bad = get(_attributes, raw.get("attributes"), default=({}, _NO_KEYS))
    name = raw.get("name", "")
    if not isinstance(name, str):
        problems.append(f"name: expected a string (got {name!r})")
        name = ""
    status = raw.get("status")
    error = isinstance(status, dict) and status.get("code") in _ERROR_CODES
    return Span(trace_id, span_id, parent_id, name, start, end, attrs, resource, where,
                error=error, problem="; ".join(problems) or "unusable span",
                bad_attributes=bad)


# ------------------------------------------------------------------------------ files


def _camel(obj: Any) -> Any:
    """Protobuf's JSON with the proto field names (``resource_spans``, ``string_value``), as
    OTLP/JSON's lowerCamelCase (every object key in OTLP/JSON is a field name)."""
    if isinstance(obj, dict):
        return {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): _camel(v)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_camel(v) for v in obj]
    return obj


def _documents(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line, object)`` of each export request in a file: JSON lines, or one JSON document
    (told apart by whether the first non-blank line is JSON on its own)."""
    src = str(path)
    text = read_text(path, "OTLP/JSON file (JSON lines or one JSON document)")
    # "\n" only: U+2028, U+0085 and the like are legal inside JSON strings (str.splitlines
    # would cut a line there)
    lines = [ln.removesuffix("\r") for ln in text.split("\n")]
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is None:
        return
    try:
        doc = json.loads(lines[first])
    except (ValueError, RecursionError):
        try:
            yield first + 1, json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(src, f"line {exc.lineno}", f"valid JSON ({exc.msg})") from None
        except (ValueError, RecursionError):
            raise InputError(src, "", "valid JSON") from None
        return
    yield first + 1, doc
    for i in range(first + 1, len(lines)):
        if lines[i].strip():
            try:
                yield i + 1, json.loads(lines[i])
            except json.JSONDecodeError as exc:
                raise InputError(src, f"line {i + 1}", f"a JSON object ({exc.msg})") from None
            except (ValueError, RecursionError):
                raise InputError(src, f"line {i + 1}", "a JSON object") from None


def _list(obj: dict, key: str, src: str, field_name: str) -> list:
    value = obj.get(key, [])
    if not isinstance(value, list):
        raise InputError(src, field_name, "a list", type(value).__name__)
    return value


def _file_spans(path: Path) -> Iterator[Span]:
    src = str(path)
    for line, doc in _documents(path):
        at = f"line {line}"
        if not isinstance(doc, dict):
            raise InputError(src, at, "a JSON object (an OTLP/JSON export request)",
                             type(doc).__name__)
        if "resourceSpans" not in doc and "resource_spans" in doc:
            doc = _camel(doc)
        if "resourceSpans" not in doc:
            raise InputError(src, at, "an OTLP/JSON export request (an object with "
                             "resourceSpans)", f"keys {sorted(doc)[:5]}")
        for i, rs in enumerate(_list(doc, "resourceSpans", src, f"{at}: resourceSpans")):
            rs_at = f"{at}: resourceSpans[{i}]"
            if not isinstance(rs, dict):
                raise InputError(src, rs_at, "an object", type(rs).__name__)
            res = rs.get("resource") or {}
            if not isinstance(res, dict):
                raise InputError(src, f"{rs_at}.resource", "an object", type(res).__name__)
            try:
                resource: Mapping[str, Any] = _attributes(res.get("attributes"))[0]
            except _Bad as exc:
                raise InputError(src, f"{rs_at}.resource", str(exc)) from None
            # instrumentationLibrarySpans: the name before OTLP 0.15 (2022), in older files
            scopes = "scopeSpans" if "scopeSpans" in rs or "instrumentationLibrarySpans" not in rs \
                else "instrumentationLibrarySpans"
            for j, ss in enumerate(_list(rs, scopes, src, f"{rs_at}.{scopes}")):
                ss_at = f"{rs_at}.scopeSpans[{j}]"
                if not isinstance(ss, dict):
                    raise InputError(src, ss_at, "an object", type(ss).__name__)
                where = f"{src}:{at} resourceSpans[{i}].scopeSpans[{j}].spans"
                for k, raw in enumerate(_list(ss, "spans", src, f"{ss_at}.spans")):
                    yield _span(raw, resource, f"{where}[{k}]")


def read_otlp(paths: PathLike | Sequence[PathLike]) -> tuple[Span, ...]:
    """Every span of the OTLP/JSON files, in file order.

    A file holds JSON lines, each an ExportTraceServiceRequest in the OTLP/JSON mapping
    (``{"resourceSpans": [{"resource": ..., "scopeSpans": [{"scope": ..., "spans": [...]}]}]}``,
    what the collector's file exporter and ``scepsy trace receive`` write), or one such JSON
    document (pretty-printed). Ids may be hex (OTLP/JSON) or base64 (protobuf's JSON mapping),
    keys lowerCamelCase or the proto field names. A file that is missing, not JSON, or whose
    lines are not export requests is an :class:`InputError` naming the file and the line; a
    span that cannot be used is returned with its ``problem`` set.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    with _gc_paused():
        return tuple(s for p in paths for s in _file_spans(Path(p)))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cycle collector off while spans are built: it would scan the growing heap of small
    objects again and again (a third of the time); nothing built here forms a cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# ------------------------------------------------------------------------------ report


@dataclass(frozen=True, slots=True)
class Malformed:
    """A span that could not be used: its id (or place in its file) and why."""

    span: str
    reason: str


@dataclass(frozen=True, slots=True)
class Orphan:
    """A span whose parent is not among the spans read."""

    span: str
    parent: str


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A later copy of a (trace id, span id) already read: dropped."""

    span: str
    where: str


@dataclass(frozen=True, slots=True)
class Nested:
    """An LLM span with LLM spans beneath it (two instrumentations seeing one call): the inner
    span is the call, ``inner`` (``None`` when several LLM calls are beneath: then the outer
    span is only structure and gives them nothing)."""

    outer: str
    inner: str | None


@dataclass(frozen=True)
class ImportReport:
    """What an import read and every span it could not use, with span ids; lists sorted."""

    spans: int
    llm_calls: int
    tool_calls: int
    structure_spans: int
    requests: int
    failed: tuple[str, ...] = ()  # calls whose span has status ERROR (kept, error=span_error)
    malformed: tuple[Malformed, ...] = ()
    unmapped: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # model -> span ids
    missing_usage: tuple[str, ...] = ()  # LLM calls kept with 0 tokens
    orphans: tuple[Orphan, ...] = ()
    cycles: tuple[tuple[str, ...], ...] = ()  # span ids of each cycle, smallest first
    cycle_dropped: int = 0  # spans in or beneath a cycle, dropped
    duplicates: tuple[Duplicate, ...] = ()
    nested_llm: tuple[Nested, ...] = ()
    tools_as_structure: tuple[str, ...] = ()  # tool spans with calls beneath (agent as tool)
    no_request_attribute: tuple[str, ...] = ()  # calls grouped by root: attribute not found
    structure_example: str = ""  # one structure span (id and name), for messages

    def __post_init__(self) -> None:
        object.__setattr__(self, "unmapped", MappingProxyType(dict(sorted(self.unmapped.items()))))

    @property
    def unmapped_calls(self) -> int:
        return sum(len(v) for v in self.unmapped.values())

    @property
    def problems(self) -> int:
        """How many problems of the :data:`STRICT_KINDS` the import found."""
        return sum(self.counts()[k] for k in STRICT_KINDS)

    def ids(self) -> dict[str, tuple[str, ...]]:
        """Every kind of the report (problems first, :data:`STRICT_KINDS`) with the span ids of
        its entries (a malformed span without id: where it is; a cycle: its ids joined by
        ``>``; a nested LLM span: the outer one)."""
        return {
            "malformed": tuple(m.span for m in self.malformed),
            "unmapped": tuple(s for ids in self.unmapped.values() for s in ids),
            "orphans": tuple(o.span for o in self.orphans),
            "cycles": tuple(">".join(c) for c in self.cycles),
            "missing_usage": self.missing_usage,
            "duplicates": tuple(d.span for d in self.duplicates),
            "failed": self.failed,
            "nested_llm": tuple(n.outer for n in self.nested_llm),
            "tools_as_structure": self.tools_as_structure,
            "no_request_attribute": self.no_request_attribute,
        }

    def counts(self) -> dict[str, int]:
        """How many entries each kind has (``unmapped``: calls, ``cycles``: cycles)."""
        return {k: len(v) for k, v in self.ids().items()}

    def dropped(self) -> dict[str, tuple[int, str]]:
        """Why spans did not become calls: per reason with any span, how many spans and one
        example (a span id; for a malformed span also why, for an unmapped call its model, for
        a cycle its ids joined by ``>``). Reasons: ``malformed`` (bad ids, times or token
        counts), ``cycle`` (in or beneath a parent cycle), ``unmapped`` (an LLM call of a model
        the trace map does not name), ``duplicate`` (a later copy of a span), ``structure``
        (no LLM or tool attributes: the span only groups calls)."""
        out: dict[str, tuple[int, str]] = {}
        if self.malformed:
            m = self.malformed[0]
            out["malformed"] = (len(self.malformed), f"{m.span}: {m.reason}")
        if self.cycle_dropped:
            out["cycle"] = (self.cycle_dropped, ">".join(self.cycles[0]) if self.cycles else "")
        if self.unmapped:
            model, ids = next(iter(self.unmapped.items()))
            out["unmapped"] = (self.unmapped_calls, f"{ids[0]} (model {model!r})")
        if self.duplicates:
            out["duplicate"] = (len(self.duplicates), self.duplicates[0].span)
        if self.structure_spans:
            out["structure"] = (self.structure_spans, self.structure_example)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The whole report as JSON-ready data (every list complete)."""
        return {
            "spans": self.spans, "llm_calls": self.llm_calls, "tool_calls": self.tool_calls,
            "structure_spans": self.structure_spans, "requests": self.requests,
            "problems": self.problems, "counts": self.counts(),
            "failed": list(self.failed),
            "malformed": [{"span": m.span, "reason": m.reason} for m in self.malformed],
            "unmapped": {m: {"calls": len(ids), "spans": list(ids)}
                         for m, ids in self.unmapped.items()},
            "missing_usage": list(self.missing_usage),
            "orphans": [{"span": o.span, "parent": o.parent} for o in self.orphans],
            "cycles": [list(c) for c in self.cycles], "cycle_dropped": self.cycle_dropped,
            "duplicates": [{"span": d.span, "where": d.where} for d in self.duplicates],
            "nested_llm": [{"outer": n.outer, "inner": n.inner} for n in self.nested_llm],
            "tools_as_structure": list(self.tools_as_structure),
            "no_request_attribute": list(self.no_request_attribute),
            "dropped": {k: {"spans": n, "example": ex} for k, (n, ex) in self.dropped().items()},
        }


@dataclass(frozen=True)
class OtelImport:
    """The calls of an import (validated, sorted, parents inferred) and its report."""

    calls: tuple[CallRecord, ...]
    report: ImportReport


# ------------------------------------------------------------------------------ spans -> calls

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.+:/-]")


def sanitize_name(text: str, empty: str = "_") -> str:
    """``text`` as a trace name (:data:`~scepsy_common.errors.NAME_PATTERN`): every character
    outside ``A-Za-z0-9_.+:/-`` becomes ``_``, so does the first character of each ``/``-part
    that may not start one (an empty part becomes ``_``), cut at 128 characters (a ``/`` left
    last becomes ``_``); ``empty`` for ``""``. Deterministic (two texts may give one name:
    ``a b`` and ``a_b``)."""
    if not text:
        return empty
    parts = _NAME_BAD.sub("_", text).split("/")
    s = "/".join(p if p[:1].isalnum() or p[:1] == "_" else "_" + p[1:] for p in parts)[:NAME_MAX]
    return s[:-1] + "_" if s.endswith("/") else s


_STRUCT, _LLM, _TOOL = 0, 1, 2
Key = tuple[str, str]  # (trace id, span id)


@dataclass(slots=True)
class _Cand:
    """A call candidate while it is being resolved."""

    kind: int
    model: str | None = None
    tool: str | None = None
    tokens: list[int | None] = field(default_factory=lambda: [None, None, None])


def _text(attrs: Mapping[str, Any], key: str) -> str | None:
    v = attrs.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise _Bad(f"attribute {key}: expected a string (got {v!r})")
    return v


def _first_text(attrs: Mapping[str, Any], keys: Sequence[str]) -> str | None:
    for k in keys:
        v = _text(attrs, k)
        if v:
            return v
    return None


def _token(attrs: Mapping[str, Any], keys: Sequence[str]) -> int | None:
    for k in keys:
        v = attrs.get(k)
        if v is None:
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_TOKENS:
            raise _Bad(f"attribute {k}: expected a token count, an integer from 0 to "
                       f"{MAX_TOKENS} (got {v!r})")
        return v
    return None


def _invocation_model(attrs: Mapping[str, Any]) -> str | None:
    """The ``model`` (or ``model_name``) in OpenInference's ``llm.invocation_parameters`` (a
    JSON object as text): the model as the program sent it, and the only place a failed call's
    model is named."""
    text = attrs.get(INVOCATION_KEY)
    if not isinstance(text, str):
        return None
    try:
        params = json.loads(text)
    except ValueError:
        return None
    if not isinstance(params, dict):
        return None
    for key in ("model", "model_name"):
        model = params.get(key)
        if isinstance(model, str) and model:
            return model
    return None


def _classify(s: Span) -> _Cand | None:
    """The span as a call candidate, or None when it is structure; :class:`_Bad` when a value
    it needs cannot be used."""
    a = s.attributes
    for key in s.bad_attributes:
        if key in _READ_KEYS:
            raise _Bad(f"attribute {key}: expected a valid OTLP AnyValue")
    op = _text(a, "gen_ai.operation.name")
    if op:
        kind = _LLM if op in LLM_OPERATIONS else _TOOL if op in TOOL_OPERATIONS else _STRUCT
        tool_key = "gen_ai.tool.name" if op == "execute_tool" else None
    elif oi := _text(a, "openinference.span.kind"):
        oi = oi.upper()
        kind = _LLM if oi in OPENINFERENCE_LLM else _TOOL if oi in OPENINFERENCE_TOOLS \
            else _STRUCT
        tool_key = "tool.name" if oi == "TOOL" else None
    elif _text(a, "traceloop.span.kind") == "tool":
        kind, tool_key = _TOOL, "traceloop.entity.name"
    elif (_text(a, "llm.request.type") or "") not in NOT_LLM_REQUEST_TYPES and (
            _first_text(a, MODEL_KEYS[:2])):
        kind, tool_key = _LLM, None
    else:
        return None
    if kind == _STRUCT:
        return None
    if kind == _TOOL:
        name = (_text(a, tool_key) if tool_key else None) or s.name
        return _Cand(_TOOL, tool=sanitize_name(name, "tool"))
    # the model as sent wins: a server answers in its own name (vLLM's first served name for
    # every alias, OpenAI's dated snapshot), and OpenInference's llm.model_name is that answer
    return _Cand(_LLM, model=_first_text(a, MODEL_KEYS[:1]) or _invocation_model(a)
                 or _first_text(a, MODEL_KEYS[1:]),
                 tokens=[_token(a, INPUT_KEYS), _token(a, OUTPUT_KEYS), _token(a, PREFIX_KEYS)])


_READ_KEYS = frozenset({"gen_ai.operation.name", "openinference.span.kind", "traceloop.span.kind",
                        "llm.request.type", "gen_ai.tool.name", "tool.name",
                        "traceloop.entity.name", *MODEL_KEYS, *INPUT_KEYS, *OUTPUT_KEYS,
                        *PREFIX_KEYS})


@dataclass
class _Acc:
    """The report's lists while an import runs."""

    malformed: list[Malformed] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)
    orphans: list[Orphan] = field(default_factory=list)
    cycles: list[tuple[str, ...]] = field(default_factory=list)
    nested: list[Nested] = field(default_factory=list)
    tools_as_structure: list[str] = field(default_factory=list)
    unmapped: dict[str, list[str]] = field(default_factory=dict)
    missing_usage: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    no_attribute: list[str] = field(default_factory=list)
    unclassified: int = 0  # spans with usable ids whose attributes could not be read
    structure_example: str = ""


def _index(spans: Sequence[Span], acc: _Acc) -> dict[Key, Span]:
    """The spans with usable ids by (trace id, span id), first copy kept."""
    nodes: dict[Key, Span] = {}
    for s in spans:
        if not (s.trace_id and s.span_id):
            acc.malformed.append(Malformed(s.label, s.problem or "no usable id"))
            continue
        key = (s.trace_id, s.span_id)
        if key in nodes:
            acc.duplicates.append(Duplicate(s.span_id, s.where))
            continue
        nodes[key] = s
        if s.problem:
            acc.malformed.append(Malformed(s.span_id, s.problem))
    return nodes


_CYCLE: Key = ("", "")


def _tops(nodes: Mapping[Key, Span], acc: _Acc) -> dict[Key, Key]:
    """Each span's topmost ancestor among the spans read (a root, or an orphan: a span whose
    parent was not read); :data:`_CYCLE` for spans in or beneath a parent cycle."""
    top: dict[Key, Key] = {}
    for start in nodes:
        if start in top:
            continue
        path: list[Key] = []
        on_path: dict[Key, int] = {}
        k = start
        while True:
            if k in top:
                res = top[k]
                break
            if k in on_path:
                cyc = [c[1] for c in path[on_path[k]:]]
                i = cyc.index(min(cyc))
                acc.cycles.append(tuple(cyc[i:] + cyc[:i]))
                res = _CYCLE
                break
            on_path[k] = len(path)
            path.append(k)
            s = nodes[k]
            if not s.parent_id:
                res = k
                break
            pk = (k[0], s.parent_id)
            if pk not in nodes:
                acc.orphans.append(Orphan(s.span_id, s.parent_id))
                res = k
                break
            k = pk
        for p in path:
            top[p] = res
    return top


def _bottom_up(nodes: Mapping[Key, Span], top: Mapping[Key, Key]) -> list[Key]:
    """The spans not in a cycle, children before their parents."""
    children: dict[Key, list[Key]] = {}
    starts: list[Key] = []
    for k, s in nodes.items():
        t = top[k]
        if t == _CYCLE:
            continue
        if t == k:
            starts.append(k)
        else:
            children.setdefault((k[0], s.parent_id), []).append(k)
    order: list[Key] = []
    stack = starts[::-1]
    while stack:
        k = stack.pop()
        order.append(k)
        stack.extend(children.get(k, ()))
    order.reverse()
    return order


def _candidates(nodes: Mapping[Key, Span], order: Sequence[Key], acc: _Acc) -> dict[Key, _Cand]:
    """The call candidates, resolved so that calls are leaves: an LLM span with one LLM call
    beneath it gives that call what it lacks and stays structure (several beneath: structure),
    a tool span with calls beneath it is structure."""
    cands: dict[Key, _Cand] = {}
    for k in order:
        s = nodes[k]
        if s.problem:
            continue
        try:
            c = _classify(s)
        except _Bad as exc:
            acc.malformed.append(Malformed(s.span_id, str(exc)))
            acc.unclassified += 1
            continue
        if c is not None:
            cands[k] = c
        elif not acc.structure_example or s.span_id < acc.structure_example:
            acc.structure_example = f"{s.span_id} {s.name!r}"  # the smallest id: order-free
    below: dict[Key, tuple[int, Key | None, bool]] = {}  # LLM leaves, the one leaf, any call
    calls: dict[Key, _Cand] = {}
    for k in order:  # children first
        n, one, anycall = below.pop(k, (0, None, False))
        c = cands.get(k)
        if c is not None and c.kind == _LLM:
            if n == 0:
                calls[k] = c
                n, one = 1, k
            else:
                acc.nested.append(Nested(k[1], one[1] if n == 1 and one else None))
                if n == 1 and one is not None:
                    leaf = calls[one]
                    leaf.tokens = [t if t is not None else o
                                   for t, o in zip(leaf.tokens, c.tokens, strict=True)]
                    leaf.model = leaf.model or c.model
            anycall = True
        elif c is not None:  # a tool
            if anycall:
                acc.tools_as_structure.append(k[1])
            else:
                calls[k] = c
            anycall = True
        s = nodes[k]
        pk = (k[0], s.parent_id)
        if s.parent_id and pk in nodes:
            pn, pone, pany = below.get(pk, (0, None, False))
            total = pn + n
            below[pk] = (total, (one if pn == 0 else pone) if total == 1 else None, pany or anycall)
    return calls


def _requests(nodes: Mapping[Key, Span], top: Mapping[Key, Key], calls: Mapping[Key, _Cand],
              tmap: TraceMap, acc: _Acc) -> dict[Key, str]:
    """The request id of every call."""
    roots = [k for k, t in top.items() if t == k and not nodes[k].parent_id]
    traces_of: dict[str, set[str]] = {}
    roots_in: dict[str, list[Key]] = {}
    for k in roots:
        traces_of.setdefault(k[1], set()).add(k[0])
        roots_in.setdefault(k[0], []).append(k)

    def root_request(k: Key) -> str:
        return k[1] if len(traces_of[k[1]]) == 1 else f"{k[0]}:{k[1]}"

    def by_root(k: Key) -> str:
        t = top[k]
        if not nodes[t].parent_id:
            return root_request(t)
        mine = roots_in.get(k[0], [])
        return root_request(mine[0]) if len(mine) == 1 else k[0]

    attr = tmap.request_attribute
    if attr is None:
        return {k: by_root(k) for k in calls}
    memo: dict[Key, str | None] = {}

    def lookup(k: Key) -> str | None:
        """The attribute on the span or its nearest ancestor that has it."""
        path: list[Key] = []
        found: str | None = None
        while True:
            if k in memo:
                found = memo[k]
                break
            path.append(k)
            found = _attr_name(nodes[k].attributes.get(attr))
            if found is not None or top[k] == k:
                break
            k = (k[0], nodes[k].parent_id)
        for p in path:
            memo[p] = found
        return found

    out: dict[Key, str] = {}
    for k in calls:
        v = lookup(k)
        if v is None:
            v = _attr_name(nodes[k].resource.get(attr))
        if v is None:
            acc.no_attribute.append(k[1])
            v = by_root(k)
        out[k] = v
    return out


def _attr_name(v: object) -> str | None:
    if v is None or isinstance(v, tuple | dict) or v == "":
        return None
    return sanitize_name(str(v).lower() if isinstance(v, bool) else str(v))


def otlp_calls(spans: Sequence[Span], tmap: TraceMap | None = None,
               source: str = "OTLP spans") -> OtelImport:
    """The trace records of ``spans`` (:func:`read_otlp`) and the report of what was not used.

    LLM calls are the spans with an LLM ``gen_ai.operation.name`` (or OpenInference kind
    ``LLM``, or a model and no operation) whose model ``tmap`` maps to an LLM; tool calls the
    ``execute_tool``/``retrieval`` spans (OpenInference ``TOOL``/``RETRIEVER``); calls are
    leaves (see docs/otel.md); every other span only groups. One request per root span, or
    per value of ``tmap.request_attribute``; ``call_id`` is the span id, times are seconds
    since the earliest span start, parents come from :func:`infer_parents`. Never raises for
    a span: what cannot be used is in ``report``.
    """
    with _gc_paused():
        return _otlp_calls(spans, tmap if tmap is not None else TraceMap(), source)


def _otlp_calls(spans: Sequence[Span], tmap: TraceMap, source: str) -> OtelImport:
    acc = _Acc()
    nodes = _index(spans, acc)
    top = _tops(nodes, acc)
    order = _bottom_up(nodes, top)
    cands = _candidates(nodes, order, acc)
    llms: dict[Key, str] = {}
    for k, c in cands.items():
        if c.kind == _LLM:
            llm = tmap.llm_for(c.model)
            if llm is None:
                acc.unmapped.setdefault(c.model or "", []).append(k[1])
                continue
            llms[k] = llm
            # a failed call has no usage to miss: it is left out of the statistics anyway
            if c.tokens[0] is None and c.tokens[1] is None and not nodes[k].error:
                acc.missing_usage.append(k[1])
    kept = {k: c for k, c in cands.items() if c.kind == _TOOL or k in llms}
    requests = _requests(nodes, top, kept, tmap, acc)
    valid = [nodes[k] for k in order if not nodes[k].problem]
    origin = min((s.start_ns for s in valid), default=0)
    calls = _records(nodes, kept, llms, requests, tmap.workflow, origin, acc)
    calls = infer_parents(calls)
    validate_calls(calls, source)
    n_llm = sum(c.llm is not None for c in calls)
    report = ImportReport(
        spans=len(spans), llm_calls=n_llm, tool_calls=len(calls) - n_llm,
        structure_spans=len(valid) - acc.unclassified - len(cands),
        requests=len({c.request_id for c in calls}),
        failed=tuple(sorted(acc.failed)),
        malformed=tuple(sorted(acc.malformed, key=lambda m: (m.span, m.reason))),
        unmapped={m: tuple(sorted(v)) for m, v in acc.unmapped.items()},
        missing_usage=tuple(sorted(acc.missing_usage)),
        orphans=tuple(sorted(acc.orphans, key=lambda o: (o.span, o.parent))),
        cycles=tuple(sorted(acc.cycles)),
        cycle_dropped=sum(1 for t in top.values() if t == _CYCLE),
        duplicates=tuple(sorted(acc.duplicates, key=lambda d: (d.span, d.where))),
        nested_llm=tuple(sorted(acc.nested, key=lambda n: (n.outer, n.inner or ""))),
        tools_as_structure=tuple(sorted(acc.tools_as_structure)),
        no_request_attribute=tuple(sorted(acc.no_attribute)),
        structure_example=acc.structure_example,
    )
    return OtelImport(calls, report)


def _records(nodes: Mapping[Key, Span], kept: Mapping[Key, _Cand], llms: Mapping[Key, str],
             requests: Mapping[Key, str], workflow: str, origin: int,
             acc: _Acc) -> tuple[CallRecord, ...]:
    """The calls as records, sorted by (request's first start, start, end, call id)."""
    first: dict[str, int] = {}
    seen: dict[tuple[str, str], str] = {}  # (request, span id) -> its trace id
    twice: set[tuple[str, str]] = set()  # ... when two traces have it
    for k in kept:
        r = requests[k]
        start = nodes[k].start_ns
        if start < first.get(r, start + 1):
            first[r] = start
        if seen.setdefault((r, k[1]), k[0]) != k[0]:
            twice.add((r, k[1]))
    rows = []
    for k, c in kept.items():
        s = nodes[k]
        r = requests[k]
        call_id = f"{k[0]}:{k[1]}" if twice and (r, k[1]) in twice else k[1]
        rows.append((first[r], r, s.start_ns, s.end_ns, call_id, k, c))
    rows.sort(key=lambda row: row[:5])
    out = []
    for _, r, start, end, call_id, k, c in rows:
        error = SPAN_ERROR if nodes[k].error else None
        if error:
            acc.failed.append(k[1])
        tokens = [t or 0 for t in c.tokens] if c.kind == _LLM else [0, 0, 0]
        out.append(CallRecord(
            workflow=workflow, request_id=r, call_id=call_id,
            start_s=(start - origin) / 1_000_000_000, end_s=(end - origin) / 1_000_000_000,
            llm=llms.get(k), tool=c.tool if c.kind == _TOOL else None,
            input_tokens=tokens[0], output_tokens=tokens[1], prefix_tokens=tokens[2],
            error=error))
    return tuple(out)


def import_otlp(paths: PathLike | Sequence[PathLike], tmap: TraceMap | None = None) -> OtelImport:
    """:func:`read_otlp` then :func:`otlp_calls`."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    return otlp_calls(read_otlp(paths), tmap, ", ".join(str(p) for p in paths))



__all__ = [
    "SPAN_ERROR",
    "STRICT_KINDS",
    "Duplicate",
    "ImportReport",
    "Malformed",
    "Nested",
    "Orphan",
    "OtelImport",
    "Span",
    "id_bytes",
    "import_otlp",
    "otlp_calls",
    "read_otlp",
    "sanitize_name",
]
