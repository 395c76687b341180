"""run_killable: a HiGHS solve in a forked child that is killed past its time limit. The child
answers what an in-process solve would (checked against brute force on small knapsacks and
against the in-process run on a larger one); a solve that HiGHS itself never stops (its RENS
sub-MIP presolve loop) ends within the limit and the grace; a child that dies is an error,
not a time limit."""

from __future__ import annotations

import gzip
import itertools
import math
import shutil
import time
from pathlib import Path

import highspy
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_opt.planning import solver

pytestmark = pytest.mark.skipif(not solver.can_fork(), reason="the platform cannot fork")
RENS_MODEL = Path(__file__).resolve().parents[1] / "data" / "highs-rens-presolve-loop.mps.gz"


def _knapsack(values: list[int], weights: list[int], cap: int, limit: float) -> highspy.Highs:
    """max sum(v x) s.t. sum(w x) <= cap, x binary; as a minimisation of -v x."""
    n = len(values)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, 1
    lp.col_cost_ = -np.array(values, dtype=float)
    lp.col_lower_, lp.col_upper_ = np.zeros(n), np.ones(n)
    lp.row_lower_, lp.row_upper_ = np.array([-highspy.kHighsInf]), np.array([float(cap)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.arange(n + 1, dtype=np.int32)
    lp.a_matrix_.index_ = np.zeros(n, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(weights, dtype=float)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    h = solver.highs(limit, gap_rel=0.0, gap_abs=0.0)
    h.passModel(lp)
    return h


def _hanging(tmp: Path, limit: float) -> highspy.Highs:
    """The slot probe on which HiGHS 1.16.0 with RENS on presolves its RENS sub-MIP for
    minutes past ``limit``: the slot MILPs' own settings, RENS switched back on."""
    from scepsy_place.formulations.patterns import _highs

    mps = tmp / "m.mps"
    with gzip.open(RENS_MODEL) as src, open(mps, "wb") as dst:
        shutil.copyfileobj(src, dst)
    h = _highs(limit, 0.01)
    h.setOptionValue("mip_heuristic_run_rens", True)
    h.readModel(str(mps))
    return h


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20)), min_size=1, max_size=8),
       st.integers(0, 60))
def test_a_child_solve_finds_the_brute_force_optimum(items, cap):
    values, weights = [v for v, _ in items], [w for _, w in items]
    best = max(sum(v for v, x in zip(values, pick, strict=True) if x)
               for pick in itertools.product((0, 1), repeat=len(items))
               if sum(w for w, x in zip(weights, pick, strict=True) if x) <= cap)
    got = solver.run_killable(_knapsack(values, weights, cap, 10.0), 10.0)
    assert got.status == "optimal" and not got.killed
    assert -got.objective == pytest.approx(best, abs=1e-6)
    assert float(np.dot(weights, got.values)) <= cap + 1e-6
    assert float(np.dot(values, got.values)) == pytest.approx(best, abs=1e-6)


def test_a_child_solve_answers_as_the_same_solve_in_this_process():
    rng = np.random.default_rng(7)
    values = rng.integers(10, 100, 60).tolist()
    weights = rng.integers(5, 60, 60).tolist()
    child = solver.run_killable(_knapsack(values, weights, 700, 10.0), 10.0)
    h = _knapsack(values, weights, 700, 10.0)
    h.run()
    here = solver.solved_by(h)
    assert child.status == here.status == "optimal"
    # the same model, options and seed on one thread: the same run, to HiGHS's tolerances
    assert child.objective == pytest.approx(here.objective, rel=1e-9)
    assert np.allclose(child.values, here.values, atol=1e-9)


def test_a_solve_highs_never_stops_is_killed_within_the_grace(tmp_path):
    """With RENS on, HiGHS 1.16.0 presolves this model's RENS sub-MIP for minutes past a 3.8 s
    limit (tests/scepsy_place/test_highs_regression.py); in a child it ends in time, as a
    time limit without a solution, and the next solve works."""
    h = _hanging(tmp_path, 3.8)
    t = time.perf_counter()
    got = solver.run_killable(h, 3.8)
    wall = time.perf_counter() - t
    assert got.killed and got.status == "time_limit_no_solution" and got.values.size == 0
    assert math.isinf(got.objective)
    # the grace, and a second for the fork and a loaded machine
    assert wall <= 3.8 * (1 + solver.KILL_GRACE_REL) + solver.KILL_GRACE_S + 1.0
    assert solver.run_killable(_knapsack([3, 4], [2, 3], 4, 5.0), 5.0).status == "optimal"


class _Crashing:
    def run(self) -> None:
        raise RuntimeError("the solver died")


def test_a_child_that_dies_is_an_error_not_a_time_limit():
    with pytest.raises(RuntimeError, match="without an answer"):
        solver.run_killable(_Crashing(), 5.0)  # type: ignore[arg-type]


class _Interrupted(Exception):
    pass


def test_an_interrupted_wait_kills_the_child(tmp_path, monkeypatch):
    """An exception in the parent while the child solves (here a timer's signal; Ctrl-C is
    the same) kills and reaps the child before it propagates: no solve outlives its caller."""
    import os
    import signal

    import psutil

    h = _hanging(tmp_path, 60.0)
    forked: list[int] = []
    fork = os.fork

    def recorded() -> int:
        pid = fork()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", recorded)

    def interrupt(*_):
        raise _Interrupted

    old = signal.signal(signal.SIGALRM, interrupt)
    t = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(_Interrupted):
            solver.run_killable(h, 60.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.perf_counter() - t < 10.0
    assert len(forked) == 1
    # killed and reaped: no longer this process's child, nor a process at all
    assert forked[0] not in {p.pid for p in psutil.Process(os.getpid()).children()}
    with pytest.raises(ChildProcessError):
        os.waitpid(forked[0], os.WNOHANG)
