"""Importer for the MuxServe profiling grid (hao-ai-lab/MuxServe ``examples/placement/llama.json``).

Layout: ``model -> tp -> percent_of_SMs -> batch -> seq_len -> {"prefill": ms, "decoding": ms}``.
Entries with a non-positive latency (the upstream marker for "not measured", usually
out-of-memory) are skipped; anything else malformed is an :class:`InputError` naming the path.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from scepsy_common.errors import InputError
from scepsy_common.files import read_json
from scepsy_profile.measurements import Measurement, Phase, check_instance

_PHASE_KEYS: tuple[tuple[Phase, str], ...] = (("prefill", "prefill"), ("decode", "decoding"))


NOT_MEASURED = -1.0
"""The latency MuxServe's grids give a point that could not be measured (skipped)."""


def load_muxserve_grid(
    path: str | os.PathLike[str], gpu: str = "A100-80GB"
) -> tuple[Measurement, ...]:
    """Read a MuxServe grid file into measurements (model names as in the file)."""
    p = Path(path)
    data = read_json(p, "MuxServe grid JSON file")
    src = f"muxserve:{p.name}"
    out: list[Measurement] = []
    f = str(p)
    for model, by_tp in _items(data, f, ""):
        for tp_key, by_sm in _items(by_tp, f, model):
            tp = _int(tp_key, f, f"{model}.{tp_key}")
            check_instance(model, gpu, tp, f, f"{model}.{tp_key}: ")
            for pct, by_batch in _items(by_sm, f, f"{model}.{tp_key}"):
                share = _number(pct, f, f"{model}.{tp_key}.{pct}", "an SM percentage in (0, 100]")
                if not 0 < share <= 100:
                    raise InputError(f, f"{model}.{tp_key}.{pct}", "an SM percentage in (0, 100]")
                for batch_key, by_seq in _items(by_batch, f, f"{model}.{tp_key}.{pct}"):
                    batch = _int(batch_key, f, f"{model}.{tp_key}.{pct}.{batch_key}")
                    for seq_key, point in _items(by_seq, f, f"{model}.{tp_key}.{pct}.{batch_key}"):
                        where = f"{model}.{tp_key}.{pct}.{batch_key}.{seq_key}"
                        tokens = _int(seq_key, f, where)
                        for phase, key in _PHASE_KEYS:
                            if not isinstance(point, dict) or key not in point:
                                raise InputError(f, f"{where}.{key}", "a latency in ms")
                            ms = _number(point[key], f, f"{where}.{key}", "a latency in ms")
                            if ms == NOT_MEASURED:
                                continue  # upstream marks points it could not measure with -1
                            if not ms > 0:
                                raise InputError(f, f"{where}.{key}", "a latency in ms > 0 "
                                                 f"(or {NOT_MEASURED:g}: not measured)", ms)
                            out.append(Measurement(
                                model=model, gpu=gpu, tp=tp, share=share / 100.0, phase=phase,
                                batch=batch, tokens=tokens, latency_ms=ms, source=src,
                            ))
    if not out:
        raise InputError(str(p), "", "at least one measured point")
    out.sort(key=lambda m: (m.model, m.tp, m.phase, m.share, m.batch, m.tokens))
    return tuple(out)


def _items(obj: object, src: str, where: str) -> list[tuple[str, object]]:
    if not isinstance(obj, dict):
        raise InputError(src, where or "top level", "a JSON object")
    return list(obj.items())


def _number(raw: object, src: str, where: str, expected: str) -> float:
    if isinstance(raw, bool):
        raise InputError(src, where, expected, raw)
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(src, where, expected, raw) from None
    if not math.isfinite(value):
        raise InputError(src, where, expected, raw)
    return value


def _int(raw: str, src: str, where: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise InputError(src, where, "a positive integer key", raw) from None
    if value < 1:
        raise InputError(src, where, "a positive integer key", raw)
    return value
