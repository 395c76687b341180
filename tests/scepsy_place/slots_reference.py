"""Reference copies of slot-group helpers as they were before they were made fast at scale
(scepsy_place.formulations.slots, commit 3020230): the oracles the fast versions must equal."""

# ruff: noqa
from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from dataclasses import replace
from typing import cast

from scepsy_opt.planning.problem import PlanningProblem
from scepsy_place.formulations.slots import POLICY, Part, SlotSolution, on_nodes
from scepsy_place.packing.placement import Placement, whole_free_gpus
from scepsy_place.packing.replicas import Demand, Slot
from scepsy_place.packing.topology import Topology


def layout(topology: Topology, solution: SlotSolution, demands: Sequence[Demand]) -> Placement:
    """A concrete placement of ``demands`` in ``solution``'s slot groups on ``topology``'s
    wholly free GPUs, in one pass: per GPU type, groups largest first into each NVLink domain's
    free GPUs (multiples of the size, so every group fits when the domain rows hold); then level
    by level, largest TP degree first, the pieces of the level (its groups' slots and the pieces
    split from the level above) less those the solution passes down, matched largest share to
    largest piece with the level's replicas (Hall's condition, which the solution's rows hold).
    A replica left without a piece is unplaced, with the reason (never when the demands are the
    solution's replicas)."""
    slots: list[Slot] = []
    unplaced: list[tuple[str, int, str]] = []
    by_gpu: dict[str, list[Demand]] = {}
    for d in demands:
        by_gpu.setdefault(d.gpu, []).append(d)
    groups = solution.groups
    for gpu in sorted({g for g, _ in groups} | set(by_gpu)):
        domains = [(n.name, list(free)) for n, _, free in whole_free_gpus(topology, gpu)]
        levels = sorted({t for g, t in groups if g == gpu} | {d.tp for d in by_gpu.get(gpu, ())}
                        | {t for g, t, _ in solution.passed if g == gpu}, reverse=True)
        own: dict[int, list[tuple[int, str, tuple[int, ...]]]] = {t: [] for t in levels}
        for t in levels:
            for c, count in groups.get((gpu, t), ()):
                for _ in range(count):
                    spot = next((i for i, (_, f) in enumerate(domains) if len(f) >= t), None)
                    if spot is None:
                        break
                    node, f = domains[spot]
                    ids = tuple(f[:t])
                    domains[spot] = (node, f[t:])
                    own[t].extend((z, node, ids) for z in c)
        from_above: list[tuple[int, str, tuple[int, ...]]] = []
        for j, t in enumerate(levels):
            pieces = sorted(own[t] + from_above, key=lambda p: (-p[0], p[1], p[2]))
            below = levels[j + 1] if j + 1 < len(levels) else None
            from_above = []
            if below is not None:
                for z in sorted({p[0] for p in pieces}):
                    k = solution.passed.get((gpu, t, z), 0)
                    mine = [p for p in pieces if p[0] == z]
                    give = mine[len(mine) - k:] if k else []
                    for p in give:
                        pieces.remove(p)
                        from_above.extend((z, p[1], p[2][i:i + below])
                                          for i in range(0, t, below))
            reps = sorted((d for d in by_gpu.get(gpu, ()) if d.tp == t),
                          key=lambda d: (-d.units, d.llm, d.replica))
            for i, d in enumerate(reps):
                if i < len(pieces) and pieces[i][0] >= d.units:
                    _, node, ids = pieces[i]
                    slots.append(Slot(d.llm, d.replica, node, ids, d.share, d.memory_gib))
                else:
                    unplaced.append((d.llm, d.replica, "no slot of its size left in the slot "
                                     "groups"))
    return Placement(tuple(slots), tuple(unplaced), POLICY, POLICY)


def _dealt(llms: Sequence[str], per: Mapping[str, Mapping[str | None, float]],
           kind: Sequence[str | None], capacity: Sequence[float],
           seed: Mapping[int, str]) -> list[list[str]]:
    """``llms`` (in order) each to the part whose need per unit of ``capacity`` stays least
    with it (the first of equals; ``per[m][kind]``: on a part of one GPU type the need on that
    type, on a mixed part (kind None) the need blended by the cluster's mix), the LLMs of
    ``seed`` (part -> LLM) fixed to their parts."""
    k = len(capacity)
    got: list[list[str]] = [[] for _ in range(k)]
    total = [0.0] * k
    fixed = set(seed.values())
    for i, m in sorted(seed.items()):
        got[i].append(m)
        total[i] += per[m][kind[i]]
    for m in llms:
        if m in fixed:
            continue
        i = min(range(k), key=lambda j: ((total[j] + per[m][kind[j]]) / capacity[j], j))
        got[i].append(m)
        total[i] += per[m][kind[i]]
    return got


def _highest_averages(weights: Sequence[float], n: int, *, least: Sequence[int] | None = None,
                      classes: Sequence[str | None] | None = None,
                      most: Mapping[str, int] | None = None) -> list[int]:
    """``n`` whole things to parts in proportion to ``weights``: every part its ``least``
    first (default one; as far as its class has things left), then one at a time to the part of the largest weight per thing so
    far (the first of equals; D'Hondt's rule, which keeps the largest weight per thing as
    small as it can be). With ``classes`` and ``most``, the parts of a class take at most
    ``most[class]`` things together (a part of class None any). Fewer than ``n`` when every
    part is full."""
    k = len(weights)
    cls = list(classes) if classes is not None else [None] * k
    # keyed by class, looked up by a part's class or None (a part of no class: never a key)
    cap = cast(dict[str | None, int], dict(most or {}))
    got = [0] * k
    used = dict.fromkeys(cap, 0)
    for j, want in enumerate(least if least is not None else [1] * k):  # within the classes
        got[j] = want if cls[j] not in cap else max(0, min(want, cap[cls[j]] - used[cls[j]]))
        if cls[j] in cap:
            used[cls[j]] += got[j]
    for _ in range(max(0, n - sum(got))):
        ok = [j for j in range(k) if cls[j] is None or used.get(cls[j], 0) < cap.get(cls[j], n)]
        if not ok:
            break
        i = max(ok, key=lambda j: (weights[j] / max(got[j], 1e-9), -j))
        got[i] += 1
        c = cls[i]
        if c is not None:
            used[c] = used.get(c, 0) + 1
    return got


def _sub(problem: PlanningProblem, topology: Topology, part: Part,
         ) -> tuple[PlanningProblem, Topology]:
    """``problem`` restricted to the part's LLMs (the workflows that call only them) and
    ``topology`` to its nodes."""
    keep = set(part.nodes)
    sub_top = Topology(f"{topology.name}/part",
                       tuple(n for n in topology.nodes if n.name in keep))
    mine = set(part.llms)
    targets = {w: t for w, t in problem.targets.items() if set(problem.stats[w].llms) <= mine}
    return replace(on_nodes(problem, sub_top), targets=MappingProxyType(targets)), sub_top
