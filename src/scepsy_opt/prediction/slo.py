"""Latency SLOs per LLM in the vocabulary of serving systems (docs/slo.md).

A :class:`CallSLO` bounds one LLM's calls: its time to first token (TTFT: the mean, or a
percentile) and its mean time per output token after the first (TPOT). The predictor answers
both from the instance's serving curve (:class:`~scepsy_profile.serving.ServingCurve`) at the
call rate one replica carries, with the engine's per-call delay in the TTFT
(:func:`scepsy_profile.overheads.call_delay_s`, waited in turn by the calls of a fan-out that
reach one replica: :func:`scepsy_profile.overheads.front_delay_s`):

* **TTFT** = the queueing wait ``W`` + the prefill of the call's group + the delay; ``W`` is
  exponential around the steady state's mean wait, so its ``q``-quantile is ``−ln(1 − q)``
  times the mean (:meth:`ServingCurve.ttft_s`);
* **TPOT** = the in-service time less the group's prefill, over ``O − 1`` tokens: a mean. The
  serving model carries no spread of TPOT between calls, so a TPOT bound is on the mean;
* **attainment** (the share of calls within the SLO, as DistServe and MuxServe report it):
  ``P(TTFT ≤ bound)`` under that wait (:func:`ttft_attainment`) where the mean TPOT is within
  its bound, else 0.

A TTFT bound at percentile ``p`` is the same constraint as "at least ``p``% of the calls reach
their first token within the bound": a planner that keeps ``p``-th percentiles within bounds
keeps the attainment at ``p``% or more.

Every quantity falls as replicas are added (the rate per replica falls), so the fewest replicas
of one shape that meet an SLO are found by doubling and bisection (:func:`fewest_replicas`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from scepsy_common.errors import InputError
from scepsy_common.search import first_true
from scepsy_profile.overheads import front_delay_s
from scepsy_profile.serving import ServingCurve

REL = 1e-9
"""The relative tolerance of a bound (a figure computed to be at the bound meets it)."""
WAIT_SHAPES = ("exponential", "uniform")
"""The wait distributions :func:`ttft_attainment` knows: the steady state's (exponential) and
an overload's backlog (uniform over ``[0, 2·mean]``)."""


@dataclass(frozen=True)
class CallSLO:
    """Bounds on one LLM's calls (seconds): ``ttft_s`` on the mean TTFT, or on its
    ``ttft_percentile``-th percentile (in (0, 100)); ``tpot_s`` on the mean TPOT. At least one
    bound."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    ttft_percentile: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if v is not None and not (_number(v) and math.isfinite(v) and v > 0):
                raise InputError("SLO", name, "a bound > 0 s", v)
        p = self.ttft_percentile
        if p is not None:
            if not (_number(p) and 0 < p < 100):
                raise InputError("SLO", "ttft_percentile", "a percentile in (0, 100)", p)
            if self.ttft_s is None:
                raise InputError("SLO", "ttft_percentile", "a TTFT bound it applies to "
                                 "(ttft_s)", p)
        if self.ttft_s is None and self.tpot_s is None:
            raise InputError("SLO", "ttft_s", "a TTFT or a TPOT bound (or both)")
        for name in ("ttft_s", "tpot_s", "ttft_percentile"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, float(v))

    @property
    def quantile(self) -> float | None:
        """The TTFT quantile bounded (in (0, 1)), None for the mean."""
        return None if self.ttft_percentile is None else self.ttft_percentile / 100.0

    def describe(self) -> str:
        """``ttft p90 <= 2 s, tpot <= 0.1 s`` (for messages)."""
        parts = []
        if self.ttft_s is not None:
            what = "ttft" if self.ttft_percentile is None else f"ttft p{self.ttft_percentile:g}"
            parts.append(f"{what} <= {self.ttft_s:g} s")
        if self.tpot_s is not None:
            parts.append(f"tpot <= {self.tpot_s:g} s")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s),
                                  ("ttft_percentile", self.ttft_percentile)) if v is not None}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass(frozen=True)
class SLOCheck:
    """One LLM's predicted figures against its SLO at one rate per replica (seconds)."""

    slo: CallSLO
    ttft_s: float  # the bounded TTFT statistic (the mean, or the percentile); inf: saturated
    tpot_s: float  # the mean TPOT; inf: saturated
    attainment: float  # the share of calls within every bound, in [0, 1]

    @property
    def met(self) -> bool:
        return all(got <= bound * (1.0 + REL) for got, bound in (
            (self.ttft_s, self.slo.ttft_s), (self.tpot_s, self.slo.tpot_s)) if bound is not None)

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None
        return {**self.slo.to_dict(), "predicted_ttft_s": num(self.ttft_s),
                "predicted_tpot_s": num(self.tpot_s), "attainment": self.attainment,
                "met": self.met}


def ttft_attainment(bound_s: float, floor_s: float, wait_mean_s: float,
                    shape: str = "exponential") -> float:
    """``P(floor + W <= bound)`` for a wait ``W`` of mean ``wait_mean_s`` of the given shape
    (:data:`WAIT_SHAPES`); 0 when ``floor`` alone exceeds the bound."""
    if shape not in WAIT_SHAPES:
        raise InputError("SLO", "shape", f"one of {list(WAIT_SHAPES)}", shape)
    if not (math.isfinite(floor_s) and math.isfinite(wait_mean_s)):
        return 0.0
    slack = bound_s - floor_s
    if slack < 0:
        return 0.0
    if wait_mean_s <= 0:
        return 1.0
    if shape == "uniform":
        return min(1.0, slack / (2.0 * wait_mean_s))
    return -math.expm1(-slack / wait_mean_s)


def check(slo: CallSLO, curve: ServingCurve, rate: float, delay_s: float = 0.0,
          replicas: float = 1.0) -> SLOCheck:
    """``curve``'s figures at ``rate`` calls/s per replica of ``replicas`` against ``slo``
    (module docstring); ``delay_s``: the engine's pure delay per call before its first token,
    waited in turn by the calls of a group that reach one replica
    (:func:`~scepsy_profile.overheads.front_delay_s`; ``replicas=math.inf``: single calls)."""
    if not (math.isfinite(rate) and rate >= 0):
        raise InputError("SLO", "rate", "a call rate >= 0 per replica", rate)
    saturated = not curve.feasible or rate >= curve.mu
    if saturated:
        return SLOCheck(slo, math.inf, math.inf, 0.0)
    delay = float(front_delay_s(delay_s, curve.prefill_batch, replicas))
    tpot = curve.tpot_s(rate)
    ttft = curve.ttft_s(rate, slo.quantile) + delay
    wait = curve.wait_s(rate) if rate > 0 else 0.0
    floor = curve.prefill_at_s(rate) + delay
    return SLOCheck(slo, ttft, tpot,
                    attained(slo, lambda b: ttft_attainment(b, floor, wait), tpot))


def attained(slo: CallSLO, ttft_within: Callable[[float], float], tpot_s: float) -> float:
    """The share of calls within ``slo``: ``ttft_within(bound)`` (the share whose TTFT is within
    a bound) where the mean TPOT ``tpot_s`` is within its bound, else 0 (module docstring)."""
    if slo.tpot_s is not None and not tpot_s <= slo.tpot_s * (1.0 + REL):
        return 0.0
    return ttft_within(slo.ttft_s) if slo.ttft_s is not None else 1.0


def fewest_replicas(slo: CallSLO, curve: ServingCurve, rate: float, start: int, limit: int,
                    delay_s: float = 0.0) -> int:
    """The fewest replicas from ``start`` whose rate per replica, ``rate / r``, meets ``slo``
    on ``curve``; ``limit + 1`` when none up to ``limit`` does (not even the zero-load floor
    meets it, or more replicas than ``limit`` are needed)."""
    if start < 1:
        raise InputError("SLO", "start", "a replica count >= 1", start)

    def ok(r: int) -> bool:
        return check(slo, curve, rate / r, delay_s, r).met

    if start <= limit and not ok(start) and not check(slo, curve, 0.0, delay_s, math.inf).met:
        return limit + 1  # the zero-load floor misses: no count meets it
    return first_true(ok, start, limit)


def parse_slos(raw: Mapping[str, Any], llms: list[str], source: str = "slos",
               ) -> Mapping[str, CallSLO]:
    """Per-LLM SLOs from ``{llm: CallSLO | {ttft_s, tpot_s, ttft_percentile}}``; the key
    ``"*"`` gives every LLM the bounds its own entry does not set (a TTFT bound comes with its
    percentile). Unknown LLMs and fields are refused."""
    for m in raw:
        if m != "*" and m not in llms:
            raise InputError(source, str(m), f"an LLM the workflows call ({', '.join(llms)})", m)
    every = _fields(raw["*"], source, "*") if "*" in raw else {}
    out: dict[str, CallSLO] = {}
    for m in llms:
        own = _fields(raw[m], source, m) if m in raw else {}
        if not own and not every:
            continue
        merged = dict(every)
        if "ttft_s" in own:  # the LLM's TTFT bound replaces every LLM's, percentile and all
            merged.pop("ttft_percentile", None)
        merged.update(own)
        try:
            out[m] = CallSLO(**merged)
        except InputError as e:
            raise InputError(source, f"{m}.{e.field}", e.expected, e.got) from None
    return MappingProxyType(dict(sorted(out.items())))


def _fields(v: Any, source: str, where: str) -> dict[str, Any]:
    if isinstance(v, CallSLO):
        return v.to_dict()
    if not isinstance(v, Mapping):
        raise InputError(source, where, "{ttft_s, tpot_s, ttft_percentile}", v)
    unknown = sorted(set(v) - {"ttft_s", "tpot_s", "ttft_percentile"})
    if unknown:
        raise InputError(source, f"{where}.{unknown[0]}", "one of ttft_s, tpot_s, "
                         "ttft_percentile", v[unknown[0]])
    return dict(v)
