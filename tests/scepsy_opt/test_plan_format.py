"""plan.json format version 1 (docs/plan-format.md): the writer's new fields, the models and
their JSON Schema, the loader's checks, and the launch view built from a plan.

Oracles: the placement section the planner wrote (every replica of the launch view is one of
its rows), the catalog (weights, repo ids), the exported JSON Schema (every writer output is
valid; every document the models reject for a missing or mistyped field, the schema rejects
too), and exhaustive mutations: dropping any required field or mistyping any typed field names
exactly that field.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import scepsy
from scepsy_common.errors import InputError
from scepsy_opt.planning.planfile import (
    PLAN_VERSION,
    device_kind,
    dumps,
    served_model,
    weights_gib,
    write_plan,
)
from scepsy_place.formulations.loop import plan_document
from scepsy_place.packing.topology import load_topology
from scepsy_profile.catalog import default_catalog
from scepsy_profile.hardware import GIB
from scepsy_serve.launch.launchplan import LaunchPlan
from scepsy_serve.launch.planfile import (
    PlanDoc,
    launch_plan,
    load_plan,
    main,
    parse_launch_plan,
    parse_plan,
    plan_json_schema,
    schema_text,
)

try:  # the JSON Schema itself, where a validator is installed (the dev extras bring one)
    import jsonschema
except ImportError:  # pragma: no cover - without it, through the models the schema came from
    jsonschema = None

REPO = Path(__file__).resolve().parents[2]
RAG_BEAM = str(REPO / "datasets" / "workflows" / "rag-beam.yaml")
RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
A16 = str(REPO / "datasets" / "clusters" / "a100-16.yaml")
A4 = str(REPO / "datasets" / "clusters" / "a100-4.yaml")
RACKS = str(REPO / "datasets" / "clusters" / "racks-a100-h100.yaml")
SCHEMA_FILE = REPO / "docs" / "plan.schema.json"
REQ = 300  # trace requests per workflow: ~2 s per plan


def _json(doc: dict[str, Any]) -> dict[str, Any]:
    return json.loads(dumps(doc))


@pytest.fixture(scope="module")
def placed() -> scepsy.PlanResult:
    return scepsy.plan(RAG_BEAM, A16, 0.6, trace_requests=REQ)


@pytest.fixture(scope="module")
def doc(placed) -> dict[str, Any]:
    return _json(placed.to_dict(timings=False))


@pytest.fixture(scope="module")
def racks() -> tuple[scepsy.PlanResult, dict[str, Any]]:
    res = scepsy.plan(RAG_BEAM, RACKS, 0.6, trace_requests=REQ, formulation="blocks")
    return res, _json(plan_document(res.problem, res.placed, policy=res.placer, timings=False,
                                    topology=load_topology(RACKS)))


@functools.cache
def _validator() -> Any:
    schema = plan_json_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _schema_valid(d: dict[str, Any]) -> None:
    if jsonschema is not None:
        _validator().validate(d)
    else:  # pragma: no cover
        PlanDoc.model_validate(d)


def _schema_rejects(d: dict[str, Any]) -> bool:
    if jsonschema is None:  # pragma: no cover
        return True
    return not _validator().is_valid(d)


def _field(exc: InputError) -> str:
    """The error's field with list indices written as pydantic does (``a.0.b``)."""
    return re.sub(r"\[(\d+)\]", r".\1", exc.field)


def _rows(lp: LaunchPlan) -> list[tuple[Any, ...]]:
    return sorted((r.llm, r.replica, r.node, r.gpus, r.share, r.memory_gib) for r in lp.replicas)


def _instances(d: dict[str, Any]) -> list[tuple[Any, ...]]:
    return sorted((i["llm"], i["replica"], i["node"], tuple(i["gpus"]), i["share"],
                   i["memory_gib"]) for i in d["placement"]["instances"])


def _check_launch_view(lp: LaunchPlan, d: dict[str, Any]) -> None:
    """Everything the launch view says, against the document it was built from."""
    assert lp.version == PLAN_VERSION and lp.name == d["cluster"]["name"]
    assert _rows(lp) == _instances(d)
    assert set(lp.models) == set(d["llms"]) == set(d["launch"]["models"])
    for m, row in d["llms"].items():
        ml = lp.models[m]
        assert (ml.model, ml.gpu, ml.tp, ml.share, ml.replicas) == (
            row["model"], row["gpu"], row["tp"], row["share"], row["replicas"])
        assert ml.memory_gib == row["memory_gib_per_gpu"] and ml.weights_gib == row["weights_gib"]
        assert ml.serve == d["launch"]["models"][m]["serve"]
        assert all(r.tp == row["tp"] for r in lp.replicas_of(m))
    assert {w: list(v) for w, v in lp.workflows.items()} == {
        w: wf["llms"] for w, wf in d["workflows"].items()}
    assert {g: (dv.kind, dv.memory_gib) for g, dv in lp.devices.items()} == {
        g: (dv["kind"], dv["memory_gib"]) for g, dv in d["devices"].items()}
    for r in lp.replicas:
        assert lp.nodes[r.node] == d["llms"][r.llm]["gpu"]
    # ports: per node, distinct and consecutive from base_port
    base = d["launch"]["base_port"]
    for node in lp.node_names():
        ports = sorted(r.port for r in lp.replicas_on(node))
        assert ports == list(range(base, base + len(ports)))


# ----------------------------------------------------------------------------- the writer


def test_writer_adds_version_devices_weights_workflow_llms_and_launch(placed, doc):
    cat = default_catalog()
    assert doc["version"] == PLAN_VERSION == 1
    assert doc["devices"] == {"A100-80GB": {"kind": "cuda", "memory_gib": 80.0}}
    for m, row in doc["llms"].items():
        spec = cat.model(row["model"])
        assert row["weights_gib"] == pytest.approx(spec.weight_bytes / GIB, rel=1e-12)
        assert 0 < row["weights_gib"] < row["tp"] * row["memory_gib_per_gpu"]
        serve = doc["launch"]["models"][m]["serve"]
        assert "/" in serve and cat.model(serve).name == spec.name
        assert doc["launch"]["models"][m] == {"serve": serve, "args": [], "env": {}}
    for w, wf in doc["workflows"].items():
        assert wf["llms"] == sorted(placed.problem.stats[w].llms)
    assert doc["workflows"]["rag"]["llms"] == ["generator", "reranker", "rewriter"]
    assert doc["workflows"]["beam_search"]["llms"] == ["generator", "prm"]
    launch = {k: v for k, v in doc["launch"].items() if k != "models"}
    assert launch == {"command": ["vllm", "serve"], "args": [], "env": {}, "base_port": 8000,
                      "health_timeout_s": 900.0, "addresses": {}}
    assert "topology" not in doc  # the pools name the nodes


def test_served_model_is_a_repo_id_of_the_same_model():
    """Every catalog model: the first sorted alias with a ``/`` when there is one (it resolves
    to the model), else the name; a repo id the workflow names is kept."""
    cat = default_catalog()
    for name in cat.models:
        repos = sorted(a for a in cat.aliases_of(name) if "/" in a)
        got = served_model(name, cat)
        assert got == (repos[0] if repos else name)
        assert cat.model(got).name == name
        for a in repos:
            assert served_model(a, cat) == a
            assert served_model(a.lower(), cat) == a  # spelled as the catalog does
    assert weights_gib("qwen2.5-7b", cat) == cat.model("qwen2.5-7b").weight_bytes / GIB


@pytest.mark.parametrize(("name", "kind"), [("cpu", "cpu"), ("CPU", "cpu"), ("cpu-x86", "cpu"),
                                            ("A100-80GB", "cuda"), ("H100-80GB", "cuda")])
def test_device_kind(name, kind):
    assert device_kind(name) == kind


def test_rewrite_without_timings_is_byte_identical(placed, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    placed.write(a, timings=False)
    placed.write(b, timings=False)
    assert a.read_bytes() == b.read_bytes()
    # the models keep every field the writer emits: validating and dumping gives the same bytes
    d = parse_plan(json.loads(a.read_text()), str(a))
    assert dumps(d.model_dump(mode="json", exclude_unset=True)) == a.read_text()


# ------------------------------------------------------------------------ schema and models


def test_committed_schema_is_the_export(tmp_path):
    assert SCHEMA_FILE.read_text() == schema_text(), (
        "docs/plan.schema.json is stale: python -m scepsy_serve.launch.planfile "
        "--write-schema docs/plan.schema.json")
    schema = plan_json_schema()
    assert schema["$id"] and schema["version"] == PLAN_VERSION
    assert "format version 1" in schema["title"]
    out = tmp_path / "s.json"
    assert main(["--write-schema", str(out)]) == 0
    assert out.read_text() == schema_text()


def _variants() -> Iterator[tuple[str, dict[str, Any]]]:
    """Writer outputs of every kind: placed (with timings), max-throughput, infeasible, not
    placed."""
    yield "placed", _json(scepsy.plan(RAG_BEAM, A16, 0.6, trace_requests=REQ).to_dict())
    yield "max-throughput", _json(scepsy.plan(RAG, A4, 1.0, trace_requests=REQ,
                                              objective="max-throughput").to_dict())
    yield "infeasible", _json(scepsy.plan(RAG, A4, 500, trace_requests=REQ).to_dict())
    yield "unplaced", _json(scepsy.plan(RAG_BEAM, A16, 2.8, trace_requests=REQ,
                                        formulation="aggregate", max_rounds=1).to_dict())


def test_every_writer_output_validates(racks, tmp_path):
    seen = set()
    for kind, d in [*_variants(), ("racks", racks[1])]:
        _schema_valid(d)
        pd = parse_plan(d, kind)
        seen.add(d["status"])
        if pd.placement is not None and pd.placement.placed:
            _check_launch_view(launch_plan(pd, kind), d)
            continue
        with pytest.raises(InputError) as e:
            launch_plan(pd, f"{kind}.json")
        msg = str(e.value)
        assert msg.startswith(f"{kind}.json: status: expected a placed plan; this plan is "
                              f"{d['status']} (")
        assert "re-run `scepsy plan`" in msg
        assert (d["placement"]["reason"] or d["infeasible"]["detail"]) in msg
        assert "allocation" not in d and d["launch"]["models"] == {} and d["devices"]
    assert {"optimal", "infeasible", "unplaced"} <= seen


# ----------------------------------------------------------------------------- round trips


def test_round_trip_plan_write_load(placed, tmp_path):
    path = tmp_path / "plan.json"
    placed.write(path)
    lp = load_plan(path)
    d = json.loads(path.read_text())
    _check_launch_view(lp, d)
    assert len(lp.replicas) == sum(r["replicas"] for r in d["llms"].values())
    assert set(lp.nodes) == {"A100-80GB-0", "A100-80GB-1"}
    assert lp.engine.command == ("vllm", "serve") and lp.engine.base_port == 8000
    assert lp.address("A100-80GB-0") == "A100-80GB-0"


def test_racks_cluster_round_trip(racks, tmp_path):
    res, d = racks
    path = tmp_path / "plan.json"
    write_plan(path, d)
    lp = load_plan(path)
    _check_launch_view(lp, d)
    assert set(lp.nodes) == {"dgx-0", "dgx-1", "dgx-2", "dgx-3", "hgx-0", "hgx-1"}
    assert lp.nodes["hgx-1"] == "H100-80GB" and lp.devices["H100-80GB"].memory_gib == 79.65
    assert {r.node for r in lp.replicas} <= set(lp.nodes)
    # without the topology section the pools name other nodes: the loader says which is missing
    bare = _json(plan_document(res.problem, res.placed, policy=res.placer, timings=False))
    assert "topology" not in bare
    with pytest.raises(InputError, match=r"placement\.instances\[\d+\]\.node: .*no `topology`"):
        parse_launch_plan(bare, "bare.json")


def test_edited_launch_section_reaches_the_launch_view(doc):
    d = copy.deepcopy(doc)
    node = d["placement"]["instances"][0]["node"]
    d["launch"].update(command=["python", "-m", "vllm.entrypoints.openai.api_server", "--model"],
                       args=["--enforce-eager"], env={"VLLM_LOGGING_LEVEL": "DEBUG"},
                       base_port=9100, health_timeout_s=60, addresses={node: "10.0.0.7"})
    d["launch"]["models"]["generator"] = {"serve": "/models/qwen 7b", "args": ["--seed", "1"],
                                          "env": {"HF_HUB_OFFLINE": "1"}}
    _schema_valid(d)
    lp = parse_launch_plan(d, "edited.json")
    assert lp.engine.command[-1] == "--model" and lp.engine.args == ("--enforce-eager",)
    assert dict(lp.engine.env) == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert lp.engine.health_timeout_s == 60 and lp.address(node) == "10.0.0.7"
    g = lp.models["generator"]
    assert (g.serve, g.args, dict(g.env)) == ("/models/qwen 7b", ("--seed", "1"),
                                               {"HF_HUB_OFFLINE": "1"})
    assert min(r.port for r in lp.replicas) == 9100
    _check_launch_view(lp, d)
    # optional fields of the launch section may be left out
    for k in ("args", "env", "addresses"):
        del d["launch"][k]
    assert parse_launch_plan(d, "short.json").addresses == {}


# ------------------------------------------------------------------------------- mutations


def _resolve(schema: dict[str, Any], node: dict[str, Any], value: Any) -> dict[str, Any]:
    """``node`` with ``$ref`` followed and the ``anyOf`` branch for ``value``'s JSON type."""
    while True:
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        elif "anyOf" in node:
            want = ("object" if isinstance(value, dict) else "array" if isinstance(value, list)
                    else None)
            node = next((b for b in node["anyOf"] if want is None or
                         _resolve(schema, b, value).get("type") == want), node["anyOf"][0])
        else:
            return node


def _child(schema: dict[str, Any], node: dict[str, Any], key: Any) -> dict[str, Any]:
    if isinstance(key, int):
        prefix = node.get("prefixItems")
        return prefix[key] if prefix else node.get("items", {})
    if key in node.get("properties", {}):
        return node["properties"][key]
    for sub in node.get("patternProperties", {}).values():
        return sub
    extra = node.get("additionalProperties", {})
    return extra if isinstance(extra, dict) else {}


def _walk(schema: dict[str, Any], node: dict[str, Any], value: Any, path: tuple[Any, ...]
          ) -> Iterator[tuple[tuple[Any, ...], dict[str, Any], Any]]:
    """Every (path, resolved schema, value) of the document below ``path``."""
    node = _resolve(schema, node, value)
    yield path, node, value
    items = (value.items() if isinstance(value, dict) else enumerate(value)
             if isinstance(value, list) else ())
    for k, v in items:
        yield from _walk(schema, _child(schema, node, k), v, (*path, k))


def _paths(d: dict[str, Any]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(required fields, typed scalar fields) of ``d`` by the exported schema."""
    schema = plan_json_schema()
    required, typed = [], []
    for path, node, value in _walk(schema, schema, d, ()):
        if isinstance(value, dict):
            required += [(*path, k) for k in node.get("required", ()) if k in value]
        elif not isinstance(value, list) and node and ("type" in node or "const" in node
                                                       or "enum" in node):
            typed.append(path)
    return required, typed


def _set(d: dict[str, Any], path: tuple[Any, ...], value: Any = ...) -> dict[str, Any]:
    out = copy.deepcopy(d)
    parent = out
    for k in path[:-1]:
        parent = parent[k]
    if value is ...:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(map(str, path))


def test_dropping_any_required_field_names_it(racks):
    d = racks[1]  # the racks plan: every section, the topology included
    required, _ = _paths(d)
    assert len(required) > 100 and ("launch", "models", "generator", "serve") in required
    assert ("placement", "instances", 0, "gpus") in required
    assert ("topology", "racks", 1, "nodes", 1, "in_use", 0, "share") in required
    for path in required:
        bad = _set(d, path)
        with pytest.raises(InputError) as e:
            parse_plan(bad, "p.json")
        assert _field(e.value) == _dotted(path), (path, str(e.value))
        assert str(e.value).startswith("p.json: ")
        assert _schema_rejects(bad), path


def test_mistyping_any_typed_field_names_it(racks):
    d = racks[1]
    _, typed = _paths(d)
    assert len(typed) > 100 and ("launch", "base_port") in typed
    assert ("placement", "history", 0, "objective_s") not in typed  # diagnostics: free-form
    for path in typed:
        bad = _set(d, path, {"not": "this"})
        with pytest.raises(InputError) as e:
            parse_plan(bad, "p.json")
        assert _field(e.value) == _dotted(path), (path, str(e.value))
        assert _schema_rejects(bad), path


def _instance(d: dict[str, Any], llm: str, k: int = 0) -> int:
    return [i for i, x in enumerate(d["placement"]["instances"]) if x["llm"] == llm][k]


def _dup_replica(d: dict[str, Any]) -> tuple[Any, ...]:
    i, j = _instance(d, "generator", 0), _instance(d, "generator", 1)
    d["placement"]["instances"][j]["replica"] = d["placement"]["instances"][i]["replica"]
    return ("placement.instances", "exactly once")


def _gpu_out_of_range(d):
    i = _instance(d, "generator")
    d["placement"]["instances"][i]["gpus"][0] = 8
    return (f"placement.instances[{i}].gpus[0]", "0..7")


def _unknown_node(d):
    i = _instance(d, "prm")
    d["placement"]["instances"][i]["node"] = "nowhere"
    return (f"placement.instances[{i}].node", "a node of the cluster")


def _missing_launch_model(d):
    del d["launch"]["models"]["generator"]
    return ("launch.models", "one entry per LLM")


def _extra_launch_model(d):
    d["launch"]["models"]["ghost"] = {"serve": "x/y"}
    return ("launch.models.ghost", "one entry per LLM")


def _tp_mismatch(d):
    i = _instance(d, "generator")
    d["placement"]["instances"][i]["gpus"] = d["placement"]["instances"][i]["gpus"][:1]
    return (f"placement.instances[{i}].gpus", "4 GPU indices")


def _repeated_gpu(d):
    i = next(k for k, x in enumerate(d["placement"]["instances"]) if len(x["gpus"]) > 1)
    g = d["placement"]["instances"][i]["gpus"]
    d["placement"]["instances"][i]["gpus"] = [g[0]] * len(g)
    return (f"placement.instances[{i}].gpus", "distinct")


def _share_mismatch(d):
    i = _instance(d, "prm")
    d["placement"]["instances"][i]["share"] = 0.5
    return (f"placement.instances[{i}].share", "llms.prm.share")


def _unknown_llm(d):
    i = _instance(d, "prm")
    d["placement"]["instances"][i]["llm"] = "ghost"
    return (f"placement.instances[{i}].llm", "an LLM of `llms`")


def _missing_replica(d):
    del d["placement"]["instances"][_instance(d, "prm")]
    return ("placement.instances", f"replicas 0..{d['llms']['prm']['replicas'] - 1} of prm")


def _address_of_unknown_node(d):
    d["launch"]["addresses"] = {"nowhere": "10.0.0.1"}
    return ("launch.addresses.nowhere", "a node of the cluster")


def _allocation_disagrees(d):
    d["allocation"]["llms"]["prm"]["replicas"] += 1
    return ("allocation.llms.prm.replicas", "llms.prm.replicas")


def _workflow_calls_unknown_llm(d):
    d["workflows"]["rag"]["llms"].append("ghost")
    return ("workflows.rag.llms[3]", "an LLM of the plan")


def _unknown_device(d):
    d["devices"] = {"H100-80GB": {"kind": "cuda", "memory_gib": 80.0}}
    return ("cluster.pools[0].gpu", "a device type of `devices`")


def _memory_over_device(d):
    for x in d["placement"]["instances"]:
        x["memory_gib"] = 81.0
    return ("placement.instances[0].memory_gib", "at most the 80.0 GiB")


def _unknown_field(d):
    d["launch"]["base_prot"] = 8000
    return ("launch.base_prot", "unknown field")


def _env_name(d):
    d["launch"]["env"] = {"A B": "1"}
    return ("launch.env", "")


def _control_char(d):
    d["launch"]["command"] = ["vllm\nrm -rf /", "serve"]
    return ("launch.command[0]", "")


def _bad_kind(d):
    d["devices"]["A100-80GB"]["kind"] = "rocm"
    return ("devices.A100-80GB.kind", "'cuda' or 'cpu'")


def _port_overflow(d):
    d["launch"]["base_port"] = 65535
    return ("launch.base_port", "<= 65535")


def _bad_topology(d):
    d["topology"] = {"name": "t", "racks": [{"name": "r", "nodes": [
        {"name": "A100-80GB-0", "gpu": "A100-80GB", "gpus": 8, "nvlink_domain": 3}]}]}
    return ("topology.racks[0].nodes[0].nvlink_domain", "a divisor")


@pytest.mark.parametrize("version", [7, 0, "1", 1.0, True, None, ...])
def test_unknown_or_missing_version_is_rejected_first(doc, version):
    d = copy.deepcopy(doc)
    if version is ...:
        del d["version"]
    else:
        d["version"] = version
    del d["launch"]  # also malformed: the version is what is reported
    with pytest.raises(InputError) as e:
        parse_plan(d, "old.json")
    assert e.value.field == "version"
    msg = str(e.value)
    assert msg.startswith("old.json: version: expected plan format version 1")
    if version == 7:
        assert msg == "old.json: version: expected plan format version 1 (got 7)"
    if version is ...:
        assert "missing" in msg


def test_a_plan_that_is_not_a_mapping_is_rejected():
    with pytest.raises(InputError, match=r"x\.json: top level: expected a plan\.json mapping"):
        parse_plan([1, 2], "x.json")


@pytest.mark.parametrize("mutate", [
    _dup_replica, _gpu_out_of_range, _unknown_node, _missing_launch_model, _extra_launch_model,
    _tp_mismatch, _repeated_gpu, _share_mismatch, _unknown_llm, _missing_replica,
    _address_of_unknown_node, _allocation_disagrees, _workflow_calls_unknown_llm,
    _unknown_device, _memory_over_device, _unknown_field, _env_name, _control_char, _bad_kind,
    _port_overflow, _bad_topology], ids=lambda f: f.__name__.strip("_"))
def test_malformed_plans_name_the_field(doc, tmp_path, mutate):
    d = copy.deepcopy(doc)
    field, says = mutate(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(InputError) as e:
        load_plan(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {field}"), msg
    assert says in msg, msg



def test_check_command_validates_a_file(placed, tmp_path, capsys):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    placed.write(good)
    doc = json.loads(good.read_text())
    doc["version"] = 2
    bad.write_text(json.dumps(doc))
    assert main(["--check", str(good)]) == 0
    assert main(["--check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: version: expected plan format version 1 (got 2)" in err
