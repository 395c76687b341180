"""How far above the lower bounds each placer lands on DGX-like random instances.

Instances: 8-GPU A100-80GB nodes (one NVLink domain each), LLMs with TP 1, 2, 4 or 8, shares in
tenths, replicas drawn until the demand (compute, or memory when larger) reaches a load of 20-85% of the
cluster; memory
per GPU either tied to the share (``share × 80 GiB``) or drawn independently (tenths of the GPU's
memory). Per placer (``hierarchical`` with and without the improvement phase, ``best-fit``,
``ffd``): the gap of the GPUs used to the best lower bound (``scepsy_place.packing.bounds``: max of L2,
memory L2 and the vector bound) at the median, p90 and max, the share of instances placed
completely, and the time; on instances of at most 4 nodes also the gap to the proven optimum (an
exact MILP, :func:`optimum`), which separates what the placer misses from what the bound misses.
Also the time of ``hierarchical`` at 4,096 GPUs.

    python benchmarks/placement_gap.py [--quick] [--seeds N]

Prints a table, writes results/placement_gap.json.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import highspy
import numpy as np
import pulp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import pct, progress, table, write_results
from scepsy_place import Demand, Node, Topology, bound, place

GPU, MEM = "A100-80GB", 80.0
TPS = (1, 1, 1, 2, 2, 4, 8)
PLACERS = {
    "hierarchical+repack": ("hierarchical", {"improve": True, "repack": 20}),
    "hierarchical+improve": ("hierarchical", {"improve": True}),
    "hierarchical": ("hierarchical", {"improve": False}),
    "best-fit": ("best-fit", {}),
    "ffd": ("ffd", {}),
}


def instance(seed: int, nodes: int, memory: str) -> tuple[Topology, list[Demand], float]:
    """A DGX-like instance: ``nodes`` 8-GPU nodes and demands up to a random load in 20-85%."""
    rng = random.Random(seed)
    top = Topology("dgx", tuple(Node(f"dgx-{i}", f"r{i // 8}", GPU, 8, 8, MEM)
                                for i in range(nodes)))
    load = rng.uniform(0.20, 0.85)
    budget = int(load * nodes * 8 * 1000)
    out: list[Demand] = []
    used, used_mem, llm = 0, 0, 0
    while True:
        tp = rng.choice(TPS)
        share = rng.randint(1, 10) / 10
        mem = share if memory == "tied" else rng.randint(1, 10) / 10
        reps = rng.randint(1, 6)
        take = 0
        for _ in range(reps):
            c, m = tp * round(share * 1000), tp * round(mem * 1000)
            if used + c > budget or used_mem + m > budget:
                break
            out.append(Demand(f"m{llm}", take, GPU, tp, share, round(mem * MEM, 6)))
            used, used_mem, take = used + c, used_mem + m, take + 1
        llm += 1
        if take < reps:
            return top, out, max(used, used_mem) / (nodes * 8 * 1000)


def optimum(top: Topology, ds: list[Demand], time_limit_s: float = 20.0) -> tuple[int, bool]:
    """Fewest GPUs of any placement (an exact MILP over the whole topology, empty nodes of one
    type and one domain each): (GPUs, proven optimal). Per domain k and shape s: y groups and
    u slices per GPU (u <= y: distinct GPUs), open_j per GPU; loads and opens ordered within a
    domain and totals across domains (symmetry breaking)."""
    shapes: dict[tuple[int, int, float], int] = {}
    for d in ds:
        key = (d.tp, d.units, d.memory_gib)
        shapes[key] = shapes.get(key, 0) + 1
    sh = sorted(shapes)
    prob = pulp.LpProblem("opt", pulp.LpMinimize)
    opened, totals = [], []
    y: dict[tuple[int, int], pulp.LpVariable] = {}
    for k, n in enumerate(top.nodes):
        o = [pulp.LpVariable(f"o{k}_{j}", cat="Binary") for j in range(n.gpus)]
        opened += o
        loads = []
        for s in range(len(sh)):
            y[k, s] = pulp.LpVariable(f"y{k}_{s}", 0, shapes[sh[s]], cat="Integer")
        u = {(s, j): pulp.LpVariable(f"u{k}_{s}_{j}", 0, shapes[sh[s]], cat="Integer")
             for s in range(len(sh)) for j in range(n.gpus)}
        for s, (tp, _, _) in enumerate(sh):
            prob += pulp.lpSum(u[s, j] for j in range(n.gpus)) == tp * y[k, s]
            for j in range(n.gpus):
                prob += u[s, j] <= y[k, s]
        for j in range(n.gpus):
            load = pulp.lpSum(sh[s][1] * u[s, j] for s in range(len(sh)))
            prob += load <= 1000 * o[j]
            prob += pulp.lpSum(sh[s][2] * u[s, j] for s in range(len(sh))) <= n.memory_gib * o[j]
            loads.append(load)
            if j:
                prob += loads[j - 1] >= loads[j]
                prob += o[j - 1] >= o[j]
        totals.append(pulp.lpSum(loads))
        if k:
            prob += totals[k - 1] >= totals[k]
    for s in range(len(sh)):
        prob += pulp.lpSum(y[k, s] for k in range(len(top.nodes))) == shapes[sh[s]]
    prob += pulp.lpSum(opened)
    prob.solve(pulp.HiGHS(msg=False, threads=1, timeLimit=time_limit_s, random_seed=0))
    status = prob.solverModel.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        return round(pulp.value(prob.objective)), True
    best = prob.solverModel.getInfo().objective_function_value
    return (round(best) if best == best and abs(best) < 1e9 else -1), False


def run(seeds: int, sizes: tuple[int, ...], exact_nodes: int = 4) -> dict:
    rows: dict[str, dict[str, list[float]]] = {
        k: {"gap": [], "opt_gap": [], "time": [], "complete": []} for k in PLACERS}
    cases = []
    for memory in ("tied", "independent"):
        for nodes in sizes:
            for seed in range(seeds):
                top, ds, load = instance(1000 * nodes + seed, nodes, memory)
                b = bound(ds, top)
                opt, proven = optimum(top, ds) if nodes <= exact_nodes else (-1, False)
                case = {"memory": memory, "nodes": nodes, "seed": seed, "load": round(load, 3),
                        "replicas": len(ds), "l2": b.l2, "vector": b.best,
                        "optimum": opt if proven else None}
                for name, (policy, opts) in PLACERS.items():
                    t0 = time.perf_counter()
                    pl = place(top, ds, policy, **opts)
                    dt = time.perf_counter() - t0
                    placed = [d for d in ds if d.key in pl.replicas()]
                    best = bound(placed, top).best
                    gap = pl.gpus_used() / best - 1 if best else 0.0
                    rows[name]["gap"].append(gap)
                    rows[name]["time"].append(dt)
                    rows[name]["complete"].append(float(pl.complete))
                    if proven and pl.complete and opt:
                        rows[name]["opt_gap"].append(pl.gpus_used() / opt - 1)
                    case[name] = {"gpus": pl.gpus_used(), "unplaced": len(pl.unplaced),
                                  "gap": round(gap, 5), "seconds": round(dt, 4)}
                cases.append(case)
            progress(f"{memory}, {nodes} nodes: {len(cases)} instances")
    summary = {}
    for name, r in rows.items():
        g, t, o = np.array(r["gap"]), np.array(r["time"]), np.array(r["opt_gap"] or [0.0])
        summary[name] = {"median_gap": float(np.median(g)), "p90_gap": float(np.quantile(g, 0.9)),
                         "max_gap": float(g.max()), "at_bound": float(np.mean(g <= 1e-12)),
                         "complete": float(np.mean(r["complete"])),
                         "opt_instances": len(r["opt_gap"]),
                         "p90_opt_gap": float(np.quantile(o, 0.9)), "max_opt_gap": float(o.max()),
                         "at_opt": float(np.mean(o <= 1e-12)),
                         "median_s": float(np.median(t)), "max_s": float(t.max())}
    bound_gap = [c["optimum"] / c["vector"] - 1 for c in cases if c["optimum"] and c["vector"]]
    return {"summary": summary, "cases": cases,
            "bound_below_optimum": {"instances": len(bound_gap),
                                    "median": float(np.median(bound_gap or [0.0])),
                                    "p90": float(np.quantile(bound_gap or [0.0], 0.9)),
                                    "max": float(max(bound_gap or [0.0]))}}


def large(nodes: int = 512) -> dict:
    """Time of ``hierarchical`` (with and without improvement) at ``nodes`` × 8 GPUs."""
    top, ds, load = instance(7, nodes, "independent")
    out = {"gpus": nodes * 8, "replicas": len(ds), "load": round(load, 3)}
    for name in ("hierarchical", "hierarchical+improve"):
        policy, opts = PLACERS[name]
        t0 = time.perf_counter()
        pl = place(top, ds, policy, **opts)
        out[name] = {"seconds": round(time.perf_counter() - t0, 3), "gpus": pl.gpus_used(),
                     "unplaced": len(pl.unplaced), "bound": bound(ds, top).best}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few instances, no 4,096-GPU run")
    ap.add_argument("--seeds", type=int, default=None, help="instances per (memory, size)")
    args = ap.parse_args()
    seeds = args.seeds or (5 if args.quick else 40)
    sizes = (2, 4) if args.quick else (2, 4, 8, 16)
    res = run(seeds, sizes)
    cols = ["placer", "median gap", "p90 gap", "max gap", "at bound", "complete",
            "p90 over opt", "max over opt", "at opt", "median ms", "max ms"]
    rows = [dict(zip(cols, [name, pct(s["median_gap"]), pct(s["p90_gap"]), pct(s["max_gap"]),
                            pct(s["at_bound"]), pct(s["complete"]), pct(s["p90_opt_gap"]),
                            pct(s["max_opt_gap"]), pct(s["at_opt"]),
                            f"{1000 * s['median_s']:.1f}", f"{1000 * s['max_s']:.1f}"],
                        strict=True))
            for name, s in res["summary"].items()]
    bb = res["bound_below_optimum"]
    print(f"{len(res['cases'])} instances (8-GPU nodes x {sizes}, tied and independent memory); "
          f"gap = GPUs used / best bound - 1; 'opt' = the proven optimum "
          f"({res['summary']['hierarchical']['opt_instances']} instances of <= 4 nodes)")
    print(table(rows, cols))
    print(f"optimum over the best bound: median {pct(bb['median'])}, p90 {pct(bb['p90'])}, "
          f"max {pct(bb['max'])}")
    if not args.quick:
        res["large"] = large()
        lg = res["large"]
        print(f"{lg['gpus']} GPUs, {lg['replicas']} replicas: " + ", ".join(
            f"{k} {lg[k]['seconds']} s ({lg[k]['gpus']} GPUs, bound {lg[k]['bound']})"
            for k in ("hierarchical", "hierarchical+improve")))
    path = write_results("placement_gap", {"quick": args.quick, "seeds": seeds,
                                           "sizes": list(sizes), **res})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
