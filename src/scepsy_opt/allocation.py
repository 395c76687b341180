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
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import yaml
from pydantic import BaseModel, ConfigDict, Field

from scepsy_profile.errors import InputError, validated
from scepsy_profile.files import atomic_write_text, read_yaml


@dataclass(frozen=True, slots=True)
class Instance:
    """One LLM's deployment: ``replicas`` copies of a (gpu, tp, share) instance."""

    gpu: str
    tp: int
    share: float
    replicas: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise InputError("instance", "tp", "an integer >= 1", self.tp)
        if not 0 < self.share <= 1:
            raise InputError("instance", "share", "a GPU share in (0, 1]", self.share)
        if not (isinstance(self.replicas, int) and self.replicas >= 1):
            raise InputError("instance", "replicas", "an integer >= 1", self.replicas)

    @property
    def gpus(self) -> float:
        """GPU capacity used: ``replicas · tp · share``."""
        return self.replicas * self.tp * self.share


@dataclass(frozen=True)
class Allocation:
    """LLM name -> :class:`Instance`."""

    llms: Mapping[str, Instance]

    def __post_init__(self) -> None:
        object.__setattr__(self, "llms", MappingProxyType(dict(sorted(self.llms.items()))))

    def gpus(self, gpu: str | None = None) -> float:
        """GPU capacity used in total (or of one GPU type)."""
        return sum(i.gpus for i in self.llms.values() if gpu is None or i.gpu == gpu)

    def to_dict(self) -> dict:
        return {"llms": {name: {"gpu": i.gpu, "tp": i.tp, "share": i.share,
                                "replicas": i.replicas} for name, i in self.llms.items()}}


class _InstanceRec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    gpu: str = Field(min_length=1)
    tp: int = Field(ge=1)
    share: float = Field(gt=0, le=1)
    replicas: int = Field(default=1, ge=1)


class _AllocationRec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    llms: dict[str, _InstanceRec] = Field(min_length=1)


def parse_allocation(raw: object, source: str) -> Allocation:
    """An allocation document, or a plan.json (its ``allocation``)."""
    if isinstance(raw, dict) and "optimiser" in raw and "status" in raw:
        if not isinstance(raw.get("allocation"), dict):
            raise InputError(source, "allocation", "a plan with an allocation (this plan's status "
                             f"is {raw.get('status')!r})")
        raw = raw["allocation"]
    rec = validated(_AllocationRec, raw, source)
    return Allocation({name: Instance(**r.model_dump()) for name, r in rec.llms.items()})


def load_allocation(path: str | os.PathLike[str]) -> Allocation:
    """Read an allocation from YAML or JSON (by content: JSON is YAML)."""
    p = Path(path)
    return parse_allocation(read_yaml(p, "allocation file (YAML or JSON)"), str(p))


def save_allocation(alloc: Allocation, path: str | os.PathLike[str]) -> None:
    """Write JSON for ``.json`` paths, YAML otherwise (deterministic, atomic)."""
    p = Path(path)
    doc = alloc.to_dict()
    text = (json.dumps(doc, indent=2, sort_keys=True) + "\n" if p.suffix == ".json"
            else yaml.safe_dump(doc, sort_keys=True))
    atomic_write_text(p, text)
