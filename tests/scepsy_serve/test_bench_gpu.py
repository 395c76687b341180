"""The GPU kit (``scepsy bench gpu``): device detection, the kit per device, the MPS daemon,
and the whole kit on this CPU through the same code path (the loop's fake engine here, vLLM's
CPU servers under ``@pytest.mark.vllm``)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from test_bench_loop import _assert_nothing_left, _vllm, fake_engine  # noqa: F401

from conftest import run_cli
from scepsy import api
from scepsy_common.errors import InputError
from scepsy_serve.loop import bench_gpu as bg
from scepsy_serve.loop import bench_loop as bl

REPO = Path(__file__).resolve().parents[2]
SMI = ("NVIDIA A100-SXM4-80GB, 81920\n"
       "NVIDIA H200, 143771\n"
       "NVIDIA GeForce GTX 1080, 8192\n"
       "garbage\n")


def _ran(stdout: str = "", code: int = 0):
    calls = []

    def run(argv, **kw):
        calls.append((list(argv), kw))
        return subprocess.CompletedProcess(argv, code, stdout, "no permission" if code else "")
    return run, calls


def test_nvidia_smi_lines_map_to_catalog_gpus():
    got = bg.parse_nvidia_smi(SMI)
    assert [(g.name, g.gpu) for g in got] == [("NVIDIA A100-SXM4-80GB", "A100-80GB"),
                                              ("NVIDIA H200", "H200"),
                                              ("NVIDIA GeForce GTX 1080", None)]
    assert got[0].memory_gib == pytest.approx(80.0, rel=1e-12)


def test_no_nvidia_smi_or_a_failing_one_is_no_gpu():
    run, calls = _ran(SMI)
    assert [g.gpu for g in bg.nvidia_gpus(run)] == ["A100-80GB", "H200", None]
    assert calls[0][0][0] == "nvidia-smi"
    assert bg.nvidia_gpus(_ran(SMI, code=9)[0]) == ()

    def missing(argv, **kw):
        raise FileNotFoundError(argv[0])
    assert bg.nvidia_gpus(missing) == ()


def test_the_device_is_the_first_gpu_or_the_cpu_when_asked():
    gpus = bg.parse_nvidia_smi(SMI)
    assert bg.choose_device(bg.KitOptions(), gpus) == ("cuda", "A100-80GB")
    assert bg.choose_device(bg.KitOptions(device="cpu"), gpus) == ("cpu", "cpu")
    with pytest.raises(InputError, match="--cpu runs the same kit"):
        bg.choose_device(bg.KitOptions(), ())
    with pytest.raises(InputError, match="GTX 1080"):
        bg.choose_device(bg.KitOptions(device="cuda"), gpus[2:])
    with pytest.raises(InputError, match="device"):
        bg.KitOptions(device="tpu")


def test_the_gpu_kit_shares_one_gpu_under_mps(tmp_path):
    lo = bg.loop_options(bg.KitOptions(), "cuda", "H200", tmp_path)
    assert lo.device == "cuda" and lo.tps == (1,) and lo.catalog is None
    assert lo.shares == lo.profile_shares == bg.KITS["cuda"].shares
    assert Path(lo.workflow).is_file() and Path(lo.workflow).name == "gpu-beam-pair.yaml"
    cluster = yaml.safe_load(Path(lo.cluster).read_text())
    assert cluster["racks"][0]["nodes"] == [{"name": "host", "gpu": "H200", "gpus": 1,
                                             "nvlink_domain": 1}]
    cpu = bg.loop_options(bg.KitOptions(device="cpu"), "cpu", "cpu", tmp_path / "c")
    assert cpu.device == "cpu" and cpu.profile_shares == (1.0,)
    assert Path(cpu.catalog).is_file()


def test_gpu_servers_get_their_share_of_memory_and_cuda_graphs():
    args = bl.gpu_memory_args({"generator": {"share": 0.7, "gpu": "H200", "tp": 1},
                               "prm": {"share": 0.3, "memory": 0.25, "gpu": "H200", "tp": 1}})
    assert args == {"generator": ["--gpu-memory-utilization", "0.63"],
                    "prm": ["--gpu-memory-utilization", "0.225"]}
    engine = bl.gpu_engine_args(1040, 32)
    assert "--enforce-eager" not in engine and "--load-format" in engine
    assert "--enforce-eager" in bl.cpu_engine_args(1040, 32)
    with pytest.raises(InputError, match="device"):
        bl.LoopOptions(device="tpu")
    with pytest.raises(InputError, match="profile_shares"):
        bl.LoopOptions(profile_shares=(0.0,))


def test_the_mps_daemon_is_started_for_the_block_and_told_to_quit(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    run, calls = _ran()
    with bg.mps_daemon(tmp_path / "mps", run, running=lambda: False) as started:
        assert started
        assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "pipe")
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert [c[0] for c in calls] == [["nvidia-cuda-mps-control", "-d"],
                                     ["nvidia-cuda-mps-control"]]
    assert calls[1][1]["input"] == "quit\n"
    assert calls[0][1]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "pipe")
    run, calls = _ran()
    with bg.mps_daemon(tmp_path / "mps", run, running=lambda: True) as started:
        assert not started
    assert calls == []  # one runs already: used as it is
    failing = bg.mps_daemon(tmp_path / "mps", _ran(code=1)[0], running=lambda: False)
    with pytest.raises(InputError, match="no permission"), failing:
        pass


def test_on_a_gpu_the_loop_runs_inside_the_mps_daemon(tmp_path):
    seen = []

    @contextlib.contextmanager
    def mps(folder):
        seen.append(("mps", folder))
        yield True
        seen.append(("quit", folder))

    def loop(options, planning, say):
        seen.append(("loop", options.device, options.shares))
        return "result"

    got = bg.run_kit(bg.KitOptions(out=str(tmp_path / "k")), planning=None,  # type: ignore[arg-type]
                     gpus=lambda: bg.parse_nvidia_smi(SMI), mps=mps, loop=loop)
    assert got == "result"
    assert seen == [("mps", tmp_path / "k" / "mps"),
                    ("loop", "cuda", bg.KITS["cuda"].shares), ("quit", tmp_path / "k" / "mps")]


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
def test_the_kit_on_this_cpu_plans_both_llms_onto_one_device(tmp_path, fake_engine):  # noqa: F811
    """The same code path as on a GPU, on the CPU kit: one device, both LLMs sharing it,
    launched (a fake engine with vLLM's command line), driven, stopped, recorded."""
    def loop(options, planning, say):
        return bl.run_loop(replace(options, engine_command=fake_engine, engine_args=(),
                                   rate=2.0, requests=20, trace_requests=200,
                                   health_timeout_s=60.0, call_timeout_s=30.0),
                           planning, say)

    kit = bg.KitOptions(device="cpu", out=str(tmp_path / "kit"), keep=True,
                        curves=str(REPO / bl.BUNDLED_CURVES))
    planning = bl.Planning(plan=api.plan, predict=api.predict, using_catalog=api.using_catalog)
    res = bg.run_kit(kit, planning, loop=loop)
    assert res.clean and res.error is None
    _assert_nothing_left(res)
    assert set(res.allocation) == {"generator", "prm"}
    doc = json.loads(Path(res.files["plan"]).read_text())
    devices = {(i["node"], tuple(i["gpus"])) for i in doc["placement"]["instances"]}
    assert devices == {("host", (0,))}  # one device holds every replica
    used = sum(i["share"] for i in doc["placement"]["instances"])
    assert used <= 1.0 + 1e-9
    record = json.loads((tmp_path / "kit" / "results.json").read_text())
    assert record["options"]["device"] == "cpu" and record["drive"]["sent"] == 20
    assert set(record["comparison"]["llms"]) == {"generator", "prm"}


def test_bench_gpu_without_a_gpu_says_to_use_cpu(tmp_path):
    if bg.nvidia_gpus():
        pytest.skip("this machine has an NVIDIA GPU")
    code, _, err = run_cli("bench", "gpu", "--out", str(tmp_path / "k"))
    assert code == 2 and "expected an NVIDIA GPU" in err and "--cpu" in err
    assert not (tmp_path / "k").exists()


@pytest.mark.vllm
@pytest.mark.slow
def test_the_kit_on_this_cpu_with_vllm(tmp_path):
    """The CPU kit end to end with vLLM's CPU servers (the bundled curves; the profiling stage
    has its own test in test_bench_loop.py)."""
    python = _vllm()
    res = api.bench_gpu(device="cpu", out=str(tmp_path / "kit"), requests=20,
                        curves=str(REPO / bl.BUNDLED_CURVES), engine_python=python)
    assert res.drive is not None and res.drive["completed"] > 0
    assert res.drive["completed"] + res.drive["failed"] == res.drive["sent"] == 20
    _assert_nothing_left(res)
    assert (tmp_path / "kit" / "results.json").is_file()


# ------------------------------------------------------------------ the rates the drive sent


def test_offered_rates_split_the_merged_rate_by_each_workflows_arrivals():
    """Oracle: the merged process's (N - 1) / span, shared by arrival counts."""
    from scepsy_serve.launch.drive import offered_rates

    arrivals = [("a", 0.0), ("b", 1.0), ("a", 2.0), ("a", 4.0), ("b", 5.0)]
    got = offered_rates(arrivals)
    assert got == pytest.approx({"a": 3 / 5 * 4 / 5, "b": 2 / 5 * 4 / 5}, rel=1e-12)
    assert sum(got.values()) == pytest.approx(4 / 5, rel=1e-12)
    assert offered_rates([("a", 1.0)]) == {} and offered_rates([("a", 1.0), ("a", 1.0)]) == {}


def test_the_loop_predicts_at_the_sent_rates_where_every_workflow_has_one():
    drive = {"workflows": {"rag": {"offered_rps": 0.5}, "beam": {"offered_rps": 0.25}}}
    assert bl.sent_rates(drive, 1.0) == {"beam": 0.25, "rag": 0.5}
    drive["workflows"]["beam"]["offered_rps"] = None
    assert bl.sent_rates(drive, 1.0) == 1.0
    assert bl.sent_rates({"workflows": {}}, 2.0) == 2.0
