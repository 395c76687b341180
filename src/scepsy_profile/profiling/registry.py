"""The profiler backends by name: the built-in ``torch`` and ``vllm``, and any you register.

Importing a backend's module imports no engine (torch, vLLM): each one checks, when asked, whether
its engine can run here (:meth:`ProfilerBackend.unavailable`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from scepsy_common.errors import InputError
from scepsy_profile.profiling.backend import ProfilerBackend
from scepsy_profile.profiling.torch_backend import TorchBackend
from scepsy_profile.profiling.vllm_backend import VllmBackend

_REGISTRY: dict[str, Callable[[], ProfilerBackend]] = {"torch": TorchBackend, "vllm": VllmBackend}


def register_backend(name: str, factory: Callable[[], ProfilerBackend]) -> None:
    """Register ``factory`` (a callable returning a backend) under ``name``; a name registers
    once."""
    if name in _REGISTRY:
        raise ValueError(f"profiler backend {name!r} is already registered")
    _REGISTRY[name] = factory


def backend_names() -> tuple[str, ...]:
    """Registered backend names, sorted."""
    return tuple(sorted(_REGISTRY))


def get_backend(name: str) -> ProfilerBackend:
    """The backend called ``name``, or :class:`InputError` listing the known ones."""
    if name not in _REGISTRY:
        raise InputError("profile", "backend", f"one of {', '.join(sorted(_REGISTRY))}", name)
    return _REGISTRY[name]()


def backends() -> Iterator[ProfilerBackend]:
    """Every registered backend, in name order."""
    for name in backend_names():
        yield _REGISTRY[name]()
