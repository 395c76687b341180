"""benchmarks/gateway_overhead.py at smoke size: the gateway (routes of two endpoints, LAS on) and
the plain proxy in their own processes, a few calls each way; every call is recorded and the
JSON holds the figures docs/benchmarks.md quotes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_gateway_overhead_bench_runs_at_smoke_size(tmp_path):
    out = tmp_path / "gw.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gateway_overhead.py"),
                          "--calls", "30", "--warmup", "5", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["recorded"] == res["expected"] == 2 * (30 + 5)
    assert res["priority"] == "las" and res["target_p50_ms"] == 1.0
    assert [r["kind"] for r in res["rows"]] == ["non-streaming", "streaming"]
    for row in res["rows"]:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float))
        assert row["direct_p50_ms"] > 0 and row["routed_p50_ms"] > 0
        assert row["ratio_p50"] == pytest.approx(row["routed_p50_ms"] / row["direct_p50_ms"],
                                                 rel=0.01)
    for kind in ("non-streaming", "streaming"):
        assert {k: len(v) for k, v in res["samples_ms"][kind].items()} == {
            "direct": 30, "record": 30, "routed": 30, "routed_asyncio": 30}
    assert res["gateway_route_mean_ms"] > 0 and res["routing_us_per_call"] > 0
    assert "overhead_p50_ms" in run.stdout and f"wrote {out}" in run.stdout
