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
  prefilled together: the group takes ``P = p(k, I)`` and costs the batch ``P/k`` per call. ``k``
  is ``prefill_batch`` (the predictor passes the LLM's mean concurrency within a request).
* **Throughput at batch B**: prefill produces the first output token, so a call lives for its
  group's prefill and ``O − 1`` decode steps of ``d(B, I + O/2)``, and is stalled by the
  prefills of the other ``B − 1`` calls in the batch. With ``B' = max(B, 1)`` (an idle server
  still prefills and decodes each call), Little's law gives
  ``λ(B) = B / (P + (O − 1)·d(B', I + O/2) + (B' − 1)·P/k)``; ``μ = max_B≤B_max λ(B)``.
* **Latency at rate λ < μ**: ``B(λ)`` solves ``λ(B) = λ`` (``λ(B)`` is increasing up to its
  maximum), the in-service time is ``B/λ``, plus a queueing wait that grows as λ → μ, taken
  from Sakasegawa's M/M/c approximation with ``c = B_max`` slots of service time ``B_max/μ``:
  ``W_q ≈ ρ^(√(2(c+1)) − 1) / (c(1 − ρ)) · B_max/μ``, ``ρ = λ/μ``. At λ → 0 the latency is
  ``P + (O − 1)·d(1, I + O/2)``.
The discrete-event simulator checks these forms (scepsy_opt).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import brentq

from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.errors import InputError
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


@dataclass(frozen=True)
class ServingCurve:
    """Throughput and latency of one instance for calls of ``input_tokens``/``output_tokens``."""

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

    @property
    def feasible(self) -> bool:
        return self.memory.feasible and self.mu > 0

    def _ctx(self) -> float:
        return self.input_tokens + self.output_tokens / 2.0

    def _service_ms(self, batch: float) -> float:
        """In-service time of one call at batch ``B``: ``P + (O−1)·d(B') + (B'−1)·P/k``."""
        b = max(batch, 1.0)
        d = self.latency_model.decode_ms(self.model, self.gpu, self.tp, self.share, b, self._ctx())
        return (self.prefill_ms + (self.output_tokens - 1.0) * d
                + (b - 1.0) * self.prefill_ms / self.prefill_batch)

    def rate_at_batch(self, batch: float) -> float:
        """λ(B) = B / (in-service time at B), calls/s (see the module docstring)."""
        return 1e3 * batch / self._service_ms(batch)

    def batch_at_rate(self, rate: float) -> float:
        """The mean number of calls in service, ``B`` with λ(B) = rate, for 0 < rate < μ."""
        if not 0 < rate < self.mu:
            raise InputError("query", "rate", f"a rate in (0, μ={self.mu:.6g}) calls/s", rate)
        return float(brentq(lambda b: self.rate_at_batch(b) - rate, 1e-12, float(self.max_batch),
                            xtol=1e-12, rtol=1e-10))

    def latency_s(self, rate: float) -> float:
        """Mean latency of one call (s) at arrival rate ``rate``; ``inf`` at or beyond μ."""
        if rate <= 0:
            return self.zero_load_latency_s
        if not self.feasible or rate >= self.mu:
            return math.inf
        in_service = self._service_ms(self.batch_at_rate(rate)) / 1e3
        rho = rate / self.mu
        c = self.max_batch
        wait = rho ** (math.sqrt(2.0 * (c + 1)) - 1.0) / (c * (1.0 - rho)) * (c / self.mu)
        return in_service + wait

    @property
    def zero_load_latency_s(self) -> float:
        return self._service_ms(1.0) / 1e3


def serving_curve(latency: LatencyModel, model: str, gpu: str, tp: int, share: float,
                  input_tokens: float, output_tokens: float, *, catalog: Catalog | None = None,
                  policy: MemoryPolicy = MemoryPolicy(),
                  prefill_batch: float = 1.0) -> ServingCurve:
    """Build the serving curve of one instance (see the module docstring for the model)."""
    if not (input_tokens >= 1 and output_tokens >= 1):
        raise InputError("query", "input_tokens/output_tokens", "mean token counts >= 1",
                         (input_tokens, output_tokens))
    if not (math.isfinite(prefill_batch) and prefill_batch >= 1):
        raise InputError("query", "prefill_batch", "a number >= 1 (calls prefilled together)",
                         prefill_batch)
    seq = input_tokens + output_tokens
    mem = memory_fit(model, gpu, tp, share, math.ceil(seq), catalog, policy)
    b_max = min(policy.max_batch, int(mem.kv_tokens // seq)) if mem.feasible else 0
    k = min(prefill_batch, max(b_max, 1))
    p = float(latency.prefill_ms(model, gpu, tp, share, k, input_tokens))
    curve = ServingCurve(
        model=model, gpu=gpu, tp=tp, share=share, input_tokens=float(input_tokens),
        output_tokens=float(output_tokens), memory=mem, max_batch=0, mu=0.0, prefill_ms=p,
        prefill_batch=float(k), latency_model=latency,
    )
    if b_max < 1:
        return curve
    batches = np.arange(1, b_max + 1, dtype=float)
    d = np.asarray(latency.decode_ms(model, gpu, tp, share, batches, input_tokens + output_tokens / 2.0),
                   dtype=float)
    rates = 1e3 * batches / (p + (output_tokens - 1.0) * d + (batches - 1.0) * p / k)
    # λ(B) rises until compute saturates: keep its maximum (the largest batch reaching it)
    best = int(np.flatnonzero(rates >= rates.max() * (1.0 - 1e-9))[-1]) + 1
    return replace(curve, max_batch=best, mu=float(rates[best - 1]))
