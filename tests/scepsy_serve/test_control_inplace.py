"""Resizing in place (scepsy_serve.control.inplace) and the controller's use of it: a scale-down
only stops replicas (every LLM keeps its shape, nothing starts, moves or restarts), and the
greedy shrink and grow against a closed-form oracle."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_control_core import _setup  # the controller's starting plan, shared

from scepsy_opt.allocation import Allocation, Instance
from scepsy_serve.control.core import ControlConfig, Controller, WindowStats
from scepsy_serve.control.inplace import grow, in_place, shrink

FAST = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                max_examples=40)
SHARES = (0.1, 0.2, 0.3, 0.5, 1.0)


def _alloc(shapes):
    return Allocation({f"m{i}": Instance("A100-80GB", tp, share, r)
                       for i, (tp, share, r) in enumerate(shapes)}, "test")


def _need(need):
    """``fits``: every LLM's capacity (replicas x tp x share) at least its need."""
    def fits(a):
        return all(i.replicas * i.tp * i.share >= need[m] - 1e-9 for m, i in a.llms.items())
    return fits


def _excess(need):
    return lambda a: sum(max(0.0, need[m] - i.replicas * i.tp * i.share)
                         for m, i in a.llms.items())


shape = st.tuples(st.sampled_from((1, 2)), st.sampled_from(SHARES), st.integers(1, 12))


@FAST
@given(st.lists(shape, min_size=1, max_size=4), st.lists(st.floats(0.0, 12.0), min_size=4,
                                                         max_size=4))
def test_shrink_keeps_shapes_and_stops_where_no_replica_can_go(shapes, fracs):
    a = _alloc(shapes)
    need = {m: min(f, i.replicas * i.tp * i.share) for (m, i), f in
            zip(a.llms.items(), fracs[:len(a.llms)], strict=True)}
    b = shrink(a, _need(need))
    assert _need(need)(b)
    for m, i in b.llms.items():
        old = a.llms[m]
        assert replace(i, replicas=old.replicas) == old and 1 <= i.replicas <= old.replicas
        # the oracle: the fewest replicas of this shape that carry the need (or one)
        per = i.tp * i.share
        least = max(1, -(-round(need[m] / per * 1e6) // 10**6))
        assert i.replicas == least, (m, i, need[m])


@FAST
@given(st.lists(shape, min_size=1, max_size=4), st.lists(st.floats(0.0, 30.0), min_size=4,
                                                         max_size=4), st.floats(1.0, 64.0))
def test_grow_adds_replicas_of_the_running_shapes_within_the_gpus(shapes, needs, gpus):
    a = _alloc(shapes)
    need = {m: max(n, i.replicas * i.tp * i.share) for (m, i), n in
            zip(a.llms.items(), needs[:len(a.llms)], strict=True)}
    least = {m: max(i.replicas, -(-round(need[m] / (i.tp * i.share) * 1e6) // 10**6))
             for m, i in a.llms.items()}
    fewest = sum(least[m] * i.tp * i.share for m, i in a.llms.items())
    b = grow(a, _need(need), _excess(need), gpus)
    if _need(need)(a):  # nothing to add, whatever the GPUs
        assert b == a
        return
    if fewest > gpus + 1e-9:
        assert b is None
        return
    assert b is not None and _need(need)(b) and b.gpus() <= gpus + 1e-9
    for m, i in b.llms.items():  # the shape kept, and no replica beyond what the need takes
        assert replace(i, replicas=a.llms[m].replicas) == a.llms[m]
        assert i.replicas == least[m]


# ----------------------------------------------------------------------------- controller


def _shape(i):
    return (i.gpu, i.tp, i.share, i.memory_share)


def test_a_scale_down_only_stops_replicas():
    """Up to several times the load, then down to a tenth: every scale-down keeps every LLM's
    shape and starts, moves and restarts nothing (its replicas drain at once: no start-up of a
    replacement beside them), and its plan is the running one's slots minus those stopped."""
    problem, top, start = _setup()
    ctl = Controller(problem, top, start, ControlConfig(hold_windows=1))
    base = dict(problem.targets)
    downs = 0
    for k, f in enumerate([1, 3, 6, 6, 6, 2, 0.5, 0.1, 0.1, 0.1, 0.1]):
        before = ctl.placed
        d = ctl.observe(WindowStats(30.0 * k, 30.0 * (k + 1), {w: f * r for w, r in base.items()}))
        if d.action == "scale-down":
            downs += 1
            rp = d.replan
            assert rp is not None and rp.ok and not rp.started and not rp.moved, d.reason
            assert d.startup_s == 0.0
            old, new = before.plan.allocation.llms, rp.placed.plan.allocation.llms
            assert set(old) == set(new)
            assert all(_shape(old[m]) == _shape(new[m]) and new[m].replicas <= old[m].replicas
                       for m in old)
            assert new != old
            kept = {s.key: s for s in rp.placed.placement.slots}
            assert all(before.placement is not None and s in before.placement.slots
                       for s in kept.values())
        ctl.commit(d)
    assert downs >= 1


def test_in_place_refuses_a_change_of_shape():
    problem, top, start = _setup()
    alloc = start.plan.allocation
    m, i = next(iter(sorted(alloc.llms.items())))
    other = replace(i, share=0.5 if i.share != 0.5 else 0.25)
    assert in_place(problem, top, start, Allocation({**alloc.llms, m: other}, "x"),
                    dict(problem.targets)) is None
    same = in_place(problem, top, start, alloc, dict(problem.targets))
    assert same is not None and same.ok and not same.started and not same.stopped


def test_in_place_adds_replicas_around_the_running_ones():
    """One more replica of every LLM: the running slots stay where they are, the new ones are
    numbered after them and placed on free capacity (no GPU share over 1 on any GPU)."""
    problem, top, start = _setup()
    alloc = start.plan.allocation
    more = Allocation({m: replace(i, replicas=i.replicas + 1) for m, i in alloc.llms.items()},
                      "x")
    rp = in_place(problem, top, start, more, dict(problem.targets))
    assert rp is not None and rp.ok and not rp.stopped and not rp.moved
    assert sorted((r.llm, r.after) for r in rp.started) == sorted(
        (m, i.replicas) for m, i in alloc.llms.items())
    assert set(start.placement.slots) <= set(rp.placed.placement.slots)
    used: dict[tuple[str, int], float] = {}
    for s in rp.placed.placement.slots:
        for g in s.gpus:
            used[(s.node, g)] = used.get((s.node, g), 0.0) + s.share
    assert max(used.values()) <= 1.0 + 1e-9
    assert rp.placed.plan.allocation == more
