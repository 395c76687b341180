"""Measured against predicted and simulated: one MuxServe run at a time (docs/validate.md).

Each LLM of a run becomes one instance: its mesh's GPU type, its tensor parallelism, its
weights plus the KV memory the engine lets it hold (:func:`kv_gib`), a batch limit (the mesh's
``max_num_seqs`` where plain vLLM serves it, :data:`ENFORCES_MAX_NUM_SEQS`; what MuxServe's
scheduler gives it elsewhere, :func:`adbs_max_num_seqs`), and
prefill and decode shares from its MPS limits contended by the busy co-runners of its mesh
(:func:`scepsy_profile.mps.contended_shares`, iterated to a fixed point with the busy
fractions the instances predict). Its requests are one-call requests with the LLM's own mean
prompt and output lengths (:meth:`~scepsy_opt.validate.muxserve.MuxRun.lengths`; log-normal,
prompts with a coefficient of variation of 1 and outputs with the calibrated :data:`OUTPUT_CV`,
each clipped to :data:`MAX_TOKENS`), as many as the run measured, arriving over the run's
span at the LLM's rate (:func:`run_arrivals`; each LLM its own random stream,
:func:`llm_seed`).

* **predicted**: the finite-run model on the instance's serving curve
  (:func:`scepsy_opt.validate.finite.finite_run`);
* **simulated**: the discrete-event simulator (``scepsy_opt.prediction.simulate``) replays the same
  requests on the same instance, with the contended shares.

A run's figures are its LLMs' combined: throughput the sum of what each served, mean latency
and p90 TTFT the request-weighted means (weights: the measured request counts).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

import numpy as np

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.prediction.colocation import contend, operating_point, phase_model
from scepsy_opt.prediction.pipeline import instance_curve, llm_demand
from scepsy_opt.prediction.simulate import (
    MeshJobs,
    RequestOutcome,
    SimulationResult,
    simulate,
)
from scepsy_opt.prediction.slo import CallSLO, attained
from scepsy_opt.ratework import RateLLM, RateWorkload, rate_stats, rate_trace
from scepsy_opt.stats import WorkflowStats
from scepsy_opt.traces import CallRecord, Trace, validate_calls
from scepsy_opt.validate.finite import FiniteRun, finite_run, finite_run_recorded
from scepsy_opt.validate.muxserve import (
    GPU,
    MeasuredLLM,
    Mesh,
    MeshLLM,
    MuxRun,
    RecordedLLM,
    RecordedWorkload,
)
from scepsy_opt.workflows import Distribution, ReferenceTimer
from scepsy_profile.catalog import default_catalog
from scepsy_profile.hardware import GIB
from scepsy_profile.latency import LatencyModel
from scepsy_profile.mps import INTERFERENCE, Contended
from scepsy_profile.overheads import call_delay_s, front_delay_s, overload_queued
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import MemoryPolicy, ServingCurve

MAX_TOKENS = 1024
"""The longest prompt and the longest output (tokens; at most half the model's context)."""
OUTPUT_CV = 0.55
"""The coefficient of variation of the output lengths (log-normal around each LLM's mean):
MuxServe's files keep only means, so the shape is calibrated on the shared ChatLMSYS loads
(:func:`scepsy_opt.validate.fit.fit_output_cv`: the 90th and 99th percentile latencies over
the mean of the LLMs that ran alone and did not queue; condense500 alone gives 0.7,
condense2000 alone 0.45, both together 0.55; docs/validate.md, "Calibration")."""
MAX_OUTPUT_CV = 4.0
"""The largest output coefficient of variation accepted."""
ENFORCES_MAX_NUM_SEQS = frozenset({"spatial"})
"""Strategies served by plain vLLM, which keeps a mesh's ``max_num_seqs`` (every measured
spatial decode batch is below it). MuxServe's own engine (``flexsm``, ``temporal``) limits each
LLM to what its scheduler gives it instead (:func:`adbs_max_num_seqs`)."""
STATS_REQUESTS = 2000  # one-call requests behind each LLM's length statistics
SHARING: Mapping[str, str] = MappingProxyType({"spatial": "mps", "flexsm": "jobs",
                                               "temporal": "jobs"})
"""How each strategy's co-located LLMs share a mesh (:func:`scepsy_profile.mps.contended_shares`):
``flexsm`` and ``temporal`` are both MuxServe's scheduler, with other MPS limits (temporal's
100% and 90% leave no two jobs room to run together, so they take turns)."""


@dataclass(frozen=True)
class Figures:
    """One LLM's or one run's figures (seconds, req/s); ``overloaded``: the LLMs (the LLM
    itself, or none, for one LLM's figures) that were overloaded: predicted, a rate at or
    beyond μ; measured, less served than :data:`MEASURED_OVERLOAD` of what the rate gives over
    the run; simulated, a latency that grew over the run (:func:`grew`)."""

    throughput: float
    mean_latency_s: float
    p90_ttft_s: float
    mean_ttft_s: float
    mean_tpot_s: float
    overloaded: tuple[str, ...] = ()
    attainment: float | None = None  # share of requests within the LLM's SLO (None: no SLO)
    attainment_high: float | None = None  # measured: what the percentiles allow at most
    decode_batch: float | None = None
    """Sequences per decode step, the mean over steps (measured: the scheduler's
    ``decoding_avg_batches``; simulated: :attr:`SimulatedLLM.mean_batch`; None where not
    known, and for a run's combined figures)."""


@dataclass(frozen=True)
class RunValidation:
    """One run: measured, predicted and simulated, per LLM and combined, with the shares each
    LLM got."""

    workload: str
    strategy: str
    measured: Figures
    predicted: Figures
    simulated: Figures | None
    llms: Mapping[str, Mapping[str, Figures]]  # LLM -> {"measured"|"predicted"|"simulated"}
    shares: Mapping[str, Contended] = field(default_factory=dict)
    arrivals: str = "poisson"  # or "recorded": the requests of a workload file


@dataclass(frozen=True)
class _LLM:
    name: str
    model: str
    rate: float
    requests: int
    instance: Instance
    policy: MemoryPolicy
    limits: tuple[float, float]


def validate_run(run: MuxRun, latency: LatencyModel, *, simulate_runs: bool = True,
                 seed: int = 0, interference: Mapping[str, float] | None = None,
                 output_cv: float = OUTPUT_CV, recorded: RecordedWorkload | None = None,
                 queued: float | None = None,
                 slos: Mapping[str, CallSLO] | None = None) -> RunValidation:
    """Measured vs predicted (and simulated) for ``run`` with ``latency`` (the module
    docstring); ``queued``: the part of an overload's backlog that waits before its first
    token (None: the engine's, :func:`scepsy_profile.overheads.overload_queued`); ``slos``:
    per LLM, the SLO whose attainment each source reports (predicted: the finite run's TTFT
    distribution, :meth:`FiniteRun.ttft_within`; simulated: its requests; measured: the range
    its percentiles allow, :func:`attainment_measured`); ``recorded``: the load's recorded
    requests, replayed instead of Poisson arrivals (the predictor on
    :func:`~scepsy_opt.validate.finite.finite_run_recorded`, the simulator at the recorded
    times with lengths drawn from the recorded ones)."""
    slos = slos or {}
    if queued is None:
        queued = overload_queued(latency)
    alpha = (interference or {}).get(run.strategy, INTERFERENCE)
    if not (math.isfinite(output_cv) and 0 < output_cv <= MAX_OUTPUT_CV):
        raise InputError("validate", "output_cv", f"a coefficient of variation in (0, "
                         f"{MAX_OUTPUT_CV:g}]", output_cv)
    models = dict(run.models)
    rates = dict(run.rates)
    if recorded is None:
        workload, stats = _lengths(tuple((m, run.models[m], r, *run.lengths(m))
                                         for m, r in run.rates.items()), seed, output_cv)
    else:
        missing = sorted(set(run.rates) - set(recorded.llms))
        if missing:
            raise InputError(recorded.source, "requests", f"requests of every LLM of "
                             f"{run.workload} (none of {', '.join(missing)})")
        rates = {m: recorded.llms[m].rate for m in run.rates}
        workload, stats = _recorded_lengths(run, recorded)
    demands = {m: llm_demand(stats, models, rates, m) for m in run.rates}
    # the KV each LLM can hold: its quota of its mesh's pool, or what its co-runners leave
    # free at their rates (each alone at its own limits with its quota)
    llms: dict[str, _LLM] = {}
    for mesh in run.meshes:
        kv = kv_gib(run, mesh)
        if len(mesh.llms) > 1:
            first = {x.name: _llm(run, mesh, x, kv[x.name], recorded) for x in mesh.llms}
            kv = kv_gib(run, mesh, {k: _held_gib(run, y, demands[k], phase_model(
                latency, Contended(*y.limits, 1.0))) for k, y in first.items()})
        llms.update({x.name: _llm(run, mesh, x, kv[x.name], recorded) for x in mesh.llms})
    shares = contend({mesh.source: [x.name for x in mesh.llms] for mesh in run.meshes},
                     {m: x.limits for m, x in llms.items()}, rates,
                     lambda m, lat: _curve(llms[m], demands[m], lat), latency,
                     SHARING[run.strategy], alpha, field="gpu_memory_utilization (of {llm})")
    per: dict[str, dict[str, Figures]] = {}
    predicted: dict[str, Figures] = {}
    simulated: dict[str, Figures] = {}
    curves: dict[str, ServingCurve] = {}
    outputs: dict[str, float] = {}
    for m, x in llms.items():
        lat = phase_model(latency, shares[m])
        curve = _curve(x, demands[m], lat)
        if not curve.feasible:
            raise InputError(run.mesh_of(m).source, f"gpu_memory_utilization (of {m})",
                             f"a part of the GPUs' memory that holds {x.model}'s weights and "
                             f"one call (its KV cache holds {curve.memory.kv_tokens} tokens)")
        # a float: front_delay_s of scalars
        delay = cast(float, front_delay_s(call_delay_s(latency), curve.prefill_batch))
        own = None if recorded is None else recorded.llms[m]
        fin = (finite_run(curve, x.rate, x.requests, queued, delay) if own is None
               else finite_run_recorded(curve, own.times_s, queued, delay))
        predicted[m] = _of_finite(m, fin, slos.get(m))
        curves[m] = curve
        outputs[m] = run.lengths(m)[1] if own is None else float(np.mean(own.outputs))
        if simulate_runs and not _takes_turns(run, m):
            simulated[m] = _simulated(workload, m, x, lat, curve, seed, slos.get(m),
                                      outputs[m], own)
    if simulate_runs:
        for mesh in run.meshes:
            if _takes_turns(run, mesh.llms[0].name):
                simulated.update(_mesh_simulated(
                    workload, {y.name: llms[y.name] for y in mesh.llms}, mesh.source, latency,
                    curves, seed, slos, outputs, recorded))
    measured = {m: _of_measured(run, m, slos.get(m)) for m in llms}
    for m in llms:
        per[m] = {"measured": measured[m], "predicted": predicted[m]}
        if simulate_runs:
            per[m]["simulated"] = simulated[m]
    weights = {m: float(x.requests) for m, x in llms.items()}
    return RunValidation(
        run.workload, run.strategy, combine(measured, weights), combine(predicted, weights),
        combine(simulated, weights) if simulate_runs else None,
        MappingProxyType({m: MappingProxyType(v) for m, v in sorted(per.items())}),
        MappingProxyType(dict(sorted(shares.items()))),
        "poisson" if recorded is None else "recorded")


MESH_JOBS = frozenset({"flexsm", "temporal"})
"""Strategies whose shared meshes the simulator serves as MuxServe's scheduler does, the LLMs
of a mesh together (:class:`~scepsy_opt.prediction.simulate.MeshJobs`); an LLM alone on its
mesh, and every LLM of the other strategies, is simulated alone at its contended shares."""


def _takes_turns(run: MuxRun, m: str) -> bool:
    return run.strategy in MESH_JOBS and len(run.mesh_of(m).llms) > 1


def combine(per: Mapping[str, Figures], weights: Mapping[str, float]) -> Figures:
    """A run's figures from its LLMs' (the module docstring)."""
    total = sum(weights[m] for m in per)
    if not per or total <= 0:
        raise InputError("validate", "llms", "at least one LLM with requests", dict(weights))

    def mean(key: str) -> float:
        return sum(weights[m] * getattr(f, key) for m, f in per.items()) / total

    def share(key: str) -> float | None:  # over the LLMs with an SLO
        some = {m: getattr(f, key) for m, f in per.items() if getattr(f, key) is not None}
        w = sum(weights[m] for m in some)
        return sum(weights[m] * a for m, a in some.items()) / w if some and w > 0 else None
    return Figures(throughput=sum(f.throughput for f in per.values()),
                   mean_latency_s=mean("mean_latency_s"), p90_ttft_s=mean("p90_ttft_s"),
                   mean_ttft_s=mean("mean_ttft_s"), mean_tpot_s=mean("mean_tpot_s"),
                   overloaded=tuple(sorted((m for m, f in per.items() if f.overloaded),
                                           key=_natural)),
                   attainment=share("attainment"), attainment_high=share("attainment_high"))


def decoding_ratio(f: Figures, output_mean: float) -> float | None:
    """The requests decoding on average over the mean decode batch of one LLM's figures
    ``f``: Little's law, throughput x ``output_mean`` (tokens) x mean TPOT, over
    :attr:`Figures.decode_batch`. 1 where every decoding request is in every decode step and
    the count decoding holds steady; above 1 where that count swings over the run (a mean
    over steps weighs the many short steps of small batches) or requests wait between steps
    (docs/validate.md, "Results on the shared loads"). None without a decode batch."""
    if f.decode_batch is None or not f.decode_batch > 0:
        return None
    return f.throughput * output_mean * f.mean_tpot_s / f.decode_batch


def _natural(name: str) -> tuple[str, int]:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


@functools.lru_cache(maxsize=16)
def _lengths(llms: tuple[tuple[str, str, float, float, float], ...], seed: int,
             output_cv: float = OUTPUT_CV) -> tuple[RateWorkload, Mapping[str, WorkflowStats]]:
    """The one-call workload of a run's LLMs ``(name, model, rate, mean prompt, mean
    output)`` and its length
    statistics, kept for the next run with the same LLMs (the strategies of one load share
    them, and a fit validates each run at every grid point: the statistics are nearly all of
    a prediction's time)."""
    cat = default_catalog()
    specs = {}
    for m, model, rate, prompt_mean, output_mean in llms:
        most = min(MAX_TOKENS, cat.model(model).max_context // 2)
        specs[m] = RateLLM(model, rate,
                           Distribution.lognormal(prompt_mean, 1.0, min=1, max=most),
                           Distribution.lognormal(output_mean, output_cv, min=1, max=most))
    workload = RateWorkload("muxserve", specs, reference_gpu=GPU)
    return workload, rate_stats(workload, STATS_REQUESTS, seed)


def kv_pool_gib(mesh: Mesh) -> float:
    """The KV pool of ``mesh`` on each of its GPUs (GiB): MuxServe sizes it as the mesh's
    ``gpu_memory_utilization`` of each GPU's memory, on top of the weights its LLMs load."""
    return mesh.memory_utilization * default_catalog().gpu(GPU).memory_gib


BLOCK_TOKENS = 16
"""Tokens per KV block of MuxServe's engine (its default ``block_size``)."""


def kv_gib(run: MuxRun, mesh: Mesh, held_gib: Mapping[str, float] | None = None
           ) -> dict[str, float]:
    """Each LLM of ``mesh``: the KV memory per GPU (GiB) it can hold, as the engine gives it
    (docs/validate.md, "Memory").

    One LLM alone on a mesh has the whole pool (:func:`kv_pool_gib`). LLMs sharing a mesh
    share one pool of KV blocks (MuxServe's unified, head-wise KV cache): the engine starts by
    giving each LLM the same number of tokens (the pool split in proportion to each LLM's KV
    bytes per token per GPU) and then moves free blocks to the LLMs that run out. An LLM can
    hold its starting quota, or what its co-runners leave free on average (the pool less what
    they hold, ``held_gib``; without it, the quota), whichever is more."""
    cat = default_catalog()
    pool = kv_pool_gib(mesh)
    if len(mesh.llms) == 1:
        return {mesh.llms[0].name: pool}
    per_token = {x.name: cat.model(run.models[x.name]).kv_bytes_per_token_per_gpu(x.tp) / GIB
                 for x in mesh.llms}
    tokens = pool / sum(per_token.values())  # the same tokens for every LLM at the start
    quota = {m: tokens * v for m, v in per_token.items()}
    if held_gib is None:
        return quota
    return {m: max(q, pool - sum(v for k, v in held_gib.items() if k != m))
            for m, q in quota.items()}


def adbs_max_num_seqs(run: MuxRun, mesh: Mesh) -> dict[str, int]:
    """Each LLM of ``mesh``: the most calls MuxServe's scheduler (ADBS) runs at once, as it
    starts (docs/validate.md, "Memory"): the pool split in proportion to each LLM's rate times
    its KV bytes per token per GPU, in tokens, over the workload's mean call (mean prompt plus
    mean output, each truncated to whole tokens, in whole blocks of :data:`BLOCK_TOKENS`), at
    least one. It replaces the ``max_num_seqs`` of the placement files."""
    cat = default_catalog()
    per_call = max(1, (int(run.prompt_mean) + int(run.output_mean)) // BLOCK_TOKENS)
    pool = kv_pool_gib(mesh)
    per_token = {x.name: cat.model(run.models[x.name]).kv_bytes_per_token_per_gpu(x.tp) / GIB
                 for x in mesh.llms}
    weight = {m: run.rates[m] * k for m, k in per_token.items()}
    total = sum(weight.values())
    return {m: max(1, int(pool * weight[m] / total / per_token[m]) // BLOCK_TOKENS // per_call)
            for m in per_token}


def _llm(run: MuxRun, mesh: Mesh, m: MeshLLM, kv: float,
         recorded: RecordedWorkload | None = None) -> _LLM:
    cat = default_catalog()
    spec, gpu = cat.model(run.models[m.name]), cat.gpu(GPU)
    weights = spec.weight_bytes_per_gpu(m.tp) / GIB
    memory = min(1.0, (weights + kv) / gpu.memory_gib)
    limit = (mesh.max_num_seqs if run.strategy in ENFORCES_MAX_NUM_SEQS
             else adbs_max_num_seqs(run, mesh)[m.name])
    policy = MemoryPolicy(reserve_fraction=0.0, reserve_gib=0.0, max_batch=limit)
    inst = Instance(GPU, m.tp, m.decode_pct / 100.0, 1, memory)
    own = None if recorded is None else recorded.llms[m.name]
    rate, requests = ((run.rates[m.name], run.measured[m.name].requests) if own is None
                      else (own.rate, len(own.times_s)))
    return _LLM(m.name, run.models[m.name], rate, requests, inst, policy,
                (m.prefill_pct / 100.0, m.decode_pct / 100.0))


def _held_gib(run: MuxRun, x: _LLM, demand: object, latency: LatencyModel) -> float:
    """The KV memory per GPU (GiB) ``x`` holds on average at its rate: the calls its serving
    curve has in service, each holding its prompt and half its output."""
    curve = _curve(x, demand, latency)
    if not curve.feasible:
        return 0.0
    batch, _ = operating_point(curve, x.rate)
    prompt, output = run.lengths(x.name)
    per_token = default_catalog().model(x.model).kv_bytes_per_token_per_gpu(x.instance.tp) / GIB
    return batch * (prompt + output / 2.0) * per_token


def _curve(x: _LLM, demand: object, lat: LatencyModel) -> ServingCurve:
    return instance_curve(demand, lat, x.instance.gpu, x.instance.tp,  # type: ignore[arg-type]
                          x.instance.share, policy=x.policy, memory_share=x.instance.memory)


def _of_finite(m: str, f: FiniteRun, slo: CallSLO | None) -> Figures:
    share = None if slo is None else attained(slo, f.ttft_within, f.mean_tpot_s)
    return Figures(f.throughput, f.mean_latency_s, f.p90_ttft_s, f.mean_ttft_s, f.mean_tpot_s,
                   (m,) if f.overloaded else (), share, share)


def attainment_measured(slo: CallSLO, x: MeasuredLLM) -> tuple[float, float]:
    """The share of a measured LLM's requests within ``slo``, as far as its percentiles tell:
    ``(at least, at most)``. A bound between two known percentiles (TTFT: p90, p99; TPOT: p90)
    puts that share between them; both bounds hold together for at least the sum of the two
    shares less one (and at most the smaller)."""
    lo, hi = 1.0, 1.0
    for bound, points in ((slo.ttft_s, ((0.9, x.p90_ttft_s), (0.99, x.p99_ttft_s))),
                          (slo.tpot_s, ((0.9, x.p90_tpot_s),))):
        if bound is None:
            continue
        below = [q for q, v in points if v <= bound]
        above = [q for q, v in points if v > bound]
        one_lo, one_hi = (max(below) if below else 0.0), (min(above) if above else 1.0)
        lo, hi = max(0.0, lo + one_lo - 1.0), min(hi, one_hi)
    return lo, hi


MEASURED_OVERLOAD = 0.9
"""A measured LLM was overloaded when it served less than this fraction of what its rate gives
over the run, ``N / (N/λ + p90 latency)`` (the last requests about as late as the 90th
percentile; MuxServe records no completion times), or when its requests waited in front of the
engine: a mean TTFT above :data:`MEASURED_QUEUE` of its mean latency. Both are heuristics."""
MEASURED_QUEUE = 0.25


def _of_measured(run: MuxRun, m: str, slo: CallSLO | None) -> Figures:
    x = run.measured[m]
    lo, hi = attainment_measured(slo, x) if slo is not None else (None, None)
    latency = x.mean_latency_s(run.lengths(m)[1])
    short = x.throughput < MEASURED_OVERLOAD * x.requests / (x.requests / run.rates[m]
                                                             + x.p90_latency_s)
    queued = x.ttft_mean_s > MEASURED_QUEUE * latency
    return Figures(x.throughput, latency, x.p90_ttft_s, x.ttft_mean_s, x.tpot_mean_s,
                   (m,) if short or queued else (), lo, hi, x.decode_batch)


def _simulated(workload: RateWorkload, m: str, x: _LLM, lat: LatencyModel,
               curve: ServingCurve, seed: int, slo: CallSLO | None, output_mean: float,
               recorded: RecordedLLM | None = None) -> Figures:
    """The simulated figures of ``x`` served alone at its contended shares (``lat``), defined
    as MuxServe measures them (:func:`_figures`)."""
    trace, times = _llm_requests(workload, m, x, seed, recorded)
    res = simulate(trace, {m: x.model}, Allocation({m: x.instance}), lat, {m: x.rate},
                   requests=x.requests, seed=llm_seed(seed, m), policy=x.policy,
                   warmup_fraction=0.0, record_events=True, arrival_times_s=times.tolist())
    return _figures(res, trace, m, x, lat, curve, slo, output_mean)


def _llm_requests(workload: RateWorkload, m: str, x: _LLM, seed: int,
                  recorded: RecordedLLM | None) -> tuple[Trace, np.ndarray]:
    """The requests the simulator replays for ``x``: a trace of one-call requests to draw
    from, and the arrival times (each LLM its own draws, :func:`llm_seed`)."""
    own = llm_seed(seed, m)
    if recorded is None:
        one = RateWorkload(workload.name, {m: workload.llms[m]}, reference_gpu=GPU)
        return (rate_trace(one, min(x.requests, STATS_REQUESTS), own),
                run_arrivals(x.requests, x.rate, own))
    # the recorded times; each request's lengths drawn from the recorded ones
    return _recorded_trace(m, x.model, recorded), np.asarray(recorded.times_s, dtype=float)


def _mesh_simulated(workload: RateWorkload, xs: Mapping[str, _LLM], mesh: str,
                    latency: LatencyModel, curves: Mapping[str, ServingCurve], seed: int,
                    slos: Mapping[str, CallSLO], outputs: Mapping[str, float],
                    recorded: RecordedWorkload | None = None) -> dict[str, Figures]:
    """The simulated figures of the LLMs of one shared mesh, served together as MuxServe's
    scheduler runs them (:class:`~scepsy_opt.prediction.simulate.MeshJobs`: each prefill and
    decode step holds SM parts at the LLM's own MPS limits; a waiting prefill holds the
    decodes). Each LLM replays the same requests as when it is simulated alone
    (:func:`_llm_requests`, drawn as :func:`simulate` draws them), at their arrival times."""
    calls: list[CallRecord] = []
    for m, x in xs.items():
        pool, times = _llm_requests(workload, m, x, seed, None if recorded is None
                                    else recorded.llms[m])
        templates = [recs[0] for (w, _), recs in pool.requests.items() if w == m]
        picks = np.random.default_rng(llm_seed(seed, m)).random(len(times))
        for j, (t, u) in enumerate(zip(times.tolist(), picks.tolist(), strict=True)):
            c = templates[min(int(u * len(templates)), len(templates) - 1)]
            calls.append(CallRecord(m, f"a{j}", "c0", t, t + (c.end_s - c.start_s), llm=m,
                                    input_tokens=c.input_tokens,
                                    output_tokens=c.output_tokens))
    trace = validate_calls(calls)
    alloc = Allocation({m: Instance(x.instance.gpu, x.instance.tp, x.limits[1], 1,
                                    x.instance.memory, x.limits[0]) for m, x in xs.items()})
    lats = {m: phase_model(latency, Contended(*x.limits, 1.0)) for m, x in xs.items()}
    policy = next(iter(xs.values())).policy
    limits = {m: x.policy.max_batch for m, x in xs.items()}
    if len(set(limits.values())) > 1:  # one policy per run: each LLM its own batch limit
        policy = dataclasses.replace(policy, max_batch=max(limits.values()))
    res = simulate(trace, {m: x.model for m, x in xs.items()}, alloc, latency, None,
                   policy=policy, warmup_fraction=0.0, record_events=True, latencies=lats,
                   mesh_jobs=MeshJobs({m: mesh for m in xs}), batch_limits=limits)
    return {m: _figures(res, trace, m, x, lats[m], curves[m], slos.get(m), outputs[m],
                        workflow=m)
            for m, x in xs.items()}


def _figures(res: SimulationResult, trace: Trace, m: str, x: _LLM, lat: LatencyModel,
             curve: ServingCurve, slo: CallSLO | None, output_mean: float,
             workflow: str | None = None) -> Figures:
    """LLM ``m``'s figures in a simulated run, defined as MuxServe measures them (its
    scheduler's statistics): TTFT to the end of the prefill, TPOT each request's decode time
    over its output tokens (the mean of those ratios), mean latency as the measured one
    (:meth:`MeasuredLLM.mean_latency_s`: mean TTFT plus mean TPOT times the mean output),
    throughput the requests over the last completion since the run began. ``workflow``: only
    the requests of this workflow (a run of several LLMs)."""
    mine = [k for k, r in enumerate(res.requests) if workflow is None or r.workflow == workflow]
    reqs = [res.requests[k] for k in mine if res.requests[k].end_s is not None]
    if not reqs:
        return Figures(0.0, math.inf, math.inf, math.inf, math.inf, (m,))
    last = max(r.end_s for r in reqs if r.end_s is not None)
    lat_s = np.array([r.latency_s for r in reqs], dtype=float)
    log = res.call_log or ()
    pre = float(res.llms[m].mean_prefill_batch) or 1.0
    prefill = float(lat.prefill_ms(x.model, x.instance.gpu, x.instance.tp, x.instance.share,
                                   pre, curve.input_tokens)) / 1e3
    # MuxServe's definitions (its scheduler's log_stats): TTFT to the end of the prefill,
    # TPOT a request's decode time over its output tokens, throughput the requests over
    # the last completion since the run began (t = 0)
    done = []  # (TTFT, latency, output tokens) of each completed request
    for e in log:
        req = res.requests[e.arrival]
        if e.llm == m and e.start_s is not None and req.end_s is not None:
            done.append((e.start_s - req.arrival_s + prefill, req.end_s - req.arrival_s,
                         _output_tokens(trace, req)))
    ttft = np.array([d[0] for d in done], dtype=float)
    tpot = np.array([max(d[1] - d[0], 0.0) / d[2] for d in done], dtype=float)
    thr = len(reqs) / last if last > 0 else 0.0
    share = None if slo is None else _simulated_attainment(slo, res, trace, prefill, m)
    unfinished = len(mine) - len(reqs)
    return Figures(thr, float(ttft.mean() + tpot.mean() * output_mean),
                   float(np.percentile(ttft, 90)), float(ttft.mean()), float(tpot.mean()),
                   (m,) if unfinished > 0 or grew(lat_s) else (), share, share,
                   float(res.llms[m].mean_batch))


def _recorded_trace(m: str, model: str, recorded: RecordedLLM) -> Trace:
    """One-call requests of LLM ``m`` (``model``) with the recorded prompt and output tokens,
    each lasting its zero-load time on one :data:`GPU`, as generated traces time their calls
    (:func:`~scepsy_opt.workflows.reference_timer`, without jitter)."""
    timer = ReferenceTimer({m: model}, GPU, roofline_model(), 0.0)
    calls: list[CallRecord] = []
    t = 0.0
    for i, (p, o) in enumerate(zip(recorded.prompts, recorded.outputs, strict=True)):
        d = float(timer.zero_load_s(m, p, o))
        calls.append(CallRecord(m, f"r{i}", "c0", t, t + d, llm=m, input_tokens=p,
                                output_tokens=o))
        t += d
    return validate_calls(calls)


def _recorded_lengths(run: MuxRun, recorded: RecordedWorkload,
                      ) -> tuple[RateWorkload, Mapping[str, WorkflowStats]]:
    """The one-call workload of a run's LLMs with the recorded requests' lengths, and its
    statistics over exactly those requests."""
    specs: dict[str, RateLLM] = {}
    calls: list[CallRecord] = []
    for m in run.rates:
        own = recorded.llms[m]
        specs[m] = RateLLM(run.models[m], own.rate, Distribution.choice(own.prompts),
                           Distribution.choice(own.outputs))
        calls.extend(_recorded_trace(m, run.models[m], own).calls)
    workload = RateWorkload("muxserve", specs, reference_gpu=GPU)
    return workload, rate_stats(workload, trace=validate_calls(calls))


def llm_seed(seed: int, llm: str) -> int:
    """The seed of ``llm``'s own draws (arrivals and lengths) in a run validated with ``seed``:
    every LLM its own stream, the same on every machine (CRC-32 of its name)."""
    return (seed * 1_000_003 + zlib.crc32(llm.encode())) % (2**31)


def run_arrivals(requests: int, rate: float, seed: int) -> np.ndarray:
    """``requests`` arrival times over the run's span ``requests / rate`` (s): a Poisson
    process conditioned on its count, i.e. sorted uniform times over the span. A measured
    run's rate is its count over its span, so the replay keeps both (an unconditioned stream
    of ``requests`` arrivals ends ``±√requests / rate`` away from the span)."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.uniform(0.0, requests / rate, size=requests))


def _output_tokens(trace: Trace, req: RequestOutcome) -> int:
    """The output tokens of a simulated one-call request (at least one)."""
    return max(int(trace.requests[(req.workflow, req.request_id)][0].output_tokens), 1)


def _simulated_attainment(slo: CallSLO, res: SimulationResult, trace: Trace,
                          prefill_s: float, llm: str) -> float:
    """The share of the simulated requests of ``llm`` within ``slo``: each call's TTFT (its
    admission less its arrival, plus its group's prefill) and TPOT (the rest of its latency
    over its output tokens less one); unfinished requests miss it."""
    ok = 0
    for e in res.call_log or ():
        req = res.requests[e.arrival]
        if e.llm != llm or e.start_s is None or req.end_s is None:
            continue
        ttft = e.start_s - req.arrival_s + prefill_s
        out = trace.requests[(req.workflow, req.request_id)][0].output_tokens
        tpot = max(req.end_s - req.arrival_s - ttft, 0.0) / max(out - 1.0, 1.0)
        ok += ((slo.ttft_s is None or ttft <= slo.ttft_s)
               and (slo.tpot_s is None or tpot <= slo.tpot_s))
    n = sum(1 for r in res.requests if r.workflow == llm)
    return ok / n if n else 0.0


GROWTH = 2.0
"""A run whose last quarter of requests took this many times longer than its first quarter
(request latency) was overloaded: its latency grew with the run's length."""


def grew(latencies: np.ndarray) -> bool:
    """Whether the latencies (in arrival order) of the last quarter average :data:`GROWTH`
    times those of the first quarter or more."""
    q = len(latencies) // 4
    if q < 1:
        return False
    return float(np.mean(latencies[-q:])) >= GROWTH * float(np.mean(latencies[:q]))
