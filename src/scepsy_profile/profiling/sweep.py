"""The sweep runner: measure what the planner asks for, into a resumable store, within a budget.

::

    result = run_sweep(get_backend("torch"), engine_model("llama-2-7b", 0.05), spec,
                       "llama.profile.jsonl", BackendOptions(), budget_s=600)

:func:`run_sweep` locks the store (:class:`~scepsy_profile.profiling.store.ProfileStore`), asks
the planner (:func:`~scepsy_profile.profiling.planner.next_points`) for points round after round,
and times each one in a backend session of its instance (tp, share), appending one record per
point as soon as it is measured. Nothing finished is measured again: a sweep stopped at any
moment (budget, Ctrl-C, ``kill -9``) resumes where it stopped when run again on the same store.

* A point that cannot be measured (:class:`MeasurementError`, or any other error of the engine
  for that point) is recorded ``failed`` with its error, and the sweep goes on; a resumed sweep
  skips it unless ``retry_failed``.
* An instance the backend cannot run (:meth:`ProfilerBackend.unsupported`, or a session that does
  not start) is skipped with the reason, in :attr:`SweepResult.skipped`: no record is written.
* Ctrl-C (``KeyboardInterrupt``) closes the session and returns ``stopped="interrupted"``.

One session is open at a time (an engine holds its device's memory); it stays open from one
round to the next while the planner asks for points of its instance.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from scepsy_common.errors import InputError
from scepsy_profile.profiling import planner
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
from scepsy_profile.profiling.models import EngineModel
from scepsy_profile.profiling.planner import SweepPoint
from scepsy_profile.profiling.records import PointKey, ProfileRecord, point_key
from scepsy_profile.profiling.store import ProfileStore, finished

if TYPE_CHECKING:
    from scepsy_profile.profiling.planner import SweepSpec

SweepStop = Literal["done", "budget", "interrupted"]
Instance = tuple[int, float]
"""(tp, share), the share rounded like :func:`point_key` rounds it."""

DEFAULT_ROUND_POINTS = 16
"""Points asked of the planner per TP degree and round (refinement happens between rounds)."""


class NextPoints(Protocol):
    """The planner's interface (:func:`scepsy_profile.profiling.planner.next_points`)."""

    def __call__(self, spec: Any, done: Sequence[ProfileRecord], *,
                 budget_points: int) -> Sequence[SweepPoint]: ...


ProgressHook = Callable[[int, int, ProfileRecord], None]
"""``on_progress(done, total_estimate, record)`` after every record written: ``done`` points of
this sweep are in the store (failed included), ``total_estimate`` is ``done`` plus the points the
planner asked for and not yet measured (a lower bound that grows while it refines)."""


@dataclass(frozen=True, slots=True)
class SkippedInstance:
    """An instance the sweep did not measure, and why (not a failure: nothing is recorded)."""

    tp: int
    share: float
    reason: str


@dataclass(frozen=True, slots=True)
class SweepResult:
    """How a sweep run ended and what it wrote."""

    stopped: SweepStop
    """``done`` (the planner has nothing left), ``budget`` (the next point would overrun
    ``budget_s``) or ``interrupted`` (Ctrl-C)."""
    store: Path
    device: str | None
    """The device measured on (None when no session started)."""
    records: tuple[ProfileRecord, ...]
    """The records this run appended, in order."""
    skipped: tuple[SkippedInstance, ...]
    resumed: int
    """Points of this sweep already finished in the store when the run started."""
    warnings: tuple[str, ...]
    """What opening the store found (a cut-off last line, bad lines) and other notes."""
    elapsed_s: float
    store_records: tuple[ProfileRecord, ...] = ()
    """Every record of the store when the run ended (one per point), this run's included."""

    @property
    def ok(self) -> tuple[ProfileRecord, ...]:
        return tuple(r for r in self.records if r.status == "ok")

    @property
    def failed(self) -> tuple[ProfileRecord, ...]:
        return tuple(r for r in self.records if r.status == "failed")


def run_sweep(backend: ProfilerBackend, model: EngineModel, spec: SweepSpec,
              store_path: str | Path, options: BackendOptions, *, budget_s: float | None = None,
              retry_failed: bool = False, on_progress: ProgressHook | None = None,
              next_points: NextPoints | None = None,
              round_points: int = DEFAULT_ROUND_POINTS,
              clock: Callable[[], float] = time.monotonic) -> SweepResult:
    """Measure ``model`` over ``spec`` with ``backend`` into the store at ``store_path``.

    ``spec`` is the planner's :class:`SweepSpec` (a dataclass with ``tps`` and ``shares``);
    ``next_points`` defaults to :func:`planner.next_points`. The sweep is the store's records of
    this engine, model (name and scale) and device; the device is the one the first session
    reports, so a session is started even when the store already holds the whole sweep.

    Before each point, the sweep stops (``stopped="budget"``) when the time since the start plus
    the mean time of the points measured so far in this run would exceed ``budget_s``.
    Raises :class:`BackendUnavailable` when the backend cannot run here,
    :class:`~scepsy_profile.profiling.store.StoreLockedError` when another sweep writes the
    store, and :class:`InputError` when the store holds this model measured with another
    architecture.
    """
    reason = backend.unavailable(options)
    if reason is not None:
        raise BackendUnavailable(reason)
    if budget_s is not None and not budget_s >= 0:
        raise InputError("profile", "budget_s", "a number of seconds >= 0", budget_s)
    if not (isinstance(round_points, int) and round_points >= 1):
        raise InputError("profile", "round_points", "an integer >= 1", round_points)
    start = clock()
    with ProfileStore(store_path) as store:
        sweep = _Sweep(backend, model, spec, store, options,
                       _Policy(budget_s, retry_failed, round_points, clock, start),
                       next_points or planner.next_points, on_progress)
        try:
            stopped = sweep.run()
        except KeyboardInterrupt:
            stopped = "interrupted"
        finally:
            sweep.close_session()
        return SweepResult(
            stopped=stopped, store=store.path, device=sweep.device, records=tuple(sweep.written),
            skipped=tuple(SkippedInstance(tp, s, why) for (tp, s), why in sweep.skipped.items()),
            resumed=sweep.resumed, warnings=store.warnings + tuple(sweep.notes),
            elapsed_s=clock() - start, store_records=store.records)


@dataclass(frozen=True, slots=True)
class _Policy:
    budget_s: float | None
    retry_failed: bool
    round_points: int
    clock: Callable[[], float]
    start: float


class _Sweep:
    """The state of one run: the open session, what was written, what was skipped."""

    def __init__(self, backend: ProfilerBackend, model: EngineModel, spec: SweepSpec,
                 store: ProfileStore, options: BackendOptions, policy: _Policy,
                 next_points: NextPoints, on_progress: ProgressHook | None) -> None:
        self.backend, self.model, self.spec, self.store = backend, model, spec, store
        self.options, self.policy = options, policy
        self.next_points, self.on_progress = next_points, on_progress
        self.version = backend.version(options)
        self.config = model.config()
        self.device: str | None = None
        self.written: list[ProfileRecord] = []
        self.skipped: dict[Instance, str] = {}
        self.notes: list[str] = []
        self.resumed = 0
        self.attempted: set[PointKey] = set()
        self.pending = 0
        self._stack = ExitStack()
        self._open: tuple[Instance, ProfilerSession, dict[str, Any]] | None = None
        self._check_store()

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> SweepStop:
        instances = self._supported()
        if not any(self._session(inst) for inst in instances):
            return "done"  # nothing can run here: every instance is in ``skipped``
        self.resumed = len(finished(self._mine(), self.policy.retry_failed))
        while plan := self._plan(instances):
            progress = (len(self.written), len(self.skipped))
            self.pending = len(plan)
            skip = self._skip_keys()
            for inst, points in self._groups(plan):
                for point in points:
                    if self._over_budget():
                        return "budget"
                    self.pending -= 1
                    key = self._key(inst, point.step)
                    if key in skip or key in self.attempted:
                        continue
                    opened = self._session(inst)
                    if opened is None:
                        break
                    self._measure(inst, opened, point.step)
            if (len(self.written), len(self.skipped)) == progress:
                return "done"  # the planner only asks for what cannot be measured
        return "done"

    def _supported(self) -> list[Instance]:
        out: list[Instance] = []
        for tp in self.spec.tps:
            for share in self.spec.shares:
                inst = _instance(tp, share)
                why = self.backend.unsupported(self.model, inst[0], inst[1], self.options)
                if why is not None:
                    self.skipped[inst] = why
                elif inst not in out:
                    out.append(inst)
        return out

    def _plan(self, instances: list[Instance]) -> list[SweepPoint]:
        """The planner's next points for the instances that can run.

        With every instance of the spec running, the planner is asked once with the spec;
        otherwise once per TP degree with the shares that run (a spec is a product of TP degrees
        and shares), the spec's ``max_points`` shared out among the calls."""
        live = [i for i in instances if i not in self.skipped]
        skip = self._skip_keys()
        done = [r for r in self._mine() if r.key() in skip and _instance(r.tp, r.share) in live]
        if len(live) == len(self.spec.tps) * len(self.spec.shares):
            points = self.next_points(self.spec, done, budget_points=self.policy.round_points)
            return [p for p in points if _instance(p.tp, p.share) in live]
        max_points = getattr(self.spec, "max_points", None)
        left = None if max_points is None else max_points - len(done)
        plan: list[SweepPoint] = []
        for tp in dict.fromkeys(tp for tp, _ in live):
            mine = [r for r in done if r.tp == tp]
            change: dict[str, Any] = {"tps": (tp,), "shares": tuple(s for t, s in live if t == tp)}
            if left is not None:
                if left <= 0:
                    break
                change["max_points"] = len(mine) + left
            points = self.next_points(dataclasses.replace(self.spec, **change), mine,
                                      budget_points=self.policy.round_points)
            plan.extend(p for p in points if _instance(p.tp, p.share) in live)
            if left is not None:
                left -= len(points)
        return plan

    def _groups(self, plan: list[SweepPoint]) -> list[tuple[Instance, list[SweepPoint]]]:
        """Points by instance, the open session's instance first (no restart between rounds)."""
        groups: dict[Instance, list[SweepPoint]] = {}
        for p in plan:
            groups.setdefault(_instance(p.tp, p.share), []).append(p)
        current = self._open[0] if self._open else None
        return sorted(groups.items(), key=lambda kv: kv[0] != current)

    def _over_budget(self) -> bool:
        if self.policy.budget_s is None:
            return False
        spent = [r.elapsed_s for r in self.written]
        next_cost = sum(spent) / len(spent) if spent else 0.0
        return self.policy.clock() - self.policy.start + next_cost > self.policy.budget_s

    # -- the store ---------------------------------------------------------------------------

    def _check_store(self) -> None:
        versions: set[str] = set()
        for r in self.store.records:
            if self._same_model(r):
                if r.config != self.config:
                    raise InputError(str(self.store.path), f"model {r.profiled_name}",
                                     "the architecture this sweep measures (the store holds it "
                                     "with another config; use another store)", r.config)
                versions.add(r.engine_version)
        if versions - {self.version}:
            self.notes.append(f"{self.store.path}: holds {self.model.profiled_name} measured with "
                              f"{self.backend.name} {', '.join(sorted(versions))}; this run uses "
                              f"{self.version}")

    def _same_model(self, r: ProfileRecord) -> bool:
        return (r.engine == self.backend.name and r.model == self.model.name
                and round(r.scale, 9) == round(self.model.scale, 9))

    def _mine(self) -> list[ProfileRecord]:
        """The store's records of this sweep (engine, model, scale, device)."""
        return [r for r in self.store.records if self._same_model(r) and r.device == self.device]

    def _skip_keys(self) -> set[PointKey]:
        return finished(self.store.records, self.policy.retry_failed) | self.attempted

    def _key(self, inst: Instance, step: StepPoint) -> PointKey:
        return point_key(self.backend.name, self.model.name, self.model.scale, str(self.device),
                         inst[0], inst[1], step.phase, step.batch, step.tokens)

    # -- sessions and points -----------------------------------------------------------------

    def _session(self, inst: Instance) -> tuple[ProfilerSession, dict[str, Any]] | None:
        """The open session of ``inst``, started when needed (the previous one closed); None
        when it cannot start (the instance is then skipped)."""
        if self._open is not None and self._open[0] == inst:
            return self._open[1], self._open[2]
        self.close_session()
        tp, share = inst
        try:
            session = self._stack.enter_context(
                self.backend.session(self.model, tp, share, self.options))
        except BackendUnavailable as exc:
            self.skipped[inst] = str(exc)
            return None
        except Exception as exc:  # an engine that does not start: skip its instance, go on
            self.skipped[inst] = f"the engine did not start: {type(exc).__name__}: {exc}"
            return None
        device = session.device
        if self.device is None:
            self.device = device.name
        elif device.name != self.device:
            self.close_session()
            self.skipped[inst] = f"runs on {device.name}, not on {self.device} like the sweep"
            return None
        self._open = (inst, session, _device_detail(device))
        return session, self._open[2]

    def close_session(self) -> None:
        self._open = None
        self._stack.close()

    def _measure(self, inst: Instance, opened: tuple[ProfilerSession, dict[str, Any]],
                 step: StepPoint) -> None:
        session, detail = opened
        timing: Timing | None = None
        error = ""
        t0 = self.policy.clock()
        try:
            timing = session.measure(step)
        except MeasurementError as exc:
            error = str(exc) or type(exc).__name__
        except Exception as exc:  # any engine error on one point fails that point only
            error = f"{type(exc).__name__}: {exc}"
        elapsed = max(0.0, self.policy.clock() - t0)
        record = self._record(inst, step, timing, error, elapsed, detail)
        self.store.append(record)
        self.attempted.add(record.key())
        self.written.append(record)
        if self.on_progress is not None:
            done = len(self._mine())
            self.on_progress(done, done + self.pending, record)

    def _record(self, inst: Instance, step: StepPoint, timing: Timing | None, error: str,
                elapsed: float, detail: dict[str, Any]) -> ProfileRecord:
        measured: dict[str, Any] = {} if timing is None else {
            "latency_ms": timing.median_ms, "iqr_ms": timing.iqr_ms,
            "samples_ms": timing.samples_ms, "method": timing.method}
        return ProfileRecord(
            engine=self.backend.name, engine_version=self.version, model=self.model.name,
            scale=self.model.scale, config=self.config, device=str(self.device), tp=inst[0],
            share=inst[1], phase=step.phase, batch=step.batch, tokens=step.tokens,
            status="ok" if timing is not None else "failed", error=error,
            elapsed_s=round(elapsed, 6), device_detail=detail, **measured)


def _instance(tp: int, share: float) -> Instance:
    return int(tp), round(float(share), 9)


def _device_detail(device: DeviceInfo) -> dict[str, Any]:
    """What every record says about its device: the engine's report, JSON-safe, with the memory
    and device count that :func:`store_measurements` needs for a device the catalog lacks."""
    detail = json.loads(json.dumps(device.detail, default=str))
    return {**detail, "kind": device.kind, "memory_gib": device.memory_gib,
            "count": device.count}
