"""Lower bounds on the GPUs and nodes a set of demands needs.

A replica needs, on each of its ``tp`` GPUs, ``share`` of the compute and ``memory_gib`` of the
memory: per GPU it is a two-dimensional item (compute, memory), and placing replicas on the GPUs
of one type is vector bin packing. Every bound below is per GPU type (types never share a GPU),
then summed; compute counts in thousandths of a GPU, memory in millionths of the GPU's memory
(rounded down, so a set of items that fits a GPU also fits in these integers: every bound stays
a relaxation).

* **L1**: ``ceil(Σ tp × share)`` (a TP group of ``tp`` GPUs at ``share`` counts ``tp × share``).
* **L2** (Martello and Toth, 1990): bin packing of the per-GPU items (a TP group is ``tp`` items
  of size ``share``; forgetting that they must sit on distinct GPUs only relaxes the problem),
  capacity 1 per GPU. For ``0 ≤ α ≤ 1/2`` let J1 = items > 1 − α, J2 = items in (1/2, 1 − α],
  J3 = items in [α, 1/2]; then ``L(α) = |J1| + |J2| + max(0, ceil((Σ J3 − (|J2| − Σ J2))))``
  and ``L2 = max_α L(α) ≥ L1``. Only the item sizes need to be tried as α.
* **DFF** (Fekete and Schepers, 2001): a dual feasible function ``f`` maps item sizes so that
  items fitting a bin still sum to at most 1, so ``ceil(Σ f(x))`` is a bound; per dimension,
  ``u_k(x) = x`` when ``(k+1)x`` is an integer, else ``floor((k+1)x) / k`` (``k ≤ 12``),
  composed with ``f_λ`` (0 below λ, 1 above 1 − λ, x between; λ ≤ 1/2 an item size):
  24 slices of 0.4 count 0.5 each with ``k = 2`` (at most two per GPU), 12 GPUs where L2
  says 10. Part of ``vector``.
* **memory L1, L2**: the same two bounds on the memory dimension alone (items
  ``memory_gib / GPU memory``; the GPU memory is the largest of the type's nodes in the
  topology, else the catalog's).
* **vector** (conflict clique, for two-dimensional packing with TP groups): two per-GPU items
  *conflict* when they cannot share a GPU: their compute exceeds 1 or their memory exceeds the
  GPU's, or they are slices of one TP group (distinct GPUs). For a set K of pairwise
  conflicting items (a clique) every packing puts the items of K on ``|K|`` distinct GPUs. Let R be the other items and, for a threshold α in one
  dimension d (capacity ``cap_d``), R_α the items of R with ``d ≥ α``; only the GPUs of K's
  items that can share a GPU with some item of R_α can take them, with room at most
  ``Σ (cap_d − d_k)`` over those items k of K, so
  ``V(K) = |K| + max over d, α of max(0, ceil((Σ_{R_α} d − room) / cap_d))``. With K the items
  above half a GPU's compute this is L2 (their J1 cannot take J3 items). Cliques are searched on
  the distinct (compute, memory) shapes: a
  shape whose two items conflict (more than half a GPU in some dimension) contributes all its
  items, another one the slices of its largest TP group; greedy cliques in four orders and a
  bounded exact maximum-weight clique search are evaluated. ``vector = max(L2, memory L2,
  DFF of each dimension, max V(K), domain)``; every V(K) is a valid bound, whichever cliques
  are found.
* **domain** (with a topology): a TP group as wide as the type's largest NVLink domain ``D``
  covers a whole domain, and groups sharing a domain share every GPU of it, so these groups
  pack into domains as one (compute, memory) item each: at least ``v`` domains, ``v`` their
  vector bound, and ``D × v`` GPUs; items that fit beside none of these groups (their sum
  with each exceeds a GPU in some dimension) are on other GPUs, adding their own vector bound.
* **nodes**: per GPU type, ``ceil(vector / S)`` for the largest node size ``S`` of that type,
  and at least the number of TP groups with more than ``S/2`` GPUs and more than half of each
  GPU (no two fit on one node). Without a topology: one node per GPU type demanded.

Tests (tests/scepsy_place/test_place_bounds.py) check every bound against exhaustive optimal packing of
random tiny instances.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from scepsy_common.errors import UnknownEntryError
from scepsy_common.units import UNITS
from scepsy_place.packing.replicas import Demand
from scepsy_place.packing.topology import MEMORY_TOL_GIB, Topology
from scepsy_profile.catalog import default_catalog

MEMORY_SCALE = 1_000_000  # memory items count in millionths of a GPU's memory
DFF_KMAX = 12  # dual feasible functions u_k tried, k = 1..DFF_KMAX
DFF_LAMBDAS = 48  # thresholds λ tried at most
CLIQUE_BUDGET = 4000  # branch-and-bound nodes of the exact clique search per GPU type


@dataclass(frozen=True)
class Bounds:
    """Lower bounds: GPUs (L1, L2) and nodes, in total and per GPU type (l1, l2, nodes); the
    memory dimension's L1 and L2 and the two-dimensional ``vector`` bound (clique and, with a
    topology, full-domain), in total and per GPU type (``vector_by_gpu``: memory l1, memory l2,
    vector)."""

    l1: int
    l2: int
    nodes: int
    by_gpu: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    memory_l1: int = 0
    memory_l2: int = 0
    vector: int = 0
    vector_by_gpu: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def best(self) -> int:
        """The strongest GPU bound: ``max(l2, vector)``."""
        return max(self.l1, self.l2, self.memory_l2, self.vector)


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


def dff_bound(items: Iterable[int], capacity: int = UNITS, kmax: int = DFF_KMAX) -> int:
    """The dual-feasible-function bound (module docstring) for bin packing ``items`` (integers
    ≤ capacity): ``max ceil(Σ u_k(f_λ(x)))`` over ``k ≤ kmax`` and thresholds ``λ``, and L1."""
    sizes: dict[int, int] = {}
    for x in items:
        if not 0 <= x <= capacity:
            raise ValueError("items must lie in [0, capacity]")
        sizes[x] = sizes.get(x, 0) + 1
    if not sizes:
        return 0
    cap = capacity
    lams = sorted({0, *(x for x in sizes if 2 * x <= cap)})
    if len(lams) > DFF_LAMBDAS:  # any subset of thresholds gives a valid bound
        step = len(lams) / DFF_LAMBDAS
        lams = sorted({lams[int(i * step)] for i in range(DFF_LAMBDAS)})
    best = 0
    for lam in lams:
        mapped: dict[int, int] = {}
        for x, n in sizes.items():
            y = 0 if x < lam else (cap if x > cap - lam else x)
            mapped[y] = mapped.get(y, 0) + n
        for k in range(1, kmax + 1):
            num = sum(n * (y * k if (k + 1) * y % cap == 0 else (k + 1) * y // cap * cap)
                      for y, n in mapped.items())
            best = max(best, -(-num // (cap * k)))
    return max(best, l1_bound((x * n for x, n in sizes.items()), cap))


# A group of per-GPU items: (compute, memory, tp, count of such TP groups).
Group = tuple[int, int, int, int]


def vector_bound(groups: Iterable[Group], capacity: tuple[int, int] = (UNITS, MEMORY_SCALE),
                 *, budget: int = CLIQUE_BUDGET) -> int:
    """The conflict-clique bound for packing TP groups of two-dimensional per-GPU items
    ``(compute, memory, tp, count)`` into bins of ``capacity`` (module docstring); at least the
    L2 bound of each dimension."""
    gs = [(c, m, tp, k) for c, m, tp, k in groups if k > 0]
    if not gs:
        return 0
    cap_c, cap_m = capacity
    if any(not (0 <= c <= cap_c and 0 <= m <= cap_m and tp >= 1) for c, m, tp, _ in gs):
        raise ValueError("items must lie in [0, capacity] and tp >= 1")
    comp = [c for c, _, tp, k in gs for _ in range(tp * k)]
    mem = [m for _, m, tp, k in gs for _ in range(tp * k)]
    base = max(l2_bound(comp, cap_c), l2_bound(mem, cap_m), dff_bound(comp, cap_c),
               dff_bound(mem, cap_m))
    shapes: dict[tuple[int, int], list[int]] = {}  # (c, m) -> [slices, largest tp]
    for c, m, tp, k in gs:
        s = shapes.setdefault((c, m), [0, 0])
        s[0] += tp * k
        s[1] = max(s[1], tp)
    keys = sorted(shapes)
    selfc = [2 * c > cap_c or 2 * m > cap_m for c, m in keys]
    weight = [shapes[v][0] if selfc[i] else shapes[v][1] for i, v in enumerate(keys)]
    n = len(keys)
    adj = [0] * n
    for i, (ci, mi) in enumerate(keys):
        for j in range(i + 1, n):
            cj, mj = keys[j]
            if ci + cj > cap_c or mi + mj > cap_m:
                adj[i] |= 1 << j
                adj[j] |= 1 << i

    def value(clique: list[int]) -> int:
        size = sum(weight[i] for i in clique)
        rest = [(i, shapes[keys[i]][0] - (weight[i] if i in clique else 0)) for i in range(n)]
        rest = [(i, k) for i, k in rest if k > 0]
        best = size
        for dim, cap in ((0, cap_c), (1, cap_m)):
            for alpha in sorted({keys[i][dim] for i, _ in rest}) or [0]:
                chosen = [(i, k) for i, k in rest if keys[i][dim] >= alpha]
                load = sum(keys[i][dim] * k for i, k in chosen)
                # the clique's GPUs that can take one of the chosen items, and their room
                room = sum(weight[j] * (cap - keys[j][dim]) for j in clique
                           if any(not (adj[j] >> i & 1) and not (i == j and selfc[j])
                                  for i, _ in chosen))
                best = max(best, size + max(0, -(-(load - room) // cap)))
        return best

    best = base
    orders = (lambda i: (-keys[i][0], -keys[i][1]), lambda i: (-keys[i][1], -keys[i][0]),
              lambda i: (-weight[i], i),
              lambda i: (-(keys[i][0] * cap_m + keys[i][1] * cap_c), i))
    for order in orders:
        clique: list[int] = []
        mask = (1 << n) - 1
        for i in sorted(range(n), key=order):
            if mask >> i & 1:
                clique.append(i)
                mask &= adj[i]
        best = max(best, value(clique))
    best = max(best, value(_max_weight_clique(weight, adj, budget)))
    return best


def domain_bound(groups: Iterable[Group], domain: int,
                 capacity: tuple[int, int] = (UNITS, MEMORY_SCALE)) -> int:
    """The full-domain bound (module docstring): TP groups of ``domain`` GPUs (the largest NVLink
    domain of the type) each cover one whole domain, so they pack into domains like one item
    each; ``domain ×`` that count, plus what the items that fit beside no such group need."""
    gs = [(c, m, tp, k) for c, m, tp, k in groups if k > 0]
    full = [(c, m, 1, k) for c, m, tp, k in gs if tp == domain]
    if not full or domain < 1:
        return 0
    cap_c, cap_m = capacity
    alone = [(c, m, tp, k) for c, m, tp, k in gs if tp != domain
             and all(c + fc > cap_c or m + fm > cap_m for fc, fm, _, _ in full)]
    return domain * vector_bound(full, capacity) + vector_bound(alone, capacity)


def _max_weight_clique(weight: list[int], adj: list[int], budget: int) -> list[int]:
    """A maximum-weight clique (the best found within ``budget`` branch-and-bound nodes)."""
    n = len(weight)
    order = sorted(range(n), key=lambda i: (-weight[i], i))
    best: list[Any] = [0, []]
    nodes = [0]

    def grow(clique: list[int], cand: list[int], w: int) -> None:
        nodes[0] += 1
        if w > best[0]:
            best[0], best[1] = w, list(clique)
        if nodes[0] > budget:
            return
        for k, i in enumerate(cand):
            if w + sum(weight[j] for j in cand[k:]) <= best[0]:
                return
            clique.append(i)
            grow(clique, [j for j in cand[k + 1:] if adj[i] >> j & 1], w + weight[i])
            clique.pop()

    grow([], order, 0)
    return best[1]


def memory_capacity(gpu: str, topology: Topology | None = None) -> float | None:
    """GPU memory (GiB) the memory bounds divide by: the largest of the ``gpu`` nodes of
    ``topology``, else the catalog's; None when neither knows the type."""
    if topology is not None:
        mems = [n.memory_gib for n in topology.nodes if n.gpu == gpu]
        if mems:
            return max(mems)
    try:
        return default_catalog().gpu(gpu).memory_gib
    except UnknownEntryError:
        return None


def memory_items(memory_gib: float, capacity_gib: float) -> int:
    """A per-GPU memory in millionths of ``capacity_gib`` (+ the placers' tolerance), rounded
    down: items that fit a GPU together fit :data:`MEMORY_SCALE` in these integers."""
    return min(MEMORY_SCALE, math.floor(memory_gib * MEMORY_SCALE / (capacity_gib + MEMORY_TOL_GIB)))


def bound(demands: Sequence[Demand], topology: Topology | None = None) -> Bounds:
    """L1, L2, memory, vector and node lower bounds for ``demands`` (node sizes and GPU memory
    from ``topology``)."""
    by_type: dict[str, list[Demand]] = {}
    for d in demands:
        by_type.setdefault(d.gpu, []).append(d)
    out: dict[str, tuple[int, int, int]] = {}
    vec: dict[str, tuple[int, int, int]] = {}
    for gpu, ds in sorted(by_type.items()):
        l1 = l1_bound(d.size for d in ds)
        l2 = l2_bound(d.units for d in ds for _ in range(d.tp))
        cap = memory_capacity(gpu, topology)
        counts: dict[tuple[int, int, int], int] = {}
        for d in ds:
            m = memory_items(d.memory_gib, cap) if cap else 0
            counts[(d.units, m, d.tp)] = counts.get((d.units, m, d.tp), 0) + 1
        mem = [m for (_, m, tp), k in counts.items() for _ in range(tp * k)]
        m1, m2 = l1_bound(mem, MEMORY_SCALE), l2_bound(mem, MEMORY_SCALE)
        groups = [(c, m, tp, k) for (c, m, tp), k in sorted(counts.items())]
        v = max(l2, m2, vector_bound(groups))
        if topology is not None:
            v = max(v, domain_bound(groups, topology.max_tp(gpu)))
        size = (max((n.gpus for n in topology.nodes if n.gpu == gpu), default=0)
                if topology is not None else 0)
        if size:
            big = sum(1 for d in ds if 2 * d.tp > size and 2 * d.units > UNITS)
            nodes = max(math.ceil(v / size), big, 1)
        else:
            nodes = 1
        out[gpu] = (l1, l2, nodes)
        vec[gpu] = (m1, m2, v)
    return Bounds(sum(v[0] for v in out.values()), sum(v[1] for v in out.values()),
                  sum(v[2] for v in out.values()), MappingProxyType(out),
                  sum(v[0] for v in vec.values()), sum(v[1] for v in vec.values()),
                  sum(v[2] for v in vec.values()), MappingProxyType(vec))
