"""The profiler backend protocol and its registry.

A backend times one LLM instance (an :class:`~scepsy_profile.profiling.models.EngineModel` at a TP
degree and a GPU share) on this machine with a real engine:

* a **prefill** of ``batch`` prompts of ``tokens`` tokens each (one forward pass);
* a **decode step** of ``batch`` sequences whose KV cache holds ``tokens`` tokens each.

Use::

    backend = get_backend("torch")       # scepsy_profile.profiling.registry
    reason = backend.unavailable()            # None when it can run here
    with backend.session(model, tp=1, share=1.0, options=BackendOptions()) as s:
        timing = s.measure(StepPoint("decode", batch=8, tokens=256))

A session builds the model once (random weights, no download) and measures many points; every
:class:`Timing` carries its spread (median and inter-quartile range over ``repeats`` runs).
:mod:`scepsy_profile.profiling.registry` finds backends by name, and
``tests/scepsy_profile/test_profiler_conformance.py`` runs one suite against every backend registered there.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from scepsy_common.errors import InputError
from scepsy_profile.measurements import MAX_BATCH, MAX_TOKENS, PHASES, Phase
from scepsy_profile.profiling.models import EngineModel


class MeasurementError(RuntimeError):
    """One point could not be measured (out of memory, engine error, time limit): recorded as a
    failed point with this message, and the sweep goes on."""


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (engine not installed, no device...); the message says why."""


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One point to measure: a prefill of ``batch`` × ``tokens`` or a decode step at ``batch``
    sequences of context ``tokens``."""

    phase: Phase
    batch: int
    tokens: int

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise InputError("point", "phase", "prefill or decode", self.phase)
        for name, hi in (("batch", MAX_BATCH), ("tokens", MAX_TOKENS)):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= hi):
                raise InputError("point", name, f"an integer in [1, {hi}]", v)


@dataclass(frozen=True, slots=True)
class Timing:
    """The measured latency of one point, in milliseconds, with its spread."""

    median_ms: float
    iqr_ms: float
    samples_ms: tuple[float, ...]
    method: str = ""
    """How the time was obtained (e.g. ``torch.utils.benchmark``, ``vllm metrics``)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median_ms) and self.median_ms > 0):
            raise MeasurementError(f"non-positive or non-finite latency {self.median_ms!r} ms")
        if not (math.isfinite(self.iqr_ms) and self.iqr_ms >= 0):
            raise MeasurementError(f"bad spread {self.iqr_ms!r} ms")

    @classmethod
    def of(cls, samples_ms: list[float] | tuple[float, ...], method: str = "") -> Timing:
        """Median and inter-quartile range of ``samples_ms`` (linear-interpolated quantiles)."""
        xs = sorted(float(x) for x in samples_ms)
        if not xs:
            raise MeasurementError("no timing samples")
        return cls(median_ms=_quantile(xs, 0.5), iqr_ms=_quantile(xs, 0.75) - _quantile(xs, 0.25),
                   samples_ms=tuple(round(x, 6) for x in xs), method=method)


def _quantile(xs: list[float], q: float) -> float:
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Where a session runs: ``name`` is the catalog GPU name on a GPU (``H200``), ``cpu`` on
    a CPU; ``detail`` is what the engine reported (device model, driver, cores, memory)."""

    name: str
    kind: str
    """``cuda`` or ``cpu``."""
    memory_gib: float
    """Memory of one device (a GPU's memory; on a CPU, the memory the engine may use)."""
    count: int = 1
    """Devices (GPUs, or cores on a CPU) the session can use."""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """Knobs shared by every backend."""

    repeats: int = 7
    """Timed runs per point (median and IQR over them)."""
    warmup: int = 2
    """Untimed runs before the timed ones."""
    threads: int | None = None
    """CPU threads the engine uses (None: the share of the cores the session may use)."""
    point_timeout_s: float = 300.0
    """A point taking longer than this is recorded as failed."""
    seed: int = 0
    """Seed of the random weights and token ids."""
    engine_python: str | None = None
    """The interpreter of the engine's own virtual environment (vLLM); None: auto-detect."""
    memory_gib: float | None = None
    """KV-cache memory for engines that need it said (vLLM on CPU); None: the backend's default."""
    extra: tuple[tuple[str, str], ...] = ()
    """Backend-specific settings as (name, value) pairs."""

    def __post_init__(self) -> None:
        for name in ("repeats", "warmup"):
            v = getattr(self, name)
            lo = 1 if name == "repeats" else 0
            if not (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= 1000):
                raise InputError("profile options", name, f"an integer in [{lo}, 1000]", v)
        if self.threads is not None and not (isinstance(self.threads, int) and self.threads >= 1):
            raise InputError("profile options", "threads", "an integer >= 1", self.threads)
        if not (math.isfinite(self.point_timeout_s) and self.point_timeout_s > 0):
            raise InputError("profile options", "point_timeout_s", "a number > 0",
                             self.point_timeout_s)


@runtime_checkable
class ProfilerSession(Protocol):
    """An engine holding one model instance, ready to time points."""

    device: DeviceInfo

    def measure(self, point: StepPoint) -> Timing:
        """Time ``point``; raise :class:`MeasurementError` when it cannot be measured."""
        ...


@runtime_checkable
class ProfilerBackend(Protocol):
    """A way of timing LLM steps with a real engine."""

    @property
    def name(self) -> str:  # read-only: a frozen dataclass's field satisfies it
        """Registry name (``torch``, ``vllm``)."""
        ...

    def unavailable(self, options: BackendOptions | None = None) -> str | None:
        """None when the backend can run here, else why not (shown to the user)."""
        ...

    def version(self, options: BackendOptions | None = None) -> str:
        """The engine's version, recorded with every measurement."""
        ...

    def unsupported(self, model: EngineModel, tp: int, share: float,
                    options: BackendOptions | None = None) -> str | None:
        """None when the backend can time ``model`` at ``tp`` and ``share`` here, else why not
        (e.g. a share below 1 on a GPU without an MPS daemon, a TP degree above the devices)."""
        ...

    def session(self, model: EngineModel, tp: int, share: float,
                options: BackendOptions) -> AbstractContextManager[ProfilerSession]:
        """Start the engine for one instance; closing the context frees it (processes, memory).

        Raises :class:`BackendUnavailable` when :meth:`unavailable` or :meth:`unsupported` would
        say why not."""
        ...
