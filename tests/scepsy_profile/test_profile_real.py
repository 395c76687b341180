"""Real torch sweeps (seconds on two cores): the fitted curve is monotone where the engine is, and
a ``scepsy profile run`` killed with SIGKILL twice ends with exactly the points of an
uninterrupted run, none twice.

The lattice is timed with ``clock=cpu`` (one thread's CPU time): on a shared machine wall-clock
medians of a millisecond step are ordered by the neighbours' load as much as by the work."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from scepsy.cli import main
from scepsy_profile.fitted import FittedLatencyModel, fit_latency_model
from scepsy_profile.measurements import Measurement, Phase
from scepsy_profile.profiling.backend import BackendOptions, StepPoint
from scepsy_profile.profiling.models import engine_model
from scepsy_profile.profiling.registry import get_backend
from scepsy_profile.profiling.store import read_store

pytestmark = pytest.mark.torch

MODEL = engine_model("llama-3-8b", 0.0625)
GRID: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "prefill": ((1, 2, 4, 8, 16), (16, 32, 64, 128, 256)),
    "decode": ((1, 4, 16, 64), (16, 64, 256, 1024)),
}
"""Batches and context tokens timed per phase. A decode step of this small model is bound by its
weights up to a batch of about 16: at 16 x 256 one machine measured it within 2% of 1 x 16, so
the decode lattice reaches 64 x 1024 (about 10x the least work here) to order anything clearly."""
CLEARLY = 1.3
"""Two medians are clearly ordered when one is this many times the other."""


@pytest.fixture(scope="module")
def lattice() -> dict[tuple[Phase, int, int], float]:
    """Median latency (ms) of every (phase, batch, tokens) of the lattice, 3 timed runs each."""
    options = BackendOptions(repeats=3, warmup=1, threads=1, extra=(("clock", "cpu"),))
    with get_backend("torch").session(MODEL, 1, 1.0, options) as session:
        return {(phase, b, n): session.measure(StepPoint(phase, b, n)).median_ms
                for phase, (batches, tokens) in GRID.items() for b in batches for n in tokens}


@pytest.fixture(scope="module")
def extremes() -> dict[tuple[Phase, int, int], float]:
    """The least and the most work of each phase timed again, 9 runs each: their medians decide
    whether the lattice orders anything clearly (3 runs can all land on a busy CPU's spike)."""
    options = BackendOptions(repeats=9, warmup=2, threads=1, extra=(("clock", "cpu"),))
    with get_backend("torch").session(MODEL, 1, 1.0, options) as session:
        return {(phase, b, n): session.measure(StepPoint(phase, b, n)).median_ms
                for phase, (batches, tokens) in GRID.items()
                for b, n in ((batches[0], tokens[0]), (batches[-1], tokens[-1]))}


@pytest.fixture(scope="module")
def fitted(lattice: dict[tuple[Phase, int, int], float]) -> FittedLatencyModel:
    rows = [Measurement(MODEL.profiled_name, "cpu", 1, 1.0, phase, b, n, ms)
            for (phase, b, n), ms in lattice.items()]
    return fit_latency_model(rows, seed=0)


def _predict(fitted: FittedLatencyModel, phase: Phase, batch: object, tokens: object) -> object:
    query = fitted.prefill_ms if phase == "prefill" else fitted.decode_ms
    return query(MODEL.profiled_name, "cpu", 1, 1.0, batch, tokens)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_fitted_curve_keeps_every_clear_order_the_engine_shows(
        lattice: dict[tuple[Phase, int, int], float], fitted: FittedLatencyModel,
        extremes: dict[tuple[Phase, int, int], float], phase: Phase) -> None:
    """Where the engine is monotone (a larger batch or context measured clearly slower), the
    fitted curve is never ordered the other way (ties allowed), and the most work is clearly
    slower than the least; pairs more than 2x apart keep their order whatever
    the cells, unless the slower cell has no more work than the faster one: no larger batch
    and context, or no more tokens in all (batch x context). A monotone curve cannot, and
    should not, follow a measurement that says less work takes longer: on a shared CPU one
    cell's timing can spike (1 x 32 tokens measured 2.4x slower than 4 x 16)."""
    batches, tokens = GRID[phase]
    cells = [(b, n) for b in batches for n in tokens]
    checked, wrong = 0, []
    for p, q in itertools.permutations(cells, 2):
        lo, hi = lattice[(phase, *p)], lattice[(phase, *q)]
        if (q[0] <= p[0] and q[1] <= p[1]) or q[0] * q[1] <= p[0] * p[1]:
            # q has no more work than p: measured slower, it is noise (or a non-monotone
            # engine), which a monotone curve does not follow by design (the test below)
            continue
        dominated = q[0] >= p[0] and q[1] >= p[1]
        if not ((hi > CLEARLY * lo and dominated) or hi > 2 * lo):
            continue
        checked += 1
        # a tie is what a monotone fit makes of measurements that disagree (a noisy cell
        # pooled with its neighbours); a reversal is wrong
        if _predict(fitted, phase, *q) < _predict(fitted, phase, *p):
            wrong.append((p, q, lo, hi, _predict(fitted, phase, *p), _predict(fitted, phase, *q)))
    assert not wrong, wrong
    least, most = (batches[0], tokens[0]), (batches[-1], tokens[-1])
    assert _predict(fitted, phase, *most) > CLEARLY * _predict(fitted, phase, *least)
    # not vacuous: the most work is clearly slower than the least for both phases, and many
    # pairs were checked
    assert extremes[(phase, *most)] > CLEARLY * extremes[(phase, *least)]
    assert checked >= 10, checked


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_fitted_curve_is_non_decreasing_in_batch_and_tokens(fitted: FittedLatencyModel,
                                                            phase: Phase) -> None:
    """Over a dense grid, nodes and between them: never faster with more work."""
    batches, tokens = GRID[phase]
    b = np.geomspace(batches[0], batches[-1], 41)
    n = np.geomspace(tokens[0], tokens[-1], 41)
    grid = np.array([[_predict(fitted, phase, float(x), float(y)) for y in n] for x in b])
    assert np.all(np.isfinite(grid)) and np.all(grid > 0)
    assert np.all(np.diff(grid, axis=0) >= -1e-9 * grid[1:]), "decreases along batch"
    assert np.all(np.diff(grid, axis=1) >= -1e-9 * grid[:, 1:]), "decreases along tokens"
    assert grid[-1, -1] > grid[0, 0]  # and not flat


# ------------------------------------------------------------------ SIGKILL and resume

SWEEP = ("--backend", "torch", "--model", "llama-3-8b", "--scale", "0.0625", "--max-batch", "16",
         "--max-tokens", "256", "--repeats", "1", "--warmup", "2", "--threads", "1",
         "--max-points", "12", "--quiet", "--json")
POINTS = 12
"""--max-points 12 is below the coarse design of two curves (2 x 9): the point set is the
coarse order's, whatever the measured values."""


def _start(store: Path, out: Path) -> subprocess.Popen[bytes]:
    """The sweep as a child in its own process group: stdout to ``out``, stderr beside it."""
    with out.open("wb") as fh, out.with_suffix(".err").open("ab") as err:
        return subprocess.Popen([sys.executable, "-m", "scepsy.cli", "profile", "run", *SWEEP,
                                 "--out", str(store)], stdout=fh, stderr=err,
                                cwd=store.parent, start_new_session=True)


def _lines(store: Path) -> int:
    try:
        return store.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _kill_after(store: Path, log: Path, lines: int) -> int:
    """Run the sweep and SIGKILL its process group once the store holds ``lines`` lines; the
    lines the store held when it died."""
    proc = _start(store, log)
    try:
        deadline = time.monotonic() + 240
        while _lines(store) < lines:
            assert proc.poll() is None, f"the sweep ended before {lines} lines"
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.002)
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL
        return _lines(store)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)


def _complete(store: Path, out: Path) -> dict[str, object]:
    """Run the sweep to its end; its ``--json`` summary."""
    proc = _start(store, out)
    try:
        assert proc.wait(300) == 0, out.with_suffix(".err").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
    return json.loads(out.read_text())


def _lines_of(store: Path) -> list[tuple[tuple[object, ...], str]]:
    """(point key, status) of every line of ``store`` (each must be a whole JSON record)."""
    fields = ("engine", "model", "scale", "device", "tp", "share", "phase", "batch", "tokens")
    lines = store.read_text(encoding="utf-8").splitlines()
    return [(tuple(d[k] for k in fields), d["status"]) for d in map(json.loads, lines)]


def test_sigkilled_sweep_resumes_to_the_points_of_an_uninterrupted_one(tmp_path: Path) -> None:
    killed, whole = tmp_path / "killed" / "s.jsonl", tmp_path / "whole" / "s.jsonl"
    killed.parent.mkdir()
    whole.parent.mkdir()
    first = _kill_after(killed, tmp_path / "run1.out", 3)
    second = _kill_after(killed, tmp_path / "run2.out", 6)
    assert 3 <= first < POINTS and max(first, 6) <= second < POINTS, (first, second)
    summary = _complete(killed, tmp_path / "run3.out")
    note = re.search(r"(\d+) points measured, (\d+) failed in this run, (\d+) already in",
                     str(summary["notes"]))
    assert note is not None, summary
    measured, failed, resumed = map(int, note.groups())
    # every whole line at the kill is a finished point: resumed, never measured again
    assert (failed, resumed, measured) == (0, second, POINTS - second)

    # the uninterrupted run, in this process (one interpreter start less): the same command
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["profile", "run", *SWEEP, "--out", str(whole)]) == 0
    got, want = _lines_of(killed), _lines_of(whole)
    keys = [k for k, _ in got]
    assert len(keys) == len(set(keys)) == POINTS  # every line whole, no point twice
    assert all(status == "ok" for _, status in got + want) and len(want) == POINTS
    assert set(keys) == {k for k, _ in want}
    contents = read_store(killed)
    assert contents.problems == () and len(contents.records) == POINTS
