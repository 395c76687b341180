"""Rate-driven workloads: LLMs with their own request rates and length distributions, no workflow.

The MuxServe / AlpaServe setting (docs/rate-workloads.md): a set of LLMs, each receiving its own
Poisson stream of independent calls at ``rate`` calls/s with input and output token lengths drawn
from distributions. A rate workload file::

    kind: rates
    name: muxserve-4
    reference_gpu: A100-80GB            # optional: the GPU that times calls in the trace
    llms:
      chat-7b:  {model: llama-7b,  rate: 4.0,
                 input:  {kind: lognormal, mean: 512, cv: 1.0, min: 1, max: 2048},
                 output: {kind: exponential, mean: 128, min: 1, max: 1024}}
      chat-13b: {model: llama-13b, rate: 1.5, input: 256, output: {kind: exponential, mean: 64}}

Each LLM becomes a one-call workflow (program ``call``, :class:`~scepsy_opt.workflows.CallProgram`)
named after the LLM, with ``weight`` = its rate: statistics, prediction, simulation, planning
and placement then treat it exactly like a workflow, and a total rate split over the weights
(:func:`scepsy_opt.workload.split_rate`) rescales the file's rates proportionally. An LLM with
rate 0 is declared but not served: it is left out of the workflows (at least one rate must be
positive).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scepsy_common.errors import InputError, Name, check_name, check_rate, validated
from scepsy_common.files import read_yaml
from scepsy_common.rates import MAX_RATE, MIN_RATE, RATE_EXPECTED, is_rate
from scepsy_opt.stats import WorkflowStats, workflow_stats
from scepsy_opt.traces import CallRecord, Trace, validate_calls
from scepsy_opt.workflows import (
    DEFAULT_REFERENCE_GPU,
    MAX_REQUESTS,
    Distribution,
    WorkflowSpec,
    generate_trace,
    parse_distribution,
)

KIND = "rates"
"""The ``kind`` that marks a rate workload file."""
PROGRAM = "call"
"""The program every rate-workload LLM's one-call workflow runs."""


@dataclass(frozen=True)
class RateLLM:
    """One LLM of a rate workload: its catalog model, calls/s and token-length distributions."""

    model: str
    rate: float
    input: Distribution
    output: Distribution


@dataclass(frozen=True)
class RateWorkload:
    """A rate workload: LLMs (name -> :class:`RateLLM`), checked like a workflow file.

    The constructor checks names, rates (finite, >= 0, at least one > 0), the models (catalog
    names, stored canonical) and the distributions (non-negative values, bounded means), and
    builds the one-call workflows (:meth:`specs`) once. Errors name ``source`` (the file) or
    ``rate workload 'NAME'``, and the field (``llms.NAME.rate``).
    """

    name: str
    llms: Mapping[str, RateLLM]
    reference_gpu: str = DEFAULT_REFERENCE_GPU
    description: str = ""
    source: str = field(default="", compare=False, repr=False)
    _specs: tuple[WorkflowSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        src = self.source or f"rate workload {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise InputError(src, "name", "a non-empty string", self.name)
        check_name(self.name, src, "name")
        if not isinstance(self.llms, Mapping) or not self.llms:
            raise InputError(src, "llms", "a mapping of LLM name -> {model, rate, input, "
                             "output} with at least one LLM", self.llms)
        specs: list[WorkflowSpec] = []
        llms: dict[str, RateLLM] = {}
        for name, llm in self.llms.items():
            check_name(name, src, "llms")
            where = f"llms.{name}"
            if not isinstance(llm, RateLLM):
                raise InputError(src, where, "a RateLLM", type(llm).__name__)
            r = llm.rate
            if not (is_rate(r) or (r == 0 and not isinstance(r, bool)
                                   and isinstance(r, int | float))):
                raise InputError(src, f"{where}.rate", f"0 (not served) or {RATE_EXPECTED}",
                                 r)
            for part in ("input", "output"):
                if not isinstance(getattr(llm, part), Distribution):
                    raise InputError(src, f"{where}.{part}", "a distribution",
                                     getattr(llm, part))
            try:
                spec = WorkflowSpec(
                    name=name, program=PROGRAM, llms={name: llm.model},
                    params={"input_tokens": llm.input, "output_tokens": llm.output},
                    reference_gpu=self.reference_gpu, weight=float(r) if r > 0 else 1.0,
                    description=f"LLM {name} of rate workload {self.name}", source=src)
            except InputError as exc:
                raise InputError(src, _field(exc.field, where), exc.expected, exc.got) from None
            llms[name] = RateLLM(spec.llms[name], float(r), llm.input, llm.output)
            object.__setattr__(self, "reference_gpu", spec.reference_gpu)
            if r > 0:
                specs.append(spec)
        if not specs:
            raise InputError(src, "llms", "at least one LLM with a rate > 0 calls/s",
                             {n: x.rate for n, x in llms.items()})
        object.__setattr__(self, "llms", MappingProxyType(llms))
        object.__setattr__(self, "_specs", tuple(specs))

    def __hash__(self) -> int:
        return hash((self.name, tuple(self.llms.items()), self.reference_gpu))

    def specs(self) -> tuple[WorkflowSpec, ...]:
        """The served LLMs (rate > 0) as one-call workflows, in file order, weight = rate."""
        return self._specs


def _field(spec_field: str, where: str) -> str:
    """A :class:`WorkflowSpec` field of an LLM's one-call workflow as the rate file's field."""
    if spec_field.startswith("llms."):
        return f"{where}.model"
    if spec_field.startswith("params.input_tokens"):
        return f"{where}.input"
    if spec_field.startswith("params.output_tokens"):
        return f"{where}.output"
    return spec_field


# ------------------------------------------------------------------------------- files


class _LLMRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False,
                              protected_namespaces=())

    model: str = Field(min_length=1)
    rate: float = Field(ge=0, le=MAX_RATE)
    input: Any
    output: Any


class _RateFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    kind: Literal["rates"]
    name: Name
    description: str = ""
    reference_gpu: str = Field(default=DEFAULT_REFERENCE_GPU, min_length=1)
    llms: dict[Name, _LLMRecord] = Field(min_length=1)


def _allowed(loc: tuple[Any, ...]) -> list[str]:
    return list(_LLMRecord.model_fields if len(loc) > 2 else _RateFile.model_fields)


def is_rate_workload(raw: object) -> bool:
    """Whether parsed YAML is a rate workload (a mapping with ``kind: rates``)."""
    return isinstance(raw, dict) and raw.get("kind") == KIND


def parse_rate_workload(raw: object, source: str = "<rate workload>") -> RateWorkload:
    """A :class:`RateWorkload` from parsed YAML; errors name ``source`` and the field."""
    if not isinstance(raw, dict):
        raise InputError(source, "", "a YAML mapping with kind: rates, name and llms",
                         None if raw is None else type(raw).__name__)
    rec = validated(_RateFile, raw, source, allowed=_allowed)
    llms = {n: RateLLM(x.model, x.rate, parse_distribution(x.input, source, f"llms.{n}.input"),
                       parse_distribution(x.output, source, f"llms.{n}.output"))
            for n, x in rec.llms.items()}
    return RateWorkload(rec.name, llms, rec.reference_gpu, rec.description, source=source)


def load_rate_workload(path: str | os.PathLike[str]) -> RateWorkload:
    """Read and check a rate workload YAML file (``kind: rates``); errors name file and field."""
    p = Path(path)
    return parse_rate_workload(read_yaml(p, "rate workload file (.yaml)"), str(p))


# ------------------------------------------------------------------------------- use


def rates(workload: RateWorkload) -> dict[str, float]:
    """Workflow (= LLM) name -> calls/s of every served LLM (rate > 0), in file order."""
    return {s.name: s.weight for s in workload.specs()}


def models(workload: RateWorkload) -> dict[str, str]:
    """LLM name -> canonical catalog model of every served LLM (rate > 0)."""
    return {s.name: s.llms[s.name] for s in workload.specs()}


def rate_trace(workload: RateWorkload, requests_per_llm: int = 2000,
               seed: int = 0) -> Trace:
    """The trace of a rate workload: ``requests_per_llm`` one-call requests per served LLM.

    Request ``r{i}`` of workflow ``NAME`` is one call of LLM ``NAME`` whose token lengths are
    drawn from the LLM's distributions and whose duration is the reference timer's zero-load
    time on ``reference_gpu`` (with its jitter), as for generated workflow traces
    (:func:`~scepsy_opt.workflows.generate_trace`); LLM ``i`` (in the order of
    :meth:`RateWorkload.specs`) is drawn with seed ``seed + i``, so this is the trace
    :func:`scepsy_opt.workload.workload_trace` builds for the same workload. Rates do not
    enter the trace (they are the arrival rates of the simulation and the prediction).
    """
    if isinstance(requests_per_llm, bool) or not isinstance(requests_per_llm, int) or not (
            1 <= requests_per_llm <= MAX_REQUESTS):
        raise InputError("rate_trace", "requests_per_llm", f"an integer in [1, {MAX_REQUESTS}]",
                         requests_per_llm)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError("rate_trace", "seed", "an integer >= 0", seed)
    calls: list[CallRecord] = []
    for i, spec in enumerate(workload.specs()):
        calls.extend(generate_trace(spec, requests_per_llm, seed=seed + i))
    return validate_calls(calls)


def rate_stats(workload: RateWorkload, requests_per_llm: int = 2000, seed: int = 0,
               trace: Trace | None = None) -> Mapping[str, WorkflowStats]:
    """Per served LLM, the statistics of its one-call workflow, computed from the generated
    trace (:func:`rate_trace`, or ``trace`` when given) exactly as for workflows, so that they
    carry the sample's token moments and per-request paths; the means track the
    distributions' exact means (:meth:`Distribution.mean`) within sampling error."""
    tr = trace if trace is not None else rate_trace(workload, requests_per_llm, seed)
    return MappingProxyType({s.name: workflow_stats(tr, s.name, seed=seed)
                             for s in workload.specs()})


__all__ = ["KIND", "MAX_RATE", "MIN_RATE", "PROGRAM", "RATE_EXPECTED", "RateLLM", "RateWorkload",
           "check_rate", "is_rate", "is_rate_workload", "load_rate_workload", "models", "parse_rate_workload", "rate_stats", "rate_trace",
           "rates"]
