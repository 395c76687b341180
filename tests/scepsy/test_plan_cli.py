"""`scepsy plan`: the table, plan.json, determinism, infeasibility reports and input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scepsy.cli import main
from scepsy_common.units import UNITS
from scepsy_opt.allocation import load_allocation
from scepsy_opt.cluster import load_cluster

REPO = Path(__file__).resolve().parents[2]
RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
A4 = str(REPO / "datasets" / "clusters" / "a100-4.yaml")
FAST = ["--trace-requests", "200"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_writes_a_plan_that_meets_the_target(capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, text, _ = run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target", "3",
                        "--out", str(out), *FAST)
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["status"] == "optimal" and doc["solver"]["gap"] == 0.0
    used = sum(i["tp"] * i["share"] * i["replicas"] for i in doc["allocation"]["llms"].values())
    assert used <= 4 + 1e-9
    assert doc["workflows"]["rag"]["throughput"] == 3.0
    assert doc["solver"]["candidates_kept"] <= doc["solver"]["candidates_generated"]
    for name, row in doc["llms"].items():  # every LLM in the table
        assert name in text and row["gpu"] == "A100-80GB"
    # the allocation round-trips through `scepsy predict`
    code, ptext, _ = run(capsys, "predict", "--workflow", RAG, "--allocation", str(out),
                         "--rate", "3", "--json", *FAST)
    pred = json.loads(ptext)
    assert code == 0
    assert pred["workflows"]["rag"]["mean_latency_s"] == pytest.approx(
        doc["workflows"]["rag"]["mean_latency_s"], rel=1e-9)
    assert load_allocation(out).gpus() == pytest.approx(used)


def test_plan_json_is_byte_identical_without_timings(capsys, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for p in (a, b):
        assert run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target", "2",
                   "--out", str(p), "--no-timings", *FAST)[0] == 0
    assert a.read_bytes() == b.read_bytes()
    assert "timings" not in json.loads(a.read_text())


def test_more_gpus_never_worse(capsys, tmp_path):
    objs = []
    for cl in ("a100-4.yaml", "a100-16.yaml"):
        out = tmp_path / f"{cl}.json"
        assert run(capsys, "plan", "--workflow", RAG, "--cluster",
                   str(REPO / "datasets" / "clusters" / cl), "--target", "3", "--out", str(out),
                   *FAST)[0] == 0
        objs.append(json.loads(out.read_text())["solver"]["objective_s"])
    assert objs[1] <= objs[0] * (1 + 1e-12)


def test_infeasible_target_reports_the_reachable_throughput(capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target", "500",
                       "--out", str(out), *FAST)
    assert code == 1 and "infeasible" in err and "bounded by" in err
    doc = json.loads(out.read_text())
    inf = doc["infeasible"]
    assert doc["status"] == "infeasible" and inf["reason"] == "gpus"
    assert 0 < inf["max_scale"] < 1 and inf["binding"] == ["A100-80GB"]
    reach = inf["max_throughput"]["rag"]
    assert reach == pytest.approx(500 * inf["max_scale"])
    # just below the reported maximum a plan exists; well above it, none
    ok = tmp_path / "ok.json"
    assert run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target",
               f"{0.99 * reach}", "--out", str(ok), *FAST)[0] == 0
    assert run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target",
               f"{1.05 * reach}", "--out", str(ok), *FAST)[0] == 1


def test_model_that_fits_nowhere_is_a_memory_report(capsys, tmp_path):
    wf = tmp_path / "big.yaml"
    wf.write_text(Path(RAG).read_text().replace("qwen2.5-7b", "llama-3-70b"))
    cl = tmp_path / "l4.yaml"
    cl.write_text("name: one-l4\npools:\n  - {gpu: L4, nodes: 1, gpus_per_node: 1}\n")
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", "--workflow", str(wf), "--cluster", str(cl), "--target",
                       "1", "--out", str(out), *FAST)
    assert code == 1 and "fits on no GPU" in err
    assert json.loads(out.read_text())["infeasible"]["reason"] == "memory"


@pytest.mark.parametrize(("args", "needle"), [
    (["--target", "0"], "--target"),
    (["--target", "-3"], "--target"),
    (["--target", "nope=3"], "nope"),
    (["--target", "rag=abc"], "--target"),
    (["--target", "1", "--optimiser", "magic"], "optimiser"),
    (["--target", "1", "--max-utilisation", "1.5"], "--max-utilisation"),
    (["--target", "1", "--shares", "0,2"], "--shares"),
])
def test_bad_flags_are_one_line_errors(capsys, tmp_path, args, needle):
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--out", str(out),
                       *args, *FAST)
    assert code == 2 and needle in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize(("text", "field"), [
    ("name: x\npools: []\n", "pools"),
    ("name: x\npools:\n  - {gpu: A100-80GB, nodes: 0, gpus_per_node: 8}\n", "nodes"),
    ("name: x\npools:\n  - {gpu: TPU-v5, nodes: 1, gpus_per_node: 8}\n", "gpu"),
    ("name: x\npools:\n  - {gpu: A100-80GB, nodes: 1, gpus_per_node: 8, colour: red}\n", "colour"),
    ("pools: [\n", "line"),
])
def test_bad_cluster_files_name_file_and_field(capsys, tmp_path, text, field):
    cl = tmp_path / "cluster.yaml"
    cl.write_text(text)
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", "--workflow", RAG, "--cluster", str(cl), "--target", "1",
                       "--out", str(out), *FAST)
    assert code == 2 and "cluster.yaml" in err and field in err
    assert not out.exists()


def test_cluster_budgets_and_tp_limits():
    cl = load_cluster(REPO / "datasets" / "clusters" / "mixed-h100-a100.yaml")
    assert cl.budgets() == {"A100-80GB": 16, "H100-80GB": 8}
    assert cl.max_tp("A100-80GB") == 8 and cl.total_gpus == 24
    assert UNITS == 1000


def test_unknown_llm_in_the_current_allocation_is_a_clear_error(capsys, tmp_path):
    cur = tmp_path / "current.yaml"
    cur.write_text("llms:\n  summariser: {gpu: A100-80GB, tp: 1, share: 0.5, replicas: 1}\n")
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target", "1",
                       "--current", str(cur), "--change-penalty", "1", "--out", str(out), *FAST)
    assert code == 2 and "summariser" in err and "current allocation" in err
    assert not out.exists()


def test_replanning_from_the_plan_keeps_it(capsys, tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target", "2",
               "--out", str(first), *FAST)[0] == 0
    # a slightly higher target that the current plan still carries: a large penalty keeps it
    assert run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target", "2.05",
               "--current", str(first), "--change-penalty", "100", "--out", str(second),
               *FAST)[0] == 0
    a, b = (json.loads(p.read_text())["allocation"] for p in (first, second))
    assert a == b


def test_plan_json_places_every_replica(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target", "3",
               "--out", str(out), *FAST)[0] == 0
    doc = json.loads(out.read_text())
    pl = doc["placement"]
    assert pl["placed"] and pl["rounds"] >= 1 and pl["unplaced"] == []
    want = {(m, r) for m, i in doc["allocation"]["llms"].items() for r in range(i["replicas"])}
    assert {(x["llm"], x["replica"]) for x in pl["instances"]} == want
    per_gpu: dict[tuple[str, int], float] = {}
    for x in pl["instances"]:
        inst = doc["allocation"]["llms"][x["llm"]]
        assert len(x["gpus"]) == inst["tp"] and x["share"] == inst["share"]
        for g in x["gpus"]:
            per_gpu[(x["node"], g)] = per_gpu.get((x["node"], g), 0.0) + x["share"]
    assert max(per_gpu.values()) <= 1 + 1e-9
    assert pl["quality"]["gpus_used"] >= pl["quality"]["bound_l2"]


def test_unknown_placer_is_a_clear_error(capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target", "1",
                       "--placer", "tetris", "--out", str(out), *FAST)
    assert code == 2 and "--placer" in err and not out.exists()


def test_bench_openb_replays_a_tiny_trace(capsys, tiny_openb):
    nodes, pods = tiny_openb
    code, out, _ = run(capsys, "bench", "openb", "--nodes", str(nodes), "--pods", str(pods),
                       "--policy", "best-fit,fgd", "--json")
    assert code == 0
    doc = json.loads(out)
    text = json.dumps(doc)
    assert "best-fit" in text and "fgd" in text and "alloc_ratio" in text


def test_bench_openb_bad_file_is_exit_2(capsys, tmp_path):
    code, _, err = run(capsys, "bench", "openb", "--nodes", str(tmp_path / "missing.csv"),
                       "--pods", str(tmp_path / "missing.csv"))
    assert code == 2 and "missing.csv" in err


@pytest.mark.parametrize(("extra", "flag"), [
    # the formulations other than the aggregate loop are MILPs of their own
    (("--optimiser", "heuristic", "--formulation", "blocks"), "--formulation"),
    (("--optimiser", "independent", "--formulation", "patterns"), "--formulation"),
    # the improvement phase and its repackings are the hierarchical placer's
    (("--placer", "ffd", "--repack", "2"), "--repack"),
    (("--placer", "best-fit", "--no-improve"), "--no-improve"),
])
def test_options_another_choice_would_ignore_are_refused(capsys, tmp_path, extra, flag):
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target", "1",
                       "--trace-requests", "50", "--out", str(out), *extra)
    assert code == 2 and err.count(flag) >= 1 and "Traceback" not in err, err
    assert not out.exists()  # refused before anything is written
    # the same choices without the option they cannot use plan
    kept = [a for a in extra if a not in (flag, "2", "blocks", "patterns")]
    code, _, err = run(capsys, "plan", "--workflow", RAG, "--cluster", A4, "--target", "1",
                       "--trace-requests", "50", "--out", str(out), *kept)
    assert code == 0, err
