"""Placeable plans at scale: the aggregate optimise-place loop against the blocks formulation.

Two ways of handing on a plan that a concrete placement realises (``scepsy_place.loop``):

* **aggregate**: the MILP budgets GPU capacity in aggregate (``scepsy_opt.milp``), the
  ``hierarchical`` placer places its allocation, and when replicas stay unplaced cuts are added
  and the MILP solved again (``plan_and_place(..., formulation="aggregate")``, closed loop);
* **blocks**: the placeable-by-construction MILP of ``scepsy_place.blocks`` (whole-GPU blocks of
  one LLM shape each), placed in one round by the ``blocks`` placer
  (``plan_and_place(..., formulation="blocks")``).

On seeded ``scepsy_opt.instances.random_problem`` instances (A100-80GB nodes of 8 GPUs, roofline
latency model, targets at about half the cluster's GPUs) of 5 LLMs / 16 GPUs, 20 / 256 and
100 / 4096, per instance:

a. ``bound``: the aggregate MILP alone (``milp.solve_min_latency(problem)``): wall time and
   objective. Its objective is a lower bound on every placed plan; each formulation's ``gap`` is
   ``objective / bound - 1`` (a negative gap would be a bug).
b. ``blocks``: total wall time of ``plan_and_place(formulation="blocks")`` (candidates, MILP and
   placement), its MILP time, objective, gap, whether it placed, GPUs used, and the placement
   step timed alone: ``place(topo, demands(allocation), "blocks")`` (``place_s``).
c. ``aggregate``: up to 256 GPUs the closed loop ``plan_and_place(formulation="aggregate",
   max_rounds=25)``: wall time, rounds, objective, gap, placed, exact; ``place_s`` is one
   ``hierarchical`` placement of the bound's allocation timed alone. At 4,096 GPUs a loop round
   costs ~12 s of placement and takes many rounds, so there (``aggregate-1``) only ONE
   hierarchical placement of the aggregate MILP's allocation is timed, with the replicas that
   stay unplaced (``placed`` no when any do).

Then a summary per size and formulation (median / max wall time, median placement time, median /
max gap, instances placed) and the process's peak RSS (``getrusage`` ``ru_maxrss``, all sizes).

Time targets (reported, not enforced): placement of a 4,096-GPU plan <= 5 s (the blocks
placement, ``place_s``, at 100 / 4096), and plan with placement for 100 LLMs / 4,096 GPUs
<= 20 s (the blocks formulation's ``wall_s``).

    python solvers/formulations_bench.py            # full run, several minutes (results/formulations_bench.json)
    python solvers/formulations_bench.py --quick    # 5/16 and 20/256, seed 0 (results/formulations_bench_quick.json)
    python solvers/formulations_bench.py --sizes 100x4096 --seeds 0   # one large instance

Exit status 1 when a correctness check fails (a placed objective below the aggregate bound, a
blocks plan that does not place, a separately timed blocks placement that differs from the
loop's); an aggregate loop that does not place is reported, not a failure.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "benchmarks"))

from _common import peak_rss_mb, progress, sig, table, write_results  # noqa: E402
from scepsy_opt.instances import random_problem  # noqa: E402
from scepsy_opt.milp import solve_min_latency  # noqa: E402
from scepsy_place.loop import plan_and_place  # noqa: E402
from scepsy_place.placement import demands, place  # noqa: E402
from scepsy_place.topology import from_cluster  # noqa: E402
from scepsy_profile.roofline import roofline_model  # noqa: E402

GPU = "A100-80GB"
REL = 1e-9  # an objective below the bound by more than this (relative) is a bug
MAX_ROUNDS = 25
LOOP_MAX_GPUS = 256  # above this, the aggregate loop is replaced by one timed placement
FULL_SIZES = ((5, 16), (20, 256), (100, 4096))
QUICK_SIZES = ((5, 16), (20, 256))
FULL_SEEDS = (0, 1, 2)
QUICK_SEEDS = (0,)
TARGET_PLACE_S = {(100, 4096): 5.0}  # placement of a 4,096-GPU plan (blocks placer)
TARGET_TOTAL_S = {(100, 4096): 20.0}  # plan with placement (blocks formulation)
COLS = ["size", "seed", "formulation", "wall_s", "milp_s", "place_s", "rounds", "objective_s",
        "gap", "placed", "unplaced", "gpus_used", "exact", "kept", "status"]





def _gap(objective: float, bound: float) -> float:
    if not (math.isfinite(objective) and math.isfinite(bound)) or bound <= 0:
        return math.nan
    return objective / bound - 1.0


def _row(n: int, g: int, seed: int, formulation: str, **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"size": f"{n}/{g}", "llms": n, "gpus": g, "seed": seed,
                           "formulation": formulation, "wall_s": math.nan, "milp_s": math.nan,
                           "place_s": math.nan, "rounds": 0, "objective_s": math.nan,
                           "gap": math.nan, "placed": "-", "unplaced": 0, "gpus_used": 0,
                           "exact": "-", "kept": 0, "status": "-"}
    row.update(kw)
    return row


def _timed_place(topo: Any, problem: Any, allocation: Any, policy: str) -> tuple[float, Any]:
    t0 = time.perf_counter()
    placement = place(topo, demands(allocation, problem.catalog), policy)
    return time.perf_counter() - t0, placement


def run_instance(n: int, g: int, seed: int, latency: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows (bound, blocks, aggregate) of one instance and what is wrong with them."""
    problem = random_problem(n, g, latency, seed=seed, gpu=GPU)
    topo = from_cluster(problem.cluster, problem.catalog)
    where = f"{n}/{g} seed {seed}"
    problems: list[str] = []
    rows = []

    # a. the aggregate MILP alone: the lower bound
    t0 = time.perf_counter()
    agg = solve_min_latency(problem)
    t1 = time.perf_counter()
    bound = agg.objective_s
    rows.append(_row(n, g, seed, "bound", wall_s=t1 - t0, milp_s=agg.stats.get("total_s", math.nan),
                     objective_s=bound, gap=0.0 if math.isfinite(bound) else math.nan,
                     kept=agg.stats.get("candidates_kept", 0), status=agg.status))
    if not agg.feasible:
        problems.append(f"{where}: the aggregate MILP has no plan ({agg.status})")

    # b. blocks: one round, placeable by construction
    progress(f"  {where}: blocks")
    t0 = time.perf_counter()
    res = plan_and_place(problem, topo, formulation="blocks", max_rounds=MAX_ROUNDS)
    t1 = time.perf_counter()
    row = _row(n, g, seed, "blocks", wall_s=t1 - t0, milp_s=res.plan.stats.get("total_s", math.nan),
               rounds=res.rounds, objective_s=res.plan.objective_s,
               gap=_gap(res.plan.objective_s, bound), placed="yes" if res.placed else "NO",
               exact="yes" if res.exact else "no", kept=res.plan.stats.get("candidates_kept", 0),
               status=res.plan.status)
    if res.placement is not None:
        row.update(unplaced=len(res.placement.unplaced), gpus_used=res.placement.gpus_used())
    if res.plan.allocation is not None:
        place_s, alone = _timed_place(topo, problem, res.plan.allocation, "blocks")
        row["place_s"] = place_s
        if res.placement is not None and (alone.complete != res.placement.complete
                                          or alone.gpus_used() != res.placement.gpus_used()):
            problems.append(f"{where}: the blocks placement timed alone differs from the loop's "
                            f"({alone.gpus_used()} vs {res.placement.gpus_used()} GPUs)")
    if not res.placed:
        problems.append(f"{where}: blocks did not place ({res.reason})")
    if math.isfinite(bound) and res.plan.objective_s < bound * (1 - REL):
        problems.append(f"{where}: blocks objective {res.plan.objective_s:.12g} below the aggregate "
                        f"bound {bound:.12g}")
    rows.append(row)

    # c. aggregate: the closed loop up to LOOP_MAX_GPUS, one hierarchical placement above
    if g <= LOOP_MAX_GPUS:
        progress(f"  {where}: aggregate loop")
        t0 = time.perf_counter()
        loop = plan_and_place(problem, topo, formulation="aggregate", max_rounds=MAX_ROUNDS)
        t1 = time.perf_counter()
        row = _row(n, g, seed, "aggregate", wall_s=t1 - t0,
                   milp_s=loop.plan.stats.get("total_s", math.nan), rounds=loop.rounds,
                   objective_s=loop.plan.objective_s, gap=_gap(loop.plan.objective_s, bound),
                   placed="yes" if loop.placed else "NO", exact="yes" if loop.exact else "no",
                   kept=loop.plan.stats.get("candidates_kept", 0), status=loop.plan.status,
                   first_unplaced=loop.history[0]["unplaced"] if loop.history else 0)
        if loop.placement is not None:
            row.update(unplaced=len(loop.placement.unplaced), gpus_used=loop.placement.gpus_used())
        if agg.allocation is not None:
            row["place_s"], _ = _timed_place(topo, problem, agg.allocation, "hierarchical")
        if loop.placed and math.isfinite(bound) and loop.plan.objective_s < bound * (1 - REL):
            problems.append(f"{where}: aggregate objective {loop.plan.objective_s:.12g} below the "
                            f"bound {bound:.12g}")
        rows.append(row)
    elif agg.allocation is not None:
        progress(f"  {where}: one hierarchical placement of the aggregate allocation")
        place_s, placement = _timed_place(topo, problem, agg.allocation, "hierarchical")
        rows.append(_row(n, g, seed, "aggregate-1", wall_s=(rows[0]["wall_s"] + place_s),
                         milp_s=rows[0]["milp_s"], place_s=place_s, rounds=1, objective_s=bound,
                         gap=0.0, placed="yes" if placement.complete else "NO",
                         unplaced=len(placement.unplaced), gpus_used=placement.gpus_used(),
                         exact="-", kept=rows[0]["kept"], status=agg.status,
                         first_unplaced=len(placement.unplaced),
                         replicas=len(placement.slots) + len(placement.unplaced)))
    return rows, problems


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    keys = dict.fromkeys((r["llms"], r["gpus"], r["formulation"]) for r in rows)
    for n, g, f in keys:
        rs = [r for r in rows if (r["llms"], r["gpus"], r["formulation"]) == (n, g, f)]
        gaps = [r["gap"] for r in rs if not math.isnan(r["gap"])]
        place = [r["place_s"] for r in rs if not math.isnan(r["place_s"])]
        s: dict[str, Any] = {
            "size": f"{n}/{g}", "formulation": f, "n": len(rs),
            "wall_s_med": statistics.median(r["wall_s"] for r in rs),
            "wall_s_max": max(r["wall_s"] for r in rs),
            "place_s_med": statistics.median(place) if place else math.nan,
            "rounds_med": statistics.median(r["rounds"] for r in rs),
            "gap_med": statistics.median(gaps) if gaps else math.nan,
            "gap_max": max(gaps) if gaps else math.nan,
            "placed": f"{sum(r['placed'] == 'yes' for r in rs)}/{len(rs)}" if f != "bound" else "-",
            "unplaced_med": statistics.median(r["unplaced"] for r in rs),
        }
        meets = []
        if f == "blocks" and (n, g) in TARGET_PLACE_S:
            meets.append(f"place<={TARGET_PLACE_S[(n, g)]:g}s:"
                         + ("yes" if s["place_s_med"] <= TARGET_PLACE_S[(n, g)] else "NO"))
        if f == "blocks" and (n, g) in TARGET_TOTAL_S:
            meets.append(f"total<={TARGET_TOTAL_S[(n, g)]:g}s:"
                         + ("yes" if s["wall_s_med"] <= TARGET_TOTAL_S[(n, g)] else "NO"))
        s["targets"] = " ".join(meets) or "-"
        out.append(s)
    return out


def _parse_sizes(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in text.split(","):
        n, _, g = part.partition("x")
        out.append((int(n), int(g)))
    return tuple(out)


def _parse_seeds(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(","))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5/16 and 20/256, seed 0 only")
    ap.add_argument("--sizes", type=_parse_sizes, default=None,
                    help="LLMSxGPUS,... (default 5x16,20x256,100x4096; quick 5x16,20x256)")
    ap.add_argument("--seeds", type=_parse_seeds, default=None,
                    help="comma-separated problem seeds (default 0,1,2; quick 0)")
    ap.add_argument("--out", default=None, help="results name (default formulations_bench[_quick])")
    args = ap.parse_args(argv)
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    seeds = args.seeds or (QUICK_SEEDS if args.quick else FULL_SEEDS)
    latency = roofline_model()
    t_start = time.perf_counter()

    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for n, g in sizes:
        for seed in seeds:
            progress(f"{n} LLMs / {g} GPUs, seed {seed}")
            rs, probs = run_instance(n, g, seed, latency)
            rows += rs
            failures += probs
    peak_mb = peak_rss_mb()
    summary = summarise(rows)
    notes = [f"{r['size']} seed {r['seed']}: the aggregate loop did not place after {r['rounds']} "
             f"round(s) ({r['unplaced']} replica(s) unplaced)"
             for r in rows if r["formulation"] == "aggregate" and r["placed"] != "yes"]
    notes += [f"{r['size']} seed {r['seed']}: one hierarchical placement of the aggregate "
              f"allocation leaves {r['unplaced']} of {r['replicas']} replica(s) unplaced"
              for r in rows if r["formulation"] == "aggregate-1" and r["unplaced"]]

    print("Per instance (seconds; objective = weighted latency, s; gap = objective / bound - 1)")
    print(table([{k: (sig(v, 12 if k == "objective_s" else 3) if isinstance(v, float) else v)
                  for k, v in r.items()} for r in rows], COLS))
    print()
    print("Summary per size and formulation (medians / max over seeds)")
    print(table([{k: (sig(v) if isinstance(v, float) else v) for k, v in s.items()} for s in summary],
                ["size", "formulation", "n", "wall_s_med", "wall_s_max", "place_s_med", "rounds_med",
                 "gap_med", "gap_max", "placed", "unplaced_med", "targets"]))
    print(f"peak RSS of the process (all sizes, largest {sizes[-1][0]}/{sizes[-1][1]}): {peak_mb:.0f} MB")
    if notes:
        print()
        print(f"NOTES ({len(notes)}):")
        for s in notes:
            print(f"  {s}")
    if failures:
        print()
        print(f"PROBLEMS ({len(failures)}):")
        for f in failures:
            print(f"  {f}")
    path = write_results(args.out or ("formulations_bench_quick" if args.quick else "formulations_bench"), {
        "args": {"quick": args.quick, "sizes": sizes, "seeds": seeds, "max_rounds": MAX_ROUNDS,
                 "loop_max_gpus": LOOP_MAX_GPUS},
        "gpu": GPU,
        "targets": {"place_s": {f"{n}/{g}": t for (n, g), t in TARGET_PLACE_S.items()},
                    "total_s": {f"{n}/{g}": t for (n, g), t in TARGET_TOTAL_S.items()}},
        "instances": rows, "summary": summary, "peak_rss_mb": peak_mb, "notes": notes,
        "failures": failures, "wall_s": time.perf_counter() - t_start})
    print(f"\nwrote {path} ({time.perf_counter() - t_start:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
