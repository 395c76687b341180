"""A placement's quality: GPUs and nodes it uses against the lower bounds
(:mod:`scepsy_place.packing.bounds`), and the fragmentation it leaves (FGD, :mod:`scepsy_place.packing.fgd`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scepsy_place.packing.bounds import bound
from scepsy_place.packing.fgd import domain_fragmentation
from scepsy_place.packing.placement import Placement, apply
from scepsy_place.packing.replicas import Demand, task_mix
from scepsy_place.packing.topology import Topology


def fragmentation(topology: Topology, mix: Sequence[tuple[int, int, float]]) -> float | None:
    """Σ over NVLink domains of FGD's expected unusable GPU capacity (thousandths) for ``mix``
    (:func:`scepsy_place.packing.fgd.domain_fragmentation`: a domain that cannot hold a TP group counts
    its free capacity as a fragment for it); None for an empty mix."""
    if not mix:
        return None
    tasks = list(mix)
    seen: dict[tuple[Any, ...], float] = {}  # nodes of equal free units: one computation
    parts = []
    for n in topology.canonical_nodes():
        free = [n.free_units(i) for i in range(n.gpus)]
        key = (tuple(free), n.nvlink_domain)
        if key not in seen:
            seen[key] = domain_fragmentation(free, n.nvlink_domain, tasks)
        parts.append(seen[key])
    return math.fsum(parts)


def quality(topology: Topology, placement: Placement, demands: Sequence[Demand]) -> dict[str, Any]:
    """GPUs and nodes ``placement`` uses on ``topology`` (the topology it was placed on) against
    the lower bounds of the demands it placed (``gap_to_bound``: GPUs used over the best bound,
    minus one). Names no node: compare it across permutations."""
    placed = placement.replicas()
    mine = [d for d in demands if d.key in placed]
    b = bound(mine, topology)
    gpus = placement.gpus()
    opened = {(n, g) for n, g in gpus if topology.node(n).used[g] == (0.0, 0.0)}
    nodes = placement.nodes()
    after = apply(topology, placement)
    return {
        "policy": placement.policy,
        "placed": len(placement.slots),
        "unplaced": len(placement.unplaced),
        "gpus_used": len(gpus),
        "gpus_opened": len(opened),
        "nodes_used": len(nodes),
        "nodes_opened": sum(1 for n in nodes if not topology.node(n).busy),
        "bound_l1": b.l1,
        "bound_l2": b.l2,
        "bound_nodes": b.nodes,
        "bound_memory_l2": b.memory_l2,
        "bound_vector": b.vector,
        "bound_best": b.best,
        "gpus_over_bound": len(gpus) / b.l2 if b.l2 else 1.0,
        "gap_to_bound": len(gpus) / b.best - 1 if b.best else 0.0,
        "nodes_over_bound": len(nodes) / b.nodes if b.nodes else 1.0,
        "free_gpus": sum(1 for n in after.nodes for s, m in n.used if s == 0 and m == 0),
        "free_nodes": sum(1 for n in after.nodes if not n.busy),
        "fragmentation": fragmentation(after, task_mix(demands)),
    }
