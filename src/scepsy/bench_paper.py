"""``scepsy bench paper``: the paper's experiments and beyond (docs/evaluation.md).

Parsing and printing only; the experiments are the scripts under ``benchmarks/`` of a source
checkout (``benchmarks/paper.py`` runs the sections), so the command needs one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from scepsy.cli.argtypes import COUNT, NAMES, SEED

SECTIONS = "curves,accuracy,search,beyond"


def add_arguments(cmd: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``scepsy bench paper`` (and of ``python benchmarks/paper.py``) on
    ``cmd``."""
    cmd.add_argument("--quick", action="store_true",
                     help="the small version CI runs (a few minutes on 2 cores)")
    cmd.add_argument("--sections", type=NAMES, default=SECTIONS, metavar="NAMES",
                     help=f"comma-separated sections to run (default {SECTIONS})")
    cmd.add_argument("--out", default=None, metavar="DIR",
                     help="folder of the JSON files and PNGs (default results/paper/, "
                          "with --quick results/paper-quick/)")
    cmd.add_argument("--seed", type=SEED, default=0, help="seed of traces and simulations "
                                                         "(default 0)")
    cmd.add_argument("--jobs", type=COUNT, default=2,
                     help="worker processes (default 2); the results do not depend on it")
    return cmd


def benchmarks_dir() -> Path:
    """The checkout's benchmarks/ folder (next to src/)."""
    import scepsy

    return Path(scepsy.__file__).resolve().parents[2] / "benchmarks"


def run_cli(args: argparse.Namespace) -> int:
    """Run the evaluation (``benchmarks/paper.py``); 0, or 2 for bad input."""
    folder = benchmarks_dir()
    if not (folder / "paper.py").is_file():
        print(f"error: scepsy bench paper needs a source checkout: {folder / 'paper.py'} not "
              "found (clone the repository and install it with pip install -e .)",
              file=sys.stderr)
        return 2
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    paper = importlib.import_module("paper")
    return int(paper.run(args))
