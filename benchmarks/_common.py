"""Shared helpers for the benchmark scripts: where the shared data lives, table printing."""

from __future__ import annotations

import json
import math
import platform
import resource
import sys
from datetime import date
from pathlib import Path

import numpy as np

from scepsy.tables import format_table as table  # noqa: F401  (re-exported for the scripts)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "results"


def require_shared() -> Path:
    if not SHARED_DATA.is_dir():
        sys.exit(f"needs {SHARED_DATA} (the project's shared data folder); not found")
    return SHARED_DATA


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def sig(x: float, digits: int = 3) -> float:
    """A float rounded to ``digits`` significant digits, for the tables."""
    return float(f"{x:.{digits}g}") if math.isfinite(x) else x


def peak_rss_mb() -> float:
    """The process's peak resident memory, MB (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_results(name: str, payload: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, "
               f"{__import__('os').cpu_count()} cores", **payload}
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=json_default) + "\n")
    return path


def json_default(o: object) -> object:
    """``json.dumps``'s ``default`` for the results: numpy scalars as Python numbers."""
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o))
