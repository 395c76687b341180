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

from scepsy_opt.cluster import Cluster, GPUPool, uniform_cluster
from scepsy_opt.planning.candidates import fitting_curves, workflow_latency_terms
from scepsy_opt.planning.milp import capacity_shapes
from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
from scepsy_opt.prediction.pipeline import min_replicas
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
            lam = unit.demands[m].rate
            need += lam / unit.options.max_utilisation / max(mu / units for _, _, _, units, mu in shp)
    scale = load * cl.total_gpus * 1000 / need if need > 0 else 1.0
    return unit.scaled(scale)


# The LLaMA family of MuxServe's evaluation, in its proportions (4 x 7B, 6 x 13B, 3 x 30B,
# 3 x 65B of its 16 LLMs), with ShareGPT-like mean lengths (prompt, answer).
LLAMA_MIX: tuple[tuple[str, int, float, float], ...] = (
    ("llama-7b", 4, 300.0, 180.0), ("llama-13b", 6, 400.0, 200.0),
    ("llama-30b", 3, 400.0, 200.0), ("llama-65b", 3, 400.0, 200.0))
MANY_MODELS_GPUS = ("A100-80GB", "H100-80GB")


def zipf_rates(n: int, exponent: float = 0.9) -> list[float]:
    """Popularity weights ``1 / rank^exponent`` of ``n`` LLMs, normalised to sum to 1 (the
    power-law popularity of MuxServe's and model-as-a-service fleets' LLMs)."""
    raw = [1.0 / (k + 1) ** exponent for k in range(n)]
    total = sum(raw)
    return [r / total for r in raw]


def many_models_stats(n_llms: int, seed: int = 0, exponent: float = 0.9, *,
                      copies: bool = True,
                      ) -> tuple[dict[str, WorkflowStats], dict[str, str], dict[str, float]]:
    """``n_llms`` independent LLMs (each a one-call workflow of its own, a rate workload:
    docs/rate-workloads.md) and their popularity weights: copies of one block of 16 LLMs of
    the LLaMA 7B/13B/30B/65B mix (:data:`LLAMA_MIX`, MuxServe's 16) with Zipf popularity
    within the block (:func:`zipf_rates`), the last copy cut short when 16 does not divide
    ``n_llms``. ``seed`` deals the block's models to popularity ranks; every copy is the same,
    so ``k`` copies of the best plan of one copy on ``1/k`` of the cluster are a plan of the
    whole (the replication floor of ``benchmarks/solvers/many_models_bench.py``). ``copies=False``: one
    Zipf popularity over all ``n_llms`` instead (a fleet with a few very popular LLMs), every
    16 LLMs still the mix, each block dealt anew."""
    rng = np.random.default_rng(seed)
    deck = [(m, i, o) for m, k, i, o in LLAMA_MIX for _ in range(k)]
    block = [deck[int(k)] for k in rng.permutation(len(deck))]
    if not copies:
        block = [deck[int(k)] for _ in range(math.ceil(n_llms / len(deck)))
                 for k in rng.permutation(len(deck))]
    pop = zipf_rates(len(block) if copies else n_llms, exponent)
    n_copies = math.ceil(n_llms / len(block))
    stats: dict[str, WorkflowStats] = {}
    models: dict[str, str] = {}
    weights: dict[str, float] = {}
    for j in range(n_llms):
        model, i, o = block[j % len(block)]
        name = f"m{j:04d}"
        cls = CallClass(name, None, 1.0, i, 0.0, o, 0.0, 0.0)
        llm = LLMStats(llm=name, n=1.0, p=1.0, rounds=1.0, critical_calls=1.0, critical_s=1.0,
                       input_mean=i, input_std=0.0, output_mean=o, output_std=0.0, classes=(cls,),
                       time_share=0.0, time_share_cv_requests=0.0, time_share_cv_halves=0.0,
                       mean_call_s=1.0)
        stats[name] = WorkflowStats(
            workflow=name, requests=1, llms=MappingProxyType({name: llm}), latency_mean_s=0.0,
            latency_p50_s=0.0, latency_p90_s=0.0, latency_p99_s=0.0, latency_cv=0.0,
            calls_per_request_cv=0.0, tool_time_mean_s=0.0, tool_critical_s=0.0,
            llm_overlap=0.0)
        models[name] = model
        weights[name] = pop[j % len(pop)] / n_copies if copies else pop[j]
    return stats, models, weights


def many_models_cluster(gpus: int, gpus_per_node: int = 8) -> Cluster:
    """``gpus`` GPUs in nodes of ``gpus_per_node``, half of the nodes A100-80GB and half
    H100-80GB (A100 takes the odd node)."""
    nodes = gpus // gpus_per_node
    if nodes < 2 or nodes * gpus_per_node != gpus:
        raise ValueError(f"{gpus} GPUs: expected a multiple of {gpus_per_node}, two nodes or more")
    a100 = (nodes + 1) // 2
    return Cluster(f"a100-h100-{gpus}", (GPUPool("A100-80GB", a100, gpus_per_node),
                                         GPUPool("H100-80GB", nodes - a100, gpus_per_node)))


def many_models_problem(n_llms: int, gpus: int, latency: LatencyModel, *, seed: int = 0,
                        exponent: float = 0.9, load: float = 1.0, copies: bool = True,
                        options: PlanOptions | None = None,
                        cluster: Cluster | None = None) -> PlanningProblem:
    """The many-models problem of ``benchmarks/solvers/many_models_bench.py``: ``n_llms`` LLaMA LLMs
    (:func:`many_models_stats`) on ``gpus`` A100 and H100 GPUs (:func:`many_models_cluster`),
    rates Zipf-distributed within each block of 16 and sized so that each LLM's most
    capacity-efficient shape on A100 would need ``load`` of the cluster's GPUs in all (a load of
    1 is about what the cluster carries: the scale of the targets that a plan carries is then
    near 1)."""
    stats, models, weights = many_models_stats(n_llms, seed, exponent, copies=copies)
    cl = cluster or many_models_cluster(gpus)
    unit = PlanningProblem(stats, models, weights, cl, latency, options or PlanOptions())
    need = 0.0
    for m, shp in capacity_shapes(unit).items():
        ref = [s for s in shp if s[0] == "A100-80GB"] or list(shp)
        if ref:
            lam = unit.demands[m].rate
            need += lam / unit.options.max_utilisation / max(mu / units for _, _, _, units, mu in ref)
    scale = load * cl.total_gpus * 1000 / need if need > 0 else 1.0
    return unit.scaled(scale)


def least_latency_bounds(problem: PlanningProblem, factor: float) -> dict[str, float]:
    """Mean latency bounds for a problem whose workflows each call one LLM (the many-models
    instances): each workflow's bound is ``factor`` times its LLM's least predicted mean latency
    over its shapes, each at the fewest replicas that carry its load at ``max_utilisation``."""
    u = problem.options.max_utilisation
    out: dict[str, float] = {}
    for w in sorted(problem.targets):
        (m,) = problem.stats[w].llms
        lat = [workflow_latency_terms(problem, m, [c], [np.array([float(min_replicas(
                   problem.loads[m], c.mu, u))])])[0][w][0]
               for _, _, c in fitting_curves(problem, m, problem.demands[m]) if c.mu > 0]
        out[w] = factor * float(min(lat))
    return out
