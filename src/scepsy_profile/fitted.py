"""Regression latency curves fitted to measurements.

For each (model, gpu, tp, phase) the fit has three stages (docs/profiles.md says why):

1. **Physics form** (robust non-linear least squares, ``scipy.optimize.least_squares`` with a
   soft-L1 loss on log latency): ``t = ((F·ψ(s))^p + (W(b, n)·φ(s))^p)^(1/p)``, a smooth maximum
   of a fixed per-step floor ``F`` (launch and framework overhead, weight reads at small batch)
   and the work ``W`` with non-negative coefficients. Prefill: ``W = c0·b·n + c1·b·n² + c2·b``;
   decode: ``W = c0·b + c1·b·ctx + c2``. ``ψ`` and ``φ`` are monotone per-share-level
   multipliers (1 at the largest measured share), interpolated in 1/share; below the smallest
   measured share the work scales as 1/share (compute-bound).
2. **Residual Gaussian process** (scikit-learn ``GaussianProcessRegressor``, anisotropic RBF plus
   white noise, on log residuals; decode residuals clipped at 4 MAD; lone glitches down-weighted
   by a leave-one-out check): picks up what the form cannot — wave quantisation steps, the MPS
   knee, memory-pressure cliffs at large token counts.
3. **Monotone lattice**: the model is evaluated on a lattice (measured batch and token values and
   their midpoints, share levels), projected onto monotone lattices by alternating isotonic
   regressions (never faster with more batch or tokens, never slower with more share) and
   rounded to 6 significant digits. Queries interpolate multilinearly in (batch, tokens,
   1/share); outside the lattice they extrapolate with the edge elasticities (linear tangents in
   batch and tokens, a power law below the smallest share), so every prediction is monotone by
   construction and fast (a few µs per point).

Unmeasured TP degrees between two measured ones are interpolated geometrically in log TP.

Reproducible on any machine: the points are put in a canonical order, both optimisations are well
posed (bounds, a tiny ridge) and run to convergence, and the glitch down-weighting is continuous,
so no decision flips on a last-bit difference (tests/scepsy_profile/test_fitted.py checks 1e-12 perturbations and
re-runs the command that made the bundled curves).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import isotonic_regression, least_squares, minimize, nnls
from threadpoolctl import threadpool_limits

from scepsy_common.errors import InputError, UncoveredInstanceError, validated
from scepsy_common.files import atomic_write_text, read_json
from scepsy_profile.latency import Number, as_output, check_point
from scepsy_profile.measurements import (
    PHASES,
    Measurement,
    Phase,
    check_curve_points,
    group_by_curve,
)

if TYPE_CHECKING:  # scikit-learn is imported where a curve is fitted, not by every command
    from sklearn.gaussian_process import GaussianProcessRegressor

CurveKey = tuple[str, str, int, Phase]
CURVES_FORMAT = "scepsy-curves/1"
MUXSERVE_A100_CURVES = (Path(__file__).resolve().parents[2] / "datasets" / "profiles"
                        / "muxserve-a100-curves.json")
"""MuxServe's A100 profile fitted as curves, in the repository's ``datasets/`` (an install from
the repository, as the README's, finds it; ``scepsy validate muxserve`` uses it by default)."""
_GP_MAX_POINTS = 1500
_OUTLIER = 0.25  # a point whose fitted value is off by more than 25% is reported as an outlier
# Residuals beyond this many MADs are clipped before the GP sees them. Decode steps are short
# (10-50 ms) and their big deviations are timing glitches (single 2-8x spikes in the MuxServe
# grid); prefill passes are long, and their big deviations are real regime changes (wave
# quantisation, the memory cliff at >= 64k tokens) that the GP must follow.
_RESIDUAL_CLIP: dict[str, float | None] = {"prefill": None, "decode": 4.0}
# The physics fit is made well posed so that its answer does not depend on the path the optimiser
# took (which last-bit differences between machines change): box bounds on every parameter, a
# tiny ridge pull towards the starting point (no flat directions), and tolerances tight enough to
# converge to the minimum itself rather than stop somewhere near it.
_PHYSICS_RIDGE = 1e-6
_PHYSICS_TOL = 1e-12
_PHYSICS_MAX_NFEV = 20000
_GP_TOL = 1e-9  # L-BFGS-B tolerances of the GP's hyper-parameter search (see _lbfgs)
# A point whose leave-one-out residual exceeds the glitch threshold loses weight linearly until
# _GLITCH_RAMP times the threshold, where it has none (see _glitch_weights).
_GLITCH_RAMP = 1.5
_MIN_WEIGHT = 1e-9  # a weight-0 point's noise variance is multiplied by 1 / _MIN_WEIGHT


# --------------------------------------------------------------------------- the lattice
@dataclass(frozen=True, eq=False)
class CurveTable:
    """A monotone latency lattice for one (model, gpu, tp, phase); ``predict`` interpolates it."""

    model: str
    gpu: str
    tp: int
    phase: Phase
    batch_nodes: NDArray[np.float64]
    token_nodes: NDArray[np.float64]
    share_nodes: NDArray[np.float64]
    values: NDArray[np.float64]  # ms, shape (batch, tokens, share), share ascending
    batch_elasticity: float
    token_elasticity: float
    share_elasticity: float
    n_points: int = 0
    source: str = ""
    _u_nodes: NDArray[np.float64] = field(init=False, repr=False)
    _u_values: NDArray[np.float64] = field(init=False, repr=False)
    _py: tuple = field(init=False, repr=False)  # plain-Python copies for the scalar fast path

    def __post_init__(self) -> None:
        for name in ("batch_nodes", "token_nodes", "share_nodes", "values"):
            arr = np.array(getattr(self, name), dtype=float)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        if self.values.shape != (len(self.batch_nodes), len(self.token_nodes), len(self.share_nodes)):
            raise InputError("curve", f"{self.model}.{self.tp}.{self.phase}.values",
                             "an array of shape (batch nodes, token nodes, share nodes)")
        # internal axis for share: u = 1/share, ascending. A curve measured at one share (every
        # CPU sweep, a GPU without MPS) gets a second, equal node, so that interpolation has a
        # cell; below the share the elasticity applies as for any table.
        u_nodes, u_values = 1.0 / self.share_nodes[::-1], self.values[:, :, ::-1]
        if len(u_nodes) == 1:
            u_nodes = np.array([u_nodes[0], u_nodes[0] + 1.0])
            u_values = np.repeat(u_values, 2, axis=2)
        object.__setattr__(self, "_u_nodes", u_nodes)
        object.__setattr__(self, "_u_values", u_values)
        object.__setattr__(self, "_py", (
            self.batch_nodes.tolist(), self.token_nodes.tolist(), self._u_nodes.tolist(),
            np.ascontiguousarray(self._u_values).ravel().tolist(), float(self.share_nodes[0]),
        ))

    def __reduce__(self) -> tuple:
        """Pickle through the constructor, so that an unpickled table is read-only and whole."""
        return (CurveTable, tuple(getattr(self, f.name) for f in fields(self) if f.init))

    def predict_one(self, share: float, batch: float, tokens: float) -> float:
        """Scalar fast path of :meth:`predict` (plain Python, a few µs)."""
        bn, nn, un, flat, smin = self._py
        ib, wb = _axis_one(bn, batch)
        iq, wq = _axis_one(nn, tokens)
        iu, wu = _axis_one(un, 1.0 / share)
        nq, nu = len(nn), len(un)
        out = 0.0
        for db, fb in ((0, 1.0 - wb), (1, wb)):
            row = (ib + db) * nq
            for dq, fq in ((0, 1.0 - wq), (1, wq)):
                base = (row + iq + dq) * nu + iu
                out += fb * fq * ((1.0 - wu) * flat[base] + wu * flat[base + 1])
        if batch > bn[-1]:
            out *= 1.0 + self.batch_elasticity * (batch / bn[-1] - 1.0)
        if tokens > nn[-1]:
            out *= 1.0 + self.token_elasticity * (tokens / nn[-1] - 1.0)
        if share < smin:
            out *= (smin / share) ** self.share_elasticity
        return out

    @property
    def key(self) -> CurveKey:
        return (self.model, self.gpu, self.tp, self.phase)

    def predict(self, share: ArrayLike, batch: ArrayLike, tokens: ArrayLike) -> NDArray[np.float64]:
        """Latency in ms (vectorised; inputs already validated and broadcast)."""
        s = np.asarray(share, dtype=float)
        b = np.asarray(batch, dtype=float)
        n = np.asarray(tokens, dtype=float)
        ib, wb = _axis(self.batch_nodes, b)
        iq, wq = _axis(self.token_nodes, n)
        iu, wu = _axis(self._u_nodes, 1.0 / s)
        v = self._u_values
        out = np.zeros(np.broadcast(ib, iq, iu).shape)
        for db, fb in ((0, 1 - wb), (1, wb)):
            for dq, fq in ((0, 1 - wq), (1, wq)):
                for du, fu in ((0, 1 - wu), (1, wu)):
                    out = out + fb * fq * fu * v[ib + db, iq + dq, iu + du]
        bmax, nmax, smin = self.batch_nodes[-1], self.token_nodes[-1], self.share_nodes[0]
        out = out * (1.0 + self.batch_elasticity * (np.maximum(b, bmax) / bmax - 1.0))
        out = out * (1.0 + self.token_elasticity * (np.maximum(n, nmax) / nmax - 1.0))
        return out * (smin / np.minimum(s, smin)) ** self.share_elasticity

    def to_dict(self) -> dict:
        return {
            "model": self.model, "gpu": self.gpu, "tp": self.tp, "phase": self.phase,
            "batch_nodes": self.batch_nodes.tolist(), "token_nodes": self.token_nodes.tolist(),
            "share_nodes": self.share_nodes.tolist(), "values": self.values.tolist(),
            "batch_elasticity": self.batch_elasticity, "token_elasticity": self.token_elasticity,
            "share_elasticity": self.share_elasticity, "n_points": self.n_points,
            "source": self.source,
        }


def _axis_one(nodes: list[float], x: float) -> tuple[int, float]:
    if x <= nodes[0]:
        return 0, 0.0
    if x >= nodes[-1]:
        return len(nodes) - 2, 1.0
    i = bisect_right(nodes, x) - 1
    return i, (x - nodes[i]) / (nodes[i + 1] - nodes[i])


def _axis(nodes: NDArray[np.float64], x: NDArray[np.float64]) -> tuple[NDArray[np.intp], NDArray[np.float64]]:
    """Cell index and weight of ``x`` along one lattice axis (clamped to the lattice)."""
    xc = np.clip(x, nodes[0], nodes[-1])
    i = np.clip(np.searchsorted(nodes, xc, side="right") - 1, 0, len(nodes) - 2)
    return i, (xc - nodes[i]) / (nodes[i + 1] - nodes[i])


# --------------------------------------------------------------------------- stage 1: physics form
@dataclass(frozen=True)
class _PhysicsForm:
    phase: Phase
    levels: NDArray[np.float64]  # measured share levels, descending
    params: NDArray[np.float64]

    def work_features(self, b: NDArray, n: NDArray) -> NDArray:
        if self.phase == "prefill":
            return np.stack([b * n, b * n * n / 1000.0, b], axis=-1)
        return np.stack([b, b * n / 1000.0, np.ones_like(b)], axis=-1)

    def _mult(self, theta: NDArray, s: NDArray) -> NDArray:
        if len(self.levels) < 2:
            return np.ones_like(s)
        vals = np.concatenate([[1.0], 1.0 + np.cumsum(np.exp(theta))])
        return np.interp(1.0 / s, 1.0 / self.levels, vals)

    def __call__(self, b: NDArray, n: NDArray, s: NDArray, params: NDArray | None = None) -> NDArray:
        p_ = self.params if params is None else params
        k = max(len(self.levels) - 1, 0)
        floor = math.exp(p_[0]) * self._mult(p_[5 : 5 + k], s)
        power = 1.0 + math.exp(min(p_[1], 5.0))
        c = np.exp(np.clip(p_[2:5], -60.0, 60.0))
        smin = self.levels[-1]
        work = (self.work_features(b, n) @ c) * self._mult(p_[5 + k : 5 + 2 * k], s)
        work = work * (smin / np.minimum(s, smin))
        # smooth maximum in log space, stable for large powers
        lf, lw = np.log(floor), np.log(np.maximum(work, 1e-300))
        hi = np.maximum(lf, lw)
        return np.exp(hi + np.log(np.exp(power * (lf - hi)) + np.exp(power * (lw - hi))) / power)


def _fit_physics(phase: Phase, b: NDArray, n: NDArray, s: NDArray, y: NDArray) -> _PhysicsForm:
    levels = np.array(sorted(set(np.round(s, 6).tolist()), reverse=True))
    k = len(levels) - 1 if len(levels) > 1 else 0
    form = _PhysicsForm(phase, levels, np.zeros(5 + 2 * k))
    # initial work coefficients: non-negative least squares on relative error
    feats = form.work_features(b, n)
    coef, _ = nnls(feats / y[:, None], np.ones_like(y))
    coef = np.maximum(coef, 1e-9 * max(coef.max(), 1e-9))
    x0 = np.concatenate([[math.log(np.min(y)), math.log(3.0)], np.log(coef), np.full(2 * k, -2.0)])
    lo, hi = _physics_bounds(x0, k)
    x0 = np.clip(x0, lo, hi)
    ridge = math.sqrt(_PHYSICS_RIDGE)

    def resid(p: NDArray) -> NDArray:
        return np.concatenate([np.log(form(b, n, s, p)) - np.log(y), ridge * (p - x0)])

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        res = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05,
                            max_nfev=_PHYSICS_MAX_NFEV, x_scale=1.0, ftol=_PHYSICS_TOL,
                            xtol=_PHYSICS_TOL, gtol=_PHYSICS_TOL)
    return _PhysicsForm(phase, levels, res.x)


def _physics_bounds(x0: NDArray, k: int) -> tuple[NDArray, NDArray]:
    """Box bounds of the physics parameters (all log-scale): no direction of the fit is flat."""
    lo = np.concatenate([[x0[0] - 20.0, -4.0], np.full(3, -60.0), np.full(2 * k, -30.0)])
    hi = np.concatenate([[x0[0] + 20.0, 5.0], np.full(3, 60.0), np.full(2 * k, 5.0)])
    return lo, hi


# --------------------------------------------------------------------------- stage 2: residual GP
def _gp_features(b: NDArray, n: NDArray, s: NDArray) -> NDArray:
    return np.stack([np.log2(b), np.log2(n), np.log2(b * n), 1.0 / s], axis=-1)


def _fit_residual(x: NDArray, r: NDArray, seed: int,
                  clip_mad: float | None) -> GaussianProcessRegressor | None:
    """GP on log residuals, refitted with lone glitches down-weighted (:func:`_glitch_weights`)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, WhiteKernel
    from sklearn.gaussian_process.kernels import ConstantKernel as C

    if len(r) < 8:
        return None
    if len(r) > _GP_MAX_POINTS:  # keep the fit cheap on large user data sets, deterministically
        idx = np.sort(np.random.default_rng(seed).choice(len(r), _GP_MAX_POINTS, replace=False))
        x, r = x[idx], r[idx]
    if clip_mad is not None:
        mad = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        r = np.clip(r, -clip_mad * mad - 1e-6, clip_mad * mad + 1e-6)
    kernel = C(0.01, (1e-6, 1.0)) * RBF([1.0] * x.shape[1], (0.05, 100.0)) + WhiteKernel(
        1e-3, (1e-7, 1e-1)
    )
    gp = GaussianProcessRegressor(kernel, optimizer=_lbfgs, random_state=seed,
                                  n_restarts_optimizer=0)
    with warnings.catch_warnings():  # hyper-parameters at their bounds are expected here
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(x, r)
    weight = _glitch_weights(gp, x, r)
    if np.all(weight == 1.0):
        return gp
    # a weight w scales the point's precision: its noise variance becomes noise / w
    noise = float(gp.kernel_.k2.noise_level)
    extra = noise * (1.0 / np.maximum(weight, _MIN_WEIGHT) - 1.0)
    return GaussianProcessRegressor(gp.kernel_, alpha=extra + 1e-10, optimizer=None,
                                    random_state=seed).fit(x, r)


def _lbfgs(obj_func, initial_theta: NDArray, bounds: NDArray) -> tuple[NDArray, float]:
    """The GP's hyper-parameter search, run to convergence (not stopped early).

    scikit-learn's default stops L-BFGS-B at loose tolerances, where the point it returns depends
    on the path, and so on last-bit differences between machines; converged, it is the optimum.
    """
    res = minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds,
                   options={"maxiter": 5000, "ftol": _GP_TOL, "gtol": _GP_TOL})
    return res.x, float(res.fun)


def _glitch_weights(gp: GaussianProcessRegressor, x: NDArray, r: NDArray) -> NDArray[np.float64]:
    """How much each point is trusted: 0 for a lone glitch, 1 for a point its neighbours explain.

    The GP's leave-one-out residuals have a closed form, ``(K⁻¹r)_i / (K⁻¹)_ii``. A real regime
    change (a wave-quantisation step, a memory cliff) shows in several neighbouring points, so
    each is predicted from the others; a lone timing glitch is not. The weight is 1 while the
    leave-one-out residual is within ``t = max(6 MAD, 15%)``, falls linearly to 0 at
    ``_GLITCH_RAMP · t`` and stays 0 beyond: a continuous function of the data, so a last-bit
    difference (another machine's BLAS) moves a weight by a last-bit amount, never flips a point
    in or out.
    """
    k_inv = np.linalg.inv(gp.kernel_(x))
    loo = (k_inv @ r) / np.diag(k_inv)
    scale = 1.4826 * float(np.median(np.abs(loo - np.median(loo))))
    ratio = np.abs(loo) / max(6.0 * scale, math.log(1.15))
    return np.clip((_GLITCH_RAMP - ratio) / (_GLITCH_RAMP - 1.0), 0.0, 1.0)


# --------------------------------------------------------------------------- stage 3: lattice
def _nodes(measured: NDArray) -> NDArray:
    """Measured values plus their geometric midpoints (rounded), ascending."""
    vals = sorted(set(measured.tolist()))
    out = set(vals)
    for a, c in pairwise(vals):
        mid = round(math.sqrt(a * c))
        if a < mid < c:
            out.add(float(mid))
    return np.array(sorted(out), dtype=float)


def _share_nodes(measured: NDArray) -> NDArray:
    lo, hi = float(measured.min()), float(measured.max())
    grid = {round(x, 6) for x in np.round(measured, 6)}
    grid |= {round(x, 6) for x in np.arange(0.1, 1.0001, 0.1) if lo < x < hi}
    return np.array(sorted(grid), dtype=float)


def _monotone(values: NDArray, sweeps: int = 4) -> NDArray:
    """Project onto lattices non-decreasing in batch and tokens, non-increasing in share.

    Alternating one-dimensional isotonic regressions (``scipy.optimize.isotonic_regression``,
    the least-squares projection along one axis) fix violations without shifting flat, noisy
    regions up or down; a final mean of the upper envelope (cumulative maxima from the small end)
    and the lower envelope (cumulative minima from the large end), both monotone along every
    axis, guarantees the property exactly.
    """
    v = np.flip(values, axis=2)  # share descending: latency must be non-decreasing on every axis
    for _ in range(sweeps):
        for axis in range(3):
            v = np.apply_along_axis(lambda f: isotonic_regression(f).x, axis, v)
    upper, lower = v, v
    for axis in range(3):
        upper = np.maximum.accumulate(upper, axis=axis)
        lower = np.flip(np.minimum.accumulate(np.flip(lower, axis=axis), axis=axis), axis=axis)
    return np.flip((upper + lower) / 2.0, axis=2)


def _round_sig(values: NDArray, digits: int = 6) -> NDArray:
    return np.array([float(f"{v:.{digits}g}") for v in values.ravel()]).reshape(values.shape)


def _edge_elasticity(lo: NDArray, hi: NDArray, ratio: float) -> float:
    e = np.log(hi / lo) / math.log(ratio)
    return float(np.clip(np.round(np.median(e), 6), 0.0, 1.0))


@dataclass(frozen=True)
class CurveFitReport:
    """How one curve's fit went: points, outliers flagged, lattice adjustments."""

    key: CurveKey
    n_points: int
    n_outliers: int
    train_median_ape: float
    monotone_adjust_max: float  # largest relative change made to enforce monotonicity


def fit_curve(key: CurveKey, points: Sequence[Measurement], seed: int = 0,
              residual_gp: bool = True) -> tuple[CurveTable, CurveFitReport]:
    """Fit one (model, gpu, tp, phase) curve to its points (the three stages of the module doc).

    The answer does not depend on the order of ``points``, and a last-bit difference in the data
    or in the arithmetic (another machine's BLAS) moves it by about 1e-5 relative, far inside the
    0.1% that docs/profiles.md promises: every step is a continuous function of the data.
    """
    # one BLAS thread: the matrices are small, and threads fighting over a busy machine's cores
    # make the GP's hyper-parameter search ten times slower
    with threadpool_limits(1, user_api="blas"):
        return _fit_curve(key, points, seed, residual_gp)


def _fit_curve(key: CurveKey, points: Sequence[Measurement], seed: int,
               residual_gp: bool) -> tuple[CurveTable, CurveFitReport]:
    model, gpu, tp, phase = key
    # a canonical order: the fit does not depend on the order of the measurements file
    points = sorted(points, key=lambda m: (m.share, m.batch, m.tokens, m.latency_ms))
    b = np.array([m.batch for m in points], dtype=float)
    n = np.array([m.tokens for m in points], dtype=float)
    s = np.array([m.share for m in points], dtype=float)
    y = np.array([m.latency_ms for m in points], dtype=float)
    form = _fit_physics(phase, b, n, s, y)
    resid = np.log(y) - np.log(form(b, n, s))
    gp = _fit_residual(_gp_features(b, n, s), resid, seed, _RESIDUAL_CLIP[phase]) if residual_gp else None

    def evaluate(bb: NDArray, nn: NDArray, ss: NDArray) -> NDArray:
        base = form(bb, nn, ss)
        if gp is None:
            return base
        feats = _gp_features(bb.ravel(), nn.ravel(), ss.ravel())
        return base * np.exp(gp.predict(feats).reshape(bb.shape))

    bn, nn_, sn = _nodes(b), _nodes(n), _share_nodes(s)
    gb, gn, gs = np.meshgrid(bn, nn_, sn, indexing="ij")
    raw = evaluate(gb, gn, gs)
    mono = _monotone(raw)
    values = _round_sig(mono)
    fitted = evaluate(b, n, s)
    ape = np.abs(fitted / y - 1.0)
    table = CurveTable(
        model=model, gpu=gpu, tp=tp, phase=phase, batch_nodes=bn, token_nodes=nn_, share_nodes=sn,
        values=values,
        batch_elasticity=_edge_elasticity(values[-2], values[-1], bn[-1] / bn[-2]) if len(bn) > 1 else 1.0,
        token_elasticity=_edge_elasticity(values[:, -2], values[:, -1], nn_[-1] / nn_[-2]) if len(nn_) > 1 else 1.0,
        share_elasticity=_edge_elasticity(values[:, :, 1], values[:, :, 0], sn[1] / sn[0]) if len(sn) > 1 else 1.0,
        n_points=len(points),
        source=",".join(sorted({m.source for m in points if m.source})),
    )
    report = CurveFitReport(
        key=key, n_points=len(points), n_outliers=int(np.sum(ape > _OUTLIER)),
        train_median_ape=float(np.median(ape)),
        monotone_adjust_max=float(np.max(mono / raw - 1.0)),
    )
    return table, report


# --------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class FittedLatencyModel:
    """Fitted latency curves; implements :class:`~scepsy_profile.latency.LatencyModel`."""

    curves: Mapping[CurveKey, CurveTable]
    reports: tuple[CurveFitReport, ...] = ()
    _tps: Mapping[tuple[str, str, Phase], tuple[int, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        tps: dict[tuple[str, str, Phase], list[int]] = {}
        for model, gpu, tp, phase in self.curves:
            tps.setdefault((model, gpu, phase), []).append(tp)
        object.__setattr__(self, "_tps", {k: tuple(sorted(v)) for k, v in tps.items()})

    def curve_keys(self) -> list[CurveKey]:
        return sorted(self.curves)

    def models(self) -> list[str]:
        return sorted({k[0] for k in self.curves})

    def tps(self, model: str, gpu: str) -> list[int]:
        return sorted({k[2] for k in self.curves if k[0] == model and k[1] == gpu})

    def covers(self, model: str, gpu: str, tp: int) -> bool:
        """Whether both phases have curves at ``tp`` or at measured degrees either side of it."""
        return all(self._tp_bracket(model, gpu, tp, phase) is not None
                   for phase in PHASES)

    def measured_shares(self, model: str, gpu: str, tp: int) -> tuple[float, float]:
        """The shares every curve the instance uses was measured over: the largest of their
        smallest share nodes and the smallest of their largest (a curve's share nodes span
        exactly its measured shares). Both phases count, and at a TP degree between two
        measured ones both degrees' curves. Below the range a curve extrapolates with its edge
        elasticity, above it holds its value at the largest share. Raises
        :class:`UncoveredInstanceError` where :meth:`covers` is False."""
        lo, hi = 0.0, 1.0
        for phase in ("prefill", "decode"):
            bracket = self._tp_bracket(model, gpu, tp, phase)
            if bracket is None:
                raise self._uncovered(model, gpu, tp, phase)
            for t in {bracket[0], bracket[1]}:
                nodes = self.curves[(model, gpu, t, phase)].share_nodes
                lo, hi = max(lo, float(nodes[0])), min(hi, float(nodes[-1]))
        return lo, hi

    def prefill_ms(self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike,
                   seq: ArrayLike) -> Number:
        """Latency of one prefill pass over ``batch`` prompts of ``seq`` tokens (ms)."""
        return self._query(model, gpu, tp, "prefill", share, batch, seq, "seq")

    def decode_ms(self, model: str, gpu: str, tp: int, share: ArrayLike, batch: ArrayLike,
                  ctx: ArrayLike) -> Number:
        """Latency of one decode step for ``batch`` sequences of context ``ctx`` (ms)."""
        return self._query(model, gpu, tp, "decode", share, batch, ctx, "ctx")

    def _query(self, model: str, gpu: str, tp: int, phase: Phase, share: ArrayLike,
               batch: ArrayLike, tokens: ArrayLike, tokens_name: str) -> Number:
        bracket = self._tp_bracket(model, gpu, tp, phase)
        if bracket is None:
            raise self._uncovered(model, gpu, tp, phase)
        lo, hi, w = bracket
        if (type(share) is float or type(share) is int) and 0 < share <= 1 and (
            type(batch) is int or type(batch) is float) and batch >= 1 and (
            type(tokens) is int or type(tokens) is float) and tokens >= 1:
            one = self.curves[(model, gpu, lo, phase)].predict_one(share, batch, tokens)
            if hi == lo:
                return one
            other = self.curves[(model, gpu, hi, phase)].predict_one(share, batch, tokens)
            return math.exp((1.0 - w) * math.log(one) + w * math.log(other))
        s, b, n, scalar = check_point(share, batch, tokens, tokens_name)
        v = self.curves[(model, gpu, lo, phase)].predict(s, b, n)
        if hi != lo:
            v_hi = self.curves[(model, gpu, hi, phase)].predict(s, b, n)
            v = np.exp((1.0 - w) * np.log(v) + w * np.log(v_hi))
        return as_output(v, scalar)

    def _tp_bracket(self, model: str, gpu: str, tp: int,
                    phase: Phase) -> tuple[int, int, float] | None:
        """The measured TP degrees around ``tp`` and the weight of the upper one (None: uncovered)."""
        tps = self._tps.get((model, gpu, phase), ())
        if tp in tps:
            return tp, tp, 0.0
        if not tps or not tps[0] < tp < tps[-1]:
            return None
        hi = next(t for t in tps if t > tp)
        lo = max(t for t in tps if t < tp)
        return lo, hi, math.log(tp / lo) / math.log(hi / lo)

    def _uncovered(self, model: str, gpu: str, tp: int, phase: Phase) -> UncoveredInstanceError:
        tps = self._tps.get((model, gpu, phase), ())
        if tps:
            expected = f"a TP degree within the measured {list(tps)} of {model}@{gpu} ({phase})"
        else:
            known = sorted({f"{k[0]}@{k[1]}" for k in self.curves if k[3] == phase})
            expected = f"a model@gpu with {phase} curves, one of {known}"
        return UncoveredInstanceError("fitted curves", model, gpu, tp, expected)

    def to_dict(self) -> dict:
        return {"format": CURVES_FORMAT, "curves": [self.curves[k].to_dict() for k in self.curve_keys()]}


def fit_latency_model(measurements: Sequence[Measurement], *, seed: int = 0, n_jobs: int = 1,
                      residual_gp: bool = True, source: str = "measurements") -> FittedLatencyModel:
    """Fit one curve per (model, gpu, tp, phase) in ``measurements``.

    Every curve needs :data:`~scepsy_profile.measurements.MIN_CURVE_POINTS` distinct points;
    fewer is an :class:`InputError` naming ``source`` (the measurements' file) and the curve.

    Deterministic for a given input and seed. ``n_jobs`` fits curves in parallel processes;
    ``residual_gp=False`` keeps only the physics form (an ablation, see docs/profiles.md).
    """
    if not measurements:
        raise InputError(source, "", "at least one measurement")
    check_curve_points(measurements, source)
    groups = list(group_by_curve(measurements))
    results = _map(fit_curve, [(k, pts, seed, residual_gp) for k, pts in groups], n_jobs)
    return FittedLatencyModel(
        curves={t.key: t for t, _ in results}, reports=tuple(r for _, r in results)
    )


# --------------------------------------------------------------------------- cross-validation
@dataclass(frozen=True)
class CVResult:
    """Out-of-fold absolute percentage errors of one curve."""

    key: CurveKey
    ape: NDArray[np.float64]  # one value per measured point, fraction (0.03 = 3%)

    @property
    def median(self) -> float:
        return float(np.median(self.ape))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.ape, 90))


def cross_validate(measurements: Sequence[Measurement], *, folds: int = 5, seed: int = 0,
                   n_jobs: int = 1, residual_gp: bool = True) -> tuple[CVResult, ...]:
    """K-fold cross-validation of the whole fitting pipeline, per (model, gpu, tp, phase).

    Folds are drawn with scikit-learn's ``KFold(shuffle=True, random_state=seed)`` per curve.
    """
    groups = list(group_by_curve(measurements))
    return tuple(_map(_cv_curve, [(k, pts, folds, seed, residual_gp) for k, pts in groups], n_jobs))


def _cv_curve(key: CurveKey, pts: Sequence[Measurement], folds: int, seed: int,
              residual_gp: bool) -> CVResult:
    from sklearn.model_selection import KFold

    y = np.array([m.latency_ms for m in pts])
    ape = np.full(len(pts), np.nan)
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(y):
        table, _ = fit_curve(key, [pts[i] for i in train], seed, residual_gp)
        ape[test] = np.abs(predict_points(table, [pts[i] for i in test]) / y[test] - 1.0)
    return CVResult(key, ape)


def predict_points(table: CurveTable, points: Sequence[Measurement]) -> NDArray[np.float64]:
    """The table's predictions at the (share, batch, tokens) of measured points."""
    s = np.array([m.share for m in points], dtype=float)
    b = np.array([m.batch for m in points], dtype=float)
    n = np.array([m.tokens for m in points], dtype=float)
    return table.predict(s, b, n)


def _map(fn, args: list[tuple], n_jobs: int) -> list:
    """``[fn(*a) for a in args]``, in ``n_jobs`` processes when > 1 (order preserved)."""
    if n_jobs == 1 or len(args) < 2:
        return [fn(*a) for a in args]
    from joblib import Parallel, delayed

    return Parallel(n_jobs=n_jobs)(delayed(fn)(*a) for a in args)


# --------------------------------------------------------------------------- curves file
class _CurveRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    tp: int = Field(ge=1)
    phase: Phase
    batch_nodes: list[float] = Field(min_length=2)
    token_nodes: list[float] = Field(min_length=2)
    share_nodes: list[float] = Field(min_length=1)
    values: list[list[list[float]]]
    batch_elasticity: float = Field(ge=0, le=1)
    token_elasticity: float = Field(ge=0, le=1)
    share_elasticity: float = Field(ge=0, le=1)
    n_points: int = Field(ge=0, default=0)
    source: str = ""


class _CurvesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: str
    curves: list[_CurveRecord] = Field(min_length=1)


def save_curves(model: FittedLatencyModel, path: str | os.PathLike[str]) -> None:
    """Write fitted curves as JSON (deterministic bytes, atomic)."""
    atomic_write_text(path, json.dumps(model.to_dict(), sort_keys=True, separators=(",", ":")) + "\n")


def load_curves(path: str | os.PathLike[str]) -> FittedLatencyModel:
    """Read a curves file written by :func:`save_curves` (or ``scepsy profile fit``)."""
    p = Path(path)
    raw = read_json(p, "curves file (JSON)")
    doc = validated(_CurvesFile, raw, str(p))
    if doc.format != CURVES_FORMAT:
        raise InputError(str(p), "format", f"'{CURVES_FORMAT}'", doc.format)
    curves: dict[CurveKey, CurveTable] = {}
    for i, rec in enumerate(doc.curves):
        vals = np.array(rec.values, dtype=float) if rec.values else np.zeros((0,))
        if vals.ndim != 3 or np.any(~np.isfinite(vals)) or np.any(vals <= 0):
            raise InputError(str(p), f"curves[{i}].values", "a 3-d array of positive latencies (ms)")
        for name in ("batch_nodes", "token_nodes", "share_nodes"):
            nodes = np.array(getattr(rec, name))
            if np.any(np.diff(nodes) <= 0) or nodes[0] <= 0:
                raise InputError(str(p), f"curves[{i}].{name}", "strictly increasing positive values")
        if rec.share_nodes[-1] > 1:
            raise InputError(str(p), f"curves[{i}].share_nodes", "shares in (0, 1]")
        try:
            table = CurveTable(**{**rec.model_dump(), "values": vals})
        except InputError as exc:
            raise InputError(str(p), f"curves[{i}].values", exc.expected) from None
        curves[table.key] = table
    return FittedLatencyModel(curves=curves)
