"""HiGHS as installed solves a pattern master MIP on which HiGHS 1.16.0's presolve loops
without end, ignoring its time limit (pyproject.toml excludes that release). The MIP is the
pattern formulation's master for one 7B LLM at 64 req/s on A100 and H100 (min-cost,
solvers/mincost_bench.py). Run in a child process so that a hang fails the test instead of
stalling the suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MODEL = Path(__file__).resolve().parent / "data" / "highs-presolve-loop.mps"
CHILD = """
import json, sys, highspy
out = []
for presolve in ("on", "off"):
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(sys.argv[1])
    for k, v in (("threads", 1), ("random_seed", 0), ("time_limit", 5.0), ("presolve", presolve),
                 ("mip_rel_gap", 1e-9), ("mip_abs_gap", 0.0),
                 ("mip_feasibility_tolerance", 1e-9), ("primal_feasibility_tolerance", 1e-9),
                 ("dual_feasibility_tolerance", 1e-9)):
        h.setOptionValue(k, v)
    h.run()
    out.append((str(h.getModelStatus()), h.getInfo().objective_function_value))
print(json.dumps(out))
"""


def test_highs_solves_the_master_that_loops_in_presolve():
    run = subprocess.run([sys.executable, "-c", CHILD, str(MODEL)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    (st_on, obj_on), (st_off, obj_off) = json.loads(run.stdout)
    assert st_on.endswith("kOptimal") and st_off.endswith("kOptimal")
    assert abs(obj_on - obj_off) <= 1e-6 * max(1.0, abs(obj_off))
