"""The placeable formulations behind one interface, and ``auto``, which picks by proven gap and time.

A :class:`Formulation` turns a planning problem and a topology into a
:class:`~scepsy_place.formulations.loop.PlacedPlan`: a plan, its placement (complete when ``placed``), a
truthful status, and where it has one a proven lower bound ``bound_s`` on every placeable
allocation of its candidates (``gap``: ``objective / bound_s - 1``):

* ``blocks`` (:mod:`scepsy_place.formulations.blocks`): whole-GPU blocks of one LLM shape, placeable by
  construction, one MILP; fast at every size, but two LLMs never share a GPU. No bound beyond
  its own allocations (``bound_s`` None);
* ``aggregate`` (:func:`scepsy_place.formulations.loop.plan_and_place`'s closed loop): the aggregate MILP,
  placement, cuts, re-solve. Its first MILP is the aggregate optimum, a bound on every
  allocation; up to 64 GPUs the loop is exact (the cheapest placeable allocation of the whole
  candidate grid), above it is not;
* ``patterns`` (:mod:`scepsy_place.formulations.patterns`): GPU patterns of co-located replicas by column
  generation, placeable by construction, with the LP bound over its candidates;
* ``auto``: blocks (above 1,024 GPUs only when patterns placed nothing); up to 64 GPUs the
  aggregate loop stopped at the best objective in hand; patterns unless a plan in hand is
  already proven optimal, each with a share of the time that remains; the best placed plan
  wins, called optimal only where the bound over the whole grid proves it
  (:func:`scepsy_place.formulations.loop.plan_auto`; docs/optimiser.md gives the rule and the measurements).

:data:`FORMULATIONS_REGISTRY` holds one object per name.
"""

from __future__ import annotations

from typing import Any, Protocol

from scepsy_opt.planning.problem import Deadline, PlanningProblem
from scepsy_place.formulations.loop import (  # the registry lives beside plan_and_place
    FORMULATIONS_REGISTRY,
    LoopFormulation,
    PlacedPlan,
    formulation,
)
from scepsy_place.packing.topology import Topology


class Formulation(Protocol):
    """A way to a placed plan: ``solve`` returns a :class:`~scepsy_place.formulations.loop.PlacedPlan`."""

    @property
    def name(self) -> str: ...  # read-only: a frozen dataclass's field satisfies it

    def solve(self, problem: PlanningProblem, topology: Topology, *,
              deadline: Deadline | None = None, **kw: Any) -> PlacedPlan: ...

__all__ = ["FORMULATIONS_REGISTRY", "Formulation", "LoopFormulation", "formulation"]
