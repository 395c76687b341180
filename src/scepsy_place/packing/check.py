"""Every placement invariant of DESIGN.md as a check that lists what is broken.

:func:`violations` returns one line per broken rule (empty: the placement is valid):

1. capacity: per GPU, pre-existing use + Σ shares ≤ 1 (in thousandths of a GPU, counted by
   :func:`scepsy_common.units.share_units` like everywhere else) and Σ memory ≤ device memory;
   GPU indices inside the node;
2. locality: a TP group's GPUs are distinct, ``tp`` of them, inside one NVLink domain, with one
   share (a :class:`~scepsy_place.packing.replicas.Slot` carries one share for all its GPUs);
3. exactly once: every demand placed once or listed unplaced with a reason, nothing else;
4. realisable: concrete node names and integer GPU indices; the node's GPU type is the demand's;
   the slot's share and memory are the demand's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scepsy_common.units import UNITS, share_units
from scepsy_place.packing.placement import Placement
from scepsy_place.packing.replicas import Demand, Slot
from scepsy_place.packing.topology import MEMORY_TOL_GIB, Topology


def violations(topology: Topology, demands: Sequence[Demand], placement: Placement) -> list[str]:
    """What ``placement`` of ``demands`` on ``topology`` (with its existing use) breaks."""
    out: list[str] = []
    want = {d.key: d for d in demands}
    if len(want) != len(demands):
        dup = [k for k, c in Counter(d.key for d in demands).items() if c > 1]
        out.append(f"demands repeat a replica: {sorted(dup)[0]}")
    keys = Counter([s.key for s in placement.slots] + [(m, r) for m, r, _ in placement.unplaced])
    for k, c in sorted(keys.items()):
        if c > 1:
            out.append(f"{k[0]}[{k[1]}] placed or listed {c} times")
        if k not in want:
            out.append(f"{k[0]}[{k[1]}] is no demand")
    for k in sorted(set(want) - set(keys)):
        out.append(f"{k[0]}[{k[1]}] neither placed nor listed unplaced")
    for m, r, why in placement.unplaced:
        if not (isinstance(why, str) and why.strip()):
            out.append(f"{m}[{r}] unplaced without a reason")
    for s in placement.slots:
        who = f"{s.llm}[{s.replica}]"
        if not (isinstance(s.node, str) and topology.has_node(s.node)):
            out.append(f"{who}: node {s.node!r} is not in the topology")
            continue
        n = topology.node(s.node)
        d = want.get(s.key)
        if not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < n.gpus
                   for g in s.gpus):
            out.append(f"{who}: GPU indices {s.gpus} not all in 0..{n.gpus - 1} on {n.name}")
            continue
        if len(set(s.gpus)) != len(s.gpus):
            out.append(f"{who}: GPUs {s.gpus} repeat")
        if len({n.domain(g) for g in s.gpus}) > 1:
            out.append(f"{who}: GPUs {s.gpus} span NVLink domains of {n.nvlink_domain} on {n.name}")
        if not s.gpus:
            out.append(f"{who}: no GPUs")
        if d is not None:
            if n.gpu != d.gpu:
                out.append(f"{who}: on {n.gpu} node {n.name}, demand is {d.gpu}")
            if len(s.gpus) != d.tp:
                out.append(f"{who}: {len(s.gpus)} GPUs for tp {d.tp}")
            if share_units(s.share) != d.units:
                out.append(f"{who}: share {s.share} for a demand of {d.share}")
            if s.memory_gib < d.memory_gib - MEMORY_TOL_GIB:
                out.append(f"{who}: {s.memory_gib} GiB per GPU for a demand of {d.memory_gib}")
    out.extend(f"{o.node} GPU {o.gpu}: {o.problem}" for o in overloads(topology, placement.slots))
    return out


@dataclass(frozen=True)
class Overload:
    """A GPU that rule 1 (capacity) finds over-committed: its node and index, what is over
    (``shares sum to 1.1 > 1``, ``memory 88 GiB > 80 GiB``) and the replicas on it."""

    node: str
    gpu: int
    problem: str
    replicas: tuple[str, ...]


def overloads(topology: Topology, slots: Iterable[Slot]) -> list[Overload]:
    """Rule 1 (capacity) per GPU, the one check of it: every GPU whose pre-existing use plus
    the shares of the slots on it sums above 1 (in thousandths, :func:`share_units`) or whose
    memory exceeds the device's (beyond ``MEMORY_TOL_GIB``), shares first, GPUs in order.
    Slots on a node the topology lacks or on GPU indices outside their node are left out
    (:func:`violations` reports those)."""
    load: dict[tuple[str, int], tuple[int, float, list[str]]] = {}
    for s in slots:
        if not (isinstance(s.node, str) and topology.has_node(s.node)):
            continue
        n = topology.node(s.node)
        if not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < n.gpus
                   for g in s.gpus):
            continue
        for g in s.gpus:
            units, mem, who = load.get((n.name, g), (0, 0.0, []))
            load[(n.name, g)] = (units + s.units, mem + s.memory_gib,
                                 [*who, f"{s.llm}[{s.replica}]"])
    out: list[Overload] = []
    for (name, g), (units, mem, who) in sorted(load.items()):
        n = topology.node(name)
        total = units + share_units(n.used[g][0])
        if total > UNITS:
            out.append(Overload(name, g, f"shares sum to {total / UNITS:g} > 1", tuple(who)))
        if mem + n.used[g][1] > n.memory_gib + MEMORY_TOL_GIB:
            out.append(Overload(name, g, f"memory {mem + n.used[g][1]:g} GiB > "
                                f"{n.memory_gib:g} GiB", tuple(who)))
    return out
