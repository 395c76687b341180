"""benchmarks/search_time.py (section ``search`` of ``scepsy bench paper``): the quick sweep runs
and its rows keep the invariants of a correct comparison."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import search_time  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
SEED = 3  # an instance of this seed's quick sweep has a heuristic allocation that places


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> tuple[dict, Path, float]:
    out = tmp_path_factory.mktemp("search")
    res = search_time.run(quick=True, seed=SEED, out=out, jobs=1)
    return res, out, None


def test_the_quick_sweep_is_json_able(result):
    res, _, _ = result
    again = json.loads(json.dumps(res, allow_nan=False))
    assert again["rows"] and len(again["plans"]) == 2 * len(again["rows"])
    assert {(r["llms"], r["gpus"]) for r in res["rows"]} == set(search_time.points(search_time.QUICK))


def test_every_scepsy_plan_is_placed_with_a_known_status(result):
    res, _, _ = result
    for r in res["rows"]:
        assert r["scepsy_placed"] and r["scepsy_status"] in search_time.SCEPSY_STATUSES
        assert r["heuristic_status"] in search_time.HEURISTIC_STATUSES
        assert r["scepsy_s"] > 0 and r["heuristic_s"] > 0 and not r["errors"]
        # optimal means a proven gap (within 1e-6); a placed heuristic left nothing unplaced
        assert r["scepsy_status"] != "optimal" or r["scepsy_gap"] <= 1e-6
        assert r["heuristic_placed"] == (r["heuristic_unplaced_replicas"] == 0
                                         and r["heuristic_status"] == "placed")
    placed = {(r["llms"], r["gpus"]): r for r in res["rows"]}
    for p in res["plans"]:
        method, llms, _, _, gpus, _ = p["label"].split()
        assert p["placed"] == placed[int(llms), int(gpus)][f"{method}_placed"]
        assert method != "scepsy" or p["placed"]


def test_scepsy_is_within_its_gap_of_every_placed_heuristic_plan(result):
    """scepsy's bound holds for every placeable allocation of the candidate grid, the heuristic's
    included, so scepsy is no worse than the heuristic beyond its own proven gap."""
    res, _, _ = result
    both = [r for r in res["rows"] if r["scepsy_placed"] and r["heuristic_placed"]
            and r["scepsy_gap"] is not None]
    assert both  # the seed is chosen so that the comparison happens
    for r in both:
        assert r["scepsy_objective_s"] <= r["heuristic_objective_s"] * (1 + r["scepsy_gap"] + 1e-9)
        assert math.isclose(r["heuristic_ratio"],
                            r["heuristic_objective_s"] / r["scepsy_objective_s"], rel_tol=1e-12)


def test_the_figure_is_a_png(result):
    _, out, _ = result
    data = (out / search_time.FIGURE).read_bytes()
    assert len(data) > 1000 and data.startswith(PNG)
