"""The whole loop (``scepsy bench loop``): profile, plan, launch, drive, stop, compare.

The profiling stage runs with a fake profiler backend (registered as ``loop-fake``: a
deterministic step latency per point) or not at all (the bundled curves passed), so that no
test here starts a sweep of a real engine except those marked ``vllm``. Without vLLM the servers
are a fake engine (``tests/fakes/openai_server.py`` behind a small
launcher that takes vLLM's command line), so that the loop's own logic runs here in seconds:
every request accounted for, the comparison filled, and above all nothing left behind, also
when the drive fails or is interrupted (an exception, Ctrl-C as ``KeyboardInterrupt``, a real
SIGINT to a loop in another process). Under ``@pytest.mark.vllm`` the real loop runs with
vLLM's CPU servers (a few requests, the bundled curves), and the profiling stage measures this
machine with the vllm backend at TP 1 within a small budget."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field, replace
from io import StringIO
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy import api
from scepsy.cli import main
from scepsy_common.errors import InputError
from scepsy_opt.allocation import parse_allocation
from scepsy_opt.workload import load_specs
from scepsy_profile.catalog import load_catalog
from scepsy_profile.fitted import load_curves
from scepsy_profile.profiling.backend import (
    BackendOptions,
    BackendUnavailable,
    DeviceInfo,
    StepPoint,
    Timing,
)
from scepsy_profile.profiling.engine_env import vllm_python
from scepsy_profile.profiling.models import EngineModel, parse_scaled, profiled_name
from scepsy_profile.profiling.registry import backend_names, register_backend
from scepsy_profile.profiling.store import read_store
from scepsy_serve.loop import bench_loop as bl

REPO = Path(__file__).resolve().parents[2]

LAUNCHER = textwrap.dedent('''\
    """A fake engine with vLLM's command line: serves /health and streaming /v1/completions
    on --port until SIGTERM (tests/fakes/openai_server.py)."""
    import argparse
    import asyncio
    import signal
    import sys
    import threading

    sys.path.insert(0, {tests!r})
    from fakes.openai_server import FakeOpenAIServer

    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    args, _ = ap.parse_known_args()
    real = asyncio.start_server

    async def start_server(cb, host, port, **kw):
        return await real(cb, args.host, args.port, **kw)

    asyncio.start_server = start_server
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with FakeOpenAIServer(slots=16, prefill_s=0.002, token_s=0.0002):
        print("fake engine up on", args.port, flush=True)
        done.wait()
    ''')


@pytest.fixture
def fake_engine(tmp_path: Path) -> tuple[str, ...]:
    path = tmp_path / "fake_engine.py"
    path.write_text(LAUNCHER.format(tests=str(REPO / "tests")))
    return (sys.executable, str(path), "--model")


def _options(tmp_path: Path, engine: tuple[str, ...] | None, **kw: object) -> bl.LoopOptions:
    base = {"requests": 30, "rate": 2.0, "workflow": str(REPO / bl.LoopOptions.workflow),
            "cluster": str(REPO / bl.LoopOptions.cluster),
            "catalog": str(REPO / bl.LoopOptions.catalog),
            "curves": str(REPO / bl.BUNDLED_CURVES), "out": str(tmp_path / "loop"),
            "trace_requests": 200, "health_timeout_s": 60.0, "call_timeout_s": 30.0}
    if engine is not None:
        base |= {"engine_command": engine, "engine_args": ()}
    return bl.LoopOptions(**(base | kw))  # type: ignore[arg-type]


def _assert_nothing_left(result: dict[str, object] | bl.LoopResult) -> None:
    doc = result.to_dict() if isinstance(result, bl.LoopResult) else result
    run_id = str(doc["run_id"])
    assert bl.marked_processes(run_id) == ()
    assert doc["leftovers"] == {"pids": [], "ports": [], "killed": []}


@dataclass
class FakeProfiler:
    """A profiler backend for the profiling stage: step latencies of a fixed formula (a floor
    plus work shared by the TP ranks), no engine; it counts what the stage asked of it."""

    name: str = "loop-fake"
    sleep_s: float = 0.0
    start_s: float = 0.0
    """Seconds a session takes to start (an engine's start-up)."""
    noisy: bool = False
    """Timed runs that disagree as on a busy machine (the slowest 4x the median)."""
    down: str | None = None
    unsupported_tps: dict[int, str] = field(default_factory=dict)
    opened: list[tuple[int, float]] = field(default_factory=list)
    measured: list[tuple[int, StepPoint]] = field(default_factory=list)

    def unavailable(self, options: BackendOptions | None = None) -> str | None:
        return self.down

    def version(self, options: BackendOptions | None = None) -> str:
        return "0.0-loop"

    def unsupported(self, model: EngineModel, tp: int, share: float,
                    options: BackendOptions | None = None) -> str | None:
        return self.unsupported_tps.get(tp)

    @contextmanager
    def session(self, model: EngineModel, tp: int, share: float,
                options: BackendOptions) -> Iterator[_FakeProfilerSession]:
        self.opened.append((tp, share))
        time.sleep(self.start_s)
        yield _FakeProfilerSession(self, tp)


@dataclass
class _FakeProfilerSession:
    backend: FakeProfiler
    tp: int

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo("cpu", "cpu", memory_gib=4.0, count=self.tp,
                          detail={"model": "Fake CPU 9000", "cores": 2})

    def measure(self, point: StepPoint) -> Timing:
        self.backend.measured.append((self.tp, point))
        if self.backend.sleep_s:
            time.sleep(self.backend.sleep_s)
        b, n = point.batch, point.tokens
        work = 0.02 * b * n if point.phase == "prefill" else 0.05 * b + 0.0005 * b * n
        ms = 2.0 + work / self.tp
        if self.backend.noisy:
            return Timing.of([ms * 0.9, ms, ms * 4.0], method="fake")
        return Timing.of([ms * 0.99, ms, ms * 1.01], method="fake")


_PROFILER: list[FakeProfiler] = []


def _fake_profiler(**kw: object) -> FakeProfiler:
    """A fresh :class:`FakeProfiler`, the one ``get_backend("loop-fake")`` returns from now."""
    if "loop-fake" not in backend_names():
        register_backend("loop-fake", lambda: _PROFILER[-1])
    _PROFILER.append(FakeProfiler(**kw))  # type: ignore[arg-type]
    return _PROFILER[-1]


def _ports(plan_path: Path) -> list[int]:
    doc = json.loads(plan_path.read_text())
    base = doc["launch"]["base_port"]
    return [base + i for i in range(len(doc["placement"]["instances"]))]


# -------------------------------------------------------------------------- pure pieces


def test_parse_scaled() -> None:
    assert parse_scaled("llama-3-8b:x0.0625") == ("llama-3-8b", 0.0625)
    assert parse_scaled("qwen2.5-7b:x1e-2") == ("qwen2.5-7b", 0.01)
    assert parse_scaled("Qwen/Qwen2.5-7B") == ("Qwen/Qwen2.5-7B", 1.0)
    for scale in (1.0, 0.5, 0.0625, 0.01, 1e-4, 0.3):  # the inverse of profiled_name
        assert parse_scaled(profiled_name("llama-3-8b", scale)) == ("llama-3-8b", scale)


def test_options_reject_bad_values() -> None:
    for kw in ({"requests": 0}, {"rate": -1.0}, {"load": 1.5}, {"load": 0.0},
               {"max_model_len": 0}, {"seed": -1}, {"call_timeout_s": math.inf}):
        with pytest.raises(InputError):
            bl.LoopOptions(**kw)  # type: ignore[arg-type]


def test_free_port_range_is_free() -> None:
    base = bl.free_port_range(4)
    assert all(bl.port_free(base + i) for i in range(4))


def test_comparison_errors_are_relative_to_measured() -> None:
    pred = {"workflows": {"w": {"rate": 2.0, "throughput": 2.0, "max_throughput": 5.0,
                                "mean_latency_s": 1.5}},
            "llms": {"m": {"rate": 10.0, "utilisation": 0.5, "call_latency_s": 0.2}}}
    measured = {"window_s": 10.0,
                "workflows": {"w": {"sent": 20, "completed": 20, "failed": 0,
                                    "throughput_rps": 1.6, "latency": {"mean_s": 1.0}}},
                "llms": {"m": {"calls": 100, "ok": 100, "failed": 0,
                               "latency": {"mean_s": 0.25}}}}
    c = bl.comparison(pred, None, measured)
    assert c["workflows"]["w"]["throughput_error_pct"] == pytest.approx(25.0)
    assert c["workflows"]["w"]["latency_error_pct"] == pytest.approx(50.0)
    assert c["llms"]["m"]["calls_s_measured"] == pytest.approx(10.0)
    assert c["llms"]["m"]["call_latency_error_pct"] == pytest.approx(-20.0)
    assert c["workflows"]["w"]["latency_error_measured_trace_pct"] is None


def test_server_terms_pool_replicas_and_skip_missing() -> None:
    from scepsy_profile.profiling.server import parse_metrics

    def snap(count: float, total: float) -> object:
        return parse_metrics(f"vllm:e2e_request_latency_seconds_count {count}\n"
                             f"vllm:e2e_request_latency_seconds_sum {total}\n")

    before = {"m": [snap(1, 1.0), snap(0, 0.0), None]}
    after = {"m": [snap(3, 2.0), snap(2, 3.0), snap(5, 5.0)]}
    terms = bl.server_terms(before, after)  # type: ignore[arg-type]
    assert terms["m"]["e2e_s"] == pytest.approx((1.0 + 3.0) / (2 + 2))
    assert terms["m"]["queue_s"] is None


# --------------------------------------------------------------------- with a fake engine


def test_loop_with_fake_engine_accounts_for_every_request(tmp_path: Path,
                                                           fake_engine: tuple[str, ...]) -> None:
    res = api.bench_loop(_options(tmp_path, fake_engine, keep=True, rate=5.0))
    drive = res.drive
    assert drive is not None
    assert drive["sent"] == 30 and drive["completed"] + drive["failed"] == drive["sent"]
    assert drive["completed"] > 0
    assert res.clean and res.error is None
    _assert_nothing_left(res)
    assert all(bl.port_free(p) for p in _ports(Path(res.files["plan"])))
    doc = json.loads(Path(res.files["results"]).read_text())
    assert doc["clean"] is True
    for w, row in doc["comparison"]["workflows"].items():
        assert row["latency_predicted_s"] > 0, w
        assert row["latency_measured_s"] > 0, w
        assert row["throughput_measured"] > 0, w
        assert row["latency_predicted_measured_trace_s"] > 0, w
    assert set(doc["comparison"]["llms"]) == set(res.allocation)
    for m, row in doc["comparison"]["llms"].items():  # the fake serves vLLM's histograms
        assert row["ok"] > 0 and row["server_e2e_s"] > 0, m
        assert row["server_e2e_s"] <= row["call_latency_measured_s"] + 1e-3, m
    text = "\n".join(bl.report_lines(res))
    assert "left running: nothing" in text
    # the curves were given: no profiling stage, and the results say so
    assert doc["curves"]["path"] == str(REPO / bl.BUNDLED_CURVES)
    assert doc["curves"]["measured_here"] is False and doc["curves"]["measured"] == 0
    assert not (tmp_path / "loop" / "profile").exists()
    assert "curves: " in text and "(given; not measured by this run" in text
    # predicted as the servers run on the CPU: an allocation file, its LLMs at the cores'
    # speed, those sharing a core in one mesh, as the placement put them
    as_run = parse_allocation(doc["predicted_as"], "predicted_as",
                              catalog=load_catalog(str(REPO / "datasets/catalogs/cpu-host.yaml")))
    plan_doc = json.loads(Path(res.files["plan"]).read_text())
    cores: dict[str, tuple] = {i["llm"]: (i["node"], tuple(i["gpus"]))
                               for i in plan_doc["placement"]["instances"]}
    for m, inst in as_run.llms.items():
        assert inst.share == 1.0 and inst.memory == res.allocation[m]["share"]
        together = [o for o in cores if cores[o] == cores[m]]
        assert (inst.mesh is None) == (len(together) == 1), (m, together)
    assert "predicted as the servers run on the CPU" in text


def test_loop_profiles_here_fits_like_profile_fit_and_resumes(
        tmp_path: Path, fake_engine: tuple[str, ...]) -> None:
    """Without curves the loop measures its model at every TP degree of the plan (share 1)
    with the profiler backend, fits the curves exactly as ``scepsy profile fit`` does, plans
    with them, and a rerun with the same out reuses the store without starting an engine."""
    prof = _fake_profiler()
    opts = _options(tmp_path, fake_engine, curves=None, profile_backend="loop-fake",
                    rate=5.0, requests=10)
    res = api.bench_loop(opts)
    assert res.clean, res.error
    folder = tmp_path / "loop" / "profile"
    store, curves = folder / "store.jsonl", folder / "curves.json"
    assert sorted(set(prof.opened)) == [(1, 1.0), (2, 1.0)]
    assert {tp for tp, _ in prof.measured} == {1, 2}
    records = read_store(store).records
    assert len(records) == len(prof.measured)
    assert {r.model for r in records} == {"llama-3-8b"} and {r.scale for r in records} == {0.0625}
    assert max(r.batch for r in records) <= opts.max_num_seqs
    assert max(r.tokens for r in records) <= opts.max_model_len
    # at most PROFILE_POINTS_PER_TP per TP degree, at least the 5 a curve is fitted from
    for tp in (1, 2):
        assert sum(1 for r in records if r.tp == tp) <= bl.PROFILE_POINTS_PER_TP
        for phase in ("prefill", "decode"):
            n = sum(1 for r in records if (r.tp, r.phase) == (tp, phase))
            assert n >= 5, (tp, phase, n)
    doc = json.loads(Path(res.files["results"]).read_text())
    assert doc["curves"] == res.curves.to_dict()  # type: ignore[union-attr]
    assert doc["curves"]["path"] == str(curves) and doc["curves"]["measured_here"] is True
    assert doc["curves"]["device"] == "cpu" and doc["curves"]["device_detail"] == "Fake CPU 9000"
    assert doc["curves"]["host_cpu"] == bl.host_cpu()
    assert doc["curves"]["points"] == doc["curves"]["measured"] == len(records)
    assert doc["timings"]["profile_s"] > 0
    assert set(doc["curves"]["sweeps"].values()) <= {"done", "budget"}
    assert "measured here on cpu (Fake CPU 9000)" in "\n".join(bl.report_lines(res))
    # the same bytes as `scepsy profile fit --measurements STORE`
    with redirect_stdout(StringIO()):
        assert main(["profile", "fit", "--measurements", str(store), "--out",
                     str(tmp_path / "fit.json"), "--quiet"]) == 0
    assert (tmp_path / "fit.json").read_bytes() == curves.read_bytes()
    fitted = load_curves(curves)
    assert fitted.covers("llama-3-8b:x0.0625", "cpu", 1)
    assert fitted.covers("llama-3-8b:x0.0625", "cpu", 2)
    # a rerun with the same out: nothing measured again, no session started
    again = _fake_profiler()
    with api.using_catalog(opts.catalog) as cat:
        used = bl.profile_here(opts, bl.loop_models(load_specs(opts.workflow), cat), folder,
                               cat)
    assert again.opened == [] and again.measured == []
    assert used.measured == 0 and used.points == len(records)
    assert set(used.sweeps.values()) == {"reused"}
    assert (tmp_path / "fit.json").read_bytes() == curves.read_bytes()


def test_profile_stage_without_an_engine_names_the_option(tmp_path: Path) -> None:
    prof = _fake_profiler(down="no vLLM here")
    opts = _options(tmp_path, None, curves=None, profile_backend="loop-fake")
    with pytest.raises(InputError, match=r"no vLLM here.*--curves FILE") as err:
        api.bench_loop(opts)
    assert err.value.field == "engine_python" and prof.opened == []


def test_a_bad_cluster_file_is_named_before_any_profiling(tmp_path: Path) -> None:
    prof = _fake_profiler()
    bad = tmp_path / "cluster.yaml"
    bad.write_text("name: x\nracks: [{name: r, nodes: [{name: h, gpu: nope, gpus: 2}]}]\n")
    opts = _options(tmp_path, None, curves=None, profile_backend="loop-fake", cluster=str(bad))
    with pytest.raises(InputError, match="nope"):
        api.bench_loop(opts)
    assert prof.opened == [] and not (tmp_path / "loop" / "profile").exists()


def test_profile_stage_refuses_a_tp_it_cannot_measure(tmp_path: Path) -> None:
    _fake_profiler(unsupported_tps={2: "TP 2 needs 2 cores"})
    opts = _options(tmp_path, None, curves=None, profile_backend="loop-fake")
    with pytest.raises(InputError, match="TP 2 needs 2 cores") as err:
        api.bench_loop(opts)
    assert err.value.field == "tps"
    doc = json.loads((tmp_path / "loop" / "results.json").read_text())
    assert doc["servers"] == 0 and doc["curves"] is None and doc["clean"] is False


def test_profile_stage_budget_too_small_says_how_to_continue(tmp_path: Path) -> None:
    """A budget that leaves a curve with fewer points than a fit needs is an error that names
    the budget; a rerun with the same out and a larger budget continues the store."""
    prof = _fake_profiler(sleep_s=0.5)  # about 5 points in 3 s, where a fit needs 10
    opts = _options(tmp_path, None, curves=None, profile_backend="loop-fake",
                    profile_budget_s=3.0, tps=(1,))
    folder = tmp_path / "profile"
    with api.using_catalog(opts.catalog) as cat:
        models = bl.loop_models(load_specs(opts.workflow), cat)
        with pytest.raises(InputError, match="rerun with the same --out") as err:
            bl.profile_here(opts, models, folder, cat)
        assert err.value.field == "profile_budget_s"
        first = len(prof.measured)
        assert 1 <= first < 10
        more = _fake_profiler()
        used = bl.profile_here(replace(opts, profile_budget_s=60.0), models, folder, cat)
    assert used.points == first + len(more.measured) and used.measured == len(more.measured)
    assert not {(tp, p) for tp, p in more.measured} & {(tp, p) for tp, p in prof.measured}


def test_profile_budget_leaves_out_the_engine_start(tmp_path: Path) -> None:
    """The budget is measuring time: an engine that takes longer to start than the whole
    budget still gets its points measured (before, the start ate the budget: 0 points), and a
    budget too small for a fit says how long the start took and which flag raises it."""
    prof = _fake_profiler(sleep_s=0.3, start_s=2.5)
    opts = _options(tmp_path, None, curves=None, profile_backend="loop-fake",
                    profile_budget_s=2.0, tps=(1,))
    lines: list[str] = []
    with api.using_catalog(opts.catalog) as cat:
        models = bl.loop_models(load_specs(opts.workflow), cat)
        with pytest.raises(InputError) as err:
            bl.profile_here(opts, models, tmp_path / "profile", cat, lines.append)
    assert prof.measured, "the engine's start counted against the budget"
    msg = str(err.value)
    assert err.value.field == "profile_budget_s"
    assert "raise --profile-budget (now 2 s of measuring)" in msg
    assert "engine started in 2 s" in msg or "engine started in 3 s" in msg
    assert f"tp1: {len(prof.measured)} point(s) in" in msg
    assert any("after an engine start of" in ln for ln in lines)
    # with room, the same slow start ends in curves, the start reported apart
    _fake_profiler(start_s=2.5)
    with api.using_catalog(opts.catalog) as cat:
        used = bl.profile_here(replace(opts, profile_budget_s=60.0), models,
                               tmp_path / "profile", cat)
    assert used.engine_start_s["llama-3-8b:x0.0625 tp1"] >= 2.5
    assert used.warnings == ()


def test_a_noisy_profile_is_warned_about(tmp_path: Path) -> None:
    """Timed runs that disagree as on a busy machine: one warning line per sweep naming the
    model, the TP degree, the spread and the threshold, with what to do; in results too."""
    _fake_profiler(noisy=True)
    opts = _options(tmp_path, None, curves=None, profile_backend="loop-fake", tps=(1, 2))
    lines: list[str] = []
    with api.using_catalog(opts.catalog) as cat:
        models = bl.loop_models(load_specs(opts.workflow), cat)
        used = bl.profile_here(opts, models, tmp_path / "profile", cat, lines.append)
    assert len(used.warnings) == 2
    for tp, w in zip((1, 2), used.warnings, strict=True):
        assert w.startswith("warning: the profile of llama-3-8b:x0.0625 at TP "
                            f"{tp} is noisy")
        assert "spread 310% of their median" in w and "over the 100%" in w
        assert "quieter machine" in w
        assert w in lines
    assert used.spread_pct["llama-3-8b:x0.0625 tp1"] == pytest.approx(310.0)
    assert used.to_dict()["warnings"] == list(used.warnings)


def test_profile_spread_of_the_bundled_store_is_quiet() -> None:
    """The bundled store, measured on a machine to itself, stays under the threshold."""
    records = [r for r in read_store(REPO / "datasets/profiles/"
                                     "vllm-cpu-llama-3-8b-x0.0625.jsonl").records
               if r.status == "ok"]
    p90, top = bl.profile_spread(records)
    assert 0 < p90 <= top < bl.PROFILE_SPREAD_LIMIT


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-4, 1e3), st.floats(1.0, 1e4), st.none() | st.integers(1, 10_000))
def test_drive_requests_bound_the_default_drive(rate: float, limit: float,
                                                given_n: int | None) -> None:
    """The default drive sends at most DEFAULT_REQUESTS, at least MIN_REQUESTS, and arrives
    within max_drive_s whenever MIN_REQUESTS can; a given number is kept."""
    opts = bl.LoopOptions(requests=given_n, max_drive_s=limit)
    n = bl.drive_requests(opts, rate)
    if given_n is not None:
        assert n == given_n
        return
    assert bl.MIN_REQUESTS <= n <= bl.DEFAULT_REQUESTS
    if rate * limit >= bl.MIN_REQUESTS:
        assert n / rate <= limit * (1 + 1e-9)
    if rate * limit >= bl.DEFAULT_REQUESTS:
        assert n == bl.DEFAULT_REQUESTS


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
def test_default_drive_fits_its_limit_and_every_stage_says_so(
        tmp_path: Path, fake_engine: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --requests the drive is cut to what arrives within --max-drive-s; stderr gets a
    line at each stage's start and end with the time, and progress lines while it drives."""
    monkeypatch.setattr(bl, "PROGRESS_EVERY_S", 1.0)
    lines: list[str] = []
    res = api.bench_loop(_options(tmp_path, fake_engine, requests=None, rate=5.0,
                                  max_drive_s=8.0), say=lines.append)
    assert res.clean, res.error
    assert res.requests == 40 and res.drive is not None and res.drive["sent"] == 40
    doc = json.loads(Path(res.files["results"]).read_text())
    assert doc["requests"] == 40 and doc["predicted_drive_s"] == pytest.approx(8.0)
    assert doc["options"]["requests"] is None
    text = "\n".join(lines)
    for stage in ("launch", "drive"):
        assert f"] {stage}: started" in text and f"] {stage}: done after" in text
    assert "] the drive: 40 requests at 5 req/s, arriving over about 8 s" in text
    assert any("]   drive: sent " in ln and "completed" in ln for ln in lines), text
    assert all(ln.startswith("[") and " s] " in ln for ln in lines)


def test_loop_stops_servers_when_the_drive_raises(tmp_path: Path, fake_engine: tuple[str, ...],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def broken(*a: object, **k: object) -> None:
        seen["alive"] = [p for p in bl.marked_processes(seen_run()) if p]
        raise RuntimeError("drive broke")

    def seen_run() -> str:
        doc = json.loads((tmp_path / "loop" / "run" / "plan.json").read_text())
        return doc["launch"]["env"][bl.MARKER]

    monkeypatch.setattr(bl, "drive", broken)
    with pytest.raises(RuntimeError, match="drive broke"):
        api.bench_loop(_options(tmp_path, fake_engine))
    assert seen["alive"], "the servers ran while the drive was called"
    doc = json.loads((tmp_path / "loop" / "results.json").read_text())
    assert doc["error"] == "RuntimeError: drive broke" and doc["clean"] is False
    _assert_nothing_left(doc)
    assert all(bl.port_free(p) for p in _ports(tmp_path / "loop" / "run" / "plan.json"))


def test_loop_stops_servers_on_keyboard_interrupt(tmp_path: Path, fake_engine: tuple[str, ...],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    real = bl.drive

    def interrupted(*a: object, **k: object) -> object:
        k["deadline_s"] = 0.5  # part of the requests, then Ctrl-C
        real(*a, **k)  # type: ignore[arg-type]
        raise KeyboardInterrupt

    monkeypatch.setattr(bl, "drive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        api.bench_loop(_options(tmp_path, fake_engine))
    doc = json.loads((tmp_path / "loop" / "results.json").read_text())
    assert doc["interrupted"] is True and doc["clean"] is False
    _assert_nothing_left(doc)
    assert all(bl.port_free(p) for p in _ports(tmp_path / "loop" / "run" / "plan.json"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_a_running_loop_leaves_nothing(tmp_path: Path, fake_engine: tuple[str, ...],
                                                 signum: int) -> None:
    """A real Ctrl-C (SIGINT), or a SIGTERM, to a loop in its own process while it drives."""
    opts = _options(tmp_path, fake_engine, requests=2000, rate=5.0)
    script = tmp_path / "run_loop.py"
    script.write_text(textwrap.dedent(f"""\
        import signal
        import sys
        # a shell's background job starts with SIGINT ignored; a user's Ctrl-C is what is tested
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from scepsy import api
        from scepsy_serve.loop.bench_loop import LoopOptions
        opts = LoopOptions(**{{**{_jsonable(opts)!r}, "engine_command": tuple({list(fake_engine)!r}),
                              "engine_args": ()}})
        try:
            api.bench_loop(opts, say=lambda s: print(s, flush=True))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
        """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO)
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if "] driving" in line:
            break
        assert time.monotonic() < deadline, lines
    time.sleep(1.0)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines) + out
    doc = json.loads((tmp_path / "loop" / "results.json").read_text())
    assert doc["interrupted"] is True
    # what the drive measured until the signal is kept, marked interrupted
    drive = doc["drive"]
    assert drive is not None and drive["interrupted"] is True
    assert drive["sent"] > 0 and drive["not_sent"] > 0
    assert drive["completed"] + drive["failed"] == drive["sent"]
    assert set(drive["failures"]) <= {"interrupted"}
    assert "drive: stopped after" in out
    _assert_nothing_left(doc)
    assert all(bl.port_free(p) for p in _ports(tmp_path / "loop" / "run" / "plan.json"))


def test_default_files_are_found_from_another_directory(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    opts = bl.with_default_files(bl.LoopOptions())
    for name in ("workflow", "cluster", "catalog"):
        assert Path(getattr(opts, name)) == REPO / getattr(bl.LoopOptions, name)
        assert Path(getattr(opts, name)).is_file()
    assert opts.curves is None  # the default: profile here
    bundled = bl.with_default_files(bl.LoopOptions(curves=bl.BUNDLED_CURVES)).curves
    assert bundled is not None and Path(bundled) == REPO / bl.BUNDLED_CURVES
    assert bl.with_default_files(bl.LoopOptions(workflow="mine.yaml")).workflow == "mine.yaml"


def test_loop_refuses_an_out_that_is_a_file(tmp_path: Path) -> None:
    out = tmp_path / "file"
    out.write_text("x")
    with pytest.raises(InputError, match="out"):
        api.bench_loop(_options(tmp_path, None, out=str(out)))


def _jsonable(opts: bl.LoopOptions) -> dict[str, object]:
    d = {k: getattr(opts, k) for k in opts.__dataclass_fields__}
    d.pop("engine_command")
    d.pop("engine_args")
    return d


# -------------------------------------------------------------------------- the real loop


def _vllm() -> str:
    try:
        return str(vllm_python().path)
    except BackendUnavailable as exc:
        pytest.skip(f"no vLLM environment: {exc}")


@pytest.mark.vllm
@pytest.mark.slow
def test_profile_stage_measures_this_machine_with_vllm(tmp_path: Path) -> None:
    """The profiling stage with the vllm backend at TP 1 (a small budget): records of device
    ``cpu`` naming this machine's CPU, curves covering TP 1; a rerun starts no engine."""
    python = _vllm()
    opts = _options(tmp_path, None, curves=None, engine_python=python, tps=(1,),
                    profile_budget_s=150.0)
    folder = tmp_path / "profile"
    with api.using_catalog(opts.catalog) as cat:
        models = bl.loop_models(load_specs(opts.workflow), cat)
        t0 = time.monotonic()
        used = bl.profile_here(opts, models, folder, cat)
        first = time.monotonic() - t0
        assert used.measured_here and used.device == "cpu" and used.backend == "vllm"
        assert used.device_detail == bl.host_cpu() and used.points >= 10
        assert load_curves(used.path).covers("llama-3-8b:x0.0625", "cpu", 1)
        # the budget bounds the measuring (engine start-ups come on top): each sweep ended by
        # finishing or by the budget, never past it by a point it should not have started
        assert set(used.sweeps.values()) <= {"done", "budget"}, used.sweeps
        assert first > 0
        t0 = time.monotonic()
        again = bl.profile_here(opts, models, folder, cat)
        assert time.monotonic() - t0 < 30  # no engine started
    assert again.sweeps == {"llama-3-8b:x0.0625 tp1": "reused"} and again.measured == 0


@pytest.mark.vllm
@pytest.mark.slow
def test_real_loop_on_cpu(tmp_path: Path) -> None:
    """vLLM's CPU servers for the plan's replicas, 30 requests, everything stopped (with the
    bundled curves: the profiling stage has its own test above)."""
    python = _vllm()
    t0 = time.monotonic()
    res = api.bench_loop(_options(tmp_path, None, engine_python=python, rate=None,
                                  call_timeout_s=120.0, health_timeout_s=600.0))
    wall = time.monotonic() - t0
    drive = res.drive
    assert drive is not None
    assert drive["completed"] + drive["failed"] == drive["sent"] == 30
    assert drive["completed"] > 0
    _assert_nothing_left(res)
    assert res.leftovers.clean
    doc = json.loads(Path(res.files["results"]).read_text())
    for w in doc["comparison"]["workflows"].values():
        assert w["latency_predicted_s"] > 0 and w["latency_measured_s"] > 0
        assert w["throughput_predicted"] > 0 and w["throughput_measured"] > 0
    assert wall < 600, wall
    assert os.path.isfile(res.files["trace"])
