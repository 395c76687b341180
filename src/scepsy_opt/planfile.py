"""``plan.json``: a plan as a file (docs/optimiser.md).

Everything in it is a function of the inputs, so the same inputs give the same bytes, except
the ``timings`` block (wall-clock seconds), which :func:`plan_to_dict` leaves out when asked.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scepsy_common.files import atomic_write_text
from scepsy_opt.cluster import cluster_to_dict
from scepsy_opt.plans import Plan, workflow_latencies
from scepsy_opt.problem import PlanningProblem

TIMING_KEYS = ("candidates_s", "build_s", "solve_s", "total_s")


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def plan_rows(problem: PlanningProblem, plan: Plan) -> list[dict[str, Any]]:
    """One row per LLM: its instance, μ, load, utilisation and share of the objective."""
    total = sum(c.latency_s for c in plan.candidates.values()) or 1.0
    rows = []
    for m, c in plan.candidates.items():
        rows.append({
            "llm": m, "model": problem.models[m], "gpu": c.gpu, "tp": c.tp, "share": c.share,
            "replicas": c.replicas, "gpus": c.gpus, "memory_gib_per_gpu": c.memory_gib,
            "mu_calls_s": c.mu,
            "call_latency_s": c.call_latency_s, "latency_share": c.latency_s / total,
        })
    return rows


def plan_to_dict(problem: PlanningProblem, plan: Plan, *, timings: bool = True,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan.json document (see the module docstring); ``extra`` adds top-level entries
    (``scepsy plan`` adds the placement)."""
    stats = {k: v for k, v in plan.stats.items() if k not in TIMING_KEYS}
    doc: dict[str, Any] = {
        "optimiser": plan.optimiser,
        "status": plan.status,
        "objective": problem.options.objective,
        "targets": dict(problem.targets),
        "scale": plan.scale,
        "cluster": cluster_to_dict(problem.cluster),
        "solver": {"objective_s": _num(plan.objective_s), "bound_s": _num(plan.bound_s),
                   "gap": _num(plan.gap), "time_limit_s": problem.options.time_limit_s,
                   "gap_limit": problem.options.gap_rel, **stats},
    }
    if plan.allocation is not None:
        doc["allocation"] = plan.allocation.to_dict()
        lat = workflow_latencies(problem.scaled(plan.scale) if plan.scale != 1.0 else problem, plan)
        doc["workflows"] = {w: {"throughput": problem.targets[w] * plan.scale,
                                "mean_latency_s": lat[w]} for w in sorted(lat)}
        doc["llms"] = {r["llm"]: {k: v for k, v in r.items() if k != "llm"}
                       for r in plan_rows(problem, plan)}
    if plan.infeasible is not None:
        inf = plan.infeasible
        doc["infeasible"] = {"reason": inf.reason, "detail": inf.detail,
                             "max_scale": inf.max_scale,
                             "max_throughput": dict(inf.max_throughput),
                             "bottleneck": inf.bottleneck, "binding": list(inf.binding),
                             "gain_per_gpu": dict(sorted(inf.gain_per_gpu.items()))}
    doc.update(extra or {})
    if timings:
        doc["timings"] = {k: plan.stats[k] for k in TIMING_KEYS if k in plan.stats}
    return doc


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def write_plan(path: str | Path, doc: dict[str, Any]) -> None:
    """Write a plan.json document (:func:`plan_to_dict`) atomically: nothing half-written."""
    atomic_write_text(path, dumps(doc))
