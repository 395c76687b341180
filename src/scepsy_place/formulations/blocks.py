"""The placeable-by-construction formulation: GPU blocks, one LLM shape per GPU.

The aggregate MILP (:mod:`scepsy_opt.planning.milp`) budgets GPU *capacity*; whether its allocation fits
on whole GPUs and NVLink domains is learnt afterwards, by placing it
(:func:`scepsy_place.formulations.loop.plan_and_place`). At thousands of GPUs that loop is slow: the optimum
fills the cluster with fractional-share TP groups that fragment the nodes, and every round costs
a placement. This formulation is placeable by construction instead.

It is the pattern formulation (integer counts of node fillings) restricted to the patterns that
need no enumeration: a *block* is ``tp`` wholly free GPUs of one NVLink domain serving
``k = replicas_per_gpu(share)`` replicas of one LLM shape (``floor(1/share)`` in the units of
:func:`scepsy_common.units.share_units`; each replica takes ``share`` of every GPU of the
block). With memory as a resource of its own (``PlanOptions.memory_shares``) a block holds
``k = min(replicas_per_gpu(share), replicas_per_gpu(memory_share))`` replicas: as many as fit
both the GPU's compute and its memory (the memory budget rows are then implied by the block
rows). A candidate ``replicas × (gpu, tp, share)`` then uses ``tp·ceil(replicas/k)`` whole
GPUs (``generate_candidates(blocks=True)`` counts them so), and the MILP gets, per GPU type and
per TP degree ``t`` the candidates use, the capacity row

    Σ_{c: tp_c ≥ t} GPUs_c · x_c  ≤  Σ_domains t · floor(free_d / t)

(``free_d`` the wholly free GPUs of domain ``d``). With TP degrees that divide one another
(1, 2, 4, 8) these rows are necessary and sufficient: blocks placed largest first take from each
domain multiples of the current size, so a domain's room for size ``t`` stays a multiple of
``t``, and size ``t`` fits as long as its row holds. The ``blocks`` placer
(:class:`scepsy_place.packing.placement.Blocks`) does exactly that, so every plan of this formulation is
placed in one round.

What it gives up: two LLMs never share a GPU, and the rest of a GPU (0.1 of it at share 0.3) stays
idle. The aggregate optimum is a lower bound on it (``benchmarks/solvers/formulations_bench.py`` reports the
gap), and :func:`scepsy_place.formulations.loop.plan_and_place`'s ``auto`` formulation keeps the better placed
plan of the two where the aggregate loop is affordable (docs/optimiser.md). GPUs already in use are never touched by a
block: re-planning on a busy cluster counts only the wholly free GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scepsy_common.units import UNITS
from scepsy_opt.planning.candidates import Candidate, CandidateSet, generate_candidates
from scepsy_opt.planning.milp import Row, capacity_shapes, reduced_candidates, unit_needs
from scepsy_opt.planning.problem import Deadline, PlanningProblem
from scepsy_place.packing.placement import whole_free_gpus
from scepsy_place.packing.topology import Topology

REDUCE_MIN_GPUS = 64  # from this size on, block candidates go through reduced-cost fixing


def block_candidates(problem: PlanningProblem, topology: Topology,
                     deadline: Deadline | None = None) -> CandidateSet:
    """Every LLM's block candidates (``generate_candidates(blocks=True)``): all of them below
    :data:`REDUCE_MIN_GPUS` GPUs, after exact reduced-cost fixing from there on (within
    ``deadline``: :class:`~scepsy_opt.planning.problem.TimeLimitReached` once it passes)."""
    if problem.cluster.total_gpus < REDUCE_MIN_GPUS:
        return generate_candidates(problem, blocks=True, deadline=deadline)
    return reduced_candidates(problem, blocks=True, rows=lambda cs: capacity_rows(topology, cs),
                              deadline=deadline)


def fewest_block_gpus(problem: PlanningProblem, deadline: Deadline | None = None,
                      ) -> dict[str, int] | None:
    """Per LLM, a lower bound on the whole GPUs every block candidate of it takes: its fewest
    units at the targets on any GPU type (:func:`scepsy_opt.planning.milp.unit_needs` over its
    capacity shapes, ``units·r`` with ``r`` the fewest replicas that carry its load at
    ``max_utilisation``), rounded up to whole GPUs. A block candidate of ``r' ≥ r`` replicas
    takes ``tp·⌈r'/k⌉ ≥ r'·tp/k`` GPUs, and ``k = replicas_per_gpu(share) ≤ UNITS /
    share_units(share)``, so at least ``r·units/UNITS``; preemption and per-LLM SLOs only add
    replicas. None when an LLM fits no GPU (its candidates say why). Raises
    :class:`~scepsy_opt.planning.problem.TimeLimitReached`."""
    shapes = capacity_shapes(problem, deadline)
    if any(not shapes.get(m) for m in problem.llms):
        return None
    types = sorted({sh[0] for v in shapes.values() for sh in v})
    fewest = unit_needs(problem, shapes, types)(1.0).min(axis=1)  # rows: LLMs, sorted
    return {m: -(-int(n) // UNITS) for m, n in zip(sorted(shapes), fewest, strict=True)}


def level_capacity(topology: Topology, gpu: str, tp: int) -> int:
    """GPUs of type ``gpu`` that blocks of ``tp`` or more GPUs can use: ``Σ_d tp·floor(free_d/tp)``."""
    return _level(_free_per_domain(topology, gpu), tp)


def _free_per_domain(topology: Topology, gpu: str) -> list[int]:
    return [len(free) for _, _, free in whole_free_gpus(topology, gpu)]


def _level(free: Sequence[int], tp: int) -> int:
    return sum(tp * (f // tp) for f in free)


def capacity_rows(topology: Topology, by_llm: Mapping[str, Sequence[Candidate]]) -> list[Row]:
    """The capacity rows of the module docstring, per GPU type and TP degree in use."""
    rows: list[Row] = []
    flat = [c for cs in by_llm.values() for c in cs]
    for gpu in sorted({c.gpu for c in flat}):
        mine = [c for c in flat if c.gpu == gpu]
        free = _free_per_domain(topology, gpu)  # once per type, not per level
        for t in sorted({c.tp for c in mine}):
            coeffs = {c: float(c.units) for c in mine if c.tp >= t}
            rows.append((coeffs, float(UNITS * _level(free, t))))
    return rows
