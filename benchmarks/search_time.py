"""Plan time: scepsy's placed plan against the paper-style hierarchical heuristic, as LLMs and GPUs
grow (section ``search`` of ``scepsy bench paper``; docs/evaluation.md).

Both methods run as ``scepsy plan`` runs them (:func:`scepsy_place.formulations.loop.plan_and_place`):

* **scepsy**: the ``milp`` optimiser with ``--formulation auto`` (candidates with reduced-cost
  fixing, the MILP, placement and the formulations ``auto`` picks); its plan is always placed
  or says why;
* **heuristic**: the ``heuristic`` optimiser (the paper's hierarchical search over the same
  candidates), then the aggregate placement of its allocation, as every baseline is placed
  (solved again with a smaller budget while its allocation does not place).

Each (LLMs, GPUs) point is one seeded ``random_problem`` instance (``make_problem`` of
``benchmarks/solvers/formulations_bench.py``: A100-80GB nodes of 8 GPUs, roofline latency model, targets at
about half the cluster's GPUs). Each method runs in its own forked process on a fresh copy of
the instance (cold caches, so neither pays for the other's serving curves); the wall time
counts everything after the instance is built: candidates, search, placement. Sweeps: GPUs at
5 LLMs (8 to 4,096), LLMs at 256 GPUs (2 to 100), and the diagonal from 2 LLMs on 4 GPUs to 100
on 4,096. Every plan gets one deadline (``time_limit_s``, 20 s; the heuristic does not look at
it, its placement does).

Per row: ``scepsy_s``, ``heuristic_s``; ``scepsy_status``: ``optimal`` (placed, within 10⁻⁶ of
a bound valid for every placeable allocation of the candidate grid), ``feasible`` (placed with
a larger proven gap, before the deadline), ``time_limit`` (placed when the deadline passed),
or the loop's status when nothing is placed (``unplaced``, ``infeasible``, ``time_limit``);
``scepsy_gap`` (objective / that bound − 1; None without a bound); ``heuristic_status``
(``placed``, ``unplaced``, ``infeasible``); ``heuristic_ratio``: the heuristic allocation's
predicted objective (weighted mean latency) over scepsy's, also when the heuristic's allocation
could not be placed (``heuristic_placed`` false: the allocation cannot run as planned, so its
figure is optimistic). ``plans`` lists both methods' plans.

    python benchmarks/search_time.py            # full sweep, about 5-7 min on 2 cores
    python benchmarks/search_time.py --quick    # tiny sweep, seconds

writes ``results/search_time.json`` (``search_time_quick.json``) and the figure under
``results/search_time/`` (``results/search_time_quick/``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE / "solvers"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from _common import RESULTS, progress, sig, table, write_results  # noqa: E402
from formulations_bench import isolated, make_problem  # noqa: E402
from scepsy_opt.planning.problem import Deadline, PlanningProblem  # noqa: E402
from scepsy_place.formulations.loop import PROVEN_GAP, plan_and_place  # noqa: E402
from scepsy_place.formulations.placed import PlacedPlan  # noqa: E402
from scepsy_place.packing.topology import from_cluster  # noqa: E402

SCEPSY_STATUSES = ("optimal", "feasible", "time_limit", "unplaced", "infeasible", "error")
HEURISTIC_STATUSES = ("placed", "unplaced", "infeasible", "time_limit", "error")
METHODS = {"scepsy": "milp", "heuristic": "heuristic"}  # method -> optimiser
FIGURE = "search_time.png"
COLS = ["llms", "gpus", "scepsy_s", "scepsy_status", "scepsy_gap", "scepsy_formulation",
        "heuristic_s", "heuristic_status", "heuristic_ratio"]


@dataclass(frozen=True)
class Sweep:
    """One line of the figure: (LLMs, GPUs) points along one axis."""

    name: str  # "gpus", "llms" or "diagonal"
    title: str
    points: tuple[tuple[int, int], ...]  # (llms, gpus)


@dataclass(frozen=True)
class Mode:
    sweeps: tuple[Sweep, ...]
    time_limit_s: float


FULL = Mode((
    Sweep("gpus", "GPUs grow, 5 LLMs", tuple((5, g) for g in (8, 16, 64, 256, 1024, 4096))),
    Sweep("llms", "LLMs grow, 256 GPUs", tuple((n, 256) for n in (2, 5, 10, 20, 50, 100))),
    Sweep("diagonal", "both grow", ((2, 4), (5, 16), (10, 64), (20, 256), (50, 1024),
                                    (100, 4096))),
), time_limit_s=20.0)
QUICK = Mode((
    Sweep("gpus", "GPUs grow, 2 LLMs", ((2, 4), (2, 16))),
    Sweep("llms", "LLMs grow, 16 GPUs", ((2, 16), (5, 16))),
), time_limit_s=5.0)


def points(mode: Mode) -> list[tuple[int, int]]:
    """Every (LLMs, GPUs) point of the mode once, smallest first."""
    return sorted({p for s in mode.sweeps for p in s.points}, key=lambda p: (p[0] * p[1], p))


def instance(llms: int, gpus: int, seed: int, limit_s: float) -> PlanningProblem:
    """The seeded instance with the plan's time limit, its per-LLM loads already derived (part
    of building the instance from its trace statistics, not of either search)."""
    p = make_problem(f"{llms}x{gpus}", seed)
    p = dataclasses.replace(p, options=dataclasses.replace(p.options, time_limit_s=limit_s))
    _ = p.loads
    return p


def scepsy_status(res: PlacedPlan, timed_out: bool) -> str:
    """The honest status of scepsy's placed plan (module docstring)."""
    if not res.placed:
        return res.status
    gap = res.gap
    if gap is not None and gap <= PROVEN_GAP:
        return "optimal"
    return "time_limit" if timed_out else "feasible"


def measure(method: str, llms: int, gpus: int, seed: int, limit_s: float) -> dict[str, Any]:
    """One method on one instance (run in a forked child by :func:`timed`)."""
    problem = instance(llms, gpus, seed, limit_s)
    topology = from_cluster(problem.cluster)
    deadline = Deadline.after(limit_s)
    t0 = time.perf_counter()
    res = plan_and_place(problem, topology, name=METHODS[method], formulation="auto",
                         deadline=deadline)
    wall = time.perf_counter() - t0
    status = (scepsy_status(res, deadline.remaining() <= 0) if method == "scepsy"
              else res.status)
    unplaced = len(res.placement.unplaced) if res.placement is not None else 0
    return {"s": wall, "status": status, "placed": res.placed,
            "objective_s": res.plan.objective_s if res.plan.allocation is not None else math.nan,
            "gap": res.gap if res.gap is not None else math.nan,
            "formulation": res.formulation, "unplaced_replicas": unplaced}


def timed(method: str, llms: int, gpus: int, seed: int, limit_s: float) -> dict[str, Any]:
    """:func:`measure` in a forked process (cold caches; a failure becomes status ``error``)."""
    out = isolated(lambda: measure(method, llms, gpus, seed, limit_s))
    out.setdefault("s", math.nan)
    return out


def _num(x: Any) -> float | None:
    """A finite float, or None (JSON has no NaN)."""
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def row(llms: int, gpus: int, seed: int, mode: Mode) -> dict[str, Any]:
    """Both methods on the (llms, gpus) instance (missing figures: None)."""
    sc = timed("scepsy", llms, gpus, seed, mode.time_limit_s)
    he = timed("heuristic", llms, gpus, seed, mode.time_limit_s)
    ratio = (he.get("objective_s", math.nan) / sc["objective_s"]
             if sc.get("placed") and sc["objective_s"] > 0 else math.nan)
    return {"llms": llms, "gpus": gpus,
            "sweeps": [s.name for s in mode.sweeps if (llms, gpus) in s.points],
            "time_limit_s": mode.time_limit_s,
            "scepsy_s": _num(sc["s"]), "scepsy_status": sc["status"],
            "scepsy_placed": bool(sc.get("placed")), "scepsy_gap": _num(sc.get("gap")),
            "scepsy_formulation": sc.get("formulation", "-"),
            "scepsy_objective_s": _num(sc.get("objective_s")),
            "heuristic_s": _num(he["s"]), "heuristic_status": he["status"],
            "heuristic_placed": bool(he.get("placed")),
            "heuristic_objective_s": _num(he.get("objective_s")),
            "heuristic_unplaced_replicas": he.get("unplaced_replicas", 0),
            "heuristic_ratio": _num(ratio),
            "errors": [e for e in (sc.get("error"), he.get("error")) if e]}


def figure(rows: Sequence[dict[str, Any]], mode: Mode, path: Path) -> None:
    """Plan time against GPUs and against LLMs, log axes, both methods; a hollow marker where
    scepsy's plan stopped at the time limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    at = {(r["llms"], r["gpus"]): r for r in rows}
    fig, axes = plt.subplots(1, len(mode.sweeps), figsize=(4.6 * len(mode.sweeps), 3.8),
                             squeeze=False)
    for ax, sweep in zip(axes[0], mode.sweeps, strict=True):
        pts = [at[p] for p in sweep.points]
        x = [r["llms"] if sweep.name == "llms" else r["gpus"] for r in pts]
        ax.plot(x, [_nan(r["scepsy_s"]) for r in pts], "o-", color="tab:blue", label="scepsy (placed)")
        ax.plot(x, [_nan(r["heuristic_s"]) for r in pts], "s--", color="tab:orange",
                label="heuristic (+ placement)")
        late = [(xi, r["scepsy_s"]) for xi, r in zip(x, pts, strict=True)
                if r["scepsy_status"] == "time_limit"]
        if late:
            ax.plot(*zip(*late, strict=True), "o", mfc="white", color="tab:red",
                    label="scepsy at the time limit")
        lost = [(xi, _nan(r["heuristic_s"])) for xi, r in zip(x, pts, strict=True)
                if not r["heuristic_placed"]]
        if lost:
            ax.plot(*zip(*lost, strict=True), "s", mfc="white", color="tab:orange",
                    label="heuristic allocation not placeable")
        ax.axhline(mode.time_limit_s, color="grey", lw=0.8, ls=":")
        ax.annotate("time limit", (x[0], mode.time_limit_s), xytext=(2, 2),
                    textcoords="offset points", fontsize=7, color="grey")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(x, [str(v) for v in x])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("LLMs" if sweep.name == "llms" else
                      "GPUs" + (" (LLMs: " + ", ".join(str(r["llms"]) for r in pts) + ")"
                                if sweep.name == "diagonal" else ""))
        ax.set_ylabel("plan time (s)")
        ax.set_title(sweep.title)
        ax.grid(True, which="both", alpha=0.3)
    legend: dict[str, Any] = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, h)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=len(legend),
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(*, quick: bool, seed: int, out: Path, jobs: int) -> dict[str, Any]:
    """The section (module docstring): prints the table, writes the figure under ``out`` and
    returns the JSON-able results. ``jobs`` is accepted for the common section interface; the
    timings run one at a time so that they do not compete for cores."""
    del jobs  # timings run one at a time
    mode = QUICK if quick else FULL
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    rows = []
    for llms, gpus in points(mode):
        progress(f"search: {llms} LLMs / {gpus} GPUs")
        rows.append(row(llms, gpus, seed, mode))
    figure(rows, mode, out / FIGURE)
    print(table([{c: _cell(r[c]) for c in COLS} for r in rows], COLS))
    return {"section": "search", "quick": quick, "seed": seed,
            "time_limit_s": mode.time_limit_s, "cpus": os.cpu_count(),
            # other work on the machine slows the timings: the 1-minute load average
            "load_average": [load_before, os.getloadavg()[0]], "figure": FIGURE, "rows": rows,
            "plans": [{"label": f"{m} {r['llms']} LLMs / {r['gpus']} GPUs",
                       "status": r[f"{m}_status"], "placed": r[f"{m}_placed"]}
                      for r in rows for m in METHODS]}


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


def _cell(v: Any) -> Any:
    return "-" if v is None else sig(v) if isinstance(v, float) else v


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the tiny sweep (seconds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the figure (default results/search_time[_quick]/)")
    args = ap.parse_args(argv)
    name = "search_time_quick" if args.quick else "search_time"
    res = run(quick=args.quick, seed=args.seed, out=args.out or RESULTS / name, jobs=1)
    progress(f"wrote {write_results(name, res)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
