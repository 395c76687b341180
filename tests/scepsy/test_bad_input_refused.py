"""Bad input an unseen campaign found on the newer surfaces (bench loop and gpu, profile
calibrate and run, predict, simulate and plan with arrivals): each is refused before any work
starts, in one line naming the file or flag and the field, with nothing written over."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from scepsy_common.errors import InputError

DATA = REPO / "datasets"
CPU_CURVES = DATA / "profiles" / "vllm-cpu-llama-3-8b-x0.0625-curves.json"
SERVE = DATA / "profiles" / "vllm-cpu-llama-3-8b-x0.0625.serve-curve.json"


def one_line_refusal(code: int, err: str, start: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(start), err
    assert "Traceback" not in err


# ------------------------------------------------------------------- bench loop, bench gpu

@pytest.mark.parametrize("argv", [
    ["bench", "loop", "--curves", str(CPU_CURVES), "--out", "/proc/scepsy-test-out"],
    ["bench", "gpu", "--cpu", "--curves", str(CPU_CURVES), "--out", "/proc/scepsy-test-out"],
])
def test_an_out_folder_that_cannot_be_made_is_refused_at_once(argv) -> None:
    code, _, err = run_cli(*argv)
    one_line_refusal(code, err, "scepsy: error: --out: expected a folder that can be made")


@pytest.mark.parametrize("command", [["bench", "loop"], ["bench", "gpu", "--cpu"]])
@pytest.mark.parametrize("python", ["nonexistent", "not-executable"])
def test_an_engine_python_that_is_no_program_is_refused_before_planning(
        command, python, tmp_path) -> None:
    out = tmp_path / "out"
    path = tmp_path / python
    if python == "not-executable":
        path.write_text("#!/bin/sh\n")
        path.chmod(0o644)
    code, _, err = run_cli(*command, "--curves", str(CPU_CURVES), "--engine-python", str(path),
                           "--out", str(out))
    one_line_refusal(code, err, "scepsy: error: --engine-python: expected the python of vLLM's")
    assert not out.exists()  # refused before anything was made


def test_servers_that_do_not_start_end_the_kit_with_their_logs_not_a_traceback(
        tmp_path) -> None:
    fake = tmp_path / "python"  # a program, but no vLLM: every server exits at once
    fake.write_text("#!/bin/sh\necho 'no vllm here' >&2\nexit 3\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    code, _, err = run_cli("bench", "gpu", "--cpu", "--curves", str(CPU_CURVES),
                           "--engine-python", str(fake), "--out", str(out))
    assert code == 1 and "Traceback" not in err, err
    assert err.rstrip().endswith(f"scepsy: the servers did not start; every server was "
                                 f"stopped (results in {out})"), err
    assert "no vllm here" in err  # the server's own log
    assert json.loads((out / "results.json").read_text())["error"]


def test_given_curves_must_cover_every_llm_of_the_loop() -> None:
    from scepsy.api import using_catalog
    from scepsy_opt.workload import load_specs
    from scepsy_serve.loop.bench_loop import given_curves, loop_models

    with using_catalog(DATA / "catalogs" / "cpu-host.yaml") as catalog:
        models = loop_models(load_specs(DATA / "workflows" / "cpu-beam-search.yaml"), catalog)
    assert given_curves(str(CPU_CURVES), models, ["cpu"], (1, 2)).path == str(CPU_CURVES)
    with pytest.raises(InputError) as exc:  # A100 curves of other models: none of these
        given_curves(str(DATA / "profiles" / "muxserve-a100-curves.json"), models, ["cpu"], (1,))
    assert exc.value.field == "curves" and "llama-3-8b:x0.0625 on cpu at TP 1" in str(exc.value)
    with pytest.raises(InputError, match="on A100-80GB at TP 1"):  # measured on the CPU
        given_curves(str(CPU_CURVES), models, ["A100-80GB"], (1, 2))
    # a larger TP degree without curves is the roofline's, as in plan (and --tp's own check
    # names a degree the models cannot use)
    assert given_curves(str(CPU_CURVES), models, ["cpu"], (1, 4)).path == str(CPU_CURVES)


# ---------------------------------------------------------------------- serve-curve files

def _serve_copy(tmp_path: Path, change) -> Path:
    doc = json.loads(SERVE.read_text())
    change(doc)
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(doc))  # NaN written as NaN, as json.dumps does
    return path


BAD_SERVE = [
    (lambda d: d.pop("model"), "model"),
    (lambda d: d.update(tp=0), "tp"),
    (lambda d: d.update(points=[]), "points"),
    (lambda d: d["points"][1].update(achieved_rate=-3.0), "points[1].achieved_rate"),
    (lambda d: d["points"][0].update(achieved_rate=math.nan), "points[0].achieved_rate"),
    (lambda d: d["points"][0].update(rate=math.inf), "points[0].rate"),
    (lambda d: d["points"][2].update(completed=d["points"][2]["calls"] + 1), "points[2]"),
    (lambda d: d["points"][0]["client"]["e2e"].update(mean=-1.0), "points[0].client.e2e.mean"),
]


@pytest.mark.parametrize(("change", "field"), BAD_SERVE, ids=[f for _, f in BAD_SERVE])
def test_profile_calibrate_names_the_field_of_a_bad_serve_curve(change, field, tmp_path) -> None:
    path = _serve_copy(tmp_path, change)
    out = tmp_path / "o.yaml"
    code, _, err = run_cli("profile", "calibrate", "--catalog",
                           str(DATA / "catalogs" / "cpu-host.yaml"), "--serve-curve", str(path),
                           "--curves", str(CPU_CURVES), "--out", str(out))
    one_line_refusal(code, err, f"scepsy: error: {path}: {field}")
    assert not out.exists()


@settings(max_examples=30, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_serve_curve_rate_is_read_only_when_finite_and_not_negative(value) -> None:
    # oracle: the documented bound of achieved_rate, >= 0 and finite
    import tempfile

    from scepsy_profile.profiling.servecurve import load_result

    doc = json.loads(SERVE.read_text())
    doc["points"][0]["achieved_rate"] = value
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.json"
        path.write_text(json.dumps(doc))
        if math.isfinite(value) and value >= 0:
            assert load_result(path).points[0].achieved_rate == value
        else:
            with pytest.raises(InputError, match=r"points\[0\]\.achieved_rate"):
                load_result(path)


def test_every_bundled_serve_curve_reads() -> None:
    from scepsy_profile.profiling.servecurve import load_result

    files = sorted(DATA.rglob("*serve-curve*.json"))
    assert len(files) >= 3
    for f in files:
        assert load_result(f).points


# --------------------------------------------------------------- predict, simulate, plan

RAG = str(DATA / "workflows" / "rag.yaml")
ALLOC = str(DATA / "allocations" / "rag-4gpu.yaml")


def test_an_engine_flag_out_of_range_is_one_line_in_predict() -> None:
    code, _, err = run_cli("predict", "--workflow", RAG, "--trace-requests", "50",
                           "--allocation", ALLOC, "--rate", "1", "--block-size", "2000")
    one_line_refusal(code, err, "scepsy: error: --block-size: expected 1 to 1024 tokens")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    code, _, err = run_cli("plan", "--workflow", RAG, "--cluster",
                           str(DATA / "clusters" / "a100-4.yaml"), "--target", "3",
                           "--trace-requests", "100", "--out", str(out), "--quiet",
                           "--no-timings")
    assert code == 0, err
    return out


@pytest.mark.parametrize("command", ["predict", "simulate"])
def test_a_plan_json_as_allocation_is_checked_whole(command, plan_file, tmp_path) -> None:
    doc = json.loads(plan_file.read_text())
    doc["llms"]["generator"]["replicas"] = 0  # the allocation section left as it was
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps(doc))
    extra = ["--requests", "5"] if command == "simulate" else []
    code, _, err = run_cli(command, "--workflow", RAG, "--trace-requests", "50",
                           "--allocation", str(bad), "--rate", "1", *extra)
    one_line_refusal(code, err, f"scepsy: error: {bad}: llms.generator.replicas: expected")
    code, _, err = run_cli(command, "--workflow", RAG, "--trace-requests", "50",
                           "--allocation", str(plan_file), "--rate", "1", *extra)
    assert code == 0, err


def test_arrivals_whose_mean_rate_is_no_rate_name_the_file(tmp_path) -> None:
    arrivals = tmp_path / "a.txt"
    arrivals.write_text("0\n1\n1e12\n")
    code, _, err = run_cli("simulate", "--workflow", RAG, "--trace-requests", "50",
                           "--allocation", ALLOC, "--arrivals", str(arrivals), "--requests", "3")
    one_line_refusal(code, err, f"scepsy: error: {arrivals}: expected a rate in")
    assert "mean rate of the arrival times" in err


def test_arrivals_spanning_too_many_windows_are_refused_not_counted(tmp_path) -> None:
    arrivals = tmp_path / "a.txt"
    arrivals.write_text("0\n1\n1e12\n")  # 1.7e10 windows of 60 s: 124 GiB of counts
    out = tmp_path / "plan.json"
    code, _, err = run_cli("plan", "--workflow", RAG, "--cluster",
                           str(DATA / "clusters" / "a100-16.yaml"), "--arrivals",
                           str(arrivals), "--trace-requests", "50", "--out", str(out))
    one_line_refusal(code, err, f"scepsy: error: {arrivals}: expected arrival times whose span")
    assert not out.exists()


def test_extrapolated_shares_are_warnings_on_stderr(tmp_path) -> None:
    code, out, err = run_cli(
        "plan", "--catalog", str(DATA / "catalogs" / "cpu-host.yaml"), "--curves",
        str(CPU_CURVES), "--cluster", str(DATA / "clusters" / "cpu-host.yaml"), "--workflow",
        str(DATA / "workflows" / "cpu-rag-beam.yaml"), "--target", "2", "--tp", "1,2",
        "--shares", "0.5,1", "--trace-requests", "100", "--out", str(tmp_path / "p.json"),
        "--quiet", "--no-timings")
    assert code == 0, err
    assert "warning" not in out
    warned = [ln for ln in err.splitlines() if "extrapolated" in ln]
    assert warned and all(ln.startswith("scepsy: warning: ") for ln in warned)
    assert all("only share 1 was measured" in ln for ln in warned), warned


# ---------------------------------------------------- errors about a flag name the flag

@pytest.mark.parametrize(("argv", "flag"), [
    (["trace", "generate", "--workflow", RAG, "--requests", str(10**11), "--out", "t.jsonl"],
     "--requests"),
    (["profile", "serve-curve", "--model", "llama-3-8b", "--scale", "0.0625", "--factor", "1",
      "--engine-python", "/nonexistent/python", "--out", "s.json"], "--factor"),
])
def test_a_library_bound_on_an_option_names_the_option(argv, flag, tmp_path,
                                                       monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(*argv)
    one_line_refusal(code, err, f"scepsy: error: {flag}: expected")
    assert list(tmp_path.iterdir()) == []


def test_launch_names_target_for_an_unknown_renderer(plan_file, tmp_path) -> None:
    code, _, err = run_cli("launch", str(plan_file), "--target", "foo", "--out",
                           str(tmp_path / "l"))
    one_line_refusal(code, err, "scepsy: error: --target: expected one of k8s, ray, routes, "
                     "shell (got 'foo')")
