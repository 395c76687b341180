"""Importers for DistServe's fitted latency profiles (LLMServe/DistServe ``simdistserve/estimators``).

``profiler-a100-80g.<engine>.json`` (engine ``distserve`` or ``vllm``) holds, per model and
tensor-parallel degree, the coefficients that DistServe's simulator
(``simdistserve/estimators/time_estimator.py``) plugs into two fitted forms, in ms:

* prefill of a batch of prompts: ``a + b * sum(len) + c * sum(len**2)``;
* one decode step of a batch: ``a + b * sum(ctx) + c * batch``, with the ``decoding_smallbs``
  triple when ``batch < decoding_large_small_bs_threshold`` and ``decoding_largebs`` otherwise.
  Upstream passes ``ctx = prompt + generated + 1`` per sequence (the context including the token
  being produced).

Upstream divides both by the pipeline degree (``pp``); these forms are for ``pp = 1``.
``max_num_tokens.csv`` gives the KV-cache capacity in tokens per (model, tp, pp).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scepsy_common.errors import InputError
from scepsy_common.files import read_csv_rows, read_json
from scepsy_profile.measurements import Measurement

Engine = Literal["distserve", "vllm"]
ENGINES: tuple[Engine, ...] = ("distserve", "vllm")
Triple = tuple[float, float, float]

_KEYS = {
    "prefill": "prefill",
    "decode_small": "decoding_smallbs",
    "decode_large": "decoding_largebs",
}
_THRESHOLD = "decoding_large_small_bs_threshold"


@dataclass(frozen=True, slots=True)
class DistServeCoefficients:
    """DistServe's fitted prefill and decode forms for one (model, GPU, TP, engine)."""

    model: str
    gpu: str
    tp: int
    engine: Engine
    prefill: Triple
    decode_small: Triple
    decode_large: Triple
    decode_threshold: int
    source: str = ""

    def prefill_ms(self, batch: ArrayLike, seq: ArrayLike) -> NDArray[np.float64] | float:
        """Prefill time of ``batch`` prompts of ``seq`` tokens each (broadcast; pp = 1)."""
        b, s = self._counts(batch, "batch"), self._counts(seq, "seq")
        a0, a1, a2 = self.prefill
        return _out(a0 + a1 * b * s + a2 * b * s * s)

    def decode_ms(self, batch: ArrayLike, ctx: ArrayLike) -> NDArray[np.float64] | float:
        """One decode step of ``batch`` sequences with context ``ctx`` each (broadcast; pp = 1).

        Uses the small-batch triple where ``batch < decode_threshold``, as upstream does.
        """
        b, c = np.broadcast_arrays(self._counts(batch, "batch"), self._counts(ctx, "ctx"))
        small = b < self.decode_threshold
        a0, a1, a2 = (
            np.where(small, s, g) for s, g in zip(self.decode_small, self.decode_large, strict=True)
        )
        return _out(a0 + a1 * b * c + a2 * b)

    def _counts(self, raw: ArrayLike, name: str) -> NDArray[np.float64]:
        where = f"{self.model} tp{self.tp} {self.engine}"
        try:
            arr = np.asarray(raw, dtype=float)
        except (TypeError, ValueError):
            raise InputError(where, name, "finite numbers >= 1", raw) from None
        if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 1):
            raise InputError(where, name, "finite numbers >= 1", raw)
        return arr


def load_distserve_profile(
    path: str | os.PathLike[str], engine: Engine | None = None, gpu: str = "A100-80GB"
) -> tuple[DistServeCoefficients, ...]:
    """Read a DistServe ``profiler-*.{distserve,vllm}.json`` file, sorted by (model, tp).

    The engine comes from the file name unless ``engine`` is given. Unknown extra keys in an
    entry are ignored; a missing key, a triple that is not three finite numbers, or a threshold
    that is not a positive integer is an :class:`InputError` naming the path in the file.
    """
    p = Path(path)
    src = str(p)
    if engine is None:
        found = [e for e in ENGINES if e in p.name.split(".")]
        if len(found) != 1:
            raise InputError(
                src,
                "file name",
                "a name like profiler-*.distserve.json or *.vllm.json (or pass engine=)",
                p.name,
            )
        engine = found[0]
    elif engine not in ENGINES:
        raise InputError(src, "engine", f"one of {list(ENGINES)}", engine)
    data = read_json(p, "DistServe profile JSON file")
    if not isinstance(data, dict):
        raise InputError(src, "top level", "a JSON object {model: {tp: {...}}}")
    label = f"distserve:{p.name}"
    out: list[DistServeCoefficients] = []
    for model, by_tp in data.items():
        if not model.strip():
            raise InputError(src, "top level", "non-empty model names", model)
        if not isinstance(by_tp, dict) or not by_tp:
            raise InputError(src, model, "a non-empty JSON object {tp: {...}}")
        for tp_key, entry in by_tp.items():
            where = f"{model}.{tp_key}"
            tp = _positive_int_key(tp_key, src, where)
            if not isinstance(entry, dict):
                raise InputError(src, where, "a JSON object of coefficients")
            triples = {
                name: _triple(entry, key, src, f"{where}.{key}") for name, key in _KEYS.items()
            }
            if _THRESHOLD not in entry:
                raise InputError(src, f"{where}.{_THRESHOLD}", "a value (key is missing)")
            threshold = entry[_THRESHOLD]
            if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
                raise InputError(src, f"{where}.{_THRESHOLD}", "a positive integer", threshold)
            out.append(
                DistServeCoefficients(
                    model=model,
                    gpu=gpu,
                    tp=tp,
                    engine=engine,
                    decode_threshold=threshold,
                    source=label,
                    **triples,
                )
            )
    if not out:
        raise InputError(src, "", "at least one model entry")
    out.sort(key=lambda c: (c.model, c.tp))
    return tuple(out)


def distserve_measurements(
    coeffs: Iterable[DistServeCoefficients],
    batches: Sequence[int],
    lengths: Sequence[int],
    source: str | None = None,
) -> tuple[Measurement, ...]:
    """Evaluate the fitted forms on a ``batches x lengths`` grid, as measurements (share 1.0).

    Prefill points: ``batch`` prompts of ``length`` tokens. Decode points: one step of ``batch``
    sequences with context ``length``. ``source`` defaults to each set's source plus ``#fit``.
    Coefficient sets from both engine files for the same model land on the same curve key, so
    pass one engine at a time. A grid point where a fitted form is not positive (a fit used far
    outside its range) is an :class:`InputError`. Sorted like the MuxServe importer.
    """
    b = _grid(batches, "batches")
    n = _grid(lengths, "lengths")
    out: list[Measurement] = []
    for c in coeffs:
        label = source if source is not None else f"{c.source}#fit"
        bb, nn = np.meshgrid(b, n, indexing="ij")
        for phase, values in (
            ("prefill", np.asarray(c.prefill_ms(bb, nn))),
            ("decode", np.asarray(c.decode_ms(bb, nn))),
        ):
            for (i, j), ms in np.ndenumerate(values):
                batch, tokens = int(b[i]), int(n[j])
                if not (math.isfinite(ms) and ms > 0):
                    raise InputError(
                        f"{c.model} tp{c.tp} {c.engine}",
                        f"{phase} at batch {batch}, tokens {tokens}",
                        "a positive latency from the fitted form",
                        float(ms),
                    )
                out.append(
                    Measurement(
                        model=c.model,
                        gpu=c.gpu,
                        tp=c.tp,
                        share=1.0,
                        phase=phase,  # type: ignore[arg-type]
                        batch=batch,
                        tokens=tokens,
                        latency_ms=float(ms),
                        source=label,
                    )
                )
    if not out:
        raise InputError("distserve_measurements", "coeffs", "at least one coefficient set")
    out.sort(key=lambda m: (m.model, m.tp, m.phase, m.share, m.batch, m.tokens, m.source))
    return tuple(out)


def load_max_num_tokens(path: str | os.PathLike[str]) -> dict[tuple[str, int, int], int]:
    """Read DistServe's ``max_num_tokens.csv`` (``model,tp,pp,max_num_tokens``), sorted by key."""
    p = Path(path)
    src = str(p)
    required = ("model", "tp", "pp", "max_num_tokens")
    out: dict[tuple[str, int, int], int] = {}
    _, rows = read_csv_rows(p, "max_num_tokens.csv file", required)
    for where, row in rows:
        model = row["model"].strip()
        if not model:
            raise InputError(src, f"{where}, column model", "a model name")
        tp, pp, cap = (
            _positive_int_key(row[c], src, f"{where}, column {c}")
            for c in ("tp", "pp", "max_num_tokens")
        )
        key = (model, tp, pp)
        if key in out:
            raise InputError(src, where, "one row per (model, tp, pp)", key)
        out[key] = cap
    if not out:
        raise InputError(src, "", "at least one data row")
    return {key: out[key] for key in sorted(out)}


def _triple(entry: dict, key: str, src: str, where: str) -> Triple:
    if key not in entry:
        raise InputError(src, where, "a value (key is missing)")
    raw = entry[key]
    if not isinstance(raw, list) or len(raw) != 3:
        raise InputError(src, where, "a list of three numbers [a, b, c]", raw)
    for i, v in enumerate(raw):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InputError(src, f"{where}[{i}]", "a finite number", v)
    return (float(raw[0]), float(raw[1]), float(raw[2]))


def _positive_int_key(raw: str, src: str, where: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise InputError(src, where, "a positive integer", raw) from None
    if value < 1:
        raise InputError(src, where, "a positive integer", raw)
    return value


def _grid(values: Sequence[int], name: str) -> NDArray[np.int64]:
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu" or np.any(arr < 1):
        raise InputError(
            "distserve_measurements", name, "a non-empty list of integers >= 1", values
        )
    return np.unique(arr.astype(np.int64))


def _out(values: NDArray[np.float64]) -> NDArray[np.float64] | float:
    """A float for scalar inputs, an array otherwise."""
    arr = np.asarray(values, dtype=float)
    return float(arr) if arr.ndim == 0 else arr
