"""Cluster topology for placement: racks of nodes, GPUs with NVLink domains, what is in use.

A topology file (YAML or JSON, docs/placement.md)::

    name: two-racks
    racks:
      - name: r0
        nodes:
          - {name: dgx, gpu: A100-80GB, gpus: 8, count: 2}        # dgx-0, dgx-1
          - name: busy
            gpu: H100-80GB
            gpus: 8
            nvlink_domain: 4                                     # GPUs 0-3 and 4-7
            in_use: [{gpu: 0, share: 0.5, memory_gib: 40}]

``count: N`` expands one entry into nodes ``name-0 .. name-(N-1)``. ``nvlink_domain`` is the
number of GPUs per NVLink domain inside the node; the domains are consecutive index ranges
(``0..d-1``, ``d..2d-1``, ...), so it must divide ``gpus``. It defaults to the largest divisor of
``gpus`` that is at most the catalog's domain of the GPU type. A domain never spans nodes: a
GB200 NVL72 rack is modelled as one 72-GPU node with ``nvlink_domain: 72``.

The optimiser's cluster format (``pools: [{gpu, nodes, gpus_per_node}]``, scepsy_opt.cluster) is
read as well: one rack per pool (``pool-<i>``), nodes named ``<gpu>-<j>`` with ``j`` counting the
nodes of that GPU type in file order. So one file serves both the optimiser and placement.

GPU shares are counted in thousandths by :func:`scepsy_common.units.share_units` (rounded up to
the next 0.001, float noise forgiven), the rule the optimiser, every placer and the checker share.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from scepsy_common.errors import InputError, Name, UnknownEntryError, validated
from scepsy_common.files import read_yaml
from scepsy_common.units import UNITS, share_units
from scepsy_opt.cluster import (
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    Cluster,
    GPUPool,
    check_node_count,
    parse_cluster,
)
from scepsy_profile.catalog import Catalog, default_catalog

MEMORY_TOL_GIB = 1e-6


def _clean(x: float) -> float:
    """Round away float drift from repeated additions and subtractions."""
    y = round(x, 9)
    return 0.0 if y == 0 else y


@dataclass(frozen=True)
class Node:
    """One machine: ``gpus`` GPUs of type ``gpu`` in NVLink domains of ``nvlink_domain`` GPUs.

    ``used`` holds, per GPU index, the (share, memory GiB) already taken; ``()`` means all free.
    """

    name: str
    rack: str
    gpu: str
    gpus: int
    nvlink_domain: int
    memory_gib: float
    used: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        src = f"node {self.name}"
        if not (isinstance(self.gpus, int) and self.gpus >= 1):
            raise InputError(src, "gpus", "an integer >= 1", self.gpus)
        d = self.nvlink_domain
        if not (isinstance(d, int) and 1 <= d <= self.gpus and self.gpus % d == 0):
            raise InputError(src, "nvlink_domain", f"a divisor of the node's {self.gpus} GPUs "
                             "(a domain never spans nodes)", d)
        if not self.memory_gib > 0:
            raise InputError(src, "memory_gib", "a memory size > 0 GiB", self.memory_gib)
        used = tuple((_clean(float(s)), _clean(float(m))) for s, m in self.used)
        if not used:
            used = ((0.0, 0.0),) * self.gpus
        if len(used) != self.gpus:
            raise InputError(src, "used", f"one (share, memory_gib) per GPU ({self.gpus})", len(used))
        for i, (s, m) in enumerate(used):
            if not (s >= 0 and share_units(s) <= UNITS):
                raise InputError(src, f"used[{i}].share", "a used share in [0, 1]", s)
            if not (0 <= m <= self.memory_gib + MEMORY_TOL_GIB):
                raise InputError(src, f"used[{i}].memory_gib",
                                 f"used memory in [0, {self.memory_gib}] GiB", m)
        object.__setattr__(self, "used", used)

    def free_units(self, i: int) -> int:
        """Free share of GPU ``i`` in thousandths."""
        return UNITS - share_units(self.used[i][0])

    def free_memory(self, i: int) -> float:
        return self.memory_gib - self.used[i][1]

    def domain(self, i: int) -> int:
        """The NVLink domain of GPU ``i``."""
        return i // self.nvlink_domain

    def domains(self) -> list[range]:
        """GPU index ranges, one per NVLink domain."""
        d = self.nvlink_domain
        return [range(k, k + d) for k in range(0, self.gpus, d)]

    @property
    def busy(self) -> bool:
        """Whether anything runs on the node."""
        return any(s > 0 or m > 0 for s, m in self.used)

    def busy_gpus(self) -> int:
        return sum(1 for s, m in self.used if s > 0 or m > 0)

    @property
    def content(self) -> tuple[Any, ...]:
        """Everything about the node but its name and rack: two nodes with equal content are
        interchangeable for a placer."""
        return (self.gpu, self.gpus, self.nvlink_domain, self.memory_gib, self.used)


@dataclass(frozen=True)
class Topology:
    """Named nodes (in input order), grouped into racks by :attr:`Node.rack`."""

    name: str
    nodes: tuple[Node, ...]
    _index: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        index: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            if n.name in index:
                raise InputError(f"topology {self.name}", f"nodes[{i}].name",
                                 "a node name used once", n.name)
            index[n.name] = i
        if not self.nodes:
            raise InputError(f"topology {self.name}", "nodes", "at least one node with GPUs")
        object.__setattr__(self, "_index", index)

    def node(self, name: str) -> Node:
        if name not in self._index:
            raise InputError(f"topology {self.name}", "node", "the name of a node", name)
        return self.nodes[self._index[name]]

    def has_node(self, name: str) -> bool:
        return name in self._index

    def budgets(self) -> dict[str, int]:
        """GPUs per type (all GPUs, used or not), types sorted by name."""
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.gpu] = out.get(n.gpu, 0) + n.gpus
        return dict(sorted(out.items()))

    def free_budgets(self) -> dict[str, float]:
        """Free GPU capacity per type (Σ free shares), types sorted by name."""
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.gpu] = out.get(n.gpu, 0) + sum(n.free_units(i) for i in range(n.gpus))
        return {g: u / UNITS for g, u in sorted(out.items())}

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def racks(self) -> dict[str, tuple[str, ...]]:
        """Rack name -> its node names, racks in order of first appearance."""
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            out.setdefault(n.rack, []).append(n.name)
        return {r: tuple(v) for r, v in out.items()}

    def max_tp(self, gpu: str) -> int:
        """The largest TP group one NVLink domain of ``gpu`` nodes holds (0: no such node)."""
        return max((n.nvlink_domain for n in self.nodes if n.gpu == gpu), default=0)

    def to_cluster(self, catalog: Catalog | None = None) -> Cluster:
        """The optimiser's view: pools of (gpu, GPUs per node), budgets equal to :meth:`budgets`.

        A node whose declared NVLink domain is smaller than both its size and the catalog's
        domain is reported as ``gpus / nvlink_domain`` pool nodes of one domain each, so that
        ``Cluster.max_tp`` (= min(node size, catalog domain)) never exceeds what the node holds.
        """
        cat = catalog or default_catalog()
        counts: dict[tuple[str, int], int] = {}
        for n in self.nodes:
            cat_domain = cat.gpu(n.gpu).nvlink_domain
            if n.nvlink_domain < min(n.gpus, cat_domain):
                key, k = (n.gpu, n.nvlink_domain), n.gpus // n.nvlink_domain
            else:
                key, k = (n.gpu, n.gpus), 1
            counts[key] = counts.get(key, 0) + k
        pools = tuple(GPUPool(g, c, size) for (g, size), c in counts.items())
        return Cluster(self.name, pools)

    def canonical_nodes(self) -> tuple[Node, ...]:
        """The nodes in an order that depends on content, not on input order: larger nodes
        first (first fit then fills few nodes), then by node content, then the content of its
        rack (the sorted contents of the rack's nodes), then rack name, then node name. Placers
        walk nodes in this order and break every remaining tie by it, so their placements do not
        depend on the order of the input, and renaming nodes or racks only permutes
        interchangeable ones (equal content in racks of equal content). Sorted once per
        topology (every placer, fallback and round asks for it again)."""
        return self._canonical

    @cached_property
    def _canonical(self) -> tuple[Node, ...]:
        racks: dict[str, list[tuple[Any, ...]]] = {}
        for n in self.nodes:
            racks.setdefault(n.rack, []).append(n.content)
        rack_content = {r: tuple(sorted(v)) for r, v in racks.items()}
        return tuple(sorted(self.nodes, key=lambda n: (-n.gpus, n.content, rack_content[n.rack],
                                                       n.rack, n.name)))

    def with_nodes(self, nodes: Iterable[Node]) -> Topology:
        return Topology(self.name, tuple(nodes))

    def cleared(self) -> Topology:
        """The same topology with nothing in use."""
        return self.with_nodes(replace(n, used=()) for n in self.nodes)


def default_domain(gpus: int, catalog_domain: int) -> int:
    """The largest divisor of ``gpus`` that is at most ``catalog_domain``."""
    return max(d for d in range(1, min(gpus, catalog_domain) + 1) if gpus % d == 0)


def from_cluster(cluster: Cluster, catalog: Catalog | None = None) -> Topology:
    """A topology for an optimiser :class:`~scepsy_opt.cluster.Cluster` (the pools format); an
    open pool (``nodes: auto``) gets its ``max_nodes`` nodes, one without a limit one node (the
    min-cost plan adds what it needs, :func:`scepsy_place.formulations.loop.open_topology`)."""
    cat = catalog or default_catalog()
    nodes: list[Node] = []
    per_type: dict[str, int] = {}
    for i, p in enumerate(cluster.pools):
        spec = cat.gpu(p.gpu)
        dom = default_domain(p.gpus_per_node, spec.nvlink_domain)
        for _ in range(1 if p.open and p.nodes == 0 else p.nodes):
            j = per_type.get(spec.name, 0)
            per_type[spec.name] = j + 1
            nodes.append(Node(f"{spec.name}-{j}", f"pool-{i}", spec.name, p.gpus_per_node, dom,
                              spec.memory_gib))
    return Topology(cluster.name, tuple(nodes))


# --------------------------------------------------------------------------- file format


class InUseRecord(BaseModel):
    """A GPU of a node already in use (racks format, docs/placement.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    gpu: int = Field(ge=0)
    share: float = Field(gt=0, le=1)
    memory_gib: float | None = Field(default=None, ge=0)


class NodeRecord(BaseModel):
    """A node (or ``count`` alike) of a rack, racks format."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    name: Name
    gpu: str = Field(min_length=1)
    gpus: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    nvlink_domain: int | None = Field(default=None, ge=1)
    count: int | None = Field(default=None, ge=1, le=MAX_NODES)
    in_use: list[InUseRecord] = Field(default_factory=list)


class RackRecord(BaseModel):
    """A rack of nodes, racks format."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: Name
    nodes: list[NodeRecord] = Field(min_length=1)


class TopologyRecord(BaseModel):
    """A topology file in the racks format (docs/placement.md); also plan.json's ``topology``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: Name
    racks: list[RackRecord] = Field(min_length=1)


def _allowed(loc: tuple[Any, ...]) -> list[str]:
    models: dict[int, type[BaseModel]] = {0: TopologyRecord, 2: RackRecord, 4: NodeRecord,
                                          6: InUseRecord}
    m = models.get(len(loc) - 1)
    return list(m.model_fields) if m else []


def parse_topology(data: Any, source: str, catalog: Catalog | None = None) -> Topology:
    """Validate a parsed topology document (racks or pools format); errors name ``source`` and
    the field."""
    cat = catalog or default_catalog()
    if isinstance(data, dict) and "pools" in data and "racks" not in data:
        cluster = parse_cluster(data, source, cat)
        return from_cluster(cluster, cat)
    if isinstance(data, dict) and "racks" not in data and "name" in data:
        raise InputError(source, "racks", "a list of racks (or the optimiser's `pools:`)")
    rec = validated(TopologyRecord, data, source, allowed=_allowed)
    check_node_count((1 if n.count is None else n.count for r in rec.racks for n in r.nodes),
                     source, "racks")
    nodes: list[Node] = []
    seen: dict[str, str] = {}
    racks: set[str] = set()
    for r, rack in enumerate(rec.racks):
        if rack.name in racks:
            raise InputError(source, f"racks[{r}].name", "a rack name used once", rack.name)
        racks.add(rack.name)
        for k, nr in enumerate(rack.nodes):
            where = f"racks[{r}].nodes[{k}]"
            try:
                spec = cat.gpu(nr.gpu)
            except UnknownEntryError:
                raise InputError(source, f"{where}.gpu", "a GPU type of the catalog "
                                 f"({', '.join(sorted(cat.gpus))})", nr.gpu) from None
            dom = nr.nvlink_domain
            if dom is None:
                dom = default_domain(nr.gpus, spec.nvlink_domain)
            elif dom > nr.gpus or nr.gpus % dom:
                raise InputError(source, f"{where}.nvlink_domain",
                                 f"a divisor of gpus ({nr.gpus}); a domain never spans nodes "
                                 "(model an NVL72 rack as one 72-GPU node)", dom)
            used = [[0, 0.0] for _ in range(nr.gpus)]
            for u, iu in enumerate(nr.in_use):
                if iu.gpu >= nr.gpus:
                    raise InputError(source, f"{where}.in_use[{u}].gpu",
                                     f"a GPU index in 0..{nr.gpus - 1}", iu.gpu)
                mem = iu.share * spec.memory_gib if iu.memory_gib is None else iu.memory_gib
                used[iu.gpu][0] += share_units(iu.share)
                used[iu.gpu][1] += mem
                if used[iu.gpu][0] > UNITS:
                    raise InputError(source, f"{where}.in_use[{u}].share",
                                     f"shares of GPU {iu.gpu} summing to at most 1",
                                     used[iu.gpu][0] / UNITS)
                if used[iu.gpu][1] > spec.memory_gib + MEMORY_TOL_GIB:
                    raise InputError(source, f"{where}.in_use[{u}].memory_gib",
                                     f"memory of GPU {iu.gpu} summing to at most "
                                     f"{spec.memory_gib} GiB", used[iu.gpu][1])
            names = ([nr.name] if nr.count is None
                     else [f"{nr.name}-{i}" for i in range(nr.count)])
            for name in names:
                if name in seen:
                    raise InputError(source, f"{where}.name",
                                     f"a node name used once (also in {seen[name]})", name)
                seen[name] = where
                nodes.append(Node(name, rack.name, spec.name, nr.gpus, dom, spec.memory_gib,
                                  tuple((s / UNITS, m) for s, m in used)))
    return Topology(rec.name, tuple(nodes))


def load_topology(path: str | os.PathLike[str], catalog: Catalog | None = None) -> Topology:
    """Read a topology YAML/JSON file (racks or pools format, see the module docstring)."""
    raw = read_yaml(path, "topology or cluster file (YAML or JSON)")
    return parse_topology(raw, str(path), catalog)


def topology_to_dict(topology: Topology) -> dict[str, Any]:
    """The racks format of ``topology`` (one entry per node, ``in_use`` for used GPUs)."""
    racks: dict[str, list[dict[str, Any]]] = {}
    for n in topology.nodes:
        rec: dict[str, Any] = {"name": n.name, "gpu": n.gpu, "gpus": n.gpus,
                               "nvlink_domain": n.nvlink_domain}
        in_use = [{"gpu": i, "share": s, "memory_gib": m}
                  for i, (s, m) in enumerate(n.used) if s > 0]
        if in_use:
            rec["in_use"] = in_use
        racks.setdefault(n.rack, []).append(rec)
    return {"name": topology.name,
            "racks": [{"name": r, "nodes": ns} for r, ns in racks.items()]}
