"""The fitted latency curves: oracle accuracy, physics properties, persistence, errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.conftest import BUNDLED_CURVES, GPU, MODEL, shared_file

from scepsy_profile.errors import InputError, UnknownEntryError
from scepsy_profile.fitted import cross_validate, fit_latency_model, load_curves, save_curves
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
curve_sources = st.sampled_from(["synthetic", "bundled"])
phases = st.sampled_from(PHASES)
batches = st.floats(1, 4096)
tokens = st.floats(1, 8192)
shares = st.floats(0.02, 1.0)


def _pick(src, synthetic_fit, bundled_curves, data):
    if src == "synthetic":
        return synthetic_fit, MODEL, data.draw(st.sampled_from([1, 2, 4]))
    name = data.draw(st.sampled_from(bundled_curves.models()))
    tps = bundled_curves.tps(name, "A100-80GB")
    return bundled_curves, name, data.draw(st.integers(tps[0], tps[-1]))


@settings(max_examples=150, deadline=None)
@given(src=curve_sources, phase=phases, b=batches, n=tokens, s=shares,
       f=st.floats(1.0, 8.0), data=st.data())
def test_more_batch_or_tokens_is_never_faster(synthetic_fit, bundled_curves, src, phase, b, n, s,
                                              f, data):
    model, name, tp = _pick(src, synthetic_fit, bundled_curves, data)
    gpu = GPU if src == "synthetic" else "A100-80GB"
    base = _query(model, phase, name, gpu, tp, s, b, n)
    assert _query(model, phase, name, gpu, tp, s, b * f, n) >= base * (1 - 1e-12)
    assert _query(model, phase, name, gpu, tp, s, b, n * f) >= base * (1 - 1e-12)


@settings(max_examples=150, deadline=None)
@given(src=curve_sources, phase=phases, b=batches, n=tokens, s=shares,
       f=st.floats(1.0, 50.0), data=st.data())
def test_more_share_is_never_slower(synthetic_fit, bundled_curves, src, phase, b, n, s, f, data):
    model, name, tp = _pick(src, synthetic_fit, bundled_curves, data)
    gpu = GPU if src == "synthetic" else "A100-80GB"
    more = min(1.0, s * f)
    assert _query(model, phase, name, gpu, tp, more, b, n) <= _query(
        model, phase, name, gpu, tp, s, b, n) * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(src=curve_sources, phase=phases, data=st.data(),
       pts=st.lists(st.tuples(shares, batches, tokens), min_size=1, max_size=20))
def test_vectorised_and_scalar_queries_agree(synthetic_fit, bundled_curves, src, phase, data, pts):
    model, name, tp = _pick(src, synthetic_fit, bundled_curves, data)
    gpu = GPU if src == "synthetic" else "A100-80GB"
    s, b, n = (np.array(c) for c in zip(*pts, strict=True))
    vec = _query(model, phase, name, gpu, tp, s, b, n)
    one = [_query(model, phase, name, gpu, tp, float(x), float(y), float(z)) for x, y, z in pts]
    assert isinstance(one[0], float)
    np.testing.assert_allclose(vec, one, rtol=1e-12)


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


def test_unknown_model_and_tp_outside_the_measured_range(synthetic_fit):
    assert synthetic_fit.covers(MODEL, GPU, 2)
    assert not synthetic_fit.covers(MODEL, GPU, 8)
    assert not synthetic_fit.covers("llama-65b", GPU, 1)
    with pytest.raises(UnknownEntryError, match="tp"):
        synthetic_fit.prefill_ms(MODEL, GPU, 8, 1.0, 1, 128)
    with pytest.raises(UnknownEntryError, match="llama-65b"):
        synthetic_fit.decode_ms("llama-65b", GPU, 1, 1.0, 1, 128)
    with pytest.raises(InputError, match="share"):
        synthetic_fit.decode_ms(MODEL, GPU, 1, 1.5, 1, 128)
    with pytest.raises(InputError, match="batch"):
        synthetic_fit.decode_ms(MODEL, GPU, 1, 1.0, np.array([1, 0]), 128)


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
