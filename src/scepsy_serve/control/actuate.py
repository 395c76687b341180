"""Applying a controller's decision to a running deployment (docs/control.md): apply targets
(:class:`ApplyTarget`, registered in :data:`APPLY_TARGETS`) start, check and stop single
replicas; :func:`apply_decision` changes a deployment in the one order that loses no call:

1. **start** every new replica (:func:`plan_change`: started and moved replicas, each on a port
   no running server uses), then **wait** until each answers ``/health`` (``timeout_s``);
2. **route**: ``PUT /scepsy/routes`` on the gateway with the routes of the new plan
   (:func:`~scepsy_serve.launch.routes.plan_routes`, each replica at its target's URL): old
   replicas get no new call from here on;
3. **drain**: wait until no old replica has a call in flight (``GET /scepsy/state``);
4. **stop** the old replicas (stopped and moved).

A start that fails (a server that exits, a ``/health`` that does not answer within
``timeout_s``, the gateway refusing the routes, an interrupt before the routes changed) is
rolled back: what was started is stopped, the routes stay as they were, the running plan stays.
An interrupt after the routes changed finishes the change (drain, stop): the routes never name
a stopped replica. Every step is one JSON line on ``log``.

The shell target (:class:`ShellTarget`) runs one replica's server on this host, the command and
environment ``start.sh`` gives it (:func:`~scepsy_serve.launch.shell.start_command`,
:func:`~scepsy_serve.launch.shell.replica_env`), in its own process group, logged under its run
folder; it stops a replica it started by its process group, and one ``start.sh`` started by the
pid file of the launch folder's run folder (``run_dir``).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import httpx
import psutil

from scepsy_common.errors import InputError
from scepsy_place.formulations.incremental import Replan
from scepsy_profile.profiling.processes import end_process_group, group_has
from scepsy_profile.profiling.server import IPC_PATH_ROOM, port_in_use
from scepsy_serve.launch.host import LaunchError, _live, _ours, _read_pid
from scepsy_serve.launch.launchplan import LaunchPlan, ModelLaunch, ReplicaLaunch
from scepsy_serve.launch.routes import plan_routes
from scepsy_serve.launch.shell import (
    RUNTIME_VALUES,
    SERVER_ENV,
    STOP_GRACE_S,
    bind_address,
    last_option,
    probe_address,
    replica_env,
    start_command,
)

ROUTES_PATH = "/scepsy/routes"
STATE_PATH = "/scepsy/state"
POLL_S = 0.5
MAX_PORT = 65535


class ApplyTarget(Protocol):
    """Starts, checks and stops one replica of a :class:`LaunchPlan` (the plan it belongs to)."""

    name: str

    def start(self, plan: LaunchPlan, replica: ReplicaLaunch) -> None:
        """Start ``replica`` (returns at once; :meth:`healthy` says when it serves)."""

    def healthy(self, plan: LaunchPlan, replica: ReplicaLaunch) -> bool:
        """Whether ``replica`` answers ``/health`` (an exception: it will not, e.g. it exited)."""

    def url(self, plan: LaunchPlan, replica: ReplicaLaunch) -> str:
        """``replica``'s OpenAI-compatible base URL (``.../v1``)."""

    def stop(self, plan: LaunchPlan, replica: ReplicaLaunch) -> None:
        """Stop ``replica`` (returns once it is gone)."""


TargetFactory = Callable[..., ApplyTarget]
APPLY_TARGETS: dict[str, TargetFactory] = {}
"""Apply target name -> factory (keyword options of the target). ``ray`` registers itself when
:mod:`scepsy_serve.control.ray_target` is imported (:func:`apply_target` imports it)."""
_LAZY = {"ray": "scepsy_serve.control.ray_target"}


def register_target(name: str, factory: TargetFactory) -> TargetFactory:
    APPLY_TARGETS[name] = factory
    return factory


def target_names() -> tuple[str, ...]:
    return tuple(sorted(set(APPLY_TARGETS) | set(_LAZY)))


def apply_target(name: str, **options: Any) -> ApplyTarget:
    """The apply target ``name`` made with ``options``; an :class:`InputError` about
    ``--target`` when there is none of that name (or its module cannot be imported)."""
    if name not in APPLY_TARGETS and name in _LAZY:
        try:
            importlib.import_module(_LAZY[name])
        except ImportError as exc:
            raise InputError("--target", "", f"an apply target that can run here ({name} "
                             f"needs {exc.name or 'a module that is missing'})", name) from None
    if name not in APPLY_TARGETS:
        raise InputError("--target", "", f"one of {', '.join(target_names())}", name)
    return APPLY_TARGETS[name](**options)


# -- the shell target -------------------------------------------------------------------------------

@dataclass
class _Started:
    proc: subprocess.Popen[bytes]
    log: Path
    tmp: Path | None


class ShellTarget:
    """Real ``vllm serve`` (the plan's engine command) on this host, one process group per
    replica. ``run_dir``: where its logs (``control/logs/NAME-PORT.log``), pid files and engine
    folders go, and where ``start.sh`` wrote the pid files of the servers it started (so that
    those can be stopped too). Servers are known by ``(node, port)``: a port is one server."""

    name = "shell"

    def __init__(self, run_dir: str | os.PathLike[str], *, grace_s: float = STOP_GRACE_S,
                 environ: Mapping[str, str] | None = None) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.grace_s = grace_s
        self.environ = dict(os.environ if environ is None else environ)
        self._started: dict[tuple[str, int], _Started] = {}

    def _key(self, r: ReplicaLaunch) -> tuple[str, int]:
        return (r.node, r.port)

    def _tag(self, r: ReplicaLaunch) -> str:
        return f"{r.name}-{r.port}"

    def _env(self, plan: LaunchPlan, r: ReplicaLaunch) -> tuple[dict[str, str], Path | None]:
        """The server's environment: start.sh's (:func:`replica_env`), with the folders start.sh
        chooses at run time chosen here (a short ``TMPDIR`` for vLLM's sockets, the cache under
        the run folder, the MPS pipe of the environment)."""
        env = replica_env(plan, r)
        tmp: Path | None = None
        for k, v in list(env.items()):
            if v != RUNTIME_VALUES.get(k):
                continue
            if k == "TMPDIR":
                base = self.run_dir / "control" / "tmp" / self._tag(r)
                if len(str(base)) + IPC_PATH_ROOM > 107:
                    import tempfile

                    base = Path(tempfile.mkdtemp(prefix="scepsy-", dir="/tmp"))
                    tmp = base
                base.mkdir(parents=True, exist_ok=True)
                env[k] = str(base)
            elif k == "VLLM_CACHE_ROOT":
                (self.run_dir / "vllm-cache").mkdir(parents=True, exist_ok=True)
                env[k] = str(self.run_dir / "vllm-cache")
            elif k == "CUDA_MPS_PIPE_DIRECTORY":
                env[k] = self.environ.get(k, "/tmp/nvidia-mps")
        pids = self.run_dir / "control" / "pids"
        env[SERVER_ENV] = str(pids / self._tag(r))
        return env, tmp

    def start(self, plan: LaunchPlan, replica: ReplicaLaunch) -> None:
        key = self._key(replica)
        if key in self._started and self._started[key].proc.poll() is None:
            raise LaunchError(f"{replica.name}: a server this controller started already runs "
                              f"on port {replica.port}")
        if port_in_use(replica.port):
            raise LaunchError(f"{replica.name}: port {replica.port} is in use")
        argv = start_command(plan, replica)
        env, tmp = self._env(plan, replica)
        logs = self.run_dir / "control" / "logs"
        pids = self.run_dir / "control" / "pids"
        logs.mkdir(parents=True, exist_ok=True)
        pids.mkdir(parents=True, exist_ok=True)
        log = logs / f"{self._tag(replica)}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**self.environ, **env})
        (pids / f"{self._tag(replica)}.pid").write_text(f"{proc.pid}\n")
        self._started[key] = _Started(proc, log, tmp)

    def port_free(self, node: str, port: int) -> bool:
        """Whether ``port`` is free on this host (:func:`plan_change` skips busy ones)."""
        return not port_in_use(port)

    def _probe_url(self, plan: LaunchPlan, r: ReplicaLaunch) -> str:
        host = probe_address(bind_address(plan, r.node))
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{r.port}"

    def healthy(self, plan: LaunchPlan, replica: ReplicaLaunch) -> bool:
        started = self._started.get(self._key(replica))
        if started is not None and started.proc.poll() is not None:
            tail = "\n".join(started.log.read_text(errors="replace").splitlines()[-20:])
            raise LaunchError(f"{replica.name} exited ({started.proc.returncode}) before "
                              f"/health answered; last lines of {started.log}:\n{tail}")
        try:
            resp = httpx.get(self._probe_url(plan, replica) + "/health", timeout=5.0,
                             trust_env=False)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    def url(self, plan: LaunchPlan, replica: ReplicaLaunch) -> str:
        return f"http://{plan.url_host(replica.node)}:{replica.port}/v1"

    def stop(self, plan: LaunchPlan, replica: ReplicaLaunch) -> None:
        started = self._started.pop(self._key(replica), None)
        if started is not None:
            end_process_group(started.proc, self.grace_s, wait_first=False)
            with contextlib.suppress(OSError):
                (self.run_dir / "control" / "pids" / f"{self._tag(replica)}.pid").unlink()
            if started.tmp is not None:
                import shutil

                shutil.rmtree(started.tmp, ignore_errors=True)
        else:
            self._stop_adopted(replica)
        deadline = time.monotonic() + 10
        while port_in_use(replica.port) and time.monotonic() < deadline:
            time.sleep(0.1)

    def _adopted(self, r: ReplicaLaunch) -> tuple[int, str] | None:
        """The process group and start.sh name of the server start.sh started on ``r``'s port
        (a re-plan may have renumbered the replica since: the port is what identifies it): a
        pid file in ``run_dir/pids`` whose group carries that file's marker and serves the
        port. Its own name's file is tried first."""
        folder = self.run_dir / "pids"
        names = [r.name, *sorted(p.stem for p in folder.glob("*.pid") if p.stem != r.name)]
        for name in names:
            pid = _read_pid(self.run_dir, name)
            if pid is not None and _ours(pid, self.run_dir, name) and _serves(pid, r.port):
                return pid, name
        return None

    def _stop_adopted(self, r: ReplicaLaunch) -> None:
        """Stop a server start.sh started (:meth:`_adopted`), SIGTERM then SIGKILL after the
        grace period."""
        import signal

        found = self._adopted(r)
        if found is None:
            raise LaunchError(f"{r.name} (port {r.port}): not started by this controller and "
                              f"no pid file of start.sh for a server on that port in "
                              f"{self.run_dir / 'pids'}")
        pid, name = found
        for sig, wait in ((signal.SIGTERM, self.grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + wait
            while _live(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not _live(pid):
                break
        with contextlib.suppress(OSError):
            (self.run_dir / "pids" / f"{name}.pid").unlink()

    def close(self) -> None:
        """Forget the servers started here (they keep running: they are the deployment)."""
        self._started.clear()


register_target("shell", ShellTarget)


def _serves(pgid: int, port: int) -> bool:
    """Whether a process of group ``pgid`` was started with ``--port port`` (its command
    line)."""
    def started_on_port(proc: psutil.Process) -> bool:
        words = proc.cmdline()
        return last_option(words, "--port") == str(port) or f"--port={port}" in words

    return group_has(pgid, started_on_port)


# -- the change -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanChange:
    """The launch view after a re-plan and what changes: ``start`` (replicas of ``after``, on
    fresh ports), ``stop`` (replicas of ``before``), ``kept`` (``(before, after)`` pairs: the
    same server, renumbered perhaps, on its port)."""

    before: LaunchPlan
    after: LaunchPlan
    start: tuple[ReplicaLaunch, ...]
    stop: tuple[ReplicaLaunch, ...]
    kept: tuple[tuple[ReplicaLaunch, ReplicaLaunch], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.start and not self.stop


def plan_change(plan: LaunchPlan, rp: Replan,
                port_free: Callable[[str, int], bool] | None = None) -> PlanChange:
    """What applying ``rp`` to the running ``plan`` means: the new launch view (each LLM's
    shape from the re-plan's allocation; engine, models' commands and addresses from ``plan``);
    kept replicas keep their server and port, new ones (started, moved) take the lowest ports
    from the plan's ``base_port`` up that no server of either plan uses on their node (and
    that ``port_free(node, port)`` says is free there, when given)."""
    if not rp.ok or rp.placed.placement is None or rp.placed.plan.allocation is None:
        raise InputError("decision", "replan", "a placed re-plan", rp.status)
    alloc = rp.placed.plan.allocation
    old = {(r.llm, r.replica): r for r in plan.replicas}
    kept_rows = {(row.llm, row.after): row.before for row in rp.kept}
    used: dict[str, set[int]] = {}
    for r in plan.replicas:
        used.setdefault(r.node, set()).add(r.port)
    models: dict[str, ModelLaunch] = {}
    for m, inst in alloc.llms.items():
        if m not in plan.models:
            raise InputError("decision", f"replan.llms.{m}", "an LLM of the running plan", m)
        mem = next((s.memory_gib for s in rp.placed.placement.slots if s.llm == m),
                   plan.models[m].memory_gib)
        models[m] = replace(plan.models[m], gpu=inst.gpu, tp=inst.tp, share=inst.share,
                            replicas=inst.replicas, memory_gib=mem)
    replicas: list[ReplicaLaunch] = []
    start: list[ReplicaLaunch] = []
    kept: list[tuple[ReplicaLaunch, ReplicaLaunch]] = []
    fresh = []
    for s in sorted(rp.placed.placement.slots, key=lambda s: (s.llm, s.replica)):
        before = kept_rows.get((s.llm, s.replica))
        if before is not None and (s.llm, before) in old:
            was = old[(s.llm, before)]
            r = ReplicaLaunch(s.llm, s.replica, s.node, tuple(s.gpus), s.share, s.memory_gib,
                              was.port)
            replicas.append(r)
            kept.append((was, r))
        else:
            fresh.append(s)
    for s in fresh:
        taken = used.setdefault(s.node, set())
        port = plan.engine.base_port
        while port in taken or (port_free is not None and port <= MAX_PORT
                                and not port_free(s.node, port)):
            port += 1
        if port > MAX_PORT:
            raise InputError("decision", "port", f"a free port <= {MAX_PORT} on {s.node}")
        taken.add(port)
        r = ReplicaLaunch(s.llm, s.replica, s.node, tuple(s.gpus), s.share, s.memory_gib, port)
        replicas.append(r)
        start.append(r)
    kept_old = {id(a) for a, _ in kept}
    stop = tuple(r for r in plan.replicas if id(r) not in kept_old)
    after = replace(plan, models=models, replicas=tuple(replicas))
    return PlanChange(plan, after, tuple(start), stop, tuple(kept))


@dataclass
class ApplyResult:
    """How an :func:`apply_decision` ended: ``ok`` (the change is in place, or there was none),
    ``plan`` the launch view running now (the new one when ok, else the old one)."""

    ok: bool
    plan: LaunchPlan
    reason: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False


def _endpoint_urls(plan: LaunchPlan, rs: Sequence[ReplicaLaunch],
                   target: ApplyTarget) -> set[str]:
    return {target.url(plan, r).rstrip("/") for r in rs}


def apply_decision(decision: Any, plan: LaunchPlan, target: ApplyTarget, gateway_url: str, *,
                   log: Callable[[dict[str, Any]], None], timeout_s: float,
                   dry_run: bool = False, interrupted: Callable[[], bool] = lambda: False,
                   client: httpx.Client | None = None, poll_s: float = POLL_S,
                   drain_timeout_s: float | None = None) -> ApplyResult:
    """Apply ``decision`` (a :class:`~scepsy_serve.control.core.Decision`; one without a re-plan
    changes nothing) to the deployment ``plan`` describes, in the order of the module docstring.
    ``dry_run``: log the change, do nothing. ``interrupted()`` is asked between steps (a signal
    handler sets it): before the routes change it rolls the start back, after it the change
    finishes. ``drain_timeout_s`` (default ``timeout_s``): how long old replicas may take to
    finish their calls; after it they are stopped anyway (logged with their calls in flight)."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise InputError("apply", "timeout_s", "a number of seconds > 0", timeout_s)
    run = _Apply(decision, plan, target, gateway_url.rstrip("/"), log, timeout_s,
                 timeout_s if drain_timeout_s is None else drain_timeout_s, poll_s,
                 interrupted)
    rp = getattr(decision, "replan", None)
    if rp is None:
        return ApplyResult(True, plan, "no change", run.steps)
    change = plan_change(plan, rp, getattr(target, "port_free", None))
    run.step("plan", action=getattr(decision, "action", None), dry_run=dry_run,
             start=[_rep(r) for r in change.start], stop=[_rep(r) for r in change.stop],
             kept=len(change.kept))
    if dry_run or change.empty:
        return ApplyResult(True, plan if dry_run else change.after,
                           "dry run" if dry_run else "no replica changes", run.steps)
    http = client if client is not None else httpx.Client(timeout=30.0, trust_env=False)
    try:
        return run.apply(change, http)
    except BaseException:
        if not run.routed:  # the old routes stay: what was started goes
            for r in run.started:
                with contextlib.suppress(Exception):
                    target.stop(change.after, r)
        raise
    finally:
        if client is None:
            http.close()


@dataclass
class _Apply:
    """One change being applied: its settings, the steps logged so far, the replicas started
    and whether the routes changed (the stages of :func:`apply_decision`, in order: start,
    wait for health, route, drain, stop; a failure before the routes change rolls back)."""

    decision: Any
    plan: LaunchPlan
    target: ApplyTarget
    gateway: str
    log: Callable[[dict[str, Any]], None]
    timeout_s: float
    drain_timeout_s: float
    poll_s: float
    interrupted: Callable[[], bool]
    steps: list[dict[str, Any]] = field(default_factory=list)
    started: list[ReplicaLaunch] = field(default_factory=list)
    routed: bool = False
    t0: float = field(default_factory=time.monotonic)

    def step(self, name: str, **fields: Any) -> None:
        row = {"step": name, "elapsed_s": round(time.monotonic() - self.t0, 3),
               "decision_at_s": getattr(self.decision, "at_s", None), **fields}
        self.steps.append(row)
        self.log(row)

    def apply(self, change: PlanChange, http: httpx.Client) -> ApplyResult:
        failed = self._start(change) or self._wait_healthy(change)
        if failed is not None:
            return failed
        if self.interrupted():
            return self._rollback(change, "interrupted before the routes changed", True)
        failed = self._route(change, http)
        if failed is not None:
            return failed
        # from here on the change finishes, interrupted or not
        self._drain(change, http)
        return self._stop(change)

    def _rollback(self, change: PlanChange, reason: str,
                  was_interrupted: bool = False) -> ApplyResult:
        for r in self.started:
            try:
                self.target.stop(change.after, r)
                self.step("rollback-stop", replica=_rep(r))
            except Exception as exc:  # reported, the others still stopped
                self.step("rollback-stop-failed", replica=_rep(r), error=str(exc))
        self.step("failed", reason=reason, routes="unchanged", interrupted=was_interrupted)
        return ApplyResult(False, self.plan, reason, self.steps, was_interrupted)

    def _start(self, change: PlanChange) -> ApplyResult | None:
        """1. Start every new replica (None: all started)."""
        for r in change.start:
            if self.interrupted():
                return self._rollback(change, "interrupted before every new replica started",
                                      True)
            try:
                self.target.start(change.after, r)
            except Exception as exc:  # any failed start rolls back
                self.step("start-failed", replica=_rep(r), error=str(exc))
                return self._rollback(change, f"{r.name} did not start: {exc}")
            self.started.append(r)
            self.step("start", replica=_rep(r), url=self.target.url(change.after, r))
        return None

    def _wait_healthy(self, change: PlanChange) -> ApplyResult | None:
        """2. Wait until every new replica is healthy (None: all are)."""
        waiting = list(change.start)
        deadline = time.monotonic() + self.timeout_s
        while waiting:
            if self.interrupted():
                return self._rollback(change, "interrupted while new replicas started", True)
            still = []
            for r in waiting:
                try:
                    ok = self.target.healthy(change.after, r)
                except Exception as exc:  # a server that died
                    self.step("unhealthy", replica=_rep(r), error=str(exc))
                    return self._rollback(change, f"{r.name} is not healthy: {exc}")
                if ok:
                    self.step("healthy", replica=_rep(r))
                else:
                    still.append(r)
            waiting = still
            if waiting and time.monotonic() >= deadline:
                names = ", ".join(r.name for r in waiting)
                self.step("unhealthy", replicas=[_rep(r) for r in waiting],
                          error=f"not healthy after {self.timeout_s:g} s")
                return self._rollback(change, f"not healthy after {self.timeout_s:g} s: "
                                      f"{names}")
            if waiting:
                time.sleep(self.poll_s)
        return None

    def _route(self, change: PlanChange, http: httpx.Client) -> ApplyResult | None:
        """3. Hand the gateway the new routes (None: it took them)."""
        routes = plan_routes(change.after, lambda r: self.target.url(change.after, r))
        try:
            resp = http.put(self.gateway + ROUTES_PATH, json=routes.to_dict())
        except httpx.HTTPError as exc:
            return self._rollback(change, f"the gateway did not take the routes: {exc}")
        if resp.status_code != 200:
            return self._rollback(change, f"the gateway refused the routes "
                                  f"({resp.status_code}): {resp.text.strip()[:300]}")
        self.routed = True
        self.step("routes", version=_json(resp).get("version"), endpoints=sum(
            len(eps) for llms in routes.workflows.values() for eps in llms.values()))
        return None

    def _drain(self, change: PlanChange, http: httpx.Client) -> None:
        """4. Wait until the old replicas have no call in flight (or the drain time ends)."""
        old_urls = _endpoint_urls(self.plan, change.stop, self.target) - _endpoint_urls(
            change.after, change.after.replicas, self.target)
        drain_deadline = time.monotonic() + self.drain_timeout_s
        busy: dict[str, int] = {}
        while old_urls:
            try:
                state = _json(http.get(self.gateway + STATE_PATH))
                busy = {}
                for e in state.get("endpoints", []):
                    u = str(e.get("url", "")).rstrip("/")
                    if u in old_urls and int(e.get("in_flight", 0)) > 0:
                        busy[u] = busy.get(u, 0) + int(e["in_flight"])
            except (httpx.HTTPError, ValueError, TypeError) as exc:
                busy = {u: -1 for u in old_urls}
                self.step("drain-state-failed", error=str(exc))
            if not busy:
                break
            if time.monotonic() >= drain_deadline:
                self.step("drain-timeout", in_flight=busy)
                break
            time.sleep(self.poll_s)
        self.step("drained", replicas=[_rep(r) for r in change.stop], in_flight=busy)

    def _stop(self, change: PlanChange) -> ApplyResult:
        """5. Stop the old replicas; the change is applied."""
        failed = []
        for r in change.stop:
            try:
                self.target.stop(self.plan, r)
                self.step("stop", replica=_rep(r))
            except Exception as exc:  # the others still stop
                failed.append(r.name)
                self.step("stop-failed", replica=_rep(r), error=str(exc))
        self.step("applied", started=len(change.start),
                  stopped=len(change.stop) - len(failed), interrupted=self.interrupted())
        return ApplyResult(True, change.after,
                           f"could not stop {', '.join(failed)}" if failed else "", self.steps,
                           self.interrupted())


def _json(resp: httpx.Response) -> dict[str, Any]:
    data = resp.json()
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def _rep(r: ReplicaLaunch) -> dict[str, Any]:
    return {"llm": r.llm, "replica": r.replica, "node": r.node, "gpus": list(r.gpus),
            "port": r.port}
