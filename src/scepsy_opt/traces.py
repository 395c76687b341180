"""Workflow traces: one record per LLM or tool call, stored as JSON lines.

A trace is what a proxy in front of the LLM endpoints records for a set of workflow requests
(docs/traces.md). Each line is one call::

    {"workflow": "rag", "request_id": "r0", "call_id": "c1", "parents": ["c0"],
     "llm": "reranker", "start_s": 0.12, "end_s": 0.31, "input_tokens": 640,
     "output_tokens": 1, "prefix_tokens": 512}

Exactly one of ``llm`` (the name of the deployed LLM, shared by every workflow that calls it) and
``tool`` (a tool's name) is set; ``role`` optionally says which part an LLM plays when one LLM
serves several (a planner and a coder on the same model).
``parents`` lists the calls whose results this call needed (they ended before it started).
"""

from __future__ import annotations

import json
import os
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from itertools import accumulate
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scepsy_common.errors import InputError, Name, validated
from scepsy_common.files import atomic_write_text, read_jsonl_objects

TIME_TOLERANCE_S = 1e-9
"""Two times this close count as equal (a parent may end this much after its child starts)."""
_EPS = TIME_TOLERANCE_S
MAX_TOKENS = 10_000_000
"""The most tokens one call of a trace file may read or write."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One LLM or tool call of one workflow request."""

    workflow: str
    request_id: str
    call_id: str
    start_s: float
    end_s: float
    llm: str | None = None
    tool: str | None = None
    role: str | None = None  # optional: the part an LLM plays (one LLM may serve several roles)
    parents: tuple[str, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    prefix_tokens: int = 0
    error: str | None = None  # why the call failed (``upstream_503``, ``client_disconnected``)

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def is_llm(self) -> bool:
        return self.llm is not None

    @property
    def name(self) -> str:
        """The LLM role or the tool name."""
        return self.llm if self.llm is not None else str(self.tool)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_json(self) -> str:
        # the fields read directly: asdict's deep copy was most of a recording proxy's time
        d = {k: v for k in _CALL_FIELDS if (v := getattr(self, k)) is not None}
        d["parents"] = list(self.parents)
        return json.dumps(d, sort_keys=True)


_CALL_FIELDS = tuple(f.name for f in fields(CallRecord))


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    workflow: Name
    request_id: Name
    call_id: Name
    parents: list[Name] = Field(default_factory=list)
    llm: Name | None = None
    tool: Name | None = None
    role: Name | None = None
    start_s: float = Field(ge=0)
    end_s: float = Field(ge=0)
    input_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    output_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    prefix_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    error: Name | None = None

    @model_validator(mode="after")
    def _check(self) -> _Record:
        if (self.llm is None) == (self.tool is None):
            raise ValueError("exactly one of 'llm' and 'tool'")
        return self


@dataclass(frozen=True)
class Trace:
    """Validated calls grouped by request, in file order; requests sorted by first start."""

    calls: tuple[CallRecord, ...]
    requests: Mapping[tuple[str, str], tuple[CallRecord, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        groups: dict[tuple[str, str], list[CallRecord]] = {}
        for c in self.calls:
            groups.setdefault((c.workflow, c.request_id), []).append(c)
        order = sorted(groups, key=lambda k: (min(c.start_s for c in groups[k]), k))
        object.__setattr__(self, "requests", {k: tuple(groups[k]) for k in order})

    def workflows(self) -> list[str]:
        return sorted({c.workflow for c in self.calls})

    def llms(self, workflow: str | None = None) -> list[str]:
        return sorted({c.llm for c in self.calls if c.llm is not None
                       and (workflow is None or c.workflow == workflow)})

    def of(self, workflow: str) -> Trace:
        return Trace(tuple(c for c in self.calls if c.workflow == workflow))

    @cached_property
    def failed(self) -> int:
        """How many calls failed (``error`` set)."""
        return sum(c.failed for c in self.calls)

    def succeeded(self) -> Trace:
        """The trace without its failed calls; a call whose parent failed takes that parent's
        own parents instead (transitively), so every dependency that did complete is kept.
        Worked out once per trace (the statistics ask for it once per workflow)."""
        return self._succeeded

    @cached_property
    def _succeeded(self) -> Trace:
        if not self.failed:
            return self
        by_id = {(c.workflow, c.request_id, c.call_id): c for c in self.calls}
        resolved: dict[tuple[str, str, str], tuple[str, ...]] = {}  # a failed call's stand-ins

        def stand_ins(key: tuple[str, str, str]) -> tuple[str, ...]:
            """The completed calls a failed call stands for, found without recursion (a long
            chain of failures) and once per failed call (many paths through them)."""
            stack, gray = [(key, False)], set()  # gray: on the current path
            while stack:
                node, finished = stack.pop()
                if finished:
                    gray.discard(node)
                    resolved[node] = _expand(node, by_id[node].parents)
                    continue
                if node in resolved or node in gray:  # done, or a cycle among failed calls
                    continue
                gray.add(node)
                stack.append((node, True))
                stack.extend((k, False) for p in by_id[node].parents
                             if (k := (node[0], node[1], p)) in by_id and by_id[k].failed)
            return resolved[key]

        def _expand(owner: tuple[str, str, str], parents: tuple[str, ...]) -> tuple[str, ...]:
            out: list[str] = []
            for p in parents:
                k = (owner[0], owner[1], p)
                out.extend(resolved.get(k, ()) if k in by_id and by_id[k].failed else (p,))
            return tuple(dict.fromkeys(out))

        kept = []
        for c in self.calls:
            if c.failed:
                continue
            key = (c.workflow, c.request_id, c.call_id)
            for p in c.parents:
                k = (c.workflow, c.request_id, p)
                if k in by_id and by_id[k].failed:
                    stand_ins(k)
            parents = _expand(key, c.parents)
            kept.append(c if parents == c.parents else replace(c, parents=parents))
        return Trace(tuple(kept))


def validate_calls(calls: Sequence[CallRecord], source: str = "trace",
                   lines: Sequence[int] | None = None) -> Trace:
    """Check call ids, parents and times per request; return the :class:`Trace`."""
    where = (lambda i: f"line {lines[i]}") if lines else (lambda i: f"record {i + 1}")
    seen: dict[tuple[str, str], dict[str, int]] = {}
    for i, c in enumerate(calls):
        if c.end_s + _EPS < c.start_s:
            raise InputError(source, f"{where(i)}: end_s", f"a time >= start_s ({c.start_s})", c.end_s)
        ids = seen.setdefault((c.workflow, c.request_id), {})
        if c.call_id in ids:
            raise InputError(source, f"{where(i)}: call_id",
                             f"an id unique within request {c.request_id!r}", c.call_id)
        ids[c.call_id] = i
    for i, c in enumerate(calls):
        ids = seen[(c.workflow, c.request_id)]
        for p in c.parents:
            if p not in ids:
                raise InputError(source, f"{where(i)}: parents",
                                 f"ids of calls in request {c.request_id!r} (dangling parent)", p)
            parent = calls[ids[p]]
            if parent.end_s > c.start_s + _EPS:
                raise InputError(source, f"{where(i)}: parents",
                                 f"parents that end before the call starts ({p!r} ends at "
                                 f"{parent.end_s:g}, after {c.start_s:g})", p)
    return Trace(tuple(calls))


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a JSONL trace; every error names the line and the field."""
    p = Path(path)
    calls: list[CallRecord] = []
    lines: list[int] = []
    for lineno, raw in read_jsonl_objects(p, "trace file (.jsonl)", "call"):
        rec = validated(_Record, raw, str(p), f"line {lineno}: ")
        calls.append(CallRecord(
            workflow=rec.workflow, request_id=rec.request_id, call_id=rec.call_id,
            start_s=rec.start_s, end_s=rec.end_s, llm=rec.llm, tool=rec.tool, role=rec.role,
            parents=tuple(rec.parents), input_tokens=rec.input_tokens,
            output_tokens=rec.output_tokens, prefix_tokens=rec.prefix_tokens, error=rec.error,
        ))
        lines.append(lineno)
    if not calls:
        raise InputError(str(p), "", "at least one call record")
    return validate_calls(calls, str(p), lines)


def write_trace(path: str | os.PathLike[str], calls: Iterable[CallRecord]) -> None:
    """Write calls as JSON lines (deterministic, atomic)."""
    atomic_write_text(path, "".join(c.to_json() + "\n" for c in calls))


def _order(c: CallRecord) -> tuple[float, float, str]:
    return (c.start_s, c.end_s, c.call_id)


class CompletedCalls:
    """The completed (not failed) calls of one request in order of their end, with the latest
    start so far: what :func:`infer_parents` needs to find a call's parents in O(log n), for a
    whole request at once or, in a proxy, for each call as it completes (:meth:`add` then)."""

    def __init__(self, calls: Iterable[CallRecord] = ()) -> None:
        self.calls = sorted((c for c in calls if not c.failed), key=_end_order)
        self._refresh()

    def _refresh(self) -> None:
        self.ends = [c.end_s for c in self.calls]
        self.latest = list(accumulate((c.start_s for c in self.calls), max))
        self.by_id = {c.call_id: c for c in self.calls}

    def add(self, call: CallRecord) -> None:
        """Take a call that has completed (a failed one is never a parent: ignored)."""
        if call.failed:
            return
        if self.calls and _end_order(call) < _end_order(self.calls[-1]):
            insort(self.calls, call, key=_end_order)
            self._refresh()
            return
        self.calls.append(call)
        self.ends.append(call.end_s)
        self.latest.append(max(call.start_s, self.latest[-1]) if self.latest else call.start_s)
        self.by_id[call.call_id] = call

    def parents_of(self, c: CallRecord) -> tuple[str, ...]:
        """The parents of ``c`` among these calls (the rule of :func:`infer_parents`)."""
        k = bisect_right(self.ends, c.start_s + _EPS)
        if k and self.latest[k - 1] >= c.start_s - _EPS:
            # a call ending at c's start may sort after c: keep only calls ordered before it
            before = [d for d in self.calls[:k] if _order(d) < _order(c)]
        else:
            before = self.calls[:k]
        if not before:
            return ()
        last = self.latest[k - 1] if len(before) == k else max(d.start_s for d in before)
        first = bisect_left([d.end_s for d in before], last - _EPS) if len(before) != k \
            else bisect_left(self.ends, last - _EPS, 0, k)
        return tuple(d.call_id for d in before[first:]
                     if d.end_s > last + _EPS or d.start_s >= last - _EPS)


def _end_order(c: CallRecord) -> tuple[float, str]:
    return (c.end_s, c.call_id)


def infer_parents(calls: Sequence[CallRecord]) -> tuple[CallRecord, ...]:
    """``calls`` with ``parents`` set from their timing, request by request, for traces whose
    source records when calls ran but not what each waited for (a proxy, telemetry spans).

    Of the calls of its request that completed before a call started (``end_s <= start_s``;
    failed calls never count), its parents are the ones that started last and the ones still
    running when they started (``end_s`` after that latest start): the calls whose results it
    can have waited for, without those they already waited for. A chain stays a chain, a
    fan-out shares its parents and a fan-in has every branch as a parent; a call that ended
    exactly when a later one started is that later call's parent, not its successors'. Ties are broken by ``(start_s, end_s, call_id)``, so the result
    has no cycle; parents are listed in order of their end. O(n log n) per request unless many
    calls start at one instant.
    """
    groups: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(calls):
        groups.setdefault((c.workflow, c.request_id), []).append(i)
    result = list(calls)
    for idx in groups.values():
        done = CompletedCalls(calls[i] for i in idx)
        for i in idx:
            parents = done.parents_of(calls[i])
            if parents != calls[i].parents:
                result[i] = replace(calls[i], parents=parents)
    return tuple(result)


CLIENT_TOOL = "client"
"""The tool name of the time a workflow spends between an LLM call's parents and the call."""
CLIENT_MIN_GAP_S = 0.005
"""Shorter gaps than this are not written as client time (an event loop's own latency)."""


def with_client_time(calls: Sequence[CallRecord], tool: str = CLIENT_TOOL,
                     min_gap_s: float = CLIENT_MIN_GAP_S) -> tuple[CallRecord, ...]:
    """``calls`` plus one ``tool`` call for each gap of at least ``min_gap_s`` between a call's
    parents and the call: the time the workflow's own code took (tools nobody recorded, the
    framework, the network), which a source that sees only LLM calls would otherwise lose from
    the critical path. The gap's record runs from the last parent's end to the call's start,
    takes the call's parents, and becomes the call's only parent; its id is the call's id plus
    ``.client``. Failed calls, calls without parents and failed parents are left alone.
    """
    by_id = {(c.workflow, c.request_id, c.call_id): c for c in calls}
    out: list[CallRecord] = []
    for c in calls:
        ends = [by_id[(c.workflow, c.request_id, p)].end_s for p in c.parents
                if (c.workflow, c.request_id, p) in by_id]
        gap_s = c.start_s - max(ends) if ends else 0.0
        if c.failed or gap_s <= 0 or gap_s < min_gap_s - _EPS:
            out.append(c)
            continue
        cid = f"{c.call_id}.client"
        while (c.workflow, c.request_id, cid) in by_id:
            cid += "_"
        gap = CallRecord(c.workflow, c.request_id, cid, max(ends), c.start_s, tool=tool,
                         parents=c.parents)
        by_id[(c.workflow, c.request_id, cid)] = gap
        out.extend((gap, replace(c, parents=(cid,))))
    return tuple(out)


def request_span_s(calls: Sequence[CallRecord]) -> float:
    """End-to-end latency of one request: last end minus first start."""
    return max(c.end_s for c in calls) - min(c.start_s for c in calls)


