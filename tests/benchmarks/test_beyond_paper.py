"""The "beyond the paper" section (benchmarks/beyond_paper.py) in its quick mode: a heterogeneous
fleet planned, then re-planned after a load change, a node failure and a rack drain.

Only invariants that must hold on any machine: every plan placed, every replica accounted for
before and after each event, nothing on a removed node, the new targets carried, latencies
positive and finite and never below the from-scratch plan's proven bound, a non-empty figure,
and the same bytes for the same seed apart from the timing fields.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # the beyond-the-paper section, quick: about 40 s

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
REL = 1e-6  # relative slack for float comparisons of objectives and bounds


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("beyond_paper", BENCH / "beyond_paper.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("beyond_paper", mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _module()


@pytest.fixture(scope="module")
def result(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("beyond")
    res = bench.run(quick=True, seed=0, out=out, jobs=1)
    res["_out"] = str(out)
    return res


def _event(result: dict[str, Any], label: str) -> dict[str, Any]:
    (e,) = [e for e in result["events"] if e["event"] == label]
    return e


def test_every_plan_is_placed(bench: ModuleType, result: dict[str, Any]) -> None:
    labels = [p["label"] for p in result["plans"]]
    assert labels[0] == "initial" and len(set(labels)) == len(labels)
    assert len(result["events"]) == 3
    assert len(labels) == 1 + 2 * 3 + len(bench.LOW_PENALTIES_S)
    for p in result["plans"]:
        assert p["placed"] and p["status"] == "placed", p
        assert p["replicas"] > 0 and 0 < p["gpus_used"] <= result["gpus"]
        if p["bound_s"] is not None:  # a proven lower bound never exceeds the plan's objective
            assert p["bound_s"] <= p["objective_s"] * (1 + REL)


def test_replicas_are_accounted_for(result: dict[str, Any]) -> None:
    before = next(p["replicas"] for p in result["plans"] if p["label"] == "initial")
    for e in result["events"]:
        assert e["replicas_before"] == before
        assert e["kept"] + e["moved"] + e["started"] == e["replicas_after"]
        assert e["kept"] + e["moved"] + e["stopped"] + e["lost"] == e["replicas_before"]
        # the same counts from the two other views: the allocation and the placement
        assert sum(row["after"]["replicas"] for row in e["per_llm"].values()
                   if row["after"]) == e["replicas_after"]
        assert sum(e["replicas_per_node"].values()) == e["replicas_after"]
        for kind in ("kept", "moved", "started", "stopped", "lost"):
            assert sum(row[kind] for row in e["per_llm"].values()) == e[kind]
        before = e["replicas_after"]
    plans = {p["label"]: p for p in result["plans"]}
    first = result["events"][0]
    for x in result["penalty_sensitivity"]:  # the first event again, lower change penalties
        label = f"after {x['event']}, change penalty {x['change_penalty_s']:g} s"
        assert x["kept"] + x["moved"] + x["started"] == plans[label]["replicas"]
        assert x["kept"] + x["moved"] + x["stopped"] == first["replicas_before"]  # none lost


def test_nothing_runs_on_removed_nodes(result: dict[str, Any]) -> None:
    failure = _event(result, "node failure")
    (node,) = failure["failed_nodes"]
    assert failure["lost"] > 0  # the node chosen ran replicas
    assert failure["gpus_available_after"] == result["gpus"] - 8
    later = result["events"][result["events"].index(failure):]
    for e in later:
        assert node not in e["replicas_per_node"]
    drain = _event(result, "rack drain")
    assert drain["specs"] == ["rack-drained=rack-l4"]
    assert not any(n.startswith("l4-") for n in drain["replicas_per_node"])


def test_load_change_carries_the_new_targets(result: dict[str, Any]) -> None:
    e = _event(result, "load change")
    factors = {}
    for spec in e["specs"]:
        wf, f = spec.removeprefix("load=").split("*")
        factors[wf] = float(f)
    assert sorted(factors.values()) == [0.5, 2.0, 2.0]
    assert set(e["targets_after"]) == set(e["targets_before"])
    for wf, old in e["targets_before"].items():
        assert e["targets_after"][wf] == pytest.approx(old * factors.get(wf, 1.0), rel=REL)
    for later in result["events"][1:]:  # later events keep the changed targets
        assert later["targets_after"] == e["targets_after"]


def test_latencies_are_positive_finite_and_above_the_bound(result: dict[str, Any]) -> None:
    plans = {p["label"]: p for p in result["plans"]}
    for e in result["events"]:
        for key in ("latency_before_s", "latency_after_s", "latency_ideal_s"):
            assert set(e[key]) == set(e["targets_after"])
            assert all(math.isfinite(x) and x > 0 for x in e[key].values()), (e["event"], key)
        bound = plans[f"ideal after {e['event']}"]["bound_s"]
        # the re-plan is a placeable allocation for the same targets and nodes, so its latency
        # sum is at least the from-scratch plan's proven lower bound
        assert bound is not None and e["latency_sum_after_s"] >= bound * (1 - REL)
        assert e["latency_sum_ideal_s"] >= bound * (1 - REL)
        assert e["latency_sum_after_s"] == pytest.approx(sum(e["latency_after_s"].values()),
                                                         rel=REL)


def test_simulations_match_the_plans_that_run(result: dict[str, Any]) -> None:
    sims = result["simulated"]
    assert [s["state"] for s in sims] == ["initial", *(e["event"] for e in result["events"])]
    predicted = [result["events"][0]["latency_before_s"],
                 *(e["latency_after_s"] for e in result["events"])]
    for sim, pred in zip(sims, predicted, strict=True):
        assert sim["requests"] == result["sim_requests"] and sim["llm_calls"] > 0
        assert {w: x["predicted_s"] for w, x in sim["workflows"].items()} == pred
        for x in sim["workflows"].values():
            assert math.isfinite(x["simulated_s"]) and x["simulated_s"] > 0
            assert x["error"] == pytest.approx(x["predicted_s"] / x["simulated_s"] - 1, abs=1e-5)


def test_figure_is_a_non_empty_png(result: dict[str, Any]) -> None:
    png = Path(result["_out"]) / result["figure"]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_same_seed_same_bytes(bench: ModuleType, result: dict[str, Any],
                              tmp_path: Path) -> None:
    again = bench.run(quick=True, seed=0, out=tmp_path, jobs=1)
    first = {k: v for k, v in result.items() if k != "_out"}

    def dump(doc: dict[str, Any]) -> str:
        return json.dumps(bench.without_timings(doc), sort_keys=True)

    assert dump(first) == dump(again)
    assert "seconds" not in dump(first) and "cpu_s" not in dump(first)
