"""Recorded traces in every format ``load_recorded`` reads (scepsy_opt.arrivals,
docs/bench-control.md): seconds per line, Mooncake JSON lines and CSV with a timestamp column
and token counts; generated files read back to the times and lengths written, and bad files
named by file, line and field (exit 2 on the command line, nothing written)."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_cli
from scepsy_common.errors import InputError
from scepsy_opt.arrivals import load_arrivals, load_recorded

TIMES = st.lists(st.integers(0, 10**9), min_size=1, max_size=40)  # milliseconds
TOKENS = st.integers(1, 200_000)


def _expected(ms: list[int], *cols: list[int]):
    """Times (s) from 0 and the columns, sorted by time (stably, as the reader does)."""
    order = np.argsort(np.array(ms, dtype=float), kind="stable")
    t = np.array(ms, dtype=float)[order] / 1e3
    return (t - t[0], *[np.array(c, dtype=float)[order] for c in cols])


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_mooncake_json_lines_round_trip(tmp_path_factory, data):
    ms = data.draw(TIMES)
    ins = data.draw(st.lists(TOKENS, min_size=len(ms), max_size=len(ms)))
    outs = data.draw(st.lists(TOKENS, min_size=len(ms), max_size=len(ms)))
    p = tmp_path_factory.mktemp("a") / "trace.jsonl"
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o,
                                     "hash_ids": [1, 2]}) + "\n"
                         for t, i, o in zip(ms, ins, outs, strict=True)))
    r = load_recorded(p)
    t, i, o = _expected(ms, ins, outs)
    np.testing.assert_allclose(r.arrivals.times_s, t / 1.0, rtol=0, atol=1e-9)
    assert r.input_tokens is not None and r.output_tokens is not None
    np.testing.assert_array_equal(r.input_tokens, i)
    np.testing.assert_array_equal(r.output_tokens, o)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_csv_round_trips_in_seconds_and_as_date_times(tmp_path_factory, data):
    ms = data.draw(TIMES)
    ins = data.draw(st.lists(TOKENS, min_size=len(ms), max_size=len(ms)))
    iso = data.draw(st.booleans())
    start = datetime(2023, 11, 16, 18, 15, 46, tzinfo=UTC)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["TIMESTAMP", "ContextTokens", "note"])  # Azure's column names, any case
    for t, i in zip(ms, ins, strict=True):
        when = (start + timedelta(milliseconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f") if iso \
            else f"{t / 1e3:.3f}"
        w.writerow([when, i, "x, quoted"])
    p = tmp_path_factory.mktemp("a") / "trace.csv"
    p.write_text(buf.getvalue())
    r = load_recorded(p)
    t, i = _expected(ms, ins)
    np.testing.assert_allclose(r.arrivals.times_s, t, rtol=0, atol=1e-6)  # 1 us: %f
    assert r.output_tokens is None and r.input_tokens is not None
    np.testing.assert_array_equal(r.input_tokens, i)


@settings(max_examples=30, deadline=None)
@given(TIMES)
def test_seconds_per_line_round_trip_without_lengths(tmp_path_factory, ms):
    p = tmp_path_factory.mktemp("a") / "times.txt"
    p.write_text("# recorded\n" + "".join(f"{t / 1e3!r}\n" for t in ms))
    r = load_recorded(p)
    (t,) = _expected(ms)
    np.testing.assert_allclose(r.arrivals.times_s, t, rtol=0, atol=1e-9)
    assert r.input_tokens is None and r.output_tokens is None
    np.testing.assert_array_equal(load_arrivals(p).times_s, r.arrivals.times_s)


@pytest.mark.parametrize("name, text, field", [
    ("a.csv", "when,x\n1,2\n", "line 1"),  # no timestamp column
    ("a.csv", "", "line 1"),
    ("a.csv", "timestamp,input_tokens\n1,5\nlater,5\n", "line 3: timestamp"),
    ("a.csv", "timestamp,input_tokens\n1,5\n2,0\n", "line 3: input_tokens"),
    ("a.csv", "timestamp,input_tokens\n1,5\n2,1.5\n", "line 3: input_tokens"),
    ("a.csv", "timestamp,input_tokens\n1,5\n2\n", "line 3"),
    ("a.csv", "time\n-1\n", "line 2: time"),
    ("a.jsonl", '{"timestamp": 1, "input_length": 3}\n{"timestamp": 2}\n',
     "line 2: input_length"),
    ("a.jsonl", '{"timestamp": 1, "output_length": -3}\n', "line 1: output_length"),
    ("a.jsonl", '{"timestamp": "1"}\n', "line 1: timestamp"),
])
def test_bad_files_name_the_file_the_line_and_the_field(tmp_path, name, text, field):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_recorded(p)
    assert str(p) in str(e.value) and field in str(e.value), str(e.value)


@pytest.mark.parametrize("name, text, field", [
    ("bad.txt", "0.5\n1\nsoon\n", "line 3"),
    ("bad.csv", "time,prompt_tokens\n1,5\n2,x\n", "line 3: prompt_tokens"),
    ("missing.csv", None, "existing"),
])
def test_bench_control_refuses_a_bad_arrivals_file_with_exit_2(tmp_path, name, text, field):
    p = tmp_path / name
    if text is not None:
        p.write_text(text)
    out = tmp_path / "out.json"
    code, _, err = run_cli("bench", "control", "--arrivals", str(p), "--json", str(out))
    assert code == 2 and str(p) in err and field in err, err
    assert "Traceback" not in err and not out.exists()
