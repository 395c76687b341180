"""Allocation files and the predict / simulate command lines."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO
from scepsy.cli import main
from scepsy_common.errors import InputError
from scepsy_opt.allocation import Allocation, Instance, load_allocation, save_allocation

instances = st.builds(Instance, gpu=st.sampled_from(["A100-80GB", "H100-80GB"]),
                      tp=st.sampled_from([1, 2, 4, 8]),
                      share=st.sampled_from([0.1, 0.25, 0.5, 1.0]), replicas=st.integers(1, 64))


@settings(max_examples=30, deadline=None)
@given(llms=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=6), instances, min_size=1,
                            max_size=5), suffix=st.sampled_from([".yaml", ".json"]))
def test_round_trip_yaml_and_json(tmp_path_factory, llms, suffix):
    path = tmp_path_factory.mktemp("alloc") / f"a{suffix}"
    alloc = Allocation(llms)
    save_allocation(alloc, path)
    assert load_allocation(path) == alloc
    assert alloc.gpus() == pytest.approx(sum(i.replicas * i.tp * i.share for i in llms.values()))


@pytest.mark.parametrize(("text", "field"), [
    ("llms: {a: {gpu: A100-80GB, tp: 1, share: 1.5}}", "llms.a.share"),
    ("llms: {a: {gpu: A100-80GB, tp: 0, share: 0.5}}", "llms.a.tp"),
    ("llms: {a: {gpu: A100-80GB, tp: 1, share: 0.5, replicas: 2.5}}", "llms.a.replicas"),
    ("llms: {a: {gpu: A100-80GB, tp: 1, share: 0.5, colour: red}}", "llms.a.colour"),
    ("llms: {}", "llms"),
    ("llms: [", "valid YAML"),
])
def test_bad_allocation_files_name_the_field(tmp_path, text, field):
    path = tmp_path / "alloc.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_allocation(path)
    assert str(path) in str(err.value) and field in str(err.value)


ARGS = ["--workflow", str(REPO / "datasets/workflows/rag.yaml"), "--allocation",
        str(REPO / "datasets/allocations/rag-4gpu.yaml"), "--rate", "1.5", "--trace-requests", "150",
        "--json"]


def test_predict_and_simulate_print_the_documented_keys(capsys):
    assert main(["predict", *ARGS]) == 0
    pred = json.loads(capsys.readouterr().out)["workflows"]["rag"]
    assert {"throughput", "mean_latency_s", "max_throughput"} <= set(pred)
    assert pred["throughput"] == pytest.approx(min(1.5, pred["max_throughput"]))
    assert main(["simulate", *ARGS, "--requests", "300"]) == 0
    sim = json.loads(capsys.readouterr().out)["workflows"]["rag"]
    assert {"throughput", "mean_latency_s"} <= set(sim)
    assert sim["completed"] + sim["unfinished"] == 300
    # below saturation the two agree to within a generous factor
    assert 0.5 < pred["mean_latency_s"] / sim["mean_latency_s"] < 2.0


def test_predict_with_a_bad_allocation_exits_2(tmp_path, capsys):
    bad = tmp_path / "a.yaml"
    bad.write_text("llms: {rewriter: {gpu: A100-80GB, tp: 1, share: 0.5}}")
    args = [a if a != str(REPO / "datasets/allocations/rag-4gpu.yaml") else str(bad) for a in ARGS]
    assert main(["predict", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scepsy: error:") and "llms.generator" in err
    assert main(["simulate", *ARGS[:4], "--rate=-1"]) == 2
    assert "--rate" in capsys.readouterr().err
