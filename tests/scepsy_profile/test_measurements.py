"""Tests for the measurements JSON-lines store and the MuxServe grid importer.

The store tests round-trip hypothesis-generated records and check atomic writes and the
errors for bad lines; the importer tests write small grids in the MuxServe layout into
``tmp_path``. The ``shared_data`` test reads the published MuxServe grid from ``../shared/data``
and skips when it is absent.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import scepsy_profile.measurements as measurements_module
from conftest import shared_file
from scepsy_common.errors import InputError
from scepsy_profile.catalog import default_catalog
from scepsy_profile.importers import load_muxserve_grid
from scepsy_profile.measurements import (
    MAX_BATCH,
    MAX_TOKENS,
    PHASES,
    Measurement,
    read_measurements,
    write_measurements,
)

# --- strategies --------------------------------------------------------------------------------

_CATALOG = default_catalog()
# every (model, gpu, tp) the catalog supports: the instances a measurements file may name
INSTANCES = [(m, g, tp) for m in sorted(_CATALOG.models) for g in sorted(_CATALOG.gpus)
             for tp in (1, 2, 4, 8)
             if _CATALOG.model(m).supports_tp(tp) and tp <= _CATALOG.gpu(g).nvlink_domain]
positive_floats = st.floats(min_value=0.0, exclude_min=True, allow_nan=False, allow_infinity=False)
shares = st.floats(min_value=0.0, max_value=1.0, exclude_min=True, allow_nan=False)
measurements = st.sampled_from(INSTANCES).flatmap(lambda inst: st.builds(
    Measurement,
    model=st.just(inst[0]),
    gpu=st.just(inst[1]),
    tp=st.just(inst[2]),
    share=shares,
    phase=st.sampled_from(PHASES),
    batch=st.integers(min_value=1, max_value=MAX_BATCH),
    tokens=st.integers(min_value=1, max_value=MAX_TOKENS),
    latency_ms=positive_floats,
    source=st.text(max_size=20),
))
measurement_lists = st.lists(measurements, min_size=1, max_size=12)


def listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


# --- JSONL store: round trips ------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(rows=measurement_lists)
def test_write_then_read_returns_the_same_measurements(rows: list[Measurement]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "points.jsonl"
        write_measurements(path, rows)
        back = read_measurements(path)
        assert back == tuple(rows)
        # field types survive too (an int batch does not come back as a float, and so on)
        for got, want in zip(back, rows, strict=True):
            for name in ("tp", "batch", "tokens"):
                assert type(getattr(got, name)) is int
            assert type(got.share) is float and type(got.latency_ms) is float
            assert got.share == want.share and got.latency_ms == want.latency_ms
        assert listing(Path(tmp)) == ["points.jsonl"]  # no temporary file left over


@settings(max_examples=60, deadline=None)
@given(rows=measurement_lists)
def test_written_bytes_are_deterministic(rows: list[Measurement]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        a, b, c = (Path(tmp) / f"{n}.jsonl" for n in "abc")
        write_measurements(a, rows)
        write_measurements(b, iter(rows))  # any iterable, same bytes
        assert a.read_bytes() == b.read_bytes()
        # reading and writing again reproduces the file byte for byte
        write_measurements(c, read_measurements(a))
        assert c.read_bytes() == a.read_bytes()
        # one line per measurement, each a JSON object
        lines = a.read_text(encoding="utf-8").splitlines()
        assert len(lines) == len(rows)
        assert all(isinstance(json.loads(line), dict) for line in lines)


def test_rewriting_replaces_the_old_content(tmp_path: Path) -> None:
    first = Measurement("llama-2-7b", "A100-80GB", 1, 0.5, "prefill", 2, 64, 10.0)
    second = Measurement("llama-2-7b", "A100-80GB", 2, 1.0, "decode", 8, 128, 3.5, source="x")
    path = tmp_path / "points.jsonl"
    write_measurements(path, [first, second])
    write_measurements(path, [second])
    assert read_measurements(path) == (second,)


# --- JSONL store: atomic writes ----------------------------------------------------------------

OLD = [Measurement("llama-2-7b", "A100-80GB", 1, 1.0, "decode", 1, 32, 5.0)]


@pytest.fixture
def existing(tmp_path: Path) -> tuple[Path, bytes]:
    path = tmp_path / "points.jsonl"
    write_measurements(path, OLD)
    return path, path.read_bytes()


def test_failed_write_of_unserialisable_field_keeps_old_file(existing: tuple[Path, bytes]) -> None:
    path, old = existing
    good = Measurement("new", "g", 1, 0.5, "prefill", 1, 32, 1.0)
    bad = Measurement("new", "g", 1, 0.5, "prefill", 1, 32, object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        write_measurements(path, [good, bad])
    assert path.read_bytes() == old
    assert listing(path.parent) == [path.name]
    assert read_measurements(path) == tuple(OLD)


def test_failed_iteration_keeps_old_file(existing: tuple[Path, bytes]) -> None:
    path, old = existing

    def rows() -> Iterator[Measurement]:
        yield Measurement("new", "g", 1, 0.5, "prefill", 1, 32, 1.0)
        raise RuntimeError("source broke mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        write_measurements(path, rows())
    assert path.read_bytes() == old
    assert listing(path.parent) == [path.name]


def test_failed_rename_removes_the_temporary_file(
    existing: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary file is fully written, then the rename fails: nothing may change."""
    path, old = existing
    seen: list[str] = []

    def broken_replace(src: str, dst: object) -> None:
        seen.append(src)
        assert Path(src).exists() and Path(src).parent == path.parent
        raise OSError("disk full")

    monkeypatch.setattr(measurements_module.os, "replace", broken_replace)
    with pytest.raises(InputError, match="disk full"):  # a refused write: one line, the path
        write_measurements(path, [Measurement("new", "g", 1, 0.5, "prefill", 1, 32, 1.0)])
    monkeypatch.undo()
    assert seen, "the write did not go through a temporary file"
    assert path.read_bytes() == old
    assert listing(path.parent) == [path.name]


# --- JSONL store: errors -----------------------------------------------------------------------

GOOD = {"model": "llama-2-7b", "gpu": "A100-80GB", "tp": 1, "share": 0.5, "phase": "prefill",
        "batch": 4, "tokens": 64, "latency_ms": 12.5}


def without(key: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != key}


BAD_RECORDS = {
    "missing field": (without("latency_ms"), "latency_ms"),
    "missing model": (without("model"), "model"),
    "unknown field": ({**GOOD, "colour": "red"}, "colour"),
    "negative latency": ({**GOOD, "latency_ms": -3.0}, "latency_ms"),
    "zero latency": ({**GOOD, "latency_ms": 0.0}, "latency_ms"),
    "nan latency": ({**GOOD, "latency_ms": math.nan}, "latency_ms"),
    "infinite latency": ({**GOOD, "latency_ms": math.inf}, "latency_ms"),
    "zero batch": ({**GOOD, "batch": 0}, "batch"),
    "zero tokens": ({**GOOD, "tokens": 0}, "tokens"),
    "zero tp": ({**GOOD, "tp": 0}, "tp"),
    "fractional tp": ({**GOOD, "tp": 1.5}, "tp"),
    "share above 1": ({**GOOD, "share": 1.2}, "share"),
    "zero share": ({**GOOD, "share": 0.0}, "share"),
    "bad phase": ({**GOOD, "phase": "generate"}, "phase"),
    "empty model": ({**GOOD, "model": ""}, "model"),
}


@pytest.mark.parametrize(("record", "field"), BAD_RECORDS.values(), ids=list(BAD_RECORDS))
def test_bad_record_names_file_line_and_field(tmp_path: Path, record: dict, field: str) -> None:
    path = tmp_path / "points.jsonl"
    # a good line 1, a blank line 2 (still counted), the bad record on line 3
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_measurements(path)
    msg = str(info.value)
    assert str(path) in msg
    assert re.search(r"\bline 3\b", msg), msg
    assert field in msg
    assert info.value.source == str(path)
    assert field in info.value.field


def test_bad_phase_lists_the_allowed_phases(tmp_path: Path) -> None:
    path = tmp_path / "points.jsonl"
    path.write_text(json.dumps({**GOOD, "phase": "generate"}) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_measurements(path)
    assert all(phase in str(info.value) for phase in PHASES)


@pytest.mark.parametrize("line", ['{"model": "m", ', "not json", "[1, 2]", '"text"', "42"],
                         ids=["truncated", "text", "list", "string", "number"])
def test_line_that_is_not_a_json_object_names_file_and_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "points.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_measurements(path)
    msg = str(info.value)
    assert str(path) in msg
    assert re.search(r"\bline 2\b", msg), msg


@pytest.mark.parametrize("text", ["", "\n\n  \n"], ids=["empty", "blank lines"])
def test_empty_file_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "points.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_measurements(path)
    assert str(path) in str(info.value)
    assert "at least one" in str(info.value)


@pytest.mark.parametrize("name", ["missing.jsonl", "."], ids=["missing", "directory"])
def test_missing_file_is_an_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(InputError) as info:
        read_measurements(path)
    assert str(path) in str(info.value)


def test_non_utf8_file_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "points.jsonl"
    path.write_bytes(b"\xff\xfe" + json.dumps(GOOD).encode("utf-16-le") + b"\n")
    with pytest.raises(InputError) as info:
        read_measurements(path)
    assert str(path) in str(info.value)


# --- MuxServe importer -------------------------------------------------------------------------


def latency(tp: int, pct: int, batch: int, seq: int, phase: str) -> float:
    """Distinct made-up latencies, so a swapped field shows up as a wrong value."""
    work = batch * seq if phase == "prefill" else batch
    return round(0.5 + work * 0.01 * 100 / pct / tp + (0.001 if phase == "decode" else 0.0), 6)


def make_grid() -> dict:
    grid: dict = {}
    for model, tps in (("llama-7b", (1, 2)), ("llama-13b", (2,))):
        for tp in tps:
            for pct in (30, 50, 100):
                for batch in (1, 4, 16):
                    for seq in (64, 512):
                        grid.setdefault(model, {}).setdefault(str(tp), {}).setdefault(
                            str(pct), {}).setdefault(str(batch), {})[str(seq)] = {
                            "prefill": latency(tp, pct, batch, seq, "prefill"),
                            "decoding": latency(tp, pct, batch, seq, "decode"),
                        }
    # upstream marks points it could not measure (out of memory) with -1
    grid["llama-13b"]["2"]["30"]["16"]["512"] = {"prefill": -1, "decoding": -1}
    grid["llama-7b"]["1"]["30"]["16"]["512"]["decoding"] = -1
    return grid


def expected_points(grid: dict, gpu: str) -> set[tuple]:
    out = set()
    for model, by_tp in grid.items():
        for tp, by_pct in by_tp.items():
            for pct, by_batch in by_pct.items():
                for batch, by_seq in by_batch.items():
                    for seq, point in by_seq.items():
                        for phase, key in (("prefill", "prefill"), ("decode", "decoding")):
                            if point[key] > 0:
                                out.add((model, gpu, int(tp), int(pct) / 100, phase, int(batch),
                                         int(seq), point[key]))
    return out


def as_tuple(m: Measurement) -> tuple:
    return (m.model, m.gpu, m.tp, m.share, m.phase, m.batch, m.tokens, m.latency_ms)


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-80GB"])
def test_muxserve_grid_points_become_measurements(tmp_path: Path, gpu: str) -> None:
    grid = make_grid()
    rows = load_muxserve_grid(write_json(tmp_path / "llama.json", grid), gpu=gpu)
    assert all(isinstance(m, Measurement) for m in rows)
    got = [as_tuple(m) for m in rows]
    assert len(got) == len(set(got))  # no point imported twice
    assert set(got) == expected_points(grid, gpu)
    assert {m.phase for m in rows} == {"prefill", "decode"}
    # the -1 entries are skipped, and only those
    n_cells = sum(len(by_seq) for by_tp in grid.values() for by_pct in by_tp.values()
                  for by_batch in by_pct.values() for by_seq in by_batch.values())
    assert len(rows) == 2 * n_cells - 3
    assert not any(m.model == "llama-7b" and m.tp == 1 and m.share == 0.3 and m.batch == 16
                   and m.tokens == 512 and m.phase == "decode" for m in rows)
    assert any(m.model == "llama-7b" and m.tp == 1 and m.share == 0.3 and m.batch == 16
               and m.tokens == 512 and m.phase == "prefill" for m in rows)


def test_muxserve_default_gpu_is_a100(tmp_path: Path) -> None:
    rows = load_muxserve_grid(write_json(tmp_path / "g.json", make_grid()))
    assert {m.gpu for m in rows} == {"A100-80GB"}


latencies = st.one_of(st.just(-1), st.floats(min_value=0.01, max_value=1e5, allow_nan=False))
grid_keys = st.integers(min_value=1, max_value=4096).map(str)
cells = st.fixed_dictionaries({"prefill": latencies, "decoding": latencies})
grids = st.dictionaries(
    st.sampled_from(["llama-7b", "llama-13b", "llama-2-7b"]),  # catalog models, any TP of 1-8
    st.dictionaries(
        st.sampled_from(["1", "2", "4", "8"]),
        st.dictionaries(
            st.integers(min_value=1, max_value=100).map(str),
            st.dictionaries(grid_keys, st.dictionaries(grid_keys, cells, min_size=1, max_size=3),
                            min_size=1, max_size=3),
            min_size=1, max_size=3),
        min_size=1, max_size=2),
    min_size=1, max_size=2)


@settings(max_examples=80, deadline=None)
@given(grid=grids)
def test_muxserve_import_round_trips_every_measured_point(grid: dict) -> None:
    want = expected_points(grid, "A100-80GB")
    with tempfile.TemporaryDirectory() as tmp:
        path = write_json(Path(tmp) / "grid.json", grid)
        if not want:
            with pytest.raises(InputError):
                load_muxserve_grid(path)
            return
        rows = load_muxserve_grid(path)
        assert sorted(map(as_tuple, rows)) == sorted(want)
        # and the store keeps them exactly
        write_measurements(Path(tmp) / "points.jsonl", rows)
        assert read_measurements(Path(tmp) / "points.jsonl") == rows


def _set(grid: dict, path: list[str], value: object) -> dict:
    node = grid
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return grid


def _rename(grid: dict, path: list[str], new_key: str) -> dict:
    node = grid
    for key in path[:-1]:
        node = node[key]
    node[new_key] = node.pop(path[-1])
    return grid


CELL = ["llama-7b", "1", "100", "4", "64"]
MALFORMED = {
    "top level list": (lambda g: [g], "top level"),
    "model not an object": (lambda g: _set(g, ["llama-7b"], 3), "llama-7b"),
    "missing decoding": (lambda g: _set(g, CELL, {"prefill": 1.0}), "llama-7b.1.100.4.64.decoding"),
    "missing prefill": (lambda g: _set(g, CELL, {"decoding": 1.0}), "llama-7b.1.100.4.64.prefill"),
    "cell not an object": (lambda g: _set(g, CELL, 7.5), "llama-7b.1.100.4.64."),
    "text latency": (lambda g: _set(g, [*CELL, "prefill"], "fast"), "llama-7b.1.100.4.64.prefill"),
    "null latency": (lambda g: _set(g, [*CELL, "decoding"], None), "llama-7b.1.100.4.64.decoding"),
    "list latency": (lambda g: _set(g, [*CELL, "decoding"], [1]), "llama-7b.1.100.4.64.decoding"),
    "SM percentage 0": (lambda g: _rename(g, CELL[:3], "0"), "llama-7b.1.0"),
    "SM percentage 150": (lambda g: _rename(g, CELL[:3], "150"), "llama-7b.1.150"),
    "SM percentage text": (lambda g: _rename(g, CELL[:3], "all"), "llama-7b.1.all"),
    "non-integer batch": (lambda g: _rename(g, CELL[:4], "4.5"), "llama-7b.1.100.4.5"),
    "text batch": (lambda g: _rename(g, CELL[:4], "many"), "llama-7b.1.100.many"),
    "zero batch": (lambda g: _rename(g, CELL[:4], "0"), "llama-7b.1.100.0"),
    "text seq": (lambda g: _rename(g, CELL, "long"), "llama-7b.1.100.4.long"),
    "text tp": (lambda g: _rename(g, CELL[:2], "one"), "llama-7b.one"),
}


@pytest.mark.parametrize(("mutate", "where"), MALFORMED.values(), ids=list(MALFORMED))
def test_malformed_grid_names_file_and_path(tmp_path: Path, mutate, where: str) -> None:
    path = write_json(tmp_path / "grid.json", mutate(make_grid()))
    with pytest.raises(InputError) as info:
        load_muxserve_grid(path)
    msg = str(info.value)
    assert str(path) in msg
    assert f": {where}" in msg, msg


def test_grid_with_nothing_measured_is_an_error(tmp_path: Path) -> None:
    grid = {"llama-7b": {"1": {"100": {"1": {"32": {"prefill": -1, "decoding": -1}}}}}}
    path = write_json(tmp_path / "grid.json", grid)
    with pytest.raises(InputError) as info:
        load_muxserve_grid(path)
    assert str(path) in str(info.value)


def test_invalid_json_grid_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "grid.json"
    path.write_text('{"llama-7b": {"1": ', encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_muxserve_grid(path)
    assert str(path) in str(info.value)
    assert "JSON" in str(info.value)


def test_missing_grid_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.json"
    with pytest.raises(InputError) as info:
        load_muxserve_grid(path)
    assert str(path) in str(info.value)


def test_directory_instead_of_grid_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        load_muxserve_grid(tmp_path)


def test_boolean_latency_is_rejected(tmp_path: Path) -> None:
    path = write_json(tmp_path / "grid.json", _set(make_grid(), [*CELL, "prefill"], True))
    with pytest.raises(InputError):
        load_muxserve_grid(path)


def test_bad_key_is_rejected_even_when_its_points_are_unmeasured(tmp_path: Path) -> None:
    grid = make_grid()
    grid["llama-7b"]["1"]["100"]["many"] = {"64": {"prefill": -1, "decoding": -1}}
    path = write_json(tmp_path / "grid.json", grid)
    with pytest.raises(InputError):
        load_muxserve_grid(path)


# --- the published MuxServe grid ---------------------------------------------------------------


@pytest.mark.shared_data
def test_published_muxserve_grid() -> None:
    path = shared_file("profiles/muxserve/llama-a100-80gb.json")
    raw = json.loads(path.read_text(encoding="utf-8"))
    rows = load_muxserve_grid(path)

    point = raw["llama-7b"]["1"]["100"]["32"]["512"]

    def find(phase: str) -> list[Measurement]:
        return [m for m in rows if (m.model, m.tp, m.share, m.batch, m.tokens, m.phase)
                == ("llama-7b", 1, 1.0, 32, 512, phase)]

    (prefill,), (decode,) = find("prefill"), find("decode")
    assert prefill.latency_ms == point["prefill"]
    assert decode.latency_ms == point["decoding"]
    assert prefill.gpu == decode.gpu == "A100-80GB"

    # the example in the data README agrees with the file to the README's precision
    readme = shared_file("README.md").read_text(encoding="utf-8")
    example = re.search(r"llama-7b TP1 100% SMs, batch 32, seq 512: prefill ([\d.]+) ms, "
                        r"decode ([\d.]+) ms", readme)
    assert example, "the README no longer documents the example point"
    for text, value in zip(example.groups(), (prefill.latency_ms, decode.latency_ms), strict=True):
        decimals = len(text.split(".")[1]) if "." in text else 0
        assert abs(float(text) - value) <= 0.5 * 10**-decimals

    assert {(m.model, m.tp) for m in rows} == {(model, int(tp)) for model in raw
                                             for tp in raw[model]}
    n_measured = sum(1 for by_tp in raw.values() for by_pct in by_tp.values()
                     for by_batch in by_pct.values() for by_seq in by_batch.values()
                     for cell in by_seq.values() for key in ("prefill", "decoding")
                     if cell[key] > 0)
    assert len(rows) == n_measured
    assert {m.share for m in rows} == {int(p) / 100 for by_tp in raw.values()
                                       for by_pct in by_tp.values() for p in by_pct}
