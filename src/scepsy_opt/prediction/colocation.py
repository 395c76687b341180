"""LLMs that share GPUs under MPS limits: the shares they get from each other (docs/validate.md,
"Co-location").

The LLMs of one mesh (``Instance.mesh``) run on the same GPUs, each under its own prefill and
decode limits (:attr:`~scepsy_opt.allocation.Instance.phase_shares`), which may add up to more
than the GPU. What each gets depends on how busy the others are
(:func:`scepsy_profile.mps.contended_shares`), and how busy each is depends on what it gets:
:func:`contend` iterates the two to a fixed point, from idle co-runners, with damping. An LLM is
busy the fraction of time it has at least one call in service (:func:`busy_fraction`), at the
batch its serving curve holds at its rate (:func:`operating_point`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from scepsy_common.errors import InputError
from scepsy_profile.latency import LatencyModel
from scepsy_profile.mps import (
    INTERFERENCE,
    Contended,
    CoRunner,
    PhaseShareModel,
    contended_shares,
)
from scepsy_profile.serving import ServingCurve

ROUNDS = 30
DAMPING = 0.5
TOL = 1e-4


def operating_point(curve: ServingCurve, rate: float) -> tuple[float, float]:
    """``(calls in service, in-service time of a call in s)`` at ``rate``: the steady state's
    below μ, a full batch at and beyond it."""
    if rate < curve.mu:
        return float(curve.batch_at_rate(rate)), curve.in_service_s(rate)
    return float(curve.max_batch), curve.max_batch / curve.mu


def busy_fraction(batch: float) -> float:
    """The fraction of time an instance with ``batch`` calls in service on average has at
    least one (Poisson: ``1 − e^−B``): while it has one it runs kernels."""
    return 1.0 - math.exp(-max(batch, 0.0))


def phase_model(latency: LatencyModel, c: Contended) -> PhaseShareModel:
    """``latency`` answering at the contended shares ``c``."""
    return PhaseShareModel(latency, c.prefill, c.decode, c.slowdown)


def contend(meshes: Mapping[str, Sequence[str]], limits: Mapping[str, tuple[float, float]],
            rates: Mapping[str, float], curve_of: Callable[[str, LatencyModel], ServingCurve],
            latency: LatencyModel, sharing: str = "mps", interference: float = INTERFERENCE,
            source: str | None = None, field: str = "llms.{llm}.memory",
            ) -> dict[str, Contended]:
    """The contended shares of every LLM of ``meshes`` (mesh -> its LLMs; ``limits``: LLM ->
    (prefill, decode) limits; ``rates``: LLM -> calls/s; ``curve_of(llm, latency model)``: its
    serving curve under a latency model). Each LLM's step alone (for ``"turns"``) is its mean
    iteration at its own limits; the busy fractions start at 0 and move half-way to what the
    curves give at the current shares, until they move less than :data:`TOL` (at most
    :data:`ROUNDS` rounds). An LLM whose instance cannot hold one call is an
    :class:`InputError` naming ``source`` (default: its mesh's name) and ``field`` (``{llm}``:
    the LLM)."""
    out: dict[str, Contended] = {}
    where = {m: source or mesh for mesh, names in meshes.items() for m in names}

    def point(m: str, lat: LatencyModel) -> tuple[float, float, float]:
        curve = curve_of(m, lat)
        if not curve.feasible:
            raise InputError(where[m], field.format(llm=m), f"a part of the GPUs' memory that "
                             f"holds {curve.model}'s weights and one call (its KV cache holds "
                             f"{curve.memory.kv_tokens} tokens)")
        batch, in_service = operating_point(curve, rates[m])
        return batch, in_service, curve.output_tokens
    for names in meshes.values():
        alone = {m: Contended(*limits[m], 1.0) for m in names}
        if len(names) == 1:
            out.update(alone)
            continue
        step = {}
        for m in names:
            _, in_service, out_tokens = point(m, phase_model(latency, alone[m]))
            step[m] = 1e3 * in_service / max(out_tokens, 1.0)
        busy = dict.fromkeys(names, 0.0)

        def mesh(busy: Mapping[str, float], names: Sequence[str] = names,
                 step: Mapping[str, float] = step) -> dict[str, CoRunner]:
            return {m: CoRunner(*limits[m], busy[m], step[m]) for m in names}
        for _ in range(ROUNDS):
            shares = contended_shares(mesh(busy), sharing, interference)
            new = {m: busy_fraction(point(m, phase_model(latency, shares[m]))[0])
                   for m in names}
            moved = max(abs(new[m] - busy[m]) for m in names)
            busy = {m: DAMPING * busy[m] + (1 - DAMPING) * new[m] for m in names}
            if moved < TOL:
                break
        out.update(contended_shares(mesh(busy), sharing, interference))
    return out
