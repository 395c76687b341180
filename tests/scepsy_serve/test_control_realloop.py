"""``scepsy bench loop --control``: the latency per window of arrival (oracle: by hand), the
options' checks, the flags refused without --control, the gateway's routes, the report lines,
and (marked: vLLM on this CPU) the controlled loop for real: a load step, the controller's
decisions, every request accounted for, none failed because of a change, nothing left running."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bench_loop import _assert_nothing_left, _options, _vllm

from conftest import REPO, run_cli
from scepsy import api
from scepsy_common.errors import InputError
from scepsy_opt.workload import load_specs
from scepsy_serve.loop import bench_loop as bl
from scepsy_serve.loop.realloop import (
    GATEWAY_TRACE,
    ControlLoop,
    ControlRun,
    gateway_routes,
    latency_windows,
)


@dataclass(frozen=True)
class Outcome:
    arrival_s: float
    end_s: float | None
    failure: str | None = None


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 50), st.booleans()), min_size=1,
                max_size=60), st.sampled_from([1.0, 7.5, 10.0]))
@settings(max_examples=60, deadline=None)
def test_windows_by_arrival_against_a_hand_count(rows, window):
    outs = [Outcome(a, a + d, None if ok else "timeout") for a, d, ok in rows]
    ws = latency_windows(outs, window)
    assert sum(w.requests for w in ws) == len(outs)
    assert sum(w.failed for w in ws) == sum(1 for o in outs if o.failure)
    for w in ws:
        mine = [o for o in outs if w.start_s <= o.arrival_s < w.end_s]
        lat = [o.end_s - o.arrival_s for o in mine if o.failure is None]
        assert w.requests == len(mine)
        if lat:
            assert w.p90_s == pytest.approx(float(np.percentile(lat, 90)), abs=1e-9)
            assert w.p50_s <= w.p90_s + 1e-12
        else:
            assert w.p50_s is None and w.p90_s is None
    assert latency_windows([], window) == ()


@pytest.mark.parametrize("kw, field", [({"step_at_s": 0}, "step_at_s"),
                                       ({"window_s": math.nan}, "window_s"),
                                       ({"step_factor": -1}, "step_factor"),
                                       ({"startup_s": -1.0}, "startup_s"),
                                       ({"priority": "sjf"}, "priority")])
def test_bad_options_name_the_field(kw, field):
    with pytest.raises(InputError) as exc:
        ControlLoop(**kw)
    assert exc.value.field == field


@pytest.mark.parametrize("flag", [["--step-at", "30"], ["--priority", "las"],
                                  ["--window", "5"], ["--startup-s", "20"]])
def test_control_flags_need_control(flag, tmp_path):
    code, _out, err = run_cli("bench", "loop", *flag, "--out", str(tmp_path / "x"))
    assert code == 2 and "only with --control" in err and flag[0] in err
    assert not (tmp_path / "x").exists()


def test_every_llm_goes_to_the_gateway_under_its_own_name():
    with api.using_catalog(str(REPO / "datasets/catalogs/cpu-host.yaml")):
        specs = load_specs(str(REPO / "datasets/workflows/cpu-rag-beam.yaml"))
    routes = gateway_routes(specs, "http://127.0.0.1:9/")
    for s in specs:
        for m in s.llms:
            (e,) = routes.endpoints(s.name, m)
            assert (e.url, e.model, e.weight) == ("http://127.0.0.1:9/v1", m, 1.0)


def test_the_report_shows_the_changes_and_the_windows():
    run = ControlRun(60.0, 0.5, 1.5, 40.0, applied=1, moves=1, servers_started=1, log="c.jsonl",
                     retried=2,
                     decisions=[{"at_s": 10.0, "action": "keep", "reason": "calm"},
                                {"at_s": 70.0, "action": "scale-up", "reason": "busy"}],
                     windows=latency_windows([Outcome(1.0, 2.0), Outcome(12.0, 20.0)], 10.0))
    text = "\n".join(bl.control_lines(run.to_dict()))
    assert "from 0.5 to 1.5 req/s at 60 s" in text and "scale-up: busy" in text
    assert "calm" not in text and "0-10" in text and "10-20" in text
    assert "2 call(s) sent again after a lost connection" in text
    assert json.loads(json.dumps(run.to_dict()))["windows"][1]["p90_s"] == pytest.approx(8.0)


def _failed_calls(loop: Path, limit: int = 20) -> list[dict[str, object]]:
    """The gateway's failed calls (what failed, where and when), for a failure's message."""
    path = loop / GATEWAY_TRACE
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: r.get(k) for k in ("llm", "error", "start_s", "end_s", "request_id")}
            for r in rows if r.get("error")][:limit]


@pytest.mark.vllm
@pytest.mark.slow
def test_the_controlled_loop_on_this_cpu(tmp_path: Path) -> None:
    """Real servers behind the gateway, the load stepping up 5x at 30 s and staying there for
    about 2.5 minutes (longer than a replica's start-up, so the change completes before the drive
    ends; a change still starting when it ends is rolled back): the controller adds capacity
    (a scale-up applied), every request is completed or failed with none failed, and nothing
    of the run (the controller's servers included) is left running."""
    python = _vllm()
    opts = _options(tmp_path, None, engine_python=python, rate=None, load=0.03,
                    requests=375, call_timeout_s=120.0, health_timeout_s=600.0,
                    workflow=str(REPO / "datasets/workflows/cpu-beam-search.yaml"),
                    control=ControlLoop(step_at_s=30.0, step_factor=5.0, window_s=10.0))
    res = api.bench_loop(opts)
    drive = res.drive
    assert drive is not None
    assert drive["completed"] + drive["failed"] == drive["sent"] == 375
    assert drive["failed"] == 0, (drive["failures"], _failed_calls(tmp_path / "loop"))
    _assert_nothing_left(res)
    c = res.control
    assert c is not None and c["decisions"]
    assert any(d["action"] == "scale-up" for d in c["decisions"]), \
        [d["reason"] for d in c["decisions"]]
    log = [json.loads(line) for line in Path(c["log"]).read_text().splitlines()]
    # a change still starting when the drive ends is rolled back (interrupted): no other fails
    failed = [r for r in log if r["kind"] == "apply" and r["step"] == "failed"]
    assert c["applied"] >= 1 and c["failed_changes"] == len(failed)
    assert all(r.get("interrupted") for r in failed), failed
    assert sum(w["requests"] for w in c["windows"]) == 375
    steps = [r["step"] for r in log if r["kind"] == "apply"]
    assert steps.index("healthy") < steps.index("routes") < steps.index("drained")
