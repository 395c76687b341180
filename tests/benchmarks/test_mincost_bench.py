"""benchmarks/solvers/mincost_bench.py at smoke size: it runs, writes its results, its placed prices meet
their bounds, and its gap check can fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "solvers" / "mincost_bench.py"


def test_single_model_prices_meet_their_bounds(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--models", "llama-7b,llama-30b",
                           "--rates", "4", "--offers", "L4+A10,A10+A100", "--time-limit", "30",
                           "--out", "smoke"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    res = json.loads((tmp_path / "results" / "smoke.json").read_text())
    assert proc.returncode == 0 and res["problems"] == [], proc.stdout
    placed = [r for r in res["rows"] if r["placed"]]
    assert len(placed) == 3  # a 30B model fits no single L4 or A10 (no NVLink for TP)
    for r in placed:
        assert r["price"] <= r["bound"] * 1.02 + 1e-9
        assert r["price"] <= r["others"] + 1e-9
        assert r["wall_s"] <= 30 * 1.1 + 1


def test_a_price_above_its_bound_is_reported(tmp_path, monkeypatch):
    sys.path.insert(0, str(SCRIPT.parent))
    import mincost_bench as bench

    def fake(model, rate, offer, limit):
        return {"model": model, "rate": rate, "offer": offer, "wall_s": 0.1, "status":
                "heuristic", "placed": True, "price": 3.0, "bound": 2.0, "gap": 0.5,
                "gpus": {}, "others": 3.0, "formulation": "aggregate", "splits": {}}

    monkeypatch.setattr(bench, "run", fake)
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--models", "llama-7b", "--rates", "1", "--offers", "L4+A10",
                       "--out", "gap"]) == 1
    out = json.loads((tmp_path / "results" / "gap.json").read_text())
    assert any("50.00% above its bound" in p for p in out["problems"])
