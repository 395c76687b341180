"""The "curves" section of ``scepsy bench paper``: scepsy against the baselines (docs/evaluation.md).

For every cell (workflow, GPU type, cluster size) and every planning method (scepsy: the MILP with
placement, formulation ``auto``; the paper's hierarchical heuristic; independent per-LLM sizing; an
equal split; MuxServe-style greedy co-location; a hand-made user allocation):

1. the method's max-throughput plan on the cluster: its predicted peak (the largest rate it plans
   for, every LLM within ``max_utilisation``) and the simulated saturation rate of that plan
   (:func:`scepsy_opt.prediction.simulate.saturation_search`): the peak the simulator confirms;
2. at a grid of rates (fractions of the largest simulated saturation rate of the methods'
   max-throughput plans), the method's min-latency plan for that rate (the user allocation:
   evaluated as it is), placed on the cluster and simulated.

Every plan is priced by the same predictor (its objective: the sum of the workflows' predicted
mean latencies) and simulated with the same trace, seed and request count, so the methods differ
only in the allocation. A method without a placed plan at a rate has no point there (its status
says why). Cells are independent and seeded: the result does not depend on ``jobs``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS_DIR = REPO / "datasets" / "workflows"
ALLOCATIONS_DIR = REPO / "datasets" / "allocations"

# method -> optimiser name (scepsy_opt.planning.optimisers.OPTIMISERS)
METHODS: Mapping[str, str] = {
    "scepsy": "milp",
    "heuristic": "heuristic",
    "independent": "independent",
    "equal-split": "equal-split",
    "muxserve": "muxserve",
    "user": "user",
}
SATURATION_TOL = 0.05  # relative bracket of the simulated saturation search
# a simulated point is carried when its completions in the measurement window are at least this
# fraction of its arrivals there (the Poisson draw's own rate, not the nominal one: with a few
# hundred arrivals the two differ by several per cent)
STABLE = 0.95
# A run starts empty and fills for a few request latencies; the saturation search judges queue
# growth between its middle and last thirds, so a run whose arrival period is a few latencies
# long reads as unstable at any load (its ceiling is about requests / (3 x latency)). Runs are
# sized to this many predicted request latencies at their rate (saturation searches at the
# predicted peak; rag on 16 H100 GPUs: 54 req/s at 1,000 arrivals, 296 at 16,000, 368 at
# 64,000 against 350 predicted), between Mode.sim_requests and Mode.max_requests.
SATURATION_LATENCIES = 60
POINT_LATENCIES = 20
GPUS_PER_NODE = 8
TPS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Mode:
    """What one run covers and how long its simulations are."""

    workflows: tuple[str, ...]
    sizes: tuple[int, ...]
    gpus: tuple[str, ...]
    fractions: tuple[float, ...]  # rates as fractions of scepsy's predicted peak
    sim_requests: Mapping[str, int]  # the fewest Poisson arrivals per simulation, by workflow
    max_requests: Mapping[str, int]  # the most (runs are sized by :func:`_requests` in between)
    trace_requests: int  # recorded requests per workflow of the trace (statistics and replay)
    time_limit_s: float  # per plan (scepsy_opt.planning.problem.PlanOptions.time_limit_s)


FULL = Mode(workflows=("rag", "beam-search", "rag-beam"), sizes=(4, 8, 16),
            gpus=("A100-80GB", "H100-80GB"), fractions=(0.1, 0.3, 0.5, 0.7, 0.85, 1.0),
            sim_requests={"rag": 1000, "beam-search": 800, "rag-beam": 800},
            max_requests={"rag": 60_000, "beam-search": 8_000, "rag-beam": 12_000},
            trace_requests=400, time_limit_s=20.0)
QUICK = Mode(workflows=("rag",), sizes=(4,), gpus=("A100-80GB", "H100-80GB"), fractions=(0.2, 0.5, 0.8),
             sim_requests={"rag": 300}, max_requests={"rag": 300}, trace_requests=200,
             time_limit_s=30.0)  # its plans take < 1 s; room for a busy CI machine


@dataclass(frozen=True)
class Cell:
    """One workflow on one cluster."""

    workflow: str
    gpu: str
    gpus: int
    seed: int
    mode: Mode

    @property
    def label(self) -> str:
        return f"{self.workflow}/{self.gpu}x{self.gpus}"


def cells(mode: Mode, seed: int) -> list[Cell]:
    """Every cell of ``mode``, in the order of the results."""
    return [Cell(w, g, n, seed, mode) for w in mode.workflows for g in mode.gpus
            for n in mode.sizes]


def user_allocation(workflow: str, gpus: int, gpu: str) -> Any:
    """The hand-made allocation of ``workflow`` on ``gpus`` GPUs
    (datasets/allocations/<workflow>-<gpus>gpu.yaml), moved to GPU type ``gpu``."""
    from scepsy_opt.allocation import Allocation, load_allocation

    alloc = load_allocation(ALLOCATIONS_DIR / f"{workflow}-{gpus}gpu.yaml")
    return Allocation({m: replace(inst, gpu=gpu) for m, inst in alloc.llms.items()})


# --------------------------------------------------------------------------------- one cell


@dataclass(frozen=True)
class _Setup:
    """A cell's problem (targets: 1 req/s in total, split over the workload's weights), the
    cluster it is placed on, the trace the simulations replay and the user allocation."""

    problem: Any
    topology: Any
    trace: Any
    models: Mapping[str, str]
    user: Any
    # simulated figures by (allocation, rates): deterministic runs, so each is run once
    cache: dict = field(default_factory=dict)


def _setup(cell: Cell) -> _Setup:
    """The cell's problem (``scepsy.api.plan_problem``: the bundled catalog, the roofline, the
    TP degrees the workflow's models support), its trace, cluster and user allocation."""
    from scepsy import api
    from scepsy_opt.cluster import uniform_cluster
    from scepsy_opt.workload import as_specs, models_of, workload_trace
    from scepsy_profile.catalog import default_catalog

    path = WORKFLOWS_DIR / f"{cell.workflow}.yaml"
    specs = as_specs(path)
    models = models_of(specs)
    cat = default_catalog()
    tps = tuple(t for t in TPS if any(cat.model(m).supports_tp(t) for m in models.values()))
    trace = workload_trace(specs, requests=cell.mode.trace_requests, seed=cell.seed)
    cluster = uniform_cluster(cell.gpu, cell.gpus, GPUS_PER_NODE, cell.label)
    problem, topology = api.plan_problem(path, cluster, 1.0, trace=trace, seed=cell.seed,
                                         time_limit_s=cell.mode.time_limit_s, tps=tps)
    return _Setup(problem, topology, trace, models, user_allocation(cell.workflow, cell.gpus,
                                                                    cell.gpu))


def _problem(setup: _Setup, method: str, rate: float, objective: str) -> Any:
    """The cell's problem at ``rate`` req/s in total for ``method`` (``user``: with its
    allocation as the current one) and ``objective``."""
    p = setup.problem
    options = replace(p.options, objective=objective,
                      current=setup.user if method == "user" else None)
    return replace(p.scaled(rate), options=options)


def _weighted(values: Mapping[str, float], rates: Mapping[str, float]) -> float:
    """The request-weighted mean of per-workflow values."""
    total = sum(rates.values())
    return sum(values[w] * r for w, r in rates.items()) / total


def _key(alloc: Any, rates: Mapping[str, float]) -> tuple:
    return (tuple(sorted((m, i.gpu, i.tp, i.share, i.replicas, i.memory)
                         for m, i in alloc.llms.items())), tuple(sorted(rates.items())))


def _requests(cell: Cell, rate: float, latency_s: float, latencies: int) -> int:
    """Arrivals of a run at ``rate`` (req/s in total) whose arrival period is ``latencies``
    request latencies (``latency_s``, predicted), within the mode's bounds."""
    lo = cell.mode.sim_requests[cell.workflow]
    hi = cell.mode.max_requests[cell.workflow]
    want = latencies * rate * latency_s
    return lo if not math.isfinite(want) else max(lo, min(hi, math.ceil(want)))


def _simulate(setup: _Setup, cell: Cell, alloc: Any, rates: Mapping[str, float],
              latency_s: float) -> dict:
    """Simulated throughput and request-weighted mean latency (the same allocation at the same
    rates is simulated once per cell: the run is deterministic); ``latency_s``, the predicted
    mean latency there, sizes the run (:func:`_requests`). ``sim_throughput`` is the
    rate times the fraction of the window's arrivals completed in the window (at most 1), so
    that the sampling noise of the arrival draw cancels; the raw figures are kept. An
    allocation the simulator refuses to run has no simulated figures (``sim_refused`` says
    why)."""
    from scepsy_common.errors import InputError
    from scepsy_opt.prediction.simulate import simulate

    key = ("sim", *_key(alloc, rates))
    if key not in setup.cache:
        p = setup.problem
        try:
            n = _requests(cell, sum(rates.values()), latency_s, POINT_LATENCIES)
            res = simulate(setup.trace, setup.models, alloc, p.latency, dict(rates),
                           requests=n, seed=cell.seed, **_policy(p))
        except InputError as exc:  # an instance the simulator cannot run (its KV cache)
            setup.cache[key] = {"sim_throughput": None, "sim_latency_s": None,
                                "stable": False, "sim_refused": str(exc)}
            return setup.cache[key]
        thr = sum(w.throughput for w in res.workflows.values())
        w0, w1 = res.window_s
        arrived = sum(w0 <= r.arrival_s <= w1 for r in res.requests) / (w1 - w0)
        carried = min(1.0, thr / arrived)
        lat = _weighted({w: v.mean_latency_s for w, v in res.workflows.items()}, rates)
        setup.cache[key] = {"sim_throughput": carried * sum(rates.values()),
                            "sim_raw_throughput": thr, "sim_arrival_rate": arrived,
                            "sim_latency_s": lat, "stable": bool(carried >= STABLE)}
    return setup.cache[key]


def _policy(problem: Any) -> dict:
    return {} if problem.policy is None else {"policy": problem.policy}


def _saturation(setup: _Setup, cell: Cell, alloc: Any) -> float | None:
    """The simulated saturation rate (req/s in total) of ``alloc`` at the workload's mix
    (scepsy_opt.prediction.simulate.saturation_search, to 5%; None when no load tried is stable or the
    simulator cannot run an instance), once per allocation and cell."""
    from scepsy_common.errors import InputError
    from scepsy_opt.prediction.simulate import saturation_search

    p = setup.problem
    key = ("saturation", *_key(alloc, p.targets))
    if key not in setup.cache:
        try:
            pred = _predicted(p, alloc)  # sizes the run only: the verdict is the simulator's
            n = _requests(cell, pred["predicted_max_throughput"], pred["predicted_latency_s"],
                          SATURATION_LATENCIES)
            res = saturation_search(setup.trace, setup.models, alloc, p.latency,
                                    dict(p.targets), requests=n,
                                    seed=cell.seed, rel_tol=SATURATION_TOL, **_policy(p))
        except InputError:  # unstable at every load tried, or an instance it cannot run
            setup.cache[key] = None
        else:
            setup.cache[key] = res.total_rate
    return setup.cache[key]


def _predicted(problem: Any, alloc: Any) -> dict:
    """The predictor's figures of ``alloc`` at ``problem``'s targets: throughput (the rate, or
    the maximum throughput when that is lower), maximum throughput, mean latency."""
    from scepsy_opt.prediction.pipeline import predict

    rates = dict(problem.targets)
    pred = predict(problem.stats, problem.models, alloc, problem.latency, rates,
                   catalog=problem.catalog, policy=problem.policy)
    scale = min(p.max_throughput / p.rate for p in pred.workflows.values())
    total = sum(rates.values())
    return {"predicted_max_throughput": scale * total,
            "predicted_throughput": min(total, scale * total),
            "predicted_latency_s": _weighted({w: p.mean_latency_s
                                              for w, p in pred.workflows.items()}, rates)}


def _plan(setup: _Setup, method: str, rate: float, objective: str) -> tuple[Any, Any]:
    """The placed plan of ``method`` at ``rate`` (scepsy_place.formulations.loop.plan_and_place)."""
    from scepsy_place.formulations.loop import plan_and_place
    from scepsy_profile.catalog import catalog_in_force

    problem = _problem(setup, method, rate, objective)
    with catalog_in_force(problem.catalog):
        placed = plan_and_place(problem, setup.topology, name=METHODS[method], formulation="auto")
    return problem, placed


def _record(cell: Cell, setup: _Setup, method: str, problem: Any, placed: Any) -> dict:
    """One evaluated plan: its status and, when placed, its predicted figures at the rate it
    plans for (a max-throughput plan: at the scale it reaches) and simulated ones: a
    min-latency plan simulated at its rate, a max-throughput plan's simulated saturation."""
    plan = placed.answer
    row: dict[str, Any] = {"method": method, "status": plan.status,
                           "placed": bool(placed.placed)}
    if not placed.placed or plan.allocation is None:
        row["reason"] = placed.reason or (plan.infeasible.detail if plan.infeasible else None)
        return row
    alloc = plan.allocation
    at = problem.scaled(plan.scale) if plan.scale != 1.0 else problem
    rates = dict(at.targets)
    pred = _predicted(at, alloc)
    row.update(objective_s=plan.objective_s, gap=placed.gap, rate=sum(rates.values()),
               gpus=round(alloc.gpus(), 6), **pred,
               allocation={m: [i.gpu, i.tp, i.share, i.replicas] for m, i in alloc.llms.items()})
    if problem.options.objective == "max-throughput":
        row["sim_saturation"] = _saturation(setup, cell, alloc)
    else:
        row.update(_simulate(setup, cell, alloc, rates, pred["predicted_latency_s"]))
    return row


def evaluate_cell(cell: Cell) -> dict:
    """Peaks and curve points of every method on ``cell``."""
    setup = _setup(cell)
    methods = list(METHODS)
    peaks = {}
    for m in methods:
        problem, placed = _plan(setup, m, 1.0, "max-throughput")
        peaks[m] = _record(cell, setup, m, problem, placed)
    # the grid: fractions of the largest simulated saturation of any method's max-throughput
    # plan (scepsy's predicted peak when the simulator measured none)
    ref = max((p["sim_saturation"] for p in peaks.values() if p.get("sim_saturation")),
              default=peaks["scepsy"].get("rate"))
    points: list[dict] = []
    for f in cell.mode.fractions if ref else ():
        rate = f * ref
        for m in methods:
            problem, placed = _plan(setup, m, rate, "min-latency")
            points.append({"fraction": f, **_record(cell, setup, m, problem, placed)})
    print(f"curves: {cell.label} done", file=sys.stderr, flush=True)
    return {"cell": cell.label, "workflow": cell.workflow, "gpu": cell.gpu, "gpus": cell.gpus,
            "methods": methods, "peaks": peaks, "points": points, "grid_rate": ref}


def evaluate(mode: Mode, seed: int, jobs: int) -> list[dict]:
    """Every cell of ``mode`` (``jobs`` worker processes; the order and the figures do not
    depend on it)."""
    todo = cells(mode, seed)
    if jobs <= 1 or len(todo) == 1:
        return [evaluate_cell(c) for c in todo]
    with get_context("spawn").Pool(min(jobs, len(todo))) as pool:
        done = pool.map(_evaluate_or_say, todo, chunksize=1)
    for cell, res in zip(todo, done, strict=True):
        if isinstance(res, str):
            raise RuntimeError(f"{cell.label}: {res}")
    return done


def _evaluate_or_say(cell: Cell) -> dict | str:
    """:func:`evaluate_cell`, or the traceback of its failure as text (an exception whose class
    cannot be rebuilt from its pickle would hang the pool)."""
    try:
        return evaluate_cell(cell)
    except Exception:  # reported by the parent, with the cell's name
        import traceback

        return traceback.format_exc()


# ------------------------------------------------------------------------------- summaries


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        return None
    return a / b


def _gmean(xs: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarise(cell: dict) -> list[dict]:
    """Per method of one cell: peak throughput (predicted, simulated) as ratios to scepsy's, and
    its simulated and predicted latency at equal throughput as ratios to scepsy's (geometric
    mean and largest over the rates both carry), and the rates it has no plan for."""
    peaks, pts = cell["peaks"], cell["points"]
    by = {(p["fraction"], p["method"]): p for p in pts}
    ref = peaks["scepsy"]
    rows = []
    for m in cell["methods"]:
        pk = peaks[m]
        sim_peak, ref_sim = pk.get("sim_saturation"), ref.get("sim_saturation")
        sim_r, pred_r, missing = [], [], []
        for f in cell_fractions(cell):
            a, s = by.get((f, m)), by.get((f, "scepsy"))
            if a is None or not a["placed"]:
                missing.append(f)
                continue
            if s is None or not s["placed"]:
                continue
            pred_r.append(a["predicted_latency_s"] / s["predicted_latency_s"])
            if a["stable"] and s["stable"]:
                sim_r.append(a["sim_latency_s"] / s["sim_latency_s"])
        rows.append({"cell": cell["cell"], "method": m, "peak_status": pk["status"],
                     "predicted_peak": pk.get("rate"), "simulated_peak": sim_peak,
                     "peak_confirmed": (None if sim_peak is None else
                                        sim_peak >= (1 - SATURATION_TOL) * pk["rate"]),
                     "peak_ratio": _ratio(pk.get("rate"), ref.get("rate")),
                     "sim_peak_ratio": _ratio(sim_peak, ref_sim),
                     "latency_ratio_gmean": _gmean(sim_r),
                     "latency_ratio_max": max(sim_r) if sim_r else None,
                     "predicted_latency_ratio_gmean": _gmean(pred_r),
                     "no_plan_at": missing})
    return rows


def cell_fractions(cell: dict) -> list[float]:
    """The fractions of the grid an evaluated cell has points at."""
    return sorted({p["fraction"] for p in cell["points"]})


def plans(results: Sequence[dict]) -> list[dict]:
    """Every placed plan evaluated (peaks and curve points), labelled."""
    out = []
    for c in results:
        for m, pk in c["peaks"].items():
            if pk["placed"]:
                out.append({"label": f"{c['cell']}/{m}/peak", "status": pk["status"],
                            "placed": True})
        for p in c["points"]:
            if p["placed"]:
                out.append({"label": f"{c['cell']}/{p['method']}/{p['fraction']:g}",
                            "status": p["status"], "placed": True})
    return out


def missing(results: Sequence[dict]) -> list[dict]:
    """Every (cell, method, rate) without a placed plan, and why."""
    out = []
    for c in results:
        for m, pk in c["peaks"].items():
            if not pk["placed"]:
                out.append({"label": f"{c['cell']}/{m}/peak", "status": pk["status"],
                            "reason": pk.get("reason")})
        for p in c["points"]:
            if not p["placed"]:
                out.append({"label": f"{c['cell']}/{p['method']}/{p['fraction']:g}",
                            "status": p["status"], "reason": p.get("reason")})
    return out


# ---------------------------------------------------------------------------------- figures

COLOURS = {"scepsy": "tab:blue", "heuristic": "tab:orange", "independent": "tab:green",
           "equal-split": "tab:red", "muxserve": "tab:purple", "user": "tab:gray"}


def figures(results: Sequence[dict], out: Path) -> list[str]:
    """One PNG per (workflow, GPU type): simulated mean latency against simulated throughput,
    one line per method, one panel per cluster size; the file names, sorted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    groups: dict[tuple[str, str], list[dict]] = {}
    for c in results:
        groups.setdefault((c["workflow"], c["gpu"]), []).append(c)
    names = []
    for (wf, gpu), cs in sorted(groups.items()):
        cs = sorted(cs, key=lambda c: c["gpus"])
        fig, axes = plt.subplots(1, len(cs), figsize=(4.2 * len(cs), 3.6), squeeze=False)
        for ax, c in zip(axes[0], cs, strict=True):
            for m in c["methods"]:
                pts = sorted((p for p in c["points"] if p["method"] == m and p["placed"]
                              and p["stable"]), key=lambda p: p["rate"])
                if pts:
                    ax.plot([p["sim_throughput"] for p in pts], [p["sim_latency_s"] for p in pts],
                            marker="o", ms=3, label=m, color=COLOURS.get(m))
            ax.set_yscale("log")
            ax.set_title(f"{c['gpus']} x {gpu}")
            ax.set_xlabel("simulated throughput (req/s)")
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel("simulated mean latency (s)")
        methods = list(dict.fromkeys(m for c in cs for m in c["methods"]))
        axes[0][-1].legend([Line2D([], [], color=COLOURS.get(m), marker="o", ms=3)
                            for m in methods], methods, fontsize=7)
        fig.suptitle(f"{wf}: latency vs throughput (points carried in simulation)")
        fig.tight_layout()
        name = f"curves-{wf}-{gpu}.png"
        fig.savefig(out / name, dpi=110, metadata={"Software": None})
        plt.close(fig)
        names.append(name)
    return names
