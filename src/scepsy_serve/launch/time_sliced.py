"""What a placed plan runs as on a CPU: servers that take turns on their cores
(docs/bench-gpu.md, "A CPU run").

On a GPU a share below 1 is an MPS limit: a server never gets more of the GPU than its share,
so the plan's allocation is what runs. On a CPU a share is a slice of time: the shell target
pins each one-rank server, whole, to its cores (``taskset``,
:func:`~scepsy_profile.profiling.engine_env.pinned`), and servers pinned to the same cores take
turns on them under the operating system's scheduler. A server alone on its cores then runs at
their full speed, and one whose co-runners are busy is slowed in proportion to how busy they
are. :func:`running_allocation` states that as an allocation the predictor reads: every group
of LLMs placed on the same cores of a node becomes a mesh
(:attr:`~scepsy_opt.allocation.Instance.mesh`) in which each runs at share 1 (the cores'
speed) and keeps its planned memory, so the predictor's co-location model
(:func:`scepsy_opt.prediction.colocation.contend`) slows each LLM by the busy fraction of the others
(share ``1 / (1 + Σ u_j)``, the processor-sharing rate of a fair time slice). An LLM alone on
its cores runs at share 1.

The allocation is ``None`` (predict the plan as planned) where it cannot be written so: a GPU
device, a TP > 1 replica (vLLM's worker processes are pinned per rank, not time-sliced as one),
or an LLM with several replicas (a mesh holds one replica of each LLM).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scepsy_opt.allocation import Allocation, Instance

__all__ = ["running_allocation"]


def running_allocation(plan: Mapping[str, Any], device: str) -> Allocation | None:
    """The allocation plan.json ``plan`` runs as on a ``device`` (``"cpu"`` or ``"cuda"``): on
    a CPU its LLMs at share 1, those placed on the same cores of a node in one mesh (module
    docstring); ``None`` where the plan's allocation is already what runs or cannot be written
    as meshes."""
    if device != "cpu":
        return None
    llms = plan["allocation"]["llms"]
    instances = plan["placement"]["instances"]
    if any(int(i["replicas"]) != 1 or int(i["tp"]) != 1 for i in llms.values()):
        return None
    groups: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for inst in instances:
        key = (str(inst["node"]), tuple(sorted(int(g) for g in inst["gpus"])))
        groups.setdefault(key, []).append(str(inst["llm"]))
    out: dict[str, Instance] = {}
    for (node, cores), names in sorted(groups.items()):
        mesh = f"{node}:{','.join(map(str, cores))}" if len(names) > 1 else None
        for m in sorted(names):
            planned = llms[m]
            memory = float(planned.get("memory") or planned["share"])
            out[m] = Instance(str(planned["gpu"]), 1, 1.0, 1, memory=memory, mesh=mesh)
    return Allocation(out, source="plan.json (as it runs on the CPU)")
