"""The command line's argument types: argparse ``type=`` callables that say what was expected."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any


def arg_type(convert: Callable[[str], Any], ok: Callable[[Any], bool], expected: str
              ) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected} (got {text!r})") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected} (got {text!r})")
        return value
    parse.__name__ = expected  # argparse names the type in some messages
    return parse


SEED = arg_type(int, lambda v: v >= 0, "an integer >= 0")
COUNT = arg_type(int, lambda v: v >= 1, "an integer >= 1")
POSITIVE = arg_type(float, lambda v: math.isfinite(v) and v > 0, "a number > 0")
NONNEGATIVE = arg_type(float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0")
NAMES = arg_type(str, lambda v: any(x.strip() for x in v.split(",")),
                  "one or more names, comma-separated")


def percentile_bound(text: str, flag: str, given: str | None = None) -> tuple[float, float]:
    """``PCT:SECONDS`` as ``(percentile, seconds)``, percentile in (0, 100) and seconds > 0;
    otherwise a :class:`~scepsy.cli_util.UsageError` naming ``flag`` and the value ``given``."""
    from scepsy.cli_util import UsageError

    pct, _, sec = text.partition(":")
    try:
        p, s = float(pct), float(sec)
    except ValueError:
        p = s = math.nan
    if not (math.isfinite(p) and math.isfinite(s) and 0 < p < 100 and s > 0):
        raise UsageError(f"{flag}: expected PCT:SECONDS with a percentile in (0, 100) and "
                         f"seconds > 0, e.g. 90:2.5 (got {text if given is None else given!r})")
    return p, s
