"""Allocations: for every LLM, the instance shape and how many replicas of it run.

An allocation file (YAML or JSON, docs/allocation.md)::

    llms:
      answerer: {gpu: A100-80GB, tp: 1, share: 0.5, replicas: 2}
      reranker: {gpu: A100-80GB, tp: 1, share: 0.2, replicas: 1}

LLM names are the names workflows use for their LLMs (``llms:`` in a workflow YAML, ``llm`` in a
trace); a name used by two workflows is one deployment that serves both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import yaml
from pydantic import BaseModel, ConfigDict, Field

from scepsy_common.errors import InputError, Name, UnknownEntryError, validated
from scepsy_common.files import atomic_write_text, read_yaml
from scepsy_opt.cluster import MAX_GPUS_PER_NODE
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.serving import MemoryPolicy, memory_fit


@dataclass(frozen=True, slots=True)
class Instance:
    """One LLM's deployment: ``replicas`` copies of a (gpu, tp, share) instance.

    ``share`` is the fraction of each GPU's compute (MPS active thread percentage); ``memory``
    the fraction of each GPU's memory the replica may use (vLLM's memory fraction), a second
    resource. ``None`` ties it to the compute share (:attr:`memory_share`)."""

    gpu: str
    tp: int
    share: float
    replicas: int = 1
    memory: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise InputError("instance", "tp", "an integer >= 1", self.tp)
        if not 0 < self.share <= 1:
            raise InputError("instance", "share", "a GPU share in (0, 1]", self.share)
        if not (isinstance(self.replicas, int) and self.replicas >= 1):
            raise InputError("instance", "replicas", "an integer >= 1", self.replicas)
        if self.memory is not None and not 0 < self.memory <= 1:
            raise InputError("instance", "memory", "a fraction of GPU memory in (0, 1]",
                             self.memory)

    @property
    def memory_share(self) -> float:
        """Fraction of each GPU's memory per replica: ``memory``, or the compute share."""
        return self.share if self.memory is None else self.memory

    @property
    def gpus(self) -> float:
        """GPU capacity used: ``replicas · tp · share``."""
        return self.replicas * self.tp * self.share


@dataclass(frozen=True)
class Allocation:
    """LLM name -> :class:`Instance`; ``source`` names the file it was read from in errors."""

    llms: Mapping[str, Instance]
    source: str = field(default="allocation", compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "llms", MappingProxyType(dict(sorted(self.llms.items()))))

    def gpus(self, gpu: str | None = None) -> float:
        """GPU capacity used in total (or of one GPU type)."""
        return sum(i.gpus for i in self.llms.values() if gpu is None or i.gpu == gpu)

    def to_dict(self) -> dict:
        return {"llms": {name: _instance_dict(i) for name, i in self.llms.items()}}


def _instance_dict(i: Instance) -> dict:
    out: dict = {"gpu": i.gpu, "tp": i.tp, "share": i.share, "replicas": i.replicas}
    if i.memory is not None:
        out["memory"] = i.memory
    return out


MAX_REPLICAS = 100_000
"""The most replicas one LLM of an allocation file may have."""


class _InstanceRec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    gpu: str = Field(min_length=1)
    tp: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    share: float = Field(gt=0, le=1)
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    memory: float | None = Field(default=None, gt=0, le=1)


class _AllocationRec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    llms: dict[Name, _InstanceRec] = Field(min_length=1)


def parse_allocation(raw: object, source: str, catalog: Catalog | None = None) -> Allocation:
    """An allocation document, or a plan.json (its ``allocation``); GPU names must be catalog
    GPU types (aliases resolved), every error names ``source`` and the field."""
    prefix = ""
    if isinstance(raw, dict) and "optimiser" in raw and "status" in raw:
        if not isinstance(raw.get("allocation"), dict):
            raise InputError(source, "allocation", "a plan with an allocation (this plan's status "
                             f"is {raw.get('status')!r})")
        raw, prefix = raw["allocation"], "allocation."
    rec = validated(_AllocationRec, raw, source, prefix)
    cat = catalog or default_catalog()
    llms: dict[str, Instance] = {}
    for name, r in rec.llms.items():
        try:
            gpu = cat.gpu(r.gpu)
        except UnknownEntryError:
            raise InputError(source, f"{prefix}llms.{name}.gpu", "a GPU type of the catalog "
                             f"({', '.join(sorted(cat.gpus))})", r.gpu) from None
        if r.tp > gpu.nvlink_domain:
            raise InputError(source, f"{prefix}llms.{name}.tp", f"a TP degree within one "
                             f"{gpu.name} NVLink domain (at most {gpu.nvlink_domain})", r.tp)
        llms[name] = Instance(gpu.name, r.tp, r.share, r.replicas, r.memory)
    return Allocation(llms, source)


def load_allocation(path: str | os.PathLike[str], catalog: Catalog | None = None) -> Allocation:
    """Read an allocation from YAML or JSON (by content: JSON is YAML), or a plan.json."""
    p = Path(path)
    return parse_allocation(read_yaml(p, "allocation file (YAML or JSON)"), str(p), catalog)


def check_allocation(alloc: Allocation, models: Mapping[str, str], *,
                     catalog: Catalog | None = None, policy: MemoryPolicy | None = None) -> None:
    """Every instance of ``alloc`` whose LLM is in ``models`` (LLM -> catalog model) can run:
    the model supports its TP degree and its share of GPU memory holds the model's weights,
    the reserve and the KV cache of at least one token. Otherwise an :class:`InputError`
    naming the allocation's file and ``llms.NAME.tp`` or ``llms.NAME.share``."""
    cat = catalog or default_catalog()
    pol = policy or MemoryPolicy()
    for name, inst in alloc.llms.items():
        if name not in models:
            continue
        spec = cat.model(models[name])
        if not spec.supports_tp(inst.tp):
            raise InputError(alloc.source, f"llms.{name}.tp", f"a TP degree {spec.name} supports "
                             f"(dividing its {spec.heads} attention heads; its KV heads "
                             f"{spec.kv_heads} divide it or it divides them)", inst.tp)
        fit = memory_fit(spec.name, inst.gpu, inst.tp, inst.memory_share, 1, catalog=cat,
                         policy=pol)
        if not fit.feasible:
            field_ = "memory" if inst.memory is not None else "share"
            raise InputError(alloc.source, f"llms.{name}.{field_}", f"a share of {inst.gpu} whose "
                             f"memory ({fit.available_gib:.3g} GiB per GPU) holds {spec.name}'s "
                             f"weights ({fit.weights_gib:.3g} GiB per GPU at tp {inst.tp}), the "
                             f"reserve ({fit.reserve_gib:.3g} GiB) and a KV cache; the model "
                             "does not fit", inst.memory_share)


def save_allocation(alloc: Allocation, path: str | os.PathLike[str]) -> None:
    """Write JSON for ``.json`` paths, YAML otherwise (deterministic, atomic)."""
    p = Path(path)
    doc = alloc.to_dict()
    text = (json.dumps(doc, indent=2, sort_keys=True) + "\n" if p.suffix == ".json"
            else yaml.safe_dump(doc, sort_keys=True))
    atomic_write_text(p, text)
