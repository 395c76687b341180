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
    """At smoke size: two cases, one exact optimiser and one heuristic (the script's whole
    run is the benchmark, docs/benchmarks.md)."""
    out = tmp_path / "identity.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plan_identity.py"),
                           "--base", str(REPO), "--out", str(out), "--cases",
                           "rag-a100-4,heuristic"], capture_output=True,
                          text=True, timeout=1200, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["cases"]
    assert [r["case"] for r in rows] == ["rag-a100-4", "heuristic"]
    assert all(r["identical"] for r in rows)
    assert "| heuristic |" in proc.stdout


@pytest.mark.parametrize("cases", ["nope", "readme,nope", ","])
def test_unknown_cases_are_refused_naming_the_option(cases, tmp_path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plan_identity.py"),
                           "--base", str(REPO), "--out", str(tmp_path / "x.json"), "--cases",
                           cases], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "--cases" in proc.stderr
    assert not (tmp_path / "x.json").exists()
