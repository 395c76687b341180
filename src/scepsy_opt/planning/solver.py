"""HiGHS, configured in one place: every MILP and LP of scepsy_opt and scepsy_place gets its solver
here.

* :data:`SOLVER` is the version string plans record (``stats["solver"]``);
* :func:`pulp_highs` is the PuLP ``HiGHS`` solver (in-process) for a ``pulp.LpProblem``,
  :func:`highs` a ``highspy.Highs`` for a model passed directly; both run one thread with the
  fixed seed :data:`SEED`, print nothing, and stop at the given time limit and gaps, and both
  take further HiGHS options by their HiGHS names (tolerances, ``presolve``), so that each caller
  states the settings that differ on purpose;
* :func:`highs_status` reads a finished solve's status, objective and dual bound the same way for
  both; :class:`SolverStopped` is what a caller raises when a solve ended otherwise (neither
  optimal, infeasible nor at a limit), so that such an end is never reported as a time limit;
* :func:`run_killable` runs a solve in a forked child that is killed if it outlives its time
  limit: HiGHS 1.16's presolve has loops without a time check (``strengthenInequalities``) that
  ``cancelSolve`` does not reach either, and only a process boundary keeps a limit there.

Importing this module has no side effect. HiGHS prints a banner to stdout when a process creates
its first solver; the factories swallow it (once per process) before they create one, so that
``--json`` output stays clean.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np
import pulp

from scepsy_common.errors import InputError
from scepsy_common.forked import ChildKilled, Forked, can_fork

SEED = 0
"""HiGHS's ``random_seed`` in every solve (with one thread, runs are deterministic)."""

SOLVER = (f"HiGHS {highspy.HIGHS_VERSION_MAJOR}.{highspy.HIGHS_VERSION_MINOR}."
          f"{highspy.HIGHS_VERSION_PATCH}")
"""The solver and its version, as plans record it (``stats["solver"]``)."""

_FEASIBLE = 2  # HiGHS's kSolutionStatusFeasible: the solve holds a feasible (integer) solution
_LIMITS = (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kIterationLimit,
           highspy.HighsModelStatus.kSolutionLimit, highspy.HighsModelStatus.kInterrupt)
_banner_lock = threading.Lock()
_banner_done = False


def quiet_banner() -> None:
    """Swallow the banner HiGHS prints to stdout when the process creates its first solver
    (idempotent; :func:`pulp_highs` and :func:`highs` call it)."""
    global _banner_done
    with _banner_lock:
        if _banner_done:
            return
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _banner_done = True


def pulp_highs(time_limit_s: float, *, mip: bool = True, gap_rel: float | None = None,
               gap_abs: float | None = None, **options: Any) -> pulp.HiGHS:
    """PuLP's in-process HiGHS: quiet, one thread, seed :data:`SEED`, at most ``time_limit_s``
    seconds. ``mip=False`` solves the LP relaxation; ``gap_rel``/``gap_abs`` are HiGHS's
    ``mip_rel_gap``/``mip_abs_gap`` (None: HiGHS's default); ``options`` are further HiGHS
    options (``mip_feasibility_tolerance=1e-9``, ``presolve="off"``)."""
    quiet_banner()
    return pulp.HiGHS(mip=mip, msg=False, threads=1, timeLimit=time_limit_s, gapRel=gap_rel,
                      gapAbs=gap_abs, random_seed=SEED, **options)


def highs(time_limit_s: float, *, gap_rel: float | None = None, gap_abs: float | None = None,
          **options: Any) -> highspy.Highs:
    """A ``highspy.Highs`` with the settings of :func:`pulp_highs` (same arguments, no ``mip``:
    the model passed to it says which columns are integer)."""
    quiet_banner()
    h = highspy.Highs()
    settings: dict[str, Any] = {"output_flag": False, "threads": 1, "random_seed": SEED,
                                "time_limit": float(time_limit_s), "mip_rel_gap": gap_rel,
                                "mip_abs_gap": gap_abs, **options}
    for key, value in settings.items():
        if value is not None:
            h.setOptionValue(key, value)
    return h


def has_solution(h: highspy.Highs) -> bool:
    """Whether the finished solve of ``h`` holds a feasible solution (an incumbent)."""
    return bool(h.getInfo().primal_solution_status == _FEASIBLE)


def highs_status(h: highspy.Highs) -> tuple[str, float, float]:
    """(status, objective, dual bound) of the finished solve of ``h`` (a PuLP problem's is its
    ``solverModel``), as HiGHS reports them: ``optimal``, ``infeasible``, a limit reached with an
    incumbent ``time_limit``, without one ``time_limit_no_solution`` (nothing known: not
    infeasible), else HiGHS's own status in lower case (``unbounded``...)."""
    st = h.getModelStatus()
    info = h.getInfo()
    found = info.primal_solution_status == _FEASIBLE
    if st == highspy.HighsModelStatus.kOptimal:
        return "optimal", info.objective_function_value, info.mip_dual_bound
    if st in (highspy.HighsModelStatus.kInfeasible,
              highspy.HighsModelStatus.kUnboundedOrInfeasible):  # every model here is bounded
        return "infeasible", math.inf, math.inf
    if st in _LIMITS:
        return ("time_limit" if found else "time_limit_no_solution",
                info.objective_function_value if found else math.inf, info.mip_dual_bound)
    return h.modelStatusToString(st).lower().replace(" ", "_"), math.inf, math.inf


FAILED = frozenset({"unbounded", "model_error", "solve_error", "load_error", "presolve_error",
                    "postsolve_error", "unknown", "not_set"})
"""The :func:`highs_status` values of a solve that failed: no answer, no proof, no limit."""


class SolverStopped(InputError):
    """HiGHS ended a solve neither optimal, infeasible nor at a limit (``unbounded``,
    ``model_error``, numerical trouble): nothing is known, and no time limit ran out. In
    practice the model's numbers are out of range, so it is reported as bad input (exit 2)."""

    def __init__(self, status: str, model: str) -> None:
        super().__init__(
            "HiGHS", model, "an optimal, infeasible or time-limited solve; it ended with status "
            f"{status} before any allocation was found (not a time limit: the model's numbers "
            "are likely out of range; check the magnitudes of prices, targets and bounds)")
        self.status = status


KILL_GRACE_S = 0.5
""":func:`run_killable`: how long past its time limit (and :data:`KILL_GRACE_REL` of it) a
child solve may run before it is killed (HiGHS's own checks overrun by milliseconds)."""
KILL_GRACE_REL = 0.05


@dataclass(frozen=True)
class Solved:
    """What a finished solve holds: :func:`highs_status`'s ``status``, ``objective`` and
    ``dual_bound``, and the column values of its incumbent (empty without one). A child
    killed past its limit reads ``time_limit_no_solution`` with ``killed`` set."""

    status: str
    objective: float
    dual_bound: float
    values: np.ndarray
    killed: bool = False


def solved_by(h: highspy.Highs) -> Solved:
    """What the finished solve of ``h`` holds (:class:`Solved`)."""
    status, objective, dual = highs_status(h)
    vals = (np.asarray(h.getSolution().col_value, dtype=float) if has_solution(h)
            else np.zeros(0))
    return Solved(status, objective, dual, vals)


def _solve(h: highspy.Highs) -> Solved:
    h.run()
    return solved_by(h)


def run_killable(h: highspy.Highs, time_limit_s: float) -> Solved:
    """Run ``h`` (its model passed, its options set, ``time_limit_s`` among them) in a forked
    child (:class:`scepsy_common.forked.Forked`) and read what it found; a child still running
    :data:`KILL_GRACE_S` + :data:`KILL_GRACE_REL` x ``time_limit_s`` after the limit is killed,
    and the solve reads as a time limit without a solution (``killed``). Where the platform
    cannot fork, ``h`` runs in this process. The child computes exactly what an in-process run
    would (same model, options and seed), so the answers are identical; a fork costs
    milliseconds per solve."""
    if not can_fork():
        return _solve(h)
    quiet_banner()
    with Forked(lambda: _solve(h)) as child:
        try:
            return child.wait(time_limit_s * (1 + KILL_GRACE_REL) + KILL_GRACE_S)
        except ChildKilled:
            return Solved("time_limit_no_solution", math.inf, -math.inf, np.zeros(0),
                          killed=True)
