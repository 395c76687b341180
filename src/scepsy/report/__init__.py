"""``scepsy report``: make a plan.json reviewable at a glance (docs/report.md).

:func:`write_report` reads and validates a plan file and writes a folder with ``index.html``
and its figures, PNG or SVG (:mod:`~scepsy.report.page`): each workflow's predicted
latency-vs-throughput curve with the plan's operating point, the LLMs' latency shares, the
placement map, the solver's statistics and gaps, and the placement bounds. The page needs
nothing but the folder (no script, no external file). :func:`load_report` and the row
functions (:mod:`~scepsy.report.contents`) are what the terminal tables print.
"""

from __future__ import annotations

from pathlib import Path

from scepsy.report.contents import (
    PLACEMENT_COLUMNS,
    PLAN_COLUMNS,
    WORKFLOW_COLUMNS,
    Report,
    default_out,
    load_report,
    node_rows,
    placement_rows,
    plan_rows,
    workflow_rows,
)
from scepsy.report.folder import check_out, is_report
from scepsy.report.page import write_page


def write_report(plan_path: str | Path, out_dir: str | Path | None = None,
                 fmt: str = "png") -> Path:
    """Write the report of the plan.json at ``plan_path`` into ``out_dir`` (default
    :func:`default_out`: beside the plan, ``NAME-report/``), its figures as ``fmt`` (``png``,
    at 200 dpi, or ``svg``); returns the folder, which holds ``index.html``. Bad input (a
    missing or malformed plan file, an output path holding anything but an earlier report) is
    an :class:`~scepsy_common.errors.InputError` raised before anything is written."""
    rep = load_report(plan_path)
    return write_page(rep, Path(out_dir) if out_dir is not None else default_out(plan_path),
                      fmt)


__all__ = [
    "PLACEMENT_COLUMNS",
    "PLAN_COLUMNS",
    "WORKFLOW_COLUMNS",
    "Report",
    "check_out",
    "default_out",
    "is_report",
    "load_report",
    "node_rows",
    "placement_rows",
    "plan_rows",
    "workflow_rows",
    "write_page",
    "write_report",
]
