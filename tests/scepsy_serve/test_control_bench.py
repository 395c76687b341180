"""``scepsy bench control`` at a tiny size (scepsy_serve.control.bench): the JSON's keys and
types, nothing lost by the drain-based policies, static-peak's GPU-hours at least static-mean's,
and the same seed giving the same bytes."""

from __future__ import annotations

import json
from functools import cache

from scepsy_serve.control.bench import POLICIES, BenchOptions, run

TINY = BenchOptions(workflow="rag-beam", gpus=8, profiles=("daily",), windows=6, window_s=30.0,
                    startup_s=30.0, trace_requests=60, priority=False)
KEYS = {"p90_latency_s": float, "slo_attainment": float, "gpu_hours": float, "moves": int,
        "lost_requests": int}


@cache
def _result() -> str:
    return json.dumps(run(TINY), sort_keys=True, allow_nan=False)


def test_the_json_has_every_policy_and_metric():
    res = json.loads(_result())
    assert set(res["policies"]) == set(POLICIES)
    for row in res["policies"].values():
        assert set(row) == set(KEYS)
        for k, t in KEYS.items():
            assert isinstance(row[k], t) or (t is float and isinstance(row[k], int)), (k, row)
        assert 0.0 <= row["slo_attainment"] <= 1.0 and row["gpu_hours"] > 0
    assert set(res["forecast"]["daily"]) == {"holt", "last", "auto", "holt_at_horizon",
                                             "last_at_horizon", "auto_at_horizon", "horizon"}
    assert len(res["profiles"]["daily"]["decisions"]) == TINY.windows


def test_static_peak_costs_at_least_static_mean_and_static_policies_do_not_move():
    pol = json.loads(_result())["policies"]
    assert pol["static-peak"]["gpu_hours"] >= pol["static-mean"]["gpu_hours"] - 1e-9
    assert pol["static-peak"]["moves"] == pol["static-mean"]["moves"] == 0
    assert pol["static-peak"]["lost_requests"] == 0


def test_the_same_seed_gives_the_same_bytes():
    assert json.dumps(run(TINY), sort_keys=True, allow_nan=False) == _result()
