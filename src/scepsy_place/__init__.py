"""scepsy_place: topology-aware placement of an allocation on concrete nodes and GPUs.

See docs/placement.md. Imports scepsy_opt and scepsy_profile, never the reverse.
"""

from scepsy_place.bounds import Bounds, bound, l1_bound, l2_bound
from scepsy_place.check import violations
from scepsy_place.cuts import configuration_cut, free_capacity_rows, packing_inequalities
from scepsy_place.exact import ExactPlacement, place_exactly
from scepsy_place.loop import Outcome, PlacedPlan, plan_and_place, plan_blocks, plan_document
from scepsy_place.placement import (
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
from scepsy_place.quality import fragmentation, quality
from scepsy_place.replicas import Demand, Slot, task_mix
from scepsy_place.topology import (
    Node,
    Topology,
    from_cluster,
    load_topology,
    parse_topology,
    topology_to_dict,
)

__all__ = [
    "FALLBACKS", "PLACERS", "BestFit", "Blocks", "Bounds", "Demand", "ExactPlacement",
    "FirstFitDecreasing", "Hierarchical", "Node", "Outcome", "PlacedPlan", "Placement", "Placer",
    "Slot", "Topology", "apply", "bound", "configuration_cut", "demands", "fragmentation",
    "free_capacity_rows", "from_cluster", "l1_bound", "l2_bound", "load_topology",
    "packing_inequalities", "parse_topology", "place", "place_allocation", "place_exactly",
    "placer", "plan_and_place", "plan_blocks", "plan_document", "quality", "remove", "task_mix",
    "topology_to_dict", "violations",
]
