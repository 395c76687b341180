"""What a sweep run did, as a JSON-ready summary (the CLI prints it as a table)."""

from __future__ import annotations

from typing import Any

from scepsy_profile.profiling.models import EngineModel
from scepsy_profile.profiling.planner import SweepSpec, curve_errors
from scepsy_profile.profiling.sweep import SweepResult


def sweep_summary(result: SweepResult, spec: SweepSpec, engine: str,
                  model: EngineModel) -> dict[str, Any]:
    """Per curve (tp, share, phase): points measured, points failed and the planner's error
    estimate (percent) over the whole store, plus how the run ended and its notes."""
    # the sweep's records: this engine, model and device (none when no session started)
    mine = [r for r in result.store_records
            if r.engine == engine and r.model == model.name and r.scale == model.scale
            and r.device == result.device]
    errors = curve_errors(spec, mine)
    curves = []
    for tp, share, phase in spec.curves():
        rows = [r for r in mine if (r.tp, r.share, r.phase) == (tp, share, phase)]
        err = errors.get((tp, share, phase))
        curves.append({
            "tp": tp, "share": share, "phase": phase,
            "points": sum(r.status == "ok" for r in rows),
            "failed": sum(r.status == "failed" for r in rows),
            "error_pct": None if err is None else round(100 * err, 2),
        })
    notes = [f"stopped: {result.stopped} after {result.elapsed_s:.1f} s; "
             f"{len(result.ok)} points measured, {len(result.failed)} failed in this run, "
             f"{result.resumed} already in {result.store}"]
    notes += [f"skipped tp={s.tp} share={s.share:g}: {s.reason}" for s in result.skipped]
    notes += list(result.warnings)
    return {"store": str(result.store), "engine": engine, "model": model.profiled_name,
            "scale": model.scale, "device": result.device, "stopped": result.stopped,
            "elapsed_s": round(result.elapsed_s, 3), "measured": len(result.ok),
            "failed": len(result.failed), "resumed": result.resumed, "curves": curves,
            "notes": notes}
