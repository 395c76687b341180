"""How fast is the discrete-event simulator? Simulated LLM calls per minute and events per second.

A beam-search workload (a generator writes one reasoning step per beam, a process reward model
scores every step; tens to hundreds of short calls per request) and a RAG workload, both built by
hand (or, for beam search, from ``datasets/workflows/beam-search.yaml`` when that file and
:func:`scepsy_opt.workflows.generate_trace` exist), served on A100 shares with the roofline
latency model at about 70% of the allocation's saturation load. Each timed run is done with
paged KV (vLLM's blocks and preemption, the default memory policy) and with ``reserve`` (the
whole sequence reserved at admission), best wall time of ``--repeat`` runs, and the ratio.

    python benchmarks/simulator_speed.py [--requests N] [--seed S] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.prediction.simulate import saturation_rate, simulate
from scepsy_opt.traces import CallRecord, Trace
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import MemoryPolicy

REPO = Path(__file__).resolve().parents[1]
LOAD = 0.7  # fraction of the saturation rate the timed runs use
BEAM_YAML = REPO / "datasets" / "workflows" / "beam-search.yaml"
MODELS = {"generator": "qwen2.5-1.5b", "prm": "skywork-prm-1.5b",
          "rewriter": "qwen2.5-1.5b", "reranker": "bge-reranker-large", "answerer": "qwen2.5-7b"}


def beam_search_trace(requests: int, seed: int, width: int = 8) -> Trace:
    """Rounds of ``width`` generator calls (one step each) and ``width`` PRM scores each."""
    rng = np.random.default_rng(seed)
    calls: list[CallRecord] = []
    t = 0.0
    for r in range(requests):
        steps = int(rng.integers(4, 16))
        ctx = np.full(width, int(rng.integers(100, 400)))
        scores: list[str] = []
        n = 0
        for _ in range(steps):
            new = rng.geometric(1 / 60, size=width)
            gens = []
            for b in range(width):
                cid = f"c{n}"
                n += 1
                calls.append(CallRecord("beam", f"r{r}", cid, t, t + 0.5, llm="generator",
                                        parents=tuple(scores), input_tokens=int(ctx[b]),
                                        output_tokens=int(new[b])))
                gens.append(cid)
            t += 0.5
            scores = []
            for b in range(width):
                cid = f"c{n}"
                n += 1
                calls.append(CallRecord("beam", f"r{r}", cid, t, t + 0.05, llm="prm",
                                        parents=tuple(gens), input_tokens=int(ctx[b] + new[b]),
                                        output_tokens=1))
                scores.append(cid)
            t += 0.05
            ctx = (ctx + new)[rng.integers(0, width, size=width)]
        t += 1.0
    return Trace(tuple(calls))


def beam_search_from_yaml(requests: int, seed: int) -> tuple[Trace, dict[str, str]] | None:
    """The project's beam-search workflow, when its file and trace generator exist."""
    try:
        from scepsy_opt.workflows import generate_trace, load_workflow
    except ImportError:
        return None
    if not BEAM_YAML.exists():
        return None
    spec = load_workflow(BEAM_YAML)
    if set(spec.llms) != {"generator", "prm"}:
        return None
    return Trace(tuple(generate_trace(spec, requests, seed))), dict(spec.llms)


def rag_trace(requests: int, seed: int) -> Trace:
    """Rewrite → retrieval tool → ~20 reranker scores → answer."""
    rng = np.random.default_rng(seed)
    calls: list[CallRecord] = []
    t = 0.0
    for r in range(requests):
        q = int(rng.integers(20, 80))
        calls.append(CallRecord("rag", f"r{r}", "rw", t, t + 0.3, llm="rewriter",
                                input_tokens=200 + q, output_tokens=int(rng.integers(10, 40))))
        calls.append(CallRecord("rag", f"r{r}", "ret", t + 0.3, t + 0.4, tool="retrieval",
                                parents=("rw",)))
        k = int(rng.integers(10, 30))
        for i in range(k):
            calls.append(CallRecord("rag", f"r{r}", f"rr{i}", t + 0.4, t + 0.45, llm="reranker",
                                    parents=("ret",), input_tokens=int(rng.integers(100, 400)),
                                    output_tokens=1))
        calls.append(CallRecord("rag", f"r{r}", "ans", t + 0.45, t + 3.0, llm="answerer",
                                parents=tuple(f"rr{i}" for i in range(k)),
                                input_tokens=int(rng.integers(800, 2000)),
                                output_tokens=int(rng.geometric(1 / 150))))
        t += 4.0
    return Trace(tuple(calls))


def report(name: str, res) -> None:
    wf = next(iter(res.workflows.values()))
    print(f"{name}: {res.arrivals:,} requests, {res.llm_calls:,} LLM calls, {res.events:,} events "
          f"in {res.wall_s:.2f} s -> {res.llm_calls_per_minute:,.0f} LLM calls/min, "
          f"{res.events / res.wall_s:,.0f} events/s")
    print(f"  throughput {wf.throughput:.2f} req/s, mean latency {wf.mean_latency_s:.2f} s, "
          f"p99 {wf.p99_latency_s:.2f} s, unfinished {wf.unfinished}")
    for llm, s in res.llms.items():
        print(f"  {llm}: utilisation {s.utilisation:.2f}, mean decode batch {s.mean_batch:.1f}, "
              f"mean prefill batch {s.mean_prefill_batch:.1f}, "
              f"preemptions {s.preemptions} ({s.preemptions_per_call:.3f}/call)")


def timed(name: str, repeat: int, run) -> None:
    """Best of ``repeat`` runs with paged KV and with reserve; their wall-time ratio."""
    walls = {}
    for mode in ("paged", "reserve"):
        runs = [run(MemoryPolicy(kv_management=mode)) for _ in range(repeat)]
        best = min(runs, key=lambda r: r.wall_s)
        assert all(r == best for r in runs)  # deterministic
        report(f"{name}, {mode} KV", best)
        walls[mode] = best.wall_s
    print(f"  paged / reserve wall time: {walls['paged'] / walls['reserve']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000, help="beam-search arrivals")
    ap.add_argument("--rag-requests", type=int, default=10000, help="RAG arrivals")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per KV mode (best kept)")
    ap.add_argument("--quick", action="store_true",
                    help="1,000 beam-search and 3,000 RAG arrivals, shorter saturation searches")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.rag_requests = 1000, 3000
    sat_requests = (300, 1000) if args.quick else (500, 2000)
    latency = roofline_model()

    found = beam_search_from_yaml(200, args.seed)
    if found is not None:
        beam, models, source = *found, "datasets/workflows/beam-search.yaml"
    else:
        beam, models, source = beam_search_trace(200, args.seed), MODELS, "hand-built"
    alloc = Allocation({"generator": Instance("A100-80GB", 1, 0.5, 2),
                        "prm": Instance("A100-80GB", 1, 0.5, 1)})
    wf = beam.workflows()[0]
    tic = time.perf_counter()
    sat = saturation_rate(beam, models, alloc, latency, {wf: 1.0}, requests=sat_requests[0],
                          seed=args.seed, routing="least_loaded")
    print(f"beam search saturates at {sat:.3f} req/s (bisection over runs of "
          f"{sat_requests[0]} requests, {time.perf_counter() - tic:.1f} s)")
    timed(f"beam search ({source} trace) at {LOAD:.0%} of saturation", args.repeat,
          lambda policy: simulate(beam, models, alloc, latency, {wf: LOAD * sat},
                                  requests=args.requests, seed=args.seed,
                                  routing="least_loaded", policy=policy,
                                  progress=args.progress))

    rag = rag_trace(500, args.seed)
    alloc = Allocation({"rewriter": Instance("A100-80GB", 1, 0.3, 1),
                        "reranker": Instance("A100-80GB", 1, 0.2, 1),
                        "answerer": Instance("A100-80GB", 1, 0.5, 2)})
    sat = saturation_rate(rag, MODELS, alloc, latency, {"rag": 1.0}, requests=sat_requests[1],
                          seed=args.seed)
    print(f"RAG saturates at {sat:.3f} req/s")
    timed(f"RAG at {LOAD:.0%} of saturation", args.repeat,
          lambda policy: simulate(rag, MODELS, alloc, latency, {"rag": LOAD * sat},
                                  requests=args.rag_requests, seed=args.seed, policy=policy,
                                  progress=args.progress))
    return 0


if __name__ == "__main__":
    sys.exit(main())
