"""Incremental operations on a running placement: a node fails, a rack is drained, a workflow's
load changes. Re-plan and re-place with a cost on every replica started, stopped and *moved*,
and report what happens to every replica (docs/incremental.md).

:func:`replan` takes the problem and cluster a running plan was made for, the running
allocation and its placement (:class:`Running`), and one or more events:

1. **The event** (:func:`apply_events`): a failed node or a drained rack's nodes leave the
   topology (its replicas are *lost*); a load change sets a workflow's target (a factor of it or
   a new rate). The cluster the optimiser budgets is the topology that is left.
2. **The counts**: the optimiser re-plans (:func:`scepsy_place.formulations.loop.plan_and_place`) with the
   surviving replicas as the current allocation and ``change_penalty_s`` per replica started or
   stopped (``|r − r₀|`` on the same shape, ``r + r₀`` when the shape changes; ``r₀`` counts the
   survivors, so restarting a lost replica costs the penalty too). Keeping the survivors as they
   are is checked directly as well (:func:`scepsy_place.formulations.loop.keep_current`).
3. **The placement**: survivors of an LLM whose shape did not change stay where they run (up to
   the new replica count, lowest replica numbers first; the others are stopped), and only the
   new replicas are placed, around them (:func:`place_around`). When that fails for a GPU type,
   the fewest survivors are freed and placed again with the new replicas: they are *moved*
   (from → to). The fewest is a MILP (:func:`fewest_moves`: the exact placement test of
   :mod:`scepsy_place.packing.exact` where each survivor either stays on its GPUs or is placed again;
   minimise the number placed again), proven optimal within :data:`MOVE_SEARCH_S`
   (``moves_minimal``); the set it frees is placed by the placer where it can. Without an
   answer in time (or above :data:`MOVE_MILP_MAX_GPUS` GPUs of the type) whole nodes'
   survivors are freed greedily, least used first, and those not needed put back (a local
   minimum). Freeing every survivor of the type always succeeds: it is the optimiser's own
   placement of the new allocation.
4. **Moves priced**: a plan's cost is its objective (latency plus change penalties) plus
   ``move_cost_s`` per moved replica. When the optimiser's plan needs moves, the next-best
   allocations of the candidate grid (the MILP with a no-good row per allocation already
   tried, up to :data:`ALTERNATIVES` of them; those neither the placer nor the exact test
   places on the whole cluster are skipped) are realised the same way, and the one of least
   cost is kept; the search stops once the next allocation's objective alone reaches the best
   cost (then no allocation left can cost less, with or without moves).

The new plan's replicas are numbered ``0..r−1`` per LLM, as plan.json requires (survivors keep
their number where it is below ``r``); the report names each replica by its number before and
after.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import pulp

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance, parse_allocation
from scepsy_opt.planning.candidates import CandidateSet, generate_candidates
from scepsy_opt.planning.milp import Row, solve_min_latency
from scepsy_opt.planning.objectives import OBJECTIVES_REGISTRY
from scepsy_opt.planning.problem import Deadline, Objective, PlanningProblem
from scepsy_opt.planning.solver import has_solution, highs_status, pulp_highs
from scepsy_opt.ratework import check_rate
from scepsy_place.formulations.loop import (
    UNPRUNED_MAX_GPUS,
    PlacedPlan,
    place_or_exact,
    plan_and_place,
    plan_document,
)
from scepsy_place.packing.check import violations
from scepsy_place.packing.placement import Placement, apply, demands, place, remove
from scepsy_place.packing.quality import quality
from scepsy_place.packing.replicas import Demand, Key, Slot
from scepsy_place.packing.topology import MEMORY_TOL_GIB, Topology

SOURCE = "event"
MAX_TESTS = 256  # placements the greedy search for the fewest moves tries per GPU type
MOVE_SEARCH_S = 5.0  # seconds the search for the fewest moves may take (within the deadline)
MOVE_MILP_MAX_GPUS = 1024  # GPUs of one type above which the fewest moves are found greedily
ALTERNATIVES = 3  # next-best allocations tried when the optimiser's needs moves
DEFAULT_CHANGE_PENALTY_S = 1.0
DEFAULT_MOVE_COST_S = 1.0


# ------------------------------------------------------------------------------------ events


@dataclass(frozen=True)
class NodeFailed:
    """A node is gone: its replicas are lost and it leaves the cluster."""

    node: str

    @property
    def spec(self) -> str:
        return f"node-failed={self.node}"


@dataclass(frozen=True)
class RackDrained:
    """Every node of a rack leaves the cluster (maintenance): their replicas go elsewhere."""

    rack: str

    @property
    def spec(self) -> str:
        return f"rack-drained={self.rack}"


@dataclass(frozen=True)
class LoadChanged:
    """A workflow's target changes: ``factor`` times the current one, or ``target`` req/s."""

    workflow: str
    factor: float | None = None
    target: float | None = None

    def __post_init__(self) -> None:
        if (self.factor is None) == (self.target is None):
            raise InputError(SOURCE, "load", "either a factor (WORKFLOW*F) or a target "
                             "(WORKFLOW=RATE)", self.workflow)
        x = self.factor if self.factor is not None else self.target
        if isinstance(x, bool) or not (isinstance(x, int | float) and math.isfinite(x) and x > 0):
            raise InputError(SOURCE, "load", "a factor or target > 0", x)

    @property
    def spec(self) -> str:
        if self.factor is not None:
            return f"load={self.workflow}*{self.factor:g}"
        return f"load={self.workflow}={self.target:g}"

    def new_target(self, old: float) -> float:
        """The workflow's target after the change (``old``: before)."""
        return old * self.factor if self.factor is not None else float(self.target or 0.0)


Event = NodeFailed | RackDrained | LoadChanged
EVENT_KINDS = ("node-failed", "rack-drained", "load")


def parse_event(text: str, source: str = SOURCE) -> Event:
    """An event from its spec: ``node-failed=NODE``, ``rack-drained=RACK``,
    ``load=WORKFLOW*FACTOR`` or ``load=WORKFLOW=RATE``; errors name ``source`` and the kind."""
    kind, sep, value = str(text).partition("=")
    if not sep or kind not in EVENT_KINDS:
        raise InputError(source, "kind", "node-failed=NODE, rack-drained=RACK, "
                         "load=WORKFLOW*FACTOR or load=WORKFLOW=RATE", text)
    if kind in ("node-failed", "rack-drained"):
        if not value:
            raise InputError(source, kind, "a node name" if kind == "node-failed"
                             else "a rack name", text)
        return NodeFailed(value) if kind == "node-failed" else RackDrained(value)
    name, op, num = (value.partition("*") if "*" in value else value.partition("="))
    if not op or not name:
        raise InputError(source, "load", "WORKFLOW*FACTOR or WORKFLOW=RATE", text)
    try:
        x = float(num)
    except ValueError:
        raise InputError(source, "load", "a number after the workflow's * or =", text) from None
    if not (math.isfinite(x) and x > 0):
        raise InputError(source, "load", "a factor or rate > 0", text)
    return LoadChanged(name, factor=x) if op == "*" else LoadChanged(name, target=x)


def apply_events(problem: PlanningProblem, topology: Topology, events: Sequence[Event], *,
                 source: str = SOURCE) -> tuple[PlanningProblem, Topology]:
    """The problem and topology after ``events`` (in order): failed nodes and drained racks'
    nodes removed (the problem's cluster becomes what is left), targets changed. Unchanged
    objects when nothing is removed or changed."""
    top = topology
    targets = dict(problem.targets)
    for e in events:
        if isinstance(e, NodeFailed):
            if not top.has_node(e.node):
                names = _names([n.name for n in top.nodes])
                raise InputError(source, "node-failed", (
                    f"a node still in the cluster ({names}); an earlier event already removed "
                    "this one: give each node once" if topology.has_node(e.node) else
                    f"a node of the cluster ({names})"), e.node)
            gone = {e.node}
        elif isinstance(e, RackDrained):
            racks = top.racks()
            if e.rack not in racks:
                names = _names(list(racks))
                raise InputError(source, "rack-drained", (
                    f"a rack still in the cluster ({names}); an earlier event already removed "
                    "its nodes: give each rack once" if e.rack in topology.racks() else
                    f"a rack of the cluster ({names})"), e.rack)
            gone = set(racks[e.rack])
        elif isinstance(e, LoadChanged):
            if e.workflow not in targets:
                raise InputError(source, "load", f"a workflow with a target "
                                 f"({_names(sorted(targets))})", e.workflow)
            new = e.new_target(targets[e.workflow])  # the rule of every target (scepsy plan's)
            targets[e.workflow] = check_rate(
                new, source, "load", f" for {e.workflow} after the event ({e.spec} makes it "
                f"{new:.3g})")
            continue
        else:
            raise InputError(source, "kind", "an event (NodeFailed, RackDrained, LoadChanged)",
                             type(e).__name__)
        left = [n for n in top.nodes if n.name not in gone]
        if not left:
            raise InputError(source, e.spec.partition("=")[0],
                             "an event that leaves the cluster some node", e.spec)
        top = top.with_nodes(left)
    out = problem
    if top is not topology:
        out = replace(out, cluster=top.to_cluster(problem.catalog))
    if targets != dict(problem.targets):
        out = replace(out, targets=targets)
    return out, top


def _names(names: Sequence[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)})" if len(names) > most else "")


# --------------------------------------------------------------------------- running plans


@dataclass(frozen=True)
class Running:
    """What runs: an allocation and the complete placement of its replicas."""

    allocation: Allocation
    placement: Placement

    @classmethod
    def of(cls, placed: PlacedPlan) -> Running:
        """The allocation and placement of a placed plan."""
        if not placed.placed or placed.plan.allocation is None:
            raise InputError("running plan", "placement", "a placed plan (every replica "
                             "placed)", placed.status)
        assert placed.placement is not None
        return cls(placed.plan.allocation, placed.placement)


def running_from_document(doc: Mapping[str, Any], source: str) -> Running:
    """The running allocation and placement of a plan.json document (``placement.instances``)."""
    alloc = parse_allocation(dict(doc), source)
    alloc.require_partitions("a running plan")
    pl = doc.get("placement")
    if not isinstance(pl, Mapping) or not pl.get("placed") or not pl.get("instances"):
        raise InputError(source, "placement", "a placed plan with placement.instances (every "
                         "replica placed)", None if not isinstance(pl, Mapping) else pl.get("status"))
    slots = []
    for i, row in enumerate(pl["instances"]):
        try:
            slots.append(Slot(str(row["llm"]), int(row["replica"]), str(row["node"]),
                              tuple(int(g) for g in row["gpus"]), float(row["share"]),
                              float(row["memory_gib"])))
        except (KeyError, TypeError, ValueError):
            raise InputError(source, f"placement.instances[{i}]", "llm, replica, node, gpus, "
                             "share and memory_gib", row) from None
    return Running(alloc, Placement(tuple(slots), (), str(pl.get("policy") or ""),
                                    str(pl.get("placed_by") or "")))


# ------------------------------------------------------------------------ placing around


@dataclass(frozen=True)
class Around:
    """:func:`place_around`'s answer: the placement of the kept and new replicas, which kept
    replicas it moved, and whether that number is proven the fewest."""

    placement: Placement
    moved: tuple[Key, ...]
    minimal: bool
    tests: int  # placements / exact tests tried


def _demand(s: Slot, gpu: str) -> Demand:
    return Demand(s.llm, s.replica, gpu, len(s.gpus), s.share, s.memory_gib)


def place_around(topology: Topology, kept: Placement, new: Sequence[Demand], *,
                 policy: str = "hierarchical", placer_options: Mapping[str, Any] | None = None,
                 fallback: Placement | None = None, deadline: Deadline | None = None,
                 max_tests: int = MAX_TESTS, search_s: float = MOVE_SEARCH_S) -> Around:
    """Place ``new`` on ``topology`` around the ``kept`` slots (module docstring): nothing moves
    when the new replicas fit around them; otherwise, per GPU type that fails, the fewest kept
    replicas are freed and placed again (``moved``; :func:`fewest_moves`, then greedy).

    ``fallback``: a complete placement of the kept and new replicas of a type (same keys), used
    when no set of kept replicas to free is found (the optimiser's own placement); without it,
    everything of the type is placed from scratch, and replicas that do not fit stay unplaced.
    The MILP gets ``search_s`` seconds per type (within ``deadline``), the greedy search
    ``max_tests`` placements; ``minimal`` says whether the number moved is proven the fewest."""
    deadline = deadline or Deadline.after(60.0)
    opts = dict(placer_options or {})
    gpu_of = {n.name: n.gpu for n in topology.nodes}
    base = apply(topology, kept)
    first = place_or_exact(base, list(new), policy, opts, deadline)
    if first.complete:
        return Around(kept.merge(first), (), True, 1)
    failed = sorted({d.gpu for d in new if (d.llm, d.replica) in
                     {(m, r) for m, r, _ in first.unplaced}})
    slots = [s for s in kept.slots if gpu_of[s.node] not in failed]
    slots += [s for s in first.slots if gpu_of[s.node] not in failed]
    unplaced: list[tuple[str, int, str]] = []
    moved: list[Key] = []
    minimal, tests = True, 1
    for gpu in failed:
        mine = [s for s in kept.slots if gpu_of[s.node] == gpu]
        todo = [d for d in new if d.gpu == gpu]
        got, proven, n = _fewest(topology, base, kept, mine, todo, gpu, policy, opts, deadline,
                                 max_tests, search_s)
        tests += n
        if got is None:  # free them all: the fallback, or everything from scratch
            proven = False
            keys = {d.key for d in todo} | {s.key for s in mine}
            if fallback is not None and {s.key for s in fallback.slots if gpu_of.get(
                    s.node) == gpu} == keys and fallback.complete:
                got = Placement(tuple(s for s in fallback.slots if s.key in keys))
            else:
                free = remove(base, kept, [s.key for s in mine])
                got = place_or_exact(free, todo + [_demand(s, gpu) for s in mine], policy, opts,
                                     deadline)
                unplaced.extend(got.unplaced)
        was = {s.key: s for s in mine}
        for s in got.slots:
            if s.key in was and (s.node, s.gpus) != (was[s.key].node, was[s.key].gpus):
                moved.append(s.key)
        placed = {s.key for s in got.slots}
        slots += [s for s in got.slots]
        slots += [s for s in mine if s.key not in placed
                  and not any(u[:2] == s.key for u in got.unplaced)]
        minimal = minimal and proven
    pl = Placement(tuple(slots), tuple(unplaced), first.policy, first.placed_by)
    return Around(pl, tuple(sorted(moved)), minimal and not unplaced, tests)


def _within(deadline: Deadline, seconds: float) -> Deadline:
    """``seconds`` from now, or ``deadline`` when that is sooner."""
    soon = Deadline.after(seconds)
    return soon if soon.at < deadline.at else deadline


def _fewest(topology: Topology, base: Topology, kept: Placement, mine: list[Slot],
            todo: list[Demand], gpu: str, policy: str, opts: Mapping[str, Any],
            deadline: Deadline, max_tests: int, search_s: float,
            ) -> tuple[Placement | None, bool, int]:
    """(placement of ``todo`` and the freed kept replicas of type ``gpu``, whether the number
    freed is proven the fewest, tests run): the MILP of :func:`fewest_moves` within
    ``search_s`` (the set it frees is placed again by the placer where it can, for the
    placer's tidier positions); when it finds nothing in time, or the type has more than
    :data:`MOVE_MILP_MAX_GPUS` GPUs, kept replicas are freed greedily by node (least used first)
    and those not needed put back (at most ``max_tests`` placements)."""
    tests = 0
    found: Placement | None

    def attempt(free: Sequence[Slot]) -> Placement | None:
        nonlocal tests
        tests += 1
        top = remove(base, kept, [s.key for s in free]) if free else base
        pl = place(top, todo + [_demand(s, gpu) for s in free], policy, **opts)
        return pl if pl.complete else None

    gpus = sum(n.gpus for n in topology.nodes if n.gpu == gpu)
    if gpus <= MOVE_MILP_MAX_GPUS:
        tests += 1
        clock = _within(deadline, search_s)
        status, slots, freed = fewest_moves(remove(base, kept, [s.key for s in mine]), mine, todo,
                                            time_limit_s=clock.remaining())
        if status == "infeasible":
            return None, True, tests
        if slots is not None:
            tidy = attempt([s for s in mine if s.key in freed])
            found = tidy if tidy is not None else Placement(slots, (), "exact", "exact")
            return found, status == "optimal", tests
    # greedy: free whole nodes' kept replicas, least used node first, then put back what is
    # not needed
    by_node: dict[str, list[Slot]] = {}
    for s in mine:
        by_node.setdefault(s.node, []).append(s)
    nodes = sorted(by_node, key=lambda n: (sum(len(s.gpus) * s.units for s in by_node[n]), n))
    free: list[Slot] = []
    found = None
    for n in nodes:
        if deadline.remaining() <= 0:
            return None, False, tests
        free += by_node[n]
        found = attempt(free)
        if found is not None:
            break
    if found is None:
        return None, False, tests
    clock = _within(deadline, search_s)
    for s in sorted(free, key=lambda s: (-len(s.gpus) * s.units, s.llm, s.replica)):
        if clock.remaining() <= 0 or tests >= max_tests:
            break
        rest = [x for x in free if x.key != s.key]
        pl = attempt(rest)
        if pl is not None:
            free, found = rest, pl
    return found, False, tests


Shape = tuple[int, int, float, float]  # tp, units, memory GiB per GPU, share


def fewest_moves(free: Topology, kept: Sequence[Slot], new: Sequence[Demand], *,
                 time_limit_s: float = MOVE_SEARCH_S,
                 ) -> tuple[str, tuple[Slot, ...] | None, frozenset[Key]]:
    """The fewest of the ``kept`` replicas (slots of one GPU type, freed on ``free``) to move so
    that they and the ``new`` replicas all fit: a MILP of the exact placement test
    (:mod:`scepsy_place.packing.exact`: ``y`` TP groups per NVLink domain and shape, ``u`` their slices
    per GPU) where each kept replica ``k`` either stays (``z_k = 1``: its share and memory on
    its own GPUs) or joins the replicas to place; minimise ``Σ (1 − z_k)`` (ties: the smaller
    replicas move). Returns (status, the slots of every kept and new replica, the keys of the
    kept replicas freed): ``optimal`` (proven fewest), ``time_limit`` (the best found in
    ``time_limit_s``), ``infeasible`` (proven: not even moving every one places them), or
    ``unknown`` (no answer in time: no slots)."""
    if not new:
        return "optimal", tuple(kept), frozenset()
    gpu = new[0].gpu
    nodes = [n for n in free.canonical_nodes() if n.gpu == gpu]
    stay_of = {k.key: k for k in kept}
    shape_of: dict[Key, Shape] = {d.key: (d.tp, d.units, d.memory_gib, d.share) for d in new}
    for k in kept:
        shape_of[k.key] = (len(k.gpus), k.units, k.memory_gib, k.share)
    shapes = sorted(set(shape_of.values()))
    need = {sh: sum(1 for d in new if shape_of[d.key] == sh) for sh in shapes}
    mine = {sh: [k for k in kept if shape_of[k.key] == sh] for sh in shapes}
    prob = pulp.LpProblem("scepsy_fewest_moves", pulp.LpMinimize)
    z = {k.key: prob.add_variable(f"z{i}", 0, 1, pulp.LpBinary) for i, k in enumerate(kept)}
    sizes = {k.key: len(k.gpus) * k.units for k in kept}
    eps = 1.0 / (1.0 + sum(sizes.values()))
    prob += pulp.LpAffineExpression([(z[k], -(1.0 + eps * sizes[k])) for k in z])
    domains = [(n, dom) for n in nodes for dom in n.domains()]
    y: dict[tuple[int, int], pulp.LpVariable] = {}
    u: dict[tuple[int, int, int], pulp.LpVariable] = {}
    for a, (n, dom) in enumerate(domains):
        for b, (tp, units, mem, _) in enumerate(shapes):
            top = need[shapes[b]] + len(mine[shapes[b]])
            fits = [j for j in dom if units <= n.free_units(j)
                    and mem <= n.free_memory(j) + MEMORY_TOL_GIB]
            if tp > len(fits) or top == 0:
                continue
            y[a, b] = prob.add_variable(f"y{a}_{b}", 0, top, pulp.LpInteger)
            for j in fits:
                u[a, b, j] = prob.add_variable(f"u{a}_{b}_{j}", 0, top, pulp.LpInteger)
    for b, sh in enumerate(shapes):
        terms = [(v, 1) for (_, bb), v in y.items() if bb == b]
        terms += [(z[k.key], 1) for k in mine[sh]]
        prob += pulp.LpAffineExpression(terms) == need[sh] + len(mine[sh]), f"count{b}"
    by_group: dict[tuple[int, int], list[tuple[int, pulp.LpVariable]]] = {}
    by_gpu: dict[tuple[int, int], list[tuple[int, pulp.LpVariable]]] = {}
    for (a, b, j), w in u.items():
        by_group.setdefault((a, b), []).append((j, w))
        by_gpu.setdefault((a, j), []).append((b, w))
    for (a, b), v in y.items():
        tp = shapes[b][0]
        slices: list[Any] = [(w, 1) for _, w in by_group.get((a, b), ())]
        prob += pulp.LpAffineExpression([*slices, (v, -tp)]) == 0, f"group{a}_{b}"
        if tp > 1:
            for j, w in by_group.get((a, b), ()):
                prob += pulp.LpAffineExpression([(w, 1), (v, -1)]) <= 0, f"distinct{a}_{b}_{j}"
    on_gpu: dict[tuple[str, int], list[Slot]] = {}
    for k in kept:
        for g in k.gpus:
            on_gpu.setdefault((k.node, g), []).append(k)
    for a, (n, dom) in enumerate(domains):
        for j in dom:
            mine_u = [(w, shapes[b][1]) for b, w in by_gpu.get((a, j), ())]
            mine_m = [(w, shapes[b][2]) for b, w in by_gpu.get((a, j), ())]
            here = on_gpu.get((n.name, j), [])
            if not mine_u and not here:
                continue
            prob += (pulp.LpAffineExpression(mine_u + [(z[k.key], k.units) for k in here])
                     <= n.free_units(j)), f"units{a}_{j}"
            prob += (pulp.LpAffineExpression(mine_m + [(z[k.key], k.memory_gib) for k in here])
                     <= n.free_memory(j) + MEMORY_TOL_GIB), f"memory{a}_{j}"
    if time_limit_s <= 0:
        return "unknown", None, frozenset()
    prob.solve(pulp_highs(time_limit_s, mip_feasibility_tolerance=1e-9))  # HiGHS's gaps
    h = prob.solverModel
    st, _, _ = highs_status(h)
    if st == "infeasible":
        return "infeasible", None, frozenset()
    if st == "optimal":
        status = "optimal"
    elif has_solution(h):  # a feasible incumbent
        status = "time_limit"
    else:
        return "unknown", None, frozenset()
    freed = frozenset(k for k, v in z.items() if round(v.value() or 0) == 0)
    queue: dict[Shape, list[Demand]] = {sh: [] for sh in shapes}
    for d in sorted([*new, *(_demand(stay_of[k], gpu) for k in freed)], key=lambda d: d.key):
        queue[shape_of[d.key]].append(d)
    out = [k for k in kept if k.key not in freed]
    for a, (n, dom) in enumerate(domains):
        for b, sh in enumerate(shapes):
            groups = round(y[a, b].value() or 0) if (a, b) in y else 0
            if groups == 0:
                continue
            slices = [j for j in dom for _ in range(round(u[a, b, j].value() or 0)
                                                        if (a, b, j) in u else 0)]
            for g in range(groups):
                d = queue[sh].pop(0)
                out.append(Slot(d.llm, d.replica, n.name, tuple(sorted(slices[g::groups])),
                                d.share, d.memory_gib))
    return status, tuple(out), freed


# ------------------------------------------------------------------------------- replan


@dataclass(frozen=True)
class ReplicaRow:
    """One replica in the report: its LLM, its number before (None: new) and after (None:
    gone), and where it ran and runs (``node``, ``gpus``; None where it does not)."""

    llm: str
    before: int | None
    after: int | None
    was: tuple[str, tuple[int, ...]] | None
    now: tuple[str, tuple[int, ...]] | None

    def to_dict(self) -> dict[str, Any]:
        def where(x: tuple[str, tuple[int, ...]] | None) -> dict[str, Any] | None:
            return None if x is None else {"node": x[0], "gpus": list(x[1])}
        return {"llm": self.llm, "replica_before": self.before, "replica_after": self.after,
                "from": where(self.was), "to": where(self.now)}


@dataclass(frozen=True)
class Replan:
    """The answer of :func:`replan`: the new placed plan on the topology after the events and
    what happens to every replica (``lost`` on a failed or drained node; ``kept`` where it runs;
    ``moved`` elsewhere; ``stopped``; ``started``)."""

    events: tuple[Event, ...]
    problem: PlanningProblem  # after the events (new targets, the cluster left)
    topology: Topology  # after the events
    placed: PlacedPlan  # the new plan and its placement
    kept: tuple[ReplicaRow, ...]
    moved: tuple[ReplicaRow, ...]
    started: tuple[ReplicaRow, ...]
    stopped: tuple[ReplicaRow, ...]
    lost: tuple[ReplicaRow, ...]
    moves_minimal: bool  # the number moved is proven the fewest for the new allocation
    move_cost_s: float
    change_penalty_s: float
    seconds: float
    tests: int = 0
    before: Mapping[str, Instance] = field(default_factory=lambda: MappingProxyType({}))
    allocations: int = 1  # allocations realised (the optimiser's, then alternatives)

    @property
    def status(self) -> str:
        return self.placed.status

    @property
    def ok(self) -> bool:
        return self.placed.placed

    @property
    def objective_s(self) -> float | None:
        """The new plan's objective (latency plus change penalties), None without a plan."""
        return self.placed.plan.objective_s if self.ok else None

    @property
    def cost_s(self) -> float | None:
        """The objective plus ``move_cost_s`` per moved replica."""
        obj = self.objective_s
        return None if obj is None else obj + self.move_cost_s * len(self.moved)

    @property
    def gpus_used(self) -> int:
        pl = self.placed.placement
        return pl.gpus_used() if pl is not None and self.ok else 0

    def per_llm(self) -> dict[str, dict[str, Any]]:
        """Per LLM: the instance before and after, and how many replicas were kept, moved,
        started, stopped and lost."""
        after = self.placed.plan.allocation.llms if self.ok and self.placed.plan.allocation \
            else {}
        out: dict[str, dict[str, Any]] = {}
        for m in sorted(set(self.before) | set(after)):
            row: dict[str, Any] = {"before": _inst(self.before.get(m)),
                                   "after": _inst(after.get(m))}
            for name in ("kept", "moved", "started", "stopped", "lost"):
                row[name] = sum(1 for r in getattr(self, name) if r.llm == m)
            out[m] = row
        return out

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (the new plan.json is :meth:`document`)."""
        return {
            "events": [e.spec for e in self.events], "status": self.status,
            "reason": self.placed.reason, "objective_s": self.objective_s,
            "move_cost_s": self.move_cost_s, "change_penalty_s": self.change_penalty_s,
            "cost_s": self.cost_s, "gpus_used": self.gpus_used,
            "targets": dict(self.problem.targets), "llms": self.per_llm(),
            **{name: [r.to_dict() for r in getattr(self, name)]
               for name in ("kept", "moved", "started", "stopped", "lost")},
            "moves_minimal": self.moves_minimal, "placement_tests": self.tests,
            "allocations_tried": self.allocations,
            "formulation": self.placed.formulation,
            "placement": (self.placed.placement.to_dict()
                          if self.placed.placement is not None and self.ok else None),
            "seconds": self.seconds}

    def document(self, *, policy: str | None = None, timings: bool = True) -> dict[str, Any]:
        """The new plan.json (:func:`scepsy_place.formulations.loop.plan_document`; its ``topology`` section
        names the nodes left when one was removed)."""
        return plan_document(self.problem, self.placed, policy=policy, timings=timings,
                             topology=self.topology)


def _inst(i: Instance | None) -> dict[str, Any] | None:
    if i is None:
        return None
    return {"gpu": i.gpu, "tp": i.tp, "share": i.share, "replicas": i.replicas}


def _same_shape(a: Instance, b: Instance) -> bool:
    return (a.gpu == b.gpu and a.tp == b.tp and abs(a.share - b.share) < 1e-9
            and abs(a.memory_share - b.memory_share) < 1e-9)


def replan(problem: PlanningProblem, topology: Topology,
           running: Running | PlacedPlan | Mapping[str, Any],
           event: Event | Sequence[Event], *, move_cost_s: float = DEFAULT_MOVE_COST_S,
           change_penalty_s: float = DEFAULT_CHANGE_PENALTY_S, deadline: Deadline | None = None,
           policy: str = "hierarchical", formulation: str = "auto",
           placer_options: Mapping[str, Any] | None = None,
           max_tests: int = MAX_TESTS, search_s: float = MOVE_SEARCH_S,
           alternatives: int = ALTERNATIVES, objective: Objective = "min-latency") -> Replan:
    """Re-plan ``running`` (a :class:`Running`, a placed :class:`PlacedPlan` or a plan.json
    document; on ``topology``, for ``problem``) after ``event`` (one or a sequence, applied in
    order; module docstring). ``move_cost_s``: cost of one moved replica
    (s of objective, :attr:`Replan.cost_s`); ``change_penalty_s``: the optimiser's penalty per
    replica started or stopped. When the plan needs moves (and ``move_cost_s > 0``), up to
    ``alternatives`` next-best allocations are tried and the one of least cost (objective plus
    moves) kept. Everything runs within ``deadline`` (default: the problem's time limit from
    now); the search for the fewest moves within ``search_s`` and ``max_tests``
    (:func:`place_around`). ``objective``: the re-plan's objective (``min-latency`` by default,
    which spreads over the whole cluster; ``min-cost`` takes the cheapest GPUs that carry the
    new targets within the problem's latency bounds, what a controller that gives GPUs back
    wants). The next-best allocations are searched under ``min-latency`` only."""
    t0 = time.perf_counter()
    if objective not in OBJECTIVES_REGISTRY:
        raise InputError("replan", "objective", f"one of {list(OBJECTIVES_REGISTRY)}",
                         objective)
    kind = OBJECTIVES_REGISTRY[objective]
    deadline = Deadline.of(problem, deadline)
    for name, x in (("move_cost_s", move_cost_s), ("change_penalty_s", change_penalty_s)):
        if isinstance(x, bool) or not (isinstance(x, int | float) and math.isfinite(x) and x >= 0):
            raise InputError("replan", name, "seconds >= 0", x)
    events = (event,) if isinstance(event, NodeFailed | RackDrained | LoadChanged) \
        else tuple(event)
    if isinstance(running, Mapping):  # a plan.json document
        run = running_from_document(running, "running plan")
    else:
        run = running if isinstance(running, Running) else Running.of(running)
    _check_running(problem, topology, run)
    new_problem, top = apply_events(problem, topology, events)
    surviving = [s for s in run.placement.slots if top.has_node(s.node)]
    lost = [s for s in run.placement.slots if not top.has_node(s.node)]
    counts: dict[str, int] = {}
    for s in surviving:
        counts[s.llm] = counts.get(s.llm, 0) + 1
    current = Allocation({m: replace(run.allocation.llms[m], replicas=k)
                          for m, k in counts.items()}, "surviving replicas")
    opts = replace(new_problem.options, objective=objective,
                   current=current if counts else None,
                   change_penalty_s=float(change_penalty_s) if counts else 0.0)
    new_problem = replace(new_problem, options=opts)
    res = plan_and_place(new_problem, top, policy=policy, formulation=formulation,  # type: ignore[arg-type]
                         placer_options=placer_options, deadline=deadline)
    rows_lost = tuple(ReplicaRow(s.llm, s.replica, None, (s.node, s.gpus), None) for s in lost)
    if not res.placed or res.plan.allocation is None:
        res = replace(res, reason=_blame(res.status, res.reason, events, new_problem.targets))
        return Replan(events, new_problem, top, res, (), (), (), (), rows_lost, False,
                      float(move_cost_s), float(change_penalty_s), time.perf_counter() - t0,
                      0, run.allocation.llms)
    kw: dict[str, Any] = {"policy": policy, "placer_options": placer_options,
                          "deadline": deadline, "max_tests": max_tests, "search_s": search_s}
    best = _realise(new_problem, top, run, surviving, res, **kw)
    tried, tests = 1, best.tests
    if (best.moved and move_cost_s > 0 and alternatives > 0 and best.placed.placed
            and kind.searches_alternatives):
        cset = generate_candidates(new_problem, prune=top.total_gpus > UNPRUNED_MAX_GPUS)
        rows: list[Row] = [_nogood(cset, res.plan.allocation)]
        for _ in range(alternatives):
            if deadline.remaining() <= 0:
                break
            plan = solve_min_latency(new_problem, cset, rows, deadline=deadline)
            if plan.allocation is None or plan.objective_s >= _cost(best, move_cost_s):
                break  # no allocation left can cost less, moves or not
            rows.append(_nogood(cset, plan.allocation))
            scratch = place_or_exact(top, demands(plan.allocation, new_problem.catalog),
                                     policy, placer_options, deadline)
            if not scratch.complete:  # not placed even on the whole cluster: skip it
                continue
            alt = PlacedPlan(plan=plan, placement=scratch, rounds=1, history=(), quality=None,
                             reason=None, exact=False, formulation="replan-alternative")
            other = _realise(new_problem, top, run, surviving, alt, **kw)
            tried, tests = tried + 1, tests + other.tests
            if other.placed.placed and _cost(other, move_cost_s) < _cost(best, move_cost_s):
                best = other
    p = best
    return Replan(events, new_problem, top, p.placed, p.kept, p.moved, p.started, p.stopped,
                  rows_lost, p.minimal, float(move_cost_s), float(change_penalty_s),
                  time.perf_counter() - t0, tests, run.allocation.llms, tried)


def _blame(status: str, reason: str | None, events: Sequence[Event],
           targets: Mapping[str, float]) -> str | None:
    """``reason`` of a re-plan without a plan, saying first which events' load the cluster
    cannot serve (a load event sets a target the plan never had: the plan is not at fault)."""
    loads = [e for e in events if isinstance(e, LoadChanged)]
    if status != "infeasible" or not loads:
        return reason
    lost = [e.spec for e in events if not isinstance(e, LoadChanged)]
    where = "the cluster" + (f" left after {', '.join(lost)}" if lost else "")
    asked = ", ".join(f"{e.workflow} {targets[e.workflow]:.4g} req/s" for e in loads)
    return (f"{where} cannot serve the load of {', '.join(e.spec for e in loads)} ({asked}): "
            f"{reason or 'no allocation carries it'}; lower the load or re-plan on a cluster "
            "with more GPUs (--cluster)")


@dataclass(frozen=True)
class _Realised:
    """One allocation realised around the survivors: its placed plan and the replica rows."""

    placed: PlacedPlan
    kept: tuple[ReplicaRow, ...]
    moved: tuple[ReplicaRow, ...]
    started: tuple[ReplicaRow, ...]
    stopped: tuple[ReplicaRow, ...]
    minimal: bool
    tests: int


def _cost(r: _Realised, move_cost_s: float) -> float:
    return r.placed.plan.objective_s + move_cost_s * len(r.moved)


def _nogood(cset: CandidateSet, alloc: Allocation | None) -> Row:
    """A row that forbids ``alloc``: its candidates (by instance) sum to at most one less
    than its LLMs."""
    assert alloc is not None
    hit = {c: 1.0 for m, inst in alloc.llms.items() for c in cset.by_llm.get(m, ())
           if c.instance == inst}
    return hit, float(len(alloc.llms) - 1)


def _realise(problem: PlanningProblem, top: Topology, run: Running, surviving: list[Slot],
             res: PlacedPlan, *, policy: str, placer_options: Mapping[str, Any] | None,
             deadline: Deadline, max_tests: int, search_s: float) -> _Realised:
    """``res``'s allocation around the surviving replicas: which stay (same shape, up to the
    new count, lowest replica numbers first), which stop, which start, where the new ones go
    and which survivors must move (:func:`place_around`); replicas renumbered ``0..r−1``."""
    alloc = res.plan.allocation
    assert alloc is not None
    keep: list[Slot] = []
    stop: list[Slot] = []
    by_llm: dict[str, list[Slot]] = {}
    for s in sorted(surviving, key=lambda s: s.key):
        by_llm.setdefault(s.llm, []).append(s)
    new: list[Demand] = []
    top_number = {m: max((s.replica for s in run.placement.slots if s.llm == m), default=-1)
                  for m in alloc.llms}
    for m, inst in sorted(alloc.llms.items()):
        mine = by_llm.get(m, [])
        old = run.allocation.llms.get(m)
        if old is not None and _same_shape(old, inst):
            keep += mine[:inst.replicas]
            stop += mine[inst.replicas:]
            extra = inst.replicas - min(len(mine), inst.replicas)
        else:
            stop += mine
            extra = inst.replicas
        if extra:
            new += demands(Allocation({m: replace(inst, replicas=extra)}), problem.catalog,
                           first_replica={m: top_number[m] + 1})
    for m, ss in by_llm.items():
        if m not in alloc.llms:
            stop += ss
    kept_pl = Placement(tuple(keep), (), policy, policy)
    fallback = _fallback(res.placement, keep, new, top)
    around = place_around(top, kept_pl, new, policy=policy, placer_options=placer_options,
                          fallback=fallback, deadline=deadline, max_tests=max_tests,
                          search_s=search_s)
    final, number = _renumber(around.placement, alloc, keep)
    dem = demands(alloc, problem.catalog)
    placed = replace(res, placement=final,
                     quality=quality(top, final, dem) if final.complete else None)
    if not final.complete:
        placed = replace(placed, status="unplaced", reason=(
            f"{len(final.unplaced)} replica(s) could not be placed around the kept ones"))
    where = {s.key: s for s in around.placement.slots}
    moved_keys = set(around.moved)
    kept_rows: list[ReplicaRow]
    moved_rows: list[ReplicaRow]
    started_rows: list[ReplicaRow]
    kept_rows, moved_rows, started_rows = [], [], []
    for s in keep:
        now = where.get(s.key)
        row = ReplicaRow(s.llm, s.replica, number.get(s.key), (s.node, s.gpus),
                         None if now is None else (now.node, now.gpus))
        (moved_rows if s.key in moved_keys else kept_rows).append(row)
    for d in new:
        now = where.get(d.key)
        started_rows.append(ReplicaRow(d.llm, None, number.get(d.key), None,
                                       None if now is None else (now.node, now.gpus)))
    stopped_rows = [ReplicaRow(s.llm, s.replica, None, (s.node, s.gpus), None)
                    for s in sorted(stop, key=lambda s: s.key)]
    return _Realised(placed, tuple(kept_rows), tuple(moved_rows),
                     tuple(sorted(started_rows, key=lambda r: (r.llm, r.after or 0))),
                     tuple(stopped_rows), around.minimal, around.tests)


def _check_running(problem: PlanningProblem, topology: Topology, run: Running) -> None:
    """The running placement is a valid placement of the running allocation on ``topology``,
    for the LLMs of ``problem``."""
    src = "running plan"
    missing = [m for m in problem.llms if m not in run.allocation.llms]
    if missing:
        raise InputError(src, f"allocation.llms.{missing[0]}",
                         "an instance for every LLM the workflows call")
    dem = demands(run.allocation, problem.catalog)
    bad = violations(topology, dem, run.placement)
    if bad:
        raise InputError(src, "placement", "a valid placement of its allocation on the cluster",
                         bad[0])


def _fallback(scratch: Placement | None, keep: Sequence[Slot], new: Sequence[Demand],
              topology: Topology) -> Placement | None:
    """The optimiser's own placement of the new allocation (replicas numbered ``0..r−1``) with
    its replicas renamed to the kept and new keys: per LLM, a kept replica takes a slot at its
    own place where there is one, then the rest in order."""
    if scratch is None or not scratch.complete:
        return None
    out: list[Slot] = []
    for m in sorted({s.llm for s in scratch.slots}):
        slots = [s for s in scratch.slots if s.llm == m]
        mine = [s for s in keep if s.llm == m]
        fresh = [d for d in new if d.llm == m]
        if len(mine) + len(fresh) != len(slots):
            return None
        free = list(slots)
        pairs: dict[Key, Slot] = {}
        for s in mine:  # a kept replica at a place the optimiser also uses stays there
            hit = next((x for x in free if (x.node, x.gpus) == (s.node, s.gpus)), None)
            if hit is not None:
                pairs[s.key] = hit
                free.remove(hit)
        for s in mine:
            if s.key not in pairs:
                pairs[s.key] = free.pop(0)
        for d in fresh:
            pairs[d.key] = free.pop(0)
        out += [replace(x, replica=k[1]) for k, x in pairs.items()]
    return Placement(tuple(out), (), scratch.policy, scratch.placed_by)


def _renumber(pl: Placement, alloc: Allocation, keep: Sequence[Slot],
              ) -> tuple[Placement, dict[Key, int]]:
    """``pl`` with every LLM's replicas numbered ``0..r−1`` (kept replicas keep a number below
    ``r``; the others take the lowest free numbers in key order), and the old key -> number."""
    number: dict[Key, int] = {}
    kept = {s.key for s in keep}
    keys = sorted({s.key for s in pl.slots} | {(m, r) for m, r, _ in pl.unplaced})
    for m, inst in alloc.llms.items():
        mine = [k for k in keys if k[0] == m]
        taken = {k[1] for k in mine if k in kept and k[1] < inst.replicas}
        for k in mine:
            if k[1] in taken and k in kept:
                number[k] = k[1]
        spare = iter(r for r in range(max(inst.replicas, len(mine))) if r not in taken)
        for k in mine:
            if k not in number:
                number[k] = next(spare)
    slots = tuple(replace(s, replica=number[s.key]) for s in pl.slots)
    unplaced = tuple((m, number[(m, r)], why) for m, r, why in pl.unplaced)
    return Placement(slots, unplaced, pl.policy, pl.placed_by), number
