"""The plan request: everything ``scepsy plan`` (and :func:`scepsy.api.plan`) takes, as one
frozen, validated value.

A :class:`PlanRequest` holds the inputs (:class:`Inputs`), the objective as a tagged union
(:class:`MinLatency`, :class:`MaxThroughput`, :class:`MinCost`: only min-cost has prices, only
max-throughput and min-cost have mean-latency bounds), the constraints every objective honours
(:class:`Constraints`: percentile bounds, per-LLM SLOs), the search settings (:class:`Search`),
the placement settings per placer (:class:`HierarchicalPlacement`, the only placer with an
improvement phase, or :class:`SimplePlacement`) and the serving engine's settings
(:class:`Engine`). Combinations that cannot work fail validation, naming the field: a
formulation the optimiser has no MILP for (the registry of formulations says which), the
``user`` optimiser or a change penalty without a current allocation, recorded arrivals together
with targets, peak-window settings without arrivals.

The command line is generated from these fields: every field that carries a :class:`Flag` is
an option of ``scepsy plan`` (its help is the field's docstring, its default the field's),
and :data:`FLAGS` maps each field to its option for error messages. :meth:`PlanRequest.record`
is what plan.json keeps as ``request``: the request that produced the plan.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from scepsy_common.errors import InputError
from scepsy_common.flags import Flag, FlagField, fields_with_flags
from scepsy_opt.planning.optimisers import OPTIMISERS
from scepsy_opt.planning.problem import OBJECTIVES, TENTHS, PlanOptions
from scepsy_opt.ratework import check_rate
from scepsy_opt.workflows import DEFAULT_TRACE_REQUESTS, MAX_REQUESTS
from scepsy_place.formulations.loop import FORMULATIONS_REGISTRY, MAX_ROUNDS
from scepsy_place.packing.placement import PLACERS
from scepsy_profile.serving import MAX_BATCHED_TOKENS, MAX_BLOCK_SIZE, MAX_NUM_SEQS, MemoryPolicy

SOURCE = "plan"
"""The source an invalid request's :class:`InputError` names (its field: the request field)."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True,
                              arbitrary_types_allowed=True)

    @classmethod
    def checked(cls, data: Mapping[str, Any]) -> Any:
        """``cls.model_validate(data)``, or the :class:`InputError` of its first invalid field
        (what a part of the request, such as :class:`Engine`, reports alone)."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _input_error(exc) from None


Source = Any
"""A file path (str or os.PathLike) or the loaded object (:func:`scepsy.api.plan` takes both)."""


class Inputs(_Model):
    """What is planned for: the workflows, the cluster, the load, the latency model."""

    workflow: Annotated[Source, Flag("--workflow", "path")]
    """workflow, workload or rate workload (kind: rates) YAML"""
    cluster: Annotated[Source, Flag("--cluster", "path")]
    """cluster YAML/JSON"""
    targets: Annotated[float | dict[str, float] | None,
                       Flag("--target", "rates", "RATE|WORKFLOW=RATE")] = None
    """target throughput, req/s: a total split over a workload's weights, or per workflow
    (repeat the flag); optional for a rate workload (its rates; a total rescales them)"""
    arrivals: Annotated[Source | None, Flag("--arrivals", "path", "FILE")] = None
    """recorded arrival times instead of --target: the plan carries their peak window's rate
    (JSON lines with a timestamp in ms, or one time in seconds per line; docs/arrivals.md)"""
    peak_window_s: Annotated[float | None, Flag("--peak-window", "positive", "S")] = None
    """the window of --arrivals' peak rate (default 60 s)"""
    peak_quantile: Annotated[float, Flag("--peak-quantile", "positive", "Q")] = 1.0
    """carry the window rate at this quantile of the windows, in (0, 1] (default 1: the
    busiest window)"""
    time_scale: Annotated[float, Flag("--time-scale", "positive", "X")] = 1.0
    """replay --arrivals X times as fast (default 1)"""
    current: Annotated[Source | None, Flag("--current", "path")] = None
    """current allocation (or plan.json) to re-plan from"""
    trace: Annotated[Source | None, Flag("--trace", "path")] = None
    """recorded trace (default: generated)"""
    trace_requests: Annotated[int, Flag("--trace-requests", "count")] = DEFAULT_TRACE_REQUESTS
    """requests per workflow of a generated trace (not with --trace)"""
    seed: Annotated[int, Flag("--seed", "seed")] = 0
    """seed of the generated trace and its statistics"""
    curves: Annotated[Source | None, Flag("--curves", "path")] = None
    """fitted curves (measured curves win)"""
    latency: Any = None
    """a latency model object in place of curves (the Python API only)"""
    overheads: Annotated[Source | None, Flag("--overheads", "path")] = None
    """engine overheads calibration YAML/JSON (scepsy profile calibrate; default: none,
    optimistic)"""
    catalog: Annotated[Source | None, Flag("--catalog", "path")] = None
    """YAML catalog extending the bundled one (devices and models it lacks, e.g.
    datasets/catalogs/cpu-host.yaml)"""

    @model_validator(mode="after")
    def _arrivals_or_targets(self) -> Inputs:
        rates = (self.targets.values() if isinstance(self.targets, dict) else
                 () if self.targets is None else (self.targets,))
        for rate in rates:
            check_rate(rate, SOURCE, "targets")
        if not 1 <= self.trace_requests <= MAX_REQUESTS:
            raise InputError(SOURCE, "trace_requests", f"1 to {MAX_REQUESTS} requests per "
                             "workflow (the largest trace generated)", self.trace_requests)
        if self.trace is not None and self.trace_requests != DEFAULT_TRACE_REQUESTS:
            raise InputError(SOURCE, "trace_requests", "no requests count together with a "
                             "recorded trace (it sizes a generated trace; a recorded one is "
                             "used whole: drop one of the two)", self.trace_requests)
        if self.arrivals is not None and self.targets is not None:
            raise InputError(SOURCE, "arrivals", "no targets with it (the arrivals' peak "
                             "window sets them)", self.targets)
        for name, given in (("peak_window_s", self.peak_window_s is not None),
                            ("peak_quantile", self.peak_quantile != 1.0),
                            ("time_scale", self.time_scale != 1.0)):
            if given and self.arrivals is None:
                raise InputError(SOURCE, name, "together with arrivals (recorded arrival "
                                 "times)", getattr(self, name))
        return self


Bound = float | dict[str, float] | None


class MinLatency(_Model):
    """Minimise the weighted sum of the workflows' mean predicted latencies."""

    kind: Annotated[Literal["min-latency"], Flag("--objective", "choice", choices=lambda: OBJECTIVES)] = "min-latency"
    """min-latency (default): the weighted sum of the workflows' mean predicted latencies;
    max-throughput: the largest fraction of the targets carried; min-cost: the cheapest GPUs
    per hour meeting the targets and the latency bounds"""


class MaxThroughput(_Model):
    """Carry the largest fraction of the targets, within the mean-latency bounds."""

    kind: Literal["max-throughput"] = "max-throughput"
    latency_bound_s: Bound = None
    """a bound on every workflow's mean latency, s (or per workflow)"""


class MinCost(_Model):
    """The cheapest GPUs per hour that carry the targets within the latency bounds."""

    kind: Literal["min-cost"] = "min-cost"
    latency_bound_s: Bound = None
    """a bound on every workflow's mean latency, s (or per workflow)"""
    prices: Annotated[dict[str, float] | None, Flag("--price", "prices", "GPU=USD")] = None
    """price per GPU-hour of a GPU type (min-cost; overrides the cluster file's and the
    catalog's; repeatable)"""


Objective = Annotated[MinLatency | MaxThroughput | MinCost, Field(discriminator="kind")]


class Constraints(_Model):
    """Bounds every objective honours."""

    latency_bounds: Annotated[Any, Flag("--latency-bound", "latency-bounds",
                                        "[WORKFLOW=]SECONDS|[WORKFLOW=]PCT:SECONDS")] = None
    """SECONDS: bound on a workflow's mean latency (max-throughput and min-cost); PCT:SECONDS:
    bound on its PCT-th percentile latency, e.g. rag=90:2 (repeatable)"""
    slos: Annotated[Any, Flag("--ttft-slo", "slos", "[LLM=]SECONDS|[LLM=]PCT:SECONDS",
                              also=("--tpot-slo",), also_metavar="[LLM=]SECONDS",
                              also_help="bound on an LLM's mean time per output token after "
                              "the first; without LLM= for every LLM (repeatable; every "
                              "objective)")] = None
    """SECONDS: bound on an LLM's mean time to first token; PCT:SECONDS: on its PCT-th
    percentile, e.g. judge=90:0.5; without LLM= for every LLM (repeatable; every objective;
    docs/slo.md)"""
    # the Python API: per LLM (or "*") a CallSLO or {ttft_s, tpot_s, ttft_percentile}


_D = PlanOptions()


class Search(_Model):
    """How the optimiser searches: which one, its formulation, the candidate grid, its
    limits."""

    optimiser: Annotated[str, Flag("--optimiser", "choice", choices=lambda: tuple(OPTIMISERS))] = "milp"
    """user: evaluate --current as it is"""
    formulation: Annotated[str, Flag("--formulation", "choice",
                                              choices=lambda: tuple(FORMULATIONS_REGISTRY))] = "auto"
    """aggregate: MILP then place, cut and re-solve; blocks: whole-GPU blocks of one LLM each,
    placeable by construction; patterns: column generation over GPU/NVLink-domain patterns,
    LLMs sharing GPUs, with a proven gap; auto: blocks, the exact aggregate loop on small
    clusters, patterns unless already proven optimal; the best placed plan wins"""
    tps: Annotated[tuple[int, ...], Flag("--tp", "csv-ints")] = _D.tps
    """comma-separated TP degrees"""
    shares: Annotated[tuple[float, ...], Flag("--shares", "csv-floats")] = TENTHS
    """comma-separated share grid (default tenths)"""
    shares_within_profile: Annotated[bool, Flag("--shares-within-profile", "switch")] = False
    """per model, GPU and TP degree only the shares of the grid within the latency curves'
    measured shares (no extrapolated latencies; roofline-priced instances keep the whole
    grid)"""
    memory_shares: Annotated[tuple[float, ...] | None,
                             Flag("--memory-shares", "memory-shares", "tied|tenths|F,F,...")
                             ] = None
    """memory as a second resource: the grid of memory fractions per GPU an instance may take
    whatever its compute share (tenths, or a comma-separated list); tied (default): memory
    follows the share"""
    max_utilisation: Annotated[float, Flag("--max-utilisation", "float")] = _D.max_utilisation
    """the highest utilisation a replica is planned at"""
    time_limit_s: Annotated[float, Flag("--time-limit", "positive")] = _D.time_limit_s
    """time limit of the whole plan, s (exit 3 when it runs out before any allocation is
    found)"""
    gap_rel: Annotated[float, Flag("--gap", "float")] = _D.gap_rel
    """relative optimality gap to stop at"""
    change_penalty_s: Annotated[float, Flag("--change-penalty", "nonnegative")] = (
        _D.change_penalty_s)
    """objective seconds per replica started or stopped (needs --current)"""
    length_routing: Annotated[bool, Flag("--length-routing", "switch")] = _D.length_routing
    """min-cost: an LLM split over GPU types may route its calls by prompt length (each group a
    range of input tokens) where that is cheaper than splitting them by weight"""
    length_buckets: Annotated[int, Flag("--length-buckets", "count"), Field(ge=2, le=16)] = (
        _D.length_buckets)
    """with --length-routing: the length buckets (quantiles of the prompt lengths) whose
    consecutive runs are the ranges a group may take"""
    max_rounds: Annotated[int, Flag("--max-rounds", "count"), Field(ge=1)] = MAX_ROUNDS
    """the aggregate loop's round cap, a safety net: it stops when a plan places, is proven
    infeasible or at --time-limit"""
    weights: dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(
        default_factory=dict)
    """per workflow, its weight in the min-latency objective (default 1; the Python API)"""
    prune_rel: Annotated[float, Field(ge=0, lt=1e-3)] = _D.prune_rel
    """relative tolerance of candidate dominance pruning (the Python API)"""
    max_replicas: Annotated[int, Field(ge=1)] = _D.max_replicas
    """the most replicas of one LLM (the Python API)"""
    reduce: bool | None = _D.reduce
    """Lagrangian reduced-cost fixing before the MILP (exact); None: on from 64 GPUs (the
    Python API)"""

    @model_validator(mode="after")
    def _known(self) -> Search:
        if self.optimiser not in OPTIMISERS:
            raise InputError("optimiser", "", f"one of {', '.join(OPTIMISERS)}", self.optimiser)
        if self.formulation not in FORMULATIONS_REGISTRY:
            raise InputError("formulation", "", f"one of {', '.join(FORMULATIONS_REGISTRY)}",
                             self.formulation)
        FORMULATIONS_REGISTRY.check(self.formulation, "optimiser", self.optimiser)
        return self


class HierarchicalPlacement(_Model):
    """The hierarchical placer, with its improvement phase (docs/placement.md)."""

    placer: Annotated[Literal["hierarchical"],
                      Flag("--placer", "choice", choices=lambda: tuple(PLACERS))] = "hierarchical"
    """placement policy of the aggregate formulation"""
    spread_replicas: Annotated[bool, Flag("--spread-replicas", "switch")] = False
    """place replicas of one LLM on different nodes when possible"""
    improve: Annotated[bool, Flag("--no-improve", "negated-switch")] = True
    """run the improvement phase (local search); --no-improve skips it"""
    repack: Annotated[int, Flag("--repack", "seed", "N")] = 0
    """exact repackings of node pairs after the local search"""


class SimplePlacement(_Model):
    """A placer without an improvement phase (ffd, best-fit, blocks)."""

    placer: Literal["ffd", "best-fit", "blocks"]
    spread_replicas: bool = False
    """place replicas of one LLM on different nodes when possible"""


Placement = Annotated[HierarchicalPlacement | SimplePlacement, Field(discriminator="placer")]


class Engine(_Model):
    """The serving engine's settings, as vLLM names them (default: vLLM's)."""

    max_batch: Annotated[int | None, Flag("--max-num-seqs", "count", group="engine")] = None
    """calls a replica runs at once (vLLM --max-num-seqs; default 256)"""
    block_size: Annotated[int | None, Flag("--block-size", "count", group="engine")] = None
    """tokens per KV block (default 16)"""
    max_num_batched_tokens: Annotated[int | None, Flag("--max-num-batched-tokens", "count",
                                                       group="engine")] = None
    """prompt tokens one iteration takes (default: unlimited)"""
    kv_management: Annotated[Literal["paged", "reserve"] | None,
                             Flag("--kv", "choice", group="engine",
                                  choices=lambda: ("paged", "reserve"))] = None
    """KV cache: paged blocks with preemption (vLLM, the default) or a call's whole length
    reserved at admission"""
    policy: Any = None
    """a scepsy_profile.serving.MemoryPolicy in place of the fields (the Python API; plan.json
    records its fields)"""

    @model_validator(mode="after")
    def _in_range(self) -> Engine:
        for name, most, what in (("max_batch", MAX_NUM_SEQS, "calls a replica runs at once"),
                                 ("block_size", MAX_BLOCK_SIZE, "tokens per KV block"),
                                 ("max_num_batched_tokens", MAX_BATCHED_TOKENS,
                                  "prompt tokens one iteration takes")):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= most:
                raise InputError(SOURCE, name, f"1 to {most} {what}", value)
        return self

    def memory_policy(self) -> Any:
        """The :class:`~scepsy_profile.serving.MemoryPolicy` (None: the defaults)."""
        given = {k: v for k, v in self.model_dump(exclude={"policy"}).items() if v is not None}
        if self.policy is not None:
            if given:
                raise InputError(SOURCE, sorted(given)[0], "either engine= or the engine "
                                 "fields, not both", given)
            if isinstance(self.policy, Mapping):  # a recorded request's (plan.json)
                return MemoryPolicy(**self.policy)
            if not isinstance(self.policy, MemoryPolicy):
                raise InputError("engine", "", "a MemoryPolicy (the engine's settings) or None",
                                 type(self.policy).__name__)
            return self.policy
        return MemoryPolicy(**given) if given else None


class PlanRequest(_Model):
    """One plan: inputs, objective, constraints, search, placement, engine (module
    docstring)."""

    inputs: Inputs
    objective: Objective = Field(default_factory=MinLatency)
    constraints: Constraints = Field(default_factory=Constraints)
    search: Search = Field(default_factory=Search)
    placement: Placement = Field(default_factory=HierarchicalPlacement)
    engine: Engine = Field(default_factory=Engine)

    @model_validator(mode="after")
    def _combinations(self) -> PlanRequest:
        has_current = self.inputs.current is not None
        if self.search.optimiser == "user" and not has_current:
            raise InputError("optimiser", "", "'user' together with current= (the allocation "
                             "it evaluates)", self.search.optimiser)
        if self.search.change_penalty_s and not has_current:
            raise InputError("change_penalty_s", "", "a current allocation to count changed "
                             "replicas against (current=)", self.search.change_penalty_s)
        return self

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> PlanRequest:
        """The request ``data`` describes (nested mappings), or the :class:`InputError` of its
        first invalid field."""
        data = dict(data)
        search = data.get("search")
        if isinstance(search, Mapping) and isinstance(search.get("options"), Mapping):
            # plan.json of an earlier version kept the API-only fields under search.options
            search = dict(search)
            data["search"] = {**search.pop("options"), **search}
        for key, tag, default in (("objective", "kind", "min-latency"),
                                  ("placement", "placer", "hierarchical")):
            if isinstance(data.get(key), Mapping) and tag not in data[key]:
                data[key] = {tag: default, **data[key]}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _input_error(exc) from None

    def plan_options(self, **resolved: Any) -> PlanOptions:
        """The :class:`~scepsy_opt.planning.problem.PlanOptions` of this request. ``resolved``
        holds what only the loaded inputs determine: ``current`` (the loaded allocation),
        ``latency_bound_s``, ``latency_bounds`` and ``slos`` resolved per workflow or LLM
        (:func:`scepsy.api.problem_of`)."""
        s = self.search
        return PlanOptions(
            objective=self.objective.kind, tps=s.tps, shares=s.shares,
            shares_within_profile=s.shares_within_profile, memory_shares=s.memory_shares,
            max_utilisation=s.max_utilisation, time_limit_s=s.time_limit_s, gap_rel=s.gap_rel,
            change_penalty_s=s.change_penalty_s, weights=dict(s.weights),
            prune_rel=s.prune_rel, max_replicas=s.max_replicas, reduce=s.reduce,
            length_routing=s.length_routing, length_buckets=s.length_buckets, **resolved)

    def placer_options(self) -> dict[str, Any]:
        """The options the placer is built with (only those that differ from its defaults)."""
        p = self.placement
        out: dict[str, Any] = {"spread_replicas": True} if p.spread_replicas else {}
        if isinstance(p, HierarchicalPlacement) and (not p.improve or p.repack):
            out.update(improve=p.improve, repack=p.repack)
        return out

    def record(self) -> dict[str, Any]:
        """The request as plan.json keeps it: JSON values only; a path as given, an object
        given in place of a file as ``"<TypeName>"``."""
        out = _recorded(self)
        policy = self.engine.policy
        if policy is not None and not isinstance(policy, Mapping):  # its fields, to read back
            out["engine"]["policy"] = _recorded(dataclasses.asdict(policy))
        return out


_API_ONLY = {"latency"}
"""Fields holding Python objects only the API passes (a latency model): left out of the
record."""


def _recorded(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {k: _recorded(getattr(value, k)) for k in type(value).model_fields
                if k not in _API_ONLY}
    if isinstance(value, Mapping):
        return {str(k): _recorded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_recorded(v) for v in value]
    if isinstance(value, str | os.PathLike):
        return os.fspath(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return f"<{type(value).__name__}>"


def _input_error(exc: ValidationError) -> InputError:
    """The first error of ``exc`` as an :class:`InputError` naming the request field."""
    err = exc.errors(include_url=False)[0]
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, InputError):
        return cause
    loc = [str(p) for p in err["loc"] if not isinstance(p, int)]
    # a union's branch name (the objective or placer chosen) is not a field
    loc = [p for p in loc if p not in _BRANCHES]
    field = loc[-1] if loc else ""
    if err["type"] == "extra_forbidden":
        return InputError(SOURCE, field, f"no {field} in this request ({_not_here(loc)})",
                          err.get("input"))
    if err["type"] == "union_tag_invalid":
        expected = err.get("ctx", {}).get("expected_tags", "")
        tag = str(err.get("ctx", {}).get("discriminator", field)).strip("'")
        return InputError(SOURCE, tag, f"one of {expected}", err.get("ctx", {}).get("tag"))
    return InputError(SOURCE, field, err["msg"].removeprefix("Value error, ").lower(),
                      err.get("input"))


_BRANCHES = {"min-latency", "max-throughput", "min-cost", "hierarchical", "ffd", "best-fit",
             "blocks", "HierarchicalPlacement", "SimplePlacement"}


def _not_here(loc: list[str]) -> str:
    field = loc[-1] if loc else ""
    if field in ("latency_bound_s",):
        return ("objective 'max-throughput' or 'min-cost': a min-latency plan already minimises "
                "the latencies; mean bounds apply when maximising throughput or minimising cost")
    if field == "prices":
        return "prices apply to objective 'min-cost'"
    if field in ("improve", "repack"):
        return "only the hierarchical placer has an improvement phase"
    return "not a field here"


# ------------------------------------------------------------------------------ the flags


def _models() -> Iterator[tuple[tuple[str, ...], type[_Model]]]:
    yield ("inputs",), Inputs
    for cls in (MinLatency, MaxThroughput, MinCost):
        yield ("objective",), cls
    yield ("constraints",), Constraints
    yield ("search",), Search
    for pl in (HierarchicalPlacement, SimplePlacement):
        yield ("placement",), pl
    yield ("engine",), Engine


def flag_fields() -> tuple[FlagField, ...]:
    """Every field of the plan request with a :class:`~scepsy_common.flags.Flag`, once per
    option, in the order of the request."""
    return fields_with_flags(_models())


def flag_names() -> dict[str, str]:
    """Each request field (its last name) -> its option(s), for error messages; the mean
    bound, which ``--latency-bound`` also sets, included."""
    out = {f.path[-1]: "/".join((f.flag.name, *f.flag.also)) for f in flag_fields()}
    out.update(latency_bound_s="--latency-bound", targets="--target", kind="--objective",
               window_s="--peak-window", quantile="--peak-quantile",
               placer="--placer", improve="--no-improve", policy="--placer")
    return out


def request_data(given: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """The nested data of a request from values by field path (``("search", "tps") -> (1,
    2)``), ready for :meth:`PlanRequest.of`."""
    data: dict[str, Any] = {}
    for path, value in given.items():
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return data
