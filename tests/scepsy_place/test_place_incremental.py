"""Incremental operations on a running placement (scepsy_place.formulations.incremental, docs/incremental.md):
events, re-planning with started / stopped / moved replicas, the fewest moves against an
exhaustive oracle on tiny instances, and ``scepsy replan``."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_common.units import UNITS
from scepsy_opt.planning.instances import random_problem
from scepsy_place.formulations.incremental import (
    LoadChanged,
    NodeFailed,
    RackDrained,
    Running,
    apply_events,
    parse_event,
    place_around,
    replan,
    running_from_document,
)
from scepsy_place.formulations.loop import plan_and_place, plan_document
from scepsy_place.packing.check import violations
from scepsy_place.packing.exact import place_exactly
from scepsy_place.packing.placement import Placement, apply, demands, place
from scepsy_place.packing.replicas import Demand, Slot
from scepsy_place.packing.topology import Node, Topology
from scepsy_profile import roofline_model

REPO = Path(__file__).resolve().parents[2]
FAST = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
GPU = "A100-80GB"


# ------------------------------------------------------------------------------- events


@pytest.mark.parametrize("text, event", [
    ("node-failed=A100-80GB-0", NodeFailed("A100-80GB-0")),
    ("rack-drained=rack-a", RackDrained("rack-a")),
    ("load=rag*2", LoadChanged("rag", factor=2.0)),
    ("load=rag=3.5", LoadChanged("rag", target=3.5)),
])
def test_event_specs_parse_and_print_back(text, event):
    assert parse_event(text) == event
    assert parse_event(event.spec) == event


@pytest.mark.parametrize("text, field", [
    ("node-failed", "kind"), ("reboot=n0", "kind"), ("node-failed=", "node-failed"),
    ("rack-drained=", "rack-drained"), ("load=rag", "load"), ("load=rag*x", "load"),
    ("load=rag*0", "load"), ("load=rag=-1", "load"), ("load=*2", "load"),
    ("load=rag*inf", "load"),
])
def test_bad_event_specs_name_the_field(text, field):
    with pytest.raises(InputError) as exc:
        parse_event(text, "--event")
    assert exc.value.source == "--event" and exc.value.field == field


@given(st.floats(1e-3, 1e3), st.booleans())
@settings(FAST, max_examples=50)
def test_load_events_round_trip(x, factor):
    e = LoadChanged("wf", factor=x) if factor else LoadChanged("wf", target=x)
    back = parse_event(e.spec)
    got = back.factor if factor else back.target
    assert got == pytest.approx(x, rel=1e-5)


@cache
def _racks() -> Topology:
    """Two racks of two 8-GPU A100 nodes."""
    return Topology("two-racks", tuple(
        Node(f"n{r}{i}", f"rack{r}", GPU, 8, 8, 80.0) for r in range(2) for i in range(2)))


def test_apply_events_removes_nodes_and_sets_targets():
    top = _racks()
    problem = random_problem(3, 32, roofline_model(), seed=1, cluster=top.to_cluster(), load=0.2)
    wf = next(iter(problem.targets))
    p2, t2 = apply_events(problem, top, [NodeFailed("n00"), LoadChanged(wf, factor=2.0)])
    assert [n.name for n in t2.nodes] == ["n01", "n10", "n11"]
    assert p2.cluster.total_gpus == 24 and p2.targets[wf] == pytest.approx(2 * problem.targets[wf])
    p3, t3 = apply_events(problem, top, [RackDrained("rack1"), LoadChanged(wf, target=0.5)])
    assert [n.name for n in t3.nodes] == ["n00", "n01"] and p3.targets[wf] == 0.5
    same, top_same = apply_events(problem, top, [LoadChanged(wf, factor=1.0)])
    assert top_same is top and same.cluster == problem.cluster
    for bad, field in [([NodeFailed("zz")], "node-failed"), ([RackDrained("zz")], "rack-drained"),
                       ([LoadChanged("zz", factor=2.0)], "load"),
                       ([RackDrained("rack0"), RackDrained("rack1")], "rack-drained"),
                       ([NodeFailed("n00"), NodeFailed("n00")], "node-failed")]:
        with pytest.raises(InputError) as exc:
            apply_events(problem, top, bad)
        assert exc.value.field == field
    for twice in ([NodeFailed("n00"), NodeFailed("n00")],
                  [RackDrained("rack0"), RackDrained("rack0")],
                  [RackDrained("rack0"), NodeFailed("n00")]):
        with pytest.raises(InputError) as exc:
            apply_events(problem, top, twice)
        assert "an earlier event already removed" in exc.value.expected
    with pytest.raises(InputError) as exc:
        apply_events(problem, top, [NodeFailed("zz")])
    assert "earlier event" not in exc.value.expected


# ------------------------------------------------------------------------------- replan


@cache
def _running(seed: int, nodes: int = 4, load: float = 0.25):
    """A placed min-latency plan on ``nodes`` 8-GPU A100 nodes in two racks, with room."""
    top = Topology("racks", tuple(Node(f"n{i}", f"rack{i % 2}", GPU, 8, 8, 80.0)
                                  for i in range(nodes)))
    problem = random_problem(4, 8 * nodes, roofline_model(), seed=seed, cluster=top.to_cluster(),
                             load=load)
    res = plan_and_place(problem, top)
    assert res.placed
    return problem, top, res


def _check(r, running_res, top):
    """Every invariant of a re-plan's answer (module docstring of scepsy_place.formulations.incremental)."""
    assert r.ok, r.placed.reason
    alloc = r.placed.plan.allocation
    dem = demands(alloc)
    pl = r.placed.placement
    assert violations(r.topology, dem, pl) == []
    # replicas numbered 0..r-1 per LLM (plan.json requires it)
    for m, inst in alloc.llms.items():
        assert sorted(s.replica for s in pl.slots if s.llm == m) == list(range(inst.replicas))
    before = running_res.placement
    gone = {n.name for n in top.nodes} - {n.name for n in r.topology.nodes}
    assert not any(s.node in gone for s in pl.slots)
    # the report accounts for every replica before and after
    old = {(s.llm, s.replica) for s in before.slots}
    reported = ([(x.llm, x.before) for x in r.kept + r.moved + r.stopped + r.lost])
    assert sorted(reported) == sorted(old)
    after = sorted((x.llm, x.after) for x in r.kept + r.moved + r.started)
    assert after == sorted(s.key for s in pl.slots)
    # kept replicas run where they ran; moved ones do not
    now = {s.key: (s.node, s.gpus) for s in pl.slots}
    for x in r.kept:
        assert x.was == x.now == now[(x.llm, x.after)]
    for x in r.moved:
        assert x.was != x.now == now[(x.llm, x.after)]
    for x in r.lost:
        assert x.was[0] in gone
    # started / stopped agree with the optimiser's change count
    for row in r.per_llm().values():
        b, a = row["before"], row["after"]
        assert row["kept"] + row["moved"] + row["started"] == (a["replicas"] if a else 0)
        assert row["kept"] + row["moved"] + row["stopped"] + row["lost"] == (
            b["replicas"] if b else 0)
    assert r.objective_s == pytest.approx(r.placed.plan.objective_s)
    assert r.cost_s == pytest.approx(r.objective_s + r.move_cost_s * len(r.moved))
    assert r.gpus_used == pl.gpus_used()
    json.dumps(r.to_dict())  # JSON-ready


def _moves_needed(r) -> bool:
    """Whether the new replicas do not fit around every surviving replica kept (so moving one
    was needed): placer, then the exact test, per GPU type."""
    kept = [x for x in r.kept + r.moved]
    slots = tuple(Slot(x.llm, x.before, x.was[0], x.was[1], *_share_mem(r, x.llm))
                  for x in kept)
    base = apply(r.topology, Placement(slots))
    alloc = r.placed.plan.allocation
    new = [Demand(x.llm, 1000 + i, alloc.llms[x.llm].gpu, alloc.llms[x.llm].tp,
                  alloc.llms[x.llm].share, _share_mem(r, x.llm)[1])
           for i, x in enumerate(r.started)]
    if place(base, new).complete:
        return False
    return place_exactly(base, new, time_limit_s=30).status != "placed"


def _share_mem(r, llm):
    inst = r.placed.plan.allocation.llms[llm]
    return inst.share, inst.memory_share * 80.0


def test_no_op_load_event_changes_nothing():
    problem, top, res = _running(0)
    wf = next(iter(problem.targets))
    r = replan(problem, top, res, LoadChanged(wf, factor=1.0), move_cost_s=1.0)
    _check(r, res, top)
    assert r.placed.plan.allocation == res.plan.allocation
    assert r.moved == r.started == r.stopped == r.lost == ()
    assert r.placed.placement.slots == res.placement.slots
    assert dict(r.problem.targets) == dict(problem.targets)


def test_failure_of_an_unused_node_changes_nothing():
    """A plan made for three of four nodes (the fourth idle) loses the idle one."""
    problem, small, res = _running(0, nodes=3)
    top = Topology("racks", (*small.nodes, Node("idle", "rack1", GPU, 8, 8, 80.0)))
    problem = replace(problem, cluster=top.to_cluster())
    r = replan(problem, top, res, NodeFailed("idle"), move_cost_s=1.0)
    _check(r, res, top)
    assert r.placed.plan.allocation == res.plan.allocation
    assert r.moved == r.started == r.stopped == r.lost == ()
    assert r.placed.placement.slots == res.placement.slots
    assert not r.topology.has_node("idle")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_load_doubling_scales_out_without_moving(seed):
    """A plan made for two nodes at half load on a cluster of four: the load doubles."""
    problem, small, res = _running(seed, nodes=2, load=0.5)
    top = Topology("racks", (*small.nodes, *(Node(f"x{i}", "rack1", GPU, 8, 8, 80.0)
                                             for i in range(2))))
    problem = replace(problem, cluster=top.to_cluster())
    wf = next(iter(problem.targets))
    r = replan(problem, top, res, LoadChanged(wf, factor=2.0), move_cost_s=1.0,
               change_penalty_s=5.0)
    _check(r, res, top)
    assert r.problem.targets[wf] == pytest.approx(2 * problem.targets[wf])
    assert r.started and not r.lost
    assert r.moved == () or _moves_needed(r)
    # the new plan carries the new targets: every LLM's replicas carry its load
    for m, c in r.placed.plan.candidates.items():
        assert c.capacity * r.problem.options.max_utilisation >= r.problem.loads[m] - 1e-9


def test_drained_rack_replicas_end_elsewhere():
    problem, top, res = _running(1)
    busy_rack = next(n.rack for n in top.nodes if n.name in res.placement.nodes())
    r = replan(problem, top, res, RackDrained(busy_rack), move_cost_s=1.0)
    _check(r, res, top)
    on_rack = {n.name for n in top.nodes if n.rack == busy_rack}
    assert r.lost and all(x.was[0] in on_rack for x in r.lost)
    assert not (r.placed.placement.nodes() & on_rack)


@pytest.mark.slow  # a long run (docs/testing.md): every tier, not the fast one
@given(st.integers(0, 5), st.sampled_from(["node", "rack", "load", "node+load"]),
       st.integers(0, 3), st.sampled_from([0.5, 1.5, 2.0]), st.sampled_from(["blocks", "auto"]))
@settings(FAST, max_examples=12)
def test_every_invariant_holds_after_every_operation(seed, kind, which, factor, formulation):
    problem, top, res = _running(seed)
    wf = sorted(problem.targets)[which % len(problem.targets)]
    node = top.nodes[which % len(top.nodes)].name
    events = {"node": [NodeFailed(node)], "rack": [RackDrained(f"rack{which % 2}")],
              "load": [LoadChanged(wf, factor=factor)],
              "node+load": [NodeFailed(node), LoadChanged(wf, factor=factor)]}[kind]
    r = replan(problem, top, res, events, move_cost_s=1.0, formulation=formulation)
    if not r.ok:  # not enough left: said so, nothing placed
        assert r.status in ("infeasible", "unplaced") and r.placed.reason
        return
    _check(r, res, top)
    assert r.moved == () or _moves_needed(r)
    # survivors of an LLM whose shape did not change are kept (up to the new count)
    after = r.placed.plan.allocation.llms
    for m, inst in res.plan.allocation.llms.items():
        if m in after and (after[m].gpu, after[m].tp, after[m].share) == (
                inst.gpu, inst.tp, inst.share):
            survivors = sum(1 for s in res.placement.slots if s.llm == m
                            and r.topology.has_node(s.node))
            mine = [x for x in r.kept + r.moved if x.llm == m]
            assert len(mine) == min(survivors, after[m].replicas)


def test_moves_are_priced():
    """Without a move cost the optimiser's plan is realised as it is; with one, a plan that
    needs fewer moves wins when the moves saved outweigh its objective (never a costlier one)."""
    problem, top, res = _running(2)
    wf = sorted(problem.targets)[0]
    events = [NodeFailed("n1"), LoadChanged(wf, factor=1.5)]
    free = replan(problem, top, res, events, move_cost_s=0.0)
    _check(free, res, top)
    assert free.moved and free.allocations == 1
    priced = replan(problem, top, res, events, move_cost_s=100.0)
    _check(priced, res, top)
    assert priced.allocations > 1 and len(priced.moved) < len(free.moved)
    assert priced.cost_s <= free.objective_s + 100.0 * len(free.moved) + 1e-9
    assert priced.moved == () or _moves_needed(priced)


def test_a_replan_of_a_plan_document_reads_back(tmp_path):
    problem, top, res = _running(2)
    doc = plan_document(problem, res, topology=top)
    run = running_from_document(json.loads(json.dumps(doc)), "plan.json")
    assert run.allocation == res.plan.allocation and run.placement.slots == res.placement.slots
    busy = sorted(res.placement.nodes())[0]
    r = replan(problem, top, run, NodeFailed(busy), move_cost_s=1.0)
    _check(r, res, top)
    assert replan(problem, top, doc, NodeFailed(busy), move_cost_s=1.0).to_dict()["moved"] == [
        m.to_dict() for m in r.moved]
    new = json.loads(json.dumps(r.document(timings=False)))
    again = running_from_document(new, "new.json")
    assert again.placement.slots == r.placed.placement.slots
    assert sorted(n["name"] for rk in new["topology"]["racks"] for n in rk["nodes"]) == sorted(
        n.name for n in r.topology.nodes)
    with pytest.raises(InputError):
        running_from_document({**doc, "placement": {**doc["placement"], "placed": False}}, "x")


def test_bad_running_placements_are_input_errors():
    problem, top, res = _running(0)
    s = res.placement.slots[0]
    moved_off = Placement(tuple(x if x.key != s.key else Slot(x.llm, x.replica, "nowhere",
                                                               x.gpus, x.share, x.memory_gib)
                                for x in res.placement.slots))
    with pytest.raises(InputError) as exc:
        replan(problem, top, Running(res.plan.allocation, moved_off), NodeFailed("n0"),
               move_cost_s=1.0)
    assert exc.value.source == "running plan"
    with pytest.raises(InputError):
        replan(problem, top, res, NodeFailed("n0"), move_cost_s=-1.0)


# ------------------------------------------------------------- fewest moves: the oracle


def _positions(top: Topology, free: dict, d: Demand):
    for n in top.nodes:
        if n.gpu != d.gpu:
            continue
        for dom in n.domains():
            for gs in itertools.combinations(dom, d.tp):
                if all(free[(n.name, g)][0] >= d.units and free[(n.name, g)][1] >= d.memory_gib
                       - 1e-6 for g in gs):
                    yield n.name, gs


def _fewest_moves(top: Topology, kept: list[Slot], new: list[Demand]) -> int | None:
    """The fewest kept replicas not on their own GPUs over every placement of the kept and the
    new replicas (exhaustive, branch and bound); None when none places them all."""
    free = {(n.name, g): [n.free_units(g), n.free_memory(g)] for n in top.nodes
            for g in range(n.gpus)}
    # the new replicas first (fewest choices), then the kept ones, largest first, home first
    items = [(d, None) for d in new] + sorted(
        [(Demand(s.llm, s.replica, GPU, len(s.gpus), s.share, s.memory_gib), (s.node, s.gpus))
         for s in kept], key=lambda x: -x[0].size)
    best = [None]

    def go(i: int, cost: int) -> None:
        if best[0] is not None and cost >= best[0]:
            return
        if i == len(items):
            best[0] = cost
            return
        d, home = items[i]
        opts = list(_positions(top, free, d))
        opts.sort(key=lambda p: p != home)
        for node, gs in opts:
            for g in gs:
                free[(node, g)][0] -= d.units
                free[(node, g)][1] -= d.memory_gib
            go(i + 1, cost + (home is not None and (node, gs) != home))
            for g in gs:
                free[(node, g)][0] += d.units
                free[(node, g)][1] += d.memory_gib

    go(0, 0)
    return best[0]


SHARES = (0.3, 0.4, 0.5, 0.6, 1.0)


@st.composite
def tiny(draw):
    """A tiny cluster, kept replicas at random feasible places (fragmented on purpose) and a
    few new replicas."""
    sizes = draw(st.lists(st.sampled_from([2, 4]), min_size=1, max_size=3))
    top = Topology("tiny", tuple(Node(f"n{i}", "r", GPU, k, k, 80.0)
                                 for i, k in enumerate(sizes)))
    free = {(n.name, g): [UNITS, 80.0] for n in top.nodes for g in range(n.gpus)}
    kept: list[Slot] = []
    for i in range(draw(st.integers(2, 6))):
        share, tp = draw(st.sampled_from(SHARES)), draw(st.sampled_from([1, 1, 1, 2]))
        d = Demand(f"k{i % 2}", i, GPU, tp, share, share * 80.0)
        opts = list(_positions(top, free, d))
        if not opts:
            continue
        node, gs = draw(st.sampled_from(opts))
        for g in gs:
            free[(node, g)][0] -= d.units
            free[(node, g)][1] -= d.memory_gib
        kept.append(Slot(d.llm, d.replica, node, gs, share, share * 80.0))
    new = []
    for j in range(draw(st.integers(1, 2))):
        share, tp = draw(st.sampled_from(SHARES)), draw(st.sampled_from([1, 2, 2, 4]))
        new.append(Demand("new", j, GPU, tp, share, share * 80.0))
    return top, kept, new


@st.composite
def spread(draw):
    """Kept single-GPU replicas on distinct GPUs of tiny nodes and one new TP group that fits
    only where several of them are gone: the fewest moves are often 2 or 3."""
    sizes = draw(st.lists(st.sampled_from([2, 4]), min_size=1, max_size=2))
    top = Topology("tiny", tuple(Node(f"n{i}", "r", GPU, k, k, 80.0)
                                 for i, k in enumerate(sizes)))
    gpus = [(n.name, g) for n in top.nodes for g in range(n.gpus)]
    where = draw(st.lists(st.sampled_from(gpus), min_size=1, max_size=6, unique=True))
    kept = []
    for i, (node, g) in enumerate(where):
        share = draw(st.sampled_from((0.3, 0.6)))
        kept.append(Slot(f"k{i % 2}", i, node, (g,), share, share * 80.0))
    tp = draw(st.sampled_from([2, 4]))
    share = draw(st.sampled_from((0.5, 0.8, 1.0)))
    new = [Demand("new", j, GPU, tp, share, share * 80.0) for j in range(draw(st.integers(1, 2)))]
    return top, kept, new


@given(st.one_of(tiny(), spread()))
@settings(FAST, max_examples=250)
def test_fewest_moves_equal_the_exhaustive_minimum(case):
    top, kept, new = case
    around = place_around(top, Placement(tuple(kept)), new)
    want = _fewest_moves(top, kept, new)
    pl = around.placement
    if want is None:
        assert not pl.complete and not around.minimal
        return
    assert pl.complete
    dem = new + [Demand(s.llm, s.replica, GPU, len(s.gpus), s.share, s.memory_gib) for s in kept]
    assert violations(top, dem, pl) == []
    assert around.minimal  # tiny: every set of kept replicas is tried
    assert len(around.moved) == want
    home = {s.key: (s.node, s.gpus) for s in kept}
    for s in pl.slots:
        if s.key in home:
            assert (s.key in around.moved) == ((s.node, s.gpus) != home[s.key])


def test_a_fragmented_node_forces_the_fewest_moves():
    """Two 0.6 replicas on two GPUs of a 2-GPU node leave no room for a TP-2 group of 0.5:
    one of them must move onto the other's GPU... which cannot hold it either, so it moves to
    the second node; the other stays."""
    top = Topology("t", (Node("a", "r", GPU, 2, 2, 80.0), Node("b", "r", GPU, 2, 2, 80.0)))
    kept = [Slot("k", 0, "a", (0,), 0.6, 48.0), Slot("k", 1, "b", (0,), 0.6, 48.0)]
    new = [Demand("n", 0, GPU, 2, 0.5, 40.0)]
    around = place_around(top, Placement(tuple(kept)), new)
    assert around.placement.complete and around.minimal and len(around.moved) == 1
    assert _fewest_moves(top, kept, new) == 1
    # the same new group fits around them on a 4-GPU node: nothing moves
    big = Topology("t", (Node("a", "r", GPU, 4, 4, 80.0),))
    kept4 = [Slot("k", 0, "a", (0,), 0.6, 48.0), Slot("k", 1, "a", (1,), 0.6, 48.0)]
    around = place_around(big, Placement(tuple(kept4)), new)
    assert around.moved == () and around.placement.complete


@pytest.mark.parametrize("nodes", [4, 32])
def test_fewest_moves_at_scale_meet_a_known_optimum(nodes):
    """Every GPU holds one kept 0.3 replica; each new TP-8 group at 0.8 needs a whole node whose
    8 GPUs are freed, so at least 8 moves per group, and 8 per group suffice (the freed replicas
    fit beside the others): the MILP proves the optimum at 256 GPUs too."""
    top = Topology("t", tuple(Node(f"n{i:02d}", "r", GPU, 8, 8, 80.0) for i in range(nodes)))
    kept = [Slot("k", i * 8 + g, f"n{i:02d}", (g,), 0.3, 24.0)
            for i in range(nodes) for g in range(8)]
    groups = max(1, nodes // 8)
    new = [Demand("big", j, GPU, 8, 0.8, 64.0) for j in range(groups)]
    around = place_around(top, Placement(tuple(kept)), new)
    dem = new + [Demand(s.llm, s.replica, GPU, 1, 0.3, 24.0) for s in kept]
    assert around.placement.complete and violations(top, dem, around.placement) == []
    assert around.minimal and len(around.moved) == 8 * groups


# ------------------------------------------------------------------------------- CLI


RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
A16 = str(REPO / "datasets" / "clusters" / "a100-16.yaml")
TRACE = ["--trace-requests", "300"]


@pytest.fixture
def scepsy():
    """``scepsy ARGV`` in-process (tests/conftest.py's run_cli)."""
    from conftest import run_cli

    return run_cli


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    from conftest import run_cli

    out = tmp_path_factory.mktemp("replan") / "plan.json"
    code, _, err = run_cli("plan", "--workflow", RAG, "--cluster", A16, "--target", "4",
                           "--out", str(out), *TRACE)
    assert code == 0, err
    return out


def test_cli_replans_after_a_node_failure(scepsy, plan_file, tmp_path):
    doc = json.loads(plan_file.read_text())
    busy = doc["placement"]["instances"][0]["node"]
    out = tmp_path / "new.json"
    code, text, err = scepsy("replan", "--plan", str(plan_file), "--workflow", RAG, "--cluster",
                             A16, "--event", f"node-failed={busy}", "--out", str(out), *TRACE)
    assert code == 0, err
    assert "lost" in text and "kept" in text and str(out) in text
    new = json.loads(out.read_text())
    assert new["placement"]["placed"] and not any(
        i["node"] == busy for i in new["placement"]["instances"])
    assert busy not in [n["name"] for r in new["topology"]["racks"] for n in r["nodes"]]
    # the new plan is a running plan again: a second event without --cluster (its own nodes)
    code, text, err = scepsy("replan", "--plan", str(out), "--workflow", RAG,
                             "--event", "load=rag*0.5", "--out", str(tmp_path / "n2.json"),
                             "--json", *TRACE)
    assert code == 0, err
    rep = json.loads(text)
    assert rep["events"] == ["load=rag*0.5"] and rep["status"] == "placed"
    assert rep["targets"]["rag"] == pytest.approx(2.0) and rep["lost"] == []


def test_cli_no_plan_left_exits_1(scepsy, plan_file, tmp_path):
    out = tmp_path / "new.json"
    code, _, err = scepsy("replan", "--plan", str(plan_file), "--workflow", RAG, "--cluster",
                          A16, "--event", "node-failed=A100-80GB-0", "--event", "load=rag=1000",
                          "--out", str(out), *TRACE)
    assert code == 1 and "infeasible" in err and len(err.strip().splitlines()) == 1
    # the event's load is what the cluster cannot serve (named, with its rate), not the plan
    assert "the cluster left after node-failed=A100-80GB-0 cannot serve the load of " \
        "load=rag=1000 (rag 1000 req/s)" in err and "lower the load" in err
    doc = json.loads(out.read_text())
    assert doc["status"] == "infeasible" and "allocation" not in doc


@pytest.mark.parametrize("args, words", [
    (["--event", "node-failed=nope"], ["--event", "node-failed", "nope"]),
    (["--event", "load=rag+2"], ["--event", "load"]),
    (["--event", "load=other*2"], ["--event", "workflow", "other"]),
    (["--event", "explode=now"], ["--event", "kind"]),
    (["--event", "load=rag*2", "--move-cost", "-1"], ["--move-cost"]),
    (["--event", "load=rag*2", "--tp", "0"], ["--tp"]),
    (["--event", "load=rag*1e12"], ["--event", "load=rag*1e+12", "1e+06] requests/s"]),
    (["--event", "load=rag=2e6"], ["--event", "load=rag=2e+06"]),
])
def test_cli_bad_input_is_one_line_exit_2(scepsy, plan_file, tmp_path, args, words):
    out = tmp_path / "new.json"
    code, _, err = scepsy("replan", "--plan", str(plan_file), "--workflow", RAG,
                          "--out", str(out), *TRACE, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert all(w in err for w in words), err
    assert not out.exists()


def test_cli_a_plan_without_placement_is_an_input_error(scepsy, plan_file, tmp_path):
    doc = json.loads(plan_file.read_text())
    doc["placement"]["placed"] = False
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, _, err = scepsy("replan", "--plan", str(bad), "--workflow", RAG, "--event",
                          "load=rag*2", "--out", str(tmp_path / "o.json"), *TRACE)
    assert code == 2 and "placement" in err
