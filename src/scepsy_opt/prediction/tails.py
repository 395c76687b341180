"""Tail latency: the predicted distribution of a workflow's request latency (p50/p90/p99).

The predictor's critical-path form prices a workflow's *mean* latency as
``L_w = Σ_m K_wm·u_m + τ_w``: ``K_wm`` is LLM ``m``'s time on a request's critical path in units
of its mean call (the mean over the trace's requests), ``u_m`` the LLM's loaded *unit latency*
(the critical-path-weighted mean call latency ``Σ_c k_c·L_c / Σ_c k_c`` of its roles at the
allocation's load, :mod:`scepsy_opt.prediction.pipeline`) and ``τ_w`` the mean tool time on the path.

**The model.** Every request ``j`` of the trace has its own weights ``W_jm`` (its critical-path
time at ``m`` over ``m``'s mean call, :class:`~scepsy_opt.stats.RequestPaths`) and tool time
``t_j``, and its predicted latency is

    ``y_j = Σ_m W_jm·u_m + t_j``

— the same sum with the request's own work instead of the mean. Why this is the conditional
mean: each LLM is a processor-sharing station (the batch shares every iteration), and under
processor sharing a job's mean sojourn is proportional to its work (M/G/1-PS:
``E[T | x] = x/(1−ρ)``), whatever the distribution of the other jobs' work. So the load scales
every request's time at ``m`` by the same factor, ``u_m / (zero-load call latency)``, and the
requests keep their relative sizes. The quantiles ``p_q`` are the quantiles of ``y`` over the
trace's requests (numpy's ``linear`` interpolation): the mean of ``y`` is exactly ``L_w``.

**What it leaves out.** ``y_j`` is each request's *conditional mean*; the spread around it (how
many other requests share the batch while this one runs: queueing noise) is not modelled. It
widens the distribution most for short requests at high load (a request of a few calls sees few
batch states; a long one averages over many), so the model's p99 is low by the most at 80% of
saturation and for workflows whose requests are short; p50 and p90 of workflows with a wide
spread of request sizes (beam search, agents) are dominated by the size spread the model does
carry. benchmarks/tail_accuracy.py measures both against the simulator (docs/tails.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np
from numpy.typing import NDArray

from scepsy_common.errors import InputError
from scepsy_opt.stats import RequestPaths

QUANTILES: tuple[float, ...] = (50.0, 90.0, 99.0)
WINDOW_PCT = 2.5  # linearisation: requests within ± this many percentile points of q


def _unit_vector(paths: RequestPaths, unit_latency_s: Mapping[str, float]) -> np.ndarray:
    """The unit latencies in ``paths.llms`` order (an LLM without critical-path time may be left
    out); InputError for a negative or NaN value or a missing LLM that is on some path."""
    # weights is 2-D: any over axis 0 is an array
    used = (cast(np.ndarray, paths.weights.any(axis=0)) if paths.weights.size
            else np.zeros(len(paths.llms), bool))
    out = np.zeros(len(paths.llms))
    for j, m in enumerate(paths.llms):
        if m not in unit_latency_s:
            if used[j]:
                raise InputError("latency_quantiles", f"unit_latency_s.{m}",
                                 "a unit latency (s) for every LLM on the critical paths",
                                 sorted(unit_latency_s))
            continue
        v = float(unit_latency_s[m])
        if math.isnan(v) or v < 0:
            raise InputError("latency_quantiles", f"unit_latency_s.{m}", "a latency >= 0 s", v)
        out[j] = v
    return out


def request_latencies(paths: RequestPaths, unit_latency_s: Mapping[str, float]) -> np.ndarray:
    """Each request's predicted latency ``Σ_m W_jm·u_m + t_j`` (module docstring), in request order."""
    u = _unit_vector(paths, unit_latency_s)
    if not paths.requests:
        return np.zeros(0)
    w = paths.weights
    with np.errstate(invalid="ignore"):  # 0 weight × inf latency is 0: that LLM is not on the path
        terms = np.where(w > 0, w * u[None, :], 0.0)
    return terms.sum(axis=1) + paths.tool_s


def backlog_waits(times_s: Sequence[float] | NDArray[np.float64], mu: float,
                  ) -> NDArray[np.float64]:
    """Each arrival's wait behind the work ahead of it at a server of ``mu`` calls/s (the
    Lindley recursion ``w_k = max(0, w_{k−1} + 1/μ − (t_k − t_{k−1}))`` over the sorted
    ``times_s``): the backlog that recorded bursts build beyond the instance's throughput."""
    t = np.sort(np.asarray(times_s, dtype=float))
    gaps = np.diff(t, prepend=t[0])
    w = np.empty(len(t))
    acc = 0.0
    step = 1.0 / mu
    for k, g in enumerate(gaps.tolist()):
        acc = max(0.0, acc + (step if k else 0.0) - g)
        w[k] = acc
    return w


def recorded_latencies(paths: RequestPaths, unit_latency_s: Mapping[str, float],
                       picks: NDArray[np.int64], waits: Mapping[str, NDArray[np.float64]],
                       ) -> NDArray[np.float64]:
    """Each recorded arrival's predicted latency: the latency of the trace request it replays
    (``picks``, row indices of ``paths``), plus, for every LLM on its critical path, the
    backlog that LLM had when it arrived (``waits[m]``, one per arrival) once per mean call of
    that LLM on its path (``W_jm``): ``y_j + Σ_m W_jm·w_m``."""
    y = request_latencies(paths, unit_latency_s)[picks]
    extra = np.zeros(len(picks))
    for j, m in enumerate(paths.llms):
        if m in waits:
            col = paths.weights[picks, j]
            extra += np.where(col > 0, col * waits[m], 0.0)
    return y + extra


def _percentiles(y: np.ndarray, qs: tuple[float, ...]) -> tuple[float, ...]:
    """numpy's 'linear' percentiles; an infinite latency (a saturated LLM on the path) gives
    ``inf`` from the rank it holds on, where numpy's interpolation would give NaN."""
    if np.all(np.isfinite(y)):
        return tuple(float(v) for v in np.percentile(y, qs, method="linear"))
    s = np.sort(y)
    out = []
    for q in qs:
        h = (len(s) - 1) * q / 100.0
        i = math.floor(h)
        f = h - i
        lo, hi = float(s[i]), float(s[min(i + 1, len(s) - 1)])
        out.append(lo if f == 0.0 or lo == hi else math.inf if math.isinf(hi) else lo + f * (hi - lo))
    return tuple(out)


def _check_qs(qs: Sequence[float]) -> tuple[float, ...]:
    out = tuple(float(q) for q in qs)
    if not out or any(not (0.0 <= q <= 100.0) for q in out):
        raise InputError("latency_quantiles", "qs", "percentiles in [0, 100]", tuple(qs))
    return out


def latency_quantiles(paths: RequestPaths, unit_latency_s: Mapping[str, float],
                      qs: Sequence[float] = QUANTILES) -> tuple[float, ...]:
    """Predicted request-latency percentiles ``qs`` (s) of a workflow at per-LLM unit latencies."""
    q = _check_qs(qs)
    if not paths.requests:
        raise InputError("latency_quantiles", "paths", "the critical paths of at least one request",
                         "no requests")
    return _percentiles(request_latencies(paths, unit_latency_s), q)


def linearise(paths: RequestPaths, unit_latency_s: Mapping[str, float], q: float,
              window_pct: float = WINDOW_PCT) -> tuple[dict[str, float], float]:
    """A linear stand-in ``Σ_m a_m·u_m + b`` for the ``q``-th percentile near ``unit_latency_s``.

    ``a`` is the mean weight vector of the requests ranked within ``± window_pct`` percentile
    points of ``q`` at these unit latencies (at least the two ranks ``q`` interpolates between),
    and ``b`` makes the stand-in exact there: ``Σ a·u + b = p_q(u)``. Returns ``(a by LLM, b)``.
    """
    (q,) = _check_qs((q,))
    if not paths.requests:
        raise InputError("linearise", "paths", "the critical paths of at least one request",
                         "no requests")
    u = _unit_vector(paths, unit_latency_s)
    y = request_latencies(paths, unit_latency_s)
    order = np.argsort(y, kind="stable")
    n = paths.requests
    h = (n - 1) * q / 100.0
    lo = max(0, min(math.floor(h), math.floor((n - 1) * max(q - window_pct, 0.0) / 100.0)))
    hi = min(n - 1, max(math.ceil(h), math.ceil((n - 1) * min(q + window_pct, 100.0) / 100.0)))
    near = order[lo:hi + 1]
    a = paths.weights[near].mean(axis=0)
    p = _percentiles(y, (q,))[0]
    with np.errstate(invalid="ignore"):
        at = float(np.where(a > 0, a * u, 0.0).sum())
    return {m: float(a[j]) for j, m in enumerate(paths.llms)}, p - at


def floor_cut(paths: RequestPaths, unit_latency_s: Mapping[str, float],
              q: float) -> tuple[dict[str, float], float]:
    """A linear lower bound ``Σ_m a_m·u_m + b ≤ p_q(u)`` valid at *every* ``u ≥ 0``.

    ``p_q ≥ y_(i)`` (``i = ⌊(R−1)·q/100⌋``, 0-based order), so at least ``i + 1`` requests lie
    at or below ``p_q`` and any ``R − i`` requests include one of them. With ``S`` the ``R − i``
    slowest requests at ``unit_latency_s``, ``a`` their column-wise least weights and ``b`` their
    least tool time, every request of ``S`` takes at least ``a·u + b``: so does ``p_q``.
    Returns ``(a by LLM, b)``.
    """
    (q,) = _check_qs((q,))
    if not paths.requests:
        raise InputError("floor_cut", "paths", "the critical paths of at least one request",
                         "no requests")
    y = request_latencies(paths, unit_latency_s)
    n = paths.requests
    i = math.floor((n - 1) * q / 100.0)
    top = np.argsort(y, kind="stable")[i:]
    a = paths.weights[top].min(axis=0)
    return {m: float(a[j]) for j, m in enumerate(paths.llms)}, float(paths.tool_s[top].min())
