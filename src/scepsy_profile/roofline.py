"""An analytical roofline latency model for any catalog (model, GPU, tp, share).

One step (a prefill pass or a decode step) on each GPU of a ``tp``-way group takes

    t = overhead + smoothmax_p(compute, memory) + communication

* ``compute = FLOPs / tp / (peak · compute_eff · min(1, share / compute_share_sat))``, FLOPs =
  matmuls (``2 · layer params`` per token, the LM head once per sequence in prefill and per token
  in decode) plus causal attention (``ModelSpec.attention_flops``);
* ``memory = bytes / (HBM · memory_eff · min(1, share / memory_share_sat))``, bytes = weights per
  GPU plus the KV cache read by decode (``batch · ctx · kv bytes per token per GPU``);
* ``communication = 2 · layers · (α + 2(tp−1)/tp · activation bytes / (link · allreduce_eff))``
  for ``tp > 1`` (two all-reduces per layer, ring algorithm);
* ``overhead = overhead_ms + layers · layer_overhead_ms`` (launch and framework time per step).

MPS gives an instance a fraction of the SMs: compute scales with it up to a saturation share, and
HBM bandwidth saturates earlier (a few SMs can already stream memory), which is why decode slows
far less than prefill at small shares. The efficiency factors are calibrated per phase against
measured data by :func:`calibrate_roofline`; the package ships the A100 calibration made from the
MuxServe grid and Vidur's all-reduce timings (``data/roofline.yaml``), and applies it to other
GPUs through their datasheet peaks.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import least_squares

from scepsy_common.errors import InputError, UncoveredInstanceError, validated
from scepsy_common.files import atomic_write_text, dump_yaml, parse_yaml, read_yaml
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.hardware import GPUSpec
from scepsy_profile.latency import Number, as_output, check_point
from scepsy_profile.measurements import Measurement, Phase
from scepsy_profile.models import ModelSpec

BUNDLED_CALIBRATION = "data/roofline.yaml"


@dataclass(frozen=True, slots=True)
class PhaseEfficiency:
    """Calibrated efficiency factors of one phase (see the module docstring)."""

    compute_eff: float = 0.6
    memory_eff: float = 0.7
    compute_share_sat: float = 1.0
    memory_share_sat: float = 0.5
    overhead_ms: float = 5.0
    layer_overhead_ms: float = 0.1
    smooth_power: float = 4.0


@dataclass(frozen=True, slots=True)
class AllReduceCost:
    """Ring all-reduce cost: ``latency_us`` per call plus bytes over ``efficiency`` · link."""

    latency_us: float = 20.0
    efficiency: float = 0.7


@dataclass(frozen=True, slots=True)
class RooflineCalibration:
    """Everything :class:`RooflineModel` needs beyond the catalog."""

    prefill: PhaseEfficiency = PhaseEfficiency()
    decode: PhaseEfficiency = PhaseEfficiency()
    allreduce: AllReduceCost = AllReduceCost()
    source: str = "uncalibrated defaults"

    def phase(self, phase: Phase) -> PhaseEfficiency:
        return self.prefill if phase == "prefill" else self.decode

    def to_dict(self) -> dict:
        return {"prefill": asdict(self.prefill), "decode": asdict(self.decode),
                "allreduce": asdict(self.allreduce), "source": self.source}


@dataclass(frozen=True)
class RooflineModel:
    """Analytical latency for catalog entries; implements ``LatencyModel``."""

    catalog: Catalog
    calibration: RooflineCalibration = RooflineCalibration()

    def covers(self, model: str, gpu: str, tp: int) -> bool:
        if not (self.catalog.has_model(model) and self.catalog.has_gpu(gpu)):
            return False
        return self.catalog.model(model).supports_tp(tp)

    def measured_shares(self, model: str, gpu: str, tp: int) -> None:
        """None: the roofline is a model, not a measurement, and answers every share in (0, 1]
        by the same physics (compute scales with the share below its saturation share), so no
        share counts as extrapolated. Raises :class:`UncoveredInstanceError` where it does not
        cover the instance."""
        self._instance(model, gpu, tp)
        return None

    def prefill_ms(self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike,
                   seq: ArrayLike) -> Number:
        spec, g = self._instance(model, gpu, tp)
        s, b, n, scalar = check_point(share, batch, seq, "seq")
        return as_output(self._step(spec, g, tp, "prefill", s, b, n), scalar)

    def decode_ms(self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike,
                  ctx: ArrayLike) -> Number:
        spec, g = self._instance(model, gpu, tp)
        s, b, n, scalar = check_point(share, batch, ctx, "ctx")
        return as_output(self._step(spec, g, tp, "decode", s, b, n), scalar)

    def step_ms(self, model: str, gpu: str, tp: int, phase: Phase, share: NDArray,
                batch: NDArray, tokens: NDArray) -> NDArray[np.float64]:
        """Vectorised step time (ms) for validated, broadcast arrays."""
        spec, g = self._instance(model, gpu, tp)
        return self._step(spec, g, tp, phase, share, batch, tokens)

    def _step(self, spec: ModelSpec, g: GPUSpec, tp: int, phase: Phase, share: NDArray,
              batch: NDArray, tokens: NDArray) -> NDArray[np.float64]:
        terms = _terms(spec, tp, phase, batch, tokens)
        return _combine(terms, g, tp, share, self.calibration.phase(phase), self.calibration.allreduce)

    def _instance(self, model: str, gpu: str, tp: int) -> tuple[ModelSpec, GPUSpec]:
        """The catalog entries of an instance, or :class:`UncoveredInstanceError`."""
        try:
            spec, g = self.catalog.model(model), self.catalog.gpu(gpu)
            spec.check_tp(tp)
        except InputError as exc:
            raise UncoveredInstanceError("roofline model", model, gpu, tp, exc.expected) from None
        return spec, g

    def breakdown(self, model: str, gpu: str, tp: int, phase: Phase, share: float, batch: int,
                  tokens: int) -> dict[str, float]:
        """The terms of one step (ms), for explaining a prediction."""
        spec, g = self._instance(model, gpu, tp)
        eff, ar = self.calibration.phase(phase), self.calibration.allreduce
        t = _terms(spec, tp, phase, np.array([batch], float), np.array([tokens], float))
        s = np.array([share])
        return {
            "compute_ms": float(_compute_ms(t, g, tp, s, eff)[0]),
            "memory_ms": float(_memory_ms(t, g, s, eff)[0]),
            "communication_ms": float(_comm_ms(t, g, tp, ar)[0]),
            "overhead_ms": eff.overhead_ms + t["layers"] * eff.layer_overhead_ms,
            "total_ms": float(_combine(t, g, tp, s, eff, ar)[0]),
        }


def _terms(spec, tp: int, phase: Phase, b: NDArray, n: NDArray) -> dict:
    """FLOPs (whole group), bytes per GPU, all-reduce message bytes: the model's workload."""
    layer_mm = 2.0 * spec.layers * spec.layer_matmul_params
    head_mm = 2.0 * spec.head_matmul_params
    attn_per_pair = 4.0 * spec.layers * spec.heads * spec.head_dim
    kv_gpu = float(spec.kv_bytes_per_token_per_gpu(tp))
    if phase == "prefill":
        pairs = n * n - n * (n - 1) / 2 if spec.kind == "decoder" else n * n
        flops = b * (n * layer_mm + head_mm + attn_per_pair * pairs)
        act_tokens = b * n
        kv_bytes = b * n * kv_gpu  # the KV cache written once
    else:
        flops = b * (layer_mm + head_mm + attn_per_pair * (n + 1))
        act_tokens = b
        kv_bytes = b * n * kv_gpu  # the whole KV cache read every step
    return {
        "flops": flops,
        "bytes": float(spec.weight_bytes_per_gpu(tp)) + kv_bytes,
        "msg_bytes": act_tokens * spec.hidden * spec.dtype_bytes,
        "layers": spec.layers,
    }


def _sat(share: NDArray, sat: float) -> NDArray:
    return np.minimum(1.0, share / sat)


def _compute_ms(t: dict, g, tp: int, s: NDArray, e: PhaseEfficiency) -> NDArray:
    return 1e3 * t["flops"] / tp / (g.peak_flops * e.compute_eff * _sat(s, e.compute_share_sat))


def _memory_ms(t: dict, g, s: NDArray, e: PhaseEfficiency) -> NDArray:
    return 1e3 * t["bytes"] / (g.hbm_bytes_per_s * e.memory_eff * _sat(s, e.memory_share_sat))


def _comm_ms(t: dict, g, tp: int, ar: AllReduceCost) -> NDArray:
    if tp == 1:
        return np.zeros_like(t["msg_bytes"])
    one = ar.latency_us * 1e-3 + 1e3 * 2.0 * (tp - 1) / tp * t["msg_bytes"] / (
        g.interconnect_bytes_per_s * ar.efficiency)
    return 2.0 * t["layers"] * one


def _combine(t: dict, g, tp: int, s: NDArray, e: PhaseEfficiency, ar: AllReduceCost) -> NDArray:
    c, m = _compute_ms(t, g, tp, s, e), _memory_ms(t, g, s, e)
    p = e.smooth_power
    hi = np.maximum(c, m)
    body = hi * ((c / hi) ** p + (m / hi) ** p) ** (1.0 / p)
    return e.overhead_ms + t["layers"] * e.layer_overhead_ms + body + _comm_ms(t, g, tp, ar)


# --------------------------------------------------------------------------- calibration
_PHASE_FIELDS = [f.name for f in fields(PhaseEfficiency)]
_LOWER = {"compute_eff": 0.02, "memory_eff": 0.05, "compute_share_sat": 0.2,
          "memory_share_sat": 0.05, "overhead_ms": 0.0, "layer_overhead_ms": 0.0,
          "smooth_power": 1.0}
_UPPER = {"compute_eff": 1.0, "memory_eff": 1.0, "compute_share_sat": 1.0,
          "memory_share_sat": 1.0, "overhead_ms": 100.0, "layer_overhead_ms": 5.0,
          "smooth_power": 20.0}


@dataclass(frozen=True)
class CalibrationReport:
    """Median and 90th-percentile absolute percentage error per phase, after calibration."""

    median_ape: Mapping[str, float]
    p90_ape: Mapping[str, float]
    n_points: Mapping[str, int]


def calibrate_allreduce(points: Sequence[tuple[int, float, float]], link_gbps: float) -> AllReduceCost:
    """Fit the ring all-reduce cost to ``(workers, size_bytes, time_ms)`` points on one link."""
    w = np.array([p[0] for p in points], float)
    size = np.array([p[1] for p in points], float)
    y = np.array([p[2] for p in points], float)
    if len(y) < 2 or np.any(y <= 0):
        raise InputError("all-reduce timings", "time_ms", "at least two positive timings")

    def model(x: NDArray) -> NDArray:
        return x[0] * 1e-3 + 1e3 * 2 * (w - 1) / w * size / (link_gbps * 1e9 * x[1])

    res = least_squares(lambda x: np.log(model(x)) - np.log(y), [20.0, 0.5],
                        bounds=([0.0, 0.01], [1000.0, 1.0]), loss="soft_l1", f_scale=0.1)
    return AllReduceCost(latency_us=round(float(res.x[0]), 4), efficiency=round(float(res.x[1]), 4))


def calibrate_roofline(
    measurements: Sequence[Measurement],
    catalog: Catalog | None = None,
    allreduce: AllReduceCost | None = None,
    source: str = "",
) -> tuple[RooflineCalibration, CalibrationReport]:
    """Fit each phase's efficiency factors to measurements of catalog models (log error)."""
    cat = catalog or default_catalog()
    ar = allreduce or AllReduceCost()
    usable = [m for m in measurements if cat.has_model(m.model) and cat.has_gpu(m.gpu)]
    if not usable:
        raise InputError("measurements", "model", "measurements of models and GPUs in the catalog")
    phases: dict[str, PhaseEfficiency] = {}
    med, p90, count = {}, {}, {}
    for phase in ("prefill", "decode"):
        groups: dict[tuple[str, str, int], list[Measurement]] = {}
        for m in usable:
            if m.phase == phase:
                groups.setdefault((m.model, m.gpu, m.tp), []).append(m)
        if not groups:
            phases[phase] = PhaseEfficiency()
            continue
        prepared = []
        for (model, gpu, tp), pts in sorted(groups.items()):
            b = np.array([p.batch for p in pts], float)
            n = np.array([p.tokens for p in pts], float)
            s = np.array([p.share for p in pts], float)
            y = np.array([p.latency_ms for p in pts], float)
            prepared.append((_terms(cat.model(model), tp, phase, b, n), cat.gpu(gpu), tp, s, y))

        def resid(x: NDArray, prepared=prepared) -> NDArray:
            e = PhaseEfficiency(*x)
            return np.concatenate([np.log(_combine(t, g, tp, s, e, ar)) - np.log(y)
                                   for t, g, tp, s, y in prepared])

        x0 = np.array([getattr(PhaseEfficiency(), f) for f in _PHASE_FIELDS])
        lo = [_LOWER[f] for f in _PHASE_FIELDS]
        hi = [_UPPER[f] for f in _PHASE_FIELDS]
        fit = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1)
        phases[phase] = PhaseEfficiency(*(round(float(v), 6) for v in fit.x))
        err = np.abs(np.expm1(resid(np.array([getattr(phases[phase], f) for f in _PHASE_FIELDS]))))
        med[phase], p90[phase], count[phase] = float(np.median(err)), float(np.percentile(err, 90)), len(err)
    cal = RooflineCalibration(prefill=phases["prefill"], decode=phases["decode"], allreduce=ar,
                              source=source or "calibrate_roofline")
    return cal, CalibrationReport(med, p90, count)


# --------------------------------------------------------------------------- files
class _PhaseRec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    compute_eff: float = Field(gt=0, le=1)
    memory_eff: float = Field(gt=0, le=1)
    compute_share_sat: float = Field(gt=0, le=1)
    memory_share_sat: float = Field(gt=0, le=1)
    overhead_ms: float = Field(ge=0)
    layer_overhead_ms: float = Field(ge=0)
    smooth_power: float = Field(ge=1, le=100)


class _ARRec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    latency_us: float = Field(ge=0)
    efficiency: float = Field(gt=0, le=1)


class _CalRec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefill: _PhaseRec
    decode: _PhaseRec
    allreduce: _ARRec
    source: str = ""


def load_calibration(path: str | os.PathLike[str]) -> RooflineCalibration:
    """Read a roofline calibration YAML file."""
    p = Path(path)
    return _parse_calibration(read_yaml(p, "roofline calibration file (YAML)"), str(p))


def _parse_calibration(raw: object, source: str) -> RooflineCalibration:
    rec = validated(_CalRec, raw, source)
    return RooflineCalibration(
        prefill=PhaseEfficiency(**rec.prefill.model_dump()),
        decode=PhaseEfficiency(**rec.decode.model_dump()),
        allreduce=AllReduceCost(**rec.allreduce.model_dump()),
        source=rec.source,
    )


def save_calibration(cal: RooflineCalibration, path: str | os.PathLike[str]) -> None:
    """Write a calibration as YAML (deterministic, atomic)."""
    atomic_write_text(path, dump_yaml(cal.to_dict(), sort_keys=True))


@functools.cache
def bundled_calibration() -> RooflineCalibration:
    """The calibration shipped with the package (A100, MuxServe grid + Vidur all-reduce)."""
    text = resources.files("scepsy_profile").joinpath(BUNDLED_CALIBRATION).read_text("utf-8")
    source = f"scepsy_profile/{BUNDLED_CALIBRATION}"
    return _parse_calibration(parse_yaml(text, source), source)


def roofline_model(catalog: Catalog | None = None,
                   calibration: RooflineCalibration | None = None) -> RooflineModel:
    """The analytical model over the (default) catalog with the bundled calibration."""
    return RooflineModel(catalog or default_catalog(), calibration or bundled_calibration())


