"""The routing table: for every workflow's LLM, the endpoints that serve it and their weights
(docs/launch.md). Written by every launch target (``routes.json``), read by the workflow driver
(:mod:`scepsy_serve.launch.drive`) and by any router in front of the servers.

File format (JSON, ``version`` 1)::

    {"version": 1,
     "workflows": {"rag": {"generator": [
         {"url": "http://node-0:8000/v1", "model": "generator", "weight": 0.5, "replica": 0},
         {"url": "http://node-1:8000/v1", "model": "generator", "weight": 0.5, "replica": 1}]}}}

``url`` is an OpenAI-compatible base URL (``/completions`` is appended); ``model`` is the name
the server answers to; weights of one LLM sum to 1 (replicas of one LLM have one shape, so each
carries an equal part; an LLM split over GPU types, plan.json's ``splits``, routes to every
replica of its groups, each group's fraction shared equally by its replicas). ``replica`` is None where the target routes to a service rather than to
one replica. ``tokens`` (``[lo, hi]``, ``hi`` null for no upper end), on every endpoint of an
LLM routed by prompt length (plan.json's ``lengths``): the endpoint serves the calls whose
prompt has ``lo <= tokens < hi`` (the gateway's estimate, docs/gateway.md); the ranges of one
LLM's endpoints cover every length once, and its weights still sum to 1 (each range's group
its fraction, shared by its replicas). An endpoint of weight 0 gets no new calls (the gateway drains a
replica that way, docs/gateway.md); the weights of every LLM still sum to 1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from scepsy_common.errors import InputError, Name, described, validated
from scepsy_common.files import read_json
from scepsy_common.net import URL_EXPECTED, check_url
from scepsy_opt.stats import check_ranges
from scepsy_serve.launch.launchplan import LaunchPlan, ReplicaLaunch

ROUTES_VERSION = 1
ROUTES_FILE = "routes.json"
"""The routing table's name in every rendered folder."""
WEIGHT_TOL = 1e-6


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str
    weight: float
    replica: int | None = None
    tokens: tuple[int, int | None] | None = None  # routed by prompt length: [lo, hi)


@dataclass(frozen=True)
class Routes:
    """workflow -> LLM -> endpoints (weights of one LLM sum to 1)."""

    workflows: Mapping[str, Mapping[str, tuple[Endpoint, ...]]]

    def __post_init__(self) -> None:
        object.__setattr__(self, "workflows", MappingProxyType({
            w: MappingProxyType({m: tuple(e) for m, e in sorted(llms.items())})
            for w, llms in sorted(self.workflows.items())}))

    def endpoints(self, workflow: str, llm: str) -> tuple[Endpoint, ...]:
        try:
            return self.workflows[workflow][llm]
        except KeyError:
            raise InputError("routes", f"workflows.{workflow}.{llm}",
                             "a route for every LLM the workflow calls") from None

    def to_dict(self) -> dict[str, Any]:
        return {"version": ROUTES_VERSION, "workflows": {
            w: {m: [_endpoint_dict(e) for e in eps] for m, eps in llms.items()}
            for w, llms in self.workflows.items()}}

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def _endpoint_dict(e: Endpoint) -> dict[str, Any]:
    out: dict[str, Any] = {"url": e.url, "model": e.model, "weight": e.weight,
                           "replica": e.replica}
    if e.tokens is not None:
        out["tokens"] = list(e.tokens)
    return out


def plan_routes(plan: LaunchPlan,
                endpoint: Callable[[ReplicaLaunch], str] | None = None) -> Routes:
    """Routes to every replica of ``plan``: ``endpoint(replica)`` gives its base URL (default
    ``http://ADDRESS:PORT/v1`` with the node's address)."""
    def default(r: ReplicaLaunch) -> str:
        return f"http://{plan.url_host(r.node)}:{r.port}/v1"
    url = endpoint or default
    out: dict[str, dict[str, tuple[Endpoint, ...]]] = {}
    for w in plan.workflows:
        out[w] = {}
        for m, groups in plan.called(w).items():
            eps: list[Endpoint] = []
            for g, f in groups:
                reps = plan.replicas_of(g)
                eps.extend(Endpoint(url(r), g, f / len(reps), r.replica, plan.tokens(g))
                           for r in reps)
            out[w][m] = tuple(eps)
    return Routes(out)


def service_routes(plan: LaunchPlan, url: Callable[[str], str]) -> Routes:
    """Routes to one service per LLM (``url(llm)``), weight 1 (an LLM split over GPU types:
    one per replica group, weighted by its fraction): the target balances replicas."""
    return Routes({w: {m: tuple(Endpoint(url(g), g, f, None, plan.tokens(g)) for g, f in groups)
                       for m, groups in plan.called(w).items()}
                   for w in plan.workflows})


class _EndpointRec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(pattern=described(r"^https?://[^\s'\"`$\\]+$", URL_EXPECTED))
    model: Name
    weight: float = Field(ge=0, le=1)
    replica: int | None = Field(default=None, ge=0)
    tokens: list[int | None] | None = None


class _RoutesRec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int
    workflows: dict[Name, dict[Name, list[_EndpointRec]]]


def parse_routes(raw: object, source: str) -> Routes:
    if isinstance(raw, Mapping) and raw.get("version") != ROUTES_VERSION:
        raise InputError(source, "version", f"routes format version {ROUTES_VERSION}",
                         raw.get("version"))
    rec = validated(_RoutesRec, raw, source)
    for w, llms in rec.workflows.items():
        for m, eps in llms.items():
            if not eps:
                raise InputError(source, f"workflows.{w}.{m}", "at least one endpoint")
            for i, e in enumerate(eps):
                check_url(e.url, source, f"workflows.{w}.{m}[{i}].url")
            total = sum(e.weight for e in eps)
            if not math.isclose(total, 1.0, abs_tol=WEIGHT_TOL):
                raise InputError(source, f"workflows.{w}.{m}", "weights that sum to 1", total)
            _check_tokens(eps, source, f"workflows.{w}.{m}")
    return Routes({w: {m: tuple(Endpoint(e.url, e.model, e.weight, e.replica,
                                         _range(e.tokens)) for e in eps)
                       for m, eps in llms.items()} for w, llms in rec.workflows.items()})


def _range(r: list[int | None] | None) -> tuple[int, int | None] | None:
    return None if r is None else (int(r[0] or 0), r[1])


def _check_tokens(eps: list[_EndpointRec], source: str, where: str) -> None:
    """An LLM routed by prompt length: every endpoint has a range ``[lo, hi]`` (integers,
    ``hi`` null or above ``lo``), and the distinct ranges cover every length once."""
    given = [e.tokens is not None for e in eps]
    if not any(given):
        return
    ranges: dict[str, tuple[int, int | None]] = {}
    for i, e in enumerate(eps):
        r = e.tokens
        if (r is None or len(r) != 2 or not isinstance(r[0], int) or r[0] < 0
                or not (r[1] is None or isinstance(r[1], int))):
            raise InputError(source, f"{where}[{i}].tokens", "[lo, hi]: input tokens, lo >= 0, "
                             "hi above it or null (every endpoint of an LLM routed by length "
                             "has one)", r)
        ranges[str(tuple(r))] = (r[0], r[1])
    check_ranges(ranges, source, f"{where}.tokens")


def load_routes(path: str | Path) -> Routes:
    return parse_routes(read_json(path, "routes file (routes.json)"), str(path))
