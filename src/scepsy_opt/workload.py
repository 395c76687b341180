"""A workload: one or more workflows served together, their trace and their rates.

A workflow YAML holds one workflow; a workload YAML (``workflows: [a.yaml, ...]``, optional
``weights``) holds several, each with a relative arrival rate (docs/workflows.md). The planner,
the predictor and the simulator all start from the same three things built here: the specs
(:func:`load_specs`), one trace of every workflow (:func:`workload_trace`) and the split of a
total rate over the workflows' weights (:func:`split_rate`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from scepsy_common.errors import InputError
from scepsy_common.files import read_yaml
from scepsy_opt.traces import CallRecord, Trace, read_trace, validate_calls
from scepsy_opt.workflows import WorkflowSpec, generate_trace, load_workflow, load_workload

Specs = tuple[WorkflowSpec, ...]


def load_specs(path: str | os.PathLike[str]) -> Specs:
    """The workflows of a workflow YAML (one) or a workload YAML (``workflows: [...]``).

    Both are read by their library loaders (:func:`~scepsy_opt.workflows.load_workflow`,
    :func:`~scepsy_opt.workflows.load_workload`), which reject duplicate keys and name the file
    and field of every problem.
    """
    raw = read_yaml(Path(path), "workflow or workload file (.yaml)")
    if isinstance(raw, dict) and "workflows" in raw:
        return load_workload(path)
    return (load_workflow(path),)


def as_specs(workflows: str | os.PathLike[str] | WorkflowSpec | Sequence[WorkflowSpec]) -> Specs:
    """``workflows`` as specs: a path (:func:`load_specs`), one spec or a sequence of specs."""
    if isinstance(workflows, str | os.PathLike):
        return load_specs(workflows)
    if isinstance(workflows, WorkflowSpec):
        return (workflows,)
    specs = tuple(workflows)
    if not specs or not all(isinstance(s, WorkflowSpec) for s in specs):
        raise InputError("workflows", "", "a workflow/workload path or WorkflowSpec objects",
                         type(workflows).__name__)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise InputError("workflows", "name", "workflows with unique names", names)
    return specs


def models_of(specs: Sequence[WorkflowSpec]) -> dict[str, str]:
    """LLM name -> catalog model, over every workflow (a shared LLM name is one deployment)."""
    return {name: model for spec in specs for name, model in spec.llms.items()}


def split_rate(specs: Sequence[WorkflowSpec], total: float) -> dict[str, float]:
    """A total rate (req/s) split over the workflows in proportion to their weights."""
    if isinstance(total, bool) or not (isinstance(total, int | float) and math.isfinite(total)
                                       and total > 0):
        raise InputError("rate", "", "a total rate > 0 req/s", total)
    weight = sum(s.weight for s in specs)
    return {s.name: total * s.weight / weight for s in specs}


def per_workflow_rates(specs: Sequence[WorkflowSpec], rates: float | Mapping[str, float],
                       what: str = "rate") -> dict[str, float]:
    """``rates`` per workflow: a total (:func:`split_rate`) or a mapping workflow -> rate."""
    if not isinstance(rates, Mapping):
        return split_rate(specs, rates)
    names = [s.name for s in specs]
    out: dict[str, float] = {}
    for w, r in rates.items():
        if w not in names:
            raise InputError(what, w, f"a workflow of the workload ({', '.join(names)})", w)
        if isinstance(r, bool) or not (isinstance(r, int | float) and math.isfinite(r) and r > 0):
            raise InputError(what, w, "a rate > 0 req/s", r)
        out[w] = float(r)
    if not out:
        raise InputError(what, "", "a rate for at least one workflow", dict(rates))
    return out


def generate_workload_trace(specs: Sequence[WorkflowSpec], requests: int,
                            seed: int = 0) -> tuple[CallRecord, ...]:
    """``requests`` requests of every workflow (workflow ``i`` drawn with seed ``seed + i``)."""
    calls: list[CallRecord] = []
    for i, spec in enumerate(specs):
        calls.extend(generate_trace(spec, requests, seed=seed + i))
    return tuple(calls)


def workload_trace(specs: Sequence[WorkflowSpec], trace: str | os.PathLike[str] | Trace | None = None,
                   *, requests: int = 2000, seed: int = 0) -> Trace:
    """The trace the statistics come from: ``trace`` (a file or a :class:`Trace`, which must
    hold calls of every workflow) or one generated (:func:`generate_workload_trace`)."""
    if trace is None:
        return validate_calls(generate_workload_trace(specs, requests, seed))
    src = "trace"
    if not isinstance(trace, Trace):
        src, trace = str(trace), read_trace(trace)
    missing = sorted({s.name for s in specs} - set(trace.workflows()))
    if missing:
        raise InputError(src, "workflow", f"calls of workflow(s) {missing}")
    return trace
