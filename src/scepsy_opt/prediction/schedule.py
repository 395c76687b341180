"""Allocations that change over a simulated run, and the replicas each change starts and stops.

:func:`scepsy_opt.prediction.simulate.simulate` takes ``changes=``, a sequence of
:class:`AllocationChange` sorted by time (equal times allowed: applied in the order given). At
``at_s`` the serving allocation becomes ``allocation``, LLM by LLM:

* the same instance shape (``gpu``, ``tp``, ``share``, memory share) as the replicas serving it
  now: replicas are added (up, and routed to, from ``at_s``; a caller that models a start-up
  delay puts it into ``at_s``) or the highest-index ones are drained;
* a different shape: replicas of the new shape are added at ``at_s`` and every old one drains.

A draining replica takes no new calls; it finishes its queue and its running set, then is down.
Nothing is lost. :class:`ReplicaSpan` records when each replica was up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance


@dataclass(frozen=True, slots=True)
class AllocationChange:
    """At ``at_s`` (seconds from the start of the run, finite, >= 0) the serving allocation
    becomes ``allocation``."""

    at_s: float
    allocation: Allocation

    def __post_init__(self) -> None:
        at = self.at_s
        if isinstance(at, bool) or not isinstance(at, int | float) or not (
                math.isfinite(at) and at >= 0):
            raise InputError("changes", "at_s", "a time >= 0 s (finite)", at)
        if not isinstance(self.allocation, Allocation):
            raise InputError("changes", "allocation", "an Allocation",
                             type(self.allocation).__name__)


@dataclass(frozen=True, slots=True)
class ReplicaSpan:
    """When one replica of ``llm`` was up: from ``up_s`` until ``down_s``, the end of its last
    call after it was drained (``None``: still up when the run stopped). ``instance`` is its
    shape (``replicas=1``); ``replica`` its index, the ``replica`` of the calls it served in
    ``SimulationResult.call_log`` (unique per LLM over the run)."""

    llm: str
    instance: Instance
    up_s: float
    down_s: float | None
    replica: int = 0

    @property
    def gpus(self) -> float:
        """The GPU capacity it holds: ``tp · share``."""
        return self.instance.tp * self.instance.share

    def gpu_seconds(self, end_s: float) -> float:
        """GPU-seconds it held until ``down_s`` (still up: until ``end_s``)."""
        down = end_s if self.down_s is None else self.down_s
        return self.gpus * max(down - self.up_s, 0.0)


def gpu_seconds(spans: tuple[ReplicaSpan, ...] | list[ReplicaSpan], end_s: float) -> float:
    """GPU-seconds all ``spans`` held, those still up counted until ``end_s``."""
    return math.fsum(s.gpu_seconds(end_s) for s in spans)
