"""Predictions and simulation results as plain dicts (the CLI's ``--json`` documents).

Keys and units are those of docs/predictor.md and docs/simulator.md; numbers are left unrounded
(``inf`` stays ``inf``: a workflow that cannot be served has no finite latency).
"""

from __future__ import annotations

import math
from typing import Any

from scepsy_opt.prediction.pipeline import Prediction
from scepsy_opt.prediction.simulate import SimulationResult


def _nan_none(x: float) -> float | None:
    """A figure that is not predicted (NaN) as None: JSON has no NaN."""
    return None if math.isnan(x) else x


def prediction_to_dict(pred: Prediction, form: str) -> dict[str, Any]:
    """``{"form", "workflows": {w: rate, throughput, ...}, "llms": {m: model, rate, ...}}``;
    a workflow's throughput is its rate, capped at its maximum throughput; a percentile that is
    not predicted (the paper's form) is None."""
    workflows = {w: {"rate": p.rate, "throughput": p.throughput,
                     "max_throughput": p.max_throughput, "bottleneck": p.bottleneck,
                     "saturated": p.saturated, "mean_latency_s": p.mean_latency_s,
                     "p50_latency_s": _nan_none(p.p50_latency_s),
                     "p90_latency_s": _nan_none(p.p90_latency_s),
                     "p99_latency_s": _nan_none(p.p99_latency_s)}
                 for w, p in pred.workflows.items()}
    llms = {m: {"model": ld.model, "rate": ld.rate, "replicas": ld.replicas, "mu": ld.mu,
                "utilisation": ld.utilisation, "call_latency_s": ld.call_latency_s,
                "ttft_s": ld.ttft_s, "tpot_s": ld.tpot_s,
                "preemptions_per_call": ld.preemptions_per_call, "overloaded": ld.overloaded}
            for m, ld in pred.llms.items()}
    return {"form": form, "workflows": workflows, "llms": llms}


def simulation_to_dict(res: SimulationResult) -> dict[str, Any]:
    """``{"workflows": {w: throughput, latency percentiles, ...}, "llms": {...}, "llm_calls",
    "events"}``."""
    workflows = {w: {"throughput": m.throughput, "mean_latency_s": m.mean_latency_s,
                     "p50_latency_s": m.p50_latency_s, "p90_latency_s": m.p90_latency_s,
                     "p99_latency_s": m.p99_latency_s, "completed": m.completed,
                     "unfinished": m.unfinished} for w, m in res.workflows.items()}
    llms = {m: {"replicas": x.replicas, "calls": x.calls, "utilisation": x.utilisation,
                "mean_batch": x.mean_batch, "preemptions": x.preemptions,
                "preemptions_per_call": x.preemptions_per_call} for m, x in res.llms.items()}
    return {"workflows": workflows, "llms": llms, "llm_calls": res.llm_calls,
            "events": res.events}
