"""The ``scepsy`` command line.

User mistakes (bad files, unknown names) print one line ``scepsy: error: ...`` naming the file,
the field and what was expected, and exit with status 2; nothing is written in that case.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from scepsy.tables import format_table
from scepsy_opt.allocation import load_allocation
from scepsy_opt.pipeline import predict
from scepsy_opt.simulate import simulate
from scepsy_opt.stats import stats_table, stats_to_dict, trace_stats, workflow_stats
from scepsy_opt.traces import CallRecord, Trace, read_trace, validate_calls, write_trace
from scepsy_opt.workflows import WorkflowSpec, generate_trace, load_workload, parse_workflow
from scepsy_profile.catalog import default_catalog, load_catalog
from scepsy_profile.errors import InputError
from scepsy_profile.files import read_yaml
from scepsy_profile.fitted import fit_latency_model, load_curves, save_curves
from scepsy_profile.importers import load_muxserve_grid
from scepsy_profile.latency import CompositeLatencyModel, LatencyModel
from scepsy_profile.measurements import read_measurements
from scepsy_profile.roofline import load_calibration, roofline_model
from scepsy_profile.serving import MemoryPolicy, serving_curve

EXIT_INFEASIBLE = 1  # plan: no allocation meets the targets (proven)
EXIT_USAGE = 2
EXIT_TIME_LIMIT = 3  # plan: the time limit ran out before any (placeable) allocation was found


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"scepsy: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        sys.stderr.close()
        return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scepsy", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    prof = sub.add_parser("profile", help="latency profiles: fit curves, show them")
    psub = prof.add_subparsers(dest="profile_command", required=True)

    fit = psub.add_parser("fit", help="fit latency curves to measurements and write a curves file")
    src = fit.add_mutually_exclusive_group(required=True)
    src.add_argument("--muxserve", type=Path, help="a MuxServe grid JSON file")
    src.add_argument("--measurements", type=Path, help="a measurements JSON-lines file")
    fit.add_argument("--gpu", default="A100-80GB", help="GPU of a MuxServe grid (default %(default)s)")
    fit.add_argument("--out", type=Path, required=True, help="curves file to write (JSON)")
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--jobs", type=int, default=1, help="parallel fitting processes")
    fit.add_argument("--json", action="store_true", help="print the fit report as JSON")
    fit.set_defaults(func=_cmd_fit)

    show = psub.add_parser("show", help="table of prefill, decode, μ and memory over tp and share")
    show.add_argument("--model", required=True)
    show.add_argument("--gpu", required=True)
    show.add_argument("--curves", type=Path, help="fitted curves file (measured curves win)")
    show.add_argument("--catalog", type=Path, help="YAML catalog extending the bundled one")
    show.add_argument("--calibration", type=Path, help="roofline calibration YAML")
    show.add_argument("--tp", default="1,2,4,8", help="comma-separated TP degrees")
    show.add_argument("--shares", default="0.3,0.5,0.7,1.0", help="comma-separated GPU shares")
    show.add_argument("--batch", type=int, default=32, help="batch of the latency columns")
    show.add_argument("--seq", type=int, default=512, help="prompt / context length of the latency columns")
    show.add_argument("--input", type=float, default=512.0, help="mean input tokens per call (μ)")
    show.add_argument("--output", type=float, default=128.0, help="mean output tokens per call (μ)")
    show.add_argument("--json", action="store_true", help="print rows as JSON")
    show.set_defaults(func=_cmd_show)

    stats = sub.add_parser("stats", help="per-workflow, per-LLM statistics of a trace")
    stats.add_argument("trace", type=Path, help="a trace JSON-lines file")
    stats.add_argument("--seed", type=int, default=0, help="seed of the bootstrap halves")
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(func=_cmd_stats)

    trace = sub.add_parser("trace", help="workflow traces")
    tsub = trace.add_subparsers(dest="trace_command", required=True)
    gen = tsub.add_parser("generate", help="generate a trace from a workflow (or workload) YAML")
    gen.add_argument("--workflow", type=Path, required=True)
    gen.add_argument("--requests", type=int, required=True, help="requests per workflow")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", type=Path, required=True)
    gen.set_defaults(func=_cmd_trace_generate)

    for name, helptext in (("predict", "predicted throughput and latency (Aggregate LLM Pipeline)"),
                           ("simulate", "simulated throughput and latency (discrete events)")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("--workflow", type=Path, required=True, help="workflow or workload YAML")
        cmd.add_argument("--allocation", type=Path, required=True, help="allocation YAML/JSON")
        cmd.add_argument("--rate", type=float, required=True,
                         help="total arrival rate, req/s (split over a workload's weights)")
        cmd.add_argument("--trace", type=Path, help="recorded trace (default: generated)")
        cmd.add_argument("--trace-requests", type=int, default=2000,
                         help="requests per workflow of the generated trace")
        cmd.add_argument("--curves", type=Path, help="fitted curves (measured curves win)")
        cmd.add_argument("--seed", type=int, default=0)
        cmd.add_argument("--json", action="store_true")
        if name == "predict":
            cmd.add_argument("--form", choices=["critical-path", "paper"], default="critical-path")
            cmd.set_defaults(func=_cmd_predict)
        else:
            cmd.add_argument("--requests", type=int, default=2000, help="simulated arrivals")
            cmd.add_argument("--routing", choices=["round_robin", "least_loaded"],
                             default="round_robin")
            cmd.add_argument("--progress", action="store_true")
            cmd.set_defaults(func=_cmd_simulate)
    bench = sub.add_parser("bench", help="benchmarks on public traces")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    openb = bsub.add_parser("openb", help="online replay of the Alibaba GPU-sharing trace "
                                          "(allocation ratio and fragmentation per policy)")
    from scepsy_place.openb import add_arguments as _openb_arguments

    _openb_arguments(openb)
    openb.set_defaults(func=_cmd_bench_openb)

    plan = sub.add_parser("plan", help="optimal allocation for target throughputs (MILP)")
    plan.add_argument("--workflow", type=Path, required=True, help="workflow or workload YAML")
    plan.add_argument("--cluster", type=Path, required=True, help="cluster YAML/JSON")
    plan.add_argument("--target", action="append", required=True, metavar="RATE|WORKFLOW=RATE",
                      help="target throughput, req/s: a total split over a workload's weights, "
                           "or per workflow (repeat the flag)")
    plan.add_argument("--optimiser", default="milp",
                      help="milp (default), brute-force, heuristic, independent, equal-split")
    plan.add_argument("--formulation", choices=["auto", "aggregate", "blocks"], default="auto",
                      help="aggregate: MILP then place, cut and re-solve; blocks: whole-GPU blocks "
                           "of one LLM each, placeable by construction; auto (default): both up "
                           "to 64 GPUs, the better placed plan wins, blocks above")
    plan.add_argument("--placer", default="hierarchical",
                      help="placement policy of the aggregate formulation: hierarchical "
                           "(default), ffd, best-fit")
    plan.add_argument("--spread-replicas", action="store_true",
                      help="place replicas of one LLM on different nodes when possible")
    plan.add_argument("--max-rounds", type=int, default=25,
                      help="optimise-place rounds before giving up (default %(default)s)")
    plan.add_argument("--objective", choices=["min-latency", "max-throughput"],
                      default="min-latency")
    plan.add_argument("--latency-bound", action="append", default=[], metavar="[WORKFLOW=]SECONDS",
                      help="max-throughput mode: bound on a workflow's mean latency")
    plan.add_argument("--current", type=Path, help="current allocation (or plan.json) to re-plan from")
    plan.add_argument("--change-penalty", type=float, default=0.0,
                      help="objective seconds per replica started or stopped (with --current)")
    plan.add_argument("--shares", default=None, help="comma-separated share grid (default tenths)")
    plan.add_argument("--tp", default="1,2,4,8", help="comma-separated TP degrees")
    plan.add_argument("--max-utilisation", type=float, default=0.95)
    plan.add_argument("--time-limit", type=float, default=60.0,
                      help="time limit of the whole plan, s (default %(default)s; exit 3 when it "
                           "runs out before any allocation is found)")
    plan.add_argument("--gap", type=float, default=0.0, help="relative optimality gap to stop at")
    plan.add_argument("--trace", type=Path, help="recorded trace (default: generated)")
    plan.add_argument("--trace-requests", type=int, default=2000)
    plan.add_argument("--curves", type=Path, help="fitted curves (measured curves win)")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--out", type=Path, default=Path("plan.json"), help="default %(default)s")
    plan.add_argument("--no-timings", action="store_true",
                      help="leave wall-clock timings out of plan.json (byte-identical reruns)")
    plan.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    plan.set_defaults(func=_cmd_plan)
    return p


def _cmd_bench_openb(args: argparse.Namespace) -> int:
    from scepsy_place.openb import run_cli

    return run_cli(args)


def _per_workflow(values: Sequence[str], names: Sequence[str], flag: str,
                  split: dict[str, float] | None) -> dict[str, float]:
    """``RATE`` (split by ``split`` weights, or the same for all) or ``NAME=RATE`` entries."""
    out: dict[str, float] = {}
    for v in values:
        name, _, num = v.rpartition("=")
        try:
            x = float(num)
        except ValueError:
            raise InputError(flag, name or "", "a number (or WORKFLOW=NUMBER)", v) from None
        _positive(x, flag)
        if name:
            if name not in names:
                raise InputError(flag, name, f"a workflow of the workload ({', '.join(names)})", v)
            out[name] = x
        elif split is not None:
            out.update({w: x * f for w, f in split.items()})
        else:
            out.update(dict.fromkeys(names, x))
    return out


def _cmd_plan(args: argparse.Namespace) -> int:
    from scepsy_opt.planfile import dumps, plan_rows, write_plan
    from scepsy_opt.planning import PlanningProblem, PlanOptions, time_limit_detail
    from scepsy_place.loop import plan_and_place, plan_document
    from scepsy_place.placement import PLACERS
    from scepsy_place.topology import load_topology

    specs = _specs(args.workflow)
    names = [s.name for s in specs]
    weight = sum(s.weight for s in specs)
    targets = _per_workflow(args.target, names, "--target",
                            {s.name: s.weight / weight for s in specs})
    bounds = _per_workflow(args.latency_bound, names, "--latency-bound", None)
    if args.placer not in PLACERS:
        raise InputError("--placer", "", f"one of {', '.join(sorted(PLACERS))}", args.placer)
    _positive(args.max_rounds, "--max-rounds", integer=True)
    topology = load_topology(args.cluster)
    cluster = topology.to_cluster()
    shares = _floats(args.shares, "--shares") if args.shares else None
    tps = tuple(_ints(args.tp, "--tp"))
    current = load_allocation(args.current) if args.current else None
    kw = {"shares": tuple(shares)} if shares else {}
    opts = PlanOptions(tps=tps, max_utilisation=args.max_utilisation, objective=args.objective,
                       latency_bound_s=bounds, current=current, change_penalty_s=args.change_penalty,
                       time_limit_s=args.time_limit, gap_rel=args.gap, **kw)
    trace = _trace_for(args, specs)
    stats = {s.name: workflow_stats(trace, s.name, seed=args.seed) for s in specs}
    problem = PlanningProblem(stats, _models(specs), targets, cluster, _latency(args), opts)
    opts_place = {"spread_replicas": True} if args.spread_replicas else {}
    res = plan_and_place(problem, topology, name=args.optimiser, policy=args.placer,
                         max_rounds=args.max_rounds, placer_options=opts_place,
                         formulation=args.formulation)
    plan = res.answer  # never hand on an allocation that is not placed
    policy = ((res.placement.placed_by or res.placement.policy) if res.placement is not None
              else args.placer)  # the placer whose placement it is (`exact`: the exact test)
    doc = plan_document(problem, res, policy=args.placer, timings=not args.no_timings)
    write_plan(args.out, doc)
    if args.json:
        print(dumps(doc), end="")
    elif plan.allocation is not None:
        print(format_table([{k: _round(v) for k, v in r.items()} for r in plan_rows(problem, plan)],
                           ["llm", "model", "gpu", "tp", "share", "replicas", "gpus", "mu_calls_s",
                            "call_latency_s", "latency_share"]))
        print()
        print(format_table([{"workflow": w, **{k: _round(v) for k, v in o.items()}}
                            for w, o in doc["workflows"].items()],
                           ["workflow", "throughput", "mean_latency_s"]))
        st = plan.stats
        print(f"\n{plan.optimiser}: {plan.status}, objective {plan.objective_s:.6g} s, gap "
              f"{plan.gap:.3g}, candidates {st.get('candidates_generated', '-')} -> "
              f"{st.get('candidates_kept', '-')}, {st.get('total_s', 0.0):.3f} s")
        q = res.quality or {}
        tried = ", ".join(f"{k} {o.objective_s:.6g} s" if o.status == "placed" else
                          f"{k} {o.status}" for k, o in res.compared.items())
        print(f"{res.formulation} formulation" + (f" (of {tried})" if tried else "")
              + f", placed by {policy} in {res.rounds} round(s): {q.get('gpus_used')} GPUs "
              f"(bound {q.get('bound_l2')}), {q.get('nodes_used')} nodes (bound "
              f"{q.get('bound_nodes')}); wrote {args.out}")
    if plan.status == "time_limit_no_solution":
        print(f"scepsy: {plan.status}: {time_limit_detail(args.time_limit)} (wrote {args.out})",
              file=sys.stderr)
        return EXIT_TIME_LIMIT
    if plan.allocation is None:
        why = (res.reason if res.reason else plan.infeasible.detail if plan.infeasible
               else "no allocation meets the targets")
        print(f"scepsy: {plan.status}: {why} (wrote {args.out})", file=sys.stderr)
        return EXIT_INFEASIBLE
    return 0


def _cmd_fit(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise InputError("--jobs", "", "an integer >= 1", args.jobs)
    rows = (load_muxserve_grid(args.muxserve, gpu=args.gpu) if args.muxserve
            else read_measurements(args.measurements))
    model = fit_latency_model(rows, seed=args.seed, n_jobs=args.jobs)
    save_curves(model, args.out)
    reports = [
        {"model": r.key[0], "gpu": r.key[1], "tp": r.key[2], "phase": r.key[3],
         "points": r.n_points, "outliers": r.n_outliers,
         "train_median_ape_pct": round(100 * r.train_median_ape, 3),
         "monotone_adjust_max_pct": round(100 * r.monotone_adjust_max, 3)}
        for r in model.reports
    ]
    if args.json:
        print(json.dumps({"out": str(args.out), "curves": reports}, indent=2, sort_keys=True))
    else:
        print(format_table(reports, ["model", "gpu", "tp", "phase", "points", "outliers",
                               "train_median_ape_pct", "monotone_adjust_max_pct"]))
        print(f"wrote {len(reports)} curves to {args.out}")
    return 0


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(flag, "", "comma-separated integers", text) from None
    if not vals or min(vals) < 1:
        raise InputError(flag, "", "comma-separated integers >= 1", text)
    return vals


def _floats(text: str, flag: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(flag, "", "comma-separated numbers", text) from None
    if not vals or any(not 0 < v <= 1 for v in vals):
        raise InputError(flag, "", "comma-separated shares in (0, 1]", text)
    return vals


def _cmd_show(args: argparse.Namespace) -> int:
    catalog = default_catalog()
    if args.catalog:
        catalog = load_catalog(args.catalog, base=catalog)
    cal = load_calibration(args.calibration) if args.calibration else None
    roof = roofline_model(catalog, cal)
    latency: LatencyModel = roof
    fitted = load_curves(args.curves) if args.curves else None
    if fitted is not None:
        latency = CompositeLatencyModel(fitted, roof)
    tps, shares = _ints(args.tp, "--tp"), _floats(args.shares, "--shares")
    for flag, v in (("--batch", args.batch), ("--seq", args.seq), ("--input", args.input),
                    ("--output", args.output)):
        if not v >= 1:  # also catches nan
            raise InputError(flag, "", "a number >= 1", v)
    spec = catalog.model(args.model)  # clear error for unknown names, before any row
    gpu = catalog.gpu(args.gpu)
    # measured curves keep their own model names; the catalog resolves aliases for the rest
    name = args.model if fitted is not None and args.model in fitted.models() else spec.name
    rows = []
    for tp in tps:
        if not spec.supports_tp(tp) or tp > gpu.nvlink_domain:
            continue
        for share in shares:
            src = "fitted" if fitted is not None and fitted.covers(name, gpu.name, tp) else "roofline"
            curve = serving_curve(latency, name, gpu.name, tp, share, args.input, args.output,
                                  catalog=catalog, policy=MemoryPolicy())
            rows.append({
                "tp": tp, "share": share, "source": src,
                "prefill_ms": round(float(latency.prefill_ms(name, gpu.name, tp, share, args.batch, args.seq)), 3),
                "decode_ms": round(float(latency.decode_ms(name, gpu.name, tp, share, args.batch, args.seq)), 3),
                "mu_calls_s": round(curve.mu, 4), "max_batch": curve.max_batch,
                "weights_gib": round(curve.memory.weights_gib, 2),
                "kv_gib": round(curve.memory.kv_gib, 2), "fits": curve.memory.feasible,
            })
    if not rows:
        raise InputError("--tp", "", f"a TP degree that {spec.name} supports on {gpu.name} "
                         f"(NVLink domain {gpu.nvlink_domain})", args.tp)
    if args.json:
        print(json.dumps({"model": args.model, "gpu": gpu.name, "batch": args.batch,
                          "seq": args.seq, "input_tokens": args.input,
                          "output_tokens": args.output, "rows": rows}, indent=2, sort_keys=True))
    else:
        print(f"{args.model} on {gpu.name}: latency at batch {args.batch}, {args.seq} tokens; "
              f"μ for calls of {args.input:g} in / {args.output:g} out tokens")
        print(format_table(rows, list(rows[0])))
    return 0


def _positive(value: float, flag: str, integer: bool = False) -> None:
    if not (value > 0 and math.isfinite(value)) or (integer and int(value) != value):
        raise InputError(flag, "", "a positive integer" if integer else "a number > 0", value)


def _specs(path: Path) -> tuple[WorkflowSpec, ...]:
    """A workflow YAML, or a workload YAML (``workflows: [...]``) of several."""
    raw = read_yaml(path, "workflow or workload file (.yaml)")
    if isinstance(raw, dict) and "workflows" in raw:
        return load_workload(path)  # resolves its workflow files relative to itself
    return (parse_workflow(raw, str(path)),)


def _models(specs: Sequence[WorkflowSpec]) -> dict[str, str]:
    return {name: model for spec in specs for name, model in spec.llms.items()}


def _trace_for(args: argparse.Namespace, specs: Sequence[WorkflowSpec]) -> Trace:
    if args.trace:
        trace = read_trace(args.trace)
        missing = sorted({s.name for s in specs} - set(trace.workflows()))
        if missing:
            raise InputError(str(args.trace), "workflow", f"calls of workflow(s) {missing}")
        return trace
    _positive(args.trace_requests, "--trace-requests", integer=True)
    calls: list[CallRecord] = []
    for i, spec in enumerate(specs):
        calls.extend(generate_trace(spec, args.trace_requests, seed=args.seed + i))
    return validate_calls(calls)


def _rates(specs: Sequence[WorkflowSpec], total: float) -> dict[str, float]:
    weight = sum(s.weight for s in specs)
    return {s.name: total * s.weight / weight for s in specs}


def _latency(args: argparse.Namespace) -> LatencyModel:
    roof = roofline_model()
    return CompositeLatencyModel(load_curves(args.curves), roof) if args.curves else roof


def _cmd_trace_generate(args: argparse.Namespace) -> int:
    _positive(args.requests, "--requests", integer=True)
    specs = _specs(args.workflow)
    calls: list[CallRecord] = []
    for i, spec in enumerate(specs):
        calls.extend(generate_trace(spec, args.requests, seed=args.seed + i))
    write_trace(args.out, calls)
    print(f"wrote {len(calls)} calls of {args.requests * len(specs)} requests to {args.out}")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    stats = trace_stats(read_trace(args.trace), seed=args.seed)
    if args.json:
        print(json.dumps(stats_to_dict(stats), indent=2, sort_keys=True))
        return 0
    rows = stats_table(stats)
    print(format_table(rows, list(rows[0])))
    print()
    print(format_table([{
        "workflow": w, "requests": st.requests, "latency_mean_s": round(st.latency_mean_s, 3),
        "latency_cv": round(st.latency_cv, 3),
        "max_share_cv_requests": round(max(x.time_share_cv_requests for x in st.llms.values()), 3),
        "max_share_cv_halves": round(max(x.time_share_cv_halves for x in st.llms.values()), 4),
        "llm_overlap": round(st.llm_overlap, 3), "tool_critical_s": round(st.tool_critical_s, 3),
    } for w, st in stats.items()], ["workflow", "requests", "latency_mean_s", "latency_cv",
                                     "max_share_cv_requests", "max_share_cv_halves",
                                     "llm_overlap", "tool_critical_s"]))
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    _positive(args.rate, "--rate")
    specs = _specs(args.workflow)
    alloc = load_allocation(args.allocation)
    trace = _trace_for(args, specs)
    stats = {s.name: workflow_stats(trace, s.name, seed=args.seed) for s in specs}
    pred = predict(stats, _models(specs), alloc, _latency(args), _rates(specs, args.rate),
                   form=args.form)
    out = {w: {"rate": p.rate, "throughput": min(p.rate, p.max_throughput),
               "max_throughput": p.max_throughput, "bottleneck": p.bottleneck,
               "mean_latency_s": p.mean_latency_s} for w, p in pred.workflows.items()}
    llms = {m: {"model": ld.model, "rate": ld.rate, "replicas": ld.replicas, "mu": ld.mu,
                "utilisation": ld.utilisation, "call_latency_s": ld.call_latency_s}
            for m, ld in pred.llms.items()}
    if args.json:
        print(json.dumps({"form": args.form, "workflows": out, "llms": llms}, indent=2,
                         sort_keys=True, default=_json_float))
    else:
        print(format_table([{"workflow": w, **{k: _round(v) for k, v in o.items()}}
                            for w, o in out.items()],
                           ["workflow", "rate", "throughput", "max_throughput", "bottleneck",
                            "mean_latency_s"]))
        print()
        print(format_table([{"llm": m, **{k: _round(v) for k, v in o.items()}}
                            for m, o in llms.items()],
                           ["llm", "model", "replicas", "rate", "mu", "utilisation",
                            "call_latency_s"]))
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    _positive(args.rate, "--rate")
    _positive(args.requests, "--requests", integer=True)
    specs = _specs(args.workflow)
    alloc = load_allocation(args.allocation)
    trace = _trace_for(args, specs)
    res = simulate(trace, _models(specs), alloc, _latency(args), _rates(specs, args.rate),
                   requests=args.requests, seed=args.seed, routing=args.routing,
                   progress=args.progress)
    out = {w: {"throughput": m.throughput, "mean_latency_s": m.mean_latency_s,
               "p50_latency_s": m.p50_latency_s, "p90_latency_s": m.p90_latency_s,
               "p99_latency_s": m.p99_latency_s, "completed": m.completed,
               "unfinished": m.unfinished} for w, m in res.workflows.items()}
    llms = {m: {"replicas": x.replicas, "calls": x.calls, "utilisation": x.utilisation,
                "mean_batch": x.mean_batch} for m, x in res.llms.items()}
    if args.json:
        print(json.dumps({"workflows": out, "llms": llms, "llm_calls": res.llm_calls,
                          "events": res.events}, indent=2, sort_keys=True, default=_json_float))
    else:
        print(format_table([{"workflow": w, **{k: _round(v) for k, v in o.items()}}
                            for w, o in out.items()],
                           ["workflow", "throughput", "mean_latency_s", "p50_latency_s",
                            "p90_latency_s", "p99_latency_s", "completed", "unfinished"]))
        print()
        print(format_table([{"llm": m, **{k: _round(v) for k, v in o.items()}}
                            for m, o in llms.items()],
                           ["llm", "replicas", "calls", "utilisation", "mean_batch"]))
    return 0


def _round(v: object) -> object:
    return round(v, 4) if isinstance(v, float) and math.isfinite(v) else v


def _json_float(o: object) -> object:
    raise TypeError(type(o))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
