"""The controller in the real loop (``scepsy bench loop --control``, docs/control.md): the servers
the loop launched behind a gateway, the load stepping up mid-run, ``scepsy control``'s loop
adding capacity through the shell target, and the measured latency per window before, during and
after the change.

:func:`drive_under_control` replaces the loop's drive stage
(:func:`scepsy_serve.loop.bench_loop.run_loop` with ``LoopOptions.control``):

1. a gateway (:mod:`scepsy_serve.gateway`) in a thread, routing by the launch folder's
   ``routes.json`` and recording the calls it forwards;
2. the controller (:class:`~scepsy_serve.control.core.Controller`, windows of
   ``ControlLoop.window_s``) in a thread of its own, reading the gateway's and the replicas'
   ``/metrics`` and applying its decisions with the shell target
   (:class:`~scepsy_serve.control.actuate.ShellTarget`: real ``vllm serve`` processes, the run's
   marker in their environment), its decision log ``OUT/control.jsonl`` and the gateway's trace
   ``OUT/gateway-trace.jsonl``;
3. the drive through the gateway: every LLM of every workflow routed to the gateway, the total
   rate ``rate`` until ``step_at_s`` and ``rate * step_factor`` after
   (:func:`~scepsy_serve.launch.drive.plan_drive`'s ``rate_steps``);
4. the controller stopped after the drive (a change in progress finishes or rolls back), every
   server it started stopped, and the drive's requests summarised per window of their arrival
   (:func:`latency_windows`) so the report shows the latency before the step, after it and
   after the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scepsy_common.errors import InputError
from scepsy_opt.ingest.record import RecordConfig
from scepsy_opt.prediction.priority import PRIORITY_POLICIES, PriorityPolicy
from scepsy_opt.workflows import WorkflowSpec
from scepsy_place.formulations.placed import PlacedPlan
from scepsy_place.packing.topology import Topology
from scepsy_profile.profiling.replay import ReplayTimeouts
from scepsy_serve.control.actuate import ShellTarget
from scepsy_serve.control.core import ControlConfig, Controller, Decision
from scepsy_serve.control.live import JsonLog, LoopResult, control_loop
from scepsy_serve.gateway import GatewayConfig, gateway_in_thread
from scepsy_serve.launch.drive import DriveProgress, DriveResult, drive, plan_drive
from scepsy_serve.launch.launchplan import LaunchPlan
from scepsy_serve.launch.routes import Endpoint, Routes, load_routes

SOURCE = "bench loop --control"
CONTROL_LOG = "control.jsonl"
GATEWAY_TRACE = "gateway-trace.jsonl"


@dataclass(frozen=True)
class ControlLoop:
    """The controlled run's knobs: the load step (``step_factor`` times the rate from
    ``step_at_s`` on), the controller's window and the start-up time it plans with (None: the
    time the loop's own servers took to answer ``/health``), and the gateway's priority
    policy."""

    step_at_s: float = 90.0
    step_factor: float = 3.0
    window_s: float = 10.0
    startup_s: float | None = None
    priority: PriorityPolicy = "fcfs"

    def __post_init__(self) -> None:
        for name in ("step_at_s", "window_s"):
            x = getattr(self, name)
            if isinstance(x, bool) or not (isinstance(x, int | float) and math.isfinite(x)
                                           and x > 0):
                raise InputError(SOURCE, name, "a number of seconds > 0", x)
        x = self.step_factor
        if isinstance(x, bool) or not (isinstance(x, int | float) and math.isfinite(x)
                                       and x > 0):
            raise InputError(SOURCE, "step_factor", "a factor > 0", x)
        s = self.startup_s
        if s is not None and (isinstance(s, bool) or not (
                isinstance(s, int | float) and math.isfinite(s) and s >= 0)):
            raise InputError(SOURCE, "startup_s", "a number of seconds >= 0 (or None)", s)
        if self.priority not in PRIORITY_POLICIES:
            raise InputError(SOURCE, "priority", " or ".join(PRIORITY_POLICIES), self.priority)


@dataclass(frozen=True)
class LatencyWindow:
    """The drive's requests that arrived in ``[start_s, end_s)``: how many, how many failed,
    and the completed ones' latency (p50, p90; None without one)."""

    start_s: float
    end_s: float
    requests: int
    failed: int
    p50_s: float | None
    p90_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"start_s": self.start_s, "end_s": self.end_s, "requests": self.requests,
                "failed": self.failed, "p50_s": self.p50_s, "p90_s": self.p90_s}


def latency_windows(requests: Sequence[Any], window_s: float) -> tuple[LatencyWindow, ...]:
    """The drive's request outcomes (``arrival_s``, ``end_s``, ``failure``) grouped by the
    window of their arrival, from 0 to the last arrival."""
    if not requests:
        return ()
    last = max(r.arrival_s for r in requests)
    n = int(last // window_s) + 1
    rows = []
    for k in range(n):
        a, b = k * window_s, (k + 1) * window_s
        mine = [r for r in requests if a <= r.arrival_s < b]
        lat = np.array([r.end_s - r.arrival_s for r in mine if r.failure is None], dtype=float)
        p50 = float(np.percentile(lat, 50)) if len(lat) else None
        p90 = float(np.percentile(lat, 90)) if len(lat) else None
        rows.append(LatencyWindow(a, b, len(mine), sum(r.failure is not None for r in mine),
                                  p50, p90))
    return tuple(rows)


@dataclass
class ControlRun:
    """What the controlled drive did: the controller's windows and decisions (their log rows),
    the changes applied, the gateway's URL and the latency per window of arrival."""

    step_at_s: float
    rate: float
    stepped_rate: float
    startup_s: float
    decisions: list[dict[str, Any]] = field(default_factory=list)
    applied: int = 0
    failed_changes: int = 0
    moves: int = 0
    windows: tuple[LatencyWindow, ...] = ()
    servers_started: int = 0
    log: str = ""
    retried: int = 0
    """Calls the gateway sent again after a connection was lost before an answer."""

    def to_dict(self) -> dict[str, Any]:
        return {"step_at_s": self.step_at_s, "rate": self.rate,
                "stepped_rate": self.stepped_rate, "startup_s": self.startup_s,
                "decisions": self.decisions, "applied": self.applied,
                "failed_changes": self.failed_changes, "moves": self.moves,
                "windows": [w.to_dict() for w in self.windows],
                "servers_started": self.servers_started, "log": self.log,
                "retried": self.retried}


def gateway_routes(specs: Sequence[WorkflowSpec], url: str) -> Routes:
    """Every LLM of every workflow to the gateway (``url``), under its own name: the gateway
    picks the replica."""
    return Routes({s.name: {m: (Endpoint(url.rstrip("/") + "/v1", m, 1.0, None),)
                            for m in s.llms} for s in specs})


class _ControllerThread:
    """The control loop on an event loop of its own, in a thread; :meth:`stop` ends it after
    the step in progress."""

    def __init__(self, run: Callable[[asyncio.Event], Any]) -> None:
        self._run = run
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.result: LoopResult | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="scepsy-control", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            self.result = await self._run(self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by stop()
            self.error = exc
        finally:
            self._ready.set()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def stop(self, timeout_s: float) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)


def drive_under_control(*, control: ControlLoop, specs: Sequence[WorkflowSpec],
                        plan: LaunchPlan, launch_dir: Path, work: Path,
                        controller: Controller, rate: float, requests: int, seed: int,
                        max_in_flight: int, timeouts: ReplayTimeouts, health_timeout_s: float,
                        progress: DriveProgress, startup_s: float,
                        say: Callable[[str], None]) -> tuple[DriveResult, ControlRun]:
    """The controlled drive (module docstring); the servers the controller started are stopped
    before it returns, whatever happens."""
    routes = load_routes(launch_dir / "routes.json")
    # beside the results (the run folder goes unless --keep)
    record = RecordConfig(out=work.parent / GATEWAY_TRACE, routed=True,
                          timeout_s=timeouts.call_s)
    target = ShellTarget(launch_dir / "run")  # where start.sh keeps its pid files
    log_path = work.parent / CONTROL_LOG
    for old in (log_path, record.out):  # a rerun into the same folder replaces them
        old.unlink(missing_ok=True)
    rows: list[dict[str, Any]] = []
    stepped = rate * control.step_factor
    run = ControlRun(control.step_at_s, rate, stepped, startup_s, log=str(log_path))
    final: list[LaunchPlan] = [plan]

    def decided(d: Decision) -> None:
        say(f"control: {d.action} at {d.at_s:.0f} s ({d.reason})")

    with gateway_in_thread(GatewayConfig(record=record, routes=routes,
                                         priority=control.priority)) as url, \
            open(log_path, "a", encoding="utf-8") as stream:
        log = JsonLog(stream)

        def keep(row: Mapping[str, Any]) -> None:
            rows.append(dict(row))
            log(row)

        async def loop(stop: asyncio.Event) -> LoopResult:
            return await control_loop(controller, plan, target, str(url),
                                      window_s=control.window_s, log=keep, stop=stop,
                                      health_timeout_s=health_timeout_s,
                                      on_decision=decided, on_plan=final.append)

        thread = _ControllerThread(loop)
        thread.start()
        try:
            say(f"control: gateway {url}, windows of {control.window_s:g} s, start-up "
                f"{startup_s:.0f} s; the load steps from {rate:.3g} to {stepped:.3g} req/s at "
                f"{control.step_at_s:g} s")
            drive_plan = plan_drive(specs, gateway_routes(specs, str(url)), rate=rate,
                                    requests=requests, seed=seed,
                                    rate_steps=[(control.step_at_s, stepped)])
            result = drive(drive_plan, max_in_flight=max_in_flight, timeouts=timeouts,
                           deadline_s=drive_plan.requests[-1].arrival_s * 3 + 120,
                           progress=progress)
        finally:
            thread.stop(health_timeout_s + 60)
            with contextlib.suppress(Exception):  # a count for the report, never the cause
                run.retried = url.stats().retried
            started = _started_here(plan, final[-1])
            run.servers_started = len(started)
            for r in started:
                try:
                    target.stop(final[-1], r)
                except Exception as exc:  # reported; the loop's leftover check finds it
                    say(f"control: stopping {r.name} failed: {exc}")
    if thread.error is not None:
        raise thread.error
    res = thread.result or LoopResult()
    run.decisions = [r for r in rows if r.get("kind") == "decision"]
    run.applied, run.failed_changes, run.moves = res.applied, res.failed, res.moves
    run.windows = latency_windows(result.requests, control.window_s)
    return result, run


def _started_here(before: LaunchPlan, after: LaunchPlan) -> list[Any]:
    """Replicas of ``after`` that ``before`` did not run (by node and port)."""
    had = {(r.node, r.port) for r in before.replicas}
    return [r for r in after.replicas if (r.node, r.port) not in had]


def running_controller(problem: Any, topology: Topology, placed: PlacedPlan,
                       control: ControlLoop, startup_s: float) -> Controller:
    """The controller of the loop's plan, planning with ``startup_s``."""
    return Controller(problem, topology, placed,
                      ControlConfig(window_s=control.window_s, startup_s=startup_s))
