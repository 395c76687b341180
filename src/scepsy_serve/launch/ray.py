"""The ``ray`` target: a Ray Serve LLM application config for a plan (docs/launch-k8s-ray.md),
deployed with ``serve deploy DIR/serve.yaml`` on a running Ray cluster.

``serve.yaml`` (a ``ServeDeploySchema``, checked against Ray 2.60.0's own models in the tests)
holds one application, ``ray.serve.llm:build_openai_app``, whose ``llm_configs`` give every LLM
of the plan (fields of ``ray.serve.llm.LLMConfig``):

* ``model_loading_config``: ``model_id`` the LLM's name (what requests ask for), ``model_source``
  what the engine loads;
* ``deployment_config.num_replicas``: the plan's replicas of the LLM;
* ``engine_kwargs``: ``tensor_parallel_size``, on a GPU ``gpu_memory_utilization`` (the replica's
  memory / the GPU's memory, as the shell target rounds it), then the engine's and the model's arguments turned into keyword
  arguments (``--max-num-seqs 64`` → ``max_num_seqs: 64``, ``--enforce-eager`` → ``True``,
  ``--no-x`` → ``x: False``);
* ``placement_group_config``: ``TP`` bundles of the replica's share of one GPU (``{GPU: 0.5}``;
  on a CPU plan ``{CPU: share}``) with ``STRICT_PACK``, so a replica's workers share one node;
* ``accelerator_type`` where the plan's GPU names one of Ray's accelerator types;
* ``runtime_env.env_vars``: the engine's and the model's environment (and, as the other
  targets, the MPS client limits below a whole GPU, or the KV-cache size on a CPU);
* on a CPU plan, ``deployment_config.ray_actor_options`` and the application's
  ``ingress_deployment_config`` ask for no CPU (:data:`SERVE_ACTORS_ON_CPU`): the plan's cores
  go to the engines' bundles.

Ray chooses the nodes and GPUs itself: only ``tp`` and ``share`` are exact; the plan's node
and GPU indices are not expressed. ``routes.json`` sends each LLM to the Serve proxy (which runs
on every node: ``http://ADDRESS:PORT/v1``, the first planned node's address, ``model`` the LLM).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from scepsy_common.errors import InputError
from scepsy_common.files import dump_yaml
from scepsy_serve.launch.k8s import SAFE_LOADER, server_env
from scepsy_serve.launch.launchplan import Assignment, LaunchPlan
from scepsy_serve.launch.renderers import register_renderer
from scepsy_serve.launch.routes import ROUTES_FILE, service_routes
from scepsy_serve.launch.shell import gpu_memory_utilization

SERVE_FILE = "serve.yaml"
IMPORT_PATH = "ray.serve.llm:build_openai_app"
STRATEGY = "STRICT_PACK"

RAY_ACCELERATORS = (
    "V100", "P100", "T4", "P4", "K80", "A10G", "L4", "L40S", "A100", "H100", "H200", "H20",
    "B200", "B300", "GB200", "GB300", "RTX-PRO-6000", "A100-40G", "A100-80G")
"""Ray 2.60.0's NVIDIA accelerator types (``ray.util.accelerators``; a test compares)."""

SERVE_ACTORS_ON_CPU = {"num_cpus": 0}
"""``ray_actor_options`` of Serve's own actors (each LLM's replica actor, the OpenAI ingress)
on a CPU plan: Ray Serve LLM's default of 1 CPU each is added to the planned cores, so a
one-core replica would ask for 3 and a cluster of the plan's cores never schedules its ingress."""

RESERVED = ("model", "served_model_name", "tensor_parallel_size", "host", "port")
"""Engine arguments the target sets itself (Ray Serve LLM refuses the first two)."""

_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")


def ray_accelerator(gpu: str) -> str | None:
    """Ray's accelerator type for a GPU name of the catalog, or None: the name itself, the name
    with a ``GB`` suffix as ``G`` (``A100-80GB`` → ``A100-80G``), or its part before the first
    ``-`` (``H100-80GB`` → ``H100``), compared without case."""
    known = {a.lower(): a for a in RAY_ACCELERATORS}
    for cand in (gpu, re.sub(r"GB$", "G", gpu, flags=re.IGNORECASE), gpu.split("-")[0]):
        if cand.lower() in known:
            return known[cand.lower()]
    return None


def _value(text: str) -> Any:
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            return text
    return text


def engine_kwargs(args: tuple[str, ...], source: str = "plan") -> dict[str, Any]:
    """Command-line engine arguments as vLLM keyword arguments (module docstring)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--") or len(a) < 3:
            raise InputError(source, "engine args", "--name [VALUE] arguments", a)
        key, eq, val = a[2:].partition("=")
        if eq:
            value: Any = _value(val)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = _value(args[i + 1])
            i += 2
        elif key.startswith("no-"):
            key, value = key[3:], False
            i += 1
        else:
            value = True
            i += 1
        name = key.replace("-", "_")
        if name in RESERVED:
            raise InputError(source, "engine args", "no argument the launch target sets "
                             f"itself ({', '.join('--' + r.replace('_', '-') for r in RESERVED)})",
                             a)
        out[name] = value
    return out


def llm_config(plan: LaunchPlan, llm: str) -> dict[str, Any]:
    """The ``LLMConfig`` of one LLM (module docstring) as plain data."""
    model = plan.models[llm]
    reps = plan.replicas_of(llm)
    if not reps:
        raise InputError("plan", f"models.{llm}", "at least one replica")
    r = reps[0]
    for other in reps[1:]:
        if (other.tp, other.share, other.memory_gib) != (r.tp, r.share, r.memory_gib):
            raise InputError("plan", f"replicas.{other.name}", "the tp, share and memory of "
                             f"{r.name} (Ray Serve runs every replica of an LLM alike)",
                             (other.tp, other.share, other.memory_gib))
    kind = plan.device_of(r.node).kind
    kwargs: dict[str, Any] = {"tensor_parallel_size": r.tp}
    if kind == "cuda":
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization(
            r.memory_gib, plan.device_of(r.node).memory_gib)
    for k, v in {**engine_kwargs(plan.engine.args), **engine_kwargs(model.args)}.items():
        if k in kwargs:
            raise InputError("plan", f"models.{llm}.args", "no argument the launch target "
                             "sets itself", "--" + k.replace("_", "-"))
        kwargs[k] = v
    bundle = {"GPU" if kind == "cuda" else "CPU": float(r.share)}
    deployment: dict[str, Any] = {"num_replicas": len(reps)}
    if kind == "cpu":
        deployment["ray_actor_options"] = dict(SERVE_ACTORS_ON_CPU)
    cfg: dict[str, Any] = {
        "model_loading_config": {"model_id": llm, "model_source": model.serve},
        "deployment_config": deployment,
        "engine_kwargs": kwargs,
        "placement_group_config": {"bundles": [dict(bundle) for _ in range(r.tp)],
                                   "strategy": STRATEGY},
    }
    accel = ray_accelerator(model.gpu) if kind == "cuda" else None
    if accel:
        cfg["accelerator_type"] = accel
    env = server_env(plan, r, mps=kind == "cuda" and r.share < 1.0)
    if env:
        cfg["runtime_env"] = {"env_vars": env}
    return cfg


def proxy_host(plan: LaunchPlan) -> str:
    """Where Ray Serve's HTTP proxies listen: the plan's one node address when all its nodes
    share it (one host, e.g. ``127.0.0.1``); otherwise every interface (``0.0.0.0``), since
    ``http_options.host`` is one value for the proxy of every node (restrict access with the
    cluster's network rules)."""
    addresses = {plan.address(n) for n in plan.node_names()}
    return addresses.pop() if len(addresses) == 1 else "0.0.0.0"


def serve_config(plan: LaunchPlan) -> dict[str, Any]:
    """The whole ``serve.yaml`` as plain data."""
    llms = sorted({r.llm for r in plan.replicas})
    args: dict[str, Any] = {"llm_configs": [llm_config(plan, m) for m in llms]}
    if any(plan.device_of(r.node).kind == "cpu" for r in plan.replicas):
        args["ingress_deployment_config"] = {"ray_actor_options": dict(SERVE_ACTORS_ON_CPU)}
    return {"proxy_location": "EveryNode",
            "http_options": {"host": proxy_host(plan), "port": plan.engine.base_port},
            "applications": [{"name": f"scepsy-{plan.name}", "route_prefix": "/",
                              "import_path": IMPORT_PATH, "args": args}]}


def _dump(data: Any) -> str:
    return dump_yaml(data, sort_keys=True, default_flow_style=False, allow_unicode=False,
                          width=1 << 16)


def _get(d: Any, path: str, source: str) -> Any:
    cur = d
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            raise InputError(source, path, "a Ray Serve LLM config field")
        cur = cur[part]
    return cur


@dataclass(frozen=True)
class RayRenderer:
    """A Ray Serve LLM application (module docstring)."""

    name: str = "ray"
    description: str = "Ray Serve LLM: one application, an LLM deployment per model (serve.yaml)"
    exact: frozenset[str] = frozenset({"tp", "share"})

    def render(self, plan: LaunchPlan) -> Mapping[str, str]:
        head = plan.node_names()[0] if plan.replicas else "localhost"
        url = f"http://{plan.url_host(head)}:{plan.engine.base_port}/v1"
        return {SERVE_FILE: _dump(serve_config(plan)),
                ROUTES_FILE: service_routes(plan, lambda m: url).dumps()}

    def parse(self, files: Mapping[str, str]) -> frozenset[Assignment]:
        if SERVE_FILE not in files:
            raise InputError(SERVE_FILE, "", "a folder rendered by the ray target")
        try:
            raw = yaml.load(files[SERVE_FILE], Loader=SAFE_LOADER)
        except yaml.YAMLError as exc:
            raise InputError(SERVE_FILE, "", "YAML", str(exc).splitlines()[0]) from None
        out: set[Assignment] = set()
        for app in _get(raw, "applications", SERVE_FILE):
            for cfg in _get(app, "args.llm_configs", SERVE_FILE):
                llm = _get(cfg, "model_loading_config.model_id", SERVE_FILE)
                n = _get(cfg, "deployment_config.num_replicas", SERVE_FILE)
                tp = _get(cfg, "engine_kwargs.tensor_parallel_size", SERVE_FILE)
                bundles = _get(cfg, "placement_group_config.bundles", SERVE_FILE)
                shares = {b.get("GPU", b.get("CPU")) for b in bundles}
                if len(bundles) != tp or len(shares) != 1:
                    raise InputError(SERVE_FILE, f"{llm}.placement_group_config.bundles",
                                     f"{tp} equal bundles (one per TP worker)", bundles)
                share = float(shares.pop())
                out.update(Assignment(llm, i, tp, share, None, None) for i in range(n))
        return frozenset(out)


register_renderer(RayRenderer())
