"""Allocations: for every LLM, the instance shape and how many replicas of it run.

An allocation file (YAML or JSON, docs/allocation.md)::

    llms:
      answerer: {gpu: A100-80GB, tp: 1, share: 0.5, replicas: 2}
      reranker: {gpu: A100-80GB, tp: 1, share: 0.2, replicas: 1}

LLM names are the names workflows use for their LLMs (``llms:`` in a workflow YAML, ``llm`` in a
trace); a name used by two workflows is one deployment that serves both.

An LLM may also run as replica groups on several GPU types (docs/min-cost.md): ``splits``
names, per LLM the workflows call, its groups (entries of ``llms``, each running the LLM's
model) and the fraction of its calls each gets::

    llms:
      chat-a10: {gpu: A10, tp: 1, share: 1.0, replicas: 2}
      chat-l4: {gpu: L4, tp: 1, share: 1.0, replicas: 1}
    splits:
      chat: {chat-a10: 0.75, chat-l4: 0.25}

A split LLM may be routed by prompt length instead (``lengths``): per group, the range of input
tokens ``[lo, hi)`` whose calls it serves (``null``: no upper end; the ranges cover every length
once, :func:`scepsy_opt.stats.check_ranges`); its ``splits`` fractions are then the fractions of
the calls the ranges held in the trace it was planned on::

    lengths:
      chat: {chat-a10: [0, 512], chat-l4: [512, null]}

LLMs may share GPUs as MuxServe's ``flexsm`` does (docs/validate.md, "Co-location"): the LLMs
of one ``mesh`` run on the same ``tp`` GPUs, each under NVIDIA MPS limits that may add up to
more than 1 (MPS limits SMs, it does not reserve them): ``share`` is its decode limit,
``prefill_share`` its prefill limit, ``memory`` its part of the GPUs' memory (required, and the
parts of a mesh add up to at most 1)::

    llms:
      chat-7b: {gpu: A100-80GB, tp: 2, share: 0.6, prefill_share: 0.8, memory: 0.45, mesh: m0}
      chat-13b: {gpu: A100-80GB, tp: 2, share: 0.6, prefill_share: 0.9, memory: 0.5, mesh: m0}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field

from scepsy_common.errors import InputError, Name, UnknownEntryError, validated
from scepsy_common.files import atomic_write_text, dump_yaml, read_yaml
from scepsy_opt.cluster import MAX_GPUS_PER_NODE
from scepsy_opt.stats import check_ranges
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
    prefill_share: float | None = None
    """The MPS limit of its prefills (None: ``share``, one limit for both phases)."""
    mesh: str | None = None
    """The GPUs it shares with the other LLMs of the same mesh under MPS limits (None: its
    share is its own partition)."""

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
        if self.prefill_share is not None and not 0 < self.prefill_share <= 1:
            raise InputError("instance", "prefill_share", "a GPU share in (0, 1]",
                             self.prefill_share)
        if self.mesh is not None and not (isinstance(self.mesh, str) and self.mesh):
            raise InputError("instance", "mesh", "a mesh name", self.mesh)

    @property
    def memory_share(self) -> float:
        """Fraction of each GPU's memory per replica: ``memory``, or the compute share."""
        return self.share if self.memory is None else self.memory

    @property
    def gpus(self) -> float:
        """GPU capacity used: ``replicas · tp · share`` (LLMs of a mesh share its GPUs:
        :meth:`Allocation.gpus` counts those once)."""
        return self.replicas * self.tp * self.share

    @property
    def phase_shares(self) -> tuple[float, float]:
        """``(prefill, decode)`` limits: ``prefill_share`` (or ``share``) and ``share``."""
        return (self.share if self.prefill_share is None else self.prefill_share, self.share)


@dataclass(frozen=True)
class Allocation:
    """LLM name -> :class:`Instance`; ``source`` names the file it was read from in errors."""

    llms: Mapping[str, Instance]
    source: str = field(default="allocation", compare=False, repr=False)
    # an LLM the workflows call -> its replica groups (LLMs of ``llms``) -> fraction of its calls
    splits: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # a split LLM routed by prompt length -> its groups -> input tokens [lo, hi) (hi None: no end)
    lengths: Mapping[str, Mapping[str, tuple[int, int | None]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "llms", MappingProxyType(dict(sorted(self.llms.items()))))
        self._check_lengths()
        seen: dict[str, str] = {}
        for m, parts in self.splits.items():
            where = f"splits.{m}"
            if m in self.llms:
                raise InputError(self.source, where, "an LLM the workflows call that runs only "
                                 "as its replica groups (not an entry of `llms`)", m)
            if len(parts) < 2:
                raise InputError(self.source, where, "two or more replica groups", len(parts))
            for g, f in parts.items():
                if g not in self.llms:
                    raise InputError(self.source, f"{where}.{g}",
                                     f"an entry of `llms` ({', '.join(self.llms)})", g)
                if g in seen:
                    raise InputError(self.source, f"{where}.{g}", "a group of one split LLM "
                                     f"(it is also one of {seen[g]}'s)", g)
                if not (isinstance(f, int | float) and 0 < f <= 1):
                    raise InputError(self.source, f"{where}.{g}",
                                     "a fraction of the calls in (0, 1]", f)
                seen[g] = m
            total = math.fsum(parts.values())
            if abs(total - 1.0) > SPLIT_TOL:
                raise InputError(self.source, where, "fractions of its calls that sum to 1",
                                 total)
        object.__setattr__(self, "splits", MappingProxyType(
            {m: MappingProxyType(dict(sorted(v.items()))) for m, v in sorted(self.splits.items())}))
        self._check_meshes()

    def _check_lengths(self) -> None:
        out = {}
        for m, ranges in self.lengths.items():
            where = f"lengths.{m}"
            if m not in self.splits:
                raise InputError(self.source, where, "an LLM of `splits` (length routing "
                                 "chooses among its groups)", m)
            if set(ranges) != set(self.splits[m]):
                raise InputError(self.source, where, f"a range for each of its groups "
                                 f"({', '.join(sorted(self.splits[m]))})", sorted(ranges))
            clean: dict[str, tuple[int, int | None]] = {}
            for g, r in ranges.items():
                lo, hi = tuple(r) if isinstance(r, list | tuple) and len(r) == 2 else (-1, 0)
                if not (isinstance(lo, int) and _tokens(lo) and lo >= 0
                        and (hi is None or _tokens(hi))):
                    raise InputError(self.source, f"{where}.{g}", "[lo, hi]: input tokens, "
                                     "integers lo >= 0 and hi > lo, or hi null", r)
                clean[g] = (lo, hi)
            check_ranges(clean, self.source, where)
            out[m] = MappingProxyType(dict(sorted(clean.items())))
        object.__setattr__(self, "lengths", MappingProxyType(dict(sorted(out.items()))))

    def _check_meshes(self) -> None:
        """The LLMs of a mesh run on the same GPUs: one GPU type and TP degree, one replica
        each, and memory parts given that add up to at most the GPUs' memory."""
        for mesh, names in self.meshes().items():
            first = self.llms[names[0]]
            for m in names:
                inst, where = self.llms[m], f"llms.{m}"
                if (inst.gpu, inst.tp) != (first.gpu, first.tp):
                    raise InputError(self.source, f"{where}.mesh", f"the GPU type and TP degree "
                                     f"of the rest of mesh {mesh} ({first.gpu}, tp {first.tp})",
                                     (inst.gpu, inst.tp))
                if inst.replicas != 1:
                    raise InputError(self.source, f"{where}.replicas", "1 (a mesh is one set of "
                                     "GPUs; give each replica its own mesh)", inst.replicas)
                if inst.memory is None:
                    raise InputError(self.source, f"{where}.memory", "its part of the mesh's "
                                     "memory (MPS limits compute only)")
                if any(m in parts for parts in self.splits.values()):
                    raise InputError(self.source, f"{where}.mesh", "an LLM that is not a replica "
                                     "group of a split LLM")
            total = sum(self.llms[m].memory or 0.0 for m in names)
            if total > 1 + SPLIT_TOL:
                raise InputError(self.source, f"llms.{names[-1]}.memory", f"memory parts of mesh "
                                 f"{mesh} that add up to at most 1", round(total, 6))

    def require_partitions(self, what: str) -> None:
        """Refuse LLMs that share a mesh or have their own prefill limit: ``what`` (planning,
        placement) treats every share as a partition of its GPUs."""
        for m, inst in self.llms.items():
            if inst.mesh is not None or inst.prefill_share is not None:
                field_ = "mesh" if inst.mesh is not None else "prefill_share"
                raise InputError(self.source, f"llms.{m}.{field_}", f"shares that partition "
                                 f"their GPUs ({what} does not take MPS meshes or prefill limits; "
                                 "scepsy predict and scepsy simulate do)")

    def meshes(self) -> dict[str, tuple[str, ...]]:
        """Mesh name -> the LLMs that share its GPUs (sorted; LLMs outside meshes left out)."""
        out: dict[str, list[str]] = {}
        for m, inst in self.llms.items():
            if inst.mesh is not None:
                out.setdefault(inst.mesh, []).append(m)
        return {k: tuple(sorted(v)) for k, v in sorted(out.items())}

    def models(self, models: Mapping[str, str]) -> dict[str, str]:
        """``models`` (LLM -> catalog model) with every replica group of a split LLM running
        that LLM's model."""
        out = dict(models)
        for m, parts in self.splits.items():
            if m in models:
                out.update(dict.fromkeys(parts, models[m]))
        return out

    def serving(self, llm: str) -> tuple[tuple[str, float], ...]:
        """The entries of ``llms`` that serve ``llm``'s calls and the fraction each gets."""
        return tuple(self.splits[llm].items()) if llm in self.splits else ((llm, 1.0),)

    def gpus(self, gpu: str | None = None) -> float:
        """GPU capacity used in total (or of one GPU type); a mesh counts its ``tp`` GPUs once."""
        alone = sum(i.gpus for i in self.llms.values()
                    if i.mesh is None and (gpu is None or i.gpu == gpu))
        shared = sum(self.llms[names[0]].tp for names in self.meshes().values()
                     if gpu is None or self.llms[names[0]].gpu == gpu)
        return alone + shared

    def to_dict(self) -> dict:
        out: dict = {"llms": {name: _instance_dict(i) for name, i in self.llms.items()}}
        if self.splits:
            out["splits"] = {m: dict(v) for m, v in self.splits.items()}
        if self.lengths:
            out["lengths"] = {m: {g: list(r) for g, r in v.items()}
                              for m, v in self.lengths.items()}
        return out


def _tokens(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _instance_dict(i: Instance) -> dict:
    out: dict = {"gpu": i.gpu, "tp": i.tp, "share": i.share, "replicas": i.replicas}
    if i.memory is not None:
        out["memory"] = i.memory
    if i.prefill_share is not None:
        out["prefill_share"] = i.prefill_share
    if i.mesh is not None:
        out["mesh"] = i.mesh
    return out


SPLIT_TOL = 1e-6
"""A split LLM's fractions sum to 1 within this."""

MAX_REPLICAS = 100_000
"""The most replicas one LLM of an allocation file may have."""


class _InstanceRec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    gpu: str = Field(min_length=1)
    tp: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    share: float = Field(gt=0, le=1)
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    memory: float | None = Field(default=None, gt=0, le=1)
    prefill_share: float | None = Field(default=None, gt=0, le=1)
    mesh: Name | None = None


class _AllocationRec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    llms: dict[Name, _InstanceRec] = Field(min_length=1)
    splits: dict[Name, dict[Name, float]] | None = None
    lengths: dict[Name, dict[Name, list[int | None]]] | None = None


def is_plan_document(raw: object) -> bool:
    """Whether ``raw`` is a plan.json document (``scepsy plan --out``) rather than an
    allocation document."""
    return isinstance(raw, dict) and "optimiser" in raw and "status" in raw


def parse_allocation(raw: object, source: str, catalog: Catalog | None = None) -> Allocation:
    """An allocation document, or a plan.json (its ``allocation``); GPU names must be catalog
    GPU types (aliases resolved), every error names ``source`` and the field."""
    prefix = ""
    if is_plan_document(raw):
        assert isinstance(raw, dict)
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
        llms[name] = Instance(gpu.name, r.tp, r.share, r.replicas, r.memory, r.prefill_share,
                              r.mesh)
    try:
        return Allocation(llms, source, rec.splits or {},
                          rec.lengths or {})  # type: ignore[arg-type]  # checked there
    except InputError as exc:  # name the field where it sits in the document
        raise InputError(source, prefix + exc.field, exc.expected, exc.got) from None


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
            else dump_yaml(doc, sort_keys=True))
    atomic_write_text(p, text)
