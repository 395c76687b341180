"""scepsy_place: a plan on concrete nodes and GPUs (docs/placement.md, docs/optimiser.md).

Two sub-packages by concern, and the request of the job they serve:

* :mod:`scepsy_place.packing`: the cluster as nodes and GPUs and the placers (topology,
  replicas, placement, bounds, quality, fgd, check, groups, improve, exact, exhaustive, openb);
* :mod:`scepsy_place.formulations`: the placeable formulations (the MILPs that plan and place
  at once: blocks, slots, patterns by column generation, the optimise-place loop with its cuts,
  incremental re-planning) and their registry;
* :mod:`scepsy_place.request`: the plan request (``PlanRequest``), everything ``scepsy plan``
  takes.

Builds on :mod:`scepsy_opt` (the allocation MILP, candidates, the predictor) and
:mod:`scepsy_profile`; :mod:`scepsy_serve` and the facade build on it. The names below are
importable from the package itself (``from scepsy_place import place, Topology``); each is
imported from its module on first use, so importing one module of the package does not import
the others.
"""

from __future__ import annotations

import importlib
from typing import Any

EXPORTS: dict[str, str] = {
    "BestFit": "scepsy_place.packing.placement",
    "Blocks": "scepsy_place.packing.placement",
    "Bounds": "scepsy_place.packing.bounds",
    "Demand": "scepsy_place.packing.replicas",
    "ExactPlacement": "scepsy_place.packing.exact",
    "FALLBACKS": "scepsy_place.packing.placement",
    "FORMULATIONS_REGISTRY": "scepsy_place.formulations",
    "FirstFitDecreasing": "scepsy_place.packing.placement",
    "Formulation": "scepsy_place.formulations",
    "Hierarchical": "scepsy_place.packing.placement",
    "LoadChanged": "scepsy_place.formulations.incremental",
    "Node": "scepsy_place.packing.topology",
    "NodeFailed": "scepsy_place.formulations.incremental",
    "OracleLimit": "scepsy_place.packing.exhaustive",
    "Outcome": "scepsy_place.formulations.loop",
    "PLACERS": "scepsy_place.packing.placement",
    "PlacedPlan": "scepsy_place.formulations.loop",
    "Placement": "scepsy_place.packing.placement",
    "Placer": "scepsy_place.packing.placement",
    "RackDrained": "scepsy_place.formulations.incremental",
    "Replan": "scepsy_place.formulations.incremental",
    "Running": "scepsy_place.formulations.incremental",
    "Slot": "scepsy_place.packing.replicas",
    "Topology": "scepsy_place.packing.topology",
    "apply": "scepsy_place.packing.placement",
    "bound": "scepsy_place.packing.bounds",
    "configuration_cut": "scepsy_place.formulations.cuts",
    "demands": "scepsy_place.packing.placement",
    "dff_bound": "scepsy_place.packing.bounds",
    "domain_bound": "scepsy_place.packing.bounds",
    "formulation": "scepsy_place.formulations",
    "fragmentation": "scepsy_place.packing.quality",
    "free_capacity_rows": "scepsy_place.formulations.cuts",
    "from_cluster": "scepsy_place.packing.topology",
    "improve": "scepsy_place.packing.improve",
    "l1_bound": "scepsy_place.packing.bounds",
    "l2_bound": "scepsy_place.packing.bounds",
    "load_topology": "scepsy_place.packing.topology",
    "packing_inequalities": "scepsy_place.formulations.cuts",
    "parse_event": "scepsy_place.formulations.incremental",
    "parse_topology": "scepsy_place.packing.topology",
    "place": "scepsy_place.packing.placement",
    "place_allocation": "scepsy_place.packing.placement",
    "place_around": "scepsy_place.formulations.incremental",
    "place_exactly": "scepsy_place.packing.exact",
    "placeable_optimum": "scepsy_place.packing.exhaustive",
    "placer": "scepsy_place.packing.placement",
    "plan_and_place": "scepsy_place.formulations.loop",
    "plan_blocks": "scepsy_place.formulations.loop",
    "plan_document": "scepsy_place.formulations.loop",
    "quality": "scepsy_place.packing.quality",
    "remove": "scepsy_place.packing.placement",
    "replan": "scepsy_place.formulations.incremental",
    "task_mix": "scepsy_place.packing.replicas",
    "topology_to_dict": "scepsy_place.packing.topology",
    "vector_bound": "scepsy_place.packing.bounds",
    "violations": "scepsy_place.packing.check",
}
"""Every name the package exports -> the module that defines it."""

__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(EXPORTS))
