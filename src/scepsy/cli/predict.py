"""``scepsy predict``: predicted throughput and latency of an allocation (Aggregate LLM Pipeline)."""

from __future__ import annotations

import argparse
import json

from scepsy.cli.evaluate import _EVAL_FLAGS, _engine, _evaluate_args
from scepsy.cli.util import json_float as _json_float
from scepsy.cli.util import naming as _naming
from scepsy.cli.util import print_rows as _print_table


def _predict_args(cmd: argparse.ArgumentParser) -> None:
    from scepsy_opt.prediction.pipeline import FORMS

    _evaluate_args(cmd)
    cmd.add_argument("--form", choices=FORMS, default="critical-path")
    cmd.set_defaults(func=_cmd_predict)


def _cmd_predict(args: argparse.Namespace) -> int:
    from scepsy import api

    with _naming(_EVAL_FLAGS):
        pred = api.predict(args.workflow, args.allocation, args.rate, form=args.form,
                           trace=args.trace, trace_requests=args.trace_requests, seed=args.seed,
                           curves=args.curves, overheads=args.overheads,
                           engine=_engine(args), catalog=args.catalog)
    doc = api.prediction_document(pred, args.form)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=_json_float))
        return 0
    _print_table([{"workflow": w, **o} for w, o in doc["workflows"].items()],
                 ["workflow", "rate", "throughput", "max_throughput", "bottleneck", "saturated",
                  "mean_latency_s", "p50_latency_s", "p90_latency_s", "p99_latency_s"])
    print()
    _print_table([{"llm": m, **o} for m, o in doc["llms"].items()],
                 ["llm", "model", "replicas", "rate", "mu", "utilisation", "call_latency_s",
                  "ttft_s", "tpot_s", "preemptions_per_call", "overloaded"])
    return 0


HELP = "predicted throughput and latency (Aggregate LLM Pipeline)"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scepsy predict`` and its options."""
    cmd = subparsers.add_parser("predict", help=HELP)
    _predict_args(cmd)
    return cmd
