"""The placeable-by-construction formulation: whole-GPU blocks of one LLM shape.

Oracles: the capacity rows' guarantee (every block set they admit is placed, on random
topologies with GPUs in use), brute force over every block candidate for the MILP, the full
candidate set for reduced-cost fixing, and the aggregate bound below every placed plan.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy.cli import main
from scepsy_common.units import UNITS, gpu_units, replicas_per_gpu, share_units
from scepsy_opt.allocation import Allocation, Instance
from scepsy_opt.planning.candidates import generate_candidates
from scepsy_opt.planning.instances import random_problem
from scepsy_opt.planning.milp import solve_min_latency
from scepsy_opt.planning.problem import PlanOptions
from scepsy_place import Demand, Node, Topology, demands, place, violations
from scepsy_place.formulations import blocks as blocks_mod
from scepsy_place.formulations.blocks import (
    block_candidates,
    capacity_rows,
    fewest_block_gpus,
    level_capacity,
)
from scepsy_place.formulations.loop import plan_and_place, plan_blocks
from scepsy_place.packing.topology import from_cluster
from scepsy_profile.roofline import roofline_model

ROOF = roofline_model()
GPU = "A100-80GB"
SHARES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
FAST = settings(derandomize=True, deadline=None, database=None, max_examples=60,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def busy_topology(draw):
    """1-4 nodes of 2, 4 or 8 A100s in power-of-two NVLink domains, some GPUs partly in use."""
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from([2, 4, 8]))
        dom = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= gpus]))
        used = tuple((0.3, 24.0) if draw(st.booleans()) and draw(st.booleans()) else (0.0, 0.0)
                     for _ in range(gpus))
        nodes.append(Node(f"n{i}", f"r{i % 2}", GPU, gpus, dom, 80.0, used))
    return Topology("busy", tuple(nodes))


def block_gpus(inst: Instance) -> int:
    return inst.tp * math.ceil(inst.replicas / replicas_per_gpu(inst.share))


def rows_hold(topology: Topology, alloc: Allocation) -> bool:
    """The capacity rows for an allocation taken as blocks."""
    tps = sorted({i.tp for i in alloc.llms.values()})
    return all(sum(block_gpus(i) for i in alloc.llms.values() if i.tp >= t)
               <= level_capacity(topology, GPU, t) for t in tps)


@FAST
@given(top=busy_topology(), shapes=st.lists(
    st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from(SHARES), st.integers(1, 7)),
    min_size=1, max_size=4))
def test_every_block_set_the_rows_admit_is_placed(top, shapes):
    """The rows are sufficient (TP degrees dividing one another); the placement breaks no
    invariant, never touches a GPU in use and never mixes LLMs on a GPU."""
    alloc = Allocation({f"m{i}": Instance(GPU, tp, share, r) for i, (tp, share, r) in enumerate(shapes)})
    ds = demands(alloc)
    pl = place(top, ds, "blocks")
    assert violations(top, ds, pl) == []
    if rows_hold(top, alloc):
        assert pl.complete, pl.unplaced
    owners: dict[tuple[str, int], set[str]] = {}
    for s in pl.slots:
        node = top.node(s.node)
        for g in s.gpus:
            assert node.used[g] == (0.0, 0.0)
            owners.setdefault((s.node, g), set()).add(s.llm)
        assert len({node.domain(g) for g in s.gpus}) == 1
    assert all(len(v) == 1 for v in owners.values())


def test_rows_are_necessary_too():
    """One more GPU than a level's capacity leaves a block unplaced."""
    top = Topology("t", (Node("a", "r", GPU, 4, 4, 80.0, ((0.5, 40.0),) + ((0.0, 0.0),) * 3),))
    assert level_capacity(top, GPU, 2) == 2 and level_capacity(top, GPU, 1) == 3
    fits = Allocation({"x": Instance(GPU, 2, 0.5, 2), "y": Instance(GPU, 1, 1.0, 1)})
    assert rows_hold(top, fits) and place(top, demands(fits), "blocks").complete
    over = Allocation({"x": Instance(GPU, 2, 0.5, 3)})  # two blocks of 2 GPUs: level 2 holds 2
    assert not rows_hold(top, over) and not place(top, demands(over), "blocks").complete


def _brute_force(problem, topology):
    """The cheapest combination of block candidates (all of them, unpruned) within the rows."""
    cands = generate_candidates(problem, blocks=True, prune=False).by_llm
    best = math.inf
    for combo in itertools.product(*(cands[m] for m in problem.llms)):
        rows = capacity_rows(topology, {c.llm: [c] for c in combo})
        if all(sum(coef for c, coef in row.items() if c in combo) <= rhs for row, rhs in rows):
            best = min(best, math.fsum(sorted(c.cost for c in combo)))
    return best + problem.constant_s


@settings(FAST, max_examples=25)
@given(n=st.integers(1, 2), gpus=st.sampled_from([2, 4, 8]), seed=st.integers(0, 10**6),
       load=st.sampled_from([0.3, 0.6, 0.9]))
def test_blocks_milp_equals_brute_force(n, gpus, seed, load):
    p = random_problem(n, gpus, ROOF, seed=seed, load=load)
    top = from_cluster(p.cluster)
    res = plan_blocks(p, top)
    oracle = _brute_force(p, top)
    if math.isinf(oracle):
        assert res.plan.allocation is None and not res.placed
        return
    assert res.placed and res.rounds == 1 and res.formulation == "blocks"
    assert res.plan.objective_s == pytest.approx(oracle, rel=1e-9)
    # the aggregate optimum is a lower bound on every placed plan
    assert solve_min_latency(p).objective_s <= res.plan.objective_s * (1 + 1e-9)


@settings(FAST, max_examples=40)
@given(n=st.integers(1, 4), gpus=st.sampled_from([1, 2, 4, 8, 16]), seed=st.integers(0, 10**6),
       load=st.sampled_from([0.3, 0.9, 1.5, 3.0]), memory=st.booleans())
def test_fewest_block_gpus_is_below_every_block_candidate(n, gpus, seed, load, memory):
    """The counting bound never exceeds the GPUs of any block candidate (every one, unpruned,
    with compute and memory shares tied or a memory grid of their own)."""
    opts = PlanOptions(memory_shares=(0.25, 0.5, 1.0)) if memory else None
    p = random_problem(n, gpus, ROOF, seed=seed, load=load, options=opts)
    fewest = fewest_block_gpus(p)
    cands = generate_candidates(p, blocks=True, prune=False)
    if fewest is None:
        assert cands.unfit
        return
    for m in p.llms:
        assert all(c.units % UNITS == 0 and fewest[m] <= c.units // UNITS for c in cands.by_llm[m])
        assert fewest[m] >= 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocks_that_cannot_fit_are_refused_before_their_candidates(seed, monkeypatch):
    """Three times the load the cluster's fewest-GPU plan carries: the LLMs need more whole
    GPUs than there are, which the counting bound says without generating a candidate; brute
    force over every block candidate agrees that none fits."""
    p = random_problem(2, 4, ROOF, seed=seed, load=3.0)
    top = from_cluster(p.cluster)
    assert sum(fewest_block_gpus(p).values()) > 4

    def never(*a, **k):
        raise AssertionError("block candidates generated")

    monkeypatch.setattr("scepsy_place.formulations.placed.block_candidates", never)
    res = plan_blocks(p, top)
    assert res.status == "unplaced" and not res.placed and res.plan.allocation is None
    assert "wholly free" in res.reason
    monkeypatch.undo()
    assert math.isinf(_brute_force(p, top))


@pytest.mark.parametrize(("n", "gpus", "seed"), [(4, 16, 0), (6, 32, 1), (5, 24, 2)])
def test_reduced_block_candidates_keep_the_optimum(n, gpus, seed, monkeypatch):
    p = random_problem(n, gpus, ROOF, seed=seed)
    top = from_cluster(p.cluster)
    full = plan_blocks(p, top)
    monkeypatch.setattr(blocks_mod, "REDUCE_MIN_GPUS", 1)
    reduced = block_candidates(p, top)
    assert reduced.kept <= generate_candidates(p, blocks=True).kept
    again = plan_blocks(p, top)
    assert again.plan.objective_s == pytest.approx(full.plan.objective_s, rel=1e-9)
    assert again.placed and full.placed


def test_block_units_count_whole_gpus_and_full_blocks_only():
    p = random_problem(3, 8, ROOF, seed=4)
    for cs in generate_candidates(p, blocks=True, prune=False).by_llm.values():
        for c in cs:
            k = replicas_per_gpu(c.share)
            assert c.replicas % k == 0
            assert c.units == UNITS * c.tp * c.replicas // k


def test_blocks_use_only_free_gpus_when_replanning():
    """A busy cluster: the block plan avoids the GPUs in use and still places in one round."""
    p = random_problem(3, 16, ROOF, seed=5, load=0.3)
    free = from_cluster(p.cluster)
    node = free.nodes[0]
    busy = free.with_nodes([Node(node.name, node.rack, node.gpu, node.gpus, node.nvlink_domain,
                                 node.memory_gib, ((0.5, 40.0),) * node.gpus), *free.nodes[1:]])
    res = plan_blocks(p, busy)
    if res.placed:
        assert node.name not in res.placement.nodes()
    else:
        assert res.reason


@pytest.mark.parametrize(("n", "gpus", "seed"), [(3, 8, 0), (4, 16, 1), (5, 16, 7)])
def test_auto_keeps_the_better_placed_plan(n, gpus, seed):
    p = random_problem(n, gpus, ROOF, seed=seed)
    top = from_cluster(p.cluster)
    runs = {name: plan_and_place(p, top, formulation=name)
            for name in ("blocks", "slots", "aggregate")}
    auto = plan_and_place(p, top, formulation="auto")
    assert auto.placed
    assert set(auto.compared) == set(runs)
    best = min(x.plan.objective_s for x in runs.values() if x.placed)
    assert auto.plan.objective_s == pytest.approx(best, rel=1e-12)
    # the first run of the best (blocks, then slots, then the aggregate loop, which stops at
    # the objective in hand)
    first = next(k for k, x in runs.items()
                 if x.placed and x.plan.objective_s <= best * (1 + 1e-12))
    assert auto.formulation == first


def test_auto_skips_the_aggregate_loop_above_the_loop_size(monkeypatch):
    import scepsy_place.formulations.loop as loop

    p = random_problem(3, 16, ROOF, seed=3)
    monkeypatch.setattr(loop, "UNPRUNED_MAX_GPUS", 8)
    res = plan_and_place(p, from_cluster(p.cluster), formulation="auto")
    assert res.placed and "blocks" in res.compared and "aggregate" not in res.compared
    assert res.formulation in ("blocks", "slots", "patterns")


def test_unknown_formulation_is_an_input_error():
    from scepsy_common.errors import InputError

    p = random_problem(2, 4, ROOF, seed=0)
    with pytest.raises(InputError, match="formulation"):
        plan_and_place(p, from_cluster(p.cluster), formulation="columns")  # type: ignore[arg-type]


def test_plan_cli_blocks(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["plan", "--workflow", "datasets/workflows/rag.yaml", "--cluster",
               "datasets/clusters/a100-16.yaml", "--target", "2", "--trace-requests", "100",
               "--formulation", "blocks", "--no-timings", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    pl = doc["placement"]
    assert pl["formulation"] == "blocks" and pl["policy"] == "blocks" and pl["placed"]
    assert pl["rounds"] == 1 and pl["instances"]
    assert "blocks formulation" in capsys.readouterr().out
    code = main(["plan", "--workflow", "datasets/workflows/rag.yaml", "--cluster",
                 "datasets/clusters/a100-16.yaml", "--target", "2", "--formulation", "magic"])
    assert code == 2
    assert "--formulation" in capsys.readouterr().err


# --------------------------------------------------------------------------- one share-to-units rule


@settings(FAST, max_examples=200)
@given(share=st.one_of(st.sampled_from([1 / 3, 0.2501, 0.1 + 0.2, 0.999, 0.0005, 1 / 7, 0.25]),
                       st.floats(1e-4, 1.0)),
       name=st.sampled_from(["hierarchical", "ffd", "best-fit", "blocks"]))
def test_planner_placers_and_checker_count_a_share_alike(share, name):
    """``share_units`` is the only rule: the planner's units, a demand's units and a used share's
    units agree, ``replicas_per_gpu`` replicas of a share fit one GPU for every placer and the
    checker, and one more does not (three 1/3 shares take 334 units each: two per GPU)."""
    u = share_units(share)
    assert u == gpu_units(1, share) == Demand("m", 0, GPU, 1, share, 0.0).units
    assert gpu_units(4, share, 3) == 12 * u
    assert math.ceil(share * UNITS - 1e-6) <= u <= math.ceil(share * UNITS) and u >= 1
    k = replicas_per_gpu(share)
    assert k * u <= UNITS < (k + 1) * u
    used = Node("u", "r", GPU, 1, 1, 80.0, ((share, 0.0),))
    assert used.free_units(0) == UNITS - u
    one = Topology("one", (Node("n", "r", GPU, 1, 1, 80.0),))
    fit = [Demand("m", r, GPU, 1, share, 0.0) for r in range(k)]
    pl = place(one, fit, name)
    assert pl.complete and violations(one, fit, pl) == []
    over = [*fit, Demand("m", k, GPU, 1, share, 0.0)]
    pl = place(one, over, name)
    assert len(pl.unplaced) == 1 and violations(one, over, pl) == []


def test_blocks_never_overfill_a_gpu():
    """Four 0.2501 shares need 1.0004 GPUs: a block holds three, the fourth opens a GPU."""
    two = Topology("two", (Node("n", "r", GPU, 2, 2, 80.0),))
    ds = demands(Allocation({"m": Instance(GPU, 1, 0.2501, 4)}))
    assert replicas_per_gpu(0.2501) == 3
    pl = place(two, ds, "blocks")
    assert violations(two, ds, pl) == []
    assert pl.complete and sorted(pl.per_gpu().values()) == [251, 753]
    one = Topology("one", (Node("n", "r", GPU, 1, 1, 80.0),))
    pl = place(one, ds, "blocks")
    assert violations(one, ds, pl) == [] and len(pl.unplaced) == 1
    assert "wholly free" in pl.unplaced[0][2]


def test_blocks_respect_memory_and_say_so():
    """A block takes as many replicas as the GPU's memory holds (four 0.25 shares of 30 GiB:
    two per 80 GiB GPU); a replica that needs more memory than any GPU of its type is unplaced
    for that reason, by every placer."""
    two = Topology("two", (Node("n", "r", GPU, 2, 2, 80.0),))
    ds = [Demand("m", r, GPU, 1, 0.25, 30.0) for r in range(4)]
    pl = place(two, ds, "blocks")
    assert pl.complete and violations(two, ds, pl) == []
    assert [sum(g in s.gpus for s in pl.slots) for g in (0, 1)] == [2, 2]  # 60 of 80 GiB each
    three = [*ds, Demand("m", 4, GPU, 1, 0.25, 30.0)]
    pl = place(two, three, "blocks")
    assert len(pl.unplaced) == 1 and "wholly free" in pl.unplaced[0][2]
    big = [Demand("h", 0, GPU, 1, 0.5, 100.0)]
    for name in ("blocks", "hierarchical", "ffd", "best-fit"):
        pl = place(two, big, name)
        assert violations(two, big, pl) == []
        assert "needs 100 GiB per GPU, more than a A100-80GB has (80 GiB)" in pl.unplaced[0][2]
