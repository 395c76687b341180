"""benchmarks/las_vs_fcfs.py: the quick run prints its table, writes its JSON, and compares the
two priorities on the same arrivals at the same load; the sweep's summary is the rows' per-seed
statistics averaged, and its ratios are paired per seed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import las_vs_fcfs  # noqa: E402


def test_quick_run_writes_both_priorities_at_every_load(tmp_path, capsys):
    out = tmp_path / "las.json"
    assert las_vs_fcfs.main(["--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "las/fcfs p90" in printed and "saturates at" in printed
    assert doc["saturation_rate"] > 0
    rows = doc["rows"]
    assert [(r["load"], r["priority"]) for r in rows] == [(1.0, "fcfs"), (1.0, "las")]
    fcfs, las = rows
    assert fcfs["arrivals"] == las["arrivals"] == las_vs_fcfs.QUICK["requests"]
    assert fcfs["total_rate"] == las["total_rate"]  # equal load
    for r in rows:
        assert r["unfinished"] == 0
        assert set(r["p90_latency_s"]) == {"rag", "beam_search"}
        assert all(math.isfinite(x) and x > 0 for x in r["p90_latency_s"].values())
        assert 0 < r["mean_all_s"] <= r["p90_all_s"]


def test_the_summary_averages_the_seeds_and_pairs_the_ratios(tmp_path, capsys):
    out = tmp_path / "las.json"
    assert las_vs_fcfs.main(["--quick", "--mix", "coding-chat", "--seeds", "0,3",
                             "--max-batch", "8", "--loads", "0.9,1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert "las/fcfs mean" in capsys.readouterr().out
    assert [h["mix"] for h in doc["mixes"]] == ["coding-chat"] and doc["max_batch"] == 8
    runs = {(r["load"], r["seed"], r["priority"]): r for r in doc["rows"]}
    assert len(runs) == 2 * 2 * 2 == len(doc["rows"])
    for r in doc["rows"]:
        assert r["unfinished"] == 0
        # the simulator's own per-workflow p90 (same warm-up) is the benchmark's
        for w, x in r["p90_latency_s"].items():
            assert math.isclose(r["latency_s"][w]["p90"], x, rel_tol=1e-9)
    summary = doc["summary"]
    assert {(s["load"], s["workflow"]) for s in summary} == {
        (ld, w) for ld in (0.9, 1.0) for w in ("chat", "coding_agent", "all")}
    for s in summary:
        assert s["seeds"] == [0, 3]
        for stat in las_vs_fcfs.STATS:
            f = [runs[(s["load"], k, "fcfs")]["latency_s"][s["workflow"]][stat] for k in (0, 3)]
            g = [runs[(s["load"], k, "las")]["latency_s"][s["workflow"]][stat] for k in (0, 3)]
            ratios = [b / a for a, b in zip(f, g, strict=True)]
            x = s[stat]
            assert math.isclose(x["fcfs"], sum(f) / 2, rel_tol=1e-12)
            assert math.isclose(x["las"], sum(g) / 2, rel_tol=1e-12)
            assert math.isclose(x["ratio"], sum(ratios) / 2, rel_tol=1e-12)
            assert x["ratio_min"] == min(ratios) and x["ratio_max"] == max(ratios)


@pytest.mark.parametrize("argv, flag", [(["--loads", "1,x"], "--loads"),
                                        (["--loads", "0"], "--loads"),
                                        (["--mix", "chat"], "--mix"),
                                        (["--seeds", "1,1"], "--seeds"),
                                        (["--seeds", "-1"], "--seeds"),
                                        (["--max-batch", "8,y"], "--max-batch"),
                                        (["--max-batch", "-8"], "--max-batch"),
                                        (["--requests", "0"], "--requests"),
                                        (["--workload", "/nonexistent.yaml"], "--workload")])
def test_bad_options_are_refused(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        las_vs_fcfs.main(["--quick", *argv])
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [(["--cpu-engine"], "--rate"),
                                        (["--cpu-engine", "--rate", "0"], "--rate"),
                                        (["--cpu-engine", "--rate", "1", "--max-batch", "4,8"],
                                         "--max-batch"),
                                        (["--rate", "1"], "--rate")])
def test_engine_options_are_checked_before_anything_starts(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        las_vs_fcfs.main(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.slow
def test_engine_run_drives_both_gateways_and_stops_its_server(tmp_path):
    """One real vLLM CPU server behind a FCFS and a LAS gateway: four drives in the ABBA
    order, every request completed, latencies in order, and the server's port free again."""
    import socket

    from scepsy_profile.profiling.backend import BackendUnavailable
    from scepsy_profile.profiling.engine_env import vllm_python

    try:
        vllm_python()
    except BackendUnavailable as exc:
        pytest.skip(f"no vLLM environment: {exc}")
    doc = las_vs_fcfs.engine_run(las_vs_fcfs.CPU_WORKLOAD, rate=1.0, requests=6,
                                 max_num_seqs=2, work=tmp_path)
    assert [(r["priority"], r["seed"]) for r in doc["runs"]] == list(las_vs_fcfs.ENGINE_ORDER)
    for r in doc["runs"]:
        assert r["failed"] == 0 and r["latency_s"]["all"]["n"] == 6
        x = r["latency_s"]["all"]
        assert 0 < x["p50"] <= x["p90"] <= x["p99"]
    with socket.socket() as s:  # nobody listens on the server's port any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its closed connections may
        s.bind(("127.0.0.1", doc["port"]))  # linger in TIME_WAIT; a listener would refuse this
        s.listen()
