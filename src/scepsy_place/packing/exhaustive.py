"""The exhaustive placeable optimum of tiny instances: the oracle every formulation is tested on.

:func:`placeable_optimum` enumerates one candidate per LLM (every candidate, unpruned, unless
given) best-first, in order of total cost, and tests each combination that fits the GPU budgets
(compute and memory, per GPU type) for placeability on the topology's free capacity, exactly:
per GPU type by the placement MILP of :mod:`scepsy_place.packing.exact` (``method="exact"``), or by
exhaustive assignment of every replica to GPUs of one NVLink domain (``method="search"``, tiny
topologies only; it shares no code with the MILP, so the two check each other). The first
placeable combination is the cheapest placeable allocation of the candidates.

Best-first enumeration: each LLM's candidates sorted by cost; a combination is an index tuple,
its successors increment one index at or after the last one incremented (so every tuple is
reached once, from the tuple with its last nonzero index decremented), and a heap pops them in
order of total cost (ties by index tuple: deterministic). Costs only grow along successors, so
the pops come in non-decreasing total cost.

Nothing here is fast: :class:`OracleLimit` is raised when ``limit`` combinations were tested
without an answer, or when the exact test cannot decide a GPU type (more than 64 GPUs of it, or
its time limit), so ``None`` always means proven: no combination of the candidates places.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

from scepsy_common.units import UNITS
from scepsy_opt.allocation import Allocation
from scepsy_opt.planning.candidates import Candidate, generate_candidates
from scepsy_opt.planning.problem import PlanningProblem
from scepsy_place.packing.exact import place_exactly
from scepsy_place.packing.placement import demands
from scepsy_place.packing.replicas import Demand
from scepsy_place.packing.topology import MEMORY_TOL_GIB, Topology

ORACLE_LIMIT = 200_000  # combinations tested before giving up (OracleLimit)
ORACLE_EXACT_S = 30.0  # time limit of one exact placement test
SEARCH_MAX_GPUS = 8  # GPUs of one type that exhaustive assignment accepts
Method = Literal["exact", "search"]


class OracleLimit(RuntimeError):
    """The oracle could not decide within its limits (no answer, not a proof)."""


def combinations_by_cost(cands: Mapping[str, Sequence[Candidate]],
                         ) -> Iterator[tuple[float, dict[str, Candidate]]]:
    """Every choice of one candidate per LLM, as (total cost, choice), in non-decreasing total
    cost (module docstring; ties in index order)."""
    llms = sorted(cands)
    lists = [sorted(cands[m], key=lambda c: (c.cost, c.gpu, c.tp, c.share, c.replicas,
                                              c.memory_share or 0.0)) for m in llms]
    if not llms or any(not cs for cs in lists):
        return

    def total(idx: tuple[int, ...]) -> float:
        return math.fsum(lists[i][k].cost for i, k in enumerate(idx))

    start = (0,) * len(llms)
    heap: list[tuple[float, tuple[int, ...], int]] = [(total(start), start, 0)]
    while heap:
        cost, idx, pos = heapq.heappop(heap)
        yield cost, {m: lists[i][k] for i, (m, k) in enumerate(zip(llms, idx, strict=True))}
        for j in range(pos, len(idx)):
            if idx[j] + 1 < len(lists[j]):
                nxt = (*idx[:j], idx[j] + 1, *idx[j + 1:])
                heapq.heappush(heap, (total(nxt), nxt, j))


def fits_budgets(problem: PlanningProblem, choice: Mapping[str, Candidate]) -> bool:
    """Per GPU type, the choice's compute units and memory units within the cluster's GPUs."""
    budgets = problem.cluster.budgets()
    units: dict[str, list[int]] = {}
    for c in choice.values():
        u = units.setdefault(c.gpu, [0, 0])
        u[0] += c.units
        u[1] += c.mem_units
    return all(max(u) <= budgets.get(g, 0) * UNITS for g, u in units.items())


def placeable(topology: Topology, dem: Sequence[Demand], method: Method = "exact") -> bool:
    """Whether every demand fits the free capacity of ``topology`` (compute and memory per GPU,
    TP groups inside one NVLink domain), decided per GPU type; :class:`OracleLimit` when it
    cannot be decided."""
    by_gpu: dict[str, list[Demand]] = {}
    for d in dem:
        by_gpu.setdefault(d.gpu, []).append(d)
    for gpu in sorted(by_gpu):
        if method == "search":
            ok = search_fits(topology, by_gpu[gpu])
        else:
            ex = place_exactly(topology, by_gpu[gpu], time_limit_s=ORACLE_EXACT_S)
            if ex.status == "unknown":
                raise OracleLimit(f"the exact placement test could not decide {gpu}")
            ok = ex.status == "placed"
        if not ok:
            return False
    return True


def search_fits(topology: Topology, dem: Sequence[Demand]) -> bool:
    """Exhaustive assignment of the demands (one GPU type) to ``tp`` distinct GPUs of one NVLink
    domain each, within every GPU's free units and memory (at most :data:`SEARCH_MAX_GPUS`
    GPUs; states already refuted are remembered)."""
    if not dem:
        return True
    gpu = dem[0].gpu
    nodes = [n for n in topology.nodes if n.gpu == gpu]
    if sum(n.gpus for n in nodes) > SEARCH_MAX_GPUS:
        raise OracleLimit(f"more than {SEARCH_MAX_GPUS} GPUs of {gpu} for exhaustive search")
    domains = [[(n.free_units(j), n.free_memory(j)) for j in dom] for n in nodes
               for dom in n.domains()]
    items = sorted(((d.tp, d.units, d.memory_gib) for d in dem), reverse=True)
    refuted: set[tuple[object, ...]] = set()

    def state(doms: list[list[tuple[int, float]]]) -> tuple[object, ...]:
        return tuple(sorted(tuple(sorted(d)) for d in doms))

    def go(k: int, doms: list[list[tuple[int, float]]]) -> bool:
        if k == len(items):
            return True
        key = (k, state(doms))
        if key in refuted:
            return False
        tp, units, mem = items[k]
        for i, dom in enumerate(doms):
            for gs in itertools.combinations(range(len(dom)), tp):
                if all(dom[g][0] >= units and dom[g][1] + MEMORY_TOL_GIB >= mem for g in gs):
                    nxt = [list(d) for d in doms]
                    for g in gs:
                        nxt[i][g] = (dom[g][0] - units, dom[g][1] - mem)
                    if go(k + 1, nxt):
                        return True
        refuted.add(key)
        return False

    return go(0, domains)


def placeable_optimum(problem: PlanningProblem, topology: Topology,
                      cands: Mapping[str, Sequence[Candidate]] | None = None, *,
                      limit: int = ORACLE_LIMIT, method: Method = "exact",
                      ) -> tuple[float, Allocation] | None:
    """The cheapest placeable allocation of ``cands`` (default: every candidate of ``problem``,
    unpruned) on ``topology``: (objective s, with the constant tool time, as plans report it;
    allocation), or None when no combination fits the budgets and places (proven).
    :class:`OracleLimit` after ``limit`` combinations, or when placeability cannot be decided."""
    by_llm = cands if cands is not None else generate_candidates(problem, prune=False).by_llm
    catalog = problem.catalog
    for tested, (_, choice) in enumerate(combinations_by_cost(by_llm)):
        if tested >= limit:
            raise OracleLimit(f"no placeable combination among the {limit} cheapest")
        if not fits_budgets(problem, choice):
            continue
        alloc = Allocation({m: c.instance for m, c in choice.items()})
        if placeable(topology, demands(alloc, catalog), method):
            obj = math.fsum([choice[m].cost for m in sorted(choice)]) + problem.constant_s
            return obj, alloc
    return None
