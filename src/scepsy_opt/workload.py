"""A workload: one or more workflows served together, their trace and their rates.

A workflow YAML holds one workflow; a workload YAML (``workflows: [a.yaml, ...]``, optional
``weights``) holds several, each with a relative arrival rate (docs/workflows.md); a rate
workload YAML (``kind: rates``, :mod:`scepsy_opt.ratework`, docs/rate-workloads.md) holds LLMs
with their own rates, each a one-call workflow whose weight is its rate. The planner,
the predictor and the simulator all start from the same three things built here: the specs
(:func:`load_specs`), one trace of every workflow (:func:`workload_trace`) and the split of a
total rate over the workflows' weights (:func:`split_rate`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from scepsy_common.errors import InputError
from scepsy_common.files import read_yaml
from scepsy_opt.ratework import RateWorkload, check_rate, is_rate_workload, parse_rate_workload
from scepsy_opt.traces import CallRecord, Trace, read_trace, validate_calls
from scepsy_opt.workflows import WorkflowSpec, generate_trace, load_workflow, load_workload

Specs = tuple[WorkflowSpec, ...]
Workflows = str | os.PathLike[str] | WorkflowSpec | Sequence[WorkflowSpec] | RateWorkload


def load_specs(path: str | os.PathLike[str]) -> Specs:
    """The workflows of a workflow YAML (one), a workload YAML (``workflows: [...]``) or a rate
    workload YAML (``kind: rates``: one one-call workflow per served LLM, weight = its rate).

    Each is read by its library loader (:func:`~scepsy_opt.workflows.load_workflow`,
    :func:`~scepsy_opt.workflows.load_workload`,
    :func:`~scepsy_opt.ratework.load_rate_workload`), which reject duplicate keys and name the
    file and field of every problem.
    """
    return load_specs_and_rates(path)[0]


def load_specs_and_rates(path: str | os.PathLike[str]) -> tuple[Specs, dict[str, float] | None]:
    """:func:`load_specs` and, for a rate workload, its rates (workflow -> calls/s; else None)."""
    raw = read_yaml(Path(path), "workflow or workload file (.yaml)")
    if is_rate_workload(raw):
        rw = parse_rate_workload(raw, str(path))
        return rw.specs(), {s.name: s.weight for s in rw.specs()}
    if isinstance(raw, dict) and "workflows" in raw:
        return load_workload(path), None
    return (load_workflow(path),), None


def specs_and_rates(workflows: Workflows) -> tuple[Specs, dict[str, float] | None]:
    """:func:`as_specs` and, when ``workflows`` is a rate workload (a ``kind: rates`` file or a
    :class:`~scepsy_opt.ratework.RateWorkload`), its rates; otherwise ``None``."""
    if isinstance(workflows, str | os.PathLike):
        return load_specs_and_rates(workflows)
    if isinstance(workflows, RateWorkload):
        return workflows.specs(), {s.name: s.weight for s in workflows.specs()}
    return as_specs(workflows), None


def as_specs(workflows: Workflows) -> Specs:
    """``workflows`` as specs: a path (:func:`load_specs`), a rate workload, one spec or a
    sequence of specs."""
    if isinstance(workflows, str | os.PathLike):
        return load_specs(workflows)
    if isinstance(workflows, RateWorkload):
        return workflows.specs()
    if isinstance(workflows, WorkflowSpec):
        return (workflows,)
    specs = tuple(workflows)
    if not specs or not all(isinstance(s, WorkflowSpec) for s in specs):
        raise InputError("workflows", "", "a workflow/workload path, a RateWorkload or "
                         "WorkflowSpec objects",
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
    total = check_rate(total, "rate", "")
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
        out[w] = check_rate(r, what, w)
    if not out:
        raise InputError(what, "", "a rate for at least one workflow", dict(rates))
    return out


def resolve_rates(specs: Sequence[WorkflowSpec], rates: float | Mapping[str, float] | None,
                  file_rates: Mapping[str, float] | None, what: str = "rate") -> dict[str, float]:
    """Per-workflow rates: ``rates`` as :func:`per_workflow_rates` reads it, or, when ``rates``
    is None, a rate workload's own ``file_rates`` (None for other workloads: an error naming
    ``what``). A total given for a rate workload rescales its rates proportionally (the
    weights are the rates)."""
    if rates is None:
        if file_rates is None:
            raise InputError(what, "", "a total rate > 0 req/s (optional only for a rate "
                             "workload, whose file gives the rates)")
        return dict(file_rates)
    return per_workflow_rates(specs, rates, what)


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
