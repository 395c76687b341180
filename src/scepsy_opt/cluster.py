"""A cluster as the optimiser sees it: how many GPUs of each type, in nodes of which size.

A cluster file (YAML or JSON, docs/optimiser.md)::

    name: a100-16
    pools:
      - {gpu: A100-80GB, nodes: 2, gpus_per_node: 8}

Each pool is ``nodes`` identical nodes of ``gpus_per_node`` GPUs of one catalog type; a node is
one NVLink domain unless the GPU type's domain is smaller (then a TP group stays inside the GPU
type's domain). The optimiser needs only the per-type budgets and the largest TP group a type
can hold; topology-aware placement (scepsy_place) reads the same pools.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from scepsy_common.errors import InputError, Name, UnknownEntryError, validated
from scepsy_common.files import read_yaml
from scepsy_profile.catalog import Catalog, default_catalog


@dataclass(frozen=True, slots=True)
class GPUPool:
    """``nodes`` nodes of ``gpus_per_node`` GPUs of type ``gpu``."""

    gpu: str
    nodes: int
    gpus_per_node: int

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


def parse_cluster(data: Any, source: str, catalog: Catalog | None = None) -> Cluster:
    """Validate a parsed cluster document; errors name ``source`` and the field."""
    cat = catalog or default_catalog()
    m = validated(ClusterRecord, data, source)
    check_node_count((p.nodes for p in m.pools), source, "pools")
    pools = []
    for i, p in enumerate(m.pools):
        try:
            gpu = cat.gpu(p.gpu).name
        except UnknownEntryError as e:
            raise InputError(source, f"pools[{i}].gpu", "a GPU type of the catalog "
                             f"({', '.join(sorted(cat.gpus))})", p.gpu) from e
        pools.append(GPUPool(gpu, p.nodes, p.gpus_per_node))
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


def cluster_to_dict(cluster: Cluster) -> dict[str, Mapping[str, Any] | Any]:
    return {"name": cluster.name,
            "pools": [{"gpu": p.gpu, "nodes": p.nodes, "gpus_per_node": p.gpus_per_node}
                      for p in cluster.pools]}
