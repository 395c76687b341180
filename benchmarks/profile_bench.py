"""Real-engine profiling on this machine: torch and vLLM sweeps, a killed sweep, a serving curve.

    python benchmarks/profile_bench.py [--quick] [--only torch,vllm,kill,serve]
                                       [--out results/profile_bench.json]

Four parts (issue 12, "Numbers"), each printing its table; everything goes to ``--out`` (JSON,
rewritten after every part, so a stopped run keeps what it measured), with the machine's facts
(CPU, cores, load average, date, engine versions). The stores and logs stay in ``--workdir``.

* ``torch``: ``run_sweep`` with the torch backend over a fixed list of 30 points of Llama-3-8B at
  1/16 (2 layers, hidden 256), one thread, a fresh store per run; the first run is timed end to
  end (target ≤ 60 s), two more runs give the spread of the per-point medians (per point,
  (max − min) / mean over the runs; target: median ≤ 5 %).
* ``vllm``: TP=1 and TP=2 sweeps of the same model with the vllm backend (``run_sweep`` over
  batches {1, 2, 4, 8, 16, 32} × 3 token counts per phase); ``fit_latency_model`` on every point
  but batch 8, whose points are then predicted (target: |error| ≤ 15 %).
* ``kill``: ``scepsy profile run --backend vllm`` as a subprocess, SIGKILLed three times at
  seeded random moments once its engine measures (the store has grown by 1-3 lines, then a
  random 0-0.5 s), resumed with the same command each time, then run to completion; compared with
  an uninterrupted run of the same command: same point keys, none twice, no bad line, and no
  engine process of a killed run left behind. ``--target-error 0.99 --max-points 18`` make the
  point set the planner's coarse design (9 points per curve), independent of the measured values.
* ``serve``: ``measure_serving_curve`` on ``vllm serve`` (input 128, output 32 tokens, constant;
  max_num_seqs 32; 1 GiB KV; the engine on one core) and ``compare_with_step_profile`` against
  the vllm TP=1 step profile of the same model and core (the ``vllm`` part's store when it ran,
  else a small sweep): saturation throughput (target ≤ 15 %), mean latency at 30/60/90 % of
  saturation (target ≤ 25 %), the per-term breakdown and the verdict.

``--quick`` shrinks every part (a smoke run: fewer points, one kill, a short rate sweep).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import REPO, pct, progress, table
from scepsy_profile.fitted import fit_latency_model
from scepsy_profile.profiling.backend import BackendOptions, StepPoint
from scepsy_profile.profiling.models import EngineModel, engine_model
from scepsy_profile.profiling.planner import SweepPoint, SweepSpec
from scepsy_profile.profiling.records import ProfileRecord
from scepsy_profile.profiling.registry import get_backend
from scepsy_profile.profiling.store import read_store, store_measurements
from scepsy_profile.profiling.sweep import SweepResult, run_sweep

PARTS = ("torch", "vllm", "kill", "serve")
MODEL, SCALE = "llama-3-8b", 1 / 16
HOLD_OUT_BATCH = 8
KILL_MAX_POINTS = 18  # the planner's coarse design: 9 points per curve, 2 curves


# -- small helpers ------------------------------------------------------------------------------

def load1() -> float:
    return os.getloadavg()[0]


def fixed_points(tp: int, prefill: Sequence[tuple[int, int]],
                 decode: Sequence[tuple[int, int]]) -> list[SweepPoint]:
    """(batch, tokens) cells of each phase as sweep points of instance (tp, share 1)."""
    return ([SweepPoint(tp, 1.0, StepPoint("prefill", b, t)) for b, t in prefill]
            + [SweepPoint(tp, 1.0, StepPoint("decode", b, t)) for b, t in decode])


def fixed_planner(points: Sequence[SweepPoint]) -> Callable[..., list[SweepPoint]]:
    """A ``next_points`` for :func:`run_sweep` that asks for exactly ``points`` (those not yet in
    the store), so that every run measures the same list."""
    def next_points(spec: Any, done: Sequence[ProfileRecord], *,
                    budget_points: int) -> list[SweepPoint]:
        have = {(r.tp, r.phase, r.batch, r.tokens) for r in done}
        todo = [p for p in points if (p.tp, p.step.phase, p.step.batch, p.step.tokens) not in have]
        return todo[:budget_points]
    return next_points


def grid(batches: Sequence[int], tokens: Sequence[int]) -> list[tuple[int, int]]:
    return [(b, t) for t in tokens for b in batches]


def sweep_fixed(backend_name: str, model: EngineModel, points: Sequence[SweepPoint],
                store: Path, options: BackendOptions) -> SweepResult:
    tps = tuple(sorted({p.tp for p in points}))
    spec = SweepSpec(tps=tps, shares=(1.0,))
    return run_sweep(get_backend(backend_name), model, spec, store, options,
                     next_points=fixed_planner(points), round_points=len(points))


def machine_facts() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts: dict[str, Any] = {
        "cpu": cpu, "cores": os.cpu_count(), "load_avg_at_start": list(os.getloadavg()),
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(), "platform": platform.platform(),
    }
    try:
        import torch
        facts["torch"] = torch.__version__
    except ImportError:
        facts["torch"] = None
    vllm = get_backend("vllm")
    facts["vllm"] = vllm.version() if vllm.unavailable() is None else None
    return facts


# -- part 1: torch ------------------------------------------------------------------------------

def part_torch(work: Path, quick: bool, clock: str = "wall") -> dict[str, Any]:
    model = engine_model(MODEL, SCALE)
    if quick:
        pts = fixed_points(1, grid((1, 4), (32, 128)), grid((1, 16), (128, 512)))
    else:
        pts = fixed_points(1, grid((1, 2, 4, 8, 16), (32, 128, 512)),
                           grid((1, 4, 16, 32, 64), (128, 512, 2048)))
    options = BackendOptions(threads=1, extra=(("clock", clock),))
    runs: list[dict[tuple[str, int, int], float]] = []
    walls: list[float] = []
    for i in range(3):
        store = work / f"torch-run{i}.jsonl"
        store.unlink(missing_ok=True)
        progress(f"torch: run {i + 1}/3, {len(pts)} points (load {load1():.2f})")
        t0 = time.perf_counter()
        res = sweep_fixed("torch", model, pts, store, options)
        walls.append(time.perf_counter() - t0)
        if res.failed or len(res.ok) != len(pts):
            raise SystemExit(f"torch run {i}: {len(res.ok)} ok of {len(pts)}; failed: "
                             f"{[r.error for r in res.failed]}")
        runs.append({(r.phase, r.batch, r.tokens): float(r.latency_ms or 0.0) for r in res.ok})
    keys = list(runs[0])
    spread = {k: (max(r[k] for r in runs) - min(r[k] for r in runs))
              / statistics.fmean(r[k] for r in runs) for k in keys}
    pairs = {f"{i}-{j}": [abs(runs[i][k] - runs[j][k]) / ((runs[i][k] + runs[j][k]) / 2)
                          for k in keys] for i in range(3) for j in range(i + 1, 3)}
    rows = [{"phase": k[0], "batch": k[1], "tokens": k[2],
             **{f"run{i + 1} ms": round(r[k], 3) for i, r in enumerate(runs)},
             "spread": pct(spread[k])} for k in keys]
    print(f"\n== torch: {len(pts)} points, {model.profiled_name}, threads 1, {clock} clock ==")
    print(table(rows, list(rows[0])))
    s = sorted(spread.values())
    summary = {
        "points": len(pts), "clock": clock, "wall_s": walls, "first_run_s": walls[0],
        "spread_median": statistics.median(s), "spread_max": s[-1],
        "spread_over_5pct": sum(x > 0.05 for x in s),
        "pairwise_median": {k: statistics.median(v) for k, v in pairs.items()},
        "pairwise_max": {k: max(v) for k, v in pairs.items()},
        "targets": {"first_run_s": 60.0, "spread_median": 0.05},
        "per_point": [{"phase": k[0], "batch": k[1], "tokens": k[2],
                       "ms": [r[k] for r in runs], "spread": spread[k]} for k in keys],
    }
    print(table([{"run": i + 1, "wall s": round(w, 1)} for i, w in enumerate(walls)],
                ["run", "wall s"]))
    print(f"spread of medians over 3 runs: median {pct(summary['spread_median'])}, "
          f"max {pct(s[-1])} ({summary['spread_over_5pct']} of {len(s)} points over 5%); "
          f"pairwise medians " + ", ".join(f"{k}: {pct(v)}"
                                           for k, v in summary["pairwise_median"].items()))
    return summary


# -- part 2: vllm sweeps, fit, held-out batch ---------------------------------------------------

@dataclass(frozen=True, slots=True)
class VllmGrid:
    batches: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    decode_tokens: tuple[int, ...]
    max_tokens: int


FULL_GRID = VllmGrid((1, 2, 4, 8, 16, 32), (64, 256, 512), (128, 512, 1024), 1024)
QUICK_GRID = VllmGrid((1, 4, 8, 16), (64, 256), (128, 512), 512)


def vllm_options(tp: int, g: VllmGrid) -> BackendOptions:
    return BackendOptions(repeats=5, warmup=1, point_timeout_s=600, memory_gib=1.0,
                          threads=1 if tp == 1 else None,
                          extra=(("max_tokens", str(g.max_tokens)),
                                 ("max_batch", str(max(g.batches)))))


def vllm_sweep(tp: int, g: VllmGrid, store: Path) -> tuple[SweepResult, float]:
    model = engine_model(MODEL, SCALE)
    pts = fixed_points(tp, grid(g.batches, g.prefill_tokens), grid(g.batches, g.decode_tokens))
    store.unlink(missing_ok=True)
    progress(f"vllm: TP={tp}, {len(pts)} points (load {load1():.2f})")
    t0 = time.perf_counter()
    res = sweep_fixed("vllm", model, pts, store, vllm_options(tp, g))
    return res, time.perf_counter() - t0


def held_out_errors(store: Path, hold: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Fit every ok point but batch ``hold``; the errors at batch ``hold``."""
    contents = read_store(store)
    rows, _ = store_measurements(contents)
    train = [m for m in rows if m.batch != hold]
    test = [m for m in rows if m.batch == hold]
    fm = fit_latency_model(train, source=str(store))
    out = []
    for m in test:
        f = fm.prefill_ms if m.phase == "prefill" else fm.decode_ms
        pred = float(f(m.model, m.gpu, m.tp, m.share, m.batch, m.tokens))
        out.append({"tp": m.tp, "phase": m.phase, "batch": m.batch, "tokens": m.tokens,
                    "measured_ms": m.latency_ms, "predicted_ms": pred,
                    "error": pred / m.latency_ms - 1.0})
    per_phase = {}
    for ph in ("prefill", "decode"):
        es = [abs(r["error"]) for r in out if r["phase"] == ph]
        per_phase[ph] = {"n": len(es), "mean_abs": statistics.fmean(es) if es else None,
                         "max_abs": max(es) if es else None}
    return out, per_phase


def part_vllm(work: Path, quick: bool) -> dict[str, Any]:
    g = QUICK_GRID if quick else FULL_GRID
    summary: dict[str, Any] = {"grid": asdict(g), "hold_out_batch": HOLD_OUT_BATCH, "tp": {}}
    rows, err_rows = [], []
    for tp in (1, 2):
        store = work / f"vllm-tp{tp}.jsonl"
        res, wall = vllm_sweep(tp, g, store)
        errs, per_phase = held_out_errors(store, HOLD_OUT_BATCH) if res.ok else ([], {})
        detail = res.ok[0].device_detail if res.ok else {}
        summary["tp"][str(tp)] = {
            "store": str(store), "wall_s": wall, "ok": len(res.ok), "failed": len(res.failed),
            "failed_errors": [r.error for r in res.failed], "skipped": [s.reason for s in
                                                                        res.skipped],
            "measure_s": sum(r.elapsed_s for r in res.records), "bind": detail.get("bind"),
            "held_out": errs, "held_out_error": per_phase,
            "points": [{"phase": r.phase, "batch": r.batch, "tokens": r.tokens,
                        "latency_ms": r.latency_ms, "iqr_ms": r.iqr_ms, "status": r.status}
                       for r in res.records]}
        rows.append({"tp": tp, "points ok": len(res.ok), "failed": len(res.failed),
                     "bind": detail.get("bind"), "wall s": round(wall, 1),
                     "measuring s": round(sum(r.elapsed_s for r in res.records), 1),
                     **{f"{ph} mean|max err": (f"{pct(v['mean_abs'])} | {pct(v['max_abs'])}"
                                              if v["n"] else "-")
                        for ph, v in per_phase.items()}})
        err_rows.extend({"tp": tp, "phase": e["phase"], "batch": e["batch"],
                         "tokens": e["tokens"], "measured ms": round(e["measured_ms"], 3),
                         "predicted ms": round(e["predicted_ms"], 3),
                         "error": f"{100 * e['error']:+.1f}%"} for e in errs)
    print(f"\n== vllm: {MODEL}:x{SCALE:g}, batches {list(g.batches)}, held-out batch "
          f"{HOLD_OUT_BATCH} (fit without it) ==")
    print(table(rows, list(rows[0])))
    if err_rows:
        print(table(err_rows, list(err_rows[0])))
    return summary


# -- part 3: SIGKILL and resume -------------------------------------------------------------------

def kill_command(store: Path, quick: bool) -> list[str]:
    max_points = 10 if quick else KILL_MAX_POINTS
    return [sys.executable, "-m", "scepsy.cli", "profile", "run", "--backend", "vllm",
            "--model", MODEL, "--scale", "0.0625", "--tp", "1", "--max-batch", "8",
            "--min-tokens", "16", "--max-tokens", "128", "--target-error", "0.99",
            "--max-points", str(max_points), "--repeats", "3", "--warmup", "1",
            "--threads", "1", "--kv-gib", "1", "--engine-option", "max_tokens=256",
            "--engine-option", "max_batch=8", "--quiet", "--out", str(store)]


def line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pids: set[int]) -> set[int]:
    out = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.add(p)
    return out


def start_cli(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO)


def end_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_to_end(cmd: list[str], log: Path, env: dict[str, str], timeout_s: float) -> int:
    proc = start_cli(cmd, log, env)
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        end_group(proc)


def killed_run(cmd: list[str], store: Path, log: Path, env: dict[str, str], rng: random.Random,
               timeout_s: float) -> dict[str, Any]:
    """Start ``cmd``, SIGKILL it once the store grew by 1-3 lines plus 0-0.5 s; what was seen."""
    before = line_count(store)
    grow, delay = rng.randint(1, 3), rng.uniform(0.0, 0.5)
    proc = start_cli(cmd, log, env)
    t0 = time.monotonic()
    engine: set[int] = set()
    try:
        while proc.poll() is None and line_count(store) < before + grow:
            if time.monotonic() - t0 > timeout_s:
                raise SystemExit(f"kill: the sweep did not grow its store in {timeout_s} s "
                                 f"(log {log})")
            engine |= descendants(proc.pid)
            time.sleep(0.05)
        time.sleep(delay)
        engine |= descendants(proc.pid)
        finished_alone = proc.poll() is not None
        if not finished_alone:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        t_kill = time.monotonic()
        left = alive(engine)
        while left and time.monotonic() - t_kill < 60:
            time.sleep(0.2)
            left = alive(left)
        return {"lines_before": before, "grow": grow, "delay_s": round(delay, 3),
                "lines_at_kill": line_count(store), "returncode": proc.returncode,
                "finished_before_kill": finished_alone, "engine_processes": len(engine),
                "orphans_after_60s": sorted(left),
                "engine_gone_after_s": round(time.monotonic() - t_kill, 2)}
    finally:
        end_group(proc)


def store_keys(store: Path) -> tuple[list[tuple[Any, ...]], list[tuple[int, str]], int]:
    """Point keys of every line (duplicates kept), the bad lines, and the ok records."""
    keys = []
    for raw in store.read_bytes().splitlines():
        try:
            d = json.loads(raw)
            keys.append((d["tp"], d["share"], d["phase"], d["batch"], d["tokens"]))
        except (ValueError, KeyError):
            continue
    contents = read_store(store)
    return keys, list(contents.problems), sum(r.status == "ok" for r in contents.records)


def worker_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "_vllm_worker"], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def part_kill(work: Path, quick: bool) -> dict[str, Any]:
    ref, killed = work / "kill-reference.jsonl", work / "kill-killed.jsonl"
    for p in (ref, killed):
        p.unlink(missing_ok=True)
    tmp = work / "kill-tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp)}
    timeout = 900.0
    rng = random.Random(12)
    kills = 1 if quick else 3
    workers_before = worker_pids()
    progress(f"kill: reference run (load {load1():.2f})")
    t0 = time.perf_counter()
    rc_ref = run_to_end(kill_command(ref, quick), work / "kill-reference.log", env, timeout)
    ref_s = time.perf_counter() - t0
    events = []
    t0 = time.perf_counter()
    for i in range(kills):
        progress(f"kill: run {i + 1}, killed (load {load1():.2f})")
        events.append(killed_run(kill_command(killed, quick), killed, work / "kill-killed.log",
                                 env, rng, timeout))
    progress("kill: resumed to the end")
    rc_final = run_to_end(kill_command(killed, quick), work / "kill-killed.log", env, timeout)
    killed_s = time.perf_counter() - t0
    ref_keys, ref_bad, ref_ok = store_keys(ref)
    k_keys, k_bad, k_ok = store_keys(killed)
    dupes = len(k_keys) - len(set(k_keys))
    same = set(ref_keys) == set(k_keys)
    workers_after = worker_pids()
    summary = {
        "command": " ".join(kill_command(killed, quick)[1:]).replace("-m scepsy.cli", "scepsy"),
        "reference": {"returncode": rc_ref, "lines": len(ref_keys), "ok": ref_ok,
                      "problems": ref_bad, "wall_s": ref_s},
        "killed": {"returncode_final": rc_final, "lines": len(k_keys), "ok": k_ok,
                   "problems": k_bad, "duplicates": dupes, "wall_s": killed_s},
        "kills": events, "same_point_set": same,
        "missing": sorted(map(list, set(ref_keys) - set(k_keys))),
        "extra": sorted(map(list, set(k_keys) - set(ref_keys))),
        "orphans": sorted({p for e in events for p in e["orphans_after_60s"]}),
        "vllm_workers_before": workers_before, "vllm_workers_after": workers_after,
        "store_warnings_in_log": [ln for ln in (work / "kill-killed.log").read_text(
            errors="replace").splitlines() if "cut off" in ln],
    }
    summary["pass"] = bool(same and dupes == 0 and not k_bad and not ref_bad
                           and not summary["orphans"] and rc_ref == 0 and rc_final == 0
                           and all(not e["finished_before_kill"] for e in events)
                           and not (set(workers_after) - set(workers_before)))
    print(f"\n== kill: vLLM sweep SIGKILLed {kills}x, resumed, vs uninterrupted ==")
    print(table([{"kill": i + 1, "lines before": e["lines_before"], "+lines": e["grow"],
                  "+delay s": e["delay_s"], "lines at kill": e["lines_at_kill"],
                  "rc": e["returncode"], "engine procs": e["engine_processes"],
                  "gone after s": e["engine_gone_after_s"],
                  "orphans": len(e["orphans_after_60s"])} for i, e in enumerate(events)],
                ["kill", "lines before", "+lines", "+delay s", "lines at kill", "rc",
                 "engine procs", "gone after s", "orphans"]))
    print(table([{"store": "uninterrupted", "lines": len(ref_keys), "distinct": len(set(ref_keys)),
                  "ok": ref_ok, "bad lines": len(ref_bad), "wall s": round(ref_s, 1)},
                 {"store": f"killed {kills}x", "lines": len(k_keys), "distinct": len(set(k_keys)),
                  "ok": k_ok, "bad lines": len(k_bad), "wall s": round(killed_s, 1)}],
                ["store", "lines", "distinct", "ok", "bad lines", "wall s"]))
    print(f"same point set: {same}; duplicates: {dupes}; orphans: {len(summary['orphans'])}; "
          f"_vllm_worker processes before/after: {len(workers_before)}/{len(workers_after)}; "
          f"pass: {summary['pass']}")
    return summary


# -- part 4: serving curve ----------------------------------------------------------------------

def part_serve(work: Path, quick: bool, step_store: Path | None) -> dict[str, Any]:
    from scepsy_profile.profiling.replay import LengthDist, ReplayTimeouts
    from scepsy_profile.profiling.servecurve import (
        SweepPlan,
        compare_with_step_profile,
        measure_serving_curve,
    )
    from scepsy_profile.profiling.server import ServerConfig

    model = engine_model(MODEL, SCALE)
    step_s = 0.0
    if step_store is None or not step_store.exists():
        g = VllmGrid((1, 2, 4, 8, 16, 32), (64, 128, 256), (128, 192), 512)
        if quick:
            g = VllmGrid((1, 4, 16, 32), (64, 128), (128, 192), 512)
        step_store = work / "serve-step-tp1.jsonl"
        res, step_s = vllm_sweep(1, g, step_store)
        if not res.ok:
            raise SystemExit(f"serve: the step profile failed: {[r.error for r in res.failed]}")
    config = ServerConfig(model=model, kv_gib=1.0, max_num_seqs=32, max_model_len=512, threads=1)
    if quick:
        plan = SweepPlan(start_rate=8.0, factor=2.0, max_rates=4, calls_per_rate=30,
                         min_duration_s=4.0, warmup_calls=3, refine_steps=1,
                         timeouts=ReplayTimeouts(stall_s=60, call_s=300))
    else:
        plan = SweepPlan(start_rate=2.0, factor=1.5, max_rates=12, calls_per_rate=60,
                         min_duration_s=15.0, warmup_calls=5, refine_steps=2,
                         timeouts=ReplayTimeouts(stall_s=60, call_s=300))

    def show(p: Any) -> None:
        progress(f"serve: rate {p.rate:.3g}/s achieved {p.achieved_rate:.3g}/s "
                 f"e2e {p.latency('e2e')} {p.reason}")

    progress(f"serve: vllm serve, rates from {plan.start_rate}/s (load {load1():.2f})")
    t0 = time.perf_counter()
    vllm_version = get_backend("vllm").version()
    result = measure_serving_curve(config, LengthDist.constant(128), LengthDist.constant(32),
                                   work / "serve", plan, seed=11,
                                   out=work / "serve.serve-curve.json",
                                   engine_version=vllm_version, progress=show)
    curve_s = time.perf_counter() - t0
    rows, _ = store_measurements(read_store(step_store))
    cmp = compare_with_step_profile(result, fit_latency_model(rows, source=str(step_store)))
    print(f"\n== serve: vllm serve, {model.profiled_name}, input 128 / output 32, "
          "max_num_seqs 32, KV 1 GiB, 1 core ==")
    print(table([{"offered /s": round(p.offered_rate, 2), "achieved /s": round(p.achieved_rate, 2),
                  "e2e s": _r(p.latency("e2e")), "ttft s": _r(p.latency("ttft")),
                  "itl ms": _r(1e3 * (p.latency("itl") or 0)), "queue ms":
                  _r(1e3 * (p.latency("queue") or 0)), "running": _r(p.mean_running),
                  "saturated": p.saturated} for p in result.points_by_rate],
                ["offered /s", "achieved /s", "e2e s", "ttft s", "itl ms", "queue ms",
                 "running", "saturated"]))
    print(f"saturation: measured {cmp.measured_mu:.3g} calls/s, derived {cmp.predicted_mu:.3g} "
          f"({100 * cmp.mu_error:+.1f}%; target ±15%)")
    print(table([{"load": f"{x.fraction:.0%}", "rate /s": round(x.rate, 2),
                  "measured s": _r(x.measured_latency_s), "derived s": _r(x.predicted_latency_s),
                  "error": _sp(x.latency_error), "batch meas": _r(x.measured_batch),
                  "batch derived": _r(x.predicted_batch),
                  "tpot meas ms": _r(x.measured_tpot_s and 1e3 * x.measured_tpot_s),
                  "tpot derived ms": _r(x.predicted_tpot_s and 1e3 * x.predicted_tpot_s)}
                 for x in cmp.loads],
                ["load", "rate /s", "measured s", "derived s", "error", "batch meas",
                 "batch derived", "tpot meas ms", "tpot derived ms"]))
    print(table([{"term": k, "measured": _r(v["measured"]), "derived": _r(v["predicted"]),
                  "error": _sp(v["error"])} for k, v in cmp.terms.items()],
                ["term", "measured", "derived", "error"]))
    print(f"verdict: {cmp.verdict}")
    return {"step_store": str(step_store), "step_profile_s": step_s, "curve_s": curve_s,
            "curve_file": str(work / "serve.serve-curve.json"), "stop_reason": result.stop_reason,
            "plan": {"start_rate": plan.start_rate, "factor": plan.factor,
                     "calls_per_rate": plan.calls_per_rate, "min_duration_s": plan.min_duration_s,
                     "refine_steps": plan.refine_steps},
            "points": [p.to_json() for p in result.points_by_rate],
            "comparison": cmp.to_json(),
            "targets": {"mu_error": 0.15, "latency_error": 0.25}}


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def _sp(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


# -- main ----------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: every part shrunk")
    ap.add_argument("--torch-clock", choices=("wall", "cpu"), default="wall",
                    help="torch part: wall-clock or process CPU time (one thread)")
    ap.add_argument("--only", default=",".join(PARTS), help="comma-separated parts of "
                    f"{', '.join(PARTS)} (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "profile_bench.json")
    ap.add_argument("--workdir", type=Path, help="stores and logs (default: a new folder "
                    "under /tmp, kept)")
    args = ap.parse_args()
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    if not parts or any(p not in PARTS for p in parts):
        ap.error(f"--only: expected parts of {', '.join(PARTS)} (got {args.only!r})")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="profile-bench-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CACHE_ROOT", str(work / "vllm-cache"))
    payload: dict[str, Any] = {"machine": machine_facts(), "quick": args.quick,
                               "command": " ".join(["python", "benchmarks/profile_bench.py",
                                                    *sys.argv[1:]]),
                               "workdir": str(work), "parts": {}}
    progress(f"profile_bench: parts {parts}, workdir {work}, machine {payload['machine']}")

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")

    t_all = time.perf_counter()
    for part in parts:
        t0 = time.perf_counter()
        load0 = load1()
        try:
            if part == "torch":
                res = part_torch(work, args.quick, args.torch_clock)
            elif part == "vllm":
                res = part_vllm(work, args.quick)
            elif part == "kill":
                res = part_kill(work, args.quick)
            else:
                step = work / "vllm-tp1.jsonl" if "vllm" in parts else None
                res = part_serve(work, args.quick, step)
        except Exception as exc:  # a part that breaks is recorded; the others still run
            res = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"\n== {part}: FAILED: {res['error']} ==")
        res["load_at_start"] = load0
        res["load_at_end"] = load1()
        res["part_s"] = time.perf_counter() - t0
        payload["parts"][part] = res
        payload["total_s"] = time.perf_counter() - t_all
        save()
    print(f"\ntotal {payload['total_s']:.0f} s; load average now {os.getloadavg()}; "
          f"results: {args.out}; stores and logs: {work}")


if __name__ == "__main__":
    main()
