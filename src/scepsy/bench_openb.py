"""``scepsy bench openb``: replay the Alibaba GPU-sharing trace with one or more policies and
print one row per policy (allocation ratio and fragmentation at 100% demand and at the end),
or the results as JSON. The replay itself is :func:`scepsy_place.packing.openb.replay` (docs/openb.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from scepsy.cli.argtypes import NAMES, POSITIVE, SEED, arg_type
from scepsy.tables import print_table
from scepsy_place.packing.openb import (
    POLICIES,
    TIES,
    OpenBError,
    Snapshot,
    cpu_variant,
    read_nodes,
    read_pods,
    replay,
)

SHARE = arg_type(float, lambda v: math.isfinite(v) and 0 <= v < 1, "a number in [0, 1)")


def _fmt(s: Snapshot | None, attr: str) -> str:
    return "-" if s is None else f"{100 * getattr(s, attr):.2f}%"


def run_cli(args: argparse.Namespace) -> int:
    """``scepsy bench openb``: args.nodes, args.pods, args.policy, args.seed, args.until,
    args.json, and optionally args.tie (default the artifact's) and args.cpu_share (None: the
    pods as given; a share: :func:`scepsy_place.packing.openb.cpu_variant` of them).

    Returns 0, or 2 (message on stderr, no traceback) for bad input.
    """
    try:
        nodes = read_nodes(args.nodes)
        pods = read_pods(args.pods)
        policies = [x.strip() for x in str(args.policy).split(",") if x.strip()]
        for name in policies:
            if name not in POLICIES:
                raise OpenBError(f"--policy: unknown policy {name!r}; expected one of "
                                 f"{', '.join(sorted(POLICIES))}")
    except OpenBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    seed = int(args.seed)  # 0 is a seed like any other
    until = float(args.until)  # 0: no demand at all
    tie = getattr(args, "tie", None) or TIES[0]
    share = getattr(args, "cpu_share", None)
    if share is not None:
        if share > 0 and not any(t.num_gpu == 0 for t in pods):
            print(f"error: --cpu-share: {args.pods} has no CPU-only task to draw from",
                  file=sys.stderr)
            return 2
        pods = cpu_variant(pods, float(share))  # one fixed variant (draws seeded 0)
    results = [replay(nodes, pods, name, seed, until, tie=tie, progress=True)
               for name in policies]
    if getattr(args, "json", False):
        print(json.dumps({"nodes": str(args.nodes), "pods": str(args.pods), "tie": tie,
                          "cpu_share": share, "results": [r.to_dict() for r in results]},
                         indent=2))
        return 0
    cols = ["policy", "seed", "alloc@100%", f"alloc@{until:.0%}", "frag@100%",
            f"frag@{until:.0%}", "failed", "time"]
    rows = [dict(zip(cols, (r.policy, r.seed, _fmt(r.at_100, "alloc_ratio"),
                            _fmt(r.at_end, "alloc_ratio"), _fmt(r.at_100, "frag_ratio"),
                            _fmt(r.at_end, "frag_ratio"), r.failed, f"{r.seconds:.1f}s"),
                     strict=True)) for r in results]
    print_table(rows, cols, align="left")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``bench openb`` options (for the CLI wiring), their values checked by the CLI's
    argument types (one-line errors, exit 2)."""
    p.add_argument("--nodes", required=True, help="nodes CSV (sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument("--pods", required=True,
                   help="pods CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,...)")
    p.add_argument("--policy", type=NAMES, default="fgd",
                   help=f"policy or comma list: {', '.join(sorted(POLICIES))} (default fgd)")
    p.add_argument("--seed", type=SEED, default=42, help="workload sampling/shuffle seed (42)")
    p.add_argument("--until", type=POSITIVE, default=1.3, help="final demand / capacity (1.3)")
    p.add_argument("--tie", choices=list(TIES), default=TIES[0],
                   help=f"tie-break among equally scored nodes (default {TIES[0]}: the artifact's)")
    p.add_argument("--cpu-share", type=SHARE, default=None,
                   help="replay the pods' non-GPU variant: their GPU tasks plus CPU-only tasks "
                        "resampled to this share of the task count (0.25: cpu250)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
