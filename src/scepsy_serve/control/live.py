"""The live loop of ``scepsy control`` (docs/control.md): every window, read the telemetry
(:mod:`scepsy_serve.control.telemetry`), let the controller decide
(:class:`~scepsy_serve.control.core.Controller`), log the decision, and apply a change with
:func:`~scepsy_serve.control.actuate.apply_decision`; the controller's own Prometheus metrics
(:class:`ControlMetrics`) say what it decided.

The log (``--log``, JSON lines) holds one ``{"kind": "decision", ...}`` line per window
(:meth:`Decision.to_dict`: the reason, the observed and forecast rates, the predicted effect),
one ``{"kind": "apply", "step": ...}`` line per step of a change, and ``{"kind": "telemetry"}``
lines for sources that did not answer; faults (:mod:`scepsy_serve.control.faults`) add a
``{"kind": "fault", "fault": ..., "reason": ...}`` line when noticed, a ``{"kind": "hold"}``
line per window held without a decision, ``{"kind": "replace"}`` lines per step of replacing a
replica that is down and ``{"kind": "routes"}`` when the routes are handed again. A stop (the ``stop`` event: SIGINT, SIGTERM or
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
from scepsy_serve.control.actuate import ROUTES_PATH, STATE_PATH, ApplyTarget, apply_decision
from scepsy_serve.control.core import Controller, Decision
from scepsy_serve.control.faults import (
    Fault,
    FaultState,
    GatewayView,
    detect,
    start_deadline,
    start_hung,
)
from scepsy_serve.control.telemetry import Scrape, Telemetry, server_root, window_stats
from scepsy_serve.launch.launchplan import LaunchPlan, ReplicaLaunch
from scepsy_serve.launch.routes import plan_routes

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
        self.faults = Counter("scepsy_control_faults", "Faults noticed, by kind",
                              ["fault"], registry=self.registry)
        for action in ("keep", "scale-up", "scale-down", "replan-failed"):
            self.decisions.labels(action=action)
        for kind in ("replica_down", "start_hung", "telemetry_stale", "gateway_restarted"):
            self.faults.labels(fault=kind)

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
    held: int = 0  # windows held without a decision (no fresh telemetry, gateway restarted)
    replaced: int = 0  # replicas down replaced
    faults: dict[str, int] = field(default_factory=dict)


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
                       on_plan: Callable[[LaunchPlan], None] | None = None,
                       on_fault: Callable[[Fault], None] | None = None) -> LoopResult:
    """Run windows of ``window_s`` until ``stop`` is set (module docstring). ``target`` None
    (or ``dry_run``): decisions are logged, nothing is changed. ``on_decision`` sees every
    decision; ``on_plan`` every launch plan a change made the running one; ``on_fault`` every
    fault noticed (:mod:`scepsy_serve.control.faults`)."""
    res = LoopResult()

    def record(f: Fault) -> None:
        """Count a fault, log it and hand it on (metrics, ``on_fault``)."""
        res.faults[f.kind] = res.faults.get(f.kind, 0) + 1
        log(f.to_dict())
        if metrics is not None:
            metrics.faults.labels(fault=f.kind).inc()
        if on_fault is not None:
            on_fault(f)
    own = client is None
    http = client if client is not None else httpx.AsyncClient(trust_env=False)
    poll_s = min(MAX_POLL_S, window_s / POLLS_PER_WINDOW)
    deadline_s = start_deadline(controller.config.startup_s, window_s)
    acting = target is not None and not dry_run
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
        faults = FaultState(last=await read_view(http, gateway_url))
        mark = first.at_s  # where the window starts (the baseline ``first`` may be older)
        while not stop.is_set():
            polls = [first]
            end = mark + window_s
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
            mark = last.at_s
            view = await read_view(http, gateway_url) if last.gateway is not None else None
            verdict = detect(faults, last.at_s, view, deadline_s=deadline_s)
            faults = verdict.state
            for f in verdict.faults:
                record(f)
            if verdict.resync:  # a new gateway: this read is the baseline, it gets the routes
                first = last
                if acting:
                    assert target is not None
                    await asyncio.to_thread(hand_routes, plan, target, gateway_url, log)
                res.held += 1
                log({"kind": "hold", "at_s": round(last.at_s, 3), "reason": "the gateway "
                     "restarted: counters resynchronised, the window is not judged"})
                continue
            if verdict.hold:  # no fresh telemetry: no decision (above all no scale-down)
                res.held += 1
                log({"kind": "hold", "at_s": round(last.at_s, 3), "reason": "no fresh "
                     "telemetry at this window's end (gateway "
                     + ("unreachable" if view is None else "state unchanged under load")
                     + "): no decision"})
                if last.gateway is not None and view is not None:
                    first = last
                continue
            if verdict.replace:
                if acting:
                    assert target is not None
                    for u in verdict.replace:
                        r = replica_at(plan, target, u)
                        if r is None:
                            log({"kind": "replace", "url": u, "step": "skipped",
                                 "reason": "no replica of the running plan has this URL"})
                            continue
                        how = await asyncio.to_thread(
                            replace_replica, plan, target, r, gateway_url, log=log,
                            deadline_s=deadline_s, interrupted=stop.is_set, now=tel.now)
                        if how == "replaced":
                            res.replaced += 1
                            tel.set_replicas(replica_urls(plan, target))
                        elif how == "hung":
                            res.faults["start_hung"] = res.faults.get("start_hung", 0) + 1
                            if metrics is not None:
                                metrics.faults.labels(fault="start_hung").inc()
                            faults = faults.forget("replica_down", u)  # tried again next window
                else:
                    for u in verdict.replace:
                        log({"kind": "replace", "url": u, "step": "dry-run",
                             "reason": "no apply target: the replica is not replaced"})
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
                    if "not healthy after" in out.reason:  # a start hung: rolled back
                        f = Fault("start_hung", tel.now(), "change", d.at_s, out.reason + ": the "
                                  "change is rolled back, the running plan stays")
                        record(f)
                if out.interrupted:
                    res.interrupted = True
                    return res
            first = last
        res.interrupted = True
        return res
    finally:
        if own:
            await http.aclose()


async def read_view(http: httpx.AsyncClient, gateway_url: str,
                    timeout_s: float = 5.0) -> GatewayView | None:
    """The gateway's ``GET /scepsy/state`` as a :class:`GatewayView` (None: it did not answer
    or answered something else)."""
    try:
        resp = await http.get(gateway_url.rstrip("/") + STATE_PATH, timeout=timeout_s)
        resp.raise_for_status()
        return GatewayView.from_state(resp.json())
    except (httpx.HTTPError, ValueError, OSError):
        return None


def replica_at(plan: LaunchPlan, target: ApplyTarget, url: str) -> ReplicaLaunch | None:
    """The replica of ``plan`` the gateway knows as ``url`` (None: none)."""
    want = server_root(url)
    return next((r for r in plan.replicas if server_root(target.url(plan, r)) == want), None)


def hand_routes(plan: LaunchPlan, target: ApplyTarget, gateway_url: str,
                log: Callable[[dict[str, Any]], None]) -> bool:
    """``PUT /scepsy/routes`` with the routes of ``plan`` (each replica at its target's URL);
    whether the gateway took them (logged either way)."""
    routes = plan_routes(plan, lambda r: target.url(plan, r))
    try:
        resp = httpx.put(gateway_url.rstrip("/") + ROUTES_PATH, json=routes.to_dict(),
                         timeout=30.0, trust_env=False)
        ok = resp.status_code == 200
        why = "" if ok else f"{resp.status_code}: {resp.text.strip()[:300]}"
    except httpx.HTTPError as exc:
        ok, why = False, str(exc) or type(exc).__name__
    log({"kind": "routes", "ok": ok, **({"reason": why} if why else {})})
    return ok


def replace_replica(plan: LaunchPlan, target: ApplyTarget, replica: ReplicaLaunch,
                    gateway_url: str, *, log: Callable[[dict[str, Any]], None],
                    deadline_s: float, poll_s: float = 0.1,
                    interrupted: Callable[[], bool] = lambda: False,
                    clock: Callable[[], float] = time.monotonic,
                    now: Callable[[], float] | None = None) -> str:
    """Replace a replica that is down (docs/control.md, "Faults"): stop what is left of it
    (it serves nothing), start the same launch again, wait until it is healthy, hand the
    gateway the routes (its URL may have changed). Not healthy within ``deadline_s``: a
    ``start_hung`` fault is logged and the new start is stopped (the routes keep the dead
    replica, which the gateway's health checks keep out of use). A replica that still answers
    the target's own health check is left running (the gateway may see it down because it is
    overloaded: stopping it would fail its calls). ``replaced``, ``alive`` or ``hung``.
    ``now``: the loop's clock, for the fault's time (default ``clock``)."""
    name = f"{replica.llm}/{replica.replica}"

    def step(s: str, **kw: Any) -> None:
        log({"kind": "replace", "replica": name, "step": s, **kw})

    if _healthy(target, plan, replica):
        step("alive", reason="it answers the target's health check: left running")
        return "alive"

    with contextlib.suppress(Exception):  # a dead server: nothing, or its leftovers, to stop
        target.stop(plan, replica)
    t0 = clock()
    try:
        target.start(plan, replica)
        step("start", port=replica.port)
        healthy = False
        while not (healthy := _healthy(target, plan, replica)):
            if start_hung(t0, clock(), healthy, deadline_s) or interrupted():
                break
            time.sleep(poll_s)
    except Exception as exc:  # the start failed outright: as hung, it did not come up
        healthy, why = False, f"{type(exc).__name__}: {exc}"
    else:
        why = "interrupted" if interrupted() and not healthy else ""
    if not healthy:
        url = server_root(target.url(plan, replica)) if _has_url(target, plan, replica) else name
        at = (now or clock)()
        f = Fault("start_hung", at, url, at - (clock() - t0), why or (
            f"{name} not healthy {deadline_s:.3g} s after its start (the start-up deadline): "
            "stopped, tried again at the next window"), replica.llm)
        log(f.to_dict())
        with contextlib.suppress(Exception):
            target.stop(plan, replica)
        return "hung"
    step("healthy", after_s=round(clock() - t0, 3))
    hand_routes(plan, target, gateway_url, log)  # refused: the gateway's checks take it in
    return "replaced"


def _healthy(target: ApplyTarget, plan: LaunchPlan, r: ReplicaLaunch) -> bool:
    try:
        return bool(target.healthy(plan, r))
    except Exception:  # it exited: not healthy (the deadline decides)
        return False


def _has_url(target: ApplyTarget, plan: LaunchPlan, r: ReplicaLaunch) -> bool:
    try:
        target.url(plan, r)
        return True
    except Exception:
        return False


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
