"""The profile store: JSON lines that survive a kill, bad lines reported by number and the rest
kept, one sweep at a time (a lock), and the measurements and catalog that fitting reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scepsy_common.errors import InputError
from scepsy_profile.catalog import default_catalog
from scepsy_profile.measurements import check_instance
from scepsy_profile.profiling.models import engine_model
from scepsy_profile.profiling.records import ProfileRecord
from scepsy_profile.profiling.store import (
    ProfileStore,
    StoreContents,
    StoreLockedError,
    encode_record,
    finished,
    read_store,
    store_measurements,
)

MODEL = engine_model("llama-2-7b", 0.05)


def rec(batch: int = 1, tokens: int = 16, *, status: str = "ok", tp: int = 1,
        share: float = 1.0, phase: str = "decode", device: str = "cpu",
        latency_ms: float = 2.5, **kw: object) -> ProfileRecord:
    measured = ({"latency_ms": latency_ms, "iqr_ms": 0.1, "samples_ms": (2.4, 2.5, 2.6),
                 "method": "test"} if status == "ok" else {"error": "out of memory"})
    fields = {"engine": "fake", "engine_version": "1.0", "model": MODEL.name,
              "scale": MODEL.scale, "config": MODEL.config(), "device": device, "tp": tp,
              "share": share, "phase": phase, "batch": batch, "tokens": tokens,
              "status": status, "elapsed_s": 0.25,
              "device_detail": {"memory_gib": 3.5, "count": 2, "kind": "cpu"},
              **measured, **kw}
    return ProfileRecord(**fields)  # type: ignore[arg-type]


def write(store: Path, *records: ProfileRecord) -> None:
    with ProfileStore(store) as s:
        for r in records:
            s.append(r)


# ------------------------------------------------------------------------------- round trip

def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    records = [rec(1), rec(4, status="failed"), rec(16, 512, phase="prefill", tp=2, share=0.5)]
    write(store, *records)
    got = read_store(store)
    assert got.records == tuple(records)
    assert got.problems == ()
    lines = store.read_text().splitlines(keepends=True)
    assert len(lines) == 3 and all(line.endswith("\n") for line in lines)
    assert all(list(json.loads(line)) == sorted(json.loads(line)) for line in lines)


def test_appends_after_reopening_and_reads_what_it_wrote(tmp_path: Path) -> None:
    store = tmp_path / "sub" / "p.jsonl"
    write(store, rec(1))
    with ProfileStore(store) as s:
        assert s.records == (rec(1),) and s.warnings == ()
        s.append(rec(2))
        assert s.contents().records == (rec(1), rec(2))
    assert read_store(store).records == (rec(1), rec(2))


def test_a_missing_store_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="existing, readable profile store"):
        read_store(tmp_path / "none.jsonl")


def test_a_record_the_reader_would_reject_is_never_written(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    bad = replace(rec(1), latency_ms=None)
    with ProfileStore(store) as s, pytest.raises(InputError, match="latency_ms and iqr_ms"):
        s.append(bad)
    assert store.read_text() == ""
    with pytest.raises(InputError, match="error and no latency_ms"):
        encode_record(replace(rec(1, status="failed"), error=""))


def test_a_store_that_cannot_be_written_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(InputError, match="can create and write"):
        ProfileStore(tmp_path / "dir.jsonl").__enter__()
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="can create and write"):
        ProfileStore(tmp_path / "file" / "p.jsonl").__enter__()


# ------------------------------------------------------------------------------- bad lines

def test_corrupt_lines_are_reported_by_number_and_the_rest_kept(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    good = [encode_record(rec(b)) for b in (1, 2, 3, 4)]
    bad_tp = json.loads(encode_record(rec(5)))
    bad_tp["tp"] = 0
    extra = {**json.loads(encode_record(rec(6))), "colour": "red"}
    store.write_text(good[0] + "{not json\n" + good[1] + json.dumps(bad_tp) + "\n"
                     + "\n" + "[1, 2]\n" + json.dumps(extra) + "\n" + good[2] + "\xff\n"
                     + good[3])
    got = read_store(store)
    assert got.records == (rec(1), rec(2), rec(3), rec(4))
    lines = [n for n, _ in got.problems]
    assert lines == [2, 4, 6, 7, 9]
    msgs = dict(got.problems)
    assert "JSON" in msgs[2]
    assert msgs[4].startswith("tp: expected a number >= 1")
    assert "JSON object" in msgs[6]
    assert msgs[7].startswith("colour: expected no such field")


def test_a_cut_off_last_line_is_a_problem_and_is_cut_when_opened_for_writing(
        tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    write(store, rec(1), rec(2))
    whole = store.read_bytes()
    partial = encode_record(rec(3))[:40]
    store.write_bytes(whole + partial.encode())
    got = read_store(store)
    assert got.records == (rec(1), rec(2))
    assert [n for n, _ in got.problems] == [3] and "no newline" in got.problems[0][1]
    with ProfileStore(store) as s:
        assert store.read_bytes() == whole
        assert len(s.warnings) == 1 and "line 3: cut off 40 bytes" in s.warnings[0]
        s.append(rec(3))
    got = read_store(store)
    assert got.records == (rec(1), rec(2), rec(3)) and got.problems == ()


def test_a_complete_line_without_its_newline_is_still_cut(tmp_path: Path) -> None:
    """A kill between the record and its newline: the point was not durable, so it is measured
    again rather than kept half-written."""
    store = tmp_path / "p.jsonl"
    store.write_text(encode_record(rec(1)) + encode_record(rec(2)).rstrip("\n"))
    assert [n for n, _ in read_store(store).problems] == [2]
    with ProfileStore(store) as s:
        assert s.records == (rec(1),)


def test_duplicates_keep_the_last_ok_and_are_reported(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    first, second = rec(1, latency_ms=2.0), rec(1, latency_ms=3.0)
    failed = rec(2, status="failed")
    retried = rec(2, latency_ms=4.0)
    late_failure = rec(1, status="failed")
    store.write_text("".join(encode_record(r) for r in
                             (first, failed, second, retried, late_failure)))
    got = read_store(store)
    assert got.records == (second, retried)
    assert [n for n, _ in got.problems] == [3, 5]
    assert "measured ok on line 1 (the last ok one is kept)" in got.problems[0][1]
    assert "measured ok on line 3 (ignored)" in got.problems[1][1]


def test_append_refuses_a_point_already_ok_but_retries_a_failed_one(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    with ProfileStore(store) as s:
        s.append(rec(1))
        s.append(rec(2, status="failed"))
        with pytest.raises(ValueError, match="already measured"):
            s.append(rec(1, latency_ms=9.0))
        with pytest.raises(ValueError, match="already measured"):
            s.append(rec(1, status="failed"))
        s.append(rec(2, status="failed"))  # a retry that failed again
        s.append(rec(2))
        assert s.records == (rec(1), rec(2))
    got = read_store(store)
    assert got.records == (rec(1), rec(2)) and got.problems == ()
    assert len(store.read_text().splitlines()) == 4


def test_a_failed_write_leaves_no_partial_line(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "p.jsonl"
    with ProfileStore(store) as s:
        s.append(rec(1))
        before = store.read_bytes()

        def broken(fd: int) -> None:
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as m:
            m.setattr(os, "fsync", broken)
            with pytest.raises(OSError, match="No space"):
                s.append(rec(2))
        assert store.read_bytes() == before
        assert s.records == (rec(1),)
        s.append(rec(2))
    assert read_store(store).records == (rec(1), rec(2))


def test_finished_skips_failed_points_unless_retrying() -> None:
    records = [rec(1), rec(2, status="failed")]
    assert finished(records, retry_failed=False) == {rec(1).key(), rec(2).key()}
    assert finished(records, retry_failed=True) == {rec(1).key()}


# ------------------------------------------------------------------------------- the lock

def test_a_second_opener_in_this_process_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    with ProfileStore(store):
        with pytest.raises(StoreLockedError, match=f"this process \\(pid {os.getpid()}\\)") as e:
            ProfileStore(store).__enter__()
        assert e.value.holder == os.getpid() and str(store) in str(e.value)
    with ProfileStore(store) as s:  # released on close
        s.append(rec(1))


_HOLDER = """
import sys, time
from scepsy_profile.profiling.store import ProfileStore
with ProfileStore(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_another_process_is_refused_and_its_kill_releases_the_lock(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, str(store)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        with pytest.raises(StoreLockedError, match=f"process {child.pid} holds its lock"), \
                ProfileStore(store):
            pass
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    lock = tmp_path / "p.jsonl.lock"
    assert lock.read_text().strip() == str(child.pid)  # stale: the holder never cleaned up
    with ProfileStore(store) as s:
        s.append(rec(1))
        assert lock.read_text().strip() == str(os.getpid())
    assert lock.read_text() == ""


# ------------------------------------------------------------------------------- measurements

def test_store_measurements_extends_the_catalog_with_the_shrunk_model_and_the_cpu() -> None:
    records = (rec(1), rec(2, tp=2, device_detail={"memory_gib": 5.0, "count": 1}),
               rec(3, status="failed"), rec(4, device="H200"))
    got = StoreContents("test.jsonl", records)
    measurements, catalog = store_measurements(got)
    assert [m.batch for m in measurements] == [1, 2, 4]
    m = measurements[0]
    assert (m.model, m.gpu, m.tp, m.latency_ms, m.source) == (
        "llama-2-7b:x0.05", "cpu", 1, 2.5, "fake 1.0")
    assert catalog.model("llama-2-7b:x0.05") == MODEL.model_spec()
    cpu = catalog.gpu("cpu")
    assert (cpu.memory_gib, cpu.nvlink_domain, cpu.bf16_tflops) == (5.0, 2, 1.0)
    assert catalog.gpu("H200") == default_catalog().gpu("H200")
    for m in measurements:
        check_instance(m.model, m.gpu, m.tp, "test", catalog=catalog)


def test_store_measurements_needs_the_memory_of_an_unknown_device() -> None:
    got = StoreContents("test.jsonl", (rec(1, device="mystery", device_detail={}),))
    with pytest.raises(InputError, match=r"device mystery: device_detail\.memory_gib"):
        store_measurements(got)


def test_store_measurements_refuses_two_architectures_under_one_name() -> None:
    other = {**MODEL.config(), "dtype": "float32"}
    got = StoreContents("test.jsonl", (rec(1), rec(2, config=other)))
    with pytest.raises(InputError, match="one architecture"):
        store_measurements(got)


TRACE_LINE = ('{"call_id": "c0", "end_s": 0.2, "input_tokens": 217, "llm": "rewriter", '
              '"output_tokens": 21, "parents": [], "request_id": "r0", "start_s": 0.0, '
              '"workflow": "rag"}\n')


@pytest.mark.parametrize("text", ["not a store\n", "hello", "# notes\n{\"a\": 1}\n", "  x\n",
                                  # JSON lines, but of something else: a trace, a cut-off tail
                                  TRACE_LINE * 3, '{"a": 1}\n{"b": 2', '[1, 2]\n'])
def test_a_file_that_is_no_store_is_refused_as_it_is(tmp_path: Path, text: str) -> None:
    # `profile run --out` naming some other file: nothing appended, nothing cut off, no lock
    # file left beside it
    path = tmp_path / "notes.txt"
    path.write_text(text)
    with pytest.raises(InputError, match="holds something else and was left as it is"), \
            ProfileStore(path):
        pass
    assert path.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_store_cut_short_at_its_first_record_is_still_a_store(tmp_path: Path) -> None:
    store = tmp_path / "p.jsonl"
    store.write_text(encode_record(rec(1))[:30])
    with ProfileStore(store) as s:
        assert s.records == () and store.read_bytes() == b""
