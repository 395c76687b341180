"""The controller learns how optimistic its model is from measured queues: an LLM saturated in
reality (queue >= queue_up per replica) that the model predicts below full utilisation derates
the model's capacity exactly so that it predicts full utilisation at the observed load (the
oracle: utilisation is linear in the rate), which triggers a scale-up; windows without queues
leave it at 1; it never shrinks and is capped."""

from __future__ import annotations

import math

import pytest
from test_control_core import _made, _setup  # the small placed plan the core's tests use

from scepsy_common.errors import InputError
from scepsy_serve.control.core import ControlConfig, WindowStats


def _window(k: int, rates, queue=None) -> WindowStats:
    return WindowStats(k * 30.0, (k + 1) * 30.0, rates, llm_queue=queue or {})


@pytest.fixture(scope="module")
def setup():
    return _setup()


def test_no_queue_no_derating(setup) -> None:
    problem, _, _ = setup
    ctl = _made(ControlConfig())
    rates = dict(problem.targets)
    for k in range(4):
        d = ctl.observe(_window(k, rates))
        assert d.derate == 1.0 and ctl.derate == 1.0


def test_a_queue_the_model_does_not_see_derates_it_to_full_utilisation(setup) -> None:
    problem, _, _ = setup
    cfg = ControlConfig(headroom=0.0)
    ctl = _made(cfg)
    rates = {w: 0.5 * r for w, r in problem.targets.items()}
    before = ctl._predict(ctl.problem, ctl.allocation, rates)["utilisation"]
    m = max(before, key=lambda k: before[k])
    assert 0 < before[m] < 1
    reps = ctl.allocation.llms[m].replicas
    d = ctl.observe(_window(0, rates, {m: 5.0 * reps}))
    assert ctl.derate == pytest.approx(1.0 / before[m], rel=1e-9)
    assert d.derate == ctl.derate and "derated" in d.reason
    # the oracle: the derated model predicts full utilisation at the observed load
    seen = ctl._predict(ctl.problem, ctl.allocation,
                        {w: r * ctl.derate for w, r in rates.items()})["utilisation"]
    assert seen[m] == pytest.approx(1.0, rel=1e-6)
    assert d.action in ("scale-up", "replan-failed")
    assert d.to_dict()["derate"] == pytest.approx(ctl.derate)


def test_a_short_queue_says_nothing_and_the_derating_never_shrinks(setup) -> None:
    problem, _, _ = setup
    ctl = _made(ControlConfig(queue_up=4.0, max_derate=3.0))
    rates = {w: 0.3 * r for w, r in problem.targets.items()}
    m = next(iter(ctl.allocation.llms))
    reps = ctl.allocation.llms[m].replicas
    ctl.observe(_window(0, rates, {m: 3.9 * reps}))
    assert ctl.derate == 1.0
    ctl.observe(_window(1, rates, {m: 100.0 * reps}))
    learned = ctl.derate
    assert 1.0 < learned <= 3.0
    ctl.observe(_window(2, rates))
    assert ctl.derate == learned
    assert math.isfinite(learned)


@pytest.mark.parametrize("field, value", [("queue_up", 0.0), ("max_derate", 0.5),
                                          ("max_derate", math.inf)])
def test_bad_knobs_are_refused(field: str, value: float) -> None:
    with pytest.raises(InputError, match=field):
        ControlConfig(**{field: value})
