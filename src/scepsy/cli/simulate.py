"""``scepsy simulate``: simulated throughput and latency of an allocation (discrete events)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scepsy.cli.argtypes import COUNT, POSITIVE
from scepsy.cli.evaluate import _EVAL_FLAGS, _engine, _evaluate_args
from scepsy.cli.util import UsageError
from scepsy.cli.util import json_float as _json_float
from scepsy.cli.util import naming as _naming
from scepsy.cli.util import print_rows as _print_table


def _simulate_args(cmd: argparse.ArgumentParser) -> None:
    from scepsy.api import DEFAULT_TRACE_REQUESTS
    from scepsy_opt.prediction.simulate import ROUTINGS

    _evaluate_args(cmd)
    cmd.add_argument("--requests", type=COUNT, default=None,
                     help=f"simulated arrivals (default {DEFAULT_TRACE_REQUESTS}; with "
                          "--arrivals: all of them)")
    cmd.add_argument("--arrivals", type=Path, metavar="FILE",
                     help="replay these recorded arrival times instead of Poisson arrivals: "
                          "JSON lines with a timestamp in ms (Mooncake) or one time in seconds "
                          "per line (docs/arrivals.md)")
    cmd.add_argument("--time-scale", type=POSITIVE, default=1.0, metavar="X",
                     help="replay --arrivals X times as fast (default 1)")
    cmd.add_argument("--routing", choices=ROUTINGS, default=ROUTINGS[0])
    cmd.add_argument("--progress", action="store_true")
    cmd.set_defaults(func=_cmd_simulate)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from scepsy import api

    with _naming(_EVAL_FLAGS):
        if args.time_scale != 1.0 and args.arrivals is None:
            raise UsageError(f"--time-scale: expected together with --arrivals FILE (got "
                             f"{args.time_scale:g})")
        res = api.simulate(args.workflow, args.allocation, args.rate, requests=args.requests,
                           arrivals=args.arrivals, time_scale=args.time_scale,
                           routing=args.routing, trace=args.trace,
                           trace_requests=args.trace_requests, seed=args.seed,
                           curves=args.curves, overheads=args.overheads,
                           engine=_engine(args), progress=args.progress, catalog=args.catalog)
    doc = api.simulation_document(res)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=_json_float))
        return 0
    _print_table([{"workflow": w, **o} for w, o in doc["workflows"].items()],
                 ["workflow", "throughput", "mean_latency_s", "p50_latency_s",
                  "p90_latency_s", "p99_latency_s", "completed", "unfinished"])
    print()
    _print_table([{"llm": m, **o} for m, o in doc["llms"].items()],
                 ["llm", "replicas", "calls", "utilisation", "mean_batch", "preemptions", "preemptions_per_call"])
    return 0


HELP = "simulated throughput and latency (discrete events)"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scepsy simulate`` and its options."""
    cmd = subparsers.add_parser("simulate", help=HELP)
    _simulate_args(cmd)
    return cmd
