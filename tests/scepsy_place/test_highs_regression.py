"""The pattern formulation's master MIP settles within its time limit on a model where HiGHS
1.16.0's MIP presolve loops without end, ignoring the time limit: the master runs without
presolve (scepsy_place.formulations.patterns._master_mip). The model is the master for one 7B LLM at 64
req/s on A100 and H100 (min-cost, benchmarks/solvers/mincost_bench.py). Run in a child process so that a
hang fails the test instead of stalling the suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

MODEL = Path(__file__).resolve().parents[1] / "data" / "highs-presolve-loop.mps"
CHILD = """
import json, sys, time
import highspy
from scepsy_place.formulations.patterns import _highs
h = _highs(5.0)
h.setOptionValue("presolve", "off")  # as _master_mip runs it
h.readModel(sys.argv[1])
t = time.perf_counter()
h.run()
print(json.dumps([str(h.getModelStatus()), h.getInfo().objective_function_value,
                  time.perf_counter() - t]))
"""


def test_the_master_mip_that_loops_in_highs_presolve_settles():
    run = subprocess.run([sys.executable, "-c", CHILD, str(MODEL)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    status, objective, seconds = json.loads(run.stdout.splitlines()[-1])
    assert status.endswith("kOptimal")
    assert objective > 0 and seconds < 5.0 * 1.1 + 1



RENS_MODEL = MODEL.parent / "highs-rens-presolve-loop.mps.gz"
RENS_CHILD = """
import json, sys, time
from scepsy_place.formulations.patterns import _highs
h = _highs(3.8, 0.01)  # as a part's feasibility probe runs it (slots._solve)
h.readModel(sys.argv[1])
t = time.perf_counter()
h.run()
print(json.dumps([str(h.getModelStatus()), time.perf_counter() - t]))
"""


def test_a_slot_probe_whose_rens_sub_mip_loops_in_highs_presolve_keeps_its_time_limit():
    """A max-throughput part's feasibility model (Zipf 256 / 512, the 64 LLMs on 32 H100
    nodes at 0.96 of the bound) on which HiGHS 1.16.0's RENS heuristic presolves its sub-MIP
    for minutes past a 3.8 s limit: slot models run without RENS and end within it."""
    run = subprocess.run([sys.executable, "-c", RENS_CHILD, str(RENS_MODEL)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    status, seconds = json.loads(run.stdout.splitlines()[-1])
    assert status.endswith(("kOptimal", "kTimeLimit")), status
    assert seconds < 3.8 * 1.1 + 1


def _assignment(n: int, m: int, seed: int):
    """A generalised assignment MILP (n items to m bins of capacity, each item once) as a
    slot model is built: one binary column per (item, bin)."""
    from scepsy_place.formulations.patterns import _Model
    rng = np.random.default_rng(seed)
    model = _Model()
    once = [model.row(1.0, 1.0) for _ in range(n)]
    cap = [model.row(-np.inf, float(n) * 5.0 / m) for _ in range(m)]
    for i in range(n):
        for b in range(m):
            model.col(float(rng.integers(1, 50)), 0.0, 1.0, [once[i], cap[b]],
                      [1.0, float(rng.integers(1, 10))], integer=True)
    return model


def test_large_slot_models_solve_in_a_killable_child_with_the_same_answer(monkeypatch):
    """_run_mip sends models of KILLABLE_COLUMNS columns and more to a child process (where a
    HiGHS loop without a time check can be killed) and smaller ones not; both ways give the
    same answer."""
    from scepsy_opt.planning import solver
    from scepsy_place.formulations import patterns
    if not solver.can_fork():
        pytest.skip("the platform cannot fork")
    calls: list[int] = []

    def spy(h, limit):
        calls.append(h.getNumCol())
        return solver.run_killable(h, limit)

    monkeypatch.setattr(patterns, "run_killable", spy)
    big = _assignment(100, 12, 3)
    assert len(big.cost) >= patterns.KILLABLE_COLUMNS
    child = patterns._run_mip(big, 20.0, 1e-9)
    assert calls == [len(big.cost)]
    small = _assignment(10, 4, 3)
    assert len(small.cost) < patterns.KILLABLE_COLUMNS
    patterns._run_mip(small, 20.0, 1e-9)
    assert calls == [len(big.cost)]  # not in a child
    monkeypatch.setattr(patterns, "KILLABLE_COLUMNS", 10 ** 9)
    here = patterns._run_mip(big, 20.0, 1e-9)
    assert child[0] == here[0] == "optimal"
    assert child[2] == pytest.approx(here[2], rel=1e-9)
    assert np.allclose(child[1], here[1], atol=1e-9)
