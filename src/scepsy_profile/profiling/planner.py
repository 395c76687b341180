"""The sweep planner: which (tp, share, phase, batch, tokens) points to measure next.

INTERFACE (implemented by the planner owner; the sweep runner relies on exactly this):

    spec = SweepSpec(tps=(1,), shares=(1.0,), max_batch=64, max_tokens=1024, target_error=0.05)
    pts = next_points(spec, done, budget_points=10)

``done`` is every record already in the store for this sweep (ok and failed); the result is at
most ``budget_points`` new points (never one whose key is in ``done``), coarse lattice first,
then refinement where the curve's leave-one-out error (below) is largest; an empty result
means the sweep is finished (every curve at its target or out of lattice cells). Records of
curves that are not the spec's (another tp, share or phase) are ignored; records of more than one
(engine, model, scale, device) are an :class:`InputError` (the caller passes one sweep's).

**Curves and the lattice.** A sweep has one curve per (tp, share, phase) of the spec. Each curve's
candidates are the same (batch, tokens) lattice: batch ``1, 2, 4, ... max_batch`` and tokens
``min_tokens, 2·min_tokens, ... max_tokens`` (the end values are always included; for decode,
tokens is the context length), plus, with ``half_steps``, the rounded geometric midpoint
``round(√(a·c))`` of every two neighbouring values (the rule :mod:`scepsy_profile.fitted` uses for
its table nodes, so refined points are table nodes). ``max_batch_tokens`` drops the cells whose
``batch · tokens`` is above it (memory: tokens of one prefill pass, KV tokens of a decode step).

**Coarse design.** Until a curve holds ``coarse_points`` measured (ok) points, the planner walks
a fixed space-filling order of its lattice, in log2 coordinates scaled to the unit square: the four
corners first, then greedy max-min distance (the centre, the edge midpoints, ...), the
whole-power-of-two cells before the half steps. A failed point does not count, so the walk goes
on past it. Every curve gets MIN_CURVE_POINTS (5, enough to fit) before any gets more, so a small
``max_points`` still leaves every curve fittable. No refinement point is proposed while any
curve still needs coarse points.

**Refinement and the error estimate.** The planner does *not* run
:func:`scepsy_profile.fitted.fit_curve` / ``cross_validate`` (the pipeline that ``scepsy profile
fit`` uses) inside its loop: k-fold cross-validation of that pipeline costs 0.1-0.3 s per curve
and call, and a model fitted globally blurs a local kink over the whole curve. It uses a cheaper,
local leave-one-out estimate instead (after LOLA-Voronoi, Crombecq et al. 2011): each measured
cell's log latency is predicted by a least-squares plane, in the scaled (log2 batch, log2 tokens)
square, through its ``_NEIGHBOURS`` nearest measured cells (ties included) without it. A power law
is a plane there, so the error is zero where latency is a power law and large where the curve
bends (the floor-to-work transition, a kink, a cliff); it falls as points get denser there. It is
a pessimistic stand-in for the fitted pipeline's cross-validated error (which also models the
curvature): on the physics form the planner stops at a few percent while the fitted pipeline
predicts the held-out cells far better (tests/scepsy_profile/test_profile_planner.py). The curve's error is the
``error_quantile`` (default: the median) of those absolute percentage errors; a curve whose
error is at most ``target_error`` is finished. The median lets a kink that only a few cells see
pass; ``error_quantile=0.75`` or ``0.9`` refines it too, at the cost of more points. The
unfinished curves are refined worst first, ``refine_batch`` points each per call: the open cell
with the largest ``e(p) · d(q, p)``, where ``p`` is the measured cell nearest to the candidate
``q`` and ``e(p)`` its leave-one-out error, so new points land between the worst-predicted cells
and their neighbours; a chosen cell joins the measured set, with its neighbour's error, before
the next choice.

**Failures.** A failed record's key is done for the planner (the runner retries separately);
a key with both a failed and an ok record counts as ok. With ``prune_failed`` a cell at least as
large in batch and in tokens as a failed cell of the same curve is not proposed either: running
out of memory or time is monotone in both.

Deterministic: the same spec and records (in any order) give the same points; nothing reads the
clock or an unseeded random source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise, product
from typing import TypeGuard

import numpy as np
from numpy.typing import NDArray

from scepsy_common.errors import InputError
from scepsy_profile.measurements import MAX_BATCH, MAX_TOKENS, MIN_CURVE_POINTS, PHASES, Phase
from scepsy_profile.profiling.backend import StepPoint
from scepsy_profile.profiling.records import ProfileRecord

SOURCE = "sweep"
"""The ``source`` of the planner's :class:`InputError`\\ s."""

_NEIGHBOURS = 6
"""Measured neighbours of a cell that its leave-one-out plane is fitted to (ties included)."""

CurveId = tuple[int, float, Phase]
"""One curve of a sweep: (tp, share, phase)."""
Cell = tuple[int, int]
"""One lattice cell of a curve: (batch, tokens)."""


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """A point of a sweep: the instance (tp, share) and the step."""

    tp: int
    share: float
    step: StepPoint


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_in(name: str, v: object, lo: int, hi: int) -> int:
    if not (_is_int(v) and lo <= v <= hi):
        raise InputError(SOURCE, name, f"an integer in [{lo}, {hi}]", v)
    return int(v)


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """What a sweep measures and when it is finished (see the module doc)."""

    tps: tuple[int, ...]
    shares: tuple[float, ...]
    phases: tuple[Phase, ...] = ("prefill", "decode")
    max_batch: int = 64
    max_tokens: int = 1024
    min_tokens: int = 16
    target_error: float = 0.05
    """Per curve: the leave-one-out absolute percentage error (a fraction) to reach, at the
    ``error_quantile`` of the curve's points (the median by default)."""
    max_points: int | None = None
    """The most points of the sweep in all (done records included); None: no limit."""
    coarse_points: int = 9
    """Measured points per curve before any refinement (at least MIN_CURVE_POINTS)."""
    refine_batch: int = 4
    """The most refinement points per curve in one call."""
    half_steps: bool = True
    """Whether the geometric midpoints of the lattice are candidates too."""
    max_batch_tokens: int | None = None
    """Cells with batch · tokens above this are left out; None: none are."""
    prune_failed: bool = True
    """Skip cells at least as large (batch and tokens) as a failed cell of the same curve."""
    error_quantile: float = 0.5
    """Which quantile of a curve's leave-one-out errors is its error (0.5: the median; 0.9 also
    refines a kink that only a tenth of the points see)."""
    _axes: tuple[tuple[int, ...], tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        tps = tuple(self.tps) if isinstance(self.tps, (list, tuple)) else ()
        if not tps or not all(_is_int(t) and 1 <= t <= 1024 for t in tps) or len(set(tps)) < len(tps):
            raise InputError(SOURCE, "tps", "distinct integers in [1, 1024], at least one", self.tps)
        set_(self, "tps", tps)
        shares = tuple(self.shares) if isinstance(self.shares, (list, tuple)) else ()
        if not shares or not all(isinstance(s, (int, float)) and not isinstance(s, bool)
                                 and math.isfinite(s) and 0 < s <= 1 for s in shares):
            raise InputError(SOURCE, "shares", "numbers in (0, 1], at least one", self.shares)
        shares = tuple(round(float(s), 9) for s in shares)
        if len(set(shares)) < len(shares):
            raise InputError(SOURCE, "shares", "distinct shares", self.shares)
        set_(self, "shares", shares)
        phases = tuple(self.phases) if isinstance(self.phases, (list, tuple)) else ()
        if not phases or any(p not in PHASES for p in phases) or len(set(phases)) < len(phases):
            raise InputError(SOURCE, "phases", "distinct phases among prefill, decode", self.phases)
        set_(self, "phases", phases)
        _int_in("max_batch", self.max_batch, 1, MAX_BATCH)
        _int_in("min_tokens", self.min_tokens, 1, MAX_TOKENS)
        _int_in("max_tokens", self.max_tokens, self.min_tokens, MAX_TOKENS)
        if not (isinstance(self.target_error, (int, float)) and not isinstance(self.target_error, bool)
                and math.isfinite(self.target_error) and 0 < self.target_error < 1):
            raise InputError(SOURCE, "target_error", "a fraction in (0, 1) (0.05 = 5%)",
                             self.target_error)
        if self.max_points is not None:
            _int_in("max_points", self.max_points, 1, 10**9)
        _int_in("coarse_points", self.coarse_points, MIN_CURVE_POINTS, 10**6)
        _int_in("refine_batch", self.refine_batch, 1, 10**6)
        if not isinstance(self.half_steps, bool):
            raise InputError(SOURCE, "half_steps", "true or false", self.half_steps)
        if not isinstance(self.prune_failed, bool):
            raise InputError(SOURCE, "prune_failed", "true or false", self.prune_failed)
        q = self.error_quantile
        if not (isinstance(q, (int, float)) and not isinstance(q, bool) and 0 <= q <= 1):
            raise InputError(SOURCE, "error_quantile", "a number in [0, 1] (0.5: the median)", q)
        if self.max_batch_tokens is not None:
            _int_in("max_batch_tokens", self.max_batch_tokens, 1, MAX_BATCH * MAX_TOKENS)
        set_(self, "_axes", (_axis(1, self.max_batch, self.half_steps),
                             _axis(self.min_tokens, self.max_tokens, self.half_steps)))
        n = len(self.lattice())
        if n < MIN_CURVE_POINTS:
            raise InputError(SOURCE, "max_batch, min_tokens, max_tokens, max_batch_tokens",
                             f"a lattice of at least {MIN_CURVE_POINTS} (batch, tokens) cells per "
                             "curve (a curve is fitted from that many)", n)

    def curves(self) -> tuple[CurveId, ...]:
        """Every curve of the sweep, in (tp, share, phase) order of the spec."""
        return tuple(product(self.tps, self.shares, self.phases))

    def lattice(self) -> tuple[Cell, ...]:
        """The candidate (batch, tokens) cells of every curve, sorted."""
        return _lattice(self)


def _axis(lo: int, hi: int, half_steps: bool) -> tuple[int, ...]:
    """``lo, 2·lo, 4·lo, ...`` up to ``hi`` (``hi`` included), plus the rounded geometric
    midpoints of neighbours when ``half_steps``."""
    vals = [lo]
    while vals[-1] * 2 <= hi:
        vals.append(vals[-1] * 2)
    if vals[-1] != hi:
        vals.append(hi)
    out = set(vals)
    if half_steps:
        out |= {m for a, c in pairwise(vals) if a < (m := round(math.sqrt(a * c))) < c}
    return tuple(sorted(out))


@lru_cache(maxsize=64)
def _lattice(spec: SweepSpec) -> tuple[Cell, ...]:
    bs, ns = spec._axes
    cap = spec.max_batch_tokens
    return tuple((b, n) for b in bs for n in ns if cap is None or b * n <= cap)


def _scaled(spec: SweepSpec, cells: Sequence[Cell]) -> NDArray[np.float64]:
    """Cells in log2 coordinates scaled to the unit square (a degenerate axis maps to 0)."""
    arr = np.array(cells, dtype=float).reshape(-1, 2)
    spans = (math.log2(spec.max_batch), math.log2(spec.max_tokens / spec.min_tokens))
    x = np.log2(arr[:, 0]) / spans[0] if spans[0] > 0 else np.zeros(len(arr))
    y = np.log2(arr[:, 1] / spec.min_tokens) / spans[1] if spans[1] > 0 else np.zeros(len(arr))
    return np.stack([x, y], axis=1)


@lru_cache(maxsize=64)
def _coarse_order(spec: SweepSpec) -> tuple[Cell, ...]:
    """Every lattice cell in the coarse design's order: corners, then greedy max-min distance
    (ties: nearer the centre, then smaller cell), whole powers of two before half steps."""
    cells = spec.lattice()
    main_b = set(_axis(1, spec.max_batch, False))
    main_n = set(_axis(spec.min_tokens, spec.max_tokens, False))
    main = [c for c in cells if c[0] in main_b and c[1] in main_n]
    half = [c for c in cells if not (c[0] in main_b and c[1] in main_n)]
    order: list[Cell] = []
    for group in (main, half):
        pts = _scaled(spec, group)
        left = list(range(len(group)))
        if not order:  # the corners: the cells nearest to the unit square's corners
            for corner in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0)):
                d = np.hypot(pts[left, 0] - corner[0], pts[left, 1] - corner[1])
                # (ignore: mypy checks the key before it infers j: int, and numpy's overloads
                # then read d[j] as an array)
                i = left[min(range(len(left)), key=lambda j: (round(d[j], 12), group[left[j]]))]  # type: ignore[call-overload]
                if group[i] not in order:
                    order.append(group[i])
                    left.remove(i)
        chosen = _scaled(spec, order) if order else np.zeros((0, 2))
        while left:
            sub = pts[left]
            if len(chosen):
                gap = np.min(np.hypot(sub[:, None, 0] - chosen[None, :, 0],
                                      sub[:, None, 1] - chosen[None, :, 1]), axis=1)
            else:
                gap = np.zeros(len(left))
            centre = np.hypot(sub[:, 0] - 0.5, sub[:, 1] - 0.5)
            j = min(range(len(left)),  # (ignore: as for the corners above)
                    key=lambda k: (-round(gap[k], 12), round(centre[k], 12), group[left[k]]))  # type: ignore[call-overload]
            order.append(group[left[j]])
            chosen = np.vstack([chosen, sub[j : j + 1]])
            left.pop(j)
    return tuple(order)


# --------------------------------------------------------------------------- observed records
@dataclass(frozen=True)
class _Curve:
    """What ``done`` holds for one curve."""

    ok: dict[Cell, float]  # mean log latency per measured cell
    done: frozenset[Cell]  # every cell with a record (ok or failed)
    failed: frozenset[Cell]  # cells with only failed records


def _gather(spec: SweepSpec, done: Sequence[ProfileRecord]) -> dict[CurveId, _Curve]:
    """The records of each curve of ``spec`` (records of other curves are ignored)."""
    idents = {(r.engine, r.model, round(float(r.scale), 9), r.device) for r in done}
    if len(idents) > 1:
        raise InputError(SOURCE, "done", "records of one engine, model, scale and device "
                         f"(a store per sweep); got {len(idents)}: {sorted(idents)[:3]}")
    wanted = set(spec.curves())
    logs: dict[CurveId, dict[Cell, list[float]]] = {c: {} for c in spec.curves()}
    cells: dict[CurveId, set[Cell]] = {c: set() for c in spec.curves()}
    for r in done:
        cid: CurveId = (int(r.tp), round(float(r.share), 9), r.phase)
        if cid not in wanted:
            continue
        cell = (int(r.batch), int(r.tokens))
        cells[cid].add(cell)
        if r.status == "ok" and r.latency_ms is not None and r.latency_ms > 0:
            logs[cid].setdefault(cell, []).append(math.log(r.latency_ms))
    out = {}
    for cid in spec.curves():
        ok = {c: math.fsum(sorted(v)) / len(v) for c, v in sorted(logs[cid].items())}
        out[cid] = _Curve(ok=ok, done=frozenset(cells[cid]),
                          failed=frozenset(cells[cid] - set(ok)))
    return out


def _open_cells(spec: SweepSpec, curve: _Curve) -> list[Cell]:
    """The curve's lattice cells that may still be proposed, in lattice order."""
    out = []
    for cell in spec.lattice():
        if cell in curve.done:
            continue
        if spec.prune_failed and any(cell[0] >= f[0] and cell[1] >= f[1] for f in curve.failed):
            continue
        out.append(cell)
    return out


# --------------------------------------------------------------------------- the error model
def _loo_errors(spec: SweepSpec, curve: _Curve) -> tuple[list[Cell], NDArray[np.float64]] | None:
    """Leave-one-out absolute percentage errors of the curve's measured cells (None: fewer than
    MIN_CURVE_POINTS cells): each cell's log latency predicted by a least-squares plane through
    its nearest measured neighbours (log-log space)."""
    if len(curve.ok) < MIN_CURVE_POINTS:
        return None
    cells = sorted(curve.ok)
    x = _scaled(spec, cells)
    y = np.array([curve.ok[c] for c in cells])
    d = np.round(np.hypot(x[:, None, 0] - x[None, :, 0], x[:, None, 1] - x[None, :, 1]), 12)
    np.fill_diagonal(d, np.inf)
    k = min(_NEIGHBOURS, len(cells) - 1)
    resid = np.empty(len(cells))
    for i in range(len(cells)):
        radius = np.sort(d[i])[k - 1]
        nb = np.flatnonzero(d[i] <= radius)  # the k nearest, ties included
        a = np.column_stack([np.ones(len(nb)), x[nb] - x[i]])
        coef = np.linalg.lstsq(a, y[nb], rcond=None)[0]
        resid[i] = y[i] - coef[0]
    # (ignore: numpy's stubs read np.round of an array of unknown dtype as float16)
    return cells, np.round(np.abs(np.expm1(-resid)), 12)  # type: ignore[return-value]


def _curve_error(spec: SweepSpec, curve: _Curve) -> float | None:
    loo = _loo_errors(spec, curve)
    return None if loo is None else float(np.quantile(loo[1], spec.error_quantile))


# --------------------------------------------------------------------------- the public API
def lattice_size(spec: SweepSpec) -> int:
    """How many points the whole lattice holds (every curve's cells)."""
    return len(spec.curves()) * len(spec.lattice())


def curve_errors(spec: SweepSpec,
                 done: Sequence[ProfileRecord]) -> dict[CurveId, float | None]:
    """Each curve's estimated error (the ``error_quantile``, by default the median, of its
    absolute leave-one-out percentage errors, a fraction; see the module doc), None where it has
    fewer than MIN_CURVE_POINTS measured cells."""
    curves = _gather(spec, done)
    return {cid: _curve_error(spec, curves[cid]) for cid in spec.curves()}


def next_points(spec: SweepSpec, done: Sequence[ProfileRecord],
                budget_points: int) -> list[SweepPoint]:
    """At most ``budget_points`` new points to measure (none in ``done``); [] when finished.

    Coarse points while any curve has fewer than ``coarse_points`` measured cells (every curve
    to MIN_CURVE_POINTS first, then on to ``coarse_points``), else refinement points of the
    unfinished curves, worst first.
    ``max_points`` caps the distinct keys of the sweep's curves in ``done`` plus the result.
    """
    budget = _int_in("budget_points", budget_points, 0, 10**9)
    curves = _gather(spec, done)
    if spec.max_points is not None:
        budget = min(budget, spec.max_points - sum(len(c.done) for c in curves.values()))
    if budget <= 0:
        return []
    picks = _coarse(spec, curves, budget)
    if not picks:
        picks = _refine(spec, curves, budget)
    return [SweepPoint(tp, share, StepPoint(phase, b, n)) for (tp, share, phase), (b, n) in picks]


def _coarse(spec: SweepSpec, curves: dict[CurveId, _Curve],
            budget: int) -> list[tuple[CurveId, Cell]]:
    """Coarse points in two passes over the curves: first up to MIN_CURVE_POINTS each (so that a
    small ``max_points`` still leaves every curve fittable), then up to ``coarse_points``."""
    out: list[tuple[CurveId, Cell]] = []
    picked: dict[CurveId, set[Cell]] = {cid: set() for cid in spec.curves()}
    for target in (min(MIN_CURVE_POINTS, spec.coarse_points), spec.coarse_points):
        for cid in spec.curves():
            curve = curves[cid]
            need = target - len(curve.ok) - len(picked[cid])
            if need <= 0:
                continue
            open_ = set(_open_cells(spec, curve)) - picked[cid]
            for cell in _coarse_order(spec):
                if need <= 0 or len(out) >= budget:
                    break
                if cell in open_:
                    out.append((cid, cell))
                    picked[cid].add(cell)
                    need -= 1
    return out


def _refine(spec: SweepSpec, curves: dict[CurveId, _Curve],
            budget: int) -> list[tuple[CurveId, Cell]]:
    ranked: list[tuple[float, int, CurveId, tuple[list[Cell], NDArray[np.float64]]]] = []
    for i, cid in enumerate(spec.curves()):
        loo = _loo_errors(spec, curves[cid])
        if loo is None:
            continue
        err = float(np.quantile(loo[1], spec.error_quantile))
        if err > spec.target_error:
            ranked.append((-err, i, cid, loo))
    out: list[tuple[CurveId, Cell]] = []
    for _, _, cid, loo in sorted(ranked, key=lambda r: r[:2]):
        take = min(spec.refine_batch, budget - len(out))
        if take <= 0:
            break
        out += [(cid, cell) for cell in _refine_curve(spec, curves[cid], loo, take)]
    return out


def _refine_curve(spec: SweepSpec, curve: _Curve, loo: tuple[list[Cell], NDArray[np.float64]],
                  take: int) -> list[Cell]:
    """Up to ``take`` open cells, each maximising e(nearest measured) · distance to it."""
    cells, err = loo
    open_ = _open_cells(spec, curve)
    if not open_:
        return []
    q = _scaled(spec, open_)
    p = _scaled(spec, cells)
    d = np.hypot(q[:, None, 0] - p[None, :, 0], q[:, None, 1] - p[None, :, 1])
    near = np.argmin(d, axis=1)  # first index on ties: deterministic
    gap = np.round(d[np.arange(len(open_)), near], 12)
    e = err[near]
    out: list[Cell] = []
    left = list(range(len(open_)))
    while left and len(out) < take:
        j = min(left, key=lambda k: (-round(e[k] * gap[k], 12), -e[k], open_[k]))
        out.append(open_[j])
        left.remove(j)
        # the chosen cell now stands for its neighbour: cells nearer to it than to any
        # measured or chosen cell take its error and distance
        dj = np.round(np.hypot(q[:, 0] - q[j, 0], q[:, 1] - q[j, 1]), 12)
        closer = dj < gap
        gap = np.where(closer, dj, gap)
        e = np.where(closer, e[j], e)
    return out
