"""How the many-LLM planner's cost grows with the number of LLMs N: a ladder of sizes, timed by phase.

Every size ``NxGPUS:SECONDS`` of ``--sizes`` is planned for max-throughput with ``--formulation
auto`` (as ``benchmarks/solvers/many_models_bench.py`` does, on
:func:`scepsy_opt.planning.instances.many_models_problem`) once per popularity mix of
``--mixes``: ``copies`` (copies of MuxServe's 16 LLMs, Zipf within each copy) and ``zipf`` (one
Zipf popularity over all N LLMs, the bench's ``--zipf-over-all``). Each run is a forked child
whose time limit starts before the problem is built. Per run it records:

* ``build_s``: building the problem (workflows, demands, capacity shapes, rates);
* ``first_plan_s``: from the start (build included) to the moment the slot-group search first
  holds a solution for every part, a plan placed by construction (its layout follows at the
  end, ``layout_s``); when only the capacity optimum placed a plan, the whole wall time;
* ``wall_s``, ``cpu_s`` and ``peak_rss_mb`` (the child's peak resident set, ``ru_maxrss``;
  ``peak_growth_mb``: above its resident set when forked);
* the phases of the slot-group search (``scepsy_place.formulations.slots.plan_slot_scale``), summed
  over calls: ``shapes_s`` (slot shapes), ``bound_s`` (the proven scale bound), ``partition_s``
  (dealing LLMs and nodes to parts, every part size tried), ``search_s`` (the feasibility
  probes over the parts, ``subs_s`` of it building the parts' sub-problems), ``layout_s`` and
  ``price_s``; ``instrument_s`` is what the recording itself cost (inside ``search_s``);
* ``parts`` (of the plan), ``distinct_parts`` (parts that needed their own probes; equal parts
  reuse a solution), ``gpus_per_part``, ``probes`` and each probe's time (``probe_median_s``,
  ``probe_max_s``: a feasibility solve of one part's slot model), ``status`` and
  ``plan_status``, ``scale``, ``bound`` and ``gap`` (``bound / scale - 1``);
* the 1-minute load average before and after.

Per mix and measure (wall, first plan, build, search, median probe, shapes, bound, partition,
price, peak RSS) the slope of a least-squares line through ``(log N, log value)`` (points with
a positive value; none with fewer than two distinct N) is the exponent ``k`` of
``value ~ N^k``.

Writes ``results/<out>.json``, ``results/<out>.csv`` and ``results/<out>.png`` (wall, first plan
and build time against N on log-log axes, each fit drawn and its slope in the legend; ``--figure
PATH`` writes the figure there too), each atomically, and prints a table and the slopes.

    python benchmarks/solvers/many_models_growth.py                        # the ladder (about 7 minutes)
    python benchmarks/solvers/many_models_growth.py --sizes 8x16:3,16x32:3 --out growth_smoke
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scepsy_common.errors import InputError
from scepsy_common.files import atomic_write_text

DEFAULT_SIZES = "16x32:10,64x128:10,256x512:15,1000x4096:30,4096x65536:120"
MIXES = ("copies", "zipf")
FIT_MEASURES = ("wall_s", "first_plan_s", "build_s", "search_s", "probe_median_s", "shapes_s",
                "bound_s", "partition_s", "price_s", "peak_rss_mb")
PHASES = ("shapes_s", "bound_s", "partition_s", "search_s", "subs_s", "layout_s", "price_s")
CSV_FIELDS = ("mix", "llms", "gpus", "time_limit_s", "status", "plan_status", "formulation",
              "scale", "bound", "gap", "parts", "distinct_parts", "gpus_per_part", "probes",
              "probe_median_s", "probe_max_s", "build_s",
              "first_plan_s", "wall_s", "cpu_s", *PHASES, "instrument_s", "peak_rss_mb",
              "peak_growth_mb", "load1_before", "load1_after")
CHILD_GRACE_S = 120.0  # past twice its limit plus this, a child is stopped and its run reported


@dataclass(frozen=True)
class Size:
    """One rung of the ladder: ``llms`` LLMs on ``gpus`` GPUs within ``limit_s`` seconds."""

    llms: int
    gpus: int
    limit_s: float


@dataclass(frozen=True)
class Fit:
    """``log value = slope · log N + intercept``, least squares over ``points`` points."""

    slope: float
    intercept: float
    points: int


def parse_sizes(text: str) -> list[Size]:
    """``NxGPUS:SECONDS,...`` as sizes (an :class:`InputError` naming ``--sizes`` otherwise)."""
    expected = "comma-separated NxGPUS:SECONDS, e.g. 16x32:10,64x128:10 (N >= 1, GPUS >= 8, " \
               "a multiple of 8, SECONDS > 0)"
    out: list[Size] = []
    for item in text.split(","):
        try:
            dims, secs = item.strip().split(":")
            n, g = (int(x) for x in dims.split("x"))
            limit = float(secs)
        except ValueError:
            raise InputError("--sizes", item, expected, text) from None
        if n < 1 or g < 8 or g % 8 or not (math.isfinite(limit) and limit > 0):
            raise InputError("--sizes", item, expected, text)
        out.append(Size(n, g, limit))
    return out


def parse_mixes(text: str) -> list[str]:
    """``copies``, ``zipf`` or both, comma-separated (an :class:`InputError` otherwise)."""
    mixes = [m.strip() for m in text.split(",")]
    if not mixes or any(m not in MIXES for m in mixes) or len(set(mixes)) != len(mixes):
        raise InputError("--mixes", "", "copies, zipf or copies,zipf", text)
    return mixes


def loglog_fit(xs: Sequence[float], ys: Sequence[float | None]) -> Fit | None:
    """The least-squares line through ``(log x, log y)`` over the points with positive finite
    ``x`` and ``y``; None with fewer than two distinct ``x``."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True)
           if y is not None and x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)]
    if len({p[0] for p in pts}) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
    slope = sxy / sxx
    return Fit(slope, my - slope * mx, len(pts))


def fits(rows: Sequence[dict[str, Any]], mixes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per mix and measure of :data:`FIT_MEASURES`, its :func:`loglog_fit` against N (as a dict,
    or None)."""
    out: dict[str, dict[str, Any]] = {}
    for mix in mixes:
        mine = [r for r in rows if r["mix"] == mix]
        out[mix] = {}
        for k in FIT_MEASURES:
            f = loglog_fit([r["llms"] for r in mine], [r.get(k) for r in mine])
            out[mix][k] = None if f is None else {"slope": f.slope, "intercept": f.intercept,
                                                  "points": f.points}
    return out


# ----------------------------------------------------------------------------- one run (child)

class _Recorder:
    """Seconds per phase and the first moment every part of a search had a solution, recorded
    by wrapping the slot-group search's module-level functions (restored afterwards)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.instrument_s = 0.0
        self.first_plan_s: float | None = None
        self.part_key: dict[frozenset[str], Any] = {}
        self.want: set[Any] = set()
        self.have: set[Any] = set()
        self.distinct_parts: int | None = None
        self.probe_s: list[float] = []  # each feasibility probe's seconds

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[phase] += time.perf_counter() - t
        return run

    def parts_search(self, fn: Callable[..., Any], signature: Callable[..., Any],
                     ) -> Callable[..., Any]:
        def run(problem: Any, topology: Any, parts: Sequence[Any], **k: Any) -> Any:
            t = time.perf_counter()
            self.part_key = {frozenset(p.llms): signature(problem, topology, p) for p in parts}
            self.want, self.have = set(self.part_key.values()), set()
            self.instrument_s += time.perf_counter() - t
            got = fn(problem, topology, parts, **k)
            if got.solution is not None:
                self.distinct_parts = len(self.want)
            return got
        return run

    def probe(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(sub: Any, *a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            sol = fn(sub, *a, **k)
            self.probe_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            if sol.choice and self.first_plan_s is None:
                key = self.part_key.get(frozenset(sub.llms))
                if key is not None:
                    self.have.add(key)
                if self.want and self.have >= self.want:
                    self.first_plan_s = t - self.t0
            self.instrument_s += time.perf_counter() - t
            return sol
        return run


@contextmanager
def _recording(rec: _Recorder) -> Iterator[None]:
    import scepsy_place.formulations.slots as slots

    wrapped = {"slot_shapes": rec.timed("shapes_s", slots.slot_shapes),
               "scale_upper_bound": rec.timed("bound_s", slots.scale_upper_bound),
               "partition": rec.timed("partition_s", slots.partition),
               "solve_parts": rec.timed("search_s", rec.parts_search(slots.solve_parts,
                                                                     slots._signature)),
               "_subs": rec.timed("subs_s", slots._subs),
               "solve_slot_scale": rec.probe(slots.solve_slot_scale),
               "layout": rec.timed("layout_s", slots.layout),
               "price": rec.timed("price_s", slots.price)}
    saved = {name: getattr(slots, name) for name in wrapped}
    for name, fn in wrapped.items():
        setattr(slots, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(slots, name, fn)


def measure(size: Size, mix: str, seed: int) -> dict[str, Any]:
    """One max-throughput run of ``size`` and ``mix``, timed as a whole and by phase."""
    from scepsy_opt.planning.instances import many_models_problem
    from scepsy_opt.planning.problem import Deadline, PlanOptions
    from scepsy_place.formulations.loop import plan_and_place
    from scepsy_place.packing.topology import from_cluster
    from scepsy_profile import roofline_model

    t0, c0 = time.perf_counter(), time.process_time()
    deadline = Deadline.after(size.limit_s)
    rec = _Recorder(t0)
    problem = many_models_problem(size.llms, size.gpus, roofline_model(), seed=seed,
                                  copies=mix == "copies",
                                  options=PlanOptions(objective="max-throughput",
                                                      time_limit_s=size.limit_s))
    build = time.perf_counter() - t0
    with _recording(rec):
        res = plan_and_place(problem, from_cluster(problem.cluster), formulation="auto",
                             deadline=deadline)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = res.plan.stats
    bound = stats.get("scale_bound")
    scale = res.plan.scale if res.placed else 0.0
    first = rec.first_plan_s if rec.first_plan_s is not None else (wall if res.placed else None)
    return {"status": res.status, "plan_status": res.plan.status,
            "formulation": res.formulation, "scale": scale, "bound": bound,
            "gap": (bound / scale - 1) if bound is not None and scale > 0 else None,
            "parts": stats.get("parts"), "distinct_parts": rec.distinct_parts,
            "probes": stats.get("probes"), "build_s": build, "first_plan_s": first,
            "wall_s": wall, "cpu_s": cpu, **rec.seconds, "instrument_s": rec.instrument_s,
            "probe_median_s": statistics.median(rec.probe_s) if rec.probe_s else None,
            "probe_max_s": max(rec.probe_s, default=None),
            "gpus_per_part": size.gpus / stats["parts"] if stats.get("parts") else None}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _child(size: Size, mix: str, seed: int, q: Any) -> None:
    start = _rss_mb()
    try:
        out = measure(size, mix, seed)
    except Exception as e:  # reported in the row, not raised: the ladder carries on
        out = {"status": "error", "error": f"{type(e).__name__}: {e}"}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    out["peak_rss_mb"], out["peak_growth_mb"] = peak, peak - start
    q.put(out)


def isolated(size: Size, mix: str, seed: int) -> dict[str, Any]:
    """:func:`measure` in a forked child (its peak RSS its own), stopped when it overruns."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(size, mix, seed, q))
    p.start()
    try:
        out: dict[str, Any] = q.get(timeout=2 * size.limit_s + CHILD_GRACE_S)
    except Exception:
        p.kill()
        out = {"status": "error", "error": f"no result within {2 * size.limit_s + CHILD_GRACE_S:g} s"}
    p.join()
    return out


# ----------------------------------------------------------------------------- outputs

def _atomic_bytes(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a temporary file beside ``path``, then renamed onto it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r.get(k) is None else r.get(k) for k in CSV_FIELDS})
    return buf.getvalue()


SERIES = (("wall_s", "wall", "o", "-"), ("first_plan_s", "first plan", "s", "--"),
          ("build_s", "build", "^", ":"))


def figure(rows: Sequence[dict[str, Any]], fit: dict[str, dict[str, Any]],
           mixes: Sequence[str], path: Path, title: str) -> None:
    """Wall, first-plan and build time against N on log-log axes, one panel per mix, each
    measure's fitted line drawn and its slope in the legend; the time limits in grey."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(mixes), figsize=(5.2 * len(mixes), 4.2), squeeze=False)
    for ax, mix in zip(axes[0], mixes, strict=True):
        mine = sorted((r for r in rows if r["mix"] == mix), key=lambda r: r["llms"])
        ns = [r["llms"] for r in mine]
        ax.plot(ns, [r["time_limit_s"] for r in mine], color="0.6", lw=1, marker="_",
                label="time limit")
        for (key, label, marker, ls), color in zip(SERIES, ("C0", "C1", "C2"), strict=True):
            pts = [(r["llms"], r[key]) for r in mine if r.get(key) is not None and r[key] > 0]
            f = fit[mix].get(key)
            text = label if f is None else f"{label}: slope {f['slope']:.2f}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, color=color, label=text)
            if f is not None and pts:
                xs = [min(p[0] for p in pts), max(p[0] for p in pts)]
                ax.plot(xs, [math.exp(f["intercept"]) * x ** f["slope"] for x in xs], ls,
                        color=color, lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("LLMs N (GPUs grow with N)")
        ax.set_ylabel("seconds")
        ax.set_title("copies of 16 LLMs" if mix == "copies" else "one Zipf over all N")
        ax.grid(True, which="both", lw=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    _atomic_bytes(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def _fmt(x: Any, spec: str) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = ("| mix | LLMs / GPUs | limit | status | scale | bound | gap | parts (distinct) | "
            "build | shapes | partition | search | probe (median) | first plan | wall | peak RSS | load 1m |")
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    for r in rows:
        lines.append(
            f"| {r['mix']} | {r['llms']:,} / {r['gpus']:,} | {r['time_limit_s']:g} s | "
            f"{r.get('status')} ({r.get('plan_status', '–')}) | {_fmt(r.get('scale'), '.4f')} | "
            f"{_fmt(r.get('bound'), '.4f')} | {_fmt(r.get('gap'), '.2%')} | "
            f"{_fmt(r.get('parts'), 'd')} ({_fmt(r.get('distinct_parts'), 'd')}) | "
            f"{_fmt(r.get('build_s'), '.2f')} s | {_fmt(r.get('shapes_s'), '.2f')} s | "
            f"{_fmt(r.get('partition_s'), '.2f')} s | {_fmt(r.get('search_s'), '.1f')} s | "
            f"{_fmt(r.get('probe_median_s'), '.2f')} s | "
            f"{_fmt(r.get('first_plan_s'), '.1f')} s | {_fmt(r.get('wall_s'), '.1f')} s | "
            f"{_fmt(r.get('peak_rss_mb'), '.0f')} MB | "
            f"{r['load1_before']:.2f}-{r['load1_after']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES,
                    help=f"NxGPUS:SECONDS,... (default {DEFAULT_SIZES})")
    ap.add_argument("--mixes", default="copies,zipf", help="copies, zipf or both")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="many_models_growth", help="results/<out>.{json,csv,png}")
    ap.add_argument("--figure", default=None, help="also write the figure to this path")
    args = ap.parse_args(argv)
    try:
        sizes, mixes = parse_sizes(args.sizes), parse_mixes(args.mixes)
    except InputError as e:
        print(f"many_models_growth: error: {e}", file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    started = datetime.now(UTC).isoformat(timespec="seconds")
    rows: list[dict[str, Any]] = []
    for mix in mixes:
        for s in sizes:
            print(f"{mix}: {s.llms} LLMs / {s.gpus} GPUs within {s.limit_s:g} s ...",
                  file=sys.stderr, flush=True)
            before = os.getloadavg()[0]
            row = {"mix": mix, "llms": s.llms, "gpus": s.gpus, "time_limit_s": s.limit_s,
                   **isolated(s, mix, args.seed)}
            row["load1_before"], row["load1_after"] = before, os.getloadavg()[0]
            rows.append(row)
    fit = fits(rows, mixes)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
    doc = {"command": " ".join(["python", "benchmarks/solvers/many_models_growth.py",
                                *(sys.argv[1:] if argv is None else argv)]),
           "started": started, "finished": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": machine, "python": platform.python_version(), "seed": args.seed,
           "load1_before": load_before, "load1_after": os.getloadavg()[0],
           "sizes": [s.__dict__ for s in sizes], "mixes": mixes, "fit_measures": FIT_MEASURES,
           "rows": rows, "fits": fit}
    base = Path("results") / args.out
    atomic_write_text(base.with_suffix(".json"), json.dumps(doc, indent=1, sort_keys=True))
    atomic_write_text(base.with_suffix(".csv"), to_csv(rows))
    title = f"many-LLM max-throughput, {machine}, {started[:10]}"
    figure(rows, fit, mixes, base.with_suffix(".png"), title)
    if args.figure:
        figure(rows, fit, mixes, Path(args.figure), title)
    print(table(rows))
    for mix in mixes:
        slopes = ", ".join(f"{k} {f['slope']:.3f}" for k, f in fit[mix].items() if f is not None)
        print(f"slopes ({mix}): {slopes}")
    print(f"load average (1 min): {doc['load1_before']:.2f} before, {doc['load1_after']:.2f} after")
    errors = [r for r in rows if r.get("status") == "error"]
    for r in errors:
        print(f"ERROR {r['mix']} {r['llms']}x{r['gpus']}: {r.get('error')}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
