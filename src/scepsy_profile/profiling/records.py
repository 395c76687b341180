"""One line of a profile store: a measured (or failed) step point with everything that made it.

A record is self-contained: the engine and its version, the model and its shrink (``scale`` and
the exact architecture in ``config``), the device, the instance (``tp``, ``share``), the point
(``phase``, ``batch``, ``tokens``), and either the timing (median, IQR, samples) or the error.
Its :meth:`ProfileRecord.key` identifies the point: a store holds at most one finished record per
key, and a sweep that resumes skips every key already there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from scepsy_profile.measurements import Measurement, Phase
from scepsy_profile.profiling.models import profiled_name

Status = Literal["ok", "failed"]

PointKey = tuple[str, str, float, str, int, float, str, int, int]
"""(engine, model, scale, device, tp, share, phase, batch, tokens)."""


@dataclass(frozen=True, slots=True)
class ProfileRecord:
    """One measured step point (``status="ok"``) or one that could not be measured."""

    engine: str
    engine_version: str
    model: str
    """Catalog model name (canonical), before any shrink."""
    scale: float
    config: dict[str, Any]
    device: str
    tp: int
    share: float
    phase: Phase
    batch: int
    tokens: int
    status: Status
    latency_ms: float | None = None
    iqr_ms: float | None = None
    samples_ms: tuple[float, ...] = ()
    method: str = ""
    error: str = ""
    elapsed_s: float = 0.0
    device_detail: dict[str, Any] = field(default_factory=dict)

    def key(self) -> PointKey:
        return point_key(self.engine, self.model, self.scale, self.device, self.tp, self.share,
                         self.phase, self.batch, self.tokens)

    @property
    def profiled_name(self) -> str:
        """The model name of this record's curves (:func:`~.models.profiled_name`)."""
        return profiled_name(self.model, self.scale)

    def measurement(self) -> Measurement:
        """This record as a :class:`Measurement` for curve fitting (``status="ok"`` only)."""
        if self.status != "ok" or self.latency_ms is None:
            raise ValueError("a failed point has no measurement")
        return Measurement(model=self.profiled_name, gpu=self.device, tp=self.tp,
                           share=self.share, phase=self.phase, batch=self.batch,
                           tokens=self.tokens, latency_ms=self.latency_ms,
                           source=f"{self.engine} {self.engine_version}")

    def to_json(self) -> dict[str, Any]:
        """The JSON object of one store line (keys sorted by the writer)."""
        return {
            "engine": self.engine, "engine_version": self.engine_version, "model": self.model,
            "scale": self.scale, "config": self.config, "device": self.device, "tp": self.tp,
            "share": self.share, "phase": self.phase, "batch": self.batch,
            "tokens": self.tokens, "status": self.status, "latency_ms": self.latency_ms,
            "iqr_ms": self.iqr_ms, "samples_ms": list(self.samples_ms), "method": self.method,
            "error": self.error, "elapsed_s": self.elapsed_s,
            "device_detail": self.device_detail,
        }


def point_key(engine: str, model: str, scale: float, device: str, tp: int, share: float,
              phase: str, batch: int, tokens: int) -> PointKey:
    """The identity of one point in a store (floats rounded so that 0.1+0.2 finds 0.3)."""
    return (engine, model, round(float(scale), 9), device, int(tp), round(float(share), 9),
            phase, int(batch), int(tokens))


def is_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` looks like a profile store (its first non-blank line is a JSON object
    with ``engine`` and ``status``) rather than a plain measurements file. Unreadable or
    malformed files are not stores: their reader reports the problem."""
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                if raw.strip():
                    obj = json.loads(raw)
                    return isinstance(obj, dict) and "engine" in obj and "status" in obj
    except (OSError, ValueError, RecursionError):
        return False
    return False
