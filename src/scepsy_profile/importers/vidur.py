"""Importers for the Vidur operator and collective profiles (microsoft/vidur ``data/profiling``).

Two CSV layouts, both written by Vidur's profilers (pandas ``json_normalize`` of a ``time_stats``
dict, so every timed operation has ``time_stats.<op>.{min,max,mean,median,std}`` columns, in ms):

* ``compute/<gpu>/<org>/<model>/mlp.csv``: one row per (``num_tokens``,
  ``num_tensor_parallel_workers``) with the time of one transformer block's non-attention
  operators. The model (``<org>/<model>``, e.g. ``meta-llama/Llama-2-7b-hf``) and the GPU folder
  (``a100``/``h100``) come from the path. Read with :func:`load_vidur_mlp`.
* ``network/<topology>/all_reduce.csv``: one row per (``num_workers``, ``devices_per_node``,
  ``size``) with the NCCL collective time. Read with :func:`load_vidur_all_reduce`.

Only the ``.median`` statistic is kept. ``size`` is a message size in **bytes**: Vidur's collective
profiler allocates ``size`` fp16 elements and records ``"size": self._size * 2  # bytes``
(``vidur/profiling/collectives/collectives_wrapper.py``), and its predictor converts it back with
``num_tokens = size / embedding_dim / 2``. The file's grid confirms it: the element grid starts at
1024 and steps by 4096 (``vidur/profiling/utils``), the file's ``size`` starts at 2048 and steps
by 8192.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from scepsy_common.errors import InputError
from scepsy_common.files import read_csv_rows

#: Vidur's GPU folder names (``compute/<gpu>``, ``network/<gpu>_<topology>``) -> catalog names.
VIDUR_GPUS: dict[str, str] = {"a100": "A100-80GB", "h100": "H100-80GB"}

#: Operators in ``mlp.csv`` that run once per model, not once per transformer layer.
PER_MODEL_OPERATORS: frozenset[str] = frozenset({"emb"})

_MLP_KEYS = ("num_tokens", "num_tensor_parallel_workers")
_COLLECTIVE_KEYS = ("num_workers", "devices_per_node", "size", "collective")
_PREFIX = "time_stats."
_SUFFIX = ".median"

LayerKey = tuple[str, str, int, int]


@dataclass(frozen=True, slots=True)
class OperatorTiming:
    """Median time of one operator of one transformer layer (Vidur ``mlp.csv``), in ms."""

    model: str
    gpu: str
    tp: int
    num_tokens: int
    operator: str
    time_ms: float
    source: str = ""


@dataclass(frozen=True, slots=True)
class CollectiveTiming:
    """Median time of one NCCL collective (Vidur ``all_reduce.csv``), in ms.

    ``size_bytes`` is the message size per rank in bytes (fp16: twice the element count).
    ``devices_per_node`` is how many of the ``num_workers`` ranks share a node, so
    ``num_workers > devices_per_node`` is an inter-node collective.
    """

    gpu: str
    topology: str
    collective: str
    num_workers: int
    devices_per_node: int
    size_bytes: int
    time_ms: float
    source: str = ""


def load_vidur_mlp(
    path: str | os.PathLike[str], gpu: str | None = None, model: str | None = None
) -> tuple[OperatorTiming, ...]:
    """Read a Vidur ``compute/<gpu>/<org>/<model>/mlp.csv`` into per-operator timings.

    ``gpu`` and ``model`` override what the path says (needed when the file was moved out of
    Vidur's folder layout). Every ``time_stats.<op>.median`` column becomes one
    :class:`OperatorTiming` per row; empty cells are skipped. Result sorted by
    (tp, num_tokens, operator), file order among rows that repeat a key.
    """
    p = Path(path)
    src = str(p)
    parts = p.absolute().parts  # parts[-1] is mlp.csv, then model, org, gpu folder
    if model is None:
        if len(parts) < 4:
            raise InputError(src, "path", "a file under <gpu>/<org>/<model>/ (or pass model=)")
        model = f"{parts[-3]}/{parts[-2]}"
    if gpu is None:
        folder = parts[-4] if len(parts) >= 4 else ""
        if folder not in VIDUR_GPUS:
            raise InputError(
                src,
                "path",
                f"a file under compute/<{'|'.join(VIDUR_GPUS)}>/ (or pass gpu=)",
                folder,
            )
        gpu = VIDUR_GPUS[folder]
    header, rows = _read_csv(p, "an existing Vidur mlp.csv file")
    _require_columns(src, header, _MLP_KEYS)
    operators = _median_columns(header)
    if not operators:
        raise InputError(src, "header", f"at least one {_PREFIX}<operator>{_SUFFIX} column")
    label = f"vidur:{model}:{p.name}"
    out: list[OperatorTiming] = []
    for where, row in rows:
        num_tokens = _int_cell(row, "num_tokens", src, where)
        tp = _int_cell(row, "num_tensor_parallel_workers", src, where)
        for op in operators:
            ms = _time_cell(row, f"{_PREFIX}{op}{_SUFFIX}", src, where)
            if ms is None:
                continue
            out.append(OperatorTiming(model, gpu, tp, num_tokens, op, ms, label))
    if not out:
        raise InputError(src, "", "at least one operator timing")
    out.sort(key=lambda t: (t.model, t.gpu, t.tp, t.num_tokens, t.operator))
    return tuple(out)


def vidur_layer_time_ms(timings: Iterable[OperatorTiming]) -> dict[LayerKey, float]:
    """Time of one transformer layer's non-attention operators, per (model, gpu, tp, num_tokens).

    The sum of the median times of every operator in the file except ``emb`` (the embedding
    lookup runs once per model, not per layer). For Vidur's files that is ``input_layernorm``,
    ``attn_pre_proj`` (QKV projection), ``attn_rope``, ``attn_post_proj`` (output projection),
    ``post_attention_layernorm`` (absent for parallel-block models such as phi-2),
    ``mlp_up_proj``, ``mlp_act``, ``mlp_down_proj`` and ``add`` (Vidur times one residual add
    per block and counts it once, as here).

    Not included, because ``mlp.csv`` does not hold them: the attention kernel itself (prefill,
    decode, KV-cache save: Vidur's ``attention.csv``) and the tensor-parallel all-reduces
    (see :func:`load_vidur_all_reduce`).

    Vidur's num_tokens grid repeats the boundaries of its ranges (e.g. 2048, 4096), so some
    keys were measured twice: an operator's duplicate medians are averaged. A key that lacks an
    operator which the same (model, gpu) has elsewhere (an empty cell) is left out rather than
    returned as an undercount. Keys come back sorted.
    """
    per_op: dict[tuple[str, str, int, int, str], list[float]] = {}
    ops_of: dict[tuple[str, str], set[str]] = {}
    for t in timings:
        if t.operator in PER_MODEL_OPERATORS:
            continue
        per_op.setdefault((t.model, t.gpu, t.tp, t.num_tokens, t.operator), []).append(t.time_ms)
        ops_of.setdefault((t.model, t.gpu), set()).add(t.operator)
    sums: dict[LayerKey, float] = {}
    counts: dict[LayerKey, int] = {}
    for (model, gpu, tp, n, _op), values in per_op.items():
        key = (model, gpu, tp, n)
        sums[key] = sums.get(key, 0.0) + sum(values) / len(values)
        counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] for key in sorted(sums) if counts[key] == len(ops_of[(key[0], key[1])])}


def load_vidur_all_reduce(
    path: str | os.PathLike[str], gpu: str | None = None
) -> tuple[CollectiveTiming, ...]:
    """Read a Vidur ``network/<topology>/all_reduce.csv`` into collective timings.

    The topology is the folder name (e.g. ``a100_dgx``, ``h100_pairwise_nvlink``); the GPU is its
    prefix unless ``gpu`` is given. Each row's time is its ``time_stats.<collective>.median``
    cell; rows where that cell is empty are skipped. Result sorted by (collective, num_workers,
    devices_per_node, size_bytes), file order among rows that repeat a key.
    """
    p = Path(path)
    src = str(p)
    topology = p.absolute().parent.name
    if gpu is None:
        prefix = topology.split("_", 1)[0]
        if prefix not in VIDUR_GPUS:
            raise InputError(
                src,
                "path",
                f"a file under network/<{'|'.join(VIDUR_GPUS)}>_<topology>/ (or pass gpu=)",
                topology,
            )
        gpu = VIDUR_GPUS[prefix]
    header, rows = _read_csv(p, "an existing Vidur all_reduce.csv file")
    _require_columns(src, header, _COLLECTIVE_KEYS)
    timed = set(_median_columns(header))
    if not timed:
        raise InputError(src, "header", f"a {_PREFIX}<collective>{_SUFFIX} column")
    label = f"vidur:{topology}:{p.name}"
    out: list[CollectiveTiming] = []
    for where, row in rows:
        collective = (row.get("collective") or "").strip()
        if collective not in timed:
            raise InputError(
                src, f"{where}, column collective", f"one of {sorted(timed)}", collective
            )
        workers = _int_cell(row, "num_workers", src, where)
        per_node = _int_cell(row, "devices_per_node", src, where)
        size = _int_cell(row, "size", src, where)
        ms = _time_cell(row, f"{_PREFIX}{collective}{_SUFFIX}", src, where)
        if ms is None:
            continue
        out.append(CollectiveTiming(gpu, topology, collective, workers, per_node, size, ms, label))
    if not out:
        raise InputError(src, "", "at least one collective timing")
    out.sort(key=lambda c: (c.collective, c.num_workers, c.devices_per_node, c.size_bytes))
    return tuple(out)


# --- CSV helpers -----------------------------------------------------------------------------


def _read_csv(p: Path, expected: str) -> tuple[list[str], list[tuple[str, dict[str, str]]]]:
    return read_csv_rows(p, expected)


def _require_columns(src: str, header: list[str], required: Iterable[str]) -> None:
    missing = [c for c in required if c not in header]
    if missing:
        raise InputError(src, f"column {missing[0]}", "a column of that name (missing)")


def _median_columns(header: list[str]) -> list[str]:
    """The ``<op>`` of every ``time_stats.<op>.median`` column, in header order."""
    return [
        h[len(_PREFIX) : -len(_SUFFIX)]
        for h in header
        if h.startswith(_PREFIX) and h.endswith(_SUFFIX) and len(h) > len(_PREFIX) + len(_SUFFIX)
    ]


def _int_cell(row: dict[str, str], column: str, src: str, where: str) -> int:
    raw = row[column].strip()
    try:
        value = float(raw)  # pandas writes integer columns holding NaNs as floats ("2048.0")
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value.is_integer() and value >= 1):
        raise InputError(src, f"{where}, column {column}", "a positive integer", raw)
    return int(value)


def _time_cell(row: dict[str, str], column: str, src: str, where: str) -> float | None:
    """A median time in ms (>= 0), or None for an empty cell."""
    raw = row[column].strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InputError(src, f"{where}, column {column}", "a time in ms (a number)", raw) from None
    if not math.isfinite(value) or value < 0:
        raise InputError(src, f"{where}, column {column}", "a finite time in ms >= 0", raw)
    return value
