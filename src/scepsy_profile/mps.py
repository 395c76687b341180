"""MPS limits per phase, and LLMs that share GPUs under them (docs/validate.md).

NVIDIA MPS *limits* a client's SMs (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``); it does not reserve
them. MuxServe sets one limit for an LLM's prefills and another for its decodes, and the limits
of the LLMs on one mesh may add up to more than 100. Two pieces model that:

* :class:`PhaseShareModel`: a latency model that answers prefills at one share and decode steps
  at another, whatever share it is asked at (the allocation's share then only names the
  instance and its memory);
* :func:`contended_shares`: the share each phase of each LLM on a mesh gets when the others are
  busy (``u_j``: the fraction of time LLM ``j`` has work, so runs kernels), in one of two forms:

  - ``"mps"`` (MuxServe's ``flexsm``): LLMs run at once. An LLM ``i`` with limits
    ``(p_i, d_i)`` (fractions of the GPU) meets, while it runs, the decode limits of the others
    weighted by how busy they are, ``C_i = Σ_{j≠i} u_j·d_j`` (decode dominates the busy time of
    chat LLMs). When its limit and that demand exceed the GPU, everyone is scaled down in
    proportion: prefill share ``p_i / max(1, p_i + C_i)``, decode share
    ``d_i / max(1, d_i + C_i)``. Co-runners also contend for memory bandwidth and caches
    beyond SMs: every step of ``i`` is slowed by ``1 + α·Σ_{j≠i} u_j`` (``α``, calibrated on
    measured runs);
  - ``"turns"`` (MuxServe's ``temporal``): LLMs take turns on the whole mesh, one step each,
    so a step of ``i`` waits for one step of every busy co-runner:
    ``slowdown = 1 + Σ_{j≠i} u_j·s_j / s_i`` with ``s`` the steps alone.

  An LLM alone on its GPUs keeps its limits.

The busy fractions depend on the shares, so :func:`contended_shares` takes them as an input and
the caller iterates to a fixed point (``scepsy_opt.prediction.colocation.contend``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from scepsy_common.errors import InputError
from scepsy_profile.latency import LatencyModel, Number, check_point, measured_shares

INTERFERENCE = 0.0
"""``α``, the slowdown per busy co-runner beyond SM sharing. 0 fits MuxServe's measured MPS runs
best (docs/validate.md, "Co-location")."""


@dataclass(frozen=True)
class PhaseShareModel:
    """``inner`` with prefills at ``prefill`` and decode steps at ``decode`` (fractions of the
    GPU in (0, 1]), each step ``slowdown`` (>= 1) times longer; the share a query passes is
    ignored. ``call_delay_s`` is the inner model's."""

    inner: LatencyModel
    prefill: float
    decode: float
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prefill", "decode"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and 0 < v <= 1):
                raise InputError("phase shares", name, "a share of the GPU in (0, 1]", v)
        if not (math.isfinite(self.slowdown) and self.slowdown >= 1):
            raise InputError("phase shares", "slowdown", "a factor >= 1", self.slowdown)

    @property
    def call_delay_s(self) -> float:
        return float(getattr(self.inner, "call_delay_s", 0.0))

    def prefill_ms(self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike,
                   seq: ArrayLike) -> Number:
        check_point(share, batch, seq, "seq")  # the share asked at is checked, then replaced
        sh = np.broadcast_to(self.prefill, np.shape(share)) if np.ndim(share) else self.prefill
        return _scaled(self.inner.prefill_ms(model, gpu, tp, sh, batch, seq), self.slowdown)

    def decode_ms(self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike,
                  ctx: ArrayLike) -> Number:
        check_point(share, batch, ctx, "ctx")
        sh = np.broadcast_to(self.decode, np.shape(share)) if np.ndim(share) else self.decode
        return _scaled(self.inner.decode_ms(model, gpu, tp, sh, batch, ctx), self.slowdown)

    def covers(self, model: str, gpu: str, tp: int) -> bool:
        return self.inner.covers(model, gpu, tp)

    def measured_shares(self, model: str, gpu: str, tp: int) -> tuple[float, float] | None:
        return measured_shares(self.inner, model, gpu, tp)


def _scaled(values: Number, factor: float) -> Number:
    out = np.asarray(values, dtype=float) * factor
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class Contended:
    """One LLM's shares on a shared mesh: what its prefills and decodes get, and the slowdown
    of its steps."""

    prefill: float
    decode: float
    slowdown: float


@dataclass(frozen=True)
class CoRunner:
    """One LLM of a mesh as the others see it: its MPS limits (fractions of the GPU in (0, 1]),
    the fraction of time it has work (in [0, 1]) and its mean step (ms) when it runs alone on
    its limits."""

    prefill: float
    decode: float
    busy: float = 0.0
    step_ms: float = 0.0


SHARING = ("mps", "turns", "jobs")
"""How the LLMs of a mesh share it: concurrently under MPS limits, taking turns, or as
MuxServe's scheduler runs them (``"jobs"``: concurrently where their steps' SM parts fit
together, :func:`jobs_fit`, in turns where they do not)."""

SM_PARTS = 10
"""MuxServe's scheduler hands a mesh's SMs out in tenths (its ``SMResource``): a job (a prefill,
or a decode step) of an LLM at MPS limit ``s`` holds :func:`job_parts` of them while it runs."""
OVERLOAD_PARTS = 2
"""The parts a mesh may be overloaded by (MuxServe's ``overload_threshold``, 2 in every shipped
configuration): jobs start only while at most ``SM_PARTS + OVERLOAD_PARTS`` parts are held."""


def job_parts(share: float, parts: int = SM_PARTS) -> int:
    """The SM parts a job at MPS limit ``share`` holds: ``round(share · parts)``, at least one
    and at most ``parts``."""
    return min(parts, max(1, round(share * parts)))


def jobs_fit(a: float, b: float, parts: int = SM_PARTS, overload: int = OVERLOAD_PARTS) -> bool:
    """Whether a job at MPS limit ``a`` and one at ``b`` can run at once on one mesh."""
    return job_parts(a, parts) + job_parts(b, parts) <= parts + overload


def contended_shares(mesh: Mapping[str, CoRunner], sharing: str = "mps",
                     interference: float = INTERFERENCE) -> dict[str, Contended]:
    """The shares of the LLMs of one mesh (module docstring). ``"mps"``: limits scaled down
    where they and the busy co-runners' decode limits exceed the GPU, steps slowed by
    ``1 + α·Σ busy``; ``"turns"``: each step runs on the LLM's own limits, after one step of
    every busy co-runner, ``slowdown = 1 + Σ_j busy_j·step_j / step_i``; ``"jobs"``: ``"mps"``
    with the co-runners whose decode steps fit beside the LLM's (:func:`jobs_fit`), ``"turns"``
    with the others, which wait for each other. An LLM alone keeps its limits."""
    if sharing not in SHARING:
        raise InputError("contention", "sharing", f"one of {list(SHARING)}", sharing)
    if not (math.isfinite(interference) and interference >= 0):
        raise InputError("contention", "interference", "a number >= 0", interference)
    for m, c in mesh.items():
        if not (0 < c.prefill <= 1 and 0 < c.decode <= 1):
            raise InputError("contention", f"mesh.{m}", "prefill and decode limits in (0, 1]",
                             (c.prefill, c.decode))
        if not (0 <= c.busy <= 1 and math.isfinite(c.step_ms) and c.step_ms >= 0):
            raise InputError("contention", f"mesh.{m}", "busy in [0, 1] and step_ms >= 0",
                             (c.busy, c.step_ms))
    out: dict[str, Contended] = {}
    for m, c in mesh.items():
        others = [x for j, x in mesh.items() if j != m]
        if sharing == "turns":
            wait = sum(x.busy * x.step_ms for x in others)
            slow = 1.0 + (wait / c.step_ms if c.step_ms > 0 else 0.0)
            out[m] = Contended(c.prefill, c.decode, slow)
            continue
        beside = [x for x in others if sharing == "mps" or jobs_fit(c.decode, x.decode)]
        turns = [x for x in others if x not in beside]
        wait = sum(x.busy * x.step_ms for x in turns)
        demand = sum(x.busy * x.decode for x in beside)
        out[m] = Contended(prefill=c.prefill / max(1.0, c.prefill + demand),
                           decode=c.decode / max(1.0, c.decode + demand),
                           slowdown=1.0 + interference * sum(x.busy for x in beside)
                           + (wait / c.step_ms if c.step_ms > 0 else 0.0))
    return out
