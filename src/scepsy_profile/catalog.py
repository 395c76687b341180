"""The hardware and model catalog: named :class:`GPUSpec` and :class:`ModelSpec` entries.

The package ships one catalog (``scepsy_profile/data/catalog.yaml``, read by
:func:`default_catalog`); users extend or override it with their own YAML file of the same shape::

    gpus:
      <name>: {memory_gib: ..., bf16_tflops: ..., hbm_gbps: ..., nvlink_domain: ...,
               interconnect_gbps: ..., [price_per_hour]}
    models:
      <name>: {family: ..., layers: ..., hidden: ..., heads: ..., kv_heads: ...,
               intermediate: ..., vocab: ..., max_context: ..., [dtype_bytes, gated_mlp,
               tied_embeddings, kind, output_head]}
    aliases:
      <alias>: <model name>

Names are case-insensitive identities: ``gpu("h100-80gb")`` finds ``H100-80GB``, and a user entry
``LLaMA-7B`` replaces the bundled ``llama-7b``. Aliases (for instance Hugging Face ids) resolve
to canonical model names, also case-insensitively.

A GPU entry's optional ``price_per_hour`` (USD per GPU-hour, what the min-cost objective of
``scepsy_opt.planning.mincost`` minimises) is kept beside its :class:`GPUSpec` in :attr:`Catalog.prices`;
the bundled prices are public list prices, defaults to override (docs/catalog.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, create_model

from scepsy_common.errors import InputError, UnknownEntryError, validated
from scepsy_common.files import atomic_write_text, dump_yaml, parse_yaml, read_text
from scepsy_profile.hardware import GPUSpec
from scepsy_profile.models import ModelKind, ModelSpec, OutputHead, shape_record_fields

BUNDLED_CATALOG = "data/catalog.yaml"
"""Path of the bundled catalog inside the ``scepsy_profile`` package."""

_SUGGESTIONS = 3


def _key(name: str) -> str:
    return name.strip().casefold()


def _sorted(entries: Mapping[str, Any]) -> dict[str, Any]:
    return {k: entries[k] for k in sorted(entries, key=lambda n: (n.casefold(), n))}


@dataclass(frozen=True, repr=False)
class Catalog:
    """Immutable set of GPUs, models and model aliases, with case-insensitive lookup.

    ``gpus`` and ``models`` map each entry's own ``name`` to it; ``aliases`` maps an alternative
    model name (e.g. ``meta-llama/Llama-2-7b-hf``) to a canonical model name. The mappings are
    stored sorted and read-only. Build variants with :meth:`with_gpu`, :meth:`with_model` and
    :meth:`merge`. ``prices`` maps a GPU's name to its price per GPU-hour (USD, optional per GPU).
    """

    gpus: Mapping[str, GPUSpec] = field(default_factory=dict)
    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    prices: Mapping[str, float] = field(default_factory=dict)
    _gpu_index: Mapping[str, str] = field(init=False, compare=False)
    _model_index: Mapping[str, str] = field(init=False, compare=False)
    _alias_index: Mapping[str, str] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        gpu_index = _check_entries(self.gpus, GPUSpec, "gpus")
        model_index = _check_entries(self.models, ModelSpec, "models")
        if not isinstance(self.aliases, Mapping):
            raise InputError("catalog", "aliases", "a mapping of alias -> model name")
        aliases: dict[str, str] = {}
        alias_index: dict[str, str] = {}
        for alias, target in self.aliases.items():
            where = f"aliases.{alias}"
            if not isinstance(alias, str) or not alias or alias != alias.strip():
                raise InputError("catalog", where, "an alias without surrounding spaces", alias)
            key = _key(alias)
            if key in model_index:
                raise InputError("catalog", where,
                                 f"an alias that is not also a model name ({model_index[key]!r})")
            if key in alias_index:
                raise InputError("catalog", where, "an alias that is unique ignoring case "
                                 f"(it repeats {alias_index[key]!r})")
            if not isinstance(target, str) or _key(target) not in model_index:
                near = _closest(target if isinstance(target, str) else "", model_index)
                hint = f"; closest: {', '.join(map(repr, near))}" if near else ""
                raise InputError("catalog", where, f"the name of a model in the catalog{hint}",
                                 target)
            aliases[alias] = model_index[_key(target)]
            alias_index[key] = alias
        if not isinstance(self.prices, Mapping):
            raise InputError("catalog", "prices", "a mapping of GPU name -> price per GPU-hour")
        for name, usd in self.prices.items():
            if name not in self.gpus:
                raise InputError("catalog", f"prices.{name}", "the name of a GPU of the catalog",
                                 name)
            _check_price(usd, "catalog", f"gpus.{name}.price_per_hour")
        object.__setattr__(self, "prices", MappingProxyType(
            _sorted({n: float(v) for n, v in self.prices.items()})))
        object.__setattr__(self, "gpus", MappingProxyType(_sorted(self.gpus)))
        object.__setattr__(self, "models", MappingProxyType(_sorted(self.models)))
        object.__setattr__(self, "aliases", MappingProxyType(_sorted(aliases)))
        object.__setattr__(self, "_gpu_index", MappingProxyType(gpu_index))
        object.__setattr__(self, "_model_index", MappingProxyType(model_index))
        object.__setattr__(
            self, "_alias_index", MappingProxyType({k: aliases[a] for k, a in alias_index.items()})
        )

    def __repr__(self) -> str:
        return (f"Catalog({len(self.gpus)} GPUs, {len(self.models)} models, "
                f"{len(self.aliases)} aliases)")

    def __reduce__(self) -> tuple[Any, ...]:  # mappingproxy does not pickle; rebuild from dicts
        return (Catalog, (dict(self.gpus), dict(self.models), dict(self.aliases),
                          dict(self.prices)))

    # -- lookup -------------------------------------------------------------------------------

    def gpu(self, name: str) -> GPUSpec:
        """The GPU called ``name`` (case-insensitive), or :class:`UnknownEntryError`."""
        canonical = self._gpu_index.get(_key(name)) if isinstance(name, str) else None
        if canonical is None:
            raise _unknown("GPU", name, self._gpu_index)
        return self.gpus[canonical]

    def model(self, name: str) -> ModelSpec:
        """The model called ``name`` or aliased as ``name`` (case-insensitive).

        Canonical names win over aliases; an unknown name raises :class:`UnknownEntryError`
        with the closest known names and aliases.
        """
        if isinstance(name, str):
            key = _key(name)
            canonical = self._model_index.get(key) or self._alias_index.get(key)
            if canonical is not None:
                return self.models[canonical]
        known = dict(self._model_index)
        known.update((k, a) for k, a in ((_key(a), a) for a in self.aliases))
        raise _unknown("model", name, known)

    def price(self, gpu: str) -> float | None:
        """The price per GPU-hour (USD) of GPU ``gpu`` (any case), None when the catalog has none."""
        return self.prices.get(self.gpu(gpu).name)

    def has_gpu(self, name: str) -> bool:
        """Whether :meth:`gpu` would find ``name``."""
        return isinstance(name, str) and _key(name) in self._gpu_index

    def has_model(self, name: str) -> bool:
        """Whether :meth:`model` would find ``name``."""
        return isinstance(name, str) and (
            _key(name) in self._model_index or _key(name) in self._alias_index
        )

    def aliases_of(self, model: str) -> tuple[str, ...]:
        """The aliases that resolve to ``model`` (a name or alias), sorted."""
        canonical = self.model(model).name
        return tuple(a for a, target in self.aliases.items() if target == canonical)

    # -- derivation ---------------------------------------------------------------------------

    def with_gpu(self, spec: GPUSpec, price_per_hour: float | None = None) -> Catalog:
        """A new catalog with ``spec`` (and its price per GPU-hour, if given) added, replacing
        any GPU of the same name (any case) and its price."""
        prices = {spec.name: price_per_hour} if price_per_hour is not None else {}
        return self.merge(Catalog(gpus={spec.name: spec}, prices=prices))

    def with_model(self, spec: ModelSpec, aliases: Iterable[str] = ()) -> Catalog:
        """A new catalog with ``spec`` (and ``aliases`` for it) added or replacing its namesake."""
        return self.merge(Catalog(models={spec.name: spec}, aliases=dict.fromkeys(aliases,
                                                                                   spec.name)))

    def merge(self, override: Catalog) -> Catalog:
        """A new catalog with ``override``'s entries added to this one's, ``override`` winning.

        Entries match by name ignoring case, and an entry is replaced whole (no field-by-field
        merge; a replaced GPU keeps no price unless ``override`` gives one). An alias of this
        catalog that ``override`` defines as a model name is dropped;
        aliases that pointed at a replaced model now point at the replacement.
        """
        if not isinstance(override, Catalog):
            raise TypeError(f"can only merge a Catalog, not {type(override).__name__}")
        return _merge(self, override.gpus, override.models, override.aliases, override.prices)


def _merge(
    base: Catalog,
    gpus: Mapping[str, GPUSpec],
    models: Mapping[str, ModelSpec],
    aliases: Mapping[str, str],
    prices: Mapping[str, float] | None = None,
) -> Catalog:
    """``base`` with the given entries added or replacing theirs (see :meth:`Catalog.merge`).

    The new entries are only checked as part of the result, so their aliases may point at
    ``base``'s models.
    """
    new_gpus = {_key(n) for n in gpus}
    new_models = {_key(n) for n in models}
    new_aliases = {_key(a) for a in aliases}
    all_gpus = {n: g for n, g in base.gpus.items() if _key(n) not in new_gpus}
    all_gpus.update(gpus)
    all_models = {n: m for n, m in base.models.items() if _key(n) not in new_models}
    all_models.update(models)
    all_aliases = {
        a: t for a, t in base.aliases.items()
        if _key(a) not in new_models and _key(a) not in new_aliases
    }
    all_aliases.update(aliases)
    all_prices = {n: p for n, p in base.prices.items() if _key(n) not in new_gpus}
    all_prices.update(prices or {})
    return Catalog(gpus=all_gpus, models=all_models, aliases=all_aliases, prices=all_prices)


def _check_price(value: object, source: str, field_: str) -> None:
    """An :class:`InputError` unless ``value`` is a finite price >= 0 (USD per GPU-hour)."""
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and math.isfinite(value) and value >= 0)
    if not ok:
        raise InputError(source, field_, "a price >= 0 USD per GPU-hour", value)


class _Named(Protocol):
    @property
    def name(self) -> str: ...


def _check_entries(entries: object, cls: type[_Named], section: str) -> dict[str, str]:
    """Check ``name -> spec`` entries and return the case-folded index ``key -> name``."""
    if not isinstance(entries, Mapping):
        raise InputError("catalog", section, f"a mapping of name -> {cls.__name__}")
    index: dict[str, str] = {}
    for name, spec in entries.items():
        if not isinstance(spec, cls):
            raise InputError("catalog", f"{section}.{name}", f"a {cls.__name__}", spec)
        if name != spec.name:
            raise InputError("catalog", f"{section}.{name}", "an entry whose name is its key",
                             spec.name)
        key = _key(name)
        if key in index:
            raise InputError("catalog", f"{section}.{name}",
                             f"a name that is unique ignoring case (it repeats {index[key]!r})")
        index[key] = name
    return index


def _closest(name: str, index: Mapping[str, str]) -> list[str]:
    hits = difflib.get_close_matches(_key(name), list(index), n=_SUGGESTIONS, cutoff=0.5)
    return [index[h] for h in hits]


def _unknown(kind: str, name: object, index: Mapping[str, str]) -> UnknownEntryError:
    near = _closest(name, index) if isinstance(name, str) else []
    if near:
        hint = f"did you mean {', '.join(map(repr, near))}?"
    else:
        names = sorted(set(index.values()), key=str.casefold)
        hint = "known: " + ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    err = UnknownEntryError("catalog", f"unknown {kind} {name!r}", f"a known {kind} name; {hint}")
    err.kind = kind  # type: ignore[attr-defined]
    err.name = name  # type: ignore[attr-defined]
    err.suggestions = tuple(near)  # type: ignore[attr-defined]
    return err


# -- file format --------------------------------------------------------------------------------


class _GPURecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    memory_gib: float = Field(gt=0, allow_inf_nan=False)
    bf16_tflops: float = Field(gt=0, allow_inf_nan=False)
    hbm_gbps: float = Field(gt=0, allow_inf_nan=False)
    nvlink_domain: int = Field(ge=1)
    interconnect_gbps: float = Field(gt=0, allow_inf_nan=False)
    price_per_hour: float | None = Field(default=None, ge=0, allow_inf_nan=False)


_ModelRecord = create_model(  # a ModelSpec less its name: the shape's fields from models.py
    "_ModelRecord",
    __config__=ConfigDict(extra="forbid", frozen=True, strict=True),
    family=(str, Field(min_length=1)),
    **shape_record_fields(),
    dtype_bytes=(int, Field(default=2, ge=1)),
    gated_mlp=(bool, True),
    tied_embeddings=(bool, False),
    kind=(ModelKind, "decoder"),
    output_head=(OutputHead, "lm"),
)


class _CatalogFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    gpus: dict[str, _GPURecord] | None = None
    models: dict[str, _ModelRecord] | None = None  # type: ignore[valid-type]
    aliases: dict[str, str] | None = None


_RECORDS: dict[str, type[BaseModel]] = {"gpus": _GPURecord, "models": _ModelRecord}


def load_catalog(path: str | os.PathLike[str], base: Catalog | None = None) -> Catalog:
    """Read a catalog YAML file; with ``base``, the file's entries extend or override it.

    Pass ``base=default_catalog()`` for a user file whose aliases point at bundled models.
    Every problem is an :class:`InputError` naming the file and the field, e.g.
    ``gpus.A100-80GB.memory_gib: expected a number > 0``.
    """
    p = Path(path)
    return parse_catalog(read_text(p, "catalog file (.yaml)"), str(p), base)


def parse_catalog(text: str, source: str = "<catalog>", base: Catalog | None = None) -> Catalog:
    """Parse catalog YAML ``text``; ``source`` names it in errors. See :func:`load_catalog`."""
    raw = parse_yaml(text, source)
    if not isinstance(raw, dict):
        raise InputError(source, "", "a YAML mapping with keys gpus, models and/or aliases",
                         None if raw is None else type(raw).__name__)
    doc = validated(_CatalogFile, raw, source, allowed=_allowed_fields)
    gpus: dict[str, GPUSpec] = {}
    models: dict[str, ModelSpec] = {}
    prices: dict[str, float] = {}
    for name, grec in (doc.gpus or {}).items():
        gpus[name] = _build(GPUSpec, name, grec, source, "gpus", exclude={"price_per_hour"})
        if grec.price_per_hour is not None:
            prices[name] = grec.price_per_hour
    for name, mrec in (doc.models or {}).items():
        models[name] = _build(ModelSpec, name, mrec, source, "models")
    try:
        return _merge(base if base is not None else Catalog(), gpus, models, doc.aliases or {},
                      prices)
    except InputError as exc:
        raise InputError(source, exc.field, exc.expected, exc.got) from None


def _build(cls: type, name: str, rec: BaseModel, source: str, section: str,
           exclude: set[str] | None = None) -> Any:
    try:
        return cls(name=name, **rec.model_dump(exclude=exclude))
    except InputError as exc:
        raise InputError(source, f"{section}.{name}.{exc.field}", exc.expected, exc.got) from None


def _allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    """Valid field names for an unknown-field error at ``loc`` (top level or inside an entry)."""
    if len(loc) == 1:
        return list(_CatalogFile.model_fields)
    record = _RECORDS.get(str(loc[0])) if len(loc) == 3 else None
    return list(record.model_fields) if record else []


# -- writing ------------------------------------------------------------------------------------


def dump_catalog(catalog: Catalog) -> str:
    """The catalog as deterministic YAML (sorted names, fields in declaration order)."""
    def entry(spec: Any) -> dict[str, Any]:
        return {f.name: getattr(spec, f.name) for f in fields(spec) if f.name != "name"}

    def gpu_entry(name: str, spec: GPUSpec) -> dict[str, Any]:
        out = entry(spec)
        if name in catalog.prices:
            out["price_per_hour"] = catalog.prices[name]
        return out

    doc = {
        "gpus": {name: gpu_entry(name, spec) for name, spec in catalog.gpus.items()},
        "models": {name: entry(spec) for name, spec in catalog.models.items()},
        "aliases": dict(catalog.aliases),
    }
    body = dump_yaml(doc, sort_keys=False, default_flow_style=False, allow_unicode=True,
                          width=100)
    return "# scepsy hardware and model catalog (written by scepsy_profile.save_catalog)\n" + body


def save_catalog(catalog: Catalog, path: str | os.PathLike[str]) -> None:
    """Write ``catalog`` to ``path`` as YAML that :func:`load_catalog` reads back, atomically."""
    atomic_write_text(path, dump_catalog(catalog))


@functools.cache
def bundled_catalog() -> Catalog:
    """The bundled catalog (``scepsy_profile/data/catalog.yaml``), parsed once and cached."""
    text = resources.files("scepsy_profile").joinpath(BUNDLED_CATALOG).read_text(encoding="utf-8")
    return parse_catalog(text, f"scepsy_profile/{BUNDLED_CATALOG}")


_IN_FORCE: contextvars.ContextVar[Catalog | None] = contextvars.ContextVar(
    "scepsy_catalog_in_force", default=None)


def default_catalog() -> Catalog:
    """The catalog every lookup uses where none is passed down: the bundled one
    (:func:`bundled_catalog`), or within :func:`catalog_in_force` the catalog given there."""
    cat = _IN_FORCE.get()
    return cat if cat is not None else bundled_catalog()


@contextlib.contextmanager
def catalog_in_force(catalog: Catalog | None) -> Iterator[Catalog]:
    """Within the block (this thread or task only: a context variable), :func:`default_catalog`
    is ``catalog`` (usually the bundled one extended by a user's file, :func:`load_catalog`).
    ``None`` changes nothing. Yields the catalog in force."""
    if catalog is None:
        yield default_catalog()
        return
    token = _IN_FORCE.set(catalog)
    try:
        yield catalog
    finally:
        _IN_FORCE.reset(token)
