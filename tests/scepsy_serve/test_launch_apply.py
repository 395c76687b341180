"""Running a rendered shell folder on this host (:mod:`scepsy_serve.launch.host`), with a fake
server in place of ``vllm serve``: :data:`FAKE_SERVER` (standard library only) answers
``/health`` on the ``--port`` it is given, records its argv and environment as JSON, and starts
a child in its own process group, as vLLM does. Options in its argv change its behaviour:
``--fake-never-healthy`` (``/health`` answers 503), ``--fake-exit`` (exits at once),
``--fake-ignore-term`` (ignores SIGTERM: stop must escalate to SIGKILL).

Properties: every server becomes healthy and runs in its own process group; argv and values
arrive verbatim (shell injection through serve paths, arguments and environment values has no
effect); a failed start (never healthy, exits, busy port) leaves nothing running; stop leaves no
process and no busy port, twice; an interrupt (inside ``running`` or during the start) stops
everything."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fakes.launch_plans import cpu_plan, gpu_plan, one_real_vllm_replica
from scepsy_common.errors import InputError
from scepsy_profile.profiling.processes import group_members
from scepsy_profile.profiling.server import port_in_use
from scepsy_serve.launch.host import LaunchError, apply, running, stop
from scepsy_serve.launch.launchplan import LaunchPlan
from scepsy_serve.launch.renderers import write_rendered
from scepsy_serve.launch.shell import SHELL
from scepsy_serve.loop.bench_loop import free_port_range

FAKE_SERVER = r'''
import json, os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]
port = int(argv[len(argv) - 1 - argv[::-1].index("--port") + 1])
host = argv[len(argv) - 1 - argv[::-1].index("--host") + 1] if "--host" in argv else "0.0.0.0"
record_dir = os.environ.get("FAKE_RECORD_DIR")
if "--fake-ignore-term" in argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if record_dir:
    rec = {"argv": argv, "env": dict(os.environ), "pid": os.getpid(), "pgid": os.getpgid(0),
           "sid": os.getsid(0), "child": child.pid, "cwd": os.getcwd()}
    tmp = os.path.join(record_dir, f".{port}.tmp")
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, os.path.join(record_dir, f"{port}.json"))
if "--fake-exit" in argv:
    child.kill()
    sys.exit(3)
healthy = "--fake-never-healthy" not in argv


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = healthy and self.path == "/health"
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


print(f"fake server on port {port}", flush=True)
ThreadingHTTPServer((host, port), Handler).serve_forever()
'''


def fake_command(tmp_path: Path) -> tuple[str, ...]:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    return (sys.executable, str(script))


def free_base(n: int = 2) -> int:
    """A port ``p`` with ``p .. p+n-1`` free, outside the ephemeral ports (which a health
    check's outgoing connection may take before the server binds)."""
    return free_port_range(n)


def fake_plan(tmp_path: Path, *, generator_args: tuple[str, ...] = (),
              n_ports: int = 2) -> LaunchPlan:
    """cpu_plan() with the fake server as the engine, recording into tmp_path/records."""
    records = tmp_path / "records"
    records.mkdir(exist_ok=True)
    plan = cpu_plan(command=fake_command(tmp_path), base_port=free_base(n_ports))
    engine = replace(plan.engine, env={"FAKE_RECORD_DIR": str(records)}, health_timeout_s=30)
    models = dict(plan.models)
    models["generator"] = replace(models["generator"], args=generator_args)
    return replace(plan, engine=engine, models=models)


def rendered(plan: LaunchPlan, tmp_path: Path, name: str = "launch") -> Path:
    return write_rendered(SHELL.render(plan), tmp_path / name, "shell")


def records(tmp_path: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text())
            for p in (tmp_path / "records").glob("*.json")}


def assert_nothing_left(plan: LaunchPlan, pids: list[int], folder: Path) -> None:
    for pid in pids:
        assert not group_members(pid), f"process group {pid} still has {group_members(pid)}"
    for r in plan.replicas:
        assert not port_in_use(r.port), r.port
    assert not list((folder / "run" / "pids").glob("*.pid"))


def test_apply_starts_every_server_healthy_and_stop_leaves_nothing(tmp_path):
    plan = fake_plan(tmp_path)
    folder = rendered(plan, tmp_path)
    run = apply(folder)
    try:
        assert run.node == "host"
        assert {s.name for s in run.servers} == {"generator-0", "rewriter-0"}
        recs = records(tmp_path)
        for s in run.servers:
            assert port_in_use(s.port)
            rec = recs[s.port]
            assert rec["pid"] == s.pid == rec["pgid"] == rec["sid"]  # its own session/group
            assert rec["child"] in group_members(s.pid)
            assert s.url == f"http://127.0.0.1:{s.port}/v1"
            assert s.log.is_file()
            env = rec["env"]
            replica = next(r for r in plan.replicas if r.name == s.name)
            assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(replica.gpus[0])
            assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # floor(4·1 − 0.02 − 1)
            assert Path(env["VLLM_CACHE_ROOT"]) == run.run_dir / "vllm-cache"
            assert Path(env["TMPDIR"]).is_dir()
            assert "CUDA_VISIBLE_DEVICES" not in env or env["CUDA_VISIBLE_DEVICES"] == \
                os.environ.get("CUDA_VISIBLE_DEVICES")
            assert rec["argv"][:1] == ["/models/tiny"]
            assert rec["argv"][-8:] == ["--served-model-name", replica.llm,
                                        "--tensor-parallel-size", "1", "--host", "127.0.0.1",
                                        "--port", str(s.port)]
        pids = [s.pid for s in run.servers] + [r["child"] for r in recs.values()]
    finally:
        report = stop(folder, grace_s=5)
    assert report.ok and set(report.stopped) == {"generator-0", "rewriter-0"}
    assert "SIGKILL" not in report.output  # SIGTERM to the group ended every process
    assert_nothing_left(plan, pids, folder)
    again = stop(folder)
    assert again.ok and again.stopped == ()


def _accepts(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


@pytest.mark.parametrize("address", ["127.0.0.2", "0.0.0.0"])
def test_servers_listen_on_the_planned_address_only(tmp_path, address):
    """Each server binds the node's address in the plan (127.0.0.2: another loopback address,
    so that 127.0.0.1 must refuse); start.sh checks ports and /health there, and apply's URLs
    point there. Every interface only where the plan says 0.0.0.0."""
    plan = fake_plan(tmp_path)
    plan = replace(plan, addresses={"host": address})
    folder = rendered(plan, tmp_path)
    run = apply(folder)
    try:
        probe = "127.0.0.1" if address == "0.0.0.0" else address
        for s in run.servers:
            assert s.url == f"http://{probe}:{s.port}/v1"
            assert _accepts(address if address != "0.0.0.0" else "127.0.0.1", s.port)
            assert _accepts("127.0.0.1", s.port) == (address == "0.0.0.0")
            assert records(tmp_path)[s.port]["argv"][-4:] == ["--host", address, "--port",
                                                              str(s.port)]
    finally:
        assert stop(folder, grace_s=5).ok


def test_start_all_and_stop_all_run_a_local_node_without_python(tmp_path):
    plan = fake_plan(tmp_path)
    folder = rendered(plan, tmp_path)
    env = {**os.environ, "SCEPSY_SSH": "false"}  # a local node must not need ssh
    started = subprocess.run(["bash", str(folder / "start-all.sh")], capture_output=True,
                             text=True, env=env, timeout=120, check=False)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "all 2 server(s) healthy" in started.stdout
        pids = [int(p.read_text()) for p in (folder / "run" / "pids").glob("*.pid")]
        assert len(pids) == 2 and all(group_members(p) for p in pids)
    finally:
        stopped = subprocess.run(["bash", str(folder / "stop-all.sh")], capture_output=True,
                                 text=True, env=env, timeout=120, check=False)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert_nothing_left(plan, pids + [r["child"] for r in records(tmp_path).values()], folder)


def test_a_server_that_never_becomes_healthy_fails_the_start_and_stops_the_others(tmp_path):
    plan = fake_plan(tmp_path, generator_args=("--fake-never-healthy",))
    folder = rendered(plan, tmp_path)
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="not healthy after 2 s: generator-0"):
        apply(folder, timeout_s=2)
    assert time.monotonic() - t0 < 20
    recs = records(tmp_path)
    assert len(recs) == 2  # both had started
    pids = [r["pid"] for r in recs.values()] + [r["child"] for r in recs.values()]
    assert_nothing_left(plan, pids, folder)


def test_a_server_that_exits_fails_the_start_with_its_log(tmp_path):
    plan = fake_plan(tmp_path, generator_args=("--fake-exit",))
    folder = rendered(plan, tmp_path)
    with pytest.raises(LaunchError) as info:
        apply(folder)
    assert "generator-0 exited before /health answered" in str(info.value)
    assert "last lines of" in str(info.value)
    recs = records(tmp_path)
    pids = [r["pid"] for r in recs.values()] + [r["child"] for r in recs.values()]
    assert_nothing_left(plan, pids, folder)


def test_a_busy_port_is_refused_before_anything_starts(tmp_path):
    plan = fake_plan(tmp_path)
    folder = rendered(plan, tmp_path)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", plan.replicas[1].port))
        s.listen()
        with pytest.raises(LaunchError, match="is in use; nothing started"):
            apply(folder)
    assert records(tmp_path) == {}
    assert not (folder / "run" / "pids").exists() or \
        not list((folder / "run" / "pids").glob("*.pid"))


def test_a_second_apply_while_running_is_refused(tmp_path):
    plan = fake_plan(tmp_path)
    folder = rendered(plan, tmp_path)
    with running(folder) as run:
        with pytest.raises(LaunchError, match="already runs"):
            apply(folder)
        assert all(group_members(s.pid) for s in run.servers)  # the refusal stopped nothing
    assert_nothing_left(plan, [s.pid for s in run.servers], folder)


def test_keyboard_interrupt_inside_running_still_stops(tmp_path):
    plan = fake_plan(tmp_path)
    folder = rendered(plan, tmp_path)
    seen = []
    with pytest.raises(KeyboardInterrupt), running(folder) as run:
        seen = [s.pid for s in run.servers]
        raise KeyboardInterrupt
    assert len(seen) == 2
    assert_nothing_left(plan, seen + [r["child"] for r in records(tmp_path).values()], folder)


def test_keyboard_interrupt_during_the_start_stops_what_started(tmp_path):
    plan = fake_plan(tmp_path, generator_args=("--fake-never-healthy",))
    folder = rendered(plan, tmp_path)
    # to the main thread (a process-directed signal may land on the timer's thread and leave
    # the main one blocked), with Python's handler even where SIGINT was inherited ignored (a
    # shell's background job)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(3.0, signal.pthread_kill, (threading.main_thread().ident,
                                                       signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt), running(folder, timeout_s=60):
            pytest.fail("the start cannot succeed")
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, before)
    recs = records(tmp_path)
    assert len(recs) == 2
    pids = [r["pid"] for r in recs.values()] + [r["child"] for r in recs.values()]
    assert_nothing_left(plan, pids, folder)


def test_stop_escalates_to_sigkill_for_a_server_that_ignores_sigterm(tmp_path):
    plan = fake_plan(tmp_path, generator_args=("--fake-ignore-term",))
    folder = rendered(plan, tmp_path)
    run = apply(folder)
    t0 = time.monotonic()
    report = stop(folder, grace_s=1)
    assert report.ok, report
    assert "sending SIGKILL" in report.output
    assert time.monotonic() - t0 < 15
    assert_nothing_left(plan, [s.pid for s in run.servers], folder)


INJECTIONS = ("$(touch {t}/pwned)", "`touch {t}/pwned`", "'; touch {t}/pwned; '",
              '"; touch {t}/pwned; "', "a b; touch {t}/pwned", "; rm -rf {t}/victim",
              "$HOME ${{PATH}} * ? ~ \\ | & > <", "x\\'y", "--port=1 && touch {t}/pwned")
# (a control character, a newline say, is refused by the text rule: tests/scepsy_common/test_text_rules.py)


def test_hostile_values_reach_the_server_verbatim_and_run_nothing(tmp_path):
    (tmp_path / "victim").mkdir()
    values = tuple(v.format(t=tmp_path) for v in INJECTIONS)
    plan = fake_plan(tmp_path)
    models = dict(plan.models)
    models["generator"] = replace(models["generator"], serve=values[0], args=values[1:],
                                  env={f"HOSTILE_{i}": v for i, v in enumerate(values)})
    engine = replace(plan.engine, args=("--engine-arg", values[4]),
                     env={**plan.engine.env, "ENGINE_HOSTILE": values[2]})
    plan = replace(plan, models=models, engine=engine)
    folder = rendered(plan, tmp_path)
    with running(folder) as run:
        gen = next(s for s in run.servers if s.llm == "generator")
        rec = records(tmp_path)[gen.port]
    assert rec["argv"][0] == values[0]
    assert rec["argv"][1:3] == ["--engine-arg", values[4]]
    assert rec["argv"][3:3 + len(values) - 1] == list(values[1:])
    for i, v in enumerate(values):
        assert rec["env"][f"HOSTILE_{i}"] == v
    assert rec["env"]["ENGINE_HOSTILE"] == values[2]
    assert not (tmp_path / "pwned").exists()
    assert (tmp_path / "victim").is_dir()


def test_apply_refuses_a_folder_that_is_not_a_shell_render(tmp_path):
    with pytest.raises(InputError, match="scepsy launch --target shell"):
        apply(tmp_path)
    other = write_rendered({"a.yaml": "x: 1\n"}, tmp_path / "k8s", "k8s")
    with pytest.raises(InputError, match="a k8s folder"):
        stop(other)


def test_apply_needs_the_node_where_the_plan_has_several(tmp_path):
    folder = rendered(gpu_plan(), tmp_path)
    with pytest.raises(InputError, match="node-a, node-b"):
        apply(folder)
    with pytest.raises(InputError, match="--node"):
        apply(folder, node="node-z")
    assert stop(folder).ok  # nothing ran: stop is a no-op


def test_cli_launch_apply_and_stop(tmp_path, monkeypatch, capsys):
    from scepsy.cli import launch as cli_launch
    from scepsy.cli.util import UsageError
    from scepsy_serve.launch import planfile

    plan = fake_plan(tmp_path)
    monkeypatch.setattr(planfile, "load_plan", lambda path: plan)
    parser = argparse.ArgumentParser()
    cli_launch.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "cli-launch"
    args = parser.parse_args(["launch", "plan.json", "--target", "shell", "--out", str(out),
                              "--apply", "--json"])
    try:
        assert args.func(args) == 0
        report = json.loads(capsys.readouterr().out)
        assert {f["file"] for f in report["files"]} >= {"host/start.sh", "routes.json"}
        assert [s["server"] for s in report["servers"]] == ["generator-0", "rewriter-0"]
        # rendering over a folder whose servers run would lose their pid files: refused
        again = parser.parse_args(["launch", "plan.json", "--target", "routes", "--out",
                                   str(out)])
        with pytest.raises(UsageError, match="still run"):
            again.func(again)
        assert len(list((out / "run" / "pids").glob("*.pid"))) == 2
    finally:
        stop_args = parser.parse_args(["stop", str(out)])
        code = stop_args.func(stop_args)
    assert code == 0
    assert "nothing left running" in capsys.readouterr().out
    for r in plan.replicas:
        assert not port_in_use(r.port)


@pytest.mark.vllm
def test_real_vllm_serve_through_start_and_stop(tmp_path):
    """One real ``vllm serve`` (vllm-cpu, a random-weight model) started by start.sh: healthy,
    answers a completion, and stop.sh leaves no process of its group and a free port."""
    import httpx

    from scepsy_profile.profiling.backend import BackendUnavailable
    from scepsy_profile.profiling.engine_env import vllm_python, write_model_dir
    from scepsy_profile.profiling.models import engine_model

    try:
        python = vllm_python().path
    except BackendUnavailable as exc:
        pytest.skip(f"no vLLM environment: {exc}")
    model_dir = write_model_dir(engine_model("llama-3-8b", 1 / 16), tmp_path / "model")
    plan = one_real_vllm_replica(str(model_dir), str(python), free_base(1))
    folder = rendered(plan, tmp_path)
    with running(folder, timeout_s=600) as run:
        (server,) = run.servers
        members = group_members(server.pid)
        environ = dict(kv.split("=", 1) for kv in Path(f"/proc/{server.pid}/environ")
                       .read_bytes().decode().split("\0") if "=" in kv)
        answer = httpx.post(f"{server.url}/completions", timeout=120, json={
            "model": "rewriter", "prompt": [1, 2, 3, 4], "max_tokens": 4,
            "return_token_ids": True})
        time.sleep(0.2)
        idle_cpu_s = _cpu_seconds(members, 1.0)
        confined = {m: _allowed_cores(m) for m in members}
    assert answer.status_code == 200, answer.text
    assert len(members) >= 2  # the API server and its engine core, one group
    # one process engine on its cores: no worker process polling its queue after the call
    # (it took its core for a second after every message, docs/launch.md "CPU servers")
    assert environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert set(confined.values()) == {"0"}, confined
    assert idle_cpu_s < 0.3, f"the idle server used {idle_cpu_s:.2f} CPU-s in 1 s"
    assert environ["VLLM_CPU_KVCACHE_SPACE"] == "1"  # floor(2 − 0.02 − 1) = 0, at least 1
    assert environ["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert len(environ["TMPDIR"]) + 60 <= 107  # room for vLLM's socket names
    assert_nothing_left(plan, members, folder)
    tmp = Path(environ["TMPDIR"])
    assert tmp.is_relative_to(folder) or not tmp.exists()  # a /tmp fallback is removed


def _allowed_cores(pid: int) -> str:
    """Every thread's Cpus_allowed_list of process ``pid``, joined when they differ."""
    lists = set()
    for t in Path(f"/proc/{pid}/task").iterdir():
        for line in (t / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                lists.add(line.split()[1])
    return ",".join(sorted(lists))


def _cpu_seconds(pids, window_s: float) -> float:
    """CPU seconds the processes ``pids`` used over the next ``window_s`` seconds."""
    def ticks() -> int:
        total = 0
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total
    before = ticks()
    time.sleep(window_s)
    return (ticks() - before) / os.sysconf("SC_CLK_TCK")


def test_port_ranges_lie_outside_the_ephemeral_ports():
    """Outgoing connections take their source ports from the ephemeral range, so a server port
    picked there can be taken before the server binds it (seen: a health check's connection on
    the second server's port)."""
    from scepsy_serve.loop.bench_loop import ephemeral_ports, port_free

    lo, hi = ephemeral_ports()
    for n in (1, 2, 8):
        base = free_port_range(n)
        assert base >= 10_000 and (base + n - 1 < lo or base > hi), (base, n, lo, hi)
        assert all(port_free(base + i) for i in range(n))


def test_an_llm_name_with_a_slash_starts_and_stops_with_its_files_in_their_folders(tmp_path):
    """A name like ``org/model`` (a valid name) becomes the server name ``org%2Fmodel-0``: its
    log and pid files are single files in run/logs and run/pids, not a missing sub-folder."""
    plan = fake_plan(tmp_path)
    gen = plan.models["generator"]
    models = {"rewriter": plan.models["rewriter"], "org/gen": replace(gen, llm="org/gen")}
    reps = tuple(replace(r, llm="org/gen") if r.llm == "generator" else r for r in plan.replicas)
    plan = replace(plan, models=models, replicas=reps,
                   workflows={"rag": ("org/gen", "rewriter")})
    folder = rendered(plan, tmp_path)
    run = apply(folder)
    try:
        assert {s.name for s in run.servers} == {"org%2Fgen-0", "rewriter-0"}
        logs = folder / "run" / "logs"
        assert (logs / "org%2Fgen-0.log").is_file() and not (logs / "org").exists()
        pids = [s.pid for s in run.servers]
    finally:
        report = stop(folder, grace_s=5)
    assert report.ok and set(report.stopped) == {"org%2Fgen-0", "rewriter-0"}
    assert_nothing_left(plan, pids, folder)


def _unrelated_group() -> subprocess.Popen:
    """A process group that scepsy did not start: ``sleep`` in its own session."""
    return subprocess.Popen(["sleep", "600"], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


@pytest.mark.parametrize("how", ["stop", "stop.sh"])
def test_a_stale_pid_file_never_signals_an_unrelated_process_group(tmp_path, how):
    """The red team's case: after a reboot or pid reuse, run/pids/NAME.pid names a process
    group that is not the server. stop (and stop.sh) must leave it alone, say so, and drop
    the pid file."""
    plan = fake_plan(tmp_path)
    folder = rendered(plan, tmp_path)
    (folder / "run" / "pids").mkdir(parents=True)
    other = _unrelated_group()
    try:
        pid_file = folder / "run" / "pids" / "generator-0.pid"
        pid_file.write_text(f"{other.pid}\n")
        if how == "stop":
            report = stop(folder, grace_s=1)
            assert report.ok and report.stopped == ()
            assert report.stale == (("generator-0", other.pid),)
            said = report.output
        else:
            done = subprocess.run(["bash", str(folder / "host" / "stop.sh")],
                                  capture_output=True, text=True, timeout=60, check=False,
                                  env={**os.environ, "SCEPSY_STOP_GRACE_S": "1"})
            assert done.returncode == 0, done.stdout + done.stderr
            said = done.stderr
        assert f"stale pid file, process group {other.pid} is not generator-0: not signalled" \
            in said, said
        time.sleep(0.2)
        assert other.poll() is None, "the unrelated process group was signalled"
        assert not pid_file.exists()
    finally:
        other.kill()
        other.wait()


def test_a_stale_pid_file_does_not_block_a_start(tmp_path):
    """start.sh refuses to start a server that already runs, not one whose pid file names
    an unrelated group: it starts, and stop then stops it (its marker is there)."""
    plan = fake_plan(tmp_path)
    folder = rendered(plan, tmp_path)
    (folder / "run" / "pids").mkdir(parents=True)
    other = _unrelated_group()
    try:
        (folder / "run" / "pids" / "generator-0.pid").write_text(f"{other.pid}\n")
        run = apply(folder)
        try:
            assert {s.name for s in run.servers} == {"generator-0", "rewriter-0"}
            assert other.pid not in [s.pid for s in run.servers]
        finally:
            report = stop(folder, grace_s=5)
        assert report.ok and set(report.stopped) == {"generator-0", "rewriter-0"}
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
