"""scepsy_place: topology-aware placement of an allocation on concrete nodes and GPUs.

See docs/placement.md. Imports scepsy_opt and scepsy_profile, never the reverse.
"""

from scepsy_place.bounds import Bounds, bound, fragmentation, l1_bound, l2_bound, quality
from scepsy_place.check import violations
from scepsy_place.placement import (
    PLACERS,
    BestFit,
    Demand,
    FirstFitDecreasing,
    Hierarchical,
    Placement,
    Placer,
    Slot,
    apply,
    demands,
    place,
    place_allocation,
    placer,
    remove,
    task_mix,
)
from scepsy_place.topology import (
    Node,
    Topology,
    from_cluster,
    load_topology,
    parse_topology,
    topology_to_dict,
)

__all__ = [
    "PLACERS", "BestFit", "Bounds", "Demand", "FirstFitDecreasing", "Hierarchical", "Node",
    "Placement", "Placer", "Slot", "Topology", "apply", "bound", "demands", "fragmentation",
    "from_cluster", "l1_bound", "l2_bound", "load_topology", "parse_topology", "place",
    "place_allocation", "placer", "quality", "remove", "task_mix", "topology_to_dict",
    "violations",
]
