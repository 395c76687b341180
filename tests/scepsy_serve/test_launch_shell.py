"""The shell renderer (:mod:`scepsy_serve.launch.shell`): golden renders of the two fake plans
(``SCEPSY_UPDATE_GOLDEN=1`` rewrites them), shellcheck and ``bash -n`` on every script, the
round trip plan → render → parse, the launch rules (memory, MPS, CPU binding and KV cache),
quoting checked by bash itself, and the GPU scripts run with stub commands in place of
``setsid``, ``curl`` and ``nvidia-cuda-mps-control`` (what each server and the MPS daemon would
receive, with no GPU)."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fakes.launch_plans import cpu_plan, gpu_plan
from scepsy_common.errors import InputError
from scepsy_profile.profiling.server import port_in_use
from scepsy_serve.launch.launchplan import (
    DeviceLaunch,
    EngineLaunch,
    LaunchPlan,
    ModelLaunch,
    ReplicaLaunch,
    assign_ports,
    url_host,
)
from scepsy_serve.launch.renderers import get_renderer, write_rendered
from scepsy_serve.launch.routes import parse_routes
from scepsy_serve.launch.shell import (
    SHELL,
    _replica_env,
    cpu_kv_cache_gib,
    gpu_memory_utilization,
    mps_memory_limit,
    node_folder,
    replica_command,
    replica_env,
    replica_records,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "launch" / "shell"
PLANS = {"gpu": gpu_plan, "cpu": cpu_plan}
RUNTIME = {"mps_pipe": "/MPS", "engine_tmp": "/TMP", "run_dir": "/RUN"}


def _scripts(files):
    return sorted(p for p in files if p.endswith(".sh"))


@pytest.mark.parametrize("name", sorted(PLANS))
def test_golden_render(name):
    files = SHELL.render(PLANS[name]())
    folder = GOLDEN / name
    if os.environ.get("SCEPSY_UPDATE_GOLDEN") == "1":
        shutil.rmtree(folder, ignore_errors=True)
        for rel, text in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
    stored = {p.relative_to(folder).as_posix(): p.read_text()
              for p in sorted(folder.rglob("*")) if p.is_file()}
    assert sorted(stored) == sorted(files)
    for rel, text in files.items():
        assert text == stored[rel], f"{name}/{rel} differs from the golden file"


def test_render_is_registered_and_deterministic():
    assert get_renderer("shell") is SHELL
    assert SHELL.render(gpu_plan()) == SHELL.render(gpu_plan())
    assert sorted(SHELL.render(gpu_plan())) == [
        "node-a/start.sh", "node-a/stop.sh", "node-b/start.sh", "node-b/stop.sh",
        "routes.json", "start-all.sh", "stop-all.sh"]


@pytest.mark.parametrize("name", [*sorted(PLANS), "hostile", "odd-nodes"])
def test_every_script_is_shellcheck_clean(name, tmp_path):
    if name == "hostile":
        plan = _hostile_plan(tmp_path)
    elif name == "odd-nodes":
        plan = gpu_plan()
        rename = {"node-a": "rack/1:a+b", "node-b": "run"}
        plan = replace(plan, nodes={rename[n]: d for n, d in plan.nodes.items()},
                       addresses={"rack/1:a+b": "host-1.example"},
                       replicas=tuple(replace(r, node=rename[r.node]) for r in plan.replicas))
    else:
        plan = PLANS[name]()
    files = SHELL.render(plan)
    folder = write_rendered(files, tmp_path / name, "shell")
    paths = [str(folder / p) for p in _scripts(files)]
    assert len(paths) >= 4
    done = subprocess.run(["shellcheck", "--severity=style", *paths], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    for p in paths:
        syntax = subprocess.run(["bash", "-n", p], capture_output=True, text=True, check=False)
        assert syntax.returncode == 0, syntax.stderr
        assert Path(p).read_text().startswith("#!/usr/bin/env bash\n")
        assert "set -euo pipefail" in Path(p).read_text()


@pytest.mark.parametrize("name", sorted(PLANS))
def test_round_trip_and_routes(name):
    plan = PLANS[name]()
    files = SHELL.render(plan)
    assert SHELL.parse(files) == plan.assignments()
    routes = parse_routes(json.loads(files["routes.json"]), "routes.json")
    for w, llms in plan.workflows.items():
        for m in llms:
            ports = sorted(e.url.rsplit(":", 1)[1] for e in routes.endpoints(w, m))
            assert ports == sorted(f"{r.port}/v1" for r in plan.replicas_of(m))


def _edit(files, old, new):
    out = dict(files)
    path = next(p for p, t in files.items() if p.endswith("start.sh") and old in t)
    out[path] = files[path].replace(old, new, 1)
    return out


@pytest.mark.parametrize(("old", "new", "field"), [
    ("'CUDA_VISIBLE_DEVICES=0,1'", "'CUDA_VISIBLE_DEVICES=0,2'", "CUDA_VISIBLE_DEVICES"),
    ("--tensor-parallel-size 2", "--tensor-parallel-size 1", "--tensor-parallel-size"),
    ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70",
     "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
    ("--port 8000", "--port 9000", "--port"),
    ('start_server gen-0 "${cmd[@]}"', 'start_server gen-1 "${cmd[@]}"', "start_server"),
])
def test_parse_refuses_an_edited_script(old, new, field):
    files = SHELL.render(gpu_plan())
    with pytest.raises(InputError, match=field):
        SHELL.parse(_edit(files, old, new))


@pytest.mark.parametrize(("old", "new", "field"), [
    ("taskset -c 1 vllm serve", "vllm serve", "command"),  # the server left unpinned
    ("taskset -c 1 vllm serve", "taskset -c 0-1 vllm serve", "command"),
    ("VLLM_ENABLE_V1_MULTIPROCESSING=0", "VLLM_ENABLE_V1_MULTIPROCESSING=1",
     "VLLM_ENABLE_V1_MULTIPROCESSING"),
])
def test_parse_refuses_a_cpu_server_off_its_cores(old, new, field):
    files = SHELL.render(cpu_plan())
    assert SHELL.parse(files) == cpu_plan().assignments()
    with pytest.raises(InputError, match=field):
        SHELL.parse(_edit(files, old, new))


def test_parse_refuses_files_without_replicas():
    with pytest.raises(InputError, match="no replica"):
        SHELL.parse({"routes.json": "{}"})


# -- the rules ------------------------------------------------------------------------------------

@given(st.floats(0.01, 640), st.sampled_from([16.0, 24.0, 40.0, 80.0, 141.0]))
@example(80.0625, 80.0)  # under one rounding step above the device: still refused
def test_gpu_memory_utilization_never_exceeds_the_plan(memory, device):
    if memory / device < 0.001 or memory / device > 1 + 1e-9:  # the rule's tolerance
        with pytest.raises(InputError):
            gpu_memory_utilization(memory, device)
        return
    u = gpu_memory_utilization(memory, device)
    assert u * device <= memory + 1e-9  # never above the plan
    assert memory - u * device < 0.001 * device + 1e-9  # within one rounding step
    assert round(u, 3) == u


def test_mps_values():
    assert mps_memory_limit(40.0, 2) == "0=40G,1=40G"
    assert mps_memory_limit(23.8, 1) == f"0={math.floor(23.8 * 1024)}MB"
    env = replica_env(gpu_plan(), gpu_plan().replicas_of("small")[0])
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=24G"
    big = replica_env(gpu_plan(), gpu_plan().replicas_of("big")[0])
    assert big["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert not any(k.startswith("CUDA_MPS") for k in big)  # a whole GPU: no MPS limits
    assert big["VLLM_ATTENTION_BACKEND"] == "FLASH_ATTN"  # the model's env


def test_cpu_rules():
    assert cpu_kv_cache_gib(4.0, 1, 0.02) == 2
    assert cpu_kv_cache_gib(1.0, 1, 0.5) == 1  # clamped at 1
    assert cpu_kv_cache_gib(8.0, 2, 3.0) == 12
    plan = cpu_plan()
    env = replica_env(plan, plan.replicas_of("rewriter")[0])
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert not any(k.startswith("CUDA") for k in env)
    argv = replica_command(plan, plan.replicas_of("rewriter")[0])
    assert "--gpu-memory-utilization" not in argv


def test_python_module_command_puts_the_model_after_model_flag():
    cmd = ("python", "-m", "vllm.entrypoints.openai.api_server", "--model")
    plan = cpu_plan(command=cmd)
    argv = replica_command(plan, plan.replicas[0])
    assert argv[:5] == (*cmd, "/models/tiny")
    assert SHELL.parse(SHELL.render(plan)) == plan.assignments()


@pytest.mark.parametrize("bad", ["1X", "A-B", "A B", "A;B", "$(x)", "A=B", "", "Ä"])
def test_env_names_are_checked(bad):
    plan = gpu_plan()
    models = dict(plan.models)
    models["big"] = replace(models["big"], env={bad: "1"})
    with pytest.raises(InputError, match="environment variable name"):
        SHELL.render(replace(plan, models=models))
    with pytest.raises(InputError, match="environment variable name"):
        SHELL.render(replace(plan, engine=replace(plan.engine, env={bad: "1"})))


def test_nul_characters_and_odd_commands_are_refused():
    plan = cpu_plan()
    with pytest.raises(InputError, match="NUL"):
        SHELL.render(replace(plan, engine=replace(plan.engine, args=("a\x00b",))))
    for command in ((), ("A=1", "vllm"), ("--x",)):
        with pytest.raises(InputError, match=r"engine\.command"):
            SHELL.render(replace(plan, engine=replace(plan.engine, command=command)))


def test_node_folders_never_collide_or_nest():
    names = ["a/b", "a%2Fb", "run", "routes.json", "start-all.sh", "n:1+x", "a/../b"]
    folders = [node_folder(n) for n in names if "%" not in n]
    assert len(set(folders)) == len(folders)
    assert all("/" not in f and f not in ("run", "routes.json", "start-all.sh") for f in folders)


def test_odd_node_names_render_and_parse():
    """Node names that are no host names need an address (servers are reached there); with
    one they render into their own folders and parse back."""
    plan = cpu_plan()
    for node in ("a/../b", "run", "n:1+x", "a:"):
        reps = tuple(replace(r, node=node) for r in plan.replicas)
        odd = replace(plan, nodes={node: "cpu"}, addresses={node: "10.0.0.1"}, replicas=reps)
        files = SHELL.render(odd)
        assert f"{node_folder(node)}/start.sh" in files
        assert SHELL.parse(files) == odd.assignments()
        if node != "run":
            with pytest.raises(InputError, match=re.escape(f"launch.addresses.{node}")):
                SHELL.render(replace(odd, addresses={}))


# -- quoting, checked by bash ---------------------------------------------------------------------

# (control characters are refused by the text rule: tests/scepsy_common/test_text_rules.py)
HOSTILE = ("$(touch {t}/pwned)", "`touch {t}/pwned`", "it's \"quoted\"", "a\\nb )\\n c",
           "; rm -rf {t}/victim", "${{HOME}} * ~ \\ | & < >", "x\\ty", "'", '"', "#c", "=",
           "a,b", "-")


def _free_base(n: int = 3) -> int:
    """A port ``p`` with ``p .. p+n-1`` free now (start.sh refuses a busy one)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + n < 65536 and not any(port_in_use(base + i) for i in range(n)):
            return base
    raise RuntimeError("no free ports")


def _hostile_plan(t: Path, base_port: int = 8000) -> LaunchPlan:
    values = tuple(v.format(t=t) for v in HOSTILE)
    plan = gpu_plan(base_port)
    models = dict(plan.models)
    models["gen"] = replace(models["gen"], serve=values[0], args=values[1:],
                            env={f"V{i}": v for i, v in enumerate(values)})
    return replace(plan, models=models,
                   engine=replace(plan.engine, command=("my engine", "--flag=$(x)"),
                                  args=(values[3],),
                                  # names start.sh also sets: a plan value stays text
                                  env={"E": values[4], "TMPDIR": values[0],
                                       "CUDA_MPS_PIPE_DIRECTORY": values[1]}))


def _expected_words(plan: LaunchPlan, r: ReplicaLaunch,
                    runtime: dict[str, str] = RUNTIME) -> list[str]:
    """``env``, the variables (start.sh's folders filled in), the command."""
    env, filled = _replica_env(plan, r)
    words = ["env"]
    for k, v in env.items():
        if k in filled:
            for var, value in runtime.items():
                v = v.replace(f"${var}", value)
        words.append(f"{k}={v}")
    return words + list(replica_command(plan, r))


def test_bash_reads_every_array_as_the_argv_rendered(tmp_path):
    """Each replica's ``cmd=( ... )`` evaluated by bash gives exactly the rendered words."""
    (tmp_path / "victim").mkdir()
    plan = _hostile_plan(tmp_path)
    files = SHELL.render(plan)
    for rec in replica_records(files):
        text = files[f"{node_folder(rec.node)}/start.sh"]
        tag = text.index(f'"llm": "{rec.llm}", ')
        tag = text.index(f'"port": {rec.port}, "replica": {rec.replica}, ', tag)
        block = text[text.index("\ncmd=(", tag) + 1:text.index("\nstart_server ", tag)]
        prog = "".join(f"{k}={v}\n" for k, v in RUNTIME.items()) + block + \
            "\nprintf '%s\\0' \"${cmd[@]}\"\n"
        out = subprocess.run(["bash", "-c", prog], capture_output=True, check=True).stdout
        r = next(x for x in plan.replicas if x.name == rec.name)
        assert out.decode().split("\0")[:-1] == _expected_words(plan, r)
        assert list(rec.argv) == list(replica_command(plan, r))  # the parser reads the same
    assert not (tmp_path / "pwned").exists()
    assert (tmp_path / "victim").is_dir()


# -- the GPU scripts, run with stub commands ------------------------------------------------------

STUB_SETSID = """#!/usr/bin/env bash
printf '%s\\0' "$@" >"$STUB_REC/server-$BASHPID"
"""
STUB_MPS = """#!/usr/bin/env bash
{
  printf 'ARGS=%s\\0' "$*"
  printf 'PIPE=%s\\0' "${CUDA_MPS_PIPE_DIRECTORY:-}"
  printf 'LOG=%s\\0' "${CUDA_MPS_LOG_DIRECTORY:-}"
  printf 'CVD=%s\\0' "${CUDA_VISIBLE_DEVICES-unset}"
  if [[ ${1:-} != -d ]]; then printf 'STDIN=%s\\0' "$(cat)"; fi
} >"$STUB_REC/mps-$BASHPID"
"""


def _stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("setsid", STUB_SETSID), ("nvidia-cuda-mps-control", STUB_MPS),
                       ("curl", "#!/usr/bin/env bash\nexit 0\n")):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    rec = tmp_path / "rec"
    rec.mkdir()
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_REC": str(rec),
            "CUDA_VISIBLE_DEVICES": "7", "CUDA_MPS_PIPE_DIRECTORY": "/theirs"}


def _records(tmp_path: Path, prefix: str) -> list[list[str]]:
    return [p.read_bytes().decode().split("\0")[:-1]
            for p in sorted((tmp_path / "rec").glob(prefix + "*"))]


def _run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def _mps_is_running() -> bool:
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().startswith("nvidia-cuda-mps"):
                return True
        except OSError:
            continue
    return False


@pytest.mark.skipif(_mps_is_running(), reason="an MPS daemon runs on this machine")
@pytest.mark.parametrize("short_run_dir", [False, True], ids=["run-beside", "SCEPSY_RUN_DIR"])
def test_gpu_start_runs_mps_and_every_server_as_rendered(tmp_path, short_run_dir):
    plan = _hostile_plan(tmp_path, _free_base())
    folder = write_rendered(SHELL.render(plan), tmp_path / "launch", "shell")
    env = _stubs(tmp_path)
    run_dir = (folder / "run").resolve()
    if short_run_dir:  # a path short enough for the MPS sockets
        run_dir = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
        env["SCEPSY_RUN_DIR"] = str(run_dir)
    try:
        _check_gpu_start_and_stop(tmp_path, plan, folder, env, run_dir)
        assert (folder / "run").exists() != short_run_dir
    finally:
        if short_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def _check_gpu_start_and_stop(tmp_path: Path, plan: LaunchPlan, folder: Path,
                              env: dict[str, str], run_dir: Path) -> None:
    started = _run(folder / "node-a" / "start.sh", env)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "started an MPS control daemon" in started.stdout
    (mps,) = _records(tmp_path, "mps")
    pipe = str(run_dir / "mps" / "node-a" / "pipe")
    if len(pipe) + 60 > 107:  # no room for socket names there: a short folder under /tmp
        assert mps[1].startswith("PIPE=/tmp/scepsy-")
        pipe = mps[1][len("PIPE="):]
        assert Path(pipe).is_dir()
    # the daemon sees every GPU by its own index (no CUDA_VISIBLE_DEVICES), our folders
    assert mps == ["ARGS=-d", f"PIPE={pipe}", f"LOG={run_dir / 'mps' / 'node-a' / 'log'}",
                   "CVD=unset"]
    servers = _records(tmp_path, "server")
    deadline = time.monotonic() + 20  # the stub servers run in the background: wait for them
    while len(servers) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        servers = _records(tmp_path, "server")
    assert len(servers) == 3
    for r in plan.replicas_on("node-a"):
        want = _expected_words(plan, r, {**RUNTIME, "mps_pipe": pipe})
        assert want in servers, r.name
    assert not (tmp_path / "pwned").exists()

    stopped = _run(folder / "node-a" / "stop.sh", env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    quit_rec = [m for m in _records(tmp_path, "mps") if m != mps]
    assert quit_rec == [["ARGS=", f"PIPE={pipe}", "LOG=", "CVD=7", "STDIN=quit"]]
    assert not list((run_dir / "pids").glob("*.pid"))
    assert not pipe.startswith("/tmp/scepsy-") or not Path(pipe).exists()  # removed
    again = _run(folder / "node-a" / "stop.sh", env)  # nothing more to quit
    assert again.returncode == 0 and len(_records(tmp_path, "mps")) == 2


@pytest.mark.skipif(_mps_is_running(), reason="an MPS daemon runs on this machine")
def test_gpu_start_uses_an_mps_daemon_that_already_runs(tmp_path):
    fake = tmp_path / "nvidia-cuda-mps-control-fake"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    daemon = subprocess.Popen([str(fake), "60"])
    try:
        plan = gpu_plan(_free_base())
        folder = write_rendered(SHELL.render(plan), tmp_path / "launch", "shell")
        env = _stubs(tmp_path)
        started = _run(folder / "node-a" / "start.sh", env)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "already runs; using it (pipe directory /theirs)" in started.stdout
        assert _records(tmp_path, "mps") == []  # none started
        shared = [s for s in _records(tmp_path, "server") if any(
            w.startswith("CUDA_MPS_ACTIVE") for w in s)]
        assert shared and all("CUDA_MPS_PIPE_DIRECTORY=/theirs" in s for s in shared)
        stopped = _run(folder / "node-a" / "stop.sh", env)
        assert stopped.returncode == 0
        assert _records(tmp_path, "mps") == []  # not ours: not quit
    finally:
        daemon.kill()
        daemon.wait()


def test_whole_gpu_node_needs_no_mps(tmp_path):
    plan = gpu_plan()
    files = SHELL.render(plan)
    assert "nvidia-cuda-mps-control" in files["node-a/start.sh"]
    only_big = replace(plan, replicas=tuple(r for r in plan.replicas if r.llm == "big"),
                       workflows={"b": ("big",)})
    assert "nvidia-cuda-mps-control -d" not in SHELL.render(only_big)["node-b/start.sh"]


# -- a property: any plan parses back ------------------------------------------------------------

@st.composite
def plans(draw) -> LaunchPlan:
    kind = draw(st.sampled_from(["cuda", "cpu"]))
    device = DeviceLaunch("dev", kind, 80.0)
    nodes = draw(st.lists(st.from_regex(r"[a-z][a-z0-9/:+.-]{0,8}", fullmatch=True),
                          min_size=1, max_size=3, unique_by=node_folder))
    models, reps = {}, []
    for i in range(draw(st.integers(1, 3))):
        llm = f"m{i}"
        tp = draw(st.sampled_from([1, 2, 4]))
        share = draw(st.sampled_from([0.1, 0.25, 1 / 3, 0.5, 1.0]))
        n = draw(st.integers(1, 3))
        models[llm] = ModelLaunch(llm, "model", f"/models/{llm}", "dev", tp, share, n,
                                  40.0 * share, 1.0)
        for k in range(n):
            gpus = tuple(sorted(draw(st.sets(st.integers(0, 7), min_size=tp, max_size=tp))))
            reps.append(ReplicaLaunch(llm, k, draw(st.sampled_from(nodes)), gpus, share,
                                      40.0 * share, 0))
    used = sorted({r.node for r in reps})
    named = {n: f"10.0.0.{i + 1}" for i, n in enumerate(used) if url_host(n) is None}
    return LaunchPlan("c", 1, {"dev": device}, {n: "dev" for n in used}, named, models,
                      assign_ports(tuple(reps), 9000), {"w": tuple(sorted(models))},
                      EngineLaunch(base_port=9000))


@settings(max_examples=40, deadline=None)
@given(plans())
def test_any_plan_round_trips(plan):
    assert SHELL.parse(SHELL.render(plan)) == plan.assignments()


ADDRESSES = st.sampled_from(["127.0.0.1", "127.0.0.2", "10.0.0.7", "::1", "0.0.0.0",
                             "node.example"])


@settings(max_examples=40, deadline=None)
@given(plans(), st.data())
def test_every_server_listens_on_its_node_address(plan, data):
    """Each server's ``--host`` is its node's address in the plan (its name without one), and
    start.sh checks ports and /health there; every interface only where the plan says so."""
    addresses = {n: data.draw(ADDRESSES) for n in plan.nodes
                 if url_host(n) is None or data.draw(st.booleans())}
    plan = replace(plan, addresses=addresses)
    files = SHELL.render(plan)
    for r in replica_records(files):
        want = plan.address(r.node)
        assert r.host == want
        assert "0.0.0.0" not in r.argv or want == "0.0.0.0"
        probe = "127.0.0.1" if want == "0.0.0.0" else want
        assert r.url == f"http://{f'[{probe}]' if ':' in probe else probe}:{r.port}/v1"
        start = files[f"{node_folder(r.node)}/start.sh"]
        assert f"probe_host={shlex.quote(probe)}\n" in start \
            or f"probe_host='{probe}'\n" in start


def test_other_targets_bind_where_their_network_reaches():
    """k8s: a pod's server listens on the pod's interfaces (its Service reaches it there, not
    at the node's address); ray: the proxies on the plan's one address, or every interface
    where nodes differ (one ``http_options.host`` serves every node's proxy)."""
    from scepsy_serve.launch.k8s import server_argv
    from scepsy_serve.launch.ray import proxy_host

    plan = cpu_plan()
    for r in plan.replicas:
        argv = server_argv(plan, r)
        assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert proxy_host(plan) == "127.0.0.1"
    assert proxy_host(gpu_plan()) == "0.0.0.0"  # node-a at 10.0.0.1, node-b by its name
