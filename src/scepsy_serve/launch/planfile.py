"""plan.json, format version 1 (docs/plan-format.md): the models that validate it, its JSON
Schema, and the launch view a launcher reads (:class:`~scepsy_serve.launch.launchplan.LaunchPlan`).

:func:`parse_plan` checks a parsed document: the ``version`` first (any other than
:data:`PLAN_VERSION` is rejected before anything else is read), then every section's fields
(:class:`PlanDoc`; unknown fields are errors where scepsy writes the content, so a typo in an
edited ``launch`` section is caught), then that the sections agree with each other (every
placed replica is an LLM of ``llms`` with its TP degree and share, on a node of the cluster and
GPU indices that node has, each replica exactly once; ``launch.models`` names every LLM;
``launch.addresses`` names nodes, no two at one address; no GPU holds more than its
capacity (shares summing above 1, memory beyond the device's); a workflow's ``curve`` is
bounded by an LLM it calls; an LLM's ``extrapolated_share`` repeats its share).
Every error is an :class:`~scepsy_common.errors.InputError` naming the file and the field. :func:`launch_plan` turns a placed plan into the launch view and
rejects one without a placement, saying why there is none; :func:`load_plan` does both for a
file.

Nodes are read by the cluster parsers themselves (:func:`scepsy_place.packing.topology.parse_topology`
for the ``topology`` section a racks cluster writes, :func:`scepsy_opt.cluster.parse_cluster`
and :func:`scepsy_place.packing.topology.from_cluster` for the pools), over a catalog of the plan's
own ``devices``: a plan reads the same on a machine whose catalog lacks its device types.

``python -m scepsy_serve.launch.planfile --write-schema docs/plan.schema.json`` rewrites the
committed JSON Schema from these models (a test checks that it is up to date).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from scepsy_common.errors import InputError, Name, described, validated
from scepsy_common.files import atomic_write_text, failed_path, read_json
from scepsy_common.units import UNITS, gpu_units
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.cluster import MAX_GPUS_PER_NODE, ClusterRecord, parse_cluster
from scepsy_opt.planning.planfile import PLAN_VERSION, dumps
from scepsy_opt.planning.plans import Status, Termination, termination
from scepsy_opt.planning.problem import Objective
from scepsy_opt.planning.solvestats import SolveFigures
from scepsy_place.formulations.loop import LoopStatus
from scepsy_place.packing.check import overloads
from scepsy_place.packing.replicas import Slot
from scepsy_place.packing.topology import Topology, TopologyRecord, from_cluster, parse_topology
from scepsy_place.request import PlanRequest
from scepsy_profile.catalog import Catalog
from scepsy_profile.hardware import GPUSpec
from scepsy_serve.launch.launchplan import (
    ENV_NAME_EXPECTED,
    ENV_NAME_MAX,
    ENV_NAME_PATTERN,
    HOST_EXPECTED,
    HOST_MAX,
    HOST_PATTERN,
    TEXT_EXPECTED,
    TEXT_MAX,
    TEXT_PATTERN,
    WORD_EXPECTED,
    WORD_PATTERN,
    DeviceLaunch,
    EngineLaunch,
    LaunchPlan,
    ModelLaunch,
    ReplicaLaunch,
    assign_ports,
)

SCHEMA_ID = "urn:scepsy:plan-format:1"
SCHEMA_TITLE = f"scepsy plan.json (format version {PLAN_VERSION})"
SHARE_TOL = 1e-9
MEMORY_TOL_GIB = 1e-6
MAX_PORT = 65535

# text that reaches a command line or an environment, env names and hosts: one rule each
# (scepsy_serve.launch.launchplan), whose words every validation error says
Text = Annotated[str, StringConstraints(pattern=described(TEXT_PATTERN, TEXT_EXPECTED),
                                        max_length=TEXT_MAX)]
Word = Annotated[str, StringConstraints(pattern=described(WORD_PATTERN, WORD_EXPECTED),
                                        max_length=TEXT_MAX)]
EnvName = Annotated[str, StringConstraints(pattern=described(ENV_NAME_PATTERN, ENV_NAME_EXPECTED),
                                           max_length=ENV_NAME_MAX)]
Host = Annotated[str, StringConstraints(pattern=described(HOST_PATTERN, HOST_EXPECTED),
                                        max_length=HOST_MAX)]
FINITE = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# ------------------------------------------------------------------------------- sections


class DeviceSection(BaseModel):
    """A device type: ``cuda`` (a GPU) or ``cpu`` (a CPU core is the unit shared)."""

    model_config = FINITE
    kind: Literal["cuda", "cpu"]
    memory_gib: float = Field(gt=0)


class ModelLaunchSection(BaseModel):
    """What one LLM's engine serves (a Hugging Face repo id or a local folder) and the extra
    arguments and environment of its replicas."""

    model_config = FINITE
    serve: Word
    args: list[Text] = Field(default_factory=list)
    env: dict[EnvName, Text] = Field(default_factory=dict)


class LaunchSection(BaseModel):
    """How the servers start (editable): the engine command, arguments and environment of
    every server, the first port, the health wait, the node addresses, and per LLM what its
    engine serves."""

    model_config = FINITE
    command: list[Word] = Field(min_length=1)
    args: list[Text] = Field(default_factory=list)
    env: dict[EnvName, Text] = Field(default_factory=dict)
    base_port: int = Field(ge=1, le=MAX_PORT)
    health_timeout_s: float = Field(gt=0)
    addresses: dict[Name, Host] = Field(default_factory=dict)
    models: dict[Name, ModelLaunchSection]


class SolverSection(SolveFigures):
    """How the plan was solved: the termination (the document's ``status``), the objective, its
    proven bound and gap, the limits, and each formulation's statistics (the fields of
    :class:`~scepsy_opt.planning.solvestats.SolveFigures`, the one definition of every
    figure; the timings have their own section). Closed (docs/plan-format.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=False)
    objective_s: float | None
    bound_s: float | None
    gap: float | None
    time_limit_s: float = Field(gt=0)
    gap_limit: float = Field(ge=0)


class InstanceAllocation(BaseModel):
    model_config = FINITE
    gpu: Name
    tp: int = Field(ge=1)
    share: float = Field(gt=0, le=1)
    replicas: int = Field(ge=1)
    memory: float | None = Field(default=None, gt=0, le=1)  # memory fraction, when not tied


class AllocationSection(BaseModel):
    """Per LLM its instance shape and replica count (what ``scepsy predict`` reads)."""

    model_config = FINITE
    llms: dict[Name, InstanceAllocation]
    # an LLM the workflows call, run as replica groups on several GPU types: its groups
    # (entries of `llms`) and the fraction of its calls each gets (docs/min-cost.md)
    splits: dict[Name, dict[Name, Annotated[float, Field(gt=0, le=1)]]] | None = None
    # a split LLM routed by prompt length: per group, the input tokens [lo, hi) of the calls it
    # serves (hi null: no upper end); the ranges cover every length once (docs/min-cost.md)
    lengths: dict[Name, dict[Name, list[int | None]]] | None = None


class CurvePoint(BaseModel):
    """The predicted mean latency (s) at one throughput (req/s)."""

    model_config = FINITE
    throughput: float = Field(gt=0)
    mean_latency_s: float = Field(ge=0)


class CurveSection(BaseModel):
    """A workflow's predicted latency against its throughput, every workflow's rate scaled
    with it (:func:`scepsy_opt.planning.planfile.workflow_curves`): the maximum throughput, the LLM
    that saturates there, and points below it in increasing throughput."""

    model_config = FINITE
    max_throughput: float = Field(gt=0)
    bottleneck: Name
    points: list[CurvePoint]


class WorkflowSection(BaseModel):
    model_config = FINITE
    throughput: float = Field(ge=0)
    mean_latency_s: float = Field(ge=0)
    llms: list[Name] = Field(min_length=1)
    curve: CurveSection | None = None  # absent in plans written before curves


class ShareRangeSection(BaseModel):
    """An LLM's share outside the shares its latency model measured for its (model, gpu, tp):
    the share and the measured range (``scepsy_opt.planning.coverage``); its latency is extrapolated."""

    model_config = FINITE
    share: float = Field(gt=0, le=1)
    measured_min: float = Field(gt=0, le=1)
    measured_max: float = Field(gt=0, le=1)


class LLMSection(BaseModel):
    """One LLM of a plan with an allocation: its model, instance, and predicted figures (finite
    and not negative: a saturated LLM makes a plan infeasible, never one with an allocation)."""

    model_config = FINITE
    model: Name
    gpu: Name
    tp: int = Field(ge=1)
    share: float = Field(gt=0, le=1)
    replicas: int = Field(ge=1)
    memory: float | None = Field(default=None, gt=0, le=1)  # memory fraction, when not tied
    gpus: float = Field(gt=0)
    memory_gib_per_gpu: float = Field(gt=0)
    weights_gib: float = Field(ge=0)
    mu_calls_s: float = Field(ge=0)
    call_latency_s: float = Field(ge=0)
    latency_share: float = Field(ge=0, le=1)  # of the objective
    # only where the share lies outside the measured shares (absent in plans written before)
    extrapolated_share: ShareRangeSection | None = None


class InfeasibleSection(BaseModel):
    """Why no allocation meets the targets, and how far the cluster gets."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reason: Literal["memory", "gpus", "latency"]
    detail: str
    max_scale: float
    max_throughput: dict[str, float]
    bottleneck: str | None
    binding: list[str]
    gain_per_gpu: dict[str, float]


class OutcomeSection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    status: LoopStatus
    objective_s: float | None
    bound_s: float | None = None  # the proven lower bound the formulation gives (s)
    seconds: float | None = Field(default=None, ge=0)  # its wall time (left out by --no-timings)


class InstanceSection(BaseModel):
    """One placed replica: ``tp`` GPU indices of ``node``, each giving it ``share`` of its
    compute and ``memory_gib`` of its memory."""

    model_config = FINITE
    llm: Name
    replica: int = Field(ge=0)
    node: Name
    gpus: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    share: float = Field(gt=0, le=1)
    memory_gib: float = Field(gt=0)


class PlacementSection(BaseModel):
    """Where every replica runs (``instances``, only when ``placed``) and how the
    optimise-place loop got there."""

    model_config = ConfigDict(extra="forbid", strict=True)
    policy: str | None
    placed_by: str | None
    formulation: str
    status: LoopStatus
    # a proven lower bound on every placeable allocation of the candidate grid (s), and the
    # plan's gap to it (objective / bound_s - 1); null without one
    bound_s: float | None = None
    gap: float | None = Field(default=None, ge=0)
    compared: dict[str, OutcomeSection]
    rounds: int = Field(ge=0)
    placed: bool
    exact: bool
    cuts: dict[str, int]
    history: list[dict[str, Any]]
    quality: dict[str, Any] | None
    instances: list[InstanceSection]
    unplaced: list[Annotated[tuple[str, int, str], Field(strict=False)]]
    reason: str | None


class TimingsSection(BaseModel):
    """Wall-clock seconds (left out by ``--no-timings``)."""

    model_config = FINITE
    candidates_s: float | None = Field(default=None, ge=0)
    build_s: float | None = Field(default=None, ge=0)
    solve_s: float | None = Field(default=None, ge=0)
    total_s: float | None = Field(default=None, ge=0)


class PlanDoc(BaseModel):
    """A whole plan.json document, format version 1 (docs/plan-format.md)."""

    model_config = ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"$id": SCHEMA_ID, "title": SCHEMA_TITLE,
                                                 "version": PLAN_VERSION})
    version: Literal[1]
    optimiser: Name
    status: Status
    objective: Objective
    targets: dict[Name, Annotated[float, Field(gt=0, allow_inf_nan=False)]]
    """per workflow its target throughput (req/s): finite and > 0, as a plan request's"""
    scale: float = Field(ge=0)
    cluster: ClusterRecord
    topology: TopologyRecord | None = None
    devices: dict[Name, DeviceSection] = Field(min_length=1)
    launch: LaunchSection
    solver: SolverSection
    allocation: AllocationSection | None = None
    workflows: dict[Name, WorkflowSection] | None = None
    llms: dict[Name, LLMSection] | None = None
    infeasible: InfeasibleSection | None = None
    placement: PlacementSection | None = None
    timings: TimingsSection | None = None
    request: dict[str, Any] | None = None
    """the plan request that produced the plan (scepsy_place.request.PlanRequest.record): a
    valid request, read back by the same model"""


class SolveReport(BaseModel):
    """How a plan was solved, typed: the termination (``status``, and ``reason`` when nothing
    was placed), the objective, the proven bound and gap of the plan handed on, the
    formulation that found it and every formulation compared (each one's status, objective
    and bound), and the solver's statistics (:class:`SolverSection`). Read from a plan.json
    document by the models that read the file (:meth:`of`)."""

    model_config = ConfigDict(frozen=True)
    status: Status
    termination: Termination
    """how the search ended (:func:`scepsy_opt.planning.plans.termination`: reason, limit)"""
    reason: str | None
    objective_s: float | None
    bound_s: float | None
    gap: float | None
    formulation: str | None
    compared: dict[str, OutcomeSection]
    statistics: SolverSection

    @property
    def proven_optimal(self) -> bool:
        """Whether the plan is proven optimal (within the gap limit)."""
        return self.status == "optimal"

    @classmethod
    def of(cls, doc: Mapping[str, Any], source: str = "plan.json") -> SolveReport:
        """The report of a plan.json document (checked as :func:`parse_plan` does)."""
        plan = parse_plan(json.loads(dumps(dict(doc))), source)
        pl = plan.placement
        bound = pl.bound_s if pl is not None and pl.bound_s is not None else plan.solver.bound_s
        gap = pl.gap if pl is not None and pl.gap is not None else plan.solver.gap
        reason = pl.reason if pl is not None and pl.reason else (
            plan.infeasible.detail if plan.infeasible is not None else None)
        return cls(status=plan.status, termination=termination(plan.status, gap, reason),
                   reason=reason, objective_s=plan.solver.objective_s,
                   bound_s=bound, gap=gap, formulation=pl.formulation if pl else None,
                   compared=dict(pl.compared) if pl else {},
                   statistics=plan.solver)


def _allowed(loc: tuple[Any, ...]) -> list[str]:
    """The fields allowed where an unknown field was found (for the error message)."""
    model: type[BaseModel] | None = PlanDoc
    for part in loc[:-1]:
        field = model.model_fields.get(part) if model is not None and isinstance(part, str) \
            else None
        if field is not None:  # else a list index or a mapping key: the same model below
            model = _model_in(field.annotation)
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field's annotation holds (itself, or inside ``list``, ``dict``, ``| None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


# --------------------------------------------------------------------------------- schema


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of plan.json version 1, exported from :class:`PlanDoc`."""
    schema = PlanDoc.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def schema_text() -> str:
    """:func:`plan_json_schema` as the committed file holds it (docs/plan.schema.json)."""
    return json.dumps(plan_json_schema(), indent=2, sort_keys=True) + "\n"


# -------------------------------------------------------------------------------- parsing


def check_version(raw: Any, source: str) -> None:
    """An :class:`InputError` unless ``raw`` is a mapping whose ``version`` is
    :data:`PLAN_VERSION` (checked before anything else: another version's fields mean other
    things)."""
    if not isinstance(raw, dict):
        raise InputError(source, "top level", "a plan.json mapping (scepsy plan --out)",
                         type(raw).__name__)
    got = raw.get("version")
    if isinstance(got, bool) or got != PLAN_VERSION or not isinstance(got, int):
        why = "" if "version" in raw else (
            " (the field is missing: a plan written before versions; run scepsy plan again)")
        raise InputError(source, "version", f"plan format version {PLAN_VERSION}{why}", got)


def parse_plan(raw: Any, source: str) -> PlanDoc:
    """A parsed plan.json document, validated (module docstring); errors name ``source`` and
    the field."""
    check_version(raw, source)
    doc = validated(PlanDoc, raw, source, allowed=_allowed)
    if doc.request is not None:  # a request the request model reads
        try:
            PlanRequest.of(doc.request)
        except InputError as exc:
            raise InputError(source, f"request.{exc.field}" if exc.field else "request",
                             exc.expected, exc.got) from None
    _check_consistent(doc, source)
    return doc


def write_plan_file(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> Path:
    """Write the plan.json document ``doc`` atomically, after checking it with the models that
    read it (:func:`parse_plan`): scepsy never writes a plan it cannot read. Returns the path
    written: ``path``, except that a document without a placed plan (:func:`is_placed`) never
    replaces a placed plan already at ``path``: it goes beside it, to
    :func:`failed_plan_path` (a failed run never destroys a good result)."""
    text = dumps(dict(doc))
    plan = parse_plan(json.loads(text), str(path))
    dest = Path(path)
    if not is_placed(plan) and holds_placed_plan(dest):
        dest = failed_plan_path(dest)
    atomic_write_text(dest, text)
    return dest


def failed_plan_path(path: str | os.PathLike[str]) -> Path:
    """Where :func:`write_plan_file` puts a failed run's plan.json when ``path`` holds a placed
    plan: ``plan.json`` -> ``plan.failed.json`` (``NAME`` -> ``NAME.failed.json``)."""
    return failed_path(path)


def holds_placed_plan(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a plan.json this scepsy reads and that has a placed plan."""
    try:
        return Path(path).is_file() and is_placed(read_plan(path))
    except InputError:
        return False


def read_plan(path: str | os.PathLike[str]) -> PlanDoc:
    """:func:`parse_plan` of a plan.json file."""
    return parse_plan(read_json(path, "plan.json file (scepsy plan --out)"), str(path))


def is_placed(doc: PlanDoc) -> bool:
    """Whether ``doc`` has a placed plan: an allocation with every replica on a node (what
    launch, report's placement and replan need)."""
    pl = doc.placement
    return (pl is not None and pl.placed and doc.allocation is not None
            and doc.llms is not None)


def not_placed_reason(doc: PlanDoc) -> str:
    """Why ``doc`` has no placed plan, as the planner said it."""
    pl = doc.placement
    return (pl.reason if pl is not None and pl.reason else
            doc.infeasible.detail if doc.infeasible is not None else
            "no placement section" if pl is None else "no placed allocation")


def require_placed(doc: PlanDoc, source: str) -> PlanDoc:
    """``doc`` if it has a placed plan (:func:`is_placed`), else the one error every reader
    that needs one raises (``scepsy launch``, ``scepsy replan``, :func:`launch_plan`): it
    names ``source``, the ``status`` field, the planner's reason and what to do."""
    if not is_placed(doc):
        raise InputError(source, "status", f"a placed plan; this plan is {doc.status} "
                         f"({not_placed_reason(doc)}); re-run `scepsy plan` (more GPUs, a lower "
                         "--target or a longer --time-limit) and use the plan it writes")
    return doc


def plan_catalog(doc: PlanDoc) -> Catalog:
    """A catalog of the plan's own device types (names and memory: all the cluster parsers
    read of them), so that a plan reads without the catalog it was planned with."""
    return Catalog(gpus={g: GPUSpec(g, d.memory_gib, 1.0, 1.0, MAX_GPUS_PER_NODE, 1.0)
                         for g, d in doc.devices.items()})


def plan_nodes(doc: PlanDoc, source: str) -> Topology:
    """The plan's nodes, read by the cluster parsers: the ``topology`` section when there is
    one, else the nodes the ``cluster`` pools name (``<gpu>-<j>``)."""
    for i, p in enumerate(doc.cluster.pools):
        _device(doc, p.gpu, source, f"cluster.pools[{i}].gpu")
    for r, rack in enumerate(doc.topology.racks if doc.topology is not None else []):
        for k, n in enumerate(rack.nodes):
            _device(doc, n.gpu, source, f"topology.racks[{r}].nodes[{k}].gpu")
    cat = plan_catalog(doc)
    section = "topology" if doc.topology is not None else "cluster"
    data = doc.model_dump(mode="json", exclude_none=True, include={section})[section]
    try:
        if doc.topology is not None:
            return parse_topology(data, source, cat)
        return from_cluster(parse_cluster(data, source, cat), cat)
    except InputError as exc:
        raise InputError(source, f"{section}.{exc.field}", exc.expected, exc.got) from None


def _device(doc: PlanDoc, gpu: str, source: str, field: str) -> None:
    if gpu not in doc.devices:
        raise InputError(source, field, f"a device type of `devices` ({', '.join(doc.devices)})",
                         gpu)


def _names(names: Sequence[str] | Mapping[str, Any]) -> str:
    return ", ".join(sorted(names)) or "none"


def _check_consistent(doc: PlanDoc, source: str) -> None:
    """The cross-section checks of :func:`parse_plan` (module docstring)."""
    nodes = plan_nodes(doc, source)
    llms = doc.llms or {}
    for node in doc.launch.addresses:
        if not nodes.has_node(node):
            raise InputError(source, f"launch.addresses.{node}",
                             f"a node of the cluster ({_nodes_text(nodes)})", node)
    _check_addresses(doc, nodes, source)
    if set(doc.launch.models) != set(llms):
        extra = sorted(set(doc.launch.models) - set(llms))
        missing = sorted(set(llms) - set(doc.launch.models))
        field = f"launch.models.{extra[0]}" if extra else "launch.models"
        raise InputError(source, field, f"one entry per LLM of the plan ({_names(llms)})",
                         extra[0] if extra else f"no entry for {', '.join(missing)}")
    alloc = doc.allocation.llms if doc.allocation is not None else {}
    if set(alloc) != set(llms):
        raise InputError(source, "allocation.llms",
                         f"the LLMs of `llms` ({_names(llms)})", _names(alloc))
    for m, inst in alloc.items():
        row = llms[m]
        for f in ("gpu", "tp", "share", "replicas"):
            if getattr(inst, f) != getattr(row, f):
                raise InputError(source, f"allocation.llms.{m}.{f}",
                                 f"llms.{m}.{f} ({getattr(row, f)!r})", getattr(inst, f))
    for m, row in llms.items():
        _device(doc, row.gpu, source, f"llms.{m}.gpu")
        beyond = row.extrapolated_share
        if beyond is not None and beyond.share != row.share:
            raise InputError(source, f"llms.{m}.extrapolated_share.share",
                             f"llms.{m}.share ({row.share!r})", beyond.share)
    _check_sizes(doc, nodes, source)
    for w, wf in (doc.workflows or {}).items():
        for k, m in enumerate(wf.llms):
            if m not in llms:
                raise InputError(source, f"workflows.{w}.llms[{k}]",
                                 f"an LLM of the plan ({_names(llms)})", m)
        if wf.curve is not None and wf.curve.bottleneck not in wf.llms:
            raise InputError(source, f"workflows.{w}.curve.bottleneck",
                             f"an LLM the workflow calls ({_names(wf.llms)})",
                             wf.curve.bottleneck)
    _check_splits(doc, source)
    if doc.placement is not None:
        _check_instances(doc, nodes, source)


def _address_key(address: str) -> str:
    """``address`` as one host is named once: an IP address in its canonical form, a host
    name in lower case (host names are case-insensitive)."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower()


def _check_addresses(doc: PlanDoc, nodes: Topology, source: str) -> None:
    """No two nodes at one address (``launch.addresses``, a node's name where it has none):
    servers get ports per node from ``launch.base_port`` and GPU indices per node, so two
    nodes on one host would start two servers on one URL and on the same GPUs."""
    addresses = doc.launch.addresses
    seen: dict[str, str] = {}
    for n in nodes.nodes:
        address = addresses.get(n.name, n.name)
        other = seen.setdefault(_address_key(address), n.name)
        if other != n.name:
            node = n.name if n.name in addresses else other
            twin = other if node == n.name else n.name
            raise InputError(source, f"launch.addresses.{node}",
                             f"an address no other node has (node {twin} is at "
                             f"{addresses.get(twin, twin)!r} too: its servers would share "
                             "ports and GPUs with this node's; give each node its own host, "
                             "or plan for a cluster of one node)", address)


def _check_sizes(doc: PlanDoc, nodes: Topology, source: str) -> None:
    """Every LLM's instance fits the plan's cluster (before anything is built per replica or
    per GPU): ``tp`` at most the GPUs of its largest node of its type, and its ``replicas``
    (``tp`` GPUs of ``share`` each, counted as the planner counts shares:
    :func:`~scepsy_common.units.gpu_units`) at most the GPUs of its type."""
    per_type: dict[str, tuple[int, int]] = {}  # GPU type -> (GPUs in all, most on one node)
    for n in nodes.nodes:
        total, most = per_type.get(n.gpu, (0, 0))
        per_type[n.gpu] = (total + n.gpus, max(most, n.gpus))
    for m, row in (doc.llms or {}).items():
        total, most = per_type.get(row.gpu, (0, 0))
        if row.tp > most:
            raise InputError(source, f"llms.{m}.tp", f"at most {most} (the most {row.gpu} GPUs "
                             "one node of the cluster has: a replica's GPUs are on one node)",
                             row.tp)
        if gpu_units(row.tp, row.share, row.replicas) > total * UNITS:
            fit = total * UNITS // gpu_units(row.tp, row.share)
            raise InputError(source, f"llms.{m}.replicas",
                             f"at most {fit} (replicas x tp {row.tp} x share {row.share:g} "
                             f"within the cluster's {total} {row.gpu} GPUs)", row.replicas)


def _check_splits(doc: PlanDoc, source: str) -> None:
    """The allocation's ``splits``, checked as :class:`~scepsy_opt.allocation.Allocation`
    checks them (groups are entries of ``llms``, each in one split, fractions summing to 1)."""
    alloc = doc.allocation
    if alloc is None or not (alloc.splits or alloc.lengths):
        return
    try:
        Allocation({m: Instance(i.gpu, i.tp, i.share, i.replicas, i.memory)
                    for m, i in alloc.llms.items()}, source, alloc.splits or {},
                   alloc.lengths or {})  # type: ignore[arg-type]  # checked there
    except InputError as exc:
        raise InputError(source, f"allocation.{exc.field}", exc.expected, exc.got) from None


def _nodes_text(nodes: Topology, most: int = 8) -> str:
    names = [n.name for n in nodes.nodes]
    return ", ".join(names[:most]) + (f", ... ({len(names)} nodes)" if len(names) > most else "")


def _check_instances(doc: PlanDoc, nodes: Topology, source: str) -> None:
    """Every placed replica: an LLM of ``llms`` with its TP degree and share, on GPUs its node
    has and of its GPU type, memory within the device's; each replica index once; and per
    GPU, the replicas on it within its capacity (shares summing to at most 1, memory within
    the device's), by the placement checker's rule (:func:`~scepsy_place.packing.check.overloads`)."""
    assert doc.placement is not None
    pl, llms = doc.placement, doc.llms or {}
    if pl.instances and not pl.placed:
        raise InputError(source, "placement.instances",
                         "no replica rows when placement.placed is false", len(pl.instances))
    seen: dict[str, list[int]] = {}
    for i, inst in enumerate(pl.instances):
        where = f"placement.instances[{i}]"
        if inst.llm not in llms:
            raise InputError(source, f"{where}.llm", f"an LLM of `llms` ({_names(llms)})",
                             inst.llm)
        row = llms[inst.llm]
        if not nodes.has_node(inst.node):
            hint = "" if doc.topology is not None else (
                "; this plan has no `topology` section, which names a racks cluster's nodes")
            raise InputError(source, f"{where}.node",
                             f"a node of the cluster ({_nodes_text(nodes)}){hint}", inst.node)
        node = nodes.node(inst.node)
        if node.gpu != row.gpu:
            raise InputError(source, f"{where}.node",
                             f"a node of {inst.llm}'s GPU type {row.gpu} (this one has "
                             f"{node.gpu})", inst.node)
        if len(inst.gpus) != row.tp:
            raise InputError(source, f"{where}.gpus",
                             f"{row.tp} GPU indices (llms.{inst.llm}.tp)", inst.gpus)
        if len(set(inst.gpus)) != len(inst.gpus):
            raise InputError(source, f"{where}.gpus", "distinct GPU indices", inst.gpus)
        for k, g in enumerate(inst.gpus):
            if g >= node.gpus:
                raise InputError(source, f"{where}.gpus[{k}]",
                                 f"a GPU index of node {node.name} (0..{node.gpus - 1})", g)
        if abs(inst.share - row.share) > SHARE_TOL:
            raise InputError(source, f"{where}.share", f"llms.{inst.llm}.share ({row.share})",
                             inst.share)
        cap = doc.devices[node.gpu].memory_gib
        if inst.memory_gib > cap + MEMORY_TOL_GIB:
            raise InputError(source, f"{where}.memory_gib",
                             f"at most the {cap} GiB of a {node.gpu}", inst.memory_gib)
        seen.setdefault(inst.llm, []).append(inst.replica)
    for o in overloads(nodes, [Slot(i.llm, i.replica, i.node, tuple(i.gpus), i.share,
                                    i.memory_gib) for i in pl.instances]):
        raise InputError(source, f"placement.instances (node {o.node}, GPU {o.gpu})",
                         "at most the GPU's capacity: shares summing to at most 1 and memory "
                         f"within the device's (replicas on it: {', '.join(o.replicas)}); move "
                         "a replica to a GPU with room or re-run `scepsy plan`", o.problem)
    if not pl.placed:
        return
    for m, row in llms.items():
        got = sorted(seen.get(m, []))
        if len(got) != row.replicas or got != list(range(len(got))):
            raise InputError(source, "placement.instances",
                             f"replicas 0..{row.replicas - 1} of {m} (llms.{m}.replicas) "
                             "exactly once each", got)


# ----------------------------------------------------------------------------- the launch view


def launch_plan(doc: PlanDoc, source: str) -> LaunchPlan:
    """The launch view of a placed plan (:class:`~scepsy_serve.launch.launchplan.LaunchPlan`): ports
    from ``launch.base_port`` (:func:`~scepsy_serve.launch.launchplan.assign_ports`). A plan
    without a placed allocation is :func:`require_placed`'s error, saying why there is none."""
    require_placed(doc, source)
    pl = doc.placement
    assert pl is not None and doc.allocation is not None and doc.llms is not None
    nodes = plan_nodes(doc, source)
    launch = doc.launch
    replicas = assign_ports(tuple(
        ReplicaLaunch(i.llm, i.replica, i.node, tuple(i.gpus), i.share, i.memory_gib, 0)
        for i in pl.instances), launch.base_port)
    top = max((r.port for r in replicas), default=launch.base_port)
    if top > MAX_PORT:
        raise InputError(source, "launch.base_port",
                         f"a first port that leaves every server a port <= {MAX_PORT} (the "
                         f"busiest node needs {top - launch.base_port + 1})", launch.base_port)
    models = {m: ModelLaunch(m, row.model, launch.models[m].serve, row.gpu, row.tp, row.share,
                             row.replicas, row.memory_gib_per_gpu, row.weights_gib,
                             tuple(launch.models[m].args), dict(launch.models[m].env))
              for m, row in doc.llms.items()}
    devices = {g: DeviceLaunch(g, d.kind, d.memory_gib) for g, d in doc.devices.items()}
    plan = LaunchPlan(
        name=doc.cluster.name, version=doc.version, devices=devices,
        nodes={n.name: n.gpu for n in nodes.nodes}, addresses=dict(launch.addresses),
        models=models, replicas=replicas,
        workflows={w: tuple(sorted(wf.llms)) for w, wf in (doc.workflows or {}).items()},
        splits=(doc.allocation.splits if doc.allocation is not None else None) or {},
        lengths={m: {g: (int(r[0]), r[1]) for g, r in v.items()}  # type: ignore[arg-type]
                 for m, v in ((doc.allocation.lengths if doc.allocation is not None else None)
                              or {}).items()},
        engine=EngineLaunch(tuple(launch.command), tuple(launch.args), dict(launch.env),
                            launch.base_port, launch.health_timeout_s))
    for node in plan.node_names():  # every server reachable at a URL, before anything renders
        plan.url_host(node, source)
    return plan


def load_plan(path: str | os.PathLike[str]) -> LaunchPlan:
    """The launch view of a plan.json file (:func:`parse_plan`, :func:`launch_plan`)."""
    return launch_plan(read_plan(path), str(path))


def parse_launch_plan(raw: Any, source: str) -> LaunchPlan:
    """The launch view of a parsed plan.json document."""
    return launch_plan(parse_plan(raw, source), source)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scepsy_serve.launch.planfile --write-schema PATH`` (the committed JSON
    Schema), ``--check PLAN`` (validate a plan.json: exit 2 with the error)."""
    ap = argparse.ArgumentParser(prog="python -m scepsy_serve.launch.planfile",
                                 description="plan.json format version 1")
    ap.add_argument("--write-schema", metavar="PATH", help="write the JSON Schema to PATH")
    ap.add_argument("--check", metavar="PLAN", help="validate a plan.json file")
    args = ap.parse_args(argv)
    if not (args.write_schema or args.check):
        ap.error("give --write-schema PATH or --check PLAN")
    if args.write_schema:
        atomic_write_text(args.write_schema, schema_text())
    if args.check:
        try:
            read_plan(args.check)
        except InputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{args.check}: plan format version {PLAN_VERSION}, valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
