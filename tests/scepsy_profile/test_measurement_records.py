"""The real-engine measurement records (datasets/measurements/) hold together: every request
accounted for, the measured trace readable and as large as the completed requests, the curves
covering every instance of the allocation (the record's own, or those of the record its
``profile`` file names), and the catalog and workflow files they name present; every serving-curve
record readable, with curves of its model (benchmarks/fidelity.py recomputes the predictions
from them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scepsy.api import using_catalog
from scepsy_opt.traces import read_trace
from scepsy_opt.workload import load_specs, models_of
from scepsy_profile.fitted import load_curves
from scepsy_profile.profiling.servecurve import load_result

REPO = Path(__file__).resolve().parents[2]
MEASUREMENTS = REPO / "datasets" / "measurements"
RECORDS = sorted(p.parent for p in MEASUREMENTS.glob("*/results.json"))
SERVES = sorted(p.parent for p in MEASUREMENTS.glob("*/serve-curve.json"))


def curves_path(folder: Path) -> Path:
    """A record's step-profile curves: its own, or the ``profile`` record's (same session)."""
    own = folder / "curves.json"
    if own.is_file():
        return own
    ref = (folder / "profile").read_text().strip()
    assert (MEASUREMENTS / ref).is_dir(), f"{folder.name}: profile names no record ({ref!r})"
    return MEASUREMENTS / ref / "curves.json"


def test_there_is_a_record() -> None:
    assert RECORDS, "datasets/measurements holds no record"


@pytest.mark.parametrize("folder", RECORDS, ids=[p.name for p in RECORDS])
def test_record_holds_together(folder: Path) -> None:
    res = json.loads((folder / "results.json").read_text())
    drive = res["drive"]
    assert drive["completed"] + drive["failed"] == drive["sent"]
    assert drive["sent"] + drive["not_sent"] == drive["planned"]
    assert res["clean"] is True
    trace = read_trace(folder / "measured-trace.jsonl")
    requests = {(c.workflow, c.request_id) for c in trace.calls}
    assert len(requests) == drive["completed"]
    per_llm = {}
    for c in trace.calls:
        if c.llm is not None:
            per_llm[c.llm] = per_llm.get(c.llm, 0) + 1
    assert per_llm == {m: v["ok"] for m, v in drive["llms"].items()}
    with using_catalog(REPO / res["options"]["catalog"]):
        models = models_of(load_specs(REPO / res["options"]["workflow"]))
        curves = load_curves(curves_path(folder))
        for llm, inst in res["allocation"].items():
            assert curves.covers(models[llm], inst["gpu"], inst["tp"]), llm
    assert (REPO / res["options"]["workflow"]).is_file()


@pytest.mark.parametrize("folder", SERVES, ids=[p.name for p in SERVES])
def test_serve_record_holds_together(folder: Path) -> None:
    result = load_result(folder / "serve-curve.json")
    assert result.engine == "vllm" and result.engine_version
    assert result.points and result.saturation_rate > 0
    assert any(not p.saturated for p in result.points)
    with using_catalog(REPO / "datasets" / "catalogs" / "cpu-host.yaml"):
        curves = load_curves(curves_path(folder))
        assert curves.covers(result.profiled_name, "cpu", result.tp)


GPU_MPS = MEASUREMENTS / "gpu-h200-torch-mps"


@pytest.mark.parametrize("store", sorted(GPU_MPS.glob("*.jsonl")), ids=lambda p: p.stem)
def test_the_h200_stores_are_profile_stores_of_the_device_they_name(store: Path) -> None:
    from scepsy_profile.profiling.store import read_store

    records = read_store(store).records
    ok = [r for r in records if r.status == "ok"]
    share = float(store.stem.rsplit("-", 1)[1])
    assert ok, store
    assert {r.device for r in ok} == {"H200"} and {r.share for r in ok} == {share}
    assert all(r.latency_ms > 0 for r in ok)
    mps = {r.device_detail.get("mps_active_thread_percentage") for r in ok}
    assert mps == ({None} if share == 1 else {round(share * 100)})


def test_the_h200_comparison_lines_up_points_measured_more_than_once() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpu_mps_compare", REPO / "benchmarks" / "gpu_mps_compare.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.table(GPU_MPS)
    models = {r["model"] for r in rows}
    assert models == {"qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3-8b"}
    for r in rows:
        measured = [v for k, v in r.items() if k.startswith(("alone_", "pair_")) and v is not None]
        assert r["model"] == "llama-3-8b" or len(measured) >= 2, r
        # the roofline never predicts a smaller share faster
        assert 0 < r["roofline_1.0"] <= r["roofline_0.5"], r
