"""``scepsy plan``: one flag per field of the plan request (:mod:`scepsy_place.request`), then the
outputs; plans, writes plan.json and prints its tables."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scepsy.cli import EXIT_INFEASIBLE, EXIT_TIME_LIMIT
from scepsy.cli.util import UsageError, check_out, wrote_note
from scepsy.cli.util import latency_bounds as _latency_bounds
from scepsy.cli.util import naming as _naming
from scepsy.cli.util import per_workflow as _per_workflow
from scepsy.cli.util import print_rows as _print_table


def _plan_args(plan: argparse.ArgumentParser) -> None:
    """The options of ``scepsy plan``: one per field of the plan request
    (:mod:`scepsy_place.request`, its docstrings the help), then the output's."""
    from scepsy.cli.fields import add_request_flags
    from scepsy_place.request import flag_fields

    add_request_flags(plan, flag_fields())
    plan.add_argument("--out", type=Path, default=Path("plan.json"), help="default %(default)s")
    plan.add_argument("--launch", metavar="TARGET[,TARGET...]",
                      help="also render the written plan for launch targets (shell, k8s, ray, "
                      "routes; see scepsy launch)")
    plan.add_argument("--launch-out", type=Path, metavar="DIR",
                      help="folder of the rendered files (default launch-TARGET beside --out; "
                      "with several targets, DIR/TARGET)")
    plan.add_argument("--no-timings", action="store_true",
                      help="leave wall-clock timings out of plan.json (byte-identical reruns)")
    plan.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    plan.add_argument("--quiet", action="store_true", help="no progress display on stderr")
    plan.set_defaults(func=_cmd_plan)


def _prices(values: Sequence[str]) -> dict[str, float] | None:
    """``--price GPU=USD`` entries (None without any)."""
    from scepsy_common.errors import InputError
    from scepsy_opt.cluster import PRICE_EXPECTED, check_price

    out: dict[str, float] = {}
    for v in values:
        name, _, num = v.partition("=")
        try:
            usd = check_price(float(num), "--price", name)
        except (ValueError, InputError):
            raise UsageError(f"--price: expected GPU=USD with {PRICE_EXPECTED} (got {v!r})"
                             ) from None
        gpu = name.strip()
        if not gpu:
            raise UsageError(f"--price: expected GPU=USD with a GPU type (got {v!r})")
        if gpu.casefold() in {g.casefold() for g in out}:
            raise UsageError(f"--price: expected one price per GPU type ({gpu} is given twice: "
                             f"{out[next(g for g in out if g.casefold() == gpu.casefold())]:g} "
                             f"and {usd:g})")
        out[gpu] = usd
    return out or None


_LAUNCH_FLAGS = {"launch": "--launch", "launch-out": "--launch-out"}


def _launch_folders(args: argparse.Namespace) -> dict[str, Path]:
    """``--launch T1,T2`` -> each target's folder: ``--launch-out DIR`` for one target,
    ``DIR/TARGET`` for several; by default ``launch-TARGET`` beside ``--out``."""
    if args.launch is None:
        if args.launch_out is not None:
            raise UsageError(f"--launch-out: expected together with --launch TARGET (got "
                             f"{str(args.launch_out)!r})")
        return {}
    targets = [t.strip() for t in args.launch.split(",")]
    if not all(targets) or len(set(targets)) != len(targets):
        raise UsageError(f"--launch: expected a target or a comma-separated list of distinct "
                         f"targets (got {args.launch!r})")
    if args.launch_out is None:
        return {t: args.out.parent / f"launch-{t}" for t in targets}
    if len(targets) == 1:
        return {targets[0]: args.launch_out}
    return {t: args.launch_out / t for t in targets}


def plan_request(args: argparse.Namespace) -> Any:
    """The :class:`~scepsy_place.request.PlanRequest` of ``scepsy plan``'s options."""
    from scepsy.cli.fields import given_fields
    from scepsy_place.request import PlanRequest, flag_fields, request_data

    given = given_fields(args, flag_fields(), {"rates": lambda v: _per_workflow(v, "--target"),
                                               "prices": _prices,
                                               "latency-bounds": _latency_bounds})
    return PlanRequest.of(request_data(given))


def _cmd_plan(args: argparse.Namespace) -> int:
    from scepsy import api
    from scepsy.tables import progress
    from scepsy_opt.planning.planfile import dumps
    from scepsy_place.request import flag_names
    from scepsy_serve.launch.planfile import write_plan_file

    check_out(args.out)
    launches = _launch_folders(args)
    for target, folder in launches.items():
        with _naming(_LAUNCH_FLAGS):
            api.check_launch(target, folder)
    flags = flag_names()
    with _naming(flags):
        request = plan_request(args)
    with progress("planning", quiet=args.quiet or args.json) as bar, _naming(flags):
        res = api.run_plan(request, progress=lambda stage: bar.update(description=stage))
    doc = res.to_dict(timings=not args.no_timings)
    # the document printed below, built once; a failed run goes beside a placed plan at --out
    written = write_plan_file(args.out, doc)
    plan = res.plan
    if args.json:
        print(dumps(doc), end="")
    elif plan.allocation is not None:
        _print_plan(res, doc, args)
    for target, folder in launches.items() if plan.allocation is not None else ():
        with _naming(_LAUNCH_FLAGS):
            written = api.render(args.out, target, folder)
        print(f"rendered {target} files of {args.out} into {written}",
              file=sys.stderr if args.json else sys.stdout)
    if plan.status == "time_limit_no_solution":
        from scepsy_opt.planning.problem import time_limit_detail

        print(f"scepsy: {plan.status}: {time_limit_detail(request.search.time_limit_s)} "
              f"({wrote_note(args.out, written)})", file=sys.stderr)
        return EXIT_TIME_LIMIT
    if plan.allocation is None:
        why = (res.placed.reason if res.placed.reason else plan.infeasible.detail
               if plan.infeasible else "no allocation meets the targets")
        print(f"scepsy: {plan.status}: {why} ({wrote_note(args.out, written)})",
              file=sys.stderr)
        return EXIT_INFEASIBLE
    return 0


def plan_summary(res: Any, out: str, slos: dict[str, Any] | None = None) -> list[str]:
    """The lines under the plan's tables: the objective and its value, the targets and the
    cluster, how the plan was found (formulation, optimiser, status) and its placement."""
    plan, placed, problem = res.plan, res.placed, res.problem
    opts = problem.options
    lines = []
    kind = opts.kind
    if kind.scales_targets:
        lines.append(f"objective: the largest fraction of the targets carried: {plan.scale:.6g}"
                     + (f" (latency bounds {dict(opts.latency_bound_s)} s)"
                        if opts.latency_bound_s else ""))
    elif kind.priced:
        st = plan.stats
        used = ", ".join(f"{n} × {g}" for g, n in (st.placed_gpus or {}).items())
        buy = st.nodes_to_buy
        lines.append(f"objective: the price of the GPUs used: {st.placed_cost_per_hour or 0:.6g}"
                     f" USD/h ({used}); aggregate bound {st.cost_bound_per_hour or 0:.6g} "
                     f"USD/h (gap {st.placed_cost_gap or 0:.3g})"
                     + (f" subject to mean latencies {dict(opts.latency_bound_s)} s"
                        if opts.latency_bound_s else "")
                     + (f"; nodes to buy: {buy}" if buy else ""))
    else:
        weights = ", ".join(f"{w} {problem.weight(w):g}" for w in problem.targets)
        penalty = (f" + {opts.change_penalty_s:g} s per replica started or stopped"
                   if opts.current is not None and opts.change_penalty_s else "")
        lines.append(f"objective: the weighted sum of the workflows' mean predicted latencies "
                     f"(weights {weights}){penalty} = {plan.objective_s:.6g} s")
    pct = getattr(opts, "latency_bounds", None)
    if pct:
        lines[-1] += " subject to " + ", ".join(f"{w} p{q:g} <= {b:g} s"
                                                for w, (q, b) in pct.items())
    for m, c in (slos or {}).items():
        got = (f"ttft {c['predicted_ttft_s']:.4g} s" if c.get("ttft_s") is not None else "",
               f"tpot {c['predicted_tpot_s']:.4g} s" if c.get("tpot_s") is not None else "")
        lines.append(f"SLO {m}: {opts.slos[m].describe()}; predicted " + ", ".join(
            g for g in got if g) + f"; attainment {c['attainment']:.1%}"
            + ("" if c["met"] else " (missed)"))
    splits = plan.allocation.splits if plan.allocation is not None else {}
    lengths = plan.allocation.lengths if plan.allocation is not None else {}
    for m, parts in splits.items():
        if m in lengths:
            ranges = lengths[m]
            lines.append(f"{m} runs on several GPU types, routed by prompt length: " + ", ".join(
                f"{g} prompts of {ranges[g][0]} to "
                f"{'any' if ranges[g][1] is None else ranges[g][1] - 1} tokens "
                f"({parts[g]:.4g} of its calls)"
                for g in sorted(parts, key=lambda g: ranges[g][0])))
            continue
        lines.append(f"{m} runs on several GPU types: " + ", ".join(
            f"{g} {f:.4g} of its calls" for g, f in parts.items()))
    targets = ", ".join(f"{w} {t:g}" for w, t in problem.targets.items())
    gpus = ", ".join(f"{n} × {g}" for g, n in problem.cluster.budgets().items())
    lines.append(f"targets (req/s): {targets}; cluster {problem.cluster.name}: {gpus}")
    if res.peak is not None:
        lines.append(f"targets from {res.peak.describe()}")
    st = plan.stats
    priced = (st.placed_costs_per_hour or {}) if kind.priced else {}
    tried = ", ".join(f"{k} {priced[k]:.6g} USD/h" if k in priced else
                      f"{k} {o.objective_s:.6g} s" if o.status == "placed" else f"{k} {o.status}"
                      for k, o in placed.compared.items())
    if placed.formulation == "current":
        how = "kept the current allocation (priced lower than any new plan)"
    else:
        scope = {"blocks": " among whole-GPU-block allocations",
                 "aggregate": "" if placed.exact else
                 " (not proven the cheapest placeable: inexact cuts were needed)"}
        if kind.priced:
            scope["aggregate"] = " (the cheapest allocation in aggregate, then placed)"
            scope["mixed"] = " (LLMs split over GPU types)"
        if not kind.priced and set(placed.compared) - {"current"}:
            scope = {}  # auto: its status and gap hold over the whole candidate grid
        gap = f"gap {plan.gap:.3g}" if math.isfinite(plan.gap) else "no proven gap"
        how = (f"{placed.formulation} formulation, optimiser {plan.optimiser}: {plan.status}"
               f"{scope.get(placed.formulation, '')}, {gap}, candidates "
               f"{_or_dash(st.candidates_generated)} -> {_or_dash(st.candidates_kept)}")
    lines.append(how + (f"; compared: {tried}" if tried else ""))
    q = placed.quality or {}
    pl = placed.placement
    by = (pl.placed_by or pl.policy) if pl is not None else res.placer
    lines.append(f"placed by {by} in {placed.rounds} round(s): {q.get('gpus_used')} GPUs "
                 f"(bound {q.get('bound_l2')}), {q.get('nodes_used')} nodes (bound "
                 f"{q.get('bound_nodes')}), {st.get('total_s', 0.0):.3f} s; wrote {out}")
    return lines


def _print_plan(res: Any, doc: dict[str, Any], args: argparse.Namespace) -> None:
    from scepsy_opt.planning.planfile import plan_rows

    memory = ["memory"] if res.problem.options.memory_shares is not None else []
    _print_table(plan_rows(res.problem, res.plan),
                 ["llm", "model", "gpu", "tp", "share", *memory, "replicas", "gpus",
                  "mu_calls_s", "call_latency_s", "latency_share"])
    print()
    _print_table([{"workflow": w, **o} for w, o in doc["workflows"].items()],
                 ["workflow", "throughput", "mean_latency_s"])
    print()
    print("\n".join(plan_summary(res, str(args.out), doc["solver"].get("slos"))))
    for beyond in res.extrapolated_shares.values():  # latencies beyond the measured shares
        print(f"scepsy: warning: {beyond.message()}", file=sys.stderr, flush=True)


HELP = "optimal allocation for target throughputs (MILP)"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scepsy plan`` and its options."""
    cmd = subparsers.add_parser("plan", help=HELP)
    _plan_args(cmd)
    return cmd


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)
