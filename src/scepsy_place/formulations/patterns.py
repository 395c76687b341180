"""The pattern formulation of the placeable problem: column generation and price-and-branch.

The aggregate MILP (:mod:`scepsy_opt.planning.milp`) budgets GPU capacity per type; the blocks
formulation (:mod:`scepsy_place.formulations.blocks`) is placeable by construction but never lets two LLMs
share a GPU. This formulation is placeable by construction *and* co-locates: it decides how
many NVLink domains run each *pattern*, a filling of one domain with replicas of possibly
different LLMs (docs/patterns.md).

* A *shape* ``σ = (llm, gpu, tp, share, memory share)``: per replica and per GPU it takes
  ``share_units(share)`` thousandths of the compute and ``m_σ`` GiB of memory (two resources).
  A candidate ``c`` is a shape and a replica count ``r_c``.
* A *domain type* ``k``: NVLink domains of one GPU type with the same free capacity per GPU
  (free compute units and free memory, GPUs sorted); ``N_k`` domains have it. A fully free
  DGX cluster is one type.
* A *pattern* ``p`` of type ``k``: ``a_{pσ}`` replicas of each shape that one domain of the type
  holds: every TP-``t`` replica on ``t`` distinct GPUs, per GPU compute and memory within what
  is free. It keeps its concrete GPU assignment: per-GPU slice counts ``w_{σg}`` with
  ``Σ_g w_{σg} = t·a_σ`` and ``w_{σg} ≤ a_σ`` are dealt round-robin into ``a_σ`` groups of
  ``t`` distinct GPUs.

The master problem::

    min Σ_c cost_c·x_c + Σ_p gpu_cost_k·open_p·y_p
    s.t. Σ_{c of m} x_c = 1                       every LLM m
         Σ_p a_{pσ}·y_p ≥ Σ_{c of σ} r_c·x_c       every shape σ
         Σ_{p of k} y_p ≤ N_k                      every domain type k
         Σ_c coeff_c·x_c ≤ rhs                     extra rows (latency bounds)
         x binary, y integer ≥ 0

Its LP relaxation is solved by column generation (the restricted master with artificial
slacks at a large penalty, so it is always feasible; per domain type a pricing MILP
``max Σ_σ π_σ·a_σ − gpu_cost·open`` over realisable patterns, solved by HiGHS), and every
iteration gives a valid Lagrangian lower bound (:func:`_lagrangian`). Integer plans come from
price-and-branch: the master MILP over the generated columns, and, while the best plan is more
than 1% above the bound, over half-and-half recombinations of its patterns and the root LP's
(:func:`_recombined`). Every plan places by
construction: the patterns go to concrete domains of their type in the canonical node order
and surplus replicas are dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal, cast

import highspy
import numpy as np

from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.planning.candidates import Candidate, CandidateSet, generate_candidates
from scepsy_opt.planning.milp import Row, reduced_candidates, solve_min_latency
from scepsy_opt.planning.plans import Plan, no_allocation_plan, plan_from_choice, time_limit_plan
from scepsy_opt.planning.problem import (
    Deadline,
    PlanningProblem,
    TimeLimitReached,
    time_limit_detail,
)
from scepsy_opt.planning.solver import SEED as SEED  # re-exported: the seed of every solve
from scepsy_opt.planning.solver import (
    SOLVER,
    highs,
    run_killable,
    solved_by,
)
from scepsy_place.formulations.placed import PlacedPlan, plan_blocks
from scepsy_place.packing.check import violations
from scepsy_place.packing.exact import EXACT_TIME_S, place_exactly
from scepsy_place.packing.placement import Placement, demands, place
from scepsy_place.packing.quality import quality
from scepsy_place.packing.replicas import Slot
from scepsy_place.packing.topology import MEMORY_TOL_GIB, Topology

UNPRUNED_MAX_GPUS = 64  # up to this many GPUs: every candidate (exact); above: reduced ones
PLACER_MAX_GPUS = 1024  # up to this many GPUs the placer tries the aggregate allocation
AGGREGATE_ROUNDS = 25  # aggregate allocations tried in cost order before column generation
OPT_REL = 1e-9  # optimal: objective − bound ≤ OPT_REL·|objective| + OPT_ABS
OPT_ABS = 1e-12
RC_TOL = 1e-9  # a column enters when its reduced cost is below −RC_TOL·max(1, |LP|)
PRICE_TIME_S = 5.0  # one pricing MILP at most this long
MIP_TIME_S = 10.0  # one master MILP at most this long
DIVE_BACKTRACKS = 20  # decisions the dive may undo
GREEDY_SEEDS = 16  # greedy pricing: patterns started from each of this many shapes
TAIL_ITERS = 10  # tailing off: the LP objective over this many iterations
TAIL_REL = 1e-5  # ... fell by at most this (relative): stop (above UNPRUNED_MAX_GPUS)
CG_REL = 5e-3  # above UNPRUNED_MAX_GPUS: stop once the LP is this close to the best bound
PRICE_LARGE_S = 1.0  # above UNPRUNED_MAX_GPUS: one pricing MILP at most this long
PRICE_TOP = 40  # ... over this many of the densest shapes only
# ... the dive fixes the allocation with these shares of the domains kept free (rounded down),
# one dive per share until one finds a plan
RESERVES = (0.004, 0.02, 0.05)
RECOMBINE_GAP = 1e-2  # up to PLACER_MAX_GPUS GPUs, above this gap the best plan is recombined
RECOMBINE_ROUNDS = 2  # ... at most this many times (each followed by a master MILP)
PatternStatus = Literal["optimal", "feasible", "infeasible", "time_limit_no_solution",
                        "no_solution"]


@dataclass(frozen=True)
class Shape:
    """What one replica of a candidate takes per GPU: ``units`` thousandths of compute and
    ``memory_gib`` GiB, on ``tp`` distinct GPUs of one NVLink domain of type ``gpu``."""

    llm: str
    gpu: str
    tp: int
    share: float
    memory_share: float | None
    units: int
    memory_gib: float


@dataclass(frozen=True)
class DomainType:
    """NVLink domains of one GPU type with equal free capacity: per usable GPU (free units,
    free GiB), sorted; ``domains`` the concrete ones (node, GPU indices in that order), in the
    canonical node order."""

    gpu: str
    free: tuple[tuple[int, float], ...]
    domains: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def count(self) -> int:
        return len(self.domains)


@dataclass(frozen=True)
class Pattern:
    """One filling of a domain of type ``kind``: ``counts`` (shape index, replicas) and per
    replica its GPU positions (in the type's ``free`` order); ``opened`` GPUs in use."""

    kind: int
    counts: tuple[tuple[int, int], ...]
    groups: tuple[tuple[int, tuple[int, ...]], ...]
    opened: int


@dataclass(frozen=True)
class PatternResult:
    """The answer of :func:`solve_patterns`.

    ``objective`` is the master's objective of ``plan`` (latency mode: plus
    ``problem.constant_s``, as the plan's objective), ``lp_bound_s`` a proven lower bound on it
    for every placeable allocation of the candidates (same units); ``gap = objective /
    lp_bound_s − 1``. ``exact``: the candidates were every candidate (not reduced), so an
    ``optimal`` status is the placeable optimum of the candidate grid."""

    plan: Plan
    placement: Placement | None
    lp_bound_s: float
    status: PatternStatus
    gap: float
    columns: int
    iterations: int
    seconds: float
    objective: float = math.inf
    exact: bool = True
    converged: bool = False  # column generation proved the LP optimum
    reason: str | None = None
    stats: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


# --------------------------------------------------------------------------- HiGHS helpers


def _highs(time_limit_s: float, mip_gap: float = 1e-9) -> highspy.Highs:
    """A quiet single-threaded HiGHS with a fixed seed and tight tolerances (at least 1 ms),
    without the RENS heuristic: HiGHS 1.16's presolve of a RENS sub-MIP
    (``HPresolve::strengthenInequalities``) can run on past the time limit, for minutes, on
    slot models (a Zipf 256 / 512 part of 64 LLMs on 32 H100 nodes asked for 0.96 of its
    bound: past 120 s with a 3.8 s limit, 2.1 s to optimal without RENS; the model is
    tests/data/highs-rens-presolve-loop.mps.gz)."""
    return highs(max(float(time_limit_s), 1e-3), gap_rel=mip_gap, gap_abs=0.0,
                 mip_feasibility_tolerance=1e-9, primal_feasibility_tolerance=1e-9,
                 dual_feasibility_tolerance=1e-9, mip_heuristic_run_rens=False)


KILLABLE_COLUMNS = 1000
"""Slot and pattern MILPs of at least this many columns solve in a killable child process
(:func:`_run_mip`); smaller ones solve in seconds at most, where a fork's milliseconds would
show."""


@dataclass
class _Model:
    """A sparse (MI)LP in column form, built up column by column."""

    row_lower: list[float] = field(default_factory=list)
    row_upper: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    cols: list[tuple[list[int], list[float]]] = field(default_factory=list)

    def row(self, lo: float, hi: float) -> int:
        self.row_lower.append(lo)
        self.row_upper.append(hi)
        return len(self.row_lower) - 1

    def col(self, cost: float, lo: float, hi: float, rows: list[int], vals: list[float],
            integer: bool = False) -> int:
        self.cost.append(cost)
        self.lower.append(lo)
        self.upper.append(hi)
        self.integer.append(integer)
        self.cols.append((rows, vals))
        return len(self.cost) - 1

    def lp(self, mip: bool) -> highspy.HighsLp:
        lp = highspy.HighsLp()
        lp.num_col_ = len(self.cost)
        lp.num_row_ = len(self.row_lower)
        lp.col_cost_ = np.array(self.cost, dtype=float)
        lp.col_lower_ = np.array(self.lower, dtype=float)
        lp.col_upper_ = np.array(self.upper, dtype=float)
        lp.row_lower_ = np.array(self.row_lower, dtype=float)
        lp.row_upper_ = np.array(self.row_upper, dtype=float)
        start = [0]
        index: list[int] = []
        value: list[float] = []
        for rows, vals in self.cols:
            index.extend(rows)
            value.extend(vals)
            start.append(len(index))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.array(start, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(value, dtype=float)
        if mip:
            lp.integrality_ = [highspy.HighsVarType.kInteger if i
                               else highspy.HighsVarType.kContinuous for i in self.integer]
        return lp


def _run_mip(model: _Model, time_limit_s: float, mip_gap: float = 1e-9,
             ) -> tuple[str, list[float], float, float]:
    """(status, values, objective, dual bound) of a minimisation MILP: status ``optimal``,
    ``time_limit`` (with or without a solution: values empty without), ``infeasible``.
    Models of at least :data:`KILLABLE_COLUMNS` columns solve in a child process that is
    killed past the limit (:func:`scepsy_opt.planning.solver.run_killable`), so that a HiGHS
    loop without a time check cannot break a time limit."""
    h = _highs(time_limit_s, mip_gap)
    h.passModel(model.lp(mip=True))
    if len(model.cost) >= KILLABLE_COLUMNS:
        solved = run_killable(h, time_limit_s)
    else:
        h.run()
        solved = solved_by(h)
    vals = solved.values.tolist()
    if solved.status == "optimal":
        return "optimal", vals, solved.objective, solved.dual_bound
    if solved.status == "infeasible":
        return "infeasible", [], math.inf, math.inf
    # any other end (a limit, with or without an incumbent) counts as the time limit here
    return "time_limit", vals, solved.objective if vals else math.inf, solved.dual_bound


# --------------------------------------------------------------------------- the data


def shape_of(c: Candidate, problem: PlanningProblem) -> Shape:
    """The per-replica, per-GPU needs of candidate ``c`` (memory as the placement counts it)."""
    d = demands(Allocation({c.llm: Instance(c.gpu, c.tp, c.share, 1, c.memory_share)}),
                problem.catalog)[0]
    return Shape(c.llm, d.gpu, c.tp, c.share, c.memory_share, d.units, d.memory_gib)


def domain_types(topology: Topology) -> list[DomainType]:
    """The topology's NVLink domains grouped by (GPU type, free capacity per usable GPU),
    types in order of their first domain in the canonical node order."""
    found: dict[tuple[Any, ...], list[tuple[str, tuple[int, ...]]]] = {}
    for n in topology.canonical_nodes():
        for dom in n.domains():
            usable = sorted(((n.free_units(j), n.free_memory(j), j) for j in dom
                             if n.free_units(j) > 0 and n.free_memory(j) > MEMORY_TOL_GIB),
                            key=lambda t: (-t[0], -t[1], t[2]))
            if not usable:
                continue
            key = (n.gpu, tuple((u, m) for u, m, _ in usable))
            found.setdefault(key, []).append((n.name, tuple(j for _, _, j in usable)))
    return [DomainType(k[0], k[1], tuple(v)) for k, v in found.items()]


def _per_gpu_cap(free: tuple[int, float], s: Shape) -> int:
    """Replicas of shape ``s`` one GPU with ``free`` (units, GiB) holds by itself."""
    units, mem = free
    cap = units // s.units
    if s.memory_gib > 0:
        cap = min(cap, int((mem + MEMORY_TOL_GIB) // s.memory_gib))
    return max(cap, 0)


def _deal(per_gpu: Sequence[int], a: int, tp: int) -> list[tuple[int, ...]]:
    """``a`` groups of ``tp`` distinct GPU positions from per-GPU slice counts (each ≤ ``a``,
    summing to ``tp·a``): the slices GPU by GPU, dealt round-robin."""
    slices = [g for g, w in enumerate(per_gpu) for _ in range(w)]
    return [tuple(sorted(slices[i::a])) for i in range(a)]


def _make_pattern(kind: int, dt: DomainType, shapes: Sequence[Shape],
                  w: Mapping[int, Sequence[int]]) -> Pattern | None:
    """The pattern of per-GPU slice counts ``w`` (shape index -> count per GPU position), or
    None when they do not make whole groups or overfill a GPU (checked exactly)."""
    counts = []
    groups: list[tuple[int, tuple[int, ...]]] = []
    load_u = [0] * len(dt.free)
    load_m = [0.0] * len(dt.free)
    for s in sorted(w):
        per = list(w[s])
        total = sum(per)
        if total == 0:
            continue
        sh = shapes[s]
        if total % sh.tp:
            return None
        a = total // sh.tp
        if any(x > a for x in per):
            return None
        for g, x in enumerate(per):
            load_u[g] += x * sh.units
            load_m[g] += x * sh.memory_gib
        counts.append((s, a))
        groups.extend((s, grp) for grp in _deal(per, a, sh.tp))
    for g, (fu, fm) in enumerate(dt.free):
        if load_u[g] > fu or load_m[g] > fm + MEMORY_TOL_GIB:
            return None
    if not counts:
        return None
    opened = sum(1 for g in range(len(dt.free)) if load_u[g] > 0 or load_m[g] > 0)
    return Pattern(kind, tuple(counts), tuple(groups), opened)


def _fill(kind: int, dt: DomainType, shapes: Sequence[Shape], s: int, most: int,
          ) -> Pattern | None:
    """The single-shape pattern with the most replicas of shape ``s`` (at most ``most``) one
    domain of the type holds, on as few GPUs as possible."""
    sh = shapes[s]
    caps = [_per_gpu_cap(f, sh) for f in dt.free]
    a = min(sum(caps) // sh.tp, most)
    while a > 0 and sum(min(c, a) for c in caps) < sh.tp * a:
        a -= 1
    if a <= 0:
        return None
    need, per = sh.tp * a, []
    for c in caps:
        take = min(c, a, need)
        per.append(take)
        need -= take
    return _make_pattern(kind, dt, shapes, {s: per})


# --------------------------------------------------------------------------- pricing


def _price(kind: int, dt: DomainType, shapes: Sequence[Shape], pi: np.ndarray,
           most: Sequence[int], gpu_cost: float, time_limit_s: float, gap: float = 1e-9,
           top: int | None = None) -> tuple[Pattern | None, float, bool]:
    """The pattern of type ``kind`` of least ``gpu_cost·open − Σ_σ π_σ·a_σ`` (pricing MILP):
    (pattern or None when no pattern beats the empty one, a lower bound on that least value
    (≤ 0), whether it is proven optimal)."""
    live = [s for s, sh in enumerate(shapes)
            if pi[s] > 0 and sh.gpu == dt.gpu and most[s] > 0
            and sum(1 for f in dt.free if _per_gpu_cap(f, sh) >= 1) >= sh.tp]
    if not live:
        return None, 0.0, True
    partial = top is not None and len(live) > top
    if partial:  # the densest shapes only: a heuristic, no bound
        fu = max(f[0] for f in dt.free)
        live = sorted(sorted(live, key=lambda s: (-pi[s] / (shapes[s].tp * shapes[s].units
                                                             / fu), s))[:top])
    m = _Model()
    G = len(dt.free)
    a_col: dict[int, int] = {}
    w_col: dict[tuple[int, int], int] = {}
    caps = {s: [_per_gpu_cap(f, shapes[s]) for f in dt.free] for s in live}
    group_row = {s: m.row(0.0, 0.0) for s in live}
    units_row = [m.row(-math.inf, float(f[0]) if gpu_cost <= 0 else 0.0) for f in dt.free]
    mem_row = [m.row(-math.inf, f[1] + MEMORY_TOL_GIB / 2) for f in dt.free]
    sym = [g for g in range(G - 1) if dt.free[g] == dt.free[g + 1]]
    sym_row = {g: m.row(0.0, math.inf) for g in sym}
    distinct: dict[tuple[int, int], int] = {}
    for s in live:
        sh = shapes[s]
        ub = min(sum(caps[s]) // sh.tp, most[s])
        for g in range(G):
            if caps[s][g] >= 1 and sh.tp > 1:
                distinct[s, g] = m.row(-math.inf, 0.0)
        rows = [group_row[s]] + [distinct[s, g] for g in range(G) if (s, g) in distinct]
        vals = [-float(sh.tp)] + [-1.0] * (len(rows) - 1)
        a_col[s] = m.col(-float(pi[s]), 0.0, float(ub), rows, vals, True)
        for g in range(G):
            if caps[s][g] < 1:
                continue
            rows = [group_row[s], units_row[g], mem_row[g]]
            vals = [1.0, float(sh.units), sh.memory_gib]
            if (s, g) in distinct:
                rows.append(distinct[s, g])
                vals.append(1.0)
            if g in sym_row:
                rows.append(sym_row[g])
                vals.append(float(sh.units))
            if g - 1 in sym_row:
                rows.append(sym_row[g - 1])
                vals.append(-float(sh.units))
            w_col[s, g] = m.col(0.0, 0.0, float(min(caps[s][g], ub)), rows, vals, True)
    if gpu_cost > 0:  # z_g: GPU g is open; units ≤ free·z_g; open GPUs first among equals
        zsym = {g: m.row(0.0, math.inf) for g in sym}
        for g in range(G):
            rows, vals = [units_row[g]], [-float(dt.free[g][0])]
            if g in zsym:
                rows.append(zsym[g])
                vals.append(1.0)
            if g - 1 in zsym:
                rows.append(zsym[g - 1])
                vals.append(-1.0)
            m.col(gpu_cost, 0.0, 1.0, rows, vals, True)
    status, vals, _, bound = _run_mip(m, time_limit_s, gap)
    lower = min(0.0, bound if math.isfinite(bound) and not partial else -math.inf)
    if not vals:
        return None, lower, False
    w = {s: [round(vals[w_col[s, g]]) if (s, g) in w_col else 0 for g in range(G)]
         for s in live}
    pat = _make_pattern(kind, dt, shapes, w)
    return pat, lower, status == "optimal" and not partial


def _greedy_price(kind: int, dt: DomainType, shapes: Sequence[Shape], pi: np.ndarray,
                  most: Sequence[int], gpu_cost: float) -> list[Pattern]:
    """Patterns of type ``kind`` built greedily, a few orders of the shapes with ``π > 0``
    (value per unit of compute, of memory, of the scarcer of both, per replica): each shape
    in turn gets as many replicas as fit, each on the ``tp`` fitting GPUs with the least room
    left (best fit). Cheap, no optimality claim: the pricing MILP decides convergence."""
    live = [s for s in range(len(shapes)) if pi[s] > 0 and shapes[s].gpu == dt.gpu
            and most[s] > 0]
    if not live:
        return []
    fu = max(f[0] for f in dt.free)
    fm = max(f[1] for f in dt.free)

    def scarce(s: int) -> float:
        sh = shapes[s]
        return sh.tp * max(sh.units / fu, sh.memory_gib / fm if fm > 0 else 0.0)

    keys = [lambda s: -pi[s] / (shapes[s].tp * shapes[s].units),
            lambda s: -pi[s] / (shapes[s].tp * max(shapes[s].memory_gib, 1e-9)),
            lambda s: -pi[s] / max(scarce(s), 1e-12),
            lambda s: -pi[s]]
    out: list[Pattern] = []
    seen: set[tuple[tuple[int, int], ...]] = set()
    G = len(dt.free)
    density = sorted(live, key=lambda s: (keys[2](s), s))
    # (ignore: mypy cannot infer the type of a lambda with a default argument)
    orders = [sorted(live, key=lambda s, key=key: (key(s), s)) for key in keys]  # type: ignore[misc]
    # each of the densest shapes first, then the rest by density: more columns per round
    orders += [[s] + [t for t in density if t != s] for s in density[:GREEDY_SEEDS]]
    for order in orders:
        lu = [0] * G
        lm = [0.0] * G
        w: dict[int, list[int]] = {}
        for s in order:
            sh = shapes[s]
            for _ in range(most[s]):
                fit = [g for g in range(G) if lu[g] + sh.units <= dt.free[g][0]
                       and lm[g] + sh.memory_gib <= dt.free[g][1] + MEMORY_TOL_GIB]
                if len(fit) < sh.tp:
                    break
                fit.sort(key=lambda g: (dt.free[g][0] - lu[g], g))
                per = w.setdefault(s, [0] * G)
                for g in fit[:sh.tp]:
                    lu[g] += sh.units
                    lm[g] += sh.memory_gib
                    per[g] += 1
        p = _make_pattern(kind, dt, shapes, w) if w else None
        if p is not None and p.counts not in seen:
            seen.add(p.counts)
            out.append(p)
    return out


# --------------------------------------------------------------------------- the master


@dataclass
class _Master:
    """The restricted master LP and everything needed to price and bound it."""

    problem: PlanningProblem
    llms: list[str]
    cands: list[Candidate]
    cand_shape: np.ndarray
    cand_owner: np.ndarray
    shapes: list[Shape]
    types: list[DomainType]
    extra: list[Row]
    gpu_cost: Mapping[str, float]
    big: float
    most: list[int]
    model: _Model = field(default_factory=_Model)
    patterns: list[Pattern] = field(default_factory=list)
    seen: dict[tuple[int, tuple[tuple[int, int], ...]], int] = field(default_factory=dict)
    n_fixed: int = 0  # columns before the patterns: x, then artificials
    cov0: int = 0
    type0: int = 0
    extra0: int = 0
    highs: highspy.Highs | None = None
    phase1: bool = False  # minimise the artificials alone (a proof of infeasibility)
    out: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    cost: np.ndarray = field(default_factory=lambda: np.zeros(0))
    reps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ex_terms: list[list[tuple[int, float]]] = field(default_factory=list)
    lp_lo: dict[int, float] = field(default_factory=dict)  # the restricted LP's changed bounds
    lp_hi: dict[int, float] = field(default_factory=dict)

    def build(self) -> None:
        m = self.model
        conv = [m.row(1.0, 1.0) for _ in self.llms]
        self.cov0 = len(m.row_lower)
        for _ in self.shapes:
            m.row(0.0, math.inf)
        self.type0 = len(m.row_lower)
        for dt in self.types:
            m.row(-math.inf, float(dt.count))
        self.extra0 = len(m.row_lower)
        for _, rhs in self.extra:
            m.row(-math.inf, float(rhs))
        index = {c: i for i, c in enumerate(self.cands)}
        self.ex_terms = [[] for _ in self.cands]
        for j, (coeffs, _) in enumerate(self.extra):
            for c, v in coeffs.items():
                if c in index:
                    self.ex_terms[index[c]].append((j, float(v)))
        for i, c in enumerate(self.cands):
            rows = [conv[self.cand_owner[i]], self.cov0 + int(self.cand_shape[i])]
            vals = [1.0, -float(c.replicas)]
            for j, v in self.ex_terms[i]:
                rows.append(self.extra0 + j)
                vals.append(v)
            m.col(c.cost, 0.0, math.inf, rows, vals)
        for s in range(len(self.shapes)):
            m.col(self.big, 0.0, math.inf, [self.cov0 + s], [1.0])
        for j in range(len(self.extra)):
            m.col(self.big, 0.0, math.inf, [self.extra0 + j], [-1.0])
        self.n_fixed = len(m.cost)
        self.out = np.zeros(len(self.cands), dtype=bool)
        self.cost = np.array([c.cost for c in self.cands])
        self.reps = np.array([c.replicas for c in self.cands], dtype=float)

    def pattern_cost(self, p: Pattern) -> float:
        if self.phase1:
            return 0.0
        return self.gpu_cost.get(self.types[p.kind].gpu, 0.0) * p.opened

    def add(self, p: Pattern) -> bool:
        """Add pattern ``p`` as a column (False when it is there already)."""
        key = (p.kind, p.counts)
        if key in self.seen:
            return False
        self.seen[key] = len(self.patterns)
        self.patterns.append(p)
        rows = [self.cov0 + s for s, _ in p.counts] + [self.type0 + p.kind]
        vals = [float(a) for _, a in p.counts] + [1.0]
        cost = self.gpu_cost.get(self.types[p.kind].gpu, 0.0) * p.opened
        self.model.col(cost, 0.0, math.inf, rows, vals, True)
        if self.highs is not None:
            self.highs.addCols(1, np.array([self.pattern_cost(p)]), np.array([0.0]),
                               np.array([math.inf]), len(rows), np.array([0], dtype=np.int32),
                               np.array(rows, dtype=np.int32), np.array(vals))
        return True

    def set_phase1(self, on: bool, big: float | None = None) -> None:
        """Switch the LP's costs: artificials alone (phase 1) or the real ones (``big``: a new
        penalty for the artificials)."""
        self.phase1 = on
        if big is not None:
            self.big = big
        n = len(self.model.cost)
        costs = [0.0 if on else self.model.cost[i] for i in range(len(self.cands))]
        costs += [1.0 if on else self.big] * (self.n_fixed - len(self.cands))
        costs += [0.0 if on else self.model.cost[i] for i in range(self.n_fixed, n)]
        if self.highs is not None:
            self.highs.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(costs))

    def bound(self, col: int, lo: float, hi: float) -> tuple[int, float, float]:
        """Set column ``col``'s bounds in the restricted LP; returns the old ones (to undo)."""
        old = (col, self.lp_lo.get(col, 0.0), self.lp_hi.get(col, math.inf))
        self.lp_lo[col], self.lp_hi[col] = lo, hi
        if col < len(self.cands):
            self.out[col] = hi <= 0
        if self.highs is not None:
            self.highs.changeColBounds(col, lo, hi)
        return old

    def fix(self, i: int) -> list[tuple[int, float, float]]:
        """Fix candidate ``i``'s LLM to it (the others' columns get an upper bound of 0);
        returns the old bounds."""
        j = self.cand_owner[i]
        return [self.bound(k, 0.0, 0.0)
                for k in np.flatnonzero((self.cand_owner == j) & ~self.out).tolist() if k != i]

    def reset(self) -> None:
        """Every bound the dive changed back to its default, the type rows to ``N_k``."""
        for col in sorted(set(self.lp_lo) | set(self.lp_hi)):
            self.bound(col, 0.0, math.inf)
        self.lp_lo.clear()
        self.lp_hi.clear()
        if self.highs is not None:
            for k, dt in enumerate(self.types):
                self.highs.changeRowBounds(self.type0 + k, -math.inf, float(dt.count))

    def undo(self, changes: Sequence[tuple[int, float, float]]) -> None:
        """Restore the bounds ``changes`` (from :meth:`bound`) in reverse order."""
        for col, lo, hi in reversed(changes):
            self.bound(col, lo, hi)

    def solve_lp(self, time_limit_s: float) -> tuple[bool, float, np.ndarray, np.ndarray]:
        """(solved, objective, column values, row duals) of the restricted master LP."""
        if self.highs is None:
            self.highs = _highs(time_limit_s)
            self.highs.passModel(self.model.lp(mip=False))
        else:
            self.highs.setOptionValue("time_limit", max(time_limit_s, 1e-3))
        self.highs.run()
        if self.highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return False, math.inf, np.zeros(0), np.zeros(0)
        sol = self.highs.getSolution()
        return (True, self.highs.getInfo().objective_function_value,
                np.array(sol.col_value), np.array(sol.row_dual))

    def _v(self, mu: np.ndarray) -> np.ndarray:
        """Per candidate ``cost_c − μ·E_c`` (cost 0 in phase 1)."""
        v = np.zeros(len(self.cands)) if self.phase1 else self.cost.copy()
        for i, terms in enumerate(self.ex_terms):
            for j, val in terms:
                v[i] -= mu[j] * val
        return v

    def pi_mu(self, duals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The coverage duals ``π`` made as small as dual feasibility allows (the same dual
        objective: coverage rows have right-hand side 0), and the extra rows' ``μ ≤ 0``:
        ``π_σ = max(0, max_{c of σ} (λ_m − cost_c + μ·E_c) / r_c)`` over the candidates in play,
        at most the LP's own ``π``. Fewer shapes with ``π > 0`` make pricing cheaper."""
        lo = -1.0 if self.phase1 else -math.inf
        mu = np.clip(duals[self.extra0:self.extra0 + len(self.extra)], lo, 0.0)
        lam = duals[:len(self.llms)]
        need = (lam[self.cand_owner] - self._v(mu)) / self.reps
        need[self.out] = 0.0
        pi = np.zeros(len(self.shapes))
        np.maximum.at(pi, self.cand_shape, need)
        lp_pi = np.maximum(duals[self.cov0:self.cov0 + len(self.shapes)], 0.0)
        pi = np.minimum(pi, lp_pi)
        if self.phase1:
            pi = np.minimum(pi, 1.0)
        pi[pi < 1e-12] = 0.0
        return pi, mu

    def lagrangian(self, pi: np.ndarray, mu: np.ndarray, least: Sequence[float]) -> float:
        """A lower bound on the master's objective over every solution without artificials
        (the candidates in play), from any ``π ≥ 0`` and ``μ ≤ 0``:
        ``Σ_m min_{c of m} (cost_c + π_σ·r_c − μ·E_c) + μ·rhs + Σ_k N_k·least_k`` where
        ``least_k ≤ min(0, min_p pattern_cost_p − π·a_p)`` comes from the pricing."""
        v = self._v(mu) + pi[self.cand_shape] * self.reps
        v[self.out] = math.inf
        best = np.full(len(self.llms), math.inf)
        np.minimum.at(best, self.cand_owner, v)
        total = math.fsum(best.tolist())
        total += math.fsum(float(mu[j]) * rhs for j, (_, rhs) in enumerate(self.extra))
        total += math.fsum(dt.count * min(0.0, lk) for dt, lk in zip(self.types, least,
                                                                         strict=True))
        return total


@dataclass
class _CG:
    """How one column generation run ended."""

    ok: bool = False  # the last restricted LP was solved
    z: float = math.inf
    vals: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bound: float = -math.inf  # the best Lagrangian bound of the run
    converged: bool = False
    iterations: int = 0
    artificial: float = math.inf


def _generate(master: _Master, left: Deadline, max_iterations: int, max_columns: int,
              stop_at: float = math.inf, exact: bool = True, tail_rel: float = 0.0,
              lower: float = -math.inf, rel: float = 0.0, price_s: float = PRICE_TIME_S,
              price_gap: float = 1e-9, price_top: float = 0) -> _CG:
    """Column generation on the restricted master: the greedy pricing (:func:`_greedy_price`)
    while it finds improving patterns, then the pricing MILP (``exact``), which gives a
    Lagrangian bound; until no pattern prices out (converged), the iteration or column limit,
    the deadline, a bound above ``stop_at``, or (``tail_rel`` > 0) an LP objective that fell
    by at most ``tail_rel`` (relative) in the last :data:`TAIL_ITERS` iterations, or (``rel`` >
    0) an LP objective without artificials within ``rel`` (relative) of the larger of
    ``lower`` (a known bound) and its own bound. ``price_s`` and ``price_gap``: each pricing
    MILP's time limit and relative gap (its bound stays valid); ``price_top`` > 0: it prices
    only that many of the densest shapes (a heuristic: no bound, no convergence)."""
    out = _CG()
    history: list[float] = []
    while left.remaining() > 0 and out.iterations < max_iterations:
        ok, z, vals, duals = master.solve_lp(left.remaining())
        out.ok = ok
        if not ok:
            break
        out.z, out.vals = z, vals
        out.artificial = float(np.sum(vals[len(master.cands):master.n_fixed]))
        out.iterations += 1
        history.append(z)
        if (rel > 0 and out.artificial <= 1e-6
                and z - max(lower, out.bound) <= rel * abs(z)):
            break
        if (tail_rel > 0 and len(history) > TAIL_ITERS
                and history[-TAIL_ITERS - 1] - z <= tail_rel * abs(z)):
            break
        pi, mu = master.pi_mu(duals)
        nu = duals[master.type0:master.type0 + len(master.types)]
        tol = RC_TOL * max(1.0, abs(z))
        room = len(master.patterns) < max_columns

        def improving(k: int, p: Pattern | None, pi: np.ndarray = pi, nu: np.ndarray = nu,
                      tol: float = tol) -> bool:
            if p is None:
                return False
            rc = master.pattern_cost(p) - math.fsum(pi[s] * a for s, a in p.counts) - nu[k]
            return rc < -tol and len(master.patterns) < max_columns and master.add(p)

        added = 0
        p: Pattern | None
        for k, dt in enumerate(master.types):
            gc = 0.0 if master.phase1 else master.gpu_cost.get(dt.gpu, 0.0)
            for p in _greedy_price(k, dt, master.shapes, pi, master.most, gc):
                added += improving(k, p)
        if added:
            continue
        if not exact:
            out.converged = False
            break
        least: list[float] = []
        exact_pricing = True
        for k, dt in enumerate(master.types):
            gc = 0.0 if master.phase1 else master.gpu_cost.get(dt.gpu, 0.0)
            p, lo, proven = _price(k, dt, master.shapes, pi, master.most, gc,
                                   min(price_s, max(left.remaining(), 1e-3)), price_gap,
                                   None if price_top <= 0 else int(price_top))
            least.append(lo)
            exact_pricing = exact_pricing and proven
            added += improving(k, p)
        out.bound = max(out.bound, master.lagrangian(pi, mu, least))
        if not added:
            out.converged = exact_pricing and room
            break
        if out.bound > stop_at:
            break
    return out


def _candidate_set(problem: PlanningProblem, deadline: Deadline) -> tuple[CandidateSet, bool]:
    """Every candidate up to :data:`UNPRUNED_MAX_GPUS` GPUs (exact), the reduced ones above."""
    if problem.cluster.total_gpus <= UNPRUNED_MAX_GPUS:
        return generate_candidates(problem, prune=False, deadline=deadline), True
    return reduced_candidates(problem, deadline=deadline), False


@dataclass(frozen=True)
class _Integer:
    """An integer solution of the master: the candidate per LLM and the patterns' counts."""

    picks: tuple[int, ...]  # candidate index per LLM (master.llms order)
    ys: tuple[tuple[int, int], ...]  # (pattern index, domains) with count > 0
    objective: float  # the master's objective (without the constant)


def _master_mip(master: _Master, time_limit_s: float, hint: _Integer | None = None,
                fixed: bool = False) -> _Integer | None:
    """The master MILP over the generated columns (artificials off; ``fixed``: only the
    candidates still in play and at least the domains the dive kept per pattern), started from
    ``hint``."""
    m = master.model
    n = len(master.cands)
    saved = (list(m.lower), list(m.upper), list(m.integer))
    for i in range(n):
        m.upper[i] = 0.0 if fixed and master.out[i] else 1.0
        m.integer[i] = True
    for i in range(n, master.n_fixed):
        m.upper[i] = 0.0
    for j, p in enumerate(master.patterns):
        col = master.n_fixed + j
        m.upper[col] = float(master.types[p.kind].count)
        if fixed:  # and the patterns' domains the dive kept
            m.lower[col] = min(master.lp_lo.get(col, 0.0), m.upper[col])
    h = _highs(time_limit_s)
    # presolve off: HiGHS 1.16.0's MIP presolve loops without end (past the time limit) on some
    # of these masters (tests/scepsy_place/test_highs_regression.py); they are small enough without it
    h.setOptionValue("presolve", "off")
    h.passModel(m.lp(mip=True))
    m.lower, m.upper, m.integer = saved
    if hint is not None:
        sol = highspy.HighsSolution()
        vals = [0.0] * len(m.cost)
        for i in hint.picks:
            vals[i] = 1.0
        for j, c in hint.ys:
            vals[master.n_fixed + j] = float(c)
        sol.col_value = vals
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    if h.getInfo().primal_solution_status != 2:
        return None
    vals = list(h.getSolution().col_value)
    return _read(master, vals)


def _read(master: _Master, vals: Sequence[float]) -> _Integer:
    """The integer solution in ``vals`` (the largest ``x`` per LLM, rounded ``y``)."""
    picks = []
    for j in range(len(master.llms)):
        idx = np.flatnonzero(master.cand_owner == j).tolist()
        picks.append(max(idx, key=lambda i: (vals[i], -i)))
    ys = tuple((j, round(vals[master.n_fixed + j])) for j in range(len(master.patterns))
               if round(vals[master.n_fixed + j]) > 0)
    obj = math.fsum([master.cands[i].cost for i in picks]
                    + [master.pattern_cost(master.patterns[j]) * c for j, c in ys])
    return _Integer(tuple(picks), ys, obj)


def _covers(master: _Master, sol: _Integer) -> bool:
    """Whether the patterns of ``sol`` hold every chosen replica within the domain counts."""
    have = [0] * len(master.shapes)
    per_type = [0] * len(master.types)
    for j, c in sol.ys:
        p = master.patterns[j]
        per_type[p.kind] += c
        for s, a in p.counts:
            have[s] += a * c
    return (all(per_type[k] <= dt.count for k, dt in enumerate(master.types))
            and all(have[int(master.cand_shape[i])] >= master.cands[i].replicas
                    for i in sol.picks))


Change = list[tuple[int, float, float]]


def _dive(master: _Master, topology: Topology, left: Deadline, max_iterations: int,
          max_columns: int,
          last: _CG, *, small: bool, mip_time_s: float, scale: Mapping[str, Any],
          backtracks: int = DIVE_BACKTRACKS, reserve: float = RESERVES[0],
          ) -> tuple[_Integer | None, int, tuple[int, ...] | None]:
    """A diving heuristic with column generation and limited backtracking (the restricted
    master's bounds change; the MILP model does not). Each step: fix the LLMs whose ``x`` is
    integral, then a quarter of the fractional ones to their largest ``x``; once every ``x``
    is integral (above :data:`UNPRUNED_MAX_GPUS` GPUs: the one of fewest GPU units among those
    with ``x > 0``), fix every pattern's domains to at least the integer part of its ``y`` and one
    pattern (the largest fractional part) to its ``y`` rounded up; price again. When the LP
    then needs artificials the last decision is undone and its alternative taken (a batch of
    LLMs: only its first; one LLM: that candidate excluded; a rounding up: rounding down).
    (an integral LP solution or None, iterations, the last candidate choice with every ``x``
    integral or None). Above :data:`UNPRUNED_MAX_GPUS` GPUs, once every ``x`` is integral, each
    step first keeps every pattern's whole domains (``y`` rounded down, the residual heuristic
    of cutting stock) while any new ones appear."""
    iterations = 0
    cur = last
    n = master.n_fixed
    reserved = False
    if not small and master.highs is not None:  # leave room for the residual (restored below)
        for k, dt in enumerate(master.types):
            master.highs.changeRowBounds(master.type0 + k, -math.inf,
                                         dt.count - math.floor(reserve * dt.count))
        reserved = True
        cur = _generate(master, left, max_iterations, max_columns, **scale)
        iterations += cur.iterations
    stack: list[tuple[Change, Callable[[], Change] | None]] = []
    picks: tuple[int, ...] | None = None
    sol: _Integer | None
    while left.remaining() > 0:
        if not cur.ok or cur.artificial > 1e-6:
            while stack:
                changes, alternative = stack.pop()
                master.undo(changes)
                if alternative is not None and backtracks > 0:
                    backtracks -= 1
                    stack.append((alternative(), None))
                    break
            else:
                return None, iterations, picks
            cur = _generate(master, left, max_iterations, max_columns, **scale)
            iterations += cur.iterations
            continue
        frac: list[tuple[float, int, int]] = []
        whole: Change = []
        chosen = []
        for j in range(len(master.llms)):
            idx = np.flatnonzero((master.cand_owner == j) & ~master.out)
            best = int(idx[np.argmax(cur.vals[idx])])
            chosen.append(best)
            if cur.vals[best] >= 1 - 1e-6:
                if len(idx) > 1:
                    whole += master.fix(best)
            else:
                if not small:  # the fewest GPU units among those in use: it fits more often
                    live = [int(i) for i in idx if cur.vals[i] > 1e-6]
                    best = min(live, key=lambda i: (master.cands[i].units, -cur.vals[i], i))
                frac.append((-float(cur.vals[best]), j, best))
        y = cur.vals[n:n + len(master.patterns)]
        floors = [(j, float(np.floor(y[j] + 1e-6))) for j in range(len(y))
                  if np.floor(y[j] + 1e-6) > master.lp_lo.get(n + j, 0.0)]
        if floors and not frac and not small:  # the residual heuristic: keep whole domains
            changes = whole + [master.bound(n + j, lo, math.inf) for j, lo in floors]
            stack.append((changes, None))  # the LP solution stays feasible: nothing to undo to
        elif reserved and not frac:  # the allocation is fixed: the reserve back for the rest
            assert master.highs is not None
            for k, dt in enumerate(master.types):
                master.highs.changeRowBounds(master.type0 + k, -math.inf, float(dt.count))
            reserved = False
        elif frac:
            frac.sort()
            batch = [best for _, _, best in frac[:max(1, math.ceil(len(frac) / 4))]]
            changes = whole + [c for i in batch for c in master.fix(i)]

            def alternative(batch: list[int] = batch) -> Change:
                if len(batch) > 1:
                    return master.fix(batch[0])
                return [master.bound(batch[0], 0.0, 0.0)]

            stack.append((changes, alternative))
        else:
            part = y - np.floor(y + 1e-6)
            if not np.any(part > 1e-6):
                sol = _read(master, cur.vals.tolist())
                if _covers(master, sol):
                    return sol, iterations, tuple(chosen)
            if tuple(chosen) != picks:  # a new allocation: placed directly first
                picks = tuple(chosen)
                if small:  # the placer (and the exact test)
                    sol = _from_placer(master, topology, picks, left)
                else:  # the residual packed greedily, else the master MILP for it
                    kept = {j: int(master.lp_lo.get(n + j, 0.0))
                            for j in range(len(master.patterns))}
                    sol = _fill_residual(master, picks, kept)
                    if sol is None:
                        sol = _master_mip(master, min(mip_time_s, left.remaining()),
                                          fixed=True)
                if sol is not None and _covers(master, sol):
                    return sol, iterations, picks
            changes = list(whole)
            for j in np.flatnonzero(y >= 1 - 1e-6).tolist():
                changes.append(master.bound(n + j, float(np.floor(y[j] + 1e-6)), math.inf))
            j = int(np.argmax(np.where(part > 1e-6, part, -1.0)))
            old = master.bound(n + j, float(np.ceil(y[j] - 1e-6)), math.inf)
            changes.append(old)

            def rounded_down(j: int = j, lo: float = float(np.floor(y[j] + 1e-6))) -> Change:
                return [master.bound(n + j, lo, lo)]

            stack.append((changes, rounded_down))
        cur = _generate(master, left, max_iterations, max_columns, **scale)
        iterations += cur.iterations
    return None, iterations, picks


def _fill_residual(master: _Master, picks: Sequence[int], floors: Mapping[int, int],
                   ) -> _Integer | None:
    """The allocation ``picks`` on the patterns' kept domains ``floors`` (pattern index ->
    domains) plus the replicas left over packed greedily into the domains left
    (:func:`_greedy_price` with the shortfall as the most replicas per shape, the fullest
    pattern first). None when they do not all fit."""
    short = [0] * len(master.shapes)
    for i in picks:
        short[int(master.cand_shape[i])] += master.cands[i].replicas
    used = [0] * len(master.types)
    counts = {j: c for j, c in floors.items() if c > 0}
    for j, c in counts.items():
        p = master.patterns[j]
        used[p.kind] += c
        for s, a in p.counts:
            short[s] -= a * c
    for k, dt in enumerate(master.types):
        while used[k] < dt.count:
            need = [max(v, 0) if master.shapes[s].gpu == dt.gpu else 0
                    for s, v in enumerate(short)]
            if not any(need):
                break
            pats = _greedy_price(k, dt, master.shapes, np.array(need, dtype=float), need, 0.0)
            if not pats:
                break
            p = max(pats, key=lambda q: (sum(a * master.shapes[s].tp * master.shapes[s].units
                                             for s, a in q.counts), q.counts))
            master.add(p)
            j = master.seen[(p.kind, p.counts)]
            counts[j] = counts.get(j, 0) + 1
            used[k] += 1
            for s, a in p.counts:
                short[s] -= a
    ys = tuple(sorted(counts.items()))
    obj = math.fsum([master.cands[i].cost for i in picks]
                    + [master.pattern_cost(master.patterns[j]) * c for j, c in ys])
    sol = _Integer(tuple(picks), ys, obj)
    return sol if _covers(master, sol) else None


def _from_placer(master: _Master, topology: Topology, picks: tuple[int, ...],
                 left: Deadline) -> _Integer | None:
    """The candidates ``picks`` placed by the ``hierarchical`` placer (or, where it fails, the
    exact placement test), as patterns (added as columns) and an integer solution; None when
    replicas stay unplaced."""
    return _placed(master, topology, picks, left)[0]


def _placed(master: _Master, topology: Topology, picks: tuple[int, ...], left: Deadline,
            ) -> tuple[_Integer | None, bool]:
    """:func:`_from_placer`, and whether the allocation is proven unplaceable (the exact
    placement test says so for a GPU type)."""
    choice = {master.llms[j]: master.cands[i] for j, i in enumerate(picks)}
    dem = demands(Allocation({m: c.instance for m, c in choice.items()}), master.problem.catalog)
    placement = place(topology, dem, "hierarchical")
    if not placement.complete:
        slots: list[Slot] = []
        for gpu in sorted({d.gpu for d in dem}):
            ex = place_exactly(topology, [d for d in dem if d.gpu == gpu],
                               time_limit_s=min(EXACT_TIME_S, left.remaining()))
            if ex.status != "placed":  # (``unknown`` above 64 GPUs of a type)
                return None, ex.status == "infeasible"
            slots.extend(ex.slots)
        placement = Placement(tuple(slots), (), "hierarchical", "exact")
    return _from_placement(master, picks, placement), False


def _from_placement(master: _Master, picks: tuple[int, ...], placement: Placement,
                    ) -> _Integer | None:
    """A complete placement of the candidates ``picks`` as patterns (one per domain it uses,
    added as columns) and an integer solution; None when a slot is off the domain types."""
    shape_of_llm = {master.llms[j]: int(master.cand_shape[i]) for j, i in enumerate(picks)}
    where: dict[tuple[str, int], tuple[int, int, int]] = {}
    for k, dt in enumerate(master.types):
        for d, (node, gpus) in enumerate(dt.domains):
            for pos, g in enumerate(gpus):
                where[node, g] = (k, d, pos)
    per_domain: dict[tuple[int, int], dict[int, list[int]]] = {}
    for slot in placement.slots:
        s = shape_of_llm[slot.llm]
        for g in slot.gpus:
            if (slot.node, g) not in where:
                return None
            k, d, pos = where[slot.node, g]
            w = per_domain.setdefault((k, d), {}).setdefault(
                s, [0] * len(master.types[k].free))
            w[pos] += 1
    counts: dict[int, int] = {}
    for (k, _), ws in sorted(per_domain.items()):
        p = _make_pattern(k, master.types[k], master.shapes, ws)
        if p is None:
            return None
        master.add(p)
        j = master.seen[(p.kind, p.counts)]
        counts[j] = counts.get(j, 0) + 1
    ys = tuple(sorted(counts.items()))
    obj = math.fsum([master.cands[i].cost for i in picks]
                    + [master.pattern_cost(master.patterns[j]) * c for j, c in ys])
    sol = _Integer(tuple(picks), ys, obj)
    return sol if _covers(master, sol) else None


def _aggregate(problem: PlanningProblem, topology: Topology, master: _Master,
               cset: CandidateSet, left: Deadline, use: bool) -> tuple[float, _Integer | None]:
    """The aggregate MILP over the candidates (with the extra rows): its dual bound (a lower
    bound on every placeable allocation when the topology has no more GPUs of a type than the
    problem's cluster, latency objective only; else −∞), and its allocation placed by the
    placer (or the exact placement test) as a first integer solution (its patterns added as
    columns) when it places. Up to :data:`UNPRUNED_MAX_GPUS` GPUs, an allocation the exact test
    proves unplaceable is forbidden by a no-good row and the MILP solved again (at most
    :data:`AGGREGATE_ROUNDS` times): allocations in cost order, each MILP's optimum still a
    bound, so the first that places is optimal."""
    if not use or left.remaining() <= 0:
        return -math.inf, None
    try:
        plan = solve_min_latency(problem, cset, list(master.extra) or None, deadline=left)
    except TimeLimitReached:
        return -math.inf, None
    if plan.allocation is None:
        return -math.inf, None
    budgets = problem.cluster.budgets()
    valid = (not master.gpu_cost and plan.status in ("optimal", "time_limit")
             and all(n <= budgets.get(g, 0) for g, n in topology.budgets().items()))
    bound = plan.bound_s - problem.constant_s if valid else -math.inf
    if topology.total_gpus > PLACER_MAX_GPUS:  # placers cost seconds there
        return bound, None
    index = {c: i for i, c in enumerate(master.cands)}
    rows = list(master.extra)
    for _ in range(AGGREGATE_ROUNDS):
        picks = tuple(index.get(plan.candidates[m], -1) for m in master.llms)
        if min(picks) < 0:
            return bound, None
        sol, unplaceable = _placed(master, topology, picks, left)
        if sol is not None or not unplaceable or left.remaining() <= 0:
            return bound, sol
        # proven unplaceable: forbid it; the MILP with such rows still bounds every
        # placeable allocation (the aggregate loop's no-good cut)
        rows.append(({c: 1.0 for c in plan.candidates.values()}, len(plan.candidates) - 1.0))
        try:
            plan = solve_min_latency(problem, cset, rows, deadline=left)
        except TimeLimitReached:
            return bound, None
        if plan.allocation is None:  # no allocation left: none is placeable
            return (math.inf if valid and plan.status == "infeasible" else bound), None
        if valid and plan.status == "optimal":
            bound = max(bound, plan.bound_s - problem.constant_s)
    return bound, None


def _per_gpu(master: _Master, p: Pattern) -> dict[int, list[int]]:
    """Pattern ``p``'s per-GPU slice counts (shape index -> count per GPU position)."""
    w: dict[int, list[int]] = {}
    for s, grp in p.groups:
        row = w.setdefault(s, [0] * len(master.types[p.kind].free))
        for g in grp:
            row[g] += 1
    return w


def _recombine(master: _Master, use: Sequence[int], pairs_with: Sequence[int]) -> int:
    """Half-and-half recombinations of patterns (the first half of the GPU positions of one,
    the second half of another, same domain type) added as columns, for every ordered pair of
    ``use`` with at least one in ``pairs_with``; those :func:`_make_pattern` accepts (whole
    TP groups, no GPU overfilled). Returns how many were new."""
    anchor = set(pairs_with)
    added = 0
    for a in use:
        pa = master.patterns[a]
        wa = _per_gpu(master, pa)
        width = len(master.types[pa.kind].free)
        h = width // 2
        for b in use:
            pb = master.patterns[b]
            if a == b or pb.kind != pa.kind or (a not in anchor and b not in anchor) or h == 0:
                continue
            wb = _per_gpu(master, pb)
            zero = [0] * width
            w = {s: wa.get(s, zero)[:h] + wb.get(s, zero)[h:] for s in sorted(set(wa) | set(wb))}
            p = _make_pattern(pa.kind, master.types[pa.kind], master.shapes, w)
            if p is not None and master.add(p):
                added += 1
    return added


def _recombined(master: _Master, left: Deadline, root_vals: np.ndarray, best: _Integer,
                bound: float, const: float, mip_time_s: float, stats: dict[str, Any],
                ) -> _Integer:
    """An improvement step while ``best`` is more than :data:`RECOMBINE_GAP` above ``bound``
    (at most :data:`RECOMBINE_ROUNDS` rounds): the patterns of the root LP and of ``best``
    recombined (:func:`_recombine`; later rounds: pairs with a pattern of the new best plan),
    then the master MILP again, started from ``best``. Deterministic up to the MILP's time
    limit."""
    n = master.n_fixed
    support = [j for j in range(len(master.patterns))
               if n + j < len(root_vals) and root_vals[n + j] > 1e-6]
    anchor = sorted(set(support) | {j for j, _ in best.ys})
    for _ in range(RECOMBINE_ROUNDS):
        if (best.objective + const <= (1.0 + RECOMBINE_GAP) * (bound + const)
                or left.remaining() <= 0):
            break
        use = sorted(set(support) | {j for j, _ in best.ys})
        if not _recombine(master, use, anchor):
            break
        again = _master_mip(master, min(mip_time_s, left.remaining()), hint=best)
        stats["recombined"] = again.objective + const if again is not None else None
        if again is None or not _covers(master, again) or again.objective >= best.objective:
            break
        best = again
        anchor = sorted({j for j, _ in best.ys})
    return best


def solve_patterns(problem: PlanningProblem, topology: Topology, *,
                   deadline: Deadline | None = None, cset: CandidateSet | None = None,
                   gpu_cost: Mapping[str, float] | None = None, extra: Sequence[Row] | None = None,
                   max_columns: int = 20000, max_iterations: int = 1000,
                   mip_time_s: float = MIP_TIME_S, dive: bool = True, aggregate: bool = True,
                   exact_candidates: bool | None = None,
                   blocks_start: PlacedPlan | None = None) -> PatternResult:
    """The cheapest placeable plan by column generation and price-and-branch (module
    docstring), with its proven bound and gap. ``gpu_cost``: per GPU type, a cost per GPU a
    pattern opens (min-cost objective; default none: min latency); ``extra``: rows
    ``Σ coeff·x_c ≤ rhs``; ``cset``: the candidates (default: every candidate up to 64 GPUs,
    the reduced ones above; ``exact_candidates`` says whether a given ``cset`` is every
    candidate); ``mip_time_s``: each master MILP at most this long; ``dive``: run the diving
    heuristic; ``aggregate``: start from the aggregate MILP's allocation where it places, and
    bound by its optimum; ``blocks_start``: a placed blocks plan
    (:func:`scepsy_place.formulations.loop.plan_blocks`) whose candidates join the set and whose placement
    is the first plan (computed here from 65 to 1,024 GPUs when not given)."""
    run = _PatternRun(problem, topology, Deadline.of(problem, deadline), time.perf_counter(),
                      dict(gpu_cost or {}), list(extra or []), max_columns, max_iterations,
                      mip_time_s)
    try:
        if cset is None:
            cset, exact = _candidate_set(problem, run.left)
        else:
            exact = bool(exact_candidates)
    except TimeLimitReached:
        return _no_plan(problem, "time_limit_no_solution", run.t0,
                        time_limit_detail(run.left.limit_s))
    if cset.unfit or any(not cset.by_llm.get(m) for m in problem.llms):
        return _no_plan(problem, "infeasible", run.t0, "an LLM has no candidate (its model fits "
                        "no GPU of the cluster at any TP degree and share)", exact=exact)
    run.cset, run.exact = cset, exact
    blocks_plan = run.blocks_start(blocks_start, aggregate)
    master = run.master(blocks_plan)
    ended = run.root(master, blocks_plan, aggregate)
    if ended is not None:
        return ended
    best = run.search(master, dive)
    lb = run.bound + run.const if math.isfinite(run.bound) else run.bound
    if best is None and not run.costs and not run.extra and run.left.remaining() > 0:
        fallback = run.blocks_fallback(master, blocks_plan, lb)
        if (fallback is not None and blocks_plan is None and not run.small
                and run.left.remaining() > 0):
            # nothing found with these candidates: again with the blocks plan's added
            # (a start that columns and dives can improve on)
            retry = solve_patterns(problem, topology, deadline=run.left, cset=cset,
                                   gpu_cost=gpu_cost, extra=extra, max_columns=max_columns,
                                   max_iterations=max_iterations, mip_time_s=mip_time_s,
                                   dive=dive, aggregate=aggregate,
                                   exact_candidates=exact_candidates,
                                   blocks_start=fallback.blocks)
            if retry.plan.allocation is not None and retry.objective < fallback.result.objective:
                return replace(retry, seconds=time.perf_counter() - run.t0)
        if fallback is not None:
            return fallback.result
    if best is None:
        return run.no_plan(master, lb)
    return _result(problem, topology, master, best, lb, run.const, exact,
                   bool(run.stats["converged"]), run.iterations, run.left, run.t0, run.stats)


@dataclass(frozen=True)
class _Fallback:
    """The blocks plan as a pattern result, and the blocks plan itself (a start for a retry)."""

    result: PatternResult
    blocks: PlacedPlan


@dataclass
class _PatternRun:
    """The state of one :func:`solve_patterns`: what it was asked, the candidates, the root
    bound and the iterations so far, the best integer plan's start and the statistics, filled
    in by its stages (a start from the blocks plan, the master and its first columns, the root
    LP, the search for an integer plan, the fallback to the blocks plan)."""

    problem: PlanningProblem
    topology: Topology
    left: Deadline
    t0: float
    costs: dict[str, float]
    extra: list[Row]
    max_columns: int
    max_iterations: int
    mip_time_s: float
    cset: CandidateSet = field(init=False)
    exact: bool = True
    stats: dict[str, Any] = field(default_factory=dict)
    agg_bound: float = math.inf
    bound: float = math.inf
    iterations: int = 0
    root_lp: _CG | None = None
    start: _Integer | None = None
    hopeless: bool = False

    @property
    def llms(self) -> list[str]:
        return sorted(self.problem.llms)

    @property
    def const(self) -> float:
        """The constant (tool time) every min-latency objective carries; none with costs."""
        return self.problem.constant_s if not self.costs else 0.0

    @property
    def small(self) -> bool:
        return self.topology.total_gpus <= UNPRUNED_MAX_GPUS

    @property
    def scale(self) -> dict[str, Any]:
        """Column generation's settings above UNPRUNED_MAX_GPUS (approximate pricing)."""
        return {} if self.small else {
            "tail_rel": TAIL_REL, "rel": CG_REL, "price_s": PRICE_LARGE_S, "price_gap": 1e-2,
            "price_top": PRICE_TOP}

    def blocks_start(self, given: PlacedPlan | None, aggregate: bool) -> PlacedPlan | None:
        """The blocks plan (itself a pattern solution) as a start: its candidates join the
        set (computed from 65 to 1,024 GPUs when not given)."""
        if (given is None and aggregate and not self.costs and not self.extra
                and UNPRUNED_MAX_GPUS < self.topology.total_gpus <= PLACER_MAX_GPUS
                and self.left.remaining() > 0):
            found = plan_blocks(self.problem, self.topology, self.left)
            return found if found.placed else None
        return given

    def master(self, blocks_plan: PlacedPlan | None) -> _Master:
        """The restricted master over the candidates' shapes, with one filled pattern per
        domain type and shape as its first columns."""
        llms, cset, problem = self.llms, self.cset, self.problem
        by_llm = {m: tuple(cset.by_llm[m]) for m in llms}
        if blocks_plan is not None:
            for m, c in blocks_plan.plan.candidates.items():
                if c not in by_llm[m]:
                    by_llm[m] += (c,)
        cands = [c for m in llms for c in by_llm[m]]
        shape_index: dict[tuple[Any, ...], int] = {}
        shapes: list[Shape] = []
        cand_shape = []
        for c in cands:
            key = (c.llm, c.gpu, c.tp, c.share, c.memory_share)
            if key not in shape_index:
                shape_index[key] = len(shapes)
                shapes.append(shape_of(c, problem))
            cand_shape.append(shape_index[key])
        most = [0] * len(shapes)
        for c, s in zip(cands, cand_shape, strict=True):
            most[s] = max(most[s], c.replicas)
        types = domain_types(self.topology)
        big = 10.0 * (math.fsum(max(abs(c.cost) for c in cset.by_llm[m]) for m in llms) + 1.0
                      + math.fsum(self.costs.get(dt.gpu, 0.0) * dt.count * len(dt.free)
                                  for dt in types))
        owner = {m: j for j, m in enumerate(llms)}
        master = _Master(problem, llms, cands, np.array(cand_shape, dtype=np.int64),
                         np.array([owner[c.llm] for c in cands], dtype=np.int64), shapes, types,
                         list(self.extra), self.costs, big, most)
        master.build()
        for k, dt in enumerate(types):
            for s in range(len(shapes)):
                if shapes[s].gpu == dt.gpu:
                    p = _fill(k, dt, shapes, s, most[s])
                    if p is not None:
                        master.add(p)
        self.stats.update({"domain_types": len(types), "shapes": len(shapes),
                           "candidates": len(cands), "solver": SOLVER,
                           "candidates_generated": cset.generated,
                           "candidates_kept": len(cands)})
        return master

    def root(self, master: _Master, blocks_plan: PlacedPlan | None,
             aggregate: bool) -> PatternResult | None:
        """The starts (the aggregate MILP's placed allocation, the blocks plan) and the root
        LP by column generation, with its phase 1 where artificials remain; a result when
        that already ends the search (no placeable allocation)."""
        problem, stats, const, left = self.problem, self.stats, self.const, self.left
        agg_bound, start = _aggregate(problem, self.topology, master, self.cset, left,
                                      aggregate)
        stats["aggregate_placed"] = start.objective + const if start is not None else None
        if blocks_plan is not None and blocks_plan.placed and blocks_plan.placement is not None:
            index = {c: i for i, c in enumerate(master.cands)}
            picks = tuple(index[blocks_plan.plan.candidates[m]] for m in self.llms)
            found = _from_placement(master, picks, blocks_plan.placement)
            stats["blocks_start"] = found.objective + const if found is not None else None
            if found is not None and (start is None or found.objective < start.objective):
                start = found
        stats["aggregate_bound"] = agg_bound + const if math.isfinite(agg_bound) else None
        self.agg_bound, self.start = agg_bound, start
        if agg_bound == math.inf:
            return _no_plan(problem, "infeasible" if self.exact else "no_solution", self.t0,
                            "no allocation of the candidates is placeable: the exact placement "
                            "test rejects every one that fits the GPU budgets", exact=self.exact,
                            bound=math.inf, stats=stats)
        # the root LP: solved to optimality (exact pricing) up to PLACER_MAX_GPUS GPUs
        root_scale = self.scale if self.topology.total_gpus > PLACER_MAX_GPUS else {}
        root = _generate(master, left, self.max_iterations, self.max_columns, lower=agg_bound,
                         **root_scale)
        stats["cg_bound"] = root.bound + const if math.isfinite(root.bound) else None
        bound, iterations = max(root.bound, agg_bound), root.iterations
        for _ in range(3):  # artificials left at convergence: feasible (a larger penalty) or not?
            if not (root.converged and root.artificial > 1e-6):
                break
            master.set_phase1(True)
            one = _generate(master, left, self.max_iterations, self.max_columns, stop_at=1e-7)
            iterations += one.iterations
            master.set_phase1(False, master.big * 1e3)
            if one.bound > 1e-7 and not self.exact:  # proven for these candidates only: go on
                stats["candidates_unplaceable"] = True  # to the blocks plan, bounded by the
                bound = agg_bound  # aggregate
                break
            if one.bound > 1e-7:
                stats.update(columns=len(master.patterns), iterations=iterations)
                return _no_plan(problem, "infeasible", self.t0, "no placeable allocation of the "
                                "candidates: even a fractional covering of their replicas by "
                                "patterns needs more domains than the topology has (proven)",
                                exact=self.exact, bound=math.inf, iterations=iterations,
                                columns=len(master.patterns), stats=stats)
            if not one.converged:
                break
            root = _generate(master, left, self.max_iterations, self.max_columns)
            iterations += root.iterations
            bound = max(bound, root.bound)
        stats.update(root_iterations=iterations, root_columns=len(master.patterns),
                     converged=root.converged, root_lp=(root.z + const) if root.ok else None,
                     root_s=time.perf_counter() - self.t0)
        self.bound, self.iterations, self.root_lp = bound, iterations, root
        self.hopeless = bool(stats.get("candidates_unplaceable"))
        return None

    def proven(self, sol: _Integer | None) -> bool:
        return (sol is not None
                and sol.objective - self.bound <= OPT_REL * abs(sol.objective) + OPT_ABS)

    def search(self, master: _Master, dive: bool) -> _Integer | None:
        """The best integer plan: the start, improved by dives, a MIP over the generated
        columns and recombination."""
        root = self.root_lp
        assert root is not None
        left, stats, const, small = self.left, self.stats, self.const, self.small
        best = self.start
        if dive and not self.proven(best) and not self.hopeless and left.remaining() > 0 \
                and root.ok:
            fast = {**self.scale, "exact": False} if not small else self.scale  # greedy pricing
            found = None
            for reserve in RESERVES if not small else RESERVES[:1]:
                found, it, _ = _dive(master, self.topology, left, self.max_iterations,
                                     self.max_columns, root, small=small,
                                     mip_time_s=self.mip_time_s, scale=fast, reserve=reserve)
                self.iterations += it
                master.reset()
                if found is not None and (best is None or found.objective < best.objective):
                    best = found
                if found is not None or left.remaining() <= 0:
                    break
                root = _generate(master, left, self.max_iterations, self.max_columns, **fast)
                self.iterations += root.iterations
            stats["dive"] = found.objective + const if found is not None else None
            if found is not None and (best is None or found.objective < best.objective):
                best = found
        if not self.proven(best) and not self.hopeless and left.remaining() > 0:
            again = _master_mip(master, min(self.mip_time_s, left.remaining()), hint=best)
            if again is not None and _covers(master, again) and (
                    best is None or again.objective < best.objective):
                best = again
            stats["mip"] = again.objective + const if again is not None else None
        if best is not None and not self.hopeless and root.ok \
                and self.topology.total_gpus <= PLACER_MAX_GPUS:
            best = _recombined(master, left, root.vals, best, self.bound, const,
                               self.mip_time_s, stats)
        stats.update(columns=len(master.patterns), iterations=self.iterations)
        return best

    def blocks_fallback(self, master: _Master, blocks_plan: PlacedPlan | None,
                        lb: float) -> _Fallback | None:
        """The blocks plan, a pattern solution too, when nothing was found (None: it did not
        place either)."""
        # the blocks plan may use candidates outside a reduced set: the aggregate bound only
        glb = lb if self.exact else (self.agg_bound + self.const
                                     if math.isfinite(self.agg_bound) else -math.inf)
        blocks = blocks_plan or plan_blocks(self.problem, self.topology, self.left)
        res = _blocks(self.problem, self.topology, blocks, glb, self.exact, self.iterations,
                      len(master.patterns), self.t0, dict(self.stats))
        return None if res is None else _Fallback(res, blocks)

    def no_plan(self, master: _Master, lb: float) -> PatternResult:
        """No integer plan: out of time, or none of the generated patterns (not proven)."""
        if self.left.remaining() <= 0:
            return _no_plan(self.problem, "time_limit_no_solution", self.t0,
                            time_limit_detail(self.left.limit_s), exact=self.exact, bound=lb,
                            iterations=self.iterations, columns=len(master.patterns),
                            stats=self.stats)
        return _no_plan(self.problem, "no_solution", self.t0, "no integer plan of the generated "
                        "patterns was found (not proven infeasible)", exact=self.exact, bound=lb,
                        iterations=self.iterations, columns=len(master.patterns),
                        stats=self.stats)


def _blocks(problem: PlanningProblem, topology: Topology, res: PlacedPlan, lb: float,
            exact: bool, iterations: int, columns: int, t0: float, stats: dict[str, Any],
            ) -> PatternResult | None:
    """The blocks formulation's placed plan ``res`` (:func:`scepsy_place.formulations.loop.plan_blocks`: one
    LLM shape per GPU, itself a pattern solution) as a result; None when it did not place."""
    if not res.placed or res.plan.allocation is None or res.placement is None:
        return None
    dem = demands(res.plan.allocation, problem.catalog)
    placement = replace(res.placement, policy="patterns", placed_by="blocks")
    if violations(topology, dem, placement):
        return None
    obj = res.plan.objective_s
    gap = max(obj / lb - 1.0, 0.0) if lb > 0 else math.inf
    stats.update(objective=obj, lp_bound=lb, gap=gap, fallback="blocks",
                 gpus_used=placement.gpus_used(), total_s=time.perf_counter() - t0)
    plan = plan_from_choice(problem, "milp", "heuristic", res.plan.candidates, stats,
                            bound_s=min(lb, obj))
    return PatternResult(plan, placement, lb, "feasible", gap, columns, iterations,
                         time.perf_counter() - t0, obj, exact, False, None,
                         MappingProxyType(stats))


def _result(problem: PlanningProblem, topology: Topology, master: _Master, best: _Integer,
            lb: float, const: float, exact: bool, converged: bool, iterations: int,
            left: Deadline, t0: float, stats: dict[str, Any]) -> PatternResult:
    """The result of an integer solution: placed, priced, checked."""
    choice = {master.llms[j]: master.cands[i] for j, i in enumerate(best.picks)}
    want = {int(master.cand_shape[i]): master.cands[i].replicas for i in best.picks}
    placement = _place(master, want, [(master.patterns[j], c) for j, c in best.ys])
    dem = demands(Allocation({m: c.instance for m, c in choice.items()}), problem.catalog)
    bad = violations(topology, dem, placement) if placement is not None else ["not placed"]
    if bad:
        return _no_plan(problem, "no_solution", t0, f"internal: placement invalid ({bad[0]})",
                        exact=exact, bound=lb, iterations=iterations,
                        columns=len(master.patterns), stats=stats)
    placement = cast(Placement, placement)  # bad says "not placed" when it is None
    used = sorted({(s.node, g) for s in placement.slots for g in s.gpus})
    gpu_of = {n.name: n.gpu for n in topology.nodes}
    obj = math.fsum([choice[m].cost for m in sorted(choice)]
                    + [master.gpu_cost.get(gpu_of[nd], 0.0) for nd, _ in used]) + const
    proven = obj - lb <= OPT_REL * abs(obj) + OPT_ABS
    gap = 0.0 if proven else (obj / lb - 1.0 if lb > 0 else math.inf)
    status: PatternStatus = "optimal" if proven else "feasible"
    plan_status = "optimal" if proven else ("time_limit" if left.remaining() <= 0
                                            else "heuristic")
    stats.update(objective=obj, lp_bound=lb, gap=gap, gpus_used=len(used),
                 total_s=time.perf_counter() - t0)
    plan = plan_from_choice(problem, "milp", plan_status, choice,  # type: ignore[arg-type]
                            stats, bound_s=lb if not master.gpu_cost else None)
    return PatternResult(plan, placement, lb, status, gap, len(master.patterns), iterations,
                         time.perf_counter() - t0, obj, exact, converged, None,
                         MappingProxyType(stats))


def _place(master: _Master, want: Mapping[int, int], ys: Sequence[tuple[Pattern, int]],
           ) -> Placement | None:
    """The chosen patterns on concrete domains of their type (canonical node order), replicas
    of each shape (``want``: shape index -> replicas) numbered in that order; surplus replicas
    dropped. None when they do not cover ``want``."""
    nxt = dict.fromkeys(want, 0)
    used = [0] * len(master.types)
    slots: list[Slot] = []
    for p, count in ys:
        dt = master.types[p.kind]
        for _ in range(count):
            if used[p.kind] >= dt.count:
                return None
            node, gpus = dt.domains[used[p.kind]]
            used[p.kind] += 1
            for s, grp in p.groups:
                if s not in want or nxt[s] >= want[s]:
                    continue
                sh = master.shapes[s]
                slots.append(Slot(sh.llm, nxt[s], node, tuple(sorted(gpus[g] for g in grp)),
                                  sh.share, sh.memory_gib))
                nxt[s] += 1
    if any(nxt[s] < want[s] for s in want):
        return None
    return Placement(tuple(slots), (), "patterns", "patterns")


def _no_plan(problem: PlanningProblem, status: PatternStatus, t0: float, why: str, *,
             exact: bool = True, bound: float = -math.inf, iterations: int = 0, columns: int = 0,
             stats: Mapping[str, Any] | None = None) -> PatternResult:
    """A result without a plan."""
    plan = time_limit_plan("milp", stats) if status == "time_limit_no_solution" else (
        no_allocation_plan(optimiser="milp",
                           status="infeasible" if status == "infeasible" else "unplaced",
                           stats=MappingProxyType(dict(stats or {}))))
    return PatternResult(plan, None, bound, status, math.inf, columns, iterations,
                         time.perf_counter() - t0, math.inf, exact, False, why,
                         MappingProxyType(dict(stats or {})))


def plan_patterns(problem: PlanningProblem, topology: Topology,
                  deadline: Deadline | None = None, **kw: Any) -> PlacedPlan:
    """The pattern formulation's placed plan (:func:`solve_patterns`) as the loop's
    :class:`~scepsy_place.formulations.loop.PlacedPlan` (formulation and placer ``patterns``)."""
    res = solve_patterns(problem, topology, deadline=deadline, **kw)
    latency = not kw.get("gpu_cost")  # the bound is in the plan's units (else a price)
    lp = res.lp_bound_s if latency and math.isfinite(res.lp_bound_s) else None
    history = ({"round": 1, "objective_s": res.plan.objective_s, "unplaced": 0,
                "lp_bound_s": lp, "cost_objective": None if latency else res.objective,
                "cost_bound": None if latency else res.lp_bound_s, "status": res.status,
                "gap": res.gap, "columns": res.columns, "iterations": res.iterations},)
    bound = lp if lp is not None and lp > 0 else None
    if res.placement is not None and res.plan.allocation is not None:
        dem = demands(res.plan.allocation, problem.catalog)
        return PlacedPlan(plan=res.plan, placement=res.placement, rounds=1, history=history,
                          quality=quality(topology, res.placement, dem), reason=None,
                          exact=res.exact and res.status == "optimal", formulation="patterns",
                          bound_s=bound,
                          seconds=res.seconds)
    loop_status = {"infeasible": "infeasible", "time_limit_no_solution": "time_limit"}.get(
        res.status, "unplaced")
    return PlacedPlan(plan=res.plan, placement=None, rounds=1, history=history, quality=None,
                      reason=res.reason or res.status,
                      exact=res.exact and res.status == "infeasible", formulation="patterns",
                      status=loop_status, seconds=res.seconds)  # type: ignore[arg-type]
