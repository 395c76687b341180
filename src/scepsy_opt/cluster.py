"""A cluster as the optimiser sees it: how many GPUs of each type, in nodes of which size.

A cluster file (YAML or JSON, docs/optimiser.md)::

    name: a100-16
    pools:
      - {gpu: A100-80GB, nodes: 2, gpus_per_node: 8}

Each pool is ``nodes`` identical nodes of ``gpus_per_node`` GPUs of one catalog type; a node is
one NVLink domain unless the GPU type's domain is smaller (then a TP group stays inside the GPU
type's domain). The optimiser needs only the per-type budgets and the largest TP group a type
can hold; topology-aware placement (scepsy_place) reads the same pools.

Optional per pool: ``price_per_hour`` (USD per GPU-hour, overriding the catalog's price for the
min-cost objective; pools of one GPU type share one price) and ``nodes: auto`` (an *open* pool:
the min-cost objective decides how many nodes to buy, at most ``max_nodes`` when given)::

    pools:
      - {gpu: H100-80GB, nodes: auto, max_nodes: 4, gpus_per_node: 8, price_per_hour: 2.99}
      - {gpu: L4, nodes: auto, gpus_per_node: 1}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from scepsy_common.errors import InputError, Name, UnknownEntryError, validated
from scepsy_common.files import read_yaml
from scepsy_profile.catalog import Catalog, default_catalog


@dataclass(frozen=True, slots=True)
class GPUPool:
    """``nodes`` nodes of ``gpus_per_node`` GPUs of type ``gpu``.

    ``price_per_hour``: USD per GPU-hour (None: the catalog's). ``open``: the plan chooses how
    many nodes to use (``nodes: auto``, min-cost objective); ``nodes`` is then the most it may
    use, 0 when unlimited."""

    gpu: str
    nodes: int
    gpus_per_node: int
    price_per_hour: float | None = None
    open: bool = False

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Cluster:
    """GPU pools, possibly of several types (a heterogeneous cluster)."""

    name: str
    pools: tuple[GPUPool, ...]

    def budgets(self) -> dict[str, int]:
        """GPUs per type, types sorted by name."""
        out: dict[str, int] = {}
        for p in self.pools:
            out[p.gpu] = out.get(p.gpu, 0) + p.gpus
        return dict(sorted(out.items()))

    def max_tp(self, gpu: str, catalog: Catalog | None = None) -> int:
        """The largest TP group one node of ``gpu`` holds inside one NVLink domain."""
        cat = catalog or default_catalog()
        node = max((p.gpus_per_node for p in self.pools if p.gpu == gpu), default=0)
        return min(node, cat.gpu(gpu).nvlink_domain)

    @property
    def total_gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def open(self) -> bool:
        """Whether some pool's size is left to the plan (``nodes: auto``)."""
        return any(p.open for p in self.pools)

    @property
    def unbounded(self) -> tuple[str, ...]:
        """The GPU types with an open pool without ``max_nodes`` (no limit), sorted."""
        return tuple(sorted({p.gpu for p in self.pools if p.open and p.nodes == 0}))


MAX_NODES = 10_000
"""The most nodes a cluster (or topology) file may describe, over all its pools or racks."""
MAX_GPUS_PER_NODE = 4096
"""The most GPUs one node may have."""


class PoolRecord(BaseModel):
    """A pool of a cluster file: ``nodes`` nodes of ``gpus_per_node`` GPUs of type ``gpu``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    gpu: str = Field(min_length=1)
    nodes: int = Field(ge=1, le=MAX_NODES)
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    max_nodes: int | None = Field(default=None, ge=1, le=MAX_NODES)
    price_per_hour: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class ClusterRecord(BaseModel):
    """A cluster file in the pools format; also plan.json's ``cluster``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: Name
    pools: list[PoolRecord] = Field(min_length=1)


def check_node_count(counts: Iterable[int], source: str, field: str) -> None:
    """An :class:`InputError` when the node ``counts`` of a file sum to more than
    :data:`MAX_NODES` (checked before any node is built)."""
    total = sum(counts)
    if total > MAX_NODES:
        raise InputError(source, field, f"at most {MAX_NODES} nodes in all (the largest "
                         "cluster scepsy plans for)", total)


AUTO = "auto"
"""``nodes: auto``: an open pool (the min-cost objective decides its size)."""


def _open_pools(data: Any) -> tuple[Any, frozenset[int]]:
    """``data`` with every pool's ``nodes: auto`` replaced by 1 (validated like any count), and
    the indices of those pools."""
    if not (isinstance(data, dict) and isinstance(data.get("pools"), list)):
        return data, frozenset()
    auto = frozenset(i for i, p in enumerate(data["pools"])
                     if isinstance(p, dict) and p.get("nodes") == AUTO)
    if not auto:
        return data, auto
    pools = [dict(p, nodes=1) if i in auto else p for i, p in enumerate(data["pools"])]
    return dict(data, pools=pools), auto


def parse_cluster(data: Any, source: str, catalog: Catalog | None = None) -> Cluster:
    """Validate a parsed cluster document; errors name ``source`` and the field."""
    cat = catalog or default_catalog()
    data, auto = _open_pools(data)
    m = validated(ClusterRecord, data, source)
    check_node_count(((p.max_nodes or 0) if i in auto else p.nodes
                      for i, p in enumerate(m.pools)), source, "pools")
    pools = []
    prices: dict[str, tuple[int, float]] = {}
    for i, p in enumerate(m.pools):
        try:
            gpu = cat.gpu(p.gpu).name
        except UnknownEntryError as e:
            raise InputError(source, f"pools[{i}].gpu", "a GPU type of the catalog "
                             f"({', '.join(sorted(cat.gpus))})", p.gpu) from e
        if p.max_nodes is not None and i not in auto:
            raise InputError(source, f"pools[{i}].max_nodes", "max_nodes only with nodes: auto "
                             "(a pool whose size the plan chooses)", p.max_nodes)
        if p.price_per_hour is not None:
            check_price(p.price_per_hour, source, f"pools[{i}].price_per_hour")
            j, usd = prices.setdefault(gpu, (i, p.price_per_hour))
            if usd != p.price_per_hour:
                raise InputError(source, f"pools[{i}].price_per_hour", f"the price of pools[{j}] "
                                 f"({usd:g}): the pools of one GPU type share one price",
                                 p.price_per_hour)
        if i in auto:
            pools.append(GPUPool(gpu, p.max_nodes or 0, p.gpus_per_node, p.price_per_hour, True))
        else:
            pools.append(GPUPool(gpu, p.nodes, p.gpus_per_node, p.price_per_hour))
    return Cluster(m.name, tuple(pools))


def load_cluster(path: str | Path, catalog: Catalog | None = None) -> Cluster:
    """Read a cluster YAML/JSON file (see the module docstring)."""
    return parse_cluster(read_yaml(path, "cluster file (YAML or JSON)"), str(path), catalog)


def uniform_cluster(gpu: str, gpus: int, gpus_per_node: int = 8, name: str | None = None) -> Cluster:
    """``gpus`` GPUs of one type in nodes of ``gpus_per_node`` (the last node may be smaller)."""
    if not (isinstance(gpus, int) and gpus >= 1):
        raise InputError("cluster", "gpus", "an integer >= 1", gpus)
    full, rest = divmod(gpus, gpus_per_node)
    pools = [GPUPool(gpu, full, gpus_per_node)] if full else []
    if rest:
        pools.append(GPUPool(gpu, 1, rest))
    return Cluster(name or f"{gpu}-{gpus}", tuple(pools))


def _pool_dict(p: GPUPool) -> dict[str, Any]:
    out: dict[str, Any] = {"gpu": p.gpu, "nodes": AUTO if p.open else p.nodes,
                           "gpus_per_node": p.gpus_per_node}
    if p.open and p.nodes:
        out["max_nodes"] = p.nodes
    if p.price_per_hour is not None:
        out["price_per_hour"] = p.price_per_hour
    return out


def cluster_to_dict(cluster: Cluster) -> dict[str, Mapping[str, Any] | Any]:
    """The cluster in the pools format (:func:`parse_cluster` reads it back)."""
    return {"name": cluster.name, "pools": [_pool_dict(p) for p in cluster.pools]}


PRICE_MIN, PRICE_MAX = 1e-6, 1e6
PRICE_EXPECTED = ("a price per GPU-hour of 0 (free) or 0.000001 to 1000000 USD (the min-cost "
                  "solver's numbers lose meaning outside it)")


def check_price(usd: object, source: str, field: str) -> float:
    """``usd`` as a price per GPU-hour if it is 0 or within ``[PRICE_MIN, PRICE_MAX]``, else an
    :class:`InputError` saying :data:`PRICE_EXPECTED`: the one rule for every price (a
    cluster file's ``price_per_hour``, ``--price``)."""
    if isinstance(usd, bool) or not isinstance(usd, int | float) or not (
            usd == 0 or PRICE_MIN <= usd <= PRICE_MAX):
        raise InputError(source, field, PRICE_EXPECTED, usd)
    return float(usd)


def with_prices(cluster: Cluster, prices: Mapping[str, float], source: str = "--price",
                ) -> Cluster:
    """``cluster`` with every pool of each GPU type in ``prices`` (USD per GPU-hour, names as
    in the catalog, any case) at that price (the ``--price GPU=USD`` flag); InputError for a
    type the cluster lacks, one given twice or a price :func:`check_price` refuses."""
    by_key = {p.gpu.casefold(): p.gpu for p in cluster.pools}
    own: dict[str, float] = {}
    for name, usd in prices.items():
        gpu = by_key.get(str(name).strip().casefold())
        if gpu is None:
            raise InputError(source, str(name), "a GPU type of the cluster "
                             f"({', '.join(sorted(set(by_key.values())))})", name)
        if gpu in own:
            raise InputError(source, str(name), f"one price for {gpu} (it is given twice)", usd)
        own[gpu] = check_price(usd, source, str(name))
    pools = tuple(replace(p, price_per_hour=own[p.gpu]) if p.gpu in own else p
                  for p in cluster.pools)
    return Cluster(cluster.name, pools)


def sized_cluster(cluster: Cluster, gpus: Mapping[str, int]) -> Cluster:
    """``cluster`` with every open pool closed at the fewest nodes that, with the fixed pools,
    hold ``gpus`` (per GPU type, the GPUs a plan uses; open pools of a type are filled in order,
    each up to its ``max_nodes``): the cluster a min-cost plan buys. Open pools of a type that
    needs none are dropped."""
    left = dict(gpus)
    for p in cluster.pools:
        if not p.open:
            left[p.gpu] = left.get(p.gpu, 0) - p.gpus
    pools = []
    for p in cluster.pools:
        if not p.open:
            pools.append(p)
            continue
        want = max(0, left.get(p.gpu, 0))
        nodes = -(-want // p.gpus_per_node)
        if p.nodes:
            nodes = min(nodes, p.nodes)
        left[p.gpu] = want - nodes * p.gpus_per_node
        if nodes:
            pools.append(GPUPool(p.gpu, nodes, p.gpus_per_node, p.price_per_hour))
    return Cluster(cluster.name, tuple(pools))
