"""Length routing against weight splits on single-model min-cost problems: price, latency.

    python benchmarks/length_routing.py [--quick]

One 8B model (llama-3-8b, roofline latency model) served at 3, 6, 10 or 16 req/s, prompts
lognormal (mean 300, CV 1, at most 1536 tokens; or mean 800, CV 2, at most 7000), outputs
exponential (mean 180, at most 512), 200 trace requests; GPUs: L4 + A10, A10 + A100-80GB or
L4 + A100-80GB, 8 of each at the catalog's prices; no latency bound, or a mean bound of 12 or
6 s. Each problem is planned by ``solve_mixed`` (8 slices) with ``length_routing`` off and on.

Per row: the price by weight and with length routing offered (USD/h), whether length routing
was taken, the solve times, and for the problems where it was taken, the predicted and the
simulated mean latency (``simulate``, 2000 requests at the target rate, seed 1) of both plans.
Writes results/length_routing.json (``--quick``: results/length_routing_quick.json).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

from _common import progress, sig, table, write_results
from scepsy_opt.cluster import Cluster, GPUPool
from scepsy_opt.planning.mixing import mixed_plan, solve_mixed
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.prediction.pipeline import predict
from scepsy_opt.prediction.simulate import simulate
from scepsy_opt.ratework import models, parse_rate_workload, rate_stats, rate_trace, rates
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
PROMPTS = {"short": {"kind": "lognormal", "mean": 300, "cv": 1.0, "min": 4, "max": 1536},
           "long": {"kind": "lognormal", "mean": 800, "cv": 2.0, "min": 4, "max": 7000}}


def workload(rate: float, prompts: str):
    return parse_rate_workload({"kind": "rates", "name": "chat", "llms": {"chat": {
        "model": "llama-3-8b", "rate": rate, "input": PROMPTS[prompts],
        "output": {"kind": "exponential", "mean": 180, "min": 1, "max": 512}}}})


def row(rate: float, gpus: tuple[str, str], bound: float | None, prompts: str) -> dict:
    wl = workload(rate, prompts)
    stats = rate_stats(wl, 200, seed=0)
    cl = Cluster("two", tuple(GPUPool(g, 8, 1) for g in gpus))
    out: dict = {"rate": rate, "gpus": "+".join(gpus), "bound_s": bound, "prompts": prompts}
    plans = {}
    for on in (False, True):
        p = PlanningProblem(stats, models(wl), rates(wl), cl, ROOF, PlanOptions(
            objective="min-cost", length_routing=on,
            latency_bound_s={"chat": bound} if bound else {}))
        t0 = time.perf_counter()
        mx = solve_mixed(p)
        out["solve_s_" + ("length" if on else "weight")] = sig(time.perf_counter() - t0)
        plans[on] = (p, mx)
    p, mx = plans[True]
    rep = mx.stats["length_routing"]
    out.update(weight_usd_h=rep["by_weight_cost_per_hour"],
               length_usd_h=rep["with_length_cost_per_hour"], used=rep["used"])
    if rep["used"]:
        trace = rate_trace(wl, 200, seed=0)
        for on, (q, m) in plans.items():
            _, plan = mixed_plan(q, m)
            tag = "length" if on else "weight"
            out[f"predicted_s_{tag}"] = sig(predict(q.stats, q.models, plan.allocation, ROOF,
                                                    dict(q.targets)).workflows["chat"]
                                            .mean_latency_s)
            out[f"simulated_s_{tag}"] = sig(simulate(trace, models(wl), plan.allocation, ROOF,
                                                     dict(q.targets), requests=2000, seed=1)
                                            .workflows["chat"].mean_latency_s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 req/s, L4 + A10, no bound only")
    args = ap.parse_args()
    grid = ([(16.0, ("L4", "A10"), None, p) for p in PROMPTS] if args.quick else
            list(itertools.product((3.0, 6.0, 10.0, 16.0),
                                   (("L4", "A10"), ("A10", "A100-80GB"), ("L4", "A100-80GB")),
                                   (None, 12.0, 6.0), tuple(PROMPTS))))
    rows = []
    for rate, gpus, bound, prompts in grid:
        progress(f"{rate:g} req/s on {'+'.join(gpus)}, bound {bound}, {prompts} prompts")
        rows.append(row(rate, gpus, bound, prompts))
    cols = ["rate", "gpus", "bound_s", "prompts", "weight_usd_h", "length_usd_h", "used",
            "solve_s_weight", "solve_s_length"]
    print(table(rows, cols))
    taken = [r for r in rows if r["used"]]
    if taken:
        print(table(taken, [*cols[:6], "predicted_s_weight", "predicted_s_length",
                            "simulated_s_weight", "simulated_s_length"]))
    feasible = [r for r in rows if math.isfinite(r["weight_usd_h"])
                or math.isfinite(r["length_usd_h"])]
    print(f"length routing taken in {len(taken)} of {len(feasible)} feasible problems "
          f"({len(rows)} in all)")
    path = write_results("length_routing_quick" if args.quick else "length_routing",
                         {"quick": args.quick, "rows": rows})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
