"""Seeded random planning problems, for oracle tests and solver benchmarks.

:func:`random_problem` builds ``n_llms`` LLMs (catalog models drawn from a size-weighted list),
spread over ``workflows`` serial workflows with random call counts, concurrency and token
lengths, and a target throughput that uses roughly ``load`` of the cluster's GPUs at the
fewest-GPU configuration. The statistics are built directly (no trace), so thousands of LLMs
cost nothing to set up. Same arguments, same problem.
"""

from __future__ import annotations

import math
from types import MappingProxyType

import numpy as np

from scepsy_opt.cluster import Cluster, uniform_cluster
from scepsy_opt.milp import capacity_shapes
from scepsy_opt.pipeline import llm_demand
from scepsy_opt.problem import PlanningProblem, PlanOptions
from scepsy_opt.stats import CallClass, LLMStats, WorkflowStats
from scepsy_profile.latency import LatencyModel

MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "llama-2-7b", "llama-3-8b",
          "qwen2.5-14b", "llama-2-13b", "qwen2.5-32b", "llama-3-70b")


def _llm_stats(name: str, rng: np.random.Generator) -> LLMStats:
    n = float(rng.choice([1.0, 1.0, 2.0, 3.0, 5.0, 10.0]))
    p = float(min(n, rng.choice([1.0, 1.0, 2.0, 4.0])))
    i = float(np.round(rng.lognormal(math.log(800), 0.6)))
    o = float(np.round(rng.lognormal(math.log(120), 0.7))) + 1.0
    call_s = 1.0
    crit = n / p
    cls = CallClass(name, None, n, i, 0.0, o, 0.0, 0.0)
    return LLMStats(llm=name, n=n, p=p, rounds=crit, critical_calls=crit, critical_s=crit * call_s,
                    input_mean=i, input_std=0.0, output_mean=o, output_std=0.0, classes=(cls,),
                    time_share=0.0, time_share_cv_requests=0.0, time_share_cv_halves=0.0,
                    mean_call_s=call_s)


def random_stats(n_llms: int, workflows: int, seed: int) -> tuple[dict[str, WorkflowStats], dict[str, str]]:
    """``workflows`` workflows over ``n_llms`` LLMs (every LLM used by at least one workflow)."""
    rng = np.random.default_rng(seed)
    names = [f"llm{j:03d}" for j in range(n_llms)]
    weights = np.array([4, 4, 3, 4, 2, 2, 2, 1, 1, 1], dtype=float)
    models = {m: str(rng.choice(MODELS, p=weights / weights.sum())) for m in names}
    owners: dict[int, list[str]] = {w: [] for w in range(workflows)}
    for j, m in enumerate(names):
        owners[j % workflows].append(m)
        if workflows > 1 and rng.random() < 0.2:  # some LLMs are shared by two workflows
            owners[int(rng.integers(workflows))].append(m)
    stats = {}
    for w, ms in owners.items():
        llms = {m: _llm_stats(m, rng) for m in sorted(set(ms))}
        name = f"wf{w:02d}"
        stats[name] = WorkflowStats(
            workflow=name, requests=1, llms=MappingProxyType(llms), latency_mean_s=0.0,
            latency_p50_s=0.0, latency_p90_s=0.0, latency_p99_s=0.0, latency_cv=0.0,
            calls_per_request_cv=0.0, tool_time_mean_s=float(rng.choice([0.0, 0.0, 0.5])),
            tool_critical_s=0.0, llm_overlap=0.0)
    return stats, models


def random_problem(n_llms: int, gpus: int, latency: LatencyModel, *, seed: int = 0,
                   workflows: int | None = None, gpu: str = "A100-80GB", gpus_per_node: int = 8,
                   load: float = 0.5, options: PlanOptions | None = None,
                   cluster: Cluster | None = None) -> PlanningProblem:
    """A feasible-looking random problem: targets sized so the fewest-GPU plan uses ~``load``."""
    wfs = workflows or max(1, min(n_llms // 3, 8))
    stats, models = random_stats(n_llms, wfs, seed)
    cl = cluster or uniform_cluster(gpu, gpus, min(gpus_per_node, gpus))
    # size targets: the GPUs the most capacity-efficient shape of each LLM needs for a unit
    # target, scaled so that they come to ``load`` of the cluster
    unit = PlanningProblem(stats, models, dict.fromkeys(stats, 1.0), cl, latency,
                           options or PlanOptions())
    need = 0.0
    for m, shp in capacity_shapes(unit).items():
        if shp:
            lam = llm_demand(unit.stats, unit.models, unit.targets, m).rate
            need += lam / unit.options.max_utilisation / max(mu / units for _, _, _, units, mu in shp)
    scale = load * cl.total_gpus * 1000 / need if need > 0 else 1.0
    return unit.scaled(scale)
