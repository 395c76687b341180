"""The serving engine's settings (vLLM's max_num_seqs, KV block size and management, token
budget) reach the predictor, the simulator and the planner from the API (``engine=``) and the
command line (``--max-num-seqs``, ``--block-size``, ``--max-num-batched-tokens``, ``--kv``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from scepsy import api
from scepsy_common.errors import InputError
from scepsy_profile.serving import MemoryPolicy

RATES = REPO / "datasets" / "workloads" / "cpu-rates.yaml"
CATALOG = REPO / "datasets" / "catalogs" / "cpu-host.yaml"
CURVES = REPO / "datasets" / "profiles" / "vllm-cpu-llama-3-8b-x0.0625-curves.json"
REL = 1e-9  # the CLI prints the library's floats through JSON: equal to rounding


def _alloc(tmp_path: Path) -> Path:
    path = tmp_path / "alloc.json"
    one = {"gpu": "cpu", "tp": 1, "share": 1.0, "replicas": 1}
    path.write_text(json.dumps({"llms": {"chat": one, "summarise": one}}))
    return path


def _predict_cli(tmp_path: Path, *flags: str) -> dict:
    code, out, err = run_cli("predict", "--workflow", str(RATES), "--allocation",
                          str(_alloc(tmp_path)), "--catalog", str(CATALOG), "--curves",
                          str(CURVES), "--json", *flags)
    assert code == 0, err
    return json.loads(out)


def _mu(pred) -> dict[str, float]:
    return {m: load.mu for m, load in pred.llms.items()}


def test_the_batch_limit_bounds_saturation(tmp_path: Path) -> None:
    """A smaller max_num_seqs can only lower μ; the CLI flag gives the library's answer."""
    common = {"catalog": CATALOG, "curves": CURVES}
    default = api.predict(RATES, _alloc(tmp_path), **common)
    small = api.predict(RATES, _alloc(tmp_path), engine=MemoryPolicy(max_batch=4), **common)
    for m in default.llms:
        assert small.llms[m].mu <= default.llms[m].mu * (1 + REL)
    assert any(small.llms[m].mu < default.llms[m].mu * (1 - 1e-3) for m in default.llms)
    doc = _predict_cli(tmp_path, "--max-num-seqs", "4")
    for m, mu in _mu(small).items():
        assert doc["llms"][m]["mu"] == pytest.approx(mu, rel=REL)


def test_kv_and_block_flags_build_the_policy(tmp_path: Path) -> None:
    policy = MemoryPolicy(kv_management="reserve", block_size=32, max_num_batched_tokens=256)
    lib = api.predict(RATES, _alloc(tmp_path), catalog=CATALOG, curves=CURVES, engine=policy)
    doc = _predict_cli(tmp_path, "--kv", "reserve", "--block-size", "32",
                       "--max-num-batched-tokens", "256")
    for m, mu in _mu(lib).items():
        assert doc["llms"][m]["mu"] == pytest.approx(mu, rel=REL)
        assert doc["llms"][m]["call_latency_s"] == pytest.approx(lib.llms[m].call_latency_s,
                                                                 rel=REL)


def test_the_simulator_runs_the_given_engine(tmp_path: Path) -> None:
    res = api.simulate(RATES, _alloc(tmp_path), catalog=CATALOG, curves=CURVES, requests=50,
                       engine=MemoryPolicy(max_batch=3))
    assert {s.max_batch for s in res.llms.values()} == {3}


def test_the_planner_plans_for_the_given_engine() -> None:
    policy = MemoryPolicy(max_batch=8)
    problem, _ = api.plan_problem(RATES, REPO / "datasets" / "clusters" / "cpu-host.yaml",
                                  catalog=CATALOG, curves=CURVES, engine=policy, tps=(1,))
    assert problem.policy == policy


@pytest.mark.parametrize(("flags", "says"), [
    (("--max-num-seqs", "0"), "--max-num-seqs"),
    (("--kv", "lazy"), "--kv"),
    (("--max-num-batched-tokens", "-3"), "--max-num-batched-tokens"),
])
def test_bad_engine_flags_are_one_line_exit_2(tmp_path: Path, flags: tuple[str, ...],
                                              says: str) -> None:
    code, out, err = run_cli("predict", "--workflow", str(RATES), "--allocation",
                          str(_alloc(tmp_path)), "--catalog", str(CATALOG), *flags)
    assert code == 2 and out == ""
    text = err.strip()
    assert len(text.splitlines()) == 1
    assert says in text and "Traceback" not in text


def test_engine_must_be_a_policy(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="engine"):
        api.predict(RATES, _alloc(tmp_path), catalog=CATALOG, engine={"max_batch": 4})
