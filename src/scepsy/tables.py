"""Plain-text tables for the command line and the benchmark scripts."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def format_cell(value: object) -> str:
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:g}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, object]], cols: Sequence[str]) -> str:
    """Right-aligned columns under a header line; floats in their shortest form."""
    cells = [[format_cell(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = [[c.rjust(w) for c, w in zip(cols, widths, strict=True)]]
    lines += [[v.rjust(w) for v, w in zip(row, widths, strict=True)] for row in cells]
    return "\n".join("  ".join(line) for line in lines)
