"""Does the time limit bound the whole plan? Wall time and status per time limit.

On seeded ``scepsy_opt.planning.instances.random_problem`` instances (A100-80GB, roofline latency model,
targets at half the cluster), each time limit ``PlanOptions.time_limit_s`` is run through the
optimiser as ``scepsy plan`` calls it (``MILPOptimiser().solve``: candidates, reduced-cost
fixing from 64 GPUs, HiGHS) and, with ``--place``, through ``plan_and_place`` (formulation
``auto``). Per run: the wall time, how far it overran the limit, the status
(``time_limit_no_solution`` when the time ran out before any allocation, ``time_limit`` with its
gap, ``optimal``) and the objective.

    python benchmarks/solvers/time_limit_bench.py                       # 5/16, 20/256, 100/4096 GPUs
    python benchmarks/solvers/time_limit_bench.py --sizes 100x4096 --limits 0.001,0.05

Writes results/time_limit_bench.json. Exit status 1 when a run overran its limit by more than
``--slack`` seconds (default 1 s: one batch of curves or one placement round is not cut).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _common import progress, sig, table, write_results  # noqa: E402
from scepsy_opt.planning.instances import random_problem  # noqa: E402
from scepsy_opt.planning.milp import MILPOptimiser  # noqa: E402
from scepsy_place.formulations.loop import plan_and_place  # noqa: E402
from scepsy_place.packing.topology import from_cluster  # noqa: E402
from scepsy_profile.roofline import roofline_model  # noqa: E402

SIZES = ((5, 16), (20, 256), (100, 4096))
LIMITS = (1e-6, 0.001, 0.05, 1.0, 60.0)


def run(n: int, gpus: int, limit: float, place: bool, seed: int = 0) -> dict[str, Any]:
    base = random_problem(n, gpus, roofline_model(), seed=seed)
    problem = replace(base, options=replace(base.options, time_limit_s=limit))
    t0 = time.perf_counter()
    if place:
        res = plan_and_place(problem, from_cluster(problem.cluster), formulation="auto")
        plan = res.plan
    else:
        plan = MILPOptimiser().solve(problem)
    wall = time.perf_counter() - t0
    return {"llms": n, "gpus": gpus, "seed": seed, "path": "plan_and_place" if place else "solve",
            "time_limit_s": limit, "wall_s": sig(wall), "over_s": sig(max(0.0, wall - limit)),
            "status": plan.status, "objective_s": sig(plan.objective_s, 8), "gap": sig(plan.gap)}


def _sizes(text: str) -> tuple[tuple[int, int], ...]:
    return tuple(tuple(int(x) for x in s.split("x")) for s in text.split(","))  # type: ignore[misc]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=_sizes, default=SIZES, help="LLMSxGPUS,... (default 5x16,20x256,100x4096)")
    ap.add_argument("--limits", default=",".join(f"{x:g}" for x in LIMITS),
                    help="comma-separated time limits, s")
    ap.add_argument("--place", action="store_true", help="also run plan_and_place (auto)")
    ap.add_argument("--slack", type=float, default=1.0, help="allowed overrun, s")
    ap.add_argument("--out", default="time_limit_bench")
    args = ap.parse_args(argv)
    limits = [float(x) for x in args.limits.split(",")]
    rows = []
    for n, gpus in args.sizes:
        for place in (False, True) if args.place else (False,):
            for limit in limits:
                progress(f"{n} LLMs / {gpus} GPUs, limit {limit:g} s, "
                         f"{'plan_and_place' if place else 'solve'}")
                rows.append(run(n, gpus, limit, place))
    print(table(rows, ["llms", "gpus", "path", "time_limit_s", "wall_s", "over_s", "status",
                       "objective_s", "gap"]))
    bad = [r for r in rows if r["over_s"] > args.slack]
    path = write_results(args.out, {"rows": rows, "slack_s": args.slack, "overran": len(bad)})
    print(f"wrote {path}; {len(bad)} run(s) overran their limit by more than {args.slack:g} s")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
