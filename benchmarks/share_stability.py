"""The paper's key claim, measured: per-LLM shares of LLM time are stable, end-to-end latency is not.

    python benchmarks/share_stability.py [--requests 2000] [--seed 0]

For each bundled workflow, generate a trace and print per LLM its share of LLM time, the
coefficient of variation (CV) of that share across requests and across bootstrap halves of the
trace, next to the CV of end-to-end latency and of LLM calls per request.
"""

from __future__ import annotations

import argparse

from _common import REPO, table, write_results
from scepsy_opt.stats import workflow_stats
from scepsy_opt.traces import validate_calls
from scepsy_opt.workflows import generate_trace, load_workflow


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = []
    for name in ("rag", "beam-search", "coding-agent"):
        spec = load_workflow(REPO / "datasets" / "workflows" / f"{name}.yaml")
        trace = validate_calls(generate_trace(spec, args.requests, seed=args.seed))
        st = workflow_stats(trace, spec.name, seed=args.seed)
        for llm, s in st.llms.items():
            rows.append({"workflow": name, "llm": llm, "time_share": round(s.time_share, 4),
                         "share_cv_requests": round(s.time_share_cv_requests, 3),
                         "share_cv_halves": round(s.time_share_cv_halves, 4),
                         "latency_cv": round(st.latency_cv, 3),
                         "calls_cv": round(st.calls_per_request_cv, 3),
                         "latency_p99/p50": round(st.latency_p99_s / st.latency_p50_s, 2)})
    print(table(rows, list(rows[0])))
    print(f"results: {write_results('share_stability', {'rows': rows, 'requests': args.requests})}")


if __name__ == "__main__":
    main()
