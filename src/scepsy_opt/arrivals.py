"""Recorded arrival times: replayed by the simulator, and the rate profile a plan must carry
(docs/arrivals.md).

A mean rate hides the bursts of a real load. A recorded trace of arrival times keeps them:

* :func:`load_arrivals` reads one from a JSON-lines file of objects with a ``timestamp`` in
  milliseconds (Mooncake's traces: ``{"timestamp": 0, "input_length": ..., ...}``), from a CSV
  file with a header row and a timestamp column (seconds or ISO 8601 date-times) or from a
  text file with one time in seconds per line (``#`` comments and blank lines skipped). Times
  are shifted to start at 0 and sorted. :func:`load_recorded` also gives each arrival's token
  lengths where the file has them (``scepsy bench control --arrivals``).
* :meth:`Arrivals.scaled` condenses (or stretches) time by a factor, as MuxServe condenses a
  day of ChatLMSYS arrivals into minutes: ``time_scale = 2`` replays twice as fast.
* :meth:`Arrivals.window_rates` is the rate profile: arrivals per consecutive window of
  ``window_s`` seconds, over the whole windows the trace spans (a window longer than the span
  is refused).
  :meth:`Arrivals.peak_rate` is its largest window rate, or the window rate at a quantile of
  the windows (``0.95``: the rate 95% of the windows stay within).

``scepsy simulate --arrivals FILE`` replays the times (each arrival picks a workflow in
proportion to the rates and a request of it, :func:`scepsy_opt.prediction.simulate.simulate`'s
``arrival_times_s``); ``scepsy plan --arrivals FILE --peak-window S`` plans for the peak
window's rate instead of the mean.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from scepsy_common.errors import InputError
from scepsy_common.files import read_jsonl_objects, read_text

MAX_ARRIVALS = 10_000_000
"""The most arrival times one file may hold."""
MAX_WINDOWS = 10_000_000
"""The most windows a peak rate counts over (a span of recorded times this many windows
long, e.g. 19 years of 60 s windows, is a unit mistake, not a recording)."""


@dataclass(frozen=True, eq=False)
class Arrivals:
    """Sorted arrival times from 0 (seconds), read-only; ``source``: where they came from."""

    times_s: NDArray[np.float64]
    source: str = ""

    def __post_init__(self) -> None:
        t = np.asarray(self.times_s, dtype=float)
        if t.ndim != 1 or len(t) < 1:
            raise InputError(self.source or "arrivals", "times_s", "one or more arrival times")
        if not np.all(np.isfinite(t)) or np.any(t < 0):
            raise InputError(self.source or "arrivals", "times_s", "arrival times >= 0 (s)")
        t = np.sort(t) - float(np.min(t))
        t.setflags(write=False)
        object.__setattr__(self, "times_s", t)

    @property
    def count(self) -> int:
        return len(self.times_s)

    @property
    def span_s(self) -> float:
        """From the first arrival to the last."""
        return float(self.times_s[-1])

    @property
    def mean_rate(self) -> float:
        """Arrivals per second over the span (``count / span``; inf for one instant)."""
        return self.count / self.span_s if self.span_s > 0 else math.inf

    def scaled(self, time_scale: float) -> Arrivals:
        """The same arrivals ``time_scale`` times as fast (times divided by it)."""
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise InputError("time_scale", "", f"a factor > 0 ({self.source or 'arrivals'})",
                             time_scale)
        return Arrivals(self.times_s / time_scale, self.source)

    def window_rates(self, window_s: float) -> NDArray[np.float64]:
        """Arrivals per second in each consecutive window of ``window_s`` from 0, over the
        whole windows the span holds (arrivals after the last whole window are left out); a
        window longer than the span is refused."""
        if not (math.isfinite(window_s) and 0 < window_s <= self.span_s):
            raise InputError("window_s", "", f"a window > 0 s within the arrivals' span of "
                             f"{self.span_s:.6g} s ({self.source or 'arrivals'}; a longer one "
                             "would count time without arrivals)", window_s)
        k = int(self.span_s // window_s)
        if k > MAX_WINDOWS:
            raise InputError(self.source or "arrivals", "", f"arrival times whose span holds "
                             f"at most {MAX_WINDOWS} windows of {window_s:g} s; they span "
                             f"{self.span_s:.6g} s ({k} windows): times in seconds?",
                             None)
        idx = np.minimum((self.times_s // window_s).astype(np.int64), k)
        return np.bincount(idx, minlength=k + 1)[:k].astype(float) / window_s

    def peak_rate(self, window_s: float, quantile: float = 1.0) -> float:
        """The window rate at ``quantile`` (in (0, 1]) of the windows: the largest at 1, else
        the smallest rate that at least that share of the windows stay within."""
        _quantile(quantile)
        return _at_quantile(self.window_rates(window_s), quantile)


def _quantile(quantile: float) -> None:
    """Refuse a quantile outside (0, 1]."""
    if not (0 < quantile <= 1):
        raise InputError("quantile", "", "a quantile in (0, 1]", quantile)


def _at_quantile(rates: NDArray[np.float64], quantile: float) -> float:
    """The smallest of ``rates`` that at least ``quantile`` (in (0, 1]) of them stay within."""
    ordered = np.sort(rates)
    return float(ordered[max(0, math.ceil(quantile * len(ordered)) - 1)])


TIMESTAMP_COLUMNS = ("timestamp", "time", "time_s", "arrival_time", "arrival_s")
"""Names of a CSV file's arrival-time column (case-insensitive, the first one present)."""
INPUT_COLUMNS = ("input_length", "input_tokens", "prompt_tokens", "context_tokens",
                 "contexttokens")
"""Names of a CSV file's prompt-length column (tokens; optional)."""
OUTPUT_COLUMNS = ("output_length", "output_tokens", "completion_tokens", "generated_tokens",
                  "generatedtokens")
"""Names of a CSV file's output-length column (tokens; optional)."""


@dataclass(frozen=True, eq=False)
class Recorded:
    """A recorded trace: its :class:`Arrivals` and, where the file has them, every arrival's
    prompt and output lengths in tokens (in the order of ``arrivals.times_s``; ``None``
    without)."""

    arrivals: Arrivals
    input_tokens: NDArray[np.float64] | None = None
    output_tokens: NDArray[np.float64] | None = None


def load_arrivals(path: str | os.PathLike[str]) -> Arrivals:
    """The arrival times in ``path`` (module docstring, :func:`load_recorded`); an
    :class:`InputError` naming the file and the line for anything else."""
    return load_recorded(path).arrivals


def load_recorded(path: str | os.PathLike[str]) -> Recorded:
    """The arrival times and token lengths in ``path``, by its suffix:

    * ``.jsonl``/``.ndjson``: a ``timestamp`` in milliseconds on every line; ``input_length``
      and ``output_length`` (tokens, whole numbers >= 1) are the lengths when every line has
      them (Mooncake's traces);
    * ``.csv``: a header row, an arrival-time column (:data:`TIMESTAMP_COLUMNS`) in seconds or
      as ISO 8601 date-times (``2023-11-16 18:15:46.6805900``), optional length columns
      (:data:`INPUT_COLUMNS`, :data:`OUTPUT_COLUMNS`);
    * anything else: one time in seconds per line (``#`` comments, blank lines skipped).

    An :class:`InputError` names the file, the line and the field of anything else."""
    p = Path(path)
    src = str(p)
    times: list[float] = []
    lengths: tuple[list[float], list[float]] = ([], [])
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        has: tuple[bool, bool] | None = None
        for lineno, obj in read_jsonl_objects(p, "arrival-times file (JSON lines with a "
                                              "timestamp in ms)", "arrival"):
            ts = obj.get("timestamp")
            if isinstance(ts, bool) or not isinstance(ts, int | float) or not (
                    math.isfinite(ts) and ts >= 0):
                raise InputError(src, f"line {lineno}: timestamp",
                                 "a time >= 0 in milliseconds", ts)
            here = ("input_length" in obj, "output_length" in obj)
            has = here if has is None else has
            for k, name in enumerate(("input_length", "output_length")):
                if here[k] != has[k]:
                    raise InputError(src, f"line {lineno}: {name}", f"{name} on every line "
                                     "or on none", obj.get(name, "missing"))
                if has[k]:
                    lengths[k].append(_tokens(obj[name], src, f"line {lineno}: {name}"))
            times.append(float(ts) / 1e3)
            _check_count(times, src)
    elif suffix == ".csv":
        _read_csv(read_text(p, "arrival-times CSV file (a header row with a timestamp "
                                "column)"), src, times, lengths)
    else:
        text = read_text(p, "arrival-times file (one time in seconds per line)")
        for lineno, line in enumerate(text.splitlines(), start=1):
            s = line.split("#", 1)[0].strip()
            if not s:
                continue
            try:
                v = float(s)
            except ValueError:
                v = math.nan
            if not (math.isfinite(v) and v >= 0):
                raise InputError(src, f"line {lineno}", "a time >= 0 in seconds", s)
            times.append(v)
            _check_count(times, src)
    if not times:
        raise InputError(src, "", "one or more arrival times")
    order = np.argsort(np.array(times, dtype=float), kind="stable")

    def col(xs: list[float]) -> NDArray[np.float64] | None:
        if not xs:
            return None
        a = np.array(xs, dtype=float)[order]
        a.setflags(write=False)
        return a

    return Recorded(Arrivals(np.array(times, dtype=float), src), col(lengths[0]),
                    col(lengths[1]))


def _tokens(x: object, src: str, field: str) -> float:
    """A token count: a whole number >= 1."""
    if isinstance(x, str):
        with contextlib.suppress(ValueError):
            x = float(x.strip())
    if isinstance(x, bool) or not isinstance(x, int | float) or not (
            math.isfinite(x) and x >= 1 and float(x).is_integer()):
        raise InputError(src, field, "a token count (a whole number >= 1)", x)
    return float(x)


def _csv_time(text: str, src: str, field: str) -> float:
    """Seconds: a number, or an ISO 8601 date-time (seconds since the epoch; naive ones as
    UTC)."""
    s = text.strip()
    try:
        v = float(s)
    except ValueError:
        try:
            d = datetime.fromisoformat(s)
        except ValueError:
            raise InputError(src, field, "a time >= 0 in seconds or an ISO 8601 date-time",
                             text) from None
        v = (d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp()
    if not (math.isfinite(v) and v >= 0):
        raise InputError(src, field, "a time >= 0 in seconds or an ISO 8601 date-time", text)
    return v


def _read_csv(text: str, src: str, times: list[float],
              lengths: tuple[list[float], list[float]]) -> None:
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header is None:
        raise InputError(src, "line 1", "a header row naming a timestamp column "
                         f"({', '.join(TIMESTAMP_COLUMNS)})")
    names = [h.strip().lower() for h in header]

    def find(options: tuple[str, ...]) -> int | None:
        return next((names.index(o) for o in options if o in names), None)

    ts = find(TIMESTAMP_COLUMNS)
    if ts is None:
        raise InputError(src, "line 1", "a header row naming a timestamp column (one of "
                         f"{', '.join(TIMESTAMP_COLUMNS)})", ",".join(header))
    cols = (find(INPUT_COLUMNS), find(OUTPUT_COLUMNS))
    for lineno, row in enumerate(rows, start=2):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise InputError(src, f"line {lineno}", f"{len(header)} fields as in the header",
                             len(row))
        times.append(_csv_time(row[ts], src, f"line {lineno}: {header[ts].strip()}"))
        for k, c in enumerate(cols):
            if c is not None:
                lengths[k].append(_tokens(row[c], src, f"line {lineno}: {header[c].strip()}"))
        _check_count(times, src)


def _check_count(times: list[float], src: str) -> None:
    if len(times) > MAX_ARRIVALS:
        raise InputError(src, "", f"at most {MAX_ARRIVALS} arrival times")


PEAK_WINDOW_S = 60.0
"""The default window of a peak rate (s)."""


@dataclass(frozen=True)
class PeakTarget:
    """The rate a plan carries for recorded arrivals: the window rate at ``quantile`` of the
    windows of ``window_s`` (req/s, all workflows together), beside the mean rate."""

    rate: float
    mean_rate: float
    window_s: float
    quantile: float
    arrivals: int
    source: str

    @property
    def peak_factor(self) -> float:
        """``rate / mean_rate``: how much more than the mean the plan carries."""
        return self.rate / self.mean_rate if self.mean_rate > 0 else math.inf

    def to_dict(self) -> dict[str, float | int | str]:
        return {"source": self.source, "arrivals": self.arrivals, "window_s": self.window_s,
                "quantile": self.quantile, "rate": self.rate, "mean_rate": self.mean_rate}

    def describe(self) -> str:
        which = "peak" if self.quantile == 1 else f"p{100 * self.quantile:g}"
        return (f"the {which} {self.window_s:g} s window of {self.source}: {self.rate:.4g} "
                f"req/s ({self.peak_factor:.3g}x the mean {self.mean_rate:.4g} req/s)")


def peak_target(arrivals: Arrivals, window_s: float = PEAK_WINDOW_S,
                quantile: float = 1.0) -> PeakTarget:
    """The :class:`PeakTarget` of ``arrivals`` (:meth:`Arrivals.peak_rate`); the mean is over
    the same whole windows."""
    _quantile(quantile)
    rates = arrivals.window_rates(window_s)
    return PeakTarget(_at_quantile(rates, quantile), float(np.mean(rates)), window_s,
                      quantile, arrivals.count, arrivals.source)
