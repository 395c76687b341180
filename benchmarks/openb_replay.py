"""Online replay of the Alibaba GPU-sharing trace (openb), FGD's simulation (Weng et al., ATC'23).

For each policy and seed: the trace's tasks plus seeded copies (sampled with replacement) until
requested GPU reaches 130% of the 1,213-node cluster's 6,212 GPUs, shuffled, arrive one by one;
a task that fits nowhere fails and is skipped. Prints allocation ratio (allocated GPU capacity /
total) and FGD fragmentation (/ idle GPU capacity) when arrived demand reaches 100% and 130%.
Published (artifact, mean of 10 seeds, default trace, 100% demand): best-fit ~92.9%, FGD ~95.2%.

    python benchmarks/openb_replay.py [--pods default|gpushare40|multigpu20|PATH]
        [--policies best-fit,fgd] [--seeds 42] [--quick]

Writes results/openb_replay.json. ``--quick`` replays every 8th node and the matching share of
tasks (seconds instead of a minute).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from _common import require_shared, table, write_results
from scepsy_place.openb import POLICIES, TIES, read_nodes, read_pods, replay

TRACE = Path("cluster-traces") / "alibaba-openb"
PUBLISHED_100 = {"best-fit": 0.929, "fgd": 0.952}  # default trace, FGD paper artifact


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", default="default",
                    help="default, gpushare40, multigpu20 or a pods CSV path")
    ap.add_argument("--nodes", default=None, help="nodes CSV (default: the openb GPU nodes)")
    ap.add_argument("--policies", default="best-fit,fgd",
                    help=f"comma list of {', '.join(sorted(POLICIES))}")
    ap.add_argument("--seeds", default="42", help="comma list of seeds (artifact: 42..51)")
    ap.add_argument("--until", type=float, default=1.3)
    ap.add_argument("--tie", default="name", choices=list(TIES),
                    help="tie-break among best-scored nodes (name: the artifact's; default)")
    ap.add_argument("--quick", action="store_true", help="every 8th node, proportional tasks")
    args = ap.parse_args(argv)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        print(f"error: --policies: unknown {', '.join(bad)}; expected {', '.join(sorted(POLICIES))}",
              file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.nodes is None or args.pods in ("default", "gpushare40", "multigpu20"):
        trace = require_shared() / TRACE
    nodes_path = Path(args.nodes) if args.nodes else trace / "openb_node_list_gpu_node.csv"
    pods_path = (trace / f"openb_pod_list_{args.pods}.csv"
                 if args.pods in ("default", "gpushare40", "multigpu20") else Path(args.pods))
    nodes, pods = read_nodes(nodes_path), read_pods(pods_path)
    if args.quick:
        k = 8
        nodes, pods = nodes[::k], pods[: max(1, len(pods) // k)]

    runs, rows = [], []
    for policy in policies:
        results = [replay(nodes, pods, policy, seed, args.until, tie=args.tie, progress=True)
                   for seed in seeds]
        runs += [r.to_dict() for r in results]

        def mean(attr: str, at: str, rs=results) -> float:
            vals = [getattr(getattr(r, at), attr) for r in rs if getattr(r, at) is not None]
            return statistics.fmean(vals) if vals else float("nan")

        rows.append({
            "policy": policy, "seeds": len(seeds),
            "alloc@100%": f"{100 * mean('alloc_ratio', 'at_100'):.2f}%",
            f"alloc@{args.until:.0%}": f"{100 * mean('alloc_ratio', 'at_end'):.2f}%",
            "frag@100%": f"{100 * mean('frag_ratio', 'at_100'):.2f}%",
            f"frag@{args.until:.0%}": f"{100 * mean('frag_ratio', 'at_end'):.2f}%",
            "frag GPUs@100%": round(mean("frag_gpus", "at_100"), 1),
            "failed": round(statistics.fmean(r.failed for r in results), 1),
            "published@100%": (f"{100 * PUBLISHED_100[policy]:.1f}%"
                               if policy in PUBLISHED_100 and args.pods == "default"
                               and not args.quick else "-"),
            "time/run": f"{statistics.fmean(r.seconds for r in results):.1f}s",
        })
    print(f"openb replay: {pods_path.name} on {len(nodes)} nodes "
          f"({sum(n.gpus for n in nodes)} GPUs), demand up to {args.until:.0%}, "
          f"seeds {args.seeds}, ties {args.tie}{' (quick)' if args.quick else ''}")
    print(table(rows, list(rows[0])))
    path = write_results("openb_replay", {
        "nodes": str(nodes_path), "pods": str(pods_path), "quick": args.quick,
        "until": args.until, "tie": args.tie, "seeds": seeds, "summary": rows, "runs": runs,
        "published_at_100": PUBLISHED_100})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
