"""``scepsy predict``: predicted throughput and latency of an allocation (Aggregate LLM Pipeline)."""

from __future__ import annotations

import argparse

from scepsy.cli.evaluate import (
    add_evaluation_flags,
    evaluation_request,
    option_names,
    print_document,
)
from scepsy.cli.util import naming as _naming


def _cmd_predict(args: argparse.Namespace) -> int:
    from scepsy import api
    from scepsy.evaluation import PredictRequest, predict_flag_fields

    fields = predict_flag_fields()
    request = evaluation_request(args, PredictRequest, fields)
    with _naming(option_names(fields)):
        pred = api.run_predict(request)
    doc = api.prediction_document(pred, request.form)
    print_document(doc, args.json,
                   ["rate", "throughput", "max_throughput", "bottleneck", "saturated",
                    "mean_latency_s", "p50_latency_s", "p90_latency_s", "p99_latency_s"],
                   ["model", "replicas", "rate", "mu", "utilisation", "call_latency_s", "ttft_s",
                    "tpot_s", "preemptions_per_call", "overloaded"])
    return 0


HELP = "predicted throughput and latency (Aggregate LLM Pipeline)"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scepsy predict`` and its options (the fields of
    :class:`scepsy.evaluation.PredictRequest`)."""
    from scepsy.evaluation import predict_flag_fields

    cmd = subparsers.add_parser("predict", help=HELP)
    add_evaluation_flags(cmd, predict_flag_fields())
    cmd.set_defaults(func=_cmd_predict)
    return cmd
