"""How good is the simulator's saturation rate as a reference? Run length and seed spread.

    python benchmarks/saturation_reference.py [--allocations 0,1,2] [--gpus 4] [--seeds 1,2,3]
                                              [--requests 1600,6400] [--jobs 2]

The predictor's saturation error is measured against ``scepsy_opt.prediction.simulate.saturation_rate``
(benchmarks/predictor_accuracy.py). Its stability test judges queue growth against the arrivals of
one third of a run, so a run must be long next to the requests in flight: beam-search requests
(6-211 steps) stay minutes at saturation. For the same random beam-search allocations as the
accuracy benchmark (same seeds), this script repeats the saturation search over several seeds
and run lengths and prints, per allocation and length, the mean, the 95% confidence interval
(Student t over the seeds) and the predictor's error against the mean. Writes
results/saturation_reference.json.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats as sps

from _common import table, write_results
from predictor_accuracy import allocations, workload
from scepsy_opt.prediction.pipeline import predict
from scepsy_opt.prediction.simulate import saturation_rate
from scepsy_opt.stats import workflow_stats
from scepsy_profile.roofline import roofline_model

WORKFLOW = "beam-search"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run(alloc_index: int, gpus: int, requests: int, sim_seed: int) -> dict:
    spec, trace = workload(WORKFLOW, 0)  # the accuracy benchmark's trace and allocations
    alloc = allocations(spec, gpus, 0, alloc_index + 1)[alloc_index]
    t0 = time.perf_counter()
    sat = saturation_rate(trace, dict(spec.llms), alloc, roofline_model(), {spec.name: 1.0},
                          requests=requests, seed=sim_seed, rel_tol=0.05)
    st = workflow_stats(trace, spec.name, seed=0)
    pred = predict({spec.name: st}, dict(spec.llms), alloc, roofline_model(), {spec.name: 1.0})
    return {"alloc": alloc_index, "gpus": gpus, "requests": requests, "seed": sim_seed,
            "saturation": sat, "predicted": pred.workflows[spec.name].max_throughput,
            "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocations", default="0,1,2")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--requests", default="1600,6400")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    from joblib import Parallel, delayed

    t0 = time.perf_counter()
    jobs = [(a, args.gpus, n, s) for a in _ints(args.allocations) for n in _ints(args.requests)
            for s in _ints(args.seeds)]
    rows = Parallel(n_jobs=args.jobs)(delayed(run)(*j) for j in jobs)
    summary = []
    for a in _ints(args.allocations):
        for n in _ints(args.requests):
            sel = [r for r in rows if r["alloc"] == a and r["requests"] == n]
            x = np.array([r["saturation"] for r in sel])
            mean = float(x.mean())
            half = (float(sps.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
                    if len(x) > 1 else float("nan"))
            pred = sel[0]["predicted"]
            summary.append({"alloc": a, "gpus": args.gpus, "arrivals": n, "seeds": len(x),
                            "saturation_mean": round(mean, 4), "ci95_half": round(half, 4),
                            "min": round(float(x.min()), 4), "max": round(float(x.max()), 4),
                            "predicted": round(pred, 4),
                            "pred_error": f"{100 * (pred / mean - 1):+.1f}%",
                            "s_per_search": round(float(np.mean([r["seconds"] for r in sel])), 1)})
    print(f"Simulated saturation of {WORKFLOW} allocations (req/s): mean and 95% CI over seeds")
    print(table(summary, list(summary[0])))
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    print(f"results: {write_results('saturation_reference', {'rows': rows, 'summary': summary})}")


if __name__ == "__main__":
    main()
