"""The ``k8s`` target: Kubernetes manifests for a plan (docs/launch-k8s-ray.md).

Files (``kubectl apply -f DIR/manifests/``, or ``DIR/fallback/`` on a cluster without NVIDIA's
DRA driver):

* ``manifests/deployments.yaml``: per replica a Deployment (``replicas: 1``, ``Recreate``) pinned
  to its planned node (``nodeSelector: kubernetes.io/hostname``), one container running the
  engine command (``vllm serve MODEL``) with the shell target's arguments
  (:func:`~scepsy_serve.launch.shell.replica_command`: the engine's and the model's own, then
  ``--served-model-name LLM``, the tensor-parallel size, on a GPU ``--gpu-memory-utilization``
  = its memory / the GPU's memory, port 8000 in the pod) and environment; a startup probe on ``/health`` that waits
  ``health_timeout_s``, readiness and liveness probes on ``/health``.
* ``manifests/resourceclaims.yaml``: GPUs through Dynamic Resource Allocation
  (``resource.k8s.io/v1``, NVIDIA's driver, device class ``gpu.nvidia.com``): one ResourceClaim
  per planned GPU (node, index) whose CEL selector picks that device index; every replica on
  the GPU references the same claim (a device is allocated to one claim, which the pods then
  share). Where a GPU is shared or a share is below 1, the claim's opaque ``GpuConfig`` turns on
  MPS with the largest share and memory of its replicas, and each replica's container sets its
  own ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``.
* ``manifests/services.yaml``: a Service per LLM selecting its replicas (port 8000).
* ``fallback/``: the same Deployments and Services with device-plugin counts
  (``nvidia.com/gpu: TP``) instead of claims, for clusters without DRA: a warning at the top and
  ``fallback/warnings.txt`` say that exact GPUs and shares are then not enforced.
* ``routes.json``: each LLM's Service (``http://SERVICE:8000/v1``, weight 1).
* ``warnings.txt``: only when something in the plan cannot be said exactly (a node name that is
  not a Kubernetes node name).

A replica runs on one node (:class:`~scepsy_serve.launch.launchplan.ReplicaLaunch` has one ``node``:
placement keeps a TP group in one NVLink domain), so no LeaderWorkerSet is needed. CPU plans (a
core is the unit the plan shares, a test target) request ``TP·share`` cores and the replica's
memory and no GPU; cores are recorded in an annotation, not pinned.

Object names are DNS-1123 labels made by :func:`k8s_name`; the plan's own names are kept in
``scepsy.io/*`` annotations, from which :meth:`K8sRenderer.parse` reads the assignment back
(checked against the node selector, the claims and the engine arguments). Every file is
written by ``yaml.safe_dump``: user values are plain strings, never template text.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import yaml

from scepsy_common.errors import InputError
from scepsy_common.files import SafeDumper
from scepsy_profile.profiling.engine_env import mps_percentage, one_process_env
from scepsy_serve.launch.launchplan import Assignment, LaunchPlan, ReplicaLaunch
from scepsy_serve.launch.renderers import register_renderer
from scepsy_serve.launch.routes import ROUTES_FILE, service_routes
from scepsy_serve.launch.shell import (
    cpu_kv_cache_gib,
    last_option,
    mps_memory_limit,
    plan_env,
    replica_command,
)

POD_PORT = 8000
"""The port every server listens on inside its pod (and each Service's port)."""
DRA_DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
GPU_CONFIG_API = "resource.nvidia.com/v1beta1"
RESOURCE_API = "resource.k8s.io/v1"
GPU_RESOURCE = "nvidia.com/gpu"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_IMAGE = "vllm/vllm-openai:latest"
DEFAULT_CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:latest"
ANN = "scepsy.io/"
PROBE_PERIOD_S = 10
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""PyYAML's safe loader, libyaml's build where installed (reading only: the files are written by
the pure-Python safe dumper, whose bytes do not depend on libyaml)."""

MANIFESTS = "manifests"
FALLBACK = "fallback"
DEPLOYMENTS = "deployments.yaml"
CLAIMS = "resourceclaims.yaml"
SERVICES = "services.yaml"
WARNINGS = "warnings.txt"

FALLBACK_WARNING = (
    "WARNING: device-plugin fallback. Kubernetes counts GPUs here (nvidia.com/gpu: TP) and\n"
    "picks them itself: the plan's exact GPUs and its MPS shares (compute and memory limits)\n"
    "are NOT enforced, and replicas the plan puts on one GPU each get whole GPUs of their own.\n"
    "Use ../manifests/ (Dynamic Resource Allocation) where NVIDIA's DRA driver is installed.\n")

_LABEL_MAX = 63
_INVALID = re.compile(r"[^a-z0-9-]+")
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def k8s_name(original: str, prefix: str = "", max_len: int = _LABEL_MAX) -> str:
    """A DNS-1123 label (lowercase letters, digits, ``-``; at most ``max_len``) for ``original``:
    ``prefix + original`` when that is one already; otherwise lowercased, every run of other
    characters turned into ``-``, trimmed, and ended by ``-`` and 8 hex digits of the SHA-256 of
    ``original``, so that two different names never map to one (the renderer also checks)."""
    plain = prefix + original
    if _DNS_LABEL.match(plain) and len(plain) <= max_len:
        return plain
    body = _INVALID.sub("-", original.lower()).strip("-")
    digest = hashlib.sha256(original.encode("utf-8")).hexdigest()[:8]
    head = (prefix + body)[:max_len - len(digest) - 1].strip("-")
    return f"{head}-{digest}" if head else f"x-{digest}"


def _node_value(node: str) -> str:
    """The ``kubernetes.io/hostname`` value a node is selected by (:func:`k8s_name`: a node's
    name in Kubernetes is a DNS name, and a label value is at most 63 characters)."""
    return k8s_name(node)


def _quantity_mib(gib: float) -> str:
    return f"{max(1, round(gib * 1024))}Mi"


def _cores(n: float) -> str:
    milli = max(1, round(n * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


POD_HOST = "0.0.0.0"
"""Where a pod's server listens: the pod's interfaces (loopback alone would hide it from its
Service)."""


def server_argv(plan: LaunchPlan, r: ReplicaLaunch) -> tuple[str, ...]:
    """Replica ``r``'s server command as the shell target writes it
    (:func:`~scepsy_serve.launch.shell.replica_command`), on :data:`POD_PORT` of every
    interface of its pod: the pod's own network namespace, which only its Service reaches
    (the plan's node addresses are not the pod's)."""
    return replica_command(plan, replace(r, port=POD_PORT), host=POD_HOST)


def server_env(plan: LaunchPlan, r: ReplicaLaunch, mps: bool) -> dict[str, str]:
    """The replica's environment by the shell target's rules: the engine's, then the model's
    (:func:`~scepsy_serve.launch.shell.plan_env`), then on a CPU the KV-cache size (and, with
    one rank, the engine in one process:
    :data:`~scepsy_profile.profiling.engine_env.ONE_PROCESS_ENV`), on a GPU with ``mps`` (a
    share below 1 or a shared GPU) the MPS client limits. No ``CUDA_VISIBLE_DEVICES``: the claims or the device
    plugin choose the devices a container sees."""
    env = plan_env(plan, r.llm)
    if plan.device_of(r.node).kind == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kv_cache_gib(r.memory_gib, r.tp,
                                                             plan.models[r.llm].weights_gib))
        env.update(one_process_env(r.tp))  # the container's CPU limit confines it (no taskset)
    elif mps:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps_percentage(r.share))
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = mps_memory_limit(r.memory_gib, r.tp)
    return env


@dataclass(frozen=True)
class _Gpu:
    node: str
    index: int
    replicas: tuple[ReplicaLaunch, ...]

    @property
    def mps(self) -> bool:
        return len(self.replicas) > 1 or any(r.share < 1.0 for r in self.replicas)


def _gpus(plan: LaunchPlan) -> dict[tuple[str, int], _Gpu]:
    users: dict[tuple[str, int], list[ReplicaLaunch]] = {}
    for r in plan.replicas:
        if plan.device_of(r.node).kind != "cuda":
            continue
        if len(set(r.gpus)) != len(r.gpus):
            raise InputError("plan", f"replicas.{r.name}.gpus", "distinct GPU indices", r.gpus)
        for g in r.gpus:
            users.setdefault((r.node, g), []).append(r)
    return {k: _Gpu(k[0], k[1], tuple(v)) for k, v in sorted(users.items())}


def _claim_name(node: str, index: int) -> str:
    return k8s_name(f"{node}-{index}", "gpu-")


def _labels(plan: LaunchPlan) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/part-of": "scepsy",
            "app.kubernetes.io/managed-by": "scepsy",
            "app.kubernetes.io/instance": k8s_name(plan.name, "plan-")}


def _check_unique(kind: str, names: Iterable[tuple[str, str]]) -> None:
    seen: dict[str, str] = {}
    for original, name in names:
        if seen.setdefault(name, original) != original:
            raise InputError("plan", kind, "names that stay distinct as Kubernetes names",
                             f"{seen[name]!r} and {original!r} both map to {name!r}")


def _claim(plan: LaunchPlan, gpu: _Gpu) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1,
        "selectors": [{"cel": {"expression":
                               f"device.attributes['{DRA_DRIVER}'].index == {gpu.index}"}}]}}]}
    if gpu.mps:
        devices["config"] = [{"requests": ["gpu"], "opaque": {"driver": DRA_DRIVER, "parameters": {
            "apiVersion": GPU_CONFIG_API, "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": max(mps_percentage(r.share)
                                                     for r in gpu.replicas),
                "defaultPinnedDeviceMemoryLimit": _quantity_mib(max(r.memory_gib
                                                                    for r in gpu.replicas)),
            }}}}}]
    return {"apiVersion": RESOURCE_API, "kind": "ResourceClaim",
            "metadata": {"name": _claim_name(gpu.node, gpu.index), "labels": _labels(plan),
                         "annotations": {ANN + "node": gpu.node, ANN + "gpu": str(gpu.index),
                                         ANN + "replicas": ",".join(r.name
                                                                    for r in gpu.replicas)}},
            "spec": {"devices": devices}}


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 5}


def _deployment(plan: LaunchPlan, r: ReplicaLaunch, dra: bool, image: str, cpu_image: str,
                gpus: Mapping[tuple[str, int], _Gpu]) -> dict[str, Any]:
    kind = plan.device_of(r.node).kind
    llm_label = k8s_name(r.llm, "llm-")
    selector = {"app.kubernetes.io/instance": _labels(plan)["app.kubernetes.io/instance"],
                "scepsy.io/llm": llm_label, "scepsy.io/replica": str(r.replica)}
    labels = {**_labels(plan), "app.kubernetes.io/component": "llm-server", **selector}
    annotations = {ANN + "plan": plan.name, ANN + "llm": r.llm, ANN + "replica": str(r.replica),
                   ANN + "node": r.node, ANN + "gpus": ",".join(map(str, r.gpus)),
                   ANN + "share": repr(float(r.share)), ANN + "tp": str(r.tp),
                   ANN + "memory-gib": repr(float(r.memory_gib))}
    mps = dra and kind == "cuda" and any(gpus[(r.node, g)].mps for g in r.gpus)
    argv = server_argv(plan, r)
    container: dict[str, Any] = {
        "name": "vllm", "image": cpu_image if kind == "cpu" else image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(argv[:len(plan.engine.command)]),
        "args": list(argv[len(plan.engine.command):]),
        "env": [{"name": k, "value": v} for k, v in sorted(server_env(plan, r, mps).items())],
        "ports": [{"name": "http", "containerPort": POD_PORT, "protocol": "TCP"}],
        "startupProbe": _probe("/health", PROBE_PERIOD_S,
                               max(1, math.ceil(plan.engine.health_timeout_s / PROBE_PERIOD_S))),
        "readinessProbe": _probe("/health", 5, 3),
        "livenessProbe": _probe("/health", PROBE_PERIOD_S, 3),
    }
    pod: dict[str, Any] = {"nodeSelector": {HOSTNAME_LABEL: _node_value(r.node)},
                           "containers": [container], "terminationGracePeriodSeconds": 30}
    if kind == "cpu":
        cores, mem = _cores(r.tp * r.share), _quantity_mib(r.memory_gib * r.tp)
        container["resources"] = {"requests": {"cpu": cores, "memory": mem},
                                  "limits": {"cpu": cores, "memory": mem}}
    elif dra:
        pod["resourceClaims"] = [{"name": f"gpu-{g}", "resourceClaimName":
                                  _claim_name(r.node, g)} for g in r.gpus]
        container["resources"] = {"claims": [{"name": f"gpu-{g}"} for g in r.gpus]}
    else:
        container["resources"] = {"limits": {GPU_RESOURCE: r.tp}}
    if r.tp > 1:  # tensor-parallel workers exchange data through shared memory
        pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": k8s_name(r.name, "llm-"), "labels": labels,
                         "annotations": annotations},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                     "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": labels, "annotations": annotations},
                                  "spec": pod}}}


def _service(plan: LaunchPlan, llm: str) -> dict[str, Any]:
    name = k8s_name(llm, "llm-")
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": _labels(plan),
                         "annotations": {ANN + "plan": plan.name, ANN + "llm": llm}},
            "spec": {"selector": {"app.kubernetes.io/instance":
                                  _labels(plan)["app.kubernetes.io/instance"],
                                  "scepsy.io/llm": name},
                     "ports": [{"name": "http", "port": POD_PORT, "targetPort": "http",
                                "protocol": "TCP"}]}}


class _SafeDumper(SafeDumper):
    """``yaml.safe_dump``'s dumper without anchors and aliases (objects repeat shared parts)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_all(docs: Iterable[Mapping[str, Any]], header: str = "") -> str:
    """Multi-document YAML by PyYAML's safe dumper (keys sorted, no aliases), after ``header``
    as ``#`` comment lines."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + yaml.dump_all(list(docs), Dumper=_SafeDumper, sort_keys=True,
                                   explicit_start=True, default_flow_style=False,
                                   allow_unicode=False, width=1 << 16)


def _load_all(files: Mapping[str, str], path: str) -> list[dict[str, Any]]:
    if path not in files:
        return []
    try:
        docs = [d for d in yaml.load_all(files[path], Loader=SAFE_LOADER) if d is not None]
    except yaml.YAMLError as exc:
        raise InputError(path, "", "YAML", str(exc).splitlines()[0]) from None
    for d in docs:
        if not isinstance(d, dict):
            raise InputError(path, "", "Kubernetes objects (mappings)", type(d).__name__)
    return docs


def _ann(doc: Mapping[str, Any], key: str, path: str) -> str:
    try:
        value = doc["metadata"]["annotations"][ANN + key]
    except (KeyError, TypeError):
        raise InputError(path, f"metadata.annotations.{ANN}{key}", "a scepsy annotation") from None
    if not isinstance(value, str):
        raise InputError(path, f"metadata.annotations.{ANN}{key}", "a string", value)
    return value


def _flag(args: list[str], flag: str, path: str) -> str:
    """The value of the last ``flag`` in ``args`` (the one the server keeps)."""
    value = last_option(args, flag)
    if value is None:
        raise InputError(path, "args", f"{flag} VALUE")
    return value


@dataclass(frozen=True)
class K8sRenderer:
    """Kubernetes manifests (module docstring). ``dra=False`` reads and compares the
    ``fallback/`` files (device-plugin counts: only node and TP are exact); both are always
    rendered. ``image``/``cpu_image``: the container image for GPU and CPU plans."""

    name: str = "k8s"
    description: str = ("Kubernetes: a Deployment per replica pinned to its node, GPUs through "
                        "DRA claims (device-plugin fallback/), a Service per LLM")
    dra: bool = True
    image: str = DEFAULT_IMAGE
    cpu_image: str = DEFAULT_CPU_IMAGE

    @property
    def exact(self) -> frozenset[str]:
        return frozenset({"node", "gpus", "tp", "share"} if self.dra else {"node", "tp"})

    def render(self, plan: LaunchPlan) -> Mapping[str, str]:
        gpus = _gpus(plan)
        _check_unique("llms", ((m, k8s_name(m, "llm-")) for m in plan.models))
        _check_unique("replicas", ((r.name, k8s_name(r.name, "llm-")) for r in plan.replicas))
        _check_unique("nodes", ((n, _node_value(n)) for n in plan.nodes))
        _check_unique("GPUs", ((f"{n}:{i}", _claim_name(n, i)) for n, i in gpus))
        llms = sorted({r.llm for r in plan.replicas})
        services = dump_all(_service(plan, m) for m in llms)
        files = {
            f"{MANIFESTS}/{DEPLOYMENTS}": dump_all(
                _deployment(plan, r, True, self.image, self.cpu_image, gpus)
                for r in plan.replicas),
            f"{MANIFESTS}/{SERVICES}": services,
            ROUTES_FILE: service_routes(plan, lambda m: f"http://{k8s_name(m, 'llm-')}:{POD_PORT}/v1"
                                   ).dumps(),
        }
        if gpus:
            files[f"{MANIFESTS}/{CLAIMS}"] = dump_all(_claim(plan, g) for g in gpus.values())
            files[f"{FALLBACK}/{DEPLOYMENTS}"] = dump_all(
                (_deployment(plan, r, False, self.image, self.cpu_image, gpus)
                 for r in plan.replicas), FALLBACK_WARNING)
            files[f"{FALLBACK}/{SERVICES}"] = services
            files[f"{FALLBACK}/{WARNINGS}"] = FALLBACK_WARNING
        renamed = [n for n in plan.node_names() if _node_value(n) != n]
        if renamed:
            files[WARNINGS] = "".join(
                f"node {json.dumps(n)} is not a Kubernetes node name: its replicas select "
                f"{HOSTNAME_LABEL}={_node_value(n)}, which only a node of that name has; "
                "name the nodes in the cluster file as `kubectl get nodes` does\n"
                for n in renamed)
        return files

    def parse(self, files: Mapping[str, str]) -> frozenset[Assignment]:
        folder = MANIFESTS if self.dra else FALLBACK
        path = f"{folder}/{DEPLOYMENTS}"
        if path not in files:
            raise InputError(path, "", "a folder rendered by the k8s target")
        claims = {}
        for c in _load_all(files, f"{MANIFESTS}/{CLAIMS}"):
            claims[c["metadata"]["name"]] = c
        out = set()
        for d in _load_all(files, path):
            if d.get("kind") != "Deployment":
                continue
            out.add(self._assignment(d, claims, path))
        return frozenset(out)

    def _assignment(self, d: Mapping[str, Any], claims: Mapping[str, Any],
                    path: str) -> Assignment:
        llm, node = _ann(d, "llm", path), _ann(d, "node", path)
        replica, tp = int(_ann(d, "replica", path)), int(_ann(d, "tp", path))
        share = float(_ann(d, "share", path))
        pod = d["spec"]["template"]["spec"]
        c = pod["containers"][0]
        if pod["nodeSelector"][HOSTNAME_LABEL] != _node_value(node):
            raise InputError(path, "nodeSelector", f"the node of {ANN}node ({node})",
                             pod["nodeSelector"][HOSTNAME_LABEL])
        if int(_flag(c["args"], "--tensor-parallel-size", path)) != tp:
            raise InputError(path, "args", f"--tensor-parallel-size {tp}")
        res = c.get("resources", {})
        if not self.dra:
            count = res.get("limits", {}).get(GPU_RESOURCE)
            if count is not None and count != tp:
                raise InputError(path, f"resources.limits.{GPU_RESOURCE}", str(tp), count)
            return Assignment(llm, replica, tp, share, node, None)
        if "resourceClaims" not in pod:  # a CPU plan: the cores are recorded, not pinned
            gpus = tuple(int(g) for g in _ann(d, "gpus", path).split(","))
            return Assignment(llm, replica, tp, share, node, gpus)
        found = []
        for ref in pod["resourceClaims"]:
            claim = claims.get(ref["resourceClaimName"])
            if claim is None:
                raise InputError(path, "resourceClaims", "claims in resourceclaims.yaml",
                                 ref["resourceClaimName"])
            expr = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"][
                "expression"]
            m = re.fullmatch(r"device\.attributes\['[^']+'\]\.index == (\d+)", expr)
            if not m or _ann(claim, "node", CLAIMS) != node:
                raise InputError(CLAIMS, "selectors", f"a GPU index of node {node}", expr)
            found.append(int(m.group(1)))
        env = {e["name"]: e["value"] for e in c.get("env", [])}
        pct = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        if pct is not None and int(pct) != mps_percentage(share):
            raise InputError(path, "env.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                             str(mps_percentage(share)), pct)
        return Assignment(llm, replica, len(found), share, node, tuple(found))


register_renderer(K8sRenderer())
