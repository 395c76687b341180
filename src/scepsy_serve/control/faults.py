"""Faults the controller notices, window by window (docs/control.md, "Faults"): pure rules over
what the gateway's ``GET /scepsy/state`` said at each window's end, no I/O. The live loop
(:mod:`scepsy_serve.control.live`) reads the state, calls :func:`detect` once a window, logs
every :class:`Fault` (one JSON line, with its reason) and acts on the :class:`Verdict`.

Rules, for a window ending at ``at_s`` (``w`` is the window):

* **replica_down** -> ``replace``: an endpoint the gateway reports unhealthy (its active health
  check failed) or ejected (outlier ejection) at two consecutive window ends, that is for at
  least one window. A replica that goes down at ``t`` is seen down at the first window end
  after ``t`` and declared at the next one: before ``t + 2w`` (plus the gateway's own time to
  mark it, ``interval x unhealthy_threshold`` of its health check). The loop starts a new
  replica of the same launch (same LLM, shape and place; the others run on), so the running
  plan stays whole: a resize in place with nothing to re-plan.
* **start_hung** -> ``kill``: a replica the controller started that is not healthy
  ``deadline_s`` after its start (:func:`start_deadline`: twice the expected start-up, at least
  one window). The loop stops it; the running plan stays (a replacement is tried again at the
  next window, a change is rolled back).
* **telemetry_stale** -> ``hold``: no fresh telemetry at two consecutive window ends: the
  gateway did not answer, or its state did not change at all over a window while it had calls
  in flight (counters frozen under load). Every window without fresh telemetry is held (no
  decision, above all no scale-down on missing data); the fault is declared at the second,
  before ``t + 2w`` for telemetry lost at ``t``. An idle gateway whose state does not change
  is not stale (nothing is in flight, nothing should move).
* **gateway_restarted** -> ``resync``: the gateway's table version or its request or call
  counters went down since the last read (a new process counts from 0). The window that
  spans the restart is not judged (its counters mix two processes): the loop takes this read
  as the new baseline and hands the restarted gateway the running plan's routes; no decision.

A fault is reported once per episode: a replica seen healthy again (or gone from the table),
fresh telemetry again, clears it (:attr:`FaultState.open`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

FaultKind = Literal["replica_down", "start_hung", "telemetry_stale", "gateway_restarted"]
Response = Literal["replace", "kill", "hold", "resync"]
RESPONSE: Mapping[FaultKind, Response] = MappingProxyType({
    "replica_down": "replace", "start_hung": "kill", "telemetry_stale": "hold",
    "gateway_restarted": "resync"})
DOWN_WINDOWS = 2  # window ends in a row a replica is seen down before it is declared down
STALE_WINDOWS = 2  # window ends in a row without fresh telemetry before it is declared stale
GATEWAY = "gateway"


@dataclass(frozen=True)
class EndpointView:
    """One replica (URL) in the gateway's state: its health over every row that names it."""

    url: str
    llm: str
    healthy: bool
    ejected: bool
    in_flight: int = 0
    calls: int = 0

    @property
    def down(self) -> bool:
        return not self.healthy or self.ejected


@dataclass(frozen=True)
class GatewayView:
    """What one ``GET /scepsy/state`` said: the table's version, its endpoints (by URL, without
    a trailing ``/``) and its request and call counters summed over workflows."""

    version: int
    endpoints: Mapping[str, EndpointView]
    requests: int
    calls: int
    instance: str | None = None  # the gateway process's id (None: a gateway that gives none)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", MappingProxyType(dict(self.endpoints)))

    @classmethod
    def from_state(cls, doc: Any) -> GatewayView:
        """The view of a ``/scepsy/state`` answer (:class:`ValueError` naming what is wrong)."""
        if not isinstance(doc, Mapping):
            raise ValueError("the gateway's state is not a JSON object")
        version, rows, wfs = doc.get("version"), doc.get("endpoints"), doc.get("workflows", {})
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"the gateway's state has no integer version: {version!r}")
        if not isinstance(rows, list) or not isinstance(wfs, Mapping):
            raise ValueError("the gateway's state has no endpoints list or workflows object")
        eps: dict[str, EndpointView] = {}
        for row in rows:
            if not isinstance(row, Mapping) or not isinstance(row.get("url"), str):
                raise ValueError(f"an endpoint of the gateway's state has no url: {row!r}")
            url = row["url"].rstrip("/")
            healthy = row.get("healthy", True) is not False
            ejected = row.get("ejected", False) is True
            e = eps.get(url)
            if e is None:  # the rows of one URL share one server (in flight, calls)
                eps[url] = EndpointView(url, str(row.get("llm", "")), healthy, ejected,
                                        _count(row.get("in_flight")), _count(row.get("calls")))
            else:
                eps[url] = replace(e, healthy=e.healthy and healthy,
                                   ejected=e.ejected or ejected)
        requests = sum(_count(c.get("requests")) for c in wfs.values() if isinstance(c, Mapping))
        calls = sum(_count(c.get("calls")) for c in wfs.values() if isinstance(c, Mapping))
        instance = doc.get("instance")
        return cls(version, eps, requests, calls,
                   instance if isinstance(instance, str) and instance else None)

    def in_flight(self) -> int:
        return sum(e.in_flight for e in self.endpoints.values())

    def frozen_since(self, before: GatewayView) -> bool:
        """Whether nothing moved from ``before`` to this read although calls were in flight:
        same version, counters and calls in flight on every endpoint."""
        return (self.in_flight() > 0 and self.version == before.version
                and self.requests == before.requests and self.calls == before.calls
                and {u: (e.in_flight, e.calls) for u, e in self.endpoints.items()}
                == {u: (e.in_flight, e.calls) for u, e in before.endpoints.items()})

    def restarted_since(self, before: GatewayView) -> str | None:
        """Why this read comes from a new gateway process (None: the same one): another
        ``instance`` id, or, from a gateway that gives none, a version or counter below
        ``before``'s."""
        if self.instance is not None and before.instance is not None:
            if self.instance != before.instance:
                return f"its instance changed from {before.instance} to {self.instance}"
            return None
        for name in ("version", "requests", "calls"):
            a, b = getattr(before, name), getattr(self, name)
            if b < a:
                return f"its {name} went down from {a} to {b}"
        return None


def _count(x: Any) -> int:
    return int(x) if isinstance(x, int | float) and not isinstance(x, bool) \
        and math.isfinite(x) and x >= 0 else 0


@dataclass(frozen=True)
class Fault:
    """One fault noticed at ``at_s``: its kind, what it concerns (a replica's URL, or
    ``gateway``), the controller's response, since when it holds and why."""

    kind: FaultKind
    at_s: float
    subject: str
    since_s: float
    reason: str
    llm: str | None = None

    @property
    def response(self) -> Response:
        return RESPONSE[self.kind]

    def to_dict(self) -> dict[str, Any]:
        """One line of the controller's log (``{"kind": "fault", ...}``)."""
        return {"kind": "fault", "fault": self.kind, "at_s": round(self.at_s, 3),
                "subject": self.subject, "llm": self.llm, "since_s": round(self.since_s, 3),
                "response": self.response, "reason": self.reason}


@dataclass(frozen=True)
class FaultState:
    """What :func:`detect` carries from one window to the next: the last view the gateway
    gave, the window ends without fresh telemetry in a row (and the first of them), per URL the
    window ends it was seen down in a row (and the first), and the faults reported and not yet
    cleared (``(kind, subject)``)."""

    last: GatewayView | None = None
    stale: int = 0
    stale_since_s: float = math.nan
    down: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    open: frozenset[tuple[str, str]] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "down", MappingProxyType(dict(self.down)))

    def forget(self, kind: FaultKind, subject: str) -> FaultState:
        """This state with the fault ``(kind, subject)`` cleared: reported again if it still
        holds at the next window (a replacement that failed is tried again)."""
        return replace(self, open=self.open - {(kind, subject)})


@dataclass(frozen=True)
class Verdict:
    """A window's outcome: the new state, the faults declared now, whether the window is held
    (no decision: telemetry not fresh, or the gateway restarted), whether the counters must be
    resynchronised (this read is the new baseline), and the replicas (URLs) to replace or
    kill."""

    state: FaultState
    faults: tuple[Fault, ...]
    hold: bool
    resync: bool
    replace: tuple[str, ...] = ()
    kill: tuple[str, ...] = ()


def start_deadline(startup_s: float, window_s: float) -> float:
    """How long a started replica may take to be healthy before it is declared hung: twice the
    expected start-up, and at least one window."""
    return max(2.0 * startup_s, window_s)


def start_hung(started_s: float, now_s: float, healthy: bool, deadline_s: float) -> bool:
    """Whether a replica started at ``started_s`` and not healthy at ``now_s`` is hung."""
    return not healthy and now_s - started_s >= deadline_s


def detect(state: FaultState, at_s: float, view: GatewayView | None, *,
           starting: Mapping[str, float] | None = None,
           deadline_s: float = math.inf) -> Verdict:
    """The faults of the window ending at ``at_s`` (module docstring). ``view``: the gateway's
    state read at ``at_s`` (None: it did not answer, or its ``/metrics`` did not);
    ``starting``: URL -> start time of the replicas the controller started and waits for (not
    counted down; hung after ``deadline_s``)."""
    starting = starting or {}
    faults: list[Fault] = []
    opened = set(state.open)

    def report(kind: FaultKind, subject: str, since: float, reason: str,
               llm: str | None = None) -> bool:
        if (kind, subject) in opened:
            return False
        opened.add((kind, subject))
        faults.append(Fault(kind, at_s, subject, since, reason, llm))
        return True

    kill = tuple(sorted(u for u, t0 in starting.items() if start_hung(
        t0, at_s, view is not None and u in view.endpoints and not view.endpoints[u].down,
        deadline_s)))
    for u in kill:
        report("start_hung", u, starting[u], f"started {at_s - starting[u]:.3g} s ago and not "
               f"healthy after the start-up deadline of {deadline_s:.3g} s: stopped, the "
               "running plan stays")
    last = state.last
    why = last is not None and view is not None and view.restarted_since(last)
    if why:
        report("gateway_restarted", GATEWAY, at_s, f"the gateway restarted ({why}): this read "
               "is the new baseline, the window is not judged, the routes are handed again")
        opened -= {k for k in opened if k[0] in ("replica_down", "telemetry_stale")}
        new = FaultState(view, 0, math.nan, {}, frozenset(opened))
        return Verdict(new, tuple(faults), hold=True, resync=True, kill=kill)
    fresh = view is not None and not (last is not None and view.frozen_since(last))
    if not fresh:
        n = state.stale + 1
        since = state.stale_since_s if state.stale else at_s
        if n >= STALE_WINDOWS:
            what = ("did not answer" if view is None else
                    f"did not change while {view.in_flight()} calls were in flight")
            report("telemetry_stale", GATEWAY, since, f"the gateway {what} at {n} window ends "
                   "in a row: holding (no decision, no scale-down on missing data)")
        new = replace(state, last=view if view is not None else last, stale=n,
                      stale_since_s=since, open=frozenset(opened))
        return Verdict(new, tuple(faults), hold=True, resync=False, kill=kill)
    assert view is not None
    opened.discard(("telemetry_stale", GATEWAY))
    down: dict[str, tuple[int, float]] = {}
    todo: list[str] = []
    for u, e in sorted(view.endpoints.items()):
        if not e.down or u in starting:
            opened.discard(("replica_down", u))
            continue
        n, since = state.down.get(u, (0, at_s))
        down[u] = (n + 1, since)
        if n + 1 >= DOWN_WINDOWS:
            how = " and ".join(x for x, on in (("unhealthy", not e.healthy),
                                                 ("ejected", e.ejected)) if on)
            if report("replica_down", u, since, f"{e.llm} replica {u} {how} at {n + 1} window "
                      f"ends in a row: a new one starts in its place (the others run on)",
                      e.llm):
                todo.append(u)
    opened -= {k for k in opened if k[0] == "replica_down" and k[1] not in view.endpoints}
    new = FaultState(view, 0, math.nan, down, frozenset(opened))
    return Verdict(new, tuple(faults), hold=False, resync=False, replace=tuple(todo), kill=kill)
