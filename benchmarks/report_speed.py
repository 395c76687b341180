"""How long ``scepsy report`` takes on a plan: wall and CPU seconds of the whole command (Python
start-up, imports, the figures and the page), best and median of several runs.

    python benchmarks/report_speed.py [--plan datasets/plans/rag-beam-a100-16.json] [--runs 5]

Target: at most 5 s on the bundled plan. Prints a table and writes results/report_speed.json.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, table, write_results

BUNDLED = REPO / "datasets" / "plans" / "rag-beam-a100-16.json"


def one_run(plan: Path, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one ``scepsy report PLAN --out OUT`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "scepsy.cli", "report", str(plan), "--out", str(out)],
                   check=True, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", type=Path, default=BUNDLED)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.runs):
            wall, cpu = one_run(args.plan, Path(tmp) / f"r{k}")
            walls.append(wall)
            cpus.append(cpu)
    rows = [{"plan": args.plan.name, "runs": args.runs,
             "wall_best_s": round(min(walls), 2), "wall_median_s": round(statistics.median(walls), 2),
             "cpu_median_s": round(statistics.median(cpus), 2), "target_s": 5.0}]
    print(table(rows, list(rows[0])))
    write_results("report_speed", {"rows": rows, "walls_s": walls, "cpus_s": cpus})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
