"""FGD's GPU fragmentation measure (Weng et al., "Beware of Fragmentation", USENIX ATC'23).

The fragmentation of one node with respect to a target workload is the *expected GPU capacity that
a task drawn from the workload's task mix cannot use* on that node. For one task type m (``num_gpu``
GPUs of ``gpu_milli`` milli-GPU each, optionally CPU and memory):

* the node cannot host m at all (fewer than ``num_gpu`` GPUs with ``gpu_milli`` free, or too little
  CPU/memory), or m needs no GPU: every free milli-GPU on the node is a fragment;
* otherwise: the free capacity of the GPUs that each have less than ``gpu_milli`` left is a
  fragment (they cannot serve m's per-GPU request).

The node's fragmentation is the probability-weighted sum over the mix. This follows the artifact's
``NodeGpuShareFragAmountScore`` (hkust-adsl/kubernetes-scheduler-simulator, pkg/utils/frag.go): the
sum of every fragment class except "Q3 satisfied". FGD places a task where this value grows least.

>>> mix = [(1, 500, 0.5), (2, 1000, 0.5)]
>>> node_fragmentation([1000, 300], mix)   # 0.5*300 (half-task can't use the 300) + 0.5*1300
800.0
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np

MILLI = 1000

__all__ = ["MILLI", "domain_fragmentation", "fragmentation_batch", "node_fragmentation",
           "task_mix", "typical_tasks"]


def fragmentation_batch(free: np.ndarray, num_gpu: np.ndarray, gpu_milli: np.ndarray,
                        prob: np.ndarray, cpu_free: np.ndarray | None = None,
                        cpu_req: np.ndarray | None = None, mem_free: np.ndarray | None = None,
                        mem_req: np.ndarray | None = None) -> np.ndarray:
    """FGD fragmentation of K node states at once.

    ``free`` is a K x G array of free milli-GPU per GPU slot (pad nodes with fewer GPUs with 0);
    ``num_gpu``, ``gpu_milli``, ``prob`` (and optionally ``cpu_req``/``mem_req``) describe the M task
    types. ``cpu_free``/``mem_free`` are length-K; a resource is only checked when both its free and
    its request arrays are given. Returns a length-K float array.
    """
    free = np.asarray(free)
    if free.ndim != 2:
        raise ValueError(f"free must be K x G, got shape {free.shape}")
    total = free.sum(axis=1, dtype=np.float64)
    out = np.zeros(free.shape[0], dtype=np.float64)
    num_gpu = np.asarray(num_gpu)
    gpu_milli = np.asarray(gpu_milli)
    prob = np.asarray(prob, dtype=np.float64)
    check_cpu = cpu_free is not None and cpu_req is not None
    check_mem = mem_free is not None and mem_req is not None
    for g in np.unique(gpu_milli):
        idx = np.flatnonzero(gpu_milli == g)
        if g <= 0:  # a task without GPU can use none of the node's free GPU capacity
            out += prob[idx].sum() * total
            continue
        enough = free >= g
        count = enough.sum(axis=1)
        small = np.where(enough, 0, free).sum(axis=1, dtype=np.float64)
        for m in idx:
            fits = count >= num_gpu[m]
            if check_cpu:  # so cpu_req is not None, mem_req below likewise
                fits &= np.asarray(cpu_free) >= cast(np.ndarray, cpu_req)[m]
            if check_mem:
                fits &= np.asarray(mem_free) >= cast(np.ndarray, mem_req)[m]
            out += prob[m] * np.where(fits, small, total)
    return out


def node_fragmentation(free_milli: Sequence[int], mix: Sequence[tuple[int, int, float]],
                       cpu_free: float | None = None, mem_free: float | None = None,
                       mix_cpu_mem: Sequence[tuple[float | None, float | None]] | None = None,
                       ) -> float:
    """Expected milli-GPU of one node that a task drawn from ``mix`` cannot use (FGD).

    ``free_milli``: free milli-GPU of each GPU of the node (0..1000). ``mix``: (num_gpu, gpu_milli,
    probability) per task type. ``mix_cpu_mem``: (cpu, memory) request per task type, aligned with
    ``mix``; CPU (memory) is only checked when both ``cpu_free`` (``mem_free``) and the per-type
    request are given (a ``None`` request never blocks).
    """
    if len(mix) == 0:
        return 0.0
    if mix_cpu_mem is not None and len(mix_cpu_mem) != len(mix):
        raise ValueError(f"mix_cpu_mem has {len(mix_cpu_mem)} entries, mix has {len(mix)}")
    free = np.asarray([list(free_milli) or [0]], dtype=np.int64)
    n = np.asarray([m[0] for m in mix], dtype=np.int64)
    g = np.asarray([m[1] for m in mix], dtype=np.int64)
    p = np.asarray([m[2] for m in mix], dtype=np.float64)
    cpu_req = mem_req = None
    if mix_cpu_mem is not None:
        cpu_req = np.asarray([-np.inf if c is None else c for c, _ in mix_cpu_mem], dtype=float)
        mem_req = np.asarray([-np.inf if m is None else m for _, m in mix_cpu_mem], dtype=float)
    out = fragmentation_batch(
        free, n, g, p,
        cpu_free=None if cpu_free is None else np.asarray([cpu_free], dtype=float), cpu_req=cpu_req,
        mem_free=None if mem_free is None else np.asarray([mem_free], dtype=float), mem_req=mem_req)
    return float(out[0])


def domain_fragmentation(free_milli: Sequence[int], nvlink_domain: int,
                         mix: Sequence[tuple[int, int, float]]) -> float:
    """FGD's measure for a node of NVLink domains of ``nvlink_domain`` consecutive GPUs.

    A task's GPUs never span domains, so every domain is scored as a node of its own and the
    node's value is their sum: a domain that can no longer hold a task type (a TP group of more
    GPUs than it has left with the task's share free) counts all its free capacity as a
    fragment for that type, even when the node as a whole still has enough GPUs. With one domain
    per node this is :func:`node_fragmentation`.

    >>> mix = [(4, 100, 1.0)]
    >>> domain_fragmentation([1000] * 8, 8, mix), domain_fragmentation([1000] * 8, 2, mix)
    (0.0, 8000.0)
    """
    free = list(free_milli)
    d = int(nvlink_domain)
    if len(mix) == 0 or not free:
        return 0.0
    if d < 1 or len(free) % d:
        raise ValueError(f"nvlink_domain {d} does not divide the node's {len(free)} GPUs")
    rows = np.asarray(free, dtype=np.int64).reshape(len(free) // d, d)
    n = np.asarray([m[0] for m in mix], dtype=np.int64)
    g = np.asarray([m[1] for m in mix], dtype=np.int64)
    p = np.asarray([m[2] for m in mix], dtype=np.float64)
    return float(fragmentation_batch(rows, n, g, p).sum())


def _shape(t: Any) -> tuple[int, int, int]:
    """(num_gpu, gpu_milli, cpu_milli) of a task object or tuple (num_gpu, gpu_milli[, cpu])."""
    if isinstance(t, tuple | list):
        return int(t[0]), int(t[1]), int(t[2]) if len(t) > 2 else 0
    return int(t.num_gpu), int(t.gpu_milli), int(getattr(t, "cpu_milli", 0))


def task_mix(tasks: Iterable[Any], *, include_cpu_only: bool = False
             ) -> list[tuple[int, int, float]]:
    """Task-type distribution ``[(num_gpu, gpu_milli, p)]`` of a task list, most popular first.

    Tasks are objects with ``num_gpu`` and ``gpu_milli`` attributes or tuples (num_gpu, gpu_milli).
    CPU-only tasks are left out unless ``include_cpu_only``.

    >>> task_mix([(1, 500), (1, 500), (2, 1000), (0, 0)])
    [(1, 500, 0.6666666666666666), (2, 1000, 0.3333333333333333)]
    """
    counts = Counter((n, g) for n, g, _ in map(_shape, tasks)
                     if include_cpu_only or (n > 0 and g > 0))
    total = sum(counts.values())
    if total == 0:
        return []
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [(n, g, c / total) for (n, g), c in ordered]


def typical_tasks(tasks: Iterable[Any], threshold: float = 0.95
                  ) -> list[tuple[int, int, int, float]]:
    """FGD's "typical pods": ``[(num_gpu, gpu_milli, cpu_milli, p)]``.

    Task types are (cpu, gpu_milli, num_gpu); the most popular types are kept until they cover
    ``threshold`` of all tasks, then renormalised (the artifact's ``GetTypicalPods`` with
    ``isInvolvedCpuPods: true, podPopularityThreshold: 95, podIncreaseStep: 1``). CPU-only tasks
    are included, as in the artifact.
    """
    counts = Counter(_shape(t) for t in tasks)
    total = sum(counts.values())
    if total == 0:
        return []
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept, cum = [], 0
    for key, c in ordered:
        kept.append((key, c))
        cum += c
        if cum >= threshold * total:
            break
    return [(n, g, cpu, c / cum) for (n, g, cpu), c in kept]
