"""Bad option values on the command line: each exits 2 with one line on stderr that names the
option, no traceback, and nothing written or clobbered; checked before any work is done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import scepsy_place.formulations.loop
from scepsy.cli import main

REPO = Path(__file__).resolve().parents[2]
RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
A4 = str(REPO / "datasets" / "clusters" / "a100-4.yaml")
A16 = str(REPO / "datasets" / "clusters" / "a100-16.yaml")
ALLOC = str(REPO / "datasets" / "allocations" / "rag-4gpu.yaml")
FAST = ["--trace-requests", "100"]
SENTINEL = "do not clobber\n"


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int, needle: str) -> str:
    out = capsys.readouterr()
    assert code == 2, out.err
    assert out.err.count("\n") == 1 and out.err.startswith("scepsy"), out.err
    assert needle in out.err, out.err
    assert "Traceback" not in out.err and "error" in out.err
    return out.err


def _plan(tmp_path: Path, *args: str, out: str | None = None) -> list[str]:
    return ["plan", "--workflow", RAG, "--cluster", A4, "--target", "2",
            "--out", out if out is not None else str(tmp_path / "plan.json"), *FAST, *args]


# ----------------------------------------------------------------------------- --out


@pytest.fixture
def no_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the plan is computed at all (the output is checked before)."""
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("the plan was computed before --out was checked")
    monkeypatch.setattr(scepsy_place.formulations.loop, "plan_and_place", refuse)


def _bad_outs(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    return {"directory": str(tmp_path / "a-dir"), "empty": "", "under a file":
            str(tmp_path / "a-file" / "plan.json"), "proc": "/proc/scepsy-plan.json",
            "sys": "/sys/scepsy/plan.json", "dot": "."}


@pytest.mark.parametrize("kind", ["directory", "empty", "under a file", "proc", "sys", "dot"])
def test_plan_rejects_an_unwritable_out_before_planning(capsys, tmp_path, no_planning, kind):
    out = _bad_outs(tmp_path)[kind]
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(_plan(tmp_path, out=out))
    _one_line_error(capsys, code, "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    assert (tmp_path / "a-file").read_text() == "x"


@pytest.mark.parametrize("kind", ["directory", "under a file", "proc"])
def test_trace_generate_and_fit_reject_an_unwritable_out(capsys, tmp_path, kind):
    out = _bad_outs(tmp_path)[kind]
    code = main(["trace", "generate", "--workflow", RAG, "--requests", "2", "--out", out])
    _one_line_error(capsys, code, "--out")
    meas = tmp_path / "m.jsonl"
    meas.write_text("")
    code = main(["profile", "fit", "--measurements", str(meas), "--out", out])
    _one_line_error(capsys, code, "--out")


# ------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("argv", [
    ["plan", "--workflow", RAG, "--cluster", A4, "--target", "1", "--seed", "-1"],
    ["predict", "--workflow", RAG, "--allocation", ALLOC, "--rate", "1", "--seed", "-1"],
    ["simulate", "--workflow", RAG, "--allocation", ALLOC, "--rate", "1", "--seed", "-1"],
    ["trace", "generate", "--workflow", RAG, "--requests", "1", "--out", "t.jsonl",
     "--seed", "-1"],
    ["stats", "t.jsonl", "--seed", "-1"],
    ["profile", "fit", "--measurements", "m.jsonl", "--out", "c.json", "--seed", "-1"],
], ids=["plan", "predict", "simulate", "trace", "stats", "fit"])
def test_negative_seed_is_a_usage_error(capsys, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    _one_line_error(capsys, main(argv), "--seed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("flag", "value"), [
    ("--trace-requests", "0"), ("--time-limit", "nan"), ("--time-limit", "-1"),
    ("--max-rounds", "0"), ("--change-penalty", "-1"), ("--change-penalty", "inf"),
])
def test_plan_number_flags(capsys, tmp_path, flag, value):
    _one_line_error(capsys, main(_plan(tmp_path, flag, value)), flag)
    assert not (tmp_path / "plan.json").exists()


# ------------------------------------------------------------------- bench openb


@pytest.fixture
def openb(tiny_openb: tuple[Path, Path]) -> list[str]:
    nodes, pods = tiny_openb
    return ["bench", "openb", "--nodes", str(nodes), "--pods", str(pods)]


@pytest.mark.parametrize(("flag", "value"), [
    ("--until", "-1"), ("--until", "nan"), ("--until", "inf"), ("--until", "0"),
    ("--policy", ""), ("--policy", " , "), ("--seed", "-1"),
])
def test_bench_openb_bad_values(capsys, openb, flag, value):
    _one_line_error(capsys, main([*openb, flag, value]), flag)


def test_bench_openb_seed_0_is_seed_0(capsys, openb):
    """``--seed 0`` was replaced by the default 42 (``seed or 42``)."""
    runs = {}
    for seed in ("0", "42"):
        assert main([*openb, "--seed", seed, "--until", "0.5", "--json"]) == 0
        runs[seed] = json.loads(capsys.readouterr().out)["results"][0]
    assert runs["0"]["seed"] == 0 and runs["42"]["seed"] == 42


# ------------------------------------------------------------------ plan options


def test_latency_bound_in_min_latency_mode_is_rejected(capsys, tmp_path):
    err = _one_line_error(capsys, main(_plan(tmp_path, "--latency-bound", "1")),
                          "--latency-bound")
    assert "max-throughput" in err
    assert not (tmp_path / "plan.json").exists()


def test_change_penalty_needs_current(capsys, tmp_path):
    err = _one_line_error(capsys, main(_plan(tmp_path, "--change-penalty", "1")),
                          "--change-penalty")
    assert "current" in err


def test_current_with_an_unknown_gpu_is_rejected_like_predict(capsys, tmp_path):
    bad = tmp_path / "cur.yaml"
    bad.write_text(Path(ALLOC).read_text().replace("A100-80GB", "B300"))
    out = tmp_path / "plan.json"
    out.write_text(SENTINEL)
    err = _one_line_error(capsys, main(_plan(tmp_path, "--current", str(bad))), "B300")
    assert str(bad) in err and "gpu" in err
    assert out.read_text() == SENTINEL  # not clobbered
    code = main(["predict", "--workflow", RAG, "--allocation", str(bad), "--rate", "1", *FAST])
    _one_line_error(capsys, code, "B300")


@pytest.mark.parametrize(("flag", "value", "allowed"), [
    ("--tp", "3", "1, 2, 4"), ("--tp", "16", "1, 2, 4"), ("--tp", "8", "1, 2, 4"),
    ("--shares", "0.01", ">= "),
])
def test_grids_that_cannot_be_used_are_usage_errors_not_infeasible(capsys, tmp_path, flag,
                                                                     value, allowed):
    out = tmp_path / "plan.json"
    out.write_text(SENTINEL)
    err = _one_line_error(capsys, main(_plan(tmp_path, flag, value)), flag)
    assert allowed in err and "infeasible" not in err and "fits on no GPU" not in err
    assert out.read_text() == SENTINEL


def test_optimiser_user_needs_current_and_evaluates_it(capsys, tmp_path):
    _one_line_error(capsys, main(_plan(tmp_path, "--optimiser", "user")), "--optimiser")
    out = tmp_path / "plan.json"
    code = main(_plan(tmp_path, "--optimiser", "user", "--current", ALLOC, "--no-timings"))
    capsys.readouterr()
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["optimiser"] == "user"
    assert doc["allocation"] == json.loads(json.dumps(
        __import__("scepsy_opt.allocation", fromlist=["x"]).load_allocation(ALLOC).to_dict()))


def test_plan_help_lists_every_placer_formulation_and_optimiser(capsys):
    from scepsy_opt.planning.optimisers import OPTIMISERS
    from scepsy_place.formulations.loop import FORMULATIONS
    from scepsy_place.packing.placement import PLACERS

    assert main(["plan", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in [*PLACERS, *FORMULATIONS, *OPTIMISERS]:
        assert name in text
    assert "{hierarchical,ffd,best-fit,blocks}" in text


def test_trace_generate_rejects_duplicate_keys(capsys, tmp_path):
    wf = tmp_path / "dup.yaml"
    wf.write_text(Path(RAG).read_text() + "\nname: rag2\n")
    out = tmp_path / "t.jsonl"
    code = main(["trace", "generate", "--workflow", str(wf), "--requests", "2", "--out", str(out)])
    err = _one_line_error(capsys, code, str(wf))
    assert "name" in err
    assert not out.exists()
