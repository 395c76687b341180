"""The largest value a monotone predicate accepts, by bisection to a relative tolerance.

Every search over a scale of the targets (the max-throughput modes of the optimisers, the
largest placeable scale, the capacity of one GPU type) is this one search: ``probe(x)`` says
whether ``x`` is accepted, accepting every value below an accepted one (monotone). The bracket
``[lo, hi]`` starts at ``lo`` (accepted or the bottom of the range) and ``hi``; the first probe
is at ``first`` (default ``hi``), every later one at the midpoint, until
``hi − lo ≤ rel · hi`` or ``max_steps`` probes. With ``hi = inf`` the bracket is first found by
doubling from ``first`` (those probes are not counted in ``max_steps``).

A probe may prove more than its own point (:attr:`Probe.reach`: every value up to ``reach`` is
accepted), which moves ``lo`` to ``min(reach, hi)``, or end the search (:attr:`Probe.stop`, e.g.
a time limit: the bracket so far is the answer).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Probe(Generic[T]):
    """The answer at one point: accepted or not, what was found there (``value``), how far the
    acceptance reaches (None: the point itself) and whether the search must stop here (the
    probe then neither accepts nor rejects)."""

    accepted: bool
    value: T | None = None
    reach: float | None = None
    stop: bool = False


@dataclass(frozen=True)
class Bisection(Generic[T]):
    """The bracket a search ended with and every probe it made, in order."""

    lo: float  # accepted (or the bottom of the range when nothing was)
    hi: float  # rejected (or the top of the range)
    best: T | None  # the value of the accepted probe that reached furthest (first on ties)
    best_at: float  # how far that probe reached (nan when nothing was accepted)
    probes: tuple[tuple[float, Probe[T]], ...]
    stopped: bool  # a probe ended the search

    @property
    def found(self) -> bool:
        return not math.isnan(self.best_at)


def largest_accepted(probe: Callable[[float], Probe[T]], hi: float, *, rel: float,
                     max_steps: int, lo: float = 0.0, first: float | None = None) -> Bisection[T]:
    """Bisect ``[lo, hi]`` for the largest value ``probe`` accepts (module docstring)."""
    if not 0 < rel < 1:
        raise ValueError(f"rel must lie in (0, 1), got {rel}")
    if not lo <= hi:
        raise ValueError(f"need lo <= hi, got [{lo}, {hi}]")
    probes: list[tuple[float, Probe[T]]] = []
    best: T | None = None
    best_at = math.nan
    x = hi if first is None else first

    def record(at: float, p: Probe[T]) -> float:
        nonlocal best, best_at
        reach = at if p.reach is None else p.reach
        if math.isnan(best_at) or reach > best_at:
            best, best_at = p.value, reach
        return reach

    if math.isinf(hi):  # find a rejected value by doubling
        x = 1.0 if first is None else first
        while True:
            p = probe(x)
            probes.append((x, p))
            if p.stop:
                return Bisection(lo, hi, best, best_at, tuple(probes), True)
            if not p.accepted:
                hi = x
                break
            lo = max(x, record(x, p))
            x = 2 * lo
        x = (lo + hi) / 2
    steps = 0
    while steps < max_steps and hi - lo > rel * hi:
        p = probe(x)
        probes.append((x, p))
        steps += 1
        if p.stop:
            return Bisection(lo, hi, best, best_at, tuple(probes), True)
        if p.accepted:
            lo = max(x, min(record(x, p), hi))
        else:
            hi = x
        x = (lo + hi) / 2
    return Bisection(lo, hi, best, best_at, tuple(probes), False)
