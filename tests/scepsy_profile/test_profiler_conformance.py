"""One suite every registered profiler backend passes (python-mip's rule: one protocol, one suite).

Each backend is a module-scoped parameter: one engine session of a tiny shrunk model serves every
check of that backend (an engine may take tens of seconds to start). A backend that cannot run
here is skipped with its own reason; a backend named like a registered pytest marker (``torch``,
``vllm``) carries that marker, so ``-m "not vllm"`` leaves the slow engines out. The checks never
name a backend, and timing checks compare points whose work differs by orders of magnitude, so
that a noisy shared machine cannot flip them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scepsy_profile.profiling.backend import (
    BackendOptions,
    BackendUnavailable,
    DeviceInfo,
    MeasurementError,
    ProfilerBackend,
    ProfilerSession,
    StepPoint,
    Timing,
)
from scepsy_profile.profiling.models import EngineModel, engine_model
from scepsy_profile.profiling.registry import backend_names, get_backend

MODEL = engine_model("llama-3-8b", 1 / 16)  # 2 layers, hidden 256
OPTIONS = BackendOptions(repeats=5, warmup=1, threads=1, seed=0)
IMPOSSIBLE_TP = 64

SMALL_PREFILL = StepPoint("prefill", batch=1, tokens=16)
BIG_PREFILL = StepPoint("prefill", batch=8, tokens=256)     # 128x the tokens
SMALL_DECODE = StepPoint("decode", batch=1, tokens=16)
BIG_DECODE = StepPoint("decode", batch=64, tokens=512)      # 64x the sequences, 32x the context

BIG_PREFILL_FACTOR = 3.0
"""The big prefill must take at least this many times the small one (its work is 128x)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_name" not in metafunc.fixturenames:
        return
    markers = {line.split(":", 1)[0].strip() for line in metafunc.config.getini("markers")}
    params = [pytest.param(name, id=name,
                           marks=[getattr(pytest.mark, name)] if name in markers else [])
              for name in backend_names()]
    metafunc.parametrize("backend_name", params, indirect=True, scope="module")


@pytest.fixture(scope="module")
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def backend(backend_name: str) -> ProfilerBackend:
    """The backend, skipped (with its own reason) where it cannot run."""
    b = get_backend(backend_name)
    reason = b.unavailable(OPTIONS)
    if reason is not None:
        pytest.skip(f"{backend_name}: {reason}")
    return b


@pytest.fixture(scope="module")
def session(backend: ProfilerBackend) -> Iterator[ProfilerSession]:
    """One session of the tiny model for all the checks of one backend."""
    reason = backend.unsupported(MODEL, 1, 1.0, OPTIONS)
    assert reason is None, reason
    with backend.session(MODEL, 1, 1.0, OPTIONS) as s:
        yield s


@pytest.fixture(scope="module")
def timings(session: ProfilerSession) -> dict[StepPoint, Timing]:
    return {p: session.measure(p) for p in (SMALL_PREFILL, BIG_PREFILL, SMALL_DECODE,
                                           BIG_DECODE)}


def test_follows_the_protocol_and_registers_under_its_name(backend_name: str) -> None:
    b = get_backend(backend_name)  # even where it cannot run
    assert isinstance(b, ProfilerBackend)
    assert b.name == backend_name
    reason = b.unavailable()
    assert reason is None or (isinstance(reason, str) and reason.strip())


def test_version_is_named(backend: ProfilerBackend) -> None:
    version = backend.version(OPTIONS)
    assert isinstance(version, str) and version.strip()


def test_an_impossible_instance_is_unsupported_and_a_plain_one_is_not(
        backend: ProfilerBackend) -> None:
    reason = backend.unsupported(MODEL, IMPOSSIBLE_TP, 1.0, OPTIONS)
    assert isinstance(reason, str) and reason.strip()
    assert backend.unsupported(MODEL, 1, 1.0, OPTIONS) is None


def test_an_unsupported_session_is_refused(backend: ProfilerBackend) -> None:
    with pytest.raises(BackendUnavailable), backend.session(MODEL, IMPOSSIBLE_TP, 1.0, OPTIONS):
        pass


def test_session_reports_its_device(session: ProfilerSession) -> None:
    assert isinstance(session, ProfilerSession)
    device = session.device
    assert isinstance(device, DeviceInfo)
    assert device.kind in ("cpu", "cuda") and device.name.strip()
    assert device.memory_gib > 0 and device.count >= 1
    assert isinstance(device.detail, dict)


@pytest.mark.parametrize("point", [SMALL_PREFILL, BIG_PREFILL, SMALL_DECODE, BIG_DECODE],
                         ids=lambda p: f"{p.phase}-{p.batch}x{p.tokens}")
def test_a_point_is_timed_with_its_spread(timings: dict[StepPoint, Timing],
                                          point: StepPoint) -> None:
    t = timings[point]
    assert isinstance(t, Timing)
    assert t.median_ms > 0 and t.iqr_ms >= 0
    assert len(t.samples_ms) == OPTIONS.repeats
    assert min(t.samples_ms) <= t.median_ms <= max(t.samples_ms)
    assert t.iqr_ms <= max(t.samples_ms) - min(t.samples_ms)


def test_much_more_prefill_work_takes_longer(timings: dict[StepPoint, Timing]) -> None:
    small, big = timings[SMALL_PREFILL], timings[BIG_PREFILL]
    assert big.median_ms > BIG_PREFILL_FACTOR * small.median_ms, (small, big)


def test_a_big_decode_step_is_not_faster_than_a_small_one(
        timings: dict[StepPoint, Timing]) -> None:
    small, big = timings[SMALL_DECODE], timings[BIG_DECODE]
    assert big.median_ms > small.median_ms, (small, big)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_point_beyond_the_context_fails_and_the_session_goes_on(
        session: ProfilerSession, phase: str) -> None:
    beyond = StepPoint(phase, batch=1, tokens=MODEL.max_context + 1)  # type: ignore[arg-type]
    with pytest.raises(MeasurementError):
        session.measure(beyond)
    assert session.measure(SMALL_DECODE).median_ms > 0


def test_the_model_is_small_enough_for_the_suite() -> None:
    # The suite's points must fit the model: a guard against a catalog change making them
    # exceed the context (they would then test nothing).
    assert isinstance(MODEL, EngineModel)
    assert max(p.tokens for p in (BIG_PREFILL, BIG_DECODE)) < MODEL.max_context
    assert (MODEL.layers, MODEL.hidden) == (2, 256)
