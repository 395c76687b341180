"""Resizing in place: the running plan with more or fewer replicas of the shapes it runs, so
that no running replica restarts (docs/control.md, "How it decides").

A re-plan of the running plan may give an LLM another shape (a share already running for another
LLM, say): its new replicas then start beside the old ones, which serve until the new are
healthy, so for a start-up the LLM holds both, and what the change saves is spent again (or,
growing, twice the LLM is paid for). Here each LLM keeps its shape and only its count changes:

* :func:`shrink` removes replicas one at a time, always the one that frees the most GPUs
  (``tp x share``; ties by the LLM's name), while the plan still meets ``fits``, until no
  replica can go;
* :func:`grow` adds replicas one at a time, always the one that leaves the least
  ``violation`` (ties: the fewer GPUs added, then the name), until the plan meets ``fits``,
  within a number of GPUs (None when it cannot get there);
* :func:`in_place` realises the new counts as a :class:`Replan`: per LLM the replicas numbered
  below the new count are kept where they run, the others stopped, the added ones placed
  around the running replicas (None when they do not fit there: nothing running moves).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from scepsy_opt.allocation import Allocation
from scepsy_opt.planning.problem import Deadline, PlanningProblem
from scepsy_place.formulations.incremental import (
    LoadChanged,
    Replan,
    ReplicaRow,
    apply_events,
)
from scepsy_place.formulations.loop import PlacedPlan, current_plan, place_or_exact
from scepsy_place.packing.placement import Placement, apply, demands
from scepsy_place.packing.topology import Topology

MAX_STEPS = 10_000
"""A bound on the replicas :func:`grow` adds (it stops at its GPUs long before)."""


def shrink(alloc: Allocation, fits: Callable[[Allocation], bool]) -> Allocation:
    """``alloc`` with replicas removed greedily (module docstring) while ``fits`` holds; every
    LLM keeps its shape and at least one replica. ``alloc`` itself when no replica can go."""
    cur = dict(alloc.llms)
    while True:
        order = sorted((m for m, i in cur.items() if i.replicas > 1),
                       key=lambda m: (-cur[m].tp * cur[m].share, m))
        for m in order:
            trial = {**cur, m: replace(cur[m], replicas=cur[m].replicas - 1)}
            if fits(Allocation(trial, alloc.source)):
                cur = trial
                break
        else:
            return Allocation(cur, alloc.source)


def grow(alloc: Allocation, fits: Callable[[Allocation], bool],
         violation: Callable[[Allocation], float], gpus: float) -> Allocation | None:
    """``alloc`` with replicas added greedily (module docstring) until ``fits`` holds, using at
    most ``gpus`` GPUs; every LLM keeps its shape. None when no such plan is found."""
    cur = Allocation(dict(alloc.llms), alloc.source)
    for _ in range(MAX_STEPS):
        if fits(cur):
            return cur
        trials = []
        for m, i in sorted(cur.llms.items()):
            t = Allocation({**cur.llms, m: replace(i, replicas=i.replicas + 1)}, alloc.source)
            if t.gpus() <= gpus + 1e-9:
                trials.append((violation(t), i.tp * i.share, m, t))
        if not trials:
            return None
        cur = min(trials, key=lambda x: x[:3])[3]
    return None


def in_place(problem: PlanningProblem, topology: Topology, running: PlacedPlan,
             new: Allocation, target: Mapping[str, float], *,
             policy: str = "hierarchical") -> Replan | None:
    """The change from ``running`` to ``new`` (every LLM in its running shape) at the
    workflows' ``target`` rates, as a :class:`Replan` (module docstring). None when ``new``
    changes a shape or the set of LLMs, the optimiser's rules reject it at ``target`` (an LLM's
    load above ``max_utilisation``, a budget) or its added replicas do not fit around the
    running ones."""
    t0 = time.perf_counter()
    old = running.plan.allocation
    pl = running.placement
    if old is None or pl is None or set(new.llms) != set(old.llms) or any(
            replace(i, replicas=old.llms[m].replicas) != old.llms[m]
            for m, i in new.llms.items()):
        return None
    events = tuple(LoadChanged(wf, target=t) for wf, t in sorted(target.items()))
    after, top = apply_events(problem, topology, events)
    plan = current_plan(replace(after, options=replace(after.options, current=new)),
                        running.plan.optimiser)
    if plan is None:
        return None
    keep = tuple(s for s in pl.slots if s.replica < new.llms[s.llm].replicas)
    stop = tuple(s for s in pl.slots if s.replica >= new.llms[s.llm].replicas)
    kept_pl = Placement(keep, (), pl.policy, pl.placed_by)
    add = Allocation({m: replace(i, replicas=i.replicas - old.llms[m].replicas)
                      for m, i in new.llms.items() if i.replicas > old.llms[m].replicas},
                     new.source)
    started: tuple[ReplicaRow, ...] = ()
    final = kept_pl
    if add.llms:
        dem = demands(add, problem.catalog,
                      first_replica={m: old.llms[m].replicas for m in add.llms})
        more = place_or_exact(apply(top, kept_pl), dem, policy, None, Deadline.of(after))
        if not more.complete:
            return None
        final = kept_pl.merge(more)
        started = tuple(ReplicaRow(s.llm, None, s.replica, None, (s.node, s.gpus))
                        for s in sorted(more.slots, key=lambda s: s.key))
    placed = replace(running, plan=plan, placement=final, quality=None, reason=None,
                     formulation="in-place", status="placed")
    kept = tuple(ReplicaRow(s.llm, s.replica, s.replica, (s.node, s.gpus), (s.node, s.gpus))
                 for s in sorted(keep, key=lambda s: s.key))
    stopped = tuple(ReplicaRow(s.llm, s.replica, None, (s.node, s.gpus), None)
                    for s in sorted(stop, key=lambda s: s.key))
    return Replan(events, after, top, placed, kept, (), started, stopped, (), True, 0.0, 0.0,
                  time.perf_counter() - t0, 0, old.llms)
