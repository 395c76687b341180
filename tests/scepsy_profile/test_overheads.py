"""Engine overheads (scepsy_profile.overheads): the file round trip and its errors, the wrapped
latency model adding exactly its terms, the fit recovering known overheads from a serving curve
synthesised with them (the oracle), the bundled calibration improving the derived curve, and
`scepsy profile calibrate`."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import run_cli
from scepsy_common.errors import InputError
from scepsy_profile.fitted import load_curves
from scepsy_profile.overheads import (
    NO_OVERHEADS,
    EngineOverheads,
    OverheadLatencyModel,
    calibrate,
    call_delay_s,
    check_curve,
    fit_overheads,
    front_delay_s,
    load_overheads,
    save_overheads,
    with_overheads,
)
from scepsy_profile.profiling.models import profiled_name
from scepsy_profile.profiling.servecurve import (
    ServeCurvePoint,
    Stats,
    device_catalog,
    load_result,
)
from scepsy_profile.serving import serving_curve

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "datasets/profiles/vllm-cpu-llama-3-8b-x0.0625.serve-curve.json"
CURVES = ROOT / "datasets/profiles/vllm-cpu-llama-3-8b-x0.0625-curves.json"
BUNDLED = ROOT / "datasets/overheads/vllm-cpu-0.32.0.yaml"
KNOWN = EngineOverheads("vllm", "0.32.0", "cpu", iteration_ms=0.5, per_token_ms=0.2,
                        first_token_ms=3.0, http_ms=12.0, source="test")


class LinearLatency:
    """``prefill = a + b·batch + seq/100``, ``decode = c + e·batch`` ms."""

    def __init__(self, a: float = 5.0, b: float = 1.0, c: float = 2.0, e: float = 0.1) -> None:
        self.a, self.b, self.c, self.e = a, b, c, e

    def prefill_ms(self, model, gpu, tp, share, batch, seq):
        out = (self.a + self.b * np.asarray(batch, float) + np.asarray(seq, float) / 100
               + 0 * np.asarray(share, float))
        return float(out) if np.ndim(out) == 0 else out

    def decode_ms(self, model, gpu, tp, share, batch, ctx):
        out = self.c + self.e * np.asarray(batch, float) + 0 * np.asarray(share + ctx, float)
        return float(out) if np.ndim(out) == 0 else out

    def covers(self, model, gpu, tp) -> bool:
        return True


# --------------------------------------------------------------------------- the file


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_round_trip(tmp_path, suffix) -> None:
    path = tmp_path / f"o{suffix}"
    save_overheads(KNOWN, path)
    assert load_overheads(path) == KNOWN
    if suffix == ".json":
        assert json.loads(path.read_text())["iteration_ms"] == 0.5


def test_bundled_file_loads() -> None:
    o = load_overheads(BUNDLED)
    assert (o.engine, o.version, o.device) == ("vllm", "0.32.0", "cpu")
    assert all(getattr(o, t) > 0 for t in ("iteration_ms", "per_token_ms", "first_token_ms",
                                           "http_ms"))
    assert "scepsy profile calibrate" in o.source


BASE = "engine: vllm\nversion: '1'\ndevice: cpu\n"


@pytest.mark.parametrize(("text", "field"), [
    (BASE + "iteration_ms: -1\n", "iteration_ms"),
    (BASE + "http_ms: .nan\n", "http_ms"),
    (BASE + "per_token_ms: fast\n", "per_token_ms"),
    (BASE + "idle_ms: 1\n", "idle_ms"),
    ("engine: vllm\ndevice: cpu\n", "version"),
    ("engine: vllm\nversion: 0.32\ndevice: cpu\n", "version"),  # a float, not a string
    ("- 1\n- 2\n", "top level"),
])
def test_bad_files_name_the_file_and_field(tmp_path, text, field) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_overheads(path)
    assert info.value.source == str(path) and info.value.field == field


def test_bad_json_and_missing_file(tmp_path) -> None:
    bad = tmp_path / "o.json"
    bad.write_text('{"engine": "vllm", "version": "1", "device": "cpu", "first_token_ms": -2}')
    with pytest.raises(InputError, match="first_token_ms"):
        load_overheads(bad)
    with pytest.raises(InputError, match="readable"):
        load_overheads(tmp_path / "none.yaml")


@pytest.mark.parametrize("field", ["iteration_ms", "per_token_ms", "first_token_ms", "http_ms"])
@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, True])
def test_constructor_rejects_bad_terms(field, value) -> None:
    with pytest.raises(InputError) as info:
        EngineOverheads("vllm", "1", "cpu", **{field: value})
    assert info.value.field == field


# --------------------------------------------------------------------------- applying them


def test_with_overheads_adds_exactly_its_terms() -> None:
    inner = LinearLatency()
    lat = with_overheads(inner, KNOWN)
    assert isinstance(lat, OverheadLatencyModel)
    inst = ("m", "g", 1)
    for batch, seq in ((1, 128), (7, 300.0), (32, 1)):
        assert lat.prefill_ms(*inst, 0.5, batch, seq) == inner.prefill_ms(*inst, 0.5, batch,
                                                                          seq) + 0.5
        assert lat.decode_ms(*inst, 0.5, batch, seq) == inner.decode_ms(*inst, 0.5, batch,
                                                                        seq) + (0.5 + 0.2 * batch)
    b = np.array([1.0, 2.0, 8.0])
    got = lat.decode_ms(*inst, 1.0, b, 100)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, inner.decode_ms(*inst, 1.0, b, 100) + (0.5 + 0.2 * b))
    assert type(lat.prefill_ms(*inst, 1.0, 1, 1)) is float
    assert call_delay_s(lat) == pytest.approx(0.015, rel=1e-12)
    assert lat.covers(*inst)


def test_no_overheads_change_nothing() -> None:
    inner = LinearLatency()
    assert with_overheads(inner, NO_OVERHEADS) is inner
    assert call_delay_s(inner) == 0.0 and NO_OVERHEADS.call_delay_s == 0.0
    only_delay = EngineOverheads("x", "", "", http_ms=7.0)
    lat = with_overheads(inner, only_delay)
    assert lat.decode_ms("m", "g", 1, 1.0, 4, 10) == inner.decode_ms("m", "g", 1, 1.0, 4, 10)
    assert call_delay_s(lat) == 0.007


def test_bad_queries_still_raise_through_the_wrapper() -> None:
    lat = with_overheads(load_curves(CURVES), KNOWN)
    with pytest.raises(InputError) as info:
        lat.decode_ms(profiled_name("llama-3-8b", 0.0625), "cpu", 1, 1.0, 0, 100)
    assert info.value.field == "batch"


# --------------------------------------------------------------------------- fitting them


FRACTIONS = (0.03, 0.06, 0.12, 0.35, 0.6, 0.85)


def synthetic_result(truth: EngineOverheads, inner):
    """The bundled sweep's instance, with points built from ``inner`` plus ``truth`` by the
    serving model: the server's inter-token latency at the batch in service, histograms whose
    Little's-law batch is that batch, the first-token and HTTP delays at light load (and junk
    above it, and one saturated point that must be ignored)."""
    template = load_result(SERVE)
    cat, pol = device_catalog(template)
    name = profiled_name(template.model, template.scale)
    i, o = template.input_tokens, template.output_tokens
    lat = with_overheads(inner, truth)
    curve = serving_curve(lat, name, "cpu", 1, 1.0, i, o, catalog=cat, policy=pol)
    mu = curve.mu
    points = []
    for r in mu * np.array(FRACTIONS):
        b = float(curve.batch_at_rate(r))
        bb = max(b, 1.0)
        g = max(1.0, bb / o)
        stall = max(bb - g, 0.0) / (g * (o - 1))
        itl = (inner.decode_ms(name, "cpu", 1, 1.0, bb, 0) + truth.iteration_ms
               + truth.per_token_ms * bb
               + stall * (inner.prefill_ms(name, "cpu", 1, 1.0, g, i) + truth.iteration_ms))
        p1 = inner.prefill_ms(name, "cpu", 1, 1.0, 1, i) + truth.iteration_ms
        light = r <= 0.2 * mu
        ttft = p1 + truth.first_token_ms + (0.0 if light else 40.0)
        pre_s = p1 / 1e3
        dec_s = b / r - pre_s
        assert dec_s > 0
        e2e = pre_s + dec_s + truth.first_token_ms / 1e3
        client = e2e + (truth.http_ms if light else 500.0) / 1e3
        points.append(ServeCurvePoint(
            rate=r, offered_rate=r, achieved_rate=r, calls=100, completed=100, failures={},
            client={"e2e": Stats(n=95, mean=client)},
            server={"itl": Stats(n=3000, mean=itl / 1e3), "ttft": Stats(n=100, mean=ttft / 1e3),
                    "prefill": Stats(n=100, mean=pre_s), "decode": Stats(n=100, mean=dec_s),
                    "e2e": Stats(n=100, mean=e2e)},
            mean_running=b * 0.5))  # a gauge reading low: Little's law is used instead
    points.append(ServeCurvePoint(
        rate=mu * 1.2, offered_rate=mu * 1.2, achieved_rate=mu, calls=100, completed=100,
        failures={}, client={"e2e": Stats(n=95, mean=9.0)},
        server={"itl": Stats(n=10, mean=1.0), "ttft": Stats(n=10, mean=5.0),
                "e2e": Stats(n=100, mean=8.0)}, saturated=True, reason="synthetic"))
    return replace(template, points=tuple(points))


@pytest.mark.parametrize("truth", [
    KNOWN,
    EngineOverheads("vllm", "0.32.0", "cpu", iteration_ms=1.5, per_token_ms=0.0,
                    first_token_ms=0.0, http_ms=3.0),
    EngineOverheads("vllm", "0.32.0", "cpu", iteration_ms=0.0, per_token_ms=0.6,
                    first_token_ms=10.0, http_ms=0.0),
])
def test_fit_recovers_known_overheads(truth) -> None:
    inner = LinearLatency()
    result = synthetic_result(truth, inner)
    cal = calibrate(result, inner, source="synthetic")
    got = cal.overheads
    for term in ("iteration_ms", "per_token_ms", "first_token_ms", "http_ms"):
        assert getattr(got, term) == pytest.approx(getattr(truth, term), rel=1e-3, abs=1e-6), term
    assert (got.engine, got.version, got.device, got.source) == ("vllm", "0.32.0", "cpu",
                                                                 "synthetic")
    for term in ("itl", "ttft", "http"):
        assert cal.rms_ms(term) == pytest.approx(0.0, abs=2e-3), term
    assert sum(r.term == "itl" for r in cal.residuals) == 6  # the saturated point left out
    assert sum(r.term == "http" for r in cal.residuals) == 3  # light load: up to 20%
    assert fit_overheads(result, inner) == replace(got, source="")
    # with the fitted overheads the derived curve is the synthesised one
    assert cal.check.mu_after == pytest.approx(result.saturation_rate, rel=1e-2)
    assert cal.check.mu_before > cal.check.mu_after


def test_fit_needs_an_unsaturated_rate_and_covering_curves() -> None:
    inner = LinearLatency()
    result = synthetic_result(KNOWN, inner)
    only_bad = replace(result, points=tuple(p for p in result.points if p.saturated))
    with pytest.raises(InputError, match="unsaturated"):
        calibrate(only_bad, inner)
    with pytest.raises(InputError, match="curves covering"):
        calibrate(result, load_curves(ROOT / "datasets/profiles/muxserve-a100-curves.json"))
    with pytest.raises(InputError, match="light_fraction"):
        calibrate(result, inner, light_fraction=0.0)


def test_bundled_calibration_brings_the_derived_curve_closer() -> None:
    """The bundled file against the measurement it was fitted to (docs/overheads.md): the
    saturation error shrinks from +44% to within 10%, the latency errors at 30/60% shrink."""
    check = check_curve(load_result(SERVE), load_curves(CURVES), load_overheads(BUNDLED))
    assert check.mu_error_before > 0.4 and abs(check.mu_error_after) < 0.1
    for load in check.loads:
        if load["measured_s"] is not None:
            assert abs(load["after_error"]) < abs(load["before_error"]) - 0.15, load


# --------------------------------------------------------------------------- the CLI


def test_cli_calibrate_writes_the_bundled_file(tmp_path) -> None:
    out = tmp_path / "o.yaml"
    code, stdout, err = run_cli("profile", "calibrate", "--serve-curve", str(SERVE),
                                "--curves", str(CURVES), "--catalog",
                                str(ROOT / "datasets/catalogs/cpu-host.yaml"), "--out", str(out))
    assert code == 0, err
    assert replace(load_overheads(out), source="") == replace(load_overheads(BUNDLED), source="")
    for word in ("iteration_ms", "per_token_ms", "first_token_ms", "http_ms", "saturation",
                 "rms_residual_ms", "wrote"):
        assert word in stdout
    code, stdout, _ = run_cli("profile", "calibrate", "--serve-curve", str(SERVE), "--curves",
                              str(CURVES), "--out", str(tmp_path / "o.json"), "--json")
    doc = json.loads(stdout)
    assert code == 0 and doc["overheads"]["iteration_ms"] == load_overheads(BUNDLED).iteration_ms
    assert {"rms_ms", "residuals", "check"} <= set(doc)


@pytest.mark.parametrize("args", [
    ("--serve-curve", "MISSING", "--curves", str(CURVES)),
    ("--serve-curve", str(CURVES), "--curves", str(CURVES)),  # not a serve-curve file
    ("--serve-curve", str(SERVE), "--curves", "MISSING"),
    ("--serve-curve", str(SERVE), "--curves", str(CURVES), "--light-fraction", "1.5"),
    ("--serve-curve", str(SERVE), "--curves",
     str(ROOT / "datasets/profiles/muxserve-a100-curves.json")),
    ("--serve-curve", str(SERVE), "--curves", str(CURVES), "--catalog", "MISSING"),
])
def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, args) -> None:
    out, old = tmp_path / "o.yaml", tmp_path / "old.yaml"
    old.write_text("previous\n")
    argv = [a.replace("MISSING", str(tmp_path / "missing")) for a in args]
    for target in (out, old):
        code, _, err = run_cli("profile", "calibrate", *argv, "--out", str(target))
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith("scepsy: error:") and "Traceback" not in err
    assert not out.exists() and old.read_text() == "previous\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["old.yaml"]


def test_cli_needs_exactly_one_step_profile(tmp_path) -> None:
    out = tmp_path / "o.yaml"
    for extra in ((), ("--curves", str(CURVES), "--store", "x.jsonl")):
        code, _, err = run_cli("profile", "calibrate", "--serve-curve", str(SERVE), *extra,
                               "--out", str(out))
        assert code == 2 and "--curves" in err
    assert not out.exists()


@given(delay=st.floats(0.0, 1.0), k=st.integers(1, 40), r=st.integers(1, 8))
def test_a_fan_out_waits_for_the_delays_ahead_of_it(delay, k, r):
    """Brute force: ``k`` calls that arrive together, dealt round robin over ``r`` replicas
    whose front ends take ``delay`` per call one at a time; the mean call waits the mean of
    its position times the delay. ``front_delay_s`` is that mean where ``k/r`` is whole, and
    never below one delay."""
    on = [sum(1 for i in range(k) if i % r == j) for j in range(r)]
    brute = sum(delay * (pos + 1) for n in on for pos in range(n)) / k
    got = front_delay_s(delay, k, r)
    if k % r == 0:
        assert got == pytest.approx(brute, rel=1e-12, abs=1e-15)
    assert got >= delay * (1 - 1e-12)
    assert front_delay_s(delay, 1.0) == pytest.approx(delay, abs=1e-15)
    many = front_delay_s(np.full(3, delay), np.array([1.0, k, 2.0 * k]), r)
    assert many.shape == (3,) and np.all(np.diff(many) >= -1e-15)  # more together: longer
