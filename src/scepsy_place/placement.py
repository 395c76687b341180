"""Placement: every replica of an allocation on concrete nodes and GPU indices.

An :class:`~scepsy_opt.allocation.Allocation` says *how many* instances of which shape each LLM
runs; a :class:`Placement` says *where*: for every replica (a :class:`Demand`) one :class:`Slot`
naming a node and ``tp`` GPU indices inside one NVLink domain, each giving the replica ``share``
of its compute and ``memory_gib`` of its memory, or an entry in ``unplaced`` with the reason.

Placers (one protocol, registry :data:`PLACERS`, docs/placement.md):

* ``hierarchical`` (default): TP groups first, largest first, each inside one NVLink domain on
  distinct GPUs with equal shares; then fractional shares, packed onto partly used GPUs. Among
  the feasible positions it picks the best by a lexicographic score: (replica spreading, if
  asked) → fewest newly opened GPUs → no newly opened node → (closeness to the LLM's workflow
  mates, if asked) → least fragmentation added (FGD, :mod:`scepsy_place.fgd`, when present) →
  best fit (least share left on the chosen GPUs, then in the domain, then on the node). Ties go
  to the node whose state sorts first, then its name: the result does not depend on the order
  of the demands or of the nodes, and equal nodes are interchangeable.
* ``ffd``: first-fit decreasing: demands by GPU capacity (``tp × share``) descending, the first
  node (input order), domain and GPUs that fit.
* ``best-fit``: the same order; the position leaving the least free share on the chosen GPUs,
  then in the domain, then on the node.
* ``blocks``: GPU blocks, one LLM per GPU: an LLM's replicas of one shape are grouped
  ``floor(1/share)`` at a time into blocks of ``tp`` wholly free GPUs of one NVLink domain, and
  the blocks placed largest first, each in the domain with the fewest free GPUs that holds it.
  With power-of-two TP degrees every block set that passes :mod:`scepsy_place.blocks`' capacity
  rows is placed (the optimiser's placeable-by-construction formulation, docs/placement.md).

All three are deterministic: ``seed`` is accepted for randomised placers and unused here.
Incremental use: place new demands on a topology that already has use (:func:`apply` marks a
placement as used, :func:`remove` frees some replicas for scale-in or failures without moving the
others).
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from scepsy_opt.allocation import Allocation
from scepsy_opt.planning import UNITS, replicas_per_gpu
from scepsy_place.topology import MEMORY_TOL_GIB, Node, Topology, _clean, to_units
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.errors import InputError

Key = tuple[str, int]


class _Replica:
    """What a replica's demand and its slot share: the (llm, replica) key and the share."""

    __slots__ = ()
    llm: str
    replica: int
    share: float

    @property
    def key(self) -> Key:
        return (self.llm, self.replica)

    @property
    def units(self) -> int:
        """Share per GPU in thousandths."""
        return to_units(self.share)


@dataclass(frozen=True, slots=True)
class Demand(_Replica):
    """One replica to place: ``tp`` GPUs of type ``gpu``, ``share`` and ``memory_gib`` of each."""

    llm: str
    replica: int
    gpu: str
    tp: int
    share: float
    memory_gib: float

    def __post_init__(self) -> None:
        src = f"demand {self.llm}[{self.replica}]"
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise InputError(src, "tp", "an integer >= 1", self.tp)
        if not 0 < self.share <= 1:
            raise InputError(src, "share", "a GPU share in (0, 1]", self.share)
        if not self.memory_gib >= 0:
            raise InputError(src, "memory_gib", "memory >= 0 GiB", self.memory_gib)


    @property
    def size(self) -> int:
        """GPU capacity in thousandths: ``tp × units``."""
        return self.tp * self.units

    @property
    def whole(self) -> bool:
        return self.units == UNITS


@dataclass(frozen=True, slots=True)
class Slot(_Replica):
    """Where one replica runs: ``gpus`` (indices on ``node``), each giving ``share`` and
    ``memory_gib``."""

    llm: str
    replica: int
    node: str
    gpus: tuple[int, ...]
    share: float
    memory_gib: float



@dataclass(frozen=True)
class Placement:
    """Slots of the placed replicas and ``(llm, replica, reason)`` of those that did not fit."""

    slots: tuple[Slot, ...]
    unplaced: tuple[tuple[str, int, str], ...] = ()
    policy: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", tuple(sorted(self.slots, key=lambda s: s.key)))
        object.__setattr__(self, "unplaced", tuple(sorted(self.unplaced)))

    @property
    def complete(self) -> bool:
        return not self.unplaced

    def replicas(self) -> set[Key]:
        return {s.key for s in self.slots}

    def slot(self, llm: str, replica: int) -> Slot:
        for s in self.slots:
            if s.key == (llm, replica):
                return s
        raise InputError("placement", f"{llm}[{replica}]", "a placed replica")

    def gpus(self) -> set[tuple[str, int]]:
        """(node, GPU index) of every GPU a slot uses."""
        return {(s.node, g) for s in self.slots for g in s.gpus}

    def gpus_used(self) -> int:
        return len(self.gpus())

    def nodes(self) -> set[str]:
        return {s.node for s in self.slots}

    def nodes_used(self) -> int:
        return len(self.nodes())

    def per_node(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """Node -> sorted multiset of its slots' (tp, share in thousandths)."""
        out: dict[str, list[tuple[int, int]]] = {}
        for s in self.slots:
            out.setdefault(s.node, []).append((len(s.gpus), s.units))
        return {n: tuple(sorted(v)) for n, v in sorted(out.items())}

    def per_gpu(self) -> dict[tuple[str, int], int]:
        """(node, GPU) -> share placed on it, in thousandths."""
        out: dict[tuple[str, int], int] = {}
        for s in self.slots:
            for g in s.gpus:
                out[(s.node, g)] = out.get((s.node, g), 0) + s.units
        return dict(sorted(out.items()))

    def signature(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Sorted per-node multisets: compares placements without node or LLM names."""
        return tuple(sorted(self.per_node().values()))

    def without(self, keys: Iterable[Key | str]) -> Placement:
        """This placement less the given replicas (``(llm, replica)``, or an LLM name for all
        of its replicas)."""
        drop = _resolve(self, keys)
        return Placement(tuple(s for s in self.slots if s.key not in drop),
                         tuple(u for u in self.unplaced if (u[0], u[1]) not in drop), self.policy)

    def merge(self, other: Placement) -> Placement:
        """Both placements' slots (e.g. the running ones and a scale-out placed on top)."""
        clash = self.replicas() & other.replicas()
        if clash:
            raise InputError("placement", "slots", "disjoint replicas", sorted(clash)[0])
        placed = self.replicas() | other.replicas()
        unplaced = tuple(u for u in self.unplaced + other.unplaced if (u[0], u[1]) not in placed)
        return Placement(self.slots + other.slots, unplaced, other.policy or self.policy)

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy,
                "slots": [{"llm": s.llm, "replica": s.replica, "node": s.node,
                           "gpus": list(s.gpus), "share": s.share, "memory_gib": s.memory_gib}
                          for s in self.slots],
                "unplaced": [{"llm": m, "replica": r, "reason": why}
                             for m, r, why in self.unplaced]}


def _resolve(placement: Placement, keys: Iterable[Key | str]) -> set[Key]:
    have = placement.replicas() | {(m, r) for m, r, _ in placement.unplaced}
    out: set[Key] = set()
    for k in keys:
        if isinstance(k, str):
            mine = {x for x in have if x[0] == k}
            if not mine:
                raise InputError("placement", "llm", "an LLM of the placement", k)
            out |= mine
        else:
            key = (k[0], k[1])
            if key not in have:
                raise InputError("placement", "replica", "an (llm, replica) of the placement", key)
            out.add(key)
    return out


def demands(allocation: Allocation, catalog: Catalog | None = None, *,
            first_replica: Mapping[str, int] | None = None) -> list[Demand]:
    """One :class:`Demand` per replica of ``allocation``, sorted by (llm, replica).

    Memory per GPU is ``share × device memory`` (an MPS instance gets that share of memory).
    ``first_replica`` numbers an LLM's replicas from there (for a scale-out placed next to
    running replicas ``0..k-1``, pass ``{llm: k}``).
    """
    cat = catalog or default_catalog()
    start = first_replica or {}
    out = []
    for llm, inst in sorted(allocation.llms.items()):
        spec = cat.gpu(inst.gpu)
        for r in range(inst.replicas):
            out.append(Demand(llm, start.get(llm, 0) + r, spec.name, inst.tp, inst.share,
                              _clean(inst.share * spec.memory_gib)))
    return out


# --------------------------------------------------------------------------- use bookkeeping


def apply(topology: Topology, placement: Placement) -> Topology:
    """``topology`` with the placement's slots marked as used."""
    return _shift(topology, placement.slots, +1)


def remove(topology: Topology, placement: Placement, llm_replicas: Iterable[Key | str]) -> Topology:
    """``topology`` (on which ``placement`` was applied) with the given replicas' slots freed;
    the other replicas stay where they are. Items: ``(llm, replica)`` or an LLM name (all of its
    replicas)."""
    drop = _resolve(placement, llm_replicas)
    return _shift(topology, [s for s in placement.slots if s.key in drop], -1)


def _shift(topology: Topology, slots: Iterable[Slot], sign: int) -> Topology:
    used = {n.name: [list(u) for u in n.used] for n in topology.nodes}
    for s in slots:
        if s.node not in used:
            raise InputError("placement", f"{s.llm}[{s.replica}].node", "a node of the topology",
                             s.node)
        n = topology.node(s.node)
        for g in s.gpus:
            if not (isinstance(g, int) and 0 <= g < n.gpus):
                raise InputError("placement", f"{s.llm}[{s.replica}].gpus",
                                 f"GPU indices in 0..{n.gpus - 1}", g)
            u = used[s.node][g]
            u[0] = _clean(u[0] + sign * s.units / UNITS)
            u[1] = _clean(u[1] + sign * s.memory_gib)
            if u[0] < 0 or u[1] < -MEMORY_TOL_GIB:
                raise InputError("placement", f"{s.llm}[{s.replica}]",
                                 "a replica that is applied on the topology (nothing to free)")
            if to_units(u[0]) > UNITS or u[1] > n.memory_gib + MEMORY_TOL_GIB:
                raise InputError("placement", f"{s.llm}[{s.replica}]",
                                 f"capacity left on {s.node} GPU {g}")
    return topology.with_nodes(replace(n, used=tuple((s, max(m, 0.0)) for s, m in used[n.name]))
                               for n in topology.nodes)


# --------------------------------------------------------------------------- placers


class Placer(Protocol):
    """Anything that places demands on a topology (respecting the use already there)."""

    name: str

    def place(self, topology: Topology, demands: Sequence[Demand], *, seed: int = 0) -> Placement:
        ...


class _State:
    """Mutable free capacity while a placer runs (never escapes it)."""

    def __init__(self, topology: Topology) -> None:
        self.nodes = topology.nodes
        self.free = {n.name: [n.free_units(i) for i in range(n.gpus)] for n in self.nodes}
        self.mem = {n.name: [n.free_memory(i) for i in range(n.gpus)] for n in self.nodes}
        self.fresh = {n.name: [n.used[i] == (0.0, 0.0) for i in range(n.gpus)] for n in self.nodes}
        self.llms: dict[str, Counter[str]] = {n.name: Counter() for n in self.nodes}
        self.rack_llms: dict[str, Counter[str]] = {n.rack: Counter() for n in self.nodes}

    def fits(self, node: str, g: int, d: Demand) -> bool:
        return self.free[node][g] >= d.units and self.mem[node][g] >= d.memory_gib - MEMORY_TOL_GIB

    def take(self, node: Node, gpus: tuple[int, ...], d: Demand) -> Slot:
        for g in gpus:
            self.free[node.name][g] -= d.units
            self.mem[node.name][g] -= d.memory_gib
            self.fresh[node.name][g] = False
        self.llms[node.name][d.llm] += 1
        self.rack_llms[node.rack][d.llm] += 1
        return Slot(d.llm, d.replica, node.name, gpus, d.share, d.memory_gib)

    def node_fresh(self, node: str) -> bool:
        return all(self.fresh[node])

    def state_key(self, node: str) -> tuple[Any, ...]:
        return (tuple(self.free[node]), tuple(round(m, 6) for m in self.mem[node]))


def _choose_gpus(st: _State, node: Node, dom: range, d: Demand, rule: str) -> tuple[int, ...] | None:
    """``d.tp`` GPUs of one domain that fit ``d``: lowest indices (``first``) or tightest fit
    (``best``), or None."""
    u, need = d.units, d.memory_gib - MEMORY_TOL_GIB
    free, mem = st.free[node.name], st.mem[node.name]
    ok = [g for g in dom if free[g] >= u and mem[g] >= need]
    if len(ok) < d.tp:
        return None
    if rule == "best":
        ok.sort(key=lambda g: (st.free[node.name][g], st.mem[node.name][g], g))
    return tuple(sorted(ok[:d.tp]))


def _reason(topology: Topology, st: _State, d: Demand) -> str:
    mine = [n for n in topology.nodes if n.gpu == d.gpu]
    if not mine:
        return f"no node has {d.gpu} GPUs"
    top = max(n.nvlink_domain for n in mine)
    if d.tp > top:
        return f"tp {d.tp} exceeds the largest NVLink domain of {d.gpu} nodes ({top} GPUs)"
    if d.memory_gib > max(n.memory_gib for n in mine) + MEMORY_TOL_GIB:
        return f"needs {d.memory_gib:g} GiB per GPU, more than a {d.gpu} has"
    free = sum(sum(st.free[n.name]) for n in mine) / UNITS
    u, need = d.units, d.memory_gib - MEMORY_TOL_GIB
    fitting = sum(1 for n in mine for f, m in zip(st.free[n.name], st.mem[n.name], strict=True)
                  if f >= u and m >= need)
    return (f"no NVLink domain of {d.gpu} nodes has {d.tp} GPU(s) with {d.share:g} share and "
            f"{d.memory_gib:g} GiB free ({free:g} GPUs of capacity free in total, {fitting} "
            f"single GPUs fit the share: capacity is fragmented)" if free >= d.tp * d.share
            else f"not enough free {d.gpu} capacity ({free:g} GPUs free, "
                 f"{d.tp * d.share:g} needed)")


def _check_demands(ds: Sequence[Demand]) -> None:
    seen: set[Key] = set()
    for d in ds:
        if not isinstance(d, Demand):
            raise InputError("placement", "demands", "Demand records", type(d).__name__)
        if d.key in seen:
            raise InputError("placement", "demands", "each (llm, replica) once", d.key)
        seen.add(d.key)


def _greedy(topology: Topology, ds: Sequence[Demand], order: Callable[[Demand], Any],
            pick: Callable[[_State, Demand, list[tuple[Node, tuple[int, ...]]]], int], rule: str,
            policy: str, placed: Sequence[Slot] = (), by_llm: bool = False) -> Placement:
    """Place ``ds`` one by one in ``order``, each at the candidate position ``pick`` chooses.

    Nodes in the same state (shape, free share and memory per GPU; with ``by_llm`` also rack
    and the LLMs they hold) are interchangeable: only the first of each, in input order, is a
    candidate. Every placer breaks ties towards input order, so this changes no answer and keeps
    a 512-node cluster with mostly empty nodes cheap.
    """
    _check_demands(ds)
    st = _State(topology)
    for s in placed:  # slots already on the topology: only for spreading / colocating counts
        if topology.has_node(s.node):
            n = topology.node(s.node)
            st.llms[n.name][s.llm] += 1
            st.rack_llms[n.rack][s.llm] += 1
    slots: list[Slot] = []
    unplaced: list[tuple[str, int, str]] = []
    for d in sorted(ds, key=order):
        cands: list[tuple[Node, tuple[int, ...]]] = []
        seen: set[tuple[Any, ...]] = set()
        for n in topology.nodes:
            if n.gpu != d.gpu or d.tp > n.nvlink_domain:
                continue
            key = (n.gpus, n.nvlink_domain, n.memory_gib, tuple(st.free[n.name]),
                   tuple(st.mem[n.name]), tuple(st.fresh[n.name]))
            if by_llm:
                key += (n.rack, tuple(sorted(st.llms[n.name].items())))
            if key in seen:
                continue
            seen.add(key)
            for dom in n.domains():
                gs = _choose_gpus(st, n, dom, d, rule)
                if gs is not None:
                    cands.append((n, gs))
        if not cands:
            unplaced.append((d.llm, d.replica, _reason(topology, st, d)))
            continue
        n, gs = cands[pick(st, d, cands)]
        slots.append(st.take(n, gs, d))
    return Placement(tuple(slots), tuple(unplaced), policy)


def _decreasing(d: Demand) -> tuple[Any, ...]:
    return (-d.size, -d.tp, -d.memory_gib, d.llm, d.replica)


def _residual(st: _State, d: Demand, n: Node, gs: tuple[int, ...]) -> tuple[int, int, int]:
    """(share left on the chosen GPUs, in their domain, on the node) after placing ``d``."""
    on = sum(st.free[n.name][g] for g in gs) - d.size
    dom = range(n.domain(gs[0]) * n.nvlink_domain, (n.domain(gs[0]) + 1) * n.nvlink_domain)
    return (on, sum(st.free[n.name][g] for g in dom) - d.size, sum(st.free[n.name]) - d.size)


@dataclass(frozen=True)
class FirstFitDecreasing:
    """Demands by GPU capacity descending; the first node (input order) and domain that fit."""

    name: str = "ffd"

    def place(self, topology: Topology, demands: Sequence[Demand], *, seed: int = 0,
              placed: Sequence[Slot] = ()) -> Placement:
        return _greedy(topology, demands, _decreasing, lambda st, d, c: 0, "first", self.name,
                       placed)


@dataclass(frozen=True)
class BestFit:
    """Demands by GPU capacity descending; the position leaving the least free share."""

    name: str = "best-fit"

    def place(self, topology: Topology, demands: Sequence[Demand], *, seed: int = 0,
              placed: Sequence[Slot] = ()) -> Placement:
        def pick(st: _State, d: Demand, cands: list[tuple[Node, tuple[int, ...]]]) -> int:
            return min(range(len(cands)), key=lambda i: (_residual(st, d, *cands[i]), i))
        return _greedy(topology, demands, _decreasing, pick, "best", self.name, placed)


def _fgd() -> Callable[..., float] | None:
    try:
        mod = importlib.import_module("scepsy_place.fgd")
    except ImportError:
        return None
    return getattr(mod, "node_fragmentation", None)


def task_mix(ds: Sequence[Demand]) -> tuple[tuple[int, int, float], ...]:
    """The demands' instance mix for FGD: (GPUs, share per GPU in thousandths, probability)."""
    c = Counter((d.tp, d.units) for d in ds)
    total = sum(c.values())
    return tuple((tp, u, k / total) for (tp, u), k in sorted(c.items()))


@dataclass(frozen=True)
class Hierarchical:
    """The paper's placer with a fragmentation-aware score (see the module docstring).

    ``spread_replicas``: put an LLM's replicas on different nodes, then racks, when possible (it
    ranks before GPU consolidation). ``colocate``: groups of LLM names (e.g. one per workflow)
    kept close: a node, then a rack, already holding group mates is preferred. ``mix``: the task
    mix FGD scores against (default: the demands' own mix). ``fragmentation``: use FGD when
    :mod:`scepsy_place.fgd` is importable (best fit otherwise). ``orders``: how many demand
    orders to try (TP groups first; GPU capacity descending; share descending): the placement
    with fewest unplaced replicas, then fewest newly opened GPUs, GPUs and nodes wins; the search
    stops at the first complete placement that meets the L2 bound.
    """

    spread_replicas: bool = False
    colocate: tuple[tuple[str, ...], ...] = ()
    mix: tuple[tuple[int, int, float], ...] | None = None
    fragmentation: bool = True
    orders: int = 3
    name: str = "hierarchical"

    def place(self, topology: Topology, demands: Sequence[Demand], *, seed: int = 0,
              placed: Sequence[Slot] = ()) -> Placement:
        frag = _fgd() if self.fragmentation else None
        mix = self.mix if self.mix is not None else task_mix(demands)
        mates: dict[str, set[str]] = {}
        for group in self.colocate:
            for m in group:
                mates.setdefault(m, set()).update(x for x in group if x != m)
        cache: dict[tuple[str, tuple[int, ...]], float] = {}

        def fragment(free: Sequence[int], name: str) -> float:
            key = (name, tuple(free))
            if key not in cache:
                cache[key] = float(frag(list(free), list(mix))) if frag and mix else 0.0
            return cache[key]

        def score(st: _State, d: Demand, n: Node, gs: tuple[int, ...]) -> tuple[Any, ...]:
            spread = ((st.llms[n.name][d.llm], st.rack_llms[n.rack][d.llm])
                      if self.spread_replicas else (0, 0))
            new_gpus = sum(1 for g in gs if st.fresh[n.name][g])
            new_node = int(st.node_fresh(n.name))
            near = mates.get(d.llm, set())
            close = ((-sum(st.llms[n.name][m] for m in near),
                      -sum(st.rack_llms[n.rack][m] for m in near)) if near else (0, 0))
            delta = 0.0
            if frag is not None:
                before = st.free[n.name]
                after = [f - d.units if g in gs else f for g, f in enumerate(before)]
                delta = round(fragment(after, n.name) - fragment(before, n.name), 9)
            return (spread, new_gpus, new_node, close, delta, _residual(st, d, n, gs),
                    st.state_key(n.name), gs, n.name)

        def pick(st: _State, d: Demand, cands: list[tuple[Node, tuple[int, ...]]]) -> int:
            return min(range(len(cands)), key=lambda i: score(st, d, *cands[i]))

        best: tuple[Any, ...] | None = None
        for i, order in enumerate(_ORDERS[:self.orders]):
            pl = _greedy(topology, demands, order, pick, "best", self.name, placed,
                         by_llm=self.spread_replicas or bool(self.colocate))
            opened = sum(1 for n, g in pl.gpus() if topology.node(n).used[g] == (0.0, 0.0))
            nodes = sum(1 for n in pl.nodes() if not topology.node(n).busy)
            key = (len(pl.unplaced), opened, len(pl.gpus()), nodes, i)
            if best is None or key < best[0]:
                best = (key, pl)
            if not pl.unplaced and len(pl.gpus()) <= _l2(demands):
                break  # provably fewest GPUs: the other orders cannot do better
        assert best is not None
        return best[1]


def _l2(ds: Sequence[Demand]) -> int:
    from scepsy_place.bounds import bound

    return bound(ds).l2


_ORDERS: tuple[Callable[[Demand], Any], ...] = (
    # TP groups (whole GPUs first), largest first; then fractional shares, largest first
    lambda d: (0 if d.whole else 1, -d.tp, -d.units, -d.memory_gib, d.llm, d.replica),
    # GPU capacity (tp × share) descending
    _decreasing,
    # share per GPU descending, then TP
    lambda d: (-d.units, -d.tp, -d.memory_gib, d.llm, d.replica),
)


def whole_free_gpus(topology: Topology, gpu: str) -> list[tuple[Node, range, list[int]]]:
    """Per NVLink domain of the ``gpu`` nodes (input order): its wholly free GPUs (no share and
    no memory in use)."""
    out = []
    for n in topology.nodes:
        if n.gpu != gpu:
            continue
        for dom in n.domains():
            out.append((n, dom, [g for g in dom if n.used[g] == (0.0, 0.0)]))
    return out


@dataclass(frozen=True)
class Blocks:
    """GPU blocks, one LLM shape per GPU (see the module docstring).

    Demands of one (llm, gpu, tp, share, memory) are taken in replica order, ``floor(1/share)``
    per block; blocks go largest ``tp`` first (then by LLM and first replica) to the NVLink
    domain with the fewest wholly free GPUs that holds them (ties: input order), on its lowest
    free indices. Partly used GPUs are never touched.
    """

    name: str = "blocks"

    def place(self, topology: Topology, demands: Sequence[Demand], *, seed: int = 0,
              placed: Sequence[Slot] = ()) -> Placement:
        _check_demands(demands)
        groups: dict[tuple[str, str, int, int, float], list[Demand]] = {}
        for d in sorted(demands, key=lambda d: d.key):
            groups.setdefault((d.llm, d.gpu, d.tp, d.units, d.memory_gib), []).append(d)
        blocks: list[list[Demand]] = []
        for ds in groups.values():
            k = replicas_per_gpu(ds[0].share)
            blocks.extend(ds[i:i + k] for i in range(0, len(ds), k))
        blocks.sort(key=lambda b: (-b[0].tp, b[0].gpu, b[0].llm, b[0].replica))
        free = {gpu: whole_free_gpus(topology, gpu) for gpu in {b[0].gpu for b in blocks}}
        slots: list[Slot] = []
        unplaced: list[tuple[str, int, str]] = []
        for ds in blocks:
            tp, gpu = ds[0].tp, ds[0].gpu
            need = len(ds) * ds[0].memory_gib - MEMORY_TOL_GIB  # per GPU of the block
            fits = [(len(gs), i) for i, (n, _, gs) in enumerate(free[gpu])
                    if len(gs) >= tp and n.memory_gib >= need]
            if not fits:
                why = (f"no NVLink domain of the {gpu} nodes has {tp} wholly free GPU(s) left "
                       "for a block")
                unplaced.extend((d.llm, d.replica, why) for d in ds)
                continue
            i = min(fits)[1]  # the fewest free GPUs that hold it, then input order
            node, dom, gs = free[gpu][i]
            free[gpu][i] = (node, dom, gs[tp:])
            slots.extend(Slot(d.llm, d.replica, node.name, tuple(gs[:tp]), d.share, d.memory_gib)
                         for d in ds)
        return Placement(tuple(slots), tuple(unplaced), self.name)


PLACERS: dict[str, Callable[..., Placer]] = {
    "hierarchical": Hierarchical,
    "ffd": FirstFitDecreasing,
    "best-fit": BestFit,
    "blocks": Blocks,
}


def placer(name: str, **options: Any) -> Placer:
    """The registered placer ``name`` built with ``options`` (e.g. ``spread_replicas=True``)."""
    if name not in PLACERS:
        raise InputError("placement", "policy", f"one of {', '.join(sorted(PLACERS))}", name)
    try:
        return PLACERS[name](**options)
    except TypeError:
        raise InputError("placement", "options", f"options that the {name} placer takes",
                         sorted(options)) from None


def place(topology: Topology, demands: Sequence[Demand], policy: str = "hierarchical", *,
          seed: int = 0, **options: Any) -> Placement:
    """Place ``demands`` on ``topology`` (respecting its use) with the placer ``policy``."""
    return placer(policy, **options).place(topology, demands, seed=seed)


def place_allocation(topology: Topology, allocation: Allocation, policy: str = "hierarchical",
                     *, catalog: Catalog | None = None, seed: int = 0, **options: Any) -> Placement:
    """:func:`place` for every replica of ``allocation``."""
    return place(topology, demands(allocation, catalog), policy, seed=seed, **options)
