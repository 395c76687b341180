"""Replica groups on GPUs of their own: every LLM's identical replicas laid out on the fewest
whole free GPUs (:func:`scepsy_common.units.replica_gpus`), TP groups overlapping where shares
allow (three TP-2 replicas at half a GPU on three GPUs).

The split min-cost formulation (:mod:`scepsy_opt.planning.mixing`) prices each replica group at that
many GPUs; :func:`layout_groups` realises it. Per LLM, in name order, NVLink domains are filled
one at a time (nodes of its GPU type in topology order, domains in index order, only GPUs that
are wholly free): ``r`` replicas of ``tp`` GPUs, ``k`` to a GPU, take ``g = max(tp, ⌈r·tp/k⌉)``
free GPUs of the domain, and replica ``i`` takes slices ``i·tp .. i·tp + tp − 1`` taken modulo
``g`` (distinct GPUs because ``tp ≤ g``; every GPU gets at most ``⌈r·tp/g⌉ ≤ k`` of them).
"""

from __future__ import annotations

from collections.abc import Sequence

from scepsy_common.units import UNITS, replicas_per_gpu
from scepsy_opt.allocation import Allocation
from scepsy_place.packing.placement import Placement, demands
from scepsy_place.packing.replicas import Demand, Slot
from scepsy_place.packing.topology import Topology
from scepsy_profile.catalog import Catalog


def _free_domains(topology: Topology, gpu: str, taken: set[tuple[str, int]],
                  ) -> list[tuple[str, list[int]]]:
    """Per NVLink domain of a node of ``gpu``, its wholly free GPUs not yet ``taken``."""
    out = []
    for n in topology.nodes:
        if n.gpu != gpu:
            continue
        for dom in n.domains():
            free = [i for i in dom if n.free_units(i) == UNITS and n.used[i][1] == 0
                    and (n.name, i) not in taken]
            if free:
                out.append((n.name, free))
    return out


def layout_groups(topology: Topology, allocation: Allocation,
                  catalog: Catalog | None = None) -> Placement:
    """Every replica of ``allocation`` on whole free GPUs of its own LLM (module docstring);
    replicas that find no room are ``unplaced``."""
    slots: list[Slot] = []
    unplaced: list[tuple[str, int, str]] = []
    taken: set[tuple[str, int]] = set()
    by_llm: dict[str, list[Demand]] = {}
    for d in demands(allocation, catalog):
        by_llm.setdefault(d.llm, []).append(d)
    for llm in sorted(by_llm):
        reps: Sequence[Demand] = by_llm[llm]
        first, inst = reps[0], allocation.llms[llm]
        # the one share-to-units rule, compute and memory (as the split formulation counts)
        k = min(replicas_per_gpu(inst.share), replicas_per_gpu(inst.memory_share))
        tp = first.tp
        left = list(reps)
        for node, free in _free_domains(topology, first.gpu, taken):
            if not left:
                break
            if len(free) < tp:
                continue
            r = min(len(left), len(free) * k // tp)
            if r == 0:
                continue
            g = max(tp, -(-r * tp // k))
            use = free[:g]
            for i, d in enumerate(left[:r]):
                gpus = tuple(sorted(use[(i * tp + q) % g] for q in range(tp)))
                slots.append(Slot(d.llm, d.replica, node, gpus, d.share, d.memory_gib))
            taken.update((node, i) for i in use)
            left = left[r:]
        unplaced.extend((d.llm, d.replica, "no whole free GPUs of its type left") for d in left)
    return Placement(tuple(slots), tuple(unplaced), "groups")
