"""A discrete-event simulator that replays workflow requests on an :class:`Allocation`.

The simulator is the check on the analytical predictions (the Aggregate LLM Pipeline): it serves
a stream of workflow requests, call by call, on the replicas an allocation deploys, with the step
times a :class:`~scepsy_profile.latency.LatencyModel` gives.

Workload
    Requests of each workflow arrive as a Poisson process (``rates``, req/s, seeded); each arrival
    replays one recorded request of its workflow, drawn uniformly (seeded). With ``rates=None``
    the trace drives the arrivals: every recorded request arrives once, at its recorded first start
    (shifted so that the trace starts at 0).

Call graph
    A call is ready when all its ``parents`` have finished (the recorded gap between a parent's end
    and the child's start, client-side time, is dropped). A call without parents is ready at
    ``arrival + (its recorded start − the request's first start)``. A tool call takes its recorded
    duration (tools have unlimited concurrency). An LLM call goes to one replica of its LLM:
    ``round_robin`` cycles through the replicas, ``least_loaded`` picks the replica with the
    fewest calls queued, running or on their way to it (lowest index on ties). Every LLM call
    passes its replica's front end first, which delays it by ``call_delay_s(latency)`` (the
    engine overheads' pure delay, :mod:`scepsy_profile.overheads`; 0 for a plain latency model):
    a delay, not a server, so calls that arrive apart do not queue behind each other's; calls
    that reach the replica at the same instant (a fan-out) take their delays in turn, as the
    predictor's ``front_delay_s`` has them; the replica is not busy meanwhile. A request
    completes when its last call does; its latency is completion minus arrival.

Replica (continuous batching, vLLM-style, prefill first)
    A replica keeps a FCFS queue and a running set of sequences. A call is admitted when the head
    of the queue fits: the running set is below ``policy.max_batch`` and the KV cache
    (:func:`~scepsy_profile.serving.memory_fit` ``.kv_tokens``) has room for it; admission stops
    at the first call that does not fit (no overtaking). At every iteration boundary the replica
    either prefills all calls it can admit now (at most ``max_prefill_tokens`` prompt tokens,
    default ``policy.max_num_batched_tokens``; a longer prompt goes alone) in one iteration of
    ``prefill_ms(k, mean input of the k)`` that stalls decoding (and produces each call's first
    token), or, with nothing to admit, runs one decode step of all running sequences,
    ``decode_ms(B, mean context)``. An idle replica starts once every call arriving at the same
    instant is queued, so calls sent together are prefilled together. A sequence of ``O``
    output tokens leaves after ``O − 1`` decode steps (``O = 1``, a reranker or PRM scoring
    call, leaves right after its prefill) and frees its KV cache. Token counts of 0 are read
    as 1.

KV cache (``policy.kv_management``)
    ``"paged"`` (vLLM's): ``kv_tokens // block_size`` blocks; a sequence holds
    ``ceil(tokens / block_size)`` blocks (tokens = prompt + generated so far), admission needs
    the blocks of ``prompt + 1`` tokens, each decode step adds a token to every running
    sequence. When the free blocks do not cover a step, the most recently admitted running
    sequence is preempted by recomputation: its blocks are freed, it goes back to the front of
    the queue, and when admitted again it is prefilled with its prompt plus the tokens it had
    generated and then generates the rest; repeated until the step fits. ``"reserve"``: a call
    reserves its whole ``input + output`` tokens at admission and is never preempted.

Changes (``changes=``)
    At each :class:`~scepsy_opt.prediction.schedule.AllocationChange` (sorted by time; one at
    the same instant as an event goes first) the serving allocation becomes the change's: per
    LLM, the same instance shape adds replicas (routed to from that instant) or drains the
    highest-index ones; a new shape adds its replicas and drains every old one. Routing
    (``round_robin`` and ``least_loaded``) sees only the replicas that are up and not draining;
    a draining replica finishes its queue, its running set and the calls on their way to it,
    and is down when its last call ends. Every change must keep every simulated LLM at one
    replica or more; split LLMs are not taken, nor new shapes for LLMs on a shared mesh or with
    a prefill limit. Changes after the run stopped are not applied.

Priority (``priority=``)
    ``"fcfs"``: each waiting queue in the order the calls reached the replica. ``"las"``
    (:mod:`scepsy_opt.prediction.priority`): ordered by (the LAS level of the call's request
    when the call became ready, from the tokens of the request's LLM calls finished by then;
    the time it became ready; the order it was routed in), as vLLM's priority scheduling does;
    a preempted call goes back to its place in that order. Admission takes the head of the
    ordered queue as above (no overtaking); a call that becomes the head during a decode jump
    cuts it short if it fits.

Speed
    Nothing is done per token or per sequence per step. A replica with a running set and nothing
    to admit jumps straight to its next completion: ``n`` steps (the fewest remaining output
    tokens) at the step time of the mean context in the middle of the jump (exact for step times
    linear in the context). With paged KV the jump also stops at the step whose blocks the free
    ones do not cover: a token-count bound first, and only when it fails the exact count, from
    the running sequences' token counts modulo the block size (``O(block size)``, not per
    sequence). A call that arrives during a jump and fits cuts the jump short at the end of the
    step in progress (at ``k`` times the jump's step time), as vLLM's scheduler would. Step times come from per-batch tables
    of the latency model over a log-spaced token grid (1% spacing, linear interpolation between
    grid points: exact for step times linear in the tokens), filled lazily with one vectorised
    query per batch size.

Statistics
    The first ``warmup_fraction`` (10%) of arrivals warm the system up: they are served but left
    out of the latency statistics. The measurement window runs from the arrival of the first
    measured request to the last arrival. Throughput counts completions inside the window;
    utilisation (fraction of the window each replica is busy prefilling or decoding, averaged over
    replicas) and mean batch sizes are also measured inside the window. The run stops
    ``drain_s`` after the last arrival (``None``: when every request has completed); requests not
    complete by then are reported as unfinished, so ``completed + unfinished = arrivals`` always.

Saturation
    :func:`saturation_rate` bisects on a scale of the workflows' rates for the largest load whose
    queue does not grow (see its docstring); :func:`saturation_search` also returns the probes.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import operator
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance, check_allocation
from scepsy_opt.prediction.priority import PRIORITY_POLICIES, PriorityPolicy, las_level
from scepsy_opt.prediction.schedule import AllocationChange, ReplicaSpan
from scepsy_opt.stats import in_range
from scepsy_opt.traces import CallRecord, Trace, validate_calls
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.latency import LatencyModel
from scepsy_profile.mps import OVERLOAD_PARTS, SM_PARTS, job_parts
from scepsy_profile.overheads import call_delay_s
from scepsy_profile.serving import MemoryPolicy, call_tokens, memory_fit

Routing = Literal["round_robin", "least_loaded"]
ROUTINGS = ("round_robin", "least_loaded")
DEFAULT_REQUESTS = 1000
MAX_REQUESTS = 1_000_000
"""The most requests one simulation may replay (by `requests`, or expected from `duration_s`)."""
_DEFAULT_POLICY = MemoryPolicy()

_GRID_STEP = 0.01  # log spacing of the step-time tables (1%)
_ARRIVAL, _START, _TOOL_END, _WAKE, _SUBMIT = 0, 1, 2, 3, 4
_IDLE, _PREFILL, _DECODE, _BOUNDARY, _GATED = 0, 1, 2, 3, 4  # _GATED: waits for a mesh's SMs
_las_key = operator.itemgetter(4, 5, 6)  # a call's (LAS level, ready time, routing order)


# --------------------------------------------------------------------------- results
@dataclass(frozen=True, slots=True)
class SimulatedWorkflow:
    """What one workflow's requests saw (latencies in seconds, after warm-up)."""

    arrivals: int
    completed: int  # of all arrivals, warm-up included
    unfinished: int  # arrivals not complete when the run stopped
    measured: int  # completed arrivals after the warm-up: the latency sample
    throughput: float  # completions inside the measurement window per second
    mean_latency_s: float
    p50_latency_s: float
    p90_latency_s: float
    p99_latency_s: float


@dataclass(frozen=True, slots=True)
class SimulatedLLM:
    """How one LLM's replicas were used (utilisation and batch sizes inside the window)."""

    replicas: int
    calls: int  # LLM calls completed over the whole run
    utilisation: float  # busy fraction of the window, averaged over replicas
    mean_batch: float  # sequences per decode step
    mean_prefill_batch: float  # calls per prefill iteration
    kv_tokens: int  # KV capacity of one replica
    max_batch: int  # policy.max_batch
    preemptions: int = 0  # sequences evicted (paged KV), over the whole run, warm-up included
    preemptions_per_call: float = 0.0  # preemptions / calls, both over the whole run


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One arrival: which recorded request it replayed, when it arrived and completed."""

    workflow: str
    request_id: str
    arrival_s: float
    end_s: float | None  # None: unfinished

    @property
    def latency_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class CallEvent:
    """One replayed call (``record_events=True``): ready, started (admitted to a prefill, or the
    tool began) and ended; ``None`` where the run stopped first."""

    arrival: int  # index into SimulationResult.requests
    call_id: str
    llm: str | None
    tool: str | None
    replica: int | None
    ready_s: float
    start_s: float | None
    end_s: float | None
    admitted_s: tuple[float, ...] = ()  # every admission to a prefill (re-admissions after
    #                                     a preemption too); the first is start_s
    preempted_s: tuple[float, ...] = ()  # when the call was preempted (paged KV)


@dataclass(frozen=True)
class SimulationResult:
    """Per-workflow and per-LLM statistics of one simulated run."""

    workflows: Mapping[str, SimulatedWorkflow]
    llms: Mapping[str, SimulatedLLM]
    requests: tuple[RequestOutcome, ...]  # every arrival, in arrival order
    window_s: tuple[float, float]  # the measurement window
    end_s: float  # simulated time when the run stopped
    llm_calls: int  # LLM calls completed
    events: int  # events processed: arrivals, call starts, tool ends, iteration ends
    call_log: tuple[CallEvent, ...] | None = None
    replica_spans: tuple[ReplicaSpan, ...] = ()  # every replica, in the order it came up
    wall_s: float = field(default=0.0, compare=False)

    @property
    def arrivals(self) -> int:
        return len(self.requests)

    @property
    def completed(self) -> int:
        return sum(w.completed for w in self.workflows.values())

    @property
    def unfinished(self) -> int:
        return sum(w.unfinished for w in self.workflows.values())

    @property
    def llm_calls_per_minute(self) -> float:
        """Simulation speed: LLM calls completed per minute of wall time."""
        return 60.0 * self.llm_calls / self.wall_s if self.wall_s > 0 else math.inf


@dataclass(frozen=True)
class SaturationResult:
    """The largest stable load: ``rates = scale · relative rates``."""

    scale: float
    rates: Mapping[str, float]
    total_rate: float  # req/s over all workflows
    probes: tuple[tuple[float, bool], ...]  # (scale, stable) of every simulated probe


# --------------------------------------------------------------------------- preparation
@dataclass(frozen=True, slots=True)
class _Template:
    """One recorded request, compiled for replay (call i = index into the tuples)."""

    workflow: str
    request_id: str
    llm: tuple[int, ...]  # index into the simulated LLMs, -1 for a tool call
    inp: tuple[int, ...]
    out: tuple[int, ...]
    dur: tuple[float, ...]
    children: tuple[tuple[int, ...], ...]
    n_parents: tuple[int, ...]
    roots: tuple[tuple[float, int], ...]  # (offset from the request's first start, call)
    ids: tuple[str, ...]
    tools: tuple[str | None, ...]


def _compile(calls: tuple[CallRecord, ...], llm_index: Mapping[str, int]) -> _Template:
    first = min(c.start_s for c in calls)
    pos = {c.call_id: i for i, c in enumerate(calls)}
    children: list[list[int]] = [[] for _ in calls]
    for i, c in enumerate(calls):
        for p in dict.fromkeys(c.parents):
            children[pos[p]].append(i)
    n_par = [len(dict.fromkeys(c.parents)) for c in calls]
    # every call must be reachable: a cycle would leave the request unfinished forever
    left, stack, seen = list(n_par), [i for i, n in enumerate(n_par) if n == 0], 0
    while stack:
        i = stack.pop()
        seen += 1
        for ch in children[i]:
            left[ch] -= 1
            if left[ch] == 0:
                stack.append(ch)
    if seen != len(calls):
        raise InputError("trace", f"request {calls[0].request_id!r}: parents",
                         "an acyclic call graph (the parents form a cycle)")
    roots = sorted((c.start_s - first, i) for i, c in enumerate(calls) if n_par[i] == 0)
    return _Template(
        workflow=calls[0].workflow, request_id=calls[0].request_id,
        llm=tuple(llm_index[c.llm] if c.llm is not None else -1 for c in calls),
        inp=tuple(max(c.input_tokens, 1) for c in calls),
        out=tuple(max(c.output_tokens, 1) for c in calls),
        dur=tuple(max(c.duration_s, 0.0) for c in calls),
        children=tuple(tuple(ch) for ch in children), n_parents=tuple(n_par),
        roots=tuple(roots), ids=tuple(c.call_id for c in calls),
        tools=tuple(c.tool for c in calls),
    )


class _StepTable:
    """Step times (ms) of one phase of one instance: per batch size, a table over a log grid."""

    __slots__ = ("_fn", "_grid", "_points", "_rows", "_what")

    def __init__(self, fn: Callable, max_tokens: float, what: str) -> None:
        n = math.ceil(math.log(max_tokens + 2.0) / _GRID_STEP) + 3
        self._fn = fn
        self._grid = np.exp(np.arange(n) * _GRID_STEP)
        self._points = self._grid.tolist()
        self._rows: dict[int, list[float]] = {}
        self._what = what

    def row(self, batch: int) -> list[float]:
        vals = np.asarray(self._fn(batch, self._grid), dtype=float)
        vals = np.broadcast_to(vals, self._grid.shape)
        if not np.all(np.isfinite(vals) & (vals > 0)):
            raise InputError("latency model", self._what,
                             f"finite step times > 0 ms (batch {batch})", float(vals.min()))
        row = vals.tolist()
        self._rows[batch] = row
        return row

    def __call__(self, batch: int, tokens: float) -> float:
        row = self._rows.get(batch) or self.row(batch)
        i = min(int(math.log(tokens) / _GRID_STEP), len(row) - 2)
        g = self._points
        a = row[i]
        return a + (tokens - g[i]) / (g[i + 1] - g[i]) * (row[i + 1] - a)


# --------------------------------------------------------------------------- the engine
@dataclass(frozen=True, slots=True)
class MeshJobs:
    """MuxServe's scheduling of the LLMs that share a mesh (its ``muxsched``): every prefill
    and every decode step is a job that holds SM parts while it runs. A mesh has ``parts``
    parts (tenths of its SMs) and may be overloaded by ``overload`` more (MuxServe's
    ``overload_threshold``); a job of an LLM whose MPS limit is ``s`` holds ``round(s·parts)``
    of them, and starts only when they are free. Prefills go first: while a prefill waits for
    its parts and none runs, no decode step starts on the mesh, so the steps in progress end
    and free theirs. An LLM runs one job at a time, a prefill at its prefill limit and a
    decode step at its decode limit (:class:`~scepsy_opt.allocation.Instance` ``prefill_share``
    and ``share``). ``meshes``: LLM -> the mesh it shares (one replica each); an LLM left out
    runs on its own GPUs."""

    meshes: Mapping[str, str]
    parts: int = SM_PARTS
    overload: int = OVERLOAD_PARTS

    def __post_init__(self) -> None:
        if not isinstance(self.meshes, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in self.meshes.items()):
            raise InputError("simulate", "mesh_jobs.meshes", "a mapping of LLM names to mesh "
                             "names", self.meshes)
        if not (isinstance(self.parts, int) and self.parts >= 1):
            raise InputError("simulate", "mesh_jobs.parts", "an integer >= 1", self.parts)
        if not (isinstance(self.overload, int) and self.overload >= 0):
            raise InputError("simulate", "mesh_jobs.overload", "an integer >= 0", self.overload)

    def job_parts(self, share: float) -> int:
        """The parts a job at MPS limit ``share`` holds (:func:`scepsy_profile.mps.job_parts`)."""
        return job_parts(share, self.parts)


class _Mesh:
    """The SM parts of one mesh (:class:`MeshJobs`): who holds how many, who waits."""

    __slots__ = ("cap", "decoding", "eng", "prefilling", "used", "wait_decode", "wait_prefill")

    def __init__(self, eng: _Engine, cap: int) -> None:
        self.eng, self.cap, self.used = eng, cap, 0
        self.prefilling = 0  # prefills running
        self.decoding: list[_Replica] = []  # replicas in a decode jump
        self.wait_prefill: list[_Replica] = []  # FIFO
        self.wait_decode: list[_Replica] = []

    def holds_decodes(self) -> bool:
        """A prefill waits for its parts and none runs: no decode step starts."""
        return bool(self.wait_prefill) and not self.prefilling

    def take_prefill(self, rep: _Replica, t: float) -> bool:
        """Start ``rep``'s prefill if its parts are free and no earlier prefill waits; else
        it waits (and the decode jumps in progress end at their next step if that holds
        decodes)."""
        w = self.wait_prefill
        if (not w or w[0] is rep) and self.used + rep.pre_parts <= self.cap:
            if w:
                w.pop(0)
            self.used += rep.pre_parts
            self.prefilling += 1
            rep.held = rep.pre_parts
            return True
        if rep not in w:
            w.append(rep)
        if self.holds_decodes():
            self.cut(t)
        return False

    def take_decode(self, rep: _Replica, t: float) -> bool:
        """Start ``rep``'s decode step(s) if no prefill holds the decodes, its parts are free
        and the first decode waiting before it could start beside it; else it waits, and the
        decode steps in progress end at their next step, so that decodes that do not fit
        together take turns step by step (MuxServe's round robin)."""
        w = self.wait_decode
        ahead = w[:w.index(rep)] if rep in w else w
        if (not self.holds_decodes() and self.used + rep.dec_parts <= self.cap
                and (not ahead or self.used + ahead[0].dec_parts + rep.dec_parts <= self.cap)):
            if rep in w:
                w.remove(rep)
            self.used += rep.dec_parts
            rep.held = rep.dec_parts
            self.decoding.append(rep)
            return True
        if rep not in w:
            w.append(rep)
        self.cut(t)
        return False

    def turns(self, rep: _Replica) -> bool:
        """A decode of another LLM waits that cannot start beside ``rep``'s (which holds its
        parts): ``rep`` runs one step and lets it go."""
        return any(w is not rep and self.used + w.dec_parts > self.cap for w in self.wait_decode)

    def release(self, rep: _Replica, t: float) -> None:
        """``rep``'s job ended: free its parts and wake the waiting replicas (prefills
        first) to try again at ``t``."""
        self.used -= rep.held
        rep.held = 0
        if rep.state == _PREFILL:
            self.prefilling -= 1
        else:
            self.decoding.remove(rep)
        if self.holds_decodes():
            self.cut(t)
        eng = self.eng
        for r in self.wait_prefill + self.wait_decode:
            if r is not rep and r.state == _GATED:
                r.state = _BOUNDARY
                r.version += 1
                eng.push(t, _WAKE, r, r.version)

    def cut(self, t: float) -> None:
        """End every decode jump in progress at its next step."""
        for r in self.decoding:
            k = int((t - r.jump_t0) / r.jump_tau) + 1 if r.jump_tau > 0 else r.jump_n
            if k < r.jump_n:
                r.jump_n = k
                r.version += 1
                self.eng.push(r.jump_t0 + k * r.jump_tau, _WAKE, r, r.version)


class _Replica:
    """One replica: FCFS queue, running heap, KV in tokens (reserve) or blocks (paged).

    ``kv_used`` is, with ``reserve``, the tokens reserved by the running and admitted calls; with
    ``paged``, the blocks of the calls admitted to the prefill in progress only (the running
    set's blocks follow from its tokens: :meth:`used_blocks`). ``hist[r]`` counts the running
    sequences whose ``tokens − steps`` is ``r`` modulo the block size (constant per sequence):
    with it the blocks held, and those taken by each of the next steps, cost ``O(block size)``.
    A call is ``(arrival, call index, input tokens, output tokens)``; a preempted call comes back
    as ``(arrival, call, input + generated, output − generated)``.
    """

    __slots__ = (
        "admitted",
        "bs",
        "busy",
        "calls",
        "ctx_base",
        "dec_parts",
        "decode_batch",
        "decode_steps",
        "down",
        "draining",
        "eng",
        "front_at",
        "front_free",
        "held",
        "hist",
        "idx",
        "inflight",
        "jump_n",
        "jump_t0",
        "jump_tau",
        "kv_cap",
        "kv_used",
        "llm",
        "max_batch",
        "mesh",
        "n_prefill",
        "paged",
        "pre_parts",
        "preemptions",
        "prefill_calls",
        "queue",
        "running",
        "state",
        "steps",
        "up",
        "version",
    )

    def __init__(self, eng: _Engine, llm: int, idx: int, kv_cap: int, max_batch: int,
                 block_size: int) -> None:
        self.eng, self.llm, self.idx = eng, llm, idx
        self.kv_cap, self.max_batch = kv_cap, max_batch
        self.paged = block_size > 0  # 0: reserve
        self.bs = block_size
        self.hist = [0] * block_size
        self.kv_used = 0
        self.front_free = 0.0  # when the front end's last call of its group is through
        self.front_at = -1.0  # when that group of calls reached it
        self.queue: deque = deque()
        self.running: list = []  # heap of (finish step, seq, call)
        self.admitted: list = []
        self.state = _IDLE
        self.steps = 0
        self.ctx_base = 0  # Σ (input + 1 − admission step): Σ context = ctx_base + B · steps
        self.version = 0
        self.jump_t0 = self.jump_tau = 0.0
        self.jump_n = 0
        self.calls = self.preemptions = self.inflight = 0
        self.busy = self.decode_steps = self.decode_batch = 0.0
        self.n_prefill = self.prefill_calls = 0
        self.up = 0.0  # when it came up (changes=), routed to from then on
        self.down: float | None = None  # when it was down after draining
        self.draining = False
        self.mesh: _Mesh | None = None  # the mesh whose SM parts its jobs hold (MeshJobs)
        self.pre_parts = self.dec_parts = self.held = 0

    def drain(self, t: float) -> None:
        """Take no new calls; down once the queue, the running set and the calls on their way
        to it are done (now, if there are none)."""
        self.draining = True
        if self.state == _IDLE and not self.inflight:
            self.down = t

    def load(self) -> int:
        return len(self.queue) + len(self.running) + len(self.admitted) + self.inflight

    # ----------------------------------------------------------------- paged KV
    def used_blocks(self, steps: int) -> int:
        """Blocks the running set holds after ``steps`` decode steps (exact, paged)."""
        bs = self.bs
        tot = self.ctx_base + len(self.running) * steps
        for r, h in enumerate(self.hist):
            if h:
                tot += h * ((-r - steps) % bs)  # the free slots of each last block
        return tot // bs

    def block_steps(self, n: int) -> int:
        """The most decode steps (≤ n) whose new blocks the free blocks cover (paged)."""
        b, bs, steps, hist = len(self.running), self.bs, self.steps, self.hist
        m, rem = divmod(self.kv_cap - self.used_blocks(steps), b)
        k = m * bs  # every bs steps each sequence takes exactly one block
        if k >= n:
            return n
        for j in range(1, bs + 1):  # step j takes the blocks of the sequences whose are full
            a = hist[(1 - steps - j) % bs]
            if a > rem:
                break
            rem -= a
            k += 1
        return min(k, n)

    def preempt(self, t: float) -> None:
        """Evict the most recently admitted running sequence to the front of the queue."""
        running = self.running
        j = max(range(len(running)), key=lambda x: running[x][1])
        f, _, c = running[j]
        running[j] = running[-1]
        running.pop()
        heapq.heapify(running)
        d = c[2] + c[3] - f  # tokens − steps
        self.ctx_base -= d
        self.hist[d % self.bs] -= 1
        tokens = d + self.steps  # prompt + generated so far: the recompute prefill's input
        back = (c[0], c[1], tokens, c[3] - (tokens - c[2]))
        if self.eng.las:  # back to its place in the priority order
            bisect.insort(self.queue, back + c[4:], key=_las_key)
        else:
            self.queue.appendleft(back)
        self.preemptions += 1
        log = self.eng.log
        if log is not None:
            log[(c[0], c[1])][5].append(t)

    def fits_paged(self, call: tuple, steps: int) -> bool:
        """Would ``call`` be admitted at a boundary after ``steps`` (nothing in prefill)?"""
        b, bs = len(self.running), self.bs
        need = (call[2] + bs) // bs  # the blocks of prompt + 1 token
        bound = (self.ctx_base + b * steps + b * (bs - 1)) // bs  # ≥ the blocks held
        return bound + need <= self.kv_cap or self.used_blocks(steps) + need <= self.kv_cap

    # ----------------------------------------------------------------- events
    def submit(self, call: tuple, t: float) -> None:
        q = self.queue
        if self.eng.las:
            bisect.insort(q, call, key=_las_key)
            head = q[0] is call
        else:
            q.append(call)
            head = len(q) == 1
        st = self.state
        if st == _IDLE:  # start once every call arriving at this instant is queued
            self.state = _BOUNDARY
            self.version += 1
            self.eng.push(t, _WAKE, self, self.version)
        elif st == _DECODE and head and len(self.running) < self.max_batch:
            k = int((t - self.jump_t0) / self.jump_tau) + 1  # end the step in progress
            if k < self.jump_n and (self.fits_paged(call, self.steps + k) if self.paged
                                    else self.kv_used + call[2] + call[3] <= self.kv_cap):
                self.jump_n = k
                self.version += 1
                self.eng.push(self.jump_t0 + k * self.jump_tau, _WAKE, self, self.version)

    def admit_reserve(self, q: deque, room: int, budget: float) -> int:
        """Move the calls that fit from the queue to ``admitted``; their prompt tokens."""
        head = q[0]
        if self.kv_used + head[2] + head[3] > self.kv_cap:
            return 0
        adm = self.admitted
        kv, cap, tot = self.kv_used, self.kv_cap, 0
        while q and room > 0:
            c = q[0]
            need = c[2] + c[3]
            if kv + need > cap or (tot and tot + c[2] > budget):
                break
            kv += need
            tot += c[2]
            adm.append(q.popleft())
            room -= 1
        self.kv_used = kv
        return tot

    def admit_paged(self, q: deque, room: int, budget: float) -> int:
        """:meth:`admit_reserve` with paged KV: each call needs its prompt's blocks (+1 token)."""
        b, bs, cap, steps = len(self.running), self.bs, self.kv_cap, self.steps
        held = (self.ctx_base + b * steps + b * (bs - 1)) // bs  # a bound first
        exact = b == 0
        if exact:
            held = 0
        adm = self.admitted
        pend, tot = 0, 0
        while q and room > 0:
            c = q[0]
            need = (c[2] + bs) // bs
            if held + pend + need > cap:
                if exact:
                    break
                held, exact = self.used_blocks(steps), True
                if held + pend + need > cap:
                    break
            if tot and tot + c[2] > budget:
                break
            pend += need
            tot += c[2]
            adm.append(q.popleft())
            room -= 1
        self.kv_used = pend
        return tot

    def start(self, t: float) -> None:
        """At an iteration boundary: prefill what can be admitted, else decode, else idle."""
        q = self.queue
        eng = self.eng
        running = self.running
        mesh = self.mesh
        if q or self.admitted:
            room = self.max_batch - len(running)
            if self.admitted:  # admitted before its mesh's SM parts were free
                tot = sum(c[2] for c in self.admitted)
            elif room > 0:
                tot = (self.admit_paged if self.paged else self.admit_reserve)(
                    q, room, eng.prefill_budget)
            else:
                tot = 0
            if tot:
                if mesh is not None and not mesh.take_prefill(self, t):
                    self.state = _GATED
                    return
                adm = self.admitted
                k = len(adm)
                dt = eng.prefill[self.llm](k, tot / k) * 1e-3
                if eng.log is not None:
                    for c in adm:
                        rec = eng.log[(c[0], c[1])]
                        if rec[2] is None:
                            rec[2] = t
                        rec[4].append(t)
                self.state = _PREFILL
                self.version += 1
                eng.account(self, t, t + dt, 0, 0.0, k)
                eng.push(t + dt, _WAKE, self, self.version)
                return
        if running:
            if mesh is not None and not mesh.take_decode(self, t):
                self.state = _GATED
                return
            b = len(running)
            steps = self.steps
            n = running[0][0] - steps
            if self.paged and self.ctx_base + b * (steps + n + self.bs - 1) > self.bs * self.kv_cap:
                while True:  # the blocks may run out within the jump: stop there, or preempt
                    k = self.block_steps(n)
                    if k:
                        n = k
                        break
                    self.preempt(t)
                    n = running[0][0] - steps  # a lone sequence always fits (_prepare)
                b = len(running)
            if mesh is not None and n > 1 and mesh.turns(self):
                n = 1
            ctx = (self.ctx_base + b * steps) / b + 0.5 * (n - 1)
            tau = eng.decode[self.llm](b, ctx) * 1e-3
            self.jump_t0, self.jump_tau, self.jump_n = t, tau, n
            self.state = _DECODE
            self.version += 1
            eng.push(t + n * tau, _WAKE, self, self.version)
            return
        self.state = _IDLE
        if self.draining and not self.inflight:
            self.down = t

    def wake(self, t: float, version: int) -> None:
        if version != self.version:
            return  # a jump that was cut short
        if self.state == _BOUNDARY:  # an idle replica that received calls
            self.start(t)
            return
        eng = self.eng
        done = []
        running = self.running
        paged = self.paged
        if self.mesh is not None:
            self.mesh.release(self, t)
        if self.state == _PREFILL:
            steps = self.steps
            hist, bs = self.hist, self.bs
            for c in self.admitted:
                if c[3] <= 1:
                    done.append(c)
                else:
                    eng.seq += 1
                    heapq.heappush(running, (steps + c[3] - 1, eng.seq, c))
                    d = c[2] + 1 - steps
                    self.ctx_base += d
                    if paged:
                        hist[d % bs] += 1
            self.admitted = []
            if paged:
                self.kv_used = 0  # the admitted blocks now belong to the running set
        else:
            n = self.jump_n
            eng.account(self, self.jump_t0, self.jump_t0 + n * self.jump_tau, n, len(running), 0)
            self.steps += n
            steps = self.steps
            while running and running[0][0] <= steps:
                f, _, c = heapq.heappop(running)
                d = c[2] + c[3] - f  # input + 1 − admission step (= f − O + 1)
                self.ctx_base -= d
                if paged:
                    self.hist[d % self.bs] -= 1
                done.append(c)
        self.state = _BOUNDARY
        for c in done:
            if not paged:
                self.kv_used -= c[2] + c[3]
            self.calls += 1
            eng.finish(c[0], c[1], t)
        self.start(t)


class _Engine:
    def __init__(self, templates: list[_Template], arrivals: list[tuple[float, int]],
                 tables: list[tuple[_StepTable, _StepTable]], shapes: list[_Shape],
                 routing: str, window: tuple[float, float], horizon: float,
                 prefill_budget: float, delay: float, record: bool, progress: bool,
                 routes: list[tuple[tuple[int, float], ...]] | None = None,
                 changes: Sequence[_Change] = (), las: bool = False,
                 gates: Mapping[int, tuple[str, int, int]] | None = None,
                 mesh_parts: int = 0,
                 cuts: Sequence[tuple[int | None, ...] | None] | None = None) -> None:
        self.templates = templates
        # per LLM the templates call: its deployments and weights (smooth weighted round
        # robin among them: deterministic, each gets its weight's share of every long run)
        self.routes = list(routes) if routes is not None else [((m, 1.0),)
                                                               for m in range(len(shapes))]
        self.credit = [[0.0] * len(r) for r in self.routes]
        # routed by prompt length: the first deployment whose range's upper end is above it
        self.cuts = list(cuts) if cuts is not None else [None] * len(self.routes)
        self.arrivals = arrivals
        self.prefill = [p for p, _ in tables]
        self.decode = [d for _, d in tables]
        self.shapes = list(shapes)
        self.replicas = [[_Replica(self, m, r, sh.kv_cap, sh.max_batch, sh.block_size)
                          for r in range(sh.replicas)] for m, sh in enumerate(shapes)]
        meshes: dict[str, _Mesh] = {}
        for m, (mesh, pre, dec) in (gates or {}).items():  # MeshJobs: jobs hold SM parts
            for rep in self.replicas[m]:
                rep.mesh = meshes.setdefault(mesh, _Mesh(self, mesh_parts))
                rep.pre_parts, rep.dec_parts = pre, dec
        self.active = [list(reps) for reps in self.replicas]  # routed to: up, not draining
        self.order = [rep for reps in self.replicas for rep in reps]  # in the order they came up
        self.rr = [0] * len(shapes)
        # per LLM the templates call: the index its next new replica gets (unique per LLM)
        self.next_idx = [sum(len(self.replicas[m]) for m, _ in r) for r in self.routes]
        self.changes = changes
        self.las = las
        self.attained = [0] * len(arrivals) if las else None  # tokens of finished LLM calls
        self.least = routing == "least_loaded"
        self.w0, self.w1 = window
        self.horizon = horizon
        self.prefill_budget = prefill_budget
        self.delay = delay  # pure delay of every LLM call before its replica sees it
        self.heap: list = []
        self.seq = 0
        n = len(arrivals)
        self.pending: list = [None] * n  # per arrival: remaining parents per call
        self.left = [0] * n
        self.end = [math.nan] * n
        self.log: dict | None = {} if record else None
        self.progress = progress
        self.events = 0
        self.now = 0.0

    def push(self, t: float, kind: int, a, b) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def account(self, rep: _Replica, a: float, b: float, steps: int, batch: float, k: int,
                ) -> None:
        """Busy time and batch sizes of one iteration (or jump) [a, b] inside the window."""
        lo, hi = max(a, self.w0), min(b, self.w1)
        if hi <= lo:
            return
        rep.busy += hi - lo
        if steps:
            frac = steps * (hi - lo) / (b - a)
            rep.decode_steps += frac
            rep.decode_batch += frac * batch
        elif a >= self.w0:
            rep.n_prefill += 1
            rep.prefill_calls += k

    def begin(self, aid: int, t: float) -> None:
        tm = self.templates[self.arrivals[aid][1]]
        self.pending[aid] = list(tm.n_parents)
        self.left[aid] = len(tm.llm)
        for off, i in tm.roots:
            if off > 0:
                self.push(t + off, _START, aid, i)
            else:
                self.start_call(aid, i, t)

    def start_call(self, aid: int, i: int, t: float) -> None:
        tm = self.templates[self.arrivals[aid][1]]
        m = tm.llm[i]
        if m < 0:
            if self.log is not None:
                self.log[(aid, i)] = [None, t, t, None, [], [], -1]
            self.push(t + tm.dur[i], _TOOL_END, aid, i)
            return
        route = self.routes[m]
        cuts = self.cuts[m]
        if len(route) == 1:
            m = route[0][0]
        elif cuts is not None:  # by length: tm.inp is the prompt's tokens, at least 1
            x = tm.inp[i]
            m = route[next(k for k, hi in enumerate(cuts) if hi is None or x < hi)][0]
        else:  # smooth weighted round robin (nginx's): the most credit goes, pays the total
            credit = self.credit[m]
            for k, (_, w) in enumerate(route):
                credit[k] += w
            k = max(range(len(route)), key=lambda j: (credit[j], -j))
            credit[k] -= 1.0
            m = route[k][0]
        reps = self.active[m]
        if len(reps) == 1:
            rep = reps[0]
        elif self.least:
            rep = min(reps, key=_Replica.load)
        else:
            r = self.rr[m]
            rep = reps[r]
            self.rr[m] = (r + 1) % len(reps)
        if self.log is not None:
            self.log[(aid, i)] = [rep.idx, t, None, None, [], [], m]
        call: tuple = (aid, i, tm.inp[i], tm.out[i])
        if self.attained is not None:  # LAS: its request's service so far sets its place
            self.seq += 1
            call = (aid, i, tm.inp[i], tm.out[i], las_level(self.attained[aid]), t, self.seq)
        if self.delay > 0:  # routed now, seen by the replica after its front end's delay
            rep.inflight += 1
            # a pure delay per call; the calls that reach the replica at the same instant (a
            # fan-out) take their delays in turn (scepsy_profile.overheads.front_delay_s)
            if t != rep.front_at:
                rep.front_at, rep.front_free = t, t
            rep.front_free += self.delay
            self.push(rep.front_free, _SUBMIT, rep, call)
        else:
            rep.submit(call, t)

    def apply(self, change: _Change, t: float) -> None:
        """The serving allocation becomes ``change``'s: per LLM, replicas come up or drain."""
        for c, (m, n) in enumerate(change.targets):
            cur = self.routes[c][0][0]
            if m != cur:  # a new shape: every old replica drains, the new ones serve
                for rep in self.active[cur]:
                    rep.drain(t)
                self.active[cur] = []
                self.routes[c] = ((m, 1.0),)
                self.credit[c] = [0.0]
                self.cuts[c] = None
            reps = self.active[m]
            if n < len(reps):  # the highest-index ones drain
                for rep in reps[n:]:
                    rep.drain(t)
                self.active[m] = reps[:n]
            elif n > len(reps):
                sh = self.shapes[m]
                new = []
                for _ in range(n - len(reps)):
                    rep = _Replica(self, m, self.next_idx[c], sh.kv_cap, sh.max_batch,
                                   sh.block_size)
                    self.next_idx[c] += 1
                    rep.up = t
                    new.append(rep)
                self.replicas[m].extend(new)
                self.order.extend(new)
                self.active[m] = reps + new
            self.rr[m] %= max(len(self.active[m]), 1)

    def finish(self, aid: int, i: int, t: float) -> None:
        if self.log is not None:
            self.log[(aid, i)][3] = t
        tm = self.templates[self.arrivals[aid][1]]
        if self.attained is not None and tm.llm[i] >= 0:
            self.attained[aid] += tm.inp[i] + tm.out[i]
        pend = self.pending[aid]
        for ch in tm.children[i]:
            pend[ch] -= 1
            if pend[ch] == 0:
                self.start_call(aid, ch, t)
        self.left[aid] -= 1
        if self.left[aid] == 0:
            self.end[aid] = t
            self.pending[aid] = None

    def run(self) -> None:
        heap = self.heap
        pop = heapq.heappop
        arrivals = self.arrivals
        n_arr = len(arrivals)
        nxt = 0  # arrivals are merged into the event stream without sitting in the heap
        horizon = self.horizon
        events = 0
        changes = self.changes
        n_chg = len(changes)
        chg = 0  # changes too: one goes before every event at or after its time
        cht = changes[0].at_s if n_chg else math.inf
        shown = last = time.perf_counter()
        while True:
            if nxt < n_arr and (not heap or arrivals[nxt][0] <= heap[0][0]):
                t = arrivals[nxt][0]
                if t > horizon:
                    break
                if t >= cht:
                    self.now = cht
                    self.apply(changes[chg], cht)
                    chg += 1
                    cht = changes[chg].at_s if chg < n_chg else math.inf
                    continue
                self.now = t
                self.begin(nxt, t)
                nxt += 1
            else:
                if not heap or heap[0][0] > horizon:
                    break
                if heap[0][0] >= cht:
                    self.now = cht
                    self.apply(changes[chg], cht)
                    chg += 1
                    cht = changes[chg].at_s if chg < n_chg else math.inf
                    continue
                t, _, kind, a, b = pop(heap)
                self.now = t
                if kind == _WAKE:
                    a.wake(t, b)
                elif kind == _TOOL_END:
                    self.finish(a, b, t)
                elif kind == _SUBMIT:
                    a.inflight -= 1
                    a.submit(b, t)
                else:
                    self.start_call(a, b, t)
            events += 1
            if self.progress and not events & 4095:
                now = time.perf_counter()
                if now - shown >= 0.5:
                    shown = now
                    done = sum(1 for e in self.end[:nxt] if e == e)
                    sys.stderr.write(f"\rsimulate: t={t:,.1f} s  arrivals {nxt:,}/{n_arr:,}  "
                                     f"completed {done:,}  events {events:,}  "
                                     f"{now - last:,.0f} s ")
                    sys.stderr.flush()
        self.events = events
        for reps in self.replicas:  # jumps still in flight when the run stopped
            for rep in reps:
                if rep.state == _DECODE:
                    end = rep.jump_t0 + rep.jump_n * rep.jump_tau
                    self.account(rep, rep.jump_t0, end, rep.jump_n, len(rep.running), 0)
        if self.progress:
            done = sum(1 for e in self.end if e == e)
            sys.stderr.write(f"\rsimulate: t={self.now:,.1f} s  arrivals {nxt:,}/{n_arr:,}  "
                             f"completed {done:,}  events {events:,}  "
                             f"{time.perf_counter() - last:,.1f} s, done\n")
            sys.stderr.flush()


# --------------------------------------------------------------------------- public API
@dataclass(frozen=True, slots=True)
class _Shape:
    """One LLM's replicas: how many, their KV capacity and batch limit."""

    replicas: int
    kv_tokens: int
    kv_cap: int  # tokens (reserve) or blocks (paged)
    max_batch: int
    block_size: int  # 0: reserve


@dataclass(frozen=True)
class _Prepared:
    templates: list[_Template]
    by_workflow: dict[str, list[int]]
    llm_names: list[str]  # the deployments (an LLM, or a replica group of a split one)
    tables: list[tuple[_StepTable, _StepTable]]
    shapes: list[_Shape]
    # per LLM the trace calls (the templates' index): its deployments and their weights
    routes: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    instances: list[Instance] = field(default_factory=list)  # per deployment, replicas=1
    # per LLM the trace calls: None (by weight), or routed by prompt length, the upper ends
    # of its deployments' input-token ranges in route order (None: no end)
    cuts: list[tuple[int | None, ...] | None] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Change:
    """An :class:`AllocationChange`, compiled: per LLM the templates call, the deployment
    (index into the prepared shapes) and how many of its replicas serve from ``at_s``."""

    at_s: float
    targets: tuple[tuple[int, int], ...]


def _shape_key(inst: Instance) -> tuple:
    return (inst.gpu, inst.tp, inst.share, inst.memory_share)


def _prepare_changes(prep: _Prepared, trace: Trace, workflows: list[str],
                     models: Mapping[str, str], allocation: Allocation,
                     changes: Sequence[AllocationChange], latency: LatencyModel,
                     policy: MemoryPolicy, catalog: Catalog,
                     latencies: Mapping[str, LatencyModel]) -> list[_Change]:
    """Check ``changes`` and compile them; a new instance shape of an LLM adds a deployment
    (step tables and KV capacity) to ``prep``."""
    wanted = set(workflows)
    calls = [c for c in trace.calls if c.workflow in wanted]
    split = sorted({c.llm for c in calls if c.llm is not None and c.llm in allocation.splits})
    if split:
        raise InputError(allocation.source, f"splits.{split[0]}", "an LLM that runs as one "
                         "deployment (changes= does not take split LLMs)")
    called = list(prep.llm_names)  # without splits: one deployment per LLM, named after it
    deployments = {(c, _shape_key(allocation.llms[c])): m for m, c in enumerate(called)}
    out: list[_Change] = []
    last = 0.0
    bs = _kv_block_size(policy)
    for k, ch in enumerate(changes):
        where = f"changes[{k}]"
        if not isinstance(ch, AllocationChange):
            raise InputError("simulate", where, "an AllocationChange", type(ch).__name__)
        if ch.at_s < last:
            raise InputError("simulate", f"{where}.at_s", f"changes sorted by time (at or after "
                             f"the previous one, {last:g} s)", ch.at_s)
        last = ch.at_s
        alloc = ch.allocation
        check_allocation(alloc, alloc.models(models), catalog=catalog, policy=policy)
        targets = []
        for c in called:
            if c in alloc.splits:
                raise InputError("simulate", f"{where}.allocation.splits.{c}", "an LLM that runs "
                                 "as one deployment (changes= does not take split LLMs)")
            inst = alloc.llms.get(c)
            if inst is None:
                raise InputError("simulate", f"{where}.allocation.llms.{c}", "an instance for "
                                 "every LLM the simulated workflows call (a change cannot take "
                                 "an LLM to 0 replicas)")
            key = (c, _shape_key(inst))
            m = deployments.get(key)
            if m is None:
                if inst.mesh is not None or inst.prefill_share is not None or c in latencies:
                    raise InputError("simulate", f"{where}.allocation.llms.{c}", "the same "
                                     "shape as before for an LLM on a shared mesh, with a "
                                     "prefill limit or with its own latency model (latencies=)")
                table, shape = _deployment(c, c, calls, models, alloc, latency, policy,
                                           catalog, bs)
                m = deployments[key] = len(prep.llm_names)
                prep.llm_names.append(c)
                prep.instances.append(dataclasses.replace(inst, replicas=1))
                prep.tables.append(table)
                prep.shapes.append(dataclasses.replace(shape, replicas=0))  # none at the start
            targets.append((m, inst.replicas))
        out.append(_Change(float(ch.at_s), tuple(targets)))
    return out


def _kv_block_size(policy: MemoryPolicy) -> int:
    """The block size of paged KV management, 0 for ``reserve``."""
    return policy.block_size if policy.kv_management == "paged" else 0


def _prepare(trace: Trace, workflows: list[str], models: Mapping[str, str],
             allocation: Allocation, latency: LatencyModel, policy: MemoryPolicy,
             catalog: Catalog, latencies: Mapping[str, LatencyModel]) -> _Prepared:
    known = set(trace.workflows())
    for w in workflows:
        if w not in known:
            raise InputError("simulate", f"rates.{w}",
                             f"a workflow of the trace ({', '.join(sorted(known))})")
    wanted = set(workflows)
    calls = [c for c in trace.calls if c.workflow in wanted]
    called = sorted({c.llm for c in calls if c.llm is not None})
    llm_index = {name: i for i, name in enumerate(called)}
    templates: list[_Template] = []
    by_workflow: dict[str, list[int]] = {w: [] for w in workflows}
    for (w, _), recs in trace.requests.items():
        if w in wanted:
            by_workflow[w].append(len(templates))
            templates.append(_compile(recs, llm_index))
    tables, shapes = [], []
    bs = _kv_block_size(policy)
    llm_names: list[str] = []
    routes: list[tuple[tuple[int, float], ...]] = []
    cuts: list[tuple[int | None, ...] | None] = []
    for called_name in called:
        if called_name not in models:
            raise InputError("simulate", f"models.{called_name}",
                             "the catalog model this LLM runs")
        serving = allocation.serving(called_name)
        ranges = allocation.lengths.get(called_name)
        if ranges is not None:  # by length: its groups in the order of their ranges
            serving = tuple(sorted(serving, key=lambda gf: ranges[gf[0]][0]))
            cuts.append(tuple(ranges[g][1] for g, _ in serving))
        else:
            cuts.append(None)
        routes.append(tuple((len(llm_names) + k, f) for k, (_, f) in enumerate(serving)))
        for name, _ in serving:
            inst = allocation.llms.get(name)
            if inst is not None and name not in latencies and (
                    inst.mesh is not None or inst.prefill_share is not None):
                raise InputError(allocation.source, f"llms.{name}", "latencies= with this "
                                 "LLM's model at its contended MPS shares (scepsy_opt.prediction.pipeline."
                                 "phase_latencies; scepsy.simulate passes them)")
            llm_names.append(name)
            table, shape = _deployment(name, called_name, calls, models, allocation,
                                       latencies.get(name, latency), policy, catalog, bs,
                                       ranges[name] if ranges is not None else None)
            tables.append(table)
            shapes.append(shape)
    instances = [dataclasses.replace(allocation.llms[n], replicas=1) for n in llm_names]
    return _Prepared(templates, by_workflow, llm_names, tables, shapes, routes, instances,
                     cuts)


def _deployment(name: str, called: str, calls: list[CallRecord], models: Mapping[str, str],
                allocation: Allocation, latency: LatencyModel, policy: MemoryPolicy,
                catalog: Catalog, bs: int, rng: tuple[int, int | None] | None = None,
                ) -> tuple[tuple[_StepTable, _StepTable], _Shape]:
    """The step tables and replica shape of deployment ``name`` (an entry of the allocation)
    serving the calls of LLM ``called`` (routed by length: those whose prompt is in ``rng``,
    the only calls it must hold)."""
    if name not in allocation.llms:
        raise InputError("allocation", f"llms.{name}", "an instance for every LLM the "
                         "simulated workflows call")
    inst = allocation.llms[name]
    model = models[called]
    mine = [c for c in calls if c.llm == called
            and (rng is None or in_range(c.input_tokens, rng))]
    if not mine:  # a range none of the simulated calls falls in: sized for the LLM's calls
        mine = [c for c in calls if c.llm == called]
    longest = max(max(c.input_tokens, 1) + max(c.output_tokens, 1) for c in mine)
    max_in = max(max(c.input_tokens, 1) for c in mine)
    # the KV cache comes from the memory share, the speed from the compute share
    fit = memory_fit(model, inst.gpu, inst.tp, inst.memory_share,
                     call_tokens(longest, policy), catalog, policy)
    cap = fit.kv_tokens // bs if bs else fit.kv_tokens
    if not fit.feasible:
        blocks = f" = {cap} blocks of {bs}" if bs else ""
        raise InputError("allocation", f"llms.{name}",
                         f"an instance whose KV cache holds the longest call ({longest} "
                         f"tokens; {model} on {inst.memory_share:g} of the memory of "
                         f"{inst.tp} x {inst.gpu} holds "
                         f"{fit.kv_tokens}{blocks})")
    if bs:  # a preempted call is prefilled again with what it had generated
        max_in = longest
    g, tp, s = inst.gpu, inst.tp, inst.share

    def pre(b, x, model=model, g=g, tp=tp, s=s):
        return latency.prefill_ms(model, g, tp, s, b, x)

    def dec(b, x, model=model, g=g, tp=tp, s=s):
        return latency.decode_ms(model, g, tp, s, b, x)

    return ((_StepTable(pre, max_in, f"prefill_ms({name})"),
             _StepTable(dec, longest, f"decode_ms({name})")),
            _Shape(inst.replicas, fit.kv_tokens, cap, policy.max_batch, bs))


def _check_rates(rates: Mapping[str, float]) -> dict[str, float]:
    out = {}
    for w, r in rates.items():
        if not (isinstance(r, int | float) and math.isfinite(r) and r >= 0):
            raise InputError("simulate", f"rates.{w}", "an arrival rate >= 0 (req/s)", r)
        if r > 0:
            out[w] = float(r)
    if not out:
        raise InputError("simulate", "rates", "at least one workflow with a rate > 0")
    return dict(sorted(out.items()))


def _poisson_arrivals(prep: _Prepared, rates: dict[str, float], requests: int | None,
                      duration_s: float | None, seed: int,
                      given: Sequence[float] | NDArray[np.float64] | None = None,
                      ) -> list[tuple[float, int]]:
    """Merged Poisson arrivals; the draws do not depend on the rates' scale (common numbers).
    ``given``: these arrival times instead (sorted, from 0; the first ``requests`` of them, or
    those before ``duration_s``), each with a workflow drawn in proportion to ``rates``."""
    rng = np.random.default_rng(seed)
    names = list(rates)
    total = sum(rates.values())
    if given is not None:  # the recorded times as they are
        t = np.asarray(given, dtype=float)
        arrival = t[t < duration_s] if duration_s is not None else t[:requests]
    elif requests is not None:
        arrival = np.cumsum(rng.exponential(size=requests)) / total
    else:
        assert duration_s is not None
        chunks, reach, need = [], 0.0, duration_s * total
        while reach <= need:
            c = reach + np.cumsum(rng.exponential(size=max(int(need - reach) + 64, 64)))
            chunks.append(c)
            reach = float(c[-1])
        unit = np.concatenate(chunks)
        arrival = unit[unit < need] / total
    n = len(arrival)
    probs = np.array([rates[w] for w in names]) / total
    wf = rng.choice(len(names), size=n, p=probs) if len(names) > 1 else np.zeros(n, int)
    pick = rng.random(n)
    times = arrival.tolist()
    out = []
    for t, w, u in zip(times, wf.tolist(), pick.tolist(), strict=True):
        pool = prep.by_workflow[names[w]]
        out.append((t, pool[min(int(u * len(pool)), len(pool) - 1)]))
    return out


def _given_times(times: Sequence[float] | None) -> NDArray[np.float64] | None:
    """Recorded arrival times, checked: finite, >= 0, sorted, at most :data:`MAX_REQUESTS`."""
    if times is None:
        return None
    t = np.asarray(times, dtype=float)
    if t.ndim != 1 or len(t) < 1 or not np.all(np.isfinite(t)) or np.any(t < 0) or np.any(
            np.diff(t) < 0):
        raise InputError("simulate", "arrival_times_s", "sorted arrival times >= 0 (s)")
    if len(t) > MAX_REQUESTS:
        raise InputError("simulate", "arrival_times_s", f"at most {MAX_REQUESTS} arrivals",
                         len(t))
    return t


def _trace_arrivals(trace: Trace, requests: int | None,
                    duration_s: float | None) -> list[tuple[float, int]]:
    starts = [min(c.start_s for c in recs) for recs in trace.requests.values()]
    t0 = min(starts)
    out = [(s - t0, i) for i, s in enumerate(starts)]
    if duration_s is not None:
        out = [a for a in out if a[0] < duration_s]
    if requests is not None:
        out = out[:requests]
    return out


def _as_trace(trace: Trace | Sequence[CallRecord]) -> Trace:
    """A :class:`Trace`, or call records (e.g. from ``generate_trace``) validated into one."""
    if isinstance(trace, Trace):
        return trace
    calls = list(trace)
    if not calls or not all(isinstance(c, CallRecord) for c in calls):
        raise InputError("simulate", "trace", "a Trace or a non-empty sequence of CallRecord")
    return validate_calls(calls, "trace")


def _run(trace: Trace | Sequence[CallRecord], models: Mapping[str, str], allocation: Allocation, latency: LatencyModel,
         rates: Mapping[str, float] | None, requests: int | None, duration_s: float | None,
         seed: int, routing: str, policy: MemoryPolicy, catalog: Catalog | None,
         warmup_fraction: float, drain_s: float | None, max_prefill_tokens: int | None,
         record: bool, progress: bool, latencies: Mapping[str, LatencyModel] | None = None,
         arrival_times_s: Sequence[float] | None = None,
         changes: Sequence[AllocationChange] = (), priority: PriorityPolicy = "fcfs",
         mesh_jobs: MeshJobs | None = None, batch_limits: Mapping[str, int] | None = None):
    if routing not in ROUTINGS:
        raise InputError("simulate", "routing", f"one of {', '.join(ROUTINGS)}", routing)
    if priority not in PRIORITY_POLICIES:
        raise InputError("simulate", "priority", f"one of {', '.join(PRIORITY_POLICIES)}",
                         priority)
    if isinstance(changes, AllocationChange) or not isinstance(changes, Sequence):
        raise InputError("simulate", "changes", "a sequence of AllocationChange",
                         type(changes).__name__)
    if requests is not None and duration_s is not None:
        raise InputError("simulate", "requests/duration_s", "at most one of the two")
    if requests is not None and not (isinstance(requests, int) and requests >= 1):
        raise InputError("simulate", "requests", "an integer >= 1", requests)
    if requests is not None and requests > MAX_REQUESTS:
        raise InputError("simulate", "requests", f"at most {MAX_REQUESTS} simulated requests",
                         requests)
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise InputError("simulate", "duration_s", "a duration > 0 s", duration_s)
    if not 0 <= warmup_fraction < 1:
        raise InputError("simulate", "warmup_fraction", "a fraction in [0, 1)", warmup_fraction)
    if max_prefill_tokens is not None and not (isinstance(max_prefill_tokens, int)
                                               and max_prefill_tokens >= 1):
        raise InputError("simulate", "max_prefill_tokens", "an integer >= 1 or None",
                         max_prefill_tokens)
    if max_prefill_tokens is None:
        max_prefill_tokens = policy.max_num_batched_tokens
    delay = call_delay_s(latency)
    if not (isinstance(delay, int | float) and math.isfinite(delay) and delay >= 0):
        raise InputError("latency model", "call_delay_s", "a delay >= 0 s", delay)
    if drain_s is not None and not drain_s >= 0:
        raise InputError("simulate", "drain_s", "a time >= 0 s or None", drain_s)
    cat = catalog or default_catalog()
    check_allocation(allocation, allocation.models(models), catalog=cat, policy=policy)
    own = dict(latencies or {})
    trace = _as_trace(trace)
    if rates is None:
        if arrival_times_s is not None:
            raise InputError("simulate", "arrival_times_s", "rates too (the mix of workflows "
                             "the arrival times draw from)")
        workflows = trace.workflows()
        prep = _prepare(trace, workflows, models, allocation, latency, policy, cat, own)
        arrivals = _trace_arrivals(trace, requests, duration_s)
    else:
        checked = _check_rates(rates)
        if duration_s is not None and sum(checked.values()) * duration_s > MAX_REQUESTS:
            raise InputError("simulate", "duration_s", f"a duration that holds at most "
                             f"{MAX_REQUESTS} expected arrivals at the total rate "
                             f"{sum(checked.values()):g} req/s", duration_s)
        prep = _prepare(trace, list(checked), models, allocation, latency, policy, cat, own)
        given = _given_times(arrival_times_s)
        if requests is None and duration_s is None and given is None:
            requests = DEFAULT_REQUESTS
        arrivals = _poisson_arrivals(prep, checked, requests, duration_s, seed, given)
        workflows = list(checked)
    if not arrivals:
        raise InputError("simulate", "duration_s", "a duration that holds at least one arrival",
                         duration_s)
    compiled = _prepare_changes(prep, trace, workflows, models, allocation, changes, latency,
                                policy, cat, own) if changes else []
    n = len(arrivals)
    warm = min(math.floor(warmup_fraction * n), n - 1)
    w0, w1 = arrivals[warm][0], arrivals[-1][0]
    horizon = math.inf if drain_s is None else w1 + drain_s
    if w1 <= w0:  # a single measured arrival: measure until the run stops
        w1 = math.inf
    budget = math.inf if max_prefill_tokens is None else float(max_prefill_tokens)
    gates = _mesh_gates(prep, allocation, mesh_jobs, bool(changes))
    for name, limit in (batch_limits or {}).items():
        if name not in prep.llm_names:
            raise InputError("simulate", f"batch_limits.{name}", "an LLM the simulated "
                             f"workflows call ({', '.join(prep.llm_names)})")
        if not (isinstance(limit, int) and 1 <= limit <= policy.max_batch):
            raise InputError("simulate", f"batch_limits.{name}", f"an integer in [1, "
                             f"{policy.max_batch}] (the policy's max_batch)", limit)
        for m, dep in enumerate(prep.llm_names):
            if dep == name:
                prep.shapes[m] = dataclasses.replace(prep.shapes[m], max_batch=limit)
    eng = _Engine(prep.templates, arrivals, prep.tables, prep.shapes, routing, (w0, w1),
                  horizon, budget, float(delay), record, progress, prep.routes, compiled,
                  priority == "las", gates,
                  0 if mesh_jobs is None else mesh_jobs.parts + mesh_jobs.overload,
                  prep.cuts)
    tic = time.perf_counter()
    eng.run()
    wall = time.perf_counter() - tic
    return prep, arrivals, warm, workflows, eng, wall


def _mesh_gates(prep: _Prepared, allocation: Allocation, jobs: MeshJobs | None,
                changes: bool) -> dict[int, tuple[str, int, int]]:
    """Per deployment on a shared mesh: its mesh and the SM parts of its prefill and decode
    jobs (:class:`MeshJobs`); none without ``jobs``."""
    if jobs is None:
        return {}
    if not isinstance(jobs, MeshJobs):
        raise InputError("simulate", "mesh_jobs", "a MeshJobs or None", type(jobs).__name__)
    unknown = sorted(set(jobs.meshes) - set(prep.llm_names))
    if unknown:
        raise InputError("simulate", f"mesh_jobs.meshes.{unknown[0]}", "an LLM the simulated "
                         f"workflows call ({', '.join(prep.llm_names)})")
    out: dict[int, tuple[str, int, int]] = {}
    for m, name in enumerate(prep.llm_names):
        mesh = jobs.meshes.get(name)
        if mesh is None:
            continue
        inst = allocation.llms[name]
        if changes:
            raise InputError("simulate", "mesh_jobs", "no changes= with LLMs on shared meshes")
        if inst.replicas != 1:
            raise InputError(allocation.source, f"llms.{name}.replicas", "one replica for an "
                             "LLM on a shared mesh (mesh_jobs=)", inst.replicas)
        pre = inst.share if inst.prefill_share is None else inst.prefill_share
        out[m] = (mesh, jobs.job_parts(pre), jobs.job_parts(inst.share))
    return out


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else math.nan


def simulate(
    trace: Trace | Sequence[CallRecord],
    models: Mapping[str, str],
    allocation: Allocation,
    latency: LatencyModel,
    rates: Mapping[str, float] | None = None,
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    seed: int = 0,
    routing: Routing = "round_robin",
    policy: MemoryPolicy = _DEFAULT_POLICY,
    catalog: Catalog | None = None,
    warmup_fraction: float = 0.1,
    drain_s: float | None = None,
    max_prefill_tokens: int | None = None,
    record_events: bool = False,
    progress: bool = False,
    latencies: Mapping[str, LatencyModel] | None = None,
    arrival_times_s: Sequence[float] | None = None,
    changes: Sequence[AllocationChange] = (),
    priority: PriorityPolicy = "fcfs",
    mesh_jobs: MeshJobs | None = None,
    batch_limits: Mapping[str, int] | None = None,
) -> SimulationResult:
    """Replay workflow requests on ``allocation`` and measure latency, throughput and use.

    ``models`` maps each LLM name of the trace to the catalog model it runs. ``rates`` gives
    Poisson arrival rates per workflow (req/s; workflows left out or at 0 are not simulated);
    ``None`` replays the trace at its recorded times. The run has ``requests`` arrivals or
    lasts ``duration_s`` (at most one; Poisson runs default to 1000 arrivals) and stops
    ``drain_s`` after the last arrival (``None``: when every request has completed).
    ``max_prefill_tokens`` caps the prompt tokens of one prefill iteration (vLLM's
    ``max_num_batched_tokens``; a longer prompt still goes alone); ``None``: the policy's
    ``max_num_batched_tokens`` (``None`` there too: no cap). ``policy`` also sets the batch
    limit and the KV management (``paged`` blocks with preemption, or ``reserve``); a
    latency model with a ``call_delay_s`` (engine overheads) delays every LLM call by it (the
    calls of a fan-out that reach one replica together take their delays in turn).
    ``record_events`` keeps every call's ready, start and end time in ``call_log``;
    ``progress`` prints a progress line on stderr. ``latencies``: the latency model of some
    deployments (LLM name -> model), in place of ``latency``; required for every LLM with its
    own prefill limit or on a shared mesh, at the shares it gets there
    (:func:`scepsy_opt.prediction.pipeline.phase_latencies`). Deterministic for a given ``seed``.
    ``trace`` may also be a sequence of call records (validated here).
    ``arrival_times_s``: recorded arrival times (sorted, seconds from 0; :mod:`scepsy_opt.arrivals`)
    in place of the Poisson process, each arrival a workflow drawn in proportion to ``rates``
    (their scale does not matter then); the run is the first ``requests`` of them, those
    before ``duration_s``, or all.
    ``changes``: :class:`~scepsy_opt.prediction.schedule.AllocationChange` s sorted by time; at
    each the serving allocation becomes its allocation (replicas come up at once, or drain:
    :mod:`scepsy_opt.prediction.schedule`); ``replica_spans`` says when each replica was up.
    ``priority``: the order of each replica's waiting queue, ``"fcfs"`` or ``"las"``
    (:mod:`scepsy_opt.prediction.priority`).
    ``mesh_jobs``: the LLMs of each shared mesh take turns on its SMs as MuxServe's scheduler
    runs them (:class:`MeshJobs`); ``None``: LLMs sharing GPUs run at once, each at its
    contended shares (``latencies=``). ``batch_limits``: per LLM a batch limit below the
    policy's ``max_batch`` (an engine that limits each LLM on its own, as MuxServe's does).
    See the module docstring for the serving model and the statistics.
    """
    prep, arrivals, warm, workflows, eng, wall = _run(
        trace, models, allocation, latency, rates, requests, duration_s, seed, routing, policy,
        catalog, warmup_fraction, drain_s, max_prefill_tokens, record_events, progress,
        latencies, arrival_times_s, changes, priority, mesh_jobs, batch_limits)
    w0, w1 = eng.w0, eng.w1
    end_t = eng.now
    if w1 == math.inf:  # one measured arrival: measured until the run stopped
        w1 = max(end_t, w0)
    span = w1 - w0
    tm = prep.templates
    outcomes = tuple(
        RequestOutcome(tm[k].workflow, tm[k].request_id, t, None if e != e else e)
        for (t, k), e in zip(arrivals, eng.end, strict=True))
    per_wf: dict[str, SimulatedWorkflow] = {}
    for w in workflows:
        idx = [i for i, (_, k) in enumerate(arrivals) if tm[k].workflow == w]
        ends = np.array([eng.end[i] for i in idx], float)
        arr_t = np.array([arrivals[i][0] for i in idx], float)
        ok = ~np.isnan(ends)
        measured = ok & (np.array(idx, int) >= warm) if idx else ok
        lat = ends[measured] - arr_t[measured]
        in_window = ok & (ends >= w0) & (ends <= w1)
        per_wf[w] = SimulatedWorkflow(
            arrivals=len(idx), completed=int(ok.sum()), unfinished=int((~ok).sum()),
            measured=int(measured.sum()),
            throughput=float(in_window.sum() / span) if span > 0 else 0.0,
            mean_latency_s=float(lat.mean()) if len(lat) else math.nan,
            p50_latency_s=_pct(lat, 50), p90_latency_s=_pct(lat, 90), p99_latency_s=_pct(lat, 99),
        )
    per_llm: dict[str, SimulatedLLM] = {}
    deployments: dict[str, list[int]] = {}  # a name has several with changes= (new shapes)
    for m, name in enumerate(prep.llm_names):
        deployments.setdefault(name, []).append(m)
    for name, ms in deployments.items():
        reps = [r for m in ms for r in eng.replicas[m]]
        steps = sum(r.decode_steps for r in reps)
        n_pre = sum(r.n_prefill for r in reps)
        calls = sum(r.calls for r in reps)
        evicted = sum(r.preemptions for r in reps)
        if eng.changes:  # replicas serving at the end; busy over the time each was up
            m = next((m for m in reversed(ms) if eng.active[m]), ms[-1])
            n_up = sum(len(eng.active[m]) for m in ms)
            up = math.fsum(max(min(end_t if r.down is None else r.down, w1) - max(r.up, w0), 0.0)
                           for r in reps)
            util = sum(r.busy for r in reps) / up if up > 0 else 0.0
        else:
            m, n_up = ms[0], len(reps)
            util = sum(r.busy for r in reps) / (span * len(reps)) if span > 0 else 0.0
        per_llm[name] = SimulatedLLM(
            replicas=n_up, calls=calls, utilisation=util,
            mean_batch=sum(r.decode_batch for r in reps) / steps if steps else 0.0,
            mean_prefill_batch=sum(r.prefill_calls for r in reps) / n_pre if n_pre else 0.0,
            kv_tokens=prep.shapes[m].kv_tokens, max_batch=reps[0].max_batch,
            preemptions=evicted, preemptions_per_call=evicted / calls if calls else 0.0,
        )
    spans = tuple(ReplicaSpan(prep.llm_names[r.llm], prep.instances[r.llm], r.up, r.down, r.idx)
                  for r in eng.order)
    log = None
    if eng.log is not None:
        names = prep.llm_names
        rows = []
        for (aid, i), (rep, ready, start, end, adm, pre, dep) in sorted(eng.log.items()):
            t = tm[arrivals[aid][1]]
            llm = names[dep] if dep >= 0 else None
            rows.append(CallEvent(aid, t.ids[i], llm, t.tools[i], rep, ready, start, end,
                                  tuple(adm), tuple(pre)))
        log = tuple(rows)
    return SimulationResult(
        workflows=MappingProxyType(per_wf), llms=MappingProxyType(per_llm), requests=outcomes,
        window_s=(w0, w1), end_s=end_t, llm_calls=sum(per.calls for per in per_llm.values()),
        events=eng.events, call_log=log, replica_spans=spans, wall_s=wall,
    )


def _in_system(starts: np.ndarray, ends: np.ndarray, a: float, b: float) -> float:
    """Time-averaged number of requests in the system over [a, b] (unfinished: until b)."""
    ends = np.where(np.isnan(ends), np.inf, ends)
    overlap = np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0.0, None)
    return float(overlap.sum() / (b - a))


def _stable(eng: _Engine, max_unfinished: float, max_growth: float) -> bool:
    """Fewer than ``max_unfinished`` of the arrivals unfinished, and the requests in the system
    (time-averaged) grow from the middle to the last third of the arrival period by at most
    ``max_growth`` of the arrivals in one third."""
    ends = np.array(eng.end, float)
    starts = np.array([a[0] for a in eng.arrivals], float)
    n = len(ends)
    if np.isnan(ends).sum() > max_unfinished * n:
        return False
    t1 = float(starts[-1])
    if t1 <= 0:
        return True
    mid = _in_system(starts, ends, t1 / 3, 2 * t1 / 3)
    last = _in_system(starts, ends, 2 * t1 / 3, t1)
    return last - mid <= max_growth * n / 3


def saturation_rate(*args: Any, **kwargs: Any) -> float:
    """The largest stable load: ``scale`` such that ``scale · rates`` (req/s) is sustained.

    Takes the arguments of :func:`saturation_search` (which explains the stability criterion and
    the search) and returns only its ``scale``.
    """
    return saturation_search(*args, **kwargs).scale


def saturation_search(
    trace: Trace | Sequence[CallRecord],
    models: Mapping[str, str],
    allocation: Allocation,
    latency: LatencyModel,
    rates: Mapping[str, float] | None = None,
    *,
    requests: int = 3000,
    seed: int = 0,
    routing: Routing = "round_robin",
    policy: MemoryPolicy = _DEFAULT_POLICY,
    catalog: Catalog | None = None,
    rel_tol: float = 0.02,
    max_unfinished: float = 0.05,
    max_growth: float = 0.05,
    max_prefill_tokens: int | None = None,
    progress: bool = False,
) -> SaturationResult:
    """The largest stable load ``scale`` (``scale · rates`` req/s is sustained), with details.

    ``rates`` are the workflows' relative rates (default: proportional to their recorded request
    counts). A load is *stable* when a run of ``requests`` Poisson arrivals, stopped one arrival
    window after the last arrival, leaves fewer than ``max_unfinished`` (5%) of the arrivals
    unfinished and the queue does not grow: the time-averaged number of requests in the system
    over the last third of the arrival period exceeds that over the middle third by at most
    ``max_growth`` (5%) of the arrivals in one third. At a rate λ above the true saturation μ
    requests pile up at ``λ − μ``, so the answer lies in about ``[μ, μ / (1 − max_growth)]``
    plus sampling noise. (A latency-ratio test, e.g. "the last third within 1.5x of the middle
    third", passes overloaded runs whose backlog is small next to the requests in flight, and
    runs where many requests share the replicas like processor sharing.) The growth is measured
    against the arrivals, so runs must be long next to the requests in flight: raise
    ``requests`` for workflows with long latencies.

    The first probe saturates the system (all arrivals in a burst) and takes its completion rate
    as the first guess; the bracket around it is widened until it holds a stable and an unstable
    load, then bisected (geometrically) until ``hi / lo < 1 + rel_tol``; ``scale`` is the stable
    end. Every probe uses the same seed, so the arrival pattern only stretches with the scale
    (common random numbers).
    """

    trace = _as_trace(trace)
    if rates is None:
        counts: dict[str, float] = {}
        for w, _ in trace.requests:
            counts[w] = counts.get(w, 0.0) + 1.0
        rel = dict(sorted(counts.items()))
    else:
        rel = _check_rates(rates)
    total_rel = sum(rel.values())
    if not rel_tol > 0:
        raise InputError("saturation_rate", "rel_tol", "a tolerance > 0", rel_tol)
    probes: list[tuple[float, bool]] = []

    def run(scale: float, drain_window: bool = True):
        window = requests / (scale * total_rel)
        return _run(trace, models, allocation, latency, {w: scale * r for w, r in rel.items()},
                    requests, None, seed, routing, policy, catalog, 0.0,
                    window if drain_window else None, max_prefill_tokens, False, False)[4]

    # burst: every arrival within a negligible window; the completion rate approximates μ
    burst = 1e6 * requests / total_rel
    eng = run(burst, drain_window=False)
    ends = [e for e in eng.end if e == e]
    guess = len(ends) / max(max(ends), 1e-12) / total_rel

    def stable(scale: float) -> bool:
        ok = _stable(run(scale), max_unfinished, max_growth)
        probes.append((scale, ok))
        if progress:
            sys.stderr.write(f"\rsaturation_rate: scale {scale:.6g} {'stable' if ok else 'unstable'}"
                             f"  probes {len(probes)} ")
            sys.stderr.flush()
        return ok

    lo, hi = guess * 0.7, guess * 1.4
    while not stable(lo):
        hi, lo = lo, lo / 2
        if lo < guess * 1e-6:
            raise InputError("saturation_rate", "allocation",
                             "an allocation that is stable at some load (none found)")
    while stable(hi):
        lo, hi = hi, hi * 2
        if hi > guess * 1e6:
            break
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if stable(mid):
            lo = mid
        else:
            hi = mid
    if progress:
        sys.stderr.write("\n")
        sys.stderr.flush()
    return SaturationResult(
        scale=lo, rates=MappingProxyType({w: lo * r for w, r in rel.items()}),
        total_rate=lo * total_rel, probes=tuple(probes),
    )
