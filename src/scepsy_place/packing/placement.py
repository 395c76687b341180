"""Placement: every replica of an allocation on concrete nodes and GPU indices.

An :class:`~scepsy_opt.allocation.Allocation` says *how many* instances of which shape each LLM
runs; a :class:`Placement` says *where*: for every replica (a :class:`Demand`) one :class:`Slot`
naming a node and ``tp`` GPU indices inside one NVLink domain, each giving the replica ``share``
of its compute and ``memory_gib`` of its memory, or an entry in ``unplaced`` with the reason.

Placers (one protocol, registry :data:`PLACERS`, docs/placement.md):

* ``hierarchical`` (default): TP groups by degree, largest first (whole GPUs before fractional
  shares of one degree), each inside one NVLink domain on distinct GPUs with equal shares,
  fractional shares packed onto partly used GPUs. Among the feasible positions it picks the
  best by a lexicographic score: (replica spreading, if asked) → fewest newly opened GPUs → no
  newly opened node → (closeness to the LLM's workflow mates, if asked) → least fragmentation
  added (FGD per NVLink domain, :func:`scepsy_place.packing.fgd.domain_fragmentation`, when present) →
  best fit (least share left on the chosen GPUs, then in the domain, then on the node) → the
  node whose state sorts first, then canonical order. The improvement phase
  (:mod:`scepsy_place.packing.improve`, local search that frees GPUs) then runs on its placement.
* ``ffd``: first-fit decreasing: demands by GPU capacity (``tp × share``) descending, the first
  node (canonical order), domain and GPUs that fit.
* ``best-fit``: the same order; the position leaving the least free share on the chosen GPUs,
  then in the domain, then on the node.
* ``blocks``: GPU blocks, one LLM per GPU: an LLM's replicas of one shape are grouped
  :func:`block_size` (``floor(1/share)``, fewer if memory says so) at a time into blocks of
  ``tp`` wholly free GPUs of one NVLink domain, and the blocks placed largest first, each in the
  domain with the fewest free GPUs that holds it. With power-of-two TP degrees every block set
  that passes :mod:`scepsy_place.formulations.blocks`' capacity rows is placed (the optimiser's
  placeable-by-construction formulation, docs/placement.md).

A placer whose own strategy (``place_alone``) leaves replicas unplaced tries the simpler placers
of :data:`FALLBACKS` and keeps the placement with fewest unplaced replicas (``placed_by`` names
the placer that produced it). Nodes are walked in :meth:`Topology.canonical_nodes` order and
demands tie by :func:`demand_ranks`, so no placer depends on the order of its input, and names
decide only between interchangeable nodes, racks and LLMs. Shares count in thousandths by
:func:`scepsy_common.units.share_units`.

All four are deterministic: ``seed`` is accepted for randomised placers and unused here.
Incremental use: place new demands on a topology that already has use (:func:`apply` marks a
placement as used, :func:`remove` frees some replicas for scale-in or failures without moving the
others).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Protocol

from scepsy_common.errors import InputError
from scepsy_common.registry import Registry
from scepsy_common.units import UNITS, replicas_per_gpu, share_units
from scepsy_opt.allocation import Allocation
from scepsy_place.packing.bounds import l2_bound
from scepsy_place.packing.fgd import domain_fragmentation
from scepsy_place.packing.improve import improve as improve_placement
from scepsy_place.packing.replicas import Demand, Key, Slot, task_mix
from scepsy_place.packing.topology import MEMORY_TOL_GIB, Node, Topology, _clean
from scepsy_profile.catalog import Catalog, default_catalog


@dataclass(frozen=True)
class Placement:
    """Slots of the placed replicas and ``(llm, replica, reason)`` of those that did not fit.

    ``policy``: the placer asked for; ``placed_by``: the placer whose placement this is (the
    same unless ``policy`` left replicas unplaced and a simpler placer did better, see
    :data:`FALLBACKS`; defaults to ``policy``).
    """

    slots: tuple[Slot, ...]
    unplaced: tuple[tuple[str, int, str], ...] = ()
    policy: str = ""
    placed_by: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", tuple(sorted(self.slots, key=lambda s: s.key)))
        object.__setattr__(self, "unplaced", tuple(sorted(self.unplaced)))
        if not self.placed_by:
            object.__setattr__(self, "placed_by", self.policy)

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
                         tuple(u for u in self.unplaced if (u[0], u[1]) not in drop), self.policy,
                         self.placed_by)

    def merge(self, other: Placement) -> Placement:
        """Both placements' slots (e.g. the running ones and a scale-out placed on top)."""
        clash = self.replicas() & other.replicas()
        if clash:
            raise InputError("placement", "slots", "disjoint replicas", sorted(clash)[0])
        placed = self.replicas() | other.replicas()
        unplaced = tuple(u for u in self.unplaced + other.unplaced if (u[0], u[1]) not in placed)
        return Placement(self.slots + other.slots, unplaced, other.policy or self.policy,
                         other.placed_by or self.placed_by)

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "placed_by": self.placed_by,
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

    Memory per GPU is ``memory_share × device memory`` (the instance's memory fraction, its
    compute share unless set apart: compute and memory are two resources of a GPU).
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
                              _clean(inst.memory_share * spec.memory_gib)))
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
            if share_units(u[0]) > UNITS or u[1] > n.memory_gib + MEMORY_TOL_GIB:
                raise InputError("placement", f"{s.llm}[{s.replica}]",
                                 f"capacity left on {s.node} GPU {g}")
    return topology.with_nodes(replace(n, used=tuple((s, max(m, 0.0)) for s, m in used[n.name]))
                               for n in topology.nodes)


# --------------------------------------------------------------------------- placers


class Placer(Protocol):
    """Anything that places demands on a topology (respecting the use already there)."""

    @property
    def name(self) -> str:  # read-only: the placers are frozen dataclasses
        ...

    def place(self, topology: Topology, demands: Sequence[Demand], *, seed: int = 0) -> Placement:
        ...


class _State:
    """Mutable free capacity while a placer runs (never escapes it). Nodes in canonical order
    (:meth:`Topology.canonical_nodes`); ``pos`` gives each node's position in it."""

    def __init__(self, topology: Topology) -> None:
        self.nodes = topology.canonical_nodes()
        self.pos = {n.name: i for i, n in enumerate(self.nodes)}
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


def _cannot_fit(topology: Topology, d: Demand) -> str | None:
    """Why ``d`` fits on no node of ``topology`` even with every GPU free (None: one holds it)."""
    mine = [n for n in topology.nodes if n.gpu == d.gpu]
    if not mine:
        return f"no node has {d.gpu} GPUs"
    top = max(n.nvlink_domain for n in mine)
    if d.tp > top:
        return f"tp {d.tp} exceeds the largest NVLink domain of {d.gpu} nodes ({top} GPUs)"
    most = max(n.memory_gib for n in mine if n.nvlink_domain >= d.tp)
    if d.memory_gib > most + MEMORY_TOL_GIB:
        return f"needs {d.memory_gib:g} GiB per GPU, more than a {d.gpu} has ({most:g} GiB)"
    return None


def _reason(topology: Topology, st: _State, d: Demand) -> str:
    why = _cannot_fit(topology, d)
    if why is not None:
        return why
    mine = [n for n in st.nodes if n.gpu == d.gpu]
    free = sum(sum(st.free[n.name]) for n in mine) / UNITS
    u, need = d.units, d.memory_gib - MEMORY_TOL_GIB
    fitting = sum(1 for n in mine for f, m in zip(st.free[n.name], st.mem[n.name], strict=True)
                  if f >= u and m >= need)
    return (f"no NVLink domain of {d.gpu} nodes has {d.tp} GPU(s) with {d.share:g} share and "
            f"{d.memory_gib:g} GiB free ({free:g} GPUs of capacity free in total, {fitting} "
            f"single GPUs fit the share: capacity is fragmented)" if free >= d.tp * d.units / UNITS
            else f"not enough free {d.gpu} capacity ({free:g} GPUs free, "
                 f"{d.tp * d.units / UNITS:g} needed)")


def _check_demands(ds: Sequence[Demand]) -> None:
    seen: set[Key] = set()
    for d in ds:
        if not isinstance(d, Demand):
            raise InputError("placement", "demands", "Demand records", type(d).__name__)
        if d.key in seen:
            raise InputError("placement", "demands", "each (llm, replica) once", d.key)
        seen.add(d.key)


def demand_ranks(ds: Sequence[Demand]) -> dict[Key, int]:
    """Each demand's position in the canonical demand order: by content (:attr:`Demand.content`),
    then the content of its LLM (the sorted contents of all of that LLM's demands), then LLM name
    and replica number. Placers break every tie between demands by it, so the order of the input
    never matters and names decide only between interchangeable demands."""
    per_llm: dict[str, list[tuple[Any, ...]]] = {}
    for d in ds:
        per_llm.setdefault(d.llm, []).append(d.content)
    llm_content = {m: tuple(sorted(v)) for m, v in per_llm.items()}
    order = sorted(ds, key=lambda d: (d.content, llm_content[d.llm], d.llm, d.replica))
    return {d.key: i for i, d in enumerate(order)}


def _greedy(topology: Topology, ds: Sequence[Demand], order: Callable[[Demand], Any],
            pick: Callable[[_State, Demand, list[tuple[Node, tuple[int, ...]]]], int], rule: str,
            policy: str, placed: Sequence[Slot] = (), by_llm: bool = False) -> Placement:
    """Place ``ds`` one by one in ``order`` (ties: :func:`demand_ranks`), each at the candidate
    position ``pick`` chooses among those listed in canonical node order.

    Nodes in the same state (shape, free share and memory per GPU; with ``by_llm`` also rack
    and the LLMs they hold) are interchangeable: only the first of each, in canonical order, is
    a candidate. Every placer breaks ties towards canonical order, so this changes no answer and
    keeps a 512-node cluster with mostly empty nodes cheap.
    """
    _check_demands(ds)
    st = _State(topology)
    rank = demand_ranks(ds)
    for s in placed:  # slots already on the topology: only for spreading / colocating counts
        if topology.has_node(s.node):
            n = topology.node(s.node)
            st.llms[n.name][s.llm] += 1
            st.rack_llms[n.rack][s.llm] += 1
    slots: list[Slot] = []
    unplaced: list[tuple[str, int, str]] = []
    for d in sorted(ds, key=lambda d: (order(d), rank[d.key])):
        cands: list[tuple[Node, tuple[int, ...]]] = []
        seen: set[tuple[Any, ...]] = set()
        key: tuple[Any, ...]
        for n in st.nodes:
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
    return (-d.size, -d.tp, -d.memory_gib)


def _residual(st: _State, d: Demand, n: Node, gs: tuple[int, ...]) -> tuple[int, int, int]:
    """(share left on the chosen GPUs, in their domain, on the node) after placing ``d``."""
    on = sum(st.free[n.name][g] for g in gs) - d.size
    dom = range(n.domain(gs[0]) * n.nvlink_domain, (n.domain(gs[0]) + 1) * n.nvlink_domain)
    return (on, sum(st.free[n.name][g] for g in dom) - d.size, sum(st.free[n.name]) - d.size)


def _cost(topology: Topology, pl: Placement) -> tuple[int, int, int, int]:
    """How good a placement is, smaller first: (unplaced replicas, newly opened GPUs, GPUs used,
    newly opened nodes)."""
    opened = sum(1 for n, g in pl.gpus() if topology.node(n).used[g] == (0.0, 0.0))
    nodes = sum(1 for n in pl.nodes() if not topology.node(n).busy)
    return (len(pl.unplaced), opened, pl.gpus_used(), nodes)


# The simpler placers each placer tries, in this order, when its own strategy leaves replicas
# unplaced: the placement with fewest unplaced replicas (then lowest :func:`_cost`) is kept,
# its own on ties. ``blocks`` has none: one LLM shape per wholly free GPU is its contract.
FALLBACKS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "hierarchical": ("best-fit", "ffd", "blocks"),
    "best-fit": ("ffd", "blocks"),
    "ffd": ("blocks",),
    "blocks": (),
})


class _Strategy(ABC):
    """A placer's own strategy (``place_alone``); ``place`` adds the :data:`FALLBACKS`."""

    name: str

    @abstractmethod
    def place_alone(self, topology: Topology, demands: Sequence[Demand],
                    placed: Sequence[Slot] = ()) -> Placement:
        """The placement of ``demands`` by this strategy alone."""

    def place(self, topology: Topology, demands: Sequence[Demand], *, seed: int = 0,
              placed: Sequence[Slot] = ()) -> Placement:
        """The placement (``seed`` is unused: every placer here is deterministic)."""
        return _place(self, topology, demands, placed)


def _place(strategy: _Strategy, topology: Topology, demands: Sequence[Demand],
           placed: Sequence[Slot]) -> Placement:
    """``strategy``'s placement, or, when it leaves replicas unplaced, the best of it and its
    :data:`FALLBACKS` (``policy`` names ``strategy``, ``placed_by`` the placer kept)."""
    best = strategy.place_alone(topology, demands, placed)
    if best.complete:
        return best
    key = _cost(topology, best)
    for other in FALLBACKS.get(strategy.name, ()):
        pl = _SIMPLER[other]().place_alone(topology, demands, placed)
        k = _cost(topology, pl)
        if k < key:
            best, key = pl, k
    return replace(best, policy=strategy.name)


@dataclass(frozen=True)
class FirstFitDecreasing(_Strategy):
    """Demands by GPU capacity descending; the first node (canonical order) and domain that fit."""

    name: str = "ffd"

    def place_alone(self, topology: Topology, demands: Sequence[Demand],
                    placed: Sequence[Slot] = ()) -> Placement:
        return _greedy(topology, demands, _decreasing, lambda st, d, c: 0, "first", self.name,
                       placed)


@dataclass(frozen=True)
class BestFit(_Strategy):
    """Demands by GPU capacity descending; the position leaving the least free share."""

    name: str = "best-fit"

    def place_alone(self, topology: Topology, demands: Sequence[Demand],
                    placed: Sequence[Slot] = ()) -> Placement:
        def pick(st: _State, d: Demand, cands: list[tuple[Node, tuple[int, ...]]]) -> int:
            return min(range(len(cands)), key=lambda i: (_residual(st, d, *cands[i]), i))
        return _greedy(topology, demands, _decreasing, pick, "best", self.name, placed)


@dataclass(frozen=True)
class Hierarchical(_Strategy):
    """The paper's placer with a fragmentation-aware score (see the module docstring).

    ``spread_replicas``: put an LLM's replicas on different nodes, then racks, when possible (it
    ranks before GPU consolidation). ``colocate``: groups of LLM names (e.g. one per workflow)
    kept close: a node, then a rack, already holding group mates is preferred. ``mix``: the task
    mix FGD scores against (default: the demands' own mix). ``fragmentation``: use FGD, per
    NVLink domain (:func:`scepsy_place.packing.fgd.domain_fragmentation`), when :mod:`scepsy_place.packing.fgd`
    is importable (best fit otherwise). ``orders``: how many demand orders to try (TP degree
    descending; GPU capacity descending; share descending): the placement with fewest unplaced
    replicas, then fewest newly opened GPUs, GPUs and nodes wins; the search stops at the first
    complete placement that meets the L2 bound. ``improve``: run the improvement phase
    (:func:`scepsy_place.packing.improve.improve`, local search that frees GPUs) on the chosen placement
    when it is above the L2 bound; skipped with ``spread_replicas`` or ``colocate`` (it would
    trade those preferences for GPUs); ``repack``: how many exact repacking MILPs of one or two
    nodes the improvement phase may add (0: local search only).
    """

    spread_replicas: bool = False
    colocate: tuple[tuple[str, ...], ...] = ()
    mix: tuple[tuple[int, int, float], ...] | None = None
    fragmentation: bool = True
    orders: int = 3
    improve: bool = True
    repack: int = 0
    name: str = "hierarchical"

    def place_alone(self, topology: Topology, demands: Sequence[Demand],
                    placed: Sequence[Slot] = ()) -> Placement:
        frag = domain_fragmentation if self.fragmentation else None
        mix = self.mix if self.mix is not None else task_mix(demands)
        mates: dict[str, set[str]] = {}
        for group in self.colocate:
            for m in group:
                mates.setdefault(m, set()).update(x for x in group if x != m)
        cache: dict[tuple[int, ...], float] = {}

        def fragment(free: tuple[int, ...]) -> float:
            """FGD of one NVLink domain (its GPUs' free thousandths)."""
            if free not in cache:
                cache[free] = float(frag(list(free), len(free), list(mix))) if frag and mix else 0.0
            return cache[free]

        def score(st: _State, d: Demand, n: Node, gs: tuple[int, ...]) -> tuple[Any, ...]:
            spread = ((st.llms[n.name][d.llm], st.rack_llms[n.rack][d.llm])
                      if self.spread_replicas else (0, 0))
            new_gpus = sum(1 for g in gs if st.fresh[n.name][g])
            new_node = int(st.node_fresh(n.name))
            near = mates.get(d.llm, set())
            close = ((-sum(st.llms[n.name][m] for m in near),
                      -sum(st.rack_llms[n.rack][m] for m in near)) if near else (0, 0))
            delta = 0.0
            if frag is not None:  # only the chosen domain changes: the others cancel
                k = n.domain(gs[0]) * n.nvlink_domain
                before = tuple(st.free[n.name][k:k + n.nvlink_domain])
                after = tuple(f - d.units if k + i in gs else f for i, f in enumerate(before))
                delta = round(fragment(after) - fragment(before), 9)
            return (spread, new_gpus, new_node, close, delta, _residual(st, d, n, gs),
                    st.state_key(n.name), gs, st.pos[n.name])

        def pick(st: _State, d: Demand, cands: list[tuple[Node, tuple[int, ...]]]) -> int:
            return min(range(len(cands)), key=lambda i: score(st, d, *cands[i]))

        best: tuple[Any, ...] | None = None
        l2 = _l2(demands)
        for i, order in enumerate(_ORDERS[:self.orders]):
            pl = _greedy(topology, demands, order, pick, "best", self.name, placed,
                         by_llm=self.spread_replicas or bool(self.colocate))
            key = (*_cost(topology, pl), i)
            if best is None or key < best[0]:
                best = (key, pl)
            if not pl.unplaced and len(pl.gpus()) <= l2:
                break  # provably fewest GPUs: the other orders cannot do better
        assert best is not None
        pl = best[1]
        if (self.improve and not self.spread_replicas and not self.colocate
                and (pl.unplaced or len(pl.gpus()) > l2)):
            pl = improve_placement(topology, demands, pl, repack=self.repack)
        return pl


def _l2(ds: Sequence[Demand]) -> int:
    """Σ over GPU types of the L2 bound (only it: the vector bounds cost more)."""
    per: dict[str, list[int]] = {}
    for d in ds:
        per.setdefault(d.gpu, []).extend([d.units] * d.tp)
    return sum(l2_bound(v) for _, v in sorted(per.items()))


_ORDERS: tuple[Callable[[Demand], Any], ...] = (
    # TP groups, largest TP degree first (whole GPUs before fractional shares of one degree):
    # a large group needs a domain with that many GPUs free, so it must not come after smaller
    # groups that could take them (a fractional TP-4 group after whole TP-1 groups is unplaced
    # when they fill the only 4-GPU domain)
    lambda d: (-d.tp, 0 if d.whole else 1, -d.units, -d.memory_gib),
    # GPU capacity (tp × share) descending
    _decreasing,
    # share per GPU descending, then TP
    lambda d: (-d.units, -d.tp, -d.memory_gib),
)


def whole_free_gpus(topology: Topology, gpu: str) -> list[tuple[Node, range, list[int]]]:
    """Per NVLink domain of the ``gpu`` nodes (canonical order): its wholly free GPUs (no share
    and no memory in use)."""
    out = []
    for n in topology.canonical_nodes():
        if n.gpu != gpu:
            continue
        for dom in n.domains():
            out.append((n, dom, [g for g in dom if n.used[g] == (0.0, 0.0)]))
    return out


def block_size(topology: Topology, d: Demand) -> int:
    """Replicas of ``d``'s shape in one block: :func:`~scepsy_common.units.replicas_per_gpu`,
    fewer when that many would not fit in the memory of the largest ``d.gpu`` GPU (never for
    demands of an allocation, whose memory is their share of the GPU's); 0 when ``d`` fits on no
    node at all (:func:`_cannot_fit`)."""
    if _cannot_fit(topology, d) is not None:
        return 0
    k = replicas_per_gpu(d.share)
    if d.memory_gib > 0:
        most = max(n.memory_gib for n in topology.nodes
                   if n.gpu == d.gpu and n.nvlink_domain >= d.tp)
        k = min(k, int((most + MEMORY_TOL_GIB) // d.memory_gib))
    return k


@dataclass(frozen=True)
class Blocks(_Strategy):
    """GPU blocks, one LLM shape per GPU (see the module docstring).

    Demands of one LLM and content are taken in canonical order (:func:`demand_ranks`),
    :func:`block_size` per block; blocks go largest ``tp`` first (then canonical order) to the
    NVLink domain with the fewest wholly free GPUs that holds them (ties: canonical node order),
    on its lowest free indices. Partly used GPUs are never touched.
    """

    name: str = "blocks"

    def place_alone(self, topology: Topology, demands: Sequence[Demand],
                    placed: Sequence[Slot] = ()) -> Placement:
        _check_demands(demands)
        rank = demand_ranks(demands)
        groups: dict[tuple[str, tuple[Any, ...]], list[Demand]] = {}
        for d in sorted(demands, key=lambda d: rank[d.key]):
            groups.setdefault((d.llm, d.content), []).append(d)
        blocks: list[list[Demand]] = []
        unplaced: list[tuple[str, int, str]] = []
        for ds in groups.values():
            k = block_size(topology, ds[0])
            if k == 0:
                why = _cannot_fit(topology, ds[0]) or ""
                unplaced.extend((d.llm, d.replica, why) for d in ds)
                continue
            blocks.extend(ds[i:i + k] for i in range(0, len(ds), k))
        blocks.sort(key=lambda b: (-b[0].tp, b[0].gpu, rank[b[0].key]))
        free = {gpu: whole_free_gpus(topology, gpu) for gpu in {b[0].gpu for b in blocks}}
        slots: list[Slot] = []
        for ds in blocks:
            tp, gpu, mem = ds[0].tp, ds[0].gpu, ds[0].memory_gib
            need = len(ds) * mem - MEMORY_TOL_GIB  # per GPU of the block
            fits = [(len(gs), i) for i, (n, _, gs) in enumerate(free[gpu])
                    if len(gs) >= tp and n.memory_gib >= need]
            if not fits:
                why = (f"no NVLink domain of the {gpu} nodes has {tp} wholly free GPU(s) left "
                       f"for a block of {len(ds)} replica(s) ({len(ds) * mem:g} GiB per GPU)")
                unplaced.extend((d.llm, d.replica, why) for d in ds)
                continue
            i = min(fits)[1]  # the fewest free GPUs that hold it, then canonical order
            node, dom, gs = free[gpu][i]
            free[gpu][i] = (node, dom, gs[tp:])
            slots.extend(Slot(d.llm, d.replica, node.name, tuple(gs[:tp]), d.share, d.memory_gib)
                         for d in ds)
        return Placement(tuple(slots), tuple(unplaced), self.name)


_SIMPLER: Mapping[str, Callable[[], _Strategy]] = MappingProxyType({
    "ffd": FirstFitDecreasing, "best-fit": BestFit, "blocks": Blocks})

PLACERS: Registry[Callable[..., Placer]] = Registry("placer", source="placement",
                                                    field="policy")
"""Every placer by name (:class:`~scepsy_common.registry.Registry`); ``supports["option"]``:
the options its constructor takes beyond ``spread_replicas`` (the hierarchical placer's
improvement phase: ``improve``, ``repack``)."""
PLACERS.register("hierarchical", Hierarchical, summary="the paper's placer with a "
                 "fragmentation-aware score, local search and exact repacking", supports={"option": ("improve", "repack")})
PLACERS.register("ffd", FirstFitDecreasing, summary="by GPU capacity descending, the first node and domain that fit",
                 supports={"option": ()})
PLACERS.register("best-fit", BestFit, summary="by GPU capacity descending, the position leaving the least free share",
                 supports={"option": ()})
PLACERS.register("blocks", Blocks, summary="GPU blocks, one LLM shape per GPU",
                 supports={"option": ()})


def placer(name: str, **options: Any) -> Placer:
    """The registered placer ``name`` built with ``options`` (e.g. ``spread_replicas=True``)."""
    build = PLACERS.require(name)
    try:
        return build(**options)
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
