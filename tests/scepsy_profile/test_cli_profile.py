"""``scepsy profile run | serve-curve | install-vllm`` on the command line.

* A real torch sweep (tiny settings, seconds): a rerun of the same command measures nothing and
  leaves the store byte-identical, the store holds no point twice, the ``--json`` summary and the
  table list every curve, and ``profile fit --catalog-out`` / ``profile show`` take the store.
* Bad inputs: exit 2, exactly one line on stderr naming the option (or the store and the pid
  holding it), no traceback, and nothing written: no store, no lock file, no ``--out`` file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
MODEL, SCALE, PROFILED = "llama-3-8b", "0.0625", "llama-3-8b:x0.0625"
TINY = ("--scale", SCALE, "--max-batch", "4", "--max-tokens", "64", "--repeats", "1",
        "--warmup", "0", "--threads", "1", "--quiet")
SHARES = ("0.5", "1")
RUN_ARGS = (*TINY, "--shares", ",".join(SHARES), "--max-points", "20")
CURVES = [(1, float(s), phase) for s in SHARES for phase in ("prefill", "decode")]
SUMMARY_NOTE = re.compile(r"(\d+) points measured, (\d+) failed in this run, (\d+) already in")


def profile_run(store: Path, *extra: str) -> list[str]:
    return ["profile", "run", "--backend", "torch", "--model", MODEL, *extra,
            "--out", str(store)]


def store_keys(store: Path) -> list[tuple[object, ...]]:
    """The point key of every line of ``store`` (every line must be a whole JSON record)."""
    from scepsy_profile.profiling.store import read_store

    contents = read_store(store)
    assert contents.problems == (), contents.problems
    lines = store.read_text(encoding="utf-8").splitlines()
    keys = [(d["engine"], d["model"], d["scale"], d["device"], d["tp"], d["share"], d["phase"],
             d["batch"], d["tokens"]) for d in map(json.loads, lines)]
    assert len(keys) == len(contents.records)
    return keys


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(folder.rglob("*"))}


def assert_one_line_error(code: int, err: str, *needles: str) -> str:
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err
    assert re.match(r"scepsy( [a-z-]+)*: error: ", lines[0]), lines[0]
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ----------------------------------------------------------------- a real sweep, resumed


@dataclass(frozen=True)
class Sweep:
    store: Path
    summary: dict[str, object]
    store_bytes: bytes


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    store = tmp_path_factory.mktemp("profile") / "tiny.jsonl"
    code, out, err = run_cli(*profile_run(store, *RUN_ARGS, "--json"))
    assert code == 0, err
    return Sweep(store, json.loads(out), store.read_bytes())


@pytest.mark.torch
def test_json_summary_lists_every_curve(sweep: Sweep) -> None:
    s = sweep.summary
    assert set(s) == {"store", "engine", "model", "scale", "device", "stopped", "elapsed_s",
                      "measured", "failed", "resumed",
                      "curves", "notes"}
    assert (s["engine"], s["model"], s["scale"], s["device"]) == ("torch", PROFILED, 0.0625,
                                                                  "cpu")
    assert s["stopped"] == "done" and s["store"] == str(sweep.store)
    curves = s["curves"]
    assert isinstance(curves, list)
    assert [(c["tp"], c["share"], c["phase"]) for c in curves] == CURVES
    keys = store_keys(sweep.store)
    assert len(keys) == 20  # --max-points
    for c in curves:
        assert set(c) == {"tp", "share", "phase", "points", "failed", "error_pct"}
        mine = [k for k in keys if (k[4], k[5], k[6]) == (c["tp"], c["share"], c["phase"])]
        assert c["points"] == len(mine) >= 5 and c["failed"] == 0  # every curve fittable
        assert c["error_pct"] is None or c["error_pct"] >= 0
    measured, failed, resumed = map(int, SUMMARY_NOTE.search(s["notes"][0]).groups())
    assert (measured, failed, resumed) == (20, 0, 0)


@pytest.mark.torch
def test_rerun_of_the_same_command_measures_nothing(sweep: Sweep) -> None:
    code, out, err = run_cli(*profile_run(sweep.store, *RUN_ARGS, "--json"))
    assert code == 0, err
    again = json.loads(out)
    measured, failed, resumed = map(int, SUMMARY_NOTE.search(again["notes"][0]).groups())
    keys = store_keys(sweep.store)
    assert (measured, failed) == (0, 0)
    assert resumed == len(keys) == 20
    assert len(set(keys)) == len(keys)  # no point twice
    assert sweep.store.read_bytes() == sweep.store_bytes  # not one byte appended
    assert again["curves"] == sweep.summary["curves"]


@pytest.mark.torch
def test_table_lists_every_curve(sweep: Sweep) -> None:
    code, out, err = run_cli(*profile_run(sweep.store, *RUN_ARGS))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["tp", "share", "phase", "points", "failed", "error_pct"]
    rows = [line.split() for line in lines[1:1 + len(CURVES)]]
    assert [(int(r[0]), float(r[1]), r[2]) for r in rows] == CURVES
    assert all(int(r[3]) >= 5 and r[4] == "0" for r in rows)
    assert SUMMARY_NOTE.search(out).groups() == ("0", "0", "20")
    assert sweep.store.read_bytes() == sweep.store_bytes


@pytest.mark.torch
def test_fit_a_store_writes_the_shrunk_model_and_cpu_device(sweep: Sweep,
                                                          tmp_path: Path) -> None:
    from scepsy_profile.catalog import load_catalog
    from scepsy_profile.fitted import load_curves
    from scepsy_profile.profiling.models import engine_model

    curves, catalog = tmp_path / "curves.json", tmp_path / "catalog.yaml"
    code, _, err = run_cli("profile", "fit", "--measurements", str(sweep.store), "--out",
                           str(curves), "--catalog-out", str(catalog), "--quiet")
    assert code == 0, err
    fitted = load_curves(curves)
    assert fitted.curve_keys() == [(PROFILED, "cpu", 1, "decode"), (PROFILED, "cpu", 1,
                                                                     "prefill")]
    cat = load_catalog(catalog)
    spec = cat.model(PROFILED)
    want = engine_model(MODEL, float(SCALE)).model_spec()
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.vocab) == (
        want.layers, want.hidden, want.heads, want.kv_heads, want.vocab) == (2, 256, 2, 1, 8016)
    assert cat.has_gpu("cpu") and cat.gpu("cpu").memory_gib > 0
    code, out, err = run_cli("profile", "show", "--model", PROFILED, "--gpu", "cpu", "--curves",
                             str(curves), "--catalog", str(catalog), "--tp", "1", "--shares",
                             "1", "--batch", "4", "--seq", "64", "--input", "64", "--output",
                             "16", "--json")
    assert code == 0, err
    row = json.loads(out)["rows"][0]
    assert row["source"] == "fitted" and row["fits"] is True
    assert row["prefill_ms"] == pytest.approx(fitted.prefill_ms(PROFILED, "cpu", 1, 1.0, 4, 64),
                                              rel=1e-3)
    assert row["decode_ms"] == pytest.approx(fitted.decode_ms(PROFILED, "cpu", 1, 1.0, 4, 64),
                                             rel=1e-3)


@pytest.mark.torch
def test_fit_a_store_with_a_corrupt_line_names_the_line(sweep: Sweep, tmp_path: Path) -> None:
    store = tmp_path / "store.jsonl"
    lines = sweep.store_bytes.decode("utf-8").splitlines(keepends=True)
    bad_line = 3
    store.write_text("".join(lines[:bad_line - 1]) + '{"engine": "torch", "status": "ok"}\n'
                     + "".join(lines[bad_line - 1:]), encoding="utf-8")
    code, _, err = run_cli("profile", "fit", "--measurements", str(store), "--out",
                           str(tmp_path / "curves.json"), "--quiet")
    assert code == 2 and not (tmp_path / "curves.json").exists()
    assert str(store) in err and f"line {bad_line}" in err, err


# ------------------------------------------------------------------- bad inputs of `run`

@dataclass(frozen=True)
class Bad:
    id: str
    args: tuple[str, ...]
    needles: tuple[str, ...]
    xfail: str = ""
    requires: str = ""
    """A module the check needs (the backend validates its own settings once it can run)."""


BAD_RUNS = [
    Bad("backend-unknown", ("--backend", "nope"), ("--backend", "nope", "torch, vllm")),
    Bad("model-unknown", ("--model", "nope"), ("--model", "nope")),
    Bad("model-encoder", ("--model", "bge-reranker-large"), ("--model", "bge-reranker-large",
                                                             "decoder")),
    Bad("scale-zero", ("--scale", "0"), ("--scale", "(0, 1]")),
    Bad("scale-above-one", ("--scale", "1.5"), ("--scale", "1.5")),
    Bad("scale-nan", ("--scale", "nan"), ("--scale", "nan")),
    Bad("tp-zero", ("--tp", "0"), ("--tp", ">= 1")),
    Bad("tp-text", ("--tp", "one"), ("--tp",)),
    Bad("tp-twice", ("--tp", "1,1"), ("--tp", "distinct")),
    Bad("shares-above-one", ("--shares", "1.5"), ("--shares", "(0, 1]")),
    Bad("shares-twice", ("--shares", "0.5,0.5"), ("--shares", "distinct")),
    Bad("phases-unknown", ("--phases", "foo"), ("--phases", "foo")),
    Bad("phases-empty", ("--phases", ","), ("--phases",)),
    Bad("engine-option-no-equals", ("--engine-option", "dtype"), ("--engine-option", "NAME=VALUE")),
    Bad("engine-option-empty-value", ("--engine-option", "dtype="), ("--engine-option",)),
    Bad("engine-option-bad-dtype", ("--engine-option", "dtype=foo"), ("--engine-option", "foo"),
        requires="torch"),
    Bad("vllm-missing-python", ("--backend", "vllm", "--engine-python", "{d}/no/python"),
        ("--engine-python", "no/python")),
    Bad("max-points-zero", ("--max-points", "0"), ("--max-points", ">= 1")),
    Bad("error-quantile-zero", ("--error-quantile", "0"), ("--error-quantile",)),
    Bad("error-quantile-nan", ("--error-quantile", "nan"), ("--error-quantile",)),
    Bad("error-quantile-above-one", ("--error-quantile", "1.5"), ("--error-quantile", "1.5")),
    Bad("target-error-one", ("--target-error", "1"), ("--target-error",)),
    Bad("max-tokens-below-min", ("--max-tokens", "8"), ("--max-tokens",)),
    Bad("warmup-negative", ("--warmup", "-1"), ("--warmup",)),
    Bad("repeats-zero", ("--repeats", "0"), ("--repeats",)),
    Bad("budget-zero", ("--budget-s", "0"), ("--budget-s",)),
    Bad("out-directory", ("--out", "{d}/a-dir"), ("--out", "a-dir")),
    Bad("out-under-a-file", ("--out", "{d}/a-file/s.jsonl"), ("--out", "a-file")),
]


def _overridden(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``base`` + ``extra``, each option of ``extra`` (and its value) taken out of ``base``."""
    given = {a.partition("=")[0] for a in extra if a.startswith("--")}
    out: list[str] = []
    skip = False
    for i, a in enumerate(base):
        if skip:
            skip = False
            continue
        if a.partition("=")[0] in given:
            skip = "=" not in a and i + 1 < len(base) and not base[i + 1].startswith("--")
            continue
        out.append(a)
    return [*out, *extra]


@pytest.mark.parametrize("bad", [
    pytest.param(b, id=b.id, marks=[pytest.mark.xfail(strict=True, reason=b.xfail)]
                 if b.xfail else []) for b in BAD_RUNS])
def test_bad_run_option_exits_2_naming_it_and_writes_nothing(bad: Bad, tmp_path: Path,
                                                             monkeypatch) -> None:
    if bad.requires:
        pytest.importorskip(bad.requires)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("x")
    before = snapshot(tmp_path)
    store = tmp_path / "s.jsonl"
    args = [a.replace("{d}", str(tmp_path)) for a in bad.args]
    # the bad value replaces the good one (an option given twice is refused in itself)
    code, out, err = run_cli(*_overridden(profile_run(store, *TINY, "--max-points", "6"), args))
    assert snapshot(tmp_path) == before, err  # no store, no lock file, nothing clobbered
    assert_one_line_error(code, err, *bad.needles)
    assert out == ""


def test_a_store_locked_by_another_process_is_refused_naming_the_pid(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the lock is met once the backend can run
    store = tmp_path / "s.jsonl"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from scepsy_profile.profiling.store import ProfileStore\n"
         "with ProfileStore(sys.argv[1]):\n"
         "    print('held', flush=True)\n"
         "    time.sleep(120)\n", str(store)],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        before = snapshot(tmp_path)
        code, out, err = run_cli(*profile_run(store, *TINY, "--max-points", "6"))
        msg = assert_one_line_error(code, err, str(store), f"process {holder.pid}", "lock")
        assert out == "" and "this process" not in msg
        assert snapshot(tmp_path) == before  # the holder's (empty) store is left alone
    finally:
        os.killpg(holder.pid, 15)
        holder.wait(30)


# -------------------------------------------------------------- bad inputs of serve-curve


@pytest.mark.parametrize(("flag", "value"), [
    ("--input", "exp:0"), ("--input", "lognormal:10"), ("--input", "abc"), ("--input", "0"),
    ("--input", "exp:nan"), ("--input", "lognormal:10:-1"), ("--output", "exp:-3"),
    ("--output", "lognormal:inf:1"), ("--output", ""),
])
def test_serve_curve_bad_length_exits_2_and_writes_nothing(flag: str, value: str,
                                                          tmp_path: Path) -> None:
    before = snapshot(tmp_path)
    out_file = tmp_path / "curve.json"
    code, out, err = run_cli("profile", "serve-curve", "--model", MODEL, "--scale", SCALE,
                             "--engine-python", str(tmp_path / "no-python"), flag, value,
                             "--out", str(out_file))
    assert_one_line_error(code, err, flag, repr(value), "exp:MEAN")
    assert out == "" and not out_file.exists() and snapshot(tmp_path) == before


@pytest.mark.parametrize(("args", "needle"), [
    (("--model", "bge-reranker-large"), "--model"), (("--scale", "0"), "--scale"),
    (("--share", "0"), "--share"), (("--share", "nan"), "--share"),
])
def test_serve_curve_bad_model_or_share_exits_2(args: tuple[str, ...], needle: str,
                                                tmp_path: Path) -> None:
    out_file = tmp_path / "curve.json"
    code, _, err = run_cli("profile", "serve-curve", "--model", MODEL, *args, "--out",
                           str(out_file))
    assert_one_line_error(code, err, needle)
    assert not out_file.exists()


# --------------------------------------------------------------------------- install-vllm


def _existing_vllm_venv() -> Path:
    from scepsy_profile.profiling.vllm_install import default_venv, imports_vllm, venv_python

    venv = default_venv()  # where install-vllm keeps it ($SCEPSY_VLLM_VENV or the user cache)
    if not imports_vllm(venv_python(venv)):  # never let the test install one
        pytest.skip(f"no virtual environment importing vllm at {venv}")
    return venv


@pytest.mark.vllm
def test_install_vllm_print_python_prints_only_the_interpreter(monkeypatch) -> None:
    venv = _existing_vllm_venv()
    monkeypatch.setenv("SCEPSY_VLLM_VENV", str(venv))
    code, out, err = run_cli("profile", "install-vllm", "--print-python")
    assert code == 0, err
    assert out == f"{venv / 'bin' / 'python'}\n"  # one line, the interpreter, nothing else
