"""Program-level LAS against per-call FCFS in the simulator: where program priorities pay.

Each *mix* is a workload of ``datasets/`` on a hand-made allocation in which a short workflow and
a long, many-call one share an LLM:

* ``rag-beam``: RAG (one rewriter call, about 20 reranker calls, one generator call) beside beam
  search (about 80 generator and 80 PRM calls per request, heavy-tailed), sharing ``generator``,
  on 8 A100s (the default, as before);
* ``coding-chat``: single-call chat beside a coding agent (a planner call, then code, test and
  review rounds), sharing ``coder``, on 3 A100s.

For every mix and batch limit (``--max-batch``, vLLM's ``max_num_seqs``) the allocation's
saturation load is found first (:func:`scepsy_opt.prediction.simulate.saturation_rate`, seed
0); then each load (a fraction of it) is simulated for every seed twice with the same arrivals
and request shapes: every replica's waiting queue first come, first served, and ordered by the
least attained service of the call's request (``priority="las"``,
:mod:`scepsy_opt.prediction.priority`). Rates are the same for every seed, so the seeds' spread
is the noise of the arrivals and the drawn requests.

The table gives, per mix, batch limit, load and workflow (and ``all``: every request), the mean,
p50, p90 and p99 latency after the warm-up under each policy, averaged over the seeds, and the
paired ratio las/fcfs of the mean and the p90 per seed: its average and its range over the seeds.
``--out`` writes every run (``rows``) and the summary (``summary``) as JSON.

Priorities only act on calls that wait: with continuous batching a call waits only when the
batch limit or the KV cache is full.

    python benchmarks/las_vs_fcfs.py [--quick] [--mix rag-beam,coding-chat|all]
        [--loads 0.5,0.9,0.98] [--max-batch 8,32] [--seeds 0,1,2] [--requests N] [--out F]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scepsy.tables import format_table
from scepsy_opt.allocation import load_allocation
from scepsy_opt.prediction.priority import PRIORITY_POLICIES
from scepsy_opt.prediction.simulate import SimulationResult, saturation_rate, simulate
from scepsy_opt.workload import load_specs, models_of, workload_trace
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import MemoryPolicy

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mix:
    """A workload on an allocation; ``short`` and ``long`` name its two kinds of workflow."""

    workload: Path
    allocation: Path
    short: str
    long: str


MIXES = {
    "rag-beam": Mix(REPO / "datasets/workflows/rag-beam.yaml",
                    REPO / "datasets/allocations/rag-beam-8gpu.yaml", "rag", "beam_search"),
    "coding-chat": Mix(REPO / "datasets/workflows/coding-chat.yaml",
                       REPO / "datasets/allocations/coding-chat-3gpu.yaml", "chat",
                       "coding_agent"),
}
WORKLOAD = MIXES["rag-beam"].workload
ALLOCATION = MIXES["rag-beam"].allocation
STATS = ("mean", "p50", "p90", "p99")
FULL: dict[str, Any] = {"loads": (0.5, 0.7, 0.8, 0.9, 0.95, 0.98), "requests": 2000, "trace_requests": 100,
        "saturation_requests": 2000, "seeds": (0, 1, 2, 3, 4)}
QUICK: dict[str, Any] = {"loads": (1.0,), "requests": 150, "trace_requests": 12, "saturation_requests": 150,
         "seeds": (0,)}


def latency_stats(lats: Sequence[float]) -> dict[str, float]:
    """Mean, p50, p90 and p99 of ``lats`` (NaN for none)."""
    if not len(lats):
        return dict.fromkeys(STATS, math.nan)
    x = np.asarray(lats, float)
    return {"mean": float(x.mean()), "p50": float(np.percentile(x, 50)),
            "p90": float(np.percentile(x, 90)), "p99": float(np.percentile(x, 99))}


def run_stats(res: SimulationResult) -> dict[str, dict[str, float]]:
    """Per workflow and ``all``: :func:`latency_stats` of the requests after the warm-up (the
    first 10% of arrivals, as the simulator's own statistics)."""
    warm = math.floor(0.1 * res.arrivals)
    measured = [r for r in res.requests[warm:] if r.latency_s is not None]
    out = {w: latency_stats([r.latency_s for r in measured if r.workflow == w])
           for w in sorted(res.workflows)}
    out["all"] = latency_stats([r.latency_s for r in measured])
    return out


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


def run_mix(workload: Path, allocation: Path, *, loads: Sequence[float], seeds: Sequence[int],
            max_batch: int | None, requests: int, trace_requests: int,
            saturation_requests: int, name: str = "custom") -> tuple[dict[str, Any], list[dict]]:
    """One mix at one batch limit: its header (saturation) and one row per load, seed and
    policy."""
    specs = load_specs(workload)
    models = models_of(specs)
    alloc = load_allocation(allocation)
    lat = roofline_model()
    policy = MemoryPolicy() if max_batch is None else MemoryPolicy(max_batch=max_batch)
    rel = {s.name: float(s.weight) for s in specs}
    total_rel = sum(rel.values())
    trace0 = workload_trace(specs, None, requests=trace_requests, seed=0)
    mu = saturation_rate(trace0, models, alloc, lat, rel, requests=saturation_requests, seed=0,
                         policy=policy)
    head = {"mix": name, "workload": _rel(workload), "allocation": _rel(allocation),
            "max_batch": policy.max_batch, "saturation_rate": mu * total_rel}
    rows = []
    for seed in seeds:
        trace = trace0 if seed == 0 else workload_trace(specs, None, requests=trace_requests,
                                                        seed=seed)
        for load in loads:
            rates = {w: load * mu * r for w, r in rel.items()}
            for priority in PRIORITY_POLICIES:
                tic = time.perf_counter()
                res = simulate(trace, models, alloc, lat, rates, requests=requests, seed=seed,
                               policy=policy, priority=priority)
                st = run_stats(res)
                rows.append({
                    "mix": name, "max_batch": policy.max_batch, "load": load, "seed": seed,
                    "total_rate": load * mu * total_rel, "priority": priority,
                    "latency_s": st,
                    "p90_latency_s": {w: x.p90_latency_s for w, x in res.workflows.items()},
                    "p90_all_s": st["all"]["p90"], "mean_all_s": st["all"]["mean"],
                    "arrivals": res.arrivals, "unfinished": res.unfinished,
                    "wall_s": time.perf_counter() - tic,
                })
    return head, rows


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mix, batch limit, load and workflow (``all`` too): each statistic's average over the
    seeds under each policy, and the paired las/fcfs ratio of each statistic per seed (its
    average, min and max over the seeds)."""
    runs = {(r["mix"], r["max_batch"], r["load"], r["seed"], r["priority"]): r for r in rows}
    keys = dict.fromkeys((r["mix"], r["max_batch"], r["load"]) for r in rows)  # run order
    out = []
    for mix, mb, load in keys:
        seeds = sorted({s for (m, b, ld, s, p) in runs
                        if (m, b, ld) == (mix, mb, load) and p == "fcfs"
                        and (m, b, ld, s, "las") in runs})
        if not seeds:
            continue
        first = runs[(mix, mb, load, seeds[0], "fcfs")]["latency_s"]
        for wf in first:
            line: dict[str, Any] = {"mix": mix, "max_batch": mb, "load": load, "workflow": wf,
                                    "seeds": seeds}
            for stat in STATS:
                f = [runs[(mix, mb, load, s, "fcfs")]["latency_s"][wf][stat] for s in seeds]
                g = [runs[(mix, mb, load, s, "las")]["latency_s"][wf][stat] for s in seeds]
                ratio = [b / a for a, b in zip(f, g, strict=True) if a > 0]
                line[stat] = {"fcfs": float(np.mean(f)), "las": float(np.mean(g)),
                              "ratio": float(np.mean(ratio)) if ratio else math.nan,
                              "ratio_min": min(ratio, default=math.nan),
                              "ratio_max": max(ratio, default=math.nan)}
            out.append(line)
    return out


def run(*, workload: Path | None = None, allocation: Path | None = None,
        mixes: Sequence[str] = ("rag-beam",), quick: bool = False,
        loads: tuple[float, ...] | None = None,
        max_batches: Sequence[int | None] = (None,), seeds: Sequence[int] | None = None,
        requests: int | None = None, seed: int | None = None) -> dict[str, Any]:
    """The comparison as a JSON-able document: ``{"mixes": [{"mix", "workload", "allocation",
    "max_batch", "saturation_rate"}], "rows": [{"mix", "max_batch", "load", "seed",
    "total_rate", "priority", "latency_s": {wf|"all": {"mean", "p50", "p90", "p99"}},
    "p90_latency_s": {wf: s}, "p90_all_s", "mean_all_s", "arrivals", "unfinished", "wall_s"}],
    "summary": [...]}`` (:func:`summarise`). ``workload``/``allocation`` replace the mixes by
    one of your own (named ``custom``); ``seed`` is one seed (``seeds`` several)."""
    cfg: dict[str, Any] = dict(QUICK if quick else FULL)
    if loads is not None:
        cfg["loads"] = loads
    if requests is not None:
        cfg["requests"] = requests
    if seeds is not None:
        cfg["seeds"] = tuple(seeds)
    elif seed is not None:
        cfg["seeds"] = (seed,)
    if workload is not None or allocation is not None:
        chosen = {"custom": Mix(workload or WORKLOAD, allocation or ALLOCATION, "", "")}
    else:
        chosen = {m: MIXES[m] for m in mixes}
    heads, rows = [], []
    for name, mix in chosen.items():
        for mb in max_batches:
            head, more = run_mix(mix.workload, mix.allocation, loads=cfg["loads"],
                                 seeds=cfg["seeds"], max_batch=mb,
                                 requests=int(cfg["requests"]),
                                 trace_requests=int(cfg["trace_requests"]),
                                 saturation_requests=int(cfg["saturation_requests"]), name=name)
            heads.append(head)
            rows.extend(more)
    doc: dict[str, Any] = {"mixes": heads, "seeds": list(cfg["seeds"]),
                           "requests": int(cfg["requests"]), "rows": rows,
                           "summary": summarise(rows)}
    if len(heads) == 1:  # the single-mix fields, as before
        doc.update({k: heads[0][k] for k in ("workload", "allocation", "max_batch",
                                             "saturation_rate")})
        doc["seed"] = cfg["seeds"][0]
    return doc


def _f(x: float) -> str:
    return f"{x:.1f}" if math.isfinite(x) else "-"


def _ratio(s: dict[str, float]) -> str:
    if not math.isfinite(s["ratio"]):
        return "-"
    if s["ratio_min"] == s["ratio_max"]:
        return f"{s['ratio']:.2f}"
    return f"{s['ratio']:.2f} [{s['ratio_min']:.2f}-{s['ratio_max']:.2f}]"


def table(doc: dict[str, Any]) -> str:
    """One line per mix, batch limit, load and workflow: each statistic under fcfs / las
    (seconds, averaged over the seeds) and the las/fcfs ratios of the mean and p90 (average
    [min-max] over the seeds)."""
    sat = {(h["mix"], h["max_batch"]): h["saturation_rate"] for h in doc["mixes"]}
    lines = []
    for s in doc["summary"]:
        line: dict[str, object] = {
            "mix": s["mix"], "batch": s["max_batch"], "load": f"{s['load']:.2f}",
            "req/s": f"{s['load'] * sat[(s['mix'], s['max_batch'])]:.3f}",
            "workflow": s["workflow"]}
        for stat in STATS:
            line[f"{stat} fcfs/las (s)"] = f"{_f(s[stat]['fcfs'])} / {_f(s[stat]['las'])}"
        line["las/fcfs mean"] = _ratio(s["mean"])
        line["las/fcfs p90"] = _ratio(s["p90"])
        lines.append(line)
    cols = list(lines[0]) if lines else []
    return format_table(lines, cols)


def _numbers(text: str, flag: str, kind: type, ap: argparse.ArgumentParser) -> tuple:
    try:
        return tuple(kind(x) for x in text.split(","))
    except ValueError:
        ap.error(f"{flag}: comma-separated {'integers' if kind is int else 'numbers'}, "
                 f"got {text!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mix", default="rag-beam",
                    help=f"mixes, comma-separated, or all ({', '.join(MIXES)}; default "
                         "rag-beam)")
    ap.add_argument("--workload", type=Path, default=None,
                    help="a workload of your own instead of the mixes (with --allocation)")
    ap.add_argument("--allocation", type=Path, default=None)
    ap.add_argument("--loads", default=None,
                    help="fractions of the saturation load, comma-separated (default "
                         "0.5,0.7,0.8,0.9,0.95,0.98)")
    ap.add_argument("--max-batch", default=None,
                    help="sequences per replica (vLLM max_num_seqs), comma-separated; 0: the "
                         "engine's default (default: the engine's)")
    ap.add_argument("--requests", type=int, default=None, help="arrivals per run")
    ap.add_argument("--seeds", default=None, help="seeds, comma-separated (default 0,1,2,3,4)")
    ap.add_argument("--seed", type=int, default=None, help="one seed (as --seeds SEED)")
    ap.add_argument("--quick", action="store_true", help="a small run (seconds)")
    ap.add_argument("--out", type=Path, default=None, help="write the runs as JSON here")
    args = ap.parse_args(argv)
    loads = None
    if args.loads:
        loads = _numbers(args.loads, "--loads", float, ap)
        if not all(math.isfinite(x) and x > 0 for x in loads):
            ap.error(f"--loads: fractions > 0, got {args.loads!r}")
    max_batches: tuple[int | None, ...] = (None,)
    if args.max_batch is not None:
        mbs = _numbers(args.max_batch, "--max-batch", int, ap)
        if any(x < 0 for x in mbs):
            ap.error(f"--max-batch: integers >= 1 (0: the engine's default), got "
                     f"{args.max_batch!r}")
        max_batches = tuple(x or None for x in mbs)
    seeds = None
    if args.seeds is not None:
        seeds = _numbers(args.seeds, "--seeds", int, ap)
        if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
            ap.error(f"--seeds: distinct integers >= 0, got {args.seeds!r}")
    if args.seed is not None and args.seed < 0:
        ap.error(f"--seed: an integer >= 0, got {args.seed}")
    if args.requests is not None and args.requests < 1:
        ap.error(f"--requests: an integer >= 1, got {args.requests}")
    mixes = tuple(MIXES) if args.mix == "all" else tuple(args.mix.split(","))
    unknown = [m for m in mixes if m not in MIXES]
    if unknown:
        ap.error(f"--mix: {', '.join(MIXES)} or all, got {args.mix!r}")
    for flag, path in (("--workload", args.workload), ("--allocation", args.allocation)):
        if path is not None and not path.is_file():
            ap.error(f"{flag}: an existing file, got {str(path)!r}")
    doc = run(workload=args.workload.resolve() if args.workload else None,
              allocation=args.allocation.resolve() if args.allocation else None,
              mixes=mixes, quick=args.quick, loads=loads, max_batches=max_batches,
              seeds=seeds, requests=args.requests, seed=args.seed)
    for h in doc["mixes"]:
        print(f"{h['mix']}: {h['workload']} on {h['allocation']}, max batch {h['max_batch']}: "
              f"saturates at {h['saturation_rate']:.3f} req/s")
    print(f"{doc['requests']} arrivals per run, seeds {','.join(map(str, doc['seeds']))}")
    print(table(doc))
    if args.out is not None:
        from scepsy_common.files import atomic_write_text

        atomic_write_text(args.out, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
