"""The ``routes`` target: only the routing table (``routes.json``,
:mod:`scepsy_serve.launch.routes`) for servers started some other way, each replica at
``http://ADDRESS:PORT/v1`` (its node's address and the port the plan assigned).

It starts nothing, so it expresses no part of a replica's assignment beyond which replicas
exist: :meth:`RoutesRenderer.parse` gives back every (LLM, replica) the table routes to, with
``tp``, ``share``, ``node`` and ``gpus`` unknown (``exact`` is empty). The URL's host is the
node's *address*, which need not name the node, so the node is not read back from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scepsy_common.errors import InputError
from scepsy_common.files import parse_json
from scepsy_serve.launch.launchplan import Assignment, LaunchPlan
from scepsy_serve.launch.renderers import register_renderer
from scepsy_serve.launch.routes import ROUTES_FILE, parse_routes, plan_routes


def routes_assignments(files: Mapping[str, str]) -> frozenset[Assignment]:
    """The (LLM, replica) pairs ``routes.json`` routes to, as assignments whose other fields
    are unknown (tp 0, share 0.0, node and gpus None)."""
    source = ROUTES_FILE
    if source not in files:
        raise InputError(source, ROUTES_FILE, "a rendered folder holding routes.json")
    routes = parse_routes(parse_json(files[source], source), source)
    out = set()
    for llms in routes.workflows.values():
        for llm, eps in llms.items():
            for e in eps:
                if e.replica is None:
                    raise InputError(source, f"{llm}.replica", "one endpoint per replica")
                out.add(Assignment(llm, e.replica, 0, 0.0, None, None))
    return frozenset(out)


@dataclass(frozen=True)
class RoutesRenderer:
    """``routes.json`` to every replica (module docstring)."""

    name: str = "routes"
    description: str = "the routing table only (routes.json), for servers started elsewhere"
    exact: frozenset[str] = frozenset()

    def render(self, plan: LaunchPlan) -> Mapping[str, str]:
        return {ROUTES_FILE: plan_routes(plan).dumps()}

    def parse(self, files: Mapping[str, str]) -> frozenset[Assignment]:
        return routes_assignments(files)


register_renderer(RoutesRenderer())
