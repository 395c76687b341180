"""``scepsy report PLAN``: an HTML page with PNG figures and terminal tables for a plan.json
(docs/report.md). Parsing and printing only; the work is :mod:`scepsy_place.report`.
"""

from __future__ import annotations

import argparse

HELP = "an HTML page (with PNG figures) and terminal tables that make a plan.json reviewable"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``report`` to a ``scepsy`` sub-command set; returns its parser."""
    cmd = subparsers.add_parser("report", help=HELP)
    cmd.add_argument("plan")
    return cmd
