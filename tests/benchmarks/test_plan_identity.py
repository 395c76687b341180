"""benchmarks/plan_identity.py: the same checkout compared with itself plans every bundled
example to the same plan.json in two processes (determinism), and the script says so."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow
def test_a_checkout_plans_the_examples_as_itself(tmp_path) -> None:
    out = tmp_path / "identity.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plan_identity.py"),
                           "--base", str(REPO), "--out", str(out)], capture_output=True,
                          text=True, timeout=1200, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["cases"]
    assert len(rows) == 8 and all(r["identical"] for r in rows)
    assert "| readme |" in proc.stdout
