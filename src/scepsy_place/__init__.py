"""scepsy_place: topology-aware placement of an allocation on concrete nodes and GPUs.

See docs/placement.md. Imports scepsy_opt and scepsy_profile, never the reverse.
"""

from scepsy_place.bounds import (
    Bounds,
    bound,
    dff_bound,
    domain_bound,
    l1_bound,
    l2_bound,
    vector_bound,
)
from scepsy_place.check import violations
from scepsy_place.cuts import configuration_cut, free_capacity_rows, packing_inequalities
from scepsy_place.exact import ExactPlacement, place_exactly
from scepsy_place.exhaustive import OracleLimit, placeable_optimum
from scepsy_place.formulations import FORMULATIONS_REGISTRY, Formulation, formulation
from scepsy_place.improve import improve
from scepsy_place.incremental import (
    LoadChanged,
    NodeFailed,
    RackDrained,
    Replan,
    Running,
    parse_event,
    place_around,
    replan,
)
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
