"""The sweep runner's control flow, with a fake backend and planner (``_sweep_child.py`` beside
this file): every point once, resumed after a stop of any kind (budget, Ctrl-C, SIGKILL of the process), failed
points recorded and retried on request, instances the backend cannot run skipped with a reason."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from _sweep_child import (
    MODEL,
    FakeBackend,
    FakeClock,
    FakeSpec,
    fake_next_points,
    latency_ms,
    lattice,
    sweep,
)

from scepsy_common.errors import InputError
from scepsy_profile.profiling import planner
from scepsy_profile.profiling.backend import (
    BackendOptions,
    BackendUnavailable,
    MeasurementError,
    StepPoint,
)
from scepsy_profile.profiling.records import ProfileRecord
from scepsy_profile.profiling.store import (
    ProfileStore,
    StoreLockedError,
    encode_record,
    read_store,
)
from scepsy_profile.profiling.sweep import SkippedInstance, run_sweep

CHILD = Path(__file__).with_name("_sweep_child.py")
SPEC = FakeSpec()
ALL = {(p.tp, p.share, p.step.phase, p.step.batch, p.step.tokens) for p in lattice(SPEC)}


def points(records: tuple[ProfileRecord, ...] | list[ProfileRecord],
           status: str | None = None) -> set[tuple[int, float, str, int, int]]:
    return {(r.tp, r.share, r.phase, r.batch, r.tokens) for r in records
            if status is None or r.status == status}


# ------------------------------------------------------------------------------- one sweep

def test_a_sweep_measures_every_point_once_in_one_session_at_a_time(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    backend = FakeBackend()
    result = sweep(str(store), backend)
    assert result.stopped == "done" and result.device == "cpu" and result.resumed == 0
    assert len(result.records) == len(ALL) == 48
    assert points(result.ok) == ALL and result.failed == () and result.skipped == ()
    assert len(backend.measured) == 48
    assert backend.max_open == 1 and backend.open_now == 0
    assert read_store(store).records == result.records
    r = result.records[0]
    assert (r.engine, r.engine_version, r.model, r.scale, r.config) == (
        "fake", "0.0-test", "llama-2-7b", 0.05, MODEL.config())
    assert r.device_detail == {"cores": 2, "model": "fake cpu", "kind": "cpu",
                               "memory_gib": 3.5, "count": 2}
    for r in result.records:
        assert r.latency_ms == pytest.approx(
            latency_ms(r.tp, r.share, StepPoint(r.phase, r.batch, r.tokens)))
        assert r.method == "fake" and len(r.samples_ms) == 3


def test_a_finished_sweep_measures_nothing_again(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    sweep(str(store), FakeBackend())
    before = store.read_bytes()
    again = FakeBackend()
    result = sweep(str(store), again)
    assert result.stopped == "done" and result.records == () and result.resumed == 48
    assert again.measured == [] and len(again.opened) == 1  # one session: to learn the device
    assert store.read_bytes() == before


def test_progress_is_reported_after_every_record(tmp_path: Path) -> None:
    calls: list[tuple[int, int, ProfileRecord]] = []
    result = sweep(str(tmp_path / "p.jsonl"), FakeBackend(),
                   on_progress=lambda d, t, r: calls.append((d, t, r)))
    assert [d for d, _, _ in calls] == list(range(1, 49))
    assert all(t >= d for d, t, _ in calls)
    assert tuple(r for _, _, r in calls) == result.records


def test_another_device_is_another_sweep(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    sweep(str(store), FakeBackend(device="cpu"))
    result = sweep(str(store), FakeBackend(device="H200"))
    assert len(result.records) == 48 and {r.device for r in result.records} == {"H200"}


# ------------------------------------------------------------------------------- failures

def test_failed_points_are_recorded_and_skipped_on_resume(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    fail = {(4, 32): MeasurementError("out of memory at batch 4"),
            (16, 128): ZeroDivisionError("division by zero")}
    result = sweep(str(store), FakeBackend(fail=fail))
    assert result.stopped == "done"
    failed = {(r.batch, r.tokens): r.error for r in result.failed}
    assert failed == {(4, 32): "out of memory at batch 4",
                      (16, 128): "ZeroDivisionError: division by zero"}
    assert len(result.failed) == 16 and len(result.ok) == 32
    assert all(r.latency_ms is None for r in result.failed)

    again = FakeBackend()
    assert sweep(str(store), again).records == () and again.measured == []

    still_failing = FakeBackend(fail={(4, 32): MeasurementError("out of memory again")})
    result = sweep(str(store), still_failing, retry_failed=True)
    assert len(still_failing.measured) == 16  # each failed point once, not in a loop
    assert len(result.failed) == 8 and len(result.ok) == 8

    fixed = FakeBackend()
    result = sweep(str(store), fixed, retry_failed=True)
    assert points(result.records) == {p for p in ALL if p[3:] == (4, 32)}
    assert points(result.ok) == points(result.records)
    got = read_store(store)
    assert points(got.records, "ok") == ALL and got.problems == ()


# ------------------------------------------------------------------------------- instances

def test_unsupported_instances_are_skipped_with_their_reason(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    backend = FakeBackend(unsupported_instances={(2, 0.5): "share < 1 needs an MPS daemon"})
    result = sweep(str(store), backend)
    assert result.skipped == (SkippedInstance(2, 0.5, "share < 1 needs an MPS daemon"),)
    assert points(result.ok) == {p for p in ALL if p[:2] != (2, 0.5)}
    assert result.failed == () and (2, 0.5) not in backend.opened


def test_an_instance_whose_engine_does_not_start_is_skipped(tmp_path: Path) -> None:
    backend = FakeBackend(broken_instances={
        (1, 0.5): RuntimeError("engine died"), (2, 1.0): BackendUnavailable("tp 2 needs 2 GPUs")})
    result = sweep(str(tmp_path / "p.jsonl"), backend)
    assert result.stopped == "done"
    assert {(s.tp, s.share): s.reason for s in result.skipped} == {
        (1, 0.5): "the engine did not start: RuntimeError: engine died",
        (2, 1.0): "tp 2 needs 2 GPUs"}
    assert {p[:2] for p in points(result.ok)} == {(1, 1.0), (2, 0.5)}
    assert result.failed == ()


def test_nothing_runs_when_no_instance_is_supported(tmp_path: Path) -> None:
    backend = FakeBackend(unsupported_instances={(1, 1.0): "no"})
    result = sweep(str(tmp_path / "p.jsonl"), backend, FakeSpec(tps=(1,), shares=(1.0,)))
    assert (result.stopped, result.device, result.records) == ("done", None, ())
    assert result.skipped == (SkippedInstance(1, 1.0, "no"),)


def test_a_planner_that_forgets_what_is_done_cannot_make_a_point_measured_twice(
        tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    sweep(str(store), FakeBackend())
    backend = FakeBackend()
    forgetful = run_sweep(backend, MODEL, SPEC, store, BackendOptions(), round_points=5,
                          next_points=lambda spec, done, budget_points: lattice(spec)[:5])
    assert forgetful.stopped == "done" and forgetful.records == () and backend.measured == []


def test_the_open_session_serves_the_next_round_first(tmp_path: Path) -> None:
    """A planner that asks for one point of every instance per round: each round starts with the
    instance whose session is still open, so a round restarts three engines, not four."""
    def one_each(spec: FakeSpec, done: object, budget_points: int) -> list:
        todo = fake_next_points(spec, done, budget_points=10**6)  # type: ignore[arg-type]
        return list({(p.tp, p.share): p for p in reversed(todo)}.values())[::-1]

    backend = FakeBackend()
    result = run_sweep(backend, MODEL, SPEC, tmp_path / "p.jsonl", BackendOptions(),
                       next_points=one_each)
    assert points(result.ok) == ALL
    rounds = 12  # points per instance
    assert len(backend.opened) == 4 + 3 * (rounds - 1)
    assert backend.max_open == 1


# ------------------------------------------------------------------------------- stops

def test_the_budget_stops_before_a_point_that_would_overrun_it(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    clock = FakeClock()
    result = sweep(str(store), FakeBackend(clock=clock, point_cost_s=1.0), budget_s=5.5,
                   clock=clock)
    # after 5 points: 5 s spent + 1 s expected for the next > 5.5 s
    assert result.stopped == "budget" and len(result.records) == 5
    assert all(r.elapsed_s == 1.0 for r in result.records)
    rest = sweep(str(store), FakeBackend())
    assert rest.stopped == "done" and rest.resumed == 5
    assert points(result.records) | points(rest.records) == ALL
    assert not points(result.records) & points(rest.records)


def test_ctrl_c_closes_the_session_and_keeps_what_was_recorded(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    backend = FakeBackend(fail={(16, 32): KeyboardInterrupt()})
    result = sweep(str(store), backend)
    assert result.stopped == "interrupted"
    assert backend.open_now == 0
    assert 0 < len(result.records) < 48
    assert read_store(store).records == result.records
    rest = sweep(str(store), FakeBackend())  # the lock was released
    assert points(result.records) | points(rest.records) == ALL


def test_a_store_another_sweep_holds_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    backend = FakeBackend()
    with ProfileStore(store), pytest.raises(StoreLockedError):
        sweep(str(store), backend)
    assert backend.opened == []


def test_a_store_with_the_model_at_another_architecture_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    sweep(str(store), FakeBackend(), FakeSpec(tps=(1,), shares=(1.0,)))
    lines = store.read_text().splitlines()
    other = json.loads(lines[0])
    other["config"]["dtype"] = "float32"
    store.write_text(json.dumps(other) + "\n")
    with pytest.raises(InputError, match="another config"):
        sweep(str(store), FakeBackend())


def test_bad_arguments_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="budget_s"):
        sweep(str(tmp_path / "p.jsonl"), FakeBackend(), budget_s=-1.0)
    with pytest.raises(InputError, match="round_points"):
        sweep(str(tmp_path / "p.jsonl"), FakeBackend(), round_points=0)


# ------------------------------------------------------------------------------- kill -9

def _lines(store: Path) -> int:
    return store.read_bytes().count(b"\n") if store.exists() else 0


def test_a_sweep_killed_three_times_ends_with_the_uninterrupted_records(tmp_path: Path) -> None:
    store = tmp_path / "killed.jsonl"
    rng = random.Random(12)
    for threshold in (6, 18, 30):
        child = subprocess.Popen([sys.executable, str(CHILD), str(store), "0.05"],
                                 start_new_session=True, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while _lines(store) < threshold and child.poll() is None:
                assert time.monotonic() < deadline, "the child sweep made no progress"
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.06))  # anywhere inside a point, or its write
        finally:
            child.kill()
            child.wait(timeout=30)
        assert child.returncode == -9  # killed mid-sweep, not finished
        assert threshold <= len(read_store(store).records) < 48
    final = sweep(str(store), FakeBackend())
    assert final.stopped == "done" and final.resumed + len(final.records) == 48
    reference = sweep(str(tmp_path / "reference.jsonl"), FakeBackend())
    got = read_store(store)
    assert got.problems == ()
    assert {r.key() for r in got.records} == {r.key() for r in reference.records}
    raw = [json.loads(line) for line in store.read_text().splitlines()]
    keys = Counter(tuple(r[k] for k in ("tp", "share", "phase", "batch", "tokens")) for r in raw)
    assert len(keys) == 48 and set(keys.values()) == {1}  # no point written twice


# ------------------------------------------------------------------------------- the planner

def test_the_real_planner_drives_a_sweep_to_its_end(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    spec = planner.SweepSpec(tps=(1,), shares=(1.0,), max_batch=16, max_tokens=256,
                             target_error=0.05)
    result = run_sweep(FakeBackend(), MODEL, spec, store, BackendOptions())
    assert result.stopped == "done" and result.ok
    assert len({r.key() for r in result.records}) == len(result.records)
    again = run_sweep(FakeBackend(), MODEL, spec, store, BackendOptions())
    assert again.records == () and again.resumed == len(result.records)


def test_the_real_planner_with_an_unsupported_share_keeps_to_max_points(tmp_path: Path) -> None:
    """Asked per TP degree when an instance is skipped, the planner's point cap still holds for
    the whole sweep."""
    store = tmp_path / "p.jsonl"
    spec = planner.SweepSpec(tps=(1, 2), shares=(0.5, 1.0), max_batch=8, max_tokens=128,
                             max_points=30)
    backend = FakeBackend(unsupported_instances={(2, 0.5): "no MPS daemon"})
    result = run_sweep(backend, MODEL, spec, store, BackendOptions(), round_points=7)
    assert result.stopped == "done" and len(result.records) == 30
    instances = {(r.tp, r.share) for r in result.records}
    assert (2, 0.5) not in instances and {tp for tp, _ in instances} == {1, 2}
    again = run_sweep(FakeBackend(unsupported_instances={(2, 0.5): "no MPS daemon"}), MODEL,
                      spec, store, BackendOptions(), round_points=7)
    assert again.records == () and again.resumed == 30


def test_encode_record_round_trips_what_the_runner_writes(tmp_path: Path) -> None:
    result = sweep(str(tmp_path / "p.jsonl"), FakeBackend(), FakeSpec(tps=(1,), shares=(1.0,)))
    lines = (tmp_path / "p.jsonl").read_text().splitlines(keepends=True)
    assert lines == [encode_record(r) for r in result.records]
