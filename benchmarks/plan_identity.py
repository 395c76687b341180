"""plan.json before and after a change: the bundled examples planned by two checkouts.

    git worktree add /tmp/base REV
    python benchmarks/plan_identity.py --base /tmp/base [--out results/plan-identity.json]
        [--cases readme,min-cost]

Runs ``scepsy plan --no-timings --json`` on each example with this checkout's ``src`` and with
the other checkout's, and compares the two documents; the ``request`` section (which older
plans lack) is left out of the comparison. Prints a table and writes the results as JSON. Exit
status 1 when a plan differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
CASES: dict[str, list[str]] = {
    "readme": ["--workflow", "datasets/workflows/rag-beam.yaml", "--cluster",
               "datasets/clusters/a100-16.yaml", "--target", "0.6", "--trace-requests", "300"],
    "rag-a100-4": ["--workflow", "datasets/workflows/rag.yaml", "--cluster",
                   "datasets/clusters/a100-4.yaml", "--target", "1", "--trace-requests", "200"],
    "max-throughput": ["--workflow", "datasets/workflows/rag-beam.yaml", "--cluster",
                       "datasets/clusters/a100-16.yaml", "--target", "2", "--objective",
                       "max-throughput", "--latency-bound", "60", "--trace-requests", "200"],
    "min-cost": ["--workflow", "datasets/workflows/rag.yaml", "--cluster",
                 "datasets/clusters/shop-h100-l4.yaml", "--target", "1", "--objective",
                 "min-cost", "--latency-bound", "30", "--trace-requests", "200"],
    "racks": ["--workflow", "datasets/workflows/rag-beam.yaml", "--cluster",
              "datasets/clusters/racks-a100-h100.yaml", "--target", "0.6", "--trace-requests",
              "200"],
    "heuristic": ["--workflow", "datasets/workflows/rag-beam.yaml", "--cluster",
                  "datasets/clusters/a100-16.yaml", "--target", "0.6", "--optimiser",
                  "heuristic", "--trace-requests", "200"],
    "ffd": ["--workflow", "datasets/workflows/beam-search.yaml", "--cluster",
            "datasets/clusters/a100-16.yaml", "--target", "0.5", "--placer", "ffd",
            "--trace-requests", "200"],
    "coding-agent": ["--workflow", "datasets/workflows/coding-agent.yaml", "--cluster",
                     "datasets/clusters/a100-16.yaml", "--target", "0.3", "--trace-requests",
                     "200"],
}
RUN = "import sys; from scepsy.cli import main; sys.exit(main())"


def plan(root: Path, argv: list[str], out: Path) -> dict:
    """The plan.json the checkout at ``root`` writes for ``argv``."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    proc = subprocess.run([sys.executable, "-c", RUN, "plan", *argv, "--no-timings", "--quiet",
                           "--out", str(out)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"{root}: scepsy plan {' '.join(argv)} failed: {proc.stderr[-500:]}")
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other checkout")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "plan-identity.json")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated cases to compare (default all: {', '.join(CASES)})")
    args = ap.parse_args()
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CASES]
    if unknown or not chosen:
        ap.error(f"--cases: expected names among {', '.join(CASES)} (got {args.cases!r})")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            argv = CASES[name]
            old = plan(args.base.resolve(), argv, Path(tmp) / f"{name}-base.json")
            new = plan(HERE, argv, Path(tmp) / f"{name}-here.json")
            old.pop("request", None)
            new.pop("request", None)
            differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            rows.append({"case": name, "status": new.get("status"), "identical": not differ,
                         "differing_sections": differ})
    print("| case | status | identical | differing sections |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['case']} | {r['status']} | {r['identical']} | "
              f"{', '.join(r['differing_sections']) or '-'} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cases": rows}, indent=2) + "\n")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
