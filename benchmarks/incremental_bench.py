"""Re-planning a running placement after a node failure: time and replicas moved.

On seeded ``scepsy_opt.planning.instances.random_problem`` instances (A100-80GB nodes, roofline
latency model), a plan is made and placed (``plan_and_place``, formulation ``auto``); then the
node running the most replicas fails and ``scepsy_place.formulations.incremental.replan`` re-plans (change
penalty 1 s, move cost 1 s). Per run: the wall time of the re-plan (the optimiser's re-plan
included), replicas lost, kept, moved, started and stopped, whether the number moved is proven
the fewest, and the objective before and after.

    python benchmarks/incremental_bench.py            # 5 LLMs / 16 GPUs (4-GPU nodes) and
                                                      # 20 / 256 (8-GPU nodes), seeds 0-2
    python benchmarks/incremental_bench.py --quick    # 5 / 16, seed 0

Writes results/incremental_bench.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import progress, sig, write_results
from scepsy_opt.planning.instances import random_problem
from scepsy_place.formulations.incremental import NodeFailed, replan
from scepsy_place.formulations.loop import plan_and_place
from scepsy_place.packing.topology import from_cluster
from scepsy_profile.roofline import roofline_model

# LLMs, GPUs, GPUs per node, load (room for the lost node: a quarter of 16 GPUs, 1/32 of 256)
SIZES = ((5, 16, 4, 0.4), (20, 256, 8, 0.5))


def run(llms: int, gpus: int, per_node: int, load: float, seed: int) -> dict:
    problem = random_problem(llms, gpus, roofline_model(), seed=seed, load=load,
                             gpus_per_node=per_node)
    topology = from_cluster(problem.cluster)
    t0 = time.perf_counter()
    res = plan_and_place(problem, topology)
    plan_s = time.perf_counter() - t0
    if not res.placed:
        return {"llms": llms, "gpus": gpus, "seed": seed, "status": f"first plan {res.status}"}
    on: dict[str, int] = {}
    for s in res.placement.slots:
        on[s.node] = on.get(s.node, 0) + 1
    busiest = max(sorted(on), key=lambda n: on[n])
    t0 = time.perf_counter()
    r = replan(problem, topology, res, NodeFailed(busiest), move_cost_s=1.0,
               change_penalty_s=1.0)
    replan_s = time.perf_counter() - t0
    return {"llms": llms, "gpus": gpus, "gpus_per_node": per_node, "seed": seed,
            "failed": busiest,
            "replicas": len(res.placement.slots), "plan_s": sig(plan_s),
            "replan_s": sig(replan_s), "status": r.status, "lost": len(r.lost),
            "kept": len(r.kept), "moved": len(r.moved), "started": len(r.started),
            "stopped": len(r.stopped), "moves_minimal": r.moves_minimal,
            "allocations_tried": r.allocations, "objective_before_s": sig(res.plan.objective_s),
            "objective_after_s": sig(r.objective_s) if r.objective_s is not None else None,
            "gpus_used": r.gpus_used}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 LLMs / 16 GPUs, seed 0 only")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--gpus", default="16,256", help="comma-separated sizes of SIZES to run")
    args = ap.parse_args()
    want = {int(x) for x in args.gpus.split(",")}
    sizes = SIZES[:1] if args.quick else [s for s in SIZES if s[1] in want]
    seeds = range(1 if args.quick else args.seeds)
    rows = []
    for llms, gpus, per_node, load in sizes:
        for seed in seeds:
            progress(f"{llms} LLMs / {gpus} GPUs, seed {seed}")
            rows.append(run(llms, gpus, per_node, load, seed))
            print(rows[-1], flush=True)
    path = write_results("incremental_bench", {"runs": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
