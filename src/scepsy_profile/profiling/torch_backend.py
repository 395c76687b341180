"""The ``torch`` profiler backend: a transformers causal LM built in-process, timed with
``torch.utils.benchmark``.

The session builds the model once from :meth:`EngineModel.hf_config` (``LlamaForCausalLM`` or
``Qwen2ForCausalLM``, random weights seeded by ``options.seed``, eval mode, no gradients) on CUDA
when present, else on the CPU, and times each point with a ``torch.utils.benchmark.Timer`` given
its thread count explicitly: ``options.warmup`` untimed runs, then ``options.repeats`` samples of
``Timer.timeit(1)``, reported as median and IQR (:meth:`Timing.of`).

* **prefill** (batch, tokens): one forward pass over ``batch × tokens`` random token ids with a
  fresh ``DynamicCache`` made inside the timed statement, so that no run sees another's cache.
* **decode** (batch, tokens = context): before timing, a cache of ``context − 1`` tokens is filled;
  the timed statement runs one step (one token per sequence) on it and crops it back to
  ``context − 1``, so that every run sees the same context. The cache is filled with random keys
  and values of the shapes a prefill stores (``decode_cache=random``, the default: a decode
  step's cost depends on the shapes only, and a real prefill of 64 × 2048 tokens takes longer
  than the whole point), or by running that prefill (``decode_cache=prefill``).

Only the last position's logits are computed (as a serving engine does). The share of an
instance is applied as a thread count on the CPU (``share × cores`` rounded, at least one whole
thread) and, on a GPU, as an MPS active-thread percentage plus a memory fraction, which needs a
running MPS control daemon (see :mod:`scepsy_profile.profiling.devices`). There is no tensor
parallelism: only ``tp=1``. Importing this module imports neither torch nor transformers.

Backend-specific options (``BackendOptions.extra``): ``device`` = ``auto`` | ``cpu`` | ``cuda``
(default ``auto``: CUDA when available); ``decode_cache`` = ``random`` | ``prefill`` (above);
``clock`` = ``wall`` | ``cpu`` (default ``wall``: elapsed time; ``cpu``: the process's CPU time,
for a one-thread CPU instance on a shared machine, where other processes' load inflates elapsed
time but not the work done); ``dtype`` = ``auto`` | ``bfloat16`` | ``float16`` |
``float32`` (default ``auto``: the model's dtype, except on a CPU whose bfloat16/float16 matmul
is over :data:`SLOW_DTYPE_RATIO` times slower than float32, where float32 is used; the dtype used
and why are in the session's ``device.detail`` and in every :attr:`Timing.method`).
"""

from __future__ import annotations

import functools
import gc
import inspect
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from scepsy_common.errors import InputError
from scepsy_profile.models import DTYPE_BYTES
from scepsy_profile.profiling import devices
from scepsy_profile.profiling.backend import (
    BackendOptions,
    BackendUnavailable,
    DeviceInfo,
    MeasurementError,
    StepPoint,
    Timing,
)
from scepsy_profile.profiling.models import EngineModel

NAME = "torch"

SLOW_DTYPE_RATIO = 3.0
"""On a CPU, a half-precision matmul this many times slower than float32 makes ``dtype=auto``
use float32 (CPUs without native bfloat16 emulate it)."""

MEMORY_HEADROOM = 0.8
"""A CPU point (or model) whose estimated memory exceeds this share of the available memory is
refused before it is tried (an allocation that large would take the machine down, not raise)."""

_EXTRA_CHOICES = {"device": ("auto", "cpu", "cuda"),
                  "dtype": ("auto", *DTYPE_BYTES),
                  "decode_cache": ("random", "prefill"),
                  "clock": ("wall", "cpu")}
_MPS_PERCENT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


@functools.cache
def _import_error() -> str | None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything at import
        return f"the torch backend needs torch and transformers: {type(exc).__name__}: {exc}"
    return None


@dataclass(frozen=True, slots=True)
class _Plan:
    """How one instance runs here: resolved once from the options and the machine."""

    device: str
    threads: int
    share: float
    mps_percent: int | None
    """The MPS active-thread percentage applied on a GPU (None: whole GPU)."""


def _extra(options: BackendOptions) -> dict[str, str]:
    out = {"device": "auto", "dtype": "auto", "decode_cache": "random", "clock": "wall"}
    for key, value in options.extra:
        if key not in _EXTRA_CHOICES:
            raise InputError("torch backend options", f"extra.{key}",
                             f"one of {', '.join(sorted(_EXTRA_CHOICES))}", key)
        if value not in _EXTRA_CHOICES[key]:
            raise InputError("torch backend options", f"extra.{key}",
                             f"one of {', '.join(_EXTRA_CHOICES[key])}", value)
        out[key] = value
    return out


def _check_instance(tp: object, share: object) -> None:
    if not (isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1):
        raise InputError("profile", "tp", "an integer >= 1", tp)
    if not (isinstance(share, (int, float)) and not isinstance(share, bool)
            and math.isfinite(share) and 0 < share <= 1):
        raise InputError("profile", "share", "a number in (0, 1]", share)


def weight_bytes(model: EngineModel, dtype: str) -> int:
    """Bytes of ``model``'s weights in ``dtype`` (embeddings, attention, MLP, norms, LM head)."""
    h, kv = model.hidden, model.kv_heads * model.head_dim
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * model.intermediate + 2 * h
    heads = model.vocab * h * (1 if model.tied_embeddings else 2)
    return (model.layers * per_layer + heads + h) * DTYPE_BYTES[dtype]


def point_bytes(model: EngineModel, point: StepPoint, dtype: str) -> int:
    """An upper estimate of the memory one point needs besides the weights: its KV cache, one
    layer's activations, the attention scores of one layer as if materialised, the logits."""
    b, t = point.batch, point.tokens
    size = DTYPE_BYTES[dtype]
    kv = 2 * model.layers * b * t * model.kv_heads * model.head_dim * size
    new = t if point.phase == "prefill" else 1
    acts = b * new * (4 * model.hidden + 3 * model.intermediate) * size
    scores = b * model.heads * new * t * 4
    return kv + acts + scores + b * model.vocab * 4


@dataclass(frozen=True, slots=True)
class TorchBackend:
    """Times a transformers model in this process (see the module's documentation)."""

    name: str = NAME

    def unavailable(self, options: BackendOptions | None = None) -> str | None:
        return _import_error()

    def version(self, options: BackendOptions | None = None) -> str:
        reason = self.unavailable(options)
        if reason is not None:
            raise BackendUnavailable(reason)
        import torch
        import transformers

        return f"torch {torch.__version__}, transformers {transformers.__version__}"

    def unsupported(self, model: EngineModel, tp: int, share: float,
                    options: BackendOptions | None = None) -> str | None:
        _check_instance(tp, share)
        opts = options or BackendOptions()
        reason = self.unavailable(opts)
        if reason is not None:
            return reason
        if tp != 1:
            return (f"the torch backend runs one process without tensor parallelism: tp must be "
                    f"1 (got {tp}); profile tp > 1 with the vllm backend")
        plan = _plan(share, opts)
        if isinstance(plan, str):
            return plan
        if plan.device == "cpu":
            need = weight_bytes(model, _dtype_name(model, opts, probe=False))
            avail = devices.cpu_info().available_gib
            if need > MEMORY_HEADROOM * avail * devices.GIB:
                return (f"{model.profiled_name} needs ~{need / devices.GIB:.1f} GiB of weights; "
                        f"{avail:.1f} GiB of memory is available")
        return None

    def session(self, model: EngineModel, tp: int, share: float,
                options: BackendOptions) -> AbstractContextManager[TorchSession]:
        return _session(self, model, tp, share, options)


def _plan(share: float, options: BackendOptions) -> _Plan | str:
    """Where and how an instance at ``share`` runs, or why it cannot run here."""
    import torch

    wanted = _extra(options)["device"]
    percent = max(1, round(share * 100)) if share < 1 and wanted != "cpu" else None
    cuda = _cuda_available(percent)
    if wanted == "cuda" and not cuda:
        return "extra device=cuda was asked for, but torch sees no CUDA device"
    device = "cuda" if wanted == "cuda" or (wanted == "auto" and cuda) else "cpu"
    clock = _extra(options)["clock"]
    if device == "cpu":
        cores = devices.usable_cores()
        threads = options.threads or devices.threads_for_share(share, cores)
        if threads < 1:
            return (f"share {share:g} of {cores} CPU cores is less than one whole thread "
                    f"(share × cores must round to at least 1)")
        if clock == "cpu" and threads != 1:
            return (f"clock=cpu times one thread's CPU time; this instance runs {threads} "
                    "threads (set threads=1 or clock=wall)")
        return _Plan("cpu", threads, share, None)
    if clock == "cpu":
        return "clock=cpu times CPU work only; a GPU step needs clock=wall"
    threads = options.threads or max(1, torch.get_num_threads())
    if share == 1:
        return _Plan("cuda", threads, share, None)
    mps = devices.mps_status()
    if not mps.running:
        return (f"share {share:g} < 1 on a GPU needs an NVIDIA MPS control daemon "
                f"(nvidia-cuda-mps-control -d); none is running ({mps.evidence})")
    assert percent is not None  # share < 1 on a device that is not the CPU
    current = _DRIVER_MPS_PERCENT.get("at_init", os.environ.get(_MPS_PERCENT_ENV))
    if current != str(percent) and (torch.cuda.is_initialized()
                                    or "at_init" in _DRIVER_MPS_PERCENT):
        return (f"CUDA is already initialised in this process with "
                f"{_MPS_PERCENT_ENV}={current or 'unset'}; share {share:g} needs "
                f"{percent}: profile each share in its own process")
    return _Plan("cuda", threads, share, percent)


_DRIVER_MPS_PERCENT: dict[str, str | None] = {}
"""``at_init``: :data:`_MPS_PERCENT_ENV` when this module first asked CUDA anything (absent
before): the CUDA driver connects to the MPS daemon, and takes its client's active-thread
percentage, when it is first initialised, so a percentage set later would not count."""


def _cuda_available(percent: int | None) -> bool:
    """``torch.cuda.is_available()``, which initialises the CUDA driver, with the MPS
    percentage of a share (``percent``, None for a whole GPU or the CPU) in the environment
    first when this is the process's first CUDA call: set after it, the share would not be
    applied (every share is profiled in its own process, see :func:`_plan`)."""
    import torch

    first = "at_init" not in _DRIVER_MPS_PERCENT and not torch.cuda.is_initialized()
    set_here = first and percent is not None and _MPS_PERCENT_ENV not in os.environ
    if set_here:
        os.environ[_MPS_PERCENT_ENV] = str(percent)
    available = bool(torch.cuda.is_available())
    if first and available:
        _DRIVER_MPS_PERCENT["at_init"] = os.environ.get(_MPS_PERCENT_ENV)
    elif set_here:  # no GPU here: the environment is left as it was
        del os.environ[_MPS_PERCENT_ENV]
    return available


def _dtype_name(model: EngineModel, options: BackendOptions, *, probe: bool,
                device: str = "cpu", threads: int = 1) -> str:
    return _choose_dtype(model, options, probe=probe, device=device, threads=threads)[0]


def _choose_dtype(model: EngineModel, options: BackendOptions, *, probe: bool, device: str,
                  threads: int) -> tuple[str, str]:
    """The dtype to build the model in, and why."""
    asked = _extra(options)["dtype"]
    if asked != "auto":
        return asked, "asked for (extra dtype)"
    if model.dtype == "float32" or device != "cpu" or not probe:
        return model.dtype, "the model's dtype"
    ratio = _half_slowdown(model.dtype, threads)
    if ratio > SLOW_DTYPE_RATIO:
        return "float32", (f"{model.dtype} matmul is {ratio:.1f}x slower than float32 on this CPU "
                           f"(over {SLOW_DTYPE_RATIO:g}x): float32 used")
    return model.dtype, f"the model's dtype ({model.dtype} matmul {ratio:.2f}x float32's time)"


def _half_slowdown(dtype: str, threads: int, n: int = 512, runs: int = 5) -> float:
    """How many times slower an ``n × n`` matmul is in ``dtype`` than in float32 (best of
    ``runs``) on this CPU."""
    import torch

    def best(dt: Any) -> float:
        a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
        torch.mm(a, b)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - t0)
        return min(times)

    with _threads(threads):
        return best(getattr(torch, dtype)) / best(torch.float32)


@contextmanager
def _threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _session(backend: TorchBackend, model: EngineModel, tp: int, share: float,
             options: BackendOptions) -> Iterator[TorchSession]:
    reason = backend.unsupported(model, tp, share, options)
    if reason is not None:
        raise BackendUnavailable(reason)
    import torch

    plan = _plan(share, options)
    assert isinstance(plan, _Plan)  # unsupported() said it is
    if plan.mps_percent is not None:
        os.environ[_MPS_PERCENT_ENV] = str(plan.mps_percent)
    try:
        session = TorchSession.build(backend, model, plan, options)
    except (RuntimeError, MemoryError, ValueError) as exc:  # out of memory, a bad config...
        gc.collect()
        raise BackendUnavailable(f"could not build {model.profiled_name} on {plan.device}: "
                                 f"{type(exc).__name__}: {_first_line(exc)}") from exc
    try:
        yield session
    finally:
        session.close()
        del session
        gc.collect()
        if plan.device == "cuda":
            if plan.mps_percent is not None:
                torch.cuda.set_per_process_memory_fraction(1.0)
            torch.cuda.empty_cache()


class TorchSession:
    """One model on one device, ready to time points (made by :meth:`TorchBackend.session`)."""

    device: DeviceInfo

    def __init__(self, model: EngineModel, plan: _Plan, options: BackendOptions, dtype: str,
                 device: DeviceInfo, net: Any, hf_config: Any) -> None:
        self.model = model
        self.plan = plan
        self.options = options
        self.dtype = dtype
        self.device = device
        self._net = net
        self._hf_config = hf_config
        forward = inspect.signature(net.forward).parameters
        self._cache_kw = "cache" if "cache" in forward else "past_key_values"
        self._logits_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep")
                                if k in forward), None)
        self._generator_seed = options.seed
        self.decode_cache = _extra(options)["decode_cache"]
        self.clock = _extra(options)["clock"]

    @classmethod
    def build(cls, backend: TorchBackend, model: EngineModel, plan: _Plan,
              options: BackendOptions) -> TorchSession:
        import torch
        import transformers

        dtype, why = _choose_dtype(model, options, probe=True, device=plan.device,
                                   threads=plan.threads)
        hf = dict(model.hf_config())
        model_type = hf.pop("model_type")
        hf.pop("architectures", None)
        hf["torch_dtype"] = dtype
        config = transformers.AutoConfig.for_model(model_type, **hf)
        torch_dtype = getattr(torch, dtype)
        torch.manual_seed(options.seed)
        with _threads(plan.threads):
            if plan.device == "cuda" and plan.mps_percent is not None:
                torch.cuda.set_per_process_memory_fraction(plan.share)
            # the weights are made (and randomly initialised) on the device itself: on a GPU
            # that takes seconds, where initialising 8B parameters on the host takes minutes
            with torch.device(plan.device):
                try:
                    net = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
                except TypeError:  # transformers 4.x names it torch_dtype
                    net = transformers.AutoModelForCausalLM.from_config(
                        config, torch_dtype=torch_dtype)
            net = net.to(device=plan.device, dtype=torch_dtype).eval()
        detail: dict[str, Any]
        detail = {"engine_version": backend.version(options), "dtype": dtype,
                  "dtype_reason": why, "share": plan.share,
                  "decode_cache": _extra(options)["decode_cache"],
                  "clock": _extra(options)["clock"],
                  "attn_implementation": getattr(config, "_attn_implementation", None)}
        if plan.mps_percent is not None:
            detail["mps_active_thread_percentage"] = plan.mps_percent
        if plan.device == "cpu":
            device = devices.cpu_device(plan.threads, **detail)
        else:
            device = devices.cuda_device(torch.cuda.current_device(), threads=plan.threads,
                                         **detail)
        return cls(model, plan, options, dtype, device, net, config)

    # -- measuring ------------------------------------------------------------------------------

    def measure(self, point: StepPoint) -> Timing:
        """Time ``point`` (median and IQR of ``options.repeats`` runs); raise
        :class:`MeasurementError` when it cannot be measured (beyond the model's context, out of
        memory, an engine error, over ``options.point_timeout_s``)."""
        if self._net is None:
            raise MeasurementError("the session is closed")
        if point.tokens > self.model.max_context:
            raise MeasurementError(f"{point.tokens} tokens exceed {self.model.profiled_name}'s "
                                   f"context of {self.model.max_context}")
        self._check_memory(point)
        import torch

        prepared: PreparedStep | None
        try:
            with torch.inference_mode(), _threads(self.plan.threads):
                prepared = self.prepare(point)
                samples = self._time(prepared.run)
                prepared.check()
        except MeasurementError:
            raise
        except (RuntimeError, MemoryError, ValueError) as exc:
            raise MeasurementError(f"{point.phase} batch {point.batch} tokens {point.tokens}: "
                                   f"{type(exc).__name__}: {_first_line(exc)}") from exc
        finally:
            prepared = None  # drop the point's tensors and cache before the next point
            if self.plan.device == "cuda":
                torch.cuda.empty_cache()
        return Timing.of(samples, method=self.method())

    def method(self) -> str:
        """How every timing of this session is taken (in :attr:`Timing.method`)."""
        o = self.options
        return (f"torch.utils.benchmark Timer.timeit(1) x{o.repeats} after {o.warmup} warm-up, "
                f"{self.plan.threads} threads, {self.dtype}, {self.plan.device}, "
                f"decode cache {self.decode_cache}, {self.clock} clock")

    def close(self) -> None:
        self._net = None

    def _check_memory(self, point: StepPoint) -> None:
        if self.plan.device != "cpu":
            return  # a GPU raises a clean out-of-memory error
        need = point_bytes(self.model, point, self.dtype)
        avail = devices.cpu_info().available_gib * devices.GIB
        if need > MEMORY_HEADROOM * avail:
            raise MeasurementError(f"{point.phase} batch {point.batch} tokens {point.tokens} "
                                   f"needs ~{need / devices.GIB:.1f} GiB; "
                                   f"{avail / devices.GIB:.1f} GiB is available")

    def _ids(self, batch: int, tokens: int) -> Any:
        import torch

        gen = torch.Generator().manual_seed(self._generator_seed)
        ids = torch.randint(0, self.model.vocab, (batch, tokens), generator=gen)
        return ids.to(self.plan.device)

    def new_cache(self) -> Any:
        """An empty transformers ``DynamicCache`` for this model."""
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self._hf_config)
        except TypeError:  # transformers 4.x: no config argument
            return DynamicCache()

    def forward(self, ids: Any, cache: Any) -> Any:
        """One forward pass of ``ids`` appending to ``cache`` (last position's logits only)."""
        kwargs: dict[str, Any] = {self._cache_kw: cache, "use_cache": True}
        if self._logits_kw:
            kwargs[self._logits_kw] = 1
        return self._net(ids, **kwargs)

    def prepare(self, point: StepPoint) -> PreparedStep:
        """The timed statement of ``point`` with its inputs (and, for a decode, its cache filled
        with ``tokens − 1`` tokens); call inside ``torch.inference_mode()``."""
        if point.phase == "prefill":
            return PreparedStep(self, self._ids(point.batch, point.tokens), None, 0)
        context = point.tokens - 1
        cache = self.new_cache()
        if context > 0:
            if self.decode_cache == "prefill":
                self.forward(self._ids(point.batch, context), cache)
            else:
                self._fill(cache, point.batch, context)
            held = cache.get_seq_length()
            if held != context:
                raise MeasurementError(f"the cache holds {held} tokens after a prefill of "
                                       f"{context}")
        return PreparedStep(self, self._ids(point.batch, 1), cache if context else None, context)

    def _fill(self, cache: Any, batch: int, context: int) -> None:
        """Put ``context`` tokens of random keys and values in every layer of ``cache`` (what a
        prefill would store, in the same shapes and dtype, without computing it)."""
        import torch

        m = self.model
        gen = torch.Generator(device=self.plan.device).manual_seed(self._generator_seed)
        shape = (batch, m.kv_heads, context, m.head_dim)
        dtype = getattr(torch, self.dtype)
        for layer in range(m.layers):
            k, v = (torch.empty(shape, dtype=dtype, device=self.plan.device).normal_(
                generator=gen) for _ in range(2))
            cache.update(k, v, layer)

    def _time(self, step: Callable[[], Any]) -> list[float]:
        """``warmup`` untimed runs, then ``repeats`` samples of ``Timer.timeit(1)``, in ms."""
        from torch.utils.benchmark import Timer

        limit = self.options.point_timeout_s
        start = time.monotonic()

        def over() -> None:
            spent = time.monotonic() - start
            if spent > limit:
                raise MeasurementError(f"the point took {spent:.1f} s, over the {limit:g} s "
                                       "point time limit")

        for _ in range(self.options.warmup):
            step()
            over()
        clock: dict[str, Any] = {"timer": time.process_time} if self.clock == "cpu" else {}
        timer = Timer(stmt="step()", globals={"step": step}, num_threads=self.plan.threads,
                      **clock)
        samples: list[float] = []
        for _ in range(self.options.repeats):
            samples.append(timer.timeit(1).median * 1000.0)
            over()
        return samples


@dataclass(slots=True)
class PreparedStep:
    """One point's timed statement: :meth:`run` is what the timer runs."""

    session: TorchSession
    ids: Any
    """The token ids fed at each run (``batch × tokens`` for a prefill, ``batch × 1`` for a
    decode step)."""
    cache: Any
    """The decode cache holding :attr:`context` tokens between runs (None: a fresh cache is made
    inside every run: a prefill, or a decode at context 1)."""
    context: int

    def run(self) -> Any:
        """One forward pass; a decode step's cache is cropped back to :attr:`context` after it.
        Returns the logits of the last position."""
        if self.cache is None:
            return self.session.forward(self.ids, self.session.new_cache()).logits
        out = self.session.forward(self.ids, self.cache)
        crop_to(self.cache, self.context)
        return out.logits

    def check(self) -> None:
        """:class:`MeasurementError` unless the decode cache still holds :attr:`context`
        tokens (the timed runs did not accumulate)."""
        if self.cache is not None and self.cache.get_seq_length() != self.context:
            raise MeasurementError(f"the decode cache grew to {self.cache.get_seq_length()} "
                                   f"tokens over the timed runs (kept at {self.context})")


def crop_to(cache: Any, length: int) -> None:
    """Cut a transformers ``DynamicCache`` back to its first ``length`` tokens (a negative
    ``crop`` argument counts tokens to remove in every transformers version)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
