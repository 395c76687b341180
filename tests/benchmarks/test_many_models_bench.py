"""benchmarks/solvers/many_models_bench.py at smoke size: it runs, writes its results, and its checks (the
replication floor, the time limit) hold and can fail."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "solvers" / "many_models_bench.py"


def run(tmp: Path, *args: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", "smoke"], cwd=tmp,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, json.loads((tmp / "results" / "smoke.json").read_text())


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
def test_two_copies_are_planned_at_or_above_their_replication_floor(tmp_path):
    # 15 s: 8 s left a loaded 2-core machine (a test run beside other work) below the floor
    code, res = run(tmp_path, "--sizes", "16x32,32x64", "--time-limit", "15",
                    "--no-min-latency")
    assert code == 0 and res["problems"] == []
    one, two = res["rows"]
    assert one["floor"] == one["scale"] and two["floor"] == one["scale"]
    for row in res["rows"]:
        assert row["status"] == "placed"
        assert 0 < row["scale"] <= row["bound"]
        assert row["gap"] == row["bound"] / row["scale"] - 1
        assert row["wall_s"] <= 15 * 1.1 + 1
        # every LLM on one GPU type: between the plan (which is so) and the LP over types
        assert row["scale"] <= row["bound_one_type"] <= row["bound"] * (1 + 1e-12)


def test_a_plan_below_its_floor_is_reported_as_a_problem(tmp_path, monkeypatch):
    """The check itself: with the floor's run given the time and the larger instance almost
    none, the larger plan falls below the floor (or finds nothing), and the script says so."""
    sys.path.insert(0, str(SCRIPT.parent))
    import many_models_bench as bench

    def fake(n, g, limit, seed, copies=True, formulation="auto"):  # runs in the forked child
        scale = 1.0 if (n, g) == bench.BLOCK else 0.5
        return {"status": "placed", "plan_status": "heuristic", "formulation": "slots",
                "scale": scale, "bound": 1.2, "gap": 1.2 / scale - 1, "wall_s": 0.1,
                "cpu_s": 0.1, "parts": 1}

    monkeypatch.setattr(bench, "max_throughput", fake)
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--sizes", "32x64", "--no-min-latency", "--out", "floor"]) == 1
    out = json.loads((tmp_path / "results" / "floor.json").read_text())
    assert any("below its replication floor 1.0000" in p for p in out["problems"])
    assert out["rows"][0]["floor"] == 1.0 and out["rows"][0]["scale"] == 0.5


def test_a_run_out_of_time_reports_its_bound_and_its_whole_wall_time(monkeypatch):
    """Every probe is cut short after its whole time, so the deadline passes with no plan: the
    row still carries the proven bound, and its wall time counts the problem's build too."""
    sys.path.insert(0, str(SCRIPT.parent))
    import many_models_bench as bench
    import scepsy_place.formulations.slots as slots

    def cut(*a, time_limit_s=None, **k):
        time.sleep(min(time_limit_s or 0.0, 1.0))
        return slots._none("time_limit")

    monkeypatch.setattr(slots, "solve_slot_scale", cut)
    row = bench.max_throughput(64, 128, 3.0, 0, copies=False)
    assert row["status"] == "time_limit" and row["scale"] == 0.0 and row["gap"] is None
    assert row["bound"] is not None and row["bound"] > 0
    assert row["probes_cut"] > 0
    assert 0 < row["build_s"] < row["wall_s"] <= 3.0 * 1.1 + 1


def test_min_cost_at_smoke_size_reports_a_price_at_or_above_its_bound(tmp_path):
    """``--min-cost``: min-cost at 0.8 of the scale found places, its price at or above the
    price bound and its gap that ratio less one, within the time limit's slack."""
    code, res = run(tmp_path, "--sizes", "16x32", "--time-limit", "8", "--no-min-latency",
                    "--min-cost", "--zipf-over-all")
    assert code == 0 and res["problems"] == []
    mc = res["rows"][0]["min_cost"]
    assert mc["status"] == "placed"
    assert mc["cost_per_hour"] >= mc["bound_per_hour"] * (1 - 1e-9) > 0
    assert mc["gap"] == pytest.approx(mc["cost_per_hour"] / mc["bound_per_hour"] - 1,
                                      rel=1e-9, abs=1e-12)
    assert mc["wall_s"] <= 8 * 1.1 + 1


@pytest.mark.slow
def test_min_cost_within_mean_bounds_at_smoke_size_meets_them(tmp_path):
    """``--min-cost --mean-bounds 2``: every workflow bounded at twice its LLM's least latency;
    the plan places, meets every bound as predicted, and is priced at or above its bound."""
    # 30 s: the slot groups' first plan takes 6-12 s on 2 cores (HiGHS's seed decides), so a
    # 20 s limit leaves too little margin on a loaded CI machine
    code, res = run(tmp_path, "--sizes", "16x32", "--time-limit", "30", "--no-min-latency",
                    "--min-cost", "--zipf-over-all", "--mean-bounds", "2")
    assert code == 0 and res["problems"] == []
    mc = res["rows"][0]["min_cost"]
    assert mc["status"] == "placed" and mc["mean_bounds"] == 2 and mc["bounds_met"] is True
    assert mc["cost_per_hour"] >= mc["bound_per_hour"] * (1 - 1e-9) > 0
    assert mc["wall_s"] <= 30 * 1.1 + 1


@pytest.mark.slow
def test_min_latency_of_256_skewed_llms_places_within_its_time_limit():
    """Min-latency at 0.8 of the carried scale on one Zipf over 256 LLMs / 512 GPUs (``auto``:
    blocks, which place nothing here, take half the time first). Slot groups in parts get each
    part a plan that carries its targets first, in rounds that each get a share of the time
    left, so that every part has one before the latency MILPs run: a placed plan carrying the
    targets, within the limit, with a proven gap."""
    sys.path.insert(0, str(SCRIPT.parent))
    import many_models_bench as bench

    # 60 s: the bound's child needs 12-13 s of a core of its own; with the suite on both cores
    # beside it (two workers, each with a child) 30 s left it none in time
    limit = 60.0
    row = bench.min_latency(256, 512, limit, 0, 0.8 * 1.2180, copies=False)
    assert row["status"] == "placed", row
    assert row["objective_s"] is not None and row["objective_s"] > 0
    # the aggregate MILP's bound, in a child beside the search, proves a gap: a bound below
    # the plan's objective
    assert row["gap"] is not None and row["gap"] >= 0, row
    assert row["wall_s"] <= limit * 1.1 + 1
