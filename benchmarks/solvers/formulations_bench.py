"""Placeable plans: the three formulations and ``auto`` against the aggregate bound and an oracle.

Every formulation of ``scepsy_place.formulations.FORMULATIONS_REGISTRY`` (``blocks``,
``patterns``, ``aggregate``, ``auto``) on seeded ``scepsy_opt.planning.instances.random_problem``
instances (roofline latency model, targets at about half the cluster's GPUs):

* 5 LLMs / 16 GPUs, 20 / 256 and 100 / 4,096 (A100-80GB nodes of 8 GPUs), and a heterogeneous
  cluster, 10 LLMs on 32 A100-80GB + 32 H100-80GB GPUs (``mix``);
* per instance first the aggregate MILP alone (``scepsy_opt.planning.milp.solve_min_latency``, row
  ``bound``): its optimum bounds every placeable allocation, and each formulation's
  ``agg_gap`` is ``objective / that optimum - 1`` (a placed objective below the MILP's proven
  bound would be a bug);
* per formulation: status, objective, ``agg_gap``, its own proven bound (``bound_s``: the
  aggregate loop's, patterns' column generation bound, none for blocks) and ``own_gap``
  (``objective / bound_s - 1``), wall time, and peak memory: each formulation runs in a forked
  child process and ``peak_mb`` is that child's peak RSS (``getrusage`` ``ru_maxrss``) minus its
  RSS when it started (so it counts the solver's C++ memory too, and nothing a previous
  formulation left behind). The aggregate loop runs up to :data:`LOOP_MAX_GPUS` GPUs
  (placements of seconds each at 4,096 GPUs, many rounds);
* the oracle: on tiny instances (3 LLMs on 3 GPUs of one node, TP 1; 3 LLMs on two nodes of 2
  GPUs, TP 1-2) ``scepsy_place.packing.exhaustive.placeable_optimum`` gives the cheapest placeable
  allocation of the whole candidate grid, and each formulation is counted as ``equal`` to it,
  ``above`` it, or ``unplaced``.

    python benchmarks/solvers/formulations_bench.py            # full run (results/formulations_bench.json)
    python benchmarks/solvers/formulations_bench.py --quick    # 5/16, mix and the oracle, seed 0
    python benchmarks/solvers/formulations_bench.py --sizes 100x4096 --seeds 0 --only blocks,auto

Exit status 1 when a correctness check fails: a placed objective below the aggregate bound or
the exhaustive optimum, a bound above the objective it bounds, a plan claiming a proven gap of 0
over the whole grid that is not the exhaustive optimum, or an instance with a placeable
allocation reported ``infeasible``. A formulation that does not place is reported, not a failure.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import progress, sig, table, write_results  # noqa: E402
from scepsy_opt.cluster import Cluster, GPUPool, uniform_cluster  # noqa: E402
from scepsy_opt.planning.instances import random_problem  # noqa: E402
from scepsy_opt.planning.milp import solve_min_latency  # noqa: E402
from scepsy_opt.planning.problem import PlanOptions  # noqa: E402
from scepsy_place.formulations import FORMULATIONS_REGISTRY, formulation  # noqa: E402
from scepsy_place.formulations.loop import GRID_BOUNDS, PROVEN_GAP, UNPRUNED_MAX_GPUS  # noqa: E402
from scepsy_place.packing.check import violations  # noqa: E402
from scepsy_place.packing.exhaustive import OracleLimit, placeable_optimum  # noqa: E402
from scepsy_place.packing.placement import demands  # noqa: E402
from scepsy_place.packing.topology import from_cluster  # noqa: E402
from scepsy_profile.roofline import roofline_model  # noqa: E402

GPU = "A100-80GB"
REL = 1e-9  # an objective below a bound by more than this (relative) is a bug
LOOP_MAX_GPUS = 256  # the aggregate loop above this: skipped (many seconds-long placements)
NAMES = ("blocks", "patterns", "aggregate", "auto")
FULL_SIZES = ("5x16", "20x256", "100x4096", "mix")
QUICK_SIZES = ("5x16", "mix")
FULL_SEEDS = (0, 1)
QUICK_SEEDS = (0,)
ORACLE_SEEDS = (0, 1, 2, 3)
COLS = ["size", "seed", "formulation", "status", "objective_s", "agg_gap", "bound_s", "own_gap",
        "wall_s", "peak_mb", "exact", "gpus_used", "compared"]
_LATENCY = roofline_model()


def make_problem(size: str, seed: int) -> Any:
    """The instance ``size`` (``LLMSxGPUS`` on A100 nodes of 8, or ``mix``) of ``seed``."""
    if size == "mix":
        cl = Cluster("mix-64", (GPUPool(GPU, 4, 8), GPUPool("H100-80GB", 4, 8)))
        return random_problem(10, 64, _LATENCY, seed=seed, cluster=cl)
    n, _, g = size.partition("x")
    return random_problem(int(n), int(g), _LATENCY, seed=seed, gpu=GPU)


def tiny_problem(kind: str, seed: int) -> Any:
    """The oracle's tiny instances (as in tests/scepsy_place/test_formulations.py)."""
    if kind == "3gpu":
        return random_problem(3, 3, _LATENCY, seed=seed, load=0.6, cluster=uniform_cluster(GPU, 3, 3),
                              options=PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1,)))
    return random_problem(3, 4, _LATENCY, seed=seed, load=0.7, cluster=uniform_cluster(GPU, 4, 2),
                          options=PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1, 2)))


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _child(fn: Callable[[], dict[str, Any]], q: Any) -> None:
    start = _rss_mb()
    try:
        out = fn()
    except Exception as e:  # reported, not raised: the parent carries on
        out = {"status": "error", "error": f"{type(e).__name__}: {e}"}
    # the run's peak RSS, or that of a solve it forked (scepsy_opt.planning.solver.run_killable,
    # whose pages are the run's own until it writes), whichever is higher
    out["peak_mb"] = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                         resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024 - start
    q.put(out)


def isolated(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()`` in a forked child, with its peak RSS growth (``peak_mb``)."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, q))
    p.start()
    out = q.get()
    p.join()
    return out


def write_local_results(name: str, doc: dict[str, Any]) -> Path:
    """``results/<name>.json`` under the working directory, written whole (a temporary file
    renamed into place)."""
    import json

    out = Path("results") / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    tmp.replace(out)
    return out


def _gap(objective: float, bound: float | None) -> float:
    if bound is None or not (math.isfinite(objective) and math.isfinite(bound)) or bound <= 0:
        return math.nan
    return objective / bound - 1.0


def solve_row(name: str, problem: Any, topo: Any) -> dict[str, Any]:
    """One formulation's run (in the child): what the table reports, and its problems."""
    t0 = time.perf_counter()
    res = formulation(name).solve(problem, topo)
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {"status": res.status, "wall_s": wall, "exact": res.exact,
                           "objective_s": res.plan.objective_s if res.placed else math.nan,
                           "bound_s": res.bound_s if res.bound_s is not None else math.nan,
                           "own_gap": res.gap if res.gap is not None else math.nan,
                           "winner": res.formulation, "gpus_used": 0, "problems": [],
                           "compared": " ".join(f"{k}:{o.status}" for k, o in
                                                res.compared.items()),
                           "reason": res.reason}
    if res.placed:
        row["gpus_used"] = res.placement.gpus_used()
        bad = violations(topo, demands(res.plan.allocation, problem.catalog), res.placement)
        if bad:
            row["problems"].append(f"{len(bad)} placement violation(s): {bad[0]}")
        if res.bound_s is not None and res.bound_s > res.plan.objective_s * (1 + REL):
            row["problems"].append(f"bound {res.bound_s:.12g} above the objective")
    return row


def grid_claims_optimal(name: str, row: dict[str, Any], gpus: int) -> bool:
    """Whether the row claims the placeable optimum of the whole candidate grid."""
    scoped = row["winner"] in GRID_BOUNDS or name == "auto" or gpus <= UNPRUNED_MAX_GPUS
    return scoped and row["status"] == "placed" and row["own_gap"] <= PROVEN_GAP


def run_instance(size: str, seed: int, names: Sequence[str]) -> tuple[list[dict[str, Any]],
                                                                      list[str]]:
    problem = make_problem(size, seed)
    topo = from_cluster(problem.cluster, problem.catalog)
    gpus = problem.cluster.total_gpus
    where = f"{size} seed {seed}"
    base = {"size": size, "seed": seed, "gpus": gpus}
    progress(f"{where}: aggregate bound")

    def bound_fn() -> dict[str, Any]:
        t0 = time.perf_counter()
        agg = solve_min_latency(problem)
        return {"status": agg.status, "wall_s": time.perf_counter() - t0,
                "objective_s": agg.objective_s, "bound_s": agg.bound_s}

    b = isolated(bound_fn)
    opt, lb = b.get("objective_s", math.nan), b.get("bound_s", math.nan)
    rows = [{**base, "formulation": "bound", "agg_gap": 0.0, "own_gap": _gap(opt, lb),
             "exact": "-", "gpus_used": 0, "compared": "", **b}]
    problems: list[str] = []
    for name in names:
        if name == "aggregate" and gpus > LOOP_MAX_GPUS:
            rows.append({**base, "formulation": name, "status": "skipped", "objective_s": math.nan,
                         "agg_gap": math.nan, "bound_s": math.nan, "own_gap": math.nan,
                         "wall_s": math.nan, "peak_mb": math.nan, "exact": "-", "gpus_used": 0,
                         "compared": ""})
            continue
        progress(f"{where}: {name}")
        r = isolated(lambda name=name: solve_row(name, problem, topo))
        r.update(base, formulation=name, agg_gap=_gap(r.get("objective_s", math.nan), opt))
        problems += [f"{where} {name}: {p}" for p in r.pop("problems", [])]
        if r["status"] == "error":
            problems.append(f"{where} {name}: {r['error']}")
        if r["status"] == "placed" and r["objective_s"] < lb * (1 - REL):
            problems.append(f"{where} {name}: objective {r['objective_s']:.12g} below the "
                            f"aggregate bound {lb:.12g}")
        rows.append(r)
    return rows, problems


def run_oracle(names: Sequence[str], seeds: Sequence[int]) -> tuple[list[dict[str, Any]],
                                                                    list[str]]:
    """Every formulation against the exhaustive placeable optimum on the tiny instances."""
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for kind in ("3gpu", "2x2"):
        for seed in seeds:
            p = tiny_problem(kind, seed)
            topo = from_cluster(p.cluster)
            where = f"tiny {kind} seed {seed}"
            t0 = time.perf_counter()
            try:
                oracle = placeable_optimum(p, topo)
            except OracleLimit as e:
                rows.append({"instance": where, "formulation": "oracle", "verdict": f"limit: {e}"})
                continue
            best = oracle[0] if oracle is not None else math.nan
            rows.append({"instance": where, "formulation": "oracle", "objective_s": best,
                         "wall_s": time.perf_counter() - t0,
                         "verdict": "placeable" if oracle else "none placeable"})
            for name in names:
                r = solve_row(name, p, topo)
                problems += [f"{where} {name}: {x}" for x in r["problems"]]
                obj = r["objective_s"]
                if r["status"] == "placed":
                    verdict = ("equal" if math.isclose(obj, best, rel_tol=1e-7)
                               else "above" if obj > best else "BELOW")
                else:
                    verdict = "unplaced" if oracle is not None else "none (agrees)"
                if verdict == "BELOW" or (oracle is None and r["status"] == "placed"):
                    problems.append(f"{where} {name}: objective {obj:.12g} below the exhaustive "
                                    f"optimum {best:.12g}")
                if oracle is not None and r["status"] == "infeasible":
                    problems.append(f"{where} {name}: infeasible, yet an allocation places")
                if verdict == "above" and grid_claims_optimal(name, r, p.cluster.total_gpus):
                    problems.append(f"{where} {name}: claims a proven gap of 0 at {obj:.12g}, the "
                                    f"exhaustive optimum is {best:.12g}")
                rows.append({"instance": where, "formulation": name, "objective_s": obj,
                             "wall_s": r["wall_s"], "own_gap": r["own_gap"], "verdict": verdict,
                             "status": r["status"]})
    return rows, problems


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for size, f in dict.fromkeys((r["size"], r["formulation"]) for r in rows):
        rs = [r for r in rows if (r["size"], r["formulation"]) == (size, f)]

        def vals(k: str, rs: list[dict[str, Any]] = rs) -> list[float]:
            return [r[k] for r in rs if isinstance(r.get(k), float) and not math.isnan(r[k])]

        agg, own, wall, mem = vals("agg_gap"), vals("own_gap"), vals("wall_s"), vals("peak_mb")
        out.append({
            "size": size, "formulation": f, "n": len(rs),
            "placed": (f"{sum(r['status'] in ('placed', 'optimal') for r in rs)}/{len(rs)}"),
            "agg_gap_med": statistics.median(agg) if agg else math.nan,
            "agg_gap_max": max(agg) if agg else math.nan,
            "own_gap_med": statistics.median(own) if own else math.nan,
            "wall_s_med": statistics.median(wall) if wall else math.nan,
            "wall_s_max": max(wall) if wall else math.nan,
            "peak_mb_max": max(mem) if mem else math.nan})
    return out


def oracle_counts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for f in dict.fromkeys(r["formulation"] for r in rows if r["formulation"] != "oracle"):
        rs = [r for r in rows if r["formulation"] == f]
        counts = {v: sum(r["verdict"] == v for r in rs)
                  for v in ("equal", "above", "unplaced", "none (agrees)", "BELOW")}
        above = [r["objective_s"] / o["objective_s"] - 1 for r in rs if r["verdict"] == "above"
                 for o in rows if o["formulation"] == "oracle" and o["instance"] == r["instance"]]
        out.append({"formulation": f, "instances": len(rs), **counts,
                    "above_max": max(above) if above else math.nan})
    return out


def _fmt(r: dict[str, Any]) -> dict[str, Any]:
    return {k: (sig(v, 10 if k == "objective_s" else 3) if isinstance(v, float) else v)
            for k, v in r.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5/16, mix and the oracle, seed 0")
    ap.add_argument("--sizes", default=None,
                    help="LLMSxGPUS or mix, comma-separated (default 5x16,20x256,100x4096,mix)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1)")
    ap.add_argument("--only", default=None, help="formulations, comma-separated (default all)")
    ap.add_argument("--no-oracle", action="store_true", help="skip the tiny oracle instances")
    ap.add_argument("--out", default=None, help="results name (default formulations_bench[_quick])")
    args = ap.parse_args(argv)
    sizes = tuple(args.sizes.split(",")) if args.sizes else (QUICK_SIZES if args.quick
                                                             else FULL_SIZES)
    seeds = (tuple(int(s) for s in args.seeds.split(",")) if args.seeds
             else QUICK_SEEDS if args.quick else FULL_SEEDS)
    names = tuple(args.only.split(",")) if args.only else NAMES
    unknown = [n for n in names if n not in FORMULATIONS_REGISTRY]
    if unknown:
        ap.error(f"unknown formulation(s) {unknown}; choose from {sorted(FORMULATIONS_REGISTRY)}")
    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for size in sizes:
        for seed in seeds:
            rs, probs = run_instance(size, seed, names)
            rows += rs
            failures += probs
    oracle_rows: list[dict[str, Any]] = []
    if not args.no_oracle:
        progress("tiny instances against the exhaustive placeable optimum")
        oracle_rows, probs = run_oracle(names, ORACLE_SEEDS)
        failures += probs
    summary = summarise(rows)
    counts = oracle_counts(oracle_rows)

    print("Per instance (objective: weighted latency, s; agg_gap = objective / aggregate MILP "
          "optimum - 1; own_gap = objective / own bound - 1; peak_mb: peak RSS growth of the "
          "formulation's process)")
    print(table([_fmt(r) for r in rows], COLS))
    print()
    print("Summary per size and formulation (over seeds)")
    print(table([_fmt(s) for s in summary],
                ["size", "formulation", "n", "placed", "agg_gap_med", "agg_gap_max",
                 "own_gap_med", "wall_s_med", "wall_s_max", "peak_mb_max"]))
    if counts:
        print()
        print("Against the exhaustive placeable optimum (tiny instances)")
        print(table([_fmt(c) for c in counts],
                    ["formulation", "instances", "equal", "above", "unplaced", "none (agrees)",
                     "BELOW", "above_max"]))
    if failures:
        print()
        print(f"PROBLEMS ({len(failures)}):")
        for f in failures:
            print(f"  {f}")
    path = write_results(args.out or ("formulations_bench_quick" if args.quick
                                      else "formulations_bench"), {
        "args": {"quick": args.quick, "sizes": sizes, "seeds": seeds, "formulations": names,
                 "loop_max_gpus": LOOP_MAX_GPUS},
        "memory": "peak RSS growth of a forked child per formulation (getrusage ru_maxrss "
                  "minus the RSS at its start), MB",
        "instances": rows, "summary": summary, "oracle": oracle_rows, "oracle_counts": counts,
        "failures": failures, "wall_s": time.perf_counter() - t_start})
    print(f"\nwrote {path} ({time.perf_counter() - t_start:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
