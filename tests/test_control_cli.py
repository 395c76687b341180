"""``scepsy control`` (scepsy.cli_control, scepsy_place.control.live): bad inputs are one line
and exit 2 before anything runs; a --dry-run against a loopback fake gateway whose request
counter rises logs a scale-up decision and changes nothing, and SIGTERM ends it cleanly; the
live loop with a fake apply target applies the change (new routes, the controller's running
plan, its metrics); the controller's Prometheus metrics."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from conftest import REPO, run_cli
from fakes.control_gateway import FakeGateway
from scepsy_profile.profiling.server import parse_metrics

RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
A16 = str(REPO / "datasets" / "clusters" / "a100-16.yaml")
TRACE = ["--trace-requests", "300"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    """rag at 1 req/s, min-cost: one GPU of the 16, so there is room to scale up."""
    out = tmp_path_factory.mktemp("control") / "plan.json"
    code, _, err = run_cli("plan", "--workflow", RAG, "--cluster", A16, "--target", "1",
                           "--objective", "min-cost", "--out", str(out), *TRACE)
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def gateway():
    with FakeGateway() as gw:
        yield gw


def control(plan: Path, gateway_url: str, *extra: str) -> list[str]:
    return ["control", "--plan", str(plan), "--workflow", RAG, "--gateway", gateway_url,
            *TRACE, *extra]


def test_bad_inputs_are_one_line_exit_2(plan_file, gateway, tmp_path):
    doc = json.loads(plan_file.read_text())
    doc["placement"]["placed"] = False
    unplaced = tmp_path / "unplaced.json"
    unplaced.write_text(json.dumps(doc))
    log = tmp_path / "d.jsonl"
    cases = [
        (control(unplaced, gateway.base_url, "--log", str(log)), ["unplaced.json"]),
        (control(plan_file, "ftp://x", "--log", str(log)), ["--gateway"]),
        (control(plan_file, "http://127.0.0.1:1", "--log", str(log)),
         ["--gateway", "/scepsy/state"]),
        (control(plan_file, gateway.base_url, "--window", "0", "--log", str(log)),
         ["--window"]),
        (control(plan_file, gateway.base_url, "--window", "-3", "--log", str(log)),
         ["--window"]),
        (control(plan_file, gateway.base_url, "--startup-s", "nan", "--log", str(log)),
         ["--startup-s"]),
        (control(plan_file, gateway.base_url, "--metrics-listen", "nowhere", "--log",
                 str(log)), ["--metrics-listen"]),
        (control(plan_file, gateway.base_url, "--log", str(tmp_path)), ["--log"]),
        (control(plan_file, gateway.base_url, "--log", str(tmp_path / "no" / "d.jsonl")),
         ["--log"]),
    ]
    for argv, words in cases:
        code, _, err = run_cli(*argv)
        assert code == 2, (argv, err)
        assert len(err.strip().splitlines()) == 1, err
        assert all(w in err for w in words), (words, err)
    assert not log.exists()  # nothing written before the inputs were good
    assert gateway.routes is None


def _log_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_dry_run_logs_a_scale_up_and_sigterm_ends_it(plan_file, tmp_path):
    log = tmp_path / "decisions.jsonl"
    code = "import sys; from scepsy.cli import main; sys.exit(main(sys.argv[1:]))"
    with FakeGateway(per_second={"rag": 12.0}) as gw:  # planned for 1 req/s
        argv = control(plan_file, gw.base_url, "--dry-run", "--window", "1", "--startup-s", "2",
                       "--log", str(log), "--metrics-listen", "127.0.0.1:0")
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO / "src"),
                                              os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 240
            while not any(r.get("action") == "scale-up" for r in _log_rows(log)):
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "no scale-up decision in 240 s"
                time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert gw.routes is None  # a dry run re-routes nothing
    assert proc.returncode == 0, stderr
    assert "windows; decisions:" in stderr and "applied 0" in stderr
    rows = _log_rows(log)
    up = next(r for r in rows if r.get("kind") == "decision" and r["action"] == "scale-up")
    assert up["observed_rates"]["rag"] > 1.0 and up["reason"]
    assert up["predicted_now"] and up["predicted_after"]
    plans = [r for r in rows if r.get("kind") == "apply"]
    assert plans and all(r["step"] == "plan" and r["dry_run"] for r in plans)
    assert plans[0]["start"]  # what it would have started


class RecordingTarget:
    name = "fake"

    def __init__(self) -> None:
        self.started: list[int] = []
        self.stopped: list[int] = []

    def start(self, plan, r) -> None:
        self.started.append(r.port)

    def healthy(self, plan, r) -> bool:
        return True

    def url(self, plan, r) -> str:
        return f"http://127.0.0.1:{r.port}/v1"

    def stop(self, plan, r) -> None:
        self.stopped.append(r.port)


def test_the_live_loop_applies_a_scale_up(plan_file, tmp_path):
    from scepsy.cli_control import add_arguments, build
    from scepsy_place.control.core import ControlConfig, Controller
    from scepsy_place.control.live import ControlMetrics, control_loop

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(control(plan_file, "http://127.0.0.1:1")[1:])
    problem, topology, placed, launch = build(args)
    controller = Controller(problem, topology, placed, ControlConfig(window_s=1.0,
                                                                     startup_s=1.0))
    before = sum(i.replicas for i in controller.allocation.llms.values())
    target = RecordingTarget()
    metrics = ControlMetrics()
    rows: list[dict] = []

    async def main(url: str):
        stop = asyncio.Event()

        def decided(d):
            if d.action == "scale-up":
                asyncio.get_running_loop().call_later(3.0, stop.set)

        return await control_loop(controller, launch, target, url, window_s=1.0,
                                  log=rows.append, stop=stop, health_timeout_s=10,
                                  metrics=metrics, on_decision=decided)

    with FakeGateway(per_second={"rag": 12.0}) as gw:
        res = asyncio.run(asyncio.wait_for(main(gw.base_url), 240))
        routes = gw.routes
    assert res.applied >= 1 and res.moves > 0, rows
    after = sum(i.replicas for i in controller.allocation.llms.values())
    assert after > before  # the controller's running plan is the new one
    assert target.started and routes is not None
    urls = {e["url"] for llms in routes["workflows"].values() for eps in llms.values()
            for e in eps}
    assert {f"http://127.0.0.1:{port}/v1" for port in target.started} <= urls
    steps = [r["step"] for r in rows if r.get("kind") == "apply"]
    assert steps.index("routes") > steps.index("healthy")
    snap = parse_metrics(generate_latest(metrics.registry).decode())
    assert snap.value("scepsy_control_moves_total") == res.moves
    assert snap.value("scepsy_control_decisions_total") == res.windows
    assert snap.value("scepsy_control_replicas") == after
    assert snap.value("scepsy_control_forecast_rate") > 1.0
