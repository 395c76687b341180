"""The bundled vLLM CPU profile (datasets/profiles/vllm-cpu-*): a valid store whose fitted
curves predict a batch they were not fitted on, and a serving curve that compares with it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scepsy_profile.fitted import fit_latency_model
from scepsy_profile.profiling.servecurve import compare_with_step_profile, load_result
from scepsy_profile.profiling.store import checked_store, store_measurements

DATA = Path(__file__).resolve().parents[2] / "datasets" / "profiles"
STORE = DATA / "vllm-cpu-llama-3-8b-x0.0625.jsonl"
CURVE = DATA / "vllm-cpu-llama-3-8b-x0.0625.serve-curve.json"


def test_the_bundled_store_is_whole_and_records_the_shrink():
    contents = checked_store(STORE)
    assert len(contents.records) == 72 and not contents.problems
    assert {r.tp for r in contents.records} == {1, 2}
    assert all(r.status == "ok" and r.scale == 0.0625 and r.config["layers"] == 2
               and r.engine == "vllm" for r in contents.records)
    assert len({r.key() for r in contents.records}) == 72


def test_curves_fitted_without_batch_8_predict_it_within_15_percent():
    rows, _ = store_measurements(checked_store(STORE))
    train = [m for m in rows if m.batch != 8]
    held = [m for m in rows if m.batch == 8]
    assert len(held) == 12
    curves = fit_latency_model(train)
    for m in held:
        fn = curves.prefill_ms if m.phase == "prefill" else curves.decode_ms
        got = float(fn(m.model, m.gpu, m.tp, m.share, m.batch, m.tokens))
        assert abs(got / m.latency_ms - 1) <= 0.15, (m, got)


def test_the_bundled_serving_curve_compares_with_its_step_profile():
    rows, _ = store_measurements(checked_store(STORE))
    measured = load_result(CURVE)
    cmp = compare_with_step_profile(measured, fit_latency_model(rows))
    achieved = max(p.achieved_rate for p in measured.points)
    assert cmp.measured_mu == measured.saturation_rate and cmp.measured_mu <= achieved + 1e-9
    assert np.isfinite(cmp.predicted_mu) and cmp.predicted_mu > 0
    assert [x.fraction for x in cmp.loads] == [0.3, 0.6, 0.9]
    assert "saturation" in cmp.verdict
