"""The optimiser registry: every optimiser by name (``--optimiser`` of ``scepsy plan``).

Each entry builds an object with a ``name`` and a ``solve(problem) -> Plan`` method
(:class:`scepsy_opt.plans.Optimiser`): the exact MILP (:mod:`scepsy_opt.milp`) and the baselines
and oracle (:mod:`scepsy_opt.baselines`). The registry imports the optimisers; they do not know
of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from scepsy_common.errors import InputError
from scepsy_opt.baselines import BruteForce, EqualSplit, Hierarchical, Independent, UserAllocation
from scepsy_opt.milp import MILPOptimiser
from scepsy_opt.plans import Optimiser

OPTIMISERS: Mapping[str, Callable[[], Optimiser]] = MappingProxyType({
    "milp": MILPOptimiser,
    "brute-force": BruteForce,
    "heuristic": Hierarchical,
    "independent": Independent,
    "equal-split": EqualSplit,
    "user": UserAllocation,
})


def optimiser(name: str) -> Optimiser:
    """The registered optimiser called ``name``."""
    if name not in OPTIMISERS:
        raise InputError("plan", "optimiser", f"one of {', '.join(sorted(OPTIMISERS))}", name)
    return OPTIMISERS[name]()
