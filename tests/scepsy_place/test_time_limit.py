"""The time limit: it bounds the whole plan, and running out is its own status, never infeasible.

A :class:`Countdown` deadline passes after a set number of looks at the clock, so every point
where a plan can run out of time (candidate batches, reduced-cost fixing, each solver call,
bisection steps, optimise-place rounds) is tried deterministically.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from scepsy.cli import EXIT_INFEASIBLE, EXIT_TIME_LIMIT, EXIT_USAGE, main
from scepsy_opt.cluster import Cluster, GPUPool, uniform_cluster
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.milp import MILPOptimiser, solve_min_latency
from scepsy_opt.planning.planfile import plan_to_dict
from scepsy_opt.planning.plans import Plan
from scepsy_opt.planning.problem import Deadline, PlanningProblem, PlanOptions, TimeLimitReached
from scepsy_place.formulations.loop import plan_and_place
from scepsy_place.packing.topology import from_cluster
from scepsy_profile import roofline_model

ROOF = roofline_model()
REPO = Path(__file__).resolve().parents[2]
RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
A16 = str(REPO / "datasets" / "clusters" / "a100-16.yaml")
NO_SOLUTION = "time_limit_no_solution"
TWO_TYPES = Cluster("two", (GPUPool("A100-80GB", 1, 4), GPUPool("H100-80GB", 1, 4)))


@dataclass
class Countdown:
    """A deadline (the interface of :class:`Deadline`) that passes after ``checks`` looks at
    the clock, and then stays passed."""

    checks: int
    limit_s: float = 1.0
    seen: int = 0

    def _passed(self) -> bool:
        self.seen += 1
        return self.seen > self.checks

    def remaining(self) -> float:
        return 0.0 if self._passed() else 60.0

    def check(self) -> None:
        if self._passed():
            raise TimeLimitReached("countdown")

    def within(self, seconds: float) -> Countdown:
        """A step's share: the same countdown (it passes after so many looks, whatever the
        share)."""
        return self


def _with(p: PlanningProblem, **kw: object) -> PlanningProblem:
    return replace(p, options=replace(p.options, **kw))


def _looks(run: Callable[[Any], object]) -> int:
    """How often ``run(deadline)`` looks at the clock when time never runs out."""
    probe = Countdown(10**9)
    run(probe)
    return probe.seen


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1.0)


def test_no_incumbent_is_time_limit_no_solution_not_infeasible():
    p = random_problem(5, 16, ROOF, seed=0, options=PlanOptions(time_limit_s=1e-6))
    plan = MILPOptimiser().solve(p)
    assert plan.status == NO_SOLUTION
    assert plan.allocation is None and plan.infeasible is None  # nothing blamed on the GPUs
    assert plan.scale == 0.0  # no scale of the targets reached
    doc = plan_to_dict(p, plan)
    assert doc["status"] == NO_SOLUTION and "infeasible" not in doc and "allocation" not in doc
    assert doc["scale"] == 0.0
    # the same problem with time to spare is feasible
    assert MILPOptimiser().solve(_with(p, time_limit_s=60.0)).status == "optimal"


@pytest.mark.parametrize("reduce", [False, True])
def test_every_cut_point_gives_the_optimum_or_no_solution(reduce):
    """Wherever the time runs out, the answer is the optimum or says that time ran out."""
    p = random_problem(3, 8, ROOF, seed=0, load=0.4, options=PlanOptions(reduce=reduce),
                       cluster=TWO_TYPES)
    best = MILPOptimiser().solve(p)
    assert best.status == "optimal"
    looks = _looks(lambda d: MILPOptimiser().solve(p, deadline=d))
    assert looks >= 5  # generation and (reduce) the reduction's passes look at the clock
    for k in range(looks):
        plan = MILPOptimiser().solve(p, deadline=Countdown(k))  # type: ignore[arg-type]
        assert plan.status in (NO_SOLUTION, "optimal"), (k, plan.status)
        if plan.status == NO_SOLUTION:
            assert plan.allocation is None and plan.infeasible is None
        else:
            assert _close(plan.objective_s, best.objective_s)
    assert MILPOptimiser().solve(p, deadline=Countdown(looks)).status == "optimal"  # type: ignore[arg-type]


def test_an_infeasible_problem_is_infeasible_or_out_of_time_never_wrongly_feasible():
    p = random_problem(3, 4, ROOF, seed=2, load=3.0)
    assert MILPOptimiser().solve(p).status == "infeasible"
    looks = _looks(lambda d: MILPOptimiser().solve(p, deadline=d))
    for k in range(looks):
        plan = MILPOptimiser().solve(p, deadline=Countdown(k))  # type: ignore[arg-type]
        assert plan.status in (NO_SOLUTION, "infeasible") and plan.allocation is None


def test_max_throughput_bisection_cut_short_keeps_its_best_scale():
    p = random_problem(3, 8, ROOF, seed=4)
    free = MILPOptimiser().solve(_with(p, objective="max-throughput"))
    lat = {w: v * 0.7 for w, v in _latencies(p, free).items()}  # bounds that bind
    q = _with(p, objective="max-throughput", latency_bound_s=lat)
    full = MILPOptimiser().solve(q)
    assert full.status == "optimal" and full.scale > 0
    looks = _looks(lambda d: MILPOptimiser().solve(q, deadline=d))
    kinds = set()
    for k in range(0, looks, max(1, looks // 12)):
        plan = MILPOptimiser().solve(q, deadline=Countdown(k))  # type: ignore[arg-type]
        kinds.add(plan.status)
        assert plan.status in (NO_SOLUTION, "time_limit", "optimal"), (k, plan.status)
        if plan.status == "time_limit":  # a scale found before the time ran out: a lower bound
            assert plan.allocation is not None and 0 < plan.scale <= full.scale * (1 + 1e-9)
        if plan.status == "optimal":
            assert _close(plan.scale, full.scale)
    assert {NO_SOLUTION, "time_limit"} <= kinds


def _latencies(p: PlanningProblem, plan: Plan) -> dict[str, float]:
    from scepsy_opt.planning.plans import workflow_latencies

    return workflow_latencies(p.scaled(plan.scale), plan)


@pytest.mark.parametrize("formulation", ["aggregate", "blocks", "auto"])
def test_plan_and_place_cut_anywhere_is_placed_or_no_solution(formulation):
    p = random_problem(3, 8, ROOF, seed=4)
    topo = from_cluster(p.cluster)
    looks = _looks(lambda d: plan_and_place(p, topo, formulation=formulation, deadline=d))
    for k in range(0, looks, max(1, looks // 20)):
        res = plan_and_place(p, topo, formulation=formulation,
                             deadline=Countdown(k))  # type: ignore[arg-type]
        assert res.placed or res.plan.status == NO_SOLUTION, (k, res.plan.status, res.reason)
        if not res.placed:
            assert res.plan.allocation is None and "time limit" in (res.reason or "")


def test_a_scale_found_by_bisection_is_never_called_optimal():
    """Max-throughput whose capacity optimum does not place bisects the scale with placed
    min-latency plans: the plan handed on is a bracket, ``heuristic`` when the search closed it
    and ``time_limit`` wherever the time limit cut it short, never ``optimal`` (the status the
    min-latency step's own MILP had)."""
    cl = uniform_cluster("A100-80GB", 3, 3)
    p = random_problem(2, 3, ROOF, seed=0, load=0.6, cluster=cl,
                       options=PlanOptions(shares=(0.3, 0.6, 1.0), tps=(1,),
                                           objective="max-throughput"))
    topo = from_cluster(cl)
    full = plan_and_place(p, topo, formulation="aggregate")
    assert full.placed and len(full.history) > 1 and not full.exact  # bisected
    assert full.plan.status == "heuristic"
    looks = _looks(lambda d: plan_and_place(p, topo, formulation="aggregate", deadline=d))
    cut = []
    for k in range(0, looks, max(1, looks // 20)):
        res = plan_and_place(p, topo, formulation="aggregate",
                             deadline=Countdown(k))  # type: ignore[arg-type]
        assert res.placed or res.plan.status == NO_SOLUTION, (k, res.plan.status)
        if res.placed:
            cut.append(res.plan.status)
            assert 0 < res.plan.scale <= full.plan.scale * (1 + 1e-9)
    assert cut and set(cut) == {"time_limit"}


def test_the_time_limit_bounds_reduced_cost_fixing_at_4096_gpus():
    p = random_problem(100, 4096, ROOF, seed=0)
    for limit, objective in ((0.001, "min-latency"), (0.05, "min-latency"),
                             (0.05, "max-throughput")):
        q = _with(p, time_limit_s=limit, objective=objective)
        t0 = time.perf_counter()
        plan = MILPOptimiser().solve(q)
        wall = time.perf_counter() - t0
        assert plan.status == NO_SOLUTION
        assert wall < limit + 1.0, wall  # checked between batches: a batch, not the whole plan


def test_deadline_is_a_point_on_the_monotonic_clock():
    d = Deadline.after(30.0)
    assert 29.0 < d.remaining() <= 30.0 and d.limit_s == 30.0
    d.check()
    gone = Deadline.after(0.0)
    assert gone.remaining() == 0.0
    with pytest.raises(TimeLimitReached):
        gone.check()
    p = random_problem(2, 4, ROOF, seed=1)
    assert solve_min_latency(p, deadline=gone).status == NO_SOLUTION


def test_cli_exits_with_its_own_code_and_says_the_time_ran_out(capsys, tmp_path):
    out = tmp_path / "plan.json"
    code = main(["plan", "--workflow", RAG, "--cluster", A16, "--target", "6",
                 "--trace-requests", "200", "--time-limit", "0.000001", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == EXIT_TIME_LIMIT and code not in (EXIT_INFEASIBLE, EXIT_USAGE, 0)
    assert "time limit" in err and "before any allocation was found" in err
    assert "GPUs" not in err and "infeasible" not in err
    doc = json.loads(out.read_text())
    assert doc["status"] == NO_SOLUTION and "infeasible" not in doc and "allocation" not in doc
    assert doc["solver"]["time_limit_s"] == 1e-6
    assert not math.isfinite(doc["solver"]["objective_s"] or math.inf)
