"""The Aggregate LLM Pipeline: predicted workflow throughput and latency for an allocation.

Every LLM ``m`` is one stage. For workflows ``w`` arriving at rates ``λ_w`` (req/s), LLM ``m``
receives ``λ_m = Σ_w λ_w · n_wm`` calls/s, split evenly over its ``r_m`` replicas; each replica is
the serving curve of its instance (``scepsy_profile.serving``) for the mean input and output
tokens of the calls it receives (the call-rate-weighted mixture over workflows and roles).

* **Throughput.** All rates scale together; LLM ``m`` saturates at ``s_m = r_m·μ_m / ℓ_m`` and
  workflow ``w``'s maximum throughput is ``T_w = λ_w · min_{m ∈ w} s_m`` over the LLMs ``w``
  uses (workflows sharing no LLM are independent); ``throughput = min(λ_w, T_w)``. The
  load ``ℓ_m`` (:func:`llm_load`) is the call rate ``λ_m`` in the paper's form and, in the
  critical-path form, the larger of ``λ_m`` and the station's work ``Λ·p̄`` (below): exactly where
  each form's latency becomes infinite. For a single serial workflow both are the paper's
  ``T_w = min_m r_m·μ_m / n_m``. The optimiser's capacity (``max_utilisation``) is the same
  utilisation ``ℓ_m / (r_m·μ_m)`` (:func:`utilisation`, :func:`min_replicas`,
  :func:`carried_scale`).
* **Latency, the paper's form** (``form="paper"``): ``L_w = Σ_m L_m(λ_m/r_m) · n_wm / p_wm``:
  every LLM's calls run in ``n/p`` sequential rounds, stages one after another, tools ignored.
* **Latency, refined** (``form="critical-path"``, the default): ``L_w = Σ_m Σ_c k_wmc · L_mc +
  τ_w``, where ``k_wmc`` is LLM ``m``'s (role ``c``'s) time on the request's critical path in
  units of its mean call (the path runs through the slowest of concurrent calls) and ``τ_w`` the
  mean tool time on it. This is the paper's form when a
  workflow is a serial chain, and goes beyond it where the traces show concurrency between
  different LLMs (their calls are off the critical path), long tool calls, and one LLM used in
  two roles with different token lengths (each role ``c`` gets its own call latency ``L_mc`` on
  the shared instance, instead of one average).

Calls a request issues concurrently (a reranker's fan-out, a beam's candidates) reach the
instance together and are prefilled as one group: the serving curve's ``prefill_batch`` is the
LLM's mean concurrency ``p`` (call-rate weighted over workflows).

**Queueing of requests, not of calls** (:func:`station_latency`, the critical-path form). Calls
do not arrive as a Poisson stream: a request keeps ``p`` calls in flight at an LLM for as long as
it works there (a beam search of 6 to 211 steps), so the load comes in long bursts. Each LLM is
therefore a processor-sharing station whose jobs are the requests visiting it (BCMP): with ``N``
requests at the LLM, its ``r`` replicas each serve ``b = N·p/r`` calls and a request's call group
takes ``κ·s(b)`` (``s(b)`` the serving curve's in-service time at batch ``b``, ``κ`` the
slowest-of-the-group factor from the critical path), so ``N`` is a birth-death chain with
``π(N)/π(N−1) = (Λ·p/r) / λ(b)`` — ``Λ`` the LLM's critical-path call rate ``Σ_w λ_w·k_wm``,
``λ(b)`` the curve's call throughput — and its rate is ``x/μ`` once ``b`` reaches the batch limit
(calls then queue). By Little's law the LLM's mean call latency on the critical path is
``E[N]/Λ``. This distribution is insensitive to the heavy tail of the requests' work
(processor sharing) and reduces to the serving curve's zero-load latency as ``λ → 0``; it
replaces the per-call M/M/c wait, which saw a Poisson stream of calls and missed the bursts
(beam-search latency error 24-31% → 11-13%, docs/benchmarks.md).

**Prefill-only LLMs** (one output token: rerankers, reward models) are not processor sharing:
each iteration prefills every queued call and all finish together, so
:func:`batch_prefill_latency` (an M/G/1 queue served in gated batches, with the prompts'
variability) replaces the station for them. **Per-call delay**: every call's latency gains the
engine's pure delay ``call_delay_s(latency)`` (calibrated overheads; 0 without), waited in turn
by the calls of a fan-out that reach one replica (``front_delay_s``: ``delay·(g + 1)/2``).
**Percentiles** of the request latency come from the trace's critical paths
(``scepsy_opt.prediction.tails``).

Per-class latency on a shared
instance: the mixture's latency scaled by the class's own work,
``T_c = T_mix · (P(g, I_c) + (O_c − 1)·d) / (P(g, I_mix) + (O_mix − 1)·d)`` at the load's batch and
prefill group (:func:`class_latencies`, shared with the optimiser). The simulator
(``scepsy_opt.prediction.simulate``) measures both forms' errors (benchmarks/predictor_accuracy.py,
docs/benchmarks.md). The paper's form keeps the paper's per-call latency (the serving curve's
mean in-service time plus an M/M/c wait at the call rate).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, check_allocation
from scepsy_opt.prediction.colocation import contend, phase_model
from scepsy_opt.prediction.tails import (
    QUANTILES,
    backlog_waits,
    latency_quantiles,
    recorded_latencies,
)
from scepsy_opt.stats import WorkflowStats, split_stats
from scepsy_profile.catalog import Catalog
from scepsy_profile.latency import LatencyModel
from scepsy_profile.overheads import call_delay_s, front_delay_s
from scepsy_profile.serving import MemoryPolicy, ServingCurve, kv_demand, serving_curves

Form = Literal["paper", "critical-path"]
FORMS: tuple[Form, ...] = ("paper", "critical-path")


@dataclass(frozen=True)
class LLMLoad:
    """What one LLM sees: call rate, token mixture, and its serving curve's answers."""

    llm: str
    model: str
    rate: float  # calls/s over all replicas
    replicas: int
    input_mean: float
    output_mean: float
    mu: float  # calls/s per replica
    utilisation: float  # load / (replicas · mu), the load of :func:`llm_load` (saturated at 1)
    call_latency_s: float  # mean over its calls at this load, call delay included (inf when saturated)
    preemptions_per_call: float = 0.0  # the serving curve's, at the per-replica call rate
    overloaded: bool = False  # the serving curve's verdict at the per-replica call rate
    ttft_s: float = math.nan  # mean time to first token, call delay included (inf: saturated)
    tpot_s: float = math.nan  # mean time per output token after the first (inf: saturated)


@dataclass(frozen=True)
class WorkflowPrediction:
    """Predicted throughput, maximum throughput and latency (mean and percentiles) of one workflow.

    ``max_throughput`` is the rate at which the first LLM the workflow uses saturates when every
    workflow's rate scales together (``bottleneck`` is that LLM); ``throughput`` is
    ``min(rate, max_throughput)`` and ``saturated`` says whether the rate reaches it. The
    percentiles are NaN where they are not predicted (the paper's form)."""

    workflow: str
    rate: float
    max_throughput: float
    bottleneck: str
    mean_latency_s: float
    form: Form
    throughput: float = math.nan
    saturated: bool = False
    p50_latency_s: float = math.nan
    p90_latency_s: float = math.nan
    p99_latency_s: float = math.nan


@dataclass(frozen=True)
class Prediction:
    workflows: Mapping[str, WorkflowPrediction]
    llms: Mapping[str, LLMLoad]


def _classes(st: WorkflowStats, llm: str) -> list[tuple[float, float, float, float]]:
    """(calls per request, critical-path weight, input mean, output mean) per role.

    The weight is the LLM's time on the critical path in units of its mean call: the path runs
    through the slowest of concurrent calls, so it is more than the count of calls on it
    whenever calls of one LLM fan out (a beam's candidates).
    """
    s = st.llms[llm]
    weight = s.critical_s / s.mean_call_s if s.mean_call_s > 0 else s.critical_calls
    classes = list(s.classes)
    if not classes:
        return [(s.n, weight, s.input_mean, s.output_mean)]
    total = sum(c.n for c in classes) or 1.0
    return [(c.n, weight * c.n / total, c.input_mean, c.output_mean) for c in classes]


@dataclass(frozen=True)
class LLMDemand:
    """What the workflows ask of one LLM at given rates: its calls, their mixture and roles.

    ``parts`` are ``(calls/s, input mean, output mean)`` per (workflow, role); ``group`` is the
    call-rate-weighted mean concurrency of its calls within a request (they are prefilled
    together); ``terms`` are ``(workflow, critical-path weight, input mean, output mean)``: how
    much of each workflow's latency one mean call of each role is.
    """

    llm: str
    model: str
    rate: float
    input_mean: float
    output_mean: float
    group: float
    parts: tuple[tuple[float, float, float], ...]
    terms: tuple[tuple[str, float, float, float], ...]
    critical_rate: float  # Σ_w λ_w · k_wm: critical-path calls per second (units of a mean call)
    output_sq_mean: float | None = None  # E[O²] of the mixture (None: O constant)
    io_mean: float | None = None  # E[I·O] of the mixture (None: input_mean · output_mean)
    input_sq_mean: float | None = None  # E[I²] of the mixture (None: I constant)
    longest_tokens: float = 0.0  # the longest call (prompt + output) of any workflow; 0: unknown

    @property
    def input_scv(self) -> float:
        """Squared coefficient of variation of the calls' input tokens (0 when unknown)."""
        if self.input_sq_mean is None or self.input_mean <= 0:
            return 0.0
        return max(self.input_sq_mean / self.input_mean ** 2 - 1.0, 0.0)


def _moments(st: WorkflowStats, llm: str) -> list[tuple[float, float, float, float]]:
    """(calls per request, E[O²], E[I·O], E[I²]) per role: ``std² + mean²`` of the token counts
    and ``input mean · output mean`` (the trace's statistics carry no covariance)."""
    s = st.llms[llm]
    classes = list(s.classes)
    if not classes:
        return [(s.n, s.output_std ** 2 + s.output_mean ** 2, s.input_mean * s.output_mean,
                 s.input_std ** 2 + s.input_mean ** 2)]
    return [(c.n, c.output_std ** 2 + c.output_mean ** 2, c.input_mean * c.output_mean,
             c.input_std ** 2 + c.input_mean ** 2) for c in classes]


def llm_demand(stats: Mapping[str, WorkflowStats], models: Mapping[str, str],
               rates: Mapping[str, float], llm: str) -> LLMDemand:
    """The load workflows at ``rates`` (req/s) put on ``llm`` (see :class:`LLMDemand`)."""
    return _demand([(w, st) for w, st in stats.items() if llm in st.llms], models, rates, llm)


def llm_demands(stats: Mapping[str, WorkflowStats], models: Mapping[str, str],
                rates: Mapping[str, float], llms: Iterable[str]) -> dict[str, LLMDemand]:
    """:func:`llm_demand` of each of ``llms``, in one pass over the workflows (the same
    figures, computed in the same order: linear in the workflows and LLMs, where one call per
    LLM scans every workflow)."""
    callers: dict[str, list[tuple[str, WorkflowStats]]] = {}
    for w, st in stats.items():
        for m in st.llms:
            callers.setdefault(m, []).append((w, st))
    return {m: _demand(callers.get(m, []), models, rates, m) for m in llms}


def _demand(calling: Sequence[tuple[str, WorkflowStats]], models: Mapping[str, str],
            rates: Mapping[str, float], llm: str) -> LLMDemand:
    """:func:`llm_demand` from the workflows that call ``llm`` (``calling``, in ``stats``'
    order)."""
    live = [(w, st) for w, st in calling if rates.get(w, 0.0) > 0]
    parts = tuple((rates[w] * n, i, o) for w, st in live for n, _, i, o in _classes(st, llm))
    lam = sum(p[0] for p in parts)
    conc = [(rates[w] * st.llms[llm].n, st.llms[llm].p) for w, st in live]
    group = sum(x * c for x, c in conc) / lam if lam > 0 else 1.0
    i_mix = sum(p[0] * p[1] for p in parts) / lam if lam > 0 else parts[0][1]
    o_mix = sum(p[0] * p[2] for p in parts) / lam if lam > 0 else parts[0][2]
    terms = tuple((w, k, i, o) for w, st in live for _, k, i, o in _classes(st, llm))
    crit = sum(rates[w] * k for w, st in live for _, k, _, _ in _classes(st, llm))
    mom = [(rates[w] * n, *m) for w, st in live for n, *m in _moments(st, llm)]
    sq_mix, io_mix, isq_mix = (
        sum(row[0] * row[j] for row in mom) / lam if lam > 0 else mom[0][j] for j in (1, 2, 3))
    longest = max((st.llms[llm].longest_tokens for _, st in calling), default=0.0)
    return LLMDemand(llm, models[llm], lam, i_mix, o_mix, group, parts, terms, crit,
                     sq_mix, io_mix, isq_mix, longest)


def instance_curve(demand: LLMDemand, latency: LatencyModel, gpu: str, tp: int, share: float,
                   *, catalog: Catalog | None = None,
                   policy: MemoryPolicy | None = None,
                   memory_share: float | None = None) -> ServingCurve:
    """The serving curve of one replica of ``demand.llm`` on (gpu, tp, share), holding
    ``memory_share`` of each GPU's memory (None: ``share``, tied)."""
    return instance_curves(demand, latency, gpu, tp, [share], catalog=catalog, policy=policy,
                           memory_shares=None if memory_share is None else [memory_share])[0]


def instance_curves(demand: LLMDemand, latency: LatencyModel, gpu: str, tp: int,
                    shares: Sequence[float], *, catalog: Catalog | None = None,
                    policy: MemoryPolicy | None = None,
                    memory_shares: Sequence[float] | None = None) -> list[ServingCurve]:
    """:func:`instance_curve` for several shares at once (one latency query per phase); the
    output-length moments of the demand go to the curve (its KV occupancy). ``memory_shares``:
    one memory share per share (None: tied to the shares)."""
    sq, io = _curve_moments(demand)
    return serving_curves(latency, demand.model, gpu, tp, shares, max(demand.input_mean, 1.0),
                          max(demand.output_mean, 1.0), catalog=catalog,
                          policy=policy or MemoryPolicy(), prefill_batch=max(demand.group, 1.0),
                          output_sq_mean=sq, io_mean=io, memory_shares=memory_shares,
                          longest_tokens=demand.longest_tokens)


def _curve_moments(demand: LLMDemand) -> tuple[float | None, float | None]:
    """(E[O²], E[I·O]) as the serving curve takes them: at least ``O²`` and positive (token
    counts below 1 are read as 1, as the curve's means are); None where the demand has none."""
    i, o = max(demand.input_mean, 1.0), max(demand.output_mean, 1.0)
    sq = None if demand.output_sq_mean is None else max(demand.output_sq_mean, o * o)
    io = None if demand.io_mean is None else (demand.io_mean if demand.io_mean > 0 else i * o)
    return sq, io


def decode_context(demand: LLMDemand) -> float:
    """The mean context of a running call, the serving curve's: ``(E[I·O] + E[O²]/2) / O``, a
    call holding ``I + O/2`` tokens on average over its ``O`` steps, weighted by those steps
    (``I + O/2`` for constant lengths)."""
    sq, io = _curve_moments(demand)
    return kv_demand(max(demand.input_mean, 1.0), max(demand.output_mean, 1.0), MemoryPolicy(),
                     sq, io).ctx


def curve_preemptions(curve: ServingCurve, rate: float) -> tuple[float, bool]:
    """(preemptions per call, overloaded) of ``curve`` at the per-replica call rate ``rate``.

    Overloaded (the curve's verdict): predicted preemptions above the policy's threshold, or the
    rate reaches ``μ``; an infeasible curve is ``(inf, True)``."""
    if not curve.feasible:
        return math.inf, True
    return float(curve.preemptions_per_call(rate)), bool(curve.overloaded(rate))


# --------------------------------------------------------------------------- capacity

SATURATION_REL = 1e-12  # a utilisation within this of 1 is saturation (rounding at μ)


def llm_load(demand: LLMDemand, form: Form = "critical-path") -> float:
    """The call rate (calls/s) that an LLM's replicas must carry: the one measure of its load
    against their capacity ``r·μ``, for the predictor's throughput, the optimiser's candidates,
    max-scale and the baselines alike.

    Critical-path form: ``max(λ, Λ·p̄)``. The station (module docstring) is stable if and only if
    ``Λ·p̄/r < μ``: a request keeps ``p̄`` calls in flight through its ``Λ``-weighted work, so
    slow members of a call group (``κ > 1``) and workflows of different concurrency sharing the
    LLM (``p̄`` is their call-rate-weighted mean) load it beyond its call rate ``λ``; and no
    replica carries more than ``μ`` calls/s, whatever the critical path. ``Λ·p̄`` within
    :data:`SATURATION_REL` of ``λ`` (a serial chain, up to rounding) is ``λ``.
    Paper's form: ``λ`` (its call latency diverges at ``λ/r = μ``).

    Linear in the rates: scaling every workflow's rate by ``s`` scales the load by ``s``.
    """
    lam = demand.rate
    if form == "paper" or demand.critical_rate <= 0:
        return lam
    work = demand.critical_rate * max(demand.group, 1.0)
    return work if work > lam * (1.0 + SATURATION_REL) else lam


def utilisation(load: float, mu: float, replicas: ArrayLike) -> Any:
    """``load / (r·μ)``: the fraction of ``r`` replicas' capacity that ``load`` (calls/s,
    :func:`llm_load`) uses; ``inf`` where ``μ = 0`` (the instance does not fit) and the load is
    positive. Vectorised over ``replicas``."""
    if isinstance(replicas, int | float):  # the scalar path, as fast as the formula
        return 0.0 if load <= 0 else load / (replicas * mu) if mu > 0 else math.inf
    shape = np.shape(replicas)
    if load <= 0:
        return np.zeros(shape)
    if mu <= 0:
        return np.full(shape, math.inf)
    return load / (np.asarray(replicas, dtype=float) * mu)


def saturated(util: ArrayLike) -> Any:
    """Whether a utilisation (:func:`utilisation`) saturates the station: ``≥ 1`` up to
    :data:`SATURATION_REL`. The predicted latency is finite exactly where this is False."""
    if isinstance(util, int | float):
        return util >= 1.0 - SATURATION_REL
    return np.asarray(util, dtype=float) >= 1.0 - SATURATION_REL


def min_replicas(load: float, mu: float, max_utilisation: float) -> int:
    """The fewest replicas of an instance of saturation throughput ``μ`` that carry ``load`` at
    ``max_utilisation`` (``utilisation ≤ max_utilisation``, never saturated); 1 at zero load."""
    if load <= 0:
        return 1
    if mu <= 0:
        raise ValueError("min_replicas: an instance with μ = 0 carries no load")

    def carries(r: int) -> bool:
        u = utilisation(load, mu, r)
        return u <= max_utilisation and not saturated(u)

    r = max(1, math.ceil(load / (max_utilisation * mu) - 1e-12))
    while r > 1 and carries(r - 1):
        r -= 1
    while not carries(r):
        r += 1
    return r


def replicas_needed(load: np.ndarray, mu: np.ndarray, max_utilisation: float) -> np.ndarray:
    """:func:`min_replicas` of many (load, μ) pairs at once (μ > 0), by the same rule: the
    fewest replicas, at least 1, whose utilisation is at most ``max_utilisation`` and not
    saturated."""
    load = np.asarray(load, dtype=float)
    mu = np.asarray(mu, dtype=float)

    def carries(r: np.ndarray) -> np.ndarray:
        util = load / (r * mu)
        return (util <= max_utilisation) & ~(util >= 1.0 - SATURATION_REL)

    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.maximum(1.0, np.ceil(load / (max_utilisation * mu) - 1e-12))
        while True:
            down = (r > 1) & carries(np.maximum(r - 1, 1.0))
            up = ~carries(r)
            if not (down.any() or up.any()):
                break
            r = r - down + (up & ~down)
    return np.where(load <= 0, 1.0, r)


def carried_scale(load: float, mu: float, replicas: float, max_utilisation: float = 1.0) -> float:
    """The largest factor of ``load`` that ``replicas`` × ``μ`` carry at ``max_utilisation``:
    ``u·r·μ/load`` (``inf`` at zero load). At ``max_utilisation = 1`` it is the factor at which
    the station saturates (the predictor's maximum throughput)."""
    if load <= 0:
        return math.inf
    return max_utilisation * replicas * mu / load


STATION_NODES = 64  # chain states (or blocks of states) summed per replica count


def station_latency(curve: ServingCurve, demand: LLMDemand, replicas: ArrayLike) -> NDArray[np.float64]:
    """Mean call latency (s) of ``demand`` on ``replicas`` replicas of ``curve``, requests queued
    as jobs of a processor-sharing station (module docstring); ``inf`` at or beyond saturation.

    Vectorised over ``replicas`` (``inf`` prices the zero-load floor). The chain's mass lies
    around its mode ``N̂ = b̂·r/p`` (``λ(b̂) = Λp/r``, the mean-value batch) within ten standard
    deviations ``σ = (−dℓ/dN)^(−1/2)``, ``ℓ`` the log ratio: the sum runs over the states there
    one by one, or in at most :data:`STATION_NODES` equal blocks (midpoint rule) when the window
    is wider, plus the geometric tail beyond the batch limit. Where the chain stays below one
    call per replica (a Poisson chain, mean ``Λ·s(1)``, ten standard deviations inside) the
    answer is exactly the zero-load ``s(1)``: no sum.
    """
    return station_latencies(demand, [curve], [replicas])[0]


def station_latencies(demand: LLMDemand, curves: Sequence[ServingCurve],
                      replicas: Sequence[ArrayLike]) -> list[NDArray[np.float64]]:
    """:func:`station_latency` for several curves of one demand at once: one array pass over
    every (curve, replica count) pair (the optimiser prices thousands per LLM)."""
    rs = [np.atleast_1d(np.asarray(r, dtype=float)) for r in replicas]
    outs = [np.full(r.shape, math.inf) for r in rs]
    lam_c = demand.critical_rate
    p = max(demand.group, 1.0)
    load = llm_load(demand)
    todo: list[tuple[int, NDArray[np.intp]]] = []
    for j, (c, r) in enumerate(zip(curves, rs, strict=True)):
        if not c.feasible:
            continue
        fin = np.isfinite(r)
        outs[j][~fin] = c.zero_load_latency_s
        # finite exactly below saturation (llm_load: the call rate and the station's work)
        ok = fin & ~np.asarray(saturated(utilisation(load, c.mu, r)), dtype=bool)
        if lam_c <= 0:  # no call of this LLM on any critical path: the call stream alone
            outs[j][ok] = np.asarray(c.latency_s(demand.rate / r[ok]), dtype=float)
            continue
        # below one call per replica (N ≤ r/p) the ratio is Λ·s(1)/N: a Poisson chain; with
        # its mass inside (mean + 10 sd + 3 states), E[N]/Λ is exactly s(1)
        s1 = float(c.service_ms[0]) / 1e3
        m0 = lam_c * s1
        light = ok & (m0 + 10.0 * math.sqrt(m0) + 3.0 <= r / p)
        outs[j][light] = s1
        idx = np.flatnonzero(ok & ~light)
        if len(idx):
            todo.append((j, idx))
    if not todo:
        return outs
    # one row per (curve, replica count); each curve's λ(b) at whole batches, padded with μ
    width = max(curves[j].max_batch for j, _ in todo) + 2
    table = np.empty((len(todo), width))
    for k, (j, _) in enumerate(todo):
        rates = curves[j]._table[1]
        table[k, :len(rates)] = rates
        table[k, len(rates):] = rates[-1]
    which = np.concatenate([np.full(len(idx), k) for k, (_, idx) in enumerate(todo)])
    ro = np.concatenate([rs[j][idx] for j, idx in todo])
    bmax = np.array([float(curves[j].max_batch) for j, _ in todo])[which]
    xo = lam_c * p / ro
    flat = table.ravel()
    base = which * width  # row offsets into the flattened tables

    def lam_at(b: NDArray[np.float64]) -> NDArray[np.float64]:
        """λ(b) per row, linear between whole batches (b ≤ the row's batch limit)."""
        i = np.clip(np.floor(b).astype(int), 0, width - 2)
        at = (base if b.ndim == 1 else base[:, None]) + i
        lo_v = flat[at]
        return lo_v + (b - i) * (flat[at + 1] - lo_v)

    per_state = p / ro  # batch per replica added by one more request
    n_cap = bmax / per_state  # requests that fill every replica's batch
    # the mean-value batch: λ(b̂) = x on the first segment that reaches x
    seg = np.concatenate([np.searchsorted(curves[j]._table[1], xo[which == k], side="left") - 1
                          for k, (j, _) in enumerate(todo)])
    seg = np.clip(seg, 0, bmax.astype(int) - 1)
    l0, l1 = flat[base + seg], flat[base + seg + 1]
    rise = l1 - l0
    b_mode = seg + np.where(rise > 0, (xo - l0) / np.where(rise > 0, rise, 1.0), 1.0)
    b_mode = np.clip(b_mode, 0.0, bmax)
    curv = rise / xo * per_state  # −dℓ/dN at the mode
    sigma = np.where(curv > 0, 1.0 / np.sqrt(np.maximum(curv, 1e-300)), np.inf)
    mode = b_mode / per_state
    lo = np.floor(np.maximum(0.0, mode - 10.0 * sigma - 2.0))
    hi = np.minimum(mode + 10.0 * sigma + 2.0, n_cap + 1.0)
    hi = np.maximum(hi, lo + 1.0)
    # each row's own block count (never its batch-mates'): the answer is a function of the row
    nodes = np.minimum(STATION_NODES, np.ceil(hi - lo)).astype(int)
    h = np.maximum(1.0, (hi - lo) / nodes)
    jj = np.arange(1, int(nodes.max()) + 1, dtype=float)[None, :]
    inside = jj <= nodes[:, None]
    ends = lo[:, None] + jj * h[:, None]  # last state of each block
    mid = ends - (h[:, None] - 1.0) / 2.0  # the block's mean state
    lam_b = lam_at(np.minimum(mid * per_state[:, None], bmax[:, None]))
    ell = np.where(inside, np.log(xo[:, None] / lam_b), 0.0)
    logpi = np.cumsum(h[:, None] * ell, axis=1)  # log π(end of block) − log π(lo)
    log_mass = np.where(inside, logpi - (h[:, None] - 1.0) / 2.0 * ell + np.log(h[:, None]),
                        -np.inf)
    top = np.maximum(log_mass.max(axis=1), 0.0)
    w = np.exp(log_mass - top[:, None])
    w_lo = np.exp(-top)
    # beyond the last block every state multiplies by its ratio (x/μ past the batch limit)
    last = lo + nodes * h
    q = np.minimum(xo / lam_at(np.minimum((last + 1.0) * per_state, bmax)), 1.0 - 1e-12)
    w_end = np.exp(logpi[:, -1] - top)
    tail_mass = w_end * q / (1.0 - q)
    tail_n = w_end * (last * q / (1.0 - q) + q / (1.0 - q) ** 2)
    # sequential row sums (cumsum): the padding zeros of a shorter row change no rounding
    mass_n = np.cumsum(w * np.where(inside, mid, 0.0), axis=1)[:, -1]
    mean_n = (mass_n + w_lo * lo + tail_n) / (np.cumsum(w, axis=1)[:, -1] + w_lo + tail_mass)
    at = 0
    for j, idx in todo:
        outs[j][idx] = mean_n[at:at + len(idx)] / lam_c
        at += len(idx)
    return outs


def batch_prefill_latency(curve: ServingCurve, demand: LLMDemand,
                          replicas: ArrayLike) -> NDArray[np.float64]:
    """Mean call latency (s) of a prefill-only LLM (one output token: a reranker, a reward
    model) served in gated batches; ``inf`` at or beyond ``μ``. Vectorised over ``replicas``.

    Each iteration prefills every call queued when it starts, and all of them finish together
    at its end. Per replica, groups of ``g = max(1, p̄/r)`` calls (round robin deals a request's
    ``p̄`` concurrent calls out over the ``r`` replicas; work ``S = p(g, I)``, squared
    coefficient of variation ``c²`` of the calls' input tokens) arrive at ``x = λ/r`` calls/s,
    ``ρ = x/μ``. The unfinished work is Pollaczek-Khinchine's
    ``V = ρ·S·(1 + c²) / (2(1 − ρ))``; an arrival waits for the iteration in progress
    (``R = V/(1 + ρ)``: ``V`` is that residual plus the ``ρ·R`` queued since it began) and then
    for its own iteration, everything that arrived during the previous one
    (``ρ·(age + R) + S``): ``L = S + V·(1 + 2ρ)/(1 + ρ)``. The processor-sharing station
    (:func:`station_latency`) lets small calls pass large ones; a prefill is atomic, so long
    prompts hold up everyone queued behind them.
    """
    r = np.atleast_1d(np.asarray(replicas, dtype=float))
    out = np.full(r.shape, math.inf)
    if not curve.feasible:
        return out
    fin = np.isfinite(r)
    rho = np.where(fin, demand.rate / np.where(fin, r, 1.0), 0.0) / curve.mu
    # round robin deals a group's calls out over the replicas: max(1, p̄/r) calls each
    g = np.maximum(1.0, curve.prefill_batch / np.where(fin, r, math.inf))
    s = np.where(g == curve.prefill_batch, curve.zero_load_latency_s,
                 np.asarray(curve.latency_model.prefill_ms(
                     curve.model, curve.gpu, curve.tp, curve.share, g, curve.input_tokens),
                     dtype=float) * np.ones(r.shape) / 1e3)
    ok = rho < 1.0
    v = rho[ok] * s[ok] * (1.0 + demand.input_scv) / (2.0 * (1.0 - rho[ok]))
    out[ok] = s[ok] + v * (1.0 + 2.0 * rho[ok]) / (1.0 + rho[ok])
    return out


ClassLatencies = tuple[NDArray[np.float64], dict[tuple[float, float], NDArray[np.float64]]]


def class_latencies(demand: LLMDemand, curve: ServingCurve, latency: LatencyModel,
                    replicas: ArrayLike) -> ClassLatencies:
    """Mean call latency of the mixture and of each (input, output) class, per replica count.

    Vectorised over ``replicas`` (the optimiser prices every replica count of a candidate at
    once). A class's latency on the shared instance is the mixture's, scaled by the class's own
    work: ``T_c = T_mix · (P(g, I_c) + (O_c − 1)·d) / (P(g, I_mix) + (O_mix − 1)·d)`` at the batch
    ``B`` and prefill group ``g(B)`` of the load. Every latency includes the engine's pure delay
    per call, ``call_delay_s(latency)`` (0 without overheads).
    """
    return class_latencies_many(demand, [curve], latency, [replicas])[0]


def class_latencies_many(demand: LLMDemand, curves: Sequence[ServingCurve], latency: LatencyModel,
                         replicas: Sequence[ArrayLike]) -> list[ClassLatencies]:
    """:func:`class_latencies` for several curves of one (model, gpu, tp): one latency query
    per phase and class for all of them."""
    rs = [np.atleast_1d(np.asarray(r, dtype=float)) for r in replicas]
    out: list[ClassLatencies] = [
        (np.full(r.shape, math.inf), {(i, o): np.full(r.shape, math.inf) for _, i, o in demand.parts})
        for r in rs]
    live = [j for j, c in enumerate(curves) if c.feasible]
    if not live:
        return out
    mixes, bs, shares = [], [], []
    stations = station_latencies(demand, [curves[j] for j in live], [rs[j] for j in live])
    for j, mix in zip(live, stations, strict=True):
        c, r = curves[j], rs[j]
        per_replica = demand.rate / r
        if c.output_tokens <= 1.0:  # every call one prefill: gated batches, not shared
            mix = np.where(np.isfinite(mix), batch_prefill_latency(c, demand, r), mix)
        ok = np.isfinite(mix) & (per_replica > 0)
        b = np.ones(r.shape)
        if np.any(ok):
            b[ok] = np.maximum(c.batch_at_rate(per_replica[ok]), 1.0)
        mixes.append(mix)
        bs.append(b)
        shares.append(np.full(r.shape, c.share))
    c0 = curves[live[0]]
    b = np.concatenate(bs)
    share = np.concatenate(shares)
    k = np.concatenate([np.full(rs[j].shape, curves[j].prefill_batch) for j in live])
    g = np.maximum(k, np.maximum(b, 1.0) / c0.output_tokens)
    ctx = decode_context(demand)
    d = np.asarray(latency.decode_ms(c0.model, c0.gpu, c0.tp, share, b, ctx), float) * np.ones(b.shape)
    p_mix = np.asarray(latency.prefill_ms(c0.model, c0.gpu, c0.tp, share, g, c0.input_tokens),
                       float) * np.ones(b.shape)
    mix_all = np.concatenate(mixes)
    mix_work = p_mix + (c0.output_tokens - 1.0) * d
    per_class: dict[tuple[float, float], NDArray[np.float64]] = {}
    for _, i, o in demand.parts:
        if (i, o) in per_class:
            continue
        if abs(i - c0.input_tokens) < 1e-9 and abs(o - c0.output_tokens) < 1e-9:
            per_class[(i, o)] = mix_all
            continue
        p_c = np.asarray(latency.prefill_ms(c0.model, c0.gpu, c0.tp, share, g, max(i, 1.0)),
                         float) * np.ones(b.shape)
        per_class[(i, o)] = mix_all * (p_c + (max(o, 1.0) - 1.0) * d) / mix_work
    delay = call_delay_s(latency)
    if delay:  # a pure delay per call, outside the engine (inf stays inf), waited in turn by
        # the calls of a group (front_delay_s)
        waits = [front_delay_s(delay, curves[j].prefill_batch, rs[j]) for j in live]
        mixes = [m + w for m, w in zip(mixes, waits, strict=True)]
        wait_all = np.concatenate(waits)
        per_class = {key: v + wait_all for key, v in per_class.items()}
    bounds = np.cumsum([0] + [len(rs[j]) for j in live])
    for n, j in enumerate(live):
        lo, hi = bounds[n], bounds[n + 1]
        out[j] = (mixes[n], {key: v[lo:hi] for key, v in per_class.items()})
    return out


def served(stats: Mapping[str, WorkflowStats], models: Mapping[str, str],
           allocation: Allocation) -> tuple[Mapping[str, WorkflowStats], Mapping[str, str]]:
    """``stats`` and ``models`` as the allocation serves them: an LLM it splits over replica
    groups (``Allocation.splits``) becomes its groups, each with its fraction of the calls
    (:func:`scepsy_opt.stats.split_stats`) and the LLM's model; one routed by prompt length
    (``Allocation.lengths``) becomes its groups each with the statistics of its range's calls
    (the statistics must then come from a trace)."""
    if not allocation.splits:
        return stats, models
    return ({w: split_stats(st, allocation.splits, allocation.lengths)
             for w, st in stats.items()}, allocation.models(models))


def phase_latencies(stats: Mapping[str, WorkflowStats], models: Mapping[str, str],
                    allocation: Allocation, latency: LatencyModel, rates: Mapping[str, float],
                    *, catalog: Catalog | None = None, policy: MemoryPolicy | None = None,
                    ) -> dict[str, LatencyModel]:
    """The latency model of every LLM of ``allocation`` that has its own prefill limit or
    shares a mesh (``Instance.prefill_share``, ``Instance.mesh``): ``latency`` at the shares
    its limits get from the busy co-runners of its mesh at ``rates``
    (:func:`scepsy_opt.prediction.colocation.contend`). The others are left out (``latency`` as is).
    ``stats`` and ``models`` as the allocation serves them (:func:`served`)."""
    used = {m for w, st in stats.items() if rates.get(w, 0.0) > 0 for m in st.llms}
    phased = {m for m, i in allocation.llms.items()
              if m in used and (i.mesh is not None or i.prefill_share is not None)}
    if not phased:
        return {}
    demands = {m: llm_demand(stats, models, rates, m) for m in phased}

    def curve_of(m: str, lat: LatencyModel) -> ServingCurve:
        inst = allocation.llms[m]
        return instance_curve(demands[m], lat, inst.gpu, inst.tp, inst.share, catalog=catalog,
                              policy=policy, memory_share=inst.memory)
    groups: dict[str, list[str]] = {}
    for m in sorted(phased):
        groups.setdefault(allocation.llms[m].mesh or f"(alone) {m}", []).append(m)
    shares = contend(groups, {m: allocation.llms[m].phase_shares for m in phased},
                     {m: demands[m].rate for m in phased}, curve_of, latency,
                     source=allocation.source)
    return {m: phase_model(latency, c) for m, c in shares.items()}


def predict(
    stats: Mapping[str, WorkflowStats],
    models: Mapping[str, str],
    allocation: Allocation,
    latency: LatencyModel,
    rates: Mapping[str, float],
    *,
    form: Form = "critical-path",
    catalog: Catalog | None = None,
    policy: MemoryPolicy | None = None,
    arrival_times_s: Sequence[float] | None = None,
    seed: int = 0,
) -> Prediction:
    """Predict every workflow's throughput, maximum throughput, mean latency and latency
    percentiles at ``rates`` (req/s), and every LLM's load (see :class:`WorkflowPrediction`).
    ``arrival_times_s``: recorded request arrival times (s, sorted from 0); the latency
    percentiles and mean are then those of the recorded arrivals, each adding the backlog its
    bursts build at every LLM on its critical path (:func:`recorded_quantiles`; ``seed``: the
    draw of each arrival's workflow and request).
    An LLM the allocation splits over replica groups (``Allocation.splits``) is predicted as
    its groups, each with its fraction of the calls (:func:`scepsy_opt.stats.split_stats`), or
    with its range's calls when routed by length (``Allocation.lengths``);
    the loads are the groups'. LLMs that share a mesh under MPS limits are predicted at the
    shares they get from each other (:func:`phase_latencies`)."""
    stats, models = served(stats, models, allocation)
    if form not in FORMS:
        raise InputError("predict", "form", f"one of {list(FORMS)}", form)
    for w, r in rates.items():
        if w not in stats:
            raise InputError("rates", w, f"a workflow of the trace ({sorted(stats)})", w)
        if not (math.isfinite(r) and r >= 0):
            raise InputError("rates", w, "a rate >= 0 (req/s)", r)
    if not any(rates.get(w, 0.0) > 0 for w in stats):
        raise InputError("rates", "", "a positive rate for at least one workflow", dict(rates))
    used = sorted({m for w, st in stats.items() if rates.get(w, 0.0) > 0 for m in st.llms})
    for m in used:
        if m not in allocation.llms:
            raise InputError(allocation.source, f"llms.{m}",
                             "an instance for every LLM the workflows call")
        if m not in models:
            raise InputError("workflow", f"llms.{m}", "the catalog model this LLM runs")
    check_allocation(allocation, {m: models[m] for m in used}, catalog=catalog, policy=policy)
    own = phase_latencies(stats, models, allocation, latency, rates, catalog=catalog,
                          policy=policy)

    loads: dict[str, LLMLoad] = {}
    class_lat: dict[tuple[str, float, float], float] = {}
    paper_call: dict[str, float] = {}
    headroom: dict[str, float] = {}  # the factor of the rates at which each LLM saturates
    for m in used:
        inst = allocation.llms[m]
        lat = own.get(m, latency)
        dem = llm_demand(stats, models, rates, m)
        curve = instance_curve(dem, lat, inst.gpu, inst.tp, inst.share, catalog=catalog,
                               policy=policy, memory_share=inst.memory)
        if not curve.feasible:  # the model fits, but not one call of this workload's length
            field_ = "memory" if inst.memory is not None else "share"
            raise InputError(allocation.source, f"llms.{m}.{field_}", f"a share of {inst.gpu} whose "
                             f"KV cache holds one call of {m} ({curve.memory.kv_tokens} tokens "
                             f"fit; calls average {dem.input_mean + dem.output_mean:.0f})",
                             inst.memory_share)
        mix, per_class = class_latencies(dem, curve, lat, [inst.replicas])
        load = llm_load(dem, form)
        util = utilisation(load, curve.mu, inst.replicas)
        wait = float(front_delay_s(call_delay_s(lat), curve.prefill_batch, inst.replicas))
        paper_call[m] = (float(curve.latency_s(dem.rate / inst.replicas)) + wait
                         if curve.feasible else math.inf)
        per_replica = dem.rate / inst.replicas
        pre, over = curve_preemptions(curve, per_replica)
        loads[m] = LLMLoad(m, models[m], dem.rate, inst.replicas, dem.input_mean,
                           dem.output_mean, curve.mu, util, float(mix[0]), pre, over,
                           curve.ttft_s(per_replica) + wait,
                           curve.tpot_s(per_replica))
        headroom[m] = carried_scale(load, curve.mu, inst.replicas)
        for (i, o), v in per_class.items():
            class_lat[(m, i, o)] = float(v[0])

    recorded = (None if arrival_times_s is None or form != "critical-path" else
                _recorded_draws(stats, rates, loads, arrival_times_s, seed))
    out: dict[str, WorkflowPrediction] = {}
    for w, st in stats.items():
        r = rates.get(w, 0.0)
        if r <= 0:
            continue
        # all rates scale together: w saturates with the first LLM it uses
        bottleneck = min(st.llms, key=lambda m: (headroom[m], m))
        scale = headroom[bottleneck]
        total = 0.0
        unit: dict[str, float] = {}  # critical-path-weighted mean call latency per LLM
        for m in st.llms:
            s = st.llms[m]
            if form == "paper":
                total += paper_call[m] * s.n / max(s.p, 1e-12)
            else:
                ks = [(k, class_lat[(m, i, o)]) for _, k, i, o in _classes(st, m)]
                total += sum(k * lat for k, lat in ks)
                weight = sum(k for k, _ in ks)
                unit[m] = (sum(k * lat for k, lat in ks) / weight if weight > 0
                           else loads[m].call_latency_s)
        if form == "critical-path":
            total += st.tool_critical_s
        qs = _quantiles(st, unit) if form == "critical-path" else (math.nan,) * len(QUANTILES)
        if recorded is not None and w in recorded[0]:
            total, qs = recorded_quantiles(st, unit, total, *recorded[0][w], recorded[1])
        sat = bool(saturated(1.0 / scale)) if scale > 0 else True
        max_t = r * scale
        out[w] = WorkflowPrediction(w, r, max_t, bottleneck, total, form, min(r, max_t), sat, *qs)
    return Prediction(workflows=out, llms=loads)


def _recorded_draws(stats: Mapping[str, WorkflowStats], rates: Mapping[str, float],
                    loads: Mapping[str, LLMLoad], times_s: Sequence[float], seed: int,
                    ) -> tuple[dict[str, tuple[NDArray[np.int64], NDArray[np.int64]]],
                               dict[str, NDArray[np.float64]]]:
    """Each workflow's recorded arrivals (indices into ``times_s``) and the trace requests they
    replay (uniform row draws), each arrival's workflow drawn in proportion to ``rates``; and
    per LLM, each arrival's wait behind the backlog the times build at the LLM's throughput
    (:func:`~scepsy_opt.prediction.tails.backlog_waits`: the LLM carries ``replicas·μ``
    calls/s, ``rate/Λ`` calls a request), less the LLM's mean call latency: the batch runs a
    backlog it drains within that time alongside the call, so only the rest is a wait."""
    t = np.asarray(times_s, dtype=float)
    if t.ndim != 1 or len(t) < 1 or not np.all(np.isfinite(t)) or np.any(t < 0) or np.any(
            np.diff(t) < 0):
        raise InputError("predict", "arrival_times_s", "sorted arrival times >= 0 (s)")
    names = [w for w in stats if rates.get(w, 0.0) > 0]
    total = math.fsum(rates[w] for w in names)
    rng = np.random.default_rng(seed)
    which = rng.choice(len(names), size=len(t), p=[rates[w] / total for w in names])
    pick = rng.random(len(t))
    draws = {}
    for i, w in enumerate(names):
        idx = np.flatnonzero(which == i)
        paths = stats[w].paths
        if len(idx) and paths is not None and paths.requests:
            rows = np.minimum((pick[idx] * paths.requests).astype(np.int64), paths.requests - 1)
            draws[w] = (idx, rows)
    waits = {}
    for m, load in loads.items():
        carried = load.replicas * load.mu * total / load.rate if load.rate > 0 else math.inf
        behind = (backlog_waits(t, carried) if math.isfinite(carried) and carried > 0
                  else np.zeros(len(t)))
        # a backlog the batch drains within a call's own latency runs with it, not before it
        own = load.call_latency_s if math.isfinite(load.call_latency_s) else 0.0
        waits[m] = np.maximum(behind - own, 0.0)
    return draws, waits


def recorded_quantiles(st: WorkflowStats, unit: Mapping[str, float], mean_s: float,
                       idx: NDArray[np.int64], rows: NDArray[np.int64],
                       waits: Mapping[str, NDArray[np.float64]],
                       ) -> tuple[float, tuple[float, ...]]:
    """The mean latency and :data:`QUANTILES` of a workflow's recorded arrivals (indices
    ``idx``, replaying trace requests ``rows``): each its request's predicted latency plus its
    backlog waits (:func:`~scepsy_opt.prediction.tails.recorded_latencies`); the mean is the
    steady state's ``mean_s`` plus the arrivals' mean wait. Infinite where an LLM on the
    paths is saturated."""
    paths = st.paths
    if paths is None or not paths.requests:  # no request to replay: the steady state's
        return mean_s, _quantiles(st, unit)
    if not all(math.isfinite(unit.get(m, 0.0)) for m in paths.llms):
        return mean_s, (math.inf,) * len(QUANTILES)
    lat = recorded_latencies(paths, unit, rows, {m: w[idx] for m, w in waits.items()})
    base = recorded_latencies(paths, unit, rows, {})
    pct = np.percentile(lat, QUANTILES)
    return mean_s + float(np.mean(lat - base)), tuple(float(x) for x in pct)


def _quantiles(st: WorkflowStats, unit: Mapping[str, float]) -> tuple[float, ...]:
    """The request latency's :data:`QUANTILES` from the workflow's critical paths
    (``scepsy_opt.prediction.tails``); inf when an LLM on them is saturated, NaN without path data."""
    paths = st.paths
    if paths is None or not paths.requests:
        return (math.nan,) * len(QUANTILES)
    if not all(math.isfinite(unit.get(m, 0.0)) for m in paths.llms):
        return (math.inf,) * len(QUANTILES)
    return tuple(float(q) for q in latency_quantiles(paths, unit, qs=QUANTILES))
