"""Many LLMs sharing GPUs: max-throughput, its proven bound and the replication floor.

Instances (:func:`scepsy_opt.planning.instances.many_models_problem`): N LLMs in copies of MuxServe's 16
(4 x LLaMA-7B, 6 x 13B, 3 x 30B, 3 x 65B) with Zipf popularity within each copy, on A100-80GB
and H100-80GB nodes of 8 GPUs, half of each, rates sized so that about the whole cluster is
needed (calibrated roofline latency model). Per size (``NxGPUS``):

* ``max-throughput`` with ``--formulation auto`` (``scepsy_place.formulations.loop.plan_and_place``): the
  carried scale of the placed plan, the proven upper bound on the scale of every allocation
  (``solver.scale_bound``, :func:`scepsy_opt.planning.milp.scale_upper_bound`) and the gap
  ``bound / scale - 1``, the status, wall and CPU time and the peak RSS growth of the forked
  process that ran it;
* the bound over allocations with every LLM on **one GPU type** (as max-throughput's plans
  are; ``scale_upper_bound(..., one_type=True)``, computed after the timed run): the bound
  less this one is the part of the gap that letting an LLM split across types costs;
* the **replication floor**: k copies of the best plan of one k-th of the problem. Every
  instance is k = N/16 copies of the 16-LLM block on k copies of its 2 + 2 nodes, so the floor
  is the scale of the 16 / 32 plan (solved once, with the same time limit); ``below floor`` is
  a defect. Sizes that are not whole copies of the block (1,000 / 4,096) have no floor here;
* ``min-latency`` at 0.8 of the scale found: status, objective, its proven gap to the bound
  on every placeable allocation (``auto``: above 64 GPUs the aggregate MILP's, solved on a
  second core), wall time;
* with ``--min-cost``, ``min-cost`` at 0.8 of the scale found (no latency bounds; with
  ``--mean-bounds FACTOR``, every workflow's mean bounded at FACTOR times its LLM's least
  latency): status, the placed price per hour, its proven gap to the price bound
  (``placed_cost_gap``), wall time (the time limit starts after the bounds are built).

    python benchmarks/solvers/many_models_bench.py                       # 16x32,64x128,256x512
    python benchmarks/solvers/many_models_bench.py --sizes 1000x4096 --time-limit 60
    python benchmarks/solvers/many_models_bench.py --sizes 16x32 --time-limit 5 --out smoke   # the test
    python benchmarks/solvers/many_models_bench.py --zipf-over-all --out many_models_bench_zipf

``--zipf-over-all``: one Zipf popularity over all N LLMs (a few very popular LLMs need many
GPUs each), not copies; no floor then.

Every run is timed as a whole, the problem's build included (the time limit starts before it);
the bound is reported whether or not a plan was found in time.

Writes ``results/<out>.json`` and prints a table. Exit status 1 when a plan lies below its
replication floor (by more than 1e-6 relative) or a run overran its time limit by more than
10% + 1 s; the targets of the issue (within 2% of the bound, 30 s / 60 s) are reported, not
enforced.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import replace
from typing import Any

from formulations_bench import isolated, write_local_results  # a forked child per run
from scepsy_opt.planning.candidates import price
from scepsy_opt.planning.instances import least_latency_bounds, many_models_problem
from scepsy_opt.planning.milp import scale_upper_bound
from scepsy_opt.planning.problem import Deadline, PlanOptions
from scepsy_place.formulations.loop import plan_and_place
from scepsy_place.packing.topology import from_cluster
from scepsy_profile import roofline_model

BLOCK = (16, 32)  # LLMs, GPUs of one copy
OVERRUN_REL, OVERRUN_ABS = 0.10, 1.0


def _cpu() -> float:
    """CPU seconds of this process and of the solves it forked and waited for
    (:func:`scepsy_opt.planning.solver.run_killable`)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def max_throughput(n: int, gpus: int, limit: float, seed: int, copies: bool = True,
                   formulation: str = "auto") -> dict[str, Any]:
    """One max-throughput run, timed as a whole: the time limit starts before the problem is
    built (building 4,096 LLMs' problem is part of the run), and so does the wall clock."""
    t0, c0 = time.perf_counter(), _cpu()
    deadline = Deadline.after(limit)
    problem = many_models_problem(n, gpus, roofline_model(), seed=seed, copies=copies,
                                  options=PlanOptions(objective="max-throughput",
                                                      time_limit_s=limit))
    build = time.perf_counter() - t0
    res = plan_and_place(problem, from_cluster(problem.cluster), formulation=formulation,
                         deadline=deadline)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    stats = res.plan.stats
    bound = stats.get("scale_bound")  # reported whether or not a plan was found
    # after the timed run: the bound over allocations with every LLM on one GPU type (as
    # max-throughput's plans are); bound - one_type is the part of the gap the split costs
    one = scale_upper_bound(problem, deadline=Deadline.after(limit), one_type=True)
    scale = res.plan.scale if res.placed else 0.0
    return {"status": res.status, "plan_status": res.plan.status, "formulation": res.formulation,
            "scale": scale, "bound": bound,
            "gap": (bound / scale - 1) if bound is not None and scale > 0 else None,
            "bound_one_type": one if math.isfinite(one) else None,
            "wall_s": wall, "build_s": build, "cpu_s": cpu, "parts": stats.get("parts"),
            "probes": stats.get("probes"), "probes_cut": stats.get("probes_cut"),
            "probes_infeasible": stats.get("probes_infeasible")}


def min_latency(n: int, gpus: int, limit: float, seed: int, scale: float, copies: bool = True,
                formulation: str = "auto") -> dict[str, Any]:
    problem = many_models_problem(n, gpus, roofline_model(), seed=seed, copies=copies,
                                  options=PlanOptions(time_limit_s=limit)).scaled(scale)
    t0 = time.perf_counter()
    res = plan_and_place(problem, from_cluster(problem.cluster), formulation=formulation)
    return {"status": res.status, "objective_s": res.plan.objective_s if res.placed else None,
            "gap": res.gap, "wall_s": time.perf_counter() - t0}


def min_cost(n: int, gpus: int, limit: float, seed: int, scale: float, copies: bool = True,
             mean_bounds: float | None = None) -> dict[str, Any]:
    """One min-cost run at ``scale`` of the targets, timed as a whole (the build included);
    ``mean_bounds``: every workflow's mean latency bounded at this many times its LLM's least
    latency (:func:`scepsy_opt.planning.instances.least_latency_bounds`; the clock starts
    again once they are built: they are the bench's input, not the planner's work)."""
    t0 = time.perf_counter()
    deadline = Deadline.after(limit)
    problem = many_models_problem(n, gpus, roofline_model(), seed=seed, copies=copies,
                                  options=PlanOptions(objective="min-cost", time_limit_s=limit)
                                  ).scaled(scale)
    if mean_bounds is not None:
        problem = replace(problem, options=replace(problem.options, latency_bound_s=(
            least_latency_bounds(problem, mean_bounds))))
        t0 = time.perf_counter()
        deadline = Deadline.after(limit)
    res = plan_and_place(problem, from_cluster(problem.cluster), deadline=deadline)
    s = res.plan.stats
    return {"status": res.status, "plan_status": res.plan.status,
            "cost_per_hour": s.get("placed_cost_per_hour") if res.placed else None,
            "bound_per_hour": s.get("cost_bound_per_hour"),
            "gap": s.get("placed_cost_gap") if res.placed else None,
            "formulation": res.formulation, "mean_bounds": mean_bounds,
            "bounds_met": (None if not problem.options.latency_bound_s or not res.placed else
                           all(dict(c.workflow_latency_s)[w] <= problem.options.latency_bound_s[w]
                               * (1 + 1e-6) for w, c in price(problem, res.plan.allocation).items())),
            "wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="16x32,64x128,256x512")
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-min-latency", action="store_true")
    ap.add_argument("--min-cost", action="store_true",
                    help="also min-cost at 0.8 of the scale found (no latency bounds)")
    ap.add_argument("--mean-bounds", type=float, default=None, metavar="FACTOR",
                    help="min-cost with every workflow's mean latency bounded at FACTOR times "
                    "its LLM's least latency at the fewest replicas that carry it")
    ap.add_argument("--zipf-over-all", action="store_true",
                    help="one Zipf popularity over all N LLMs instead of copies of 16 (no floor)")
    ap.add_argument("--formulation", default="auto",
                    help="the placement formulation of every run (default auto)")
    ap.add_argument("--out", default="many_models_bench")
    args = ap.parse_args(argv)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    limit = args.time_limit
    floor_row: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for n, g in sizes:
        print(f"{n} LLMs / {g} GPUs ...", file=sys.stderr, flush=True)
        row: dict[str, Any] = {"llms": n, "gpus": g, "time_limit_s": limit,
                               **isolated(lambda n=n, g=g: max_throughput(
                                   n, g, limit, args.seed, not args.zipf_over_all, args.formulation))}
        copies = n // BLOCK[0]
        if n % BLOCK[0] == 0 and g == copies * BLOCK[1] and not args.zipf_over_all:
            if floor_row is None:
                floor_row = (dict(row) if (n, g) == BLOCK else
                             isolated(lambda: max_throughput(*BLOCK, limit, args.seed,
                                                                formulation=args.formulation)))
            row["floor"] = floor_row.get("scale")
            row["floor_copies"] = copies
        if row.get("status") == "error":
            problems.append(f"{n}x{g}: the run failed ({row.get('error', 'no detail')})")
        if row.get("wall_s", 0.0) > limit * (1 + OVERRUN_REL) + OVERRUN_ABS:
            problems.append(f"{n}x{g}: ran {row['wall_s']:.1f} s against a {limit:g} s limit")
        if row.get("floor") is not None and row.get("scale", 0.0) < row["floor"] * (1 - 1e-6):
            problems.append(f"{n}x{g}: scale {row['scale']:.4f} below its replication floor "
                            f"{row['floor']:.4f}")
        if not args.no_min_latency and row.get("scale", 0.0) > 0:
            row["min_latency"] = isolated(lambda n=n, g=g, s=row["scale"]: min_latency(
                n, g, limit, args.seed, 0.8 * s, not args.zipf_over_all, args.formulation))
            if row["min_latency"].get("wall_s", 0.0) > limit * (1 + OVERRUN_REL) + OVERRUN_ABS:
                problems.append(f"{n}x{g}: min-latency ran {row['min_latency']['wall_s']:.1f} s "
                                f"against a {limit:g} s limit")
        if args.min_cost and row.get("scale", 0.0) > 0:
            row["min_cost"] = isolated(lambda n=n, g=g, s=row["scale"]: min_cost(
                n, g, limit, args.seed, 0.8 * s, not args.zipf_over_all, args.mean_bounds))
            if row["min_cost"].get("wall_s", 0.0) > limit * (1 + OVERRUN_REL) + OVERRUN_ABS:
                problems.append(f"{n}x{g}: min-cost ran {row['min_cost']['wall_s']:.1f} s "
                                f"against a {limit:g} s limit")
        rows.append(row)
    print("| LLMs / GPUs | status | scale | bound | gap | bound, one type per LLM | floor | "
          "wall s | CPU s | peak MB | min-latency at 0.8 (status, s, gap, wall) | "
          "min-cost at 0.8 (status, USD/h, gap, wall) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ml = r.get("min_latency") or {}
        mc = r.get("min_cost") or {}

        def f(x: Any, fmt: str = ".4f") -> str:
            return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)
        print(f"| {r['llms']} / {r['gpus']} | {r.get('status')} ({r.get('plan_status')}) | "
              f"{f(r.get('scale'))} | {f(r.get('bound'))} | {f(r.get('gap'), '.2%')} | "
              f"{f(r.get('bound_one_type'))} | {f(r.get('floor'))} | {f(r.get('wall_s'), '.1f')} | {f(r.get('cpu_s'), '.1f')} | "
              f"{f(r.get('peak_mb'), '.0f')} | {ml.get('status', '–')}, "
              f"{f(ml.get('objective_s'), '.3f')}, {f(ml.get('gap'), '.2%')}, "
              f"{f(ml.get('wall_s'), '.1f')} | "
              f"{mc.get('status', '–')}, {f(mc.get('cost_per_hour'), '.2f')}, "
              f"{f(mc.get('gap'), '.2%')}, {f(mc.get('wall_s'), '.1f')} |")
    write_local_results(args.out, {"rows": rows, "problems": problems, "time_limit_s": limit,
                                   "seed": args.seed, "zipf_over_all": args.zipf_over_all,
                                   "formulation": args.formulation})
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
