"""The sweep planner: lattice, coarse design, refinement, stopping, failures, determinism.

Oracles: the key identity of the store (:meth:`ProfileRecord.key`), simulated sweeps against
known latency functions (the fitted pipeline's own physics form, a power law with a kink), and
uniform random selection as the baseline that adaptive refinement must beat.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

from scepsy_common.errors import InputError
from scepsy_profile.fitted import fit_curve, predict_points
from scepsy_profile.measurements import MIN_CURVE_POINTS, Measurement
from scepsy_profile.profiling.planner import (
    SweepPoint,
    SweepSpec,
    curve_errors,
    lattice_size,
    next_points,
)
from scepsy_profile.profiling.records import ProfileRecord

Truth = Callable[[str, int, int, float], "float | None"]  # None: the point fails


def record(tp: int, share: float, phase: str, batch: int, tokens: int, ms: float | None,
           model: str = "m") -> ProfileRecord:
    return ProfileRecord(
        engine="torch", engine_version="2.13.0", model=model, scale=0.1, config={},
        device="cpu", tp=tp, share=share, phase=phase, batch=batch, tokens=tokens,  # type: ignore[arg-type]
        status="ok" if ms is not None else "failed", latency_ms=ms,
        error="" if ms is not None else "out of memory")


def measured(p: SweepPoint, truth: Truth) -> ProfileRecord:
    ms = truth(p.step.phase, p.step.batch, p.step.tokens, p.share)
    return record(p.tp, p.share, p.step.phase, p.step.batch, p.step.tokens, ms)


def sweep(spec: SweepSpec, truth: Truth, budget: int = 4,
          calls: list[list[SweepPoint]] | None = None) -> list[ProfileRecord]:
    """Run the planner to the end against ``truth``; every call's answer goes into ``calls``."""
    done: list[ProfileRecord] = []
    for _ in range(10_000):
        pts = next_points(spec, done, budget)
        if calls is not None:
            calls.append(pts)
        if not pts:
            return done
        done += [measured(p, truth) for p in pts]
    raise AssertionError("the planner never finished")


def physics(phase: str, b: int, n: int, share: float = 1.0) -> float:
    """The fitted pipeline's own form: a smooth maximum of a floor and the work."""
    if phase == "prefill":
        work = 0.002 * b * n + 2e-7 * b * n * n + 0.05 * b
    else:
        work = 0.15 * b + 0.0004 * b * n + 0.5
    return (4.0**4 + (work / share**0.5) ** 4) ** 0.25


KINK = 11.0  # log2(batch · tokens) where the slope changes


def kinked(phase: str, b: int, n: int, share: float = 1.0) -> float:
    """A power law whose token-and-batch slope doubles past batch · tokens = 2^11."""
    u, v = math.log2(b), math.log2(n)
    return 2.0 ** (-4 + 0.7 * u + 0.6 * v + 1.0 * max(0.0, u + v - KINK))


def keys(records: Sequence[ProfileRecord]) -> list[tuple]:
    return [r.key() for r in records]


def as_records(points: Sequence[SweepPoint]) -> list[ProfileRecord]:
    return [record(p.tp, p.share, p.step.phase, p.step.batch, p.step.tokens, 1.0) for p in points]


# --------------------------------------------------------------------------- the spec
@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tps": ()}, "tps"),
    ({"tps": (0,)}, "tps"),
    ({"tps": (1, 1)}, "tps"),
    ({"tps": (True,)}, "tps"),
    ({"shares": ()}, "shares"),
    ({"shares": (0.0,)}, "shares"),
    ({"shares": (1.5,)}, "shares"),
    ({"shares": (float("nan"),)}, "shares"),
    ({"shares": (0.5, 0.5000000000001)}, "shares"),
    ({"phases": ("train",)}, "phases"),
    ({"phases": ()}, "phases"),
    ({"max_batch": 0}, "max_batch"),
    ({"max_batch": 2.0}, "max_batch"),
    ({"min_tokens": 0}, "min_tokens"),
    ({"max_tokens": 8}, "max_tokens"),  # below min_tokens (16)
    ({"target_error": 0.0}, "target_error"),
    ({"target_error": 5.0}, "target_error"),
    ({"target_error": float("inf")}, "target_error"),
    ({"max_points": 0}, "max_points"),
    ({"coarse_points": MIN_CURVE_POINTS - 1}, "coarse_points"),
    ({"refine_batch": 0}, "refine_batch"),
    ({"half_steps": 1}, "half_steps"),
    ({"prune_failed": "yes"}, "prune_failed"),
    ({"error_quantile": 1.5}, "error_quantile"),
    ({"max_batch_tokens": 0}, "max_batch_tokens"),
    ({"max_batch": 1, "min_tokens": 16, "max_tokens": 32}, "max_batch, min_tokens, max_tokens, "
     "max_batch_tokens"),
])
def test_bad_spec_fields_are_named(kwargs: dict, field: str) -> None:
    with pytest.raises(InputError) as exc:
        SweepSpec(**{"tps": (1,), "shares": (1.0,), **kwargs})
    assert exc.value.source == "sweep"
    assert exc.value.field == field


def test_bad_budget_and_mixed_records_are_input_errors() -> None:
    spec = SweepSpec(tps=(1,), shares=(1.0,))
    with pytest.raises(InputError) as exc:
        next_points(spec, [], -1)
    assert (exc.value.source, exc.value.field) == ("sweep", "budget_points")
    mixed = [record(1, 1.0, "prefill", 1, 16, 2.0), record(1, 1.0, "prefill", 2, 16, 2.0, "n")]
    with pytest.raises(InputError) as exc:
        next_points(spec, mixed, 4)
    assert exc.value.field == "done"


def test_lattice_powers_of_two_and_half_steps() -> None:
    spec = SweepSpec(tps=(1, 2), shares=(1.0,), max_batch=64, min_tokens=16, max_tokens=1024)
    cells = spec.lattice()
    batches, tokens = sorted({b for b, _ in cells}), sorted({n for _, n in cells})
    assert batches == [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64]
    assert tokens == [16, 23, 32, 45, 64, 91, 128, 181, 256, 362, 512, 724, 1024]
    assert lattice_size(spec) == 2 * 2 * 12 * 13
    coarse = SweepSpec(tps=(1,), shares=(1.0,), phases=("decode",), half_steps=False,
                       max_batch=48, max_tokens=1000)
    assert sorted({b for b, _ in coarse.lattice()}) == [1, 2, 4, 8, 16, 32, 48]
    assert sorted({n for _, n in coarse.lattice()}) == [16, 32, 64, 128, 256, 512, 1000]
    assert lattice_size(coarse) == 49
    capped = SweepSpec(tps=(1,), shares=(1.0,), max_batch_tokens=4096)
    assert capped.lattice() and all(b * n <= 4096 for b, n in capped.lattice())
    assert (64, 64) in capped.lattice() and (64, 91) not in capped.lattice()


# --------------------------------------------------------------------------- properties
@st.composite
def specs_and_records(draw: st.DrawFn) -> tuple[SweepSpec, list[ProfileRecord], int]:
    try:
        spec = SweepSpec(
            tps=tuple(draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=2,
                                    unique=True))),
            shares=tuple(draw(st.lists(st.sampled_from([0.25, 0.5, 1.0]), min_size=1,
                                       max_size=2, unique=True))),
            phases=tuple(draw(st.lists(st.sampled_from(["prefill", "decode"]), min_size=1,
                                       max_size=2, unique=True))),
            max_batch=draw(st.sampled_from([4, 6, 16])),
            min_tokens=draw(st.sampled_from([8, 16])),
            max_tokens=draw(st.sampled_from([64, 100, 256])),
            half_steps=draw(st.booleans()),
            coarse_points=draw(st.integers(MIN_CURVE_POINTS, 9)),
            refine_batch=draw(st.integers(1, 5)),
            max_points=draw(st.none() | st.integers(1, 80)),
            max_batch_tokens=draw(st.none() | st.sampled_from([256, 1024])),
            prune_failed=draw(st.booleans()),
            error_quantile=draw(st.sampled_from([0.5, 0.9])),
            target_error=draw(st.sampled_from([0.001, 0.05])),
        )
    except InputError:
        assume(False)
        raise
    points = [(c, cell) for c in spec.curves() for cell in spec.lattice()]
    chosen = draw(st.lists(st.sampled_from(points), max_size=60))
    fail = draw(st.lists(st.booleans(), min_size=len(chosen), max_size=len(chosen)))
    done = [record(tp, share, phase, b, n, None if f else physics(phase, b, n, share))
            for ((tp, share, phase), (b, n)), f in zip(chosen, fail, strict=True)]
    done += [record(8, 1.0, "prefill", 3, 17, 5.0)] if draw(st.booleans()) else []  # not a curve
    if draw(st.booleans()):  # the whole coarse design measured: the planner refines
        seen = set(keys(done))
        design = next_points(replace(spec, max_points=None), [], 10_000)
        done += [measured(p, physics) for p in design if as_records([p])[0].key() not in seen]
    return spec, done, draw(st.integers(0, 40))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs_and_records())
def test_proposals_are_new_distinct_on_the_lattice_and_within_budgets(
        case: tuple[SweepSpec, list[ProfileRecord], int]) -> None:
    spec, done, budget = case
    pts = next_points(spec, done, budget)
    new = keys(as_records(pts))
    assert len(new) == len(set(new)), "a point proposed twice"
    assert not set(new) & set(keys(done)), "a done point proposed again"
    assert len(pts) <= budget
    lattice, curves = set(spec.lattice()), set(spec.curves())
    for p in pts:
        assert (p.step.batch, p.step.tokens) in lattice
        assert (p.tp, p.share, p.step.phase) in curves
    if spec.max_points is not None:
        ours = {r.key() for r in done if (r.tp, r.share, r.phase) in curves}
        assert len(ours) + len(pts) <= max(spec.max_points, len(ours))
    # deterministic, and blind to the order of the records
    shuffled = list(done)
    random.Random(1).shuffle(shuffled)
    assert next_points(spec, shuffled, budget) == pts
    if spec.prune_failed:
        failed = {(r.tp, r.share, r.phase, r.batch, r.tokens) for r in done if r.status == "failed"}
        ok = {(r.tp, r.share, r.phase, r.batch, r.tokens) for r in done if r.status == "ok"}
        for p in pts:
            for tp, share, phase, b, n in failed - ok:
                assert not ((p.tp, p.share, p.step.phase) == (tp, share, phase)
                            and p.step.batch >= b and p.step.tokens >= n)


def test_coarse_design_first_corners_first() -> None:
    spec = SweepSpec(tps=(1, 2), shares=(0.5, 1.0), max_batch=32, max_tokens=512,
                     coarse_points=6)
    calls: list[list[SweepPoint]] = []
    done = sweep(spec, physics, budget=5, calls=calls)
    seen: dict[tuple, list[tuple[int, int]]] = {c: [] for c in spec.curves()}
    for pts in calls:
        short = [c for c in spec.curves() if len(seen[c]) < spec.coarse_points]
        for p in pts:
            cid = (p.tp, p.share, p.step.phase)
            if short:  # while a curve lacks coarse points, only such curves get points
                assert cid in short
            seen[cid].append((p.step.batch, p.step.tokens))
    corners = {(1, 16), (32, 16), (1, 512), (32, 512)}
    for cid, cells in seen.items():
        assert set(cells[:4]) == corners, cid
        assert len(set(cells[: spec.coarse_points])) == spec.coarse_points >= MIN_CURVE_POINTS
    assert len(done) < lattice_size(spec)
    assert len(keys(done)) == len(set(keys(done)))


def test_finished_when_target_met_and_errors_reported() -> None:
    """A pure power law is a plane in log-log space: the coarse design already predicts it."""
    spec = SweepSpec(tps=(1,), shares=(1.0,))
    power: Truth = lambda phase, b, n, s: 0.01 * b**0.8 * n**0.9  # noqa: E731
    first = next_points(spec, [], 3)
    assert len(first) == 3
    assert curve_errors(spec, []) == {(1, 1.0, "prefill"): None, (1, 1.0, "decode"): None}
    done = sweep(spec, power, budget=100)
    assert len(done) == 2 * spec.coarse_points
    errors = curve_errors(spec, done)
    assert all(e is not None and e < 1e-9 for e in errors.values())
    assert next_points(spec, done, 10) == []


def test_max_points_caps_the_whole_sweep() -> None:
    spec = SweepSpec(tps=(1,), shares=(1.0,), max_points=23, target_error=0.001)
    done = sweep(spec, physics, budget=7)
    assert len(done) == 23
    assert next_points(spec, done, 5) == []


def test_failed_points_never_proposed_again_and_pruned_above() -> None:
    def oom(phase: str, b: int, n: int, share: float) -> float | None:
        return None if b * n > 8192 else physics(phase, b, n, share)

    for prune in (True, False):
        spec = SweepSpec(tps=(1,), shares=(1.0,), target_error=0.01, prune_failed=prune)
        calls: list[list[SweepPoint]] = []
        done = sweep(spec, oom, budget=6, calls=calls)
        assert len(keys(done)) == len(set(keys(done))), "a point measured twice"
        failed = [r for r in done if r.status == "failed"]
        assert failed
        ok = [r for r in done if r.status == "ok"]
        if prune:  # nothing above a failed cell was tried after it failed
            for r in ok:
                assert not any(r.phase == f.phase and r.batch >= f.batch and r.tokens >= f.tokens
                               for f in failed)
        else:  # without pruning, the sweep goes on into the failing region
            assert len(failed) > 3
    # a failed key measured again (the runner's retry) counts as measured
    spec = SweepSpec(tps=(1,), shares=(1.0,), phases=("decode",), coarse_points=5)
    pts = next_points(spec, [], 5)
    done = [measured(p, physics) for p in pts[1:]] + [as_records(pts[:1])[0]]
    done[-1] = record(1, 1.0, "decode", pts[0].step.batch, pts[0].step.tokens, None)
    assert curve_errors(spec, done)[(1, 1.0, "decode")] is None  # 4 ok points
    retried = [*done, measured(pts[0], physics)]
    assert curve_errors(spec, retried)[(1, 1.0, "decode")] is not None
    assert pts[0].step not in [p.step for p in next_points(spec, retried, 50)]


# --------------------------------------------------------------------------- simulated sweeps
def test_reaches_target_on_held_out_points_with_part_of_the_lattice() -> None:
    """Physics-form truth at two shares: the planner stops well before the lattice is spent, and
    the project's fitting pipeline, fitted to its points, predicts the held-out cells within the
    target."""
    spec = SweepSpec(tps=(1,), shares=(0.5, 1.0), target_error=0.05)
    done = sweep(spec, physics)
    assert len(done) < 0.4 * lattice_size(spec)
    errors = curve_errors(spec, done)
    assert all(e is not None and e <= spec.target_error for e in errors.values())
    for phase in spec.phases:
        ms = [r.measurement() for r in done if r.phase == phase]
        table, _ = fit_curve(("m@0.1", "cpu", 1, phase), ms)  # type: ignore[arg-type]
        have = {(m.share, m.batch, m.tokens) for m in ms}
        held = [Measurement("m@0.1", "cpu", 1, s, phase, b, n, physics(phase, b, n, s))  # type: ignore[arg-type]
                for s in spec.shares for b, n in spec.lattice() if (s, b, n) not in have]
        assert len(held) > len(ms)
        ape = np.abs(predict_points(table, held) / np.array([m.latency_ms for m in held]) - 1)
        assert float(np.median(ape)) <= spec.target_error, phase


def _kink_distance(cells: Sequence[tuple[int, int]]) -> NDArray:
    a = np.log2(np.array(cells, dtype=float))
    return np.abs(a[:, 0] + a[:, 1] - KINK) / math.sqrt(2.0)


def _held_out_mean_error(spec: SweepSpec, cells: list[tuple[int, int]]) -> float:
    """Mean error of piecewise-linear interpolation in log-log space at the unmeasured cells."""
    x = np.log2(np.array(cells, dtype=float))
    y = np.log([kinked("prefill", b, n) for b, n in cells])
    held = [c for c in spec.lattice() if c not in set(cells)]
    xh = np.log2(np.array(held, dtype=float))
    pred = LinearNDInterpolator(x, y)(xh)
    pred = np.where(np.isnan(pred), NearestNDInterpolator(x, y)(xh), pred)
    truth = np.array([kinked("prefill", b, n) for b, n in held])
    return float(np.mean(np.abs(np.exp(pred) / truth - 1.0)))


def test_refinement_clusters_at_the_kink_and_beats_random_selection() -> None:
    spec = SweepSpec(tps=(1,), shares=(1.0,), phases=("prefill",), target_error=0.05,
                     error_quantile=0.75)
    calls: list[list[SweepPoint]] = []
    done = sweep(spec, kinked, calls=calls)
    cells = [(r.batch, r.tokens) for r in done]
    assert len(cells) < 0.5 * lattice_size(spec)
    assert curve_errors(spec, done)[(1, 1.0, "prefill")] <= spec.target_error  # type: ignore[operator]
    coarse, refined = cells[: spec.coarse_points], cells[spec.coarse_points:]
    assert len(refined) >= 10
    rest = [c for c in spec.lattice() if c not in set(coarse)]
    rng = np.random.default_rng(0)
    d_rest = _kink_distance(rest)
    draws = [rng.choice(len(rest), len(refined), replace=False) for _ in range(300)]
    # the refinement points lie nearer the kink than 99% of uniform random selections
    random_mean = np.array([d_rest[i].mean() for i in draws])
    assert _kink_distance(refined).mean() < np.percentile(random_mean, 1)
    # and predict the held-out cells better than 95% of random selections of as many points
    ours = _held_out_mean_error(spec, cells)
    theirs = np.array([_held_out_mean_error(spec, coarse + [rest[j] for j in i])
                       for i in draws[:100]])
    assert ours < np.percentile(theirs, 5)


def test_a_small_max_points_still_leaves_every_curve_fittable():
    """With room for fewer than coarse_points per curve, every curve gets MIN_CURVE_POINTS
    before any curve gets more."""
    spec = SweepSpec(tps=(1,), shares=(1.0, 0.5), max_batch=8, max_tokens=128, max_points=20)
    pts = next_points(spec, [], budget_points=100)
    per_curve: dict = {}
    for p in pts:
        key = (p.tp, p.share, p.step.phase)
        per_curve[key] = per_curve.get(key, 0) + 1
    assert len(pts) == 20 and len(per_curve) == 4
    assert all(n >= MIN_CURVE_POINTS for n in per_curve.values()), per_curve
