"""Topology files (racks and pools formats), their errors and the optimiser's view."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scepsy_common.errors import InputError
from scepsy_opt.cluster import load_cluster
from scepsy_place import (
    Node,
    Topology,
    from_cluster,
    load_topology,
    parse_topology,
    topology_to_dict,
)

REPO = Path(__file__).resolve().parents[2]
CLUSTERS = REPO / "datasets" / "clusters"


@pytest.mark.parametrize("name", ["a100-16", "a100-4", "mixed-h100-a100"])
def test_pools_format_serves_both(name):
    path = CLUSTERS / f"{name}.yaml"
    top, cl = load_topology(path), load_cluster(path)
    assert top.budgets() == cl.budgets()
    assert top.to_cluster() == cl
    for gpu in cl.budgets():
        assert top.max_tp(gpu) == cl.max_tp(gpu)
    assert all(n.name.startswith(n.gpu + "-") and n.rack.startswith("pool-") for n in top.nodes)
    assert from_cluster(cl) == top


def test_racks_example():
    top = load_topology(CLUSTERS / "racks-a100-h100.yaml")
    assert [n.name for n in top.nodes] == ["dgx-0", "dgx-1", "dgx-2", "dgx-3", "hgx-0", "hgx-1"]
    assert top.racks() == {"rack-a": ("dgx-0", "dgx-1", "dgx-2", "dgx-3"),
                           "rack-b": ("hgx-0", "hgx-1")}
    assert top.budgets() == {"A100-80GB": 32, "H100-80GB": 16}
    assert top.free_budgets()["H100-80GB"] == pytest.approx(14.5)
    h = top.node("hgx-1")
    assert h.used[0] == (0.5, 40.0) and h.used[1][0] == 1.0 and h.free_units(2) == 1000
    assert [list(r) for r in h.domains()] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # a 4-GPU domain inside an 8-GPU H100 node: the optimiser sees 4-GPU pool nodes
    cl = top.to_cluster()
    assert cl.budgets() == top.budgets() and cl.max_tp("H100-80GB") == 4
    assert cl.max_tp("A100-80GB") == 8
    assert parse_topology(topology_to_dict(top), "round trip") == top


def test_nvl72_is_one_node():
    top = load_topology(CLUSTERS / "racks-gb200-nvl72.yaml")
    assert top.max_tp("GB200") == 72 and top.to_cluster().max_tp("GB200") == 72


def test_default_domain_divides():
    top = parse_topology({"name": "t", "racks": [{"name": "r", "nodes": [
        {"name": "a", "gpu": "A100-80GB", "gpus": 12}, {"name": "b", "gpu": "L4", "gpus": 4},
        {"name": "c", "gpu": "a100-80gb", "gpus": 6}]}]}, "t.yaml")
    assert [n.nvlink_domain for n in top.nodes] == [6, 1, 6]
    assert top.node("c").gpu == "A100-80GB"  # catalog name, case-insensitive lookup


def _write(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "topo.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def _node(**kw):
    return {"name": "n", "gpu": "A100-80GB", "gpus": 4, **kw}


@pytest.mark.parametrize(("nodes", "field", "words"), [
    ([_node(gpu="Z100")], "racks[0].nodes[0].gpu", "GPU type of the catalog"),
    ([_node(nvlink_domain=3)], "racks[0].nodes[0].nvlink_domain", "divisor"),
    ([_node(nvlink_domain=8)], "racks[0].nodes[0].nvlink_domain", "never spans"),
    ([_node(in_use=[{"gpu": 4, "share": 0.5}])], "racks[0].nodes[0].in_use[0].gpu", "0..3"),
    ([_node(in_use=[{"gpu": 1, "share": 0.5}, {"gpu": 1, "share": 0.6}])],
     "racks[0].nodes[0].in_use[1].share", "at most 1"),
    ([_node(in_use=[{"gpu": 1, "share": 0.5, "memory_gib": 90}])],
     "racks[0].nodes[0].in_use[0].memory_gib", "80"),
    ([_node(), _node()], "racks[0].nodes[1].name", "used once"),
    ([_node(count=2), _node(name="n-1")], "racks[0].nodes[1].name", "used once"),
    ([_node(gpus=0)], "racks[0].nodes[0].gpus", ">= 1"),
    ([_node(colour="red")], "racks[0].nodes[0].colour", "unknown field"),
    ([], "racks[0].nodes", "at least 1 item"),
])
def test_errors_name_file_and_field(tmp_path, nodes, field, words):
    path = _write(tmp_path, {"name": "t", "racks": [{"name": "r", "nodes": nodes}]})
    with pytest.raises(InputError) as exc:
        load_topology(path)
    assert exc.value.source == str(path)
    assert exc.value.field == field
    assert words in str(exc.value)


@pytest.mark.parametrize(("doc", "field"), [
    ({"name": "t", "racks": []}, "racks"),
    ({"name": "t"}, "racks"),
    ({"name": "t", "racks": [{"name": "r", "nodes": [_node()]}, {"name": "r", "nodes": [
        _node(name="m")]}]}, "racks[1].name"),
    ({"name": "t", "racks": [{"name": "r", "nodes": [_node()]}], "x": 1}, "x"),
    ({"name": "t", "pools": [{"gpu": "Z", "nodes": 1, "gpus_per_node": 8}]}, "pools[0].gpu"),
])
def test_document_errors(tmp_path, doc, field):
    path = _write(tmp_path, doc)
    with pytest.raises(InputError) as exc:
        load_topology(path)
    assert exc.value.source == str(path) and exc.value.field == field


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(InputError, match="topology or cluster file"):
        load_topology(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [\n")
    with pytest.raises(InputError) as exc:
        load_topology(bad)
    assert exc.value.source == str(bad)


def test_node_and_topology_checks():
    with pytest.raises(InputError, match="nvlink_domain"):
        Node("a", "r", "A100-80GB", 8, 3, 80.0)
    with pytest.raises(InputError, match="used"):
        Node("a", "r", "A100-80GB", 2, 2, 80.0, used=((0.5, 1.0),))
    with pytest.raises(InputError, match="share"):
        Node("a", "r", "A100-80GB", 1, 1, 80.0, used=((1.2, 1.0),))
    n = Node("a", "r", "A100-80GB", 2, 2, 80.0)
    with pytest.raises(InputError, match="used once"):
        Topology("t", (n, n))
    with pytest.raises(InputError, match="at least one node"):
        Topology("t", ())
    assert n.used == ((0.0, 0.0), (0.0, 0.0)) and not n.busy


def test_canonical_node_order_ignores_input_order():
    """Larger nodes first, then content, then the rack's content, then names: the same order
    from every input order."""
    import itertools

    from scepsy_place import Node, Topology

    nodes = [Node("c", "r0", "A100-80GB", 2, 2, 80.0), Node("a", "r0", "A100-80GB", 8, 8, 80.0),
             Node("b", "r1", "A100-80GB", 2, 2, 80.0), Node("d", "r1", "A100-80GB", 2, 1, 80.0)]
    orders = {tuple(n.name for n in Topology("t", perm).canonical_nodes())
              for perm in itertools.permutations(nodes)}
    # d (one-GPU domains) sorts before b and c; b's rack (2-GPU nodes only) before c's
    assert orders == {("a", "d", "b", "c")}
