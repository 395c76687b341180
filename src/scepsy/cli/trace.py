"""``scepsy trace``: workflow traces: ``generate`` (here), ``import``
(:mod:`scepsy.cli.trace_import`) and ``receive`` (:mod:`scepsy.cli.trace_receive`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from scepsy.cli.argtypes import COUNT, SEED
from scepsy.cli.util import check_out
from scepsy.cli.util import naming as _naming


def _trace_args(trace: argparse.ArgumentParser) -> None:
    tsub = trace.add_subparsers(dest="trace_command", required=True)
    gen = tsub.add_parser("generate", help="generate a trace from a workflow (or workload) YAML")
    gen.add_argument("--workflow", type=Path, required=True)
    gen.add_argument("--requests", type=COUNT, required=True, help="requests per workflow")
    gen.add_argument("--seed", type=SEED, default=0)
    gen.add_argument("--out", type=Path, required=True)
    gen.set_defaults(func=_cmd_trace_generate)
    from scepsy.cli.trace_import import add_import
    from scepsy.cli.trace_receive import add_receive

    add_import(tsub)
    add_receive(tsub)


def _cmd_trace_generate(args: argparse.Namespace) -> int:
    from scepsy_opt.traces import write_trace
    from scepsy_opt.workload import generate_workload_trace, load_specs

    check_out(args.out)
    specs = load_specs(args.workflow)
    with _naming({"requests": "--requests"}):
        calls = generate_workload_trace(specs, args.requests, args.seed)
    write_trace(args.out, calls)
    print(f"wrote {len(calls)} calls of {args.requests * len(specs)} requests to {args.out}")
    return 0


HELP = "workflow traces"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scepsy trace`` and its options."""
    cmd = subparsers.add_parser("trace", help=HELP)
    _trace_args(cmd)
    return cmd
