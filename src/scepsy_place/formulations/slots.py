"""Slot groups: a placeable-by-construction formulation in which LLMs share GPUs.

The aggregate MILP counts GPU capacity in thousandths and learns afterwards whether its shares
pack; ``blocks`` (:mod:`scepsy_place.formulations.blocks`) pack by construction but give a GPU to one LLM
shape only. A *slot group* sits between the two: ``t`` wholly free GPUs of one NVLink domain that
all carry the same *configuration*, a multiset of shares whose sum is at most one GPU (three
0.3, or 0.5 + 0.3 + 0.2, ...). Each entry of the configuration is a *slot*: one TP-``t``
replica of any LLM whose share is no larger than the slot (it takes the slot on each of the
group's ``t`` GPUs), or, split into pieces of ``t/2``, ``t/4``, ... GPUs, replicas of smaller TP
degrees. Replicas of different LLMs share a GPU wherever their slots share one.

Per GPU type ``g`` the model (:func:`_frame`) chooses integer counts ``n[g, t, c]`` of groups of
size ``t`` with configuration ``c``, how many pieces of each size every TP level passes down to
the next, and per LLM what it runs. Three families of rows make every solution placeable:

* **Hall**, per ``g``, TP level ``t`` and share ``z``: the level's replicas of share ``≥ z`` are
  at most its pieces of size ``≥ z`` (its groups' slots, plus the pieces passed down from the
  level above, minus those it passes down); sizes are totally ordered, so sorted largest first
  the ``i``-th replica fits the ``i``-th piece exactly when all these rows hold;
* **pass-down**, per ``g``, ``t`` and size: a level passes down no more pieces of a size than
  it has;
* **domains**, per ``g`` and TP degree ``t``: ``Σ_{t' ≥ t} t'·groups[g, t'] ≤ Σ_d t·floor(free_d/t)``,
  the blocks formulation's rows, necessary and sufficient when the TP degrees divide one
  another (1, 2, 4, 8): groups laid out largest first take from each domain multiples of the
  current size.

:func:`layout` turns a solution into a concrete :class:`~scepsy_place.packing.placement.Placement` in one
pass (no search), so a plan of this formulation is always placed. Memory follows the share
(each instance gets its share of each GPU's memory), so a configuration that fits a GPU's
compute fits its memory too; with memory as a resource of its own
(``PlanOptions.memory_shares``) or TP degrees that do not divide one another the formulation
declines (:func:`applicable`) and the caller uses another. With TP 1 only the model describes
every packing of a GPU (tests: brute force).

* :func:`solve_slot_scale` (max-throughput): the largest scale ``s`` of the targets with
  ``s·ℓ_m ≤ max_utilisation·Σ μ·r``, or any solution at a fixed scale (a feasibility problem,
  much faster); :func:`plan_slot_scale` searches the scale with such solves against the proven
  bound :func:`scepsy_opt.planning.milp.scale_upper_bound`, in parts (:func:`partition`,
  :func:`solve_parts`) whose equal members reuse one solution;
* :func:`solve_slot_latency` (min-latency, or min-cost with ``gpu_cost``): one candidate per LLM
  of least total cost; :func:`plan_slot_latency` solves it part by part.

What it gives up against the aggregate MILP: a group's GPUs carry one configuration, chosen from
the share grid's multisets; the parts never trade GPUs. The number of configurations grows with
the share grid (42 for tenths); above :data:`MAX_CONFIGURATIONS` only the configurations of one
share repeated and of two shares are kept (a restriction: still placeable). Docs:
docs/optimiser.md, "Max-throughput with many LLMs sharing GPUs: slot groups".
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, cast

import numpy as np

from scepsy_common.units import UNITS, share_units
from scepsy_opt.allocation import Allocation
from scepsy_opt.planning.candidates import (
    Candidate,
    curve_key,
    fitting_curves,
    generate_candidates,
    price,
    workflow_latency_terms,
)
from scepsy_opt.planning.milp import Shape, scale_upper_bound, unit_needs
from scepsy_opt.planning.plans import Status, headroom, no_allocation_plan, plan_from_choice
from scepsy_opt.planning.problem import Deadline, PlanningProblem, TimeLimitReached
from scepsy_opt.prediction.pipeline import min_replicas
from scepsy_place.formulations.patterns import _Model, _run_mip
from scepsy_place.formulations.placed import PlacedPlan, timed_out
from scepsy_place.packing.placement import Placement, demands, whole_free_gpus
from scepsy_place.packing.quality import quality
from scepsy_place.packing.replicas import Demand, Slot
from scepsy_place.packing.topology import Node, Topology

MAX_CONFIGURATIONS = 3000  # per (GPU type, TP degree); above, a restricted set (module docstring)
POLICY = "slots"  # the name a slot layout gives its placement
RESERVE = 0.05  # of the time left, what layout and pricing keep after the parts' solves
TAIL_S_PER_LLM = 0.003  # ... and at least this per LLM (measured on 2 loaded cores: layout,
# pricing and quality of 4,096 LLMs on 65,536 GPUs take 10 s)
PROVEN_SCALE_GAP = 1e-6  # a scale this close to the proven bound is called optimal


@dataclass(frozen=True)
class SlotShape:
    """One way to run an LLM's replicas: ``tp`` GPUs of type ``gpu`` at ``share`` each (``units``
    thousandths per GPU), ``mu`` calls/s per replica."""

    gpu: str
    tp: int
    share: float
    units: int
    mu: float
    least: int = 1  # the fewest replicas it may run (fewer miss the LLM's latency bound)
    meets: bool = True  # whether some replica count meets the bound (a model uses only those)


@dataclass(frozen=True)
class SlotSolution:
    """A solution of the slot model: per LLM its shape and replicas (as unpriced
    :class:`~scepsy_opt.planning.candidates.Candidate`), the groups per ``(gpu, tp)`` (configurations and
    counts), the scale its replicas carry and the solver's status and dual bound on the scale."""

    choice: Mapping[str, Candidate]
    groups: Mapping[tuple[str, int], tuple[tuple[tuple[int, ...], int], ...]]
    passed: Mapping[tuple[str, int, int], int]  # (gpu, level, size): pieces split for the next
    scale: float
    status: str
    dual_bound: float


def applicable(problem: PlanningProblem) -> str | None:
    """Why the slot formulation cannot model ``problem`` (None when it can): memory as a
    resource of its own, or TP degrees that do not divide one another."""
    if problem.options.memory_shares is not None:
        return "memory is a resource of its own (--memory-shares): slots tie it to the share"
    tps = sorted(set(problem.options.tps))
    if any(b % a for a, b in itertools.pairwise(tps)):
        return f"TP degrees {tps} do not divide one another"
    return None


LATENCY_SCAN = 64  # replica counts above the fewest that carry an LLM's load, scanned for its bound


def bounds_alone(problem: PlanningProblem) -> bool:
    """Whether every mean latency bound (``latency_bound_s``) of a targeted workflow is on a
    workflow that calls one LLM, so that each bound is one LLM's own (:func:`slot_shapes`
    ``bounded``)."""
    return all(len(problem.stats[w].llms) == 1 for w in problem.options.latency_bound_s
               if w in problem.targets)


def _budgets(problem: PlanningProblem) -> dict[str, dict[str, float]]:
    """Per LLM, the mean latency its calls may take in each bounded workflow that calls it (its
    bound less the workflow's tool time on the critical path)."""
    out: dict[str, dict[str, float]] = {}
    for w, b in sorted(problem.options.latency_bound_s.items()):
        if w in problem.targets:
            for m in problem.stats[w].llms:
                out.setdefault(m, {})[w] = b - problem.stats[w].tool_critical_s
    return out


def _least_within(problem: PlanningProblem, m: str, curves: Sequence[Any],
                  budgets: Mapping[str, float]) -> list[int | None]:
    """Per curve of ``curves`` (``m``'s on one GPU type and TP degree), the fewest replicas that
    carry ``m``'s load at ``max_utilisation`` and keep its mean latency in every workflow within
    ``budgets`` (the predictor's, at the targets), scanning :data:`LATENCY_SCAN` counts; None
    where none of them does (fewer than the first count past the scan miss it, then). The
    fewest that carry the load are asked first; the scan only where they miss."""
    u = problem.options.max_utilisation
    first = [min_replicas(problem.loads[m], c.mu, u) for c in curves]

    def meet(per_wf: Mapping[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        ok = np.ones(shape, dtype=bool)
        for w, budget in budgets.items():
            ok &= per_wf.get(w, np.zeros(shape)) <= budget * (1 + 1e-9)
        return ok

    out: list[int | None] = list(first)
    if not budgets or not curves:
        return out
    at_first = workflow_latency_terms(problem, m, curves, [np.array([float(f)]) for f in first])
    missed = [j for j, per_wf in enumerate(at_first) if not meet(per_wf, (1,))[0]]
    if not missed:
        return out
    scans = [np.arange(first[j] + 1, first[j] + LATENCY_SCAN, dtype=float) for j in missed]
    for j, rs, per_wf in zip(missed, scans, workflow_latency_terms(
            problem, m, [curves[j] for j in missed], scans), strict=True):
        hits = np.flatnonzero(meet(per_wf, rs.shape))
        out[j] = int(rs[hits[0]]) if hits.size else None
    return out


def _undominated(shapes: Sequence[SlotShape]) -> list[SlotShape]:
    """The shapes (of one GPU type and TP degree) that no other beats: one with no larger share,
    no smaller μ and no more replicas at least is as good (its slot holds the replica too)."""
    kept: list[SlotShape] = []
    for sh in sorted(shapes, key=lambda s: (s.units, -s.mu, s.least, not s.meets)):
        if not any(k.units <= sh.units and k.mu >= sh.mu and k.least <= sh.least
                   and (k.meets or not sh.meets) for k in kept):
            kept.append(sh)
    return kept


def slot_shapes(problem: PlanningProblem, deadline: Deadline | None = None, *,
                bounded: bool = False) -> dict[str, list[SlotShape]]:
    """Per LLM, its shapes that no other of the same GPU type and TP degree beats: a shape is
    dropped when another has no larger share and no smaller μ (its slot holds the replica too).
    ``bounded``: each shape's ``least`` is the fewest replicas that keep the LLM within its
    workflows' mean latency bounds at the targets (:func:`_least_within`; every bounded
    workflow calls one LLM, :func:`bounds_alone`), a shape that meets them at no count scanned
    has ``meets`` false and ``least`` the first count past the scan (models leave it out;
    bounds count it), and a shape is beaten only by one that needs no more replicas. Raises
    :class:`~scepsy_opt.planning.problem.TimeLimitReached` once ``deadline`` passes."""
    out: dict[str, list[SlotShape]] = {}
    seen: dict[tuple[Any, ...], list[SlotShape]] = {}
    curves: dict[tuple[Any, ...], list[tuple[str, int, Any]]] = {}  # by curve_key
    every = _budgets(problem) if bounded else {}
    for m in problem.llms:
        if deadline is not None:
            deadline.check()
        budgets = every.get(m, {})
        # the serving curves depend on the model and the token lengths, not on the rate: LLMs
        # alike in those share their shapes (with latency bounds, alike in rate and bound too)
        key = curve_key(problem, m) if not budgets else (
            curve_key(problem, m), problem.loads[m], tuple(budgets.values()))
        if key in seen:
            out[m] = seen[key]
            continue
        ck = curve_key(problem, m)
        if ck not in curves:
            curves[ck] = [(g, t, c) for g, t, c in fitting_curves(problem, m, problem.demands[m])
                          if c.mu > 0]
        grouped: dict[tuple[str, int], list[Any]] = {}
        for gpu, tp, curve in curves[ck]:
            grouped.setdefault((gpu, tp), []).append(curve)
        by_type: dict[tuple[str, int], list[SlotShape]] = {}
        for (gpu, tp), group in grouped.items():
            fewest = _least_within(problem, m, group, budgets) if budgets else [1] * len(group)
            for curve, least in zip(group, fewest, strict=True):
                if least is None:  # no count scanned meets the bound: the first past the scan
                    past = min_replicas(problem.loads[m], curve.mu,
                                        problem.options.max_utilisation) + LATENCY_SCAN
                by_type.setdefault((gpu, tp), []).append(
                    SlotShape(gpu, tp, curve.share, share_units(curve.share), curve.mu,
                              past if least is None else least, least is not None))
        out[m] = seen[key] = [sh for gpu_tp in sorted(by_type)
                              for sh in _undominated(by_type[gpu_tp])]
    return out


def as_capacity_shapes(shapes: Mapping[str, Sequence[SlotShape]]) -> dict[str, list[Shape]]:
    """The slot shapes as :func:`scepsy_opt.planning.milp.capacity_shapes` gives them (units per replica:
    ``tp × units``). The shapes :func:`slot_shapes` drops never use fewer units for as much μ,
    so bounds over these hold for every shape."""
    return {m: [Shape(sh.gpu, sh.tp, sh.share, sh.tp * sh.units, sh.mu) for sh in v]
            for m, v in shapes.items()}


def configurations(sizes: Sequence[int], limit: int = MAX_CONFIGURATIONS) -> list[tuple[int, ...]]:
    """The maximal multisets of ``sizes`` (thousandths) that fit one GPU (sum ≤ 1000; no size
    can be added), largest size first, in a fixed order. Above ``limit`` of them: only one size
    repeated and two sizes (maximal within that family)."""
    desc = sorted(set(sizes), reverse=True)
    if not desc:
        return []
    least = desc[-1]
    out: list[tuple[int, ...]] = []

    def grow(start: int, room: int, acc: list[int]) -> bool:
        if len(out) > limit:
            return False
        placed = False
        for i in range(start, len(desc)):
            if desc[i] <= room:
                placed = True
                acc.append(desc[i])
                if not grow(i, room - desc[i], acc):
                    return False
                acc.pop()
        if not placed and acc:  # no size of the grid fits the room left: maximal
            out.append(tuple(acc))
        return True

    if grow(0, UNITS, []) and len(out) <= limit:
        return _maximal(out, least)
    few: set[tuple[int, ...]] = set()
    for i, a in enumerate(desc):
        for b in desc[i:]:
            for ka in range(1, UNITS // a + 1):
                kb = (UNITS - ka * a) // b if b != a else 0
                few.add(tuple([a] * ka + [b] * kb))
    return _maximal(sorted(few, reverse=True), least)


def _maximal(configs: Sequence[tuple[int, ...]], least: int) -> list[tuple[int, ...]]:
    """``configs`` without duplicates and without one that is contained in another (a larger
    configuration offers every slot of a smaller one), in a fixed order."""
    uniq = sorted(set(configs), key=lambda c: (-sum(c), c), reverse=False)
    kept: list[tuple[int, ...]] = []
    for c in uniq:
        if not any(_contains(k, c) for k in kept):
            kept.append(c)
    return sorted(kept, reverse=True)


def _contains(big: tuple[int, ...], small: tuple[int, ...]) -> bool:
    """Whether every slot of ``small`` fits a distinct slot of ``big`` (both sorted descending)."""
    if len(small) > len(big):
        return False
    return all(s <= b for s, b in zip(sorted(small, reverse=True), sorted(big, reverse=True),
                                      strict=False))


def _free(topology: Topology, gpu: str) -> list[int]:
    return [len(free) for _, _, free in whole_free_gpus(topology, gpu)]


class _FreeGPUs:
    """The wholly free GPUs per NVLink domain of each GPU type of a topology (:func:`_free`)
    and their :func:`_level` per TP degree, each scanned once (a model asks per LLM and shape)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._free: dict[str, list[int]] = {}
        self._levels: dict[tuple[str, int], int] = {}

    def free(self, gpu: str) -> list[int]:
        if gpu not in self._free:
            self._free[gpu] = _free(self.topology, gpu)
        return self._free[gpu]

    def level(self, gpu: str, tp: int) -> int:
        if (gpu, tp) not in self._levels:
            self._levels[(gpu, tp)] = _level(self.free(gpu), tp)
        return self._levels[(gpu, tp)]


def _level(free: Sequence[int], tp: int) -> int:
    return sum(tp * (f // tp) for f in free)


@dataclass
class _Frame:
    """The rows and columns of slot groups in a model (module docstring): per GPU type ``g``,
    TP level ``t`` and share ``z``, a Hall row (replicas of share ``≥ z`` at most the pieces of
    size ``≥ z`` left at the level) and a pass-down row; the pass-down columns; the domain rows;
    the group columns per ``(g, t)``. A replica column enters :meth:`replica_rows`."""

    zs: dict[str, list[int]]
    lv: dict[str, list[int]]
    hall: dict[tuple[str, int, int], int]
    left: dict[tuple[str, int, int], int]
    passdown: dict[tuple[str, int, int], int]
    dom_rows: dict[tuple[str, int], int]
    groups: dict[tuple[str, int], list[tuple[tuple[int, ...], int]]]

    def replica_rows(self, gpu: str, tp: int, units: int, count: float,
                     ) -> tuple[list[int], list[float]]:
        """The Hall rows ``count`` replicas of (gpu, tp, units) enter, and their coefficients."""
        rows = [self.hall[(gpu, tp, z)] for z in self.zs[gpu] if units >= z]
        return rows, [count] * len(rows)

    def read(self, vals: Sequence[float],
             ) -> tuple[dict[tuple[str, int], tuple[tuple[tuple[int, ...], int], ...]],
                        dict[tuple[str, int, int], int]]:
        """The groups and pass-down counts of a solution."""
        groups = {key: tuple((c, round(vals[j])) for c, j in gc if round(vals[j]) > 0)
                  for key, gc in self.groups.items()}
        passed = {key: round(vals[j]) for key, j in self.passdown.items() if round(vals[j]) > 0}
        return groups, passed


def _frame(model: _Model, kinds: Sequence[tuple[str, int, int]], topology: Topology | _FreeGPUs,
           gpu_cost: Mapping[str, float] | None = None) -> _Frame:
    """The slot-group rows and columns for replicas of the (gpu, tp, units) ``kinds``, on the
    wholly free GPUs of ``topology`` (``gpu_cost``: the objective's cost of each GPU a group
    takes, per type; none by default). Replica columns enter the rows it makes."""
    gpus = sorted({g for g, _, _ in kinds})
    have = topology if isinstance(topology, _FreeGPUs) else _FreeGPUs(topology)
    free = {g: have.free(g) for g in gpus}
    zs = {g: sorted({z for gg, _, z in kinds if gg == g}) for g in gpus}
    lv = {g: sorted({t for gg, t, _ in kinds if gg == g}) for g in gpus}
    hall: dict[tuple[str, int, int], int] = {}
    left: dict[tuple[str, int, int], int] = {}
    for g in gpus:
        for t in lv[g]:
            for z in zs[g]:
                hall[(g, t, z)] = model.row(-math.inf, 0.0)
                left[(g, t, z)] = model.row(-math.inf, 0.0)
    passdown: dict[tuple[str, int, int], int] = {}
    for g in gpus:  # the pass-down columns k[g, t, z], t above the lowest level
        for j in range(1, len(lv[g])):
            t, below = lv[g][j], lv[g][j - 1]
            for z in zs[g]:
                rows = [left[(g, t, z)], left[(g, below, z)]]
                vals = [1.0, -float(t // below)]
                for zz in zs[g]:
                    if zz <= z:
                        rows += [hall[(g, t, zz)], hall[(g, below, zz)]]
                        vals += [1.0, -float(t // below)]
                passdown[(g, t, z)] = model.col(0.0, 0.0, math.inf, rows, vals, True)
    dom_rows = {(g, t): model.row(-math.inf, float(_level(free[g], t)))
                for g in gpus for t in lv[g]}
    frame = _Frame(zs, lv, hall, left, passdown, dom_rows, {})
    for g in gpus:  # the groups: n[g, t, c] groups of t GPUs with configuration c
        confs = configurations(zs[g])
        for t in lv[g]:
            frame.groups[(g, t)] = []
            for c in confs:
                rows, vals = [], []
                for z in zs[g]:
                    above, exact = sum(1 for x in c if x >= z), sum(1 for x in c if x == z)
                    if above:
                        rows.append(hall[(g, t, z)])
                        vals.append(-float(above))
                    if exact:
                        rows.append(left[(g, t, z)])
                        vals.append(-float(exact))
                for (gg, tt), row in dom_rows.items():
                    if gg == g and tt <= t:
                        rows.append(row)
                        vals.append(float(t))
                most = _level(free[g], t) // t
                cost = t * gpu_cost.get(g, 0.0) if gpu_cost is not None else 0.0
                frame.groups[(g, t)].append((c, model.col(cost, 0.0, float(most), rows, vals,
                                                          True)))
    return frame


def solve_slot_scale(problem: PlanningProblem, topology: Topology, *, deadline: Deadline,
                     shapes: Mapping[str, Sequence[SlotShape]] | None = None,
                     scale_ub: float | None = None, gap_rel: float = 1e-4,
                     time_limit_s: float | None = None,
                     at_scale: float | None = None,
                     gpu_cost: Mapping[str, float] | None = None) -> SlotSolution:
    """The largest scale of ``problem``'s targets that slot groups on ``topology``'s free GPUs
    carry at ``max_utilisation`` (module docstring), within ``deadline`` (and ``time_limit_s``).
    ``scale_ub``: a known upper bound on the scale (the aggregate capacity optimum) that caps
    each shape's replica count; ``at_scale``: find any solution at that scale instead (a
    feasibility problem, much faster), and with ``gpu_cost`` (per GPU type) the solution of
    that scale whose groups' GPUs cost the least (within ``gap_rel``; cut short, the best found
    so far). Without a solution the result has no ``choice`` and says
    why in ``status``: ``infeasible`` (proven, or an LLM with no shape on a free GPU) or
    ``time_limit``."""
    shp = shapes if shapes is not None else slot_shapes(problem, deadline)
    u = problem.options.max_utilisation
    loads = problem.loads
    model = _Model()
    have = _FreeGPUs(topology)
    usable = {m: [sh for sh in shp[m] if sh.meets and have.level(sh.gpu, sh.tp) > 0]
              for m in sorted(shp)}
    if any(not v for v in usable.values()):
        return _none("infeasible")
    frame = _frame(model, [(sh.gpu, sh.tp, sh.units) for v in usable.values() for sh in v],
                   have, gpu_cost if at_scale is not None else None)
    s_col_rows: list[int] = []
    s_col_vals: list[float] = []
    # the LLMs: one shape each, s·ℓ ≤ u·Σ μ·r
    cols: dict[str, list[tuple[SlotShape, int, int]]] = {}
    for m, options in usable.items():
        one = model.row(1.0, 1.0)
        load_row = model.row(-math.inf, 0.0)
        s_col_rows.append(load_row)
        s_col_vals.append(loads[m])
        cols[m] = []
        for sh in options:
            room = have.level(sh.gpu, sh.tp) // sh.tp * (UNITS // sh.units)
            top = room
            if scale_ub is not None and math.isfinite(scale_ub) and loads[m] > 0:
                top = min(top, max(1, math.ceil(scale_ub * loads[m] / (u * sh.mu) - 1e-9)))
            top = max(top, min(sh.least, room))
            link = model.row(-math.inf, 0.0)  # r − top·y ≤ 0
            least = model.row(0.0, math.inf)  # r − least·y ≥ 0
            y = model.col(0.0, 0.0, 1.0 if sh.least <= room else 0.0, [one, link, least],
                          [1.0, -float(top), -float(sh.least)], True)
            rows, vals = frame.replica_rows(sh.gpu, sh.tp, sh.units, 1.0)
            r = model.col(0.0, 0.0, float(top), [load_row, link, least, *rows],
                          [-u * sh.mu, 1.0, 1.0, *vals], True)
            cols[m].append((sh, y, r))
    s_hi = scale_ub * (1 + 1e-6) if scale_ub is not None and math.isfinite(scale_ub) else math.inf
    if at_scale is None:
        model.col(-1.0, 0.0, s_hi, s_col_rows, s_col_vals)
    else:  # feasibility at a fixed scale: any solution ends the search
        model.col(0.0, at_scale, at_scale, s_col_rows, s_col_vals)
    status, vals, dual = _solve(model, deadline, time_limit_s, gap_rel)
    if not vals:
        return _none(status)
    choice: dict[str, Candidate] = {}
    for m, triples in cols.items():
        sh, _, r = max(triples, key=lambda t: vals[t[1]])
        reps = max(1, round(vals[r]))
        choice[m] = Candidate(m, sh.gpu, sh.tp, sh.share, reps, sh.tp * sh.units * reps, sh.mu,
                              math.nan, 0.0, 0.0)
    groups, passed = frame.read(vals)
    scale = min(headroom(problem, choice).values()) if choice else 0.0
    return SlotSolution(choice, groups, passed, scale, status,
                        -dual if math.isfinite(dual) else math.inf)


def solve_slot_latency(problem: PlanningProblem, topology: Topology,
                       cands: Mapping[str, Sequence[Candidate]], *, deadline: Deadline,
                       gap_rel: float = 1e-4, time_limit_s: float | None = None,
                       gpu_cost: Mapping[str, float] | None = None, latency_weight: float = 1.0,
                       extra: Sequence[tuple[Mapping[Candidate, float], float]] = (),
                       ) -> SlotSolution:
    """Min-latency in slot groups: one candidate per LLM (``cands``, priced at the targets), the
    least total cost whose replicas fit slot groups on ``topology``'s free GPUs. With
    ``gpu_cost`` (per GPU type) the objective is the price of the GPUs the groups take plus
    ``latency_weight`` × the latency (min-cost: a small weight breaks ties); ``extra``: rows
    ``Σ coeff·x_c ≤ rhs`` over the candidates (latency bounds). The solution's ``dual_bound``
    is the solver's bound on that objective over these candidates in slot groups."""
    model = _Model()
    have = _FreeGPUs(topology)
    usable = {m: [c for c in cands[m] if have.level(c.gpu, c.tp) > 0] for m in sorted(cands)}
    if any(not v for v in usable.values()):
        return _none("infeasible")
    frame = _frame(model, sorted({(c.gpu, c.tp, share_units(c.share))
                                  for v in usable.values() for c in v}), have, gpu_cost)
    rows_extra = [(coeffs, model.row(-math.inf, rhs)) for coeffs, rhs in extra]
    cols: dict[str, list[tuple[Candidate, int]]] = {}
    for m, options in usable.items():
        one = model.row(1.0, 1.0)
        cols[m] = []
        for c in options:
            rows, vals = frame.replica_rows(c.gpu, c.tp, share_units(c.share), float(c.replicas))
            for coeffs, row in rows_extra:
                if c in coeffs:
                    rows.append(row)
                    vals.append(float(coeffs[c]))
            cols[m].append((c, model.col(latency_weight * c.cost, 0.0, 1.0, [one, *rows],
                                         [1.0, *vals], True)))
    status, vals, dual = _solve(model, deadline, time_limit_s, gap_rel)
    if not vals:
        return _none(status)
    choice = {m: max(pairs, key=lambda p: vals[p[1]])[0] for m, pairs in cols.items()}
    groups, passed = frame.read(vals)
    scale = min(headroom(problem, choice).values()) if choice else 0.0
    return SlotSolution(choice, groups, passed, scale, status, dual)


FALLBACK_SHARE = 0.3  # min-latency in several parts: each round's time for a plan in hand first
CARRY_ROUNDS = 3  # ... in rounds: a part cut short tries again in the next, with its own share
PART_GAP_REL = 0.005  # min-latency in parts: each part's MILP stops this close to its bound
FEWEST_REPLICAS = 3  # per shape, the replica counts min-latency slot groups keep beyond dominance


def latency_candidates(every: Mapping[str, Sequence[Candidate]]) -> dict[str, list[Candidate]]:
    """What min-latency slot groups choose from, of ``every`` candidate: those no other on the
    same GPU type beats with no more units and no more cost (the optimiser's dominance) and,
    per shape, the :data:`FEWEST_REPLICAS` fewest replica counts (the small footprints that
    pack where the others do not); then :func:`slot_candidates`. A restriction of the grid (the
    plan has no bound over it): at 16 LLMs a quarter of the candidates, the same optimum."""
    out: dict[str, list[Candidate]] = {}
    for m, cs in every.items():
        keep: set[Candidate] = set()
        best: dict[str, float] = {}
        for c in sorted(cs, key=lambda c: (c.gpu, c.units, c.cost, c.tp, c.share, c.replicas)):
            if c.cost < best.get(c.gpu, math.inf):
                keep.add(c)
                best[c.gpu] = c.cost
        by_shape: dict[tuple[str, int, float], list[Candidate]] = {}
        for c in cs:
            by_shape.setdefault((c.gpu, c.tp, c.share), []).append(c)
        for v in by_shape.values():
            keep.update(sorted(v, key=lambda c: c.replicas)[:FEWEST_REPLICAS])
        out[m] = [c for c in cs if c in keep]
    return slot_candidates(out)


def slot_candidates(cands: Mapping[str, Sequence[Candidate]]) -> dict[str, list[Candidate]]:
    """Per LLM, the candidates no other beats for slot groups: one is dropped when another on
    the same GPU type and TP degree has no larger share, no more replicas and no larger cost
    (its replicas fit wherever the dropped one's do). Ties keep the first in a fixed order."""
    out: dict[str, list[Candidate]] = {}
    for m, cs in cands.items():
        order = sorted(cs, key=lambda c: (c.gpu, c.tp, c.cost, c.share, c.replicas))
        kept: list[Candidate] = []
        for c in order:
            if not any(k.gpu == c.gpu and k.tp == c.tp and k.share <= c.share
                       and k.replicas <= c.replicas for k in kept):
                kept.append(c)
        out[m] = kept
    return out


def _solve(model: _Model, deadline: Deadline, time_limit_s: float | None, gap_rel: float,
           ) -> tuple[str, list[float], float]:
    """(status, values, dual bound) of ``model`` within ``deadline`` and ``time_limit_s``;
    without values the status is ``infeasible`` (proven) or ``time_limit``."""
    limit = deadline.remaining() if time_limit_s is None else min(deadline.remaining(),
                                                                  time_limit_s)
    if limit <= 0:
        return "time_limit", [], math.inf
    status, vals, _, dual = _run_mip(model, limit, gap_rel)
    if not vals:
        return ("infeasible" if status == "infeasible" else "time_limit"), [], math.inf
    return status, vals, dual


def _none(status: str) -> SlotSolution:
    """No solution, and why (``infeasible`` or ``time_limit``)."""
    return SlotSolution({}, {}, {}, 0.0, status, math.inf)


def layout(topology: Topology, solution: SlotSolution, demands: Sequence[Demand]) -> Placement:
    """A concrete placement of ``demands`` in ``solution``'s slot groups on ``topology``'s
    wholly free GPUs, in one pass: per GPU type, groups largest first into each NVLink domain's
    free GPUs (multiples of the size, so every group fits when the domain rows hold); then level
    by level, largest TP degree first, the pieces of the level (its groups' slots and the pieces
    split from the level above) less those the solution passes down, matched largest share to
    largest piece with the level's replicas (Hall's condition, which the solution's rows hold).
    A replica left without a piece is unplaced, with the reason (never when the demands are the
    solution's replicas)."""
    slots: list[Slot] = []
    unplaced: list[tuple[str, int, str]] = []
    by_gpu: dict[str, list[Demand]] = {}
    for d in demands:
        by_gpu.setdefault(d.gpu, []).append(d)
    groups = solution.groups
    for gpu in sorted({g for g, _ in groups} | set(by_gpu)):
        domains = [(n.name, list(free)) for n, _, free in whole_free_gpus(topology, gpu)]
        levels = sorted({t for g, t in groups if g == gpu} | {d.tp for d in by_gpu.get(gpu, ())}
                        | {t for g, t, _ in solution.passed if g == gpu}, reverse=True)
        own: dict[int, list[tuple[int, str, tuple[int, ...]]]] = {t: [] for t in levels}
        for t in levels:
            spot = 0  # the first domain with t GPUs left: it only moves on within a level
            for c, count in groups.get((gpu, t), ()):
                for _ in range(count):
                    while spot < len(domains) and len(domains[spot][1]) < t:
                        spot += 1
                    if spot == len(domains):
                        break
                    node, f = domains[spot]
                    ids = tuple(f[:t])
                    domains[spot] = (node, f[t:])
                    own[t].extend((z, node, ids) for z in c)
        from_above: list[tuple[int, str, tuple[int, ...]]] = []
        for j, t in enumerate(levels):
            pieces = sorted(own[t] + from_above, key=lambda p: (-p[0], p[1], p[2]))
            below = levels[j + 1] if j + 1 < len(levels) else None
            from_above = []
            if below is not None:  # per size, the last k pieces of the size go down
                by_size: dict[int, list[tuple[int, str, tuple[int, ...]]]] = {}
                for piece in pieces:
                    by_size.setdefault(piece[0], []).append(piece)
                kept: list[tuple[int, str, tuple[int, ...]]] = []
                for z in sorted(by_size):
                    mine = by_size[z]
                    k = solution.passed.get((gpu, t, z), 0)
                    cut = len(mine) - k if k else len(mine)
                    for p in mine[cut:]:
                        from_above.extend((z, p[1], p[2][i:i + below])
                                          for i in range(0, t, below))
                    kept.extend(mine[:cut])
                pieces = sorted(kept, key=lambda p: (-p[0], p[1], p[2]))
            reps = sorted((d for d in by_gpu.get(gpu, ()) if d.tp == t),
                          key=lambda d: (-d.units, d.llm, d.replica))
            for i, d in enumerate(reps):
                if i < len(pieces) and pieces[i][0] >= d.units:
                    _, node, ids = pieces[i]
                    slots.append(Slot(d.llm, d.replica, node, ids, d.share, d.memory_gib))
                else:
                    unplaced.append((d.llm, d.replica, "no slot of its size left in the slot "
                                     "groups"))
    return Placement(tuple(slots), tuple(unplaced), POLICY, POLICY)


# --------------------------------------------------------------------------- max-throughput

PART_LLMS = 16  # LLMs per part of the decomposition (benchmarks/solvers/many_models_bench.py)
LADDER_REL = 0.005  # the step of the parts' search, relative to the bound on the scale
RETRY_BOOST = 2.0  # a probe cut short is tried once more with this many shares
PART_PROBES = 3  # a later distinct part's budget, in probes (its level, a retry, a step down)
RESCUE_STEP = 0.05  # a part without a solution when its budget is spent: this far below the
# scale last tried, then twice as far (at most half), each with its share of the time left
SAFE_BELOW = 0.1  # the other parts' first probe: this far below what the first part carries
# (parts balanced by their need at the bound carry alike: on Zipf 256 / 512 and 1,000 / 4,096 a
# tenth below gave 6.6% and 24% gaps where 30% gave 12% and 43%, same load, 30 s)
PROBE_MIN_S = 0.3  # the least time a probe gets (HiGHS's presolve alone takes 0.1-0.2 s)
PROBE_S_PER_SIZE = 0.01  # seconds per LLM and GPU type a probe that finds a solution takes
# (measured: 0.15-0.2 s for 11 LLMs on 5 nodes of 2 types, 0.4-0.5 s for 57 on 26)
PROBE_MARGIN = 1.5  # a probe gets at least this many times what such probes took
PART_MIN_S = 1.0  # the parts are made larger until each distinct part gets this much time
TARGET_PART_MIN_S = 0.3  # ... when a target is asked of them (one probe each, PROBE_MIN_S)
TARGET_GAP_REL = 0.01  # a part asked for a target at the least price: this close to its bound
FIRST_STEP = 0.02  # the first part's first probe: this far below the bound (WIDE_GAP)
FIRST_PROBES = 4  # the time shares the first part's search is given (it probes several times)
FIRST_SHARE = 0.25  # ... and at most this share of the time when other parts follow
LARGER_PARTS = 4  # the parts of the second try, in LLMs, as a multiple of the first's
WIDE_GAP = 0.02  # a gap to the bound above which the second try runs (docs/optimiser.md)
LARGER_FIRST_SHARE = 0.6  # of the time, what larger parts get when they go first
LARGER_FIRST_MAX_PARTS = 8  # ... which they do only when they are this few
QUICK_PART_NODES = 32  # a part whose probes settle in seconds: at most this many nodes ...
QUICK_PART_LLMS = 200  # ... and LLMs (measured on Zipf, at 2% below the part's bound: 192 LLMs
# on 32 nodes 1.8-3 s, 150 on 64 nodes 1-17 s, 200 on 128 nodes more than 20 s)


@dataclass(frozen=True)
class Part:
    """One part of the decomposition: its LLMs and the names of its nodes; ``gpu``: the one GPU
    type of a part built around a heavy LLM (:func:`partition`)."""

    llms: tuple[str, ...]
    nodes: tuple[str, ...]
    gpu: str | None = None


PARTITION_ROUNDS = 4  # rounds of nodes-to-needs and LLMs-to-nodes (partition)
HEAVY_FILL = 1.0  # of its GPU type's nodes in an even part, what makes an LLM heavy


def partition(problem: PlanningProblem, topology: Topology, part_llms: int = PART_LLMS,
              need: Mapping[str, Mapping[str, float]] | None = None) -> list[Part]:
    """The LLMs and the nodes in parts of about ``part_llms`` LLMs, each with nodes in
    proportion to what its LLMs need (``need``: per LLM, the GPU units it needs on each GPU
    type, :func:`capacity_need`; default: its load on every type). An LLM runs one shape, so on
    one GPU type. Deterministic:

    1. *heavy* LLMs: those that need more than :data:`HEAVY_FILL` of their best GPU type's
       units in a part of even size and the cluster's mix; each gets a part of its own, so
       the count of parts (the fewest with at most ``part_llms`` LLMs each) grows, and the test
       repeats until the count stays. Without heavy LLMs the count is raised to the next one
       that divides every type's node count when one lies within twice it (equal parts then
       get equal nodes);
    2. a heavy LLM's part is of one GPU type (largest first, the type whose units its need
       fills least, counting the heavy LLMs before it); the other LLMs are dealt largest need
       first (equal LLMs next to each other) to the part of least need so far (the first of
       equals);
    3. nodes to parts by D'Hondt's rule (one node at a time to the part of the largest need per
       node, :func:`_nodes_by_need`): a heavy part from its type; the other parts, whose LLMs
       may move, as one pool that takes runs of an order interleaving the GPU types by their
       counts, so each has the cluster's mix;
    4. the LLMs dealt again, largest need first, each to the part whose need per GPU unit
       stays least with it (a heavy part keeps its LLM), so the small LLMs even out what whole
       nodes could not; steps 3 and 4 repeat with the new needs until the node counts stay
       (at most :data:`PARTITION_ROUNDS` times);
    5. an LLM of a mixed part that no GPU type of its part holds is made heavy, and the
       partition made again.

    ``k`` copies of the same LLMs on ``k`` times the nodes make ``k`` equal parts."""
    types = sorted({n.gpu for n in topology.nodes})
    per: dict[str, dict[str | None, float]] = {
        m: {t: (need[m].get(t, math.inf) if need is not None else problem.loads[m])
            for t in types} for m in problem.llms}
    weight = {m: min(per[m].values(), default=0.0) for m in problem.llms}
    nodes = _interleaved(topology.canonical_nodes())
    units = {t: sum(n.gpus for n in nodes if n.gpu == t) * UNITS for t in types}
    frac = {t: units[t] / max(1, sum(units.values())) for t in types}
    for m, v in per.items():  # in a part of the cluster's mix: the need blended by type
        finite = all(math.isfinite(x) for x in v.values())
        v[None] = sum(frac[t] * v[t] for t in types) if finite else weight[m]
    # equal LLMs next to each other (their need ties), so equal LLMs are dealt alike
    llms = sorted(problem.llms, key=lambda m: (-weight[m], problem.models[m],
                                                -problem.loads[m], m))
    room = {t: sum(1 for n in nodes if n.gpu == t) for t in types}  # nodes, one per part
    want = max(1, math.ceil(len(llms) / part_llms))
    if want <= 1 or len(nodes) <= 1:
        return [Part(tuple(sorted(llms)), tuple(n.name for n in topology.nodes))]
    # heavy: more than HEAVY_FILL of what its best GPU type gives a part of even size and the
    # cluster's mix (a part of its own makes the parts more: until the count stays), or, in
    # the parts made, more than any GPU type of its part holds (then again with it heavy)
    total = sum(units.values())
    forced: set[str] = set()
    while True:
        k = want
        while True:
            heavy = [m for m in llms if m in forced or min(
                per[m][t] / (frac[t] * total / k) for t in types) > HEAVY_FILL]
            heavy = heavy[:max(0, min(len(nodes), len(llms)) - 1)]
            more = min(len(heavy) + math.ceil((len(llms) - len(heavy)) / part_llms),
                       len(nodes), len(llms))
            if more <= k:
                break
            k = more
        if not heavy:  # a count that divides every type's nodes gives equal parts equal nodes
            common = math.gcd(*room.values()) if room else 1
            k = min(next((d for d in range(want, 2 * want + 1) if common % d == 0), want),
                    len(nodes), len(llms))
        parts = _parts(llms, nodes, per, heavy, k)
        have = {n.name: n for n in nodes}
        held = [{t: sum(have[x].gpus for x in q.nodes if have[x].gpu == t) * UNITS
                 for t in types} for q in parts]  # per part and type, its units
        unfit = {m for q, h in zip(parts, held, strict=True) if q.gpu is None for m in q.llms
                 if not any(per[m][t] <= h[t] for t in types)} - forced
        if any(not q.nodes for q in parts):  # more heavy LLMs than their type has nodes
            return [Part(tuple(sorted(llms)), tuple(n.name for n in topology.nodes))]
        if not unfit or len(forced) + len(unfit) >= min(len(nodes), len(llms)):
            return parts
        forced |= unfit


def _parts(llms: Sequence[str], nodes: Sequence[Node], per: Mapping[str, Mapping[str | None, float]],
           heavy: Sequence[str], k: int) -> list[Part]:
    """:func:`partition`'s steps 2 to 4 for ``k`` parts, the first ones those of the
    ``heavy`` LLMs (largest first)."""
    types = sorted({n.gpu for n in nodes})
    units = {t: sum(n.gpus for n in nodes if n.gpu == t) * UNITS for t in types}
    room = {t: sum(1 for n in nodes if n.gpu == t) for t in types}  # nodes, one per part
    kind: list[str | None] = [None] * k  # a heavy part's GPU type
    taken = dict.fromkeys(types, 0.0)
    seed: dict[int, str] = {}
    for i, m in enumerate(heavy):  # largest first: the type its need fills least
        fits = [t for t in types if room[t] > 0 and math.isfinite(per[m][t])]
        if fits:
            t = min(fits, key=lambda t: ((taken[t] + per[m][t]) / units[t], types.index(t)))
            kind[i], taken[t], room[t] = t, taken[t] + per[m][t], room[t] - 1
        seed[i] = m
    members = _dealt(llms, per, kind, [1.0] * k, seed)
    # a heavy part: at least the nodes of its type its LLM needs (as many as there are)
    size = {t: max((n.gpus for n in nodes if n.gpu == t), default=1) * UNITS for t in types}
    count = {t: sum(1 for n in nodes if n.gpu == t) for t in types}
    least = {i: max(1, min(math.ceil(per[m][kind[i]] / size[str(kind[i])] - 1e-9),
                           count[str(kind[i])]))
             if kind[i] is not None else 1 for i, m in seed.items()}
    runs: list[list[Node]] = []
    for _ in range(PARTITION_ROUNDS):
        needs = [sum(per[m][kind[i]] for m in members[i]) for i in range(k)]
        new = _nodes_by_need(nodes, needs, kind, least)
        if new == runs:
            break
        runs = new
        members = _dealt(llms, per, kind, [sum(n.gpus for n in r) * UNITS for r in runs], seed)
    return [Part(tuple(sorted(members[i])), tuple(n.name for n in runs[i]), kind[i])
            for i in range(k)]


def _dealt(llms: Sequence[str], per: Mapping[str, Mapping[str | None, float]],
           kind: Sequence[str | None], capacity: Sequence[float],
           seed: Mapping[int, str]) -> list[list[str]]:
    """``llms`` (in order) each to the part whose need per unit of ``capacity`` stays least
    with it (the first of equals; ``per[m][kind]``: on a part of one GPU type the need on that
    type, on a mixed part (kind None) the need blended by the cluster's mix), the LLMs of
    ``seed`` (part -> LLM) fixed to their parts."""
    k = len(capacity)
    got: list[list[str]] = [[] for _ in range(k)]
    total = np.zeros(k)
    fixed = set(seed.values())
    for i, m in sorted(seed.items()):
        got[i].append(m)
        total[i] += per[m][kind[i]]
    # one vectorised pass per LLM (the same IEEE sums and quotients as one part at a time;
    # argmin takes the first of equals)
    cap = np.asarray(capacity, dtype=float)
    kinds = list(dict.fromkeys(kind))
    col = np.array([kinds.index(kind[j]) for j in range(k)], dtype=int)
    needs = np.array([[per[m][t] for t in kinds] for m in llms], dtype=float).reshape(
        len(llms), len(kinds))
    for r, m in enumerate(llms):
        if m in fixed:
            continue
        with np.errstate(divide="ignore"):  # a part of no capacity reads inf: taken last
            i = int(((total + needs[r][col]) / cap).argmin())
        got[i].append(m)
        total[i] += per[m][kind[i]]
    return got


def _nodes_by_need(nodes: Sequence[Node], needs: Sequence[float],
                   kind: Sequence[str | None], fixed: Mapping[int, int]) -> list[list[Node]]:
    """``nodes`` to parts by D'Hondt's rule (:func:`_highest_averages`: the largest need per
    node as small as it can be). A part of one GPU type (``kind``) takes that type's nodes.
    A part of ``fixed`` (part -> nodes) takes at least that many nodes (what its heavy LLM
    needs). The other parts, whose LLMs may move between them, count as one pool per type
    (or one over all types) for that rule, and split the pool's count among themselves by
    it again, in consecutive runs of the pool's nodes (interleaved, :func:`_interleaved`)."""
    k = len(needs)
    groups: list[list[int]] = [[i] for i in range(k) if i in fixed]
    for t in dict.fromkeys(kind):
        pool = [i for i in range(k) if i not in fixed and kind[i] == t]
        if pool:
            groups.append(pool)
    types = dict.fromkeys([*(n.gpu for n in nodes), *(t for t in kind if t is not None)])
    left = {t: [n for n in nodes if n.gpu == t] for t in types}
    cls = [kind[g[0]] for g in groups]
    counts = _highest_averages([sum(needs[i] for i in g) for g in groups], len(nodes),
                               least=[fixed.get(g[0], 1) if len(g) == 1 and g[0] in fixed
                                      else len(g) for g in groups], classes=cls,
                               most={t: len(v) for t, v in left.items()})
    out: dict[int, list[Node]] = {}
    share: list[tuple[list[int], list[Node]]] = []
    for g, c, t in zip(groups, counts, cls, strict=True):
        if t is not None:
            mine, left[t] = left[t][:c], left[t][c:]
            share.append((g, mine))
    rest = _interleaved([n for v in left.values() for n in v])
    for g, c, t in zip(groups, counts, cls, strict=True):
        if t is None:  # runs of what the typed parts left, one after the other
            share.append((g, rest[:c]))
            rest = rest[c:]
    for g, mine in share:
        split = _highest_averages([needs[i] for i in g], len(mine))
        cuts = list(itertools.accumulate(split, initial=0))
        for j, i in enumerate(g):
            out[i] = mine[cuts[j]:cuts[j + 1]]
    return [out[i] for i in range(k)]


def _highest_averages(weights: Sequence[float], n: int, *, least: Sequence[int] | None = None,
                      classes: Sequence[str | None] | None = None,
                      most: Mapping[str, int] | None = None) -> list[int]:
    """``n`` whole things to parts in proportion to ``weights``: every part its ``least``
    first (default one; as far as its class has things left), then one at a time to the part of the largest weight per thing so
    far (the first of equals; D'Hondt's rule, which keeps the largest weight per thing as
    small as it can be). With ``classes`` and ``most``, the parts of a class take at most
    ``most[class]`` things together (a part of class None any). Fewer than ``n`` when every
    part is full."""
    k = len(weights)
    cls = list(classes) if classes is not None else [None] * k
    # keyed by class, looked up by a part's class or None (a part of no class: never a key)
    cap = cast(dict[str | None, int], dict(most or {}))
    got = [0] * k
    used = dict.fromkeys(cap, 0)
    for j, want in enumerate(least if least is not None else [1] * k):  # within the classes
        got[j] = want if cls[j] not in cap else max(0, min(want, cap[cls[j]] - used[cls[j]]))
        if cls[j] in cap:
            used[cls[j]] += got[j]
    # a heap of (−weight per thing, part): the largest weight per thing first, the first of
    # equals; a part whose class is full is dropped when it comes up (classes only fill)
    heap = [(-(weights[j] / max(got[j], 1e-9)), j) for j in range(k)]
    heapq.heapify(heap)
    for _ in range(max(0, n - sum(got))):
        while heap and not (cls[heap[0][1]] is None
                            or used.get(cls[heap[0][1]], 0) < cap.get(cls[heap[0][1]], n)):
            heapq.heappop(heap)
        if not heap:
            break
        i = heapq.heappop(heap)[1]
        got[i] += 1
        c = cls[i]
        if c is not None:
            used[c] = used.get(c, 0) + 1
        heapq.heappush(heap, (-(weights[i] / max(got[i], 1e-9)), i))
    return got


def _interleaved(nodes: Sequence[Node]) -> list[Node]:
    """``nodes`` in their order per GPU type, the types interleaved by their counts (each next
    node from the type furthest behind its share; types in order of first appearance), so
    consecutive runs have the mix."""
    by_type: dict[str, list[Node]] = {}
    for n in nodes:
        by_type.setdefault(n.gpu, []).append(n)
    order = list(by_type)
    total = len(nodes)
    taken = dict.fromkeys(by_type, 0)
    out: list[Node] = []
    for i in range(total):
        t = max(order, key=lambda t: (len(by_type[t]) * (i + 1) / total - taken[t],
                                      -order.index(t)))
        out.append(by_type[t][taken[t]])
        taken[t] += 1
    return out


def capacity_need(problem: PlanningProblem, shapes: Mapping[str, Sequence[SlotShape]],
                  scale: float) -> dict[str, dict[str, float]]:
    """Per LLM and GPU type, the fewest GPU units that carry its load at ``scale`` with one of
    its shapes on that type (whole replicas, :func:`scepsy_opt.planning.milp.unit_needs`):
    what :func:`partition` balances. A shape runs at least its ``least`` replicas (those its
    LLM's latency bound needs), and one that meets the bound at no count is left out."""
    need, row, types = _need_matrix(problem, shapes)
    f = need(scale)
    return {m: {t: float(f[row[m], j]) for j, t in enumerate(types) if math.isfinite(f[row[m], j])}
            for m in shapes}


def tied(problem: PlanningProblem) -> list[tuple[str, ...]]:
    """``problem``'s LLMs in groups that its workflows tie together (an LLM with every LLM a
    workflow calls beside it, transitively), each sorted, the groups in order of their first
    LLM: what must share a part for the parts' plans to add up (:func:`separable`)."""
    root = {m: m for m in problem.llms}

    def find(m: str) -> str:
        while root[m] != m:
            root[m] = root[root[m]]
            m = root[m]
        return m
    for w in problem.targets:
        called = sorted(problem.stats[w].llms)
        for m in called[1:]:
            a, b = find(called[0]), find(m)
            if a != b:
                root[max(a, b)] = min(a, b)
    groups: dict[str, list[str]] = {}
    for m in problem.llms:
        groups.setdefault(find(m), []).append(m)
    return [tuple(sorted(g)) for _, g in sorted(groups.items())]


def type_assignment(topology: Topology, groups: Sequence[tuple[str, ...]],
                    need: Mapping[str, Mapping[str, float]]) -> dict[str, str]:
    """Every LLM of ``groups`` (:func:`tied`) to one GPU type of ``topology``, a group's LLMs
    to the same one, so that the most filled type is as little filled as it can be made: a
    group's *fill* on a type is its need there (``need``, :func:`capacity_need`) over the
    type's GPU units. Of two rules, the one whose largest fill is least (the first on a tie):

    1. *the relaxation, rounded* (:func:`_relaxed_assignment`): the LP that splits groups
       across types freely at the least largest fill (a lower bound on every assignment's),
       each group then whole on the type the LP gives most of it, and the groups the LP split
       (a vertex splits at most one fewer than the types) dealt largest first as rule 2 deals;
       then single moves off the most filled type while one lowers the largest fill.
       It gives each group the type it is relatively cheapest on where the types differ
       (their comparative advantage), which the greedy rule does not see;
    2. *longest processing time first*: the groups largest least fill first (then by name),
       each to the type that keeps the largest fill over all types least (then its own fill
       on that type, then the type's name).

    Deterministic. Empty when a group fits no type (its need is infinite on every type)."""
    types = sorted({n.gpu for n in topology.nodes})
    units = {t: sum(n.gpus for n in topology.nodes if n.gpu == t) * UNITS for t in types}
    share = {g: {t: sum(need[m].get(t, math.inf) for m in g) / units[t] for t in types}
             for g in groups}
    if any(not any(math.isfinite(v) for v in share[g].values()) for g in groups):
        return {}
    greedy = _greedy_types(types, groups, share, dict.fromkeys(types, 0.0))
    relaxed = _relaxed_assignment(types, groups, share)
    best = min((x for x in (relaxed, greedy) if x is not None),
               key=lambda x: max(_fill(types, share, x).values()))
    return {m: best[g] for g in groups for m in g}


def _fill(types: Sequence[str], share: Mapping[tuple[str, ...], Mapping[str, float]],
          assign: Mapping[tuple[str, ...], str]) -> dict[str, float]:
    fill = dict.fromkeys(types, 0.0)
    for g, t in assign.items():
        fill[t] += share[g][t]
    return fill


def _greedy_types(types: Sequence[str], groups: Sequence[tuple[str, ...]],
                  share: Mapping[tuple[str, ...], Mapping[str, float]],
                  fill: dict[str, float]) -> dict[tuple[str, ...], str]:
    """Longest processing time first (:func:`type_assignment`'s rule 2) from ``fill``."""
    out: dict[tuple[str, ...], str] = {}
    for g in sorted(groups, key=lambda g: (-min(share[g].values()), g)):
        fits = [t for t in types if math.isfinite(share[g][t])]
        t = min(fits, key=lambda t: (max([fill[t] + share[g][t]]
                                          + [fill[x] for x in types if x != t]),
                                     fill[t] + share[g][t], t))
        fill[t] += share[g][t]
        out[g] = t
    return out


def _relaxed_assignment(types: Sequence[str], groups: Sequence[tuple[str, ...]],
                        share: Mapping[tuple[str, ...], Mapping[str, float]],
                        ) -> dict[tuple[str, ...], str] | None:
    """:func:`type_assignment`'s rule 1: ``min z`` s.t. ``Σ_g share_gt·y_gt ≤ z`` per type,
    ``Σ_t y_gt = 1``, ``y ≥ 0`` (HiGHS' dual simplex, which ends at a vertex), rounded. None
    when the LP does not solve."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    cols = [(i, j) for i, g in enumerate(groups) for j, t in enumerate(types)
            if math.isfinite(share[g][t])]
    n = len(cols)
    if n == 0:
        return None
    ii = np.array([c[0] for c in cols], dtype=np.int64)
    jj = np.array([c[1] for c in cols], dtype=np.int64)
    vals = np.array([share[groups[i]][types[j]] for i, j in cols], dtype=float)
    # variables: y (n), then z; rows: per type Σ share·y - z <= 0
    a_ub = coo_matrix((np.concatenate([vals, -np.ones(len(types))]),
                       (np.concatenate([jj, np.arange(len(types))]),
                        np.concatenate([np.arange(n), np.full(len(types), n)]))),
                      shape=(len(types), n + 1))
    a_eq = coo_matrix((np.ones(n), (ii, np.arange(n))), shape=(len(groups), n + 1))
    cost = np.zeros(n + 1)
    cost[n] = 1.0
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(len(types)), A_eq=a_eq,
                  b_eq=np.ones(len(groups)), bounds=(0, None), method="highs-ds")
    if res.status != 0:
        return None
    y = res.x[:n]
    whole: dict[tuple[str, ...], str] = {}
    split: list[tuple[str, ...]] = []
    top: dict[int, tuple[float, int]] = {}
    for k, (i, j) in enumerate(cols):
        if i not in top or y[k] > top[i][0]:
            top[i] = (y[k], j)
    for i, g in enumerate(groups):
        frac, j = top[i]
        if frac >= 1 - 1e-9:
            whole[g] = types[j]
        else:
            split.append(g)
    return _improved(types, share, {**whole, **_greedy_types(types, split, share,
                                                            _fill(types, share, whole))})


def _improved(types: Sequence[str], share: Mapping[tuple[str, ...], Mapping[str, float]],
              assign: dict[tuple[str, ...], str]) -> dict[tuple[str, ...], str]:
    """``assign`` after single moves, each of the group of the most filled type whose move
    to another type lowers the largest fill most (ties: the group, then the type by name),
    while one does (each move lowers it, so this ends)."""
    fill = _fill(types, share, assign)
    while True:
        worst = max(types, key=lambda t: (fill[t], t))
        now = fill[worst]
        best: tuple[float, tuple[str, ...], str] | None = None
        for g, t in sorted(assign.items()):
            if t != worst:
                continue
            for x in types:
                if x == worst or not math.isfinite(share[g][x]):
                    continue
                after = max([fill[worst] - share[g][worst], fill[x] + share[g][x]]
                            + [fill[y] for y in types if y not in (worst, x)])
                if after < now * (1 - 1e-12) and (best is None or after < best[0]):
                    best = (after, g, x)
        if best is None:
            return assign
        _, g, x = best
        fill[worst] -= share[g][worst]
        fill[x] += share[g][x]
        assign[g] = x


def typed_partition(problem: PlanningProblem, topology: Topology, part_llms: int = PART_LLMS,
                    need: Mapping[str, Mapping[str, float]] | None = None) -> list[Part]:
    """:func:`partition` with every part of one GPU type: the LLMs first to types
    (:func:`type_assignment` of their tied groups and ``need``), then each
    type's LLMs and nodes in parts of about ``part_llms`` LLMs (:func:`partition` of that type
    alone). A part's feasibility MILP then never chooses a GPU type per LLM, and it settles in
    a fraction of a mixed part's time; the bound over such plans is the bound over every plan
    on the measured instances (``scale_upper_bound(..., one_type=True)``, docs/benchmarks.md).
    :func:`partition` itself where the cluster has one GPU type, without ``need``, or when a
    group fits no type. A type no LLM is given keeps its nodes out of every part."""
    types = sorted({n.gpu for n in topology.nodes})
    assign = (type_assignment(topology, tied(problem), need)
              if need is not None and len(types) >= 2 else {})
    if not assign or need is None:
        return partition(problem, topology, part_llms, need)
    parts: list[Part] = []
    for t in types:
        llms = tuple(sorted(m for m, x in assign.items() if x == t))
        if not llms:
            continue
        nodes = tuple(n.name for n in topology.nodes if n.gpu == t)
        sub, sub_top = _sub(problem, topology, Part(llms, nodes, t))
        parts += [Part(q.llms, q.nodes, t) for q in partition(
            sub, sub_top, part_llms, {m: {t: need[m][t]} for m in llms})]
    return parts


def skewed(problem: PlanningProblem, topology: Topology, part_llms: int,
           need: Mapping[str, Mapping[str, float]],
           made: dict[int, list[Part]] | None = None) -> bool:
    """Whether :func:`plan_slot_scale` cuts the problem in parts of one GPU type
    (:func:`typed_partition`): the cluster has two GPU types or more and the parts of
    :func:`partition` are not all equal (equal parts are solved once and copied, which typed
    parts, whose types the assignment chooses LLM by LLM, would undo). ``made``: the
    partitions by part size (:func:`part_size`), the one of ``part_llms`` filled in."""
    if len({n.gpu for n in topology.nodes}) < 2:
        return False
    made = {} if made is None else made
    if part_llms not in made:
        made[part_llms] = partition(problem, topology, part_llms, need)
    plain = made[part_llms]
    return len(plain) > 1 and len({_signature(problem, topology, q) for q in plain}) > 1


def part_size(problem: PlanningProblem, topology: Topology, part_llms: int,
              need: Mapping[str, Mapping[str, float]], seconds: float,
              made: dict[int, list[Part]] | None = None,
              cut: Callable[..., list[Part]] | None = None, min_s: float = PART_MIN_S) -> int:
    """The LLMs per part of the first try of :func:`plan_slot_scale`: ``part_llms``, times
    :data:`LARGER_PARTS` as often as needed for each distinct part (:func:`_signature`) of
    :func:`partition` to get ``min_s`` of ``seconds`` (a feasibility probe costs a
    fixed tenth of a second or more whatever the part's size, so many small parts spend the
    time on overhead: 87 parts of 16 LLMs in 25 s left most parts without a solution).
    ``made``: the partitions by part size, filled in (each is made once); ``cut``: the
    partition (default :func:`partition`)."""
    made = {} if made is None else made
    cut = partition if cut is None else cut
    size = part_llms
    while size < len(problem.llms):
        if size not in made:
            made[size] = cut(problem, topology, size, need)
        parts = made[size]
        distinct = len({_signature(problem, topology, q) for q in parts})
        if len(parts) <= 1 or distinct * min_s <= seconds:
            break
        size *= LARGER_PARTS
    return size


def on_nodes(problem: PlanningProblem, topology: Topology) -> PlanningProblem:
    """``problem`` with ``topology``'s nodes as its cluster (:meth:`Topology.to_cluster`: the
    GPU budgets of candidate generation), e.g. the nodes a min-cost plan may buy."""
    cluster = replace(topology.to_cluster(problem.catalog), name=problem.cluster.name)
    return replace(problem, cluster=cluster)


def _sub(problem: PlanningProblem, topology: Topology, part: Part,
         ) -> tuple[PlanningProblem, Topology]:
    """``problem`` restricted to the part's LLMs (the workflows that call only them) and
    ``topology`` to its nodes."""
    return _subs(problem, topology, [part])[0]


def _subs(problem: PlanningProblem, topology: Topology, parts: Sequence[Part],
          ) -> list[tuple[PlanningProblem, Topology]]:
    """:func:`_sub` of every part, in one pass over the nodes and the workflows (linear in
    them, where one part at a time scans them all)."""
    where = {n.name: i for i, n in enumerate(topology.nodes)}
    owner: dict[str, set[int]] = {}
    for i, part in enumerate(parts):
        for m in part.llms:
            owner.setdefault(m, set()).add(i)
    targets: list[dict[str, float]] = [{} for _ in parts]
    for w, t in problem.targets.items():
        common: set[int] | None = None
        for m in problem.stats[w].llms:
            common = owner.get(m, set()) if common is None else common & owner.get(m, set())
        for i in range(len(parts)) if common is None else common:  # no LLM: every part's
            targets[i][w] = t
    out = []
    for i, part in enumerate(parts):
        sub_top = Topology(f"{topology.name}/part",
                           tuple(topology.nodes[j] for j in sorted(where[x] for x in part.nodes)))
        cluster = replace(sub_top.to_cluster(problem.catalog), name=problem.cluster.name)
        out.append((replace(problem, cluster=cluster, targets=MappingProxyType(targets[i])),
                    sub_top))
    return out


def separable(problem: PlanningProblem, parts: Sequence[Part]) -> bool:
    """Whether no workflow calls LLMs of two parts (then the parts' plans add up)."""
    where = {m: i for i, p in enumerate(parts) for m in p.llms}
    return all(len({where[m] for m in problem.stats[w].llms}) <= 1 for w in problem.targets)


def _signature(problem: PlanningProblem, topology: Topology, part: Part) -> tuple[Any, ...]:
    """What a part's slot problem depends on, without names: its LLMs' models and loads (in a
    fixed order) and its nodes (:func:`_node_signature`). Two parts of equal signature have the
    same solutions, up to the names of their LLMs."""
    llms = tuple((problem.models[m], round(problem.loads[m], 12))
                 for m in _ordered(problem, part))
    return llms, _node_signature(topology, part)


def _node_signature(topology: Topology, part: Part) -> tuple[Any, ...]:
    """A part's nodes without names: GPU type, size, NVLink domain and use of each."""
    return tuple(sorted((n.gpu, n.gpus, n.nvlink_domain, n.used)
                        for n in map(topology.node, part.nodes)))


def _ordered(problem: PlanningProblem, part: Part) -> list[str]:
    return sorted(part.llms, key=lambda m: (problem.models[m], problem.loads[m], m))


def _renamed(sol: SlotSolution, names: Mapping[str, str]) -> SlotSolution:
    """``sol`` with its LLMs renamed by ``names`` (old -> new)."""
    choice = {names[m]: replace(c, llm=names[m]) for m, c in sol.choice.items()}
    return replace(sol, choice=choice)


@dataclass(frozen=True)
class PartsResult:
    """The parts' solutions joined, the level every part reached, and how the search went:
    ``probes`` (feasibility solves), ``reused`` (parts that took an equal part's solution),
    ``timed_out`` (a probe was cut short by its time: the answer is not proven), ``solved``
    (parts with a solution: all of them when ``solution`` is set), ``cut`` (probes cut short,
    neither a solution nor a proof) and ``infeasible`` (probes proven to have no solution)."""

    solution: SlotSolution | None
    level: float
    probes: int
    reused: int
    timed_out: bool
    solved: int = 0
    cut: int = 0
    infeasible: int = 0
    pace: float = 0.0  # seconds per LLM and GPU type of the probes that found a solution (median)


Outcome = str  # a probe's: "found", "infeasible" (proven) or "time_limit" (cut short)


def solve_parts(problem: PlanningProblem, topology: Topology, parts: Sequence[Part], *,
                deadline: Deadline, shapes: Mapping[str, Sequence[SlotShape]],
                scale_ub: float, rel: float = LADDER_REL, floor: float = 0.0,
                target: float | None = None,
                gpu_cost: Mapping[str, float] | None = None) -> PartsResult:
    """The largest scale (on a ladder of steps ``rel·scale_ub``) at which every part has a slot
    solution on its own nodes, found with feasibility solves (:func:`solve_slot_scale` at a
    fixed scale: much faster than maximising the scale). A probe ends ``found``,
    ``infeasible`` (proven) or ``time_limit`` (cut short: no proof either way, counted in
    ``cut``, and the result is then ``timed_out``).

    1. *The first part* steps down from ``scale_ub`` (:data:`FIRST_STEP` below it, then twice
       the step after a proof that none exists, one :data:`FIRST_STEP` more after a probe cut
       short) until it has a solution, then bisects the bracket (a solution at ``s`` moves it
       to the scale it carries), within its budget: its share of the time by size, with
       :data:`FIRST_PROBES` shares, at most :data:`FIRST_SHARE` of it when others follow.
    2. *A plan in hand*: each next distinct part (the first of its signature,
       :func:`_signature`; an equal part reuses its solution, renamed) is asked once a safe
       way (:data:`SAFE_BELOW`) below what the first part carries, with half its budget (its
       share of the time left by size); without a solution, :data:`RESCUE_STEP` lower, then
       twice as far, ..., each with half the budget left, and twice the least time after a
       probe cut short. A part that had to go lower lowers where the next ones are asked.
    3. *Catching up*: with the time left, the part of the least scale (the plan's) bisects
       between its scale and the lowest scale it failed at (or the first part's scale); a
       bracket closed by a probe cut short is tried once more at its top with half the time
       left; a bracket closed by a proof ends the search.

    A part's size is its LLMs times its GPU types (what a probe's time grows with); a probe
    gets at least what probes that found a solution took per unit of size (``least``). The
    parts' solutions are joined (their groups lie on disjoint nodes) at the least scale of any
    part. No solution when a part has none above ``floor`` (a scale already carried);
    ``solved`` then says how many parts had one.

    With a ``target`` (a scale that is enough: min-cost asks whether some nodes carry the
    targets, :func:`scepsy_place.formulations.loop._min_cost_by_scale`) every distinct part is
    asked at the target only, in rounds: each part still without a solution gets its share of
    the time left by size, those cut short go again in the next round with what is left; a
    part proven to have no solution there ends the search with none (lower scales would not
    do). With ``gpu_cost`` too, each part's solution at the target is one whose groups' GPUs
    cost the least (within :data:`TARGET_GAP_REL`, or the best its probe found in its time)."""
    counts = {"probes": 0, "found": 0, "infeasible": 0, "time_limit": 0}
    subs = _subs(problem, topology, parts) if len(parts) > 1 else [(problem, topology)]
    keys = [_signature(problem, topology, p) for p in parts]
    # a part's work: its LLMs times its GPU types (each LLM has shapes on each type), what a
    # probe's time grows with (measured: a part of 35 LLMs on 191 H100 nodes 0.15 s, of 51
    # on 88 nodes of both types 0.5-1 s, of 167 on 512 H100 nodes 1.5-6 s)
    gpu_of = {n.name: n.gpu for n in topology.nodes}
    size = [len(p.llms) * max(1, len({gpu_of[x] for x in p.nodes})) for p in parts]
    first_of: dict[tuple[Any, ...], int] = {}
    for i, k in enumerate(keys):
        first_of.setdefault(k, i)
    distinct = sorted(set(first_of.values()))
    # per part, the size of the distinct parts after it (those that will need probes)
    after = [0] * (len(parts) + 1)
    for i in range(len(parts) - 1, -1, -1):
        after[i] = after[i + 1] + (size[i] if first_of[keys[i]] == i else 0)
    paces: list[float] = []  # seconds per unit of size of the probes that found a solution
    best: dict[int, SlotSolution] = {}  # per distinct part, its solution of the largest scale
    ceiling: dict[int, float] = {}  # per behind part, the least scale it failed at

    def least(i: int) -> float:
        """The least time a probe of part ``i`` gets: what probes that found a solution took
        per unit of size so far (:data:`PROBE_S_PER_SIZE` before the first), times
        :data:`PROBE_MARGIN` (at least :data:`PROBE_MIN_S`), never past the deadline."""
        pace = _median(paces) if paces else PROBE_S_PER_SIZE
        return min(max(PROBE_MIN_S, PROBE_MARGIN * pace * size[i]), deadline.remaining())

    def probe(i: int, at: float, share: float) -> tuple[SlotSolution | None, Outcome]:
        """Part ``i`` at scale ``at`` within ``share`` seconds (at least :func:`least`): a
        solution, or None and whether none exists (proven) or the probe was cut short."""
        share = max(share, least(i))
        if share <= 0 or deadline.remaining() <= 0:
            counts["time_limit"] += 1
            return None, "time_limit"
        counts["probes"] += 1
        sub, sub_top = subs[i]
        t = time.perf_counter()
        sol = solve_slot_scale(sub, sub_top, deadline=deadline, time_limit_s=share,
                               shapes={m: shapes[m] for m in parts[i].llms}, at_scale=at,
                               gpu_cost=gpu_cost, gap_rel=TARGET_GAP_REL)
        outcome = "found" if sol.choice else (
            "infeasible" if sol.status == "infeasible" else "time_limit")
        if sol.choice:
            paces.append((time.perf_counter() - t) / size[i])
        counts[outcome] += 1
        return (sol if sol.choice else None), outcome

    def ask(i: int, at: float, share: float, within: Deadline,
            ) -> tuple[SlotSolution | None, Outcome]:
        """:func:`probe`; cut short, once more with :data:`RETRY_BOOST` times the time (at
        most what is left of ``within``, at least :func:`least`)."""
        sol, outcome = probe(i, at, share)
        if outcome == "time_limit" and within.remaining() > 0:
            sol, outcome = probe(i, at, min(RETRY_BOOST * max(share, least(i)),
                                            within.remaining()))
        return sol, outcome

    def keep(i: int, sol: SlotSolution | None) -> None:
        if sol is not None and (i not in best or sol.scale > best[i].scale):
            best[i] = sol

    if target is not None:
        pending = list(distinct)
        while pending and deadline.remaining() > 0:
            cut_short = []
            for n, i in enumerate(pending):  # a share of the time left by size, per round
                left = sum(size[j] for j in pending[n:])
                sol, outcome = probe(i, target, deadline.remaining() * size[i] / left)
                keep(i, sol)
                if outcome == "infeasible":  # proven: no plan of these parts carries it
                    return _parts_result(problem, parts, keys, first_of, best, counts, floor,
                                         _median(paces))
                if sol is None:
                    cut_short.append(i)
            pending = cut_short
        return _parts_result(problem, parts, keys, first_of, best, counts, floor,
                             _median(paces))
    target = safe = scale_ub
    for n, i in enumerate(distinct):
        if n == 0:  # down from the bound, then bisect the bracket, within the first's budget
            mine = deadline.within(deadline.remaining() * min(
                FIRST_SHARE, FIRST_PROBES * size[i] / (FIRST_PROBES * size[i] + after[i + 1]))
                    if after[i + 1] else deadline.remaining())
            made = 0
            lo, hi, step = floor, scale_ub, FIRST_STEP
            last = scale_ub
            while hi - lo > rel * scale_ub and mine.remaining() > 0:
                at = scale_ub * (1 - step) if i not in best and step < 1 else (lo + hi) / 2
                sol, outcome = probe(i, at, mine.remaining() / max(2, FIRST_PROBES - made))
                made, last = made + 1, at
                keep(i, sol)
                if sol is not None:
                    lo = max(at, min(sol.scale, hi))
                else:  # the bracket's top: proven, or (cut short) for now, until catching up
                    hi = at
                # twice the step after a proof that none exists; after a probe cut short (no
                # proof) one FIRST_STEP more only
                step = 2 * step if outcome == "infeasible" else step + FIRST_STEP
            ceiling[i] = hi
        else:  # a plan in hand: one probe a safe way below the first part's scale, with
            # half the part's budget (its share of the time left, by size)
            mine = deadline.within(deadline.remaining() * size[i] / after[i])
            last = safe
            sol, _ = probe(i, last, mine.remaining() / 2)
            keep(i, sol)
            ceiling[i] = target
        drop, more = RESCUE_STEP, 1.0
        while i not in best and deadline.remaining() > 0 and last * (1 - drop) > floor:
            # no solution yet: further down, each with half the budget left, at least least(i)
            # and twice as much after each probe cut short (its time, not its scale, was short)
            ceiling[i], last = last, last * (1 - drop)
            drop = min(2 * drop, 0.5)
            sol, outcome = probe(i, last, max(mine.remaining() / 2, more * least(i)))
            more = 2 * more if outcome == "time_limit" else more
            keep(i, sol)
        if i not in best or best[i].scale <= floor:
            return _parts_result(problem, parts, keys, first_of, best, counts, floor,
                                 _median(paces))
        if n == 0:  # the others' target: what the first carries, asked a safe way below
            target = best[i].scale
            safe = target * (1 - SAFE_BELOW)
        else:  # a part that needed a lower scale lowers where the next ones are asked
            safe = min(safe, last)
    # catching up, while time is left: the part of the least scale (the plan's), bisecting
    # between its scale and the least scale it failed at (or the target); a bracket closed by
    # a probe cut short (no proof) is tried once more at its top with half the time left
    top = dict(ceiling)
    proven: set[int] = set()
    again: set[int] = set()
    while ceiling and deadline.remaining() > 0:
        i = min(ceiling, key=lambda j: (best[j].scale, j))
        lo, hi = best[i].scale, ceiling[i]
        if hi - lo <= rel * scale_ub:
            if i in proven or i in again:
                break  # the plan's bottleneck is as far as it goes
            again.add(i)
            sol, outcome = probe(i, hi, deadline.remaining() / 2)
            keep(i, sol)
            if sol is not None:
                ceiling[i] = max(top[i], best[i].scale)
            elif outcome == "infeasible":
                proven.add(i)
            continue
        mid = (lo + hi) / 2
        sol, outcome = ask(i, mid, deadline.remaining() / (1 + len(ceiling)), deadline)
        keep(i, sol)
        if sol is None:
            ceiling[i] = mid
            proven.discard(i)
            if outcome == "infeasible":
                proven.add(i)
    return _parts_result(problem, parts, keys, first_of, best, counts, floor, _median(paces))


REBALANCE_REL = 0.002  # the rebalanced parts' scale is searched to this, relative to the bound
REBALANCE_MIN = 0.002  # ... and kept only when it raises the parts' least bound this much
REBALANCE_MAX_PARTS = 8  # ... and only for this few parts (measured, Zipf, docs/benchmarks.md:
# 256 / 512's five parts of 64 LLMs 1.1464 -> 1.1686; 4,096 / 65,536's 73 parts, whose probes
# stay far below the parts' bounds anyway: 69% and 78% gaps rebalanced, 30-60% not)


def _need_matrix(problem: PlanningProblem, shapes: Mapping[str, Sequence[SlotShape]],
                 ) -> tuple[Callable[[float], np.ndarray], dict[str, int], list[str]]:
    """:func:`capacity_need` as a function of the scale: the units matrix (LLMs in sorted order
    by GPU types), each LLM's row and the types."""
    usable = {m: [sh for sh in v if sh.meets] for m, v in shapes.items()}
    types = sorted({sh.gpu for v in usable.values() for sh in v})
    f = unit_needs(problem, as_capacity_shapes(usable), types,
                   {m: [sh.least for sh in v] for m, v in usable.items()})
    return f, {m: i for i, m in enumerate(sorted(shapes))}, types


def _part_types(topology: Topology, parts: Sequence[Part]) -> list[str | None]:
    """Per part, the one GPU type of its nodes (None for a part of several)."""
    out: list[str | None] = []
    for p in parts:
        kinds = {topology.node(x).gpu for x in p.nodes}
        out.append(next(iter(kinds)) if len(kinds) == 1 else None)
    return out


def _part_units(topology: Topology, part: Part) -> float:
    """A part's wholly free GPUs, in units of a share."""
    return float(UNITS * sum(n.gpus - n.busy_gpus() for n in map(topology.node, part.nodes)))


def rebalanced(problem: PlanningProblem, topology: Topology, parts: Sequence[Part],
               shapes: Mapping[str, Sequence[SlotShape]], scale_ub: float,
               target: float | None = None) -> list[Part]:
    """``parts`` with LLMs moved between parts of the same GPU type so that the least of the
    parts' own bounds (:func:`~scepsy_opt.planning.milp.scale_upper_bound` on a part's LLMs
    and nodes: the largest scale at which its LLMs' whole replicas fit its units) is as high
    as moves find: parts balanced by their
    need at the bound can still differ there, since whole replicas make each LLM's need a
    step function of the scale (on Zipf 256 / 512 one part's own bound was 1.1686 where the
    others' were 1.21 to 1.23 and the whole problem's 1.2223).

    The scale is bisected between the parts' least bound and ``scale_ub`` (to
    :data:`REBALANCE_REL`); at each scale the LLMs of the parts over their units there move
    (:func:`_refit`: the groups a workflow ties, :func:`tied`, as one). The new parts are
    kept only when their least bound is :data:`REBALANCE_MIN` higher. With a ``target`` (a
    scale that is enough) the parts are moved only when one cannot carry the target, and only
    to where every part can. Parts of several GPU types, and the LLMs tied to them, stay as
    they are, and so do parts a workflow spans (:func:`separable`; the search plans those as
    one part). Deterministic."""
    kind = _part_types(topology, parts)
    if len(parts) < 2 or not any(kind) or not separable(problem, parts):
        return list(parts)
    f, row, types = _need_matrix(problem, shapes)
    cap = np.array([_part_units(topology, p) for p in parts], dtype=float)
    typed = np.array([k is not None for k in kind], dtype=bool)
    where = {m: i for i, p in enumerate(parts) for m in p.llms}
    groups = [g for g in tied(problem) if all(m in where for m in g)]
    home = np.array([where[g[0]] for g in groups], dtype=np.int64)
    movable = np.array([kind[h] is not None for h in home], dtype=bool)
    of_group = np.array([n for n, g in enumerate(groups) for _ in g], dtype=np.int64)
    of_row = np.array([row[m] for g in groups for m in g], dtype=np.int64)
    # per part, its type's column (a last column of inf for a part of several types)
    pick = np.array([types.index(k) if k in types else len(types) for k in kind],
                    dtype=np.int64)

    def sizes(scale: float) -> np.ndarray:  # per group, its units on each part's type
        per_type = np.zeros((len(groups), len(types) + 1))
        per_type[:, -1] = np.inf
        np.add.at(per_type[:, :-1], of_group, f(scale)[of_row])
        return per_type[:, pick]

    def over(at: np.ndarray, scale: float) -> np.ndarray:
        sz = sizes(scale)
        load = np.zeros(len(parts))
        np.add.at(load, at, sz[np.arange(len(groups)), at])
        return np.where(typed, load - cap, 0.0)

    def least(at: np.ndarray) -> float:  # the parts' least own bound, to REBALANCE_REL
        if np.all(over(at, scale_ub) <= 1e-9):
            return scale_ub
        lo, hi = 0.0, scale_ub
        while hi - lo > REBALANCE_REL * scale_ub:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if np.all(over(at, mid) <= 1e-9) else (lo, mid)
        return lo
    if target is not None:
        if np.all(over(home, target) <= 1e-9):
            return list(parts)
        moved = _refit(sizes(target), cap, home, movable, kind)
        return list(parts) if moved is None else _moved(parts, groups, moved)
    start = least(home)
    best, at = start, home
    lo, hi = start, scale_ub
    while hi - lo > REBALANCE_REL * scale_ub:
        mid = (lo + hi) / 2
        moved = _refit(sizes(mid), cap, at, movable, kind)
        if moved is None:
            hi = mid
        else:
            at, lo = moved, mid
            best = max(best, least(moved))
            lo = max(lo, best)
    if best < start * (1 + REBALANCE_MIN):
        return list(parts)
    return _moved(parts, groups, at)


def _refit(sizes: np.ndarray, cap: np.ndarray, start: np.ndarray, movable: np.ndarray,
           kind: Sequence[str | None]) -> np.ndarray | None:
    """Groups (rows of ``sizes``: their units on each part's type) from ``start`` (a part per
    group) to parts of the same type, so that no part of one type (``kind``) holds more than
    its ``cap``: while one does, the part furthest over gives a ``movable`` group to the part
    of that type with the most room (the smallest group that ends the excess, else the
    largest that fits anywhere), or, when none fits, swaps one for a smaller group of
    another part that takes the difference (the swap that ends or cuts the excess most).
    Each step lowers the parts' total excess, so it ends; None when a part stays over."""
    at = start.copy()
    g = np.arange(len(at))
    load = np.zeros(len(cap))
    np.add.at(load, at, sizes[g, at])
    typed = np.array([k is not None for k in kind], dtype=bool)
    same = np.array([[a is not None and a == b for b in kind] for a in kind], dtype=bool)
    for _ in range(4 * len(at) + 16):
        excess = np.where(typed, load - cap, -np.inf)
        b = int(excess.argmax())
        ex = float(excess[b])
        if ex <= 1e-9:
            return at
        mine = np.flatnonzero((at == b) & movable)
        room = cap - load
        others = np.flatnonzero(same[b] & (np.arange(len(cap)) != b))
        if len(mine) == 0 or len(others) == 0:
            return None
        step: tuple[Any, ...] | None = None
        # a move: the part of the most room that takes the group (the first of equals)
        dest = others[np.argsort(-room[others], kind="stable")]
        for i in mine if len(mine) > 1 else ():  # a part keeps one group at least
            fit = dest[room[dest] >= sizes[i, dest] - 1e-9]
            if len(fit) == 0 or sizes[i, b] <= 0:
                continue
            key = ((0, sizes[i, b], int(i)) if sizes[i, b] >= ex - 1e-9
                   else (1, -sizes[i, b], int(i)))
            if step is None or key < step[0]:
                step = (key, int(i), int(fit[0]), None)
        if step is None:  # a swap with a smaller group of a part that takes the difference
            theirs = np.flatnonzero(np.isin(at, others) & movable)
            for i in mine:
                d = sizes[i, b] - sizes[theirs, b]  # what part b sheds
                c = at[theirs]
                ok = (d > 1e-9) & (room[c] >= sizes[i, c] - sizes[theirs, c] - 1e-9)
                if not ok.any():
                    continue
                k = np.flatnonzero(ok)
                ends = d[k] >= ex - 1e-9
                j = int(k[ends][d[k][ends].argmin()]) if ends.any() else int(k[d[k].argmax()])
                key = ((0, float(d[j]), int(i)) if d[j] >= ex - 1e-9
                       else (1, -float(d[j]), int(i)))
                if step is None or key < step[0]:
                    step = (key, int(i), int(c[j]), int(theirs[j]))
        if step is None:
            return None
        _, i, c, j = step
        load[b] -= sizes[i, b]
        load[c] += sizes[i, c]
        at[i] = c
        if j is not None:
            load[c] -= sizes[j, c]
            load[b] += sizes[j, b]
            at[j] = b
    return None


def _moved(parts: Sequence[Part], groups: Sequence[tuple[str, ...]],
           at: np.ndarray) -> list[Part]:
    """``parts`` with each group's LLMs in its part of ``at`` (nodes and types kept)."""
    members: list[list[str]] = [[] for _ in parts]
    for g, i in zip(groups, at, strict=True):
        members[int(i)].extend(g)
    return [replace(p, llms=tuple(sorted(members[i]))) for i, p in enumerate(parts)]


def _median(xs: Sequence[float]) -> float:
    """The middle value of ``xs`` (the upper of two; 0 for none)."""
    return sorted(xs)[len(xs) // 2] if xs else 0.0


def _parts_result(problem: PlanningProblem, parts: Sequence[Part], keys: Sequence[Any],
                  first_of: Mapping[Any, int], best: Mapping[int, SlotSolution],
                  counts: Mapping[str, int], floor: float, pace: float) -> PartsResult:
    """The parts' solutions joined (an equal part's renamed), or none when a part has none
    above ``floor``."""
    found: list[SlotSolution] = []
    reused = 0
    for i, part in enumerate(parts):
        j = first_of[keys[i]]
        if j not in best:
            continue
        if i == j:
            found.append(best[j])
            continue
        names = dict(zip(_ordered(problem, parts[j]), _ordered(problem, part), strict=True))
        found.append(_renamed(best[j], names))
        reused += 1
    timed = counts["time_limit"] > 0
    solved = len(found)
    if solved < len(parts) or any(sol.scale <= floor for sol in found):
        return PartsResult(None, 0.0, counts["probes"], reused, timed, solved,
                           counts["time_limit"], counts["infeasible"], pace)
    joined = _join(problem, found, "time_limit" if timed else "optimal")
    return PartsResult(joined, joined.scale, counts["probes"], reused, timed, solved,
                       counts["time_limit"], counts["infeasible"], pace)


def _join(problem: PlanningProblem, solutions: Sequence[SlotSolution], status: str,
          ) -> SlotSolution:
    """The parts' solutions as one (their groups lie on disjoint nodes, so their union is laid
    out like one solution), with the scale its replicas carry."""
    choice: dict[str, Candidate] = {}
    groups: dict[tuple[str, int], list[tuple[tuple[int, ...], int]]] = {}
    passed: dict[tuple[str, int, int], int] = {}
    for sol in solutions:
        choice.update(sol.choice)
        for key, gs in sol.groups.items():
            groups.setdefault(key, []).extend(gs)
        for key3, k in sol.passed.items():
            passed[key3] = passed.get(key3, 0) + k
    scale = min(headroom(problem, choice).values()) if choice else 0.0
    return SlotSolution(choice, {k: tuple(v) for k, v in groups.items()}, passed, scale,
                        status, math.inf)




def _tries(problem: PlanningProblem, topology: Topology, part_llms: int,
           need: Mapping[str, Mapping[str, float]], until: Deadline, typed: bool,
           made: dict[int, list[Part]], larger_first: bool = True,
           min_s: float = PART_MIN_S) -> list[list[Part]]:
    """:func:`plan_slot_scale`'s partitions, in the order they are searched: parts of
    :func:`part_size` LLMs, then of :data:`LARGER_PARTS` times that (one try when both make
    as many parts), the larger first when heavy LLMs (parts of one GPU type) make them
    few (unless not ``larger_first``), and then the larger parts still whose probes settle
    in seconds (:func:`_largest_quick`) before them; ``typed``: :func:`typed_partition`, otherwise
    :func:`partition`. A partition that a
    workflow spans is the whole problem in one part. ``made``: that cut's partitions by part
    size, filled in; ``min_s``: what each distinct part should get (:func:`part_size`)."""
    cut = typed_partition if typed else partition
    base = part_size(problem, topology, part_llms, need, until.remaining(), made, cut, min_s)
    tries = [made[size] if size in made else cut(problem, topology, size, need)
             for size in (base, LARGER_PARTS * base)]
    tries = [t if len(t) == 1 or separable(problem, t) else
             partition(problem, topology, len(problem.llms)) for t in tries]
    if len(tries[1]) == len(tries[0]):
        return tries[:1]
    if (larger_first and base == part_llms and any(q.gpu for q in tries[0])
            and len(tries[1]) <= LARGER_FIRST_MAX_PARTS):
        tries.reverse()
        whole = _largest_quick(problem, topology, LARGER_PARTS * base, need, made, cut)
        if whole is not None and len(whole) < len(tries[0]):
            tries.insert(0, whole)
    return tries


def _largest_quick(problem: PlanningProblem, topology: Topology, size: int,
                   need: Mapping[str, Mapping[str, float]], made: dict[int, list[Part]],
                   cut: Callable[..., list[Part]]) -> list[Part] | None:
    """The partition of the largest parts (``size`` times :data:`LARGER_PARTS`, again and
    again, up to every LLM) whose every part has at most :data:`QUICK_PART_NODES` nodes and
    :data:`QUICK_PART_LLMS` LLMs, where a feasibility probe settles in seconds; None when no
    larger one does. A size whose parts would hold more than :data:`QUICK_PART_NODES` nodes
    on average (the nodes in proportion to the LLMs, per GPU type) is not partitioned at
    all. ``made``: the partitions by part size, filled in."""
    found = None
    types = max(1, len({n.gpu for n in topology.nodes}))
    while size < len(problem.llms):
        size *= LARGER_PARTS
        # a part of its type's share of the nodes: more than QUICK_PART_NODES on average
        # already (not worth partitioning 4,096 LLMs to learn it)
        if len(topology.nodes) * min(1.0, size / len(problem.llms)) / types > QUICK_PART_NODES:
            break
        if size not in made:
            made[size] = cut(problem, topology, size, need)
        parts = made[size]
        if any(len(q.nodes) > QUICK_PART_NODES or len(q.llms) > QUICK_PART_LLMS
               for q in parts):
            break
        found = parts
    return found


def plan_slot_scale(problem: PlanningProblem, topology: Topology, *, deadline: Deadline,
                    part_llms: int = PART_LLMS, target: float | None = None,
                    gpu_cost: Mapping[str, float] | None = None,
                    bounded: bool = False,
                    shapes: Mapping[str, Sequence[SlotShape]] | None = None) -> PlacedPlan:
    """Max-throughput placed by construction: the largest scale of the targets that slot groups
    carry (:func:`solve_slot_scale`; in parts of about ``part_llms`` LLMs when the workflows
    allow it, :func:`partition`, each part of one GPU type, :func:`typed_partition`, where the
    parts differ (:func:`skewed`), then of :data:`LARGER_PARTS` times that while the gap is over
    :data:`WIDE_GAP`, the larger first when a heavy LLM skews the load), laid out
    (:func:`layout`) and priced at that scale. ``plan.stats`` carries ``scale_bound`` (a proven
    upper bound on the scale of every allocation, :func:`scepsy_opt.planning.milp.scale_upper_bound`),
    ``scale_gap`` (``scale_bound / scale − 1``), ``parts``, ``probes`` (feasibility solves) and
    ``reused`` (parts that took an equal part's solution). The plan's status is ``optimal`` only
    when the scale meets its bound (within :data:`PROVEN_SCALE_GAP`), ``time_limit`` when a
    solve was cut short by the deadline, ``heuristic`` otherwise (the gap says how far it may
    be); the result is ``time_limit`` when the deadline passed before every part had a
    solution. With a ``target`` scale (:func:`solve_parts`) the search only asks whether the
    parts carry it: the first partition whose parts all do is the answer (its scale at least
    the target), and none carries it otherwise (``unplaced``, or ``time_limit`` when a probe
    was cut short); with ``gpu_cost`` (per GPU type) each part's solution at the target is one
    whose GPUs cost the least (:func:`solve_parts`). ``bounded``: each LLM runs at least the
    replicas that keep it within its workflows' mean latency bounds at the targets
    (:func:`slot_shapes`; meant with ``target`` 1, every bounded workflow calling one LLM);
    ``shapes``: those slot shapes, when the caller has them already."""
    t0 = time.perf_counter()
    try:
        shp = shapes if shapes is not None else slot_shapes(problem, deadline, bounded=bounded)
    except TimeLimitReached:
        return timed_out(deadline, "milp", 1, (), POLICY, False)
    try:
        bound = scale_upper_bound(problem, as_capacity_shapes(shp), deadline=deadline)
    except TimeLimitReached:
        return timed_out(deadline, "milp", 1, (), POLICY, False)
    if not math.isfinite(bound) or not bound > 0:
        plan = no_allocation_plan(optimiser="milp", status="infeasible", candidates={},
                                  stats={"scale_bound": None}, infeasible=None, scale=0.0)
        return PlacedPlan(plan=plan, placement=None, rounds=1, history=(), quality=None,
                          reason="no scale of the targets is carried", exact=False,
                          formulation=POLICY, status="unplaced")
    if target is not None and bound < target:  # proven: no allocation carries the target
        plan = no_allocation_plan(optimiser="milp", status="infeasible", candidates={},
                                  stats={"scale_bound": bound}, infeasible=None, scale=0.0)
        return PlacedPlan(plan=plan, placement=None, rounds=1, history=(), quality=None,
                          reason=f"no allocation carries {target:g} of the targets (the bound "
                          f"is {bound:.4g})", exact=True, formulation=POLICY, status="unplaced")
    need = capacity_need(problem, shp, bound)
    until = deadline.within(deadline.remaining() - max(
        RESERVE * deadline.remaining(), TAIL_S_PER_LLM * len(problem.llms)))
    found: PartsResult | None = None
    parts: list[Part] = []
    # parts of ``part_llms`` first (quick; copies of one problem stop there), then, while the
    # gap is wide and time is left, larger parts (more ways for LLMs to share GPUs); the larger
    # scale wins. With heavy LLMs (a skewed popularity) the larger parts go first when they
    # are few (each of their probes takes seconds).
    # parts of one GPU type where the parts differ anyway (a skewed popularity): their
    # feasibility MILPs settle far sooner than those of parts of both types; then, with the
    # time left and a wide gap, the mixed parts' tries, never paced out by the typed ones
    plain: dict[int, list[Part]] = {}  # the mixed partitions by part size, each made once
    typed = skewed(problem, topology, part_llms, need, plain)
    # a target is asked of the quicker, smaller parts first, one probe each
    min_s = PART_MIN_S if target is None else TARGET_PART_MIN_S
    tries = _tries(problem, topology, part_llms, need, until, typed, {} if typed else plain,
                   larger_first=target is None, min_s=min_s)
    last = len(tries)
    if typed:
        tries += _tries(problem, topology, part_llms, need, until, False, plain,
                        larger_first=target is None, min_s=min_s)
    first = (until.within(LARGER_FIRST_SHARE * until.remaining())
             if last > 1 and len(tries[0]) < len(tries[1]) else until)
    for j, these in enumerate(tries):
        if found is not None and (until.remaining() <= 0 or (
                found.solution is not None and (target is not None
                                                or bound / found.solution.scale - 1 <= WIDE_GAP))):
            break
        if j < last and found is not None and found.pace > 0 and FIRST_PROBES * found.pace * sum(
                len(q.llms) * len({topology.node(x).gpu for x in q.nodes})
                for q in {_signature(problem, topology, q): q for q in these}.values()
        ) > until.remaining():
            continue  # this try's probes would not fit in the time left (a later one's may)
        floor = found.solution.scale if found is not None and found.solution else 0.0
        # LLMs moved between parts of a type where whole replicas left a part's bound low,
        # when the parts are few enough for their probes to come near their own bounds
        if len(these) <= REBALANCE_MAX_PARTS:
            these = rebalanced(problem, topology, these, shp, bound, target)
        got = solve_parts(problem, topology, these, shapes=shp, scale_ub=bound,
                          deadline=first if j == 0 else until, floor=floor, target=target,
                          gpu_cost=gpu_cost)
        if found is None or got.solution is not None:
            timed = got.timed_out or (found is not None and found.timed_out)
            found, parts = replace(got, timed_out=timed), these
        else:
            found = replace(found, probes=found.probes + got.probes,
                            timed_out=found.timed_out or got.timed_out,
                            cut=found.cut + got.cut, infeasible=found.infeasible + got.infeasible)
    assert found is not None
    sol = found.solution
    if sol is None or not sol.choice or not sol.scale > 0:
        searched = {"scale_bound": bound if math.isfinite(bound) else None, "parts": len(parts),
                    "solved_parts": found.solved, "probes": found.probes,
                    "probes_cut": found.cut, "probes_infeasible": found.infeasible,
                    "total_s": time.perf_counter() - t0}
        if deadline.remaining() <= 0 or found.timed_out:  # cut short: nothing is proven
            return timed_out(deadline, "milp", 1, (), POLICY, False, stats=searched)
        why = "no slot groups of the free GPUs carry every LLM (not proven infeasible)"
        plan = no_allocation_plan(optimiser="milp", status="infeasible", candidates={},
                                  stats=searched, infeasible=None, scale=0.0)
        return PlacedPlan(plan=plan, placement=None, rounds=1, history=(), quality=None, reason=why,
                          exact=False, formulation=POLICY, status="unplaced")
    at = problem.scaled(sol.scale * (1 - 1e-9))
    alloc = plan_from_choice(at, "milp", "optimal", dict(sol.choice), {}).allocation
    assert alloc is not None
    placement = layout(topology, sol, demands(alloc, problem.catalog))
    gap = bound / sol.scale - 1 if math.isfinite(bound) else None
    status: Status = "optimal" if gap is not None and gap <= PROVEN_SCALE_GAP else (
        "time_limit" if found.timed_out else "heuristic")
    stats = {"scale_bound": bound, "scale_gap": gap, "parts": len(parts),
             "probes": found.probes, "reused": found.reused, "probes_cut": found.cut,
             "probes_infeasible": found.infeasible, "total_s": time.perf_counter() - t0}
    plan = plan_from_choice(at, "milp", status, price(at, alloc), stats, scale=sol.scale)
    entry = {"round": 1, "scale": sol.scale, "objective_s": plan.objective_s,
             "unplaced": len(placement.unplaced)}
    if not placement.complete:
        return PlacedPlan(plan=plan, placement=placement, rounds=1, history=(entry,), quality=None,
                          reason=f"{len(placement.unplaced)} replica(s) found no slot", exact=False,
                          formulation=POLICY,
                          status="unplaced")
    dem = demands(alloc, problem.catalog)
    return PlacedPlan(plan=plan, placement=placement, rounds=1, history=(entry,),
                      quality=quality(topology, placement, dem), reason=None,
                      exact=gap is not None and gap <= PROVEN_SCALE_GAP, formulation=POLICY)


# --------------------------------------------------------------------------- min-latency

def _demand_signature(problem: PlanningProblem, topology: Topology, part: Part,
                      ) -> tuple[Any, ...]:
    """:func:`_signature` for min-latency: the part's LLMs by what prices their candidates
    (model, the demand with the names left out, the weights of their workflows), in a fixed
    order, and its nodes."""
    def key(m: str) -> tuple[Any, ...]:
        d = problem.demands[m]
        # the workflows' weights in place of their names: a signature, not a demand to solve
        terms: Any = tuple((problem.weight(w), *rest) for w, *rest in d.terms)
        blank = replace(d, llm="", terms=terms)
        return (problem.models[m], blank)
    return tuple(key(m) for m in _ordered(problem, part)), _node_signature(topology, part)


def splits(problem: PlanningProblem, topology: Topology, part_llms: int = PART_LLMS) -> bool:
    """Whether slot groups would plan ``problem`` in more than one part (its LLMs dealt by load,
    :func:`partition`, and no workflow calling two parts): where min-latency in slot groups
    scales. In one part above a few dozen GPUs it is one MILP over every unpruned candidate."""
    parts = partition(problem, topology, part_llms)
    return len(parts) > 1 and separable(problem, parts)


def _carrying(problem: PlanningProblem, topology: Topology,
              shapes: Mapping[str, Sequence[SlotShape]], deadline: Deadline,
              time_limit_s: float) -> SlotSolution:
    """Any slot solution that carries ``problem``'s targets (a feasibility solve at scale 1,
    :func:`solve_slot_scale`, fast where the min-latency MILP finds no incumbent in its time),
    its choice priced at the targets; status ``time_limit`` (its latency was not minimised)."""
    sol = solve_slot_scale(problem, topology, deadline=deadline, shapes=shapes, at_scale=1.0,
                           time_limit_s=time_limit_s)
    if not sol.choice:
        return sol
    alloc = Allocation({m: c.instance for m, c in sol.choice.items()})
    return replace(sol, choice=price(problem, alloc), status="time_limit")


def plan_slot_latency(problem: PlanningProblem, topology: Topology, *,
                      deadline: Deadline, part_llms: int = PART_LLMS) -> PlacedPlan:
    """Min-latency placed by construction in slot groups (:func:`solve_slot_latency`): every
    candidate (no dominance pruning, which may drop the one that packs; only
    :func:`slot_candidates`' dominance), in parts (:func:`partition`, balanced by the units
    each LLM needs at least) when the workflows allow it (the objective adds up over LLMs, so the parts'
    optima add up to the optimum over partitioned plans), each within its share of the time;
    an equal part reuses a solved part's answer. With several distinct parts, each first gets
    any slot solution that carries its targets (:func:`_carrying`, in up to
    :data:`CARRY_ROUNDS` rounds, each with :data:`FALLBACK_SHARE` of the time left, shared by
    the parts still without one: a part cut short tries again in the next round, with a
    larger share; a plan in hand), which its latency MILP then replaces where it finds a plan;
    ``plan.stats['fallback_parts']`` counts the parts left with the first (the plan is then
    ``time_limit``). No bound over the whole grid (``bound_s`` None): slot groups restrict the
    packings."""
    t0 = time.perf_counter()
    why = applicable(problem)
    if why is not None:
        plan = no_allocation_plan(optimiser="milp", status="unplaced", candidates={}, stats={},
                                  infeasible=None, scale=0.0)
        return PlacedPlan(plan=plan, placement=None, rounds=1, history=(), quality=None,
                          reason=f"slot groups do not apply: {why}", exact=False,
                          formulation=POLICY, status="unplaced")
    try:
        shp = slot_shapes(problem, deadline)
    except TimeLimitReached:
        return timed_out(deadline, "milp", 1, (), POLICY, False)
    unfit = sorted(m for m, v in shp.items() if not v)
    if unfit:
        plan = no_allocation_plan(optimiser="milp", status="infeasible", candidates={}, stats={},
                                  infeasible=None, scale=0.0)
        return PlacedPlan(plan=plan, placement=None, rounds=1, history=(), quality=None,
                          reason=f"{', '.join(unfit)} fit no GPU of the "
                          "cluster", exact=True, formulation=POLICY, status="infeasible")
    need = capacity_need(problem, shp, 1.0)
    plain: dict[int, list[Part]] = {}
    parts = (typed_partition(problem, topology, part_llms, need)
             if skewed(problem, topology, part_llms, need, plain) else
             plain.get(part_llms) or partition(problem, topology, part_llms, need))
    if len(parts) > 1 and not separable(problem, parts):
        parts = partition(problem, topology, len(problem.llms))
    keys = [_demand_signature(problem, topology, p) for p in parts]
    first: dict[tuple[Any, ...], int] = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    distinct = list(first.values())

    def sub_of(i: int) -> tuple[PlanningProblem, Topology]:
        return _sub(problem, topology, parts[i]) if len(parts) > 1 else (problem, topology)

    best: dict[int, SlotSolution] = {}
    carrying: set[int] = set()
    if len(distinct) > 1:  # a plan in hand first: any slot solution that carries each part
        proven: set[int] = set()  # parts no slot solution carries (proven)
        for _ in range(CARRY_ROUNDS):  # the parts still without one get a share of what is left
            lacking = [i for i in distinct if i not in best and i not in proven]
            quick = deadline.within(FALLBACK_SHARE * deadline.remaining())
            if not lacking or quick.remaining() <= 0:
                break
            for n, i in enumerate(lacking):
                sub, sub_top = sub_of(i)
                sol = _carrying(sub, sub_top, {m: shp[m] for m in parts[i].llms}, quick,
                                quick.remaining() / (len(lacking) - n))
                if sol.choice:
                    best[i] = sol
                    carrying.add(i)
                elif sol.status == "infeasible":
                    proven.add(i)
    generated = kept = 0
    proven_none = False
    # then each part's least latency in its share of the time, those without a plan first
    for n, i in enumerate(sorted(distinct, key=lambda i: (i in best, i))):
        if deadline.remaining() <= 0:
            break
        sub, sub_top = sub_of(i)
        share = deadline.remaining() / (len(distinct) - n)
        try:  # the part's LLMs' candidates, priced at their targets
            cset = generate_candidates(sub, prune=False, deadline=deadline)
        except TimeLimitReached:
            break
        cands = latency_candidates(cset.by_llm)
        generated += cset.generated
        kept += sum(map(len, cands.values()))
        sol = solve_slot_latency(sub, sub_top, cands, deadline=deadline, time_limit_s=share,
                                 gap_rel=PART_GAP_REL if len(parts) > 1 else 1e-4)
        if sol.choice:
            best[i] = sol
            carrying.discard(i)
        elif sol.status != "time_limit" and i not in best:
            proven_none = True  # no slot groups of its candidates carry this part
            break
    if any(i not in best for i in distinct):
        if not proven_none:
            return timed_out(deadline, "milp", 1, (), POLICY, False)
        plan = no_allocation_plan(optimiser="milp", status="unplaced", candidates={}, stats={},
                                  infeasible=None, scale=0.0)
        return PlacedPlan(plan=plan, placement=None, rounds=1, history=(), quality=None,
                          reason="no slot groups of the free GPUs carry the "
                          "targets (not proven infeasible: LLMs sharing GPUs otherwise may)",
                          exact=False, formulation=POLICY, status="unplaced")
    found: list[SlotSolution] = []
    statuses: list[str] = []
    for i, part in enumerate(parts):
        j = first[keys[i]]
        names = dict(zip(_ordered(problem, parts[j]), _ordered(problem, part), strict=True))
        sol = best[j] if i == j else _renamed(best[j], names)
        statuses.append(sol.status)
        found.append(sol)
    reused, fallback = len(parts) - len(distinct), len(carrying)
    joined = _join(problem, found, "optimal")
    stats = {"parts": len(parts), "reused": reused, "fallback_parts": fallback,
             "candidates_kept": kept,
             "candidates_generated": generated, "total_s": time.perf_counter() - t0}
    status: Status = "optimal" if all(s == "optimal" for s in statuses) and len(parts) == 1 else (
        "time_limit" if "time_limit" in statuses else "heuristic")
    plan = plan_from_choice(problem, "milp", status, dict(joined.choice), stats)
    assert plan.allocation is not None
    dem = demands(plan.allocation, problem.catalog)
    placement = layout(topology, joined, dem)
    entry = {"round": 1, "objective_s": plan.objective_s, "unplaced": len(placement.unplaced)}
    if not placement.complete:
        return PlacedPlan(plan=plan, placement=placement, rounds=1, history=(entry,), quality=None,
                          reason=f"{len(placement.unplaced)} replica(s) found no slot", exact=False,
                          formulation=POLICY,
                          status="unplaced")
    return PlacedPlan(plan=plan, placement=placement, rounds=1, history=(entry,),
                      quality=quality(topology, placement, dem), reason=None,
                      exact=False, formulation=POLICY)
