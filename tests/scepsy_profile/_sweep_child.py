"""A fake profiler backend and planner for the sweep runner's tests, and a script that runs one
sweep with them (the kill tests start it as a child process and SIGKILL it).

The fake is a control-flow double only (never registered as a backend): a deterministic latency
per point, an optional sleep per point, points that fail, instances it does not support, and a
clock it advances by each point's cost, so that budget tests need no real time.

    python tests/scepsy_profile/_sweep_child.py STORE SLEEP_S
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from scepsy_profile.profiling.backend import (
    BackendOptions,
    BackendUnavailable,
    DeviceInfo,
    StepPoint,
    Timing,
)
from scepsy_profile.profiling.models import EngineModel, engine_model
from scepsy_profile.profiling.planner import SweepPoint
from scepsy_profile.profiling.records import ProfileRecord
from scepsy_profile.profiling.sweep import SweepResult, run_sweep

MODEL = engine_model("llama-2-7b", 0.05)


@dataclass(frozen=True, slots=True)
class FakeSpec:
    """What the runner needs of a sweep spec (``tps``, ``shares``), and the fake's lattice."""

    tps: tuple[int, ...] = (1, 2)
    shares: tuple[float, ...] = (0.5, 1.0)
    batches: tuple[int, ...] = (1, 4, 16)
    tokens: tuple[int, ...] = (32, 128)


def lattice(spec: FakeSpec) -> list[SweepPoint]:
    return [SweepPoint(tp, share, StepPoint(phase, b, t)) for tp in spec.tps
            for share in spec.shares for phase in ("prefill", "decode")
            for b in spec.batches for t in spec.tokens]


def fake_next_points(spec: FakeSpec, done: Sequence[ProfileRecord], *,
                     budget_points: int) -> list[SweepPoint]:
    """The lattice in order, less the points in ``done``, at most ``budget_points``."""
    seen = {(r.tp, r.share, r.phase, r.batch, r.tokens) for r in done}
    todo = [p for p in lattice(spec)
            if (p.tp, p.share, p.step.phase, p.step.batch, p.step.tokens) not in seen]
    return todo[:budget_points]


def latency_ms(tp: int, share: float, step: StepPoint) -> float:
    work = step.batch * (step.tokens if step.phase == "prefill" else 1)
    return 1.0 + 0.01 * work / (tp * share) + 0.001 * step.tokens


class FakeClock:
    """A clock that the fake backend advances by each point's cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeBackend:
    """See the module docstring; counters say what the runner did with it."""

    sleep_s: float = 0.0
    fail: dict[tuple[int, int], BaseException] = field(default_factory=dict)
    """(batch, tokens) -> what measuring such a point raises."""
    unsupported_instances: dict[tuple[int, float], str] = field(default_factory=dict)
    broken_instances: dict[tuple[int, float], BaseException] = field(default_factory=dict)
    """(tp, share) -> what starting its session raises."""
    clock: FakeClock | None = None
    point_cost_s: float = 1.0
    device: str = "cpu"
    name: str = "fake"
    measured: list[tuple[int, float, StepPoint]] = field(default_factory=list)
    opened: list[tuple[int, float]] = field(default_factory=list)
    open_now: int = 0
    max_open: int = 0

    def unavailable(self, options: BackendOptions | None = None) -> str | None:
        return None

    def version(self, options: BackendOptions | None = None) -> str:
        return "0.0-test"

    def unsupported(self, model: EngineModel, tp: int, share: float,
                    options: BackendOptions | None = None) -> str | None:
        return self.unsupported_instances.get((tp, share))

    @contextmanager
    def session(self, model: EngineModel, tp: int, share: float,
                options: BackendOptions) -> Iterator[FakeSession]:
        if (tp, share) in self.broken_instances:
            raise self.broken_instances[(tp, share)]
        if (tp, share) in self.unsupported_instances:
            raise BackendUnavailable(self.unsupported_instances[(tp, share)])
        self.opened.append((tp, share))
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        try:
            yield FakeSession(self, tp, share)
        finally:
            self.open_now -= 1


@dataclass
class FakeSession:
    backend: FakeBackend
    tp: int
    share: float

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo(self.backend.device, "cpu", memory_gib=3.5, count=2,
                          detail={"cores": 2, "model": "fake cpu"})

    def measure(self, point: StepPoint) -> Timing:
        b = self.backend
        b.measured.append((self.tp, self.share, point))
        if b.sleep_s:
            time.sleep(b.sleep_s)
        if b.clock is not None:
            b.clock.now += b.point_cost_s
        exc = b.fail.get((point.batch, point.tokens))
        if exc is not None:
            raise exc
        ms = latency_ms(self.tp, self.share, point)
        return Timing.of([ms * 0.99, ms, ms * 1.02], method="fake")


def sweep(store: str, backend: FakeBackend, spec: FakeSpec | None = None,
          **kw: object) -> SweepResult:
    """One sweep of :data:`MODEL` with the fake planner."""
    kw.setdefault("round_points", 5)
    return run_sweep(backend, MODEL, spec or FakeSpec(), store, BackendOptions(),
                     next_points=fake_next_points, **kw)  # type: ignore[arg-type]


if __name__ == "__main__":
    result = sweep(sys.argv[1], FakeBackend(sleep_s=float(sys.argv[2])))
    print(json.dumps({"stopped": result.stopped, "written": len(result.records)}))
