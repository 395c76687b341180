"""Per-workflow aggregate statistics of a trace: the input of the Aggregate LLM Pipeline.

For a workflow ``w`` with requests ``r = 1..R`` and, per request, LLM calls ``C_{r,m}`` of LLM
``m`` (durations ``d_c = end_c - start_c``), the statistics are (docs/stats.md):

* ``n_m = (1/R) Σ_r |C_{r,m}|``: mean calls per request (a request without ``m`` counts 0).
* ``p_m = Σ_r Σ_{c∈C_{r,m}} d_c / Σ_r |∪_{c∈C_{r,m}} [start_c, end_c]|``: mean concurrency of
  ``m``'s calls inside a request (busy time over the measure of the union of its intervals); 1
  when that union has measure 0. ``1 <= p_m <= max concurrent calls of m``.
* ``rounds_m = n_m / p_m``: mean number of sequential "rounds" of ``m`` per request (the factor
  ``n_m / p_m`` of the paper's ``L_w = Σ_m L_m · n_m / p_m``).
* critical path of a request: start from the call (LLM or tool) that ends last, repeatedly step to
  the parent that ends last, until a call without parents; ties on an end time go to the
  lexicographically smallest ``call_id``. ``critical_calls_m`` is the mean number of ``m``'s
  calls on it and ``tool_critical_s`` the mean summed duration of the tool calls on it, so the
  refined predictor reads ``L_w ≈ Σ_m critical_calls_m · L_m + tool_critical_s``.
* ``time_share_m = Σ_r D_{r,m} / Σ_r Σ_k D_{r,k}`` with ``D_{r,m} = Σ_{c∈C_{r,m}} d_c`` (busy
  time as recorded, concurrent calls counted each).
* ``time_share_cv_requests``: CV of ``s_{r,m} = D_{r,m} / Σ_k D_{r,k}`` across requests (requests
  without LLM busy time left out); ``time_share_cv_halves``: CV of ``time_share_m`` recomputed on
  ``bootstrap`` random half-samples of the requests (``max(1, ⌊R/2⌋)`` requests drawn without
  replacement, ``numpy.random.default_rng(seed)``).
* ``llm_overlap = mean_r |{t: ≥ 2 different LLMs busy}| / |{t: ≥ 1 LLM busy}|``: the concurrency
  across different LLMs that the paper's serial-stage form ignores (limitation 1).
* ``paths`` (:class:`RequestPaths`): per request (``request_id`` order), each LLM's time on its
  critical path in units of that LLM's mean call, ``W_rm = Σ_{c on the path, LLM m} d_c /
  mean_call_s_m`` (the count of its calls there when ``mean_call_s_m`` is 0), and the tool time on
  it. Their means over the requests are the predictor's critical-path weights
  ``critical_s / mean_call_s`` and ``tool_critical_s``; their spread gives the tail latency
  (:mod:`scepsy_opt.prediction.tails`).

Calls that failed (``error`` set: an upstream error, a client that went away) are left out of
every statistic; a call that waited on a failed call waits on that call's own parents instead
(:meth:`Trace.succeeded`), and ``failed_calls`` counts them.

CV is the population coefficient of variation ``std / mean`` (``ddof = 0``), 0 when there are
fewer than two values or the mean is 0. Everything is invariant to the order of the records
(calls are taken in ``call_id`` order, requests in ``request_id`` order) and, up to rounding, to
shifting all times of a request by a constant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from scepsy_common.errors import InputError
from scepsy_opt.traces import CallRecord, Trace, request_span_s


@dataclass(frozen=True)
class CallClass:
    """One LLM's calls in one role within one workflow (``role`` None when the trace gives none).

    ``n`` is the mean number of such calls per request; token statistics are over these calls
    (population std).
    """

    llm: str
    role: str | None
    n: float
    input_mean: float
    input_std: float
    output_mean: float
    output_std: float
    prefix_mean: float


@dataclass(frozen=True)
class LLMStats:
    """One LLM within one workflow (definitions in the module docstring)."""

    llm: str
    n: float
    p: float
    rounds: float
    critical_calls: float
    critical_s: float  # mean time of its calls on the critical path, per request
    input_mean: float
    input_std: float
    output_mean: float
    output_std: float
    classes: tuple[CallClass, ...]
    time_share: float
    time_share_cv_requests: float
    time_share_cv_halves: float
    mean_call_s: float
    longest_tokens: float = 0.0  # its longest call, prompt + output tokens (0: unknown)


@dataclass(frozen=True, eq=False)
class RequestPaths:
    """Per request (rows in ``request_id`` order), each LLM's time on the critical path in units
    of its mean call (``weights``, R x M, columns in ``llms`` order) and the tool time on it
    (``tool_s``, R). Compares by value; the arrays are read-only."""

    llms: tuple[str, ...]
    weights: np.ndarray
    tool_s: np.ndarray

    def __post_init__(self) -> None:
        t = np.array(self.tool_s, dtype=float).reshape(-1)
        w = np.array(self.weights, dtype=float).reshape(t.shape[0], len(self.llms))
        if w.shape[0] != t.shape[0]:
            raise ValueError(f"RequestPaths: {w.shape[0]} weight rows but {t.shape[0]} tool times")
        w.setflags(write=False)
        t.setflags(write=False)
        object.__setattr__(self, "llms", tuple(self.llms))
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "tool_s", t)

    @property
    def requests(self) -> int:
        """Number of requests (rows)."""
        return int(self.tool_s.shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestPaths):
            return NotImplemented
        return (self.llms == other.llms and np.array_equal(self.weights, other.weights)
                and np.array_equal(self.tool_s, other.tool_s))

    __hash__ = None  # type: ignore[assignment]


NO_PATHS = RequestPaths((), np.zeros((0, 0)), np.zeros(0))


def mean_paths(llms: Mapping[str, LLMStats], tool_critical_s: float) -> RequestPaths:
    """One request with the mean critical path of ``llms`` (for statistics without per-request
    data: every percentile is then the mean)."""
    names = tuple(sorted(llms))
    row = [llms[m].critical_s / llms[m].mean_call_s if llms[m].mean_call_s > 0
           else llms[m].critical_calls for m in names]
    return RequestPaths(names, np.array([row], dtype=float).reshape(1, len(names)),
                        np.array([tool_critical_s]))


@dataclass(frozen=True)
class WorkflowStats:
    """Aggregate statistics of one workflow's requests; ``llms`` sorted by name."""

    workflow: str
    requests: int
    llms: Mapping[str, LLMStats]
    latency_mean_s: float
    latency_p50_s: float
    latency_p90_s: float
    latency_p99_s: float
    latency_cv: float
    calls_per_request_cv: float
    tool_time_mean_s: float
    tool_critical_s: float
    llm_overlap: float
    # per-request critical paths (tails); left out: one request with the mean path (mean_paths)
    paths: RequestPaths = field(default_factory=lambda: NO_PATHS)
    failed_calls: int = 0  # calls of the workflow that failed: left out of every statistic
    # the workflow's calls these statistics were computed from (those that did not fail), in
    # arrays (:class:`CallTable`): length routing recomputes an LLM's statistics per range of
    # input lengths from them (:func:`length_split`); None for statistics built without a trace
    call_table: CallTable | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "llms", MappingProxyType(dict(sorted(self.llms.items()))))
        if self.paths.requests == 0:
            object.__setattr__(self, "paths", mean_paths(self.llms, self.tool_critical_s))

    @property
    def calls(self) -> tuple[CallRecord, ...]:
        """The calls these statistics were computed from (empty without a trace)."""
        return () if self.call_table is None else self.call_table.records()


@dataclass(frozen=True, eq=False)
class CallTable:
    """One workflow's calls in arrays, a fraction of the memory of their records: every name
    (request and call ids, LLMs, tools, roles) once in ``names``, each call's fields as
    indices into it (-1: none) or numbers, and its parents as a run of ``parents``
    (``offsets[i]:offsets[i+1]``). :meth:`records` gives the records back, equal to those
    stored."""

    workflow: str
    names: np.ndarray  # every name once (a fixed-width string array)
    ids: np.ndarray  # (N, 5) int32: request id, call id, llm, tool, role
    times: np.ndarray  # (N, 2) float64: start, end
    tokens: np.ndarray  # (N, 3) int64: input, output, prefix
    parents: np.ndarray  # int32, names of the parents of every call, call after call
    offsets: np.ndarray  # (N + 1) int64

    @classmethod
    def of(cls, workflow: str, calls: Sequence[CallRecord]) -> CallTable:
        index: dict[str, int] = {}

        def at(x: str | None) -> int:
            return -1 if x is None else index.setdefault(x, len(index))

        ids = [(at(c.request_id), at(c.call_id), at(c.llm), at(c.tool), at(c.role))
               for c in calls]
        parents = [at(p) for c in calls for p in c.parents]
        offsets = np.cumsum([0, *(len(c.parents) for c in calls)])
        return cls(workflow, np.array(list(index), dtype=str), np.array(ids, dtype=np.int32).reshape(-1, 5),
                   np.array([(c.start_s, c.end_s) for c in calls], dtype=float).reshape(-1, 2),
                   np.array([(c.input_tokens, c.output_tokens, c.prefix_tokens) for c in calls],
                            dtype=np.int64).reshape(-1, 3),
                   np.array(parents, dtype=np.int32), offsets.astype(np.int64))

    def records(self) -> tuple[CallRecord, ...]:
        names, par, off = self.names.tolist(), self.parents.tolist(), self.offsets.tolist()

        def name(i: int) -> str | None:
            return None if i < 0 else names[i]

        out = []
        for k, ((r, c, m, t, role), (a, b), (i, o, p)) in enumerate(zip(
                self.ids.tolist(), self.times.tolist(), self.tokens.tolist(), strict=True)):
            out.append(CallRecord(self.workflow, names[r], names[c], a, b, llm=name(m),
                                  tool=name(t), role=name(role),
                                  parents=tuple(names[x] for x in par[off[k]:off[k + 1]]),
                                  input_tokens=i, output_tokens=o, prefix_tokens=p))
        return tuple(out)

    def input_tokens(self, llm: str) -> np.ndarray:
        """The input tokens of ``llm``'s calls."""
        at = np.flatnonzero(self.names == llm)
        if at.size == 0:
            return np.zeros(0, dtype=np.int64)
        return self.tokens[self.ids[:, 2] == at[0], 0]


# --------------------------------------------------------------------------- helpers
def _cv(values: Sequence[float] | np.ndarray) -> float:
    """Population coefficient of variation ``std / mean``; 0 for < 2 values or mean 0."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return 0.0
    mean = float(x.mean())
    if mean == 0.0:
        return 0.0
    return float(x.std() / mean)


def critical_path(calls: Sequence[CallRecord]) -> tuple[CallRecord, ...]:
    """The critical path of one request, last call first.

    Start from the call that ends last and repeatedly step to the parent that ends last, until a
    call without parents; ties on the end time go to the lexicographically smallest ``call_id``
    (so the path does not depend on the order of the records). A parent that is not a call of the
    request is an :class:`InputError`; a revisited call (possible only with zero-length calls in
    an unvalidated trace) ends the walk.
    """
    if not calls:
        return ()
    by_id = {c.call_id: c for c in calls}

    def key(c: CallRecord) -> tuple[float, str]:
        return (-c.end_s, c.call_id)

    cur = min(calls, key=key)
    path = [cur]
    seen = {cur.call_id}
    while cur.parents:
        missing = [p for p in cur.parents if p not in by_id]
        if missing:
            raise InputError("trace", f"request {cur.request_id!r}: call {cur.call_id!r} parents",
                             "ids of calls in the same request (dangling parent)", missing[0])
        cur = min((by_id[p] for p in cur.parents), key=key)
        if cur.call_id in seen:
            break
        seen.add(cur.call_id)
        path.append(cur)
    return tuple(path)


@dataclass(frozen=True)
class _Request:
    """Per-request quantities, one entry per LLM of the workflow (in ``llms`` order)."""

    span_s: float
    llm_calls: int
    count: np.ndarray  # calls of each LLM
    busy: np.ndarray  # Σ durations of each LLM's calls
    union: np.ndarray  # measure of the union of each LLM's call intervals
    critical: np.ndarray  # calls of each LLM on the critical path
    critical_busy: np.ndarray  # Σ durations of each LLM's calls on the critical path
    tool_s: float
    tool_critical_s: float
    llm_busy_s: float  # |{t: ≥ 1 LLM busy}|
    llm_overlap_s: float  # |{t: ≥ 2 different LLMs busy}|


def _request(calls: Sequence[CallRecord], llms: Sequence[str]) -> _Request:
    index: dict[str | None, int] = {m: i for i, m in enumerate(llms)}  # looked up with c.llm
    k = len(llms)
    llm_calls = [c for c in calls if c.llm is not None]
    count = np.zeros(k)
    busy = np.zeros(k)
    for c in llm_calls:
        count[index[c.llm]] += 1
        busy[index[c.llm]] += c.duration_s
    # elementary segments between consecutive distinct start/end times of the LLM calls
    union = np.zeros(k)
    llm_busy = overlap = 0.0
    if llm_calls:
        starts = np.array([c.start_s for c in llm_calls])
        ends = np.array([c.end_s for c in llm_calls])
        owner = np.array([index[c.llm] for c in llm_calls])
        times = np.unique(np.concatenate([starts, ends]))
        seg = np.diff(times)
        diff = np.zeros((k, times.size))
        np.add.at(diff, (owner, np.searchsorted(times, starts)), 1.0)
        np.add.at(diff, (owner, np.searchsorted(times, ends)), -1.0)
        active = np.cumsum(diff, axis=1)[:, :-1] > 0.5  # LLM m busy in segment j
        union = (active * seg).sum(axis=1)
        n_active = active.sum(axis=0)
        llm_busy = float(seg[n_active >= 1].sum())
        overlap = float(seg[n_active >= 2].sum())
    path = critical_path(calls)
    critical = np.zeros(k)
    critical_busy = np.zeros(k)
    for c in path:
        if c.llm is not None:
            critical[index[c.llm]] += 1
            critical_busy[index[c.llm]] += c.duration_s
    return _Request(
        span_s=request_span_s(calls),
        llm_calls=len(llm_calls),
        count=count, busy=busy, union=union, critical=critical, critical_busy=critical_busy,
        tool_s=float(sum(c.duration_s for c in calls if c.llm is None)),
        tool_critical_s=float(sum(c.duration_s for c in path if c.llm is None)),
        llm_busy_s=llm_busy, llm_overlap_s=overlap,
    )


def _shares(busy: np.ndarray) -> np.ndarray:
    """Rows of busy times -> rows of shares; rows with no busy time -> uniform shares."""
    busy = np.atleast_2d(busy)
    total = busy.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(total > 0, busy / np.where(total > 0, total, 1.0), 1.0 / busy.shape[1])
    return out


def _classes(calls: Sequence[CallRecord], llm: str, requests: int) -> tuple[CallClass, ...]:
    groups: dict[str | None, list[CallRecord]] = {}
    for c in calls:
        if c.llm == llm:
            groups.setdefault(c.role, []).append(c)
    out = []
    for role in sorted(groups, key=lambda r: (r is not None, r or "")):
        g = groups[role]
        inp = np.array([c.input_tokens for c in g], dtype=float)
        outp = np.array([c.output_tokens for c in g], dtype=float)
        out.append(CallClass(
            llm=llm, role=role, n=len(g) / requests,
            input_mean=float(inp.mean()), input_std=float(inp.std()),
            output_mean=float(outp.mean()), output_std=float(outp.std()),
            prefix_mean=float(np.mean([c.prefix_tokens for c in g])),
        ))
    return tuple(out)


# --------------------------------------------------------------------------- public API
def workflow_stats(trace: Trace, workflow: str, *, seed: int = 0,
                   bootstrap: int = 200, source: str = "trace") -> WorkflowStats:
    """Aggregate statistics of one workflow of ``trace`` (definitions in the module docstring).

    ``bootstrap`` half-samples of the requests (drawn with ``numpy.random.default_rng(seed)``)
    give ``time_share_cv_halves``; the result is deterministic for a given seed and independent of
    the other workflows in the trace. Errors name ``source`` (the trace's file, if any).
    """
    if not isinstance(bootstrap, int) or bootstrap < 0:
        raise InputError("workflow_stats", "bootstrap", "an integer >= 0", bootstrap)
    if not any(c.workflow == workflow for c in trace.calls):
        raise InputError(source, "workflow",
                         f"one of {', '.join(trace.workflows()) or '(no workflows)'}", workflow)
    failed = sum(c.failed for c in trace.calls if c.workflow == workflow)
    trace = trace.succeeded()
    keys = sorted(k for k in trace.requests if k[0] == workflow)
    if not keys:
        raise InputError(source, "workflow", f"calls of workflow {workflow!r} that did not fail "
                         f"(all {failed} failed: their servers answered with errors; record "
                         "again once they serve, or leave this workflow out)", workflow)
    reqs = [tuple(sorted(trace.requests[k], key=lambda c: c.call_id)) for k in keys]
    llms = sorted({c.llm for calls in reqs for c in calls if c.llm is not None})
    per = [_request(calls, llms) for calls in reqs]
    R, K = len(per), len(llms)

    count = np.array([q.count for q in per]).reshape(R, K)
    busy = np.array([q.busy for q in per]).reshape(R, K)
    union = np.array([q.union for q in per]).reshape(R, K)
    critical = np.array([q.critical for q in per]).reshape(R, K)
    critical_busy = np.array([q.critical_busy for q in per]).reshape(R, K)

    n = count.sum(axis=0) / R
    busy_total = busy.sum(axis=0)
    union_total = union.sum(axis=0)
    p = np.where(union_total > 0, busy_total / np.where(union_total > 0, union_total, 1.0), 1.0)
    p = np.maximum(p, 1.0)  # Σ d >= |∪|; clip rounding
    share = _shares(busy.sum(axis=0))[0] if K else np.zeros(0)

    has_busy = busy.sum(axis=1) > 0
    req_shares = _shares(busy[has_busy]) if K and has_busy.any() else np.zeros((0, K))
    if K and bootstrap and R:
        rng = np.random.default_rng(seed)
        h = max(1, R // 2)
        halves = np.argsort(rng.random((bootstrap, R)), axis=1)[:, :h]
        half_busy = busy[halves].sum(axis=1)  # (bootstrap, K)
        half_shares = _shares(half_busy[half_busy.sum(axis=1) > 0])
    else:
        half_shares = np.zeros((0, K))

    llm_stats: dict[str, LLMStats] = {}
    for j, m in enumerate(llms):
        mine = [c for calls in reqs for c in calls if c.llm == m]
        inp = np.array([c.input_tokens for c in mine], dtype=float)
        outp = np.array([c.output_tokens for c in mine], dtype=float)
        llm_stats[m] = LLMStats(
            llm=m, n=float(n[j]), p=float(p[j]), rounds=float(n[j] / p[j]),
            critical_calls=float(critical[:, j].sum() / R),
            critical_s=float(critical_busy[:, j].sum() / R),
            input_mean=float(inp.mean()), input_std=float(inp.std()),
            output_mean=float(outp.mean()), output_std=float(outp.std()),
            classes=_classes([c for calls in reqs for c in calls], m, R),
            time_share=float(share[j]),
            time_share_cv_requests=_cv(req_shares[:, j]),
            time_share_cv_halves=_cv(half_shares[:, j]),
            mean_call_s=float(busy_total[j] / count[:, j].sum()),
            longest_tokens=float(max(max(c.input_tokens, 1) + max(c.output_tokens, 1)
                                     for c in mine)),
        )

    mean_call = np.array([llm_stats[m].mean_call_s for m in llms])
    with np.errstate(invalid="ignore", divide="ignore"):
        weights = np.where(mean_call[None, :] > 0,
                           critical_busy / np.where(mean_call > 0, mean_call, 1.0)[None, :],
                           critical)
    paths = RequestPaths(tuple(llms), weights.reshape(R, K),
                         np.array([q.tool_critical_s for q in per]))
    spans = np.array([q.span_s for q in per])
    overlaps = [q.llm_overlap_s / q.llm_busy_s for q in per if q.llm_busy_s > 0]
    return WorkflowStats(
        workflow=workflow, requests=R, llms=llm_stats,
        latency_mean_s=float(spans.mean()),
        latency_p50_s=float(np.percentile(spans, 50)),
        latency_p90_s=float(np.percentile(spans, 90)),
        latency_p99_s=float(np.percentile(spans, 99)),
        latency_cv=_cv(spans),
        calls_per_request_cv=_cv([q.llm_calls for q in per]),
        tool_time_mean_s=float(np.mean([q.tool_s for q in per])),
        tool_critical_s=float(np.mean([q.tool_critical_s for q in per])),
        llm_overlap=float(np.mean(overlaps)) if overlaps else 0.0,
        paths=paths, failed_calls=failed,
        call_table=CallTable.of(workflow, [c for calls in reqs for c in calls]),
    )


def trace_stats(trace: Trace, seed: int = 0, *, bootstrap: int = 200,
                source: str = "trace") -> dict[str, WorkflowStats]:
    """:func:`workflow_stats` of every workflow in ``trace`` (sorted by name, same seed each);
    errors name ``source`` (the trace's file, if any)."""
    return {w: workflow_stats(trace, w, seed=seed, bootstrap=bootstrap, source=source)
            for w in trace.workflows()}


def _as_mapping(stats: WorkflowStats | Mapping[str, WorkflowStats]) -> Mapping[str, WorkflowStats]:
    return {stats.workflow: stats} if isinstance(stats, WorkflowStats) else stats


def stats_table(stats: WorkflowStats | Mapping[str, WorkflowStats]) -> list[dict]:
    """One row per (workflow, LLM) for the CLI table, workflows and LLMs sorted by name."""
    rows = []
    for w in sorted(_as_mapping(stats)):
        ws = _as_mapping(stats)[w]
        for m, s in ws.llms.items():
            rows.append({
                "workflow": w, "llm": m, "n": s.n, "p": s.p, "rounds": s.rounds,
                "critical_calls": s.critical_calls, "input_mean": s.input_mean,
                "output_mean": s.output_mean, "time_share": s.time_share,
                "share_cv_requests": s.time_share_cv_requests,
                "share_cv_halves": s.time_share_cv_halves,
            })
    return rows


def _workflow_dict(ws: WorkflowStats) -> dict:
    def llm(s: LLMStats) -> dict:
        d = {k: getattr(s, k) for k in LLMStats.__dataclass_fields__ if k != "classes"}
        d["classes"] = [{k: getattr(c, k) for k in CallClass.__dataclass_fields__}
                        for c in s.classes]
        return d

    d = {k: getattr(ws, k) for k in WorkflowStats.__dataclass_fields__
         if k not in ("llms", "paths", "call_table")}  # paths: per request, not part of the summary
    d["llms"] = {m: llm(s) for m, s in ws.llms.items()}
    return d


def stats_to_dict(stats: WorkflowStats | Mapping[str, WorkflowStats]) -> dict:
    """JSON-ready dict: one :class:`WorkflowStats` -> its fields; a mapping -> ``{workflow: ...}``."""
    if isinstance(stats, WorkflowStats):
        return _workflow_dict(stats)
    return {w: _workflow_dict(stats[w]) for w in sorted(stats)}


# --------------------------------------------------------------------------- splits
def _split_llm(s: LLMStats, name: str, f: float) -> LLMStats:
    """``s`` for the replica group that gets fraction ``f`` of its calls (at random): calls,
    rounds, critical-path calls and time, and time share times ``f``; per-call figures kept."""
    return replace(
        s, llm=name, n=s.n * f, rounds=s.rounds * f, critical_calls=s.critical_calls * f,
        critical_s=s.critical_s * f, time_share=s.time_share * f,
        classes=tuple(replace(c, llm=name, n=c.n * f) for c in s.classes))


Range = tuple[int, int | None]  # input tokens [lo, hi); hi None: no upper end


def length_key(input_tokens: int) -> int:
    """What a length-routed call is routed by: its prompt (input) tokens, at least 1."""
    return max(int(input_tokens), 1)


def in_range(input_tokens: int, rng: Range) -> bool:
    """Whether a call of ``input_tokens`` prompt tokens belongs to ``rng`` (``lo <= key < hi``,
    :func:`length_key`)."""
    k = length_key(input_tokens)
    return rng[0] <= k and (rng[1] is None or k < rng[1])


def length_edges(stats: Mapping[str, WorkflowStats], llm: str, buckets: int) -> tuple[int, ...]:
    """The edges of up to ``buckets`` length buckets of ``llm``'s calls over the workflows of
    ``stats``: bucket ``i`` is ``[edges[i-1], edges[i])`` (from 0, the last without an upper
    end). Edge ``k`` is the :func:`length_key` of the call at position ``⌈k·N/buckets⌉`` of the
    N calls sorted by it, so each bucket holds about ``1/buckets`` of the calls; equal edges
    merge, and every bucket holds at least one call. Empty without calls (statistics built
    without a trace)."""
    if not isinstance(buckets, int) or buckets < 1:
        raise InputError("length buckets", "buckets", "an integer >= 1", buckets)
    keys = sorted(length_key(int(x)) for st in stats.values() if st.call_table is not None
                  for x in st.call_table.input_tokens(llm))
    edges: list[int] = []
    for k in range(1, buckets):
        e = keys[-(-k * len(keys) // buckets)] if keys else 0
        if e > keys[0] and (not edges or e > edges[-1]):
            edges.append(e)
    return tuple(edges)


def check_ranges(ranges: Mapping[str, Range], source: str, where: str) -> list[tuple[str, Range]]:
    """``ranges`` (group -> input-token range) sorted by their lower ends, checked to cover
    every length exactly once: the first from 0, each from where the previous ends, the last
    without an upper end."""
    order = sorted(ranges.items(), key=lambda kv: kv[1][0])
    at: int | None = 0
    for g, (lo, hi) in order:
        if at is None or lo != at or (hi is not None and hi <= lo):
            raise InputError(source, f"{where}.{g}", f"an input-token range [lo, hi) starting "
                             f"at {at if at is not None else 'nothing (the previous range has no end)'}"
                             ", the ranges covering every length once", [lo, hi])
        at = hi
    if at is not None:
        raise InputError(source, where, "ranges whose last one has no upper end (null)", at)
    return order


def length_split(st: WorkflowStats, llm: str, ranges: Mapping[str, Range],
                 ) -> tuple[dict[str, LLMStats], dict[str, np.ndarray]]:
    """``llm``'s statistics in ``st`` per group of ``ranges`` (group -> input-token range):
    :func:`workflow_stats` of the workflow's calls with each of ``llm``'s calls renamed to the
    group whose range holds it (:func:`in_range`), so every figure (calls per request,
    concurrency, critical-path calls and time, token lengths, mean call time, longest call) is
    that of the group's own calls. Returns the groups' statistics (a group none of whose calls
    this workflow makes is left out) and their critical-path columns per request
    (:class:`RequestPaths`). ``time_share_cv_halves`` of a group is 0 (no bootstrap)."""
    if st.call_table is None:
        raise InputError("statistics", f"{st.workflow}.llms.{llm}", "statistics computed from "
                         "a trace (length routing recomputes them per range of input lengths)")
    order = check_ranges(ranges, "length routing", llm)
    calls = []
    for c in st.calls:
        if c.llm == llm:
            g = next(g for g, r in order if in_range(c.input_tokens, r))
            c = replace(c, llm=g)
        calls.append(c)
    ws = workflow_stats(Trace(tuple(calls)), st.workflow, bootstrap=0)
    idx = {m: i for i, m in enumerate(ws.paths.llms)}
    got = {g: ws.llms[g] for g, _ in order if g in ws.llms}
    return got, {g: ws.paths.weights[:, idx[g]] for g in got}


def split_stats(st: WorkflowStats, splits: Mapping[str, Mapping[str, float]],
                lengths: Mapping[str, Mapping[str, Range]] | None = None) -> WorkflowStats:
    """``st`` with every LLM of ``splits`` replaced by its replica groups, each seeing its
    fraction of the LLM's calls: the predictor's mean latency of the workflow is then
    ``Σ_g f_g·(the LLM's contribution at the group's rate)``, as :mod:`scepsy_opt.planning.mixing`
    prices it. Each request's critical path keeps its weight, shared by the groups.

    An LLM of ``lengths`` (group -> input-token range) is routed by length instead: each group
    gets the LLM's calls in its range, with the statistics of those calls
    (:func:`length_split`); the fractions of ``splits`` are then not used."""
    lengths = lengths or {}
    llms: dict[str, LLMStats] = {}
    by_length: dict[str, tuple[dict[str, LLMStats], dict[str, np.ndarray]]] = {
        m: length_split(st, m, lengths[m]) for m in lengths if m in st.llms}
    for m, s in st.llms.items():
        if m in by_length:
            llms.update(by_length[m][0])
            continue
        parts = splits.get(m)
        if not parts:
            llms[m] = s
            continue
        for name, f in parts.items():
            llms[name] = _split_llm(s, name, f)
    cols: dict[str, np.ndarray] = {}
    for i, m in enumerate(st.paths.llms):
        if m in by_length:
            cols.update(by_length[m][1])
            continue
        parts = splits.get(m)
        for name, f in (parts.items() if parts else [(m, 1.0)]):
            cols[name] = st.paths.weights[:, i] * f
    names = tuple(sorted(cols))
    weights = (np.stack([cols[n] for n in names], axis=1) if names
               else np.zeros((st.paths.requests, 0)))
    return replace(st, llms=llms, paths=RequestPaths(names, weights, st.paths.tool_s))
