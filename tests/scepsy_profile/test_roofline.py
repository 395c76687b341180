"""Tests for the analytical roofline latency model, its calibration and its calibration files.

Oracles: the closed forms of the module docstring recomputed from ``ModelSpec``/``GPUSpec``
numbers, monotonicity that the physics implies (more work or a slower/smaller GPU share never
makes a step faster), and calibrations that must recover a known truth from data it generated.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import fields, replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shared_file
from scepsy_common.errors import InputError
from scepsy_profile.catalog import default_catalog
from scepsy_profile.importers import load_muxserve_grid
from scepsy_profile.roofline import (
    _LOWER,
    _UPPER,
    AllReduceCost,
    PhaseEfficiency,
    RooflineCalibration,
    RooflineModel,
    bundled_calibration,
    calibrate_allreduce,
    calibrate_roofline,
    load_calibration,
    roofline_model,
    save_calibration,
)
from scepsy_profile.synthetic import synthetic_measurements

MODELS = ("llama-2-7b", "llama-3-8b", "qwen2.5-14b", "llama-2-70b")
GPUS = ("A100-80GB", "H100-80GB", "L4")
TPS = (1, 2, 4, 8)
PHASES = ("prefill", "decode")
REL = 1e-12  # float rounding slack for monotonicity; any real violation is far larger

CAT = default_catalog()
ROOF = roofline_model()

FAST = settings(max_examples=60, deadline=None)

models = st.sampled_from(MODELS)
gpus = st.sampled_from(GPUS)
tps = st.sampled_from(TPS)
phases = st.sampled_from(PHASES)
shares = st.floats(0.05, 1.0)
batches = st.integers(1, 512)
tokens = st.integers(1, 8192)


def step(phase: str, model: str, gpu: str, tp: int, share, batch, tok):
    fn = ROOF.prefill_ms if phase == "prefill" else ROOF.decode_ms
    return fn(model, gpu, tp, share, batch, tok)


def test_catalog_entries_used_here_support_all_tp_degrees() -> None:
    for m in MODELS:
        for tp in TPS:
            assert CAT.model(m).supports_tp(tp), (m, tp)
    for g in GPUS:
        assert CAT.has_gpu(g)


# --------------------------------------------------------------------------- physics
# (monotonicity in batch, tokens and share, scalar vs array, unknown instances and bad queries are
# checked for every latency model in tests/scepsy_profile/test_latency_conformance.py)


@FAST
@given(phases, models, tps, shares, batches, tokens)
def test_faster_gpu_is_never_slower(phase, model, tp, share, b, n) -> None:
    a100, h100 = CAT.gpu("A100-80GB"), CAT.gpu("H100-80GB")
    # the premise of the test: H100 beats A100 on every datasheet number the model uses
    assert h100.peak_flops > a100.peak_flops and h100.hbm_bytes_per_s > a100.hbm_bytes_per_s
    assert h100.interconnect_bytes_per_s > a100.interconnect_bytes_per_s
    fast = step(phase, model, "H100-80GB", tp, share, b, n)
    slow = step(phase, model, "A100-80GB", tp, share, b, n)
    assert fast <= slow * (1 + REL)


@st.composite
def big_prefill(draw):
    n = draw(st.integers(1, 8192))
    b = draw(st.integers(max(1, math.ceil(8192 / n)), max(1, math.ceil(8192 / n)) * 4))
    return b, n


@FAST
@given(models, gpus, shares, big_prefill())
def test_higher_tp_is_faster_for_large_prefill(model, gpu, share, work) -> None:
    b, n = work
    assert b * n >= 8192
    times = [ROOF.prefill_ms(model, gpu, tp, share, b, n) for tp in TPS]
    assert all(t2 < t1 for t1, t2 in pairwise(times)), times


# --------------------------------------------------------------------------- breakdown


@FAST
@given(phases, models, gpus, tps, shares, batches, tokens)
def test_breakdown_total_lies_between_max_and_sum_bounds(phase, model, gpu, tp, share, b, n) -> None:
    br = ROOF.breakdown(model, gpu, tp, phase, share, b, n)
    fixed = br["overhead_ms"] + br["communication_ms"]
    c, m = br["compute_ms"], br["memory_ms"]
    assert min(c, m, br["overhead_ms"]) > 0 and br["communication_ms"] >= 0
    assert br["total_ms"] >= (fixed + max(c, m)) * (1 - 1e-12)
    assert br["total_ms"] <= (fixed + c + m) * (1 + 1e-12)
    assert br["total_ms"] == pytest.approx(step(phase, model, gpu, tp, share, b, n), rel=1e-12)
    assert (br["communication_ms"] == 0) == (tp == 1)


@FAST
@given(phases, models, gpus, tps, shares, batches, tokens)
def test_breakdown_terms_match_docstring_closed_forms(phase, model, gpu, tp, share, b, n) -> None:
    """Recompute each term from the ModelSpec/GPUSpec numbers and the module docstring."""
    spec, g = CAT.model(model), CAT.gpu(gpu)
    cal = bundled_calibration()
    e, ar = cal.phase(phase), cal.allreduce
    L = spec.layers
    if phase == "prefill":
        flops = b * (n * 2 * L * spec.layer_matmul_params + 2 * spec.head_matmul_params
                     + spec.attention_flops(n, n))
        kv_tokens, act_tokens = b * n, b * n
    else:
        flops = b * (2 * L * spec.layer_matmul_params + 2 * spec.head_matmul_params
                     + spec.attention_flops(1, n + 1))
        kv_tokens, act_tokens = b * n, b
    compute = 1e3 * flops / tp / (g.bf16_tflops * 1e12 * e.compute_eff
                                  * min(1.0, share / e.compute_share_sat))
    nbytes = spec.weight_bytes_per_gpu(tp) + kv_tokens * spec.kv_bytes_per_token_per_gpu(tp)
    memory = 1e3 * nbytes / (g.hbm_gbps * 1e9 * e.memory_eff * min(1.0, share / e.memory_share_sat))
    comm = 0.0 if tp == 1 else 2 * L * (ar.latency_us * 1e-3 + 1e3 * 2 * (tp - 1) / tp
                                        * act_tokens * spec.hidden * spec.dtype_bytes
                                        / (g.interconnect_gbps * 1e9 * ar.efficiency))
    br = ROOF.breakdown(model, gpu, tp, phase, share, b, n)
    assert br["compute_ms"] == pytest.approx(compute, rel=1e-9)
    assert br["memory_ms"] == pytest.approx(memory, rel=1e-9)
    assert br["communication_ms"] == pytest.approx(comm, rel=1e-9, abs=0)
    assert br["overhead_ms"] == pytest.approx(e.overhead_ms + L * e.layer_overhead_ms, rel=1e-12)
    p = e.smooth_power
    body = (compute**p + memory**p) ** (1 / p)
    assert br["total_ms"] == pytest.approx(br["overhead_ms"] + body + comm, rel=1e-9)


# --------------------------------------------------------------------------- calibration

TRUTH = RooflineCalibration(
    prefill=PhaseEfficiency(compute_eff=0.45, memory_eff=0.8, compute_share_sat=0.9,
                            memory_share_sat=0.4, overhead_ms=3.0, layer_overhead_ms=0.05,
                            smooth_power=3.0),
    decode=PhaseEfficiency(compute_eff=0.35, memory_eff=0.85, compute_share_sat=0.8,
                           memory_share_sat=0.3, overhead_ms=2.5, layer_overhead_ms=0.08,
                           smooth_power=2.5),
    allreduce=AllReduceCost(latency_us=30.0, efficiency=0.5),
    source="test truth",
)
CAL_MODELS = ("llama-2-7b", "qwen2.5-14b")


def test_truth_differs_from_defaults() -> None:
    """The oracle would be vacuous if the fit's starting point already were the truth."""
    for phase in PHASES:
        eff = TRUTH.phase(phase)
        for f in fields(PhaseEfficiency):
            assert getattr(eff, f.name) != getattr(PhaseEfficiency(), f.name), (phase, f.name)


def _predictions_error(model: RooflineModel, data) -> dict[str, np.ndarray]:
    err: dict[str, list[float]] = defaultdict(list)
    for m in data:
        fn = model.prefill_ms if m.phase == "prefill" else model.decode_ms
        err[m.phase].append(abs(fn(m.model, m.gpu, m.tp, m.share, m.batch, m.tokens)
                                / m.latency_ms - 1))
    return {k: np.array(v) for k, v in err.items()}


def test_calibration_recovers_a_known_truth() -> None:
    truth = RooflineModel(CAT, TRUTH)
    data = tuple(pt for name in CAL_MODELS
                 for pt in synthetic_measurements(truth, name, "A100-80GB", tps=(1, 2)))
    cal, report = calibrate_roofline(data, CAT, allreduce=TRUTH.allreduce, source="oracle")
    assert cal.source == "oracle" and cal.allreduce == TRUTH.allreduce
    err = _predictions_error(RooflineModel(CAT, cal), data)
    for phase in PHASES:
        assert np.median(err[phase]) <= 0.01, phase
        assert report.median_ape[phase] <= 0.01
        assert report.n_points[phase] == len(err[phase])
        got, want = cal.phase(phase).compute_eff, TRUTH.phase(phase).compute_eff
        assert got == pytest.approx(want, rel=0.10), phase
    # the uncalibrated defaults are clearly worse, so the check above has teeth
    default_err = _predictions_error(RooflineModel(CAT, replace(RooflineCalibration(),
                                                                allreduce=TRUTH.allreduce)), data)
    assert max(np.median(default_err[p]) for p in PHASES) > 0.05


def test_calibration_with_noise_tracks_the_truth_function() -> None:
    truth = RooflineModel(CAT, TRUTH)
    noisy = synthetic_measurements(truth, "llama-2-7b", "A100-80GB", tps=(1, 2), noise=0.03, seed=3)
    clean = synthetic_measurements(truth, "llama-2-7b", "A100-80GB", tps=(1, 2))
    cal, _ = calibrate_roofline(noisy, CAT, allreduce=TRUTH.allreduce)
    err = _predictions_error(RooflineModel(CAT, cal), clean)
    for phase in PHASES:
        assert np.median(err[phase]) <= 0.02, phase


def test_calibration_rejects_data_without_catalog_entries() -> None:
    pts = synthetic_measurements(ROOF, "llama-2-7b", "A100-80GB", tps=(1,), shares=(1.0,),
                                 batches=(1,), tokens=(32,))
    foreign = [replace(p, model="no-such-model") for p in pts]
    with pytest.raises(InputError, match="model"):
        calibrate_roofline(foreign, CAT)


def _ring_ms(w: int, size: float, lat_us: float, eff: float, link_gbps: float) -> float:
    return lat_us * 1e-3 + 1e3 * 2 * (w - 1) / w * size / (link_gbps * 1e9 * eff)


@settings(max_examples=25, deadline=None)
@given(st.floats(1.0, 300.0), st.floats(0.05, 1.0), st.sampled_from([64.0, 300.0, 600.0, 900.0]))
def test_calibrate_allreduce_recovers_latency_and_efficiency(lat_us, eff, link) -> None:
    pts = [(w, size, _ring_ms(w, size, lat_us, eff, link))
           for w in (2, 4, 8) for size in 10.0 ** np.arange(3, 10)]
    ar = calibrate_allreduce(pts, link)
    assert ar.latency_us == pytest.approx(lat_us, rel=0.01)
    assert ar.efficiency == pytest.approx(eff, rel=0.01)


@pytest.mark.parametrize("pts", [[(2, 1e6, 0.1)], [(2, 1e6, 0.1), (4, 1e6, 0.0)],
                                 [(2, 1e6, 0.1), (4, 1e7, -1.0)]])
def test_calibrate_allreduce_rejects_too_few_or_non_positive_timings(pts) -> None:
    with pytest.raises(InputError, match="time_ms"):
        calibrate_allreduce(pts, 600.0)


# --------------------------------------------------------------------------- files

phase_eff = st.builds(
    PhaseEfficiency,
    **{f: st.floats(_LOWER[f], _UPPER[f]) for f in _LOWER},
)


@settings(max_examples=30, deadline=None)
@given(phase_eff, phase_eff, st.floats(0.0, 1000.0), st.floats(0.01, 1.0),
       st.text(min_size=0, max_size=20))
def test_save_load_round_trip(tmp_path_factory, pre, dec, lat, eff, source) -> None:
    cal = RooflineCalibration(pre, dec, AllReduceCost(lat, eff), source)
    path = tmp_path_factory.mktemp("cal") / "cal.yaml"
    save_calibration(cal, path)
    assert load_calibration(path) == cal


def test_bundled_calibration_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "roofline.yaml"
    save_calibration(bundled_calibration(), path)
    assert load_calibration(path) == bundled_calibration()


def _valid_doc() -> dict:
    return RooflineCalibration(prefill=TRUTH.prefill, decode=TRUTH.decode,
                               allreduce=TRUTH.allreduce, source="x").to_dict()


def _drop_decode(d: dict) -> None:
    del d["decode"]


def _set(section: str, field: str, value):
    def edit(d: dict) -> None:
        d[section][field] = value
    return edit


@pytest.mark.parametrize(("edit", "field"), [
    (_drop_decode, "decode"),
    (_set("prefill", "overhead_ms", -1.0), "prefill.overhead_ms"),
    (_set("decode", "layer_overhead_ms", -0.5), "decode.layer_overhead_ms"),
    (_set("decode", "memory_eff", 1.5), "decode.memory_eff"),
    (_set("prefill", "compute_eff", 1.01), "prefill.compute_eff"),
    (_set("allreduce", "efficiency", 2.0), "allreduce.efficiency"),
    (_set("prefill", "warp_eff", 0.5), "prefill.warp_eff"),
    (_set("allreduce", "latency_us", "fast"), "allreduce.latency_us"),
])
def test_malformed_calibration_names_file_and_field(tmp_path: Path, edit, field) -> None:
    doc = _valid_doc()
    edit(doc)
    path = tmp_path / "my-calibration.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_calibration(path)
    assert "my-calibration.yaml" in str(info.value)
    assert field in str(info.value)
    assert info.value.field == field


def test_unknown_top_level_field_is_rejected(tmp_path: Path) -> None:
    doc = _valid_doc()
    doc["tensor_cores"] = 4
    path = tmp_path / "extra.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    with pytest.raises(InputError, match=r"extra\.yaml.*tensor_cores"):
        load_calibration(path)


@pytest.mark.parametrize("text", ["prefill: [unclosed\n", "prefill: {a: 1\n  b: : :\n"])
def test_invalid_yaml_names_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "broken-cal.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match="YAML") as info:
        load_calibration(path)
    assert "broken-cal.yaml" in str(info.value)


@pytest.mark.parametrize("text", ["", "- 1\n- 2\n", "just a string\n"])
def test_non_mapping_yaml_is_an_input_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "odd-cal.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=r"odd-cal\.yaml"):
        load_calibration(path)


def test_missing_calibration_file_names_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere-cal.yaml"
    with pytest.raises(InputError) as info:
        load_calibration(path)
    assert "nowhere-cal.yaml" in str(info.value)


@pytest.mark.parametrize("kind", ["directory", "non-utf8"])
def test_unreadable_calibration_paths_are_input_errors(tmp_path: Path, kind: str) -> None:
    """A directory or non-UTF-8 file is an InputError, like every malformed file.

    errors.py promises every malformed file becomes an InputError (the CLI catches only that
    one, so ``--calibration <dir>`` prints a traceback); load_catalog handles both cases.
    """
    path = tmp_path / "binary-cal.yaml"
    if kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"\xff\xfe\x00prefill")
    with pytest.raises(InputError) as info:
        load_calibration(path)
    assert "binary-cal.yaml" in str(info.value)


# --------------------------------------------------------------------------- coverage, names


@pytest.mark.parametrize(("model", "gpu", "tp", "expected"), [
    ("llama-2-7b", "A100-80GB", 1, True),
    ("LLAMA-2-7B", "a100-80gb", 8, True),
    ("no-such-llm", "A100-80GB", 1, False),
    ("llama-2-7b", "Z9000", 1, False),
    ("llama-2-7b", "A100-80GB", 3, False),  # 32 heads do not split 3 ways
    ("qwen2.5-14b", "A100-80GB", 16, False),  # 40 heads do not split 16 ways
    ("llama-2-7b", "A100-80GB", 0, False),
])
def test_covers(model, gpu, tp, expected) -> None:
    assert ROOF.covers(model, gpu, tp) is expected


# --------------------------------------------------------------------------- bundled data


def test_bundled_calibration_within_documented_bounds() -> None:
    cal = bundled_calibration()
    assert cal.source  # says where it came from
    for phase in PHASES:
        eff = cal.phase(phase)
        for f in fields(PhaseEfficiency):
            v = getattr(eff, f.name)
            assert math.isfinite(v)
            assert _LOWER[f.name] <= v <= _UPPER[f.name], (phase, f.name, v)
    # calibrate_allreduce's bounds
    assert 0.0 <= cal.allreduce.latency_us <= 1000.0
    assert 0.01 <= cal.allreduce.efficiency <= 1.0
    assert roofline_model().calibration == cal


@pytest.mark.shared_data
def test_bundled_roofline_matches_muxserve_grid() -> None:
    grid = load_muxserve_grid(shared_file("profiles/muxserve/llama-a100-80gb.json"))
    groups: dict[tuple, list] = defaultdict(list)
    for m in grid:
        groups[(m.model, m.gpu, m.tp, m.phase)].append(m)
    errors: dict[str, list[np.ndarray]] = defaultdict(list)
    for (model, gpu, tp, phase), pts in groups.items():
        assert CAT.has_model(model) and CAT.has_gpu(gpu), model
        s, b, n, y = (np.array([getattr(p, f) for p in pts], float)
                      for f in ("share", "batch", "tokens", "latency_ms"))
        pred = ROOF.step_ms(model, gpu, tp, phase, s, b, n)
        errors[phase].append(np.abs(pred / y - 1))
    for phase in PHASES:
        err = np.concatenate(errors[phase])
        assert len(err) > 1000
        assert np.median(err) <= 0.25, (phase, np.median(err))
