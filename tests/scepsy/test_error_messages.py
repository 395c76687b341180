"""Errors name the file or flag, the field, what was expected and what to do: ``--current``
of other workflows, ``replan --cluster`` other than the plan's, ``report --out`` on a symbolic
link, and ``stats`` on a trace whose calls all failed."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, run_cli

D = REPO / "datasets"
RAG = str(D / "workflows" / "rag.yaml")
A100_16 = str(D / "clusters" / "a100-16.yaml")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    code, _, err = run_cli("plan", "--workflow", RAG, "--cluster", A100_16, "--target", "0.3",
                           "--trace-requests", "100", "--quiet", "--out", str(out))
    assert code == 0, err
    return out


def test_current_of_other_workflows_names_the_file_and_flag(tmp_path):
    current = str(D / "allocations" / "rag-beam-16gpu.yaml")
    code, _, err = run_cli("plan", "--workflow", RAG, "--cluster", A100_16, "--target", "0.3",
                           "--trace-requests", "100", "--quiet", "--current", current,
                           "--out", str(tmp_path / "p.json"))
    assert code == 2, err
    assert f"{current} (--current): llms." in err and "expected an LLM of the workflows" in err


def test_replan_on_another_cluster_names_the_flag_and_the_plan(plan_file, tmp_path):
    doc = json.loads(plan_file.read_text())
    assert max(g for i in doc["placement"]["instances"] for g in i["gpus"]) > 3
    code, _, err = run_cli("replan", "--plan", str(plan_file), "--workflow", RAG, "--cluster",
                           str(D / "clusters" / "a100-4.yaml"), "--event", "load=rag*1.1",
                           "--out", str(tmp_path / "r.json"))
    assert code == 2 and err.count("\n") == 1, err
    assert "--cluster: expected the cluster" in err and str(plan_file) in err
    assert "omit --cluster" in err and "a100-4.yaml" in err


def test_report_out_on_a_link_says_it_is_a_link(plan_file, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    code, _, err = run_cli("report", str(plan_file), "--out", str(tmp_path / "link"))
    assert code == 2 and "a symbolic link" in err and "'a file'" not in err, err
    assert "(real)" in err
    assert not list((tmp_path / "real").iterdir())


def test_stats_on_a_trace_whose_calls_all_failed_names_the_file(tmp_path):
    lines = (D / "traces" / "rag-50.jsonl").read_text().splitlines()
    calls = [json.loads(x) for x in lines if x.strip()]
    for c in calls:
        c["error"] = "upstream_503"
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in calls))
    code, _, err = run_cli("stats", str(path))
    assert code == 2, err
    assert err.startswith(f"scepsy: error: {path}: workflow: ") and "failed" in err, err
