"""The command line's argument types: argparse ``type=`` callables that say what was expected."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

from scepsy_common.rates import RATE_EXPECTED, is_rate


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
FINITE = arg_type(float, math.isfinite, "a finite number")
SHARE = arg_type(float, lambda v: math.isfinite(v) and 0 < v <= 1, "a number in (0, 1]")
RATE = arg_type(float, is_rate, RATE_EXPECTED)
"""A rate flag (``--rate``): the rule of every rate (:func:`scepsy_common.rates.is_rate`)."""
MAX_TOKENS = 10_000_000
TOKENS = arg_type(float, lambda v: math.isfinite(v) and 1 <= v <= MAX_TOKENS,
                  f"a number of tokens in [1, {MAX_TOKENS}]")
"""Every number an option takes is one of these: finite (never ``nan`` or ``inf``), in the
range its message states; an option outside it is refused naming the option."""
NAMES = arg_type(str, lambda v: any(x.strip() for x in v.split(",")),
                  "one or more names, comma-separated")


def percentile_bound(text: str, flag: str, given: str | None = None) -> tuple[float, float]:
    """``PCT:SECONDS`` as ``(percentile, seconds)``, percentile in (0, 100) and seconds > 0;
    otherwise a :class:`~scepsy.cli.util.UsageError` naming ``flag`` and the value ``given``."""
    from scepsy.cli.util import UsageError

    pct, _, sec = text.partition(":")
    try:
        p, s = float(pct), float(sec)
    except ValueError:
        p = s = math.nan
    if not (math.isfinite(p) and math.isfinite(s) and 0 < p < 100 and s > 0):
        raise UsageError(f"{flag}: expected PCT:SECONDS with a percentile in (0, 100) and "
                         f"seconds > 0, e.g. 90:2.5 (got {text if given is None else given!r})")
    return p, s


def add_slo_flags(parser: argparse.ArgumentParser, where: str) -> None:
    """``--ttft-slo`` and ``--tpot-slo`` (docs/slo.md), parsed by :func:`slo_flags`."""
    parser.add_argument("--ttft-slo", action="append", default=[],
                        metavar="[LLM=]SECONDS|[LLM=]PCT:SECONDS",
                        help="SECONDS: bound on an LLM's mean time to first token; PCT:SECONDS: "
                             "on its PCT-th percentile, e.g. judge=90:0.5; without LLM= for "
                             f"every LLM (repeatable; {where})")
    parser.add_argument("--tpot-slo", action="append", default=[], metavar="[LLM=]SECONDS",
                        help="bound on an LLM's mean time per output token after the first; "
                             f"without LLM= for every LLM (repeatable; {where})")


def slo_flags(ttft: Sequence[str], tpot: Sequence[str]) -> dict[str, dict[str, float]] | None:
    """``--ttft-slo`` and ``--tpot-slo`` as ``{LLM or "*": {ttft_s, ttft_percentile, tpot_s}}``
    (None when neither is given); one value per LLM and flag."""
    from scepsy.cli.util import UsageError

    out: dict[str, dict[str, float]] = {}
    for flag, values, field, form in (
            ("--ttft-slo", ttft, "ttft_s", "[LLM=]SECONDS or [LLM=]PCT:SECONDS"),
            ("--tpot-slo", tpot, "tpot_s", "[LLM=]SECONDS")):
        for v in values:
            name, eq, text = v.rpartition("=")
            if eq and not name.strip():
                raise UsageError(f"{flag}: expected an LLM name before '=' (got {v!r})")
            entry = out.setdefault(name or "*", {})
            if field in entry:
                who = f"LLM {name}" if name else "every LLM"
                raise UsageError(f"{flag}: expected one bound for {who} (got {v!r} after "
                                 "another)")
            if field == "ttft_s" and ":" in text:
                entry["ttft_percentile"], entry["ttft_s"] = percentile_bound(text, flag, v)
                continue
            try:
                sec = float(text)
            except ValueError:
                sec = math.nan
            if not (math.isfinite(sec) and sec > 0):
                raise UsageError(f"{flag}: expected {form} with seconds > 0 (got {v!r})")
            entry[field] = sec
    return out or None


RETRY_COUNT = arg_type(int, lambda v: v >= 0, "an integer >= 0")
"""``--retries`` of ``record`` and ``gateway`` (the upper bound is RecordConfig's)."""
