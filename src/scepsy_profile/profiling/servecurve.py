"""The serving curve measured the paper's way, and its comparison with the derived one.

:func:`sweep_rates` offers calls to a running OpenAI-compatible server at increasing Poisson
rates (geometric steps from ``start_rate``) and records, per rate, the offered and achieved
throughput, the end-to-end latency, the time to first token and the time per output token, both
as the client saw them and as the server measured them (``/metrics`` histogram deltas: on a small
CPU the server's are the ones to trust), the preemptions and the failures. It stops at
saturation: the achieved throughput falls below ``saturation_ratio`` × offered, the mean latency
exceeds ``latency_factor`` × the lowest rate's, calls queue at nearly every poll of the server's
waiting gauge, or too many calls fail. Between the last unsaturated rate and the first saturated
one it then bisects ``refine_steps`` times, so that the curve is measured close to its knee, and
measures the loads of ``fill_fractions`` (30/60/90% of the measured saturation) that lie above
every unsaturated rate measured, so that the comparison has a measured value there.

:func:`measure_serving_curve` does all of it on a ``vllm serve`` it starts and stops
(:mod:`scepsy_profile.profiling.server`), and :func:`save_result` stores the
:class:`ServeCurveResult` as JSON (atomically) next to the step profile.

:func:`compare_with_step_profile` builds the curve that :func:`~scepsy_profile.serving.serving_curve`
derives from a step profile (a fitted latency model of the same model and device) for the same
mean lengths, and reports the error of the saturation throughput, of the mean latency at 30, 60
and 90 % of the measured saturation, and a breakdown by term (zero-load latency, prefill vs the
time to first token, decode step vs the time per output token, batch in service vs the server's
running gauge) that says which term of the serving model is off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from scepsy_common.errors import InputError, validated
from scepsy_common.files import atomic_write_text, parse_json, read_text
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.hardware import GIB
from scepsy_profile.latency import LatencyModel
from scepsy_profile.profiling.devices import host_device_spec
from scepsy_profile.profiling.models import EngineModel, profiled_name
from scepsy_profile.profiling.replay import (
    CallResult,
    LengthDist,
    ReplayTimeouts,
    poisson_schedule,
    replay,
)
from scepsy_profile.profiling.server import (
    MetricsSnapshot,
    ServerConfig,
    histogram_delta,
    parse_metrics,
    vllm_server,
)
from scepsy_profile.serving import MemoryPolicy, serving_curve

SERVER_HISTOGRAMS = {
    "e2e": "vllm:e2e_request_latency_seconds",
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
}
"""Server-side histograms kept per rate (short name: vLLM metric)."""

PREEMPTIONS = "vllm:num_preemptions_total"
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """How the rates are chosen and when the sweep stops (module docstring)."""

    start_rate: float = 0.5
    factor: float = 1.5
    max_rates: int = 12
    calls_per_rate: int = 60
    min_duration_s: float = 0.0
    """Each rate runs at least this long (more calls at high rates)."""
    warmup_calls: int = 5
    """Calls at the start of each rate left out of the client-side statistics."""
    saturation_ratio: float = 0.9
    latency_factor: float = 10.0
    waiting_fraction: float = 0.8
    max_failure_fraction: float = 0.2
    refine_steps: int = 2
    fill_fractions: tuple[float, ...] = (0.3, 0.6, 0.9)
    """Loads (fractions of the measured saturation) the comparison reports: after the knee,
    each one above the highest unsaturated rate measured is measured too, so that it is
    interpolated, not extrapolated."""
    poll_s: float = 0.5
    timeouts: ReplayTimeouts = field(default_factory=ReplayTimeouts)

    def __post_init__(self) -> None:
        checks = (("start_rate", 0.0, None), ("factor", 1.0, None), ("saturation_ratio", 0.0, 1.0),
                  ("latency_factor", 1.0, None), ("waiting_fraction", 0.0, 1.0),
                  ("max_failure_fraction", 0.0, 1.0), ("poll_s", 0.0, None))
        for name, lo, hi in checks:
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > lo
                    and (hi is None or v <= hi)):
                want = f"a number in ({lo:g}, {hi:g}]" if hi is not None else f"a number > {lo:g}"
                raise InputError("serve-curve plan", name, want, v)
        for name, lo in (("max_rates", 1), ("calls_per_rate", 2), ("warmup_calls", 0),
                         ("refine_steps", 0)):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= lo):
                raise InputError("serve-curve plan", name, f"an integer >= {lo}", v)
        if not all(isinstance(f, (int, float)) and 0 < f < 1 for f in self.fill_fractions):
            raise InputError("serve-curve plan", "fill_fractions", "fractions in (0, 1)",
                             self.fill_fractions)
        if self.warmup_calls >= self.calls_per_rate:
            raise InputError("serve-curve plan", "warmup_calls",
                             f"fewer than calls_per_rate ({self.calls_per_rate})",
                             self.warmup_calls)
        if not (math.isfinite(self.min_duration_s) and self.min_duration_s >= 0):
            raise InputError("serve-curve plan", "min_duration_s", "a number >= 0",
                             self.min_duration_s)


@dataclass(frozen=True, slots=True)
class Stats:
    """Mean, median and 90th percentile of one quantity (seconds), over ``n`` observations."""

    n: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None

    @classmethod
    def of(cls, xs: Sequence[float]) -> Stats:
        if not xs:
            return cls(n=0)
        a = np.asarray(xs, dtype=float)
        return cls(n=len(a), mean=float(a.mean()), p50=float(np.quantile(a, 0.5)),
                   p90=float(np.quantile(a, 0.9)))

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "p50": self.p50, "p90": self.p90}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Stats:
        return cls(n=int(d["n"]), mean=d.get("mean"), p50=d.get("p50"), p90=d.get("p90"))


@dataclass(frozen=True, slots=True)
class ServeCurvePoint:
    """What one offered rate gave (rates in calls/s, times in seconds)."""

    rate: float
    """The nominal Poisson rate."""
    offered_rate: float
    """The rate actually sent: calls / (send span + one mean gap)."""
    achieved_rate: float
    """Completed calls / (last completion − first send)."""
    calls: int
    completed: int
    failures: dict[str, int]
    client: dict[str, Stats]
    """``e2e``, ``ttft``, ``tpot`` over completed calls after the warm-up ones."""
    server: dict[str, Stats]
    """``/metrics`` histogram deltas over the whole rate (:data:`SERVER_HISTOGRAMS`); p50/p90
    interpolated within buckets."""
    preemptions: float = 0.0
    mean_running: float | None = None
    mean_waiting: float | None = None
    waiting_fraction: float | None = None
    """Share of the gauge polls with a call waiting."""
    saturated: bool = False
    reason: str = ""
    wall_s: float = 0.0

    def latency(self, quantity: str = "e2e") -> float | None:
        """The mean of ``quantity``, from the server when it measured it, else the client."""
        s = self.server.get(quantity)
        if s is not None and s.mean is not None:
            return s.mean
        c = self.client.get(quantity)
        return c.mean if c is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate, "offered_rate": self.offered_rate,
            "achieved_rate": self.achieved_rate, "calls": self.calls,
            "completed": self.completed, "failures": dict(sorted(self.failures.items())),
            "client": {k: v.to_json() for k, v in sorted(self.client.items())},
            "server": {k: v.to_json() for k, v in sorted(self.server.items())},
            "preemptions": self.preemptions, "mean_running": self.mean_running,
            "mean_waiting": self.mean_waiting, "waiting_fraction": self.waiting_fraction,
            "saturated": self.saturated, "reason": self.reason, "wall_s": self.wall_s,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServeCurvePoint:
        return cls(
            rate=d["rate"], offered_rate=d["offered_rate"], achieved_rate=d["achieved_rate"],
            calls=d["calls"], completed=d["completed"], failures=dict(d["failures"]),
            client={k: Stats.from_json(v) for k, v in d["client"].items()},
            server={k: Stats.from_json(v) for k, v in d["server"].items()},
            preemptions=d.get("preemptions", 0.0), mean_running=d.get("mean_running"),
            mean_waiting=d.get("mean_waiting"), waiting_fraction=d.get("waiting_fraction"),
            saturated=d.get("saturated", False), reason=d.get("reason", ""),
            wall_s=d.get("wall_s", 0.0))


@dataclass(frozen=True, slots=True)
class ServeCurveResult:
    """A measured serving curve: the instance, the call lengths, and one point per rate (in the
    order measured; :attr:`points_by_rate` sorts them)."""

    model: str
    """Catalog model name."""
    profiled_name: str
    """The (possibly shrunk) model's name, as in its step profile
    (:func:`~scepsy_profile.profiling.models.profiled_name`)."""
    scale: float
    config: dict[str, Any]
    device: str
    tp: int
    share: float
    input_tokens: float
    """Mean input length of the calls sent."""
    output_tokens: float
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    engine: str
    engine_version: str
    server: dict[str, Any]
    """Server settings that shape the curve (``max_num_seqs``, ``kv_gib``, ``max_model_len``)."""
    points: tuple[ServeCurvePoint, ...]
    stop_reason: str
    seed: int = 0
    started_at: float = 0.0

    @property
    def points_by_rate(self) -> tuple[ServeCurvePoint, ...]:
        return tuple(sorted(self.points, key=lambda p: p.rate))

    @property
    def saturation_rate(self) -> float:
        """The largest achieved throughput (calls/s) over all rates: the measured μ."""
        return max((p.achieved_rate for p in self.points), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "scepsy serve-curve", "version": 1, "model": self.model,
            "profiled_name": self.profiled_name, "scale": self.scale, "config": self.config,
            "device": self.device, "tp": self.tp, "share": self.share,
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "inputs": self.inputs, "outputs": self.outputs, "engine": self.engine,
            "engine_version": self.engine_version, "server": self.server,
            "points": [p.to_json() for p in self.points], "stop_reason": self.stop_reason,
            "seed": self.seed, "started_at": self.started_at,
            "saturation_rate": self.saturation_rate,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServeCurveResult:
        if d.get("kind") != "scepsy serve-curve":
            raise InputError("serve-curve file", "kind", "'scepsy serve-curve'", d.get("kind"))
        return cls(
            model=d["model"], profiled_name=d["profiled_name"], scale=d["scale"],
            config=d["config"], device=d["device"], tp=d["tp"], share=d["share"],
            input_tokens=d["input_tokens"], output_tokens=d["output_tokens"],
            inputs=d["inputs"], outputs=d["outputs"], engine=d["engine"],
            engine_version=d["engine_version"], server=d["server"],
            points=tuple(ServeCurvePoint.from_json(p) for p in d["points"]),
            stop_reason=d["stop_reason"], seed=d.get("seed", 0),
            started_at=d.get("started_at", 0.0))


def save_result(result: ServeCurveResult, path: str | os.PathLike[str]) -> Path:
    """Write ``result`` as JSON to ``path`` atomically; the path written."""
    p = Path(path)
    atomic_write_text(p, json.dumps(result.to_json(), indent=1, sort_keys=True) + "\n")
    return p


_NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Share = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class _StatsDoc(BaseModel):
    model_config = ConfigDict(extra="ignore")
    n: int = Field(ge=0)
    mean: _NonNeg | None = None
    p50: _NonNeg | None = None
    p90: _NonNeg | None = None


class _PointDoc(BaseModel):
    model_config = ConfigDict(extra="ignore")
    rate: float = Field(gt=0, allow_inf_nan=False)
    offered_rate: _NonNeg
    achieved_rate: _NonNeg
    calls: int = Field(ge=0)
    completed: int = Field(ge=0)
    failures: dict[str, Annotated[int, Field(ge=0)]]
    client: dict[str, _StatsDoc]
    server: dict[str, _StatsDoc]
    preemptions: _NonNeg = 0.0
    mean_running: _NonNeg | None = None
    mean_waiting: _NonNeg | None = None
    waiting_fraction: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    saturated: bool = False
    reason: str = ""
    wall_s: _NonNeg = 0.0

    @model_validator(mode="after")
    def _completed_of_sent(self) -> _PointDoc:
        if self.completed > self.calls:
            raise ValueError(f"completed calls <= calls sent ({self.completed} > {self.calls})")
        return self


class _ResultDoc(BaseModel):
    """The fields of a serve-curve file that its readers use, with their bounds (unknown
    fields are kept for later versions)."""

    model_config = ConfigDict(extra="ignore")
    kind: Literal["scepsy serve-curve"]
    model: str = Field(min_length=1)
    profiled_name: str = Field(min_length=1)
    scale: _Share
    config: dict[str, Any]
    device: str = Field(min_length=1)
    tp: int = Field(ge=1)
    share: _Share
    input_tokens: float = Field(gt=0, allow_inf_nan=False)
    output_tokens: float = Field(gt=0, allow_inf_nan=False)
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    engine: str
    engine_version: str
    server: dict[str, Any]
    points: list[_PointDoc] = Field(min_length=1)
    stop_reason: str
    seed: int = 0
    started_at: _NonNeg = 0.0


def load_result(path: str | os.PathLike[str]) -> ServeCurveResult:
    """Read a file written by :func:`save_result`; a missing field or a value out of its
    bounds (a negative or non-finite rate, more completed calls than sent) is an
    :class:`InputError` naming the file and the field."""
    data = parse_json(read_text(path, "serve-curve JSON file"), str(path))
    validated(_ResultDoc, data, str(path))
    return ServeCurveResult.from_json(data)


def result_path(profile_path: str | os.PathLike[str]) -> Path:
    """Where the serving curve of a step profile is stored: beside it, ``<stem>.serve-curve.json``."""
    p = Path(profile_path)
    return p.with_name(p.stem + ".serve-curve.json")


# -- the sweep ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Gauges:
    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)


async def _snapshot(client: httpx.AsyncClient, base_url: str) -> MetricsSnapshot | None:
    try:
        resp = await client.get(base_url + "/metrics")
        resp.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_metrics(resp.text, at=time.monotonic())


async def _poll(client: httpx.AsyncClient, base_url: str, every_s: float, out: _Gauges,
                stop: asyncio.Event) -> None:
    while not stop.is_set():
        snap = await _snapshot(client, base_url)
        if snap is not None and (RUNNING, None) in snap.samples:
            out.running.append(snap.value(RUNNING))
            out.waiting.append(snap.value(WAITING))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def _measure_rate(base_url: str, model: str, rate: float, inputs: LengthDist,
                        outputs: LengthDist, plan: SweepPlan, seed: int,
                        vocab: int) -> ServeCurvePoint:
    n = max(plan.calls_per_rate, math.ceil(rate * plan.min_duration_s))
    calls = poisson_schedule(rate, inputs, outputs, seed=seed, n_calls=n, vocab=vocab)
    gauges = _Gauges()
    async with httpx.AsyncClient(timeout=10.0) as mc:
        before = await _snapshot(mc, base_url)
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll(mc, base_url, plan.poll_s, gauges, stop))
        t0 = time.perf_counter()
        res = await replay(base_url, calls, model=model, timeouts=plan.timeouts)
        wall = time.perf_counter() - t0
        stop.set()
        await poller
        after = await _snapshot(mc, base_url)
    return _point(rate, res.calls, res.failures, before, after, gauges, plan, wall)


def _point(rate: float, calls: Sequence[CallResult], failures: dict[str, int],
           before: MetricsSnapshot | None, after: MetricsSnapshot | None, gauges: _Gauges,
           plan: SweepPlan, wall: float) -> ServeCurvePoint:
    sends = [c.send_s for c in calls]
    span = max(sends) - min(sends)
    offered = len(calls) / (span + span / max(len(calls) - 1, 1)) if span > 0 else rate
    done = [c for c in calls if c.ok]
    ends = [c.send_s + (c.e2e_s or 0.0) for c in done]
    achieved = len(done) / (max(ends) - min(sends)) if done and max(ends) > min(sends) else 0.0
    steady = [c for c in done if c.index >= plan.warmup_calls] or done
    client = {
        "e2e": Stats.of([c.e2e_s for c in steady if c.e2e_s is not None]),
        "ttft": Stats.of([c.ttft_s for c in steady if c.ttft_s is not None]),
        "tpot": Stats.of([c.tpot_s for c in steady if c.tpot_s is not None]),
    }
    server: dict[str, Stats] = {}
    preempt = 0.0
    if before is not None and after is not None:
        for short, name in SERVER_HISTOGRAMS.items():
            d = histogram_delta(before, after, name)
            if d.count > 0:
                server[short] = Stats(n=int(d.count), mean=d.mean, p50=d.quantile(0.5),
                                      p90=d.quantile(0.9))
        preempt = after.value(PREEMPTIONS) - before.value(PREEMPTIONS)
    polls = len(gauges.waiting)
    return ServeCurvePoint(
        rate=rate, offered_rate=offered, achieved_rate=achieved, calls=len(calls),
        completed=len(done), failures=dict(failures), client=client, server=server,
        preemptions=preempt,
        mean_running=float(np.mean(gauges.running)) if polls else None,
        mean_waiting=float(np.mean(gauges.waiting)) if polls else None,
        waiting_fraction=float(np.mean(np.asarray(gauges.waiting) > 0)) if polls else None,
        wall_s=wall)


def saturation_reason(point: ServeCurvePoint, zero_load_s: float | None,
                      plan: SweepPlan) -> str:
    """Why ``point`` counts as saturated ('' when it does not)."""
    if point.calls and (point.calls - point.completed) / point.calls > plan.max_failure_fraction:
        return f"{point.calls - point.completed} of {point.calls} calls failed"
    if point.achieved_rate < plan.saturation_ratio * point.offered_rate:
        return (f"achieved {point.achieved_rate:.4g}/s < {plan.saturation_ratio:g} x offered "
                f"{point.offered_rate:.4g}/s")
    lat = point.latency("e2e")
    if zero_load_s and lat is not None and lat > plan.latency_factor * zero_load_s:
        return f"mean latency {lat:.4g} s > {plan.latency_factor:g} x zero-load {zero_load_s:.4g} s"
    if point.waiting_fraction is not None and point.waiting_fraction >= plan.waiting_fraction:
        return f"calls waiting at {point.waiting_fraction:.0%} of the polls"
    return ""


def sweep_rates(base_url: str, model: str, inputs: LengthDist, outputs: LengthDist,
                plan: SweepPlan = SweepPlan(), *, seed: int = 0, vocab: int = 1000,
                progress: Callable[[ServeCurvePoint], None] | None = None,
                ) -> tuple[tuple[ServeCurvePoint, ...], str]:
    """Measure rates ``start_rate · factor^k`` until saturation, then bisect towards the knee.
    Returns the points (in the order measured) and why the sweep stopped."""
    base_url = base_url.rstrip("/")
    points: list[ServeCurvePoint] = []
    zero: float | None = None

    def run(rate: float, k: int) -> ServeCurvePoint:
        nonlocal zero
        p = asyncio.run(_measure_rate(base_url, model, rate, inputs, outputs, plan,
                                      seed + 1000 * k, vocab))
        reason = saturation_reason(p, zero, plan)
        p = replace(p, saturated=bool(reason), reason=reason)
        if zero is None and not reason:
            zero = p.latency("e2e")
        points.append(p)
        if progress is not None:
            progress(p)
        return p

    rate, stop = plan.start_rate, f"no saturation within {plan.max_rates} rates"
    last_ok: float | None = None
    first_bad: float | None = None
    for k in range(plan.max_rates):
        p = run(rate, k)
        if p.saturated:
            first_bad, stop = rate, f"saturated at {rate:.4g}/s: {p.reason}"
            break
        last_ok = rate
        rate *= plan.factor
    if first_bad is not None and last_ok is not None:
        lo, hi = last_ok, first_bad
        for j in range(plan.refine_steps):
            mid = math.sqrt(lo * hi)
            p = run(mid, plan.max_rates + j)
            if p.saturated:
                hi = mid
            else:
                lo = mid
    if first_bad is not None:
        _fill(points, plan, run)
    return tuple(points), stop


def _fill(points: list[ServeCurvePoint], plan: SweepPlan,
          run: Callable[[float, int], ServeCurvePoint]) -> None:
    """Measure each ``plan.fill_fractions`` load of the measured saturation that lies above the
    highest unsaturated rate (ascending; once one saturates, the higher ones would too)."""
    mu = max(p.achieved_rate for p in points)
    for j, f in enumerate(sorted(plan.fill_fractions)):
        top = max((p.offered_rate for p in points if not p.saturated), default=0.0)
        if f * mu > top * 1.001 and run(f * mu, plan.max_rates + plan.refine_steps + j).saturated:
            break


def measure_serving_curve(config: ServerConfig, inputs: LengthDist, outputs: LengthDist,
                          workdir: Path, plan: SweepPlan = SweepPlan(), *, seed: int = 0,
                          out: str | os.PathLike[str] | None = None, warmup_calls: int = 8,
                          device: str = "cpu", engine_version: str = "",
                          progress: Callable[[ServeCurvePoint], None] | None = None,
                          ) -> ServeCurveResult:
    """Start ``vllm serve`` for ``config``, warm it up with ``warmup_calls`` calls, sweep the rates
    (:func:`sweep_rates`), stop it, and return (and, with ``out``, save) the result."""
    model = config.model
    probe = poisson_schedule(1.0, inputs, outputs, seed=seed, n_calls=4096, vocab=model.vocab)
    mean_in = float(np.mean([c.input_tokens for c in probe]))
    mean_out = float(np.mean([c.output_tokens for c in probe]))
    if mean_in + mean_out > config.max_model_len:
        raise InputError("serve-curve", "input/output lengths",
                         f"mean input + output within max_model_len ({config.max_model_len})",
                         (mean_in, mean_out))
    started = time.time()
    with vllm_server(config, workdir) as srv:
        if warmup_calls:
            warm = poisson_schedule(plan.start_rate, inputs, outputs, seed=seed + 999_999,
                                    n_calls=warmup_calls, vocab=model.vocab)
            asyncio.run(replay(srv.base_url, warm, model=config.served_name,
                               timeouts=plan.timeouts))
        points, stop = sweep_rates(srv.base_url, config.served_name, inputs, outputs, plan,
                                   seed=seed, vocab=model.vocab, progress=progress)
    result = ServeCurveResult(
        model=model.name, profiled_name=model.profiled_name, scale=model.scale,
        config=model.config(), device=device, tp=config.tp, share=config.share,
        input_tokens=mean_in, output_tokens=mean_out, inputs=inputs.to_json(),
        outputs=outputs.to_json(), engine="vllm", engine_version=engine_version,
        server={"max_num_seqs": config.max_num_seqs, "kv_gib": config.kv_gib,
                "max_model_len": config.max_model_len, "threads": config.threads},
        points=points, stop_reason=stop, seed=seed, started_at=started)
    if out is not None:
        save_result(result, out)
    return result


# -- comparison with the derived curve -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LoadComparison:
    """Measured and predicted values at one load (``fraction`` of the measured saturation)."""

    fraction: float
    rate: float
    measured_latency_s: float | None
    predicted_latency_s: float
    latency_error: float | None
    """predicted / measured − 1."""
    measured_batch: float | None
    """The server's mean running calls, interpolated."""
    predicted_batch: float | None
    measured_tpot_s: float | None
    predicted_tpot_s: float | None
    """The decode step at the predicted batch."""

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(frozen=True, slots=True)
class Comparison:
    """The measured curve against the one :func:`serving_curve` derives from the step profile."""

    measured_mu: float
    predicted_mu: float
    mu_error: float
    """predicted / measured − 1."""
    predicted_max_batch: int
    loads: tuple[LoadComparison, ...]
    terms: dict[str, dict[str, float | None]]
    """Per term (``zero_load``, ``prefill``, ``decode``): measured, predicted and error."""
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return {"measured_mu": self.measured_mu, "predicted_mu": self.predicted_mu,
                "mu_error": self.mu_error, "predicted_max_batch": self.predicted_max_batch,
                "loads": [x.to_json() for x in self.loads], "terms": self.terms,
                "verdict": self.verdict}


def device_catalog(result: ServeCurveResult,
                   base: Catalog | None = None) -> tuple[Catalog, MemoryPolicy]:
    """A catalog and memory policy under which :func:`serving_curve` sees the memory the server
    had: the shrunk model (:meth:`EngineModel.model_spec`) and a device named ``result.device``
    whose memory is the model's weights plus the KV space given to vLLM, with no reserve
    (``reserve_fraction = reserve_gib = 0``) and ``max_batch = max_num_seqs``. The device's
    compute and bandwidth figures are placeholders (:func:`~.devices.host_device_spec`)."""
    em = EngineModel(name=result.model, scale=result.scale, **result.config)
    spec = em.model_spec()
    weights = spec.weight_bytes_per_gpu(result.tp) / GIB
    memory = weights + float(result.server["kv_gib"])
    gpu = host_device_spec(result.device, memory, max(result.tp, 1))
    cat = (base or default_catalog()).with_model(spec).with_gpu(gpu)
    policy = MemoryPolicy(reserve_fraction=0.0, reserve_gib=0.0,
                          max_batch=int(result.server["max_num_seqs"]))
    return cat, policy


def _interp(points: Sequence[ServeCurvePoint], rate: float, value: Callable[[ServeCurvePoint],
            float | None]) -> float | None:
    """``value`` at ``rate`` interpolated linearly in the offered rate over ``points``; None
    outside their range (no extrapolation)."""
    rows = sorted((p.offered_rate, v) for p in points if (v := value(p)) is not None)
    if not rows or rate < rows[0][0] * 0.999 or rate > rows[-1][0] * 1.001:
        return None
    xs, ys = zip(*rows, strict=True)
    return float(np.interp(rate, xs, ys))


def _err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas <= 0 or not math.isfinite(pred):
        return None
    return pred / meas - 1.0


def compare_with_step_profile(result: ServeCurveResult, latency: LatencyModel, *,
                              catalog: Catalog | None = None, policy: MemoryPolicy | None = None,
                              fractions: Sequence[float] = (0.3, 0.6, 0.9)) -> Comparison:
    """Compare ``result`` with ``serving_curve(latency, name, result.device,
    result.tp, result.share, I, O)`` for the measured mean lengths ``I``, ``O``, where ``name``
    is the shrunk model's :func:`~scepsy_profile.profiling.models.profiled_name` (the name its
    step profile carries).

    On a CPU device the memory side needs a catalog entry: by default :func:`device_catalog`
    builds one (the shrunk model, and a device whose memory is weights + the server's KV space,
    no reserve, ``max_batch = max_num_seqs``); pass ``catalog`` and ``policy`` to override.
    Measured latencies are the server's means (the client's where the server gave none),
    interpolated in the offered rate between the unsaturated points; a load above the highest
    unsaturated rate is reported without a measured value rather than extrapolated.
    """
    if not result.points:
        raise InputError("serve-curve", "points", "at least one measured rate", 0)
    if catalog is None or policy is None:
        cat, pol = device_catalog(result)
        catalog, policy = catalog or cat, policy or pol
    name = profiled_name(result.model, result.scale)
    curve = serving_curve(latency, name, result.device, result.tp, result.share,
                          result.input_tokens, result.output_tokens, catalog=catalog,
                          policy=policy)
    mu = result.saturation_rate
    ok = [p for p in result.points if not p.saturated]
    ctx = result.input_tokens + result.output_tokens / 2.0

    def decode_s(batch: float) -> float:
        return float(latency.decode_ms(name, result.device, result.tp,
                                       result.share, batch, ctx)) / 1e3

    loads = []
    for f in fractions:
        rate = f * mu
        pred = float(curve.latency_s(rate))
        meas = _interp(ok, rate, lambda p: p.latency("e2e"))
        b_pred = float(curve.batch_at_rate(rate)) if 0 < rate < curve.mu else None
        loads.append(LoadComparison(
            fraction=f, rate=rate, measured_latency_s=meas, predicted_latency_s=pred,
            latency_error=_err(pred, meas),
            measured_batch=_interp(ok, rate, lambda p: p.mean_running),
            predicted_batch=b_pred,
            measured_tpot_s=_interp(ok, rate, lambda p: p.latency("itl") or p.latency("tpot")),
            predicted_tpot_s=decode_s(max(b_pred, 1.0)) if b_pred is not None else None))
    low = min(result.points, key=lambda p: p.offered_rate)
    pre_meas = low.latency("prefill") or low.latency("ttft")
    terms = {
        "zero_load": _term(curve.zero_load_latency_s, low.latency("e2e")),
        "prefill": _term(curve.prefill_ms / 1e3, pre_meas),
        "decode": _term(decode_s(1.0), low.latency("itl") or low.latency("tpot")),
        "queue": _term(0.0, low.latency("queue")),
    }
    mu_err = curve.mu / mu - 1.0 if mu > 0 else math.inf
    return Comparison(measured_mu=mu, predicted_mu=curve.mu, mu_error=mu_err,
                      predicted_max_batch=curve.max_batch, loads=tuple(loads), terms=terms,
                      verdict=_verdict(mu_err, loads, terms))


def _term(pred: float, meas: float | None) -> dict[str, float | None]:
    return {"measured": meas, "predicted": pred, "error": _err(pred, meas)}


def _verdict(mu_err: float, loads: Sequence[LoadComparison],
             terms: dict[str, dict[str, float | None]]) -> str:
    """One sentence per miss: which term is off, and by how much."""
    notes = []
    if abs(mu_err) > 0.15:
        notes.append(f"saturation {mu_err:+.0%}")
    for x in loads:
        if x.latency_error is not None and abs(x.latency_error) > 0.25:
            detail = f"latency at {x.fraction:.0%} of saturation {x.latency_error:+.0%}"
            if x.measured_batch and x.predicted_batch:
                detail += f" (batch {x.predicted_batch:.2f} predicted vs {x.measured_batch:.2f})"
            if x.measured_tpot_s and x.predicted_tpot_s:
                detail += (f" (per-token {1e3 * x.predicted_tpot_s:.2f} ms predicted vs "
                           f"{1e3 * x.measured_tpot_s:.2f} ms)")
            notes.append(detail)
    worst = max(((k, v["error"]) for k, v in terms.items()
                 if k in ("prefill", "decode") and v["error"] is not None),
                key=lambda kv: abs(kv[1]), default=None)
    if worst is not None and abs(worst[1]) > 0.15:
        notes.append(f"worst step term at low load: {worst[0]} {worst[1]:+.0%}")
    return "; ".join(notes) if notes else "within targets (saturation 15 %, latency 25 %)"
