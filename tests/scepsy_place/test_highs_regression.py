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
