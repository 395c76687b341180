"""Tests for the ``scepsy`` command line: ``profile fit`` and ``profile show``.

Most tests call :func:`scepsy.cli.main` in-process; one runs the installed console script to
check exit codes end to end. User mistakes must exit 2 with one ``scepsy: error: ...`` line
naming the file and the field, and must not write anything.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from scepsy.cli import main
from scepsy_profile.catalog import default_catalog
from scepsy_profile.fitted import load_curves
from scepsy_profile.measurements import Measurement, write_measurements
from scepsy_profile.roofline import roofline_model
from scepsy_profile.synthetic import synthetic_measurements

MODEL, GPU = "llama-2-7b", "A100-80GB"
DEFAULT_TPS, DEFAULT_SHARES = (1, 2, 4, 8), (0.3, 0.5, 0.7, 1.0)  # the documented --tp/--shares
BATCH, SEQ = 32, 512  # the documented --batch/--seq defaults
ROW_KEYS = {"tp", "share", "source", "prefill_ms", "decode_ms", "mu_calls_s", "max_batch",
            "weights_gib", "kv_gib", "fits"}


# --- helpers -----------------------------------------------------------------------------------


def run_quiet(argv: list[str]) -> tuple[int, str, str]:
    """Run the CLI in-process outside a test's capsys (for module-scoped fixtures)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def parse_table(text: str) -> list[dict[str, str]]:
    """Rows of a right-aligned table printed by the CLI: the line with the header and below."""
    lines = [line for line in text.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.split()[:1] in (["model"], ["tp"]))
    header = lines[start].split()
    rows = []
    for line in lines[start + 1:]:
        cells = line.split()
        if len(cells) != len(header):
            break  # the "wrote N curves" line after the fit table
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def matches_printed(printed: str, value: float) -> bool:
    """Whether ``printed`` is ``value`` to the number of decimals printed (plus the CLI's
    rounding to 3 decimals before printing)."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(float(printed) - value) <= 0.5 * 10**-decimals + 5e-4 + 1e-9


def supported(tps: tuple[int, ...] = DEFAULT_TPS) -> list[int]:
    cat = default_catalog()
    spec, gpu = cat.model(MODEL), cat.gpu(GPU)
    return [tp for tp in tps if spec.supports_tp(tp) and tp <= gpu.nvlink_domain]


def assert_user_error(rc: int, out: str, err: str, *needles: str) -> str:
    assert rc == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("scepsy: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert out == ""
    return lines[0]


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def points() -> tuple[Measurement, ...]:
    return synthetic_measurements(roofline_model(), MODEL, GPU, tps=(1,), shares=(0.5, 1.0),
                                  batches=(1, 4, 16, 64), tokens=(64, 256))


@pytest.fixture(scope="module")
def measurements_file(tmp_path_factory: pytest.TempPathFactory,
                      points: tuple[Measurement, ...]) -> Path:
    path = tmp_path_factory.mktemp("meas") / "points.jsonl"
    write_measurements(path, points)
    return path


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory,
           measurements_file: Path) -> tuple[Path, int, str, str]:
    """``scepsy profile fit --measurements`` run once: (OUT, exit code, stdout, stderr)."""
    out = tmp_path_factory.mktemp("fit") / "curves.json"
    rc, stdout, stderr = run_quiet(["profile", "fit", "--measurements", str(measurements_file),
                                    "--out", str(out)])
    return out, rc, stdout, stderr


# --- profile fit -------------------------------------------------------------------------------


def test_fit_measurements_writes_loadable_curves(
    fitted: tuple[Path, int, str, str], points: tuple[Measurement, ...]
) -> None:
    out, rc, stdout, stderr = fitted
    assert rc == 0, stderr
    assert stderr == ""
    curves = load_curves(out)
    assert set(curves.curves) == {m.key() for m in points}
    assert curves.covers(MODEL, GPU, 1)
    # the table lists each (tp, phase) curve once, with its number of points
    rows = parse_table(stdout)
    counts = Counter((m.tp, m.phase) for m in points)
    assert sorted((int(r["tp"]), r["phase"]) for r in rows) == sorted(counts)
    for r in rows:
        assert (r["model"], r["gpu"]) == (MODEL, GPU)
        assert int(r["points"]) == counts[(int(r["tp"]), r["phase"])]
    assert f"wrote {len(counts)} curves to {out}" in stdout


def test_fit_twice_writes_identical_bytes(
    fitted: tuple[Path, int, str, str], measurements_file: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first, rc, *_ = fitted
    assert rc == 0
    again = tmp_path / "again.json"
    assert main(["profile", "fit", "--measurements", str(measurements_file),
                 "--out", str(again)]) == 0
    assert again.read_bytes() == first.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["again.json"]
    capsys.readouterr()


def test_fit_json_report(measurements_file: Path, points: tuple[Measurement, ...],
                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "curves.json"
    rc = main(["profile", "fit", "--measurements", str(measurements_file), "--out", str(out),
               "--json"])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr
    report = json.loads(stdout)
    assert report["out"] == str(out)
    counts = Counter(m.key() for m in points)
    got = {(c["model"], c["gpu"], c["tp"], c["phase"]): c for c in report["curves"]}
    assert set(got) == set(counts)
    for key, curve in got.items():
        assert curve["points"] == counts[key]
        assert 0 <= curve["outliers"] <= curve["points"]
        assert curve["train_median_ape_pct"] >= 0
    assert set(load_curves(out).curves) == set(counts)


def muxserve_grid() -> dict:
    grid: dict = {}
    for tp in (1, 2):
        for pct in (50, 100):
            for batch in (1, 4, 16):
                for seq in (64, 256):
                    grid.setdefault("llama-7b", {}).setdefault(str(tp), {}).setdefault(
                        str(pct), {}).setdefault(str(batch), {})[str(seq)] = {
                        "prefill": 2.0 + batch * seq * 0.02 * 100 / pct / tp,
                        "decoding": 10.0 + batch * 0.05 * 100 / pct / tp,
                    }
    grid["llama-7b"]["2"]["50"]["16"]["256"]["decoding"] = -1  # not measured upstream
    return grid


def test_fit_muxserve_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = muxserve_grid()
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(grid), encoding="utf-8")
    out = tmp_path / "curves" / "mux.json"
    rc = main(["profile", "fit", "--muxserve", str(path), "--gpu", "H100-80GB", "--out",
               str(out), "--json"])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr
    keys = {("llama-7b", "H100-80GB", tp, phase) for tp in (1, 2) for phase in ("prefill", "decode")}
    assert set(load_curves(out).curves) == keys
    points = {(c["tp"], c["phase"]): c["points"] for c in json.loads(stdout)["curves"]}
    assert points == {(1, "prefill"): 12, (1, "decode"): 12, (2, "prefill"): 12, (2, "decode"): 11}


# --- profile show ------------------------------------------------------------------------------


def show_rows(capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, str]]:
    rc = main(["profile", "show", "--model", MODEL, "--gpu", GPU, *extra])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr
    assert stdout.splitlines()[0].startswith(f"{MODEL} on {GPU}")
    return parse_table(stdout)


def test_show_roofline_has_a_row_per_supported_tp_and_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = show_rows(capsys)
    want = [(tp, share) for tp in supported() for share in DEFAULT_SHARES]
    assert len(want) > 4  # more than one TP degree is supported
    assert [(int(r["tp"]), float(r["share"])) for r in rows] == want
    assert {r["source"] for r in rows} == {"roofline"}
    roof = roofline_model()
    for r in rows:
        tp, share = int(r["tp"]), float(r["share"])
        assert matches_printed(r["prefill_ms"], roof.prefill_ms(MODEL, GPU, tp, share, BATCH, SEQ))
        assert matches_printed(r["decode_ms"], roof.decode_ms(MODEL, GPU, tp, share, BATCH, SEQ))


def test_show_restricted_tp_and_shares(capsys: pytest.CaptureFixture[str]) -> None:
    rows = show_rows(capsys, "--tp", "2", "--shares", "0.25,1")
    assert [(int(r["tp"]), float(r["share"])) for r in rows] == [(2, 0.25), (2, 1.0)]


def test_show_with_curves_uses_the_fitted_curves(
    fitted: tuple[Path, int, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out, rc, *_ = fitted
    assert rc == 0
    curves = load_curves(out)
    rows = show_rows(capsys, "--curves", str(out))
    assert [(int(r["tp"]), float(r["share"])) for r in rows] == [
        (tp, share) for tp in supported() for share in DEFAULT_SHARES]
    for r in rows:
        tp, share = int(r["tp"]), float(r["share"])
        assert r["source"] == ("fitted" if tp == 1 else "roofline")
        if tp == 1:
            assert matches_printed(r["prefill_ms"], curves.prefill_ms(MODEL, GPU, 1, share, BATCH, SEQ))
            assert matches_printed(r["decode_ms"], curves.decode_ms(MODEL, GPU, 1, share, BATCH, SEQ))


def test_show_json_has_the_documented_keys(
    fitted: tuple[Path, int, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out, rc, *_ = fitted
    assert rc == 0
    assert main(["profile", "show", "--model", MODEL, "--gpu", GPU, "--json"]) == 0
    roof_doc = json.loads(capsys.readouterr().out)
    assert main(["profile", "show", "--model", MODEL, "--gpu", GPU, "--json",
                 "--curves", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    for d in (roof_doc, doc):
        assert (d["model"], d["gpu"], d["batch"], d["seq"]) == (MODEL, GPU, BATCH, SEQ)
        assert [(r["tp"], r["share"]) for r in d["rows"]] == [
            (tp, share) for tp in supported() for share in DEFAULT_SHARES]
        for r in d["rows"]:
            assert set(r) == ROW_KEYS
            assert isinstance(r["fits"], bool) and isinstance(r["max_batch"], int)
            assert r["prefill_ms"] > 0 and r["decode_ms"] > 0 and r["mu_calls_s"] > 0
    curves = load_curves(out)
    for r, roof in zip(doc["rows"], roof_doc["rows"], strict=True):
        if r["tp"] == 1:
            assert r["source"] == "fitted"
            want = curves.prefill_ms(MODEL, GPU, 1, r["share"], BATCH, SEQ)
            assert abs(r["prefill_ms"] - want) <= 5e-4 + 1e-9
        else:  # rows the curves do not cover are the roofline rows, unchanged
            assert r == roof
        # memory does not depend on where the latency came from
        assert (r["weights_gib"], r["kv_gib"]) == (roof["weights_gib"], roof["kv_gib"])


# --- user errors -------------------------------------------------------------------------------


GOOD = {"model": MODEL, "gpu": GPU, "tp": 1, "share": 0.5, "phase": "prefill", "batch": 4,
        "tokens": 64, "latency_ms": 12.5}

BAD_MEASUREMENTS = {
    "missing field": ([GOOD, {k: v for k, v in GOOD.items() if k != "tokens"}], "tokens", 2),
    "negative latency": ([GOOD, GOOD, {**GOOD, "latency_ms": -1.5}], "latency_ms", 3),
    "malformed JSON": ([GOOD, '{"model": "llama-2-7b", "gpu"'], None, 2),
}


@pytest.mark.parametrize(("lines", "field", "lineno"), BAD_MEASUREMENTS.values(),
                         ids=list(BAD_MEASUREMENTS))
def test_fit_bad_measurements(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              lines: list, field: str | None, lineno: int) -> None:
    path = tmp_path / "points.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines),
                    encoding="utf-8")
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / "curves.json"
    rc = main(["profile", "fit", "--measurements", str(path), "--out", str(out)])
    line = assert_user_error(rc, *capsys.readouterr(), str(path), f"line {lineno}")
    if field:
        assert field in line
    assert not out.exists()
    assert os.listdir(outdir) == []


def test_failed_fit_keeps_an_existing_out_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "points.jsonl"
    path.write_text(json.dumps({**GOOD, "latency_ms": -1}) + "\n", encoding="utf-8")
    out = tmp_path / "curves.json"
    out.write_text("previous curves\n", encoding="utf-8")
    rc = main(["profile", "fit", "--measurements", str(path), "--out", str(out)])
    assert_user_error(rc, *capsys.readouterr(), str(path), "latency_ms")
    assert out.read_text(encoding="utf-8") == "previous curves\n"
    assert sorted(os.listdir(tmp_path)) == ["curves.json", "points.jsonl"]


def test_fit_bad_muxserve_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = muxserve_grid()
    grid["llama-7b"]["1"]["100"]["4"]["64"] = {"prefill": 3.0}
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(grid), encoding="utf-8")
    out = tmp_path / "curves.json"
    rc = main(["profile", "fit", "--muxserve", str(path), "--out", str(out)])
    assert_user_error(rc, *capsys.readouterr(), str(path), "llama-7b.1.100.4.64.decoding")
    assert not out.exists()


def test_unknown_gpu_suggests_close_names(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["profile", "show", "--model", MODEL, "--gpu", "Z100"])
    line = assert_user_error(rc, *capsys.readouterr(), "Z100", "GPU")
    suggested = re.findall(r"'([^']+)'", line.split("did you mean", 1)[1])
    assert suggested
    assert all(default_catalog().has_gpu(name) for name in suggested)


def test_unknown_model_suggests_close_names(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["profile", "show", "--model", "llama-2-7c", "--gpu", GPU])
    line = assert_user_error(rc, *capsys.readouterr(), "llama-2-7c", "model")
    suggested = re.findall(r"'([^']+)'", line.split("did you mean", 1)[1])
    assert MODEL in suggested
    assert all(default_catalog().has_model(name) for name in suggested)


@pytest.mark.parametrize(("flag", "value"), [
    ("--shares", "0,1.5"), ("--shares", "0.5,1.5"), ("--shares", "half"), ("--shares", ","),
    ("--tp", "x"), ("--tp", "0"), ("--tp", "16"), ("--batch", "0"), ("--seq", "0"),
])
def test_show_bad_option_names_the_option(capsys: pytest.CaptureFixture[str], flag: str,
                                          value: str) -> None:
    rc = main(["profile", "show", "--model", MODEL, "--gpu", GPU, flag, value])
    assert_user_error(rc, *capsys.readouterr(), flag)


def test_show_missing_curves_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nowhere.json"
    rc = main(["profile", "show", "--model", MODEL, "--gpu", GPU, "--curves", str(path)])
    assert_user_error(rc, *capsys.readouterr(), str(path))


def test_show_curves_with_bad_format(fitted: tuple[Path, int, str, str], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    good, rc, *_ = fitted
    assert rc == 0
    doc = json.loads(good.read_text(encoding="utf-8"))
    doc["format"] = "something-else/9"
    path = tmp_path / "curves.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    rc = main(["profile", "show", "--model", MODEL, "--gpu", GPU, "--curves", str(path)])
    assert_user_error(rc, *capsys.readouterr(), str(path), "format", "something-else/9")


def test_show_catalog_with_negative_memory(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("gpus:\n  X-GPU:\n    memory_gib: -8\n    bf16_tflops: 100\n"
                    "    hbm_gbps: 1000\n    nvlink_domain: 1\n    interconnect_gbps: 64\n",
                    encoding="utf-8")
    rc = main(["profile", "show", "--model", MODEL, "--gpu", "X-GPU", "--catalog", str(path)])
    assert_user_error(rc, *capsys.readouterr(), str(path), "memory_gib")


@pytest.mark.parametrize("case", ["muxserve directory", "non-UTF-8 measurements",
                                  "non-UTF-8 curves"])
def test_unreadable_input_file_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               case: str) -> None:
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    out = tmp_path / "curves.json"
    argv = {
        "muxserve directory": ["profile", "fit", "--muxserve", str(tmp_path), "--out", str(out)],
        "non-UTF-8 measurements": ["profile", "fit", "--measurements", str(binary),
                                   "--out", str(out)],
        "non-UTF-8 curves": ["profile", "show", "--model", MODEL, "--gpu", GPU,
                             "--curves", str(binary)],
    }[case]
    assert main(argv) == 2
    assert not out.exists()


@pytest.mark.parametrize("argv", [[], ["profile"], ["profile", "fit", "--out", "x.json"],
                                  ["profile", "show", "--model", MODEL],
                                  ["profile", "show", "--model", MODEL, "--gpu", GPU,
                                   "--batch", "many"]],
                         ids=["nothing", "no profile command", "fit without input",
                              "show without gpu", "non-integer batch"])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main(argv) == 2
    stdout, stderr = capsys.readouterr()
    assert stdout == ""
    assert stderr.startswith("scepsy") and stderr.count("\n") == 1  # one line
    assert "error:" in stderr and "--help" in stderr
    assert "Traceback" not in stderr


# --- the installed console script --------------------------------------------------------------


def test_console_script_exit_codes(tmp_path: Path) -> None:
    """Success exits 0 and a user error exits 2 through the real entry point (usage errors
    are checked in-process above)."""
    exe = shutil.which("scepsy") or str(Path(sys.executable).with_name("scepsy"))
    assert Path(exe).exists(), "the scepsy console script is not installed"
    bad = tmp_path / "points.jsonl"
    bad.write_text(json.dumps({**GOOD, "latency_ms": -2}) + "\n", encoding="utf-8")
    out = tmp_path / "curves.json"
    cases = {
        "ok": ([exe, "profile", "show", "--model", MODEL, "--gpu", GPU, "--tp", "1",
                "--shares", "1"], 0),
        "input error": ([exe, "profile", "fit", "--measurements", str(bad), "--out", str(out)], 2),
    }
    procs = {name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, cwd=tmp_path)
             for name, (cmd, _) in cases.items()}
    results = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        results[name] = (p.returncode, stdout, stderr)
    for name, (rc, _stdout, stderr) in results.items():
        assert rc == cases[name][1], (name, stderr)
        assert "Traceback" not in stderr
    rc, stdout, stderr = results["ok"]
    assert [(int(r["tp"]), float(r["share"])) for r in parse_table(stdout)] == [(1, 1.0)]
    rc, stdout, stderr = results["input error"]
    assert stderr.strip().splitlines() == [stderr.strip()]
    assert stderr.startswith("scepsy: error: ") and str(bad) in stderr and "latency_ms" in stderr
    assert not out.exists()
