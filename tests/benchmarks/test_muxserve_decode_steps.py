"""benchmarks/muxserve_decode_steps.py on the bundled example: one row per LLM and run, the
measured batch read from the results file, both ratios those of ``decoding_ratio``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "muxserve_decode_steps.py"
EXAMPLE = REPO / "datasets" / "e2e" / "muxserve-example"


def test_the_example_gives_a_row_per_llm_with_its_measured_batch():
    proc = subprocess.run([sys.executable, str(SCRIPT), str(EXAMPLE)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((REPO / "results" / "muxserve_decode_steps.json").read_text())["rows"]
    merged = {p.stem.rsplit("_", 1)[1]: json.loads(p.read_text())
              for p in (EXAMPLE / "merged").glob("*.json")}
    assert {(r["strategy"], r["llm"]) for r in rows} == {
        (s, m) for s, doc in merged.items() for m, v in doc.items() if isinstance(v, dict)}
    for r in rows:
        assert r["measured_batch"] == pytest.approx(
            merged[r["strategy"]][r["llm"]]["decoding_avg_batches"], rel=1e-12)
        assert r["measured_ratio"] > 0 and r["simulated_ratio"] > 0
    assert "decoding per step" in proc.stdout
