"""Tests for the memory budget and the serving curve of one instance (scepsy_profile.serving).

Oracles: the memory budget recomputed from ``ModelSpec``/``GPUSpec`` numbers as the module
docstring states it, the closed forms the serving curve reduces to when step times are
constants, and monotonicity that must hold for any sensible latency model.
"""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fakes.latency import ConstantLatency
from scepsy_common.errors import InputError
from scepsy_profile.catalog import default_catalog
from scepsy_profile.hardware import GIB
from scepsy_profile.latency import LatencyModel
from scepsy_profile.roofline import (
    AllReduceCost,
    RooflineModel,
    bundled_calibration,
    roofline_model,
)
from scepsy_profile.serving import MemoryPolicy, admission_limit, memory_fit, serving_curve

CAT = default_catalog()
ROOF = roofline_model()
MODELS = ("llama-2-7b", "llama-3-8b", "qwen2.5-14b", "llama-2-70b")
GPUS = ("A100-80GB", "H100-80GB", "L4")
TPS = (1, 2, 4, 8)

FAST = settings(max_examples=60, deadline=None)

all_models = st.sampled_from(sorted(CAT.models))
all_gpus = st.sampled_from(sorted(CAT.gpus))
seq_tokens = st.integers(1, 200_000)
fractions = st.floats(0.0, 0.5)


def supported_tps(model: str) -> list[int]:
    return [tp for tp in range(1, 65) if CAT.model(model).supports_tp(tp)]


def kv_budget_bytes(model: str, gpu: str, tp: int, share: float, policy: MemoryPolicy) -> float:
    """KV bytes per GPU as the module docstring defines them: ``share · memory`` minus the
    weights on one GPU minus the reserve (``reserve_fraction`` of the share plus ``reserve_gib``)."""
    spec, g = CAT.model(model), CAT.gpu(gpu)
    available = share * g.memory_gib
    reserve = policy.reserve_fraction * available + policy.reserve_gib
    return (available - reserve) * GIB - spec.weight_bytes_per_gpu(tp)


# reserves: a fraction alone at any share, or a fixed reserve too (checked at share 1 here and
# at every boundary share in test_reserve_gib_is_a_fixed_amount_per_instance)
share_and_reserve = st.one_of(
    st.tuples(st.floats(0.01, 1.0), st.just(0.0)),
    st.tuples(st.just(1.0), st.floats(0.0, 8.0)),
)


@st.composite
def instances(draw, models=all_models, gpus=all_gpus):
    model = draw(models)
    return model, draw(gpus), draw(st.sampled_from(supported_tps(model)))


# --------------------------------------------------------------------------- memory


@FAST
@given(instances(), share_and_reserve, fractions, seq_tokens)
def test_memory_fit_matches_the_documented_budget(inst, sr, fraction, seq) -> None:
    model, gpu, tp = inst
    share, reserve_gib = sr
    policy = MemoryPolicy(reserve_fraction=fraction, reserve_gib=reserve_gib)
    spec = CAT.model(model)
    budget = kv_budget_bytes(model, gpu, tp, share, policy)
    per_token = spec.kv_bytes_per_token_per_gpu(tp)
    need = seq * per_token
    assume(abs(budget - need) > 1e-6 * GIB)  # float ties at the exact edge are tested below
    fit = memory_fit(model, gpu, tp, share, seq, policy=policy)
    assert fit.available_gib == pytest.approx(share * CAT.gpu(gpu).memory_gib, rel=1e-12)
    assert fit.weights_gib == pytest.approx(spec.weight_bytes_per_gpu(tp) / GIB, rel=1e-12)
    assert fit.feasible is (budget > 0 and budget >= need)
    if per_token and budget > 0:
        assert abs(fit.kv_tokens - math.floor(budget / per_token)) <= 1
        assert fit.kv_gib == pytest.approx(budget / GIB, rel=1e-9, abs=1e-9)
    if budget <= 0:
        assert fit.kv_tokens == 0 and fit.kv_gib == 0


BOUNDARY_CASES = [
    ("llama-3-8b", "A100-80GB", 1, 4096, 0.10),
    ("llama-2-7b", "H100-80GB", 1, 100_000, 0.05),
    ("qwen2.5-14b", "L4", 2, 2048, 0.10),
    ("llama-2-70b", "A100-80GB", 4, 32_768, 0.20),
]


def boundary_share(model: str, gpu: str, tp: int, seq: int, policy: MemoryPolicy) -> float:
    """The share at which the budget holds exactly ``seq`` tokens (docstring formula)."""
    spec, g = CAT.model(model), CAT.gpu(gpu)
    need = spec.weight_bytes_per_gpu(tp) + seq * spec.kv_bytes_per_token_per_gpu(tp)
    return (need / GIB + policy.reserve_gib) / (g.memory_gib * (1 - policy.reserve_fraction))


@pytest.mark.parametrize(("model", "gpu", "tp", "seq", "fraction"), BOUNDARY_CASES)
def test_feasibility_flips_exactly_at_the_boundary_share(model, gpu, tp, seq, fraction) -> None:
    policy = MemoryPolicy(reserve_fraction=fraction, reserve_gib=0.0)
    s = boundary_share(model, gpu, tp, seq, policy)
    assert 0 < s < 1, s
    above = memory_fit(model, gpu, tp, s * (1 + 1e-9), seq, policy=policy)
    below = memory_fit(model, gpu, tp, s * (1 - 1e-9), seq, policy=policy)
    assert above.feasible and above.kv_tokens == seq
    assert not below.feasible and below.kv_tokens == seq - 1


@pytest.mark.parametrize(("model", "gpu", "tp", "seq", "fraction"), BOUNDARY_CASES)
def test_reserve_gib_is_a_fixed_amount_per_instance(model, gpu, tp, seq, fraction) -> None:
    """The reserve is ``reserve_fraction`` of the share plus a fixed ``reserve_gib`` per GPU
    (framework memory does not shrink with the MPS share), so the edge holds at any share."""
    policy = MemoryPolicy(reserve_fraction=fraction, reserve_gib=2.0)
    s = boundary_share(model, gpu, tp, seq, policy)
    assert 0 < s < 1, s
    fit = memory_fit(model, gpu, tp, s * (1 - 1e-6), seq, policy=policy)
    assert fit.reserve_gib == pytest.approx(fraction * fit.available_gib + 2.0, rel=1e-9)
    assert not fit.feasible


@FAST
@given(instances(), st.floats(0.01, 1.0), st.floats(0.01, 1.0), fractions, st.floats(0.0, 8.0),
       seq_tokens)
def test_more_share_never_loses_feasibility(inst, s1, s2, fraction, reserve_gib, seq) -> None:
    model, gpu, tp = inst
    lo, hi = sorted((s1, s2))
    policy = MemoryPolicy(reserve_fraction=fraction, reserve_gib=reserve_gib)
    small = memory_fit(model, gpu, tp, lo, seq, policy=policy)
    big = memory_fit(model, gpu, tp, hi, seq, policy=policy)
    assert big.kv_tokens >= small.kv_tokens
    assert big.feasible or not small.feasible


@pytest.mark.parametrize("model", sorted(CAT.models))
def test_higher_tp_never_needs_more_weight_memory_per_gpu(model) -> None:
    spec = CAT.model(model)
    tps = supported_tps(model)
    weights = [memory_fit(model, "A100-80GB", tp, 1.0, 1).weights_gib for tp in tps]
    kv = [spec.kv_bytes_per_token_per_gpu(tp) for tp in tps]
    assert all(b <= a for a, b in pairwise(weights)), list(zip(tps, weights, strict=True))
    assert all(b <= a for a, b in pairwise(kv))
    assert weights[0] == spec.weight_bytes / GIB  # tp=1 holds the whole model


@FAST
@given(all_models, all_gpus, st.floats(0.01, 1.0), fractions, seq_tokens)
def test_higher_tp_never_loses_feasibility(model, gpu, share, fraction, seq) -> None:
    policy = MemoryPolicy(reserve_fraction=fraction, reserve_gib=0.5)
    fits = [memory_fit(model, gpu, tp, share, seq, policy=policy) for tp in supported_tps(model)]
    for a, b in pairwise(fits):
        assert b.kv_tokens >= a.kv_tokens
        assert b.feasible or not a.feasible


def test_encoder_keeps_no_kv_cache() -> None:
    encoders = [n for n, m in CAT.models.items() if m.kind == "encoder"]
    assert encoders
    for name in encoders:
        fit = memory_fit(name, "L4", 1, 1.0, 10**8)  # any length: no KV cache to hold
        assert fit.feasible and fit.kv_tokens >= 10**8


# --------------------------------------------------------------------------- closed form


@settings(max_examples=80, deadline=None)
@given(instances(st.sampled_from(MODELS), st.sampled_from(GPUS)), st.floats(0.05, 1.0),
       st.floats(1.0, 4000.0), st.floats(1.0, 2000.0), st.integers(1, 512),
       st.floats(0.05, 500.0), st.floats(0.05, 100.0), st.floats(0.001, 0.999))
def test_serving_curve_closed_form_with_constant_steps(inst, share, i, o, max_batch, p, d,
                                                       frac) -> None:
    model, gpu, tp = inst
    lat = ConstantLatency(p, d)
    assert isinstance(lat, LatencyModel)
    # the reserve closed form (paged KV: tests/scepsy_profile/test_serving_paged.py)
    policy = MemoryPolicy(reserve_fraction=0.1, reserve_gib=0.0, max_batch=max_batch,
                          kv_management="reserve")
    curve = serving_curve(lat, model, gpu, tp, share, i, o, policy=policy)
    assert curve.prefill_ms == p
    assert curve.zero_load_latency_s == pytest.approx((p + (o - 1) * d) / 1e3, rel=1e-12)
    spec = CAT.model(model)
    budget = kv_budget_bytes(model, gpu, tp, share, policy)
    kv_tokens = curve.memory.kv_tokens
    if budget > 0:
        assert abs(kv_tokens - math.floor(budget / spec.kv_bytes_per_token_per_gpu(tp))) <= 1
    if not curve.memory.feasible:
        assert curve.mu == 0 and curve.max_batch == 0 and not curve.feasible
        assert curve.latency_s(1.0) == math.inf
        return
    b_max = min(max_batch, int(kv_tokens // (i + o)))  # a call reserves all its I + O tokens
    assert b_max >= 1
    assert curve.max_batch == b_max
    assert curve.feasible

    def closed_form(b: float) -> float:
        bb = max(b, 1.0)
        g = max(1.0, bb / o)  # one call per group at low load, B/O per iteration under load
        return b / (p + (o - 1) * d + max(bb - g, 0.0) * p / g) * 1e3

    assert curve.mu == pytest.approx(max(closed_form(b) for b in range(1, b_max + 1)), rel=1e-12)
    for b in range(1, min(b_max, 4)):  # whole batches: the closed form
        assert curve.rate_at_batch(b) == pytest.approx(closed_form(b), rel=1e-12)
    # between whole batches (and below one call in service) λ(B) is linear
    x = frac * b_max
    lo, hi = math.floor(x), math.floor(x) + 1
    left = closed_form(lo) if lo >= 1 else 0.0
    assert curve.rate_at_batch(x) == pytest.approx(left + (x - lo) * (closed_form(hi) - left), rel=1e-9)
    rate = curve.rate_at_batch(x)
    if rate < curve.mu * (1 - 1e-6):  # B(λ) inverts λ(B), for scalars and arrays alike
        assert curve.rate_at_batch(curve.batch_at_rate(rate)) == pytest.approx(rate, rel=1e-9)
        many = curve.latency_s(np.array([rate, rate / 2, 0.0, curve.mu]))
        assert many[0] == curve.latency_s(rate) and many[1] == curve.latency_s(rate / 2)
        assert many[2] == curve.zero_load_latency_s and many[3] == math.inf


# --------------------------------------------------------------------------- roofline curves

CURVES = [
    ("llama-2-7b", "A100-80GB", 1, 1.0, 512, 128),
    ("llama-3-8b", "H100-80GB", 2, 0.5, 2000, 300),
    ("qwen2.5-14b", "L4", 2, 1.0, 256, 64),
    ("llama-2-70b", "A100-80GB", 4, 0.6, 1024, 256),
]


@pytest.mark.parametrize(("model", "gpu", "tp", "share", "i", "o"), CURVES)
def test_latency_increases_with_rate_and_diverges_at_mu(model, gpu, tp, share, i, o) -> None:
    curve = serving_curve(ROOF, model, gpu, tp, share, i, o)
    assert curve.feasible and curve.mu > 0 and curve.max_batch >= 1
    rates = curve.mu * np.array([1e-3, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999])
    lat = [curve.latency_s(float(r)) for r in rates]
    assert all(math.isfinite(x) and x > 0 for x in lat)
    # non-decreasing everywhere; strictly increasing once more than one call is in service
    assert all(b >= a for a, b in pairwise(lat)), lat
    busy = [x for r, x in zip(rates, lat, strict=True) if curve.batch_at_rate(float(r)) > 1]
    assert all(b > a for a, b in pairwise(busy)), busy
    assert lat[-1] > lat[0]
    for r in rates:  # B(λ) inverts λ(B)
        assert curve.rate_at_batch(curve.batch_at_rate(float(r))) == pytest.approx(r, rel=1e-6)
    assert curve.latency_s(curve.mu) == math.inf
    assert curve.latency_s(curve.mu * 1.5) == math.inf
    # mu is the best rate over the batches memory allows
    assert curve.rate_at_batch(curve.max_batch) == pytest.approx(curve.mu, rel=1e-12)


@pytest.mark.parametrize(("model", "gpu", "tp", "share", "i", "o"), CURVES)
def test_low_load_latency_approaches_zero_load_latency(model, gpu, tp, share, i, o) -> None:
    """Latency is continuous at λ = 0: a call on an idle server still pays its own prefill,
    so latency_s(λ → 0) tends to p(I) + O·d(1, I + O/2) (zero_load_latency_s), even with a long
    prompt and a short answer (I=4000, O=8)."""
    curve = serving_curve(ROOF, model, gpu, tp, share, i, o)
    tiny = curve.latency_s(curve.mu * 1e-6)
    assert tiny == pytest.approx(curve.zero_load_latency_s, rel=1e-3)
    for frac in (1e-3, 0.1, 0.5):  # queueing only adds to the unloaded latency
        assert curve.latency_s(curve.mu * frac) >= curve.zero_load_latency_s


@pytest.mark.parametrize(("model", "gpu", "tp", "i", "o"), [
    ("llama-2-7b", "A100-80GB", 1, 512, 128),
    ("llama-3-8b", "L4", 1, 2000, 500),
    ("qwen2.5-14b", "H100-80GB", 2, 64, 16),
    ("llama-2-70b", "A100-80GB", 2, 1024, 256),
])
def test_mu_non_decreasing_in_share(model, gpu, tp, i, o) -> None:
    shares = np.linspace(0.05, 1.0, 20)
    mus = [serving_curve(ROOF, model, gpu, tp, float(s), i, o).mu for s in shares]
    assert mus[-1] > 0
    assert all(b >= a for a, b in pairwise(mus)), mus


REQUESTS = [(512, 128), (64, 16), (2000, 500), (8, 1), (4000, 4)]


def _mus_over_tp(lat, model, gpu, share, i, o) -> list[float]:
    return [serving_curve(lat, model, gpu, tp, share, i, o).mu for tp in TPS]


@pytest.mark.parametrize("model", MODELS)
def test_mu_non_decreasing_in_tp_without_allreduce_latency(model) -> None:
    """With free all-reduce calls (α = 0, full link), sharding only removes work per GPU."""
    free = RooflineModel(CAT, replace(bundled_calibration(), allreduce=AllReduceCost(0.0, 1.0)))
    for gpu in GPUS:
        for i, o in REQUESTS:
            for share in (0.3, 1.0):
                mus = _mus_over_tp(free, model, gpu, share, i, o)
                assert all(b >= a for a, b in pairwise(mus)), (gpu, i, o, share, mus)


@pytest.mark.parametrize("model", ["qwen2.5-14b", "llama-2-70b"])
def test_mu_non_decreasing_in_tp_for_large_models(model) -> None:
    """With the bundled calibration for models whose steps are dominated by compute and
    weight reads (small 7-8B models on an H100 may lose a little at tp=2: 2·L all-reduce
    latencies per step outweigh the halved weight reads)."""
    for gpu in GPUS:
        for i, o in REQUESTS:
            for share in (0.3, 1.0):
                mus = _mus_over_tp(ROOF, model, gpu, share, i, o)
                assert all(b >= a for a, b in pairwise(mus)), (gpu, i, o, share, mus)


def test_infeasible_instance_has_zero_throughput() -> None:
    curve = serving_curve(ROOF, "llama-2-70b", "L4", 1, 1.0, 512, 128)
    weights = CAT.model("llama-2-70b").weight_bytes / GIB
    assert weights > CAT.gpu("L4").memory_gib  # the premise
    assert not curve.memory.feasible and curve.memory.kv_tokens == 0
    assert curve.mu == 0 and curve.max_batch == 0 and curve.feasible is False
    assert curve.latency_s(0.5) == math.inf
    with pytest.raises(InputError):
        curve.batch_at_rate(0.5)


# --------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def curve_7b():
    return serving_curve(ROOF, "llama-2-7b", "A100-80GB", 1, 1.0, 512, 128)


@pytest.mark.parametrize("factor", [0.0, -1.0, 1.0, 1.5, math.nan, math.inf])
def test_batch_at_rate_rejects_rates_outside_zero_mu(curve_7b, factor) -> None:
    with pytest.raises(InputError) as info:
        curve_7b.batch_at_rate(curve_7b.mu * factor if math.isfinite(factor) else factor)
    assert info.value.field == "rate"


@pytest.mark.parametrize(("i", "o"), [(0.5, 128), (0, 128), (-3, 128), (512, 0), (512, 0.99)])
def test_token_counts_below_one_are_rejected(i, o) -> None:
    with pytest.raises(InputError, match="input_tokens"):
        serving_curve(ROOF, "llama-2-7b", "A100-80GB", 1, 1.0, i, o)


@pytest.mark.parametrize("share", [0.0, -0.2, 1.01, 2.0, math.nan])
def test_share_outside_unit_interval_is_rejected(share) -> None:
    with pytest.raises(InputError) as info:
        serving_curve(ROOF, "llama-2-7b", "A100-80GB", 1, share, 512, 128)
    assert info.value.field == "share"
    with pytest.raises(InputError):
        memory_fit("llama-2-7b", "A100-80GB", 1, share, 100)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"reserve_fraction": -0.1}, "reserve_fraction"),
    ({"reserve_fraction": 1.0}, "reserve_fraction"),
    ({"reserve_fraction": 1.5}, "reserve_fraction"),
    ({"reserve_fraction": math.nan}, "reserve_fraction"),
    ({"reserve_gib": -1.0}, "reserve_gib"),
    ({"max_batch": 0}, "max_batch"),
    ({"max_batch": -5}, "max_batch"),
])
def test_invalid_memory_policy_is_rejected(kwargs, field) -> None:
    with pytest.raises(InputError) as info:
        MemoryPolicy(**kwargs)
    assert info.value.field == field
    assert field in str(info.value)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_reserve_gib_is_rejected(value) -> None:
    """NaN and inf reserves are rejected up front, not left to crash memory_fit."""
    with pytest.raises(InputError, match="reserve_gib"):
        MemoryPolicy(reserve_gib=value)


def test_unsupported_tp_is_rejected() -> None:
    with pytest.raises(InputError, match="tp"):
        memory_fit("llama-2-7b", "A100-80GB", 3, 1.0, 100)


@given(st.sampled_from(["llama-7b", "llama-13b"]), st.floats(0.3, 1.0),
       st.integers(1, 512), st.sampled_from(["paged", "reserve"]),
       st.floats(16.0, 900.0), st.floats(4.0, 900.0))
@settings(max_examples=60, deadline=None)
def test_an_instance_admits_what_its_batch_limit_and_kv_cache_hold(model, mem, limit, kv_mode,
                                                                  prompt, output):
    """``admits``: at most the policy's ``max_batch``; no fewer than the batch of its
    saturation throughput; what the KV cache holds at the curve's tokens per call otherwise
    (one at least with paged KV); 0 for an instance that holds no call."""
    policy = MemoryPolicy(max_batch=limit, kv_management=kv_mode)
    c = serving_curve(roofline_model(), model, "A100-80GB", 1, 1.0, prompt, output,
                      policy=policy, memory_share=mem)
    if not c.feasible:
        assert c.admits == 0
        return
    assert c.max_batch <= c.admits <= limit
    by_kv = admission_limit(c.memory.kv_tokens, c.kv_per_seq, policy)
    assert c.admits == max(c.max_batch, by_kv)
    assert by_kv == min(limit, max(int(c.memory.kv_tokens // c.kv_per_seq),
                                   int(kv_mode == "paged")))
