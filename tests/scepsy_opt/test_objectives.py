"""The objective strategies: one registry, each objective's attributes as its behaviour says."""

from __future__ import annotations

import typing

import pytest

from scepsy_common.errors import InputError
from scepsy_opt.planning.objectives import (
    OBJECTIVES,
    OBJECTIVES_REGISTRY,
    MaxThroughput,
    MinCost,
    MinLatency,
    Name,
    objective,
)
from scepsy_opt.planning.problem import PlanOptions


def test_the_registry_holds_every_name_of_the_type_once():
    assert set(OBJECTIVES) == set(typing.get_args(Name))
    assert len(OBJECTIVES) == len(set(OBJECTIVES)) == 3
    assert OBJECTIVES[0] == PlanOptions().objective == "min-latency"  # the default first
    for name in OBJECTIVES:
        assert objective(name).name == name
        assert OBJECTIVES_REGISTRY.entry(name).summary == objective(name).summary


@pytest.mark.parametrize("name", ["min_latency", "", "MIN-LATENCY", "throughput"])
def test_an_unknown_objective_names_the_field_and_the_choices(name):
    with pytest.raises(InputError) as exc:
        objective(name)
    assert exc.value.field == "objective"
    assert all(n in exc.value.expected for n in OBJECTIVES)


def test_only_max_throughput_scales_the_targets_and_only_min_cost_is_priced():
    assert [o for o in OBJECTIVES if objective(o).scales_targets] == [MaxThroughput.name]
    assert [o for o in OBJECTIVES if objective(o).priced] == [MinCost.name]
    # a minimised latency is not also bounded; the others bound it
    assert {o for o in OBJECTIVES if objective(o).mean_bounds} == {MaxThroughput.name,
                                                                   MinCost.name}
    assert objective(MinLatency.name).keeps_current


@pytest.mark.parametrize("name", OBJECTIVES)
def test_plan_options_carry_their_objectives_strategy(name):
    assert PlanOptions(objective=name).kind is objective(name)
