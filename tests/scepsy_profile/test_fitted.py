"""The fitted latency curves: oracle accuracy, physics properties, persistence, errors."""

from __future__ import annotations

import json
import math
import pickle
import random
import re
import shlex
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, WhiteKernel
from sklearn.gaussian_process.kernels import ConstantKernel as C

from conftest import BUNDLED_CURVES, GPU, MODEL, REPO, shared_file
from scepsy.cli import main
from scepsy_common.errors import InputError
from scepsy_profile.fitted import (
    CurveTable,
    FittedLatencyModel,
    _glitch_weights,
    cross_validate,
    fit_curve,
    fit_latency_model,
    load_curves,
    save_curves,
)
from scepsy_profile.synthetic import synthetic_measurements

PHASES = ("prefill", "decode")


def _query(model, phase, name, gpu, tp, share, batch, tokens):
    fn = model.prefill_ms if phase == "prefill" else model.decode_ms
    return fn(name, gpu, tp, share, batch, tokens)


# --------------------------------------------------------------------------- oracle accuracy
def test_fit_recovers_the_generating_function_off_grid(synthetic_fit, roofline):
    """Fitted on a noisy grid (2% noise), predictions between grid points match the truth."""
    rng = np.random.default_rng(1)
    for tp in (1, 4):
        for phase in PHASES:
            b = rng.uniform(1, 128, 400)
            n = rng.uniform(32, 512, 400)
            s = rng.uniform(0.3, 1.0, 400)
            truth = _query(roofline, phase, MODEL, GPU, tp, s, b, n)
            fit = _query(synthetic_fit, phase, MODEL, GPU, tp, s, b, n)
            err = np.abs(fit / truth - 1)
            assert np.median(err) < 0.03, (tp, phase, np.median(err))
            assert np.percentile(err, 95) < 0.08, (tp, phase, np.percentile(err, 95))


def test_noise_free_grid_is_reproduced_at_measured_points(roofline):
    pts = synthetic_measurements(roofline, MODEL, GPU, tps=(2,), shares=(0.5, 1.0),
                                 batches=(1, 4, 16, 64), tokens=(64, 256, 1024))
    model = fit_latency_model(pts)
    err = [abs(_query(model, m.phase, m.model, m.gpu, m.tp, m.share, m.batch, m.tokens)
               / m.latency_ms - 1) for m in pts]
    assert np.median(err) < 0.01
    assert max(err) < 0.05


def test_cross_validation_reports_small_error_on_smooth_data(roofline):
    pts = synthetic_measurements(roofline, MODEL, GPU, tps=(1,), shares=(0.4, 0.7, 1.0),
                                 batches=(1, 2, 4, 8, 16, 32), tokens=(64, 128, 256, 512))
    results = cross_validate(pts, folds=5, seed=0)
    assert {r.key[3] for r in results} == set(PHASES)
    for r in results:
        assert len(r.ape) == len(pts) // 2
        assert not np.any(np.isnan(r.ape))
        assert r.median < 0.02, (r.key, r.median)


def test_cross_validation_detects_a_bad_point(roofline):
    """A corrupted measurement shows up as a large out-of-fold error at that point."""
    pts = list(synthetic_measurements(roofline, MODEL, GPU, tps=(1,), shares=(0.5, 1.0),
                                      batches=(1, 4, 16, 64), tokens=(64, 256)))
    i = next(k for k, m in enumerate(pts) if m.phase == "prefill" and m.batch == 16)
    bad = pts[i]
    pts[i] = replace(bad, latency_ms=bad.latency_ms * 3)
    res = {r.key: r for r in cross_validate(pts, folds=4, seed=0)}
    prefill = res[(MODEL, GPU, 1, "prefill")]
    order = [k for k, m in enumerate(pts) if m.phase == "prefill"]
    assert prefill.ape[order.index(i)] > 0.5
    assert prefill.ape[order.index(i)] == prefill.ape.max()


# --------------------------------------------------------------------------- physics properties
# (monotonicity, share, scalar vs array, unknown instances and bad queries are checked for every
# latency model, the synthetic and the bundled curves included, in test_latency_conformance.py)
def test_prefill_feels_the_share_more_than_decode(bundled_curves):
    """Prefill is compute-bound, decode memory-bound (DESIGN.md: 1.65x vs 1.13x at 50%)."""
    for name in bundled_curves.models():
        tp = bundled_curves.tps(name, "A100-80GB")[0]
        ratio = {ph: _query(bundled_curves, ph, name, "A100-80GB", tp, 0.5, 32, 512)
                 / _query(bundled_curves, ph, name, "A100-80GB", tp, 1.0, 32, 512) for ph in PHASES}
        assert ratio["prefill"] > ratio["decode"] >= 1.0, (name, ratio)


def test_bundled_curves_reproduce_the_documented_grid_point(bundled_curves):
    """shared/data/README.md: llama-7b TP1 100% SMs, batch 32, seq 512: 1218 ms / 18.7 ms."""
    assert bundled_curves.prefill_ms("llama-7b", "A100-80GB", 1, 1.0, 32, 512) == pytest.approx(1218, rel=0.03)
    assert bundled_curves.decode_ms("llama-7b", "A100-80GB", 1, 1.0, 32, 512) == pytest.approx(18.7, rel=0.05)


@pytest.mark.shared_data
def test_bundled_curves_match_the_muxserve_grid(bundled_curves):
    from scepsy_profile.importers import load_muxserve_grid

    rows = load_muxserve_grid(shared_file("profiles/muxserve/llama-a100-80gb.json"))
    errs: dict[tuple, list[float]] = {}
    for m in rows:
        got = _query(bundled_curves, m.phase, m.model, m.gpu, m.tp, m.share, m.batch, m.tokens)
        errs.setdefault(m.key(), []).append(abs(got / m.latency_ms - 1))
    assert set(errs) == set(bundled_curves.curve_keys())
    for key, e in errs.items():
        assert np.median(e) < 0.03, (key, np.median(e))


# --------------------------------------------------------------------------- TP interpolation
def test_unmeasured_tp_is_geometric_interpolation(synthetic_fit):
    for phase in PHASES:
        lo = _query(synthetic_fit, phase, MODEL, GPU, 1, 0.6, 24, 300)
        hi = _query(synthetic_fit, phase, MODEL, GPU, 4, 0.6, 24, 300)
        mid = _query(synthetic_fit, phase, MODEL, GPU, 2, 0.6, 24, 300)
        assert mid == pytest.approx(math.sqrt(lo * hi), rel=1e-12)


# --------------------------------------------------------------------------- persistence
def test_save_load_round_trip_and_deterministic_bytes(synthetic_points, synthetic_fit, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save_curves(synthetic_fit, a)
    save_curves(fit_latency_model(synthetic_points, seed=0), b)
    assert a.read_bytes() == b.read_bytes()
    loaded = load_curves(a)
    assert loaded.curve_keys() == synthetic_fit.curve_keys()
    rng = np.random.default_rng(3)
    s, bb, n = rng.uniform(0.1, 1, 50), rng.uniform(1, 300, 50), rng.uniform(1, 2000, 50)
    for phase in PHASES:
        np.testing.assert_array_equal(_query(loaded, phase, MODEL, GPU, 4, s, bb, n),
                                      _query(synthetic_fit, phase, MODEL, GPU, 4, s, bb, n))


def test_bundled_curves_file_is_valid():
    model = load_curves(BUNDLED_CURVES)
    assert {k[0] for k in model.curve_keys()} == {"llama-7b", "llama-13b", "llama-30b", "llama-65b"}


def _corrupt(tmp_path, mutate):
    doc = json.loads(BUNDLED_CURVES.read_text())
    doc["curves"] = doc["curves"][:1]
    mutate(doc)
    path = tmp_path / "curves.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d.update(format="other/9"), "format"),
    (lambda d: d["curves"][0].pop("values"), "values"),
    (lambda d: d["curves"][0].update(tp=0), "tp"),
    (lambda d: d["curves"][0].update(phase="train"), "phase"),
    (lambda d: d["curves"][0].update(batch_nodes=[4, 2, *d["curves"][0]["batch_nodes"][2:]]), "batch_nodes"),
    (lambda d: d["curves"][0]["values"][0][0].__setitem__(0, -1.0), "values"),
    (lambda d: d["curves"][0].update(values=[[[1.0]]]), "values"),
    (lambda d: d["curves"][0].update(extra=1), "extra"),
])
def test_malformed_curves_files_name_the_field(tmp_path, mutate, field):
    path = _corrupt(tmp_path, mutate)
    with pytest.raises(InputError) as err:
        load_curves(path)
    assert str(path) in str(err.value)
    assert field in str(err.value)


def test_missing_and_invalid_curves_files(tmp_path):
    with pytest.raises(InputError, match="existing, readable curves file"):
        load_curves(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="valid JSON"):
        load_curves(bad)


def test_fit_rejects_empty_input():
    with pytest.raises(InputError, match="at least one measurement"):
        fit_latency_model([])


def test_pickled_curve_table_stays_read_only(synthetic_fit):
    table = pickle.loads(pickle.dumps(synthetic_fit.curves[(MODEL, GPU, 1, "decode")]))
    for name in ("batch_nodes", "token_nodes", "share_nodes", "values"):
        with pytest.raises(ValueError, match="read-only"):
            getattr(table, name)[0] = 1.0


def test_covers_needs_both_phases(synthetic_fit):
    """A TP degree with prefill curves but no decode curve is not covered (a query would fail)."""
    curves = {k: t for k, t in synthetic_fit.curves.items() if k[2:] != (4, "decode")}
    partial = FittedLatencyModel(curves)
    assert partial.prefill_ms(MODEL, GPU, 4, 1.0, 1, 128) > 0
    assert partial.covers(MODEL, GPU, 1)
    assert not partial.covers(MODEL, GPU, 4)
    assert not partial.covers(MODEL, GPU, 2)


# --------------------------------------------------------------------------- reproducibility
# Fitted curves reproduce on any machine within this relative tolerance per lattice value (and
# absolute per edge elasticity); docs/profiles.md states it. A last-bit difference moves the fit by
# about 1e-5 (mostly the rounding to 6 significant digits), a flipped decision by up to 30%.
REPRO_REL = 1e-3


def _table_gap(a: CurveTable, b: CurveTable) -> float:
    """Largest relative difference of two tables' values and elasticities (nodes must agree)."""
    assert a.key == b.key
    for name in ("batch_nodes", "token_nodes", "share_nodes"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"{a.key} {name}")
    elast = max(abs(getattr(a, e) - getattr(b, e))
                for e in ("batch_elasticity", "token_elasticity", "share_elasticity"))
    return max(float(np.max(np.abs(a.values / b.values - 1.0))), elast)


def _nudge(points, seed: int, rel: float = 1e-12):
    """The measurements with latency and share moved by about ``rel`` (a last-bit difference)."""
    rng = np.random.default_rng(seed)
    return [replace(m, latency_ms=m.latency_ms * (1 + rel * rng.standard_normal()),
                    share=min(1.0, m.share * (1 + rel * rng.standard_normal()))) for m in points]


def test_fit_does_not_depend_on_the_order_of_the_measurements(synthetic_points):
    key = (MODEL, GPU, 1, "decode")
    pts = [m for m in synthetic_points if m.key() == key]
    shuffled = list(pts)
    random.Random(0).shuffle(shuffled)
    a, _ = fit_curve(key, pts, 0)
    b, _ = fit_curve(key, shuffled, 0)
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())  # sorted first: the same computation


@pytest.mark.parametrize("key", [(MODEL, GPU, 1, "prefill"), (MODEL, GPU, 4, "decode")])
def test_last_bit_perturbations_do_not_move_the_synthetic_fit(synthetic_fit, synthetic_points, key):
    pts = [m for m in synthetic_points if m.key() == key]
    table, _ = fit_curve(key, _nudge(pts, seed=0), 0)
    assert _table_gap(table, synthetic_fit.curves[key]) <= REPRO_REL


def _glitch_setup():
    """A smooth, slightly noisy residual surface on a 6x6 grid and a GP kernel for it."""
    b, n = np.meshgrid(np.arange(6.0), np.arange(6.0), indexing="ij")
    x = np.stack([b.ravel(), n.ravel()], axis=-1)
    r = (0.03 * np.sin(0.7 * x[:, 0]) + 0.02 * np.cos(0.5 * x[:, 1])
         + 0.01 * np.sin(3.1 * np.arange(len(x))))
    return x, r, C(0.03**2) * RBF([1.0, 1.0]) + WhiteKernel(1e-3)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(i=st.integers(0, 35), sign=st.sampled_from([-1.0, 1.0]))
def test_glitch_weight_is_continuous_in_the_data(i, sign):
    """A spike growing through the glitch threshold loses its weight gradually, never by a jump
    (the old rule dropped it from 1 to 0 at the threshold, so a last-bit change could flip it),
    and a last-bit change of the data moves every weight by a last-bit amount."""
    x, r, kernel = _glitch_setup()
    weights = []
    for size in np.linspace(0.0, math.log(3.0), 120):
        rr = r.copy()
        rr[i] += sign * size
        gp = GaussianProcessRegressor(kernel, optimizer=None).fit(x, rr)
        w = _glitch_weights(gp, x, rr)
        assert np.all((w >= 0.0) & (w <= 1.0))
        weights.append(w[i])
        nudged = rr * (1 + 1e-12 * np.cos(np.arange(len(rr))))
        assert np.max(np.abs(_glitch_weights(gp, x, nudged) - w)) <= 1e-6
    assert weights[0] == 1.0 and weights[-1] == 0.0  # a 3x lone spike is a glitch
    assert np.max(np.abs(np.diff(weights))) <= 0.2


def test_a_lone_spike_does_not_pull_the_fit(roofline):
    """A single 3x prefill glitch (prefill residuals are not clipped) is ignored by the curve."""
    pts = [m for m in synthetic_measurements(roofline, MODEL, GPU, tps=(1,), shares=(0.5, 1.0),
                                             batches=(1, 2, 4, 8, 16, 32), tokens=(64, 128, 256, 512))
           if m.phase == "prefill"]
    i = next(k for k, m in enumerate(pts) if (m.phase, m.share, m.batch, m.tokens)
             == ("prefill", 1.0, 8, 128))
    truth = pts[i].latency_ms
    pts[i] = replace(pts[i], latency_ms=3 * truth)
    model = fit_latency_model(pts)
    assert model.prefill_ms(MODEL, GPU, 1, 1.0, 8, 128) == pytest.approx(truth, rel=0.05)


DOCUMENTED = re.compile(r"^(scepsy profile fit --muxserve .*?)\n```", re.S | re.M)


def _documented_fit_command() -> list[str]:
    """The command docs/cli.md says made the bundled curves (datasets/profiles/README.md agrees)."""
    found = DOCUMENTED.findall((REPO / "docs" / "cli.md").read_text(encoding="utf-8"))
    assert len(found) == 1, found
    args = shlex.split(found[0].replace("\\\n", " "))
    readme = (REPO / "datasets" / "profiles" / "README.md").read_text(encoding="utf-8")
    assert f"`{shlex.join(args)}`" in readme
    assert args[args.index("--out") + 1] == "datasets/profiles/muxserve-a100-curves.json"
    return args


@pytest.fixture(scope="module")
def documented_refit(tmp_path_factory) -> FittedLatencyModel:
    """The bundled curves fitted again by the documented command, into a scratch file."""
    args = _documented_fit_command()
    grid = shared_file(args[args.index("--muxserve") + 1].removeprefix("../shared/data/"))
    assert grid.exists()
    out = tmp_path_factory.mktemp("refit") / "curves.json"
    args[args.index("--out") + 1] = str(out)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        assert main(args[1:]) == 0
    return load_curves(out)


@pytest.mark.shared_data
def test_documented_command_reproduces_the_bundled_curves(documented_refit, bundled_curves):
    assert documented_refit.curve_keys() == bundled_curves.curve_keys()
    gaps = {k: _table_gap(documented_refit.curves[k], bundled_curves.curves[k])
            for k in bundled_curves.curve_keys()}
    assert max(gaps.values()) <= REPRO_REL, {k: v for k, v in gaps.items() if v > REPRO_REL}
    for k in bundled_curves.curve_keys():
        assert documented_refit.curves[k].n_points == bundled_curves.curves[k].n_points
        assert documented_refit.curves[k].source == bundled_curves.curves[k].source


# the curves whose glitch removal or physics fit flipped on last-bit differences
FLIPPED = [("llama-13b", 1, "decode"), ("llama-7b", 1, "decode"), ("llama-30b", 4, "decode"),
           ("llama-13b", 4, "prefill"), ("llama-65b", 4, "decode")]


@pytest.mark.shared_data
@pytest.mark.parametrize(("name", "tp", "phase"), FLIPPED)
def test_last_bit_perturbations_do_not_move_the_muxserve_fit(documented_refit, name, tp, phase):
    from scepsy_profile.importers import load_muxserve_grid

    key = (name, "A100-80GB", tp, phase)
    rows = load_muxserve_grid(shared_file("profiles/muxserve/llama-a100-80gb.json"))
    table, _ = fit_curve(key, _nudge([m for m in rows if m.key() == key], seed=0), 0)
    assert _table_gap(table, documented_refit.curves[key]) <= REPRO_REL


def test_a_curve_measured_at_one_share_predicts_finite_values():
    """Every CPU sweep measures share 1 only: its table has one share node, and must answer at
    that share (near the measured points) and below it (slower), never NaN."""
    from scepsy_profile.fitted import fit_curve
    from scepsy_profile.measurements import Measurement

    truth = {(b, n): 1.0 + 0.1 * b + 0.001 * b * n for b in (1, 2, 4, 8, 16) for n in (16, 64, 256)}
    pts = [Measurement("m", "cpu", 1, 1.0, "decode", b, n, v) for (b, n), v in truth.items()]
    table, _ = fit_curve(("m", "cpu", 1, "decode"), pts)
    for (b, n), v in truth.items():
        got = float(table.predict(1.0, b, n))
        assert abs(got / v - 1) < 0.05, (b, n, got, v)
        assert abs(table.predict_one(1.0, float(b), float(n)) / got - 1) < 1e-12
    lower = table.predict(np.array([1.0, 0.5, 0.25]), 4, 64)
    assert np.all(np.isfinite(lower)) and lower[0] <= lower[1] <= lower[2]
