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

``--cpu-engine`` measures instead of simulating: one vLLM CPU server (the CPU kit's random-weight
model, :data:`CPU_MODEL`, on core 1, ``--scheduling-policy priority``, ``--max-num-seqs`` the
first ``--max-batch``, default 4) serves every LLM of a CPU-scale workload (default
``datasets/workflows/cpu-rag-beam.yaml``) behind two gateways, one per policy; the same drives
(``--requests`` at ``--rate`` req/s) go through them in the order fcfs, las (seed 0), las, fcfs
(seed 1), so that a drift of the machine's load falls on both. It needs vLLM's environment
(``scepsy profile install-vllm``) and takes a few minutes.

    python benchmarks/las_vs_fcfs.py [--quick] [--mix rag-beam,coding-chat|all]
        [--loads 0.5,0.9,0.98] [--max-batch 8,32] [--seeds 0,1,2] [--requests N] [--out F]
    python benchmarks/las_vs_fcfs.py --cpu-engine --rate R [--requests N] [--max-batch B]
        [--workload CPU.yaml] [--out F]
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
    """A workload on an allocation; ``short`` and ``long`` name its two kinds of workflow;
    ``catalog`` and ``curves``: a catalog file in force and a latency-curves file (None: the
    bundled catalog and the roofline model)."""

    workload: Path
    allocation: Path
    short: str
    long: str
    catalog: Path | None = None
    curves: Path | None = None


MIXES = {
    "rag-beam": Mix(REPO / "datasets/workflows/rag-beam.yaml",
                    REPO / "datasets/allocations/rag-beam-8gpu.yaml", "rag", "beam_search"),
    "coding-chat": Mix(REPO / "datasets/workflows/coding-chat.yaml",
                       REPO / "datasets/allocations/coding-chat-3gpu.yaml", "chat",
                       "coding_agent"),
    "cpu-rag-beam": Mix(REPO / "datasets/workflows/cpu-rag-beam.yaml",
                        REPO / "datasets/allocations/cpu-rag-beam-2core.yaml", "cpu_rag",
                        "cpu_beam_search", REPO / "datasets/catalogs/cpu-host.yaml",
                        REPO / "datasets/profiles/vllm-cpu-llama-3-8b-x0.0625-curves.json"),
}
"""The mixes ``--mix all`` runs: the first two at GPU scale; ``cpu-rag-beam`` is the CPU kit's
workload with the CPU's measured curves (``--cpu-engine`` runs it on a real server)."""
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
            saturation_requests: int, name: str = "custom", catalog: Path | None = None,
            curves: Path | None = None) -> tuple[dict[str, Any], list[dict]]:
    """One mix at one batch limit: its header (saturation) and one row per load, seed and
    policy (``catalog`` in force throughout, when given)."""
    from scepsy_profile.catalog import catalog_in_force, load_catalog

    cat = load_catalog(catalog) if catalog is not None else None
    with catalog_in_force(cat):
        return _run_mix(workload, allocation, loads=loads, seeds=seeds, max_batch=max_batch,
                        requests=requests, trace_requests=trace_requests,
                        saturation_requests=saturation_requests, name=name, curves=curves)


def _run_mix(workload: Path, allocation: Path, *, loads: Sequence[float], seeds: Sequence[int],
             max_batch: int | None, requests: int, trace_requests: int,
             saturation_requests: int, name: str, curves: Path | None
             ) -> tuple[dict[str, Any], list[dict]]:
    from scepsy_profile.catalog import default_catalog
    from scepsy_profile.fitted import load_curves

    specs = load_specs(workload)
    models = models_of(specs)
    alloc = load_allocation(allocation, default_catalog())
    lat = roofline_model() if curves is None else load_curves(curves)
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
                                 saturation_requests=int(cfg["saturation_requests"]), name=name,
                                 catalog=mix.catalog, curves=mix.curves)
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


CPU_WORKLOAD = REPO / "datasets/workflows/cpu-rag-beam.yaml"
CPU_CATALOG = REPO / "datasets/catalogs/cpu-host.yaml"
CPU_MODEL = "llama-3-8b:x0.0625"
ENGINE_ORDER = (("fcfs", 0), ("las", 0), ("las", 1), ("fcfs", 1))


def _engine_routes(specs: Sequence[Any], url: str, model: str | None) -> Any:
    """Every LLM of every workflow to ``url`` (one server), under the server's ``model`` name
    (None: the LLM's own name, as a gateway takes it)."""
    from scepsy_serve.launch.routes import parse_routes

    return parse_routes({"version": 1, "workflows": {s.name: {
        llm: [{"url": url.rstrip("/") + "/v1", "model": model or llm, "weight": 1.0,
               "replica": 0}] for llm in s.llms} for s in specs}}, "routes")


def engine_run(workload: Path, *, rate: float, requests: int, max_num_seqs: int,
               work: Path, health_timeout_s: float = 600.0) -> dict[str, Any]:
    """The real-engine comparison (module docstring): ``{"workload", "rate", "requests",
    "max_num_seqs", "startup_s", "port" (the server's), "runs": [{"priority", "seed", "wall_s", "failed",
    "latency_s": {wf|"all": {"n", "mean", "p50", "p90", "p99"}}}]}``. The server is stopped
    (its whole process group) however the run ends."""
    import contextlib
    import os
    import shutil
    import signal
    import subprocess
    import tempfile

    import httpx

    from scepsy_opt.ingest.record import RecordConfig
    from scepsy_profile.catalog import catalog_in_force, load_catalog
    from scepsy_profile.profiling.engine_env import (
        engine_environment,
        vllm_python,
        write_model_dir,
    )
    from scepsy_profile.profiling.models import engine_model, parse_scaled
    from scepsy_profile.profiling.server import free_port
    from scepsy_serve.gateway import GatewayConfig, gateway_in_thread
    from scepsy_serve.launch.drive import drive

    work.mkdir(parents=True, exist_ok=True)
    name, scale = parse_scaled(CPU_MODEL)
    model_dir = write_model_dir(engine_model(name, scale), work / "model")
    catalog = load_catalog(CPU_CATALOG)
    with catalog_in_force(catalog):
        specs = load_specs(workload)
    port = free_port()
    # the engine's scratch folder: short, for the IPC socket paths vLLM puts there (at most
    # 107 bytes; a test's tmp_path under pytest-xdist is longer than that allows)
    scratch = Path(tempfile.mkdtemp(prefix="scepsy-las-"))
    env = {**os.environ, **engine_environment(1, 1.0, "cpu", None, scratch, cores=[1])}
    cmd = ["taskset", "-c", "1", str(vllm_python().path), "-m",
           "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
           "--dtype", "bfloat16", "--max-model-len", "1040", "--max-num-seqs",
           str(max_num_seqs), "--disable-uvicorn-access-log", "--scheduling-policy", "priority",
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "m"]
    tic = time.monotonic()
    with open(work / "server.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited at start-up: {work / 'server.log'}")
            if time.monotonic() - tic > health_timeout_s:
                raise RuntimeError(f"the vLLM server was not healthy in {health_timeout_s:g} s")
            time.sleep(2)
        startup_s = time.monotonic() - tic
        routes = _engine_routes(specs, f"http://127.0.0.1:{port}", "m")
        runs = []
        with catalog_in_force(catalog), \
                gateway_in_thread(GatewayConfig(
                    record=RecordConfig(out=work / "fcfs.jsonl", routed=True, client_time=False),
                    routes=routes, priority="fcfs")) as g_fcfs, \
                gateway_in_thread(GatewayConfig(
                    record=RecordConfig(out=work / "las.jsonl", routed=True, client_time=False),
                    routes=routes, priority="las")) as g_las:
            gates = {"fcfs": _engine_routes(specs, g_fcfs, None),
                     "las": _engine_routes(specs, g_las, None)}
            drive(list(specs), gates["fcfs"], rate=rate, requests=5, seed=99, vocab=100)  # warm
            for priority, seed in ENGINE_ORDER:
                t = time.perf_counter()
                res = drive(list(specs), gates[priority], rate=rate, requests=requests,
                            seed=seed, vocab=100)
                ok = [o for o in res.requests if o.latency_s is not None]
                lat = {w: latency_stats([o.latency_s for o in ok if o.workflow == w])
                       for w in sorted({s.name for s in specs})}
                lat["all"] = latency_stats([o.latency_s for o in ok])
                for w in lat:
                    lat[w]["n"] = sum(1 for o in ok if w in ("all", o.workflow))
                runs.append({"priority": priority, "seed": seed,
                             "wall_s": time.perf_counter() - t,
                             "failed": len(res.requests) - len(ok), "latency_s": lat})
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone already (it exited at start-up)
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    return {"workload": _rel(workload), "rate": rate, "requests": requests,
            "max_num_seqs": max_num_seqs, "startup_s": startup_s, "port": port, "runs": runs}


def engine_table(doc: dict[str, Any]) -> str:
    """One line per drive and workflow (``all`` too): completed requests and latency."""
    lines = [{"priority": r["priority"], "seed": r["seed"], "workflow": w, "n": x["n"],
              "mean (s)": _f2(x["mean"]), "p50 (s)": _f2(x["p50"]), "p90 (s)": _f2(x["p90"]),
              "p99 (s)": _f2(x["p99"]), "failed": r["failed"], "wall (s)": f"{r['wall_s']:.0f}"}
             for r in doc["runs"] for w, x in r["latency_s"].items()]
    return format_table(lines, list(lines[0])) if lines else ""


def _f2(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else "-"


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


def _engine_main(args: argparse.Namespace, ap: argparse.ArgumentParser,
                 max_batches: tuple[int | None, ...]) -> int:
    if args.rate is None or not (math.isfinite(args.rate) and args.rate > 0):
        ap.error(f"--rate: a rate > 0 req/s (needed with --cpu-engine), got {args.rate}")
    if len(max_batches) != 1:
        ap.error("--max-batch: one value with --cpu-engine")
    import tempfile

    workload = args.workload.resolve() if args.workload else CPU_WORKLOAD
    with tempfile.TemporaryDirectory(prefix="las-engine-") as tmp:
        doc = engine_run(workload, rate=args.rate, requests=args.requests or 40,
                         max_num_seqs=max_batches[0] or 4, work=Path(tmp))
    print(f"{doc['workload']} on one vLLM CPU server, {doc['max_num_seqs']} sequences, "
          f"{doc['rate']:g} req/s, {doc['requests']} requests per drive; healthy after "
          f"{doc['startup_s']:.0f} s")
    print(engine_table(doc))
    if args.out is not None:
        from scepsy_common.files import atomic_write_text

        atomic_write_text(args.out, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


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
    ap.add_argument("--cpu-engine", action="store_true",
                    help="measure on one real vLLM CPU server instead (a few minutes)")
    ap.add_argument("--rate", type=float, default=None,
                    help="with --cpu-engine: the total arrival rate, req/s")
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
    if args.cpu_engine:
        return _engine_main(args, ap, max_batches)
    if args.rate is not None:
        ap.error("--rate: only with --cpu-engine (the simulator's loads are --loads)")
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
