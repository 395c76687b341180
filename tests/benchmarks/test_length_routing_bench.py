"""benchmarks/length_routing.py at smoke size: it runs, and of its two problems length routing
is taken where it is cheaper (long prompts on L4 + A10) and not where it is not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "length_routing.py"


def test_length_routing_is_taken_only_where_it_is_cheaper():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick"], cwd=SCRIPT.parent,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "length routing taken in 1 of 2 feasible problems" in proc.stdout
    rows = json.loads((REPO / "results" / "length_routing_quick.json").read_text())["rows"]
    for r in rows:
        assert r["used"] == (r["length_usd_h"] < r["weight_usd_h"] - 1e-9)
        assert r["length_usd_h"] <= r["weight_usd_h"] + 1e-9
    taken = [r for r in rows if r["used"]]
    assert [r["prompts"] for r in taken] == ["long"]
    assert all(r["simulated_s_length"] > 0 for r in taken)
