"""The torch backend's own behaviour: the KV cache reset inside the timed statement, threads
honoured, shares as threads, the dtype chosen and recorded, failures as MeasurementError.

Timings are never compared with numbers here (the machine is shared); the checks are on what the
backend did. One small model session is shared by the module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scepsy_common.errors import InputError  # noqa: E402
from scepsy_profile.profiling import devices  # noqa: E402
from scepsy_profile.profiling import torch_backend as tb  # noqa: E402
from scepsy_profile.profiling.backend import (  # noqa: E402
    BackendOptions,
    BackendUnavailable,
    MeasurementError,
    StepPoint,
)
from scepsy_profile.profiling.models import EngineModel, engine_model  # noqa: E402
from scepsy_profile.profiling.registry import get_backend  # noqa: E402

pytestmark = pytest.mark.torch

MODEL = engine_model("llama-3-8b", 1 / 32)
OPTIONS = BackendOptions(repeats=3, warmup=1, threads=1)
OPTS_CUDA = BackendOptions(extra=(("device", "cuda"),))


@pytest.fixture(scope="module")
def session() -> Iterator[tb.TorchSession]:
    # dtype=auto probes how fast this CPU runs half precision: on a loaded machine the probe
    # can time bfloat16 as slow and pick float32, so the shared session sees a fast CPU
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tb, "_half_slowdown", lambda dtype, threads: 1.0)
        with tb.TorchBackend().session(MODEL, 1, 1.0, OPTIONS) as s:
            yield s


def test_registered_under_its_name() -> None:
    backend = get_backend("torch")
    assert isinstance(backend, tb.TorchBackend) and backend.name == "torch"
    assert backend.unavailable() is None
    assert backend.version().startswith(f"torch {torch.__version__}")


def test_decode_cache_is_cropped_back_inside_the_timed_statement(
        session: tb.TorchSession) -> None:
    with torch.inference_mode():
        step = session.prepare(StepPoint("decode", batch=3, tokens=40))
        assert step.context == 39 and step.cache.get_seq_length() == 39
        first = step.run()
        for _ in range(25):
            last = step.run()
        assert step.cache.get_seq_length() == 39
        # Same context at every run: the same logits, bit for bit.
        assert torch.equal(first, last)
        step.check()
        # Without the crop the cache grows and the next step sees another context.
        session.forward(step.ids, step.cache)
        assert step.cache.get_seq_length() == 40
        with pytest.raises(MeasurementError, match="grew to 40"):
            step.check()
        assert not torch.equal(step.run(), first)


def test_a_random_decode_cache_has_the_shapes_a_prefill_leaves(
        session: tb.TorchSession, monkeypatch: pytest.MonkeyPatch) -> None:
    assert session.decode_cache == "random" == session.device.detail["decode_cache"]
    point = StepPoint("decode", batch=3, tokens=21)
    # the same dtype as the shared session: ``auto`` probes this CPU's matmul speeds, and two
    # probes near the threshold may choose differently on a busy machine
    opts = BackendOptions(repeats=1, warmup=0, threads=1,
                          extra=(("decode_cache", "prefill"), ("dtype", session.dtype)))
    with tb.TorchBackend().session(MODEL, 1, 1.0, opts) as real, torch.inference_mode():
        assert "decode cache prefill" in real.method()
        forwards: list[int] = []
        spy = real.forward
        monkeypatch.setattr(real, "forward", lambda ids, c: forwards.append(ids.shape[1])
                            or spy(ids, c))
        prefilled = real.prepare(point)
        assert forwards == [20]  # the context was computed, not made up
        made_up = session.prepare(point)
        assert len(made_up.cache.layers) == len(prefilled.cache.layers) == MODEL.layers
        for a, b in zip(made_up.cache.layers, prefilled.cache.layers, strict=True):
            for x, y in ((a.keys, b.keys), (a.values, b.values)):
                assert (x.shape, x.dtype, x.device) == (y.shape, y.dtype, y.device)
        assert made_up.run().shape == prefilled.run().shape
        assert made_up.cache.get_seq_length() == prefilled.cache.get_seq_length() == 20


def test_measure_leaves_the_decode_cache_where_it_found_it(
        session: tb.TorchSession, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared: list[tb.PreparedStep] = []
    real = session.prepare
    monkeypatch.setattr(session, "prepare", lambda p: prepared.append(real(p)) or prepared[-1])
    timing = session.measure(StepPoint("decode", batch=2, tokens=17))
    assert len(timing.samples_ms) == OPTIONS.repeats
    (step,) = prepared
    assert step.cache.get_seq_length() == 16


def test_prefill_makes_a_fresh_cache_in_every_run(session: tb.TorchSession,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    real = session.new_cache
    monkeypatch.setattr(session, "new_cache", lambda: made.append(real()) or made[-1])
    session.measure(StepPoint("prefill", batch=2, tokens=8))
    # warm-up + repeats timed runs at least (Timer.timeit(1) also runs it untimed before each)
    assert len(made) >= OPTIONS.warmup + OPTIONS.repeats
    assert {c.get_seq_length() for c in made} == {8}
    assert len({id(c) for c in made}) == len(made)


def test_threads_are_honoured_and_restored(session: tb.TorchSession,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = session.forward

    def spy(ids: Any, cache: Any) -> Any:
        seen.append(torch.get_num_threads())
        return real(ids, cache)

    monkeypatch.setattr(session, "forward", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        timing = session.measure(StepPoint("decode", batch=1, tokens=9))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}
    assert "1 threads" in timing.method
    assert session.device.count == 1 and session.device.detail["threads"] == 1


def _with_cores(monkeypatch: pytest.MonkeyPatch, cores: int) -> None:
    monkeypatch.setattr(devices, "usable_cores", lambda *a, **k: cores)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize(("cores", "share", "threads"), [(8, 0.25, 2), (8, 0.5, 4), (2, 1.0, 2),
                                                         (2, 0.5, 1), (16, 0.3, 5)])
def test_a_share_runs_as_that_many_threads(monkeypatch: pytest.MonkeyPatch, cores: int,
                                           share: float, threads: int) -> None:
    _with_cores(monkeypatch, cores)
    opts = BackendOptions(repeats=1, warmup=0)
    backend = tb.TorchBackend()
    assert backend.unsupported(MODEL, 1, share, opts) is None
    with backend.session(MODEL, 1, share, opts) as s:
        assert s.device.count == threads and s.device.detail["threads"] == threads
        assert s.device.detail["share"] == share
        assert f"{threads} threads" in s.method()


def test_explicit_threads_win_over_the_share(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_cores(monkeypatch, 8)
    with tb.TorchBackend().session(MODEL, 1, 0.25, BackendOptions(threads=1)) as s:
        assert s.device.count == 1


def test_a_share_below_one_thread_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_cores(monkeypatch, 2)
    backend = tb.TorchBackend()
    reason = backend.unsupported(MODEL, 1, 0.2)
    assert reason is not None and "thread" in reason and "0.2" in reason
    with pytest.raises(BackendUnavailable, match="thread"), \
            backend.session(MODEL, 1, 0.2, BackendOptions()):
        pass


def test_tensor_parallelism_is_unsupported() -> None:
    backend = tb.TorchBackend()
    reason = backend.unsupported(MODEL, 2, 1.0)
    assert reason is not None and "tp" in reason
    with pytest.raises(BackendUnavailable, match="tp must be 1"), \
            backend.session(MODEL, 2, 1.0, OPTIONS):
        pass


@pytest.mark.parametrize(("tp", "share"), [(0, 1.0), (1, 0.0), (1, 1.5), (1, float("nan")),
                                           (True, 1.0)])
def test_bad_instances_are_input_errors(tp: Any, share: Any) -> None:
    with pytest.raises(InputError):
        tb.TorchBackend().unsupported(MODEL, tp, share)


def test_a_gpu_share_needs_an_mps_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices, "mps_status",
                        lambda *a, **k: devices.MpsStatus(False, "/tmp/x", "no control pipe"))
    backend = tb.TorchBackend()
    reason = backend.unsupported(MODEL, 1, 0.5)
    assert reason is not None and "MPS" in reason
    assert backend.unsupported(MODEL, 1, 1.0) is None


def test_dtype_is_the_models_when_the_cpu_runs_it_fast(session: tb.TorchSession) -> None:
    assert session.dtype == MODEL.dtype == session.device.detail["dtype"]
    assert next(session._net.parameters()).dtype == torch.bfloat16
    assert "model's dtype" in session.device.detail["dtype_reason"]
    assert "bfloat16" in session.method()


def test_slow_half_precision_falls_back_to_float32_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tb, "_half_slowdown", lambda dtype, threads: 10.0)
    with tb.TorchBackend().session(MODEL, 1, 1.0, OPTIONS) as s:
        assert s.dtype == "float32" and s.device.detail["dtype"] == "float32"
        assert "10.0x slower" in s.device.detail["dtype_reason"]
        assert next(s._net.parameters()).dtype == torch.float32
        assert "float32" in s.measure(StepPoint("prefill", 1, 4)).method


def test_asked_dtype_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tb, "_half_slowdown", lambda dtype, threads: pytest.fail("probed"))
    opts = BackendOptions(repeats=1, warmup=0, threads=1, extra=(("dtype", "float32"),))
    with tb.TorchBackend().session(MODEL, 1, 1.0, opts) as s:
        assert s.device.detail == s.device.detail | {"dtype": "float32",
                                                     "dtype_reason": "asked for (extra dtype)"}


def test_the_cpu_clock_times_one_thread_and_says_so(session: tb.TorchSession,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert "wall clock" in session.method()
    backend = tb.TorchBackend()
    cpu_clock = (("clock", "cpu"),)
    reason = backend.unsupported(MODEL, 1, 1.0, BackendOptions(threads=2, extra=cpu_clock))
    assert reason is not None and "threads=1" in reason
    opts = BackendOptions(repeats=2, warmup=0, threads=1, extra=cpu_clock)
    ticks: list[float] = []
    real = tb.time.process_time
    monkeypatch.setattr(tb.time, "process_time", lambda: ticks.append(0) or real())
    with backend.session(MODEL, 1, 1.0, opts) as s:
        timing = s.measure(StepPoint("decode", 2, 8))
    assert "cpu clock" in timing.method and s.device.detail["clock"] == "cpu"
    assert len(ticks) >= 2 * opts.repeats  # the timer read the process clock
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = backend.unsupported(MODEL, 1, 1.0, BackendOptions(threads=1, extra=cpu_clock))
    assert gpu is not None and "clock=wall" in gpu


@pytest.mark.parametrize("extra", [(("clock", "tsc"),), (("dtype", "int8"),), (("colour", "red"),),
                                   (("device", "tpu"),)])
def test_bad_extra_options_are_input_errors(extra: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(InputError, match="extra"):
        tb.TorchBackend().unsupported(MODEL, 1, 1.0, BackendOptions(extra=extra))


def test_weight_bytes_match_the_built_model(session: tb.TorchSession) -> None:
    built = sum(p.numel() * p.element_size() for p in session._net.parameters())
    assert tb.weight_bytes(MODEL, "bfloat16") == built


def test_point_memory_estimate_covers_the_kv_cache(session: tb.TorchSession) -> None:
    point = StepPoint("decode", batch=2, tokens=33)
    with torch.inference_mode():
        step = session.prepare(point)
        layers = step.cache.layers
        held = sum(t.numel() * t.element_size() for lay in layers for t in (lay.keys, lay.values))
    assert held > 0 and tb.point_bytes(MODEL, point, "bfloat16") >= held


def test_a_point_too_big_for_memory_is_refused_before_it_runs(session: tb.TorchSession,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    monkeypatch.setattr(session, "prepare", lambda p: pytest.fail("ran"))
    with pytest.raises(MeasurementError, match="GiB"):
        session.measure(StepPoint("prefill", batch=65536, tokens=4096))


def test_engine_errors_become_measurement_errors(session: tb.TorchSession,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(ids: Any, cache: Any) -> Any:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore text")

    with monkeypatch.context() as m:
        m.setattr(session, "forward", boom)
        with pytest.raises(MeasurementError, match=r"out of memory\. Tried") as info:
            session.measure(StepPoint("prefill", 4, 16))
        assert "more text" not in str(info.value)
    assert session.measure(StepPoint("prefill", 4, 16)).median_ms > 0  # the session goes on


def test_a_point_over_its_time_limit_fails(monkeypatch: pytest.MonkeyPatch,
                                           session: tb.TorchSession) -> None:
    monkeypatch.setattr(session, "options", BackendOptions(repeats=3, point_timeout_s=1e-9))
    with pytest.raises(MeasurementError, match="time limit"):
        session.measure(StepPoint("prefill", 1, 8))


def test_points_beyond_the_context_fail_and_the_context_itself_runs() -> None:
    short = EngineModel(**{**_fields(MODEL), "max_context": 64})
    with tb.TorchBackend().session(short, 1, 1.0, OPTIONS) as s:
        for phase in ("prefill", "decode"):
            with pytest.raises(MeasurementError, match="context of 64"):
                s.measure(StepPoint(phase, 1, 65))
            assert s.measure(StepPoint(phase, 1, 64)).median_ms > 0


def test_a_qwen2_model_builds_and_runs() -> None:
    qwen = engine_model("qwen2.5-0.5b", 1 / 8)
    with tb.TorchBackend().session(qwen, 1, 1.0, OPTIONS) as s:
        assert type(s._net).__name__ == "Qwen2ForCausalLM"
        assert s._net.config.num_hidden_layers == qwen.layers
        assert s.measure(StepPoint("decode", 2, 16)).median_ms > 0


def test_a_model_that_cannot_be_built_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    def oom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", oom)
    with pytest.raises(BackendUnavailable, match=r"could not build.*allocate"), \
            tb.TorchBackend().session(MODEL, 1, 1.0, OPTIONS):
        pass


def test_a_closed_session_measures_nothing() -> None:
    with tb.TorchBackend().session(MODEL, 1, 1.0, OPTIONS) as s:
        pass
    with pytest.raises(MeasurementError, match="closed"):
        s.measure(StepPoint("prefill", 1, 4))


def _fields(model: EngineModel) -> dict[str, Any]:
    return {name: getattr(model, name) for name in model.__dataclass_fields__}


@pytest.fixture
def fresh_driver(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A process whose CUDA driver was never touched, on a fake GPU with an MPS daemon: what
    the driver sees in the environment when it is first initialised is recorded."""
    monkeypatch.setattr(tb, "_DRIVER_MPS_PERCENT", {})
    monkeypatch.delenv(tb._MPS_PERCENT_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    seen: dict[str, Any] = {"at_is_available": []}

    def is_available() -> bool:
        import os

        seen["at_is_available"].append(os.environ.get(tb._MPS_PERCENT_ENV))
        return True

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(devices, "mps_status",
                        lambda *a, **k: devices.MpsStatus(True, "/tmp/x", "control pipe"))
    return seen


@pytest.mark.parametrize("share", [0.05, 0.3, 0.5, 0.99])
def test_the_mps_percentage_is_set_before_the_driver_first_starts(
        fresh_driver: dict[str, Any], share: float) -> None:
    # the driver connects to MPS and takes the client's percentage when first initialised
    # (torch.cuda.is_available()); set afterwards, a share would silently be a whole GPU
    assert tb.TorchBackend().unsupported(MODEL, 1, share, OPTS_CUDA) is None
    assert fresh_driver["at_is_available"][0] == str(max(1, round(share * 100)))


def test_a_second_share_in_one_process_is_refused_after_the_driver_started(
        fresh_driver: dict[str, Any]) -> None:
    backend = tb.TorchBackend()
    assert backend.unsupported(MODEL, 1, 1.0, OPTS_CUDA) is None  # driver starts with no limit
    reason = backend.unsupported(MODEL, 1, 0.5, OPTS_CUDA)
    assert reason is not None and "its own process" in reason
    assert backend.unsupported(MODEL, 1, 1.0, OPTS_CUDA) is None


def test_a_user_set_percentage_is_kept_and_a_different_share_refused(
        fresh_driver: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tb._MPS_PERCENT_ENV, "30")
    backend = tb.TorchBackend()
    assert backend.unsupported(MODEL, 1, 0.3, OPTS_CUDA) is None
    assert fresh_driver["at_is_available"] == ["30"]
    assert "its own process" in (backend.unsupported(MODEL, 1, 0.5, OPTS_CUDA) or "")


def test_no_gpu_leaves_the_environment_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(tb, "_DRIVER_MPS_PERCENT", {})
    monkeypatch.delenv(tb._MPS_PERCENT_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    tb.TorchBackend().unsupported(MODEL, 1, 1.0)
    tb.TorchBackend().unsupported(MODEL, 1, 0.5)
    assert tb._MPS_PERCENT_ENV not in os.environ and tb._DRIVER_MPS_PERCENT == {}
