"""The objectives a plan optimises, as strategy classes in one registry.

Every objective is a frozen class that says, by its attributes, how the optimisers, the
optimise-place loop, re-planning and the command line treat it; no caller compares objective
names. :data:`OBJECTIVES_REGISTRY` maps each name (``min-latency``, ``max-throughput``,
``min-cost``) to its class; :func:`objective` returns the one a name stands for, or an
:class:`~scepsy_common.errors.InputError` listing the names.

- :class:`MinLatency` minimises the weighted sum of the workflows' predicted mean latencies
  (plus change penalties): the plan carries the targets; a current allocation priced lower
  is kept.
- :class:`MaxThroughput` carries the largest fraction of the targets (``Plan.scale``) within
  the mean-latency bounds.
- :class:`MinCost` buys the cheapest GPUs per hour that carry the targets within the latency
  bounds; only it plans on pools of unknown size (``nodes: auto``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from scepsy_common.registry import Registry

Name = Literal["min-latency", "max-throughput", "min-cost"]


@dataclass(frozen=True)
class ObjectiveKind:
    """What every objective says about itself (module docstring); subclasses set the class
    attributes."""

    name: ClassVar[Name]
    summary: ClassVar[str]
    scales_targets: ClassVar[bool] = False
    """the plan carries a fraction of the targets (``Plan.scale``), the fraction maximised"""
    priced: ClassVar[bool] = False
    """the plan is priced per GPU-hour and may buy nodes of open pools (``nodes: auto``)"""
    mean_bounds: ClassVar[bool] = False
    """the workflows' mean latencies are bounded (``latency_bound_s``), not minimised"""
    keeps_current: ClassVar[bool] = False
    """a current allocation priced no worse than the new plan is kept (re-planning)"""
    searches_alternatives: ClassVar[bool] = False
    """re-planning may try other allocations of the same objective to move fewer replicas"""


@dataclass(frozen=True)
class MinLatency(ObjectiveKind):
    name: ClassVar[Name] = "min-latency"
    summary: ClassVar[str] = ("the weighted sum of the workflows' mean predicted latencies "
                              "(plus change penalties)")
    keeps_current: ClassVar[bool] = True
    searches_alternatives: ClassVar[bool] = True


@dataclass(frozen=True)
class MaxThroughput(ObjectiveKind):
    name: ClassVar[Name] = "max-throughput"
    summary: ClassVar[str] = "the largest fraction of the targets carried"
    scales_targets: ClassVar[bool] = True
    mean_bounds: ClassVar[bool] = True


@dataclass(frozen=True)
class MinCost(ObjectiveKind):
    name: ClassVar[Name] = "min-cost"
    summary: ClassVar[str] = ("the price per hour of the GPUs that carry the targets within "
                              "the latency bounds")
    priced: ClassVar[bool] = True
    mean_bounds: ClassVar[bool] = True


OBJECTIVES_REGISTRY: Registry[ObjectiveKind] = Registry("objective", source="plan",
                                                        field="objective")
for _cls in (MinLatency, MaxThroughput, MinCost):
    OBJECTIVES_REGISTRY.register(_cls.name, _cls(), summary=_cls.summary)

OBJECTIVES: tuple[Name, ...] = tuple(OBJECTIVES_REGISTRY)  # type: ignore[arg-type]
"""The objective names, in the order the registry lists them (min-latency first: the
default)."""


def objective(name: str) -> ObjectiveKind:
    """The objective ``name`` stands for (an :class:`InputError` listing the names else)."""
    return OBJECTIVES_REGISTRY.require(name)
