"""scepsy_place: topology-aware placement of an allocation on concrete nodes and GPUs.

See docs/placement.md. Imports scepsy_opt and scepsy_profile, never the reverse. Sub-packages
by concern:

* :mod:`scepsy_place.packing`: the cluster and the placers (topology, replicas, placement,
  bounds, quality, fgd, check, groups, improve, exact, exhaustive, openb);
* :mod:`scepsy_place.formulations`: the placeable formulations and the optimise-place loop
  (loop, blocks, patterns, slots, cuts, placed, incremental), and their registry;
* :mod:`scepsy_place.launch`: the plan file, the renderers, apply, drive, the benchmarks' kits;
* :mod:`scepsy_place.report`: the review page of a plan;
* :mod:`scepsy_place.request`: the plan request.

The modules' old flat paths (``scepsy_place.loop``, ``scepsy_place.placement``, ...) stay
importable: each is registered as the very module it moved to (:data:`MOVED`).
"""

import importlib as _importlib
import sys as _sys

from scepsy_place.formulations import FORMULATIONS_REGISTRY, Formulation, formulation
from scepsy_place.formulations.cuts import (
    configuration_cut,
    free_capacity_rows,
    packing_inequalities,
)
from scepsy_place.formulations.incremental import (
    LoadChanged,
    NodeFailed,
    RackDrained,
    Replan,
    Running,
    parse_event,
    place_around,
    replan,
)
from scepsy_place.formulations.loop import (
    Outcome,
    PlacedPlan,
    plan_and_place,
    plan_blocks,
    plan_document,
)
from scepsy_place.packing.bounds import (
    Bounds,
    bound,
    dff_bound,
    domain_bound,
    l1_bound,
    l2_bound,
    vector_bound,
)
from scepsy_place.packing.check import violations
from scepsy_place.packing.exact import ExactPlacement, place_exactly
from scepsy_place.packing.exhaustive import OracleLimit, placeable_optimum
from scepsy_place.packing.improve import improve
from scepsy_place.packing.placement import (
    FALLBACKS,
    PLACERS,
    BestFit,
    Blocks,
    FirstFitDecreasing,
    Hierarchical,
    Placement,
    Placer,
    apply,
    demands,
    place,
    place_allocation,
    placer,
    remove,
)
from scepsy_place.packing.quality import fragmentation, quality
from scepsy_place.packing.replicas import Demand, Slot, task_mix
from scepsy_place.packing.topology import (
    Node,
    Topology,
    from_cluster,
    load_topology,
    parse_topology,
    topology_to_dict,
)

__all__ = [
    "FALLBACKS",
    "FORMULATIONS_REGISTRY",
    "PLACERS",
    "BestFit",
    "Blocks",
    "Bounds",
    "Demand",
    "ExactPlacement",
    "FirstFitDecreasing",
    "Formulation",
    "Hierarchical",
    "LoadChanged",
    "Node",
    "NodeFailed",
    "OracleLimit",
    "Outcome",
    "PlacedPlan",
    "Placement",
    "Placer",
    "RackDrained",
    "Replan",
    "Running",
    "Slot",
    "Topology",
    "apply",
    "bound",
    "configuration_cut",
    "demands",
    "dff_bound",
    "domain_bound",
    "formulation",
    "fragmentation",
    "free_capacity_rows",
    "from_cluster",
    "improve",
    "l1_bound",
    "l2_bound",
    "load_topology",
    "packing_inequalities",
    "parse_event",
    "parse_topology",
    "place",
    "place_allocation",
    "place_around",
    "place_exactly",
    "placeable_optimum",
    "placer",
    "plan_and_place",
    "plan_blocks",
    "plan_document",
    "quality",
    "remove",
    "replan",
    "task_mix",
    "topology_to_dict",
    "vector_bound",
    "violations",
]

MOVED = {
    **{m: "packing" for m in ("topology", "replicas", "placement", "bounds", "quality", "fgd",
                              "check", "groups", "improve", "exact", "exhaustive", "openb")},
    **{m: "formulations" for m in ("loop", "blocks", "patterns", "slots", "cuts", "placed",
                                   "incremental")},
}
"""Old flat module name -> the sub-package it moved to."""
for _name, _package in MOVED.items():  # the old paths are the same module objects
    _sys.modules.setdefault(f"{__name__}.{_name}",
                            _importlib.import_module(f"{__name__}.{_package}.{_name}"))
