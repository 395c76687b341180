"""Measurements generated from a known latency model: test oracles and what-if data sets.

``synthetic_measurements(truth, ...)`` samples a grid from any :class:`LatencyModel` (usually the
roofline model), optionally with multiplicative log-normal noise, so a fit can be checked against
the function that generated its data.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product

import numpy as np

from scepsy_profile.latency import LatencyModel
from scepsy_profile.measurements import Measurement


def synthetic_measurements(
    truth: LatencyModel,
    model: str,
    gpu: str,
    tps: Sequence[int] = (1, 2, 4),
    shares: Sequence[float] = (0.3, 0.4, 0.6, 0.8, 0.9, 1.0),
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128),
    tokens: Sequence[int] = (32, 64, 128, 256, 512),
    noise: float = 0.0,
    seed: int = 0,
) -> tuple[Measurement, ...]:
    """A full grid of prefill and decode points from ``truth``, noise as a log-normal sigma."""
    rng = np.random.default_rng(seed)
    out: list[Measurement] = []
    for tp, share, batch, tok in product(tps, shares, batches, tokens):
        for phase in ("prefill", "decode"):
            fn = truth.prefill_ms if phase == "prefill" else truth.decode_ms
            ms = float(fn(model, gpu, tp, share, batch, tok))
            if noise > 0:
                ms *= float(np.exp(rng.normal(0.0, noise)))
            out.append(Measurement(model=model, gpu=gpu, tp=tp, share=float(share), phase=phase,
                                   batch=batch, tokens=tok, latency_ms=round(ms, 6),
                                   source="synthetic"))
    return tuple(out)
