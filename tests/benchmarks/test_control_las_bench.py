"""benchmarks/las_vs_fcfs.py: the quick run prints its table, writes its JSON, and compares the
two priorities on the same arrivals at the same load."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import las_vs_fcfs  # noqa: E402


def test_quick_run_writes_both_priorities_at_every_load(tmp_path, capsys):
    out = tmp_path / "las.json"
    assert las_vs_fcfs.main(["--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "las/fcfs p90" in printed and "saturates at" in printed
    assert doc["saturation_rate"] > 0
    rows = doc["rows"]
    assert [(r["load"], r["priority"]) for r in rows] == [(1.0, "fcfs"), (1.0, "las")]
    fcfs, las = rows
    assert fcfs["arrivals"] == las["arrivals"] == las_vs_fcfs.QUICK["requests"]
    assert fcfs["total_rate"] == las["total_rate"]  # equal load
    for r in rows:
        assert r["unfinished"] == 0
        assert set(r["p90_latency_s"]) == {"rag", "beam_search"}
        assert all(math.isfinite(x) and x > 0 for x in r["p90_latency_s"].values())
        assert 0 < r["mean_all_s"] <= r["p90_all_s"]


def test_bad_loads_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        las_vs_fcfs.main(["--quick", "--loads", "1,x"])
    assert e.value.code == 2
    assert "--loads" in capsys.readouterr().err
