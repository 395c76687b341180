"""The serving curve of one LLM instance under continuous batching.

An instance is (model, gpu, tp, share, memory share): ``tp`` GPUs inside one NVLink domain,
``share`` of each GPU's compute (MPS active thread percentage) and ``memory_share`` of each GPU's
memory (vLLM's memory limit; the compute share when not given: the two tied). The compute share
sets the latency model's speed, the memory share the KV cache, hence the batch limit: more memory
gives a larger batch and a higher μ. For calls with mean input ``I`` and output ``O`` tokens:

* **Memory** (per GPU): ``weights/tp + reserve + KV`` must fit in ``memory_share · memory``. The
  reserve is activation and framework memory, ``reserve_fraction`` of the memory share (vLLM's
  ``gpu_memory_utilization`` headroom) plus ``reserve_gib`` per GPU whatever the share (each MPS
  client keeps its own CUDA context). What is left holds the KV cache:
  ``kv_tokens = kv_bytes / kv_bytes_per_token_per_gpu``. A candidate that cannot hold one
  sequence of ``I + O`` tokens does not exist (:attr:`ServingCurve.feasible` is False).
* **Length moments**: calls have mean input ``I`` and output ``O`` and, optionally,
  ``E[O²]`` (``output_sq_mean``) and ``E[I·O]`` (``io_mean``); without them lengths are constant
  (``E[O²] = O²``, ``E[I·O] = I·O``). A running call is seen in proportion to its life (``O``
  iterations), so batch averages are *length-biased*: ``E_b[f] = E[O·f] / E[O]``. Decode steps
  use the mean context of a running call, ``ctx = (E[I·O] + E[O²]/2) / O`` (``I + O/2`` for
  constant lengths).
* **Batch limit**, ``policy.kv_management``:

  - ``"reserve"``: a call reserves its whole ``I + O`` tokens of KV cache when admitted (no
    preemption), so ``B_max = floor(kv_tokens / s)`` with the length-biased reservation
    ``s = (E[I·O] + E[O²]) / O`` (``I + O`` for constant lengths).
  - ``"paged"`` (vLLM's default): KV blocks of ``block_size`` tokens are allocated as tokens are
    generated. A running call that has generated ``a`` of its ``O`` tokens holds ``I + a`` tokens
    plus the unused part of its last block; with ``a`` uniform over ``1..O`` and the length bias,
    the mean occupancy is ``occ = (E[I·O] + (E[O²] + O)/2) / O + (block_size − 1)/2``
    (:attr:`ServingCurve.kv_per_seq`) and ``B_max = max(1, floor(kv_tokens / occ))``. Its spread
    is that of ``a`` (prompt lengths enter by their mean):
    ``var = E_b[a²] − E_b[a]² + (block_size² − 1)/12`` with ``E_b[a] = (E[O²] + O)/(2O)``,
    ``E_b[a²] = (2E[O³] + 3E[O²] + O)/(6O)``, and ``E[O³]`` from a gamma distribution with the
    same mean and variance (exact for constant and exponential lengths).
    **Preemption**: the KV held by a batch of ``B``, ``S_B``, is taken as normal with mean
    ``B·occ`` and variance ``B·var``; the tokens by which it would overflow the cache,
    ``E[(S_B − kv_tokens)⁺] = σ·φ(z) − (kv_tokens − B·occ)·(1 − Φ(z))``, ``z = (kv_tokens −
    B·occ)/σ``, are evicted once per turnover of the batch (while ``B`` calls complete) by
    preempting the newest call, which holds about its prompt ``I``, so the preemptions per call
    are ``π(B) = E[(S_B − kv_tokens)⁺] / (B·I)`` (0 where the cache is ample). Each preemption
    is a recompute prefill ``p(1, I)`` that stalls the batch, so it adds ``B'·π(B)·p(1, I)`` to
    the service time below (the wait of a preempted call for re-admission is not modelled).

  Both are capped by ``max_batch`` (vLLM's ``max_num_seqs``).
* **Prefill groups**: calls that arrive together (a fan-out of ``k`` concurrent calls) are
  prefilled together, and under load so are the calls that queued during one iteration: a call
  lives ``O`` iterations (one prefill, ``O − 1`` decode steps), so a batch of ``B`` admits about
  ``B/O`` calls per iteration and the group is ``g(B) = max(k, B'/O)`` calls with
  ``B' = max(B, 1)``. A group takes ``P(g) = p(g, I)``. ``k`` is ``prefill_batch`` (the
  predictor passes the LLM's mean concurrency within a request). For one-token outputs (a
  reranker, a reward model) every call of the batch is in one group, ``g = B``. With a token
  budget ``policy.max_num_batched_tokens = T`` (vLLM's ``max_num_batched_tokens``) one prefill
  iteration admits calls while their prompt tokens sum to at most ``T`` (a longer prompt still
  goes alone), so ``k`` and ``g`` are capped at ``max(1, floor(T / I))``.
* **Throughput at batch B**: prefill produces the first output token, so a call lives for its
  group's prefill and ``O − 1`` decode steps of ``d(B', ctx)``, and is stalled by the
  prefills of the other groups admitted meanwhile (``(B' − g)/g`` of them, by Little's law), so
  ``λ(B) = B / (P(g) + (O − 1)·d(B', ctx) + max(B' − g, 0)·P(g)/g + B'·π(B)·p(1, I))``
  (``π = 0`` with ``"reserve"``); ``μ = max_B≤B_max λ(B)``.
* **Latency at rate λ < μ**: ``B(λ)`` solves ``λ(B) = λ`` (``λ(B)`` is increasing up to its
  maximum; it is computed at whole batches and taken as linear in between, and as ``B·λ(1)``
  below one call in service), the in-service time is ``B/λ``, plus a queueing wait that grows as λ → μ, taken
  from Sakasegawa's M/M/c approximation with ``c = B_max`` slots of service time ``B_max/μ``:
  ``W_q ≈ ρ^(√(2(c+1)) − 1) / (c(1 − ρ)) · B_max/μ``, ``ρ = λ/μ``. At λ → 0 the latency is
  ``P + (O − 1)·d(1, ctx)``.
* **Overload**: :meth:`ServingCurve.preemptions_per_call` is ``π`` at the batch in service at a
  rate (``π(B_max)`` at and beyond ``μ``); :meth:`ServingCurve.overloaded` says whether it passes
  ``policy.preemption_threshold`` or the rate reaches ``μ``.
The discrete-event simulator checks these forms (scepsy_opt).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

from scepsy_common.errors import InputError
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.hardware import GIB
from scepsy_profile.latency import LatencyModel

KV_MANAGEMENT = ("paged", "reserve")
MAX_NUM_SEQS = 65_536
"""The most calls one replica may run at once (:attr:`MemoryPolicy.max_batch`, vLLM
``--max-num-seqs``) and the largest batch ``scepsy profile show`` evaluates."""
MAX_BLOCK_SIZE = 1024
"""The most tokens per KV block (:attr:`MemoryPolicy.block_size`, vLLM ``--block-size``; its
backends use 8 to 256)."""
MAX_BATCHED_TOKENS = 10_000_000
"""The most prompt tokens one iteration may take (:attr:`MemoryPolicy.max_num_batched_tokens`)."""
"""The KV-cache disciplines of :attr:`MemoryPolicy.kv_management` (module docstring)."""


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    """How much of an instance's memory is not KV cache, and how the engine manages the rest."""

    reserve_fraction: float = 0.10
    reserve_gib: float = 1.0
    max_batch: int = 256
    kv_management: Literal["paged", "reserve"] = "paged"
    """``"paged"``: vLLM's blocks, allocated as tokens are generated, preemption by recompute;
    ``"reserve"``: a call's whole ``I + O`` reserved at admission, no preemption."""
    block_size: int = 16
    """Tokens per KV block (vLLM ``--block-size``)."""
    max_num_batched_tokens: int | None = None
    """Prompt tokens one prefill iteration may take (vLLM ``--max-num-batched-tokens``; None:
    unlimited)."""
    preemption_threshold: float = 0.05
    """Preemptions per call above which an instance counts as overloaded."""

    def __post_init__(self) -> None:
        if not (_is_int(self.max_batch) and 1 <= self.max_batch <= MAX_NUM_SEQS):
            raise InputError("memory policy", "max_batch", f"an integer in [1, {MAX_NUM_SEQS}]",
                             self.max_batch)
        if not 0 <= self.reserve_fraction < 1:
            raise InputError("memory policy", "reserve_fraction", "a fraction in [0, 1)",
                             self.reserve_fraction)
        if not (math.isfinite(self.reserve_gib) and self.reserve_gib >= 0):
            raise InputError("memory policy", "reserve_gib", "a number >= 0", self.reserve_gib)
        if self.kv_management not in KV_MANAGEMENT:
            raise InputError("memory policy", "kv_management", "'paged' or 'reserve'",
                             self.kv_management)
        if not (_is_int(self.block_size) and 1 <= self.block_size <= MAX_BLOCK_SIZE):
            raise InputError("memory policy", "block_size", f"an integer in [1, {MAX_BLOCK_SIZE}]",
                             self.block_size)
        budget = self.max_num_batched_tokens
        if budget is not None and not (_is_int(budget) and 1 <= budget <= MAX_BATCHED_TOKENS):
            raise InputError("memory policy", "max_num_batched_tokens",
                             f"an integer in [1, {MAX_BATCHED_TOKENS}] or None (unlimited)",
                             budget)
        t = self.preemption_threshold
        if not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
                and t >= 0):
            raise InputError("memory policy", "preemption_threshold",
                             "a number >= 0 (preemptions per call)", t)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """Per-GPU memory budget of one instance, in GiB, and the KV capacity it leaves."""

    available_gib: float
    weights_gib: float
    reserve_gib: float
    kv_gib: float
    kv_tokens: int
    feasible: bool  # holds at least one sequence of the given length


def call_tokens(tokens: float, policy: MemoryPolicy = MemoryPolicy()) -> int:
    """The KV cache one call of ``tokens`` (prompt + output) holds at its longest: whole blocks
    under paged management. An instance serves an LLM only when its cache holds the LLM's
    longest call (:func:`serving_curves` with ``longest_tokens``; the simulator; vLLM's
    ``max_model_len``)."""
    n = max(math.ceil(tokens), 1)
    bs = policy.block_size if policy.kv_management == "paged" else 0
    return -(-n // bs) * bs if bs else n


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
    policy: MemoryPolicy = field(default_factory=MemoryPolicy)
    kv_per_seq: float = 0.0
    """KV tokens one running call holds on average, the batch limit's divisor: ``occ`` (paged)
    or the length-biased ``I + O`` (reserve)."""
    kv_var: float = 0.0
    """Variance of one running call's KV tokens (paged; 0 with ``"reserve"``)."""
    recompute_ms: float = 0.0
    """One preemption's recompute prefill, ``p(1, I)``."""
    memory_share: float = math.nan
    """Fraction of each GPU's memory the instance holds (its :attr:`memory`); the compute
    ``share`` when not given (tied)."""

    def __post_init__(self) -> None:
        if math.isnan(self.memory_share):
            object.__setattr__(self, "memory_share", self.share)

    @property
    def feasible(self) -> bool:
        return self.memory.feasible and self.mu > 0

    @property
    def admits(self) -> int:
        """The most calls the instance admits at once (:func:`admission_limit`; at least
        :attr:`max_batch`, the batch of its saturation throughput; 0 when infeasible)."""
        if not self.feasible:
            return 0
        if self.kv_per_seq <= 0:
            return self.max_batch
        return max(self.max_batch, admission_limit(self.memory.kv_tokens, self.kv_per_seq,
                                                   self.policy))

    def group(self, batch: ArrayLike) -> NDArray[np.float64]:
        """Calls prefilled together at batch ``B``: ``g(B) = max(k, max(B, 1)/O)``, capped by the
        token budget at ``max(1, floor(T / I))``."""
        g = np.maximum(self.prefill_batch, np.maximum(batch, 1.0) / self.output_tokens)
        return np.minimum(g, group_cap(self.policy, self.input_tokens))

    def preemptions_at_batch(self, batch: ArrayLike) -> Any:
        """``π(B)``: predicted preemptions per call with ``B`` calls running (module doc)."""
        out = batch_preemptions(np.maximum(np.asarray(batch, dtype=float), 1.0),
                                self.memory.kv_tokens, self.kv_per_seq, self.kv_var,
                                self.input_tokens, self.policy)
        return float(out) if np.ndim(batch) == 0 else out

    def preemptions_per_call(self, rate: ArrayLike) -> Any:
        """Predicted preemptions per call at per-replica call rate ``rate``: ``π`` at the batch
        in service, ``π(B_max)`` at and beyond μ; ``inf`` on an infeasible instance."""
        r = np.atleast_1d(np.asarray(rate, dtype=float))
        out = np.zeros(r.shape)
        busy = r > 0
        if not self.feasible:
            out[busy] = math.inf
        elif np.any(busy):
            b, rates = self._table
            batch = np.where(r[busy] < self.mu, np.interp(r[busy], rates, b), self.max_batch)
            out[busy] = self.preemptions_at_batch(batch)
        return float(out[0]) if np.ndim(rate) == 0 else out

    def overloaded(self, rate: ArrayLike) -> Any:
        """Whether ``rate`` (calls/s per replica) reaches μ or makes more than
        ``policy.preemption_threshold`` preemptions per call."""
        r = np.asarray(rate, dtype=float)
        out = (r >= self.mu) | (np.asarray(self.preemptions_per_call(r))
                                > self.policy.preemption_threshold)
        return bool(out) if np.ndim(rate) == 0 else out

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
            in_service = self._in_service(x)
            rho = x / self.mu
            c = self.max_batch
            wait = rho ** (math.sqrt(2.0 * (c + 1)) - 1.0) / (c * (1.0 - rho)) * (c / self.mu)
            out[ok] = in_service + wait
        return float(out[0]) if np.ndim(rate) == 0 else out

    def in_service_s(self, rate: float) -> float:
        """The time one call spends in service (not queueing) at ``0 < rate < μ`` (s): the
        first term of :meth:`latency_s`."""
        if not 0 < rate < self.mu:
            raise InputError("query", "rate", f"a rate in (0, μ={self.mu:.6g}) calls/s", rate)
        return float(self._in_service(np.array([rate], dtype=float))[0])

    def _in_service(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """The in-service time (s) at rates ``x`` in (0, μ): ``B(λ)/λ``; below one call in
        service (``B = λ/λ(1)``) exactly ``service(1)``."""
        b, rates = self._table
        return np.where(x <= rates[1], float(self.service_ms[0]) / 1e3,
                        np.interp(x, rates, b) / x)

    def group_prefill_s(self, batch: float) -> float:
        """The prefill (s) of the group a call joins with ``batch`` calls in service,
        ``P(g(B))``."""
        g = float(self.group(batch))
        return float(self.latency_model.prefill_ms(self.model, self.gpu, self.tp, self.share, g,
                                                   self.input_tokens)) / 1e3

    def wait_s(self, rate: float) -> float:
        """The mean queueing wait (s) before a call is admitted at ``0 < rate < μ``:
        :meth:`latency_s` less :meth:`in_service_s`."""
        return max(float(self.latency_s(rate)) - self.in_service_s(rate), 0.0)

    def ttft_s(self, rate: float, quantile: float | None = None) -> float:
        """Time to first token (s) at ``rate`` calls/s per replica: the queueing wait plus the
        prefill of the call's group; ``inf`` at or beyond μ. ``quantile`` (in (0, 1)): that
        quantile instead of the mean, with an exponential wait (``−ln(1 − q)`` times its
        mean)."""
        if quantile is not None and not 0 < quantile < 1:
            raise InputError("query", "quantile", "a quantile in (0, 1)", quantile)
        if not self.feasible or rate >= self.mu:
            return math.inf
        if rate <= 0:
            return self.prefill_at_s(rate)
        wait = self.wait_s(rate) * (1.0 if quantile is None else -math.log1p(-quantile))
        return wait + self.prefill_at_s(rate)

    def prefill_at_s(self, rate: float) -> float:
        """The prefill (s) of the group a call joins at ``rate`` calls/s per replica (alone at
        rate 0): the part of :meth:`ttft_s` that is not waiting."""
        return self.group_prefill_s(float(self.batch_at_rate(rate)) if rate > 0 else 1.0)

    def tpot_s(self, rate: float) -> float:
        """Mean time per output token after the first (s) at ``rate`` calls/s per replica: the
        in-service time less the group's prefill, over ``O − 1`` tokens (decode steps and the
        prefills of calls admitted meanwhile); ``inf`` at or beyond μ."""
        if not self.feasible or rate >= self.mu:
            return math.inf
        if rate <= 0:
            return (self.zero_load_latency_s - self.group_prefill_s(1.0)) / max(
                self.output_tokens - 1.0, 1.0)
        batch = float(self.batch_at_rate(rate))
        return max(self.in_service_s(rate) - self.group_prefill_s(batch), 0.0) / max(
            self.output_tokens - 1.0, 1.0)

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
                  policy: MemoryPolicy = MemoryPolicy(), prefill_batch: float = 1.0,
                  output_sq_mean: float | None = None,
                  io_mean: float | None = None,
                  memory_share: float | None = None) -> ServingCurve:
    """Build the serving curve of one instance (see the module docstring for the model);
    ``memory_share``: its fraction of each GPU's memory (None: ``share``, tied)."""
    return serving_curves(latency, model, gpu, tp, [share], input_tokens, output_tokens,
                          catalog=catalog, policy=policy, prefill_batch=prefill_batch,
                          output_sq_mean=output_sq_mean, io_mean=io_mean,
                          memory_shares=None if memory_share is None else [memory_share])[0]


@dataclass(frozen=True, slots=True)
class KVDemand:
    """What one running call asks of the KV cache (module docstring): the mean tokens it holds
    (the batch limit's divisor), their variance, and the decode context."""

    per_seq: float
    var: float
    ctx: float


def kv_demand(input_tokens: float, output_tokens: float, policy: MemoryPolicy,
              output_sq_mean: float | None = None, io_mean: float | None = None) -> KVDemand:
    """The KV occupancy of one running call under ``policy`` (length-biased, module doc)."""
    i, o = float(input_tokens), float(output_tokens)
    constant = output_sq_mean is None and io_mean is None
    m2 = o * o if output_sq_mean is None else float(output_sq_mean)
    io = i * o if io_mean is None else float(io_mean)
    if not (math.isfinite(m2) and m2 >= o * o * (1 - 1e-9)):
        raise InputError("query", "output_sq_mean", f"E[O²] >= E[O]² = {o * o:.6g}",
                         output_sq_mean)
    if not (math.isfinite(io) and io > 0):
        raise InputError("query", "io_mean", "E[I·O] > 0", io_mean)
    m2 = max(m2, o * o)
    ctx = i + o / 2.0 if constant else (io + m2 / 2.0) / o
    if policy.kv_management == "reserve":
        return KVDemand(per_seq=i + o if constant else (io + m2) / o, var=0.0, ctx=ctx)
    var_o = m2 - o * o
    m3 = o**3 + 3.0 * o * var_o + 2.0 * var_o**2 / o  # a gamma distribution's third moment
    mean_a = (m2 + o) / (2.0 * o)
    mean_a2 = (2.0 * m3 + 3.0 * m2 + o) / (6.0 * o)
    bs = float(policy.block_size)
    per_seq = (io + (m2 + o) / 2.0) / o + (bs - 1.0) / 2.0
    var = max(mean_a2 - mean_a**2, 0.0) + (bs * bs - 1.0) / 12.0
    return KVDemand(per_seq=per_seq, var=var, ctx=ctx)


def admission_limit(kv_tokens: int, per_seq: float, policy: MemoryPolicy) -> int:
    """The most calls an instance admits at once: its ``max_batch``, and what its KV cache
    holds at ``per_seq`` tokens a call (at least one with paged KV, which admits a call whose
    prompt fits and preempts later); 0 when it holds no call."""
    paged = policy.kv_management == "paged"
    return min(policy.max_batch, max(int(kv_tokens // per_seq), int(paged)))


def group_cap(policy: MemoryPolicy, input_tokens: float) -> float:
    """The most calls one prefill iteration takes under the token budget (inf without one)."""
    t = policy.max_num_batched_tokens
    return math.inf if t is None else float(max(1, math.floor(t / input_tokens)))


def batch_preemptions(batch: ArrayLike, kv_tokens: ArrayLike, per_seq: float, var: float,
                         victim_tokens: float, policy: MemoryPolicy) -> Any:
    """``π(B) = E[(S_B − kv_tokens)⁺] / (B · victim_tokens)`` with ``S_B`` normal of mean
    ``B·per_seq`` and variance ``B·var`` (paged KV; 0 with ``"reserve"``, module doc)."""
    b, kv = np.broadcast_arrays(np.asarray(batch, dtype=float), np.asarray(kv_tokens, dtype=float))
    out = np.zeros(b.shape)
    if policy.kv_management == "paged" and var > 0:
        room = kv - b * per_seq
        sd = np.sqrt(b * var)
        tail = room < 40.0 * sd  # beyond 40 standard deviations the overflow is exactly 0.0
        if np.any(tail):
            r, s, z = room[tail], sd[tail], room[tail] / sd[tail]
            excess = s * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi) \
                - r * 0.5 * special.erfc(z / math.sqrt(2.0))
            out[tail] = np.maximum(excess, 0.0) / (b[tail] * victim_tokens)
    return float(out) if np.ndim(out) == 0 else out


def serving_curves(latency: LatencyModel, model: str, gpu: str, tp: int, shares: Sequence[float],
                   input_tokens: float, output_tokens: float, *, catalog: Catalog | None = None,
                   policy: MemoryPolicy = MemoryPolicy(), prefill_batch: float = 1.0,
                   output_sq_mean: float | None = None,
                   io_mean: float | None = None,
                   memory_shares: Sequence[float] | None = None,
                   longest_tokens: float = 0.0) -> list[ServingCurve]:
    """The serving curves of one (model, gpu, tp) at several shares, with one latency-model
    query per phase for all of them (the optimiser builds thousands). ``memory_shares``: each
    curve's fraction of GPU memory (one per share; None: the shares themselves, tied).
    ``longest_tokens``: the LLM's longest call (prompt + output; 0: unknown, the mean call); a
    curve whose KV cache cannot hold it (:func:`call_tokens`) is not feasible."""
    if memory_shares is not None and len(memory_shares) != len(shares):
        raise InputError("query", "memory_shares", f"one memory share per share ({len(shares)})",
                         len(memory_shares))
    if not (input_tokens >= 1 and output_tokens >= 1):
        raise InputError("query", "input_tokens/output_tokens", "mean token counts >= 1",
                         (input_tokens, output_tokens))
    if not (math.isfinite(prefill_batch) and prefill_batch >= 1):
        raise InputError("query", "prefill_batch", "a number >= 1 (calls prefilled together)",
                         prefill_batch)
    kv = kv_demand(input_tokens, output_tokens, policy, output_sq_mean, io_mean)
    paged = policy.kv_management == "paged"
    cap = group_cap(policy, input_tokens)
    seq = input_tokens + output_tokens
    mshares = shares if memory_shares is None else memory_shares
    fit = call_tokens(max(seq, longest_tokens), policy)
    mems = [memory_fit(model, gpu, tp, ms, fit, catalog, policy) for ms in mshares]
    b_max = np.array([admission_limit(m.kv_tokens, kv.per_seq, policy) if m.feasible else 0
                      for m in mems])
    k = np.minimum(min(prefill_batch, cap), np.maximum(b_max, 1)).astype(float)
    sh = np.asarray(shares, dtype=float)
    p = np.asarray(latency.prefill_ms(model, gpu, tp, sh, k, input_tokens), dtype=float) * np.ones(len(sh))
    p1 = np.zeros(len(sh))
    if paged:  # one preemption's recompute prefill p(1, I): the base group's when k = 1
        p1 = np.where(k == 1.0, p, np.asarray(latency.prefill_ms(
            model, gpu, tp, sh, 1.0, input_tokens), dtype=float) if np.any(k != 1.0) else p)

    def make(j: int, max_batch: int = 0, mu: float = 0.0,
             table: NDArray[np.float64] | None = None) -> ServingCurve:
        return ServingCurve(
            model=model, gpu=gpu, tp=tp, share=float(shares[j]), input_tokens=float(input_tokens),
            output_tokens=float(output_tokens), memory=mems[j], max_batch=max_batch, mu=mu,
            prefill_ms=float(p[j]), prefill_batch=float(k[j]), latency_model=latency,
            service_ms=np.empty(0) if table is None else table, policy=policy,
            kv_per_seq=kv.per_seq, kv_var=kv.var, recompute_ms=float(p1[j]),
            memory_share=float(mshares[j]))

    curves = [make(j) for j in range(len(sh))]
    live = np.flatnonzero(b_max >= 1)
    if not len(live):
        return curves
    top = int(b_max[live].max())
    batches = np.arange(1, top + 1, dtype=float)[None, :]
    s2, k2 = sh[live][:, None], k[live][:, None]
    d = np.asarray(latency.decode_ms(model, gpu, tp, s2, batches, kv.ctx),
                   dtype=float) * np.ones((len(live), top))
    groups = np.minimum(np.maximum(k2, batches / output_tokens), max(cap, 1.0))
    pg = np.asarray(latency.prefill_ms(model, gpu, tp, s2, groups, input_tokens), dtype=float)
    pg = np.where(groups == k2, p[live][:, None], pg)  # the same float as the base group's
    stall = np.maximum(batches - groups, 0.0) * pg / groups
    service = pg + (output_tokens - 1.0) * d + stall
    if paged:
        kv_tokens = np.array([float(mems[j].kv_tokens) for j in live])[:, None]
        pre = batch_preemptions(batches, kv_tokens, kv.per_seq, kv.var, input_tokens, policy)
        service = service + batches * pre * p1[live][:, None]
    rates = 1e3 * batches / service
    for row, j in enumerate(live):
        r = rates[row, : b_max[j]]
        # λ(B) rises until compute saturates: keep its maximum (the largest batch reaching it)
        best = int(np.flatnonzero(r >= r.max() * (1.0 - 1e-9))[-1]) + 1
        table = service[row, :best].copy()
        table.setflags(write=False)
        # j: a numpy integer, an index all the same
        curves[j] = make(cast(int, j), best, float(r[best - 1]), table)
    return curves
