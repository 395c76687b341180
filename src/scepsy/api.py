"""scepsy's main jobs as Python functions: :func:`plan`, :func:`predict`, :func:`simulate`.

Each takes the same things the command line does: the workflows (a workflow, workload or rate
workload YAML path, :class:`~scepsy_opt.workflows.WorkflowSpec` objects or a
:class:`~scepsy_opt.ratework.RateWorkload`), the cluster or allocation (a path or a loaded
object) and the rates (a total, split over a workload's weights, or a mapping workflow ->
req/s; optional for a rate workload, whose file gives them, docs/rate-workloads.md). Each
builds the trace (generated, or ``trace=`` a recorded one), its statistics and the latency model
(the roofline, or ``curves=`` fitted curves on top, with ``overheads=`` a calibration of the
engine's overheads added), and calls the library. ``scepsy plan``, ``scepsy predict`` and ``scepsy simulate`` are these functions
plus argument parsing and printing. Bad input raises :class:`~scepsy_common.errors.InputError`
naming the argument or file and what was expected, before any work is done.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scepsy_common.errors import InputError, check_rate
from scepsy_opt.workflows import DEFAULT_TRACE_REQUESTS

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from scepsy.evaluation import PredictRequest, SimulateRequest
    from scepsy_opt.allocation import Allocation
    from scepsy_opt.cluster import Cluster
    from scepsy_opt.planning.coverage import ShareExtrapolation
    from scepsy_opt.planning.plans import Plan, Termination
    from scepsy_opt.planning.problem import PlanningProblem
    from scepsy_opt.prediction.pipeline import Prediction
    from scepsy_opt.prediction.simulate import SimulationResult
    from scepsy_opt.traces import Trace
    from scepsy_opt.workflows import WorkflowSpec
    from scepsy_place.formulations.loop import PlacedPlan
    from scepsy_place.packing.topology import Topology
    from scepsy_place.request import PlanRequest
    from scepsy_profile.catalog import Catalog
    from scepsy_profile.latency import LatencyModel
    from scepsy_serve.launch.planfile import SolveReport

    Overheads = Any  # a path or a scepsy_profile.overheads.EngineOverheads

PathLike = str | os.PathLike[str]
Rates = float | Mapping[str, float]
OptionalRates = Rates | None  # None: a rate workload's own rates
Progress = Callable[[str], None]


@dataclass(frozen=True)
class PlanResult:
    """What :func:`plan` returns: the problem it solved and its placed plan.

    ``plan`` is the plan handed on (an allocation only when every replica is placed; otherwise
    its ``status`` says why: ``infeasible`` only when proven, ``unplaced``,
    ``time_limit_no_solution``); ``placed`` has the placement, the rounds and the formulations
    compared. :meth:`to_dict` is the plan.json document.
    """

    problem: PlanningProblem
    placed: PlacedPlan
    placer: str  # the placement policy asked for
    topology: Topology | None = None  # the cluster placed on (its node names go to plan.json)
    peak: Any = None  # the PeakTarget the targets came from (arrivals=), plan.json solver.arrivals
    request: PlanRequest | None = None  # the request that produced it, plan.json ``request``

    @property
    def plan(self) -> Plan:
        return self.placed.answer

    @property
    def allocation(self) -> Allocation | None:
        return self.plan.allocation

    @property
    def termination(self) -> Termination:
        """How the search ended (:class:`~scepsy_opt.planning.plans.Termination`: optimal,
        feasible, infeasible, no_solution or unplaced, and the limit that ended it)."""
        return self.placed.termination

    @property
    def workflow_latencies(self) -> dict[str, float]:
        """Each workflow's predicted mean latency (s) under the placed allocation."""
        from scepsy_opt.planning.plans import workflow_latencies

        if self.plan.allocation is None:
            return {}
        p = self.problem
        return workflow_latencies(p.scaled(self.plan.scale) if self.plan.scale != 1.0 else p,
                                  self.plan)

    @property
    def extrapolated_shares(self) -> dict[str, ShareExtrapolation]:
        """Per LLM of the placed allocation whose share lies outside the shares its latency
        curves were measured at (:func:`scepsy_opt.planning.coverage.extrapolated_shares`; plan.json's
        ``llms.<llm>.extrapolated_share``): its latency is extrapolated. Empty without an
        allocation, or with ``shares_within_profile``."""
        from scepsy_opt.planning.coverage import extrapolated_shares

        return extrapolated_shares(self.problem, self.plan.allocation)

    def to_dict(self, *, timings: bool = True) -> dict[str, Any]:
        """The plan.json document (docs/optimiser.md); ``timings=False`` leaves out wall-clock
        seconds, so that the same inputs give the same bytes."""
        from scepsy_place.formulations.loop import plan_document
        from scepsy_profile.catalog import catalog_in_force

        with catalog_in_force(self.problem.catalog):
            doc = plan_document(self.problem, self.placed, policy=self.placer, timings=timings,
                                topology=self.topology)
        if self.peak is not None:
            doc["solver"]["arrivals"] = self.peak.to_dict()
        if self.request is not None:
            doc["request"] = self.request.record()
        return doc

    @property
    def report(self) -> SolveReport:
        """The typed solve report (:class:`~scepsy_serve.launch.planfile.SolveReport`): how
        the plan ended, its bound and gap, each formulation compared, the solver's
        statistics."""
        from scepsy_serve.launch.planfile import SolveReport

        return SolveReport.of(self.to_dict(timings=False))

    def write(self, path: PathLike, *, timings: bool = True) -> Path:
        """Write :meth:`to_dict` to ``path`` atomically (nothing half-written) and return the
        path written: ``path``, or, for a plan without a placement where ``path`` holds a placed
        plan, ``NAME.failed.json`` beside it
        (:func:`~scepsy_serve.launch.planfile.write_plan_file`)."""
        from scepsy_serve.launch.planfile import write_plan_file

        return write_plan_file(path, self.to_dict(timings=timings))


# --------------------------------------------------------------------------------- catalog


def load_catalog(catalog: PathLike | Catalog) -> Catalog:
    """The catalog a ``catalog=`` argument stands for: a YAML file (or a :class:`Catalog`)
    whose entries extend or override the bundled catalog (``--catalog FILE``)."""
    from scepsy_profile.catalog import Catalog, default_catalog
    from scepsy_profile.catalog import load_catalog as _load

    if isinstance(catalog, Catalog):
        return default_catalog().merge(catalog)
    if isinstance(catalog, str | os.PathLike):
        return _load(catalog, base=default_catalog())
    raise InputError("catalog", "", "a catalog YAML path or a Catalog", type(catalog).__name__)


@contextlib.contextmanager
def using_catalog(catalog: PathLike | Catalog | None) -> Iterator[Catalog]:
    """Within the block, every lookup of the default catalog (``default_catalog()``, which the
    libraries consult wherever no catalog is passed down: workflow files, clusters,
    allocations, trace generation) sees ``catalog``'s entries too (:func:`load_catalog`), in
    this thread or task only (:func:`scepsy_profile.catalog.catalog_in_force`). ``None``
    changes nothing. Yields the catalog in force."""
    from scepsy_profile.catalog import catalog_in_force

    with catalog_in_force(None if catalog is None else load_catalog(catalog)) as cat:
        yield cat


# ---------------------------------------------------------------------------------- inputs


def _specs(workflows: Any) -> tuple[WorkflowSpec, ...]:
    from scepsy_opt.workload import as_specs

    return as_specs(workflows)


def _specs_rates(workflows: Any, rates: OptionalRates, what: str
                 ) -> tuple[tuple[WorkflowSpec, ...], dict[str, float]]:
    """The specs and their per-workflow rates (:func:`scepsy_opt.workload.resolve_rates`)."""
    from scepsy_opt.workload import resolve_rates, specs_and_rates

    specs, file_rates = specs_and_rates(workflows)
    return specs, resolve_rates(specs, rates, file_rates, what)


def load_overheads(overheads: PathLike | Any) -> Any:
    """The :class:`~scepsy_profile.overheads.EngineOverheads` an ``overheads=`` argument stands
    for: a calibration file (YAML or JSON, ``scepsy profile calibrate``) or the object itself."""
    from scepsy_profile.overheads import EngineOverheads
    from scepsy_profile.overheads import load_overheads as _load

    if isinstance(overheads, EngineOverheads):
        return overheads
    if isinstance(overheads, str | os.PathLike):
        return _load(overheads)
    raise InputError("overheads", "", "an overheads file path or an EngineOverheads",
                     type(overheads).__name__)


def _latency(curves: PathLike | None, latency: LatencyModel | None,
             catalog: Catalog | None = None, overheads: Overheads | None = None
             ) -> LatencyModel:
    """The latency model: ``latency``, or the roofline with ``curves`` on top; wrapped with
    the engine ``overheads`` when given (:func:`scepsy_profile.overheads.with_overheads`)."""
    from scepsy_profile.latency import CompositeLatencyModel
    from scepsy_profile.roofline import roofline_model

    if latency is not None:
        if curves is not None:
            raise InputError("plan", "curves", "either curves= or latency=, not both", curves)
        model = latency
    elif curves is None:
        model = roofline_model(catalog)
    else:
        from scepsy_profile.fitted import load_curves

        model = CompositeLatencyModel(load_curves(curves), roofline_model(catalog))
    if overheads is None:
        return model
    from scepsy_profile.overheads import with_overheads

    return with_overheads(model, load_overheads(overheads))


def _latency_bounds(specs: Sequence[WorkflowSpec], bounds: Any) -> dict[str, tuple[float, float]]:
    """Percentile latency bounds: ``(percentile, seconds)`` for every workflow, or a mapping
    workflow -> ``(percentile, seconds)``; percentiles in (0, 100), seconds > 0."""
    names = [s.name for s in specs]
    items = bounds.items() if isinstance(bounds, Mapping) else [(w, bounds) for w in names]
    out: dict[str, tuple[float, float]] = {}
    for w, b in items:
        if w not in names:
            raise InputError("latency_bounds", str(w), f"a workflow of the workload "
                             f"({', '.join(names)})", w)
        ok = isinstance(b, tuple | list) and len(b) == 2 and all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
            for x in b)
        if not ok or not (0 < b[0] < 100 and b[1] > 0):
            raise InputError("latency_bounds", str(w), "(percentile in (0, 100), seconds > 0)",
                             b)
        out[str(w)] = (float(b[0]), float(b[1]))
    if not out:
        raise InputError("latency_bounds", "", "a bound for at least one workflow", bounds)
    return out


def _allocation(allocation: PathLike | Allocation, what: str, *, check_gpus: bool = False
                ) -> Allocation:
    """The allocation: a file's (whose GPU names :func:`parse_allocation` checks against the
    catalog) or the object given, its GPU names checked when ``check_gpus``."""
    from scepsy_common.files import read_yaml
    from scepsy_opt.allocation import Allocation, is_plan_document, parse_allocation

    if isinstance(allocation, Allocation):
        if check_gpus:
            _check_gpus(allocation, what)
        return allocation
    if isinstance(allocation, str | os.PathLike):
        source = str(Path(allocation))  # read once: as an allocation, and whole if a plan.json
        raw = read_yaml(allocation, "allocation file (YAML or JSON)")
        alloc = parse_allocation(raw, source)
        if is_plan_document(raw):  # a plan.json is checked whole, as launch checks it
            from scepsy_serve.launch.planfile import parse_plan

            parse_plan(raw, source)
        return alloc
    raise InputError(what, "", "an allocation file path or an Allocation",
                     type(allocation).__name__)


def _check_gpus(alloc: Allocation, source: str) -> None:
    """Every GPU type ``alloc`` names is one of the catalog's."""
    from scepsy_profile.catalog import default_catalog

    cat = default_catalog()
    for m, inst in alloc.llms.items():
        try:
            cat.gpu(inst.gpu)
        except InputError as exc:
            raise InputError(source, f"llms.{m}.gpu", exc.expected, inst.gpu) from None


def _topology(cluster: PathLike | Topology | Cluster) -> Topology:
    from scepsy_opt.cluster import Cluster
    from scepsy_place.packing.topology import Topology, from_cluster, load_topology

    if isinstance(cluster, Topology):
        return cluster
    if isinstance(cluster, Cluster):
        return from_cluster(cluster)
    if isinstance(cluster, str | os.PathLike):
        return load_topology(cluster)
    raise InputError("cluster", "", "a cluster file path, a Topology or a Cluster",
                     type(cluster).__name__)


def _count(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(name, "", f"an integer >= {low}", value)
    return value


def _trace(specs: Sequence[WorkflowSpec], trace: PathLike | Trace | None, requests: int,
           seed: int) -> Trace:
    from scepsy_opt.workload import workload_trace

    _count(seed, "seed", 0)
    if trace is None:
        _count(requests, "trace_requests", 1)
    elif requests != DEFAULT_TRACE_REQUESTS:  # it would change nothing
        raise InputError("trace_requests", "", "no requests count together with a recorded "
                         "trace (it sizes a generated trace; a recorded one is used whole: "
                         "drop one of the two)", requests)
    return workload_trace(specs, trace, requests=requests, seed=seed)


def _stats(specs: Sequence[WorkflowSpec], trace: Trace, seed: int) -> dict[str, Any]:
    from scepsy_opt.stats import workflow_stats

    return {s.name: workflow_stats(trace, s.name, seed=seed) for s in specs}


def _bounds(specs: Sequence[WorkflowSpec], bound: float | Mapping[str, float] | None
            ) -> dict[str, float]:
    """A latency bound (s) for every workflow, or per workflow."""
    if bound is None:
        return {}
    if isinstance(bound, Mapping):
        from scepsy_opt.workload import per_workflow_rates

        return per_workflow_rates(specs, bound, "latency_bound_s")
    if isinstance(bound, bool) or not (isinstance(bound, int | float) and math.isfinite(bound)
                                       and bound > 0):
        raise InputError("latency_bound_s", "", "a latency bound > 0 s", bound)
    return dict.fromkeys((s.name for s in specs), float(bound))


def check_grid(specs: Sequence[WorkflowSpec], topology: Topology, tps: Sequence[int],
               shares: Sequence[float]) -> None:
    """Reject a TP or share grid the LLMs of ``specs`` cannot use on ``topology``'s GPUs: a TP
    degree none of their models supports, a grid that leaves an LLM no TP degree its model
    supports within one NVLink domain of the cluster (``tps``), or an LLM that fits in memory
    at no share of the grid but would at a larger one (``shares``). TP degrees above the
    cluster's NVLink domains are otherwise left unused. A model too large for every GPU
    at every share is not a grid problem: the optimiser reports it as infeasible. The default
    grid (``PlanOptions().tps``) is the set to choose from, not a request: its degrees that no
    model supports (8 for a model of 28 heads) are left unused like those above the domains."""
    from scepsy_opt.planning.problem import PlanOptions
    from scepsy_opt.workload import models_of
    from scepsy_profile.catalog import default_catalog
    from scepsy_profile.serving import memory_fit

    cat = default_catalog()
    cluster = topology.to_cluster()
    gpus = list(cluster.budgets())
    models = models_of(specs)
    usable = {(m, g): [t for t in range(1, cluster.max_tp(g, cat) + 1)
                       if cat.model(models[m]).supports_tp(t)]
              for m in models for g in gpus}
    allowed = sorted({t for ts in usable.values() for t in ts})
    if tuple(tps) != PlanOptions().tps and any(
            not any(cat.model(model).supports_tp(t) for model in models.values()) for t in tps):
        raise InputError("tps", "", "TP degrees the workflows' models support (on this "
                         f"cluster: {', '.join(map(str, allowed))})", ",".join(map(str, tps)))
    for m, model in sorted(models.items()):
        if not any(t in tps for g in gpus for t in usable[(m, g)]):
            raise InputError("tps", "", f"a TP degree {m} ({model}) can use on the cluster "
                             f"({', '.join(map(str, sorted({t for g in gpus for t in usable[(m, g)]})))})",
                             ",".join(map(str, tps)))

        def fits(share: float, grid_tps: Sequence[int], m: str = m, model: str = model) -> bool:
            return any(memory_fit(model, g, t, share, 1, cat).feasible
                       for g in gpus for t in usable[(m, g)] if t in grid_tps)

        if not any(fits(s, tps) for s in shares) and fits(1.0, tps):
            least = next(s / 100 for s in range(1, 101) if fits(s / 100, tps))
            raise InputError("shares", "", f"GPU shares in (0, 1] at which {m} ({model}) fits "
                             f"in memory (>= {least:g})", ",".join(f"{s:g}" for s in shares))


def plan_problem(workflows: Any, cluster: PathLike | Topology | Cluster,
                 targets: OptionalRates = None, *, progress: Progress | None = None,
                 **kwargs: Any) -> tuple[PlanningProblem, Topology]:
    """The :class:`~scepsy_opt.planning.problem.PlanningProblem` and topology :func:`plan` solves
    (arguments as there: they build a :class:`~scepsy_place.request.PlanRequest`,
    :func:`plan_request`); every check on the inputs happens here, before any solving."""
    request = plan_request(workflows, cluster, targets, **kwargs)
    return problem_of(request, request.inputs.targets, progress=progress)


def problem_of(request: PlanRequest, targets: OptionalRates, *,
               progress: Progress | None = None) -> tuple[PlanningProblem, Topology]:
    """The problem and topology of ``request`` at ``targets`` (the request's own, or those
    its arrivals' peak window sets, :func:`run_plan`): the files loaded, the bounds and SLOs
    resolved per workflow and LLM, the trace built and its statistics taken."""
    with using_catalog(request.inputs.catalog) as cat:
        return _problem_of(request, targets, progress,
                           cat if request.inputs.catalog is not None else None)


def _problem_of(request: PlanRequest, targets: OptionalRates, progress: Progress | None,
                catalog: Catalog | None) -> tuple[PlanningProblem, Topology]:
    from scepsy_opt.planning.problem import PlanningProblem
    from scepsy_opt.workload import models_of

    inp, obj, cons = request.inputs, request.objective, request.constraints
    say = progress or (lambda _s: None)
    say("reading the workflows and the cluster")
    specs, rates = _specs_rates(inp.workflow, targets, "targets")
    topology = _topology(inp.cluster)
    pools = _pools(inp.cluster, topology, catalog, getattr(obj, "prices", None))
    cur = None
    if inp.current is not None:
        cur = _allocation(inp.current, "current", check_gpus=True)
        cur.require_partitions("scepsy plan --current")
    resolved: dict[str, Any] = {
        "current": cur, "latency_bound_s": _bounds(specs, getattr(obj, "latency_bound_s", None))}
    if cons.latency_bounds is not None:
        resolved["latency_bounds"] = _latency_bounds(specs, cons.latency_bounds)
    if cons.slos is not None:
        from scepsy_opt.prediction.slo import parse_slos

        called = sorted({m for s in specs if s.name in rates for m in s.llms})
        resolved["slos"] = parse_slos(cons.slos, called)
    opts = request.plan_options(**resolved)
    check_grid(specs, topology, opts.tps, opts.shares)
    lat = _latency(inp.curves, inp.latency, catalog, inp.overheads)
    say("building the trace and its statistics")
    stats = _stats(specs, _trace(specs, inp.trace, inp.trace_requests, inp.seed), inp.seed)
    problem = PlanningProblem(stats, models_of(specs), rates, pools, lat, opts,
                              catalog=catalog, policy=request.engine.memory_policy())
    return problem, topology


def _pools(cluster: PathLike | Topology | Cluster, topology: Topology, catalog: Catalog | None,
           prices: Mapping[str, float] | None) -> Cluster:
    """The optimiser's cluster: the topology's pools, or the pools file (or :class:`Cluster`)
    as given when it prices GPUs or leaves pools open (``nodes: auto``); ``prices`` (USD per
    GPU-hour by GPU type, ``--price``) override."""
    from scepsy_common.files import read_yaml
    from scepsy_opt.cluster import Cluster, parse_cluster, with_prices

    src = cluster if isinstance(cluster, Cluster) else None
    if isinstance(cluster, str | os.PathLike):
        raw = read_yaml(cluster, "topology or cluster file (YAML or JSON)")
        if isinstance(raw, dict) and "pools" in raw and "racks" not in raw:
            src = parse_cluster(raw, str(cluster), catalog)
    out = topology.to_cluster(catalog)
    if src is not None and (src.open or any(p.price_per_hour is not None for p in src.pools)):
        out = src
    return with_prices(out, prices) if prices else out


def plan(workflows: Any, cluster: PathLike | Topology | Cluster, targets: OptionalRates = None,
         *, progress: Progress | None = None, **options: Any) -> PlanResult:
    """The placed plan serving ``workflows`` at ``targets`` on ``cluster``.

    ``workflows``: a workflow, workload or rate workload YAML path, specs or a
    :class:`~scepsy_opt.ratework.RateWorkload`; ``cluster``: a cluster YAML/JSON
    path, a :class:`~scepsy_place.packing.topology.Topology` or a :class:`~scepsy_opt.cluster.Cluster`;
    ``targets``: a total throughput (req/s, split over a workload's weights) or a mapping
    workflow -> req/s; for a rate workload ``None`` (the default) means the file's rates and a
    total rescales them proportionally. Options: ``optimiser``
    (:data:`~scepsy_opt.planning.optimisers.OPTIMISERS`; ``user`` evaluates ``current``),
    ``formulation`` (``auto``, ``aggregate``, ``blocks``, ``patterns``), ``placer`` (:data:`~scepsy_place.packing.placement.PLACERS`), ``spread_replicas``, ``max_rounds``;
    ``trace``, ``trace_requests``, ``seed``, ``curves`` or ``latency``; ``overheads`` (an
    engine-overheads calibration file or object, :func:`load_overheads`, added to the latency
    model); ``engine`` (a :class:`~scepsy_profile.serving.MemoryPolicy`: the serving engine's
    settings, vLLM's ``max_num_seqs`` as ``max_batch``, KV block size and management, token
    budget; the defaults when None); ``current`` (a path or an
    :class:`~scepsy_opt.allocation.Allocation`), ``latency_bound_s`` (max-throughput only: a
    mean-latency bound for every workflow or per workflow), ``latency_bounds`` (where the
    optimiser supports them: ``(percentile, seconds)`` for every workflow or a mapping
    workflow -> ``(percentile, seconds)``), ``slos`` (per LLM, or ``"*"`` for every LLM the
    targeted workflows call: a :class:`~scepsy_opt.prediction.slo.CallSLO` or ``{ttft_s, tpot_s,
    ttft_percentile}``, docs/slo.md) and every other field of
    :class:`~scepsy_opt.planning.problem.PlanOptions` (``objective``, ``tps``, ``shares``,
    ``time_limit_s``, ...). ``progress`` is called with the name of each stage as it starts.
    ``catalog``: a catalog YAML path (or :class:`~scepsy_profile.catalog.Catalog`) extending
    the bundled one, for devices and models it lacks (:func:`using_catalog`). ``prices``:
    USD per GPU-hour by GPU type (``--price``, the min-cost objective; overriding the cluster
    file's and the catalog's). ``improve`` (default on) and ``repack`` (exact repackings of
    node pairs, default 0): the hierarchical placer's improvement phase (docs/placement.md).
    The objective minimised is the weighted sum of the workflows' predicted mean latencies
    (``objective="min-cost"``: the price per hour of the GPUs, within ``latency_bound_s`` and
    ``latency_bounds``, docs/min-cost.md).
    ``arrivals``: recorded arrival times (a file or :class:`~scepsy_opt.arrivals.Arrivals`,
    ``time_scale`` times as fast) in place of ``targets``: the plan carries the rate of their
    window of ``peak_window_s`` (default 60 s) at ``peak_quantile`` of the windows (default
    1: the busiest), split over the workflows as a total target is (docs/arrivals.md).
    """
    return run_plan(plan_request(workflows, cluster, targets, **options), progress=progress)


_INPUTS = ("trace", "trace_requests", "seed", "curves", "latency", "overheads", "current")
_SEARCH = ("tps", "shares", "shares_within_profile", "memory_shares", "max_utilisation",
           "time_limit_s", "gap_rel", "change_penalty_s", "length_routing", "length_buckets")
_API_SEARCH = ("weights", "prune_rel", "max_replicas", "reduce")
_ARGUMENTS = tuple(sorted({*_INPUTS, *_SEARCH, *_API_SEARCH, "optimiser", "formulation",
                           "max_rounds", "objective", "latency_bound_s", "prices",
                           "latency_bounds", "slos", "placer", "spread_replicas", "improve",
                           "repack", "engine", "catalog", "arrivals", "peak_window_s",
                           "peak_quantile", "time_scale"}))
"""Every keyword of :func:`plan` and :func:`plan_request` beside the three positional ones."""


def plan_request(workflows: Any, cluster: PathLike | Topology | Cluster,
                 targets: OptionalRates = None, **kwargs: Any) -> PlanRequest:
    """The :class:`~scepsy_place.request.PlanRequest` of :func:`plan`'s arguments (the same
    names), validated: a combination that cannot work raises :class:`InputError` naming the
    argument."""
    from scepsy_place.request import PlanRequest

    kw = dict(kwargs)
    inputs = {"workflow": workflows, "cluster": cluster, "targets": targets,
              "catalog": kw.pop("catalog", None),
              **{k: kw.pop(k) for k in _INPUTS if k in kw}}
    for k in ("arrivals", "peak_window_s"):
        if kw.get(k) is not None:
            inputs[k] = kw.pop(k)
        kw.pop(k, None)
    for k in ("peak_quantile", "time_scale"):
        if k in kw:
            inputs[k] = kw.pop(k)
    objective = {"kind": kw.pop("objective", "min-latency")}
    for k in ("latency_bound_s", "prices"):
        if kw.get(k) is not None:
            objective[k] = kw.pop(k)
        kw.pop(k, None)
    constraints = {k: kw.pop(k) for k in ("latency_bounds", "slos") if k in kw}
    search = {k: kw.pop(k) for k in ("optimiser", "formulation", "max_rounds", *_SEARCH)
              if k in kw}
    placement: dict[str, Any] = {"placer": kw.pop("placer", "hierarchical")}
    if kw.pop("spread_replicas", False):
        placement["spread_replicas"] = True
    improve, repack = kw.pop("improve", True), kw.pop("repack", 0)
    if not improve:
        placement["improve"] = improve
    if repack:
        placement["repack"] = repack
    engine = {"policy": kw.pop("engine")} if kw.get("engine") is not None else {}
    kw.pop("engine", None)
    search.update({k: kw.pop(k) for k in _API_SEARCH if k in kw})
    if kw:
        name = sorted(kw)[0]
        raise InputError("plan", name, f"an argument of scepsy.plan ({', '.join(_ARGUMENTS)})",
                         kw[name])
    return PlanRequest.of({"inputs": inputs, "objective": objective,
                           "constraints": constraints, "search": search,
                           "placement": placement, "engine": engine})


def run_plan(request: PlanRequest, *, progress: Progress | None = None) -> PlanResult:
    """:func:`plan` of a :class:`~scepsy_place.request.PlanRequest` (``scepsy plan`` builds one
    from its options); the result records the request (plan.json ``request``)."""
    from scepsy_opt.arrivals import PEAK_WINDOW_S, peak_target
    from scepsy_place.formulations.loop import plan_and_place
    from scepsy_profile.catalog import catalog_in_force

    inp, search = request.inputs, request.search
    peak = None
    targets = inp.targets
    if inp.arrivals is not None:
        peak = peak_target(_arrivals(inp.arrivals, inp.time_scale),
                           PEAK_WINDOW_S if inp.peak_window_s is None else inp.peak_window_s,
                           inp.peak_quantile)
        targets = peak.rate
    problem, topology = problem_of(request, targets, progress=progress)
    with catalog_in_force(problem.catalog):  # already merged with the bundled one
        if progress is not None:
            progress(f"optimising and placing ({search.formulation} formulation)")
        res = plan_and_place(problem, topology, name=search.optimiser,
                             policy=request.placement.placer, max_rounds=search.max_rounds,
                             placer_options=request.placer_options(),
                             formulation=search.formulation)  # type: ignore[arg-type]
    # a plan of LLMs split over GPU types answers the problem of their replica groups
    return PlanResult(res.problem or problem, res, request.placement.placer, topology, peak,
                      request)


def _arrivals(arrivals: Any, time_scale: float) -> Any:
    """Recorded arrival times (a file or :class:`~scepsy_opt.arrivals.Arrivals`),
    ``time_scale`` times as fast."""
    from scepsy_opt.arrivals import Arrivals, load_arrivals

    arr = arrivals if isinstance(arrivals, Arrivals) else load_arrivals(arrivals)
    return arr.scaled(time_scale)


def _predict_inputs(workflows: Any, allocation: PathLike | Allocation, rate: OptionalRates,
                    trace: PathLike | Trace | None, trace_requests: int, seed: int
                    ) -> tuple[tuple[WorkflowSpec, ...], Allocation, dict[str, float], Trace]:
    specs, rates = _specs_rates(workflows, rate, "rate")
    alloc = _allocation(allocation, "allocation")
    called = {m for s in specs for m in s.llms}
    used = called | {g for m in called for g in alloc.splits.get(m, {})}
    for name in alloc.llms:
        if name not in used:
            raise InputError(alloc.source, f"llms.{name}", "an LLM the workflows call (they "
                             f"call {', '.join(sorted(called))}; remove the others)", name)
    return specs, alloc, rates, _trace(specs, trace, trace_requests, seed)


def predict(workflows: Any, allocation: PathLike | Allocation, rate: OptionalRates = None,
            **options: Any) -> Prediction:
    """Each workflow's predicted throughput, maximum throughput and latency at ``rate`` on
    ``allocation`` (the Aggregate LLM Pipeline, docs/predictor.md). The keywords are the
    fields of :class:`~scepsy.evaluation.PredictRequest` and its inputs (``form``, ``trace``,
    ``trace_requests``, ``seed``, ``curves`` or ``latency``, ``overheads``, ``catalog``) and
    ``engine`` (a :class:`~scepsy_profile.serving.MemoryPolicy`); arguments as :func:`plan`
    (``rate`` optional for a rate workload). ``allocation`` may be a plan.json (its
    allocation is read)."""
    from scepsy.evaluation import PredictRequest, request_of, split_keywords

    return run_predict(request_of(PredictRequest, split_keywords(
        workflows, allocation, rate, options)))


def run_predict(request: PredictRequest) -> Prediction:
    """:func:`predict` of a :class:`~scepsy.evaluation.PredictRequest` (``scepsy predict``
    builds one from its options)."""
    from scepsy_opt.prediction.pipeline import predict as _predict
    from scepsy_opt.workload import models_of

    inp = request.inputs
    rate, times = _recorded_rate(request)
    with using_catalog(inp.catalog) as cat:
        specs, alloc, rates, tr = _predict_inputs(inp.workflow, inp.allocation, rate,
                                                  inp.trace, inp.trace_requests, inp.seed)
        own = cat if inp.catalog is not None else None
        return _predict(_stats(specs, tr, inp.seed), models_of(specs), alloc,
                        _latency(inp.curves, inp.latency, own, inp.overheads), rates,
                        form=request.form, catalog=own, policy=request.engine.memory_policy(),
                        arrival_times_s=None if times is None else list(times),
                        seed=inp.seed)


def _recorded_rate(request: PredictRequest | SimulateRequest,
                   ) -> tuple[Any, NDArray[np.float64] | None]:
    """The request's rate and its recorded arrival times (None: Poisson arrivals): with
    arrivals and a workflow that is not a rate workload, the times' mean rate."""
    from scepsy_opt.workload import specs_and_rates

    inp = request.inputs
    if request.arrivals is None:
        return inp.rate, None
    arr = _arrivals(request.arrivals, request.time_scale)
    rate = inp.rate
    if rate is None and specs_and_rates(inp.workflow)[1] is None:  # not a rate workload
        rate = check_rate(arr.mean_rate if math.isfinite(arr.mean_rate) else
                          float(arr.count), arr.source or "arrivals", "",
                          f" as the mean rate of the arrival times ({arr.count} over "
                          f"{arr.span_s:g} s)")
    return rate, arr.times_s


def simulate(workflows: Any, allocation: PathLike | Allocation, rate: OptionalRates = None,
             **options: Any) -> SimulationResult:
    """Simulated throughput and latency of ``requests`` Poisson arrivals at ``rate`` on
    ``allocation`` (the discrete-event simulator, docs/simulator.md); the keywords are the
    fields of :class:`~scepsy.evaluation.SimulateRequest` and its inputs, arguments as
    :func:`plan` (``rate`` optional for a rate workload). ``arrivals``: recorded arrival
    times (a file :func:`scepsy_opt.arrivals.load_arrivals` reads, or
    :class:`~scepsy_opt.arrivals.Arrivals`), ``time_scale`` times as fast, replayed in place
    of the Poisson process (the first ``requests`` of them; ``None``: all); each draws a
    workflow in proportion to the rates (``rate``: a mapping workflow -> rate, or None for
    their mean rate split as for :func:`plan`; a total rate is refused, as the arrivals set
    it) (docs/arrivals.md)."""
    from scepsy.evaluation import SimulateRequest, request_of, split_keywords

    return run_simulate(request_of(SimulateRequest, split_keywords(
        workflows, allocation, rate, options)))


def run_simulate(request: SimulateRequest) -> SimulationResult:
    """:func:`simulate` of a :class:`~scepsy.evaluation.SimulateRequest` (``scepsy simulate``
    builds one from its options)."""
    from scepsy_opt.prediction.simulate import simulate as _simulate
    from scepsy_opt.workload import models_of

    inp = request.inputs
    rate, times = _recorded_rate(request)
    with using_catalog(inp.catalog) as cat:
        specs, alloc, rates, tr = _predict_inputs(inp.workflow, inp.allocation, rate,
                                                  inp.trace, inp.trace_requests, inp.seed)
        own = cat if inp.catalog is not None else None
        lat = _latency(inp.curves, inp.latency, own, inp.overheads)
        policy = request.engine.memory_policy()
        more: dict[str, Any] = {} if policy is None else {"policy": policy}
        models = models_of(specs)
        if any(i.mesh is not None or i.prefill_share is not None for i in alloc.llms.values()):
            from scepsy_opt.prediction.pipeline import phase_latencies, served

            stats, served_models = served(_stats(specs, tr, inp.seed), models, alloc)
            more["latencies"] = phase_latencies(stats, served_models, alloc, lat, rates,
                                                catalog=own, policy=policy)
        if times is not None:
            more["arrival_times_s"] = times
        return _simulate(tr, models, alloc, lat, rates, requests=request.arrivals_count,
                         seed=inp.seed, routing=request.routing, progress=request.progress,
                         **more)


# ------------------------------------------------------------------------------ documents

def prediction_document(pred: Prediction, form: str) -> dict[str, Any]:
    """``scepsy predict --json``'s document (:func:`scepsy_opt.prediction.reports.prediction_to_dict`)."""
    from scepsy_opt.prediction.reports import prediction_to_dict

    return prediction_to_dict(pred, form)


def simulation_document(res: SimulationResult) -> dict[str, Any]:
    """``scepsy simulate --json``'s document (:func:`scepsy_opt.prediction.reports.simulation_to_dict`)."""
    from scepsy_opt.prediction.reports import simulation_to_dict

    return simulation_to_dict(res)


# ---------------------------------------------------------------------------------- launch


def check_launch(target: str, out: PathLike) -> None:
    """Raise :class:`InputError` (source ``launch`` or ``launch-out``) unless ``target`` is a
    launch target and ``out`` a folder its files may be written into: one that does not exist,
    is empty, or was written by a renderer (it holds the marker file). Nothing is written."""
    from scepsy_serve.launch.renderers import check_folder, get_renderer, renderer_names

    try:
        get_renderer(target)
    except InputError:
        raise InputError("launch", "", f"a launch target ({', '.join(renderer_names())})",
                         target) from None
    check_folder(out, "launch-out", "")


def render(plan: PathLike, target: str, out: PathLike) -> Path:
    """Render the plan.json at ``plan`` for launch ``target`` into the folder ``out``
    (atomically: the folder holds its old files or all the new ones) and return the folder;
    what ``scepsy plan --launch TARGET --launch-out OUT`` and ``scepsy launch`` do."""
    from scepsy_serve.launch.planfile import load_plan
    from scepsy_serve.launch.renderers import get_renderer, write_rendered

    check_launch(target, out)
    launch_plan = load_plan(plan)
    return write_rendered(get_renderer(target).render(launch_plan), out, target)


# ------------------------------------------------------------------------------ bench loop


def bench_loop(options: Any = None, *, say: Callable[[str], None] | None = None,
               **fields_: Any) -> Any:
    """The whole loop on this CPU (``scepsy bench loop``, docs/quickstart.md): profile the
    model here unless ``curves`` is given, plan, launch vLLM servers, drive the workflows, stop,
    compare predicted and measured
    (:func:`scepsy_serve.loop.bench_loop.run_loop` with this module's :func:`plan`,
    :func:`predict` and :func:`using_catalog`). ``options``: a
    :class:`~scepsy_serve.loop.bench_loop.LoopOptions`, or its fields as keywords."""
    from scepsy_serve.loop.bench_loop import LoopOptions, run_loop

    return run_loop(_options_or_fields(LoopOptions, options, fields_, "bench_loop"),
                    _planning(), say=say)


def bench_gpu(options: Any = None, *, say: Callable[[str], None] | None = None,
              **fields_: Any) -> Any:
    """The GPU kit (``scepsy bench gpu``, docs/bench-gpu.md): two small LLMs profiled under
    MPS shares, planned onto one GPU, launched, driven and compared, as :func:`bench_loop` does
    on a CPU (:func:`scepsy_serve.loop.bench_gpu.run_kit`); ``options``: a
    :class:`~scepsy_serve.loop.bench_gpu.KitOptions`, or its fields as keywords."""
    from scepsy_serve.loop.bench_gpu import KitOptions, run_kit

    return run_kit(_options_or_fields(KitOptions, options, fields_, "bench_gpu"), _planning(),
                   say=say)


def _options_or_fields(cls: type, options: Any, fields_: Mapping[str, Any], where: str) -> Any:
    """``options`` (a ``cls``), or a ``cls`` of ``fields_``; not both."""
    if options is None:
        return cls(**fields_)
    if fields_:
        raise InputError(where, "options", f"either a {cls.__name__} or its fields",
                         sorted(fields_))
    return options


def _planning() -> Any:
    """The planning functions the loops below this package call."""
    from scepsy_serve.loop.bench_loop import Planning

    return Planning(plan=plan, predict=predict, using_catalog=using_catalog)


__all__ = ["PlanResult", "bench_gpu", "bench_loop", "check_grid", "check_launch",
           "load_catalog", "load_overheads", "plan", "plan_problem", "predict",
           "prediction_document", "render", "simulate", "simulation_document",
           "using_catalog"]
