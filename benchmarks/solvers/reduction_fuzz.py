"""Is reduced-cost fixing exact? The MILP over the reduced candidates against the unreduced MILP.

Each instance (:func:`instance`, seeded by its index) is a ``random_problem`` of 1-6 LLMs on a
cluster of 1-3 pools (A100-80GB or H100-80GB, 1-3 nodes of 1, 2, 4 or 8 GPUs: one or two
GPU types, tiny clusters of one GPU included) at a load of 0.1-1.2 of the cluster. Both
formulations are checked:

* ``aggregate``: ``solve_min_latency`` over ``milp.reduced_candidates`` (forced, whatever the
  size) against the MILP over every candidate (``generate_candidates``);
* ``blocks``: ``reduced_candidates(blocks=True, rows=capacity_rows)`` against every block
  candidate, both with the block capacity rows.

``--memory independent`` plans memory as a second resource (``PlanOptions.memory_shares`` =
tenths): candidates carry a memory share of their own, the MILPs have two budget rows per GPU
type and the reduction two prices (compute and memory); ``--memory both`` runs each instance
both ways.

They agree when both are infeasible, or both optimal with objectives within 1e-9 relative. Also
counted: candidates kept by the reduction (share of the unreduced set), how often it keeps
every candidate (no feasible allocation known, or the fallback), and the reduced set holding
only real candidates of the unreduced one (same shape and replica count).

    python benchmarks/solvers/reduction_fuzz.py                  # 400 instances (results/reduction_fuzz.json)
    python benchmarks/solvers/reduction_fuzz.py --start 400 --count 50 --out reduction_fuzz_b
    python benchmarks/solvers/reduction_fuzz.py --count 100 --memory independent --out reduction_fuzz_mem

Exit status 1 on any disagreement.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _common import progress, sig, table, write_results  # noqa: E402
from scepsy_opt.cluster import Cluster, GPUPool  # noqa: E402
from scepsy_opt.planning.candidates import Candidate, CandidateSet, generate_candidates  # noqa: E402
from scepsy_opt.planning.instances import random_problem  # noqa: E402
from scepsy_opt.planning.milp import reduced_candidates, solve_min_latency  # noqa: E402
from scepsy_opt.planning.problem import TENTHS, PlanningProblem, PlanOptions  # noqa: E402
from scepsy_place.formulations.blocks import capacity_rows  # noqa: E402
from scepsy_place.packing.topology import from_cluster  # noqa: E402
from scepsy_profile.roofline import roofline_model  # noqa: E402

REL = 1e-9  # objectives agree within this relative difference
GPUS = ("A100-80GB", "H100-80GB")
LOADS = (0.1, 0.3, 0.5, 0.7, 0.9, 1.2)
LATENCY = roofline_model()


MEMORY_MODES = ("tied", "independent")


def with_memory(problem: PlanningProblem, memory: str) -> PlanningProblem:
    """``problem`` with memory tied to the share or planned on the tenths grid."""
    if memory == "tied":
        return problem
    return dataclasses.replace(problem, options=dataclasses.replace(problem.options,
                                                                    memory_shares=TENTHS))


def instance(i: int) -> PlanningProblem:
    """Fuzz instance ``i``: same index, same problem."""
    rng = np.random.default_rng([20_261_201, i])
    pools = tuple(GPUPool(GPUS[int(rng.integers(2))], int(rng.integers(1, 4)),
                          int(rng.choice([1, 2, 2, 4, 8])))
                  for _ in range(int(rng.integers(1, 4))))
    cluster = Cluster(f"fuzz{i}", pools)
    n = int(rng.integers(1, 7))
    return random_problem(n, cluster.total_gpus, LATENCY, seed=int(rng.integers(10**6)),
                          workflows=int(rng.integers(1, 3)), load=float(rng.choice(LOADS)),
                          cluster=cluster, options=PlanOptions(reduce=True))


def _keys(cands: Mapping[str, Sequence[Candidate]]) -> set[tuple[Any, ...]]:
    return {(m, c.gpu, c.tp, c.share, c.replicas, c.memory_share)
            for m, cs in cands.items() for c in cs}


def agree(a: float, b: float) -> bool:
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b
    return abs(a - b) <= REL * max(abs(a), abs(b), 1.0)


def compare(problem: PlanningProblem, blocks: bool) -> dict[str, Any]:
    """Reduced against unreduced on one formulation (module docstring)."""
    topology = from_cluster(problem.cluster)
    full = generate_candidates(problem, blocks=blocks)
    t0 = time.perf_counter()
    if blocks:
        red = reduced_candidates(problem, blocks=True, rows=lambda cs: capacity_rows(topology, cs))
    else:
        red = reduced_candidates(problem)
    reduce_s = time.perf_counter() - t0

    def solve(cs: CandidateSet) -> Any:
        return solve_min_latency(problem, cs, capacity_rows(topology, cs.by_llm) if blocks else None)

    a, b = solve(full), solve(red)
    ok = a.status == b.status and (a.status != "optimal" or agree(a.objective_s, b.objective_s))
    return {"formulation": "blocks" if blocks else "aggregate", "status": a.status,
            "reduced_status": b.status, "objective_s": a.objective_s,
            "reduced_objective_s": b.objective_s, "agree": ok,
            "kept": red.kept, "unreduced": full.kept, "everything": red.kept >= full.kept,
            "subset": _keys(red.by_llm) <= _keys(full.by_llm), "reduce_s": reduce_s}


def run(start: int, count: int, memory: Sequence[str] = ("tied",)) -> list[dict[str, Any]]:
    rows = []
    for i in range(start, start + count):
        if i % 50 == 0:
            progress(f"instance {i}/{start + count}")
        base = instance(i)
        for mode in memory:
            p = with_memory(base, mode)
            for blocks in (False, True):
                rows.append({"instance": i, "memory": mode, "llms": len(p.llms),
                             "gpus": p.cluster.total_gpus, "types": len(p.cluster.budgets()),
                             **compare(p, blocks)})
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for mode, form in [(m, f) for m in MEMORY_MODES for f in ("aggregate", "blocks")]:
        mine = [r for r in rows if r["formulation"] == form and r.get("memory", "tied") == mode]
        if not mine:
            continue
        opt = [r for r in mine if r["status"] == "optimal"]
        share = [r["kept"] / r["unreduced"] for r in mine if r["unreduced"]]
        out.append({"memory": mode, "formulation": form, "instances": len(mine),
                    "optimal": len(opt),
                    "infeasible": sum(r["status"] == "infeasible" for r in mine),
                    "disagree": sum(not r["agree"] for r in mine),
                    "not_subset": sum(not r["subset"] for r in mine),
                    "kept_everything": sum(r["everything"] for r in mine),
                    "kept_share_median": sig(float(np.median(share))) if share else math.nan,
                    "max_rel_diff": sig(max((abs(r["objective_s"] - r["reduced_objective_s"])
                                             / max(abs(r["objective_s"]), 1.0) for r in opt),
                                            default=0.0)),
                    "reduce_s_max": sig(max((r["reduce_s"] for r in mine), default=0.0))})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=400, help="instances (default %(default)s)")
    ap.add_argument("--start", type=int, default=0, help="first instance index (default 0)")
    ap.add_argument("--out", default="reduction_fuzz", help="results name")
    ap.add_argument("--memory", choices=(*MEMORY_MODES, "both"), default="tied",
                    help="memory tied to the share, planned as a second resource, or both "
                         "(default %(default)s)")
    args = ap.parse_args(argv)
    modes = MEMORY_MODES if args.memory == "both" else (args.memory,)
    rows = run(args.start, args.count, modes)
    summ = summary(rows)
    print(table(summ, list(summ[0])))
    bad = [r for r in rows if not r["agree"] or not r["subset"]]
    for r in bad[:20]:
        print("DISAGREE", r)
    path = write_results(args.out, {"start": args.start, "count": args.count,
                                    "memory": list(modes), "summary": summ,
                                    "rows": rows,
                                    "failures": len(bad)})
    print(f"wrote {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
