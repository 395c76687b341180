"""Online replay of the Alibaba GPU-sharing trace (openb), as in FGD (Weng et al., ATC'23).

Tasks arrive one at a time onto the cluster; each is placed by a policy or counted as failed (and
skipped). The workload is the trace's tasks, shuffled with the seed, followed by copies sampled
from them with replacement (seeded) until requested GPU reaches ``until`` (1.3) x cluster GPU
capacity -- the artifact's ``-tune 1.3 -tuneseed N --shuffle-pod=true``. Ties between equally
scored nodes go to the node whose name sorts first after the artifact's seeded random prefix
(``tie="shuffled-name"``). The allocation ratio (allocated GPU capacity / total) and FGD's
fragmentation are recorded when the arrived demand (cumulative requested GPU / capacity, failed
tasks included) first reaches 100% and at the end. CPU-only tasks take CPU and memory, count
as arrived tasks with no GPU demand, and fail like any other task when no node has the CPU or
memory left; :func:`cpu_variant` builds the trace family's CPU-heavy variants.

See docs/openb.md.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from scepsy_common.errors import InputError, check_name
from scepsy_common.files import read_csv_rows
from scepsy_place.packing.fgd import MILLI, fragmentation_batch, typical_tasks

__all__ = [
    "CPU_VARIANTS", "ORDERS", "POLICIES", "TIES", "ClusterState", "NodeSpec", "OpenBError",
    "ReplayResult", "Snapshot", "Task", "build_workload", "cpu_variant", "read_nodes", "read_pods",
    "replay", "shuffled_name_rank",
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

MAX_ROWS = 1_000_000
"""The most rows a nodes or pods CSV file may have."""
MAX_NODE_GPUS = 64
"""The most GPUs one node of a nodes CSV may have (and one task of a pods CSV may take)."""


def _read_csv(path: str | Path, required: Sequence[str],
              what: str) -> list[tuple[str, dict[str, str]]]:
    """``(where, row)`` of a CSV file with the ``required`` columns; ``where`` reads
    ``row N (line L)``. Every problem is an :class:`InputError` naming the file."""
    _, rows = read_csv_rows(path, what, tuple(required))
    if len(rows) > MAX_ROWS:
        raise InputError(str(path), "", f"at most {MAX_ROWS} rows", len(rows))
    return rows


def _int(path: Path | str, where: str, row: dict, name: str, lo: int, hi: int | None = None) -> int:
    raw = (row.get(name) or "").strip()
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    try:
        v = int(raw)
    except ValueError:
        try:
            f = float(raw)
        except ValueError:
            f = math.nan
        if not f.is_integer():
            raise InputError(str(path), f"{where}: {name}", f"an integer {rng}", raw) from None
        v = int(f)
    if v < lo or (hi is not None and v > hi):
        raise InputError(str(path), f"{where}: {name}", f"an integer {rng}", v)
    return v


def read_nodes(path: str | Path) -> list[NodeSpec]:
    """Nodes CSV (``sn,cpu_milli,memory_mib,gpu,model``); one NVLink domain per node."""
    rows = _read_csv(path, ["sn", "cpu_milli", "memory_mib", "gpu"], "openb nodes CSV file")
    nodes, seen = [], set()
    for where, row in rows:
        name = check_name((row.get("sn") or "").strip(), str(path), f"{where}: sn")
        if name in seen:
            raise InputError(str(path), f"{where}: sn", "a node name used once", name)
        seen.add(name)
        nodes.append(NodeSpec(name, _int(path, where, row, "cpu_milli", 0),
                              _int(path, where, row, "memory_mib", 0),
                              _int(path, where, row, "gpu", 0, MAX_NODE_GPUS),
                              (row.get("model") or "").strip()))
    if sum(n.gpus for n in nodes) == 0:
        raise InputError(str(path), "gpu", "at least one node with GPUs (the cluster has none)")
    return nodes


def read_pods(path: str | Path) -> list[Task]:
    """Pods CSV (``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...,creation_time]``).

    Rows keep file order, or creation_time order (stable) when that column exists.
    """
    rows = _read_csv(path, ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"],
                     "openb pods CSV file")
    tasks, created = [], []
    has_time = bool(rows) and "creation_time" in rows[0][1]
    src = str(path)
    for k, (where, row) in enumerate(rows, start=1):
        raw_name = (row.get("name") or "").strip()
        name = check_name(raw_name, src, f"{where}: name") if raw_name else f"row-{k}"
        n = _int(path, where, row, "num_gpu", 0, MAX_NODE_GPUS)
        g = _int(path, where, row, "gpu_milli", 0, MILLI)
        if n == 0 and g != 0:
            raise InputError(src, f"{where}: gpu_milli", "0 when num_gpu is 0", g)
        if n > 0 and g == 0:
            raise InputError(src, f"{where}: gpu_milli", f"1..{MILLI} when num_gpu is {n}", g)
        if n > 1 and g != MILLI:
            raise InputError(src, f"{where}: gpu_milli",
                             f"{MILLI} (multi-GPU tasks take whole GPUs)", g)
        tasks.append(Task(name, _int(path, where, row, "cpu_milli", 0),
                          _int(path, where, row, "memory_mib", 0), n, g,
                          (row.get("gpu_spec") or "").strip()))
        if has_time:
            raw = (row.get("creation_time") or "").strip()
            created.append(_int(path, where, row, "creation_time", -2**62, 2**62) if raw else 0)
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

    def free_for_frag(self, rows: np.ndarray | slice | list[int] = slice(None)) -> np.ndarray:
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
    """Position in ``nodes`` of the best score. Ties: ``ctx.tie`` ``"shuffled-name"`` or
    ``"name"`` takes the node first in ``state.name_rank`` (the artifact's patched kube-scheduler
    ``selectHost``: "for reproducibility, choose the smallest lexicographical order"; with
    ``"shuffled-name"`` the rank is that of the artifact's seeded, prefixed names, see
    :func:`shuffled_name_rank`); ``"least-allocated"`` the node with most CPU/memory left after
    placing, then a seeded random one; ``"random"`` a seeded random one (stock kube-scheduler)."""
    if ctx.tie in ("name", "shuffled-name"):
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


TIES = ("shuffled-name", "name", "least-allocated", "random")
"""Tie rules between equally scored nodes; the first is the artifact's and the default."""

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


ORDERS = ("artifact", "shuffle", "trace")
"""Arrival orders of :func:`build_workload`; the first is the artifact's and the default."""


def build_workload(nodes: Sequence[NodeSpec], pods: Sequence[Task], seed: int = 42,
                   until: float = 1.3, order: str = "artifact", tune: bool = True) -> list[Task]:
    """The arriving tasks: ``pods`` tuned to ``until`` x cluster GPU capacity, in ``order``.

    Tuning (the artifact's ``TunePodsByNodeTotalResource``): when the pods request less GPU than
    the target, copies drawn with replacement are appended until the next draw's per-GPU milli
    would push the requested total past it (``tuneUpPods``; CPU-only draws never stop it); when
    they request more, random pods are dropped until the total fits (``tuneDownPods``).
    ``order="artifact"``: the trace's pods shuffled, then the copies in draw order (the
    artifact shuffles before it tunes); ``"shuffle"``: everything shuffled together;
    ``"trace"``: trace order, copies appended. ``tune=False`` keeps exactly the given tasks.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if not pods:
        return []
    rng = np.random.default_rng([seed, 0])
    capacity = sum(n.gpus for n in nodes) * MILLI
    target = until * capacity
    tasks = list(pods)
    if order == "artifact":
        tasks = [tasks[i] for i in rng.permutation(len(tasks))]
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
            if total + src.gpu_milli > target:
                break
            tasks.append(Task(f"{src.name}-tuned-{k}", src.cpu_milli, src.memory_mib,
                              src.num_gpu, src.gpu_milli, src.gpu_spec))
            total += src.total_gpu_milli
            k += 1
    if order == "shuffle":
        perm = rng.permutation(len(tasks))
        tasks = [tasks[i] for i in perm]
    return tasks


CPU_VARIANTS = {"cpu050": 0.05, "cpu100": 0.10, "cpu200": 0.20, "cpu250": 0.25}
"""The trace family's non-GPU variants: share of CPU-only tasks in the task count."""


def cpu_variant(pods: Sequence[Task], share: float, seed: int = 0) -> list[Task]:
    """``pods``' GPU tasks plus CPU-only tasks drawn from its CPU-only ones (with replacement,
    seeded) so that they make ``share`` of the tasks, CPU-only tasks first.

    This is how the published ``openb_pod_list_cpu050/100/200/250`` files are laid out: the
    default trace's 7,064 GPU tasks in trace order after CPU-only tasks resampled from its 1,088
    (5%, 10%, 20%, 25% of the task count). The draws themselves are ours, not the published ones.
    """
    if not 0 <= share < 1 or not math.isfinite(share):
        raise ValueError(f"share must be in [0, 1), got {share}")
    gpu = [t for t in pods if t.num_gpu > 0]
    cpu = [t for t in pods if t.num_gpu == 0]
    n = round(len(gpu) * share / (1 - share))
    if n and not cpu:
        raise ValueError("the pods have no CPU-only task to draw from")
    rng = np.random.default_rng([seed, 3])
    drawn = [cpu[int(i)] for i in rng.integers(len(cpu), size=n)] if n else []
    return [Task(f"{t.name}-cpu-{k}", t.cpu_milli, t.memory_mib, 0, 0, t.gpu_spec)
            for k, t in enumerate(drawn)] + gpu


def shuffled_name_rank(nodes: Sequence[NodeSpec], seed: int) -> np.ndarray:
    """Tie rank of each node as in the artifact: nodes sorted by name get the seeded random
    prefix ``"%04d-"`` of a permutation (``syncClusterResourceList``'s ``rand.Perm``), and ties
    go to the smallest prefixed name. Lower rank wins."""
    n = len(nodes)
    perm = np.random.default_rng([seed, 2]).permutation(n)
    by_name = sorted(range(n), key=lambda i: nodes[i].name)
    prefixed = [""] * n
    for k, i in enumerate(by_name):
        prefixed[i] = f"{int(perm[k]):04d}-{nodes[i].name}"
    rank = np.empty(n, dtype=np.int64)
    rank[sorted(range(n), key=lambda i: prefixed[i])] = np.arange(n)
    return rank


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
           until: float = 1.3, *, order: str = "artifact", quantize: bool = True,
           tie: str = "shuffled-name", tune: bool = True,
           mix_threshold: float = 0.95, curve_step: float = 0.1,
           progress: bool | Callable[[int, int], None] = False) -> ReplayResult:
    """Replay ``pods`` onto ``nodes`` with ``policy``; see the module docstring.

    Deterministic per (inputs, policy, seed). ``quantize`` keeps the artifact's integer 0..100
    scores; ``False`` scores exactly. Ties go to the node whose name sorts first after the
    artifact's seeded random prefix (``tie="shuffled-name"``, :func:`shuffled_name_rank`; a fixed
    node priority that changes with the seed); ``tie="name"`` sorts the plain names (one fixed
    priority for every seed); ``tie="least-allocated"`` prefers the node with most CPU/memory
    left, then a seeded random one; ``tie="random"`` is stock kube-scheduler's reservoir sampling
    (seeded). ``order`` and ``tune``: see :func:`build_workload`.
    ``progress=True`` reports on stderr every few seconds.
    """
    if policy not in POLICIES:
        raise KeyError(f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}")
    if until <= 0:
        raise ValueError(f"until must be > 0, got {until}")
    if tie not in TIES:
        raise ValueError(f"tie must be one of {', '.join(TIES)}, got {tie!r}")
    t0 = time.perf_counter()
    state = ClusterState(nodes)
    if tie == "shuffled-name":
        state.name_rank = shuffled_name_rank(nodes, seed)
    workload = build_workload(nodes, pods, seed, until, order, tune)
    n, g, cpu, p = _mix_arrays(pods, mix_threshold)
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
