"""`scepsy profile fit` on a store a killed sweep cut short (the complete lines are fitted, one
warning names the file and line and says to rerun `profile run`), a corrupt line elsewhere
(refused, naming file, line and field, and what to do), and `scepsy profile show` beyond the
model's context (refused, naming the option, the value and the context length)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from scepsy_common.errors import InputError
from scepsy_profile.profiling.store import checked_store, read_store

STORE = REPO / "datasets" / "profiles" / "vllm-cpu-llama-3-8b-x0.0625.jsonl"


def _cut(tmp_path: Path, keep_bytes: int) -> tuple[Path, int]:
    """The store with its last line cut to ``keep_bytes`` bytes (no newline); its number."""
    lines = STORE.read_bytes().splitlines(keepends=True)
    path = tmp_path / "store.jsonl"
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:keep_bytes])
    return path, len(lines)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 400))
def test_a_cut_last_line_is_left_out_with_one_warning(tmp_path_factory, keep: int) -> None:
    path, n = _cut(tmp_path_factory.mktemp("cut"), keep)
    whole = read_store(STORE).records
    said: list[str] = []
    contents = checked_store(path, said.append)
    assert contents.records == whole[:-1]  # the cut point left out, every other kept
    assert len(said) == 1 and said[0].startswith(f"{path}: line {n} was cut short")
    assert "rerunning `scepsy profile run` with the same --out" in said[0]


def test_profile_fit_keeps_the_complete_lines_and_warns(tmp_path: Path) -> None:
    path, n = _cut(tmp_path, 25)
    curves = tmp_path / "curves.json"
    code, out, err = run_cli("profile", "fit", "--measurements", str(path), "--out", str(curves),
                             "--quiet")
    assert code == 0, err
    assert err.splitlines() == [
        f"scepsy: warning: {path}: line {n} was cut short (a sweep was stopped while writing it)"
        f" and is left out; rerunning `scepsy profile run` with the same --out {path} "
        "completes the sweep"]
    assert f"wrote 4 curves to {curves}" in out and json.loads(curves.read_text())


def test_a_corrupt_line_before_the_end_stays_an_error(tmp_path: Path) -> None:
    lines = STORE.read_text().splitlines(keepends=True)
    rec = json.loads(lines[2])
    rec["latency_ms"] = -1.0
    path = tmp_path / "store.jsonl"
    path.write_text("".join(lines[:2]) + json.dumps(rec) + "\n" + "".join(lines[3:]))
    with pytest.raises(InputError) as info:
        checked_store(path, lambda m: None)
    assert (info.value.source, info.value.field) == (str(path), "line 3")
    curves = tmp_path / "curves.json"
    code, _, err = run_cli("profile", "fit", "--measurements", str(path), "--out", str(curves))
    assert code == 2 and not curves.exists() and err.count("\n") == 1
    assert f"{path}: line 3: expected a valid profile record (latency_ms:" in err
    assert "delete that line and rerun `scepsy profile run` with this store as --out" in err


@pytest.mark.parametrize(("flags", "flag", "value"), [
    (("--input", "200000"), "--input", "200000.0"),
    (("--input", "8100", "--output", "100"), "--input", "8100.0"),
    (("--output", "9000"), "--output", "9000.0"),
    (("--seq", "9000"), "--seq", "9000"),
])
def test_profile_show_beyond_the_context_is_refused(flags: tuple[str, ...], flag: str,
                                                    value: str) -> None:
    code, out, err = run_cli("profile", "show", "--model", "llama-3-8b", "--gpu", "A100-80GB",
                             "--tp", "1", "--shares", "0.3,1", *flags)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"scepsy: error: {flag}: expected ") and "8192" in err
    assert f"(got {value})" in err and "llama-3-8b" in err


def test_profile_show_at_the_context_still_answers() -> None:
    code, out, err = run_cli("profile", "show", "--model", "llama-3-8b", "--gpu", "A100-80GB",
                             "--tp", "1", "--shares", "1", "--input", "8064", "--seq", "8192",
                             "--json")
    assert code == 0, err
    (row,) = json.loads(out)["rows"]
    assert row["mu_calls_s"] > 0
