"""The one scale-bisection helper (scepsy_common.bisection.largest_accepted) against a
brute-force grid, and the searches that use it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.bisection import Probe, largest_accepted


def _threshold(t: float):
    return lambda x: Probe(x <= t, x)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(t=st.floats(0.0, 10.0), hi=st.floats(0.5, 8.0), rel=st.sampled_from([1e-2, 1e-4, 1e-9]))
def test_bracket_against_brute_force_grid(t: float, hi: float, rel: float) -> None:
    """The answer lies within rel·hi of the largest accepted point of a fine grid on [0, hi],
    is itself accepted, and the bracket holds the threshold."""
    res = largest_accepted(_threshold(t), hi, rel=rel, max_steps=200)
    grid = np.linspace(0.0, hi, 20001)
    brute = float(grid[grid <= t].max())  # 0 is always accepted (t >= 0)
    step = hi / 20000
    assert abs(res.lo - brute) <= rel * hi + step
    # the relative bracket closes, or (nothing accepted: lo stays 0) the step limit ends it
    assert res.hi - res.lo <= rel * res.hi or len(res.probes) == 200
    if t >= hi:  # everything accepted: the first probe (hi) settles it
        assert res.lo == hi and len(res.probes) == 1
    else:
        assert res.lo <= t < res.hi
    if res.found:
        assert res.best == res.best_at == res.lo  # reach = the point itself
        assert res.best_at <= t


@settings(max_examples=40, derandomize=True, deadline=None)
@given(t=st.floats(1e-3, 1e6))
def test_unbounded_range_doubles_then_bisects(t: float) -> None:
    """hi = inf: doubling from 1 finds a rejected point, then bisection to rel."""
    res = largest_accepted(_threshold(t), math.inf, rel=1e-12, max_steps=200)
    assert res.lo <= t < res.hi
    assert res.hi - res.lo <= 1e-12 * res.hi
    assert math.isfinite(res.hi)


def test_reach_moves_the_lower_end_and_best_is_the_furthest() -> None:
    """A probe that proves acceptance up to ``reach`` moves lo there (clipped to hi)."""
    res = largest_accepted(lambda x: Probe(x <= 3.0, x, reach=min(3.0, 2 * x) if x <= 3 else None),
                           8.0, rel=1e-6, max_steps=100)
    assert res.best_at == pytest.approx(3.0)
    assert res.lo == pytest.approx(3.0)
    assert res.lo <= 3.0 < res.hi


def test_stop_ends_the_search_with_the_bracket_so_far() -> None:
    calls = []

    def probe(x: float) -> Probe[float]:
        calls.append(x)
        return Probe(False, stop=True) if len(calls) == 3 else Probe(x <= 1.0, x)

    res = largest_accepted(probe, 4.0, rel=1e-9, max_steps=50)
    assert res.stopped and len(res.probes) == 3
    assert calls == [4.0, 2.0, 1.0]
    assert res.best is None and not res.found and (res.lo, res.hi) == (0.0, 2.0)


def test_first_probe_and_step_limit() -> None:
    seen: list[float] = []

    def probe(x: float) -> Probe[float]:
        seen.append(x)
        return Probe(x <= 0.3, x)

    res = largest_accepted(probe, 1.0, rel=1e-9, max_steps=5, first=0.9)
    assert seen[0] == 0.9 and len(seen) == 5
    assert res.lo <= 0.3 < res.hi and not res.stopped


def test_empty_range_and_bad_arguments() -> None:
    res = largest_accepted(lambda x: pytest.fail("no probe on an empty range"), 0.0, rel=1e-3,
                           max_steps=10)
    assert res.probes == () and not res.found
    with pytest.raises(ValueError):
        largest_accepted(_threshold(1.0), 1.0, rel=0.0, max_steps=10)
    with pytest.raises(ValueError):
        largest_accepted(_threshold(1.0), 1.0, rel=0.1, max_steps=10, lo=2.0)


def test_the_scale_searches_share_the_helper() -> None:
    """No hand-written scale bisection is left in the optimisers or the loop: each search
    calls largest_accepted (a new one must too)."""
    import inspect

    import scepsy_opt.planning.baselines as baselines
    import scepsy_opt.planning.milp as milp
    import scepsy_place.formulations.loop as loop

    for fn in (milp.solve_max_throughput, milp._max_scale_one_type, baselines._bisect,
               loop._placeable_scale):
        src = inspect.getsource(fn)
        assert "largest_accepted(" in src, fn.__name__
        assert "(lo + hi) / 2" not in src, fn.__name__
