"""Shares outside the profiled range: where a plan's latencies are extrapolated, and the grid
restricted to what was measured.

A fitted latency model (``scepsy_profile.fitted``) knows an instance's latency only over the
shares it was measured at (MuxServe's grid: 30% to 100% of the SMs); below them its curves
extrapolate with their edge elasticity, above them they hold their value at the largest share.
The optimiser's grid (``PlanOptions.shares``, tenths by default) reaches further, so a plan may
pick share 0.1 or 0.2 of a model measured from 0.3 up. ``measured_shares`` of the latency model
(:func:`scepsy_profile.latency.measured_shares`) gives the measured range per
``(model, gpu, tp)``, ``None`` for an analytical model (the roofline: a model, not a
measurement, answering every share in (0, 1] by the same physics, so it is taken to cover every
share and nothing it answers counts as extrapolated).

* :func:`extrapolated_shares`: after planning, every LLM whose chosen share lies below the
  lowest measured share of its ``(model, gpu, tp)`` or above the highest (plan.json's
  ``llms.<llm>.extrapolated_share``, a warning line of ``scepsy plan``).
* :func:`profiled_shares`: with ``PlanOptions.shares_within_profile`` (``--shares-within-profile``),
  candidate generation (:func:`scepsy_opt.planning.candidates.shapes`) keeps, per ``(model, gpu, tp)``,
  only the grid's shares within the measured range. The restriction is per instance, not a
  coarser grid for everything: a roofline-priced instance (another GPU type, an unmeasured TP
  degree) keeps the whole grid, so every objective and formulation sees the same choices it
  did, less the extrapolated ones.

Pure functions of the problem and the allocation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from scepsy_common.errors import UncoveredInstanceError
from scepsy_opt.allocation import Allocation
from scepsy_opt.planning.problem import PlanningProblem
from scepsy_profile.latency import measured_shares, within_measured


@dataclass(frozen=True)
class ShareExtrapolation:
    """An LLM of a plan whose share lies outside the measured shares of its instance."""

    llm: str
    model: str
    gpu: str
    tp: int
    share: float
    measured_min: float
    measured_max: float

    @property
    def side(self) -> Literal["below", "above"]:
        """Which side of the measured range the share lies on."""
        return "below" if self.share < self.measured_min else "above"

    def to_dict(self) -> dict[str, Any]:
        """plan.json's ``llms.<llm>.extrapolated_share``."""
        return {"share": self.share, "measured_min": self.measured_min,
                "measured_max": self.measured_max}

    def message(self) -> str:
        """One line for ``scepsy plan``'s output."""
        bound = "lowest" if self.side == "below" else "highest"
        measured = (f"only share {self.measured_min:g} was measured"
                    if self.measured_min == self.measured_max else
                    f"shares {self.measured_min:g} to {self.measured_max:g} were measured")
        return (f"{self.llm} runs at share {self.share:g}, {self.side} the {bound} "
                f"measured share of {self.model}@{self.gpu} tp={self.tp} ({measured}): its "
                "latency is extrapolated (--shares-within-profile keeps shares within the "
                "profile)")


def share_range(problem: PlanningProblem, llm: str, gpu: str,
                tp: int) -> tuple[float, float] | None:
    """The measured shares of ``llm``'s model on ``(gpu, tp)`` under the problem's latency model
    (:func:`scepsy_profile.latency.measured_shares`; None: every share, an analytical model).
    Raises :class:`~scepsy_common.errors.UncoveredInstanceError` where the model does not
    cover the instance."""
    return measured_shares(problem.latency, problem.models[llm], gpu, tp)


def profiled_shares(problem: PlanningProblem, llm: str, gpu: str, tp: int,
                    shares: Iterable[float]) -> list[float]:
    """``shares`` (the grid) as candidate generation uses them for ``llm`` on ``(gpu, tp)``: all
    of them, or with ``shares_within_profile`` those within the measured range (all for an
    analytical model; an instance the model does not cover keeps them all, its curves report
    that)."""
    shares = list(shares)
    if not problem.options.shares_within_profile:
        return shares
    try:
        measured = share_range(problem, llm, gpu, tp)
    except UncoveredInstanceError:
        return shares
    return [s for s in shares if within_measured(s, measured)]


def extrapolated_shares(problem: PlanningProblem,
                        allocation: Allocation | None) -> dict[str, ShareExtrapolation]:
    """Per LLM of ``allocation`` whose share lies outside the measured shares of its
    ``(model, gpu, tp)``, where and by how much (sorted by LLM; empty without an allocation,
    and for every LLM an analytical model prices). Instances the latency model does not cover
    are left out (no plan holds one)."""
    out: dict[str, ShareExtrapolation] = {}
    if allocation is None:
        return out
    for llm in sorted(allocation.llms):
        inst = allocation.llms[llm]
        try:
            measured = share_range(problem, llm, inst.gpu, inst.tp)
        except UncoveredInstanceError:
            continue
        if measured is not None and not within_measured(inst.share, measured):
            out[llm] = ShareExtrapolation(llm, problem.models[llm], inst.gpu, inst.tp,
                                          float(inst.share), measured[0], measured[1])
    return out
