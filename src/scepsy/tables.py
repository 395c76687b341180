"""Tables and progress for the command line and the benchmark scripts, rendered with rich.

Two entry points serve every command:

- :func:`format_table` / :func:`print_table`: one row per mapping, columns in the order given,
  numbers right-aligned, floats in their shortest form (``format_cell``), ``None`` as ``-``.
  The layout is the same on a terminal and in a pipe (two spaces between columns, no borders,
  no trailing spaces), so output stays copy-pasteable and stable for scripts and tests; on a
  terminal ``print_table`` only adds a bold header.
- :func:`progress`: a context manager that shows a progress bar on stderr while a long step
  runs; it writes nothing when stderr is not a terminal or when ``quiet`` is set.

``rich`` is imported inside the functions, so importing this module (and ``scepsy --help``)
stays fast.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID
    from rich.table import Table

Align = Literal["left", "right"]

_WIDE = 1 << 20  # console width for rendering: wide enough that no cell is ever cut or wrapped


def format_cell(value: object) -> str:
    """One cell's text: floats in their shortest form (``1.5``, ``1e+06``, ``inf``, ``-inf``,
    ``nan``), ``None`` as ``-``, anything else as ``str``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:g}"
    return str(value)


def _table(rows: Sequence[Mapping[str, object]], cols: Sequence[str], align: Align,
           header_style: str | None) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1),
                  header_style=header_style, highlight=False)
    for c in cols:
        table.add_column(Text(c), justify=align, no_wrap=True)
    for r in rows:
        table.add_row(*(Text(format_cell(r[c])) for c in cols))
    return table


def _render(table: Table, file: IO[str], terminal: bool) -> None:
    from rich.console import Console

    console = Console(file=file, width=_WIDE, force_terminal=terminal, no_color=not terminal,
                      color_system="standard" if terminal else None, markup=False,
                      emoji=False, highlight=False, soft_wrap=False)
    console.print(table)


def format_table(rows: Sequence[Mapping[str, object]], cols: Sequence[str], *,
                 align: Align = "right") -> str:
    """The table as plain text: a header line, then one line per row; no trailing newline.

    Raises ``KeyError`` when a row lacks one of ``cols``.
    """
    import io

    buf = io.StringIO()
    _render(_table(rows, cols, align, None), buf, terminal=False)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines())


def print_table(rows: Sequence[Mapping[str, object]], cols: Sequence[str], *,
                align: Align = "right", file: IO[str] | None = None) -> None:
    """Print the table to ``file`` (stdout): exactly :func:`format_table`'s text when ``file`` is
    not a terminal, the same layout with a bold header when it is."""
    out = sys.stdout if file is None else file
    if not _isatty(out):
        print(format_table(rows, cols, align=align), file=out)
        return
    _render(_table(rows, cols, align, "bold"), out, terminal=True)


class ProgressTask(Protocol):
    """What :func:`progress` yields."""

    def advance(self, step: float = 1.0) -> None:
        """Count ``step`` more units of work done."""

    def update(self, *, description: str | None = None, completed: float | None = None,
               total: float | None = None) -> None:
        """Change the description, the units done or the total."""


class _Silent:
    def advance(self, step: float = 1.0) -> None:
        pass

    def update(self, *, description: str | None = None, completed: float | None = None,
               total: float | None = None) -> None:
        pass


class _RichTask:
    def __init__(self, bar: Progress, task_id: TaskID) -> None:
        self._bar, self._id = bar, task_id

    def advance(self, step: float = 1.0) -> None:
        self._bar.advance(self._id, step)

    def update(self, *, description: str | None = None, completed: float | None = None,
               total: float | None = None) -> None:
        self._bar.update(self._id, description=description, completed=completed, total=total)


@contextmanager
def progress(description: str, total: float | None = None, *, quiet: bool = False,
             file: IO[str] | None = None) -> Iterator[ProgressTask]:
    """Show ``description`` with a bar (``total`` units) or a spinner (``total=None``) on
    ``file`` (stderr) while the ``with`` block runs, and erase it at the end.

    Writes nothing at all when ``quiet`` is true or ``file`` is not a terminal (a pipe, a log
    file, a test's capture); the yielded task's methods then do nothing.
    """
    out = sys.stderr if file is None else file
    if quiet or not _isatty(out):
        yield _Silent()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(file=out, force_terminal=True, highlight=False)
    columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
               TextColumn("{task.completed:g}/{task.total:g}") if total is not None
               else TextColumn(""), TimeElapsedColumn()]
    if total is not None:  # an estimate of the time left, from the rate of progress so far
        columns.append(TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        yield _RichTask(bar, bar.add_task(description, total=total))


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
