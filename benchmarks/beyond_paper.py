"""Beyond the paper: a 1,024-GPU heterogeneous fleet serving ten workflows, re-planned live.

The fleet (``datasets/clusters/fleet-1024.yaml``: eight racks of sixteen 8-GPU nodes, H100-80GB,
A100-80GB and L4) serves the ten workflows of ``datasets/workloads/fleet-10.yaml`` (ten LLMs,
several shared between workflows). scepsy plans it (``scepsy.api.plan``, formulation ``auto``),
then three events arrive one after the other, each re-planned around what runs
(``scepsy_place.formulations.incremental.replan``, change penalty and move cost 1 s):

1. a load change: two workflows' targets double, one's halves;
2. a node failure: the node running the most LLMs (then the most replicas);
3. a rack drain (maintenance): an A100 rack (``--quick``: the L4 rack).

The load change is also re-planned with lower change penalties (0.1 s and 0), to show what
stability costs and buys.
For each event: replicas lost, kept, moved, started and stopped, the GPUs touched, each
workflow's predicted mean latency before and after, and the latency of the plan made from
scratch for the same targets and nodes (the ideal: what stability costs), with the plan times.
Each plan that runs (the first, and the one after each event) is also simulated (the
discrete-event simulator, Poisson arrivals at the targets) and its latencies set against the
predicted ones.
``--quick`` runs the same steps on 96 GPUs and four workflows.

    python benchmarks/beyond_paper.py [--quick] [--seed N] [--out DIR]

writes ``DIR/beyond_paper.png`` (default ``results/``) and ``results/beyond_paper.json``;
``scepsy bench paper --sections beyond`` calls :func:`run`.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, RESULTS, progress, table, write_results

if TYPE_CHECKING:
    from scepsy_opt.allocation import Instance
    from scepsy_opt.planning.problem import PlanningProblem
    from scepsy_opt.traces import Trace
    from scepsy_place.formulations.incremental import Replan
    from scepsy_place.formulations.placed import PlacedPlan
    from scepsy_place.packing.topology import Topology

T = TypeVar("T")

MOVE_COST_S = 1.0  # objective seconds per replica moved
CHANGE_PENALTY_S = 1.0  # objective seconds per replica started or stopped
LOW_PENALTIES_S = (0.1, 0.0)  # the first event re-planned again with these change penalties
TIMING_KEYS = frozenset({"seconds", "cpu_s", "total_s", "total_cpu_s"})
"""Keys of the section's dict that hold wall-clock or CPU times (all else is deterministic)."""


@dataclass(frozen=True)
class Step:
    """One event of the scenario: its label and ``scepsy replan`` specs; ``{busiest}`` in a
    spec stands for :func:`busiest_node` of the plan running when the event arrives."""

    label: str
    specs: tuple[str, ...]


@dataclass(frozen=True)
class Scenario:
    """A fleet, its workload and total target (req/s, split over the workload's weights), the
    trace size, the time limit of one plan, the events in order, and the arrivals of each
    simulation (of the first plan and of the plan after each event)."""

    name: str
    workload: Path
    cluster: Path
    total_rps: float
    trace_requests: int
    time_limit_s: float
    steps: tuple[Step, ...]
    sim_requests: int


FULL = Scenario(
    "fleet-1024", REPO / "datasets/workloads/fleet-10.yaml",
    REPO / "datasets/clusters/fleet-1024.yaml", 250.0, 300, 120.0,
    (Step("load change", ("load=rag*2", "load=chat_llama_70b*2", "load=summarise_32b*0.5")),
     Step("node failure", ("node-failed={busiest}",)),
     Step("rack drain", ("rack-drained=rack-a100-c",))), 20_000)
QUICK = Scenario(
    "fleet-96", REPO / "datasets/workloads/fleet-4.yaml",
    REPO / "datasets/clusters/fleet-96.yaml", 8.0, 100, 60.0,
    (Step("load change", ("load=rag*2", "load=chat_llama_70b*2", "load=beam_search*0.5")),
     Step("node failure", ("node-failed={busiest}",)),
     Step("rack drain", ("rack-drained=rack-l4",))), 2_000)


@dataclass(frozen=True)
class State:
    """What runs: the problem and topology it was planned for and its placed plan."""

    label: str
    problem: PlanningProblem
    topology: Topology
    placed: PlacedPlan


@dataclass(frozen=True)
class Timed:
    """A result with the wall and CPU seconds it took."""

    value: Any
    seconds: float
    cpu_s: float


def timed(fn: Callable[[], T]) -> Timed:
    """Call ``fn`` and time it (wall clock and this process's CPU time)."""
    w0, c0 = time.perf_counter(), time.process_time()
    value = fn()
    return Timed(value, time.perf_counter() - w0, time.process_time() - c0)


# ------------------------------------------------------------------------------ measures


def latencies(state: State) -> dict[str, float]:
    """Each workflow's predicted mean latency (s) under the state's plan at its targets."""
    from scepsy_opt.planning.plans import workflow_latencies

    return {w: round(x, 6) for w, x in workflow_latencies(state.problem, state.placed.plan).items()}


def plan_row(label: str, placed: PlacedPlan, t: Timed) -> dict[str, Any]:
    """One entry of the section's ``plans``: status, formulation, objective, bound, gap, size."""
    pl = placed.placement
    ok = bool(placed.placed)
    return {"label": label, "status": str(placed.status), "placed": ok,
            "formulation": placed.formulation,
            "objective_s": round(placed.plan.objective_s, 6) if ok else None,
            "bound_s": None if placed.bound_s is None else round(placed.bound_s, 6),
            "gap": None if placed.gap is None else round(placed.gap, 6),
            "gpus_used": pl.gpus_used() if ok else 0,
            "replicas": len(pl.slots) if ok else 0,
            "seconds": round(t.seconds, 2), "cpu_s": round(t.cpu_s, 2)}


def busiest_node(placed: PlacedPlan) -> str:
    """The node whose failure hits the most: the one running the most LLMs, then the most
    replicas (ties: the first name in sorted order)."""
    llms: dict[str, set[str]] = {}
    reps: dict[str, int] = {}
    for s in placed.placement.slots:
        llms.setdefault(s.node, set()).add(s.llm)
        reps[s.node] = reps.get(s.node, 0) + 1
    return max(sorted(reps), key=lambda n: (len(llms[n]), reps[n]))


def per_node(placed: PlacedPlan) -> dict[str, int]:
    """Replicas running on each node (nodes in sorted order)."""
    on: dict[str, int] = {}
    for s in placed.placement.slots:
        on[s.node] = on.get(s.node, 0) + 1
    return dict(sorted(on.items()))


def gpus_touched(r: Replan) -> int:
    """GPUs whose replicas change in a re-plan: where replicas stop, start, or move from/to."""
    touched: set[tuple[str, int]] = set()
    for row in (*r.moved, *r.started, *r.stopped):
        for where in (row.was, row.now):
            if where is not None and r.topology.has_node(where[0]):
                touched.update((where[0], g) for g in where[1])
    return len(touched)


def replica_changes(before: Mapping[str, Instance], after: Mapping[str, Instance]) -> int:
    """Replicas started or stopped to go from allocation ``before`` to ``after`` (LLM ->
    instance): ``|r - r0|`` for an LLM that keeps its shape, ``r + r0`` when it changes; a
    lower bound on a from-scratch plan's disruption (its moves not counted)."""
    n = 0
    for m in sorted(set(before) | set(after)):
        a, b = before.get(m), after.get(m)
        same = (a is not None and b is not None and a.gpu == b.gpu and a.tp == b.tp
                and abs(a.share - b.share) < 1e-9 and abs(a.memory_share - b.memory_share) < 1e-9)
        ra, rb = (a.replicas if a else 0), (b.replicas if b else 0)
        n += abs(rb - ra) if same else ra + rb
    return n


def survivors(state: State, topology: Topology) -> dict[str, Instance]:
    """The running allocation cut to the replicas on nodes still in ``topology``."""
    counts: dict[str, int] = {}
    for s in state.placed.placement.slots:
        if topology.has_node(s.node):
            counts[s.llm] = counts.get(s.llm, 0) + 1
    llms = state.placed.plan.allocation.llms
    return {m: replace(llms[m], replicas=k) for m, k in counts.items()}


def total(lat: Mapping[str, float]) -> float:
    """The objective's latency part: the sum of the workflows' mean latencies (weights 1)."""
    return round(sum(lat.values()), 6)


def simulated(state: State, trace: Trace, requests: int, seed: int) -> dict[str, Any]:
    """Simulate the state's allocation at its targets (``requests`` Poisson arrivals over all
    workflows, replaying ``trace``'s requests): per workflow the predicted and the simulated
    mean latency and the relative error, and whether every request completed."""
    from scepsy_opt.prediction.simulate import simulate

    p = state.problem
    more = {} if p.policy is None else {"policy": p.policy}
    t = timed(lambda: simulate(trace, p.models, state.placed.plan.allocation, p.latency,
                               dict(p.targets), requests=requests, seed=seed,
                               catalog=p.catalog, **more))
    sim = t.value
    pred = latencies(state)
    rows = {w: {"predicted_s": pred[w], "simulated_s": round(x.mean_latency_s, 6),
                "p99_s": round(x.p99_latency_s, 6),
                "error": round(pred[w] / x.mean_latency_s - 1.0, 6), "measured": x.measured}
            for w, x in sim.workflows.items()}
    return {"state": state.label, "requests": requests, "unfinished": sim.unfinished,
            "llm_calls": sim.llm_calls, "workflows": rows,
            "seconds": round(t.seconds, 2), "cpu_s": round(t.cpu_s, 2)}


def workload_trace(sc: Scenario, seed: int) -> Trace:
    """The trace the plans' statistics came from (the same specs, size and seed)."""
    from scepsy_opt.workload import as_specs
    from scepsy_opt.workload import workload_trace as _trace

    return _trace(as_specs(sc.workload), None, requests=sc.trace_requests, seed=seed)


# ------------------------------------------------------------------------------- the run


def first_plan(sc: Scenario, seed: int) -> tuple[State, dict[str, Any]]:
    """Plan the scenario's workload on its fleet from scratch."""
    from scepsy.api import plan

    t = timed(lambda: plan(sc.workload, sc.cluster, sc.total_rps, seed=seed,
                           trace_requests=sc.trace_requests, time_limit_s=sc.time_limit_s))
    res = t.value
    state = State("initial", res.problem, res.topology, res.placed)
    return state, plan_row("initial", res.placed, t)


def ideal_plan(problem: PlanningProblem, topology: Topology) -> Timed:
    """The plan made from scratch for ``problem``'s targets on ``topology`` (no current
    allocation, no change penalty): the best scepsy finds when stability costs nothing."""
    from scepsy_place.formulations.loop import plan_and_place

    opts = replace(problem.options, current=None, change_penalty_s=0.0)
    return timed(lambda: plan_and_place(replace(problem, options=opts), topology,
                                        formulation="auto"))


def replanned(state: State, specs: Sequence[str], penalty_s: float) -> Timed:
    """``scepsy replan`` of ``state`` after the events ``specs`` (change penalty
    ``penalty_s`` per replica started or stopped, :data:`MOVE_COST_S` per move), timed."""
    from scepsy_place.formulations.incremental import parse_event, replan

    return timed(lambda: replan(state.problem, state.topology, state.placed,
                                [parse_event(s) for s in specs], move_cost_s=MOVE_COST_S,
                                change_penalty_s=penalty_s))


def sensitivity(state: State, step: Step, penalties: Sequence[float]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The re-plan of ``step`` from ``state`` again with each change penalty of
    ``penalties``: what it changes and the latencies it reaches (records, plans)."""
    specs = [s.format(busiest=busiest_node(state.placed)) for s in step.specs]
    recs, plans = [], []
    for pen in penalties:
        t = replanned(state, specs, pen)
        r = t.value
        label = f"after {step.label}, change penalty {pen:g} s"
        plans.append(plan_row(label, r.placed, t))
        after = latencies(State(label, r.problem, r.topology, r.placed)) if r.ok else {}
        recs.append({"event": step.label, "change_penalty_s": pen, "placed": bool(r.ok),
                     "kept": len(r.kept), "moved": len(r.moved), "started": len(r.started),
                     "stopped": len(r.stopped), "gpus_touched": gpus_touched(r),
                     "latency_after_s": after, "latency_sum_after_s": total(after),
                     "seconds": round(t.seconds, 2), "cpu_s": round(t.cpu_s, 2)})
    return recs, plans


def event(state: State, step: Step) -> tuple[State, dict[str, Any], list[dict[str, Any]]]:
    """Re-plan ``state`` after ``step``: the new state, the event's record and its plans."""
    specs = [s.format(busiest=busiest_node(state.placed)) for s in step.specs]
    t = replanned(state, specs, CHANGE_PENALTY_S)
    r = t.value
    new = State(step.label, r.problem, r.topology, r.placed)
    ideal_t = ideal_plan(r.problem, r.topology)
    ideal = State(f"ideal after {step.label}", r.problem, r.topology, ideal_t.value)
    plans = [plan_row(f"after {step.label}", r.placed, t),
             plan_row(ideal.label, ideal.placed, ideal_t)]
    before = latencies(state)
    after = latencies(new) if r.ok else {}
    best = latencies(ideal) if ideal.placed.placed else {}
    surv = survivors(state, r.topology)
    rec = {
        "event": step.label, "specs": specs, "status": str(r.status), "placed": bool(r.ok),
        "replicas_before": len(state.placed.placement.slots),
        "replicas_after": len(r.placed.placement.slots) if r.ok else 0,
        "lost": len(r.lost), "kept": len(r.kept), "moved": len(r.moved),
        "started": len(r.started), "stopped": len(r.stopped),
        "moves_minimal": bool(r.moves_minimal), "gpus_touched": gpus_touched(r),
        "gpus_before": state.placed.placement.gpus_used(), "gpus_after": r.gpus_used,
        "gpus_available_after": r.topology.total_gpus,
        "failed_nodes": [s.split("=", 1)[1] for s in specs if s.startswith("node-failed=")],
        "targets_before": {w: round(x, 6) for w, x in state.problem.targets.items()},
        "targets_after": {w: round(x, 6) for w, x in r.problem.targets.items()},
        "latency_before_s": before, "latency_after_s": after, "latency_ideal_s": best,
        "latency_sum_before_s": total(before), "latency_sum_after_s": total(after),
        "latency_sum_ideal_s": total(best),
        "price_of_stability": (round(total(after) / total(best) - 1.0, 6)
                               if after and best else None),
        "replan_changes": len(r.started) + len(r.stopped) + len(r.moved),
        "ideal_changes_min": (replica_changes(surv, ideal.placed.plan.allocation.llms)
                              if best else None),
        "seconds": round(t.seconds, 2), "cpu_s": round(t.cpu_s, 2),
        "per_llm": r.per_llm(), "replicas_per_node": per_node(r.placed) if r.ok else {}}
    return new, rec, plans


def run(*, quick: bool, seed: int, out: Path, jobs: int = 1) -> dict[str, Any]:
    """Plan the fleet, re-plan it after each event, print the tables and write the figure
    ``out/beyond_paper.png``; returns the section's dict (``plans``, ``events``, the initial
    allocation). ``jobs`` is unused: each event re-plans what the one before left."""
    del jobs
    sc = QUICK if quick else FULL
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    w0, c0 = time.perf_counter(), time.process_time()
    progress(f"beyond: planning {sc.workload.name} on {sc.cluster.name}")
    state, row = first_plan(sc, seed)
    initial = {m: {"gpu": i.gpu, "tp": i.tp, "share": i.share, "replicas": i.replicas}
               for m, i in sorted(state.placed.plan.allocation.llms.items())}
    trace = workload_trace(sc, seed)
    plans, events = [row], []
    sims = [simulated(state, trace, sc.sim_requests, seed)]
    sens, more = sensitivity(state, sc.steps[0], LOW_PENALTIES_S)
    plans += more
    for step in sc.steps:
        progress(f"beyond: {step.label}")
        state, rec, more = event(state, step)
        plans += more
        events.append(rec)
        if not rec["placed"]:
            break
        sims.append(simulated(state, trace, sc.sim_requests, seed))
    result = {"scenario": sc.name, "workload": sc.workload.relative_to(REPO).as_posix(),
              "cluster": sc.cluster.relative_to(REPO).as_posix(), "gpus": _gpus(sc.cluster),
              "total_rps": sc.total_rps, "trace_requests": sc.trace_requests, "seed": seed,
              "move_cost_s": MOVE_COST_S, "change_penalty_s": CHANGE_PENALTY_S,
              "sim_requests": sc.sim_requests, "allocation_initial": initial, "plans": plans,
              "events": events, "penalty_sensitivity": sens, "simulated": sims, "figure": "beyond_paper.png"}
    figure(result, out / "beyond_paper.png")
    result["total_s"] = round(time.perf_counter() - w0, 1)
    result["total_cpu_s"] = round(time.process_time() - c0, 1)
    print_tables(result)
    return result


def _gpus(cluster: Path) -> int:
    from scepsy_place.packing.topology import load_topology

    return int(load_topology(cluster).total_gpus)


def without_timings(doc: Any) -> Any:
    """``doc`` with every :data:`TIMING_KEYS` entry left out, at any depth (what must be
    byte-identical for the same seed)."""
    if isinstance(doc, Mapping):
        return {k: without_timings(v) for k, v in doc.items() if k not in TIMING_KEYS}
    if isinstance(doc, list):
        return [without_timings(v) for v in doc]
    return doc


# ---------------------------------------------------------------------- tables and figure


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def print_tables(result: Mapping[str, Any]) -> None:
    """The plans, the events' replica accounting and the workflows' latencies."""
    print(f"\n{result['scenario']}: {result['workload']} on {result['cluster']} "
          f"({result['gpus']} GPUs), {result['total_rps']:g} req/s, seed {result['seed']}")
    rows = [{"plan": p["label"], "status": p["status"], "formulation": p["formulation"],
             "replicas": p["replicas"], "GPUs": p["gpus_used"], "objective s": _fmt(p["objective_s"], 6),
             "gap": "-" if p["gap"] is None else f"{100 * p['gap']:.2f}%",
             "time s": f"{p['seconds']:.1f}"} for p in result["plans"]]
    print(table(rows, list(rows[0])))
    rows = [{"event": e["event"], "specs": " ".join(e["specs"]), "lost": e["lost"],
             "kept": e["kept"], "moved": e["moved"], "started": e["started"],
             "stopped": e["stopped"], "GPUs touched": e["gpus_touched"],
             "latency sum s": _fmt(e["latency_sum_after_s"], 5),
             "ideal s": _fmt(e["latency_sum_ideal_s"], 5),
             "stability": "-" if e["price_of_stability"] is None
             else f"{100 * e['price_of_stability']:+.2f}%",
             "ideal changes >=": "-" if e["ideal_changes_min"] is None
             else e["ideal_changes_min"],
             "re-plan s": f"{e['seconds']:.1f}"} for e in result["events"]]
    if rows:
        print(table(rows, list(rows[0])))
    print(table(latency_rows(result), ["workflow", *_states(result)]))
    base = result["events"][0] if result["events"] else None
    rows = [{"event": x["event"], "change penalty s": f"{x['change_penalty_s']:g}",
             "kept": x["kept"], "moved": x["moved"], "started": x["started"],
             "stopped": x["stopped"], "GPUs touched": x["gpus_touched"],
             "latency sum s": _fmt(x["latency_sum_after_s"], 5),
             "ideal s": _fmt(base["latency_sum_ideal_s"], 5) if base else "-"}
            for x in result["penalty_sensitivity"]]
    if rows:
        print(table(rows, list(rows[0])))
    rows = [{"plan": sim["state"], "workflow": w, "predicted s": _fmt(x["predicted_s"]),
             "simulated s": _fmt(x["simulated_s"]), "error": f"{100 * x['error']:+.1f}%",
             "p99 s": _fmt(x["p99_s"]), "measured": x["measured"]}
            for sim in result["simulated"] for w, x in sim["workflows"].items()]
    print(table(rows, list(rows[0]), align="left"))


def _states(result: Mapping[str, Any]) -> list[str]:
    return ["initial", *(e["event"] for e in result["events"]),
            *(f"ideal: {e['event']}" for e in result["events"])]


def latency_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per workflow: its predicted mean latency (s) initially, after each event, and
    in the from-scratch plan after each event."""
    events = result["events"]
    first = events[0]["latency_before_s"] if events else {}
    rows = []
    for w in first:
        row: dict[str, Any] = {"workflow": w, "initial": _fmt(first[w])}
        for e in events:
            row[e["event"]] = _fmt(e["latency_after_s"].get(w))
        for e in events:
            row[f"ideal: {e['event']}"] = _fmt(e["latency_ideal_s"].get(w))
        rows.append(row)
    return rows


def figure(result: Mapping[str, Any], path: Path) -> None:
    """Left: each workflow's predicted mean latency after each event relative to the first
    plan's (bars; the from-scratch plan's: black ticks); middle: the replicas lost, kept,
    moved, started and stopped per event; right: predicted against simulated mean latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = result["events"]
    first = events[0]["latency_before_s"] if events else {}
    names = list(first)
    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=(18, 5.5),
                                     gridspec_kw={"width_ratios": [2.2, 1, 1]})
    width = 0.8 / max(1, len(events))
    for k, e in enumerate(events):
        xs = [i + (k - (len(events) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, [e["latency_after_s"].get(w, math.nan) / first[w] for w in names], width,
               label=f"after {e['event']}")
        ax.scatter(xs, [e["latency_ideal_s"].get(w, math.nan) / first[w] for w in names],
                   marker="_", s=80, color="black", zorder=3,
                   label="from scratch" if k == 0 else None)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("predicted mean latency / initial plan's")
    ax.set_title(f"{result['scenario']}: latency per workflow after each event")
    ax.legend(fontsize=8)
    kinds = ("kept", "moved", "started", "stopped", "lost")
    bw = 0.8 / len(kinds)
    for k, kind in enumerate(kinds):
        xs = [i + (k - (len(kinds) - 1) / 2) * bw for i in range(len(events))]
        vals = [e[kind] for e in events]
        bx.bar(xs, vals, bw, label=kind)
        for x, v in zip(xs, vals, strict=True):
            bx.text(x, max(v, 0.05) * 1.1, str(v), ha="center", va="bottom", fontsize=6)
    bx.set_yscale("symlog", linthresh=1)
    bx.set_xticks(range(len(events)), [e["event"] for e in events])
    bx.set_ylabel("replicas (symmetric log scale)")
    bx.set_title("what each re-plan did")
    bx.legend(fontsize=8)
    bx.tick_params(axis="x", labelsize=8)
    values = []
    for sim in result["simulated"]:
        pts = list(sim["workflows"].values())
        cx.scatter([x["simulated_s"] for x in pts], [x["predicted_s"] for x in pts], s=18,
                   label=sim["state"])
        values += [v for x in pts for v in (x["simulated_s"], x["predicted_s"])]
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        cx.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    cx.set_xscale("log")
    cx.set_yscale("log")
    cx.set_xlabel("simulated mean latency (s)")
    cx.set_ylabel("predicted mean latency (s)")
    cx.set_title("predicted vs simulated")
    cx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="96 GPUs and four workflows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the figure goes")
    args = ap.parse_args(argv)
    result = run(quick=args.quick, seed=args.seed, out=args.out, jobs=1)
    print(f"wrote {write_results('beyond_paper', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
