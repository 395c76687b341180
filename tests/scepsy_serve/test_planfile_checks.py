"""plan.json edits that the per-row checks let through (issue 29, third round): a GPU
over-committed by its replicas together (shares above 1, memory beyond the device's), two
nodes at one address, and targets that are no throughput.

Oracles: the per-GPU sums computed here from the edited rows (in thousandths of a GPU, as the
planner counts shares), the routes a launch writes (one URL per replica), and the plan request's
rule for a target (> 0 and finite).
"""

from __future__ import annotations

import copy
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scepsy
from conftest import run_cli
from scepsy_common.errors import InputError
from scepsy_opt.planning.planfile import dumps
from scepsy_serve.launch.planfile import load_plan, main, parse_plan

REPO = Path(__file__).resolve().parents[2]
RAG_BEAM = str(REPO / "datasets" / "workflows" / "rag-beam.yaml")
A16 = str(REPO / "datasets" / "clusters" / "a100-16.yaml")
CAP_GIB = 80.0  # an A100-80GB's memory, as the plan's `devices` says


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    res = scepsy.plan(RAG_BEAM, A16, 0.6, trace_requests=300)
    d = json.loads(dumps(res.to_dict(timings=False)))
    assert d["devices"]["A100-80GB"]["memory_gib"] == CAP_GIB
    return d


def _loads(d: dict[str, Any]) -> dict[tuple[str, int], tuple[int, float]]:
    """Per (node, GPU): thousandths of its compute and GiB of its memory the rows take."""
    out: dict[tuple[str, int], tuple[int, float]] = defaultdict(lambda: (0, 0.0))
    for x in d["placement"]["instances"]:
        for g in x["gpus"]:
            u, m = out[(x["node"], g)]
            out[(x["node"], g)] = (u + math.ceil(x["share"] * 1000 - 1e-6), m + x["memory_gib"])
    return out


def _over(d: dict[str, Any]) -> list[tuple[str, int]]:
    return [k for k, (u, m) in sorted(_loads(d).items()) if u > 1000 or m > CAP_GIB + 1e-6]


def _onto_prm_gpu(d: dict[str, Any]) -> None:
    """The red team's edit: a reranker replica (0.1, 8 GiB) onto a GPU that prm (0.9) and
    another replica already fill."""
    rows = d["placement"]["instances"]
    prm = next(x for x in rows if x["llm"] == "prm")
    k = next(i for i, x in enumerate(rows) if x["llm"] == "reranker")
    rows[k]["node"], rows[k]["gpus"] = prm["node"], [prm["gpus"][0]]


def test_the_red_team_plan_is_over_committed(doc):
    d = copy.deepcopy(doc)
    assert _over(d) == []  # the planner's own plan fits
    _onto_prm_gpu(d)
    assert _over(d), "the edit over-commits a GPU"


def test_shares_above_one_on_a_gpu_are_refused_naming_node_gpu_and_sum(doc, tmp_path):
    d = copy.deepcopy(doc)
    _onto_prm_gpu(d)
    node, gpu = _over(d)[0]
    path = tmp_path / "overshare.json"
    path.write_text(json.dumps(d))
    with pytest.raises(InputError) as e:
        load_plan(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: placement.instances (node {node}, GPU {gpu})"), msg
    assert "shares sum to 1.1 > 1" in msg and "reranker[" in msg and "prm[" in msg, msg
    assert main(["--check", str(path)]) == 2
    code, _, err = run_cli("launch", "--target", "shell", "--out", str(tmp_path / "L"),
                           str(path))
    assert code == 2 and "shares sum to 1.1 > 1" in err and "Traceback" not in err, err
    assert not (tmp_path / "L").exists()


def test_memory_beyond_the_device_on_a_gpu_is_refused(doc):
    d = copy.deepcopy(doc)
    rows = d["placement"]["instances"]
    # generator's two replicas share node 0's GPUs at 0.5 each: 44 GiB each is within the
    # device row by row, 88 GiB together
    for x in rows:
        if x["llm"] == "generator" and x["node"] == rows[0]["node"]:
            x["memory_gib"] = 44.0
    assert _over(d)
    with pytest.raises(InputError) as e:
        parse_plan(d, "p.json")
    assert "memory 88 GiB > 80 GiB" in str(e.value), str(e.value)
    assert e.value.field.startswith(f"placement.instances (node {rows[0]['node']}, GPU ")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_moved_replica_is_accepted_exactly_when_every_gpu_stays_within_capacity(doc, data):
    """Move any replica to any GPUs of any node: the loader accepts the plan if and only if no
    GPU's shares sum above 1 and no GPU's memory exceeds 80 GiB (the sums computed here)."""
    d = copy.deepcopy(doc)
    rows = d["placement"]["instances"]
    k = data.draw(st.integers(0, len(rows) - 1), label="row")
    node = data.draw(st.sampled_from(["A100-80GB-0", "A100-80GB-1"]), label="node")
    gpus = data.draw(st.permutations(range(8)), label="gpus")[:len(rows[k]["gpus"])]
    rows[k]["node"], rows[k]["gpus"] = node, list(gpus)
    over = _over(d)
    if over:
        with pytest.raises(InputError) as e:
            parse_plan(d, "p.json")
        assert e.value.field == f"placement.instances (node {over[0][0]}, GPU {over[0][1]})"
    else:
        parse_plan(d, "p.json")


@pytest.mark.parametrize(("addresses", "field", "twin"), [
    ({"A100-80GB-0": "127.0.0.1", "A100-80GB-1": "127.0.0.1"}, "A100-80GB-1", "A100-80GB-0"),
    ({"A100-80GB-0": "fd00::1", "A100-80GB-1": "fd00:0:0::1"}, "A100-80GB-1", "A100-80GB-0"),
    ({"A100-80GB-0": "Host.example", "A100-80GB-1": "host.EXAMPLE"}, "A100-80GB-1",
     "A100-80GB-0"),
    ({"A100-80GB-0": "A100-80GB-1"}, "A100-80GB-0", "A100-80GB-1"),  # the other's default
    ({"A100-80GB-1": "A100-80GB-0"}, "A100-80GB-1", "A100-80GB-0"),
], ids=["same-ip", "same-ipv6-spelled-otherwise", "host-name-case", "earlier-takes-name",
        "later-takes-name"])
def test_two_nodes_at_one_address_are_refused_naming_both(doc, addresses, field, twin):
    d = copy.deepcopy(doc)
    d["launch"]["addresses"] = addresses
    with pytest.raises(InputError) as e:
        parse_plan(d, "p.json")
    assert e.value.field == f"launch.addresses.{field}", str(e.value)
    assert f"node {twin} is at" in str(e.value), str(e.value)


def test_distinct_addresses_give_every_replica_its_own_url(doc, tmp_path):
    d = copy.deepcopy(doc)
    d["launch"]["addresses"] = {"A100-80GB-0": "10.0.0.1", "A100-80GB-1": "10.0.0.2"}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    code, _, err = run_cli("launch", "--target", "shell", "--out", str(tmp_path / "L"), str(path))
    assert code == 0, err
    routes = json.loads((tmp_path / "L" / "routes.json").read_text())
    urls = {(r["model"], r["replica"]): r["url"] for wf in routes["workflows"].values()
            for rs in wf.values() for r in rs}
    assert len(urls) == len(d["placement"]["instances"])
    assert len(set(urls.values())) == len(urls)  # one URL per replica


@pytest.mark.parametrize("target", [-1.0, 0.0, -0.0, math.inf, math.nan])
def test_a_target_that_is_no_throughput_is_refused(doc, tmp_path, target):
    d = copy.deepcopy(doc)
    d["targets"]["rag"] = target
    with pytest.raises(InputError) as e:
        parse_plan(d, "p.json")
    assert e.value.field == "targets.rag", str(e.value)
    if target == -1.0:
        path = tmp_path / "neg.json"
        path.write_text(json.dumps(d))
        assert main(["--check", str(path)]) == 2
        code, _, err = run_cli("report", str(path), "--out", str(tmp_path / "R"))
        assert code == 2 and "targets.rag" in err, err
        assert not (tmp_path / "R").exists()
