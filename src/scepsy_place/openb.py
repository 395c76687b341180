"""Online replay of the Alibaba GPU-sharing trace (openb), as in FGD (Weng et al., ATC'23).

Tasks arrive one at a time onto the cluster; each is placed by a policy or counted as failed (and
skipped). The workload is the trace's tasks plus copies sampled from it with replacement (seeded)
until requested GPU reaches ``until`` (1.3) x cluster GPU capacity, shuffled with the same seed --
the artifact's ``-tune 1.3 -tuneseed N --shuffle-pod=true``. The allocation ratio (allocated GPU
capacity / total) and FGD's fragmentation are recorded when the arrived demand (cumulative
requested GPU / capacity, failed tasks included) first reaches 100% and at the end.

See docs/openb.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from scepsy_place.fgd import MILLI, fragmentation_batch, typical_tasks

__all__ = [
    "POLICIES", "TIES", "ClusterState", "NodeSpec", "OpenBError", "ReplayResult", "Snapshot", "Task",
    "build_workload", "main", "read_nodes", "read_pods", "replay", "run_cli",
]

# Best-fit normalisers of the artifact (gpushareutils.MaxSpecCpu / MaxSpecGpu).
MAX_SPEC_CPU = 128000
MAX_SPEC_GPU = 8000


class OpenBError(ValueError):
    """Bad input file: the message names file, line and field."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str = ""


@dataclass(frozen=True)
class Task:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU: < 1000 only with num_gpu == 1 (a shared GPU)
    gpu_spec: str = ""  # "A|B": allowed GPU models; "" = any

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli


# ----------------------------------------------------------------------------- input

def _read_csv(path: str | Path, required: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    path = Path(path)
    try:
        fh = path.open(newline="")
    except OSError as e:
        raise OpenBError(f"{path}: cannot read ({e.strerror})") from None
    with fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise OpenBError(f"{path}, line 1: missing column(s) {', '.join(missing)}; expected "
                             f"{', '.join(required)}")
        return [(i, row) for i, row in enumerate(reader, start=2)]


def _int(path: Path | str, line: int, row: dict, name: str, lo: int, hi: int | None = None) -> int:
    raw = (row.get(name) or "").strip()
    try:
        v = int(raw)
    except ValueError:
        try:
            f = float(raw)
        except ValueError:
            f = math.nan
        if not f.is_integer():
            raise OpenBError(f"{path}, line {line}, field {name}: expected an integer, got "
                             f"{raw!r}") from None
        v = int(f)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise OpenBError(f"{path}, line {line}, field {name}: expected an integer {rng}, got {v}")
    return v


def read_nodes(path: str | Path) -> list[NodeSpec]:
    """Nodes CSV (``sn,cpu_milli,memory_mib,gpu,model``); one NVLink domain per node."""
    rows = _read_csv(path, ["sn", "cpu_milli", "memory_mib", "gpu"])
    nodes, seen = [], set()
    for line, row in rows:
        name = (row.get("sn") or "").strip()
        if not name:
            raise OpenBError(f"{path}, line {line}, field sn: empty node name")
        if name in seen:
            raise OpenBError(f"{path}, line {line}, field sn: duplicate node name {name!r}")
        seen.add(name)
        nodes.append(NodeSpec(name, _int(path, line, row, "cpu_milli", 0),
                              _int(path, line, row, "memory_mib", 0),
                              _int(path, line, row, "gpu", 0, 64),
                              (row.get("model") or "").strip()))
    if not nodes:
        raise OpenBError(f"{path}: no nodes")
    if sum(n.gpus for n in nodes) == 0:
        raise OpenBError(f"{path}: the cluster has no GPUs")
    return nodes


def read_pods(path: str | Path) -> list[Task]:
    """Pods CSV (``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...,creation_time]``).

    Rows keep file order, or creation_time order (stable) when that column exists.
    """
    rows = _read_csv(path, ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"])
    tasks, created = [], []
    has_time = bool(rows) and "creation_time" in rows[0][1]
    for line, row in rows:
        name = (row.get("name") or "").strip() or f"line-{line}"
        n = _int(path, line, row, "num_gpu", 0, 64)
        g = _int(path, line, row, "gpu_milli", 0, MILLI)
        if n == 0 and g != 0:
            raise OpenBError(f"{path}, line {line}, field gpu_milli: expected 0 when num_gpu is 0, "
                             f"got {g}")
        if n > 0 and g == 0:
            raise OpenBError(f"{path}, line {line}, field gpu_milli: expected 1..1000 when "
                             f"num_gpu is {n}, got 0")
        if n > 1 and g != MILLI:
            raise OpenBError(f"{path}, line {line}, field gpu_milli: multi-GPU tasks take whole "
                             f"GPUs, expected 1000, got {g}")
        tasks.append(Task(name, _int(path, line, row, "cpu_milli", 0),
                          _int(path, line, row, "memory_mib", 0), n, g,
                          (row.get("gpu_spec") or "").strip()))
        if has_time:
            raw = (row.get("creation_time") or "").strip()
            created.append(_int(path, line, row, "creation_time", -2**62) if raw else 0)
    if has_time:
        order = sorted(range(len(tasks)), key=lambda i: created[i])
        tasks = [tasks[i] for i in order]
    return tasks


# ----------------------------------------------------------------------------- state

class ClusterState:
    """Free CPU, memory and per-GPU milli of every node (numpy; padded GPU slots hold -1)."""

    def __init__(self, nodes: Sequence[NodeSpec]):
        self.nodes = list(nodes)
        n = len(self.nodes)
        self.max_gpus = max(1, max(x.gpus for x in self.nodes))
        self.cpu_cap = np.array([x.cpu_milli for x in self.nodes], dtype=np.int64)
        self.mem_cap = np.array([x.memory_mib for x in self.nodes], dtype=np.int64)
        self.gpu_count = np.array([x.gpus for x in self.nodes], dtype=np.int64)
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.gpu_free = np.full((n, self.max_gpus), -1, dtype=np.int64)
        for i, x in enumerate(self.nodes):
            self.gpu_free[i, :x.gpus] = MILLI
        self.models = [x.model for x in self.nodes]
        self.gpu_capacity = int(self.gpu_count.sum()) * MILLI
        # rank of each node's name in lexicographic order (the artifact's tie-break)
        self.name_rank = np.empty(n, dtype=np.int64)
        self.name_rank[sorted(range(n), key=lambda i: self.nodes[i].name)] = np.arange(n)
        self._spec_cache: dict[str, np.ndarray] = {}

    def free_for_frag(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Free milli per GPU with padding as 0 (what the fragmentation measure sees)."""
        return np.maximum(self.gpu_free[rows], 0)

    def allocated_gpu_milli(self) -> int:
        return self.gpu_capacity - int(np.maximum(self.gpu_free, 0).sum())

    def _spec_mask(self, spec: str) -> np.ndarray | None:
        if not spec:
            return None
        if spec not in self._spec_cache:
            allowed = set(spec.split("|"))
            self._spec_cache[spec] = np.array([m in allowed for m in self.models])
        return self._spec_cache[spec]

    def feasible(self, t: Task) -> np.ndarray:
        """Boolean mask of nodes that can host ``t`` now."""
        ok = (self.cpu_free >= t.cpu_milli) & (self.mem_free >= t.memory_mib)
        if t.num_gpu > 0:
            ok &= (self.gpu_free >= t.gpu_milli).sum(axis=1) >= t.num_gpu
            spec = self._spec_mask(t.gpu_spec)
            if spec is not None:
                ok &= spec
        return ok

    def place(self, node: int, gpus: Sequence[int], t: Task) -> None:
        """Commit ``t`` on ``node`` / ``gpus``; raises if anything would be over-allocated."""
        if len(gpus) != t.num_gpu or len(set(gpus)) != len(gpus):
            raise ValueError(f"task {t.name}: needs {t.num_gpu} distinct GPUs, got {list(gpus)}")
        if self.cpu_free[node] < t.cpu_milli or self.mem_free[node] < t.memory_mib:
            raise ValueError(f"task {t.name}: CPU/memory over-allocated on node {node}")
        for j in gpus:
            if not 0 <= j < self.gpu_count[node] or self.gpu_free[node, j] < t.gpu_milli:
                raise ValueError(f"task {t.name}: GPU {j} of node {node} over-allocated")
        self.cpu_free[node] -= t.cpu_milli
        self.mem_free[node] -= t.memory_mib
        for j in gpus:
            self.gpu_free[node, j] -= t.gpu_milli


# ----------------------------------------------------------------------------- policies

@dataclass
class Context:
    """What a policy may use: the seeded tie-break generator, FGD's task mix, options."""

    rng: np.random.Generator
    mix_n: np.ndarray
    mix_g: np.ndarray
    mix_cpu: np.ndarray
    mix_p: np.ndarray
    quantize: bool = True  # integer scores 0..100 as kube-scheduler plugins return (the artifact)
    node_frag: np.ndarray | None = None  # cached FGD fragmentation of every node
    tie: str = "name"  # or "least-allocated", "random" (see replay)

    def frag(self, free: np.ndarray, cpu_free: np.ndarray) -> np.ndarray:
        return fragmentation_batch(free, self.mix_n, self.mix_g, self.mix_p,
                                   cpu_free=cpu_free, cpu_req=self.mix_cpu)


Choice = tuple[int, list[int]] | None
Policy = Callable[[ClusterState, Task, Context], Choice]


def _pick_max(scores: np.ndarray, rng: np.random.Generator) -> int:
    """Index of the highest score; ties broken at random (kube-scheduler's selectHost)."""
    best = np.flatnonzero(scores == scores.max())
    return int(best[0]) if len(best) == 1 else int(rng.choice(best))


def _pick_node(scores: np.ndarray, nodes: np.ndarray, state: ClusterState, t: Task,
               ctx: Context) -> int:
    """Position in ``nodes`` of the best score. Ties: ``ctx.tie == "name"`` takes the node whose
    name sorts first (the artifact's patched kube-scheduler ``selectHost``: "for reproducibility,
    choose the smallest lexicographical order"); ``"least-allocated"`` the node with most
    CPU/memory left after placing, then a seeded random one; ``"random"`` a seeded random one
    (stock kube-scheduler)."""
    if ctx.tie == "name":
        best = np.flatnonzero(scores == scores.max())
        return int(best[np.argmin(state.name_rank[nodes[best]])])
    if ctx.tie == "least-allocated":
        cpu = (state.cpu_free[nodes] - t.cpu_milli) / np.maximum(state.cpu_cap[nodes], 1)
        mem = (state.mem_free[nodes] - t.memory_mib) / np.maximum(state.mem_cap[nodes], 1)
        scores = scores * 1000.0 + np.trunc((cpu + mem) * 50.0)
    return _pick_max(scores, ctx.rng)


def _whole_gpus(state: ClusterState, node: int, t: Task) -> list[int]:
    """First ``num_gpu`` GPUs with enough free capacity (the artifact's exclusive allocation)."""
    return [int(j) for j in np.flatnonzero(state.gpu_free[node] >= t.gpu_milli)[:t.num_gpu]]


def _is_shared(t: Task) -> bool:
    return t.num_gpu == 1 and t.gpu_milli < MILLI


def _tightest_gpu(state: ClusterState, node: int, t: Task) -> list[int]:
    row = state.gpu_free[node]
    left = np.where(row >= t.gpu_milli, row - t.gpu_milli, np.iinfo(np.int64).max)
    return [int(np.argmin(left))]


def _gpus_for(state: ClusterState, node: int, t: Task, shared_pick=_tightest_gpu) -> list[int]:
    if t.num_gpu == 0:
        return []
    return shared_pick(state, node, t) if _is_shared(t) else _whole_gpus(state, node, t)


def first_fit(state: ClusterState, t: Task, ctx: Context) -> Choice:
    """First node (file order) that fits; first GPU that fits."""
    ok = np.flatnonzero(state.feasible(t))
    if len(ok) == 0:
        return None
    node = int(ok[0])
    def first(s: ClusterState, i: int, task: Task) -> list[int]:
        return [int(np.flatnonzero(s.gpu_free[i] >= task.gpu_milli)[0])]

    return node, _gpus_for(state, node, t, first)


def random_fit(state: ClusterState, t: Task, ctx: Context) -> Choice:
    """Uniformly random feasible node and GPU (seeded)."""
    ok = np.flatnonzero(state.feasible(t))
    if len(ok) == 0:
        return None
    node = int(ctx.rng.choice(ok))
    def pick(s: ClusterState, i: int, task: Task) -> list[int]:
        return [int(ctx.rng.choice(np.flatnonzero(s.gpu_free[i] >= task.gpu_milli)))]

    return node, _gpus_for(state, node, t, pick)


def best_fit(state: ClusterState, t: Task, ctx: Context) -> Choice:
    """The artifact's BestFit: least (0.5 CPU + 0.5 GPU) left after placing, normalised by
    MaxSpecCpu/MaxSpecGpu; the tightest GPU for a shared task."""
    ok = np.flatnonzero(state.feasible(t))
    if len(ok) == 0:
        return None
    gpu_left = np.maximum(state.gpu_free[ok], 0).sum(axis=1) - t.total_gpu_milli
    left = (0.5 * (state.cpu_free[ok] - t.cpu_milli) / MAX_SPEC_CPU
            + 0.5 * gpu_left / MAX_SPEC_GPU)
    score = (1.0 - left) * 100.0
    if ctx.quantize:
        score = np.trunc(score)
    node = int(ok[_pick_node(score, ok, state, t, ctx)])
    return node, _gpus_for(state, node, t)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def fgd(state: ClusterState, t: Task, ctx: Context) -> Choice:
    """Fragmentation gradient descent: the node (and GPU) whose FGD fragmentation grows least.

    Score = sigmoid((frag_before - frag_after) / 1000) x 100 as in the artifact's fgd_score.go;
    a shared task tries every GPU that fits and keeps the node's best (first on ties).
    """
    ok = np.flatnonzero(state.feasible(t))
    if len(ok) == 0:
        return None
    if ctx.node_frag is None:
        ctx.node_frag = ctx.frag(state.free_for_frag(), state.cpu_free)
    before = ctx.node_frag
    free = state.free_for_frag(ok)
    cpu_after = state.cpu_free[ok] - t.cpu_milli
    if _is_shared(t):
        rows, cols = np.nonzero(state.gpu_free[ok] >= t.gpu_milli)
        cand = free[rows].copy()
        cand[np.arange(len(rows)), cols] -= t.gpu_milli
        after = ctx.frag(cand, cpu_after[rows])
        score = _sigmoid((before[ok[rows]] - after) / 1000.0) * 100.0
        if ctx.quantize:
            score = np.trunc(score)
        # best GPU per node: highest score, lowest GPU index on ties
        order = np.lexsort((cols, -score, rows))
        rows_s, first = np.unique(rows[order], return_index=True)
        per_node = score[order][first]
        k = _pick_node(per_node, ok[rows_s], state, t, ctx)
        node = int(ok[rows_s[k]])
        return node, [int(cols[order][first][k])]
    cand = free.copy()
    if t.num_gpu > 0:
        # take the first num_gpu GPUs that are free enough (whole GPUs: fully idle ones)
        enough = state.gpu_free[ok] >= t.gpu_milli
        rank = np.cumsum(enough, axis=1)
        take = enough & (rank <= t.num_gpu)
        cand[take] -= t.gpu_milli
    after = ctx.frag(cand, cpu_after)
    score = _sigmoid((before[ok] - after) / 1000.0) * 100.0
    if ctx.quantize:
        score = np.trunc(score)
    node = int(ok[_pick_node(score, ok, state, t, ctx)])
    return node, _whole_gpus(state, node, t) if t.num_gpu else []


TIES = ("name", "least-allocated", "random")

POLICIES: dict[str, Policy] = {
    "best-fit": best_fit,
    "first-fit": first_fit,
    "fgd": fgd,
    "random": random_fit,
}


# ----------------------------------------------------------------------------- replay

@dataclass(frozen=True)
class Snapshot:
    demand: float  # arrived requested GPU / cluster GPU capacity
    alloc_ratio: float  # allocated GPU capacity / total
    frag_ratio: float  # FGD fragmentation / idle GPU capacity
    frag_gpus: float  # FGD fragmentation, in GPUs
    idle_gpus: float  # unallocated GPU capacity, in GPUs
    arrived: int
    placed: int
    failed: int


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    seed: int
    until: float
    tasks: int
    placed: int
    failed: int
    at_100: Snapshot | None
    at_end: Snapshot
    curve: tuple[Snapshot, ...]
    seconds: float
    placements: tuple[tuple[int, tuple[int, ...]] | None, ...] = field(repr=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("placements")
        return d


def build_workload(nodes: Sequence[NodeSpec], pods: Sequence[Task], seed: int = 42,
                   until: float = 1.3, order: str = "shuffle", tune: bool = True) -> list[Task]:
    """Trace tasks plus seeded copies sampled with replacement until requested GPU would exceed
    ``until`` x capacity (or random trace tasks dropped while it exceeds it), then shuffled
    (``order="shuffle"``, the artifact's --shuffle-pod) or kept in trace order with the copies
    appended (``order="trace"``). ``tune=False`` keeps exactly the given tasks."""
    if order not in ("shuffle", "trace"):
        raise ValueError(f"order must be 'shuffle' or 'trace', got {order!r}")
    if not pods:
        return []
    rng = np.random.default_rng([seed, 0])
    capacity = sum(n.gpus for n in nodes) * MILLI
    target = until * capacity
    tasks = list(pods)
    total = sum(t.total_gpu_milli for t in tasks)
    if not tune:
        pass
    elif total > target:
        keep = list(range(len(tasks)))
        while total > target and keep:
            i = keep.pop(int(rng.integers(len(keep))))
            total -= tasks[i].total_gpu_milli
        tasks = [tasks[i] for i in sorted(keep)]
    elif total < target and any(t.total_gpu_milli > 0 for t in pods):
        k = 0
        while True:
            src = pods[int(rng.integers(len(pods)))]
            if total + src.total_gpu_milli > target:
                break
            tasks.append(Task(f"{src.name}-tuned-{k}", src.cpu_milli, src.memory_mib,
                              src.num_gpu, src.gpu_milli, src.gpu_spec))
            total += src.total_gpu_milli
            k += 1
    if order == "shuffle":
        perm = rng.permutation(len(tasks))
        tasks = [tasks[i] for i in perm]
    return tasks


def _mix_arrays(pods: Sequence[Task], threshold: float) -> tuple[np.ndarray, ...]:
    mix = typical_tasks(pods, threshold)
    return (np.array([m[0] for m in mix], dtype=np.int64), np.array([m[1] for m in mix], dtype=np.int64),
            np.array([m[2] for m in mix], dtype=np.float64), np.array([m[3] for m in mix]))


def _snapshot(state: ClusterState, ctx: Context, arrived_milli: int, arrived: int, placed: int,
              failed: int) -> Snapshot:
    frag = ctx.frag(state.free_for_frag(), state.cpu_free)
    idle = state.gpu_capacity - state.allocated_gpu_milli()
    fs = float(frag.sum())
    return Snapshot(demand=arrived_milli / state.gpu_capacity,
                    alloc_ratio=state.allocated_gpu_milli() / state.gpu_capacity,
                    frag_ratio=fs / idle if idle else 0.0, frag_gpus=fs / MILLI,
                    idle_gpus=idle / MILLI, arrived=arrived, placed=placed, failed=failed)


def replay(nodes: Sequence[NodeSpec], pods: Sequence[Task], policy: str = "fgd", seed: int = 42,
           until: float = 1.3, *, order: str = "shuffle", quantize: bool = True,
           tie: str = "name", tune: bool = True,
           mix_threshold: float = 0.95, curve_step: float = 0.1,
           progress: bool | Callable[[int, int], None] = False) -> ReplayResult:
    """Replay ``pods`` onto ``nodes`` with ``policy``; see the module docstring.

    Deterministic per (inputs, policy, seed). ``quantize`` keeps the artifact's integer 0..100
    scores; ``False`` scores exactly. Ties go to the node whose name sorts first (``tie="name"``,
    the artifact's patched kube-scheduler ``selectHost``); ``tie="least-allocated"`` prefers the
    node with most CPU/memory left, then a seeded random one (the previous default, our guess at a
    LeastAllocated scorer the artifact's profile in fact disables); ``tie="random"`` is stock
    kube-scheduler's reservoir sampling (seeded). ``tune=False`` replays exactly ``pods``.
    ``progress=True`` reports on stderr every few seconds.
    """
    if policy not in POLICIES:
        raise KeyError(f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}")
    if until <= 0:
        raise ValueError(f"until must be > 0, got {until}")
    t0 = time.perf_counter()
    state = ClusterState(nodes)
    workload = build_workload(nodes, pods, seed, until, order, tune)
    n, g, cpu, p = _mix_arrays(pods, mix_threshold)
    if tie not in TIES:
        raise ValueError(f"tie must be one of {', '.join(TIES)}, got {tie!r}")
    ctx = Context(np.random.default_rng([seed, 1]), n, g, cpu, p, quantize, tie=tie)
    fn = POLICIES[policy]
    tracks_frag = fn is fgd
    marks = sorted({round(curve_step * k, 6) for k in range(1, int(until / curve_step + 1e-9) + 1)}
                   | {1.0})
    curve: list[Snapshot] = []
    at_100 = None
    placements: list[tuple[int, tuple[int, ...]] | None] = []
    arrived_milli = placed = failed = 0
    report = progress if callable(progress) else None
    every = max(1, len(workload) // 20)
    last_report = time.perf_counter()
    for i, t in enumerate(workload):
        arrived_milli += t.total_gpu_milli
        choice = fn(state, t, ctx)
        if choice is None:
            failed += 1
            placements.append(None)
        else:
            node, gpus = choice
            state.place(node, gpus, t)
            placed += 1
            placements.append((node, tuple(gpus)))
            if tracks_frag and ctx.node_frag is not None:
                ctx.node_frag[node] = ctx.frag(state.free_for_frag([node]),
                                               state.cpu_free[[node]])[0]
        while marks and arrived_milli >= marks[0] * state.gpu_capacity - 1e-6:
            snap = _snapshot(state, ctx, arrived_milli, i + 1, placed, failed)
            curve.append(snap)
            if marks[0] == 1.0:
                at_100 = snap
            marks.pop(0)
        if report is not None and (i + 1) % every == 0:
            report(i + 1, len(workload))
        elif progress is True and time.perf_counter() - last_report > 5:
            last_report = time.perf_counter()
            print(f"[openb] {policy} seed {seed}: {i + 1}/{len(workload)} tasks, demand "
                  f"{arrived_milli / state.gpu_capacity:.1%}, allocated "
                  f"{state.allocated_gpu_milli() / state.gpu_capacity:.1%}", file=sys.stderr)
    end = _snapshot(state, ctx, arrived_milli, len(workload), placed, failed)
    return ReplayResult(policy, seed, until, len(workload), placed, failed, at_100, end,
                        tuple(curve), time.perf_counter() - t0, tuple(placements))


# ----------------------------------------------------------------------------- CLI

def _fmt(s: Snapshot | None, attr: str) -> str:
    return "-" if s is None else f"{100 * getattr(s, attr):.2f}%"


def run_cli(args: argparse.Namespace) -> int:
    """``scepsy bench openb``: args.nodes, args.pods, args.policy, args.seed, args.json.

    Returns 0, or 2 (message on stderr, no traceback) for bad input.
    """
    try:
        nodes = read_nodes(args.nodes)
        pods = read_pods(args.pods)
        policies = [x.strip() for x in str(args.policy).split(",") if x.strip()]
        for name in policies:
            if name not in POLICIES:
                raise OpenBError(f"--policy: unknown policy {name!r}; expected one of "
                                 f"{', '.join(sorted(POLICIES))}")
    except OpenBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    seed = int(getattr(args, "seed", None) or 42)
    until = float(getattr(args, "until", None) or 1.3)
    results = [replay(nodes, pods, name, seed, until, progress=True) for name in policies]
    if getattr(args, "json", False):
        print(json.dumps({"nodes": str(args.nodes), "pods": str(args.pods),
                          "results": [r.to_dict() for r in results]}, indent=2))
        return 0
    head = ["policy", "seed", "alloc@100%", f"alloc@{until:.0%}", "frag@100%",
            f"frag@{until:.0%}", "failed", "time"]
    rows = [[r.policy, str(r.seed), _fmt(r.at_100, "alloc_ratio"), _fmt(r.at_end, "alloc_ratio"),
             _fmt(r.at_100, "frag_ratio"), _fmt(r.at_end, "frag_ratio"), str(r.failed),
             f"{r.seconds:.1f}s"] for r in results]
    widths = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(head)]
    for row in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``bench openb`` options (for the CLI wiring)."""
    p.add_argument("--nodes", required=True, help="nodes CSV (sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument("--pods", required=True,
                   help="pods CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,...)")
    p.add_argument("--policy", default="fgd",
                   help=f"policy or comma list: {', '.join(sorted(POLICIES))} (default fgd)")
    p.add_argument("--seed", type=int, default=42, help="workload sampling/shuffle seed (42)")
    p.add_argument("--until", type=float, default=1.3, help="final demand / capacity (1.3)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scepsy bench openb", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_cli(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
