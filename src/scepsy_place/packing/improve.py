"""An improvement phase for a placement: local search that frees GPUs.

A greedy placer decides each replica once; :func:`improve` revisits its choices. It moves
replicas (a TP group moves as a whole, to ``tp`` GPUs of one NVLink domain) between the GPUs the
placement already uses, and accepts a move when it

* frees a GPU (the placement uses fewer GPUs), or
* frees none and raises the fill potential ``Φ = Σ_GPUs (compute load)² + (memory load)²``
  (loads as fractions of the GPU, existing use included): a move onto fuller GPUs concentrates
  the load, so a later move can empty a GPU (classic bin-packing local search).

Moves, repeated until none is accepted (or ``max_moves`` / the deadline):

* **relocate** a replica or TP group to the best position among the used GPUs of its type
  (largest Φ gain; ties: canonical node order);
* **empty a GPU**: take every replica off one used GPU (least loaded first) and put each
  elsewhere on the other used GPUs; kept only when all of them fit (one GPU fewer);
* **place the unplaced**: a replica listed unplaced goes onto used GPUs where it fits.

Targets are GPUs the placement already uses, so no move opens a GPU or a node: GPUs used,
newly opened GPUs, nodes used and unplaced replicas never increase; Φ strictly increases on
every move that frees no GPU, so the search ends. Capacity (compute and memory per GPU, the
topology's existing use included) and locality (``tp`` distinct GPUs of one NVLink domain)
hold for every move, and a final check recounts every GPU: should anything be off, the input
placement is returned unchanged. Deterministic: slots, GPUs and domains are visited in fixed
orders (canonical node order; replicas by fill, content and position, names last, so renaming
only swaps interchangeable replicas); ``deadline`` (optional) only cuts the search short.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from scepsy_common.errors import InputError
from scepsy_common.units import UNITS, share_units
from scepsy_opt.planning.problem import Deadline
from scepsy_place.packing.exact import place_exactly
from scepsy_place.packing.replicas import Demand, Key, Slot
from scepsy_place.packing.topology import MEMORY_TOL_GIB, Node, Topology

if TYPE_CHECKING:
    from scepsy_place.packing.placement import Placement

REPACK_TIME_S = 0.5  # time limit of one exact repacking MILP
MAX_MOVES = 20_000  # accepted moves before the search stops (a deterministic work bound)
_EPS = 1e-12

Pos = tuple[str, tuple[int, ...]]  # node, GPU indices


class _Type:
    """Numpy mirrors of one GPU type's GPUs (canonical node order) for fast position search."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.index: dict[tuple[str, int], int] = {}
        for n in nodes:
            for g in range(n.gpus):
                self.index[(n.name, g)] = len(self.index)
        self.gpus = list(self.index)  # (node, GPU) per flat index
        self.free = np.array([n.free_units(g) for n in nodes for g in range(n.gpus)], np.int64)
        self.mem = np.array([n.free_memory(g) for n in nodes for g in range(n.gpus)], float)
        self.cap = np.array([n.memory_gib for n in nodes for _ in range(n.gpus)], float)
        self.count = np.zeros(len(self.index), np.int64)
        # per domain size: (rows of flat GPU indices, (node, first GPU) per row), canonical order
        rows: dict[int, tuple[list[list[int]], list[tuple[str, int]]]] = {}
        for n in nodes:
            for dom in n.domains():
                r = rows.setdefault(len(dom), ([], []))
                r[0].append([self.index[(n.name, g)] for g in dom])
                r[1].append((n.name, dom[0]))
        self.rows = {k: (np.array(v[0], np.int64), v[1]) for k, v in sorted(rows.items())}
        self.rank = {(name, first): i for i, (name, first) in enumerate(
            (n.name, dom[0]) for n in nodes for dom in n.domains())}


class _Search:
    """Free capacity per GPU and where each slot is (mutable, never escapes :func:`improve`)."""

    def __init__(self, topology: Topology, slots: Sequence[Slot]) -> None:
        self.nodes = topology.canonical_nodes()
        self.node = {n.name: n for n in self.nodes}
        self.pos = {n.name: i for i, n in enumerate(self.nodes)}
        self.on: dict[tuple[str, int], dict[Key, None]] = {}  # slots per GPU (ordered set)
        self.free = {n.name: [n.free_units(i) for i in range(n.gpus)] for n in self.nodes}
        self.mem = {n.name: [n.free_memory(i) for i in range(n.gpus)] for n in self.nodes}
        self.count = {n.name: [0] * n.gpus for n in self.nodes}
        self.at: dict[Key, Slot] = {}
        by_type: dict[str, list[Node]] = {}
        for n in self.nodes:
            by_type.setdefault(n.gpu, []).append(n)
        self.types = {t: _Type(ns) for t, ns in sorted(by_type.items())}
        for s in sorted(slots, key=lambda s: s.key):
            if s.node not in self.node:
                raise InputError("placement", f"{s.llm}[{s.replica}].node",
                                 "a node of the topology", s.node)
            self.add(s)

    def _mirror(self, node: str, g: int) -> None:
        t = self.types[self.node[node].gpu]
        i = t.index[(node, g)]
        t.free[i], t.mem[i], t.count[i] = (self.free[node][g], self.mem[node][g],
                                           self.count[node][g])

    def add(self, s: Slot) -> None:
        for g in s.gpus:
            self.free[s.node][g] -= s.units
            self.mem[s.node][g] = round(self.mem[s.node][g] - s.memory_gib, 9)
            self.count[s.node][g] += 1
            self.on.setdefault((s.node, g), {})[s.key] = None
            self._mirror(s.node, g)
        self.at[s.key] = s

    def drop(self, s: Slot) -> None:
        for g in s.gpus:
            self.free[s.node][g] += s.units
            self.mem[s.node][g] = round(self.mem[s.node][g] + s.memory_gib, 9)
            self.count[s.node][g] -= 1
            del self.on[(s.node, g)][s.key]
            self._mirror(s.node, g)
        del self.at[s.key]

    def fill(self, node: str, g: int) -> float:
        """This GPU's term of the potential Φ."""
        n = self.node[node]
        c = (UNITS - self.free[node][g]) / UNITS
        m = (n.memory_gib - self.mem[node][g]) / n.memory_gib
        return c * c + m * m

    def gain(self, node: str, g: int, units: int, memory: float) -> float:
        """How much Φ grows when a slice of ``units`` and ``memory`` GiB goes onto GPU ``g``."""
        n = self.node[node]
        c = (UNITS - self.free[node][g]) / UNITS
        m = (n.memory_gib - self.mem[node][g]) / n.memory_gib
        du, dm = units / UNITS, memory / n.memory_gib
        return 2 * c * du + du * du + 2 * m * dm + dm * dm

    def best_position(self, s: Slot, gpu: str, banned: tuple[str, int] | None = None
                      ) -> tuple[float, Pos] | None:
        """The position on used GPUs (count > 0) of type ``gpu`` with the largest Φ gain for
        ``s`` (not yet added), avoiding GPU ``banned``; None when nothing fits. Ties: the
        first domain in canonical order, then the lowest GPU indices."""
        t = self.types.get(gpu)
        if t is None:
            return None
        tp, u, mem = len(s.gpus), s.units, s.memory_gib
        ok = (t.count > 0) & (t.free >= u) & (t.mem >= mem - MEMORY_TOL_GIB)
        if banned is not None and banned in t.index:
            ok[t.index[banned]] = False
        where = np.flatnonzero(ok)
        if len(where) < tp:
            return None
        c = (UNITS - t.free[where]) / UNITS
        m = (t.cap[where] - t.mem[where]) / t.cap[where]
        du, dm = u / UNITS, mem / t.cap[where]
        part = 2 * c * du + du * du + 2 * m * dm + dm * dm
        if tp == 1:  # the best single GPU; ties: the first in canonical order
            i = int(np.argmax(part))
            name, g = t.gpus[where[i]]
            return float(part[i]), (name, (g,))
        gain = np.full(len(t.free), -np.inf)
        gain[where] = part
        best: tuple[float, int, Pos] | None = None
        for size, (rows, heads) in t.rows.items():
            if size < tp:
                continue
            g = gain[rows]
            total = -np.sort(-g, axis=1)[:, :tp].sum(axis=1)
            k = int(np.argmax(total))
            val = float(total[k])
            if not np.isfinite(val):
                continue
            name, first = heads[k]
            rank = t.rank[(name, first)]
            if best is None or val > best[0] + _EPS or (val >= best[0] - _EPS and rank < best[1]):
                pick = np.argsort(-g[k], kind="stable")[:tp]
                best = (val, rank, (name, tuple(sorted(first + int(j) for j in pick))))
        return None if best is None else (best[0], best[2])


def improve(topology: Topology, demands: Sequence[Demand], placement: Placement, *,
            deadline: Deadline | None = None, max_moves: int = MAX_MOVES, repack: int = 0,
            repack_time_s: float = REPACK_TIME_S) -> Placement:
    """``placement`` (of ``demands`` on ``topology``) after local search (and up to ``repack``
    exact repackings of one or two nodes): never more GPUs used, newly opened GPUs, nodes used
    or unplaced replicas, every invariant kept (module docstring)."""
    if not placement.slots or max_moves <= 0:
        return placement
    gpu_of = {d.key: d.gpu for d in demands}
    for s in placement.slots:
        gpu_of.setdefault(s.key, topology.node(s.node).gpu if topology.has_node(s.node) else "")
    st = _Search(topology, placement.slots)
    if any(f < 0 for f in _flat(st.free)) or any(m < -MEMORY_TOL_GIB for m in _flat(st.mem)):
        return placement  # not a valid placement on this topology: nothing to improve
    moves = 0
    unplaced = list(placement.unplaced)
    want = {d.key: d for d in demands}

    def out_of_time() -> bool:
        return moves >= max_moves or (deadline is not None and deadline.remaining() <= 0)

    def place_unplaced() -> None:
        nonlocal moves
        keep = []
        for m, r, why in sorted(unplaced, key=lambda u: (
                (-want[u[:2]].size, -want[u[:2]].memory_gib) if u[:2] in want else (0, 0), u)):
            d = want.get((m, r))
            pos = None if d is None or out_of_time() else st.best_position(
                Slot(m, r, "", tuple(range(d.tp)), d.share, d.memory_gib), d.gpu)
            if d is None or pos is None:
                keep.append((m, r, why))
                continue
            st.add(Slot(m, r, pos[1][0], pos[1][1], d.share, d.memory_gib))
            moves += 1
        unplaced[:] = keep

    def relocate(s: Slot) -> bool:
        st.drop(s)
        freed = sum(1 for g in s.gpus if st.count[s.node][g] == 0)
        lost = sum(st.gain(s.node, g, s.units, s.memory_gib) for g in s.gpus)
        best = st.best_position(s, gpu_of[s.key])
        if best is not None and best[1] != (s.node, s.gpus) and (
                freed > 0 or best[0] > lost + 1e-9):
            st.add(replace(s, node=best[1][0], gpus=best[1][1]))
            return True
        st.add(s)
        return False

    def empty(node: str, g: int) -> bool:
        """Move every slot off GPU ``g`` of ``node`` onto other used GPUs, or change nothing."""
        off = sorted((st.at[k] for k in st.on.get((node, g), {})),
                     key=lambda s: (-len(s.gpus) * s.units, -s.memory_gib, s.key))
        for s in off:
            st.drop(s)
        moved: list[Slot] = []
        for s in off:
            pos = st.best_position(s, gpu_of[s.key], banned=(node, g))
            if pos is None:
                for t in moved:
                    st.drop(t)
                for t in off:
                    st.add(t)
                return False
            t = replace(s, node=pos[1][0], gpus=pos[1][1])
            st.add(t)
            moved.append(t)
        return True

    place_unplaced()
    while not out_of_time():
        changed = False
        # least filled GPUs first; ties by content and position, names last (renaming LLMs
        # only swaps interchangeable replicas)
        order = sorted(st.at.values(), key=lambda s: (
            sum(st.fill(s.node, g) for g in s.gpus) / len(s.gpus), -len(s.gpus) * s.units,
            -s.memory_gib, st.pos[s.node], s.gpus, s.key))
        for s in order:
            if out_of_time():
                break
            if s.key in st.at and st.at[s.key] == s and relocate(s):
                moves += 1
                changed = True
        gpus = sorted((st.fill(n.name, g), st.pos[n.name], g, n.name)
                      for n in st.nodes for g in range(n.gpus) if st.count[n.name][g] > 0)
        for _, _, g, node in gpus:
            if out_of_time():
                break
            # one replica on it: relocating it (above) already tried every other position
            if st.count[node][g] > 1 and empty(node, g):
                moves += 1
                changed = True
        if not changed:
            break
    if repack > 0:
        _repack(st, gpu_of, repack, repack_time_s, deadline)
    place_unplaced()
    slots = tuple(st.at.values())
    if not _capacity_ok(topology, slots) or _used(slots) > placement.gpus_used():
        return placement
    if (len(unplaced) == len(placement.unplaced)
            and sorted(slots, key=lambda s: s.key) == list(placement.slots)):
        return placement
    return replace(placement, slots=slots, unplaced=tuple(unplaced))


def _repack(st: _Search, gpu_of: dict[Key, str], calls: int, time_s: float,
            deadline: Deadline | None) -> None:
    """Exact repacking (:func:`scepsy_place.packing.exact.place_exactly`) of the replicas of one node,
    then of two nodes of one GPU type, onto the GPUs they use less one (the least loaded), while
    that is feasible; at most ``calls`` MILPs of ``time_s`` seconds each."""
    left = [calls]

    def slots_on(names: tuple[str, ...]) -> list[Slot]:
        return [s for s in st.at.values() if s.node in names]

    def attempt(names: tuple[str, ...]) -> bool:
        mine = slots_on(names)
        gpus = sorted((st.fill(x, g), st.pos[x], g, x) for x in names
                      for g in range(st.node[x].gpus) if st.count[x][g] > 0)
        if not mine or len(gpus) < 2 or left[0] <= 0:
            return False
        if deadline is not None and deadline.remaining() <= 0:
            return False
        ban = (gpus[0][3], gpus[0][2])
        keep = {(x, g) for _, _, g, x in gpus[1:]}
        for s in mine:
            st.drop(s)
        nodes = []
        for x in names:
            n = st.node[x]
            used = tuple((n.used[g][0], n.used[g][1]) if (x, g) in keep
                         else (1.0, n.memory_gib) for g in range(n.gpus))
            nodes.append(replace(n, used=used))
        ds = [Demand(s.llm, s.replica, gpu_of[s.key], len(s.gpus), s.share, s.memory_gib)
              for s in sorted(mine, key=lambda s: s.key)]
        left[0] -= 1
        limit = time_s if deadline is None else min(time_s, deadline.remaining())
        res = place_exactly(Topology("repack", tuple(nodes)), ds, time_limit_s=limit)
        new = {s.key: s for s in res.slots} if res.status == "placed" else {}
        if len(new) != len(mine) or any(g == ban for s in new.values() for g in (
                (s.node, i) for i in s.gpus)):
            for s in mine:
                st.add(s)
            return False
        for s in mine:
            st.add(replace(s, node=new[s.key].node, gpus=new[s.key].gpus))
        return True

    names = [n.name for n in st.nodes if any(st.count[n.name])]
    for x in names:
        while attempt((x,)):
            pass
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            if left[0] <= 0:
                return
            if st.node[x].gpu == st.node[y].gpu:
                while attempt((x, y)):
                    pass


def _flat(rows: dict[str, list]) -> list:
    return [x for r in rows.values() for x in r]


def _used(slots: Sequence[Slot]) -> int:
    return len({(s.node, g) for s in slots for g in s.gpus})


def _capacity_ok(topology: Topology, slots: Sequence[Slot]) -> bool:
    """Recount every GPU from scratch: compute and memory within capacity, TP groups on
    distinct GPUs of one NVLink domain."""
    load: dict[tuple[str, int], list[float]] = {}
    for s in slots:
        n = topology.node(s.node)
        if len(set(s.gpus)) != len(s.gpus) or len({n.domain(g) for g in s.gpus}) != 1:
            return False
        for g in s.gpus:
            u = load.setdefault((s.node, g), [0, 0.0])
            u[0] += s.units
            u[1] += s.memory_gib
    for (name, g), (units, mem) in load.items():
        n = topology.node(name)
        if units + share_units(n.used[g][0]) > UNITS:
            return False
        if mem + n.used[g][1] > n.memory_gib + MEMORY_TOL_GIB:
            return False
    return True
