"""The ``ray`` apply target (:mod:`scepsy_serve.control.ray_target`).

Without Ray: every replica gets its own Serve application name and route (escaped names, no two
alike), the application's ``LLMServingArgs`` hold that replica alone and ask for no CPU beyond
the engine's bundles, and the deploy function unpickles where scepsy cannot be imported.

With Ray and vLLM's CPU build (marker ``vllm``): a local ``ray start --head --num-cpus 2``
cluster runs one replica of a random-weight model as a Ray Serve LLM application, which answers a
completion through its URL, holds exactly its planned core, and is gone after ``stop``; an engine
argument vLLM does not know surfaces as :class:`RayTargetError` from ``healthy``."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fakes.launch_plans import cpu_plan, gpu_plan
from scepsy_serve.control.ray_target import (
    NAME,
    RayServeTarget,
    RayTargetError,
    _deploy_task,
    app_name,
    proxy_url,
    replica_args,
    replica_word,
    route_prefix,
    url_word,
)
from scepsy_serve.launch.launchplan import LaunchPlan, ReplicaLaunch

# ------------------------------------------------------------------------------- names, no Ray


def _unword(word: str) -> str:
    """The inverse of url_word."""
    out = bytearray()
    i = 0
    while i < len(word):
        if word[i] == "~":
            out.append(int(word[i + 1:i + 3], 16))
            i += 3
        else:
            out.extend(word[i].encode())
            i += 1
    return out.decode()


@given(st.text(max_size=30))
def test_url_word_is_a_plain_path_word_that_gives_the_text_back(text: str) -> None:
    word = url_word(text)
    assert re.fullmatch(r"[A-Za-z0-9._~-]*", word)
    assert _unword(word) == text  # so no two texts share a word


@given(st.text(max_size=8), st.integers(0, 200), st.text(max_size=8), st.integers(0, 200))
def test_no_two_replicas_share_a_word(a: str, i: int, b: str, j: int) -> None:
    r = ReplicaLaunch(a, i, "n", (0,), 1.0, 1.0, 0)
    s = ReplicaLaunch(b, j, "n", (0,), 1.0, 1.0, 0)
    assert (replica_word(r) == replica_word(s)) == ((a, i) == (b, j))


def test_url_word_escapes_the_escape_and_the_slash() -> None:
    assert url_word("a/b") == "a~2Fb" and url_word("a~2Fb") == "a~7E2Fb"
    assert url_word("Qwen/Qwen2.5-7B") == "Qwen~2FQwen2.5-7B"


def _renamed(plan: LaunchPlan, llm: str, new: str) -> LaunchPlan:
    models = {(new if m == llm else m): (replace(v, llm=new) if m == llm else v)
              for m, v in plan.models.items()}
    reps = tuple(replace(r, llm=new) if r.llm == llm else r for r in plan.replicas)
    flows = {w: tuple(sorted(new if m == llm else m for m in ms))
             for w, ms in plan.workflows.items()}
    return replace(plan, models=models, replicas=reps, workflows=flows)


def test_every_replica_has_its_own_application_and_route() -> None:
    plan = _renamed(gpu_plan(), "small", "org/small?x=1#y")
    names = {app_name(plan, r) for r in plan.replicas}
    prefixes = {route_prefix(plan, r) for r in plan.replicas}
    assert len(names) == len(prefixes) == len(plan.replicas) == 6
    for p in prefixes:
        assert p.count("/") == 3 and p.startswith("/scepsy/two-nodes/")
        assert re.fullmatch(r"[A-Za-z0-9/._~-]+", p), p
    small0 = next(r for r in plan.replicas if r.llm.startswith("org/") and r.replica == 0)
    assert route_prefix(plan, small0) == "/scepsy/two-nodes/org~2Fsmall~3Fx~3D1~23y-0"
    assert app_name(plan, small0) == "scepsy:two-nodes:org~2Fsmall~3Fx~3D1~23y-0"


def test_the_url_is_the_serve_proxy_of_the_first_node_plus_the_route() -> None:
    plan = cpu_plan(base_port=18123)
    r = plan.replicas[0]
    assert proxy_url(plan) == "http://127.0.0.1:18123"
    assert RayServeTarget().url(plan, r) == f"http://127.0.0.1:18123{route_prefix(plan, r)}/v1"
    gpu = gpu_plan()
    assert proxy_url(gpu) == "http://10.0.0.1:8000"  # node-a's address; node-b has none


def _cpus_asked(args: dict) -> float:
    """CPUs one replica's application asks Ray for: its engine's bundles plus Serve's actors
    (Ray Serve LLM's defaults: 1 for the replica actor, 1 for the ingress)."""
    (cfg,) = args["llm_configs"]
    bundles = sum(b.get("CPU", 0.0) for b in cfg["placement_group_config"]["bundles"])
    actor = cfg["deployment_config"].get("ray_actor_options", {}).get("num_cpus", 1)
    ingress = args.get("ingress_deployment_config", {}).get("ray_actor_options", {}) \
        .get("num_cpus", 1)
    return bundles + actor + ingress


@pytest.mark.parametrize("plan", [gpu_plan(), cpu_plan()], ids=["gpu", "cpu"])
def test_a_replica_application_holds_that_replica_alone(plan: LaunchPlan) -> None:
    for r in plan.replicas:
        args = replica_args(plan, r)
        (cfg,) = args["llm_configs"]
        assert cfg["model_loading_config"] == {"model_id": r.llm,
                                               "model_source": plan.models[r.llm].serve}
        assert cfg["deployment_config"]["num_replicas"] == 1
        assert cfg["engine_kwargs"]["tensor_parallel_size"] == r.tp
        kind = "GPU" if plan.device_of(r.node).kind == "cuda" else "CPU"
        assert cfg["placement_group_config"]["bundles"] == [{kind: r.share}] * r.tp
        # Serve's own actors ask for nothing: the replica holds exactly its planned share
        assert _cpus_asked(args) == pytest.approx(r.share * r.tp if kind == "CPU" else 0.0)


def test_replicas_of_one_llm_may_differ_in_shape() -> None:
    """Each application holds one replica, so an LLM whose replicas differ (which serve.yaml's
    one LLMConfig per LLM refuses) still deploys, each replica with its own bundles."""
    plan = gpu_plan()
    reps = tuple(replace(r, share=0.6) if (r.llm, r.replica) == ("small", 1) else r
                 for r in plan.replicas)
    plan = replace(plan, replicas=reps)
    got = {r.replica: replica_args(plan, r)["llm_configs"][0]["placement_group_config"]
           ["bundles"] for r in plan.replicas_of("small")}
    assert got == {0: [{"GPU": 0.3}], 1: [{"GPU": 0.6}], 2: [{"GPU": 0.3}]}


def test_the_target_has_the_apply_target_shape() -> None:
    target = RayServeTarget()
    assert target.name == NAME == "ray"
    for method in ("start", "healthy", "url", "stop"):
        params = list(inspect.signature(getattr(target, method)).parameters)
        assert params == ["plan", "replica"], (method, params)
        hints = inspect.get_annotations(getattr(RayServeTarget, method), eval_str=True)
        assert hints["plan"] is LaunchPlan and hints["replica"] is ReplicaLaunch


def test_the_deploy_function_unpickles_where_scepsy_cannot_be_imported(tmp_path: Path) -> None:
    """The cluster's workers have Ray Serve LLM, not scepsy: Ray pickles the deploy function by
    value, so loading it imports no scepsy module."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    path = tmp_path / "deploy.pkl"
    path.write_bytes(cloudpickle.dumps(_deploy_task()))
    code = ("import sys\n"
            "for m in ('scepsy', 'scepsy_place', 'scepsy_common', 'scepsy_profile', "
            "'scepsy_opt'):\n    sys.modules[m] = None\n"
            "import ray.cloudpickle as c\n"
            f"f = c.loads(open({str(path)!r}, 'rb').read())\n"
            "print(f.__name__, list(f.__code__.co_varnames[:4]))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["deploy", "['name',", "'prefix',", "'args',", "'http']"]


# -------------------------------------------------------------- a real Ray cluster and vLLM


def _ray_cli() -> Path:
    """The ``ray`` command of vLLM's environment (its workers import vLLM and Ray Serve LLM),
    or a skip when there is none."""
    pytest.importorskip("ray")
    from scepsy_profile.profiling.backend import BackendUnavailable
    from scepsy_profile.profiling.engine_env import vllm_python
    from scepsy_profile.profiling.vllm_install import imports_ray_llm

    try:
        py = vllm_python().path
    except BackendUnavailable as exc:
        pytest.skip(f"no vLLM environment: {exc}")
    if not imports_ray_llm(py):
        pytest.skip(f"{py} does not import ray.serve.llm (scepsy profile install-vllm adds it)")
    cli = py.parent / "ray"
    if not cli.is_file():
        pytest.skip(f"no ray command next to {py}")
    return cli


def _ports(n: int) -> list[int]:
    """``n`` distinct free ports of 20000-32767: below the OS's ephemeral ports and above the
    ports Ray gives its workers (10002-19999)."""
    from scepsy_profile.profiling.server import free_port

    out: list[int] = []
    while len(out) < n:
        p = free_port()
        if 20000 <= p < 32768 and p not in out:
            out.append(p)
    return out


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    """``ray start --head --num-cpus 2`` on free ports, its files in a short temporary folder;
    ``ray stop --force`` afterwards. Yields the cluster's address."""
    cli = _ray_cli()
    tmp = tempfile.mkdtemp(prefix="sr-", dir="/tmp")  # short: Ray's socket paths live here
    env = {**os.environ, "RAY_TMPDIR": tmp, "RAY_USAGE_STATS_ENABLED": "0"}
    port, client, agent = _ports(3)
    start = [str(cli), "start", "--head", "--num-cpus", "2", "--port", str(port),
             "--include-dashboard=false", "--ray-client-server-port", str(client),
             "--dashboard-agent-listen-port", str(agent), "--object-store-memory", "100000000",
             "--disable-usage-stats"]
    res = subprocess.run(start, env=env, capture_output=True, text=True, timeout=300,
                         check=False, cwd=tmp)
    try:
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(cli), "stop", "--force"], env=env, capture_output=True,
                       timeout=120, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def _tiny_plan(model_dir: Path, base_port: int, extra: tuple[str, ...] = ()) -> LaunchPlan:
    """cpu_plan()'s rewriter alone on one core, a random-weight model, KV cache 256 MiB."""
    plan = cpu_plan(base_port=base_port)
    rewriter = replace(plan.models["rewriter"], serve=str(model_dir), weights_gib=0.02)
    reps = tuple(replace(r, memory_gib=2.0) for r in plan.replicas if r.llm == "rewriter")
    return replace(plan, models={"rewriter": rewriter}, replicas=reps,
                   workflows={"rag": ("rewriter",)},
                   engine=replace(plan.engine, args=(
                       "--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
                       "--max-model-len", "256", "--max-num-seqs", "4",
                       "--kv-cache-memory-bytes", str(256 << 20), *extra)))


def _wait_healthy(target: RayServeTarget, plan: LaunchPlan, r: ReplicaLaunch,
                  timeout_s: float) -> float:
    t0 = time.monotonic()
    while not target.healthy(plan, r):
        assert time.monotonic() - t0 < timeout_s, f"not healthy after {timeout_s} s: " \
            f"{target.status(plan, r)}"
        time.sleep(2)
    return time.monotonic() - t0


@pytest.mark.vllm
def test_a_replica_runs_as_a_ray_serve_llm_application_and_stops(ray_cluster: str,
                                                                  tmp_path: Path) -> None:
    import httpx
    import ray

    from scepsy_profile.profiling.engine_env import write_model_dir
    from scepsy_profile.profiling.models import engine_model

    model_dir = write_model_dir(engine_model("llama-3-8b", 1 / 16), tmp_path / "model")
    plan = _tiny_plan(model_dir, _ports(1)[0])
    (r,) = plan.replicas
    target = RayServeTarget(address=ray_cluster)
    try:
        target.start(plan, r)
        waited = _wait_healthy(target, plan, r, 600)
        url = target.url(plan, r)
        answer = httpx.post(f"{url}/completions", timeout=120, json={
            "model": "rewriter", "prompt": [1, 2, 3, 4], "max_tokens": 4})
        used = ray.cluster_resources()["CPU"] - ray.available_resources().get("CPU", 0.0)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 4
        assert used == pytest.approx(1.0)  # the planned core, nothing for Serve's actors
        target.stop(plan, r)
        assert target.status(plan, r) is None
        assert httpx.get(f"{url}/models", timeout=30).status_code == 404
        assert not target.healthy(plan, r)

        # negative control: an engine argument vLLM does not know fails the deployment
        bad = _tiny_plan(model_dir, plan.engine.base_port, ("--no-such-engine-arg", "1"))
        target.start(bad, r)
        with pytest.raises(RayTargetError, match="no_such_engine_arg"):
            _wait_healthy(target, bad, r, 300)
        target.stop(bad, r)
        assert target.status(bad, r) is None
        print(f"healthy after {waited:.0f} s")
    finally:
        target.close()


def test_the_ray_target_is_registered_under_its_name() -> None:
    from scepsy_serve.control.actuate import apply_target, target_names

    assert "ray" in target_names()
    target = apply_target("ray")
    assert isinstance(target, RayServeTarget) and target.name == "ray"
