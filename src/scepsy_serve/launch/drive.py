"""The workflow driver: run workflow requests against OpenAI-compatible endpoints and measure them
(docs/drive.md).

Each request is one run of its workflow's program, drawn from the same generator the synthetic
traces come from (:func:`scepsy_opt.workflows.generate_trace`; workflow ``i`` with seed
``seed + i``, as ``scepsy trace generate``): its calls, their parents, their token counts and
its tools' durations. The driver executes that call graph for real:

* a call starts when all its parents have ended; LLM calls go to one of the LLM's endpoints in
  the routing table (:class:`~scepsy_serve.launch.routes.Routes`), chosen by weight when the
  plan is drawn (an LLM routed by prompt length: among the endpoints whose ``tokens`` range
  holds the call's input tokens); the body is a token-id prompt of the call's input length (the first
  ``prefix_tokens`` ids are the same for every call of the same workflow and LLM, so a prefix
  cache sees the sharing the trace describes) and ``max_tokens = min_tokens = output tokens``
  with ``ignore_eos`` (:func:`scepsy_profile.profiling.replay.completion_body`: servers run with
  ``--skip-tokenizer-init``); tool calls sleep for their drawn duration;
* requests arrive as a Poisson process of total rate ``rate`` (the first at time 0), each of
  workflow ``w`` with probability ``weight_w / Σ weight`` (so workflow ``w`` sees a Poisson
  process of rate ``rate · p_w``); at most ``max_in_flight`` requests run at once and a request
  that arrives when all slots are taken waits for one, first come first served;
* every LLM call has the per-call limits of :class:`~scepsy_profile.profiling.replay.
  ReplayTimeouts` (connect, stall between bytes, which also bounds the wait for the first
  token, and the whole call) and the run may have a ``deadline_s``;
* the first failed call fails its request: calls of that request still in flight are cancelled
  and calls not yet sent are skipped. Every failure is counted by kind, never raised.

Latency is measured from the request's *scheduled* arrival to the end of its last call, so time
spent waiting for a slot counts (an open-loop measurement: a saturated server shows up as
latency, not as a slower arrival rate). Throughput of a workflow is its completed requests over
the window from its first arrival to its last completion.

The executed calls of the completed requests come back as :class:`~scepsy_opt.traces.
CallRecord` values with measured start and end times (seconds from the run's start), the tokens
sent and received, and the generated parents: a trace ``scepsy stats`` and the predictor read.
"""

from __future__ import annotations

import asyncio
import math
import time
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

import httpx
import numpy as np
from numpy.typing import NDArray
from scipy import stats as _scipy_stats

from scepsy_common.errors import InputError
from scepsy_opt.ingest.record import HEADER_REQUEST, HEADER_WORKFLOW
from scepsy_opt.stats import in_range
from scepsy_opt.traces import CallRecord, Trace, validate_calls, write_trace
from scepsy_opt.workflows import MAX_REQUESTS, WorkflowSpec, generate_trace
from scepsy_opt.workload import as_specs
from scepsy_profile.profiling.replay import (
    FAILURE_KINDS,
    CallResult,
    CallSpec,
    ReplayTimeouts,
    async_client,
    poisson_arrivals,
    replay_call,
    stepped_poisson_arrivals,
)
from scepsy_serve.launch.routes import Endpoint, Routes

__all__ = [
    "DRIVE_FAILURE_KINDS", "DrivePlan", "DriveProgress", "DriveResult", "LLMResult", "LatencySummary",
    "PlannedRequest", "RequestOutcome", "WorkflowResult", "choose_endpoints", "drive",
    "drive_async", "plan_drive", "summarize_latency", "write_drive_trace",
]

DRIVE_FAILURE_KINDS: tuple[str, ...] = (*FAILURE_KINDS, "deadline", "error", "interrupted")
"""Why a request failed: the kind of its first failed call
(:data:`~scepsy_profile.profiling.replay.FAILURE_KINDS`), ``deadline`` (the run's deadline
ended it while it ran), ``error`` (an unexpected exception in the client, with its text in
the detail) or ``interrupted`` (the drive was cancelled, e.g. by Ctrl-C, while it ran)."""

VOCAB = 1000
"""Prompt token ids are drawn from ``[FIRST_TOKEN, VOCAB)`` (every model here has more)."""
FIRST_TOKEN = 3
BATCHES = 10
"""Batches of the batch-means confidence interval (used from ``2 · BATCHES`` values on)."""

_SRC = "drive"


# ============================================================================ the plan


@dataclass(frozen=True)
class PlannedRequest:
    """One request to send: its workflow, its generated calls (parents before children; a tool
    call's duration is the time it sleeps) and, per call, the endpoint of an LLM call (None for
    a tool call)."""

    index: int
    workflow: str
    request_id: str
    arrival_s: float
    calls: tuple[CallRecord, ...]
    endpoints: tuple[Endpoint | None, ...]


@dataclass(frozen=True)
class DrivePlan:
    """What a drive sends, drawn from a seed (:func:`plan_drive`); the same arguments give an
    equal plan."""

    requests: tuple[PlannedRequest, ...]
    rate: float
    seed: int
    mix: Mapping[str, float]
    """Probability that an arrival is of each workflow."""
    max_fan_out: int
    """The most LLM calls of one request that the generated timeline runs at once."""
    prefixes: Mapping[tuple[str, str], NDArray[np.int64]] = field(compare=False, repr=False)
    """(workflow, llm) -> the token ids every call's prefix is cut from."""
    vocab: int = VOCAB
    """Prompt token ids are drawn from ``[FIRST_TOKEN, vocab)``."""


def choose_endpoints(endpoints: Sequence[Endpoint], n: int,
                     rng: np.random.Generator) -> NDArray[np.int64]:
    """``n`` endpoint indices drawn in proportion to the endpoints' weights."""
    w = np.array([e.weight for e in endpoints], dtype=float)
    if len(w) == 1:
        return np.zeros(n, dtype=np.int64)
    return rng.choice(len(w), size=n, p=w / w.sum()).astype(np.int64)


def _by_length(endpoints: Sequence[Endpoint], input_tokens: int,
               rng: np.random.Generator) -> Endpoint:
    """A call of an LLM routed by prompt length: one of the endpoints whose range holds its
    prompt (the token ids sent, :func:`scepsy_opt.stats.in_range`), drawn by weight (all of
    them when those have no weight)."""
    mine = [e for e in endpoints if e.weight > 0
            and (e.tokens is None or in_range(input_tokens, e.tokens))]
    mine = mine or [e for e in endpoints if e.weight > 0]
    return mine[int(choose_endpoints(mine, 1, rng)[0])] if mine else endpoints[0]


def _check(ok: bool, name: str, expected: str, got: object) -> None:
    if not ok:
        raise InputError(_SRC, name, expected, got)


def _is_int(v: object) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _max_fan_out(calls: Sequence[CallRecord]) -> int:
    """The most LLM calls that overlap in the generated timeline (a sweep over start/end)."""
    events = sorted([(c.start_s, 1) for c in calls if c.is_llm]
                    + [(c.end_s, -1) for c in calls if c.is_llm])
    most = cur = 0
    for _, d in events:
        cur += d
        most = max(most, cur)
    return max(most, 1)


def plan_drive(workflows: Sequence[WorkflowSpec], routes: Routes, *, rate: float,
               requests: int, seed: int = 0, mix: Mapping[str, float] | None = None,
               vocab: int = VOCAB, rate_steps: Sequence[tuple[float, float]] = ()
               ) -> DrivePlan:
    """Draw the requests of a drive: ``requests`` arrivals in all at total ``rate`` req/s.

    ``mix`` gives each workflow's relative rate (default: each spec's ``weight``, 1 unless it
    came from a workload file). One generator seeded with ``seed`` draws the arrival gaps, then
    each arrival's workflow, then every LLM call's endpoint (request by request); workflow ``i``
    's calls are ``generate_trace(spec, n_i, seed + i)``. Every workflow's LLMs must have a
    route (an :class:`InputError` before anything is sent). Prompt token ids are drawn from
    ``[3, vocab)``: lower ``vocab`` for a test model with a smaller vocabulary. ``rate_steps``:
    ``(at_s, rate)`` pairs, ``at_s`` increasing from > 0: the total rate becomes ``rate`` at
    ``at_s`` (a load that steps up or down mid-run,
    :func:`~scepsy_profile.profiling.replay.stepped_poisson_arrivals`).
    """
    specs = as_specs(workflows)  # one or more specs with unique names
    names = [s.name for s in specs]
    _check(_is_number(rate) and rate > 0, "rate", "a number of requests/s > 0", rate)
    _check(_is_int(requests) and 1 <= requests <= MAX_REQUESTS, "requests",
           f"an integer in [1, {MAX_REQUESTS}]", requests)
    _check(_is_int(seed) and seed >= 0, "seed", "an integer >= 0", seed)
    _check(_is_int(vocab) and vocab > FIRST_TOKEN, "vocab", f"an integer > {FIRST_TOKEN}", vocab)
    last = 0.0
    for k, step in enumerate(rate_steps):
        ok = (isinstance(step, tuple) and len(step) == 2 and _is_number(step[0])
              and math.isfinite(step[0]) and step[0] > last)
        _check(ok, f"rate_steps[{k}].at_s", f"a time in s > {last:g} (steps in time order)",
               step)
        _check(_is_number(step[1]) and step[1] > 0, f"rate_steps[{k}].rate",
               "a number of requests/s > 0", step[1])
        last = float(step[0])
    if mix is None:
        weights = {s.name: float(s.weight) for s in specs}
    else:
        unknown = sorted(set(mix) - set(names))
        _check(not unknown, "mix", f"weights of the workflows given ({', '.join(names)})",
               unknown or None)
        weights = {n: mix.get(n, 0.0) for n in names}
        for wf, wt in weights.items():
            _check(_is_number(wt) and wt >= 0, f"mix.{wf}", "a weight >= 0", wt)
        _check(sum(weights.values()) > 0, "mix", "weights with a positive sum", dict(mix))
    for s in specs:  # every LLM routed (Routes.endpoints raises the InputError)
        for llm in s.llms:
            routes.endpoints(s.name, llm)
    total = sum(weights.values())
    p = np.array([weights[n] / total for n in names])
    rng = np.random.default_rng(seed)
    arrivals = (stepped_poisson_arrivals(float(rate), rate_steps, requests, rng) if rate_steps
                else poisson_arrivals(float(rate), requests, rng))
    which = rng.choice(len(specs), size=requests, p=p)
    counts = np.bincount(which, minlength=len(specs))
    by_workflow: list[dict[str, list[CallRecord]]] = []
    for i, spec in enumerate(specs):
        groups: dict[str, list[CallRecord]] = {}
        if counts[i]:
            for c in generate_trace(spec, int(counts[i]), seed + i):
                groups.setdefault(c.request_id, []).append(c)
        by_workflow.append(groups)
    taken = [0] * len(specs)
    planned: list[PlannedRequest] = []
    longest: dict[tuple[str, str], int] = {}
    fan_out = 1
    for k in range(requests):
        i = int(which[k])
        spec = specs[i]
        rid = f"r{taken[i]}"
        taken[i] += 1
        calls = tuple(by_workflow[i][rid])
        endpoints: list[Endpoint | None] = [None] * len(calls)
        for llm in sorted({c.llm for c in calls if c.llm is not None}):
            eps = routes.endpoints(spec.name, llm)
            idx = [j for j, c in enumerate(calls) if c.llm == llm]
            if any(e.tokens is not None for e in eps):  # routed by prompt length
                for j in idx:
                    endpoints[j] = _by_length(eps, calls[j].input_tokens, rng)
                continue
            for j, e in zip(idx, choose_endpoints(eps, len(idx), rng), strict=True):
                endpoints[j] = eps[int(e)]
        for c in calls:
            if c.llm is not None:
                key = (spec.name, c.llm)
                longest[key] = max(longest.get(key, 0), c.prefix_tokens)
        fan_out = max(fan_out, _max_fan_out(calls))
        planned.append(PlannedRequest(k, spec.name, rid, float(arrivals[k]), calls,
                                      tuple(endpoints)))
    prefixes: dict[tuple[str, str], NDArray[np.int64]] = {}
    for (w, llm), n in sorted(longest.items()):
        ids = np.random.default_rng([seed, zlib.crc32(f"{w}\0{llm}".encode())]).integers(
            FIRST_TOKEN, vocab, n)
        ids.setflags(write=False)
        prefixes[(w, llm)] = ids
    return DrivePlan(tuple(planned), float(rate), int(seed),
                     MappingProxyType(dict(zip(names, p.tolist(), strict=True))), fan_out,
                     MappingProxyType(prefixes), int(vocab))


def _prompt(plan: DrivePlan, req: PlannedRequest, j: int) -> tuple[int, ...]:
    """Call ``j``'s prompt: the shared prefix of its (workflow, llm), then ids drawn from a
    generator seeded with (seed, request index, call index)."""
    c = req.calls[j]
    assert c.llm is not None
    pre = plan.prefixes[(req.workflow, c.llm)][:c.prefix_tokens]
    rest = np.random.default_rng([plan.seed, req.index, j]).integers(
        FIRST_TOKEN, plan.vocab, c.input_tokens - len(pre))
    return tuple(np.concatenate([pre, rest]).tolist())


# ============================================================================ results


@dataclass(frozen=True)
class LatencySummary:
    """Mean, spread and percentiles of a set of latencies (seconds); None where undefined.

    ``std_s`` is the sample standard deviation (ddof 1). ``ci95_s`` is the half-width of a 95%
    confidence interval of the mean: batch means over :data:`BATCHES` consecutive batches (in
    arrival order; neighbouring requests share queues, so they are not independent) from
    ``2 · BATCHES`` values on, Student's t over the values themselves below that.
    """

    n: int
    mean_s: float | None = None
    std_s: float | None = None
    ci95_s: float | None = None
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize_latency(values: Sequence[float] | NDArray[np.float64]) -> LatencySummary:
    """:class:`LatencySummary` of ``values`` taken in the order given (arrival order)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return LatencySummary(0)
    p50, p90, p99 = (float(v) for v in np.percentile(x, [50, 90, 99]))
    mean = float(x.mean())
    if n < 2:
        return LatencySummary(n, mean, None, None, p50, p90, p99)
    std = float(x.std(ddof=1))
    if n >= 2 * BATCHES:
        means = np.array([b.mean() for b in np.array_split(x, BATCHES)])
        half = float(_scipy_stats.t.ppf(0.975, BATCHES - 1) * means.std(ddof=1)
                     / math.sqrt(BATCHES))
    else:
        half = float(_scipy_stats.t.ppf(0.975, n - 1) * std / math.sqrt(n))
    return LatencySummary(n, mean, std, half, p50, p90, p99)


@dataclass(frozen=True)
class RequestOutcome:
    """What happened to one planned request. Times are seconds from the run's start;
    ``admitted_s`` is None for a request that was never sent (the deadline came first)."""

    index: int
    workflow: str
    request_id: str
    arrival_s: float
    admitted_s: float | None = None
    end_s: float | None = None
    failure: str | None = None
    detail: str = ""
    calls_sent: int = 0
    calls_ok: int = 0
    calls_failed: int = 0
    calls_cancelled: int = 0
    """Calls in flight when another call of the request failed (or the deadline came)."""
    calls_skipped: int = 0
    """Calls never sent because the request had failed."""

    @property
    def sent(self) -> bool:
        return self.admitted_s is not None

    @property
    def ok(self) -> bool:
        return self.sent and self.failure is None

    @property
    def latency_s(self) -> float | None:
        """From the scheduled arrival to the end of the last call (completed requests)."""
        return self.end_s - self.arrival_s if self.ok and self.end_s is not None else None


@dataclass(frozen=True)
class WorkflowResult:
    """One workflow's requests: counts, throughput over its window, latency."""

    workflow: str
    sent: int
    completed: int
    failed: int
    failures: Mapping[str, int]
    window_s: float
    """From the workflow's first arrival to its last completion (0 without completions)."""
    throughput_rps: float
    """``completed / window_s`` (0 without completions)."""
    latency: LatencySummary
    wait_mean_s: float | None
    """Mean wait of a sent request for an in-flight slot (part of its latency)."""
    offered_rps: float | None = None
    """The rate its requests were sent at (:func:`offered_rates`; None below two arrivals)."""

    def to_dict(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "sent": self.sent, "completed": self.completed,
                "failed": self.failed, "failures": dict(self.failures),
                "window_s": self.window_s, "throughput_rps": self.throughput_rps,
                "latency": self.latency.to_dict(), "wait_mean_s": self.wait_mean_s,
                "offered_rps": self.offered_rps}


@dataclass(frozen=True)
class LLMResult:
    """One LLM's calls over every workflow: sent, ok, failed (by kind), and the latency (send
    to last token) and time to first token of the calls that succeeded."""

    llm: str
    calls: int
    ok: int
    failed: int
    failures: Mapping[str, int]
    latency: LatencySummary
    ttft_mean_s: float | None
    input_tokens: int
    """Tokens sent by the calls that succeeded."""
    output_tokens: int
    """Tokens received by the calls that succeeded."""

    def to_dict(self) -> dict[str, Any]:
        return {"llm": self.llm, "calls": self.calls, "ok": self.ok, "failed": self.failed,
                "failures": dict(self.failures), "latency": self.latency.to_dict(),
                "ttft_mean_s": self.ttft_mean_s, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens}


@dataclass(frozen=True)
class DriveResult:
    """Everything a drive measured. ``completed + failed == sent`` and ``sent + not_sent ==
    planned``; ``failures`` counts failed requests by kind, ``call_failures`` failed calls.
    ``calls`` is the measured trace (every call of every completed request)."""

    planned: int
    sent: int
    completed: int
    failed: int
    not_sent: int
    failures: Mapping[str, int]
    call_failures: Mapping[str, int]
    wall_s: float
    """From the run's start to the end of its last request (or its deadline)."""
    window_s: float
    throughput_rps: float
    workflows: Mapping[str, WorkflowResult]
    llms: Mapping[str, LLMResult]
    calls: tuple[CallRecord, ...] = field(repr=False)
    requests: tuple[RequestOutcome, ...] = field(repr=False)
    deadline_hit: bool = False
    interrupted: bool = False
    """The drive was cancelled (Ctrl-C, SIGTERM): what it measured until then (requests in
    flight failed as ``interrupted``, the rest not sent)."""

    def __post_init__(self) -> None:
        if self.completed + self.failed != self.sent:
            raise AssertionError(f"completed {self.completed} + failed {self.failed} != sent "
                                 f"{self.sent}")
        if self.sent + self.not_sent != self.planned:
            raise AssertionError(f"sent {self.sent} + not sent {self.not_sent} != planned "
                                 f"{self.planned}")
        if sum(self.failures.values()) != self.failed:
            raise AssertionError(f"failures by kind {dict(self.failures)} != failed "
                                 f"{self.failed}")

    def trace(self) -> Trace:
        """The measured trace, validated (parents end before their children start)."""
        return validate_calls(self.calls, "measured trace")

    def to_dict(self) -> dict[str, Any]:
        """Everything but the calls and the per-request outcomes, as JSON-ready values."""
        return {"planned": self.planned, "sent": self.sent, "completed": self.completed,
                "failed": self.failed, "not_sent": self.not_sent,
                "failures": dict(self.failures), "call_failures": dict(self.call_failures),
                "wall_s": self.wall_s, "window_s": self.window_s,
                "throughput_rps": self.throughput_rps, "deadline_hit": self.deadline_hit,
                "interrupted": self.interrupted,
                "workflows": {w: r.to_dict() for w, r in self.workflows.items()},
                "llms": {m: r.to_dict() for m, r in self.llms.items()},
                "trace_calls": len(self.calls)}


def write_drive_trace(path: str, result: DriveResult) -> int:
    """Validate the measured trace and write it as JSON lines (atomically); the number of calls
    written. A run without a completed request has no trace: an :class:`InputError`."""
    if not result.calls:
        raise InputError(_SRC, "trace", "at least one completed request to write a trace of",
                         f"{result.completed} completed")
    write_trace(path, result.trace().calls)
    return len(result.calls)


# ============================================================================ the run


@dataclass
class DriveProgress:
    """A running drive's counts, for another thread to read (a progress line), and its
    :class:`DriveResult` once it ends: also when it is cancelled (``result.interrupted``), so
    that an interrupted run keeps what it measured."""

    planned: int = 0
    sent: int = 0
    completed: int = 0
    failed: int = 0
    started_at: float | None = None
    """``time.monotonic()`` when the first request was due."""
    result: DriveResult | None = None

    def line(self) -> str:
        """``sent 12/200, completed 10, failed 0, in flight 2``."""
        return (f"sent {self.sent}/{self.planned}, completed {self.completed}, failed "
                f"{self.failed}, in flight {self.sent - self.completed - self.failed}")


@dataclass(slots=True)
class _CallDone:
    """One call's outcome (``failure`` None: it succeeded)."""

    start_s: float
    end_s: float
    failure: str | None = None
    detail: str = ""
    result: CallResult | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


class _Run:
    def __init__(self, plan: DrivePlan, client: httpx.AsyncClient, timeouts: ReplayTimeouts,
                 max_in_flight: int, progress: DriveProgress | None = None) -> None:
        self.plan, self.client, self.timeouts = plan, client, timeouts
        self.progress = progress if progress is not None else DriveProgress()
        self.progress.planned = len(plan.requests)
        self.progress.started_at = time.monotonic()
        self.stop_kind, self.stop_why = "deadline", "the run's deadline came while the request ran"
        self.slots = asyncio.Semaphore(max_in_flight)
        self.t0 = time.perf_counter()
        self.outcomes: dict[int, RequestOutcome] = {}
        self.done: dict[int, list[_CallDone | None]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def dispatch(self) -> None:
        for req in self.plan.requests:
            delay = req.arrival_s - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.slots.acquire()
            task = asyncio.create_task(self.request(req, self.now()))
            self.progress.sent += 1
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def request(self, req: PlannedRequest, admitted: float) -> None:
        started: list[float | None] = [None] * len(req.calls)
        done: list[_CallDone | None] = [None] * len(req.calls)
        index = {c.call_id: j for j, c in enumerate(req.calls)}
        tasks: list[asyncio.Task[_CallDone | None]] = []
        first: _CallDone | None = None
        try:
            for j, c in enumerate(req.calls):
                parents = [tasks[index[p]] for p in c.parents]
                tasks.append(asyncio.create_task(self.call(req, j, parents, started, done)))
            pending: set[asyncio.Task[_CallDone | None]] = set(tasks)
            while pending and first is None:
                finished, pending = await asyncio.wait(pending,
                                                       return_when=asyncio.FIRST_COMPLETED)
                for t in sorted(finished, key=tasks.index):
                    d = t.result()
                    if d is not None and not d.ok and first is None:
                        first = d
            self.finish(req, admitted, started, done, first, None)
        except asyncio.CancelledError:
            self.finish(req, admitted, started, done, None, self.stop_kind, self.stop_why)
            raise
        except Exception as exc:  # a driver bug fails the request, never the run
            self.finish(req, admitted, started, done, None, "error",
                        f"{type(exc).__name__}: {exc}")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.slots.release()

    def finish(self, req: PlannedRequest, admitted: float, started: list[float | None],
               done: list[_CallDone | None], first: _CallDone | None,
               stop: str | None, why: str = "") -> None:
        """Record the request's outcome from its calls' state at this moment (``stop``: the
        failure kind when no call failed but the request was stopped)."""
        ok = sum(1 for d in done if d is not None and d.ok)
        failed = sum(1 for d in done if d is not None and not d.ok)
        sent = sum(1 for s in started if s is not None)
        failure, detail = (first.failure, first.detail) if first is not None else (stop, why)
        self.done[req.index] = list(done)
        if failure is None:
            self.progress.completed += 1
        else:
            self.progress.failed += 1
        self.outcomes[req.index] = RequestOutcome(
            req.index, req.workflow, req.request_id, req.arrival_s, admitted, self.now(),
            failure, detail, calls_sent=sent, calls_ok=ok, calls_failed=failed,
            calls_cancelled=sent - ok - failed, calls_skipped=len(req.calls) - sent)

    async def call(self, req: PlannedRequest, j: int,
                   parents: list[asyncio.Task[_CallDone | None]],
                   started: list[float | None], done: list[_CallDone | None]
                   ) -> _CallDone | None:
        """Run call ``j`` once its parents have ended; None (skipped) when one did not
        succeed."""
        if parents:
            await asyncio.wait(parents)
            if any(p.cancelled() or p.exception() is not None or p.result() is None
                   or not p.result().ok for p in parents):  # type: ignore[union-attr]
                return None
        c = req.calls[j]
        start = started[j] = self.now()
        where = f"tool {c.tool}" if c.llm is None else f"LLM {c.llm}"
        try:
            if c.llm is None:
                await asyncio.sleep(max(0.0, c.end_s - c.start_s))
                d = _CallDone(start, self.now())
            else:
                endpoint = req.endpoints[j]
                assert endpoint is not None
                url = endpoint.url.rstrip("/") + "/completions"
                where = f"LLM {c.llm} at {url}"
                spec = CallSpec(j, 0.0, _prompt(self.plan, req, j), c.output_tokens)
                res = await replay_call(self.client, url, spec, endpoint.model, self.timeouts,
                                        start, call_headers(req))
                d = _CallDone(start, self.now(), res.failure,
                              f"{where}: {res.detail}" if res.failure else res.detail, res)
        except Exception as exc:  # a client bug fails the call, never the run
            d = _CallDone(start, self.now(), "error", f"{where}: {type(exc).__name__}: {exc}")
        done[j] = d
        return d


def call_headers(req: PlannedRequest) -> dict[str, str]:
    """The headers every LLM call of ``req`` carries: its workflow and its request
    (``WORKFLOW/rN``), as a gateway or ``scepsy record`` reads them (docs/record.md)."""
    return {HEADER_WORKFLOW: req.workflow, HEADER_REQUEST: f"{req.workflow}/{req.request_id}"}


def _counts(kinds: Sequence[str]) -> dict[str, int]:
    return dict(sorted(Counter(kinds).items()))


def _window(outcomes: Sequence[RequestOutcome]) -> tuple[float, float]:
    """(window, throughput) of sent requests: first arrival to last completion."""
    ends = [o.end_s for o in outcomes if o.ok and o.end_s is not None]
    if not ends:
        return 0.0, 0.0
    window = max(ends) - min(o.arrival_s for o in outcomes if o.sent)
    return window, (len(ends) / window if window > 0 else 0.0)


def offered_rates(arrivals: Sequence[tuple[str, float]]) -> dict[str, float]:
    """The rate each workflow's requests were sent at, from ``(workflow, arrival_s)`` of every
    sent request: the merged process's ``(N − 1) / span`` (unbiased for Poisson arrivals, span
    from the first arrival to the last) split by each workflow's share of the ``N`` arrivals;
    empty below two arrivals or a span of 0."""
    n = len(arrivals)
    times = [t for _, t in arrivals]
    span = max(times) - min(times) if n else 0.0
    if n < 2 or span <= 0:
        return {}
    counts: dict[str, int] = {}
    for w, _ in arrivals:
        counts[w] = counts.get(w, 0) + 1
    return {w: k / n * (n - 1) / span for w, k in sorted(counts.items())}


def _result(plan: DrivePlan, run: _Run, wall: float, deadline_hit: bool,
            interrupted: bool = False) -> DriveResult:
    outcomes = [run.outcomes.get(r.index) or RequestOutcome(r.index, r.workflow, r.request_id,
                                                            r.arrival_s)
                for r in plan.requests]
    sent = [o for o in outcomes if o.sent]
    failed = [o for o in sent if not o.ok]
    offered = offered_rates([(o.workflow, o.arrival_s) for o in sent])
    workflows: dict[str, WorkflowResult] = {}
    for w in plan.mix:
        mine = [o for o in sent if o.workflow == w]
        window, tput = _window(mine)
        waits = [o.admitted_s - o.arrival_s for o in mine if o.admitted_s is not None]
        workflows[w] = WorkflowResult(
            w, len(mine), sum(1 for o in mine if o.ok), sum(1 for o in mine if not o.ok),
            MappingProxyType(_counts([str(o.failure) for o in mine if not o.ok])), window, tput,
            summarize_latency([o.latency_s for o in mine if o.latency_s is not None]),
            float(np.mean(waits)) if waits else None, offered.get(w))
    calls: list[CallRecord] = []
    per_llm: dict[str, list[tuple[CallRecord, _CallDone]]] = {}
    for req in plan.requests:
        o = outcomes[req.index]
        done = run.done.get(req.index, [])
        for c, d in zip(req.calls, done, strict=False):
            if d is not None and c.llm is not None:
                per_llm.setdefault(c.llm, []).append((c, d))
        if not o.ok:
            continue
        for c, d in zip(req.calls, done, strict=True):
            assert d is not None and d.ok
            out = d.result.tokens if d.result is not None else 0
            calls.append(CallRecord(
                workflow=c.workflow, request_id=c.request_id, call_id=c.call_id,
                start_s=d.start_s, end_s=d.end_s, llm=c.llm, tool=c.tool, role=c.role,
                parents=c.parents, input_tokens=c.input_tokens if c.llm else 0,
                output_tokens=out if c.llm else 0, prefix_tokens=c.prefix_tokens))
    llms: dict[str, LLMResult] = {}
    call_failures: list[str] = []
    for m, items in sorted(per_llm.items()):
        good = [(c, d) for c, d in items if d.ok]
        bad = [str(d.failure) for _, d in items if not d.ok]
        call_failures += bad
        ttfts = [d.result.ttft_s for _, d in good
                 if d.result is not None and d.result.ttft_s is not None]
        llms[m] = LLMResult(
            m, len(items), len(good), len(bad), MappingProxyType(_counts(bad)),
            summarize_latency([d.end_s - d.start_s for _, d in sorted(
                good, key=lambda cd: cd[1].start_s)]),
            float(np.mean(ttfts)) if ttfts else None,
            sum(c.input_tokens for c, _ in good),
            sum(d.result.tokens for _, d in good if d.result is not None))
    window, tput = _window(sent)
    return DriveResult(
        planned=len(outcomes), sent=len(sent), completed=len(sent) - len(failed),
        failed=len(failed), not_sent=len(outcomes) - len(sent),
        failures=MappingProxyType(_counts([str(o.failure) for o in failed])),
        call_failures=MappingProxyType(_counts(call_failures)), wall_s=wall, window_s=window,
        throughput_rps=tput, workflows=MappingProxyType(workflows),
        llms=MappingProxyType(llms), calls=tuple(calls), requests=tuple(outcomes),
        deadline_hit=deadline_hit, interrupted=interrupted)


async def drive_async(workflows: Sequence[WorkflowSpec] | DrivePlan, routes: Routes | None = None,
                      *, rate: float | None = None, requests: int | None = None, seed: int = 0,
                      mix: Mapping[str, float] | None = None, max_in_flight: int = 64,
                      timeouts: ReplayTimeouts | None = None,
                      deadline_s: float | None = None, vocab: int = VOCAB,
                      progress: DriveProgress | None = None) -> DriveResult:
    """Run a drive (:func:`plan_drive` with these arguments, or a plan given instead of the
    workflows) and return what it measured. Failed calls and requests are counted, never
    raised; bad arguments raise :class:`InputError` before anything is sent. One
    :class:`httpx.AsyncClient` serves every call, with a pool of ``max_in_flight`` × the plan's
    largest fan-out connections. Cancelling it cancels every call in flight; ``progress``
    (:class:`DriveProgress`) then holds what was measured until then, as it holds the result
    of a drive that ends."""
    if isinstance(workflows, DrivePlan):
        given = {"routes": routes, "rate": rate, "requests": requests, "mix": mix}
        extra = sorted(k for k, v in given.items() if v is not None)
        _check(not extra, "plan", "a plan alone (it holds the routes, rate, requests and mix)",
               extra or None)
        plan = workflows
    else:
        _check(routes is not None, "routes", "a routing table", None)
        _check(rate is not None, "rate", "a number of requests/s > 0", None)
        _check(requests is not None, "requests", "an integer >= 1", None)
        assert routes is not None and rate is not None and requests is not None
        plan = plan_drive(workflows, routes, rate=rate, requests=requests, seed=seed, mix=mix,
                          vocab=vocab)
    _check(_is_int(max_in_flight) and max_in_flight >= 1, "max_in_flight", "an integer >= 1",
           max_in_flight)
    _check(deadline_s is None or (_is_number(deadline_s) and deadline_s > 0), "deadline_s",
           "a number of seconds > 0", deadline_s)
    timeouts = timeouts or ReplayTimeouts()
    deadline_hit = False
    async with async_client(timeouts, max_in_flight * plan.max_fan_out) as client:
        run = _Run(plan, client, timeouts, max_in_flight, progress)
        interrupted = False
        try:
            async with asyncio.timeout(deadline_s):
                await run.dispatch()
                while run.tasks:
                    await asyncio.wait(set(run.tasks))
        except TimeoutError:
            deadline_hit = True
        except asyncio.CancelledError:
            interrupted = True
            run.stop_kind, run.stop_why = "interrupted", "the drive was interrupted while it ran"
            raise
        finally:
            for t in list(run.tasks):
                t.cancel()
            await asyncio.gather(*run.tasks, return_exceptions=True)
            result = run.progress.result = _result(plan, run, run.now(), deadline_hit,
                                                   interrupted)
    return result


def drive(workflows: Sequence[WorkflowSpec] | DrivePlan, routes: Routes | None = None,
          **options: Any) -> DriveResult:
    """:func:`drive_async` from synchronous code (its own event loop)."""
    return asyncio.run(drive_async(workflows, routes, **options))
