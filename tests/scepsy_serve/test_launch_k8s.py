"""The Kubernetes target (src/scepsy_serve/launch/k8s.py, docs/launch-k8s-ray.md): every
manifest of both modes validated offline against Kubernetes' own schemas (kubernetes-validate,
strict), what each mode enforces, the name rule, and YAML injection through plan values."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_render_conformance import launch_plans

from fakes.launch_plans import cpu_plan, gpu_plan
from scepsy_common.errors import InputError
from scepsy_serve.launch.k8s import (
    FALLBACK_WARNING,
    K8sRenderer,
    dump_all,
    k8s_name,
)
from scepsy_serve.launch.launchplan import LaunchPlan, ReplicaLaunch

kubernetes_validate = pytest.importorskip("kubernetes_validate",
                                          reason="the k8s extra is not installed",
                                          exc_type=ModuleNotFoundError)

K8S_VERSION = "1.37.0"
"""A Kubernetes release whose schemas kubernetes-validate 1.37 ships, with resource.k8s.io/v1
(Dynamic Resource Allocation, GA since 1.34)."""
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([a-z0-9-]*[a-z0-9])?$")
K8S = K8sRenderer()
FALLBACK = K8sRenderer(dra=False)


def docs(files: dict[str, str], path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(files[path]) if d is not None]


def validate_all(files: dict[str, str]) -> int:
    n = 0
    for path, text in sorted(files.items()):
        if path.endswith(".yaml"):
            for d in yaml.safe_load_all(text):
                kubernetes_validate.validate(d, K8S_VERSION, strict=True)
                n += 1
    return n


def deployment(files: dict[str, str], name: str, folder: str = "manifests") -> dict[str, Any]:
    [d] = [d for d in docs(files, f"{folder}/deployments.yaml") if d["metadata"]["name"] == name]
    return d


# ----------------------------------------------------------------------- schema validation

@pytest.mark.parametrize(("plan", "objects"), [
    (gpu_plan, 6 + 3 + 9 + 6 + 3),  # deployments, services, claims; fallback/ deployments, services
    (cpu_plan, 2 + 2)], ids=["gpu", "cpu"])
def test_every_manifest_of_both_modes_is_valid_kubernetes(plan, objects: int) -> None:
    assert validate_all(dict(K8S.render(plan()))) == objects


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=launch_plans())
def test_random_plans_render_valid_kubernetes(plan: LaunchPlan) -> None:
    files = dict(K8S.render(plan))
    validate_all(files)
    for d in docs(files, "manifests/deployments.yaml") + docs(files, "manifests/services.yaml"):
        name = d["metadata"]["name"]
        assert DNS_1035.match(name) and len(name) <= 63
        for v in d["metadata"]["labels"].values():
            assert len(v) <= 63 and re.match(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$", v)


def test_the_validator_refuses_a_broken_manifest() -> None:
    """Negative control: the schema check above can fail."""
    d = deployment(dict(K8S.render(gpu_plan())), "llm-gen-0")
    kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    typo = copy.deepcopy(d)
    typo["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    bad_type = copy.deepcopy(d)
    bad_type["spec"]["replicas"] = "one"
    for broken in (typo, bad_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


# ------------------------------------------------------------------------ what is enforced

def test_dra_mode_pins_node_gpus_and_mps_shares() -> None:
    files = dict(K8S.render(gpu_plan()))
    claims = {c["metadata"]["name"]: c for c in docs(files, "manifests/resourceclaims.yaml")}
    # one claim per planned GPU, shared by the replicas on it
    assert sorted(claims) == ["gpu-node-a-0", "gpu-node-a-1", "gpu-node-b-0", "gpu-node-b-1",
                              "gpu-node-b-2", "gpu-node-b-4", "gpu-node-b-5", "gpu-node-b-6",
                              "gpu-node-b-7"]
    a0 = claims["gpu-node-a-0"]
    req = a0["spec"]["devices"]["requests"][0]["exactly"]
    assert req["deviceClassName"] == "gpu.nvidia.com" and req["count"] == 1
    assert req["selectors"][0]["cel"]["expression"] == \
        "device.attributes['gpu.nvidia.com'].index == 0"
    # gen-0 (0.5) and small-0 (0.3) share GPU 0 of node-a: MPS, the larger limits
    mps = a0["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert mps["kind"] == "GpuConfig" and mps["sharing"]["strategy"] == "MPS"
    assert mps["sharing"]["mpsConfig"] == {"defaultActiveThreadPercentage": 50,
                                           "defaultPinnedDeviceMemoryLimit": "40960Mi"}
    assert "config" not in claims["gpu-node-b-4"]["spec"]["devices"]  # big: whole GPUs alone
    small = deployment(files, "llm-small-0")
    pod = small["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "node-a"}
    assert pod["resourceClaims"] == [{"name": "gpu-0", "resourceClaimName": "gpu-node-a-0"}]
    c = pod["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=24G"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert c["command"] == ["vllm", "serve"]
    args = c["args"]
    assert args[0] == "Qwen/Qwen2.5-1.5B"
    for flag, value in (("--served-model-name", "small"), ("--tensor-parallel-size", "1"),
                        ("--gpu-memory-utilization", "0.3"), ("--port", "8000"),
                        ("--max-num-seqs", "64")):
        assert args[args.index(flag) + 1] == value
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert small["spec"]["replicas"] == 1
    big = deployment(files, "llm-big-0")["spec"]["template"]["spec"]
    assert [r["resourceClaimName"] for r in big["resourceClaims"]] == [
        f"gpu-node-b-{i}" for i in (4, 5, 6, 7)]
    assert big["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def test_fallback_counts_gpus_and_says_what_is_not_enforced() -> None:
    files = dict(K8S.render(gpu_plan()))
    text = files["fallback/deployments.yaml"]
    assert text.startswith("# WARNING: device-plugin fallback.")
    assert files["fallback/warnings.txt"] == FALLBACK_WARNING
    assert "NOT enforced" in FALLBACK_WARNING
    for d in docs(files, "fallback/deployments.yaml"):
        pod = d["spec"]["template"]["spec"]
        c = pod["containers"][0]
        tp = int(d["metadata"]["annotations"]["scepsy.io/tp"])
        assert c["resources"] == {"limits": {"nvidia.com/gpu": tp}}
        assert "resourceClaims" not in pod
        assert not any(e["name"].startswith("CUDA_MPS") for e in c.get("env", []))
        assert pod["nodeSelector"]["kubernetes.io/hostname"] in ("node-a", "node-b")
    assert files["fallback/services.yaml"] == files["manifests/services.yaml"]
    got = FALLBACK.parse(files)
    assert FALLBACK.exact == {"node", "tp"}
    assert {(a.llm, a.replica, a.node, a.tp, a.gpus) for a in got} == {
        (a.llm, a.replica, a.node, a.tp, None) for a in gpu_plan().assignments()}


def test_cpu_plans_request_cores_and_memory_and_no_gpus() -> None:
    files = dict(K8S.render(cpu_plan()))
    assert sorted(files) == ["manifests/deployments.yaml", "manifests/services.yaml",
                             "routes.json"]
    for d in docs(files, "manifests/deployments.yaml"):
        c = d["spec"]["template"]["spec"]["containers"][0]
        assert c["resources"] == {"requests": {"cpu": "1", "memory": "4096Mi"},
                                  "limits": {"cpu": "1", "memory": "4096Mi"}}
        env = {e["name"]: e["value"] for e in c["env"]}
        # 4 GiB - 0.02 weights - 1 reserve; one rank: the engine in one process
        assert env == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        assert "--gpu-memory-utilization" not in c["args"]
    half = replace(cpu_plan(), replicas=tuple(replace(r, share=0.5) for r in cpu_plan().replicas))
    c = docs(dict(K8S.render(half)), "manifests/deployments.yaml")[0]
    assert c["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == \
        "500m"


def test_services_and_routes_point_at_each_llm() -> None:
    files = dict(K8S.render(gpu_plan()))
    svcs = {s["metadata"]["name"]: s for s in docs(files, "manifests/services.yaml")}
    assert sorted(svcs) == ["llm-big", "llm-gen", "llm-small"]
    assert svcs["llm-gen"]["spec"]["selector"] == {"app.kubernetes.io/instance": "plan-two-nodes",
                                                   "scepsy.io/llm": "llm-gen"}
    gen_pods = [d for d in docs(files, "manifests/deployments.yaml")
                if all(d["spec"]["template"]["metadata"]["labels"].get(k) == v
                       for k, v in svcs["llm-gen"]["spec"]["selector"].items())]
    assert sorted(d["metadata"]["name"] for d in gen_pods) == ["llm-gen-0", "llm-gen-1"]
    routes = json.loads(files["routes.json"])
    assert routes["workflows"]["b"]["gen"] == [{"url": "http://llm-gen:8000/v1", "model": "gen",
                                                "weight": 1.0, "replica": None}]


def test_parse_reads_the_enforced_fields() -> None:
    files = dict(K8S.render(gpu_plan()))
    # a claim selecting another GPU index parses as that GPU
    text = files["manifests/resourceclaims.yaml"].replace("index == 7", "index == 3")
    got = {(a.llm, a.replica): a.gpus
           for a in K8S.parse({**files, "manifests/resourceclaims.yaml": text})}
    assert got[("big", 0)] == (4, 5, 6, 3)
    # a node selector that disagrees with the recorded node is refused
    moved = files["manifests/deployments.yaml"].replace("kubernetes.io/hostname: node-b",
                                                        "kubernetes.io/hostname: node-c", 1)
    with pytest.raises(InputError, match="nodeSelector"):
        K8S.parse({**files, "manifests/deployments.yaml": moved})
    with pytest.raises(InputError, match="rendered by the k8s target"):
        K8S.parse({"routes.json": files["routes.json"]})


# ------------------------------------------------------------------------------- names

def test_k8s_name_keeps_valid_names_and_hashes_changed_ones() -> None:
    assert k8s_name("node-a") == "node-a"
    assert k8s_name("gen", "llm-") == "llm-gen"
    changed = k8s_name("Qwen/Qwen2.5:7B+x", "llm-")
    assert re.fullmatch(r"llm-qwen-qwen2-5-7b-x-[0-9a-f]{8}", changed)
    assert k8s_name("Gen", "llm-") != k8s_name("gen", "llm-")
    assert len({k8s_name(n, "llm-") for n in ("a_b", "a-b", "a.b", "A-b", "a:b", "a/b")}) == 6
    long = "x" * 200
    assert len(k8s_name(long, "llm-")) == 63 and k8s_name(long, "llm-") != k8s_name(long + "y",
                                                                                      "llm-")


@given(st.text(alphabet=st.characters(codec="ascii"), min_size=1, max_size=150),
       st.sampled_from(["", "llm-", "gpu-"]))
def test_k8s_name_is_always_a_dns_label(name: str, prefix: str) -> None:
    out = k8s_name(name, prefix)
    assert DNS_LABEL.match(out) and len(out) <= 63
    assert (out == prefix + name) == bool(DNS_LABEL.match(prefix + name)
                                          and len(prefix + name) <= 63)


@given(st.lists(st.text(alphabet="aAbB-_.:/+0", min_size=1, max_size=70), min_size=2,
                max_size=8, unique=True))
def test_k8s_name_never_maps_two_names_to_one(names: list[str]) -> None:
    assert len({k8s_name(n, "llm-") for n in names}) == len(names)


def test_a_node_that_is_no_kubernetes_name_is_selected_by_its_label_with_a_warning() -> None:
    plan = gpu_plan()
    plan = replace(plan, nodes={"Node_A": "A100-80GB", "node-b": "A100-80GB"},
                   replicas=tuple(replace(r, node="Node_A") if r.node == "node-a" else r
                                  for r in plan.replicas))
    files = dict(K8S.render(plan))
    value = k8s_name("Node_A")
    assert "Node_A" in files["warnings.txt"] and value in files["warnings.txt"]
    pods = [d["spec"]["template"]["spec"] for d in docs(files, "manifests/deployments.yaml")]
    assert {p["nodeSelector"]["kubernetes.io/hostname"] for p in pods} == {value, "node-b"}
    assert {a.node for a in K8S.parse(files)} == {"Node_A", "node-b"}
    assert "warnings.txt" not in K8S.render(gpu_plan())


def test_duplicate_gpus_in_one_replica_are_refused() -> None:
    plan = gpu_plan()
    bad = replace(plan, replicas=(*plan.replicas[:-1],
                                  ReplicaLaunch("small", 2, "node-b", (2, 2), 0.3, 24.0, 8000)))
    with pytest.raises(InputError, match="distinct GPU indices"):
        K8S.render(bad)


# ------------------------------------------------------------------------------- injection

EVIL = ["a: b", "x # not a comment", "{flow: map}", "&anchor", "*alias", "!!python/object/apply:"
        "os.system ['echo pwned']", "line --- kind: Secret", "'quoted'", '"dq"', "- item",
        "yes", "null", "~", "1_000", "12:30", "0o17", "%TAG ! tag:x", "@at", "`tick`"]


def test_a_value_with_a_newline_is_refused_by_the_text_rule() -> None:
    plan = gpu_plan()
    models = dict(plan.models)
    models["small"] = replace(models["small"], env={"EVIL": "line\n---\nkind: Secret"})
    with pytest.raises(InputError, match="no control character"):
        K8S.render(replace(plan, models=models))


@pytest.mark.parametrize("evil", EVIL)
def test_yaml_specials_in_values_stay_plain_strings(evil: str) -> None:
    plan = gpu_plan()
    models = dict(plan.models)
    models["small"] = replace(models["small"], serve=evil, args=("--chat-template", evil),
                              env={"EVIL": evil})
    plan = replace(plan, models=models, engine=replace(plan.engine, env={"ENGINE": evil}))
    files = dict(K8S.render(plan))
    for path in ("manifests/deployments.yaml", "fallback/deployments.yaml"):
        ds = docs(files, path)
        assert [d["kind"] for d in ds] == ["Deployment"] * 6  # no document added
        for d in ds:
            assert set(d) == {"apiVersion", "kind", "metadata", "spec"}
        small = deployment(files, "llm-small-0", path.split("/")[0])
        c = small["spec"]["template"]["spec"]["containers"][0]
        assert c["args"][0] == evil and c["args"][c["args"].index("--chat-template") + 1] == evil
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["EVIL"] == evil and env["ENGINE"] == evil
        assert all(isinstance(v, str) for v in env.values())
    validate_all(files)
    assert K8S.parse(files) == plan.assignments()


@pytest.mark.parametrize("name", ["yes", "null", "1_000", "12:30", "on", "0x1F", "1e3", "a:b",
                                  "x/y", "a.b+c", "_", "True"])
def test_yaml_like_names_round_trip_as_strings(name: str) -> None:
    plan = gpu_plan()
    models = {(name if k == "small" else k): replace(v, llm=name if k == "small" else k)
              for k, v in plan.models.items()}
    plan = replace(plan, name=name, models=models,
                   replicas=tuple(replace(r, llm=name) if r.llm == "small" else r
                                  for r in plan.replicas),
                   workflows={name: ("gen", name)})
    files = dict(K8S.render(plan))
    validate_all(files)
    assert K8S.parse(files) == plan.assignments()
    for d in docs(files, "manifests/deployments.yaml"):
        for v in d["metadata"]["annotations"].values():
            assert isinstance(v, str)
    assert {s["metadata"]["annotations"]["scepsy.io/llm"]
            for s in docs(files, "manifests/services.yaml")} == {"big", "gen", name}


def test_dump_all_header_is_comment_only() -> None:
    text = dump_all([{"a": "b"}], "line one\n\nline: two")
    assert text.splitlines()[:3] == ["# line one", "#", "# line: two"]
    assert list(yaml.safe_load_all(text)) == [{"a": "b"}]
