"""``scepsy bench paper``: the paper's experiments and beyond (docs/evaluation.md).

Parsing and printing only; the experiments are the scripts under ``benchmarks/``.
"""

from __future__ import annotations

import argparse


def add_arguments(cmd: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``scepsy bench paper`` on ``cmd``."""
    cmd.add_argument("--quick", action="store_true", help="the small version CI runs")
    return cmd


def run_cli(args: argparse.Namespace) -> int:
    """Run the evaluation; 0, or 2 for bad input."""
    raise NotImplementedError
