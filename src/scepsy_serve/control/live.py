"""The live loop of ``scepsy control`` (docs/control.md): every window, read the telemetry
(:mod:`scepsy_serve.control.telemetry`), let the controller decide
(:class:`~scepsy_serve.control.core.Controller`), log the decision, and apply a change with
:func:`~scepsy_serve.control.actuate.apply_decision`; the controller's own Prometheus metrics
(:class:`ControlMetrics`) say what it decided.

The log (``--log``, JSON lines) holds one ``{"kind": "decision", ...}`` line per window
(:meth:`Decision.to_dict`: the reason, the observed and forecast rates, the predicted effect),
one ``{"kind": "apply", "step": ...}`` line per step of a change, and ``{"kind": "telemetry"}``
lines for sources that did not answer. A stop (the ``stop`` event: SIGINT, SIGTERM or
``duration_s``) ends the loop after the step in progress: a change not yet routed is rolled
back, one routed is finished (:func:`apply_decision`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from scepsy_common.errors import InputError
from scepsy_serve.control.actuate import ApplyTarget, apply_decision
from scepsy_serve.control.core import Controller, Decision
from scepsy_serve.control.telemetry import Scrape, Telemetry, window_stats
from scepsy_serve.launch.launchplan import LaunchPlan

POLLS_PER_WINDOW = 5
MAX_POLL_S = 5.0


class ControlMetrics:
    """The controller's Prometheus metrics, in a registry of its own:
    ``scepsy_control_decisions_total{action}``, ``scepsy_control_moves_total`` (replicas
    started, stopped or moved by applied changes), ``scepsy_control_forecast_rate{workflow}``
    (req/s) and ``scepsy_control_replicas{llm}`` (of the running plan)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.decisions = Counter("scepsy_control_decisions", "Decisions by action",
                                 ["action"], registry=self.registry)
        self.moves = Counter("scepsy_control_moves", "Replicas started, stopped or moved by "
                             "applied changes", registry=self.registry)
        self.forecast = Gauge("scepsy_control_forecast_rate", "Forecast request rate (req/s)",
                              ["workflow"], registry=self.registry)
        self.replicas = Gauge("scepsy_control_replicas", "Replicas of the running plan",
                              ["llm"], registry=self.registry)
        for action in ("keep", "scale-up", "scale-down", "replan-failed"):
            self.decisions.labels(action=action)

    def decided(self, d: Decision) -> None:
        self.decisions.labels(action=d.action).inc()
        for w, r in d.forecast_rates.items():
            if math.isfinite(r):
                self.forecast.labels(workflow=w).set(r)

    def running(self, plan: LaunchPlan) -> None:
        for m, model in plan.models.items():
            self.replicas.labels(llm=m).set(len(plan.replicas_of(m)) or model.replicas)


@dataclass
class LoopResult:
    windows: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    applied: int = 0
    failed: int = 0
    moves: int = 0
    interrupted: bool = False


def replica_urls(plan: LaunchPlan, target: ApplyTarget | None) -> dict[str, list[str]]:
    """LLM -> its replicas' base URLs (the target's, or the plan's own addresses)."""
    def url(r: Any) -> str:
        return target.url(plan, r) if target is not None else \
            f"http://{plan.url_host(r.node)}:{r.port}/v1"
    out: dict[str, list[str]] = {}
    for r in plan.replicas:
        out.setdefault(r.llm, []).append(url(r))
    return out


class JsonLog:
    """One JSON object per line, flushed at once (a log read while it grows)."""

    def __init__(self, stream: IO[str], clock: Callable[[], float] = time.time) -> None:
        self.stream = stream
        self.clock = clock

    def __call__(self, row: Mapping[str, Any]) -> None:
        self.stream.write(json.dumps({"time": round(self.clock(), 3), **row}, sort_keys=True,
                                     default=str) + "\n")
        self.stream.flush()


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop``; whether it stopped."""
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)
    return stop.is_set()


async def control_loop(controller: Controller, plan: LaunchPlan, target: ApplyTarget | None,
                       gateway_url: str, *, window_s: float, log: Callable[[dict[str, Any]], None],
                       stop: asyncio.Event, dry_run: bool = False,
                       health_timeout_s: float = 900.0,
                       metrics: ControlMetrics | None = None,
                       client: httpx.AsyncClient | None = None,
                       on_decision: Callable[[Decision], None] | None = None,
                       on_plan: Callable[[LaunchPlan], None] | None = None) -> LoopResult:
    """Run windows of ``window_s`` until ``stop`` is set (module docstring). ``target`` None
    (or ``dry_run``): decisions are logged, nothing is changed. ``on_decision`` sees every
    decision; ``on_plan`` every launch plan a change made the running one."""
    res = LoopResult()
    own = client is None
    http = client if client is not None else httpx.AsyncClient(trust_env=False)
    poll_s = min(MAX_POLL_S, window_s / POLLS_PER_WINDOW)
    if metrics is not None:
        metrics.running(plan)
    try:
        tel = Telemetry(gateway_url, replica_urls(plan, target), client=http)
        workflows = sorted(controller.problem.targets)
        errors = _Errors(log)
        first: Scrape | None = None
        while first is None or first.gateway is None:
            first = await tel.scrape()
            errors(first)
            if first.gateway is None and await _wait(stop, poll_s):
                res.interrupted = True
                return res
        while not stop.is_set():
            polls = [first]
            end = first.at_s + window_s
            while True:
                if await _wait(stop, min(poll_s, end - tel.now())):
                    res.interrupted = True
                    return res
                s = await tel.scrape()
                errors(s)
                polls.append(s)
                if s.at_s >= end:
                    break
            last = polls[-1]
            if last.gateway is None:  # the window cannot be judged: wait for the next read
                if await _wait(stop, poll_s):
                    res.interrupted = True
                    return res
                continue
            gw = [p for p in polls if p.gateway is not None]
            w = window_stats(gw[0], last, polls, workflows=workflows)
            d = controller.observe(w)
            res.windows += 1
            res.decisions[d.action] = res.decisions.get(d.action, 0) + 1
            log({"kind": "decision", **d.to_dict()})
            if metrics is not None:
                metrics.decided(d)
            if on_decision is not None:
                on_decision(d)
            if d.replan is not None and d.action in ("scale-up", "scale-down"):
                def log_step(row: dict[str, Any]) -> None:
                    log({"kind": "apply", **row})
                try:
                    if target is None or dry_run:
                        apply_decision(d, plan, _NoTarget(), gateway_url, log=log_step,
                                       timeout_s=health_timeout_s, dry_run=True)
                        first = last
                        continue
                    out = await asyncio.to_thread(
                        apply_decision, d, plan, target, gateway_url, log=log_step,
                        timeout_s=health_timeout_s, interrupted=stop.is_set)
                except InputError as exc:  # a re-plan this deployment cannot take
                    log_step({"step": "failed", "decision_at_s": d.at_s, "reason": str(exc),
                              "routes": "unchanged"})
                    res.failed += 1
                    first = last
                    continue
                if out.ok:
                    controller.commit(d)
                    plan = out.plan
                    if on_plan is not None:
                        on_plan(plan)
                    tel.set_replicas(replica_urls(plan, target))
                    res.applied += 1
                    res.moves += d.moves
                    if metrics is not None:
                        metrics.moves.inc(d.moves)
                        metrics.running(plan)
                else:
                    res.failed += 1
                if out.interrupted:
                    res.interrupted = True
                    return res
            first = last
        res.interrupted = True
        return res
    finally:
        if own:
            await http.aclose()


class _NoTarget:
    """Stands in for a target in a dry run (never called: a dry run starts nothing)."""

    name = "none"

    def _never(self, *_: Any) -> Any:
        raise AssertionError("a dry run starts and stops nothing")

    start = healthy = stop = _never

    def url(self, plan: LaunchPlan, r: Any) -> str:
        return f"http://{plan.url_host(r.node)}:{r.port}/v1"


class _Errors:
    """Logs a read's errors when they differ from the last read's (one line per change, not
    one per poll), and that the sources answer again."""

    def __init__(self, log: Callable[[dict[str, Any]], None]) -> None:
        self.log = log
        self.last: tuple[str, ...] = ()

    def __call__(self, s: Scrape) -> None:
        if s.errors != self.last:
            self.log({"kind": "telemetry", "at_s": round(s.at_s, 3), "errors": list(s.errors)})
        self.last = s.errors
