"""Rows that the optimise-place loop adds to the allocation MILP, each valid for placeability.

A row ``Σ_c coeff_c·x_c ≤ rhs`` is *valid* when every allocation that some concrete placement
realises satisfies it: adding it never removes a placeable allocation. The loop
(:mod:`scepsy_place.formulations.loop`) adds only such rows, plus no-good cuts of allocations its placer
failed to place; it calls an instance infeasible only when valid rows alone leave the MILP
without an allocation.

* :func:`free_capacity_rows`: per GPU type, the units of the candidates within the free
  capacity of the topology (``Σ`` free units of its GPUs; a replica takes
  :func:`~scepsy_common.units.share_units` of each of its GPUs).
* :func:`packing_inequalities`: a GPU holds at most ``k`` slices of share above ``1/(k+1)``.
* :func:`configuration_cut`: the dual of the configuration LP of bin packing. A *slice* is one
  GPU's part of a replica (a TP-``t`` replica is ``t`` slices of its share, on distinct GPUs).
  For weights ``w ≥ 0`` on slice sizes, let ``K_f(w)`` be the most weight one GPU with ``f``
  free units holds (an unbounded knapsack over the sizes). Every placement puts on each GPU a
  set of slices that fits it, so ``Σ_slices w(size) ≤ Σ_GPUs K_{free}(w)`` holds for every
  placeable allocation. The cut takes the ``w`` that the configuration LP's dual gives for the
  failed allocation's slices (found by row generation), which separates the allocation
  whenever not even a fractional packing of its slices into the free GPUs exists (``22 × 0.4 +
  23 × 0.3`` on 16 GPUs needs 16.75 GPUs of patterns although its shares sum to 15.7). A
  candidate's coefficient uses ``w̃(u) = max {w(s) : s ≤ u}`` over the failed allocation's sizes
  ``s``: replacing each slice by a smaller weighted size keeps any GPU's slices fitting, so
  ``K`` is unchanged and the row stays valid for every allocation, not only the failed one.

**Two resources** (candidates with a memory share of their own, ``PlanOptions.memory_shares``):
:func:`free_capacity_rows` adds per GPU type the memory units within the topology's free memory,
and :func:`packing_inequalities` writes its rows for the memory dimension too (a GPU holds at
most ``k`` replicas' slices of more than ``1/(k+1)`` of its memory; memory shares are multiples
of 0.001, so ``k+1`` such slices exceed the GPU's memory). The configuration cuts stay
compute-only: a relaxation of the two-dimensional packing (every placement that fits both
resources fits compute alone), so they remain valid, only weaker than vector-packing cuts.

NVLink domains and equal TP shares are left out of these rows (leaving constraints out keeps a
row valid); what they exclude the loop learns from its placer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np
from scipy.optimize import linprog

from scepsy_common.units import UNITS, share_units
from scepsy_opt.planning.candidates import Candidate
from scepsy_opt.planning.milp import Row
from scepsy_opt.planning.problem import PlanningProblem
from scepsy_place.packing.topology import MEMORY_TOL_GIB, Topology

# a configuration cut must cut the failed allocation by more than this (relative to its rhs)
VIOLATION_REL = 1e-6
RHS_SLACK_REL = 1e-9  # float safety of the rhs (it is a sum of LP weights)
MAX_LP_ROUNDS = 200


def free_capacity_rows(topology: Topology, cands: Mapping[str, Sequence[Candidate]]) -> list[Row]:
    """Per GPU type, the units the candidates use within the topology's free capacity (the
    cluster's budgets count every GPU, in use or not)."""
    rows: list[Row] = []
    for gpu, free in topology.free_budgets().items():
        coeffs = {c: float(c.units) for cs in cands.values() for c in cs if c.gpu == gpu}
        if coeffs:
            rows.append((coeffs, float(round(free * UNITS))))
    rows.extend(free_memory_rows(topology, cands))
    return rows


def free_memory_rows(topology: Topology, cands: Mapping[str, Sequence[Candidate]]) -> list[Row]:
    """Per GPU type with candidates of a memory share of their own, their memory units within
    the topology's free memory: ``Σ_GPUs floor(1000·free GiB / device GiB)`` (memory shares are
    multiples of 0.001, so the replicas on a GPU use no more units than that); none when memory
    is tied to the share."""
    rows: list[Row] = []
    flat = [c for cs in cands.values() for c in cs]
    for gpu in sorted({c.gpu for c in flat if c.memory_share is not None}):
        mine = [c for c in flat if c.gpu == gpu]
        ref = next(c for c in mine if c.memory_share is not None and c.memory_gib > 0)
        device = ref.memory_gib / cast(float, ref.memory_share)  # not None: picked so
        free = sum(int((n.free_memory(i) + MEMORY_TOL_GIB) * UNITS / device + 1e-9)
                   for n in topology.nodes if n.gpu == gpu for i in range(n.gpus))
        rows.append(({c: float(c.mem_units) for c in mine}, float(free)))
    return rows


def packing_inequalities(problem: PlanningProblem, cands: Mapping[str, Sequence[Candidate]],
                         kmax: int = 4) -> list[Row]:
    """Valid inequalities of bin packing, per GPU type ``t`` and ``k = 1..kmax``: a GPU holds at
    most ``k`` slices of more than ``1/(k+1)`` of it, so
    ``Σ_c tp_c·replicas_c·[units_c > 1000/(k+1)]·x_c ≤ k·G_t``; with memory shares of their own,
    the same rows for the memory slices (module docstring)."""
    rows: list[Row] = []
    two = any(c.memory_share is not None for cs in cands.values() for c in cs)
    for gpu, g in problem.cluster.budgets().items():
        for k in range(1, kmax + 1):
            coeffs = {c: float(c.tp * c.replicas) for cs in cands.values() for c in cs
                      if c.gpu == gpu and share_units(c.share) * (k + 1) > UNITS}
            if coeffs:
                rows.append((coeffs, float(k * g)))
        if not two:
            continue
        for k in range(1, kmax + 1):
            coeffs = {c: float(c.tp * c.replicas) for cs in cands.values() for c in cs
                      if c.gpu == gpu and c.memory_share is not None
                      and share_units(c.memory_share) * (k + 1) > UNITS}
            if coeffs:
                rows.append((coeffs, float(k * g)))
    return rows


def slices(chosen: Sequence[Candidate]) -> dict[int, int]:
    """Slice size (units) -> count, of the candidates' replicas (``tp`` slices each)."""
    out: dict[int, int] = {}
    for c in chosen:
        u = share_units(c.share)
        out[u] = out.get(u, 0) + c.tp * c.replicas
    return dict(sorted(out.items()))


def free_gpus(topology: Topology, gpu: str) -> dict[int, int]:
    """Free units -> number of GPUs of type ``gpu`` with that much free (GPUs with none left
    out)."""
    out: dict[int, int] = {}
    for n in topology.nodes:
        if n.gpu == gpu:
            for i in range(n.gpus):
                f = n.free_units(i)
                if f > 0:
                    out[f] = out.get(f, 0) + 1
    return dict(sorted(out.items()))


def most_weight(sizes: Sequence[int], weights: Sequence[float], cap: int) -> tuple[float, tuple[int, ...]]:
    """The unbounded knapsack ``max Σ a_s·w_s`` s.t. ``Σ a_s·s ≤ cap``, ``a ≥ 0`` integer:
    (value, counts ``a`` per size). Exact dynamic programme over the capacity."""
    best = np.zeros(cap + 1)
    last = np.full(cap + 1, -1, dtype=int)
    for c in range(1, cap + 1):
        best[c], last[c] = best[c - 1], -1
        for j, (s, w) in enumerate(zip(sizes, weights, strict=True)):
            if s <= c and best[c - s] + w > best[c]:
                best[c], last[c] = best[c - s] + w, j
    counts = [0] * len(sizes)
    c = cap
    while c > 0:
        if last[c] < 0:
            c -= 1
        else:
            counts[last[c]] += 1
            c -= sizes[last[c]]
    return float(best[cap]), tuple(counts)


def separating_weights(need: Mapping[int, int], free: Mapping[int, int],
                       ) -> dict[int, float] | None:
    """Weights ``w`` on the slice sizes of ``need`` (size -> count) with
    ``Σ need·w > Σ_f free_f·K_f(w)`` (``free``: free units -> GPUs), or None when the slices
    pack fractionally (the configuration LP is feasible: no such weights exist).

    Row generation on the dual of the configuration LP:
    ``max Σ_s n_s·w_s − Σ_f N_f·v_f`` s.t. ``Σ_s a_s·w_s ≤ v_f`` for every pattern ``a`` that fits
    ``f`` units, ``0 ≤ w ≤ 1``; the most violated pattern of each ``f`` comes from
    :func:`most_weight`.
    """
    sizes, counts = list(need), [need[s] for s in need]
    caps, gpus = list(free), [free[f] for f in free]
    if not sizes:
        return None
    if not caps:
        return dict.fromkeys(sizes, 1.0)  # nothing is free: every slice is too many
    ns, nf = len(sizes), len(caps)
    cost = np.concatenate([-np.array(counts, float), np.array(gpus, float)])
    bounds = [(0.0, 1.0)] * ns + [(0.0, None)] * nf
    rows: list[np.ndarray] = []
    for k, f in enumerate(caps):  # start: each size alone, as many as fit
        for j, s in enumerate(sizes):
            if s <= f:
                rows.append(_pattern_row(ns, nf, k, {j: f // s}))
    w = np.zeros(ns)
    for _ in range(MAX_LP_ROUNDS):
        res = linprog(cost, A_ub=np.array(rows) if rows else None,
                      b_ub=np.zeros(len(rows)) if rows else None, bounds=bounds, method="highs")
        if res.status != 0:
            return None
        w, v = res.x[:ns], res.x[ns:]
        added = False
        for k, f in enumerate(caps):
            val, a = most_weight(sizes, list(w), f)
            if val > v[k] + 1e-9:
                rows.append(_pattern_row(ns, nf, k, {j: x for j, x in enumerate(a) if x}))
                added = True
        if not added:
            break
    weights = {s: float(x) for s, x in zip(sizes, w, strict=True)}
    lhs, rhs = _sides(need, free, weights)
    return weights if lhs > rhs + VIOLATION_REL * max(1.0, rhs) else None


def _pattern_row(ns: int, nf: int, k: int, a: Mapping[int, int]) -> np.ndarray:
    row = np.zeros(ns + nf)
    for j, x in a.items():
        row[j] = x
    row[ns + k] = -1.0
    return row


def _sides(need: Mapping[int, int], free: Mapping[int, int],
           weights: Mapping[int, float]) -> tuple[float, float]:
    """(``Σ need·w``, ``Σ_f N_f·K_f(w)`` with its float slack): the cut's two sides."""
    sizes = list(weights)
    ws = [weights[s] for s in sizes]
    lhs = sum(need[s] * weights[s] for s in need)
    rhs = sum(n * most_weight(sizes, ws, f)[0] for f, n in free.items())
    return lhs, rhs * (1 + RHS_SLACK_REL) + RHS_SLACK_REL


def configuration_cut(topology: Topology, gpu: str, chosen: Sequence[Candidate],
                      cands: Mapping[str, Sequence[Candidate]]) -> Row | None:
    """The configuration cut (module docstring) on GPU type ``gpu`` that the allocation's
    candidates ``chosen`` on that type violate, over every candidate of ``cands`` on it; None
    when their slices pack fractionally into the free GPUs (no such cut exists)."""
    need, free = slices(chosen), free_gpus(topology, gpu)
    weights = separating_weights(need, free)
    if weights is None:
        return None
    ordered = sorted(weights)

    def lifted(units: int) -> float:  # w̃(u) = max {w(s) : s ≤ u}
        return max((weights[s] for s in ordered if s <= units), default=0.0)

    coeffs = {c: c.tp * c.replicas * lifted(share_units(c.share))
              for cs in cands.values() for c in cs if c.gpu == gpu}
    _, rhs = _sides(need, free, weights)
    return {c: x for c, x in coeffs.items() if x > 0}, rhs
