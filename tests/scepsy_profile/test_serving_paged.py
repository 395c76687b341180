"""Paged KV, length moments, preemption and the token budget in the serving curve
(scepsy_profile.serving, module docstring).

Oracles: the KV occupancy of a running call worked out by hand (constant lengths: enumerating
its ages and blocks; exponential lengths: the length-biased moments), the closed form the curve
reduces to when step times are constants or linear in the batch, the normal-tail overflow
computed with the standard library, and properties (less KV never helps, more length variance
never helps, preemptions never fall with the rate).
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.latency import ConstantLatency
from scepsy_common.errors import InputError
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import (
    MemoryPolicy,
    batch_preemptions,
    group_cap,
    kv_demand,
    serving_curve,
)

ROOF = roofline_model()
FAST = settings(max_examples=40, deadline=None, derandomize=True)
MODEL, GPU = "llama-2-7b", "A100-80GB"


class LinearLatency:
    """``prefill = a + b·batch``, ``decode = c + e·batch`` ms, whatever the tokens."""

    def __init__(self, a: float, b: float, c: float, e: float) -> None:
        self.a, self.b, self.c, self.e = a, b, c, e

    def prefill_ms(self, model, gpu, tp, share, batch, seq):
        out = self.a + self.b * np.asarray(batch, float) + 0 * np.asarray(share, float) \
            + 0 * np.asarray(seq, float)
        return float(out) if np.ndim(out) == 0 else out

    def decode_ms(self, model, gpu, tp, share, batch, ctx):
        out = self.c + self.e * np.asarray(batch, float) + 0 * np.asarray(share, float) \
            + 0 * np.asarray(ctx, float)
        return float(out) if np.ndim(out) == 0 else out

    def covers(self, model, gpu, tp) -> bool:
        return True


def overflow_by_hand(b: float, kv: float, occ: float, var: float, victim: float) -> float:
    """``E[(S − kv)⁺] / (b·victim)`` for ``S`` normal(b·occ, b·var), with math.erfc."""
    m, s = b * occ, math.sqrt(b * var)
    z = (kv - m) / s
    tail = 0.5 * math.erfc(z / math.sqrt(2))
    return max(s * math.exp(-z * z / 2) / math.sqrt(2 * math.pi) - (kv - m) * tail, 0.0) / (
        b * victim)


# --------------------------------------------------------------------------- occupancy


def test_constant_lengths_occupancy_matches_the_enumerated_blocks() -> None:
    """I = 128, O = 32, blocks of 16: a call of age a = 1..32 holds ceil((128 + a)/16) blocks,
    i.e. 144 tokens for a <= 16 and 160 after: mean 152, the docstring's
    (I·O + (O² + O)/2)/O + (16 − 1)/2 = 128 + 16.5 + 7.5."""
    i, o, bs = 128, 32, 16
    held = [math.ceil((i + a) / bs) * bs for a in range(1, o + 1)]
    assert np.mean(held) == 152.0
    kv = kv_demand(i, o, MemoryPolicy(block_size=bs))
    assert kv.per_seq == 152.0
    assert kv.var == pytest.approx((o * o - 1) / 12 + (bs * bs - 1) / 12, rel=1e-12)  # 106.5
    assert kv.ctx == i + o / 2
    # explicit constant moments are the same as none
    same = kv_demand(i, o, MemoryPolicy(block_size=bs), output_sq_mean=o * o, io_mean=i * o)
    assert same.per_seq == pytest.approx(kv.per_seq, rel=1e-12)
    assert same.var == pytest.approx(kv.var, rel=1e-9)


def test_exponential_lengths_occupancy_is_length_biased() -> None:
    """O exponential with mean 256 (E[O²] = 2·256²), I = 512 independent: a running call is
    length-biased (O ~ Gamma(2)) and uniformly aged, so it holds I + O + 1/2 tokens on average
    plus (16 − 1)/2 of its last block, with the age variance O² − 1/12 (E[O³] = 6·O³)."""
    i, o = 512.0, 256.0
    kv = kv_demand(i, o, MemoryPolicy(), output_sq_mean=2 * o * o, io_mean=i * o)
    assert kv.per_seq == pytest.approx(512 + 256.5 + 7.5, rel=1e-12)
    assert kv.var == pytest.approx(o * o - 1 / 12 + 255 / 12, rel=1e-12)
    assert kv.ctx == pytest.approx(i + o, rel=1e-12)  # (E[IO] + E[O²]/2)/O
    # reserve: the length-biased whole reservation (E[IO] + E[O²])/O = I + 2·O
    res = kv_demand(i, o, MemoryPolicy(kv_management="reserve"), output_sq_mean=2 * o * o,
                    io_mean=i * o)
    assert res.per_seq == pytest.approx(i + 2 * o, rel=1e-12) and res.var == 0


def test_exponential_moments_against_a_sampled_batch() -> None:
    """A Monte Carlo batch: draw calls with exponential outputs, weight each by its length
    (time in the batch) and give it a uniform age; mean and variance of the tokens held."""
    rng = np.random.default_rng(3)
    o_mean, i = 100.0, 300
    outs = np.maximum(np.rint(rng.exponential(o_mean, 400_000)), 1).astype(int)
    m1, m2 = outs.mean(), np.mean(outs.astype(float) ** 2)
    picks = rng.choice(outs, size=400_000, p=outs / outs.sum())  # length-biased
    ages = rng.integers(1, picks + 1)
    held = i + ages
    kv = kv_demand(i, m1, MemoryPolicy(block_size=1), output_sq_mean=m2, io_mean=i * m1)
    assert kv.per_seq == pytest.approx(held.mean(), rel=2e-3)
    assert kv.var == pytest.approx(held.var(), rel=0.03)  # gamma closure of E[O³]


# --------------------------------------------------------------------------- batch limit


def _kv_bound_policy(reserve_gib: float = 0.0, **kw) -> MemoryPolicy:
    return MemoryPolicy(reserve_fraction=0.0, reserve_gib=reserve_gib, max_batch=4096, **kw)


def test_paged_batch_limit_and_closed_form_with_constant_steps() -> None:
    """With constant steps p, d the paged curve is λ(B) = B/(p + (O−1)d + (B−g)p/g + B·π(B)·p)
    with π from the normal overflow, for B up to floor(kv/occ)."""
    p, d, i, o = 30.0, 5.0, 512, 128
    share = 0.19  # llama-2-7b on 19% of an A100: a few thousand KV tokens
    pol = _kv_bound_policy()
    curve = serving_curve(ConstantLatency(p, d), MODEL, GPU, 1, share, i, o, policy=pol)
    kv = curve.memory.kv_tokens
    occ = (i * o + (o * o + o) / 2) / o + 7.5
    var = (o * o - 1) / 12 + 255 / 12
    assert curve.kv_per_seq == occ and curve.kv_var == pytest.approx(var)
    b_kv = int(kv // occ)
    assert 2 <= b_kv < kv // 100  # the premise: KV binds, not max_batch
    reserve = serving_curve(ConstantLatency(p, d), MODEL, GPU, 1, share, i, o,
                            policy=_kv_bound_policy(kv_management="reserve"))
    assert reserve.max_batch == kv // (i + o) < b_kv  # paged admits more

    def rate(b: int) -> float:
        g = max(1.0, b / o)
        pi = overflow_by_hand(b, kv, occ, var, i)
        return 1e3 * b / (p + (o - 1) * d + max(b - g, 0) * p / g + b * pi * p)

    rates = [rate(b) for b in range(1, b_kv + 1)]
    assert curve.mu == pytest.approx(max(rates), rel=1e-9)
    for b in range(1, curve.max_batch + 1):
        assert curve.rate_at_batch(b) == pytest.approx(rates[b - 1], rel=1e-9)
        assert curve.preemptions_at_batch(b) == pytest.approx(
            overflow_by_hand(b, kv, occ, var, i), rel=1e-6, abs=1e-15)
    assert curve.preemptions_at_batch(b_kv) > 0.0  # at the limit the batch overflows sometimes


def test_one_sequence_always_fits_when_the_instance_is_feasible() -> None:
    """A feasible paged instance runs at least one call even where occ > kv (O = 1: the last
    block's mean rounding makes occ exceed I + O)."""
    bs = 16
    pol = _kv_bound_policy(block_size=bs)
    base = serving_curve(ConstantLatency(1.0, 1.0), MODEL, GPU, 1, 0.19, 8, 1, policy=pol)
    kv = base.memory.kv_tokens
    # I + O fills the whole blocks of the cache (feasible: a call must fit in whole blocks), but
    # occ = I + 1 + 7.5 > kv where kv leaves less than half a block over
    i = kv // bs * bs - 1
    assert kv % bs < (bs - 1) / 2  # the premise
    curve = serving_curve(ConstantLatency(1.0, 1.0), MODEL, GPU, 1, 0.19, i, 1, policy=pol)
    assert curve.memory.feasible and curve.kv_per_seq > kv
    assert curve.max_batch == 1 and curve.mu > 0


# --------------------------------------------------------------------------- preemption


def test_preemptions_are_zero_when_kv_is_ample_and_grow_as_it_shrinks() -> None:
    i, o = 512, 128
    lat = ConstantLatency(20.0, 4.0)
    expo = {"output_sq_mean": 2.0 * o * o, "io_mean": float(i * o)}  # exponential outputs
    ample = serving_curve(lat, MODEL, GPU, 1, 1.0, i, o, policy=MemoryPolicy(max_batch=32),
                          **expo)
    assert ample.memory.kv_tokens > 32 * ample.kv_per_seq * 5  # the premise
    rates = ample.mu * np.array([0.1, 0.5, 0.9, 0.999, 1.0, 2.0])
    assert np.all(ample.preemptions_per_call(rates) == 0.0)
    assert ample.preemptions_at_batch(32) == 0.0
    assert not np.any(ample.overloaded(rates[:4])) and np.all(ample.overloaded(rates[4:]))
    # the same rate on less and less KV (a growing fixed reserve): more preemptions per call
    rate = 0.5 * ample.mu
    seen = []
    for reserve in (0.0, 58.0, 62.0, 63.0, 63.5, 64.0, 64.2):
        pol = MemoryPolicy(reserve_fraction=0.0, reserve_gib=reserve, max_batch=32,
                           preemption_threshold=0.005)
        c = serving_curve(lat, MODEL, GPU, 1, 1.0, i, o, policy=pol, **expo)
        assert rate < c.mu
        seen.append(c.preemptions_per_call(rate))
    assert seen[0] == 0.0 and all(b > a for a, b in pairwise(seen)), seen
    assert seen[-1] > 0.005 and c.overloaded(rate)  # past this policy's threshold


def test_reserve_never_preempts() -> None:
    pol = _kv_bound_policy(kv_management="reserve")
    curve = serving_curve(ConstantLatency(30.0, 5.0), MODEL, GPU, 1, 0.19, 512, 128, policy=pol)
    assert curve.preemptions_at_batch(curve.max_batch) == 0.0 and curve.kv_var == 0.0
    assert curve.preemptions_per_call(curve.mu * 0.9) == 0.0
    assert not curve.overloaded(curve.mu * 0.9) and curve.overloaded(curve.mu)


def test_overloaded_follows_the_threshold() -> None:
    lat = ConstantLatency(30.0, 5.0)
    curves = {t: serving_curve(lat, MODEL, GPU, 1, 0.19, 512, 128,
                               policy=_kv_bound_policy(preemption_threshold=t))
              for t in (0.0, 1e9)}
    c = curves[0.0]
    rate = float(c.rate_at_batch(c.max_batch)) * 0.999
    assert c.preemptions_per_call(rate) > 0
    assert c.overloaded(rate) is True and curves[1e9].overloaded(rate) is False
    got = c.overloaded(np.array([rate, c.mu]))
    assert isinstance(got, np.ndarray) and got.tolist() == [True, True]


def test_infeasible_curve_is_overloaded_at_any_rate() -> None:
    curve = serving_curve(ROOF, "llama-2-70b", "L4", 1, 1.0, 512, 128)
    assert not curve.feasible
    assert curve.preemptions_per_call(0.5) == math.inf and curve.overloaded(0.5)
    assert curve.preemptions_per_call(0.0) == 0.0


def test_batch_preemptions_by_hand() -> None:
    pol = MemoryPolicy()
    for b, kv in ((1, 100.0), (8, 1000.0), (8, 1200.0), (40, 6000.0)):
        got = batch_preemptions(b, kv, 150.0, 400.0, 128.0, pol)
        assert got == pytest.approx(overflow_by_hand(b, kv, 150.0, 400.0, 128.0), rel=1e-9)
    arr = batch_preemptions(np.array([1.0, 8.0]), 1000.0, 150.0, 400.0, 128.0, pol)
    assert isinstance(arr, np.ndarray) and arr.shape == (2,)
    assert batch_preemptions(8, 1000.0, 150.0, 400.0, 128.0,
                             MemoryPolicy(kv_management="reserve")) == 0.0


# --------------------------------------------------------------------------- token budget


def test_token_budget_caps_the_prefill_group() -> None:
    """T = 2048 prompt tokens per iteration, I = 600: at most floor(2048/600) = 3 calls per
    prefill group; k = 8 concurrent calls are prefilled 3 at a time; a prompt longer than T goes
    alone. Linear steps make the group size visible in λ(B)."""
    lat = LinearLatency(10.0, 4.0, 2.0, 0.5)
    i, o, k = 600, 2, 8.0
    pol = MemoryPolicy(max_batch=32, max_num_batched_tokens=2048, kv_management="reserve")
    assert group_cap(pol, i) == 3.0 and group_cap(pol, 5000) == 1.0
    assert group_cap(MemoryPolicy(), i) == math.inf
    curve = serving_curve(lat, MODEL, GPU, 1, 1.0, i, o, policy=pol, prefill_batch=k)
    assert curve.prefill_batch == 3.0 and curve.prefill_ms == 10.0 + 4.0 * 3
    free = serving_curve(lat, MODEL, GPU, 1, 1.0, i, o, policy=MemoryPolicy(
        max_batch=32, kv_management="reserve"), prefill_batch=k)
    assert free.prefill_batch == k

    def service(b: int, cap: float) -> float:
        g = min(max(min(k, cap), b / o), cap)
        pg = 10.0 + 4.0 * g
        return pg + (o - 1) * (2.0 + 0.5 * b) + max(b - g, 0) * pg / g

    for b in range(1, curve.max_batch + 1):
        assert curve.service_ms[b - 1] == pytest.approx(service(b, 3.0), rel=1e-12)
    for b in range(1, free.max_batch + 1):
        assert free.service_ms[b - 1] == pytest.approx(service(b, math.inf), rel=1e-12)
    assert curve.group(np.array([1.0, 4.0, 30.0])).tolist() == [3.0, 3.0, 3.0]
    # one-token outputs: the whole batch is one group, capped by the budget too
    rerank = serving_curve(lat, MODEL, GPU, 1, 1.0, 600, 1, policy=pol)
    assert float(rerank.group(20.0)) == 3.0


# --------------------------------------------------------------------------- properties


@FAST
@given(st.floats(0.12, 1.0), st.integers(16, 2048), st.integers(1, 512),
       st.floats(0.0, 3.0), st.sampled_from(["paged", "reserve"]))
def test_less_kv_never_raises_mu(share, i, o, extra_gib, mode) -> None:
    base = MemoryPolicy(reserve_fraction=0.05, reserve_gib=0.5, max_batch=256,
                        kv_management=mode)
    less = MemoryPolicy(reserve_fraction=0.05, reserve_gib=0.5 + extra_gib, max_batch=256,
                        kv_management=mode)
    a = serving_curve(ROOF, MODEL, GPU, 1, share, i, o, policy=base)
    b = serving_curve(ROOF, MODEL, GPU, 1, share, i, o, policy=less)
    assert b.mu <= a.mu * (1 + 1e-12)


@FAST
@given(st.integers(16, 2048), st.floats(1.0, 400.0), st.floats(0.0, 3.0), st.floats(0.15, 1.0))
def test_more_output_variance_never_raises_mu(i, o, cv2, share) -> None:
    pol = MemoryPolicy(max_batch=256)
    a = serving_curve(ROOF, MODEL, GPU, 1, share, i, o, policy=pol)
    b = serving_curve(ROOF, MODEL, GPU, 1, share, i, o, policy=pol,
                      output_sq_mean=o * o * (1 + cv2), io_mean=i * o)
    assert b.kv_per_seq >= a.kv_per_seq - 1e-9 and b.kv_var >= a.kv_var - 1e-9
    assert b.mu <= a.mu * (1 + 1e-9)


@FAST
@given(st.integers(64, 4096), st.integers(8, 1024), st.floats(0.12, 0.4))
def test_preemptions_never_fall_with_the_rate(i, o, share) -> None:
    curve = serving_curve(ROOF, MODEL, GPU, 1, share, i, o, policy=MemoryPolicy(max_batch=512))
    if not curve.feasible:
        return
    got = curve.preemptions_per_call(curve.mu * np.linspace(0.01, 1.2, 40))
    assert np.all(np.diff(got) >= -1e-12 * np.maximum(got[1:], 1e-300)), got
    one = [curve.preemptions_per_call(float(r)) for r in curve.mu * np.array([0.3, 0.9])]
    assert one == pytest.approx(list(curve.preemptions_per_call(curve.mu * np.array([0.3, 0.9]))),
                                rel=1e-12, abs=0.0)


def test_paged_equals_reserve_when_max_batch_binds_and_kv_is_ample() -> None:
    pol = dict(max_batch=16)
    a = serving_curve(ROOF, MODEL, GPU, 1, 1.0, 512, 128, policy=MemoryPolicy(**pol))
    b = serving_curve(ROOF, MODEL, GPU, 1, 1.0, 512, 128,
                      policy=MemoryPolicy(kv_management="reserve", **pol))
    assert a.max_batch == b.max_batch and a.mu == b.mu
    np.testing.assert_array_equal(a.service_ms, b.service_ms)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"kv_management": "vllm"}, "kv_management"),
    ({"block_size": 0}, "block_size"),
    ({"block_size": 2.5}, "block_size"),
    ({"block_size": True}, "block_size"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"max_num_batched_tokens": 10.0}, "max_num_batched_tokens"),
    ({"preemption_threshold": -0.1}, "preemption_threshold"),
    ({"preemption_threshold": math.nan}, "preemption_threshold"),
    ({"preemption_threshold": math.inf}, "preemption_threshold"),
])
def test_invalid_engine_settings_are_rejected(kwargs, field) -> None:
    with pytest.raises(InputError) as info:
        MemoryPolicy(**kwargs)
    assert info.value.field == field


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"output_sq_mean": 100.0}, "output_sq_mean"),  # below E[O]² = 128²
    ({"output_sq_mean": math.nan}, "output_sq_mean"),
    ({"io_mean": 0.0}, "io_mean"),
    ({"io_mean": -5.0}, "io_mean"),
    ({"io_mean": math.inf}, "io_mean"),
])
def test_impossible_length_moments_are_rejected(kwargs, field) -> None:
    with pytest.raises(InputError) as info:
        serving_curve(ROOF, MODEL, GPU, 1, 1.0, 512, 128, **kwargs)
    assert info.value.field == field
