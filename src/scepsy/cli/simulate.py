"""``scepsy simulate``: simulated throughput and latency of an allocation (discrete events)."""

from __future__ import annotations

import argparse

from scepsy.cli.evaluate import (
    add_evaluation_flags,
    evaluation_request,
    option_names,
    print_document,
)
from scepsy.cli.util import naming as _naming


def _cmd_simulate(args: argparse.Namespace) -> int:
    from scepsy import api
    from scepsy.evaluation import SimulateRequest, simulate_flag_fields

    fields = simulate_flag_fields()
    request = evaluation_request(args, SimulateRequest, fields)
    with _naming(option_names(fields)):
        res = api.run_simulate(request)
    doc = api.simulation_document(res)
    print_document(doc, args.json,
                   ["throughput", "mean_latency_s", "p50_latency_s", "p90_latency_s",
                    "p99_latency_s", "completed", "unfinished"],
                   ["replicas", "calls", "utilisation", "mean_batch", "preemptions",
                    "preemptions_per_call"])
    return 0


HELP = "simulated throughput and latency (discrete events)"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scepsy simulate`` and its options (the fields of
    :class:`scepsy.evaluation.SimulateRequest`)."""
    from scepsy.evaluation import simulate_flag_fields

    cmd = subparsers.add_parser("simulate", help=HELP)
    add_evaluation_flags(cmd, simulate_flag_fields())
    cmd.set_defaults(func=_cmd_simulate)
    return cmd
