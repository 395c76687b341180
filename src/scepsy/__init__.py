"""scepsy: plan, predict and simulate multi-LLM agentic workflows on GPU clusters.

``scepsy.plan``, ``scepsy.predict`` and ``scepsy.simulate`` (:mod:`scepsy.api`) are the main
jobs as functions; they are imported on first use, so ``import scepsy`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scepsy.api import PlanResult, plan, predict, simulate

__all__ = ["PlanResult", "plan", "predict", "simulate"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from scepsy import api

        return getattr(api, name)
    raise AttributeError(f"module 'scepsy' has no attribute {name!r}")
