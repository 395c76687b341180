"""Lower bounds on the GPUs and nodes a set of demands needs.

* **L1**: ``ceil(Σ tp × share)`` per GPU type (a TP group of ``tp`` GPUs at ``share`` counts
  ``tp × share``).
* **L2** (Martello and Toth, 1990): bin packing of the per-GPU items (a TP group is ``tp`` items
  of size ``share``; forgetting that they must sit on distinct GPUs only relaxes the problem),
  capacity 1 per GPU. For ``0 ≤ α ≤ 1/2`` let J1 = items > 1 − α, J2 = items in (1/2, 1 − α],
  J3 = items in [α, 1/2]; then ``L(α) = |J1| + |J2| + max(0, ceil((Σ J3 − (|J2| − Σ J2))))``
  and ``L2 = max_α L(α) ≥ L1``. Only the item sizes need to be tried as α.
* **nodes**: per GPU type, ``ceil(L2 / S)`` for the largest node size ``S`` of that type, and
  at least the number of TP groups with more than ``S/2`` GPUs and more than half of each GPU
  (no two fit on one node). Without a topology: one node per GPU type demanded.

Bounds are per GPU type (types never share a GPU) and summed. Counted in thousandths of a GPU
(exact integers).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from scepsy_common.units import UNITS
from scepsy_place.replicas import Demand
from scepsy_place.topology import Topology


@dataclass(frozen=True)
class Bounds:
    """Lower bounds: GPUs (L1, L2) and nodes, in total and per GPU type (l1, l2, nodes)."""

    l1: int
    l2: int
    nodes: int
    by_gpu: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)


def l1_bound(sizes: Iterable[int], capacity: int = UNITS) -> int:
    """``ceil(Σ sizes / capacity)``."""
    return -(-sum(sizes) // capacity)


def l2_bound(items: Iterable[int], capacity: int = UNITS) -> int:
    """Martello-Toth L2 for bin packing ``items`` (integers ≤ capacity) into bins of
    ``capacity``."""
    w = sorted(items)
    if not w:
        return 0
    if w[-1] > capacity or w[0] < 0:
        raise ValueError("items must lie in [0, capacity]")
    prefix = [0]
    for x in w:
        prefix.append(prefix[-1] + x)
    half = capacity // 2  # J3 holds w <= C/2 (C even: w <= half; odd: w <= floor(C/2))

    def count_sum(lo: int, hi: int) -> tuple[int, int]:  # items with lo <= w <= hi
        a, b = bisect.bisect_left(w, lo), bisect.bisect_right(w, hi)
        return (b - a, prefix[b] - prefix[a]) if b > a else (0, 0)

    best = 0
    for alpha in sorted({0, *(x for x in w if x <= half)}):
        n1, _ = count_sum(capacity - alpha + 1, capacity)
        n2, s2 = count_sum(half + 1, capacity - alpha)
        _, s3 = count_sum(alpha, half)
        extra = max(0, -(-(s3 - (n2 * capacity - s2)) // capacity))
        best = max(best, n1 + n2 + extra)
    return max(best, l1_bound(w, capacity))


def bound(demands: Sequence[Demand], topology: Topology | None = None) -> Bounds:
    """L1, L2 and node lower bounds for ``demands`` (node sizes from ``topology``)."""
    by_type: dict[str, list[Demand]] = {}
    for d in demands:
        by_type.setdefault(d.gpu, []).append(d)
    out: dict[str, tuple[int, int, int]] = {}
    for gpu, ds in sorted(by_type.items()):
        l1 = l1_bound(d.size for d in ds)
        l2 = l2_bound(d.units for d in ds for _ in range(d.tp))
        size = (max((n.gpus for n in topology.nodes if n.gpu == gpu), default=0)
                if topology is not None else 0)
        if size:
            big = sum(1 for d in ds if 2 * d.tp > size and 2 * d.units > UNITS)
            nodes = max(math.ceil(l2 / size), big, 1)
        else:
            nodes = 1
        out[gpu] = (l1, l2, nodes)
    return Bounds(sum(v[0] for v in out.values()), sum(v[1] for v in out.values()),
                  sum(v[2] for v in out.values()), MappingProxyType(out))
