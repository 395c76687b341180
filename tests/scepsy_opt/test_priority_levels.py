"""LAS priority levels: monotone in attained service, level 0 below one quantum, one level per
doubling (checked against a brute-force count of doublings), capped; fcfs is flat."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scepsy_opt.prediction.priority import (
    LAS_LEVELS,
    LAS_QUANTUM_TOKENS,
    las_level,
    priority_level,
)


def doublings(tokens: int) -> int:
    """Oracle: the largest k with (2^k - 1) * quantum <= tokens, by counting."""
    k = 0
    while (2 ** (k + 1) - 1) * LAS_QUANTUM_TOKENS <= tokens:
        k += 1
    return min(k, LAS_LEVELS - 1)


@given(st.integers(0, 10 ** 12))
def test_level_is_the_number_of_doublings(tokens: int) -> None:
    assert las_level(tokens) == doublings(tokens)


@given(st.integers(0, 10 ** 9), st.integers(0, 10 ** 9))
def test_more_service_never_a_better_level(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert las_level(lo) <= las_level(hi)
    assert priority_level("fcfs", hi) == 0


def test_edges() -> None:
    assert las_level(0) == 0 and las_level(LAS_QUANTUM_TOKENS - 1) == 0
    assert las_level(LAS_QUANTUM_TOKENS) == 1
    assert las_level(math.inf) == LAS_LEVELS - 1
    for bad in (-1, math.nan):
        with pytest.raises(ValueError, match="attained service"):
            las_level(bad)
    with pytest.raises(ValueError, match="priority policy"):
        priority_level("sjf", 0)  # type: ignore[arg-type]
