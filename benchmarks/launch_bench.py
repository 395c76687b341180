"""``scepsy plan`` end to end on the bundled 16-GPU example, with placement and the rendering of
all three launch targets (issue 13, "Numbers": ≤ 3 s wall on 2 cores, median of 5).

    python benchmarks/launch_bench.py [--runs 5] [--out results/launch_bench.json]

Each run is the whole command in a fresh process (interpreter start, imports, trace generation,
statistics, candidates, the MILP, placement, plan.json, then the shell, Kubernetes and Ray Serve
files), timed by wall clock from the parent:

    scepsy plan --workflow datasets/workflows/rag-beam.yaml --cluster datasets/clusters/a100-16.yaml
        --target 0.6 --trace-requests 300 --out TMP/plan.json --launch shell,k8s,ray --quiet

Prints the per-run times and the median, minimum and maximum, with the machine's load average,
and writes them to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, RESULTS, table, write_results

TARGET_S = 3.0
COMMAND = ["plan", "--workflow", "datasets/workflows/rag-beam.yaml", "--cluster",
           "datasets/clusters/a100-16.yaml", "--target", "0.6", "--trace-requests", "300",
           "--launch", "shell,k8s,ray", "--quiet"]


def scepsy_command() -> list[str]:
    exe = shutil.which("scepsy")
    return [exe] if exe else [sys.executable, "-m", "scepsy.cli"]


def one_run(work: Path) -> float:
    out = work / "plan.json"
    argv = [*scepsy_command(), *COMMAND, "--out", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"scepsy plan failed ({done.returncode}): {done.stderr.strip()}")
    for target in ("shell", "k8s", "ray"):
        if not (work / f"launch-{target}" / ".scepsy-launch").is_file():
            sys.exit(f"scepsy plan did not render {target}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS / "launch_bench.json")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    times = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="scepsy-launch-bench-") as tmp:
            times.append(one_run(Path(tmp)))
        print(f"run {i + 1}: {times[-1]:.2f} s", file=sys.stderr, flush=True)
    med = statistics.median(times)
    cols = ["command", "median s", "min s", "max s", "target", "verdict"]
    rows = [dict(zip(cols, ["plan + place + render shell, k8s, ray", f"{med:.2f}",
                            f"{min(times):.2f}", f"{max(times):.2f}", f"≤ {TARGET_S:g}",
                            "met" if med <= TARGET_S else "missed"], strict=True))]
    print(table(rows, cols, align="left"))
    print(f"load average at start {load0:.2f}, at end {os.getloadavg()[0]:.2f}")
    path = write_results(args.out.stem, {"command": ["scepsy", *COMMAND, "--out", "TMP"],
                                         "runs_s": times, "median_s": med,
                                         "target_s": TARGET_S, "load_start": load0,
                                         "load_end": os.getloadavg()[0]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
