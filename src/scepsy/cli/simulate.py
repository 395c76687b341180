"""``scepsy simulate``: simulated throughput and latency of an allocation (discrete events)."""

from __future__ import annotations

import argparse
import json

from scepsy.cli.evaluate import add_evaluation_flags, evaluation_request, option_names
from scepsy.cli.util import json_float as _json_float
from scepsy.cli.util import naming as _naming
from scepsy.cli.util import print_rows as _print_table


def _cmd_simulate(args: argparse.Namespace) -> int:
    from scepsy import api
    from scepsy.evaluation import SimulateRequest, simulate_flag_fields

    fields = simulate_flag_fields()
    request = evaluation_request(args, SimulateRequest, fields)
    with _naming(option_names(fields)):
        res = api.run_simulate(request)
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
    """Add ``scepsy simulate`` and its options (the fields of
    :class:`scepsy.evaluation.SimulateRequest`)."""
    from scepsy.evaluation import simulate_flag_fields

    cmd = subparsers.add_parser("simulate", help=HELP)
    add_evaluation_flags(cmd, simulate_flag_fields())
    cmd.set_defaults(func=_cmd_simulate)
    return cmd
