"""Hand-built launch plans for renderer and launcher tests that do not go through plan.json:
two GPU nodes with whole GPUs, MPS shares and TP groups, and one CPU host."""

from __future__ import annotations

from scepsy_serve.launch.launchplan import (
    DeviceLaunch,
    EngineLaunch,
    LaunchPlan,
    ModelLaunch,
    ReplicaLaunch,
    assign_ports,
)


def gpu_plan(base_port: int = 8000) -> LaunchPlan:
    """gen (tp 2, share 0.5, 2 replicas on two nodes), small (tp 1, share 0.3, 3 replicas on
    one GPU), big (tp 4, whole GPUs); workflows a (gen, small) and b (gen, big)."""
    models = {
        "gen": ModelLaunch("gen", "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "A100-80GB", 2, 0.5,
                           2, 40.0, 14.2),
        "small": ModelLaunch("small", "qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B", "A100-80GB", 1, 0.3,
                             3, 24.0, 3.1, args=("--max-num-seqs", "64")),
        "big": ModelLaunch("big", "llama-2-70b", "meta-llama/Llama-2-70b-hf", "A100-80GB", 4,
                           1.0, 1, 80.0, 128.5, env={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}),
    }
    reps = (
        ReplicaLaunch("gen", 0, "node-a", (0, 1), 0.5, 40.0, 0),
        ReplicaLaunch("gen", 1, "node-b", (0, 1), 0.5, 40.0, 0),
        ReplicaLaunch("small", 0, "node-a", (0,), 0.3, 24.0, 0),
        ReplicaLaunch("small", 1, "node-a", (1,), 0.3, 24.0, 0),
        ReplicaLaunch("small", 2, "node-b", (2,), 0.3, 24.0, 0),
        ReplicaLaunch("big", 0, "node-b", (4, 5, 6, 7), 1.0, 80.0, 0),
    )
    return LaunchPlan(
        name="two-nodes", version=1,
        devices={"A100-80GB": DeviceLaunch("A100-80GB", "cuda", 80.0)},
        nodes={"node-a": "A100-80GB", "node-b": "A100-80GB"},
        addresses={"node-a": "10.0.0.1"},
        models=models, replicas=assign_ports(reps, base_port),
        workflows={"a": ("gen", "small"), "b": ("big", "gen")},
        engine=EngineLaunch(base_port=base_port))


def cpu_plan(command: tuple[str, ...] = ("vllm", "serve"), base_port: int = 8000) -> LaunchPlan:
    """Two LLMs on the two cores of one host: one whole core each."""
    models = {
        "rewriter": ModelLaunch("rewriter", "llama-3-8b:x0.0625", "/models/tiny", "cpu", 1, 1.0,
                                1, 4.0, 0.02),
        "generator": ModelLaunch("generator", "llama-3-8b:x0.0625", "/models/tiny", "cpu", 1, 1.0,
                                 1, 4.0, 0.02),
    }
    reps = (ReplicaLaunch("rewriter", 0, "host", (0,), 1.0, 4.0, 0),
            ReplicaLaunch("generator", 0, "host", (1,), 1.0, 4.0, 0))
    return LaunchPlan(
        name="cpu-host", version=1, devices={"cpu": DeviceLaunch("cpu", "cpu", 4.0)},
        nodes={"host": "cpu"}, addresses={"host": "127.0.0.1"}, models=models,
        replicas=assign_ports(reps, base_port), workflows={"rag": ("generator", "rewriter")},
        engine=EngineLaunch(command=command, args=("--load-format", "dummy", "--enforce-eager"),
                            base_port=base_port))


def one_real_vllm_replica(model_dir: str, python: str, base_port: int) -> LaunchPlan:
    """:func:`cpu_plan` cut to its one ``rewriter`` replica, served by a real vLLM CPU server
    (``python -m vllm.entrypoints.openai.api_server``) of the random-weight model in
    ``model_dir``: short context, four sequences, no tokenizer."""
    from dataclasses import replace

    plan = cpu_plan(command=(python, "-m", "vllm.entrypoints.openai.api_server", "--model"),
                    base_port=base_port)
    rewriter = replace(plan.models["rewriter"], serve=model_dir, weights_gib=0.02)
    reps = tuple(replace(r, memory_gib=2.0) for r in plan.replicas if r.llm == "rewriter")
    return replace(plan, models={"rewriter": rewriter}, replicas=reps,
                   workflows={"rag": ("rewriter",)},
                   engine=replace(plan.engine, args=(
                       "--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
                       "--max-model-len", "256", "--max-num-seqs", "4")))
