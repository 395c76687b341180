"""The serving curve of one LLM instance under continuous batching.

An instance is (model, gpu, tp, share): ``tp`` GPUs inside one NVLink domain, ``share`` of each
GPU's compute (MPS) and memory. For calls with mean input ``I`` and output ``O`` tokens:

* **Memory** (per GPU): ``weights/tp + reserve + KV`` must fit in ``share · memory``. The reserve
  is activation and framework memory, ``reserve_fraction`` of the share (vLLM's
  ``gpu_memory_utilization`` headroom) plus ``reserve_gib`` per GPU whatever the share (each MPS
  client keeps its own CUDA context). What is left holds the KV cache:
  ``kv_tokens = kv_bytes / kv_bytes_per_token_per_gpu``. A candidate that cannot hold one
  sequence of ``I + O`` tokens does not exist (:attr:`ServingCurve.feasible` is False).
* **Batch limit**: a call reserves its whole ``I + O`` tokens of KV cache when it is admitted
  (no preemption, as in the simulator), so ``B_max = floor(kv_tokens / (I + O))``, capped by
  ``max_batch`` (vLLM's ``max_num_seqs``).
* **Prefill groups**: calls that arrive together (a fan-out of ``k`` concurrent calls) are
  prefilled together, and under load so are the calls that queued during one iteration: a call
  lives ``O`` iterations (one prefill, ``O − 1`` decode steps), so a batch of ``B`` admits about
  ``B/O`` calls per iteration and the group is ``g(B) = max(k, B'/O)`` calls with
  ``B' = max(B, 1)``. A group takes ``P(g) = p(g, I)``. ``k`` is ``prefill_batch`` (the
  predictor passes the LLM's mean concurrency within a request). For one-token outputs (a
  reranker, a reward model) every call of the batch is in one group, ``g = B``.
* **Throughput at batch B**: prefill produces the first output token, so a call lives for its
  group's prefill and ``O − 1`` decode steps of ``d(B', I + O/2)``, and is stalled by the
  prefills of the other groups admitted meanwhile (``(B' − g)/g`` of them, by Little's law), so
  ``λ(B) = B / (P(g) + (O − 1)·d(B', I + O/2) + max(B' − g, 0)·P(g)/g)``; ``μ = max_B≤B_max λ(B)``.
* **Latency at rate λ < μ**: ``B(λ)`` solves ``λ(B) = λ`` (``λ(B)`` is increasing up to its
  maximum; it is computed at whole batches and taken as linear in between, and as ``B·λ(1)``
  below one call in service), the in-service time is ``B/λ``, plus a queueing wait that grows as λ → μ, taken
  from Sakasegawa's M/M/c approximation with ``c = B_max`` slots of service time ``B_max/μ``:
  ``W_q ≈ ρ^(√(2(c+1)) − 1) / (c(1 − ρ)) · B_max/μ``, ``ρ = λ/μ``. At λ → 0 the latency is
  ``P + (O − 1)·d(1, I + O/2)``.
The discrete-event simulator checks these forms (scepsy_opt).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scepsy_common.errors import InputError
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.hardware import GIB
from scepsy_profile.latency import LatencyModel


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    """How much of an instance's memory is not KV cache."""

    reserve_fraction: float = 0.10
    reserve_gib: float = 1.0
    max_batch: int = 256

    def __post_init__(self) -> None:
        if not (isinstance(self.max_batch, int) and not isinstance(self.max_batch, bool)):
            raise InputError("memory policy", "max_batch", "an integer >= 1", self.max_batch)
        if not 0 <= self.reserve_fraction < 1:
            raise InputError("memory policy", "reserve_fraction", "a fraction in [0, 1)",
                             self.reserve_fraction)
        if not (math.isfinite(self.reserve_gib) and self.reserve_gib >= 0):
            raise InputError("memory policy", "reserve_gib", "a number >= 0", self.reserve_gib)
        if self.max_batch < 1:
            raise InputError("memory policy", "max_batch", "an integer >= 1", self.max_batch)


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """Per-GPU memory budget of one instance, in GiB, and the KV capacity it leaves."""

    available_gib: float
    weights_gib: float
    reserve_gib: float
    kv_gib: float
    kv_tokens: int
    feasible: bool  # holds at least one sequence of the given length


def memory_fit(model: str, gpu: str, tp: int, share: float, seq_tokens: int,
               catalog: Catalog | None = None, policy: MemoryPolicy = MemoryPolicy()) -> MemoryFit:
    """Does the instance fit, and how many KV tokens does it hold? (per GPU of the TP group)."""
    cat = catalog or default_catalog()
    spec, g = cat.model(model), cat.gpu(gpu)
    spec.check_tp(tp)
    if not 0 < share <= 1:
        raise InputError("query", "share", "a GPU share in (0, 1]", share)
    available = share * g.memory_gib
    weights = spec.weight_bytes_per_gpu(tp) / GIB
    reserve = policy.reserve_fraction * available + policy.reserve_gib
    kv = available - weights - reserve
    per_token = spec.kv_bytes_per_token_per_gpu(tp)
    if per_token == 0:  # encoders keep no KV cache: only the sequence's activations matter
        tokens = 10**9 if kv > 0 else 0
    else:
        tokens = max(int(kv * GIB // per_token), 0)
    return MemoryFit(
        available_gib=available, weights_gib=weights, reserve_gib=reserve, kv_gib=max(kv, 0.0),
        kv_tokens=tokens, feasible=kv > 0 and tokens >= seq_tokens,
    )


@dataclass(frozen=True, eq=False)
class ServingCurve:
    """Throughput and latency of one instance for calls of ``input_tokens``/``output_tokens``.

    ``service_ms`` tabulates the in-service time at the whole batches ``B = 1..max_batch``;
    between them (and between 0 and 1, where ``B' = 1``) ``λ(B)`` is linear, so ``B(λ)`` is a
    table lookup: cheap, vectorised over rates (the optimiser prices thousands of replica counts
    at once) and identical for a scalar and an array query.
    """

    model: str
    gpu: str
    tp: int
    share: float
    input_tokens: float
    output_tokens: float
    memory: MemoryFit
    max_batch: int
    mu: float  # saturation throughput, calls/s (0 when infeasible)
    prefill_ms: float  # P = p(k, I): one prefill group of k calls
    prefill_batch: float  # k
    latency_model: LatencyModel
    service_ms: NDArray[np.float64] = field(default_factory=lambda: np.empty(0))  # B = 1..max_batch

    @property
    def feasible(self) -> bool:
        return self.memory.feasible and self.mu > 0

    def group(self, batch: ArrayLike) -> NDArray[np.float64]:
        """Calls prefilled together at batch ``B``: ``g(B) = max(k, max(B, 1)/O)``."""
        return np.maximum(self.prefill_batch, np.maximum(batch, 1.0) / self.output_tokens)

    @cached_property
    def _table(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        b = np.arange(0, self.max_batch + 1, dtype=float)
        rates = np.zeros_like(b)
        rates[1:] = 1e3 * b[1:] / self.service_ms
        return b, np.maximum.accumulate(rates)

    def rate_at_batch(self, batch: ArrayLike) -> Any:
        """λ(B), calls/s: ``B / service(B)`` at whole batches, linear in between (module doc)."""
        if not self.feasible:
            raise InputError("query", "batch", "a feasible serving curve (the instance fits)", batch)
        b, rates = self._table
        out = np.interp(np.asarray(batch, dtype=float), b, rates)
        return float(out) if np.ndim(batch) == 0 else out

    def batch_at_rate(self, rate: ArrayLike) -> Any:
        """The mean number of calls in service, ``B`` with λ(B) = rate, for 0 < rate < μ."""
        r = np.asarray(rate, dtype=float)
        if not np.all((r > 0) & (r < self.mu)):
            raise InputError("query", "rate", f"rates in (0, μ={self.mu:.6g}) calls/s", rate)
        b, rates = self._table
        out = np.interp(r, rates, b)
        return float(out) if np.ndim(rate) == 0 else out

    def latency_s(self, rate: ArrayLike) -> Any:
        """Mean latency of one call (s) at arrival rate ``rate``; ``inf`` at or beyond μ.

        Vectorised: an array of rates gives an array of latencies, equal element by element to
        the scalar answers.
        """
        r = np.atleast_1d(np.asarray(rate, dtype=float))
        out = np.full(r.shape, math.inf)
        out[r <= 0] = self.zero_load_latency_s
        ok = (r > 0) & (r < self.mu) if self.feasible else np.zeros(r.shape, dtype=bool)
        if np.any(ok):
            x = r[ok]
            b, rates = self._table
            # below one call in service B = λ/λ(1): the in-service time is exactly service(1)
            in_service = np.where(x <= rates[1], float(self.service_ms[0]) / 1e3,
                                  np.interp(x, rates, b) / x)
            rho = x / self.mu
            c = self.max_batch
            wait = rho ** (math.sqrt(2.0 * (c + 1)) - 1.0) / (c * (1.0 - rho)) * (c / self.mu)
            out[ok] = in_service + wait
        return float(out[0]) if np.ndim(rate) == 0 else out

    @property
    def zero_load_latency_s(self) -> float:
        """``P(k) + (O − 1)·d(1)``: one request's calls alone on the instance."""
        if len(self.service_ms):
            return float(self.service_ms[0]) / 1e3
        d = float(self.latency_model.decode_ms(self.model, self.gpu, self.tp, self.share, 1.0,
                                               self.input_tokens + self.output_tokens / 2.0))
        return (self.prefill_ms + (self.output_tokens - 1.0) * d) / 1e3


def serving_curve(latency: LatencyModel, model: str, gpu: str, tp: int, share: float,
                  input_tokens: float, output_tokens: float, *, catalog: Catalog | None = None,
                  policy: MemoryPolicy = MemoryPolicy(),
                  prefill_batch: float = 1.0) -> ServingCurve:
    """Build the serving curve of one instance (see the module docstring for the model)."""
    return serving_curves(latency, model, gpu, tp, [share], input_tokens, output_tokens,
                          catalog=catalog, policy=policy, prefill_batch=prefill_batch)[0]


def serving_curves(latency: LatencyModel, model: str, gpu: str, tp: int, shares: Sequence[float],
                   input_tokens: float, output_tokens: float, *, catalog: Catalog | None = None,
                   policy: MemoryPolicy = MemoryPolicy(),
                   prefill_batch: float = 1.0) -> list[ServingCurve]:
    """The serving curves of one (model, gpu, tp) at several shares, with one latency-model
    query per phase for all of them (the optimiser builds thousands)."""
    if not (input_tokens >= 1 and output_tokens >= 1):
        raise InputError("query", "input_tokens/output_tokens", "mean token counts >= 1",
                         (input_tokens, output_tokens))
    if not (math.isfinite(prefill_batch) and prefill_batch >= 1):
        raise InputError("query", "prefill_batch", "a number >= 1 (calls prefilled together)",
                         prefill_batch)
    seq = input_tokens + output_tokens
    mems = [memory_fit(model, gpu, tp, sh, math.ceil(seq), catalog, policy) for sh in shares]
    b_max = np.array([min(policy.max_batch, int(m.kv_tokens // seq)) if m.feasible else 0
                      for m in mems])
    k = np.minimum(prefill_batch, np.maximum(b_max, 1)).astype(float)
    sh = np.asarray(shares, dtype=float)
    p = np.asarray(latency.prefill_ms(model, gpu, tp, sh, k, input_tokens), dtype=float) * np.ones(len(sh))
    curves = [ServingCurve(
        model=model, gpu=gpu, tp=tp, share=float(shares[j]), input_tokens=float(input_tokens),
        output_tokens=float(output_tokens), memory=mems[j], max_batch=0, mu=0.0,
        prefill_ms=float(p[j]), prefill_batch=float(k[j]), latency_model=latency)
        for j in range(len(sh))]
    live = np.flatnonzero(b_max >= 1)
    if not len(live):
        return curves
    top = int(b_max[live].max())
    batches = np.arange(1, top + 1, dtype=float)[None, :]
    s2, k2 = sh[live][:, None], k[live][:, None]
    d = np.asarray(latency.decode_ms(model, gpu, tp, s2, batches, input_tokens + output_tokens / 2.0),
                   dtype=float) * np.ones((len(live), top))
    groups = np.maximum(k2, batches / output_tokens)
    pg = np.asarray(latency.prefill_ms(model, gpu, tp, s2, groups, input_tokens), dtype=float)
    pg = np.where(groups == k2, p[live][:, None], pg)  # the same float as the base group's
    stall = np.maximum(batches - groups, 0.0) * pg / groups
    service = pg + (output_tokens - 1.0) * d + stall
    rates = 1e3 * batches / service
    for row, j in enumerate(live):
        r = rates[row, : b_max[j]]
        # λ(B) rises until compute saturates: keep its maximum (the largest batch reaching it)
        best = int(np.flatnonzero(r >= r.max() * (1.0 - 1e-9))[-1]) + 1
        table = service[row, :best].copy()
        table.setflags(write=False)
        curves[j] = ServingCurve(
            model=model, gpu=gpu, tp=tp, share=float(shares[j]), input_tokens=float(input_tokens),
            output_tokens=float(output_tokens), memory=mems[j], max_batch=best, mu=float(r[best - 1]),
            prefill_ms=float(p[j]), prefill_batch=float(k[j]), latency_model=latency,
            service_ms=table)
    return curves
