"""``scepsy stats``: per-workflow, per-LLM statistics of a trace."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scepsy.cli.argtypes import SEED
from scepsy.cli.util import print_rows as _print_table


def _stats_args(stats: argparse.ArgumentParser) -> None:
    stats.add_argument("trace", type=Path, help="a trace JSON-lines file")
    stats.add_argument("--seed", type=SEED, default=0, help="seed of the bootstrap halves")
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(func=_cmd_stats)


def _cmd_stats(args: argparse.Namespace) -> int:
    from scepsy_opt.stats import stats_table, stats_to_dict, trace_stats
    from scepsy_opt.traces import read_trace

    stats = trace_stats(read_trace(args.trace), seed=args.seed, source=str(args.trace))
    if args.json:
        print(json.dumps(stats_to_dict(stats), indent=2, sort_keys=True))
        return 0
    rows = stats_table(stats)
    _print_table(rows, list(rows[0]))
    print()
    _print_table([{
        "workflow": w, "requests": st.requests, "latency_mean_s": round(st.latency_mean_s, 3),
        "latency_cv": round(st.latency_cv, 3),
        "max_share_cv_requests": round(max(x.time_share_cv_requests for x in st.llms.values()), 3),
        "max_share_cv_halves": round(max(x.time_share_cv_halves for x in st.llms.values()), 4),
        "llm_overlap": round(st.llm_overlap, 3), "tool_critical_s": round(st.tool_critical_s, 3),
        "failed_calls": st.failed_calls,
    } for w, st in stats.items()], ["workflow", "requests", "latency_mean_s", "latency_cv",
                                     "max_share_cv_requests", "max_share_cv_halves",
                                     "llm_overlap", "tool_critical_s", "failed_calls"])
    return 0


HELP = "per-workflow, per-LLM statistics of a trace"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scepsy stats`` and its options."""
    cmd = subparsers.add_parser("stats", help=HELP)
    _stats_args(cmd)
    return cmd
