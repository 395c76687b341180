"""GPU use counted in thousandths of a GPU (``units``), so that budgets are exact integers.

:func:`share_units` is the one share-to-units rule: the planner's budgets (:func:`gpu_units`),
the blocks (:func:`replicas_per_gpu`), every placer and the placement checker count shares
with it.
"""

from __future__ import annotations

import math

UNITS = 1000  # GPU units per GPU: budgets and uses are exact integers
SHARE_TOL_UNITS = 1e-6  # float noise forgiven when a share is counted in units


def share_units(share: float) -> int:
    """A GPU share in thousandths of a GPU (:data:`UNITS`): the one share-to-units rule.

    Rounded *up* to the next thousandth (a replica gets at least its share, so units never
    over-commit a GPU: four 0.2501 shares take 251 units each and do not fit on one GPU), with a
    :data:`SHARE_TOL_UNITS` tolerance so that float noise (``0.1 + 0.2``) does not add a unit.
    Every positive share takes at least one unit; 0 takes none.
    """
    if share <= 0:
        return 0
    return max(1, math.ceil(share * UNITS - SHARE_TOL_UNITS))


def gpu_units(tp: int, share: float, replicas: int = 1) -> int:
    """GPU capacity of ``replicas`` × (tp, share) in thousandths of a GPU: ``tp`` GPUs of
    :func:`share_units` each."""
    return tp * share_units(share) * replicas


def replicas_per_gpu(share: float) -> int:
    """Replicas of one shape that share a GPU when it serves that shape only:
    ``floor(UNITS / share_units(share))`` (``floor(1/share)`` for multiples of 0.001; a share is
    in (0, 1])."""
    return max(1, UNITS // share_units(share))


def replica_gpus(replicas: int, tp: int, per_gpu: int, domain: int) -> int:
    """The fewest whole GPUs that hold ``replicas`` identical replicas of ``tp`` GPUs each when
    a GPU holds ``per_gpu`` of them (:func:`replicas_per_gpu`) and a replica's GPUs lie in one
    NVLink domain of ``domain`` GPUs: a domain holds ``⌊domain·per_gpu/tp⌋`` replicas, and
    ``r`` replicas in one domain need ``max(tp, ⌈r·tp/per_gpu⌉)`` GPUs (their TP groups may
    overlap: three TP-2 replicas at half a GPU fit on three GPUs). Domains are filled one at a
    time, which never needs more GPUs than spreading them (the ceiling is subadditive)."""
    if replicas <= 0:
        return 0
    full_r = max(1, domain * per_gpu // tp)
    full, rest = divmod(replicas, full_r)
    out = full * max(tp, -(-full_r * tp // per_gpu))
    if rest:
        out += max(tp, -(-rest * tp // per_gpu))
    return out
