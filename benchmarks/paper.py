"""``scepsy bench paper``: the paper's experiments and beyond, in one command (docs/evaluation.md).

    python benchmarks/paper.py [--quick] [--sections curves,accuracy,search,beyond]
                               [--out DIR] [--seed N] [--jobs N]

Sections (each writes ``OUT/<section>.json`` and its PNGs under ``OUT``):

* ``curves``: scepsy against the baselines on the paper's workflows (:mod:`paper_curves`): peak
  throughput and latency at equal throughput, as ratios to scepsy;
* ``accuracy``: the predictor against the simulator for every plan ``curves`` evaluated;
* ``search``: plan time against the paper-style heuristic (``search_time.py``);
* ``beyond``: a 1,024-GPU fleet re-planned after a load change and a node failure
  (``beyond_paper.py``).

Every section module has ``run(*, quick, seed, out, jobs) -> dict``; the dict's ``"plans"``
lists every plan the section produced. The section files hold no wall-clock figures (the same
seed gives the same bytes, whatever ``--jobs``), except where a section measures time itself
(``search``); the orchestrator's own timings go to ``OUT/timings.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import paper_curves as curves_mod  # noqa: E402
from _common import json_default  # noqa: E402
from scepsy_common.files import atomic_write_text  # noqa: E402

SECTIONS = ("curves", "accuracy", "search", "beyond")
EXTERNAL = {"search": "search_time", "beyond": "beyond_paper"}  # section -> module in benchmarks/
DEFAULT_OUT = {False: HERE.parent / "results" / "paper",
               True: HERE.parent / "results" / "paper-quick"}


class UsageError(Exception):
    """A bad option: the message names it (exit 2)."""


# ------------------------------------------------------------------------------- curves


_CURVES: dict[tuple[bool, int], list[dict]] = {}  # (quick, seed) -> cells, shared by sections


def _cells(quick: bool, seed: int, jobs: int) -> list[dict]:
    """The evaluated cells of the mode, computed once per process (the accuracy section reuses
    what the curves section computed)."""
    key = (quick, seed)
    if key not in _CURVES:
        mode = curves_mod.QUICK if quick else curves_mod.FULL
        _CURVES[key] = curves_mod.evaluate(mode, seed, jobs)
    return _CURVES[key]


def _table(rows: Sequence[dict], cols: Sequence[str]) -> None:
    from scepsy.tables import print_table

    print_table([{c: _cell(r.get(c)) for c in cols} for r in rows], list(cols))


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.3g}") if math.isfinite(v) else v
    if isinstance(v, list):
        return ",".join(f"{x:g}" for x in v) or "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return v


def _headline(summary: Sequence[dict]) -> list[dict]:
    """Per method over every cell: the geometric means of its ratios to scepsy (over the cells
    where they exist) and how many of its curve points have no placed plan."""
    out = []
    for m in dict.fromkeys(r["method"] for r in summary):
        rows = [r for r in summary if r["method"] == m]

        def g(key: str, rows: list[dict] = rows) -> float | None:
            xs = [r[key] for r in rows if r[key] is not None and r[key] > 0]
            return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None

        out.append({"method": m, "cells": len(rows),
                    "peak_ratio": g("peak_ratio"), "sim_peak_ratio": g("sim_peak_ratio"),
                    "latency_ratio": g("latency_ratio_gmean"),
                    "latency_ratio_max": max((r["latency_ratio_max"] for r in rows
                                              if r["latency_ratio_max"] is not None),
                                             default=None),
                    "predicted_latency_ratio": g("predicted_latency_ratio_gmean"),
                    "peaks_unplaced": sum(r["peak_status"] in ("unplaced", "infeasible",
                                                               "time_limit_no_solution")
                                          for r in rows),
                    "points_without_plan": sum(len(r["no_plan_at"]) for r in rows)})
    return out


def run_curves(*, quick: bool, seed: int, out: Path, jobs: int) -> dict[str, Any]:
    """The "curves" section (module docstring of :mod:`paper_curves`)."""
    mode = curves_mod.QUICK if quick else curves_mod.FULL
    results = _cells(quick, seed, jobs)
    summary = [row for c in results for row in curves_mod.summarise(c)]
    print("\nPeak throughput and latency at equal throughput, as ratios to scepsy "
          "(sim: simulated; '-': no placed plan)")
    _table(summary, ["cell", "method", "peak_status", "predicted_peak", "simulated_peak",
                     "peak_ratio", "sim_peak_ratio", "latency_ratio_gmean", "latency_ratio_max",
                     "predicted_latency_ratio_gmean", "no_plan_at"])
    headline = _headline(summary)
    print("\nOver all cells (geometric means of the ratios to scepsy)")
    _table(headline, ["method", "cells", "peak_ratio", "sim_peak_ratio", "latency_ratio",
                      "latency_ratio_max", "predicted_latency_ratio", "peaks_unplaced",
                      "points_without_plan"])
    return {"mode": _mode_dict(mode), "seed": seed, "cells": results, "summary": summary,
            "headline": headline, "plans": curves_mod.plans(results),
            "missing": curves_mod.missing(results), "figures": curves_mod.figures(results, out)}


def _mode_dict(mode: curves_mod.Mode) -> dict[str, Any]:
    return {"workflows": list(mode.workflows), "sizes": list(mode.sizes),
            "gpus": list(mode.gpus), "fractions": list(mode.fractions),
            "sim_requests": dict(mode.sim_requests), "trace_requests": mode.trace_requests,
            "time_limit_s": mode.time_limit_s, "gpus_per_node": curves_mod.GPUS_PER_NODE,
            "stable_fraction": curves_mod.STABLE, "saturation_tol": curves_mod.SATURATION_TOL}


# ----------------------------------------------------------------------------- accuracy


def _rel(pred: float | None, sim: float | None) -> float | None:
    if pred is None or sim is None or not (math.isfinite(pred) and math.isfinite(sim)) or sim <= 0:
        return None
    return (pred - sim) / sim


def accuracy_rows(results: Sequence[dict]) -> list[dict]:
    """One row per evaluated plan, relative errors as (predicted - simulated) / simulated: a
    max-throughput plan's predicted saturation rate (where its busiest LLM saturates) against
    its simulated one; a curve point's predicted throughput (the rate, or the predicted
    maximum when lower) and mean latency against the simulated ones at its rate (the latency
    only where the simulation carried the rate: an overloaded run's mean grows with its
    length)."""
    rows = []
    for c in results:
        for p in c["peaks"].values():
            if p["placed"]:
                rows.append({"cell": c["cell"], "workflow": c["workflow"], "method": p["method"],
                             "at": "peak", "rate": p["rate"],
                             "predicted_saturation": p["predicted_max_throughput"],
                             "sim_saturation": p["sim_saturation"],
                             "saturation_err": _rel(p["predicted_max_throughput"],
                                                    p["sim_saturation"])})
        for p in c["points"]:
            if p["placed"]:
                rows.append({"cell": c["cell"], "workflow": c["workflow"], "method": p["method"],
                             "at": f"{p['fraction']:g}", "rate": p["rate"], "stable": p["stable"],
                             "predicted_throughput": p["predicted_throughput"],
                             "sim_throughput": p["sim_throughput"],
                             "predicted_latency_s": p["predicted_latency_s"],
                             "sim_latency_s": p["sim_latency_s"],
                             "throughput_err": _rel(p["predicted_throughput"],
                                                    p["sim_throughput"]),
                             "latency_err": _rel(p["predicted_latency_s"], p["sim_latency_s"])
                             if p["stable"] else None})
    return rows


def _stats(xs: Sequence[float | None]) -> dict[str, float | int | None]:
    """The count, median and 90th percentile of the absolute values, and the median signed
    value (positive: the predictor says more than the simulator)."""
    v = sorted(x for x in xs if x is not None)
    if not v:
        return {"n": 0, "median_abs": None, "p90_abs": None, "median": None}
    a = sorted(abs(x) for x in v)
    return {"n": len(v), "median_abs": statistics.median(a),
            "p90_abs": a[min(len(a) - 1, math.ceil(0.9 * len(a)) - 1)],
            "median": statistics.median(v)}


def accuracy_summary(rows: Sequence[dict]) -> list[dict]:
    """Per (workflow, method) and over all: the error statistics of throughput (every
    simulated point), mean latency (points carried in simulation) and saturation (peaks)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["workflow"], r["method"]), []).append(r)
        groups.setdefault(("all", "all"), []).append(r)
    out = []
    for (wf, m), rs in sorted(groups.items(), key=lambda kv: (kv[0] == ("all", "all"), kv[0])):
        row: dict[str, Any] = {"workflow": wf, "method": m}
        for key in ("throughput", "latency", "saturation"):
            s = _stats([r.get(f"{key}_err") for r in rs])
            row.update({f"{key}_{k}": v for k, v in s.items()})
        out.append(row)
    return out


def accuracy_figure(rows: Sequence[dict], out: Path) -> str:
    """PNG scatter: predicted against simulated throughput, latency and saturation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (("throughput", "predicted_throughput", "sim_throughput", "throughput (req/s)"),
              ("latency", "predicted_latency_s", "sim_latency_s", "mean latency (s), carried"),
              ("saturation", "predicted_saturation", "sim_saturation", "peak rate (req/s)"))
    for ax, (key, pk, sk, title) in zip(axes, panels, strict=True):
        lo, hi = math.inf, 0.0
        for m in dict.fromkeys(r["method"] for r in rows):
            pts = [(r[sk], r[pk]) for r in rows if r["method"] == m and r.get(f"{key}_err")
                   is not None]
            if pts:
                ax.scatter(*zip(*pts, strict=True), s=10, label=m,
                           color=curves_mod.COLOURS.get(m), alpha=0.7)
                lo = min(lo, *(min(p) for p in pts))
                hi = max(hi, *(max(p) for p in pts))
        if hi > 0:
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"simulated {title}")
        ax.set_ylabel(f"predicted {title}")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("predictor vs simulator, every plan evaluated")
    fig.tight_layout()
    name = "accuracy.png"
    fig.savefig(out / name, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return name


def run_accuracy(*, quick: bool, seed: int, out: Path, jobs: int) -> dict[str, Any]:
    """The "accuracy" section: predicted vs simulated figures of every plan of ``curves``."""
    results = _cells(quick, seed, jobs)
    rows = accuracy_rows(results)
    summary = accuracy_summary(rows)
    print("\nPredictor vs simulator: relative errors (predicted - simulated) / simulated")
    _table(summary, ["workflow", "method", "throughput_n", "throughput_median_abs",
                     "throughput_p90_abs", "latency_n", "latency_median_abs", "latency_p90_abs",
                     "latency_median", "saturation_n", "saturation_median_abs",
                     "saturation_median"])
    return {"seed": seed, "rows": rows, "summary": summary, "plans": curves_mod.plans(results),
            "figures": [accuracy_figure(rows, out)]}


# ------------------------------------------------------------------------- orchestrator

Section = Callable[..., dict[str, Any]]


def section_runner(name: str) -> Section:
    """The ``run`` function of section ``name``."""
    if name == "curves":
        return run_curves
    if name == "accuracy":
        return run_accuracy
    return importlib.import_module(EXTERNAL[name]).run


def parse_sections(text: str) -> list[str]:
    """``--sections``: known names, comma-separated, run in the canonical order."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in SECTIONS]
    if bad or not names:
        raise UsageError(f"--sections: expected names among {', '.join(SECTIONS)} "
                         f"(got {text!r})")
    return [s for s in SECTIONS if s in names]


def _dump(path: Path, doc: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True, allow_nan=True,
                                       default=json_default) + "\n")


def run(args: argparse.Namespace) -> int:
    """Run the sections ``args`` names (``scepsy bench paper``); 0, or 2 for bad options."""
    try:
        sections = parse_sections(args.sections)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out is not None else DEFAULT_OUT[bool(args.quick)]
    if out.exists() and not out.is_dir():
        print(f"error: --out: expected a folder (got the file {str(out)!r})", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    rows, timings = [], {}
    for name in sections:
        runner = section_runner(name)
        print(f"\n== {name} ==", flush=True)
        tic = time.perf_counter()
        doc = runner(quick=bool(args.quick), seed=args.seed, out=out, jobs=args.jobs)
        timings[name] = round(time.perf_counter() - tic, 1)
        _dump(out / f"{name}.json", doc)
        plans = doc.get("plans", [])
        rows.append({"section": name, "plans": len(plans),
                     "placed": sum(bool(p.get("placed")) for p in plans),
                     "file": str(out / f"{name}.json"), "seconds": timings[name]})
    _dump(out / "timings.json", {"seconds": timings, "quick": bool(args.quick),
                                 "jobs": args.jobs, "seed": args.seed})
    print("\nSummary")
    _table(rows, ["section", "plans", "placed", "seconds", "file"])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python benchmarks/paper.py``: the options of ``scepsy bench paper``."""
    from scepsy.bench_paper import add_arguments

    parser = add_arguments(argparse.ArgumentParser(prog="benchmarks/paper.py",
                                                   description=__doc__.splitlines()[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
