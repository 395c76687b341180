"""A closed-form latency model for tests of the serving curve and its comparisons."""

from __future__ import annotations

import numpy as np


class ConstantLatency:
    """Every prefill takes ``p`` ms and every decode step ``d`` ms, whatever the batch."""

    def __init__(self, p: float, d: float) -> None:
        self.p, self.d = p, d

    @staticmethod
    def _shaped(value: float, *args):
        shape = np.broadcast(*(np.asarray(a, float) for a in args)).shape
        return value if shape == () else np.full(shape, value)

    def prefill_ms(self, model, gpu, tp, share, batch, seq):
        return self._shaped(self.p, share, batch, seq)

    def decode_ms(self, model, gpu, tp, share, batch, ctx):
        return self._shaped(self.d, share, batch, ctx)

    def covers(self, model, gpu, tp) -> bool:
        return True
