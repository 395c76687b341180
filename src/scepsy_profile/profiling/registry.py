"""The profiler backends by name: the built-in ``torch`` and ``vllm``, and any you register.

Importing a backend's module imports no engine (torch, vLLM): each one checks, when asked, whether
its engine can run here (:meth:`ProfilerBackend.unavailable`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from scepsy_common.registry import Registry
from scepsy_profile.profiling.backend import ProfilerBackend
from scepsy_profile.profiling.torch_backend import TorchBackend
from scepsy_profile.profiling.vllm_backend import VllmBackend

BACKENDS: Registry[Callable[[], ProfilerBackend]] = Registry("profiler backend",
                                                            source="profile", field="backend")
"""Every profiler backend by name (:class:`~scepsy_common.registry.Registry`): a callable
returning the backend."""
BACKENDS.register("torch", TorchBackend, summary="a transformers model timed in this process")
BACKENDS.register("vllm", VllmBackend, summary="vLLM's offline engine in a worker process")


def register_backend(name: str, factory: Callable[[], ProfilerBackend]) -> None:
    """Register ``factory`` (a callable returning a backend) under ``name``; a name registers
    once."""
    BACKENDS.register(name, factory)


def backend_names() -> tuple[str, ...]:
    """Registered backend names, sorted."""
    return tuple(sorted(BACKENDS))


def get_backend(name: str) -> ProfilerBackend:
    """The backend called ``name``, or :class:`InputError` listing the known ones."""
    return BACKENDS.require(name)()


def backends() -> Iterator[ProfilerBackend]:
    """Every registered backend, in name order."""
    for name in backend_names():
        yield BACKENDS[name]()
