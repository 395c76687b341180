"""Searches over integers that several layers share."""

from __future__ import annotations

from collections.abc import Callable


def first_true(ok: Callable[[int], bool], start: int, limit: int) -> int:
    """The least ``n`` in ``[start, limit]`` with ``ok(n)``, for a predicate that stays true
    once it holds (monotone); ``limit + 1`` when none does. Doubling from ``start``, then
    bisection: ``O(log n)`` calls of ``ok``."""
    if start > limit:
        return limit + 1
    if ok(start):
        return start
    lo, hi = start, start + 1  # lo false, hi to test
    while hi <= limit and not ok(hi):
        lo, hi = hi, start + 2 * (hi - start)
    if hi > limit:
        if limit > lo and ok(limit):
            hi = limit
        else:
            return limit + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi
