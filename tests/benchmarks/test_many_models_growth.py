"""benchmarks/solvers/many_models_growth.py: a tiny ladder writes its JSON, CSV and figure, its fitted
slopes are those numpy fits to the data it wrote, its rows carry every measure, and bad sizes
are refused with exit status 2. The fit itself is checked on exact power laws."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "solvers" / "many_models_growth.py"
_spec = importlib.util.spec_from_file_location("many_models_growth", SCRIPT)
assert _spec is not None and _spec.loader is not None
growth = importlib.util.module_from_spec(_spec)
sys.modules["many_models_growth"] = growth
_spec.loader.exec_module(growth)

FIT_TOL = 1e-9  # absolute, on slopes and intercepts of logs (a few units at most)
ROW_FIELDS = ("mix", "llms", "gpus", "time_limit_s", "status", "plan_status", "scale", "bound",
              "gap", "parts", "distinct_parts", "gpus_per_part", "probes", "probe_median_s", "probe_max_s", "build_s", "first_plan_s", "wall_s",
              "cpu_s", "shapes_s", "bound_s", "partition_s", "search_s", "subs_s", "layout_s",
              "price_s", "instrument_s", "peak_rss_mb", "peak_growth_mb", "load1_before",
              "load1_after")


def test_a_tiny_ladder_writes_its_outputs_and_fits_its_own_data(tmp_path):
    limit = 3.0  # a loaded machine may end a run without a plan: its row says so (below)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sizes", f"8x16:{limit:g},16x32:{limit:g}",
                           "--out", "g"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    res = tmp_path / "results"
    doc = json.loads((res / "g.json").read_text())
    png = (res / "g.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    assert sorted(p.name for p in res.iterdir()) == ["g.csv", "g.json", "g.png"]  # no temp left

    rows = doc["rows"]
    assert [(r["mix"], r["llms"], r["gpus"]) for r in rows] == [
        ("copies", 8, 16), ("copies", 16, 32), ("zipf", 8, 16), ("zipf", 16, 32)]
    for k in ("command", "started", "machine", "load1_before", "load1_after", "fits", "sizes"):
        assert k in doc
    for r in rows:
        assert set(ROW_FIELDS) <= set(r), set(ROW_FIELDS) - set(r)
        assert r["status"] in ("placed", "time_limit") and r["time_limit_s"] == limit
        assert r["bound"] > 0 and r["wall_s"] <= limit * 1.1 + 1 and r["probes"] >= 1
        assert 0 < r["build_s"] < r["wall_s"]
        if r["status"] == "placed":
            assert 0 < r["scale"] <= r["bound"] * (1 + 1e-9)
            assert math.isclose(r["gap"], r["bound"] / r["scale"] - 1, rel_tol=1e-12)
            assert r["parts"] >= 1 and 1 <= r["distinct_parts"] <= r["parts"]
            # the first plan comes after the build and by the end of the run
            assert r["build_s"] < r["first_plan_s"] <= r["wall_s"]
        else:
            assert r["scale"] == 0.0 and r["gap"] is None and r["first_plan_s"] is None
        assert 0 < r["probe_median_s"] <= r["probe_max_s"] <= r["search_s"]
        assert r["subs_s"] <= r["search_s"] and r["instrument_s"] < r["search_s"]
        assert r["build_s"] + sum(r[p] for p in ("shapes_s", "bound_s", "partition_s",
                                                "search_s", "layout_s", "price_s")) <= r["wall_s"]
        assert r["peak_rss_mb"] >= r["peak_growth_mb"] and r["peak_rss_mb"] > 0

    for mix in ("copies", "zipf"):
        mine = [r for r in rows if r["mix"] == mix]
        assert doc["fits"][mix]["wall_s"] is not None and doc["fits"][mix]["build_s"] is not None
        for k in growth.FIT_MEASURES:
            pts = [(r["llms"], r[k]) for r in mine if r[k] is not None and r[k] > 0]
            got = doc["fits"][mix][k]
            if len(pts) < 2:
                assert got is None
                continue
            x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
            slope, intercept = np.polyfit(x, y, 1)
            assert got["points"] == len(pts)
            assert abs(got["slope"] - slope) <= FIT_TOL and abs(got["intercept"] - intercept) <= FIT_TOL

    with open(res / "g.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    for t, r in zip(table, rows, strict=True):
        assert t["mix"] == r["mix"] and int(t["llms"]) == r["llms"]
        assert float(t["wall_s"]) == r["wall_s"] and float(t["build_s"]) == r["build_s"]


@given(st.floats(-3, 3), st.floats(-5, 5),
       st.lists(st.integers(1, 10**6), min_size=2, max_size=8, unique=True))
def test_the_fit_recovers_an_exact_power_law(k, c, ns):
    ys = [math.exp(c) * n ** k for n in ns]
    f = growth.loglog_fit(ns, ys)
    assert f is not None and f.points == len(ns)
    assert math.isclose(f.slope, k, abs_tol=1e-7) and math.isclose(f.intercept, c, abs_tol=1e-5)


def test_the_fit_leaves_out_what_has_no_logarithm():
    assert growth.loglog_fit([10, 100], [1.0, None]) is None
    assert growth.loglog_fit([10, 10, 10], [1.0, 2.0, 3.0]) is None  # one N: no slope
    f = growth.loglog_fit([10, 100, 1000], [1.0, 0.0, 100.0])
    assert f is not None and f.points == 2 and math.isclose(f.slope, 1.0)


def test_bad_sizes_are_refused_with_exit_status_2(tmp_path):
    for bad in ("16x32", "16x30:5", "0x32:5", "16x32:-1", "axb:1", "16x32:nan"):
        proc = subprocess.run([sys.executable, str(SCRIPT), "--sizes", bad], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "--sizes" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, str(SCRIPT), "--mixes", "copies,uniform"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--mixes" in proc.stderr
    assert not (tmp_path / "results").exists()
