"""The requests of ``scepsy predict`` and ``scepsy simulate``: an allocation evaluated at a
rate, as frozen, validated values.

Both evaluate an allocation: :class:`EvaluationInputs` holds what they share (the workflows,
the allocation or a plan.json, the rate, the trace, the latency model's curves and
overheads, the catalog, the seed); :class:`PredictRequest` adds the predictor's form,
:class:`SimulateRequest` the simulated arrivals (a count, or recorded arrival times replayed
at a time scale) and the routing. Each carries the serving engine's settings
(:class:`~scepsy_place.request.Engine`, as ``scepsy plan`` does).

As for the plan request, the command line is generated from these fields
(:func:`predict_flag_fields`, :func:`simulate_flag_fields`): each field with a
:class:`~scepsy_common.flags.Flag` is an option, its help the field's docstring, its default
the field's. :func:`scepsy.api.predict` and :func:`scepsy.api.simulate` build the same
models from their keywords; a keyword that is no field is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from scepsy_common.errors import InputError
from scepsy_common.flags import Flag, FlagField, fields_with_flags
from scepsy_opt.prediction.pipeline import FORMS
from scepsy_opt.prediction.simulate import ROUTINGS
from scepsy_opt.workflows import DEFAULT_TRACE_REQUESTS, MAX_REQUESTS
from scepsy_place.request import Engine

Source = Any
"""A file path (str or os.PathLike) or the loaded object (the Python API takes both)."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True,
                              arbitrary_types_allowed=True)


class EvaluationInputs(_Model):
    """What predict and simulate evaluate: an allocation serving workflows at a rate."""

    workflow: Annotated[Source, Flag("--workflow", "path")]
    """workflow, workload or rate workload (kind: rates) YAML"""
    allocation: Annotated[Source, Flag("--allocation", "path")]
    """allocation YAML/JSON (or a plan.json: its allocation)"""
    rate: Annotated[Any, Flag("--rate", "rate")] = None
    """total arrival rate, req/s (split over a workload's weights); optional for a rate
    workload: its rates, rescaled to this total if given"""
    # the Python API also takes a mapping workflow -> req/s; checked against the workflows
    # when they are read (scepsy_opt.workload.resolve_rates), the one place that rule lives
    trace: Annotated[Source | None, Flag("--trace", "path")] = None
    """recorded trace (default: generated)"""
    trace_requests: Annotated[int, Flag("--trace-requests", "count")] = DEFAULT_TRACE_REQUESTS
    """requests per workflow of the generated trace"""
    curves: Annotated[Source | None, Flag("--curves", "path")] = None
    """fitted curves (measured curves win)"""
    latency: Any = None
    """a latency model object in place of curves (the Python API only)"""
    overheads: Annotated[Source | None, Flag("--overheads", "path")] = None
    """engine overheads calibration YAML/JSON (scepsy profile calibrate; default: none,
    optimistic)"""
    catalog: Annotated[Source | None, Flag("--catalog", "path")] = None
    """YAML catalog extending the bundled one"""
    seed: Annotated[int, Flag("--seed", "seed")] = 0
    """seed of the generated trace and its statistics"""

    @model_validator(mode="after")
    def _in_range(self) -> EvaluationInputs:
        if not 1 <= self.trace_requests <= MAX_REQUESTS:
            raise InputError("trace_requests", "", f"1 to {MAX_REQUESTS} requests per "
                             "workflow (the largest trace generated)", self.trace_requests)
        return self


class _Recorded(_Model):
    """Recorded arrival times in place of Poisson arrivals (both evaluations)."""

    inputs: EvaluationInputs
    arrivals: Annotated[Source | None, Flag("--arrivals", "path", "FILE")] = None
    """recorded arrival times instead of Poisson arrivals: JSON lines with a timestamp in ms
    (Mooncake) or one time in seconds per line (docs/arrivals.md)"""
    time_scale: Annotated[float, Flag("--time-scale", "positive", "X")] = 1.0
    """replay --arrivals X times as fast (default 1)"""

    @model_validator(mode="after")
    def _arrivals(self) -> _Recorded:
        rate = self.inputs.rate
        if self.arrivals is not None and rate is not None and not isinstance(rate, Mapping):
            raise InputError("rate", "", "no total rate together with arrivals (the arrival "
                             "times set the rate; the workload's weights, or rates given per "
                             "workflow, set the mix)", rate)
        if self.arrivals is None and self.time_scale != 1.0:
            raise InputError("time_scale", "", "together with arrivals (recorded arrival "
                             "times to scale)", self.time_scale)
        return self


class PredictRequest(_Recorded):
    """``scepsy predict``: the Aggregate LLM Pipeline's figures of an allocation; with
    ``arrivals``, its latency percentiles are those of the recorded arrivals."""

    form: Annotated[Literal["paper", "critical-path"],
                    Flag("--form", "choice", choices=lambda: FORMS)] = "critical-path"
    """the predictor's latency form: critical-path (default) or the paper's sum"""
    engine: Engine = Field(default_factory=Engine)


class SimulateRequest(_Recorded):
    """``scepsy simulate``: the discrete-event simulator's figures of an allocation."""

    requests: Annotated[int | None, Flag("--requests", "count"), Field(ge=1)] = None
    """simulated arrivals (default 2000; with --arrivals: all of them)"""
    routing: Annotated[Literal["round_robin", "least_loaded"],
                       Flag("--routing", "choice", choices=lambda: ROUTINGS)] = "round_robin"
    """how calls are spread over an LLM's replicas"""
    progress: Annotated[bool, Flag("--progress", "switch")] = False
    """a progress bar while simulating"""
    engine: Engine = Field(default_factory=Engine)

    @property
    def arrivals_count(self) -> int | None:
        """How many arrivals are simulated: ``requests``, else all the recorded arrivals
        (None) or, with Poisson arrivals, the default count."""
        if self.requests is not None:
            return self.requests
        return None if self.arrivals is not None else DEFAULT_TRACE_REQUESTS


Request = PredictRequest | SimulateRequest


def request_of(cls: type[Request], data: Mapping[str, Any]) -> Any:
    """``cls`` validated from nested ``data``, or the :class:`InputError` of its first invalid
    field (naming the argument)."""
    try:
        return cls.model_validate(dict(data))
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, InputError):
            raise cause from None
        loc = [str(p) for p in err["loc"] if not isinstance(p, int)]
        field = loc[-1] if loc else ""
        if err["type"] == "extra_forbidden":
            raise InputError(field, "", f"an argument of {cls.__name__} (not a field of it)",
                             err.get("input")) from None
        raise InputError(field, "", err["msg"].removeprefix("Value error, ").lower(),
                         err.get("input")) from None


def predict_flag_fields() -> tuple[FlagField, ...]:
    """The fields of a :class:`PredictRequest` that are options of ``scepsy predict``."""
    return fields_with_flags(((("inputs",), EvaluationInputs), ((), PredictRequest),
                              (("engine",), Engine)))


def simulate_flag_fields() -> tuple[FlagField, ...]:
    """The fields of a :class:`SimulateRequest` that are options of ``scepsy simulate``."""
    return fields_with_flags(((("inputs",), EvaluationInputs), ((), SimulateRequest),
                              (("engine",), Engine)))


_INPUTS = frozenset(EvaluationInputs.model_fields)


def split_keywords(workflows: Any, allocation: Any, rate: Any,
                   options: Mapping[str, Any]) -> dict[str, Any]:
    """The nested data of a request from :func:`scepsy.api.predict`'s (or simulate's) arguments:
    the inputs' keywords under ``inputs``, ``engine=`` (a MemoryPolicy) as the engine's
    policy, the rest as the request's own fields."""
    inputs = {"workflow": workflows, "allocation": allocation, "rate": rate}
    own: dict[str, Any] = {}
    for key, value in options.items():
        if key in _INPUTS:
            inputs[key] = value
        elif key == "engine":
            from scepsy_profile.serving import MemoryPolicy

            if value is not None and not isinstance(value, MemoryPolicy):
                raise InputError("engine", "", "a MemoryPolicy (the engine's settings) or None",
                                 type(value).__name__)
            if value is not None:
                own["engine"] = {"policy": value}
        else:
            own[key] = value
    return {"inputs": inputs, **own}
