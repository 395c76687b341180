"""``plan.json``: a plan as a file (docs/optimiser.md; the format: docs/plan-format.md).

Everything in it is a function of the inputs, so the same inputs give the same bytes, except
the ``timings`` block (wall-clock seconds), which :func:`plan_to_dict` leaves out when asked.
The document carries its format version (:data:`PLAN_VERSION`); readers
(:mod:`scepsy_serve.launch.planfile`) reject any other. Besides the plan it says what a
launcher needs: the device types (``devices``), each LLM's weights, each workflow's LLMs and a
``launch`` section of defaults an operator may edit (the served model, the engine command,
arguments, environment, ports and node addresses).

Every workflow of a plan with an allocation carries ``curve`` (:func:`workflow_curves`): its
predicted mean latency at :data:`CURVE_POINTS` throughputs up to its predicted maximum
throughput, every workflow's rate scaled with it, so that ``scepsy report`` needs only the file.

With memory planned as a second resource (``PlanOptions.memory_shares``) every LLM of the
allocation carries ``memory`` (its fraction of each GPU's memory, docs/resources.md) and ``llms``
carries it too, beside ``memory_gib_per_gpu``; plans with memory tied to the share are unchanged.

An LLM whose share lies outside the measured shares of its (model, gpu, tp) carries
``extrapolated_share`` in ``llms`` (:func:`scepsy_opt.planning.coverage.extrapolated_shares`): its share
and the measured range its latency was extrapolated from.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from scepsy_common.files import atomic_write_text
from scepsy_opt.cluster import cluster_to_dict
from scepsy_opt.planning.candidates import slo_checks
from scepsy_opt.planning.coverage import extrapolated_shares
from scepsy_opt.planning.plans import Plan, workflow_latencies
from scepsy_opt.planning.problem import PlanningProblem
from scepsy_opt.planning.solvestats import TIMING_KEYS
from scepsy_opt.prediction.pipeline import Prediction, predict
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.hardware import GIB

PLAN_VERSION = 1
"""The plan.json format this writer emits (docs/plan-format.md)."""
LAUNCH_COMMAND = ("vllm", "serve")
LAUNCH_BASE_PORT = 8000
LAUNCH_HEALTH_TIMEOUT_S = 900.0
CURVE_POINTS = 24
"""Points of each workflow's ``curve``: throughputs ``k / (CURVE_POINTS + 1)`` of its predicted
maximum throughput, ``k = 1 .. CURVE_POINTS`` (4% to 96%)."""


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def plan_rows(problem: PlanningProblem, plan: Plan) -> list[dict[str, Any]]:
    """One row per LLM: its instance, μ, load, utilisation and share of the objective; with
    memory planned as a resource of its own, also ``memory`` (the fraction of each GPU's memory
    per replica, beside ``memory_gib_per_gpu``)."""
    total = sum(c.latency_s for c in plan.candidates.values()) or 1.0
    rows = []
    for m, c in plan.candidates.items():
        row = {
            "llm": m, "model": problem.models[m], "gpu": c.gpu, "tp": c.tp, "share": c.share,
            "replicas": c.replicas, "gpus": c.gpus, "memory_gib_per_gpu": c.memory_gib,
            "mu_calls_s": c.mu,
            "call_latency_s": c.call_latency_s, "latency_share": c.latency_s / total,
        }
        if c.memory_share is not None:
            row["memory"] = c.memory_share
        rows.append(row)
    return rows


def _predict_at(problem: PlanningProblem, plan: Plan, rates: dict[str, float]) -> Prediction:
    assert plan.allocation is not None
    return predict(problem.stats, problem.models, plan.allocation, problem.latency, rates,
                   catalog=problem.catalog, policy=problem.policy)


def workflow_curves(problem: PlanningProblem, plan: Plan,
                    points: int = CURVE_POINTS) -> dict[str, dict[str, Any]]:
    """Per workflow of the plan's rates (``problem``'s targets times ``plan.scale``) its
    ``curve``: ``max_throughput`` (req/s, where the first LLM it calls saturates when every
    workflow's rate scales together), that LLM (``bottleneck``) and ``points``: the predicted
    mean latency (the predictor's critical-path form) at the throughputs ``k / (points + 1)``
    of the maximum, every other workflow at its rate scaled by the same factor. Points whose
    latency is not finite are left out; a workflow without a finite maximum gets no curve.
    Empty without an allocation."""
    if plan.allocation is None:
        return {}
    base = {w: t * plan.scale for w, t in problem.targets.items()}
    cache: dict[float, Prediction] = {}

    def at(factor: float) -> Prediction:
        if factor not in cache:
            cache[factor] = _predict_at(problem, plan, {w: r * factor for w, r in base.items()})
        return cache[factor]

    curves: dict[str, dict[str, Any]] = {}
    for w, p in sorted(at(1.0).workflows.items()):
        top = p.max_throughput / p.rate
        if not (math.isfinite(top) and top > 0):
            continue
        rows = []
        for k in range(1, points + 1):
            q = at(top * k / (points + 1)).workflows[w]
            if math.isfinite(q.mean_latency_s):
                rows.append({"throughput": q.rate, "mean_latency_s": q.mean_latency_s})
        curves[w] = {"max_throughput": p.max_throughput, "bottleneck": p.bottleneck,
                     "points": rows}
    return curves


def device_kind(gpu: str) -> str:
    """``cpu`` for a device type named ``cpu`` or ``cpu...`` (a CPU core is the unit the plan
    shares), else ``cuda``."""
    return "cpu" if gpu.lower().startswith("cpu") else "cuda"


def devices_to_dict(problem: PlanningProblem) -> dict[str, dict[str, Any]]:
    """plan.json's ``devices``: per device type of the cluster, its kind and memory (GiB)."""
    cat = problem.catalog or default_catalog()
    return {g: {"kind": device_kind(g), "memory_gib": cat.gpu(g).memory_gib}
            for g in sorted(problem.cluster.budgets())}


def served_model(model: str, catalog: Catalog) -> str:
    """What an engine loads for catalog ``model``: the name itself when it is a Hugging Face
    repo id (contains ``/``), else the first (sorted) alias with a ``/`` that resolves to the
    model, else the model's name."""
    spec = catalog.model(model)
    repo = sorted(a for a in catalog.aliases_of(spec.name) if "/" in a)
    if "/" in model:  # the workflow named a repo id: keep it, spelled as the catalog does
        return next((a for a in repo if a.lower() == model.lower()), model)
    return repo[0] if repo else spec.name


def weights_gib(model: str, catalog: Catalog) -> float:
    """The whole model's weights (GiB) by the catalog's :attr:`ModelSpec.weight_bytes`."""
    return catalog.model(model).weight_bytes / GIB


def launch_defaults(problem: PlanningProblem, plan: Plan) -> dict[str, Any]:
    """plan.json's ``launch`` section as written: ``vllm serve`` on ports from 8000, every LLM
    serving its catalog model's repo id (:func:`served_model`); no LLM without an allocation."""
    cat = problem.catalog or default_catalog()
    llms = sorted(plan.allocation.llms) if plan.allocation is not None else []
    return {"command": list(LAUNCH_COMMAND), "args": [], "env": {},
            "base_port": LAUNCH_BASE_PORT, "health_timeout_s": LAUNCH_HEALTH_TIMEOUT_S,
            "addresses": {},
            "models": {m: {"serve": served_model(problem.models[m], cat), "args": [], "env": {}}
                       for m in llms}}


def plan_to_dict(problem: PlanningProblem, plan: Plan, *, timings: bool = True,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan.json document (see the module docstring); ``extra`` adds top-level entries
    (``scepsy plan`` adds the placement)."""
    cat = problem.catalog or default_catalog()
    stats = plan.stats.without(*TIMING_KEYS)
    if problem.options.slos and plan.allocation is not None:
        at = problem.scaled(plan.scale) if plan.scale != 1.0 else problem
        stats["slos"] = {m: c.to_dict() for m, c in slo_checks(at, plan.allocation).items()}
    doc: dict[str, Any] = {
        "version": PLAN_VERSION,
        "optimiser": plan.optimiser,
        "status": plan.status,
        "objective": problem.options.objective,
        "targets": dict(problem.targets),
        "scale": plan.scale,
        "cluster": cluster_to_dict(problem.cluster),
        "devices": devices_to_dict(problem),
        "launch": launch_defaults(problem, plan),
        "solver": {"objective_s": _num(plan.objective_s), "bound_s": _num(plan.bound_s),
                   "gap": _num(plan.gap), "time_limit_s": problem.options.time_limit_s,
                   "gap_limit": problem.options.gap_rel, **stats},
    }
    if plan.allocation is not None:
        doc["allocation"] = plan.allocation.to_dict()
        lat = workflow_latencies(problem.scaled(plan.scale) if plan.scale != 1.0 else problem, plan)
        curves = workflow_curves(problem, plan)
        doc["workflows"] = {w: {"throughput": problem.targets[w] * plan.scale,
                                "mean_latency_s": lat[w],
                                "llms": sorted(problem.stats[w].llms),
                                **({"curve": curves[w]} if w in curves else {})}
                            for w in sorted(lat)}
        beyond = extrapolated_shares(problem, plan.allocation)
        doc["llms"] = {r["llm"]: {**{k: v for k, v in r.items() if k != "llm"},
                                  "weights_gib": weights_gib(r["model"], cat),
                                  **({"extrapolated_share": beyond[r["llm"]].to_dict()}
                                     if r["llm"] in beyond else {})}
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


def write_plan(path: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """Write a plan.json document (:func:`plan_to_dict`) atomically: nothing half-written."""
    atomic_write_text(path, dumps(doc))
