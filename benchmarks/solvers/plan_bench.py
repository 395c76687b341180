"""How fast and how exact is the allocation optimiser? Scaling, solver comparison, oracle suite.

Three parts, all on seeded ``scepsy_opt.planning.instances.random_problem`` instances (A100-80GB, roofline
latency model, targets at about half the cluster's GPUs):

a. **Scaling** of the MILP pipeline as ``scepsy plan`` runs it (``MILPOptimiser``: candidates
   with reduced-cost fixing from 64 GPUs → ``milp._knapsack`` → in-process HiGHS; each plan is
   checked against the MILP over the full candidate set) at (5 LLMs, 16 GPUs), (20, 256) and
   (100, 4096): median and max of each phase, candidates before/after dominance pruning, HiGHS
   status and gap, and the process's peak RSS. Targets (issue): median total ≤ 0.1 s / 1 s /
   10 s, gap 0, memory ≤ 2 GB.
b. **Solvers** on the same (full, unreduced) candidate sets: HiGHS as the pipeline runs it
   (presolve off), and on one PuLP model built by ``milp._knapsack``: HiGHS with its presolve on
   (``pre``) and CBC
   (``pulp.PULP_CBC_CMD``, one thread); and the exact dynamic program of ``benchmarks/solvers/dp.py``. Time and objective; the objectives must agree (relative 1e-9).
c. **Oracle suite**: many small instances (≤ 4 LLMs, ≤ 8 GPUs, loads 0.25-1.25): MILP vs the
   ``brute-force`` optimiser on the pruned and on all candidates, and the DP (all must agree on
   every instance), and the MILP against the
   ``heuristic``, ``independent`` and ``equal-split`` baselines: how often the MILP is strictly
   better, by how much, and how often a baseline finds no plan where the MILP does. Baseline
   plans are re-checked: within the budget, and objective equal to a re-pricing of the
   allocation (``planning.price``).

    python benchmarks/solvers/plan_bench.py            # full run (several minutes; results/plan_bench.json)
    python benchmarks/solvers/plan_bench.py --quick    # smoke run, under a minute (results/plan_bench_quick.json)

Exit status 1 when a correctness check fails (solver or oracle disagreement, invalid baseline
plan); timing targets are reported, not enforced.
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
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import pulp  # noqa: E402

from _common import peak_rss_mb, progress, sig, table, write_results  # noqa: E402
from dp import solve_problem  # noqa: E402
from scepsy_common.errors import InputError  # noqa: E402
from scepsy_common.units import UNITS  # noqa: E402
from scepsy_opt.planning import milp  # noqa: E402
from scepsy_opt.planning.candidates import CandidateSet, fits_budget, generate_candidates, price  # noqa: E402
from scepsy_opt.planning.instances import random_problem  # noqa: E402
from scepsy_opt.planning.plans import Plan  # noqa: E402
from scepsy_opt.planning.problem import PlanningProblem  # noqa: E402
from scepsy_profile.roofline import roofline_model  # noqa: E402

GPU = "A100-80GB"
REL = 1e-9  # objectives agree when within this relative difference
GAP_ZERO = 1e-9  # HiGHS's gap (objective - bound) / objective is "0" up to float rounding
TARGET_TOTAL_S = {(5, 16): 0.1, (20, 256): 1.0, (100, 4096): 10.0}
TARGET_MEMORY_MB = 2048.0
FULL_SIZES = ((5, 16, 5), (20, 256, 5), (100, 4096, 3))
QUICK_SIZES = ((5, 16, 3), (20, 256, 1))
BASELINES = ("heuristic", "independent", "equal-split")
LOADS = (0.25, 0.5, 0.75, 1.0, 1.25)
UNPRUNED = "brute-force/unpruned"



def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), 1e-300)




# --------------------------------------------------------------------------- a. scaling

def run_instance(n: int, gpus: int, seed: int, latency: Any) -> tuple[dict[str, Any], PlanningProblem,
                                                                       CandidateSet, Plan]:
    t0 = time.perf_counter()
    problem = random_problem(n, gpus, latency, seed=seed, gpu=GPU)
    t1 = time.perf_counter()
    # the production path: candidates (with reduced-cost fixing from 64 GPUs), build, solve
    plan = milp.MILPOptimiser().solve(problem)
    t2 = time.perf_counter()
    st = plan.stats
    used = sum(c.units for c in plan.candidates.values()) if plan.feasible else 0
    row = {"llms": n, "gpus": gpus, "seed": seed, "setup_s": t1 - t0,
           "candidates_s": st.get("candidates_s", math.nan),
           "build_s": st.get("build_s", math.nan), "solve_s": st.get("solve_s", math.nan),
           "generated": st.get("candidates_generated", 0), "kept": st.get("candidates_kept", 0),
           "curves": st.get("serving_curves", 0),
           "status": plan.status, "gap": plan.gap, "objective_s": plan.objective_s,
           "gpu_use": used / (gpus * UNITS), "wall_s": t2 - t1}
    row["total_s"] = row["candidates_s"] + row["build_s"] + row["solve_s"]
    # the full (unreduced) candidate set, for the solver comparison (part b)
    cset = generate_candidates(problem)
    full = milp.solve_min_latency(problem, cset)
    if not (full.feasible == plan.feasible and (not plan.feasible or
                                                 _rel(full.objective_s, plan.objective_s) <= REL)):
        row["status"] += "+differs_from_full"
    return row, problem, cset, full


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for key in dict.fromkeys((r["llms"], r["gpus"]) for r in rows):
        rs = [r for r in rows if (r["llms"], r["gpus"]) == key]
        s: dict[str, Any] = {"size": f"{key[0]}/{key[1]}", "n": len(rs)}
        for f in ("candidates_s", "build_s", "solve_s", "total_s"):
            v = [r[f] for r in rs]
            s[f"{f}_med"] = statistics.median(v)
            s[f"{f}_max"] = max(v)
        s["generated_med"] = statistics.median(r["generated"] for r in rs)
        s["kept_med"] = statistics.median(r["kept"] for r in rs)
        s["status"] = ",".join(sorted({r["status"] for r in rs}))
        s["gap_max"] = max(r["gap"] for r in rs)
        s["gpu_use_med"] = statistics.median(r["gpu_use"] for r in rs)
        target = TARGET_TOTAL_S.get(key)
        s["target_s"] = target if target is not None else math.nan
        s["meets"] = ("-" if target is None else
                      "yes" if s["total_s_med"] <= target and s["gap_max"] <= GAP_ZERO else "NO")
        out.append(s)
    return out


# --------------------------------------------------------------------------- b. solvers

def compare_solvers(problem: PlanningProblem, cset: CandidateSet, plan: Plan, *, cbc: bool,
                    cbc_limit_s: float) -> dict[str, Any]:
    """HiGHS (the pipeline's own solve, presolve off), HiGHS with presolve and CBC on one PuLP model built by
    ``milp._knapsack``, and the DP. Objectives are ``Σ cost`` of each choice + the constant."""
    row: dict[str, Any] = {"highs_s": plan.stats.get("solve_s", math.nan), "highs_obj": plan.objective_s,
                           "highs_status": plan.status}
    row.update(build_s=plan.stats.get("build_s", math.nan), pre_s=math.nan, pre_status="skipped",
               pre_obj=math.nan, cbc_s=math.nan, cbc_status="skipped", cbc_obj=math.nan)
    if plan.feasible:
        opts = problem.options
        prob, xs = milp._knapsack(problem, cset.by_llm)
        t0 = time.perf_counter()
        prob.solve(pulp.HiGHS(msg=False, threads=1, timeLimit=opts.time_limit_s, gapRel=opts.gap_rel,
                              gapAbs=0.0, random_seed=milp.SEED, presolve="on"))
        t1 = time.perf_counter()
        status, _, _ = milp._status(prob)
        choice = milp._chosen(xs)
        row.update(pre_s=t1 - t0, pre_status=status + ("" if fits_budget(problem, choice)
                                                             else "+over_budget"),
                   pre_obj=math.fsum(c.cost for c in choice.values()) + problem.constant_s)
        if cbc:  # the same model, solved again
            t0 = time.perf_counter()
            prob.solve(pulp.PULP_CBC_CMD(msg=False, threads=1, gapRel=0.0, timeLimit=cbc_limit_s))
            t1 = time.perf_counter()
            choice = milp._chosen(xs)
            sol = {pulp.LpSolutionOptimal: "optimal", pulp.LpSolutionIntegerFeasible: "time_limit"}
            row.update(cbc_s=t1 - t0,
                       cbc_status=sol.get(prob.sol_status, pulp.LpStatus[prob.status].lower())
                       + ("" if fits_budget(problem, choice) else "+over_budget"),
                       cbc_obj=math.fsum(c.cost for c in choice.values()) + problem.constant_s)
    try:
        res = solve_problem(problem, cset)
        row.update(dp_s=res.seconds, dp_status=res.status, dp_cells=res.cells, dp_step=res.step,
                   dp_obj=res.objective + problem.constant_s if res.status == "optimal" else math.inf)
    except NotImplementedError as e:
        row.update(dp_s=math.nan, dp_status=f"unsupported: {e}", dp_cells=0, dp_step=0, dp_obj=math.nan)
    objs = [row["highs_obj"], row["dp_obj"]]
    objs += [row[f"{k}_obj"] for k in ("pre", "cbc") if row[f"{k}_status"] == "optimal"]
    objs = [o for o in objs if not math.isnan(o)]
    row["max_rel_diff"] = max((_rel(a, objs[0]) for a in objs), default=0.0)
    row["agree"] = row["max_rel_diff"] <= REL and all(
        row[f"{k}_status"] in ("optimal", "skipped") for k in ("pre", "cbc"))
    return row


# --------------------------------------------------------------------------- c. oracle

def oracle_instance(i: int) -> tuple[int, int, float]:
    """(LLMs, GPUs, load) of oracle instance ``i`` (its problem's seed is ``i``)."""
    rng = np.random.default_rng([20250, i])
    return int(rng.integers(1, 5)), int(rng.integers(1, 9)), float(rng.choice(LOADS))


def _baseline_registry() -> tuple[dict[str, Any], str | None]:
    """The registered baselines' factories, or why none are available."""
    try:
        from scepsy_opt.planning.optimisers import OPTIMISERS, optimiser

        optimiser("milp")
    except ImportError as e:
        return {}, f"scepsy_opt.planning.baselines is not importable ({e}): brute-force and baselines skipped"
    return dict(OPTIMISERS), None


def _check_plan(problem: PlanningProblem, plan: Plan) -> list[str]:
    """What is wrong with a feasible plan: over budget, objective not its re-priced value."""
    errs = []
    if not fits_budget(problem, plan.candidates):
        errs.append("over budget")
    assert plan.allocation is not None
    try:
        priced = price(problem, plan.allocation)
        obj = math.fsum(c.cost for c in priced.values()) + problem.constant_s
        if _rel(obj, plan.objective_s) > 1e-6:
            errs.append(f"objective {plan.objective_s:.9g} but re-priced {obj:.9g}")
    except InputError as e:
        errs.append(f"re-pricing failed: {e}")
    return errs


def oracle(count: int, latency: Any) -> dict[str, Any]:
    registry, skipped = _baseline_registry()
    if skipped:
        print(f"NOTE: {skipped}")
    factories: dict[str, Any] = {n: registry[n] for n in ("brute-force", *BASELINES) if n in registry}
    for n in ("brute-force", *BASELINES):
        if registry and n not in registry:
            print(f"NOTE: optimiser {n!r} is not registered: skipped")
    if "brute-force" in factories:  # also on every candidate: checks the dominance pruning
        factories = {"brute-force": factories["brute-force"],
                     UNPRUNED: lambda: registry["brute-force"](prune=False), **factories}
    names = list(factories)
    exact = ("dp", "brute-force", UNPRUNED)
    per: dict[str, list[dict[str, Any]]] = {n: [] for n in ("dp", *names)}
    times: dict[str, float] = dict.fromkeys(("milp", "dp", *names), 0.0)
    milp_invalid: list[str] = []
    binding = milp_feasible = 0
    for i in range(count):
        n, g, load = oracle_instance(i)
        problem = random_problem(n, g, latency, seed=i, gpu=GPU, load=load)
        cset = generate_candidates(problem)
        t0 = time.perf_counter()
        ref = milp.solve_min_latency(problem, cset)
        times["milp"] += time.perf_counter() - t0
        base = {"i": i, "llms": n, "gpus": g, "load": load, "milp": ref.objective_s}
        if ref.feasible:
            milp_feasible += 1
            free = math.fsum(min(c.cost for c in cs) for cs in cset.by_llm.values()) + problem.constant_s
            binding += ref.objective_s > free * (1 + REL)
            milp_invalid += [f"instance {i}: {e}" for e in _check_plan(problem, ref)]
        t0 = time.perf_counter()
        res = solve_problem(problem, cset)
        times["dp"] += time.perf_counter() - t0
        per["dp"].append({**base, "other": res.objective + problem.constant_s
                          if res.status == "optimal" else math.inf, "errors": [], "refused": False})
        for name in names:
            t0 = time.perf_counter()
            refused = False
            try:
                plan = factories[name]().solve(problem)
                errs = _check_plan(problem, plan) if plan.feasible else []
                other = plan.objective_s if plan.feasible else math.inf
            except InputError as e:  # brute force refuses products over its max_product
                other, errs, refused = math.nan, [], True
                if not name.startswith("brute-force"):
                    errs = [f"raised InputError: {e}"]
            except Exception as e:  # a crash is a finding, not a reason to stop
                other, errs = math.nan, [f"raised {type(e).__name__}: {e}"]
            times[name] += time.perf_counter() - t0
            per[name].append({**base, "other": other, "errors": errs, "refused": refused})
        if (i + 1) % 50 == 0:
            progress(f"  oracle {i + 1}/{count}")

    exact_rows, base_rows, problems = [], [], []
    for name, rs in per.items():
        errors = [f"{name} instance {r['i']} ({r['llms']} LLMs, {r['gpus']} GPUs, load {r['load']}): {e}"
                  for r in rs for e in r["errors"]]
        problems += errors
        if name in exact:
            refused = sum(r["refused"] for r in rs)
            bad = [r for r in rs if not r["refused"] and not r["errors"]
                   and not (math.isinf(r["milp"]) and math.isinf(r["other"]))
                   and not _rel(r["milp"], r["other"]) <= REL]
            problems += [f"{name} instance {r['i']} ({r['llms']} LLMs, {r['gpus']} GPUs, load {r['load']}): "
                         f"milp {r['milp']:.12g} vs {name} {r['other']:.12g}" for r in bad]
            exact_rows.append({"vs": name, "instances": len(rs) - refused, "refused": refused,
                               "rel_diff>1e-9": len(bad),
                               "max_rel_diff": max((_rel(r["milp"], r["other"]) for r in rs
                                                    if math.isfinite(r["milp"])
                                                    and math.isfinite(r["other"])), default=0.0),
                               "invalid_plans": len(errors), "seconds": times[name]})
            continue
        both = [r for r in rs if math.isfinite(r["milp"]) and math.isfinite(r["other"])]
        better = [r for r in both if r["milp"] < r["other"] * (1 - REL)]
        worse = [r for r in both if r["other"] < r["milp"] * (1 - REL)]
        imp = [(r["other"] - r["milp"]) / r["other"] for r in better]
        problems += [f"{name} instance {r['i']}: baseline {r['other']:.12g} beats milp {r['milp']:.12g}"
                     for r in worse]
        base_rows.append({
            "baseline": name, "both_feasible": len(both), "milp_better": len(better),
            "improvement_med": statistics.median(imp) if imp else 0.0,
            "improvement_max": max(imp) if imp else 0.0,
            "baseline_better": len(worse),
            "baseline_no_plan": sum(1 for r in rs if math.isfinite(r["milp"]) and not math.isfinite(r["other"])),
            "milp_no_plan": sum(1 for r in rs if math.isinf(r["milp"]) and math.isfinite(r["other"])),
            "invalid_plans": len(errors), "seconds": times[name]})
    problems += [f"milp {e}" for e in milp_invalid]
    return {"instances": count, "milp_feasible": milp_feasible, "budget_binding": binding,
            "milp_seconds": times["milp"], "skipped": skipped, "exact": exact_rows,
            "baselines": base_rows, "problems": problems}


# --------------------------------------------------------------------------- main

def _parse_sizes(text: str) -> tuple[tuple[int, int, int], ...]:
    out = []
    for part in text.split(","):
        size, _, seeds = part.partition(":")
        n, _, g = size.partition("x")
        out.append((int(n), int(g), int(seeds or 1)))
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small smoke run (under a minute)")
    ap.add_argument("--sizes", type=_parse_sizes, default=None,
                    help="LLMSxGPUS:SEEDS,... (default 5x16:5,20x256:5,100x4096:3)")
    ap.add_argument("--oracle", type=int, default=None, help="oracle instances (default 300; quick 30)")
    ap.add_argument("--no-cbc", action="store_true", help="skip CBC in the solver comparison")
    ap.add_argument("--cbc-limit", type=float, default=120.0, help="CBC time limit per solve (s)")
    ap.add_argument("--out", default=None, help="results name (default plan_bench[_quick])")
    args = ap.parse_args(argv)
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    count = args.oracle if args.oracle is not None else (30 if args.quick else 300)
    latency = roofline_model()
    t_start = time.perf_counter()

    # a + b
    rows, solver_rows = [], []
    for n, g, seeds in sizes:
        for seed in range(seeds):
            progress(f"scaling {n} LLMs / {g} GPUs, seed {seed}")
            row, problem, cset, plan = run_instance(n, g, seed, latency)
            rows.append(row)
            cmp = compare_solvers(problem, cset, plan, cbc=not args.no_cbc, cbc_limit_s=args.cbc_limit)
            solver_rows.append({"size": f"{n}/{g}", "seed": seed, "kept": cset.kept, **cmp})
            del problem, cset, plan
    peak_mb = peak_rss_mb()
    summary = summarise(rows)

    print("a. Scaling: MILP pipeline (median / max seconds per phase; HiGHS, 1 thread)")
    print(table([{k: (sig(v) if isinstance(v, float) else v) for k, v in s.items()} for s in summary],
                ["size", "n", "candidates_s_med", "candidates_s_max", "build_s_med", "build_s_max",
                 "solve_s_med", "solve_s_max", "total_s_med", "total_s_max", "generated_med",
                 "kept_med", "status", "gap_max", "gpu_use_med", "target_s", "meets"]))
    print(f"peak RSS of the process (all sizes, largest {sizes[-1][0]}/{sizes[-1][1]}): "
          f"{peak_mb:.0f} MB (target <= {TARGET_MEMORY_MB:.0f} MB: "
          f"{'yes' if peak_mb <= TARGET_MEMORY_MB else 'NO'})")
    print()
    print("b. Solvers on the same candidate sets (seconds; objective = weighted latency, s)")
    print(table([{k: (sig(v, 12 if k.endswith("obj") else 3) if isinstance(v, float) else v)
                  for k, v in r.items()} for r in solver_rows],
                ["size", "seed", "kept", "build_s", "highs_s", "pre_s", "cbc_s", "dp_s", "dp_cells",
                 "highs_status", "pre_status", "cbc_status", "dp_status", "highs_obj",
                 "max_rel_diff", "agree"]))
    print()

    # c
    progress(f"oracle suite: {count} instances")
    orc = oracle(count, latency)
    print(f"c. Oracle suite: {orc['instances']} instances (<= 4 LLMs, <= 8 GPUs, loads {LOADS}); "
          f"MILP feasible on {orc['milp_feasible']}, budget binding on {orc['budget_binding']}; "
          f"MILP {orc['milp_seconds']:.2f} s in all")
    print(table([{k: (sig(v) if isinstance(v, float) else v) for k, v in r.items()} for r in orc["exact"]],
                ["vs", "instances", "refused", "rel_diff>1e-9", "max_rel_diff", "invalid_plans",
                 "seconds"]))
    if orc["baselines"]:
        print()
        print("MILP vs baselines (improvement = (baseline - milp) / baseline where the MILP is better)")
        print(table([{k: (sig(v) if isinstance(v, float) else v) for k, v in r.items()}
                     for r in orc["baselines"]],
                    ["baseline", "both_feasible", "milp_better", "improvement_med", "improvement_max",
                     "baseline_better", "baseline_no_plan", "milp_no_plan", "invalid_plans", "seconds"]))
    failures = list(orc["problems"])
    failures += [f"solvers {r['size']} seed {r['seed']}: objectives differ by {r['max_rel_diff']:.3g}"
                 for r in solver_rows if not r["agree"]]
    failures += [f"scaling {r['llms']}/{r['gpus']} seed {r['seed']}: status {r['status']}, gap {r['gap']:.3g}"
                 for r in rows if r["status"] != "optimal" or r["gap"] > GAP_ZERO]
    if failures:
        print()
        print(f"PROBLEMS ({len(failures)}):")
        for f in failures[:40]:
            print(f"  {f}")
        if len(failures) > 40:
            print(f"  ... and {len(failures) - 40} more (all in the results file)")
    path = write_results(args.out or ("plan_bench_quick" if args.quick else "plan_bench"), {
        "args": {"quick": args.quick, "sizes": sizes, "oracle": count, "cbc": not args.no_cbc,
                 "cbc_limit_s": args.cbc_limit},
        "solver": milp.SOLVER, "cbc": "PULP_CBC_CMD " + pulp.__version__, "gpu": GPU,
        "targets": {"total_s": {f"{n}/{g}": t for (n, g), t in TARGET_TOTAL_S.items()},
                    "memory_mb": TARGET_MEMORY_MB},
        "scaling": {"instances": rows, "summary": summary, "peak_rss_mb": peak_mb},
        "solvers": solver_rows, "oracle": orc, "failures": failures,
        "wall_s": time.perf_counter() - t_start})
    print(f"\nwrote {path} ({time.perf_counter() - t_start:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
