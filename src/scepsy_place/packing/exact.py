"""An exact placement test for the replicas of one GPU type: the loop's oracle when a placer fails.

The greedy placers (:mod:`scepsy_place.packing.placement`) may leave replicas unplaced that fit (their
order of choices is a heuristic). :func:`place_exactly` decides it with a small MILP over the
free GPUs of one type, and when a placement exists it returns one:

* a *shape* ``σ`` is (tp, share units, memory per GPU); ``n_σ`` replicas have it;
* ``y_{δσ}`` TP groups of shape ``σ`` run in NVLink domain ``δ`` (``Σ_δ y_{δσ} = n_σ``), and
  ``u_{jσ}`` of their slices on GPU ``j`` of ``δ``: ``Σ_{j∈δ} u_{jσ} = tp_σ·y_{δσ}`` and
  ``u_{jσ} ≤ y_{δσ}`` (a group's slices are on distinct GPUs);
* per GPU the units and the memory fit what is free: ``Σ_σ units_σ·u_{jσ} ≤ free_j`` and
  ``Σ_σ mem_σ·u_{jσ} ≤ free memory_j``.

These are exactly the placement invariants (capacity, locality): given per-GPU counts with
``u_{jσ} ≤ y_{δσ}``, listing the slices GPU by GPU and dealing them round-robin to the
``y_{δσ}`` groups gives every group ``tp`` slices on distinct GPUs (a GPU's run of at most
``y`` consecutive slices never reaches the same group twice), which is how the slots are built.
Identical GPUs of a domain are ordered by load (symmetry breaking; any placement can be so
permuted). The MILP runs under a time limit; ``unknown`` is the answer when it runs out.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pulp

from scepsy_opt.planning.solver import highs_status, pulp_highs
from scepsy_place.packing.replicas import Demand, Slot
from scepsy_place.packing.topology import MEMORY_TOL_GIB, Node, Topology

EXACT_MAX_GPUS = 64  # GPUs of one type beyond which the test is not tried (``unknown``)
EXACT_TIME_S = 2.0  # time limit of one test (less when the plan's deadline is nearer)
ExactStatus = Literal["placed", "infeasible", "unknown"]


@dataclass(frozen=True)
class ExactPlacement:
    """The answer of :func:`place_exactly`: ``slots`` for every demand when ``placed``."""

    status: ExactStatus
    slots: tuple[Slot, ...] = ()


Shape = tuple[int, int, float, float]  # tp, units, memory GiB per GPU, share


def _shape(d: Demand) -> Shape:
    return (d.tp, d.units, d.memory_gib, d.share)


def _free(n: Node, j: int) -> tuple[int, float]:
    return n.free_units(j), n.free_memory(j)


def _domain_key(n: Node, dom: range) -> tuple[Any, ...]:
    """What makes two NVLink domains interchangeable: size and each GPU's free capacity."""
    return (len(dom), tuple(_free(n, j) for j in dom))


def place_exactly(topology: Topology, demands: Sequence[Demand], *,
                  time_limit_s: float = EXACT_TIME_S) -> ExactPlacement:
    """Whether ``demands`` (all of one GPU type) fit the free capacity of ``topology`` (module
    docstring): ``placed`` with the slots, ``infeasible`` (proven), or ``unknown`` (time ran out,
    or more than :data:`EXACT_MAX_GPUS` GPUs)."""
    if not demands:
        return ExactPlacement("placed")
    gpu = demands[0].gpu
    if any(d.gpu != gpu for d in demands):
        raise ValueError("place_exactly: demands of one GPU type")
    nodes = [n for n in topology.canonical_nodes() if n.gpu == gpu]
    if sum(n.gpus for n in nodes) > EXACT_MAX_GPUS or time_limit_s <= 0:
        return ExactPlacement("unknown")
    count: dict[Shape, int] = {}
    for d in demands:
        count[_shape(d)] = count.get(_shape(d), 0) + 1
    shapes = sorted(count)
    prob = pulp.LpProblem("scepsy_exact_placement", pulp.LpMinimize)
    domains = [(n, dom) for n in nodes for dom in n.domains()]
    y: dict[tuple[int, int], pulp.LpVariable] = {}
    u: dict[tuple[int, int, int], pulp.LpVariable] = {}
    for k, (n, dom) in enumerate(domains):
        for s, (tp, units, mem, _) in enumerate(shapes):
            fits = [j for j in dom if units <= n.free_units(j)
                    and mem <= n.free_memory(j) + MEMORY_TOL_GIB]
            if tp > len(fits):
                continue
            y[k, s] = prob.add_variable(f"y{k}_{s}", 0, count[shapes[s]], pulp.LpInteger)
            for j in fits:
                u[k, s, j] = prob.add_variable(f"u{k}_{s}_{j}", 0, count[shapes[s]],
                                               pulp.LpInteger)
    prob += pulp.LpAffineExpression([])
    # the variables grouped once (in creation order) for the rows below
    by_shape: dict[int, list[pulp.LpVariable]] = {}
    for (_, s), v in y.items():
        by_shape.setdefault(s, []).append(v)
    by_group: dict[tuple[int, int], list[tuple[int, pulp.LpVariable]]] = {}
    by_gpu: dict[tuple[int, int], list[tuple[int, pulp.LpVariable]]] = {}
    for (k, s, j), w in u.items():
        by_group.setdefault((k, s), []).append((j, w))
        by_gpu.setdefault((k, j), []).append((s, w))
    for s, shape in enumerate(shapes):
        terms = [(v, 1) for v in by_shape.get(s, ())]
        if not terms:
            return ExactPlacement("infeasible")  # no domain holds one group of this shape
        prob += pulp.LpAffineExpression(terms) == count[shape], f"count{s}"
    for (k, s), v in y.items():
        tp = shapes[s][0]
        slices = [(w, 1) for _, w in by_group.get((k, s), ())]
        prob += pulp.LpAffineExpression([*slices, (v, -tp)]) == 0, f"group{k}_{s}"
        if tp > 1:
            for j, w in by_group.get((k, s), ()):
                prob += pulp.LpAffineExpression([(w, 1), (v, -1)]) <= 0, f"distinct{k}_{s}_{j}"
    totals: list[pulp.LpAffineExpression] = []
    for k, (n, dom) in enumerate(domains):
        loads = []
        for j in dom:
            mine = by_gpu.get((k, j), [])
            cap = pulp.LpAffineExpression([(w, shapes[s][1]) for s, w in mine])
            loads.append(cap)
            if mine:
                prob += cap <= n.free_units(j), f"units{k}_{j}"
                prob += (pulp.LpAffineExpression([(w, shapes[s][2]) for s, w in mine])
                         <= n.free_memory(j) + MEMORY_TOL_GIB), f"memory{k}_{j}"
        for a, b in itertools.pairwise(dom):  # identical GPUs: loads non-increasing
            if _free(n, a) == _free(n, b):
                prob += loads[a - dom[0]] - loads[b - dom[0]] >= 0, f"order{k}_{a}"
        totals.append(pulp.lpSum(loads))
    for k in range(1, len(domains)):  # identical domains: total loads non-increasing
        if _domain_key(*domains[k - 1]) == _domain_key(*domains[k]):
            prob += totals[k - 1] - totals[k] >= 0, f"domain_order{k}"
    prob.solve(pulp_highs(time_limit_s, mip_feasibility_tolerance=1e-9))  # HiGHS's gaps
    status, _, _ = highs_status(prob.solverModel)
    if status == "infeasible":
        return ExactPlacement("infeasible")
    if status != "optimal":
        return ExactPlacement("unknown")
    return ExactPlacement("placed", _slots(demands, shapes, domains, y, u))


def _slots(demands: Sequence[Demand], shapes: list[Shape], domains: list, y: dict,
           u: dict) -> tuple[Slot, ...]:
    """Slots from the MILP's counts: per domain and shape, the slices GPU by GPU dealt
    round-robin to its groups (module docstring); replicas of a shape in (llm, replica) order."""
    queue: dict[Shape, list[Demand]] = {}
    for d in sorted(demands, key=lambda d: d.key):
        queue.setdefault(_shape(d), []).append(d)
    out: list[Slot] = []
    for k, (n, dom) in enumerate(domains):
        for s, shape in enumerate(shapes):
            if (k, s) not in y:
                continue
            groups = round(y[k, s].value() or 0)
            if groups == 0:
                continue
            slices = [j for j in dom for _ in range(round((u[k, s, j].value() or 0)
                                                          if (k, s, j) in u else 0))]
            for g in range(groups):
                d = queue[shape].pop(0)
                gpus = tuple(sorted(slices[g::groups]))
                out.append(Slot(d.llm, d.replica, n.name, gpus, d.share, d.memory_gib))
    return tuple(out)
