"""Min-cost on single-model problems: the placed price against its proven bound, and what
splitting one LLM over GPU types saves.

Instances: one LLaMA LLM (7B, 13B, 30B, 65B) with ShareGPT-like lengths (prompt lognormal mean
300, output exponential mean 180) at 1, 4, 16 or 64 requests/s, offered two GPU types as open
pools (any number of nodes up to ``max_nodes``) at the catalog's prices: A100-80GB and
H100-80GB nodes of 8, L4 and A10 nodes of 4, A10 nodes of 4 and A100-80GB nodes of 8. Per
instance ``scepsy plan --objective min-cost`` (``scepsy_place.formulations.loop.plan_and_place``): the
placed price (USD/h), its proven bound (``cost_bound_per_hour``: no placed plan of the
candidates, whole LLMs or split over GPU types, costs less) and the gap, the cheapest placed
plan of the other formulations (aggregate, patterns, slot groups: whole LLMs on one shape,
placed by a general placer), the split when one wins, the status and the wall time.

    python benchmarks/solvers/mincost_bench.py                      # 48 instances
    python benchmarks/solvers/mincost_bench.py --models llama-7b --rates 4 --out smoke   # the test

Writes ``results/<out>.json`` and prints a table. Exit status 1 when a placed price lies more
than 2% above its bound or a run overran its time limit by more than 10% + 1 s.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from formulations_bench import write_local_results
from scepsy_opt.cluster import Cluster, GPUPool
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.ratework import models as rate_models
from scepsy_opt.ratework import parse_rate_workload, rate_stats, rates
from scepsy_place.formulations.loop import plan_and_place
from scepsy_place.packing.topology import from_cluster
from scepsy_profile import roofline_model

OFFERS = {"A100+H100": (("A100-80GB", 8), ("H100-80GB", 8)),
          "L4+A10": (("L4", 4), ("A10", 4)),
          "A10+A100": (("A10", 4), ("A100-80GB", 8))}
MAX_NODES = 16
GAP_TARGET = 0.02
OVERRUN_REL, OVERRUN_ABS = 0.10, 1.0


def problem(model: str, rate: float, offer: str, limit: float) -> PlanningProblem:
    wl = parse_rate_workload({"kind": "rates", "name": "one", "llms": {"chat": {
        "model": model, "rate": rate,
        "input": {"kind": "lognormal", "mean": 300, "cv": 1.0, "min": 4, "max": 1536},
        "output": {"kind": "exponential", "mean": 180, "min": 1, "max": 512}}}})
    pools = tuple(GPUPool(g, MAX_NODES, per, None, True) for g, per in OFFERS[offer])
    return PlanningProblem(rate_stats(wl, 300, seed=0), rate_models(wl), rates(wl),
                           Cluster(f"buy-{offer}", pools), roofline_model(),
                           PlanOptions(objective="min-cost", time_limit_s=limit))


def run(model: str, rate: float, offer: str, limit: float) -> dict[str, Any]:
    p = problem(model, rate, offer, limit)
    t0 = time.perf_counter()
    res = plan_and_place(p, from_cluster(p.cluster))
    wall = time.perf_counter() - t0
    st = res.plan.stats
    row: dict[str, Any] = {"model": model, "rate": rate, "offer": offer, "wall_s": wall,
                           "status": res.plan.status, "placed": res.placed}
    if not res.placed:
        row["reason"] = res.reason
        return row
    costs = dict(st.get("placed_costs_per_hour", {}))
    single = [v for k, v in costs.items() if k != "mixed"]
    row.update(price=st["placed_cost_per_hour"], bound=st["cost_bound_per_hour"],
               gap=st["placed_cost_gap"], gpus=st["placed_gpus"],
               others=min(single) if single else None, formulation=res.formulation,
               splits={m: dict(v) for m, v in res.plan.allocation.splits.items()})
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama-7b,llama-13b,llama-30b,llama-65b")
    ap.add_argument("--rates", default="1,4,16,64")
    ap.add_argument("--offers", default=",".join(OFFERS))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", default="mincost_bench")
    args = ap.parse_args(argv)
    rows, problems = [], []
    for offer in args.offers.split(","):
        for model in args.models.split(","):
            for rate in (float(r) for r in args.rates.split(",")):
                print(f"{offer} {model} {rate:g} req/s ...", file=sys.stderr, flush=True)
                row = run(model, rate, offer, args.time_limit)
                rows.append(row)
                name = f"{offer} {model} {rate:g}"
                if row["wall_s"] > args.time_limit * (1 + OVERRUN_REL) + OVERRUN_ABS:
                    problems.append(f"{name}: ran {row['wall_s']:.1f} s against "
                                    f"{args.time_limit:g} s")
                if row.get("placed") and row["gap"] > GAP_TARGET:
                    problems.append(f"{name}: placed price {row['price']:.4g} is "
                                    f"{row['gap']:.2%} above its bound {row['bound']:.4g}")
    print("| offer | model | req/s | status | USD/h | bound | gap | other formulations | split | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if not r.get("placed"):
            print(f"| {r['offer']} | {r['model']} | {r['rate']:g} | {r['status']} | – | – | – "
                  f"| – | – | {r['wall_s']:.1f} |")
            continue
        one = r.get("others")
        split = "; ".join(f"{g} {f:.3g}" for v in r["splits"].values() for g, f in v.items())
        print(f"| {r['offer']} | {r['model']} | {r['rate']:g} | {r['status']} | "
              f"{r['price']:.2f} | {r['bound']:.2f} | {r['gap']:.2%} | "
              f"{'–' if one is None or not math.isfinite(one) else format(one, '.2f')} | "
              f"{split or '–'} | {r['wall_s']:.1f} |")
    write_local_results(args.out, {"rows": rows, "problems": problems,
                                   "time_limit_s": args.time_limit})
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
