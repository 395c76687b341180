"""Predicted request-latency percentiles (p50/p90/p99) vs the discrete-event simulator.

    python benchmarks/tail_accuracy.py [--allocations 4] [--gpus 4,8,16] [--requests 1600] [--jobs 2]
    python benchmarks/tail_accuracy.py --quick      # 2 allocations, 800 arrivals: a smoke run
    python benchmarks/tail_accuracy.py --summary    # reprint the stored results' table

For each bundled workflow (RAG + reranker, beam search + PRM, coding agent), draw random
feasible allocations (the seeded allocations of benchmarks/predictor_accuracy.py) and, at 30%,
55% and 80% of saturation, compare the predicted p50/p90/p99 (``scepsy_opt.prediction.tails``: every
request's critical-path work at the predictor's loaded per-LLM unit latencies) with the
simulator's. Saturation is the predictor's maximum throughput (``--saturation simulated`` runs
the simulator's saturation search instead: slower, the reference of predictor_accuracy.py).
Prints the signed median errors per workflow and load and writes results/tail_accuracy.json.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np

from _common import RESULTS, pct, table, write_results
from predictor_accuracy import (
    LATENCY_SCALE,
    SATURATION_SCALE,
    WORKFLOWS,
    allocations,
    workload,
)
from scepsy_opt.allocation import Allocation
from scepsy_opt.prediction.pipeline import class_latencies, instance_curve, llm_demand, predict
from scepsy_opt.prediction.simulate import saturation_rate, simulate
from scepsy_opt.prediction.tails import latency_quantiles
from scepsy_opt.stats import WorkflowStats, workflow_stats
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import MemoryPolicy

FRACTIONS = (0.3, 0.55, 0.8)
QS = (50, 90, 99)


def unit_latencies(st: WorkflowStats, models: dict[str, str], alloc: Allocation, latency: Any,
                   rate: float, policy: MemoryPolicy) -> dict[str, float]:
    """Per LLM, the critical-path-weighted mean call latency ``Σ_c k_c·L_c / Σ_c k_c`` of its
    roles at ``rate`` (req/s): the predictor's class latencies (pipeline.class_latencies)."""
    stats = {st.workflow: st}
    out = {}
    for m, s in st.llms.items():
        dem = llm_demand(stats, models, {st.workflow: rate}, m)
        inst = alloc.llms[m]
        curve = instance_curve(dem, latency, inst.gpu, inst.tp, inst.share, policy=policy)
        _, per_class = class_latencies(dem, curve, latency, [inst.replicas])
        classes = s.classes or ()
        total = sum(c.n for c in classes) or 1.0
        if not classes:
            out[m] = float(next(iter(per_class.values()))[0])
            continue
        k = [c.n / total for c in classes]
        out[m] = sum(kc * float(per_class[(c.input_mean, c.output_mean)][0])
                     for kc, c in zip(k, classes, strict=True)) / sum(k)
    return out


def evaluate(name: str, gpus: int, k: int, seed: int, requests: int, sat_mode: str) -> list[dict]:
    spec, trace = workload(name, seed)
    st = workflow_stats(trace, spec.name, seed=seed)
    roof = roofline_model()
    pol = MemoryPolicy()
    models = dict(spec.llms)
    rows = []
    n_lat = max(200, int(requests * LATENCY_SCALE[name]))
    for i, alloc in enumerate(allocations(spec, gpus, seed, k)):
        if alloc is None:
            continue
        sim_kw = dict(models=models, allocation=alloc, latency=roof, seed=seed + i, policy=pol)
        pred_sat = predict({spec.name: st}, models, alloc, roof, {spec.name: 1.0},
                           policy=pol).workflows[spec.name].max_throughput
        sat = pred_sat
        if sat_mode == "simulated":
            sat = saturation_rate(trace, rates={spec.name: 1.0}, rel_tol=0.05,
                                  requests=max(200, int(requests * SATURATION_SCALE[name])),
                                  **sim_kw)
        for frac in FRACTIONS:
            rate = frac * sat
            pred = predict({spec.name: st}, models, alloc, roof, {spec.name: rate}, policy=pol)
            wp = pred.workflows[spec.name]
            u = unit_latencies(st, models, alloc, roof, rate, pol)
            mine = latency_quantiles(st.paths, u, QS)
            sim = simulate(trace, rates={spec.name: rate}, requests=n_lat, **sim_kw)
            sw = sim.workflows[spec.name]
            rows.append({
                "workflow": name, "gpus": gpus, "alloc": i, "fraction": frac, "rate": rate,
                "pred_saturation": pred_sat, "saturation": sat,
                "pred_mean": wp.mean_latency_s,
                **{f"pred_p{q}": v for q, v in zip(QS, mine, strict=True)},
                # the predictor's own percentiles where it has them (scepsy_opt.prediction.pipeline, F)
                **{f"predict_p{q}": getattr(wp, f"p{q}_latency_s", math.nan) for q in QS},
                "sim_mean": sw.mean_latency_s, "sim_p50": sw.p50_latency_s,
                "sim_p90": sw.p90_latency_s, "sim_p99": sw.p99_latency_s,
                "sim_measured": sw.measured, "sim_unfinished": sw.unfinished,
            })
    print(f"{name} on {gpus} GPUs: {len(rows) // len(FRACTIONS)} allocations", flush=True)
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Signed median errors (predicted / simulated − 1) per workflow and load fraction."""
    out = []
    for w in WORKFLOWS:
        for f in (*FRACTIONS, None):
            sel = [r for r in rows if r["workflow"] == w and (f is None or r["fraction"] == f)]
            if not sel:
                continue
            line: dict[str, Any] = {"workflow": w, "load": "all" if f is None else f"{f:.2f}",
                                    "runs": len(sel)}
            for key in ("mean", "p50", "p90", "p99"):
                err = [r[f"pred_{key}"] / r[f"sim_{key}"] - 1 for r in sel
                       if r[f"sim_{key}"] > 0 and math.isfinite(r[f"pred_{key}"])]
                line[key] = pct(float(np.median(err))) if err else "-"
            err90 = [abs(r["pred_p90"] / r["sim_p90"] - 1) for r in sel if r["sim_p90"] > 0]
            line["|p90| median"] = pct(float(np.median(err90))) if err90 else "-"
            # the shape alone: the predicted p90 / mean against the simulated one (the tail
            # model's error given the mean; the mean's own error is the predictor's)
            shape = [(r["pred_p90"] / r["pred_mean"]) / (r["sim_p90"] / r["sim_mean"]) - 1
                     for r in sel if r["sim_p90"] > 0 and r["pred_mean"] > 0]
            line["p90/mean"] = pct(float(np.median(shape))) if shape else "-"
            out.append(line)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocations", type=int, default=None, help="per workflow (4; --quick 2)")
    ap.add_argument("--gpus", default="4,8,16", help="comma-separated cluster sizes (A100-80GB)")
    ap.add_argument("--requests", type=int, default=None,
                    help="simulated arrivals per run (1600; --quick 800; x LATENCY_SCALE)")
    ap.add_argument("--saturation", choices=("predicted", "simulated"), default="predicted")
    ap.add_argument("--workflows", default=",".join(WORKFLOWS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--summary", action="store_true",
                    help="reprint the table of the stored results (no simulation)")
    args = ap.parse_args()
    name = "tail_accuracy" + ("_quick" if args.quick else "")
    if args.summary:
        stored = json.loads((RESULTS / f"{name}.json").read_text())
        summary = summarise(stored["rows"])
        print(table(summary, list(summary[0])))
        return
    k = args.allocations or (2 if args.quick else 4)
    requests = args.requests or (800 if args.quick else 1600)
    chosen = [w.strip() for w in args.workflows.split(",") if w.strip()]
    if not chosen or any(w not in WORKFLOWS for w in chosen):
        raise SystemExit(f"--workflows: a comma-separated subset of {list(WORKFLOWS)}")
    sizes = [int(g) for g in args.gpus.split(",") if g.strip()]
    from joblib import Parallel, delayed

    t0 = time.perf_counter()
    results = Parallel(n_jobs=args.jobs)(
        delayed(evaluate)(w, g, k, args.seed, requests, args.saturation)
        for w in chosen for g in sizes)
    rows = [r for rs in results for r in rs]
    summary = summarise(rows)
    print("Signed median error of the predicted request-latency percentiles against the simulator "
          f"({args.gpus} GPUs, load = fraction of the {args.saturation} saturation rate)")
    print(table(summary, list(summary[0])))
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    payload = {"rows": rows, "summary": summary, "gpus": sizes,
               "saturation": args.saturation, "requests": requests}
    print(f"results: {write_results(name, payload)}")


if __name__ == "__main__":
    main()
