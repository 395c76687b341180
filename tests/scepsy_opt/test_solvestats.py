"""A plan's solve statistics: one typed, closed model that plan.json's solver section derives
from; the figures set read back as a mapping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scepsy_opt.planning.solvestats import TIMING_KEYS, SolveFigures, SolveStats
from scepsy_serve.launch.planfile import SolverSection


def test_the_solver_section_is_the_figures_and_the_plans_own_fields():
    plan_fields = {"objective_s", "bound_s", "gap", "time_limit_s", "gap_limit"}
    assert set(SolverSection.model_fields) == set(SolveFigures.model_fields) | plan_fields
    # the timings are statistics of the solve but not of the solver section
    assert set(SolveStats.model_fields) - set(SolveFigures.model_fields) == set(TIMING_KEYS)
    assert not set(TIMING_KEYS) & set(SolverSection.model_fields)


@pytest.mark.parametrize("bad", [{"nonsense": 1}, {"columns": "many"}, {"converged": 1.5},
                                 {"total_s": "1 s"}])
def test_a_figure_not_declared_or_of_the_wrong_type_is_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SolveStats.of(bad)


_VALUES = {"columns": st.integers(0, 10**6), "iterations": st.integers(0, 10**6),
           "converged": st.booleans(), "dive": st.none() | st.floats(0, 1e6),
           "solver": st.text(max_size=8), "total_s": st.floats(0, 1e4),
           "gap": st.floats(0, 1), "placed_gpus": st.dictionaries(st.text(max_size=4),
                                                                st.integers(0, 64), max_size=3)}


@given(st.fixed_dictionaries({}, optional=_VALUES))
def test_the_mapping_view_is_the_figures_set_in_declaration_order(figures):
    stats = SolveStats.of(figures)
    order = list(SolveStats.model_fields)
    assert stats.keys() == sorted(figures, key=order.index)
    assert dict(stats) == figures and len(stats) == len(figures)
    for k, v in figures.items():
        assert k in stats and stats[k] == v and stats.get(k) == v
    assert SolveStats.of(dict(stats)) == stats
    absent = next(k for k in order if k not in figures)
    assert stats.get(absent, "x") == "x" and absent not in stats
    with pytest.raises(KeyError):
        stats[absent]
    more = stats.updated(iterations=7)
    assert more.iterations == 7 and set(more.keys()) == set(figures) | {"iterations"}
    assert stats.without(*TIMING_KEYS) == {k: v for k, v in figures.items()
                                           if k not in TIMING_KEYS}
