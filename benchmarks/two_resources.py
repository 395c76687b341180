"""Compute and memory as two resources against the tied share model: latency, GPUs, fewest GPUs.

    python benchmarks/two_resources.py [--quick]

Two problems, each planned with memory tied to the compute share (the old model) and with memory
as a resource of its own on the tenths grid (``PlanOptions(memory_shares=TENTHS)``):

* ``rag-beam``: datasets/workflows/rag-beam.yaml on datasets/clusters/a100-16.yaml (16 A100-80GB),
  300 trace requests, at the targets rag=0.5 and beam_search=0.2 req/s times a load factor;
* ``mix``: a 65B model (llama-65b) at low load beside a 7B generator (qwen2.5-7b) at high load
  and a cross-encoder reranker (bge-reranker-large), seeded random token statistics
  (``random_stats(3, 3, 7)``; 0.05, 4 and 8 req/s) on 4 or 8 A100-80GB GPUs, and at 8 times
  those targets on 16.

Per row: the MILP's min-latency objective at equal targets (s, proven optimal), the compute and
the memory the plan uses (GPUs' worth: Σ units / 1000), the max scale of the targets the cluster
carries (``milp.max_scale``), and the fewest A100-80GB GPUs (nodes of 8) that carry the targets
(bisection on the GPU count with ``max_scale >= 1``). Writes results/two_resources.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from typing import Any

from _common import REPO, progress, sig, table, write_results
from scepsy.api import plan_problem
from scepsy_opt.cluster import uniform_cluster
from scepsy_opt.planning.candidates import mem_units_by_gpu, units_by_gpu
from scepsy_opt.planning.instances import random_stats
from scepsy_opt.planning.milp import max_scale, solve_min_latency
from scepsy_opt.planning.problem import TENTHS, PlanningProblem, PlanOptions
from scepsy_profile.roofline import roofline_model

GPU = "A100-80GB"
RAG_BEAM = REPO / "datasets" / "workflows" / "rag-beam.yaml"
A16 = REPO / "datasets" / "clusters" / "a100-16.yaml"
MAX_GPUS = 256


def with_memory(problem: PlanningProblem, mode: str) -> PlanningProblem:
    """``problem`` with memory tied to the share or on the tenths grid."""
    grid = None if mode == "tied" else TENTHS
    return dataclasses.replace(problem, options=dataclasses.replace(problem.options,
                                                                    memory_shares=grid))


def on_gpus(problem: PlanningProblem, gpus: int) -> PlanningProblem:
    return dataclasses.replace(problem, cluster=uniform_cluster(GPU, gpus, min(gpus, 8)))


def fewest_gpus(problem: PlanningProblem) -> int | None:
    """The fewest GPUs (nodes of 8) whose max scale reaches the targets (None: > MAX_GPUS)."""
    def carries(g: int) -> bool:
        s, _, status = max_scale(on_gpus(problem, g))
        return status == "optimal" and s >= 1.0

    hi = 1
    while not carries(hi):
        if hi >= MAX_GPUS:
            return None
        hi = min(2 * hi, MAX_GPUS)
    lo = hi // 2  # lo fails (or is 0), hi carries
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if carries(mid) else (mid, hi)
    return hi


def row(name: str, problem: PlanningProblem, mode: str, sweep: bool) -> dict[str, Any]:
    p = with_memory(problem, mode)
    t0 = time.perf_counter()
    plan = solve_min_latency(p)
    seconds = time.perf_counter() - t0
    used = units_by_gpu(plan.candidates.values()) if plan.feasible else {}
    mem = mem_units_by_gpu(plan.candidates.values()) if plan.feasible else {}
    scale, _, _ = max_scale(p)
    out: dict[str, Any] = {
        "problem": name, "gpus": p.cluster.total_gpus, "memory": mode, "status": plan.status,
        "objective_s": sig(plan.objective_s, 6), "compute_gpus": sum(used.values()) / 1000,
        "memory_gpus": sum(mem.values()) / 1000, "max_scale": sig(scale, 4),
        "candidates": plan.stats.get("candidates_kept"), "plan_s": sig(seconds)}
    if sweep:
        out["fewest_gpus"] = fewest_gpus(p)
    out["allocation"] = ({m: [c.tp, c.share, c.memory_share, c.replicas]
                          for m, c in plan.candidates.items()} if plan.feasible else {})
    return out


def mix(gpus: int) -> PlanningProblem:
    """The mix: a 65B model at low load, a 7B model at high load and a reranker."""
    stats, _ = random_stats(3, 3, 7)
    models = {"llm000": "llama-65b", "llm001": "qwen2.5-7b", "llm002": "bge-reranker-large"}
    return PlanningProblem(stats, models, {"wf00": 0.05, "wf01": 4.0, "wf02": 8.0},
                           uniform_cluster(GPU, gpus, min(gpus, 8)), roofline_model(),
                           PlanOptions())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one load per problem, no GPU sweep")
    args = ap.parse_args()
    problems: list[tuple[str, PlanningProblem]] = []
    loads = (4.0,) if args.quick else (1.0, 4.0, 8.0)
    for k in loads:
        p, _ = plan_problem(str(RAG_BEAM), str(A16), {"rag": 0.5 * k, "beam_search": 0.2 * k},
                            trace_requests=300)
        problems.append((f"rag-beam x{k:g}", p))
    for g, k in (((4, 1.0),) if args.quick else ((4, 1.0), (8, 1.0), (16, 8.0))):
        problems.append((f"mix x{k:g} ({g} GPUs)", mix(g).scaled(k)))
    rows = []
    for name, p in problems:
        for mode in ("tied", "tenths"):
            progress(f"{name}, memory {mode}")
            rows.append(row(name, p, mode, sweep=not args.quick))
    cols = [c for c in rows[0] if c != "allocation"]
    print(table(rows, cols))
    gains = []
    for a, b in zip(rows[::2], rows[1::2], strict=True):
        g = {"problem": a["problem"],
             "latency_gain": (sig(1 - b["objective_s"] / a["objective_s"], 4)
                              if math.isfinite(a["objective_s"]) and a["objective_s"] > 0
                              and math.isfinite(b["objective_s"]) else None),
             "scale_gain": sig(b["max_scale"] / a["max_scale"] - 1, 4) if a["max_scale"] else None}
        if "fewest_gpus" in a:
            g["gpus_saved"] = (a["fewest_gpus"] - b["fewest_gpus"]
                               if a["fewest_gpus"] and b["fewest_gpus"] else None)
        gains.append(g)
    print(table(gains, list(gains[0])))
    path = write_results("two_resources", {"quick": args.quick, "rows": rows, "gains": gains})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
