"""A finite run on one LLM instance: what ``N`` requests arriving at rate ``λ`` see
(docs/validate.md, "Finite runs and overload").

The steady state (:class:`~scepsy_profile.serving.ServingCurve`) answers for a run that lasts
forever; a measured run has ``N`` arrivals over ``T = N/λ`` and ends when the last one is
served. With ``μ`` the instance's saturation throughput:

* **not overloaded** (``λ < μ``): the queueing wait of the steady state, but at most what a
  queue can build in ``N`` arrivals. Near ``ρ = 1`` the queue is a reflected random walk with
  a step variance of about 2 (Poisson arrivals and services), whose mean over ``N`` steps is
  ``(2/3)·√2·√(2N/π) ≈ 0.75·√N`` requests, a wait of :func:`walk_wait` ``= 0.75·√N / μ``;
* **overloaded** (``λ ≥ μ``): the backlog grows at ``λ − μ``; request ``k`` waits
  ``k·(1/μ − 1/λ)``, ``(N − 1)/2·(1/μ − 1/λ)`` on average (at least the random walk's wait),
  and is served in a full batch (``B_max/μ``). Only what the engine cannot admit (beyond
  :attr:`~scepsy_profile.serving.ServingCurve.admits` calls at once) waits before the first
  token, unless the engine queues a part ``queued`` of the whole backlog in front (its
  overheads' ``overload_queued``), which it does only where the run brings more requests than
  it admits at once: where it admits all ``N``, none waits in front and the overload shows as
  a slower TPOT.

Throughput is what the run served: ``N`` over the time from the first arrival to the last
completion, ``max(N/λ, N/μ) + L + D`` with ``L`` the last request's service and ``D`` the pure
delay per call. TTFT is the wait plus the prefill of its group plus ``D``; TPOT the rest of the
latency over ``O − 1`` tokens. A wait's
90th percentile is ``ln 10`` times its mean (exponential) without overload, and 1.8 times the
backlog's mean (uniform over ``[0, max]``) with it; the share of calls within a TTFT bound
(:meth:`FiniteRun.ttft_within`) follows the same distribution, matched to the p90.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scepsy_common.errors import InputError
from scepsy_opt.prediction.colocation import operating_point
from scepsy_opt.prediction.slo import ttft_attainment
from scepsy_opt.prediction.tails import backlog_waits
from scepsy_profile.serving import ServingCurve

WALK = 0.75
"""The random walk's mean queue over ``N`` arrivals, in units of ``√N`` requests."""
QUEUED = 0.0
"""The default of :func:`finite_run`'s ``queued``: only what the KV cache cannot admit waits."""
P90_EXP = math.log(10.0)
P90_UNIFORM = 1.8


@dataclass(frozen=True)
class FiniteRun:
    """One LLM's figures over a finite run (seconds, req/s)."""

    throughput: float
    mean_latency_s: float
    mean_ttft_s: float
    p90_ttft_s: float
    mean_tpot_s: float
    overloaded: bool
    ttft_floor_s: float = 0.0  # the TTFT without waiting: the group's prefill and the delay
    wait_shape: str = "exponential"  # the wait's distribution (scepsy_opt.prediction.slo.WAIT_SHAPES)
    wait_mean_s: float = 0.0  # its mean: the p90 TTFT less the floor, over the shape's p90

    def ttft_within(self, bound_s: float) -> float:
        """The share of the run's calls whose TTFT is at most ``bound_s`` under the wait's
        distribution (:func:`scepsy_opt.prediction.slo.ttft_attainment`)."""
        return ttft_attainment(bound_s, self.ttft_floor_s, self.wait_mean_s, self.wait_shape)


def walk_wait(requests: int, mu: float) -> float:
    """The mean wait a random-walk queue builds over ``requests`` arrivals at ``ρ ≈ 1``."""
    return WALK * math.sqrt(requests) / mu


def finite_run(curve: ServingCurve, rate: float, requests: int,
               queued: float = QUEUED, delay_s: float = 0.0) -> FiniteRun:
    """The figures of ``requests`` Poisson arrivals at ``rate`` (req/s) on the instance of
    ``curve`` (module docstring); ``queued``: the part of an overload's backlog that waits
    before its first token even where the KV cache would admit it (in [0, 1]); ``delay_s``: a
    pure delay per call before its first token (the engine overheads' ``call_delay_s``)."""
    if not 0 <= queued <= 1:
        raise InputError("finite run", "queued", "a fraction in [0, 1]", queued)
    if not (math.isfinite(delay_s) and delay_s >= 0):
        raise InputError("finite run", "delay_s", "a delay >= 0 (s)", delay_s)
    if not (math.isfinite(rate) and rate > 0):
        raise InputError("finite run", "rate", "a rate > 0 (req/s)", rate)
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise InputError("finite run", "requests", "an integer >= 1", requests)
    if not curve.feasible:
        raise InputError("finite run", "curve", "a feasible instance (the model and one call "
                         "fit its memory)", curve.model)
    mu, o, n = curve.mu, curve.output_tokens, requests
    walk = walk_wait(n, mu)
    batch, in_service = operating_point(curve, rate)
    if rate < mu:
        wait = min(curve.wait_s(rate), walk)
        first, p90_first = wait, P90_EXP * wait
        span = n / rate
    else:
        drift = (n - 1) / 2.0 * (1.0 / mu - 1.0 / rate)
        wait = max(drift, walk)
        admitted = curve.admits
        first, p90_first = _admission_wait(n, rate, mu, admitted)
        if n > admitted:  # a backlog the engine cannot hold at once: part of it in front
            first = max(first, queued * drift)
            p90_first = max(p90_first, queued * P90_UNIFORM * drift)
        span = n / mu
    prefill = curve.group_prefill_s(batch)
    latency = wait + in_service
    tpot = max(latency - first - prefill, 0.0) / max(o - 1.0, 1.0)
    shape = "exponential" if rate < mu else "uniform"
    return FiniteRun(throughput=n / (span + in_service + delay_s),
                     mean_latency_s=latency + delay_s, mean_ttft_s=first + prefill + delay_s,
                     p90_ttft_s=p90_first + prefill + delay_s,
                     mean_tpot_s=tpot, overloaded=rate >= mu, ttft_floor_s=prefill + delay_s,
                     wait_shape=shape,
                     wait_mean_s=p90_first / (P90_EXP if rate < mu else P90_UNIFORM))


def finite_run_recorded(curve: ServingCurve, times_s: Sequence[float] | NDArray[np.float64],
                        queued: float = QUEUED, delay_s: float = 0.0) -> FiniteRun:
    """The figures of requests arriving at the recorded ``times_s`` (s from the run's start)
    on the instance of ``curve`` (docs/validate.md, "Recorded arrivals"): each waits the
    backlog the times build at the instance's throughput ``μ`` (:func:`backlog_waits`); only
    what the engine cannot admit at once (beyond :attr:`ServingCurve.admits` calls of
    backlog) waits before the first token, or a part ``queued`` of the whole backlog where the
    run brings more requests than the engine admits; each is served at the operating point of
    the run's mean rate (its count over its span). Throughput counts from the run's start to
    the last completion. The bursts are kept; the noise of random service times is not."""
    if not 0 <= queued <= 1:
        raise InputError("finite run", "queued", "a fraction in [0, 1]", queued)
    if not (math.isfinite(delay_s) and delay_s >= 0):
        raise InputError("finite run", "delay_s", "a delay >= 0 (s)", delay_s)
    t = np.sort(np.asarray(times_s, dtype=float))
    if t.ndim != 1 or len(t) < 1 or not np.all(np.isfinite(t)) or np.any(t < 0):
        raise InputError("finite run", "times_s", "one or more arrival times >= 0 (s)")
    if not curve.feasible:
        raise InputError("finite run", "curve", "a feasible instance (the model and one call "
                         "fit its memory)", curve.model)
    mu, o, n = curve.mu, curve.output_tokens, len(t)
    span = float(t[-1] - t[0])
    rate = n / span if span > 0 else math.inf
    batch, in_service = operating_point(curve, rate)
    w = backlog_waits(t, mu)
    admitted = curve.admits
    front = np.maximum(w - admitted / mu, 0.0)
    if n > admitted:
        front = np.maximum(front, queued * w)
    prefill = curve.group_prefill_s(batch)
    latency = float(np.mean(w)) + in_service
    first = float(np.mean(front))
    p90 = float(np.percentile(front, 90))
    tpot = max(latency - first - prefill, 0.0) / max(o - 1.0, 1.0)
    return FiniteRun(throughput=n / (float(t[-1]) + float(w[-1]) + in_service + delay_s),
                     mean_latency_s=latency + delay_s, mean_ttft_s=first + prefill + delay_s,
                     p90_ttft_s=p90 + prefill + delay_s, mean_tpot_s=tpot,
                     overloaded=rate >= mu or bool(np.max(w) * mu > admitted),
                     ttft_floor_s=prefill + delay_s, wait_shape="exponential",
                     wait_mean_s=first)


def _admission_wait(n: int, rate: float, mu: float, admitted: float) -> tuple[float, float]:
    """Mean and 90th percentile of the wait before the first token in an overload: the ``k``-th
    arrival finds ``k·(1 − μ/λ)`` calls in the system, and waits only for those beyond the
    ``admitted`` ones (``(k·(1 − μ/λ) − admitted)⁺ / μ``)."""
    c = 1.0 - mu / rate
    if c <= 0:
        return 0.0, 0.0
    k0 = admitted / c
    mean = c * (n - k0) ** 2 / (2.0 * n * mu) if n > k0 else 0.0
    return mean, max(0.0, 0.9 * n * c - admitted) / mu
