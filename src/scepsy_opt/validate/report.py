"""``scepsy validate``'s request and report: every run of a folder, measured against predicted
and simulated, and the JSON document (docs/validate.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from scepsy_common.errors import InputError
from scepsy_opt.prediction.slo import parse_slos
from scepsy_opt.validate.evaluate import OUTPUT_CV, Figures, RunValidation, validate_run
from scepsy_opt.validate.muxserve import RecordedWorkload, load_muxserve_dir
from scepsy_profile.latency import LatencyModel

SOURCES = ("measured", "predicted", "simulated")
FORMAT = "scepsy-validate/1"


@dataclass(frozen=True)
class ValidationReport:
    """Every run of ``folder``, and the latency model's description (``model``)."""

    folder: str
    model: str
    runs: tuple[RunValidation, ...]


def validate_muxserve(folder: str | Path, latency: LatencyModel, *, model: str = "",
                      simulate: bool = True, seed: int = 0,
                      slos: Mapping[str, Any] | None = None,
                      output_cv: float = OUTPUT_CV,
                      recorded: Sequence[RecordedWorkload] = ()) -> ValidationReport:
    """Read every run in ``folder`` (:func:`~scepsy_opt.validate.muxserve.load_muxserve_dir`)
    and validate each with ``latency`` (:func:`~scepsy_opt.validate.evaluate.validate_run`);
    ``slos``: per LLM (``"*"``: every LLM), the SLO whose attainment is reported
    (:func:`scepsy_opt.prediction.slo.parse_slos`, against each run's LLMs); ``output_cv``:
    the output lengths' coefficient of variation; ``recorded``: loads' recorded requests
    (each named after its load, ``<workload>.json``): a run of such a load is validated twice,
    with Poisson arrivals and with the recorded ones."""
    runs = load_muxserve_dir(folder)
    by_load: dict[str, RecordedWorkload] = {}
    loads = sorted({r.workload for r in runs})
    for w in recorded:
        stem = Path(w.source).stem
        if stem not in loads:
            raise InputError(w.source, "name", f"a workload file named after a load of "
                             f"{folder} ({', '.join(f'{x}.json' for x in loads)})", stem)
        by_load[stem] = w
    out = []
    for r in runs:
        given = parse_slos(slos, sorted(r.rates)) if slos else None
        out.append(validate_run(r, latency, simulate_runs=simulate, seed=seed,
                                output_cv=output_cv, slos=given))
        if r.workload in by_load:
            out.append(validate_run(r, latency, simulate_runs=simulate, seed=seed,
                                    output_cv=output_cv, slos=given,
                                    recorded=by_load[r.workload]))
    return ValidationReport(str(folder), model, tuple(out))


def error(predicted: float, measured: float) -> float:
    """The signed relative error ``predicted / measured − 1`` (NaN without a measurement)."""
    if not (math.isfinite(measured) and measured > 0) or not math.isfinite(predicted):
        return math.nan
    return predicted / measured - 1.0


def _figures(f: Figures | None) -> dict[str, Any] | None:
    if f is None:
        return None
    d = asdict(f)
    d["overloaded"] = list(f.overloaded)
    return {k: (_finite(v) if isinstance(v, float) else v) for k, v in d.items()}


def _llm_figures(f: Figures | None) -> dict[str, Any] | None:
    d = _figures(f)
    if d is not None:
        d["overloaded"] = bool(d["overloaded"])
    return d


def document(report: ValidationReport) -> dict[str, Any]:
    """The ``--json`` document: ``{"format", "folder", "model", "runs": [{"workload",
    "strategy", "arrivals", "measured", "predicted", "simulated", "errors", "llms",
    "shares"}]}`` (``arrivals``: ``"poisson"``, or ``"recorded"`` for the second entry of a
    run whose load's requests were given); figures
    ``{"throughput", "mean_latency_s", "p90_ttft_s", "mean_ttft_s", "mean_tpot_s",
    "overloaded", "attainment", "attainment_high", "decode_batch"}`` (the attainments null
    without SLOs; measured: the range its percentiles allow; ``decode_batch`` the mean
    sequences per decode step, measured and simulated per LLM, null elsewhere), errors ``predicted/measured − 1`` (and ``simulated/measured − 1``)."""
    runs = []
    for v in report.runs:
        errs = {src: {k: _finite(error(getattr(getattr(v, src), k), getattr(v.measured, k)))
                      for k in METRICS}
                for src in ("predicted", "simulated") if getattr(v, src) is not None}
        runs.append({
            "workload": v.workload, "strategy": v.strategy, "arrivals": v.arrivals,
            "measured": _figures(v.measured), "predicted": _figures(v.predicted),
            "simulated": _figures(v.simulated), "errors": errs,
            "llms": {m: {src: _llm_figures(f.get(src)) for src in SOURCES if src in f}
                     for m, f in v.llms.items()},
            "shares": {m: asdict(c) for m, c in v.shares.items()}})
    return {"format": FORMAT, "folder": report.folder, "model": report.model, "runs": runs}


METRICS = ("throughput", "mean_latency_s", "p90_ttft_s", "mean_ttft_s", "mean_tpot_s")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def run_rows(report: ValidationReport) -> list[dict[str, Any]]:
    """One row per run and source: the run's figures and their errors against measured."""
    rows = []
    for v in report.runs:
        for src in SOURCES:
            f = getattr(v, src)
            if f is None or (src == "measured" and v.arrivals != "poisson"):
                continue
            row: dict[str, Any] = {"workload": _short(v.workload), "strategy": v.strategy,
                                   "source": src if v.arrivals == "poisson"
                                   else f"{src} ({v.arrivals})"}
            for k in ("throughput", "mean_latency_s", "p90_ttft_s"):
                val = getattr(f, k)
                row[k] = val
                row[f"{k} err"] = ("" if src == "measured" else
                                   _pct(error(val, getattr(v.measured, k))))
            row["overloaded"] = len(f.overloaded)
            if f.attainment is not None:
                row["attainment"] = _share(f.attainment, f.attainment_high)
            rows.append(row)
    return rows


def run_columns(report: ValidationReport) -> tuple[str, ...]:
    """:data:`RUN_COLUMNS`, with ``attainment`` where SLOs were given."""
    slo = any(v.measured.attainment is not None for v in report.runs)
    return (*RUN_COLUMNS, "attainment") if slo else RUN_COLUMNS


def _share(low: float, high: float | None) -> str:
    """``93.1%``, or ``90.0-99.0%`` for a range."""
    if high is None or abs(high - low) < 5e-4:
        return f"{100 * low:.1f}%"
    return f"{100 * low:.1f}-{100 * high:.1f}%"


RUN_COLUMNS = ("workload", "strategy", "source", "throughput", "throughput err",
               "mean_latency_s", "mean_latency_s err", "p90_ttft_s", "p90_ttft_s err",
               "overloaded")


def llm_rows(v: RunValidation) -> list[dict[str, Any]]:
    """One row per LLM of a run: measured and predicted (and simulated) figures."""
    rows = []
    for m, f in v.llms.items():
        row: dict[str, Any] = {"llm": m, "shares": f"{v.shares[m].prefill:.2f}/"
                               f"{v.shares[m].decode:.2f}x{v.shares[m].slowdown:.2f}"}
        for src in SOURCES:
            if src not in f:
                continue
            tag = src[:4]
            row[f"thr {tag}"] = f[src].throughput
            row[f"lat {tag}"] = f[src].mean_latency_s
            row[f"ttft90 {tag}"] = f[src].p90_ttft_s
            row[f"tpot {tag}"] = f[src].mean_tpot_s
            if f[src].attainment is not None:
                row[f"slo {tag}"] = _share(cast(float, f[src].attainment), f[src].attainment_high)
        row["overloaded m/p"] = ("y" if f["measured"].overloaded else "n") + "/" + (
            "y" if f["predicted"].overloaded else "n")
        rows.append(row)
    return rows


def llm_columns(simulated: bool, slo: bool = False) -> tuple[str, ...]:
    tags = ("meas", "pred", "simu") if simulated else ("meas", "pred")
    keys = ("thr", "lat", "ttft90", "tpot", "slo") if slo else ("thr", "lat", "ttft90", "tpot")
    return ("llm", "shares", *(f"{k} {t}" for k in keys for t in tags), "overloaded m/p")


def _short(workload: str) -> str:
    """A workload's file stem without MuxServe's common prefix."""
    return workload.replace("requests_over_time_models_days_from_", "")


def _pct(x: float) -> str:
    return "" if not math.isfinite(x) else f"{100 * x:+.0f}%"
