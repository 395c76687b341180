"""The table from the model names a framework or a client sends to the LLM names of a plan.

Telemetry spans and OpenAI-compatible requests name a *model* (``Qwen/Qwen2.5-7B-Instruct``,
``gpt-4o-mini``); a trace names the deployed *LLM* (``planner``, ``coder``: the names of a
workflow file's ``llms:``). Both trace sources (:mod:`scepsy_opt.ingest.otel` and
:mod:`scepsy_opt.ingest.record`) read this one table, from a YAML file, from ``MODEL=LLM`` pairs, or
both (the pairs win)::

    workflow: support-agent          # workflow name of every request (default "agent")
    request_attribute: session.id    # OpenTelemetry only: group spans into requests by this
                                     # attribute instead of by root span (optional)
    models:                          # model name as sent -> LLM name in the trace
      Qwen/Qwen2.5-7B-Instruct: planner
      Qwen/Qwen2.5-0.5B-Instruct: coder

With no ``models`` table every model keeps its own name as the LLM name (when that is a valid
name); with one, a model it does not list is *unmapped*: its calls are counted and reported by
the importer and the proxy, never silently renamed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field

from scepsy_common.errors import (
    NAME_EXPECTED,
    InputError,
    Name,
    check_name,
    key_once,
    validated,
)
from scepsy_common.files import read_yaml

DEFAULT_WORKFLOW = "agent"
"""The workflow name of imported or recorded requests when none is given."""


@dataclass(frozen=True)
class TraceMap:
    """Model name -> LLM name, the workflow name and (OpenTelemetry) the request attribute."""

    workflow: str = DEFAULT_WORKFLOW
    models: Mapping[str, str] = field(default_factory=dict)
    request_attribute: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", MappingProxyType(dict(sorted(self.models.items()))))

    def llm_for(self, model: str | None) -> str | None:
        """The LLM name of ``model``; None when it cannot be mapped (no model name, a model the
        table does not list, or, without a table, a model name that is not a valid LLM name)."""
        if not model:
            return None
        if self.models:
            return self.models.get(model)
        try:
            return check_name(model, "model", "model")
        except InputError:
            return None


class _MapFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    workflow: Name = DEFAULT_WORKFLOW
    request_attribute: str | None = Field(default=None, min_length=1, max_length=256)
    models: dict[str, Name] = Field(default_factory=dict)


def load_trace_map(path: str | os.PathLike[str]) -> TraceMap:
    """Read a trace map YAML file; errors name the file and the field."""
    raw = read_yaml(Path(path), "trace map (YAML)")
    m = validated(_MapFile, raw, str(path))
    for model in m.models:
        if not model.strip():
            raise InputError(str(path), "models", "non-empty model names", model)
    return TraceMap(workflow=m.workflow, models=m.models, request_attribute=m.request_attribute)


def model_pairs(pairs: Sequence[str], source: str = "--model") -> dict[str, str]:
    """``MODEL=LLM`` strings as a dict (the last ``=`` splits, so a model name may hold one)."""
    out: dict[str, str] = {}
    for text in pairs:
        model, sep, llm = text.rpartition("=")
        if not sep or not model.strip():
            raise InputError(source, "", "MODEL=LLM", text)
        if llm != llm.strip() or not llm:
            raise InputError(source, model, NAME_EXPECTED, llm)
        key_once(out, model, check_name(llm, source, model), source)
    return out


def trace_map(path: str | os.PathLike[str] | None = None, pairs: Sequence[str] = (), *,
              workflow: str | None = None, request_attribute: str | None = None) -> TraceMap:
    """The table from a file (optional), overridden by ``MODEL=LLM`` pairs, a workflow name and
    a request attribute when given."""
    base = load_trace_map(path) if path is not None else TraceMap()
    models = {**base.models, **model_pairs(pairs)}
    wf = check_name(workflow, "--workflow", "") if workflow is not None else base.workflow
    attr = request_attribute if request_attribute is not None else base.request_attribute
    if attr is not None and not attr.strip():
        raise InputError("--request-attribute", "", "an attribute name", attr)
    return TraceMap(workflow=wf, models=models, request_attribute=attr)
