"""Program-level LAS against per-call FCFS in the simulator: workflow p90 latency at equal load.

A workload of ``datasets/`` (default: RAG + beam search, which share the ``generator`` LLM, on
the hand-made 8-GPU allocation) is served with the roofline latency model. The allocation's
saturation load is found first (:func:`scepsy_opt.prediction.simulate.saturation_rate`); then
each load (a fraction of it) is simulated twice with the same arrivals (same seed): every
replica's waiting queue first come, first served, and ordered by the least attained service of
the call's request (``priority="las"``, :mod:`scepsy_opt.prediction.priority`). The table gives
each workflow's p90 latency and the p90 over all requests after the warm-up; ``--out`` writes
them as JSON.

Priorities only act on calls that wait: with continuous batching a call waits only when the
batch limit (``--max-batch``, vLLM's ``max_num_seqs``) or the KV cache is full.

    python benchmarks/las_vs_fcfs.py [--quick] [--loads 0.9,1.0,1.1] [--max-batch N] [--out F]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from scepsy.tables import format_table
from scepsy_opt.allocation import load_allocation
from scepsy_opt.prediction.priority import PRIORITY_POLICIES
from scepsy_opt.prediction.simulate import saturation_rate, simulate
from scepsy_opt.workload import load_specs, models_of, workload_trace
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import MemoryPolicy

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "datasets" / "workflows" / "rag-beam.yaml"
ALLOCATION = REPO / "datasets" / "allocations" / "rag-beam-8gpu.yaml"
FULL = {"loads": (0.9, 1.0, 1.1), "requests": 1500, "trace_requests": 100,
        "saturation_requests": 600}
QUICK = {"loads": (1.0,), "requests": 150, "trace_requests": 12, "saturation_requests": 150}


def run(*, workload: Path = WORKLOAD, allocation: Path = ALLOCATION, quick: bool = False,
        loads: tuple[float, ...] | None = None, max_batch: int | None = None, seed: int = 0,
        requests: int | None = None) -> dict[str, Any]:
    """The comparison as a JSON-able document: ``{"workload", "allocation", "max_batch",
    "saturation_rate", "rows": [{"load", "total_rate", "priority", "p90_latency_s": {wf: s},
    "p90_all_s", "mean_all_s", "arrivals", "unfinished", "wall_s"}]}``."""
    cfg = dict(QUICK if quick else FULL)
    if loads is not None:
        cfg["loads"] = loads
    if requests is not None:
        cfg["requests"] = requests
    specs = load_specs(workload)
    trace = workload_trace(specs, None, requests=int(cfg["trace_requests"]), seed=seed)
    models = models_of(specs)
    alloc = load_allocation(allocation)
    lat = roofline_model()
    policy = MemoryPolicy() if max_batch is None else MemoryPolicy(max_batch=max_batch)
    rel = {s.name: float(s.weight) for s in specs}
    mu = saturation_rate(trace, models, alloc, lat, rel, requests=int(cfg["saturation_requests"]),
                         seed=seed, policy=policy)
    total_rel = sum(rel.values())
    rows = []
    for load in cfg["loads"]:
        rates = {w: load * mu * r for w, r in rel.items()}
        for priority in PRIORITY_POLICIES:
            tic = time.perf_counter()
            res = simulate(trace, models, alloc, lat, rates, requests=int(cfg["requests"]),
                           seed=seed, policy=policy, priority=priority)
            warm = math.floor(0.1 * res.arrivals)
            lats = [r.latency_s for r in res.requests[warm:] if r.latency_s is not None]
            rows.append({
                "load": load, "total_rate": load * mu * total_rel, "priority": priority,
                "p90_latency_s": {w: x.p90_latency_s for w, x in res.workflows.items()},
                "p90_all_s": float(np.percentile(lats, 90)) if lats else math.nan,
                "mean_all_s": float(np.mean(lats)) if lats else math.nan,
                "arrivals": res.arrivals, "unfinished": res.unfinished,
                "wall_s": time.perf_counter() - tic,
            })
    return {"workload": str(workload.relative_to(REPO) if workload.is_relative_to(REPO)
                            else workload),
            "allocation": str(allocation.relative_to(REPO) if allocation.is_relative_to(REPO)
                              else allocation),
            "max_batch": policy.max_batch, "seed": seed, "saturation_rate": mu * total_rel,
            "rows": rows}


def table(doc: dict[str, Any]) -> str:
    """One line per load and policy; ``las/fcfs`` is the ratio of the all-requests p90."""
    fcfs = {r["load"]: r["p90_all_s"] for r in doc["rows"] if r["priority"] == "fcfs"}
    workflows = sorted({w for r in doc["rows"] for w in r["p90_latency_s"]})
    lines = []
    for r in doc["rows"]:
        line: dict[str, object] = {"load": f"{r['load']:.2f}", "req/s": f"{r['total_rate']:.3f}",
                                   "priority": r["priority"]}
        for w in workflows:
            line[f"p90 {w} (s)"] = f"{r['p90_latency_s'].get(w, math.nan):.2f}"
        line["p90 all (s)"] = f"{r['p90_all_s']:.2f}"
        line["mean all (s)"] = f"{r['mean_all_s']:.2f}"
        line["las/fcfs p90"] = f"{r['p90_all_s'] / fcfs[r['load']]:.3f}"
        line["unfinished"] = r["unfinished"]
        lines.append(line)
    cols = list(lines[0]) if lines else []
    return format_table(lines, cols)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, default=WORKLOAD)
    ap.add_argument("--allocation", type=Path, default=ALLOCATION)
    ap.add_argument("--loads", default=None,
                    help="fractions of the saturation load, comma-separated (default 0.9,1.0,1.1)")
    ap.add_argument("--max-batch", type=int, default=None,
                    help="sequences per replica (vLLM max_num_seqs; default the engine's)")
    ap.add_argument("--requests", type=int, default=None, help="arrivals per run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a small run (seconds)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    loads = None
    if args.loads:
        try:
            loads = tuple(float(x) for x in args.loads.split(","))
        except ValueError:
            ap.error(f"--loads: comma-separated numbers, got {args.loads!r}")
        if not all(math.isfinite(x) and x > 0 for x in loads):
            ap.error(f"--loads: fractions > 0, got {args.loads!r}")
    if args.max_batch is not None and args.max_batch < 1:
        ap.error(f"--max-batch: an integer >= 1, got {args.max_batch}")
    doc = run(workload=args.workload.resolve(), allocation=args.allocation.resolve(),
              quick=args.quick, loads=loads, max_batch=args.max_batch, seed=args.seed,
              requests=args.requests)
    print(f"{doc['workload']} on {doc['allocation']}, max batch {doc['max_batch']}: "
          f"saturates at {doc['saturation_rate']:.3f} req/s")
    print(table(doc))
    if args.out is not None:
        from scepsy_common.files import atomic_write_text

        atomic_write_text(args.out, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
