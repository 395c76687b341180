"""What a report shows of a plan.json: the validated document and the rows derived from it.

:func:`load_report` reads and validates the file (:func:`scepsy_serve.launch.planfile.read_plan`:
bad input is an :class:`~scepsy_common.errors.InputError` naming the file and the field) and
reads its nodes; the row functions are what both the terminal tables and the page show.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scepsy_place.packing.topology import Node, Topology
from scepsy_serve.launch.planfile import PlanDoc, is_placed, plan_nodes, read_plan

__all__ = ["PLACEMENT_COLUMNS", "PLAN_COLUMNS", "WORKFLOW_COLUMNS", "Report", "Slot",
           "default_out", "gpu_slots", "load_report", "node_rows", "placement_rows", "plan_rows",
           "workflow_rows"]

PLAN_COLUMNS = ("llm", "model", "gpu", "tp", "share", "memory", "memory_gib", "replicas",
                "mu_calls_s", "latency_share")
PLACEMENT_COLUMNS = ("node", "gpu", "replica", "share", "memory_gib")
WORKFLOW_COLUMNS = ("workflow", "target", "throughput", "mean_latency_s", "max_throughput",
                    "bottleneck")


@dataclass(frozen=True)
class Slot:
    """What one GPU holds: a replica of this plan (``llm``, ``replica``) or, with ``llm`` None,
    what was in use on it before the plan (the racks cluster's ``in_use``)."""

    llm: str | None
    replica: int
    share: float
    memory_gib: float


@dataclass(frozen=True)
class Report:
    """A plan.json read for a report: its path, the validated document and its nodes."""

    path: Path
    doc: PlanDoc
    nodes: Topology

    @property
    def source(self) -> str:
        return str(self.path)

    @property
    def has_allocation(self) -> bool:
        return self.doc.allocation is not None and self.doc.llms is not None

    @property
    def placed(self) -> bool:
        return is_placed(self.doc)


def load_report(plan_path: str | Path) -> Report:
    """The plan.json at ``plan_path``, validated, with its nodes."""
    path = Path(plan_path)
    doc = read_plan(path)
    return Report(path, doc, plan_nodes(doc, str(path)))


def default_out(plan_path: str | Path) -> Path:
    """The default report folder: beside the plan, its name without ``.json`` plus
    ``-report`` (``plans/a.json`` → ``plans/a-report``)."""
    p = Path(plan_path)
    return p.with_name(f"{p.stem}-report")


def llm_names(rep: Report) -> list[str]:
    """The plan's LLMs, sorted (the order of every table and of the figures' colours)."""
    return sorted(rep.doc.llms or {})


def memory_fraction(rep: Report, llm: str) -> float:
    """The fraction of each of its GPUs' memory one replica of ``llm`` holds."""
    row = (rep.doc.llms or {})[llm]
    if row.memory is not None:
        return row.memory
    return row.memory_gib_per_gpu / rep.doc.devices[row.gpu].memory_gib


def plan_rows(rep: Report) -> list[dict[str, Any]]:
    """One row per LLM (:data:`PLAN_COLUMNS`): its instance, memory per GPU (fraction and
    GiB), replicas, calls/s served and share of the objective."""
    rows = []
    for m in llm_names(rep):
        r = (rep.doc.llms or {})[m]
        rows.append({"llm": m, "model": r.model, "gpu": r.gpu, "tp": r.tp, "share": r.share,
                     "memory": memory_fraction(rep, m), "memory_gib": r.memory_gib_per_gpu,
                     "replicas": r.replicas, "mu_calls_s": r.mu_calls_s,
                     "latency_share": r.latency_share})
    return rows


def workflow_rows(rep: Report) -> list[dict[str, Any]]:
    """One row per workflow (:data:`WORKFLOW_COLUMNS`): target and planned throughput,
    predicted mean latency, and the curve's maximum throughput and bottleneck (None without a
    curve)."""
    rows = []
    for w, wf in sorted((rep.doc.workflows or {}).items()):
        c = wf.curve
        rows.append({"workflow": w, "target": rep.doc.targets.get(w),
                     "throughput": wf.throughput, "mean_latency_s": wf.mean_latency_s,
                     "max_throughput": c.max_throughput if c is not None else None,
                     "bottleneck": c.bottleneck if c is not None else None})
    return rows


def gpu_slots(rep: Report) -> dict[tuple[str, int], list[Slot]]:
    """Per (node, GPU index) what it holds: first what was in use before the plan, then the
    plan's replicas sorted by (LLM, replica). GPUs holding nothing are left out."""
    slots: dict[tuple[str, int], list[Slot]] = {}
    for n in rep.nodes.nodes:
        for i, (share, mem) in enumerate(n.used):
            if share > 0 or mem > 0:
                slots.setdefault((n.name, i), []).append(Slot(None, 0, share, mem))
    pl = rep.doc.placement
    if rep.placed and pl is not None:
        for inst in sorted(pl.instances, key=lambda x: (x.llm, x.replica)):
            for g in inst.gpus:
                slots.setdefault((inst.node, g), []).append(
                    Slot(inst.llm, inst.replica, inst.share, inst.memory_gib))
    return slots


def placement_rows(rep: Report) -> list[dict[str, Any]]:
    """One row per (GPU, replica) of the plan (:data:`PLACEMENT_COLUMNS`), nodes in the
    cluster's order, GPUs by index; ``replica`` reads ``LLM/k``."""
    slots = gpu_slots(rep)
    rows = []
    for n in rep.nodes.nodes:
        for i in range(n.gpus):
            for s in slots.get((n.name, i), []):
                if s.llm is not None:
                    rows.append({"node": n.name, "gpu": i, "replica": f"{s.llm}/{s.replica}",
                                 "share": s.share, "memory_gib": s.memory_gib})
    return rows


def node_rows(rep: Report) -> list[dict[str, Any]]:
    """One row per node: rack, device type, GPUs, GPUs this plan uses, replicas placed, and the
    compute (GPU units) and memory (GiB) it takes there."""
    slots = gpu_slots(rep)
    rows = []
    for n in rep.nodes.nodes:
        mine = [(i, s) for i in range(n.gpus) for s in slots.get((n.name, i), [])
                if s.llm is not None]
        rows.append({"node": n.name, "rack": n.rack, "device": n.gpu, "gpus": n.gpus,
                     "gpus_used": len({i for i, _ in mine}),
                     "replicas": len({(s.llm, s.replica) for _, s in mine}),
                     "compute": sum(s.share for _, s in mine),
                     "memory_gib": sum(s.memory_gib for _, s in mine)})
    return rows


def device_memory(rep: Report, node: Node) -> float:
    """Memory (GiB) of one GPU of ``node``."""
    return rep.doc.devices[node.gpu].memory_gib


_CORE = ("objective_s", "bound_s", "gap", "gap_limit", "time_limit_s")


def open_fields(section: Any) -> dict[str, Any]:
    """The statistics the ``solver`` section of the file carries beyond its core fields
    (objective, bound, gap and limits): those its formulation wrote, sorted by name."""
    given = section.model_fields_set | set(section.model_extra or {})
    return {k: getattr(section, k) for k in sorted(given - set(_CORE))}
