"""Online replay of the Alibaba GPU-sharing trace (openb), FGD's simulation (Weng et al., ATC'23).

For each policy and seed: the trace's tasks, shuffled, then seeded copies (sampled with
replacement) until requested GPU reaches 130% of the 1,213-node cluster's 6,212 GPUs, arrive one
by one; a task that fits nowhere fails and is skipped. Prints allocation ratio (allocated GPU
capacity / total) and FGD fragmentation (/ idle GPU capacity) when arrived demand reaches 100%
and 130%. Published (artifact, mean of 10 seeds, 100% demand): see PUBLISHED_100.

    python benchmarks/openb_replay.py [--pods default|gpushare40|multigpu20|PATH]
        [--variant cpu050|cpu100|cpu200|cpu250] [--policies best-fit,fgd] [--seeds 42] [--quick]

``--variant cpuNNN`` replays the trace family's non-GPU variant built from the pods
(:func:`scepsy_place.packing.openb.cpu_variant`: the GPU tasks plus CPU-only tasks resampled to 5, 10,
20 or 25% of the task count). Writes results/openb_replay.json (``--out`` to change).
``--quick`` replays every 8th node and the matching share of tasks (seconds, not minutes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from _common import require_shared, table, write_results
from scepsy_place.packing.openb import (
    CPU_VARIANTS,
    ORDERS,
    POLICIES,
    TIES,
    cpu_variant,
    read_nodes,
    read_pods,
    replay,
)

TRACE = Path("cluster-traces") / "alibaba-openb"
# FGD paper artifact, mean of seeds 42..51 at 100% demand: the paper (default trace) and the
# artifact's expected_results/analysis_allo_discrete.csv (non-GPU variants).
PUBLISHED_100 = {
    "default": {"best-fit": 0.929, "fgd": 0.952},
    "gpushare40": {"best-fit": 0.914, "fgd": 0.939},
    "cpu050": {"best-fit": 0.936, "fgd": 0.950},
    "cpu100": {"best-fit": 0.933, "fgd": 0.952},
    "cpu200": {"best-fit": 0.922, "fgd": 0.948},
    "cpu250": {"best-fit": 0.912, "fgd": 0.932},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", default="default",
                    help="default, gpushare40, multigpu20 or a pods CSV path")
    ap.add_argument("--nodes", default=None, help="nodes CSV (default: the openb GPU nodes)")
    ap.add_argument("--policies", default="best-fit,fgd",
                    help=f"comma list of {', '.join(sorted(POLICIES))}")
    ap.add_argument("--seeds", default="42", help="comma list of seeds (artifact: 42..51)")
    ap.add_argument("--variant", default=None, choices=sorted(CPU_VARIANTS),
                    help="non-GPU variant built from the pods (share of CPU-only tasks)")
    ap.add_argument("--variant-seed", type=int, default=0,
                    help="seed of the variant's CPU-only draws (default 0)")
    ap.add_argument("--until", type=float, default=1.3)
    ap.add_argument("--tie", default=TIES[0], choices=list(TIES),
                    help=f"tie-break among best-scored nodes ({TIES[0]}: the artifact's; default)")
    ap.add_argument("--order", default=ORDERS[0], choices=list(ORDERS),
                    help=f"arrival order ({ORDERS[0]}: the artifact's; default)")
    ap.add_argument("--quick", action="store_true", help="every 8th node, proportional tasks")
    ap.add_argument("--out", default="openb_replay", help="results/<OUT>.json (openb_replay)")
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
    if args.variant:
        pods = cpu_variant(pods, CPU_VARIANTS[args.variant], args.variant_seed)
    if args.quick:  # a variant lists its CPU-only tasks first: every 8th task, not a prefix
        k = 8
        nodes, pods = nodes[::k], (pods[::k] if args.variant else pods[: max(1, len(pods) // k)])
    workload = args.variant or args.pods
    published = PUBLISHED_100.get(workload, {}) if not args.quick else {}

    runs, rows = [], []
    for policy in policies:
        results = [replay(nodes, pods, policy, seed, args.until, tie=args.tie, order=args.order,
                          progress=True) for seed in seeds]
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
            "published@100%": (f"{100 * published[policy]:.1f}%" if policy in published
                               else "-"),
            "time/run": f"{statistics.fmean(r.seconds for r in results):.1f}s",
        })
    cpu_share = sum(t.num_gpu == 0 for t in pods) / max(1, len(pods))
    print(f"openb replay: {pods_path.name}{' ' + args.variant if args.variant else ''} "
          f"({len(pods)} tasks, {cpu_share:.1%} CPU-only) on {len(nodes)} nodes "
          f"({sum(n.gpus for n in nodes)} GPUs), demand up to {args.until:.0%}, "
          f"seeds {args.seeds}, ties {args.tie}, order {args.order}"
          f"{' (quick)' if args.quick else ''}")
    print(table(rows, list(rows[0])))
    path = write_results(args.out, {
        "nodes": str(nodes_path), "pods": str(pods_path), "variant": args.variant,
        "variant_seed": args.variant_seed, "quick": args.quick, "until": args.until,
        "tie": args.tie, "order": args.order, "seeds": seeds, "summary": rows, "runs": runs,
        "published_at_100": published})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
