"""``scepsy report PLAN``: an HTML page with figures and terminal tables for a plan.json
(docs/report.md). Parsing and printing only; the work is :mod:`scepsy.report`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "an HTML page (with figures) and terminal tables that make a plan.json reviewable"
FORMATS = ("png", "svg")  # scepsy.report.figures.FORMATS (not imported: fast --help)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``report`` to a ``scepsy`` sub-command set; returns its parser."""
    cmd = subparsers.add_parser("report", help=HELP, description=HELP)
    cmd.add_argument("plan", type=Path, help="a plan.json (scepsy plan --out)")
    cmd.add_argument("--out", type=Path, metavar="DIR",
                     help="the report folder (default: beside PLAN, its name without .json "
                     "plus -report); an earlier report there is replaced, anything else is "
                     "never overwritten")
    cmd.add_argument("--format", choices=FORMATS, default=FORMATS[0], dest="fmt",
                     help="the figures' format: png (200 dpi, sharp on high-DPI screens) or svg "
                     "(vector, any zoom) (default %(default)s)")
    cmd.set_defaults(func=cmd_report)
    return cmd


def cmd_report(args: argparse.Namespace) -> int:
    """Run ``scepsy report``: read the plan, write the page, print the tables and its path."""
    from scepsy.cli.util import print_rows
    from scepsy.report import (
        PLACEMENT_COLUMNS,
        PLAN_COLUMNS,
        WORKFLOW_COLUMNS,
        check_out,
        default_out,
        load_report,
        placement_rows,
        plan_rows,
        workflow_rows,
        write_page,
    )
    from scepsy_serve.launch.planfile import not_placed_reason

    rep = load_report(args.plan)
    out = args.out if args.out is not None else default_out(args.plan)
    check_out(out)
    d = rep.doc
    print(f"{args.plan}: status {d.status}, optimiser {d.optimiser}, objective {d.objective}")
    if rep.has_allocation:
        print()
        print_rows(plan_rows(rep), PLAN_COLUMNS)
        print()
        print_rows(workflow_rows(rep), WORKFLOW_COLUMNS)
    if rep.placed:
        print()
        print_rows(placement_rows(rep), PLACEMENT_COLUMNS)
    else:
        print(f"no placed allocation: {not_placed_reason(d)}")
    written = write_page(rep, out, args.fmt)
    print()
    print(f"wrote {written / 'index.html'}")
    if not rep.placed:  # drawn for its diagnosis, never to be mistaken for a plan to launch
        print(f"scepsy: {args.plan}: status {d.status}: no placed plan, nothing of it can be "
              f"launched ({not_placed_reason(d)}); the report's 'What happened' section says "
              "why; re-run `scepsy plan` for a plan to launch", file=sys.stderr)
    return 0
