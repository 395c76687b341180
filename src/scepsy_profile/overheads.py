"""Engine overheads: what a real serving engine adds to the step profile, calibrated.

A step profile times the model's forward passes. A real engine (``vllm serve``) adds work the
profile does not see, in four calibrated terms (:class:`EngineOverheads`, milliseconds):

* ``iteration_ms``: added to every engine iteration, prefill or decode (scheduling, input
  preparation, sampling);
* ``per_token_ms``: added to a decode step per sequence in it (detokenising and streaming each
  new token), so a decode step of ``B`` sequences costs ``d(B) + iteration_ms + per_token_ms·B``;
* ``first_token_ms``: a pure delay once per call before its first token (the API server's
  request handling and the hop to the engine), during which the engine is not busy;
* ``http_ms``: a pure delay once per call seen only by the client (the request and the streamed
  response over HTTP).

:func:`with_overheads` wraps a latency model so that its steps include the first two (an
:class:`OverheadLatencyModel`, which keeps the latency-model contract); the serving curve, the
predictor and the simulator then see them through the model. The two delays are
:func:`call_delay_s` per call, spent in the server's front end (its API server process) and
the client, which handle one call at a time: calls that arrive together (a fan-out of ``k``
calls of one request) wait for each other's delays. The simulator runs each replica's front end
as a first-come-first-served server of that delay before the replica sees the call; the
predictor adds the mean of that wait, :func:`front_delay_s`: ``delay·(g + 1)/2`` for groups of
``g`` calls per replica.

Without a calibration the overheads are :data:`NO_OVERHEADS`, all zero: predictions are then
optimistic (higher throughput, lower latency than a real engine gives).

:func:`calibrate` fits the terms to a measured serving curve (``scepsy profile serve-curve``) and
the step profile of the same machine, by least squares with non-negative terms, on the
unsaturated rates of the sweep:

* ``iteration_ms``, ``per_token_ms``: the server's mean inter-token latency at each rate against
  the serving model's mean time per output token at the batch in service, which is
  ``d(B', ctx) + max(B' − g, 0)·P(g)/(g·(O − 1))`` (a decode step, plus the prefills of the calls
  admitted meanwhile, shared over the ``O − 1`` steps; module :mod:`scepsy_profile.serving`),
  with ``B' = max(B, 1)``. With the overheads it becomes
  ``… + iteration_ms·(1 + max(B' − g, 0)/(g·(O − 1))) + per_token_ms·B'``: linear in the two
  terms. ``B`` is the measured number of calls in service, by Little's law from the server's
  histograms (achieved rate × (prefill + decode time)), or the server's running gauge where a
  point has no histograms (the gauge, polled by a client that shares the machine, reads low).
* ``first_token_ms``: the server's time to first token minus the predicted prefill
  ``p(1, I) + iteration_ms``, at light load (rates up to ``light_fraction`` of the measured
  saturation, where calls do not queue).
* ``http_ms``: the client's end-to-end latency minus the server's, at light load (at higher rates
  a client that shares the machine with the server falls behind, which is not a per-call
  constant).

Each term's residuals (measured − fitted, per rate) are reported, and the derived serving curve
is compared with the measured one before and after (:class:`Calibration`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import nnls

from scepsy_common.errors import InputError, validated
from scepsy_common.files import atomic_write_text, dump_yaml, parse_json, parse_yaml, read_text
from scepsy_profile.catalog import Catalog
from scepsy_profile.latency import LatencyModel, Number, measured_shares
from scepsy_profile.profiling.models import profiled_name
from scepsy_profile.profiling.servecurve import (
    ServeCurvePoint,
    ServeCurveResult,
    compare_with_step_profile,
    device_catalog,
)
from scepsy_profile.serving import MemoryPolicy, group_cap, kv_demand

TERMS = ("iteration_ms", "per_token_ms", "first_token_ms", "http_ms")
"""The terms :func:`calibrate` fits from one machine's serving curve, in milliseconds."""
ALL_TERMS = (*TERMS, "tp_doubling_ms")
"""Every term of an :class:`EngineOverheads`: ``tp_doubling_ms`` grows with tensor
parallelism, which one machine's serving curve does not vary (fitted from multi-GPU runs,
``scepsy validate``)."""


@dataclass(frozen=True)
class EngineOverheads:
    """What one engine version on one device adds to the step profile (module docstring)."""

    engine: str
    version: str
    device: str
    iteration_ms: float = 0.0
    """Added to every prefill iteration and every decode step (scheduler, sampling)."""
    per_token_ms: float = 0.0
    """Added to a decode step per sequence in it (detokenise, stream)."""
    first_token_ms: float = 0.0
    """Pure delay once per call before its first token (API server, queue hop)."""
    http_ms: float = 0.0
    """Pure client-side delay once per call (request and response over HTTP)."""
    tp_doubling_ms: float = 0.0
    """Added to every iteration per doubling of the tensor-parallel degree, ``·log2(tp)``
    (the collectives' synchronisation and launch costs, which grow with the steps of a tree
    all-reduce)."""
    overload_queued: float = 0.0
    """The part (in [0, 1]) of an overloaded engine's backlog that waits in front of it,
    before its first token, rather than in its batch (admission control; a finite run's
    TTFT, :func:`scepsy_opt.validate.finite.finite_run`)."""
    source: str = ""
    """What it was fitted from."""

    def __post_init__(self) -> None:
        for name in ("engine", "version", "device", "source"):
            if not isinstance(getattr(self, name), str):
                raise InputError("engine overheads", name, "a string", getattr(self, name))
        for name in ALL_TERMS:
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    and v >= 0):
                raise InputError("engine overheads", name, "a number of milliseconds >= 0", v)
            object.__setattr__(self, name, float(v))
        q = self.overload_queued
        if not (isinstance(q, (int, float)) and not isinstance(q, bool) and 0 <= q <= 1):
            raise InputError("engine overheads", "overload_queued", "a fraction in [0, 1]", q)
        object.__setattr__(self, "overload_queued", float(q))

    @property
    def call_delay_s(self) -> float:
        """The pure delay per call, ``(first_token_ms + http_ms) / 1e3`` seconds."""
        return (self.first_token_ms + self.http_ms) / 1e3

    @property
    def is_zero(self) -> bool:
        """Whether every term and :attr:`overload_queued` are zero (the optimistic default)."""
        return all(getattr(self, t) == 0 for t in ALL_TERMS) and self.overload_queued == 0

    def to_dict(self) -> dict[str, Any]:
        """The file form (:func:`save_overheads`)."""
        return asdict(self)


MUXSERVE_A100 = Path(__file__).parent / "data" / "overheads-muxserve-a100.yaml"
"""The bundled overheads of MuxServe's engine on A100-80GB, fitted on its measured runs (the
default of ``scepsy validate muxserve``, docs/validate.md)."""

NO_OVERHEADS = EngineOverheads("none", "", "")
"""No overheads: the documented optimistic default when nothing is calibrated."""


class _OverheadsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    engine: str
    version: str
    device: str
    iteration_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    per_token_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    first_token_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    http_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    tp_doubling_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    overload_queued: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    source: str = ""


def parse_overheads(raw: object, source: str) -> EngineOverheads:
    """An :class:`EngineOverheads` from parsed YAML/JSON; an :class:`InputError` naming
    ``source`` and the field for an unknown field, a missing one or a bad value."""
    rec = validated(_OverheadsFile, raw, source, allowed=lambda loc: _OverheadsFile.model_fields)
    return EngineOverheads(**rec.model_dump())


def load_overheads(path: str | os.PathLike[str]) -> EngineOverheads:
    """Read an overheads file (YAML, or JSON when it ends in ``.json``)."""
    p = Path(path)
    text = read_text(p, "engine-overheads file (YAML or JSON)")
    raw = parse_json(text, str(p)) if p.suffix.lower() == ".json" else parse_yaml(text, str(p))
    return parse_overheads(raw, str(p))


def save_overheads(overheads: EngineOverheads, path: str | os.PathLike[str]) -> None:
    """Write ``overheads`` atomically (JSON when ``path`` ends in ``.json``, else YAML)."""
    p = Path(path)
    data = overheads.to_dict()
    text = (json.dumps(data, indent=1, sort_keys=True) + "\n" if p.suffix.lower() == ".json"
            else dump_yaml(data, sort_keys=False))
    atomic_write_text(p, text)


# -- applying them -----------------------------------------------------------------------------

@dataclass(frozen=True)
class OverheadLatencyModel:
    """A latency model whose steps include an engine's overheads: a prefill takes
    ``inner + iteration_ms + tp_doubling_ms·log2(tp)``, a decode step of ``B`` sequences
    ``inner + iteration_ms + tp_doubling_ms·log2(tp) + per_token_ms·B``; ``call_delay_s`` is
    the overheads' pure delay per call."""

    inner: LatencyModel
    overheads: EngineOverheads

    @property
    def call_delay_s(self) -> float:
        """The pure delay per call (s) the predictor and the simulator add."""
        return self.overheads.call_delay_s + call_delay_s(self.inner)

    @property
    def overload_queued(self) -> float:
        """The part of an overload's backlog that waits before its first token."""
        return self.overheads.overload_queued

    def prefill_ms(self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike,
                   seq: ArrayLike) -> Number:
        out = self.inner.prefill_ms(model, gpu, tp, share, batch, seq)
        o = self.overheads
        return _plain(out + o.iteration_ms + o.tp_doubling_ms * math.log2(tp))

    def decode_ms(self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike,
                  ctx: ArrayLike) -> Number:
        out = self.inner.decode_ms(model, gpu, tp, share, batch, ctx)
        o = self.overheads
        return _plain(out + (o.iteration_ms + o.tp_doubling_ms * math.log2(tp)
                             + o.per_token_ms * np.asarray(batch, dtype=float)))

    def covers(self, model: str, gpu: str, tp: int) -> bool:
        return self.inner.covers(model, gpu, tp)

    def measured_shares(self, model: str, gpu: str, tp: int) -> tuple[float, float] | None:
        """The inner model's measured shares (the overheads do not depend on the share)."""
        return measured_shares(self.inner, model, gpu, tp)


def _plain(values: Any) -> Number:
    return float(values) if np.ndim(values) == 0 else np.asarray(values, dtype=float)


def with_overheads(latency: LatencyModel, overheads: EngineOverheads) -> LatencyModel:
    """``latency`` with ``overheads`` in its steps and its per-call delay (unchanged when they
    are all zero)."""
    return latency if overheads.is_zero else OverheadLatencyModel(latency, overheads)


def call_delay_s(latency: LatencyModel) -> float:
    """The pure delay per LLM call (s) a latency model carries (0 without overheads)."""
    return float(getattr(latency, "call_delay_s", 0.0))


def front_delay_s(delay_s: ArrayLike, group: ArrayLike, replicas: ArrayLike = 1.0) -> Number:
    """The mean pure delay of a call (s) of an LLM whose calls arrive in groups of ``group``
    (its mean concurrency within a request, >= 1) spread over ``replicas`` replicas: each
    replica's front end handles the ``g = max(1, group / replicas)`` calls that reach it
    together one at a time, so the mean call waits for ``(g − 1)/2`` delays of the others
    besides its own: ``delay_s·(g + 1)/2`` (``delay_s`` for single calls). Vectorised."""
    g = np.maximum(1.0, np.asarray(group, dtype=float) / np.asarray(replicas, dtype=float))
    out = np.asarray(delay_s, dtype=float) * (g + 1.0) / 2.0
    return float(out) if out.ndim == 0 else out


def overload_queued(latency: LatencyModel) -> float:
    """The part of an overload's backlog that waits before its first token under the
    engine of ``latency`` (its overheads' :attr:`EngineOverheads.overload_queued`; 0
    without overheads)."""
    return float(getattr(latency, "overload_queued", 0.0))


# -- fitting them ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Residual:
    """One measured value against the fitted one (ms) at one rate."""

    term: str
    rate: float
    """Offered rate (calls/s)."""
    batch: float
    """Calls in service (measured)."""
    measured_ms: float
    fitted_ms: float

    @property
    def residual_ms(self) -> float:
        return self.measured_ms - self.fitted_ms


@dataclass(frozen=True, slots=True)
class CurveCheck:
    """Measured serving curve against the derived one, without and with the overheads."""

    measured_mu: float
    mu_before: float
    mu_after: float
    loads: tuple[dict[str, float | None], ...]
    """Per load: ``fraction``, ``rate``, ``measured_s`` (server e2e), ``before_s``, ``after_s``
    (with ``first_token_ms``), ``before_error``, ``after_error`` (predicted / measured − 1)."""

    @property
    def mu_error_before(self) -> float:
        return self.mu_before / self.measured_mu - 1.0

    @property
    def mu_error_after(self) -> float:
        return self.mu_after / self.measured_mu - 1.0


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted overheads, the residuals of each term, and the curve before and after."""

    overheads: EngineOverheads
    residuals: tuple[Residual, ...]
    check: CurveCheck

    def rms_ms(self, term: str) -> float | None:
        """Root-mean-square residual of one fitted quantity (``itl``, ``ttft``, ``http``)."""
        r = [x.residual_ms for x in self.residuals if x.term == term]
        return float(np.sqrt(np.mean(np.square(r)))) if r else None


def _service_batch(p: ServeCurvePoint) -> float | None:
    """Calls in service at one rate: Little's law on the server's histograms, else the gauge."""
    pre, dec = p.server.get("prefill"), p.server.get("decode")
    if pre is not None and dec is not None and pre.mean is not None and dec.mean is not None:
        return p.achieved_rate * (pre.mean + dec.mean)
    return p.mean_running


def _moments(result: ServeCurveResult) -> tuple[float | None, float | None]:
    """``E[O²]`` and ``E[I·O]`` of the sweep's lengths (None: constant lengths)."""
    kind, o = result.outputs.get("kind"), result.output_tokens
    if kind == "exponential":
        m2 = 2.0 * o * o
    elif kind == "lognormal":
        m2 = o * o * math.exp(float(result.outputs.get("sigma", 0.0)) ** 2)
    elif kind == "empirical" and result.outputs.get("values"):
        m2 = float(np.mean(np.square(np.asarray(result.outputs["values"], dtype=float))))
    else:
        return None, None
    return m2, result.input_tokens * o  # inputs and outputs are drawn independently


def calibrate(result: ServeCurveResult, latency: LatencyModel, *,
              catalog: Catalog | None = None, policy: MemoryPolicy | None = None,
              light_fraction: float = 0.2, engine: str | None = None,
              version: str | None = None, device: str | None = None,
              source: str = "") -> Calibration:
    """Fit :class:`EngineOverheads` to a measured serving curve and the step profile's
    ``latency`` of the same machine (module docstring), with the residuals and the curve check.

    ``catalog``/``policy`` default to :func:`~scepsy_profile.profiling.servecurve.device_catalog`
    (the memory the server had); ``engine``, ``version`` and ``device`` to the result's."""
    if not (isinstance(light_fraction, (int, float)) and 0 < light_fraction <= 1):
        raise InputError("calibrate", "light_fraction", "a fraction in (0, 1]", light_fraction)
    ok = sorted((p for p in result.points if not p.saturated and p.completed > 0),
                key=lambda p: p.offered_rate)
    if not ok:
        raise InputError(source or "serve-curve", "points", "at least one unsaturated rate", 0)
    if catalog is None or policy is None:
        cat, pol = device_catalog(result)
        catalog, policy = catalog or cat, policy or pol
    name = profiled_name(result.model, result.scale)
    inst = (name, result.device, result.tp, result.share)
    i, o = float(result.input_tokens), float(result.output_tokens)
    if not latency.covers(name, result.device, result.tp):
        raise InputError(source or "calibrate", "step profile",
                         f"curves covering {name} on {result.device} tp={result.tp}")
    m2, io = _moments(result)
    ctx = kv_demand(i, max(o, 1.0), policy, m2, io).ctx
    cap = group_cap(policy, i)
    mu_meas = result.saturation_rate
    light = [p for p in ok if p.offered_rate <= light_fraction * mu_meas] or ok[:1]

    # iteration_ms and per_token_ms: inter-token latency at the batch in service
    rows, targets, itl_pts = [], [], []
    for p in ok:
        itl, b = p.latency("itl"), _service_batch(p)
        if itl is None or b is None or o < 2:
            continue
        bb = max(b, 1.0)
        g = min(max(1.0, bb / o), max(cap, 1.0))
        share_stall = max(bb - g, 0.0) / (g * (o - 1.0))
        d = float(latency.decode_ms(*inst, bb, ctx))
        pg = float(latency.prefill_ms(*inst, g, i))
        base = d + share_stall * pg
        rows.append((1.0 + share_stall, bb))
        targets.append(1e3 * itl - base)
        itl_pts.append((p, bb, 1e3 * itl, base))
    if rows:
        (it_ms, tok_ms), _ = nnls(np.asarray(rows), np.asarray(targets))
    else:
        it_ms = tok_ms = 0.0
    residuals = [Residual("itl", p.offered_rate, bb, meas, base + it_ms * r[0] + tok_ms * r[1])
                 for (p, bb, meas, base), r in zip(itl_pts, rows, strict=True)]

    # first_token_ms: server TTFT minus the predicted prefill, at light load
    p1 = float(latency.prefill_ms(*inst, 1.0, i)) + it_ms
    ttft = [(p, 1e3 * t) for p in light if (t := p.latency("ttft")) is not None]
    first_ms = max(float(np.mean([t - p1 for _, t in ttft])), 0.0) if ttft else 0.0
    residuals += [Residual("ttft", p.offered_rate, _service_batch(p) or 0.0, t, p1 + first_ms)
                  for p, t in ttft]

    # http_ms: client end-to-end minus server end-to-end, at light load
    gaps = [(p, 1e3 * (c.mean - s.mean)) for p in light
            if (c := p.client.get("e2e")) is not None and (s := p.server.get("e2e")) is not None
            and c.mean is not None and s.mean is not None]
    http = max(float(np.mean([g for _, g in gaps])), 0.0) if gaps else 0.0
    residuals += [Residual("http", p.offered_rate, _service_batch(p) or 0.0, g, http)
                  for p, g in gaps]

    overheads = EngineOverheads(
        engine=engine if engine is not None else result.engine,
        version=version if version is not None else result.engine_version,
        device=device if device is not None else result.device,
        iteration_ms=_round(it_ms), per_token_ms=_round(tok_ms),
        first_token_ms=_round(first_ms), http_ms=_round(http), source=source)
    check = check_curve(result, latency, overheads, catalog=catalog, policy=policy)
    return Calibration(overheads=overheads, residuals=tuple(residuals), check=check)


def _round(x: float) -> float:
    return float(f"{max(float(x), 0.0):.4g}")


def fit_overheads(result: ServeCurveResult, latency: LatencyModel, **kwargs: Any) -> EngineOverheads:
    """The overheads :func:`calibrate` fits (keywords as there)."""
    return calibrate(result, latency, **kwargs).overheads


def check_curve(result: ServeCurveResult, latency: LatencyModel, overheads: EngineOverheads, *,
                catalog: Catalog | None = None, policy: MemoryPolicy | None = None,
                fractions: Sequence[float] = (0.3, 0.6, 0.9)) -> CurveCheck:
    """The derived serving curve against the measured one without and with ``overheads``
    (latency after = the curve's with the step overheads, plus ``first_token_ms``; both are
    compared with the server's end-to-end latency)."""
    before = compare_with_step_profile(result, latency, catalog=catalog, policy=policy,
                                       fractions=fractions)
    after = compare_with_step_profile(result, with_overheads(latency, overheads),
                                      catalog=catalog, policy=policy, fractions=fractions)
    delay = overheads.first_token_ms / 1e3
    loads = []
    for b, a in zip(before.loads, after.loads, strict=True):
        meas = b.measured_latency_s
        after_s = a.predicted_latency_s + delay
        loads.append({
            "fraction": b.fraction, "rate": b.rate, "measured_s": meas,
            "before_s": b.predicted_latency_s, "after_s": after_s,
            "before_error": _err(b.predicted_latency_s, meas), "after_error": _err(after_s, meas)})
    return CurveCheck(measured_mu=before.measured_mu, mu_before=before.predicted_mu,
                      mu_after=after.predicted_mu, loads=tuple(loads))


def _err(pred: float, meas: float | None) -> float | None:
    if meas is None or meas <= 0 or not math.isfinite(pred):
        return None
    return pred / meas - 1.0
