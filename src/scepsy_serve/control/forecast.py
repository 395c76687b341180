"""One-window-ahead forecasts of a workflow's request rate (docs/bench-control.md).

The controller sees a rate per telemetry window and must size the plan for the windows to come,
far enough ahead that a replica started now is healthy in time (:mod:`scepsy_serve.control.core`).
Two stated models:

* ``holt``: Holt's double exponential smoothing (level and trend). With smoothing factors
  ``alpha`` (level, default :data:`ALPHA`) and ``beta`` (trend, default :data:`BETA`), after an
  observation ``x``::

      level' = alpha·x + (1 − alpha)·(level + trend)
      trend' = beta·(level' − level) + (1 − beta)·trend

  and the forecast ``h`` windows ahead is ``max(0, level + h·trend)``. Initialisation: the first
  observation sets the level (trend 0), the second sets the trend to the difference of the two
  and the level to the second; from then on the update above. On a series that is a straight
  line the forecast is exact from the second observation on.
* ``last``: the naive forecast, the last observation, at every horizon.
* ``auto`` (the controller's default): both, each scored on its own one-window-ahead
  forecasts so far (the mean absolute percentage error over the windows with a rate > 0); the
  forecast is the better one's (``last`` until each has :data:`AUTO_MIN_SCORED` scored windows,
  and on a tie). A smooth trend makes it Holt, a noisy or flat load the naive forecast (on the
  bench's daily cycle Holt's trend overshoots: ``last`` had the lower error one window ahead).

:meth:`RateForecaster.ahead` is the forecast the controller sizes new capacity with: on a rising
trend (Holt's trend > 0) while ``last`` is chosen, the last rate plus ``h`` windows of the trend.

:func:`forecast_error` measures a model on a rate series: the mean absolute percentage error
(MAPE) of its ``horizon``-windows-ahead forecasts, the figure ``scepsy bench control`` reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from scepsy_common.errors import InputError

ForecastKind = Literal["holt", "last", "auto"]
FORECASTS: tuple[ForecastKind, ...] = ("holt", "last", "auto")
AUTO_MIN_SCORED = 3
"""Scored windows each model needs before ``auto`` may choose Holt."""
ALPHA = 0.5
"""Holt's level smoothing factor: half the weight on the newest window."""
BETA = 0.3
"""Holt's trend smoothing factor: the trend follows a change of slope within a few windows."""


def check_smoothing(alpha: float, beta: float, source: str = "forecast") -> None:
    """Both factors in (0, 1]; an input error naming the bad one otherwise."""
    for name, x in (("alpha", alpha), ("beta", beta)):
        if isinstance(x, bool) or not (isinstance(x, int | float) and 0 < x <= 1):
            raise InputError(source, name, "a smoothing factor in (0, 1]", x)


@dataclass
class _Model:
    """One model's state (``holt`` or ``last``)."""

    kind: ForecastKind
    alpha: float
    beta: float
    level: float | None = None
    trend: float = 0.0
    seen: int = 0

    def update(self, x: float) -> None:
        if self.level is None or self.kind == "last":
            self.level, self.trend = x, 0.0
        elif self.seen == 1:
            self.trend, self.level = x - self.level, x
        else:
            old = self.level
            self.level = self.alpha * x + (1.0 - self.alpha) * (old + self.trend)
            self.trend = self.beta * (self.level - old) + (1.0 - self.beta) * self.trend
        self.seen += 1

    def forecast(self, h: int) -> float:
        if self.level is None:
            return 0.0
        return max(0.0, self.level + (h * self.trend if self.kind == "holt" else 0.0))


@dataclass
class RateForecaster:
    """The forecast of one rate series (module docstring); ``update`` each window, then
    ``forecast(h)``."""

    kind: ForecastKind = "holt"
    alpha: float = ALPHA
    beta: float = BETA

    def __post_init__(self) -> None:
        if self.kind not in FORECASTS:
            raise InputError("forecast", "kind", f"one of {', '.join(FORECASTS)}", self.kind)
        check_smoothing(self.alpha, self.beta)
        kinds: tuple[ForecastKind, ...] = ("holt", "last") if self.kind == "auto" \
            else (self.kind,)
        self._models = {k: _Model(k, self.alpha, self.beta) for k in kinds}
        self._errors = {k: [0.0, 0] for k in kinds}  # sum of APEs, windows scored

    @property
    def seen(self) -> int:
        return next(iter(self._models.values())).seen

    @property
    def chosen(self) -> ForecastKind:
        """The model whose forecast is used (``auto``: the better one so far)."""
        if self.kind != "auto":
            return self.kind
        (hs, hn), (ls, ln) = self._errors["holt"], self._errors["last"]
        if min(hn, ln) < AUTO_MIN_SCORED:
            return "last"
        return "holt" if hs / hn < ls / ln else "last"

    def update(self, x: float) -> None:
        """Take the rate of one more window (finite, >= 0)."""
        if isinstance(x, bool) or not (isinstance(x, int | float) and math.isfinite(x)
                                       and x >= 0):
            raise InputError("forecast", "rate", "a rate >= 0 (req/s)", x)
        x = float(x)
        for k, m in self._models.items():
            if m.seen >= 2 and x > 0:  # score the forecast it made for this window
                err = self._errors[k]
                err[0] += abs(m.forecast(1) - x) / x
                err[1] += 1
            m.update(x)

    @property
    def trend(self) -> float:
        """Holt's trend (req/s per window) of the series so far, whichever model is chosen;
        0 for ``last`` alone."""
        holt = self._models.get("holt")
        return 0.0 if holt is None else holt.trend

    def forecast(self, h: int = 1) -> float:
        """The rate ``h`` windows ahead (``h >= 1``); 0 before any observation."""
        return self._models[self.chosen].forecast(h)

    def ahead(self, h: int) -> float:
        """The rate ``h`` windows ahead on a rising trend: :meth:`forecast` plus ``h`` windows
        of Holt's trend where it is > 0 and the chosen model has not extrapolated it (the
        ``last`` model), so that capacity planned now for the window it is ready in sees the
        rise; :meth:`forecast` otherwise."""
        x = self.forecast(h)
        if self.trend > 0 and self.chosen == "last":
            x += h * self.trend
        return x

    def peak(self, horizon: int) -> float:
        """The largest forecast over the next ``horizon`` windows (1..horizon)."""
        return max(self.forecast(h) for h in range(1, max(1, horizon) + 1))


def forecast_error(series: Sequence[float], kind: ForecastKind = "holt", *, horizon: int = 1,
                   alpha: float = ALPHA, beta: float = BETA, warmup: int = 2) -> float:
    """The MAPE of ``kind``'s ``horizon``-ahead forecasts of ``series`` (a fraction: 0.1 is
    10%), over the points after ``warmup`` observations whose value is > 0; NaN when there is
    none."""
    f = RateForecaster(kind, alpha, beta)
    errs: list[float] = []
    for i, x in enumerate(series):
        f.update(x)
        j = i + horizon
        if f.seen >= max(warmup, 1) and j < len(series) and series[j] > 0:
            errs.append(abs(f.forecast(horizon) - series[j]) / series[j])
    return math.fsum(errs) / len(errs) if errs else math.nan
