"""Workflow definitions and synthetic trace generators (docs/workflows.md).

A workflow YAML file names a *program* (the shape of the agentic workflow: RAG, beam search, a
coding agent), the catalog model behind each of its LLMs, latency distributions for its tools,
and distributions for the program's data-dependent quantities (token lengths, fan-out, rounds)::

    name: rag
    program: rag
    reference_gpu: A100-80GB          # the GPU that times LLM calls (zero load, tp=1, share=1)
    llms: {rewriter: qwen2.5-1.5b, reranker: bge-reranker-large, generator: qwen2.5-7b}
    tools:
      retrieval: {kind: lognormal, mean: 0.08, cv: 0.5}
    params:
      query_tokens: {kind: lognormal, mean: 40, cv: 0.6, min: 4, max: 128}
      rerank_k: {kind: poisson, mean: 20, min: 5, max: 40}
      top_n: 5
      ...

:func:`generate_trace` runs the program once per request and returns the calls as
:class:`~scepsy_opt.traces.CallRecord` values, the same records a proxy in front of real LLM
endpoints would log (docs/traces.md). Everything is deterministic for a given seed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Protocol, TypeGuard, cast

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field
from scipy.stats import poisson as _poisson

from scepsy_common.errors import InputError, Name, check_name, validated
from scepsy_common.files import read_yaml
from scepsy_opt.traces import CallRecord
from scepsy_profile.catalog import default_catalog
from scepsy_profile.latency import LatencyModel
from scepsy_profile.roofline import roofline_model

DistKind = Literal["constant", "lognormal", "exponential", "poisson", "geometric", "uniform",
                   "choice", "empirical"]

_KIND_PARAMS: dict[str, tuple[str, ...]] = {
    "constant": ("value",),
    "lognormal": ("mean", "cv"),
    "exponential": ("mean",),
    "poisson": ("mean",),
    "geometric": ("mean",),
    "uniform": ("low", "high"),
    "choice": ("values", "weights"),
    "empirical": ("values",),
}
_OPTIONAL_PARAMS = {"weights"}
_LIST_PARAMS = {"values", "weights"}
KINDS: tuple[str, ...] = tuple(_KIND_PARAMS)
"""The distribution kinds a workflow file may name."""

DEFAULT_REFERENCE_GPU = "A100-80GB"
MAX_PARAM_MEAN = 1e6
"""The largest mean a workflow's param or tool distribution may have (tokens, seconds, counts)."""
MAX_CALLS_PER_REQUEST = 100_000
"""The most calls one generated request may make (a fan-out or loop count larger than this is
an error, raised before its calls are built)."""
MAX_REQUESTS = 100_000
"""The most requests :func:`generate_trace` generates per workflow."""
DEFAULT_TRACE_REQUESTS = 2000
"""Requests per workflow of a generated trace (``--trace-requests``, ``trace_requests=``)."""
MAX_TRACE_CALLS = 5_000_000
"""The most calls :func:`generate_trace` generates in all (checked after each request)."""
JITTER_CV = 0.1
"""Coefficient of variation of the log-normal jitter on every LLM call's duration."""


# ============================================================================ distributions


def _phi(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _lognormal_shape(mean: float, cv: float) -> tuple[float, float]:
    """``(mu, sigma)`` of the underlying normal for a log-normal of this mean and cv."""
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.log(mean) - sigma * sigma / 2.0, sigma


@dataclass(frozen=True)
class Distribution:
    """A random quantity of a workflow: a token length, a fan-out, a tool's latency in seconds.

    ``kind`` and its ``params``:

    * ``constant``: ``value``;
    * ``lognormal``: ``mean`` (> 0) and ``cv`` (>= 0, standard deviation / mean);
    * ``exponential``: ``mean`` (> 0), positive reals (cv 1: the memoryless length
      distribution of the MuxServe / AlpaServe request generators);
    * ``poisson``: ``mean`` (>= 0), values 0, 1, 2, ...;
    * ``geometric``: ``mean`` (>= 1), values 1, 2, 3, ... (trials up to the first success, p =
      1/mean): the number of rounds of a loop that stops with a fixed probability each round;
    * ``uniform``: ``low`` <= ``high``, continuous;
    * ``choice``: ``values`` and optional ``weights`` (relative, default equal);
    * ``empirical``: ``values``, resampled uniformly (e.g. Mooncake token lengths,
      :mod:`scepsy_opt.ingest.mooncake`).

    ``min``/``max`` clip every sample. :meth:`mean` is exact for every kind, clipping included
    (closed forms; see :meth:`_mean_min`). Samples are floats; programs round counts and token
    lengths to the nearest integer, which moves their mean by far less than sampling error for
    the smooth distributions used here (a point mass at a clamp is an integer already).
    """

    kind: DistKind
    params: Mapping[str, Any]
    min: float | None = None
    max: float | None = None
    _arrays: Mapping[str, NDArray[np.float64]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        src = "distribution"
        if not isinstance(self.kind, str) or self.kind not in _KIND_PARAMS:
            raise InputError(src, "kind", f"one of {', '.join(KINDS)}", self.kind)
        if not isinstance(self.params, Mapping):
            raise InputError(src, "params", "a mapping of parameter -> value", self.params)
        allowed = _KIND_PARAMS[self.kind]
        for name in self.params:
            if name not in allowed:
                raise InputError(src, str(name), f"no such parameter of a {self.kind} distribution"
                                 f" (unknown field); allowed: {', '.join(allowed)}")
        params: dict[str, Any] = {}
        arrays: dict[str, NDArray[np.float64]] = {}
        for name in allowed:
            if name not in self.params:
                if name in _OPTIONAL_PARAMS:
                    continue
                raise InputError(src, name, "a value (field is missing)")
            value = self.params[name]
            if name in _LIST_PARAMS:
                values = _number_tuple(value, name)
                params[name] = values
                arrays[name] = np.array(values, dtype=float)
                arrays[name].setflags(write=False)
            else:
                params[name] = _number(value, name)
        for bound in ("min", "max"):
            v = getattr(self, bound)
            if v is not None:
                object.__setattr__(self, bound, _number(v, bound))
        if self.min is not None and self.max is not None and self.min > self.max:
            raise InputError(src, "max", f"a number >= min ({self.min:g})", self.max)
        _check_ranges(self.kind, params, arrays)
        if self.kind == "choice" and "weights" not in params:
            params["weights"] = (1.0,) * len(params["values"])
            arrays["weights"] = np.ones(len(params["values"]))
        if "weights" in arrays:
            arrays["p"] = arrays["weights"] / arrays["weights"].sum()
        object.__setattr__(self, "params", MappingProxyType(params))
        object.__setattr__(self, "_arrays", MappingProxyType(arrays))

    def __hash__(self) -> int:
        return hash((self.kind, tuple(self.params.items()), self.min, self.max))

    def __repr__(self) -> str:
        def fmt(v: Any) -> str:
            if isinstance(v, tuple) and len(v) > 6:
                return f"({', '.join(f'{x:g}' for x in v[:3])}, ... {len(v)} values)"
            return f"{v:g}" if isinstance(v, float) else repr(v)
        parts = [f"{k}={fmt(v)}" for k, v in self.params.items()]
        parts += [f"{b}={getattr(self, b):g}" for b in ("min", "max") if getattr(self, b) is not None]
        return f"Distribution.{self.kind}({', '.join(parts)})"

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def constant(cls, value: float) -> Distribution:
        return cls("constant", {"value": value})

    @classmethod
    def lognormal(cls, mean: float, cv: float, *, min: float | None = None,
                  max: float | None = None) -> Distribution:
        return cls("lognormal", {"mean": mean, "cv": cv}, min, max)

    @classmethod
    def exponential(cls, mean: float, *, min: float | None = None,
                    max: float | None = None) -> Distribution:
        """An exponential distribution of mean ``mean`` (> 0), clipped to ``[min, max]``."""
        return cls("exponential", {"mean": mean}, min, max)

    @classmethod
    def poisson(cls, mean: float, *, min: float | None = None,
                max: float | None = None) -> Distribution:
        return cls("poisson", {"mean": mean}, min, max)

    @classmethod
    def geometric(cls, mean: float, *, min: float | None = None,
                  max: float | None = None) -> Distribution:
        return cls("geometric", {"mean": mean}, min, max)

    @classmethod
    def uniform(cls, low: float, high: float, *, min: float | None = None,
                max: float | None = None) -> Distribution:
        return cls("uniform", {"low": low, "high": high}, min, max)

    @classmethod
    def choice(cls, values: Sequence[float], weights: Sequence[float] | None = None, *,
               min: float | None = None, max: float | None = None) -> Distribution:
        params: dict[str, Any] = {"values": tuple(values)}
        if weights is not None:
            params["weights"] = tuple(weights)
        return cls("choice", params, min, max)

    @classmethod
    def empirical(cls, values: Sequence[float] | NDArray[Any], *, min: float | None = None,
                  max: float | None = None) -> Distribution:
        return cls("empirical", {"values": tuple(np.asarray(values, dtype=float).tolist())},
                   min, max)

    # -- use ----------------------------------------------------------------------------------

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...] | None = None) -> Any:
        """One float (``size=None``) or a float array of shape ``size``, clipped."""
        p, a = self.params, self._arrays
        if self.kind == "constant":
            x = np.full(size, p["value"]) if size is not None else p["value"]
        elif self.kind == "lognormal" and p["cv"] == 0:
            x = np.full(size, p["mean"]) if size is not None else p["mean"]
        elif self.kind == "lognormal":
            mu, sigma = _lognormal_shape(p["mean"], p["cv"])
            x = rng.lognormal(mu, sigma, size)
        elif self.kind == "exponential":
            x = rng.exponential(p["mean"], size)
        elif self.kind == "poisson":
            x = rng.poisson(p["mean"], size)
        elif self.kind == "geometric":
            x = rng.geometric(1.0 / p["mean"], size)
        elif self.kind == "uniform":
            x = rng.uniform(p["low"], p["high"], size)
        elif self.kind == "choice":
            x = a["values"][rng.choice(len(a["values"]), size, p=a["p"])]
        else:  # empirical
            x = a["values"][rng.integers(0, len(a["values"]), size)]
        if size is None:
            x = float(x)
            if self.min is not None and x < self.min:
                x = self.min
            return self.max if self.max is not None and x > self.max else x
        if self.min is not None or self.max is not None:
            x = np.clip(x, self.min, self.max)
        return np.asarray(x, dtype=float)

    def mean(self) -> float:
        """The exact mean after clipping: ``E[clip(X, a, b)] = E[min(X,b)] − E[min(X,a)] + a``."""
        hi = math.inf if self.max is None else self.max
        if self.min is None:
            return self._mean_min(hi)
        return self._mean_min(hi) - self._mean_min(self.min) + self.min

    def support(self) -> tuple[float, float]:
        """The smallest and largest value a sample can take (``inf`` when unbounded)."""
        p = self.params
        lo, hi = {
            "constant": lambda: (p["value"], p["value"]),
            "lognormal": lambda: (0.0, math.inf) if p["cv"] > 0 else (p["mean"], p["mean"]),
            "exponential": lambda: (0.0, math.inf),
            "poisson": lambda: (0.0, math.inf) if p["mean"] > 0 else (0.0, 0.0),
            "geometric": lambda: (1.0, math.inf) if p["mean"] > 1 else (1.0, 1.0),
            "uniform": lambda: (p["low"], p["high"]),
            "choice": lambda: (min(p["values"]), max(p["values"])),
            "empirical": lambda: (min(p["values"]), max(p["values"])),
        }[self.kind]()

        def clip(v: float) -> float:
            if self.min is not None:
                v = max(v, self.min)
            return v if self.max is None else min(v, self.max)
        return clip(lo), clip(hi)

    def _mean_min(self, c: float) -> float:
        """``E[min(X, c)]`` of the unclipped distribution, in closed form.

        log-normal: ``m·Φ((ln c − μ − σ²)/σ) + c·(1 − Φ((ln c − μ)/σ))``; exponential (mean
        m): ``m·(1 − e^(−c/m))`` for ``c > 0``; Poisson (λ), with
        ``n = ⌊c⌋``: ``λ − λ·P(K ≥ n) + n·P(K > n) + (c − n)·P(K > n)``; geometric (p):
        ``(1 − qⁿ)/p + (c − n)·qⁿ``, ``q = 1 − p``; uniform: the integral; discrete values: the
        weighted sum.
        """
        p = self.params
        k = self.kind
        if k == "constant":
            return min(p["value"], c)
        if k == "lognormal":
            m = p["mean"]
            if c == math.inf:
                return m
            if c <= 0:
                return c
            if p["cv"] == 0:
                return min(m, c)
            mu, s = _lognormal_shape(m, p["cv"])
            lc = math.log(c)
            return m * _phi((lc - mu - s * s) / s) + c * (1.0 - _phi((lc - mu) / s))
        if k == "exponential":
            m = p["mean"]
            if c == math.inf:
                return m
            return c if c <= 0 else m * -math.expm1(-c / m)
        if k == "poisson":
            lam = p["mean"]
            if c == math.inf:
                return lam
            if c <= 0:
                return c
            n = math.floor(c)
            sf_n = float(_poisson.sf(n, lam))
            return lam - lam * float(_poisson.sf(n - 1, lam)) + n * sf_n + (c - n) * sf_n
        if k == "geometric":
            m = p["mean"]
            if c == math.inf:
                return m
            if c <= 1:
                return c
            q = 1.0 - 1.0 / m
            n = math.floor(c)
            return (1.0 - q**n) * m + (c - n) * q**n
        if k == "uniform":
            lo, hi = p["low"], p["high"]
            if c <= lo:
                return c
            if c >= hi:
                return (lo + hi) / 2.0
            return ((c * c - lo * lo) / 2.0 + c * (hi - c)) / (hi - lo)
        weights = self._arrays["p"] if k == "choice" else None
        values = self._arrays["values"]
        return float(np.average(np.minimum(values, c), weights=weights))


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InputError("distribution", name, "a number", value)
    v = float(value)
    if not math.isfinite(v):
        raise InputError("distribution", name, "a finite number", value)
    return v


def _number_tuple(value: Any, name: str) -> tuple[float, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | np.ndarray):
        raise InputError("distribution", name, "a list of numbers", value)
    values = tuple(_number(v, f"{name}[{i}]") for i, v in enumerate(value))
    if not values:
        raise InputError("distribution", name, "a non-empty list of numbers")
    return values


def _check_ranges(kind: str, p: Mapping[str, Any], arrays: Mapping[str, NDArray]) -> None:
    src = "distribution"
    if kind == "lognormal":
        if p["mean"] <= 0:
            raise InputError(src, "mean", "a number > 0", p["mean"])
        if p["cv"] < 0:
            raise InputError(src, "cv", "a number >= 0", p["cv"])
    elif kind == "exponential" and p["mean"] <= 0:
        raise InputError(src, "mean", "a number > 0", p["mean"])
    elif kind == "poisson" and p["mean"] < 0:
        raise InputError(src, "mean", "a number >= 0", p["mean"])
    elif kind == "geometric" and p["mean"] < 1:
        raise InputError(src, "mean", "a number >= 1 (values start at 1)", p["mean"])
    elif kind == "uniform" and p["low"] > p["high"]:
        raise InputError(src, "high", f"a number >= low ({p['low']:g})", p["high"])
    elif kind == "choice" and "weights" in p:
        w = arrays["weights"]
        if len(w) != len(p["values"]):
            raise InputError(src, "weights", f"{len(p['values'])} weights, one per value", len(w))
        if np.any(w < 0) or w.sum() <= 0:
            raise InputError(src, "weights", "weights >= 0 with a positive sum", p["weights"])


# ----------------------------------------------------------------------- distribution files


class _DistRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    kind: str
    min: float | None = None
    max: float | None = None


class _ConstantRec(_DistRecord):
    value: float


class _LogNormalRec(_DistRecord):
    mean: float
    cv: float


class _MeanRec(_DistRecord):
    mean: float


class _UniformRec(_DistRecord):
    low: float
    high: float


class _ChoiceRec(_DistRecord):
    values: list[float] = Field(min_length=1)
    weights: list[float] | None = None


class _EmpiricalRec(_DistRecord):
    values: list[float] = Field(min_length=1)


_DIST_RECORDS: dict[str, type[_DistRecord]] = {
    "constant": _ConstantRec, "lognormal": _LogNormalRec, "exponential": _MeanRec,
    "poisson": _MeanRec,
    "geometric": _MeanRec, "uniform": _UniformRec, "choice": _ChoiceRec,
    "empirical": _EmpiricalRec,
}


def parse_distribution(raw: object, source: str = "distribution", where: str = "") -> Distribution:
    """A :class:`Distribution` from a YAML/JSON value: ``{kind: ..., <params>, [min, max]}``.

    A bare number is a ``constant``. Errors name ``source`` and the field under ``where``.
    """
    prefix = f"{where}." if where else ""
    if _is_number(raw):
        raw = {"kind": "constant", "value": raw}
    if not isinstance(raw, dict):
        raise InputError(source, where or "top level",
                         "a number or a distribution mapping {kind: ..., ...}",
                         type(raw).__name__ if isinstance(raw, list | dict) else raw)
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in _DIST_RECORDS:
        raise InputError(source, f"{prefix}kind", f"one of {', '.join(KINDS)}",
                         kind if kind is not None else None)
    record = _DIST_RECORDS[kind]
    rec = validated(record, raw, source, prefix,
                              allowed=lambda _loc: list(record.model_fields))
    params = {k: v for k, v in rec.model_dump(exclude={"kind", "min", "max"}).items()
              if v is not None}
    try:
        return Distribution(cast(DistKind, kind), params, rec.min, rec.max)  # one of KINDS
    except InputError as exc:
        raise InputError(source, f"{prefix}{exc.field}", exc.expected, exc.got) from None


def _is_number(v: object) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


# ============================================================================ workflow specs

Param = Distribution | float | int
Timer = Callable[[str, int, int, np.random.Generator], float]
"""``timer(llm, input_tokens, output_tokens, rng) -> seconds``: one LLM call's duration."""


class Program(Protocol):
    """The shape of one agentic workflow: which LLMs, tools and params it needs, and one run."""

    # read-only members: the programs are frozen dataclasses
    @property
    def required_params(self) -> tuple[str, ...]: ...

    @property
    def required_llms(self) -> tuple[str, ...]: ...

    @property
    def required_tools(self) -> tuple[str, ...]: ...

    def run(self, spec: WorkflowSpec, rng: np.random.Generator, request_id: str, t0: float,
            timer: Timer) -> list[CallRecord]:
        """The calls of one request starting at ``t0``, parents before children."""
        ...


@dataclass(frozen=True)
class WorkflowSpec:
    """One workflow: its program, its LLMs (name -> catalog model), tools and params.

    The constructor checks the spec against :data:`PROGRAMS` and the default catalog and stores
    canonical model names; ``weight`` is the workflow's relative arrival rate in a workload
    (:func:`load_workload`).
    """

    name: str
    program: str
    llms: Mapping[str, str]
    tools: Mapping[str, Distribution] = field(default_factory=dict)
    params: Mapping[str, Param] = field(default_factory=dict)
    reference_gpu: str = DEFAULT_REFERENCE_GPU
    weight: float = 1.0
    description: str = ""
    source: str = field(default="", compare=False, repr=False)
    """The file the spec was read from (named by errors found while generating its trace)."""

    def __post_init__(self) -> None:
        src = f"workflow {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise InputError("workflow", "name", "a non-empty string", self.name)
        check_name(self.name, "workflow", "name")
        for field_name, section in (("llms", self.llms), ("tools", self.tools),
                                    ("params", self.params)):
            for key in section if isinstance(section, Mapping) else ():
                check_name(key, src, field_name)
        if not isinstance(self.program, str) or self.program not in PROGRAMS:
            raise InputError(src, "program", f"one of {', '.join(sorted(PROGRAMS))}", self.program)
        prog = PROGRAMS[self.program]
        catalog = default_catalog()
        try:
            gpu = catalog.gpu(self.reference_gpu)
        except InputError as exc:
            raise InputError(src, "reference_gpu", exc.expected, self.reference_gpu) from None
        object.__setattr__(self, "reference_gpu", gpu.name)
        if not (_is_number(self.weight) and math.isfinite(self.weight) and self.weight > 0):
            raise InputError(src, "weight", "a number > 0", self.weight)
        if getattr(prog, "any_llms", False):
            if not isinstance(self.llms, Mapping) or not self.llms:
                raise InputError(src, "llms", f"at least one LLM (program {self.program!r} "
                                 "takes the LLM names of its trace)",
                                 self.llms if not isinstance(self.llms, Mapping) else 0)
        elif getattr(prog, "any_one_llm", False):
            if not isinstance(self.llms, Mapping) or len(self.llms) != 1:
                raise InputError(src, "llms", f"exactly one LLM (program {self.program!r} "
                                 "calls one LLM, of any name)",
                                 len(self.llms) if isinstance(self.llms, Mapping) else self.llms)
        else:
            _check_names(src, "llms", self.llms, prog.required_llms)
        _check_names(src, "tools", self.tools, prog.required_tools)
        _check_names(src, "params", self.params, prog.required_params)
        llms: dict[str, str] = {}
        for llm, model in self.llms.items():
            try:
                llms[llm] = catalog.model(model).name
            except InputError as exc:
                raise InputError(src, f"llms.{llm}", exc.expected, model) from None
        tools: dict[str, Distribution] = {}
        for tool, dist in self.tools.items():
            d = Distribution.constant(dist) if _is_number(dist) else dist
            _check_param(src, f"tools.{tool}", d, number_ok=False)
            tools[tool] = d
        params: dict[str, Param] = {}
        for pname, value in self.params.items():
            _check_param(src, f"params.{pname}", value, number_ok=True)
            params[pname] = value
        object.__setattr__(self, "llms", MappingProxyType(dict(sorted(llms.items()))))
        object.__setattr__(self, "tools", MappingProxyType(dict(sorted(tools.items()))))
        object.__setattr__(self, "params", MappingProxyType(dict(sorted(params.items()))))

    def __hash__(self) -> int:
        return hash((self.name, self.program, tuple(self.llms.items()), tuple(self.tools.items()),
                     tuple(self.params.items()), self.reference_gpu, self.weight))

    def param_mean(self, name: str) -> float:
        """The mean of param ``name`` (the number itself, or its distribution's :meth:`mean`)."""
        v = self.params[name]
        return v.mean() if isinstance(v, Distribution) else float(v)

    def with_params(self, overrides: Mapping[str, Param], source: str = "overrides") -> WorkflowSpec:
        """A copy with some params replaced (e.g. token lengths from Mooncake); names must exist."""
        for name in overrides:
            if name not in self.params:
                raise InputError(source, str(name), f"a param of workflow {self.name!r}: "
                                 f"{', '.join(self.params)}")
        return dataclasses.replace(self, params={**self.params, **overrides})


def _check_names(src: str, section: str, given: Mapping[str, Any], required: Sequence[str]) -> None:
    if not isinstance(given, Mapping):
        raise InputError(src, section, "a mapping", given)
    for name in given:
        if name not in required:
            raise InputError(src, f"{section}.{name}", "a name the program uses (unknown name); "
                             f"allowed: {', '.join(required) or 'none'}")
    for name in required:
        if name not in given:
            raise InputError(src, f"{section}.{name}", "an entry (the program needs it; missing)")


def _check_param(src: str, where: str, value: object, number_ok: bool) -> None:
    if isinstance(value, Distribution):
        lo, _ = value.support()
        if lo < 0:
            raise InputError(src, where, "a distribution of non-negative values "
                             "(add min: 0)", lo)
        mean = value.mean()
        if not mean <= MAX_PARAM_MEAN:
            raise InputError(src, where, f"a distribution whose mean (after min/max) is at most "
                             f"{MAX_PARAM_MEAN:.0e} (the largest mean a workflow param or tool "
                             "may have; lower mean or set max)", mean)
    elif number_ok and _is_number(value):
        if not (math.isfinite(value) and 0 <= value <= MAX_PARAM_MEAN):
            raise InputError(src, where, f"a number in [0, {MAX_PARAM_MEAN:.0e}] (the largest "
                             "value a workflow param may have)", value)
    else:
        raise InputError(src, where, "a distribution" + (" or a number" if number_ok else ""),
                         value)


# ------------------------------------------------------------------------------ files


class _WorkflowFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name
    program: str = Field(min_length=1)
    description: str = ""
    reference_gpu: str = Field(default=DEFAULT_REFERENCE_GPU, min_length=1)
    llms: dict[Name, str] = Field(min_length=1)
    tools: dict[Name, Any] = Field(default_factory=dict)
    params: dict[Name, Any] = Field(default_factory=dict)


def load_workflow(path: str | os.PathLike[str]) -> WorkflowSpec:
    """Read and check a workflow YAML file; every problem names the file and the field."""
    p = Path(path)
    raw = read_yaml(p, "workflow file (.yaml)")
    return parse_workflow(raw, str(p))


def parse_workflow(raw: object, source: str = "<workflow>") -> WorkflowSpec:
    """A :class:`WorkflowSpec` from parsed YAML; ``source`` names it in errors."""
    if not isinstance(raw, dict):
        raise InputError(source, "", "a YAML mapping with name, program, llms, tools, params",
                         None if raw is None else type(raw).__name__)
    if raw.get("kind") == "rates":
        raise InputError(source, "kind", "a workflow file (this is a rate workload, "
                         "docs/rate-workloads.md: give it on its own, e.g. --workflow FILE; a "
                         "workload's workflows cannot include one)", "rates")
    rec = validated(_WorkflowFile, raw, source,
                              allowed=lambda _loc: list(_WorkflowFile.model_fields))
    tools = {t: parse_distribution(v, source, f"tools.{t}") for t, v in rec.tools.items()}
    params: dict[str, Param] = {}
    for name, value in rec.params.items():
        params[name] = value if _is_number(value) else parse_distribution(
            value, source, f"params.{name}")
    try:
        return WorkflowSpec(name=rec.name, program=rec.program, llms=rec.llms, tools=tools,
                            params=params, reference_gpu=rec.reference_gpu,
                            description=rec.description, source=source)
    except InputError as exc:
        raise InputError(source, exc.field, exc.expected, exc.got) from None


class _WorkloadFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    workflows: list[str] = Field(min_length=1)
    weights: list[float] | None = None
    description: str = ""


def load_workload(path: str | os.PathLike[str]) -> tuple[WorkflowSpec, ...]:
    """Read a workload: ``workflows: [a.yaml, ...]`` (relative to the file), optional ``weights``.

    ``weights`` are the workflows' relative arrival rates (default 1 each), stored in each
    spec's ``weight``. An LLM name used by several workflows is one deployment, so it must map
    to the same model everywhere; workflow names must be unique.
    """
    p = Path(path)
    src = str(p)
    raw = read_yaml(p, "workload file (.yaml)")
    if not isinstance(raw, dict):
        raise InputError(src, "", "a YAML mapping with workflows and optional weights",
                         None if raw is None else type(raw).__name__)
    rec = validated(_WorkloadFile, raw, src,
                              allowed=lambda _loc: list(_WorkloadFile.model_fields))
    weights = rec.weights if rec.weights is not None else [1.0] * len(rec.workflows)
    if len(weights) != len(rec.workflows):
        raise InputError(src, "weights", f"{len(rec.workflows)} weights, one per workflow",
                         len(weights))
    specs: list[WorkflowSpec] = []
    models: dict[str, tuple[str, str]] = {}  # llm -> (model, workflow that set it)
    for i, (rel, w) in enumerate(zip(rec.workflows, weights, strict=True)):
        if not (w > 0):
            raise InputError(src, f"weights[{i}]", "a number > 0", w)
        if not (p.parent / rel).is_file():
            raise InputError(src, f"workflows[{i}]", "the path of an existing workflow file "
                             "(relative to the workload file)", rel)
        spec = load_workflow(p.parent / rel)
        if any(s.name == spec.name for s in specs):
            raise InputError(src, f"workflows[{i}]", "workflows with unique names "
                             f"(two are called {spec.name!r})", rel)
        for llm, model in spec.llms.items():
            if llm in models and models[llm][0] != model:
                first_model, first = models[llm]
                raise InputError(src, f"workflows[{i}]: llms.{llm}",
                                 f"the model {first_model!r} that workflow {first!r} uses for "
                                 "the shared LLM name", model)
            models.setdefault(llm, (model, spec.name))
        specs.append(dataclasses.replace(spec, weight=float(w)))
    return tuple(specs)


# ============================================================================ timing


def _max_context(model: str) -> int:
    return default_catalog().model(model).max_context


class ReferenceTimer:
    """A :data:`Timer`: zero-load latency from per-token prefill/decode tables, times jitter.

    Built by :func:`reference_timer`; the tables of an LLM are computed on its first call.
    """

    accepts_arrays = True  # may be called with arrays of input and output tokens

    def __init__(self, llms: Mapping[str, str], gpu: str, latency: LatencyModel,
                 jitter_cv: float) -> None:
        self._llms = dict(llms)
        self._gpu = gpu
        self._latency = latency
        self._tables: dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]] = {}
        self._mu, self._sigma = _lognormal_shape(1.0, jitter_cv)

    def _table(self, llm: str) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        t = self._tables.get(llm)
        if t is None:
            model = self._llms[llm]
            n = np.arange(1, _max_context(model) + 1, dtype=float)
            prefill = np.asarray(self._latency.prefill_ms(model, self._gpu, 1, 1.0, 1, n), float)
            decode = np.asarray(self._latency.decode_ms(model, self._gpu, 1, 1.0, 1, n), float)
            t = self._tables[llm] = (prefill, decode)
        return t

    def zero_load_s(self, llm: str, input_tokens: Any, output_tokens: Any) -> Any:
        """``(prefill(I) + (O − 1)·decode(1, I + O/2)) / 1000``, as ``serving_curve`` at zero load
        (prefill produces the first output token)."""
        prefill, decode = self._table(llm)
        n = len(prefill)
        scalars = (int, float, np.integer, np.floating)
        i: Any  # an int for scalars, else an array
        if isinstance(input_tokens, scalars) and isinstance(output_tokens, scalars):
            i = min(max(int(input_tokens), 1), n)
            o = max(float(output_tokens), 1.0)
            x = min(i + o / 2.0, float(n)) - 1.0  # 0-based position in the decode table
            j = int(x)
            w = x - j
            step = float(decode[j]) * (1.0 - w) + float(decode[min(j + 1, n - 1)]) * w
            return (float(prefill[i - 1]) + (o - 1.0) * step) / 1e3
        i = np.minimum(np.maximum(np.asarray(input_tokens, dtype=np.int64), 1), n)
        o = np.maximum(np.asarray(output_tokens, dtype=float), 1.0)
        x = np.minimum(i + o / 2.0, float(n)) - 1.0
        j = x.astype(np.int64)
        w = x - j
        step = decode[j] * (1.0 - w) + decode[np.minimum(j + 1, n - 1)] * w
        return (prefill[i - 1] + (o - 1.0) * step) / 1e3

    def __call__(self, llm: str, input_tokens: Any, output_tokens: Any,
                 rng: np.random.Generator) -> Any:
        base = self.zero_load_s(llm, input_tokens, output_tokens)
        if isinstance(base, float):
            return base * float(rng.lognormal(self._mu, self._sigma))
        return base * rng.lognormal(self._mu, self._sigma, np.shape(base))


def reference_timer(spec: WorkflowSpec, latency: LatencyModel | None = None, *,
                    jitter_cv: float = JITTER_CV) -> ReferenceTimer:
    """The default :data:`Timer`: zero-load latency on one ``spec.reference_gpu`` (tp 1, share 1).

    The duration of a call with ``I`` input and ``O`` output tokens is
    ``prefill(I) + O · decode(batch 1, context I + O/2)`` from ``latency`` (default: the
    calibrated roofline model), the zero-load latency of ``serving_curve``, times a log-normal
    jitter of mean 1 and coefficient of variation ``jitter_cv``. Prompts longer than the model's
    context are timed at the context length. It also accepts arrays of ``I`` and ``O``.
    """
    if not (_is_number(jitter_cv) and 0 <= jitter_cv < math.inf):
        raise InputError("reference_timer", "jitter_cv", "a number >= 0", jitter_cv)
    return ReferenceTimer(spec.llms, spec.reference_gpu, latency or roofline_model(), jitter_cv)


# ============================================================================ programs


def draw(spec: WorkflowSpec, name: str, rng: np.random.Generator,
         size: int | tuple[int, ...] | None = None) -> Any:
    """Sample param ``name`` (a number is returned as is, or repeated to shape ``size``)."""
    v = spec.params[name]
    if isinstance(v, Distribution):
        return v.sample(rng, size)
    return float(v) if size is None else np.full(size, float(v))


def draw_count(spec: WorkflowSpec, name: str, rng: np.random.Generator, low: int = 0,
               size: int | tuple[int, ...] | None = None) -> Any:
    """Param ``name`` rounded to the nearest integer, at least ``low`` (an int or int array).

    ``size`` is a number of calls of one request: more than :data:`MAX_CALLS_PER_REQUEST` is an
    :class:`InputError` naming the workflow's file, raised before anything is drawn.
    """
    if size is None:
        return max(low, round(draw(spec, name, rng)))  # round half to even, as np.rint
    n = math.prod(size) if isinstance(size, tuple) else int(size)
    if n > MAX_CALLS_PER_REQUEST:
        raise InputError(spec.source or f"workflow {spec.name!r}", "params",
                         f"at most {MAX_CALLS_PER_REQUEST} calls per request (a sampled fan-out "
                         "or loop count was larger; lower the count params' means or set max)", n)
    return np.maximum(np.rint(draw(spec, name, rng, size)), low).astype(np.int64)


class _Request:
    """Builds one request's calls: ids ``c0, c1, ...``; a call starts when its parents end."""

    def __init__(self, spec: WorkflowSpec, rng: np.random.Generator, request_id: str, t0: float,
                 timer: Timer) -> None:
        self.spec, self.rng, self.request_id, self.t0, self.timer = spec, rng, request_id, t0, timer
        self.calls: list[CallRecord] = []

    def _start(self, parents: Sequence[CallRecord]) -> float:
        return max([self.t0, *(p.end_s for p in parents)])

    def _add(self, start: float, duration: float, parents: tuple[str, ...],
             **kw: Any) -> CallRecord:
        if len(self.calls) >= MAX_CALLS_PER_REQUEST:
            raise InputError(self.spec.source or f"workflow {self.spec.name!r}", "params",
                             f"at most {MAX_CALLS_PER_REQUEST} calls per request (a sampled "
                             "fan-out or loop count was larger; lower the count params' means "
                             "or set max)", len(self.calls) + 1)
        rec = CallRecord(workflow=self.spec.name, request_id=self.request_id,
                         call_id=f"c{len(self.calls)}", start_s=start, end_s=start + duration,
                         parents=parents, **kw)
        self.calls.append(rec)
        return rec

    def llm(self, llm: str, parents: Sequence[CallRecord], input_tokens: int, output_tokens: int,
            prefix_tokens: int = 0, role: str | None = None) -> CallRecord:
        """One LLM call; see :meth:`prepare` for the token counts."""
        ctx = _max_context(self.spec.llms[llm])
        o = min(max(int(output_tokens), 1), ctx - 1)
        i = min(max(int(input_tokens), 1), ctx - o)
        duration = float(self.timer(llm, i, o, self.rng))
        return self._add(self._start(parents), duration, tuple(p.call_id for p in parents),
                         llm=llm, role=role, input_tokens=i, output_tokens=o,
                         prefix_tokens=min(max(int(prefix_tokens), 0), i))

    def llm_many(self, llm: str, parents: Sequence[CallRecord], input_tokens: Any,
                 output_tokens: Any, prefix_tokens: Any = None,
                 role: str | None = None) -> list[CallRecord]:
        """Concurrent calls to one LLM with the same parents: they start together."""
        prepared = self.prepare(llm, input_tokens, output_tokens, prefix_tokens)
        return self.group(self._start(parents), tuple(p.call_id for p in parents), llm,
                          *prepared, role=role)

    def prepare(self, llm: str, input_tokens: Any, output_tokens: Any,
                prefix_tokens: Any = None) -> tuple[list[int], list[int], list[int], list[float]]:
        """Token counts fitted to the model's context, and durations, as flat lists.

        A prompt longer than the context keeps its last tokens (only the count matters here);
        the prefix is at most the prompt.
        """
        ctx = _max_context(self.spec.llms[llm])
        o = np.minimum(np.maximum(np.asarray(output_tokens, dtype=np.int64), 1), ctx - 1).ravel()
        i = np.minimum(np.maximum(np.asarray(input_tokens, dtype=np.int64), 1).ravel(), ctx - o)
        pre = np.zeros_like(i) if prefix_tokens is None else np.minimum(
            np.maximum(np.asarray(prefix_tokens, dtype=np.int64).ravel(), 0), i)
        if getattr(self.timer, "accepts_arrays", False):
            # a timer that accepts_arrays times the arrays at once (Timer types one call)
            durations = np.asarray(cast(Any, self.timer)(llm, i, o, self.rng),
                                   dtype=float).tolist()
        else:
            durations = [float(self.timer(llm, int(a), int(b), self.rng))
                         for a, b in zip(i, o, strict=True)]
        return i.tolist(), o.tolist(), pre.tolist(), durations

    def group(self, start: float, parents: tuple[str, ...], llm: str, input_tokens: list[int],
              output_tokens: list[int], prefix_tokens: list[int], durations: list[float],
              role: str | None = None) -> list[CallRecord]:
        """Add prepared calls that all start at ``start`` with the same parent ids."""
        return [self._add(start, d, parents, llm=llm, role=role, input_tokens=a,
                          output_tokens=b, prefix_tokens=c)
                for d, a, b, c in zip(durations, input_tokens, output_tokens, prefix_tokens,
                                      strict=True)]

    def tool(self, tool: str, parents: Sequence[CallRecord]) -> CallRecord:
        """A tool call whose latency is drawn from the tool's distribution."""
        duration = max(0.0, self.spec.tools[tool].sample(self.rng))
        return self._add(self._start(parents), duration, tuple(p.call_id for p in parents),
                         tool=tool)


@dataclass(frozen=True)
class RagProgram:
    """Retrieval-augmented generation with a reranker (the paper's RAG workflow).

    ``rewriter`` turns the question into a search query → ``retrieval`` tool → ``rerank_k``
    concurrent ``reranker`` calls (query + one document each, 1 output token: a relevance score)
    → ``generator`` answers from the question and the ``top_n`` best documents.
    System prompts (``*_prompt_tokens``) are the cacheable ``prefix_tokens`` of their calls.
    """

    required_params: tuple[str, ...] = (
        "query_tokens", "rewrite_prompt_tokens", "rewritten_tokens", "rerank_k", "doc_tokens",
        "top_n", "answer_prompt_tokens", "answer_tokens")
    required_llms: tuple[str, ...] = ("rewriter", "reranker", "generator")
    required_tools: tuple[str, ...] = ("retrieval",)

    def run(self, spec: WorkflowSpec, rng: np.random.Generator, request_id: str, t0: float,
            timer: Timer) -> list[CallRecord]:
        r = _Request(spec, rng, request_id, t0, timer)
        query = draw_count(spec, "query_tokens", rng, 1)
        rw_prompt = draw_count(spec, "rewrite_prompt_tokens", rng)
        rewritten = draw_count(spec, "rewritten_tokens", rng, 1)
        rewrite = r.llm("rewriter", [], rw_prompt + query, rewritten, prefix_tokens=rw_prompt)
        retrieval = r.tool("retrieval", [rewrite])
        k = draw_count(spec, "rerank_k", rng, 1)
        docs = draw_count(spec, "doc_tokens", rng, 1, size=k)
        reranks = r.llm_many("reranker", [retrieval], rewritten + docs, np.ones_like(docs))
        top_n = min(draw_count(spec, "top_n", rng, 1), k)
        ans_prompt = draw_count(spec, "answer_prompt_tokens", rng)
        r.llm("generator", reranks, ans_prompt + query + int(docs[:top_n].sum()),
              draw_count(spec, "answer_tokens", rng, 1), prefix_tokens=ans_prompt)
        return r.calls


@dataclass(frozen=True)
class BeamSearchProgram:
    """Step-level beam search with a process reward model (test-time compute scaling).

    ``steps`` (S, heavy-tailed: problems differ wildly in how many reasoning steps they need)
    rounds of: ``beam_width`` (B) concurrent ``generator`` calls, each writing one step of
    ``step_tokens`` for one beam, then B concurrent ``prm`` calls (1 output token: a score) that
    wait for all B steps; the next round waits for all scores. After scoring, each surviving beam
    continues one of the previous beams (drawn uniformly: the scores carry no information here).
    A beam's prompt is the problem plus its steps so far, all already seen by the same LLM in
    the previous round (its ``prefix_tokens``). Generator calls per request: B·S.
    """

    required_params: tuple[str, ...] = ("problem_tokens", "steps", "beam_width", "step_tokens")
    required_llms: tuple[str, ...] = ("generator", "prm")
    required_tools: tuple[str, ...] = ()

    def run(self, spec: WorkflowSpec, rng: np.random.Generator, request_id: str, t0: float,
            timer: Timer) -> list[CallRecord]:
        r = _Request(spec, rng, request_id, t0, timer)
        problem = draw_count(spec, "problem_tokens", rng, 1)
        steps = draw_count(spec, "steps", rng, 1)
        width = draw_count(spec, "beam_width", rng, 1)
        new = draw_count(spec, "step_tokens", rng, 1, size=(steps, width))
        pick = rng.integers(0, width, size=(steps, width))  # the beam each survivor continues
        ctx = np.empty((steps, width), dtype=np.int64)  # prompt tokens per step and beam
        ctx[0] = problem
        for s in range(1, steps):
            ctx[s] = (ctx[s - 1] + new[s - 1])[pick[s - 1]]
        seen = ctx.copy()
        seen[0] = 0
        # durations do not depend on start times: time every call at once, then lay them out
        # the prepared lists, each sliced per step below
        gen: tuple[Any, ...] = r.prepare("generator", ctx, new, seen)
        prm: tuple[Any, ...] = r.prepare("prm", ctx + new, np.ones_like(new), seen)
        parents: tuple[str, ...]
        t, parents = t0, ()
        for s in range(steps):
            part = slice(s * width, (s + 1) * width)
            gens = r.group(t, parents, "generator", *(x[part] for x in gen))
            t, parents = max(c.end_s for c in gens), tuple(c.call_id for c in gens)
            scores = r.group(t, parents, "prm", *(x[part] for x in prm))
            t, parents = max(c.end_s for c in scores), tuple(c.call_id for c in scores)
        return r.calls


@dataclass(frozen=True)
class CodingAgentProgram:
    """A plan-code-test-review agent where one LLM plays two roles (a bimodal load on purpose).

    ``coder`` first plans (``role="planner"``: the long task description in, a short plan out),
    then ``rounds`` (geometric: each round passes review with a fixed probability) of: ``coder``
    writes code (``role="coder"``: the plan and the last review in, a long patch out) → ``tests``
    tool → ``reviewer`` reads the plan, the code and the test log and writes a review.
    """

    required_params: tuple[str, ...] = (
        "task_tokens", "planner_prompt_tokens", "plan_tokens", "rounds", "coder_prompt_tokens",
        "code_tokens", "test_log_tokens", "reviewer_prompt_tokens", "review_tokens")
    required_llms: tuple[str, ...] = ("coder", "reviewer")
    required_tools: tuple[str, ...] = ("tests",)

    def run(self, spec: WorkflowSpec, rng: np.random.Generator, request_id: str, t0: float,
            timer: Timer) -> list[CallRecord]:
        r = _Request(spec, rng, request_id, t0, timer)
        p_prompt = draw_count(spec, "planner_prompt_tokens", rng)
        plan_tokens = draw_count(spec, "plan_tokens", rng, 1)
        plan = r.llm("coder", [], p_prompt + draw_count(spec, "task_tokens", rng, 1), plan_tokens,
                     prefix_tokens=p_prompt, role="planner")
        rounds = draw_count(spec, "rounds", rng, 1)
        c_prompt = draw_count(spec, "coder_prompt_tokens", rng)
        r_prompt = draw_count(spec, "reviewer_prompt_tokens", rng)
        parents, feedback = [plan], 0
        for _ in range(rounds):
            code_tokens = draw_count(spec, "code_tokens", rng, 1)
            code = r.llm("coder", parents, c_prompt + plan_tokens + feedback, code_tokens,
                         prefix_tokens=c_prompt, role="coder")
            tests = r.tool("tests", [code])
            log = draw_count(spec, "test_log_tokens", rng)
            feedback = draw_count(spec, "review_tokens", rng, 1)
            review = r.llm("reviewer", [code, tests], r_prompt + plan_tokens + code_tokens + log,
                           feedback, prefix_tokens=r_prompt)
            parents = [plan, review]
        return r.calls


@dataclass(frozen=True)
class CallProgram:
    """One LLM call per request: the rate-driven setting (MuxServe, AlpaServe), no workflow.

    The workflow has exactly one LLM, of any name (``any_one_llm``); each request is one call
    of ``input_tokens`` in and ``output_tokens`` out, both at least 1. A rate workload
    (:mod:`scepsy_opt.ratework`, docs/rate-workloads.md) is one such workflow per LLM, named
    after the LLM.
    """

    required_params: tuple[str, ...] = ("input_tokens", "output_tokens")
    required_llms: tuple[str, ...] = ()
    required_tools: tuple[str, ...] = ()
    any_one_llm: bool = True

    def run(self, spec: WorkflowSpec, rng: np.random.Generator, request_id: str, t0: float,
            timer: Timer) -> list[CallRecord]:
        r = _Request(spec, rng, request_id, t0, timer)
        (llm,) = spec.llms
        r.llm(llm, [], draw_count(spec, "input_tokens", rng, 1),
              draw_count(spec, "output_tokens", rng, 1))
        return r.calls


@dataclass(frozen=True)
class RecordedProgram:
    """A workflow known only by its recorded trace: an application in any agent framework,
    recorded by ``scepsy record`` or imported from its telemetry (``scepsy trace import``).

    Its LLMs may have any names (``any_llms``: those of the trace), it has no params or tools,
    and it generates nothing: planning, predicting and simulating it take the statistics of a
    trace given with ``--trace``; without one, :meth:`run` says so.
    """

    required_params: tuple[str, ...] = ()
    required_llms: tuple[str, ...] = ()
    required_tools: tuple[str, ...] = ()
    any_llms: bool = True

    def run(self, spec: WorkflowSpec, rng: np.random.Generator, request_id: str, t0: float,
            timer: Timer) -> list[CallRecord]:
        raise InputError(spec.source or f"workflow {spec.name!r}", "program",
                         "a recorded trace of the workflow (--trace TRACE.jsonl): program "
                         "'recorded' has no generator", spec.program)


PROGRAMS: dict[str, Program] = {
    "rag": RagProgram(),
    "beam_search": BeamSearchProgram(),
    "coding_agent": CodingAgentProgram(),
    "call": CallProgram(),
    "recorded": RecordedProgram(),
}
"""Registered programs by name (the ``program`` of a workflow file)."""


# ============================================================================ traces


def generate_trace(spec: WorkflowSpec, requests: int, seed: int, *,
                   timer: Timer | None = None,
                   token_source: Mapping[str, Param] | None = None,
                   gap_s: float = 1.0) -> tuple[CallRecord, ...]:
    """Run ``spec``'s program for requests ``r0 .. r{requests-1}``, one after the other.

    Request ``i+1`` starts ``gap_s`` after request ``i`` ends. ``timer`` times LLM calls
    (default :func:`reference_timer`). ``token_source`` replaces params for this trace, e.g.
    ``{"task_tokens": load_mooncake_lengths(path).distribution("input", max=16000)}``. The same
    arguments and seed give the same records; the result passes ``validate_calls``.
    """
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise InputError("generate_trace", "requests", "an integer >= 1", requests)
    if requests > MAX_REQUESTS:
        raise InputError("trace", "requests", f"at most {MAX_REQUESTS} requests per "
                         "workflow (the largest trace generated)", requests)
    if not (_is_number(gap_s) and math.isfinite(gap_s) and gap_s >= 0):
        raise InputError("generate_trace", "gap_s", "a number >= 0", gap_s)
    if token_source:
        spec = spec.with_params(token_source, source="token_source")
    program = PROGRAMS[spec.program]
    timer = timer or reference_timer(spec)
    rng = np.random.default_rng(seed)
    calls: list[CallRecord] = []
    t = 0.0
    for i in range(requests):
        done = program.run(spec, rng, f"r{i}", t, timer)
        calls.extend(done)
        if len(calls) > MAX_TRACE_CALLS:
            raise InputError(spec.source or f"workflow {spec.name!r}", "requests",
                             f"a trace of at most {MAX_TRACE_CALLS} calls (reached after {i + 1} "
                             "requests; generate fewer requests)", requests)
        t = max(c.end_s for c in done) + gap_s
    return tuple(calls)
