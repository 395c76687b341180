"""Engine overheads fitted from measured multi-GPU runs (docs/validate.md, "Calibration").

The overheads of a GPU engine (:class:`~scepsy_profile.overheads.EngineOverheads`) that a step
profile does not see are fitted on the runs where an LLM is alone on its GPUs (MuxServe's
``spatial``) and was not overloaded: there its time per output token is the serving model's
decode step, its prefill stalls and the overheads, with no co-runner in the way. The fit is a
grid search over ``iteration_ms`` and ``tp_doubling_ms`` minimising the mean squared log-ratio of
predicted to measured TPOT over those LLMs (the smallest on ties, so the search is
deterministic); then, with those, ``first_token_ms`` (a pure delay before the first token,
which moves no TPOT) over :data:`FIRST_TOKEN_GRID_MS` on the same LLMs' mean TTFT; last,
``overload_queued`` (the part of an overload's backlog that waits before its first token,
which moves only the TTFT of overloaded LLMs) over :data:`QUEUED_GRID` on the p90 TTFT of the
LLMs the prediction finds overloaded. Runs of other strategies are not used, so the
co-location model (:mod:`scepsy_profile.mps`) is checked, not fitted, on them.

Before the overheads, :func:`fit_output_cv` fits the shape of the request lengths, which
MuxServe's files do not keep: the coefficient of variation of a log-normal output length whose
90th and 99th percentiles over its mean match the measured latency percentiles over the mean
latency of the same LLMs (alone, and whose requests did not queue: there a request's latency
is about its output length times a TPOT).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from scepsy_common.errors import InputError
from scepsy_opt.validate.evaluate import OUTPUT_CV, validate_run
from scepsy_opt.validate.muxserve import GPU, MuxRun
from scepsy_profile.latency import LatencyModel
from scepsy_profile.overheads import EngineOverheads, with_overheads

GRID_MS = (0.0, 2.5, 5.0, 7.5, 10.0, 15.0)
"""The values tried for each term (ms)."""
FIRST_TOKEN_GRID_MS = tuple(float(x) for x in range(0, 525, 25))
"""The values tried for ``first_token_ms``."""
QUEUED_GRID = tuple(i / 20 for i in range(21))
"""The values tried for ``overload_queued``."""
OUTPUT_CV_GRID = tuple(i / 20 for i in range(4, 41))
"""The values tried for the output coefficient of variation (0.2 to 2)."""
UNQUEUED = 0.1
"""An LLM's requests did not queue when its mean TTFT was below this part of its latency."""
Z90, Z99 = 1.2815515655446004, 2.3263478740408408
"""The standard normal's 90th and 99th percentiles."""
FIT_STRATEGY = "spatial"


@dataclass(frozen=True)
class FitPoint:
    iteration_ms: float
    tp_doubling_ms: float
    score: float  # mean squared log-ratio of predicted to measured TPOT
    llms: int  # LLMs it was computed on


@dataclass(frozen=True)
class OverheadsFit:
    overheads: EngineOverheads
    points: tuple[FitPoint, ...]
    runs: tuple[str, ...]  # "workload/strategy" of the runs fitted on
    output_cv: float = OUTPUT_CV  # the output lengths' coefficient of variation fitted with


def lognormal_ratios(cv: float) -> tuple[float, float]:
    """The 90th and 99th percentiles over the mean of a log-normal with coefficient of
    variation ``cv``: ``exp(z·σ − σ²/2)`` with ``σ² = ln(1 + cv²)``."""
    s2 = math.log1p(cv * cv)
    s = math.sqrt(s2)
    return math.exp(Z90 * s - s2 / 2.0), math.exp(Z99 * s - s2 / 2.0)


def fit_output_cv(runs: Sequence[MuxRun], grid: Sequence[float] = OUTPUT_CV_GRID) -> float:
    """The output coefficient of variation of ``grid`` that fits the :data:`FIT_STRATEGY`
    runs best (module docstring): the least squared log-ratio of :func:`lognormal_ratios` to
    each unqueued LLM's measured ``p90 latency / mean latency`` and ``p99 latency / mean
    latency`` (the smallest on ties)."""
    if not grid or any(not (math.isfinite(g) and g > 0) for g in grid):
        raise InputError("validate", "output_cv_grid", "coefficients of variation > 0",
                         tuple(grid))
    points = []
    for run in runs:
        if run.strategy != FIT_STRATEGY:
            continue
        for m, x in run.measured.items():
            mean = x.mean_latency_s(run.lengths(m)[1])
            if mean > 0 and x.ttft_mean_s < UNQUEUED * mean and x.p90_latency_s > 0:
                points.append((math.log(x.p90_latency_s / mean),
                               math.log(x.p99_latency_s / mean)))
    if not points:
        raise InputError("validate", "runs", f"a {FIT_STRATEGY} LLM whose requests did not "
                         "queue, to fit the output lengths on")

    def score(cv: float) -> float:
        r90, r99 = (math.log(r) for r in lognormal_ratios(cv))
        return sum((a - r90) ** 2 + (b - r99) ** 2 for a, b in points)
    return min(sorted(set(grid)), key=lambda cv: (round(score(cv), 12), cv))


def fit_overheads(runs: Sequence[MuxRun], latency: LatencyModel, *,
                  grid: Sequence[float] = GRID_MS,
                  first_grid: Sequence[float] = FIRST_TOKEN_GRID_MS,
                  queued_grid: Sequence[float] = QUEUED_GRID, version: str = "",
                  source: str = "", seed: int = 0,
                  output_cv: float | None = None) -> OverheadsFit:
    """The overheads that fit the :data:`FIT_STRATEGY` runs of ``runs`` best (module
    docstring), with outputs of coefficient of variation ``output_cv`` (None: fitted first,
    :func:`fit_output_cv`)."""
    used = [r for r in runs if r.strategy == FIT_STRATEGY]
    if not used:
        raise InputError("validate", "runs", f"at least one {FIT_STRATEGY} run to fit on",
                         sorted({r.strategy for r in runs}))
    for name, values in (("grid", grid), ("first_grid", first_grid)):
        if not values or any(not (math.isfinite(g) and g >= 0) for g in values):
            raise InputError("validate", name, "values >= 0 (ms)", tuple(values))
    if not queued_grid or any(not 0 <= q <= 1 for q in queued_grid):
        raise InputError("validate", "queued_grid", "fractions in [0, 1]", tuple(queued_grid))
    cv = fit_output_cv(used) if output_cv is None else output_cv
    points: list[FitPoint] = []
    for it, rank in itertools.product(sorted(set(grid)), repeat=2):
        over = EngineOverheads("muxserve", version, GPU, iteration_ms=it, tp_doubling_ms=rank)
        score = _score(used, with_overheads(latency, over), "mean_tpot_s", seed, cv)
        if score is not None:
            points.append(FitPoint(it, rank, *score))
    if not points:
        raise InputError("validate", "runs", "an LLM that was not overloaded to fit on")
    best = min(points, key=lambda p: (round(p.score, 12), p.iteration_ms + p.tp_doubling_ms,
                                      p.iteration_ms))
    first = _first_token(used, latency, best, version, first_grid, seed, cv)
    over = EngineOverheads("muxserve", version, GPU, iteration_ms=best.iteration_ms,
                           tp_doubling_ms=best.tp_doubling_ms, first_token_ms=first,
                           source=source)
    over = replace(over, overload_queued=_queued(used, with_overheads(latency, over),
                                                 queued_grid, seed, cv))
    return OverheadsFit(over, tuple(points), tuple(f"{r.workload}/{r.strategy}" for r in used),
                        cv)


def _first_token(runs: Sequence[MuxRun], latency: LatencyModel, best: FitPoint, version: str,
                 grid: Sequence[float], seed: int, cv: float) -> float:
    """The ``first_token_ms`` of ``grid`` whose mean TTFT fits the LLMs that were not
    overloaded best (mean squared log-ratio; the smallest on ties)."""
    scores = []
    for ft in sorted(set(grid)):
        over = EngineOverheads("muxserve", version, GPU, iteration_ms=best.iteration_ms,
                               tp_doubling_ms=best.tp_doubling_ms, first_token_ms=ft)
        score = _score(runs, with_overheads(latency, over), "mean_ttft_s", seed, cv)
        if score is not None:
            scores.append((round(score[0], 12), ft))
    return min(scores)[1] if scores else 0.0


def _queued(runs: Sequence[MuxRun], latency: LatencyModel, grid: Sequence[float],
            seed: int, cv: float) -> float:
    """The ``overload_queued`` of ``grid`` whose p90 TTFT fits the LLMs predicted overloaded
    best (mean squared log-ratio; the smallest on ties; 0 when none is overloaded)."""
    scores = []
    for q in sorted(set(grid)):
        score = _score(runs, latency, "p90_ttft_s", seed, cv, overloaded=True, queued=q)
        if score is not None:
            scores.append((round(score[0], 12), q))
    return min(scores)[1] if scores else 0.0


def _score(runs: Sequence[MuxRun], latency: LatencyModel, metric: str, seed: int, cv: float,
           *,
           overloaded: bool = False, queued: float | None = None,
           ) -> tuple[float, int] | None:
    """The mean squared log-ratio of predicted to measured ``metric`` (a :class:`Figures`
    field) over the LLMs of ``runs`` that were not overloaded as measured (``overloaded``:
    that were overloaded as predicted), and how many there were (None: none)."""
    errs = []
    for run in runs:
        v = validate_run(run, latency, simulate_runs=False, seed=seed, queued=queued,
                         output_cv=cv)
        for fig in v.llms.values():
            m, p = getattr(fig["measured"], metric), getattr(fig["predicted"], metric)
            use = (bool(fig["predicted"].overloaded) if overloaded
                   else not fig["measured"].overloaded)
            if use and m > 0 and p > 0:
                errs.append(math.log(p / m) ** 2)
    return (sum(errs) / len(errs), len(errs)) if errs else None
