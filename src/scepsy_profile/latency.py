"""The latency-model protocol every stage queries, and the composition of two models.

A latency model answers two questions for one LLM instance (model, gpu, tp, share):

* ``prefill_ms(model, gpu, tp, share, batch, seq)``: one forward pass over ``batch`` prompts of
  ``seq`` tokens each;
* ``decode_ms(model, gpu, tp, share, batch, ctx)``: one decode step for ``batch`` sequences whose
  KV cache holds ``ctx`` tokens each.

``share``, ``batch`` and ``seq``/``ctx`` may be numpy arrays (broadcast together); the answer is a
float for scalar input and an array otherwise. ``covers(model, gpu, tp)`` says whether the model
can answer for that instance without guessing; an instance it does not cover raises
:class:`~scepsy_common.errors.UncoveredInstanceError`.

Optionally, ``measured_shares(model, gpu, tp)`` says which shares an instance's answers rest on
measurements for: ``(lowest, highest)`` measured share, or ``None`` where the model is not a
measurement (the roofline model: a physics model answers every share in (0, 1] alike, so it
counts as covering every share). Shares outside the range are extrapolated. A model without the
method is read as ``None`` (:func:`measured_shares`, the accessor every caller uses); every
model of this package defines it. It is not part of :class:`LatencyModel`, so that a model
written before it still is one.

The contract every implementation keeps (docs/profiles.md, checked for each of them by
``tests/scepsy_profile/test_latency_conformance.py``): one point gives the same answer within a relative 1e-12
however it is asked (scalar, array element, broadcast); answers are finite, positive, never
smaller with more batch or tokens and never larger with more share; pickling preserves answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scepsy_common.errors import InputError

Number = float | NDArray[np.float64]


@runtime_checkable
class LatencyModel(Protocol):
    """What the predictor, optimiser and simulator need from a profile."""

    def prefill_ms(
        self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike, seq: ArrayLike
    ) -> Number: ...

    def decode_ms(
        self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike, ctx: ArrayLike
    ) -> Number: ...

    def covers(self, model: str, gpu: str, tp: int) -> bool: ...


def measured_shares(latency: LatencyModel, model: str, gpu: str,
                    tp: int) -> tuple[float, float] | None:
    """The range of shares ``latency`` measured for ``(model, gpu, tp)``: ``(lowest, highest)``,
    or ``None`` where its answers are not measurements (an analytical model, or a model without
    a ``measured_shares`` method): every share is then as good as any other. An instance the
    model does not cover raises :class:`~scepsy_common.errors.UncoveredInstanceError`, as its
    queries do. The range is empty (``lowest > highest``) where no share is measured for every
    curve the instance uses (a fitted TP degree between two measured ones whose ranges do not
    overlap)."""
    method = getattr(latency, "measured_shares", None)
    if method is None:
        return None
    return method(model, gpu, tp)


def within_measured(share: float, measured: tuple[float, float] | None,
                    tol: float = 1e-9) -> bool:
    """Whether ``share`` lies in the ``measured`` range of :func:`measured_shares` (within an
    absolute ``tol``: grid shares and stored share nodes are rounded decimals); always True for
    ``None``."""
    return measured is None or measured[0] - tol <= share <= measured[1] + tol


def check_point(
    share: ArrayLike, batch: ArrayLike, tokens: ArrayLike, tokens_name: str
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], bool]:
    """Validate and broadcast one query; return arrays and whether the input was all scalar."""
    scalar = all(np.ndim(v) == 0 for v in (share, batch, tokens))
    s, b, t = np.broadcast_arrays(
        np.asarray(share, dtype=float), np.asarray(batch, dtype=float), np.asarray(tokens, dtype=float)
    )
    if not np.all((s > 0) & (s <= 1)):
        raise InputError("query", "share", "a GPU share in (0, 1]", _first_bad(s, (s > 0) & (s <= 1)))
    if not np.all(b >= 1):
        raise InputError("query", "batch", "a batch size >= 1", _first_bad(b, b >= 1))
    if not np.all(t >= 1):
        raise InputError("query", tokens_name, "a token count >= 1", _first_bad(t, t >= 1))
    return s, b, t, scalar


def _first_bad(values: NDArray[np.float64], ok: NDArray[np.bool_]) -> float:
    return float(values[~ok].flat[0])


def as_output(values: NDArray[np.float64], scalar: bool) -> Number:
    """Return a float for scalar queries, the array otherwise."""
    return float(values.reshape(-1)[0]) if scalar else values


@dataclass(frozen=True)
class CompositeLatencyModel:
    """Measured curves where they exist, an analytical fallback elsewhere.

    ``primary`` (usually a :class:`~scepsy_profile.fitted.FittedLatencyModel`) answers for every
    (model, gpu, tp) it covers; ``fallback`` (usually the roofline model) answers the rest, and
    raises its :class:`~scepsy_common.errors.UncoveredInstanceError` where neither covers.
    """

    primary: LatencyModel
    fallback: LatencyModel

    def _pick(self, model: str, gpu: str, tp: int) -> LatencyModel:
        return self.primary if self.primary.covers(model, gpu, tp) else self.fallback

    def prefill_ms(
        self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike, seq: ArrayLike
    ) -> Number:
        return self._pick(model, gpu, tp).prefill_ms(model, gpu, tp, share, batch, seq)

    def decode_ms(
        self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike, ctx: ArrayLike
    ) -> Number:
        return self._pick(model, gpu, tp).decode_ms(model, gpu, tp, share, batch, ctx)

    def covers(self, model: str, gpu: str, tp: int) -> bool:
        return self.primary.covers(model, gpu, tp) or self.fallback.covers(model, gpu, tp)

    def measured_shares(self, model: str, gpu: str, tp: int) -> tuple[float, float] | None:
        """The measured shares of the model that answers for the instance (the primary where
        it covers it, else the fallback: ``None`` for the roofline model)."""
        return measured_shares(self._pick(model, gpu, tp), model, gpu, tp)
